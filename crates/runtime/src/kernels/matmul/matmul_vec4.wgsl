// Register-blocked (batched) matrix product C[b] = A[b] x B[b] for operands whose contiguous
// dimension is a multiple of 4: every global access is a 16-byte vector.
//
// A workgroup computes a BM x BN tile of C with NT = (BM / TM) * (BN / TN) invocations; an
// invocation holds TM x TN accumulators as TM * TN / 4 vectors: rows 4 * (ty + g * TY) + r
// (g < TM / 4, r < 4) and column vectors tx + j * TX (j < TN / 4). A warp of 32 is 8 columns
// of invocations by 4 rows, so each fragment read from shared memory touches at most 8
// distinct 16-byte vectors (one 128-byte wavefront).
//
// K is walked in tiles of BK through STAGES (1 or 2) shared-memory buffers (k-major: As[k][m],
// Bs[k][n], rows padded by one vector (`pad`) so that the transposing stores spread over the
// banks).
// While the invocations multiply out one buffer, the next tile's global loads are in flight in
// registers; they are stored after the products, to the other buffer (one barrier per tile)
// or, with one buffer, after a second barrier. With `parts`, the next tile is loaded and
// stored in parts around as many slices of the products (1 / parts of the staging registers).
// The staging runs unconditionally, also after the last tile (its loads are past K: zeros, and
// go to a buffer nobody reads any more), so that the loop body has no branches.
//
// Layouts (compile-time, named in the specialization): A is "ak" (row-major M x K, K % 4 == 0)
// or "am" (transposed, stored K x M, M % 4 == 0); B is "bn" (row-major K x N, N % 4 == 0) or
// "bk" (transposed, stored N x K, K % 4 == 0); C is row-major with N % 4 == 0. Out-of-range
// vectors read as zero: with these divisibilities a vector is wholly inside or wholly outside
// its matrix.
//
// The host substitutes ELEM, the tile constants and the GEN_* blocks (the K loop too), which it
// generates fully unrolled (loops over constants would leave register allocation of the accumulator array to
// the driver). Params and batch_offsets come from matmul_common.wgsl.

@group(0) @binding(1) var<storage, read_write> a: array<vec4<ELEM>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<ELEM>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<ELEM>>;

const BM: u32 = TILE_BMu;
const BN: u32 = TILE_BNu;
const BK: u32 = TILE_BKu;
const TM: u32 = TILE_TMu;
const TN: u32 = TILE_TNu;
const TX: u32 = BN / TN;
const TY: u32 = BM / TM;
const NT: u32 = TX * TY;
// Shared-memory buffers (1 or 2).
const STAGES: u32 = TILE_STAGESu;
// Tile rows per launch group (0: plain row-major launch order).
const GROUP: u32 = TILE_GROUPu;
// Row strides of the shared tiles, in vectors (PAD: 0 or 1 vector of padding).
const PAD: u32 = TILE_PADu;
const SA: u32 = BM / 4u + PAD;
const SB: u32 = BN / 4u + PAD;

var<workgroup> As: array<vec4<ELEM>, STAGES * BK * SA>;
var<workgroup> Bs: array<vec4<ELEM>, STAGES * BK * SB>;

@compute @workgroup_size(NT)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    let bidx = p.batch_base + wid.z;
    let offs = batch_offsets(bidx);
    let aoff = offs.x;
    let boff = offs.y;
    // With GROUP > 0, workgroups launch in groups of GROUP tile rows, column by column, so
    // that the ones in flight share rows of A and columns of B in the cache.
    var tile_m = wid.y;
    var tile_n = wid.x;
    if GROUP > 0u {
        let linear = wid.y * nwg.x + wid.x;
        let width = GROUP * nwg.x;
        let first = (linear / width) * GROUP;
        let rows = min(nwg.y - first, GROUP);
        tile_m = first + (linear % width) % rows;
        tile_n = (linear % width) / rows;
    }
    let m0 = (p.tile_base_y + tile_m) * BM;
    let n0 = (p.tile_base_x + tile_n) * BN;
    let lane = l % 32u;
    let warp = l / 32u;
    let tx = lane % 8u + 8u * (warp % (TX / 8u));
    let ty = lane / 8u + 4u * (warp / (TX / 8u));

GEN_DECL
    let ntiles = (p.k + BK - 1u) / BK;
GEN_PROLOGUE
GEN_MAINLOOP
    let cbase = bidx * p.m * p.n;
GEN_OUTPUT
}
