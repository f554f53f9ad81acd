//! `TF_InitKernel` and the KernelWrapper: one TensorFlow kernel registration per (op, dtype) of
//! the runtime's registry, all served by the same three C functions. Construction parses the
//! node's NodeDef (op name and every attribute) and builds the runtime kernel once; compute
//! fetches the inputs (device addresses, or host bytes for host-memory arguments), asks the
//! kernel for its output shapes, allocates the outputs through TensorFlow, and records the
//! kernel's GPU work. Every failure becomes a TF_Status naming the op; no panic crosses the C
//! boundary.

use std::ffi::{CString, c_void};
use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use tfwgpu_runtime::hostlog;

use tfwgpu_runtime::kernels::TYPE_CONSTRAINTS;
use tfwgpu_runtime::{
    DType, DeviceRef, Error, HostKernel, HostTensor, Kernel, Operand, Registry, Result, TensorDesc,
};
use tfwgpu_sys as sys;

use crate::nodedef::{dtype_from_tf, dtype_to_tf, parse};
use crate::status::{Status, set, set_error};

/// `st.check(what)` with the message built only on failure: the compute path checks a status
/// after every TF_* call, and formatting a context string for each (shapes included) cost more
/// than some of the calls.
fn check_with(st: &Status, what: impl FnOnce() -> String) -> Result<()> {
    // SAFETY: a live status.
    if unsafe { sys::TF_GetCode(st.0) } == sys::TSL_Code_TSL_OK {
        return Ok(());
    }
    st.check(&what())
}

/// The plugin's host time (CPU time of the calling thread) per kernel call, split by phase
/// (`TFWGPU_HOST_TIMERS=1`; off by default, then each phase costs one check of a flag). Read with
/// `tfwgpu_host_timers_json`: calls and nanoseconds in the compute callback (all of it), in
/// fetching the inputs (TF_GetInput and friends), in output shapes (`Kernel::outputs`), in
/// output allocation (TF_AllocateOutput, which calls the device allocator), in recording
/// (`Kernel::record`: pipelines, bindings, dispatches), and the rest (status, stats, tensor
/// handles). `bench/op_overhead.py` prints it beside TensorFlow's own per-op time.
pub mod timers {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    pub const PHASES: [&str; 4] = ["inputs", "shapes", "allocate", "record"];
    static CALLS: AtomicU64 = AtomicU64::new(0);
    static TOTAL_NS: AtomicU64 = AtomicU64::new(0);
    static PHASE_NS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

    pub fn on() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| {
            std::env::var("TFWGPU_HOST_TIMERS").is_ok_and(|v| !matches!(v.trim(), "" | "0"))
        })
    }

    /// CPU time of the calling thread in nanoseconds: the host cost of the callback without
    /// the time the thread waited for a CPU (the development machine's 2 cores are shared, and
    /// lavapipe executes the GPU work on threads of its own). A system call each (~0.1-0.3
    /// us): the timers are a measuring mode. Wall time where the clock is missing.
    fn now_ns() -> u64 {
        tfwgpu_runtime::hostlog::thread_cpu_ns().unwrap_or_else(wall_ns)
    }

    fn wall_ns() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// Laps of one compute call.
    pub struct Clock {
        start: u64,
        last: u64,
    }

    impl Clock {
        pub fn start() -> Option<Clock> {
            on().then(|| {
                let now = now_ns();
                Clock {
                    start: now,
                    last: now,
                }
            })
        }

        /// Charges the time since the last lap to `phase`.
        pub fn lap(&mut self, phase: usize) {
            let now = now_ns();
            PHASE_NS[phase].fetch_add(now.saturating_sub(self.last), Ordering::Relaxed);
            self.last = now;
        }

        /// Ends the call: counts it and its whole time.
        pub fn finish(self) {
            CALLS.fetch_add(1, Ordering::Relaxed);
            TOTAL_NS.fetch_add(now_ns().saturating_sub(self.start), Ordering::Relaxed);
        }
    }

    pub fn json() -> String {
        let mut phases = serde_json::Map::new();
        for (name, ns) in PHASES.iter().zip(&PHASE_NS) {
            phases.insert((*name).into(), ns.load(Ordering::Relaxed).into());
        }
        serde_json::json!({
            "enabled": on(),
            "calls": CALLS.load(Ordering::Relaxed),
            "total_ns": TOTAL_NS.load(Ordering::Relaxed),
            "phase_ns": phases,
        })
        .to_string()
    }
}

