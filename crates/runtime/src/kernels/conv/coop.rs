//! Conv2D, Conv2DBackpropInput and Conv2DBackpropFilter on cooperative matrices (tensor
//! cores): the implicit products [N*OH*OW, R*S*C] x [R*S*C, K], [N*H*W, R*S*K] x [R*S*K, C]
//! and [R*S*C, N*OH*OW] x [N*OH*OW, K] of `matmul::coop` with A read as the windows of the
//! input or of dy (NHWC, one group; 1x1 stride-1 unpadded ones as plain products), K split
//! over the grid where the output has few tiles (float32 partial sums added up by
//! `split_sum`, or in the product's epilogue by each tile's last arrival: v8), for float16
//! (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`). Everything else (NCHW, groups,
//! float32) keeps the GEMM (`gemm.rs`). How K is split (v7): a wave model (`plan_split`),
//! uniformly or only for the tile rows past the last full wave (v8: in the same launch).
//! Variants and H200 figures: bench/NOTES-coop.md (v5-v8).

use crate::kernel::{DeviceRef, KernelContext};
use std::sync::OnceLock;

use crate::kernel::{MAX_GROUPS_X, TensorDesc};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::matmul::coop::{
    self, COOP_64X64_2X2V, COOP_64X64X32_2X2W1F, COOP_64X64X64_2X2W1FS, COOP_64X128X32_2X4WG1F,
    COOP_64X128X32_2X4WG1FP, COOP_128X64X32_4X2WG1FP, COOP_128X64X64_4X2WG1F, COOP_128X128_2X4VG,
    COOP_128X128X64_2X4VG1, COOP_128X128X64_2X4WG1F, COOP_128X128X64_2X4WG1FP,
    COOP_128X128X64_4X4WG1FSE8, COOP_TILES, CoopSpec, CoopTile, Input, Launch, coop_mode, fits,
    load_width,
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
/// rounded by `split_sum`) as the wave model of `plan_split` says.
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
    let spec = wgrad_spec(tile, lanes, input, g, plain, emulate);
    if !fits(ctx, &spec) {
        return Ok(false);
    }
    let plan = plan_split(&tile, m, n, k, true, out_layout(ctx, input));
    let mut conv = if plain { [0; 16] } else { window_words(g) };
    conv[15] = k;
    let l = Launch {
        m,
        n,
        k,
        batches: 1,
        // A: x as K x M ([N*H*W, C] for 1x1; strides unused through the windows), B: dy.
        strides: [1, g.c, n, 1],
        dims: vec![],
        conv,
        aux: [0; 24],
        row_tiles: None,
    };
    record_plan(ctx, op, input, spec, &l, plan, x, dy, out)?;
    Ok(true)
}

/// How K is split (`plan_split`): the first `head` tile rows of C unsplit (all of them
/// where `splits` is 1), the others in `splits` splits of `kc` rows of K, added up by the
/// last arrival of each tile (`last`) or by `split_sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SplitPlan {
    head: usize,
    splits: usize,
    kc: usize,
    /// The splits added up in the product's epilogue by each tile's last arrival
    /// (`CoopSpec::sum_last`) rather than by `split_sum` (where that applies).
    last: bool,
}

