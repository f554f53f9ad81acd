// Per-channel partial statistics of a batch norm, one workgroup of 256 invocations per
// (channel, chunk of `p.chunk` elements): each invocation accumulates a strided part of the
// chunk (at most chunk / 256 elements), then a tree in shared memory combines the 256.
// Forward (GRAD false): Welford's (count, mean, M2), combined by Chan's formula.
// Gradient (GRAD true): (sum dy, sum dy * (x - mean)) with the saved mean of the channel.
// Writes (a, b, c) per workgroup to part[3 * g ...]. Placeholders: GRAD, LOAD_X, LOAD_DY,
// COMMON, NORM_COMMON.
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
    if g >= p.c * p.splits {
        return;
    }
    let ch = g / p.splits;
    let start = (g % p.splits) * p.chunk;
    let end = min(start + p.chunk, p.rest);
    var a = 0.0;
    var b = 0.0;
    var c = 0.0;
    var m = 0.0;
    if GRAD {
        m = mean_in[ch];
    }
    for (var j = start + t; j < end; j = j + 256u) {
        let e = elem_index(ch, j);
        let xv = load_x(e);
        if GRAD {
            let d = load_dy(e);
            a = a + d;
            b = b + d * (xv - m);
        } else {
            a = a + 1.0;
            let delta = xv - b;
            b = b + delta / a;
            c = c + delta * (xv - b);
        }
    }
    sa[t] = a;
    sb[t] = b;
    sc[t] = c;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if t < s {
            combine(t, t + s);
        }
        workgroupBarrier();
    }
    if t == 0u {
        part[3u * g] = sa[0];
        part[3u * g + 1u] = sb[0];
        part[3u * g + 2u] = sc[0];
    }
}
