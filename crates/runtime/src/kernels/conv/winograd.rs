//! Winograd F(3x3, 2x2) filter gradient of 3x3 stride-1 float32 NHWC convolutions
//! (`winograd.wgsl`): the input windows and dy are transformed per 2x2 tile of output positions
//! (16 values each instead of the 4x4 window's 36 products per tile), the tiles are summed by
//! 16 products U[e] = Xh[e]^T Dh[e] (C x K each, a batch on the matmul vector kernels, the
//! tiles split into equal chunks), and AT U A gives the 3x3 filter gradient: 2.25x fewer
//! multiplications than the direct reduction (cuDNN's weight gradients run faster than the
//! FFMA peak on these shapes: a transform algorithm). The transforms only add, subtract and
//! halve (exact), so the rounding differs from the direct sum only by the order and grouping
//! of the additions; the tuner offers it next to the direct products, and
//! `TFWGPU_CONV_WINOGRAD=0` leaves it out.
//!
//! Images are processed in equal groups whose transformed operands fit the column budget;
//! each group's products write their own slices of the partial sums, all summed by the
//! output transform.
//!
//! The forward pass and the stride-1 input gradient of the same layers use F(2x2, 3x3)
//! (`winograd_fwd.wgsl`, `record_forward`): 16 products V[e] U[e] (2x2 output tiles x input
//! channels times input x output channels) instead of 36 products per tile and channel pair;
//! the input gradient is the correlation of dy with the filter flipped and transposed.

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, KernelContext, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::bind_out;
use crate::kernels::matmul::{self, Gemm, Plan};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result};

use super::Geom;

const WINOGRAD_WGSL: &str = include_str!("winograd.wgsl");
/// The input transform both Winograd kernels share (`$INPUT_TRANSFORM` in them).
const WINOGRAD_INPUT_WGSL: &str = include_str!("winograd_input.wgsl");

/// The largest partial sums (all parts of the 16 U matrices) in bytes: the output transform
/// reads them all.
const MAX_PARTS_BYTES: usize = 64 << 20;

/// Whether the Winograd filter gradient applies: 3x3, stride and dilation 1, NHWC, one group,
/// channel counts multiples of 4, and not turned off by `TFWGPU_CONV_WINOGRAD=0`.
pub(super) fn applies(g: &Geom) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| crate::env_is("TFWGPU_CONV_WINOGRAD", "0"));
    !off && g.r == 3
        && g.s == 3
        && g.sh == 1
        && g.sw == 1
        && g.dh == 1
        && g.dw == 1
        && !g.nchw
        && g.groups == 1
        && g.c.is_multiple_of(4)
        && g.k.is_multiple_of(4)
        && g.n > 0
        && g.oh > 0
        && g.ow > 0
}

/// How the products are laid out: images per group, tiles per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub imgs: usize,
    pub groups: usize,
    pub tiles: usize,
}

/// The image groups: equal groups whose transformed operands (16 values per tile and
/// channel) fit `budget` bytes each; `None` if one image does not.
pub(super) fn layout(g: &Geom, budget: usize) -> Option<Layout> {
    let per_img = 16 * g.oh.div_ceil(2) * g.ow.div_ceil(2) * g.c.max(g.k) * 4;
    let imgs = super::gemm::column_images(g.n, per_img, budget, None, &[], 1)?;
    Some(Layout {
        imgs,
        groups: g.n / imgs,
        tiles: imgs * g.oh.div_ceil(2) * g.ow.div_ceil(2),
    })
}

/// Whether `splits` chunks per group keep the partial sums within MAX_PARTS_BYTES.
pub(super) fn parts_fit(g: &Geom, l: &Layout, splits: usize) -> bool {
    l.groups * splits * 16 * g.c * g.k * 4 <= MAX_PARTS_BYTES
}

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::Unimplemented(format!("{op}: a size of {v} does not fit 32 bits")))
}