/// The host-time breakdown of the compute path as JSON (see [`timers`]). The string is owned by
/// the plugin and stays valid until the next call.
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_host_timers_json() -> *const std::os::raw::c_char {
    static LAST: std::sync::Mutex<Option<CString>> = std::sync::Mutex::new(None);
    crate::status::quiet(std::ptr::null(), || {
        let s = CString::new(timers::json()).expect("no NUL in JSON");
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        last.insert(s).as_ptr()
    })
}

/// A TensorFlow kernel instance: the runtime kernel built from the node's attributes.
struct Wrapped {
    op: String,
    node: String,
    kernel: Built,
    /// The attributes in the trace format, when `TFWGPU_TRACE` is set.
    trace_attrs: Option<serde_json::Value>,
    /// The op's label in the host log (`TFWGPU_HOST_LOG`).
    log_label: u64,
    /// The op's execution counter in the report (`stats::op_counter`).
    runs: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

enum Built {
    /// Records GPU work.
    Device(Box<dyn Kernel>),
    /// Computes on the host (int32 shape arithmetic; every argument in host memory).
    Host(Box<dyn HostKernel>),
}

/// Whether the node runs the host kernel: the registration made for (op, dtype) was the
/// host one (see `register_all`).
fn host_kernel_for(op: &str, attrs: &tfwgpu_runtime::Attrs) -> bool {
    let reg = Registry::global();
    reg.host_ops().iter().any(|d| {
        d.op == op
            && (d.type_attr.is_empty()
                || matches!(attrs.dtype_opt(d.type_attr), Ok(Some(t)) if reg.host(op, t).is_some()))
    })
}

unsafe extern "C" fn create(ctx: *mut sys::TF_OpKernelConstruction) -> *mut c_void {
    let st = Status::new();
    let built = catch_unwind(AssertUnwindSafe(|| -> Result<Box<Wrapped>> {
        // SAFETY: valid construction context; the buffer is freed below.
        let buf = unsafe { sys::TF_OpKernelConstruction_GetNodeDef(ctx, st.0) };
        st.check("reading the NodeDef")?;
        let parsed = {
            // SAFETY: TF_Buffer holds `length` bytes at `data`.
            let b = unsafe { &*buf };
            let bytes = unsafe { std::slice::from_raw_parts(b.data as *const u8, b.length) };
            parse(bytes)
        };
        // SAFETY: made by TF_OpKernelConstruction_GetNodeDef.
        unsafe { sys::TF_DeleteBuffer(buf) };
        let (op, attrs) = parsed?;
        let trace_attrs = crate::trace::on().then(|| crate::trace::attrs_json(&attrs));
        // A node the int32 graph pass labeled runs the device kernel registered under that
        // label, also where the op has a host kernel for its dtype; one the host-logic pass
        // labeled runs the labeled host kernel.
        let label = match attrs.get("_kernel") {
            Some(tfwgpu_runtime::AttrValue::Str(l)) => l.as_str(),
            _ => "",
        };
        let labeled = label == crate::graph::int32::LABEL;
        let kernel = if label == crate::graph::host_logic::LABEL {
            Built::Host(Registry::global().build_labeled_host_kernel(&op, &attrs)?)
        } else if !labeled && host_kernel_for(&op, &attrs) {
            Built::Host(Registry::global().build_host_kernel(&op, &attrs)?)
        } else {
            Built::Device(Registry::global().build_kernel(&op, &attrs)?)
        };
        // SAFETY: TF_OpKernelConstruction_GetName returns a string view valid during the call.
        let name = unsafe { sys::TF_OpKernelConstruction_GetName(ctx) };
        let node = unsafe { std::slice::from_raw_parts(name.data as *const u8, name.len) };
        Ok(Box::new(Wrapped {
            log_label: tfwgpu_runtime::hostlog::label(&op),
            runs: crate::stats::op_counter(&op, matches!(kernel, Built::Host(_))),
            op,
            node: String::from_utf8_lossy(node).into_owned(),
            kernel,
            trace_attrs,
        }))
    }));
    match built {
        Ok(Ok(w)) => Box::into_raw(w) as *mut c_void,
        Ok(Err(e)) => {
            set_error(st.0, &e);
            // SAFETY: valid construction context.
            unsafe { sys::TF_OpKernelConstruction_Failure(ctx, st.0) };
            std::ptr::null_mut()
        }
        Err(_) => {
            set(
                st.0,
                sys::TSL_Code_TSL_INTERNAL,
                "internal error in tfwgpu while building a kernel",
            );
            // SAFETY: valid construction context.
            unsafe { sys::TF_OpKernelConstruction_Failure(ctx, st.0) };
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn delete(k: *mut c_void) {
    if !k.is_null() {
        // SAFETY: made by Box::into_raw in create.
        drop(unsafe { Box::from_raw(k as *mut Wrapped) });
    }
}

/// TF_Tensor handles fetched during one compute call, deleted at its end.
struct Handles(Vec<*mut sys::TF_Tensor>);

impl Drop for Handles {
    fn drop(&mut self) {
        for &t in &self.0 {
            // SAFETY: each came from TF_GetInput or TF_AllocateOutput.
            unsafe { sys::TF_DeleteTensor(t) };
        }
    }
}

fn shape_of(t: *const sys::TF_Tensor) -> Vec<usize> {
    // SAFETY: valid tensor.
    let n = unsafe { sys::TF_NumDims(t) };
    (0..n)
        .map(|i| unsafe { sys::TF_Dim(t, i) }.max(0) as usize)
        .collect()
}

enum Input {
    Device(DeviceRef),
    Host(HostTensor),
}

/// A shape as TensorFlow's int64 dimensions, on the stack up to rank 8 (one allocation per
/// output was made for them before).
enum Dims {
    Small([i64; 8], usize),
    Large(Vec<i64>),
}

impl Dims {
    fn of(shape: &[usize]) -> Dims {
        if shape.len() <= 8 {
            let mut a = [0i64; 8];
            for (d, &x) in a.iter_mut().zip(shape) {
                *d = x as i64;
            }
            Dims::Small(a, shape.len())
        } else {
            Dims::Large(shape.iter().map(|&x| x as i64).collect())
        }
    }

    fn as_ptr(&self) -> *const i64 {
        match self {
            Dims::Small(a, _) => a.as_ptr(),
            Dims::Large(v) => v.as_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Dims::Small(_, n) => *n,
            Dims::Large(v) => v.len(),
        }
    }
}

/// Allocates output `i` through TensorFlow.
fn allocate_output(
    ctx: *mut sys::TF_OpKernelContext,
    st: &Status,
    handles: &mut Handles,
    i: usize,
    d: &TensorDesc,
) -> Result<*mut sys::TF_Tensor> {
    let dims = Dims::of(&d.shape);
    // SAFETY: valid kernel context; dims outlive the call.
    let t = unsafe {
        sys::TF_AllocateOutput(
            ctx,
            i as c_int,
            dtype_to_tf(d.dtype),
            dims.as_ptr(),
            dims.len() as c_int,
            d.byte_size() as usize,
            st.0,
        )
    };
    check_with(st, || {
        format!("allocating output {i} ({} {:?})", d.dtype, d.shape)
    })?;
    handles.0.push(t);
    Ok(t)
}

/// Output 0 in the buffer of one of the `candidates` inputs when TensorFlow allows it (same
/// dtype and shape, no other reference; required inside collective reductions), else a new
/// allocation.
fn forward_or_allocate(
    ctx: *mut sys::TF_OpKernelContext,
    st: &Status,
    handles: &mut Handles,
    candidates: &[c_int],
    d: &TensorDesc,
) -> Result<*mut sys::TF_Tensor> {
    let dims = Dims::of(&d.shape);
    let mut forwarded: c_int = -1;
    // SAFETY: valid kernel context; the arrays outlive the call.
    let t = unsafe {
        sys::TF_ForwardInputOrAllocateOutput(
            ctx,
            candidates.as_ptr(),
            candidates.len() as c_int,
            0,
            dims.as_ptr(),
            dims.len() as c_int,
            &mut forwarded,
            st.0,
        )
    };
    check_with(st, || {
        format!("allocating output 0 ({} {:?})", d.dtype, d.shape)
    })?;
    handles.0.push(t);
    // SAFETY: valid tensor.
    let ty = unsafe { sys::TF_TensorType(t) };
    if dtype_from_tf(ty) != Some(d.dtype) {
        return Err(Error::Gpu(format!(
            "TensorFlow forwarded input {forwarded} of dtype {ty} for an output of {}",
            d.dtype
        )));
    }
    Ok(t)
}

/// Runs a host kernel: every input and output is in host memory. Returns the outputs' descs.
fn run_host(
    k: &dyn HostKernel,
    ctx: *mut sys::TF_OpKernelContext,
    inputs: &[Input],
    st: &Status,
    handles: &mut Handles,
) -> Result<Vec<TensorDesc>> {
    let host: Vec<&HostTensor> = inputs
        .iter()
        .map(|i| match i {
            Input::Host(h) => Ok(h),
            Input::Device(_) => Err(Error::Gpu(format!(
                "{}: an input of a host kernel is in device memory",
                k.op()
            ))),
        })
        .collect::<Result<_>>()?;
    let outs = k.compute(&host)?;
    // SAFETY: valid kernel context.
    let n_out = unsafe { sys::TF_NumOutputs(ctx) };
    if outs.len() != n_out as usize {
        return Err(Error::Gpu(format!(
            "the kernel produced {} outputs, TensorFlow expects {n_out}",
            outs.len()
        )));
    }
    let mut descs = Vec::with_capacity(outs.len());
    for (i, o) in outs.iter().enumerate() {
        let d = TensorDesc::new(o.dtype, &o.shape);
        let t = allocate_output(ctx, st, handles, i, &d)?;
        descs.push(d);
        if !o.bytes.is_empty() {
            // SAFETY: a host output of TF_TensorByteSize == o.bytes.len() bytes.
            unsafe {
                let dst = sys::TF_TensorData(t) as *mut u8;
                std::ptr::copy_nonoverlapping(o.bytes.as_ptr(), dst, o.bytes.len());
            }
        }
    }
    Ok(descs)
}

/// An input in the trace format.
fn trace_input(i: &Input) -> serde_json::Value {
    match i {
        Input::Device(d) => crate::trace::device_tensor(&d.desc, d.addr),
        Input::Host(h) => crate::trace::host_tensor(h),
    }
}

/// TensorFlow's DT_INT8.
const TF_INT8: u32 = 6;

fn run(
    w: &Wrapped,
    ctx: *mut sys::TF_OpKernelContext,
    clock: &mut Option<timers::Clock>,
) -> Result<()> {
    let st = Status::new();
    // SAFETY: valid kernel context for the duration of the call.
    let ordinal = unsafe { sys::TF_GetDeviceId(ctx) };
    let device = crate::device(ordinal)
        .ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {ordinal}")))?;
    let n = unsafe { sys::TF_NumInputs(ctx) };
    let n_out = unsafe { sys::TF_NumOutputs(ctx) };
    let mut handles = Handles(Vec::with_capacity((n + n_out).max(0) as usize));
    let mut inputs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut t: *mut sys::TF_Tensor = std::ptr::null_mut();
        unsafe { sys::TF_GetInput(ctx, i, &mut t, st.0) };
        check_with(&st, || format!("input {i}"))?;
        handles.0.push(t);
        let tf_type = unsafe { sys::TF_TensorType(t) };
        // int8 reaches a kernel as opaque bytes: no kernel here registers an int8 type
        // constraint, so an int8 input can only be one whose type the op fixes (CudnnRNN's
        // host_reserved, which the forward kernel writes as uint8 of the same size).
        let dtype =
            dtype_from_tf(if tf_type == TF_INT8 { 4 } else { tf_type }).ok_or_else(|| {
                Error::Unimplemented(format!(
                    "input {i} has a dtype ({tf_type}) tfwgpu does not support"
                ))
            })?;
        let shape = shape_of(t);
        let host = unsafe { sys::TF_IsHostMemoryInput(ctx, i, st.0) };
        check_with(&st, || format!("input {i}"))?;
        let data = unsafe { sys::TF_TensorData(t) };
        if host {
            let len = unsafe { sys::TF_TensorByteSize(t) };
            let bytes = if len == 0 || data.is_null() {
                vec![]
            } else {
                // SAFETY: a host tensor's buffer holds TF_TensorByteSize bytes.
                unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec()
            };
            inputs.push(Input::Host(HostTensor {
                dtype,
                shape,
                bytes,
            }));
        } else {
            inputs.push(Input::Device(DeviceRef {
                desc: TensorDesc { dtype, shape },
                addr: data as u64,
            }));
        }
    }
    if let Some(c) = clock.as_mut() {
        c.lap(0);
    }
    let kernel = match &w.kernel {
        Built::Host(k) => {
            let descs = run_host(k.as_ref(), ctx, &inputs, &st, &mut handles)?;
            if w.trace_attrs.is_some() {
                let ins = inputs
                    .iter()
                    .map(|i| match i {
                        Input::Device(d) => crate::trace::host_desc(d.desc.dtype, &d.desc.shape),
                        Input::Host(h) => crate::trace::host_desc(h.dtype, &h.shape),
                    })
                    .collect();
                let outs = descs
                    .iter()
                    .map(|d| crate::trace::host_desc(d.dtype, &d.shape))
                    .collect();
                crate::trace::host_kernel(ordinal, &w.op, &w.node, ins, outs);
            }
            return Ok(());
        }
        Built::Device(k) => k.as_ref(),
    };
    // Tracing: the dispatch counter and the clock before shape inference.
    let traced = w
        .trace_attrs
        .as_ref()
        .map(|a| (a, device.exec_stats().dispatches, std::time::Instant::now()));
    let operands: Vec<Operand> = inputs
        .iter()
        .map(|i| match i {
            Input::Device(d) => Operand::Device(d),
            Input::Host(h) => Operand::Host(h),
        })
        .collect();
    // Data-dependent output shapes (Where) may read the device here, before allocation.
    let descs = device.output_descs(kernel, &operands)?;
    if let Some(c) = clock.as_mut() {
        c.lap(1);
    }
    if descs.len() != n_out as usize {
        return Err(Error::Gpu(format!(
            "the kernel produced {} outputs, TensorFlow expects {n_out}",
            descs.len()
        )));
    }
    let mut outputs = Vec::with_capacity(descs.len());
    let forwardable = kernel.forwardable_inputs();
    for (i, d) in descs.into_iter().enumerate() {
        let t = if i == 0 && !forwardable.is_empty() {
            // (At most 15 candidates: the fused kernels' inputs.)
            let mut forward = [0 as c_int; 16];
            let nf = forwardable.len().min(forward.len());
            for (f, &i) in forward.iter_mut().zip(&forwardable[..nf]) {
                *f = i as c_int;
            }
            forward_or_allocate(ctx, &st, &mut handles, &forward[..nf], &d)?
        } else {
            allocate_output(ctx, &st, &mut handles, i, &d)?
        };
        let addr = unsafe { sys::TF_TensorData(t) } as u64;
        outputs.push(DeviceRef { desc: d, addr });
    }
    if let Some(c) = clock.as_mut() {
        c.lap(2);
    }
    let skipped = outputs.iter().all(|o| o.desc.num_elements() == 0);
    let result = if skipped {
        Ok(())
    } else {
        device.record(kernel, &operands, &outputs)
    };
    if let Some(c) = clock.as_mut() {
        c.lap(3);
    }
    if let Some((attrs, before, t0)) = traced
        && result.is_ok()
    {
        let host_us = t0.elapsed().as_secs_f64() * 1e6;
        crate::trace::kernel(crate::trace::KernelEvent {
            dev: ordinal,
            op: &w.op,
            node: &w.node,
            attrs,
            inputs: inputs.iter().map(trace_input).collect(),
            outputs: outputs
                .iter()
                .map(|o| crate::trace::device_tensor(&o.desc, o.addr))
                .collect(),
            dispatches: device.exec_stats().dispatches - before,
            host_us,
            skipped,
        });
    }
    result
}

unsafe extern "C" fn compute(k: *mut c_void, ctx: *mut sys::TF_OpKernelContext) {
    // SAFETY: made by create.
    let Some(w) = (unsafe { (k as *const Wrapped).as_ref() }) else {
        return;
    };
    let mut clock = timers::Clock::start();
    crate::stats::count(&w.runs);
    let kind = match w.kernel {
        Built::Device(_) => hostlog::Kind::Compute,
        Built::Host(_) => hostlog::Kind::HostCompute,
    };
    let span = hostlog::HostSpan::start(kind, w.log_label);
    let result = catch_unwind(AssertUnwindSafe(|| run(w, ctx, &mut clock)));
    drop(span);
    if let Some(c) = clock {
        c.finish();
    }
    // A status is made only on failure (TF_NewStatus allocates).
    let (code, msg) = match result {
        Ok(Ok(())) => return,
        Ok(Err(e)) => {
            // Say which op failed, unless the kernel already did.
            let msg = e.to_string();
            let msg = if msg.starts_with(&w.op) {
                msg
            } else {
                format!("{}: {msg}", w.op)
            };
            (
                crate::status::code_of(&e),
                format!("{msg} [node {}]", w.node),
            )
        }
        Err(_) => (
            sys::TSL_Code_TSL_INTERNAL,
            format!(
                "internal error in tfwgpu running {} [node {}]",
                w.op, w.node
            ),
        ),
    };
    let st = Status::new();
    set(st.0, code, &msg);
    // SAFETY: valid kernel context.
    unsafe { sys::TF_OpKernelContext_Failure(ctx, st.0) };
}

fn leak(s: &str) -> *const std::os::raw::c_char {
    // Registration strings live as long as the process, as TensorFlow's registry does.
    CString::new(s).expect("no NUL").into_raw()
}

/// Ops for which TensorFlow's own DEVICE_DEFAULT kernel is used on our device instead of the
/// runtime's: they forward the input buffer without touching its data.
const TENSORFLOW_PROVIDES: &[&str] = &["Identity"];

/// Priority of our registrations: above TensorFlow's DEVICE_DEFAULT kernels (priority 0) of the
/// same op, which would otherwise be ambiguous matches.
const PRIORITY: i32 = 1;

/// The number of arguments of every TensorFlow op, read once.
fn op_arg_counts() -> &'static std::collections::HashMap<String, usize> {
    static COUNTS: std::sync::OnceLock<std::collections::HashMap<String, usize>> =
        std::sync::OnceLock::new();
    COUNTS.get_or_init(|| {
        // SAFETY: TF_GetAllOpList returns a buffer we own; it is read, then deleted.
        unsafe {
            let buf = sys::TF_GetAllOpList();
            if buf.is_null() {
                return Default::default();
            }
            let b = &*buf;
            let bytes = if b.data.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(b.data as *const u8, b.length)
            };
            let counts = crate::nodedef::op_arg_counts(bytes).unwrap_or_else(|e| {
                tracing::warn!("reading TensorFlow's op list: {e}");
                Default::default()
            });
            sys::TF_DeleteBuffer(buf);
            counts
        }
    })
}

/// Whether TensorFlow registers its own DEVICE_DEFAULT int32 kernel for `op` with every
/// argument in host memory.
fn tensorflow_has_host_int32(op: &str, type_attr: &str) -> bool {
    // Asked for every int32 node the graph pass looks at: remembered per op.
    static SEEN: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<(String, String), bool>>,
    > = std::sync::OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let key = (op.to_string(), type_attr.to_string());
    if let Some(&v) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return v;
    }
    let v = query_host_int32(op, type_attr);
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, v);
    v
}

