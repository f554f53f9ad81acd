//! AddN: the sum of N tensors of one shape and dtype (float32, float16, int32).
//!
//! The float sum is rounded in TensorFlow's CPU order, so results match it bit for bit: the
//! first r = N mod 8 inputs (8 or 9 when r is 0 or 1) are added left to right, then each
//! following group of 8 is summed left to right and added to the total
//! (`out += in_k + ... + in_k+7`). f16 rounds after every addition, as Eigen's half does.
//! Each dispatch binds at most `max_storage_buffers_per_shader_stage - 1` inputs; a device
//! with fewer than 10 storage bindings per stage sums a long group in a temporary first,
//! which keeps the order.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Error, Result, bail_invalid};

use super::{
    COMMON_WGSL, bind_out, compute_type, fmt_shape, load_expr, rt_expr, store_stmt, words_for,
};

const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::I32];

/// Inputs a dispatch needs at most (TensorFlow's first group has up to 9).
const MAX_INPUTS: usize = 9;

pub(crate) struct AddN {
    /// The `N` attribute, when given.
    n: Option<usize>,
}

impl AddN {
    pub fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let n = attrs
            .int_or("N", -1)
            .map_err(|e| crate::invalid_arg!("AddN: {e}"))?;
        if n == 0 || n < -1 {
            bail_invalid!("AddN: N must be at least 1, got {n}");
        }
        Ok(Box::new(AddN {
            n: (n > 0).then_some(n as usize),
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<TensorDesc> {
        if inputs.is_empty() {
            bail_invalid!("AddN takes at least 1 input, got 0");
        }
        if let Some(n) = self.n
            && n != inputs.len()
        {
            bail_invalid!("AddN: N is {n} but {} inputs were given", inputs.len());
        }
        let first = inputs[0].desc();
        if !DTYPES.contains(&first.dtype) {
            return Err(Error::Unimplemented(format!(
                "AddN has no tfwgpu kernel for T={}",
                first.dtype
            )));
        }
        for (i, x) in inputs.iter().enumerate().skip(1) {
            if x.dtype() != first.dtype {
                bail_invalid!(
                    "AddN: input {i} is {} but input 0 is {}; all inputs must have one dtype",
                    x.dtype(),
                    first.dtype
                );
            }
            if x.shape() != first.shape.as_slice() {
                bail_invalid!(
                    "Inputs to operation AddN of type AddN must have the same size and shape.  \
                     Input 0: {} != input {i}: {}",
                    fmt_shape(&first.shape),
                    fmt_shape(x.shape())
                );
            }
        }
        words_for("AddN", first.dtype, first.num_elements())?;
        Ok(first)
    }
}

/// How a dispatch combines its inputs with its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// target = ((s0 + s1) + s2) + ...
    First,
    /// target = ((target + s0) + s1) + ...
    Continue,
    /// target = target + (((s0 + s1) + s2) + ...)
    AddGroup,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::First => "first",
            Mode::Continue => "continue",
            Mode::AddGroup => "group",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Input(usize),
    Temp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Step {
    mode: Mode,
    srcs: Vec<Src>,
    /// Writes the temporary (else the output).
    to_temp: bool,
}

/// The dispatches summing `n` >= 2 inputs in TensorFlow's order with at most `max_k` inputs
/// per dispatch (`max_k` >= 2).
fn plan(n: usize, max_k: usize) -> Vec<Step> {
    let r = n % 8;
    let first = if r >= 2 { r } else { r + 8 }.min(n);
    let mut steps = vec![];
    // A run of inputs summed left to right into a target, in dispatches of at most max_k.
    let sequential = |steps: &mut Vec<Step>, ids: &[usize], to_temp: bool| {
        for (k, part) in ids.chunks(max_k).enumerate() {
            steps.push(Step {
                mode: if k == 0 { Mode::First } else { Mode::Continue },
                srcs: part.iter().map(|&i| Src::Input(i)).collect(),
                to_temp,
            });
        }
    };
    let ids: Vec<usize> = (0..n).collect();
    sequential(&mut steps, &ids[..first], false);
    for group in ids[first..].chunks(8) {
        if group.len() <= max_k {
            steps.push(Step {
                mode: Mode::AddGroup,
                srcs: group.iter().map(|&i| Src::Input(i)).collect(),
                to_temp: false,
            });
        } else {
            sequential(&mut steps, group, true);
            steps.push(Step {
                mode: Mode::AddGroup,
                srcs: vec![Src::Temp],
                to_temp: false,
            });
        }
    }
    steps
}

fn shader(dtype: DType, mode: Mode, k: usize) -> String {
    let mut decls = String::new();
    let mut loads = String::new();
    for j in 0..k {
        decls.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> in{j}: array<u32>;\n",
            j + 1
        ));
        loads.push_str(&format!(
            "fn load{j}(i: u32) -> T {{\n    return {};\n}}\n",
            load_expr(dtype, &format!("in{j}"))
        ));
    }
    decls.push_str(&format!(
        "@group(0) @binding({}) var<storage, read_write> out: array<u32>;\n",
        k + 1
    ));
    loads.push_str(&format!(
        "fn load_out(i: u32) -> T {{\n    return {};\n}}\n",
        load_expr(dtype, "out")
    ));
    let add = |acc: &str, x: &str| -> String {
        if dtype.is_float() {
            format!("rt({acc} + {x})")
        } else {
            format!("{acc} + {x}")
        }
    };
    let mut body = String::new();
    let (start, from) = match mode {
        Mode::Continue => ("load_out(e)".to_string(), 0),
        _ => ("load0(e)".to_string(), 1),
    };
    body.push_str(&format!("    var acc = {start};\n"));
    for j in from..k {
        body.push_str(&format!(
            "    acc = {};\n",
            add("acc", &format!("load{j}(e)"))
        ));
    }
    if mode == Mode::AddGroup {
        body.push_str(&format!("    acc = {};\n", add("load_out(e)", "acc")));
    }
    body.push_str("    return acc;");
    format!(
        "struct Params {{ row: u32, n: u32, words: u32, pad: u32 }};
@group(0) @binding(0) var<uniform> p: Params;
{decls}
alias T = {t};
{LINEAR_INDEX}
{COMMON_WGSL}
fn rt(v: f32) -> f32 {{
    return {rt};
}}
{loads}
fn elem(e: u32) -> T {{
{body}
}}

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let w = linear_index(gid);
    if w >= p.words {{
        return;
    }}
{store}
}}
",
        t = compute_type(dtype),
        rt = rt_expr(dtype),
        store = store_stmt(dtype),
    )
}

