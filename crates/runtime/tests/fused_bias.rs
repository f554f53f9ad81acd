//! `_TfwgpuConv2DBiasAdd` and `_TfwgpuMatMulBiasAdd`: the product's kernel, then the bias added
//! in place. Against Conv2D/MatMul then BiasAdd run as two kernels: the same bits (the same
//! kernels); against a CPU reference (f64 sums) within the product's rounding.

mod common;

use common::*;
use tfwgpu_runtime::kernels::fused::bias::{OP_CONV, OP_MATMUL};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Tensor, f16};

fn conv_attrs(dtype: DType, padding: &str, strides: [i64; 4]) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("strides", AttrValue::Ints(strides.to_vec()))
        .with("padding", AttrValue::Str(padding.into()))
        .with("data_format", AttrValue::Str("NHWC".into()))
        .with("dilations", AttrValue::Ints(vec![1, 1, 1, 1]))
}

fn two_kernels(op: &str, attrs: &Attrs, x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    let p = dev()
        .run(op, attrs, &[Arg::from(x), Arg::from(w)])
        .unwrap()
        .remove(0);
    let t = Attrs::new().with("T", attrs.get("T").unwrap().clone());
    dev()
        .run("BiasAdd", &t, &[Arg::from(&p), Arg::from(b)])
        .unwrap()
        .remove(0)
}

fn one_kernel(op: &str, attrs: &Attrs, x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    dev()
        .run(op, attrs, &[Arg::from(x), Arg::from(w), Arg::from(b)])
        .unwrap_or_else(|e| panic!("{op}: {e}"))
        .remove(0)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// NHWC convolution (VALID or SAME, stride s) plus bias on the CPU, f64 sums.
#[allow(clippy::too_many_arguments)]
fn cpu_conv(
    x: &[f32],
    [n, h, w, c]: [usize; 4],
    f: &[f32],
    [kh, kw, _, o]: [usize; 4],
    b: &[f32],
    s: usize,
    same: bool,
) -> (Vec<f32>, [usize; 4]) {
    let (oh, ow, ph, pw) = if same {
        let (oh, ow) = (h.div_ceil(s), w.div_ceil(s));
        let ph = ((oh - 1) * s + kh).saturating_sub(h) / 2;
        let pw = ((ow - 1) * s + kw).saturating_sub(w) / 2;
        (oh, ow, ph, pw)
    } else {
        ((h - kh) / s + 1, (w - kw) / s + 1, 0, 0)
    };
    let mut out = vec![0f32; n * oh * ow * o];
    for bn in 0..n {
        for y in 0..oh {
            for xx in 0..ow {
                for oc in 0..o {
                    let mut acc = 0f64;
                    for i in 0..kh {
                        for j in 0..kw {
                            let (iy, ix) = (
                                (y * s + i) as isize - ph as isize,
                                (xx * s + j) as isize - pw as isize,
                            );
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            for ic in 0..c {
                                acc += x[((bn * h + iy as usize) * w + ix as usize) * c + ic]
                                    as f64
                                    * f[((i * kw + j) * c + ic) * o + oc] as f64;
                            }
                        }
                    }
                    out[((bn * oh + y) * ow + xx) * o + oc] = (acc as f32) + b[oc];
                }
            }
        }
    }
    (out, [n, oh, ow, o])
}

#[test]
fn conv_then_bias_as_two_kernels_at_awkward_shapes() {
    let mut r = rng(1);
    for (k, (xs, fs, stride, padding)) in [
        ([2usize, 13, 13, 16], [3usize, 3, 16, 32], 1usize, "VALID"),
        ([1, 7, 9, 3], [3, 3, 3, 5], 2, "SAME"),
        ([3, 5, 5, 1], [1, 1, 1, 7], 1, "VALID"),
        ([1, 1, 1, 4], [1, 1, 4, 129], 1, "SAME"),
    ]
    .into_iter()
    .enumerate()
    {
        let x = rand_f32(&mut r, xs.iter().product(), -1.0, 1.0);
        let f = rand_f32(&mut r, fs.iter().product(), -1.0, 1.0);
        let b = rand_f32(&mut r, fs[3], -1.0, 1.0);
        let (tx, tf, tb) = (
            dev().upload(&x, &xs).unwrap(),
            dev().upload(&f, &fs).unwrap(),
            dev().upload(&b, &[fs[3]]).unwrap(),
        );
        let a = conv_attrs(DType::F32, padding, [1, stride as i64, stride as i64, 1]);
        let got = one_kernel(OP_CONV, &a, &tx, &tf, &tb);
        let want = two_kernels("Conv2D", &a, &tx, &tf, &tb);
        assert_eq!(got.shape(), want.shape(), "case {k}");
        let g = got.download::<f32>().unwrap();
        assert_eq!(bits(&g), bits(&want.download::<f32>().unwrap()), "case {k}");
        let (cpu, shape) = cpu_conv(&x, xs, &f, fs, &b, stride, padding == "SAME");
        assert_eq!(got.shape(), &shape, "case {k}");
        let taps = (fs[0] * fs[1] * fs[2]) as f32;
        assert_close(
            &g,
            &cpu,
            0.0,
            4.0 * f32::EPSILON * taps.sqrt() * 4.0,
            &format!("case {k}"),
        );
    }
}

#[test]
fn matmul_then_bias_as_two_kernels() {
    let mut r = rng(2);
    for (m, kk, n, ta, tb) in [
        (64usize, 800usize, 10usize, false, false),
        (7, 129, 33, true, false),
        (1, 5, 1, false, true),
        (65, 3, 130, true, true),
    ] {
        let ashape = if ta { [kk, m] } else { [m, kk] };
        let bshape = if tb { [n, kk] } else { [kk, n] };
        let a = rand_f32(&mut r, m * kk, -1.0, 1.0);
        let bm = rand_f32(&mut r, kk * n, -1.0, 1.0);
        let bias = rand_f32(&mut r, n, -1.0, 1.0);
        let (t1, t2, t3) = (
            dev().upload(&a, &ashape).unwrap(),
            dev().upload(&bm, &bshape).unwrap(),
            dev().upload(&bias, &[n]).unwrap(),
        );
        let attrs = Attrs::new()
            .with("T", AttrValue::Type(DType::F32))
            .with("transpose_a", AttrValue::Bool(ta))
            .with("transpose_b", AttrValue::Bool(tb));
        let got = one_kernel(OP_MATMUL, &attrs, &t1, &t2, &t3);
        let want = two_kernels("MatMul", &attrs, &t1, &t2, &t3);
        assert_eq!(got.shape(), &[m, n]);
        let g = got.download::<f32>().unwrap();
        assert_eq!(
            bits(&g),
            bits(&want.download::<f32>().unwrap()),
            "{m}x{kk}x{n}"
        );
        let mut cpu = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0f64;
                for p in 0..kk {
                    let av = if ta { a[p * m + i] } else { a[i * kk + p] };
                    let bv = if tb { bm[j * kk + p] } else { bm[p * n + j] };
                    acc += av as f64 * bv as f64;
                }
                cpu[i * n + j] = acc as f32 + bias[j];
            }
        }
        assert_close(
            &g,
            &cpu,
            0.0,
            16.0 * f32::EPSILON * (kk as f32).sqrt(),
            &format!("{m}x{kk}x{n}"),
        );
    }
}

