// Tiled (batched) matrix product C[b] = A[b] x B[b], with A[b] an M x K and B[b] a K x N
// matrix read through strides (so transposed operands need no copy), C contiguous
// [batch, M, N].
//
// A workgroup computes a BM x BN tile of C; its (BM / TM) x (BN / TN) invocations each hold a
// TM x TN block of accumulators, at rows ty + i * (BM / TM) and columns tx + j * (BN / TN), so
// shared-memory reads are conflict-free and the stores of C coalesced. The K dimension is
// walked in steps of BK through shared-memory tiles of A and B; loads outside the matrices
// read zero, so every M, N, K works.
//
// Batches: the output batch index (wid.z + batch_base) gives the offsets of A and B through
// batch_offsets() (matmul_common.wgsl, prepended by the host with the Params struct).
//
// The host substitutes the element type, the body of mad() and the tile constants (the
// upper-case placeholders below).

@group(0) @binding(1) var<storage, read_write> a: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> b: array<ELEM>;
@group(0) @binding(3) var<storage, read_write> c: array<ELEM>;

const BM: u32 = TILE_BMu;
const BN: u32 = TILE_BNu;
const BK: u32 = TILE_BKu;
const TM: u32 = TILE_TMu;
const TN: u32 = TILE_TNu;
const TX: u32 = BN / TN;
const TY: u32 = BM / TM;
const NT: u32 = TX * TY;

var<workgroup> As: array<ELEM, BK * BM>;
var<workgroup> Bs: array<ELEM, BK * BN>;

fn mad(x: ELEM, y: ELEM, acc: ELEM) -> ELEM {
    MAD_BODY
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let bidx = p.batch_base + wid.z;
    let offs = batch_offsets(bidx);
    let aoff = offs.x;
    let boff = offs.y;
    let m0 = (p.tile_base_y + wid.y) * BM;
    let n0 = (p.tile_base_x + wid.x) * BN;
    let tx = l % TX;
    let ty = l / TX;

    var acc: array<ELEM, TM * TN>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var s = 0u; s < (BM * BK) / NT; s += 1u) {
            let e = l + s * NT;
            var mm: u32;
            var kk: u32;
            if p.a_kfast == 1u {
                kk = e % BK;
                mm = e / BK;
            } else {
                mm = e % BM;
                kk = e / BM;
            }
            let gm = m0 + mm;
            let gk = k0 + kk;
            var v: ELEM;
            if gm < p.m && gk < p.k {
                v = a[aoff + gm * p.sa_m + gk * p.sa_k];
            }
            As[kk * BM + mm] = v;
        }
        for (var s = 0u; s < (BN * BK) / NT; s += 1u) {
            let e = l + s * NT;
            var nn: u32;
            var kk: u32;
            if p.b_nfast == 1u {
                nn = e % BN;
                kk = e / BN;
            } else {
                kk = e % BK;
                nn = e / BK;
            }
            let gn = n0 + nn;
            let gk = k0 + kk;
            var v: ELEM;
            if gn < p.n && gk < p.k {
                v = b[boff + gk * p.sb_k + gn * p.sb_n];
            }
            Bs[kk * BN + nn] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 1u) {
            var av: array<ELEM, TM>;
            var bv: array<ELEM, TN>;
            for (var i = 0u; i < TM; i += 1u) {
                av[i] = As[kk * BM + ty + i * TY];
            }
            for (var j = 0u; j < TN; j += 1u) {
                bv[j] = Bs[kk * BN + tx + j * TX];
            }
            for (var i = 0u; i < TM; i += 1u) {
                for (var j = 0u; j < TN; j += 1u) {
                    acc[i * TN + j] = mad(av[i], bv[j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }

    let cbase = bidx * p.m * p.n;
    for (var i = 0u; i < TM; i += 1u) {
        let gm = m0 + ty + i * TY;
        for (var j = 0u; j < TN; j += 1u) {
            let gn = n0 + tx + j * TX;
            if gm < p.m && gn < p.n {
                c[cbase + gm * p.n + gn] = acc[i * TN + j];
            }
        }
    }
}
