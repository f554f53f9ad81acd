mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, HostTensor, f16};

// ---------------------------------------------------------------- helpers

fn tf_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b {
        b
    } else {
        a
    }
}

fn tf_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if b < a {
        b
    } else {
        a
    }
}

/// TensorFlow's int32 Div (truncating, INT_MIN / -1 wraps); x / 0 is 0 here (TensorFlow
/// raises an error instead, which a GPU kernel cannot).
fn tf_div_i32(a: i32, b: i32) -> i32 {
    if b == 0 { 0 } else { a.wrapping_div(b) }
}

/// Shape pairs: same shapes, scalars, empty tensors, and broadcasting corners.
const SHAPES: &[(&[usize], &[usize])] = &[
    (&[7], &[7]),
    (&[129], &[129]),
    (&[3, 43], &[3, 43]),
    (&[0], &[0]),
    (&[], &[]),
    (&[3, 1], &[1, 4]),
    (&[], &[5]),
    (&[5], &[]),
    (&[129], &[]),
    (&[2, 1, 3], &[4, 1]),
    (&[4, 1], &[2, 1, 3]),
    (&[0, 3], &[1, 3]),
    (&[1], &[0]),
    (&[2, 3, 4], &[3, 1]),
    (&[7, 1, 129], &[1, 5, 1]),
    (&[6, 5, 4], &[5, 4]),
    (&[129, 7], &[7]),
    (&[1, 129], &[129, 1]),
    (&[1, 1, 1], &[1]),
    (&[3, 1, 1, 5], &[1, 4, 1, 1]),
    // vec4 loads (32-bit dtypes): same shapes with 4k elements (one vec4 per invocation left
    // over: 12 elements), a row vector on either side, a broadcast that merges to [6, 8].
    (&[5, 12], &[5, 12]),
    (&[3, 4], &[3, 4]),
    (&[1028], &[1028]),
    (&[6, 8], &[8]),
    (&[8], &[6, 8]),
    (&[9, 16], &[1, 16]),
    (&[2, 3, 8], &[8]),
    // float16 vec4 loads (8 halves each): 129 vec4 (the last invocation takes one), a row
    // vector of 24 on either side.
    (&[1032], &[1032]),
    (&[5, 24], &[24]),
    (&[24], &[5, 24]),
    // Eight dimensions that cannot merge: the largest rank the kernel takes.
    (&[2, 1, 2, 1, 2, 1, 2, 1], &[1, 2, 1, 2, 1, 2, 1, 2]),
];

const BINARY_OPS: &[&str] = &[
    "AddV2", "Sub", "Mul", "RealDiv", "Div", "Maximum", "Minimum",
];

// ---------------------------------------------------------------- binary ops

/// The float32 reference of a `BINARY_OPS` op (RealDiv and Div: x / y).
fn binary_f32_ref(op: &str) -> fn(f32, f32) -> f32 {
    match op {
        "AddV2" => |x, y| x + y,
        "Sub" => |x, y| x - y,
        "Mul" => |x, y| x * y,
        "Maximum" => tf_max,
        "Minimum" => tf_min,
        _ => |x, y| x / y,
    }
}

#[test]
fn binary_f32_broadcasting() {
    let mut r = rng(1);
    for &(sa, sb) in SHAPES {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = rand_f32(&mut r, na, -10.0, 10.0);
        let b = rand_f32(&mut r, nb, -10.0, 10.0);
        for &op in BINARY_OPS {
            let what = format!("{op} f32 {sa:?} {sb:?}");
            let (shape, got) = run2(op, &a, sa, &b, sb);
            let f = binary_f32_ref(op);
            let (want_shape, want) = bcast_ref(&a, sa, &b, sb, f);
            assert_eq!(shape, want_shape, "{what}: shape");
            if op.contains("Div") {
                // WGSL/Vulkan division: 2.5 ULP.
                let (_, exact) = bcast_ref(&a, sa, &b, sb, |x, y| x as f64 / y as f64);
                assert_ulps(&to_f64(&got), &exact, 2.5, false, &what);
            } else {
                assert_same_f32(&got, &want, &what);
            }
        }
    }
}

