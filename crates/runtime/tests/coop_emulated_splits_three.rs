//! Split K forced to 3 (`TFWGPU_CONV_COOP_SPLITS=3`, at most one split per K tile) for the
//! filter gradient (the 64 x 64 tile of 4 subgroups and the lavapipe form of the 16-subgroup
//! tile) and the forward and input-gradient products, checked in the emulated form on any
//! adapter with float16 shaders against f64 references: three splits (the split sum's single
//! row with an odd split count), through the split sum's launch (`TFWGPU_CONV_COOP_LAST=0`).
//! A binary of its own: the settings are read once per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{
    COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS, COOP_64X64X64_4X4W1FSE4,
};

fn setup() {
    coop_cases::setup_emulated(&[
        ("TFWGPU_CONV_COOP_SPLITS", "3"),
        ("TFWGPU_CONV_COOP_LAST", "0"),
    ]);
}

#[test]
fn emulated_conv2d_backprop_filter_splits_three() {
    setup();
    coop_cases::conv2d_backprop_filter_split_sums(
        &[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X4W1FSE4],
        3,
    );
}

#[test]
fn emulated_conv2d_forward_backprop_input_splits_three() {
    setup();
    coop_cases::conv2d_split_k(&[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS]);
}
