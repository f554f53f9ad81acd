//! norm family: FusedBatchNorm / FusedBatchNormV2 / FusedBatchNormV3 and their gradients
//! FusedBatchNormGrad / V2 / V3, training and inference, NHWC / NCHW (and the 5-D NDHWC /
//! NCDHW), T float32 or float16 with U (statistics, scale, offset) float32.
//!
//! Three shaders: `stats.wgsl` accumulates per-channel partials over chunks of the N*H*W
//! elements (one workgroup per chunk and tile of channels: up to 32 neighbouring channels when
//! the channel is innermost (NHWC), so reads are contiguous, else one; each invocation at most
//! 16 elements, then a tree in shared memory), `finalize.wgsl` combines a channel's partials
//! (again strided, then a tree) and computes the per-channel outputs and coefficients,
//! `apply.wgsl` the elementwise output. NHWC with C % 4 == 0 (float32 and float16) takes
//! `stats_vec4.wgsl` and `apply_vec4_shader` instead: four channels per load, four rows per
//! loop iteration in the statistics (16 rows per invocation, float16 32), one channel quad's
//! coefficients loaded once per apply invocation (2 vec4 per invocation).
//! Training on NHWC with C % 4 == 0 and few rows per channel runs in ONE dispatch instead
//! (`onepass.wgsl`, see `onepass_tc`): a workgroup owns whole channels, folds their rows,
//! computes the per-channel results (`results_fwd.wgsl` / `results_grad.wgsl`, the code
//! `finalize.wgsl` runs too) and re-reads its rows from L2 for the output; used where it
//! measured faster on the H200 (small tensors, 32-byte runs per row).
//! Elsewhere, training on the vec4 layout runs the statistics and the finalize in ONE
//! dispatch (`stats_last.wgsl`, see `stats_last_on`): the statistics workgroups count their
//! arrival on the device's atomic counters and the last one to arrive merges the partials
//! and computes the per-channel results, so two dispatches (statistics, apply) instead of
//! three (request mem6-1 on the H200: span -7 to -12 us per op).
//! The forward statistics are Welford states (count, mean, M2) merged by Chan's
//! formula, so the variance does not cancel; the gradient sums are f32 partial sums combined
//! by trees. No sum runs serially over more than 64 elements per invocation (16 or 32 in the
//! statistics pass, at most 64 in `onepass.wgsl`), nor over more than splits / 256 partials of
//! a channel in `finalize.wgsl` (splits = n / (rows * 256 / tile)).
//!
//! Outputs follow TensorFlow's CPU kernel (`fused_batch_norm_op.cc`):
//! - training: y = (x - mean) * (rsqrt(var + eps) * scale) + offset with the batch mean and the
//!   biased variance var = sum((x - mean)^2) / n; batch_mean and batch_variance are the
//!   running statistics: with exponential_avg_factor f = 1 the batch mean and the Bessel-
//!   corrected variance var * n / max(n - 1, 1), otherwise (1 - f) * old + f * batch (the
//!   variance term (f * n / (n - 1)) * var); reserve_space_1 / 2 are the batch mean and the
//!   biased variance (what the gradient expects).
//! - inference: y from the given mean and variance; batch_mean / batch_variance are copies of
//!   them, and so are reserve_space_1 / 2 (TensorFlow's CPU kernel leaves those two
//!   uninitialized; the gradient with is_training false reads the population statistics).
//! - V3's reserve_space_3 is a float32 scalar 0, as TensorFlow's CPU kernel allocates it.
//! - An empty x gives NaN batch_mean / batch_variance (and here NaN reserve spaces too).
//! - Gradient (training): with coef0 = rsqrt(var + eps) from reserve_space_2,
//!   x_backprop = scale * coef0 * ((dy - mean(dy)) - (x - mean) * coef0^2 * mean(dy * (x - mean))),
//!   scale_backprop = sum(dy * (x - mean)) * coef0, offset_backprop = sum(dy); inference:
//!   x_backprop = dy * scale * coef0. Its reserve outputs are empty ([0]), and an empty x gives
//!   zero scale/offset gradients. TensorFlow's CPU gradient with is_training false accepts only
//!   NHWC (its Python gradient transposes); this kernel also takes NCHW.
//! - f16 tensors are read exactly, computed in f32 and rounded once to f16, as TensorFlow's
//!   CPU kernel casts its float results.

use crate::exec::BufferRange;
use crate::kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d,
};
use crate::kernel_manager::PipelineKey;
use crate::kernels::elementwise::{
    COMMON_WGSL, bind_out, fmt_shape, load_expr, store_stmt, words_for,
};
use crate::kernels::f16conv;
use crate::kernels::fill::fill_bytes;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

const NORM_COMMON: &str = include_str!("common.wgsl");
const STATS_WGSL: &str = include_str!("stats.wgsl");
const STATS_VEC4_WGSL: &str = include_str!("stats_vec4.wgsl");
const FOLD_VEC4_WGSL: &str = include_str!("fold_vec4.wgsl");
const FINALIZE_WGSL: &str = include_str!("finalize.wgsl");
const APPLY_WGSL: &str = include_str!("apply.wgsl");
const ONEPASS_WGSL: &str = include_str!("onepass.wgsl");
const RESULTS_FWD: &str = include_str!("results_fwd.wgsl");
const RESULTS_GRAD: &str = include_str!("results_grad.wgsl");
const STATS_LAST_WGSL: &str = include_str!("stats_last.wgsl");

const V1_DTYPES: &[DType] = &[DType::F32];
const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// Invocations per workgroup of the reduction shaders.
const RWG: usize = 256;
/// Elements per invocation in one chunk of `stats.wgsl`.
const PER_THREAD: usize = 16;
/// Most channels one workgroup of `stats.wgsl` covers.
const MAX_TC: usize = 32;
/// Rows of the per-channel result buffer.
const ROWS: usize = 8;
/// vec4 per invocation of the vec4 apply (`apply_vec4_shader`).
const APPLY_K: usize = 2;
/// Invocations per workgroup of `onepass.wgsl`.
const OWG: usize = 512;
/// Most rows of a channel one invocation of `onepass.wgsl` folds.
const ONEPASS_ROWS: usize = 64;
/// Workgroups `onepass.wgsl` aims at (about two per SM on a 132-SM GPU): channel quads per
/// workgroup halve from 8 until the grid has at least this many.
const ONEPASS_GROUPS: usize = 256;
/// f32 NaN bits.
const NAN_BITS: u32 = 0x7fc0_0000;

/// One row of the registration table: `$op` built by `$kernel` (BatchNorm or BatchNormGrad)
/// as version `$v`.
macro_rules! bn_row {
    ($op:literal, $kernel:ident, $v:literal, $dtypes:expr) => {
        OpDef {
            op: $op,
            type_attr: "T",
            dtypes: $dtypes,
            host_inputs: &[],
            factory: |a| $kernel::build($op, $v, a),
        }
    };
}

/// Registration table.
pub const OPS: &[OpDef] = &[
    bn_row!("FusedBatchNorm", BatchNorm, 1, V1_DTYPES),
    bn_row!("FusedBatchNormV2", BatchNorm, 2, DTYPES),
    bn_row!("FusedBatchNormV3", BatchNorm, 3, DTYPES),
    bn_row!("FusedBatchNormGrad", BatchNormGrad, 1, V1_DTYPES),
    bn_row!("FusedBatchNormGradV2", BatchNormGrad, 2, DTYPES),
    bn_row!("FusedBatchNormGradV3", BatchNormGrad, 3, DTYPES),
];

