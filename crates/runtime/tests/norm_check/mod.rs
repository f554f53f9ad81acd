//! The batch-norm checks shared by tests/norm.rs and tests/norm_rows.rs: f64 references of
//! TensorFlow's CPU formulas and error bounds from the kernels' arithmetic.
#![allow(dead_code)]

use crate::common::*;
use crate::refs::*;
use rand::Rng;
use tfwgpu_runtime::{AttrValue, Attrs, DType, HostTensor, Tensor, f16};

/// The (outer, c, inner) view of a shape.
pub fn view(shape: &[usize], channels_first: bool) -> (usize, usize, usize) {
    let cd = if channels_first { 1 } else { shape.len() - 1 };
    (
        shape[..cd].iter().product(),
        shape[cd],
        shape[cd + 1..].iter().product(),
    )
}

/// Indices of channel `ch`'s elements.
pub fn channel_indices(shape: &[usize], cf: bool, ch: usize) -> Vec<usize> {
    let (outer, c, inner) = view(shape, cf);
    let mut v = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            v.push((o * c + ch) * inner + i);
        }
    }
    v
}

/// Reduction error factor: K * eps with K from the tree depth.
pub fn kred(n: usize) -> f64 {
    (16.0 + (n.max(2) as f64).log2() + 8.0) * EPS
}

pub fn attrs(t: DType, training: bool, cf: bool, rank5: bool, eps: f32, factor: f32) -> Attrs {
    let fmt = match (cf, rank5) {
        (false, false) => "NHWC",
        (true, false) => "NCHW",
        (false, true) => "NDHWC",
        (true, true) => "NCDHW",
    };
    Attrs::new()
        .with("T", AttrValue::Type(t))
        .with("U", AttrValue::Type(DType::F32))
        .with("epsilon", AttrValue::Float(eps))
        .with("exponential_avg_factor", AttrValue::Float(factor))
        .with("data_format", AttrValue::Str(fmt.into()))
        .with("is_training", AttrValue::Bool(training))
}

pub fn tensor_t(v: &[f32], shape: &[usize], half: bool) -> HostTensor {
    if half {
        host(&f16s(v), shape)
    } else {
        host(v, shape)
    }
}

pub fn down_t(t: &Tensor, half: bool) -> Vec<f64> {
    if half {
        f16_to_f64(&t.download::<f16>().unwrap())
    } else {
        to_f64(&t.download::<f32>().unwrap())
    }
}

pub fn down_f32(t: &Tensor) -> Vec<f64> {
    assert_eq!(t.dtype(), DType::F32);
    to_f64(&t.download::<f32>().unwrap())
}

pub struct FwdCase {
    pub shape: Vec<usize>,
    pub cf: bool,
    pub half: bool,
    pub training: bool,
    pub factor: f32,
    pub eps: f32,
    /// Mean and spread of the data.
    pub center: f32,
    pub spread: f32,
    pub version: u8,
}

