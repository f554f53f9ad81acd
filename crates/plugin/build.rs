//! The plugin is installed in site-packages/tensorflow-plugins/, beside site-packages/tensorflow/
//! where TensorFlow's framework library lives: find it there at load time. The crate's own test
//! test binaries find it where tfwgpu-sys linked it from (a second, build-time rpath).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../tensorflow");
    if let Ok(dir) = std::env::var("DEP_TENSORFLOW_FRAMEWORK_TF_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