/// Records `spec` (its non-split form; the filter gradient's is split with one split) on
/// `l` (M x N x K, one batch; p.ftap = conv[15] of the unsplit form) as `plan` says: the
/// head's tile rows unsplit into `out`, the rest as float32 partial sums of `plan.splits`
/// slices (their rows only) added up by `split_sum` into those rows of `out`.
#[allow(clippy::too_many_arguments)]
fn record_plan(
    ctx: &KernelContext,
    op: &str,
    input: Input,
    spec: CoopSpec,
    l: &Launch,
    plan: SplitPlan,
    a: &DeviceRef,
    b: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let (m, n, k) = (l.m, l.n, l.k);
    let bm = spec.tile.bm as usize;
    let tiles_y = m.div_ceil(bm);
    let relaunch = |batches: usize, ftap: usize, row_tiles: Option<(usize, usize)>| {
        let mut conv = l.conv;
        conv[15] = ftap;
        Launch {
            m,
            n,
            k,
            batches,
            strides: l.strides,
            dims: vec![],
            conv,
            aux: l.aux,
            row_tiles,
        }
    };
    if stream_k() && !spec.phase && !spec.wgrad {
        // Stream-K (`CoopSpec::stream_k`): one wave of workgroups over every tile's K tiles.
        let mut s = spec;
        s.split = true;
        s.out_f32 = false;
        s.sum_last = true;
        s.stream_k = true;
        s.vout = vout_ok(&s, n);
        let tiles = tiles_y * n.div_ceil(spec.tile.bn as usize);
        let kt = k.div_ceil(spec.tile.bk as usize);
        let total = tiles * kt;
        let groups = wave_size(&spec.tile).min(total);
        // The most workgroups covering one tile: the slices of `part`.
        let wg_of = |it: usize| ((it + 1) * groups - 1) / total;
        let slices = (0..tiles)
            .map(|i| wg_of((i + 1) * kt - 1) - wg_of(i * kt) + 1)
            .max()
            .unwrap_or(1);
        // (The slices within one binding: else the plan below.)
        let part_bytes = slices * m * n * 4;
        if fits(ctx, &s)
            && (total + 1) * groups <= u32::MAX as usize
            && part_bytes <= ctx.limits().max_storage_buffer_binding_size as usize
            && let Some(arrivals) = ctx.arrival_counters(tiles)?
        {
            tracing::debug!(
                "{op} {m}x{n}x{k}: cooperative {} stream-K, {groups} workgroups over {tiles} tiles x {kt} K tiles (up to {slices} per tile)",
                s.specialization()
            );
            let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[slices, m, n]))?;
            return coop::launch_with(
                ctx,
                op,
                &s,
                &relaunch(groups, l.conv[15], None),
                a,
                b,
                out,
                &[&part, &arrivals],
            );
        }
        // (Else, N not a multiple of the vector epilogue's width or too many tiles for the
        // counters: the plan below.)
    }
    let what = if plan.splits == 1 {
        String::new()
    } else if plan.head == 0 {
        format!(" in {} splits of {}", plan.splits, plan.kc)
    } else {
        format!(
            ": {} of {tiles_y} tile rows unsplit, the rest in {} splits of {}",
            plan.head, plan.splits, plan.kc
        )
    };
    if plan.head > 0 && plan.splits > 1 && plan.last && one_launch() {
        // Head and tail in one launch (`CoopSpec::head_tail`): the head's tiles whole, the
        // tail's split and summed by each tile's last arrival.
        let mut s = spec;
        s.split = true;
        s.out_f32 = false;
        s.sum_last = true;
        s.head_tail = true;
        s.vout = vout_ok(&s, n);
        let tiles_x = n.div_ceil(spec.tile.bn as usize);
        let gx = plan.head * tiles_x + (tiles_y - plan.head) * tiles_x * plan.splits;
        if fits(ctx, &s)
            && gx <= MAX_GROUPS_X as usize
            && let Some(arrivals) = ctx.arrival_counters(tiles_y * tiles_x)?
        {
            tracing::debug!(
                "{op} {m}x{n}x{k}: cooperative {}{what} (one launch, summed by the last arrival)",
                s.specialization()
            );
            let rows = m - plan.head * bm;
            let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[plan.splits, rows, n]))?;
            let tail = Some((plan.head, tiles_y - plan.head));
            return coop::launch_with(
                ctx,
                op,
                &s,
                &relaunch(plan.splits, plan.kc, tail),
                a,
                b,
                out,
                &[&part, &arrivals],
            );
        }
    }
    if plan.splits == 1 || plan.head > 0 {
        let mut s = spec;
        s.out_f32 = false;
        s.vout = vout_ok(&s, n);
        tracing::debug!("{op} {m}x{n}x{k}: cooperative {}{what}", s.specialization());
        let rows = (plan.splits > 1).then_some((0, plan.head));
        coop::launch(ctx, op, &s, &relaunch(1, l.conv[15], rows), a, b, out)?;
        if plan.splits == 1 {
            return Ok(());
        }
    }
    let r0 = plan.head * bm;
    let rows = m - r0;
    let tail = (plan.head > 0).then_some((plan.head, tiles_y - plan.head));
    if plan.last {
        // The split sum in the product's epilogue (`CoopSpec::sum_last`): the last workgroup
        // of each tile adds up its float32 slices and writes the output; no sum launch.
        let mut s = spec;
        s.split = true;
        s.out_f32 = false;
        s.sum_last = true;
        s.vout = vout_ok(&s, n);
        let tiles = tiles_y * n.div_ceil(spec.tile.bn as usize);
        if fits(ctx, &s)
            && let Some(arrivals) = ctx.arrival_counters(tiles)?
        {
            tracing::debug!(
                "{op} {m}x{n}x{k}: cooperative {}{what} (summed by the last arrival)",
                s.specialization()
            );
            let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[plan.splits, rows, n]))?;
            return coop::launch_with(
                ctx,
                op,
                &s,
                &relaunch(plan.splits, plan.kc, tail),
                a,
                b,
                out,
                &[&part, &arrivals],
            );
        }
        // (Else, N not a multiple of the vector epilogue's width or too many tiles for the
        // counters: the split sum.)
    }
    let mut s = spec;
    s.split = true;
    s.out_f32 = true;
    s.vout = vout_ok(&s, n);
    tracing::debug!("{op} {m}x{n}x{k}: cooperative {}{what}", s.specialization());
    let part = ctx.temp_tensor(TensorDesc::new(DType::F32, &[plan.splits, rows, n]))?;
    coop::launch(
        ctx,
        op,
        &s,
        &relaunch(plan.splits, plan.kc, tail),
        a,
        b,
        &part,
    )?;
    // The rows of `out` from r0 on (`plan_split` checks the alignment of that offset).
    let dst = DeviceRef {
        desc: TensorDesc::new(out.desc.dtype, &[rows, n]),
        addr: out.addr + (r0 * n * out.desc.dtype.size()) as u64,
    };
    split_sum(ctx, op, input, plan.splits, rows * n, &part, &dst)
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
        sum_last: false,
        head_tail: false,
        stream_k: false,
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
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CONV_COOP_SPLIT", "0") && !v4_choice())
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
    if mn.is_multiple_of(4) && !old_split_sum() {
        return split_sum4(ctx, op, input, splits, mn, part, out);
    }
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
    let pb = ctx.bind(part)?;
    let ob = ctx.bind_bytes(out.addr, out.desc.byte_size().next_multiple_of(4))?;
    ctx.dispatch(
        &pipeline,
        &params(&[to_u32(op, mn)?, to_u32(op, splits)?, to_u32(op, words)?, 0]),
        &[pb, ob],
        [to_u32(op, gx)?, to_u32(op, gy)?, 1],
    )
}

fn to_u32(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| crate::Error::InvalidArgument(format!("{op}: {v} elements are too many")))
}

/// `TFWGPU_CONV_COOP_SUM=8`: v5b's split sum (two floats per invocation, 8 rows of splits)
/// instead of v7's four-float one. Read once per process.
fn old_split_sum() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env_is("TFWGPU_CONV_COOP_SUM", "8"))
}

