//! The cooperative-matrix kernels' generator checked on any adapter with float16 shaders
//! (lavapipe in CI): `TFWGPU_COOP_EMULATE=1` makes the MatMul and Conv2D paths run the
//! emulated form of the cooperative shaders (`CoopSpec::emulate`: the same staging, K loop,
//! barriers, launch and epilogue; each 16 x 16 x 16 product as plain loops over the
//! workgroup arrays with the layouts and strides of the cooperative loads), so the cases of
//! `matmul_coop.rs` (`coop_cases/mod.rs`) check the load widths, one- and two-tile-ahead
//! loads, one or two buffers, partial tiles, odd K tile counts, batches, layouts and the
//! Conv2D forms without a tensor core. Tiles: 64 x 64 ones (the 128 x 128 ones need more
//! than lavapipe's 32 KiB of workgroup memory; `c64x64x64_2x2w1f` stands in for the large
//! default `c128x128x64_2x4wg1f`, the small default `c64x64x64_2x2w1fs` runs as it is); the
//! automatic choice falls back to the float32 kernels where its tile does not fit.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{
    COOP_32X128X64_2X4WG1F, COOP_64X64_2X2V, COOP_64X64_2X2VF, COOP_64X64_2X2W2,
    COOP_64X64X64_2X2V1, COOP_64X64X64_2X2W1F, COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS,
    COOP_64X64X64_4X4W1FSE4, COOP_64X64X80_2X2W1FSE2, CoopTile,
};

/// Sets `TFWGPU_COOP_EMULATE=1` before any test of this binary records a kernel.
fn setup() {
    coop_cases::setup_emulated(&[]);
}

/// The default where M or N is at most 64 (`2x2v`), v3's default for few tiles (`2x2w2`),
/// and the 64 x 64 form of v3's large default (K tiles of 64 in one buffer).
const TILES: &[CoopTile] = &[COOP_64X64_2X2V, COOP_64X64_2X2W2, COOP_64X64X64_2X2V1];

/// The branch-free K loops of v4 in their lavapipe-sized forms: 16-byte loads with K 64 in
/// one buffer, the staging unconditional (`c128x128x64_2x4wg1f`, the large default) and the
/// loads through `select` too (`c64x64x64_2x2w1fs`, the small default itself), with 16
/// subgroups and the epilogue in turns (`c128x128x64_4x4wg1fse8`), with K tiles of 80 (a
/// partial K tile for most K; `c128x128x80_2x4wg1fse4`), the unconditional staging of
/// two buffers (`free` 1), and the 64 x 128 tile's form (more columns than rows per
/// workgroup, `c64x128x64_2x4wg1f`).
const FREE_TILES: &[CoopTile] = &[
    COOP_32X128X64_2X4WG1F,
    COOP_64X64X64_2X2W1F,
    COOP_64X64X64_2X2W1FS,
    COOP_64X64X64_4X4W1FSE4,
    COOP_64X64X80_2X2W1FSE2,
    COOP_64X64_2X2VF,
];

#[test]
fn emulated_branch_free_matmul() {
    setup();
    coop_cases::matmul_shapes_layouts_tiles(FREE_TILES);
}

#[test]
fn emulated_branch_free_conv2d() {
    setup();
    coop_cases::conv2d_forward(FREE_TILES);
    coop_cases::conv2d_backprop_input(FREE_TILES);
}

#[test]
fn emulated_matmul_shapes_layouts_tiles() {
    setup();
    coop_cases::matmul_shapes_layouts_tiles(TILES);
}

#[test]
fn emulated_matmul_auto_and_batches() {
    setup();
    coop_cases::f16_matmul_any();
    coop_cases::batch_matmul_broadcast();
}

#[test]
fn emulated_large_k() {
    setup();
    coop_cases::large_k();
}

#[test]
fn emulated_conv2d_forward() {
    setup();
    coop_cases::f16_conv2d_any();
    coop_cases::conv2d_forward(TILES);
}

#[test]
fn emulated_conv2d_backprop_input() {
    setup();
    coop_cases::f16_conv2d_backprop_input_any();
    coop_cases::conv2d_backprop_input(TILES);
}

/// The Conv2D v5 forms: the select window loads (`fs` tiles: the small default and the
/// lavapipe form of the 8-subgroup 128 x 64 tiles), 1x1 convolutions as plain products,
/// split K (forward, backprop input), and the filter gradient (windows of x transposed, split
/// K, float32 partial sums added up).
const CONV_V5_TILES: &[CoopTile] = &[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS];

#[test]
fn emulated_conv2d_v5_forward_and_backprop_input() {
    setup();
    coop_cases::conv2d_forward(CONV_V5_TILES);
    coop_cases::conv2d_backprop_input(CONV_V5_TILES);
}

#[test]
fn emulated_conv2d_split_k() {
    setup();
    coop_cases::conv2d_split_k(CONV_V5_TILES);
}

#[test]
fn emulated_conv2d_backprop_input_strided() {
    setup();
    coop_cases::conv2d_backprop_input_strided(CONV_V5_TILES);
}

/// Strided input gradients by output phase (v6, the default): checked against the f64
/// reference, and (where the device times dispatches) that the phase kernels ran.
#[test]
fn emulated_conv2d_backprop_input_phases() {
    setup();
    coop_cases::conv2d_backprop_input_phases(CONV_V5_TILES);
    // (16 subgroups with the epilogue in turns: the lavapipe form of v6's
    // `c128x128x64_4x4wg1fse8`.)
    coop_cases::conv2d_backprop_input_phases(&[COOP_64X64X64_4X4W1FSE4]);
}

#[test]
fn emulated_conv2d_backprop_filter_auto() {
    setup();
    coop_cases::f16_conv2d_backprop_filter_any();
}

#[test]
fn emulated_conv2d_backprop_filter_tiles() {
    setup();
    coop_cases::conv2d_backprop_filter(&[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X2WG1FS]);
}

#[test]
fn emulated_conv2d_backprop_filter_older_tiles() {
    setup();
    coop_cases::conv2d_backprop_filter(&[COOP_64X64_2X2V, COOP_64X64X64_2X2W1F]);
}