/// Attributes shared by the forward and gradient ops.
#[derive(Clone, Copy, Debug)]
struct Common {
    name: &'static str,
    version: u8,
    epsilon: f32,
    channels_first: bool,
    training: bool,
}

impl Common {
    fn read(name: &'static str, version: u8, attrs: &Attrs) -> Result<Common> {
        let allowed = if version == 1 { V1_DTYPES } else { DTYPES };
        if let Some(t) = attrs.dtype_opt("T")?
            && !allowed.contains(&t)
        {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={t}"
            )));
        }
        if let Some(u) = attrs.dtype_opt("U")?
            && u != DType::F32
        {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for U={u}"
            )));
        }
        let channels_first = match attrs.get("data_format") {
            None => false,
            Some(AttrValue::Str(s)) if s == "NHWC" || s == "NDHWC" => false,
            Some(AttrValue::Str(s)) if s == "NCHW" || s == "NCDHW" => true,
            Some(other) => bail_invalid!("{name}: Invalid data format {other:?}"),
        };
        Ok(Common {
            name,
            version,
            epsilon: attrs.float_or("epsilon", 1e-4)?,
            channels_first,
            training: attrs.bool_or("is_training", true)?,
        })
    }

    fn dtypes(&self) -> &'static [DType] {
        if self.version == 1 { V1_DTYPES } else { DTYPES }
    }

    /// Checks x (input `i`); returns the (outer, c, inner) view.
    fn view(&self, x: &Operand, what: &str) -> Result<(usize, usize, usize)> {
        let name = self.name;
        let dtype = x.dtype();
        if !self.dtypes().contains(&dtype) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={dtype}"
            )));
        }
        let s = x.shape();
        if s.len() != 4 && s.len() != 5 {
            bail_invalid!(
                "{name}: {what} must be 4 or 5-dimensional, got shape {}",
                fmt_shape(s)
            );
        }
        let cd = if self.channels_first { 1 } else { s.len() - 1 };
        let v = (
            s[..cd].iter().product(),
            s[cd],
            s[cd + 1..].iter().product(),
        );
        words_for(name, dtype, s.iter().product())?;
        Ok(v)
    }

    /// Checks a 1-D float32 per-channel input; `any_len` accepts any length.
    fn vector(&self, x: &Operand, what: &str, c: usize, any_len: bool) -> Result<()> {
        let name = self.name;
        if x.dtype() != DType::F32 {
            bail_invalid!("{name}: {what} must be float32 (U), got {}", x.dtype());
        }
        if x.shape().len() != 1 {
            bail_invalid!(
                "{name}: {what} must be 1-dimensional, got shape {}",
                fmt_shape(x.shape())
            );
        }
        if !any_len && x.shape()[0] != c {
            bail_invalid!(
                "{name}: {what} must have the same number of elements as the channels of x, \
                 got {} and {c}",
                x.shape()[0]
            );
        }
        Ok(())
    }
}

/// The reduction geometry of one call.
#[derive(Clone, Copy, Debug)]
struct Plan {
    c: usize,
    /// Channels per workgroup of `stats.wgsl` (a power of two).
    tc: usize,
    inner: usize,
    rest: usize,
    chunk: usize,
    splits: usize,
    /// float16 with C % 8 == 0: the vec4 apply takes eight channels per invocation (16-byte
    /// loads; only the apply after `stats_last.wgsl`, see `Run::last_apply`).
    x8: bool,
    /// Chunks per arrival group of `stats_last.wgsl` (see `Plan::last_group`).
    group: usize,
}

impl Plan {
    fn new(name: &str, (outer, c, inner): (usize, usize, usize)) -> Result<Plan> {
        let rest = outer * inner;
        // Channels innermost (NHWC): neighbouring invocations take neighbouring channels.
        let tc = if inner == 1 {
            c.next_power_of_two().min(MAX_TC)
        } else {
            1
        };
        let chunk = RWG / tc * PER_THREAD;
        let splits = rest.div_ceil(chunk).max(1);
        if c.saturating_mul(splits) > u32::MAX as usize / 4 {
            return Err(Error::Unimplemented(format!(
                "{name}: {c} channels of {rest} elements are more than one dispatch can cover"
            )));
        }
        Ok(Plan {
            c,
            tc,
            inner,
            rest,
            chunk,
            splits,
            x8: false,
            group: splits,
        })
    }

    /// The geometry of `stats_vec4.wgsl` (float32, channel innermost, C % 4 == 0): tc counts
    /// channel quads per workgroup, each invocation at most PER_THREAD rows of a chunk.
    fn vec4(self, dtype: DType) -> Plan {
        // PER_THREAD rows per invocation for float32: fewer rows and more workgroups (tried
        // with at least 1024 workgroups, request bn2-1) made the small tensors' statistics
        // slower (64x7x7x2048: 16 -> 21 us) and the large ones no faster. float16 twice as
        // many: its loads carry half the bytes, and at 16 rows its statistics ran at the
        // float32 pass's time per row, not per byte (request mem4-1: 64x56x56x256 55.9 us
        // for 103 MB against float32's 74 us for 206 MB). `TFWGPU_NORM_ROWS=16|32|64`
        // forces the rows (measurements).
        static FORCED_ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        let rows = FORCED_ROWS
            .get_or_init(|| {
                crate::env_word("TFWGPU_NORM_ROWS")
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|r| matches!(r, 16 | 32 | 64))
            })
            .unwrap_or(if dtype == DType::F16 {
                2 * PER_THREAD
            } else {
                PER_THREAD
            });
        let tc = (self.c / 4).next_power_of_two().min(MAX_TC);
        let chunk = RWG / tc * rows;
        let splits = self.rest.div_ceil(chunk).max(1);
        Plan {
            tc,
            chunk,
            splits,
            x8: false,
            group: Plan::last_group(splits, RWG / tc),
            ..self
        }
    }

    /// Chunks per arrival group of `stats_last.wgsl` for `splits` chunks and `lanes` lanes
    /// per quad: all of them (one level: the last workgroup merges every chunk's record)
    /// up to 4 records per lane, else about sqrt(splits) (two levels, each workgroup that
    /// merges reads about sqrt(splits) records per quad: 28 instead of 784 on 64x56x56x256
    /// float16).
    fn last_group(splits: usize, lanes: usize) -> usize {
        if let Some(g) = last_opts().group {
            return g.clamp(1, splits.max(1));
        }
        if splits <= 4 * lanes {
            splits.max(1)
        } else {
            (splits as f64).sqrt().ceil() as usize
        }
    }

    /// Arrival counters `stats_last.wgsl` uses: one per tile and group, one per tile.
    fn last_words(&self) -> usize {
        let tiles = (self.c / 4).div_ceil(self.tc);
        tiles * (self.splits.div_ceil(self.group) + 1)
    }

    /// Whether the statistics of `dtype` can run on `stats_vec4.wgsl`.
    fn vec4_stats(&self, ctx: &KernelContext, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::F16)
            && self.inner == 1
            && self.c.is_multiple_of(4)
            && (ctx.limits().min_storage_buffer_offset_alignment as usize).is_multiple_of(16)
    }

    /// Params of every shader; `n`/`words` for the elementwise pass, `groups_x` for the
    /// workgroup-per-item passes.
    #[allow(clippy::too_many_arguments)]
    fn params(
        &self,
        row: u32,
        n: usize,
        words: u32,
        groups_x: u32,
        mode: u32,
        factor: Option<f32>,
        eps: f32,
    ) -> Vec<u8> {
        let rest_inv = 1.0f32 / self.rest as f32;
        let adjust = self.rest as f32 / (self.rest.max(2) - 1) as f32;
        params(&[
            row,
            n as u32,
            words,
            self.c as u32,
            self.inner as u32,
            self.rest as u32,
            self.chunk as u32,
            self.splits as u32,
            groups_x,
            mode,
            factor.is_none_or(|f| f == 1.0) as u32,
            self.tc as u32,
            eps.to_bits(),
            factor.unwrap_or(1.0).to_bits(),
            rest_inv.to_bits(),
            adjust.to_bits(),
            self.group as u32,
            0,
            0,
            0,
        ])
    }
}

