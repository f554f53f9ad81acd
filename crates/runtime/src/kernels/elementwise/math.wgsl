// f32 math for the unary ops. WGSL's built-in exp/log/tanh only promise loose accuracy
// (exp: 3 + 2|x| ULP; log: 2^-21 absolute near 1; tanh is inherited from sinh/cosh and may be
// NaN for large |x|), so exp, log, tanh and sigmoid are computed here from argument reduction
// and short series using only +, -, * and /. Special values are decided on bit patterns.
// Needs common.wgsl (is_nan).

// ln 2 split for Cody-Waite reduction: LN2_HI has 15 significant bits, so k * LN2_HI is exact
// for |k| < 512; LN2_LO = ln 2 - LN2_HI.
const LN2_HI: f32 = 0.693145751953125;
const LN2_LO: f32 = 1.428606765330187e-6;
const LOG2E: f32 = 1.4426950408889634;

// 2^k for k in [-126, 127], from bits.
fn pow2i(k: i32) -> f32 {
    return bitcast<f32>(u32(k + 127) << 23u);
}

// +infinity with no constant expression producing it (WGSL rejects infinite constants).
fn pos_inf(x: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(x) & 0u) | 0x7f800000u);
}

// exp(r) for |r| <= 0.35: Taylor series to degree 10 (truncation < 1e-11 relative), Horner.
fn exp_reduced(r: f32) -> f32 {
    var q = 1.0 + r * (1.0 / 10.0);
    q = 1.0 + r * (1.0 / 9.0) * q;
    q = 1.0 + r * (1.0 / 8.0) * q;
    q = 1.0 + r * (1.0 / 7.0) * q;
    q = 1.0 + r * (1.0 / 6.0) * q;
    q = 1.0 + r * (1.0 / 5.0) * q;
    q = 1.0 + r * (1.0 / 4.0) * q;
    q = 1.0 + r * (1.0 / 3.0) * q;
    q = 1.0 + r * (1.0 / 2.0) * q;
    return 1.0 + r * q;
}

fn exp_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    if x > 88.8 {
        return pos_inf(x);
    }
    if x < -104.0 {
        return 0.0;
    }
    let k = round(x * LOG2E);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 2^k in two normal factors (k is in [-150, 128]); the products over- or underflow
    // exactly where exp does.
    let ki = i32(k);
    let k1 = ki / 2;
    return exp_reduced(r) * pow2i(k1) * pow2i(ki - k1);
}

// exp(y) - 1 for y <= 0 without cancellation: Taylor series to degree 14 for y > -1.1
// (truncation < 1e-10 relative), exp(y) - 1 below (no cancellation there: exp(y) < 0.34).
fn expm1_neg(y: f32) -> f32 {
    if y > -1.1 {
        var q = 1.0 + y * (1.0 / 14.0);
        q = 1.0 + y * (1.0 / 13.0) * q;
        q = 1.0 + y * (1.0 / 12.0) * q;
        q = 1.0 + y * (1.0 / 11.0) * q;
        q = 1.0 + y * (1.0 / 10.0) * q;
        q = 1.0 + y * (1.0 / 9.0) * q;
        q = 1.0 + y * (1.0 / 8.0) * q;
        q = 1.0 + y * (1.0 / 7.0) * q;
        q = 1.0 + y * (1.0 / 6.0) * q;
        q = 1.0 + y * (1.0 / 5.0) * q;
        q = 1.0 + y * (1.0 / 4.0) * q;
        q = 1.0 + y * (1.0 / 3.0) * q;
        q = 1.0 + y * (1.0 / 2.0) * q;
        return y * q;
    }
    return exp_f32(y) - 1.0;
}

fn log_f32(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if is_nan(x) {
        return x;
    }
    if (bits & 0x7fffffffu) == 0u {
        // log(+-0) = -inf
        return bitcast<f32>(bits | 0xff800000u);
    }
    if bits > 0x80000000u {
        // negative (including -inf): NaN
        return bitcast<f32>(bits | 0x7fc00000u);
    }
    if bits == 0x7f800000u {
        return x;
    }
    // x = mant * 2^e with mant in [sqrt(1/2), sqrt(2)); subnormals normalized on the bits.
    var e = i32(bits >> 23u);
    var m = bits & 0x7fffffu;
    if e == 0 {
        let s = countLeadingZeros(m) - 8u;
        m = (m << s) & 0x7fffffu;
        e = 1 - i32(s);
    }
    var mant = bitcast<f32>(m | 0x3f800000u);
    e = e - 127;
    if mant > 1.4142135 {
        mant = mant * 0.5;
        e = e + 1;
    }
    // log(1 + f) = 2 atanh(s) with s = f / (2 + f), |s| < 0.172. Written as
    // f - s * (f - 2R), R = s^2/3 + s^4/5 + ..., so the leading term f (exact) carries no
    // division error; the series is truncated after s^14/15 (< 1e-12 relative).
    let f = mant - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * (1.0 / 3.0 + z * (1.0 / 5.0 + z * (1.0 / 7.0 + z * (1.0 / 9.0 + z * (1.0 / 11.0 + z * (1.0 / 13.0 + z * (1.0 / 15.0)))))));
    let l1p = f - s * (f - 2.0 * r);
    let ef = f32(e);
    return ef * LN2_HI + (l1p + ef * LN2_LO);
}

fn tanh_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    let bits = bitcast<u32>(x);
    let a = bitcast<f32>(bits & 0x7fffffffu);
    var t: f32;
    if a > 9.1 {
        // 1 - tanh(a) < 2^-25: rounds to 1.
        t = 1.0;
    } else if a >= 0.55 {
        let e = exp_f32(-2.0 * a);
        t = (1.0 - e) / (1.0 + e);
    } else if a >= 0.0001220703125 {
        let em = expm1_neg(-2.0 * a);
        t = -em / (2.0 + em);
    } else {
        // tanh(a) = a (1 - a^2/3 + ...): a^2/3 < 2^-27.
        t = a;
    }
    return bitcast<f32>(bitcast<u32>(t) | (bits & 0x80000000u));
}

fn sigmoid_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    if x >= 0.0 {
        return 1.0 / (1.0 + exp_f32(-x));
    }
    let e = exp_f32(x);
    return e / (1.0 + e);
}

fn sqrt_f32(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if is_nan(x) || bits == 0x7f800000u || (bits & 0x7fffffffu) == 0u {
        // NaN, +inf, +-0 are their own square roots.
        return x;
    }
    if bits > 0x80000000u {
        return bitcast<f32>(bits | 0x7fc00000u);
    }
    if bits < 0x800000u {
        // Subnormal (which drivers that flush denormals would read as 0):
        // x = m * 2^-149 = 2m * 2^-150, so sqrt(x) = sqrt(2m) * 2^-75, all exact but the sqrt.
        return sqrt(f32(bits * 2u)) * pow2i(-75);
    }
    return sqrt(x);
}

fn relu_f32(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    // Negative, not -0, not NaN: 0. NaN and -0 pass through (TF: max(x, 0) keeps x).
    if bits > 0x80000000u && bits <= 0xff800000u {
        return 0.0;
    }
    return x;
}
