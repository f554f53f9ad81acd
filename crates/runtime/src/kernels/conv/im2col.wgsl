// Columns of the input windows (conv/gemm.rs `im2col_gemm`): col[(n, oy, ox), j] for
// j = (r, s, c) < p.rsc is x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c] (zero in the
// padding), and zero for p.rsc <= j < p.nc (the row padded to a multiple of 4). NHWC, one
// group; one invocation per 4 column elements. The columns of one group of images: pixel
// indices start at p.pix_base (col row 0 is pixel p.pix_base).

struct Params {
    row: u32,
    total: u32,
    h: u32,
    w: u32,
    c: u32,
    fs: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    rsc: u32,
    nc: u32,
    pix_base: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> col: array<vec4<f32>>;

$LINEAR_INDEX

fn tap(nb: u32, oy: u32, ox: u32, j: u32) -> f32 {
    if j >= p.rsc {
        return 0.0;
    }
    let ch = j % p.c;
    let rs = j / p.c;
    let s = rs % p.fs;
    let r = rs / p.fs;
    let iy = i32(oy * p.sh + r * p.dh) - i32(p.pt);
    let ix = i32(ox * p.sw + s * p.dw) - i32(p.pl);
    if iy < 0 || ix < 0 || u32(iy) >= p.h || u32(ix) >= p.w {
        return 0.0;
    }
    return x[((nb * p.h + u32(iy)) * p.w + u32(ix)) * p.c + ch];
}

// One invocation per 4 consecutive column elements of a row (p.nc is a multiple of 4; p.total
// counts vectors): the pixel is decomposed once for the four, one 16-byte store.
@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.total {
        return;
    }
    let nv = p.nc / 4u;
    let j = (i % nv) * 4u;
    let pix = p.pix_base + i / nv;
    let ox = pix % p.ow;
    let t = pix / p.ow;
    let oy = t % p.oh;
    let nb = t / p.oh;
    col[i] = vec4<f32>(tap(nb, oy, ox, j), tap(nb, oy, ox, j + 1u), tap(nb, oy, ox, j + 2u), tap(nb, oy, ox, j + 3u));
}
