// Unary elementwise op. Placeholders filled in by unary.rs: T (the compute type), LOAD
// (element load from `x`), OP (the operation on v), STORE (one output word).
// Each invocation writes one 32-bit output word (two elements for f16).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON
$MATH

fn load(i: u32) -> $T {
    return $LOAD;
}

fn op(v: $T) -> $T {
$OP
}

fn elem(e: u32) -> $T {
    return op(load(e));
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
