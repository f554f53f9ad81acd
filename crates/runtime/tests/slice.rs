//! The slice family against CPU references: Slice, StridedSlice (masks, negative strides,
//! clamping, zero sizes), StridedSliceGrad, Pad, PadV2, MirrorPad, MirrorPadGrad, GatherV2,
//! OneHot, Range, Erf and Erfc, over every registered dtype (bool/uint8/float16 with odd
//! lengths, so packed words are partly written).
mod common;
use common::*;

use rand::{Rng, rngs::StdRng};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Element, HostTensor, Result, Tensor, f16};

const MOVE: [DType; 5] = [DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool];

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Random contents of any dtype (any bit pattern for the float types: data movement must be
/// bit-exact, NaN payloads included).
fn rand_host(rng: &mut StdRng, dtype: DType, shape: &[usize]) -> HostTensor {
    let n = numel(shape);
    let bytes: Vec<u8> = if dtype == DType::Bool {
        (0..n).map(|_| rng.random_range(0..2u8)).collect()
    } else {
        (0..n * dtype.size()).map(|_| rng.random()).collect()
    };
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

/// Runs an op on host tensors; `device` says which arguments go to the device.
fn run(
    op: &str,
    attrs: &Attrs,
    args: &[(&HostTensor, bool)],
) -> tfwgpu_runtime::Result<HostTensor> {
    let d = dev();
    let uploaded: Vec<_> = args
        .iter()
        .map(|(h, on_dev)| on_dev.then(|| d.upload_host(h).unwrap()))
        .collect();
    let a: Vec<Arg> = args
        .iter()
        .zip(&uploaded)
        .map(|((h, _), u)| match u {
            Some(t) => Arg::from(t),
            None => Arg::from(*h),
        })
        .collect();
    let out = d.run(op, attrs, &a)?;
    out[0].download_host()
}

/// The row-major multi-index of flat index `i`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

fn ravel(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (&x, &n)| acc * n + x)
}

/// The reference of an index map: output element at multi-index c is input element f(c), or
/// `fill` when f gives None.
fn map_ref(
    x: &HostTensor,
    out_shape: &[usize],
    fill: &[u8],
    f: impl Fn(&[usize]) -> Option<usize>,
) -> HostTensor {
    let es = x.dtype.size();
    let mut bytes = vec![];
    for i in 0..numel(out_shape) {
        match f(&unravel(i, out_shape)) {
            Some(j) => bytes.extend_from_slice(&x.bytes[j * es..(j + 1) * es]),
            None => bytes.extend_from_slice(fill),
        }
    }
    HostTensor {
        dtype: x.dtype,
        shape: out_shape.to_vec(),
        bytes,
    }
}

fn assert_same(got: &HostTensor, want: &HostTensor, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    if got.bytes != want.bytes {
        let es = want.dtype.size();
        let i = (0..want.bytes.len() / es)
            .find(|&i| got.bytes[i * es..(i + 1) * es] != want.bytes[i * es..(i + 1) * es])
            .unwrap();
        panic!(
            "{what}: element {i} {:?}: got {:?}, want {:?}",
            unravel(i, &want.shape),
            &got.bytes[i * es..(i + 1) * es],
            &want.bytes[i * es..(i + 1) * es]
        );
    }
}

fn i64s(v: &[i64]) -> HostTensor {
    HostTensor::new(v, &[v.len()]).unwrap()
}

// ---------------------------------------------------------------- Slice

#[test]
fn slice_every_dtype_random_windows() {
    let mut rng = rng(1);
    let shapes: &[&[usize]] = &[
        &[],
        &[7],
        &[129],
        &[3, 5],
        &[2, 3, 7],
        &[4, 1, 3, 5],
        &[0, 3],
    ];
    for &dtype in &MOVE {
        for shape in shapes {
            for _ in 0..3 {
                let x = rand_host(&mut rng, dtype, shape);
                let begin: Vec<i64> = shape
                    .iter()
                    .map(|&d| rng.random_range(0..=d) as i64)
                    .collect();
                let size: Vec<i64> = shape
                    .iter()
                    .zip(&begin)
                    .map(|(&d, &b)| {
                        if rng.random_range(0..4) == 0 {
                            -1
                        } else {
                            rng.random_range(0..=(d as i64 - b))
                        }
                    })
                    .collect();
                let out_shape: Vec<usize> = shape
                    .iter()
                    .zip(&begin)
                    .zip(&size)
                    .map(|((&d, &b), &s)| if s == -1 { d - b as usize } else { s as usize })
                    .collect();
                let got = run(
                    "Slice",
                    &Attrs::new(),
                    &[(&x, true), (&i64s(&begin), false), (&i64s(&size), false)],
                )
                .unwrap();
                let want = map_ref(&x, &out_shape, &[], |c| {
                    let src: Vec<usize> = c
                        .iter()
                        .zip(&begin)
                        .map(|(&c, &b)| c + b as usize)
                        .collect();
                    Some(ravel(&src, shape))
                });
                assert_same(
                    &got,
                    &want,
                    &format!("Slice {dtype} {shape:?} {begin:?} {size:?}"),
                );
            }
        }
    }
}

#[test]
fn slice_errors() {
    let x = rand_host(&mut rng(2), DType::F32, &[3, 4]);
    for (b, s) in [
        (vec![0, 5], vec![1, 1]),
        (vec![1, 1], vec![3, 1]),
        (vec![0], vec![1]),
    ] {
        let e = run(
            "Slice",
            &Attrs::new(),
            &[(&x, true), (&i64s(&b), false), (&i64s(&s), false)],
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("Slice"), "{e}");
    }
}

// ---------------------------------------------------------------- StridedSlice

/// Python's slice(start, stop, step).indices(n) as a list of indices, written independently of
/// the kernel's canonicalization.
fn py_range(n: usize, start: Option<i64>, stop: Option<i64>, step: i64) -> Vec<usize> {
    let n = n as i64;
    let adjust = |v: i64, lo: i64, hi: i64| {
        let v = if v < 0 { v + n } else { v };
        v.max(lo).min(hi)
    };
    let (lo, hi) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let s = start.map_or(if step > 0 { lo } else { hi }, |v| adjust(v, lo, hi));
    let e = stop.map_or(if step > 0 { hi } else { lo }, |v| adjust(v, lo, hi));
    let mut out = vec![];
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(i as usize);
        i += step;
    }
    out
}