#[test]
fn binary_i32_broadcasting_and_wrapping() {
    let mut r = rng(2);
    for &(sa, sb) in SHAPES {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = rand_i32(&mut r, na, i32::MIN, i32::MAX);
        let b_full = rand_i32(&mut r, nb, i32::MIN, i32::MAX);
        let b_small = rand_i32(&mut r, nb, -50, 51);
        for &op in BINARY_OPS {
            if op == "RealDiv" {
                continue;
            }
            let what = format!("{op} i32 {sa:?} {sb:?}");
            let b = if op == "Div" { &b_small } else { &b_full };
            let (shape, got) = run2(op, &a, sa, b, sb);
            let f: fn(i32, i32) -> i32 = match op {
                "AddV2" => i32::wrapping_add,
                "Sub" => i32::wrapping_sub,
                "Mul" => i32::wrapping_mul,
                "Maximum" => |x, y| x.max(y),
                "Minimum" => |x, y| x.min(y),
                _ => tf_div_i32,
            };
            let (want_shape, want) = bcast_ref(&a, sa, b, sb, f);
            assert_eq!(shape, want_shape, "{what}: shape");
            assert_eq!(got, want, "{what}");
        }
    }
}

#[test]
fn binary_f16_broadcasting() {
    let mut r = rng(3);
    for &(sa, sb) in SHAPES {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = f16s(&rand_f32(&mut r, na, -10.0, 10.0));
        let b = f16s(&rand_f32(&mut r, nb, -10.0, 10.0));
        for &op in BINARY_OPS {
            let what = format!("{op} f16 {sa:?} {sb:?}");
            let (shape, got) = run2(op, &a, sa, &b, sb);
            // Eigen's half arithmetic: compute in f32, round to nearest even.
            let f = binary_f32_ref(op);
            let (want_shape, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
                f16::from_f32(f(x.to_f32(), y.to_f32()))
            });
            assert_eq!(shape, want_shape, "{what}: shape");
            if op.contains("Div") {
                // An f32 quotient within 2.5 f32 ULP, rounded to f16: within one f16 ULP.
                let (_, exact) = bcast_ref(&a, sa, &b, sb, |x, y| x.to_f64() / y.to_f64());
                assert_ulps(&f16_to_f64(&got), &exact, 1.0, true, &what);
            } else {
                assert_same_f16(&got, &want, &what);
            }
        }
    }
}

/// float16 binary ops on the vec4 path (8 halves per load: n and the row length multiples
/// of 8) and the word path (odd n) with NaN, infinities, the overflow of 65504 + 65504 (to
/// inf, as Eigen's half rounds the f32 result), subnormal sums and -0: bit for bit (NaN: any
/// NaN) against f32 arithmetic rounded once.
#[test]
fn binary_f16_specials_on_both_paths() {
    let specials: Vec<f32> = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        65504.0,
        -65504.0,
        6.0e-8,
        -6.0e-8,
        0.0,
        -0.0,
        1.0,
        -2.5,
        1.0e-5,
        3.0e-5,
        2049.0,
        0.333,
        100.0,
    ];
    let n = specials.len() * specials.len();
    let a: Vec<f32> = (0..n).map(|i| specials[i / specials.len()]).collect();
    let b: Vec<f32> = (0..n).map(|i| specials[i % specials.len()]).collect();
    for len in [n, n - 1] {
        let (a, b) = (f16s(&a[..len]), f16s(&b[..len]));
        for &op in BINARY_OPS {
            let f: fn(f32, f32) -> f32 = match op {
                "AddV2" => |x, y| x + y,
                "Sub" => |x, y| x - y,
                "Mul" => |x, y| x * y,
                "Maximum" => tf_max,
                "Minimum" => tf_min,
                _ => continue,
            };
            let (_, got) = run2(op, &a, &[len], &b, &[len]);
            let want: Vec<f16> = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f16::from_f32(f(x.to_f32(), y.to_f32())))
                .collect();
            assert_same_f16(&got, &want, &format!("{op} f16 specials, n = {len}"));
        }
    }
}

