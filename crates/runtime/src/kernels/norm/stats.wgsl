// Per-channel partial statistics of a batch norm. One workgroup of 256 invocations covers
// p.tc channels (a power of two: 1 when the channel is not the innermost dimension, up to 32
// when it is, so that neighbouring invocations read neighbouring channels) and one chunk of
// p.chunk elements of each: invocation t works on channel t % p.tc and accumulates every
// (256 / p.tc)-th element of the chunk (at most 16), then a tree in shared memory combines the
// lanes of each channel.
// Forward (GRAD false): per invocation shifted sums turned into Welford's (count, mean, M2),
// combined by Chan's formula.
// Gradient (GRAD true): (sum dy, sum dy * (x - mean)) with the saved mean of the channel.
// Writes (a, b, c) per channel and chunk to part[3 * (ch * p.splits + chunk)]. Placeholders:
// GRAD, LOAD_X, LOAD_DY, COMMON, NORM_COMMON.
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> dy: array<u32>;
@group(0) @binding(3) var<storage, read_write> mean_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;

const GRAD: bool = $GRAD;

$COMMON

fn load_x(i: u32) -> f32 {
    return $LOAD_X;
}
fn load_dy(i: u32) -> f32 {
    return $LOAD_DY;
}

var<workgroup> sa: array<f32, 256>;
var<workgroup> sb: array<f32, 256>;
var<workgroup> sc: array<f32, 256>;

// Folds slot k into slot i.
fn combine(i: u32, k: u32) {
    if GRAD {
        sa[i] = sa[i] + sa[k];
        sb[i] = sb[i] + sb[k];
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let g = wid.y * p.groups_x + wid.x;
    let tiles = (p.c + p.tc - 1u) / p.tc;
    if g >= tiles * p.splits {
        return;
    }
    let lanes = 256u / p.tc;
    let lane = t / p.tc;
    let ch = (g / p.splits) * p.tc + t % p.tc;
    let split = g % p.splits;
    let valid = ch < p.c;
    let start = split * p.chunk;
    let end = min(start + p.chunk, p.rest);
    var a = 0.0;
    var b = 0.0;
    var c = 0.0;
    var m = 0.0;
    if GRAD && valid {
        m = mean_in[ch];
    }
    if valid {
        // Four elements per iteration, all loaded before the first is folded (one load in
        // flight per invocation left this pass latency-bound), folded in the order of a
        // one-element loop. Forward: shifted sums b = sum(x - k), c = sum((x - k)^2) about
        // k = the invocation's first element (no division per element; at most 16 elements
        // per invocation, so the cancellation in c - b^2 / a stays within a few ulps of
        // the deviations' squares), turned into a Welford state below.
        var k = 0.0;
        for (var j = start + lane; j < end; j = j + 4u * lanes) {
            let j1 = j + lanes;
            let j2 = j1 + lanes;
            let j3 = j2 + lanes;
            let e0 = elem_index(ch, j);
            let x0 = load_x(e0);
            var x1 = 0.0;
            var x2 = 0.0;
            var x3 = 0.0;
            var d0 = 0.0;
            var d1 = 0.0;
            var d2 = 0.0;
            var d3 = 0.0;
            if GRAD {
                d0 = load_dy(e0);
            }
            if j1 < end {
                let e = elem_index(ch, j1);
                x1 = load_x(e);
                if GRAD {
                    d1 = load_dy(e);
                }
            }
            if j2 < end {
                let e = elem_index(ch, j2);
                x2 = load_x(e);
                if GRAD {
                    d2 = load_dy(e);
                }
            }
            if j3 < end {
                let e = elem_index(ch, j3);
                x3 = load_x(e);
                if GRAD {
                    d3 = load_dy(e);
                }
            }
            if GRAD {
                a = a + d0;
                b = b + d0 * (x0 - m);
                if j1 < end {
                    a = a + d1;
                    b = b + d1 * (x1 - m);
                }
                if j2 < end {
                    a = a + d2;
                    b = b + d2 * (x2 - m);
                }
                if j3 < end {
                    a = a + d3;
                    b = b + d3 * (x3 - m);
                }
            } else {
                if a == 0.0 {
                    k = x0;
                }
                let y0 = x0 - k;
                a = a + 1.0;
                b = b + y0;
                c = c + y0 * y0;
                if j1 < end {
                    let y = x1 - k;
                    a = a + 1.0;
                    b = b + y;
                    c = c + y * y;
                }
                if j2 < end {
                    let y = x2 - k;
                    a = a + 1.0;
                    b = b + y;
                    c = c + y * y;
                }
                if j3 < end {
                    let y = x3 - k;
                    a = a + 1.0;
                    b = b + y;
                    c = c + y * y;
                }
            }
        }
        if !GRAD && a > 0.0 {
            // (count, mean, M2) of the invocation's elements.
            let mean_shift = b / a;
            // Rounding may leave a tiny negative M2; NaN stays NaN.
            let m2 = c - b * mean_shift;
            c = select(m2, 0.0, m2 < 0.0);
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
        let k = 3u * (ch * p.splits + split);
        part[k] = sa[t];
        part[k + 1u] = sb[t];
        part[k + 2u] = sc[t];
    }
}
