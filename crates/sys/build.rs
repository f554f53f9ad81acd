//! Links the plugin against TensorFlow's framework library. Its folder comes from
//! `TFWGPU_TF_DIR`, else from the `tensorflow` package of `PYTHON` (else the workspace's
//! `.venv`, else `python3`), found without importing TensorFlow.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TFWGPU_TF_DIR");
    println!("cargo:rerun-if-env-changed=PYTHON");
    println!("cargo:rerun-if-changed=TF_VERSION");
    let dir = std::env::var("TFWGPU_TF_DIR")
        .ok()
        .map(PathBuf::from)
        .or_else(|| {
            let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
            let py = std::env::var("PYTHON").ok().unwrap_or_else(|| {
                if venv.exists() {
                    venv.to_string_lossy().into_owned()
                } else {
                    "python3".into()
                }
            });
            let out = Command::new(py)
                .args([
                    "-c",
                    "import importlib.util as u; s = u.find_spec('tensorflow'); \
                 print(s.submodule_search_locations[0] if s else '')",
                ])
                .output()
                .ok()?;
            let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (!s.is_empty()).then(|| PathBuf::from(s))
        });
    let Some(dir) = dir.filter(|d| d.join("libtensorflow_framework.so.2").exists()) else {
        panic!(
            "tfwgpu-sys: TensorFlow {} not found. Install it (pip install tensorflow-cpu=={}) in \
             the Python that PYTHON names, or set TFWGPU_TF_DIR to its package folder",
            include_str!("TF_VERSION").trim(),
            include_str!("TF_VERSION").trim()
        );
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib:+verbatim=libtensorflow_framework.so.2");
    println!("cargo:tf_dir={}", dir.display());
}
