mod common;
use common::*;
use rand::rngs::StdRng;
use tfwgpu_runtime::kernels::matmul::{VEC4_TILES, Vec4Tile};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, Tensor};

const EPS: f64 = f32::EPSILON as f64 / 2.0; // unit roundoff of float32

/// CPU reference of a (batch-broadcast) product in f64: output shape, values, and for each
/// output the sum of |a_ik b_kj| (the scale of the rounding error).
fn reference(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
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
        let mut v = vec![1; rank + 2 - s.len()];
        v.extend_from_slice(&s[..s.len() - 2]);
        v
    };
    let (ba, bb) = (pad(sa), pad(sb));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let nb: usize = batch.iter().product();
    let (mut out, mut abs) = (vec![], vec![]);
    for bi in 0..nb {
        // Batch offsets of A and B (index 0 along broadcast dimensions).
        let (mut rem, mut oa, mut ob, mut stride_a, mut stride_b) = (bi, 0, 0, m * k, k * n);
        for d in (0..rank).rev() {
            let i = rem % batch[d];
            rem /= batch[d];
            if ba[d] > 1 {
                oa += i * stride_a;
            }
            if bb[d] > 1 {
                ob += i * stride_b;
            }
            stride_a *= ba[d];
            stride_b *= bb[d];
        }
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut s_abs) = (0.0, 0.0);
                for l in 0..k {
                    let x = a[oa + if ta { l * m + i } else { i * k + l }];
                    let y = b[ob + if tb { j * k + l } else { l * n + j }];
                    s += x * y;
                    s_abs += (x * y).abs();
                }
                out.push(s);
                abs.push(s_abs);
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (shape, out, abs)
}

fn attrs(op: &str, ta: bool, tb: bool, dtype: DType) -> Attrs {
    match op {
        "MatMul" => Attrs::new()
            .with("T", AttrValue::Type(dtype))
            .with("transpose_a", AttrValue::Bool(ta))
            .with("transpose_b", AttrValue::Bool(tb)),
        "BatchMatMulV3" => Attrs::new()
            .with("Ta", AttrValue::Type(dtype))
            .with("Tb", AttrValue::Type(dtype))
            .with("Tout", AttrValue::Type(dtype))
            .with("adj_x", AttrValue::Bool(ta))
            .with("adj_y", AttrValue::Bool(tb)),
        _ => Attrs::new()
            .with("T", AttrValue::Type(dtype))
            .with("adj_x", AttrValue::Bool(ta))
            .with("adj_y", AttrValue::Bool(tb)),
    }
}

/// Stored shape of an operand whose (untransposed) matrix is rows x cols.
fn stored(batch: &[usize], rows: usize, cols: usize, t: bool) -> Vec<usize> {
    let mut s = batch.to_vec();
    if t {
        s.extend([cols, rows]);
    } else {
        s.extend([rows, cols]);
    }
    s
}

/// Runs a float32 product on random data and checks every output against the f64 reference
/// within the bound of f32 accumulation over k terms: (k + 2) u sum|a b|.
#[allow(clippy::too_many_arguments)]
fn check_f32(
    op: &str,
    a_batch: &[usize],
    b_batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    seed: u64,
) {
    check_f32_tile(op, None, a_batch, b_batch, m, k, n, ta, tb, seed);
}

