//! Random family: the Philox random ops against TensorFlow's own CPU kernels (reference
//! vectors recorded by random_data/make_reference.py) and against a CPU model of TensorFlow's
//! algorithm written here; the bit ops and Bitcast against plain Rust.
mod common;
#[path = "random_data/tf_reference.rs"]
mod tf;

use common::*;
use rand::Rng;
use tfwgpu_runtime::kernels::random::{OPS_UINT64, philox as rt_philox};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Element, HostTensor, Kernel, Tensor, f16};

// ---------------------------------------------------------------------------------------
// CPU model of TensorFlow's Philox kernels (philox_random.h, random_distributions.h).

fn block(c: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (c, key);
    for r in 0..10 {
        if r > 0 {
            k = [k[0].wrapping_add(0x9E3779B9), k[1].wrapping_add(0xBB67AE85)];
        }
        let m0 = 0xD2511F53u64 * c[0] as u64;
        let m1 = 0xCD9E8D57u64 * c[2] as u64;
        c = [
            (m1 >> 32) as u32 ^ c[1] ^ k[0],
            m1 as u32,
            (m0 >> 32) as u32 ^ c[3] ^ k[1],
            m0 as u32,
        ];
    }
    c
}

/// The 128-bit counter plus `n` (TensorFlow's Skip, for counts that do not wrap the low 64
/// bits twice).
fn skip(c: [u32; 4], n: u64) -> [u32; 4] {
    let lo = (c[0] as u128 | (c[1] as u128) << 32 | (c[2] as u128) << 64 | (c[3] as u128) << 96)
        .wrapping_add(n as u128);
    [
        lo as u32,
        (lo >> 32) as u32,
        (lo >> 64) as u32,
        (lo >> 96) as u32,
    ]
}

fn seed_key_counter(s0: i64, s1: i64) -> ([u32; 2], [u32; 4]) {
    let (a, b) = (s0 as u64, s1 as u64);
    let m = block(
        [a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32],
        [0x3ec8f720, 0x02461e29],
    );
    ([m[0], m[1]], [0, 0, m[2], m[3]])
}

fn u64_key_counter(key: u64, counter: [u64; 2]) -> ([u32; 2], [u32; 4]) {
    (
        [key as u32, (key >> 32) as u32],
        [
            counter[0] as u32,
            (counter[0] >> 32) as u32,
            counter[1] as u32,
            (counter[1] >> 32) as u32,
        ],
    )
}

fn unit(x: u32) -> f32 {
    f32::from_bits(0x3f800000 | (x & 0x7fffff)) - 1.0
}

fn box_muller(x0: u32, x1: u32) -> [f32; 2] {
    let mut u1 = unit(x0);
    if u1 < 1.0e-7 {
        u1 = 1.0e-7;
    }
    let v1 = (2.0f64 * std::f64::consts::PI * unit(x1) as f64) as f32;
    let u2 = (-2.0f32 * u1.ln()).sqrt();
    let (s, c) = v1.sin_cos();
    [s * u2, c * u2]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dist {
    Uniform,
    Normal,
    Truncated,
    UniformInt(i64, i64),
    FullInt,
}

/// Model output as bit patterns widened to u64 (f32 bits, f16 bits, or the integer).
fn model(dist: Dist, dtype: DType, key: [u32; 2], counter: [u32; 4], n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    let mut g = 0u64;
    while out.len() < n {
        let vals: Vec<u64> = match dist {
            Dist::Truncated => {
                let mut c = skip(counter, g * 256);
                let mut res = vec![];
                'outer: loop {
                    let b = block(c, key);
                    c = skip(c, 1);
                    for pair in [[b[0], b[1]], [b[2], b[3]]] {
                        for f in box_muller(pair[0], pair[1]) {
                            if f.abs() < 2.0 {
                                res.push(f);
                                if res.len() == 4 {
                                    break 'outer;
                                }
                            }
                        }
                    }
                }
                res.iter().map(|&f| float_bits(f, dtype)).collect()
            }
            _ => {
                let s = block(skip(counter, g), key);
                match (dist, dtype) {
                    (Dist::Uniform, DType::F32) => {
                        s.iter().map(|&x| unit(x).to_bits() as u64).collect()
                    }
                    (Dist::Uniform, _) => s
                        .iter()
                        .map(|&x| f16::from_f32((x & 0x3ff) as f32 / 1024.0).to_bits() as u64)
                        .collect(),
                    (Dist::Normal, _) => {
                        let a = box_muller(s[0], s[1]);
                        let b = box_muller(s[2], s[3]);
                        [a[0], a[1], b[0], b[1]]
                            .iter()
                            .map(|&f| float_bits(f, dtype))
                            .collect()
                    }
                    (Dist::UniformInt(lo, hi), DType::I32) => {
                        let range = (hi as u32).wrapping_sub(lo as u32);
                        s.iter()
                            .map(|&x| (lo as i32).wrapping_add((x % range) as i32) as i64 as u64)
                            .collect()
                    }
                    (Dist::UniformInt(lo, hi), _) => {
                        let range = (hi as u64).wrapping_sub(lo as u64);
                        [(s[0], s[1]), (s[2], s[3])]
                            .iter()
                            .map(|&(a, b)| {
                                (lo as u64).wrapping_add((a as u64 | (b as u64) << 32) % range)
                            })
                            .collect()
                    }
                    (Dist::FullInt, DType::I32) => {
                        s.iter().map(|&x| x as i32 as i64 as u64).collect()
                    }
                    (Dist::FullInt, _) => {
                        vec![
                            s[0] as u64 | (s[1] as u64) << 32,
                            s[2] as u64 | (s[3] as u64) << 32,
                        ]
                    }
                    _ => unreachable!(),
                }
            }
        };
        for v in vals {
            if out.len() < n {
                out.push(v);
            }
        }
        g += 1;
    }
    out
}

