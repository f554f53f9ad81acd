//! CPU references, comparisons and run helpers shared by the op tests (elementwise,
//! elementwise_ops, nn, argminmax).
#![allow(dead_code)]

use tfwgpu_runtime::{Arg, Attrs, DType, Element, HostTensor, Tensor, f16};

use crate::common::dev;

/// TensorFlow's broadcast of several shapes, or None when incompatible.
pub fn bshape(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let at = |s: &[usize], d: usize| -> usize {
        if d + s.len() < r {
            1
        } else {
            s[d + s.len() - r]
        }
    };
    (0..r)
        .map(|d| {
            let mut n = 1;
            for s in shapes {
                let x = at(s, d);
                if x != 1 {
                    if n != 1 && n != x {
                        return None;
                    }
                    n = x;
                }
            }
            Some(n)
        })
        .collect()
}

/// For each element of the broadcast output, the flat offsets in each input.
pub fn bcast_offsets(shapes: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let out = bshape(shapes).expect("compatible shapes");
    let r = out.len();
    let n: usize = out.iter().product();
    let mut res = Vec::with_capacity(n);
    let mut coords = vec![0; r];
    for idx in 0..n {
        let mut rem = idx;
        for d in (0..r).rev() {
            coords[d] = rem % out[d];
            rem /= out[d];
        }
        res.push(
            shapes
                .iter()
                .map(|s| {
                    let mut off = 0;
                    for (k, &dim) in s.iter().enumerate() {
                        let c = coords[r - s.len() + k];
                        off = off * dim + if dim == 1 { 0 } else { c };
                    }
                    off
                })
                .collect(),
        );
    }
    (out, res)
}

/// CPU reference of a broadcast binary op.
pub fn bcast_ref<T: Copy, U>(
    a: &[T],
    sa: &[usize],
    b: &[T],
    sb: &[usize],
    f: impl Fn(T, T) -> U,
) -> (Vec<usize>, Vec<U>) {
    let (out, offs) = bcast_offsets(&[sa, sb]);
    (out, offs.iter().map(|o| f(a[o[0]], b[o[1]])).collect())
}

/// Runs `op` with `attrs` on device tensors made from `args`.
pub fn run(op: &str, attrs: &Attrs, args: &[&HostTensor]) -> Vec<Tensor> {
    try_run(op, attrs, args).unwrap_or_else(|e| panic!("{op}: {e}"))
}

pub fn try_run(
    op: &str,
    attrs: &Attrs,
    args: &[&HostTensor],
) -> tfwgpu_runtime::Result<Vec<Tensor>> {
    try_run_host(op, attrs, args, &[])
}

/// Runs `op` on device tensors made from `args`, followed by `host_args` passed in host
/// memory (axes, dimensions).
pub fn try_run_host(
    op: &str,
    attrs: &Attrs,
    args: &[&HostTensor],
    host_args: &[&HostTensor],
) -> tfwgpu_runtime::Result<Vec<Tensor>> {
    let d = dev();
    let ts: Vec<Tensor> = args.iter().map(|h| d.upload_host(h).unwrap()).collect();
    let mut a: Vec<Arg> = ts.iter().map(Arg::from).collect();
    a.extend(host_args.iter().map(|h| Arg::from(*h)));
    d.run(op, attrs, &a)
}

pub fn host<T: Element>(data: &[T], shape: &[usize]) -> HostTensor {
    HostTensor::new(data, shape).unwrap()
}

pub fn bools(data: &[bool], shape: &[usize]) -> HostTensor {
    HostTensor::from_bools(data, shape).unwrap()
}

/// Downloads a bool tensor.
pub fn download_bools(t: &Tensor) -> Vec<bool> {
    assert_eq!(t.dtype(), DType::Bool);
    t.download::<u8>()
        .unwrap()
        .iter()
        .map(|&b| b != 0)
        .collect()
}

/// Exact comparison of floats: same bits, or both NaN.
pub fn assert_same_f32(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

pub fn assert_same_f16(got: &[f16], want: &[f16], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g} ({:#x}), want {w} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// The spacing of floats with `mant_bits` stored mantissa bits and minimum normal exponent
/// `min_exp` around |x| (the subnormal spacing below the normal range).
pub fn ulp(x: f64, mant_bits: i32, min_exp: i32) -> f64 {
    let e = if x == 0.0 {
        min_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mant_bits)
}

/// Compares with an exact (f64) reference within `ulps` units in the last place of the result
/// type (f32: 23 mantissa bits, f16: 10). NaN must match NaN, infinities exactly. Results in
/// the f32 subnormal range may be flushed to zero (drivers may flush denormals), so there the
/// allowance is the smallest normal number.
pub fn assert_ulps(got: &[f64], want: &[f64], ulps: f64, f16_result: bool, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mant, min_exp) = if f16_result { (10, -14) } else { (23, -126) };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g:e}, want NaN");
            continue;
        }
        let max = if f16_result { 65504.0 } else { f32::MAX as f64 };
        if w.is_infinite() || w.abs() > max * (1.0 + 2f64.powi(-mant - 1)) {
            assert_eq!(g, w.signum() * f64::INFINITY, "{what}[{i}]: want {w:e}");
            continue;
        }
        let mut tol = ulps * ulp(w, mant, min_exp);
        if !f16_result && w.abs() < f32::MIN_POSITIVE as f64 {
            tol = tol.max(f32::MIN_POSITIVE as f64);
        }
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g:e}, want {w:e} (allowed {ulps} ulp = {tol:e})"
        );
    }
}

/// Compares with an f64 reference within per-element absolute bounds `tol` (NaN must match
/// NaN, infinities exactly).
pub fn assert_within(got: &[f64], want: &[f64], tol: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g:e}, want NaN");
        } else if w.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]");
        } else {
            assert!(
                (g - w).abs() <= t,
                "{what}[{i}]: got {g:e}, want {w:e} (allowed {t:e})"
            );
        }
    }
}

pub fn to_f64<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

pub fn f16s(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

pub fn f16_to_f64(v: &[f16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Rounds an f32 to f16 precision (Eigen's `half` rounding of an intermediate result).
pub fn rh(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Unit roundoff of f32.
pub const EPS: f64 = f32::EPSILON as f64 / 2.0;

/// Runs a unary op with no attributes; checks the output keeps the shape and dtype.
pub fn run1<T: Element>(op: &str, x: &[T], shape: &[usize]) -> Vec<T> {
    let out = run(op, &Attrs::new(), &[&host(x, shape)]);
    assert_eq!(out[0].shape(), shape, "{op}: output shape");
    assert_eq!(out[0].dtype(), T::DTYPE, "{op}: output dtype");
    out[0].download::<T>().unwrap()
}

/// Runs a binary op with no attributes; returns the output shape and data.
pub fn run2<T: Element>(
    op: &str,
    a: &[T],
    sa: &[usize],
    b: &[T],
    sb: &[usize],
) -> (Vec<usize>, Vec<T>) {
    let out = run(op, &Attrs::new(), &[&host(a, sa), &host(b, sb)]);
    assert_eq!(out[0].dtype(), T::DTYPE, "{op}: output dtype");
    (out[0].shape().to_vec(), out[0].download::<T>().unwrap())
}
