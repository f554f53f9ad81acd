// UnsortedSegmentSum over the flattened view data[rows, inner], segment_ids[rows]:
// out[ids[r], i] += data[r, i], by an atomic compare-and-swap of the float's bits (WGSL has no
// float atomics); the output is zeroed before. Rows whose id is negative or >= the segment
// count are dropped (TensorFlow's GPU kernel). The order of the additions is the GPU's, as in
// TensorFlow's GPU kernel (its CPU kernel adds rows in order). `index_ids` comes from mod.rs.
struct Params {
    row: u32,
    n: u32,
    inner: u32,
    segments: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> data: array<u32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;

ATOMIC_ADD_OUT

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    let seg = index_ids(e / p.inner);
    if seg.y != 0u || seg.x >= p.segments {
        return;
    }
    atomic_add_out(seg.x * p.inner + e % p.inner, bitcast<f32>(data[e]));
}
