// Shared by matmul.wgsl and matmul_vec4.wgsl (prepended by the host): the params both
// kernels take (packed by `MatmulParams` in mod.rs) and the decomposition of a batch index.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_base: u32,
    sa_m: u32,
    sa_k: u32,
    sb_k: u32,
    sb_n: u32,
    a_kfast: u32,
    b_nfast: u32,
    nbd: u32,
    tile_base_x: u32,
    tile_base_y: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    bdims: array<vec4<u32>, 2>,
    astr: array<vec4<u32>, 2>,
    bstr: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;

// Offsets of batch `bidx` in A and B: the index is decomposed over the (simplified) batch
// dimensions, innermost first; a stride is 0 where that operand is broadcast.
fn batch_offsets(bidx: u32) -> vec2<u32> {
    var rem = bidx;
    var off = vec2<u32>(0u, 0u);
    for (var d = 0u; d < p.nbd; d += 1u) {
        let size = p.bdims[d / 4u][d % 4u];
        let idx = rem % size;
        rem = rem / size;
        off += idx * vec2<u32>(p.astr[d / 4u][d % 4u], p.bstr[d / 4u][d % 4u]);
    }
    return off;
}
