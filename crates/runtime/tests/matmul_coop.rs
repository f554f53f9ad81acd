//! float16 MatMul through cooperative matrices (tensor cores) and its fallback.
//!
//! - Every cooperative shader variant is translated offline (naga WGSL -> SPIR-V, as wgpu's
//!   Vulkan backend does): runs everywhere, catches naga validation errors and panics.
//! - float16 MatMul/BatchMatMulV2/V3 against an f64 reference of the (exactly representable)
//!   f16 inputs, every transpose combination, awkward shapes and broadcast batches. On an
//!   adapter without cooperative matrices (lavapipe) this checks the fallback; the tests that
//!   force cooperative tiles print "skipped: no cooperative matrix" there (`coop_emulated.rs`
//!   runs the same cases through the emulated cooperative kernels on such adapters). The
//!   cases live in `coop_cases/mod.rs`.
//!
//! Tolerance (not tuned): the f16 inputs are exact and their products exact in f32; the f32
//! accumulation of K products errs by at most K * u * sum|a b| (u = 2^-23, one unit of f32
//! rounding per addition, allowing for accumulators that truncate); the f16 output then
//! rounds y (the f32 sum) with |fl16(y) - y| <= 2^-11 |y| + 2^-25 (half the subnormal
//! spacing).
mod common;
mod coop_cases;
use common::spirv;
use common::*;
use coop_cases::reference;

use tfwgpu_runtime::kernels::matmul::coop::{COOP_TILES, CoopSpec, Input, all_specs, choose_tile};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType};

/// Whether `s` is in the offline test's covering set: every variant of the first and of the
/// default tile (layouts, load widths, input types, Conv2D), one of every other tile, and the
/// default tile for subgroups of 16 and 64. (All variants take minutes with a debug naga.)
fn covered(s: &CoopSpec) -> bool {
    let default = choose_tile(Input::F16, 1, 4096, 4096);
    let w = if s.tile.wide { 8 } else { 4 };
    let simple = s.a_kfast && s.b_nfast && s.wa == w && s.wb == w && s.input == Input::F16;
    if s.lanes != 32 {
        return s.tile == default && simple && !s.conv && !s.split && !s.vout;
    }
    // The Conv2D v5 forms (split K, float32 partial sums, vector epilogue, strided input
    // gradients, the filter gradient) at the widest float16 loads, on the default tile and
    // the Conv2D tiles; their window forms too (select loads).
    let conv_v5 = [
        "c64x64x64_2x2w1fs",
        "c128x64x64_4x2wg1f",
        "c128x64x64_4x2wg1fs",
        // (v6's 16-subgroup tile; v7 splits K on it and runs the filter gradient on it.)
        "c128x128x64_4x4wg1fse8",
        // (Session 18's tiles for the 1x1 products: 64 x 128, and the persistent forms.)
        "c64x128x64_2x4wg1f",
        "c128x128x64_2x4wg1fp",
        "c64x128x64_2x4wg1fp",
        // (Session 20's K-32 tiles within 24 KiB, the Conv2D chooser's v10 picks.)
        "c128x64x32_4x2wg1fp",
        "c64x128x32_2x4wg1fp",
        "c64x64x32_2x2w1f",
        "c64x128x32_2x4wg1f",
    ];
    let conv_simple = s.input == Input::F16 && s.wa == w && s.wb == w;
    // (1x1 Conv2D as plain products: the MatMul form with the vector epilogue, A k-fast.)
    if s.vout && !s.conv && !s.split && !s.out_f32 {
        return conv_simple && s.a_kfast && conv_v5.contains(&s.tile.name);
    }
    if s.split || s.out_f32 || s.vout || s.strided || s.wgrad {
        let layout = s.conv || (!s.a_kfast && s.b_nfast);
        return conv_simple && layout && (s.tile == default || conv_v5.contains(&s.tile.name));
    }
    s.tile == COOP_TILES[0]
        || s.tile == default
        || (simple && !s.conv)
        || (s.conv && conv_simple && conv_v5.contains(&s.tile.name))
}

