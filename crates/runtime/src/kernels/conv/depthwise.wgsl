// Depthwise convolutions, direct (see depthwise.rs). Input channel c and multiplier q make
// output channel c * mult + q; the filter is [R, S, C, mult], contiguous. x and y (or dy) are
// addressed through strides (NHWC or NCHW); `nchw` also orders the elements of the tensor an
// invocation computes (memory order, so that neighbouring invocations write neighbouring
// words). Accumulation in f32 with fma.
//
// MODE 0 forward:        y[n, oy, ox, c*mult + q] = sum_{r, s} x[n, oy*sh - pt + r, ox*sw - pl + s, c] f[r, s, c, q]
// MODE 1 input gradient: dx[n, y, x, c] = sum_{r, s, q} dy[n, (y + pt - r) / sh, (x + pl - s) / sw, c*mult + q] f[r, s, c, q]
//                        (taps where the division is inexact or out of range are zero)
// MODE 2 filter gradient: df[r, s, c, q] = sum_{n, oy, ox} x[n, oy*sh - pt + r, ox*sw - pl + s, c] dy[n, oy, ox, c*mult + q],
//                        a workgroup of 64 x 4 per (64 filter columns (c, q), tap (r, s), split
//                        of the positions), partial sums at split * out_len.

struct Params {
    row: u32,
    words: u32,
    total: u32,
    nchw: u32,
    ih: u32,
    iw: u32,
    c: u32,
    mult: u32,
    oh: u32,
    ow: u32,
    fr: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    xn: u32,
    xh: u32,
    xw: u32,
    xc: u32,
    yn: u32,
    yh: u32,
    yw: u32,
    yc: u32,
    positions: u32,
    chunk: u32,
    out_len: u32,
    _pad0: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src_a: array<$STORE>;
@group(0) @binding(2) var<storage, read_write> src_b: array<$STORE>;
@group(0) @binding(3) var<storage, read_write> out: array<$OUT>;

const MODE: u32 = $MODE_IDu;

$LINEAR_INDEX
$COMMON

fn lda(i: u32) -> f32 {
    return $LOAD_A;
}

fn ldb(i: u32) -> f32 {
    return $LOAD_B;
}

// (n, y, x, channel) of element e of a tensor of h x w pixels and `ch` channels.
fn coords(e: u32, h: u32, w: u32, ch: u32) -> vec4<u32> {
    if p.nchw == 1u {
        let x = e % w;
        let t = e / w;
        let y = t % h;
        let t2 = t / h;
        return vec4<u32>(t2 / ch, y, x, t2 % ch);
    }
    let c = e % ch;
    let t = e / ch;
    let x = t % w;
    let t2 = t / w;
    return vec4<u32>(t2 / h, t2 % h, x, c);
}

// Element e of the output of MODE 0 or 1.
fn elem(e: u32) -> f32 {
    var acc = 0.0;
    if MODE == 0u {
        // src_a = x, src_b = filter.
        let o = coords(e, p.oh, p.ow, p.c * p.mult);
        let c = o.w / p.mult;
        let base = o.x * p.xn + c * p.xc;
        let y0 = i32(o.y * p.sh) - i32(p.pt);
        let x0 = i32(o.z * p.sw) - i32(p.pl);
        for (var r = 0u; r < p.fr; r += 1u) {
            let iy = y0 + i32(r);
            if iy < 0 || u32(iy) >= p.ih {
                continue;
            }
            for (var s = 0u; s < p.fs; s += 1u) {
                let ix = x0 + i32(s);
                if ix < 0 || u32(ix) >= p.iw {
                    continue;
                }
                let xv = lda(base + u32(iy) * p.xh + u32(ix) * p.xw);
                let fv = ldb((r * p.fs + s) * p.c * p.mult + o.w);
                acc = fma(xv, fv, acc);
            }
        }
    } else {
        // src_a = dy, src_b = filter.
        let o = coords(e, p.ih, p.iw, p.c);
        let c = o.w;
        let ty0 = i32(o.y + p.pt);
        let tx0 = i32(o.z + p.pl);
        for (var r = 0u; r < p.fr; r += 1u) {
            let ty = ty0 - i32(r);
            if ty < 0 {
                break;
            }
            let oy = u32(ty) / p.sh;
            if oy * p.sh != u32(ty) || oy >= p.oh {
                continue;
            }
            for (var s = 0u; s < p.fs; s += 1u) {
                let tx = tx0 - i32(s);
                if tx < 0 {
                    break;
                }
                let ox = u32(tx) / p.sw;
                if ox * p.sw != u32(tx) || ox >= p.ow {
                    continue;
                }
                let dbase = o.x * p.yn + oy * p.yh + ox * p.yw;
                let fbase = ((r * p.fs + s) * p.c + c) * p.mult;
                for (var q = 0u; q < p.mult; q += 1u) {
                    acc = fma(lda(dbase + (c * p.mult + q) * p.yc), ldb(fbase + q), acc);
                }
            }
        }
    }
    return acc;
}

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size($WG_X, $WG_Y)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    if MODE == 2u {
        // src_a = x, src_b = dy; wid = (column block, tap, split).
        let col = wid.x * 64u + lid.x;
        let cm = p.c * p.mult;
        let ok = col < cm;
        let cc = select(0u, col, ok);
        let c = cc / p.mult;
        let s = wid.y % p.fs;
        let r = wid.y / p.fs;
        let ry = i32(r) - i32(p.pt);
        let rx = i32(s) - i32(p.pl);
        let begin = wid.z * p.chunk;
        let end = min(p.positions, begin + p.chunk);
        var acc = 0.0;
        if ok {
            for (var t = begin + lid.y; t < end; t += 4u) {
                let ox = t % p.ow;
                let t2 = t / p.ow;
                let oy = t2 % p.oh;
                let nb = t2 / p.oh;
                let iy = i32(oy * p.sh) + ry;
                let ix = i32(ox * p.sw) + rx;
                if iy < 0 || ix < 0 || u32(iy) >= p.ih || u32(ix) >= p.iw {
                    continue;
                }
                let xv = lda(nb * p.xn + u32(iy) * p.xh + u32(ix) * p.xw + c * p.xc);
                let dv = ldb(nb * p.yn + oy * p.yh + ox * p.yw + cc * p.yc);
                acc = fma(xv, dv, acc);
            }
        }
        partial[lid.y * 64u + lid.x] = acc;
        workgroupBarrier();
        if lid.y == 0u && ok {
            let sum = (partial[lid.x] + partial[64u + lid.x]) + (partial[128u + lid.x] + partial[192u + lid.x]);
            out[wid.z * p.out_len + wid.y * cm + col] = $PARTIAL;
        }
        return;
    }
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$ELEM_STORE
}