fn float_bits(f: f32, dtype: DType) -> u64 {
    if dtype == DType::F16 {
        f16::from_f32(f).to_bits() as u64
    } else {
        f.to_bits() as u64
    }
}

// ---------------------------------------------------------------------------------------
// Comparison helpers.

/// Distance in units in the last place between two floats of the same dtype (given as bits).
fn ulps(a: u64, b: u64, dtype: DType) -> u64 {
    let key = |x: u64| -> i64 {
        let (x, sign, mag) = if dtype == DType::F16 {
            (x, 0x8000u64, 0x7fffu64)
        } else {
            (x, 0x8000_0000u64, 0x7fff_ffffu64)
        };
        if x & sign != 0 {
            -((x & mag) as i64)
        } else {
            (x & mag) as i64
        }
    };
    key(a).abs_diff(key(b))
}

/// Exact for uniform floats and integers; within `max_ulps` for the Box-Muller ones.
fn assert_matches(got: &[u64], want: &[u64], dtype: DType, max_ulps: u64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if max_ulps == 0 || !dtype.is_float() {
            assert_eq!(g, w, "{what}[{i}]: got {g:#x}, want {w:#x}");
        } else {
            assert!(
                ulps(g, w, dtype) <= max_ulps,
                "{what}[{i}]: got {g:#x}, want {w:#x} ({} ulps)",
                ulps(g, w, dtype)
            );
        }
    }
}

fn bits_of(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::F32 => t
            .download::<f32>()
            .unwrap()
            .iter()
            .map(|f| f.to_bits() as u64)
            .collect(),
        DType::F16 => t
            .download::<f16>()
            .unwrap()
            .iter()
            .map(|f| f.to_bits() as u64)
            .collect(),
        DType::I32 => t
            .download::<i32>()
            .unwrap()
            .iter()
            .map(|&x| x as i64 as u64)
            .collect(),
        DType::I64 => t
            .download::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        other => panic!("no bits for {other}"),
    }
}

fn tf_u32(v: &[u32]) -> Vec<u64> {
    v.iter().map(|&x| x as u64).collect()
}
fn tf_u16(v: &[u16]) -> Vec<u64> {
    v.iter().map(|&x| x as u64).collect()
}
fn tf_i64(v: &[i64]) -> Vec<u64> {
    v.iter().map(|&x| x as u64).collect()
}

/// Allowed ULP distance of Box-Muller values from TensorFlow's (libm log / sincos on the CPU,
/// argument reduction and series in the shader). f16 values round the same f32 and may land
/// one half-ULP apart when the f32 values straddle a rounding boundary.
fn bm_ulps(dtype: DType) -> u64 {
    if dtype == DType::F16 { 1 } else { 4 }
}

fn tol(dist: Dist, dtype: DType) -> u64 {
    match dist {
        Dist::Normal | Dist::Truncated => bm_ulps(dtype),
        _ => 0,
    }
}

fn dtype_attrs(attr: &str, dtype: DType) -> Attrs {
    Attrs::new().with(attr, AttrValue::Type(dtype))
}

fn shape_arg(shape: &[usize]) -> HostTensor {
    HostTensor::new(
        &shape.iter().map(|&d| d as i64).collect::<Vec<_>>(),
        &[shape.len()],
    )
    .unwrap()
}

fn int_scalar(dtype: DType, v: i64) -> HostTensor {
    if dtype == DType::I32 {
        HostTensor::scalar(v as i32)
    } else {
        HostTensor::scalar(v)
    }
}

/// UniformInt's `minval` and `maxval` inputs; none for the other distributions.
fn bounds(dist: Dist, dtype: DType) -> Vec<HostTensor> {
    match dist {
        Dist::UniformInt(lo, hi) => vec![int_scalar(dtype, lo), int_scalar(dtype, hi)],
        _ => vec![],
    }
}

