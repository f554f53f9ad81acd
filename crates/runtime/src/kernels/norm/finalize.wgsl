// Per-channel results of a batch norm, one workgroup of 256 invocations per channel: combines
// the channel's `p.splits` partials from norm_stats (strided per invocation, then a tree) and
// writes rows of `res` (each `p.c` floats):
//   forward:  0 batch_mean, 1 batch_variance, 2 saved mean, 3 saved (biased) variance,
//             4 mean, 5 scale * rsqrt(var + eps), 6 offset            (y = (x - r4) * r5 + r6)
//   gradient: 0 scale_backprop, 1 offset_backprop, 4 mean, 5 scale * rsqrt(var + eps),
//             6 mean(dy), 7 rsqrt(var + eps)^2 * mean(dy * (x - mean))
//             (x_backprop = r5 * ((dy - r6) - (x - r4) * r7); inference: dy * r5)
// p.mode: 0 training forward, 1 inference forward, 2 training gradient, 3 inference gradient.
// Placeholders: NORM_COMMON, DIRECT_DECLS, DIRECT_PUT, RESULTS (results_fwd.wgsl and
// results_grad.wgsl).
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> scale: array<f32>;
@group(0) @binding(3) var<storage, read_write> offset: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean_in: array<f32>;
@group(0) @binding(5) var<storage, read_write> var_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> res: array<f32>;
$DIRECT_DECLS

var<workgroup> sa: array<f32, 256>;
var<workgroup> sb: array<f32, 256>;
var<workgroup> sc: array<f32, 256>;

// Folds (nb, mb, qb) into (na, ma, qa): Chan's combination of Welford states, or plain sums
// for the gradient.
fn merge(a: vec3<f32>, b: vec3<f32>, sums: bool) -> vec3<f32> {
    if sums {
        return vec3<f32>(a.x + b.x, a.y + b.y, 0.0);
    }
    if b.x == 0.0 {
        return a;
    }
    if a.x == 0.0 {
        return b;
    }
    let n = a.x + b.x;
    let d = b.y - a.y;
    return vec3<f32>(n, a.y + d * (b.x / n), a.z + b.z + d * d * (a.x * (b.x / n)));
}

// Row `row` of the results; rows below p.words also go straight to the op's [c] outputs
// (the "direct" variant, on devices with 11 storage bindings per stage; else a separate
// dispatch copies them).
fn put(row: u32, ch: u32, v: f32) {
    res[row * p.c + ch] = v;
$DIRECT_PUT
}

$RESULTS

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let ch = wid.y * p.groups_x + wid.x;
    if ch >= p.c {
        return;
    }
    let sums = p.mode >= 2u;
    var acc = vec3<f32>(0.0, 0.0, 0.0);
    if p.mode != 1u {
        for (var s = t; s < p.splits; s = s + 256u) {
            let k = 3u * (ch * p.splits + s);
            acc = merge(acc, vec3<f32>(part[k], part[k + 1u], part[k + 2u]), sums);
        }
    }
    sa[t] = acc.x;
    sb[t] = acc.y;
    sc[t] = acc.z;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s / 2u) {
        if t < s {
            let r = merge(vec3<f32>(sa[t], sb[t], sc[t]), vec3<f32>(sa[t + s], sb[t + s], sc[t + s]), sums);
            sa[t] = r.x;
            sb[t] = r.y;
            sc[t] = r.z;
        }
        workgroupBarrier();
    }
    if t != 0u {
        return;
    }
    if p.mode == 0u {
        results_train(ch, sb[0], sc[0]);
    } else if p.mode == 1u {
        results_infer(ch);
    } else {
        results_grad(ch, sa[0], sb[0]);
    }
}
