//! pool family: MaxPool(V2), AvgPool, MaxPoolGrad(V2), AvgPoolGrad, MaxPoolGradGrad(V2)
//! against plain-Rust references of TensorFlow's CPU kernels (window scan order, argmax on ties
//! and NaN, f16 rounding after every step). The references sum in TensorFlow's order, so f32
//! results are compared exactly except where the shader divides (AvgPool, AvgPoolGrad:
//! WGSL's division may be off by 2.5 ULP on some drivers).
pub(crate) mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, HostTensor, Tensor, f16};

#[derive(Clone, Copy, Debug)]
enum Pad {
    Same,
    Valid,
    /// (top, bottom, left, right)
    Explicit([usize; 4]),
}

#[derive(Clone, Copy, Debug)]
struct Cfg {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    pad: Pad,
    nchw: bool,
}

impl Cfg {
    fn out_hw(&self) -> (usize, usize, usize, usize) {
        let dim = |i: usize, k: usize, s: usize, b: usize, a: usize| -> (usize, usize) {
            match self.pad {
                Pad::Valid => ((i + s).saturating_sub(k) / s, 0),
                Pad::Same => {
                    let o = i.div_ceil(s);
                    let need = ((o.max(1) - 1) * s + k).saturating_sub(i);
                    (o, need / 2)
                }
                Pad::Explicit(_) => ((i + b + a + s).saturating_sub(k) / s, b),
            }
        };
        let p = match self.pad {
            Pad::Explicit(p) => p,
            _ => [0; 4],
        };
        let (oh, pt) = dim(self.h, self.kh, self.sh, p[0], p[1]);
        let (ow, pl) = dim(self.w, self.kw, self.sw, p[2], p[3]);
        (oh, ow, pt, pl)
    }

    fn shape(&self, hh: usize, ww: usize) -> Vec<usize> {
        if self.nchw {
            vec![self.n, self.c, hh, ww]
        } else {
            vec![self.n, hh, ww, self.c]
        }
    }

    fn in_shape(&self) -> Vec<usize> {
        self.shape(self.h, self.w)
    }

    fn out_shape(&self) -> Vec<usize> {
        let (oh, ow, _, _) = self.out_hw();
        self.shape(oh, ow)
    }

    fn at(&self, n: usize, y: usize, x: usize, ch: usize, hh: usize, ww: usize) -> usize {
        if self.nchw {
            ((n * self.c + ch) * hh + y) * ww + x
        } else {
            ((n * hh + y) * ww + x) * self.c + ch
        }
    }

    /// In-bounds window of output (oy, ox): rows y0..y1, cols x0..x1.
    fn window(&self, oy: usize, ox: usize) -> (usize, usize, usize, usize) {
        let (_, _, pt, pl) = self.out_hw();
        let ys = (oy * self.sh) as i64 - pt as i64;
        let xs = (ox * self.sw) as i64 - pl as i64;
        let ye = (ys + self.kh as i64).min(self.h as i64);
        let xe = (xs + self.kw as i64).min(self.w as i64);
        (
            ys.max(0) as usize,
            ye.max(0) as usize,
            xs.max(0) as usize,
            xe.max(0) as usize,
        )
    }

    /// Every (n, oy, ox, ch) of the output, with its flat index.
    fn outputs(&self) -> Vec<(usize, usize, usize, usize, usize)> {
        let (oh, ow, _, _) = self.out_hw();
        let mut v = vec![];
        for n in 0..self.n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..self.c {
                        v.push((self.at(n, oy, ox, ch, oh, ow), n, oy, ox, ch));
                    }
                }
            }
        }
        v
    }

    fn attrs(&self, dtype: DType) -> Attrs {
        let (k, s) = if self.nchw {
            (
                vec![1, 1, self.kh as i64, self.kw as i64],
                vec![1, 1, self.sh as i64, self.sw as i64],
            )
        } else {
            (
                vec![1, self.kh as i64, self.kw as i64, 1],
                vec![1, self.sh as i64, self.sw as i64, 1],
            )
        };
        let mut a = Attrs::new()
            .with("T", AttrValue::Type(dtype))
            .with("ksize", AttrValue::Ints(k))
            .with("strides", AttrValue::Ints(s))
            .with(
                "data_format",
                AttrValue::Str(if self.nchw { "NCHW" } else { "NHWC" }.into()),
            );
        let pad = match self.pad {
            Pad::Same => "SAME",
            Pad::Valid => "VALID",
            Pad::Explicit(p) => {
                let p: Vec<i64> = p.iter().map(|&v| v as i64).collect();
                let e = if self.nchw {
                    vec![0, 0, 0, 0, p[0], p[1], p[2], p[3]]
                } else {
                    vec![0, 0, p[0], p[1], p[2], p[3], 0, 0]
                };
                a.set("explicit_paddings", AttrValue::Ints(e));
                "EXPLICIT"
            }
        };
        a.set("padding", AttrValue::Str(pad.into()));
        a
    }

    fn name(&self) -> String {
        format!("{self:?}")
    }
}

fn rnd(half: bool, v: f32) -> f32 {
    if half { rh(v) } else { v }
}

fn ref_max(cfg: &Cfg, x: &[f32], lowest: f32) -> Vec<f32> {
    let mut out = vec![0.0; cfg.out_shape().iter().product()];
    for (o, n, oy, ox, ch) in cfg.outputs() {
        let (y0, y1, x0, x1) = cfg.window(oy, ox);
        let mut m = lowest;
        for y in y0..y1 {
            for xx in x0..x1 {
                let v = x[cfg.at(n, y, xx, ch, cfg.h, cfg.w)];
                if !v.is_nan() && m < v {
                    m = v;
                }
            }
        }
        out[o] = m;
    }
    out
}

/// TensorFlow's argmax: first element, replaced only by a strictly greater one.
fn ref_argmax(cfg: &Cfg, x: &[f32], n: usize, oy: usize, ox: usize, ch: usize) -> Option<usize> {
    let (y0, y1, x0, x1) = cfg.window(oy, ox);
    let mut best: Option<(usize, f32)> = None;
    for y in y0..y1 {
        for xx in x0..x1 {
            let i = cfg.at(n, y, xx, ch, cfg.h, cfg.w);
            let v = x[i];
            match best {
                None => best = Some((i, v)),
                Some((_, b)) if b < v => best = Some((i, v)),
                _ => {}
            }
        }
    }
    best.map(|b| b.0)
}

