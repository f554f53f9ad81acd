//! The persistent cooperative tiles (`CoopTile::persist`: a workgroup walks M tiles, the last
//! K tile's loads fetching the next M tile's first one) in their lavapipe forms, emulated
//! (`TFWGPU_COOP_EMULATE=1`, see coop_emulated.rs), with `TFWGPU_COOP_PERSIST_WAVE=2` so that
//! every workgroup walks several M tiles (partial last tiles, K of one and of several tiles,
//! batches, every layout and load width of the MatMul cases; the plain 1x1 Conv2D products).
//! tests/coop_persist.rs runs the H200 forms the same way on a device with cooperative
//! matrices. The
//! Conv2D forms that are not plain products run these tiles as their plain forms.
mod common;
mod coop_cases;
use tfwgpu_runtime::kernels::matmul::coop::{
    COOP_32X128X64_2X4WG1FP, COOP_64X64X32_2X2W1FP, COOP_64X64X64_2X2W1FP, COOP_64X128X32_2X4WG1FP,
    COOP_128X64X32_4X2WG1FP, COOP_128X128X32_4X4WG1FPE8, CoopTile,
};

fn setup() {
    coop_cases::setup_emulated(&[("TFWGPU_COOP_PERSIST_WAVE", "2")]);
}

const TILES: &[CoopTile] = &[
    COOP_64X64X64_2X2W1FP,
    COOP_32X128X64_2X4WG1FP,
    COOP_128X128X32_4X4WG1FPE8,
    COOP_64X64X32_2X2W1FP,
    COOP_128X64X32_4X2WG1FP,
    COOP_64X128X32_2X4WG1FP,
];

#[test]
fn emulated_persistent_matmul() {
    setup();
    coop_cases::matmul_shapes_layouts_tiles(TILES);
    coop_cases::several_tiles(TILES);
}

#[test]
fn emulated_persistent_conv2d() {
    setup();
    coop_cases::conv2d_forward(TILES);
    coop_cases::conv2d_backprop_input(TILES);
}
