mod common;
use common::*;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, HostTensor, f16};

const EPS: f64 = f32::EPSILON as f64 / 2.0; // unit roundoff of float32

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Sum,
    Max,
    Min,
    Mean,
    Prod,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Sum => "Sum",
            Op::Max => "Max",
            Op::Min => "Min",
            Op::Mean => "Mean",
            Op::Prod => "Prod",
        }
    }
}

const ALL_OPS: [Op; 5] = [Op::Sum, Op::Max, Op::Min, Op::Mean, Op::Prod];

/// TensorFlow's output shape, computed independently of the runtime.
fn tf_shape(shape: &[usize], axes: &[i64], keep_dims: bool) -> Vec<usize> {
    let rank = shape.len() as i64;
    let reduced: Vec<bool> = (0..rank)
        .map(|d| axes.iter().any(|&a| (a + rank) % rank.max(1) == d))
        .collect();
    let mut out = vec![];
    for (d, &s) in shape.iter().enumerate() {
        if !reduced[d] {
            out.push(s);
        } else if keep_dims {
            out.push(1);
        }
    }
    out
}

/// CPU reference in f64: for each output, the reduction's value, the sum of |x| (the scale of
/// the rounding error) and the number of reduced elements.
fn reference(op: Op, data: &[f64], shape: &[usize], axes: &[i64]) -> (Vec<f64>, Vec<f64>, usize) {
    let rank = shape.len();
    let reduced: Vec<bool> = (0..rank as i64)
        .map(|d| {
            axes.iter()
                .any(|&a| (a + rank as i64) % (rank as i64).max(1) == d)
        })
        .collect();
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(&reduced)
        .map(|(&s, &r)| if r { 1 } else { s })
        .collect();
    let n_out: usize = out_shape.iter().product();
    let count: usize = shape
        .iter()
        .zip(&reduced)
        .filter(|p| *p.1)
        .map(|p| *p.0)
        .product();
    let init = match op {
        Op::Sum | Op::Mean => 0.0,
        Op::Prod => 1.0,
        Op::Max => f64::NEG_INFINITY,
        Op::Min => f64::INFINITY,
    };
    let mut acc = vec![init; n_out];
    let mut abs = vec![0.0; n_out];
    let mut idx = vec![0usize; rank];
    for &x in data {
        let mut o = 0;
        for d in 0..rank {
            o = o * out_shape[d] + if reduced[d] { 0 } else { idx[d] };
        }
        let a = &mut acc[o];
        *a = match op {
            Op::Sum | Op::Mean => *a + x,
            Op::Prod => *a * x,
            Op::Max if x.is_nan() || a.is_nan() => f64::NAN,
            Op::Max => a.max(x),
            Op::Min if x.is_nan() || a.is_nan() => f64::NAN,
            Op::Min => a.min(x),
        };
        abs[o] += x.abs();
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    if op == Op::Mean {
        for a in &mut acc {
            *a /= count as f64;
        }
    }
    (acc, abs, count)
}

fn run_reduce(
    op: Op,
    x: &tfwgpu_runtime::Tensor,
    axes: &HostTensor,
    keep_dims: bool,
) -> tfwgpu_runtime::Result<Vec<tfwgpu_runtime::Tensor>> {
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(x.dtype()))
        .with("Tidx", AttrValue::Type(axes.dtype))
        .with("keep_dims", AttrValue::Bool(keep_dims));
    dev().run(op.name(), &attrs, &[Arg::from(x), Arg::from(axes)])
}

/// Every subset of the axes of a rank-`rank` tensor, written with negative axes on odd masks.
fn axis_sets(rank: usize) -> Vec<Vec<i64>> {
    (0..1u32 << rank)
        .map(|mask| {
            (0..rank as i64)
                .filter(|&d| mask & (1 << d) != 0)
                .map(|d| if mask % 2 == 1 { d - rank as i64 } else { d })
                .collect()
        })
        .collect()
}