/// v7's split sum (M * N a multiple of 4): an invocation adds up four consecutive floats
/// (one 16-byte load per split) of every ROWS-th split; a workgroup of 256 is ROWS rows of
/// 256 / ROWS such invocations, whose rows are added in order through workgroup memory
/// (ROWS = 1: no barrier). The order of the additions depends on the split count only.
const SPLIT_SUM4_WGSL: &str = "struct Params { mn4: u32, splits: u32, _pad0: u32, _pad1: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<OUT>;
ACC_DECL
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = lid % COLSu;
    let row = lid / COLSu;
    let j = (wid.y * 65535u + wid.x) * COLSu + col;
    var s = vec4<f32>(0.0, 0.0, 0.0, 0.0);
    if j < p.mn4 {
        var z = row;
        for (; z + ROWSu < p.splits; z += 2u * ROWSu) {
            let u = part[z * p.mn4 + j];
            let v = part[(z + ROWSu) * p.mn4 + j];
            s += u;
            s += v;
        }
        if z < p.splits {
            s += part[z * p.mn4 + j];
        }
    }
ROWS_SUM
    if row == 0u && j < p.mn4 {
        STORE
    }
}
";

/// The rows of `SPLIT_SUM4_WGSL` for `splits`: about four loads per invocation, at most 32
/// rows (8 invocations of 16 bytes per row: one 128-byte line).
fn split_sum_rows(splits: usize) -> u32 {
    (splits.div_ceil(4).next_power_of_two()).clamp(1, 32) as u32
}

fn split_sum4(
    ctx: &KernelContext,
    op: &str,
    input: Input,
    splits: usize,
    mn: usize,
    part: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let dtype = match input {
        Input::F16 => DType::F16,
        Input::F32 => DType::F32,
    };
    let rows = split_sum_rows(splits);
    let cols = 256 / rows;
    let pipeline = ctx.pipeline(
        PipelineKey::new("conv_coop", Some(dtype), format!("split_sum4_r{rows}")),
        || {
            let (ty, store) = match input {
                Input::F16 => (
                    "vec2<u32>",
                    "out[j] = vec2<u32>(pack2x16float(s.xy), pack2x16float(s.zw));",
                ),
                Input::F32 => ("vec4<f32>", "out[j] = s;"),
            };
            let (decl, sum) = if rows == 1 {
                (String::new(), String::new())
            } else {
                (
                    "var<workgroup> acc: array<vec4<f32>, 256>;".to_string(),
                    format!(
                        "    acc[lid] = s;
    workgroupBarrier();
    if row == 0u && j < p.mn4 {{
        for (var g = 1u; g < {rows}u; g += 1u) {{
            s += acc[g * {cols}u + col];
        }}
    }}
"
                    ),
                )
            };
            ShaderSource::new(
                SPLIT_SUM4_WGSL
                    .replace("OUT", ty)
                    .replace("ACC_DECL", &decl)
                    .replace("ROWS_SUM\n", &sum)
                    .replace("ROWSu", &format!("{rows}u"))
                    .replace("COLSu", &format!("{cols}u"))
                    .replace("STORE", store),
            )
        },
    )?;
    let mn4 = mn / 4;
    let groups = mn4.div_ceil(cols as usize);
    let gx = groups.min(MAX_GROUPS_X as usize);
    let gy = groups.div_ceil(gx);
    let pb = ctx.bind(part)?;
    let ob = ctx.bind_bytes(out.addr, out.desc.byte_size().next_multiple_of(8))?;
    ctx.dispatch(
        &pipeline,
        &params(&[to_u32(op, mn4)?, to_u32(op, splits)?, 0, 0]),
        &[pb, ob],
        [to_u32(op, gx)?, to_u32(op, gy)?, 1],
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
    } else if n >= 128 && m >= 128 && !v6_wgrad() {
        // v7: 16 subgroups (the forward's best tile for 128+ columns, v6).
        COOP_128X128X64_4X4WG1FSE8
    } else {
        COOP_128X128X64_2X4WG1F
    }
}

/// `TFWGPU_CONV_COOP_WGRAD=v6`: the filter gradient's v6 tiles (8 subgroups on 128 x 128).
/// Read once per process.
fn v6_wgrad() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env_is("TFWGPU_CONV_COOP_WGRAD", "v6"))
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
    *ON.get_or_init(|| crate::env_is("TFWGPU_CONV_COOP_V4", "1"))
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
    let one_tap = g.r == 1 && g.s == 1;
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
        None if plain => choose_conv_tile(input, false, true, true, m, n, k, ac),
        None => {
            let t = choose_conv_tile(input, bwd_input, false, one_tap, m, n, k, ac);
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
        sum_last: false,
        head_tail: false,
        stream_k: false,
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
            row_tiles: None,
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
            row_tiles: None,
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
            row_tiles: None,
        }
    };
    // (A persistent product's workgroups walk the tiles: no split, no head and tail.)
    let plan = if split_allowed() && !spec.persists() {
        plan_split(&spec.tile, m, n, k, false, out_layout(ctx, input))
    } else {
        SplitPlan {
            head: 0,
            splits: 1,
            kc: k,
            last: false,
        }
    };
    record_plan(ctx, op, input, spec, &l, plan, a, f, out)?;
    Ok(true)
}

/// `TFWGPU_CONV_COOP_PHASES=0`: strided input gradients through v5b's strided windows (a
/// quarter of the products nonzero at stride 2) instead of one product per output phase.
/// Read once per process.
fn phases_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CONV_COOP_PHASES", "0") && !v4_choice())
}

