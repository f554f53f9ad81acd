//! GatherV2(params, indices, axis) with `batch_dims`.

use super::{dispatch_words, fmt_shape, index_fn, load_fn, u32_of};
use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::{DType, Error, Result, bail_invalid};

const GATHER_WGSL: &str = include_str!("gather.wgsl");

pub(super) struct GatherV2 {
    batch_dims: i64,
}

/// The flattened gather: batches, outer, N, inner, indices per batch, and the output shape.
pub(crate) struct Geometry {
    pub batch: usize,
    pub outer: usize,
    pub gather_n: usize,
    pub inner: usize,
    pub k: usize,
    pub out: Vec<usize>,
}

/// TensorFlow's checks of GatherV2's shapes, axis and `batch_dims`, and the flattened gather.
pub(crate) fn geometry(
    batch_dims: i64,
    params: &[usize],
    indices: &[usize],
    indices_dtype: DType,
    axis_t: &crate::HostTensor,
) -> Result<Geometry> {
    if !matches!(indices_dtype, DType::I32 | DType::I64) {
        return Err(Error::Unimplemented(format!(
            "GatherV2: indices of type {indices_dtype} are not supported (int32, int64)"
        )));
    }
    if axis_t.len() != 1 {
        bail_invalid!(
            "GatherV2: axis must be scalar, got shape {}",
            fmt_shape(&axis_t.shape)
        );
    }
    let rank = params.len() as i64;
    let mut axis = axis_t.to_i64_vec()?[0];
    if rank == 0 {
        bail_invalid!("GatherV2: params must be at least 1 dimensional");
    }
    if axis < -rank || axis >= rank {
        bail_invalid!(
            "GatherV2: Expected axis in the range [{}, {rank}), but got {axis}",
            -rank
        );
    }
    if axis < 0 {
        axis += rank;
    }
    let irank = indices.len() as i64;
    let mut bd = batch_dims;
    if bd != 0 {
        if bd < -irank || bd > irank {
            bail_invalid!(
                "GatherV2: Expected batch_dims in the range [{}, {irank}], but got {bd}",
                -irank
            );
        }
        if bd < 0 {
            bd += irank;
        }
        if bd > axis {
            bail_invalid!(
                "GatherV2: batch_dims ({bd}) must be less than or equal to axis ({axis})."
            );
        }
        for i in 0..bd as usize {
            if params[i] != indices[i] {
                bail_invalid!(
                    "GatherV2: params.shape[{i}]: {} should be equal to indices.shape[{i}]: {}",
                    params[i],
                    indices[i]
                );
            }
        }
    }
    let (axis, bd) = (axis as usize, bd as usize);
    let mut out: Vec<usize> = params[..axis].to_vec();
    out.extend_from_slice(&indices[bd..]);
    out.extend_from_slice(&params[axis + 1..]);
    Ok(Geometry {
        batch: params[..bd].iter().product(),
        outer: params[bd..axis].iter().product(),
        gather_n: params[axis],
        inner: params[axis + 1..].iter().product(),
        k: indices[bd..].iter().product(),
        out,
    })
}

impl GatherV2 {
    pub fn build(a: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(GatherV2 {
            batch_dims: a.int_or("batch_dims", 0)?,
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<Geometry> {
        if inputs.len() != 3 {
            bail_invalid!("GatherV2 takes 3 inputs, got {}", inputs.len());
        }
        geometry(
            self.batch_dims,
            inputs[0].shape(),
            inputs[1].shape(),
            inputs[1].dtype(),
            inputs[2].host("GatherV2", 2)?,
        )
    }
}

impl Kernel for GatherV2 {
    fn op(&self) -> &'static str {
        "GatherV2"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let g = self.check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &g.out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let g = self.check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument("GatherV2: no output".into()))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device("GatherV2", 0)?;
        let ind = inputs[1].device("GatherV2", 1)?;
        u32_of("GatherV2", "params size", x.desc.num_elements())?;
        let idt = ind.desc.dtype;
        let esize = out.desc.dtype.size();
        let mut params = vec![
            0,
            0,
            0,
            0,
            g.outer as u32,
            g.k as u32,
            g.inner as u32,
            g.gather_n as u32,
        ];
        let bindings = [
            super::bind_out(ctx, "GatherV2", out)?,
            ctx.bind(x)?,
            ctx.bind(ind)?,
        ];
        let key = format!("gather_{}", idt.name());
        let idx_src = index_fn("ind", idt)?;
        dispatch_words(
            ctx,
            &key,
            || format!("{GATHER_WGSL}\n{}\n{idx_src}", load_fn("x", esize)),
            &mut params,
            &bindings,
            n,
            out.desc.dtype,
        )
    }
}
