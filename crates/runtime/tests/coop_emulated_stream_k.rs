//! Stream-K (`TFWGPU_CONV_COOP_STREAMK=1`): a wave of 7 workgroups
//! (`TFWGPU_CONV_COOP_WAVE=7`) walking the (tile, K tile) iterations of float16 Conv2D
//! forward and input-gradient products, partial tiles summed by each tile's last arrival,
//! checked in the emulated form on any adapter with float16 shaders against f64 references:
//! the 64 x 64 tile and the lavapipe form of the 16-subgroup tile. A binary of its own: the
//! settings are read once per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X4W1FSE4};

fn setup() {
    coop_cases::setup_emulated(&[
        ("TFWGPU_CONV_COOP_WAVE", "7"),
        ("TFWGPU_CONV_COOP_STREAMK", "1"),
    ]);
}

#[test]
fn emulated_conv2d_stream_k() {
    setup();
    coop_cases::conv2d_stream_k(&[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X4W1FSE4]);
}