#[test]
fn binary_aliases_and_odd_lengths() {
    // "Add" and "Div" are the same kernels as AddV2 and RealDiv for floats.
    for n in [1usize, 2, 3, 5, 257] {
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..n).map(|i| 1.0 + i as f32).collect();
        let (_, got) = run2("Add", &a, &[n], &b, &[n]);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_same_f32(&got, &want, "Add");
        let (_, got) = run2("Div", &a, &[n], &b, &[n]);
        let exact: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| x as f64 / y as f64)
            .collect();
        assert_ulps(&to_f64(&got), &exact, 2.5, false, "Div f32");
        // Odd f16 lengths: the last word holds one element.
        let (_, got) = run2("AddV2", &f16s(&a), &[n], &f16s(&b), &[n]);
        let want: Vec<f16> = f16s(&a)
            .iter()
            .zip(f16s(&b))
            .map(|(x, y)| f16::from_f32(x.to_f32() + y.to_f32()))
            .collect();
        assert_same_f16(&got, &want, "AddV2 f16 odd length");
    }
}

#[test]
fn binary_float_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let a = [
        nan, 1.0, nan, inf, -inf, inf, 0.0, -0.0, 1.0, -1.0, 0.0, 3.0, -inf, 5.0,
    ];
    let b = [
        1.0, nan, nan, -inf, -inf, inf, 0.0, 0.0, 0.0, 0.0, -0.0, inf, 2.0, -inf,
    ];
    let n = a.len();
    for op in ["AddV2", "Sub", "Mul", "Maximum", "Minimum"] {
        let (_, got) = run2(op, &a, &[n], &b, &[n]);
        let want: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| match op {
                "AddV2" => x + y,
                "Sub" => x - y,
                "Mul" => x * y,
                "Maximum" => tf_max(x, y),
                _ => tf_min(x, y),
            })
            .collect();
        assert_same_f32(&got, &want, op);
    }
    // Maximum/Minimum propagate NaN from either side, also broadcast.
    let (_, got) = run2("Maximum", &[nan], &[], &[1.0f32, -1.0, inf], &[3]);
    assert!(got.iter().all(|x| x.is_nan()), "{got:?}");
    let (_, got) = run2("Minimum", &[1.0f32, nan, -inf], &[3], &[nan], &[]);
    assert!(got.iter().all(|x| x.is_nan()), "{got:?}");
    // Division: x/0 = +-inf, 0/0 = NaN, inf/inf = NaN, x/inf = 0.
    let a = [1.0f32, -1.0, 0.0, inf, 5.0, -5.0, nan];
    let b = [0.0f32, 0.0, 0.0, inf, inf, inf, 2.0];
    for op in ["RealDiv", "Div"] {
        let (_, got) = run2(op, &a, &[7], &b, &[7]);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x / y).collect();
        assert_same_f32(&got, &want, op);
    }
    // f16: overflow of the f32 result rounds to inf; NaN propagates through Maximum.
    let x = f16s(&[60000.0, 1.0, f32::NAN]);
    let y = f16s(&[60000.0, f32::NAN, 2.0]);
    let (_, got) = run2("AddV2", &x, &[3], &y, &[3]);
    assert_eq!(got[0], f16::INFINITY);
    assert!(got[1].is_nan() && got[2].is_nan());
    let (_, got) = run2("Maximum", &x, &[3], &y, &[3]);
    assert_eq!(got[0], f16::from_f32(60000.0));
    assert!(got[1].is_nan() && got[2].is_nan());
}

/// A random f32 with a uniform mantissa and an exponent in `exps` (both signs when `signed`).
fn wide_f32(r: &mut rand::rngs::StdRng, exps: std::ops::Range<i32>, signed: bool) -> f32 {
    let m = 1.0 + r.random_range(0.0f64..1.0);
    let s = if signed && r.random() { -1.0 } else { 1.0 };
    (s * m * 2f64.powi(r.random_range(exps))) as f32
}

