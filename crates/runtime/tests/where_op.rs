//! Where (one argument): coordinates of the non-zero elements, with data-dependent output
//! shapes (`Device::output_descs` reads a count back), against a CPU reference.
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{Arg, Attrs, DType, HostTensor, f16};

/// Row-major coordinates of the indices in `nz`.
fn coords(nz: &[usize], shape: &[usize]) -> Vec<i64> {
    let mut out = vec![];
    for &i in nz {
        let mut c = vec![0i64; shape.len()];
        let mut rem = i;
        for d in (0..shape.len()).rev() {
            c[d] = (rem % shape[d]) as i64;
            rem /= shape[d];
        }
        out.extend(c);
    }
    out
}

fn check(x: &HostTensor, nz: &[usize], what: &str) {
    let out = run("Where", &Attrs::new(), &[x]);
    assert_eq!(out[0].dtype(), DType::I64, "{what}");
    assert_eq!(out[0].shape(), &[nz.len(), x.shape.len()], "{what}: shape");
    let got: Vec<i64> = out[0].download().unwrap();
    assert_eq!(got, coords(nz, &x.shape), "{what}");
}

#[test]
fn where_every_dtype_and_rank() {
    let mut r = rng(61);
    let shapes: &[&[usize]] = &[
        &[7],
        &[1029],
        &[0],
        &[3, 0],
        &[3, 5],
        &[2, 3, 4],
        &[2, 1, 3, 4],
        &[2, 3, 1, 2, 3],
        &[5, 1000],
        &[3, 2, 1, 2, 1, 2, 1, 2],
        &[300_000],
    ];
    for &shape in shapes {
        let n: usize = shape.iter().product();
        for p in [0.0, 0.01, 0.5, 1.0] {
            let b: Vec<bool> = (0..n).map(|_| r.random_bool(p)).collect();
            let nz: Vec<usize> = (0..n).filter(|&i| b[i]).collect();
            let what = |t: &str| format!("Where {t} {shape:?} p={p}");
            check(&bools(&b, shape), &nz, &what("bool"));
            // Numbers: zero where b is false, assorted non-zero values elsewhere.
            let f: Vec<f32> = (0..n)
                .map(|i| {
                    if b[i] {
                        [1.0, -2.5, f32::NAN, 1e-40, f32::INFINITY][i % 5]
                    } else if i % 2 == 0 {
                        0.0
                    } else {
                        -0.0
                    }
                })
                .collect();
            check(&host(&f, shape), &nz, &what("f32"));
            let v: Vec<i32> = (0..n)
                .map(|i| if b[i] { [1, -1, i32::MIN][i % 3] } else { 0 })
                .collect();
            check(&host(&v, shape), &nz, &what("i32"));
            let v: Vec<i64> = (0..n)
                .map(|i| if b[i] { [1, 1 << 40, -1][i % 3] } else { 0 })
                .collect();
            check(&host(&v, shape), &nz, &what("i64"));
            let v: Vec<u8> = (0..n)
                .map(|i| if b[i] { [1, 255, 128][i % 3] } else { 0 })
                .collect();
            check(&host(&v, shape), &nz, &what("u8"));
        }
    }
    // Rank 0 is an error, as in TensorFlow.
    let e = try_run("Where", &Attrs::new(), &[&bools(&[true], &[])]);
    assert!(matches!(e, Err(tfwgpu_runtime::Error::InvalidArgument(_))));
    // Not registered for f16 (TensorFlow's GPU Where has no half kernel).
    let d = dev();
    let t = d.upload(&[f16::ONE], &[1]).unwrap();
    assert!(d.run("Where", &Attrs::new(), &[Arg::from(&t)]).is_err());
}

#[test]
fn where_follows_prior_work() {
    // The count read waits for the work that produces the input.
    let d = dev();
    let mut r = rng(62);
    let x = rand_f32(&mut r, 5000, -1.0, 1.0);
    let t = d.upload(&x, &[50, 100]).unwrap();
    let zero = d.upload(&[0f32], &[]).unwrap();
    let g = d
        .run("Greater", &Attrs::new(), &[Arg::from(&t), Arg::from(&zero)])
        .unwrap();
    let out = d.run("Where", &Attrs::new(), &[Arg::from(&g[0])]).unwrap();
    let nz: Vec<usize> = (0..x.len()).filter(|&i| x[i] > 0.0).collect();
    assert_eq!(out[0].shape(), &[nz.len(), 2]);
    assert_eq!(out[0].download::<i64>().unwrap(), coords(&nz, &[50, 100]));
}
