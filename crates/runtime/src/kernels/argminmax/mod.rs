//! argminmax family: ArgMax and ArgMin over one axis (`dimension`, a host-memory int32 or
//! int64 scalar, negative values wrapping), for float32, float16, int32 and int64 inputs,
//! with an int32 or int64 `output_type` (default int64).
//!
//! Semantics of TensorFlow's CPU kernel: ties give the first index; NaN is never selected
//! (a row of NaN gives 0); the running best starts at index 0 with the lowest (ArgMax) or
//! highest (ArgMin) finite value, so a row whose values are all -inf or -FLT_MAX gives 0
//! for ArgMax (and +inf / FLT_MAX for ArgMin); -0 and +0 tie. An empty reduction axis is an
//! error ("Reduction axis 0 is empty in shape [0,3]"), as in TensorFlow.

use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_2d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, bind_out, fmt_shape};
use crate::kernels::wgsl::params;
use crate::{DType, Error, Result, bail_invalid};

const ARG_WGSL: &str = include_str!("argminmax.wgsl");

const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "ArgMax",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(1, "dimension")],
        factory: |a| ArgMinMax::build(true, a),
    },
    OpDef {
        op: "ArgMin",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(1, "dimension")],
        factory: |a| ArgMinMax::build(false, a),
    },
];

/// Invocations per workgroup.
const WG: usize = 256;
/// Elements per invocation a row should have before more invocations share it.
const PER_THREAD: usize = 8;

struct ArgMinMax {
    max: bool,
    output_type: DType,
}

impl ArgMinMax {
    fn name(&self) -> &'static str {
        if self.max { "ArgMax" } else { "ArgMin" }
    }

    fn build(max: bool, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let name = if max { "ArgMax" } else { "ArgMin" };
        let output_type = attrs
            .dtype_opt("output_type")
            .map_err(|e| crate::invalid_arg!("{name}: {e}"))?
            .unwrap_or(DType::I64);
        if !matches!(output_type, DType::I32 | DType::I64) {
            bail_invalid!("{name}: output_type must be int32 or int64, got {output_type}");
        }
        Ok(Box::new(ArgMinMax { max, output_type }))
    }

    /// Validates the inputs; returns the input and the (outer, r, inner) split.
    fn check(&self, inputs: &[Operand]) -> Result<(TensorDesc, usize, (usize, usize, usize))> {
        let name = self.name();
        if inputs.len() != 2 {
            bail_invalid!(
                "{name} takes 2 inputs (input, dimension), got {}",
                inputs.len()
            );
        }
        let x = inputs[0].desc();
        if !DTYPES.contains(&x.dtype) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={}",
                x.dtype
            )));
        }
        let dim = inputs[1].host(name, 1)?;
        if !dim.shape.is_empty() {
            bail_invalid!(
                "{name}: dim must be a scalar, but received tensor of shape: {}",
                fmt_shape(&dim.shape)
            );
        }
        let d = dim.to_i64_vec().map_err(|_| {
            crate::invalid_arg!(
                "{name}: dimension must be int32 or int64, got {}",
                dim.dtype
            )
        })?[0];
        let rank = x.shape.len() as i64;
        if d < -rank || d >= rank {
            bail_invalid!(
                "{name}: Expected dimension in the range [{}, {rank}), but got {d}",
                -rank
            );
        }
        let axis = d.rem_euclid(rank) as usize;
        if x.shape[axis] == 0 {
            bail_invalid!(
                "{name}: Reduction axis {d} is empty in shape {}",
                fmt_shape(&x.shape)
            );
        }
        let split = (
            x.shape[..axis].iter().product::<usize>(),
            x.shape[axis],
            x.shape[axis + 1..].iter().product::<usize>(),
        );
        if x.num_elements() > u32::MAX as usize {
            return Err(Error::Unimplemented(format!(
                "{name}: tensors of more than 2^32-1 elements are not supported (got {})",
                x.num_elements()
            )));
        }
        Ok((x, axis, split))
    }
}

