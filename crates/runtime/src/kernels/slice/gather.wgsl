// GatherV2 over the flattened view params[batch, outer, N, inner], indices[batch, k]:
// out[b, o, j, i] = params[b, o, indices[b, j], i], zero when the index is outside [0, N)
// (TensorFlow's GPU kernel). `index_ind`, `load_x` and the word packing come from mod.rs.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    pad0: u32,
    outer: u32,
    k: u32,
    inner: u32,
    gather_n: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<u32>;
@group(0) @binding(3) var<storage, read_write> ind: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let i = e % p.inner;
    let r = e / p.inner;
    let j = r % p.k;
    let r2 = r / p.k;
    let o = r2 % p.outer;
    let b = r2 / p.outer;
    let idx = index_ind(b * p.k + j);
    if idx.y != 0u || idx.x >= p.gather_n {
        return vec2<u32>(0u, 0u);
    }
    return load_x(((b * p.outer + o) * p.gather_n + idx.x) * p.inner + i);
}