#[test]
fn coop_shaders_translate_offline() {
    let mut n = 0;
    for lanes in [32, 64, 16] {
        for spec in all_specs(lanes).into_iter().filter(covered) {
            let src = spec.wgsl();
            let words = std::panic::catch_unwind(|| spirv(&src))
                .unwrap_or_else(|_| panic!("{}: naga panicked", spec.specialization()))
                .unwrap_or_else(|e| panic!("{}: {e}\n{src}", spec.specialization()));
            assert!(words.len() > 100, "{}", spec.specialization());
            n += 1;
        }
    }
    // 2 tiles x (4 layouts x 4 width pairs x 2 inputs + 2 x 4 x 2 Conv2D forms), the others
    // once, and 2 for other subgroup sizes.
    assert!(n >= 2 * 48 + COOP_TILES.len() - 2 + 2, "only {n} variants");
}

fn skip() -> bool {
    coop_cases::skip_without_coop()
}

#[test]
fn f32_matmul_keeps_full_precision_without_opt_in() {
    // Without TFWGPU_ALLOW_REDUCED_PRECISION (not set in this binary), float32 MatMul stays
    // float32 on every adapter: the f32 accumulation bound, which f16 rounding of the inputs
    // (relative error ~2^-11 per product) would exceed.
    assert!(std::env::var("TFWGPU_ALLOW_REDUCED_PRECISION").is_err());
    let d = dev();
    let (m, k, n) = (64, 96, 48);
    let mut r = rng(5);
    let a = rand_f32(&mut r, m * k, -1.0, 1.0);
    let b = rand_f32(&mut r, k * n, -1.0, 1.0);
    let ga = d.upload(&a, &[m, k]).unwrap();
    let gb = d.upload(&b, &[k, n]).unwrap();
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::F32));
    let out = d
        .run("MatMul", &attrs, &[Arg::from(&ga), Arg::from(&gb)])
        .unwrap();
    let got = out[0].download::<f32>().unwrap();
    let (_, want, scale) = reference(&a, &b, &[m, k], &[k, n], false, false);
    for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let tol = k as f64 * 2f64.powi(-24) * s;
        assert!((g as f64 - w).abs() <= tol, "[{i}]: got {g}, want {w}");
    }
}

#[test]
fn f16_matmul_any_device() {
    coop_cases::f16_matmul_any();
}

#[test]
fn coop_matmul_shapes_layouts_tiles() {
    if skip() {
        return;
    }
    coop_cases::matmul_shapes_layouts_tiles(COOP_TILES);
}

#[test]
fn coop_batch_matmul_broadcast() {
    if skip() {
        return;
    }
    coop_cases::batch_matmul_broadcast();
}

#[test]
fn coop_large_k() {
    if skip() {
        return;
    }
    coop_cases::large_k();
}

#[test]
fn f16_conv2d_any_device() {
    coop_cases::f16_conv2d_any();
}

#[test]
fn coop_conv2d_forward() {
    if skip() {
        return;
    }
    coop_cases::conv2d_forward(COOP_TILES);
}

#[test]
fn f16_conv2d_backprop_input_any_device() {
    coop_cases::f16_conv2d_backprop_input_any();
}

#[test]
fn coop_conv2d_backprop_input() {
    if skip() {
        return;
    }
    coop_cases::conv2d_backprop_input(COOP_TILES);
}

#[test]
fn f16_conv2d_backprop_filter_any_device() {
    coop_cases::f16_conv2d_backprop_filter_any();
}

#[test]
fn coop_conv2d_backprop_filter() {
    if skip() {
        return;
    }
    coop_cases::conv2d_backprop_filter(COOP_TILES);
}

#[test]
fn coop_conv2d_split_k() {
    if skip() {
        return;
    }
    coop_cases::conv2d_split_k(COOP_TILES);
}

#[test]
fn coop_conv2d_backprop_input_strided() {
    if skip() {
        return;
    }
    coop_cases::conv2d_backprop_input_strided(COOP_TILES);
}
