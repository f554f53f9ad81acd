// Binary elementwise op with broadcasting. Placeholders filled in by binary.rs:
// T (the compute type of the inputs), TOUT (of the result), LOAD_A / LOAD_B (element loads),
// OFFSETS (the element offsets of output element e in a and b), OP (the operation on x and
// y), RT (rounding of an intermediate float result to the dtype), EXTRA (helper functions),
// STORE (one output word). Each invocation writes one 32-bit output word (two elements for
// f16, four for bool), or for 32-bit dtypes four words p.stride apart, all loads first.
struct Params {
    row: u32,
    n: u32,
    rank: u32,
    words: u32,
    // The bits of 1.0f, for `opaque`.
    one: u32,
    // The bits of a float attribute (LeakyReluGrad's alpha).
    alpha: u32,
    // Invocations of the dispatch, for the variant writing 4 words per invocation (word w,
    // w + stride, w + 2 stride, w + 3 stride); else unused.
    stride: u32,
    pad2: u32,
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

// v, in a way the compiler cannot simplify algebraically (p.one is 1.0 at run time).
fn opaque(v: f32) -> f32 {
    return v * bitcast<f32>(p.one);
}

fn rt(v: f32) -> f32 {
    return $RT;
}

fn alpha() -> f32 {
    return rt(bitcast<f32>(p.alpha));
}

$EXTRA

fn offsets(e: u32) -> vec2<u32> {
$OFFSETS
}

fn load_a(i: u32) -> $T {
    return $LOAD_A;
}

fn load_b(i: u32) -> $T {
    return $LOAD_B;
}

fn op(x: $T, y: $T) -> $TOUT {
$OP
}

fn elem(e: u32) -> $TOUT {
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