#[test]
fn division_precision_wide_range() {
    let mut r = rng(8);
    let n = 65536;
    let a: Vec<f32> = (0..n).map(|_| wide_f32(&mut r, -60..61, true)).collect();
    let b: Vec<f32> = (0..n).map(|_| wide_f32(&mut r, -60..61, true)).collect();
    let (_, got) = run2("RealDiv", &a, &[n], &b, &[n]);
    let exact: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| x as f64 / y as f64)
        .collect();
    assert_ulps(&to_f64(&got), &exact, 2.5, false, "RealDiv wide range");
}

#[test]
fn log_and_sqrt_every_exponent() {
    // Every binade from the smallest subnormal to the largest normal.
    let mut r = rng(9);
    let n = 65536;
    let x: Vec<f32> = (0..n)
        .map(|i| {
            if i % 5 == 0 {
                // subnormals, exactly representable
                f32::from_bits(r.random_range(1u32..0x80_0000))
            } else {
                wide_f32(&mut r, -126..128, false)
            }
        })
        .collect();
    for op in ["Log", "Sqrt"] {
        let got = run1(op, &x, &[n]);
        let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v as f64)).collect();
        assert_ulps(&to_f64(&got), &want, unary_ulps(op), false, op);
    }
}

#[test]
fn binary_i32_edge_cases() {
    let min = i32::MIN;
    let max = i32::MAX;
    let a = [max, min, max, min, 7, -7, 7, -7, min, 5, -5, 0, 1 << 20];
    let b = [1, -1, max, min, 2, 2, -2, -2, -1, 0, 0, 0, 1 << 12];
    let n = a.len();
    type I32Op = fn(i32, i32) -> i32;
    let cases: [(&str, I32Op); 6] = [
        ("AddV2", i32::wrapping_add),
        ("Sub", i32::wrapping_sub),
        ("Mul", i32::wrapping_mul),
        ("Div", tf_div_i32),
        ("Maximum", |x, y| x.max(y)),
        ("Minimum", |x, y| x.min(y)),
    ];
    for (op, f) in cases {
        let (_, got) = run2(op, &a, &[n], &b, &[n]);
        let want: Vec<i32> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        assert_eq!(got, want, "{op}");
    }
    // Spelled out: overflow wraps, division truncates toward zero.
    let (_, got) = run2("AddV2", &[max], &[], &[1], &[]);
    assert_eq!(got, vec![min]);
    let (_, got) = run2("Mul", &[65536], &[], &[65536 + 3], &[]);
    assert_eq!(got, vec![3 << 16]);
    let (_, got) = run2(
        "Div",
        &[7, -7, 7, -7, min, 9],
        &[6],
        &[2, 2, -2, -2, -1, 0],
        &[6],
    );
    assert_eq!(got, vec![3, -3, -3, 3, min, 0]);
}

