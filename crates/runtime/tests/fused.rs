//! The fused elementwise kernel (`_TfwgpuFusedElementwise`): each program against the same ops
//! run one kernel at a time on the device (bit for bit: the fused kernel promises the unfused
//! kernels' results) and against a CPU reference evaluated per output element.

mod common;
mod fused_cases;

use common::*;
use fused_cases::*;
use tfwgpu_runtime::kernels::fused::{FusedOp, OP, Program};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, HostTensor, Tensor, f16};

/// The value of one op on the CPU (f64 for the transcendental functions, rounded once).
fn cpu_op(op: FusedOp, x: f32, y: f32) -> f32 {
    use FusedOp::*;
    let f = |g: fn(f64) -> f64| g(x as f64) as f32;
    match op {
        Add | BiasAdd => x + y,
        Sub => x - y,
        Mul => x * y,
        Div => x / y,
        Maximum => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else if x < y {
                y
            } else {
                x
            }
        }
        Minimum => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else if y < x {
                y
            } else {
                x
            }
        }
        SquaredDifference => (x - y) * (x - y),
        Pow => (x as f64).powf(y as f64) as f32,
        Neg => -x,
        Abs => x.abs(),
        Relu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        Exp => f(f64::exp),
        Log => f(f64::ln),
        Sqrt => f(f64::sqrt),
        Rsqrt => f(|v| 1.0 / v.sqrt()),
        Square => x * x,
        Tanh => f(f64::tanh),
        Sigmoid => f(|v| 1.0 / (1.0 + (-v).exp())),
        Reciprocal => 1.0 / x,
        Softplus => f(|v| v.exp().ln_1p()),
        Log1p => f(f64::ln_1p),
        Expm1 => f(f64::exp_m1),
        // gradients * (features > 0): NaN features count as not positive.
        ReluGrad => x * if y > 0.0 { 1.0 } else { 0.0 },
        // (y = rsqrt(v), dy): -0.5 * dy * y^3, 0 where dy is 0.
        RsqrtGrad => {
            if y == 0.0 {
                0.0
            } else {
                ((-0.5 * (y as f64) * (x as f64)) * (x as f64) * (x as f64)) as f32
            }
        }
        // (y, dy): dy * (y * (1 - y)) and dy * (1 - y * y), TensorFlow's association.
        SigmoidGrad => y * (x * (1.0 - x)),
        TanhGrad => y * (1.0 - x * x),
        // The broadcast happens in the reads.
        Tile => x,
        DivNoNan => {
            if y == 0.0 {
                0.0
            } else {
                x / y
            }
        }
        // A comparison's bool, as the program holds it (1.0 or 0.0).
        Equal => (x == y) as u8 as f32,
        NotEqual => (x != y) as u8 as f32,
        Less => (x < y) as u8 as f32,
        LessEqual => (x <= y) as u8 as f32,
        Greater => (x > y) as u8 as f32,
        GreaterEqual => (x >= y) as u8 as f32,
        SelectV2 => panic!("SelectV2 takes three operands: tests/fused_select.rs checks it"),
    }
}

/// The program on the CPU per output element, through `cpu_op`.
fn cpu_program(program: &str, inputs: &[(&[f32], &[usize])], out_shape: &[usize]) -> Vec<f32> {
    fused_cases::cpu_program(program, inputs, out_shape, |ins, a| {
        cpu_op(ins.op, a[0], a.get(1).copied().unwrap_or(0.0))
    })
}

/// Checks `program` on f32 inputs of `shapes` (values from `ranges`): equal bits to the
/// unfused kernels, and within `rtol` of the CPU (0 for the exact ops).
fn check_f32(program: &str, shapes: &[&[usize]], ranges: &[(f32, f32)], rtol: f32, seed: u64) {
    let mut r = rng(seed);
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .zip(ranges)
        .map(|(s, &(lo, hi))| rand_f32(&mut r, s.iter().product(), lo, hi))
        .collect();
    let tensors = upload_all(&data, shapes);
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let fused = run_fused(program, &refs, DType::F32);
    let unfused = run_unfused(program, &refs, DType::F32);
    assert_eq!(fused.shape(), unfused.shape(), "{program}: shape");
    let (got, want_dev) = (
        fused.download::<f32>().unwrap(),
        unfused.download::<f32>().unwrap(),
    );
    assert_eq!(
        bits(&got),
        bits(&want_dev),
        "{program} {shapes:?}: fused differs from the unfused kernels"
    );
    let ins: Vec<(&[f32], &[usize])> = data
        .iter()
        .zip(shapes)
        .map(|(d, s)| (d.as_slice(), *s))
        .collect();
    let want = cpu_program(program, &ins, fused.shape());
    assert_close(&got, &want, rtol, 0.0, &format!("{program} {shapes:?}"));
}

