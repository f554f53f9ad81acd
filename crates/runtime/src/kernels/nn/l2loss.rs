//! L2Loss: sum(t^2) / 2 over every element, a scalar (float32; float16 accumulates in f32 and
//! rounds once, as TensorFlow's half reduction accumulates in float).
//!
//! Each invocation sums the squares of a strided part of the input in f32, a workgroup
//! combines its invocations by a tree, and when the input needs more than one workgroup a
//! second dispatch combines the workgroups' partial sums the same way. L2Loss of an empty
//! tensor is 0; NaN and infinities propagate.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, fmt_shape, load_expr};
use crate::kernels::wgsl::params;
use crate::{DType, Error, Result, bail_invalid};

pub(super) const DTYPES: &[DType] = &[DType::F32, DType::F16];

const WG: usize = 256;
/// Elements each invocation sums at least, before another workgroup is added.
const PER_THREAD: usize = 8;
/// Most workgroups of the first pass (the second pass sums their results).
const MAX_GROUPS: usize = 1024;

const L2_WGSL: &str = "struct Params { n: u32, groups: u32, square: u32, finalize: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<workgroup> sh: array<f32, 256>;
$COMMON
fn load(i: u32) -> f32 {
    return $LOAD;
}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    var acc = 0.0;
    let stride = p.groups * 256u;
    for (var i = wid.x * 256u + l; i < p.n; i = i + stride) {
        let v = load(i);
        if p.square == 1u {
            acc = acc + v * v;
        } else {
            acc = acc + v;
        }
    }
    sh[l] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if l < s {
            sh[l] = sh[l] + sh[l + s];
        }
        workgroupBarrier();
    }
    if l == 0u {
        let r = sh[0];
        if p.finalize == 1u {
            out[0] = $STORE;
        } else {
            out[wid.x] = bitcast<u32>(r);
        }
    }
}
";

pub(super) struct L2Loss;

impl L2Loss {
    fn check(&self, inputs: &[Operand]) -> Result<TensorDesc> {
        if inputs.len() != 1 {
            bail_invalid!("L2Loss takes 1 input, got {}", inputs.len());
        }
        let desc = inputs[0].desc();
        if !DTYPES.contains(&desc.dtype) {
            return Err(Error::Unimplemented(format!(
                "L2Loss has no tfwgpu kernel for T={}",
                desc.dtype
            )));
        }
        if desc.num_elements() > (u32::MAX as usize) - WG * MAX_GROUPS {
            return Err(Error::Unimplemented(format!(
                "L2Loss: tensors of more than 2^32 - 2^18 elements are not supported (got {})",
                desc.num_elements()
            )));
        }
        Ok(desc)
    }
}

fn shader(input: DType, output: DType) -> String {
    let store = if output == DType::F16 {
        "f32_to_f16(0.5 * r)"
    } else {
        "bitcast<u32>(0.5 * r)"
    };
    L2_WGSL
        .replace("$COMMON", COMMON_WGSL)
        .replace("$LOAD", &load_expr(input, "x"))
        .replace("$STORE", store)
}

impl Kernel for L2Loss {
    fn op(&self) -> &'static str {
        "L2Loss"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let desc = self.check(inputs)?;
        Ok(vec![TensorDesc::new(desc.dtype, &[])])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let dtype = desc.dtype;
        let out = &outputs[0];
        if out.desc != TensorDesc::new(dtype, &[]) {
            bail_invalid!(
                "L2Loss: output is {} {} but the op computes a {dtype} scalar",
                out.desc.dtype,
                fmt_shape(&out.desc.shape)
            );
        }
        let n = desc.num_elements();
        let groups = n.div_ceil(WG * PER_THREAD).clamp(1, MAX_GROUPS);
        let pipeline = |input: DType| {
            ctx.pipeline(
                PipelineKey::new("nn", Some(input), format!("l2loss/{dtype}")),
                || ShaderSource::new(shader(input, dtype)),
            )
        };
        let x = ctx.bind(inputs[0].device("L2Loss", 0)?)?;
        let o = crate::kernels::elementwise::bind_out(ctx, "L2Loss", out)?;
        if groups == 1 {
            let p = params(&[n as u32, 1, 1, 1]);
            let pl = pipeline(dtype)?;
            return ctx.dispatch(&pl, &p, &[x, o], [1, 1, 1]);
        }
        let partial = ctx.temp((groups * 4) as u64)?;
        let p = params(&[n as u32, groups as u32, 1, 0]);
        let first = pipeline(dtype)?;
        ctx.dispatch(&first, &p, &[x, partial.clone()], [groups as u32, 1, 1])?;
        let p = params(&[groups as u32, 1, 0, 1]);
        let second = pipeline(DType::F32)?;
        ctx.dispatch(&second, &p, &[partial, o], [1, 1, 1])
    }
}
