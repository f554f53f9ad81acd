// One pass of a reduction (see reduce.wgsl for the (outer, r, inner) view, the groups and the
// split in chunks) loading four 32-bit elements at a time, for the passes whose layout allows
// it: a row reduction (inner == 1) whose rows and chunks are multiples of 4 elements, or a
// column reduction whose inner size is a multiple of 4. All sizes in p are in vec4 units
// along the loaded axis: row mode p.r and p.chunk count vec4 of a row; column mode p.inner
// counts vec4 columns (and p.outputs counts vec4 outputs).
//
// Row mode: an invocation folds its vec4 (lane k accumulates the elements = k mod 4 of its
// part), then the four lanes, then a tree over the group. Column mode: every lane is its own
// column all the way (a vec4 tree, a vec4 output). The main loop issues two loads before
// folding either, the one-load tail finishes the chunk. No invocation folds more than 16
// vec4 per lane sequentially for float Sum/Mean/Prod (the host picks reduce.wgsl's pairwise
// cascade beyond that), so the rounding error stays within the cascade's bound.
//
// Placeholders (upper case in the code below): the element type, the column-mode flag, the
// bodies of combine() and finalize(), the output type and its store.

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
@group(0) @binding(1) var<storage, read_write> x: array<vec4<ELEM>>;
@group(0) @binding(2) var<storage, read_write> y: array<OUT_T>;

const WG: u32 = 256u;
const COL: bool = COL_FLAG;

var<workgroup> sh: array<vec4<ELEM>, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn combine(a: ELEM, b: ELEM) -> ELEM {
    COMBINE_BODY
}

fn combine4(a: vec4<ELEM>, b: vec4<ELEM>) -> vec4<ELEM> {
    return vec4<ELEM>(combine(a.x, b.x), combine(a.y, b.y), combine(a.z, b.z), combine(a.w, b.w));
}

fn finalize(v: ELEM) -> ELEM {
    FINALIZE_BODY
}

fn store(out: u32, v: vec4<ELEM>) {
    STORE_BODY
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    var g: u32;
    var t: u32;
    if COL {
        g = l % p.g;
        t = l / p.g;
    } else {
        t = l % p.t;
        g = l / p.t;
    }
    let out = (wid.y * p.groups_x + wid.x) * p.g + g;
    let ident = bitcast<ELEM>(p.identity);
    var acc = vec4<ELEM>(ident);
    if out < p.outputs {
        let i = out % p.inner;
        let c = (out / p.inner) % p.split;
        let o = out / (p.inner * p.split);
        let base = o * p.r * p.inner + i;
        let r0 = c * p.chunk;
        let r1 = min(p.r, r0 + p.chunk);
        let step = p.t * p.inner;
        var r = r0 + t;
        var at = base + r * p.inner;
        while r + p.t < r1 {
            let a = x[at];
            let b = x[at + step];
            acc = combine4(combine4(acc, a), b);
            r += 2u * p.t;
            at += 2u * step;
        }
        if r < r1 {
            acc = combine4(acc, x[at]);
        }
    }
    if !COL {
        // The four lanes belong to one output.
        let s = combine(combine(acc.x, acc.y), combine(acc.z, acc.w));
        acc = vec4<ELEM>(s);
    }
    let slot = g * p.t + t;
    sh[slot] = acc;
    workgroupBarrier();
    for (var s = p.t / 2u; s > 0u; s = s / 2u) {
        if t < s {
            sh[slot] = combine4(sh[slot], sh[slot + s]);
        }
        workgroupBarrier();
    }
    if t == 0u && out < p.outputs {
        var v = sh[slot];
        if p.finalize == 1u {
            v = vec4<ELEM>(finalize(v.x), finalize(v.y), finalize(v.z), finalize(v.w));
        }
        store(out, v);
    }
}
