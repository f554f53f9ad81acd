//! tfwgpu-plugin: the TensorFlow PluggableDevice that shows the runtime's adapters as
//! `/GPU:N`. `SE_InitPlugin` (stream executor: memory, copies, streams, events) is in [`se`];
//! `TF_InitKernel` and the KernelWrapper are in [`kernels`]. The plugin holds no GPU logic:
//! it translates between TensorFlow's C API and `tfwgpu-runtime`.

mod crossdev;
pub mod graph;
pub mod kernels;
pub mod nodedef;
#[cfg(target_os = "linux")]
mod preload;
pub mod se;
pub mod stats;
pub mod status;
pub mod trace;
pub mod variables;
pub mod version;

use std::sync::OnceLock;

use tfwgpu_runtime::{Device, Runtime};

/// The plugin's runtime, opened once; `None` when no adapter could be opened (TensorFlow then
/// runs on its CPU, after one warning).
pub fn runtime() -> Option<&'static Runtime> {
    static RT: OnceLock<Option<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("TFWGPU_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .try_init();
        if let Err(msg) = version::check() {
            eprintln!("tfwgpu: {msg}");
            return None;
        }
        #[cfg(target_os = "linux")]
        preload::preload_mesa_drivers();
        stats::install_exit_report();
        match Runtime::new() {
            Ok(rt) => Some(rt),
            Err(e) => {
                eprintln!("tfwgpu: no GPU device available, TensorFlow will run on its CPU: {e}");
                None
            }
        }
    })
    .as_ref()
}

/// The device of a TensorFlow ordinal.
pub fn device(ordinal: i32) -> Option<&'static Device> {
    runtime()?.devices.get(usize::try_from(ordinal).ok()?)
}

/// Every adapter wgpu finds, as JSON (for the `tensorflow_wgpu` Python module). The string is
/// owned by the plugin and lives until the process ends.
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_adapters_json() -> *const std::os::raw::c_char {
    static JSON: OnceLock<std::ffi::CString> = OnceLock::new();
    JSON.get_or_init(|| {
        let opened: Vec<usize> = runtime()
            .map(|rt| rt.devices.iter().map(|d| d.description().index).collect())
            .unwrap_or_default();
        let list: Vec<_> = tfwgpu_runtime::list_adapters()
            .iter()
            .map(|a| {
                serde_json::json!({
                    "index": a.index, "name": a.name, "backend": a.backend,
                    "device_type": a.device_type, "driver": a.driver, "driver_info": a.driver_info,
                    "features": a.useful_features(),
                    "tensorflow_device": opened.iter().position(|&i| i == a.index)
                        .map(|n| format!("/GPU:{n}")),
                })
            })
            .collect();
        std::ffi::CString::new(serde_json::Value::Array(list).to_string()).unwrap_or_default()
    })
    .as_ptr()
}

/// The TensorFlow version the plugin was built for.
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_tf_version() -> *const std::os::raw::c_char {
    static V: OnceLock<std::ffi::CString> = OnceLock::new();
    V.get_or_init(|| std::ffi::CString::new(tfwgpu_sys::TF_VERSION).unwrap_or_default())
        .as_ptr()
}

/// Bench hook: sets the idle rule of every tfwgpu device from now on (`TFWGPU_BATCH_IDLE_US`
/// and `TFWGPU_BATCH_IDLE_RULE` at start): `us` microseconds (0: off), counted from the batch's
/// first command (`quiet` 0) or its latest (`quiet` 1). For an A/B of the rules within one
/// process (bench/idle_ab.py). Returns the number of devices changed, -1 when `us` < 0.
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_set_batch_idle(us: i64, quiet: i32) -> i32 {
    let Ok(us) = u64::try_from(us) else {
        return -1;
    };
    let rule = if quiet != 0 {
        tfwgpu_runtime::IdleRule::Quiet
    } else {
        tfwgpu_runtime::IdleRule::Age
    };
    let age = (us > 0).then(|| std::time::Duration::from_micros(us));
    let Some(rt) = runtime() else { return 0 };
    for d in &rt.devices {
        d.exec().set_idle(age, rule);
    }
    rt.devices.len() as i32
}

/// Test hook: destroys device `ordinal`'s wgpu device, as a driver reset would lose it, so that
/// tests can check that the loss surfaces as a TensorFlow error (python/tests/test_host_syncs.py,
/// in a child process). Does nothing and returns -1 unless `TFWGPU_TEST_HOOKS=1`.
#[unsafe(no_mangle)]
pub extern "C" fn tfwgpu_test_lose_device(ordinal: i32) -> i32 {
    if std::env::var("TFWGPU_TEST_HOOKS").map_or(true, |v| v.trim() != "1") {
        return -1;
    }
    match device(ordinal) {
        Some(d) => {
            d.exec().device().destroy();
            0
        }
        None => -1,
    }
}