#[test]
fn binary_errors() {
    let d = dev();
    let a = d.upload(&[0f32; 6], &[2, 3]).unwrap();
    let b = d.upload(&[0f32; 4], &[4]).unwrap();
    let e = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(e.to_string(), "AddV2: incompatible shapes [2,3] and [4]");
    let c = d.upload(&[0f32; 6], &[3, 2]).unwrap();
    let e = d
        .run("Maximum", &Attrs::new(), &[Arg::from(&a), Arg::from(&c)])
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "Maximum: incompatible shapes [2,3] and [3,2]"
    );
    // Mixed dtypes.
    let i = d.upload(&[0i32; 6], &[2, 3]).unwrap();
    let e = d
        .run("Mul", &Attrs::new(), &[Arg::from(&a), Arg::from(&i)])
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("Mul") && e.to_string().contains("int32"),
        "{e}"
    );
    // RealDiv is float-only, both through the type attribute and from the inputs.
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::I32));
    let e = d
        .run("RealDiv", &attrs, &[Arg::from(&i), Arg::from(&i)])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    let e = d
        .run("RealDiv", &Attrs::new(), &[Arg::from(&i), Arg::from(&i)])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    // int64 has no Pow or RealDiv kernels.
    let l = d.upload(&[0i64; 6], &[2, 3]).unwrap();
    let e = d
        .run("Pow", &Attrs::new(), &[Arg::from(&l), Arg::from(&l)])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    // Nine dimensions that cannot merge exceed the kernel's rank.
    let x = d.upload(&[0f32; 32], &[2, 1, 2, 1, 2, 1, 2, 1, 2]).unwrap();
    let y = d.upload(&[0f32; 16], &[1, 2, 1, 2, 1, 2, 1, 2, 1]).unwrap();
    let e = d
        .run("Sub", &Attrs::new(), &[Arg::from(&x), Arg::from(&y)])
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("Sub") && msg.contains("[2,1,2,1,2,1,2,1,2]") && msg.contains("at most 8"),
        "{msg}"
    );
    // The wrong number of inputs.
    let e = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&a)])
        .err()
        .unwrap();
    assert!(e.to_string().contains("AddV2"), "{e}");
    // A host-memory input is rejected, not read.
    let h = HostTensor::new(&[1f32; 6], &[2, 3]).unwrap();
    assert!(
        d.run("AddV2", &Attrs::new(), &[Arg::from(&a), Arg::from(&h)])
            .is_err()
    );
}

// ---------------------------------------------------------------- unary ops

/// f64 references of the float unary ops.
fn unary_ref(op: &str, x: f64) -> f64 {
    match op {
        "Neg" => -x,
        "Abs" => x.abs(),
        "Relu" => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        "Exp" => x.exp(),
        "Log" => x.ln(),
        "Sqrt" => x.sqrt(),
        "Tanh" => x.tanh(),
        "Sigmoid" => {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }
        _ => unreachable!(),
    }
}

/// Error bounds of the f32 results, in f32 ULP (from the implementations in math.wgsl and
/// Vulkan's precision rules): exact sign-bit ops; exp ~1.5 (reduction and a degree-10 series);
/// log ~2 (the division inside carries Vulkan's 2.5 ULP only into a correction term);
/// sqrt is WGSL's (1/inverseSqrt: 2 + 2.5); tanh and sigmoid chain exp, an addition and a
/// 2.5 ULP division.
fn unary_ulps(op: &str) -> f64 {
    match op {
        "Neg" | "Abs" | "Relu" => 0.0,
        "Exp" => 2.0,
        "Log" => 3.0,
        "Sqrt" => 4.5,
        _ => 6.0,
    }
}

/// Input range per op (f32): wide, exercising argument reduction and saturation.
fn unary_range(op: &str) -> (f32, f32) {
    match op {
        "Exp" => (-87.0, 88.0),
        "Log" | "Sqrt" => (0.0, 1000.0),
        "Tanh" => (-12.0, 12.0),
        "Sigmoid" => (-80.0, 80.0),
        _ => (-100.0, 100.0),
    }
}

const UNARY_OPS: &[&str] = &[
    "Neg", "Abs", "Relu", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid",
];

#[test]
fn unary_f32_random() {
    let mut r = rng(4);
    for &op in UNARY_OPS {
        let (lo, hi) = unary_range(op);
        for shape in [&[0usize][..], &[], &[7], &[129], &[3, 343], &[256, 257]] {
            let n: usize = shape.iter().product();
            let mut x = rand_f32(&mut r, n, lo, hi);
            // Values near 0 and 1, where log, tanh and sigmoid lose accuracy if done naively.
            for v in x.iter_mut().step_by(3) {
                *v = match op {
                    "Log" => 1.0 + r.random_range(-0.3f32..0.45),
                    _ => r.random_range(-0.7f32..0.7) * 10f32.powi(-r.random_range(0..6)),
                };
                if op == "Sqrt" {
                    *v = v.abs();
                }
            }
            let got = run1(op, &x, shape);
            let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v as f64)).collect();
            assert_ulps(
                &to_f64(&got),
                &want,
                unary_ulps(op),
                false,
                &format!("{op} {shape:?}"),
            );
        }
    }
}

