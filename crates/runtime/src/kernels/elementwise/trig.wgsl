// sin and cos in f32 with exact argument reduction (Payne-Hanek) for every finite argument:
// x * 2/pi is formed with a 96-bit window of the bits of 2/pi and integer arithmetic, so large
// arguments (1e30, 3e38) are reduced as exactly as small ones. The reduced argument
// r in [-pi/4, pi/4] is then multiplied out from the fraction in three exact partial
// products, and sin/cos of r come from Taylor series (truncation < 2e-9 relative).
// Needs common.wgsl (is_nan).

// The first 320 bits of 2/pi, most significant first.
const TWO_OVER_PI = array<u32, 10>(
    0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u,
    0x3c439041u, 0xfe5163abu, 0xdebbc561u, 0xb7246e3au, 0x424dd2e0u
);

// pi/2 = PIO2_1 + PIO2_2 + PIO2_3, the first two with 12 significant bits (products with
// 12-bit factors are exact in f32).
const PIO2_1: f32 = 1.5703125;
const PIO2_2: f32 = 0.0004837512969970703;
const PIO2_3: f32 = 7.549789954891882e-08;

// Bits pos .. pos + 31 of 2/pi (bit 1 is the first after the binary point); bits at
// positions <= 0 are 0.
fn two_over_pi_bits(pos: i32) -> u32 {
    let j = pos - 1;
    if j <= -32 {
        return 0u;
    }
    if j < 0 {
        return TWO_OVER_PI[0] >> u32(-j);
    }
    let w = u32(j) / 32u;
    let o = u32(j) % 32u;
    if o == 0u {
        return TWO_OVER_PI[w];
    }
    return (TWO_OVER_PI[w] << o) | (TWO_OVER_PI[w + 1u] >> (32u - o));
}

// The 64-bit product a * b as (low, high).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let hh = ah * bh;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    let lo = (ll & 0xffffu) | (mid << 16u);
    let hi = hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}

// For finite |x| >= pi/4 (bits of |x| in ax): the quadrant (x * 2/pi rounded to nearest,
// mod 4) and the reduced argument x - quadrant * pi/2 in [-pi/4, pi/4].
fn trig_reduce(ax: u32) -> vec2<f32> {
    let m = (ax & 0x7fffffu) | 0x800000u;
    // |x| = m * 2^e.
    let e = i32(ax >> 23u) - 150;
    // With the window starting at bit e - 1, m * window * 2^-94 is x * 2/pi minus a
    // multiple of 4 (the bits before the window contribute multiples of 4).
    let s = e - 1;
    let w0 = two_over_pi_bits(s);
    let w1 = two_over_pi_bits(s + 32);
    let w2 = two_over_pi_bits(s + 64);
    let p2 = mul_wide(m, w2);
    let p1 = mul_wide(m, w1);
    let p0 = mul_wide(m, w0);
    // The 120-bit product r2:r1:r0 (bits 96.. do not matter: multiples of 4).
    let r0 = p2.x;
    let r1 = p2.y + p1.x;
    let c1 = select(0u, 1u, r1 < p2.y);
    let r2 = p1.y + p0.x + c1;
    // Integer part mod 4: bits 94, 95; the fraction: bits 93 .. 30.
    var q = r2 >> 30u;
    var fhi = (r2 << 2u) | (r1 >> 30u);
    var flo = (r1 << 2u) | (r0 >> 30u);
    var neg = false;
    if (fhi >> 31u) == 1u {
        // Fraction >= 1/2: round up, the fraction becomes f - 1 (its magnitude is 1 - f).
        q = (q + 1u) & 3u;
        neg = true;
        flo = ~flo + 1u;
        fhi = ~fhi + select(0u, 1u, flo == 0u);
    }
    // Normalize the 64-bit fraction fhi:flo so its top bit is bit 63.
    var shift = 0u;
    if fhi == 0u {
        fhi = flo;
        flo = 0u;
        shift = 32u;
    }
    if fhi == 0u {
        return vec2<f32>(f32(q), 0.0);
    }
    let lz = countLeadingZeros(fhi);
    if lz > 0u {
        fhi = (fhi << lz) | (flo >> (32u - lz));
        flo = flo << lz;
    }
    shift = shift + lz;
    // fraction = (fa * 2^12 + fb + fc * 2^-24) * 2^-(24 + shift), with fa, fb 12-bit integers.
    let fa = f32(fhi >> 20u);
    let fb = f32((fhi >> 8u) & 0xfffu);
    let fc = f32(((fhi & 0xffu) << 16u) | (flo >> 16u)) * 5.9604644775390625e-8;
    // scale = 2^-(24 + shift), shift <= 95 - 24 (the fraction has at least 24 bits).
    let k = 24 + i32(shift);
    let scale = pow2i(-(k / 2)) * pow2i(-(k - k / 2));
    let a = fa * 4096.0;
    let big = a * PIO2_1;
    let mid = fb * PIO2_1 + a * PIO2_2;
    let small = fb * PIO2_2 + (a + fb) * PIO2_3 + fc * (PIO2_1 + PIO2_2);
    var r = (big + (mid + small)) * scale;
    if neg {
        r = -r;
    }
    return vec2<f32>(f32(q), r);
}