fn ref_max_grad(cfg: &Cfg, x: &[f32], g: &[f32], half: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    // TensorFlow adds in output order.
    let mut outs = cfg.outputs();
    outs.sort_by_key(|&(_, n, oy, ox, ch)| (n, oy, ox, ch));
    for (o, n, oy, ox, ch) in outs {
        if let Some(i) = ref_argmax(cfg, x, n, oy, ox, ch) {
            out[i] = rnd(half, out[i] + g[o]);
        }
    }
    out
}

fn ref_avg(cfg: &Cfg, x: &[f32], half: bool) -> Vec<f32> {
    let mut out = vec![0.0; cfg.out_shape().iter().product()];
    for (o, n, oy, ox, ch) in cfg.outputs() {
        let (y0, y1, x0, x1) = cfg.window(oy, ox);
        let mut s = 0.0f32;
        for y in y0..y1 {
            for xx in x0..x1 {
                s = rnd(half, s + x[cfg.at(n, y, xx, ch, cfg.h, cfg.w)]);
            }
        }
        out[o] = rnd(half, s / ((y1 - y0) * (x1 - x0)) as f32);
    }
    out
}

fn ref_avg_grad(cfg: &Cfg, g: &[f32], half: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; cfg.in_shape().iter().product()];
    let mut outs = cfg.outputs();
    outs.sort_by_key(|&(_, n, oy, ox, ch)| (n, oy, ox, ch));
    for (o, n, oy, ox, ch) in outs {
        let (y0, y1, x0, x1) = cfg.window(oy, ox);
        let coeff = rnd(half, (1.0 / ((y1 - y0) * (x1 - x0)) as f64) as f32);
        for y in y0..y1 {
            for xx in x0..x1 {
                let i = cfg.at(n, y, xx, ch, cfg.h, cfg.w);
                out[i] = rnd(half, out[i] + rnd(half, g[o] * coeff));
            }
        }
    }
    out
}

fn ref_grad_grad(cfg: &Cfg, x: &[f32], y: &[f32], gg: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; y.len()];
    for (o, n, oy, ox, ch) in cfg.outputs() {
        let (y0, y1, x0, x1) = cfg.window(oy, ox);
        'scan: for yy in y0..y1 {
            for xx in x0..x1 {
                let i = cfg.at(n, yy, xx, ch, cfg.h, cfg.w);
                if x[i] == y[o] {
                    out[o] = gg[i];
                    break 'scan;
                }
            }
        }
    }
    out
}

/// Runs `op` on f32 or f16 data (given as f32 values exactly representable in the dtype).
fn run_t(
    op: &str,
    attrs: &Attrs,
    half: bool,
    args: &[(&[f32], &[usize])],
    host_args: &[&HostTensor],
) -> (Vec<usize>, Vec<f32>) {
    let hs: Vec<HostTensor> = args.iter().map(|(d, s)| host_t(d, s, half)).collect();
    let refs: Vec<&HostTensor> = hs.iter().collect();
    let out = try_run_host(op, attrs, &refs, host_args).unwrap_or_else(|e| panic!("{op}: {e}"));
    (out[0].shape().to_vec(), floats(&out[0], half))
}

/// f32 values (exactly representable in the dtype) as a float16 (`half`) or float32 tensor.
fn host_t(d: &[f32], s: &[usize], half: bool) -> HostTensor {
    if half { host(&f16s(d), s) } else { host(d, s) }
}

/// A float16 (`half`) or float32 tensor's values as f32.
fn floats(t: &Tensor, half: bool) -> Vec<f32> {
    if half {
        assert_eq!(t.dtype(), DType::F16);
        t.download::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect()
    } else {
        assert_eq!(t.dtype(), DType::F32);
        t.download::<f32>().unwrap()
    }
}

/// MaxPoolGrad of `cfg` for the input `x`, its pooled `y` and the gradient `g`: the shape,
/// and the values bit for bit against `ref_max_grad`.
fn check_max_grad(
    cfg: &Cfg,
    attrs: &Attrs,
    half: bool,
    (x, y, g): (&[f32], &[f32], &[f32]),
    what: &str,
) {
    let (in_shape, out_shape) = (cfg.in_shape(), cfg.out_shape());
    let (s, dx) = run_t(
        "MaxPoolGrad",
        attrs,
        half,
        &[(x, &in_shape), (y, &out_shape), (g, &out_shape)],
        &[],
    );
    assert_eq!(s, in_shape, "MaxPoolGrad shape {what}");
    assert_same_f32(
        &dx,
        &ref_max_grad(cfg, x, g, half),
        &format!("MaxPoolGrad {what}"),
    );
}

/// Random data: small integers (many ties) or uniform floats, rounded to f16 for `half`.
fn data(rng: &mut rand::rngs::StdRng, n: usize, ties: bool, half: bool) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = if ties {
                rng.random_range(-2i32..3) as f32
            } else {
                rng.random_range(-4.0f32..4.0)
            };
            rnd(half, v)
        })
        .collect()
}

fn assert_rel(got: &[f32], want: &[f32], rtol: f32, what: &str) {
    assert_close(got, want, rtol, 0.0, what);
}

fn configs() -> Vec<Cfg> {
    let mut v = vec![];
    let shapes = [
        (1, 1, 1, 1),
        (2, 7, 5, 3),
        (1, 9, 8, 5),
        (3, 4, 6, 2),
        (1, 5, 11, 7),
    ];
    let wins = [
        (1, 1, 1, 1),
        (2, 2, 2, 2),
        (3, 3, 2, 2),
        (3, 2, 1, 1),
        (2, 3, 3, 4),
        (4, 4, 3, 3),
        (5, 1, 2, 1),
    ];
    let mut k = 0;
    for &(n, h, w, c) in &shapes {
        for &(kh, kw, sh, sw) in &wins {
            for pad in [Pad::Same, Pad::Valid] {
                // TensorFlow reports a negative VALID output size as an error (tested below).
                if matches!(pad, Pad::Valid) && (h + 2 * sh <= kh || w + 2 * sw <= kw) {
                    continue;
                }
                k += 1;
                v.push(Cfg {
                    n,
                    h,
                    w,
                    c,
                    kh,
                    kw,
                    sh,
                    sw,
                    pad,
                    nchw: k % 3 == 0,
                });
            }
        }
    }
    v
}