/// A grid of `items` workgroups: ([gx, gy, 1], gx).
fn groups(name: &str, items: usize) -> Result<([u32; 3], u32)> {
    let gx = items.clamp(1, crate::kernel::MAX_GROUPS_X as usize);
    let gy = items.div_ceil(gx);
    if gy > crate::kernel::MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{name}: {items} workgroups are more than one dispatch can cover"
        )));
    }
    Ok(([gx as u32, gy as u32, 1], gx as u32))
}

fn stats_shader(dtype: DType, grad: bool) -> String {
    STATS_WGSL
        .replace("$NORM_COMMON", NORM_COMMON)
        .replace("$GRAD", if grad { "true" } else { "false" })
        .replace("$LOAD_X", &load_expr(dtype, "x"))
        .replace("$LOAD_DY", &load_expr(dtype, "dy"))
        .replace("$COMMON", COMMON_WGSL)
}

/// The store of `apply.wgsl` for float32: four words per invocation, p.groups_x (the number
/// of invocations) apart, the four results computed (their loads in flight together) before
/// the stores; one word per invocation left each invocation one load in flight.
const APPLY_STORE_X4: &str = "    if w >= p.groups_x {
        return;
    }
    let w1 = w + p.groups_x;
    let w2 = w1 + p.groups_x;
    let w3 = w2 + p.groups_x;
    let r0 = elem(w);
    var r1 = 0.0;
    var r2 = 0.0;
    var r3 = 0.0;
    if w1 < p.words {
        r1 = elem(w1);
    }
    if w2 < p.words {
        r2 = elem(w2);
    }
    if w3 < p.words {
        r3 = elem(w3);
    }
    out[w] = bitcast<u32>(r0);
    if w1 < p.words {
        out[w1] = bitcast<u32>(r1);
    }
    if w2 < p.words {
        out[w2] = bitcast<u32>(r2);
    }
    if w3 < p.words {
        out[w3] = bitcast<u32>(r3);
    }";

/// Fills the vec4 shaders' element type and conversions (also pool's `pool_vec4.wgsl`): `$XT`
/// (a float32 vec4, or four float16 in a vec2<u32>), `$LD`: `ld` (to vec4<f32>, exact), `st`
/// (from vec4<f32>: float16 rounds to nearest even once) and `rt` (rounds to T), and
/// `$COMMON`. float16 converts two halves at a time (`f16conv`): in hardware where `hw`
/// (`f16conv::f16_hardware`, an adapter that passed the self-test), else in software.
pub(crate) fn vec4_io(src: String, dtype: DType, hw: bool) -> String {
    let (xt, ld) = if dtype == DType::F16 {
        (
            "vec2<u32>",
            format!(
                "{}
fn ld(v: vec2<u32>) -> vec4<f32> {{
    return vec4<f32>(f16x2_to_f32(v.x), f16x2_to_f32(v.y));
}}
fn st(r: vec4<f32>) -> vec2<u32> {{
    return vec2<u32>(f32x2_to_f16(r.xy), f32x2_to_f16(r.zw));
}}
fn rt(r: vec4<f32>) -> vec4<f32> {{
    return ld(st(r));
}}",
                f16conv::f16x2_wgsl(hw)
            ),
        )
    } else {
        (
            "vec4<f32>",
            "fn ld(v: vec4<f32>) -> vec4<f32> {
    return v;
}
fn st(r: vec4<f32>) -> vec4<f32> {
    return r;
}
fn rt(r: vec4<f32>) -> vec4<f32> {
    return r;
}"
            .to_string(),
        )
    };
    src.replace("$XT", xt)
        .replace("$LD", &ld)
        .replace("$COMMON", COMMON_WGSL)
}

/// Whether the vec4 shaders of `dtype` use the hardware float16 conversions, and the pipeline
/// key suffix that tells the two forms apart.
pub(crate) fn vec4_hw(ctx: &KernelContext, dtype: DType) -> Result<(bool, &'static str)> {
    f16conv::choice(ctx, dtype == DType::F16)
}

/// `stats_vec4.wgsl` (before `vec4_io`).
fn stats_vec4_shader(grad: bool) -> String {
    STATS_VEC4_WGSL
        .replace("$NORM_COMMON", NORM_COMMON)
        .replace("$FOLD", FOLD_VEC4_WGSL)
        .replace("$GRAD", if grad { "true" } else { "false" })
}

/// Whether `finalize.wgsl` writes the op's small outputs itself (11 storage bindings).
fn finalize_direct(ctx: &KernelContext) -> bool {
    ctx.limits().max_storage_buffers_per_shader_stage >= 11
}

/// The `$DECLS` functions of the training gradient: `ldy` loads dy, its results, and no
/// fourth small output.
const GRAD_FNS: &str = "fn ldy(e: u32) -> vec4<f32> {
    return ld(dy[e]);
}
fn results(ch: u32, b: f32, c: f32) {
    results_grad(ch, b, c);
}
fn put_space3() {}";
/// The `$DECLS` functions of the training forward: no dy, its results, and the zero of the
/// fifth output (`o4`).
const TRAIN_FNS: &str = "fn ldy(e: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}
fn results(ch: u32, b: f32, c: f32) {
    results_train(ch, b, c);
}
fn put_space3() {
    o4[0] = 0.0;
}";
/// `$PUT_OUT` of the gradient: two small outputs (`o0`, `o1`).
const PUT_OUT_GRAD: &str = "        if row == 0u {
            o0[ch] = v;
        } else if row == 1u {
            o1[ch] = v;
        }";
/// `$PUT_OUT` of the training forward: four small outputs (`o0`..`o3`).
const PUT_OUT_TRAIN: &str = "        if row == 0u {
            o0[ch] = v;
        } else if row == 1u {
            o1[ch] = v;
        } else if row == 2u {
            o2[ch] = v;
        } else {
            o3[ch] = v;
        }";

/// What `onepass.wgsl` and `stats_last.wgsl` take beside their bindings: the `$DECLS`
/// functions, `$PUT_OUT` and `$RESULTS`, for the gradient or the training forward.
fn grad_parts(grad: bool) -> (&'static str, &'static str, &'static str) {
    if grad {
        (GRAD_FNS, PUT_OUT_GRAD, RESULTS_GRAD)
    } else {
        (TRAIN_FNS, PUT_OUT_TRAIN, RESULTS_FWD)
    }
}

fn finalize_shader(direct: bool) -> String {
    let (decls, put) = if direct {
        (
            format!(
                "@group(0) @binding(7) var<storage, read_write> o0: array<f32>;
@group(0) @binding(8) var<storage, read_write> o1: array<f32>;
@group(0) @binding(9) var<storage, read_write> o2: array<f32>;
@group(0) @binding(10) var<storage, read_write> o3: array<f32>;
@group(0) @binding(11) var<storage, read_write> o4: array<f32>;
{TRAIN_FNS}"
            ),
            "    if row == 0u && ch == 0u && p.n == 1u {
        o4[0] = 0.0;
    }
    if row < p.words {
        if row == 0u {
            o0[ch] = v;
        } else if row == 1u {
            o1[ch] = v;
        } else if row == 2u {
            o2[ch] = v;
        } else {
            o3[ch] = v;
        }
    }",
        )
    } else {
        (String::new(), "")
    };
    FINALIZE_WGSL
        .replace("$NORM_COMMON", NORM_COMMON)
        .replace("$DIRECT_DECLS", &decls)
        .replace("$DIRECT_PUT", put)
        .replace("$RESULTS", &format!("{RESULTS_FWD}\n{RESULTS_GRAD}"))
}

