//! Conv2D forward and Conv2DBackpropInput (stride 1) on cooperative matrices (tensor cores):
//! the implicit products [N*OH*OW, R*S*C] x [R*S*C, K] and [N*H*W, R*S*K] x [R*S*K, C] of
//! `matmul::coop` with A read as the windows of the input or of dy (NHWC, one group), for
//! float16 (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`). Everything else keeps the
//! float32 GEMM (`gemm.rs`).

use crate::kernel::{DeviceRef, KernelContext};
use crate::kernels::matmul::coop::{
    self, COOP_64X64_2X2V, COOP_128X128_2X4VG, COOP_128X128X64_2X4VG1, COOP_TILES, CoopSpec,
    CoopTile, Input, Launch, coop_mode, fits, load_width,
};
use crate::{DType, Result};

use super::{ConvAttrs, Geom};

/// Records Conv2D forward (`x` NHWC, `f` HWIO) on cooperative matrices where that applies;
/// returns whether it did.
pub(super) fn try_forward(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    x: &DeviceRef,
    f: &DeviceRef,
    out: &DeviceRef,
) -> Result<bool> {
    try_implicit(ctx, op, g, attrs, false, x, f, out)
}

/// Records Conv2DBackpropInput (`dy` NHWC, `f` HWIO, output dx) on cooperative matrices
/// where that applies (stride 1; the filter's output channels a multiple of the K tile);
/// returns whether it did.
pub(super) fn try_backprop_input(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    dy: &DeviceRef,
    f: &DeviceRef,
    out: &DeviceRef,
) -> Result<bool> {
    try_implicit(ctx, op, g, attrs, true, dy, f, out)
}

/// The implicit products on cooperative matrices:
///
/// | op                  | M           | N | K           | A (windows of) | B                 |
/// |---------------------|-------------|---|-------------|----------------|-------------------|
/// | Conv2D              | n * oh * ow | k | r * s * c   | x              | f as K x N        |
/// | Conv2DBackpropInput | n * h * w   | c | r * s * k   | dy             | f per tap, N x K  |
///
/// Backprop input, stride 1: dx[n, y, x, c] = sum over (r, s, kc) of
/// dy[n, y + pt - r * dh, x + pl - s * dw, kc] f[r, s, c, kc]: the forward windows with the
/// paddings and dilations negated (two's complement in the u32 params; the shader's
/// wrapping u32 products and i32 casts give the signed offsets).
#[allow(clippy::too_many_arguments)]
fn try_implicit(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    bwd_input: bool,
    a: &DeviceRef,
    f: &DeviceRef,
    out: &DeviceRef,
) -> Result<bool> {
    let input = match out.desc.dtype {
        DType::F16 => Input::F16,
        DType::F32 if coop::reduced_precision_allowed() => Input::F32,
        _ => return Ok(false),
    };
    // A forced GEMM tile keeps the GEMM; a cooperative tile name forces that tile.
    let forced = match attrs.tile.as_deref() {
        None => None,
        Some(name) => match COOP_TILES.iter().find(|t| t.name == name) {
            Some(t) => Some(*t),
            None => return Ok(false),
        },
    };
    let Some((lanes, emulate)) = coop_mode(ctx) else {
        return Ok(false);
    };
    if g.nchw || g.groups != 1 || a.desc.dtype != out.desc.dtype || f.desc.dtype != out.desc.dtype {
        return Ok(false);
    }
    if bwd_input && (g.sh != 1 || g.sw != 1) {
        return Ok(false);
    }
    // (channels of A's windows, M, N, K)
    let (ac, m, n, k) = if bwd_input {
        (g.k, g.n * g.h * g.w, g.c, g.r * g.s * g.k)
    } else {
        (g.c, g.n * g.oh * g.ow, g.k, g.r * g.s * g.c)
    };
    if k == 0 {
        return Ok(false);
    }
    let tile = forced.unwrap_or_else(|| choose_conv_tile(input, bwd_input, m, n, ac));
    let spec = CoopSpec {
        tile,
        lanes,
        a_kfast: true,
        b_nfast: !bwd_input,
        wa: load_width(input, &tile, ac),
        wb: load_width(input, &tile, if bwd_input { ac } else { n }),
        input,
        conv: true,
        bwd_input,
        emulate,
    };
    // Backprop input: each K tile within one tap of the filter.
    if !fits(ctx, &spec) || (bwd_input && !ac.is_multiple_of(tile.bk as usize)) {
        return Ok(false);
    }
    let neg = |v: usize| (v as u32).wrapping_neg() as usize;
    let l = if bwd_input {
        Launch {
            m,
            n,
            k,
            batches: 1,
            strides: [k, 1, 1, g.k],
            dims: vec![],
            conv: [
                g.h,
                g.w,
                g.k,
                g.s,
                1,
                1,
                neg(g.dh),
                neg(g.dw),
                neg(g.pt),
                neg(g.pl),
                g.oh * g.ow * g.k,
                g.ow * g.k,
                g.k,
                g.oh,
                g.ow,
                g.c * g.k,
            ],
        }
    } else {
        Launch {
            m,
            n,
            k,
            batches: 1,
            strides: [k, 1, n, 1],
            dims: vec![],
            conv: [
                g.oh,
                g.ow,
                g.c,
                g.s,
                g.sh,
                g.sw,
                g.dh,
                g.dw,
                g.pt,
                g.pl,
                g.h * g.w * g.c,
                g.w * g.c,
                g.c,
                g.h,
                g.w,
                0,
            ],
        }
    };
    tracing::debug!("{op} {m}x{n}x{k}: cooperative {}", spec.specialization());
    coop::launch(ctx, op, &spec, &l, a, f, out)?;
    Ok(true)
}

/// The tile of an implicit product of M x N (measured on the H200, NOTES-coop.md, v3):
/// 64 x 64 where M or N is at most 64; Conv2D forward `c128x128x32_2x4vg` (wide:
/// 85.6 TFLOP/s against 81.9 for the K-64 tile); backprop input on float16 with dy channels
/// `ac` a multiple of 64 (the K tile must lie within one tap) `c128x128x64_2x4vg1`
/// (81.5 / 87.9 / 48.0 against 79.0 / 85.6 / 45.6 on wide, r50_14_3x3_256_256,
/// r50_7_3x3_512_512).
fn choose_conv_tile(input: Input, bwd_input: bool, m: usize, n: usize, ac: usize) -> CoopTile {
    if n <= 64 || m <= 64 {
        COOP_64X64_2X2V
    } else if bwd_input && input == Input::F16 && ac.is_multiple_of(64) {
        COOP_128X128X64_2X4VG1
    } else {
        COOP_128X128_2X4VG
    }
}
