//! The float16 MatMul and Conv2D cases shared by `matmul_coop.rs` (cooperative matrices
//! where the adapter has them, else the fallback kernels) and `coop_emulated.rs` (the
//! emulated form of the cooperative kernels, `TFWGPU_COOP_EMULATE=1`, on any adapter with
//! float16 shaders). Tolerances: see matmul_coop.rs.
#![allow(dead_code)]

use crate::common::*;
use rand::rngs::StdRng;
use std::io::Write;
use std::sync::Once;
use tfwgpu_runtime::kernels::matmul::coop::{
    CoopTile, EMULATE_VAR, device_supports, emulation_requested,
};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, HostTensor, f16};

/// True (and says so on stderr) when the test adapter has no cooperative matrices: the tests
/// of the real cooperative kernels skip.
pub fn skip_without_coop() -> bool {
    if device_supports(dev()) {
        return false;
    }
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: no cooperative matrix (16x16x16 f16 -> f32) on {}",
        dev().description().name
    );
    true
}

/// The emulated cooperative kernels (`TFWGPU_COOP_EMULATE=1`) with the switches `vars`, set
/// once per test binary (the settings are read once per process) before its first test reads
/// them; every test of such a binary calls this first.
pub fn setup_emulated(vars: &[(&str, &str)]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: every test of the binary calls `setup_emulated` first, and `call_once`
        // blocks the others until the variables are set, so no other thread reads the
        // environment then.
        unsafe {
            std::env::set_var(EMULATE_VAR, "1");
            for (k, v) in vars {
                std::env::set_var(k, v);
            }
        }
    });
    assert!(emulation_requested());
}

/// The error bound of a float16 product element (see matmul_coop.rs): a float32 sum of `k`
/// exact products errs by at most k * 2^-23 * `scale` (the sum of |products|), and the
/// rounding to float16 adds 2^-11 relative and 2^-25 absolute (subnormals).
pub fn f16_tol(want: f64, scale: f64, k: f64) -> f64 {
    let acc = k * 2f64.powi(-23) * scale;
    2f64.powi(-11) * (want.abs() + acc) + acc + 2f64.powi(-25)
}

/// `v` rounded to f16.
pub fn halves(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

/// Reference product of stored A ([.., M, K] or [.., K, M] if `ta`) and B, with NumPy batch
/// broadcasting; returns (exact sums, sums of |products|) per output element.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    a: &[f32],
    b: &[f32],
    sa: &[usize],
    sb: &[usize],
    ta: bool,
    tb: bool,
) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k) = if ta {
        (sa[ra - 1], sa[ra - 2])
    } else {
        (sa[ra - 2], sa[ra - 1])
    };
    let n = if tb { sb[rb - 2] } else { sb[rb - 1] };
    let rank = (ra - 2).max(rb - 2);
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (ba, bb) = (pad(&sa[..ra - 2]), pad(&sb[..rb - 2]));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let count: usize = batch.iter().product();
    let (mut want, mut scale) = (vec![], vec![]);
    for bi in 0..count {
        // Decompose bi over `batch` (row-major) into operand batch indices.
        let (mut rem, mut ia, mut ib, mut stra, mut strb) = (bi, 0, 0, 1, 1);
        for d in (0..rank).rev() {
            let idx = rem % batch[d];
            rem /= batch[d];
            if ba[d] != 1 {
                ia += idx * stra;
            }
            if bb[d] != 1 {
                ib += idx * strb;
            }
            stra *= ba[d];
            strb *= bb[d];
        }
        let (oa, ob) = (ia * m * k, ib * k * n);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut t) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let x = if ta {
                        a[oa + p * m + i]
                    } else {
                        a[oa + i * k + p]
                    };
                    let y = if tb {
                        b[ob + j * k + p]
                    } else {
                        b[ob + p * n + j]
                    };
                    let prod = x as f64 * y as f64;
                    s += prod;
                    t += prod.abs();
                }
                want.push(s);
                scale.push(t);
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (shape, want, scale)
}

