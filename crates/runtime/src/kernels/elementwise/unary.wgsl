// Unary elementwise op. Placeholders filled in by unary.rs: T (the compute type), TOUT (the
// result's), LOAD (element load from `x`), OP (the operation on v), RT (rounding of an
// intermediate float result to the dtype), STORE (one output word).
// Each invocation writes one 32-bit output word (two elements for f16).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    // The bits of a float attribute (LeakyRelu's alpha).
    alpha: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON
$MATH

fn rt(v: f32) -> f32 {
    return $RT;
}

fn alpha() -> f32 {
    return rt(bitcast<f32>(p.alpha));
}

fn load(i: u32) -> $T {
    return $LOAD;
}

fn op(v: $T) -> $TOUT {
$OP
}

fn elem(e: u32) -> $TOUT {
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
