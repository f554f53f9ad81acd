// (Batched) matrix product C[b] = A[b] x B[b] for few outputs over a long K, with K split
// across the invocations of a workgroup (same operands, strides and params as matmul.wgsl).
//
// The tiled kernel gives such a product one or two workgroups, each walking all of K in steps
// of BK with two barriers per step (a Keras Dense layer's forward pass at batch 64: a 64 x 10
// output over K = 1152, 144 steps in one workgroup). Here a workgroup computes NC columns of
// one row of C: invocation l sums the terms k = l, l + WG, l + 2 WG, ... of each of its NC
// outputs, then the workgroup adds the WG partial sums of each output in shared memory
// (a tree of log2(WG) levels). The grid is (column blocks of NC, rows, batches).
//
// The host substitutes the element type and the body of mad() (the upper-case placeholders).

@group(0) @binding(1) var<storage, read_write> a: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> b: array<ELEM>;
@group(0) @binding(3) var<storage, read_write> c: array<ELEM>;

const WG: u32 = SPLITK_WGu;
const NC: u32 = SPLITK_NCu;

var<workgroup> part: array<ELEM, WG * NC>;

fn mad(x: ELEM, y: ELEM, acc: ELEM) -> ELEM {
    MAD_BODY
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let bidx = p.batch_base + wid.z;
    let offs = batch_offsets(bidx);
    let row = p.tile_base_y + wid.y;
    let n0 = (p.tile_base_x + wid.x) * NC;
    // Columns of this block inside C (the grid never starts a block at or past N).
    let nc = min(NC, p.n - n0);

    var acc: array<ELEM, NC>;
    if row < p.m {
        let arow = offs.x + row * p.sa_m;
        let bcol = offs.y + n0 * p.sb_n;
        for (var kk = l; kk < p.k; kk += WG) {
            let av = a[arow + kk * p.sa_k];
            let brow = bcol + kk * p.sb_k;
            for (var j = 0u; j < NC; j += 1u) {
                if j < nc {
                    acc[j] = mad(av, b[brow + j * p.sb_n], acc[j]);
                }
            }
        }
    }
    for (var j = 0u; j < NC; j += 1u) {
        part[j * WG + l] = acc[j];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if l < s {
            for (var j = 0u; j < NC; j += 1u) {
                part[j * WG + l] = part[j * WG + l] + part[j * WG + l + s];
            }
        }
        workgroupBarrier();
    }
    if l < nc && row < p.m {
        c[bidx * p.m * p.n + row * p.n + n0 + l] = part[l * WG];
    }
}
