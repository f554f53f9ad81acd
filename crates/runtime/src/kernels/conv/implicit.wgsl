// Addressing hooks of the implicit GEMM on the matmul vector shader (see vec4.rs `Hooks` and
// conv/gemm.rs `implicit_vec4`): NHWC float32, one group, channel counts multiples of 4, so a
// vector of 4 along the channels never leaves its pixel. Parameters in p.hp (hq(i)):
// 0 ih, 1 iw, 2 c, 3 oh, 4 ow, 5 k (output channels), 6 fs (filter columns), 7 sh, 8 sw,
// 9 dh, 10 dw, 11 pt, 12 pl. Every load checks its own range (zero outside: padding, rows
// beyond M, K beyond p.k), so the module runs without wgpu's bounds checks.
fn hq(i: u32) -> u32 {
    return p.hp[i / 4u][i % 4u];
}

struct APre {
    base: u32,
    y: i32,
    x: i32,
    ok: bool,
};

#if MODE_FWD
// A[m = (n, oy, ox), k = (r, s, c)] = x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c]
fn a_pre(go: u32) -> APre {
    var q: APre;
    q.ok = go < p.m;
    let mm = select(0u, go, q.ok);
    let ox = mm % hq(4u);
    let t = mm / hq(4u);
    let oy = t % hq(3u);
    let nb = t / hq(3u);
    q.base = nb * hq(0u) * hq(1u) * hq(2u);
    q.y = i32(oy * hq(7u)) - i32(hq(11u));
    q.x = i32(ox * hq(8u)) - i32(hq(12u));
    return q;
}

fn a_load(q: APre, gk: u32, off: u32) -> vec4<ELEM> {
    if !q.ok || gk >= p.k {
        return vec4<ELEM>();
    }
    let ch = gk % hq(2u);
    let rs = gk / hq(2u);
    let s = rs % hq(6u);
    let r = rs / hq(6u);
    let iy = q.y + i32(r * hq(9u));
    let ix = q.x + i32(s * hq(10u));
    if iy < 0 || ix < 0 || u32(iy) >= hq(0u) || u32(ix) >= hq(1u) {
        return vec4<ELEM>();
    }
    return a[(q.base + (u32(iy) * hq(1u) + u32(ix)) * hq(2u) + ch) / 4u];
}
#endif

#if MODE_BWD_INPUT
// Stride 1. A[m = (n, y, x), k = (r, s, kc)] = dy[n, y + pt - r*dh, x + pl - s*dw, kc]
fn a_pre(go: u32) -> APre {
    var q: APre;
    q.ok = go < p.m;
    let mm = select(0u, go, q.ok);
    let ix = mm % hq(1u);
    let t = mm / hq(1u);
    let iy = t % hq(0u);
    let nb = t / hq(0u);
    q.base = nb * hq(3u) * hq(4u) * hq(5u);
    q.y = i32(iy + hq(11u));
    q.x = i32(ix + hq(12u));
    return q;
}

fn a_load(q: APre, gk: u32, off: u32) -> vec4<ELEM> {
    if !q.ok || gk >= p.k {
        return vec4<ELEM>();
    }
    let kc = gk % hq(5u);
    let rs = gk / hq(5u);
    let s = rs % hq(6u);
    let r = rs / hq(6u);
    let oy = q.y - i32(r * hq(9u));
    let ox = q.x - i32(s * hq(10u));
    if oy < 0 || ox < 0 || u32(oy) >= hq(3u) || u32(ox) >= hq(4u) {
        return vec4<ELEM>();
    }
    return a[(q.base + (u32(oy) * hq(4u) + u32(ox)) * hq(5u) + kc) / 4u];
}

// B[k = (r, s, kc), j = c] = f[r, s, c, kc]: a vector along kc.
struct BPre {
    base: u32,
    ok: bool,
};

fn b_pre(go: u32) -> BPre {
    var q: BPre;
    q.ok = go < p.n;
    q.base = select(0u, go, q.ok) * hq(5u);
    return q;
}

fn b_load(q: BPre, gk: u32, off: u32) -> vec4<ELEM> {
    if !q.ok || gk >= p.k {
        return vec4<ELEM>();
    }
    let kc = gk % hq(5u);
    let rs = gk / hq(5u);
    return b[(rs * hq(2u) * hq(5u) + q.base + kc) / 4u];
}
#endif

#if MODE_BWD_FILTER
// A[m = (r, s, c), k = (n, oy, ox)] = x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c], a vector
// along c; `off` (the batch offset) is the first K index of this split.
fn a_pre(go: u32) -> APre {
    var q: APre;
    q.ok = go < p.m;
    let mm = select(0u, go, q.ok);
    let ch = mm % hq(2u);
    let rs = mm / hq(2u);
    let s = rs % hq(6u);
    let r = rs / hq(6u);
    q.base = ch;
    q.y = i32(r * hq(9u)) - i32(hq(11u));
    q.x = i32(s * hq(10u)) - i32(hq(12u));
    return q;
}

fn a_load(q: APre, gk: u32, off: u32) -> vec4<ELEM> {
    if !q.ok || gk >= p.k {
        return vec4<ELEM>();
    }
    let kg = gk + off;
    let ox = kg % hq(4u);
    let t = kg / hq(4u);
    let oy = t % hq(3u);
    let nb = t / hq(3u);
    let iy = q.y + i32(oy * hq(7u));
    let ix = q.x + i32(ox * hq(8u));
    if iy < 0 || ix < 0 || u32(iy) >= hq(0u) || u32(ix) >= hq(1u) {
        return vec4<ELEM>();
    }
    return a[((nb * hq(0u) + u32(iy)) * hq(1u) + u32(ix)) * hq(2u) / 4u + q.base / 4u];
}
#endif
