//! The fused elementwise kernel's comparisons, SelectV2 and DivNoNan: a comparison's bool
//! held in the program as SelectV2's condition (Keras's dropout: `GreaterEqual(random, rate)`
//! selects `x * scale` or 0, and the gradient selects with the same mask), and DivNoNan (the
//! loss and metric scalars). Each program against the same ops run one kernel at a time
//! (bit for bit: comparisons and selects are exact, DivNoNan is one rounding, the same
//! division as the unfused kernel) and against a CPU reference with TensorFlow's semantics.

mod common;
mod fused_cases;

use common::*;
use fused_cases::*;
use tfwgpu_runtime::kernels::fused::{OP_MULTI, Program};
use tfwgpu_runtime::{Arg, AttrValue, DType, Tensor, f16};

/// TensorFlow's value of one instruction on the CPU (`c` a comparison's bool as 1.0/0.0).
fn cpu(op: &str, a: &[f32]) -> f32 {
    let b = |v: bool| if v { 1.0 } else { 0.0 };
    match op {
        "Equal" => b(a[0] == a[1]),
        "NotEqual" => b(a[0] != a[1]),
        "Less" => b(a[0] < a[1]),
        "LessEqual" => b(a[0] <= a[1]),
        "Greater" => b(a[0] > a[1]),
        "GreaterEqual" => b(a[0] >= a[1]),
        "SelectV2" => {
            if a[0] != 0.0 {
                a[1]
            } else {
                a[2]
            }
        }
        "DivNoNan" => {
            if a[1] == 0.0 {
                0.0
            } else {
                a[0] / a[1]
            }
        }
        "Mul" => a[0] * a[1],
        "AddV2" => a[0] + a[1],
        "Sub" => a[0] - a[1],
        "Neg" => -a[0],
        "Relu" => {
            if a[0].is_nan() {
                a[0]
            } else {
                a[0].max(0.0)
            }
        }
        _ => panic!("no CPU reference for {op}"),
    }
}

/// The program on the CPU per output element, through `cpu`.
fn cpu_program(program: &str, inputs: &[(&[f32], &[usize])], out_shape: &[usize]) -> Vec<f32> {
    fused_cases::cpu_program(program, inputs, out_shape, |ins, a| cpu(ins.name, a))
}

/// Checks an f32 program on `data` of `shapes`: the unfused kernels' bits, and TensorFlow's
/// values on the CPU exactly (these ops are exact or one rounding).
fn check(program: &str, data: &[Vec<f32>], shapes: &[&[usize]]) {
    let tensors = upload_all(data, shapes);
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let got_t = run_fused(program, &refs, DType::F32);
    let unfused = run_unfused_all(program, &refs, &[], DType::F32)
        .pop()
        .unwrap();
    assert_eq!(
        got_t.shape(),
        unfused.shape(),
        "{program} {shapes:?}: shape"
    );
    let got = got_t.download::<f32>().unwrap();
    let want_dev = unfused.download::<f32>().unwrap();
    assert_eq!(
        bits(&got),
        bits(&want_dev),
        "{program} {shapes:?}: fused vs unfused"
    );
    let ins: Vec<(&[f32], &[usize])> = data
        .iter()
        .zip(shapes)
        .map(|(d, s)| (d.as_slice(), *s))
        .collect();
    let want = cpu_program(program, &ins, got_t.shape());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{program} {shapes:?}[{i}]: got {g}, want {w}"
        );
    }
}

/// Keras's dropout, forward: select(random >= rate, x * scale, 0).
const DROPOUT: &str = "GreaterEqual(i0,i1);Mul(i2,i3);SelectV2(t0,t1,i4)";
/// Its gradient: select(random >= rate, dy, 0) * scale.
const DROPOUT_GRAD: &str = "GreaterEqual(i0,i1);SelectV2(t0,i2,i3);Mul(t1,i4)";

