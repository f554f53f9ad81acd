//! nn family: BiasAdd / BiasAddV1 / BiasAddGrad, Softmax / LogSoftmax, the softmax
//! cross-entropies and L2Loss, against f64 CPU references with error bounds from each
//! kernel's arithmetic.
mod common;
mod refs;

use common::*;
use rand::Rng;
use refs::*;
use tfwgpu_runtime::{AttrValue, Attrs, DType, Error, f16};

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

fn nchw() -> Attrs {
    Attrs::new().with("data_format", AttrValue::Str("NCHW".into()))
}

/// (outer, channels, inner) for a channel dimension.
fn split(shape: &[usize], channel: usize) -> (usize, usize, usize) {
    (
        shape[..channel].iter().product(),
        shape[channel],
        shape[channel + 1..].iter().product(),
    )
}

// ---------------------------------------------------------------- BiasAdd

#[test]
fn bias_add_layouts_and_dtypes() {
    let mut r = rng(31);
    // (shape, NCHW)
    let cases: &[(&[usize], bool)] = &[
        (&[2, 3], false),
        (&[2, 3], true),
        (&[7, 129], false),
        (&[4, 3, 5], true),
        (&[4, 3, 5], false),
        (&[2, 3, 4, 5], false),
        (&[2, 3, 4, 5], true),
        (&[0, 3], false),
        (&[3, 0], false),
        (&[1, 1], false),
        (&[2, 7, 1, 3], true),
    ];
    for &(shape, cf) in cases {
        let channel = if cf { 1 } else { shape.len() - 1 };
        let (_, c, inner) = split(shape, channel);
        let n = numel(shape);
        let bias_of = |e: usize| (e / inner) % c;
        let attrs = if cf { nchw() } else { Attrs::new() };
        let x = rand_f32(&mut r, n, -10.0, 10.0);
        let b = rand_f32(&mut r, c, -10.0, 10.0);
        let out = run("BiasAdd", &attrs, &[&host(&x, shape), &host(&b, &[c])]);
        assert_eq!(out[0].shape(), shape);
        let want: Vec<f32> = (0..n).map(|e| x[e] + b[bias_of(e)]).collect();
        assert_same_f32(
            &out[0].download::<f32>().unwrap(),
            &want,
            &format!("BiasAdd f32 {shape:?} nchw={cf}"),
        );
        let (xh, bh) = (f16s(&x), f16s(&b));
        let out = run("BiasAdd", &attrs, &[&host(&xh, shape), &host(&bh, &[c])]);
        let want: Vec<f16> = (0..n)
            .map(|e| f16::from_f32(xh[e].to_f32() + bh[bias_of(e)].to_f32()))
            .collect();
        assert_same_f16(&out[0].download::<f16>().unwrap(), &want, "BiasAdd f16");
        let xi = rand_i32(&mut r, n, i32::MIN, i32::MAX);
        let bi = rand_i32(&mut r, c, i32::MIN, i32::MAX);
        let out = run("BiasAdd", &attrs, &[&host(&xi, shape), &host(&bi, &[c])]);
        let want: Vec<i32> = (0..n).map(|e| xi[e].wrapping_add(bi[bias_of(e)])).collect();
        assert_eq!(out[0].download::<i32>().unwrap(), want, "BiasAdd i32");
        if !cf {
            let out = run(
                "BiasAddV1",
                &Attrs::new(),
                &[&host(&xi, shape), &host(&bi, &[c])],
            );
            assert_eq!(out[0].download::<i32>().unwrap(), want, "BiasAddV1");
        }
    }
}

