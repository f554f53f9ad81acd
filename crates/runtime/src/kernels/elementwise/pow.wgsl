// x^y for f32 with C's pow special values. Needs common.wgsl, math.wgsl, and a function
// `opaque(v: f32) -> f32` returning v in a way the compiler cannot see through (a multiply by
// a 1.0 that comes from the params uniform).
//
// |x|^y = exp(y log|x|), with log|x| and the product y log|x| carried as unevaluated sums of
// two f32 (hi + lo): an error e in y log|x| is a relative error e in the result, and
// |y log|x|| reaches 104 before the result underflows, so a plain f32 log would cost up to
// ~100 ULP. Products are made exact by splitting both factors in 12-bit halves (on the bits),
// sums by TwoSum; neither needs an FMA, and contracting an exact product into an FMA does not
// change it. The error of log|x| is dominated by the rounding of the f32 tail of the atanh
// series, below 2^-31 relative (~1 ULP of the result at |y log|x|| = 104), to which come
// exp_reduced's error and the final rounding.

// a + b = s + err exactly (TwoSum). `opaque` keeps compilers from simplifying (a + b) - a to
// b, which would make err 0.
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opaque(a + b);
    let bb = opaque(s - a);
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}

// The 12 leading significant bits of x. x - hi12(x) is exact with at most 12 significant
// bits, and the product of two such halves is exact in f32.
fn hi12(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) & 0xfffff000u);
}

// log(x) for finite x > 0 as hi + lo (hi the rounded value).
fn log_dd(x: f32) -> vec2<f32> {
    let u = unpack_mag(bitcast<u32>(x));
    var mant = bitcast<f32>((u32(u.x) & 0x7fffffu) | 0x3f800000u);
    var e = u.y;
    if mant > 1.4142135 {
        mant = mant * 0.5;
        e = e + 1;
    }
    // log(mant) = log(c) + 2 atanh(s), s = (mant - c) / (mant + c), with c = 0.75, 1 or 1.25
    // (split at the geometric means), so that |s| < 0.072 and the f32 tail of the series
    // (2s^3/3 + ...) is below 0.0017 of the result.
    var c = 1.0;
    var c_hi = 0.0;
    var c_lo = 0.0;
    if mant < 0.8660254 {
        c = 0.75;
        c_hi = bitcast<f32>(0xbe934b11u);
        c_lo = bitcast<f32>(0x326cb247u);
    } else if mant >= 1.118034 {
        c = 1.25;
        c_hi = bitcast<f32>(0x3e647fbeu);
        c_lo = bitcast<f32>(0x31735344u);
    }
    // f is exact (Sterbenz), mant + c = den + den_err exactly.
    let f = mant - c;
    let dsum = two_sum(mant, c);
    let den = dsum.x;
    let den_err = dsum.y;
    let sh = f / den;
    // s = sh + sl with sl = (f - sh * (den + den_err)) / den. The products by halves are
    // exact; f - s1 * d1 is exact (Sterbenz: s1 * d1 is within 2^-11 of f), and what follows
    // is small.
    let s1 = hi12(sh);
    let s2 = sh - s1;
    let d1 = hi12(den);
    let d2 = den - d1;
    var r = f - s1 * d1;
    r = r - s1 * d2;
    r = r - s2 * d1;
    r = r - s2 * d2;
    r = r - sh * den_err;
    let sl = r / den;
    let z = sh * sh;
    let tail = 2.0 * sh * z * (1.0 / 3.0 + z * (1.0 / 5.0 + z * (1.0 / 7.0 + z * (1.0 / 9.0))));
    let ef = f32(e);
    // e * LN2_HI is exact (|e| <= 150).
    let a = two_sum(ef * LN2_HI, c_hi);
    let b = two_sum(a.x, 2.0 * sh);
    let lo = a.y + b.y + (ef * LN2_LO + c_lo + 2.0 * sl + tail);
    // Renormalize (Fast2Sum, |b.x| > |lo|) so that hi is the rounded log: callers estimate
    // y log x from hi alone.
    let hi = opaque(b.x + lo);
    return vec2<f32>(hi, lo - opaque(hi - b.x));
}

fn pow_f32(x: f32, y: f32) -> f32 {
    let bx = bitcast<u32>(x);
    let by = bitcast<u32>(y);
    let ax = bx & 0x7fffffffu;
    let ay = by & 0x7fffffffu;
    // pow(x, +-0) = 1 and pow(1, y) = 1, NaN included.
    if ay == 0u || bx == 0x3f800000u {
        return 1.0;
    }
    if ax > 0x7f800000u || ay > 0x7f800000u {
        return bitcast<f32>(0x7fc00000u);
    }
    let yneg = (by >> 31u) == 1u;
    if ay == 0x7f800000u {
        if ax == 0x3f800000u {
            return 1.0;
        }
        // |x| < 1: +0 for y = +inf, +inf for y = -inf; |x| > 1 the other way round.
        if (ax < 0x3f800000u) == yneg {
            return bitcast<f32>(0x7f800000u);
        }
        return 0.0;
    }
    // y is an integer (every |y| >= 2^24 is an even one), and odd.
    let ya = bitcast<f32>(ay);
    let big = ay >= 0x4b800000u;
    let yint = big || floor(ya) == ya;
    let yodd = yint && !big && (u32(ya) & 1u) == 1u;
    let xneg = (bx >> 31u) == 1u;
    let sign = select(0u, 0x80000000u, xneg && yodd);
    if ax == 0u || ax == 0x7f800000u {
        // (+-0)^y and (+-inf)^y: 0 or inf, negative for a negative x and an odd y.
        if yneg == (ax == 0u) {
            return bitcast<f32>(sign | 0x7f800000u);
        }
        return bitcast<f32>(sign);
    }
    if xneg && !yint {
        return bitcast<f32>(0x7fc00000u);
    }
    let l = log_dd(bitcast<f32>(ax));
    let zest = y * l.x;
    if zest > 89.0 {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if zest < -104.5 {
        return bitcast<f32>(sign);
    }
    // z = y * (l.x + l.y) as zh + zl.
    let y1 = hi12(y);
    let y2 = y - y1;
    let l1 = hi12(l.x);
    let l2 = l.x - l1;
    let a = two_sum(y1 * l1, y1 * l2);
    let b = two_sum(a.x, y2 * l1);
    let zh = b.x;
    let zl = a.y + b.y + (y2 * l2 + y * l.y);
    // exp(zh + zl): zh - k * LN2_HI is exact, the rest is small.
    let k = round(zh * LOG2E);
    let r = ((zh - k * LN2_HI) - k * LN2_LO) + zl;
    let ki = i32(k);
    let k1 = ki / 2;
    let mag = exp_reduced(r) * pow2i(k1) * pow2i(ki - k1);
    return bitcast<f32>(bitcast<u32>(mag) | sign);
}