#[test]
fn dropout_forward_and_gradient_at_awkward_sizes() {
    let mut r = rng(1);
    for (k, shape) in [
        vec![1usize],
        vec![7],
        vec![3, 129],
        vec![64, 13, 13, 1],
        vec![1000],
    ]
    .into_iter()
    .enumerate()
    {
        let n: usize = shape.iter().product();
        let random = rand_f32(&mut r, n, 0.0, 1.0);
        let x = rand_f32(&mut r, n, -3.0, 3.0);
        let rate = vec![0.25f32 + 0.1 * k as f32];
        let scale = vec![1.0 / (1.0 - rate[0])];
        let zero = vec![0.0f32];
        let s: &[usize] = &shape;
        check(
            DROPOUT,
            &[
                random.clone(),
                rate.clone(),
                x.clone(),
                scale.clone(),
                zero.clone(),
            ],
            &[s, &[], s, &[], &[]],
        );
        check(
            DROPOUT_GRAD,
            &[random, rate, x, zero, scale],
            &[s, &[], s, &[], &[]],
        );
    }
}

#[test]
fn every_comparison_with_nan_signed_zeros_and_infinities() {
    let special = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        f32::MAX,
    ];
    // Every pair of the special values (9 x 9 = 81 elements: not a multiple of 4 or 64).
    let (mut a, mut b) = (vec![], vec![]);
    for &x in &special {
        for &y in &special {
            a.push(x);
            b.push(y);
        }
    }
    let then: Vec<f32> = (0..a.len()).map(|i| i as f32 + 0.5).collect();
    let els: Vec<f32> = (0..a.len()).map(|i| -(i as f32) - 0.25).collect();
    for cmp in [
        "Equal",
        "NotEqual",
        "Less",
        "LessEqual",
        "Greater",
        "GreaterEqual",
    ] {
        let program = format!("{cmp}(i0,i1);SelectV2(t0,i2,i3)");
        check(
            &program,
            &[a.clone(), b.clone(), then.clone(), els.clone()],
            &[&[81], &[81], &[81], &[81]],
        );
    }
}

#[test]
fn selected_values_keep_their_bits() {
    // NaN payloads, -0 and infinities pass through a select unchanged.
    let vals = [
        f32::from_bits(0x7fc0_1234),
        -0.0,
        f32::INFINITY,
        f32::from_bits(1),
        3.5,
    ];
    let cond_a = [1.0f32, 1.0, 1.0, 1.0, 0.0];
    let cond_b = [0.0f32, 0.0, 0.0, 0.0, 1.0];
    let other = [7.0f32; 5];
    let data = [
        cond_a.to_vec(),
        cond_b.to_vec(),
        vals.to_vec(),
        other.to_vec(),
    ];
    let t: Vec<Tensor> = data
        .iter()
        .map(|d| dev().upload(d, &[5]).unwrap())
        .collect();
    let out = run_fused(
        "Greater(i0,i1);SelectV2(t0,i2,i3)",
        &[&t[0], &t[1], &t[2], &t[3]],
        DType::F32,
    )
    .download::<f32>()
    .unwrap();
    assert_eq!(bits(&out[..4]), bits(&vals[..4]));
    assert_eq!(out[4], 7.0);
}

#[test]
fn select_broadcasts_all_three_operands() {
    let mut r = rng(2);
    // condition [3, 1] from a comparison of [3, 1] and a scalar; then [1, 5]; else [5].
    let a = rand_f32(&mut r, 3, -1.0, 1.0);
    let t = rand_f32(&mut r, 5, -1.0, 1.0);
    let e = rand_f32(&mut r, 5, -1.0, 1.0);
    check(
        "Less(i0,i1);SelectV2(t0,i2,i3);Relu(t1)",
        &[a, vec![0.0], t, e],
        &[&[3, 1], &[], &[1, 5], &[5]],
    );
    // The comparison broadcasts too: [2, 1, 4] against [3, 1].
    let x = rand_f32(&mut r, 8, -1.0, 1.0);
    let y = rand_f32(&mut r, 3, -1.0, 1.0);
    let v = rand_f32(&mut r, 1, -1.0, 1.0);
    check(
        "GreaterEqual(i0,i1);SelectV2(t0,i2,i3)",
        &[x.clone(), y.clone(), v, x],
        &[&[2, 1, 4], &[3, 1], &[], &[2, 1, 4]],
    );
}

