//! ArgMax / ArgMin against a CPU reference of TensorFlow's CPU semantics (Eigen's
//! ArgMaxTupleReducer: start at index 0 with the lowest finite value, replace only on a
//! strictly better value, so ties keep the first index and NaN is never selected).
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, Error, HostTensor};

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// TensorFlow's ArgMax (or ArgMin) of `x` (f64 keys, or int64 compared exactly; `start` the
/// starting value) along `axis`.
fn arg_ref<T: PartialOrd + Copy>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    max: bool,
    start: T,
) -> Vec<i64> {
    let outer: usize = shape[..axis].iter().product();
    let r = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![];
    for o in 0..outer {
        for i in 0..inner {
            let (mut best, mut idx) = (start, 0);
            for k in 0..r {
                let v = x[(o * r + k) * inner + i];
                if (max && v > best) || (!max && v < best) {
                    best = v;
                    idx = k as i64;
                }
            }
            out.push(idx);
        }
    }
    out
}

fn attrs(output: DType) -> Attrs {
    Attrs::new().with("output_type", AttrValue::Type(output))
}

/// Runs ArgMax/ArgMin and returns the indices widened to i64.
fn run_arg(op: &str, x: &HostTensor, dim: &HostTensor, output: DType) -> (Vec<usize>, Vec<i64>) {
    let out = try_run_host(op, &attrs(output), &[x], &[dim]).unwrap();
    assert_eq!(out[0].dtype(), output);
    let idx = match output {
        DType::I32 => out[0]
            .download::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        _ => out[0].download::<i64>().unwrap(),
    };
    (out[0].shape().to_vec(), idx)
}

#[test]
fn argmax_argmin_every_dtype_and_axis() {
    let mut r = rng(41);
    let cases: &[(&[usize], i64)] = &[
        (&[7], 0),
        (&[3, 10], 1),
        (&[3, 10], 0),
        (&[3, 10], -1),
        (&[129, 7], 1),
        (&[7, 129], 0),
        (&[2, 3, 4], 0),
        (&[2, 3, 4], 1),
        (&[2, 3, 4], -1),
        (&[1000, 3], 0),
        (&[2, 5000], 1),
        (&[3, 0], 0),
        (&[1, 1], 1),
    ];
    for &(shape, dim) in cases {
        let n = numel(shape);
        let axis = dim.rem_euclid(shape.len() as i64) as usize;
        let mut out_shape = shape.to_vec();
        out_shape.remove(axis);
        // Few distinct values (ties), NaN, signed zeros, infinities.
        let pool = [
            -3.0f32,
            -1.0,
            -0.0,
            0.0,
            2.5,
            7.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let xf: Vec<f32> = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    pool[r.random_range(0..pool.len())]
                } else {
                    r.random_range(-100.0f32..100.0)
                }
            })
            .collect();
        let xh = f16s(&xf);
        let xi = rand_i32(&mut r, n, -5, 5);
        let xl: Vec<i64> = (0..n)
            .map(|_| match r.random_range(0..4) {
                0 => i64::MIN,
                1 => i64::MAX,
                2 => r.random_range(-3i64..3) << 32,
                _ => r.random_range(-3i64..3),
            })
            .collect();
        for (op, max) in [("ArgMax", true), ("ArgMin", false)] {
            let inputs: [(HostTensor, Vec<f64>, f64); 4] = [
                (
                    host(&xf, shape),
                    to_f64(&xf),
                    if max {
                        f32::MIN as f64
                    } else {
                        f32::MAX as f64
                    },
                ),
                (
                    host(&xh, shape),
                    f16_to_f64(&xh),
                    if max { -65504.0 } else { 65504.0 },
                ),
                (
                    host(&xi, shape),
                    to_f64(&xi),
                    if max {
                        i32::MIN as f64
                    } else {
                        i32::MAX as f64
                    },
                ),
                // int64 keys compared exactly (arg_ref on the int64 values below).
                (host(&xl, shape), vec![], 0.0),
            ];
            for (k, (x, keys, start)) in inputs.iter().enumerate() {
                let want = if x.dtype == DType::I64 {
                    arg_ref(&xl, shape, axis, max, if max { i64::MIN } else { i64::MAX })
                } else {
                    arg_ref(keys, shape, axis, max, *start)
                };
                for output in [DType::I32, DType::I64] {
                    let dims = [HostTensor::scalar(dim as i32), HostTensor::scalar(dim)];
                    let (s, got) = run_arg(op, x, &dims[k % 2], output);
                    assert_eq!(s, out_shape, "{op} {} {shape:?} dim {dim}", x.dtype);
                    assert_eq!(got, want, "{op} {} {shape:?} dim {dim} {output}", x.dtype);
                }
            }
        }
    }
}

