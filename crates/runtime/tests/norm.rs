//! norm family: FusedBatchNorm / V2 / V3 and FusedBatchNormGrad / V2 / V3 against f64
//! references of TensorFlow's CPU formulas, training and inference, NHWC / NCHW / 5-D, f32
//! and f16, with error bounds from the kernels' arithmetic: the per-channel reductions are
//! trees (at most 16 serial steps per invocation, then log2 levels), so their error is bounded
//! by K * eps * sum|terms| with K = 16 + log2(n) + a few operations.
mod common;
mod norm_check;
mod refs;

use norm_check::*;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType};

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
