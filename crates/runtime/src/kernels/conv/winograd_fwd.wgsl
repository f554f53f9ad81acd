// Winograd F(2x2, 3x3) for a 3x3 stride-1 float32 NHWC correlation (conv/winograd.rs
// `record_forward`): the forward pass (x with the filter), and the input gradient (dy with the
// filter flipped and transposed). The outputs are cut into 2x2 tiles t = (n, ty, tx); a tile
// is AT [ (G g G^T) . (BT X B) ] A over its 4x4 input window X (rows 2ty - pt + u, columns
// 2tx - pl + v, zero outside the input), summed over the input channels in the transformed
// domain: 16 products M[e] = V[e] U[e] (tiles x Cin times Cin x Cout, matmul vector kernels).
// BT = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
// AT = [1 1 1 0; 0 1 -1 -1].
// MODE 0: V[e][t][ci] from the input (one invocation per tile and 4 channels).
// MODE 1: U[e][ci][co] from the filter f[r, s, a, b] (one invocation per (ci, 4 co)): the
//         forward pass reads g[r][s] = f[r, s, ci, co]; the input gradient (p.flip = 1)
//         g[r][s] = f[2 - r, 2 - s, co, ci] (its input channels are the filter's outputs).
// MODE 2: the output tiles from M[e][t][co] (one invocation per tile and 4 channels).
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
    cin: u32,
    cout: u32,
    flip: u32,
    _pad0: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

$LINEAR_INDEX

const MODE: u32 = $MODE_IDu;

// BT's last row is [0 1 0 -1] here.
fn last(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    return b - a;
}

$INPUT_TRANSFORM
// Filter element f[r, s, a, b] of the [3, 3, A, B] filter (A, B its own input and output
// depths: p.cin, p.cout for the forward pass, p.cout, p.cin for the input gradient).
fn f_at(r: u32, s: u32, a: u32, b: u32, fa: u32, fb: u32) -> f32 {
    let i = ((r * 3u + s) * fa + a) * fb + b;
    return src[i / 4u][i % 4u];
}

fn g_at(r: u32, s: u32, ci: u32, co: u32) -> vec4<f32> {
    if p.flip == 0u {
        return src[((r * 3u + s) * p.cin + ci) * (p.cout / 4u) + co / 4u];
    }
    let rr = 2u - r;
    let ss = 2u - s;
    return vec4<f32>(
        f_at(rr, ss, co, ci, p.cout, p.cin),
        f_at(rr, ss, co + 1u, ci, p.cout, p.cin),
        f_at(rr, ss, co + 2u, ci, p.cout, p.cin),
        f_at(rr, ss, co + 3u, ci, p.cout, p.cin),
    );
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.total {
        return;
    }
    let plane = p.total;
    if MODE == 0u {
        let cv = i % p.cv;
        let t = i / p.cv;
        input_transform(t, cv, i, plane);
        return;
    }
    if MODE == 1u {
        // i = (ci, co vector) of the Cin x Cout slice.
        let cov = p.cout / 4u;
        let co = (i % cov) * 4u;
        let ci = i / cov;
        var g: array<array<vec4<f32>, 3>, 3>;
        for (var r = 0u; r < 3u; r += 1u) {
            for (var s = 0u; s < 3u; s += 1u) {
                g[r][s] = g_at(r, s, ci, co);
            }
        }
        // Rows: G g (4 x 3).
        var e: array<array<vec4<f32>, 3>, 4>;
        for (var s = 0u; s < 3u; s += 1u) {
            e[0][s] = g[0][s];
            e[1][s] = (g[0][s] + g[1][s] + g[2][s]) * 0.5;
            e[2][s] = (g[0][s] - g[1][s] + g[2][s]) * 0.5;
            e[3][s] = g[2][s];
        }
        // Columns: (G g) G^T.
        for (var r = 0u; r < 4u; r += 1u) {
            let o = r * 4u * plane + i;
            dst[o] = e[r][0];
            dst[o + plane] = (e[r][0] + e[r][1] + e[r][2]) * 0.5;
            dst[o + 2u * plane] = (e[r][0] - e[r][1] + e[r][2]) * 0.5;
            dst[o + 3u * plane] = e[r][2];
        }
        return;
    }
    // MODE 2: i = (tile, co vector); M[e][t][co] at e * plane + i.
    let cv = i % p.cv;
    let t = i / p.cv;
    let m00 = src[0u * plane + i];
    let m01 = src[1u * plane + i];
    let m02 = src[2u * plane + i];
    let m03 = src[3u * plane + i];
    let m10 = src[4u * plane + i];
    let m11 = src[5u * plane + i];
    let m12 = src[6u * plane + i];
    let m13 = src[7u * plane + i];
    let m20 = src[8u * plane + i];
    let m21 = src[9u * plane + i];
    let m22 = src[10u * plane + i];
    let m23 = src[11u * plane + i];
    let m30 = src[12u * plane + i];
    let m31 = src[13u * plane + i];
    let m32 = src[14u * plane + i];
    let m33 = src[15u * plane + i];
    // Rows: AT M (2 x 4).
    let a00 = m00 + m10 + m20;
    let a10 = m10 - m20 - m30;
    let a01 = m01 + m11 + m21;
    let a11 = m11 - m21 - m31;
    let a02 = m02 + m12 + m22;
    let a12 = m12 - m22 - m32;
    let a03 = m03 + m13 + m23;
    let a13 = m13 - m23 - m33;
    let tx = t % p.tw;
    let t2 = t / p.tw;
    let ty = t2 % p.th;
    let nb = p.img0 + t2 / p.th;
    let ox = 2u * tx;
    let oy = 2u * ty;
    if oy < p.oh {
        let row = (nb * p.oh + oy) * p.ow;
        dst[(row + ox) * p.cv + cv] = a00 + a01 + a02;
        if ox + 1u < p.ow {
            dst[(row + ox + 1u) * p.cv + cv] = a01 - a02 - a03;
        }
    }
    if oy + 1u < p.oh {
        let row = (nb * p.oh + oy + 1u) * p.ow;
        dst[(row + ox) * p.cv + cv] = a10 + a11 + a12;
        if ox + 1u < p.ow {
            dst[(row + ox + 1u) * p.cv + cv] = a11 - a12 - a13;
        }
    }
}
