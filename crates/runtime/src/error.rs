//! Errors are values: every failure the runtime can report, with a message a user can act on.

use thiserror::Error;

/// The runtime's error type.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// No adapter could be opened (or none matched the selection variables).
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    /// An argument (shape, dtype, attribute, address) is not acceptable to an op.
    #[error("{0}")]
    InvalidArgument(String),
    /// The op or dtype combination has no kernel here.
    #[error("{0}")]
    Unimplemented(String),
    /// The device could not provide the memory asked for.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// The device was lost (driver reset, removal); nothing more can run on it.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// The GPU API reported an error (validation, internal).
    #[error("GPU error: {0}")]
    Gpu(String),
}

/// Result alias used throughout the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds an `Error::InvalidArgument` from format arguments.
#[macro_export]
macro_rules! invalid_arg {
    ($($arg:tt)*) => { $crate::Error::InvalidArgument(format!($($arg)*)) };
}

/// Returns early with an `Error::InvalidArgument`.
#[macro_export]
macro_rules! bail_invalid {
    ($($arg:tt)*) => { return Err($crate::invalid_arg!($($arg)*)) };
}
