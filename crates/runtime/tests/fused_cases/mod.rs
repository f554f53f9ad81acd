//! What the fused elementwise kernel's test files share: running a program fused and one op
//! (one kernel) at a time, and evaluating it on the CPU per output element with NumPy's
//! broadcasting. Each file supplies its own CPU value of one instruction.
#![allow(dead_code)]

use crate::common::dev;
use tfwgpu_runtime::kernels::fused::{Arg as PArg, FusedOp, Instr, OP, OP_MULTI, Program};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, HostTensor, Tensor};

pub fn fused_attrs(program: &str, n: usize, dtype: DType) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("N", AttrValue::Int(n as i64))
        .with("program", AttrValue::Str(program.into()))
}

/// Runs the program fused (`_TfwgpuFusedElementwise`).
pub fn run_fused(program: &str, inputs: &[&Tensor], dtype: DType) -> Tensor {
    let args: Vec<Arg> = inputs.iter().map(|t| Arg::from(*t)).collect();
    dev()
        .run(OP, &fused_attrs(program, inputs.len(), dtype), &args)
        .unwrap_or_else(|e| panic!("{program}: {e}"))
        .remove(0)
}

/// The error of a float32 program run fused on `inputs` (which must fail).
pub fn fused_err(program: &str, inputs: &[&Tensor]) -> String {
    let args: Vec<Arg> = inputs.iter().map(|t| Arg::from(*t)).collect();
    dev()
        .run(OP, &fused_attrs(program, inputs.len(), DType::F32), &args)
        .err()
        .unwrap_or_else(|| panic!("{program}: no error"))
        .to_string()
}

/// Runs a multi-output program fused (`_TfwgpuFusedElementwiseMulti`).
pub fn run_multi(
    program: &str,
    exports: &[usize],
    inputs: &[&Tensor],
    dtype: DType,
) -> Vec<Tensor> {
    let args: Vec<Arg> = inputs.iter().map(|t| Arg::from(*t)).collect();
    let attrs = fused_attrs(program, inputs.len(), dtype)
        .with("M", AttrValue::Int(exports.len() as i64 + 1))
        .with(
            "exports",
            AttrValue::Ints(exports.iter().map(|&e| e as i64).collect()),
        );
    dev()
        .run(OP_MULTI, &attrs, &args)
        .unwrap_or_else(|e| panic!("{program} exports {exports:?}: {e}"))
}

/// Every instruction's result, one op (one kernel) at a time (a comparison gives a bool
/// tensor, which the SelectV2 kernel takes as its condition; a Tile runs TensorFlow's Tile).
pub fn run_unfused_all(
    program: &str,
    inputs: &[&Tensor],
    exports: &[usize],
    dtype: DType,
) -> Vec<Tensor> {
    let p = Program::parse_multi(program, inputs.len(), exports).unwrap();
    let attrs = Attrs::new().with("T", AttrValue::Type(dtype));
    let mut temps: Vec<Tensor> = vec![];
    for ins in &p.instrs {
        let args: Vec<Arg> = ins
            .args
            .iter()
            .map(|a| match *a {
                PArg::Input(i) => Arg::from(inputs[i]),
                PArg::Temp(t) => Arg::from(&temps[t]),
            })
            .collect();
        let out = if ins.op == FusedOp::Tile {
            let m: Vec<i32> = ins.multiples.iter().map(|&m| m as i32).collect();
            let mt = HostTensor::new(&m, &[m.len()]).unwrap();
            dev().run("Tile", &attrs, &[args[0], Arg::from(&mt)])
        } else {
            dev().run(ins.name, &attrs, &args)
        };
        let mut out = out.unwrap_or_else(|e| panic!("{program}: {}: {e}", ins.name));
        temps.push(out.remove(0));
    }
    temps
}

/// The program's result, one op (one kernel) at a time.
pub fn run_unfused(program: &str, inputs: &[&Tensor], dtype: DType) -> Tensor {
    run_unfused_all(program, inputs, &[], dtype).pop().unwrap()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The program on the CPU: each output element computed from the inputs read at its
/// broadcast coordinates (NumPy rules, aligned on the right), `eval` giving one instruction's
/// value from its operands' values.
pub fn cpu_program(
    program: &str,
    inputs: &[(&[f32], &[usize])],
    out_shape: &[usize],
    eval: impl Fn(&Instr, &[f32]) -> f32,
) -> Vec<f32> {
    let p = Program::parse(program, inputs.len()).unwrap();
    let n: usize = out_shape.iter().product();
    let rank = out_shape.len();
    let mut coord = vec![0; rank];
    (0..n)
        .map(|e| {
            let mut rem = e;
            for d in (0..rank).rev() {
                coord[d] = rem % out_shape[d];
                rem /= out_shape[d];
            }
            let x: Vec<f32> = inputs
                .iter()
                .map(|(data, shape)| {
                    let pad = rank - shape.len();
                    let off = shape.iter().enumerate().fold(0, |off, (d, &s)| {
                        off * s + if s == 1 { 0 } else { coord[d + pad] }
                    });
                    data[off]
                })
                .collect();
            let mut t: Vec<f32> = vec![];
            for ins in &p.instrs {
                let args: Vec<f32> = ins
                    .args
                    .iter()
                    .map(|a| match *a {
                        PArg::Input(i) => x[i],
                        PArg::Temp(k) => t[k],
                    })
                    .collect();
                t.push(eval(ins, &args));
            }
            *t.last().unwrap()
        })
        .collect()
}
