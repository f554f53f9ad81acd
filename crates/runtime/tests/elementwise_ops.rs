//! The elementwise ops a training step needs beyond the basic arithmetic: SquaredDifference,
//! Pow, DivNoNan, FloorDiv, FloorMod, the comparisons and logical ops, the activation
//! gradients, and the unary Square, Rsqrt, Reciprocal, Sign, Floor, Ceil, Round, Log1p,
//! Expm1, Softplus. Each against a CPU reference (TensorFlow's formulas, its special values
//! as TensorFlow 2.21's CPU kernels give them).
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, Error, HostTensor, f16};

// ---------------------------------------------------------------- helpers

/// A comparison or logical op: bool output.
fn run2_bool(op: &str, attrs: &Attrs, a: &HostTensor, b: &HostTensor) -> (Vec<usize>, Vec<bool>) {
    let out = run(op, attrs, &[a, b]);
    (out[0].shape().to_vec(), download_bools(&out[0]))
}

/// Shape pairs: same shapes, scalars, empty tensors, and broadcasting corners.
const SHAPES: &[(&[usize], &[usize])] = &[
    (&[7], &[7]),
    (&[129], &[129]),
    (&[0], &[0]),
    (&[], &[]),
    (&[3, 1], &[1, 4]),
    (&[], &[5]),
    (&[129], &[]),
    (&[2, 1, 3], &[4, 1]),
    (&[0, 3], &[1, 3]),
    (&[7, 1, 129], &[1, 5, 1]),
    (&[6, 5, 4], &[5, 4]),
    (&[2, 1, 2, 1, 2, 1, 2, 1], &[1, 2, 1, 2, 1, 2, 1, 2]),
];

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// A random f32 with a uniform mantissa and an exponent in `exps` (both signs when `signed`).
fn wide_f32(r: &mut rand::rngs::StdRng, exps: std::ops::Range<i32>, signed: bool) -> f32 {
    let m = 1.0 + r.random_range(0.0f64..1.0);
    let s = if signed && r.random() { -1.0 } else { 1.0 };
    (s * m * 2f64.powi(r.random_range(exps))) as f32
}

/// TensorFlow's float FloorMod: t = fmod(x, y) (exact; Rust's `%`), then t + y when t is
/// nonzero and its sign differs from y's.
fn tf_floor_mod(x: f32, y: f32) -> f32 {
    let t = x % y;
    if t != 0.0 && ((y < 0.0) != (t < 0.0)) {
        t + y
    } else {
        t
    }
}

/// TensorFlow's float FloorDiv: floor of the (correctly rounded) quotient.
fn tf_floor_div(x: f32, y: f32) -> f32 {
    (x / y).floor()
}

fn floor_div_i32(x: i32, y: i32) -> i32 {
    if y == 0 {
        return 0;
    }
    let q = x.wrapping_div(y);
    if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    }
}

fn floor_mod_i32(x: i32, y: i32) -> i32 {
    if y == 0 {
        return 0;
    }
    let r = x.wrapping_rem(y);
    if r != 0 && ((r < 0) != (y < 0)) {
        r + y
    } else {
        r
    }
}

