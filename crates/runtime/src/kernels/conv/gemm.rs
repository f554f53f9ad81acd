//! Conv2D and its gradients as implicit matrix products (`conv_gemm.wgsl`), and the pass that
//! sums split-K partial results and converts them to the output dtype (`finalize.wgsl`).
//!
//! | mode           | M           | N         | K (reduction) | A          | B      |
//! |----------------|-------------|-----------|---------------|------------|--------|
//! | Forward        | n * oh * ow | k / groups| r * s * cg    | x windows  | filter |
//! | BackpropInput  | n * h * w   | cg        | r * s * kg    | dy windows | filter |
//! | BackpropFilter | r * s * cg  | k / groups| n * oh * ow   | x windows  | dy     |
//!
//! One dispatch covers every group (grid z = groups * splits). float32 outputs are written in
//! place when K is not split; otherwise (split-K, or float16 outputs, whose pairs of halves
//! share a word) the shader writes f32 values at the output's offsets in a temporary, one copy
//! per split, and `finalize` sums the copies and stores the dtype.

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, KernelContext, MAX_GROUPS_X, grid_1d};
use crate::kernel_manager::{Checks, PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, bind_out};
use crate::kernels::matmul::{
    self, Gemm, Hooks, Layouts, Plan, V4_64X64X16_4X4S1, V4_64X64X32_4X4S1, V4_128X128X16_8X16S1,
    V4_128X256X16_8X16S1, V4_256X128X16_16X8S1, Vec4Tile,
};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{ConvAttrs, Geom, winograd};
use crate::tune::bucket;

/// A buffer of a column path made on first use: the column paths ask the tuner whether they
/// beat the previous path, and where its answer is the previous path (remembered after the
/// first calls) nothing of theirs is allocated or recorded: no columns, no padded filter copy.
/// While the tuner times the candidates, a buffer that cannot be made fails that candidate's
/// run, which the tuner skips like any variant that fails to record (`Tuner::choose`).
struct Lazy<F: Fn() -> Result<BufferRange>> {
    cell: std::cell::OnceCell<BufferRange>,
    make: F,
}

impl<F: Fn() -> Result<BufferRange>> Lazy<F> {
    fn new(make: F) -> Self {
        Lazy {
            cell: std::cell::OnceCell::new(),
            make,
        }
    }

    fn get(&self) -> Result<BufferRange> {
        if let Some(b) = self.cell.get() {
            return Ok(b.clone());
        }
        let b = (self.make)()?;
        Ok(self.cell.get_or_init(|| b).clone())
    }
}

const CONV_GEMM_WGSL: &str = include_str!("conv_gemm.wgsl");
const FINALIZE_WGSL: &str = include_str!("finalize.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Forward,
    BackpropInput,
    BackpropFilter,
}

/// A tile of `conv_gemm.wgsl`: BM x BN outputs per workgroup, K steps of BK, TM x TN outputs
/// per invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub name: &'static str,
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

impl Tile {
    pub const fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Whether the tile loads cover the tiles exactly with every invocation busy.
    pub const fn is_valid(&self) -> bool {
        let t = self.threads();
        self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bm * self.bk).is_multiple_of(t)
            && (self.bn * self.bk).is_multiple_of(t)
            && t <= 256
    }
}

pub const T32X32: Tile = Tile {
    name: "32x32x8_2x2",
    bm: 32,
    bn: 32,
    bk: 8,
    tm: 2,
    tn: 2,
};
pub const T64X64: Tile = Tile {
    name: "64x64x8_4x4",
    bm: 64,
    bn: 64,
    bk: 8,
    tm: 4,
    tn: 4,
};
pub const T128X128: Tile = Tile {
    name: "128x128x8_8x8",
    bm: 128,
    bn: 128,
    bk: 8,
    tm: 8,
    tn: 8,
};
/// For products with few columns (few output channels) and many rows.
pub const T128X32: Tile = Tile {
    name: "128x32x8_8x2",
    bm: 128,
    bn: 32,
    bk: 8,
    tm: 8,
    tn: 2,
};

/// Every tile, for `_tfwgpu_tile`.
pub const TILES: &[Tile] = &[T32X32, T64X64, T128X128, T128X32];

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].is_valid());
        i += 1;
    }
};

/// Workgroups that keep a large GPU busy (two per multiprocessor of an H200).
const TARGET_GROUPS: usize = 264;

/// The tile for an M x N product (per group).
fn choose_tile(m: usize, n: usize, groups: usize) -> Tile {
    let tiles = |t: &Tile| groups * m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    if n <= 32 {
        if tiles(&T128X32) >= TARGET_GROUPS {
            T128X32
        } else {
            T32X32
        }
    } else if tiles(&T128X128) >= TARGET_GROUPS {
        T128X128
    } else if m >= 64 {
        T64X64
    } else {
        T32X32
    }
}

/// Splits of the K range for a product with `tiles` output tiles: enough workgroups to fill the
/// GPU, at least 256 of K per split.
fn choose_splits(tiles: usize, k: usize) -> usize {
    if tiles >= TARGET_GROUPS || k < 512 {
        return 1;
    }
    TARGET_GROUPS.div_ceil(tiles).min(k / 256).clamp(1, 64)
}

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::Unimplemented(format!("{op}: a size of {v} does not fit 32 bits")))
}

/// WGSL loading element `i` of `arr` (f32 or packed f16) as f32.
pub(super) fn load(dtype: DType, arr: &str) -> String {
    match dtype {
        DType::F16 => format!("f16_to_f32(({arr}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu)"),
        _ => format!("{arr}[i]"),
    }
}

