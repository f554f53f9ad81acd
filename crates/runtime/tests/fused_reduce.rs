//! `_TfwgpuFusedReduce`: a reduction whose input an elementwise program computes as it is
//! loaded. Against the unfused kernels (the fused elementwise kernel, then the plain
//! reduction): bit for bit, as the kernel promises (same values, folded in the same order),
//! over the reduce family's layouts (rows, columns, vec4 loads, split passes, several passes,
//! empty reductions, nothing reduced). Against a CPU reference: the program in float32 (its
//! ops here are exactly rounded: +, -, *, max, ReluGrad) and the reduction in f64, with the
//! reduce tests' tolerance (pairwise sums: error ~ log2(n) eps sum|v|).

mod common;

use common::*;
use tfwgpu_runtime::kernels::fused::{OP, OP_REDUCE, OP_REDUCE_MULTI};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, HostTensor, Tensor};

const EPS: f64 = f32::EPSILON as f64 / 2.0;

fn reduce_attrs(program: &str, n: usize, reduce: &str, keep_dims: bool) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("N", AttrValue::Int(n as i64))
        .with("program", AttrValue::Str(program.into()))
        .with("reduce", AttrValue::Str(reduce.into()))
        .with("keep_dims", AttrValue::Bool(keep_dims))
        .with("Tidx", AttrValue::Type(DType::I32))
}

fn run_fused_reduce(
    program: &str,
    inputs: &[&Tensor],
    reduce: &str,
    axes: &[i32],
    keep_dims: bool,
) -> tfwgpu_runtime::Result<Tensor> {
    let ax = HostTensor::vec_i32(axes);
    let mut args = vec![Arg::from(&ax)];
    args.extend(inputs.iter().map(|t| Arg::from(*t)));
    let attrs = reduce_attrs(program, inputs.len(), reduce, keep_dims);
    Ok(dev().run(OP_REDUCE, &attrs, &args)?.remove(0))
}

/// The fused elementwise kernel, then the reduction's own kernel.
fn run_unfused(
    program: &str,
    inputs: &[&Tensor],
    reduce: &str,
    axes: &[i32],
    keep_dims: bool,
) -> Tensor {
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("N", AttrValue::Int(inputs.len() as i64))
        .with("program", AttrValue::Str(program.into()));
    let args: Vec<Arg> = inputs.iter().map(|t| Arg::from(*t)).collect();
    let y = dev().run(OP, &attrs, &args).unwrap().remove(0);
    let ax = HostTensor::vec_i32(axes);
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("Tidx", AttrValue::Type(DType::I32))
        .with("keep_dims", AttrValue::Bool(keep_dims));
    dev()
        .run(reduce, &attrs, &[Arg::from(&y), Arg::from(&ax)])
        .unwrap()
        .remove(0)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Uploads random inputs of `shapes` (in [lo, hi)), runs the program fused and unfused, and
/// asserts equal shapes and bits. Returns the inputs' data and the fused result.
#[allow(clippy::type_complexity)]
fn check_bits(
    program: &str,
    shapes: &[&[usize]],
    reduce: &str,
    axes: &[i32],
    keep_dims: bool,
    seed: u64,
) -> (Vec<Vec<f32>>, Tensor) {
    let mut r = rng(seed);
    let (lo, hi) = if reduce == "Prod" {
        (0.9, 1.1)
    } else {
        (-3.0, 3.0)
    };
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| rand_f32(&mut r, s.iter().product(), lo, hi))
        .collect();
    let ts = upload_all(&data, shapes);
    let refs: Vec<&Tensor> = ts.iter().collect();
    let what = format!("{reduce}({program}) of {shapes:?} over {axes:?} keep_dims {keep_dims}");
    let fused = run_fused_reduce(program, &refs, reduce, axes, keep_dims)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let unfused = run_unfused(program, &refs, reduce, axes, keep_dims);
    assert_eq!(fused.shape(), unfused.shape(), "{what}");
    let (a, b) = (
        fused.download::<f32>().unwrap(),
        unfused.download::<f32>().unwrap(),
    );
    assert_eq!(bits(&a), bits(&b), "{what}");
    (data, fused)
}

/// Row-major index of `idx` in `shape` broadcast from the right (size-1 dims read at 0).
fn bcast_index(shape: &[usize], out: &[usize], idx: &[usize]) -> usize {
    let pad = out.len() - shape.len();
    let mut o = 0;
    for (d, &s) in shape.iter().enumerate() {
        o = o * s + if s == 1 { 0 } else { idx[d + pad] };
    }
    o
}