/// Storage bindings of group 0 from binding `first` on, one per (name, element type).
fn storage_bindings(first: u32, vars: &[(&str, &str)]) -> String {
    vars.iter()
        .zip(first..)
        .map(|((name, ty), b)| {
            format!("@group(0) @binding({b}) var<storage, read_write> {name}: array<{ty}>;")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The per-channel outputs o0.. (forward: five, gradient: two).
const OUTS: [(&str, &str); 5] = [
    ("o0", "f32"),
    ("o1", "f32"),
    ("o2", "f32"),
    ("o3", "f32"),
    ("o4", "f32"),
];

/// `template` (onepass.wgsl or stats_last.wgsl) with its bindings and the forward's or
/// gradient's parts, before `vec4_io`.
fn training_shader(template: &str, bindings: &str, grad: bool) -> String {
    let (fns, put_out, results) = grad_parts(grad);
    template
        .replace("$NORM_COMMON", NORM_COMMON)
        .replace("$FOLD", FOLD_VEC4_WGSL)
        .replace("$DECLS", &format!("{bindings}\n{fns}"))
        .replace("$GRAD", if grad { "true" } else { "false" })
        .replace("$PUT_OUT", put_out)
        .replace("$RESULTS", results)
}

/// `onepass.wgsl` for the training forward (`grad` false) or gradient, before `vec4_io`.
fn onepass_shader(grad: bool) -> String {
    let inputs: &[(&str, &str)] = if grad {
        &[
            ("dy", "$XT"),
            ("x", "$XT"),
            ("scale", "f32"),
            ("mean_in", "f32"),
            ("var_in", "f32"),
            ("out", "$XT"),
        ]
    } else {
        &[
            ("x", "$XT"),
            ("scale", "f32"),
            ("offset", "f32"),
            ("mean_in", "f32"),
            ("var_in", "f32"),
            ("out", "$XT"),
        ]
    };
    let outs = &OUTS[..if grad { 2 } else { 5 }];
    let bindings = storage_bindings(1, &[inputs, outs].concat());
    training_shader(ONEPASS_WGSL, &bindings, grad).replace("$WGS", &OWG.to_string())
}

/// `stats_last.wgsl` for the training forward (`grad` false) or gradient, before `vec4_io`.
fn stats_last_shader(grad: bool) -> String {
    let inputs: &[(&str, &str)] = if grad {
        &[
            ("dy", "$XT"),
            ("scale", "f32"),
            ("mean_in", "f32"),
            ("var_in", "f32"),
        ]
    } else {
        &[
            ("scale", "f32"),
            ("offset", "f32"),
            ("mean_in", "f32"),
            ("var_in", "f32"),
        ]
    };
    let outs = &OUTS[..if grad { 2 } else { 5 }];
    training_shader(
        STATS_LAST_WGSL,
        &storage_bindings(4, &[inputs, outs].concat()),
        grad,
    )
}

/// Switches of the `stats_last.wgsl` path (read once per process): `TFWGPU_NORM_APPLY_X8=0`
/// keeps the float16 apply after it at four channels per invocation (default eight, 16-byte
/// loads and stores, where C % 8 == 0: request mem6-2 on the H200, 64x56x56x256 float16
/// apply 70.1 -> 67.6 us forward, 105.3 -> 98.7 gradient, the smaller shapes within +-0.7
/// us); `TFWGPU_NORM_GROUP=<chunks>` forces the chunks per arrival group (measurements).
/// (Batching four record loads per lane in the merges, `TFWGPU_NORM_LOADS4=1`, gained nothing
/// on the H200, request mem7-1: statistics pass +0.2 to +1.7 us; removed.)
#[derive(Clone, Copy, Debug)]
struct LastOpts {
    apply_x8: bool,
    /// `TFWGPU_NORM_GROUP=<chunks>`: the chunks per arrival group (at least the chunks: one
    /// level).
    group: Option<usize>,
}

fn last_opts() -> LastOpts {
    use std::sync::OnceLock;
    static OPTS: OnceLock<LastOpts> = OnceLock::new();
    *OPTS.get_or_init(|| {
        let env = crate::env_word;
        LastOpts {
            apply_x8: env("TFWGPU_NORM_APPLY_X8").is_none_or(|v| v != "0"),
            group: env("TFWGPU_NORM_GROUP").and_then(|v| v.parse::<usize>().ok()),
        }
    })
}

/// Storage bindings of `stats_last.wgsl` (the forward's).
const LAST_BINDINGS: u32 = 12;

/// Whether a training batch norm of `plan` (already `Plan::vec4`) on the vec4 shaders takes
/// its statistics and per-channel results in one dispatch (`stats_last.wgsl`, the last
/// workgroup to arrive finalizes) instead of two (statistics, finalize): the vec4 layout with
/// four channels per invocation, 12 storage bindings, and enough of the device's arrival
/// counters (`KernelContext::arrivals`). `TFWGPU_NORM_LAST=0` keeps the two dispatches.
fn stats_last_on(ctx: &KernelContext, plan: &Plan, dtype: DType) -> bool {
    use std::sync::OnceLock;
    static OFF: OnceLock<bool> = OnceLock::new();
    let off = *OFF.get_or_init(|| crate::env_is("TFWGPU_NORM_LAST", "0"));
    !off && plan.vec4_stats(ctx, dtype)
        && ctx.limits().max_storage_buffers_per_shader_stage >= LAST_BINDINGS
        && plan.last_words() <= crate::kernel::ARRIVAL_COUNTERS
}

/// Channel quads per workgroup of `onepass.wgsl` for a training batch norm (forward or
/// gradient) of `plan`, or None where it does not apply: the vec4 layout (NHWC, C % 4 == 0),
/// at most ONEPASS_ROWS rows per invocation, a device with 512-invocation workgroups, their
/// shared memory and the storage bindings, and reads of the channels' rows that measured
/// faster than the three dispatches (see the end). `TFWGPU_NORM_ONEPASS=0` turns it off,
/// `=1` drops the size limits, and `TFWGPU_NORM_ONEPASS_TC=1|2|4|8` forces the quads per
/// workgroup (measurements).
fn onepass_tc(ctx: &KernelContext, plan: &Plan, dtype: DType, grad: bool) -> Option<usize> {
    // (`TFWGPU_NORM_ONEPASS`, `TFWGPU_NORM_ONEPASS_TC`: read once per process.)
    static OPTS: std::sync::OnceLock<(Option<String>, Option<usize>)> = std::sync::OnceLock::new();
    let (onepass, forced) = OPTS.get_or_init(|| {
        (
            crate::env_word("TFWGPU_NORM_ONEPASS"),
            crate::env_word("TFWGPU_NORM_ONEPASS_TC")
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|t| matches!(t, 1 | 2 | 4 | 8)),
        )
    });
    let onepass = onepass.as_deref();
    let forced = *forced;
    if onepass == Some("0") {
        return None;
    }
    let l = ctx.limits();
    // sa (f32), sb and sc (vec4) per invocation, cf.
    let shared = OWG * 36 + 128 * 4;
    if !plan.vec4_stats(ctx, dtype)
        || plan.rest == 0
        || plan.c == 0
        || (l.max_compute_invocations_per_workgroup as usize) < OWG
        || (l.max_compute_workgroup_size_x as usize) < OWG
        || (l.max_compute_workgroup_storage_size as usize) < shared
        || !finalize_direct(ctx)
    {
        return None;
    }
    let quads = plan.c / 4;
    let mut tc = match forced {
        Some(t) => t,
        None => {
            let mut tc = 8;
            while tc > 1 && quads / tc < ONEPASS_GROUPS {
                tc /= 2;
            }
            tc
        }
    };
    while tc > 1 && plan.rest > ONEPASS_ROWS * (OWG / tc) {
        tc /= 2;
    }
    if plan.rest > ONEPASS_ROWS * (OWG / tc) {
        return None;
    }
    // A workgroup reads tc * 4 channels of each row: tc * 4 * size contiguous bytes, strided
    // by the row. Request mem4-1 (H200): 32-byte runs (float32, tc 2) on 64x7x7x2048 beat
    // the three dispatches (wall 28.6 against 35.6 us), 16-byte runs lost on every tensor
    // but the smallest (64x14x14x1024 float32: 141 against 58 us; 64x7x7x2048 with tc 1:
    // 59 against 36 us; 32x14x14x256, 6.4 MB: 22.6 against 31.5 us, won), and so did
    // 8-byte runs (float16, tc 1). So: runs of at least 32 bytes on tensors up to 32 MiB
    // (64 MiB since request mem5-2, below), any run up to 16 MiB, counting the bytes of x and
    // (gradient) dy: the gradient on 64x7x7x2048 read 51 MB and tied by wall time (49.4 against
    // 49.1 us), in float16 (26 MB, 16-byte runs) lost (35.4 against 32.1). `TFWGPU_NORM_ONEPASS=1`
    // lifts the limits.
    let size = if dtype == DType::F16 { 2 } else { 4 };
    let bytes = plan.rest * plan.c * size * if grad { 2 } else { 1 };
    let forced_on = onepass == Some("1");
    // Request mem5-2 (same binary, same call): 64x7x7x2048 float32 gradient (51 MB of x and dy,
    // tc 2) in one dispatch 58.6 / 49.1 us (span / wall) against 80.4 / 50.9 for the three
    // dispatches, so 32-byte runs take tensors up to 64 MiB; on 64x14x14x1024 float32 forced to
    // tc 2 (128 workgroups) one dispatch won by span (74.0 against 91.4 us) but lost by wall
    // (62.7 against 56.6), and the tc chosen above is 1 there anyway.
    let ok = forced_on || bytes <= 16 << 20 || (tc * 4 * size >= 32 && bytes <= 64 << 20);
    ok.then_some(tc)
}

fn apply_shader(dtype: DType) -> String {
    APPLY_WGSL
        .replace("$NORM_COMMON", NORM_COMMON)
        .replace("$LOAD_X", &load_expr(dtype, "x"))
        .replace("$LOAD_DY", &load_expr(dtype, "dy"))
        .replace(
            "$STORE",
            if dtype == DType::F32 {
                APPLY_STORE_X4
            } else {
                store_stmt(dtype)
            },
        )
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
}

/// What one batch-norm call records (shared by the forward and the gradient).
struct Run<'a> {
    ctx: &'a KernelContext<'a>,
    plan: Plan,
    dtype: DType,
    eps: f32,
    factor: Option<f32>,
}

impl Run<'_> {
    /// Dispatches `stats.wgsl` over x (and dy); returns the partials.
    fn stats(
        &self,
        x: &BufferRange,
        dy: Option<&BufferRange>,
        mean: Option<&BufferRange>,
    ) -> Result<BufferRange> {
        let ctx = self.ctx;
        let p = &self.plan;
        let grad = dy.is_some();
        let dtype = self.dtype;
        // The plan is `Plan::vec4` exactly when the vec4 shader applies (see `record`).
        let vec4 = p.vec4_stats(ctx, dtype);
        let (hw, suffix) = if vec4 {
            vec4_hw(ctx, dtype)?
        } else {
            (false, "")
        };
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "norm",
                Some(dtype),
                match (grad, vec4) {
                    (false, false) => "stats".to_string(),
                    (true, false) => "stats_grad".to_string(),
                    (false, true) => format!("stats/vec4{suffix}"),
                    (true, true) => format!("stats_grad/vec4{suffix}"),
                },
            ),
            || {
                crate::kernels::membound_shader(if vec4 {
                    vec4_io(stats_vec4_shader(grad), dtype, hw)
                } else {
                    stats_shader(dtype, grad)
                })
            },
        )?;
        let part = ctx.temp((p.c * p.splits * 3 * 4) as u64)?;
        let tiles = if vec4 {
            (p.c / 4).div_ceil(p.tc)
        } else {
            p.c.div_ceil(p.tc)
        };
        let (grid, gx) = groups("batch norm statistics", tiles * p.splits)?;
        let params = p.params(0, 0, 0, gx, 0, None, self.eps);
        // 16 bytes: one vec4 for stats_vec4.wgsl's unused dy.
        let unused = ctx.temp(16)?;
        ctx.dispatch(
            &pipeline,
            &params,
            &[
                x.clone(),
                dy.cloned().unwrap_or_else(|| unused.clone()),
                mean.cloned().unwrap_or(unused),
                part.clone(),
            ],
            grid,
        )?;
        Ok(part)
    }

    /// The run of the apply after `stats_last`: eight channels per invocation for float16
    /// with C % 8 == 0 unless `TFWGPU_NORM_APPLY_X8=0` (the coefficients' layout is the same;
    /// see `LastOpts`).
    fn last_apply(&self) -> Run<'_> {
        let x8 = self.dtype == DType::F16 && self.plan.c.is_multiple_of(8) && last_opts().apply_x8;
        Run {
            ctx: self.ctx,
            plan: Plan { x8, ..self.plan },
            dtype: self.dtype,
            eps: self.eps,
            factor: self.factor,
        }
    }

    /// Dispatches `stats_last.wgsl` (training; `stats_last_on`): the statistics and the
    /// per-channel results of x (forward: `vecs` scale, offset, mean, variance; gradient: dy
    /// and `vecs` scale, reserve_space_1, reserve_space_2), writing the [C] outputs `outs` (4
    /// forward, 2 gradient) and V3's `space3`; returns the buffer whose start holds the
    /// coefficients for the vec4 apply.
    fn stats_last(
        &self,
        x: &BufferRange,
        dy: Option<&BufferRange>,
        vecs: &[&BufferRange],
        outs: &[DeviceRef],
        space3: Option<&DeviceRef>,
        name: &str,
    ) -> Result<BufferRange> {
        let ctx = self.ctx;
        let p = &self.plan;
        let grad = dy.is_some();
        let dtype = self.dtype;
        let (hw, suffix) = vec4_hw(ctx, dtype)?;
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "norm",
                Some(dtype),
                format!("stats_last{}/vec4{suffix}", if grad { "_grad" } else { "" }),
            ),
            || crate::kernels::membound_shader(vec4_io(stats_last_shader(grad), dtype, hw)),
        )?;
        let quads = p.c / 4;
        let groups_n = p.splits.div_ceil(p.group);
        // Coefficient rows, then a record (3 vec4) per chunk and group of each quad.
        let part = ctx.temp((16 * (8 * quads + 3 * quads * (p.splits + groups_n))) as u64)?;
        let arrivals = ctx
            .arrivals(p.last_words())?
            .ok_or_else(|| Error::Unimplemented(format!("{name}: too few arrival counters")))?;
        let tiles = quads.div_ceil(p.tc);
        let (grid, gx) = groups("batch norm statistics", tiles * p.splits)?;
        let params = p.params(
            0,
            space3.is_some() as usize,
            outs.len() as u32,
            gx,
            if grad { 2 } else { 0 },
            self.factor,
            self.eps,
        );
        let mut b = vec![x.clone(), part.clone(), arrivals];
        if let Some(d) = dy {
            b.push(d.clone());
        }
        b.extend(vecs.iter().map(|v| (*v).clone()));
        for o in outs {
            b.push(bind_out(ctx, name, o)?);
        }
        if !grad {
            b.push(match space3 {
                Some(o) => bind_out(ctx, name, o)?,
                None => ctx.temp(4)?,
            });
        }
        ctx.dispatch(&pipeline, &params, &b, grid)?;
        Ok(part)
    }

    /// Dispatches `finalize.wgsl`; returns the per-channel rows. Where the device allows 11
    /// storage bindings per stage (`finalize_direct`), it also writes rows 0.. to the float32
    /// [c] outputs `outs` (at most 4) and the scalar `space3` (V3's reserve_space_3) itself;
    /// else `copy_rows` copies the rows (one dispatch more) and the caller fills `space3`.
    fn finalize(
        &self,
        mode: u32,
        part: Option<&BufferRange>,
        vecs: [Option<&BufferRange>; 4],
        outs: &[DeviceRef],
        space3: Option<&DeviceRef>,
        name: &str,
    ) -> Result<BufferRange> {
        let ctx = self.ctx;
        let p = &self.plan;
        let direct = finalize_direct(ctx);
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "norm",
                None,
                if direct {
                    "finalize/direct"
                } else {
                    "finalize"
                },
            ),
            || crate::kernels::membound_shader(finalize_shader(direct)),
        )?;
        let res = ctx.temp((ROWS * p.c * 4) as u64)?;
        let (grid, gx) = groups("batch norm", p.c)?;
        let rows = if direct { outs.len() as u32 } else { 0 };
        // p.n = 1: also write V3's reserve_space_3 (a float32 0).
        let params = p.params(
            0,
            space3.is_some() as usize,
            rows,
            gx,
            mode,
            self.factor,
            self.eps,
        );
        let unused = ctx.temp(4)?;
        let mut b = vec![part.cloned().unwrap_or_else(|| unused.clone())];
        for v in vecs {
            b.push(v.cloned().unwrap_or_else(|| unused.clone()));
        }
        b.push(res.clone());
        if direct {
            for k in 0..4 {
                b.push(match outs.get(k) {
                    Some(o) => bind_out(ctx, name, o)?,
                    None => unused.clone(),
                });
            }
            b.push(match space3 {
                Some(o) => bind_out(ctx, name, o)?,
                None => unused.clone(),
            });
        }
        ctx.dispatch(&pipeline, &params, &b, grid)?;
        if !direct {
            self.copy_rows(&res, outs, name)?;
        }
        Ok(res)
    }

    /// Dispatches `apply.wgsl` into `out`.
    fn apply(
        &self,
        mode: u32,
        x: &BufferRange,
        dy: Option<&BufferRange>,
        res: &BufferRange,
        out: &DeviceRef,
        name: &str,
    ) -> Result<()> {
        let ctx = self.ctx;
        let dtype = self.dtype;
        let n = out.desc.num_elements();
        // float32 or float16 with the channel innermost and C % 4 == 0: vec4 loads and stores
        // (four neighbouring channels per load), two per invocation.
        let p = &self.plan;
        if p.vec4_stats(ctx, dtype) {
            let (hw, suffix) = vec4_hw(ctx, dtype)?;
            let k = APPLY_K;
            let x8 = p.x8;
            let per = if x8 { 8 } else { 4 };
            let pipeline = ctx.pipeline(
                PipelineKey::new(
                    "norm",
                    Some(dtype),
                    format!("apply/vec4/k{k}{suffix}{}", if x8 { "/x8" } else { "" }),
                ),
                || {
                    crate::kernels::membound_shader(vec4_io(
                        apply_vec4_shader(k, x8)
                            .replace("$NORM_COMMON", NORM_COMMON)
                            .replace("$LINEAR_INDEX", LINEAR_INDEX),
                        dtype,
                        hw,
                    ))
                },
            )?;
            words_for(name, dtype, n)?;
            // Channel quads (C % 4 == 0, so n is a multiple of 4), or octets with x8.
            let words = (n / per) as u32;
            // K items per invocation, S apart with S a multiple of the items per row (so all
            // are one quad's or octet's); S <= words as words is a multiple of them.
            let threads = words
                .div_ceil(k as u32)
                .next_multiple_of((p.c / per) as u32);
            let (grid, row) = grid_1d(threads as u64, WG);
            let params = p.params(row, n, words, threads, mode, None, self.eps);
            let o = bind_out(ctx, name, out)?;
            return ctx.dispatch(
                &pipeline,
                &params,
                &[
                    x.clone(),
                    dy.cloned().unwrap_or_else(|| x.clone()),
                    res.clone(),
                    o,
                ],
                grid,
            );
        }
        let pipeline = ctx.pipeline(PipelineKey::new("norm", Some(dtype), "apply"), || {
            crate::kernels::membound_shader(apply_shader(dtype))
        })?;
        let words = words_for(name, dtype, n)?;
        // float32: four words per invocation (APPLY_STORE_X4), groups_x = invocations.
        let threads = if dtype == DType::F32 {
            words.div_ceil(4)
        } else {
            words
        };
        let (grid, row) = grid_1d(threads as u64, WG);
        let params = self
            .plan
            .params(row, n, words, threads, mode, None, self.eps);
        let o = bind_out(ctx, name, out)?;
        ctx.dispatch(
            &pipeline,
            &params,
            &[
                x.clone(),
                dy.cloned().unwrap_or_else(|| x.clone()),
                res.clone(),
                o,
            ],
            grid,
        )
    }

    /// A whole training batch norm in one dispatch of `onepass.wgsl` with `tc` channel quads
    /// per workgroup: `ins` are the forward's (x, scale, offset, mean, variance) or the
    /// gradient's (dy, x, scale, reserve_space_1, reserve_space_2); `outs[0]` is y or
    /// x_backprop, `outs[1..]` the [C] outputs (4 forward, 2 gradient); `space3` V3's
    /// reserve_space_3.
    fn onepass(
        &self,
        tc: usize,
        grad: bool,
        ins: &[BufferRange],
        outs: &[DeviceRef],
        space3: Option<&DeviceRef>,
        name: &str,
    ) -> Result<()> {
        let ctx = self.ctx;
        let dtype = self.dtype;
        let (hw, suffix) = vec4_hw(ctx, dtype)?;
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "norm",
                Some(dtype),
                format!("onepass{}/vec4{suffix}", if grad { "_grad" } else { "" }),
            ),
            || crate::kernels::membound_shader(vec4_io(onepass_shader(grad), dtype, hw)),
        )?;
        let plan = Plan {
            tc,
            x8: false,
            ..self.plan
        };
        let (grid, gx) = groups(name, (plan.c / 4).div_ceil(tc))?;
        let small = outs.len() - 1;
        let params = plan.params(
            0,
            space3.is_some() as usize,
            small as u32,
            gx,
            if grad { 2 } else { 0 },
            self.factor,
            self.eps,
        );
        let mut b: Vec<BufferRange> = ins.to_vec();
        for o in outs {
            b.push(bind_out(ctx, name, o)?);
        }
        if !grad {
            b.push(match space3 {
                Some(o) => bind_out(ctx, name, o)?,
                None => ctx.temp(4)?,
            });
        }
        ctx.dispatch(&pipeline, &params, &b, grid)
    }

    /// Copies rows 0.. of `res` to the float32 [c] outputs `outs` (at most 4), in one
    /// dispatch (four buffer copies ended the compute pass four times).
    fn copy_rows(&self, res: &BufferRange, outs: &[DeviceRef], name: &str) -> Result<()> {
        let ctx = self.ctx;
        let c = self.plan.c;
        let pipeline = ctx.pipeline(PipelineKey::new("norm", None, "copy_rows"), || {
            crate::kernels::membound_shader(COPY_ROWS_WGSL.replace("$LINEAR_INDEX", LINEAR_INDEX))
        })?;
        let mut binds = vec![res.clone()];
        for k in 0..4 {
            binds.push(match outs.get(k) {
                Some(o) => bind_out(ctx, name, o)?,
                None => ctx.temp(4)?,
            });
        }
        let (grid, row) = grid_1d(c as u64, WG);
        ctx.dispatch(
            &pipeline,
            &params(&[row, c as u32, outs.len() as u32, 0]),
            &binds,
            grid,
        )
    }
}