/// `check_f32` with the kernel's tile forced (`_tfwgpu_tile`).
#[allow(clippy::too_many_arguments)]
fn check_f32_tile(
    op: &str,
    tile: Option<&str>,
    a_batch: &[usize],
    b_batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    seed: u64,
) {
    let mut r = rng(seed);
    let sa = stored(a_batch, m, k, ta);
    let sb = stored(b_batch, k, n, tb);
    let a = rand_f32(&mut r, sa.iter().product(), -1.0, 1.0);
    let b = rand_f32(&mut r, sb.iter().product(), -1.0, 1.0);
    let ga = dev().upload(&a, &sa).unwrap();
    let gb = dev().upload(&b, &sb).unwrap();
    // Poison the memory the output will likely reuse, so that unwritten outputs show.
    let poison_len = batch_len(a_batch, b_batch) * m * n;
    drop(
        dev()
            .upload(&vec![f32::NAN; poison_len.max(1)], &[poison_len.max(1)])
            .unwrap(),
    );
    let mut at = attrs(op, ta, tb, DType::F32);
    if let Some(t) = tile {
        at.set("_tfwgpu_tile", AttrValue::Str(t.to_string()));
    }
    let out = dev()
        .run(op, &at, &[Arg::from(&ga), Arg::from(&gb)])
        .unwrap();
    let what = format!("{op} {sa:?} x {sb:?} ta {ta} tb {tb} tile {tile:?}");
    let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    let (shape, want, abs) = reference(&a64, &sa, &b64, &sb, ta, tb);
    assert_eq!(out[0].shape(), shape.as_slice(), "{what}");
    let got = out[0].download::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&abs).enumerate() {
        let tol = (k as f64 + 2.0) * EPS * s;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (tol {tol:e})"
        );
    }
}

#[test]
fn matmul_f32_awkward_shapes_and_every_transpose() {
    let shapes = [
        (1, 1, 1),
        (7, 7, 7),
        (1, 129, 1),
        (129, 1, 7),
        (65, 33, 17),
        (64, 64, 64),
        (3, 200, 5),
        (129, 130, 65),
        (256, 96, 200),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (j, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            check_f32("MatMul", &[], &[], m, k, n, ta, tb, (i * 4 + j) as u64);
        }
    }
}

/// Output batch size of broadcast batch dimensions.
fn batch_len(a: &[usize], b: &[usize]) -> usize {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let x = if i + a.len() >= rank {
                a[i + a.len() - rank]
            } else {
                1
            };
            let y = if i + b.len() >= rank {
                b[i + b.len() - rank]
            } else {
                1
            };
            x.max(y)
        })
        .product()
}

/// Checks vector tile `tile` (forced) on shapes with contiguous dimensions that are multiples
/// of 4 but not of the tiles: partial tiles in M, N and K, K shorter than one K tile, every
/// transpose, and broadcast batches.
fn check_vec4_tile(tile: &str, seed: &mut u64) {
    for &(m, k, n) in &[(4, 4, 4), (132, 20, 68), (68, 36, 132)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            check_f32_tile("MatMul", Some(tile), &[], &[], m, k, n, ta, tb, *seed);
            *seed += 1;
        }
    }
    // Many tile rows (the grouped launch order's last, partial group).
    check_f32_tile(
        "MatMul",
        Some(tile),
        &[],
        &[],
        1100,
        8,
        264,
        false,
        false,
        *seed,
    );
    *seed += 1;
    // Rows of A not a multiple of 4 (only K and N need to be, A and B untransposed).
    check_f32_tile(
        "MatMul",
        Some(tile),
        &[],
        &[],
        7,
        12,
        8,
        false,
        false,
        *seed,
    );
    check_f32_tile(
        "BatchMatMulV2",
        Some(tile),
        &[2, 1],
        &[3],
        20,
        12,
        136,
        false,
        true,
        *seed + 1,
    );
    *seed += 2;
}

/// Tiles whose workgroup memory exceeds the test device's are checked through a twin of half
/// the size: the same generated code (layouts, parts, padding, per-invocation block), so
/// every code path runs here.
fn twin(t: &Vec4Tile) -> Option<&'static Vec4Tile> {
    VEC4_TILES.iter().find(|u| {
        u.name != t.name
            && (u.tm, u.tn, u.bk, u.stages, u.parts, u.pad)
                == (t.tm, t.tn, t.bk, t.stages, t.parts, t.pad)
            && u.shared_bytes() <= dev().limits().max_compute_workgroup_storage_size
    })
}

