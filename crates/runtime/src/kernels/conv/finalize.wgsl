// Sums `splits` f32 partial results (split s at s * len) and stores them in the output's
// dtype: one invocation per output word (f32: one element; f16: two, packed, rounded once
// to nearest even).

struct Params {
    row: u32,
    words: u32,
    len: u32,
    splits: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON

fn total(e: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < p.splits; i += 1u) {
        s += part[i * p.len + e];
    }
    return s;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