/// Runs `op` on f16 operands of the given stored shapes and checks it (tolerance in the
/// module's doc); `tile` forces a `_tfwgpu_tile`.
#[allow(clippy::too_many_arguments)]
pub fn check_f16(
    op: &str,
    sa: &[usize],
    sb: &[usize],
    ta: bool,
    tb: bool,
    tile: Option<&str>,
    seed: u64,
) {
    let d = dev();
    let mut r = rng(seed);
    let na: usize = sa.iter().product();
    let nb: usize = sb.iter().product();
    let a: Vec<f32> = halves(&rand_f32(&mut r, na, -1.0, 1.0))
        .iter()
        .map(|h| h.to_f32())
        .collect();
    let b: Vec<f32> = halves(&rand_f32(&mut r, nb, -1.0, 1.0))
        .iter()
        .map(|h| h.to_f32())
        .collect();
    let ga = d.upload(&halves(&a), sa).unwrap();
    let gb = d.upload(&halves(&b), sb).unwrap();
    let (tname, fa, fb) = if op == "MatMul" {
        ("T", "transpose_a", "transpose_b")
    } else if op == "BatchMatMulV3" {
        ("Ta", "adj_x", "adj_y")
    } else {
        ("T", "adj_x", "adj_y")
    };
    let mut attrs = Attrs::new()
        .with(tname, AttrValue::Type(DType::F16))
        .with(fa, AttrValue::Bool(ta))
        .with(fb, AttrValue::Bool(tb));
    if op == "BatchMatMulV3" {
        attrs.set("Tb", AttrValue::Type(DType::F16));
        attrs.set("Tout", AttrValue::Type(DType::F16));
    }
    if let Some(t) = tile {
        attrs.set("_tfwgpu_tile", AttrValue::Str(t.into()));
    }
    let out = d
        .run(op, &attrs, &[Arg::from(&ga), Arg::from(&gb)])
        .unwrap_or_else(|e| panic!("{op} {sa:?} x {sb:?} ({ta}, {tb}, {tile:?}): {e}"));
    let (shape, want, scale) = reference(&a, &b, sa, sb, ta, tb);
    assert_eq!(out[0].shape(), shape.as_slice());
    let got = out[0].download::<f16>().unwrap();
    let k = if ta {
        sa[sa.len() - 2]
    } else {
        sa[sa.len() - 1]
    };
    for (i, ((g, &w), &s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let tol = f16_tol(w, s, k as f64);
        let g = g.to_f64();
        assert!(
            (g - w).abs() <= tol,
            "{op} {sa:?} x {sb:?} ({ta}, {tb}, {tile:?}) [{i}]: got {g}, want {w} (tol {tol:e})"
        );
    }
}

pub const FLAGS: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// The stored shape of an M x K (or K x M) operand.
pub fn stored(rows: usize, cols: usize, t: bool) -> [usize; 2] {
    if t { [cols, rows] } else { [rows, cols] }
}

/// `n` uniform values in [-1, 1) rounded to float16 (held as f32).
pub fn rand_halves(g: &mut StdRng, n: usize) -> Vec<f32> {
    halves(&rand_f32(g, n, -1.0, 1.0))
        .iter()
        .map(|h| h.to_f32())
        .collect()
}

/// A convolution's output rows and columns and its top and left padding for an input of
/// `h` x `w`, a dilated filter of `er` x `es`, `stride` and `pad` ("SAME" or "VALID").
pub fn conv_geom(
    (h, w): (usize, usize),
    (er, es): (usize, usize),
    stride: usize,
    pad: &str,
) -> (usize, usize, usize, usize) {
    if pad == "SAME" {
        let (oh, ow) = (h.div_ceil(stride), w.div_ceil(stride));
        let ph = ((oh - 1) * stride + er).saturating_sub(h);
        let pw = ((ow - 1) * stride + es).saturating_sub(w);
        (oh, ow, ph / 2, pw / 2)
    } else {
        ((h - er) / stride + 1, (w - es) / stride + 1, 0, 0)
    }
}

/// The attributes of an NHWC float16 Conv2D or Conv2D gradient, with `tile` forced if given.
pub fn conv_attrs_f16(stride: usize, dil: usize, pad: &str, tile: Option<&str>) -> Attrs {
    let mut attrs = Attrs::new()
        .with("T", AttrValue::Type(DType::F16))
        .with(
            "strides",
            AttrValue::Ints(vec![1, stride as i64, stride as i64, 1]),
        )
        .with(
            "dilations",
            AttrValue::Ints(vec![1, dil as i64, dil as i64, 1]),
        )
        .with("padding", AttrValue::Str(pad.into()))
        .with("data_format", AttrValue::Str("NHWC".into()));
    if let Some(t) = tile {
        attrs.set("_tfwgpu_tile", AttrValue::Str(t.into()));
    }
    attrs
}

/// Conv2D NHWC float16 (x [n, h, w, c], f [r, s, c, k]) against an f64 reference of the f16
/// inputs; tolerance as for MatMul with K = r * s * c. `pad`: "SAME" or "VALID".
#[allow(clippy::too_many_arguments)]
pub fn check_conv_f16(
    (n, h, w, c): (usize, usize, usize, usize),
    (r, s, k): (usize, usize, usize),
    stride: usize,
    dil: usize,
    pad: &str,
    tile: Option<&str>,
    seed: u64,
) {
    let d = dev();
    let mut g = rng(seed);
    let x = rand_halves(&mut g, n * h * w * c);
    let f = rand_halves(&mut g, r * s * c * k);
    let (er, es) = ((r - 1) * dil + 1, (s - 1) * dil + 1);
    let (oh, ow, pt, pl) = conv_geom((h, w), (er, es), stride, pad);
    let xt = d.upload(&halves(&x), &[n, h, w, c]).unwrap();
    let ft = d.upload(&halves(&f), &[r, s, c, k]).unwrap();
    let attrs = conv_attrs_f16(stride, dil, pad, tile);
    let what = format!("Conv2D x[{n},{h},{w},{c}] f[{r},{s},{c},{k}] s{stride} d{dil} {pad}");
    let y = d
        .run("Conv2D", &attrs, &[Arg::from(&xt), Arg::from(&ft)])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(y[0].shape(), &[n, oh, ow, k], "{what}");
    let got = y[0].download::<f16>().unwrap();
    let kk = r * s * c;
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for o in 0..k {
                    let (mut want, mut scale) = (0.0f64, 0.0f64);
                    for i in 0..r {
                        for j in 0..s {
                            let iy = (oy * stride + i * dil) as isize - pt as isize;
                            let ix = (ox * stride + j * dil) as isize - pl as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            for ci in 0..c {
                                let xv = x[((b * h + iy as usize) * w + ix as usize) * c + ci];
                                let p = xv as f64 * f[((i * s + j) * c + ci) * k + o] as f64;
                                want += p;
                                scale += p.abs();
                            }
                        }
                    }
                    let tol = f16_tol(want, scale, kk as f64);
                    let gv = got[((b * oh + oy) * ow + ox) * k + o].to_f64();
                    assert!(
                        (gv - want).abs() <= tol,
                        "{what} [{b},{oy},{ox},{o}]: got {gv}, want {want} (tol {tol:e})"
                    );
                }
            }
        }
    }
}

