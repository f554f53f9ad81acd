//! nonzero family: Where (one argument: the coordinates of the non-zero / true elements, an
//! int64 [count, rank] tensor in row-major order), for bool, uint8, int32, int64 and float32
//! of rank 1 to 8 (rank 0 is an error, as in TensorFlow).
//!
//! The output shape depends on the data, so the kernel implements
//! `Kernel::outputs_on_device`: it counts the non-zero elements per block of 1024 on the GPU
//! and reads the block counts back (one blocking read per call). `record` counts again, scans
//! the block counts into offsets and writes each block's coordinates in order (`where.wgsl`).
//! "Non-zero" is TensorFlow's `x != 0`: -0.0 is zero, NaN is non-zero.

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{bind_out, fmt_shape};
use crate::kernels::wgsl::params;
use crate::{DType, Error, Result, bail_invalid};

const WHERE_WGSL: &str = include_str!("where.wgsl");

/// Elements per workgroup (block) of `where.wgsl`.
const BLOCK: usize = 1024;
/// Highest rank: the shape travels in two vec4s.
const MAX_RANK: usize = 8;

const DTYPES: &[DType] = &[DType::Bool, DType::U8, DType::I32, DType::I64, DType::F32];

/// Registration table.
pub const OPS: &[OpDef] = &[OpDef {
    op: "Where",
    type_attr: "T",
    dtypes: DTYPES,
    host_inputs: &[],
    factory: |_| Ok(Box::new(Where)),
}];

struct Where;

impl Where {
    /// Validates the input; returns its element count.
    fn check(inputs: &[Operand]) -> Result<usize> {
        if inputs.len() != 1 {
            bail_invalid!("Where takes 1 input, got {}", inputs.len());
        }
        let desc = inputs[0].desc();
        if !DTYPES.contains(&desc.dtype) {
            return Err(Error::Unimplemented(format!(
                "Where has no tfwgpu kernel for T={}",
                desc.dtype
            )));
        }
        if desc.shape.is_empty() {
            // As TensorFlow's kernels (CPU and GPU).
            bail_invalid!("WhereOp : Unhandled input dimensions: 0");
        }
        if desc.shape.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "Where: input of rank {} ({}); at most {MAX_RANK} is supported",
                desc.shape.len(),
                fmt_shape(&desc.shape)
            )));
        }
        let n = desc.num_elements();
        if n > u32::MAX as usize - BLOCK {
            return Err(Error::Unimplemented(format!(
                "Where: inputs of more than 2^32 elements are not supported (got {n})"
            )));
        }
        Ok(n)
    }

    /// Records one dispatch of `mode` (0 count, 1 scan, 2 scatter).
    fn dispatch(
        ctx: &KernelContext,
        mode: u32,
        x: &DeviceRef,
        counts: &crate::exec::BufferRange,
        out: Option<crate::exec::BufferRange>,
    ) -> Result<()> {
        let dtype = x.desc.dtype;
        let shape = &x.desc.shape;
        let n = x.desc.num_elements();
        let blocks = n.div_ceil(BLOCK);
        let pipeline = ctx.pipeline(
            PipelineKey::new("nonzero", Some(dtype), format!("where/{mode}")),
            || {
                ShaderSource::new(
                    WHERE_WGSL
                        .replace("$MODE", &mode.to_string())
                        .replace("$NONZERO", nonzero_expr(dtype)),
                )
            },
        )?;
        let (gx, gy) = if mode == 1 {
            (1, 1)
        } else {
            let gx = blocks.min(crate::kernel::MAX_GROUPS_X as usize);
            (gx, blocks.div_ceil(gx))
        };
        let mut w = vec![n as u32, blocks as u32, shape.len() as u32, gx as u32];
        let mut dims = [0u32; MAX_RANK];
        for (d, &s) in dims.iter_mut().zip(shape) {
            *d = s as u32;
        }
        w.extend_from_slice(&dims);
        let xb = ctx.bind(x)?;
        // The count and scan passes write no output: bind a scratch word in its place.
        let ob = match out {
            Some(o) => o,
            None => ctx.temp(4)?,
        };
        ctx.dispatch(
            &pipeline,
            &params(&w),
            &[xb, counts.clone(), ob],
            [gx as u32, gy as u32, 1],
        )
    }
}

/// WGSL: whether element `i` of the `array<u32>` `x` is non-zero.
fn nonzero_expr(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool | DType::U8 => "((x[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u",
        DType::I64 => "(x[2u * i] | x[2u * i + 1u]) != 0u",
        // -0.0 == 0; NaN != 0.
        DType::F32 => "(x[i] & 0x7fffffffu) != 0u",
        _ => "x[i] != 0u",
    }
}

impl Kernel for Where {
    fn op(&self) -> &'static str {
        "Where"
    }

    /// The output shape depends on the data: see `outputs_on_device`.
    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Self::check(inputs)?;
        Err(Error::Unimplemented(
            "Where: the output shape depends on the input data; use Device::output_descs \
             (Kernel::outputs_on_device)"
                .into(),
        ))
    }

    fn outputs_on_device(
        &self,
        ctx: &KernelContext,
        inputs: &[Operand],
    ) -> Result<Vec<TensorDesc>> {
        let n = Self::check(inputs)?;
        let x = inputs[0].device("Where", 0)?;
        let rank = x.desc.shape.len();
        if n == 0 {
            return Ok(vec![TensorDesc::new(DType::I64, &[0, rank])]);
        }
        let blocks = n.div_ceil(BLOCK);
        let counts = ctx.temp((blocks * 4) as u64)?;
        Self::dispatch(ctx, 0, x, &counts, None)?;
        let bytes = ctx.read(&counts, (blocks * 4) as u64)?;
        let total: u64 = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
            .sum();
        Ok(vec![TensorDesc::new(DType::I64, &[total as usize, rank])])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let n = Self::check(inputs)?;
        let x = inputs[0].device("Where", 0)?;
        let out = &outputs[0];
        let rank = x.desc.shape.len();
        if out.desc.dtype != DType::I64 || out.desc.shape.len() != 2 || out.desc.shape[1] != rank {
            bail_invalid!(
                "Where: output is {} {} but the op computes int64 [count,{rank}]",
                out.desc.dtype,
                fmt_shape(&out.desc.shape)
            );
        }
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(BLOCK);
        let counts = ctx.temp((blocks * 4) as u64)?;
        let o = bind_out(ctx, "Where", out)?;
        Self::dispatch(ctx, 0, x, &counts, None)?;
        Self::dispatch(ctx, 1, x, &counts, None)?;
        Self::dispatch(ctx, 2, x, &counts, Some(o))
    }
}