fn pow_i32(x: i32, y: i32) -> i32 {
    if y < 0 {
        return match x {
            1 => 1,
            -1 => {
                if y % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    x.wrapping_pow(y as u32)
}

/// Pow's bound in f32 ULP: the Exp kernel's 2 (series and scaling), plus log|x|'s error
/// (carried in two floats, below 2^-31 relative: at most 0.4 ULP where |y log|x|| reaches 104
/// before the result underflows).
const POW_ULPS: f64 = 2.5;

/// Exact f64 x^y.
fn pow_ref(x: f32, y: f32) -> f64 {
    (x as f64).powf(y as f64)
}

// ---------------------------------------------------------------- binary arithmetic

#[test]
fn binary_arith_f32_broadcasting() {
    let mut r = rng(11);
    for &(sa, sb) in SHAPES {
        let (na, nb) = (numel(sa), numel(sb));
        let a = rand_f32(&mut r, na, -10.0, 10.0);
        let mut b = rand_f32(&mut r, nb, -10.0, 10.0);
        // Zeros for DivNoNan (both signs).
        for (i, v) in b.iter_mut().enumerate().step_by(5) {
            *v = if i % 2 == 0 { 0.0 } else { -0.0 };
        }
        let what = |op: &str| format!("{op} f32 {sa:?} {sb:?}");
        let (shape, got) = run2("SquaredDifference", &a, sa, &b, sb);
        let (want_shape, want) = bcast_ref(&a, sa, &b, sb, |x, y| (x - y) * (x - y));
        assert_eq!(shape, want_shape);
        assert_same_f32(&got, &want, &what("SquaredDifference"));

        let (_, got) = run2("DivNoNan", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            if y == 0.0 { 0.0 } else { x as f64 / y as f64 }
        });
        assert_ulps(&to_f64(&got), &want, 2.5, false, &what("DivNoNan"));

        let (_, got) = run2("FloorDiv", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, tf_floor_div);
        assert_same_f32(&got, &want, &what("FloorDiv"));

        let (_, got) = run2("FloorMod", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, tf_floor_mod);
        assert_same_f32(&got, &want, &what("FloorMod"));

        // Pow: negative bases with integer and non-integer exponents.
        let mut e = rand_f32(&mut r, nb, -10.0, 10.0);
        for v in e.iter_mut().step_by(3) {
            *v = v.round();
        }
        let (_, got) = run2("Pow", &a, sa, &e, sb);
        let (_, want) = bcast_ref(&a, sa, &e, sb, pow_ref);
        assert_ulps(&to_f64(&got), &want, POW_ULPS, false, &what("Pow"));
    }
}

#[test]
fn binary_arith_i32() {
    let mut r = rng(12);
    for &(sa, sb) in SHAPES {
        let (na, nb) = (numel(sa), numel(sb));
        let a = rand_i32(&mut r, na, i32::MIN, i32::MAX);
        let b = rand_i32(&mut r, nb, i32::MIN, i32::MAX);
        let small = rand_i32(&mut r, nb, -50, 51);
        let what = |op: &str| format!("{op} i32 {sa:?} {sb:?}");
        let (_, got) = run2("SquaredDifference", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            x.wrapping_sub(y).wrapping_mul(x.wrapping_sub(y))
        });
        assert_eq!(got, want, "{}", what("SquaredDifference"));
        for &(op, f) in &[
            ("FloorDiv", floor_div_i32 as fn(i32, i32) -> i32),
            ("FloorMod", floor_mod_i32),
        ] {
            for bb in [&b, &small] {
                let (_, got) = run2(op, &a, sa, bb, sb);
                let (_, want) = bcast_ref(&a, sa, bb, sb, f);
                assert_eq!(got, want, "{}", what(op));
            }
        }
        let base = rand_i32(&mut r, na, -20, 21);
        let exp = rand_i32(&mut r, nb, -3, 25);
        let (_, got) = run2("Pow", &base, sa, &exp, sb);
        let (_, want) = bcast_ref(&base, sa, &exp, sb, pow_i32);
        assert_eq!(got, want, "{}", what("Pow"));
    }
    // Spelled out (TensorFlow's values; its errors for a zero divisor and negative exponents
    // are the documented 0 and truncated results here).
    let min = i32::MIN;
    let a = [-7, 7, -7, 7, 0, min, min, 5, min];
    let b = [2, -2, -2, 2, 3, -1, 3, 0, 0];
    let (_, got) = run2("FloorDiv", &a, &[9], &b, &[9]);
    assert_eq!(got, vec![-4, -4, 3, 3, 0, min, -715827883, 0, 0]);
    let (_, got) = run2("FloorMod", &a, &[9], &b, &[9]);
    assert_eq!(got, vec![1, -1, -1, 1, 0, 0, 1, 0, 0]);
    let (_, got) = run2(
        "Pow",
        &[2, 3, -3, 0, 46341, 7, 1, -1, -1, 5, 0],
        &[11],
        &[10, 3, 3, 0, 2, 40, -5, -3, -4, -1, 0],
        &[11],
    );
    assert_eq!(
        got,
        vec![1024, 27, -27, 1, -2147479015, -142118463, 1, -1, 1, 0, 1]
    );
}

#[test]
fn binary_arith_f16() {
    let mut r = rng(13);
    for &(sa, sb) in SHAPES {
        let (na, nb) = (numel(sa), numel(sb));
        let a = f16s(&rand_f32(&mut r, na, -100.0, 100.0));
        let mut b = f16s(&rand_f32(&mut r, nb, -10.0, 10.0));
        for v in b.iter_mut().step_by(7) {
            *v = f16::ZERO;
        }
        let what = |op: &str| format!("{op} f16 {sa:?} {sb:?}");
        // Eigen's half arithmetic: each operation in f32, rounded to half.
        let (_, got) = run2("SquaredDifference", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            let d = rh(x.to_f32() - y.to_f32());
            f16::from_f32(d * d)
        });
        assert_same_f16(&got, &want, &what("SquaredDifference"));
        let (_, got) = run2("FloorDiv", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            f16::from_f32(rh(x.to_f32() / y.to_f32()).floor())
        });
        assert_same_f16(&got, &want, &what("FloorDiv"));
        let (_, got) = run2("FloorMod", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            f16::from_f32(tf_floor_mod(x.to_f32(), y.to_f32()))
        });
        assert_same_f16(&got, &want, &what("FloorMod"));
        // An f32 result within a few f32 ULP, rounded to f16: within one f16 ULP.
        let (_, got) = run2("DivNoNan", &a, sa, &b, sb);
        let (_, want) = bcast_ref(&a, sa, &b, sb, |x, y| {
            if y.to_f32() == 0.0 {
                0.0
            } else {
                x.to_f64() / y.to_f64()
            }
        });
        assert_ulps(&f16_to_f64(&got), &want, 1.0, true, &what("DivNoNan"));
        let base = f16s(&rand_f32(&mut r, na, 0.0, 4.0));
        let (_, got) = run2("Pow", &base, sa, &b, sb);
        let (_, want) = bcast_ref(&base, sa, &b, sb, |x, y| x.to_f64().powf(y.to_f64()));
        assert_ulps(&f16_to_f64(&got), &want, 1.0, true, &what("Pow"));
    }
}

#[test]
fn binary_arith_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // TensorFlow 2.21 CPU's results for these inputs.
    let a = [
        -1.0, 5.0, -5.0, 5.0, -0.0, 0.0, inf, 1.0, nan, 5.0, -7.5, 1e30,
    ];
    let b = [
        3.0, -3.0, -3.0, inf, 3.0, -3.0, 2.0, 0.0, 1.0, -inf, 2.0, 3.0,
    ];
    let (_, got) = run2("FloorMod", &a, &[12], &b, &[12]);
    let want = [
        2.0, -1.0, -2.0, 5.0, -0.0, 0.0, nan, nan, nan, -inf, 0.5, 0.0,
    ];
    assert_same_f32(&got, &want, "FloorMod specials");
    let (_, got) = run2("FloorDiv", &a, &[12], &b, &[12]);
    let want = [
        -1.0,
        -2.0,
        1.0,
        0.0,
        -0.0,
        -0.0,
        inf,
        inf,
        nan,
        -0.0,
        -4.0,
        3.3333334e29,
    ];
    assert_same_f32(&got, &want, "FloorDiv specials");
    let (_, got) = run2(
        "DivNoNan",
        &[0.0f32, nan, 1.0, inf, 1.0, 1.0, -6.0],
        &[7],
        &[0.0f32, 0.0, nan, inf, -0.0, inf, 3.0],
        &[7],
    );
    assert_same_f32(
        &got,
        &[0.0, 0.0, nan, nan, 0.0, 0.0, -2.0],
        "DivNoNan specials",
    );
    let (_, got) = run2(
        "SquaredDifference",
        &[inf, nan, 3.0f32, -inf],
        &[4],
        &[inf, 1.0f32, 5.0, 0.0],
        &[4],
    );
    assert_same_f32(&got, &[nan, nan, 4.0, inf], "SquaredDifference specials");
    // C's pow special values.
    let x = [
        nan, 1.0, -1.0, 0.0, -0.0, -0.0, -0.0, 0.0, -inf, -inf, -8.0, -8.0, 0.5, 2.0, inf, -1.0,
        1.0, -inf, inf, 0.5, 2.0, -2.0, -0.5, 4.0,
    ];
    let y = [
        0.0,
        nan,
        inf,
        -3.0,
        -3.0,
        3.0,
        -2.0,
        -0.5,
        3.0,
        -3.0,
        1.0 / 3.0,
        3.0,
        -inf,
        -inf,
        -0.5,
        -inf,
        inf,
        2.0,
        3.0,
        inf,
        inf,
        -0.0,
        3.0,
        0.5,
    ];
    let want = [
        1.0, 1.0, 1.0, inf, -inf, -0.0, inf, inf, -inf, -0.0, nan, -512.0, inf, 0.0, 0.0, 1.0, 1.0,
        inf, inf, 0.0, inf, 1.0, -0.125, 2.0,
    ];
    let (_, got) = run2("Pow", &x, &[x.len()], &y, &[y.len()]);
    assert_same_f32(&got, &want, "Pow specials");
    // Overflow and underflow, both signs.
    let (_, got) = run2(
        "Pow",
        &[10.0f32, 10.0, -10.0, -10.0, 0.1, 1.0000001, 0.99999994],
        &[7],
        &[39.0f32, -46.0, 39.0, 40.0, 50.0, 1e9, 1e10],
        &[7],
    );
    assert_same_f32(&got, &[inf, 0.0, -inf, inf, 0.0, inf, 0.0], "Pow limits");
}

