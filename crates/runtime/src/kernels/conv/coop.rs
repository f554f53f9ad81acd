//! Conv2D, Conv2DBackpropInput and Conv2DBackpropFilter on cooperative matrices (tensor
//! cores): the implicit products [N*OH*OW, R*S*C] x [R*S*C, K], [N*H*W, R*S*K] x [R*S*K, C]
//! and [R*S*C, N*OH*OW] x [N*OH*OW, K] of `matmul::coop` with A read as the windows of the
//! input or of dy (NHWC, one group; 1x1 stride-1 unpadded ones as plain products), K split
//! over the grid where the output has few tiles (float32 partial sums added up by
//! `split_sum`), for float16 (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`).
//! Everything else (NCHW, groups, float32) keeps the GEMM (`gemm.rs`). Variants and H200
//! figures: bench/NOTES-coop.md (v5).

use crate::kernel::{DeviceRef, KernelContext};
use std::sync::OnceLock;

use crate::kernel::{MAX_GROUPS_X, TensorDesc};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::matmul::coop::{
    self, COOP_64X64_2X2V, COOP_64X64X64_2X2W1FS, COOP_128X64X64_4X2WG1F, COOP_128X128_2X4VG,
    COOP_128X128X64_2X4VG1, COOP_128X128X64_2X4WG1F, COOP_128X128X64_4X4WG1FSE8, COOP_TILES,
    CoopSpec, CoopTile, Input, Launch, coop_mode, fits, load_width,
};
use crate::kernels::wgsl::params;
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
    let Some((input, forced)) = coop_input_and_tile(out, attrs) else {
        return Ok(false);
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
    let (splits, kc) = split_k(&tile, m, n, k, true);
    spec.out_f32 = splits > 1;
    spec.vout = vout_ok(&spec, n);
    let mut conv = if plain { [0; 16] } else { window_words(g) };
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
        aux: [0; 24],
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
        strided: false,
        phase: false,
        vout: false,
        emulate,
    }
}

/// Whether the vector epilogue applies: N a multiple of one store's elements (8 halves or
/// 4 floats), not under `TFWGPU_CONV_COOP_V4`.
fn vout_ok(spec: &CoopSpec, n: usize) -> bool {
    let w = if spec.input == Input::F16 && !spec.out_f32 {
        8
    } else {
        4
    };
    !v4_choice() && n.is_multiple_of(w)
}

/// `TFWGPU_CONV_COOP_SPLIT=0`: no split K in Conv2D forward and input gradient (for
/// comparisons; the filter gradient always splits). Read once per process.
fn split_allowed() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("TFWGPU_CONV_COOP_SPLIT").is_ok_and(|v| v.trim() == "0") && !v4_choice()
    })
}

