//! norm family, float32 NHWC with C % 4 == 0 (the vec4 statistics and apply), with
//! `TFWGPU_NORM_TARGET_GROUPS=1` (float32, and float16 in training): every invocation of the statistics takes the most rows it
//! can (16), so the four-row main loop runs several times and the one-row tail after it, on
//! tensors small enough for lavapipe (with the default target of 1024 workgroups, only
//! tensors of 12M+ elements reach 16 rows per invocation). Same references and error bounds
//! as tests/norm.rs (`norm_check.rs`). One test: the variable is read once per process.
mod common;
mod norm_check;
mod refs;

use norm_check::*;

#[test]
fn vec4_statistics_with_sixteen_rows_per_invocation() {
    // SAFETY: the only test of this binary sets the variable before any device (and any
    // other thread) exists.
    unsafe { std::env::set_var("TFWGPU_NORM_TARGET_GROUPS", "1") };
    let shapes: &[&[usize]] = &[
        // 16 quads per workgroup, 16 lanes: 5 chunks of 256 rows, the last of 98.
        &[2, 33, 17, 64],
        // 2 quads, 128 lanes: one chunk of 2000 rows (15-16 rows per invocation).
        &[1, 40, 50, 8],
        // 33 quads: a second tile with one quad, lanes of 8, 21 rows per lane capped at 16.
        &[2, 9, 9, 132],
        // 3 quads (tc 4, one past C), 105 rows: one 4-row step or a tail only.
        &[3, 7, 5, 12],
        // One row.
        &[1, 1, 1, 4],
    ];
    let mut seed = 500;
    for &shape in shapes {
        for (training, half) in [(true, false), (false, false), (true, true)] {
            seed += 1;
            check_forward(
                &FwdCase {
                    shape: shape.to_vec(),
                    cf: false,
                    half,
                    training,
                    factor: 1.0,
                    eps: 1e-3,
                    center: 3.0,
                    spread: 2.0,
                    version: 3,
                },
                seed,
            );
            check_grad(
                &GradCase {
                    shape: shape.to_vec(),
                    cf: false,
                    half,
                    training,
                    version: 3,
                },
                seed,
            );
        }
    }
}
