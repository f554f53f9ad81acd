//! BiasAdd / BiasAddV1 (value + bias along the channel dimension) and BiasAddGrad (the sum
//! of out_backprop over every dimension but the channel one).
//!
//! The channel dimension is the last one for `data_format = "NHWC"` (the default, and
//! BiasAddV1's only layout) and dimension 1 for "NCHW" (for a rank-2 input both are the
//! last). BiasAdd on f16 adds in f32 and rounds once, as Eigen's half does. BiasAddGrad is the
//! reduce family's Sum over a [outer, channels, inner] view of out_backprop, so float32 sums
//! are pairwise (TensorFlow's CPU kernel accumulates in a different order: results agree to
//! rounding, not bit for bit).

use crate::kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, Operand, Registry, TensorDesc, grid_1d,
};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{
    COMMON_WGSL, bind_out, compute_type, fmt_shape, load_expr, store_stmt, words_for,
};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, HostTensor, Result, bail_invalid};

pub(super) const BIAS_ADD_DTYPES: &[DType] = &[DType::F32, DType::F16, DType::I32];
pub(super) const BIAS_GRAD_DTYPES: &[DType] = &[DType::F32, DType::F16, DType::I32];

/// Reads `data_format` ("NHWC" or "NCHW"); true for NCHW.
fn channels_first(op: &str, attrs: &Attrs) -> Result<bool> {
    match attrs.get("data_format") {
        None => Ok(false),
        Some(AttrValue::Str(s)) if s == "NHWC" => Ok(false),
        Some(AttrValue::Str(s)) if s == "NCHW" => Ok(true),
        Some(other) => bail_invalid!("{op}: Invalid data format {other:?}; expected NHWC or NCHW"),
    }
}

/// (outer, channels, inner) of a value whose channel dimension is `channel`.
fn split(shape: &[usize], channel: usize) -> (usize, usize, usize) {
    (
        shape[..channel].iter().product(),
        shape[channel],
        shape[channel + 1..].iter().product(),
    )
}

/// The channel dimension of `shape` (rank >= 2).
fn channel_dim(shape: &[usize], nchw: bool) -> usize {
    if nchw { 1 } else { shape.len() - 1 }
}

pub(super) struct BiasAdd {
    name: &'static str,
    nchw: bool,
}

impl BiasAdd {
    pub fn build(name: &'static str, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let nchw = if name == "BiasAdd" {
            channels_first(name, attrs)?
        } else {
            false
        };
        Ok(Box::new(BiasAdd { name, nchw }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(TensorDesc, usize)> {
        let name = self.name;
        if inputs.len() != 2 {
            bail_invalid!("{name} takes 2 inputs (value, bias), got {}", inputs.len());
        }
        let (value, bias) = (inputs[0].desc(), inputs[1].desc());
        if value.dtype != bias.dtype {
            bail_invalid!(
                "{name}: value is {} but bias is {}; both must have one dtype",
                value.dtype,
                bias.dtype
            );
        }
        if !BIAS_ADD_DTYPES.contains(&value.dtype) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={}",
                value.dtype
            )));
        }
        if value.shape.len() < 2 {
            bail_invalid!(
                "{name}: Input tensor must be at least 2D: {}",
                fmt_shape(&value.shape)
            );
        }
        if bias.shape.len() != 1 {
            bail_invalid!("{name}: Biases must be 1D: {}", fmt_shape(&bias.shape));
        }
        let channel = channel_dim(&value.shape, self.nchw);
        if bias.shape[0] != value.shape[channel] {
            bail_invalid!(
                "{name}: Must provide as many biases as the {} dimension of the input tensor: \
                 {} vs. {}",
                if self.nchw { "channel" } else { "last" },
                fmt_shape(&bias.shape),
                fmt_shape(&value.shape)
            );
        }
        words_for(name, value.dtype, value.num_elements())?;
        Ok((value, channel))
    }
}