#[test]
fn floor_div_and_mod_wide_range() {
    // Quotients close to integers (x = k * y rounded), where floor of a quotient that is off
    // by an ULP would be off by one, and operands over a wide range of magnitudes. Exponents
    // stay where no result is subnormal (drivers may flush those).
    let mut r = rng(14);
    let n = 20000;
    let mut a = Vec::with_capacity(n);
    let mut b = Vec::with_capacity(n);
    for i in 0..n {
        let y = wide_f32(&mut r, -30..31, true);
        let x = if i % 2 == 0 {
            (r.random_range(-3000i32..3000) as f32) * y
        } else {
            wide_f32(&mut r, -30..31, true)
        };
        a.push(x);
        b.push(y);
    }
    let (_, got) = run2("FloorDiv", &a, &[n], &b, &[n]);
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| tf_floor_div(x, y))
        .collect();
    assert_same_f32(&got, &want, "FloorDiv wide");
    let (_, got) = run2("FloorMod", &a, &[n], &b, &[n]);
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| tf_floor_mod(x, y))
        .collect();
    assert_same_f32(&got, &want, "FloorMod wide");
}

#[test]
fn pow_wide_range() {
    let mut r = rng(15);
    let n = 30000;
    let mut x = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        match i % 4 {
            // Any magnitude, y such that |y log2 x| <= 150 (results from subnormal to huge).
            0 | 1 => {
                let b = wide_f32(&mut r, -126..127, false);
                let l = (b as f64).log2().abs().max(1e-3);
                x.push(b);
                y.push((r.random_range(-1.0f64..1.0) * 150.0 / l) as f32);
            }
            // Near 1 with large exponents: the product y log x needs more than f32.
            2 => {
                let k = r.random_range(-64i32..64);
                x.push(1.0 + k as f32 * f32::EPSILON / 2.0);
                y.push(r.random_range(-1e9f32..1e9));
            }
            // Negative bases with integer exponents.
            _ => {
                x.push(-r.random_range(0.5f32..3.0));
                y.push(r.random_range(-60i32..60) as f32);
            }
        }
    }
    let (_, got) = run2("Pow", &x, &[n], &y, &[n]);
    let want: Vec<f64> = x.iter().zip(&y).map(|(&a, &b)| pow_ref(a, b)).collect();
    assert_ulps(&to_f64(&got), &want, POW_ULPS, false, "Pow wide range");
}

// ---------------------------------------------------------------- comparisons, logical ops

const CMP_OPS: &[&str] = &[
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
];

fn cmp<T: PartialOrd>(op: &str, x: T, y: T) -> bool {
    match op {
        "Equal" => x == y,
        "NotEqual" => x != y,
        "Less" => x < y,
        "LessEqual" => x <= y,
        "Greater" => x > y,
        _ => x >= y,
    }
}

#[test]
fn comparisons_broadcasting() {
    let mut r = rng(16);
    let pool = [
        f32::NAN,
        f32::NEG_INFINITY,
        -2.5,
        -1.0,
        -0.0,
        0.0,
        1.0,
        2.5,
        f32::INFINITY,
        1e-40,
    ];
    let i64_pool = [
        i64::MIN,
        i64::MIN + 1,
        -(1 << 32),
        -(1 << 32) + 1,
        -1,
        0,
        1,
        5,
        (1 << 32) - 1,
        1 << 32,
        (1 << 32) + 5,
        i64::MAX,
    ];
    for &(sa, sb) in SHAPES {
        let (na, nb) = (numel(sa), numel(sb));
        let pick = |r: &mut rand::rngs::StdRng, n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| pool[r.random_range(0..pool.len())])
                .collect()
        };
        let (a, b) = (pick(&mut r, na), pick(&mut r, nb));
        let ia = rand_i32(&mut r, na, -3, 4);
        let ib = rand_i32(&mut r, nb, -3, 4);
        let la: Vec<i64> = (0..na).map(|_| i64_pool[r.random_range(0..12)]).collect();
        let lb: Vec<i64> = (0..nb).map(|_| i64_pool[r.random_range(0..12)]).collect();
        let (ha, hb) = (f16s(&a), f16s(&b));
        for &op in CMP_OPS {
            let what = format!("{op} {sa:?} {sb:?}");
            let (shape, got) = run2_bool(op, &Attrs::new(), &host(&a, sa), &host(&b, sb));
            let (want_shape, want) = bcast_ref(&a, sa, &b, sb, |x, y| cmp(op, x, y));
            assert_eq!(shape, want_shape, "{what}");
            assert_eq!(got, want, "{what} f32");
            let (_, got) = run2_bool(op, &Attrs::new(), &host(&ha, sa), &host(&hb, sb));
            let (_, want) = bcast_ref(&ha, sa, &hb, sb, |x, y| cmp(op, x, y));
            assert_eq!(got, want, "{what} f16");
            let (_, got) = run2_bool(op, &Attrs::new(), &host(&ia, sa), &host(&ib, sb));
            let (_, want) = bcast_ref(&ia, sa, &ib, sb, |x, y| cmp(op, x, y));
            assert_eq!(got, want, "{what} i32");
            let (_, got) = run2_bool(op, &Attrs::new(), &host(&la, sa), &host(&lb, sb));
            let (_, want) = bcast_ref(&la, sa, &lb, sb, |x, y| cmp(op, x, y));
            assert_eq!(got, want, "{what} i64");
        }
        // bool Equal / NotEqual and the logical ops.
        let ba: Vec<bool> = (0..na).map(|_| r.random()).collect();
        let bb: Vec<bool> = (0..nb).map(|_| r.random()).collect();
        for op in ["Equal", "NotEqual", "LogicalAnd", "LogicalOr"] {
            let (shape, got) = run2_bool(op, &Attrs::new(), &bools(&ba, sa), &bools(&bb, sb));
            let (want_shape, want) = bcast_ref(&ba, sa, &bb, sb, |x, y| match op {
                "Equal" => x == y,
                "NotEqual" => x != y,
                "LogicalAnd" => x && y,
                _ => x || y,
            });
            assert_eq!(shape, want_shape, "{op} bool {sa:?} {sb:?}");
            assert_eq!(got, want, "{op} bool {sa:?} {sb:?}");
        }
    }
}

