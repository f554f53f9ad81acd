// MatrixBandPart over the innermost [rows, cols] matrices: element (i, j) is kept where
// (lower < 0 or i - j <= lower) and (upper < 0 or j - i <= upper), zero elsewhere.
// `load_inp` and the packing come from mod.rs.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    rows: u32,
    cols: u32,
    lower: i32,
    upper: i32,
    pad: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> inp: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let j = i32(e % p.cols);
    let i = i32((e / p.cols) % p.rows);
    if (p.lower < 0 || i - j <= p.lower) && (p.upper < 0 || j - i <= p.upper) {
        return load_inp(e);
    }
    return vec2<u32>(0u, 0u);
}