#[test]
fn bias_add_errors() {
    let err = |attrs: &Attrs, v: &[usize], b: &[usize]| {
        try_run(
            "BiasAdd",
            attrs,
            &[
                &host(&vec![0f32; numel(v)], v),
                &host(&vec![0f32; numel(b)], b),
            ],
        )
        .err()
        .unwrap()
        .to_string()
    };
    assert_eq!(
        err(&Attrs::new(), &[3], &[3]),
        "BiasAdd: Input tensor must be at least 2D: [3]"
    );
    assert_eq!(
        err(&Attrs::new(), &[2, 3], &[1, 3]),
        "BiasAdd: Biases must be 1D: [1,3]"
    );
    assert_eq!(
        err(&Attrs::new(), &[2, 3], &[4]),
        "BiasAdd: Must provide as many biases as the last dimension of the input tensor: [4] \
         vs. [2,3]"
    );
    assert!(err(&nchw(), &[2, 3, 4], &[4]).contains("channel dimension"));
    let bad = Attrs::new().with("data_format", AttrValue::Str("NCDHW".into()));
    assert!(
        tfwgpu_runtime::Registry::global()
            .build_kernel("BiasAdd", &bad)
            .is_err()
    );
    let e = try_run(
        "BiasAdd",
        &Attrs::new(),
        &[&host(&[0f32; 6], &[2, 3]), &host(&[0i32; 3], &[3])],
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

// ---------------------------------------------------------------- BiasAddGrad

#[test]
fn bias_add_grad() {
    let mut r = rng(32);
    let cases: &[(&[usize], bool)] = &[
        (&[2, 3], false),
        (&[2, 3], true),
        (&[129, 7], false),
        (&[4, 3, 5], true),
        (&[2, 3, 4, 5], false),
        (&[2, 3, 4, 5], true),
        (&[0, 3], false),
        (&[3, 0], false),
        (&[1000, 10], false),
        (&[8, 10, 257], true),
    ];
    for &(shape, cf) in cases {
        let channel = if cf { 1 } else { shape.len() - 1 };
        let (outer, c, inner) = split(shape, channel);
        let n = numel(shape);
        let attrs = if cf { nchw() } else { Attrs::new() };
        let x = rand_f32(&mut r, n, -10.0, 10.0);
        let out = run("BiasAddGrad", &attrs, &[&host(&x, shape)]);
        assert_eq!(out[0].shape(), &[c]);
        let got = out[0].download::<f32>().unwrap();
        let mut want = vec![0f64; c];
        let mut abs = vec![0f64; c];
        for o in 0..outer {
            for ch in 0..c {
                for i in 0..inner {
                    let v = x[(o * c + ch) * inner + i] as f64;
                    want[ch] += v;
                    abs[ch] += v.abs();
                }
            }
        }
        // The reduce family's pairwise float sums: error within (log2(count) + 10) roundings
        // of the sum of magnitudes.
        let count = (outer * inner).max(1) as f64;
        let tol: Vec<f64> = abs
            .iter()
            .map(|a| (count.log2() + 10.0) * EPS * a)
            .collect();
        assert_within(
            &to_f64(&got),
            &want,
            &tol,
            &format!("BiasAddGrad {shape:?}"),
        );
        let xi = rand_i32(&mut r, n, i32::MIN, i32::MAX);
        let out = run("BiasAddGrad", &attrs, &[&host(&xi, shape)]);
        let mut want = vec![0i32; c];
        for o in 0..outer {
            for (ch, w) in want.iter_mut().enumerate() {
                for i in 0..inner {
                    *w = w.wrapping_add(xi[(o * c + ch) * inner + i]);
                }
            }
        }
        assert_eq!(out[0].download::<i32>().unwrap(), want, "BiasAddGrad i32");
    }
    let e = try_run("BiasAddGrad", &Attrs::new(), &[&host(&[1f32; 3], &[3])])
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "BiasAddGrad: Input tensor must be at least 2D: [3]"
    );
    // float16 is supported (tests/ewextra_f16.rs); int64 is not.
    let e = try_run("BiasAddGrad", &Attrs::new(), &[&host(&[1i64; 6], &[2, 3])])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
}

// ---------------------------------------------------------------- Softmax family

/// Rounding steps (in eps of the row sum) on the longest path of the kernel's row sums: an
/// invocation folds k = ceil(loads / t) loads of `vec` elements (4 when cols % 4 == 0, else 1)
/// into an online (max, sum) state, t = min(256, next power of two of ceil(loads / 4)); each
/// fold adds `vec` terms and may rescale the sum to a new maximum (one product and one exp:
/// 1 + 4 eps); the sum is rescaled once more to the row maximum, then a tree of log2(t) <= 8
/// additions, or (one row per workgroup, on a device with subgroups) two subgroup sums in the
/// driver's order around a strided sum of the subgroups' slots: at most 2 (sg - 1) +
/// wgs / sg^2 additions, 30 with lavapipe's subgroups of 8 and 1024 invocations.
fn sum_path(cols: usize) -> f64 {
    let vec = if cols.is_multiple_of(4) { 4 } else { 1 };
    let loads = cols / vec;
    let t = loads.div_ceil(4).max(1).next_power_of_two().min(256);
    let k = loads.div_ceil(t);
    (k * (vec + 5) + 5 + 30) as f64
}

/// The same for the cross-entropies' kernel: a strided partial sum of at most
/// max(8, cols / 256) terms per invocation, then a tree over at most 256 invocations.
fn xent_sum_path(cols: usize) -> f64 {
    (cols.div_ceil(256).max(8) + 8) as f64
}

/// f64 reference of one row: max, shifted values, sum of exps, log of the sum.
struct Row {
    d: Vec<f64>,
    s: f64,
    log_s: f64,
}

fn row_ref(x: &[f32]) -> Row {
    let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| {
        if v.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(v as f64)
        }
    });
    let d: Vec<f64> = x.iter().map(|&v| v as f64 - m).collect();
    let s: f64 = d.iter().map(|v| v.exp()).sum();
    Row {
        d,
        s,
        log_s: s.ln(),
    }
}