/// Conv2DBackpropInput NHWC float16 (dx [n, h, w, c] from f [r, s, c, k] and dy
/// [n, oh, ow, k]) against an f64 reference of the f16 inputs; tolerance as for MatMul with
/// K = r * s * k.
#[allow(clippy::too_many_arguments)]
pub fn check_bwd_input_f16(
    (n, h, w, c): (usize, usize, usize, usize),
    (r, s, k): (usize, usize, usize),
    stride: usize,
    dil: usize,
    pad: &str,
    tile: Option<&str>,
    seed: u64,
) {
    let d = dev();
    let mut g = rng(seed);
    let (er, es) = ((r - 1) * dil + 1, (s - 1) * dil + 1);
    let (oh, ow, pt, pl) = conv_geom((h, w), (er, es), stride, pad);
    let f = rand_halves(&mut g, r * s * c * k);
    let dy = rand_halves(&mut g, n * oh * ow * k);
    let ft = d.upload(&halves(&f), &[r, s, c, k]).unwrap();
    let dyt = d.upload(&halves(&dy), &[n, oh, ow, k]).unwrap();
    let sizes = HostTensor::vec_i32(&[n as i32, h as i32, w as i32, c as i32]);
    let attrs = conv_attrs_f16(stride, dil, pad, tile);
    let what = format!(
        "Conv2DBackpropInput dx[{n},{h},{w},{c}] f[{r},{s},{c},{k}] s{stride} d{dil} {pad} {tile:?}"
    );
    let dx = d
        .run(
            "Conv2DBackpropInput",
            &attrs,
            &[Arg::from(&sizes), Arg::from(&ft), Arg::from(&dyt)],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(dx[0].shape(), &[n, h, w, c], "{what}");
    let got = dx[0].download::<f16>().unwrap();
    // Scatter form of the reference: every (output position, tap) adds dy * f to the input
    // position it read in the forward pass.
    let mut want = vec![0.0f64; n * h * w * c];
    let mut scale = vec![0.0f64; n * h * w * c];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for i in 0..r {
                    for j in 0..s {
                        let iy = (oy * stride + i * dil) as isize - pt as isize;
                        let ix = (ox * stride + j * dil) as isize - pl as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let o = ((b * h + iy as usize) * w + ix as usize) * c;
                        for ci in 0..c {
                            for ko in 0..k {
                                let p = dy[((b * oh + oy) * ow + ox) * k + ko] as f64
                                    * f[((i * s + j) * c + ci) * k + ko] as f64;
                                want[o + ci] += p;
                                scale[o + ci] += p.abs();
                            }
                        }
                    }
                }
            }
        }
    }
    let kk = (r * s * k) as f64;
    for (e, (&wv, &sc)) in want.iter().zip(&scale).enumerate() {
        let tol = f16_tol(wv, sc, kk);
        let gv = got[e].to_f64();
        assert!(
            (gv - wv).abs() <= tol,
            "{what} [{e}]: got {gv}, want {wv} (tol {tol:e})"
        );
    }
}

/// MatMul of M x K by K x N, f16, in every layout of the operands (`FLAGS`).
fn check_layouts((m, k, n): (usize, usize, usize), tile: Option<&str>, seed: u64) {
    for (ta, tb) in FLAGS {
        check_f16(
            "MatMul",
            &stored(m, k, ta),
            &stored(k, n, tb),
            ta,
            tb,
            tile,
            seed,
        );
    }
}