// sin(r) and cos(r) for |r| <= pi/4.
fn sin_poly(r: f32) -> f32 {
    let z = r * r;
    var p = -1.0 / 39916800.0;
    p = p * z + 1.0 / 362880.0;
    p = p * z - 1.0 / 5040.0;
    p = p * z + 1.0 / 120.0;
    p = p * z - 1.0 / 6.0;
    return r + r * z * p;
}

fn cos_poly(r: f32) -> f32 {
    let z = r * r;
    var p = 1.0 / 479001600.0;
    p = p * z - 1.0 / 3628800.0;
    p = p * z + 1.0 / 40320.0;
    p = p * z - 1.0 / 720.0;
    p = p * z + 1.0 / 24.0;
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    return w + (((1.0 - w) - hz) + z * z * p);
}

// (quadrant, reduced argument) of the finite |x| with bits ax: no reduction below pi/4
// (0x3f490fdb).
fn reduce_any(ax: u32) -> vec2<f32> {
    if ax >= 0x3f490fdbu {
        return trig_reduce(ax);
    }
    return vec2<f32>(0.0, bitcast<f32>(ax));
}

// sin (want_cos = false) or cos of x.
fn sincos_f32(x: f32, want_cos: bool) -> f32 {
    let b = bitcast<u32>(x);
    let ax = b & 0x7fffffffu;
    if ax >= 0x7f800000u {
        // NaN or infinity: NaN.
        return bitcast<f32>(ax | 0x7fc00000u);
    }
    let red = reduce_any(ax);
    let q = u32(red.x);
    let r = red.y;
    if want_cos {
        var c: f32;
        switch q {
            case 0u: { c = cos_poly(r); }
            case 1u: { c = -sin_poly(r); }
            case 2u: { c = -cos_poly(r); }
            default: { c = sin_poly(r); }
        }
        return c;
    }
    var s: f32;
    switch q {
        case 0u: { s = sin_poly(r); }
        case 1u: { s = cos_poly(r); }
        case 2u: { s = -sin_poly(r); }
        default: { s = -cos_poly(r); }
    }
    // sin is odd: restore the sign of x (sin(-0) = -0).
    return bitcast<f32>(bitcast<u32>(s) ^ (b & 0x80000000u));
}

// tan of x: sin / cos of the reduced argument, or -cos / sin in the odd quadrants (tan has
// period pi); odd, NaN for NaN and infinities.
fn tan_f32(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let ax = b & 0x7fffffffu;
    if ax >= 0x7f800000u {
        return bitcast<f32>(ax | 0x7fc00000u);
    }
    let red = reduce_any(ax);
    let q = u32(red.x);
    let r = red.y;
    var t: f32;
    if (q & 1u) == 0u {
        t = sin_poly(r) / cos_poly(r);
    } else {
        t = -cos_poly(r) / sin_poly(r);
    }
    return bitcast<f32>(bitcast<u32>(t) ^ (b & 0x80000000u));
}
