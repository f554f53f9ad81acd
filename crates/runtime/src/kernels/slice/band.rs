//! MatrixBandPart(input, num_lower, num_upper): the band of each innermost matrix, zero
//! outside it (Keras's causal attention masks, `tf.linalg.band_part`), with TensorFlow's checks
//! and messages.

use super::{dispatch_words, fmt_shape, load_fn, u32_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::{Error, Result, bail_invalid};

const BAND_WGSL: &str = include_str!("band.wgsl");

pub(super) struct MatrixBandPart;

impl MatrixBandPart {
    /// (rows, cols, num_lower, num_upper).
    fn check(inputs: &[Operand]) -> Result<(usize, usize, i64, i64)> {
        let op = "MatrixBandPart";
        if inputs.len() != 3 {
            bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
        }
        let shape = inputs[0].shape();
        if shape.len() < 2 {
            bail_invalid!(
                "input must be at least 2-dim, received shape: {}",
                fmt_shape(shape)
            );
        }
        let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let bound = |i: usize, name: &str, dim: usize, what: &str| -> Result<i64> {
            let t = inputs[i].host(op, i)?;
            if !t.shape.is_empty() {
                bail_invalid!("{name} must be scalar, got shape {}", fmt_shape(&t.shape));
            }
            let v = t.to_i64_vec()?[0];
            if v > dim as i64 {
                bail_invalid!(
                    "{name} must be negative or less or equal to number of {what} ({dim}) got: {v}"
                );
            }
            Ok(v)
        };
        let lower = bound(1, "num_lower", rows, "rows")?;
        let upper = bound(2, "num_upper", cols, "columns")?;
        Ok((rows, cols, lower, upper))
    }
}

impl Kernel for MatrixBandPart {
    fn op(&self) -> &'static str {
        "MatrixBandPart"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Self::check(inputs)?;
        Ok(vec![inputs[0].desc()])
    }

    fn forwardable_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (rows, cols, lower, upper) = Self::check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument("MatrixBandPart: no output".into()))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device("MatrixBandPart", 0)?;
        let esize = out.desc.dtype.size();
        // A bound beyond the matrix keeps everything on its side, like a negative one.
        let clamp = |v: i64| v.min(i32::MAX as i64) as i32 as u32;
        let mut params = vec![
            0,
            0,
            0,
            u32_of("MatrixBandPart", "rows", rows)?,
            u32_of("MatrixBandPart", "columns", cols)?,
            clamp(lower),
            clamp(upper),
            0,
        ];
        let bindings = [super::bind_out(ctx, "MatrixBandPart", out)?, ctx.bind(x)?];
        dispatch_words(
            ctx,
            "band",
            || format!("{BAND_WGSL}\n{}", load_fn("inp", esize)),
            &mut params,
            &bindings,
            n,
            out.desc.dtype,
        )
    }
}
