// Binary elementwise op with broadcasting. Placeholders filled in by binary.rs:
// T (the compute type), LOAD_A / LOAD_B (element loads), OFFSETS (the element offsets of
// output element e in a and b), OP (the operation on x and y), STORE (one output word).
// Each invocation writes one 32-bit output word (two elements for f16).
struct Params {
    row: u32,
    n: u32,
    rank: u32,
    words: u32,
    // Collapsed output shape and the element strides of a and b (0 on broadcast dims).
    shape: array<vec4<u32>, 2>,
    sa: array<vec4<u32>, 2>,
    sb: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<u32>;
@group(0) @binding(2) var<storage, read_write> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON

fn offsets(e: u32) -> vec2<u32> {
$OFFSETS
}

fn load_a(i: u32) -> $T {
    return $LOAD_A;
}

fn load_b(i: u32) -> $T {
    return $LOAD_B;
}

fn op(x: $T, y: $T) -> $T {
$OP
}

fn elem(e: u32) -> $T {
    let o = offsets(e);
    return op(load_a(o.x), load_b(o.y));
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