#[test]
fn div_no_nan_and_the_loss_scalars() {
    // y of 0, -0, NaN, tiny and huge; x of 0, NaN and infinities.
    let x = vec![
        1.0f32,
        -2.0,
        0.0,
        f32::NAN,
        f32::INFINITY,
        3.0,
        5.0,
        1.0,
        f32::NAN,
    ];
    let y = vec![0.0f32, -0.0, 0.0, 0.0, 2.0, f32::NAN, 1e-40, 1e38, 3.0];
    check(
        "DivNoNan(i0,i1);Neg(t0)",
        &[x.clone(), y.clone()],
        &[&[9], &[9]],
    );
    let mut r = rng(3);
    let xs = rand_f32(&mut r, 129, -4.0, 4.0);
    let mut ys = rand_f32(&mut r, 129, -2.0, 2.0);
    for k in (0..129).step_by(5) {
        ys[k] = 0.0;
    }
    check("DivNoNan(i0,i1);Relu(t0)", &[xs, ys], &[&[129], &[129]]);
    // Keras's loss tracker: total += loss * count; count += n; mean = total / count, on
    // scalars (the metric's DivNoNan over a zero count is 0).
    for (sum, n, total, count, k) in [
        (12.5f32, 64.0f32, 100.0f32, 640.0f32, 64.0f32),
        (0.0, 0.0, 0.0, 0.0, 0.0),
    ] {
        check(
            "DivNoNan(i0,i1);Mul(i2,t0);AddV2(i3,t1);AddV2(i4,i5);DivNoNan(t2,t3)",
            &[
                vec![sum],
                vec![n],
                vec![k],
                vec![total],
                vec![count],
                vec![k],
            ],
            &[&[], &[], &[], &[], &[], &[]],
        );
    }
}

#[test]
fn multi_output_with_a_select() {
    // The dropout's forward output and x * scale both leave the group.
    let mut r = rng(4);
    let n = 77;
    let data = [
        rand_f32(&mut r, n, 0.0, 1.0),
        vec![0.5f32],
        rand_f32(&mut r, n, -1.0, 1.0),
        vec![2.0f32],
        vec![0.0f32],
    ];
    let shapes: [&[usize]; 5] = [&[n], &[], &[n], &[], &[]];
    let t = upload_all(&data, &shapes);
    let refs: Vec<&Tensor> = t.iter().collect();
    let a = fused_attrs(DROPOUT, 5, DType::F32)
        .with("M", AttrValue::Int(2))
        .with("exports", AttrValue::Ints(vec![1]));
    let args: Vec<Arg> = refs.iter().map(|x| Arg::from(*x)).collect();
    let got = dev().run(OP_MULTI, &a, &args).unwrap();
    let temps = run_unfused_all(DROPOUT, &refs, &[1], DType::F32);
    assert_eq!(
        bits(&got[0].download::<f32>().unwrap()),
        bits(&temps[2].download::<f32>().unwrap())
    );
    assert_eq!(
        bits(&got[1].download::<f32>().unwrap()),
        bits(&temps[1].download::<f32>().unwrap())
    );
}