#[test]
fn unary_f32_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let sub = 1e-40f32; // subnormal
    let cases: &[(&str, &[f32])] = &[
        ("Neg", &[nan, inf, -inf, 0.0, -0.0, 1.0, -1.0]),
        ("Abs", &[nan, inf, -inf, 0.0, -0.0, -1.5, sub, -sub]),
        ("Relu", &[nan, -nan, inf, -inf, 0.0, -0.0, -1.0, 2.0, -sub]),
        (
            "Exp",
            &[
                nan, inf, -inf, 0.0, -0.0, 88.7, 88.72, 89.0, 1000.0, -87.3, -104.5, -1000.0, 1e-10,
            ],
        ),
        (
            "Log",
            &[
                nan,
                inf,
                -inf,
                0.0,
                -0.0,
                -1.0,
                -sub,
                1.0,
                2.0,
                0.5,
                sub,
                1e-45,
                f32::MAX,
                1.0000001,
                0.99999994,
            ],
        ),
        (
            "Sqrt",
            &[
                nan,
                inf,
                -inf,
                0.0,
                -0.0,
                -1.0,
                -sub,
                4.0,
                2.0,
                f32::MAX,
                1e-30,
            ],
        ),
        (
            "Tanh",
            &[
                nan, inf, -inf, 0.0, -0.0, 20.0, -20.0, 1e5, -1e5, 9.0, 9.2, -9.05, 1e-5, -1e-30,
                0.5, 0.55, -0.6, 8.0,
            ],
        ),
        (
            "Sigmoid",
            &[
                nan, inf, -inf, 0.0, -0.0, 100.0, -100.0, 20.0, -20.0, 88.0, -88.0, 17.0, 1e-7,
                -200.0,
            ],
        ),
    ];
    for &(op, x) in cases {
        let got = run1(op, x, &[x.len()]);
        let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v as f64)).collect();
        assert_ulps(
            &to_f64(&got),
            &want,
            unary_ulps(op),
            false,
            &format!("{op} specials"),
        );
    }
    // Spelled out.
    let got = run1("Log", &[0.0f32, -1.0, -0.0], &[3]);
    assert_eq!(got[0], f32::NEG_INFINITY);
    assert!(got[1].is_nan());
    assert_eq!(got[2], f32::NEG_INFINITY);
    let got = run1("Sqrt", &[-1.0f32, -0.0], &[2]);
    assert!(got[0].is_nan());
    assert_eq!(got[1].to_bits(), (-0.0f32).to_bits());
    let got = run1("Relu", &[nan], &[1]);
    assert!(got[0].is_nan());
    let got = run1("Tanh", &[1e5f32, -1e5, 50.0, -inf], &[4]);
    assert_eq!(got, vec![1.0, -1.0, 1.0, -1.0]);
    let got = run1("Sigmoid", &[1000.0f32, -1000.0, 0.0], &[3]);
    assert_eq!(got, vec![1.0, 0.0, 0.5]);
    let got = run1("Exp", &[0.0f32, -inf, 1000.0], &[3]);
    assert_eq!(got, vec![1.0, 0.0, inf]);
}

#[test]
fn unary_f16() {
    let mut r = rng(5);
    for &op in UNARY_OPS {
        let (lo, hi) = match op {
            "Exp" => (-15.0, 11.0),
            "Log" | "Sqrt" => (0.0, 60000.0),
            "Tanh" | "Sigmoid" => (-12.0, 12.0),
            _ => (-60000.0, 60000.0),
        };
        for n in [0usize, 1, 7, 130] {
            let mut x = f16s(&rand_f32(&mut r, n, lo, hi));
            for v in x.iter_mut().step_by(4) {
                *v = f16::from_f32(r.random_range(0.0f32..1.0));
            }
            if n == 130 {
                x[1] = f16::NAN;
                x[2] = f16::INFINITY;
                x[3] = f16::NEG_INFINITY;
                x[5] = f16::from_bits(0x8001); // -smallest subnormal
                x[6] = f16::from_bits(0x0201); // subnormal
            }
            let got = run1(op, &x, &[n]);
            let want: Vec<f64> = x.iter().map(|v| unary_ref(op, v.to_f64())).collect();
            // An f32 result within a few f32 ULP, rounded to f16: within one f16 ULP (exact
            // for the sign-bit ops).
            let ulps = if unary_ulps(op) == 0.0 { 0.5 } else { 1.0 };
            assert_ulps(
                &f16_to_f64(&got),
                &want,
                ulps,
                true,
                &format!("{op} f16 n={n}"),
            );
        }
    }
}