/// Runs one float32 reduction and checks it against the reference with a tolerance from the
/// kernel's numerics: pairwise sums (error ~ log2(n) eps sum|x|), products (n eps |p|), exact
/// max/min.
fn check_f32(op: Op, data: &[f32], shape: &[usize], axes: &[i64], keep_dims: bool) {
    let x = dev().upload(data, shape).unwrap();
    let ax = HostTensor::vec_i32(&axes.iter().map(|&a| a as i32).collect::<Vec<_>>());
    let out = run_reduce(op, &x, &ax, keep_dims).unwrap();
    let what = format!(
        "{} {shape:?} axes {axes:?} keep_dims {keep_dims}",
        op.name()
    );
    assert_eq!(out[0].shape(), tf_shape(shape, axes, keep_dims), "{what}");
    let got = out[0].download::<f32>().unwrap();
    let d64: Vec<f64> = data.iter().map(|&v| v as f64).collect();
    let (want, abs, count) = reference(op, &d64, shape, axes);
    assert_eq!(got.len(), want.len(), "{what}");
    let log_n = (count.max(2) as f64).log2().ceil();
    for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&abs).enumerate() {
        let tol = match op {
            Op::Max | Op::Min => 0.0,
            Op::Sum => (2.0 * log_n + 32.0) * EPS * s,
            Op::Mean => (2.0 * log_n + 34.0) * EPS * s / count as f64,
            Op::Prod => (count as f64 + 2.0) * EPS * w.abs(),
        };
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
        } else if w.is_infinite() {
            assert_eq!(g as f64, w, "{what}[{i}]");
        } else {
            assert!(
                (g as f64 - w).abs() <= tol,
                "{what}[{i}]: got {g}, want {w} (tol {tol:e})"
            );
        }
    }
}

#[test]
fn f32_reductions_over_every_axis_set() {
    let mut r = rng(1);
    let shapes: &[&[usize]] = &[
        &[],
        &[1],
        &[7],
        &[129],
        &[65, 33],
        &[1, 7],
        &[4, 129],
        &[3, 1, 5],
        &[2, 3, 4, 5],
        &[7, 2, 1, 9],
    ];
    for &shape in shapes {
        let n: usize = shape.iter().product();
        for axes in axis_sets(shape.len()) {
            for op in ALL_OPS {
                let data = if op == Op::Prod {
                    rand_f32(&mut r, n, 0.8, 1.25)
                } else {
                    rand_f32(&mut r, n, -10.0, 10.0)
                };
                check_f32(op, &data, shape, &axes, false);
            }
        }
    }
}

#[test]
fn keep_dims_shapes_and_values() {
    let mut r = rng(2);
    let shape = [3usize, 4, 5];
    let data = rand_f32(&mut r, 60, -1.0, 1.0);
    for axes in axis_sets(3) {
        for op in [Op::Sum, Op::Max, Op::Mean] {
            check_f32(op, &data, &shape, &axes, true);
        }
    }
    // Shapes as TensorFlow gives them.
    let x = dev().upload(&data, &shape).unwrap();
    let cases: &[(&[i32], bool, &[usize])] = &[
        (&[1], false, &[3, 5]),
        (&[1], true, &[3, 1, 5]),
        (&[0, 2], true, &[1, 4, 1]),
        (&[-1, 0, 1], false, &[]),
        (&[-1, 0, 1], true, &[1, 1, 1]),
        (&[], true, &[3, 4, 5]),
        (&[], false, &[3, 4, 5]),
    ];
    for &(axes, keep, want) in cases {
        let out = run_reduce(Op::Sum, &x, &HostTensor::vec_i32(axes), keep).unwrap();
        assert_eq!(out[0].shape(), want, "axes {axes:?} keep_dims {keep}");
    }
    // A scalar axis, an int64 axis vector, and duplicate axes.
    let out = run_reduce(Op::Sum, &x, &HostTensor::scalar(-2i32), true).unwrap();
    assert_eq!(out[0].shape(), &[3, 1, 5]);
    let out = run_reduce(
        Op::Sum,
        &x,
        &HostTensor::new(&[2i64, 0], &[2]).unwrap(),
        false,
    )
    .unwrap();
    assert_eq!(out[0].shape(), &[4]);
    check_f32(Op::Sum, &data, &shape, &[2, -1, 2], false);
    check_f32(Op::Max, &data, &shape, &[0, 0], true);
}