const BIAS_ADD_WGSL: &str = "struct Params { row: u32, n: u32, words: u32, channels: u32, inner: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> bias: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
$LINEAR_INDEX
$COMMON
fn load_x(i: u32) -> $T {
    return $LOAD_X;
}
fn load_bias(i: u32) -> $T {
    return $LOAD_BIAS;
}
fn elem(e: u32) -> $T {
    return load_x(e) + load_bias((e / p.inner) % p.channels);
}
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
";

impl Kernel for BiasAdd {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?.0])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (desc, channel) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc != desc {
            bail_invalid!(
                "{}: output is {} {} but the value is {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                desc.dtype,
                fmt_shape(&desc.shape)
            );
        }
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let (_, channels, inner) = split(&desc.shape, channel);
        let dtype = desc.dtype;
        let x = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let b = ctx.bind(inputs[1].device(self.name, 1)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let pipeline = ctx.pipeline(PipelineKey::new("nn", Some(dtype), "bias_add"), || {
            ShaderSource::new(
                BIAS_ADD_WGSL
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$COMMON", COMMON_WGSL)
                    .replace("$LOAD_X", &load_expr(dtype, "x"))
                    .replace("$LOAD_BIAS", &load_expr(dtype, "bias"))
                    .replace("$STORE", store_stmt(dtype))
                    .replace("$T", compute_type(dtype))
                    .replace("$WG", &WG.to_string()),
            )
        })?;
        let words = words_for(self.name, dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let p = params(&[row, n as u32, words, channels as u32, inner as u32, 0, 0, 0]);
        ctx.dispatch(&pipeline, &p, &[x, b, o], groups)
    }
}

pub(super) struct BiasAddGrad {
    nchw: bool,
}

impl BiasAddGrad {
    pub fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(BiasAddGrad {
            nchw: channels_first("BiasAddGrad", attrs)?,
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(DType, Vec<usize>, usize)> {
        if inputs.len() != 1 {
            bail_invalid!("BiasAddGrad takes 1 input, got {}", inputs.len());
        }
        let desc = inputs[0].desc();
        if !BIAS_GRAD_DTYPES.contains(&desc.dtype) {
            return Err(Error::Unimplemented(format!(
                "BiasAddGrad has no tfwgpu kernel for T={}",
                desc.dtype
            )));
        }
        if desc.shape.len() < 2 {
            bail_invalid!(
                "BiasAddGrad: Input tensor must be at least 2D: {}",
                fmt_shape(&desc.shape)
            );
        }
        let channel = channel_dim(&desc.shape, self.nchw);
        Ok((desc.dtype, desc.shape, channel))
    }
}

impl Kernel for BiasAddGrad {
    fn op(&self) -> &'static str {
        "BiasAddGrad"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (dtype, shape, channel) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(dtype, &[shape[channel]])])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (dtype, shape, channel) = self.check(inputs)?;
        let input = inputs[0].device("BiasAddGrad", 0)?;
        let (outer, channels, inner) = split(&shape, channel);
        if outputs[0].desc != TensorDesc::new(dtype, &[channels]) {
            bail_invalid!(
                "BiasAddGrad: output is {} {} but the op computes {dtype} [{channels}]",
                outputs[0].desc.dtype,
                fmt_shape(&outputs[0].desc.shape)
            );
        }
        // Sum over dimensions 0 and 2 of the [outer, channels, inner] view.
        let sum = Registry::global().build_kernel(
            "Sum",
            &Attrs::new()
                .with("T", AttrValue::Type(dtype))
                .with("keep_dims", AttrValue::Bool(false)),
        )?;
        let view = DeviceRef {
            desc: TensorDesc::new(dtype, &[outer, channels, inner]),
            addr: input.addr,
        };
        let axes = HostTensor::vec_i32(&[0, 2]);
        sum.record(
            ctx,
            &[Operand::Device(&view), Operand::Host(&axes)],
            outputs,
        )
    }
}
