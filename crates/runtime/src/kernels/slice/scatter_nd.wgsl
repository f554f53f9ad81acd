// ScatterNd over the flattened views updates[rows, inner] and indices[rows, k]: out[flat] +=
// updates[r, i] where flat = sum_j indices[r, j] * strides[j] + i, into a zeroed output, by
// atomics (float32: a compare-and-swap of the float's bits; int32: atomicAdd; int64: two words,
// the carry of the low one's atomicAdd added to the high one). A row with an
// index outside its dimension is dropped (TensorFlow's GPU kernel; its CPU kernel reports it).
// The order of the float additions is the GPU's. `index_idx` comes from mod.rs.
struct Params {
    row: u32,
    n: u32,
    inner: u32,
    k: u32,
    // The first k dimensions of the output shape, and their strides in elements.
    dims: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> upd: array<u32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;

ATOMIC_ADD_OUT

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    let r = e / p.inner;
    var flat = e - r * p.inner;
    for (var j = 0u; j < p.k; j++) {
        let v = index_idx(r * p.k + j);
        let d = p.dims[j / 4u][j % 4u];
        if v.y != 0u || v.x >= d {
            return;
        }
        flat += v.x * p.strides[j / 4u][j % 4u];
    }
    ADD_STATEMENT
}
