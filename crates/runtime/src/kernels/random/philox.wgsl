// TensorFlow's Philox4x32-10 random kernels (tensorflow/core/lib/random/philox_random.h,
// random_distributions.h, kernels/random_op_gpu.h), reproduced bit for bit where TensorFlow's
// arithmetic is exact (uniform floats, integers) and within a few ULP where it calls libm
// (the Box-Muller log, sqrt, sin and cos, computed here by argument reduction and series).
//
// Output element i belongs to group g = i / GROUP. Group g of a distribution that takes a
// fixed number of samples is computed from the Philox block at counter + g; group g of the
// truncated normal (variable samples) from the single-sample stream starting at block
// counter + 256 * g. Each invocation computes one group. Placeholders (dollar-prefixed): DIST
// (the variant), COMMON and MATH (shared f16 and f32 math), LINEAR_INDEX, WG.
struct Params {
    row: u32,
    // Output elements.
    n: u32,
    // Groups (invocations doing work).
    groups: u32,
    // 1: key and counter come from the key / counter tensors, 0: from k0.. / c0.. below.
    from_mem: u32,
    k0: u32,
    k1: u32,
    c0: u32,
    c1: u32,
    c2: u32,
    c3: u32,
    // Integer distributions: minval and maxval - minval (low, high words).
    lo0: u32,
    lo1: u32,
    range0: u32,
    range1: u32,
    pad0: u32,
    pad1: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> key_mem: array<u32>;
@group(0) @binding(3) var<storage, read_write> counter_mem: array<u32>;

$LINEAR_INDEX
$COMMON
$MATH

// 0 uniform f32, 1 uniform f16, 2 normal f32, 3 normal f16, 4 truncated f32,
// 5 truncated f16, 6 uniform int32, 7 uniform int64, 8 full-range int32, 9 full-range int64.
const DIST: u32 = $DISTu;

// The 64-bit product of two u32 as (low, high), from 16-bit halves.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(a * b, hi);
}

fn philox(counter: vec4<u32>, key_in: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key_in;
    for (var round = 0u; round < 10u; round = round + 1u) {
        if round > 0u {
            k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let m0 = mul_wide(0xD2511F53u, c.x);
        let m1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(m1.y ^ c.y ^ k.x, m1.x, m0.y ^ c.w ^ k.y, m0.x);
    }
    return c;
}

// PhiloxRandom::Skip(count) with count = (lo, hi), carries as TensorFlow does them.
fn skip(counter: vec4<u32>, lo: u32, hi_in: u32) -> vec4<u32> {
    var c = counter;
    var hi = hi_in;
    c.x = c.x + lo;
    if c.x < lo {
        hi = hi + 1u;
    }
    c.y = c.y + hi;
    if c.y < hi {
        c.z = c.z + 1u;
        if c.z == 0u {
            c.w = c.w + 1u;
        }
    }
    return c;
}

// The next counter (PhiloxRandom::SkipOne).
fn next_counter(c: vec4<u32>) -> vec4<u32> {
    return skip(c, 1u, 0u);
}

// Uint32ToFloat: 23 random mantissa bits as a float in [0, 1) (exact).
fn u32_to_unit(x: u32) -> f32 {
    return bitcast<f32>(0x3f800000u | (x & 0x7fffffu)) - 1.0;
}

// float(2 * M_PI * (double)Uint32ToFloat(x)), as TensorFlow computes it in double: the
// product M * m * 2^-73 (M the 53-bit mantissa of 2*pi in double, m the 23 mantissa bits of
// the uniform) rounded to double, then to float, both to nearest even, in integers.
fn two_pi_times_unit(x: u32) -> f32 {
    let m = x & 0x7fffffu;
    if m == 0u {
        return 0.0;
    }
    let a = mul_wide(m, 0x54442D18u);
    let b = mul_wide(m, 0x001921FBu);
    let p0 = a.x;
    let p1 = a.y + b.x;
    let p2 = b.y + select(0u, 1u, p1 < a.y);
    // Bit length of the product (m >= 1, so at least 53).
    var len = 64u - countLeadingZeros(p1);
    if p2 != 0u {
        len = 96u - countLeadingZeros(p2);
    }
    // Round to 53 bits (double).
    let r1 = len - 53u;
    var q0 = p0;
    var q1 = p1;
    if r1 > 0u {
        q0 = (p0 >> r1) | (p1 << (32u - r1));
        q1 = (p1 >> r1) | (p2 << (32u - r1));
        let rem = p0 & ((1u << r1) - 1u);
        let half = 1u << (r1 - 1u);
        if rem > half || (rem == half && (q0 & 1u) == 1u) {
            q0 = q0 + 1u;
            if q0 == 0u {
                q1 = q1 + 1u;
            }
        }
    }
    // Round the 53- or 54-bit double mantissa to 24 bits (float).
    let r2 = (64u - countLeadingZeros(q1)) - 24u;
    var r = (q0 >> r2) | (q1 << (32u - r2));
    let rem2 = q0 & ((1u << r2) - 1u);
    let half2 = 1u << (r2 - 1u);
    if rem2 > half2 || (rem2 == half2 && (r & 1u) == 1u) {
        r = r + 1u;
    }
    return f32(r) * pow2i(i32(r1 + r2) - 73);
}

// (sin x, cos x) for x in [0, 2 pi]: x = k pi/2 + r with pi/2 split in three parts (k * P1
// and k * P2 are exact), then Taylor series on |r| <= pi/4 (truncation below 1e-11).
fn sincos_f32(x: f32) -> vec2<f32> {
    let k = round(x * 0.63661977);
    let r = ((x - k * 1.5703125) - k * 4.837512969970703e-4) - k * 7.549790126404332e-8;
    let z = r * r;
    let s = r + r * z * (-1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (1.0 / 362880.0 + z * (-1.0 / 39916800.0)))));
    let c = 1.0 - 0.5 * z + z * z * (1.0 / 24.0 + z * (-1.0 / 720.0 + z * (1.0 / 40320.0 + z * (-1.0 / 3628800.0 + z * (1.0 / 479001600.0)))));
    let q = u32(k) & 3u;
    if q == 0u {
        return vec2<f32>(s, c);
    }
    if q == 1u {
        return vec2<f32>(c, -s);
    }
    if q == 2u {
        return vec2<f32>(-s, -c);
    }
    return vec2<f32>(-c, s);
}

