//! tfwgpu-runtime: a portable GPU device runtime for TensorFlow ops, on wgpu.
//!
//! The six parts of the design (see ARCHITECTURE.md): [`Device`] (one adapter, device and
//! queue), [`Allocator`] (sub-allocated device memory with offsettable 64-bit addresses),
//! [`ExecutionContext`] (batching, ordering, synchronization), [`KernelManager`] (the pipeline
//! cache), [`Kernel`] (one op implementation) and the kernel library in [`kernels`]. The
//! KernelWrapper lives in the TensorFlow plugin crate.
//!
//! ```no_run
//! use tfwgpu_runtime::{Runtime, Attrs, Arg};
//! let rt = Runtime::new()?;
//! let dev = rt.device();
//! let a = dev.upload(&[1.0f32, 2.0, 3.0], &[3])?;
//! let b = dev.upload(&[10.0f32], &[1])?;
//! let out = dev.run("AddV2", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])?;
//! assert_eq!(out[0].download::<f32>()?, vec![11.0, 12.0, 13.0]);
//! # Ok::<(), tfwgpu_runtime::Error>(())
//! ```

pub mod adapter;
pub mod allocator;
pub mod device;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod host_ops;
pub mod hostlog;
pub mod kernel;
pub mod kernel_manager;
pub mod kernels;
mod mirror;
pub mod peer;
pub mod tune;

pub use adapter::{AdapterDescription, Selection, list_adapters};
pub use allocator::{Allocator, AllocatorStats, device_of_address};
pub use device::{Arg, Device, ReadInFlight, Runtime, RuntimeOptions, Tensor};
pub use dtype::{DType, Element, HostTensor, num_elements};
pub use error::{Error, Result};
pub use exec::{
    DispatchTiming, ExecConfig, ExecStats, ExecutionContext, IdleRule, PASS_LABEL, PendingRead,
    TimingSummary,
};
pub use half::f16;
pub use host_ops::{HostKernel, HostOpDef};
pub use kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, Registry, TensorDesc,
    TypeConstraint,
};
pub use kernel_manager::{CacheStats, KernelManager, PipelineKey};

/// The value of the environment variable `name` without surrounding blanks, if set: what the
/// kernels' multi-word `TFWGPU_*` switches match on (where one is read once per process, its
/// caller caches the answer).
pub(crate) fn env_word(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string())
}

/// Whether the environment variable `name` is set to `value` (surrounding blanks ignored): the
/// test behind the kernels' on/off `TFWGPU_*` switches.
pub(crate) fn env_is(name: &str, value: &str) -> bool {
    env_word(name).is_some_and(|v| v == value)
}