/// Records the filter gradient with the product plan `plan` (layouts am_bn) and `splits`
/// equal chunks of each group's tiles (a divisor of `l.tiles`).
#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    l: &Layout,
    plan: Plan,
    splits: usize,
    x_ref: &DeviceRef,
    dy_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let (c, k) = (g.c, g.k);
    let (c4, k4) = (c / 4, k / 4);
    let (th, tw) = (g.oh.div_ceil(2), g.ow.div_ceil(2));
    let tg = l.tiles;
    if splits == 0 || !tg.is_multiple_of(splits) {
        return Err(Error::InvalidArgument(format!(
            "{op}: {splits} Winograd splits do not divide {tg} tiles"
        )));
    }
    let parts = l.groups * splits;
    let pipe = |mode: u32| {
        ctx.pipeline(
            PipelineKey::new(
                "conv",
                Some(DType::F32),
                ["winograd_x", "winograd_dy", "winograd_out"][mode as usize],
            ),
            || {
                ShaderSource::new(
                    WINOGRAD_WGSL
                        .replace("$INPUT_TRANSFORM", WINOGRAD_INPUT_WGSL)
                        .replace("$LINEAR_INDEX", LINEAR_INDEX)
                        .replace("$MODE_ID", &mode.to_string())
                        .replace("$WG", &WG.to_string()),
                )
            },
        )
    };
    let (px, pd, po) = (pipe(0)?, pipe(1)?, pipe(2)?);
    let x = ctx.bind(x_ref)?;
    let dy = ctx.bind(dy_ref)?;
    let o = bind_out(ctx, op, out)?;
    let xh = ctx.temp((16 * tg * c * 4) as u64)?;
    let dh = ctx.temp((16 * tg * k * 4) as u64)?;
    let slice = 16 * c * k * 4;
    let part = ctx.temp((parts * slice) as u64)?;
    let words = |total: usize, row: u32, cv: usize, img0: usize| -> Result<Vec<u32>> {
        let mut w = vec![u32_of(op, total)?, row];
        for v in [
            g.h,
            g.w,
            g.oh,
            g.ow,
            th,
            tw,
            cv,
            g.pt,
            g.pl,
            img0,
            parts,
            16 * c * k4,
            0,
            0,
        ] {
            w.push(u32_of(op, v)?);
        }
        Ok(w)
    };
    let chunk = tg / splits;
    let gm = Gemm {
        m: c,
        n: k,
        k: chunk,
        ta: true,
        tb: false,
        // Innermost the 16 transformed matrices, then the chunks: batch = s * 16 + e.
        dims: vec![(16, tg * c, tg * k), (splits, chunk * c, chunk * k)],
        batches: 16 * splits,
    };
    for gi in 0..l.groups {
        let img0 = gi * l.imgs;
        let (grid, row) = grid_1d((tg * c4) as u64, WG);
        ctx.dispatch(
            &px,
            &params(&words(tg * c4, row, c4, img0)?),
            &[x.clone(), xh.clone()],
            grid,
        )?;
        let (grid, row) = grid_1d((tg * k4) as u64, WG);
        ctx.dispatch(
            &pd,
            &params(&words(tg * k4, row, k4, img0)?),
            &[dy.clone(), dh.clone()],
            grid,
        )?;
        let mut dst: BufferRange = part.clone();
        dst.offset += (gi * splits * slice) as u64;
        dst.size = (splits * slice) as u64;
        matmul::record_plan(ctx, op, plan, DType::F32, &gm, &xh, &dh, &dst)?;
    }
    let (grid, row) = grid_1d((c * k4) as u64, WG);
    ctx.dispatch(&po, &params(&words(c * k4, row, k4, 0)?), &[part, o], grid)
}

const WINOGRAD_FWD_WGSL: &str = include_str!("winograd_fwd.wgsl");

/// One Winograd F(2x2, 3x3) correlation (`winograd_fwd.wgsl`): the forward pass (input x,
/// output y) or the stride-1 input gradient (input dy, output dx, the filter flipped and
/// transposed); sizes of the correlation's own input and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Corr {
    pub h: usize,
    pub w: usize,
    pub cin: usize,
    pub oh: usize,
    pub ow: usize,
    pub cout: usize,
    pub pt: usize,
    pub pl: usize,
    pub flip: bool,
    pub imgs: usize,
    pub groups: usize,
    /// 2x2 output tiles per group.
    pub tiles: usize,
}