#[test]
fn f16_dropout_as_the_unfused_kernels() {
    let mut r = rng(5);
    let n = 131;
    let h = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let data = [
        h(rand_f32(&mut r, n, 0.0, 1.0)),
        h(vec![0.3]),
        h(rand_f32(&mut r, n, -2.0, 2.0)),
        h(vec![1.0 / 0.7]),
        h(vec![0.0]),
    ];
    let shapes: [&[usize]; 5] = [&[n], &[], &[n], &[], &[]];
    let t = upload_all(&data, &shapes);
    let refs: Vec<&Tensor> = t.iter().collect();
    let got = run_fused(DROPOUT, &refs, DType::F16)
        .download::<f16>()
        .unwrap();
    let want = run_unfused_all(DROPOUT, &refs, &[], DType::F16)
        .pop()
        .unwrap()
        .download::<f16>()
        .unwrap();
    let b = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    assert_eq!(b(&got), b(&want));
    // And TensorFlow's value: the product rounded to f16, or 0.
    for i in 0..n {
        let w = if data[0][i] >= data[1][0] {
            f16::from_f32(data[2][i].to_f32() * data[3][0].to_f32())
        } else {
            f16::from_f32(0.0)
        };
        assert_eq!(got[i].to_bits(), w.to_bits(), "[{i}]");
    }
}

#[test]
fn a_comparisons_bool_is_only_a_selects_condition() {
    for (bad, n, exports) in [
        ("Greater(i0,i1)", 2, vec![]),                          // the output
        ("Greater(i0,i1);Mul(t0,i0)", 2, vec![]),               // an operand of another op
        ("Less(i0,i1);SelectV2(i2,t0,i1)", 3, vec![]),          // a select's value
        ("SelectV2(i0,i1,i2)", 3, vec![]),                      // a condition from an input
        ("Less(i0,i1);SelectV2(t0,i0,i1);Neg(t1)", 2, vec![0]), // exported
        ("Less(i0,i1);Neg(i0);SelectV2(t1,i0,i1)", 2, vec![]),  // a condition not compared
    ] {
        let e = Program::parse_multi(bad, n, &exports);
        assert!(e.is_err(), "{bad} exports {exports:?} was accepted");
    }
    // Through the kernel: the error names the instruction.
    let a = dev().upload(&[1.0f32, 2.0], &[2]).unwrap();
    let e = fused_err("Greater(i0,i1)", &[&a, &a]);
    assert!(e.contains("comparison"), "{e}");
    // Shapes that do not broadcast are an error naming SelectV2.
    let b = dev().upload(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let e = fused_err("Less(i0,i1);SelectV2(t0,i0,i2)", &[&a, &a, &b]);
    assert!(e.contains("SelectV2"), "{e}");
}

#[test]
fn one_kernel_on_shapes_that_change_from_call_to_call() {
    // The kernel keeps each dispatch's shape-dependent plan: calls on other shapes (and back)
    // must each get their own broadcast, params and grid.
    let k =
        tfwgpu_runtime::kernels::fused::Fused::build(&fused_attrs(DROPOUT, 5, DType::F32)).unwrap();
    let mut r = rng(9);
    for shape in [
        vec![7usize],
        vec![3, 129],
        vec![7],
        vec![1],
        vec![2, 1, 65],
        vec![3, 129],
    ] {
        let n: usize = shape.iter().product();
        let data = [
            rand_f32(&mut r, n, 0.0, 1.0),
            vec![0.5f32],
            rand_f32(&mut r, n, -1.0, 1.0),
            vec![2.0f32],
            vec![0.0f32],
        ];
        let shapes: [&[usize]; 5] = [&shape, &[], &shape, &[], &[]];
        let t = upload_all(&data, &shapes);
        let args: Vec<Arg> = t.iter().map(Arg::from).collect();
        let got = dev().run_kernel(k.as_ref(), &args).unwrap().remove(0);
        assert_eq!(got.shape(), shape.as_slice());
        let ins: Vec<(&[f32], &[usize])> = data
            .iter()
            .zip(shapes)
            .map(|(d, s)| (d.as_slice(), s))
            .collect();
        let want = cpu_program(DROPOUT, &ins, &shape);
        assert_eq!(
            bits(&got.download::<f32>().unwrap()),
            bits(&want),
            "{shape:?}"
        );
    }
}