/// Every vector tile (`matmul_vec4.wgsl`), or its twin where the device's workgroup memory is
/// too small for it. `TFWGPU_TEST_TILES=NAME,..` restricts the run to those tiles (lavapipe
/// takes minutes for all of them).
#[test]
fn vec4_tiles_edge_shapes_and_every_transpose() {
    let mut seed = 500;
    let shared = dev().limits().max_compute_workgroup_storage_size;
    let only = std::env::var("TFWGPU_TEST_TILES").ok();
    for t in VEC4_TILES {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|x| x == t.name))
        {
            continue;
        }
        if t.shared_bytes() <= shared {
            check_vec4_tile(t.name, &mut seed);
        } else {
            let u =
                twin(t).unwrap_or_else(|| panic!("{} needs a twin that fits {shared} B", t.name));
            check_vec4_tile(u.name, &mut seed);
        }
    }
}

/// The automatic choice on shapes large enough for the vector tiles, next to the scalar one.
#[test]
fn default_choice_on_larger_shapes() {
    for (i, &(m, k, n)) in [(256, 64, 256), (260, 33, 132), (520, 24, 516)]
        .iter()
        .enumerate()
    {
        for (ta, tb) in [(false, false), (true, true)] {
            check_f32("MatMul", &[], &[], m, k, n, ta, tb, 700 + i as u64);
        }
    }
}

#[test]
fn forced_tiles_must_apply() {
    let a = dev().upload(&[1.0f32; 5 * 6], &[5, 6]).unwrap();
    let b = dev().upload(&[1.0f32; 6 * 8], &[6, 8]).unwrap();
    for (tile, ok) in [
        ("64x64x8", true),
        ("128x128x8_8x8s1", false),
        ("nonsense", false),
    ] {
        let r = dev().run(
            "MatMul",
            &Attrs::new().with("_tfwgpu_tile", AttrValue::Str(tile.into())),
            &[Arg::from(&a), Arg::from(&b)],
        );
        match r {
            Ok(out) => {
                assert!(ok, "{tile}");
                assert_eq!(out[0].download::<f32>().unwrap(), vec![6.0; 40]);
            }
            Err(e) => {
                assert!(!ok, "{tile}: {e}");
                assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            }
        }
    }
}

/// K split across workgroups of a vector tile (`ksS_TILE`: on GPU adapters the automatic
/// choice for products of few output tiles over a long K): every transpose, partial tiles in M
/// and N, parts of exactly one K tile and of many, 2 to 16 parts; the parts' sum in float32
/// within the bound of the whole sum, int32 exact; refused where K does not split evenly into
/// parts that keep the vector layout, or for a tile that is not a vector tile.
#[test]
fn k_split_vector_tiles() {
    let mut seed = 900;
    for (tile, m, k, n) in [
        ("ks2_64x64x16_4x4w", 68, 40, 132),
        ("ks8_64x64x16_4x4w", 64, 2048, 100),
        ("ks3_64x64x16_4x4s1", 8, 48, 12),
        ("ks16_64x64x16_4x4w", 20, 1024, 8),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            seed += 1;
            check_f32_tile("MatMul", Some(tile), &[], &[], m, k, n, ta, tb, seed);
        }
    }
    let mut r = rng(311);
    for t in [(false, false), (true, true)] {
        let tiles = ["ks2_64x64x16_4x4w", "ks5_64x64x16_4x4w"];
        check_int32_tiles(&mut r, (68, 40, 132), t, &tiles, |_| true);
    }
    let a = dev().upload(&[1.0f32; 8 * 40], &[8, 40]).unwrap();
    let b = dev().upload(&[1.0f32; 40 * 8], &[40, 8]).unwrap();
    for tile in [
        "ks3_64x64x16_4x4w",
        "ks20_64x64x16_4x4w",
        "ks1_64x64x16_4x4w",
        "ks2_64x64x8",
    ] {
        let Err(e) = dev().run(
            "MatMul",
            &Attrs::new().with("_tfwgpu_tile", AttrValue::Str(tile.into())),
            &[Arg::from(&a), Arg::from(&b)],
        ) else {
            panic!("{tile} ran");
        };
        assert!(matches!(e, Error::InvalidArgument(_)), "{tile}: {e:?}");
    }
}