#[test]
fn comparisons_lengths_and_errors() {
    // Every output length mod 4 (bools pack four per word).
    let mut r = rng(17);
    for n in [1usize, 2, 3, 4, 5, 6, 7, 257] {
        let a = rand_f32(&mut r, n, -1.0, 1.0);
        let b = rand_f32(&mut r, n, -1.0, 1.0);
        let (_, got) = run2_bool("Less", &Attrs::new(), &host(&a, &[n]), &host(&b, &[n]));
        let want: Vec<bool> = a.iter().zip(&b).map(|(x, y)| x < y).collect();
        assert_eq!(got, want, "Less n={n}");
        let x: Vec<bool> = (0..n).map(|_| r.random()).collect();
        let out = run("LogicalNot", &Attrs::new(), &[&bools(&x, &[n])]);
        assert_eq!(out[0].dtype(), DType::Bool);
        let want: Vec<bool> = x.iter().map(|v| !v).collect();
        assert_eq!(download_bools(&out[0]), want, "LogicalNot n={n}");
    }
    let out = run("LogicalNot", &Attrs::new(), &[&bools(&[], &[0, 3])]);
    assert_eq!(out[0].shape(), &[0, 3]);
    // Equal / NotEqual with incompatible_shape_error = false: a scalar when the shapes do not
    // broadcast, the elementwise result when they do.
    let lax = Attrs::new().with("incompatible_shape_error", AttrValue::Bool(false));
    let (a, b) = (host(&[1i32, 2], &[2]), host(&[1i32, 2, 3], &[3]));
    for (op, v) in [("Equal", false), ("NotEqual", true)] {
        let (shape, got) = run2_bool(op, &lax, &a, &b);
        assert_eq!((shape, got), (vec![], vec![v]), "{op} incompatible");
        let (shape, got) = run2_bool(op, &lax, &a, &host(&[2i32], &[1]));
        assert_eq!((shape, got), (vec![2], vec![v, !v]), "{op} compatible");
        let e = try_run(op, &Attrs::new(), &[&a, &b]).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("{op}: incompatible shapes [2] and [3]")
        );
    }
    // Less is not defined on bool; the logical ops only on bool.
    let t = bools(&[true], &[1]);
    let e = try_run("Less", &Attrs::new(), &[&t, &t]).err().unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    let f = host(&[1.0f32], &[1]);
    let e = try_run("LogicalAnd", &Attrs::new(), &[&f, &f])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    let e = try_run("LogicalNot", &Attrs::new(), &[&f]).err().unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    // Mixed dtypes.
    let e = try_run("Equal", &Attrs::new(), &[&f, &host(&[1i32], &[1])])
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

// ---------------------------------------------------------------- activation gradients

/// f64 value of TensorFlow's formula and the scale of its rounding error (the sum of the
/// magnitudes of the terms, times the number of roundings).
fn grad_ref(op: &str, y: f32, dy: f32) -> (f64, f64) {
    let (y, dy) = (y as f64, dy as f64);
    match op {
        "SigmoidGrad" => (dy * (y * (1.0 - y)), 3.0 * (dy * y * (1.0 + y.abs())).abs()),
        "TanhGrad" => (dy * (1.0 - y * y), 3.0 * (dy * (1.0 + y * y)).abs()),
        // The division: Vulkan's 2.5 ULP (5 units of roundoff), then a product.
        "SqrtGrad" if dy == 0.0 => (0.0, 0.0),
        "SqrtGrad" => (0.5 / y * dy, 6.0 * (0.5 / y * dy).abs()),
        "RsqrtGrad" if dy == 0.0 => (0.0, 0.0),
        "RsqrtGrad" => (-0.5 * dy * y * y * y, 3.0 * (0.5 * dy * y * y * y).abs()),
        "ReciprocalGrad" if dy == 0.0 => (0.0, 0.0),
        "ReciprocalGrad" => (-y * y * dy, 2.0 * (y * y * dy).abs()),
        // gradients / (exp(-features) + 1): exp within 2 ULP, a sum, a 2.5 ULP division.
        "SoftplusGrad" => {
            let v = y / ((-dy).exp() + 1.0);
            (v, 11.0 * v.abs())
        }
        _ => unreachable!(),
    }
}

const GRAD_OPS: &[&str] = &[
    "SigmoidGrad",
    "TanhGrad",
    "SqrtGrad",
    "RsqrtGrad",
    "ReciprocalGrad",
];

#[test]
fn activation_gradients_f32() {
    let mut r = rng(18);
    for shape in [&[0usize][..], &[], &[7], &[129], &[3, 343]] {
        let n = numel(shape);
        let y = rand_f32(&mut r, n, -3.0, 3.0);
        let dy = rand_f32(&mut r, n, -3.0, 3.0);
        for &op in GRAD_OPS.iter().chain(&["SoftplusGrad"]) {
            // SoftplusGrad is (gradients, features); the others (y, dy).
            let (first, second) = if op == "SoftplusGrad" {
                (&dy, &y)
            } else {
                (&y, &dy)
            };
            let (s, got) = run2(op, first, shape, second, shape);
            assert_eq!(s, shape, "{op}");
            let (want, tol): (Vec<f64>, Vec<f64>) = first
                .iter()
                .zip(second.iter())
                .map(|(&a, &b)| {
                    let (v, scale) = grad_ref(op, a, b);
                    (v, scale * EPS)
                })
                .unzip();
            assert_within(&to_f64(&got), &want, &tol, &format!("{op} {shape:?}"));
        }
        // ReluGrad: gradients * (features > 0), exactly.
        let (_, got) = run2("ReluGrad", &dy, shape, &y, shape);
        let want: Vec<f32> = dy
            .iter()
            .zip(&y)
            .map(|(&g, &f)| g * if f > 0.0 { 1.0 } else { 0.0 })
            .collect();
        assert_same_f32(&got, &want, "ReluGrad");
    }
}

