//! All / Any (bool reductions over any axes, keep_dims) and Reverse (the v1 op with a bool
//! `dims` vector), against plain CPU references.
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, Error};

/// Reference reduction: `all` (else any) over the axes in `mask`.
fn reduce_ref(x: &[bool], shape: &[usize], mask: &[bool], all: bool) -> Vec<bool> {
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(mask)
        .map(|(&d, &m)| if m { 1 } else { d })
        .collect();
    let m: usize = out_shape.iter().product();
    let mut out = vec![all; m];
    let rank = shape.len();
    for (i, &v) in x.iter().enumerate() {
        let mut rem = i;
        let mut o = 0;
        let mut stride = 1;
        for d in (0..rank).rev() {
            let c = rem % shape[d];
            rem /= shape[d];
            if !mask[d] {
                o += c * stride;
            }
            stride *= out_shape[d];
        }
        if all {
            out[o] &= v;
        } else {
            out[o] |= v;
        }
    }
    out
}

#[test]
fn all_any() {
    let mut r = rng(51);
    let cases: &[(&[usize], &[i64])] = &[
        (&[7], &[0]),
        (&[129], &[-1]),
        (&[3, 5, 7], &[1]),
        (&[3, 5, 7], &[0, 2]),
        (&[3, 5, 7], &[]),
        (&[4, 1, 6], &[0, 1, 2]),
        (&[2, 3, 4, 5], &[3, 1]),
        (&[0, 3], &[0]),
        (&[0, 3], &[1]),
        (&[], &[]),
        (&[5, 20000], &[1]),
        (&[40000], &[0]),
    ];
    for &(shape, axes) in cases {
        let n: usize = shape.iter().product();
        // Mostly true (for All) or mostly false (for Any), so both outcomes occur.
        for p in [0.97, 0.03, 0.5] {
            let x: Vec<bool> = (0..n).map(|_| r.random_bool(p)).collect();
            let rank = shape.len();
            let mut mask = vec![false; rank];
            for &a in axes {
                mask[a.rem_euclid(rank.max(1) as i64) as usize] = true;
            }
            for keep in [false, true] {
                for (op, all) in [("All", true), ("Any", false)] {
                    let attrs = Attrs::new().with("keep_dims", AttrValue::Bool(keep));
                    let out = try_run_host(
                        op,
                        &attrs,
                        &[&bools(&x, shape)],
                        &[&host(axes, &[axes.len()])],
                    )
                    .unwrap_or_else(|e| panic!("{op}: {e}"));
                    let want_shape: Vec<usize> = shape
                        .iter()
                        .zip(&mask)
                        .filter_map(|(&d, &m)| {
                            if !m {
                                Some(d)
                            } else if keep {
                                Some(1)
                            } else {
                                None
                            }
                        })
                        .collect();
                    assert_eq!(
                        out[0].shape(),
                        want_shape.as_slice(),
                        "{op} {shape:?} {axes:?}"
                    );
                    let got = download_bools(&out[0]);
                    assert_eq!(
                        got,
                        reduce_ref(&x, shape, &mask, all),
                        "{op} {shape:?} {axes:?} keep {keep}"
                    );
                }
            }
        }
    }
    // Scalar axis, int32.
    let x = [true, false, true, true, true, true];
    let out = try_run_host(
        "All",
        &Attrs::new(),
        &[&bools(&x, &[2, 3])],
        &[&host(&[1i32], &[])],
    )
    .unwrap();
    assert_eq!(download_bools(&out[0]), vec![false, true]);
    let e = try_run_host(
        "Any",
        &Attrs::new(),
        &[&bools(&x, &[2, 3])],
        &[&host(&[2i32], &[])],
    );
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
    let e = try_run_host(
        "Any",
        &Attrs::new(),
        &[&host(&[1f32; 6], &[2, 3])],
        &[&host(&[0i32], &[])],
    );
    assert!(e.is_err());
}

#[test]
fn reverse_v1() {
    let mut r = rng(52);
    let shapes: &[&[usize]] = &[
        &[7],
        &[3, 5],
        &[2, 3, 4],
        &[0, 3],
        &[1, 129],
        &[2, 1, 3, 1, 2],
    ];
    for &shape in shapes {
        let n: usize = shape.iter().product();
        let rank = shape.len();
        let x = rand_f32(&mut r, n, -1.0, 1.0);
        let xi: Vec<i64> = (0..n as i64).collect();
        for bits in 0..(1u32 << rank) {
            let dims: Vec<bool> = (0..rank).map(|d| bits >> d & 1 == 1).collect();
            // Reference: output element at coordinate c is input at c reversed on dims.
            let want_idx: Vec<usize> = (0..n)
                .map(|i| {
                    let mut rem = i;
                    let mut src = 0;
                    let mut stride = 1;
                    for d in (0..rank).rev() {
                        let c = rem % shape[d];
                        rem /= shape[d];
                        let c = if dims[d] { shape[d] - 1 - c } else { c };
                        src += c * stride;
                        stride *= shape[d];
                    }
                    src
                })
                .collect();
            let dh = bools(&dims, &[rank]);
            let out = try_run_host("Reverse", &Attrs::new(), &[&host(&x, shape)], &[&dh]).unwrap();
            let got: Vec<f32> = out[0].download().unwrap();
            assert_eq!(
                got,
                want_idx.iter().map(|&j| x[j]).collect::<Vec<_>>(),
                "Reverse {shape:?} {dims:?}"
            );
            let out = try_run_host("Reverse", &Attrs::new(), &[&host(&xi, shape)], &[&dh]).unwrap();
            let got: Vec<i64> = out[0].download().unwrap();
            assert_eq!(
                got,
                want_idx.iter().map(|&j| xi[j]).collect::<Vec<_>>(),
                "Reverse i64"
            );
        }
    }
    // dims must have one entry per dimension.
    let e = try_run_host(
        "Reverse",
        &Attrs::new(),
        &[&host(&[1f32; 6], &[2, 3])],
        &[&bools(&[true], &[1])],
    );
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
}
