// Image resizes, NHWC: bilinear (forward, gradient) and nearest neighbour (gradient), one
// invocation per output element. Source coordinates are TensorFlow's: coord(o) = (o + a) * s + b
// with (a, b) = (0.5, -0.5) for bilinear half-pixel centers, (0.5, 0) for nearest neighbour's,
// (0, 0) otherwise; bilinear taps floor/ceil of it (clamped), nearest neighbour floor (round
// half away from zero with align_corners), clamped to the image.
// The gradients gather: each element of the original image sums the gradient elements whose
// taps reach it, in TensorFlow's CPU order (resized rows, then columns; per element its four
// taps in order), so the sums round as TensorFlow's do. Only resized positions whose source
// coordinate lies within one pixel of the element are visited (`window`).
struct Params {
    row: u32,
    n: u32,
    c: u32,
    // Output (forward) or gradient (backward) width and height.
    ow: u32,
    oh: u32,
    // Image (forward input, backward output) width and height.
    iw: u32,
    ih: u32,
    // bit 0: round half away from zero (nearest neighbour, align_corners); bit 1: same size
    // (the forward copies); bit 2: nearest neighbour (the gradients).
    flags: u32,
    hs: f32,
    ws: f32,
    a: f32,
    b: f32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;

LINEAR_INDEX

fn coord(o: u32, s: f32) -> f32 {
    return (f32(o) + p.a) * s + p.b;
}

struct Tap {
    lo: u32,
    hi: u32,
    lerp: f32,
};

fn tap(o: u32, s: f32, size: u32) -> Tap {
    let v = coord(o, s);
    let f = floor(v);
    return Tap(u32(max(i32(f), 0)), u32(min(i32(ceil(v)), i32(size) - 1)), v - f);
}

fn nearest(o: u32, s: f32, size: u32) -> u32 {
    let v = coord(o, s);
    var k = floor(v);
    if (p.flags & 1u) != 0u {
        // roundf: half away from zero (v >= 0 here).
        let t = trunc(v);
        k = select(t, t + 1.0, v - t >= 0.5);
    }
    return u32(clamp(i32(k), 0, i32(size) - 1));
}

// (channel, x, y, image) of element e of an NHWC tensor of width w and height h.
fn pixel(e: u32, w: u32, h: u32) -> vec4<u32> {
    let r = e / p.c;
    return vec4<u32>(e % p.c, r % w, (r / w) % h, r / w / h);
}

// Resized positions [first, end) whose coordinate may lie in [i - 1, i + 1].
fn window(i: u32, s: f32, osize: u32) -> vec2<u32> {
    if s <= 0.0 {
        return vec2<u32>(0u, osize);
    }
    let lo = (f32(i) - 1.0 - p.b) / s - p.a;
    let hi = (f32(i) + 1.0 - p.b) / s - p.a;
    let first = u32(clamp(floor(lo) - 1.0, 0.0, f32(osize)));
    let end = u32(clamp(ceil(hi) + 2.0, 0.0, f32(osize)));
    return vec2<u32>(first, end);
}

#ifdef BILINEAR
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    if (p.flags & 2u) != 0u {
        out[e] = src[e];
        return;
    }
    let q = pixel(e, p.ow, p.oh);
    let ch = q.x;
    let b = q.w;
    let ty = tap(q.z, p.hs, p.ih);
    let tx = tap(q.y, p.ws, p.iw);
    let row0 = (b * p.ih + ty.lo) * p.iw;
    let row1 = (b * p.ih + ty.hi) * p.iw;
    let tl = src[(row0 + tx.lo) * p.c + ch];
    let tr = src[(row0 + tx.hi) * p.c + ch];
    let bl = src[(row1 + tx.lo) * p.c + ch];
    let br = src[(row1 + tx.hi) * p.c + ch];
    let top = tl + (tr - tl) * tx.lerp;
    let bottom = bl + (br - bl) * tx.lerp;
    out[e] = top + (bottom - top) * ty.lerp;
}
#endif

#ifdef GATHER
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// How resized position o along an axis reaches pixel i: as its first tap (weight w.x) and/or
// its second (w.y). Nearest neighbour has one tap of weight 1 (g * 1 * 1 is g exactly).
struct Role {
    first: bool,
    second: bool,
    w: vec2<f32>,
};

fn role(o: u32, s: f32, size: u32, i: u32) -> Role {
    if (p.flags & 4u) != 0u {
        return Role(nearest(o, s, size) == i, false, vec2<f32>(1.0, 0.0));
    }
    let t = tap(o, s, size);
    return Role(t.lo == i, t.hi == i, vec2<f32>(1.0 - t.lerp, t.lerp));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    let q = pixel(e, p.iw, p.ih);
    let ys = window(q.z, p.hs, p.oh);
    let xs = window(q.y, p.ws, p.ow);
    var acc = 0.0;
    for (var oy = ys.x; oy < ys.y; oy++) {
        let ry = role(oy, p.hs, p.ih, q.z);
        if !(ry.first || ry.second) {
            continue;
        }
        for (var ox = xs.x; ox < xs.y; ox++) {
            let rx = role(ox, p.ws, p.iw, q.y);
            if !(rx.first || rx.second) {
                continue;
            }
            let g = src[((q.w * p.oh + oy) * p.ow + ox) * p.c + q.x];
            // TensorFlow's order: top-left, top-right, bottom-left, bottom-right.
            if ry.first && rx.first {
                acc += g * ry.w.x * rx.w.x;
            }
            if ry.first && rx.second {
                acc += g * ry.w.x * rx.w.y;
            }
            if ry.second && rx.first {
                acc += g * ry.w.y * rx.w.x;
            }
            if ry.second && rx.second {
                acc += g * ry.w.y * rx.w.y;
            }
        }
    }
    out[e] = acc;
}
#endif

#ifdef SCATTER
// The gradients when a pixel's window is long (upsampling by large factors: one invocation
// would loop over tens of thousands of positions, past what CPU adapters run in one loop):
// each gradient element adds its share to its taps' pixels by an atomic compare-and-swap of
// the float's bits (the output is zeroed before); the order of the additions is the GPU's,
// as in TensorFlow's GPU kernels.
@group(0) @binding(2) var<storage, read_write> out: array<atomic<u32>>;

ATOMIC_ADD_OUT

fn add(b: u32, y: u32, x: u32, ch: u32, v: f32) {
    atomic_add_out(((b * p.ih + y) * p.iw + x) * p.c + ch, v);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    let q = pixel(e, p.ow, p.oh);
    let g = src[e];
    if (p.flags & 4u) != 0u {
        add(q.w, nearest(q.z, p.hs, p.ih), nearest(q.y, p.ws, p.iw), q.x, g);
        return;
    }
    let ty = tap(q.z, p.hs, p.ih);
    let tx = tap(q.y, p.ws, p.iw);
    let iyl = 1.0 - ty.lerp;
    let ixl = 1.0 - tx.lerp;
    add(q.w, ty.lo, tx.lo, q.x, g * iyl * ixl);
    add(q.w, ty.lo, tx.hi, q.x, g * iyl * tx.lerp);
    add(q.w, ty.hi, tx.lo, q.x, g * ty.lerp * ixl);
    add(q.w, ty.hi, tx.hi, q.x, g * ty.lerp * tx.lerp);
}
#endif