fn check_all_ops(cfg: &Cfg, half: bool, seed: u64) {
    let mut r = rng(seed);
    let dtype = if half { DType::F16 } else { DType::F32 };
    let attrs = cfg.attrs(dtype);
    let in_shape = cfg.in_shape();
    let out_shape = cfg.out_shape();
    let nin: usize = in_shape.iter().product();
    let nout: usize = out_shape.iter().product();
    let what = cfg.name();
    let lowest = if half { -65504.0 } else { f32::MIN };
    for ties in [true, false] {
        let x = data(&mut r, nin, ties, half);
        let g = data(&mut r, nout, false, half);
        // MaxPool: exact.
        let (s, y) = run_t("MaxPool", &attrs, half, &[(&x, &in_shape)], &[]);
        assert_eq!(s, out_shape, "MaxPool shape {what}");
        let want_y = ref_max(cfg, &x, lowest);
        assert_same_f32(&y, &want_y, &format!("MaxPool {what}"));
        // MaxPoolGrad: exact (same summation order).
        check_max_grad(cfg, &attrs, half, (&x, &want_y, &g), &what);
        // MaxPoolGradGrad: exact (a selection).
        let gg = data(&mut r, nin, false, half);
        let (s, ddy) = run_t(
            "MaxPoolGradGrad",
            &attrs,
            half,
            &[(&x, &in_shape), (&want_y, &out_shape), (&gg, &in_shape)],
            &[],
        );
        assert_eq!(s, out_shape);
        assert_same_f32(
            &ddy,
            &ref_grad_grad(cfg, &x, &want_y, &gg),
            &format!("MaxPoolGradGrad {what}"),
        );
        // AvgPool: one division per output (2.5 ULP allowed in f32; f16 rounds it to one
        // half ULP at most).
        let (s, a) = run_t("AvgPool", &attrs, half, &[(&x, &in_shape)], &[]);
        assert_eq!(s, out_shape);
        let rtol = if half { 1e-3 } else { 3.0 * f32::EPSILON };
        assert_rel(
            &a,
            &ref_avg(cfg, &x, half),
            rtol,
            &format!("AvgPool {what}"),
        );
        // AvgPoolGrad: a reciprocal per covering output, then exact-order sums.
        let shape_t = host(
            &in_shape.iter().map(|&d| d as i32).collect::<Vec<_>>(),
            &[4],
        );
        let hs = host_t(&g, &out_shape, half);
        let d = dev();
        let gt = d.upload_host(&hs).unwrap();
        let res = d
            .run(
                "AvgPoolGrad",
                &attrs,
                &[
                    tfwgpu_runtime::Arg::from(&shape_t),
                    tfwgpu_runtime::Arg::from(&gt),
                ],
            )
            .unwrap();
        assert_eq!(res[0].shape(), &in_shape[..]);
        let got = floats(&res[0], half);
        let want = ref_avg_grad(cfg, &g, half);
        // Each term's reciprocal may differ by an ULP; the terms are summed, so bound the error
        // by the sum of |terms| (at most 16 terms here).
        let tol: Vec<f64> = want
            .iter()
            .map(|w| {
                if half {
                    2e-3 * (1.0 + w.abs() as f64)
                } else {
                    1e-6 * (1.0 + w.abs() as f64)
                }
            })
            .collect();
        assert_within(
            &to_f64(&got),
            &to_f64(&want),
            &tol,
            &format!("AvgPoolGrad {what}"),
        );
    }
}

#[test]
fn pool_f32_all_configs() {
    for (i, cfg) in configs().iter().enumerate() {
        check_all_ops(cfg, false, 100 + i as u64);
    }
}

#[test]
fn pool_f16_configs() {
    for (i, cfg) in configs().iter().enumerate().filter(|(i, _)| i % 3 == 1) {
        check_all_ops(cfg, true, 500 + i as u64);
    }
}

#[test]
fn pool_explicit_padding_and_channels_129() {
    for (i, (pad, nchw)) in [
        ([1, 2, 0, 3], false),
        ([2, 0, 1, 1], true),
        ([0, 0, 0, 0], false),
    ]
    .iter()
    .enumerate()
    {
        let cfg = Cfg {
            n: 1,
            h: 5,
            w: 4,
            c: if i == 0 { 129 } else { 3 },
            kh: 3,
            kw: 2,
            sh: 2,
            sw: 1,
            pad: Pad::Explicit(*pad),
            nchw: *nchw,
        };
        let attrs = cfg.attrs(DType::F32);
        let mut r = rng(40 + i as u64);
        let x = data(&mut r, cfg.in_shape().iter().product(), i == 1, false);
        let g = data(&mut r, cfg.out_shape().iter().product(), false, false);
        let (s, y) = run_t("MaxPool", &attrs, false, &[(&x, &cfg.in_shape())], &[]);
        assert_eq!(s, cfg.out_shape());
        let want_y = ref_max(&cfg, &x, f32::MIN);
        assert_same_f32(&y, &want_y, &format!("MaxPool {cfg:?}"));
        check_max_grad(&cfg, &attrs, false, (&x, &want_y, &g), &format!("{cfg:?}"));
    }
}

/// MaxPoolGrad with strides 2 x 2 and windows up to 4 x 4 on NHWC with C % 4 == 0: the gather
/// per 2 x 2 block of inputs (pool_vec4.wgsl's MODE 6). Every window size 1..4 x 1..4, SAME /
/// VALID / explicit paddings (top or left padding shifts the blocks), odd and even sizes,
/// ties, float32 and float16: bit for bit against TensorFlow's order of the sums.
#[test]
fn max_pool_grad_stride2_blocks() {
    let mut k = 0u64;
    for &(n, h, w, c) in &[(1, 7, 5, 4), (2, 8, 9, 8), (1, 2, 3, 12), (1, 1, 1, 4)] {
        for kh in 1..=4 {
            for kw in 1..=4 {
                for pad in [
                    Pad::Same,
                    Pad::Valid,
                    Pad::Explicit([1, 0, 0, 1]),
                    Pad::Explicit([2, 1, 1, 2]),
                ] {
                    if matches!(pad, Pad::Valid) && (h < kh || w < kw) {
                        continue;
                    }
                    k += 1;
                    let cfg = Cfg {
                        n,
                        h,
                        w,
                        c,
                        kh,
                        kw,
                        sh: 2,
                        sw: 2,
                        pad,
                        nchw: false,
                    };
                    let half = k.is_multiple_of(3);
                    let attrs = cfg.attrs(if half { DType::F16 } else { DType::F32 });
                    let mut r = rng(3000 + k);
                    let x = data(
                        &mut r,
                        cfg.in_shape().iter().product(),
                        k.is_multiple_of(2),
                        half,
                    );
                    let g = data(&mut r, cfg.out_shape().iter().product(), false, half);
                    let lowest = if half { -65504.0 } else { f32::MIN };
                    let y = ref_max(&cfg, &x, lowest);
                    let what = format!("half={half} {cfg:?}");
                    check_max_grad(&cfg, &attrs, half, (&x, &y, &g), &what);
                }
            }
        }
    }
}

