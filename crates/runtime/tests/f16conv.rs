//! The float16 conversions (`kernels::f16conv`): the self-test that decides whether an adapter's
//! hardware conversions (`pack2x16float` / `unpack2x16float`) may replace the exact software
//! ones, and the float16 kernels that use them (batch norm and max pool on vec4), which must
//! give the same bits either way.
//!
//! One test function: `TFWGPU_F16_CONVERSIONS` is read on every float16 kernel's recording, and
//! this binary switches it, so nothing may run in parallel with it.
mod common;
mod refs;

use common::*;
use refs::*;
use tfwgpu_runtime::kernels::f16conv::{
    f16_hardware_on, f16_native_on, native_test_on, self_test_on,
};
use tfwgpu_runtime::{AttrValue, Attrs, DType, HostTensor, Tensor, f16};

fn set_mode(mode: &str) {
    // SAFETY: this binary's only test is the only thread that reads or writes the variable.
    unsafe { std::env::set_var("TFWGPU_F16_CONVERSIONS", mode) };
}

/// Bits of a float16 tensor; every NaN as 0x7e00 (a NaN's sign and payload are not part of
/// what the conversions promise).
fn bits16(t: &Tensor) -> Vec<u16> {
    t.download::<f16>()
        .unwrap()
        .iter()
        .map(|h| {
            let b = h.to_bits();
            if (b & 0x7fff) > 0x7c00 { 0x7e00 } else { b }
        })
        .collect()
}

fn bits32(t: &Tensor) -> Vec<u32> {
    t.download::<f32>()
        .unwrap()
        .iter()
        .map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() })
        .collect()
}

/// Every output of the float16 kernels that convert, as bits: FusedBatchNormV3 forward
/// (training) and its gradient on NHWC tensors with C % 4 == 0 (the vec4 shaders) and
/// C = 6 (the scalar ones), MaxPool and MaxPoolGrad 3x3/2 SAME. Inputs include subnormal
/// halves, +-65504, infinities and NaN (in the pool tensors; the batch-norm tensor of
/// channel 5 gets an infinity, so its statistics and outputs are NaN).
fn outputs() -> Vec<Vec<u32>> {
    let mut r = rng(7);
    let mut all = vec![];
    for shape in [[2usize, 9, 7, 12], [1, 5, 3, 6], [3, 1, 1, 4]] {
        let n: usize = shape.iter().product();
        let c = shape[3];
        let mut x: Vec<f32> = rand_f32(&mut r, n, -3.0, 3.0);
        // Values whose products and sums land on subnormal halves and near the top of the
        // range are what distinguishes the conversions.
        for (i, v) in x.iter_mut().enumerate() {
            match i % 13 {
                3 => *v *= 1e-5,
                7 => *v = 6e-8 * (i % 5) as f32,
                _ => {}
            }
        }
        if c > 5 {
            x[5] = f32::INFINITY;
        }
        let dy: Vec<f32> = rand_f32(&mut r, n, -1.0, 1.0);
        let scale = rand_f32(&mut r, c, 0.5, 2.0);
        let offset = rand_f32(&mut r, c, -1.0, 1.0);
        let a = Attrs::new()
            .with("T", AttrValue::Type(DType::F16))
            .with("U", AttrValue::Type(DType::F32))
            .with("epsilon", AttrValue::Float(1e-3))
            .with("data_format", AttrValue::Str("NHWC".into()))
            .with("is_training", AttrValue::Bool(true));
        let xh = host(&f16s(&x), &shape);
        let e = host::<f32>(&[], &[0]);
        let fwd = run(
            "FusedBatchNormV3",
            &a,
            &[&xh, &host(&scale, &[c]), &host(&offset, &[c]), &e, &e],
        );
        all.push(bits16(&fwd[0]).into_iter().map(u32::from).collect());
        for t in &fwd[1..5] {
            all.push(bits32(t));
        }
        let m = fwd[3].download::<f32>().unwrap();
        let v = fwd[4].download::<f32>().unwrap();
        let grad = run(
            "FusedBatchNormGradV3",
            &a,
            &[
                &host(&f16s(&dy), &shape),
                &xh,
                &host(&scale, &[c]),
                &host(&m, &[c]),
                &host(&v, &[c]),
                &host(&[0.0f32], &[]),
            ],
        );
        all.push(bits16(&grad[0]).into_iter().map(u32::from).collect());
        all.push(bits32(&grad[1]));
        all.push(bits32(&grad[2]));
    }
    // Max pool: halves of every magnitude, NaN and infinities; the gradient sums up to four
    // grads per input (rounded to half after each addition).
    let shape = [2usize, 11, 9, 8];
    let n: usize = shape.iter().product();
    let mut x = f16s(&rand_f32(&mut r, n, -2.0, 2.0));
    for (i, v) in x.iter_mut().enumerate() {
        match i % 17 {
            2 => *v = f16::from_bits(0x0001 + (i as u16 % 0x3ff)),
            5 => *v = f16::from_bits(0x7bff),
            9 => *v = f16::INFINITY,
            11 => *v = f16::NEG_INFINITY,
            13 if i % 3 == 0 => *v = f16::NAN,
            _ => {}
        }
    }
    let pa = Attrs::new()
        .with("T", AttrValue::Type(DType::F16))
        .with("ksize", AttrValue::Ints(vec![1, 3, 3, 1]))
        .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("padding", AttrValue::Str("SAME".into()))
        .with("data_format", AttrValue::Str("NHWC".into()));
    let xh = host(&x, &shape);
    let y = run("MaxPool", &pa, &[&xh]);
    all.push(bits16(&y[0]).into_iter().map(u32::from).collect());
    let ys = y[0].shape().to_vec();
    let yn: usize = ys.iter().product();
    // Grads near 65504 / 4 and tiny ones: sums that overflow and subnormal sums.
    let g: Vec<f16> = (0..yn)
        .map(|i| match i % 5 {
            0 => f16::from_f32(20000.0),
            1 => f16::from_bits(0x0003),
            _ => f16::from_f32(r_f32(i)),
        })
        .collect();
    let yh = HostTensor::new(&y[0].download::<f16>().unwrap(), &ys).unwrap();
    let gr = run("MaxPoolGrad", &pa, &[&xh, &yh, &host(&g, &ys)]);
    all.push(bits16(&gr[0]).into_iter().map(u32::from).collect());
    all
}

