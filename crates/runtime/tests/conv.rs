//! conv family: Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter and the depthwise ops,
//! against f64 CPU references (direct loops over the convolution's definition).
//!
//! Tolerances: every result is a dot product of L terms accumulated in f32 (fma), possibly in
//! split-K pieces summed at the end; its error is at most (L + splits) * 2^-24 * sum|terms|
//! (the classical bound for recursive summation), which the reference computes alongside.
//! float16 results add one rounding to f16 (half an ulp, 2^-11 relative, 2^-25 absolute for
//! subnormals); the reference reads the same f16-rounded inputs.
mod common;
mod refs;

use common::*;
use refs::assert_within;
use tfwgpu_runtime::kernels::conv::CPU_CONV_TILES;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, HostTensor, Tensor, f16};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pad {
    Same,
    Valid,
    /// (top, bottom, left, right)
    Explicit(usize, usize, usize, usize),
}

/// One convolution: input [n, h, w, c], filter [r, s, cg, k] (groups = c / cg), NHWC shapes
/// here; `nchw` selects the layout the op sees.
#[derive(Clone, Copy, Debug)]
struct Cfg {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    r: usize,
    s: usize,
    cg: usize,
    k: usize,
    stride: (usize, usize),
    dil: (usize, usize),
    pad: Pad,
    nchw: bool,
}

#[allow(clippy::too_many_arguments)]
const fn cfg(
    n: usize,
    hw: (usize, usize),
    c: usize,
    rs: (usize, usize),
    k: usize,
    stride: (usize, usize),
    dil: (usize, usize),
    pad: Pad,
) -> Cfg {
    Cfg {
        n,
        h: hw.0,
        w: hw.1,
        c,
        r: rs.0,
        s: rs.1,
        cg: c,
        k,
        stride,
        dil,
        pad,
        nchw: false,
    }
}

/// TensorFlow's output size and padding before along one dimension.
fn windowed(i: usize, f: usize, s: usize, d: usize, pad: Pad, dim: usize) -> (usize, usize) {
    let eff = (f - 1) * d + 1;
    match pad {
        Pad::Valid => ((i + s - eff) / s, 0),
        Pad::Same => {
            let o = i.div_ceil(s);
            let needed = ((o - 1) * s + eff).saturating_sub(i);
            (o, needed / 2)
        }
        Pad::Explicit(t, b, l, r) => {
            let (pb, pa) = if dim == 0 { (t, b) } else { (l, r) };
            ((i + pb + pa + s - eff) / s, pb)
        }
    }
}

impl Cfg {
    fn groups(&self) -> usize {
        self.c / self.cg
    }
    fn out(&self) -> (usize, usize, usize, usize) {
        let (oh, pt) = windowed(self.h, self.r, self.stride.0, self.dil.0, self.pad, 0);
        let (ow, pl) = windowed(self.w, self.s, self.stride.1, self.dil.1, self.pad, 1);
        (oh, ow, pt, pl)
    }
    fn layout(&self, n: usize, h: usize, w: usize, c: usize) -> Vec<usize> {
        if self.nchw {
            vec![n, c, h, w]
        } else {
            vec![n, h, w, c]
        }
    }
    fn x_shape(&self) -> Vec<usize> {
        self.layout(self.n, self.h, self.w, self.c)
    }
    fn y_shape(&self) -> Vec<usize> {
        let (oh, ow, _, _) = self.out();
        self.layout(self.n, oh, ow, self.k)
    }
    fn attrs(&self, dtype: DType) -> Attrs {
        let (sh, sw) = self.stride;
        let (dh, dw) = self.dil;
        let four = |a: usize, b: usize| {
            AttrValue::Ints(if self.nchw {
                vec![1, 1, a as i64, b as i64]
            } else {
                vec![1, a as i64, b as i64, 1]
            })
        };
        let mut at = Attrs::new()
            .with("T", AttrValue::Type(dtype))
            .with("strides", four(sh, sw))
            .with("dilations", four(dh, dw))
            .with(
                "data_format",
                AttrValue::Str(if self.nchw { "NCHW" } else { "NHWC" }.into()),
            );
        let p = match self.pad {
            Pad::Same => "SAME",
            Pad::Valid => "VALID",
            Pad::Explicit(t, b, l, r) => {
                let v = [0, 0, t, b, l, r, 0, 0].map(|x| x as i64).to_vec();
                let v = if self.nchw {
                    [0, 0, 0, 0, t, b, l, r].map(|x| x as i64).to_vec()
                } else {
                    v
                };
                at.set("explicit_paddings", AttrValue::Ints(v));
                "EXPLICIT"
            }
        };
        at.with("padding", AttrValue::Str(p.into()))
    }
}

/// NHWC data to the config's layout and back.
fn to_layout(c: &Cfg, d: &[f64], h: usize, w: usize, ch: usize) -> Vec<f64> {
    if !c.nchw {
        return d.to_vec();
    }
    let mut o = vec![0.0; d.len()];
    for n in 0..c.n {
        for y in 0..h {
            for x in 0..w {
                for k in 0..ch {
                    o[((n * ch + k) * h + y) * w + x] = d[((n * h + y) * w + x) * ch + k];
                }
            }
        }
    }
    o
}

/// `to_layout`'s inverse: NCHW data (if `c.nchw`) in NHWC.
fn to_nhwc(c: &Cfg, d: &[f64], h: usize, w: usize, ch: usize) -> Vec<f64> {
    if !c.nchw {
        return d.to_vec();
    }
    let mut o = vec![0.0; d.len()];
    for n in 0..c.n {
        for y in 0..h {
            for x in 0..w {
                for k in 0..ch {
                    o[((n * h + y) * w + x) * ch + k] = d[((n * ch + k) * h + y) * w + x];
                }
            }
        }
    }
    o
}

/// The three products of a convolution (forward, input gradient, filter gradient) with the
/// sums of absolute terms, in NHWC / HWIO, f64.
struct Refs {
    y: Vec<f64>,
    y_abs: Vec<f64>,
    dx: Vec<f64>,
    dx_abs: Vec<f64>,
    df: Vec<f64>,
    df_abs: Vec<f64>,
}