/// MaxPoolGrad 3x3 / 2 with no top or left padding (SAME on even sizes, VALID, explicit
/// padding after only; NHWC, C % 4 == 0): the block gathers (pool_vec4.wgsl's MODE 7, or MODE
/// 6 with `TFWGPU_POOL_GATHER3S2=0`, which tests/pool_gather3s2_off.rs runs this file with). Bit
/// for bit against TensorFlow's order of the sums, float32 and float16. Inputs of four forms:
/// peaks at even positions (each 2 x 2 block's top-left input is then the argmax of up to
/// all four windows covering it, so its sums have 3 and 4 terms and round in between), small
/// integers (ties), uniform values, and uniform values with grads of -0 and NaN.
#[test]
fn max_pool_grad_3x3s2_sums() {
    let shapes = [
        (2, 8, 10, 8, Pad::Same),
        (1, 12, 6, 64, Pad::Same),
        (3, 9, 7, 12, Pad::Valid),
        (1, 2, 2, 4, Pad::Same),
        (1, 3, 3, 4, Pad::Valid),
        (2, 7, 8, 4, Pad::Explicit([0, 1, 0, 2])),
        (2, 5, 9, 4, Pad::Explicit([0, 2, 0, 0])),
        (1, 16, 16, 64, Pad::Same),
    ];
    let mut k = 0u64;
    for &(n, h, w, c, pad) in &shapes {
        let cfg = Cfg {
            n,
            h,
            w,
            c,
            kh: 3,
            kw: 3,
            sh: 2,
            sw: 2,
            pad,
            nchw: false,
        };
        let (_, _, pt, pl) = cfg.out_hw();
        assert_eq!((pt, pl), (0, 0), "{cfg:?}");
        for half in [false, true] {
            for form in 0..4 {
                k += 1;
                let mut r = rng(7000 + k);
                let nin: usize = cfg.in_shape().iter().product();
                let nout: usize = cfg.out_shape().iter().product();
                let x: Vec<f32> = match form {
                    0 => (0..nin)
                        .map(|i| {
                            let (xx, y) = ((i / c) % w, (i / (c * w)) % h);
                            let v = if xx % 2 == 0 && y % 2 == 0 {
                                r.random_range(1.0f32..4.0)
                            } else {
                                r.random_range(-4.0f32..0.0)
                            };
                            rnd(half, v)
                        })
                        .collect(),
                    1 => data(&mut r, nin, true, half),
                    _ => data(&mut r, nin, false, half),
                };
                let mut g = data(&mut r, nout, false, half);
                if form == 3 {
                    for v in g.iter_mut() {
                        match r.random_range(0..8) {
                            0 => *v = -0.0,
                            1 => *v = f32::NAN,
                            _ => {}
                        }
                    }
                }
                let attrs = cfg.attrs(if half { DType::F16 } else { DType::F32 });
                let lowest = if half { -65504.0 } else { f32::MIN };
                let y = ref_max(&cfg, &x, lowest);
                let what = format!("half={half} form {form} {cfg:?}");
                check_max_grad(&cfg, &attrs, half, (&x, &y, &g), &what);
            }
        }
    }
}

/// MaxPoolGrad's argmax codes for 3x3 windows with vertical stride 2 over several output rows
/// on inputs drawn from special values (NaN, -0 / +0, subnormals, infinities, the lowest finite
/// value, ties), so that whole windows take the half comparisons' or the built-in max's
/// fallback to the integer keys, next to clipped windows: bit for bit against TensorFlow's
/// argmax, float32 and float16. Horizontal strides 1 and 2, top padding (SAME on odd sizes,
/// explicit) and none. (Written for session 17's codes passes with two outputs per invocation
/// and with a band in workgroup memory, both measured slower on the H200 and removed; the cases
/// stay, on MODE 5.)
#[test]
fn max_pool_grad_codes_3x3_stride2_rows_with_specials() {
    let shapes = [
        (1, 5, 3, 4, 2, Pad::Valid),
        (2, 9, 7, 8, 2, Pad::Valid),
        (1, 7, 6, 12, 1, Pad::Valid),
        (2, 11, 9, 8, 2, Pad::Same),
        (1, 10, 8, 4, 1, Pad::Same),
        (1, 8, 5, 8, 2, Pad::Explicit([1, 0, 1, 1])),
        (1, 13, 4, 16, 2, Pad::Explicit([2, 1, 0, 0])),
        // 33 channel quads, 9 x 9 outputs: rows of 297 quads in two workgroups (the second
        // starts inside a pixel), and bands of 4 output rows with a partial last one.
        (1, 17, 18, 132, 2, Pad::Same),
    ];
    let mut k = 0u64;
    for &(n, h, w, c, sw, pad) in &shapes {
        let cfg = Cfg {
            n,
            h,
            w,
            c,
            kh: 3,
            kw: 3,
            sh: 2,
            sw,
            pad,
            nchw: false,
        };
        for half in [false, true] {
            let sub = if half {
                f32::from_bits(0x3380_0000)
            } else {
                f32::from_bits(1)
            };
            let lowest = if half { -65504.0 } else { f32::MIN };
            let pool = [
                f32::NAN,
                0.0,
                -0.0,
                sub,
                -sub,
                f32::INFINITY,
                f32::NEG_INFINITY,
                lowest,
                1.0,
                2.0,
                -1.0,
            ];
            // Mostly specials, then mostly numbers (pairs where one window is plain).
            for share in [6, 2] {
                k += 1;
                let mut r = rng(9300 + k);
                let nin: usize = cfg.in_shape().iter().product();
                let x: Vec<f32> = (0..nin)
                    .map(|_| {
                        if r.random_range(0..8) < share {
                            pool[r.random_range(0..pool.len())]
                        } else {
                            rnd(half, r.random_range(-4.0f32..4.0))
                        }
                    })
                    .collect();
                let g = data(&mut r, cfg.out_shape().iter().product(), false, half);
                let attrs = cfg.attrs(if half { DType::F16 } else { DType::F32 });
                let y = ref_max(&cfg, &x, lowest);
                let what = format!("codes 3x3 / 2, half={half} share {share} {cfg:?}");
                check_max_grad(&cfg, &attrs, half, (&x, &y, &g), &what);
            }
        }
    }
}

