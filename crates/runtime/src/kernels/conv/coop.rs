//! Conv2D forward and Conv2DBackpropInput (stride 1) on cooperative matrices (tensor cores):
//! the implicit products [N*OH*OW, R*S*C] x [R*S*C, K] and [N*H*W, R*S*K] x [R*S*K, C] of
//! `matmul::coop` with A read as the windows of the input or of dy (NHWC, one group), for
//! float16 (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`). Everything else keeps the
//! float32 GEMM (`gemm.rs`).

use crate::kernel::{DeviceRef, KernelContext};
use std::sync::OnceLock;

use crate::kernel::{TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::matmul::coop::{
    self, COOP_64X64_2X2V, COOP_64X64X64_2X2W1FS, COOP_128X64X64_4X2WG1F, COOP_128X128_2X4VG,
    COOP_128X128X64_2X4VG1, COOP_128X128X64_2X4WG1F, COOP_TILES, CoopSpec, CoopTile, Input, Launch,
    coop_mode, fits, load_width,
};
use crate::kernels::wgsl::{LINEAR_INDEX, params};
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

/// Records Conv2DBackpropFilter (`x` NHWC, `dy` NHWC, output the HWIO filter gradient) on
/// cooperative matrices where that applies; returns whether it did.
///
/// The product [R*S*C, N*OH*OW] x [N*OH*OW, K]: A the windows of x transposed (plain x as
/// K x M for 1x1 stride-1 unpadded convolutions), B = dy. The output has few tiles and K is
/// long, so K is split over the grid's z (float32 partial sums in a temporary, added up and
/// rounded by `SPLIT_SUM_WGSL`) until about two workgroups run per SM.
pub(super) fn try_backprop_filter(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    x: &DeviceRef,
    dy: &DeviceRef,
    out: &DeviceRef,
) -> Result<bool> {
    let input = match out.desc.dtype {
        DType::F16 => Input::F16,
        DType::F32 if coop::reduced_precision_allowed() => Input::F32,
        _ => return Ok(false),
    };
    let forced = match attrs.tile.as_deref() {
        None => None,
        Some(name) => match COOP_TILES.iter().find(|t| t.name == name) {
            Some(t) => Some(*t),
            None => return Ok(false),
        },
    };
    if v4_choice() && forced.is_none() {
        return Ok(false);
    }
    let Some((lanes, emulate)) = coop_mode(ctx) else {
        return Ok(false);
    };
    if g.nchw || g.groups != 1 || x.desc.dtype != out.desc.dtype || dy.desc.dtype != out.desc.dtype
    {
        return Ok(false);
    }
    let (m, n, k) = (g.r * g.s * g.c, g.k, g.n * g.oh * g.ow);
    if k == 0 {
        return Ok(false);
    }
    let plain = pointwise(g);
    let mut tile = forced.unwrap_or_else(|| choose_wgrad_tile(input, m, n));
    // A chosen tile that does not fit the device's workgroup memory (lavapipe: 32 KiB)
    // gives way to the 64 x 64 one.
    if forced.is_none() && !fits(ctx, &wgrad_spec(tile, lanes, input, g, plain, emulate)) {
        tile = COOP_64X64X64_2X2W1FS;
    }
    let mut spec = wgrad_spec(tile, lanes, input, g, plain, emulate);
    if !fits(ctx, &spec) {
        return Ok(false);
    }
    // Split K until ~2 workgroups per SM (the SM count is not known: 132 on the H200, the
    // target is 264 workgroups), each split at least 4 K tiles long.
    let bk = tile.bk as usize;
    let tiles = m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize);
    let max_splits = k.div_ceil(4 * bk).max(1);
    let want = 264usize.div_ceil(tiles).clamp(1, max_splits);
    let kc = k.div_ceil(want).next_multiple_of(bk);
    let splits = k.div_ceil(kc);
    spec.out_f32 = splits > 1;
    let mut conv = if plain {
        [0; 16]
    } else {
        [
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
        ]
    };
    conv[15] = kc;
    let l = Launch {
        m,
        n,
        k,
        batches: splits,
        // A: x as K x M ([N*H*W, C] for 1x1; strides unused through the windows), B: dy.
        strides: [1, g.c, n, 1],
        dims: vec![],
        conv,
    };
    tracing::debug!(
        "{op} {m}x{n}x{k}: cooperative {} in {splits} splits of {kc}",
        spec.specialization()
    );
    if splits == 1 {
        coop::launch(ctx, op, &spec, &l, x, dy, out)?;
        return Ok(true);
    }
    let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[splits, m, n]))?;
    coop::launch(ctx, op, &spec, &l, x, dy, &part)?;
    split_sum(ctx, op, input, splits, m * n, &part, out)?;
    Ok(true)
}

