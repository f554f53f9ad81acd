//! Kernels whose invocations would walk more than lavapipe's 65,535 loop iterations (llvmpipe
//! leaves a shader's loops there, silently): the CPU adapter's Conv2DBackpropFilter splits its
//! batch, the depthwise filter gradient its positions, and MatMul's CPU tiles K into chunks, so
//! that an invocation stays within `LOOP_BUDGET`. Integer-valued data, so the float32 sums are
//! exact and compared exactly. (Found by an audit in session 24; pooling windows of more than
//! 65,535 taps are still wrong on lavapipe: README, known gaps.)
mod common;
use common::*;
use rand::Rng;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, HostTensor};

fn bits(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(0..2) as f32).collect()
}

/// Conv2DBackpropFilter, SAME, stride 1: df[r,s,c,k] = sum x[n,y+r-pt,x+s-pl,c] dy[n,y,x,k].
fn conv_bwd_filter(n: usize, h: usize, w: usize, c: usize, rs: usize, k: usize) {
    let mut r = rng(7);
    let x = bits(&mut r, n * h * w * c);
    let dy = bits(&mut r, n * h * w * k);
    let xt = dev().upload(&x, &[n, h, w, c]).unwrap();
    let dyt = dev().upload(&dy, &[n, h, w, k]).unwrap();
    let attrs = Attrs::new()
        .with("strides", AttrValue::Ints(vec![1; 4]))
        .with("padding", AttrValue::Str("SAME".into()))
        .with("T", AttrValue::Type(tfwgpu_runtime::DType::F32));
    let fs = HostTensor::vec_i32(&[rs as i32, rs as i32, c as i32, k as i32]);
    let out = dev()
        .run(
            "Conv2DBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&fs), Arg::from(&dyt)],
        )
        .unwrap();
    let got = out[0].download::<f32>().unwrap();
    let pt = (rs - 1) / 2;
    let mut bad = 0;
    let mut first = String::new();
    let total = rs * rs * c * k;
    for idx in (0..total).step_by((total / 40).max(1)) {
        let kk = idx % k;
        let cc = (idx / k) % c;
        let ss = (idx / (k * c)) % rs;
        let rr = idx / (k * c * rs);
        let mut s = 0f64;
        for b in 0..n {
            for y in 0..h {
                let iy = y as isize + rr as isize - pt as isize;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                for xx in 0..w {
                    let ix = xx as isize + ss as isize - pt as isize;
                    if ix < 0 || ix >= w as isize {
                        continue;
                    }
                    s += (x[((b * h + iy as usize) * w + ix as usize) * c + cc]
                        * dy[((b * h + y) * w + xx) * k + kk]) as f64;
                }
            }
        }
        if got[idx] != s as f32 {
            if bad == 0 {
                first = format!("df[{idx}] got {} want {}", got[idx], s);
            }
            bad += 1;
        }
    }
    assert_eq!(
        bad, 0,
        "Conv2DBackpropFilter n{n} {h}x{w} c{c} {rs}x{rs} k{k}: {bad} of 40 wrong, first {first}"
    );
}

#[test]
fn conv_bwd_filter_within_one_invocation() {
    // 1 x (192 * 49 + 1) iterations: no split needed.
    conv_bwd_filter(1, 192, 192, 21, 7, 4);
}

#[test]
fn conv_bwd_filter_batch_split_under_the_loop_limit() {
    // 37,249 iterations per image (17 output tiles: the batch was not split, 74,498 per
    // invocation, and lavapipe returned 62,748 instead of 72,707); now one image per split.
    conv_bwd_filter(2, 384, 384, 21, 7, 4);
    // Three images of 95 x (1 + 24) + 1 = 2,376 each per invocation would fit; 40 images would
    // not (95,041): 13 per split.
    conv_bwd_filter(40, 95, 95, 3, 3, 4);
}