/// Runs a V1 stateless op (seed input).
fn run_v1(dist: Dist, dtype: DType, seed: [i64; 2], shape: &[usize]) -> Tensor {
    let op = match dist {
        Dist::Uniform => "StatelessRandomUniform",
        Dist::Normal => "StatelessRandomNormal",
        Dist::Truncated => "StatelessTruncatedNormal",
        Dist::UniformInt(..) => "StatelessRandomUniformInt",
        Dist::FullInt => "StatelessRandomUniformFullInt",
    };
    let shape_t = shape_arg(shape);
    let seed_t = HostTensor::new(&seed, &[2]).unwrap();
    let mut args = vec![Arg::from(&shape_t), Arg::from(&seed_t)];
    let bounds = bounds(dist, dtype);
    args.extend(bounds.iter().map(Arg::from));
    let out = dev().run(op, &dtype_attrs("dtype", dtype), &args).unwrap();
    assert_eq!(out[0].shape(), shape);
    assert_eq!(out[0].dtype(), dtype);
    out.into_iter().next().unwrap()
}

fn v2_kernel(op: &str, attrs: &Attrs) -> Box<dyn Kernel> {
    let def = OPS_UINT64.iter().find(|d| d.op == op).expect("a V2 op");
    (def.factory)(attrs).unwrap()
}

/// Runs a V2 stateless op (key and counter as int64 device tensors, alg on the host).
fn try_run_v2(
    dist: Dist,
    dtype: DType,
    key: u64,
    counter: &[u64],
    alg: i32,
    shape: &[usize],
) -> tfwgpu_runtime::Result<Tensor> {
    let op = match dist {
        Dist::Uniform => "StatelessRandomUniformV2",
        Dist::Normal => "StatelessRandomNormalV2",
        Dist::Truncated => "StatelessTruncatedNormalV2",
        Dist::UniformInt(..) => "StatelessRandomUniformIntV2",
        Dist::FullInt => "StatelessRandomUniformFullIntV2",
    };
    let d = dev();
    let shape_t = shape_arg(shape);
    let key_t = d.upload(&[key as i64], &[1]).unwrap();
    let counter_v: Vec<i64> = counter.iter().map(|&c| c as i64).collect();
    let counter_t = d.upload(&counter_v, &[counter.len()]).unwrap();
    let alg_t = HostTensor::scalar(alg);
    let mut args = vec![
        Arg::from(&shape_t),
        Arg::from(&key_t),
        Arg::from(&counter_t),
        Arg::from(&alg_t),
    ];
    let bounds = bounds(dist, dtype);
    args.extend(bounds.iter().map(Arg::from));
    let k = v2_kernel(op, &dtype_attrs("dtype", dtype));
    Ok(d.run_kernel(k.as_ref(), &args)?.into_iter().next().unwrap())
}

fn run_v2(dist: Dist, dtype: DType, key: u64, counter: [u64; 2], shape: &[usize]) -> Tensor {
    try_run_v2(dist, dtype, key, &counter, 1, shape).unwrap()
}

// ---------------------------------------------------------------------------------------
// TensorFlow's reference vectors.

struct Case {
    dist: Dist,
    dtype: DType,
    want: Vec<u64>,
    what: String,
}

/// One seed's reference set: `tf::{seed, key, counter}` and the ten vectors of the cases,
/// each named by `$p` and its distribution.
macro_rules! seed_set {
    ($p:literal: $seed:ident, $key:ident, $counter:ident, $uf32:ident, $uf16:ident,
     $nf32:ident, $nf16:ident, $tf32:ident, $tf16:ident, $i32:ident, $i64:ident,
     $fi32:ident, $fi64:ident) => {{
        use DType::{F16, F32, I32, I64};
        use Dist::{FullInt, Normal, Truncated, Uniform};
        let int32 = Dist::UniformInt(-5, 1000003);
        let int64 = Dist::UniformInt(-(1i64 << 40), (1i64 << 62) + 12345);
        let cases = vec![
            (Uniform, F32, tf_u32(tf::$uf32), "uniform f32"),
            (Uniform, F16, tf_u16(tf::$uf16), "uniform f16"),
            (Normal, F32, tf_u32(tf::$nf32), "normal f32"),
            (Normal, F16, tf_u16(tf::$nf16), "normal f16"),
            (Truncated, F32, tf_u32(tf::$tf32), "truncated f32"),
            (Truncated, F16, tf_u16(tf::$tf16), "truncated f16"),
            (int32, I32, tf_i64(tf::$i32), "int32"),
            (int64, I64, tf_i64(tf::$i64), "int64"),
            (FullInt, I32, tf_i64(tf::$fi32), "full int32"),
            (FullInt, I64, tf_i64(tf::$fi64), "full int64"),
        ];
        (
            [tf::$seed[0], tf::$seed[1]],
            tf::$key[0],
            [tf::$counter[0], tf::$counter[1]],
            cases
                .into_iter()
                .map(|(dist, dtype, want, what)| Case {
                    dist,
                    dtype,
                    want,
                    what: format!("{} {what}", $p),
                })
                .collect(),
        )
    }};
}

