//! The plugin is installed in site-packages/tensorflow-plugins/, beside site-packages/tensorflow/
//! where TensorFlow's framework library lives: find it there at load time.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../tensorflow");
}