#[test]
fn empty_and_zero_depth_products() {
    // K = 0: zeros, even where the output's memory held something else before.
    let junk = dev().upload(&[7.0f32; 4096], &[4096]).unwrap();
    drop(junk);
    let a = dev().upload::<f32>(&[], &[33, 0]).unwrap();
    let b = dev().upload::<f32>(&[], &[0, 17]).unwrap();
    let out = dev()
        .run("MatMul", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
        .unwrap();
    assert_eq!(out[0].shape(), &[33, 17]);
    assert_eq!(out[0].download::<f32>().unwrap(), vec![0.0; 33 * 17]);
    // Empty M or N: an empty output.
    for (sa, sb, want) in [
        (vec![0usize, 5], vec![5usize, 3], vec![0usize, 3]),
        (vec![4, 5], vec![5, 0], vec![4, 0]),
    ] {
        let a = dev()
            .upload(&vec![1.0f32; sa.iter().product()], &sa)
            .unwrap();
        let b = dev()
            .upload(&vec![1.0f32; sb.iter().product()], &sb)
            .unwrap();
        let out = dev()
            .run("MatMul", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
            .unwrap();
        assert_eq!(out[0].shape(), want.as_slice());
        assert!(out[0].download::<f32>().unwrap().is_empty());
    }
    // An empty batch, and batched K = 0.
    let a = dev().upload::<f32>(&[], &[0, 2, 3]).unwrap();
    let b = dev().upload(&[1.0f32; 12], &[3, 4]).unwrap();
    let out = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&a), Arg::from(&b)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &[0, 2, 4]);
    let a = dev().upload::<f32>(&[], &[3, 2, 0]).unwrap();
    let b = dev().upload::<f32>(&[], &[1, 0, 5]).unwrap();
    let out = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&a), Arg::from(&b)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &[3, 2, 5]);
    assert_eq!(out[0].download::<f32>().unwrap(), vec![0.0; 30]);
}

#[test]
fn batch_matmul_broadcasts_batch_dimensions() {
    let mut seed = 100;
    for (a_batch, b_batch) in [
        (vec![2usize, 1], vec![3usize]),
        (vec![3], vec![2, 1]),
        (vec![4], vec![]),
        (vec![], vec![5]),
        (vec![2, 3], vec![2, 3]),
        (vec![1, 3, 1], vec![2, 1, 4]),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for op in ["BatchMatMulV2", "BatchMatMulV3"] {
                check_f32(op, &a_batch, &b_batch, 7, 9, 5, ta, tb, seed);
                seed += 1;
            }
        }
    }
    // Larger matrices (the 64x64 tile rather than the small one).
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        check_f32(
            "BatchMatMulV2",
            &[1, 3, 1],
            &[2, 1, 4],
            20,
            9,
            11,
            ta,
            tb,
            seed,
        );
        seed += 1;
    }
    check_f32("BatchMatMulV2", &[2, 1], &[3], 65, 33, 17, false, true, 7);
    check_f32("BatchMatMulV2", &[3], &[3], 129, 1, 70, true, false, 8);
}

