//! The TensorFlow version check: the plugin is built against the C API of one pinned version
//! (`tfwgpu_sys::TF_VERSION`); loaded into another, it registers nothing and says so.

use std::ffi::CStr;

/// The version of the TensorFlow this process runs, when it can be found.
pub fn running_tf_version() -> Option<String> {
    // SAFETY: dlsym on the global scope; TF_Version returns a static NUL-terminated string.
    unsafe {
        let sym = libc::dlsym(libc::RTLD_DEFAULT, c"TF_Version".as_ptr());
        if !sym.is_null() {
            let f: extern "C" fn() -> *const std::os::raw::c_char = std::mem::transmute(sym);
            let v = f();
            if !v.is_null() {
                return Some(CStr::from_ptr(v).to_string_lossy().into_owned());
            }
        }
    }
    None
}

/// `Err(message)` when the running TensorFlow is not the pinned one.
pub fn check() -> Result<(), String> {
    let pinned = tfwgpu_sys::TF_VERSION;
    match running_tf_version() {
        Some(v) if v == pinned => Ok(()),
        Some(v) => Err(format!(
            "tfwgpu was built for TensorFlow {pinned} but this is TensorFlow {v}: its GPU device \
             is disabled and TensorFlow runs on the CPU. Install tensorflow-cpu=={pinned}, or \
             rebuild tensorflow-wgpu against this TensorFlow"
        )),
        // Not found (an embedding without the C API's version symbol): trust the loader.
        None => Ok(()),
    }
}
