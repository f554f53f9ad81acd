//! Kernel trace capture: with `TFWGPU_TRACE=path`, every runtime kernel call, memory event and
//! copy the plugin makes is appended to `path`, one JSON object per line, through a buffered
//! writer behind a mutex, flushed when the process exits. `tfwgpu-bench replay path` re-runs
//! the stream on any adapter. When `TFWGPU_TRACE` is unset each hook costs one branch on a
//! static flag. Capturing changes no result: the hooks only read what the plugin already has.
//!
//! # Format (version 1)
//!
//! The first line is a header: `{"ev":"header","format":"tfwgpu-trace","version":1}`. Every
//! other line has an `"ev"` key (what happened), `"seq"` (a counter: the order of events; lines
//! may be written by several threads, but `seq` is taken under the writer's lock so lines are in
//! `seq` order), `"dev"` (the TensorFlow ordinal of the tfwgpu device), `"t_us"` (microseconds
//! since the trace began, when the event was written: a kernel's event is written after it
//! recorded its work) and `"thread"` (a small number per OS thread that wrote events), so host
//! time between calls and the thread of each call can be read off the trace. Addresses are the
//! runtime allocator's 64-bit addresses (as JSON integers); an address inside an allocation
//! (an offset into it, as TensorFlow's BFC allocator hands out) belongs to the allocation whose
//! `[addr, addr + size)` range holds it at that point of the stream.
//!
//! - `alloc`: `{"addr", "size"}`: device memory allocated (TensorFlow's allocator regions).
//! - `free`: `{"addr"}`: that allocation freed.
//! - `h2d`: `{"dst", "size"}`: a host-to-device copy (the data itself is not recorded).
//! - `d2h`: `{"src", "size"}`: a device-to-host copy; it blocks the host until the GPU work
//!   before it completes (a host sync).
//! - `d2d`: `{"src", "dst", "size"}`: a device-to-device copy (`"to_dev"` when it crosses
//!   devices).
//! - `copied`: `{"dst", "size"}`: the copier thread of device `dev`'s streams finished a copy
//!   between devices that `dev` issued (source read, destination write recorded); written for
//!   diagnosis of the copies' latency, ignored by replay.
//! - `fill`: `{"addr", "size", "pattern"}`: memset/memzero with a repeated 32-bit pattern.
//! - `sync`: `{"what"}`: the host waited for the device (`block_host_until_done`,
//!   `synchronize_all_activity`, `block_host_for_event`).
//! - `kernel`: `{"op", "node", "attrs", "inputs", "outputs", "dispatches", "host_us"}`: a
//!   runtime kernel recorded its GPU work. `attrs` maps each attribute name to a one-key object:
//!   `{"b": bool}`, `{"i": int}`, `{"f": float}` (non-finite floats as the strings `"nan"`,
//!   `"inf"`, `"-inf"`), `{"type": "float32"}`, `{"s": string}`, `{"ints": [..]}`,
//!   `{"floats": [..]}`, `{"types": [..]}`, `{"shape": null | [dims]}`. An input is
//!   `{"dtype", "shape", "addr"}` for a device tensor or `{"dtype", "shape", "host": hex}` for a
//!   host-memory input (its bytes, little-endian, as hex). Outputs are `{"dtype", "shape",
//!   "addr"}`. `dispatches` is the number of compute dispatches the call recorded (the
//!   device's counter before and after; exact when TensorFlow runs one op at a time on the
//!   device), `host_us` the host time of output-shape inference plus recording. A kernel
//!   whose outputs are all empty records no work and has `"skipped": true`.
//! - `host_kernel`: `{"op", "node", "inputs", "outputs"}`: a host-memory kernel (int32 shape
//!   arithmetic); inputs and outputs are `{"dtype", "shape"}`. Nothing to replay on a device.
//! - `mark`: `{"label"}` with `"dev": -1`: a step boundary the program put in the stream
//!   (`tensorflow_wgpu.trace_mark(label)` from Python, through the exported C function
//!   `tfwgpu_trace_mark`). Nothing the plugin sees marks a training step by itself; a program
//!   marks the start of each step (Keras: a callback's `on_train_batch_begin`) and the end of
//!   the last one, and `tfwgpu-bench replay` reports the time between consecutive marks,
//!   grouped by the label of the mark that opens each interval. Version 1 readers that predate
//!   marks reject the event as unknown.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value, json};
use tfwgpu_runtime::{AttrValue, Attrs, DType, HostTensor, TensorDesc};