/// Keras Adam's update of a variable (after the moment updates): var - m * alpha / (sqrt(v)
/// + eps), with the scalars alpha and eps.
const ADAM_VAR: &str = "Mul(i0,i1);Sqrt(i2);AddV2(t1,i3);RealDiv(t0,t2);Sub(i4,t3)";
/// Adam's first moment: m + (g - m) * (1 - beta1), m given twice as Keras reads it twice.
const ADAM_M: &str = "Sub(i0,i1);Mul(t0,i2);AddV2(i1,t1)";

#[test]
fn adam_update_matches_the_unfused_ops_at_awkward_sizes() {
    for (k, n) in [1usize, 7, 129, 1000, 4099].into_iter().enumerate() {
        // Division and sqrt: a few ULP each on Vulkan; five ops in a chain.
        check_f32(
            ADAM_VAR,
            &[&[n], &[], &[n], &[], &[n]],
            &[
                (-0.1, 0.1),
                (0.001, 0.01),
                (0.0, 0.01),
                (1e-7, 2e-7),
                (-1.0, 1.0),
            ],
            2e-6,
            k as u64,
        );
        check_f32(
            ADAM_M,
            &[&[n], &[n], &[]],
            &[(-1.0, 1.0), (-0.1, 0.1), (0.05, 0.15)],
            0.0,
            100 + k as u64,
        );
    }
}

/// Keras Adam's step as the pass fuses it (from the mlp trace): the scalar bias correction
/// alpha = lr * sqrt(1 - b2p) / (1 - b1p) computed once per workgroup, then m * alpha /
/// (sqrt(v) + eps).
const ADAM_STEP: &str = "Sub(i0,i1);Sqrt(t0);Mul(i2,t1);Sub(i0,i3);RealDiv(t2,t3);Mul(i4,t4);Sqrt(i5);AddV2(i6,t6);RealDiv(t5,t7)";

#[test]
fn scalar_subexpressions_computed_once_per_workgroup() {
    let p = Program::parse(ADAM_STEP, 7).unwrap();
    let scalars: [&[usize]; 4] = [&[], &[], &[1], &[]];
    let shapes = [
        scalars[0],
        scalars[1],
        scalars[2],
        scalars[3],
        &[9][..],
        &[9][..],
        &[],
    ];
    assert_eq!(
        p.uniform_instrs(&shapes, 9),
        [true, true, true, true, true, false, false, false, false]
    );
    assert!(
        p.uniform_instrs(&[&[], &[], &[], &[], &[], &[], &[]], 1)
            .iter()
            .all(|u| !u)
    );
    for (k, n) in [1usize, 7, 300, 4099].into_iter().enumerate() {
        check_f32(
            ADAM_STEP,
            &[&[], &[], &[1], &[], &[n], &[n], &[]],
            &[
                (1.0, 1.0001),
                (0.9, 0.999),
                (0.001, 0.01),
                (0.5, 0.9),
                (-0.1, 0.1),
                (0.0, 0.01),
                (1e-7, 2e-7),
            ],
            2e-6,
            200 + k as u64,
        );
    }
}

#[test]
fn broadcasting_inputs() {
    // Bias over the last axis, then an activation; rank 3 and rank 2 with an awkward width.
    check_f32(
        "BiasAdd(i0,i1);Relu(t0)",
        &[&[3, 5, 129], &[129]],
        &[(-1.0, 1.0), (-1.0, 1.0)],
        0.0,
        1,
    );
    check_f32(
        "BiasAdd(i0,i1);Relu(t0)",
        &[&[64, 10], &[10]],
        &[(-1.0, 1.0), (-1.0, 1.0)],
        0.0,
        2,
    );
    // General NumPy broadcasting: the output grows along the chain ([3,1] -> [3,4] -> [2,3,4]).
    check_f32(
        "AddV2(i0,i1);Mul(t0,i2);Maximum(t1,i3)",
        &[&[3, 1], &[4], &[2, 1, 1], &[]],
        &[(-1.0, 1.0), (-1.0, 1.0), (-2.0, 2.0), (-0.5, 0.5)],
        0.0,
        3,
    );
    // Middle-axis broadcast (a [1,C,1] input), and both sides broadcast in one op.
    check_f32(
        "Sub(i0,i1);Square(t0);Minimum(t1,i2)",
        &[&[4, 1, 9], &[1, 6, 1], &[4, 6, 9]],
        &[(-1.0, 1.0), (-1.0, 1.0), (0.0, 1.0)],
        0.0,
        4,
    );
    // A chain on one scalar input with another input broadcast to it.
    check_f32(
        "Neg(i0);Mul(t0,i1);Abs(t1)",
        &[&[], &[2, 3, 5]],
        &[(-1.0, 1.0), (-1.0, 1.0)],
        0.0,
        5,
    );
}

