//! The late-staging cooperative tiles (`CoopTile::depth` 0: the next K tile loaded after the
//! current tile's products and stored at once) in their lavapipe form, emulated
//! (`TFWGPU_COOP_EMULATE=1`, see coop_emulated.rs): MatMul over the shapes, layouts and load
//! widths of the cases (K of one, two and several tiles, partial tiles, batches), and the
//! three Conv2D forms (forward, input gradient, filter gradient, whose window rows advance by
//! one K tile per load).
mod common;
mod coop_cases;
use tfwgpu_runtime::kernels::matmul::coop::{COOP_64X64X64_2X2W1L, CoopTile};

fn setup() {
    coop_cases::setup_emulated(&[]);
}

const TILES: &[CoopTile] = &[COOP_64X64X64_2X2W1L];

#[test]
fn emulated_late_matmul() {
    setup();
    coop_cases::matmul_shapes_layouts_tiles(TILES);
    coop_cases::several_tiles(TILES);
}

#[test]
fn emulated_late_conv2d() {
    setup();
    coop_cases::conv2d_forward(TILES);
    coop_cases::conv2d_backprop_input(TILES);
    coop_cases::conv2d_backprop_filter(TILES);
}
