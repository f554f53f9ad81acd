//! Range(start, limit, delta): the bounds in host memory, the output on the device.

use super::{bind_out, dispatch_words, fmt_shape};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::{DType, Error, HostTensor, Result, bail_invalid};

const RANGE_WGSL: &str = include_str!("range.wgsl");

pub(super) struct Range;

enum Bounds {
    F32(f32, f32),
    I64(i64, i64),
}

/// One element of a scalar (or one-element vector) bound.
fn scalar_bytes<'a>(t: &'a HostTensor, name: &str) -> Result<&'a [u8]> {
    if t.shape.len() > 1 || t.len() != 1 {
        bail_invalid!(
            "Range: {name} must be a scalar, not shape {}",
            fmt_shape(&t.shape)
        );
    }
    Ok(&t.bytes)
}

impl Range {
    /// (start, delta) and the element count.
    fn check(inputs: &[Operand]) -> Result<(Bounds, usize)> {
        if inputs.len() != 3 {
            bail_invalid!("Range takes 3 inputs, got {}", inputs.len());
        }
        let ts = [
            inputs[0].host("Range", 0)?,
            inputs[1].host("Range", 1)?,
            inputs[2].host("Range", 2)?,
        ];
        let dtype = ts[0].dtype;
        if ts.iter().any(|t| t.dtype != dtype) {
            bail_invalid!("Range: start, limit and delta must have one dtype");
        }
        let names = ["start", "limit", "delta"];
        let too_large = || {
            Error::InvalidArgument(format!(
                "Range: Requires ((limit - start) / delta) <= {}",
                i64::MAX
            ))
        };
        match dtype {
            DType::F32 => {
                let mut v = [0f32; 3];
                for i in 0..3 {
                    let b = scalar_bytes(ts[i], names[i])?;
                    v[i] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                let [start, limit, delta] = v;
                check_order(start, limit, delta)?;
                let size = ((limit - start) / delta).abs().ceil();
                if size.is_nan() || size > i64::MAX as f32 {
                    return Err(too_large());
                }
                Ok((Bounds::F32(start, delta), size as usize))
            }
            DType::I64 => {
                let mut v = [0i64; 3];
                for i in 0..3 {
                    let b = scalar_bytes(ts[i], names[i])?;
                    v[i] = i64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                }
                let [start, limit, delta] = v;
                check_order(start, limit, delta)?;
                let span = (limit as i128 - start as i128).abs();
                let step = (delta as i128).abs();
                let size = (span + step - 1) / step;
                Ok((Bounds::I64(start, delta), size as usize))
            }
            other => Err(Error::Unimplemented(format!(
                "Range has no tfwgpu kernel for Tidx={other}"
            ))),
        }
    }
}

fn check_order<T: PartialOrd + Default + std::fmt::Display + Copy>(
    start: T,
    limit: T,
    delta: T,
) -> Result<()> {
    let zero = T::default();
    if delta == zero {
        bail_invalid!("Range: Requires delta != 0: {delta}");
    }
    if delta > zero && start > limit {
        bail_invalid!("Range: Requires start <= limit when delta > 0: {start}/{limit}");
    }
    if delta < zero && start < limit {
        bail_invalid!("Range: Requires start >= limit when delta < 0: {start}/{limit}");
    }
    Ok(())
}

impl Kernel for Range {
    fn op(&self) -> &'static str {
        "Range"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, size) = Range::check(inputs)?;
        if size > u32::MAX as usize {
            return Err(Error::Unimplemented(format!(
                "Range: {size} elements exceed 2^32"
            )));
        }
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &[size])])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (bounds, _) = Range::check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument("Range: no output".into()))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let mut params = match bounds {
            Bounds::F32(s, d) => vec![0, 0, 0, 0, s.to_bits(), 0, d.to_bits(), 0],
            Bounds::I64(s, d) => vec![
                0,
                0,
                0,
                1,
                s as u32,
                (s >> 32) as u32,
                d as u32,
                (d >> 32) as u32,
            ],
        };
        let o = bind_out(ctx, "Range", out)?;
        dispatch_words(
            ctx,
            "range",
            || RANGE_WGSL.to_string(),
            &mut params,
            &[o],
            n,
            out.desc.dtype,
        )
    }
}
