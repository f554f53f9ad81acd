// Cast between f32, f16, i32, i64, u8 and bool. Placeholders filled in by mod.rs: S (the
// loaded representation: f32 for floats, a two's complement (low, high) i64 pair for
// integers and bool), D (the converted value), LOAD, CONV, STORE. Each invocation writes one
// 32-bit output word (one i64 element: two words).
struct Params {
    row: u32,
    n: u32,
    units: u32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON

// ---- 64-bit integers as vec2<u32>(low, high) ----

fn neg64(v: vec2<u32>) -> vec2<u32> {
    let lo = ~v.x + 1u;
    return vec2<u32>(lo, ~v.y + select(0u, 1u, lo == 0u));
}

// v << s for s in [0, 63].
fn shl64(v: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return v;
    }
    if s < 32u {
        return vec2<u32>(v.x << s, (v.y << s) | (v.x >> (32u - s)));
    }
    return vec2<u32>(0u, v.x << (s - 32u));
}

// v >> s (logical) for s in [0, 63].
fn shr64(v: vec2<u32>, s: u32) -> vec2<u32> {
    if s == 0u {
        return v;
    }
    if s < 32u {
        return vec2<u32>((v.x >> s) | (v.y << (32u - s)), v.y >> s);
    }
    return vec2<u32>(v.y >> (s - 32u), 0u);
}

// Signed i64 to f32, rounded to nearest even (one rounding, for every value).
fn i64_to_f32(v: vec2<u32>) -> f32 {
    let neg = (v.y & 0x80000000u) != 0u;
    var mag = v;
    if neg {
        // INT64_MIN stays 0x8000000000000000, which read unsigned is 2^63: right.
        mag = neg64(v);
    }
    var r: f32;
    if mag.y == 0u && mag.x < 0x1000000u {
        // Below 2^24: exact.
        r = f32(mag.x);
    } else {
        var top: u32;
        if mag.y != 0u {
            top = 63u - countLeadingZeros(mag.y);
        } else {
            top = 31u - countLeadingZeros(mag.x);
        }
        let shift = top - 23u;
        var mant = shr64(mag, shift).x;
        let half = shr64(mag, shift - 1u);
        let round_bit = half.x & 1u;
        let kept = shl64(half, shift - 1u);
        let sticky = kept.x != mag.x || kept.y != mag.y;
        var ex = top;
        if round_bit == 1u && (sticky || (mant & 1u) == 1u) {
            mant = mant + 1u;
            if mant == 0x1000000u {
                mant = 0x800000u;
                ex = ex + 1u;
            }
        }
        r = bitcast<f32>(((ex + 127u) << 23u) | (mant & 0x7fffffu));
    }
    if neg {
        return bitcast<f32>(bitcast<u32>(r) | 0x80000000u);
    }
    return r;
}

// f32 to i32: truncation toward zero; NaN -> 0; saturating outside [-2^31, 2^31).
fn f32_to_i32(x: f32) -> i32 {
    if is_nan(x) {
        return 0;
    }
    if x >= 2147483648.0 {
        return 2147483647;
    }
    if x <= -2147483648.0 {
        return -2147483647 - 1;
    }
    return i32(x);
}

// f32 to i64: truncation toward zero on the bits; NaN -> 0; saturating outside
// [-2^63, 2^63).
fn f32_to_i64(x: f32) -> vec2<u32> {
    if is_nan(x) {
        return vec2<u32>(0u, 0u);
    }
    let b = bitcast<u32>(x);
    let neg = (b & 0x80000000u) != 0u;
    let e = i32((b >> 23u) & 0xffu) - 127;
    if e >= 63 {
        if neg {
            return vec2<u32>(0u, 0x80000000u);
        }
        return vec2<u32>(0xffffffffu, 0x7fffffffu);
    }
    if e < 0 {
        return vec2<u32>(0u, 0u);
    }
    let m = (b & 0x7fffffu) | 0x800000u;
    var mag: vec2<u32>;
    if e <= 23 {
        mag = vec2<u32>(m >> u32(23 - e), 0u);
    } else {
        mag = shl64(vec2<u32>(m, 0u), u32(e - 23));
    }
    if neg {
        return neg64(mag);
    }
    return mag;
}

fn load(e: u32) -> $S {
$LOAD
}

fn conv(v: $S) -> $D {
$CONV
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.units {
        return;
    }
$STORE
}