/// Adds up split-K partial sums (`splits` slices of `mn` floats) into `out` (float16: two
/// per word; float32 opt-in: one). A workgroup takes 32 output words; its 8 rows of 32
/// invocations add up every 8th split each (coalesced reads of consecutive words), then the
/// 8 rows are added through workgroup memory: the split loop is 8 times shorter than one
/// invocation per word walking all splits, whose dependent loads were latency-bound.
const SPLIT_SUM_WGSL: &str = "struct Params { mn: u32, splits: u32, words: u32, _pad: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<OUT>;
var<workgroup> acc: array<vec2<f32>, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = lid % 32u;
    let grp = lid / 32u;
    let j = (wid.y * 65535u + wid.x) * 32u + col;
    let i = j * PER;
    var s = vec2<f32>(0.0, 0.0);
    if j < p.words {
        let two = PER == 2u && i + 1u < p.mn;
        for (var z = grp; z < p.splits; z += 8u) {
            s.x += part[z * p.mn + i];
            if two {
                s.y += part[z * p.mn + i + 1u];
            }
        }
    }
    acc[lid] = s;
    workgroupBarrier();
    if grp == 0u && j < p.words {
        for (var g = 1u; g < 8u; g += 1u) {
            s += acc[g * 32u + col];
        }
        STORE
    }
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
        PipelineKey::new("conv_coop", Some(dtype), "split_sum8"),
        || {
            let (ty, store) = match input {
                Input::F16 => ("u32", "out[j] = pack2x16float(s);"),
                Input::F32 => ("f32", "out[j] = s.x;"),
            };
            ShaderSource::new(
                SPLIT_SUM_WGSL
                    .replace("OUT", ty)
                    .replace("PER", &format!("{per}u"))
                    .replace("STORE", store),
            )
        },
    )?;
    let words = mn.div_ceil(per as usize);
    let groups = words.div_ceil(32);
    let gx = groups.min(MAX_GROUPS_X as usize);
    let gy = groups.div_ceil(gx);
    let to = |v: usize| -> Result<u32> {
        u32::try_from(v)
            .map_err(|_| crate::Error::InvalidArgument(format!("{op}: {v} elements are too many")))
    };
    let pb = ctx.bind(part)?;
    let ob = ctx.bind_bytes(out.addr, out.desc.byte_size().next_multiple_of(4))?;
    ctx.dispatch(
        &pipeline,
        &params(&[to(mn)?, to(splits)?, to(words)?, 0]),
        &[pb, ob],
        [to(gx)?, to(gy)?, 1],
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
/// where that applies (the filter's output channels a multiple of the K tile; strides through
/// exact divisions of the window offsets); returns whether it did.
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
/// wrapping u32 products and i32 casts give the signed offsets). With strides (`strided`),
/// dy[n, (y + pt - r * dh) / sh, (x + pl - s * dw) / sw, kc] where both divisions are exact.
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
    let Some((input, forced)) = coop_input_and_tile(out, attrs) else {
        return Ok(false);
    };
    let Some((lanes, emulate)) = coop_mode(ctx) else {
        return Ok(false);
    };
    if g.nchw || g.groups != 1 || a.desc.dtype != out.desc.dtype || f.desc.dtype != out.desc.dtype {
        return Ok(false);
    }
    // Strided input gradients (new in v5) through the windows; session 5's choice kept them
    // on the GEMM.
    if bwd_input && (g.sh != 1 || g.sw != 1) && v4_choice() {
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
    // Strided input gradients: one stride-1 product per output phase (v6), unless
    // `TFWGPU_CONV_COOP_PHASES=0` keeps v5b's strided windows.
    if bwd_input
        && (g.sh != 1 || g.sw != 1)
        && phases_on()
        && backprop_input_phases(ctx, op, g, input, forced, (lanes, emulate), a, f, out)?
    {
        return Ok(true);
    }
    // Backprop input through the windows: each K tile within one tap of the filter.
    let tap_ok = |t: &CoopTile| plain || !bwd_input || ac.is_multiple_of(t.bk as usize);
    let tile = match forced {
        Some(t) => t,
        None if plain => choose_conv_tile(input, false, true, m, n, k, ac),
        None => {
            let t = choose_conv_tile(input, bwd_input, false, m, n, k, ac);
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
        strided: bwd_input && !plain && (g.sh != 1 || g.sw != 1),
        phase: false,
        vout: false,
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
            aux: [0; 24],
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
                g.sh,
                g.sw,
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
            aux: [0; 24],
        }
    } else {
        Launch {
            m,
            n,
            k,
            batches: 1,
            strides: [k, 1, n, 1],
            dims: vec![],
            conv: window_words(g),
            aux: [0; 24],
        }
    };
    let (splits, kc) = if split_allowed() {
        split_k(&spec.tile, m, n, k, false)
    } else {
        (1, k)
    };
    spec.vout = vout_ok(&spec, n);
    if splits == 1 {
        tracing::debug!("{op} {m}x{n}x{k}: cooperative {}", spec.specialization());
        coop::launch(ctx, op, &spec, &l, a, f, out)?;
        return Ok(true);
    }
    // Split K: float32 partial sums, added up by `split_sum` (the backprop input's
    // per-tap offset is then N * kc in the shader; p.ftap carries the split length).
    spec.split = true;
    spec.out_f32 = true;
    spec.vout = vout_ok(&spec, n);
    let mut l = l;
    l.batches = splits;
    l.conv[15] = kc;
    tracing::debug!(
        "{op} {m}x{n}x{k}: cooperative {} in {splits} splits of {kc}",
        spec.specialization()
    );
    let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[splits, m, n]))?;
    coop::launch(ctx, op, &spec, &l, a, f, &part)?;
    split_sum(ctx, op, input, splits, m * n, &part, out)?;
    Ok(true)
}