fn reference(c: &Cfg, x: &[f64], f: &[f64], dy: &[f64]) -> Refs {
    let (oh, ow, pt, pl) = c.out();
    let (g, kg) = (c.groups(), c.k / c.groups());
    let mut r = Refs {
        y: vec![0.0; c.n * oh * ow * c.k],
        y_abs: vec![0.0; c.n * oh * ow * c.k],
        dx: vec![0.0; x.len()],
        dx_abs: vec![0.0; x.len()],
        df: vec![0.0; f.len()],
        df_abs: vec![0.0; f.len()],
    };
    for n in 0..c.n {
        for oy in 0..oh {
            for ox in 0..ow {
                for fr in 0..c.r {
                    let iy = (oy * c.stride.0 + fr * c.dil.0) as isize - pt as isize;
                    if iy < 0 || iy >= c.h as isize {
                        continue;
                    }
                    for fs in 0..c.s {
                        let ix = (ox * c.stride.1 + fs * c.dil.1) as isize - pl as isize;
                        if ix < 0 || ix >= c.w as isize {
                            continue;
                        }
                        let (iy, ix) = (iy as usize, ix as usize);
                        for gi in 0..g {
                            for cl in 0..c.cg {
                                let xi = ((n * c.h + iy) * c.w + ix) * c.c + gi * c.cg + cl;
                                for kl in 0..kg {
                                    let k = gi * kg + kl;
                                    let fi = ((fr * c.s + fs) * c.cg + cl) * c.k + k;
                                    let yi = ((n * oh + oy) * ow + ox) * c.k + k;
                                    r.y[yi] += x[xi] * f[fi];
                                    r.y_abs[yi] += (x[xi] * f[fi]).abs();
                                    r.dx[xi] += dy[yi] * f[fi];
                                    r.dx_abs[xi] += (dy[yi] * f[fi]).abs();
                                    r.df[fi] += x[xi] * dy[yi];
                                    r.df_abs[fi] += (x[xi] * dy[yi]).abs();
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    r
}

/// Error bounds: (terms + splits) * 2^-24 * sum|terms|, plus the f16 rounding of the result.
fn bounds(want: &[f64], abs: &[f64], terms: usize, f16_out: bool) -> Vec<f64> {
    let gamma = (terms + 70) as f64 * 2f64.powi(-24);
    want.iter()
        .zip(abs)
        .map(|(&w, &a)| {
            let acc = gamma * a;
            if f16_out {
                w.abs() * 2f64.powi(-11) + acc * (1.0 + 2f64.powi(-11)) + 2f64.powi(-25)
            } else {
                acc
            }
        })
        .collect()
}

/// Runs `(op, attrs, args)` and checks the output's shape and its values against `want`
/// within `bounds(want, abs, terms, f16_out)`; `label` names the check in its messages.
fn run_within(
    (op, attrs, args): (&str, &Attrs, &[Arg]),
    shape: &[usize],
    (want, abs): (&[f64], &[f64]),
    (terms, f16_out): (usize, bool),
    label: &str,
) {
    let out = dev()
        .run(op, attrs, args)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(out[0].shape(), shape, "{label}: shape");
    let tol = bounds(want, abs, terms, f16_out);
    assert_within(&download(&out[0]), want, &tol, label);
}

/// Random data in [-1, 1), rounded to the dtype (f64 values and the device tensor).
fn data(
    rng: &mut rand::rngs::StdRng,
    n: usize,
    shape: &[usize],
    dtype: DType,
) -> (Vec<f64>, Tensor) {
    let v = rand_f32(rng, n, -1.0, 1.0);
    match dtype {
        DType::F16 => {
            let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            let t = dev().upload(&h, shape).unwrap();
            (h.iter().map(|x| x.to_f64()).collect(), t)
        }
        _ => {
            let t = dev().upload(&v, shape).unwrap();
            (v.iter().map(|&x| x as f64).collect(), t)
        }
    }
}

fn download(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F16 => t
            .download::<f16>()
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        _ => t
            .download::<f32>()
            .unwrap()
            .iter()
            .map(|&x| x as f64)
            .collect(),
    }
}

fn sizes(v: &[usize]) -> HostTensor {
    HostTensor::vec_i32(&v.iter().map(|&x| x as i32).collect::<Vec<_>>())
}

/// Runs the three Conv2D ops for `c` with extra attributes and checks them.
fn check_conv(c: &Cfg, dtype: DType, extra: &[(&str, AttrValue)], seed: u64) {
    let what = format!("{c:?} {dtype} {extra:?}");
    let mut rng = rng(seed);
    let (oh, ow, _, _) = c.out();
    let (xs, fsh, ys) = (c.x_shape(), [c.r, c.s, c.cg, c.k], c.y_shape());
    let nx = c.n * c.h * c.w * c.c;
    let ny = c.n * oh * ow * c.k;
    let (x, xt) = data(&mut rng, nx, &xs, dtype);
    let (f, ft) = data(&mut rng, fsh.iter().product(), &fsh, dtype);
    let (dy, dyt) = data(&mut rng, ny, &ys, dtype);
    // The reference works in NHWC: bring NCHW data over.
    let r = reference(
        c,
        &to_nhwc(c, &x, c.h, c.w, c.c),
        &f,
        &to_nhwc(c, &dy, oh, ow, c.k),
    );
    let mut attrs = c.attrs(dtype);
    for (k, v) in extra {
        attrs.set(k, v.clone());
    }
    let f16_out = dtype == DType::F16;

    let lay = |v: &[f64], h, w, ch| to_layout(c, v, h, w, ch);
    run_within(
        ("Conv2D", &attrs, &[Arg::from(&xt), Arg::from(&ft)]),
        &ys,
        (&lay(&r.y, oh, ow, c.k), &lay(&r.y_abs, oh, ow, c.k)),
        (c.r * c.s * c.cg, f16_out),
        &format!("Conv2D {what}"),
    );
    run_within(
        (
            "Conv2DBackpropInput",
            &attrs,
            &[Arg::from(&sizes(&xs)), Arg::from(&ft), Arg::from(&dyt)],
        ),
        &xs,
        (&lay(&r.dx, c.h, c.w, c.c), &lay(&r.dx_abs, c.h, c.w, c.c)),
        (c.r * c.s * (c.k / c.groups()), f16_out),
        &format!("Conv2DBackpropInput {what}"),
    );
    run_within(
        (
            "Conv2DBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&sizes(&fsh)), Arg::from(&dyt)],
        ),
        &fsh,
        (&r.df, &r.df_abs),
        (c.n * oh * ow, f16_out),
        &format!("Conv2DBackpropFilter {what}"),
    );
}

const fn nchw(mut c: Cfg) -> Cfg {
    c.nchw = true;
    c
}

const fn grouped(mut c: Cfg, cg: usize) -> Cfg {
    c.cg = cg;
    c
}

/// Configurations: batch 1-3, odd sizes, 1x1 / 3x3 / 5x5, strides 1-3, dilations 1-2, every
/// padding, both layouts, channel counts off the tile sizes.
const CONFIGS: &[Cfg] = &[
    cfg(1, (5, 5), 3, (3, 3), 4, (1, 1), (1, 1), Pad::Same),
    cfg(2, (7, 6), 5, (3, 3), 7, (2, 2), (1, 1), Pad::Valid),
    cfg(3, (9, 8), 4, (5, 5), 6, (1, 1), (1, 1), Pad::Same),
    cfg(2, (8, 9), 3, (3, 2), 5, (3, 2), (1, 1), Pad::Same),
    cfg(1, (11, 10), 6, (3, 3), 9, (1, 2), (2, 2), Pad::Valid),
    cfg(2, (9, 9), 3, (3, 3), 4, (2, 2), (2, 1), Pad::Same),
    cfg(
        1,
        (6, 7),
        5,
        (3, 3),
        3,
        (1, 1),
        (1, 1),
        Pad::Explicit(1, 2, 0, 3),
    ),
    cfg(
        2,
        (7, 7),
        4,
        (5, 3),
        5,
        (2, 3),
        (1, 2),
        Pad::Explicit(3, 0, 2, 1),
    ),
    // 1x1: plain products (stride 1, NHWC) and strided.
    cfg(2, (5, 7), 37, (1, 1), 33, (1, 1), (1, 1), Pad::Valid),
    cfg(3, (4, 3), 9, (1, 1), 70, (1, 1), (1, 1), Pad::Same),
    cfg(2, (7, 5), 6, (1, 1), 5, (2, 2), (1, 1), Pad::Same),
    cfg(
        1,
        (4, 4),
        3,
        (1, 1),
        2,
        (1, 1),
        (1, 1),
        Pad::Explicit(1, 0, 0, 2),
    ),
    // Channels past a tile, long reductions (split-K in the filter gradient).
    cfg(1, (6, 5), 70, (3, 3), 67, (1, 1), (1, 1), Pad::Same),
    cfg(3, (13, 12), 2, (3, 3), 3, (1, 1), (1, 1), Pad::Same),
    // A filter as large as the padded input; a one-pixel input.
    cfg(1, (3, 4), 2, (3, 4), 3, (1, 1), (1, 1), Pad::Valid),
    cfg(2, (1, 1), 3, (3, 3), 2, (1, 1), (1, 1), Pad::Same),
    // NCHW.
    nchw(cfg(2, (7, 6), 5, (3, 3), 7, (2, 2), (1, 1), Pad::Valid)),
    nchw(cfg(1, (9, 8), 4, (3, 3), 6, (1, 1), (2, 2), Pad::Same)),
    nchw(cfg(2, (5, 7), 12, (1, 1), 9, (1, 1), (1, 1), Pad::Valid)),
    nchw(cfg(
        1,
        (7, 7),
        3,
        (5, 3),
        4,
        (3, 2),
        (1, 1),
        Pad::Explicit(2, 1, 0, 1),
    )),
    // Grouped.
    grouped(cfg(2, (6, 5), 6, (3, 3), 9, (1, 1), (1, 1), Pad::Same), 2),
    grouped(cfg(1, (7, 6), 8, (3, 3), 4, (2, 1), (1, 1), Pad::Valid), 2),
    nchw(grouped(
        cfg(2, (5, 5), 6, (3, 3), 6, (1, 1), (1, 2), Pad::Same),
        3,
    )),
];

#[test]
fn conv2d_f32_configs() {
    for (i, c) in CONFIGS.iter().enumerate() {
        check_conv(c, DType::F32, &[], 100 + i as u64);
    }
}

#[test]
fn conv2d_f16_configs() {
    for (i, c) in CONFIGS.iter().enumerate().step_by(3) {
        check_conv(c, DType::F16, &[], 200 + i as u64);
    }
}

/// Every tile with and without forced split-K, both layouts, on shapes that are not multiples
/// of any tile.
#[test]
fn conv2d_tiles_and_splits() {
    let base = cfg(2, (9, 7), 11, (3, 3), 13, (2, 1), (1, 1), Pad::Same);
    let plain = cfg(2, (5, 6), 17, (1, 1), 35, (1, 1), (1, 1), Pad::Valid);
    let mut seed = 300;
    for tile in [
        "32x32x8_2x2",
        "64x64x8_4x4",
        "128x128x8_8x8",
        "128x32x8_8x2",
    ] {
        for splits in [1, 3] {
            for c in [base, nchw(base), plain] {
                for dtype in [DType::F32, DType::F16] {
                    if dtype == DType::F16 && splits == 1 && tile != "64x64x8_4x4" {
                        continue;
                    }
                    let extra = [
                        ("_tfwgpu_tile", AttrValue::Str(tile.into())),
                        ("_tfwgpu_splits", AttrValue::Int(splits)),
                    ];
                    check_conv(&c, dtype, &extra, seed);
                    seed += 1;
                }
            }
        }
    }
}

/// The GPU adapters' automatic path ("gpu"): 1x1 stride-1 NHWC float32 convolutions run on
/// the matmul family's vector kernels (channel counts multiples of 4), the filter gradient
/// with its pixel reduction split into equal chunks (a batch of products summed after);
/// other shapes (depths not multiples of 4, NCHW, float16, strides) keep the implicit GEMM.
#[test]
fn conv2d_1x1_on_matmul_kernels() {
    let configs = [
        // P = 189 pixels: no tile divides it.
        cfg(3, (9, 7), 12, (1, 1), 20, (1, 1), (1, 1), Pad::Valid),
        // P = 832 >= 512: the filter gradient splits the reduction (832 = 2 * 416).
        cfg(4, (16, 13), 8, (1, 1), 16, (1, 1), (1, 1), Pad::Same),
        // A deeper reduction (K = 132) and wider output.
        cfg(2, (5, 11), 132, (1, 1), 68, (1, 1), (1, 1), Pad::Valid),
        // Not multiples of 4, NCHW, strided: the implicit GEMM.
        cfg(2, (5, 6), 17, (1, 1), 35, (1, 1), (1, 1), Pad::Valid),
        nchw(cfg(2, (5, 6), 16, (1, 1), 36, (1, 1), (1, 1), Pad::Valid)),
        cfg(2, (8, 6), 16, (1, 1), 36, (2, 2), (1, 1), Pad::Same),
        // Windows on the vector shader (implicit.wgsl): 3x3 SAME; strided (the input
        // gradient keeps the implicit GEMM); dilated with explicit asymmetric padding; a
        // split filter gradient (832 pixels).
        cfg(2, (9, 7), 8, (3, 3), 12, (1, 1), (1, 1), Pad::Same),
        cfg(3, (9, 8), 4, (3, 3), 20, (2, 2), (1, 1), Pad::Same),
        cfg(
            2,
            (7, 9),
            12,
            (3, 2),
            8,
            (1, 1),
            (2, 1),
            Pad::Explicit(2, 0, 1, 3),
        ),
        cfg(4, (16, 13), 8, (3, 3), 16, (1, 1), (1, 1), Pad::Valid),
        // Input depth 3 (ResNet's first layer, 7x7 stride 2 SAME): the input gradient as a
        // product into columns (R*S*C = 147 padded to 148) and col2im; a dilated strided one.
        cfg(2, (11, 10), 3, (7, 7), 8, (2, 2), (1, 1), Pad::Same),
        cfg(3, (9, 10), 6, (3, 2), 12, (2, 3), (2, 1), Pad::Valid),
        // Input depth 3 at stride 1 and a 1x1 of depth 6 (columns for forward and filter
        // gradient too; 34 * 36 = 1224 pixels: a split filter gradient).
        cfg(2, (34, 18), 3, (3, 3), 8, (1, 1), (1, 1), Pad::Same),
        cfg(2, (5, 6), 6, (1, 1), 4, (1, 1), (1, 1), Pad::Valid),
    ];
    let mut seed = 350;
    for c in &configs {
        for dtype in [DType::F32, DType::F16] {
            let extra = [("_tfwgpu_tile", AttrValue::Str("gpu".into()))];
            check_conv(c, dtype, &extra, seed);
            seed += 1;
        }
    }
    // The columns in groups of images (`_tfwgpu_splits` = images per group): 3 images as 2 + 1.
    for group in [1, 2] {
        let extra = [
            ("_tfwgpu_tile", AttrValue::Str("gpu".into())),
            ("_tfwgpu_splits", AttrValue::Int(group)),
        ];
        check_conv(&configs[7], DType::F32, &extra, seed);
        check_conv(&configs[11], DType::F32, &extra, seed + 1);
        seed += 2;
    }
    // The im2col columns (input depth 3) in groups of images (`_tfwgpu_col_images`): the
    // forward pass writes each group's rows of y, the filter gradient sums every group's
    // split slices (612 pixels a group: 2 splits; forced 3 is not aligned, 2 is taken).
    let shallow = cfg(3, (34, 18), 3, (3, 3), 16, (1, 1), (1, 1), Pad::Same);
    let strided = cfg(4, (11, 10), 3, (7, 7), 8, (2, 2), (1, 1), Pad::Same);
    for (images, splits) in [(1, None), (2, None), (1, Some(3)), (3, Some(1))] {
        let mut extra = vec![
            ("_tfwgpu_tile", AttrValue::Str("gpu".into())),
            ("_tfwgpu_col_images", AttrValue::Int(images)),
        ];
        if let Some(s) = splits {
            extra.push(("_tfwgpu_splits", AttrValue::Int(s)));
        }
        check_conv(&shallow, DType::F32, &extra, seed);
        check_conv(&strided, DType::F32, &extra, seed + 1);
        seed += 2;
    }
    // Forced splits: a divisor of the 832 pixels (4), and one that is not (3: the heuristic).
    for splits in [4, 3, 1] {
        let extra = [
            ("_tfwgpu_tile", AttrValue::Str("gpu".into())),
            ("_tfwgpu_splits", AttrValue::Int(splits)),
        ];
        check_conv(&configs[1], DType::F32, &extra, seed);
        seed += 1;
    }
}

/// Checks the Winograd filter gradient (forced) of an NHWC float32 3x3 stride-1 `c` against
/// the f64 direct sum. Error model of the algorithm: each of the 16 transformed sums
/// U[e] = sum over 2x2 tiles t of Xh[e] Dh[e] is an fma reduction of T terms whose sizes are
/// bounded by W_x(t) W_d(t) (the sums of |x| over the tile's 4x4 window and of |dy| over its
/// 2x2 block: every transformed value is a +-1/2^j combination of them), and an output
/// element adds up to 9 of them: |error| <= 9 (T + 70) 2^-24 sum_t W_x(t) W_d(t). (Unlike
/// the direct sum's bound it involves the whole window: a small result can come out of
/// larger transformed terms that cancel.)
fn check_winograd(c: &Cfg, extra: &[(&str, AttrValue)], seed: u64) {
    let what = format!("{c:?} winograd {extra:?}");
    let mut rng = rng(seed);
    let (oh, ow, pt, pl) = c.out();
    let (xs, fsh, ys) = (c.x_shape(), [c.r, c.s, c.c, c.k], c.y_shape());
    let (x, xt) = data(&mut rng, c.n * c.h * c.w * c.c, &xs, DType::F32);
    let (f, ft) = data(&mut rng, fsh.iter().product(), &fsh, DType::F32);
    let (dy, dyt) = data(&mut rng, c.n * oh * ow * c.k, &ys, DType::F32);
    let r = reference(c, &x, &f, &dy);
    let mut attrs = c.attrs(DType::F32);
    attrs.set("_tfwgpu_tile", AttrValue::Str("winograd".into()));
    for (k, v) in extra {
        attrs.set(k, v.clone());
    }
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let tiles = c.n * th * tw;
    let mut wsum = vec![0.0f64; c.c * c.k];
    for n in 0..c.n {
        for ty in 0..th {
            for tx in 0..tw {
                let mut wx = vec![0.0f64; c.c];
                for u in 0..4 {
                    for v in 0..4 {
                        let iy = (2 * ty + u) as i64 - pt as i64;
                        let ix = (2 * tx + v) as i64 - pl as i64;
                        if iy < 0 || ix < 0 || iy >= c.h as i64 || ix >= c.w as i64 {
                            continue;
                        }
                        let b = ((n * c.h + iy as usize) * c.w + ix as usize) * c.c;
                        for ch in 0..c.c {
                            wx[ch] += x[b + ch].abs();
                        }
                    }
                }
                let mut wd = vec![0.0f64; c.k];
                for i in 0..2 {
                    for j in 0..2 {
                        let (oy, ox) = (2 * ty + i, 2 * tx + j);
                        if oy >= oh || ox >= ow {
                            continue;
                        }
                        let b = ((n * oh + oy) * ow + ox) * c.k;
                        for k in 0..c.k {
                            wd[k] += dy[b + k].abs();
                        }
                    }
                }
                for ch in 0..c.c {
                    for k in 0..c.k {
                        wsum[ch * c.k + k] += wx[ch] * wd[k];
                    }
                }
            }
        }
    }
    let gamma = 9.0 * (tiles + 70) as f64 * 2f64.powi(-24);
    let tol: Vec<f64> = (0..r.df.len())
        .map(|i| gamma * wsum[i % (c.c * c.k)])
        .collect();
    let df = dev()
        .run(
            "Conv2DBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&sizes(&fsh)), Arg::from(&dyt)],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(df[0].shape(), fsh.as_slice(), "{what}");
    assert_within(&download(&df[0]), &r.df, &tol, &what);

    // F(2x2, 3x3) for the forward pass (x with f) and the input gradient (dy with f flipped,
    // padding 2 - pt, 2 - pl): each of the 16 transformed sums M[e] adds Cin products bounded
    // by W(t, ci) Gabs(ci, co) (W: the sum of |input| over the tile's 4x4 window, Gabs: the
    // sum of |f| over the 9 taps), an output element adds up to 9 of them.
    let corr_bound = |inp: &[f64],
                      (ih, iw, ci): (usize, usize, usize),
                      (h_out, w_out, co): (usize, usize, usize),
                      (qt, ql): (usize, usize),
                      gabs: &dyn Fn(usize, usize) -> f64| {
        let gamma = 9.0 * (ci + 70) as f64 * 2f64.powi(-24);
        let mut tol = vec![0.0f64; c.n * h_out * w_out * co];
        for n in 0..c.n {
            for ty in 0..h_out.div_ceil(2) {
                for tx in 0..w_out.div_ceil(2) {
                    let mut wx = vec![0.0f64; ci];
                    for u in 0..4 {
                        for v in 0..4 {
                            let iy = (2 * ty + u) as i64 - qt as i64;
                            let ix = (2 * tx + v) as i64 - ql as i64;
                            if iy < 0 || ix < 0 || iy >= ih as i64 || ix >= iw as i64 {
                                continue;
                            }
                            let b = ((n * ih + iy as usize) * iw + ix as usize) * ci;
                            for a in 0..ci {
                                wx[a] += inp[b + a].abs();
                            }
                        }
                    }
                    for o in 0..co {
                        let sum: f64 = (0..ci).map(|a| wx[a] * gabs(a, o)).sum();
                        for i in 0..2 {
                            for j in 0..2 {
                                let (oy, ox) = (2 * ty + i, 2 * tx + j);
                                if oy < h_out && ox < w_out {
                                    tol[((n * h_out + oy) * w_out + ox) * co + o] = gamma * sum;
                                }
                            }
                        }
                    }
                }
            }
        }
        tol
    };
    let taps =
        |a: usize, b: usize| -> f64 { (0..9).map(|rs| f[(rs * c.c + a) * c.k + b].abs()).sum() };
    let y = dev()
        .run("Conv2D", &attrs, &[Arg::from(&xt), Arg::from(&ft)])
        .unwrap_or_else(|e| panic!("Conv2D {what}: {e}"));
    let tol = corr_bound(&x, (c.h, c.w, c.c), (oh, ow, c.k), (pt, pl), &taps);
    assert_within(&download(&y[0]), &r.y, &tol, &format!("Conv2D {what}"));
    if pt <= 2 && pl <= 2 {
        let dx = dev()
            .run(
                "Conv2DBackpropInput",
                &attrs,
                &[Arg::from(&sizes(&xs)), Arg::from(&ft), Arg::from(&dyt)],
            )
            .unwrap_or_else(|e| panic!("Conv2DBackpropInput {what}: {e}"));
        let tol = corr_bound(
            &dy,
            (oh, ow, c.k),
            (c.h, c.w, c.c),
            (2 - pt, 2 - pl),
            &|k, ch| taps(ch, k),
        );
        assert_within(
            &download(&dx[0]),
            &r.dx,
            &tol,
            &format!("Conv2DBackpropInput {what}"),
        );
    }
}

/// The Winograd F(3x3, 2x2) filter gradient (`conv/winograd.rs`, forced by `_tfwgpu_tile`
/// "winograd"): odd and even output sizes, SAME / VALID / asymmetric explicit padding, one
/// output pixel, channel counts 4..20, chunks of the tiles (forced splits that divide them,
/// one that does not: the heuristic) and groups of images. The other passes with the tile
/// forced take the automatic path (checked once against the direct bounds).
#[test]
fn conv2d_winograd_paths() {
    let configs = [
        cfg(2, (9, 7), 8, (3, 3), 12, (1, 1), (1, 1), Pad::Same),
        cfg(3, (8, 8), 4, (3, 3), 8, (1, 1), (1, 1), Pad::Valid),
        cfg(
            1,
            (5, 6),
            16,
            (3, 3),
            20,
            (1, 1),
            (1, 1),
            Pad::Explicit(2, 0, 1, 3),
        ),
        cfg(4, (16, 13), 8, (3, 3), 16, (1, 1), (1, 1), Pad::Same),
        cfg(1, (3, 3), 4, (3, 3), 4, (1, 1), (1, 1), Pad::Valid),
    ];
    let mut seed = 800;
    for c in &configs {
        check_winograd(c, &[], seed);
        seed += 1;
    }
    // 4 images of 8 x 7 tiles: splits 1, 4 (divisors of 56 and 224), 5 (not: heuristic), in
    // 1, 2 or 4 groups of images.
    for (splits, images) in [(1, 4), (4, 1), (5, 2), (4, 2)] {
        let extra = [
            ("_tfwgpu_splits", AttrValue::Int(splits)),
            ("_tfwgpu_col_images", AttrValue::Int(images)),
        ];
        check_winograd(&configs[3], &extra, seed);
        seed += 1;
    }
}

/// The CPU-adapter tiles (`conv/cpu.rs`: float32, NHWC, one group), each forced, with and
/// without a split batch in the filter gradient: scalar loads (depths not multiples of 4),
/// vector loads (multiples of 4), strides, dilations, explicit padding, 1x1. Skipped, visibly,
/// on devices without subgroups of a fixed size.
#[test]
fn conv2d_cpu_tiles() {
    let configs = [
        cfg(2, (9, 7), 11, (3, 3), 13, (2, 1), (1, 1), Pad::Same),
        cfg(
            3,
            (7, 6),
            8,
            (3, 2),
            12,
            (1, 2),
            (2, 1),
            Pad::Explicit(2, 0, 1, 3),
        ),
        cfg(2, (5, 6), 17, (1, 1), 36, (1, 1), (1, 1), Pad::Valid),
        cfg(5, (6, 5), 4, (3, 3), 20, (2, 2), (1, 1), Pad::Valid),
    ];
    let mut seed = 400;
    for tile in CPU_CONV_TILES.iter().map(|t| t.name) {
        let extra = [("_tfwgpu_tile", AttrValue::Str(tile.into()))];
        let x = dev().upload(&[0.0f32; 36], &[1, 3, 3, 4]).unwrap();
        let f = dev().upload(&[0.0f32; 16], &[1, 1, 4, 4]).unwrap();
        let mut at = Attrs::new()
            .with("strides", AttrValue::Ints(vec![1; 4]))
            .with("padding", AttrValue::Str("VALID".into()));
        at.set(extra[0].0, extra[0].1.clone());
        match dev().run("Conv2D", &at, &[Arg::from(&x), Arg::from(&f)]) {
            Err(Error::Unimplemented(e)) => {
                eprintln!("SKIPPED {tile}: {e}");
                continue;
            }
            r => {
                r.unwrap();
            }
        }
        for splits in [1, 3] {
            for c in &configs {
                let extra = [
                    ("_tfwgpu_tile", AttrValue::Str(tile.into())),
                    ("_tfwgpu_splits", AttrValue::Int(splits)),
                ];
                check_conv(c, DType::F32, &extra, seed);
                seed += 1;
            }
        }
    }
}

#[test]
fn conv2d_backprop_input_two_sizes() {
    // input_sizes of 2 values: (rows, columns); batch and depth come from the other inputs.
    let c = cfg(2, (6, 7), 3, (3, 3), 4, (2, 2), (1, 1), Pad::Same);
    let mut rng = rng(400);
    let (oh, ow, _, _) = c.out();
    let (_, ft) = data(&mut rng, 3 * 3 * 3 * 4, &[3, 3, 3, 4], DType::F32);
    let (_, dyt) = data(&mut rng, 2 * oh * ow * 4, &c.y_shape(), DType::F32);
    let attrs = c.attrs(DType::F32);
    let full = dev()
        .run(
            "Conv2DBackpropInput",
            &attrs,
            &[
                Arg::from(&sizes(&c.x_shape())),
                Arg::from(&ft),
                Arg::from(&dyt),
            ],
        )
        .unwrap();
    let two = dev()
        .run(
            "Conv2DBackpropInput",
            &attrs,
            &[Arg::from(&sizes(&[6, 7])), Arg::from(&ft), Arg::from(&dyt)],
        )
        .unwrap();
    assert_eq!(two[0].shape(), &[2, 6, 7, 3]);
    assert_eq!(
        two[0].download::<f32>().unwrap(),
        full[0].download::<f32>().unwrap()
    );
}

#[test]
fn conv2d_empty() {
    let d = dev();
    // Batch 0: empty output; its filter gradient is zero.
    let c = cfg(0, (5, 5), 3, (3, 3), 4, (1, 1), (1, 1), Pad::Same);
    let attrs = c.attrs(DType::F32);
    let x = d.upload::<f32>(&[], &[0, 5, 5, 3]).unwrap();
    let f = d.upload(&[1.0f32; 108], &[3, 3, 3, 4]).unwrap();
    let y = d
        .run("Conv2D", &attrs, &[Arg::from(&x), Arg::from(&f)])
        .unwrap();
    assert_eq!(y[0].shape(), &[0, 5, 5, 4]);
    let dy = d.upload::<f32>(&[], &[0, 5, 5, 4]).unwrap();
    for dtype in [DType::F32, DType::F16] {
        let (x, dy) = if dtype == DType::F16 {
            (
                d.upload::<f16>(&[], &[0, 5, 5, 3]).unwrap(),
                d.upload::<f16>(&[], &[0, 5, 5, 4]).unwrap(),
            )
        } else {
            (
                d.upload::<f32>(&[], &[0, 5, 5, 3]).unwrap(),
                d.upload::<f32>(&[], &[0, 5, 5, 4]).unwrap(),
            )
        };
        let df = d
            .run(
                "Conv2DBackpropFilter",
                &c.attrs(dtype),
                &[
                    Arg::from(&x),
                    Arg::from(&sizes(&[3, 3, 3, 4])),
                    Arg::from(&dy),
                ],
            )
            .unwrap();
        assert_eq!(df[0].shape(), &[3, 3, 3, 4]);
        assert!(download(&df[0]).iter().all(|&v| v == 0.0), "{dtype}");
    }
    let dx = d
        .run(
            "Conv2DBackpropInput",
            &attrs,
            &[
                Arg::from(&sizes(&[0, 5, 5, 3])),
                Arg::from(&f),
                Arg::from(&dy),
            ],
        )
        .unwrap();
    assert_eq!(dx[0].shape(), &[0, 5, 5, 3]);
    // No output channels.
    let x = d.upload(&[1.0f32; 75], &[1, 5, 5, 3]).unwrap();
    let f0 = d.upload::<f32>(&[], &[3, 3, 3, 0]).unwrap();
    let y = d
        .run("Conv2D", &attrs, &[Arg::from(&x), Arg::from(&f0)])
        .unwrap();
    assert_eq!(y[0].shape(), &[1, 5, 5, 0]);
}

#[test]
fn conv2d_nan_and_inf_propagate() {
    let d = dev();
    let c = cfg(1, (4, 4), 2, (3, 3), 2, (1, 1), (1, 1), Pad::Valid);
    let mut x = vec![0.5f32; 32];
    x[0] = f32::NAN; // pixel (0, 0), channel 0: only output (0, 0) sees it
    x[2 * 15 + 1] = f32::INFINITY; // pixel (3, 3), channel 1: only output (1, 1)
    let f: Vec<f32> = (0..36).map(|i| 0.25 + (i % 5) as f32 * 0.125).collect();
    let xt = d.upload(&x, &[1, 4, 4, 2]).unwrap();
    let ft = d.upload(&f, &[3, 3, 2, 2]).unwrap();
    let y = d
        .run(
            "Conv2D",
            &c.attrs(DType::F32),
            &[Arg::from(&xt), Arg::from(&ft)],
        )
        .unwrap()[0]
        .download::<f32>()
        .unwrap();
    assert!(y[0].is_nan() && y[1].is_nan(), "{y:?}");
    assert!(y[6] == f32::INFINITY && y[7] == f32::INFINITY, "{y:?}");
    assert!(y[2].is_finite() && y[4].is_finite(), "{y:?}");
}

// ---------------------------------------------------------------- depthwise

/// A depthwise convolution: input [n, h, w, c], filter [r, s, c, mult].
fn check_depthwise(c: &Cfg, mult: usize, dtype: DType, extra: &[(&str, AttrValue)], seed: u64) {
    // The same arithmetic as a grouped convolution with c groups of one channel (the filter
    // [r, s, c, mult] has the memory of [r, s, 1, c * mult]).
    let g = Cfg {
        cg: 1,
        k: c.c * mult,
        ..*c
    };
    let what = format!("depthwise {c:?} x{mult} {dtype} {extra:?}");
    let mut rng = rng(seed);
    let (oh, ow, _, _) = g.out();
    let (xs, fsh, ys) = (g.x_shape(), [c.r, c.s, c.c, mult], g.y_shape());
    let (x, xt) = data(&mut rng, c.n * c.h * c.w * c.c, &xs, dtype);
    let (f, ft) = data(&mut rng, c.r * c.s * c.c * mult, &fsh, dtype);
    let (dy, dyt) = data(&mut rng, c.n * oh * ow * g.k, &ys, dtype);
    let r = reference(
        &g,
        &to_nhwc(c, &x, c.h, c.w, c.c),
        &f,
        &to_nhwc(c, &dy, oh, ow, g.k),
    );
    let mut attrs = g.attrs(dtype);
    for (k, v) in extra {
        attrs.set(k, v.clone());
    }
    let f16_out = dtype == DType::F16;
    let lay = |v: &[f64], h, w, ch| to_layout(&g, v, h, w, ch);
    run_within(
        (
            "DepthwiseConv2dNative",
            &attrs,
            &[Arg::from(&xt), Arg::from(&ft)],
        ),
        &ys,
        (&lay(&r.y, oh, ow, g.k), &lay(&r.y_abs, oh, ow, g.k)),
        (c.r * c.s, f16_out),
        &format!("forward {what}"),
    );
    run_within(
        (
            "DepthwiseConv2dNativeBackpropInput",
            &attrs,
            &[Arg::from(&sizes(&xs)), Arg::from(&ft), Arg::from(&dyt)],
        ),
        &xs,
        (&lay(&r.dx, c.h, c.w, c.c), &lay(&r.dx_abs, c.h, c.w, c.c)),
        (c.r * c.s * mult, f16_out),
        &format!("input gradient {what}"),
    );
    run_within(
        (
            "DepthwiseConv2dNativeBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&sizes(&fsh)), Arg::from(&dyt)],
        ),
        &fsh,
        (&r.df, &r.df_abs),
        (c.n * oh * ow, f16_out),
        &format!("filter gradient {what}"),
    );
}

const DW_CONFIGS: &[(Cfg, usize)] = &[
    // Multiplier 1, channels a multiple of 4, NHWC: the 4-channel kernel for the forward pass
    // (strided too) and the stride-1 input gradient; the vector filter gradient (filters up
    // to 3x3).
    (cfg(2, (9, 7), 8, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
    (cfg(3, (8, 9), 12, (3, 2), 0, (2, 2), (1, 1), Pad::Same), 1),
    (cfg(1, (6, 7), 4, (5, 3), 0, (1, 1), (1, 1), Pad::Valid), 1),
    (cfg(1, (5, 5), 3, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
    (cfg(2, (7, 6), 5, (3, 3), 0, (2, 2), (1, 1), Pad::Valid), 2),
    (cfg(3, (9, 8), 4, (5, 5), 0, (1, 1), (1, 1), Pad::Same), 3),
    (cfg(2, (8, 9), 7, (3, 2), 0, (3, 3), (1, 1), Pad::Same), 1),
    (
        cfg(
            1,
            (6, 7),
            2,
            (3, 3),
            0,
            (1, 1),
            (1, 1),
            Pad::Explicit(1, 2, 0, 3),
        ),
        2,
    ),
    (cfg(2, (4, 4), 67, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
    (cfg(1, (3, 3), 3, (1, 1), 0, (2, 2), (1, 1), Pad::Valid), 4),
    (
        nchw(cfg(2, (7, 6), 5, (3, 3), 0, (2, 2), (1, 1), Pad::Valid)),
        2,
    ),
    (
        nchw(cfg(1, (9, 8), 3, (5, 3), 0, (1, 1), (1, 1), Pad::Same)),
        1,
    ),
    (
        nchw(cfg(
            1,
            (6, 6),
            4,
            (3, 3),
            0,
            (3, 3),
            (1, 1),
            Pad::Explicit(2, 0, 1, 1),
        )),
        3,
    ),
    // The 4-channel forward pass at stride 1: widths of 9, 10 and 8 output columns, a 2x2
    // filter, asymmetric explicit padding.
    (cfg(2, (5, 9), 8, (2, 2), 0, (1, 1), (1, 1), Pad::Same), 1),
    (cfg(1, (6, 10), 4, (3, 3), 0, (1, 1), (1, 1), Pad::Valid), 1),
    (
        cfg(
            2,
            (5, 8),
            12,
            (3, 3),
            0,
            (1, 1),
            (1, 1),
            Pad::Explicit(1, 2, 0, 3),
        ),
        1,
    ),
];

/// The vector filter gradient (`depthwise_bwdf.wgsl`: multiplier 1, NHWC, channels a multiple
/// of 4, filters up to 3x3): channel counts below, at and above a workgroup's 64 vectors (one
/// to 256 lanes of positions), strides, VALID / explicit padding, 1x1 and 2x3 filters, many
/// positions (split), and forced splits (1, 7, more splits than positions).
#[test]
fn depthwise_bwd_filter_vec4() {
    let configs = [
        (cfg(3, (17, 15), 4, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
        (
            cfg(2, (9, 11), 20, (3, 3), 0, (2, 2), (1, 1), Pad::Valid),
            1,
        ),
        (cfg(1, (5, 6), 264, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
        (
            cfg(2, (7, 6), 1028, (2, 3), 0, (2, 2), (1, 1), Pad::Same),
            1,
        ),
        (cfg(2, (6, 7), 8, (1, 1), 0, (1, 1), (1, 1), Pad::Valid), 1),
        (
            cfg(
                2,
                (8, 7),
                12,
                (3, 2),
                0,
                (1, 1),
                (1, 1),
                Pad::Explicit(2, 0, 1, 1),
            ),
            1,
        ),
        (cfg(4, (40, 33), 8, (3, 3), 0, (1, 1), (1, 1), Pad::Same), 1),
    ];
    let mut seed = 750;
    for (c, mult) in &configs {
        check_depthwise(c, *mult, DType::F32, &[], seed);
        seed += 1;
    }
    for splits in [1, 7, 1000] {
        let extra = [("_tfwgpu_splits", AttrValue::Int(splits))];
        check_depthwise(&configs[1].0, 1, DType::F32, &extra, seed);
        check_depthwise(&configs[6].0, 1, DType::F32, &extra, seed + 1);
        seed += 2;
    }
}

#[test]
fn depthwise_f32_configs() {
    for (i, (c, mult)) in DW_CONFIGS.iter().enumerate() {
        check_depthwise(c, *mult, DType::F32, &[], 500 + i as u64);
    }
}

#[test]
fn depthwise_f16_and_splits() {
    for (i, (c, mult)) in DW_CONFIGS.iter().enumerate().step_by(2) {
        check_depthwise(c, *mult, DType::F16, &[], 600 + i as u64);
    }
    // Forced splits of the filter gradient's positions.
    for (i, &(c, mult)) in [DW_CONFIGS[4], DW_CONFIGS[10]].iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            let extra = [("_tfwgpu_splits", AttrValue::Int(5))];
            check_depthwise(&c, mult, dtype, &extra, 700 + i as u64);
        }
    }
}

// ---------------------------------------------------------------- validation

fn err(op: &str, attrs: &Attrs, args: &[Arg]) -> Error {
    match dev().run(op, attrs, args) {
        Ok(_) => panic!("{op} should fail"),
        Err(e) => e,
    }
}

#[test]
fn validation_follows_tensorflow() {
    let d = dev();
    let c = cfg(1, (5, 5), 4, (3, 3), 6, (1, 1), (1, 1), Pad::Same);
    let x = d.upload(&[0.0f32; 100], &[1, 5, 5, 4]).unwrap();
    let f = d.upload(&[0.0f32; 9 * 4 * 6], &[3, 3, 4, 6]).unwrap();
    let base = c.attrs(DType::F32);
    let build = |attrs: &Attrs| match d.kernel("Conv2D", attrs) {
        Ok(_) => panic!("kernel should not build"),
        Err(e) => e.to_string(),
    };
    let e = build(
        &base
            .clone()
            .with("strides", AttrValue::Ints(vec![2, 1, 1, 1])),
    );
    assert!(e.contains("strides in the batch and depth"), "{e}");
    let e = build(&base.clone().with("strides", AttrValue::Ints(vec![1, 1, 1])));
    assert!(e.contains("4 dimensions"), "{e}");
    let e = build(
        &base
            .clone()
            .with("strides", AttrValue::Ints(vec![1, 0, 1, 1])),
    );
    assert!(e.contains("larger than 0"), "{e}");
    let e = build(
        &base
            .clone()
            .with("dilations", AttrValue::Ints(vec![1, 1, 1, 2])),
    );
    assert!(e.contains("dilations in the batch and depth"), "{e}");
    let e = build(
        &base
            .clone()
            .with("data_format", AttrValue::Str("HWNC".into())),
    );
    assert!(e.contains("Invalid data format"), "{e}");
    let e = build(
        &base
            .clone()
            .with("explicit_paddings", AttrValue::Ints(vec![0; 8])),
    );
    assert!(e.contains("must be empty"), "{e}");
    let ex = base
        .clone()
        .with("padding", AttrValue::Str("EXPLICIT".into()));
    let e = build(
        &ex.clone()
            .with("explicit_paddings", AttrValue::Ints(vec![0; 6])),
    );
    assert!(e.contains("8 values"), "{e}");
    let e = build(&ex.clone().with(
        "explicit_paddings",
        AttrValue::Ints(vec![1, 0, 0, 0, 0, 0, 0, 0]),
    ));
    assert!(e.contains("batch or depth"), "{e}");
    let e = build(&ex.with(
        "explicit_paddings",
        AttrValue::Ints(vec![0, 0, -1, 0, 0, 0, 0, 0]),
    ));
    assert!(e.contains("nonnegative"), "{e}");
    let dw = d.kernel(
        "DepthwiseConv2dNative",
        &base
            .clone()
            .with("dilations", AttrValue::Ints(vec![1, 2, 2, 1])),
    );
    assert!(matches!(dw, Err(Error::Unimplemented(_))));
    let dw = d.kernel(
        "DepthwiseConv2dNative",
        &base
            .clone()
            .with("strides", AttrValue::Ints(vec![1, 1, 2, 1])),
    );
    assert!(
        dw.err()
            .unwrap()
            .to_string()
            .contains("equal length strides")
    );

    // Shapes.
    let f3 = d.upload(&[0.0f32; 9 * 3 * 6], &[3, 3, 3, 6]).unwrap();
    let e = err("Conv2D", &base, &[Arg::from(&x), Arg::from(&f3)]).to_string();
    assert!(
        e.contains("evenly divisible by filter depth: 4 vs 3"),
        "{e}"
    );
    let big = d.upload(&[0.0f32; 7 * 3 * 4 * 6], &[7, 3, 4, 6]).unwrap();
    let valid = base.clone().with("padding", AttrValue::Str("VALID".into()));
    let e = err("Conv2D", &valid, &[Arg::from(&x), Arg::from(&big)]).to_string();
    assert!(e.contains("output size would be negative"), "{e}");
    let x3 = d.upload(&[0.0f32; 100], &[5, 5, 4]).unwrap();
    let e = err("Conv2D", &base, &[Arg::from(&x3), Arg::from(&f)]).to_string();
    assert!(e.contains("4-dimensional"), "{e}");
    let xh = d.upload(&[f16::ZERO; 100], &[1, 5, 5, 4]).unwrap();
    let e = err("Conv2D", &base, &[Arg::from(&xh), Arg::from(&f)]).to_string();
    assert!(e.contains("must match"), "{e}");
    // out_backprop of the wrong size.
    let dy = d.upload(&[0.0f32; 4 * 5 * 6], &[1, 4, 5, 6]).unwrap();
    let e = err(
        "Conv2DBackpropInput",
        &base,
        &[
            Arg::from(&sizes(&[1, 5, 5, 4])),
            Arg::from(&f),
            Arg::from(&dy),
        ],
    )
    .to_string();
    assert!(
        e.contains("Size of out_backprop doesn't match computed: actual = 4, computed = 5"),
        "{e}"
    );
    let e = err(
        "Conv2DBackpropInput",
        &base,
        &[Arg::from(&sizes(&[1, 5, 5])), Arg::from(&f), Arg::from(&dy)],
    )
    .to_string();
    assert!(e.contains("4 values or 2 values"), "{e}");
    let e = err(
        "Conv2DBackpropFilter",
        &base,
        &[
            Arg::from(&x),
            Arg::from(&sizes(&[3, 3, 4, 6])),
            Arg::from(&dy),
        ],
    )
    .to_string();
    assert!(e.contains("Size of out_backprop"), "{e}");
    let dy5 = d.upload(&[0.0f32; 25 * 5], &[1, 5, 5, 5]).unwrap();
    let e = err(
        "Conv2DBackpropFilter",
        &base,
        &[
            Arg::from(&x),
            Arg::from(&sizes(&[3, 3, 4, 6])),
            Arg::from(&dy5),
        ],
    )
    .to_string();
    assert!(e.contains("same out_depth"), "{e}");
    let e = err(
        "DepthwiseConv2dNative",
        &base,
        &[Arg::from(&x), Arg::from(&f3)],
    )
    .to_string();
    assert!(e.contains("same depth: 4 vs 3"), "{e}");
    // Integer types have no kernel.
    let e = d
        .kernel(
            "Conv2D",
            &base.clone().with("T", AttrValue::Type(DType::I32)),
        )
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e}");
}
