// The backward step's entry with the product from a MatMul (dhr = dgr_{t+1} R): one invocation
// per (b, j) over a 1-D grid.
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.n {
        return;
    }
    let b = i / p.h;
    cell(i, b, i - b * p.h, dhr[i]);
}