#[test]
fn empty_axis_list_is_a_copy() {
    let mut r = rng(3);
    let mut data = rand_f32(&mut r, 35, -5.0, 5.0);
    data[4] = f32::NAN;
    let x = dev().upload(&data, &[5, 7]).unwrap();
    for op in ALL_OPS {
        let out = run_reduce(op, &x, &HostTensor::vec_i32(&[]), false).unwrap();
        assert_eq!(out[0].shape(), &[5, 7]);
        let got = out[0].download::<f32>().unwrap();
        let same = got
            .iter()
            .zip(&data)
            .all(|(g, w)| g.to_bits() == w.to_bits());
        assert!(same, "{}: {got:?}", op.name());
    }
    // Reducing only size-1 dimensions is a copy too.
    let x = dev().upload(&data, &[5, 1, 7, 1]).unwrap();
    let out = run_reduce(Op::Mean, &x, &HostTensor::vec_i32(&[1, 3]), false).unwrap();
    assert_eq!(out[0].shape(), &[5, 7]);
    assert_close(&out[0].download::<f32>().unwrap(), &data, 0.0, 0.0, "mean");
}

#[test]
fn empty_inputs_give_the_identity() {
    let x = dev().upload::<f32>(&[], &[0, 3]).unwrap();
    let axis0 = HostTensor::vec_i32(&[0]);
    let want = [
        (Op::Sum, 0.0f32),
        (Op::Prod, 1.0),
        (Op::Max, f32::NEG_INFINITY),
        (Op::Min, f32::INFINITY),
        (Op::Mean, f32::NAN),
    ];
    for (op, v) in want {
        let out = run_reduce(op, &x, &axis0, false).unwrap();
        assert_eq!(out[0].shape(), &[3]);
        assert_close(
            &out[0].download::<f32>().unwrap(),
            &[v; 3],
            0.0,
            0.0,
            op.name(),
        );
        // Keep dims: [1, 3]. Reducing everything: a scalar.
        let out = run_reduce(op, &x, &axis0, true).unwrap();
        assert_eq!(out[0].shape(), &[1, 3]);
        let out = run_reduce(op, &x, &HostTensor::vec_i32(&[0, 1]), false).unwrap();
        assert_eq!(out[0].shape(), &[] as &[usize]);
        assert_close(
            &out[0].download::<f32>().unwrap(),
            &[v],
            0.0,
            0.0,
            op.name(),
        );
    }
    let xi = dev().upload::<i32>(&[], &[2, 0]).unwrap();
    let axis1 = HostTensor::vec_i32(&[1]);
    let want_i = [
        (Op::Sum, 0i32),
        (Op::Prod, 1),
        (Op::Max, i32::MIN),
        (Op::Min, i32::MAX),
        (Op::Mean, 0),
    ];
    for (op, v) in want_i {
        let out = run_reduce(op, &xi, &axis1, false).unwrap();
        assert_eq!(
            out[0].download::<i32>().unwrap(),
            vec![v; 2],
            "{}",
            op.name()
        );
    }
    // An empty output: nothing to compute.
    let out = run_reduce(Op::Sum, &x, &HostTensor::vec_i32(&[1]), false).unwrap();
    assert_eq!(out[0].shape(), &[0]);
    assert!(out[0].download::<f32>().unwrap().is_empty());
}

#[test]
fn max_and_min_propagate_nan() {
    let mut r = rng(4);
    // A vector with one NaN at various places (row reduction, long enough to be split).
    for (n, pos) in [
        (7usize, 0usize),
        (7, 6),
        (129, 64),
        (1000, 999),
        (20000, 12345),
    ] {
        let mut data = rand_f32(&mut r, n, -1.0, 1.0);
        data[pos] = f32::NAN;
        for op in [Op::Max, Op::Min] {
            check_f32(op, &data, &[n], &[0], false);
        }
    }
    // Column reductions: NaN in some columns only.
    let mut data = rand_f32(&mut r, 129 * 5, -1.0, 1.0);
    data[3 * 5 + 1] = f32::NAN;
    data[128 * 5 + 4] = f32::NAN;
    for op in [Op::Max, Op::Min] {
        check_f32(op, &data, &[129, 5], &[0], false);
        check_f32(op, &data, &[129, 5], &[1], false);
    }
    // Infinities are ordinary values; Sum with NaN is NaN.
    let data = [f32::NEG_INFINITY, -1.0, f32::INFINITY, 2.0];
    check_f32(Op::Max, &data, &[2, 2], &[1], false);
    check_f32(Op::Min, &data, &[2, 2], &[0], false);
    check_f32(Op::Sum, &[1.0, f32::NAN, 3.0], &[3], &[0], false);
    let x = dev().upload(&[f32::NEG_INFINITY; 3], &[3]).unwrap();
    let out = run_reduce(Op::Max, &x, &HostTensor::vec_i32(&[0]), false).unwrap();
    assert_eq!(out[0].download::<f32>().unwrap(), vec![f32::NEG_INFINITY]);
}

