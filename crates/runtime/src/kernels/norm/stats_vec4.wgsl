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
// Placeholders: GRAD, NORM_COMMON, FOLD (fold_vec4.wgsl), XT and LD (the load type and its
// conversion), COMMON.
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<$XT>;
@group(0) @binding(2) var<storage, read_write> dy: array<$XT>;
@group(0) @binding(3) var<storage, read_write> mean_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;

const GRAD: bool = $GRAD;

$COMMON

$LD

fn ldx(e: u32) -> vec4<f32> {
    return ld(x[e]);
}
fn ldy(e: u32) -> vec4<f32> {
    return ld(dy[e]);
}

var<workgroup> sa: array<f32, 256>;
var<workgroup> sb: array<vec4<f32>, 256>;
var<workgroup> sc: array<vec4<f32>, 256>;

$FOLD

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
    fold_lanes(t, q, valid, quads, start, end, lane, lanes);
    if lane == 0u && valid {
        let r = sb[t];
        let v = sc[t];
        put(4u * q, split, sa[t], r.x, v.x);
        put(4u * q + 1u, split, sa[t], r.y, v.y);
        put(4u * q + 2u, split, sa[t], r.z, v.z);
        put(4u * q + 3u, split, sa[t], r.w, v.w);
    }
}
