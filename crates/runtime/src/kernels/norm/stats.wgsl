// Per-channel partial statistics of a batch norm. One workgroup of 256 invocations covers
// p.tc channels (a power of two: 1 when the channel is not the innermost dimension, up to 32
// when it is, so that neighbouring invocations read neighbouring channels) and one chunk of
// p.chunk elements of each: invocation t works on channel t % p.tc and accumulates every
// (256 / p.tc)-th element of the chunk (at most 16), then a tree in shared memory combines the
// lanes of each channel.
// Forward (GRAD false): Welford's (count, mean, M2), combined by Chan's formula.
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
        // Four elements per iteration, all loaded before the first is used (then combined in
        // the order of the one-element loop): one load in flight per invocation left this
        // pass latency-bound.
        for (var j = start + lane; j < end; j = j + 4u * lanes) {
            var xs = vec4<f32>(0.0);
            var ds = vec4<f32>(0.0);
            for (var k = 0u; k < 4u; k = k + 1u) {
                let jk = j + k * lanes;
                if jk < end {
                    let e = elem_index(ch, jk);
                    xs[k] = load_x(e);
                    if GRAD {
                        ds[k] = load_dy(e);
                    }
                }
            }
            for (var k = 0u; k < 4u; k = k + 1u) {
                if j + k * lanes < end {
                    let xv = xs[k];
                    if GRAD {
                        let d = ds[k];
                        a = a + d;
                        b = b + d * (xv - m);
                    } else {
                        a = a + 1.0;
                        let delta = xv - b;
                        b = b + delta / a;
                        c = c + delta * (xv - b);
                    }
                }
            }
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