fn seed_cases(s: usize) -> ([i64; 2], u64, [u64; 2], Vec<Case>) {
    if s == 1 {
        seed_set!("S1": S1_SEED, S1_KEY, S1_COUNTER, S1_UNIFORM_F32, S1_UNIFORM_F16, S1_NORMAL_F32,
            S1_NORMAL_F16, S1_TRUNC_F32, S1_TRUNC_F16, S1_INT_I32, S1_INT_I64, S1_FULLINT_I32,
            S1_FULLINT_I64)
    } else {
        seed_set!("S2": S2_SEED, S2_KEY, S2_COUNTER, S2_UNIFORM_F32, S2_UNIFORM_F16, S2_NORMAL_F32,
            S2_NORMAL_F16, S2_TRUNC_F32, S2_TRUNC_F16, S2_INT_I32, S2_INT_I64, S2_FULLINT_I32,
            S2_FULLINT_I64)
    }
}

/// TensorFlow's float32 values for the raw key and counter (whose low word overflows within
/// the output: Skip's carry into word 2): (distribution, bits, ULPs allowed, name).
const RAW_CASES: [(Dist, &[u32], u64, &str); 2] = [
    (Dist::Uniform, tf::RAW_UNIFORM_F32, 0, "raw uniform"),
    (Dist::Truncated, tf::RAW_TRUNC_F32, 4, "raw truncated"),
];

#[test]
fn key_and_counter_from_seed_match_tensorflow() {
    for s in [1, 2] {
        let (seed, key, counter, _) = seed_cases(s);
        let want = u64_key_counter(key, counter);
        assert_eq!(
            seed_key_counter(seed[0], seed[1]),
            want,
            "model, seed {seed:?}"
        );
        assert_eq!(
            rt_philox::key_counter_from_seed(seed[0], seed[1]),
            want,
            "runtime, seed {seed:?}"
        );
    }
}

#[test]
fn cpu_model_matches_tensorflow() {
    for s in [1, 2] {
        let (_, key, counter, cases) = seed_cases(s);
        let (k, c) = u64_key_counter(key, counter);
        for case in cases {
            let got = model(case.dist, case.dtype, k, c, case.want.len());
            assert_matches(
                &got,
                &case.want,
                case.dtype,
                tol(case.dist, case.dtype),
                &case.what,
            );
        }
    }
    let (k, c) = u64_key_counter(tf::RAW_KEY[0], [tf::RAW_COUNTER[0], tf::RAW_COUNTER[1]]);
    for (dist, want, ulps, what) in RAW_CASES {
        let got = model(dist, DType::F32, k, c, want.len());
        assert_matches(&got, &tf_u32(want), DType::F32, ulps, what);
    }
}

#[test]
fn stateless_v1_matches_tensorflow() {
    for s in [1, 2] {
        let (seed, _, _, cases) = seed_cases(s);
        for case in cases {
            let t = run_v1(case.dist, case.dtype, seed, &[case.want.len()]);
            assert_matches(
                &bits_of(&t),
                &case.want,
                case.dtype,
                tol(case.dist, case.dtype),
                &case.what,
            );
        }
    }
}

#[test]
fn stateless_v2_matches_tensorflow() {
    for s in [1, 2] {
        let (_, key, counter, cases) = seed_cases(s);
        for case in cases {
            let t = run_v2(case.dist, case.dtype, key, counter, &[case.want.len()]);
            assert_matches(
                &bits_of(&t),
                &case.want,
                case.dtype,
                tol(case.dist, case.dtype),
                &case.what,
            );
        }
    }
    // A counter whose low word overflows within the output (Skip's carry into word 2).
    let counter = [tf::RAW_COUNTER[0], tf::RAW_COUNTER[1]];
    for (dist, want, ulps, what) in RAW_CASES {
        let t = run_v2(dist, DType::F32, tf::RAW_KEY[0], counter, &[want.len()]);
        assert_matches(&bits_of(&t), &tf_u32(want), DType::F32, ulps, what);
    }
    // AUTO_SELECT (3) is Philox; a counter longer than 2 uses its first two words.
    let (_, key, counter, _) = seed_cases(1);
    let t = try_run_v2(
        Dist::Uniform,
        DType::F32,
        key,
        &[counter[0], counter[1], 99],
        3,
        &[11],
    )
    .unwrap();
    assert_matches(
        &bits_of(&t),
        &tf_u32(tf::S1_UNIFORM_F32),
        DType::F32,
        0,
        "auto select",
    );
}