/// The WGSL element type of an input array.
pub(super) fn store_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "u32",
        _ => "f32",
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let dtype = out.desc.dtype;
    if attrs.tile.as_deref() == Some("winograd") {
        return winograd_forced(ctx, op, mode, g, attrs, a_ref, b_ref, out);
    }
    let kg = g.kg();
    let (m, n, k) = match mode {
        Mode::Forward => (g.n * g.oh * g.ow, kg, g.r * g.s * g.cg),
        Mode::BackpropInput => (g.n * g.h * g.w, g.cg, g.r * g.s * kg),
        Mode::BackpropFilter => (g.r * g.s * g.cg, kg, g.n * g.oh * g.ow),
    };
    let x = g.x_strides();
    let y = g.y_strides();
    // 1x1, stride 1, no padding, NHWC, one group: a plain product of row-major matrices.
    let plain = g.r == 1
        && g.s == 1
        && g.sh == 1
        && g.sw == 1
        && g.pt == 0
        && g.pl == 0
        && g.oh == g.h
        && g.ow == g.w
        && g.groups == 1
        && !g.nchw;
    // (mode id, A loads along M, B loads along N): neighbouring invocations load neighbouring
    // addresses.
    let (mode_id, a_mfast, b_nfast) = match mode {
        Mode::Forward => (0, g.nchw, true),
        Mode::BackpropInput => (1, g.nchw, false),
        Mode::BackpropFilter => (2, !g.nchw, !g.nchw),
    };
    let mode_id = if plain { 3 } else { mode_id };
    // Strides of the plain product: A (m, k), B (k, n), C (m, n), in the x* and y* slots.
    let (xs, ys) = if plain {
        let (c, kk) = (g.c, g.k);
        match mode {
            Mode::Forward => ([c, 1, kk, 1], [kk, 1, 0, 0]),
            Mode::BackpropInput => ([kk, 1, 1, kk], [c, 1, 0, 0]),
            Mode::BackpropFilter => ([1, c, kk, 1], [kk, 1, 0, 0]),
        }
    } else {
        (x, y)
    };

    if plain
        && attrs.tile.is_none()
        && !attrs.heuristic_gemm
        && dtype == DType::F32
        && let Some(done) = plain_matmul(ctx, op, mode, g, attrs, a_ref, b_ref, out)?
    {
        return Ok(done);
    }
    if !plain
        && attrs.tile.is_none()
        && !attrs.heuristic_gemm
        && dtype == DType::F32
        && let Some(done) = implicit_vec4(ctx, op, mode, g, attrs, a_ref, b_ref, out)?
    {
        return Ok(done);
    }
    if mode != Mode::BackpropInput
        && !plain
        && attrs.tile.is_none()
        && !attrs.heuristic_gemm
        && dtype == DType::F32
        && let Some(done) = im2col_gemm(ctx, op, mode, g, attrs, a_ref, b_ref, out)?
    {
        return Ok(done);
    }
    if mode == Mode::BackpropInput
        && attrs.tile.is_none()
        && !attrs.heuristic_gemm
        && dtype == DType::F32
        && let Some(done) = bwd_input_col2im(ctx, op, g, attrs, b_ref, a_ref, out)?
    {
        return Ok(done);
    }
    let ctxs = Ctx {
        ctx,
        op,
        g,
        attrs,
        a_ref,
        b_ref,
        out,
    };
    let shape = Shape {
        m,
        n,
        k,
        mode_id,
        a_mfast,
        b_nfast,
        xs,
        ys,
    };
    let tile = match &attrs.tile {
        Some(name) => *TILES.iter().find(|t| t.name == name).ok_or_else(|| {
            Error::InvalidArgument(format!("{op}: _tfwgpu_tile {name:?} names no conv tile"))
        })?,
        None => {
            let heuristic = choose_tile(m, n, g.groups);
            let tuner = ctx.tuner();
            if tuner.enabled() && !attrs.heuristic_gemm {
                // Every tile is valid for every shape; skip those far larger than the output.
                let mut cands = vec![heuristic];
                for t in TILES {
                    let waste = t.bm as usize > 2 * m.max(32) || t.bn as usize > 2 * n.max(32);
                    if !waste && !cands.contains(t) {
                        cands.push(*t);
                    }
                }
                let memo = [
                    MEMO_TILE,
                    dtype as u64,
                    mode_id as u64,
                    g.r as u64,
                    g.s as u64,
                    g.sh as u64,
                    g.sw as u64,
                    m as u64,
                    n as u64,
                    k as u64,
                    g.groups as u64,
                ];
                let key = || {
                    format!(
                        "conv/{dtype}/{}/r{}s{}/st{}x{}/m{}/n{}/k{}/g{}",
                        ["fwd", "bwd_input", "bwd_filter", "plain"][mode_id],
                        g.r,
                        g.s,
                        g.sh,
                        g.sw,
                        bucket(m),
                        bucket(n),
                        bucket(k),
                        bucket(g.groups)
                    )
                };
                let names = || cands.iter().map(|t| t.name.to_string()).collect();
                let i = tuner.choose_memo(ctx, &memo, key, names, 0, &|i| {
                    record_tile(&ctxs, &shape, cands[i])
                });
                cands[i]
            } else {
                heuristic
            }
        }
    };
    record_tile(&ctxs, &shape, tile)
}

/// The Winograd path forced (`_tfwgpu_tile` "winograd", for tests): F(2x2, 3x3) for the
/// forward pass and the input gradient (`a_ref` is then x or dy, `b_ref` the filter), the
/// F(3x3, 2x2) filter gradient: the heuristic
/// product tile, `_tfwgpu_splits` chunks of each group's tiles when that divides them,
/// `_tfwgpu_col_images` images per group when that divides the batch.
#[allow(clippy::too_many_arguments)]
fn winograd_forced(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    x_ref: &DeviceRef,
    dy_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    if out.desc.dtype != DType::F32 || !winograd::applies(g) {
        return Err(Error::Unimplemented(format!(
            "{op}: the Winograd path is for float32 NHWC 3x3 stride-1 convolutions"
        )));
    }
    if mode != Mode::BackpropFilter {
        let mut c = winograd::corr(g, mode == Mode::BackpropInput, column_budget(ctx)).ok_or_else(
            || Error::Unimplemented(format!("{op}: no Winograd path for this geometry")),
        )?;
        if let Some(i) = attrs.col_images.filter(|i| g.n.is_multiple_of(*i)) {
            c.tiles = c.tiles / c.imgs * i;
            c.imgs = i;
            c.groups = g.n / i;
        }
        let layouts = Layouts {
            a_kfast: true,
            b_nfast: true,
        };
        let t = plain_tile(16, c.tiles, c.cout, c.cin);
        return winograd::record_forward(ctx, op, &c, Plan::Vec4(t, layouts), x_ref, dy_ref, out);
    }
    let mut wl = winograd::layout(g, column_budget(ctx)).ok_or_else(|| {
        Error::Unimplemented(format!("{op}: one image's Winograd operands are too large"))
    })?;
    if let Some(i) = attrs.col_images.filter(|i| g.n.is_multiple_of(*i)) {
        wl.imgs = i;
        wl.groups = g.n / i;
        wl.tiles = i * g.oh.div_ceil(2) * g.ow.div_ceil(2);
    }
    let layouts = Layouts {
        a_kfast: false,
        b_nfast: true,
    };
    let t = plain_tile(16, g.c, g.k, wl.tiles);
    let tiles = 16 * g.c.div_ceil(t.bm as usize) * g.k.div_ceil(t.bn as usize);
    let splits = attrs
        .splits
        .filter(|s| wl.tiles.is_multiple_of(*s))
        .unwrap_or_else(|| split_count(tiles, wl.tiles, TARGET_GROUPS));
    winograd::record(
        ctx,
        op,
        g,
        &wl,
        Plan::Vec4(t, layouts),
        splits,
        x_ref,
        dy_ref,
        out,
    )
}

/// The arguments of one convolution's product.
#[derive(Clone, Copy)]
struct Ctx<'a, 'c> {
    ctx: &'a KernelContext<'c>,
    op: &'a str,
    g: &'a Geom,
    attrs: &'a ConvAttrs,
    a_ref: &'a DeviceRef,
    b_ref: &'a DeviceRef,
    out: &'a DeviceRef,
}

/// The product's sizes, shader mode and strides.
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
    mode_id: usize,
    a_mfast: bool,
    b_nfast: bool,
    xs: [usize; 4],
    ys: [usize; 4],
}