/// `apply.wgsl`'s NHWC case with C % 4 == 0 (float32, or float16 as four halves in a vec2<u32>,
/// see `vec4_io`) on vec4: the same expression per lane, four neighbouring channels per load;
/// p.words = vec4 count, p.groups_x = S, the invocations, a multiple of the C / 4 channel
/// quads: invocation i takes the K vec4 i, i + S, ..., i + (K - 1) S, which all belong to the
/// same quad, so it loads that quad's coefficients once (as vec4: `res` rows of C floats start
/// at multiples of 4); all data loads come before the stores (out may be x). K = APPLY_K (2):
/// K = 4 for float16, whose loads carry half the bytes (the float16 apply ran at 3.0 TB/s
/// with K = 2 and float32 at 3.95 in request mem4-1), was slower on the H200 (request mem4-2,
/// 64x56x56x256: forward apply 69.2 -> 82.0 us, gradient 105.3 -> 121.5).
fn apply_vec4_shader(k: usize, x8: bool) -> String {
    use std::fmt::Write;
    let mut b = String::new();
    for i in 1..k {
        let _ = writeln!(b, "    let i{i} = i{} + p.groups_x;", i - 1);
        let _ = writeln!(b, "    let v{i} = i{i} < p.words;");
    }
    // Loads stay raw words with x8 (each is two quads), else are widened at once.
    let zero = if x8 { "vec4<u32>()" } else { "vec4<f32>()" };
    let load = |arr: &str, i: usize| {
        if x8 {
            format!("{arr}[i{i}]")
        } else {
            format!("ld({arr}[i{i}])")
        }
    };
    let _ = writeln!(b, "    let x0 = {};", load("x", 0));
    for i in 1..k {
        let _ = writeln!(
            b,
            "    var x{i} = {zero};\n    if v{i} {{\n        x{i} = {};\n    }}",
            load("x", i)
        );
    }
    for i in 0..k {
        let _ = writeln!(b, "    var d{i} = {zero};");
    }
    let _ = writeln!(b, "    if p.mode >= 2u {{\n        d0 = {};", load("dy", 0));
    for i in 1..k {
        let _ = writeln!(
            b,
            "        if v{i} {{\n            d{i} = {};\n        }}",
            load("dy", i)
        );
    }
    let _ = writeln!(b, "    }}");
    for i in 0..k {
        if x8 {
            let _ = writeln!(
                b,
                "    let r{i} = vec4<u32>(st(value(ld(x{i}.xy), ld(d{i}.xy), c)), \
                 st(value(ld(x{i}.zw), ld(d{i}.zw), c1)));"
            );
        } else {
            let _ = writeln!(b, "    let r{i} = st(value(x{i}, d{i}, c));");
        }
    }
    let _ = writeln!(b, "    out[i0] = r0;");
    for i in 1..k {
        let _ = writeln!(b, "    if v{i} {{\n        out[i{i}] = r{i};\n    }}");
    }
    // float16 with eight channels per item: vec4<u32> arrays, item i0 covers quads 2 q and
    // 2 q + 1 (coefficients c and c1).
    let (at, per, q, c1) = if x8 {
        (
            "vec4<u32>",
            "8u",
            "2u * (i0 % items)",
            "    let c1 = Coef(res[4u * quads + q + 1u], res[5u * quads + q + 1u], \
             res[6u * quads + q + 1u], res[7u * quads + q + 1u]);",
        )
    } else {
        ("$XT", "4u", "i0 % items", "")
    };
    APPLY_VEC4_WGSL
        .replace("$BODY", &b)
        .replace("$AT", at)
        .replace("$PER", per)
        .replace("$Q", q)
        .replace("$C1", c1)
}