#[test]
fn batch_matmul_v1_needs_equal_batches() {
    check_f32("BatchMatMul", &[3], &[3], 9, 5, 7, false, false, 200);
    check_f32("BatchMatMul", &[2, 2], &[2, 2], 4, 65, 3, true, true, 201);
    check_f32("BatchMatMul", &[], &[], 5, 6, 7, true, false, 202);
    let a = dev().upload(&[1.0f32; 2 * 3 * 4], &[2, 3, 4]).unwrap();
    let b = dev().upload(&[1.0f32; 4 * 5], &[1, 4, 5]).unwrap();
    let e = dev()
        .run(
            "BatchMatMul",
            &Attrs::new(),
            &[Arg::from(&a), Arg::from(&b)],
        )
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(
        e.to_string().contains("[2,3,4]") && e.to_string().contains("[1,4,5]"),
        "{e}"
    );
    // The same shapes broadcast under V2.
    let out = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&a), Arg::from(&b)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &[2, 3, 5]);
    assert_eq!(out[0].download::<f32>().unwrap(), vec![4.0; 30]);
}

fn run_i32(op: &str, a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Vec<i32> {
    let out = dev()
        .run(
            op,
            &attrs(op, ta, tb, DType::I32),
            &[Arg::from(a), Arg::from(b)],
        )
        .unwrap();
    out[0].download::<i32>().unwrap()
}

#[test]
fn int32_products_are_exact() {
    let mut r = rng(300);
    for (batch, m, k, n) in [(1usize, 7usize, 129usize, 65usize), (3, 5, 9, 66)] {
        for (ta, tb) in [(false, false), (true, true), (true, false), (false, true)] {
            let sa = stored(&[batch], m, k, ta);
            let sb = stored(&[batch], k, n, tb);
            let a = rand_i32(&mut r, sa.iter().product(), -1000, 1000);
            let b = rand_i32(&mut r, sb.iter().product(), -1000, 1000);
            let ga = dev().upload(&a, &sa).unwrap();
            let gb = dev().upload(&b, &sb).unwrap();
            let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
            let (_, want, _) = reference(&a64, &sa, &b64, &sb, ta, tb);
            let want: Vec<i32> = want.iter().map(|&v| v as i32).collect();
            for op in ["BatchMatMulV2", "BatchMatMulV3"] {
                assert_eq!(run_i32(op, &ga, &gb, ta, tb), want, "{op} {sa:?} {sb:?}");
            }
            if batch == 1 {
                let ga = dev().upload(&a, &sa[1..]).unwrap();
                let gb = dev().upload(&b, &sb[1..]).unwrap();
                assert_eq!(run_i32("MatMul", &ga, &gb, ta, tb), want, "MatMul");
            }
        }
    }
    // Wrapping arithmetic.
    let a = dev().upload(&[65536i32, 65536], &[1, 2]).unwrap();
    let b = dev().upload(&[65536i32, 3], &[2, 1]).unwrap();
    assert_eq!(run_i32("MatMul", &a, &b, false, false), vec![196608]);
}

#[test]
fn int32_vec4_tiles_are_exact() {
    let mut r = rng(310);
    for t in [(false, false), (true, true)] {
        let tiles = [
            "128x128x8_8x8s1",
            "64x64x16_4x4",
            "128x256x8_8x16h",
            "64x64x16_4x4w",
        ];
        check_int32_tiles(&mut r, (68, 20, 132), t, &tiles, |_| true);
    }
}

/// An int32 MatMul of m x k by k x n (stored transposed as `ta`, `tb`; values in
/// [-1000, 1000)) under each of `tiles` that `runs` accepts: exact against the reference.
fn check_int32_tiles(
    r: &mut StdRng,
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
    tiles: &[&str],
    runs: fn(&str) -> bool,
) {
    let sa = stored(&[], m, k, ta);
    let sb = stored(&[], k, n, tb);
    let a = rand_i32(r, m * k, -1000, 1000);
    let b = rand_i32(r, k * n, -1000, 1000);
    let ga = dev().upload(&a, &sa).unwrap();
    let gb = dev().upload(&b, &sb).unwrap();
    let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    let (_, want, _) = reference(&a64, &sa, &b64, &sb, ta, tb);
    let want: Vec<i32> = want.iter().map(|&v| v as i32).collect();
    for &tile in tiles.iter().filter(|t| runs(t)) {
        let at =
            attrs("MatMul", ta, tb, DType::I32).with("_tfwgpu_tile", AttrValue::Str(tile.into()));
        let out = dev()
            .run("MatMul", &at, &[Arg::from(&ga), Arg::from(&gb)])
            .unwrap();
        assert_eq!(
            out[0].download::<i32>().unwrap(),
            want,
            "{tile} {m}x{k}x{n} {ta} {tb}"
        );
    }
}

#[test]
fn batch_matmul_v3_needs_one_type() {
    let mixed = Attrs::new()
        .with("Ta", AttrValue::Type(DType::F32))
        .with("Tb", AttrValue::Type(DType::F32))
        .with("Tout", AttrValue::Type(DType::I32));
    assert!(matches!(
        dev().kernel("BatchMatMulV3", &mixed).err().unwrap(),
        Error::Unimplemented(_)
    ));
    let half_mixed = Attrs::new()
        .with("Ta", AttrValue::Type(DType::F16))
        .with("Tb", AttrValue::Type(DType::F32))
        .with("Tout", AttrValue::Type(DType::F16));
    assert!(matches!(
        dev().kernel("BatchMatMulV3", &half_mixed).err().unwrap(),
        Error::Unimplemented(_)
    ));
    // float16 is supported (tests/ewextra_f16.rs); int64 is not.
    let i64 = Attrs::new().with("T", AttrValue::Type(DType::I64));
    assert!(matches!(
        dev().kernel("MatMul", &i64).err().unwrap(),
        Error::Unimplemented(_)
    ));
}

#[test]
fn incompatible_shapes_are_errors() {
    let a = dev().upload(&[1.0f32; 6], &[2, 3]).unwrap();
    let b = dev().upload(&[1.0f32; 20], &[4, 5]).unwrap();
    let e = dev()
        .run("MatMul", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("MatMul: Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5]"),
        "{e}"
    );
    // transpose_b makes [4,5] x ... still incompatible; transpose_a of [2,3] with [2,x] works.
    let b2 = dev().upload(&[1.0f32; 10], &[2, 5]).unwrap();
    let out = dev()
        .run(
            "MatMul",
            &attrs("MatMul", true, false, DType::F32),
            &[Arg::from(&a), Arg::from(&b2)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &[3, 5]);
    assert_eq!(out[0].download::<f32>().unwrap(), vec![2.0; 15]);
    // Rank errors.
    let v = dev().upload(&[1.0f32; 3], &[3]).unwrap();
    let c = dev().upload(&[1.0f32; 12], &[2, 2, 3]).unwrap();
    for (x, y) in [(&v, &a), (&c, &b)] {
        let e = dev()
            .run("MatMul", &Attrs::new(), &[Arg::from(x), Arg::from(y)])
            .err()
            .unwrap();
        assert!(e.to_string().contains("is not a matrix"), "{e}");
    }
    let e = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&v), Arg::from(&a)],
        )
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    // Batch dimensions that do not broadcast.
    let x = dev().upload(&[1.0f32; 2 * 2 * 3], &[2, 2, 3]).unwrap();
    let y = dev().upload(&[1.0f32; 3 * 3 * 4], &[3, 3, 4]).unwrap();
    let e = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&x), Arg::from(&y)],
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("compatible batch dimensions"), "{e}");
    assert!(e.to_string().contains("[2,2,3] vs. [3,3,4]"), "{e}");
    // Mismatched inner dimensions of batched operands.
    let y = dev().upload(&[1.0f32; 2 * 4 * 4], &[2, 4, 4]).unwrap();
    let e = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&x), Arg::from(&y)],
        )
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("Matrix size-incompatible: In[0]: [2,2,3], In[1]: [2,4,4]"),
        "{e}"
    );
    // Mixed dtypes.
    let i = dev().upload(&[1i32; 15], &[3, 5]).unwrap();
    assert!(
        dev()
            .run("MatMul", &Attrs::new(), &[Arg::from(&a), Arg::from(&i)])
            .is_err()
    );
}

