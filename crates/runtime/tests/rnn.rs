//! CudnnRNNV3 and CudnnRNNBackpropV3 against a float64 reference: the forward written from
//! cuDNN's equations, the gradients by central differences of that forward (so the kernels'
//! backpropagation through time is checked against an independent derivative). LSTM, GRU,
//! tanh and relu cells, time- and batch-major, padded sequences, float16, empty sequences and
//! TensorFlow's errors.
pub(crate) mod common;
use common::*;

use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, Tensor, f16};

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Lstm,
    Gru,
    Tanh,
    Relu,
}

impl Cell {
    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "lstm",
            Cell::Gru => "gru",
            Cell::Tanh => "rnn_tanh",
            Cell::Relu => "rnn_relu",
        }
    }

    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            _ => 1,
        }
    }
}

#[derive(Clone, Copy)]
struct Shape {
    t: usize,
    b: usize,
    i: usize,
    h: usize,
    time_major: bool,
}

impl Shape {
    fn row(&self, t: usize, b: usize) -> usize {
        if self.time_major {
            t * self.b + b
        } else {
            b * self.t + t
        }
    }

    fn x_shape(&self, last: usize) -> Vec<usize> {
        if self.time_major {
            vec![self.t, self.b, last]
        } else {
            vec![self.b, self.t, last]
        }
    }

    fn h_shape(&self) -> Vec<usize> {
        if self.time_major {
            vec![1, self.b, self.h]
        } else {
            vec![self.b, 1, self.h]
        }
    }
}

/// All inputs of the forward op, as f64.
#[derive(Clone)]
struct Inputs {
    x: Vec<f64>,
    h0: Vec<f64>,
    c0: Vec<f64>,
    params: Vec<f64>,
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// (y, h_T, c_T) by cuDNN's equations; c_T is empty for cells without one.
fn forward(cell: Cell, s: &Shape, lens: &[i32], a: &Inputs) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (g, h, i) = (cell.gates(), s.h, s.i);
    let w = |gate: usize, j: usize, k: usize| a.params[(gate * h + j) * i + k];
    let r = |gate: usize, j: usize, k: usize| a.params[g * h * i + (gate * h + j) * h + k];
    let bw = |gate: usize, j: usize| a.params[g * h * (i + h) + gate * h + j];
    let br = |gate: usize, j: usize| a.params[g * h * (i + h + 1) + gate * h + j];
    let mut y = vec![0.0; s.t * s.b * h];
    let mut h_t = vec![0.0; s.b * h];
    let mut c_t = vec![0.0; if cell == Cell::Lstm { s.b * h } else { 0 }];
    for b in 0..s.b {
        let mut hs: Vec<f64> = a.h0[b * h..(b + 1) * h].to_vec();
        let mut cs: Vec<f64> = if cell == Cell::Lstm {
            a.c0[b * h..(b + 1) * h].to_vec()
        } else {
            vec![]
        };
        for t in 0..(lens[b].max(0) as usize).min(s.t) {
            let xr = &a.x[s.row(t, b) * i..(s.row(t, b) + 1) * i];
            let xpart = |gate: usize, j: usize| -> f64 {
                (0..i).map(|k| w(gate, j, k) * xr[k]).sum::<f64>() + bw(gate, j)
            };
            let hpart = |gate: usize, j: usize| -> f64 {
                (0..h).map(|k| r(gate, j, k) * hs[k]).sum::<f64>() + br(gate, j)
            };
            let mut nh = vec![0.0; h];
            let mut nc = cs.clone();
            for j in 0..h {
                match cell {
                    Cell::Lstm => {
                        let z = |gate| xpart(gate, j) + hpart(gate, j);
                        let (ig, fg, gg, og) =
                            (sigmoid(z(0)), sigmoid(z(1)), z(2).tanh(), sigmoid(z(3)));
                        nc[j] = fg * cs[j] + ig * gg;
                        nh[j] = og * nc[j].tanh();
                    }
                    Cell::Gru => {
                        // Keras's gate order (z, r, n), as the kernel takes it.
                        let zg = sigmoid(xpart(0, j) + hpart(0, j));
                        let rg = sigmoid(xpart(1, j) + hpart(1, j));
                        let ng = (xpart(2, j) + rg * hpart(2, j)).tanh();
                        nh[j] = zg * hs[j] + (1.0 - zg) * ng;
                    }
                    Cell::Tanh => nh[j] = (xpart(0, j) + hpart(0, j)).tanh(),
                    Cell::Relu => nh[j] = (xpart(0, j) + hpart(0, j)).max(0.0),
                }
            }
            hs = nh;
            cs = nc;
            y[s.row(t, b) * h..(s.row(t, b) + 1) * h].copy_from_slice(&hs);
        }
        h_t[b * h..(b + 1) * h].copy_from_slice(&hs);
        if cell == Cell::Lstm {
            c_t[b * h..(b + 1) * h].copy_from_slice(&cs);
        }
    }
    (y, h_t, c_t)
}

