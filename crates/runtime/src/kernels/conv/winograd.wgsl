// Winograd F(3x3, 2x2) filter gradient of a 3x3 stride-1 float32 NHWC convolution
// (conv/winograd.rs). The output positions are cut into 2x2 tiles t = (n, ty, tx); each tile
// contributes the correlation of its 4x4 input window X (rows 2ty - pt + u, columns
// 2tx - pl + v, zero outside the image) with its 2x2 block D of dy (zero past OH, OW):
//     df[r, s] = sum_t AT [ (G D G^T) . (BT X B) ] A      (. elementwise, 16 products)
// with BT = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 -1 0 1], G = [1 0; .5 .5; .5 -.5; 0 1],
// AT = [1 1 1 0; 0 1 -1 0; 0 1 1 1]. The sum over tiles is taken in the transformed domain:
// 16 products U[e] = Xh[e]^T Dh[e] over the tiles (matmul vector kernels), then AT U A.
// MODE 0 writes Xh[e][t][c] (one invocation per tile and 4 channels), MODE 1 Dh[e][t][k],
// MODE 2 sums the parts of U and applies AT . A (one invocation per (c, 4 output channels)).
// Images are processed in groups: tiles are numbered within the group, images from p.img0.

struct Params {
    total: u32,
    row: u32,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    th: u32,
    tw: u32,
    cv: u32,
    pt: u32,
    pl: u32,
    img0: u32,
    parts: u32,
    part_stride: u32,
    _pad0: u32,
    _pad1: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

$LINEAR_INDEX

const MODE: u32 = $MODE_IDu;

// BT's last row is [0 -1 0 1] here.
fn last(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    return a - b;
}

$INPUT_TRANSFORM
fn dy_at(base: u32, oy: u32, ox: u32, k: u32) -> vec4<f32> {
    if oy >= p.oh || ox >= p.ow {
        return vec4<f32>();
    }
    return src[(base + oy * p.ow + ox) * p.cv + k];
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.total {
        return;
    }
    let cv = i % p.cv;
    let t = i / p.cv;
    // Elements of one transformed matrix e: tiles x vectors.
    let plane = p.total;
    if MODE == 0u {
        input_transform(t, cv, i, plane);
        return;
    }
    if MODE == 1u {
        let tx = t % p.tw;
        let t2 = t / p.tw;
        let ty = t2 % p.th;
        let nb = p.img0 + t2 / p.th;
        let base = nb * p.oh * p.ow;
        let d00 = dy_at(base, 2u * ty, 2u * tx, cv);
        let d01 = dy_at(base, 2u * ty, 2u * tx + 1u, cv);
        let d10 = dy_at(base, 2u * ty + 1u, 2u * tx, cv);
        let d11 = dy_at(base, 2u * ty + 1u, 2u * tx + 1u, cv);
        // Rows: G D (4 x 2), then columns: (G D) G^T (unrolled).
        let e00 = d00;
        let e01 = d01;
        let e10 = (d00 + d10) * 0.5;
        let e11 = (d01 + d11) * 0.5;
        let e20 = (d00 - d10) * 0.5;
        let e21 = (d01 - d11) * 0.5;
        let e30 = d10;
        let e31 = d11;
        dst[0u * plane + i] = e00;
        dst[1u * plane + i] = (e00 + e01) * 0.5;
        dst[2u * plane + i] = (e00 - e01) * 0.5;
        dst[3u * plane + i] = e01;
        dst[4u * plane + i] = e10;
        dst[5u * plane + i] = (e10 + e11) * 0.5;
        dst[6u * plane + i] = (e10 - e11) * 0.5;
        dst[7u * plane + i] = e11;
        dst[8u * plane + i] = e20;
        dst[9u * plane + i] = (e20 + e21) * 0.5;
        dst[10u * plane + i] = (e20 - e21) * 0.5;
        dst[11u * plane + i] = e21;
        dst[12u * plane + i] = e30;
        dst[13u * plane + i] = (e30 + e31) * 0.5;
        dst[14u * plane + i] = (e30 - e31) * 0.5;
        dst[15u * plane + i] = e31;
        return;
    }
    // MODE 2: i = (c, k vector) of the C x K filter slice; parts: p.parts copies of the 16
    // matrices U[e] (C x K each), e-major within a part group (see winograd.rs).
    var m00 = vec4<f32>();
    var m01 = vec4<f32>();
    var m02 = vec4<f32>();
    var m03 = vec4<f32>();
    var m10 = vec4<f32>();
    var m11 = vec4<f32>();
    var m12 = vec4<f32>();
    var m13 = vec4<f32>();
    var m20 = vec4<f32>();
    var m21 = vec4<f32>();
    var m22 = vec4<f32>();
    var m23 = vec4<f32>();
    var m30 = vec4<f32>();
    var m31 = vec4<f32>();
    var m32 = vec4<f32>();
    var m33 = vec4<f32>();
    for (var q = 0u; q < p.parts; q += 1u) {
        let b = q * p.part_stride + i;
        m00 += src[b + 0u * plane];
        m01 += src[b + 1u * plane];
        m02 += src[b + 2u * plane];
        m03 += src[b + 3u * plane];
        m10 += src[b + 4u * plane];
        m11 += src[b + 5u * plane];
        m12 += src[b + 6u * plane];
        m13 += src[b + 7u * plane];
        m20 += src[b + 8u * plane];
        m21 += src[b + 9u * plane];
        m22 += src[b + 10u * plane];
        m23 += src[b + 11u * plane];
        m30 += src[b + 12u * plane];
        m31 += src[b + 13u * plane];
        m32 += src[b + 14u * plane];
        m33 += src[b + 15u * plane];
    }
    // Rows: AT M (3 x 4).
    let a00 = m00 + m10 + m20;
    let a10 = m10 - m20;
    let a20 = m10 + m20 + m30;
    let a01 = m01 + m11 + m21;
    let a11 = m11 - m21;
    let a21 = m11 + m21 + m31;
    let a02 = m02 + m12 + m22;
    let a12 = m12 - m22;
    let a22 = m12 + m22 + m32;
    let a03 = m03 + m13 + m23;
    let a13 = m13 - m23;
    let a23 = m13 + m23 + m33;
    // Columns: (AT M) A, written to df[r, s, c, k].
    dst[0u * plane + i] = a00 + a01 + a02;
    dst[1u * plane + i] = a01 - a02;
    dst[2u * plane + i] = a01 + a02 + a03;
    dst[3u * plane + i] = a10 + a11 + a12;
    dst[4u * plane + i] = a11 - a12;
    dst[5u * plane + i] = a11 + a12 + a13;
    dst[6u * plane + i] = a20 + a21 + a22;
    dst[7u * plane + i] = a21 - a22;
    dst[8u * plane + i] = a21 + a22 + a23;
}