pub fn f16_matmul_any() {
    // The automatic choice: cooperative where the adapter has it, else the fallback.
    for &(m, k, n) in &[(1, 1, 1), (7, 9, 5), (33, 64, 17), (20, 0, 3)] {
        check_layouts((m, k, n), None, (m * 100 + k * 10 + n) as u64);
    }
}

pub fn matmul_shapes_layouts_tiles(tiles: &[CoopTile]) {
    // Load widths 8 / 2 / 1 (K 64, 66, 67 and M/N likewise), partial tiles, tiny shapes.
    let shapes = [
        (1, 1, 1),
        (16, 16, 16),
        (7, 9, 5),
        (129, 64, 130),
        (130, 66, 129),
        (64, 67, 200),
        (257, 300, 96),
    ];
    // Every tile on the awkward shapes, the default choice on all of them.
    for tile in tiles.iter().map(|t| Some(t.name)).chain([None]) {
        let shapes = if tile.is_some() {
            &shapes[3..6]
        } else {
            &shapes[..]
        };
        for &(m, k, n) in shapes {
            check_layouts((m, k, n), tile, (m + k + n) as u64);
        }
    }
}

/// M of several tiles with a partial last one, K of one, two and several K tiles (whole and
/// partial), every layout, and batches (broadcast and plain): persistent tiles
/// (`CoopTile::persist`) walking several M tiles (run with a small `TFWGPU_COOP_PERSIST_WAVE`
/// so that each workgroup takes several), late-staging tiles (`depth` 0) through every step
/// of their K loop.
pub fn several_tiles(tiles: &[CoopTile]) {
    for tile in tiles.iter().map(|t| Some(t.name)) {
        for &(m, k, n) in &[
            (300, 64, 130),
            (261, 128, 72),
            (200, 200, 136),
            (333, 320, 64),
        ] {
            check_layouts((m, k, n), tile, (m * 7 + k + n) as u64);
        }
        check_f16(
            "BatchMatMulV2",
            &[3, 1, 150, 96],
            &[1, 2, 96, 40],
            false,
            false,
            tile,
            31,
        );
        check_f16(
            "BatchMatMulV2",
            &[4, 136, 200],
            &[4, 136, 72],
            true,
            false,
            tile,
            32,
        );
    }
}

pub fn batch_matmul_broadcast() {
    // [3,1] x [1,2] batches, adjoints, both ops; and a plain batch of 5.
    for op in ["BatchMatMulV2", "BatchMatMulV3"] {
        for (ta, tb) in FLAGS {
            let (m, k, n) = (40, 72, 24);
            let mut sa = vec![3, 1];
            sa.extend(stored(m, k, ta));
            let mut sb = vec![1, 2];
            sb.extend(stored(k, n, tb));
            check_f16(op, &sa, &sb, ta, tb, None, 11);
        }
    }
    check_f16(
        "BatchMatMulV2",
        &[5, 33, 48],
        &[5, 48, 65],
        false,
        false,
        None,
        12,
    );
    check_f16(
        "BatchMatMulV2",
        &[5, 33, 48],
        &[48, 65],
        false,
        false,
        None,
        13,
    );
}

pub fn large_k() {
    // A long K: the accumulation bound grows with K.
    check_f16("MatMul", &[128, 4100], &[4100, 128], false, false, None, 21);
    check_f16("MatMul", &[4100, 128], &[128, 4100], true, true, None, 22);
}

pub fn f16_conv2d_any() {
    // Cooperative where the adapter has it, the f32 GEMM elsewhere.
    check_conv_f16((2, 9, 7, 8), (3, 3, 16), 1, 1, "SAME", None, 31);
    check_conv_f16((1, 6, 5, 3), (2, 2, 5), 2, 1, "VALID", None, 32);
}

pub fn conv2d_forward(tiles: &[CoopTile]) {
    // Channel counts for load widths 8, 2 and 1; strides, dilations, both paddings.
    for tile in tiles {
        check_conv_f16(
            (2, 12, 11, 16),
            (3, 3, 40),
            1,
            1,
            "SAME",
            Some(tile.name),
            41,
        );
        check_conv_f16((3, 10, 9, 6), (3, 3, 17), 2, 1, "SAME", Some(tile.name), 42);
        check_conv_f16(
            (2, 13, 12, 3),
            (5, 5, 8),
            1,
            2,
            "VALID",
            Some(tile.name),
            43,
        );
        check_conv_f16(
            (2, 8, 8, 64),
            (1, 1, 64),
            1,
            1,
            "VALID",
            Some(tile.name),
            44,
        );
    }
    check_conv_f16((4, 28, 28, 32), (3, 3, 64), 1, 1, "SAME", None, 45);
}

