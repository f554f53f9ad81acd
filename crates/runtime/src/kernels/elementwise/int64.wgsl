// Signed 64-bit integer arithmetic on (low, high) u32 word pairs, two's complement, wrapping
// like TensorFlow's int64 kernels. Division by zero gives 0 (TensorFlow raises an error).

fn lt64(x: vec2<u32>, y: vec2<u32>) -> bool {
    let hx = bitcast<i32>(x.y);
    let hy = bitcast<i32>(y.y);
    return hx < hy || (hx == hy && x.x < y.x);
}

fn ult64(x: vec2<u32>, y: vec2<u32>) -> bool {
    return x.y < y.y || (x.y == y.y && x.x < y.x);
}

fn is_neg64(x: vec2<u32>) -> bool {
    return (x.y >> 31u) != 0u;
}

fn is_zero64(x: vec2<u32>) -> bool {
    return (x.x | x.y) == 0u;
}

fn add64(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
    let lo = x.x + y.x;
    return vec2<u32>(lo, x.y + y.y + select(0u, 1u, lo < x.x));
}

fn neg64(x: vec2<u32>) -> vec2<u32> {
    return add64(~x, vec2<u32>(1u, 0u));
}

fn sub64(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
    return add64(x, neg64(y));
}

fn abs64(x: vec2<u32>) -> vec2<u32> {
    return select(x, neg64(x), is_neg64(x));
}

// The full 64-bit product of two u32, from 16-bit halves.
fn mul_wide32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}

fn mul64(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
    let p = mul_wide32(x.x, y.x);
    return vec2<u32>(p.x, p.y + x.x * y.y + x.y * y.x);
}

// Unsigned n / d and n % d (d != 0), restoring long division: (q.x, q.y, r.x, r.y).
fn udivmod64(n: vec2<u32>, d: vec2<u32>) -> vec4<u32> {
    var q = vec2<u32>(0u, 0u);
    var r = vec2<u32>(0u, 0u);
    for (var i = 63i; i >= 0; i = i - 1) {
        let word = select(n.x, n.y, i >= 32);
        let bit = (word >> (u32(i) & 31u)) & 1u;
        r = vec2<u32>((r.x << 1u) | bit, (r.y << 1u) | (r.x >> 31u));
        if !ult64(r, d) {
            r = sub64(r, d);
            if i >= 32 {
                q.y = q.y | (1u << (u32(i) - 32u));
            } else {
                q.x = q.x | (1u << u32(i));
            }
        }
    }
    return vec4<u32>(q, r);
}

// Truncating signed division and its remainder (sign of x): (q.x, q.y, r.x, r.y);
// INT64_MIN / -1 wraps to INT64_MIN. Zero divisor: (0, 0).
fn divmod64(x: vec2<u32>, y: vec2<u32>) -> vec4<u32> {
    if is_zero64(y) {
        return vec4<u32>(0u);
    }
    let u = udivmod64(abs64(x), abs64(y));
    var q = u.xy;
    var r = u.zw;
    if is_neg64(x) != is_neg64(y) {
        q = neg64(q);
    }
    if is_neg64(x) {
        r = neg64(r);
    }
    return vec4<u32>(q, r);
}
