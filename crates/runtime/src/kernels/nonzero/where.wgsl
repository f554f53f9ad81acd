// Where (indices of the non-zero elements), in three dispatches over blocks of BLOCK elements
// (a workgroup of 256 invocations, 4 consecutive elements each):
//   MODE 0 (count):   counts[b] = number of non-zero elements of block b;
//   MODE 1 (scan):    one workgroup turns counts into exclusive prefix sums, in place;
//   MODE 2 (scatter): each block writes the coordinates of its non-zero elements, in order,
//                     as int64 (low, high) words at rows counts[b] + (rank within block).
// Placeholders filled in by mod.rs: MODE, NONZERO (whether element i of `x` is non-zero).
struct Params {
    n: u32,
    blocks: u32,
    rank: u32,
    groups_x: u32,
    // The input's shape, outermost first.
    shape: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> counts: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const MODE: u32 = $MODEu;
const WG: u32 = 256u;
const PER: u32 = 4u;
const BLOCK: u32 = 1024u;

var<workgroup> sh: array<u32, 256>;

fn nonzero(i: u32) -> bool {
    return $NONZERO;
}

// Inclusive prefix sum of sh over the workgroup (Hillis-Steele); returns this slot's value.
fn workgroup_scan(l: u32, v: u32) -> u32 {
    sh[l] = v;
    workgroupBarrier();
    var acc = v;
    for (var s = 1u; s < WG; s = s * 2u) {
        var add = 0u;
        if l >= s {
            add = sh[l - s];
        }
        workgroupBarrier();
        acc = acc + add;
        sh[l] = acc;
        workgroupBarrier();
    }
    return acc;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    if MODE == 1u {
        // Exclusive scan of counts[0 .. blocks), 256 at a time, carrying the running total.
        var carry = 0u;
        for (var base = 0u; base < p.blocks; base = base + WG) {
            let i = base + l;
            var v = 0u;
            if i < p.blocks {
                v = counts[i];
            }
            let inc = workgroup_scan(l, v);
            if i < p.blocks {
                counts[i] = carry + inc - v;
            }
            carry = carry + sh[WG - 1u];
            workgroupBarrier();
        }
        return;
    }
    let b = wid.y * p.groups_x + wid.x;
    // Uniform across the workgroup: every invocation reaches the barriers below.
    let live = b < p.blocks;
    let first = b * BLOCK + l * PER;
    var mine = 0u;
    var flags = 0u;
    if live {
        for (var k = 0u; k < PER; k = k + 1u) {
            let e = first + k;
            if e < p.n && nonzero(e) {
                mine = mine + 1u;
                flags = flags | (1u << k);
            }
        }
    }
    let inc = workgroup_scan(l, mine);
    if MODE == 0u {
        if live && l == WG - 1u {
            counts[b] = inc;
        }
        return;
    }
    if !live {
        return;
    }
    var row = counts[b] + inc - mine;
    for (var k = 0u; k < PER; k = k + 1u) {
        if (flags & (1u << k)) != 0u {
            // Coordinates of element first + k, innermost dimension last.
            var rem = first + k;
            for (var d = p.rank; d > 0u; d = d - 1u) {
                let j = d - 1u;
                let dim = p.shape[j / 4u][j % 4u];
                let w = 2u * (row * p.rank + j);
                out[w] = rem % dim;
                out[w + 1u] = 0u;
                rem = rem / dim;
            }
            row = row + 1u;
        }
    }
}
