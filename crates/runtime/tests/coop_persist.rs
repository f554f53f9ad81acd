//! The persistent cooperative tiles (`CoopTile::persist`) on a device with cooperative
//! matrices (the H200; skipped elsewhere, where tests/coop_emulated_persist.rs runs their
//! lavapipe forms emulated), with `TFWGPU_COOP_PERSIST_WAVE=2` so that every workgroup walks
//! several M tiles: the walk, the next tile's loads stored after the epilogue, the cleared
//! accumulators and the `num_workgroups` builtin on the hardware's own cooperative matrices.
//! Built for the GPU host as a test binary (bench/h200/coop1x1-sweep.sh runs it first).
mod common;
mod coop_cases;
use tfwgpu_runtime::kernels::matmul::coop::{
    COOP_64X128X32_2X4WG1FP, COOP_64X128X64_2X4WG1FP, COOP_128X64X32_4X2WG1FP,
    COOP_128X128X32_4X4WG1FP, COOP_128X128X64_2X4WG1FP, CoopTile,
};

const TILES: &[CoopTile] = &[
    COOP_128X128X64_2X4WG1FP,
    COOP_64X128X64_2X4WG1FP,
    COOP_128X128X32_4X4WG1FP,
    COOP_128X64X32_4X2WG1FP,
    COOP_64X128X32_2X4WG1FP,
];

/// Sets the wave before any kernel of this binary runs; false (skipped) without cooperative
/// matrices.
fn setup() -> bool {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: every test of the binary calls `setup` first and `call_once` blocks the
        // others until the variable is set.
        unsafe { std::env::set_var("TFWGPU_COOP_PERSIST_WAVE", "2") };
    });
    !coop_cases::skip_without_coop()
}

#[test]
fn persistent_tiles_walk_on_the_device() {
    if !setup() {
        return;
    }
    coop_cases::several_tiles(TILES);
    coop_cases::matmul_shapes_layouts_tiles(TILES);
}

#[test]
fn persistent_tiles_conv2d_on_the_device() {
    if !setup() {
        return;
    }
    coop_cases::conv2d_forward(TILES);
    coop_cases::conv2d_backprop_input(TILES);
}
