//! UnsortedSegmentSum(data, segment_ids, num_segments) for float32: the sum of a sparse
//! gradient's rows per index (Keras's optimizers densify an `Embedding` layer's gradient this
//! way every step; without a device kernel TensorFlow ran it on the CPU, copying the rows to
//! the host and the sums back). ScatterNd(indices, updates, shape) for float32, int32 and int64:
//! the
//! same atomic sums at N-d indices (`tf.math.confusion_matrix`, behind Keras's MeanIoU metrics).

use super::{bind_out, fmt_shape, index_fn, u32_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG};
use crate::{DType, Error, Result, bail_invalid};

const SEGMENT_WGSL: &str = include_str!("segment.wgsl");

pub(super) struct UnsortedSegmentSum;

/// An atomic scatter's output, bound and zeroed, with its updates (input `data`) and their
/// element count; None when nothing is left to add (an empty output, no updates, empty rows).
fn zeroed<'a>(
    ctx: &KernelContext,
    op: &str,
    inputs: &[Operand<'a>],
    outputs: &[DeviceRef],
    data: usize,
    inner: usize,
) -> Result<Option<(crate::exec::BufferRange, &'a DeviceRef, usize)>> {
    let out = outputs
        .first()
        .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))?;
    if out.desc.num_elements() == 0 {
        return Ok(None);
    }
    let o = bind_out(ctx, op, out)?;
    ctx.clear(&o, out.desc.byte_size().next_multiple_of(4))?;
    let d = inputs[data].device(op, data)?;
    let n = d.desc.num_elements();
    Ok((n > 0 && inner > 0).then_some((o, d, n)))
}

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
        let Some((o, data, n)) = zeroed(ctx, op, inputs, outputs, 0, inner)? else {
            return Ok(());
        };
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

const SCATTER_ND_WGSL: &str = include_str!("scatter_nd.wgsl");

/// The most index components (the first dimensions of the output that the indices address).
const SCATTER_MAX_K: usize = 8;

pub(super) struct ScatterNd;

/// (K, slice size, output shape), with TensorFlow's shape checks.
fn check_nd(inputs: &[Operand]) -> Result<(usize, usize, Vec<usize>)> {
    let op = "ScatterNd";
    if inputs.len() != 3 {
        bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
    }
    let idx = inputs[0].shape();
    let upd = inputs[1].shape();
    if !matches!(inputs[0].dtype(), DType::I32 | DType::I64) {
        return Err(Error::Unimplemented(format!(
            "{op}: indices of type {} are not supported (int32, int64)",
            inputs[0].dtype()
        )));
    }
    let shape_t = inputs[2].host(op, 2)?;
    if shape_t.shape.len() != 1 {
        bail_invalid!(
            "{op}: Shape must be a vector, got shape {}",
            fmt_shape(&shape_t.shape)
        );
    }
    let shape: Vec<usize> = shape_t
        .to_i64_vec()?
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| Error::InvalidArgument(format!("{op}: Dimension {d} must be >= 0")))
        })
        .collect::<Result<_>>()?;
    if idx.is_empty() {
        bail_invalid!(
            "{op}: Indices shape must have rank at least one, got {}",
            fmt_shape(idx)
        );
    }
    let k = idx[idx.len() - 1];
    if k > shape.len() {
        bail_invalid!(
            "{op}: Index innermost dimension length must be <= output rank; saw: {k} vs. {}",
            shape.len()
        );
    }
    let mut want = idx[..idx.len() - 1].to_vec();
    want.extend_from_slice(&shape[k..]);
    if upd != want.as_slice() {
        bail_invalid!(
            "{op}: updates has shape {} but indices {} and shape {} need {}",
            fmt_shape(upd),
            fmt_shape(idx),
            fmt_shape(&shape),
            fmt_shape(&want)
        );
    }
    if k > SCATTER_MAX_K {
        return Err(Error::Unimplemented(format!(
            "{op}: indices of {k} components (at most {SCATTER_MAX_K} on tfwgpu)"
        )));
    }
    Ok((k, shape[k..].iter().product(), shape))
}

impl Kernel for ScatterNd {
    fn op(&self) -> &'static str {
        "ScatterNd"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, _, shape) = check_nd(inputs)?;
        Ok(vec![TensorDesc::new(inputs[1].dtype(), &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = "ScatterNd";
        let (k, inner, shape) = check_nd(inputs)?;
        let Some((o, upd, n)) = zeroed(ctx, op, inputs, outputs, 1, inner)? else {
            return Ok(());
        };
        let idx = inputs[0].device(op, 0)?;
        let (idt, dt) = (idx.desc.dtype, upd.desc.dtype);
        let add = match dt {
            DType::F32 => "atomic_add_out(flat, bitcast<f32>(upd[e]));",
            DType::I32 => "atomicAdd(&out[flat], upd[e]);",
            // Two words: the low word's add tells its own carry (the old value it returns),
            // which goes to the high word with the update's high word: exact modulo 2^64
            // whatever the order of the concurrent adds.
            DType::I64 => {
                "let old = atomicAdd(&out[2u * flat], upd[2u * e]);
    let carry = select(0u, 1u, old + upd[2u * e] < old);
    atomicAdd(&out[2u * flat + 1u], upd[2u * e + 1u] + carry);"
            }
            other => {
                return Err(Error::Unimplemented(format!(
                    "{op}: updates of type {other} (float32, int32, int64)"
                )));
            }
        };
        let idx_src = index_fn("idx", idt)?;
        let pipeline = ctx.pipeline(
            PipelineKey::new("slice", Some(dt), format!("scatter_nd_{}", idt.name())),
            || {
                ShaderSource::new(format!(
                    "{}\n{LINEAR_INDEX}\n{idx_src}",
                    SCATTER_ND_WGSL
                        .replace("ATOMIC_ADD_OUT", crate::kernels::wgsl::ATOMIC_ADD_OUT)
                        .replace("ADD_STATEMENT", add)
                        .replace("WORKGROUP_SIZE", &WG.to_string())
                ))
            },
        )?;
        let mut dims = [0u32; SCATTER_MAX_K];
        let mut strides = [0u32; SCATTER_MAX_K];
        for j in 0..k {
            dims[j] = u32_of(op, "output dimension", shape[j])?;
            strides[j] = u32_of(op, "output stride", shape[j + 1..].iter().product())?;
        }
        let (groups, row) = grid_1d(n as u64, WG);
        let mut params = vec![
            row,
            u32_of(op, "updates size", n)?,
            u32_of(op, "slice size", inner)?,
            k as u32,
        ];
        params.extend_from_slice(&dims);
        params.extend_from_slice(&strides);
        let bindings = [o, ctx.bind(upd)?, ctx.bind(idx)?];
        ctx.dispatch(
            &pipeline,
            &crate::kernels::wgsl::params(&params),
            &bindings,
            groups,
        )
    }
}