/// How the output phases of a strided input gradient that no tap reaches (1x1 filters at
/// stride 2: three of four) get their zeros: the one phase with taps writes them beside its
/// own results where it covers them, else one clear of dx before the products;
/// `TFWGPU_CONV_COOP_PHASE_ZEROS=clear` always clears (measurements). Read once per process.
/// (The phase kernel with K = 0 for each such phase, `=kernel`, measured slower on the H200,
/// NOTES-coop v6 request 1: GPU 0.109 ms against 0.0505 by the fill; removed.)
fn phase_zeros_clear() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env_is("TFWGPU_CONV_COOP_PHASE_ZEROS", "clear"))
}

/// `TFWGPU_CONV_COOP_PHASE_MERGE=0`: one launch per output phase of a strided input
/// gradient instead of one launch for all of them (grid z = the phase) where they have the
/// same rows and are at most 4. Read once per process.
fn phase_merge() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CONV_COOP_PHASE_MERGE", "0"))
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
        sum_last: false,
        head_tail: false,
        stream_k: false,
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
    // dx first ("clear").
    let zero = phases.iter().any(|p| k_of(p) == 0);
    let taps: Vec<&Phase> = phases.iter().filter(|p| k_of(p) > 0).collect();
    let fill = zero
        && !phase_zeros_clear()
        && taps.len() == 1
        && taps[0].hy == g.h.div_ceil(g.sh)
        && taps[0].wx == g.w.div_ceil(g.sw);
    let clear = zero && !fill;
    let run = taps;
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
    // (A 1x1 filter: every phase is one tap; see `choose_conv_tile`.)
    let one_tap = g.r == 1 && g.s == 1;
    let mut plan = vec![];
    for grp in groups.into_iter().filter(|grp| !grp.is_empty()) {
        let (hy, wx) = (grp[0].hy, grp[0].wx);
        let (m, n) = (g.n * hy * wx, g.c);
        let k = grp.iter().map(|p| k_of(p)).max().unwrap_or(0);
        let tile = match forced {
            Some(t) => t,
            None => {
                let t = choose_conv_tile(input, true, false, one_tap, m, n, k.max(64), ac);
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
            row_tiles: None,
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

/// How K is split over the grid's z for a product of M x N x K on `tile` (`always`: the
/// filter gradient, whose output has few tiles and K is long; else forward and input
/// gradient).
///
/// v7 (`split_model`): the plan of least modelled time. A wave model: `tiles * s`
/// workgroups run in waves of SMs x workgroups per SM (`wave`), each taking `kt / s` K tiles
/// plus F = 3 K tiles of fixed cost (prologue, epilogue, first loads) at the tile's t_k per
/// K tile; split K adds the float32 partial sums written and read again (8 B per element
/// per split at 3 TB/s) and the sum's cost (`sum_cost`: a launch, or v8's sum in the
/// epilogue). Plans: K split uniformly in s (`best_splits`; forward and input gradient only
/// below one wave of tiles), or, where the tiles make one or more full waves and a partial
/// last one, the full waves' tile rows unsplit and only the rest split: v8, in the same
/// launch where the tail is summed in the epilogue (`one_launch`; e.g. 196 tiles = 132 +
/// 64 in two splits, r50_7's filter gradient 144 = 132 + 12 in five), else (v7, filter
/// gradients only) in a second launch after the first has drained, with `TAIL_US` more. The
/// head's rows must end at an offset of `out` a binding may start at. `TFWGPU_CONV_COOP_TAIL=0`: no
/// head/tail plans; `=force`: the head/tail plan wherever there is one (tests).
/// `TFWGPU_CONV_COOP_WAVE=n`: n workgroups per wave (tests). `TFWGPU_CONV_COOP_SPLIT_MODEL=0`:
/// v5's rule (about 264 workgroups, each split at least 4 K tiles; forward and input
/// gradient only below 66 tiles). `TFWGPU_CONV_COOP_SPLITS=n`: n uniform splits (at most one
/// per K tile) wherever a split applies.
fn plan_split(
    tile: &CoopTile,
    m: usize,
    n: usize,
    k: usize,
    always: bool,
    (esize, align): (usize, usize),
) -> SplitPlan {
    let bk = tile.bk as usize;
    let bm = tile.bm as usize;
    let uniform = |s: usize| {
        let kc = k.div_ceil(s.max(1)).next_multiple_of(bk);
        let splits = k.div_ceil(kc).max(1);
        SplitPlan {
            head: 0,
            splits,
            kc,
            last: splits > 1 && sum_cost(tile, splits).1,
        }
    };
    let (tiles_x, tiles_y) = (n.div_ceil(tile.bn as usize), m.div_ceil(bm));
    let tiles = tiles_x * tiles_y;
    let kt = k.div_ceil(bk).max(1);
    if let Some(s) = forced_splits() {
        return uniform(s.clamp(1, kt));
    }
    if !split_model() {
        // v5's rule: only below half the SMs' worth of tiles for forward and input
        // gradient; until ~264 workgroups, each split at least 4 K tiles long.
        if !always && tiles >= 66 {
            return uniform(1);
        }
        let max_splits = k.div_ceil(4 * bk).max(1);
        return uniform(264usize.div_ceil(tiles).clamp(1, max_splits));
    }
    let wave = wave_size(tile);
    let (best, best_cost) = if !always && tiles >= wave {
        (uniform(1), model_cost(tile, tiles, kt, 1, m * n, wave))
    } else {
        let (s, c) = best_splits(tile, tiles, kt, m * n, wave);
        (uniform(s), c)
    };
    // Head/tail: the tile rows of the full waves unsplit, the rest split; in one launch
    // (v8, `one_launch`) where the tail is summed by its last arrivals and N fits the
    // vector epilogue (8 halves, or 4 floats).
    let tail_mode = tail_mode();
    let head = (tiles / wave) * wave / tiles_x;
    let vec_ok = n.is_multiple_of(if esize == 2 { 8 } else { 4 });
    let one = one_launch() && vec_ok && last_mode() != Last::Off;
    // (Filter gradients only: request 1's forward and input-gradient tails, 196 tiles = 132
    // + 64 in two splits, lost 5-10% against one launch of two waves; r50_7's filter
    // gradient, 132 + 12 tiles, gained 22% against two waves.)
    if tail_mode != Tail::Off
        && (always || one || tail_mode == Tail::Force)
        && head > 0
        && head < tiles_y
        && (head * bm * n * esize).is_multiple_of(align)
    {
        let rest = tiles - head * tiles_x;
        let rows = m - head * bm;
        let (s, c) = best_splits(tile, rest, kt, rows * n, wave);
        let s = if tail_mode == Tail::Force {
            s.max(2).min(kt)
        } else {
            s
        };
        let plan = SplitPlan { head, ..uniform(s) };
        let launch = if one && plan.last { 0.0 } else { TAIL_US };
        let cost = model_cost(tile, head * tiles_x, kt, 1, 0, wave) + c + launch;
        if plan.splits > 1 && (cost < best_cost || tail_mode == Tail::Force) {
            return plan;
        }
    }
    best
}

/// The output's element size and the device's binding offset alignment (`plan_split`).
fn out_layout(ctx: &KernelContext, input: Input) -> (usize, usize) {
    let esize = match input {
        Input::F16 => 2,
        Input::F32 => 4,
    };
    (
        esize,
        ctx.limits().min_storage_buffer_offset_alignment as usize,
    )
}

/// The uniform split of K before v7 (`TFWGPU_CONV_COOP_SPLIT_MODEL=0`) or v7's uniform
/// choice: (splits, rows of K per split). For tests and the model's unit test.
#[cfg(test)]
fn split_k(tile: &CoopTile, m: usize, n: usize, k: usize, always: bool) -> (usize, usize) {
    let bk = tile.bk as usize;
    let tiles = m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize);
    let kt = k.div_ceil(bk).max(1);
    let wave = wave_size(tile);
    let s = if !always && tiles >= wave {
        1
    } else {
        best_splits(tile, tiles, kt, m * n, wave).0
    };
    let kc = k.div_ceil(s).next_multiple_of(bk);
    (k.div_ceil(kc), kc)
}

/// SMs of the GPU the split model is for (the H200's 132; wgpu does not tell).
const SMS: usize = 132;

/// Workgroups of `tile` in one wave: SMs x workgroups per SM (v3/v6 driver statistics: the
/// 128-row tiles hold one per SM by registers or workgroup memory; the 64 x 64 tiles of 4
/// subgroups, 22.5 KiB, two), or `TFWGPU_CONV_COOP_WAVE`.
fn wave_size(tile: &CoopTile) -> usize {
    static WAVE: OnceLock<Option<usize>> = OnceLock::new();
    let forced = *WAVE.get_or_init(|| {
        std::env::var("TFWGPU_CONV_COOP_WAVE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&w: &usize| w > 0)
    });
    forced.unwrap_or_else(|| {
        if tile.bm * tile.bn <= 64 * 64 && tile.subgroups() <= 4 {
            2 * SMS
        } else {
            SMS
        }
    })
}

/// The model's time (us) of `tiles` output tiles of `kt` K tiles in `s` splits (`mn`
/// elements of C for the partial sums); see `plan_split`.
fn model_cost(tile: &CoopTile, tiles: usize, kt: usize, s: usize, mn: usize, wave: usize) -> f64 {
    // Time per K tile of 64 (us): ~1.5 for 128 x 128 in 16 subgroups (conv16: r50_14
    // forward, 98 workgroups of 36 K tiles in 0.054 ms), in proportion to the tile's area,
    // 25% more for fewer subgroups.
    let area = (tile.bm * tile.bn) as f64 / (128.0 * 128.0);
    let sub = if tile.subgroups() >= 16 { 1.0 } else { 1.25 };
    let t_k = 1.5 * area * sub * tile.bk as f64 / 64.0;
    let waves = (tiles * s).div_ceil(wave) as f64;
    let run = waves * (kt.div_ceil(s) as f64 + 3.0) * t_k;
    if s == 1 {
        run
    } else {
        run + (s * mn * 8) as f64 / 3.0e6 + sum_cost(tile, s).0
    }
}

/// The split sum's fixed cost (us): v7 request 1 measured 11-14 us of GPU time for every
/// split sum from 4 to 24 MB of partial sums (a dependent launch after the product).
const SUM_US: f64 = 9.0;

/// The sum in the epilogue (`CoopSpec::sum_last`, v8): a fixed part (us: the partial
/// slice written, two device-scope barriers, the arrival) and the last arrival's reads of
/// every slice of its tile (bytes per us that one SM reads from L2; conv18 request 1: two
/// slices of 128 x 128 cost ~2.4 us of GPU time against 2.6 modelled, fourteen ~9.7 us
/// against 9.2).
const LAST_US: f64 = 1.5;
const LAST_SM_BYTES_PER_US: f64 = 120.0e3;

/// The model's cost (us) of adding up `s` splits of `tile`'s partial sums beyond their
/// traffic, and whether the product's epilogue does it (`CoopSpec::sum_last`) rather than
/// `split_sum`'s launch, as `TFWGPU_CONV_COOP_LAST` says.
fn sum_cost(tile: &CoopTile, s: usize) -> (f64, bool) {
    let last = LAST_US + (s * (tile.bm * tile.bn) as usize * 4) as f64 / LAST_SM_BYTES_PER_US;
    match last_mode() {
        Last::Off => (SUM_US, false),
        Last::Force => (last, true),
        Last::Model if last < SUM_US => (last, true),
        Last::Model => (SUM_US, false),
    }
}

/// `TFWGPU_CONV_COOP_STREAMK=1`: forward and stride-1 / strided (not by phase) input
/// gradients through stream-K (`CoopSpec::stream_k`, one wave of `wave_size` workgroups)
/// wherever its vector epilogue and the arrival counters apply. Off by default (not yet
/// measured on a GPU).
fn stream_k() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env_is("TFWGPU_CONV_COOP_STREAMK", "1"))
}

/// `TFWGPU_CONV_COOP_ONE_LAUNCH=0`: head/tail plans in two launches (v7) even where the
/// tail is summed by its last arrivals; default one launch (`CoopSpec::head_tail`), and
/// head/tail plans for forward and input-gradient products too. Read once per process.
fn one_launch() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CONV_COOP_ONE_LAUNCH", "0"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    Off,
    Model,
    Force,
}

