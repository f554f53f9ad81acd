// Helpers shared by the elementwise and cast shaders. Everything here works on bit patterns
// where exactness matters, so results do not depend on the driver's rounding of conversions,
// its denormal handling, or how it treats NaN in comparisons.

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// IEEE x < y for non-NaN x and y (-0 == +0), on integer keys that order floats totally.
fn f32_less(x: f32, y: f32) -> bool {
    let bx = bitcast<u32>(x);
    let by = bitcast<u32>(y);
    if ((bx | by) & 0x7fffffffu) == 0u {
        return false;
    }
    let kx = bitcast<i32>(bx ^ ((bx >> 31u) * 0x7fffffffu));
    let ky = bitcast<i32>(by ^ ((by >> 31u) * 0x7fffffffu));
    return kx < ky;
}

// f16 bits (low 16 bits of h) to f32: exact for every value, subnormals, infinities and NaN.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        // Zero or subnormal: m * 2^-24, a normal (or zero) f32, computed exactly.
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to f16 bits, round to nearest even; overflow gives infinity, NaN stays NaN (quiet).
fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = (b >> 23u) & 0xffu;
    let m = b & 0x7fffffu;
    if e == 255u {
        if m != 0u {
            return sign | 0x7e00u | (m >> 13u);
        }
        return sign | 0x7c00u;
    }
    let ue = i32(e) - 127;
    if ue > 15 {
        return sign | 0x7c00u;
    }
    if ue >= -14 {
        // Normal f16. A carry out of the mantissa bumps the exponent (up to infinity): exact.
        var h = (u32(ue + 15) << 10u) | (m >> 13u);
        let rest = m & 0x1fffu;
        if rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u) {
            h = h + 1u;
        }
        return sign | h;
    }
    if ue < -25 {
        return sign;
    }
    // Subnormal f16: the value is M * 2^(ue - 23) with M = 1.m as a 24-bit integer; in units
    // of 2^-24 that is M >> s with s = -ue - 1 in [14, 24].
    let mm = m | 0x800000u;
    let s = u32(-ue - 1);
    var h = mm >> s;
    let rest = mm & ((1u << s) - 1u);
    let half = 1u << (s - 1u);
    if rest > half || (rest == half && (h & 1u) == 1u) {
        h = h + 1u;
    }
    return sign | h;
}
