//! Layout family: Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Tile, BroadcastTo,
//! ReverseV2 against CPU references, for every registered dtype. Elements are handled as bit
//! patterns (random bits, NaN payloads included): a layout op must move them exactly.

mod common;
use common::*;
use rand::Rng;
use rand::rngs::StdRng;
use tfwgpu_runtime::{
    Arg, AttrValue, Attrs, DType, DeviceRef, Error, HostTensor, Operand, Tensor, TensorDesc,
};

/// dtypes registered per op (mirrors the registration table).
const ALL: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];
const NO_I32: [DType; 5] = [DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool];
const UNPACK: [DType; 4] = [DType::F32, DType::F16, DType::U8, DType::Bool];

// ---- element bits, host tensors ----

fn rand_elems(rng: &mut StdRng, dtype: DType, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| match dtype {
            DType::Bool => rng.random_range(0..2u64),
            _ => {
                let bits = dtype.size() * 8;
                let v: u64 = rng.random();
                if bits == 64 {
                    v
                } else {
                    v & ((1u64 << bits) - 1)
                }
            }
        })
        .collect()
}

fn host(dtype: DType, shape: &[usize], elems: &[u64]) -> HostTensor {
    assert_eq!(elems.len(), shape.iter().product::<usize>());
    let size = dtype.size();
    let bytes = elems
        .iter()
        .flat_map(|e| e.to_le_bytes()[..size].to_vec())
        .collect();
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

fn upload(dtype: DType, shape: &[usize], elems: &[u64]) -> Tensor {
    dev().upload_host(&host(dtype, shape, elems)).unwrap()
}

fn elems_of(t: &Tensor) -> Vec<u64> {
    let h = t.download_host().unwrap();
    let size = h.dtype.size();
    h.bytes
        .chunks(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

fn attrs(dtype: DType) -> Attrs {
    Attrs::new().with("T", AttrValue::Type(dtype))
}

fn ints(v: &[i64]) -> HostTensor {
    HostTensor::new(v, &[v.len()]).unwrap()
}

fn ints32(v: &[i32]) -> HostTensor {
    HostTensor::vec_i32(v)
}

/// Checks one output against a reference (shape and every element's bits).
/// Runs `op` on two arguments, each a device or a host tensor.
fn run2<'a>(
    op: &str,
    attrs: &Attrs,
    a: impl Into<Arg<'a>>,
    b: impl Into<Arg<'a>>,
) -> tfwgpu_runtime::Result<Vec<Tensor>> {
    dev().run(op, attrs, &[a.into(), b.into()])
}

fn check(got: &Tensor, want_shape: &[usize], want: &[u64], what: &str) {
    assert_eq!(got.shape(), want_shape, "{what}: shape");
    let g = elems_of(got);
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert_eq!(a, b, "{what}: element {i} of {}", want.len());
    }
}

fn err_of(r: tfwgpu_runtime::Result<Vec<Tensor>>) -> Error {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

// ---- CPU references ----

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// For every coordinate of `out_shape` (row-major), the flat source index `f(coords)`.
fn gather(out_shape: &[usize], f: impl Fn(&[usize]) -> usize) -> Vec<usize> {
    let n: usize = out_shape.iter().product();
    let mut c = vec![0; out_shape.len()];
    (0..n)
        .map(|i| {
            let mut rem = i;
            for d in (0..out_shape.len()).rev() {
                c[d] = rem % out_shape[d];
                rem /= out_shape[d];
            }
            f(&c)
        })
        .collect()
}

fn pick(x: &[u64], idx: &[usize]) -> Vec<u64> {
    idx.iter().map(|&i| x[i]).collect()
}

fn transpose_ref(x: &[u64], shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<u64>) {
    let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let st = strides(shape);
    let idx = gather(&out, |c| {
        c.iter().zip(perm).map(|(&ci, &p)| ci * st[p]).sum()
    });
    (out, pick(x, &idx))
}

/// Concatenation of tensors (shapes equal but along `axis`).
fn concat_ref(xs: &[(Vec<usize>, Vec<u64>)], axis: usize) -> (Vec<usize>, Vec<u64>) {
    let mut out = xs[0].0.clone();
    out[axis] = xs.iter().map(|x| x.0[axis]).sum();
    let outer: usize = out[..axis].iter().product();
    let mut data = vec![];
    for o in 0..outer {
        for (shape, x) in xs {
            let chunk: usize = shape[axis..].iter().product();
            data.extend_from_slice(&x[o * chunk..(o + 1) * chunk]);
        }
    }
    (out, data)
}

/// Pieces of `x` along `axis`.
fn split_ref(
    x: &[u64],
    shape: &[usize],
    axis: usize,
    sizes: &[usize],
) -> Vec<(Vec<usize>, Vec<u64>)> {
    let st = strides(shape);
    let mut off = 0;
    sizes
        .iter()
        .map(|&s| {
            let mut out = shape.to_vec();
            out[axis] = s;
            let idx = gather(&out, |c| {
                c.iter()
                    .enumerate()
                    .map(|(d, &ci)| (if d == axis { ci + off } else { ci }) * st[d])
                    .sum()
            });
            off += s;
            (out, pick(x, &idx))
        })
        .collect()
}

fn tile_ref(x: &[u64], shape: &[usize], m: &[usize]) -> (Vec<usize>, Vec<u64>) {
    let out: Vec<usize> = shape.iter().zip(m).map(|(a, b)| a * b).collect();
    let st = strides(shape);
    let idx = gather(&out, |c| {
        c.iter()
            .enumerate()
            .map(|(d, &ci)| (ci % shape[d]) * st[d])
            .sum()
    });
    (out, pick(x, &idx))
}

fn broadcast_ref(x: &[u64], shape: &[usize], out: &[usize]) -> Vec<u64> {
    let st = strides(shape);
    let lead = out.len() - shape.len();
    let idx = gather(out, |c| {
        (0..shape.len())
            .map(|d| {
                if shape[d] == 1 {
                    0
                } else {
                    c[d + lead] * st[d]
                }
            })
            .sum()
    });
    pick(x, &idx)
}

fn reverse_ref(x: &[u64], shape: &[usize], rev: &[bool]) -> Vec<u64> {
    let st = strides(shape);
    let idx = gather(shape, |c| {
        (0..shape.len())
            .map(|d| {
                let ci = if rev[d] { shape[d] - 1 - c[d] } else { c[d] };
                ci * st[d]
            })
            .sum()
    });
    pick(x, &idx)
}

fn canon(axis: i64, rank: usize) -> usize {
    if axis < 0 {
        (axis + rank as i64) as usize
    } else {
        axis as usize
    }
}

fn rand_perm(rng: &mut StdRng, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..=i);
        p.swap(i, j);
    }
    p
}