/// `TFWGPU_CONV_COOP_LAST`: `0` split sums always through `split_sum` (v7), `force` in the
/// product's epilogue wherever that applies, else as the model says (`sum_cost`). Read once
/// per process.
fn last_mode() -> Last {
    static MODE: OnceLock<Last> = OnceLock::new();
    *MODE.get_or_init(
        || match crate::env_word("TFWGPU_CONV_COOP_LAST").as_deref() {
            Some("0") => Last::Off,
            Some("force") => Last::Force,
            _ if !split_model() => Last::Off,
            _ => Last::Model,
        },
    )
}

/// A head/tail plan's second product launch (us): request 1's tails ran ~8 us longer than
/// their K tiles (wide forward, 128 workgroups of 9 K tiles: 25.8 us against 18).
const TAIL_US: f64 = 8.0;

/// The uniform split count of least modelled time, 1..=kt, and that time.
fn best_splits(tile: &CoopTile, tiles: usize, kt: usize, mn: usize, wave: usize) -> (usize, f64) {
    let mut best = (1, model_cost(tile, tiles, kt, 1, mn, wave));
    for s in 2..=kt.min(4096) {
        let c = model_cost(tile, tiles, kt, s, mn, wave);
        if c < best.1 {
            best = (s, c);
        }
    }
    best
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    Off,
    Model,
    Force,
}