impl Kernel for AddN {
    fn op(&self) -> &'static str {
        "AddN"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc != desc {
            bail_invalid!(
                "AddN: output is {} {} but the inputs are {} {}",
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
        let o = bind_out(ctx, "AddN", out)?;
        let size = desc.byte_size().next_multiple_of(4);
        if inputs.len() == 1 {
            let src = ctx.bind(inputs[0].device("AddN", 0)?)?;
            return ctx.copy(&src, &o, size);
        }
        let bindings = ctx.limits().max_storage_buffers_per_shader_stage as usize;
        let max_k = bindings.saturating_sub(1).min(MAX_INPUTS);
        if max_k < 2 {
            return Err(Error::Unimplemented(format!(
                "AddN needs 3 storage buffers per shader stage, the device has {bindings}"
            )));
        }
        let steps = plan(inputs.len(), max_k);
        let temp = if steps.iter().any(|s| s.to_temp) {
            Some(ctx.temp(size)?)
        } else {
            None
        };
        let dtype = desc.dtype;
        let words = words_for("AddN", dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let p = params(&[row, n as u32, words, 0]);
        for st in &steps {
            let k = st.srcs.len();
            let mut binds = Vec::with_capacity(k + 1);
            for s in &st.srcs {
                binds.push(match s {
                    Src::Input(i) => ctx.bind(inputs[*i].device("AddN", *i)?)?,
                    Src::Temp => temp.clone().expect("planned"),
                });
            }
            binds.push(if st.to_temp {
                temp.clone().expect("planned")
            } else {
                o.clone()
            });
            let key = PipelineKey::new(
                "elementwise",
                Some(dtype),
                format!("addn/{}/{k}", st.mode.name()),
            );
            let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(dtype, st.mode, k)))?;
            ctx.dispatch(&pipeline, &p, &binds, groups)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a plan on f32 values and returns the bits of the result.
    fn simulate(xs: &[f32], max_k: usize) -> u32 {
        let (mut out, mut temp) = (0f32, 0f32);
        for st in plan(xs.len(), max_k) {
            let v = |s: &Src| match s {
                Src::Input(i) => xs[*i],
                Src::Temp => temp,
            };
            let target = if st.to_temp { temp } else { out };
            let r = match st.mode {
                Mode::First => st.srcs[1..].iter().fold(v(&st.srcs[0]), |a, s| a + v(s)),
                Mode::Continue => st.srcs.iter().fold(target, |a, s| a + v(s)),
                Mode::AddGroup => {
                    target + st.srcs[1..].iter().fold(v(&st.srcs[0]), |a, s| a + v(s))
                }
            };
            if st.to_temp {
                temp = r;
            } else {
                out = r;
            }
        }
        out.to_bits()
    }

    /// TensorFlow's order, written directly.
    fn tf_order(xs: &[f32]) -> u32 {
        let n = xs.len();
        let r = n % 8;
        let first = if r >= 2 { r } else { r + 8 }.min(n);
        let mut out = xs[1..first].iter().fold(xs[0], |a, &x| a + x);
        for g in xs[first..].chunks(8) {
            out += g[1..].iter().fold(g[0], |a, &x| a + x);
        }
        out.to_bits()
    }

    #[test]
    fn plans_keep_tensorflows_order() {
        // Values whose sum depends on the order.
        let xs: Vec<f32> = (0..41)
            .map(|i| ((i * 7919 % 23) as f32 - 11.0) * 10f32.powi(i * 5 % 9 - 2))
            .collect();
        for n in 2..=41 {
            for max_k in 2..=MAX_INPUTS {
                assert_eq!(
                    simulate(&xs[..n], max_k),
                    tf_order(&xs[..n]),
                    "n={n} max_k={max_k}"
                );
            }
        }
        // With 9 inputs per dispatch: one dispatch per group, no temporary.
        let p = plan(25, MAX_INPUTS);
        assert_eq!(p.len(), 3);
        assert!(p.iter().all(|s| !s.to_temp));
        assert_eq!(p[0].srcs.len(), 9);
        assert_eq!(p[1].mode, Mode::AddGroup);
        // With 4: the first group of 9 in three dispatches, each group of 8 through the temp.
        let p = plan(17, 4);
        let modes: Vec<_> = p
            .iter()
            .map(|s| (s.mode, s.srcs.len(), s.to_temp))
            .collect();
        assert_eq!(
            modes,
            vec![
                (Mode::First, 4, false),
                (Mode::Continue, 4, false),
                (Mode::Continue, 1, false),
                (Mode::First, 4, true),
                (Mode::Continue, 4, true),
                (Mode::AddGroup, 1, false),
            ]
        );
    }
}
