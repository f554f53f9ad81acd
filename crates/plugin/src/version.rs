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
    compare(tfwgpu_sys::TF_VERSION, running_tf_version().as_deref())
}

fn compare(pinned: &str, running: Option<&str>) -> Result<(), String> {
    match running {
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

#[cfg(test)]
mod tests {
    use super::compare;

    #[test]
    fn another_version_is_refused_with_a_message_saying_what_to_do() {
        assert!(compare("2.21.0", Some("2.21.0")).is_ok());
        assert!(compare("2.21.0", None).is_ok());
        let e = compare("2.21.0", Some("2.20.1")).unwrap_err();
        assert!(
            e.contains("2.20.1") && e.contains("tensorflow-cpu==2.21.0"),
            "{e}"
        );
    }
}