/// Records the product with `tile` (and its split-K finalize pass).
fn record_tile(c: &Ctx, s: &Shape, tile: Tile) -> Result<()> {
    let Ctx {
        ctx,
        op,
        g,
        attrs,
        a_ref,
        b_ref,
        out,
    } = *c;
    let Shape {
        m,
        n,
        k,
        mode_id,
        a_mfast,
        b_nfast,
        xs,
        ys,
    } = *s;
    let dtype = out.desc.dtype;
    let kg = g.kg();
    let tiles_x = n.div_ceil(tile.bn as usize);
    let tiles_y = m.div_ceil(tile.bm as usize);
    let out_len = out.desc.num_elements();
    let max_bind = ctx.limits().max_storage_buffer_binding_size as usize;
    // Split-K partial results live in a temporary of splits * out_len f32 values.
    let mut splits = attrs
        .splits
        .unwrap_or_else(|| choose_splits(g.groups * tiles_x * tiles_y, k));
    if attrs.splits.is_none() {
        let budget = column_budget(ctx);
        splits = splits.min((budget / (out_len * 4)).max(1));
    }
    splits = splits.min(MAX_GROUPS_X as usize / g.groups).max(1);
    if g.groups > MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{op}: {} groups; at most {MAX_GROUPS_X} are supported",
            g.groups
        )));
    }
    if tiles_x > MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{op}: {n} output channels per group are too many"
        )));
    }
    let bk = tile.bk as usize;
    let k_chunk = k.div_ceil(splits).div_ceil(bk) * bk;
    let splits = if k == 0 {
        1
    } else {
        k.div_ceil(k_chunk.max(1))
    };
    let direct = dtype == DType::F32 && splits == 1;
    let o = bind_out(ctx, op, out)?;
    let part = if direct {
        o.clone()
    } else {
        let bytes = (splits * out_len * 4) as u64;
        if bytes > max_bind as u64 {
            return Err(Error::Unimplemented(format!(
                "{op}: the f32 staging buffer of {bytes} bytes for this {dtype} output exceeds \
                 the device's storage binding limit ({max_bind} bytes)"
            )));
        }
        ctx.temp(bytes)?
    };

    // TFWGPU_CONV_CHECKED=1 keeps wgpu's bounds checks (to measure what skipping them gains).
    let trusted = std::env::var_os("TFWGPU_CONV_CHECKED").is_none_or(|v| v == "0");
    let spec = format!(
        "gemm_{}_{}_{}{}{}",
        ["fwd", "bwd_input", "bwd_filter", "plain"][mode_id],
        tile.name,
        if a_mfast { "m" } else { "k" },
        if b_nfast { "n" } else { "k" },
        if trusted { "" } else { "_checked" }
    );
    // Bounds checks off (`Checks::Trusted`): every index of conv_gemm.wgsl is in range by
    // construction. Workgroup tiles: stores at a_k * BM + a_m and b_k * BN + b_n with
    // e = l + i * NT < BM * BK (resp. BN * BK; `Tile::is_valid`), so a_m < BM, a_k < BK; reads
    // at kk * BM + ty + i * TY < BK * BM. Private arrays: loop counters below their constant
    // sizes. Global reads happen only for m < M and k < kend <= K (`a_val`, `b_val` return 0
    // otherwise) and, for windows, only for taps with 0 <= iy < H, 0 <= ix < W (forward, filter
    // gradient) or 0 <= oy < OH, 0 <= ox < OW (input gradient); the decomposed indices (batch
    // < N, channel < cg or kg, group < groups, filter tap < R * S) then address elements of
    // x, dy and the filter through their own strides, so the largest offset is the tensor's
    // last element. The plain mode uses the matrix strides of the same tensors (m < M, k < K,
    // j < N). Stores: rows m < M, columns n < N at the output's own offsets, plus split *
    // out_len with split < splits into a temporary of splits * out_len values. Every tensor
    // has fewer than 2^31 elements (`Conv::geometry`), the temporary at most
    // max_storage_buffer_binding_size bytes, so no offset wraps in u32; signed window
    // coordinates are range-checked before they are converted.
    let pipeline = ctx.pipeline(PipelineKey::new("conv", Some(dtype), spec), || {
        let mut src = ShaderSource::new(
            CONV_GEMM_WGSL
                .replace("$COMMON", COMMON_WGSL)
                .replace("$STORE", store_type(dtype))
                .replace("$LOAD_A", &load(dtype, "src_a"))
                .replace("$LOAD_B", &load(dtype, "src_b"))
                .replace("$MODE_ID", &mode_id.to_string())
                .replace("$A_MFAST_FLAG", &a_mfast.to_string())
                .replace("$B_NFAST_FLAG", &b_nfast.to_string())
                .replace("$TILE_BM", &tile.bm.to_string())
                .replace("$TILE_BN", &tile.bn.to_string())
                .replace("$TILE_BK", &tile.bk.to_string())
                .replace("$TILE_TM", &tile.tm.to_string())
                .replace("$TILE_TN", &tile.tn.to_string()),
        );
        if trusted {
            src.checks = Checks::Trusted;
        }
        src
    })?;
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    let max = MAX_GROUPS_X as usize;
    for y0 in (0..tiles_y).step_by(max) {
        let gy = (tiles_y - y0).min(max);
        let words: Vec<u32> = [
            m, n, k, k_chunk, g.h, g.w, g.cg, kg, g.oh, g.ow, g.k, g.s, g.sh, g.sw, g.dh, g.dw,
            g.pt, g.pl, xs[0], xs[1], xs[2], xs[3], ys[0], ys[1], ys[2], ys[3], splits, out_len,
            y0, 0, 0, 0,
        ]
        .iter()
        .map(|&v| u32_of(op, v))
        .collect::<Result<_>>()?;
        ctx.dispatch(
            &pipeline,
            &params(&words),
            &[a.clone(), b.clone(), part.clone()],
            [tiles_x as u32, gy as u32, (g.groups * splits) as u32],
        )?;
    }
    if !direct {
        finalize(ctx, op, &part, splits, out_len, dtype, &o)?;
    }
    Ok(())
}

/// The heuristic vector tile for a 1x1 convolution's product of M x N (before tuning): large
/// tiles only where the output has the columns for them and enough tiles fill the GPU
/// (`matmul::choose` favours 256x128 for any tall product, wasting half of it when N is 64).
fn plain_tile(batches: usize, m: usize, n: usize, k: usize) -> Vec4Tile {
    let tiles = |bm: usize, bn: usize| batches * m.div_ceil(bm) * n.div_ceil(bn);
    if n >= 256 && tiles(128, 256) >= 120 {
        V4_128X256X16_8X16S1
    } else if n >= 128 && m >= 256 && tiles(256, 128) >= 120 {
        V4_256X128X16_16X8S1
    } else if n >= 128 && m >= 128 && tiles(128, 128) >= 192 {
        V4_128X128X16_8X16S1
    } else if k >= 32 {
        V4_64X64X32_4X4S1
    } else {
        V4_64X64X16_4X4S1
    }
}

/// Splits of the reduction of a filter gradient (K = pixels): a divisor of `k` (the chunks
/// must be equal: they are batches of one product) giving about TARGET_GROUPS workgroups
/// with chunks of at least 256 pixels, at most 256 splits; 1 when the output already fills
/// the GPU. (At most 64 before: the 56x56 1x1 64->64 filter gradient, one 64x64 tile, ran as
/// 64 workgroups on 132 multiprocessors.)
fn plain_splits(out_tiles: usize, k: usize) -> usize {
    split_count(out_tiles, k, TARGET_GROUPS)
}

/// `plain_splits` for a target of `target` workgroups.
pub(super) fn split_count(out_tiles: usize, k: usize, target: usize) -> usize {
    if out_tiles >= target || k < 512 {
        return 1;
    }
    let want = target.div_ceil(out_tiles).min(k / 256).clamp(1, 256);
    (1..=want).rev().find(|s| k.is_multiple_of(*s)).unwrap_or(1)
}

/// The largest divisor of `k` not above `s` whose partial sums (`bytes` per split) fit the
/// column budget.
fn cap_splits(ctx: &KernelContext, s: usize, k: usize, bytes: usize) -> usize {
    let budget = column_budget(ctx);
    (1..=s.max(1))
        .rev()
        .find(|&d| k.is_multiple_of(d) && (d == 1 || d * bytes <= budget))
        .unwrap_or(1)
}

