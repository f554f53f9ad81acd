//! Erf and Erfc (float32, float16), elementwise.

use super::{bind_out, dispatch_words, load_fn};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernels::elementwise::{COMMON_WGSL, MATH_WGSL};
use crate::{DType, Error, Result, bail_invalid};

const ERF_WGSL: &str = include_str!("erf.wgsl");

pub(super) struct ErfOp {
    pub complement: bool,
}

impl ErfOp {
    fn name(&self) -> &'static str {
        if self.complement { "Erfc" } else { "Erf" }
    }

    fn check(&self, inputs: &[Operand]) -> Result<TensorDesc> {
        if inputs.len() != 1 {
            bail_invalid!("{} takes 1 input, got {}", self.name(), inputs.len());
        }
        let d = inputs[0].desc();
        if !d.dtype.is_float() {
            return Err(Error::Unimplemented(format!(
                "{} has no tfwgpu kernel for T={}",
                self.name(),
                d.dtype
            )));
        }
        Ok(d)
    }
}

impl Kernel for ErfOp {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{}: no output", self.name())))?;
        if out.desc != desc {
            bail_invalid!(
                "{}: output is {} {:?} but the input is {} {:?}",
                self.name(),
                out.desc.dtype,
                out.desc.shape,
                desc.dtype,
                desc.shape
            );
        }
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device(self.name(), 0)?;
        let dtype = desc.dtype;
        let esize = dtype.size();
        let (load, store) = if dtype == DType::F16 {
            ("f16_to_f32(load_x(e).x)", "f32_to_f16")
        } else {
            ("bitcast<f32>(load_x(e).x)", "bitcast<u32>")
        };
        let op = if self.complement {
            "erfc_f32"
        } else {
            "erf_f32"
        };
        let bindings = [bind_out(ctx, self.name(), out)?, ctx.bind(x)?];
        let mut params = vec![0u32; 4];
        dispatch_words(
            ctx,
            &format!("{}_{}", op, dtype.name()),
            || {
                format!(
                    "{}\n{COMMON_WGSL}\n{MATH_WGSL}\n{}",
                    ERF_WGSL
                        .replace("$LOAD_F32(e)", load)
                        .replace("$STORE_BITS", store)
                        .replace("$OP", op),
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