/// MaxPoolGrad with grads of -0 (and NaN) on every kernel form: TensorFlow's sums start from +0,
/// and 0 + -0 is +0, so no input gets -0 (an input whose only gradient is -0 gets +0). The
/// one-channel kernel (pool.wgsl: C = 3, NCHW), pool_vec4.wgsl's per-input gather (strides 1,
/// or windows over 4 x 4) and its block gathers (strides 2), float32 and float16, bit for bit.
#[test]
fn max_pool_grad_negative_zero_grads() {
    let forms = [
        (3, 3, 3, 1, Pad::Same, false),
        (4, 3, 3, 1, Pad::Same, false),
        (4, 5, 5, 2, Pad::Same, false),
        (8, 2, 2, 2, Pad::Valid, false),
        (4, 4, 3, 2, Pad::Same, false),
        (4, 3, 3, 2, Pad::Same, false),
        (4, 3, 3, 2, Pad::Same, true),
    ];
    let mut k = 0u64;
    for &(c, kh, kw, s, pad, nchw) in &forms {
        let cfg = Cfg {
            n: 2,
            h: 9,
            w: 8,
            c,
            kh,
            kw,
            sh: s,
            sw: s,
            pad,
            nchw,
        };
        for half in [false, true] {
            k += 1;
            let mut r = rng(8100 + k);
            let x = data(&mut r, cfg.in_shape().iter().product(), false, half);
            let g: Vec<f32> = (0..cfg.out_shape().iter().product::<usize>())
                .map(|_| match r.random_range(0..4) {
                    0 | 1 => -0.0,
                    2 => f32::NAN,
                    _ => rnd(half, r.random_range(-4.0f32..4.0)),
                })
                .collect();
            let attrs = cfg.attrs(if half { DType::F16 } else { DType::F32 });
            let lowest = if half { -65504.0 } else { f32::MIN };
            let y = ref_max(&cfg, &x, lowest);
            let what = format!("-0 grads, half={half} {cfg:?}");
            check_max_grad(&cfg, &attrs, half, (&x, &y, &g), &what);
        }
    }
}

/// Every pass of pool_vec4.wgsl (MaxPool, the argmax codes, the three gathers) for float32
/// and float16 (hardware and software conversions; float16 MaxPool and codes also in native
/// half arithmetic) translated offline, naga WGSL -> SPIR-V as wgpu's Vulkan backend does:
/// validation errors and writer failures show on any adapter.
#[test]
fn pool_vec4_shaders_translate_offline() {
    use tfwgpu_runtime::kernels::pool::vec4_source;
    let mut n = 0;
    for dtype in [DType::F32, DType::F16] {
        let half = dtype == DType::F16;
        for hw in if half { vec![true, false] } else { vec![false] } {
            for pass in [0u32, 5, 2, 6, 7] {
                let grid3s: &[Option<u32>] = if pass >= 6 {
                    &[Some(256), Some(224)]
                } else {
                    &[Some(256), Some(128), None]
                };
                for &grid3 in grid3s {
                    let mut natives = vec![(false, false)];
                    if half && hw && (pass == 0 || pass == 5) {
                        natives.extend([(true, false), (true, true)]);
                    }
                    for native in natives {
                        // The built-in max on whole windows: float32, float16 with hardware
                        // conversions (as `Pool::record` chooses).
                        let src = vec4_source(pass, dtype, hw, grid3, native, !half || hw);
                        let what =
                            format!("pass {pass} {dtype:?} hw {hw} grid3 {grid3:?} {native:?}");
                        let words = spirv(&src).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert!(words.len() > 100, "{what}");
                        n += 1;
                    }
                }
            }
        }
    }
    // Per grid (two sizes of the three-dimensional one, and the linear one for passes 0, 5
    // and 2): float32 13, float16 with hardware conversions 13 + native 12, software 13.
    assert_eq!(n, 51);
}

/// A 2x2 window (VALID, stride 2) over one channel: [a b; c d].
fn max_window(v: [f32; 4]) -> (f32, Vec<f32>) {
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("ksize", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("padding", AttrValue::Str("VALID".into()));
    let shape = [1, 2, 2, 1];
    let (_, y) = run_t("MaxPool", &attrs, false, &[(&v, &shape)], &[]);
    let (_, dx) = run_t(
        "MaxPoolGrad",
        &attrs,
        false,
        &[(&v, &shape), (&y, &[1, 1, 1, 1]), (&[1.0], &[1, 1, 1, 1])],
        &[],
    );
    (y[0], dx)
}

#[test]
fn max_pool_ties_and_nan_like_tensorflow_cpu() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // (window, forward, gradient) as TensorFlow 2.21's CPU kernels give them.
    let cases: [([f32; 4], f32, [f32; 4]); 9] = [
        ([1.0, 1.0, 1.0, 1.0], 1.0, [1.0, 0.0, 0.0, 0.0]),
        ([0.0, 2.0, 2.0, 1.0], 2.0, [0.0, 1.0, 0.0, 0.0]),
        ([nan, 1.0, 2.0, 3.0], 3.0, [1.0, 0.0, 0.0, 0.0]),
        ([1.0, nan, 2.0, 3.0], 3.0, [0.0, 0.0, 0.0, 1.0]),
        ([3.0, nan, 2.0, 1.0], 3.0, [1.0, 0.0, 0.0, 0.0]),
        ([1.0, 2.0, 3.0, nan], 3.0, [0.0, 0.0, 1.0, 0.0]),
        ([nan, nan, 1.0, 2.0], 2.0, [1.0, 0.0, 0.0, 0.0]),
        ([nan, nan, nan, nan], f32::MIN, [1.0, 0.0, 0.0, 0.0]),
        ([-inf, -inf, -inf, -inf], f32::MIN, [1.0, 0.0, 0.0, 0.0]),
    ];
    for (v, y, dx) in cases {
        let (gy, gdx) = max_window(v);
        assert_eq!(gy.to_bits(), y.to_bits(), "MaxPool {v:?}");
        assert_eq!(gdx, dx.to_vec(), "MaxPoolGrad {v:?}");
    }
    // +inf is an ordinary maximum.
    let (gy, gdx) = max_window([1.0, inf, inf, 0.0]);
    assert_eq!(gy, inf);
    assert_eq!(gdx, vec![0.0, 1.0, 0.0, 0.0]);
}

