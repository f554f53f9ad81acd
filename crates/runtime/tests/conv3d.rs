//! Conv3D's depth taps summed in groups (`_tfwgpu_taps`, what the kernel does where the taps'
//! products do not fit one storage binding) against all taps in one pass: forward and input
//! gradient, float32 and float16, depth strides 1 and 2 with padding. The ungrouped kernels are
//! checked against TensorFlow's CPU in python/tests/test_ops_conv.py.
pub(crate) mod common;
use common::*;

use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, HostTensor, Tensor, f16};

fn attrs(dtype: DType, sd: i64, taps: Option<i64>) -> Attrs {
    let a = Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("strides", AttrValue::Ints(vec![1, sd, 1, 2, 1]))
        .with("padding", AttrValue::Str("SAME".into()));
    match taps {
        Some(t) => a.with("_tfwgpu_taps", AttrValue::Int(t)),
        None => a,
    }
}

fn upload(dtype: DType, v: &[f32], shape: &[usize]) -> Tensor {
    if dtype == DType::F16 {
        let h: Vec<_> = v.iter().map(|&x| f16::from_f32(x)).collect();
        dev().upload(&h, shape).unwrap()
    } else {
        dev().upload(v, shape).unwrap()
    }
}

fn download(dtype: DType, t: &Tensor) -> Vec<f32> {
    if dtype == DType::F16 {
        t.download::<f16>()
            .unwrap()
            .iter()
            .map(|&h| f16::to_f32(h))
            .collect()
    } else {
        t.download::<f32>().unwrap()
    }
}

#[test]
fn grouped_taps_match_one_pass() {
    let (n, d, h, w, c, k) = (2usize, 7usize, 5usize, 6usize, 3usize, 4usize);
    let kd = 5usize;
    let mut r = rng(31);
    let xv = rand_f32(&mut r, n * d * h * w * c, -1.0, 1.0);
    let fv = rand_f32(&mut r, kd * 3 * 3 * c * k, -1.0, 1.0);
    for dtype in [DType::F32, DType::F16] {
        for sd in [1i64, 2] {
            let x = upload(dtype, &xv, &[n, d, h, w, c]);
            let f = upload(dtype, &fv, &[kd, 3, 3, c, k]);
            let run = |taps: Option<i64>| {
                let y = &dev()
                    .run(
                        "Conv3D",
                        &attrs(dtype, sd, taps),
                        &[Arg::from(&x), Arg::from(&f)],
                    )
                    .unwrap()[0];
                let dy = upload(
                    dtype,
                    &download(dtype, y)
                        .iter()
                        .map(|v| v * 0.5 - 0.1)
                        .collect::<Vec<_>>(),
                    &y.desc().shape,
                );
                let sizes =
                    HostTensor::vec_i32(&[n as i32, d as i32, h as i32, w as i32, c as i32]);
                let dx = &dev()
                    .run(
                        "Conv3DBackpropInputV2",
                        &attrs(dtype, sd, taps),
                        &[Arg::from(&sizes), Arg::from(&f), Arg::from(&dy)],
                    )
                    .unwrap()[0];
                (download(dtype, y), download(dtype, dx))
            };
            let (y, dx) = run(None);
            for taps in [1, 2] {
                let (yg, dxg) = run(Some(taps));
                // float32: the same sums, grouped (a few ulps of the terms' magnitude, ~27 * 3
                // terms of |x f| <= 1); float16: each tap rounded to half in one pass, the
                // groups summed in float32 and rounded once: within a few half roundings of
                // values up to ~10.
                let (rtol, atol) = if dtype == DType::F16 {
                    (1e-2, 3e-2)
                } else {
                    (1e-5, 1e-4)
                };
                let what = format!("{dtype:?} sd {sd} taps {taps}");
                assert_close(&yg, &y, rtol, atol, &format!("forward {what}"));
                assert_close(&dxg, &dx, rtol, atol, &format!("input gradient {what}"));
            }
        }
    }
}