#[test]
fn many_small_batches() {
    // More batches than one dispatch dimension holds (65535): the kernel splits the grid.
    let nb = 70_000;
    let mut r = rng(400);
    let a = rand_f32(&mut r, nb * 2, -1.0, 1.0);
    let b = rand_f32(&mut r, nb * 2, -1.0, 1.0);
    let ga = dev().upload(&a, &[nb, 1, 2]).unwrap();
    let gb = dev().upload(&b, &[nb, 2, 1]).unwrap();
    let out = dev()
        .run(
            "BatchMatMulV2",
            &Attrs::new(),
            &[Arg::from(&ga), Arg::from(&gb)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &[nb, 1, 1]);
    let got = out[0].download::<f32>().unwrap();
    for i in 0..nb {
        let w = a[2 * i] as f64 * b[2 * i] as f64 + a[2 * i + 1] as f64 * b[2 * i + 1] as f64;
        let s = (a[2 * i] as f64 * b[2 * i] as f64).abs()
            + (a[2 * i + 1] as f64 * b[2 * i + 1] as f64).abs();
        assert!(
            (got[i] as f64 - w).abs() <= 4.0 * EPS * s,
            "[{i}]: got {}, want {w}",
            got[i]
        );
    }
}

#[test]
fn nan_and_inf_propagate() {
    // A NaN in row 1 of A poisons row 1 of C; an inf in column 2 of B makes column 2 infinite
    // (or NaN where it meets the NaN); padding of partial tiles never creates 0 * inf.
    let (m, k, n) = (9, 11, 10);
    let mut a = vec![0.5f32; m * k];
    let mut b = vec![0.25f32; k * n];
    a[k + 3] = f32::NAN;
    b[4 * n + 2] = f32::INFINITY;
    let ga = dev().upload(&a, &[m, k]).unwrap();
    let gb = dev().upload(&b, &[k, n]).unwrap();
    let out = dev()
        .run("MatMul", &Attrs::new(), &[Arg::from(&ga), Arg::from(&gb)])
        .unwrap();
    let got = out[0].download::<f32>().unwrap();
    let mut want = vec![0.5f32 * 0.25 * k as f32; m * n];
    for i in 0..m {
        want[i * n + 2] = f32::INFINITY;
    }
    for j in 0..n {
        want[n + j] = f32::NAN;
    }
    assert_close(&got, &want, 1e-6, 0.0, "MatMul nan/inf");
}

/// Whether a forced CPU tile ran, or was refused because the device has no subgroups of one
/// fixed size (said visibly).
fn cpu_tile_runs(tile: &str) -> bool {
    let a = dev().upload(&[1.0f32; 8], &[2, 4]).unwrap();
    let b = dev().upload(&[1.0f32; 12], &[4, 3]).unwrap();
    match dev().run(
        "MatMul",
        &Attrs::new().with("_tfwgpu_tile", AttrValue::Str(tile.into())),
        &[Arg::from(&a), Arg::from(&b)],
    ) {
        Ok(out) => {
            assert_eq!(out[0].download::<f32>().unwrap(), vec![4.0; 6], "{tile}");
            true
        }
        Err(Error::Unimplemented(e)) if tile.starts_with("sg") => {
            eprintln!("SKIPPED {tile}: {e}");
            false
        }
        Err(e) => panic!("{tile}: {e}"),
    }
}

/// The CPU-adapter variants (`matmul/cpu.rs`), each forced: partial tiles in M and N, K not a
/// multiple of the unroll (4), every transpose (vector loads where the layout allows, scalar
/// otherwise), broadcast batches.
#[test]
fn cpu_tiles_edge_shapes_and_every_transpose() {
    let mut seed = 900;
    let tiles = [
        "sg8x4",
        "sg32x8",
        "sg64x4",
        "cpu8x8_8x1",
        "cpu4x8_2x4",
        "cpu8x8_8x1_scalar",
    ];
    for tile in tiles {
        if !cpu_tile_runs(tile) {
            continue;
        }
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 5, 3),
            (33, 13, 70),
            (68, 36, 132),
            (9, 8, 12),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                check_f32_tile("MatMul", Some(tile), &[], &[], m, k, n, ta, tb, seed);
                seed += 1;
            }
        }
        check_f32_tile(
            "BatchMatMulV2",
            Some(tile),
            &[2, 1],
            &[3],
            20,
            12,
            36,
            false,
            true,
            seed,
        );
        check_f32_tile(
            "BatchMatMulV2",
            Some(tile),
            &[3],
            &[2, 1],
            17,
            7,
            5,
            true,
            false,
            seed + 1,
        );
        seed += 2;
    }
}

