//! Strided input gradients by output phase (v6) with the phases that no tap reaches written
//! by the phase kernel itself with K = 0 (`TFWGPU_CONV_COOP_PHASE_ZEROS=kernel`) instead of
//! the default (their zeros written beside the one phase with taps, or one clear of dx),
//! checked in the emulated form on any adapter with float16 shaders. A binary of its own:
//! the setting is read once per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::COOP_64X64X64_4X2WG1FS;

fn setup() {
    coop_cases::setup_emulated(&[("TFWGPU_CONV_COOP_PHASE_ZEROS", "kernel")]);
}

#[test]
fn emulated_conv2d_backprop_input_phase_zeros_by_kernel() {
    setup();
    coop_cases::conv2d_backprop_input_phases(&[COOP_64X64X64_4X2WG1FS]);
}
