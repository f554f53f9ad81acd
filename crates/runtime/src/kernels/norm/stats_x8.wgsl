// stats_vec4.wgsl's X8 functions (float16, C % 8 == 0): invocation t of a workgroup owns
// channel octet q = tile * p.tc + t % p.tc (eight channels, one vec4<u32> of halves per row:
// 16-byte loads) and every (256 / p.tc)-th row of the chunk; its two quads fold as
// fold_vec4.wgsl's fold_rows does (the same operations in row order, four rows per loop
// iteration with all loads first), then shared slots t (channels 8q..8q+3) and t + 256 (the
// next four) combine the lanes with `combine`.

// The running sums of one quad: (sum of x - k, sum of (x - k)^2) forward, (sum dy,
// sum dy * (x - mean)) for the gradient.
struct Sums {
    b: vec4<f32>,
    c: vec4<f32>,
};

fn add_fwd(s: Sums, xv: vec4<f32>, k: vec4<f32>) -> Sums {
    let y = xv - k;
    return Sums(s.b + y, s.c + y * y);
}

fn add_grad(s: Sums, xv: vec4<f32>, dv: vec4<f32>, m: vec4<f32>) -> Sums {
    return Sums(s.b + dv, s.c + dv * (xv - m));
}

// Adds one row (x word v, dy word w) to both quads' sums.
fn add_row(s: array<Sums, 2>, v: vec4<u32>, w: vec4<u32>, k0: vec4<f32>, k1: vec4<f32>,
           m0: vec4<f32>, m1: vec4<f32>) -> array<Sums, 2> {
    if GRAD {
        return array<Sums, 2>(add_grad(s[0], ld(v.xy), ld(w.xy), m0),
            add_grad(s[1], ld(v.zw), ld(w.zw), m1));
    }
    return array<Sums, 2>(add_fwd(s[0], ld(v.xy), k0), add_fwd(s[1], ld(v.zw), k1));
}

// (count, mean, M2) from the shifted sums about k (forward), or the sums themselves.
fn fold_of(a: f32, s: Sums, k: vec4<f32>) -> Fold {
    if GRAD || a == 0.0 {
        return Fold(a, s.b, s.c);
    }
    let mean_shift = s.b / a;
    let m2 = s.c - s.b * mean_shift;
    return Fold(a, k + mean_shift, select(m2, vec4<f32>(0.0), m2 < vec4<f32>(0.0)));
}

fn fold_rows8(q: u32, octs: u32, start: u32, end: u32, lane: u32, lanes: u32) -> array<Fold, 2> {
    var a = 0.0;
    let zero = Sums(vec4<f32>(0.0), vec4<f32>(0.0));
    var s = array<Sums, 2>(zero, zero);
    var m0 = vec4<f32>(0.0);
    var m1 = vec4<f32>(0.0);
    var k0 = vec4<f32>(0.0);
    var k1 = vec4<f32>(0.0);
    if GRAD {
        let ch = 8u * q;
        m0 = vec4<f32>(mean_in[ch], mean_in[ch + 1u], mean_in[ch + 2u], mean_in[ch + 3u]);
        m1 = vec4<f32>(mean_in[ch + 4u], mean_in[ch + 5u], mean_in[ch + 6u], mean_in[ch + 7u]);
    }
    var j = start + lane;
    if !GRAD && j < end {
        let v = x[j * octs + q];
        k0 = ld(v.xy);
        k1 = ld(v.zw);
    }
    let step = lanes * octs;
    let none = vec4<u32>(0u);
    while j + 3u * lanes < end {
        let e0 = j * octs + q;
        let e1 = e0 + step;
        let e2 = e1 + step;
        let e3 = e2 + step;
        let v0 = x[e0];
        let v1 = x[e1];
        let v2 = x[e2];
        let v3 = x[e3];
        var w0 = none;
        var w1 = none;
        var w2 = none;
        var w3 = none;
        if GRAD {
            w0 = dy[e0];
            w1 = dy[e1];
            w2 = dy[e2];
            w3 = dy[e3];
        }
        s = add_row(s, v0, w0, k0, k1, m0, m1);
        s = add_row(s, v1, w1, k0, k1, m0, m1);
        s = add_row(s, v2, w2, k0, k1, m0, m1);
        s = add_row(s, v3, w3, k0, k1, m0, m1);
        a = a + 4.0;
        j += 4u * lanes;
    }
    while j < end {
        let e0 = j * octs + q;
        var w0 = none;
        if GRAD {
            w0 = dy[e0];
        }
        s = add_row(s, x[e0], w0, k0, k1, m0, m1);
        a = a + 1.0;
        j += lanes;
    }
    if GRAD {
        a = 0.0;
    }
    return array<Fold, 2>(fold_of(a, s[0], k0), fold_of(a, s[1], k1));
}

// The partials of workgroup g: tiles of p.tc octets, p.splits chunks per tile.
fn stats8(g: u32, t: u32) {
    let octs = p.c / 8u;
    let tiles = (octs + p.tc - 1u) / p.tc;
    if g >= tiles * p.splits {
        return;
    }
    let lanes = 256u / p.tc;
    let lane = t / p.tc;
    let q = (g / p.splits) * p.tc + t % p.tc;
    let split = g % p.splits;
    let valid = q < octs;
    let start = split * p.chunk;
    let end = min(start + p.chunk, p.rest);
    var f = array<Fold, 2>(Fold(0.0, vec4<f32>(0.0), vec4<f32>(0.0)),
        Fold(0.0, vec4<f32>(0.0), vec4<f32>(0.0)));
    if valid {
        f = fold_rows8(q, octs, start, end, lane, lanes);
    }
    sa[t] = f[0].a;
    sb[t] = f[0].b;
    sc[t] = f[0].c;
    sa[t + 256u] = f[1].a;
    sb[t + 256u] = f[1].b;
    sc[t + 256u] = f[1].c;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s / 2u) {
        if lane < s {
            combine(t, t + s * p.tc);
            combine(t + 256u, t + 256u + s * p.tc);
        }
        workgroupBarrier();
    }
    if lane == 0u && valid {
        for (var h = 0u; h < 2u; h = h + 1u) {
            let i = t + 256u * h;
            let r = sb[i];
            let v = sc[i];
            let ch = 8u * q + 4u * h;
            put(ch, split, sa[i], r.x, v.x);
            put(ch + 1u, split, sa[i], r.y, v.y);
            put(ch + 2u, split, sa[i], r.z, v.z);
            put(ch + 3u, split, sa[i], r.w, v.w);
        }
    }
}