/// The filter gradient's spec for `tile` (split K; `out_f32` set by the caller).
fn wgrad_spec(
    tile: CoopTile,
    lanes: u32,
    input: Input,
    g: &Geom,
    plain: bool,
    emulate: bool,
) -> CoopSpec {
    CoopSpec {
        tile,
        lanes,
        a_kfast: false,
        b_nfast: true,
        wa: load_width(input, &tile, g.c),
        wb: load_width(input, &tile, g.k),
        input,
        conv: !plain,
        bwd_input: false,
        wgrad: !plain,
        split: true,
        out_f32: false,
        emulate,
    }
}

/// Adds up split-K partial sums (`splits` slices of `mn` floats) into `out` (float16: two
/// per word; float32 opt-in: one).
const SPLIT_SUM_WGSL: &str = "struct Params { mn: u32, splits: u32, row: u32, _pad: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<OUT>;
LINEAR_INDEX
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = linear_index(gid);
    let i = j * PER;
    if i >= p.mn {
        return;
    }
    var s = vec2<f32>(0.0, 0.0);
    let two = PER == 2u && i + 1u < p.mn;
    for (var z = 0u; z < p.splits; z += 1u) {
        s.x += part[z * p.mn + i];
        if two {
            s.y += part[z * p.mn + i + 1u];
        }
    }
    STORE
}
";

fn split_sum(
    ctx: &KernelContext,
    op: &str,
    input: Input,
    splits: usize,
    mn: usize,
    part: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let (per, dtype) = match input {
        Input::F16 => (2u32, DType::F16),
        Input::F32 => (1u32, DType::F32),
    };
    let pipeline = ctx.pipeline(
        PipelineKey::new("conv_coop", Some(dtype), "split_sum"),
        || {
            let (ty, store) = match input {
                Input::F16 => ("u32", "out[j] = pack2x16float(s);"),
                Input::F32 => ("f32", "out[j] = s.x;"),
            };
            ShaderSource::new(
                SPLIT_SUM_WGSL
                    .replace("LINEAR_INDEX", LINEAR_INDEX)
                    .replace("OUT", ty)
                    .replace("PER", &format!("{per}u"))
                    .replace("STORE", store),
            )
        },
    )?;
    let words = mn.div_ceil(per as usize);
    let (grid, row) = grid_1d(words as u64, 256);
    let to = |v: usize| -> Result<u32> {
        u32::try_from(v)
            .map_err(|_| crate::Error::InvalidArgument(format!("{op}: {v} elements are too many")))
    };
    let pb = ctx.bind(part)?;
    let ob = ctx.bind_bytes(out.addr, out.desc.byte_size().next_multiple_of(4))?;
    ctx.dispatch(
        &pipeline,
        &params(&[to(mn)?, to(splits)?, row, 0]),
        &[pb, ob],
        grid,
    )
}

/// The tile of a filter gradient's product (M = R*S*C rows, N = K columns; split K fills
/// the GPU): 64 x 64 where M or N is at most 64, 128 x 64 in 8 subgroups for 64 columns,
/// else the MatMul default `c128x128x64_2x4wg1f`; float32 opt-in `c128x128x32_2x4vg`.
fn choose_wgrad_tile(input: Input, m: usize, n: usize) -> CoopTile {
    if m <= 64 || n < 64 {
        COOP_64X64X64_2X2W1FS
    } else if input == Input::F32 {
        if n <= 64 {
            COOP_64X64_2X2V
        } else {
            COOP_128X128_2X4VG
        }
    } else if n <= 64 {
        COOP_128X64X64_4X2WG1F
    } else {
        COOP_128X128X64_2X4WG1F
    }
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

/// `TFWGPU_CONV_COOP_V4=1`: session 5's choice (v4 tiles `c128x128x32_2x4vg`,
/// `c128x128x64_2x4vg1`, `c64x64x32_2x2v`; 1x1 convolutions through the window addressing),
/// for comparisons in one benchmark call. Read once per process.
fn v4_choice() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TFWGPU_CONV_COOP_V4").is_ok_and(|v| v.trim() == "1"))
}