#[test]
fn unary_i32() {
    let mut r = rng(6);
    for n in [0usize, 1, 7, 129] {
        let mut x = rand_i32(&mut r, n, i32::MIN, i32::MAX);
        if n == 129 {
            x[0] = i32::MIN;
            x[1] = i32::MAX;
            x[2] = 0;
            x[3] = -1;
        }
        let got = run1("Neg", &x, &[n]);
        assert_eq!(got, x.iter().map(|v| v.wrapping_neg()).collect::<Vec<_>>());
        let got = run1("Abs", &x, &[n]);
        assert_eq!(got, x.iter().map(|v| v.wrapping_abs()).collect::<Vec<_>>());
        let got = run1("Relu", &x, &[n]);
        assert_eq!(got, x.iter().map(|v| (*v).max(0)).collect::<Vec<_>>());
    }
    assert_eq!(run1("Abs", &[i32::MIN], &[]), vec![i32::MIN]);
    assert_eq!(run1("Neg", &[i32::MIN], &[]), vec![i32::MIN]);
    // Float-only ops reject int32.
    let d = dev();
    let t = d.upload(&[1i32], &[1]).unwrap();
    for op in ["Exp", "Log", "Sqrt", "Tanh", "Sigmoid"] {
        let e = d.run(op, &Attrs::new(), &[Arg::from(&t)]).err().unwrap();
        assert!(matches!(e, Error::Unimplemented(_)), "{op}: {e:?}");
    }
}

// ---------------------------------------------------------------- Identity / Snapshot