/// The CPU value of the programs used against the reference, per output element.
fn cpu_program(program: &str, data: &[Vec<f32>], shapes: &[&[usize]], out: &[usize]) -> Vec<f32> {
    let n: usize = out.iter().product();
    let mut idx = vec![0usize; out.len()];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let x = |k: usize| data[k][bcast_index(shapes[k], out, &idx)];
        let relu_grad = |g: f32, f: f32| if f > 0.0 { g } else { g * 0.0 };
        v.push(match program {
            "SquaredDifference(i0,i1)" => {
                let d = x(0) - x(1);
                d * d
            }
            "ReluGrad(i0,i1);Mul(t0,i2)" => relu_grad(x(0), x(1)) * x(2),
            "AddV2(i0,i1);ReluGrad(t0,i2);Mul(t1,i3)" => relu_grad(x(0) + x(1), x(2)) * x(3),
            "Sub(i0,i1);Mul(t0,i2);Maximum(t1,i3)" => ((x(0) - x(1)) * x(2)).max(x(3)),
            _ => panic!("no CPU reference for {program}"),
        });
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    v
}

/// Checks the fused result against the CPU reference: the program's values reduced in f64.
#[allow(clippy::too_many_arguments)]
fn check_cpu(
    program: &str,
    data: &[Vec<f32>],
    shapes: &[&[usize]],
    out_shape: &[usize],
    reduce: &str,
    axes: &[i32],
    got: &Tensor,
) {
    let vals = cpu_program(program, data, shapes, out_shape);
    let rank = out_shape.len();
    let reduced: Vec<bool> = (0..rank as i32)
        .map(|d| axes.iter().any(|&a| (a + rank as i32) % rank as i32 == d))
        .collect();
    let kept: Vec<usize> = out_shape
        .iter()
        .zip(&reduced)
        .map(|(&s, &r)| if r { 1 } else { s })
        .collect();
    let m: usize = kept.iter().product();
    let count = vals.len() / m.max(1);
    let init = match reduce {
        "Sum" | "Mean" => 0.0,
        "Max" => f64::NEG_INFINITY,
        "Min" => f64::INFINITY,
        _ => 1.0,
    };
    let (mut acc, mut abs) = (vec![init; m], vec![0.0f64; m]);
    let mut idx = vec![0usize; rank];
    for &v in &vals {
        let mut o = 0;
        for d in 0..rank {
            o = o * kept[d] + if reduced[d] { 0 } else { idx[d] };
        }
        let v = v as f64;
        acc[o] = match reduce {
            "Sum" | "Mean" => acc[o] + v,
            "Max" => acc[o].max(v),
            "Min" => acc[o].min(v),
            _ => acc[o] * v,
        };
        abs[o] += v.abs();
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let got = got.download::<f32>().unwrap();
    assert_eq!(got.len(), m);
    let log_n = (count.max(2) as f64).log2().ceil();
    for (i, (&g, (&w, &s))) in got.iter().zip(acc.iter().zip(&abs)).enumerate() {
        let (w, tol) = match reduce {
            "Sum" => (w, (2.0 * log_n + 32.0) * EPS * s),
            "Mean" => (
                w / count as f64,
                (2.0 * log_n + 34.0) * EPS * s / count as f64,
            ),
            _ => (w, 0.0),
        };
        assert!(
            (g as f64 - w).abs() <= tol,
            "{reduce}({program}) {out_shape:?} over {axes:?} [{i}]: got {g}, want {w} (tol {tol:e})"
        );
    }
}

#[test]
fn batch_norm_variance_matches_the_unfused_kernels_and_the_cpu() {
    // Keras's moments: Mean(SquaredDifference(x, mean)) over N, H, W (keep_dims), the mean
    // read at broadcast offsets; channels a multiple of 4 (vec4 column loads) or not, long
    // enough to split into chunks (and the chunks' partials split again).
    let p = "SquaredDifference(i0,i1)";
    for (k, shape) in [
        [2usize, 5, 7, 12],
        [3, 5, 7, 3],
        [1, 1, 1, 5],
        [4, 33, 31, 8],
        [2, 64, 64, 4],
        [8, 64, 64, 4],
        [1, 7, 9, 129],
    ]
    .iter()
    .enumerate()
    {
        let mean = [1, 1, 1, shape[3]];
        let shapes: [&[usize]; 2] = [shape, &mean];
        let (data, got) = check_bits(p, &shapes, "Mean", &[0, 1, 2], true, k as u64);
        assert_eq!(got.shape(), &mean[..]);
        check_cpu(p, &data, &shapes, shape, "Mean", &[0, 1, 2], &got);
    }
}

#[test]
fn batch_norm_gradient_sums_match_the_unfused_kernels_and_the_cpu() {
    // Sum(ReluGrad(dy, y) * x_hat) over N, H, W without keep_dims; with the residual add.
    for (k, shape) in [[2usize, 9, 9, 16], [3, 7, 5, 6], [4, 40, 40, 8]]
        .iter()
        .enumerate()
    {
        let p = "ReluGrad(i0,i1);Mul(t0,i2)";
        let shapes: [&[usize]; 3] = [shape, shape, shape];
        let (data, got) = check_bits(p, &shapes, "Sum", &[0, 1, 2], false, 10 + k as u64);
        assert_eq!(got.shape(), &shape[3..]);
        check_cpu(p, &data, &shapes, shape, "Sum", &[0, 1, 2], &got);
        let p = "AddV2(i0,i1);ReluGrad(t0,i2);Mul(t1,i3)";
        let shapes: [&[usize]; 4] = [shape, shape, shape, shape];
        let (data, got) = check_bits(p, &shapes, "Sum", &[-4, -3, -2], false, 20 + k as u64);
        check_cpu(p, &data, &shapes, shape, "Sum", &[0, 1, 2], &got);
    }
}

#[test]
fn every_reduction_and_layout_matches_the_unfused_kernels() {
    let p = "Sub(i0,i1);Mul(t0,i2);Maximum(t1,i3)";
    let cases: &[(&[usize], &[i32])] = &[
        // Rows: scalar loads (odd length), vec4 loads, a long row split in chunks.
        (&[33, 129], &[-1]),
        (&[7, 256], &[1]),
        (&[2, 70_000], &[1]),
        (&[1, 70_001], &[1]),
        // vec4 rows whose broadcast's innermost merged dim (6) is no multiple of 4: each
        // element's offsets computed on its own.
        (&[5, 8, 6], &[1, 2]),
        // Columns, first axis.
        (&[129, 6], &[0]),
        (&[300, 64], &[0]),
        // Several passes (non-adjacent reduced axes), every axis, a scalar result.
        (&[4, 3, 5, 6], &[0, 2]),
        (&[2, 3, 4, 5], &[0, 1, 2, 3]),
        (&[7], &[0]),
    ];
    let mut seed = 100;
    for (shape, axes) in cases {
        // Inputs: full, a scalar, a row vector, a column broadcast.
        let last = [shape[shape.len() - 1]];
        let mut col = shape.to_vec();
        *col.last_mut().unwrap() = 1;
        let shapes: [&[usize]; 4] = [shape, &[], &last, &col];
        for reduce in ["Sum", "Mean", "Max", "Min", "Prod"] {
            for keep_dims in [false, true] {
                seed += 1;
                let (data, got) = check_bits(p, &shapes, reduce, axes, keep_dims, seed);
                if reduce != "Prod" {
                    check_cpu(p, &data, &shapes, shape, reduce, axes, &got);
                }
            }
        }
    }
}

#[test]
fn transcendental_programs_match_the_unfused_kernels() {
    for p in [
        "Mul(i0,i1);Exp(t0)",
        "Abs(i0);Pow(t0,i1);Tanh(t0);AddV2(t1,t2)",
        "Mul(i0,i1);Rsqrt(i1);AddV2(t0,t1)",
    ] {
        for (shape, axes) in [([5usize, 6, 8], [0, 1]), ([3, 4, 33], [2, 2])] {
            let shapes: [&[usize]; 2] = [&shape, &[]];
            check_bits(p, &shapes, "Sum", &axes, false, 7);
            check_bits(p, &shapes, "Max", &axes, true, 8);
        }
    }
}

#[test]
fn empty_reductions_and_reductions_of_nothing() {
    let p = "SquaredDifference(i0,i1)";
    // An empty reduced axis: the identity (Mean: NaN); an empty kept axis: an empty output.
    for reduce in ["Sum", "Mean", "Max", "Min", "Prod"] {
        let shapes: [&[usize]; 2] = [&[0, 4], &[4]];
        let (_, got) = check_bits(p, &shapes, reduce, &[0], false, 1);
        assert_eq!(got.shape(), &[4]);
        let shapes: [&[usize]; 2] = [&[3, 0], &[1]];
        let (_, got) = check_bits(p, &shapes, reduce, &[0], true, 2);
        assert_eq!(got.shape(), &[1, 0]);
    }
    let x = dev().upload(&[0.0f32; 0], &[0, 4]).unwrap();
    let m = dev().upload(&[1.0f32; 4], &[4]).unwrap();
    let v = run_fused_reduce(p, &[&x, &m], "Mean", &[0], false)
        .unwrap()
        .download::<f32>()
        .unwrap();
    assert!(v.iter().all(|v| v.is_nan()), "{v:?}");
    // Only size-1 axes reduced (and no axes): the program's result.
    for axes in [&[1][..], &[]] {
        let shapes: [&[usize]; 2] = [&[3, 1, 4], &[4]];
        let (data, got) = check_bits(p, &shapes, "Sum", axes, axes.is_empty(), 3);
        let want: Vec<f32> = (0..12)
            .map(|i| {
                let d = data[0][i] - data[1][i % 4];
                d * d
            })
            .collect();
        assert_eq!(bits(&got.download::<f32>().unwrap()), bits(&want));
    }
}

#[test]
fn nan_propagates_through_the_program_and_the_reduction() {
    let x = dev()
        .upload(&[1.0f32, f32::NAN, 3.0, 4.0, 5.0, 6.0], &[3, 2])
        .unwrap();
    let m = dev().upload(&[0.5f32, 0.5], &[2]).unwrap();
    for reduce in ["Sum", "Max", "Min"] {
        let got = run_fused_reduce("SquaredDifference(i0,i1)", &[&x, &m], reduce, &[0], false)
            .unwrap()
            .download::<f32>()
            .unwrap();
        let want = run_unfused("SquaredDifference(i0,i1)", &[&x, &m], reduce, &[0], false)
            .download::<f32>()
            .unwrap();
        assert!(got[1].is_nan() && !got[0].is_nan(), "{reduce}: {got:?}");
        assert_eq!(bits(&got), bits(&want), "{reduce}");
    }
}

/// The error of a call that must fail.
fn err<T>(r: tfwgpu_runtime::Result<T>) -> Error {
    match r {
        Ok(_) => panic!("an error expected"),
        Err(e) => e,
    }
}

#[test]
fn bad_attributes_and_inputs_are_errors() {
    let x = dev().upload(&[1.0f32; 6], &[2, 3]).unwrap();
    let m = dev().upload(&[1.0f32; 3], &[3]).unwrap();
    let p = "SquaredDifference(i0,i1)";
    let e = err(run_fused_reduce(p, &[&x, &m], "ArgMax", &[0], false));
    assert!(e.to_string().contains("reduce"), "{e}");
    let e = err(run_fused_reduce(p, &[&x, &m], "Sum", &[2], false));
    assert!(e.to_string().contains("Invalid reduction dimension"), "{e}");
    let ax = HostTensor::vec_i32(&[0]);
    let attrs = reduce_attrs(p, 2, "Sum", false);
    let e = err(dev().run(OP_REDUCE, &attrs, &[Arg::from(&ax), Arg::from(&x)]));
    assert!(e.to_string().contains("inputs"), "{e}");
    let bad = dev().upload(&[1.0f32; 4], &[4]).unwrap();
    let e = err(run_fused_reduce(p, &[&x, &bad], "Sum", &[0], false));
    assert!(e.to_string().contains("incompatible shapes"), "{e}");
    // A Tile in the program, a dtype the reduce family has no kernel for.
    let e = err(run_fused_reduce(
        "Tile[2x1](i0);Mul(t0,i1)",
        &[&x, &m],
        "Sum",
        &[0],
        false,
    ));
    assert!(matches!(e, Error::Unimplemented(_)), "{e}");
    let h = dev()
        .upload(&[tfwgpu_runtime::f16::from_f32(1.0); 6], &[2, 3])
        .unwrap();
    let attrs = reduce_attrs("Neg(i0)", 1, "Sum", false).with("T", AttrValue::Type(DType::F16));
    let e = err(dev().run(OP_REDUCE, &attrs, &[Arg::from(&ax), Arg::from(&h)]));
    assert!(matches!(e, Error::Unimplemented(_)), "{e}");
}

/// Runs `_TfwgpuFusedReduceMulti`: the reduction, then the exported values.
fn run_reduce_multi(
    program: &str,
    exports: &[usize],
    inputs: &[&Tensor],
    reduce: &str,
    axes: &[i32],
    keep_dims: bool,
) -> Vec<Tensor> {
    let ax = HostTensor::vec_i32(axes);
    let mut args = vec![Arg::from(&ax)];
    args.extend(inputs.iter().map(|t| Arg::from(*t)));
    let attrs = reduce_attrs(program, inputs.len(), reduce, keep_dims)
        .with("M", AttrValue::Int(exports.len() as i64))
        .with(
            "exports",
            AttrValue::Ints(exports.iter().map(|&e| e as i64).collect()),
        );
    dev()
        .run(OP_REDUCE_MULTI, &attrs, &args)
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// The fused elementwise kernel's values of the program's instructions `exports` (each
/// computed by the program cut after it).
fn run_values(program: &str, exports: &[usize], inputs: &[&Tensor]) -> Vec<Tensor> {
    let instrs: Vec<&str> = program.split(';').collect();
    exports
        .iter()
        .map(|&e| {
            let cut = instrs[..=e].join(";");
            // Only the inputs the cut program reads, renumbered in order.
            let mut used: Vec<usize> = vec![];
            for part in &instrs[..=e] {
                for a in part.split(['(', ')', ',']) {
                    if let Some(i) = a.strip_prefix('i').and_then(|i| i.parse().ok())
                        && !used.contains(&i)
                    {
                        used.push(i);
                    }
                }
            }
            used.sort();
            let mut text = cut;
            for (new, &old) in used.iter().enumerate() {
                text = text.replace(&format!("i{old},"), &format!("I{new},"));
                text = text.replace(&format!("i{old})"), &format!("I{new})"));
            }
            let text = text.replace('I', "i");
            let attrs = Attrs::new()
                .with("T", AttrValue::Type(DType::F32))
                .with("N", AttrValue::Int(used.len() as i64))
                .with("program", AttrValue::Str(text.clone()));
            let args: Vec<Arg> = used.iter().map(|&i| Arg::from(inputs[i])).collect();
            dev()
                .run(OP, &attrs, &args)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .remove(0)
        })
        .collect()
}

#[test]
fn exported_values_are_the_elementwise_kernels_bit_for_bit() {
    // Batch norm's gradient: rg = ReluGrad(dy + dr, y) is exported, rg * x_hat summed over
    // N, H, W; long enough to split, channels a multiple of 4 (vec4) or not (scalar); a
    // reduction of nothing (a copy) and of an empty tensor.
    let p = "AddV2(i0,i1);ReluGrad(t0,i2);Mul(t1,i3)";
    let cases: &[(&[usize], &[i32])] = &[
        (&[2, 9, 9, 16], &[0, 1, 2]),
        (&[3, 7, 5, 6], &[0, 1, 2]),
        (&[4, 40, 40, 8], &[0, 1, 2]),
        (&[6, 130], &[1]),
        (&[3, 1, 4], &[1]),
        (&[0, 4], &[0]),
    ];
    for (k, (shape, axes)) in cases.iter().enumerate() {
        let mut r = rng(40 + k as u64);
        let n: usize = shape.iter().product();
        let ts: Vec<Tensor> = (0..4)
            .map(|_| {
                dev()
                    .upload(&rand_f32(&mut r, n, -2.0, 2.0), shape)
                    .unwrap()
            })
            .collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let got = run_reduce_multi(p, &[1], &refs, "Sum", axes, false);
        let want_sum = run_unfused(p, &refs, "Sum", axes, false);
        let want_rg = run_values(p, &[1], &refs).remove(0);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].shape(), want_sum.shape(), "{shape:?}");
        assert_eq!(got[1].shape(), &shape[..], "{shape:?}");
        let b = |t: &Tensor| bits(&t.download::<f32>().unwrap());
        assert_eq!(b(&got[0]), b(&want_sum), "sum of {shape:?}");
        assert_eq!(b(&got[1]), b(&want_rg), "rg of {shape:?}");
    }
}