// ---- Transpose ----

#[test]
fn transpose_every_dtype_rank_0_to_5() {
    let mut rng = rng(1);
    let shapes: &[&[usize]] = &[
        &[],
        &[7],
        &[0, 3],
        &[3, 5],
        &[1, 7],
        &[2, 3, 5],
        &[3, 0, 2],
        &[1, 7, 1, 3],
        &[2, 3, 1, 3, 5],
    ];
    for dtype in ALL {
        for shape in shapes {
            let n = shape.iter().product();
            let x = rand_elems(&mut rng, dtype, n);
            let xt = upload(dtype, shape, &x);
            let mut perms = vec![rand_perm(&mut rng, shape.len())];
            perms.push((0..shape.len()).rev().collect());
            for perm in perms {
                let (want_shape, want) = transpose_ref(&x, shape, &perm);
                // Alternate the perm's dtype (TensorFlow's Tperm: int32 or int64).
                let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
                let pt = if perm.len() % 2 == 0 {
                    ints(&p)
                } else {
                    ints32(&perm.iter().map(|&p| p as i32).collect::<Vec<_>>())
                };
                let out = run2("Transpose", &attrs(dtype), &xt, &pt).unwrap();
                check(
                    &out[0],
                    &want_shape,
                    &want,
                    &format!("Transpose {dtype} {shape:?} perm {perm:?}"),
                );
            }
        }
    }
}

