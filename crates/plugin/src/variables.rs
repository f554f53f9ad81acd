//! Guards against TensorFlow's own DEVICE_DEFAULT kernels that compute on a resource
//! variable's buffer with the CPU's Eigen device: AssignAddVariableOp, AssignSubVariableOp,
//! ResourceGather and ResourceScatterUpdate. On this device that buffer is a GPU address, so
//! TensorFlow's kernels would crash the process (seen: a segfault in
//! `AssignUpdateVariableOp<ThreadPoolDevice>`). A plugin reaches a variable's buffer only
//! through the variable functions of kernels_experimental.h (`TF_AssignUpdateVariable`,
//! `TF_GetInputTensorFromVariable`...), which TensorFlow 2.21's Linux wheels do not export
//! (checked with `nm -D` on every library of the wheel).
//!
//! Inside `tf.function` the graph rewrite in [`crate::graph`] replaces the assign updates with
//! ops that work here; in eager mode the Python package's hook (`tensorflow_wgpu/_hooks.py`)
//! does the same for the assign updates and ResourceGather. These kernels are the last line:
//! they take precedence over TensorFlow's and fail with an error that says what to do, instead
//! of a crash (ResourceScatterUpdate has no rewrite yet; a program without the package's hook
//! gets the error for the eager updates too).
//!
//! The fused optimizer updates ([`crate::graph::apply::APPLY_OPS`]: ResourceApplyAdam and
//! friends) have no kernel of TensorFlow's on a PluggableDevice at all, so without a kernel here
//! TensorFlow could not place them next to a variable on the GPU. Their guards make the
//! placement work; the graph rewrite then replaces every one of them, and the package's hook
//! runs the eager ones as elementwise ops. These guards fail only where neither ran (a program
//! without the package's hook, or with grappler turned off).

use std::ffi::{CString, c_void};

use tfwgpu_runtime::DType;
use tfwgpu_sys as sys;

use crate::graph::apply::APPLY_OPS;
use crate::nodedef::dtype_to_tf;
use crate::status::{Status, set};

/// (op, type attribute constrained, what the user can do instead)
const GUARDED: &[(&str, &str, &str)] = &[
    (
        "AssignAddVariableOp",
        "dtype",
        "use it inside a tf.function (Keras fit does), where tfwgpu rewrites it, or write v.assign(v + x)",
    ),
    (
        "AssignSubVariableOp",
        "dtype",
        "use it inside a tf.function (Keras fit does), where tfwgpu rewrites it, or write v.assign(v - x)",
    ),
    (
        "ResourceGather",
        "dtype",
        "read the variable first: tf.gather(v.read_value(), indices), or keep the variable on the CPU",
    ),
    (
        "ResourceScatterUpdate",
        "dtype",
        "keep this variable on the CPU (create it under tf.device('/CPU:0'))",
    ),
];

/// What to do about a fused optimizer update that reached its guard.
const APPLY_ADVICE: &str = "inside tf.function tfwgpu rewrites it into elementwise ops, and in \
    eager mode the tensorflow_wgpu package's hook does (installed with the package by \
    tensorflow_wgpu.pth; with grappler's meta optimizer disabled there is no rewrite); otherwise \
    keep the optimizer's variables on the CPU";

unsafe extern "C" fn create(ctx: *mut sys::TF_OpKernelConstruction) -> *mut c_void {
    // The kernel only needs to know which op it is.
    // SAFETY: valid construction context; the string view is copied at once.
    let name = unsafe { sys::TF_OpKernelConstruction_GetName(ctx) };
    let node = unsafe { std::slice::from_raw_parts(name.data as *const u8, name.len) };
    let node = String::from_utf8_lossy(node).into_owned();
    let st = Status::new();
    let buf = unsafe { sys::TF_OpKernelConstruction_GetNodeDef(ctx, st.0) };
    let op = if st.check("").is_ok() && !buf.is_null() {
        // SAFETY: TF_Buffer holds `length` bytes at `data`; freed right after.
        let b = unsafe { &*buf };
        let bytes = unsafe { std::slice::from_raw_parts(b.data as *const u8, b.length) };
        let op = crate::nodedef::parse(bytes)
            .map(|(op, _)| op)
            .unwrap_or_default();
        unsafe { sys::TF_DeleteBuffer(buf) };
        op
    } else {
        String::new()
    };
    Box::into_raw(Box::new((op, node))) as *mut c_void
}

unsafe extern "C" fn delete(k: *mut c_void) {
    if !k.is_null() {
        // SAFETY: made by create.
        drop(unsafe { Box::from_raw(k as *mut (String, String)) });
    }
}

unsafe extern "C" fn compute(k: *mut c_void, ctx: *mut sys::TF_OpKernelContext) {
    // SAFETY: made by create.
    let (op, node) = unsafe { &*(k as *const (String, String)) };
    let msg = match GUARDED.iter().find(|g| g.0 == op) {
        Some(g) => format!(
            "{op} on a resource variable of a tfwgpu GPU is not supported in eager mode \
             (TensorFlow 2.21 does not give plugins access to variable buffers): {} \
             [node {node}]",
            g.2
        ),
        None => format!(
            "{op} on a resource variable of a tfwgpu GPU cannot run as one kernel \
             (TensorFlow 2.21 does not give plugins access to variable buffers): \
             {APPLY_ADVICE} [node {node}]"
        ),
    };
    let st = Status::new();
    set(st.0, sys::TSL_Code_TSL_UNIMPLEMENTED, &msg);
    // SAFETY: valid context.
    unsafe { sys::TF_OpKernelContext_Failure(ctx, st.0) };
}

/// Registers one guard kernel: `op` on GPU with `type_attr` = `dt`, `resources` in host memory.
fn register_one(op: &str, type_attr: &str, dt: DType, resources: &[&str]) -> bool {
    let st = Status::new();
    let op_c = CString::new(op).expect("no NUL").into_raw();
    let attr_c = CString::new(type_attr).expect("no NUL").into_raw();
    // SAFETY: registration calls with valid, process-lifetime strings.
    unsafe {
        let b = sys::TF_NewKernelBuilder(
            op_c,
            c"GPU".as_ptr(),
            Some(create),
            Some(compute),
            Some(delete),
        );
        sys::TF_KernelBuilder_TypeConstraint(b, attr_c, dtype_to_tf(dt), st.0);
        for r in resources {
            let r = CString::new(*r).expect("no NUL").into_raw();
            sys::TF_KernelBuilder_HostMemory(b, r);
        }
        sys::TF_KernelBuilder_Priority(b, 1);
        let name = CString::new(format!("tfwgpu_guard_{op}_{dt}"))
            .expect("no NUL")
            .into_raw();
        sys::TF_RegisterKernelBuilder(name, b, st.0);
    }
    match st.check(op) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("not registering the guard for {op} {dt}: {e}");
            false
        }
    }
}

/// Registers the guards: the variable ops for every dtype the runtime has, the fused
/// optimizer updates for the float types the graph rewrite expands (f32, f16). Returns how
/// many registered.
pub fn register() -> usize {
    let mut n = 0;
    for (op, type_attr, _) in GUARDED {
        for dt in DType::ALL {
            n += usize::from(register_one(op, type_attr, dt, &["resource"]));
        }
    }
    for (op, resources) in APPLY_OPS {
        for dt in [DType::F32, DType::F16] {
            n += usize::from(register_one(op, "T", dt, resources));
        }
    }
    n
}