/// Bound of a computed probability exp(d) / s: the rounding of d (|d| eps, amplified by exp),
/// exp (2 ULP = 4 eps), the sum, the division (`div_eps`: the quotient's 2.5 ULP = 5 eps, or
/// 6 eps for a reciprocal of the sum and a product); and subnormal results may be flushed.
fn prob_tol(p: f64, d: f64, path: f64, div_eps: f64) -> f64 {
    if p == 0.0 {
        // exp(-inf): exactly 0.
        return 0.0;
    }
    p * EPS * (d.abs() + 4.0 + path + 4.0 + div_eps) + f32::MIN_POSITIVE as f64
}

/// Bound of log(s) as computed: log's 3 ULP (6 eps) of |log s|, and the relative error of s.
fn log_s_tol(log_s: f64, path: f64) -> f64 {
    EPS * (6.0 * log_s.abs() + path + 8.0)
}

fn logits(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    // Mostly [-10, 10]; one element in 7 far out (large shifts).
    (0..n)
        .map(|i| {
            if i % 7 == 3 {
                r.random_range(-60.0f32..60.0)
            } else {
                r.random_range(-10.0f32..10.0)
            }
        })
        .collect()
}

const ROW_SHAPES: &[&[usize]] = &[
    &[1, 1],
    &[3, 10],
    &[7, 129],
    &[129, 7],
    &[2, 1000],
    &[1, 3000],
    // Past 16 columns per invocation (4096 with 256 invocations per row): the streaming loops.
    &[2, 4097],
    &[3, 9001],
    // Multiples of 4 columns (vec4 loads): one load per invocation, the main loop's two loads
    // and its one-load tail, 256 invocations per row.
    &[9, 4],
    &[4, 8],
    &[3, 1000],
    &[2, 4100],
    &[2, 8192],
    // 8192 loads per row: one row per 1024-invocation workgroup, 8 loads in registers each.
    &[2, 32768],
    &[300, 3],
    &[0, 5],
    &[5, 0],
];