#[test]
fn int32_cpu_tiles_are_exact() {
    let mut r = rng(330);
    for mkn in [(68, 20, 132), (13, 7, 5)] {
        for t in [(false, false), (true, true), (false, true)] {
            check_int32_tiles(&mut r, mkn, t, &["sg32x8", "cpu8x8_8x1"], cpu_tile_runs);
        }
    }
}

/// The split-K kernel (forced) on awkward shapes, every transpose: N around its 8-column
/// blocks, K below, at and past its 128 invocations, the Keras CNN's Dense layer (64 x 10
/// over 1152), and batch broadcasting.
#[test]
fn splitk_edge_shapes_every_transpose_and_batches() {
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (2, 127, 8),
        (5, 128, 9),
        (7, 129, 16),
        (64, 1152, 10),
        (1, 2049, 17),
        (33, 300, 1),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (j, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let seed = 900 + (i * 4 + j) as u64;
            check_f32_tile(
                "MatMul",
                Some("splitk128x8"),
                &[],
                &[],
                m,
                k,
                n,
                ta,
                tb,
                seed,
            );
        }
    }
    check_f32_tile(
        "BatchMatMulV2",
        Some("splitk128x8"),
        &[3, 1],
        &[1, 2],
        4,
        300,
        10,
        false,
        true,
        950,
    );
    check_f32_tile(
        "BatchMatMulV2",
        Some("splitk128x8"),
        &[2],
        &[2],
        9,
        260,
        3,
        true,
        false,
        951,
    );
}

