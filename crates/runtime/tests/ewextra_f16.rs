//! float16 Softmax, LogSoftmax, the softmax cross-entropies, BiasAddGrad, MatMul and
//! BatchMatMulV2/V3: computed in float32 and rounded once, against f64 references.
mod common;
mod refs;

use common::*;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, f16};

fn half() -> Attrs {
    Attrs::new().with("T", AttrValue::Type(DType::F16))
}

/// An f32 result within a few f32 ulp (plus `abs` absolute), rounded once to f16: within one
/// f16 ulp of the exact value (plus `abs`).
fn assert_f16(got: &[f16], want: &[f64], abs: f64, what: &str) {
    let tol: Vec<f64> = want.iter().map(|&w| ulp(w, 10, -14) + abs).collect();
    assert_within(&f16_to_f64(got), want, &tol, what);
}

fn softmax_rows(x: &[f64], cols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut sm = vec![];
    let mut lsm = vec![];
    for row in x.chunks(cols) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for v in row {
            sm.push((v - m).exp() / s);
            lsm.push(v - m - s.ln());
        }
    }
    (sm, lsm)
}

#[test]
fn softmax_and_xent_f16() {
    let mut r = rng(71);
    for (rows, cols) in [(1, 1), (3, 7), (5, 129), (2, 1000), (0, 4)] {
        let x = f16s(&rand_f32(&mut r, rows * cols, -8.0, 8.0));
        let xd = f16_to_f64(&x);
        let (sm, lsm) = softmax_rows(&xd, cols.max(1));
        let what = format!("[{rows},{cols}]");
        let out = run("Softmax", &half(), &[&host(&x, &[rows, cols])]);
        assert_eq!(out[0].dtype(), DType::F16);
        assert_f16(
            &out[0].download().unwrap(),
            &sm,
            0.0,
            &format!("Softmax {what}"),
        );
        let out = run("LogSoftmax", &half(), &[&host(&x, &[rows, cols])]);
        // log(sum) carries an absolute error of a few f32 ulp of its magnitude.
        assert_f16(
            &out[0].download().unwrap(),
            &lsm,
            1e-5,
            &format!("LogSoftmax {what}"),
        );
        if cols == 0 {
            continue;
        }
        // Sparse: loss = -log_softmax[label], backprop = softmax - onehot.
        let labels: Vec<i32> = (0..rows).map(|i| ((i * 7 + 3) % cols) as i32).collect();
        let out = run(
            "SparseSoftmaxCrossEntropyWithLogits",
            &half().with("Tlabels", AttrValue::Type(DType::I32)),
            &[&host(&x, &[rows, cols]), &host(&labels, &[rows])],
        );
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(out[1].dtype(), DType::F16);
        let loss: Vec<f64> = (0..rows)
            .map(|i| -lsm[i * cols + labels[i] as usize])
            .collect();
        let back: Vec<f64> = (0..rows * cols)
            .map(|k| sm[k] - ((k % cols) as i32 == labels[k / cols]) as i32 as f64)
            .collect();
        assert_f16(&out[0].download().unwrap(), &loss, 1e-5, "SparseXent loss");
        assert_f16(
            &out[1].download().unwrap(),
            &back,
            1e-6,
            "SparseXent backprop",
        );
        // Dense labels (a distribution per row).
        let lab = f16s(&rand_f32(&mut r, rows * cols, 0.0, 1.0));
        let labd = f16_to_f64(&lab);
        let out = run(
            "SoftmaxCrossEntropyWithLogits",
            &half(),
            &[&host(&x, &[rows, cols]), &host(&lab, &[rows, cols])],
        );
        let loss: Vec<f64> = (0..rows)
            .map(|i| {
                (0..cols)
                    .map(|j| -labd[i * cols + j] * lsm[i * cols + j])
                    .sum()
            })
            .collect();
        let back: Vec<f64> = (0..rows * cols).map(|k| sm[k] - labd[k]).collect();
        let lsum: Vec<f64> = (0..rows)
            .map(|i| {
                (0..cols)
                    .map(|j| labd[i * cols + j] * lsm[i * cols + j].abs())
                    .sum::<f64>()
            })
            .collect();
        let got: Vec<f16> = out[0].download().unwrap();
        for i in 0..rows {
            let tol = ulp(loss[i], 10, -14) + 1e-5 * (1.0 + lsum[i]);
            assert!(
                (got[i].to_f64() - loss[i]).abs() <= tol,
                "Xent loss row {i}"
            );
        }
        assert_f16(&out[1].download().unwrap(), &back, 1e-6, "Xent backprop");
    }
}

fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                c[i * n + j] += a[i * k + l] * b[l * n + j];
                mag[i * n + j] += (a[i * k + l] * b[l * n + j]).abs();
            }
        }
    }
    (c, mag)
}