#[test]
fn stateful_ops_continue_their_sequence_like_tensorflow() {
    let d = dev();
    // (op, attributes, distribution, dtype, shape, TensorFlow's values for three calls)
    type StatefulCase = (&'static str, Attrs, Dist, DType, Vec<usize>, Vec<u64>);
    let cases: Vec<StatefulCase> = vec![
        (
            "RandomUniform",
            dtype_attrs("dtype", DType::F32),
            Dist::Uniform,
            DType::F32,
            vec![5],
            tf_u32(tf::STATEFUL_UNIFORM_F32),
        ),
        (
            "RandomStandardNormal",
            dtype_attrs("dtype", DType::F32),
            Dist::Normal,
            DType::F32,
            vec![3],
            tf_u32(tf::STATEFUL_NORMAL_F32),
        ),
        (
            "TruncatedNormal",
            dtype_attrs("dtype", DType::F16),
            Dist::Truncated,
            DType::F16,
            vec![2, 3],
            tf_u16(tf::STATEFUL_TRUNC_F16),
        ),
        (
            "RandomUniformInt",
            dtype_attrs("Tout", DType::I64),
            Dist::UniformInt(-10, 1_000_000_000_000_000),
            DType::I64,
            vec![3],
            tf_i64(tf::STATEFUL_INT_I64),
        ),
    ];
    let seeds = [(7, 11), (7, 12), (-3, 5), (9, 1)];
    for ((op, attrs, dist, dtype, shape, want), (seed, seed2)) in cases.into_iter().zip(seeds) {
        let attrs = attrs
            .with("seed", AttrValue::Int(seed))
            .with("seed2", AttrValue::Int(seed2));
        let kernel = d.kernel(op, &attrs).unwrap();
        let shape_t = shape_arg(&shape);
        let mut got = vec![];
        for _ in 0..3 {
            let mut args = vec![Arg::from(&shape_t)];
            let bounds = bounds(dist, dtype);
            args.extend(bounds.iter().map(Arg::from));
            let out = d.run_kernel(kernel.as_ref(), &args).unwrap();
            assert_eq!(out[0].shape(), &shape[..]);
            got.extend(bits_of(&out[0]));
        }
        assert_matches(&got, &want, dtype, tol(dist, dtype), op);
        // The model: call i starts 256 blocks per element after call i - 1.
        let (k, c0) = rt_philox::key_counter_from_attrs(seed, seed2);
        let n: usize = shape.iter().product();
        let mut m = vec![];
        for i in 0..3 {
            m.extend(model(dist, dtype, k, skip(c0, (i * n * 256) as u64), n));
        }
        assert_matches(&got, &m, dtype, tol(dist, dtype), op);
    }
}

#[test]
fn unseeded_stateful_ops_differ() {
    let d = dev();
    let attrs = dtype_attrs("dtype", DType::F32);
    let shape_t = shape_arg(&[8]);
    let a = d
        .run("RandomUniform", &attrs, &[Arg::from(&shape_t)])
        .unwrap();
    let b = d
        .run("RandomUniform", &attrs, &[Arg::from(&shape_t)])
        .unwrap();
    assert_ne!(bits_of(&a[0]), bits_of(&b[0]));
}

#[test]
fn gpu_matches_model_on_awkward_shapes() {
    let dists = [
        (Dist::Uniform, DType::F32),
        (Dist::Uniform, DType::F16),
        (Dist::Normal, DType::F32),
        (Dist::Normal, DType::F16),
        (Dist::Truncated, DType::F32),
        (Dist::Truncated, DType::F16),
        (Dist::UniformInt(-3, 4), DType::I32),
        (
            Dist::UniformInt(i32::MIN as i64, i32::MAX as i64),
            DType::I32,
        ),
        (Dist::UniformInt(i64::MIN, i64::MAX), DType::I64),
        (Dist::UniformInt(-1, 1 << 33), DType::I64),
        (Dist::UniformInt(5, 6), DType::I64),
        (Dist::FullInt, DType::I32),
        (Dist::FullInt, DType::I64),
    ];
    let shapes: [&[usize]; 6] = [&[0], &[], &[7], &[3, 43], &[2, 0, 3], &[1030]];
    let seed = [0x1234_5678_9abc_i64, -99];
    let (k, c) = seed_key_counter(seed[0], seed[1]);
    for (dist, dtype) in dists {
        for shape in shapes {
            let n: usize = shape.iter().product();
            let t = run_v1(dist, dtype, seed, shape);
            let want = model(dist, dtype, k, c, n);
            let what = format!("{dist:?} {dtype} {shape:?}");
            assert_matches(&bits_of(&t), &want, dtype, tol(dist, dtype), &what);
        }
    }
}

#[test]
fn distributions_are_sane() {
    let n = 40_000;
    let seed = [42, 4242];
    let f = |dist, dtype| -> Vec<f64> {
        let t = run_v1(dist, dtype, seed, &[n]);
        if dtype == DType::F16 {
            t.download::<f16>()
                .unwrap()
                .iter()
                .map(|x| x.to_f64())
                .collect()
        } else {
            t.download::<f32>()
                .unwrap()
                .iter()
                .map(|&x| x as f64)
                .collect()
        }
    };
    let moments = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
        (m, var)
    };
    // Bounds at about 5 standard errors.
    for dtype in [DType::F32, DType::F16] {
        let u = f(Dist::Uniform, dtype);
        assert!(
            u.iter().all(|&x| (0.0..1.0).contains(&x)),
            "uniform in [0, 1)"
        );
        let (m, var) = moments(&u);
        assert!(
            (m - 0.5).abs() < 0.008 && (var - 1.0 / 12.0).abs() < 0.004,
            "{m} {var}"
        );
        let g = f(Dist::Normal, dtype);
        let (m, var) = moments(&g);
        assert!(
            m.abs() < 0.025 && (var - 1.0).abs() < 0.04,
            "normal {m} {var}"
        );
        let t = f(Dist::Truncated, dtype);
        assert!(t.iter().all(|&x| x.abs() <= 2.0), "truncated within 2");
        let (m, var) = moments(&t);
        // Variance of the standard normal truncated to [-2, 2]: 0.7737.
        assert!(
            m.abs() < 0.025 && (var - 0.7737).abs() < 0.03,
            "truncated {m} {var}"
        );
    }
    let t = run_v1(Dist::UniformInt(-3, 4), DType::I32, seed, &[n]);
    let v = t.download::<i32>().unwrap();
    for k in -3..4 {
        let c = v.iter().filter(|&&x| x == k).count() as f64 / n as f64;
        assert!((c - 1.0 / 7.0).abs() < 0.01, "int {k}: {c}");
    }
}