#[test]
fn relu_grad_as_the_unfused_kernel() {
    // Keras's step through a residual block: the sum of two gradients, then ReluGrad, then
    // a per-channel scale; features around 0 on both sides.
    check_f32(
        "AddV2(i0,i1);ReluGrad(t0,i2);Mul(t1,i3)",
        &[&[3, 5, 7, 9], &[3, 5, 7, 9], &[3, 5, 7, 9], &[9]],
        &[(-1.0, 1.0), (-1.0, 1.0), (-1.0, 1.0), (0.5, 2.0)],
        0.0,
        20,
    );
    let nan = f32::NAN;
    let g = [nan, 1.0, -2.0, f32::INFINITY, 3.0, nan, -1.0];
    let f = [-1.0, nan, 0.5, -0.0, 0.0, 2.0, -3.0];
    let (a, b) = (
        dev().upload(&g, &[7]).unwrap(),
        dev().upload(&f, &[7]).unwrap(),
    );
    let fused = run_fused("ReluGrad(i0,i1);Neg(t0)", &[&a, &b], DType::F32);
    let unfused = run_unfused("ReluGrad(i0,i1);Neg(t0)", &[&a, &b], DType::F32);
    assert_eq!(
        bits(&fused.download::<f32>().unwrap()),
        bits(&unfused.download::<f32>().unwrap())
    );
    // Unequal shapes are TensorFlow's error, not a broadcast.
    let c = dev().upload(&[1.0f32; 7], &[1, 7]).unwrap();
    let e = fused_err("ReluGrad(i0,i1);Neg(t0)", &[&a, &c]);
    assert!(e.contains("ReluGrad") && e.contains("same shape"), "{e}");
}

/// Runs Tile (multiples as a host input) on the device, then `op` on (scalar, tiled).
fn tile_then(op: &str, x: &Tensor, multiples: &[i32], s: &Tensor) -> Tensor {
    let m = HostTensor::new(multiples, &[multiples.len()]).unwrap();
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::F32));
    let tiled = dev()
        .run("Tile", &attrs, &[Arg::from(x), Arg::from(&m)])
        .unwrap()
        .remove(0);
    dev()
        .run(op, &attrs, &[Arg::from(s), Arg::from(&tiled)])
        .unwrap()
        .remove(0)
}

