//! float16 ops computed by their float32 kernel, as TensorFlow's GPU kernels compute half
//! softmax, cross-entropy, bias gradients and (cuBLAS, f32 compute type) matmul: every f16
//! input is converted exactly to an f32 temporary, the f32 kernel runs, and each of its f32
//! outputs is rounded once (to nearest even) to f16. The conversions are `f16conv`'s (in
//! hardware where the adapter passed its self-test).

use crate::kernel::{DeviceRef, Factory, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, bind_out};
use crate::kernels::f16conv;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{AttrValue, Attrs, DType, Result};

const CONVERT_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    threads: u32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

const TO_F16: bool = $TO_F16;

$LINEAR_INDEX
$COMMON
$F16

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.threads {
        return;
    }
    if TO_F16 {
        // Output word i holds elements 2i and 2i + 1.
        let lo = bitcast<f32>(src[2u * i]);
        var hi = 0.0;
        if 2u * i + 1u < p.n {
            hi = bitcast<f32>(src[2u * i + 1u]);
        }
        dst[i] = f32x2_to_f16(vec2<f32>(lo, hi));
    } else {
        dst[i] = bitcast<u32>(h16_to_f32((src[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu));
    }
}
";

/// Records the conversion of `src` to `dst` (f16 -> f32 or f32 -> f16, same shape).
pub(crate) fn convert(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    dst: &DeviceRef,
) -> Result<()> {
    let n = src.desc.num_elements();
    if n == 0 {
        return Ok(());
    }
    let to_f16 = dst.desc.dtype == DType::F16;
    let (hw, suffix) = f16conv::choice(ctx, true)?;
    let key = PipelineKey::new(
        "nn",
        Some(DType::F16),
        format!(
            "{}{suffix}",
            if to_f16 { "f32_to_f16" } else { "f16_to_f32" }
        ),
    );
    let pipeline = ctx.pipeline(key, || {
        ShaderSource::new(
            CONVERT_WGSL
                .replace("$LINEAR_INDEX", LINEAR_INDEX)
                .replace("$COMMON", COMMON_WGSL)
                .replace("$F16", f16conv::f16x2_wgsl(hw))
                .replace("$TO_F16", &to_f16.to_string())
                .replace("$WG", &WG.to_string()),
        )
    })?;
    let threads = if to_f16 { n.div_ceil(2) } else { n };
    let (groups, row) = grid_1d(threads as u64, WG);
    let s = ctx.bind(src)?;
    let d = bind_out(ctx, op, dst)?;
    ctx.dispatch(
        &pipeline,
        &params(&[row, n as u32, threads as u32, 0]),
        &[s, d],
        groups,
    )
}

/// An f16 op run by its f32 kernel.
pub(crate) struct F16Compute {
    inner: Box<dyn Kernel>,
}

/// Builds `factory`'s kernel; for float16, an f32 kernel wrapped in [`F16Compute`] (the type
/// attributes are set to float32 for it).
pub(crate) fn build(
    factory: Factory,
    attrs: &Attrs,
    type_attrs: &[&str],
) -> Result<Box<dyn Kernel>> {
    // float16 when every type attribute given is float16, or none is given (then the input
    // dtypes decide); mixed types go to the inner kernel, which rejects them.
    let mut half = true;
    for &a in type_attrs {
        if let Some(t) = attrs.dtype_opt(a)? {
            half &= t == DType::F16;
        }
    }
    if !half {
        return factory(attrs);
    }
    let mut f32_attrs = attrs.clone();
    for &a in type_attrs {
        if attrs.get(a).is_some() {
            f32_attrs.set(a, AttrValue::Type(DType::F32));
        }
    }
    Ok(Box::new(F16Compute {
        inner: factory(&f32_attrs)?,
    }))
}

/// `desc` with f16 replaced by f32.
fn widened(desc: &TensorDesc) -> TensorDesc {
    if desc.dtype == DType::F16 {
        TensorDesc::new(DType::F32, &desc.shape)
    } else {
        desc.clone()
    }
}

impl F16Compute {
    /// The inner kernel's outputs for the widened inputs, and the f16 outputs of the op.
    fn descs(&self, inputs: &[Operand]) -> Result<(Vec<TensorDesc>, Vec<TensorDesc>)> {
        // Stand-ins with the widened descs (outputs() reads descs and host data only).
        let stand_ins: Vec<Option<DeviceRef>> = inputs
            .iter()
            .map(|i| match i {
                Operand::Device(d) => Some(DeviceRef {
                    desc: widened(&d.desc),
                    addr: d.addr,
                }),
                Operand::Host(_) => None,
            })
            .collect();
        let ops: Vec<Operand> = inputs
            .iter()
            .zip(&stand_ins)
            .map(|(i, s)| match s {
                Some(d) => Operand::Device(d),
                None => *i,
            })
            .collect();
        let inner = self.inner.outputs(&ops)?;
        let half = inputs.iter().any(|i| i.dtype() == DType::F16);
        let outer = inner
            .iter()
            .map(|d| {
                if half && d.dtype == DType::F32 {
                    TensorDesc::new(DType::F16, &d.shape)
                } else {
                    d.clone()
                }
            })
            .collect();
        Ok((inner, outer))
    }
}

impl Kernel for F16Compute {
    fn op(&self) -> &'static str {
        self.inner.op()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(self.descs(inputs)?.1)
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.inner.op();
        let (inner_descs, _) = self.descs(inputs)?;
        let mut wide_inputs: Vec<Option<DeviceRef>> = vec![];
        for i in inputs {
            wide_inputs.push(match i {
                Operand::Device(d) if d.desc.dtype == DType::F16 => {
                    let t = ctx.temp_tensor(widened(&d.desc))?;
                    convert(ctx, op, d, &t)?;
                    Some(t)
                }
                _ => None,
            });
        }
        let ops: Vec<Operand> = inputs
            .iter()
            .zip(&wide_inputs)
            .map(|(i, w)| match w {
                Some(d) => Operand::Device(d),
                None => *i,
            })
            .collect();
        let mut wide_outputs = vec![];
        for (o, d) in outputs.iter().zip(&inner_descs) {
            wide_outputs.push(if o.desc.dtype == DType::F16 {
                ctx.temp_tensor(d.clone())?
            } else {
                o.clone()
            });
        }
        self.inner.record(ctx, &ops, &wide_outputs)?;
        for (o, w) in outputs.iter().zip(&wide_outputs) {
            if o.desc.dtype == DType::F16 {
                convert(ctx, op, w, o)?;
            }
        }
        Ok(())
    }
}
