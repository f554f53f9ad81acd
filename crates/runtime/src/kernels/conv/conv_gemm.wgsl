// Convolutions as implicit matrix products, register-tiled (see gemm.rs).
//
// A workgroup computes a BM x BN tile of C = A x B for one group (and one split of the K
// range, for split-K) with NT = (BM / TM) * (BN / TN) invocations; an invocation holds TM x TN
// accumulators, rows ty + i * TY and columns tx + j * TX of the tile. A and B are never
// materialized: each invocation loads the same LA elements of every A tile and LB of every B
// tile, so the M-dependent part of an A address (the window origin of an output pixel, or the
// filter tap of a weight) is decomposed once, before the K loop; per K step only the K index is
// decomposed. K is walked in tiles of BK through one shared-memory buffer, with the next
// tile's global loads in registers while the current one is multiplied out.
//
// MODE (compile time):
//   0 forward:         C[m = (n, oy, ox), j = k]  = sum_{(r, s, c)} x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c] f[r, s, c, k]
//   1 input gradient:  C[m = (n, y, x), j = c]    = sum_{(r, s, k)} dy[n, (y + pt - r*dh) / sh, (x + pl - s*dw) / sw, k] f[r, s, c, k]
//                      (taps where the division is inexact or out of range are zero)
//   2 filter gradient: C[m = (r, s, c), j = k]    = sum_{(n, oy, ox)} x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c] dy[n, oy, ox, k]
//   3 plain product (1x1, stride 1, NHWC): C[m, j] = sum_k a[m*sam + k*sak] b[k*sbk + j*sbn]
// Channels are those of group g (c in [g*cg, (g+1)*cg), k in [g*kg, (g+1)*kg)). x and the
// output-side tensor (y or dy) are addressed through strides, so NHWC and NCHW share the code;
// the filter is HWIO, contiguous. A_MFAST / B_NFAST pick which tile dimension neighbouring
// invocations load (the one contiguous in memory). Accumulation is f32 with fma; results go to
// `out` at their final offsets, plus split * out_len (split-K partial sums, summed by
// finalize.wgsl).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    k_chunk: u32,
    ih: u32,
    iw: u32,
    cg: u32,
    kg: u32,
    oh: u32,
    ow: u32,
    oc: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    xn: u32,
    xh: u32,
    xw: u32,
    xc: u32,
    yn: u32,
    yh: u32,
    yw: u32,
    yc: u32,
    splits: u32,
    out_len: u32,
    tile_base_y: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src_a: array<$STORE>;
@group(0) @binding(2) var<storage, read_write> src_b: array<$STORE>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const MODE: u32 = $MODE_IDu;
const A_MFAST: bool = $A_MFAST_FLAG;
const B_NFAST: bool = $B_NFAST_FLAG;
const BM: u32 = $TILE_BMu;
const BN: u32 = $TILE_BNu;
const BK: u32 = $TILE_BKu;
const TM: u32 = $TILE_TMu;
const TN: u32 = $TILE_TNu;
const TX: u32 = BN / TN;
const TY: u32 = BM / TM;
const NT: u32 = TX * TY;
const LA: u32 = BM * BK / NT;
const LB: u32 = BN * BK / NT;

var<workgroup> As: array<f32, BK * BM>;
var<workgroup> Bs: array<f32, BK * BN>;

$COMMON

fn lda(i: u32) -> f32 {
    return $LOAD_A;
}

fn ldb(i: u32) -> f32 {
    return $LOAD_B;
}

// The M-dependent part of an A address: a base offset and a window origin.
struct Row {
    base: u32,
    y: i32,
    x: i32,
    ok: bool,
};

