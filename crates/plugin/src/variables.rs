//! Resource-variable update kernels: AssignAddVariableOp and AssignSubVariableOp.
//!
//! TensorFlow's own DEVICE_DEFAULT versions of these ops compute with the CPU's Eigen device on
//! the variable's buffer, which on this device is a GPU address: run on our device they crash
//! the process. A plugin reaches a variable's buffer through `TF_AssignUpdateVariable`
//! (kernels_experimental.h), but TensorFlow 2.21's Linux wheels do not export that symbol (nor
//! any other variable function of kernels_experimental.h: checked with `nm -D` on every
//! library of the wheel). Until the graph rewrite that replaces these ops with
//! ReadVariableOp + AddV2/Sub + AssignVariableOp exists, these registrations take precedence
//! over TensorFlow's and fail with an error that says what to do, instead of a crash.

use std::ffi::CString;

use tfwgpu_runtime::DType;
use tfwgpu_sys as sys;

use crate::nodedef::dtype_to_tf;
use crate::status::{Status, set};

struct Update {
    op: i32,
}

unsafe extern "C" fn create_add(_: *mut sys::TF_OpKernelConstruction) -> *mut std::ffi::c_void {
    Box::into_raw(Box::new(Update { op: 0 })) as *mut std::ffi::c_void
}

unsafe extern "C" fn create_sub(_: *mut sys::TF_OpKernelConstruction) -> *mut std::ffi::c_void {
    Box::into_raw(Box::new(Update { op: 1 })) as *mut std::ffi::c_void
}

unsafe extern "C" fn delete(k: *mut std::ffi::c_void) {
    if !k.is_null() {
        // SAFETY: made by create_add / create_sub.
        drop(unsafe { Box::from_raw(k as *mut Update) });
    }
}

unsafe extern "C" fn compute(k: *mut std::ffi::c_void, ctx: *mut sys::TF_OpKernelContext) {
    // SAFETY: made by create_add / create_sub.
    let op = unsafe { (*(k as *const Update)).op };
    let name = if op == 0 {
        "AssignAddVariableOp"
    } else {
        "AssignSubVariableOp"
    };
    let st = Status::new();
    set(
        st.0,
        sys::TSL_Code_TSL_UNIMPLEMENTED,
        &format!(
            "{name} on a tfwgpu GPU is not supported yet (TensorFlow 2.21 does not export \
             TF_AssignUpdateVariable to plugins). Keep this variable on the CPU \
             (create it under tf.device('/CPU:0')), or update it with v.assign(v + x)"
        ),
    );
    // SAFETY: valid context.
    unsafe { sys::TF_OpKernelContext_Failure(ctx, st.0) };
}

/// Registers AssignAddVariableOp and AssignSubVariableOp for every dtype the runtime has.
pub fn register() -> usize {
    let st = Status::new();
    let mut n = 0;
    type Create = unsafe extern "C" fn(*mut sys::TF_OpKernelConstruction) -> *mut std::ffi::c_void;
    let ops: [(&str, Create); 2] = [
        ("AssignAddVariableOp", create_add),
        ("AssignSubVariableOp", create_sub),
    ];
    for (op, create_fn) in ops {
        for dt in DType::ALL {
            let op_c = CString::new(op).expect("no NUL").into_raw();
            // SAFETY: registration calls with valid, process-lifetime strings.
            unsafe {
                let b = sys::TF_NewKernelBuilder(
                    op_c,
                    c"GPU".as_ptr(),
                    Some(create_fn),
                    Some(compute),
                    Some(delete),
                );
                sys::TF_KernelBuilder_TypeConstraint(b, c"dtype".as_ptr(), dtype_to_tf(dt), st.0);
                sys::TF_KernelBuilder_HostMemory(b, c"resource".as_ptr());
                sys::TF_KernelBuilder_Priority(b, 1);
                let name = CString::new(format!("tfwgpu_{op}_{dt}"))
                    .expect("no NUL")
                    .into_raw();
                sys::TF_RegisterKernelBuilder(name, b, st.0);
            }
            match st.check(op) {
                Ok(()) => n += 1,
                Err(e) => tracing::warn!("not registering {op} for {dt}: {e}"),
            }
        }
    }
    n
}