#[test]
fn tiles_of_size_one_dimensions_are_broadcasts() {
    // The gradient of a mean over N, H, W in NHWC: a [1,1,1,C] tensor tiled to the input's
    // shape and scaled; the output's shape comes from the Tile alone.
    let mut r = rng(21);
    let c = 13;
    let xv = rand_f32(&mut r, c, -1.0, 1.0);
    let x = dev().upload(&xv, &[1, 1, 1, c]).unwrap();
    let s = dev().upload(&[0.25f32], &[]).unwrap();
    let fused = run_fused("Tile[3x5x7x1](i0);Mul(i1,t0)", &[&x, &s], DType::F32);
    assert_eq!(fused.shape(), &[3, 5, 7, c]);
    let want = tile_then("Mul", &x, &[3, 5, 7, 1], &s);
    assert_eq!(
        bits(&fused.download::<f32>().unwrap()),
        bits(&want.download::<f32>().unwrap())
    );
    // Inside a larger tree, next to a full-size input (BatchNorm's backward pass).
    let full = rand_f32(&mut r, 3 * 5 * 7 * c, -1.0, 1.0);
    let f = dev().upload(&full, &[3, 5, 7, c]).unwrap();
    let got = run_fused(
        "Tile[3x5x7x1](i0);Mul(i1,t0);AddV2(i2,t1)",
        &[&x, &s, &f],
        DType::F32,
    )
    .download::<f32>()
    .unwrap();
    let want = cpu_program(
        "Tile[3x5x7x1](i0);Mul(i1,t0);AddV2(i2,t1)",
        &[(&xv, &[1, 1, 1, c]), (&[0.25], &[]), (&full, &[3, 5, 7, c])],
        &[3, 5, 7, c],
    );
    assert_close(&got, &want, 0.0, 0.0, "tile in a tree");
    // Multiples of 1 keep a dimension; 0 empties the output.
    let y = dev().upload(&xv[..6], &[2, 1, 3]).unwrap();
    let out = run_fused("Tile[1x4x1](i0);Neg(t0)", &[&y], DType::F32);
    assert_eq!(out.shape(), &[2, 4, 3]);
    let out = run_fused("Tile[1x0x1](i0);Neg(t0)", &[&y], DType::F32);
    assert_eq!(out.shape(), &[2, 0, 3]);
    // A tiled dimension of size > 1 is no broadcast: the kernel tiles that input first, with
    // the same result as Tile, then the rest of the program.
    let z = dev().upload(&xv[..6], &[2, 3]).unwrap();
    let got = run_fused("Tile[2x3](i0);Mul(i1,t0)", &[&z, &s], DType::F32);
    assert_eq!(got.shape(), &[4, 9]);
    let want = tile_then("Mul", &z, &[2, 3], &s);
    assert_eq!(
        bits(&got.download::<f32>().unwrap()),
        bits(&want.download::<f32>().unwrap())
    );
    // Two Tiles of one input by the same multiples read one materialized copy.
    let got = run_fused("Tile[2x3](i0);Tile[2x3](i0);Mul(t0,t1)", &[&z], DType::F32);
    let tz = tile_then("Mul", &z, &[2, 3], &dev().upload(&[1.0f32], &[]).unwrap());
    let want: Vec<f32> = tz
        .download::<f32>()
        .unwrap()
        .iter()
        .map(|v| v * v)
        .collect();
    assert_eq!(bits(&got.download::<f32>().unwrap()), bits(&want));
    // A rank mismatch is an error.
    let e = fused_err("Tile[4x1](i0);Neg(t0)", &[&y]);
    assert!(e.contains("vector of length 3"), "{e}");
}

#[test]
fn programs_with_more_inputs_than_webgpus_minimum_bindings() {
    // Twelve inputs (13 storage bindings): a sum with broadcasts, then a ReluGrad.
    let max = tfwgpu_runtime::kernels::fused::max_inputs(dev().limits());
    if max < 12 {
        eprintln!(
            "SKIPPED: the adapter binds {} tensors per fused kernel",
            max + 1
        );
        return;
    }
    let mut program = vec!["AddV2(i0,i1)".to_string()];
    for k in 2..11 {
        program.push(format!("AddV2(t{},i{k})", k - 2));
    }
    program.push("ReluGrad(t9,i11)".to_string());
    let program = program.join(";");
    let full: &[usize] = &[3, 4, 33];
    let mut shapes: Vec<&[usize]> = vec![full; 12];
    shapes[3] = &[33];
    shapes[7] = &[4, 1];
    let ranges = vec![(-1.0f32, 1.0f32); 12];
    // Twice: the second dispatch finds its bind group in the cache.
    check_f32(&program, &shapes, &ranges, 0.0, 30);
    check_f32(&program, &shapes, &ranges, 0.0, 30);
}

#[test]
fn transcendental_chains_are_bit_identical_to_the_unfused_kernels() {
    // Each function as the elementwise family computes it (a few ULP against the CPU).
    let cases: &[(&str, &[(f32, f32)])] = &[
        ("Exp(i0);Log(t0);Tanh(t1)", &[(-3.0, 3.0)]),
        ("Sigmoid(i0);Mul(t0,i1)", &[(-8.0, 8.0), (-1.0, 1.0)]),
        ("Softplus(i0);Rsqrt(t0);Reciprocal(t1)", &[(-5.0, 5.0)]),
        (
            "Log1p(i0);Expm1(t0);SquaredDifference(t1,i1)",
            &[(0.0, 2.0), (-1.0, -0.1)],
        ),
    ];
    for (k, (program, ranges)) in cases.iter().enumerate() {
        let shapes: Vec<&[usize]> = vec![&[257]; ranges.len()];
        check_f32(program, &shapes, ranges, 1e-5, 10 + k as u64);
    }
}

#[test]
fn nan_propagates_as_in_tensorflow() {
    let nan = f32::NAN;
    let x = [nan, 1.0, -2.0, 0.5, -0.0, nan, 3.0];
    let y = [0.0, nan, 5.0, -1.0, 0.0, nan, -3.0];
    let (a, b) = (
        dev().upload(&x, &[7]).unwrap(),
        dev().upload(&y, &[7]).unwrap(),
    );
    for program in [
        "Maximum(i0,i1);Relu(t0)",
        "Minimum(i0,i1);Neg(t0)",
        "Relu(i0);Maximum(t0,i1)",
    ] {
        let fused = run_fused(program, &[&a, &b], DType::F32)
            .download::<f32>()
            .unwrap();
        let unfused = run_unfused(program, &[&a, &b], DType::F32)
            .download::<f32>()
            .unwrap();
        assert_eq!(bits(&fused), bits(&unfused), "{program}");
        let want = cpu_program(program, &[(&x, &[7]), (&y, &[7])], &[7]);
        assert_close(&fused, &want, 0.0, 0.0, program);
    }
}