/// One Python index item.
#[derive(Clone, Copy)]
enum Item {
    Range(Option<i64>, Option<i64>, i64),
    Index(i64),
    NewAxis,
    Ellipsis,
}

/// The StridedSlice inputs and attributes for a Python index expression.
fn encode(items: &[Item]) -> (Vec<i64>, Vec<i64>, Vec<i64>, Attrs) {
    let (mut b, mut e, mut s) = (vec![], vec![], vec![]);
    let mut m = [0i64; 5]; // begin, end, ellipsis, new_axis, shrink
    for (i, it) in items.iter().enumerate() {
        let bit = 1i64 << i;
        match *it {
            Item::Range(start, stop, step) => {
                b.push(start.unwrap_or(0));
                e.push(stop.unwrap_or(0));
                s.push(step);
                if start.is_none() {
                    m[0] |= bit;
                }
                if stop.is_none() {
                    m[1] |= bit;
                }
            }
            Item::Index(v) => {
                b.push(v);
                e.push(v + 1);
                s.push(1);
                m[4] |= bit;
            }
            Item::NewAxis => {
                b.push(0);
                e.push(0);
                s.push(1);
                m[3] |= bit;
            }
            Item::Ellipsis => {
                b.push(0);
                e.push(0);
                s.push(1);
                m[2] |= bit;
            }
        }
    }
    let names = [
        "begin_mask",
        "end_mask",
        "ellipsis_mask",
        "new_axis_mask",
        "shrink_axis_mask",
    ];
    let mut attrs = Attrs::new();
    for (n, v) in names.iter().zip(m) {
        attrs.set(n, AttrValue::Int(v));
    }
    (b, e, s, attrs)
}

/// NumPy-style reference: per input dimension the list of indices taken, and the output shape.
fn index_ref(shape: &[usize], items: &[Item]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let explicit = items
        .iter()
        .filter(|i| matches!(i, Item::Range(..) | Item::Index(_)))
        .count();
    let mut items = items.to_vec();
    if !items.iter().any(|i| matches!(i, Item::Ellipsis)) {
        items.push(Item::Ellipsis);
    }
    let mut per_dim = vec![];
    let mut out_shape = vec![];
    let mut d = 0;
    for it in items {
        match it {
            Item::Range(a, b, s) => {
                let r = py_range(shape[d], a, b, s);
                out_shape.push(r.len());
                per_dim.push(r);
                d += 1;
            }
            Item::Index(v) => {
                let v = if v < 0 { v + shape[d] as i64 } else { v };
                per_dim.push(vec![v as usize]);
                d += 1;
            }
            Item::NewAxis => out_shape.push(1),
            Item::Ellipsis => {
                let left = shape.len() - explicit;
                for _ in 0..left {
                    per_dim.push((0..shape[d]).collect());
                    out_shape.push(shape[d]);
                    d += 1;
                }
            }
        }
    }
    (per_dim, out_shape)
}

fn strided_case(rng: &mut StdRng, dtype: DType, shape: &[usize], items: &[Item]) {
    let x = rand_host(rng, dtype, shape);
    let (b, e, s, attrs) = encode(items);
    let got = run(
        "StridedSlice",
        &attrs,
        &[
            (&x, true),
            (&i64s(&b), false),
            (&i64s(&e), false),
            (&i64s(&s), false),
        ],
    )
    .unwrap();
    let (per_dim, out_shape) = index_ref(shape, items);
    let proc_shape: Vec<usize> = per_dim.iter().map(|v| v.len()).collect();
    let mut want = map_ref(&x, &proc_shape, &[], |c| {
        let src: Vec<usize> = c.iter().zip(&per_dim).map(|(&c, v)| v[c]).collect();
        Some(ravel(&src, shape))
    });
    want.shape = out_shape;
    assert_same(
        &got,
        &want,
        &format!("StridedSlice {dtype} {shape:?} {b:?} {e:?} {s:?}"),
    );

    // The gradient: dy scattered onto the slice's positions, zero elsewhere.
    let dy = rand_host(rng, dtype, &want.shape);
    let shape_t = i64s(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
    let got = run(
        "StridedSliceGrad",
        &attrs,
        &[
            (&shape_t, false),
            (&i64s(&b), false),
            (&i64s(&e), false),
            (&i64s(&s), false),
            (&dy, true),
        ],
    )
    .unwrap();
    let es = dtype.size();
    let mut bytes = vec![0u8; numel(shape) * es];
    for k in 0..numel(&proc_shape) {
        let c = unravel(k, &proc_shape);
        let src: Vec<usize> = c.iter().zip(&per_dim).map(|(&c, v)| v[c]).collect();
        let j = ravel(&src, shape);
        bytes[j * es..(j + 1) * es].copy_from_slice(&dy.bytes[k * es..(k + 1) * es]);
    }
    let want = HostTensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
    };
    assert_same(
        &got,
        &want,
        &format!("StridedSliceGrad {dtype} {shape:?} {b:?} {e:?} {s:?}"),
    );
}

