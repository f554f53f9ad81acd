// 2-D pooling over NHWC or NCHW tensors: MaxPool, AvgPool and their gradients, one invocation
// per 32-bit word of the output (two elements for f16). Every result is gathered (no atomics):
// the gradients loop, for one input element, over the outputs whose window covers it.
//
// Semantics are TensorFlow's CPU kernels (see mod.rs): windows only hold in-bounds elements
// (padding is never a candidate), scanned row by row; the max pool argmax is the first
// element of the window, replaced only by a strictly greater one (so ties go to the first
// element and a NaN wins only as the window's first element); the forward max starts at the
// lowest finite value and ignores NaN. f16 sums round to half after every step, as Eigen's half.
//
// Placeholders filled in by mod.rs: MODE (0 MaxPool, 1 AvgPool, 2 MaxPoolGrad, 3 AvgPoolGrad,
// 4 MaxPoolGradGrad), HALF, LOWEST, LOAD_A/B/C (element loads), STORE (output word store),
// COMMON and LINEAR_INDEX (shared WGSL).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    nchw: u32,
    batch: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
// MaxPool/AvgPool: the input. MaxPoolGrad/GradGrad: orig_input. AvgPoolGrad: grad.
@group(0) @binding(1) var<storage, read_write> a: array<u32>;
// MaxPoolGrad: grad (output shaped). MaxPoolGradGrad: grad (input shaped).
@group(0) @binding(2) var<storage, read_write> b: array<u32>;
// MaxPoolGradGrad: orig_output.
@group(0) @binding(3) var<storage, read_write> c: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

const MODE: u32 = $MODEu;
const HALF: bool = $HALF;

$LINEAR_INDEX
$COMMON

fn load_a(i: u32) -> f32 {
    return $LOAD_A;
}
fn load_b(i: u32) -> f32 {
    return $LOAD_B;
}
fn load_c(i: u32) -> f32 {
    return $LOAD_C;
}

// Rounds to the storage type (f16 sums round after every step, as Eigen's half does).
fn round_t(v: f32) -> f32 {
    if HALF {
        return f16_to_f32(f32_to_f16(v));
    }
    return v;
}

// Flat index of (n, y, x, ch) in a tensor of spatial size hh x ww.
fn at(n: u32, y: u32, x: u32, ch: u32, hh: u32, ww: u32) -> u32 {
    if p.nchw == 1u {
        return ((n * p.c + ch) * hh + y) * ww + x;
    }
    return ((n * hh + y) * ww + x) * p.c + ch;
}

// (n, y, x, ch) of flat index e in a tensor of spatial size hh x ww.
fn coords(e: u32, hh: u32, ww: u32) -> vec4<u32> {
    if p.nchw == 1u {
        let x = e % ww;
        let t = e / ww;
        let y = t % hh;
        let t2 = t / hh;
        return vec4<u32>(t2 / p.c, y, x, t2 % p.c);
    }
    let ch = e % p.c;
    let t = e / p.c;
    let x = t % ww;
    let t2 = t / ww;
    return vec4<u32>(t2 / hh, t2 % hh, x, ch);
}

// The in-bounds window of output (oy, ox): rows [r.x, r.y), columns [r.z, r.w).
fn window(oy: u32, ox: u32) -> vec4<u32> {
    let ys = i32(oy * p.sh) - i32(p.pt);
    let xs = i32(ox * p.sw) - i32(p.pl);
    let ye = min(ys + i32(p.kh), i32(p.h));
    let xe = min(xs + i32(p.kw), i32(p.w));
    return vec4<u32>(u32(max(ys, 0)), u32(max(ye, 0)), u32(max(xs, 0)), u32(max(xe, 0)));
}

// TensorFlow's argmax of a max pool window: the first element, replaced by a strictly greater
// one (a NaN never replaces and is never replaced). -1 for an empty window.
fn argmax(n: u32, oy: u32, ox: u32, ch: u32) -> i32 {
    let r = window(oy, ox);
    var best = 0.0;
    var arg = -1;
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            let i = at(n, y, x, ch, p.h, p.w);
            let v = load_a(i);
            if arg < 0 || (!is_nan(best) && !is_nan(v) && f32_less(best, v)) {
                best = v;
                arg = i32(i);
            }
        }
    }
    return arg;
}

// The outputs whose window covers input row (or column) `v`: [lo, hi).
fn covering(v: u32, pad: u32, k: u32, s: u32, n_out: u32) -> vec2<u32> {
    let vp = v + pad;
    var lo = 0u;
    if vp >= k {
        lo = (vp - k) / s + 1u;
    }
    let hi = min(vp / s + 1u, n_out);
    return vec2<u32>(lo, hi);
}

fn max_step(m: f32, v: f32) -> f32 {
    if !is_nan(v) && f32_less(m, v) {
        return v;
    }
    return m;
}