#[test]
fn transpose_large_and_odd_sizes() {
    // Several workgroups, odd inner sizes for the packed types, a rank-6 permutation.
    let mut rng = rng(2);
    let cases: &[(&[usize], &[usize])] = &[
        (&[129, 67], &[1, 0]),
        (&[3, 129, 5], &[2, 0, 1]),
        (&[2, 3, 2, 3, 2, 3], &[5, 3, 1, 4, 2, 0]),
        (&[5, 1, 3, 7], &[0, 3, 1, 2]),
    ];
    for dtype in [DType::F16, DType::U8, DType::Bool, DType::I64, DType::F32] {
        for &(shape, perm) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let pt = ints32(&perm.iter().map(|&p| p as i32).collect::<Vec<_>>());
            let out = run2("Transpose", &attrs(dtype), &xt, &pt).unwrap();
            let (ws, w) = transpose_ref(&x, shape, perm);
            check(&out[0], &ws, &w, &format!("Transpose {dtype} {shape:?}"));
        }
    }
}

#[test]
fn transpose_rejects_bad_perms() {
    let x = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    for (perm, msg) in [
        (vec![0, 0], "missing"),
        (vec![0, 2], "out of range"),
        (vec![-1, 0], "out of range"),
        (vec![0], "vector of size 2"),
        (vec![0, 1, 2], "vector of size 2"),
    ] {
        let pt = ints32(&perm);
        let e = err_of(run2("Transpose", &Attrs::new(), &x, &pt));
        let s = e.to_string();
        assert!(s.contains("Transpose") && s.contains(msg), "{perm:?}: {s}");
    }
    // More than 8 dimensions that cannot merge (one dispatch per outer coordinate), for a
    // word type and a packed type.
    let mut rng = rng(12);
    // Odd sizes: the per-dispatch pieces of the packed types start mid-word.
    let shape = [3usize, 3, 3, 1, 3, 3, 3, 3, 3, 3];
    let perm = [9usize, 0, 8, 1, 7, 2, 6, 3, 5, 4];
    for dtype in [DType::F32, DType::U8, DType::F16] {
        let x = rand_elems(&mut rng, dtype, shape.iter().product());
        let xt = upload(dtype, &shape, &x);
        let pt = ints32(&perm.iter().map(|&p| p as i32).collect::<Vec<_>>());
        let out = run2("Transpose", &attrs(dtype), &xt, &pt).unwrap();
        let (ws, w) = transpose_ref(&x, &shape, &perm);
        check(&out[0], &ws, &w, &format!("Transpose rank 10 {dtype}"));
    }
}

// ---- ConcatV2 / Pack ----

#[test]
fn concat_every_dtype() {
    let mut rng = rng(3);
    // (input shapes, axis)
    let cases: &[(&[&[usize]], i64)] = &[
        (&[&[3], &[4]], 0),
        (&[&[3, 5], &[3, 2], &[3, 1]], 1),
        (&[&[3, 5], &[3, 2]], -1),
        (&[&[2, 3], &[1, 3], &[0, 3], &[4, 3]], 0),
        (&[&[2, 3, 5], &[2, 1, 5], &[2, 2, 5]], -2),
        (&[&[5, 1, 3], &[5, 2, 3]], 1),
        (&[&[0, 3], &[0, 2]], 1),
        (&[&[7, 1], &[7, 1], &[7, 1]], 1),
        (&[&[2, 1, 1, 3, 1], &[2, 1, 1, 3, 2]], 4),
        (&[&[129, 3], &[129, 2]], 1),
    ];
    for dtype in NO_I32 {
        for &(shapes, axis) in cases {
            let xs: Vec<(Vec<usize>, Vec<u64>)> = shapes
                .iter()
                .map(|s| (s.to_vec(), rand_elems(&mut rng, dtype, s.iter().product())))
                .collect();
            let ts: Vec<Tensor> = xs.iter().map(|(s, x)| upload(dtype, s, x)).collect();
            let at = HostTensor::scalar(axis as i32);
            let mut args: Vec<Arg> = ts.iter().map(Arg::from).collect();
            args.push(Arg::from(&at));
            let a = attrs(dtype).with("N", AttrValue::Int(ts.len() as i64));
            let out = dev().run("ConcatV2", &a, &args).unwrap();
            let (ws, w) = concat_ref(&xs, canon(axis, shapes[0].len()));
            check(
                &out[0],
                &ws,
                &w,
                &format!("ConcatV2 {dtype} {shapes:?} axis {axis}"),
            );
        }
    }
}

