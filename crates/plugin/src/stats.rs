//! What ran where, as the plugin sees it: kernel executions per op on tfwgpu devices, and the
//! copies between host and device (a device-to-host copy is what a CPU fallback costs).
//! Read by `tensorflow_wgpu.report` through `tfwgpu_stats_json`, and written to the file named
//! by `TFWGPU_REPORT` when the process exits.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

static OPS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
static HOST_OPS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
static D2H: AtomicU64 = AtomicU64::new(0);
static D2H_BYTES: AtomicU64 = AtomicU64::new(0);
static H2D: AtomicU64 = AtomicU64::new(0);
static H2D_BYTES: AtomicU64 = AtomicU64::new(0);
static D2D: AtomicU64 = AtomicU64::new(0);
static D2D_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts one kernel execution of `op` on a tfwgpu device.
pub fn op(op: &str) {
    count(&OPS, op)
}

/// Counts one execution of a host-memory kernel (int32 shape arithmetic) of `op`.
pub fn host_op(op: &str) {
    count(&HOST_OPS, op)
}

fn count(map: &Mutex<BTreeMap<String, u64>>, op: &str) {
    if let Ok(mut m) = map.lock() {
        match m.get_mut(op) {
            Some(n) => *n += 1,
            None => {
                m.insert(op.to_string(), 1);
            }
        }
    }
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

/// Counts a copy between two tfwgpu devices.
pub fn d2d(bytes: u64) {
    D2D.fetch_add(1, Ordering::Relaxed);
    D2D_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// The counters as JSON.
pub fn json() -> String {
    let ops = OPS.lock().map(|m| m.clone()).unwrap_or_default();
    let host = HOST_OPS.lock().map(|m| m.clone()).unwrap_or_default();
    serde_json::json!({
        "gpu_ops": ops,
        "host_ops": host,
        "device_to_host": {"copies": D2H.load(Ordering::Relaxed), "bytes": D2H_BYTES.load(Ordering::Relaxed)},
        "host_to_device": {"copies": H2D.load(Ordering::Relaxed), "bytes": H2D_BYTES.load(Ordering::Relaxed)},
        "between_devices": {"copies": D2D.load(Ordering::Relaxed), "bytes": D2D_BYTES.load(Ordering::Relaxed)},
    })
    .to_string()
}

extern "C" fn write_report() {
    if let Some(path) = std::env::var_os("TFWGPU_REPORT") {
        let _ = std::fs::write(path, json());
    }
}

/// Arranges for the report file to be written at exit when `TFWGPU_REPORT` is set.
pub fn install_exit_report() {
    if std::env::var_os("TFWGPU_REPORT").is_some() {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(write_report) };
    }
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