const APPLY_VEC4_WGSL: &str = "$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<$AT>;
@group(0) @binding(2) var<storage, read_write> dy: array<$AT>;
@group(0) @binding(3) var<storage, read_write> res: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<$AT>;
$LINEAR_INDEX
$COMMON
$LD

// A quad's coefficients: mean, k (rows 4, 5), r6, r7 (see finalize.wgsl).
struct Coef {
    mean: vec4<f32>,
    k: vec4<f32>,
    r6: vec4<f32>,
    r7: vec4<f32>,
};

fn value(xv: vec4<f32>, dv: vec4<f32>, c: Coef) -> vec4<f32> {
    if p.mode < 2u {
        return (xv - c.mean) * c.k + c.r6;
    }
    if p.mode == 3u {
        return dv * c.k;
    }
    return c.k * ((dv - c.r6) - (xv - c.mean) * c.r7);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i0 = linear_index(gid);
    if i0 >= p.groups_x {
        return;
    }
    let quads = p.c / 4u;
    // Items per row: channel quads, or octets (float16 eight channels per item).
    let items = p.c / $PER;
    let q = $Q;
    // res holds 8 rows of C floats, so row 7 is always there to read.
    let c = Coef(res[4u * quads + q], res[5u * quads + q], res[6u * quads + q], res[7u * quads + q]);
$C1
$BODY}
";