/// [`tensorflow_has_host_int32`], asking TensorFlow.
fn query_host_int32(op: &str, type_attr: &str) -> bool {
    let Some(&n_args) = op_arg_counts().get(op) else {
        return false;
    };
    let st = Status::new();
    let name = CString::new(op).expect("no NUL");
    // SAFETY: valid string and status; the buffer is read, then deleted.
    unsafe {
        let buf = sys::TF_GetRegisteredKernelsForOp(name.as_ptr(), st.0);
        if buf.is_null() {
            return false;
        }
        let found = st.check("kernel list").is_ok() && {
            let b = &*buf;
            let bytes = if b.data.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(b.data as *const u8, b.length)
            };
            crate::nodedef::has_default_host_kernel(bytes, type_attr, DType::I32, n_args)
                .unwrap_or(false)
        };
        sys::TF_DeleteBuffer(buf);
        found
    }
}

/// Whether the kernel of `op` for `t` (its type attribute `type_attr`) keeps its arguments in
/// host memory: the runtime's host kernel, or TensorFlow's own int32 kernel for every device
/// (int32 shape arithmetic, as in TensorFlow's CUDA build).
fn host_memory_kernel(op: &str, type_attr: &str, t: DType) -> bool {
    Registry::global().host(op, t).is_some()
        || (t == DType::I32 && tensorflow_has_host_int32(op, type_attr))
}

