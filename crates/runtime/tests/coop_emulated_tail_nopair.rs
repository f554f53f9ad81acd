//! v7's head/tail split plans (the tile rows of the full waves unsplit, the rest with K
//! split, summed into those rows) forced on small products (`TFWGPU_CONV_COOP_WAVE=3`,
//! `TFWGPU_CONV_COOP_TAIL=force`), checked in the emulated form on any adapter with float16
//! shaders against f64 references: the 64 x 64 tile and the lavapipe form of the
//! 16-subgroup tile; the splits through the split sum's launch (`TFWGPU_CONV_COOP_LAST=0`),
//! not in the products' epilogues. A binary of its own: the settings are read once per process.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::{COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X4W1FSE4};

fn setup() {
    coop_cases::setup_emulated(&[
        ("TFWGPU_CONV_COOP_WAVE", "3"),
        ("TFWGPU_CONV_COOP_TAIL", "force"),
        ("TFWGPU_CONV_COOP_LAST", "0"),
    ]);
}

#[test]
fn emulated_conv2d_head_tail_no_pairs() {
    setup();
    coop_cases::conv2d_head_tail(&[COOP_64X64X64_2X2W1FS, COOP_64X64X64_4X4W1FSE4]);
}