#[test]
fn activation_gradients_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // TensorFlow 2.21 CPU's results (sign of zero included).
    let y = [
        0.0, 0.0, inf, nan, 4.0, -0.0, 0.0, 2.0, -0.0, 0.0, -2.0, 0.5,
    ];
    let dy = [0.0, 1.0, 0.0, 0.0, 2.0, 1.0, nan, inf, 1.0, -1.0, 0.0, inf];
    let cases: [(&str, [f32; 12]); 5] = [
        (
            "SqrtGrad",
            [
                0.0, inf, 0.0, 0.0, 0.25, -inf, nan, inf, -inf, -inf, 0.0, inf,
            ],
        ),
        (
            "RsqrtGrad",
            [
                0.0, -0.0, 0.0, 0.0, -64.0, 0.0, nan, -inf, 0.0, 0.0, 0.0, -inf,
            ],
        ),
        (
            "ReciprocalGrad",
            [
                0.0, -0.0, 0.0, 0.0, -32.0, -0.0, nan, -inf, -0.0, 0.0, 0.0, -inf,
            ],
        ),
        (
            "SigmoidGrad",
            [
                0.0, 0.0, nan, nan, -24.0, -0.0, nan, -inf, -0.0, -0.0, -0.0, inf,
            ],
        ),
        (
            "TanhGrad",
            [
                0.0, 1.0, nan, nan, -30.0, 1.0, nan, -inf, 1.0, -1.0, -0.0, inf,
            ],
        ),
    ];
    for (op, want) in cases {
        let (_, got) = run2(op, &y, &[12], &dy, &[12]);
        if op == "RsqrtGrad" {
            // TensorFlow's own sign of RsqrtGrad(0, 1) differs between its scalar (-0) and
            // vectorized (+0) paths: compare values there.
            assert_eq!(got[1], 0.0, "{op}[1]");
            assert_same_f32(&got[2..], &want[2..], op);
            assert_same_f32(&got[..1], &want[..1], op);
        } else {
            assert_same_f32(&got, &want, op);
        }
    }
    let (_, got) = run2(
        "ReluGrad",
        &[-3.0f32, nan, 2.0, 1.0, inf, 5.0],
        &[6],
        &[-1.0f32, 1.0, nan, 0.0, -1.0, 0.5],
        &[6],
    );
    assert_same_f32(&got, &[-0.0, nan, 0.0, 0.0, nan, 5.0], "ReluGrad specials");
    let (_, got) = run2(
        "SoftplusGrad",
        &[1.0f32, 2.0, 1.0, nan],
        &[4],
        &[0.0f32, 1000.0, -1000.0, 1.0],
        &[4],
    );
    assert_same_f32(&got, &[0.5, 2.0, 0.0, nan], "SoftplusGrad specials");
}

#[test]
fn activation_gradients_f16_and_int() {
    let mut r = rng(19);
    for n in [0usize, 1, 7, 130] {
        let y = f16s(&rand_f32(&mut r, n, -3.0, 3.0));
        let dy = f16s(&rand_f32(&mut r, n, -3.0, 3.0));
        let pairs = y.iter().zip(&dy).map(|(a, b)| (a.to_f32(), b.to_f32()));
        // Each operation rounded to half, as Eigen's half arithmetic does.
        let emulate = |op: &str, y: f32, dy: f32| -> f32 {
            match op {
                "SigmoidGrad" => dy * rh(y * rh(1.0 - y)),
                "TanhGrad" => dy * rh(1.0 - rh(y * y)),
                "RsqrtGrad" if dy == 0.0 => 0.0,
                "RsqrtGrad" => rh(-0.5 * rh(dy * y)) * rh(y * y),
                "ReciprocalGrad" if dy == 0.0 => 0.0,
                "ReciprocalGrad" => rh(-y * y) * dy,
                "SqrtGrad" if dy == 0.0 => 0.0,
                _ => rh(0.5 / y) * dy,
            }
        };
        for &op in GRAD_OPS {
            let (_, got) = run2(op, &y, &[n], &dy, &[n]);
            let want: Vec<f16> = pairs
                .clone()
                .map(|(a, b)| f16::from_f32(emulate(op, a, b)))
                .collect();
            if op == "SqrtGrad" {
                // The f32 division (2.5 ULP) may round to the neighbouring half.
                assert_ulps(&f16_to_f64(&got), &f16_to_f64(&want), 1.0, true, op);
            } else {
                assert_same_f16(&got, &want, &format!("{op} f16 n={n}"));
            }
        }
        let (_, got) = run2("ReluGrad", &dy, &[n], &y, &[n]);
        let want: Vec<f16> = pairs
            .clone()
            .map(|(f, g)| f16::from_f32(g * if f > 0.0 { 1.0 } else { 0.0 }))
            .collect();
        assert_same_f16(&got, &want, "ReluGrad f16");
        let g = rand_i32(&mut r, n, -100, 100);
        let f = rand_i32(&mut r, n, -3, 3);
        let (_, got) = run2("ReluGrad", &g, &[n], &f, &[n]);
        let want: Vec<i32> = g
            .iter()
            .zip(&f)
            .map(|(&g, &f)| if f > 0 { g } else { 0 })
            .collect();
        assert_eq!(got, want, "ReluGrad i32");
    }
}

#[test]
fn activation_gradient_shapes() {
    // The y/dy gradients need equal element counts (the output is shaped like y); ReluGrad
    // and SoftplusGrad need equal shapes; none broadcasts.
    let a = host(&[1.0f32; 6], &[2, 3]);
    let b = host(&[1.0f32; 6], &[3, 2]);
    let out = run("SigmoidGrad", &Attrs::new(), &[&a, &b]);
    assert_eq!(out[0].shape(), &[2, 3]);
    let e = try_run(
        "SigmoidGrad",
        &Attrs::new(),
        &[&a, &host(&[1.0f32; 3], &[3])],
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("SigmoidGrad") && e.to_string().contains("same number"),
        "{e}"
    );
    for op in ["ReluGrad", "SoftplusGrad"] {
        let e = try_run(op, &Attrs::new(), &[&a, &b]).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "Inputs to operation {op} of type {op} must have the same size and shape.  \
                 Input 0: [2,3] != input 1: [3,2]"
            )
        );
        let e = try_run(op, &Attrs::new(), &[&a, &host(&[1.0f32], &[])])
            .err()
            .unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
    let i = host(&[1i32; 6], &[2, 3]);
    let e = try_run("TanhGrad", &Attrs::new(), &[&i, &i]).err().unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
}

// ---------------------------------------------------------------- unary ops

/// TensorFlow's Softplus threshold: log(FLT_EPSILON) + 2 in f32.
fn softplus_ref(x: f32) -> f64 {
    let t = (f32::EPSILON.ln()) + 2.0;
    let xd = x as f64;
    if x > -t {
        xd
    } else if x < t {
        xd.exp()
    } else {
        xd.exp().ln_1p()
    }
}

fn unary_ref(op: &str, x: f32) -> f64 {
    let xd = x as f64;
    match op {
        "Rsqrt" => 1.0 / xd.sqrt(),
        "Reciprocal" => 1.0 / xd,
        "Log1p" => xd.ln_1p(),
        "Expm1" => xd.exp_m1(),
        "Softplus" => softplus_ref(x),
        _ => unreachable!(),
    }
}

