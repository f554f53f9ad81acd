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

// exp(y) - 1 for |y| < 1.1 without cancellation: Taylor series to degree 14 (truncation
// < 1e-10 relative).
fn expm1_small(y: f32) -> f32 {
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

// exp(y) - 1 for y <= 0 without cancellation: the series for y > -1.1, exp(y) - 1 below (no
// cancellation there: exp(y) < 0.34).
fn expm1_neg(y: f32) -> f32 {
    if y > -1.1 {
        return expm1_small(y);
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
    let l1p = log1p_reduced(mant - 1.0);
    let ef = f32(e);
    return ef * LN2_HI + (l1p + ef * LN2_LO);
}

// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: 2 atanh(s) with s = f / (2 + f),
// |s| < 0.172. Written as f - s * (f - 2R), R = s^2/3 + s^4/5 + ..., so the leading term f
// (exact) carries no division error; the series is truncated after s^14/15 (< 1e-12
// relative).
fn log1p_reduced(f: f32) -> f32 {
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * (1.0 / 3.0 + z * (1.0 / 5.0 + z * (1.0 / 7.0 + z * (1.0 / 9.0 + z * (1.0 / 11.0 + z * (1.0 / 13.0 + z * (1.0 / 15.0)))))));
    return f - s * (f - 2.0 * r);
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

// log(1 + x). Near 0 (x in [sqrt(1/2) - 1, sqrt(2) - 1]) the series on x itself, so no
// rounding of 1 + x is involved; elsewhere log(1 + x), where the rounding of 1 + x changes the
// result by at most 1.5 ULP (|log(1 + x)| > 0.34 there). Log1p(-1) = -inf, Log1p(x < -1) = NaN.
fn log1p_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    if x >= -0.29289323 && x <= 0.41421354 {
        // -0 stays -0: the series gives f - s * (f - 2R) = -0 - (-0) * ... = -0.
        if (bitcast<u32>(x) & 0x7fffffffu) == 0u {
            return x;
        }
        return log1p_reduced(x);
    }
    return log_f32(1.0 + x);
}

// exp(x) - 1: the series for |x| < 1.1, exp(x) - 1 elsewhere (no cancellation there).
fn expm1_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    if x > -1.1 && x < 1.1 {
        return expm1_small(x);
    }
    return exp_f32(x) - 1.0;
}

// TensorFlow's Softplus: with t = log(FLT_EPSILON) + 2 = -13.942385 (rounded to f32),
// x for x > -t, exp(x) for x < t, log1p(exp(x)) between.
fn softplus_f32(x: f32) -> f32 {
    if is_nan(x) {
        return x;
    }
    let t = bitcast<f32>(0xc15f1402u);
    if x > -t {
        return x;
    }
    let e = exp_f32(x);
    if x < t {
        return e;
    }
    return log1p_f32(e);
}

// 1 / sqrt(x): inverseSqrt (Vulkan: 2 ULP) with IEEE special values decided on the bits
// (Rsqrt(+-0) = +-inf, Rsqrt(x < 0) = NaN, Rsqrt(inf) = 0). Subnormal inputs are scaled into
// the normal range first (exactly), so drivers that flush denormals still see them.
fn rsqrt_f32(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if is_nan(x) {
        return x;
    }
    if (bits & 0x7fffffffu) == 0u {
        return bitcast<f32>(bits | 0x7f800000u);
    }
    if bits > 0x80000000u {
        return bitcast<f32>(bits | 0x7fc00000u);
    }
    if bits == 0x7f800000u {
        return 0.0;
    }
    if bits < 0x800000u {
        // x = m * 2^-149 = 2m * 2^-150: 1/sqrt(x) = inverseSqrt(2m) * 2^75.
        return inverseSqrt(f32(bits * 2u)) * pow2i(75);
    }
    return inverseSqrt(x);
}

// floor / ceil / round (half to even) with the IEEE sign of a zero result (the sign of x:
// Ceil(-0.5) = -0, Round(-0.2) = -0) and infinities and NaN passed through, decided on the
// bits rather than left to the driver.
fn keep_sign(x: f32, r: f32) -> f32 {
    if (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u {
        return x;
    }
    return bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(x) & 0x80000000u));
}

fn floor_f32(x: f32) -> f32 {
    return keep_sign(x, floor(x));
}

fn ceil_f32(x: f32) -> f32 {
    return keep_sign(x, ceil(x));
}

fn round_f32(x: f32) -> f32 {
    return keep_sign(x, round(x));
}

// v * 2^k for k in [-252, 254], exact when the result is representable (two normal factors).
fn scale2(v: f32, k: i32) -> f32 {
    let k1 = k / 2;
    return v * pow2i(k1) * pow2i(k - k1);
}

