// dL/dh_0 = dhr + pass over [B, H] (after rnn.wgsl): the last product with R plus the rest.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> dhr: array<f32>;
@group(0) @binding(3) var<storage, read_write> pass_: array<f32>;

$LINEAR_INDEX

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.n {
        return;
    }
    var v = pass_[i];
    if p.flag != 0u {
        v = v + dhr[i];
    }
    out[i] = v;
}
