//! The autotuner (`tune.rs`) through real kernels: with tuning forced on (also on a CPU
//! adapter) and a cache file in a temporary directory, MatMul and Conv2D choose a variant by
//! timing, the results match f64 references, the choice is written to the cache and names a
//! valid variant, and a second run reuses it (bitwise the same result). The tuner's timing is
//! not asserted. Cache round trip, corrupt/foreign files and disabled tuning have unit tests in
//! src/tune.rs.
mod common;

use common::*;
use tfwgpu_runtime::kernels::matmul::VEC4_TILES;
use tfwgpu_runtime::{Arg, AttrValue, Attrs};

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                s += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
            c[i * n + j] = s as f32;
        }
    }
    c
}

#[test]
fn tuned_choices_are_valid_cached_and_correct() {
    let (dir, path) = tuning_with_fresh_cache("tune-it");
    let d = dev();
    let mut rng = rng(9);

    // MatMul 72 x 40 x 96 (multiples of 4: the vector tiles are candidates).
    let (m, k, n) = (72, 40, 96);
    let a = rand_f32(&mut rng, m * k, -1.0, 1.0);
    let b = rand_f32(&mut rng, k * n, -1.0, 1.0);
    let ta = d.upload(&a, &[m, k]).unwrap();
    let tb = d.upload(&b, &[k, n]).unwrap();
    let run = || {
        d.run("MatMul", &Attrs::new(), &[Arg::from(&ta), Arg::from(&tb)])
            .unwrap()[0]
            .download::<f32>()
            .unwrap()
    };
    let first = run();
    assert_close(
        &first,
        &matmul_ref(&a, &b, m, k, n),
        1e-5,
        1e-5,
        "tuned MatMul",
    );
    assert_eq!(run(), first, "the remembered choice gives the same result");

    // Conv2D 1x1 (matmul kernels) and 3x3 (windows on the vector shader, or the implicit
    // GEMM tiles), the GPU path, 16 output channels.
    let x = rand_f32(&mut rng, 2 * 9 * 7 * 8, -1.0, 1.0);
    let f1 = rand_f32(&mut rng, 8 * 16, -1.0, 1.0);
    let f3 = rand_f32(&mut rng, 9 * 8 * 16, -1.0, 1.0);
    let tx = d.upload(&x, &[2, 9, 7, 8]).unwrap();
    let attrs = Attrs::new()
        .with("strides", AttrValue::Ints(vec![1; 4]))
        .with("padding", AttrValue::Str("SAME".into()))
        .with("_tfwgpu_tile", AttrValue::Str("gpu".into()));
    for (r, f) in [(1usize, &f1), (3, &f3)] {
        let tf = d.upload(f, &[r, r, 8, 16]).unwrap();
        let y = d
            .run("Conv2D", &attrs, &[Arg::from(&tx), Arg::from(&tf)])
            .unwrap()[0]
            .download::<f32>()
            .unwrap();
        // f64 reference, SAME padding (pad r / 2 before).
        let p = (r / 2) as i64;
        let mut want = vec![0.0f32; 2 * 9 * 7 * 16];
        for nb in 0..2 {
            for oy in 0..9i64 {
                for ox in 0..7i64 {
                    for kk in 0..16 {
                        let mut s = 0.0f64;
                        for dr in 0..r as i64 {
                            for ds in 0..r as i64 {
                                let (iy, ix) = (oy + dr - p, ox + ds - p);
                                if !(0..9).contains(&iy) || !(0..7).contains(&ix) {
                                    continue;
                                }
                                for c in 0..8 {
                                    let xi = ((nb * 9 + iy as usize) * 7 + ix as usize) * 8 + c;
                                    let fi = ((dr as usize * r + ds as usize) * 8 + c) * 16 + kk;
                                    s += x[xi] as f64 * f[fi] as f64;
                                }
                            }
                        }
                        want[((nb * 9 + oy as usize) * 7 + ox as usize) * 16 + kk] = s as f32;
                    }
                }
            }
        }
        assert_close(&y, &want, 1e-5, 1e-5, &format!("tuned Conv2D {r}x{r}"));
    }

    // 3 input channels (columns: im2col for the forward pass and the filter gradient, col2im
    // for the input gradient, each tuned against the previous implicit GEMM), compared with
    // the previous path ("gemm") on the same data: both are float32 sums of the same products.
    let x3 = rand_f32(&mut rng, 2 * 10 * 9 * 3, -1.0, 1.0);
    let f33 = rand_f32(&mut rng, 9 * 3 * 16, -1.0, 1.0);
    let dy3 = rand_f32(&mut rng, 2 * 5 * 5 * 16, -1.0, 1.0);
    let tx3 = d.upload(&x3, &[2, 10, 9, 3]).unwrap();
    let tf3 = d.upload(&f33, &[3, 3, 3, 16]).unwrap();
    let tdy3 = d.upload(&dy3, &[2, 5, 5, 16]).unwrap();
    let xs = tfwgpu_runtime::HostTensor::vec_i32(&[2, 10, 9, 3]);
    let fs = tfwgpu_runtime::HostTensor::vec_i32(&[3, 3, 3, 16]);
    for (op, args) in [
        ("Conv2D", vec![Arg::from(&tx3), Arg::from(&tf3)]),
        (
            "Conv2DBackpropInput",
            vec![Arg::from(&xs), Arg::from(&tf3), Arg::from(&tdy3)],
        ),
        (
            "Conv2DBackpropFilter",
            vec![Arg::from(&tx3), Arg::from(&fs), Arg::from(&tdy3)],
        ),
    ] {
        let mut got = vec![];
        for tile in ["gpu", "gemm"] {
            let a = Attrs::new()
                .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
                .with("padding", AttrValue::Str("SAME".into()))
                .with("_tfwgpu_tile", AttrValue::Str(tile.into()));
            got.push(d.run(op, &a, &args).unwrap()[0].download::<f32>().unwrap());
        }
        assert_close(
            &got[0],
            &got[1],
            1e-5,
            1e-5,
            &format!("tuned {op}, 3 channels"),
        );
    }

    // The cache file: this adapter's entries, each naming a valid variant.
    let text = std::fs::read_to_string(&path).expect("the tuner wrote its cache");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["format"], "tfwgpu-tune-v1");
    let adapters = doc["adapters"].as_object().unwrap();
    assert_eq!(adapters.len(), 1);
    let entries = adapters.values().next().unwrap().as_object().unwrap();
    let conv_tiles = [
        "32x32x8_2x2",
        "64x64x8_4x4",
        "128x128x8_8x8",
        "128x32x8_8x2",
    ];
    let mut kinds = vec![];
    for (key, e) in entries {
        let v = e["variant"].as_str().unwrap();
        let vec4 = VEC4_TILES.iter().any(|t| v.contains(t.name));
        let valid = if key.starts_with("matmul/") {
            vec4 || ["64x64x8", "8x8x8", "cpu", "sg"]
                .iter()
                .any(|p| v.starts_with(p))
        } else {
            // The implicit GEMM's tiles, the vector tiles of the vector paths, or those
            // paths' fallback to the implicit GEMM ("gemm_<tile>", "previous").
            conv_tiles.contains(&v)
                || vec4
                || v == "previous"
                || v.strip_prefix("gemm_")
                    .is_some_and(|t| conv_tiles.contains(&t))
        };
        assert!(valid, "{key}: {v} is not a variant");
        kinds.push(key.split('/').next().unwrap().to_string());
    }
    assert!(kinds.iter().any(|k| k == "matmul"), "{entries:?}");
    assert!(kinds.iter().any(|k| k == "conv"), "{entries:?}");
    for path in [
        "conv/f32/im2col_fwd",
        "conv/f32/im2col_bwdf",
        "conv/f32/col2im",
    ] {
        assert!(
            entries.keys().any(|k| k.starts_with(path)),
            "{path}: {entries:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
