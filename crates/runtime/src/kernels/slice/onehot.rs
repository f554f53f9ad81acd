//! OneHot(indices, depth, on_value, off_value) with `axis`.

use super::{dispatch_words, fmt_shape, index_fn, load_fn, u32_of};
use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::{Error, Result, bail_invalid};

const ONEHOT_WGSL: &str = include_str!("onehot.wgsl");

pub(super) struct OneHot {
    axis: i64,
}

impl OneHot {
    pub fn build(a: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(OneHot {
            axis: a.int_or("axis", -1)?,
        }))
    }

    /// (depth, suffix size, output shape).
    fn check(&self, inputs: &[Operand]) -> Result<(usize, usize, Vec<usize>)> {
        if inputs.len() != 4 {
            bail_invalid!("OneHot takes 4 inputs, got {}", inputs.len());
        }
        let indices = inputs[0].shape();
        let depth_t = inputs[1].host("OneHot", 1)?;
        if !depth_t.shape.is_empty() {
            bail_invalid!(
                "OneHot: depth must be a scalar, but got: {}",
                fmt_shape(&depth_t.shape)
            );
        }
        for (i, name) in [(2, "on_value"), (3, "off_value")] {
            if !inputs[i].shape().is_empty() {
                bail_invalid!(
                    "OneHot: {name} must be a scalar, but got: {}",
                    fmt_shape(inputs[i].shape())
                );
            }
        }
        if inputs[2].dtype() != inputs[3].dtype() {
            bail_invalid!(
                "OneHot: on_value is {} but off_value is {}",
                inputs[2].dtype(),
                inputs[3].dtype()
            );
        }
        let out_rank = indices.len() as i64 + 1;
        if !(self.axis == -1 || (0..out_rank).contains(&self.axis)) {
            bail_invalid!(
                "OneHot: Expected axis to be -1 or between [0, {out_rank}).  But received: {}",
                self.axis
            );
        }
        let depth = depth_t.to_i64_vec()?[0];
        if depth < 0 {
            bail_invalid!("OneHot: depth must be non-negative, got: {depth}");
        }
        let depth = depth as usize;
        let axis = if self.axis == -1 {
            indices.len()
        } else {
            self.axis as usize
        };
        let mut out = indices[..axis].to_vec();
        out.push(depth);
        out.extend_from_slice(&indices[axis..]);
        Ok((depth, indices[axis..].iter().product(), out))
    }
}

impl Kernel for OneHot {
    fn op(&self) -> &'static str {
        "OneHot"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, _, out) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[2].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (depth, suffix, _) = self.check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument("OneHot: no output".into()))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let ind = inputs[0].device("OneHot", 0)?;
        let on = inputs[2].device("OneHot", 2)?;
        let off = inputs[3].device("OneHot", 3)?;
        let idt = ind.desc.dtype;
        let esize = out.desc.dtype.size();
        let mut params = vec![
            0,
            0,
            0,
            u32_of("OneHot", "depth", depth)?,
            suffix as u32,
            0,
            0,
            0,
        ];
        let bindings = [
            super::bind_out(ctx, "OneHot", out)?,
            ctx.bind(ind)?,
            ctx.bind(on)?,
            ctx.bind(off)?,
        ];
        let idx_src = index_fn("ind", idt)?;
        dispatch_words(
            ctx,
            &format!("onehot_{}", idt.name()),
            || {
                format!(
                    "{ONEHOT_WGSL}\n{idx_src}\n{}\n{}",
                    load_fn("on", esize),
                    load_fn("off", esize)
                )
            },
            &mut params,
            &bindings,
            n,
            out.desc.dtype,
        )
    }
}