fn a_row(m: u32, g: u32) -> Row {
    var r: Row;
    r.ok = m < p.m;
    let mm = select(0u, m, r.ok);
    if MODE == 0u {
        let ox = mm % p.ow;
        let t = mm / p.ow;
        let oy = t % p.oh;
        let nb = t / p.oh;
        r.base = nb * p.xn + g * p.cg * p.xc;
        r.y = i32(oy * p.sh) - i32(p.pt);
        r.x = i32(ox * p.sw) - i32(p.pl);
    } else if MODE == 1u {
        let ix = mm % p.iw;
        let t = mm / p.iw;
        let iy = t % p.ih;
        let nb = t / p.ih;
        r.base = nb * p.yn + g * p.kg * p.yc;
        r.y = i32(iy + p.pt);
        r.x = i32(ix + p.pl);
    } else if MODE == 2u {
        let c = mm % p.cg;
        let rs = mm / p.cg;
        let s = rs % p.fs;
        let fr = rs / p.fs;
        r.base = (g * p.cg + c) * p.xc;
        r.y = i32(fr * p.dh) - i32(p.pt);
        r.x = i32(s * p.dw) - i32(p.pl);
    } else {
        r.base = mm * p.xn;
    }
    return r;
}

// A[m, k] for the row `r`; zero outside the matrix, the K range [.., kend) and the padding.
fn a_val(r: Row, k: u32, kend: u32) -> f32 {
    if !r.ok || k >= kend {
        return 0.0;
    }
    if MODE == 0u {
        let c = k % p.cg;
        let rs = k / p.cg;
        let s = rs % p.fs;
        let fr = rs / p.fs;
        let iy = r.y + i32(fr * p.dh);
        let ix = r.x + i32(s * p.dw);
        if iy < 0 || ix < 0 || u32(iy) >= p.ih || u32(ix) >= p.iw {
            return 0.0;
        }
        return lda(r.base + u32(iy) * p.xh + u32(ix) * p.xw + c * p.xc);
    } else if MODE == 1u {
        let kc = k % p.kg;
        let rs = k / p.kg;
        let s = rs % p.fs;
        let fr = rs / p.fs;
        let ty = r.y - i32(fr * p.dh);
        let tx = r.x - i32(s * p.dw);
        if ty < 0 || tx < 0 {
            return 0.0;
        }
        let oy = u32(ty) / p.sh;
        let ox = u32(tx) / p.sw;
        if oy * p.sh != u32(ty) || ox * p.sw != u32(tx) || oy >= p.oh || ox >= p.ow {
            return 0.0;
        }
        return lda(r.base + oy * p.yh + ox * p.yw + kc * p.yc);
    } else if MODE == 2u {
        let ox = k % p.ow;
        let t = k / p.ow;
        let oy = t % p.oh;
        let nb = t / p.oh;
        let iy = r.y + i32(oy * p.sh);
        let ix = r.x + i32(ox * p.sw);
        if iy < 0 || ix < 0 || u32(iy) >= p.ih || u32(ix) >= p.iw {
            return 0.0;
        }
        return lda(r.base + nb * p.xn + u32(iy) * p.xh + u32(ix) * p.xw);
    }
    return lda(r.base + k * p.xh);
}

// The column-dependent part of a B address.
fn b_col(j: u32, g: u32) -> u32 {
    if MODE == 0u {
        return g * p.kg + j;
    } else if MODE == 1u {
        return j * p.oc + g * p.kg;
    } else if MODE == 2u {
        return (g * p.kg + j) * p.yc;
    }
    return j * p.xc;
}

// B[k, j] for the column base `col` (`ok`: j inside the matrix).
fn b_val(col: u32, ok: bool, k: u32, kend: u32) -> f32 {
    if !ok || k >= kend {
        return 0.0;
    }
    if MODE == 0u {
        return ldb(k * p.oc + col);
    } else if MODE == 1u {
        let kc = k % p.kg;
        let rs = k / p.kg;
        return ldb(rs * p.cg * p.oc + col + kc);
    } else if MODE == 2u {
        let ox = k % p.ow;
        let t = k / p.ow;
        let oy = t % p.oh;
        let nb = t / p.oh;
        return ldb(nb * p.yn + oy * p.yh + ox * p.yw + col);
    }
    return ldb(k * p.xw + col);
}

// Offset of output row m (the row part), then of (row, column j).
fn c_row(m: u32) -> u32 {
    if MODE == 0u {
        let ox = m % p.ow;
        let t = m / p.ow;
        return (t / p.oh) * p.yn + (t % p.oh) * p.yh + ox * p.yw;
    } else if MODE == 1u {
        let ix = m % p.iw;
        let t = m / p.iw;
        return (t / p.ih) * p.xn + (t % p.ih) * p.xh + ix * p.xw;
    } else if MODE == 2u {
        return m * p.oc;
    }
    return m * p.yn;
}