#[test]
fn f16_and_empty_batches() {
    let mut r = rng(3);
    let h = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let x = h(rand_f32(&mut r, 2 * 6 * 6 * 3, -1.0, 1.0));
    let f = h(rand_f32(&mut r, 3 * 3 * 3 * 4, -1.0, 1.0));
    let b = h(rand_f32(&mut r, 4, -1.0, 1.0));
    let (tx, tf, tb) = (
        dev().upload(&x, &[2, 6, 6, 3]).unwrap(),
        dev().upload(&f, &[3, 3, 3, 4]).unwrap(),
        dev().upload(&b, &[4]).unwrap(),
    );
    let a = conv_attrs(DType::F16, "SAME", [1, 1, 1, 1]);
    let got = one_kernel(OP_CONV, &a, &tx, &tf, &tb)
        .download::<f16>()
        .unwrap();
    let want = two_kernels("Conv2D", &a, &tx, &tf, &tb)
        .download::<f16>()
        .unwrap();
    let u = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    assert_eq!(u(&got), u(&want));
    // A batch of zero images: an empty output, no error.
    let e = dev().upload::<f32>(&[], &[0, 5, 5, 2]).unwrap();
    let f32f = dev()
        .upload(&[0.5f32; 3 * 3 * 2 * 3], &[3, 3, 2, 3])
        .unwrap();
    let b3 = dev().upload(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let out = one_kernel(
        OP_CONV,
        &conv_attrs(DType::F32, "VALID", [1, 1, 1, 1]),
        &e,
        &f32f,
        &b3,
    );
    assert_eq!(out.shape(), &[0, 3, 3, 3]);
}

#[test]
fn a_bias_of_the_wrong_size_or_type_is_an_error() {
    let x = dev()
        .upload(&[1.0f32; 2 * 4 * 4 * 2], &[2, 4, 4, 2])
        .unwrap();
    let f = dev()
        .upload(&[1.0f32; 3 * 3 * 2 * 5], &[3, 3, 2, 5])
        .unwrap();
    let a = conv_attrs(DType::F32, "VALID", [1, 1, 1, 1]);
    let b4 = dev().upload(&[1.0f32; 4], &[4]).unwrap();
    let e = dev()
        .run(OP_CONV, &a, &[Arg::from(&x), Arg::from(&f), Arg::from(&b4)])
        .err()
        .expect("an error")
        .to_string();
    assert!(e.contains("as many biases as the last dimension"), "{e}");
    let bi = dev().upload(&[1i32; 5], &[5]).unwrap();
    assert!(
        dev()
            .run(OP_CONV, &a, &[Arg::from(&x), Arg::from(&f), Arg::from(&bi)])
            .is_err()
    );
    // The product's own validation: channels that do not match.
    let f3 = dev()
        .upload(&[1.0f32; 3 * 3 * 3 * 5], &[3, 3, 3, 5])
        .unwrap();
    let b5 = dev().upload(&[1.0f32; 5], &[5]).unwrap();
    assert!(
        dev()
            .run(
                OP_CONV,
                &a,
                &[Arg::from(&x), Arg::from(&f3), Arg::from(&b5)]
            )
            .is_err()
    );
    // NCHW is refused at construction.
    let nchw = a.clone().with("data_format", AttrValue::Str("NCHW".into()));
    assert!(
        dev()
            .run(
                OP_CONV,
                &nchw,
                &[Arg::from(&x), Arg::from(&f), Arg::from(&b5)]
            )
            .is_err()
    );
}
