// 3-D pooling over NDHWC or NCDHW tensors: MaxPool3D, AvgPool3D and their gradients, one
// invocation per 32-bit word of the output (two elements for f16); every result is gathered.
// Semantics are TensorFlow's CPU kernels (pool3d.rs): windows hold only in-bounds elements;
// the max starts at the lowest finite value and ignores NaN; the average divides by the
// in-bounds count; MaxPool3DGrad gives each input the gradients of every covering output whose
// orig_output lies within 1e-5 of it (TensorFlow's CPU mask |in - out| < 1e-5, the difference
// in the tensor's type: ties and near-ties all receive it; an infinite max gives none);
// AvgPool3DGrad adds grad / count over the covering outputs. Sums in float32, rounded once for
// f16.
//
// Placeholders filled in by pool3d.rs: MODE (0 MaxPool3D, 1 AvgPool3D, 2 MaxPool3DGrad,
// 3 AvgPool3DGrad), LOWEST, LOAD_A/B/C, STORE, COMMON and LINEAR_INDEX.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    ncdhw: u32,
    d: u32,
    h: u32,
    w: u32,
    c: u32,
    od: u32,
    oh: u32,
    ow: u32,
    kd: u32,
    kh: u32,
    kw: u32,
    sd: u32,
    sh: u32,
    sw: u32,
    pd: u32,
    ph: u32,
    pw: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
// MaxPool3D/AvgPool3D: the input. MaxPool3DGrad: orig_input. AvgPool3DGrad: grad.
@group(0) @binding(1) var<storage, read_write> a: array<u32>;
// MaxPool3DGrad: grad.
@group(0) @binding(2) var<storage, read_write> b: array<u32>;
// MaxPool3DGrad: orig_output.
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

// Flat index of (n, z, y, x, ch) in a tensor of spatial size dd x hh x ww.
fn at(n: u32, z: u32, y: u32, x: u32, ch: u32, dd: u32, hh: u32, ww: u32) -> u32 {
    if p.ncdhw == 1u {
        return (((n * p.c + ch) * dd + z) * hh + y) * ww + x;
    }
    return (((n * dd + z) * hh + y) * ww + x) * p.c + ch;
}

struct Coords {
    n: u32,
    z: u32,
    y: u32,
    x: u32,
    ch: u32,
};

// The coordinates of flat index e in a tensor of spatial size dd x hh x ww.
fn coords(e: u32, dd: u32, hh: u32, ww: u32) -> Coords {
    var q: Coords;
    if p.ncdhw == 1u {
        q.x = e % ww;
        var t = e / ww;
        q.y = t % hh;
        t = t / hh;
        q.z = t % dd;
        t = t / dd;
        q.ch = t % p.c;
        q.n = t / p.c;
        return q;
    }
    q.ch = e % p.c;
    var t = e / p.c;
    q.x = t % ww;
    t = t / ww;
    q.y = t % hh;
    t = t / hh;
    q.z = t % dd;
    q.n = t / dd;
    return q;
}

// The in-bounds range [x, y) along one dimension of the window of output o.
fn span(o: u32, s: u32, pad: u32, k: u32, size: u32) -> vec2<u32> {
    let start = i32(o * s) - i32(pad);
    let end = min(start + i32(k), i32(size));
    return vec2<u32>(u32(max(start, 0)), u32(max(end, 0)));
}

// The outputs whose window covers input coordinate v along one dimension: [x, y).
fn covering(v: u32, pad: u32, k: u32, s: u32, n_out: u32) -> vec2<u32> {
    let vp = v + pad;
    var lo = 0u;
    if vp >= k {
        lo = (vp - k) / s + 1u;
    }
    let hi = min(vp / s + 1u, n_out);
    return vec2<u32>(lo, hi);
}

// TensorFlow's CPU mask: |v - m| < 1e-5 with the difference and the bound in the tensor's
// type (NaN and inf - inf compare false).
fn near(v: f32, m: f32) -> bool {
    if HALF {
        let d = f16_to_f32(f32_to_f16(v - m));
        return abs(d) < f16_to_f32(f32_to_f16(1e-5));
    }
    return abs(v - m) < 1e-5;
}

fn count(oz: u32, oy: u32, ox: u32) -> u32 {
    let rz = span(oz, p.sd, p.pd, p.kd, p.d);
    let ry = span(oy, p.sh, p.ph, p.kh, p.h);
    let rx = span(ox, p.sw, p.pw, p.kw, p.w);
    return (rz.y - rz.x) * (ry.y - ry.x) * (rx.y - rx.x);
}

fn pool(e: u32) -> f32 {
    let q = coords(e, p.od, p.oh, p.ow);
    let rz = span(q.z, p.sd, p.pd, p.kd, p.d);
    let ry = span(q.y, p.sh, p.ph, p.kh, p.h);
    let rx = span(q.x, p.sw, p.pw, p.kw, p.w);
    var m = $LOWEST;
    var s = 0.0;
    for (var z = rz.x; z < rz.y; z = z + 1u) {
        for (var y = ry.x; y < ry.y; y = y + 1u) {
            for (var x = rx.x; x < rx.y; x = x + 1u) {
                let v = load_a(at(q.n, z, y, x, q.ch, p.d, p.h, p.w));
                if MODE == 0u {
                    if !is_nan(v) && f32_less(m, v) {
                        m = v;
                    }
                } else {
                    s = s + v;
                }
            }
        }
    }
    if MODE == 0u {
        return m;
    }
    return s / f32((rz.y - rz.x) * (ry.y - ry.x) * (rx.y - rx.x));
}

fn grad(e: u32) -> f32 {
    let q = coords(e, p.d, p.h, p.w);
    let cz = covering(q.z, p.pd, p.kd, p.sd, p.od);
    let cy = covering(q.y, p.ph, p.kh, p.sh, p.oh);
    let cx = covering(q.x, p.pw, p.kw, p.sw, p.ow);
    var v = 0.0;
    if MODE == 2u {
        v = load_a(e);
    }
    var acc = 0.0;
    for (var oz = cz.x; oz < cz.y; oz = oz + 1u) {
        for (var oy = cy.x; oy < cy.y; oy = oy + 1u) {
            for (var ox = cx.x; ox < cx.y; ox = ox + 1u) {
                let o = at(q.n, oz, oy, ox, q.ch, p.od, p.oh, p.ow);
                if MODE == 2u {
                    let m = load_c(o);
                    if near(v, m) {
                        acc = acc + load_b(o);
                    }
                } else {
                    acc = acc + load_a(o) / f32(count(oz, oy, ox));
                }
            }
        }
    }
    return acc;
}

fn elem(e: u32) -> f32 {
    if MODE < 2u {
        return pool(e);
    }
    return grad(e);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