/// The gradients of L = <dy, y> + <dh, h_T> + <dc, c_T> with respect to x, h0, c0 and params,
/// by central differences of the f64 forward.
fn gradients(
    cell: Cell,
    s: &Shape,
    lens: &[i32],
    a: &Inputs,
    seeds: (&[f64], &[f64], &[f64]),
) -> Inputs {
    let loss = |a: &Inputs| {
        let (y, h, c) = forward(cell, s, lens, a);
        let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(p, q)| p * q).sum::<f64>();
        dot(&y, seeds.0) + dot(&h, seeds.1) + dot(&c, seeds.2)
    };
    let eps = 1e-6;
    let mut out = a.clone();
    for field in 0..4 {
        let n = [a.x.len(), a.h0.len(), a.c0.len(), a.params.len()][field];
        for k in 0..n {
            if field == 3 && !sampled(k, n) {
                out.params[k] = f64::NAN;
                continue;
            }
            let mut p = a.clone();
            let get = |p: &mut Inputs| -> *mut f64 {
                match field {
                    0 => &mut p.x[k],
                    1 => &mut p.h0[k],
                    2 => &mut p.c0[k],
                    _ => &mut p.params[k],
                }
            };
            // SAFETY: a pointer into `p`, used while `p` lives and is not otherwise borrowed.
            unsafe { *get(&mut p) += eps };
            let up = loss(&p);
            unsafe { *get(&mut p) -= 2.0 * eps };
            let down = loss(&p);
            let d = (up - down) / (2.0 * eps);
            match field {
                0 => out.x[k] = d,
                1 => out.h0[k] = d,
                2 => out.c0[k] = d,
                _ => out.params[k] = d,
            }
        }
    }
    out
}

/// Which weights the differences check: all of a few hundred, else every 7th and the first
/// and last of each block (the differences cost a whole forward each).
fn sampled(k: usize, n: usize) -> bool {
    n <= 600 || k.is_multiple_of(7) || k < 8 || k + 8 >= n
}

fn attrs(cell: Cell, time_major: bool, dtype: DType) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("rnn_mode", AttrValue::Str(cell.name().into()))
        .with("time_major", AttrValue::Bool(time_major))
        .with("is_training", AttrValue::Bool(true))
}

fn to32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn up(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    match dtype {
        DType::F16 => {
            let h: Vec<f16> = v.iter().map(|&x| f16::from_f64(x)).collect();
            dev().upload(&h, shape).unwrap()
        }
        _ => dev().upload(&to32(v), shape).unwrap(),
    }
}

fn down(t: &Tensor) -> Vec<f32> {
    match t.dtype() {
        DType::F16 => t
            .download::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => t.download::<f32>().unwrap(),
    }
}

/// The inputs rounded as the kernel sees them (float16 for float16 runs).
fn rounded(v: Vec<f64>, dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F16 => v.iter().map(|&x| f16::from_f64(x).to_f64()).collect(),
        _ => v.iter().map(|&x| x as f32 as f64).collect(),
    }
}