pub fn f16_conv2d_backprop_input_any() {
    // Cooperative where the adapter has it (stride 1, k a multiple of the K tile), the f32
    // GEMM elsewhere.
    check_bwd_input_f16((2, 9, 7, 8), (3, 3, 32), 1, 1, "SAME", None, 51);
    check_bwd_input_f16((1, 6, 5, 3), (2, 2, 5), 2, 1, "VALID", None, 52);
}

pub fn conv2d_backprop_input(tiles: &[CoopTile]) {
    // Channel counts for load widths 8, 4 and 1 (k = 32, 64: K tiles within one tap; k = 40
    // takes the GEMM); dilations, both paddings, 1x1.
    for tile in tiles {
        for (x, f, dil, pad, seed) in [
            ((2, 12, 11, 16), (3, 3, 32), 1, "SAME", 61),
            ((2, 10, 9, 12), (3, 3, 64), 1, "SAME", 62),
            ((2, 13, 12, 3), (5, 5, 64), 2, "VALID", 63),
            ((2, 8, 8, 64), (1, 1, 64), 1, "VALID", 64),
            ((1, 7, 6, 8), (3, 3, 40), 1, "SAME", 65),
        ] {
            check_bwd_input_f16(x, f, 1, dil, pad, Some(tile.name), seed);
        }
    }
    check_bwd_input_f16((4, 28, 28, 32), (3, 3, 64), 1, 1, "SAME", None, 66);
}

/// Conv2DBackpropFilter NHWC float16 (df [r, s, c, k] from x [n, h, w, c] and dy
/// [n, oh, ow, k]) against an f64 reference of the f16 inputs; tolerance as for MatMul with
/// K = n * oh * ow (split-K partial sums are float32 too).
#[allow(clippy::too_many_arguments)]
pub fn check_bwd_filter_f16(
    (n, h, w, c): (usize, usize, usize, usize),
    (r, s, k): (usize, usize, usize),
    stride: usize,
    dil: usize,
    pad: &str,
    tile: Option<&str>,
    seed: u64,
) {
    let d = dev();
    let mut g = rng(seed);
    let (er, es) = ((r - 1) * dil + 1, (s - 1) * dil + 1);
    let (oh, ow, pt, pl) = conv_geom((h, w), (er, es), stride, pad);
    let x = rand_halves(&mut g, n * h * w * c);
    let dy = rand_halves(&mut g, n * oh * ow * k);
    let xt = d.upload(&halves(&x), &[n, h, w, c]).unwrap();
    let dyt = d.upload(&halves(&dy), &[n, oh, ow, k]).unwrap();
    let sizes = HostTensor::vec_i32(&[r as i32, s as i32, c as i32, k as i32]);
    let attrs = conv_attrs_f16(stride, dil, pad, tile);
    let what = format!(
        "Conv2DBackpropFilter x[{n},{h},{w},{c}] f[{r},{s},{c},{k}] s{stride} d{dil} {pad} {tile:?}"
    );
    let df = d
        .run(
            "Conv2DBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&sizes), Arg::from(&dyt)],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(df[0].shape(), &[r, s, c, k], "{what}");
    let got = df[0].download::<f16>().unwrap();
    let kk = (n * oh * ow) as f64;
    for i in 0..r {
        for j in 0..s {
            for ci in 0..c {
                for ko in 0..k {
                    let (mut want, mut scale) = (0.0f64, 0.0f64);
                    for b in 0..n {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let iy = (oy * stride + i * dil) as isize - pt as isize;
                                let ix = (ox * stride + j * dil) as isize - pl as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv = x[((b * h + iy as usize) * w + ix as usize) * c + ci];
                                let p = xv as f64 * dy[((b * oh + oy) * ow + ox) * k + ko] as f64;
                                want += p;
                                scale += p.abs();
                            }
                        }
                    }
                    let tol = f16_tol(want, scale, kk);
                    let gv = got[((i * s + j) * c + ci) * k + ko].to_f64();
                    assert!(
                        (gv - want).abs() <= tol,
                        "{what} [{i},{j},{ci},{ko}]: got {gv}, want {want} (tol {tol:e})"
                    );
                }
            }
        }
    }
}

pub fn f16_conv2d_backprop_filter_any() {
    // Cooperative where the adapter has it (split K into float32 partial sums), the f32 GEMM
    // elsewhere.
    check_bwd_filter_f16((2, 9, 7, 8), (3, 3, 32), 1, 1, "SAME", None, 71);
    check_bwd_filter_f16((1, 6, 5, 3), (2, 2, 5), 2, 1, "VALID", None, 72);
    // K = 3136 rows of 64: several splits, the last one shorter.
    check_bwd_filter_f16((4, 28, 28, 32), (3, 3, 64), 1, 1, "SAME", None, 73);
}