#[test]
fn random_op_errors() {
    let d = dev();
    let shape_t = shape_arg(&[4]);
    let attrs = dtype_attrs("dtype", DType::F32);
    let bad_seed = HostTensor::new(&[1i64, 2, 3], &[3]).unwrap();
    let e = d
        .run(
            "StatelessRandomUniform",
            &attrs,
            &[Arg::from(&shape_t), Arg::from(&bad_seed)],
        )
        .err_only();
    assert!(
        e.to_string().contains("seed must have shape [2], not [3]"),
        "{e}"
    );
    let neg = HostTensor::vec_i32(&[2, -1]);
    let seed = HostTensor::new(&[1i32, 2], &[2]).unwrap();
    let e = d
        .run(
            "StatelessRandomNormal",
            &attrs,
            &[Arg::from(&neg), Arg::from(&seed)],
        )
        .err_only();
    assert!(e.to_string().contains("non-negative"), "{e}");
    let iattrs = dtype_attrs("dtype", DType::I32);
    let (lo, hi) = (HostTensor::scalar(5i32), HostTensor::scalar(5i32));
    let args = [
        Arg::from(&shape_t),
        Arg::from(&seed),
        Arg::from(&lo),
        Arg::from(&hi),
    ];
    let e = d
        .run("StatelessRandomUniformInt", &iattrs, &args)
        .err_only();
    assert!(
        e.to_string().contains("Need minval < maxval, got 5 >= 5"),
        "{e}"
    );
    // An empty output needs no valid range (as TensorFlow).
    let empty = shape_arg(&[0]);
    let args = [
        Arg::from(&empty),
        Arg::from(&seed),
        Arg::from(&lo),
        Arg::from(&hi),
    ];
    assert_eq!(
        d.run("StatelessRandomUniformInt", &iattrs, &args).unwrap()[0].shape(),
        &[0]
    );
    let e = d.run(
        "StatelessRandomUniform",
        &dtype_attrs("dtype", DType::I32),
        &[],
    );
    assert!(matches!(e, Err(tfwgpu_runtime::Error::Unimplemented(_))));
    // ThreeFry (2) is not implemented, as in TensorFlow's GPU kernels.
    let e = try_run_v2(Dist::Uniform, DType::F32, 1, &[0, 0], 2, &[4]).err_only();
    assert!(e.to_string().contains("Unsupported algorithm id: 2"), "{e}");
    let e = try_run_v2(Dist::Uniform, DType::F32, 1, &[0], 1, &[4]).err_only();
    assert!(
        e.to_string()
            .contains("counter must be a vector of length at least 2"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// Bit ops and Bitcast.

/// Broadcast reference: output shape and, per output element, the input element indices.
fn bcast_index(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<(usize, usize)>) {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| [vec![1; rank - s.len()], s.to_vec()].concat();
    let (pa, pb) = (pad(a), pad(b));
    let out: Vec<usize> = (0..rank)
        .map(|d| pa[d].max(pb[d]) * (pa[d].min(pb[d]) != 0) as usize)
        .collect();
    let n: usize = out.iter().product();
    let mut idx = vec![];
    for e in 0..n {
        let (mut rem, mut ia, mut ib, mut sa, mut sb) = (e, 0, 0, 1, 1);
        for d in (0..rank).rev() {
            let c = rem % out[d];
            rem /= out[d];
            if pa[d] != 1 {
                ia += c * sa;
            }
            if pb[d] != 1 {
                ib += c * sb;
            }
            sa *= pa[d];
            sb *= pb[d];
        }
        idx.push((ia, ib));
    }
    (out, idx)
}

const SHAPES: [(&[usize], &[usize]); 7] = [
    (&[7], &[7]),
    (&[], &[129]),
    (&[3, 1], &[1, 5]),
    (&[2, 3, 4], &[4]),
    (&[0, 3], &[1, 3]),
    (&[2, 1, 3], &[4, 1]),
    (&[1], &[]),
];

fn ref_i32(op: &str, x: i32, y: i32) -> i32 {
    let s = y.clamp(0, 31) as u32;
    match op {
        "BitwiseAnd" => x & y,
        "BitwiseOr" => x | y,
        "BitwiseXor" => x ^ y,
        "LeftShift" => ((x as u32) << s) as i32,
        _ => x >> s,
    }
}

fn ref_i64(op: &str, x: i64, y: i64) -> i64 {
    let s = y.clamp(0, 63) as u32;
    match op {
        "BitwiseAnd" => x & y,
        "BitwiseOr" => x | y,
        "BitwiseXor" => x ^ y,
        "LeftShift" => ((x as u64) << s) as i64,
        _ => x >> s,
    }
}

fn ref_u8(op: &str, x: u8, y: u8) -> u8 {
    let s = y.min(7) as u32;
    match op {
        "BitwiseAnd" => x & y,
        "BitwiseOr" => x | y,
        "BitwiseXor" => x ^ y,
        "LeftShift" => x << s,
        _ => x >> s,
    }
}

/// Bit op `op` on `xa` [sa] and `xb` [sb] (int32, int64 or uint8, named `what`): the
/// broadcast shape, and every element against `reference`.
fn check_bit_op<T: Element + PartialEq + std::fmt::Debug>(
    op: &str,
    (xa, sa): (&[T], &[usize]),
    (xb, sb): (&[T], &[usize]),
    reference: fn(&str, T, T) -> T,
    what: &str,
) {
    let d = dev();
    let (out_shape, idx) = bcast_index(sa, sb);
    let (ta, tb) = (d.upload(xa, sa).unwrap(), d.upload(xb, sb).unwrap());
    let out = d
        .run(
            op,
            &dtype_attrs("T", T::DTYPE),
            &[Arg::from(&ta), Arg::from(&tb)],
        )
        .unwrap();
    assert_eq!(out[0].shape(), &out_shape[..], "{op} {sa:?} {sb:?}");
    let want: Vec<T> = idx
        .iter()
        .map(|&(i, j)| reference(op, xa[i], xb[j]))
        .collect();
    assert_eq!(
        out[0].download::<T>().unwrap(),
        want,
        "{op} {what} {sa:?} {sb:?}"
    );
}

const BIT_OPS: [&str; 5] = [
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "LeftShift",
    "RightShift",
];

#[test]
fn bit_ops_match_reference_with_broadcasting() {
    let d = dev();
    let mut r = rng(7);
    for op in BIT_OPS {
        let shift = op.ends_with("Shift");
        for (sa, sb) in SHAPES {
            let (na, nb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
            // int32: shift amounts include negatives and amounts past the width.
            let xa: Vec<i32> = (0..na).map(|_| r.random()).collect();
            let xb: Vec<i32> = (0..nb)
                .map(|_| {
                    if shift {
                        r.random_range(-40..70)
                    } else {
                        r.random()
                    }
                })
                .collect();
            check_bit_op(op, (&xa, sa), (&xb, sb), ref_i32, "int32");

            let xa: Vec<i64> = (0..na).map(|_| r.random()).collect();
            let xb: Vec<i64> = (0..nb)
                .map(|_| {
                    if shift {
                        match r.random_range(0..4) {
                            0 => r.random(),
                            _ => r.random_range(-5..80),
                        }
                    } else {
                        r.random()
                    }
                })
                .collect();
            check_bit_op(op, (&xa, sa), (&xb, sb), ref_i64, "int64");

            let xa: Vec<u8> = (0..na).map(|_| r.random()).collect();
            let xb: Vec<u8> = (0..nb)
                .map(|_| {
                    if shift {
                        r.random_range(0..12)
                    } else {
                        r.random()
                    }
                })
                .collect();
            check_bit_op(op, (&xa, sa), (&xb, sb), ref_u8, "uint8");
        }
    }
    // Every int64 shift amount from -1 to 64 on one value.
    let x = -0x0123_4567_89ab_cdefi64;
    let ys: Vec<i64> = (-1..=64).collect();
    let tx = d.upload(&[x], &[]).unwrap();
    let ty = d.upload(&ys, &[ys.len()]).unwrap();
    for op in ["LeftShift", "RightShift"] {
        let out = d
            .run(
                op,
                &dtype_attrs("T", DType::I64),
                &[Arg::from(&tx), Arg::from(&ty)],
            )
            .unwrap();
        let want: Vec<i64> = ys.iter().map(|&y| ref_i64(op, x, y)).collect();
        assert_eq!(out[0].download::<i64>().unwrap(), want, "{op} every amount");
    }
}

#[test]
fn bit_op_errors() {
    let d = dev();
    let a = d.upload(&[1i32, 2], &[2]).unwrap();
    let b = d.upload(&[1i32, 2, 3], &[3]).unwrap();
    let e = d
        .run("BitwiseAnd", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
        .err_only();
    assert_eq!(e.to_string(), "BitwiseAnd: incompatible shapes [2] and [3]");
    let c = d.upload(&[1i64, 2], &[2]).unwrap();
    assert!(
        d.run("LeftShift", &Attrs::new(), &[Arg::from(&a), Arg::from(&c)])
            .is_err()
    );
    let f = d.upload(&[1.0f32, 2.0], &[2]).unwrap();
    assert!(matches!(
        d.run("BitwiseOr", &Attrs::new(), &[Arg::from(&f), Arg::from(&f)]),
        Err(tfwgpu_runtime::Error::Unimplemented(_))
    ));
}

fn bitcast(t: &Tensor, to: DType) -> tfwgpu_runtime::Result<Tensor> {
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(t.dtype()))
        .with("type", AttrValue::Type(to));
    Ok(dev()
        .run("Bitcast", &attrs, &[Arg::from(t)])?
        .into_iter()
        .next()
        .unwrap())
}

#[test]
fn bitcast_reinterprets_bytes() {
    let d = dev();
    let mut r = rng(3);
    // Same size: the shape stays.
    let x = rand_f32(&mut r, 21, -5.0, 5.0);
    let t = d.upload(&x, &[3, 7]).unwrap();
    let y = bitcast(&t, DType::I32).unwrap();
    assert_eq!(y.shape(), &[3, 7]);
    let want: Vec<i32> = x.iter().map(|f| f.to_bits() as i32).collect();
    assert_eq!(y.download::<i32>().unwrap(), want);
    // Smaller: a last dimension of in/out.
    let x: Vec<i64> = (0..5).map(|_| r.random()).collect();
    let t = d.upload(&x, &[5]).unwrap();
    let y = bitcast(&t, DType::I32).unwrap();
    assert_eq!(y.shape(), &[5, 2]);
    let want: Vec<i32> = bytemuck_i32(&x);
    assert_eq!(y.download::<i32>().unwrap(), want);
    let y = bitcast(&t, DType::U8).unwrap();
    assert_eq!(y.shape(), &[5, 8]);
    let want: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(y.download::<u8>().unwrap(), want);
    // Larger: the last dimension (out/in) goes.
    let bytes: Vec<u8> = (0..12).map(|_| r.random()).collect();
    let t = d.upload(&bytes, &[3, 4]).unwrap();
    let y = bitcast(&t, DType::F32).unwrap();
    assert_eq!(y.shape(), &[3]);
    let want: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let got: Vec<u32> = y
        .download::<f32>()
        .unwrap()
        .iter()
        .map(|f| f.to_bits())
        .collect();
    assert_eq!(got, want);
    let t = d
        .upload(
            &[f16::from_f32(1.5), f16::from_f32(-2.0), f16::ONE, f16::ZERO],
            &[2, 2],
        )
        .unwrap();
    let y = bitcast(&t, DType::I32).unwrap();
    assert_eq!(y.shape(), &[2]);
    assert_eq!(
        y.download::<i32>().unwrap(),
        vec![(0x3e00u32 | 0xc000 << 16) as i32, 0x3c00]
    );
    // Odd byte counts and empty tensors.
    let t = d.upload(&[1u8, 2, 3], &[3]).unwrap();
    let y = bitcast(&t, DType::U8).unwrap();
    assert_eq!(y.download::<u8>().unwrap(), vec![1, 2, 3]);
    let t = d.upload::<i64>(&[], &[0]).unwrap();
    assert_eq!(bitcast(&t, DType::F16).unwrap().shape(), &[0, 4]);
    // Errors.
    let t = d.upload(&[1u8, 2, 3], &[3]).unwrap();
    let e = bitcast(&t, DType::I32).err_only();
    assert!(
        e.to_string()
            .contains("Cannot bitcast from uint8 to int32: shape [3]"),
        "{e}"
    );
    let t = d.upload(&[true as u8], &[1]).unwrap();
    assert!(bitcast(&t, DType::Bool).is_err());
}

fn bytemuck_i32(x: &[i64]) -> Vec<i32> {
    x.iter()
        .flat_map(|&v| [v as i32, (v >> 32) as i32])
        .collect()
}

/// The error of a call expected to fail (Tensor has no Debug, so no unwrap_err).
trait ErrOnly {
    fn err_only(self) -> tfwgpu_runtime::Error;
}

impl<T> ErrOnly for tfwgpu_runtime::Result<T> {
    fn err_only(self) -> tfwgpu_runtime::Error {
        match self {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }
}