/// Bounds in f32 ULP: inverseSqrt 2 (Vulkan); the division 2.5; log1p the Log kernel's 3 plus
/// 1.5 from rounding 1 + x where the series is not used; expm1 the Exp kernel's 2 amplified
/// by at most e^x / (e^x - 1) <= 1.5 above 1.1, plus the subtraction; softplus exp's 2 carried
/// through log1p, plus log1p's 4.5.
fn unary_ulps(op: &str) -> f64 {
    match op {
        "Rsqrt" => 2.0,
        "Reciprocal" => 2.5,
        "Log1p" => 4.5,
        "Expm1" => 3.5,
        _ => 6.5,
    }
}

const APPROX_UNARY: &[&str] = &["Rsqrt", "Reciprocal", "Log1p", "Expm1", "Softplus"];

#[test]
fn unary_f32() {
    let mut r = rng(20);
    for shape in [&[0usize][..], &[], &[7], &[129], &[3, 343]] {
        let n = numel(shape);
        for &op in APPROX_UNARY {
            let x: Vec<f32> = (0..n)
                .map(|i| match (op, i % 3) {
                    ("Rsqrt", _) => wide_f32(&mut r, -149..127, false),
                    ("Reciprocal", _) => wide_f32(&mut r, -125..126, true),
                    ("Log1p", 0) => r.random_range(-1.0f32..1000.0),
                    ("Log1p", 1) => r.random_range(-0.35f32..0.5),
                    ("Log1p", _) => wide_f32(&mut r, -40..0, true),
                    ("Expm1", 0) => r.random_range(-20.0f32..88.0),
                    ("Expm1", 1) => r.random_range(-1.2f32..1.2),
                    ("Expm1", _) => wide_f32(&mut r, -40..0, true),
                    ("Softplus", 0) => r.random_range(-100.0f32..100.0),
                    (_, _) => r.random_range(-16.0f32..16.0),
                })
                .collect();
            let got = run1(op, &x, shape);
            let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v)).collect();
            assert_ulps(
                &to_f64(&got),
                &want,
                unary_ulps(op),
                false,
                &format!("{op} {shape:?}"),
            );
        }
        // Exact ones.
        let mut x = rand_f32(&mut r, n, -100.0, 100.0);
        for (i, v) in x.iter_mut().enumerate().step_by(4) {
            *v = (i as f32 - 40.0) * 0.25; // halves: ties for Round
        }
        let got = run1("Square", &x, shape);
        let want: Vec<f32> = x.iter().map(|v| v * v).collect();
        assert_same_f32(&got, &want, "Square");
        for (op, f) in [
            ("Floor", f32::floor as fn(f32) -> f32),
            ("Ceil", f32::ceil),
            ("Round", f32::round_ties_even),
            ("Sign", |v: f32| if v == 0.0 { 0.0 } else { v.signum() }),
        ] {
            let got = run1(op, &x, shape);
            let want: Vec<f32> = x.iter().map(|&v| f(v)).collect();
            assert_same_f32(&got, &want, op);
        }
    }
}

#[test]
fn unary_f32_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let cases: &[(&str, &[f32], &[f32])] = &[
        (
            "Sign",
            &[nan, -0.0, 0.0, 2.0, -3.0, inf, -inf, 1e-40, -1e-40],
            &[nan, 0.0, 0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0],
        ),
        (
            "Round",
            &[
                -0.5, 0.5, 1.5, 2.5, -2.5, -0.2, nan, inf, -inf, 8388609.0, 0.49999997, 1e30, -0.0,
            ],
            &[
                -0.0, 0.0, 2.0, 2.0, -2.0, -0.0, nan, inf, -inf, 8388609.0, 0.0, 1e30, -0.0,
            ],
        ),
        (
            "Floor",
            &[-0.5, 0.5, -0.0, nan, -inf, -1e-3, 1e30],
            &[-1.0, 0.0, -0.0, nan, -inf, -1.0, 1e30],
        ),
        (
            "Ceil",
            &[-0.5, 0.5, -0.0, nan, inf, 1e-3, -1e30],
            &[-0.0, 1.0, -0.0, nan, inf, 1.0, -1e30],
        ),
        (
            "Rsqrt",
            &[0.0, -0.0, -1.0, inf, 4.0, nan, -inf],
            &[inf, -inf, nan, 0.0, 0.5, nan, nan],
        ),
        (
            "Reciprocal",
            &[0.0, -0.0, inf, -inf, 4.0, nan],
            &[inf, -inf, 0.0, -0.0, 0.25, nan],
        ),
        (
            "Log1p",
            &[-1.0, -2.0, inf, -0.0, 0.0, nan, -inf, 1e-30],
            &[-inf, nan, inf, -0.0, 0.0, nan, nan, 1e-30],
        ),
        (
            "Expm1",
            &[-inf, inf, -0.0, 0.0, 100.0, -100.0, nan, 1e-30],
            &[-1.0, inf, -0.0, 0.0, inf, -1.0, nan, 1e-30],
        ),
        (
            "Softplus",
            &[14.0, nan, inf, -inf, 100.0, -200.0],
            &[14.0, nan, inf, 0.0, 100.0, 0.0],
        ),
        ("Square", &[nan, -inf, -0.0, 1e20], &[nan, inf, 0.0, inf]),
    ];
    for &(op, x, want) in cases {
        let got = run1(op, x, &[x.len()]);
        assert_same_f32(&got, want, &format!("{op} specials"));
    }
    // Around Softplus's thresholds (TensorFlow: 13.000002 at 13, 14 at 14).
    let x = [
        13.0f32, 13.94238, 13.942386, -13.94238, -13.942386, 0.0, -13.0,
    ];
    let got = run1("Softplus", &x, &[7]);
    let want: Vec<f64> = x.iter().map(|&v| softplus_ref(v)).collect();
    assert_ulps(&to_f64(&got), &want, 6.5, false, "Softplus thresholds");
    assert_eq!(got[0], 13.000002);
}

