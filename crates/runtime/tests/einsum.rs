//! Einsum against a naive f64 reference (every assignment of the labels summed): Keras's
//! EinsumDense and MultiHeadAttention equations, transposes, sums, diagonals in the inputs and
//! the output, ellipsis broadcasting, empty dimensions, float16, and TensorFlow's errors.
mod common;
use common::*;

use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, f16};

/// f32 unit roundoff.
const EPS: f64 = f32::EPSILON as f64 / 2.0;

fn attrs(eq: &str, n: usize, dtype: DType) -> Attrs {
    Attrs::new()
        .with("equation", AttrValue::Str(eq.to_string()))
        .with("N", AttrValue::Int(n as i64))
        .with("T", AttrValue::Type(dtype))
}

/// The labels of each subscript with an ellipsis replaced by upper-case labels, aligned right
/// over `max` broadcast dimensions (the reference's own small parser).
fn expand(sub: &str, rank: Option<usize>, max: usize) -> Vec<char> {
    let bcast: Vec<char> = (0..max).map(|j| (b'A' + j as u8) as char).collect();
    match sub.find("...") {
        None => sub.chars().collect(),
        Some(p) => {
            let named = sub.len() - 3;
            let n = rank.map_or(max, |r| r - named);
            let mut v: Vec<char> = sub[..p].chars().collect();
            v.extend(&bcast[max - n..]);
            v.extend(sub[p + 3..].chars());
            v
        }
    }
}

/// (output shape, value, sum of |terms|) of `eq` over `inputs` (data, shape).
fn reference(eq: &str, inputs: &[(&[f64], &[usize])]) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let (lhs, out) = eq.split_once("->").unwrap();
    let subs: Vec<&str> = lhs.split(',').collect();
    let max = subs
        .iter()
        .zip(inputs)
        .map(|(s, (_, shape))| {
            if s.contains("...") {
                shape.len() + 3 - s.len()
            } else {
                0
            }
        })
        .max()
        .unwrap();
    let labels: Vec<Vec<char>> = subs
        .iter()
        .zip(inputs)
        .map(|(s, (_, shape))| expand(s, Some(shape.len()), max))
        .collect();
    let out_labels = expand(out, None, max);
    let mut size = std::collections::BTreeMap::new();
    for (ls, (_, shape)) in labels.iter().zip(inputs) {
        for (c, &d) in ls.iter().zip(shape.iter()) {
            let e = size.entry(*c).or_insert(d);
            *e = (*e).max(d);
        }
    }
    let all: Vec<char> = size.keys().copied().collect();
    let out_shape: Vec<usize> = out_labels.iter().map(|c| size[c]).collect();
    let n_out: usize = out_shape.iter().product();
    let (mut val, mut abs) = (vec![0.0; n_out], vec![0.0; n_out]);
    let total: usize = all.iter().map(|c| size[c]).product();
    let offset = |ls: &[char], shape: &[usize], at: &dyn Fn(char) -> usize| {
        let mut o = 0;
        for (c, &d) in ls.iter().zip(shape) {
            o = o * d + if d == 1 { 0 } else { at(*c) };
        }
        o
    };
    for t in 0..total {
        let mut rem = t;
        let mut coord = std::collections::BTreeMap::new();
        for c in all.iter().rev() {
            coord.insert(*c, rem % size[c]);
            rem /= size[c];
        }
        let at = |c: char| coord[&c];
        let mut p = 1.0;
        for (ls, (data, shape)) in labels.iter().zip(inputs) {
            p *= data[offset(ls, shape, &at)];
        }
        let o = offset(&out_labels, &out_shape, &at);
        val[o] += p;
        abs[o] += p.abs();
    }
    (out_shape, val, abs)
}