/// `TFWGPU_CONV_COOP_PHASES=0`: strided input gradients through v5b's strided windows (a
/// quarter of the products nonzero at stride 2) instead of one product per output phase.
/// Read once per process.
fn phases_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("TFWGPU_CONV_COOP_PHASES").is_ok_and(|v| v.trim() == "0") && !v4_choice()
    })
}

/// How the output phases of a strided input gradient that no tap reaches (1x1 filters at
/// stride 2: three of four) get their zeros (`TFWGPU_CONV_COOP_PHASE_ZEROS`, read once per
/// process).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PhaseZeros {
    /// "fill" (default): the one phase with taps writes them beside its own results (where
    /// it covers them; else `Clear`).
    Fill,
    /// "clear": one clear of dx before the products.
    Clear,
    /// "kernel": the phase kernel with K = 0 for each such phase.
    Kernel,
}

fn phase_zeros() -> PhaseZeros {
    static MODE: OnceLock<PhaseZeros> = OnceLock::new();
    *MODE.get_or_init(|| {
        match std::env::var("TFWGPU_CONV_COOP_PHASE_ZEROS")
            .as_deref()
            .map(str::trim)
        {
            Ok("clear") => PhaseZeros::Clear,
            Ok("kernel") => PhaseZeros::Kernel,
            _ => PhaseZeros::Fill,
        }
    })
}

/// `TFWGPU_CONV_COOP_PHASE_MERGE=0`: one launch per output phase of a strided input
/// gradient instead of one launch for all of them (grid z = the phase) where they have the
/// same rows and are at most 4. Read once per process.
fn phase_merge() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("TFWGPU_CONV_COOP_PHASE_MERGE").is_ok_and(|v| v.trim() == "0")
    })
}

