// Training batch norm (forward or gradient) in ONE dispatch, for float32 or float16 with the
// channel innermost (NHWC), C % 4 == 0 and few rows per channel (p.rest <= 64 * lanes): a
// workgroup of WGS invocations owns p.tc channel quads completely (every one of their p.rest
// rows), so it needs no other workgroup's partials:
//   1. statistics: invocation t takes quad t % p.tc and every lanes-th row (lanes = WGS / p.tc,
//      at most 64 rows), four rows per loop iteration with all loads before any fold, as
//      stats_vec4.wgsl; a tree in shared memory combines the lanes (Chan's formula forward,
//      sums for the gradient);
//   2. the quad's lane-0 invocation computes the per-channel results (results_fwd.wgsl /
//      results_grad.wgsl, the same code finalize.wgsl runs), writes the [C] outputs and keeps
//      the coefficients (rows 4..7) in shared memory;
//   3. apply: every invocation re-reads its own rows (from L2: a workgroup's rows were read
//      microseconds before) and writes y or x_backprop, two rows per iteration, loads before
//      stores. Each invocation writes only the elements it read itself, after the barrier
//      that ends step 1, so the output may alias an input.
// p.tc <= 8 (so 32 channels per workgroup), p.groups_x = workgroups along x.
// Placeholders: NORM_COMMON, DECLS (bindings, and the functions `ldy` (a dy load, 0 forward),
// `results` (results_train or results_grad), `put_space3` (V3's reserve_space_3 forward)),
// GRAD, WGS, PUT_OUT (the [C] outputs), RESULTS, FOLD (fold_vec4.wgsl), XT and LD (vec4_io),
// COMMON.
$NORM_COMMON
$DECLS

const GRAD: bool = $GRAD;
const WGS: u32 = $WGSu;

$COMMON

$LD

fn ldx(e: u32) -> vec4<f32> {
    return ld(x[e]);
}

var<workgroup> sa: array<f32, WGS>;
var<workgroup> sb: array<vec4<f32>, WGS>;
var<workgroup> sc: array<vec4<f32>, WGS>;
// Rows 4..7 of the results for the workgroup's (at most 32) channels: cf[(row - 4) * 32 + l].
var<workgroup> cf: array<f32, 128>;
// First channel of this workgroup.
var<private> ch_base: u32;

$FOLD

// Row `row` of channel ch's results: rows below p.words to the op's [C] outputs, rows 4..7
// to shared memory for the apply step.
fn put(row: u32, ch: u32, v: f32) {
    if row >= 4u {
        cf[(row - 4u) * 32u + (ch - ch_base)] = v;
    } else if row < p.words {
$PUT_OUT
    }
}

$RESULTS

fn coef(row: u32, l: u32) -> vec4<f32> {
    let k = (row - 4u) * 32u + 4u * l;
    return vec4<f32>(cf[k], cf[k + 1u], cf[k + 2u], cf[k + 3u]);
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let g = wid.y * p.groups_x + wid.x;
    let quads = p.c / 4u;
    let tiles = (quads + p.tc - 1u) / p.tc;
    if g >= tiles {
        return;
    }
    ch_base = 4u * g * p.tc;
    let lanes = WGS / p.tc;
    let lane = t / p.tc;
    let l = t % p.tc;
    let q = g * p.tc + l;
    let valid = q < quads;
    let end = p.rest;
    let step = lanes * quads;
    fold_lanes(t, q, valid, quads, 0u, end, lane, lanes);
    if lane == 0u && valid {
        let r = sb[t];
        let v = sc[t];
        let ch = 4u * q;
        results(ch, r.x, v.x);
        results(ch + 1u, r.y, v.y);
        results(ch + 2u, r.z, v.z);
        results(ch + 3u, r.w, v.w);
        if g == 0u && l == 0u && p.n == 1u {
            put_space3();
        }
    }
    workgroupBarrier();
    if !valid {
        return;
    }
    let mean = coef(4u, l);
    let kk = coef(5u, l);
    let r6 = coef(6u, l);
    let r7 = coef(7u, l);
    var j = lane;
    while j + lanes < end {
        let e0 = j * quads + q;
        let e1 = e0 + step;
        let x0 = ld(x[e0]);
        let x1 = ld(x[e1]);
        var r0: vec4<f32>;
        var r1: vec4<f32>;
        if GRAD {
            let d0 = ldy(e0);
            let d1 = ldy(e1);
            r0 = kk * ((d0 - r6) - (x0 - mean) * r7);
            r1 = kk * ((d1 - r6) - (x1 - mean) * r7);
        } else {
            r0 = (x0 - mean) * kk + r6;
            r1 = (x1 - mean) * kk + r6;
        }
        out[e0] = st(r0);
        out[e1] = st(r1);
        j += 2u * lanes;
    }
    if j < end {
        let e0 = j * quads + q;
        let x0 = ld(x[e0]);
        var r0: vec4<f32>;
        if GRAD {
            let d0 = ldy(e0);
            r0 = kk * ((d0 - r6) - (x0 - mean) * r7);
        } else {
            r0 = (x0 - mean) * kk + r6;
        }
        out[e0] = st(r0);
    }
}