/// Runs `eq` in float32 on random inputs of `shapes` and checks every output element within
/// f32 accumulation's bound over its terms, (terms + 2) u sum|terms|.
fn check(eq: &str, shapes: &[&[usize]], seed: u64) {
    let mut r = rng(seed);
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| rand_f32(&mut r, s.iter().product(), -1.0, 1.0))
        .collect();
    let tensors = upload_all(&data, shapes);
    // Poison freed memory the output may reuse, so that elements left unwritten show.
    drop(dev().upload(&vec![f32::NAN; 4096], &[4096]).unwrap());
    let args: Vec<Arg> = tensors.iter().map(Arg::from).collect();
    let out = dev()
        .run("Einsum", &attrs(eq, shapes.len(), DType::F32), &args)
        .unwrap_or_else(|e| panic!("{eq} {shapes:?}: {e}"));
    let d64: Vec<Vec<f64>> = data
        .iter()
        .map(|d| d.iter().map(|&v| v as f64).collect())
        .collect();
    let ins: Vec<(&[f64], &[usize])> = d64
        .iter()
        .zip(shapes)
        .map(|(d, s)| (d.as_slice(), *s))
        .collect();
    let (shape, want, abs) = reference(eq, &ins);
    assert_eq!(out[0].shape(), shape.as_slice(), "{eq} {shapes:?}");
    let got = out[0].download::<f32>().unwrap();
    // Terms per output element: the product of the summed labels' sizes, at most all.
    let terms = shapes
        .iter()
        .map(|s| s.iter().product::<usize>())
        .max()
        .unwrap_or(1) as f64;
    for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&abs).enumerate() {
        let tol = (terms + 2.0) * EPS * s;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{eq} {shapes:?}[{i}]: got {g}, want {w} (tol {tol:e})"
        );
    }
}

#[test]
fn keras_equations() {
    // EinsumDense projections, MultiHeadAttention's scores and their combination, and the
    // equations of their gradients (TensorFlow's _EinsumGrad).
    check("abc,cde->abde", &[&[2, 5, 8], &[8, 3, 4]], 1);
    check("abcd,cde->abe", &[&[2, 5, 3, 4], &[3, 4, 8]], 2);
    check("aecd,abcd->acbe", &[&[2, 6, 3, 4], &[2, 5, 3, 4]], 3);
    check("acbe,aecd->abcd", &[&[2, 3, 5, 6], &[2, 6, 3, 4]], 4);
    check("abde,cde->abc", &[&[2, 5, 3, 4], &[8, 3, 4]], 5);
    check("abde,abc->cde", &[&[2, 5, 3, 4], &[2, 5, 8]], 6);
    check("acbe,abcd->aecd", &[&[2, 3, 5, 6], &[2, 5, 3, 4]], 7);
    check("acbe,aecd->abcd", &[&[1, 3, 5, 6], &[1, 6, 3, 4]], 8);
    check("ab,bc->ac", &[&[7, 33], &[33, 9]], 9);
    check("bij,bjk->bik", &[&[3, 4, 5], &[3, 5, 2]], 10);
}

#[test]
fn transposes_sums_and_products() {
    check("ij->ji", &[&[5, 7]], 11);
    check("ijk->kij", &[&[3, 4, 5]], 12);
    check("ij->", &[&[5, 7]], 13);
    check("ijk->kj", &[&[3, 4, 5]], 14);
    check("ijk->ik", &[&[3, 4, 5]], 15);
    check("i,j->ij", &[&[5], &[7]], 16);
    check("i,i->", &[&[9], &[9]], 17);
    check("i,i->i", &[&[9], &[9]], 18);
    check("ij,ij->ij", &[&[4, 5], &[4, 5]], 19);
    check("ijk,jil->kl", &[&[3, 4, 5], &[4, 3, 2]], 20);
    check("ij,jk->k", &[&[3, 4], &[4, 5]], 21);
    check("abc,cd->d", &[&[2, 3, 4], &[4, 5]], 22);
    check("ij,kl->", &[&[2, 3], &[4, 5]], 23);
    check("ab,ab->ba", &[&[3, 4], &[3, 4]], 24);
    check("bfd,bjd->bjf", &[&[2, 5, 4], &[2, 3, 4]], 25);
}

#[test]
fn diagonals_in_inputs_and_outputs() {
    check("ii->i", &[&[5, 5]], 31);
    check("ii->", &[&[5, 5]], 32);
    check("iij->ji", &[&[4, 4, 3]], 33);
    check("iji->j", &[&[4, 3, 4]], 34);
    check("ii,ij->j", &[&[3, 3], &[3, 5]], 35);
    // Repeated output labels write a diagonal; the rest of the output is zero.
    check("i->ii", &[&[5]], 36);
    check("ij->iij", &[&[3, 4]], 37);
    check("ij->iji", &[&[3, 4]], 38);
    check("ij,jk->iik", &[&[3, 4], &[4, 2]], 39);
    // TensorFlow's gradient of a batched diagonal: thousands of small diagonals in one pass.
    check("bi->bii", &[&[5000, 3]], 40);
    check("abc->cabca", &[&[2, 3, 4]], 48);
}