#[test]
fn concat_errors() {
    let d = dev();
    let a = d.upload(&[0f32; 6], &[2, 3]).unwrap();
    let b = d.upload(&[0f32; 8], &[2, 4]).unwrap();
    let c = d.upload(&[0f32; 6], &[6]).unwrap();
    let s = d.upload(&[0f32], &[]).unwrap();
    let ax = |v: i64| HostTensor::scalar(v);
    let run = |x: &Tensor, y: &Tensor, axis: &HostTensor| {
        d.run(
            "ConcatV2",
            &Attrs::new(),
            &[Arg::from(x), Arg::from(y), Arg::from(axis)],
        )
    };
    let e = err_of(run(&a, &b, &ax(0))).to_string();
    assert!(
        e.contains("dimension 1") && e.contains("[2,3]") && e.contains("[2,4]"),
        "{e}"
    );
    assert!(run(&a, &b, &ax(1)).is_ok());
    let e = err_of(run(&a, &c, &ax(0))).to_string();
    assert!(e.contains("ranks"), "{e}");
    let e = err_of(run(&a, &b, &ax(2))).to_string();
    assert!(e.contains("not in [-2, 2)"), "{e}");
    let e = err_of(run(&s, &s, &ax(0))).to_string();
    assert!(e.contains("scalars"), "{e}");
    let e = err_of(run(&a, &b, &ints(&[1]))).to_string();
    assert!(e.contains("scalar"), "{e}");
    let i = d.upload(&[0i32; 6], &[2, 3]).unwrap();
    let e = err_of(run(&a, &i, &ax(0))).to_string();
    assert!(e.contains("dtype"), "{e}");
    // int32 is left to TensorFlow's host-memory kernel.
    let e = d
        .kernel("ConcatV2", &attrs(DType::I32))
        .err()
        .expect("int32 ConcatV2 is not registered");
    assert!(matches!(e, Error::Unimplemented(_)), "{e}");
}

#[test]
fn pack_every_dtype() {
    let mut rng = rng(4);
    let cases: &[(&[usize], usize, i64)] = &[
        (&[], 3, 0),
        (&[5], 1, 0),
        (&[5], 3, 1),
        (&[5], 3, -1),
        (&[3, 7], 2, 1),
        (&[3, 7], 4, -3),
        (&[2, 0, 3], 2, 2),
        (&[2, 3, 1, 5], 3, 3),
        (&[129], 3, 1),
    ];
    for dtype in NO_I32 {
        for &(shape, n, axis) in cases {
            let xs: Vec<Vec<u64>> = (0..n)
                .map(|_| rand_elems(&mut rng, dtype, shape.iter().product()))
                .collect();
            let ts: Vec<Tensor> = xs.iter().map(|x| upload(dtype, shape, x)).collect();
            let args: Vec<Arg> = ts.iter().map(Arg::from).collect();
            let a = attrs(dtype)
                .with("N", AttrValue::Int(n as i64))
                .with("axis", AttrValue::Int(axis));
            let out = dev().run("Pack", &a, &args).unwrap();
            let ax = canon(axis, shape.len() + 1);
            let mut expanded = shape.to_vec();
            expanded.insert(ax, 1);
            let parts: Vec<_> = xs.iter().map(|x| (expanded.clone(), x.clone())).collect();
            let (ws, w) = concat_ref(&parts, ax);
            check(
                &out[0],
                &ws,
                &w,
                &format!("Pack {dtype} {shape:?} x{n} axis {axis}"),
            );
        }
    }
    // Errors: shape mismatch, axis out of range.
    let a = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    let b = dev().upload(&[0f32; 6], &[3, 2]).unwrap();
    let e = err_of(run2("Pack", &Attrs::new(), &a, &b)).to_string();
    assert!(e.contains("values[1].shape = [3,2]"), "{e}");
    let bad = Attrs::new().with("axis", AttrValue::Int(3));
    let e = err_of(run2("Pack", &bad, &a, &a)).to_string();
    assert!(e.contains("not in [-3, 3)"), "{e}");
}

