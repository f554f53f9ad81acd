// ArgMax / ArgMin over the middle axis of an (outer, r, inner) view of `x`, writing the
// (outer, inner) indices to `out` (int32, or int64 as (low, high) words).
//
// Values are compared as order-preserving keys: vec2<u32>(major, minor) compared
// lexicographically (floats: -0 as +0, NaN never selected; int64: the high word with its
// sign bit flipped, then the low word). Semantics of TensorFlow's CPU kernel (Eigen's
// ArgMaxTupleReducer): the running best starts at (index 0, the lowest finite value) and an
// element replaces it only when strictly better, so ties keep the first index, NaN is
// ignored, and a row with nothing better than the lowest finite value gives index 0.
//
// A workgroup of 256 invocations holds p.g groups of p.t invocations (p.t a power of two, 1
// when inner > 1, so that neighbouring invocations read neighbouring columns); each group
// computes one output: invocation t scans elements t, t + p.t, ... of its row, then the
// group's candidates are combined by a tree in shared memory (better key wins, ties go to
// the smaller index).
//
// Placeholders filled in by mod.rs: KEY (the body of `key(i)`, the key of element i; `valid`
// set false for NaN), INIT (the key of the starting value), BETTER (`>` for ArgMax, `<` for
// ArgMin, applied to keys), WIDE (int64 output).
struct Params {
    outputs: u32,
    r: u32,
    inner: u32,
    g: u32,
    t: u32,
    groups_x: u32,
    // This dispatch scans elements [start, end) of each row (long rows take several
    // dispatches: CPU adapters stop a shader's loops after 65,535 iterations in all); a later
    // one starts from the index the previous one wrote.
    start: u32,
    end: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

const WIDE: bool = $WIDE;

var<workgroup> sh_key: array<vec2<u32>, 256>;
var<workgroup> sh_idx: array<u32, 256>;

$COMMON

// Monotone map of f32 bits to u32 (-0 is taken as +0).
fn f32_key(b0: u32) -> u32 {
    var b = b0;
    if b == 0x80000000u {
        b = 0u;
    }
    if (b & 0x80000000u) != 0u {
        return ~b;
    }
    return b | 0x80000000u;
}

// The key of element i; `valid` false for NaN.
fn key(i: u32, valid: ptr<function, bool>) -> vec2<u32> {
$KEY
}

fn better(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x $BETTER b.x || (a.x == b.x && a.y $BETTER b.y);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let t = l % p.t;
    let gi = l / p.t;
    let o = (wid.y * p.groups_x + wid.x) * p.g + gi;
    var best = $INIT;
    var best_idx = 0u;
    if o < p.outputs {
        let i = o % p.inner;
        let base = (o / p.inner) * p.r * p.inner + i;
        if p.start > 0u {
            // The best so far: its key is its element's (the starting value's for an index
            // 0 that nothing beat, as a NaN there reads), and earlier indices win ties.
            var prior = out[o];
            if WIDE {
                prior = out[2u * o];
            }
            var valid = true;
            let kk = key(base + prior * p.inner, &valid);
            if valid {
                best = kk;
            }
            best_idx = prior;
        }
        for (var k = p.start + t; k < p.end; k = k + p.t) {
            var valid = true;
            let kk = key(base + k * p.inner, &valid);
            if valid && better(kk, best) {
                best = kk;
                best_idx = k;
            }
        }
    }
    sh_key[l] = best;
    sh_idx[l] = best_idx;
    workgroupBarrier();
    var s = p.t / 2u;
    loop {
        if s == 0u {
            break;
        }
        if t < s {
            let ok = sh_key[l + s];
            let oi = sh_idx[l + s];
            let mk = sh_key[l];
            if better(ok, mk) || (all(ok == mk) && oi < sh_idx[l]) {
                sh_key[l] = ok;
                sh_idx[l] = oi;
            }
        }
        workgroupBarrier();
        s = s / 2u;
    }
    if t == 0u && o < p.outputs {
        if WIDE {
            out[2u * o] = sh_idx[l];
            out[2u * o + 1u] = 0u;
        } else {
            out[o] = sh_idx[l];
        }
    }
}