struct Writer {
    out: BufWriter<File>,
    seq: u64,
    start: std::time::Instant,
}

/// A small number per OS thread that emitted trace events (1, 2, ... in order of first use).
fn thread_number() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static N: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    N.with(|n| *n)
}

/// 0: not decided yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static WRITER: OnceLock<Option<Mutex<Writer>>> = OnceLock::new();
static FAILED: AtomicBool = AtomicBool::new(false);

/// Whether tracing is on (one load and a branch once decided).
#[inline]
pub fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => init(),
    }
}

#[cold]
fn init() -> bool {
    let w = WRITER.get_or_init(|| {
        let path = std::env::var_os("TFWGPU_TRACE").filter(|p| !p.is_empty())?;
        match File::create(&path) {
            Ok(f) => {
                let mut out = BufWriter::with_capacity(1 << 20, f);
                let _ = writeln!(
                    out,
                    "{}",
                    json!({"ev": "header", "format": "tfwgpu-trace", "version": 1})
                );
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(flush_at_exit) };
                Some(Mutex::new(Writer {
                    out,
                    seq: 0,
                    start: std::time::Instant::now(),
                }))
            }
            Err(e) => {
                eprintln!(
                    "tfwgpu: cannot write the trace file {}: {e}",
                    std::path::Path::new(&path).display()
                );
                None
            }
        }
    });
    let on = w.is_some();
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

extern "C" fn flush_at_exit() {
    flush();
}

/// Flushes the trace file (also done at exit).
pub fn flush() {
    if let Some(Some(w)) = WRITER.get()
        && let Ok(mut w) = w.lock()
    {
        let _ = w.out.flush();
    }
}

/// Appends one event: `fields` gets "ev", "seq" and "dev".
fn emit(ev: &str, dev: i32, mut fields: Map<String, Value>) {
    let Some(Some(w)) = WRITER.get() else { return };
    let Ok(mut w) = w.lock() else { return };
    fields.insert("ev".into(), ev.into());
    fields.insert("seq".into(), w.seq.into());
    fields.insert("dev".into(), dev.into());
    let t = w.start.elapsed().as_secs_f64() * 1e6;
    fields.insert("t_us".into(), ((t * 10.0).round() / 10.0).into());
    fields.insert("thread".into(), thread_number().into());
    w.seq += 1;
    let line = Value::Object(fields).to_string();
    if writeln!(w.out, "{line}").is_err() && !FAILED.swap(true, Ordering::Relaxed) {
        eprintln!("tfwgpu: writing the trace file failed; the trace is incomplete");
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

pub fn alloc(dev: i32, addr: u64, size: u64) {
    emit("alloc", dev, obj(json!({"addr": addr, "size": size})));
}

pub fn free(dev: i32, addr: u64) {
    emit("free", dev, obj(json!({"addr": addr})));
}

pub fn h2d(dev: i32, dst: u64, size: u64) {
    emit("h2d", dev, obj(json!({"dst": dst, "size": size})));
}

pub fn d2h(dev: i32, src: u64, size: u64) {
    emit("d2h", dev, obj(json!({"src": src, "size": size})));
}

pub fn d2d(dev: i32, src: u64, dst: u64, size: u64, to_dev: Option<u32>) {
    let mut m = obj(json!({"src": src, "dst": dst, "size": size}));
    if let Some(t) = to_dev {
        m.insert("to_dev".into(), t.into());
    }
    emit("d2d", dev, m);
}

/// A copy between devices that the copier thread of device `dev`'s streams has finished: its
/// source was read and its destination write recorded (diagnosis only; replay ignores it).
pub fn copied(dev: i32, dst: u64, size: u64) {
    emit("copied", dev, obj(json!({"dst": dst, "size": size})));
}

pub fn fill(dev: i32, addr: u64, size: u64, pattern: u32) {
    emit(
        "fill",
        dev,
        obj(json!({"addr": addr, "size": size, "pattern": pattern})),
    );
}

pub fn sync(dev: i32, what: &str) {
    emit("sync", dev, obj(json!({"what": what})));
}

fn float(f: f32) -> Value {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        json!(f)
    }
}

fn attr(v: &AttrValue) -> Value {
    match v {
        AttrValue::Bool(b) => json!({ "b": b }),
        AttrValue::Int(i) => json!({ "i": i }),
        AttrValue::Float(f) => json!({ "f": float(*f) }),
        AttrValue::Type(t) => json!({ "type": t.name() }),
        AttrValue::Str(s) => json!({ "s": s }),
        AttrValue::Ints(v) => json!({ "ints": v }),
        AttrValue::Floats(v) => {
            json!({ "floats": v.iter().map(|f| float(*f)).collect::<Vec<_>>() })
        }
        AttrValue::Types(v) => json!({ "types": v.iter().map(|t| t.name()).collect::<Vec<_>>() }),
        AttrValue::Shape(s) => json!({ "shape": s }),
    }
}

/// The attributes in the trace format.
pub fn attrs_json(a: &Attrs) -> Value {
    Value::Object(a.iter().map(|(k, v)| (k.clone(), attr(v))).collect())
}

fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

/// A device tensor.
pub fn device_tensor(d: &TensorDesc, addr: u64) -> Value {
    json!({"dtype": d.dtype.name(), "shape": d.shape, "addr": addr})
}

/// A host-memory tensor with its bytes.
pub fn host_tensor(h: &HostTensor) -> Value {
    json!({"dtype": h.dtype.name(), "shape": h.shape, "host": hex(&h.bytes)})
}

/// A host kernel's argument (no data).
pub fn host_desc(dtype: DType, shape: &[usize]) -> Value {
    json!({"dtype": dtype.name(), "shape": shape})
}

/// One device kernel call.
pub struct KernelEvent<'a> {
    pub dev: i32,
    pub op: &'a str,
    pub node: &'a str,
    pub attrs: &'a Value,
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
    pub dispatches: u64,
    pub host_us: f64,
    pub skipped: bool,
}