#[test]
fn f16_rounds_after_every_op_like_the_unfused_kernels() {
    let mut r = rng(7);
    let n = 131;
    let (x, y) = (
        rand_f32(&mut r, n, -4.0, 4.0),
        rand_f32(&mut r, 9, 0.1, 2.0),
    );
    let h = |v: &[f32]| v.iter().map(|&f| f16::from_f32(f)).collect::<Vec<_>>();
    let a = dev().upload(&h(&x), &[n]).unwrap();
    let b = dev().upload(&h(&y[..1]), &[]).unwrap();
    for program in [
        "Mul(i0,i1);Exp(t0);AddV2(t1,i1);Sqrt(t2)",
        "SquaredDifference(i0,i1);RealDiv(t0,i1);Sigmoid(t1)",
        // Scalar instructions computed once per workgroup, rounded to half as well.
        "Sqrt(i1);Exp(t0);Mul(i0,t1);Sigmoid(t2)",
    ] {
        let fused = run_fused(program, &[&a, &b], DType::F16);
        let unfused = run_unfused(program, &[&a, &b], DType::F16);
        let (g, w) = (
            fused.download::<f16>().unwrap(),
            unfused.download::<f16>().unwrap(),
        );
        let gb: Vec<u16> = g.iter().map(|v| v.to_bits()).collect();
        let wb: Vec<u16> = w.iter().map(|v| v.to_bits()).collect();
        assert_eq!(gb, wb, "{program}");
    }
}

#[test]
fn empty_and_one_element_tensors() {
    let a = dev().upload::<f32>(&[], &[0, 3]).unwrap();
    let b = dev().upload(&[2.0f32], &[]).unwrap();
    let out = run_fused("Mul(i0,i1);Relu(t0)", &[&a, &b], DType::F32);
    assert_eq!(out.shape(), &[0, 3]);
    let c = dev().upload(&[-3.0f32], &[1, 1]).unwrap();
    let out = run_fused("Mul(i0,i1);Neg(t0)", &[&c, &b], DType::F32);
    assert_eq!(out.shape(), &[1, 1]);
    assert_eq!(out.download::<f32>().unwrap(), vec![6.0]);
}

#[test]
fn bad_inputs_are_errors() {
    let a = dev().upload(&[1.0f32; 6], &[2, 3]).unwrap();
    let b = dev().upload(&[1.0f32; 4], &[4]).unwrap();
    let e = fused_err("AddV2(i0,i1);Relu(t0)", &[&a, &b]);
    assert!(
        e.contains("AddV2: incompatible shapes [2,3] and [4]"),
        "{e}"
    );
    let i = HostTensor::new(&[1i32, 2], &[2]).unwrap();
    let ti = dev().upload_host(&i).unwrap();
    let e = fused_err("AddV2(i0,i1);Relu(t0)", &[&a, &ti]);
    assert!(e.contains("input 1 is int32"), "{e}");
    // int32 programs have no kernel; a wrong N is an error.
    assert!(
        dev()
            .run(
                OP,
                &fused_attrs("Neg(i0);Abs(t0)", 1, DType::I32),
                &[Arg::from(&ti)]
            )
            .is_err()
    );
    assert!(
        dev()
            .run(
                OP,
                &fused_attrs("Neg(i0);Abs(t0)", 2, DType::F32),
                &[Arg::from(&a)]
            )
            .is_err()
    );
}

