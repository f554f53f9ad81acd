//! TF_Status helpers and the panic guard: no error or panic crosses the C boundary unreported.

use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

use tfwgpu_runtime::Error;
use tfwgpu_sys as sys;

/// TensorFlow's status code for a runtime error.
pub fn code_of(e: &Error) -> sys::TF_Code {
    match e {
        Error::InvalidArgument(_) => sys::TSL_Code_TSL_INVALID_ARGUMENT,
        Error::Unimplemented(_) => sys::TSL_Code_TSL_UNIMPLEMENTED,
        Error::OutOfMemory(_) => sys::TSL_Code_TSL_RESOURCE_EXHAUSTED,
        Error::NoAdapter(_) => sys::TSL_Code_TSL_FAILED_PRECONDITION,
        Error::DeviceLost(_) => sys::TSL_Code_TSL_UNAVAILABLE,
        Error::Gpu(_) => sys::TSL_Code_TSL_INTERNAL,
    }
}

/// Writes `code` and `msg` into `status` (when non-null).
pub(crate) fn set(status: *mut sys::TF_Status, code: sys::TF_Code, msg: &str) {
    if status.is_null() {
        return;
    }
    let msg = CString::new(msg.replace('\0', " ")).expect("no interior NUL");
    // SAFETY: TensorFlow passes a valid status; TF_SetStatus copies the message.
    unsafe { sys::TF_SetStatus(status, code, msg.as_ptr()) };
}

/// Writes an error into `status`.
pub(crate) fn set_error(status: *mut sys::TF_Status, e: &Error) {
    set(status, code_of(e), &e.to_string());
}

/// Marks `status` OK.
pub(crate) fn set_ok(status: *mut sys::TF_Status) {
    set(status, sys::TSL_Code_TSL_OK, "");
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

/// Runs `f`; a returned error or a panic is written into `status` and `fallback` is returned.
pub(crate) fn guard<R>(
    status: *mut sys::TF_Status,
    fallback: R,
    f: impl FnOnce() -> Result<R, Error>,
) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => {
            set_ok(status);
            r
        }
        Ok(Err(e)) => {
            set_error(status, &e);
            fallback
        }
        Err(p) => {
            let msg = format!(
                "internal error in tfwgpu (please report): {}",
                panic_message(p)
            );
            tracing::error!("{msg}");
            set(status, sys::TSL_Code_TSL_INTERNAL, &msg);
            fallback
        }
    }
}

/// Runs `f` where there is no status to report into; a panic is logged and `fallback` returned.
pub fn quiet<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            tracing::error!(
                "internal error in tfwgpu (please report): {}",
                panic_message(p)
            );
            fallback
        }
    }
}

/// A status owned by the plugin, for calls into TensorFlow that report through one.
pub struct Status(pub *mut sys::TF_Status);

impl Status {
    pub fn new() -> Self {
        // SAFETY: plain constructor.
        Status(unsafe { sys::TF_NewStatus() })
    }

    /// The status as a runtime error, naming `what` failed.
    pub fn check(&self, what: &str) -> Result<(), Error> {
        // SAFETY: self.0 is a live status.
        let code = unsafe { sys::TF_GetCode(self.0) };
        if code == sys::TSL_Code_TSL_OK {
            return Ok(());
        }
        // SAFETY: TF_Message returns a NUL-terminated string owned by the status.
        let msg = unsafe { std::ffi::CStr::from_ptr(sys::TF_Message(self.0)) }.to_string_lossy();
        Err(match code {
            sys::TSL_Code_TSL_RESOURCE_EXHAUSTED => Error::OutOfMemory(format!("{what}: {msg}")),
            sys::TSL_Code_TSL_UNIMPLEMENTED => Error::Unimplemented(format!("{what}: {msg}")),
            _ => Error::InvalidArgument(format!("{what}: {msg}")),
        })
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: created by TF_NewStatus.
        unsafe { sys::TF_DeleteStatus(self.0) };
    }
}