/// Runs forward and backward on random data and checks every output against the reference.
fn check(cell: Cell, s: Shape, lens: &[i32], dtype: DType, seed: u64) {
    let mut r = rng(seed);
    let g = cell.gates();
    let np = g * s.h * (s.i + s.h + 2);
    let lstm = cell == Cell::Lstm;
    let rand = |r: &mut _, n: usize, lo: f32, hi: f32| -> Vec<f64> {
        rounded(
            rand_f32(r, n, lo, hi).iter().map(|&v| v as f64).collect(),
            dtype,
        )
    };
    let a = Inputs {
        x: rand(&mut r, s.t * s.b * s.i, -1.0, 1.0),
        h0: rand(&mut r, s.b * s.h, -0.5, 0.5),
        c0: if lstm {
            rand(&mut r, s.b * s.h, -0.5, 0.5)
        } else {
            vec![]
        },
        params: rand(&mut r, np, -0.4, 0.4),
    };
    let dy = rand(&mut r, s.t * s.b * s.h, -1.0, 1.0);
    let dh = rand(&mut r, s.b * s.h, -1.0, 1.0);
    let dc = if lstm {
        rand(&mut r, s.b * s.h, -1.0, 1.0)
    } else {
        vec![]
    };
    let hshape = s.h_shape();
    let cshape: Vec<usize> = if lstm { hshape.clone() } else { vec![] };
    let x = up(&a.x, &s.x_shape(s.i), dtype);
    let h0 = up(&a.h0, &hshape, dtype);
    let c0 = if lstm {
        up(&a.c0, &cshape, dtype)
    } else {
        up(&[0.0], &[], dtype)
    };
    let params = up(&a.params, &[np], dtype);
    let lens_t = dev().upload(lens, &[s.b]).unwrap();
    // Poison freed memory the outputs may reuse, so that elements left unwritten show.
    drop(dev().upload(&vec![f32::NAN; 1 << 16], &[1 << 16]).unwrap());
    let at = attrs(cell, s.time_major, dtype);
    let what = format!(
        "{} {dtype} T{} B{} I{} H{} tm={} lens={lens:?}",
        cell.name(),
        s.t,
        s.b,
        s.i,
        s.h,
        s.time_major
    );
    let fwd = dev()
        .run(
            "CudnnRNNV3",
            &at,
            &[
                (&x).into(),
                (&h0).into(),
                (&c0).into(),
                (&params).into(),
                (&lens_t).into(),
            ],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (y, hs, cs) = forward(cell, &s, lens, &a);
    // float32: each pre-activation sums I + H + 2 terms of size <= ~1 and the state carries
    // the error through T steps whose derivatives are below 1; float16: the outputs' rounding.
    let (rtol, atol) = match dtype {
        DType::F16 => (2e-3, 2e-3),
        _ => (2e-5, 2e-5),
    };
    assert_eq!(fwd[0].shape(), s.x_shape(s.h).as_slice(), "{what}");
    assert_close(
        &down(&fwd[0]),
        &to32(&y),
        rtol,
        atol,
        &format!("{what}: output"),
    );
    assert_close(
        &down(&fwd[1]),
        &to32(&hs),
        rtol,
        atol,
        &format!("{what}: output_h"),
    );
    if lstm {
        assert_close(
            &down(&fwd[2]),
            &to32(&cs),
            rtol,
            atol,
            &format!("{what}: output_c"),
        );
    } else {
        assert_eq!(fwd[2].shape(), &[] as &[usize], "{what}: output_c");
    }
    let dy_t = up(&dy, &s.x_shape(s.h), dtype);
    let dh_t = up(&dh, &hshape, dtype);
    let dc_t = if lstm {
        up(&dc, &cshape, dtype)
    } else {
        up(&[0.0], &[], dtype)
    };
    drop(dev().upload(&vec![f32::NAN; 1 << 16], &[1 << 16]).unwrap());
    let bwd = dev()
        .run(
            "CudnnRNNBackpropV3",
            &at,
            &[
                (&x).into(),
                (&h0).into(),
                (&c0).into(),
                (&params).into(),
                (&lens_t).into(),
                (&fwd[0]).into(),
                (&fwd[1]).into(),
                (&fwd[2]).into(),
                (&dy_t).into(),
                (&dh_t).into(),
                (&dc_t).into(),
                (&fwd[3]).into(),
                (&fwd[4]).into(),
            ],
        )
        .unwrap_or_else(|e| panic!("{what}: backprop: {e}"));
    let seeds_dy = rounded(dy.clone(), dtype);
    let want = gradients(
        cell,
        &s,
        lens,
        &a,
        (
            &seeds_dy,
            &rounded(dh.clone(), dtype),
            &rounded(dc.clone(), dtype),
        ),
    );
    // Gradients sum up to T * B terms per weight.
    let (grtol, gatol) = match dtype {
        DType::F16 => (4e-3, 4e-3),
        _ => (5e-5, 5e-5),
    };
    assert_close(
        &down(&bwd[0]),
        &to32(&want.x),
        grtol,
        gatol,
        &format!("{what}: input_backprop"),
    );
    assert_close(
        &down(&bwd[1]),
        &to32(&want.h0),
        grtol,
        gatol,
        &format!("{what}: input_h_backprop"),
    );
    if lstm {
        assert_close(
            &down(&bwd[2]),
            &to32(&want.c0),
            grtol,
            gatol,
            &format!("{what}: input_c_backprop"),
        );
    }
    let got = down(&bwd[3]);
    let np_ = want.params.len();
    let keep: Vec<usize> = (0..np_).filter(|&k| sampled(k, np_)).collect();
    assert_close(
        &keep.iter().map(|&k| got[k]).collect::<Vec<_>>(),
        &keep
            .iter()
            .map(|&k| want.params[k] as f32)
            .collect::<Vec<_>>(),
        grtol,
        gatol,
        &format!("{what}: params_backprop"),
    );
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{what}: params_backprop not all written"
    );
}