/// `TFWGPU_CONV_COOP_TAIL`: `0` no head/tail plans, `force` wherever one exists, else the
/// model's choice. Read once per process.
fn tail_mode() -> Tail {
    static MODE: OnceLock<Tail> = OnceLock::new();
    *MODE.get_or_init(
        || match crate::env_word("TFWGPU_CONV_COOP_TAIL").as_deref() {
            Some("0") => Tail::Off,
            Some("force") => Tail::Force,
            _ => Tail::Model,
        },
    )
}

/// `TFWGPU_CONV_COOP_SPLIT_MODEL=0`: v5's split rule. Read once per process.
fn split_model() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CONV_COOP_SPLIT_MODEL", "0"))
}

/// `TFWGPU_CONV_COOP_SPLITS=n`: the split count wherever K is split (for measurements and
/// tests). Read once per process.
fn forced_splits() -> Option<usize> {
    static N: OnceLock<Option<usize>> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TFWGPU_CONV_COOP_SPLITS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The tile of a Conv2D forward or input-gradient product of M x N x K (`ac`: channels of
/// A's windows; `plain`: a 1x1 product without windows). v5 (NOTES-coop.md): the MatMul v4
/// loop (16-byte loads, K 64 in one buffer, unconditional staging) on 128 x 64 in 8
/// subgroups (`c128x64x64_4x2wg1f`), or on 128 x 128 (`c128x128x64_2x4wg1f`) for more than
/// 128 columns and ~100 tiles or more; 64 x 64 `c64x64x64_2x2w1fs` for M <= 64. v6 (conv16
/// requests 1-2): the windowed products with 128+ columns, ~100 tiles of 128 x 128 or more and
/// K >= 512 on 128 x 128 in 16 subgroups (`c128x128x64_4x4wg1fse8`, 111 registers: twice the
/// warps per SM), 64 x 64 for plain products with N and K at most 64. v9: plain products on
/// 128 x 128 with K <= 128 on its persistent twin (`c128x128x64_2x4wg1fp`). v10 / v10b
/// (session 20, below): the K-32 tiles within 24 KiB (two workgroups per SM on the H200's
/// driver) for plain products with small K and for the products of a 1x1 filter with strides
/// (`one_tap`: the filter is 1 x 1, so each window is one tap of K = `ac` channels). v11
/// (session 21): plain products with 128+ columns and K >= 512 on v6's 16-subgroup tile too.
/// `TFWGPU_CONV_COOP_V4=1`: session 5's choice (v3 measurements: Conv2D forward
/// `c128x128x32_2x4vg`, backprop input with dy channels a multiple of 64
/// `c128x128x64_2x4vg1`, 64 x 64 where M or N is at most 64).
#[allow(clippy::too_many_arguments)]
fn choose_conv_tile(
    input: Input,
    bwd_input: bool,
    plain: bool,
    one_tap: bool,
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
    // v10 (session 20, bench/data/2026-12-02-s20-occ20-r3-*): this driver keeps one workgroup
    // per SM from 28 KiB of workgroup memory (the occupancy probe), so the K-64 tiles (35-45
    // KiB) each ran alone on their SM; the K-32 tiles of 22-23 KiB run two per SM. Plain
    // products with K <= 256 take them (persistent): GPU busy 15-21% under v9's picks on the
    // 128 x 64 and 64 x 64 rows (r50_56 256 -> 64 forward 40 us against 48, 64 -> 64 forward
    // and input gradient 20 against 25), 5-9% on the 128 x 128 rows with K <= 128 (r50_56
    // 64 -> 256 forward 52.5 against 58).
    // v10b (bench/data/2026-12-02-s20-occ20-r6-*): the stride-2 1x1 products (windowed, one
    // tap: K = the channels) on the K-32 tiles too, 8-11% under v10's tiles in both processes
    // (forward 25 us against 28, the input gradient's phases 42-43 against 47); K-128 plain
    // products with N > 128 back on the persistent 128 x 128 tile (the 64 x 128 one was 2-3%
    // slower there). Only 1x1 filters count as one tap: a one-tap phase of a 3x3 stride-2
    // input gradient, or a 7x7 layer of few channels, was not measured on these tiles.
    if m <= 64 || k < 64 {
        COOP_64X64X64_2X2W1FS
    } else if plain && n <= 64 && k <= 64 {
        COOP_128X64X32_4X2WG1FP
    } else if !plain && one_tap && k == ac && k <= 256 && n <= 128 {
        COOP_64X64X32_2X2W1F
    } else if !plain && one_tap && k == ac && k <= 128 && n > 128 && tiles >= 96 {
        COOP_64X128X32_2X4WG1F
    } else if n >= 128
        && k >= 512
        && ((!plain && (tiles >= 96 || (tiles < 66 && split_allowed() && split_model())))
            || (plain
                && (tiles >= 96
                    || ((52..66).contains(&tiles) && split_allowed() && split_model()))))
    {
        // (v7: below half a wave of 128 x 128 tiles, split K fills the GPU with them:
        // r50_7, 52 tiles, in two splits.)
        // v11 (session 21): plain products with K >= 512 too (forwards and input gradients
        // alike: a plain input gradient is a plain product here). GPU busy under v10's
        // 128 x 64 / 128 x 128 K-64 tiles on every such row of three requests (two processes
        // each; bench/data/2026-12-02-s20-occ20-r{7,8}-*, 2026-12-02-s21-occ21-r1-*), 52 to
        // 392 tiles: forwards 1152 -> 128 (3x3-sized) 60 us against 68 (-12%), 4608 -> 512 at
        // 7x7 -6 to -8%, r50_14 1024 -> 256 -8%, r50_28 512 -> 128 -4 to -7%, r50_7 2048 ->
        // 512 -3%, 2304 -> 256 -1 to -2%; input gradients with K 512: -2.5 to -4%. (K 128
        // input gradients were 7-16% slower on it: they keep theirs.) The 52-tile rows ran
        // with K split in two, so below 66 tiles only where K may be split, as for windowed
        // products; 66-95 tiles were not measured and keep their tiles.
        COOP_128X128X64_4X4WG1FSE8
    } else if n > 128 && tiles >= 96 {
        // v9 (session 19, bench/data/2026-12-02-s19-persist-verify-*): plain products with K <= 128 (one or
        // two K tiles) on the persistent twin, whose next M tile's loads overlap this one's
        // last products and stores: GPU busy 5-13% under the plain tile on every such row in
        // two processes (r50_56 64->256 forward and 256->64 input gradient 58 us against 66-67,
        // r50_28 512->128 and the 3x3-sized 1152->128 input gradients 40 / 83 us against 42 /
        // 91); at K 256 0.6-5% (r50_14 input gradient), at K 512+ 1-4% slower.
        if plain && k <= 64 {
            COOP_64X128X32_2X4WG1FP
        } else if plain && k <= 128 {
            COOP_128X128X64_2X4WG1FP
        } else {
            COOP_128X128X64_2X4WG1F
        }
    } else if plain && k <= 256 && n <= 128 {
        COOP_128X64X32_4X2WG1FP
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The split model's choices on the ResNet-50 filter-gradient and 7x7 shapes (v7's
    /// predictions in NOTES-coop.md; splits of whole K tiles of 64).
    #[test]
    fn split_model_choices() {
        let t16 = COOP_128X128X64_4X4WG1FSE8;
        // wide / r50_28 filter gradient: 1152 x 128 x 25088, 9 tiles: one wave of 14 splits.
        assert_eq!(best_splits(&t16, 9, 392, 1152 * 128, 132).0, 14);
        // r50_7 filter gradient: 4608 x 512 x 1568, 144 tiles: uniformly, no split (two
        // waves either way; the partial sums would cost more), but the head/tail plan below
        // beats it.
        assert_eq!(best_splits(&t16, 144, 25, 4608 * 512, 132).0, 1);
        // r50_7 forward / input gradient on 128 x 128: 52 tiles, 72 K tiles: two splits
        // (104 workgroups in one wave).
        assert_eq!(best_splits(&t16, 52, 72, 1568 * 512, 132).0, 2);
        // v8: two splits and three (r50_14's filter gradient) summed in the epilogue, 14
        // (wide's) by the split sum's launch.
        assert!(sum_cost(&t16, 2).1 && sum_cost(&t16, 3).1 && !sum_cost(&t16, 14).1);
        // r50_14 forward (98 tiles, 36 K tiles): no split; and `split_k` never splits a
        // forward product with a wave of tiles or more.
        assert_eq!(best_splits(&t16, 98, 36, 6272 * 256, 132).0, 1);
        assert_eq!(split_k(&t16, 128 * 140, 128, 4608, false), (1, 4608));
        // Head/tail plans: r50_7's filter gradient (36 x 4 tiles): 33 tile rows (132 tiles)
        // unsplit, the last 3 rows (12 tiles) split; none where there is no full wave
        // (r50_14 forward, 98 tiles).
        let lay = (2, 256);
        // (v8: the tail's 5 splits summed in the product's epilogue, where v7's launch sum
        // made 9 the best.)
        let p = plan_split(&t16, 4608, 512, 1568, true, lay);
        assert_eq!((p.head, p.splits, p.last), (33, 5, true), "{p:?}");
        // v8: the forward's head/tail in one launch (132 tile rows whole, the other 64 in two
        // splits summed by their last arrivals: no tail launch, no sum launch).
        let p = plan_split(&t16, 25088, 128, 1152, false, lay);
        assert_eq!((p.head, p.splits, p.last), (132, 2, true), "{p:?}");
        let p = plan_split(&t16, 6272, 256, 2304, false, lay);
        assert_eq!((p.head, p.splits), (0, 1), "{p:?}");
        // A split count gives whole K tiles per split, the last one shorter.
        let (s, kc) = split_k(&t16, 1152, 128, 25088, true);
        assert!(kc.is_multiple_of(64) && s * kc >= 25088 && (s - 1) * kc < 25088);
    }

    /// The float16 conv chooser on the ResNet-50 1x1 products (v9: the persistent 128 x 128
    /// tile for plain products of more than 128 columns with K <= 128; v10 / v10b: the K-32
    /// tiles for plain products with small K and for strided 1x1 filters; v11: the 16-subgroup
    /// tile for plain products with K >= 512).
    #[test]
    fn conv_tile_choices() {
        let pick =
            |bwd, plain, m, n, k| choose_conv_tile(Input::F16, bwd, plain, true, m, n, k, k).name;
        // r50_56 64 -> 256 forward (and 256 -> 64 input gradient): K 64, 256 columns; the same
        // product with K 256 keeps the plain tile.
        assert_eq!(pick(false, true, 100352, 256, 64), "c64x128x32_2x4wg1fp");
        assert_eq!(pick(false, true, 100352, 256, 256), "c128x128x64_2x4wg1f");
        // r50_28 512 -> 128 input gradient: K 128, 512 columns (v10b: the 128 x 128 one).
        assert_eq!(pick(false, true, 25088, 512, 128), "c128x128x64_2x4wg1fp");
        // K 256: the plain tile (r50_14 1024 -> 256 input gradient).
        assert_eq!(pick(false, true, 6272, 1024, 256), "c128x128x64_2x4wg1f");
        // (v11: plain products with K >= 512 on 16 subgroups, with >= 96 tiles or 52-65 (K
        // split): r50_14's forward, r50_7's input gradient and forward; 66-95 tiles and fewer
        // than 52 keep theirs.)
        assert_eq!(pick(false, true, 6272, 256, 1024), "c128x128x64_4x4wg1fse8");
        assert_eq!(pick(false, true, 1568, 2048, 512), "c128x128x64_4x4wg1fse8");
        assert_eq!(pick(false, true, 1568, 512, 2048), "c128x128x64_4x4wg1fse8");
        assert_eq!(pick(false, true, 5120, 256, 1024), "c128x64x64_4x2wg1f");
        assert_eq!(pick(false, true, 1568, 256, 512), "c128x64x64_4x2wg1f");
        // 128 columns or fewer with K <= 256: the persistent 128 x 64 K-32 tile (r50_56
        // 256 -> 64 forward, 64 -> 64); K 512 and more: the 16-subgroup tile (v11, r50_28
        // 512 -> 128 forward); M of one tile, 64 x 64.
        assert_eq!(pick(false, true, 100352, 64, 256), "c128x64x32_4x2wg1fp");
        assert_eq!(pick(false, true, 100352, 64, 64), "c128x64x32_4x2wg1fp");
        assert_eq!(pick(false, true, 25088, 128, 512), "c128x128x64_4x4wg1fse8");
        assert_eq!(pick(false, true, 1568, 512, 4608), "c128x128x64_4x4wg1fse8");
        assert_eq!(pick(false, true, 64, 64, 64), "c64x64x64_2x2w1fs");
        // Windowed products of one tap (1x1 stride 2: r50_56 256 -> 128 forward, K 256, and
        // its input gradient's phases, K 128, 256 columns) on the K-32 tiles; windowed products
        // of several taps keep theirs (a 3x3 layer's K of 9 x 16 = 144, 128 columns; K 1152).
        assert_eq!(pick(false, false, 25088, 128, 256), "c64x64x32_2x2w1f");
        assert_eq!(pick(true, false, 25088, 256, 128), "c64x128x32_2x4wg1f");
        let pick_ac =
            |bwd, m, n, k, ac| choose_conv_tile(Input::F16, bwd, false, false, m, n, k, ac).name;
        assert_eq!(pick_ac(false, 25088, 128, 144, 16), "c128x64x64_4x2wg1f");
        assert_eq!(pick_ac(false, 25088, 256, 128, 64), "c128x128x64_2x4wg1f");
        assert_eq!(
            pick_ac(false, 25088, 128, 1152, 128),
            "c128x128x64_4x4wg1fse8"
        );
        // A one-tap product of a larger filter (a phase of a 3x3 stride-2 input gradient: K =
        // the channels, but not a 1x1 filter) keeps its tile.
        assert_eq!(pick_ac(true, 25088, 128, 128, 128), "c128x64x64_4x2wg1f");
        // Plain, more than 128 columns but fewer than 96 tiles (batch 1), K <= 256: the K-64
        // 128 x 64 tile (the K-32 one was measured at 64 columns only).
        assert_eq!(pick(false, true, 3136, 256, 64), "c128x64x64_4x2wg1f");
    }

    #[test]
    fn split_sum_rows() {
        assert_eq!(super::split_sum_rows(1), 1);
        assert_eq!(super::split_sum_rows(4), 1);
        assert_eq!(super::split_sum_rows(5), 2);
        assert_eq!(super::split_sum_rows(14), 4);
        assert_eq!(super::split_sum_rows(49), 16);
        assert_eq!(super::split_sum_rows(264), 32);
    }
}