fn c_off(row: u32, j: u32, g: u32) -> u32 {
    if MODE == 0u {
        return row + (g * p.kg + j) * p.yc;
    } else if MODE == 1u {
        return row + (g * p.cg + j) * p.xc;
    } else if MODE == 2u {
        return row + g * p.kg + j;
    }
    return row + j * p.yh;
}

@compute @workgroup_size(NT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let g = wid.z / p.splits;
    let split = wid.z % p.splits;
    let m0 = (p.tile_base_y + wid.y) * BM;
    let n0 = wid.x * BN;
    let kbeg = split * p.k_chunk;
    let kend = min(p.k, kbeg + p.k_chunk);

    // The tile elements this invocation loads: (m, k) of A, (k, n) of B.
    var a_rows: array<Row, LA>;
    var a_k: array<u32, LA>;
    var a_m: array<u32, LA>;
    for (var i = 0u; i < LA; i += 1u) {
        let e = l + i * NT;
        if A_MFAST {
            a_m[i] = e % BM;
            a_k[i] = e / BM;
        } else {
            a_k[i] = e % BK;
            a_m[i] = e / BK;
        }
        a_rows[i] = a_row(m0 + a_m[i], g);
    }
    var b_cols: array<u32, LB>;
    var b_ok: array<bool, LB>;
    var b_k: array<u32, LB>;
    var b_n: array<u32, LB>;
    for (var i = 0u; i < LB; i += 1u) {
        let e = l + i * NT;
        if B_NFAST {
            b_n[i] = e % BN;
            b_k[i] = e / BN;
        } else {
            b_k[i] = e % BK;
            b_n[i] = e / BK;
        }
        b_ok[i] = n0 + b_n[i] < p.n;
        b_cols[i] = b_col(select(0u, n0 + b_n[i], b_ok[i]), g);
    }

    var ra: array<f32, LA>;
    var rb: array<f32, LB>;
    for (var i = 0u; i < LA; i += 1u) {
        ra[i] = a_val(a_rows[i], kbeg + a_k[i], kend);
    }
    for (var i = 0u; i < LB; i += 1u) {
        rb[i] = b_val(b_cols[i], b_ok[i], kbeg + b_k[i], kend);
    }

    let tx = l % TX;
    let ty = l / TX;
    var acc: array<f32, TM * TN>;
    for (var k0 = kbeg; k0 < kend; k0 += BK) {
        for (var i = 0u; i < LA; i += 1u) {
            As[a_k[i] * BM + a_m[i]] = ra[i];
        }
        for (var i = 0u; i < LB; i += 1u) {
            Bs[b_k[i] * BN + b_n[i]] = rb[i];
        }
        workgroupBarrier();
        let kn = k0 + BK;
        if kn < kend {
            for (var i = 0u; i < LA; i += 1u) {
                ra[i] = a_val(a_rows[i], kn + a_k[i], kend);
            }
            for (var i = 0u; i < LB; i += 1u) {
                rb[i] = b_val(b_cols[i], b_ok[i], kn + b_k[i], kend);
            }
        }
        for (var kk = 0u; kk < BK; kk += 1u) {
            var av: array<f32, TM>;
            var bv: array<f32, TN>;
            for (var i = 0u; i < TM; i += 1u) {
                av[i] = As[kk * BM + ty + i * TY];
            }
            for (var j = 0u; j < TN; j += 1u) {
                bv[j] = Bs[kk * BN + tx + j * TX];
            }
            for (var i = 0u; i < TM; i += 1u) {
                for (var j = 0u; j < TN; j += 1u) {
                    acc[i * TN + j] = fma(av[i], bv[j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }

    let obase = split * p.out_len;
    for (var i = 0u; i < TM; i += 1u) {
        let m = m0 + ty + i * TY;
        if m < p.m {
            let row = c_row(m);
            for (var j = 0u; j < TN; j += 1u) {
                let n = n0 + tx + j * TX;
                if n < p.n {
                    out[obase + c_off(row, n, g)] = acc[i * TN + j];
                }
            }
        }
    }
}