// ---- Unpack / Split / SplitV ----

#[test]
fn unpack_every_dtype() {
    let mut rng = rng(5);
    let cases: &[(&[usize], i64)] = &[
        (&[3], 0),
        (&[4, 5], 0),
        (&[4, 5], 1),
        (&[4, 5], -1),
        (&[3, 1, 7], 2),
        (&[2, 3, 5, 3], -2),
        (&[0, 3], 1),
        (&[3, 0], 0),
    ];
    for dtype in UNPACK {
        for &(shape, axis) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let ax = canon(axis, shape.len());
            let a = attrs(dtype)
                .with("num", AttrValue::Int(shape[ax] as i64))
                .with("axis", AttrValue::Int(axis));
            let out = dev().run("Unpack", &a, &[Arg::from(&xt)]).unwrap();
            let want = split_ref(&x, shape, ax, &vec![1; shape[ax]]);
            assert_eq!(out.len(), want.len());
            for (i, (o, (ws, w))) in out.iter().zip(&want).enumerate() {
                let mut squeezed = ws.clone();
                squeezed.remove(ax);
                check(
                    o,
                    &squeezed,
                    w,
                    &format!("Unpack {dtype} {shape:?} axis {axis} [{i}]"),
                );
            }
        }
    }
    let x = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    let a = Attrs::new().with("num", AttrValue::Int(3));
    let e = err_of(dev().run("Unpack", &a, &[Arg::from(&x)])).to_string();
    assert!(e.contains("axis 0 must equal 3"), "{e}");
    let a = Attrs::new().with("axis", AttrValue::Int(-3));
    let e = err_of(dev().run("Unpack", &a, &[Arg::from(&x)])).to_string();
    assert!(e.contains("not in [-2, 2)"), "{e}");
    assert!(dev().kernel("Unpack", &attrs(DType::I64)).is_err());
}

#[test]
fn split_every_dtype() {
    let mut rng = rng(6);
    let cases: &[(&[usize], i64, usize)] = &[
        (&[6], 0, 3),
        (&[6], 0, 1),
        (&[4, 9], 1, 3),
        (&[4, 9], -1, 9),
        (&[4, 9], 0, 2),
        (&[2, 6, 5], -2, 2),
        (&[3, 0], 1, 2),
        (&[0, 4], 1, 4),
        (&[3, 5, 1, 6], 3, 3),
    ];
    for dtype in NO_I32 {
        for &(shape, axis, num) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let dim = HostTensor::scalar(axis as i32);
            let a = attrs(dtype).with("num_split", AttrValue::Int(num as i64));
            let out = run2("Split", &a, &dim, &xt).unwrap();
            let ax = canon(axis, shape.len());
            let want = split_ref(&x, shape, ax, &vec![shape[ax] / num; num]);
            assert_eq!(out.len(), num);
            for (i, (o, (ws, w))) in out.iter().zip(&want).enumerate() {
                check(
                    o,
                    ws,
                    w,
                    &format!("Split {dtype} {shape:?} axis {axis} [{i}]"),
                );
            }
        }
    }
    let x = dev().upload(&[0f32; 10], &[2, 5]).unwrap();
    let a = Attrs::new().with("num_split", AttrValue::Int(2));
    let dim = HostTensor::scalar(1i32);
    let e = err_of(run2("Split", &a, &dim, &x)).to_string();
    assert!(e.contains("evenly divide") && e.contains("size = 5"), "{e}");
    let dim = HostTensor::scalar(2i32);
    let e = err_of(run2("Split", &a, &dim, &x)).to_string();
    assert!(e.contains("split_dim < input rank (2), but got 2"), "{e}");
    let zero = Attrs::new().with("num_split", AttrValue::Int(0));
    assert!(dev().kernel("Split", &zero).is_err());
}