/// Whether `g` is a 1x1, stride-1, unpadded convolution (any dilation): a plain product of
/// the [N*H*W, C] input and the [C, K] filter.
fn pointwise(g: &Geom) -> bool {
    g.r == 1
        && g.s == 1
        && g.sh == 1
        && g.sw == 1
        && g.pt == 0
        && g.pl == 0
        && g.oh == g.h
        && g.ow == g.w
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
///
/// 1x1 stride-1 unpadded convolutions are plain products (no window addressing): x [M, C]
/// times f [C, K] (forward) and dy [M, K] times f transposed (backprop input, B stored
/// N x K).
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
    let plain = pointwise(g) && !v4_choice();
    // Backprop input through the windows: each K tile within one tap of the filter.
    let tap_ok = |t: &CoopTile| plain || !bwd_input || ac.is_multiple_of(t.bk as usize);
    let tile = match forced {
        Some(t) => t,
        None if plain => choose_conv_tile(input, false, m, n, ac),
        None => {
            let t = choose_conv_tile(input, bwd_input, m, n, ac);
            if tap_ok(&t) {
                t
            } else if n <= 64 || m <= 64 {
                COOP_64X64_2X2V
            } else {
                COOP_128X128_2X4VG
            }
        }
    };
    // Where B's contiguous dimension is: N (the filter as K x N: forward) or K (backprop
    // input: the filter's rows are c, its columns kc).
    let mut spec = CoopSpec {
        tile,
        lanes,
        a_kfast: true,
        b_nfast: !bwd_input,
        wa: load_width(input, &tile, ac),
        wb: load_width(input, &tile, if bwd_input { ac } else { n }),
        input,
        conv: !plain,
        bwd_input: bwd_input && !plain,
        wgrad: false,
        split: false,
        out_f32: false,
        emulate,
    };
    if forced.is_none() && !fits(ctx, &spec) && tap_ok(&COOP_64X64X64_2X2W1FS) {
        // (lavapipe's 32 KiB: the 64 x 64 tile.)
        let tile = COOP_64X64X64_2X2W1FS;
        spec = CoopSpec {
            tile,
            wa: load_width(input, &tile, ac),
            wb: load_width(input, &tile, if bwd_input { ac } else { n }),
            ..spec
        };
    }
    if !fits(ctx, &spec) || !tap_ok(&spec.tile) {
        return Ok(false);
    }
    let neg = |v: usize| (v as u32).wrapping_neg() as usize;
    let l = if plain {
        Launch {
            m,
            n,
            k,
            batches: 1,
            // A: [M, K] rows of the input (or dy); B: f [C, K] as K x N (forward) or, for
            // the input gradient, f [C, kc] read as N x K.
            strides: if bwd_input {
                [k, 1, 1, k]
            } else {
                [k, 1, n, 1]
            },
            dims: vec![],
            conv: [0; 16],
        }
    } else if bwd_input {
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

/// The tile of an implicit product of M x N through the windows (`ac`: channels of A's
/// windows). v5 (NOTES-coop.md): the MatMul v4 loop (16-byte loads, K 64 in one buffer,
/// unconditional staging): 128 x 128 `c128x128x64_2x4wg1f` for at least 128 such tiles,
/// 128 x 64 in 8 subgroups for 64 output columns, 64 x 64 `c64x64x64_2x2w1fs` for few tiles.
/// `TFWGPU_CONV_COOP_V4=1`: session 5's choice (v3 measurements: Conv2D forward
/// `c128x128x32_2x4vg`, backprop input with dy channels a multiple of 64
/// `c128x128x64_2x4vg1`, 64 x 64 where M or N is at most 64).
fn choose_conv_tile(input: Input, bwd_input: bool, m: usize, n: usize, ac: usize) -> CoopTile {
    if v4_choice() || input == Input::F32 {
        return if n <= 64 || m <= 64 {
            COOP_64X64_2X2V
        } else if bwd_input && input == Input::F16 && ac.is_multiple_of(64) {
            COOP_128X128X64_2X4VG1
        } else {
            COOP_128X128_2X4VG
        };
    }
    let tiles = m.div_ceil(128).saturating_mul(n.div_ceil(128));
    if m <= 64 || tiles < 128 {
        COOP_64X64X64_2X2W1FS
    } else if n <= 64 {
        COOP_128X64X64_4X2WG1F
    } else {
        COOP_128X128X64_2X4WG1F
    }
}
