//! MirrorPadGrad(grad, paddings): the gradient of MirrorPad, float32 and float16.

use super::map::{mirror_mode, mirror_paddings};
use super::{Pads, bind_out, dispatch_words, fmt_shape, load_fn, pack8, strides_of, u32_of};
use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernels::elementwise::COMMON_WGSL;
use crate::{DType, Error, Result, bail_invalid};

const MIRROR_GRAD_WGSL: &str = include_str!("mirror_grad.wgsl");

pub(super) struct MirrorPadGrad {
    symmetric: bool,
}

impl MirrorPadGrad {
    pub fn build(a: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(MirrorPadGrad {
            symmetric: mirror_mode("MirrorPadGrad", a)?,
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(Pads, Vec<usize>)> {
        const OP: &str = "MirrorPadGrad";
        if inputs.len() != 2 {
            bail_invalid!("{OP} takes 2 inputs, got {}", inputs.len());
        }
        if !inputs[0].dtype().is_float() {
            return Err(Error::Unimplemented(format!(
                "{OP} has no tfwgpu kernel for T={}",
                inputs[0].dtype()
            )));
        }
        let shape = inputs[0].shape();
        let t = inputs[1].host(OP, 1)?;
        // The output sizes first (the paddings are checked against them).
        let raw = t.to_i64_vec()?;
        if t.shape.len() != 2 || t.shape[1] != 2 || t.shape[0] != shape.len() {
            bail_invalid!(
                "{OP}: paddings must be a matrix with 2 columns and one row per dimension of {}, got {}",
                fmt_shape(shape),
                fmt_shape(&t.shape)
            );
        }
        let mut out = vec![];
        for (d, &dim) in shape.iter().enumerate() {
            let (b, a) = (raw[2 * d], raw[2 * d + 1]);
            if b < 0 || a < 0 {
                bail_invalid!("{OP}: Paddings must be non-negative: {b}, {a}");
            }
            let size = dim as i64 - b - a;
            if size < 0 {
                bail_invalid!(
                    "{OP}: paddings {b}, {a} exceed dimension {d} of size {dim} of the gradient"
                );
            }
            out.push(size as usize);
        }
        let pads = mirror_paddings(OP, shape, t, self.symmetric, &out)?;
        Ok((pads, out))
    }
}

impl Kernel for MirrorPadGrad {
    fn op(&self) -> &'static str {
        "MirrorPadGrad"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, out) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (pads, out_shape) = self.check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument("MirrorPadGrad: no output".into()))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let g = inputs[0].device("MirrorPadGrad", 0)?;
        u32_of("MirrorPadGrad", "gradient size", g.desc.num_elements())?;
        let dtype = g.desc.dtype;
        let mut params = vec![
            0,
            0,
            0,
            out_shape.len() as u32,
            self.symmetric as u32,
            0,
            0,
            0,
        ];
        params.extend(pack8(out_shape.iter().map(|&d| d as u32)));
        params.extend(pack8(pads.iter().map(|p| p.0 as u32)));
        params.extend(pack8(pads.iter().map(|p| p.1 as u32)));
        params.extend(pack8(
            strides_of(&g.desc.shape).into_iter().map(|s| s as u32),
        ));
        let esize = dtype.size();
        let (load, store) = if dtype == DType::F16 {
            ("f16_to_f32(load_x", "f32_to_f16")
        } else {
            ("bitcast<f32>(load_x", "bitcast<u32>")
        };
        let bindings = [bind_out(ctx, "MirrorPadGrad", out)?, ctx.bind(g)?];
        dispatch_words(
            ctx,
            &format!("mirror_grad_{}", dtype.name()),
            || {
                format!(
                    "{}\n{COMMON_WGSL}\n{}",
                    MIRROR_GRAD_WGSL
                        .replace("$LOAD_F32(off)", &format!("{load}(off).x)"))
                        .replace("$STORE_BITS", store),
                    load_fn("x", esize)
                )
            },
            &mut params,
            &bindings,
            n,
            dtype,
        )
    }
}
