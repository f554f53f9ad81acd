// stats.wgsl for float32 or float16 with the channel innermost (NHWC) and C % 4 == 0: an
// invocation owns four neighbouring channels (one vec4 load per row), so a row of a
// workgroup's p.tc channel quads is p.tc consecutive vec4. A workgroup covers p.tc quads (a
// power of two, at most 32) and one chunk of p.chunk rows of them; invocation t takes quad
// t % p.tc and every (256 / p.tc)-th row of the chunk (at most 16), four rows per loop
// iteration (all loaded before any is folded; the remaining rows one at a time), then a tree
// in shared memory combines the rows' lanes.
// Forward: per-invocation shifted sums about its first row turned into Welford states
// (count, mean, M2), combined by Chan's formula; gradient: (sum dy, sum dy * (x - mean)).
// Writes part[3 * (ch * p.splits + chunk)] for each of the four channels, as stats.wgsl.
// float16 (T = half) loads four halves (8 bytes, a vec2<u32>) per row instead, exactly
// converted to f32 (`ld`).
// Placeholders: GRAD, NORM_COMMON, XT and LD (the load type and its conversion), COMMON.
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<$XT>;
@group(0) @binding(2) var<storage, read_write> dy: array<$XT>;
@group(0) @binding(3) var<storage, read_write> mean_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;

const GRAD: bool = $GRAD;

$COMMON

$LD

var<workgroup> sa: array<f32, 256>;
var<workgroup> sb: array<vec4<f32>, 256>;
var<workgroup> sc: array<vec4<f32>, 256>;

// Folds slot k into slot i.
fn combine(i: u32, k: u32) {
    if GRAD {
        sb[i] = sb[i] + sb[k];
        sc[i] = sc[i] + sc[k];
        return;
    }
    let na = sa[i];
    let nb = sa[k];
    if nb == 0.0 {
        return;
    }
    if na == 0.0 {
        sa[i] = nb;
        sb[i] = sb[k];
        sc[i] = sc[k];
        return;
    }
    let n = na + nb;
    let d = sb[k] - sb[i];
    sb[i] = sb[i] + d * (nb / n);
    sc[i] = sc[i] + sc[k] + d * d * (na * (nb / n));
    sa[i] = n;
}

// The partial of channel ch in chunk `split`: (count, mean, M2) forward, (sum dy,
// sum dy * (x - mean), 0) for the gradient, as stats.wgsl writes them.
fn put(ch: u32, split: u32, n: f32, b: f32, c: f32) {
    let kk = 3u * (ch * p.splits + split);
    if GRAD {
        part[kk] = b;
        part[kk + 1u] = c;
        part[kk + 2u] = 0.0;
    } else {
        part[kk] = n;
        part[kk + 1u] = b;
        part[kk + 2u] = c;
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let g = wid.y * p.groups_x + wid.x;
    let quads = p.c / 4u;
    let tiles = (quads + p.tc - 1u) / p.tc;
    if g >= tiles * p.splits {
        return;
    }
    let lanes = 256u / p.tc;
    let lane = t / p.tc;
    let q = (g / p.splits) * p.tc + t % p.tc;
    let split = g % p.splits;
    let valid = q < quads;
    let start = split * p.chunk;
    let end = min(start + p.chunk, p.rest);
    var a = 0.0;
    var b = vec4<f32>(0.0);
    var c = vec4<f32>(0.0);
    var m = vec4<f32>(0.0);
    var k = vec4<f32>(0.0);
    if valid {
        if GRAD {
            let ch = 4u * q;
            m = vec4<f32>(mean_in[ch], mean_in[ch + 1u], mean_in[ch + 2u], mean_in[ch + 3u]);
        }
        var j = start + lane;
        if !GRAD && j < end {
            k = ld(x[j * quads + q]);
        }
        // Four rows per iteration, all loads before any fold and no guard inside (full
        // groups only), then the remaining rows one at a time; the sums run in row order.
        let step = lanes * quads;
        while j + 3u * lanes < end {
            let e0 = j * quads + q;
            let e1 = e0 + step;
            let e2 = e1 + step;
            let e3 = e2 + step;
            let x0 = ld(x[e0]);
            let x1 = ld(x[e1]);
            let x2 = ld(x[e2]);
            let x3 = ld(x[e3]);
            if GRAD {
                let d0 = ld(dy[e0]);
                let d1 = ld(dy[e1]);
                let d2 = ld(dy[e2]);
                let d3 = ld(dy[e3]);
                b = b + d0;
                c = c + d0 * (x0 - m);
                b = b + d1;
                c = c + d1 * (x1 - m);
                b = b + d2;
                c = c + d2 * (x2 - m);
                b = b + d3;
                c = c + d3 * (x3 - m);
            } else {
                let y0 = x0 - k;
                let y1 = x1 - k;
                let y2 = x2 - k;
                let y3 = x3 - k;
                b = b + y0;
                c = c + y0 * y0;
                b = b + y1;
                c = c + y1 * y1;
                b = b + y2;
                c = c + y2 * y2;
                b = b + y3;
                c = c + y3 * y3;
                a = a + 4.0;
            }
            j += 4u * lanes;
        }
        while j < end {
            let e0 = j * quads + q;
            let x0 = ld(x[e0]);
            if GRAD {
                let d0 = ld(dy[e0]);
                b = b + d0;
                c = c + d0 * (x0 - m);
            } else {
                let y0 = x0 - k;
                b = b + y0;
                c = c + y0 * y0;
                a = a + 1.0;
            }
            j += lanes;
        }
        if !GRAD && a > 0.0 {
            // (count, mean, M2) of the invocation's rows; rounding may leave a tiny negative
            // M2 (NaN stays NaN).
            let mean_shift = b / a;
            let m2 = c - b * mean_shift;
            c = select(m2, vec4<f32>(0.0), m2 < vec4<f32>(0.0));
            b = k + mean_shift;
        }
    }
    sa[t] = a;
    sb[t] = b;
    sc[t] = c;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s / 2u) {
        if lane < s {
            combine(t, t + s * p.tc);
        }
        workgroupBarrier();
    }
    if lane == 0u && valid {
        let r = sb[t];
        let v = sc[t];
        put(4u * q, split, sa[t], r.x, v.x);
        put(4u * q + 1u, split, sa[t], r.y, v.y);
        put(4u * q + 2u, split, sa[t], r.z, v.z);
        put(4u * q + 3u, split, sa[t], r.w, v.w);
    }
}