/// The type constraints of each registration of `op` for `dt`: its type attribute, then every
/// combination of its second type attributes (`constraint_combinations`).
fn type_sets(
    op: &str,
    type_attr: &'static str,
    dt: Option<DType>,
) -> Vec<Vec<(&'static str, DType)>> {
    constraint_combinations(op)
        .into_iter()
        .map(|extra| {
            let mut types: Vec<(&str, DType)> = dt.map(|t| (type_attr, t)).into_iter().collect();
            types.extend(extra);
            types
        })
        .collect()
}

/// Every combination of the op's second type attributes (`TYPE_CONSTRAINTS`); one empty
/// combination when it has none.
fn constraint_combinations(op: &str) -> Vec<Vec<(&'static str, DType)>> {
    let mut combos: Vec<Vec<(&'static str, DType)>> = vec![vec![]];
    for c in TYPE_CONSTRAINTS.iter().filter(|c| c.op == op) {
        combos = combos
            .into_iter()
            .flat_map(|base| {
                c.dtypes.iter().map(move |&t| {
                    let mut v = base.clone();
                    v.push((c.attr, t));
                    v
                })
            })
            .collect();
    }
    combos
}

/// int32 ops whose int32 kernel is kept in host memory (TensorFlow's for every device, or the
/// runtime's host kernel) and which the runtime also registers with its data in device memory,
/// under the label `graph::int32::LABEL`, for the graph pass to pick where their inputs are
/// device tensors: exact integer arithmetic, comparisons, SelectV2 and GatherV2 (no division: TensorFlow's
/// kernels fail on a zero divisor, the GPU's cannot).
pub const DEVICE_INT32_OPS: &[&str] = &[
    "Abs",
    "GatherV2",
    "Add",
    "AddV2",
    "AddN",
    "Equal",
    "Greater",
    "GreaterEqual",
    "Less",
    "LessEqual",
    "Maximum",
    "Minimum",
    "Mul",
    "SelectV2",
    "Neg",
    "NotEqual",
    "Sign",
    "Square",
    "SquaredDifference",
    "Sub",
];

/// The ops whose labeled int32 device kernel TensorFlow accepted.
fn labeled_ops() -> &'static std::sync::Mutex<std::collections::HashSet<&'static str>> {
    static SET: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    SET.get_or_init(Default::default)
}

/// Whether a node of `op` with type attributes `attr` would find the runtime's labeled int32
/// device kernel: registered (TensorFlow accepted it), and the node's other type attributes
/// within its constraints (GatherV2's Tindices). TensorFlow does not fall back from a labeled
/// lookup to an unlabeled one, so the graph pass labels only such nodes.
pub fn labeled_kernel(op: &str, attr: &dyn Fn(&str) -> Option<DType>) -> bool {
    labeled_ops()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(op)
        && TYPE_CONSTRAINTS
            .iter()
            .filter(|c| c.op == op)
            .all(|c| attr(c.attr).is_some_and(|t| c.dtypes.contains(&t)))
}

/// The ops whose labeled host kernel (`host_ops::LABELED_HOST_OPS`) TensorFlow accepted.
fn labeled_host_ops() -> &'static std::sync::Mutex<std::collections::HashSet<&'static str>> {
    static SET: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    SET.get_or_init(Default::default)
}

/// Whether a node of `op` would find the runtime's labeled host kernel (registered, and
/// TensorFlow accepted it).
pub fn labeled_host_kernel(op: &str) -> bool {
    labeled_host_ops()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(op)
}

/// Whether the kernel TensorFlow runs for node `op` with type attributes `attr` on a tfwgpu GPU
/// is the runtime's (unlabeled) kernel, whose outputs are in device memory.
pub fn device_kernel(op: &str, attr: &dyn Fn(&str) -> Option<DType>) -> bool {
    if TENSORFLOW_PROVIDES.contains(&op) {
        return false;
    }
    let reg = Registry::global();
    let Some(def) = reg.get(op) else {
        return false;
    };
    if def.type_attr.is_empty() {
        return true;
    }
    let Some(t) = attr(def.type_attr) else {
        return false;
    };
    def.dtypes.contains(&t) && !host_memory_kernel(op, def.type_attr, t)
}

/// Registers one kernel for `op` on "GPU" with the given type constraints and host-memory
/// arguments. Returns whether TensorFlow accepted it.
fn register_one(op: &str, prefix: &str, types: &[(&str, DType)], host: &[&str]) -> bool {
    register_labeled(op, prefix, types, host, None)
}

/// [`register_one`], with a kernel label: the kernel then runs only for nodes whose `_kernel`
/// attribute names it.
fn register_labeled(
    op: &str,
    prefix: &str,
    types: &[(&str, DType)],
    host: &[&str],
    label: Option<&str>,
) -> bool {
    let st = Status::new();
    // SAFETY: plain calls into TensorFlow's registration API with valid strings.
    unsafe {
        let b = sys::TF_NewKernelBuilder(
            leak(op),
            leak("GPU"),
            Some(create),
            Some(compute),
            Some(delete),
        );
        for (attr, t) in types {
            sys::TF_KernelBuilder_TypeConstraint(b, leak(attr), dtype_to_tf(*t), st.0);
            if let Err(e) = st.check("type constraint") {
                tracing::warn!("not registering {op} for {attr}={t}: {e}");
                sys::TF_DeleteKernelBuilder(b);
                return false;
            }
        }
        sys::TF_KernelBuilder_Priority(b, PRIORITY);
        if let Some(l) = label {
            sys::TF_KernelBuilder_Label(b, leak(l));
        }
        for name in host {
            sys::TF_KernelBuilder_HostMemory(b, leak(name));
        }
        let suffix: Vec<String> = types.iter().map(|(a, t)| format!("{a}_{t}")).collect();
        let kname = format!("tfwgpu_{prefix}{op}_{}", suffix.join("_"));
        sys::TF_RegisterKernelBuilder(leak(&kname), b, st.0);
        match st.check("registration") {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("not registering {kname}: {e}");
                false
            }
        }
    }
}