fn r_f32(i: usize) -> f32 {
    ((i * 7919) % 2001) as f32 / 1000.0 - 1.0
}

#[test]
fn self_test_and_kernels_agree() {
    // The self-test rejects conversions that round toward zero, flush subnormal halves or
    // saturate at 65504: each differs from the exact conversions on many of its cases.
    for faulty in ["rtz", "ftz", "saturate"] {
        let (bad, first) = self_test_on(dev(), faulty).unwrap();
        eprintln!("self-test of {faulty}: {bad} cases differ (first {first})");
        assert!(
            bad > 100,
            "the self-test missed {faulty}: {bad} cases differ"
        );
    }
    let (bad, first) = self_test_on(dev(), "hardware").unwrap();
    eprintln!("self-test of the hardware conversions: {bad} cases differ (first {first})");
    assert!(self_test_on(dev(), "nonsense").is_err());

    set_mode("software");
    assert!(!f16_hardware_on(dev()).unwrap());
    let soft = outputs();

    set_mode("auto");
    let hw = f16_hardware_on(dev()).unwrap();
    assert_eq!(hw, bad == 0, "auto must follow the self-test");
    if hw {
        // The adapter's conversions passed: the kernels on them give the software bits.
        let hard = outputs();
        assert_eq!(soft.len(), hard.len());
        for (k, (s, h)) in soft.iter().zip(&hard).enumerate() {
            assert_eq!(s, h, "output {k}: hardware and software conversions differ");
        }
    }

    // Native half arithmetic (the pool kernels' TFWGPU_POOL_F16_NATIVE path) needs the
    // hardware conversions and its own self-test (native_half_self_test: exact on lavapipe).
    let native = f16_native_on(dev()).unwrap();
    let nbad = native_test_on(dev(), "native").unwrap().bad;
    assert_eq!(
        native,
        hw && nbad == 0,
        "f16_native must follow both self-tests"
    );

    set_mode("bogus");
    assert!(f16_hardware_on(dev()).is_err());
    set_mode("auto");
}

#[test]
fn native_half_self_test() {
    // lavapipe has SHADER_F16: its native half comparisons, max and sums are exact, and the
    // test rejects arithmetic that flushes half subnormals (in comparisons and max, and in sums).
    let t = native_test_on(dev(), "native").unwrap();
    eprintln!("native half self-test: {t:?}");
    assert_eq!(t.bad, 0, "native half comparisons differ: {t:?}");
    assert_eq!(t.add_bad, 0, "native half sums differ: {t:?}");
    let t = native_test_on(dev(), "ftz").unwrap();
    eprintln!("native half self-test of ftz: {t:?}");
    assert!(t.bad > 100, "the native self-test missed ftz: {t:?}");
    assert!(t.add_bad > 100, "the native sums test missed ftz: {t:?}");
    assert!(native_test_on(dev(), "nonsense").is_err());
}