pub fn check_forward(case: &FwdCase, seed: u64) {
    let mut r = rng(seed);
    let shape = &case.shape;
    let n: usize = shape.iter().product();
    let (outer, c, inner) = view(shape, case.cf);
    let rest = outer * inner;
    let x: Vec<f32> = (0..n)
        .map(|_| {
            let v = case.center + r.random_range(-case.spread..case.spread);
            if case.half { rh(v) } else { v }
        })
        .collect();
    let scale = rand_f32(&mut r, c, 0.5, 2.0);
    let offset = rand_f32(&mut r, c, -1.0, 1.0);
    let old_mean = rand_f32(&mut r, c, -1.0, 1.0);
    let old_var = rand_f32(&mut r, c, 0.5, 2.0);
    let empty_stats = case.training && case.factor == 1.0 && seed.is_multiple_of(2);
    let (mi, vi) = if empty_stats {
        (host::<f32>(&[], &[0]), host::<f32>(&[], &[0]))
    } else {
        (host(&old_mean, &[c]), host(&old_var, &[c]))
    };
    let t = if case.half { DType::F16 } else { DType::F32 };
    let op = match case.version {
        1 => "FusedBatchNorm",
        2 => "FusedBatchNormV2",
        _ => "FusedBatchNormV3",
    };
    let a = attrs(
        t,
        case.training,
        case.cf,
        shape.len() == 5,
        case.eps,
        case.factor,
    );
    let out = run(
        op,
        &a,
        &[
            &tensor_t(&x, shape, case.half),
            &host(&scale, &[c]),
            &host(&offset, &[c]),
            &mi,
            &vi,
        ],
    );
    let what = format!(
        "{op} {shape:?} cf={} half={} training={} f={}",
        case.cf, case.half, case.training, case.factor
    );
    assert_eq!(out.len(), if case.version == 3 { 6 } else { 5 }, "{what}");
    assert_eq!(out[0].shape(), &shape[..]);
    for o in &out[1..5] {
        assert_eq!(o.shape(), &[c], "{what}");
    }
    if case.version == 3 {
        assert_eq!(out[5].shape(), &[] as &[usize]);
        assert_eq!(out[5].download::<f32>().unwrap(), vec![0.0]);
    }
    let y = down_t(&out[0], case.half);
    let (bm, bv, sm, sv) = (
        down_f32(&out[1]),
        down_f32(&out[2]),
        down_f32(&out[3]),
        down_f32(&out[4]),
    );
    let k = kred(rest);
    let eps64 = case.eps as f64;
    for ch in 0..c {
        let idx = channel_indices(shape, case.cf, ch);
        let xs: Vec<f64> = idx.iter().map(|&i| x[i] as f64).collect();
        let (mean, var, tol_mean, tol_var) = if case.training {
            let mean = xs.iter().sum::<f64>() / rest as f64;
            let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / rest as f64;
            let maxabs = xs.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let maxdev = xs.iter().fold(0.0f64, |m, v| m.max((v - mean).abs()));
            // Welford/Chan: the mean to K eps |x|; M2 to K eps of max deviation^2 plus the
            // mean's error times the deviations.
            let tm = k * maxabs;
            (mean, var, tm, k * maxdev * maxdev + 2.0 * tm * maxdev)
        } else {
            (old_mean[ch] as f64, old_var[ch] as f64, 0.0, 0.0)
        };
        let adjust = rest as f64 / (rest.max(2) - 1) as f64;
        let f = case.factor as f64;
        let (want_bm, want_bv, tbm, tbv) = if !case.training {
            (mean, var, 0.0, 0.0)
        } else if case.factor == 1.0 {
            (
                mean,
                var * adjust,
                tol_mean,
                tol_var * adjust + 4.0 * EPS * var,
            )
        } else {
            (
                (1.0 - f) * old_mean[ch] as f64 + f * mean,
                (1.0 - f) * old_var[ch] as f64 + f * adjust * var,
                f * tol_mean + 4.0 * EPS,
                f * adjust * tol_var + 8.0 * EPS * 4.0,
            )
        };
        let w = |v: &[f64], want: f64, tol: f64, name: &str| {
            assert_within(
                &[v[ch]],
                &[want],
                &[tol + 2.0 * EPS * want.abs()],
                &format!("{what} {name}[{ch}]"),
            );
        };
        w(&bm, want_bm, tbm, "batch_mean");
        w(&bv, want_bv, tbv, "batch_variance");
        w(&sm, mean, tol_mean, "reserve_space_1");
        w(&sv, var, tol_var, "reserve_space_2");
        // y = (x - mean) * rsqrt(var + eps) * scale + offset.
        let kk = scale[ch] as f64 / (var + eps64).sqrt();
        let mut want = vec![];
        let mut tol = vec![];
        let mut got = vec![];
        for &i in &idx {
            let xc = x[i] as f64 - mean;
            let v = xc * kk + offset[ch] as f64;
            // mean error, relative variance error (halved by the square root), rsqrt (a few
            // ULP on Vulkan), the products and the sum.
            let mut t = kk.abs()
                * (tol_mean + xc.abs() * (0.5 * tol_var / (var + eps64) + 8.0 * EPS))
                + 4.0 * EPS * (offset[ch] as f64).abs()
                + 4.0 * EPS * v.abs();
            if case.half {
                t += v.abs() * 2f64.powi(-11) + 2f64.powi(-25);
            }
            want.push(v);
            tol.push(t);
            got.push(y[i]);
        }
        assert_within(&got, &want, &tol, &format!("{what} y[channel {ch}]"));
    }
}

pub struct GradCase {
    pub shape: Vec<usize>,
    pub cf: bool,
    pub half: bool,
    pub training: bool,
    pub version: u8,
}