/// The correlation of the forward pass (`bwd_input` false) or of the input gradient, where
/// the Winograd path applies (3x3, stride and dilation 1, NHWC, one group, depths multiples of
/// 4, padding before of at most 2 for the input gradient), with image groups whose
/// transformed operands fit `budget` bytes each.
pub(super) fn corr(g: &Geom, bwd_input: bool, budget: usize) -> Option<Corr> {
    if !applies(g) {
        return None;
    }
    let c = if bwd_input {
        if g.pt > 2 || g.pl > 2 {
            return None;
        }
        Corr {
            h: g.oh,
            w: g.ow,
            cin: g.k,
            oh: g.h,
            ow: g.w,
            cout: g.c,
            pt: 2 - g.pt,
            pl: 2 - g.pl,
            flip: true,
            imgs: 0,
            groups: 0,
            tiles: 0,
        }
    } else {
        Corr {
            h: g.h,
            w: g.w,
            cin: g.c,
            oh: g.oh,
            ow: g.ow,
            cout: g.k,
            pt: g.pt,
            pl: g.pl,
            flip: false,
            imgs: 0,
            groups: 0,
            tiles: 0,
        }
    };
    let per_tile = c.oh.div_ceil(2) * c.ow.div_ceil(2);
    let per_img = 16 * per_tile * c.cin.max(c.cout) * 4;
    let imgs = super::gemm::column_images(g.n, per_img, budget, None, &[], 1)?;
    Some(Corr {
        imgs,
        groups: g.n / imgs,
        tiles: imgs * per_tile,
        ..c
    })
}

/// Records the correlation `c` with the product plan `plan` (layouts ak_bn): `input` is x
/// (forward) or dy, `out` y or dx.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_forward(
    ctx: &KernelContext,
    op: &str,
    c: &Corr,
    plan: Plan,
    input: &DeviceRef,
    filter: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let (th, tw) = (c.oh.div_ceil(2), c.ow.div_ceil(2));
    let tg = c.tiles;
    let (ci4, co4) = (c.cin / 4, c.cout / 4);
    let pipe = |mode: u32| {
        ctx.pipeline(
            PipelineKey::new(
                "conv",
                Some(DType::F32),
                ["winograd_fwd_in", "winograd_fwd_filter", "winograd_fwd_out"][mode as usize],
            ),
            || {
                ShaderSource::new(
                    WINOGRAD_FWD_WGSL
                        .replace("$INPUT_TRANSFORM", WINOGRAD_INPUT_WGSL)
                        .replace("$LINEAR_INDEX", LINEAR_INDEX)
                        .replace("$MODE_ID", &mode.to_string())
                        .replace("$WG", &WG.to_string()),
                )
            },
        )
    };
    let (pin, pf, pout) = (pipe(0)?, pipe(1)?, pipe(2)?);
    let x = ctx.bind(input)?;
    let f = ctx.bind(filter)?;
    let o = bind_out(ctx, op, out)?;
    let v = ctx.temp((16 * tg * c.cin * 4) as u64)?;
    let u = ctx.temp((16 * c.cin * c.cout * 4) as u64)?;
    let m = ctx.temp((16 * tg * c.cout * 4) as u64)?;
    let words = |total: usize, row: u32, cv: usize, img0: usize| -> Result<Vec<u32>> {
        let mut w = vec![u32_of(op, total)?, row];
        for v in [
            c.h,
            c.w,
            c.oh,
            c.ow,
            th,
            tw,
            cv,
            c.pt,
            c.pl,
            img0,
            c.cin,
            c.cout,
            c.flip as usize,
            0,
        ] {
            w.push(u32_of(op, v)?);
        }
        Ok(w)
    };
    let (grid, row) = grid_1d((c.cin * co4) as u64, WG);
    ctx.dispatch(
        &pf,
        &params(&words(c.cin * co4, row, co4, 0)?),
        &[f, u.clone()],
        grid,
    )?;
    let gm = Gemm {
        m: tg,
        n: c.cout,
        k: c.cin,
        ta: false,
        tb: false,
        dims: vec![(16, tg * c.cin, c.cin * c.cout)],
        batches: 16,
    };
    for gi in 0..c.groups {
        let img0 = gi * c.imgs;
        let (grid, row) = grid_1d((tg * ci4) as u64, WG);
        ctx.dispatch(
            &pin,
            &params(&words(tg * ci4, row, ci4, img0)?),
            &[x.clone(), v.clone()],
            grid,
        )?;
        matmul::record_plan(ctx, op, plan, DType::F32, &gm, &v, &u, &m)?;
        let (grid, row) = grid_1d((tg * co4) as u64, WG);
        ctx.dispatch(
            &pout,
            &params(&words(tg * co4, row, co4, img0)?),
            &[m.clone(), o.clone()],
            grid,
        )?;
    }
    Ok(())
}