/// Registers every runtime kernel with TensorFlow. Returns how many registrations succeeded.
pub fn register_all() -> usize {
    let mut ok = 0;
    for def in Registry::global().ops() {
        if TENSORFLOW_PROVIDES.contains(&def.op) {
            continue;
        }
        let dtypes: Vec<Option<DType>> = if def.type_attr.is_empty() {
            vec![None]
        } else {
            def.dtypes.iter().copied().map(Some).collect()
        };
        for dt in dtypes {
            // int32 shape arithmetic stays in host memory, as in TensorFlow's CUDA build: where
            // the runtime has a host kernel for it (registered below), or TensorFlow its own
            // for every device. Registering ours would pull shapes onto the GPU. Ours then runs
            // only where the graph pass labels a node whose inputs are on the device.
            let host_int32 = dt.is_some_and(|t| host_memory_kernel(def.op, def.type_attr, t));
            if host_int32 && !(dt == Some(DType::I32) && DEVICE_INT32_OPS.contains(&def.op)) {
                tracing::debug!("{}: {dt:?} left to a host-memory kernel", def.op);
                continue;
            }
            let label = host_int32.then_some(crate::graph::int32::LABEL);
            let hosts: Vec<&str> = def.host_inputs.iter().map(|(_, n)| *n).collect();
            for types in type_sets(def.op, def.type_attr, dt) {
                let prefix = if label.is_some() { "dev_" } else { "" };
                let done = register_labeled(def.op, prefix, &types, &hosts, label);
                if done && label.is_some() {
                    labeled_ops()
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(def.op);
                }
                ok += done as usize;
            }
        }
    }
    for def in Registry::global().host_ops() {
        let dtypes: Vec<Option<DType>> = if def.type_attr.is_empty() {
            vec![None]
        } else {
            def.dtypes.iter().copied().map(Some).collect()
        };
        for dt in dtypes {
            if dt == Some(DType::I32) && tensorflow_has_host_int32(def.op, def.type_attr) {
                continue;
            }
            // The op's other type attributes as the device kernel constrains them (GatherV2's
            // Tindices: TensorFlow also allows int16, which no kernel here reads).
            for types in type_sets(def.op, def.type_attr, dt) {
                ok += register_one(def.op, "host_", &types, def.args) as usize;
            }
        }
    }
    // Host kernels beside a device kernel, for the nodes the host-logic pass labels.
    for def in Registry::global().labeled_host_ops() {
        let label = Some(crate::graph::host_logic::LABEL);
        if register_labeled(def.op, "lhost_", &[], def.args, label) {
            labeled_host_ops()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(def.op);
            ok += 1;
        }
    }
    ok
}

/// Entry point TensorFlow calls after SE_InitPlugin.
#[unsafe(no_mangle)]
pub extern "C" fn TF_InitKernel() {
    crate::status::quiet((), || {
        if crate::runtime().is_none() {
            return;
        }
        // The op of the graph pass's fused nodes, before its kernels.
        crate::graph::fusion::register_op();
        // The product-and-bias ops of the graph pass, before their kernels.
        if crate::graph::epilogue::register_ops() {
            crate::graph::epilogue::REGISTERED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let n = register_all() + crate::variables::register();
        tracing::info!("registered {n} tfwgpu kernels");
    })
}