#[test]
fn unary_f16_and_i32() {
    let mut r = rng(21);
    for n in [0usize, 1, 7, 130] {
        let mut x = f16s(&rand_f32(&mut r, n, -30.0, 30.0));
        for (i, v) in x.iter_mut().enumerate().step_by(3) {
            *v = f16::from_f32(i as f32 * 0.5 - 20.0);
        }
        for (op, f) in [
            ("Square", (|v: f32| v * v) as fn(f32) -> f32),
            ("Floor", f32::floor),
            ("Ceil", f32::ceil),
            ("Round", f32::round_ties_even),
            ("Sign", |v: f32| if v == 0.0 { 0.0 } else { v.signum() }),
        ] {
            let got = run1(op, &x, &[n]);
            let want: Vec<f16> = x.iter().map(|v| f16::from_f32(f(v.to_f32()))).collect();
            assert_same_f16(&got, &want, &format!("{op} f16 n={n}"));
        }
        for &op in APPROX_UNARY {
            let xs: Vec<f16> = x
                .iter()
                .map(|v| match op {
                    "Rsqrt" => f16::from_f32(v.to_f32().abs()),
                    "Log1p" => f16::from_f32(v.to_f32().abs() - 0.9),
                    "Expm1" => f16::from_f32(v.to_f32() * 0.3),
                    _ => *v,
                })
                .collect();
            let got = run1(op, &xs, &[n]);
            let want: Vec<f64> = xs.iter().map(|v| unary_ref(op, v.to_f32())).collect();
            // An f32 result within a few f32 ULP, rounded to f16: within one f16 ULP.
            assert_ulps(&f16_to_f64(&got), &want, 1.0, true, &format!("{op} f16"));
        }
        let mut xi = rand_i32(&mut r, n, i32::MIN, i32::MAX);
        if n == 130 {
            xi[0] = i32::MIN;
            xi[1] = 0;
            xi[2] = 46341;
        }
        let got = run1("Square", &xi, &[n]);
        assert_eq!(
            got,
            xi.iter().map(|v| v.wrapping_mul(*v)).collect::<Vec<_>>()
        );
        let got = run1("Sign", &xi, &[n]);
        assert_eq!(got, xi.iter().map(|v| v.signum()).collect::<Vec<_>>());
        let got = run1("Round", &xi, &[n]);
        assert_eq!(got, xi);
    }
    // Float-only ops reject int32.
    let t = host(&[1i32], &[1]);
    for op in [
        "Floor",
        "Ceil",
        "Rsqrt",
        "Reciprocal",
        "Log1p",
        "Expm1",
        "Softplus",
    ] {
        let e = try_run(op, &Attrs::new(), &[&t]).err().unwrap();
        assert!(matches!(e, Error::Unimplemented(_)), "{op}: {e:?}");
    }
}

// ---------------------------------------------------------------- Select / SelectV2

/// A random tensor of `dtype` (bool: 0 or 1 bytes).
fn rand_host(r: &mut rand::rngs::StdRng, dtype: DType, shape: &[usize]) -> HostTensor {
    let n = numel(shape);
    match dtype {
        DType::Bool => bools(&(0..n).map(|_| r.random()).collect::<Vec<_>>(), shape),
        _ => HostTensor {
            dtype,
            shape: shape.to_vec(),
            bytes: (0..n * dtype.size()).map(|_| r.random()).collect(),
        },
    }
}

/// CPU reference of Select: the bytes of `then` or `else` per output element, given the
/// element offsets in condition, then and else.
fn select_ref(c: &[bool], t: &HostTensor, e: &HostTensor, offs: &[Vec<usize>]) -> Vec<u8> {
    let size = t.dtype.size();
    let mut out = Vec::with_capacity(offs.len() * size);
    for o in offs {
        let (src, k) = if c[o[0]] { (t, o[1]) } else { (e, o[2]) };
        out.extend_from_slice(&src.bytes[k * size..(k + 1) * size]);
    }
    out
}

const SELECT_DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];

#[test]
fn select_v2_broadcasting_every_dtype() {
    let mut r = rng(22);
    let triples: &[(&[usize], &[usize], &[usize])] = &[
        (&[7], &[7], &[7]),
        (&[129], &[129], &[129]),
        (&[], &[5], &[5]),
        (&[5], &[], &[]),
        (&[2], &[3, 1], &[]),
        (&[2, 1], &[3], &[1, 3]),
        (&[0], &[1], &[0]),
        (&[3, 1, 5], &[1, 4, 1], &[5]),
        (&[7, 1], &[1, 129], &[7, 129]),
        (&[1, 1, 1], &[1], &[]),
        (&[2, 1, 2, 1, 2, 1, 2, 1], &[1, 2, 1, 2, 1, 2, 1, 2], &[]),
    ];
    for &(sc, st, se) in triples {
        let c: Vec<bool> = (0..numel(sc)).map(|_| r.random()).collect();
        for dtype in SELECT_DTYPES {
            let t = rand_host(&mut r, dtype, st);
            let e = rand_host(&mut r, dtype, se);
            let out = run("SelectV2", &Attrs::new(), &[&bools(&c, sc), &t, &e]);
            let (want_shape, offs) = bcast_offsets(&[sc, st, se]);
            let got = out[0].download_host().unwrap();
            assert_eq!(
                got.shape, want_shape,
                "SelectV2 {dtype} {sc:?} {st:?} {se:?}"
            );
            assert_eq!(got.dtype, dtype);
            assert_eq!(
                got.bytes,
                select_ref(&c, &t, &e, &offs),
                "SelectV2 {dtype} {sc:?} {st:?} {se:?}"
            );
        }
    }
    let e = try_run(
        "SelectV2",
        &Attrs::new(),
        &[
            &bools(&[true, false], &[2]),
            &host(&[1.0f32; 3], &[3]),
            &host(&[0.0f32], &[]),
        ],
    )
    .err()
    .unwrap();
    assert_eq!(
        e.to_string(),
        "SelectV2: condition [2], then [3], and else [] must be broadcastable"
    );
}