pub fn check_grad(case: &GradCase, seed: u64) {
    let mut r = rng(seed);
    let shape = &case.shape;
    let n: usize = shape.iter().product();
    let (outer, c, inner) = view(shape, case.cf);
    let rest = outer * inner;
    let round = |v: f32| if case.half { rh(v) } else { v };
    let x: Vec<f32> = (0..n)
        .map(|_| round(r.random_range(-2.0f32..3.0)))
        .collect();
    let dy: Vec<f32> = (0..n)
        .map(|_| round(r.random_range(-1.0f32..1.0)))
        .collect();
    let scale = rand_f32(&mut r, c, 0.5, 2.0);
    let mean = rand_f32(&mut r, c, 0.0, 1.0);
    let var = rand_f32(&mut r, c, 0.5, 2.0);
    let eps = 1e-3f32;
    let t = if case.half { DType::F16 } else { DType::F32 };
    let op = match case.version {
        1 => "FusedBatchNormGrad",
        2 => "FusedBatchNormGradV2",
        _ => "FusedBatchNormGradV3",
    };
    let a = attrs(t, case.training, case.cf, shape.len() == 5, eps, 1.0);
    let (dyt, xt) = (
        tensor_t(&dy, shape, case.half),
        tensor_t(&x, shape, case.half),
    );
    let (st, mt, vt) = (host(&scale, &[c]), host(&mean, &[c]), host(&var, &[c]));
    let r3 = host(&[0.0f32], &[]);
    let mut args = vec![&dyt, &xt, &st, &mt, &vt];
    if case.version == 3 {
        args.push(&r3);
    }
    let out = run(op, &a, &args);
    let what = format!(
        "{op} {shape:?} cf={} half={} training={}",
        case.cf, case.half, case.training
    );
    assert_eq!(out.len(), 5);
    assert_eq!(out[0].shape(), &shape[..]);
    assert_eq!(out[1].shape(), &[c]);
    assert_eq!(out[2].shape(), &[c]);
    assert_eq!(out[3].shape(), &[0]);
    assert_eq!(out[4].shape(), &[0]);
    let dx = down_t(&out[0], case.half);
    let (ds, doff) = (down_f32(&out[1]), down_f32(&out[2]));
    let k = kred(rest);
    for ch in 0..c {
        let idx = channel_indices(shape, case.cf, ch);
        let m = mean[ch] as f64;
        let coef0 = 1.0 / (var[ch] as f64 + eps as f64).sqrt();
        let sum_dy: f64 = idx.iter().map(|&i| dy[i] as f64).sum();
        let abs_dy: f64 = idx.iter().map(|&i| (dy[i] as f64).abs()).sum();
        let sum_dyxc: f64 = idx.iter().map(|&i| dy[i] as f64 * (x[i] as f64 - m)).sum();
        let abs_dyxc: f64 = idx
            .iter()
            .map(|&i| (dy[i] as f64 * (x[i] as f64 - m)).abs())
            .sum();
        let (t_dy, t_dyxc) = (k * abs_dy, k * abs_dyxc + 2.0 * EPS * abs_dyxc);
        assert_within(
            &[doff[ch]],
            &[sum_dy],
            &[t_dy],
            &format!("{what} offset_backprop[{ch}]"),
        );
        assert_within(
            &[ds[ch]],
            &[sum_dyxc * coef0],
            &[(t_dyxc + 8.0 * EPS * abs_dyxc) * coef0],
            &format!("{what} scale_backprop[{ch}]"),
        );
        let c1 = scale[ch] as f64 * coef0;
        let mut got = vec![];
        let mut want = vec![];
        let mut tol = vec![];
        for &i in &idx {
            let d = dy[i] as f64;
            let xc = x[i] as f64 - m;
            let (v, mut t) = if case.training {
                let mdy = sum_dy / rest as f64;
                let c2 = coef0 * coef0 * sum_dyxc / rest as f64;
                let v = c1 * ((d - mdy) - xc * c2);
                let terms = d.abs() + mdy.abs() + (xc * c2).abs();
                let t = c1.abs()
                    * (t_dy / rest as f64
                        + xc.abs() * coef0 * coef0 * t_dyxc / rest as f64
                        + 12.0 * EPS * terms);
                (v, t)
            } else {
                let v = d * c1;
                (v, 8.0 * EPS * v.abs())
            };
            if case.half {
                t += v.abs() * 2f64.powi(-11) + 2f64.powi(-25);
            }
            got.push(dx[i]);
            want.push(v);
            tol.push(t);
        }
        assert_within(
            &got,
            &want,
            &tol,
            &format!("{what} x_backprop[channel {ch}]"),
        );
    }
}
