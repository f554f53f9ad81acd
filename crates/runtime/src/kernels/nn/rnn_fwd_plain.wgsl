// The forward step's entry with the products from a MatMul (hr = h_{t-1} R^T): one invocation
// per (b, j) over a 1-D grid.
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.n {
        return;
    }
    let b = i / p.h;
    let j = i - b * p.h;
    var rec: array<f32, 4>;
    for (var g = 0u; g < NG; g++) {
        rec[g] = hr[b * p.gh + g * p.h + j];
    }
    cell(i, b, j, rec);
}