#[test]
fn exports_of_other_shapes_take_a_dispatch_of_their_own() {
    // scale = rsqrt(var) * gamma ([C]) is exported; x * scale ([N, C]) and the broadcast
    // difference (also [N, C], exported from the reduction's own pass) are reduced over N.
    let p = "Rsqrt(i1);Mul(t0,i2);Mul(i0,t1);Sub(t2,i3);Maximum(t3,i0)";
    for (k, (n, c)) in [(33usize, 12usize), (7, 5), (300, 64)].iter().enumerate() {
        let mut r = rng(60 + k as u64);
        let x = dev()
            .upload(&rand_f32(&mut r, n * c, -2.0, 2.0), &[*n, *c])
            .unwrap();
        let var = dev()
            .upload(&rand_f32(&mut r, *c, 0.5, 2.0), &[*c])
            .unwrap();
        let gamma = dev()
            .upload(&rand_f32(&mut r, *c, -1.0, 1.0), &[*c])
            .unwrap();
        let shift = dev()
            .upload(&rand_f32(&mut r, *c, -1.0, 1.0), &[*c])
            .unwrap();
        let refs = [&x, &var, &gamma, &shift];
        let exports = [1, 3];
        for reduce in ["Sum", "Max", "Mean"] {
            let got = run_reduce_multi(p, &exports, &refs, reduce, &[0], true);
            let want = run_unfused(p, &refs, reduce, &[0], true);
            let values = run_values(p, &exports, &refs);
            let b = |t: &Tensor| bits(&t.download::<f32>().unwrap());
            assert_eq!(got[0].shape(), &[1, *c]);
            assert_eq!(b(&got[0]), b(&want), "{reduce} [{n}, {c}]");
            assert_eq!(got[1].shape(), &[*c]);
            assert_eq!(b(&got[1]), b(&values[0]), "scale [{c}]");
            assert_eq!(got[2].shape(), &[*n, *c]);
            assert_eq!(b(&got[2]), b(&values[1]), "x * scale - shift [{n}, {c}]");
        }
    }
}

