//! ClipByValue: `t` clipped to `[clip_value_min, clip_value_max]` elementwise, as
//! `std::max(std::min(t, max), min)`. TensorFlow does not broadcast here: each bound is a
//! scalar or has `t`'s shape.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{
    COMMON_WGSL, INT64_WGSL, bind_out, compute_type, fmt_shape, load_expr, store_stmt, words_for,
};

const CLIP_WGSL: &str = include_str!("clip.wgsl");

pub(crate) struct ClipByValue;

impl ClipByValue {
    /// Validates the inputs; returns t's desc and the strides (0 or 1) of min and max.
    fn check(&self, inputs: &[Operand]) -> Result<(TensorDesc, u32, u32)> {
        if inputs.len() != 3 {
            bail_invalid!(
                "ClipByValue takes 3 inputs (t, clip_value_min, clip_value_max), got {}",
                inputs.len()
            );
        }
        let t = inputs[0].desc();
        for (i, name) in [(1, "clip_value_min"), (2, "clip_value_max")] {
            if inputs[i].dtype() != t.dtype {
                bail_invalid!(
                    "ClipByValue: {name} is {} but t is {}",
                    inputs[i].dtype(),
                    t.dtype
                );
            }
        }
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::I64) {
            return Err(Error::Unimplemented(format!(
                "ClipByValue has no tfwgpu kernel for T={}",
                t.dtype
            )));
        }
        let (smin, smax) = (inputs[1].shape(), inputs[2].shape());
        let ok = |s: &[usize]| s.is_empty() || s == t.shape.as_slice();
        if !ok(smin) || !ok(smax) {
            bail_invalid!(
                "ClipByValue: clip_value_min and clip_value_max must be either of the same shape \
                 as input, or a scalar. input shape: {} clip_value_min shape: {} \
                 clip_value_max shape: {}",
                fmt_shape(&t.shape),
                fmt_shape(smin),
                fmt_shape(smax)
            );
        }
        words_for("ClipByValue", t.dtype, t.num_elements())?;
        // A scalar bound is read at index 0 (t itself may be a scalar: stride 0 either way).
        let stride = |s: &[usize]| u32::from(!s.is_empty());
        Ok((t, stride(smin), stride(smax)))
    }
}

impl Kernel for ClipByValue {
    fn op(&self) -> &'static str {
        "ClipByValue"
    }

    /// Each invocation reads the elements of t of the word it writes, then writes it.
    fn forwardable_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?.0])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (desc, slo, shi) = self.check(inputs)?;
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let out = &outputs[0];
        if out.desc != desc {
            bail_invalid!(
                "ClipByValue: output is {} {} but t is {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                desc.dtype,
                fmt_shape(&desc.shape)
            );
        }
        let t = ctx.bind(inputs[0].device("ClipByValue", 0)?)?;
        let lo = ctx.bind(inputs[1].device("ClipByValue", 1)?)?;
        let hi = ctx.bind(inputs[2].device("ClipByValue", 2)?)?;
        let o = bind_out(ctx, "ClipByValue", out)?;
        let dtype = desc.dtype;
        let key = PipelineKey::new("elementwise", Some(dtype), "clip_by_value");
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(dtype)))?;
        let words = words_for("ClipByValue", dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        ctx.dispatch(
            &pipeline,
            &params(&[row, n as u32, words, 0, slo, shi, 0, 0]),
            &[t, lo, hi, o],
            groups,
        )
    }
}

fn shader(dtype: DType) -> String {
    let (extra, less) = if dtype == DType::I64 {
        (INT64_WGSL, "    return lt64(x, y);")
    } else {
        // False when either side is NaN, as C++'s `<`.
        ("", "    return !is_nan(x) && !is_nan(y) && f32_less(x, y);")
    };
    CLIP_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace("$EXTRA", extra)
        .replace("$LOAD_T", &load_expr(dtype, "t"))
        .replace("$LOAD_LO", &load_expr(dtype, "lo"))
        .replace("$LOAD_HI", &load_expr(dtype, "hi"))
        .replace("$LESS", less)
        .replace("$STORE", store_stmt(dtype))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}