pub fn kernel(k: KernelEvent) {
    let mut m = obj(json!({
        "op": k.op, "node": k.node, "attrs": k.attrs, "inputs": k.inputs,
        "outputs": k.outputs, "dispatches": k.dispatches,
        "host_us": (k.host_us * 1000.0).round() / 1000.0,
    }));
    if k.skipped {
        m.insert("skipped".into(), true.into());
    }
    emit("kernel", k.dev, m);
}

/// Appends a `mark` event (a step boundary) when tracing is on; returns whether it did.
pub fn mark(label: &str) -> bool {
    if !on() {
        return false;
    }
    emit("mark", -1, obj(json!({ "label": label })));
    true
}

/// `tfwgpu_trace_mark(label)`: a step boundary in the trace (see `mark` in the module doc).
/// `label` is a NUL-terminated string (UTF-8; invalid bytes are replaced) or null for "step".
/// Returns 1 when the mark was written, 0 when tracing is off. Cheap when tracing is off.
///
/// # Safety
/// `label` is null or points to a NUL-terminated string that stays valid during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tfwgpu_trace_mark(label: *const std::os::raw::c_char) -> i32 {
    let label = if label.is_null() {
        std::borrow::Cow::Borrowed("step")
    } else {
        // SAFETY: the caller passes a NUL-terminated string valid during the call.
        unsafe { std::ffi::CStr::from_ptr(label) }.to_string_lossy()
    };
    mark(&label) as i32
}

pub fn host_kernel(dev: i32, op: &str, node: &str, inputs: Vec<Value>, outputs: Vec<Value>) {
    emit(
        "host_kernel",
        dev,
        obj(json!({"op": op, "node": node, "inputs": inputs, "outputs": outputs})),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_encode_every_kind() {
        let a = Attrs::new()
            .with("T", AttrValue::Type(DType::F16))
            .with("alpha", AttrValue::Float(f32::NAN))
            .with("ksize", AttrValue::Ints(vec![1, 2, 2, 1]))
            .with("shape", AttrValue::Shape(None))
            .with("padding", AttrValue::Str("SAME".into()));
        let v = attrs_json(&a);
        assert_eq!(v["T"], json!({"type": "float16"}));
        assert_eq!(v["alpha"], json!({"f": "nan"}));
        assert_eq!(v["ksize"], json!({"ints": [1, 2, 2, 1]}));
        assert_eq!(v["shape"], json!({ "shape": null }));
        assert_eq!(v["padding"], json!({"s": "SAME"}));
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