/// The taps of one filter dimension that reach output phase `ph` of a strided input
/// gradient: tap r contributes to dx rows y = ph (mod st) where (ph + pad - r * dil) is a
/// multiple of st; those taps are r0, r0 + step, ... (step = st / gcd(st, dil)), and row Y
/// of the phase (y = ph + Y * st) reads dy row Y + q0 - j * dstep for its j-th tap (dstep =
/// step * dil / st; both the same for every phase).
fn phase_taps(ph: usize, pad: usize, taps: usize, dil: usize, st: usize) -> PhaseTaps {
    let off = |r: usize| (ph + pad) as i64 - (r * dil) as i64;
    let valid: Vec<usize> = (0..taps)
        .filter(|&r| off(r).rem_euclid(st as i64) == 0)
        .collect();
    let r0 = valid.first().copied().unwrap_or(0);
    PhaseTaps {
        r0,
        count: valid.len(),
        q0: off(r0).div_euclid(st as i64),
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

struct PhaseTaps {
    r0: usize,
    count: usize,
    q0: i64,
}

/// One output phase (py, px) of a strided input gradient: its rows and columns, its taps.
struct Phase {
    py: usize,
    px: usize,
    hy: usize,
    wx: usize,
    ty: PhaseTaps,
    tx: PhaseTaps,
}

/// Conv2DBackpropInput with strides as one stride-1 product per output phase (sub-pixel
/// decomposition, v6): for dx rows y = py (mod sh) and columns x = px (mod sw), only the
/// filter taps (r, s) with (py + pt - r * dh) and (px + pl - s * dw) multiples of the
/// strides contribute, each reading dy at (Y + q0 - j * dstep, X + ...) for the phase's row Y
/// = (y - py) / sh: a stride-1 input gradient of the phase's rows with the sub-filter
/// (`CoopSpec::phase`), written to every sh-th row and sw-th column of dx. Phases with the
/// same rows (dx's height and width multiples of the strides), at most 4, run in one launch
/// (grid z = the phase). Phases without taps (1x1 filters at stride 2: three of four): see
/// `PhaseZeros`. Every dx element belongs to exactly one phase. Returns false (nothing
/// recorded) where a phase has no tile that applies.
#[allow(clippy::too_many_arguments)]
fn backprop_input_phases(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    input: Input,
    forced: Option<CoopTile>,
    (lanes, emulate): (u32, bool),
    dy: &DeviceRef,
    f: &DeviceRef,
    out: &DeviceRef,
) -> Result<bool> {
    let ac = g.k;
    // (The phase words pack tap counts and origins in 8 bits each.)
    if g.r > 255 || g.s > 255 {
        return Ok(false);
    }
    let neg = |v: usize| (v as u32).wrapping_neg() as usize;
    // Signed offsets as two's complement words (the shader's i32 casts).
    let word = |v: i64| (v as i32) as u32;
    let spec_for = |tile: CoopTile| CoopSpec {
        tile,
        lanes,
        a_kfast: true,
        b_nfast: false,
        wa: load_width(input, &tile, ac),
        wb: load_width(input, &tile, ac),
        input,
        conv: true,
        bwd_input: true,
        wgrad: false,
        split: false,
        out_f32: false,
        strided: false,
        phase: true,
        vout: false,
        emulate,
    };
    let tap_ok = |t: &CoopTile| ac.is_multiple_of(t.bk as usize);
    let mut phases = vec![];
    for py in 0..g.sh.min(g.h) {
        for px in 0..g.sw.min(g.w) {
            phases.push(Phase {
                py,
                px,
                hy: (g.h - py).div_ceil(g.sh),
                wx: (g.w - px).div_ceil(g.sw),
                ty: phase_taps(py, g.pt, g.r, g.dh, g.sh),
                tx: phase_taps(px, g.pl, g.s, g.dw, g.sw),
            });
        }
    }
    let k_of = |p: &Phase| p.ty.count * p.tx.count * g.k;
    // Phases without taps (`TFWGPU_CONV_COOP_PHASE_ZEROS`): where only one phase has taps and
    // it has the most rows and columns (its (n, Y, X) cover every other phase's pixels), that
    // phase's kernel writes the others' zeros too ("fill", the default); else one clear of
    // dx first ("clear"); or the phase kernel with K = 0 ("kernel").
    let zero = phases.iter().any(|p| k_of(p) == 0);
    let mode = phase_zeros();
    let taps: Vec<&Phase> = phases.iter().filter(|p| k_of(p) > 0).collect();
    let fill = zero
        && mode == PhaseZeros::Fill
        && taps.len() == 1
        && taps[0].hy == g.h.div_ceil(g.sh)
        && taps[0].wx == g.w.div_ceil(g.sw);
    let clear = zero && !fill && mode != PhaseZeros::Kernel;
    let run: Vec<&Phase> = phases
        .iter()
        .filter(|p| k_of(p) > 0 || (zero && !fill && !clear))
        .collect();
    let merge = phase_merge()
        && run.len() <= 4
        && run.iter().all(|p| p.hy == run[0].hy && p.wx == run[0].wx);
    let groups: Vec<Vec<&Phase>> = if merge {
        vec![run]
    } else {
        run.into_iter().map(|p| vec![p]).collect()
    };
    let ckk = g.c * g.k;
    // The tap steps are the same for every phase (those with one tap never use them).
    let (step_r, step_s) = (g.sh / gcd(g.sh, g.dh.max(1)), g.sw / gcd(g.sw, g.dw.max(1)));
    let mut plan = vec![];
    for grp in groups.into_iter().filter(|grp| !grp.is_empty()) {
        let (hy, wx) = (grp[0].hy, grp[0].wx);
        let (m, n) = (g.n * hy * wx, g.c);
        let k = grp.iter().map(|p| k_of(p)).max().unwrap_or(0);
        let tile = match forced {
            Some(t) => t,
            None => {
                let t = choose_conv_tile(input, true, false, m, n, k.max(64), ac);
                if tap_ok(&t) {
                    t
                } else if n <= 64 || m <= 64 {
                    COOP_64X64_2X2V
                } else {
                    COOP_128X128_2X4VG
                }
            }
        };
        let mut spec = spec_for(tile);
        if forced.is_none() && !fits(ctx, &spec) && tap_ok(&COOP_64X64X64_2X2W1FS) {
            // (lavapipe's 32 KiB: the 64 x 64 tile.)
            spec = spec_for(COOP_64X64X64_2X2W1FS);
        }
        if !fits(ctx, &spec) || !tap_ok(&spec.tile) {
            return Ok(false);
        }
        spec.vout = vout_ok(&spec, n);
        // The phase table (`CoopSpec::phase`): p.bdims, p.astr, p.bstr.
        let mut aux = [0u32; 24];
        for (z, p) in grp.iter().enumerate() {
            let packed = p.ty.count | (p.tx.count << 8) | (p.ty.r0 << 16) | (p.tx.r0 << 24);
            aux[z] = packed as u32;
            aux[4 + z] = word(-p.ty.q0);
            aux[12 + z] = (p.py | (p.px << 16)) as u32;
            aux[20 + z] = word(-p.tx.q0);
        }
        let common = [
            g.sh,
            g.sw,
            g.w,
            g.h,
            step_r * g.s * ckk,
            step_s * ckk,
            g.s * ckk,
            fill as usize,
        ];
        for (i, &v) in common.iter().enumerate() {
            let w = u32::try_from(v).map_err(|_| {
                crate::Error::InvalidArgument(format!("{op}: {v} elements are too many"))
            })?;
            aux[if i < 4 { 8 + i } else { 12 + i }] = w;
        }
        let l = Launch {
            m,
            n,
            k,
            batches: grp.len(),
            strides: [k, 1, 1, g.k],
            dims: vec![],
            conv: [
                hy,
                wx,
                g.k,
                1,
                1,
                1,
                neg(step_r * g.dh / g.sh),
                neg(step_s * g.dw / g.sw),
                0,
                0,
                g.oh * g.ow * g.k,
                g.ow * g.k,
                g.k,
                g.oh,
                g.ow,
                ckk,
            ],
            aux,
        };
        let what: Vec<String> = grp
            .iter()
            .map(|p| format!("({}, {}) {}x{} taps", p.py, p.px, p.ty.count, p.tx.count))
            .collect();
        plan.push((spec, l, what.join(", ")));
    }
    if clear {
        let size = out.desc.byte_size().next_multiple_of(4);
        let o = ctx.bind_bytes(out.addr, size)?;
        ctx.clear(&o, size)?;
    }
    for (spec, l, what) in &plan {
        tracing::debug!(
            "{op} phases {what} of {}x{}, {}x{}x{}: cooperative {}{}",
            g.sh,
            g.sw,
            l.m,
            l.n,
            l.k,
            spec.specialization(),
            if fill { " (and the zero phases)" } else { "" }
        );
        coop::launch(ctx, op, spec, l, dy, f, out)?;
    }
    Ok(true)
}

/// K split over the grid's z for a product of M x N x K on `tile`: where it has fewer than
/// 128 output tiles (or `always`), until ~264 workgroups (2 per SM of the H200's 132), each
/// split at least 4 K tiles long. Returns (splits, rows of K per split, a multiple of BK).
fn split_k(tile: &CoopTile, m: usize, n: usize, k: usize, always: bool) -> (usize, usize) {
    let bk = tile.bk as usize;
    let tiles = m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize);
    // Forward and input gradient: only below half the SMs' worth of tiles (one workgroup of
    // these tiles runs per SM; at 66-131 tiles more splits mostly add partial-sum traffic and
    // another partly filled wave).
    if !always && tiles >= 66 {
        return (1, k);
    }
    let max_splits = k.div_ceil(4 * bk).max(1);
    let want = 264usize.div_ceil(tiles).clamp(1, max_splits);
    let kc = k.div_ceil(want).next_multiple_of(bk);
    (k.div_ceil(kc), kc)
}

/// The tile of a Conv2D forward or input-gradient product of M x N x K (`ac`: channels of
/// A's windows; `plain`: a 1x1 product without windows). v5 (NOTES-coop.md): the MatMul v4
/// loop (16-byte loads, K 64 in one buffer, unconditional staging) on 128 x 64 in 8
/// subgroups (`c128x64x64_4x2wg1f`), or on 128 x 128 (`c128x128x64_2x4wg1f`) for more than
/// 128 columns and ~100 tiles or more; 64 x 64 `c64x64x64_2x2w1fs` for M <= 64. v6 (conv16
/// requests 1-2): the windowed products with 128+ columns, ~100 tiles of 128 x 128 or more and
/// K >= 512 on 128 x 128 in 16 subgroups (`c128x128x64_4x4wg1fse8`, 111 registers: twice the
/// warps per SM), 64 x 64 for plain products with N and K at most 64.
/// `TFWGPU_CONV_COOP_V4=1`: session 5's choice (v3 measurements: Conv2D forward
/// `c128x128x32_2x4vg`, backprop input with dy channels a multiple of 64
/// `c128x128x64_2x4vg1`, 64 x 64 where M or N is at most 64).
fn choose_conv_tile(
    input: Input,
    bwd_input: bool,
    plain: bool,
    m: usize,
    n: usize,
    k: usize,
    ac: usize,
) -> CoopTile {
    if v4_choice() || input == Input::F32 {
        return if n <= 64 || m <= 64 {
            COOP_64X64_2X2V
        } else if bwd_input && input == Input::F16 && ac.is_multiple_of(64) {
            COOP_128X128X64_2X4VG1
        } else {
            COOP_128X128_2X4VG
        };
    }
    // Request 1 (NOTES-coop.md, v5): 128 x 64 in 8 subgroups beat 128 x 128 for up to 128
    // output columns (wide 92-108 against 96, r50_28 105-110 against 95-99) and where
    // 128 x 128 leaves SMs idle (r50_7: 1568 x 512, 52 tiles: 89-107 against 53); 128 x 128
    // where it has ~100 tiles or more with 256+ columns (r50_14: 110-117 against 93-98).
    // v6 (conv16 request 1): 16 subgroups on 128 x 128 beat both on the 3x3 layers (r50_28
    // forward 0.0576 ms against 0.0705 / 0.0662, input gradient 0.0587 against 0.0705 /
    // 0.0711; r50_14 forward 0.0527 against 0.0603) but not on the 1x1 products (K 64:
    // 0.0374 / 0.0761 ms against 0.0241 / 0.0648), where 64 x 64 ran r50_56_1x1_64_64
    // forward at 0.0241 ms against 0.0283 for 128 x 64. Request 2: K 512+ (the 3x3 stride-2
    // phases in one launch, K 128-512: 0.0779 ms against 0.0867 for 8 subgroups and 0.1044
    // for 128 x 64), but r50_56_1x1_256_128_s2 forward (windowed, K 256) ran 0.0290 ms on
    // it against 0.0262 on 128 x 64 in request 1: 128 x 64 below K 512.
    let tiles = m.div_ceil(128).saturating_mul(n.div_ceil(128));
    if m <= 64 || k < 64 || (plain && n <= 64 && k <= 64) {
        COOP_64X64X64_2X2W1FS
    } else if !plain && n >= 128 && tiles >= 96 && k >= 512 {
        COOP_128X128X64_4X4WG1FSE8
    } else if n > 128 && tiles >= 96 {
        COOP_128X128X64_2X4WG1F
    } else {
        COOP_128X64X64_4X2WG1F
    }
}

/// The window addressing words of the conv forms' params (output size, strides, dilations,
/// padding, the input's NHWC strides and size), in the order the generated shaders read them.
fn window_words(g: &Geom) -> [usize; 16] {
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
}

/// The input precision and the forced tile (if any) of a cooperative-matrix conv writing
/// `out`; `None` keeps the GEMM: float32 without the reduced-precision opt-in, another dtype,
/// or a forced tile that is not a cooperative one (a forced GEMM tile keeps the GEMM).
fn coop_input_and_tile(out: &DeviceRef, attrs: &ConvAttrs) -> Option<(Input, Option<CoopTile>)> {
    let input = match out.desc.dtype {
        DType::F16 => Input::F16,
        DType::F32 if coop::reduced_precision_allowed() => Input::F32,
        _ => return None,
    };
    let forced = match attrs.tile.as_deref() {
        None => None,
        Some(name) => Some(*COOP_TILES.iter().find(|t| t.name == name)?),
    };
    Some((input, forced))
}