// BoxMullerFloat.
fn box_muller(x0: u32, x1: u32) -> vec2<f32> {
    var u1 = u32_to_unit(x0);
    if u1 < 1.0e-7 {
        u1 = 1.0e-7;
    }
    let v1 = two_pi_times_unit(x1);
    let u2 = sqrt_f32(-2.0 * log_f32(u1));
    let sc = sincos_f32(v1);
    return vec2<f32>(sc.x * u2, sc.y * u2);
}

// Uint16ToHalf: 10 random mantissa bits as a half in [0, 1), as f16 bits.
fn u32_to_unit_half(x: u32) -> u32 {
    return f32_to_f16(f32(x & 0x3ffu) * 0.0009765625);
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// a % d for unsigned 64-bit (low, high) pairs, d != 0: restoring division, one bit a step.
fn mod64(a: vec2<u32>, d: vec2<u32>) -> vec2<u32> {
    if a.y == 0u && d.y == 0u {
        return vec2<u32>(a.x % d.x, 0u);
    }
    var r = vec2<u32>(0u, 0u);
    for (var i = 63i; i >= 0; i = i - 1) {
        let top = r.y >> 31u;
        var bit = 0u;
        if i >= 32 {
            bit = (a.y >> u32(i - 32)) & 1u;
        } else {
            bit = (a.x >> u32(i)) & 1u;
        }
        r = vec2<u32>((r.x << 1u) | bit, (r.y << 1u) | (r.x >> 31u));
        if top == 1u || ge64(r, d) {
            // r - d (mod 2^64): exact, since the true r is below 2d.
            let lo = r.x - d.x;
            r = vec2<u32>(lo, r.y - d.y - select(0u, 1u, r.x < d.x));
        }
    }
    return r;
}

fn store_f32x4(g: u32, v: vec4<f32>) {
    let e0 = g * 4u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if e0 + i < p.n {
            out[e0 + i] = bitcast<u32>(v[i]);
        }
    }
}

// Four halves (f16 bits in the low 16 bits of each lane) as two words; halves past the end
// are 0 and a word holding none of the output is not written.
fn store_f16x4(g: u32, h: vec4<u32>) {
    let e0 = g * 4u;
    var hv = h;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if e0 + i >= p.n {
            hv[i] = 0u;
        }
    }
    out[g * 2u] = hv.x | (hv.y << 16u);
    if e0 + 2u < p.n {
        out[g * 2u + 1u] = hv.z | (hv.w << 16u);
    }
}