#[test]
fn split_v_every_dtype() {
    let mut rng = rng(7);
    let cases: &[(&[usize], i64, &[i64])] = &[
        (&[7], 0, &[2, 5]),
        (&[7], 0, &[7]),
        (&[7], -1, &[3, -1, 0, 1]),
        (&[4, 9], 1, &[1, 2, 3, 3]),
        (&[4, 9], 0, &[-1, 1]),
        (&[2, 7, 3], 1, &[0, 7, 0]),
        (&[3, 0, 2], 1, &[0, -1]),
        (&[5, 2, 1, 3], -1, &[2, 1]),
    ];
    for dtype in NO_I32 {
        for &(shape, axis, sizes) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let dim = HostTensor::scalar(axis as i32);
            let st = ints(sizes);
            let a = attrs(dtype).with("num_split", AttrValue::Int(sizes.len() as i64));
            let out = dev()
                .run(
                    "SplitV",
                    &a,
                    &[Arg::from(&xt), Arg::from(&st), Arg::from(&dim)],
                )
                .unwrap();
            let ax = canon(axis, shape.len());
            let known: i64 = sizes.iter().filter(|&&s| s >= 0).sum();
            let resolved: Vec<usize> = sizes
                .iter()
                .map(|&s| {
                    if s < 0 {
                        shape[ax] - known as usize
                    } else {
                        s as usize
                    }
                })
                .collect();
            let want = split_ref(&x, shape, ax, &resolved);
            assert_eq!(out.len(), sizes.len());
            for (i, (o, (ws, w))) in out.iter().zip(&want).enumerate() {
                check(
                    o,
                    ws,
                    w,
                    &format!("SplitV {dtype} {shape:?} {sizes:?} [{i}]"),
                );
            }
        }
    }
    let x = dev().upload(&[0f32; 7], &[7]).unwrap();
    let dim = HostTensor::scalar(0i32);
    for (sizes, msg) in [
        (vec![2i64, 4], "Got: 6"),
        (vec![5, 3], "Got: 8"),
        (vec![-1, -1], "one -1"),
        (vec![9, -1], "Got: 9"),
        (vec![-2, 9], "index 0"),
    ] {
        let st = ints(&sizes);
        let a = Attrs::new().with("num_split", AttrValue::Int(2));
        let e = err_of(dev().run(
            "SplitV",
            &a,
            &[Arg::from(&x), Arg::from(&st), Arg::from(&dim)],
        ))
        .to_string();
        assert!(e.contains("SplitV") && e.contains(msg), "{sizes:?}: {e}");
    }
    let st = ints(&[3, 4]);
    let a = Attrs::new().with("num_split", AttrValue::Int(3));
    let e = err_of(dev().run(
        "SplitV",
        &a,
        &[Arg::from(&x), Arg::from(&st), Arg::from(&dim)],
    ))
    .to_string();
    assert!(e.contains("num_split = 3"), "{e}");
}

// ---- Tile / BroadcastTo / ReverseV2 ----