#[test]
fn ellipsis_broadcasting() {
    check("...ij,...jk->...ik", &[&[2, 1, 3, 4], &[5, 4, 2]], 41);
    check("...ij,...jk->...ik", &[&[3, 4], &[2, 4, 5]], 42);
    check("...i,i->...", &[&[2, 3, 4], &[4]], 43);
    check("i...->...i", &[&[3, 2, 5]], 44);
    check("...->...", &[&[2, 3]], 45);
    check("a...c,c...d->a...d", &[&[2, 3, 1, 4], &[4, 1, 5, 6]], 46);
    check("...ij,jk->...ik", &[&[3, 4], &[4, 2]], 47);
}

#[test]
fn empty_dimensions() {
    check("ij,jk->ik", &[&[3, 0], &[0, 4]], 51);
    check("ij,jk->ik", &[&[0, 3], &[3, 4]], 52);
    check("ij->j", &[&[0, 3]], 53);
    check("ij->i", &[&[3, 0]], 54);
}

#[test]
fn float16_products() {
    let mut r = rng(61);
    for (eq, sa, sb) in [
        (
            "aecd,abcd->acbe",
            &[2usize, 6, 3, 4][..],
            &[2usize, 5, 3, 4][..],
        ),
        ("ijk,jil->kl", &[3, 4, 5], &[4, 3, 2]),
    ] {
        let a: Vec<f16> = rand_f32(&mut r, sa.iter().product(), -1.0, 1.0)
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let b: Vec<f16> = rand_f32(&mut r, sb.iter().product(), -1.0, 1.0)
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let ta = dev().upload(&a, sa).unwrap();
        let tb = dev().upload(&b, sb).unwrap();
        let out = dev()
            .run(
                "Einsum",
                &attrs(eq, 2, DType::F16),
                &[Arg::from(&ta), Arg::from(&tb)],
            )
            .unwrap();
        let a64: Vec<f64> = a.iter().map(|v| v.to_f64()).collect();
        let b64: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
        let (shape, want, abs) = reference(eq, &[(&a64, sa), (&b64, sb)]);
        assert_eq!(out[0].shape(), shape.as_slice(), "{eq}");
        let got = out[0].download::<f16>().unwrap();
        // f32 accumulation, one rounding to f16 (2^-11 relative) of the sum.
        for (i, ((g, &w), &s)) in got.iter().zip(&want).zip(&abs).enumerate() {
            let tol = w.abs() * 2f64.powi(-11) + 64.0 * EPS * s + 1e-7;
            assert!(
                (g.to_f64() - w).abs() <= tol,
                "{eq}[{i}]: got {g}, want {w} (tol {tol:e})"
            );
        }
    }
}

fn run_err(eq: &str, shapes: &[&[usize]]) -> Error {
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| vec![0.0; s.iter().product()])
        .collect();
    let tensors = upload_all(&data, shapes);
    let args: Vec<Arg> = tensors.iter().map(Arg::from).collect();
    match dev().run("Einsum", &attrs(eq, shapes.len(), DType::F32), &args) {
        Ok(_) => panic!("{eq} {shapes:?} ran"),
        Err(e) => e,
    }
}

#[test]
fn tensorflow_errors() {
    let msg = |eq: &str, shapes: &[&[usize]]| match run_err(eq, shapes) {
        Error::InvalidArgument(m) => m,
        e => panic!("{eq}: {e:?}"),
    };
    assert_eq!(
        msg("ij,jk", &[&[2, 3], &[3, 4]]),
        "Expecting exactly one '->' in einsum equation: ij,jk"
    );
    assert_eq!(
        msg("i,j,k->ijk", &[&[2], &[3], &[4]]),
        "Expecting 1 or 2 input subscripts in equation 'i,j,k->ijk' but got: 3"
    );
    assert_eq!(
        msg("ij,jk->ik", &[&[2, 3, 1], &[3, 4]]),
        "Expected input 0 to have rank 2 but got: 3"
    );
    assert_eq!(
        msg("ij,jk->ik", &[&[2, 3], &[4, 4]]),
        "Expected dimension 3 at axis 0 of the input shaped [4,4] but got dimension 4"
    );
    assert_eq!(
        msg("...ij->ij", &[&[2, 3, 4]]),
        "Output contains 1 broadcasting dimension(s) but no ellipsis (...) was found in the \
         output subscripts."
    );
    assert_eq!(
        msg("...ijk->ij", &[&[3, 4]]),
        "Expected input 0 to have rank at least 3 but got: 2"
    );
    assert!(msg("ij->ik", &[&[2, 3]]).contains("'k' appears in no input"));
    assert!(msg("...i,...i->...i", &[&[2, 3], &[4, 3]]).contains("do not broadcast"));
}
