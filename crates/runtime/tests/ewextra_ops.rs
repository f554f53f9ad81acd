//! The activations and elementwise ops added after the first round: Sin, Cos (exact argument
//! reduction), Relu6, Elu, Selu, LeakyRelu, Softsign, IsNan, IsInf, IsFinite, their gradients, and
//! ClipByValue, against CPU references of TensorFlow's formulas.
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, Error, HostTensor, f16};

const SHAPES: &[&[usize]] = &[&[7], &[129], &[0], &[], &[3, 5, 7], &[1, 1029]];

const SELU_SCALE: f32 = 1.050_701;
const SELU_SCALE_ALPHA: f32 = 1.758_099_3;

/// Random values with special ones mixed in.
fn sample(r: &mut rand::rngs::StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.0,
        -1e-30,
        1e-30,
    ];
    (0..n)
        .map(|i| {
            if i % 11 == 5 {
                specials[(i / 11) % specials.len()]
            } else {
                r.random_range(lo..hi)
            }
        })
        .collect()
}

fn run_attrs1<T: tfwgpu_runtime::Element>(
    op: &str,
    attrs: &Attrs,
    x: &[T],
    shape: &[usize],
) -> Vec<T> {
    let out = run(op, attrs, &[&host(x, shape)]);
    assert_eq!(out[0].shape(), shape, "{op}: output shape");
    out[0].download::<T>().unwrap()
}