/// MaxPool and MaxPoolGrad (and MaxPoolGradGrad with `grad_grad`) on an input with a NaN in
/// about every fourth element, against the references, bit for bit.
fn check_random_nan(cfg: &Cfg, seed: u64, what: &str, grad_grad: bool) {
    check_random_nan_t(cfg, seed, what, grad_grad, false);
}

fn check_random_nan_t(cfg: &Cfg, seed: u64, what: &str, grad_grad: bool, half: bool) {
    let mut r = rng(seed);
    let n: usize = cfg.in_shape().iter().product();
    let mut x = data(&mut r, n, true, half);
    for v in x.iter_mut() {
        if r.random_range(0..4) == 0 {
            *v = f32::NAN;
        }
    }
    let g = data(&mut r, cfg.out_shape().iter().product(), false, half);
    let attrs = cfg.attrs(if half { DType::F16 } else { DType::F32 });
    let lowest = if half { -65504.0 } else { f32::MIN };
    let (_, y) = run_t("MaxPool", &attrs, half, &[(&x, &cfg.in_shape())], &[]);
    assert_same_f32(&y, &ref_max(cfg, &x, lowest), &format!("MaxPool {what}"));
    check_max_grad(cfg, &attrs, half, (&x, &y, &g), what);
    if grad_grad {
        let (_, ddy) = run_t(
            "MaxPoolGradGrad",
            &attrs,
            false,
            &[
                (&x, &cfg.in_shape()),
                (&y, &cfg.out_shape()),
                (&x, &cfg.in_shape()),
            ],
            &[],
        );
        assert_same_f32(
            &ddy,
            &ref_grad_grad(cfg, &x, &y, &x),
            &format!("MaxPoolGradGrad {what}"),
        );
    }
}

#[test]
fn max_pool_random_nan() {
    let cfg = Cfg {
        n: 2,
        h: 6,
        w: 7,
        c: 3,
        kh: 3,
        kw: 3,
        sh: 2,
        sw: 2,
        pad: Pad::Same,
        nchw: false,
    };
    check_random_nan(&cfg, 9, "NaN", true);
}

#[test]
fn v2_ops_take_host_ksize_and_strides() {
    let cfg = Cfg {
        n: 2,
        h: 7,
        w: 6,
        c: 3,
        kh: 3,
        kw: 2,
        sh: 2,
        sw: 3,
        pad: Pad::Same,
        nchw: true,
    };
    let mut attrs = cfg.attrs(DType::F32);
    let k = host(&[1i32, 1, 3, 2], &[4]);
    let s = host(&[1i32, 1, 2, 3], &[4]);
    attrs.set("ksize", AttrValue::Ints(vec![]));
    let mut r = rng(3);
    let x = data(&mut r, cfg.in_shape().iter().product(), true, false);
    let g = data(&mut r, cfg.out_shape().iter().product(), false, false);
    let (shape, y) = run_t(
        "MaxPoolV2",
        &attrs,
        false,
        &[(&x, &cfg.in_shape())],
        &[&k, &s],
    );
    assert_eq!(shape, cfg.out_shape());
    assert_same_f32(&y, &ref_max(&cfg, &x, f32::MIN), "MaxPoolV2");
    let (_, dx) = run_t(
        "MaxPoolGradV2",
        &attrs,
        false,
        &[
            (&x, &cfg.in_shape()),
            (&y, &cfg.out_shape()),
            (&g, &cfg.out_shape()),
        ],
        &[&k, &s],
    );
    assert_same_f32(&dx, &ref_max_grad(&cfg, &x, &g, false), "MaxPoolGradV2");
    let (_, ddy) = run_t(
        "MaxPoolGradGradV2",
        &attrs,
        false,
        &[
            (&x, &cfg.in_shape()),
            (&y, &cfg.out_shape()),
            (&x, &cfg.in_shape()),
        ],
        &[&k, &s],
    );
    assert_same_f32(&ddy, &ref_grad_grad(&cfg, &x, &y, &x), "MaxPoolGradGradV2");
}

#[test]
fn empty_inputs_and_outputs() {
    // VALID with a window larger than the input: an empty output.
    let cfg = Cfg {
        n: 1,
        h: 2,
        w: 5,
        c: 2,
        kh: 3,
        kw: 1,
        sh: 3,
        sw: 1,
        pad: Pad::Valid,
        nchw: false,
    };
    let x = vec![1.0f32; 20];
    for op in ["MaxPool", "AvgPool"] {
        let (s, y) = run_t(
            op,
            &cfg.attrs(DType::F32),
            false,
            &[(&x, &cfg.in_shape())],
            &[],
        );
        assert_eq!(s, vec![1, 0, 5, 2], "{op}");
        assert!(y.is_empty(), "{op}");
    }
    // Gradient of an empty output: zeros.
    let (s, dx) = run_t(
        "MaxPoolGrad",
        &cfg.attrs(DType::F32),
        false,
        &[
            (&x, &cfg.in_shape()),
            (&[], &[1, 0, 5, 2]),
            (&[], &[1, 0, 5, 2]),
        ],
        &[],
    );
    assert_eq!(s, cfg.in_shape());
    assert_eq!(dx, vec![0.0; 20]);
    // An empty batch.
    let cfg0 = Cfg { n: 0, ..cfg };
    let (s, _) = run_t(
        "MaxPool",
        &cfg0.attrs(DType::F32),
        false,
        &[(&[], &cfg0.in_shape())],
        &[],
    );
    assert_eq!(s, vec![0, 0, 5, 2]);
}

#[test]
fn errors_name_the_op_and_shapes() {
    let x = host(&[0.0f32; 16], &[1, 4, 4, 1]);
    let base = Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("padding", AttrValue::Str("VALID".into()));
    // Pooling over the batch.
    let a = base
        .clone()
        .with("ksize", AttrValue::Ints(vec![2, 2, 2, 1]))
        .with("strides", AttrValue::Ints(vec![1, 1, 1, 1]));
    let e = try_run("MaxPool", &a, &[&x]).err().unwrap();
    assert!(e.to_string().contains("batch"), "{e}");
    // Negative output size.
    let a = base
        .clone()
        .with("ksize", AttrValue::Ints(vec![1, 7, 1, 1]))
        .with("strides", AttrValue::Ints(vec![1, 1, 1, 1]));
    let e = try_run("AvgPool", &a, &[&x]).err().unwrap();
    assert!(e.to_string().contains("negative"), "{e}");
    // A 3-D input.
    let a = base
        .clone()
        .with("ksize", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]));
    let x3 = host(&[0.0f32; 16], &[4, 4, 1]);
    let e = try_run("MaxPool", &a, &[&x3]).err().unwrap();
    assert!(
        e.to_string().contains("MaxPool") && e.to_string().contains("[4,4,1]"),
        "{e}"
    );
    // A grad of the wrong shape.
    let g = host(&[0.0f32; 3], &[1, 3, 1, 1]);
    let y = host(&[0.0f32; 4], &[1, 2, 2, 1]);
    let e = try_run("MaxPoolGrad", &a, &[&x, &y, &g]).err().unwrap();
    assert!(
        e.to_string().contains("grad") && e.to_string().contains("[1,2,2,1]"),
        "{e}"
    );
    // Unsupported dtype.
    let xi = host(&[0i32; 16], &[1, 4, 4, 1]);
    assert!(try_run("MaxPool", &a, &[&xi]).is_err());
}