/// Sums of many positive numbers: a sequential float32 loop drifts by hundreds of ulps here
/// (its error grows ~n), the pairwise reduction stays within log2(n) of the exact sum.
#[test]
fn long_f32_sums_are_accurate() {
    let mut r = rng(5);
    let n = (1 << 20) + 3;
    let data = rand_f32(&mut r, n, 0.0, 1.0);
    check_f32(Op::Sum, &data, &[n], &[0], false);
    check_f32(Op::Mean, &data, &[n], &[0], true);
    // A constant vector: a sequential float32 loop rounds the same way at every step and
    // ends far outside the tolerance (checked here, so the test can tell the difference).
    let data = vec![0.1f32; n];
    let seq: f32 = data.iter().sum();
    let exact = n as f64 * 0.1f32 as f64;
    let tol = (2.0 * 21.0 + 32.0) * EPS * exact;
    assert!(
        (seq as f64 - exact).abs() > 10.0 * tol,
        "sequential sum within tolerance"
    );
    check_f32(Op::Sum, &data, &[n], &[0], false);
    // Columns: a leading-axis reduction of 3 long columns, and many medium rows.
    let data = rand_f32(&mut r, 40000 * 3, 0.0, 1.0);
    check_f32(Op::Sum, &data, &[40000, 3], &[0], false);
    let data = rand_f32(&mut r, 600 * 1000, 0.0, 1.0);
    check_f32(Op::Sum, &data, &[600, 1000], &[1], false);
    check_f32(Op::Sum, &data, &[600, 1000], &[0], false);
}

/// Leading-axis reductions over many columns run in column mode with up to 32 neighbouring
/// columns per workgroup and are split along the rows into chunks (a second pass combines the
/// chunks): every op, column counts around the 32-column tile, row counts that do not divide
/// into the chunks, and a middle-axis reduction (outer > 1).
#[test]
fn leading_axis_reductions_split_over_rows() {
    let mut r = rng(6);
    let shapes: &[(&[usize], &[i64])] = &[
        (&[4096, 64], &[0]),
        (&[2053, 37], &[0]),
        (&[1031, 31], &[0]),
        (&[3000, 1], &[0]),
        (&[3, 1000, 33], &[1]),
        // vec4 loads (reduce_vec4.wgsl): a middle axis over 8 vec4 columns, long rows split
        // in chunks of 4096, rows of 1028 (one vec4 tail per invocation), two reduced blocks.
        (&[3, 500, 32], &[1]),
        (&[2, 65536], &[1]),
        (&[256, 1028], &[1]),
        (&[6, 20, 8], &[0, 2]),
    ];
    for &(shape, axes) in shapes {
        let n: usize = shape.iter().product();
        for op in ALL_OPS {
            let data = if op == Op::Prod {
                rand_f32(&mut r, n, 0.999, 1.001)
            } else {
                rand_f32(&mut r, n, -10.0, 10.0)
            };
            check_f32(op, &data, shape, axes, false);
        }
    }
    // NaN in every lane position of vec4 rows, and in one vec4 column.
    let mut data = rand_f32(&mut r, 4 * 1024, -1.0, 1.0);
    for (row, col) in [(0usize, 0usize), (1, 513), (2, 1022), (3, 1023)] {
        data[row * 1024 + col] = f32::NAN;
    }
    check_f32(Op::Max, &data, &[4, 1024], &[1], false);
    check_f32(Op::Min, &data, &[1024, 4], &[0], false);
    // NaN in one row of a split column reaches that column's Max / Sum only.
    let mut data = rand_f32(&mut r, 4096 * 64, -1.0, 1.0);
    data[3000 * 64 + 5] = f32::NAN;
    check_f32(Op::Max, &data, &[4096, 64], &[0], false);
    check_f32(Op::Sum, &data, &[4096, 64], &[0], false);
}

