//! What ran where, as the plugin sees it: kernel executions per op on tfwgpu devices, and the
//! copies between host and device (a device-to-host copy is what a CPU fallback costs).
//! Read by `tensorflow_wgpu.report` through `tfwgpu_stats_json`, and written to the file named
//! by `TFWGPU_REPORT` when the process exits.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Kernel executions per op: one counter per op name, which each kernel instance of the op
/// holds (see [`op_counter`]) and bumps without a lock or a lookup.
type Counters = Mutex<BTreeMap<String, Arc<AtomicU64>>>;
static OPS: Counters = Mutex::new(BTreeMap::new());
static HOST_OPS: Counters = Mutex::new(BTreeMap::new());
static D2H: AtomicU64 = AtomicU64::new(0);
static D2H_BYTES: AtomicU64 = AtomicU64::new(0);
static H2D: AtomicU64 = AtomicU64::new(0);
static H2D_BYTES: AtomicU64 = AtomicU64::new(0);
static D2D: AtomicU64 = AtomicU64::new(0);
static D2D_BYTES: AtomicU64 = AtomicU64::new(0);
static D2D_ROUTED: AtomicU64 = AtomicU64::new(0);
static SYNC_WAITS: AtomicU64 = AtomicU64::new(0);
/// Host-to-device copies below / from [`H2D_LARGE`] bytes: count and wall ns inside the write.
static H2D_SPLIT: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// The size from which a host-to-device copy counts as large (the runtime's default direct
/// upload threshold).
pub const H2D_LARGE: u64 = 64 * 1024;
/// Stream-executor calls TensorFlow makes into the plugin (`SE_InitPlugin`'s functions), counted
/// with the wall time spent inside each: where a training step's host syncs and event traffic
/// come from. The `SeCall` discriminant indexes `SE_CALLS`/`SE_NS`.
#[derive(Clone, Copy)]
pub enum SeCall {
    SynchronizeAllActivity,
    BlockHostUntilDone,
    BlockHostForEvent,
    MemcpyDtoH,
    MemcpyHtoD,
    MemcpyDtoD,
    Memset,
    RecordEvent,
    EventStatus,
    HostCallback,
    Allocate,
    Deallocate,
}

const SE_NAMES: [&str; 12] = [
    "synchronize_all_activity",
    "block_host_until_done",
    "block_host_for_event",
    "memcpy_dtoh",
    "memcpy_htod",
    "memcpy_dtod",
    "memset",
    "record_event",
    "get_event_status",
    "host_callback",
    "allocate",
    "deallocate",
];
static SE_CALLS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];
static SE_NS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];

/// Counts one stream-executor call of kind `c` that took `ns` nanoseconds (wall).
pub fn se_call(c: SeCall, ns: u64) {
    SE_CALLS[c as usize].fetch_add(1, Ordering::Relaxed);
    SE_NS[c as usize].fetch_add(ns, Ordering::Relaxed);
}

/// Times `f` as one stream-executor call of kind `c`.
pub fn timed<R>(c: SeCall, f: impl FnOnce() -> R) -> R {
    let t0 = std::time::Instant::now();
    let r = f();
    se_call(c, t0.elapsed().as_nanos() as u64);
    r
}

/// The execution counter of `op`'s kernels on tfwgpu devices (`host`: of its host-memory
/// kernels, int32 shape arithmetic), for a kernel instance to keep: each execution adds one
/// to it (`fetch_add`), which is what the report counts.
pub fn op_counter(op: &str, host: bool) -> Arc<AtomicU64> {
    let map = if host { &HOST_OPS } else { &OPS };
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(op.to_string()).or_default().clone()
}

