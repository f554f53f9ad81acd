//! tfwgpu-plugin: the TensorFlow PluggableDevice that shows the runtime's adapters as
//! `/GPU:N`. `SE_InitPlugin` (stream executor: memory, copies, streams, events) is in [`se`];
//! `TF_InitKernel` and the KernelWrapper are in [`kernels`]. The plugin holds no GPU logic:
//! it translates between TensorFlow's C API and `tfwgpu-runtime`.

pub mod kernels;
pub mod nodedef;
#[cfg(target_os = "linux")]
mod preload;
pub mod se;
pub mod status;

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
        #[cfg(target_os = "linux")]
        preload::preload_mesa_drivers();
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