#[test]
fn sin_cos_f32_accurate_reduction() {
    let mut r = rng(41);
    let mut xs: Vec<f32> = rand_f32(&mut r, 300, -10.0, 10.0);
    // Every exponent, both signs.
    for e in -30..128 {
        for _ in 0..4 {
            let m: f32 = r.random_range(1.0..2.0);
            let v = m * 2f32.powi(e);
            xs.push(if r.random_bool(0.5) { v } else { -v });
        }
    }
    // Near multiples of pi/2, where the reduction cancels.
    for k in [
        1i64, 2, 3, 4, 7, 100, 355, 1000, 12345, 102_944, 1_000_000, 16_000_000,
    ] {
        let v = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
        xs.extend([
            v,
            f32::from_bits(v.to_bits() + 1),
            f32::from_bits(v.to_bits() - 1),
        ]);
    }
    xs.extend([
        0.0,
        -0.0,
        f32::MAX,
        -f32::MAX,
        1e-40,
        std::f32::consts::FRAC_PI_4,
        f32::from_bits(std::f32::consts::FRAC_PI_4.to_bits() - 1),
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    let n = xs.len();
    for (op, f) in [("Sin", f64::sin as fn(f64) -> f64), ("Cos", f64::cos)] {
        let got = run1(op, &xs, &[n]);
        let want: Vec<f64> = xs.iter().map(|&x| f(x as f64)).collect();
        assert_ulps(&to_f64(&got), &want, 3.0, false, op);
        if op == "Sin" {
            assert_eq!(got[n - 9].to_bits(), (-0.0f32).to_bits(), "Sin(-0)");
        }
    }
    let got = run1("Sin", &[] as &[f32], &[0, 3]);
    assert!(got.is_empty());
    // Tan: sin / cos of the reduced argument (or -cos / sin), each within 3 ulp, then one
    // rounding of the quotient: 7 ulp; odd, NaN for the infinities.
    let got = run1("Tan", &xs, &[n]);
    let want: Vec<f64> = xs.iter().map(|&x| (x as f64).tan()).collect();
    assert_ulps(&to_f64(&got), &want, 7.0, false, "Tan");
    assert_eq!(got[n - 9].to_bits(), (-0.0f32).to_bits(), "Tan(-0)");
}

#[test]
fn sin_cos_f16() {
    let mut r = rng(42);
    let xs = f16s(&rand_f32(&mut r, 257, -60000.0, 60000.0));
    let mut xs2 = f16s(&rand_f32(&mut r, 129, -8.0, 8.0));
    xs2.extend([f16::INFINITY, f16::NAN, f16::NEG_ZERO]);
    for x in [xs, xs2] {
        for (op, f) in [("Sin", f64::sin as fn(f64) -> f64), ("Cos", f64::cos)] {
            let got = run1(op, &x, &[x.len()]);
            let want: Vec<f64> = x.iter().map(|v| f(v.to_f64())).collect();
            // f32 within a few ulp, rounded once to f16.
            assert_ulps(&f16_to_f64(&got), &want, 0.51, true, op);
        }
    }
}

#[allow(clippy::manual_clamp)] // NaN must pass through, as TensorFlow's
fn relu6(x: f32) -> f32 {
    if x.is_nan() {
        x
    } else if x < 0.0 {
        0.0
    } else if x > 6.0 {
        6.0
    } else {
        x
    }
}

fn leaky(x: f32, a: f32) -> f32 {
    if x > 0.0 { x } else { x * a }
}

#[test]
fn activations_f32() {
    let mut r = rng(43);
    for &shape in SHAPES {
        let n: usize = shape.iter().product();
        let x = sample(&mut r, n, -10.0, 10.0);
        let what = |op: &str| format!("{op} {shape:?}");
        assert_same_f32(
            &run1("Relu6", &x, shape),
            &x.iter().map(|&v| relu6(v)).collect::<Vec<_>>(),
            &what("Relu6"),
        );
        for alpha in [0.2f32, 0.01, 1.5, -0.3] {
            let attrs = Attrs::new().with("alpha", AttrValue::Float(alpha));
            let got = run_attrs1("LeakyRelu", &attrs, &x, shape);
            let want: Vec<f32> = x.iter().map(|&v| leaky(v, alpha)).collect();
            assert_same_f32(&got, &want, &what("LeakyRelu"));
        }
        // Default alpha 0.2.
        let got = run_attrs1("LeakyRelu", &Attrs::new(), &x, shape);
        assert_same_f32(
            &got,
            &x.iter().map(|&v| leaky(v, 0.2)).collect::<Vec<_>>(),
            &what("LeakyRelu default"),
        );
        // Softsign: one division (Vulkan allows 2.5 ulp).
        let got = run1("Softsign", &x, shape);
        let want: Vec<f64> = x
            .iter()
            .map(|&v| v as f64 / (v.abs() + 1.0) as f64)
            .collect();
        assert_ulps(&to_f64(&got), &want, 2.5, false, &what("Softsign"));
        // Elu / Selu: exp(x) within a few ulp, then - 1 (absolute error a few ulp of 1).
        for op in ["Elu", "Selu"] {
            let got = run1(op, &x, shape);
            let (sa, s) = if op == "Elu" {
                (1.0, 1.0)
            } else {
                (SELU_SCALE_ALPHA as f64, SELU_SCALE as f64)
            };
            let want: Vec<f64> = x
                .iter()
                .map(|&v| {
                    if v < 0.0 {
                        sa * ((v as f64).exp() - 1.0)
                    } else {
                        s * v as f64
                    }
                })
                .collect();
            let tol: Vec<f64> = want
                .iter()
                .map(|w| 2.0 * ulp(*w, 23, -126) + sa * 4.0 * EPS)
                .collect();
            assert_within(&to_f64(&got), &want, &tol, &what(op));
        }
        let got: Vec<u8> = run("IsNan", &Attrs::new(), &[&host(&x, shape)])[0]
            .download()
            .unwrap();
        assert_eq!(
            got,
            x.iter().map(|v| v.is_nan() as u8).collect::<Vec<_>>(),
            "IsNan"
        );
        let out = run("IsFinite", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(out[0].dtype(), DType::Bool);
        assert_eq!(
            download_bools(&out[0]),
            x.iter().map(|v| v.is_finite()).collect::<Vec<_>>(),
            "IsFinite"
        );
        let out = run("IsInf", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(
            download_bools(&out[0]),
            x.iter().map(|v| v.is_infinite()).collect::<Vec<_>>(),
            "IsInf"
        );
    }
}

#[test]
fn activations_f16() {
    let mut r = rng(44);
    for &shape in SHAPES {
        let n: usize = shape.iter().product();
        let x = f16s(&sample(&mut r, n, -10.0, 10.0));
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let what = |op: &str| format!("{op} f16 {shape:?}");
        let got = run1("Relu6", &x, shape);
        assert_same_f16(
            &got,
            &f16s(&xf.iter().map(|&v| relu6(v)).collect::<Vec<_>>()),
            &what("Relu6"),
        );
        let attrs = Attrs::new().with("alpha", AttrValue::Float(0.1));
        let got = run_attrs1("LeakyRelu", &attrs, &x, shape);
        // alpha is rounded to half, the product rounded once.
        let a = rh(0.1);
        assert_same_f16(
            &got,
            &f16s(&xf.iter().map(|&v| leaky(v, a)).collect::<Vec<_>>()),
            &what("LeakyRelu"),
        );
        let got = run1("Softsign", &x, shape);
        let want: Vec<f16> = xf
            .iter()
            .map(|&v| f16::from_f32(v / rh(v.abs() + 1.0)))
            .collect();
        assert_same_f16(&got, &want, &what("Softsign"));
        // Elu: half(exp(x)) - 1 in half; exp within a few f32 ulp may round to the other
        // side of an f16 tie: one f16 ulp of exp(x), then one more rounding.
        for op in ["Elu", "Selu"] {
            let got = run1(op, &x, shape);
            let want: Vec<f64> = xf
                .iter()
                .map(|&v| {
                    if op == "Elu" {
                        if v < 0.0 {
                            (rh((v as f64).exp() as f32) - 1.0) as f64
                        } else {
                            v as f64
                        }
                    } else if v < 0.0 {
                        rh(SELU_SCALE_ALPHA) as f64 * rh(rh((v as f64).exp() as f32) - 1.0) as f64
                    } else {
                        rh(SELU_SCALE) as f64 * v as f64
                    }
                })
                .collect();
            let tol: Vec<f64> = want
                .iter()
                .map(|w| ulp(*w, 10, -14) + 2.0 * 2f64.powi(-11))
                .collect();
            assert_within(&f16_to_f64(&got), &want, &tol, &what(op));
        }
        let out = run("IsNan", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(
            download_bools(&out[0]),
            x.iter().map(|v| v.is_nan()).collect::<Vec<_>>(),
            "IsNan f16"
        );
        let out = run("IsFinite", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(
            download_bools(&out[0]),
            x.iter().map(|v| v.is_finite()).collect::<Vec<_>>(),
            "IsFinite f16"
        );
        let out = run("IsInf", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(
            download_bools(&out[0]),
            x.iter().map(|v| v.is_infinite()).collect::<Vec<_>>(),
            "IsInf f16"
        );
    }
}

/// TensorFlow's gradient formulas in f32, with `rt` rounding intermediates (f16: to half).
fn grad_ref(op: &str, g: f32, y: f32, alpha: f32, rt: fn(f32) -> f32) -> f32 {
    match op {
        "Relu6Grad" => g * if y > 0.0 && y < 6.0 { 1.0 } else { 0.0 },
        "EluGrad" => {
            if y < 0.0 {
                rt(y + 1.0) * g
            } else {
                g
            }
        }
        "SeluGrad" => {
            if y < 0.0 {
                g * rt(y + rt(SELU_SCALE_ALPHA))
            } else {
                g * rt(SELU_SCALE)
            }
        }
        "LeakyReluGrad" => {
            if y > 0.0 {
                g
            } else {
                g * rt(alpha)
            }
        }
        "SoftsignGrad" => {
            let d = rt(y.abs() + 1.0);
            g / rt(d * d)
        }
        _ => unreachable!(),
    }
}

#[test]
fn activation_gradients() {
    let mut r = rng(45);
    let ops = [
        "Relu6Grad",
        "EluGrad",
        "SeluGrad",
        "LeakyReluGrad",
        "SoftsignGrad",
    ];
    for &shape in SHAPES {
        let n: usize = shape.iter().product();
        let g = sample(&mut r, n, -3.0, 3.0);
        let y = sample(&mut r, n, -8.0, 8.0);
        for op in ops {
            let attrs = Attrs::new().with("alpha", AttrValue::Float(0.3));
            let what = format!("{op} {shape:?}");
            let out = run(op, &attrs, &[&host(&g, shape), &host(&y, shape)]);
            assert_eq!(out[0].shape(), shape);
            let got: Vec<f32> = out[0].download().unwrap();
            let want: Vec<f32> = g
                .iter()
                .zip(&y)
                .map(|(&a, &b)| grad_ref(op, a, b, 0.3, |v| v))
                .collect();
            if op == "SoftsignGrad" {
                assert_ulps(&to_f64(&got), &to_f64(&want), 2.5, false, &what);
            } else {
                assert_same_f32(&got, &want, &what);
            }
            let (gh, yh) = (f16s(&g), f16s(&y));
            let out = run(op, &attrs, &[&host(&gh, shape), &host(&yh, shape)]);
            let got: Vec<f16> = out[0].download().unwrap();
            let want: Vec<f16> = gh
                .iter()
                .zip(&yh)
                .map(|(a, b)| f16::from_f32(grad_ref(op, a.to_f32(), b.to_f32(), 0.3, rh)))
                .collect();
            assert_same_f16(&got, &want, &format!("{what} f16"));
        }
    }
    // Shapes must match (no broadcasting).
    let e = try_run(
        "EluGrad",
        &Attrs::new(),
        &[&host(&[1f32; 6], &[2, 3]), &host(&[1f32; 3], &[3])],
    );
    assert!(matches!(e, Err(Error::InvalidArgument(_))), "{:?}", e.err());
}

fn clip(v: f32, lo: f32, hi: f32) -> f32 {
    // std::max(std::min(v, hi), lo)
    let m = if hi < v { hi } else { v };
    if m < lo { lo } else { m }
}

type ClipCase<'a> = (
    HostTensor,
    HostTensor,
    Box<dyn Fn(usize) -> (f32, f32) + 'a>,
);

#[test]
fn clip_by_value() {
    let mut r = rng(46);
    for &shape in SHAPES {
        let n: usize = shape.iter().product();
        let t = sample(&mut r, n, -5.0, 5.0);
        let lo_full = sample(&mut r, n, -4.0, 0.0);
        let hi_full = rand_f32(&mut r, n, 0.0, 4.0);
        let cases: [ClipCase<'_>; 4] = [
            (
                host(&[-1.5f32], &[]),
                host(&[2.0f32], &[]),
                Box::new(|_| (-1.5, 2.0)),
            ),
            (
                host(&lo_full, shape),
                host(&[1.0f32], &[]),
                Box::new(|i| (lo_full[i], 1.0)),
            ),
            (
                host(&[-1.0f32], &[]),
                host(&hi_full, shape),
                Box::new(|i| (-1.0, hi_full[i])),
            ),
            (
                host(&lo_full, shape),
                host(&hi_full, shape),
                Box::new(|i| (lo_full[i], hi_full[i])),
            ),
        ];
        for (k, (lo, hi, f)) in cases.iter().enumerate() {
            let out = run("ClipByValue", &Attrs::new(), &[&host(&t, shape), lo, hi]);
            assert_eq!(out[0].shape(), shape);
            let got: Vec<f32> = out[0].download().unwrap();
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let (a, b) = f(i);
                    clip(t[i], a, b)
                })
                .collect();
            assert_same_f32(&got, &want, &format!("ClipByValue case {k} {shape:?}"));
        }
        // f16, scalar bounds.
        let th = f16s(&t);
        let out = run(
            "ClipByValue",
            &Attrs::new(),
            &[
                &host(&th, shape),
                &host(&[f16::from_f32(-0.5)], &[]),
                &host(&[f16::from_f32(0.75)], &[]),
            ],
        );
        let got: Vec<f16> = out[0].download().unwrap();
        let want = f16s(
            &th.iter()
                .map(|v| clip(v.to_f32(), -0.5, 0.75))
                .collect::<Vec<_>>(),
        );
        assert_same_f16(&got, &want, "ClipByValue f16");
        // int64, full bounds.
        let ti: Vec<i64> = (0..n)
            .map(|_| r.random_range(-1i64 << 40..1i64 << 40))
            .collect();
        let li: Vec<i64> = (0..n).map(|_| r.random_range(-1i64 << 40..0)).collect();
        let hi_: Vec<i64> = (0..n).map(|_| r.random_range(0..1i64 << 40)).collect();
        let out = run(
            "ClipByValue",
            &Attrs::new(),
            &[&host(&ti, shape), &host(&li, shape), &host(&hi_, shape)],
        );
        let got: Vec<i64> = out[0].download().unwrap();
        let want: Vec<i64> = (0..n).map(|i| ti[i].min(hi_[i]).max(li[i])).collect();
        assert_eq!(got, want, "ClipByValue i64");
    }
    // NaN bounds leave t unchanged.
    let out = run(
        "ClipByValue",
        &Attrs::new(),
        &[
            &host(&[1.0f32, f32::NAN, -3.0], &[3]),
            &host(&[f32::NAN], &[]),
            &host(&[f32::NAN], &[]),
        ],
    );
    let got: Vec<f32> = out[0].download().unwrap();
    assert_same_f32(&got, &[1.0, f32::NAN, -3.0], "ClipByValue NaN bounds");
    // Bounds of another shape are an error (no broadcasting).
    let e = try_run(
        "ClipByValue",
        &Attrs::new(),
        &[
            &host(&[1f32; 6], &[2, 3]),
            &host(&[0f32; 3], &[3]),
            &host(&[1f32], &[]),
        ],
    );
    assert!(matches!(e, Err(Error::InvalidArgument(_))), "{:?}", e.err());
}