/// NHWC with C % 4 == 0 runs MaxPool / MaxPoolGrad four channels per invocation
/// (pool_vec4.wgsl): window shapes and paddings as `configs`, ties and uniform data, float32
/// and (every other config) float16.
#[test]
fn pool_vec4_channels_f32_and_f16() {
    let wins = [
        (1, 1, 1, 1),
        (2, 2, 2, 2),
        (3, 3, 2, 2),
        (3, 3, 1, 1),
        (2, 3, 3, 4),
        (4, 4, 3, 3),
    ];
    let mut k = 0;
    // C = 132: 33 channel quads per pixel, not a power of two (the grid's row division).
    for &(n, h, w, c) in &[
        (1, 7, 5, 4),
        (2, 9, 8, 8),
        (1, 1, 1, 4),
        (1, 6, 6, 12),
        (2, 5, 7, 132),
        // float16 with C % 8 == 0 takes pairs of quads per invocation: 17 pairs per pixel
        // (odd: the grid's row division), and 3 pairs.
        (2, 5, 7, 136),
        (1, 7, 8, 24),
    ] {
        for &(kh, kw, sh, sw) in &wins {
            for pad in [Pad::Same, Pad::Valid] {
                if matches!(pad, Pad::Valid) && (h + 2 * sh <= kh || w + 2 * sw <= kw) {
                    continue;
                }
                k += 1;
                let cfg = Cfg {
                    n,
                    h,
                    w,
                    c,
                    kh,
                    kw,
                    sh,
                    sw,
                    pad,
                    nchw: false,
                };
                check_all_ops(&cfg, false, 900 + k);
                if k % 2 == 0 {
                    check_all_ops(&cfg, true, 1900 + k);
                }
            }
        }
    }
    // A 16x16 window (256 elements: more than the 8-bit argmax codes hold, so MaxPoolGrad
    // takes the one-channel kernel) next to a 15x17 one (255: the codes).
    for (i, &(kh, kw)) in [(16, 16), (15, 17)].iter().enumerate() {
        let cfg = Cfg {
            n: 1,
            h: 17,
            w: 18,
            c: 4,
            kh,
            kw,
            sh: 1,
            sw: 2,
            pad: Pad::Same,
            nchw: false,
        };
        check_all_ops(&cfg, false, 990 + i as u64);
    }
}

/// A 2x2 / 2 VALID pool of `dtype`.
fn window_2x2_attrs(dtype: DType) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("ksize", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
        .with("padding", AttrValue::Str("VALID".into()))
}

/// MaxPool and MaxPoolGrad (gradient `g`, one per channel) of one [1, 2, 2, 4] window whose
/// channel `ch` holds `group[ch]`: x[y][x][ch] = group[ch][2y + x].
fn max_pool_quad(attrs: &Attrs, half: bool, group: &[[f32; 4]], g: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut x = vec![0.0f32; 16];
    for (ch, v) in group.iter().enumerate() {
        for (e, &val) in v.iter().enumerate() {
            x[e * 4 + ch] = val;
        }
    }
    let (_, y) = run_t("MaxPool", attrs, half, &[(&x, &[1, 2, 2, 4])], &[]);
    let (_, dx) = run_t(
        "MaxPoolGrad",
        attrs,
        half,
        &[(&x, &[1, 2, 2, 4]), (&y, &[1, 1, 1, 4]), (g, &[1, 1, 1, 4])],
        &[],
    );
    (y, dx)
}

/// The four-channel kernels against the one-channel ones (whose ties and NaN rules the test
/// above checks against TensorFlow's CPU): each channel of a [1, 2, 2, 4] window holds one
/// case, results bit for bit, including -0 / +0 ties, NaN first or later, -inf and
/// subnormals.
#[test]
fn max_pool_vec4_ties_and_nan_match_one_channel() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let sub = f32::from_bits(1);
    let cases: [[f32; 4]; 12] = [
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 2.0, 2.0, 1.0],
        [nan, 1.0, 2.0, 3.0],
        [1.0, nan, 2.0, 3.0],
        [3.0, nan, 2.0, 1.0],
        [1.0, 2.0, 3.0, nan],
        [nan, nan, 1.0, 2.0],
        [nan, nan, nan, nan],
        [-inf, -inf, -inf, -inf],
        [-0.0, 0.0, -0.0, 0.0],
        [0.0, sub, -sub, sub],
        [-sub, -0.0, 1.0, inf],
    ];
    let attrs = window_2x2_attrs(DType::F32);
    let g = [1.0f32, 2.0, 3.0, 4.0];
    for group in cases.chunks(4) {
        let (y, dx) = max_pool_quad(&attrs, false, group, &g);
        for (ch, v) in group.iter().enumerate() {
            let (y1, dx1) = max_window(*v);
            assert_eq!(y[ch].to_bits(), y1.to_bits(), "MaxPool {v:?}");
            let want: Vec<f32> = dx1.iter().map(|d| d * g[ch]).collect();
            let got: Vec<f32> = (0..4).map(|e| dx[e * 4 + ch]).collect();
            assert_eq!(got, want, "MaxPoolGrad {v:?}");
        }
    }
}

/// NaN scattered through a 3x3 / 2 SAME pool over 8 channels (the four-channel kernels).
#[test]
fn max_pool_vec4_random_nan() {
    let cfg = Cfg {
        n: 2,
        h: 7,
        w: 6,
        c: 8,
        kh: 3,
        kw: 3,
        sh: 2,
        sw: 2,
        pad: Pad::Same,
        nchw: false,
    };
    check_random_nan(&cfg, 19, "NaN vec4", false);
    // float16, 8 and 16 channels: pairs of quads per invocation.
    check_random_nan_t(&cfg, 20, "NaN f16 x8", false, true);
    check_random_nan_t(&Cfg { c: 16, ..cfg }, 21, "NaN f16 x8 c16", false, true);
}