fn store_i32x4(g: u32, v: vec4<u32>) {
    let e0 = g * 4u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if e0 + i < p.n {
            out[e0 + i] = v[i];
        }
    }
}

// Two int64 elements (low, high words each).
fn store_i64x2(g: u32, a: vec2<u32>, b: vec2<u32>) {
    let e0 = g * 2u;
    out[e0 * 2u] = a.x;
    out[e0 * 2u + 1u] = a.y;
    if e0 + 1u < p.n {
        out[e0 * 2u + 2u] = b.x;
        out[e0 * 2u + 3u] = b.y;
    }
}

fn f32x4_to_f16x4(v: vec4<f32>) -> vec4<u32> {
    return vec4<u32>(f32_to_f16(v.x), f32_to_f16(v.y), f32_to_f16(v.z), f32_to_f16(v.w));
}

// TruncatedNormalDistribution over a SingleSampleAdapter: pairs of samples through
// Box-Muller, keeping values with |x| < 2, until four are kept. TensorFlow loops without
// bound; here the loop stops after 4096 pairs (each pair fails with probability 0.002, so
// this never happens in practice), leaving the rest of the group 0.
fn truncated4(start: vec4<u32>, key: vec2<u32>) -> vec4<f32> {
    var c = start;
    var block = vec4<u32>(0u);
    var used = 4u;
    var res = vec4<f32>(0.0);
    var count = 0u;
    for (var it = 0u; it < 4096u && count < 4u; it = it + 1u) {
        if used == 4u {
            block = philox(c, key);
            c = next_counter(c);
            used = 0u;
        }
        let f = box_muller(block[used], block[used + 1u]);
        used = used + 2u;
        if abs(f.x) < 2.0 {
            res[count] = f.x;
            count = count + 1u;
            if count == 4u {
                break;
            }
        }
        if abs(f.y) < 2.0 {
            res[count] = f.y;
            count = count + 1u;
        }
    }
    return res;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = linear_index(gid);
    if g >= p.groups {
        return;
    }
    var key = vec2<u32>(p.k0, p.k1);
    var base = vec4<u32>(p.c0, p.c1, p.c2, p.c3);
    if p.from_mem == 1u {
        key = vec2<u32>(key_mem[0], key_mem[1]);
        base = vec4<u32>(counter_mem[0], counter_mem[1], counter_mem[2], counter_mem[3]);
    }
    if DIST == 4u || DIST == 5u {
        let v = truncated4(skip(base, g << 8u, g >> 24u), key);
        if DIST == 4u {
            store_f32x4(g, v);
        } else {
            store_f16x4(g, f32x4_to_f16x4(v));
        }
        return;
    }
    let s = philox(skip(base, g, 0u), key);
    switch DIST {
        case 0u: {
            store_f32x4(g, vec4<f32>(u32_to_unit(s.x), u32_to_unit(s.y), u32_to_unit(s.z), u32_to_unit(s.w)));
        }
        case 1u: {
            store_f16x4(g, vec4<u32>(u32_to_unit_half(s.x), u32_to_unit_half(s.y), u32_to_unit_half(s.z), u32_to_unit_half(s.w)));
        }
        case 2u, 3u: {
            let a = box_muller(s.x, s.y);
            let b = box_muller(s.z, s.w);
            let v = vec4<f32>(a.x, a.y, b.x, b.y);
            if DIST == 2u {
                store_f32x4(g, v);
            } else {
                store_f16x4(g, f32x4_to_f16x4(v));
            }
        }
        case 6u: {
            let lo = p.lo0;
            store_i32x4(g, vec4<u32>(lo + s.x % p.range0, lo + s.y % p.range0, lo + s.z % p.range0, lo + s.w % p.range0));
        }
        case 7u: {
            let lo = vec2<u32>(p.lo0, p.lo1);
            let range = vec2<u32>(p.range0, p.range1);
            store_i64x2(g, add64(lo, mod64(s.xy, range)), add64(lo, mod64(s.zw, range)));
        }
        case 8u: {
            store_i32x4(g, s);
        }
        default: {
            store_i64x2(g, s.xy, s.zw);
        }
    }
}