// |x| for the bits `b` of a finite nonzero float, as (m, e) with |x| = m * 2^(e - 23) and m in
// [2^23, 2^24) (subnormals normalized).
fn unpack_mag(b: u32) -> vec2<i32> {
    var e = i32((b >> 23u) & 0xffu);
    var m = b & 0x7fffffu;
    if e == 0 {
        let s = countLeadingZeros(m) - 8u;
        m = m << s;
        e = 1 - i32(s);
    } else {
        m = m | 0x800000u;
    }
    return vec2<i32>(i32(m), e - 127);
}

// C's fmod: x - trunc(x / y) * y, which is always exact; computed by long division on the
// integer mantissas (8 bits per step). fmod(x, 0), fmod(+-inf, y) and NaN give NaN;
// fmod(x, +-inf) = x; the sign is x's.
fn fmod_f32(x: f32, y: f32) -> f32 {
    let bx = bitcast<u32>(x);
    let ax = bx & 0x7fffffffu;
    let ay = bitcast<u32>(y) & 0x7fffffffu;
    if ax >= 0x7f800000u || ay > 0x7f800000u || ay == 0u {
        return bitcast<f32>(0x7fc00000u);
    }
    if ay == 0x7f800000u || ax < ay {
        return x;
    }
    let ux = unpack_mag(ax);
    let uy = unpack_mag(ay);
    let my = u32(uy.x);
    var r = u32(ux.x) % my;
    var d = ux.y - uy.y;
    loop {
        if d <= 0 || r == 0u {
            break;
        }
        let s = min(d, 8);
        r = (r << u32(s)) % my;
        d = d - s;
    }
    // r * 2^(ey - 23) is a multiple of the smaller ULP of x and y: representable.
    let mag = scale2(f32(r), uy.y - 23);
    return bitcast<f32>(bitcast<u32>(mag) | (bx & 0x80000000u));
}

// x / y rounded to nearest even, with IEEE special values, by long division on the integer
// mantissas (so it does not depend on the driver's division, which Vulkan lets be 2.5 ULP
// off). Subnormal results are rounded once, like IEEE hardware without flush-to-zero.
fn div_rn_f32(x: f32, y: f32) -> f32 {
    let bx = bitcast<u32>(x);
    let by = bitcast<u32>(y);
    let sign = (bx ^ by) & 0x80000000u;
    let ax = bx & 0x7fffffffu;
    let ay = by & 0x7fffffffu;
    let inf = sign | 0x7f800000u;
    if ax > 0x7f800000u || ay > 0x7f800000u || (ax == ay && (ax == 0u || ax == 0x7f800000u)) {
        // NaN, 0/0, inf/inf
        return bitcast<f32>(0x7fc00000u);
    }
    if ax == 0x7f800000u || ay == 0u {
        return bitcast<f32>(inf);
    }
    if ax == 0u || ay == 0x7f800000u {
        return bitcast<f32>(sign);
    }
    let ux = unpack_mag(ax);
    let uy = unpack_mag(ay);
    let my = u32(uy.x);
    var r = u32(ux.x);
    var e = ux.y - uy.y;
    if r < my {
        r = r << 1u;
        e = e - 1;
    }
    // r / my is in [1, 2): 25 quotient bits (24 and a rounding bit), the rest is sticky.
    var q = 0u;
    for (var i = 0u; i < 25u; i = i + 1u) {
        q = q << 1u;
        if r >= my {
            r = r - my;
            q = q | 1u;
        }
        r = r << 1u;
    }
    let sticky = r != 0u;
    if e > 127 {
        return bitcast<f32>(inf);
    }
    // The quotient is q * 2^(e - 24). Drop 1 bit for a normal result, more for a subnormal
    // one (whose unit is 2^-149).
    var sh = 1u;
    if e < -126 {
        sh = u32(min(-125 - e, 31));
    }
    var mant = q >> sh;
    let rem = q & ((1u << sh) - 1u);
    let half = 1u << (sh - 1u);
    if rem > half || (rem == half && (sticky || (mant & 1u) == 1u)) {
        mant = mant + 1u;
    }
    if e < -126 {
        // A carry to 2^23 is the smallest normal number: the bits are right as they are.
        return bitcast<f32>(sign | mant);
    }
    if mant == 0x1000000u {
        mant = 0x800000u;
        e = e + 1;
        if e > 127 {
            return bitcast<f32>(inf);
        }
    }
    return bitcast<f32>(sign | (u32(e + 127) << 23u) | (mant & 0x7fffffu));
}