/// Checks a multi-output program: each output has the shape of its instruction's result and
/// the bits the unfused kernels give.
fn check_multi(program: &str, exports: &[usize], shapes: &[&[usize]], dtype: DType, seed: u64) {
    let mut r = rng(seed);
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| rand_f32(&mut r, s.iter().product(), 0.1, 2.0))
        .collect();
    let tensors: Vec<Tensor> = shapes
        .iter()
        .zip(&data)
        .map(|(s, d)| match dtype {
            DType::F16 => {
                let h: Vec<f16> = d.iter().map(|&x| f16::from_f32(x)).collect();
                dev().upload(&h, s).unwrap()
            }
            _ => dev().upload(d, s).unwrap(),
        })
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let got = run_multi(program, exports, &refs, dtype);
    let temps = run_unfused_all(program, &refs, exports, dtype);
    let p = Program::parse_multi(program, refs.len(), exports).unwrap();
    let outs = p.output_instrs();
    assert_eq!(got.len(), outs.len(), "{program}: outputs");
    for (k, (g, &o)) in got.iter().zip(&outs).enumerate() {
        let w = &temps[o];
        let what = format!("{program} exports {exports:?} {shapes:?} {dtype}: output {k}");
        assert_eq!(g.shape(), w.shape(), "{what}: shape");
        match dtype {
            DType::F16 => {
                let (a, b) = (g.download::<f16>().unwrap(), w.download::<f16>().unwrap());
                let a: Vec<u16> = a.iter().map(|x| x.to_bits()).collect();
                let b: Vec<u16> = b.iter().map(|x| x.to_bits()).collect();
                assert_eq!(a, b, "{what}");
            }
            _ => {
                let (a, b) = (g.download::<f32>().unwrap(), w.download::<f32>().unwrap());
                assert_eq!(bits(&a), bits(&b), "{what}");
                // Against the CPU: the program that computes only this output (the ops of
                // these tests: products, sums, exp and rsqrt within a few ulp).
                let (sub, map) = p.restrict(&[o]);
                let ins: Vec<(&[f32], &[usize])> = map
                    .iter()
                    .map(|&i| (data[i].as_slice(), shapes[i]))
                    .collect();
                let want = cpu_program(&sub.text(), &ins, g.shape());
                assert_close(&a, &want, 8.0 * f32::EPSILON, 0.0, &what);
            }
        }
    }
}

/// Keras SGD with momentum after the AssignAdd rewrite: m' = m * momentum - g * lr, assigned
/// to m and added to the variable: both values leave the group.
const SGD: &str = "Mul(i0,i1);Mul(i2,i3);Sub(t0,t1);AddV2(i4,t2)";

#[test]
fn multi_output_sgd_update_at_awkward_sizes() {
    for (k, n) in [1usize, 7, 129, 1000, 4099].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            check_multi(
                SGD,
                &[2],
                &[&[n], &[], &[n], &[], &[n]],
                dtype,
                70 + k as u64,
            );
        }
    }
}

#[test]
fn multi_output_values_of_other_shapes_take_their_own_dispatch() {
    // Batch norm's scale: r = rsqrt(var + eps) and scale = r * gamma ([1,1,1,C]) leave the
    // group, the output is x * scale + shift ([N,H,W,C]).
    let p = "AddV2(i0,i1);Rsqrt(t0);Mul(t1,i2);Mul(i3,t2);AddV2(t3,i4)";
    for dtype in [DType::F32, DType::F16] {
        for c in [1usize, 3, 8, 67] {
            let v: &[usize] = &[1, 1, 1, c];
            let x: &[usize] = &[2, 3, 5, c];
            check_multi(p, &[1, 2], &[v, &[], v, x, v], dtype, 90 + c as u64);
            // The output order is the exports' order, not the instructions'.
            check_multi(p, &[2, 0, 1], &[v, &[], v, x, v], dtype, 91 + c as u64);
        }
    }
    // Values of three shapes: a scalar, a vector and the broadcast output.
    let p = "Mul(i0,i1);Exp(t0);AddV2(t1,i2);Mul(t2,i3)";
    check_multi(p, &[1, 2], &[&[], &[], &[9], &[4, 9]], DType::F32, 95);
    // The exported value is needed after the output's dispatch: in order regardless.
    check_multi(p, &[0], &[&[], &[], &[9], &[4, 9]], DType::F32, 96);
}

#[test]
fn multi_output_with_an_empty_output() {
    // The main output is empty, the exported vector is not.
    let p = "Mul(i0,i1);AddV2(t0,i2)";
    let mut r = rng(97);
    let a = dev().upload(&rand_f32(&mut r, 5, -1.0, 1.0), &[5]).unwrap();
    let b = dev().upload(&rand_f32(&mut r, 5, -1.0, 1.0), &[5]).unwrap();
    let e = dev().upload::<f32>(&[], &[0, 5]).unwrap();
    let out = run_multi(p, &[0], &[&a, &b, &e], DType::F32);
    assert_eq!(out[0].shape(), &[0, 5]);
    assert_eq!(out[1].shape(), &[5]);
    let (av, bv) = (a.download::<f32>().unwrap(), b.download::<f32>().unwrap());
    let want: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x * y).collect();
    assert_eq!(bits(&out[1].download::<f32>().unwrap()), bits(&want));
}

