// OneHot over the view out[prefix, depth, suffix] of indices[prefix, suffix]:
// on_value where indices[prefix, suffix] == d, off_value elsewhere (indices outside
// [0, depth) match nothing). `index_ind`, `load_on`, `load_off` and the packing come from mod.rs.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    depth: u32,
    suffix: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> ind: array<u32>;
@group(0) @binding(3) var<storage, read_write> on: array<u32>;
@group(0) @binding(4) var<storage, read_write> off: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let s = e % p.suffix;
    let r = e / p.suffix;
    let d = r % p.depth;
    let pre = r / p.depth;
    let idx = index_ind(pre * p.suffix + s);
    if idx.y == 0u && idx.x == d {
        return load_on(0u);
    }
    return load_off(0u);
}