#[test]
fn matmul_f16() {
    let mut r = rng(72);
    for (m, k, n) in [(1, 1, 1), (7, 5, 3), (33, 129, 17), (4, 0, 5), (0, 3, 2)] {
        let a = f16s(&rand_f32(&mut r, m * k, -2.0, 2.0));
        let b = f16s(&rand_f32(&mut r, k * n, -2.0, 2.0));
        let (c, mag) = matmul_ref(&f16_to_f64(&a), &f16_to_f64(&b), m, k, n);
        let out = run("MatMul", &half(), &[&host(&a, &[m, k]), &host(&b, &[k, n])]);
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(out[0].shape(), &[m, n]);
        let got: Vec<f16> = out[0].download().unwrap();
        // f32 accumulation: k * eps * sum |a b|, then one f16 rounding.
        let tol: Vec<f64> = c
            .iter()
            .zip(&mag)
            .map(|(&w, &s)| ulp(w, 10, -14) + k as f64 * EPS * 2.0 * s)
            .collect();
        assert_within(
            &f16_to_f64(&got),
            &c,
            &tol,
            &format!("MatMul f16 {m}x{k}x{n}"),
        );
        // Transposed operands: A^T stored [k, m].
        let at: Vec<f16> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
        let attrs = half().with("transpose_a", AttrValue::Bool(true));
        let out = run("MatMul", &attrs, &[&host(&at, &[k, m]), &host(&b, &[k, n])]);
        assert_eq!(
            out[0].download::<f16>().unwrap(),
            got,
            "MatMul f16 transpose_a"
        );
    }
    // BatchMatMulV2 with batch broadcasting, and V3 with Ta/Tb/Tout.
    let (m, k, n) = (5, 9, 6);
    let a = f16s(&rand_f32(&mut r, 3 * m * k, -1.0, 1.0));
    let b = f16s(&rand_f32(&mut r, k * n, -1.0, 1.0));
    let ad = f16_to_f64(&a);
    let bd = f16_to_f64(&b);
    let mut want = vec![];
    let mut mags = vec![];
    for bt in 0..3 {
        let (c, mag) = matmul_ref(&ad[bt * m * k..(bt + 1) * m * k], &bd, m, k, n);
        want.extend(c);
        mags.extend(mag);
    }
    let tol: Vec<f64> = want
        .iter()
        .zip(&mags)
        .map(|(&w, &s)| ulp(w, 10, -14) + k as f64 * EPS * 2.0 * s)
        .collect();
    let out = run(
        "BatchMatMulV2",
        &half(),
        &[&host(&a, &[3, m, k]), &host(&b, &[1, k, n])],
    );
    assert_eq!(out[0].shape(), &[3, m, n]);
    assert_within(
        &f16_to_f64(&out[0].download::<f16>().unwrap()),
        &want,
        &tol,
        "BatchMatMulV2 f16",
    );
    let t = AttrValue::Type(DType::F16);
    let v3 = Attrs::new()
        .with("Ta", t.clone())
        .with("Tb", t.clone())
        .with("Tout", t);
    let out = run(
        "BatchMatMulV3",
        &v3,
        &[&host(&a, &[3, m, k]), &host(&b, &[k, n])],
    );
    assert_eq!(out[0].dtype(), DType::F16);
    assert_within(
        &f16_to_f64(&out[0].download::<f16>().unwrap()),
        &want,
        &tol,
        "BatchMatMulV3 f16",
    );
}

#[test]
fn bias_add_grad_and_l2loss_f16() {
    let mut r = rng(73);
    for (shape, nchw) in [
        (&[7usize, 5][..], false),
        (&[3, 4, 5, 6][..], false),
        (&[2, 3, 4, 5][..], true),
        (&[0, 3][..], false),
    ] {
        let n: usize = shape.iter().product();
        let x = f16s(&rand_f32(&mut r, n, -3.0, 3.0));
        let xd = f16_to_f64(&x);
        let c = if nchw {
            shape[1]
        } else {
            shape[shape.len() - 1]
        };
        let mut want = vec![0.0; c];
        let mut mag = vec![0.0; c];
        let inner: usize = if nchw { shape[2..].iter().product() } else { 1 };
        for (i, v) in xd.iter().enumerate() {
            let ch = if nchw { (i / inner) % c } else { i % c };
            want[ch] += v;
            mag[ch] += v.abs();
        }
        let attrs = half().with(
            "data_format",
            AttrValue::Str(if nchw { "NCHW" } else { "NHWC" }.into()),
        );
        let out = run("BiasAddGrad", &attrs, &[&host(&x, shape)]);
        assert_eq!(out[0].dtype(), DType::F16);
        let tol: Vec<f64> = want
            .iter()
            .zip(&mag)
            .map(|(&w, &s)| ulp(w, 10, -14) + n as f64 * EPS * s)
            .collect();
        assert_within(
            &f16_to_f64(&out[0].download::<f16>().unwrap()),
            &want,
            &tol,
            &format!("BiasAddGrad f16 {shape:?}"),
        );
        let out = run("L2Loss", &half(), &[&host(&x, shape)]);
        let l2: f64 = xd.iter().map(|v| v * v).sum::<f64>() / 2.0;
        let got = out[0].download::<f16>().unwrap()[0].to_f64();
        assert!(
            (got - l2).abs() <= ulp(l2, 10, -14) + n as f64 * EPS * l2,
            "L2Loss f16 {shape:?}: {got} vs {l2}"
        );
    }
}