#[test]
fn batch_statistics_over_many_rows_split_in_more_than_1024_chunks() {
    // Sum and Mean over N, H, W of an NHWC tensor with 268,800 rows of 64 channels: more
    // than 1,024 chunks of 256 rows (each invocation folds 16 vec4), then the partials.
    let mut r = rng(8);
    let shape = [2, 1050, 128, 64];
    let data = rand_f32(&mut r, shape.iter().product(), -1.0, 1.0);
    for op in [Op::Sum, Op::Mean] {
        check_f32(op, &data, &shape, &[0, 1, 2], false);
    }
}

fn run_i32(op: Op, data: &[i32], shape: &[usize], axes: &[i32]) -> Vec<i32> {
    let x = dev().upload(data, shape).unwrap();
    let out = run_reduce(op, &x, &HostTensor::vec_i32(axes), false).unwrap();
    out[0].download::<i32>().unwrap()
}

#[test]
fn int32_reductions_are_exact() {
    let mut r = rng(6);
    for (shape, axes) in [
        (vec![129usize], vec![0i32]),
        (vec![65, 33], vec![0]),
        (vec![65, 33], vec![1]),
        (vec![2, 3, 4, 5], vec![0, 2]),
        (vec![2, 3, 4, 5], vec![-1, 1]),
        (vec![30000], vec![0]),
        // vec4 loads: rows of 1028, columns of 64 (split), a middle axis of 8-wide rows.
        (vec![7, 1028], vec![1]),
        (vec![3000, 64], vec![0]),
        (vec![5, 100, 8], vec![1]),
    ] {
        let n: usize = shape.iter().product();
        let data = rand_i32(&mut r, n, -100_000, 100_000);
        let d64: Vec<f64> = data.iter().map(|&v| v as f64).collect();
        let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        for op in [Op::Sum, Op::Max, Op::Min, Op::Mean] {
            let got = run_i32(op, &data, &shape, &axes);
            let (want, _, _) = reference(Op::Sum, &d64, &shape, &ax);
            let (mx, _, _) = reference(op, &d64, &shape, &ax);
            let count = n / got.len();
            let want: Vec<i32> = match op {
                // Exact in f64: |sum| < 2^53.
                Op::Sum => want.iter().map(|&s| s as i64 as i32).collect(),
                // C++ integer division truncates toward zero.
                Op::Mean => want
                    .iter()
                    .map(|&s| (s as i64 / count as i64) as i32)
                    .collect(),
                _ => mx.iter().map(|&v| v as i32).collect(),
            };
            assert_eq!(got, want, "{} {shape:?} axes {axes:?}", op.name());
        }
    }
    // Wrapping, as TensorFlow's int32 arithmetic on the CPU.
    assert_eq!(
        run_i32(Op::Sum, &[i32::MAX, 1, 5], &[3], &[0]),
        vec![i32::MIN + 5]
    );
    assert_eq!(run_i32(Op::Prod, &[65536, 65536, 3], &[3], &[0]), vec![0]);
    assert_eq!(
        run_i32(Op::Prod, &[-3, 7, 2, -1], &[2, 2], &[1]),
        vec![-21, -2]
    );
    assert_eq!(run_i32(Op::Mean, &[-3, -4], &[2], &[0]), vec![-3]);
    assert_eq!(
        run_i32(Op::Max, &[i32::MIN, i32::MIN], &[2], &[0]),
        vec![i32::MIN]
    );
}

