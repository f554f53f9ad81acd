//! Conv2D forward on cooperative matrices (tensor cores): the implicit product
//! [N*OH*OW, R*S*C] x [R*S*C, K] of `matmul::coop` with A read as the input's windows (NHWC,
//! one group), for float16 (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`). Everything
//! else keeps the float32 GEMM (`gemm.rs`).

use crate::kernel::{DeviceRef, KernelContext};
use crate::kernels::matmul::coop::{
    self, COOP_TILES, CoopSpec, Input, Launch, choose_tile, coop_lanes, fits, load_width,
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
    let Some(lanes) = coop_lanes(ctx) else {
        return Ok(false);
    };
    if g.nchw || g.groups != 1 || x.desc.dtype != out.desc.dtype || f.desc.dtype != out.desc.dtype {
        return Ok(false);
    }
    let (m, n, k) = (g.n * g.oh * g.ow, g.k, g.r * g.s * g.c);
    if k == 0 {
        return Ok(false);
    }
    let spec = CoopSpec {
        tile: forced.unwrap_or_else(|| choose_tile(1, m, n)),
        lanes,
        a_kfast: true,
        b_nfast: true,
        wa: load_width(input, g.c),
        wb: load_width(input, n),
        input,
        conv: true,
    };
    if !fits(ctx, &spec) {
        return Ok(false);
    }
    let l = Launch {
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
    };
    tracing::debug!("{op} {m}x{n}x{k}: cooperative {}", spec.specialization());
    coop::launch(ctx, op, &spec, &l, x, f, out)?;
    Ok(true)
}
