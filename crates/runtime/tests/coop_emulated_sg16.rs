//! The 16-subgroup tile with a scratch slot per subgroup and K tiles of 32 in one buffer
//! (`c128x128x32_4x4wg1f`, session 20) in its lavapipe form `c128x128x32_4x4wg1fe8` (the
//! scratch in two turns), emulated (`TFWGPU_COOP_EMULATE=1`, see coop_emulated.rs): MatMul over the shapes, layouts and load
//! widths of the cases (K of one, two and several tiles, partial tiles, batches), and the
//! three Conv2D forms. Also the K-32 tiles of at most ~24 KiB (session 20: 128 x 64, 64 x 128,
//! 64 x 64), which fit lavapipe as they are. Their persistent forms are in
//! coop_emulated_persist.rs.
mod common;
mod coop_cases;
use tfwgpu_runtime::kernels::matmul::coop::{
    COOP_64X64X32_2X2W1F, COOP_64X128X32_2X4WG1F, COOP_128X64X32_4X2WG1F,
    COOP_128X128X32_4X4WG1FE8, CoopTile,
};

fn setup() {
    coop_cases::setup_emulated(&[]);
}

const TILES: &[CoopTile] = &[
    COOP_128X128X32_4X4WG1FE8,
    COOP_64X64X32_2X2W1F,
    COOP_128X64X32_4X2WG1F,
    COOP_64X128X32_2X4WG1F,
];

#[test]
fn emulated_sg16_matmul() {
    setup();
    coop_cases::matmul_shapes_layouts_tiles(TILES);
    coop_cases::several_tiles(TILES);
}

#[test]
fn emulated_sg16_conv2d() {
    setup();
    coop_cases::conv2d_forward(TILES);
    coop_cases::conv2d_backprop_input(TILES);
    coop_cases::conv2d_backprop_filter(TILES);
    // (The strided input gradient's phases: the chooser's tiles for strided 1x1 filters.)
    coop_cases::conv2d_backprop_input_phases(&[COOP_64X64X32_2X2W1F, COOP_64X128X32_2X4WG1F]);
}