const CELLS: [Cell; 4] = [Cell::Lstm, Cell::Gru, Cell::Tanh, Cell::Relu];

#[test]
fn every_cell_time_major_full_sequences() {
    let s = Shape {
        t: 4,
        b: 3,
        i: 5,
        h: 6,
        time_major: true,
    };
    for (k, cell) in CELLS.into_iter().enumerate() {
        check(cell, s, &[4, 4, 4], DType::F32, 10 + k as u64);
    }
}

#[test]
fn every_cell_batch_major_padded_sequences() {
    // Keras's layout (batch-major) with lengths from a mask, one sequence empty.
    let s = Shape {
        t: 5,
        b: 4,
        i: 3,
        h: 5,
        time_major: false,
    };
    for (k, cell) in CELLS.into_iter().enumerate() {
        check(cell, s, &[5, 2, 0, 3], DType::F32, 20 + k as u64);
    }
}

#[test]
fn states_wider_than_a_workgroup_and_odd_offsets() {
    // B * H = 279 invocations over two workgroups; G * H * I words before R (not a multiple
    // of the binding alignment), so R is copied to an aligned place.
    let s = Shape {
        t: 3,
        b: 9,
        i: 7,
        h: 31,
        time_major: false,
    };
    check(Cell::Lstm, s, &[3, 1, 2, 3, 3, 2, 1, 3, 3], DType::F32, 30);
    check(Cell::Gru, s, &[3; 9], DType::F32, 31);
    // More units than a fused step's workgroup (64): two workgroups per batch entry.
    let s = Shape {
        t: 2,
        b: 2,
        i: 3,
        h: 66,
        time_major: true,
    };
    check(Cell::Gru, s, &[2, 1], DType::F32, 32);
}