#[test]
fn the_reduced_tensor_itself_can_be_exported() {
    // A convolution's BiasAdd, whose mean batch norm takes: the Mean's kernel writes it as it
    // reduces it (output 1); also where nothing is reduced (the output is a copy).
    let p = "BiasAdd(i0,i1)";
    let cases: &[(&[usize], &[i32])] = &[
        (&[2, 9, 9, 16], &[0, 1, 2]),
        (&[3, 7, 5, 6], &[0, 1, 2]),
        (&[4, 40, 40, 8], &[0, 1, 2]),
        (&[3, 1, 4], &[1]),
    ];
    for (k, (shape, axes)) in cases.iter().enumerate() {
        let mut r = rng(80 + k as u64);
        let n: usize = shape.iter().product();
        let c = shape[shape.len() - 1];
        let x = dev()
            .upload(&rand_f32(&mut r, n, -2.0, 2.0), shape)
            .unwrap();
        let b = dev().upload(&rand_f32(&mut r, c, -1.0, 1.0), &[c]).unwrap();
        let refs = [&x, &b];
        let got = run_reduce_multi(p, &[0], &refs, "Mean", axes, true);
        let want = run_unfused(p, &refs, "Mean", axes, true);
        let y = run_values(p, &[0], &refs).remove(0);
        let bits_of = |t: &Tensor| bits(&t.download::<f32>().unwrap());
        assert_eq!(got[0].shape(), want.shape());
        assert_eq!(bits_of(&got[0]), bits_of(&want), "mean of {shape:?}");
        assert_eq!(got[1].shape(), &shape[..]);
        assert_eq!(bits_of(&got[1]), bits_of(&y), "BiasAdd of {shape:?}");
    }
}

/// A reduction whose program uses its input twice (`Sub(i0,i0)`, the finiteness test
/// `sum(x - x)`): NaN when any element is inf or NaN, 0 otherwise.
#[test]
fn repeated_operands_in_a_prologue_keep_inf_and_nan() {
    for bad in [None, Some(f32::INFINITY), Some(f32::NAN)] {
        let mut x: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        if let Some(b) = bad {
            x[1234] = b;
        }
        let t = dev().upload(&x, &[64, 64]).unwrap();
        let s = run_fused_reduce("Sub(i0,i0)", &[&t], "Sum", &[0, 1], false)
            .unwrap()
            .download::<f32>()
            .unwrap()[0];
        match bad {
            None => assert_eq!(s, 0.0),
            Some(_) => assert!(s.is_nan(), "{bad:?}: sum {s}"),
        }
    }
}