#[test]
fn strided_slice_python_expressions() {
    use Item::*;
    let mut rng = rng(3);
    let cases: Vec<(Vec<usize>, Vec<Item>)> = vec![
        // x[1:-1:2, ..., None]
        (
            vec![7, 3, 5],
            vec![Range(Some(1), Some(-1), 2), Ellipsis, NewAxis],
        ),
        // x[::-1]
        (vec![129], vec![Range(None, None, -1)]),
        // x[-1], x[2, :, ::-2]
        (vec![7, 3], vec![Index(-1)]),
        (
            vec![4, 3, 7],
            vec![Index(2), Range(None, None, 1), Range(None, None, -2)],
        ),
        // clamped and empty ranges
        (
            vec![5, 6],
            vec![Range(Some(-100), Some(100), 3), Range(Some(4), Some(2), 1)],
        ),
        (
            vec![5, 6],
            vec![Range(Some(100), Some(-100), -2), Range(Some(-2), None, -1)],
        ),
        // new axes and ellipsis in the middle
        (
            vec![2, 3, 4, 5],
            vec![
                NewAxis,
                Index(1),
                Ellipsis,
                NewAxis,
                Range(Some(1), Some(4), 2),
            ],
        ),
        (vec![2, 3, 4], vec![Ellipsis, Index(-2)]),
        (
            vec![3],
            vec![Ellipsis, NewAxis, Range(None, None, 2), NewAxis],
        ),
        // large stride, single element
        (
            vec![9, 4],
            vec![
                Range(Some(3), None, 1_000_000_000_000),
                Range(Some(-1), None, -5),
            ],
        ),
        // zero-size input dimension
        (
            vec![0, 4],
            vec![Range(None, None, 1), Range(Some(1), Some(3), 1)],
        ),
        // scalar-like: all shrink
        (vec![3, 4], vec![Index(2), Index(-4)]),
        // odd sizes for packed types
        (
            vec![3, 7],
            vec![Range(Some(1), None, 1), Range(Some(6), Some(0), -3)],
        ),
    ];
    for &dtype in &MOVE {
        for (shape, items) in &cases {
            strided_case(&mut rng, dtype, shape, items);
        }
    }
}

#[test]
fn strided_slice_random_ranges() {
    let mut rng = rng(4);
    for _ in 0..40 {
        let rank = rng.random_range(1..5);
        let shape: Vec<usize> = (0..rank).map(|_| rng.random_range(0..7)).collect();
        let items: Vec<Item> = shape
            .iter()
            .map(|&d| {
                let d = d as i64;
                let opt = |rng: &mut StdRng| {
                    (rng.random_range(0..4) != 0).then(|| rng.random_range(-d - 2..=d + 2))
                };
                let mut step = rng.random_range(-3..=3);
                if step == 0 {
                    step = 1;
                }
                Item::Range(opt(&mut rng), opt(&mut rng), step)
            })
            .collect();
        let dtype = MOVE[rng.random_range(0..MOVE.len())];
        strided_case(&mut rng, dtype, &shape, &items);
    }
}