/// DepthwiseConv2dNativeBackpropFilter, SAME, stride 1, one channel: df[r, s] = sum x dy.
fn depthwise_bwd_filter(h: usize, w: usize, rs: usize) {
    let mut r = rng(11);
    let x = bits(&mut r, h * w);
    let dy = bits(&mut r, h * w);
    let xt = dev().upload(&x, &[1, h, w, 1]).unwrap();
    let dyt = dev().upload(&dy, &[1, h, w, 1]).unwrap();
    let attrs = Attrs::new()
        .with("strides", AttrValue::Ints(vec![1; 4]))
        .with("padding", AttrValue::Str("SAME".into()))
        .with("T", AttrValue::Type(tfwgpu_runtime::DType::F32));
    let fs = HostTensor::vec_i32(&[rs as i32, rs as i32, 1, 1]);
    let out = dev()
        .run(
            "DepthwiseConv2dNativeBackpropFilter",
            &attrs,
            &[Arg::from(&xt), Arg::from(&fs), Arg::from(&dyt)],
        )
        .unwrap();
    let got = out[0].download::<f32>().unwrap();
    let pt = (rs - 1) / 2;
    let mut want = vec![0f32; rs * rs];
    for rr in 0..rs {
        for ss in 0..rs {
            let mut s = 0f64;
            for y in 0..h {
                let iy = y as isize + rr as isize - pt as isize;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                for xx in 0..w {
                    let ix = xx as isize + ss as isize - pt as isize;
                    if ix < 0 || ix >= w as isize {
                        continue;
                    }
                    s += (x[iy as usize * w + ix as usize] * dy[y * w + xx]) as f64;
                }
            }
            want[rr * rs + ss] = s as f32;
        }
    }
    assert_close(
        &got,
        &want,
        0.0,
        0.0,
        &format!("DepthwiseBackpropFilter {h}x{w} {rs}x{rs}"),
    );
}

#[test]
fn depthwise_bwd_filter_positions_split_under_the_loop_limit() {
    // 289 workgroups (17 x 17 taps): one split of 520 x 520 positions, 67,600 iterations per
    // invocation before (lavapipe returned 63,354 instead of 65,318); now three splits.
    depthwise_bwd_filter(520, 520, 17);
}

/// MatMul of 0/1 matrices (exact float32 sums), A m x k and B k x n stored transposed or not.
fn matmul_k(m: usize, n: usize, k: usize, ta: bool, tb: bool) {
    let mut r = rng(k as u64 + m as u64);
    let a = bits(&mut r, m * k);
    let b = bits(&mut r, k * n);
    // a[i, l] and b[l, j] as stored.
    let (a_shape, b_shape) = (
        if ta { [k, m] } else { [m, k] },
        if tb { [n, k] } else { [k, n] },
    );
    let ai = |i: usize, l: usize| if ta { a[l * m + i] } else { a[i * k + l] };
    let bi = |l: usize, j: usize| if tb { b[j * k + l] } else { b[l * n + j] };
    let at = dev().upload(&a, &a_shape).unwrap();
    let bt = dev().upload(&b, &b_shape).unwrap();
    let attrs = Attrs::new()
        .with("transpose_a", AttrValue::Bool(ta))
        .with("transpose_b", AttrValue::Bool(tb));
    let out = dev()
        .run("MatMul", &attrs, &[Arg::from(&at), Arg::from(&bt)])
        .unwrap();
    let got = out[0].download::<f32>().unwrap();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|l| (ai(i, l) * bi(l, j)) as f64).sum::<f64>() as f32;
        }
    }
    assert_close(
        &got,
        &want,
        0.0,
        0.0,
        &format!("MatMul {m}x{n}x{k} ta={ta} tb={tb}"),
    );
}

#[test]
fn matmul_long_k_in_chunks() {
    // K / 4 = 75,000 steps per invocation of the CPU tiles before (lavapipe summed ~262,140 of
    // the 300,000 terms); now chunks of 131,072 terms added in a second pass.
    matmul_k(3, 8, 300_000, false, false);
    // Both operands transposed, an output whose size is not a multiple of 4, three chunks.
    matmul_k(2, 5, 270_001, true, true);
    matmul_k(5, 3, 140_000, false, true);
}