#[test]
fn multi_output_programs_are_validated() {
    let p = "Mul(i0,i1);Sqrt(t0);AddV2(t1,i0)";
    assert!(Program::parse_multi(p, 2, &[1]).is_ok());
    for bad in [&[2usize][..], &[3], &[1, 1]] {
        assert!(Program::parse_multi(p, 2, bad).is_err(), "{bad:?}");
    }
    // An unused result is fine once it is an output.
    assert!(Program::parse("Mul(i0,i1);Sqrt(i0)", 2).is_err());
    assert!(Program::parse_multi("Mul(i0,i1);Sqrt(i0)", 2, &[0]).is_ok());
    // M must match the exports.
    let mut r = rng(98);
    let a = dev().upload(&rand_f32(&mut r, 3, 0.0, 1.0), &[3]).unwrap();
    let attrs = fused_attrs(p, 2, DType::F32)
        .with("M", AttrValue::Int(3))
        .with("exports", AttrValue::Ints(vec![1]));
    let e = match dev().run(
        tfwgpu_runtime::kernels::fused::OP_MULTI,
        &attrs,
        &[Arg::from(&a), Arg::from(&a)],
    ) {
        Ok(_) => panic!("M = 3 with one export accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("M = 3"), "{e}");
}

#[test]
fn rsqrt_grad_as_the_unfused_kernel() {
    // Batch norm's gradient of the variance: dvar = RsqrtGrad(r, dr) with r = rsqrt(var +
    // eps) and dr = dgamma_part * gamma; dy = 0 gives 0 (also where y is inf or NaN).
    for (k, c) in [1usize, 7, 64, 129].into_iter().enumerate() {
        let v: &[usize] = &[1, 1, 1, c];
        // rsqrt within 3 ulp enters y^3 three times, then four roundings (the sum, the
        // products): 16 ulp against the CPU (bit for bit against the unfused kernels).
        check_f32(
            "AddV2(i0,i1);Rsqrt(t0);Mul(i2,i3);RsqrtGrad(t1,t2)",
            &[v, &[], v, v],
            &[(0.1, 2.0), (0.001, 0.0011), (-1.0, 1.0), (0.5, 1.5)],
            16.0 * f32::EPSILON,
            120 + k as u64,
        );
    }
    let a = dev()
        .upload(&[4.0f32, f32::INFINITY, f32::NAN, 2.0], &[4])
        .unwrap();
    let b = dev().upload(&[0.0f32, 0.0, 0.0, -0.0], &[4]).unwrap();
    let got = run_fused("RsqrtGrad(i0,i1);Neg(t0)", &[&a, &b], DType::F32);
    let want = run_unfused("RsqrtGrad(i0,i1);Neg(t0)", &[&a, &b], DType::F32);
    assert_eq!(
        bits(&got.download::<f32>().unwrap()),
        bits(&want.download::<f32>().unwrap())
    );
    assert_eq!(got.download::<f32>().unwrap(), [-0.0f32; 4]);
    // Shapes must be equal (TensorFlow's rule), as for ReluGrad.
    let c = dev().upload(&[1.0f32; 4], &[1, 4]).unwrap();
    let args = [Arg::from(&a), Arg::from(&c)];
    let e = match dev().run(OP, &fused_attrs("RsqrtGrad(i0,i1)", 2, DType::F32), &args) {
        Ok(_) => panic!("RsqrtGrad of [4] and [1,4] accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("RsqrtGrad") && e.contains("same shape"), "{e}");
}

#[test]
fn sigmoid_and_tanh_grads_as_the_unfused_kernels() {
    // A recurrent cell's gradient: the activations recomputed in the program, their gradients
    // and a product, as a loop body fuses them. Bit for bit against the unfused kernels; the
    // CPU reference computes the activations in f64 (a few ulp apart), then the same f32 steps.
    // Inputs keep y away from saturation, where 1 - y and 1 - y * y cancel and magnify the
    // activations' last-bit differences (at most ~7x here).
    for (k, shape) in [[7usize, 129], [1, 1], [3, 64]].into_iter().enumerate() {
        let s: &[usize] = &shape;
        check_f32(
            "Sigmoid(i0);SigmoidGrad(t0,i1);Tanh(i2);TanhGrad(t2,t1);Mul(t3,i1)",
            &[s, s, s],
            &[(-2.0, 2.0), (-2.0, 2.0), (-1.0, 1.0)],
            64.0 * f32::EPSILON,
            140 + k as u64,
        );
    }
    let a = dev().upload(&[0.5f32; 4], &[4]).unwrap();
    let c = dev().upload(&[1.0f32; 4], &[1, 4]).unwrap();
    for op in ["SigmoidGrad", "TanhGrad"] {
        let args = [Arg::from(&a), Arg::from(&c)];
        let program = format!("{op}(i0,i1)");
        let e = match dev().run(OP, &fused_attrs(&program, 2, DType::F32), &args) {
            Ok(_) => panic!("{op} of [4] and [1,4] accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(op) && e.contains("same shape"), "{e}");
    }
}

#[test]
fn multi_output_dispatches_once_per_output_shape() {
    // Its own device: the dispatch counter is not shared with the other tests.
    let rt = tfwgpu_runtime::Runtime::new().unwrap();
    let d = rt.device();
    let mut r = rng(130);
    let up = |r: &mut _, s: &[usize]| {
        d.upload(&rand_f32(r, s.iter().product(), 0.1, 2.0), s)
            .unwrap()
    };
    let dispatches = |program: &str, exports: &[usize], ins: &[&Tensor]| {
        let args: Vec<Arg> = ins.iter().map(|t| Arg::from(*t)).collect();
        let attrs = fused_attrs(program, ins.len(), DType::F32)
            .with("M", AttrValue::Int(exports.len() as i64 + 1))
            .with(
                "exports",
                AttrValue::Ints(exports.iter().map(|&e| e as i64).collect()),
            );
        let before = d.exec_stats().dispatches;
        let out = d
            .run(tfwgpu_runtime::kernels::fused::OP_MULTI, &attrs, &args)
            .unwrap();
        d.synchronize().unwrap();
        assert_eq!(out.len(), exports.len() + 1);
        d.exec_stats().dispatches - before
    };
    let (v, s) = (up(&mut r, &[1000]), up(&mut r, &[]));
    // SGD: both outputs [1000]: one dispatch.
    assert_eq!(dispatches(SGD, &[2], &[&s, &v, &s, &v, &v]), 1);
    // Batch norm: r and scale [1,1,1,8], the output [2,3,5,8]: two.
    let (c, x, e) = (
        up(&mut r, &[1, 1, 1, 8]),
        up(&mut r, &[2, 3, 5, 8]),
        up(&mut r, &[]),
    );
    let p = "AddV2(i0,i1);Rsqrt(t0);Mul(t1,i2);Mul(i3,t2);AddV2(t3,i4)";
    assert_eq!(dispatches(p, &[1, 2], &[&c, &e, &c, &x, &c]), 2);
}

/// An operand given twice to one instruction keeps IEEE semantics: `Sub(i0,i0)` of inf and NaN
/// is NaN, of finite values 0; `Mul(t0,t0)` of -0 is +0 (shader compilers fold `x - x` to 0
/// when they may assume no inf or NaN: lavapipe did, before the second operand was made
/// opaque to it). float32 and float16.
#[test]
fn repeated_operands_keep_inf_and_nan() {
    let x = [
        1.5f32,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -0.0,
        3.0e38,
    ];
    for dtype in [DType::F32, DType::F16] {
        let t = if dtype == DType::F16 {
            let h: Vec<_> = x
                .iter()
                .map(|&v| tfwgpu_runtime::f16::from_f32(v))
                .collect();
            dev().upload(&h, &[x.len()]).unwrap()
        } else {
            dev().upload(&x, &[x.len()]).unwrap()
        };
        let got = |program: &str| -> Vec<f32> {
            let out = run_fused(program, &[&t], dtype);
            if dtype == DType::F16 {
                out.download::<tfwgpu_runtime::f16>()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_f32())
                    .collect()
            } else {
                out.download::<f32>().unwrap()
            }
        };
        let d = got("Sub(i0,i0)");
        for (i, (&v, &g)) in x.iter().zip(&d).enumerate() {
            let v = if dtype == DType::F16 {
                tfwgpu_runtime::f16::from_f32(v).to_f32()
            } else {
                v
            };
            if v.is_finite() {
                assert_eq!(g, 0.0, "{dtype} Sub({v}, {v}) [{i}]");
            } else {
                assert!(g.is_nan(), "{dtype} Sub({v}, {v}) [{i}] = {g}, want NaN");
            }
        }
        let q = got("Neg(i0);Mul(t0,t0);Sub(t1,t1)");
        assert!(q[1].is_nan() && q[3].is_nan(), "{dtype}: {q:?}");
        assert_eq!(q[0], 0.0, "{dtype}: {q:?}");
    }
}