fn max_pool(e: u32) -> f32 {
    let q = coords(e, p.oh, p.ow);
    let r = window(q.y, q.z);
    var m = $LOWEST;
    if r.y - r.x == 3u && r.w - r.z == 3u {
        // A whole 3x3 window (the common case): the nine loads first, so that they are in
        // flight together, then folded in the loop's order (row by row). The loop below
        // issues one load per iteration and left MaxPool latency-bound.
        let i0 = at(q.x, r.x, r.z, q.w, p.h, p.w);
        let i1 = at(q.x, r.x + 1u, r.z, q.w, p.h, p.w);
        let i2 = at(q.x, r.x + 2u, r.z, q.w, p.h, p.w);
        // Neighbouring columns are p.c elements apart in NHWC, 1 in NCHW.
        let dx = select(p.c, 1u, p.nchw == 1u);
        let v0 = load_a(i0);
        let v1 = load_a(i0 + dx);
        let v2 = load_a(i0 + 2u * dx);
        let v3 = load_a(i1);
        let v4 = load_a(i1 + dx);
        let v5 = load_a(i1 + 2u * dx);
        let v6 = load_a(i2);
        let v7 = load_a(i2 + dx);
        let v8 = load_a(i2 + 2u * dx);
        // Folded without an array: a dynamically indexed private array may live in local
        // memory.
        m = max_step(m, v0);
        m = max_step(m, v1);
        m = max_step(m, v2);
        m = max_step(m, v3);
        m = max_step(m, v4);
        m = max_step(m, v5);
        m = max_step(m, v6);
        m = max_step(m, v7);
        m = max_step(m, v8);
        return m;
    }
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            let v = load_a(at(q.x, y, x, q.w, p.h, p.w));
            if !is_nan(v) && f32_less(m, v) {
                m = v;
            }
        }
    }
    return m;
}

fn avg_pool(e: u32) -> f32 {
    let q = coords(e, p.oh, p.ow);
    let r = window(q.y, q.z);
    var s = 0.0;
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            s = round_t(s + load_a(at(q.x, y, x, q.w, p.h, p.w)));
        }
    }
    let count = (r.y - r.x) * (r.w - r.z);
    return round_t(s / f32(count));
}

fn max_pool_grad(e: u32) -> f32 {
    let q = coords(e, p.h, p.w);
    let rows = covering(q.y, p.pt, p.kh, p.sh, p.oh);
    let cols = covering(q.z, p.pl, p.kw, p.sw, p.ow);
    var acc = 0.0;
    for (var oy = rows.x; oy < rows.y; oy = oy + 1u) {
        for (var ox = cols.x; ox < cols.y; ox = ox + 1u) {
            if argmax(q.x, oy, ox, q.w) == i32(e) {
                acc = round_t(acc + load_b(at(q.x, oy, ox, q.w, p.oh, p.ow)));
            }
        }
    }
    return acc;
}

fn avg_pool_grad(e: u32) -> f32 {
    let q = coords(e, p.h, p.w);
    let rows = covering(q.y, p.pt, p.kh, p.sh, p.oh);
    let cols = covering(q.z, p.pl, p.kw, p.sw, p.ow);
    var acc = 0.0;
    for (var oy = rows.x; oy < rows.y; oy = oy + 1u) {
        for (var ox = cols.x; ox < cols.y; ox = ox + 1u) {
            let r = window(oy, ox);
            let count = (r.y - r.x) * (r.w - r.z);
            let coeff = round_t(1.0 / f32(count));
            let g = load_a(at(q.x, oy, ox, q.w, p.oh, p.ow));
            acc = round_t(acc + round_t(g * coeff));
        }
    }
    return acc;
}

// The grad (input shaped) at the first window element equal to orig_output; 0 when none is.
fn max_pool_grad_grad(e: u32) -> f32 {
    let q = coords(e, p.oh, p.ow);
    let r = window(q.y, q.z);
    let o = load_c(e);
    if is_nan(o) {
        return 0.0;
    }
    for (var y = r.x; y < r.y; y = y + 1u) {
        for (var x = r.z; x < r.w; x = x + 1u) {
            let i = at(q.x, y, x, q.w, p.h, p.w);
            let v = load_a(i);
            if !is_nan(v) && !f32_less(v, o) && !f32_less(o, v) {
                return load_b(i);
            }
        }
    }
    return 0.0;
}

fn elem(e: u32) -> f32 {
    if MODE == 0u {
        return max_pool(e);
    } else if MODE == 1u {
        return avg_pool(e);
    } else if MODE == 2u {
        return max_pool_grad(e);
    } else if MODE == 3u {
        return avg_pool_grad(e);
    }
    return max_pool_grad_grad(e);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