/// A 1x1, stride-1, unpadded NHWC float32 convolution (or gradient) as a product of plain
/// matrices on the matmul family's vector kernels, when their layouts fit (channel counts
/// multiples of 4). `None`: not applicable (the caller uses the implicit GEMM).
///
/// | mode           | A (stored)            | B (stored)          | C        |
/// |----------------|-----------------------|---------------------|----------|
/// | Forward        | x [P, C]              | f [C, K]            | y [P, K] |
/// | BackpropInput  | dy [P, K]             | f [C, K] as N x K   | dx [P, C]|
/// | BackpropFilter | x [P, C] as K x M     | dy [P, K]           | f [C, K] |
///
/// (P = n * h * w pixels.) The filter gradient splits its reduction over pixels into equal
/// chunks run as a batch of products into a temporary, summed by `finalize`.
#[allow(clippy::too_many_arguments)]
fn plain_matmul(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<Option<()>> {
    let p = g.n * g.h * g.w;
    let (c, kk) = (g.c, g.k);
    let (m, n, k, ta, tb) = match mode {
        Mode::Forward => (p, kk, c, false, false),
        Mode::BackpropInput => (p, c, kk, false, true),
        Mode::BackpropFilter => (c, kk, p, true, false),
    };
    let Some((layouts, heuristic, splits)) = vector_plan(ctx, attrs, mode, (m, n, k), ta, tb)
    else {
        return Ok(None);
    };
    let shared = ctx.limits().max_compute_workgroup_storage_size;
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    let o = ctx.bind(out)?;
    let heuristic = Plan::Vec4(heuristic, layouts);
    if mode == Mode::BackpropFilter && attrs.splits.is_none() {
        return filter_products(ctx, op, (m, n, k), layouts, heuristic, splits, (&a, &b, &o))
            .map(Some);
    }
    let chunk = k / splits;
    let (sa, sb) = (chunk * m, chunk * n);
    let gm = Gemm {
        m,
        n,
        k: chunk,
        ta,
        tb,
        dims: if splits > 1 {
            vec![(splits, sa, sb)]
        } else {
            vec![]
        },
        batches: splits,
    };
    let c_buf = if splits > 1 {
        ctx.temp((splits * m * n * 4) as u64)?
    } else {
        o.clone()
    };
    let cands = matmul::candidates(heuristic, splits, m, n, chunk, layouts, shared);
    let plan = matmul::tuned(ctx, op, DType::F32, &gm, &cands, (&a, &b, &c_buf))?;
    tracing::debug!("{op} 1x1 as {m}x{n}x{chunk} x{splits}: {plan:?}");
    matmul::record_plan(ctx, op, plan, DType::F32, &gm, &a, &b, &c_buf)?;
    if splits > 1 {
        finalize(ctx, op, &c_buf, splits, m * n, DType::F32, &o)?;
    }
    Ok(Some(()))
}

/// A 1x1 filter gradient's product x^T dy (M = C, N = K, reduction over the K pixels) with its
/// reduction split into equal chunks: with tuning on, every vector tile with the split counts
/// that give it about one and two TARGET_GROUPS of workgroups (the heuristic tile's count
/// leaves larger tiles with a fraction of the GPU); without, the heuristic plan and `splits`.
fn filter_products(
    ctx: &KernelContext,
    op: &str,
    (m, n, k): (usize, usize, usize),
    layouts: Layouts,
    heuristic: Plan,
    splits: usize,
    (a, b, o): (&BufferRange, &BufferRange, &BufferRange),
) -> Result<()> {
    let shared = ctx.limits().max_compute_workgroup_storage_size;
    let record = |plan: Plan, s: usize| -> Result<()> {
        let chunk = k / s;
        let gm = Gemm {
            m,
            n,
            k: chunk,
            ta: !layouts.a_kfast,
            tb: !layouts.b_nfast,
            dims: if s > 1 {
                vec![(s, chunk * m, chunk * n)]
            } else {
                vec![]
            },
            batches: s,
        };
        if s == 1 {
            return matmul::record_plan(ctx, op, plan, DType::F32, &gm, a, b, o);
        }
        let part = ctx.temp((s * m * n * 4) as u64)?;
        matmul::record_plan(ctx, op, plan, DType::F32, &gm, a, b, &part)?;
        finalize(ctx, op, &part, s, m * n, DType::F32, o)
    };
    let tuner = ctx.tuner();
    if !tuner.enabled() {
        return record(heuristic, splits);
    }
    let mut cands: Vec<(Plan, usize)> = vec![(heuristic, splits)];
    for plan in matmul::candidates(heuristic, splits, m, n, k / splits, layouts, shared) {
        let Plan::Vec4(t, _) = plan else { continue };
        let tiles = m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
        for target in [TARGET_GROUPS, 2 * TARGET_GROUPS] {
            let s = cap_splits(ctx, split_count(tiles, k, target), k, m * n * 4);
            if !cands.contains(&(plan, s)) {
                cands.push((plan, s));
            }
        }
    }
    let names = || {
        cands
            .iter()
            .map(|(p, s)| match p {
                Plan::Vec4(t, _) => format!("{}_s{s}", t.name),
                _ => format!("{p:?}_s{s}"),
            })
            .collect()
    };
    let key = || {
        format!(
            "conv/f32/1x1_bwdf/m{}/n{}/k{}",
            bucket(m),
            bucket(n),
            bucket(k)
        )
    };
    let memo = [
        MEMO_1X1_BWDF,
        column_budget(ctx) as u64,
        m as u64,
        n as u64,
        k as u64,
        layouts.a_kfast as u64,
        layouts.b_nfast as u64,
        splits as u64,
    ];
    let run = |i: usize| record(cands[i].0, cands[i].1);
    let i = tuner.choose_memo(ctx, &memo, key, names, 0, &run);
    tracing::debug!("{op} 1x1 filter gradient {m}x{n}x{k}: {:?}", cands[i]);
    run(i)
}

const IMPLICIT_WGSL: &str = include_str!("implicit.wgsl");

/// `implicit_hooks(mode)`, made once per process (the text is cut out of `implicit.wgsl`
/// line by line: on every kernel call it was a few KiB of string building).
fn implicit_hooks_of(mode: Mode) -> &'static Hooks {
    static HOOKS: std::sync::OnceLock<[Hooks; 3]> = std::sync::OnceLock::new();
    &HOOKS.get_or_init(|| {
        [
            implicit_hooks(Mode::Forward),
            implicit_hooks(Mode::BackpropInput),
            implicit_hooks(Mode::BackpropFilter),
        ]
    })[mode as usize]
}

/// The hooks of `implicit.wgsl` for one mode: the lines between `#if MODE_<NAME>` and
/// `#endif` of that mode, and those outside every block.
fn implicit_hooks(mode: Mode) -> Hooks {
    let want = match mode {
        Mode::Forward => "MODE_FWD",
        Mode::BackpropInput => "MODE_BWD_INPUT",
        Mode::BackpropFilter => "MODE_BWD_FILTER",
    };
    let mut keep = true;
    let mut text = String::new();
    for line in IMPLICIT_WGSL.lines() {
        if let Some(name) = line.strip_prefix("#if ") {
            keep = name.trim() == want;
        } else if line.starts_with("#endif") {
            keep = true;
        } else if keep {
            text.push_str(line);
            text.push('\n');
        }
    }
    Hooks {
        a: true,
        b: mode == Mode::BackpropInput,
        wgsl: text,
    }
}