/// Rows 0..p.rows of the per-channel results to up to four [c] outputs.
const COPY_ROWS_WGSL: &str = "struct Params { row: u32, c: u32, rows: u32, pad0: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> res: array<f32>;
@group(0) @binding(2) var<storage, read_write> o0: array<f32>;
@group(0) @binding(3) var<storage, read_write> o1: array<f32>;
@group(0) @binding(4) var<storage, read_write> o2: array<f32>;
@group(0) @binding(5) var<storage, read_write> o3: array<f32>;
$LINEAR_INDEX
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.c {
        return;
    }
    o0[i] = res[i];
    if p.rows > 1u {
        o1[i] = res[p.c + i];
    }
    if p.rows > 2u {
        o2[i] = res[2u * p.c + i];
    }
    if p.rows > 3u {
        o3[i] = res[3u * p.c + i];
    }
}
";

fn fill_f32(ctx: &KernelContext, out: &DeviceRef, bits: u32) -> Result<()> {
    fill_bytes(ctx, out.addr, out.desc.byte_size(), bits)
}

fn check_outputs(name: &str, outputs: &[DeviceRef], want: &[TensorDesc]) -> Result<()> {
    if outputs.len() != want.len() {
        bail_invalid!(
            "{name}: {} outputs for {} results",
            outputs.len(),
            want.len()
        );
    }
    for (o, w) in outputs.iter().zip(want) {
        if &o.desc != w {
            bail_invalid!(
                "{name}: output is {} {} but the op computes {} {}",
                o.desc.dtype,
                fmt_shape(&o.desc.shape),
                w.dtype,
                fmt_shape(&w.shape)
            );
        }
    }
    Ok(())
}