/// The automatic choice for GPU adapters ("gpu") on the shapes that take the split-K kernel,
/// against the reference (on a CPU adapter the automatic choice is the CPU tiles).
#[test]
fn gpu_choice_takes_splitk_for_few_outputs_over_long_k() {
    use tfwgpu_runtime::kernels::matmul::splitk_applies;
    assert!(
        splitk_applies(1, 64, 10, 1152),
        "the Keras CNN's Dense layer"
    );
    assert!(!splitk_applies(1, 64, 10, 255), "too shallow");
    assert!(
        !splitk_applies(1, 64, 1152, 10),
        "its input gradient: shallow, many outputs"
    );
    assert!(!splitk_applies(1, 1152, 10, 64), "its filter gradient");
    assert!(!splitk_applies(2, 64, 64, 4096), "too many outputs");
    for (i, &(m, k, n)) in [(64, 1152, 10), (16, 512, 16)].iter().enumerate() {
        check_f32_tile(
            "MatMul",
            Some("gpu"),
            &[],
            &[],
            m,
            k,
            n,
            false,
            false,
            960 + i as u64,
        );
    }
}

#[test]
fn int32_splitk_is_exact() {
    let mut r = rng(970);
    for (m, k, n) in [(3, 300, 10), (1, 129, 1), (9, 1000, 17)] {
        for tt in [(false, false), (true, true)] {
            check_int32_tiles(&mut r, (m, k, n), tt, &["splitk128x8"], |_| true);
        }
    }
}