#[test]
fn identity_and_snapshot_every_dtype() {
    let d = dev();
    let mut r = rng(7);
    for op in ["Identity", "Snapshot"] {
        for n in [0usize, 1, 3, 7, 129] {
            let bytes: Vec<u8> = (0..n * 8).map(|_| r.random()).collect();
            let hosts = [
                HostTensor::new(&rand_f32(&mut r, n, -5.0, 5.0), &[n]).unwrap(),
                HostTensor::new(&f16s(&rand_f32(&mut r, n, -5.0, 5.0)), &[n]).unwrap(),
                HostTensor::new(&rand_i32(&mut r, n, i32::MIN, i32::MAX), &[n]).unwrap(),
                HostTensor::new(&bytemuck_i64(&bytes[..n * 8]), &[n]).unwrap(),
                HostTensor::new(&bytes[..n], &[n]).unwrap(),
                HostTensor::from_bools(
                    &bytes[..n].iter().map(|b| b & 1 == 1).collect::<Vec<_>>(),
                    &[n],
                )
                .unwrap(),
            ];
            for h in hosts {
                let t = d.upload_host(&h).unwrap();
                let out = d.run(op, &Attrs::new(), &[Arg::from(&t)]).unwrap();
                assert_ne!(out[0].addr(), t.addr(), "{op} copies");
                assert_eq!(out[0].download_host().unwrap(), h, "{op} {} n={n}", h.dtype);
            }
        }
    }
    // 2-D shapes keep their shape.
    let t = d.upload(&[1u8, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let out = d.run("Identity", &Attrs::new(), &[Arg::from(&t)]).unwrap();
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[0].download::<u8>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
}

fn bytemuck_i64(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// ---------------------------------------------------------------- int64

/// TensorFlow's int64 functors with this family's rule for a zero divisor (0).
fn ref_i64(op: &str, x: i64, y: i64) -> i64 {
    match op {
        "AddV2" | "Add" => x.wrapping_add(y),
        "Sub" => x.wrapping_sub(y),
        "Mul" => x.wrapping_mul(y),
        "Maximum" => x.max(y),
        "Minimum" => x.min(y),
        "SquaredDifference" => x.wrapping_sub(y).wrapping_mul(x.wrapping_sub(y)),
        _ if y == 0 => 0,
        "Div" => x.wrapping_div(y),
        "FloorDiv" => {
            let q = x.wrapping_div(y);
            if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
                q - 1
            } else {
                q
            }
        }
        "FloorMod" => {
            let r = x.wrapping_rem(y);
            if r != 0 && ((r < 0) != (y < 0)) {
                r.wrapping_add(y)
            } else {
                r
            }
        }
        _ => unreachable!(),
    }
}

#[test]
fn binary_i64_arithmetic_and_broadcasting() {
    use rand::Rng;
    let mut r = rng(64);
    let edge = [
        0i64,
        1,
        -1,
        2,
        -2,
        i64::MIN,
        i64::MAX,
        1 << 32,
        -(1 << 32),
        (1 << 32) - 1,
        0xffff_ffff_0000_0000u64 as i64,
        2147483646,
        933199,
        5387,
    ];
    // Values from every scale: full range, both words busy, small.
    let mut sample = |n: usize| -> Vec<i64> {
        (0..n)
            .map(|i| match i % 4 {
                0 => r.random::<i64>(),
                1 => r.random_range(-(1i64 << 40)..(1i64 << 40)),
                2 => r.random_range(-70..70),
                _ => edge[r.random_range(0..edge.len())],
            })
            .collect()
    };
    let ops = [
        "AddV2",
        "Sub",
        "Mul",
        "Maximum",
        "Minimum",
        "SquaredDifference",
        "Div",
        "FloorDiv",
        "FloorMod",
    ];
    for &(sa, sb) in &[
        (&[7usize, 9][..], &[7usize, 9][..]),
        (&[3, 1, 5], &[4, 1]),
        (&[130], &[]),
    ] {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = sample(na);
        let b = sample(nb);
        for op in ops {
            let (shape, got) = run2(op, &a, sa, &b, sb);
            let (want_shape, want) = bcast_ref(&a, sa, &b, sb, |x, y| ref_i64(op, x, y));
            assert_eq!(shape, want_shape, "{op} i64 {sa:?} {sb:?}: shape");
            assert_eq!(got, want, "{op} i64 {sa:?} {sb:?}");
        }
    }
    // Every pair of edge values.
    let n = edge.len();
    let a: Vec<i64> = (0..n * n).map(|i| edge[i / n]).collect();
    let b: Vec<i64> = (0..n * n).map(|i| edge[i % n]).collect();
    for op in ops {
        let (_, got) = run2(op, &a, &[n * n], &b, &[n * n]);
        let want: Vec<i64> = a.iter().zip(&b).map(|(&x, &y)| ref_i64(op, x, y)).collect();
        assert_eq!(got, want, "{op} i64 edge pairs");
    }
}

#[test]
fn unary_i64() {
    let x = vec![
        0i64,
        1,
        -1,
        5,
        -7,
        i64::MIN,
        i64::MAX,
        1 << 32,
        -(1 << 33),
        0x1234_5678_9abc,
    ];
    let n = [x.len()];
    let neg: Vec<i64> = x.iter().map(|v| v.wrapping_neg()).collect();
    assert_eq!(run1("Neg", &x, &n), neg);
    let abs: Vec<i64> = x.iter().map(|v| v.wrapping_abs()).collect();
    assert_eq!(run1("Abs", &x, &n), abs);
    let sq: Vec<i64> = x.iter().map(|v| v.wrapping_mul(*v)).collect();
    assert_eq!(run1("Square", &x, &n), sq);
    let sign: Vec<i64> = x.iter().map(|v| v.signum()).collect();
    assert_eq!(run1("Sign", &x, &n), sign);
    assert_eq!(run1::<i64>("Neg", &[], &[0]), Vec::<i64>::new());
}
