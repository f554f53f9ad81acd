//! norm family: FusedBatchNorm / V2 / V3 and FusedBatchNormGrad / V2 / V3 against f64
//! references of TensorFlow's CPU formulas, training and inference, NHWC / NCHW / 5-D, f32
//! and f16, with error bounds from the kernels' arithmetic: the per-channel reductions are
//! trees (at most 64 serial steps per invocation in the one-dispatch kernel `onepass.wgsl`,
//! 16 in the statistics pass of the others, then log2 levels), so their error is bounded by
//! K * eps * sum|terms| with K = 64 + log2(n) + a few operations.
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, HostTensor, Tensor, f16};

/// The (outer, c, inner) view of a shape.
fn view(shape: &[usize], channels_first: bool) -> (usize, usize, usize) {
    let cd = if channels_first { 1 } else { shape.len() - 1 };
    (
        shape[..cd].iter().product(),
        shape[cd],
        shape[cd + 1..].iter().product(),
    )
}

/// Indices of channel `ch`'s elements.
fn channel_indices(shape: &[usize], cf: bool, ch: usize) -> Vec<usize> {
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
fn kred(n: usize) -> f64 {
    (64.0 + (n.max(2) as f64).log2() + 8.0) * EPS
}

fn attrs(t: DType, training: bool, cf: bool, rank5: bool, eps: f32, factor: f32) -> Attrs {
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

fn tensor_t(v: &[f32], shape: &[usize], half: bool) -> HostTensor {
    if half {
        host(&f16s(v), shape)
    } else {
        host(v, shape)
    }
}

fn down_t(t: &Tensor, half: bool) -> Vec<f64> {
    if half {
        f16_to_f64(&t.download::<f16>().unwrap())
    } else {
        to_f64(&t.download::<f32>().unwrap())
    }
}

fn down_f32(t: &Tensor) -> Vec<f64> {
    assert_eq!(t.dtype(), DType::F32);
    to_f64(&t.download::<f32>().unwrap())
}

struct FwdCase {
    shape: Vec<usize>,
    cf: bool,
    half: bool,
    training: bool,
    factor: f32,
    eps: f32,
    /// Mean and spread of the data.
    center: f32,
    spread: f32,
    version: u8,
}

fn check_forward(case: &FwdCase, seed: u64) {
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

#[test]
fn forward_training_and_inference_shapes() {
    let shapes: &[(&[usize], bool)] = &[
        (&[2, 3, 5, 7], false),
        (&[2, 7, 3, 5], true),
        (&[1, 1, 1, 1], false),
        (&[3, 5, 4, 129], false),
        (&[1, 3, 9, 11], true),
        (&[2, 3, 4, 5, 3], false),
        (&[2, 3, 2, 3, 4], true),
        // 40 channels innermost: two channel tiles (32 + 8), 19 chunks per channel.
        (&[2, 30, 40, 40], false),
        // NHWC with C % 4 == 0: vec4 statistics and apply (rows in two-row steps and a tail,
        // several chunks, quads past C in the last tile).
        (&[1, 3, 3, 8], false),
        (&[2, 33, 17, 64], false),
        (&[2, 9, 9, 132], false),
    ];
    let mut seed = 0;
    for &(shape, cf) in shapes {
        for training in [true, false] {
            for (version, factor) in [(1, 1.0), (2, 0.3), (3, 1.0), (3, 0.5)] {
                seed += 1;
                check_forward(
                    &FwdCase {
                        shape: shape.to_vec(),
                        cf,
                        half: false,
                        training,
                        factor,
                        eps: 1e-3,
                        center: 0.5,
                        spread: 2.0,
                        version,
                    },
                    seed,
                );
            }
        }
    }
}

#[test]
fn forward_f16() {
    let mut seed = 100;
    // The last three: NHWC with C % 4 == 0, the vec4 statistics and apply on four halves.
    for (shape, cf) in [
        (vec![2, 5, 3, 6], false),
        (vec![3, 4, 5, 7], true),
        (vec![1, 3, 3, 8], false),
        (vec![2, 33, 17, 64], false),
        (vec![2, 9, 9, 132], false),
    ] {
        for training in [true, false] {
            for version in [2, 3] {
                seed += 1;
                check_forward(
                    &FwdCase {
                        shape: shape.clone(),
                        cf,
                        half: true,
                        training,
                        factor: 0.25,
                        eps: 1e-3,
                        center: -1.0,
                        spread: 3.0,
                        version,
                    },
                    seed,
                );
            }
        }
    }
}

/// 1e5 elements per channel around 1000 with spread 1: E[x^2] - E[x]^2 in f32 would lose
/// every digit of the variance; the Welford/Chan tree keeps it to ~1e-5 relative.
#[test]
fn forward_large_reduction_is_accurate() {
    for (shape, cf) in [(vec![4, 125, 200, 1], false), (vec![2, 3, 250, 200], true)] {
        check_forward(
            &FwdCase {
                shape,
                cf,
                half: false,
                training: true,
                factor: 1.0,
                eps: 1e-5,
                center: 1000.0,
                spread: 1.0,
                version: 3,
            },
            7,
        );
    }
}

#[test]
fn forward_empty_x_gives_nan_statistics() {
    let a = attrs(DType::F32, true, false, false, 1e-3, 1.0);
    let out = run(
        "FusedBatchNormV3",
        &a,
        &[
            &host::<f32>(&[], &[0, 2, 2, 3]),
            &host(&[1.0f32; 3], &[3]),
            &host(&[0.0f32; 3], &[3]),
            &host::<f32>(&[], &[0]),
            &host::<f32>(&[], &[0]),
        ],
    );
    assert_eq!(out[0].shape(), &[0, 2, 2, 3]);
    for o in &out[1..5] {
        assert!(o.download::<f32>().unwrap().iter().all(|v| v.is_nan()));
    }
    assert_eq!(out[5].download::<f32>().unwrap(), vec![0.0]);
}

struct GradCase {
    shape: Vec<usize>,
    cf: bool,
    half: bool,
    training: bool,
    version: u8,
}

fn check_grad(case: &GradCase, seed: u64) {
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

#[test]
fn gradient_training_and_inference() {
    let mut seed = 200;
    for (shape, cf) in [
        (vec![2, 3, 5, 7], false),
        (vec![2, 7, 3, 5], true),
        (vec![1, 1, 1, 3], false),
        (vec![3, 5, 4, 129], false),
        (vec![2, 3, 2, 3, 4], true),
        (vec![4, 100, 100, 2], false),
        (vec![2, 30, 40, 40], false),
        // NHWC with C % 4 == 0: vec4 statistics and apply (one chunk, several chunks).
        (vec![3, 6, 7, 12], false),
        (vec![2, 20, 20, 256], false),
    ] {
        for training in [true, false] {
            for version in [1, 2, 3] {
                seed += 1;
                check_grad(
                    &GradCase {
                        shape: shape.clone(),
                        cf,
                        half: false,
                        training,
                        version,
                    },
                    seed,
                );
            }
        }
    }
}

#[test]
fn gradient_f16() {
    let mut seed = 300;
    for (shape, cf) in [
        (vec![2, 5, 3, 6], false),
        (vec![3, 4, 5, 7], true),
        (vec![3, 6, 7, 12], false),
        (vec![2, 20, 20, 256], false),
    ] {
        for training in [true, false] {
            seed += 1;
            check_grad(
                &GradCase {
                    shape: shape.clone(),
                    cf,
                    half: true,
                    training,
                    version: 3,
                },
                seed,
            );
        }
    }
}

/// FusedBatchNormV3 NHWC (epsilon 1e-3, data around `center` with `spread`) and its
/// gradient, one seed for both.
fn check_nhwc_v3(
    shape: &[usize],
    half: bool,
    training: bool,
    factor: f32,
    (center, spread): (f32, f32),
    seed: u64,
) {
    check_forward(
        &FwdCase {
            shape: shape.to_vec(),
            cf: false,
            half,
            training,
            factor,
            eps: 1e-3,
            center,
            spread,
            version: 3,
        },
        seed,
    );
    check_grad(
        &GradCase {
            shape: shape.to_vec(),
            cf: false,
            half,
            training,
            version: 3,
        },
        seed,
    );
}

/// float32 and float16 NHWC with C % 4 == 0 (the vec4 statistics: 16 rows per invocation,
/// four per loop iteration and a one-row tail), forward and gradient, with chunk counts and
/// row counts around those steps.
#[test]
fn vec4_statistics_row_loops() {
    let shapes: &[&[usize]] = &[
        // 16 quads per workgroup, 16 lanes: 5 chunks of 256 rows, the last of 98.
        &[2, 33, 17, 64],
        // 2 quads, 128 lanes: 2000 rows, 15-16 per invocation (main loop and tail).
        &[1, 40, 50, 8],
        // 33 quads: a second tile with one quad, lanes of 8.
        &[2, 9, 9, 132],
        // 3 quads (tc 4, one past C), 105 rows: one 4-row step or a tail only.
        &[3, 7, 5, 12],
        // One row.
        &[1, 1, 1, 4],
        // float16 with C % 8 == 0: eight channels per invocation. 32769 rows (past the
        // one-dispatch kernel): one octet (tc 1, 9 chunks of 4096 rows, the last of 1);
        // three octets (tc 4, one past C). Small ones (the one-dispatch kernel, and eight
        // channels per invocation with TFWGPU_NORM_ONEPASS=0): 33 octets (tc 32, a second
        // tile with one octet), 17 octets (15 idle lanes).
        &[1, 3, 10923, 8],
        &[1, 3, 10923, 24],
        &[2, 9, 9, 264],
        &[1, 5, 7, 136],
    ];
    let mut seed = 500;
    for &shape in shapes {
        let wide = shape.iter().product::<usize>() > 100_000;
        for (training, half) in [(true, false), (false, false), (true, true), (false, true)] {
            // The large shapes in float16 only; inference float16 only where the apply
            // takes eight channels.
            if (wide && !half) || (!training && half && !shape[3].is_multiple_of(8)) {
                continue;
            }
            seed += 1;
            check_nhwc_v3(shape, half, training, 1.0, (3.0, 2.0), seed);
        }
    }
}

/// Training batch norms in one dispatch (`onepass.wgsl`: NHWC, C % 4 == 0, at most 64 rows
/// per invocation), forward and gradient, float32 and float16, around its geometry: channel
/// quads per workgroup 8 (C >= 8192), 2 (C = 2052: 513 quads, the last workgroup half
/// empty), 1 with exactly 64 rows per invocation (32768 rows), one row, C = 4; and the first
/// shapes past its limits (32769 rows, C % 4 != 0) on the three-dispatch kernels.
#[test]
fn onepass_geometry() {
    let shapes: &[&[usize]] = &[
        // 2049 quads, tc 8: 257 workgroups, the last with one quad.
        &[1, 1, 5, 8196],
        // 513 quads, tc 2; 600 rows, 2-3 per invocation.
        &[1, 2, 300, 2052],
        // tc 1, 512 lanes, exactly 64 rows each (the main loop only).
        &[2, 128, 128, 4],
        // 32769 rows: one past the limit, the three-dispatch kernels.
        &[1, 3, 10923, 4],
        // 7 rows of 12 channels (tc 1, 3 workgroups); one row of 4.
        &[1, 1, 7, 12],
        &[1, 1, 1, 4],
        // C % 4 != 0: the scalar kernels.
        &[1, 3, 11, 6],
    ];
    let mut seed = 700;
    for &shape in shapes {
        for half in [false, true] {
            seed += 1;
            check_nhwc_v3(
                shape,
                half,
                true,
                if half { 1.0 } else { 0.3 },
                (2.0, 3.0),
                seed,
            );
        }
    }
}

/// Training statistics finalized by the last workgroup to arrive (`stats_last.wgsl`) with two
/// levels of arrival groups, on shapes past the one-dispatch kernel (more than 32768 rows):
/// 33000 rows of 33 quads (two tiles, the second with one quad, 8 lanes) are 258 chunks of 128
/// rows in float32, more than 4 per lane, so 16 groups of 17 chunks (the last of 3), then the
/// groups' records; in float16 129 chunks of 256 rows (11 groups of 12, the last of 9);
/// 70000 rows of 8 quads (32 lanes) in float32: 137 chunks of 512 rows, 12 groups of 12 (the
/// last of 5).
#[test]
fn last_arrival_groups() {
    let shapes: &[(&[usize], bool)] = &[
        (&[1, 3, 11000, 132], false),
        (&[1, 3, 11000, 132], true),
        (&[1, 2, 35000, 32], false),
    ];
    let mut seed = 900;
    for &(shape, half) in shapes {
        seed += 1;
        check_nhwc_v3(shape, half, true, 0.5, (50.0, 3.0), seed);
    }
}

/// A NaN or an infinity in a channel: TensorFlow's formulas give that channel a NaN (or
/// infinite) mean, a NaN variance and NaN outputs, and leave the other channels alone; the
/// gradient with a NaN dy gives that channel NaN sums and x_backprop. Known deviation (every
/// batch-norm kernel here): the Welford statistics give an infinite channel a NaN mean where
/// TensorFlow's sum / n gives +-inf (variance and outputs are NaN either way).
#[test]
fn nan_and_inf_stay_in_their_channel() {
    for (shape, half) in [
        (vec![2, 5, 7, 8], false),
        (vec![2, 5, 7, 8], true),
        (vec![1, 3, 10923, 4], false),
        (vec![2, 5, 7, 6], false),
    ] {
        let n: usize = shape.iter().product();
        let c = shape[3];
        let mut r = rng(41);
        let mut x: Vec<f32> = (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect();
        if half {
            x.iter_mut().for_each(|v| *v = rh(*v));
        }
        // Channel 0: a NaN in a middle row; channel 1: +inf in the first row.
        x[(n / c / 2) * c] = f32::NAN;
        x[1] = f32::INFINITY;
        let t = if half { DType::F16 } else { DType::F32 };
        let a = attrs(t, true, false, false, 1e-3, 1.0);
        let ones = host(&vec![1.0f32; c], &[c]);
        let zeros = host(&vec![0.0f32; c], &[c]);
        let xt = tensor_t(&x, &shape, half);
        let out = run(
            "FusedBatchNormV3",
            &a,
            &[
                &xt,
                &ones,
                &zeros,
                &host::<f32>(&[], &[0]),
                &host::<f32>(&[], &[0]),
            ],
        );
        let what = format!("{shape:?} half={half}");
        let y = down_t(&out[0], half);
        let (mean, var) = (down_f32(&out[3]), down_f32(&out[4]));
        assert!(mean[0].is_nan() && var[0].is_nan(), "{what}: channel 0");
        assert!(
            (mean[1] == f64::INFINITY || mean[1].is_nan()) && var[1].is_nan(),
            "{what}: channel 1 mean {} var {}",
            mean[1],
            var[1]
        );
        for ch in 2..c {
            assert!(mean[ch].is_finite() && var[ch].is_finite(), "{what}: {ch}");
        }
        for (i, v) in y.iter().enumerate() {
            assert_eq!(v.is_nan(), i % c < 2, "{what}: y[{i}] = {v}");
        }
        // Gradient: a NaN dy in channel 2.
        let mut dy: Vec<f32> = (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect();
        x[(n / c / 2) * c] = 0.5;
        x[1] = 0.25;
        dy[n - c + 2] = f32::NAN;
        if half {
            dy.iter_mut().for_each(|v| *v = rh(*v));
        }
        let ga = attrs(t, true, false, false, 1e-3, 1.0);
        let (dyt, xt) = (tensor_t(&dy, &shape, half), tensor_t(&x, &shape, half));
        let m = host(&vec![0.0f32; c], &[c]);
        let out = run(
            "FusedBatchNormGradV3",
            &ga,
            &[&dyt, &xt, &ones, &m, &ones, &host(&[0.0f32], &[])],
        );
        let dx = down_t(&out[0], half);
        let (ds, doff) = (down_f32(&out[1]), down_f32(&out[2]));
        for ch in 0..c {
            assert_eq!(ds[ch].is_nan(), ch == 2, "{what}: scale_backprop[{ch}]");
            assert_eq!(doff[ch].is_nan(), ch == 2, "{what}: offset_backprop[{ch}]");
        }
        for (i, v) in dx.iter().enumerate() {
            assert_eq!(v.is_nan(), i % c == 2, "{what}: x_backprop[{i}] = {v}");
        }
    }
}

#[test]
fn gradient_empty_x_gives_zero_scale_and_offset_gradients() {
    let a = attrs(DType::F32, true, false, false, 1e-3, 1.0);
    let e = host::<f32>(&[], &[2, 0, 3, 2]);
    let v = host(&[1.0f32, 2.0], &[2]);
    let out = run(
        "FusedBatchNormGradV3",
        &a,
        &[&e, &e, &v, &v, &v, &host(&[0.0f32], &[])],
    );
    assert_eq!(out[0].shape(), &[2, 0, 3, 2]);
    assert_eq!(out[1].download::<f32>().unwrap(), vec![0.0, 0.0]);
    assert_eq!(out[2].download::<f32>().unwrap(), vec![0.0, 0.0]);
}

#[test]
fn errors_name_the_op_and_inputs() {
    let a = attrs(DType::F32, false, false, false, 1e-3, 1.0);
    let x = host(&[0.0f32; 24], &[1, 2, 3, 4]);
    let v4 = host(&[1.0f32; 4], &[4]);
    let v3 = host(&[1.0f32; 3], &[3]);
    let e = try_run("FusedBatchNormV3", &a, &[&x, &v3, &v4, &v4, &v4])
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("FusedBatchNormV3") && e.to_string().contains("scale"),
        "{e}"
    );
    // Inference needs per-channel mean and variance.
    let e0 = host::<f32>(&[], &[0]);
    let e = try_run("FusedBatchNormV3", &a, &[&x, &v4, &v4, &e0, &e0])
        .err()
        .unwrap();
    assert!(e.to_string().contains("mean"), "{e}");
    // A 3-D x.
    let x3 = host(&[0.0f32; 24], &[2, 3, 4]);
    let e = try_run("FusedBatchNormV3", &a, &[&x3, &v4, &v4, &v4, &v4])
        .err()
        .unwrap();
    assert!(e.to_string().contains("[2,3,4]"), "{e}");
    // y_backprop and x must agree.
    let y = host(&[0.0f32; 20], &[1, 5, 1, 4]);
    let e = try_run("FusedBatchNormGradV2", &a, &[&y, &x, &v4, &v4, &v4])
        .err()
        .unwrap();
    assert!(e.to_string().contains("y_backprop"), "{e}");
    // f16 is not a FusedBatchNorm (V1) dtype; U must be float32.
    let xh = host(&f16s(&[0.0; 24]), &[1, 2, 3, 4]);
    assert!(try_run("FusedBatchNorm", &Attrs::new(), &[&xh, &v4, &v4, &v4, &v4]).is_err());
    let au = Attrs::new().with("U", AttrValue::Type(DType::F16));
    assert!(try_run("FusedBatchNormV3", &au, &[&x, &v4, &v4, &v4, &v4]).is_err());
}
