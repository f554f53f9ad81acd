//! UnsortedSegmentSum(data, segment_ids, num_segments) for float32: the sum of a sparse
//! gradient's rows per index (Keras's optimizers densify an `Embedding` layer's gradient this
//! way every step; without a device kernel TensorFlow ran it on the CPU, copying the rows to
//! the host and the sums back).

use super::{bind_out, fmt_shape, index_fn, u32_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG};
use crate::{DType, Error, Result, bail_invalid};

const SEGMENT_WGSL: &str = include_str!("segment.wgsl");

pub(super) struct UnsortedSegmentSum;

/// (rows' inner size, segment count, output shape).
fn check(inputs: &[Operand]) -> Result<(usize, usize, Vec<usize>)> {
    let op = "UnsortedSegmentSum";
    if inputs.len() != 3 {
        bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
    }
    let data = inputs[0].shape();
    let ids = inputs[1].shape();
    if !matches!(inputs[1].dtype(), DType::I32 | DType::I64) {
        return Err(Error::Unimplemented(format!(
            "{op}: segment_ids of type {} are not supported (int32, int64)",
            inputs[1].dtype()
        )));
    }
    let n_t = inputs[2].host(op, 2)?;
    if !n_t.shape.is_empty() {
        bail_invalid!(
            "{op}: num_segments should be a scalar, not shape {}",
            fmt_shape(&n_t.shape)
        );
    }
    let segments = n_t.to_i64_vec()?[0];
    if segments < 0 {
        bail_invalid!("{op}: Input num_segments == {segments} must not be negative.");
    }
    if !data.starts_with(ids) {
        bail_invalid!(
            "{op}: data.shape = {} does not start with segment_ids.shape = {}",
            fmt_shape(data),
            fmt_shape(ids)
        );
    }
    let mut out = vec![segments as usize];
    out.extend_from_slice(&data[ids.len()..]);
    Ok((data[ids.len()..].iter().product(), segments as usize, out))
}

impl Kernel for UnsortedSegmentSum {
    fn op(&self) -> &'static str {
        "UnsortedSegmentSum"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, _, out) = check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = "UnsortedSegmentSum";
        let (inner, segments, _) = check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))?;
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let o = bind_out(ctx, op, out)?;
        ctx.clear(&o, out.desc.byte_size().next_multiple_of(4))?;
        let data = inputs[0].device(op, 0)?;
        let n = data.desc.num_elements();
        if n == 0 || inner == 0 {
            return Ok(());
        }
        let ids = inputs[1].device(op, 1)?;
        let idt = ids.desc.dtype;
        let n32 = u32_of(op, "data size", n)?;
        let idx_src = index_fn("ids", idt)?;
        let pipeline = ctx.pipeline(
            PipelineKey::new("slice", None, format!("segment_sum_{}", idt.name())),
            || {
                ShaderSource::new(format!(
                    "{}\n{LINEAR_INDEX}\n{idx_src}",
                    SEGMENT_WGSL
                        .replace("ATOMIC_ADD_OUT", crate::kernels::wgsl::ATOMIC_ADD_OUT)
                        .replace("WORKGROUP_SIZE", &WG.to_string())
                ))
            },
        )?;
        let (groups, row) = grid_1d(n as u64, WG);
        let params = [
            row,
            n32,
            u32_of(op, "row size", inner)?,
            u32_of(op, "segment count", segments)?,
        ];
        let bindings = [o, ctx.bind(data)?, ctx.bind(ids)?];
        ctx.dispatch(
            &pipeline,
            &crate::kernels::wgsl::params(&params),
            &bindings,
            groups,
        )
    }
}
