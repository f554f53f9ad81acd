// Select / SelectV2: out = condition ? then : else, with broadcasting. The data is moved as
// raw bits, so one shader serves every dtype of an element size. Placeholders filled in by
// select.rs: OFFSETS (the element offsets of output element e in condition, then and else),
// PPW / BITS / MASK (elements per word, bits per element and their mask, for element sizes
// 1, 2 and 4), WIDE (true for 8-byte elements). Each invocation writes one 32-bit output
// word.
struct Params {
    row: u32,
    n: u32,
    rank: u32,
    words: u32,
    // Collapsed output shape and the element strides of condition, then and else.
    shape: array<vec4<u32>, 2>,
    sc: array<vec4<u32>, 2>,
    st: array<vec4<u32>, 2>,
    se: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> cond: array<u32>;
@group(0) @binding(2) var<storage, read_write> tt: array<u32>;
@group(0) @binding(3) var<storage, read_write> ee: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

const PPW: u32 = $PPWu;
const BITS: u32 = $BITSu;
const MASK: u32 = $MASKu;
const WIDE: bool = $WIDE;

$LINEAR_INDEX

fn offsets(e: u32) -> vec3<u32> {
$OFFSETS
}

fn cond_at(i: u32) -> bool {
    return ((cond[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u;
}

// The bits of element e of the output.
fn pick(e: u32) -> u32 {
    let o = offsets(e);
    if cond_at(o.x) {
        return (tt[o.y / PPW] >> ((o.y % PPW) * BITS)) & MASK;
    }
    return (ee[o.z / PPW] >> ((o.z % PPW) * BITS)) & MASK;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
    if WIDE {
        // 8-byte elements: word w is half w % 2 of element w / 2.
        let half = w & 1u;
        let o = offsets(w >> 1u);
        if cond_at(o.x) {
            out[w] = tt[2u * o.y + half];
        } else {
            out[w] = ee[2u * o.z + half];
        }
        return;
    }
    var v = 0u;
    for (var k = 0u; k < PPW; k = k + 1u) {
        let e = w * PPW + k;
        if e < p.n {
            v = v | (pick(e) << (k * BITS));
        }
    }
    out[w] = v;
}