#[test]
fn float16_runs_in_float32_inside() {
    let s = Shape {
        t: 4,
        b: 2,
        i: 3,
        h: 4,
        time_major: false,
    };
    check(Cell::Lstm, s, &[4, 3], DType::F16, 40);
    check(Cell::Gru, s, &[4, 4], DType::F16, 41);
}

#[test]
fn empty_sequences_pass_the_state_through() {
    let s = Shape {
        t: 0,
        b: 2,
        i: 3,
        h: 4,
        time_major: true,
    };
    check(Cell::Lstm, s, &[0, 0], DType::F32, 50);
    check(Cell::Gru, s, &[0, 0], DType::F32, 51);
}

fn run_err(op: &str, attrs: &Attrs, args: &[&Tensor]) -> Error {
    let args: Vec<Arg> = args.iter().map(|t| Arg::from(*t)).collect();
    dev().run(op, attrs, &args).err().expect("an error")
}

#[test]
fn errors_name_what_is_wrong() {
    let z = |shape: &[usize]| {
        dev()
            .upload(&vec![0f32; shape.iter().product()], shape)
            .unwrap()
    };
    let lens = dev().upload(&[2i32, 2], &[2]).unwrap();
    let (x, h0) = (z(&[2, 2, 3]), z(&[1, 2, 4]));
    let lstm = attrs(Cell::Lstm, true, DType::F32);
    // 4 gates * 4 units * (3 + 4 + 2) = 144 elements.
    let e = run_err("CudnnRNNV3", &lstm, &[&x, &h0, &h0, &z(&[140]), &lens]);
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("params size mismatch") && m.contains("144")),
        "{e}"
    );
    let e = run_err(
        "CudnnRNNV3",
        &lstm,
        &[&x, &z(&[2, 2, 4]), &z(&[2, 2, 4]), &z(&[288]), &lens],
    );
    assert!(
        matches!(&e, Error::Unimplemented(m) if m.contains("2 layers")),
        "{e}"
    );
    let e = run_err(
        "CudnnRNNV3",
        &lstm,
        &[&x, &z(&[1, 3, 4]), &z(&[1, 3, 4]), &z(&[144]), &lens],
    );
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("Invalid input_h shape")),
        "{e}"
    );
    let e = run_err(
        "CudnnRNNV3",
        &lstm,
        &[&x, &h0, &z(&[1, 2, 5]), &z(&[144]), &lens],
    );
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("Invalid input_c shape")),
        "{e}"
    );
    let bi = lstm
        .clone()
        .with("direction", AttrValue::Str("bidirectional".into()));
    let e = dev()
        .kernel("CudnnRNNV3", &bi)
        .err()
        .expect("bidirectional refused");
    assert!(
        matches!(&e, Error::Unimplemented(m) if m.contains("bidirectional")),
        "{e}"
    );
    let skip = lstm
        .clone()
        .with("input_mode", AttrValue::Str("skip_input".into()));
    assert!(matches!(
        dev().kernel("CudnnRNNV3", &skip).err(),
        Some(Error::Unimplemented(_))
    ));
    let bad = lstm.clone().with("rnn_mode", AttrValue::Str("lru".into()));
    assert!(matches!(
        dev().kernel("CudnnRNNV3", &bad).err(),
        Some(Error::InvalidArgument(_))
    ));
    // A reserve space of the wrong size (not from this forward) is refused.
    let p = z(&[144]);
    let fwd = dev()
        .run(
            "CudnnRNNV3",
            &lstm,
            &[
                (&x).into(),
                (&h0).into(),
                (&h0).into(),
                (&p).into(),
                (&lens).into(),
            ],
        )
        .unwrap();
    let y = &fwd[0];
    let wrong = z(&[7]);
    let e = run_err(
        "CudnnRNNBackpropV3",
        &lstm,
        &[
            &x, &h0, &h0, &p, &lens, y, &fwd[1], &fwd[2], y, &fwd[1], &fwd[2], &wrong, &fwd[4],
        ],
    );
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("reserve_space")),
        "{e}"
    );
}