/// FusedBatchNorm, V2, V3.
struct BatchNorm {
    a: Common,
    factor: f32,
}

impl BatchNorm {
    fn build(name: &'static str, version: u8, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let a = Common::read(name, version, attrs)?;
        let factor = attrs.float_or("exponential_avg_factor", 1.0)?;
        Ok(Box::new(BatchNorm { a, factor }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(Plan, Vec<TensorDesc>)> {
        let name = self.a.name;
        if inputs.len() != 5 {
            bail_invalid!(
                "{name} takes 5 inputs (x, scale, offset, mean, variance), got {}",
                inputs.len()
            );
        }
        let view = self.a.view(&inputs[0], "x")?;
        let c = view.1;
        self.a.vector(&inputs[1], "scale", c, false)?;
        self.a.vector(&inputs[2], "offset", c, false)?;
        let any = self.a.training && self.factor == 1.0;
        self.a.vector(&inputs[3], "mean", c, any)?;
        self.a.vector(&inputs[4], "variance", c, any)?;
        let vec_c = TensorDesc::new(DType::F32, &[c]);
        let mut outs = vec![inputs[0].desc()];
        outs.extend(std::iter::repeat_n(vec_c, 4));
        if self.a.version == 3 {
            outs.push(TensorDesc::new(DType::F32, &[]));
        }
        Ok((Plan::new(name, view)?, outs))
    }
}

impl Kernel for BatchNorm {
    fn op(&self) -> &'static str {
        self.a.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(self.check(inputs)?.1)
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.a.name;
        let (plan, want) = self.check(inputs)?;
        check_outputs(name, outputs, &want)?;
        // V3's reserve_space_3 (a float32 0): finalize writes it where it can.
        let space3 = (self.a.version == 3).then(|| &outputs[5]);
        if let Some(o) = space3
            && !(finalize_direct(ctx) && plan.c > 0 && plan.rest > 0)
        {
            fill_f32(ctx, o, 0)?;
        }
        if plan.c == 0 {
            return Ok(());
        }
        if plan.rest == 0 {
            for o in &outputs[1..5] {
                fill_f32(ctx, o, NAN_BITS)?;
            }
            return Ok(());
        }
        let dev = |i: usize| -> Result<BufferRange> { ctx.bind(inputs[i].device(name, i)?) };
        let dtype = inputs[0].dtype();
        let run = Run {
            ctx,
            plan: if plan.vec4_stats(ctx, dtype) {
                plan.vec4(dtype)
            } else {
                plan
            },
            dtype,
            eps: self.a.epsilon,
            factor: Some(self.factor),
        };
        let x = dev(0)?;
        let (scale, offset, mean, var) = (dev(1)?, dev(2)?, dev(3)?, dev(4)?);
        if self.a.training
            && let Some(tc) = onepass_tc(ctx, &plan, dtype, false)
        {
            // Implies finalize_direct: reserve_space_3 is the shader's to write.
            return run.onepass(
                tc,
                false,
                &[x, scale, offset, mean, var],
                &outputs[..5],
                space3,
                name,
            );
        }
        if self.a.training && stats_last_on(ctx, &run.plan, dtype) {
            let res = run.stats_last(
                &x,
                None,
                &[&scale, &offset, &mean, &var],
                &outputs[1..5],
                space3,
                name,
            )?;
            return run.last_apply().apply(0, &x, None, &res, &outputs[0], name);
        }
        let vecs = [Some(&scale), Some(&offset), Some(&mean), Some(&var)];
        let res = if self.a.training {
            let part = run.stats(&x, None, None)?;
            run.finalize(0, Some(&part), vecs, &outputs[1..5], space3, name)?
        } else {
            run.finalize(1, None, vecs, &outputs[1..5], space3, name)?
        };
        run.apply(0, &x, None, &res, &outputs[0], name)
    }
}

/// FusedBatchNormGrad, V2, V3.
struct BatchNormGrad {
    a: Common,
}

impl BatchNormGrad {
    fn build(name: &'static str, version: u8, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(BatchNormGrad {
            a: Common::read(name, version, attrs)?,
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(Plan, Vec<TensorDesc>)> {
        let name = self.a.name;
        let arity = if self.a.version == 3 { 6 } else { 5 };
        if inputs.len() != arity {
            bail_invalid!(
                "{name} takes {arity} inputs (y_backprop, x, scale, reserve_space_1, \
                 reserve_space_2{}), got {}",
                if arity == 6 { ", reserve_space_3" } else { "" },
                inputs.len()
            );
        }
        let view = self.a.view(&inputs[1], "x")?;
        if inputs[0].desc() != inputs[1].desc() {
            bail_invalid!(
                "{name}: x and y_backprop must have same shape and dtype, but x is {} {} and \
                 y_backprop is {} {}",
                inputs[1].dtype(),
                fmt_shape(inputs[1].shape()),
                inputs[0].dtype(),
                fmt_shape(inputs[0].shape())
            );
        }
        let c = view.1;
        self.a.vector(&inputs[2], "scale", c, false)?;
        self.a.vector(&inputs[3], "reserve_space_1", c, false)?;
        self.a.vector(&inputs[4], "reserve_space_2", c, false)?;
        let vec_c = TensorDesc::new(DType::F32, &[c]);
        let empty = TensorDesc::new(DType::F32, &[0]);
        let outs = vec![inputs[1].desc(), vec_c.clone(), vec_c, empty.clone(), empty];
        Ok((Plan::new(name, view)?, outs))
    }
}

impl Kernel for BatchNormGrad {
    fn op(&self) -> &'static str {
        self.a.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(self.check(inputs)?.1)
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.a.name;
        let (plan, want) = self.check(inputs)?;
        check_outputs(name, outputs, &want)?;
        if plan.c == 0 {
            return Ok(());
        }
        if plan.rest == 0 {
            fill_f32(ctx, &outputs[1], 0)?;
            fill_f32(ctx, &outputs[2], 0)?;
            return Ok(());
        }
        let dev = |i: usize| -> Result<BufferRange> { ctx.bind(inputs[i].device(name, i)?) };
        let dtype = inputs[1].dtype();
        let run = Run {
            ctx,
            plan: if plan.vec4_stats(ctx, dtype) {
                plan.vec4(dtype)
            } else {
                plan
            },
            dtype,
            eps: self.a.epsilon,
            factor: None,
        };
        let (dy, x, scale, mean, var) = (dev(0)?, dev(1)?, dev(2)?, dev(3)?, dev(4)?);
        if self.a.training
            && let Some(tc) = onepass_tc(ctx, &plan, dtype, true)
        {
            return run.onepass(
                tc,
                true,
                &[dy, x, scale, mean, var],
                &outputs[..3],
                None,
                name,
            );
        }
        if self.a.training && stats_last_on(ctx, &run.plan, dtype) {
            let res = run.stats_last(
                &x,
                Some(&dy),
                &[&scale, &mean, &var],
                &outputs[1..3],
                None,
                name,
            )?;
            return run
                .last_apply()
                .apply(2, &x, Some(&dy), &res, &outputs[0], name);
        }
        let part = run.stats(&x, Some(&dy), Some(&mean))?;
        let mode = if self.a.training { 2 } else { 3 };
        let res = run.finalize(
            mode,
            Some(&part),
            [Some(&scale), None, Some(&mean), Some(&var)],
            &outputs[1..3],
            None,
            name,
        )?;
        run.apply(mode, &x, Some(&dy), &res, &outputs[0], name)
    }
}