#[test]
fn softmax_and_log_softmax() {
    let mut r = rng(33);
    let extra: &[&[usize]] = &[&[10], &[2, 3, 5], &[1]];
    for &shape in ROW_SHAPES.iter().chain(extra) {
        let n = numel(shape);
        let cols = *shape.last().unwrap();
        let x = logits(&mut r, n);
        let sm = run("Softmax", &Attrs::new(), &[&host(&x, shape)]);
        let lsm = run("LogSoftmax", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(sm[0].shape(), shape);
        assert_eq!(lsm[0].shape(), shape);
        let (sm, lsm) = (
            sm[0].download::<f32>().unwrap(),
            lsm[0].download::<f32>().unwrap(),
        );
        let (mut want, mut tol, mut lwant, mut ltol) = (vec![], vec![], vec![], vec![]);
        for row in x.chunks(cols.max(1)).take(n.checked_div(cols).unwrap_or(0)) {
            let rr = row_ref(row);
            for &d in &rr.d {
                let p = d.exp() / rr.s;
                want.push(p);
                tol.push(prob_tol(p, d, sum_path(cols), 6.0));
                let lp = d - rr.log_s;
                lwant.push(lp);
                ltol.push(EPS * (d.abs() + lp.abs()) + log_s_tol(rr.log_s, sum_path(cols)));
            }
        }
        assert_within(&to_f64(&sm), &want, &tol, &format!("Softmax {shape:?}"));
        assert_within(
            &to_f64(&lsm),
            &lwant,
            &ltol,
            &format!("LogSoftmax {shape:?}"),
        );
        // Rows sum to 1.
        for (i, row) in sm.chunks(cols.max(1)).enumerate().take(n / cols.max(1)) {
            let s: f64 = row.iter().map(|&v| v as f64).sum();
            assert!(
                (s - 1.0).abs() < 1e-5,
                "Softmax {shape:?} row {i} sums to {s}"
            );
        }
    }
}

#[test]
fn softmax_special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // TensorFlow: a row with -inf everywhere, +inf, or NaN is NaN throughout; a -inf logit
    // has probability 0 and log probability -inf.
    let x = [-inf, -inf, inf, 1.0, nan, 1.0, -inf, 0.0, 1000.0, -1000.0];
    let sm = run("Softmax", &Attrs::new(), &[&host(&x, &[5, 2])]);
    let got = sm[0].download::<f32>().unwrap();
    assert_same_f32(
        &got,
        &[nan, nan, nan, nan, nan, nan, 0.0, 1.0, 1.0, 0.0],
        "Softmax specials",
    );
    let lsm = run("LogSoftmax", &Attrs::new(), &[&host(&x, &[5, 2])]);
    let got = lsm[0].download::<f32>().unwrap();
    assert_same_f32(
        &got,
        &[nan, nan, nan, nan, nan, nan, -inf, 0.0, 0.0, -2000.0],
        "LogSoftmax specials",
    );
    // The same specials in rows of 4 and 12 columns (vec4 loads): -inf before and after the
    // finite values (a fold whose maximum is still -inf must leave the sum at 0), NaN and
    // +inf in every lane position, a row of only -inf.
    let rows4: &[[f32; 4]] = &[
        [-inf, -inf, 1.0, 2.0],
        [1.0, -inf, 2.0, -inf],
        [nan, 1.0, 2.0, 3.0],
        [1.0, 2.0, 3.0, inf],
        [-inf, -inf, -inf, -inf],
        [0.0, 1000.0, -1000.0, 0.0],
        [-inf, nan, -inf, -inf],
    ];
    let x4: Vec<f32> = rows4.iter().flatten().copied().collect();
    let e1 = 1.0 / (1.0 + 1f64.exp());
    let want4: Vec<[f64; 4]> = vec![
        [0.0, 0.0, e1, 1.0 - e1],
        [e1, 0.0, 1.0 - e1, 0.0],
        [f64::NAN; 4],
        [f64::NAN; 4],
        [f64::NAN; 4],
        [0.0, 1.0, 0.0, 0.0],
        [f64::NAN; 4],
    ];
    let got = run("Softmax", &Attrs::new(), &[&host(&x4, &[7, 4])])[0]
        .download::<f32>()
        .unwrap();
    for (r, (g, w)) in got.chunks(4).zip(&want4).enumerate() {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a.is_nan() && b.is_nan()) || ((*a as f64) - b).abs() <= 1e-6,
                "Softmax vec4 specials row {r}: got {g:?}, want {w:?}"
            );
        }
    }
    // 12 columns: three loads of a row over one invocation (main loop and tail), -inf first.
    let mut x12 = vec![-inf; 8];
    x12.extend([0.0, -inf, 0.0, nan]);
    x12.extend([-inf; 8]);
    x12.extend([0.0, -inf, 0.0, 0.0]);
    let got = run("LogSoftmax", &Attrs::new(), &[&host(&x12, &[2, 12])])[0]
        .download::<f32>()
        .unwrap();
    assert!(got[..12].iter().all(|v| v.is_nan()), "{got:?}");
    let l3 = -(3f32.ln());
    let want: Vec<f32> = [[-inf; 8].as_slice(), &[l3, -inf, l3, l3]].concat();
    for (a, b) in got[12..].iter().zip(&want) {
        assert!(
            a == b || (a - b).abs() <= 1e-6,
            "LogSoftmax 12 columns: {got:?}"
        );
    }
    let e = try_run("Softmax", &Attrs::new(), &[&host(&[1f32], &[])])
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "Softmax: logits must have >= 1 dimension, got []"
    );
    // float16 is supported (tests/ewextra_f16.rs); int32 is not.
    let e = try_run("LogSoftmax", &Attrs::new(), &[&host(&[1i32], &[1])])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
}

