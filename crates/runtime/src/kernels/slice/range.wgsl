// Range: out[i] = start + i * delta (TensorFlow's GPU formula), float32 or int64 (wrapping).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    is_i64: u32,
    start_lo: u32,
    start_hi: u32,
    delta_lo: u32,
    delta_hi: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

// The 64-bit product of two u32, as (low, high).
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
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}

fn value(e: u32) -> vec2<u32> {
    if p.is_i64 == 0u {
        let v = bitcast<f32>(p.start_lo) + f32(e) * bitcast<f32>(p.delta_lo);
        return vec2<u32>(bitcast<u32>(v), 0u);
    }
    let m = mul_wide(e, p.delta_lo);
    let hi = m.y + e * p.delta_hi;
    let lo = m.x + p.start_lo;
    let carry = select(0u, 1u, lo < m.x);
    return vec2<u32>(lo, hi + p.start_hi + carry);
}