/// float16: the four-channel kernels compare the halves' own 16-bit keys; against the
/// one-channel kernels (which widen to f32), bit for bit, on NaN, -0 / +0, subnormal halves,
/// -inf and ties; MaxPoolGrad too.
#[test]
fn max_pool_vec4_f16_specials_match_one_channel() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // 2^-24 and 3 * 2^-24: half subnormals.
    let s1 = f32::from_bits(0x3380_0000);
    let s3 = 3.0 * s1;
    let cases: [[f32; 4]; 12] = [
        [1.0, 1.0, 1.0, 1.0],
        [nan, 1.0, 2.0, 3.0],
        [1.0, nan, 2.0, 3.0],
        [nan, nan, nan, nan],
        [-inf, -inf, -inf, -inf],
        [-0.0, 0.0, -0.0, 0.0],
        [0.0, -0.0, s1, -s1],
        [-s3, -s1, -s3, -0.0],
        [s1, s3, s3, s1],
        [-65504.0, -inf, -65504.0, -inf],
        [65504.0, inf, 2.0, inf],
        [-2.0, -1.5, nan, -1.5],
    ];
    let attrs = window_2x2_attrs(DType::F16);
    let g = [1.0f32, 2.0, 3.0, 4.0];
    for group in cases.chunks(4) {
        let (y, dx) = max_pool_quad(&attrs, true, group, &g);
        for (ch, v) in group.iter().enumerate() {
            let (_, y1) = run_t("MaxPool", &attrs, true, &[(v, &[1, 2, 2, 1])], &[]);
            let (_, dx1) = run_t(
                "MaxPoolGrad",
                &attrs,
                true,
                &[
                    (v, &[1, 2, 2, 1]),
                    (&y1, &[1, 1, 1, 1]),
                    (&g[ch..ch + 1], &[1, 1, 1, 1]),
                ],
                &[],
            );
            assert_eq!(y[ch].to_bits(), y1[0].to_bits(), "MaxPool f16 {v:?}");
            let got: Vec<u32> = (0..4).map(|e| dx[e * 4 + ch].to_bits()).collect();
            let want: Vec<u32> = dx1.iter().map(|d| d.to_bits()).collect();
            assert_eq!(got, want, "MaxPoolGrad f16 {v:?}");
        }
    }
}

/// Whole 3x3 windows (the four-channel kernels' built-in-max path, and its fallback to the
/// integer keys on NaN, zero and subnormal maxima) against TensorFlow's rules written out
/// here: MaxPool = the maximum from the lowest finite value, taking only greater elements;
/// MaxPoolGrad's argmax = the first element, replaced only by a strictly greater one. Bit for
/// bit, float32 and float16.
#[test]
fn max_pool_vec4_3x3_specials() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    for half in [false, true] {
        // Subnormal in the dtype: 2^-149 (f32) or 2^-24 (f16).
        let sub = if half {
            f32::from_bits(0x3380_0000)
        } else {
            f32::from_bits(1)
        };
        let lowest = if half { -65504.0 } else { f32::MIN };
        let cases: [[f32; 9]; 16] = [
            [1.0; 9],
            [0.5, 2.0, 1.0, -3.0, 2.0, 0.25, 1.5, 2.0, -1.0],
            [nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
            [1.0, 2.0, nan, 9.0, 4.0, 5.0, 9.0, 7.0, 8.0],
            [-1.0, -2.0, -3.0, -0.0, -4.0, 0.0, -5.0, -0.0, -6.0],
            [-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0],
            [-1.0, -sub, -2.0, -3.0, -sub, -4.0, -5.0, -6.0, -7.0],
            [0.0, sub, -sub, sub, 0.0, -0.0, sub, 0.0, 0.0],
            [-inf; 9],
            [-inf, -inf, -inf, lowest, -inf, -inf, -inf, -inf, lowest],
            [1.0, inf, 2.0, inf, -inf, 3.0, 4.0, 5.0, 6.0],
            [sub, 2.0 * sub, 3.0, 3.0, 2.0, 1.0, 3.0, 0.5, 0.25],
            [nan; 9],
            [-2.0, -1.5, nan, -1.5, -3.0, -1.5, -4.0, -5.0, -6.0],
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0],
            [4.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.125, -0.0, -inf],
        ];
        let attrs = Attrs::new()
            .with(
                "T",
                AttrValue::Type(if half { DType::F16 } else { DType::F32 }),
            )
            .with("ksize", AttrValue::Ints(vec![1, 3, 3, 1]))
            .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
            .with("padding", AttrValue::Str("VALID".into()));
        let g = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        // float16 also on 8 channels (pairs of quads per invocation).
        for (nc, group) in cases
            .chunks(4)
            .map(|c| (4, c))
            .chain(cases.chunks(8).filter(|_| half).map(|c| (8, c)))
        {
            let mut x = vec![0.0f32; 9 * nc];
            for (ch, v) in group.iter().enumerate() {
                for (e, &val) in v.iter().enumerate() {
                    x[e * nc + ch] = val;
                }
            }
            let (_, y) = run_t("MaxPool", &attrs, half, &[(&x, &[1, 3, 3, nc])], &[]);
            let (_, dx) = run_t(
                "MaxPoolGrad",
                &attrs,
                half,
                &[
                    (&x, &[1, 3, 3, nc]),
                    (&y, &[1, 1, 1, nc]),
                    (&g[..nc], &[1, 1, 1, nc]),
                ],
                &[],
            );
            for (ch, v) in group.iter().enumerate() {
                let mut m = lowest;
                for &e in v {
                    if e > m {
                        m = e;
                    }
                }
                let mut arg = 0;
                for (i, &e) in v.iter().enumerate() {
                    if e > v[arg] {
                        arg = i;
                    }
                }
                assert_eq!(
                    y[ch].to_bits(),
                    m.to_bits(),
                    "MaxPool {v:?} (half {half}): got {}, want {m}",
                    y[ch]
                );
                for e in 0..9 {
                    let want = if e == arg { g[ch] } else { 0.0 };
                    assert_eq!(
                        dx[e * nc + ch].to_bits(),
                        want.to_bits(),
                        "MaxPoolGrad {v:?} (half {half}) element {e}"
                    );
                }
            }
        }
    }
}