#[test]
fn tile_every_dtype() {
    let mut rng = rng(8);
    let cases: &[(&[usize], &[i64])] = &[
        (&[], &[]),
        (&[3], &[1]),
        (&[3], &[4]),
        (&[3], &[0]),
        (&[2, 3], &[2, 1]),
        (&[2, 3], &[1, 3]),
        (&[2, 3], &[3, 2]),
        (&[1, 5], &[7, 1]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[2, 1, 3, 1], &[2, 3, 1, 2]),
        (&[2, 2, 1, 3, 1], &[1, 2, 3, 1, 2]),
        (&[0, 3], &[2, 2]),
        (&[5, 3], &[27, 1]),
    ];
    for dtype in ALL {
        for &(shape, m) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let mt = ints(m);
            let out = run2("Tile", &attrs(dtype), &xt, &mt).unwrap();
            let mu: Vec<usize> = m.iter().map(|&v| v as usize).collect();
            let (ws, w) = tile_ref(&x, shape, &mu);
            check(&out[0], &ws, &w, &format!("Tile {dtype} {shape:?} {m:?}"));
        }
    }
    let x = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    let mt = ints(&[2]);
    let e = err_of(run2("Tile", &Attrs::new(), &x, &mt)).to_string();
    assert!(e.contains("length 2") && e.contains("got length 1"), "{e}");
    let mt = ints(&[1, -1]);
    let e = err_of(run2("Tile", &Attrs::new(), &x, &mt)).to_string();
    assert!(e.contains("multiples[1] >= 0"), "{e}");
}

#[test]
fn broadcast_to_every_dtype() {
    let mut rng = rng(9);
    let cases: &[(&[usize], &[i64])] = &[
        (&[], &[]),
        (&[], &[5]),
        (&[], &[2, 3]),
        (&[1], &[7]),
        (&[3], &[4, 3]),
        (&[3], &[3]),
        (&[2, 1], &[2, 5]),
        (&[1, 3], &[0, 3]),
        (&[2, 1, 3], &[4, 2, 5, 3]),
        (&[5, 1, 1], &[2, 5, 3, 7]),
        (&[1, 1], &[3, 129]),
        (&[0], &[3, 0]),
    ];
    for dtype in NO_I32 {
        for &(shape, target) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let st = ints32(&target.iter().map(|&v| v as i32).collect::<Vec<_>>());
            let out = run2("BroadcastTo", &attrs(dtype), &xt, &st).unwrap();
            let ts: Vec<usize> = target.iter().map(|&v| v as usize).collect();
            let w = broadcast_ref(&x, shape, &ts);
            check(
                &out[0],
                &ts,
                &w,
                &format!("BroadcastTo {dtype} {shape:?} -> {target:?}"),
            );
        }
    }
    let x = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    for target in [&[4i64][..], &[2, 4], &[3, 3], &[3, 0, 3], &[2, -3]] {
        let st = ints(target);
        let e = err_of(run2("BroadcastTo", &Attrs::new(), &x, &st)).to_string();
        assert!(e.contains("BroadcastTo"), "{target:?}: {e}");
    }
    let z = dev().upload::<f32>(&[], &[0]).unwrap();
    let st = ints(&[1]);
    assert!(run2("BroadcastTo", &Attrs::new(), &z, &st).is_err());
}