/// A float32 NHWC one-group convolution (or gradient) that is not a plain product, on the
/// matmul family's register-blocked vector shader with its operands addressed through the
/// windows (`implicit.wgsl`): channel counts multiples of 4 (a vector never leaves its pixel),
/// the input gradient only at stride 1 (taps between strided outputs would be wasted work).
/// The filter gradient splits its pixel reduction into equal chunks as a batch of products
/// summed by `finalize`. Tuning (when on) times the vector tiles and the heuristic tile of
/// the implicit GEMM shader; `None`: not applicable.
#[allow(clippy::too_many_arguments)]
fn implicit_vec4(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<Option<()>> {
    if g.nchw || g.groups != 1 || !g.c.is_multiple_of(4) || !g.k.is_multiple_of(4) {
        return Ok(None);
    }
    if mode == Mode::BackpropInput && (g.sh != 1 || g.sw != 1) {
        return Ok(None);
    }
    let (rsz, p_in, p_out) = (g.r * g.s, g.n * g.h * g.w, g.n * g.oh * g.ow);
    let (m, n, k, ta, tb) = match mode {
        Mode::Forward => (p_out, g.k, rsz * g.c, false, false),
        Mode::BackpropInput => (p_in, g.c, rsz * g.k, false, true),
        Mode::BackpropFilter => (rsz * g.c, g.k, p_out, true, false),
    };
    let Some((layouts, heuristic, splits)) = vector_plan(ctx, attrs, mode, (m, n, k), ta, tb)
    else {
        return Ok(None);
    };
    let shared = ctx.limits().max_compute_workgroup_storage_size;
    let hp: Vec<u32> = [
        g.h, g.w, g.c, g.oh, g.ow, g.k, g.s, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl,
    ]
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<_>>()?;
    let hooks = implicit_hooks_of(mode);
    let name = ["cv4fwd", "cv4bwdi", "cv4bwdf"][mode as usize];
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    let o = ctx.bind(out)?;
    // One candidate: a plan with its split count (filter gradients; 1 otherwise).
    let record = |plan: Plan, splits: usize| -> Result<()> {
        let chunk = k / splits;
        // Batch offsets: A's is the first K index of the split (the hook adds it), B's (dy,
        // plain) its first row.
        let gm = Gemm {
            m,
            n,
            k: chunk,
            ta,
            tb,
            dims: if splits > 1 {
                vec![(splits, chunk, chunk * n)]
            } else {
                vec![]
            },
            batches: splits,
        };
        let c_buf = if splits > 1 {
            ctx.temp((splits * m * n * 4) as u64)?
        } else {
            o.clone()
        };
        matmul::record_plan_hooked(
            ctx,
            op,
            plan,
            DType::F32,
            &gm,
            (&a, &b, &c_buf),
            Some((name, hooks, &hp)),
        )?;
        if splits > 1 {
            finalize(ctx, op, &c_buf, splits, m * n, DType::F32, &o)?;
        }
        Ok(())
    };
    let heuristic = Plan::Vec4(heuristic, layouts);
    let tuner = ctx.tuner();
    if !tuner.enabled() {
        record(heuristic, splits)?;
        return Ok(Some(()));
    }
    // Candidates: the vector tiles, and the implicit GEMM shader's own heuristic tile (so
    // that tuning never does worse than that path). Filter gradients: each tile with the
    // split counts that give it about one and two TARGET_GROUPS of workgroups (the heuristic's
    // count suits only its own tile: a large tile at that count leaves the GPU half idle).
    let mut cands: Vec<(Plan, usize)> = vec![(heuristic, splits)];
    for plan in matmul::candidates(heuristic, splits, m, n, k / splits, layouts, shared) {
        if mode != Mode::BackpropFilter || attrs.splits.is_some() {
            if !cands.contains(&(plan, splits)) {
                cands.push((plan, splits));
            }
            continue;
        }
        let Plan::Vec4(t, _) = plan else { continue };
        let tiles = m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
        for target in [TARGET_GROUPS, 2 * TARGET_GROUPS] {
            let s = cap_splits(ctx, split_count(tiles, k, target), k, m * n * 4);
            if !cands.contains(&(plan, s)) {
                cands.push((plan, s));
            }
        }
    }
    // Filter gradients of 3x3 stride-1 layers: the Winograd transform too (winograd.rs),
    // each product tile with the split counts that fill the GPU.
    let mut wino: Vec<(Plan, usize)> = vec![];
    let wl = if mode == Mode::BackpropFilter && attrs.splits.is_none() && winograd::applies(g) {
        winograd::layout(g, column_budget(ctx))
    } else {
        None
    };
    if let Some(wl) = &wl {
        let wlay = Layouts {
            a_kfast: false,
            b_nfast: true,
        };
        let wh = Plan::Vec4(plain_tile(16, g.c, g.k, wl.tiles), wlay);
        for plan in matmul::candidates(wh, 16, g.c, g.k, wl.tiles, wlay, shared) {
            let Plan::Vec4(t, _) = plan else { continue };
            let tiles = 16 * g.c.div_ceil(t.bm as usize) * g.k.div_ceil(t.bn as usize);
            for target in [TARGET_GROUPS, 2 * TARGET_GROUPS] {
                let s = split_count(tiles, wl.tiles, target);
                if winograd::parts_fit(g, wl, s) && !wino.contains(&(plan, s)) {
                    wino.push((plan, s));
                }
            }
        }
    }
    // Forward passes and stride-1 input gradients of 3x3 stride-1 layers: Winograd
    // F(2x2, 3x3) (winograd.rs `record_forward`), each product tile.
    let wc = match mode {
        Mode::Forward => winograd::corr(g, false, column_budget(ctx)),
        Mode::BackpropInput => winograd::corr(g, true, column_budget(ctx)),
        Mode::BackpropFilter => None,
    };
    let mut wfw: Vec<Plan> = vec![];
    if let Some(wc) = &wc {
        let wlay = Layouts {
            a_kfast: true,
            b_nfast: true,
        };
        let wh = Plan::Vec4(plain_tile(16, wc.tiles, wc.cout, wc.cin), wlay);
        if wlay.fit(wc.tiles, wc.cout, wc.cin) {
            for plan in matmul::candidates(wh, 16, wc.tiles, wc.cout, wc.cin, wlay, shared) {
                if !wfw.contains(&plan) {
                    wfw.push(plan);
                }
            }
        }
    }
    let tile_name = |p: &Plan| match p {
        Plan::Vec4(t, _) => t.name.to_string(),
        _ => format!("{p:?}"),
    };
    let old = choose_tile(m, n, 1);
    let names = || {
        let mut names: Vec<String> = cands
            .iter()
            .map(|(p, s)| {
                if mode == Mode::BackpropFilter {
                    format!("{}_s{s}", tile_name(p))
                } else {
                    tile_name(p)
                }
            })
            .collect();
        names.extend(
            wino.iter()
                .map(|(p, s)| format!("wino_{}_s{s}", tile_name(p))),
        );
        names.extend(wfw.iter().map(|p| format!("wino_{}", tile_name(p))));
        names.push(format!("gemm_{}", old.name));
        names
    };
    let key = || {
        format!(
            "conv/f32/{name}/r{}s{}/st{}x{}/m{}/n{}/k{}",
            g.r,
            g.s,
            g.sh,
            g.sw,
            bucket(m),
            bucket(n),
            bucket(k)
        )
    };
    let run_old = || -> Result<()> {
        let o_attrs = ConvAttrs {
            tile: Some(old.name.to_string()),
            ..attrs.clone()
        };
        self::record(ctx, op, mode, g, &o_attrs, a_ref, b_ref, out)
    };
    let run = |i: usize| -> Result<()> {
        if let Some(&(plan, s)) = cands.get(i) {
            return record(plan, s);
        }
        let j = i - cands.len();
        if let (Some(&(plan, s)), Some(wl)) = (wino.get(j), &wl) {
            return winograd::record(ctx, op, g, wl, plan, s, a_ref, b_ref, out);
        }
        if let (Some(&plan), Some(wc)) = (wfw.get(j - wino.len()), &wc) {
            return winograd::record_forward(ctx, op, wc, plan, a_ref, b_ref, out);
        }
        run_old()
    };
    let i = tuner.choose_memo(
        ctx,
        &geom_memo(ctx, MEMO_V4, mode, g, attrs),
        key,
        names,
        0,
        &run,
    );
    tracing::debug!("{op} implicit {m}x{n}x{k}: {}", names()[i]);
    run(i)?;
    Ok(Some(()))
}

const COL2IM_WGSL: &str = include_str!("col2im.wgsl");
const IM2COL_WGSL: &str = include_str!("im2col.wgsl");

/// The most bytes one column buffer may take: a quarter of the allocator's regular heap (and
/// at most the binding limit), so that the columns are sub-allocated from the regular heaps
/// and reused run after run. A larger buffer gets a dedicated heap of its own, created and
/// released on every run (a driver allocation, zero-filled by wgpu before its first use, each
/// time): ResNet's first layer took 2.7 ms instead of ~0.5 that way (request 1 of this round).
pub(super) fn column_budget(ctx: &KernelContext) -> usize {
    let heap = ctx.dev.alloc.heap_size() as usize;
    let max_bind = ctx.limits().max_storage_buffer_binding_size as usize;
    (heap / 4).min(max_bind).min(256 << 20)
}

/// Images per column group: a divisor of `n` (equal groups: one product shape, one tuning
/// key) whose columns (`per_img` bytes an image) fit `budget`, at most `forced`, and, when
/// there is more than one group, whose slices of the tensors bound per group (`bytes_per_img`
/// each) start at aligned offsets (`align`); `None` if no group size qualifies.
pub(super) fn column_images(
    n: usize,
    per_img: usize,
    budget: usize,
    forced: Option<usize>,
    bytes_per_img: &[usize],
    align: usize,
) -> Option<usize> {
    if per_img == 0 || per_img > budget || n == 0 {
        return None;
    }
    let most = forced.unwrap_or(budget / per_img).clamp(1, n);
    (1..=most).rev().find(|&i| {
        n.is_multiple_of(i)
            && (i == n || bytes_per_img.iter().all(|b| (i * b).is_multiple_of(align)))
    })
}

/// The forward pass or filter gradient of a float32 NHWC one-group convolution whose input
/// depth is not a multiple of 4 (ResNet's first layer: 3 channels), which the implicit
/// vector path cannot take: the windows are first written out as columns
/// col[(n, oy, ox), (r, s, c)] (rows padded to nc, a multiple of 4, with zeros; `im2col.wgsl`),
/// then multiplied on the matmul vector kernels: forward col x f (the filter padded to nc rows
/// with zeros), filter gradient col^T x dy with the pixel reduction split into equal chunks
/// (a batch of products summed by `finalize`), its first R*S*C rows copied out. The columns
/// are written for equal groups of images at a time, each group's at most `column_budget`
/// bytes (one buffer reused by every group); `None`: not applicable.
#[allow(clippy::too_many_arguments)]
fn im2col_gemm(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    x_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<Option<()>> {
    if g.nchw || g.groups != 1 || !g.k.is_multiple_of(4) || g.c.is_multiple_of(4) {
        return Ok(None);
    }
    let rsc = g.r * g.s * g.c;
    let nc = rsc.next_multiple_of(4);
    let pix = g.oh * g.ow;
    let p = g.n * pix;
    if rsc < 4 || p < 16 {
        return Ok(None);
    }
    let align = ctx.limits().min_storage_buffer_offset_alignment as usize;
    // Per group, dy (filter gradient) or y (forward) is bound at the group's first image.
    let Some(imgs) = column_images(
        g.n,
        pix * nc * 4,
        column_budget(ctx),
        attrs.col_images,
        &[pix * g.k * 4],
        align,
    ) else {
        return Ok(None);
    };
    let ngroups = g.n / imgs;
    if ngroups > 1 && !(b_ref.addr as usize).is_multiple_of(align) && mode != Mode::Forward {
        return Ok(None);
    }
    if ngroups > 1 && !(out.addr as usize).is_multiple_of(align) && mode == Mode::Forward {
        return Ok(None);
    }
    let pg = imgs * pix;
    let shared = ctx.limits().max_compute_workgroup_storage_size;
    let (m, n, k, ta) = match mode {
        Mode::Forward => (pg, g.k, nc, false),
        _ => (nc, g.k, pg, true),
    };
    let layouts = Layouts {
        a_kfast: !ta,
        b_nfast: true,
    };
    let heuristic = plain_tile(1, m, n, k);
    if heuristic.shared_bytes() > shared || !layouts.fit(m, n, k) {
        return Ok(None);
    }
    // (Bound on first use too: an unaligned x is copied by `bind`.)
    let x = Lazy::new(|| ctx.bind(x_ref));
    let col = Lazy::new(|| ctx.temp((pg * nc * 4) as u64));
    let pipeline = ctx.pipeline(
        PipelineKey::new("conv", Some(DType::F32), "im2col_v4"),
        || {
            ShaderSource::new(
                IM2COL_WGSL
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$WG", &WG.to_string()),
            )
        },
    )?;
    // Vectors of 4 column elements (nc is a multiple of 4).
    let total = pg * nc / 4;
    let (wgs, row) = grid_1d(total as u64, WG);
    // The columns of group `gi` (images gi * imgs ..).
    let im2col = |gi: usize| -> Result<()> {
        let words: Vec<u32> = [
            row as usize,
            total,
            g.h,
            g.w,
            g.c,
            g.s,
            g.oh,
            g.ow,
            g.sh,
            g.sw,
            g.dh,
            g.dw,
            g.pt,
            g.pl,
            rsc,
            nc,
            gi * pg,
            0,
            0,
            0,
        ]
        .iter()
        .map(|&v| u32_of(op, v))
        .collect::<Result<_>>()?;
        ctx.dispatch(&pipeline, &params(&words), &[x.get()?, col.get()?], wgs)
    };
    // y / dy rows of group gi.
    let rows_of = |r: &DeviceRef, gi: usize| -> Result<crate::exec::BufferRange> {
        if ngroups == 1 {
            return ctx.bind(r);
        }
        ctx.bind_bytes(r.addr + (gi * pg * g.k * 4) as u64, (pg * g.k * 4) as u64)
    };
    let old_m = if mode == Mode::Forward { p } else { rsc };
    let old = || -> Result<()> {
        record_previous(ctx, op, mode, g, attrs, old_m, g.k, x_ref, b_ref, out)
    };
    if mode == Mode::Forward {
        // The filter as nc x K rows (zero rows past R*S*C).
        let fbytes = (rsc * g.k * 4) as u64;
        let fpad = Lazy::new(|| {
            let b = ctx.bind(b_ref)?;
            if nc == rsc {
                return Ok(b);
            }
            let t = ctx.temp((nc * g.k * 4) as u64)?;
            ctx.copy(&b, &t, fbytes)?;
            let mut tail = t.clone();
            tail.offset += fbytes;
            tail.size -= fbytes;
            ctx.clear(&tail, ((nc - rsc) * g.k * 4) as u64)?;
            Ok(t)
        });
        let gm = Gemm {
            m,
            n,
            k,
            ta,
            tb: false,
            dims: vec![],
            batches: 1,
        };
        let cands = matmul::candidates(Plan::Vec4(heuristic, layouts), 1, m, n, k, layouts, shared);
        let run = |plan: Option<Plan>| -> Result<()> {
            let Some(plan) = plan else {
                return old();
            };
            let (col, fpad) = (col.get()?, fpad.get()?);
            for gi in 0..ngroups {
                im2col(gi)?;
                let y = rows_of(out, gi)?;
                matmul::record_plan(ctx, op, plan, DType::F32, &gm, &col, &fpad, &y)?;
            }
            Ok(())
        };
        let key = || {
            format!(
                "conv/f32/im2col_fwd/m{}/n{}/k{}/g{}",
                bucket(m),
                bucket(n),
                bucket(k),
                bucket(ngroups)
            )
        };
        let memo = [
            MEMO_IM2COL_FWD,
            m as u64,
            n as u64,
            k as u64,
            ngroups as u64,
        ];
        let plan = tune_with_previous(ctx, &memo, key, &cands, &run);
        run(plan)?;
        return Ok(Some(()));
    }
    // Filter gradient: each group's pixels split into equal chunks (a batch of products into
    // consecutive slices of the partial sums), all slices summed by one finalize pass.
    let o = ctx.bind(out)?;
    let tiles = m.div_ceil(heuristic.bm as usize) * n.div_ceil(heuristic.bn as usize);
    let slice = m * n * 4;
    let per_group = attrs
        .splits
        .filter(|s| k.is_multiple_of(*s))
        .unwrap_or_else(|| plain_splits(tiles, k));
    // Each group's slices start at an aligned offset.
    let budget = column_budget(ctx);
    let Some(splits) = (1..=per_group).rev().find(|&s| {
        k.is_multiple_of(s)
            && (ngroups == 1 || (s * slice).is_multiple_of(align))
            && (s == 1 || s * slice * ngroups <= budget)
    }) else {
        return Ok(None);
    };
    let chunk = k / splits;
    let gm = Gemm {
        m,
        n,
        k: chunk,
        ta,
        tb: false,
        dims: if splits > 1 {
            vec![(splits, chunk * m, chunk * n)]
        } else {
            vec![]
        },
        batches: splits,
    };
    let parts = splits * ngroups;
    let part = Lazy::new(|| ctx.temp((parts * slice) as u64));
    let sum = (nc != rsc).then(|| Lazy::new(|| ctx.temp(slice as u64)));
    let cands = matmul::candidates(
        Plan::Vec4(heuristic, layouts),
        splits,
        m,
        n,
        chunk,
        layouts,
        shared,
    );
    let len = rsc * g.k;
    let run = |plan: Option<Plan>| -> Result<()> {
        let Some(plan) = plan else {
            return old();
        };
        for gi in 0..ngroups {
            im2col(gi)?;
            let dy = rows_of(b_ref, gi)?;
            let mut dst = part.get()?;
            dst.offset += (gi * splits * slice) as u64;
            dst.size = (splits * slice) as u64;
            matmul::record_plan(ctx, op, plan, DType::F32, &gm, &col.get()?, &dy, &dst)?;
        }
        let part = part.get()?;
        match sum.as_ref().map(Lazy::get).transpose()? {
            None => finalize(ctx, op, &part, parts, m * n, DType::F32, &o),
            Some(sum) => {
                // Sum into nc x K, then keep the first R*S*C rows.
                finalize(ctx, op, &part, parts, m * n, DType::F32, &sum)?;
                ctx.copy(&sum, &o, (len * 4) as u64)
            }
        }
    };
    let key = || {
        format!(
            "conv/f32/im2col_bwdf/m{}/n{}/k{}/s{}",
            bucket(m),
            bucket(n),
            bucket(chunk),
            bucket(parts)
        )
    };
    let memo = [
        MEMO_IM2COL_BWDF,
        m as u64,
        n as u64,
        k as u64,
        chunk as u64,
        splits as u64,
        parts as u64,
    ];
    let plan = tune_with_previous(ctx, &memo, key, &cands, &run);
    run(plan)?;
    Ok(Some(()))
}

/// The previous path for a product of M x N (per group): the implicit GEMM shader with its
/// heuristic tile (a candidate the tuner compares the column paths with).
#[allow(clippy::too_many_arguments)]
fn record_previous(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    m: usize,
    n: usize,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let o_attrs = ConvAttrs {
        tile: Some(choose_tile(m, n, 1).name.to_string()),
        ..attrs.clone()
    };
    self::record(ctx, op, mode, g, &o_attrs, a_ref, b_ref, out)
}

/// The tuner's choice between the vector plans `cands` (`run(Some(plan))` records the whole
/// path with that plan) and the previous implicit-GEMM path (`run(None)`), so that tuning never
/// picks a path slower than the previous one; without tuning, `cands[0]`.
fn tune_with_previous(
    ctx: &KernelContext,
    memo: &[u64],
    key: impl FnOnce() -> String,
    cands: &[Plan],
    run: &dyn Fn(Option<Plan>) -> Result<()>,
) -> Option<Plan> {
    let tuner = ctx.tuner();
    if !tuner.enabled() {
        return Some(cands[0]);
    }
    let names = || {
        let mut names: Vec<String> = cands
            .iter()
            .map(|p| match p {
                Plan::Vec4(t, _) => t.name.to_string(),
                _ => format!("{p:?}"),
            })
            .collect();
        names.push("previous".to_string());
        names
    };
    let i = tuner.choose_memo(ctx, memo, key, names, 0, &|i| run(cands.get(i).copied()));
    cands.get(i).copied()
}

/// Tags of the conv family's tuned call sites, the first word of their memo keys
/// (`Tuner::choose_memo`).
const MEMO_TILE: u64 = 1;
const MEMO_1X1_BWDF: u64 = 2;
const MEMO_V4: u64 = 3;
const MEMO_IM2COL_FWD: u64 = 4;
const MEMO_IM2COL_BWDF: u64 = 5;
const MEMO_COL2IM: u64 = 6;

/// A memo key of a call site whose candidates follow from the geometry, the mode, the
/// internal attributes and the column budget (the device's limits are the tuner's own: one
/// tuner per adapter; the budget follows the heap size too).
fn geom_memo(ctx: &KernelContext, tag: u64, mode: Mode, g: &Geom, attrs: &ConvAttrs) -> [u64; 24] {
    let opt = |v: Option<usize>| v.map_or(0, |x| x as u64 + 1);
    [
        column_budget(ctx) as u64,
        tag,
        mode as u64,
        g.n as u64,
        g.h as u64,
        g.w as u64,
        g.c as u64,
        g.r as u64,
        g.s as u64,
        g.cg as u64,
        g.k as u64,
        g.groups as u64,
        g.oh as u64,
        g.ow as u64,
        g.pt as u64,
        g.pl as u64,
        g.sh as u64,
        g.sw as u64,
        g.dh as u64,
        g.dw as u64,
        g.nchw as u64,
        opt(attrs.splits),
        opt(attrs.col_images),
        attrs.heuristic_gemm as u64,
    ]
}

/// The input gradient of a float32 NHWC one-group convolution that the implicit vector path
/// does not take (strided, or input depth not a multiple of 4), as a product into columns,
/// col[(n, oy, ox), (r, s, c)] = dy[(n, oy, ox), :] . f[(r, s, c), :] on the matmul vector
/// kernels (dy read row-major, f as N x K; R*S*C padded to a multiple of 4 with zero filter
/// rows), then `col2im.wgsl` summing each dx element's taps. No work is spent on the taps that
/// fall between strided outputs (the implicit GEMM reads them as zeros). The columns take
/// at most `column_budget` bytes: images are processed in groups that fit.
/// `None`: not applicable (output depth not a multiple of 4, NCHW, groups). `group` (the
/// internal `_tfwgpu_splits`, for tests) forces the images per group.
fn bwd_input_col2im(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    f_ref: &DeviceRef,
    dy_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<Option<()>> {
    if g.nchw || g.groups != 1 || !g.k.is_multiple_of(4) || g.n == 0 {
        return Ok(None);
    }
    let rsc = g.r * g.s * g.c;
    let nc = rsc.next_multiple_of(4);
    let pix = g.oh * g.ow;
    let per_img = pix * nc * 4;
    let budget = column_budget(ctx);
    if per_img == 0 || per_img > budget || rsc < 4 {
        return Ok(None);
    }
    let shared = ctx.limits().max_compute_workgroup_storage_size;
    let imgs = attrs
        .col_images
        .or(attrs.splits)
        .unwrap_or(budget / per_img)
        .clamp(1, g.n);
    let layouts = Layouts {
        a_kfast: true,
        b_nfast: false,
    };
    let heuristic = plain_tile(1, imgs * pix, nc, g.k);
    if heuristic.shared_bytes() > shared || !layouts.fit(imgs * pix, nc, g.k) {
        return Ok(None);
    }
    // The filter as an N x K matrix of nc rows (zero rows past R*S*C).
    let fbytes = (rsc * g.k * 4) as u64;
    let fpad = Lazy::new(|| {
        let f = ctx.bind(f_ref)?;
        if nc == rsc {
            return Ok(f);
        }
        let t = ctx.temp((nc * g.k * 4) as u64)?;
        ctx.copy(&f, &t, fbytes)?;
        let mut tail = t.clone();
        tail.offset += fbytes;
        tail.size -= fbytes;
        ctx.clear(&tail, ((nc - rsc) * g.k * 4) as u64)?;
        Ok(t)
    });
    let col = Lazy::new(|| ctx.temp((imgs * per_img) as u64));
    let dx = ctx.bind(out)?;
    // Four channels per invocation where the depth allows (16-byte loads and stores).
    let v = if g.c.is_multiple_of(4) { 4 } else { 1 };
    let spec = if v == 4 { "col2im_v4" } else { "col2im" };
    let pipeline = ctx.pipeline(PipelineKey::new("conv", Some(DType::F32), spec), || {
        ShaderSource::new(
            COL2IM_WGSL
                .replace("$LINEAR_INDEX", LINEAR_INDEX)
                .replace("$ELEM", if v == 4 { "vec4<f32>" } else { "f32" })
                .replace("$WG", &WG.to_string()),
        )
    })?;
    let img_in = g.h * g.w * g.c;
    let record_columns = |plan: Plan| -> Result<()> {
        let (fpad, col) = (fpad.get()?, col.get()?);
        for n0 in (0..g.n).step_by(imgs) {
            let cnt = imgs.min(g.n - n0);
            let m = cnt * pix;
            let dy = ctx.bind_bytes(
                dy_ref.addr + (n0 * pix * g.k * 4) as u64,
                (m * g.k * 4) as u64,
            )?;
            let gm = Gemm {
                m,
                n: nc,
                k: g.k,
                ta: false,
                tb: true,
                dims: vec![],
                batches: 1,
            };
            matmul::record_plan(ctx, op, plan, DType::F32, &gm, &dy, &fpad, &col)?;
            let total = cnt * img_in / v;
            let (groups, row) = grid_1d(total as u64, WG);
            let words: Vec<u32> = [
                total,
                g.h,
                g.w,
                g.c / v,
                g.r,
                g.s,
                g.oh,
                g.ow,
                g.sh,
                g.sw,
                g.dh,
                g.dw,
                g.pt,
                g.pl,
                nc / v,
                n0 * img_in / v,
                0,
                0,
                0,
            ]
            .iter()
            .map(|&v| u32_of(op, v))
            .collect::<Result<_>>()?;
            let mut all = vec![row];
            all.extend(words);
            ctx.dispatch(&pipeline, &params(&all), &[col.clone(), dx.clone()], groups)?;
        }
        Ok(())
    };
    let run = |plan: Option<Plan>| -> Result<()> {
        let Some(plan) = plan else {
            let m = g.n * g.h * g.w;
            return record_previous(
                ctx,
                op,
                Mode::BackpropInput,
                g,
                attrs,
                m,
                g.c,
                dy_ref,
                f_ref,
                out,
            );
        };
        record_columns(plan)
    };
    let m = imgs * pix;
    let cands = matmul::candidates(
        Plan::Vec4(plain_tile(1, m, nc, g.k), layouts),
        1,
        m,
        nc,
        g.k,
        layouts,
        shared,
    );
    let key = || {
        format!(
            "conv/f32/col2im/r{}s{}/st{}x{}/m{}/n{}/k{}",
            g.r,
            g.s,
            g.sh,
            g.sw,
            bucket(m),
            bucket(nc),
            bucket(g.k)
        )
    };
    let memo = [
        MEMO_COL2IM,
        g.r as u64,
        g.s as u64,
        g.sh as u64,
        g.sw as u64,
        m as u64,
        nc as u64,
        g.k as u64,
    ];
    let plan = tune_with_previous(ctx, &memo, key, &cands, &run);
    run(plan)?;
    Ok(Some(()))
}

const FINALIZE_WIDE_WGSL: &str = include_str!("finalize_wide.wgsl");

/// `finalize` for float32 outputs with many splits (`finalize_wide.wgsl`): each output's
/// splits spread over `lanes` invocations (a power of two, up to 64), enough of them for about
/// 128k invocations in all, summed by a tree.
fn finalize_wide(
    ctx: &KernelContext,
    op: &str,
    part: &crate::exec::BufferRange,
    splits: usize,
    len: usize,
    out: &crate::exec::BufferRange,
) -> Result<()> {
    let pipeline = ctx.pipeline(
        PipelineKey::new("conv", Some(DType::F32), "finalize_wide"),
        || ShaderSource::new(FINALIZE_WIDE_WGSL.to_string()),
    )?;
    let mut lanes = 1usize;
    while lanes < 64 && lanes * 2 <= splits && len * lanes * 2 <= 128 * 1024 {
        lanes *= 2;
    }
    let per_wg = 256 / lanes;
    let groups = len.div_ceil(per_wg);
    let max = MAX_GROUPS_X as usize;
    let (gx, gy) = if groups <= max {
        (groups, 1)
    } else {
        (max, groups.div_ceil(max))
    };
    let p = params(&[
        u32_of(op, len)?,
        u32_of(op, splits)?,
        lanes as u32,
        per_wg as u32,
    ]);
    ctx.dispatch(
        &pipeline,
        &p,
        &[part.clone(), out.clone()],
        [gx as u32, gy as u32, 1],
    )
}

/// Sums `splits` copies of `len` f32 values in `part` into `out` (dtype `dtype`).
pub(super) fn finalize(
    ctx: &KernelContext,
    op: &str,
    part: &crate::exec::BufferRange,
    splits: usize,
    len: usize,
    dtype: DType,
    out: &crate::exec::BufferRange,
) -> Result<()> {
    if !matches!(dtype, DType::F32 | DType::F16) {
        bail_invalid!("{op}: no finalize for {dtype}");
    }
    if dtype == DType::F32 && splits >= 8 {
        return finalize_wide(ctx, op, part, splits, len, out);
    }
    let pipeline = ctx.pipeline(PipelineKey::new("conv", Some(dtype), "finalize"), || {
        let store = match dtype {
            DType::F16 => {
                "    let e0 = w * 2u;
    let lo = f32_to_f16(total(e0));
    var hi = 0u;
    if e0 + 1u < p.len {
        hi = f32_to_f16(total(e0 + 1u));
    }
    out[w] = lo | (hi << 16u);"
            }
            _ => "    out[w] = bitcast<u32>(total(w));",
        };
        ShaderSource::new(
            FINALIZE_WGSL
                .replace("$LINEAR_INDEX", LINEAR_INDEX)
                .replace("$COMMON", COMMON_WGSL)
                .replace("$STORE", store)
                .replace("$WG", &WG.to_string()),
        )
    })?;
    let words = if dtype == DType::F16 {
        len.div_ceil(2)
    } else {
        len
    };
    let (groups, row) = grid_1d(words as u64, WG);
    let p = params(&[
        row,
        u32_of(op, words)?,
        u32_of(op, len)?,
        u32_of(op, splits)?,
    ]);
    ctx.dispatch(&pipeline, &p, &[part.clone(), out.clone()], groups)
}

/// How a convolution run as an M x N x K product on the matmul vector kernels (A read
/// transposed when `ta`, B when `tb`) is laid out: the operand layouts, the heuristic tile and
/// the split-K count (filter gradients only); `None` where those kernels cannot take it.
fn vector_plan(
    ctx: &KernelContext,
    attrs: &ConvAttrs,
    mode: Mode,
    (m, n, k): (usize, usize, usize),
    ta: bool,
    tb: bool,
) -> Option<(Layouts, Vec4Tile, usize)> {
    let layouts = Layouts {
        a_kfast: !ta,
        b_nfast: !tb,
    };
    if !layouts.fit(m, n, k) || m < 16 || n < 16 || k == 0 {
        return None;
    }
    let heuristic = plain_tile(1, m, n, k);
    if heuristic.shared_bytes() > ctx.limits().max_compute_workgroup_storage_size {
        return None;
    }
    // Filter gradients: the forced `splits` attribute when it divides K, else enough chunks to
    // fill the device with the heuristic's output tiles; one when the partial sums would not
    // fit the column budget (see `column_budget`: no dedicated heap per run).
    let splits = if mode == Mode::BackpropFilter {
        let tiles = m.div_ceil(heuristic.bm as usize) * n.div_ceil(heuristic.bn as usize);
        let s = attrs
            .splits
            .filter(|s| k.is_multiple_of(*s))
            .unwrap_or_else(|| plain_splits(tiles, k));
        cap_splits(ctx, s, k, m * n * 4)
    } else {
        1
    };
    Some((layouts, heuristic, splits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implicit_hooks_per_mode() {
        for (mode, b) in [
            (Mode::Forward, false),
            (Mode::BackpropInput, true),
            (Mode::BackpropFilter, false),
        ] {
            let h = implicit_hooks(mode);
            assert!(h.a);
            assert_eq!(h.b, b);
            assert_eq!(h.wgsl.matches("fn a_pre(").count(), 1, "{mode:?}");
            assert_eq!(h.wgsl.matches("fn a_load(").count(), 1, "{mode:?}");
            assert_eq!(h.wgsl.contains("fn b_load("), b, "{mode:?}");
            assert!(!h.wgsl.contains("#if") && !h.wgsl.contains("#endif"));
        }
    }

    #[test]
    fn plain_choices() {
        // 1x1 at 56x56x64 -> 64, batch 32: no 256-wide tile for 64 columns.
        assert_eq!(plain_tile(1, 100352, 64, 64).name, "64x64x32_4x4s1");
        assert_eq!(plain_tile(1, 100352, 256, 64).name, "128x256x16_8x16s1");
        assert_eq!(plain_tile(1, 25088, 128, 512).name, "128x128x16_8x16s1");
        // Split-K of a filter gradient: a divisor of the pixel count.
        assert_eq!(plain_splits(1, 832), 2);
        assert_eq!(plain_splits(1, 100352), 256);
        assert_eq!(plain_splits(9, 100352), 28);
        assert_eq!(plain_splits(300, 100352), 1);
        assert_eq!(plain_splits(1, 300), 1);
        assert_eq!(plain_splits(4, 1021), 1, "a prime: no split");
    }

    #[test]
    fn tile_and_split_choice() {
        // ResNet-50 conv2 (56x56x64 -> 64, batch 32): many tiles, no split.
        assert_eq!(choose_tile(32 * 56 * 56, 64, 1), T128X128);
        assert_eq!(choose_splits(784, 576), 1);
        // Few output channels: the narrow tile.
        assert_eq!(choose_tile(32 * 112 * 112, 16, 1), T128X32);
        // A filter gradient: few tiles, a long reduction: split.
        let tiles = (3 * 3 * 64usize).div_ceil(64) * 64usize.div_ceil(64);
        assert_eq!(choose_tile(3 * 3 * 64, 64, 1), T64X64);
        assert_eq!(choose_splits(tiles, 32 * 56 * 56), 30);
        assert_eq!(choose_splits(tiles, 300), 1);
        assert_eq!(choose_tile(7, 5, 1), T32X32);
    }
}