/// Counts one kernel execution on a counter from [`op_counter`].
pub fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The ops that ran at least once and how many times.
fn counts(map: &Counters) -> BTreeMap<String, u64> {
    let m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.iter()
        .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Counts a device-to-host copy.
pub fn d2h(bytes: u64) {
    D2H.fetch_add(1, Ordering::Relaxed);
    D2H_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Counts a host-to-device copy.
pub fn h2d(bytes: u64) {
    H2D.fetch_add(1, Ordering::Relaxed);
    H2D_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Charges `ns` of wall time inside a host-to-device copy of `bytes` to its size class.
pub fn h2d_wall(bytes: u64, ns: u64) {
    let k = if bytes >= H2D_LARGE { 2 } else { 0 };
    H2D_SPLIT[k].fetch_add(1, Ordering::Relaxed);
    H2D_SPLIT[k + 1].fetch_add(ns, Ordering::Relaxed);
}

/// Counts a copy between two tfwgpu devices.
pub fn d2d(bytes: u64) {
    D2D.fetch_add(1, Ordering::Relaxed);
    D2D_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Counts a copy between devices taken by a peer route (`crossdev`, `TFWGPU_PEER=1`).
pub fn d2d_routed() {
    D2D_ROUTED.fetch_add(1, Ordering::Relaxed);
}

/// Counts an ordered device sync that had to wait for the GPU (its previous sync's work was
/// not done yet: the host was a sync interval ahead).
pub fn sync_wait() {
    SYNC_WAITS.fetch_add(1, Ordering::Relaxed);
}

/// The counters as JSON.
pub fn json() -> String {
    let ops = counts(&OPS);
    let host = counts(&HOST_OPS);
    serde_json::json!({
        "gpu_ops": ops,
        "host_ops": host,
        "device_to_host": {"copies": D2H.load(Ordering::Relaxed), "bytes": D2H_BYTES.load(Ordering::Relaxed)},
        "host_to_device": {
            "copies": H2D.load(Ordering::Relaxed),
            "bytes": H2D_BYTES.load(Ordering::Relaxed),
            "small": {"copies": H2D_SPLIT[0].load(Ordering::Relaxed), "wall_us": H2D_SPLIT[1].load(Ordering::Relaxed) as f64 / 1e3},
            "large": {"copies": H2D_SPLIT[2].load(Ordering::Relaxed), "wall_us": H2D_SPLIT[3].load(Ordering::Relaxed) as f64 / 1e3},
        },
        "between_devices": {
            "copies": D2D.load(Ordering::Relaxed),
            "bytes": D2D_BYTES.load(Ordering::Relaxed),
            "routed": D2D_ROUTED.load(Ordering::Relaxed),
            "routes": crate::crossdev::routes_json(),
        },
        "stream_executor": se_json(),
        "sync": {
            "mode": match crate::se::sync_mode() {
                crate::se::SyncMode::Completed => "completed",
                crate::se::SyncMode::Ordered => "ordered",
            },
            "gpu_waits": SYNC_WAITS.load(Ordering::Relaxed),
        },
        "runtime": runtime_json(),
    })
    .to_string()
}

fn se_json() -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (i, name) in SE_NAMES.iter().enumerate() {
        m.insert(
            (*name).into(),
            serde_json::json!({
                "calls": SE_CALLS[i].load(Ordering::Relaxed),
                "wall_us": SE_NS[i].load(Ordering::Relaxed) as f64 / 1e3,
            }),
        );
    }
    serde_json::Value::Object(m)
}

/// The runtime's own counters, summed over the opened devices: command-buffer submits, compute
/// dispatches, and the reads back to the host it made (each one a wait for the GPU), whether
/// TensorFlow asked for them (memcpy_dtoh) or not.
fn runtime_json() -> serde_json::Value {
    let mut t = tfwgpu_runtime::ExecStats::default();
    for d in crate::runtime()
        .map(|rt| rt.devices.as_slice())
        .unwrap_or(&[])
    {
        let s = d.exec_stats();
        t.submits += s.submits;
        t.dispatches += s.dispatches;
        t.copies += s.copies;
        t.uploads += s.uploads;
        t.reads += s.reads;
        t.bind_groups += s.bind_groups;
    }
    serde_json::json!({
        "submits": t.submits,
        "dispatches": t.dispatches,
        "copies": t.copies,
        "uploads": t.uploads,
        "reads": t.reads,
        "bind_groups": t.bind_groups,
    })
}

extern "C" fn write_report() {
    if let Some(path) = std::env::var_os("TFWGPU_REPORT") {
        let _ = std::fs::write(path, json());
    }
}

extern "C" fn write_host_log() {
    if let Err(e) = tfwgpu_runtime::hostlog::dump() {
        eprintln!("tfwgpu: writing TFWGPU_HOST_LOG: {e}");
    }
}

/// Arranges for the report file to be written at exit when `TFWGPU_REPORT` is set, and the
/// host log when `TFWGPU_HOST_LOG` is.
pub fn install_exit_report() {
    if std::env::var_os("TFWGPU_REPORT").is_some() {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(write_report) };
    }
    if tfwgpu_runtime::hostlog::on() {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(write_host_log) };
    }
}

/// Adds a mark to the host log (`TFWGPU_HOST_LOG`; nothing when it is off). `text`: a
/// NUL-terminated string.
///
/// # Safety
/// `text` is null or a valid NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tfwgpu_host_log_mark(text: *const std::os::raw::c_char) {
    if text.is_null() || !tfwgpu_runtime::hostlog::on() {
        return;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
    tfwgpu_runtime::hostlog::mark(&s);
}

/// Drops the host log's spans kept so far (after a warm-up).
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_host_log_reset() {
    tfwgpu_runtime::hostlog::reset();
}

/// The counters as JSON (a NUL-terminated string, valid until the next call on this thread).
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_stats_json() -> *const std::os::raw::c_char {
    thread_local! {
        static LAST: std::cell::RefCell<std::ffi::CString> = std::cell::RefCell::new(std::ffi::CString::default());
    }
    LAST.with(|l| {
        *l.borrow_mut() = std::ffi::CString::new(json()).unwrap_or_default();
        l.borrow().as_ptr()
    })
}