#[test]
fn reverse_every_dtype() {
    let mut rng = rng(10);
    let cases: &[(&[usize], &[i64])] = &[
        (&[], &[]),
        (&[7], &[0]),
        (&[7], &[]),
        (&[7], &[-1]),
        (&[3, 5], &[0]),
        (&[3, 5], &[1]),
        (&[3, 5], &[0, 1]),
        (&[3, 5], &[-1, -2]),
        (&[2, 3, 5], &[1]),
        (&[2, 1, 3, 5], &[0, 2, 3]),
        (&[2, 3, 2, 3, 5], &[0, 2, 4]),
        (&[0, 3], &[0]),
        (&[129, 3], &[0, 1]),
    ];
    for dtype in NO_I32 {
        for &(shape, axes) in cases {
            let x = rand_elems(&mut rng, dtype, shape.iter().product());
            let xt = upload(dtype, shape, &x);
            let at = ints(axes);
            let out = run2("ReverseV2", &attrs(dtype), &xt, &at).unwrap();
            let mut rev = vec![false; shape.len()];
            for &a in axes {
                rev[canon(a, shape.len())] = true;
            }
            let w = reverse_ref(&x, shape, &rev);
            check(
                &out[0],
                shape,
                &w,
                &format!("ReverseV2 {dtype} {shape:?} {axes:?}"),
            );
        }
    }
    let x = dev().upload(&[0f32; 6], &[2, 3]).unwrap();
    for (axes, msg) in [
        (&[2i64][..], "out of valid range"),
        (&[1, -1], "more than once"),
    ] {
        let at = ints(axes);
        let e = err_of(run2("ReverseV2", &Attrs::new(), &x, &at)).to_string();
        assert!(e.contains(msg), "{axes:?}: {e}");
    }
}

#[test]
fn packed_concat_keeps_bytes_past_the_end_and_reads_offset_inputs() {
    // A packed-type concat whose pieces end mid-word: the output comes out exactly, and the
    // bytes after the output's end, in its last partial word, stay as they were.
    let mut rng = rng(11);
    for dtype in [DType::U8, DType::F16, DType::Bool] {
        let xs: Vec<(Vec<usize>, Vec<u64>)> = [[5usize, 1], [5, 2], [5, 3]]
            .iter()
            .map(|s| (s.to_vec(), rand_elems(&mut rng, dtype, s.iter().product())))
            .collect();
        let ts: Vec<Tensor> = xs.iter().map(|(s, x)| upload(dtype, s, x)).collect();
        let at = HostTensor::scalar(1i64);
        let kernel = dev().kernel("ConcatV2", &attrs(dtype)).unwrap();
        // Allocate the output ourselves, pre-filled, to see what the kernel writes.
        let out = dev().empty(dtype, &[5, 6]).unwrap();
        let bytes = 30 * dtype.size();
        dev().write(out.addr(), &vec![0xA5u8; bytes + 8]).unwrap();
        let operands: Vec<Operand> = ts
            .iter()
            .map(|t| Operand::Device(t.device_ref()))
            .chain(std::iter::once(Operand::Host(&at)))
            .collect();
        dev()
            .record(
                kernel.as_ref(),
                &operands,
                std::slice::from_ref(out.device_ref()),
            )
            .unwrap();
        let (ws, w) = concat_ref(&xs, 1);
        check(&out, &ws, &w, &format!("ConcatV2 {dtype}"));
        let word = bytes / 4 * 4;
        let tail = dev().read(out.addr() + word as u64, 8).unwrap();
        assert!(
            tail[bytes - word..4].iter().all(|&b| b == 0xA5),
            "{dtype}: bytes after the output were changed: {tail:?}"
        );
    }
    // An input that starts 4 bytes into its allocation (a slice TensorFlow forwarded).
    for dtype in [DType::U8, DType::F16, DType::F32] {
        let shape = [3usize, 5];
        let x = rand_elems(&mut rng, dtype, 15);
        let mut padded = vec![0u64; 4 / dtype.size()];
        padded.extend_from_slice(&x);
        let big = upload(dtype, &[padded.len()], &padded);
        let slice = DeviceRef {
            desc: TensorDesc::new(dtype, &shape),
            addr: big.addr() + 4,
        };
        let perm = ints32(&[1, 0]);
        let kernel = dev().kernel("Transpose", &attrs(dtype)).unwrap();
        let out = dev().empty(dtype, &[5, 3]).unwrap();
        dev()
            .record(
                kernel.as_ref(),
                &[Operand::Device(&slice), Operand::Host(&perm)],
                std::slice::from_ref(out.device_ref()),
            )
            .unwrap();
        let (ws, w) = transpose_ref(&x, &shape, &[1, 0]);
        check(&out, &ws, &w, &format!("Transpose of a slice, {dtype}"));
    }
}
