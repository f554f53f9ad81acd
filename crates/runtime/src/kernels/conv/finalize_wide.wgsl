// Sums `splits` f32 partial results (split s at s * len) into a float32 output with the
// splits spread over p.lanes invocations per output (conv/gemm.rs `finalize`): with few
// outputs and many splits (filter gradients: a few thousand outputs, 64-528 splits) one
// invocation per output walked its splits serially, latency-bound (0.13 ms for the 1152
// outputs x 528 splits of a depthwise filter gradient). A workgroup of 256 covers
// 256 / p.lanes consecutive outputs (neighbouring invocations read neighbouring addresses);
// lane j sums splits j, j + lanes, ...; the lanes are then added by a tree in workgroup
// memory (a fixed order).

struct Params {
    len: u32,
    splits: u32,
    lanes: u32,
    per_wg: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) l: u32,
) {
    let o = l % p.per_wg;
    let lane = l / p.per_wg;
    let e = (wid.y * nwg.x + wid.x) * p.per_wg + o;
    var s = 0.0;
    if e < p.len {
        for (var i = lane; i < p.splits; i += p.lanes) {
            s += part[i * p.len + e];
        }
    }
    red[l] = s;
    workgroupBarrier();
    for (var st = p.lanes / 2u; st > 0u; st = st / 2u) {
        if lane < st {
            red[l] = red[l] + red[l + st * p.per_wg];
        }
        workgroupBarrier();
    }
    if lane == 0u && e < p.len {
        out[e] = red[l];
    }
}