/// The WGSL of `key(i)` for a dtype.
fn key_body(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            "    let b = x[i];
    if (b & 0x7fffffffu) > 0x7f800000u {
        *valid = false;
    }
    return vec2<u32>(f32_key(b), 0u);"
        }
        DType::F16 => {
            "    let v = f16_to_f32((x[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    if is_nan(v) {
        *valid = false;
    }
    return vec2<u32>(f32_key(bitcast<u32>(v)), 0u);"
        }
        DType::I32 => "    return vec2<u32>(x[i] ^ 0x80000000u, 0u);",
        _ => "    return vec2<u32>(x[2u * i + 1u] ^ 0x80000000u, x[2u * i]);",
    }
}

/// The key of the starting value: the lowest (ArgMax) or highest (ArgMin) finite value.
fn init_key(dtype: DType, max: bool) -> String {
    let f32_key = |v: f32| -> u32 {
        let b = v.to_bits();
        if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        }
    };
    let (a, b) = match (dtype, max) {
        (DType::F32, true) => (f32_key(f32::MIN), 0),
        (DType::F32, false) => (f32_key(f32::MAX), 0),
        (DType::F16, true) => (f32_key(-65504.0), 0),
        (DType::F16, false) => (f32_key(65504.0), 0),
        (DType::I32, true) => (0, 0),
        (DType::I32, false) => (u32::MAX, 0),
        (_, true) => (0, 0),
        (_, false) => (u32::MAX, u32::MAX),
    };
    format!("vec2<u32>({a:#x}u, {b:#x}u)")
}

fn shader(dtype: DType, max: bool, wide: bool) -> String {
    ARG_WGSL
        .replace("$COMMON", COMMON_WGSL)
        .replace("$KEY", key_body(dtype))
        .replace("$INIT", &init_key(dtype, max))
        .replace("$BETTER", if max { ">" } else { "<" })
        .replace("$WIDE", &wide.to_string())
}

impl Kernel for ArgMinMax {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (x, axis, _) = self.check(inputs)?;
        let mut shape = x.shape.clone();
        shape.remove(axis);
        Ok(vec![TensorDesc::new(self.output_type, &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.name();
        let (x, axis, (outer, r, inner)) = self.check(inputs)?;
        let out = &outputs[0];
        let mut shape = x.shape.clone();
        shape.remove(axis);
        if out.desc != TensorDesc::new(self.output_type, &shape) {
            bail_invalid!(
                "{name}: output is {} {} but the op computes {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                self.output_type,
                fmt_shape(&shape)
            );
        }
        let outputs_n = outer * inner;
        if outputs_n == 0 {
            return Ok(());
        }
        let src = ctx.bind(inputs[0].device(name, 0)?)?;
        let dst = bind_out(ctx, name, out)?;
        let (dtype, max, wide) = (x.dtype, self.max, self.output_type == DType::I64);
        let key = PipelineKey::new(
            "argminmax",
            Some(dtype),
            format!("{}/{}", name.to_ascii_lowercase(), self.output_type),
        );
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(dtype, max, wide)))?;
        // One invocation per output along columns (coalesced reads); a group per row.
        let t = if inner > 1 {
            1
        } else {
            r.div_ceil(PER_THREAD).max(1).next_power_of_two().min(WG)
        };
        let g = WG / t;
        let groups = outputs_n.div_ceil(g);
        let (gx, gy) = grid_2d(groups, || format!("{name}: {outputs_n} outputs"))?;
        // At most 32,768 loop iterations per invocation and dispatch (CPU adapters stop a
        // shader's loops after 65,535 in all): long rows run as several dispatches.
        let chunk = crate::kernels::wgsl::LOOP_BUDGET * t;
        let mut start = 0;
        loop {
            let end = (start + chunk).min(r);
            let p = params(&[
                outputs_n as u32,
                r as u32,
                inner as u32,
                g as u32,
                t as u32,
                gx as u32,
                start as u32,
                end as u32,
            ]);
            ctx.dispatch(
                &pipeline,
                &p,
                &[src.clone(), dst.clone()],
                [gx as u32, gy as u32, 1],
            )?;
            start = end;
            if start >= r {
                return Ok(());
            }
        }
    }
}