/// The special values in long rows, on both sides of the registers variant's limit (4 loads
/// per invocation, 256 invocations: 4096 columns on vec4, 1024 on scalar loads) and so
/// through both kernels: NaN or +inf anywhere makes the row NaN, a row of only -inf is NaN,
/// -inf logits get probability 0 (LogSoftmax -inf), and the other rows match an f64
/// reference.
#[test]
fn softmax_special_values_long_rows() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    for cols in [4096usize, 4100, 1024, 1027, 32768] {
        let base = |r: usize, c: usize| ((r * 31 + c * 17) % 23) as f32 * 0.5 - 5.0;
        let mut x = vec![];
        for r in 0..6 {
            for c in 0..cols {
                let mut v = base(r, c);
                match r {
                    1 if c == cols - 2 => v = nan,
                    2 if c == cols / 2 + 1 => v = inf,
                    3 => v = -inf,
                    // -inf in the first 300 columns and every 7th one.
                    4 if c < 300 || c % 7 == 0 => v = -inf,
                    // -inf, one NaN, finite values in the last 8 columns: the invocations
                    // that load the NaN see nothing else but -inf (a maximum that drops the
                    // NaN sees only -inf), while the row's maximum is finite.
                    5 if c == cols / 3 => v = nan,
                    5 if c + 8 < cols => v = -inf,
                    _ => {}
                }
                x.push(v);
            }
        }
        for op in ["Softmax", "LogSoftmax"] {
            let got = run(op, &Attrs::new(), &[&host(&x, &[6, cols])])[0]
                .download::<f32>()
                .unwrap();
            for r in [1, 2, 3, 5] {
                assert!(
                    got[r * cols..(r + 1) * cols].iter().all(|v| v.is_nan()),
                    "{op} {cols} columns: row {r} must be NaN"
                );
            }
            for r in [0, 4] {
                let row = &x[r * cols..(r + 1) * cols];
                let rr = row_ref(row);
                for (c, &d) in rr.d.iter().enumerate() {
                    let g = got[r * cols + c];
                    if d == f64::NEG_INFINITY {
                        let want = if op == "Softmax" { 0.0 } else { -inf };
                        assert_eq!(g, want, "{op} {cols} columns: row {r} col {c}");
                        continue;
                    }
                    let (want, tol) = if op == "Softmax" {
                        let p = d.exp() / rr.s;
                        (p, prob_tol(p, d, sum_path(cols), 6.0))
                    } else {
                        let lp = d - rr.log_s;
                        (
                            lp,
                            EPS * (d.abs() + lp.abs()) + log_s_tol(rr.log_s, sum_path(cols)),
                        )
                    };
                    assert!(
                        ((g as f64) - want).abs() <= tol,
                        "{op} {cols} columns: row {r} col {c}: got {g}, want {want}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------- cross-entropies

fn sparse_attrs(t: DType) -> Attrs {
    Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("Tlabels", AttrValue::Type(t))
}

/// Checks SparseSoftmaxCrossEntropyWithLogits outputs against the f64 reference.
fn check_sparse(
    x: &[f32],
    labels: &[i64],
    cols: usize,
    loss: &[f32],
    backprop: &[f32],
    what: &str,
) {
    let rows = labels.len();
    assert_eq!(loss.len(), rows);
    assert_eq!(backprop.len(), rows * cols);
    let (mut lw, mut lt, mut bw, mut bt) = (vec![], vec![], vec![], vec![]);
    for (row, &lab) in x.chunks(cols).zip(labels) {
        let rr = row_ref(row);
        let valid = lab >= 0 && (lab as usize) < cols;
        if !valid {
            // Out-of-range labels: NaN loss and gradient.
            lw.push(f64::NAN);
            lt.push(0.0);
            bw.extend(std::iter::repeat_n(f64::NAN, cols));
            bt.extend(std::iter::repeat_n(0.0, cols));
            continue;
        }
        let dl = rr.d[lab as usize];
        let l = rr.log_s - dl;
        lw.push(l);
        lt.push(log_s_tol(rr.log_s, xent_sum_path(cols)) + EPS * (dl.abs() + l.abs()));
        for (j, &d) in rr.d.iter().enumerate() {
            let p = d.exp() / rr.s;
            let g = p - if j == lab as usize { 1.0 } else { 0.0 };
            bw.push(g);
            bt.push(prob_tol(p, d, xent_sum_path(cols), 5.0) + EPS * g.abs());
        }
    }
    assert_within(&to_f64(loss), &lw, &lt, &format!("{what} loss"));
    assert_within(&to_f64(backprop), &bw, &bt, &format!("{what} backprop"));
}

#[test]
fn sparse_softmax_cross_entropy() {
    let mut r = rng(34);
    for &shape in ROW_SHAPES {
        let (rows, cols) = (shape[0], shape[1]);
        if cols == 0 {
            continue;
        }
        let x = logits(&mut r, rows * cols);
        let labels: Vec<i64> = (0..rows).map(|_| r.random_range(0..cols as i64)).collect();
        let l32: Vec<i32> = labels.iter().map(|&v| v as i32).collect();
        for t in [DType::I32, DType::I64] {
            let lab = if t == DType::I32 {
                host(&l32, &[rows])
            } else {
                host(&labels, &[rows])
            };
            let out = run(
                "SparseSoftmaxCrossEntropyWithLogits",
                &sparse_attrs(t),
                &[&host(&x, shape), &lab],
            );
            assert_eq!(out[0].shape(), &[rows]);
            assert_eq!(out[1].shape(), shape);
            check_sparse(
                &x,
                &labels,
                cols,
                &out[0].download::<f32>().unwrap(),
                &out[1].download::<f32>().unwrap(),
                &format!("SparseXent {t} {shape:?}"),
            );
        }
    }
}

#[test]
fn sparse_softmax_cross_entropy_special_labels() {
    // Out-of-range labels (negative, = classes, beyond 32 bits) give NaN rows; the others
    // are unaffected. A -inf logit at the label gives an infinite loss, gradient -1.
    let inf = f32::INFINITY;
    let x = [
        1.0, 2.0, -inf, //
        0.0, 0.0, 0.0, //
        1.0, 2.0, 3.0, //
        1.0, 2.0, 3.0, //
        1.0, 2.0, 3.0, //
        1.0, 2.0, 3.0,
    ];
    let labels: [i64; 6] = [2, 1, -1, 3, 1 << 32, 0];
    for t in [DType::I32, DType::I64] {
        let lab = if t == DType::I32 {
            let l: Vec<i32> = labels.iter().map(|&v| v as i32).collect();
            // (1 << 32) truncates to 0 in int32: use another out-of-range value there.
            let mut l = l;
            l[4] = i32::MIN;
            host(&l, &[6])
        } else {
            host(&labels, &[6])
        };
        let out = run(
            "SparseSoftmaxCrossEntropyWithLogits",
            &sparse_attrs(t),
            &[&host(&x, &[6, 3]), &lab],
        );
        let loss = out[0].download::<f32>().unwrap();
        let bp = out[1].download::<f32>().unwrap();
        assert_eq!(loss[0], inf);
        assert_eq!(bp[2], -1.0);
        assert!((loss[1] - 3f32.ln()).abs() < 1e-6, "{}", loss[1]);
        for row in 2..5 {
            assert!(loss[row].is_nan(), "{t} row {row}: {}", loss[row]);
            assert!(
                bp[row * 3..row * 3 + 3].iter().all(|v| v.is_nan()),
                "{t} row {row}"
            );
        }
        let lab_ref: Vec<i64> = if t == DType::I32 {
            vec![2, 1, -1, 3, -1, 0]
        } else {
            labels.to_vec()
        };
        check_sparse(
            &x,
            &lab_ref,
            3,
            &loss,
            &bp,
            &format!("SparseXent {t} specials"),
        );
    }
    // TensorFlow's shape errors.
    let err = |xs: &[usize], ls: &[usize]| {
        try_run(
            "SparseSoftmaxCrossEntropyWithLogits",
            &Attrs::new(),
            &[
                &host(&vec![0f32; numel(xs)], xs),
                &host(&vec![0i32; numel(ls)], ls),
            ],
        )
        .err()
        .unwrap()
        .to_string()
    };
    assert!(err(&[2, 3], &[3]).contains("logits and labels must have the same first dimension"));
    assert!(err(&[2, 3], &[2, 1]).contains("labels must be 1-D, but got shape [2,1]"));
    assert!(err(&[2, 3, 1], &[2]).contains("logits must be 2-D, but got shape [2,3,1]"));
    assert!(err(&[2, 0], &[2]).contains("Must have at least one class"));
    assert!(err(&[0, 0], &[0]).contains("Must have at least one class"));
    let out = run(
        "SparseSoftmaxCrossEntropyWithLogits",
        &Attrs::new(),
        &[&host(&[0f32; 0], &[0, 3]), &host(&[0i32; 0], &[0])],
    );
    assert_eq!((out[0].shape(), out[1].shape()), (&[0][..], &[0, 3][..]));
    // Float labels, a Tlabels mismatch.
    let e = try_run(
        "SparseSoftmaxCrossEntropyWithLogits",
        &Attrs::new(),
        &[&host(&[0f32; 2], &[1, 2]), &host(&[0f32], &[1])],
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = try_run(
        "SparseSoftmaxCrossEntropyWithLogits",
        &sparse_attrs(DType::I64),
        &[&host(&[0f32; 2], &[1, 2]), &host(&[0i32], &[1])],
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[test]
fn softmax_cross_entropy_broadcasting() {
    let mut r = rng(35);
    // (logits shape, labels shape): equal, and broadcast to rank 2 as TensorFlow allows.
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 10], &[3, 10]),
        (&[7, 129], &[7, 129]),
        (&[2, 1000], &[2, 1000]),
        (&[3, 4], &[1, 4]),
        (&[3, 4], &[4]),
        (&[1, 4], &[3, 1]),
        (&[5, 1], &[5, 6]),
        (&[3, 4], &[]),
        (&[0, 4], &[0, 4]),
        (&[2, 0], &[2, 0]),
    ];
    for &(xs, ls) in cases {
        let out_shape = bshape(&[xs, ls]).unwrap();
        let (rows, cols) = (out_shape[0], out_shape[1]);
        let x = logits(&mut r, numel(xs));
        // Labels: random distributions (not normalized: the op does not require it), with
        // zeros.
        let lab: Vec<f32> = (0..numel(ls))
            .map(|i| {
                if i % 3 == 0 {
                    0.0
                } else {
                    r.random_range(0.0f32..1.0)
                }
            })
            .collect();
        let out = run(
            "SoftmaxCrossEntropyWithLogits",
            &Attrs::new(),
            &[&host(&x, xs), &host(&lab, ls)],
        );
        assert_eq!(out[0].shape(), &[rows], "{xs:?} {ls:?}");
        assert_eq!(out[1].shape(), &[rows, cols], "{xs:?} {ls:?}");
        let loss = out[0].download::<f32>().unwrap();
        let bp = out[1].download::<f32>().unwrap();
        // The broadcast inputs, materialized.
        let (_, offs) = bcast_offsets(&[xs, ls]);
        let xb: Vec<f32> = offs.iter().map(|o| x[o[0]]).collect();
        let lb: Vec<f32> = offs.iter().map(|o| lab[o[1]]).collect();
        let (mut lw, mut lt, mut bw, mut bt) = (vec![], vec![], vec![], vec![]);
        for row in 0..rows {
            let xr = &xb[row * cols..(row + 1) * cols];
            let lr = &lb[row * cols..(row + 1) * cols];
            let rr = row_ref(xr);
            let (mut l, mut scale) = (0f64, 0f64);
            for (&lj, &d) in lr.iter().zip(&rr.d) {
                let lj = lj as f64;
                let term = lj * (rr.log_s - d);
                l += term;
                // Each term: log(s) as computed, d's rounding, the difference and product.
                scale += lj
                    * (log_s_tol(rr.log_s, xent_sum_path(cols))
                        + EPS * 3.0 * (d.abs() + rr.log_s.abs()));
                scale += xent_sum_path(cols) * EPS * term.abs();
                let p = d.exp() / rr.s;
                let g = p - lj;
                bw.push(g);
                bt.push(prob_tol(p, d, xent_sum_path(cols), 5.0) + EPS * g.abs());
            }
            lw.push(l);
            lt.push(scale);
        }
        assert_within(
            &to_f64(&loss),
            &lw,
            &lt,
            &format!("Xent loss {xs:?} {ls:?}"),
        );
        assert_within(
            &to_f64(&bp),
            &bw,
            &bt,
            &format!("Xent backprop {xs:?} {ls:?}"),
        );
    }
    // A zero label at a -inf logit: NaN loss (0 * inf), as TensorFlow.
    let inf = f32::INFINITY;
    let out = run(
        "SoftmaxCrossEntropyWithLogits",
        &Attrs::new(),
        &[
            &host(&[1.0f32, 2.0, -inf, 0.0, 0.0, 0.0], &[2, 3]),
            &host(&[0.5f32, 0.5, 0.0, 0.2, 0.3, 0.5], &[2, 3]),
        ],
    );
    let loss = out[0].download::<f32>().unwrap();
    assert!(loss[0].is_nan(), "{loss:?}");
    assert!((loss[1] - 3f32.ln()).abs() < 1e-6, "{loss:?}");
    let bp = out[1].download::<f32>().unwrap();
    assert_eq!(bp[2], 0.0);
    // TensorFlow's errors.
    let err = |xs: &[usize], ls: &[usize]| {
        try_run(
            "SoftmaxCrossEntropyWithLogits",
            &Attrs::new(),
            &[
                &host(&vec![0f32; numel(xs)], xs),
                &host(&vec![0f32; numel(ls)], ls),
            ],
        )
        .err()
        .unwrap()
        .to_string()
    };
    assert!(
        err(&[3, 4], &[2, 4]).contains(
            "logits and labels must be broadcastable: logits_size=[3,4] labels_size=[2,4]"
        )
    );
    assert!(err(&[4], &[4]).contains("must be either 2-dimensional"));
    assert!(err(&[2, 3, 4], &[2, 3, 4]).contains("must be either 2-dimensional"));
}

// ---------------------------------------------------------------- L2Loss

#[test]
fn l2_loss() {
    let mut r = rng(36);
    for shape in [
        &[0usize][..],
        &[],
        &[7],
        &[3, 43],
        &[2049],
        &[100_000],
        &[3, 1_000_000],
    ] {
        let n = numel(shape);
        let x = rand_f32(&mut r, n, -10.0, 10.0);
        let out = run("L2Loss", &Attrs::new(), &[&host(&x, shape)]);
        assert_eq!(out[0].shape(), &[] as &[usize]);
        let got = out[0].download::<f32>().unwrap()[0] as f64;
        let want: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / 2.0;
        // Positive terms: the rounding error is at most (roundings on the longest path)
        // * eps * sum. Path: the square, a strided partial sum of max(8, n / 2^18) terms, a
        // tree of 256, and (beyond one workgroup) a partial sum of 4 and another tree.
        let path = (n.div_ceil(1 << 18).max(8) + 1 + 8 + 4 + 8) as f64;
        assert!(
            (got - want).abs() <= path * EPS * want,
            "L2Loss {shape:?}: got {got}, want {want}"
        );
        let h = f16s(&rand_f32(&mut r, n.min(5000), -4.0, 4.0));
        let out = run("L2Loss", &Attrs::new(), &[&host(&h, &[h.len()])]);
        let got = out[0].download::<f16>().unwrap()[0].to_f64();
        let want: f64 = h.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / 2.0;
        assert_ulps(
            &[got],
            &[want],
            1.0,
            true,
            &format!("L2Loss f16 n={}", h.len()),
        );
    }
    let nan = f32::NAN;
    for (x, want) in [
        (vec![1.0f32, f32::INFINITY], f32::INFINITY),
        (vec![1.0, nan, 2.0], nan),
        (vec![1e20, 1.0], f32::INFINITY),
        (vec![3.0], 4.5),
        (vec![1.0, 2.0, 3.0, 4.0], 15.0),
    ] {
        let out = run("L2Loss", &Attrs::new(), &[&host(&x, &[x.len()])]);
        assert_same_f32(
            &out[0].download::<f32>().unwrap(),
            &[want],
            "L2Loss specials",
        );
    }
    let e = try_run("L2Loss", &Attrs::new(), &[&host(&[1i32], &[1])])
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unimplemented(_)), "{e:?}");
}
