// Statistics and per-channel results of a training batch norm (forward or gradient) in ONE
// dispatch, for float32 or float16 with the channel innermost (NHWC) and C % 4 == 0: the
// statistics pass of stats_vec4.wgsl (same geometry: a workgroup folds p.tc channel quads over
// one chunk of p.chunk rows), followed by the work of finalize.wgsl done by the last
// workgroup to arrive instead of a second dispatch:
//   1. each workgroup writes its quads' states as records (count, mean, M2) forward or
//      (0, sum dy, sum dy * (x - mean)) for the gradient, then counts its arrival in its
//      group of p.group chunks (an atomic counter per tile and group; release: a storage
//      barrier before the atomic, acquire: one after);
//   2. the last workgroup of a group merges the group's records (lanes strided, then the
//      tree of fold_lanes); with more than one group it writes the group's record and counts
//      its arrival at the tile, and the last group's workgroup merges the group records;
//   3. that workgroup's lane-0 invocations compute the per-channel results (results_fwd.wgsl /
//      results_grad.wgsl, the code finalize.wgsl runs), write the [C] outputs and rows 4..7
//      of the coefficients for the apply pass.
// The last arriver resets its counter to 0, so `arrivals` (a zeroed buffer of the device,
// shared by all calls; dispatches are ordered by barriers) is zero between calls.
// Buffer `part` (vec4): rows 0..7 of the coefficients as C / 4 quads each (the layout the
// vec4 apply reads; rows 4..7 written), then the records: chunk s of quad q at
// 8 * quads + 3 * (s * quads + q), group g's at 8 * quads + 3 * ((p.splits + g) * quads + q).
// Placeholders: NORM_COMMON, DECLS (bindings; `ldy`, `results`, `put_space3`), GRAD, PUT_OUT,
// RESULTS, FOLD (fold_vec4.wgsl), XT and LD (vec4_io), COMMON.
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<$XT>;
@group(0) @binding(2) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> arrivals: array<atomic<u32>>;
$DECLS

const GRAD: bool = $GRAD;

$COMMON

$LD

fn ldx(e: u32) -> vec4<f32> {
    return ld(x[e]);
}

var<workgroup> sa: array<f32, 256>;
var<workgroup> sb: array<vec4<f32>, 256>;
var<workgroup> sc: array<vec4<f32>, 256>;
var<workgroup> arrived: u32;

$FOLD

// Row `row` of channel ch's results: rows below p.words to the op's [C] outputs, rows 4..7
// to the coefficients at the start of `part`.
fn put(row: u32, ch: u32, v: f32) {
    if row >= 4u {
        part[row * (p.c / 4u) + ch / 4u][ch % 4u] = v;
    } else if row < p.words {
$PUT_OUT
    }
}

$RESULTS

// Chan's combination of two Welford states (forward) or the sums (gradient).
fn merge(a: Fold, b: Fold) -> Fold {
    if GRAD {
        return Fold(0.0, a.b + b.b, a.c + b.c);
    }
    if b.a == 0.0 {
        return a;
    }
    if a.a == 0.0 {
        return b;
    }
    let n = a.a + b.a;
    let d = b.b - a.b;
    return Fold(n, a.b + d * (b.a / n), a.c + b.c + d * d * (a.a * (b.a / n)));
}

fn write_rec(r: u32, f: Fold) {
    let k = 8u * (p.c / 4u) + 3u * r;
    part[k] = vec4<f32>(f.a, 0.0, 0.0, 0.0);
    part[k + 1u] = f.b;
    part[k + 2u] = f.c;
}

fn read_rec(r: u32) -> Fold {
    let k = 8u * (p.c / 4u) + 3u * r;
    return Fold(part[k].x, part[k + 1u], part[k + 2u]);
}

// Counts this workgroup's arrival at counter k of `members`; true (for every invocation) in
// the last one to arrive, which resets the counter and then sees every member's records.
fn arrive(t: u32, k: u32, members: u32) -> bool {
    storageBarrier();
    if t == 0u {
        arrived = atomicAdd(&arrivals[k], 1u);
    }
    let last = workgroupUniformLoad(&arrived) + 1u == members;
    if last {
        storageBarrier();
        if t == 0u {
            atomicStore(&arrivals[k], 0u);
        }
    }
    return last;
}

// Every invocation (barriers): merges the `count` records first, first + quads, ... of quad q
// (the invocation's quad) where `valid`, lanes strided, then the tree of fold_lanes, so that
// slot t of lane 0 holds the merged state.
fn merge_lanes(t: u32, valid: bool, first: u32, count: u32, lane: u32, lanes: u32) {
    let quads = p.c / 4u;
    var f = Fold(0.0, vec4<f32>(0.0), vec4<f32>(0.0));
    if valid {
        for (var k = lane; k < count; k += lanes) {
            f = merge(f, read_rec(first + k * quads));
        }
    }
    sa[t] = f.a;
    sb[t] = f.b;
    sc[t] = f.c;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s / 2u) {
        if lane < s {
            combine(t, t + s * p.tc);
        }
        workgroupBarrier();
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
    let tile = g / p.splits;
    let split = g % p.splits;
    let q = tile * p.tc + t % p.tc;
    let valid = q < quads;
    let start = split * p.chunk;
    let end = min(start + p.chunk, p.rest);
    fold_lanes(t, q, valid, quads, start, end, lane, lanes);
    if lane == 0u && valid {
        write_rec(split * quads + q, Fold(sa[t], sb[t], sc[t]));
    }
    let gs = p.group;
    let groups = (p.splits + gs - 1u) / gs;
    let gi = split / gs;
    let members = min(gs, p.splits - gi * gs);
    if !arrive(t, tile * groups + gi, members) {
        return;
    }
    merge_lanes(t, valid, gi * gs * quads + q, members, lane, lanes);
    if groups > 1u {
        if lane == 0u && valid {
            write_rec((p.splits + gi) * quads + q, Fold(sa[t], sb[t], sc[t]));
        }
        if !arrive(t, tiles * groups + tile, groups) {
            return;
        }
        merge_lanes(t, valid, p.splits * quads + q, groups, lane, lanes);
    }
    if lane == 0u && valid {
        let r = sb[t];
        let v = sc[t];
        let ch = 4u * q;
        results(ch, r.x, v.x);
        results(ch + 1u, r.y, v.y);
        results(ch + 2u, r.z, v.z);
        results(ch + 3u, r.w, v.w);
        if q == 0u && p.n == 1u {
            put_space3();
        }
    }
}