pub fn conv2d_backprop_filter(tiles: &[CoopTile]) {
    // Channel counts for load widths 8, 4 and 1, output channels likewise; strides,
    // dilations, both paddings, 1x1 (a plain split-K product), batch 1 and 1-pixel images.
    for tile in tiles {
        for (x, f, st, dil, pad, seed) in [
            ((2, 12, 11, 16), (3, 3, 40), 1, 1, "SAME", 81),
            ((3, 10, 9, 6), (3, 3, 17), 2, 1, "SAME", 82),
            ((2, 13, 12, 3), (5, 5, 8), 1, 2, "VALID", 83),
            ((2, 8, 8, 64), (1, 1, 64), 1, 1, "VALID", 84),
            ((1, 7, 6, 12), (3, 3, 20), 1, 1, "SAME", 85),
            ((1, 1, 1, 8), (1, 1, 8), 1, 1, "SAME", 86),
            ((2, 1, 1, 8), (3, 3, 16), 1, 1, "SAME", 87),
            ((2, 9, 8, 24), (1, 1, 32), 2, 1, "VALID", 88),
        ] {
            check_bwd_filter_f16(x, f, st, dil, pad, Some(tile.name), seed);
        }
    }
}

/// The filter gradient's cases (`conv2d_backprop_filter`) and a long K (3136 rows: 49 K
/// tiles of 64) under `TFWGPU_CONV_COOP_SPLITS=splits`; where the device times dispatches,
/// also checks the split sums that ran: none for one split, else v7's four-float sum (M * N
/// a multiple of 4) with the row count of `splits` (clamped to the K tiles) and v5b's sum
/// for M * N not a multiple of 4 (C = 3, K = 17, 5 K tiles); with
/// `TFWGPU_CONV_COOP_LAST=force`: products summed by each tile's last arrival
/// (`CoopSpec::sum_last`, `_sl` kernels) and no four-float split sum of the long case
/// (N = 64), v5b's sum still for N = 17 (not a multiple of the vector epilogue's 8).
pub fn conv2d_backprop_filter_split_sums(tiles: &[CoopTile], splits: usize) {
    let labels = kernels_run(|| {
        conv2d_backprop_filter(tiles);
        for tile in tiles {
            check_bwd_filter_f16(
                (4, 28, 28, 32),
                (3, 3, 64),
                1,
                1,
                "SAME",
                Some(tile.name),
                89,
            );
            // (M * N = 27 * 17, odd; K = 288: 5 K tiles.)
            check_bwd_filter_f16(
                (2, 12, 12, 3),
                (3, 3, 17),
                1,
                1,
                "SAME",
                Some(tile.name),
                90,
            );
        }
    });
    let Some(labels) = labels else {
        return;
    };
    let sums: Vec<&String> = labels.iter().filter(|l| l.contains("split_sum")).collect();
    if splits == 1 {
        assert!(sums.is_empty(), "one split, yet split sums ran: {sums:?}");
        return;
    }
    if std::env::var("TFWGPU_CONV_COOP_LAST").is_ok_and(|v| v.trim() == "force") {
        assert!(
            labels.iter().any(|l| l.contains("_sl")),
            "expected kernels summed by the last arrival among {labels:?}"
        );
        assert!(
            sums.iter().any(|l| l.contains("split_sum8")),
            "expected v5b's split_sum8 (M * N = 27 * 17) among {sums:?}"
        );
        // (The long case alone: M * N = 576 * 64.)
        let long = kernels_run(|| {
            check_bwd_filter_f16((4, 28, 28, 32), (3, 3, 64), 1, 1, "SAME", None, 92)
        })
        .unwrap_or_default();
        assert!(
            !long.iter().any(|l| l.contains("split_sum")) && long.iter().any(|l| l.contains("_sl")),
            "expected the long case summed by the last arrival: {long:?}"
        );
        return;
    }
    // (49 K tiles in the long case: min(splits, 49) splits, ceil(s / 4) rows rounded up to
    // a power of two, at most 32.)
    let s = splits.min(49);
    let rows = s.div_ceil(4).next_power_of_two().min(32);
    let want = format!("split_sum4_r{rows}");
    assert!(
        sums.iter().any(|l| l.contains(&want)),
        "expected {want} among {sums:?}"
    );
    assert!(
        sums.iter().any(|l| l.contains("split_sum8")),
        "expected v5b's split_sum8 (M * N = 27 * 17) among {sums:?}"
    );
}

