// One pass of a reduction over the middle axis of an (outer, r, inner) view of `x`, writing the
// (outer, inner) result to `y`; or, with p.split > 1, the (outer, split, inner) partial results
// of `split` chunks of p.chunk rows each (for a few long reductions, so that they spread over
// many workgroups; a second pass reduces the chunks).
//
// A workgroup of 256 invocations holds `p.g` groups of `p.t` invocations (p.g * p.t == 256,
// p.t a power of two); each group computes one output. Invocation t of a group reads the
// elements r = t, t + p.t, t + 2 p.t, ... of its output's reduction. In row mode (inner == 1)
// the invocations of a group are adjacent, so a group reads a contiguous row; in column mode
// the groups are adjacent, so neighbouring invocations read neighbouring columns. Either way
// the reads of a workgroup are coalesced.
//
// Accuracy (float Sum/Mean/Prod): each invocation combines its elements in blocks of BLOCK and
// folds the block results pairwise (a binary-counter stack), and the group's partial results
// are combined by a tree in shared memory, so the rounding error grows with log(r), not r.
//
// The host substitutes the element type, the bodies of combine() and finalize(), and whether
// to use the pairwise cascade (the upper-case placeholders below).

struct Params {
    outputs: u32,
    r: u32,
    inner: u32,
    g: u32,
    t: u32,
    col_mode: u32,
    groups_x: u32,
    finalize: u32,
    count: u32,
    identity: u32,
    split: u32,
    chunk: u32,
};

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> y: array<ELEM>;

const WG: u32 = 256u;
const BLOCK: u32 = 8u;
const CASCADE: bool = CASCADE_FLAG;

var<workgroup> sh: array<ELEM, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn combine(a: ELEM, b: ELEM) -> ELEM {
    COMBINE_BODY
}

fn finalize(v: ELEM) -> ELEM {
    FINALIZE_BODY
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    var g: u32;
    var t: u32;
    if p.col_mode == 1u {
        g = l % p.g;
        t = l / p.g;
    } else {
        t = l % p.t;
        g = l / p.t;
    }
    let out = (wid.y * p.groups_x + wid.x) * p.g + g;
    let ident = bitcast<ELEM>(p.identity);
    var acc = ident;
    if out < p.outputs {
        // Output `out` of this pass is (o, chunk c, i): the reduction of rows
        // [c * p.chunk, (c + 1) * p.chunk) of column (o, i).
        let i = out % p.inner;
        let c = (out / p.inner) % p.split;
        let o = out / (p.inner * p.split);
        let base = o * p.r * p.inner + i;
        let r0 = c * p.chunk;
        let r1 = min(p.r, r0 + p.chunk);
        if CASCADE {
            var stack: array<ELEM, 32>;
            var top = 0u;
            var blk = ident;
            var nb = 0u;
            var nblocks = 0u;
            for (var r = r0 + t; r < r1; r += p.t) {
                blk = combine(blk, x[base + r * p.inner]);
                nb += 1u;
                if nb == BLOCK {
                    // Push the block's result; merge equal-sized partial results (pairwise).
                    nblocks += 1u;
                    var merged = blk;
                    var k = nblocks;
                    while (k & 1u) == 0u && top > 0u {
                        top -= 1u;
                        merged = combine(stack[top], merged);
                        k = k >> 1u;
                    }
                    stack[top] = merged;
                    top += 1u;
                    blk = ident;
                    nb = 0u;
                }
            }
            acc = blk;
            while top > 0u {
                top -= 1u;
                acc = combine(stack[top], acc);
            }
        } else {
            for (var r = r0 + t; r < r1; r += p.t) {
                acc = combine(acc, x[base + r * p.inner]);
            }
        }
    }
    let slot = g * p.t + t;
    sh[slot] = acc;
    workgroupBarrier();
    var s = p.t / 2u;
    loop {
        if s == 0u {
            break;
        }
        if t < s {
            sh[slot] = combine(sh[slot], sh[slot + s]);
        }
        workgroupBarrier();
        s = s / 2u;
    }
    if t == 0u && out < p.outputs {
        var v = sh[slot];
        if p.finalize == 1u {
            v = finalize(v);
        }
        y[out] = v;
    }
}