#[test]
fn argmax_special_rows() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let dim = HostTensor::scalar(1i32);
    // TensorFlow 2.21 CPU: [1, nan, 3] -> 2, [nan, 1, 3] -> 2, [1, 3, nan] -> 1, all NaN -> 0,
    // [nan, -inf] -> 0, [-inf, -FLT_MAX] -> 0, ties -> first, -0 and +0 tie.
    let rows: &[([f32; 3], i64, i64)] = &[
        ([1.0, nan, 3.0], 2, 0),
        ([nan, 1.0, 3.0], 2, 1),
        ([1.0, 3.0, nan], 1, 0),
        ([nan, nan, nan], 0, 0),
        ([nan, -inf, -inf], 0, 1),
        ([-inf, f32::MIN, -inf], 0, 0),
        ([inf, f32::MAX, inf], 0, 0),
        ([3.0, 1.0, 3.0], 0, 1),
        ([-0.0, 0.0, -0.0], 0, 0),
        ([0.0, -0.0, 5.0], 2, 0),
    ];
    let x: Vec<f32> = rows.iter().flat_map(|r| r.0).collect();
    let xs = host(&x, &[rows.len(), 3]);
    let (_, amax) = run_arg("ArgMax", &xs, &dim, DType::I64);
    let (_, amin) = run_arg("ArgMin", &xs, &dim, DType::I64);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(amax[i], row.1, "ArgMax {:?}", row.0);
        assert_eq!(amin[i], row.2, "ArgMin {:?}", row.0);
    }
    // f16 NaN and its largest values.
    let h = f16s(&[f32::NAN, -65504.0, 1.0, -inf, -65504.0, -65504.0]);
    let (_, got) = run_arg("ArgMax", &host(&h, &[2, 3]), &dim, DType::I32);
    assert_eq!(got, vec![2, 0]);
}

#[test]
fn argmax_errors() {
    let x = host(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let err = |x: &HostTensor, d: &HostTensor| {
        try_run_host("ArgMax", &Attrs::new(), &[x], &[d])
            .err()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        err(&x, &HostTensor::scalar(2i32)),
        "ArgMax: Expected dimension in the range [-2, 2), but got 2"
    );
    assert_eq!(
        err(&x, &HostTensor::scalar(-3i64)),
        "ArgMax: Expected dimension in the range [-2, 2), but got -3"
    );
    assert_eq!(
        err(&host(&[1.0f32], &[]), &HostTensor::scalar(0i32)),
        "ArgMax: Expected dimension in the range [0, 0), but got 0"
    );
    assert_eq!(
        err(&x, &HostTensor::vec_i32(&[1])),
        "ArgMax: dim must be a scalar, but received tensor of shape: [1]"
    );
    assert_eq!(
        err(&host(&[0f32; 0], &[0, 3]), &HostTensor::scalar(0i32)),
        "ArgMax: Reduction axis 0 is empty in shape [0,3]"
    );
    assert!(err(&x, &HostTensor::scalar(1.0f32)).contains("int32 or int64"));
    // The dimension must come in host memory.
    let d = dev();
    let t = d.upload(&[1.0f32, 2.0], &[2]).unwrap();
    let dm = d.upload(&[0i32], &[]).unwrap();
    let e = d
        .run("ArgMax", &Attrs::new(), &[(&t).into(), (&dm).into()])
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    // output_type must be an index type; bool input has no kernel.
    let bad = Attrs::new().with("output_type", AttrValue::Type(DType::F32));
    assert!(
        tfwgpu_runtime::Registry::global()
            .build_kernel("ArgMin", &bad)
            .is_err()
    );
    let e = try_run_host(
        "ArgMax",
        &Attrs::new(),
        &[&bools(&[true, false], &[2])],
        &[&HostTensor::scalar(0i32)],
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    // The default output type is int64.
    let out = try_run_host("ArgMax", &Attrs::new(), &[&x], &[&HostTensor::scalar(0i32)]).unwrap();
    assert_eq!(out[0].dtype(), DType::I64);
    assert_eq!(out[0].download::<i64>().unwrap(), vec![1, 1]);
}

#[test]
fn long_axes_continue_across_dispatches() {
    // Along axis 0 of [70000, 3] each invocation walks one column: 32,768 elements per
    // dispatch (CPU adapters stop a shader's loops after 65,535 iterations), so the best so
    // far carries into the next dispatch. Column 0: the maximum in the last chunk; column 1:
    // ties across chunks (the first index wins) with NaNs around the chunk boundaries;
    // column 2: all NaN but one -inf (index 0, as TensorFlow: nothing beats the start).
    let r = 70_000;
    let mut rng = rng(7);
    let mut x = vec![0.0f32; r * 3];
    for k in 0..r {
        x[k * 3] = rng.random_range(-1.0..1.0);
        x[k * 3 + 1] = if k % 1000 == 0 { 5.0 } else { 1.0 };
        x[k * 3 + 2] = f32::NAN;
    }
    x[69_000 * 3] = 2.0;
    x[32_767 * 3 + 1] = f32::NAN;
    x[32_768 * 3 + 1] = f32::NAN;
    x[40_000 * 3 + 2] = f32::NEG_INFINITY;
    let xs = host(&x, &[r, 3]);
    let dim = HostTensor::scalar(0i32);
    for (op, max) in [("ArgMax", true), ("ArgMin", false)] {
        let (shape, got) = run_arg(op, &xs, &dim, DType::I64);
        assert_eq!(shape, vec![3]);
        let start = if max { f32::MIN } else { f32::MAX };
        assert_eq!(got, arg_ref(&x, &[r, 3], 0, max, start), "{op}");
    }
    let (_, got) = run_arg("ArgMax", &xs, &dim, DType::I32);
    assert_eq!(got, vec![69_000, 0, 0]);
}
