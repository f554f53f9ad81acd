// ClipByValue: out = max(min(t, hi), lo) with std::min / std::max (NaN in t propagates; a NaN
// bound leaves t unchanged). lo and hi are scalars (stride 0) or shaped like t (stride 1).
// Placeholders filled in by clip.rs: T (the compute type), LOAD_T / LOAD_LO / LOAD_HI
// (element loads), LESS (x < y on T), EXTRA (helpers), STORE (one output word).
struct Params {
    row: u32,
    n: u32,
    words: u32,
    pad: u32,
    // Element strides of lo and hi: 0 (scalar) or 1.
    slo: u32,
    shi: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> t: array<u32>;
@group(0) @binding(2) var<storage, read_write> lo: array<u32>;
@group(0) @binding(3) var<storage, read_write> hi: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

$LINEAR_INDEX
$COMMON
$EXTRA

fn load_t(i: u32) -> $T {
    return $LOAD_T;
}

fn load_lo(i: u32) -> $T {
    return $LOAD_LO;
}

fn load_hi(i: u32) -> $T {
    return $LOAD_HI;
}

fn less(x: $T, y: $T) -> bool {
$LESS
}

fn elem(e: u32) -> $T {
    let v = load_t(e);
    let h = load_hi(e * p.shi);
    let l = load_lo(e * p.slo);
    // std::min(v, h), then std::max(., l).
    let m = select(v, h, less(h, v));
    return select(m, l, less(m, l));
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
