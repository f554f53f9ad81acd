//! Loads Mesa's Vulkan drivers with `RTLD_DEEPBIND` before the Vulkan loader does.
//!
//! TensorFlow's `libtensorflow_framework.so.2` exports LLVM's C++ symbols and is loaded into the
//! global symbol scope. Mesa's drivers (lavapipe, radv, anv) link the system's libLLVM, and
//! without deep binding libLLVM's calls into itself resolve to TensorFlow's copies of those
//! functions, a different LLVM version: lavapipe then crashes compiling its first shader. With
//! `RTLD_DEEPBIND` the driver and its libLLVM resolve their own symbols first. When the loader
//! opens the driver later it gets this already-loaded, correctly bound copy.

use std::ffi::CString;
use std::path::{Path, PathBuf};

fn manifest_dirs() -> Vec<PathBuf> {
    let mut files = vec![];
    for var in ["VK_DRIVER_FILES", "VK_ICD_FILENAMES"] {
        if let Ok(v) = std::env::var(var) {
            files.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
        }
    }
    if !files.is_empty() {
        return files;
    }
    for dir in [
        "/usr/share/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
        "/etc/vulkan/icd.d",
    ] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            files.extend(rd.flatten().map(|e| e.path()));
        }
    }
    files
}

/// The `library_path` of an ICD manifest (a small JSON file).
fn library_path(manifest: &Path) -> Option<String> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let key = text.find("\"library_path\"")?;
    let rest = &text[key + "\"library_path\"".len()..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_string())
}

/// Preloads every Mesa Vulkan driver named by the ICD manifests.
pub fn preload_mesa_drivers() {
    for manifest in manifest_dirs() {
        let Some(lib) = library_path(&manifest) else {
            continue;
        };
        let file = Path::new(&lib)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("");
        // Mesa names its Vulkan drivers libvulkan_<driver>.so.
        if !file.starts_with("libvulkan_") {
            continue;
        }
        let path = if Path::new(&lib).is_absolute() {
            PathBuf::from(&lib)
        } else {
            manifest
                .parent()
                .map(|d| d.join(&lib))
                .unwrap_or_else(|| PathBuf::from(&lib))
        };
        let target = if path.exists() {
            path.to_string_lossy().into_owned()
        } else {
            lib.clone()
        };
        let Ok(c) = CString::new(target.clone()) else {
            continue;
        };
        // SAFETY: dlopen with a valid path; the handle is kept for the process lifetime.
        let h = unsafe {
            libc::dlopen(
                c.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
            )
        };
        if h.is_null() {
            tracing::debug!("could not preload {target}");
        } else {
            tracing::debug!("preloaded {target} with RTLD_DEEPBIND");
        }
    }
}