#[test]
fn select_v1_rules() {
    let mut r = rng(23);
    // (condition, then = else): a scalar, the same shape, or a vector over the first dimension.
    let cases: &[(&[usize], &[usize])] = &[
        (&[], &[2, 3]),
        (&[], &[]),
        (&[7], &[7]),
        (&[2, 3], &[2, 3]),
        (&[2], &[2, 3]),
        (&[3], &[3, 2, 5]),
        (&[0], &[0, 4]),
        (&[129], &[129, 1]),
    ];
    for &(sc, st) in cases {
        let c: Vec<bool> = (0..numel(sc)).map(|_| r.random()).collect();
        for dtype in SELECT_DTYPES {
            let t = rand_host(&mut r, dtype, st);
            let e = rand_host(&mut r, dtype, st);
            let out = run("Select", &Attrs::new(), &[&bools(&c, sc), &t, &e]);
            // A vector condition of a higher-rank `then` picks rows: broadcast it as [n,1,..].
            let mut cshape = sc.to_vec();
            if sc.len() == 1 && st.len() > 1 {
                cshape.resize(st.len(), 1);
            }
            let (want_shape, offs) = bcast_offsets(&[&cshape, st, st]);
            let got = out[0].download_host().unwrap();
            assert_eq!(got.shape, want_shape, "Select {dtype} {sc:?} {st:?}");
            assert_eq!(
                got.bytes,
                select_ref(&c, &t, &e, &offs),
                "Select {dtype} {sc:?} {st:?}"
            );
        }
    }
    // TensorFlow's errors.
    let f = |s: &[usize]| host(&vec![1.0f32; numel(s)], s);
    let b = |s: &[usize]| bools(&vec![true; numel(s)], s);
    let err = |c: HostTensor, t: HostTensor, e: HostTensor| {
        try_run("Select", &Attrs::new(), &[&c, &t, &e])
            .err()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        err(b(&[2]), f(&[3]), f(&[3])),
        "Inputs to operation Select of type Select must have the same size and shape.  \
         Input 0: [2] != input 1: [3]"
    );
    assert_eq!(
        err(b(&[1, 2]), f(&[2, 2]), f(&[2, 2])),
        "Inputs to operation Select of type Select must have the same size and shape.  \
         Input 0: [1,2] != input 1: [2,2]"
    );
    assert_eq!(
        err(b(&[1]), f(&[2, 3]), f(&[3])),
        "Select: Number of batches of 'then' must match size of 'cond', but saw: 2 vs. 1"
    );
    assert_eq!(
        err(b(&[]), f(&[2, 3]), f(&[3])),
        "Select: 'then' and 'else' must have the same size.  but received: [2,3] vs. [3]"
    );
    assert_eq!(
        err(b(&[2]), f(&[]), f(&[])),
        "Select: 'then' must be at least a vector, but saw shape: []"
    );
    // The condition must be bool; then and else one dtype.
    let e = try_run("Select", &Attrs::new(), &[&f(&[2]), &f(&[2]), &f(&[2])])
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = try_run(
        "SelectV2",
        &Attrs::new(),
        &[&b(&[2]), &f(&[2]), &host(&[1i32, 2], &[2])],
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

// ---------------------------------------------------------------- AddN

/// TensorFlow's AddN order: the first N mod 8 inputs (8 or 9 when that is 0 or 1) left to
/// right, then each group of 8 summed left to right and added to the total.
fn addn_ref<T: Copy>(xs: &[Vec<T>], add: impl Fn(T, T) -> T) -> Vec<T> {
    let n = xs.len();
    let r = n % 8;
    let first = if r >= 2 { r } else { r + 8 }.min(n);
    (0..xs[0].len())
        .map(|e| {
            let mut out = xs[1..first].iter().fold(xs[0][e], |a, x| add(a, x[e]));
            for g in xs[first..].chunks(8) {
                let s = g[1..].iter().fold(g[0][e], |a, x| add(a, x[e]));
                out = add(out, s);
            }
            out
        })
        .collect()
}

fn addn_attrs(n: usize) -> Attrs {
    Attrs::new().with("N", AttrValue::Int(n as i64))
}

#[test]
fn addn_matches_tensorflows_order() {
    let mut r = rng(24);
    for (n, shape) in [
        (1usize, &[7usize][..]),
        (2, &[]),
        (3, &[129]),
        (5, &[0, 3]),
        (8, &[3, 5]),
        (9, &[7]),
        (10, &[129]),
        (11, &[2, 3]),
        (16, &[5]),
        (17, &[33]),
        (25, &[130]),
    ] {
        let len = numel(shape);
        // Magnitudes over 10 decades: the sum depends on the order of the additions.
        let xs: Vec<Vec<f32>> = (0..n)
            .map(|_| {
                (0..len)
                    .map(|_| r.random_range(-1.0f32..1.0) * 10f32.powi(r.random_range(-3..7)))
                    .collect()
            })
            .collect();
        let hosts: Vec<HostTensor> = xs.iter().map(|x| host(x, shape)).collect();
        let args: Vec<&HostTensor> = hosts.iter().collect();
        let out = run("AddN", &addn_attrs(n), &args);
        assert_eq!(out[0].shape(), shape);
        let got = out[0].download::<f32>().unwrap();
        assert_same_f32(
            &got,
            &addn_ref(&xs, |a, b| a + b),
            &format!("AddN f32 n={n}"),
        );

        let hs: Vec<Vec<f16>> = xs.iter().map(|x| f16s(x)).collect();
        let hosts: Vec<HostTensor> = hs.iter().map(|x| host(x, shape)).collect();
        let args: Vec<&HostTensor> = hosts.iter().collect();
        let got = run("AddN", &addn_attrs(n), &args)[0]
            .download::<f16>()
            .unwrap();
        let want = addn_ref(&hs, |a, b| f16::from_f32(a.to_f32() + b.to_f32()));
        assert_same_f16(&got, &want, &format!("AddN f16 n={n}"));

        let is: Vec<Vec<i32>> = (0..n)
            .map(|_| rand_i32(&mut r, len, i32::MIN, i32::MAX))
            .collect();
        let hosts: Vec<HostTensor> = is.iter().map(|x| host(x, shape)).collect();
        let args: Vec<&HostTensor> = hosts.iter().collect();
        let got = run("AddN", &Attrs::new(), &args)[0]
            .download::<i32>()
            .unwrap();
        assert_eq!(got, addn_ref(&is, i32::wrapping_add), "AddN i32 n={n}");
    }
    // The same tensor several times.
    let d = dev();
    let t = d.upload(&[1.5f32, -2.0, 3.25], &[3]).unwrap();
    let out = d
        .run(
            "AddN",
            &addn_attrs(3),
            &[(&t).into(), (&t).into(), (&t).into()],
        )
        .unwrap();
    assert_eq!(out[0].download::<f32>().unwrap(), vec![4.5, -6.0, 9.75]);
}

#[test]
fn addn_errors() {
    let a = host(&[1.0f32; 2], &[2]);
    let b = host(&[1.0f32; 3], &[3]);
    let e = try_run("AddN", &addn_attrs(2), &[&a, &b]).err().unwrap();
    assert_eq!(
        e.to_string(),
        "Inputs to operation AddN of type AddN must have the same size and shape.  Input 0: \
         [2] != input 1: [3]"
    );
    let e = try_run("AddN", &addn_attrs(3), &[&a, &a]).err().unwrap();
    assert!(e.to_string().contains("N is 3"), "{e}");
    let i = host(&[1i32; 2], &[2]);
    let e = try_run("AddN", &Attrs::new(), &[&a, &i]).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let l = host(&[1i64; 2], &[2]);
    let e = try_run("AddN", &Attrs::new(), &[&l, &l]).err().unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
    let e = try_run("AddN", &Attrs::new(), &[]).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}