/// Head/tail plans (v7) under `TFWGPU_CONV_COOP_WAVE=3` and `TFWGPU_CONV_COOP_TAIL=force`:
/// products of 4-5 tiles of 64 rows whose first 3 tile rows run unsplit and the rest (1-2
/// tile rows, the last one partial) in 2-5 splits summed into those rows of the output:
/// forward through the windows, input gradient through the windows and as a 1x1 product,
/// filter gradient through the windows (stride 1 and 2) and as a 1x1 product; output
/// columns 16-40 (head offsets a multiple of the binding alignment where lavapipe's is up to
/// 256 bytes). Where the device times dispatches, checks that split kernels ran for the
/// forward products (split sums, or one-launch head/tail kernels under
/// `TFWGPU_CONV_COOP_LAST=force`).
pub fn conv2d_head_tail(tiles: &[CoopTile]) {
    let labels = kernels_run(|| {
        for tile in tiles {
            let t = Some(tile.name);
            check_conv_f16((2, 12, 11, 16), (3, 3, 40), 1, 1, "SAME", t, 121);
            check_conv_f16((1, 17, 16, 8), (3, 3, 24), 1, 1, "SAME", t, 122);
        }
    });
    if let Some(labels) = labels {
        // (Split kernels for the tails, through the split sum, or under
        // `TFWGPU_CONV_COOP_LAST=force` head and tail in one launch, the tail summed by its
        // last arrivals; with `TFWGPU_CONV_COOP_ONE_LAUNCH=0` too, a tail launch of its own
        // summed by its last arrivals.)
        let last = std::env::var("TFWGPU_CONV_COOP_LAST").is_ok_and(|v| v.trim() == "force");
        let two = std::env::var("TFWGPU_CONV_COOP_ONE_LAUNCH").is_ok_and(|v| v.trim() == "0");
        let want = match (last, two) {
            (true, false) => "_ht",
            (true, true) => "_sl",
            _ => "split_sum",
        };
        assert!(
            labels.iter().any(|l| l.contains(want)),
            "expected {want} kernels for the tails among {labels:?}"
        );
    }
    for tile in tiles {
        let t = Some(tile.name);
        check_bwd_input_f16((2, 12, 11, 16), (3, 3, 64), 1, 1, "SAME", t, 123);
        check_bwd_input_f16((3, 8, 9, 24), (1, 1, 320), 1, 1, "VALID", t, 124);
        check_bwd_filter_f16((2, 9, 8, 32), (3, 3, 40), 1, 1, "SAME", t, 125);
        check_bwd_filter_f16((2, 11, 10, 32), (3, 3, 16), 2, 1, "SAME", t, 126);
        check_bwd_filter_f16((4, 8, 8, 200), (1, 1, 24), 1, 1, "VALID", t, 127);
    }
}

pub fn conv2d_split_k(tiles: &[CoopTile]) {
    // Few output tiles and K of 320-576: K split over the grid (float32 partial sums, the last
    // split shorter), through the windows (forward, backprop input with K tiles within one
    // tap) and as plain 1x1 products.
    for tile in tiles {
        check_conv_f16((2, 6, 5, 40), (3, 3, 24), 1, 1, "SAME", Some(tile.name), 91);
        check_conv_f16(
            (2, 4, 3, 320),
            (1, 1, 24),
            1,
            1,
            "VALID",
            Some(tile.name),
            92,
        );
        check_bwd_input_f16((2, 5, 6, 16), (3, 3, 64), 1, 1, "SAME", Some(tile.name), 93);
        check_bwd_input_f16(
            (2, 4, 3, 24),
            (1, 1, 320),
            1,
            1,
            "VALID",
            Some(tile.name),
            94,
        );
    }
}

pub fn conv2d_backprop_input_strided(tiles: &[CoopTile]) {
    // Strides 2 and 3 (taps between strided outputs read as zeros), SAME with asymmetric
    // padding, VALID, dilation, 1x1 at stride 2, a 1-pixel dy, batch 1; dy channels 32 and 64
    // (K tiles within one tap), input channels for widths 8, 4 and 1.
    for tile in tiles {
        for (x, f, st, dil, pad, seed) in [
            ((2, 9, 8, 16), (3, 3, 64), 2, 1, "SAME", 101),
            ((2, 8, 8, 12), (1, 1, 64), 2, 1, "VALID", 102),
            ((1, 10, 11, 3), (3, 3, 32), 3, 1, "VALID", 103),
            ((2, 9, 9, 8), (3, 3, 32), 2, 2, "SAME", 104),
            ((1, 2, 2, 8), (3, 3, 64), 2, 1, "SAME", 105),
        ] {
            check_bwd_input_f16(x, f, st, dil, pad, Some(tile.name), seed);
        }
    }
}

