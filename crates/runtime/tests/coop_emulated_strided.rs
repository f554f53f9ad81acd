//! v5b's strided input gradients (the windows of dy at dx's positions, the taps between
//! strided outputs multiplied as zeros), kept behind `TFWGPU_CONV_COOP_PHASES=0` for
//! comparisons with the per-phase products (v6, the default; `coop_emulated.rs`), checked in
//! their emulated form on any adapter with float16 shaders. A binary of its own: both
//! settings are read once per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS};

fn setup() {
    coop_cases::setup_emulated(&[("TFWGPU_CONV_COOP_PHASES", "0")]);
}

#[test]
fn emulated_conv2d_backprop_input_strided_windows() {
    setup();
    let tiles = [COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS];
    coop_cases::conv2d_backprop_input_strided(&tiles);
    coop_cases::conv2d_backprop_input_phases(&tiles);
}
