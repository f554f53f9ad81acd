// The second pass of a K-split product (`Plan::KSplit`): the tiled kernel wrote S partial
// products, each over K / S of the terms, as S consecutive slices of LEN4 vectors in `t`;
// this adds them in slice order into C. The grid is 2-D (rows of 65535 workgroups at most);
// one invocation per 16-byte vector of C.

struct KsumParams {
    len4: u32,
    splits: u32,
    row_groups: u32,
    _pad: u32,
};
@group(0) @binding(0) var<uniform> q: KsumParams;
@group(0) @binding(1) var<storage, read_write> t: array<vec4<ELEM>>;
@group(0) @binding(2) var<storage, read_write> c: array<vec4<ELEM>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = (wid.y * q.row_groups + wid.x) * 256u + l;
    if i >= q.len4 {
        return;
    }
    var s = t[i];
    for (var j = 1u; j < q.splits; j += 1u) {
        s += t[j * q.len4 + i];
    }
    c[i] = s;
}