/// Strided input gradients as one stride-1 product per output phase (v6; dy channels 64, so
/// that the K tiles of 64 lie within one tap): a 1-pixel dx (one phase of four), 1x1 VALID
/// on odd sizes (one phase with taps, the others zeros), dilation 2 at stride 2 (per axis
/// every tap in one phase, none in the other), a 2x3 filter at stride 3 (phases of 1 or 0
/// taps per axis, 9 phases), SAME with asymmetric padding, input channels 16, 12 and 3
/// (load widths 8, 4 and 1; no vector epilogue for 12 and 3), batch 1 and 2; sizes that are
/// multiples of the strides (the phases in one launch). Where the device times dispatches,
/// also checks which kernels ran (the phase kernels, or v5b's strided windows under
/// `TFWGPU_CONV_COOP_PHASES=0`).
pub fn conv2d_backprop_input_phases(tiles: &[CoopTile]) {
    let labels = kernels_run(|| conv2d_backprop_input_phases_unchecked(tiles));
    if let Some(labels) = labels {
        let phases = std::env::var("TFWGPU_CONV_COOP_PHASES").is_ok_and(|v| v.trim() == "0");
        let (want, not) = if phases {
            ("convbis_", "convbip_")
        } else {
            ("convbip_", "convbis_")
        };
        assert!(
            labels.iter().any(|l| l.contains(want)) && !labels.iter().any(|l| l.contains(not)),
            "expected {want} kernels and no {not} kernels among {labels:?}"
        );
    }
}

/// The pipeline labels of the dispatches `f` records, where the device times dispatches.
pub fn kernels_run(f: impl FnOnce()) -> Option<Vec<String>> {
    let ex = dev().exec();
    let timed = ex.set_timing(true).is_ok();
    if timed {
        ex.take_timings().unwrap();
    }
    f();
    if !timed {
        return None;
    }
    let labels = ex
        .take_timings()
        .unwrap()
        .iter()
        .map(|t| t.label.to_string())
        .collect();
    ex.set_timing(false).unwrap();
    Some(labels)
}

fn conv2d_backprop_input_phases_unchecked(tiles: &[CoopTile]) {
    for tile in tiles {
        for (x, f, st, dil, pad, seed) in [
            ((2, 9, 8, 16), (3, 3, 64), 2, 1, "SAME", 111),
            ((1, 1, 1, 8), (3, 3, 64), 2, 1, "SAME", 112),
            ((2, 9, 7, 8), (1, 1, 64), 2, 1, "VALID", 113),
            ((1, 8, 7, 8), (3, 3, 64), 2, 2, "VALID", 114),
            ((1, 11, 10, 12), (2, 3, 64), 3, 1, "SAME", 115),
            ((1, 10, 11, 3), (3, 3, 64), 3, 1, "VALID", 116),
            // (Sizes multiples of the strides: the phases in one launch; 1x1 VALID, the
            // zeros written beside phase (0, 0) or, with the zeros by kernel, in its launch;
            // dilation 2 SAME, whose taps all fall in phase (1, 1); stride 3, nine phases.)
            ((2, 8, 8, 16), (3, 3, 64), 2, 1, "SAME", 117),
            ((2, 8, 6, 8), (1, 1, 64), 2, 1, "VALID", 118),
            ((1, 8, 8, 8), (3, 3, 64), 2, 2, "SAME", 119),
            ((1, 6, 9, 8), (3, 3, 64), 3, 1, "SAME", 120),
        ] {
            check_bwd_input_f16(x, f, st, dil, pad, Some(tile.name), seed);
        }
    }
}

/// Stream-K (`TFWGPU_CONV_COOP_STREAMK=1`, a wave of `TFWGPU_CONV_COOP_WAVE` workgroups
/// set by the caller) on forward and input-gradient products whose iterations (tile, K tile)
/// fall unevenly on the workgroups: one tile of 9 K tiles over every workgroup, a few tiles
/// each split across two or three workgroups, more tiles than workgroups (whole tiles and
/// split ones in one workgroup's range). Each product checked against float64, one after
/// the other: a product whose tiles' arrival counters were not left at zero would sum too
/// few or no slices in the next.
pub fn conv2d_stream_k(tiles: &[CoopTile]) {
    let labels = kernels_run(|| {
        for tile in tiles {
            let t = Some(tile.name);
            check_conv_f16((2, 6, 5, 64), (3, 3, 24), 1, 1, "SAME", t, 131);
            check_conv_f16((2, 12, 11, 16), (3, 3, 40), 1, 1, "SAME", t, 132);
            check_conv_f16((2, 20, 20, 8), (3, 3, 40), 1, 1, "SAME", t, 133);
            check_conv_f16((1, 9, 13, 24), (3, 3, 16), 2, 1, "VALID", t, 134);
            check_bwd_input_f16((2, 12, 11, 16), (3, 3, 64), 1, 1, "SAME", t, 135);
            check_bwd_input_f16((2, 5, 6, 16), (3, 3, 64), 1, 1, "SAME", t, 136);
            check_bwd_input_f16((3, 8, 9, 24), (1, 1, 320), 1, 1, "VALID", t, 137);
            // (Again, after the others: the counters are zero after each launch.)
            check_conv_f16((2, 6, 5, 64), (3, 3, 24), 1, 1, "SAME", t, 138);
        }
    });
    if let Some(labels) = labels {
        assert!(
            labels.iter().any(|l| l.contains("_stk")),
            "expected stream-K kernels among {labels:?}"
        );
    }
}
