// ImageProjectiveTransformV2/V3, NHWC float32: output pixel (x, y) of image b reads the input
// at ((a0 x + a1 y + a2) / p, (b0 x + b1 y + b2) / p), p = c0 x + c1 y + 1 (transform row b,
// or row 0 for all), the coordinates mapped by the fill mode (TensorFlow's MapCoordinate),
// then nearest (round half away from zero) or bilinear, each tap outside the image reading the
// fill value (so CONSTANT blends the fill into the border pixels, as TensorFlow 2.21 does).
struct Params {
    row: u32,
    n: u32,
    c: u32,
    ow: u32,
    oh: u32,
    iw: u32,
    ih: u32,
    // bit 0: bilinear; bits 1-2: fill mode (0 reflect, 1 wrap, 2 constant, 3 nearest).
    flags: u32,
    // 8 when every image has its transform row, 0 when all share row 0.
    tstride: u32,
    fill: f32,
    pad0: u32,
    pad1: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> tr: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

LINEAR_INDEX

fn map_coord(v: f32, len: u32) -> f32 {
    let mode = (p.flags >> 1u) & 3u;
    let l = i32(len);
    var c = v;
    if mode == 0u {
        if c < 0.0 {
            if l <= 1 {
                c = 0.0;
            } else {
                let sz2 = 2 * l;
                c = f32(sz2 * i32(-c / f32(sz2))) + c;
                c = select(-c - 1.0, c + f32(sz2), c < f32(-l));
            }
        } else if c > f32(l - 1) {
            if l <= 1 {
                c = 0.0;
            } else {
                let sz2 = 2 * l;
                c -= f32(sz2 * i32(c / f32(sz2)));
                if c >= f32(l) {
                    c = f32(sz2) - c - 1.0;
                }
            }
        }
    } else if mode == 1u {
        if c < 0.0 {
            if l <= 1 {
                c = 0.0;
            } else {
                let sz = l - 1;
                c += f32(l * (i32(-c / f32(sz)) + 1));
            }
        } else if c > f32(l - 1) {
            if l <= 1 {
                c = 0.0;
            } else {
                let sz = l - 1;
                c -= f32(l * i32(c / f32(sz)));
            }
        }
    } else if mode == 2u {
        return c;
    }
    return clamp(c, 0.0, f32(l - 1));
}

fn read(b: u32, y: i32, x: i32, ch: u32) -> f32 {
    if y < 0 || y >= i32(p.ih) || x < 0 || x >= i32(p.iw) {
        return p.fill;
    }
    return src[((b * p.ih + u32(y)) * p.iw + u32(x)) * p.c + ch];
}

fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    return select(t, t + sign(v), abs(v - t) >= 0.5);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    let ch = e % p.c;
    var r = e / p.c;
    let xo = f32(r % p.ow);
    r = r / p.ow;
    let yo = f32(r % p.oh);
    let b = r / p.oh;
    let t = b * p.tstride;
    let proj = tr[t + 6u] * xo + tr[t + 7u] * yo + 1.0;
    if proj == 0.0 {
        out[e] = p.fill;
        return;
    }
    let x = map_coord((tr[t] * xo + tr[t + 1u] * yo + tr[t + 2u]) / proj, p.iw);
    let y = map_coord((tr[t + 3u] * xo + tr[t + 4u] * yo + tr[t + 5u]) / proj, p.ih);
    if (p.flags & 1u) == 0u {
        out[e] = read(b, i32(round_away(y)), i32(round_away(x)), ch);
        return;
    }
    let y0 = floor(y);
    let x0 = floor(x);
    let y1 = y0 + 1.0;
    let x1 = x0 + 1.0;
    let top = (x1 - x) * read(b, i32(y0), i32(x0), ch) + (x - x0) * read(b, i32(y0), i32(x1), ch);
    let bottom = (x1 - x) * read(b, i32(y1), i32(x0), ch) + (x - x0) * read(b, i32(y1), i32(x1), ch);
    out[e] = (y1 - y) * top + (y - y0) * bottom;
}