#[test]
fn strided_slice_errors() {
    let x = rand_host(&mut rng(5), DType::F32, &[3, 4]);
    let try_ss = |b: &[i64], e: &[i64], s: &[i64], attrs: Attrs| {
        run(
            "StridedSlice",
            &attrs,
            &[
                (&x, true),
                (&i64s(b), false),
                (&i64s(e), false),
                (&i64s(s), false),
            ],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    assert!(try_ss(&[0], &[1], &[0], Attrs::new()).contains("must be non-zero"));
    let shrink = Attrs::new().with("shrink_axis_mask", AttrValue::Int(1));
    assert!(try_ss(&[3], &[4], &[1], shrink.clone()).contains("out of bounds"));
    assert!(try_ss(&[1], &[0], &[-1], shrink).contains("only stride 1"));
    let two = Attrs::new().with("ellipsis_mask", AttrValue::Int(3));
    assert!(try_ss(&[0, 0], &[0, 0], &[1, 1], two).contains("Multiple ellipses"));
    assert!(
        try_ss(&[0, 0, 0], &[1, 1, 1], &[1, 1, 1], Attrs::new()).contains("Index out of range")
    );
    assert!(try_ss(&[0, 0], &[1], &[1, 1], Attrs::new()).contains("equal size"));
}

// ---------------------------------------------------------------- Pad, PadV2, MirrorPad

fn pads_t(p: &[(i64, i64)]) -> HostTensor {
    let v: Vec<i32> = p.iter().flat_map(|&(a, b)| [a as i32, b as i32]).collect();
    HostTensor::new(&v, &[p.len(), 2]).unwrap()
}

#[test]
fn pad_constant_every_dtype() {
    let mut rng = rng(6);
    let shapes: &[&[usize]] = &[&[], &[5], &[3, 7], &[2, 1, 3], &[0, 3], &[1, 2, 1, 2, 3]];
    for &dtype in &MOVE {
        for shape in shapes {
            let x = rand_host(&mut rng, dtype, shape);
            let pads: Vec<(i64, i64)> = shape
                .iter()
                .map(|_| (rng.random_range(0..3), rng.random_range(0..4)))
                .collect();
            let out_shape: Vec<usize> = shape
                .iter()
                .zip(&pads)
                .map(|(&d, &(b, a))| d + (b + a) as usize)
                .collect();
            let src = |c: &[usize]| {
                let mut s = vec![];
                for ((&c, &(b, _)), &d) in c.iter().zip(&pads).zip(shape.iter()) {
                    let v = c as i64 - b;
                    if v < 0 || v >= d as i64 {
                        return None;
                    }
                    s.push(v as usize);
                }
                Some(ravel(&s, shape))
            };
            let zero = vec![0u8; dtype.size()];
            let got = run("Pad", &Attrs::new(), &[(&x, true), (&pads_t(&pads), false)]).unwrap();
            assert_same(
                &got,
                &map_ref(&x, &out_shape, &zero, src),
                &format!("Pad {dtype} {shape:?}"),
            );
            let c = rand_host(&mut rng, dtype, &[]);
            let got = run(
                "PadV2",
                &Attrs::new(),
                &[(&x, true), (&pads_t(&pads), false), (&c, false)],
            )
            .unwrap();
            assert_same(
                &got,
                &map_ref(&x, &out_shape, &c.bytes, src),
                &format!("PadV2 {dtype} {shape:?}"),
            );
        }
    }
    let x = rand_host(&mut rng, DType::F32, &[2, 2]);
    let e = run(
        "Pad",
        &Attrs::new(),
        &[(&x, true), (&pads_t(&[(0, 1), (-1, 0)]), false)],
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("non-negative"), "{e}");
}

/// Mirror index of v in [0, n) (REFLECT excludes the edge, SYMMETRIC repeats it).
/// Random paddings valid for the mode (at most the dimension, SYMMETRIC; one less, REFLECT),
/// (before, after) drawn per dimension in order, and the padded shape.
fn mirror_pads(
    rng: &mut StdRng,
    shape: &[usize],
    symmetric: bool,
) -> (Vec<(i64, i64)>, Vec<usize>) {
    let limit = |d: usize| if symmetric { d as i64 } else { d as i64 - 1 };
    let pads: Vec<(i64, i64)> = shape
        .iter()
        .map(|&d| {
            (
                rng.random_range(0..=limit(d)),
                rng.random_range(0..=limit(d)),
            )
        })
        .collect();
    let padded = shape
        .iter()
        .zip(&pads)
        .map(|(&d, &(b, a))| d + (b + a) as usize)
        .collect();
    (pads, padded)
}

/// The flat index in `shape` that MirrorPad copies to padded coordinates `c`.
fn mirror_source(c: &[usize], pads: &[(i64, i64)], shape: &[usize], symmetric: bool) -> usize {
    let s: Vec<usize> = c
        .iter()
        .zip(pads)
        .zip(shape)
        .map(|((&c, &(b, _)), &d)| mirror(c as i64 - b, d as i64, symmetric))
        .collect();
    ravel(&s, shape)
}

fn mirror(v: i64, n: i64, symmetric: bool) -> usize {
    let r = if v < 0 {
        if symmetric { -v - 1 } else { -v }
    } else if v >= n {
        if symmetric {
            2 * n - 1 - v
        } else {
            2 * n - 2 - v
        }
    } else {
        v
    };
    r as usize
}

#[test]
fn mirror_pad_both_modes() {
    let mut rng = rng(7);
    let shapes: &[&[usize]] = &[&[], &[1], &[5], &[3, 7], &[2, 1, 4], &[4, 3, 1, 2, 3]];
    for symmetric in [false, true] {
        let mode = if symmetric { "SYMMETRIC" } else { "REFLECT" };
        let attrs = Attrs::new().with("mode", AttrValue::Str(mode.into()));
        for &dtype in &MOVE {
            for shape in shapes {
                let x = rand_host(&mut rng, dtype, shape);
                let (pads, out_shape) = mirror_pads(&mut rng, shape, symmetric);
                let got = run("MirrorPad", &attrs, &[(&x, true), (&pads_t(&pads), false)]).unwrap();
                let want = map_ref(&x, &out_shape, &[], |c| {
                    Some(mirror_source(c, &pads, shape, symmetric))
                });
                assert_same(
                    &got,
                    &want,
                    &format!("MirrorPad {mode} {dtype} {shape:?} {pads:?}"),
                );
            }
        }
        // Paddings too large for the mode.
        let x = rand_host(&mut rng, DType::F32, &[3]);
        let too = if symmetric { 4 } else { 3 };
        assert!(
            run(
                "MirrorPad",
                &attrs,
                &[(&x, true), (&pads_t(&[(too, 0)]), false)]
            )
            .is_err()
        );
    }
}

#[test]
fn mirror_pad_grad_sums_reflections() {
    let mut rng = rng(8);
    let shapes: &[&[usize]] = &[&[1], &[5], &[3, 7], &[2, 3, 4], &[3, 2, 1, 2]];
    for symmetric in [false, true] {
        let mode = if symmetric { "SYMMETRIC" } else { "REFLECT" };
        let attrs = Attrs::new().with("mode", AttrValue::Str(mode.into()));
        for shape in shapes {
            let (pads, padded) = mirror_pads(&mut rng, shape, symmetric);
            let g = rand_f32(&mut rng, numel(&padded), -1.0, 1.0);
            let mut want = vec![0f64; numel(shape)];
            for (k, &v) in g.iter().enumerate() {
                want[mirror_source(&unravel(k, &padded), &pads, shape, symmetric)] += v as f64;
            }
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            let gt = HostTensor::new(&g, &padded).unwrap();
            let got = run(
                "MirrorPadGrad",
                &attrs,
                &[(&gt, true), (&pads_t(&pads), false)],
            )
            .unwrap();
            assert_eq!(got.shape, shape.to_vec());
            // At most 3^rank terms of magnitude <= 1, summed in f32.
            let terms = 3f32.powi(shape.len() as i32);
            assert_close(
                &got.to_vec::<f32>().unwrap(),
                &want,
                0.0,
                terms * 1.2e-7,
                mode,
            );
            // float16: rounded once from the f32 sum.
            let g16: Vec<f16> = g.iter().map(|&v| f16::from_f32(v)).collect();
            let mut w16 = vec![0f64; numel(shape)];
            for (k, &v) in g16.iter().enumerate() {
                w16[mirror_source(&unravel(k, &padded), &pads, shape, symmetric)] += v.to_f64();
            }
            let gt = HostTensor::new(&g16, &padded).unwrap();
            let got = run(
                "MirrorPadGrad",
                &attrs,
                &[(&gt, true), (&pads_t(&pads), false)],
            )
            .unwrap();
            let got: Vec<f32> = got
                .to_vec::<f16>()
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let want: Vec<f32> = w16.iter().map(|&v| f16::from_f64(v).to_f32()).collect();
            // One f16 rounding of a sum that is exact in f32 at these sizes.
            assert_close(&got, &want, 0.0, 0.0, "MirrorPadGrad f16");
        }
    }
}

// ---------------------------------------------------------------- GatherV2

#[test]
fn gather_axes_batch_dims_and_out_of_range() {
    let mut rng = rng(9);
    // (params shape, indices shape, axis, batch_dims)
    let cases: &[(&[usize], &[usize], i64, i64)] = &[
        (&[7], &[5], 0, 0),
        (&[5, 3], &[4], 0, 0),
        (&[5, 3], &[2, 3], 1, 0),
        (&[5, 3], &[2, 3], -1, 0),
        (&[2, 3, 4], &[], 1, 0),
        (&[3, 5, 2], &[3, 4], 1, 1),
        (&[3, 5, 2], &[3, 4], 2, 1),
        (&[2, 3, 5, 3], &[2, 3, 2], 2, 2),
        (&[2, 3, 5, 3], &[2, 3, 2], 3, -1),
        (&[4, 0], &[3], 1, 0),
        (&[4, 3], &[0], 0, 0),
    ];
    let mut dtypes = MOVE.to_vec();
    dtypes.push(DType::I32);
    for &(ps, is, axis, bd) in cases {
        for &dtype in &dtypes {
            for idx_dtype in [DType::I32, DType::I64] {
                let x = rand_host(&mut rng, dtype, ps);
                let ax = if axis < 0 {
                    axis + ps.len() as i64
                } else {
                    axis
                } as usize;
                let b = if bd < 0 { bd + is.len() as i64 } else { bd } as usize;
                let n = ps[ax] as i64;
                // Mostly valid indices, some negative or past the end.
                let idx: Vec<i64> = (0..numel(is))
                    .map(|_| {
                        if rng.random_range(0..5) == 0 {
                            [-1, n, n + 3, -(1 << 40)][rng.random_range(0..4)]
                        } else {
                            rng.random_range(0..n.max(1))
                        }
                    })
                    .collect();
                let it = if idx_dtype == DType::I32 {
                    let v: Vec<i32> = idx.iter().map(|&v| v as i32).collect();
                    HostTensor::new(&v, is).unwrap()
                } else {
                    HostTensor::new(&idx, is).unwrap()
                };
                let idx: Vec<i64> = it.to_i64_vec().unwrap();
                let mut out_shape = ps[..ax].to_vec();
                out_shape.extend_from_slice(&is[b..]);
                out_shape.extend_from_slice(&ps[ax + 1..]);
                let zero = vec![0u8; dtype.size()];
                let want = map_ref(&x, &out_shape, &zero, |c| {
                    // c = params[:ax] ++ indices[b:] ++ params[ax+1:]
                    let nb = is.len() - b;
                    let mut ic: Vec<usize> = c[..b].to_vec();
                    ic.extend_from_slice(&c[ax..ax + nb]);
                    let v = idx[ravel(&ic, is)];
                    if v < 0 || v >= n {
                        return None;
                    }
                    let mut pc = c[..ax].to_vec();
                    pc.push(v as usize);
                    pc.extend_from_slice(&c[ax + nb..]);
                    Some(ravel(&pc, ps))
                });
                let attrs = Attrs::new().with("batch_dims", AttrValue::Int(bd));
                let axis_t = HostTensor::scalar(axis as i32);
                let got = run(
                    "GatherV2",
                    &attrs,
                    &[(&x, true), (&it, true), (&axis_t, false)],
                )
                .unwrap();
                assert_same(
                    &got,
                    &want,
                    &format!("GatherV2 {dtype} {ps:?} {is:?} axis {axis} bd {bd}"),
                );
            }
        }
    }
    // Errors: axis out of range, batch_dims > axis, mismatched batch dims.
    let x = rand_host(&mut rng, DType::F32, &[3, 4]);
    let i = HostTensor::new(&[0i32, 1], &[2]).unwrap();
    let e = run(
        "GatherV2",
        &Attrs::new(),
        &[(&x, true), (&i, true), (&HostTensor::scalar(2i32), false)],
    );
    assert!(e.err().unwrap().to_string().contains("axis"));
    let attrs = Attrs::new().with("batch_dims", AttrValue::Int(1));
    let e = run(
        "GatherV2",
        &attrs,
        &[(&x, true), (&i, true), (&HostTensor::scalar(1i32), false)],
    );
    assert!(e.err().unwrap().to_string().contains("should be equal"));
}

// ---------------------------------------------------------------- OneHot

#[test]
fn one_hot_axes_index_types_and_out_of_range() {
    let mut rng = rng(10);
    let shapes: &[&[usize]] = &[&[], &[7], &[3, 5], &[2, 3, 1]];
    let mut dtypes = MOVE.to_vec();
    dtypes.push(DType::I32);
    for shape in shapes {
        for axis in -1..=shape.len() as i64 {
            for depth in [0usize, 1, 5] {
                for &dtype in &dtypes {
                    for idx_dtype in [DType::U8, DType::I32, DType::I64] {
                        let raw: Vec<i64> = (0..numel(shape))
                            .map(|_| rng.random_range(-2..depth as i64 + 2))
                            .collect();
                        let it = match idx_dtype {
                            DType::U8 => {
                                let v: Vec<u8> = raw.iter().map(|&v| v as u8).collect();
                                HostTensor::new(&v, shape).unwrap()
                            }
                            DType::I32 => {
                                let v: Vec<i32> = raw.iter().map(|&v| v as i32).collect();
                                HostTensor::new(&v, shape).unwrap()
                            }
                            _ => HostTensor::new(&raw, shape).unwrap(),
                        };
                        let idx: Vec<i64> = if idx_dtype == DType::U8 {
                            it.bytes.iter().map(|&b| b as i64).collect()
                        } else {
                            it.to_i64_vec().unwrap()
                        };
                        let on = rand_host(&mut rng, dtype, &[]);
                        let mut off = rand_host(&mut rng, dtype, &[]);
                        if dtype == DType::Bool {
                            off.bytes[0] = 1 - on.bytes[0];
                        }
                        let ax = if axis == -1 {
                            shape.len()
                        } else {
                            axis as usize
                        };
                        let mut out_shape = shape[..ax].to_vec();
                        out_shape.push(depth);
                        out_shape.extend_from_slice(&shape[ax..]);
                        let pair = HostTensor {
                            dtype,
                            shape: vec![2],
                            bytes: [off.bytes.clone(), on.bytes.clone()].concat(),
                        };
                        let want = map_ref(&pair, &out_shape, &[], |c| {
                            let mut ic = c[..ax].to_vec();
                            ic.extend_from_slice(&c[ax + 1..]);
                            Some((idx[ravel(&ic, shape)] == c[ax] as i64) as usize)
                        });
                        let attrs = Attrs::new().with("axis", AttrValue::Int(axis));
                        let depth_t = HostTensor::scalar(depth as i32);
                        let got = run(
                            "OneHot",
                            &attrs,
                            &[(&it, true), (&depth_t, false), (&on, true), (&off, true)],
                        )
                        .unwrap();
                        assert_same(
                            &got,
                            &want,
                            &format!(
                                "OneHot {dtype} {idx_dtype} {shape:?} axis {axis} depth {depth}"
                            ),
                        );
                    }
                }
            }
        }
    }
    let it = HostTensor::new(&[0i32], &[1]).unwrap();
    let on = HostTensor::scalar(1.0f32);
    let attrs = Attrs::new().with("axis", AttrValue::Int(3));
    let e = run(
        "OneHot",
        &attrs,
        &[
            (&it, true),
            (&HostTensor::scalar(3i32), false),
            (&on, true),
            (&on, true),
        ],
    );
    assert!(e.err().unwrap().to_string().contains("axis"));
    let e = run(
        "OneHot",
        &Attrs::new(),
        &[
            (&it, true),
            (&HostTensor::scalar(-1i32), false),
            (&on, true),
            (&on, true),
        ],
    );
    assert!(e.err().unwrap().to_string().contains("non-negative"));
}

// ---------------------------------------------------------------- Range

/// Range(start, limit, delta) with host scalars of `T`'s dtype.
fn run_range<T: Element>(start: T, limit: T, delta: T) -> Result<Vec<Tensor>> {
    let args = [
        HostTensor::scalar(start),
        HostTensor::scalar(limit),
        HostTensor::scalar(delta),
    ];
    dev().run(
        "Range",
        &Attrs::new(),
        &[
            Arg::from(&args[0]),
            Arg::from(&args[1]),
            Arg::from(&args[2]),
        ],
    )
}

#[test]
fn range_float_and_int64() {
    let d = dev();
    let cases_f: &[(f32, f32, f32)] = &[
        (0.0, 10.0, 1.0),
        (0.0, 1.0, 0.1),
        (3.5, -2.25, -0.75),
        (-1e4, 1e4, 7.3),
        (5.0, 5.0, 1.0),
        (0.0, 1000.0, 0.001),
    ];
    for &(s, l, dl) in cases_f {
        let out = run_range(s, l, dl).unwrap();
        let n = ((l - s) / dl).abs().ceil() as usize;
        assert_eq!(out[0].shape(), &[n]);
        let got = out[0].download::<f32>().unwrap();
        // start + i * delta, with the product and the sum each rounded (or fused).
        for (i, &g) in got.iter().enumerate() {
            let exact = s as f64 + i as f64 * dl as f64;
            let tol = (s.abs() as f64 + (i as f64 * dl as f64).abs()) * 1.2e-7;
            assert!(
                (g as f64 - exact).abs() <= tol,
                "Range({s}, {l}, {dl})[{i}] = {g}, want {exact}"
            );
        }
    }
    let cases_i: &[(i64, i64, i64)] = &[
        (0, 10, 1),
        (-7, 100, 3),
        (100, -7, -9),
        (1 << 40, (1 << 40) + 5 * (1 << 33), 1 << 33),
        (i64::MAX - 10, i64::MAX, 3),
        (i64::MIN + 5, i64::MIN, -1),
        (4, 4, 1),
    ];
    for &(s, l, dl) in cases_i {
        let out = run_range(s, l, dl).unwrap();
        let mut want = vec![];
        let mut v = s as i128;
        while (dl > 0 && v < l as i128) || (dl < 0 && v > l as i128) {
            want.push(v as i64);
            v += dl as i128;
        }
        assert_eq!(
            out[0].download::<i64>().unwrap(),
            want,
            "Range({s}, {l}, {dl})"
        );
    }
    for (s, l, dl) in [(0.0f32, 1.0, 0.0), (0.0, 1.0, -1.0), (1.0, 0.0, 1.0)] {
        assert!(run_range(s, l, dl).is_err());
    }
    // int32 is TensorFlow's host-memory kernel: not registered here.
    let attrs = Attrs::new().with("Tidx", AttrValue::Type(DType::I32));
    assert!(d.kernel("Range", &attrs).is_err());
}

// ---------------------------------------------------------------- Erf, Erfc

/// erf in f64: Taylor series below 3 (terms up to ~170 in size, so ~1e-14 absolute), and
/// erfc by its continued fraction above.
fn erf64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 3.0 {
        return x.signum() * (1.0 - erfc_cf(x.abs()));
    }
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// erfc(x) for x >= 3 by the Laplace continued fraction (converges fast there).
fn erfc_cf(x: f64) -> f64 {
    let mut f = 0.0;
    for k in (1..200).rev() {
        f = (k as f64 / 2.0) / (x + f);
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / (x + f)
}

fn erfc64(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x >= 3.0 {
        erfc_cf(x)
    } else if x <= -3.0 {
        2.0 - erfc_cf(-x)
    } else {
        1.0 - erf64(x)
    }
}

#[test]
fn erf_and_erfc_f32_f16() {
    let mut rng = rng(11);
    let mut xs: Vec<f32> = rand_f32(&mut rng, 4000, -6.0, 6.0);
    xs.extend(rand_f32(&mut rng, 500, -0.6, 0.6));
    xs.extend(rand_f32(&mut rng, 500, 6.0, 10.5));
    xs.extend([
        0.0,
        -0.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        1e-30,
        -1e-20,
        10.0,
        9.3,
        3.9,
        4.0,
        26.0,
        -26.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let xt = HostTensor::new(&xs, &[xs.len()]).unwrap();
    for (op, f) in [("Erf", erf64 as fn(f64) -> f64), ("Erfc", erfc64)] {
        let got = run(op, &Attrs::new(), &[(&xt, true)])
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (i, (&x, &g)) in xs.iter().zip(&got).enumerate() {
            let w = f(x as f64);
            if w.is_nan() {
                assert!(g.is_nan(), "{op}({x}) = {g}, want NaN");
                continue;
            }
            // A few ULP of the result; below the normal range, the subnormal spacing.
            let tol = (w.abs() * 4.0 * f32::EPSILON as f64).max(2.0 * 1.4e-45);
            assert!(
                (g as f64 - w).abs() <= tol,
                "{op}[{i}]({x:e}) = {g:e}, want {w:e} ({:.2} ulp)",
                (g as f64 - w).abs() / (w.abs() * f32::EPSILON as f64)
            );
        }
        let neg0 = got[xs.len() - 16];
        if op == "Erf" {
            assert_eq!(neg0.to_bits(), (-0.0f32).to_bits(), "Erf(-0)");
        } else {
            assert_eq!(neg0, 1.0, "Erfc(-0)");
        }
        // float16, odd length: within one f16 rounding of the exact value.
        let h: Vec<f16> = xs[..1001].iter().map(|&v| f16::from_f32(v)).collect();
        let ht = HostTensor::new(&h, &[h.len()]).unwrap();
        let got = run(op, &Attrs::new(), &[(&ht, true)])
            .unwrap()
            .to_vec::<f16>()
            .unwrap();
        for (&x, &g) in h.iter().zip(&got) {
            let w = f(x.to_f64());
            let lo = f16::from_f64(w).to_f64();
            // The f32 result may round to the f16 neighbour of the correctly rounded one.
            let spacing = (f16::from_f64(w * (1.0 + 1.0 / 1024.0)).to_f64() - lo)
                .abs()
                .max(6e-8);
            assert!(
                (g.to_f64() - w).abs() <= spacing,
                "{op} f16({x}) = {g}, want {w}"
            );
        }
    }
}

// ---------------------------------------------------------------- UnsortedSegmentSum

#[test]
fn unsorted_segment_sum_rows_repeats_and_dropped_ids() {
    let mut rng = rng(21);
    // (data shape, ids rank, segments)
    let cases: &[(&[usize], usize, usize)] = &[
        (&[7], 1, 4),
        (&[40, 3], 1, 6),
        (&[5, 4, 8], 2, 9), // a matrix of ids (an Embedding's [batch, sequence])
        (&[300, 16], 1, 5), // many repeats per segment
        (&[6, 2], 1, 0),    // no segments: an empty result
        (&[0, 3], 1, 4),    // no rows: zeros
    ];
    for &(ds, id_rank, segs) in cases {
        for idx_dtype in [DType::I32, DType::I64] {
            let data: Vec<f32> = (0..numel(ds))
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            let rows = numel(&ds[..id_rank]);
            let inner = numel(&ds[id_rank..]);
            // Mostly valid ids; some negative or >= segments: dropped (TensorFlow's GPU kernel).
            let ids: Vec<i64> = (0..rows)
                .map(|_| {
                    if rng.random_range(0..6) == 0 {
                        [-1, segs as i64, segs as i64 + 7][rng.random_range(0..3)]
                    } else {
                        rng.random_range(0..segs.max(1) as i64)
                    }
                })
                .collect();
            let it = if idx_dtype == DType::I32 {
                let v: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
                HostTensor::new(&v, &ds[..id_rank]).unwrap()
            } else {
                HostTensor::new(&ids, &ds[..id_rank]).unwrap()
            };
            let mut want = vec![0f64; segs * inner];
            let mut abs = vec![0f64; segs * inner];
            let mut count = vec![0usize; segs];
            for (r, &s) in ids.iter().enumerate() {
                if s >= 0 && (s as usize) < segs {
                    count[s as usize] += 1;
                    for i in 0..inner {
                        want[s as usize * inner + i] += data[r * inner + i] as f64;
                        abs[s as usize * inner + i] += (data[r * inner + i] as f64).abs();
                    }
                }
            }
            let x = HostTensor::new(&data, ds).unwrap();
            let n = HostTensor::scalar(segs as i32);
            let got = run(
                "UnsortedSegmentSum",
                &Attrs::new(),
                &[(&x, true), (&it, true), (&n, false)],
            )
            .unwrap();
            let mut shape = vec![segs];
            shape.extend_from_slice(&ds[id_rank..]);
            assert_eq!(got.shape, shape, "{ds:?}");
            let got = got.to_vec::<f32>().unwrap();
            // A float32 sum of k terms in any order: within (k - 1) * eps * sum |x| of the
            // exact sum (0 for one term: the row itself).
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let k = count[j / inner.max(1)];
                let tol = k.saturating_sub(1) as f64 * f32::EPSILON as f64 * abs[j];
                assert!(
                    (*g as f64 - w).abs() <= tol,
                    "UnsortedSegmentSum {ds:?} {idx_dtype} [{j}]: {g} vs {w} (tol {tol})"
                );
            }
        }
    }
    // Shapes TensorFlow rejects.
    let x = HostTensor::new(&[1.0f32; 6], &[3, 2]).unwrap();
    let bad_ids = HostTensor::new(&[0i32; 2], &[2]).unwrap();
    let n = HostTensor::scalar(2i32);
    let e = run(
        "UnsortedSegmentSum",
        &Attrs::new(),
        &[(&x, true), (&bad_ids, true), (&n, false)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not start with"), "{e}");
    let ids = HostTensor::new(&[0i32; 3], &[3]).unwrap();
    let neg = HostTensor::scalar(-1i32);
    assert!(
        run(
            "UnsortedSegmentSum",
            &Attrs::new(),
            &[(&x, true), (&ids, true), (&neg, false)]
        )
        .is_err()
    );
}

// ---------------------------------------------------------------- ScatterNd

#[test]
fn scatter_nd_sums_at_nd_indices_and_drops_outside() {
    let mut rng = rng(22);
    // (indices shape, output shape)
    let cases: &[(&[usize], &[usize])] = &[
        (&[50, 2], &[3, 3]),         // a confusion matrix
        (&[20, 1], &[6, 4]),         // rows
        (&[4, 5, 3], &[3, 2, 4, 2]), // batched indices of slices
        (&[0, 2], &[2, 2]),          // no updates: zeros
    ];
    for &(is, shape) in cases {
        let k = is[is.len() - 1];
        let rows = numel(&is[..is.len() - 1]);
        let inner = numel(&shape[k..]);
        // Mostly valid indices; some components negative or past their dimension: dropped
        // (TensorFlow's GPU kernel).
        let idx: Vec<i64> = (0..rows * k)
            .map(|j| {
                let d = shape[j % k] as i64;
                if rng.random_range(0..8) == 0 {
                    [-1, d][rng.random_range(0..2)]
                } else {
                    rng.random_range(0..d)
                }
            })
            .collect();
        let mut ushape = is[..is.len() - 1].to_vec();
        ushape.extend_from_slice(&shape[k..]);
        // int64 values around +-2^40 (carries between the words both ways); the float32 ones
        // small integers, so every order of the sums is exact.
        let u64s: Vec<i64> = (0..rows * inner)
            .map(|_| rng.random_range(-(1i64 << 40)..(1i64 << 40)))
            .collect();
        // The reference: each row's slice added at its index, rows outside dropped.
        fn scatter<T: Copy + Default + std::ops::AddAssign>(
            idx: &[i64],
            k: usize,
            shape: &[usize],
            upd: &[T],
            inner: usize,
        ) -> Vec<T> {
            let mut want = vec![T::default(); numel(shape)];
            for (r, c) in idx
                .chunks(k.max(1))
                .enumerate()
                .take(upd.len() / inner.max(1))
            {
                if c.iter().zip(shape).any(|(&v, &d)| v < 0 || v >= d as i64) {
                    continue;
                }
                let base: usize = c
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| v as usize * numel(&shape[j + 1..]))
                    .sum();
                for i in 0..inner {
                    want[base + i] += upd[r * inner + i];
                }
            }
            want
        }
        let want = scatter(&idx, k, shape, &u64s, inner);
        let shape_t = HostTensor::new(
            &shape.iter().map(|&d| d as i32).collect::<Vec<_>>(),
            &[shape.len()],
        )
        .unwrap();
        for idx_dtype in [DType::I32, DType::I64] {
            let it = if idx_dtype == DType::I32 {
                let v: Vec<i32> = idx.iter().map(|&v| v as i32).collect();
                HostTensor::new(&v, is).unwrap()
            } else {
                HostTensor::new(&idx, is).unwrap()
            };
            let up = HostTensor::new(&u64s, &ushape).unwrap();
            let got = run(
                "ScatterNd",
                &Attrs::new(),
                &[(&it, true), (&up, true), (&shape_t, false)],
            )
            .unwrap();
            assert_eq!(got.shape, shape, "{is:?}");
            assert_eq!(
                got.to_vec::<i64>().unwrap(),
                want,
                "ScatterNd int64 {is:?} {idx_dtype}"
            );
            let small: Vec<f32> = u64s.iter().map(|&v| (v % 7) as f32).collect();
            let up = HostTensor::new(&small, &ushape).unwrap();
            let got = run(
                "ScatterNd",
                &Attrs::new(),
                &[(&it, true), (&up, true), (&shape_t, false)],
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
            let wantf = scatter(&idx, k, shape, &small, inner);
            assert_eq!(got, wantf, "ScatterNd float32 {is:?} {idx_dtype}");
        }
    }
    // TensorFlow's shape checks.
    let it = HostTensor::new(&[0i32, 1], &[1, 2]).unwrap();
    let up = HostTensor::new(&[1f32, 2.0], &[2]).unwrap();
    let shape_t = HostTensor::new(&[2i32, 2], &[2]).unwrap();
    let e = run(
        "ScatterNd",
        &Attrs::new(),
        &[(&it, true), (&up, true), (&shape_t, false)],
    )
    .expect_err("mismatched updates refused");
    assert!(e.to_string().contains("updates has shape"), "{e}");
}