#[test]
fn invalid_axes_are_errors() {
    let x = dev().upload(&[1.0f32; 6], &[2, 3]).unwrap();
    for axes in [vec![2], vec![-3], vec![0, 5]] {
        let e = run_reduce(Op::Sum, &x, &HostTensor::vec_i32(&axes), false)
            .err()
            .unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("Invalid reduction dimension"), "{e}");
        assert!(e.to_string().contains("Sum"), "{e}");
    }
    let s = dev().upload(&[1.0f32], &[]).unwrap();
    let e = run_reduce(Op::Max, &s, &HostTensor::vec_i32(&[0]), false)
        .err()
        .unwrap();
    assert!(e.to_string().contains("Invalid reduction dimension"), "{e}");
    // A scalar reduced over no axes is itself.
    let out = run_reduce(Op::Max, &s, &HostTensor::vec_i32(&[]), false).unwrap();
    assert_eq!(out[0].download::<f32>().unwrap(), vec![1.0]);
    // Axes must be a scalar or a vector of int32/int64.
    let m = HostTensor::new(&[0i32, 1], &[1, 2]).unwrap();
    assert!(run_reduce(Op::Sum, &x, &m, false).is_err());
    let f = HostTensor::new(&[0.0f32], &[1]).unwrap();
    assert!(run_reduce(Op::Sum, &x, &f, false).is_err());
    // Types other than float32, int32 and float16 have no kernel.
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::I64));
    assert!(matches!(
        dev().kernel("Sum", &attrs).err().unwrap(),
        Error::Unimplemented(_)
    ));
}

/// float16 reductions load the halves in their first pass (no float32 copy of the input),
/// reduce in float32 and round once: against float64 reductions of the same halves, within
/// one half rounding (2^-11 relative) plus the float32 sum's error; Max/Min exact, NaN
/// propagated, infinities kept. Odd sizes (a row's last half alone in its word) and sizes the
/// vec4 steps take (rows and columns of multiples of 4).
#[test]
fn f16_reductions_load_halves() {
    let mut s = 0x2545_f491u32;
    for (shape, special) in [
        (vec![37usize, 9], false),
        (vec![5, 11], true),
        (vec![64, 1028], false),
        (vec![1028, 64], true),
        (vec![3, 20, 8], false),
        (vec![2, 65536], false),
    ] {
        let n: usize = shape.iter().product();
        let mut data: Vec<f16> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                f16::from_f32((s % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect();
        if special {
            data[3] = f16::NAN;
            data[n - 2] = f16::INFINITY;
        }
        let x = dev().upload(&data, &shape).unwrap();
        let d64: Vec<f64> = data.iter().map(|h| h.to_f64()).collect();
        for axes in axis_sets(shape.len()) {
            for op in ALL_OPS {
                if op == Op::Prod && n > 4096 {
                    continue; // products of thousands of values in [-1, 1] underflow
                }
                let what = format!("f16 {} {shape:?} axes {axes:?}", op.name());
                let ax = HostTensor::vec_i32(&axes.iter().map(|&a| a as i32).collect::<Vec<_>>());
                let out = run_reduce(op, &x, &ax, false).unwrap();
                assert_eq!(out[0].dtype(), DType::F16, "{what}");
                let got = out[0].download::<f16>().unwrap();
                let (want, abs, count) = reference(op, &d64, &shape, &axes);
                let log_n = (count.max(2) as f64).log2().ceil();
                for (i, ((g, &w), &a)) in got.iter().zip(&want).zip(&abs).enumerate() {
                    let g = g.to_f64();
                    if w.is_nan() {
                        assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
                        continue;
                    }
                    if w.is_infinite() || matches!(op, Op::Max | Op::Min) {
                        assert_eq!(g, f16::from_f64(w).to_f64(), "{what}[{i}]");
                        continue;
                    }
                    let f32_err = match op {
                        Op::Sum => (2.0 * log_n + 32.0) * EPS * a,
                        Op::Mean => (2.0 * log_n + 34.0) * EPS * a / count as f64,
                        _ => (count as f64 + 2.0) * EPS * w.abs(),
                    };
                    // Rounding to half: half an ulp of the result, 2^-11 relative, or the
                    // subnormal spacing 2^-25 (half of 2^-24) near zero.
                    let tol = f32_err + (w.abs() * 2f64.powi(-11)).max(2f64.powi(-25));
                    assert!(
                        (g - w).abs() <= tol,
                        "{what}[{i}]: got {g}, want {w} (tol {tol:e})"
                    );
                }
            }
        }
    }
}
