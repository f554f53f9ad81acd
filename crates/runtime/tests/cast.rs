mod common;
use common::*;
use rand::Rng;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Error, HostTensor, Tensor, f16};

const ALL: [DType; 6] = DType::ALL;

/// One source element.
#[derive(Clone, Copy, Debug)]
enum V {
    F32(f32),
    F16(f16),
    I32(i32),
    I64(i64),
    U8(u8),
    Bool(bool),
}

/// The documented conversion (C++ static_cast as TensorFlow's CPU kernel applies it, with
/// saturating float -> int and NaN -> 0), written with Rust's `as`, which has exactly those
/// semantics: float -> int truncates and saturates, NaN -> 0; int -> float rounds to nearest
/// even; int -> int keeps the low bits. Returns the little-endian bytes of the result.
fn cast_ref(v: V, dst: DType, truncate: bool) -> Vec<u8> {
    enum N {
        F(f32),
        I(i64),
    }
    let n = match v {
        V::F32(x) => N::F(x),
        V::F16(x) => N::F(x.to_f32()),
        V::I32(x) => N::I(x as i64),
        V::I64(x) => N::I(x),
        V::U8(x) => N::I(x as i64),
        V::Bool(x) => N::I(x as i64),
    };
    match (n, dst) {
        (N::F(x), DType::F32) => x.to_le_bytes().to_vec(),
        (N::F(x), DType::F16) => {
            let is_f32 = matches!(v, V::F32(_));
            let x = if truncate && is_f32 && !x.is_nan() {
                // TensorFlow's LSBZeroSetter: clear the 13 bits f16 has no room for.
                f32::from_bits(x.to_bits() & 0xffff_e000)
            } else {
                x
            };
            f16::from_f32(x).to_le_bytes().to_vec()
        }
        (N::F(x), DType::I32) => (x as i32).to_le_bytes().to_vec(),
        (N::F(x), DType::I64) => (x as i64).to_le_bytes().to_vec(),
        (N::F(x), DType::U8) => vec![(x as i32) as u8],
        (N::F(x), DType::Bool) => vec![(x != 0.0) as u8],
        (N::I(x), DType::F32) => (x as f32).to_le_bytes().to_vec(),
        (N::I(x), DType::F16) => f16::from_f32(x as f32).to_le_bytes().to_vec(),
        (N::I(x), DType::I32) => (x as i32).to_le_bytes().to_vec(),
        (N::I(x), DType::I64) => x.to_le_bytes().to_vec(),
        (N::I(x), DType::U8) => vec![x as u8],
        (N::I(x), DType::Bool) => vec![(x != 0) as u8],
        (_, DType::U32 | DType::U64) => unreachable!("Cast has no unsigned kernels"),
    }
}

fn special_f32() -> Vec<f32> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        0.999_999_94,
        -0.999_999_94,
        1.5,
        -1.5,
        2.5,
        -2.7,
        127.9,
        128.5,
        254.9,
        255.5,
        256.2,
        300.7,
        -129.7,
        -255.9,
        1.000_976_6, // 1 + 2^-10: exact in f16
        1.001_709,   // 1 + 1.75 * 2^-10: rounds up to 1 + 2^-9 in f16, truncates to 1 + 2^-10
        1.001_46,    // 1 + 1.5 * 2^-10 - a little: rounds down to 1 + 2^-10
        2049.0,      // a tie in f16: rounds to even 2048
        2051.0,      // a tie in f16: rounds to even 2052
        65504.0,
        65519.0,
        65520.0, // rounds to f16 infinity
        -65520.0,
        1e5,
        -1e5,
        6.0e-8,
        3.0e-8,
        2.98e-8,      // just below half the smallest f16 subnormal: 0
        2.9802322e-8, // exactly 2^-25: a tie, rounds to even 0
        2.99e-8,      // just above 2^-25: rounds up to the smallest subnormal
        1e-5,         // an f16 subnormal
        -6.1e-5,      // near the smallest normal f16
        1e-8,
        5.960_464_5e-8,
        1e-40,
        16_777_217.0,
        2_147_483_520.0,
        2_147_483_648.0,
        -2_147_483_648.0,
        -2_147_483_904.0,
        3e9,
        -3e9,
        9.223_371_5e18, // largest f32 below 2^63
        9.223_372e18,   // 2^63: saturates
        -9.223_372e18,  // -2^63: INT64_MIN exactly
        -9.223_373e18,
        1e20,
        -1e20,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0 / 3.0,
        0.1,
        1e10,
        12_345_678.9,
        -123.456,
    ]
}

fn special_i64() -> Vec<i64> {
    let p = |k: u32| 1i64 << k;
    vec![
        0,
        1,
        -1,
        2,
        -2,
        127,
        128,
        255,
        256,
        -128,
        -129,
        -256,
        65504,
        65519,
        65520,
        -65520,
        70000,
        p(24) + 1,
        p(24) + 3,
        -(p(24) + 1),
        p(31) - 1,
        p(31),
        -p(31),
        -p(31) - 1,
        p(32) - 1,
        p(32),
        p(32) + 1,
        p(40) + p(16) + 1,
        p(53) + 1,
        p(60) + p(36),     // a tie: rounds to even (down)
        p(60) + p(36) + 1, // just above a tie: up
        p(60) + 3 * p(36), // a tie with an odd mantissa: up
        -(p(60) + p(36) + 1),
        p(62),
        -p(62),
        0x7fff_ff80_0000_0000, // rounds up to 2^63
        i64::MAX,
        i64::MIN,
        i64::MIN + 1,
        0x1234_5678_9abc_def0,
        -0x1234_5678_9abc_def0,
    ]
}

fn special_i32() -> Vec<i32> {
    vec![
        0,
        1,
        -1,
        127,
        128,
        255,
        256,
        -128,
        -129,
        -256,
        65504,
        65519,
        65520,
        -65520,
        16_777_216,
        16_777_217,
        16_777_219,
        -16_777_217,
        (1 << 30) + 1,
        0x7fff_ffbf,
        0x7fff_ffc0,
        i32::MAX,
        i32::MIN,
        i32::MAX - 64,
        123_456_789,
        -987_654_321,
    ]
}

fn special_f16() -> Vec<f16> {
    let mut v: Vec<f16> = special_f32().into_iter().map(f16::from_f32).collect();
    v.extend([
        f16::from_bits(0x0001), // smallest subnormal
        f16::from_bits(0x83ff), // largest negative subnormal
        f16::MAX,
        f16::MIN,
        f16::from_f32(-300.5),
        f16::from_f32(255.75),
    ]);
    v
}

/// `len` source values of `dtype`: the special values first, then random ones.
fn source(dtype: DType, len: usize, seed: u64) -> Vec<V> {
    let mut r = rng(seed);
    let mut v: Vec<V> = match dtype {
        DType::F32 => special_f32().into_iter().map(V::F32).collect(),
        DType::F16 => special_f16().into_iter().map(V::F16).collect(),
        DType::I32 => special_i32().into_iter().map(V::I32).collect(),
        DType::I64 => special_i64().into_iter().map(V::I64).collect(),
        DType::U8 => [0u8, 1, 2, 127, 128, 200, 254, 255]
            .into_iter()
            .map(V::U8)
            .collect(),
        DType::Bool => [false, true, true, false, false]
            .into_iter()
            .map(V::Bool)
            .collect(),
        DType::U32 | DType::U64 => unreachable!("Cast has no unsigned kernels"),
    };
    while v.len() < len {
        let i = v.len();
        v.push(match dtype {
            DType::F32 => V::F32(match i % 3 {
                0 => r.random_range(-300.0f32..300.0),
                1 => r.random_range(-3e10f32..3e10),
                _ => r.random_range(-1.0f32..1.0),
            }),
            DType::F16 => V::F16(f16::from_bits(r.random())),
            DType::I32 => V::I32(if i.is_multiple_of(2) {
                r.random()
            } else {
                r.random_range(-70000..70000)
            }),
            DType::I64 => V::I64(if i.is_multiple_of(2) {
                r.random()
            } else {
                r.random_range(-(1i64 << 40)..(1i64 << 40))
            }),
            DType::U8 => V::U8(r.random()),
            DType::Bool => V::Bool(r.random()),
            DType::U32 | DType::U64 => unreachable!("Cast has no unsigned kernels"),
        });
    }
    v.truncate(len);
    v
}

fn host(dtype: DType, vals: &[V], shape: &[usize]) -> HostTensor {
    let mut bytes = vec![];
    for v in vals {
        match *v {
            V::F32(x) => bytes.extend(x.to_le_bytes()),
            V::F16(x) => bytes.extend(x.to_le_bytes()),
            V::I32(x) => bytes.extend(x.to_le_bytes()),
            V::I64(x) => bytes.extend(x.to_le_bytes()),
            V::U8(x) => bytes.push(x),
            V::Bool(x) => bytes.push(x as u8),
        }
    }
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

fn cast_attrs(src: DType, dst: DType) -> Attrs {
    Attrs::new()
        .with("SrcT", AttrValue::Type(src))
        .with("DstT", AttrValue::Type(dst))
        .with("Truncate", AttrValue::Bool(false))
}

/// Compares the bytes of the Cast of `vals` from `src` to `dst` (`truncate`: the Truncate
/// attribute) with `cast_ref`'s; float NaNs match any NaN.
fn assert_cast_eq(out: &Tensor, src: DType, dst: DType, vals: &[V], truncate: bool) {
    let got = out.download_host().unwrap().bytes;
    let want: Vec<u8> = vals
        .iter()
        .flat_map(|&v| cast_ref(v, dst, truncate))
        .collect();
    let size = dst.size();
    assert_eq!(got.len(), want.len(), "{src}->{dst}: byte length");
    for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
        let nan = match dst {
            DType::F32 => {
                let f = |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap()).is_nan();
                f(g) && f(w)
            }
            DType::F16 => {
                let f = |b: &[u8]| f16::from_le_bytes(b.try_into().unwrap()).is_nan();
                f(g) && f(w)
            }
            _ => false,
        };
        assert!(
            nan || g == w,
            "{src}->{dst}[{i}] of {:?}: got {g:?}, want {w:?}",
            vals[i]
        );
    }
}

#[test]
fn cast_every_pair() {
    let d = dev();
    for (si, &src) in ALL.iter().enumerate() {
        let vals = source(src, 129, 10 + si as u64);
        for &dst in &ALL {
            // [16] and [2, 64]: f32 <-> f16 on 8 elements per invocation (n % 8 == 0).
            for shape in [&[0usize][..], &[], &[7], &[3, 43], &[16], &[2, 64]] {
                let n: usize = shape.iter().product();
                let vals = &vals[..n];
                let t = d.upload_host(&host(src, vals, shape)).unwrap();
                let out = d
                    .run("Cast", &cast_attrs(src, dst), &[Arg::from(&t)])
                    .unwrap();
                assert_eq!(out[0].dtype(), dst);
                assert_eq!(out[0].shape(), shape);
                assert_cast_eq(&out[0], src, dst, vals, false);
            }
        }
    }
}

/// f32 <-> f16 through the vector kernels (n % 8 == 0: f32 -> f16 eight elements per
/// invocation, f16 -> f32 four, or eight with TFWGPU_CAST_F16_F32=x8) and the one-word
/// kernel (n odd): every one of the 65,536 halves to f32, and for every finite half h > 0
/// (both signs) h itself, the tie halfway to the next half, one f32 ulp either side of it
/// (round to nearest even, overflow to infinity past 65504's tie, subnormals), compared bit
/// for bit with the `half` crate (NaN: any NaN).
#[test]
fn cast_f16_conversions_are_exact_on_every_half_and_tie() {
    let d = dev();
    let halves: Vec<V> = (0..=u16::MAX).map(|b| V::F16(f16::from_bits(b))).collect();
    let mut floats = vec![];
    for b in 0u16..0x7c00 {
        let h = f16::from_bits(b).to_f32();
        let next = f16::from_bits(b + 1).to_f32();
        let tie = (h + next) / 2.0;
        for v in [
            h,
            tie,
            f32::from_bits(tie.to_bits() - 1),
            f32::from_bits(tie.to_bits() + 1),
        ] {
            floats.push(V::F32(v));
            floats.push(V::F32(-v));
        }
    }
    for (src, dst, vals) in [
        (DType::F16, DType::F32, &halves),
        (DType::F32, DType::F16, &floats),
    ] {
        // n % 8 == 0 (the vector kernels), then one element less (the one-word kernel).
        for n in [vals.len(), vals.len() - 1] {
            let vals = &vals[..n];
            let t = d.upload_host(&host(src, vals, &[n])).unwrap();
            let out = d
                .run("Cast", &cast_attrs(src, dst), &[Arg::from(&t)])
                .unwrap();
            assert_cast_eq(&out[0], src, dst, vals, false);
        }
    }
}

#[test]
fn cast_semantics_spelled_out() {
    let d = dev();
    let run = |t: &tfwgpu_runtime::Tensor, dst: DType| {
        let out = d
            .run("Cast", &cast_attrs(t.dtype(), dst), &[Arg::from(t)])
            .unwrap();
        out.into_iter().next().unwrap()
    };
    let x = d
        .upload(
            &[
                2.7f32,
                -2.7,
                f32::NAN,
                3e9,
                -3e9,
                f32::INFINITY,
                -0.0,
                300.7,
            ],
            &[8],
        )
        .unwrap();
    // Truncation toward zero; NaN -> 0; saturation.
    assert_eq!(
        run(&x, DType::I32).download::<i32>().unwrap(),
        vec![2, -2, 0, i32::MAX, i32::MIN, i32::MAX, 0, 300]
    );
    assert_eq!(
        run(&x, DType::I64).download::<i64>().unwrap(),
        vec![2, -2, 0, 3_000_000_000, -3_000_000_000, i64::MAX, 0, 300]
    );
    // uint8: low 8 bits of the int32 conversion.
    assert_eq!(
        run(&x, DType::U8).download::<u8>().unwrap(),
        vec![2, 254, 0, 255, 0, 255, 0, 44]
    );
    // bool: x != 0, NaN is true.
    assert_eq!(
        run(&x, DType::Bool).download::<u8>().unwrap(),
        vec![1, 1, 1, 1, 1, 1, 0, 1]
    );
    // int64 -> f32 rounds to nearest even once.
    let l = d
        .upload(&[16_777_217i64, 16_777_219, -(1 << 40) - 1, i64::MIN], &[4])
        .unwrap();
    assert_eq!(
        run(&l, DType::F32).download::<f32>().unwrap(),
        vec![
            16_777_216.0,
            16_777_220.0,
            -1_099_511_627_776.0,
            -9.223_372e18
        ]
    );
    // int -> uint8 keeps the low bits; bool -> float is 0/1.
    let i = d.upload(&[-1i32, 256, 257, -129], &[4]).unwrap();
    assert_eq!(
        run(&i, DType::U8).download::<u8>().unwrap(),
        vec![255, 0, 1, 127]
    );
    let b = d
        .upload_host(&HostTensor::from_bools(&[true, false, true], &[3]).unwrap())
        .unwrap();
    assert_eq!(
        run(&b, DType::F32).download::<f32>().unwrap(),
        vec![1.0, 0.0, 1.0]
    );
    assert_eq!(
        run(&b, DType::I64).download::<i64>().unwrap(),
        vec![1, 0, 1]
    );
    // f32 -> f16: round to nearest even, overflow to infinity.
    let h = d
        .upload(&[1.001_709f32, 2049.0, 65520.0, -1e6], &[4])
        .unwrap();
    assert_eq!(
        run(&h, DType::F16).download::<f16>().unwrap(),
        vec![
            f16::from_f32(1.001_953_1),
            f16::from_f32(2048.0),
            f16::INFINITY,
            f16::NEG_INFINITY
        ]
    );
}

#[test]
fn cast_truncate_attribute() {
    let d = dev();
    let vals: Vec<V> = special_f32().into_iter().map(V::F32).collect();
    let n = vals.len();
    let t = d.upload_host(&host(DType::F32, &vals, &[n])).unwrap();
    for dst in ALL {
        let attrs = cast_attrs(DType::F32, dst).with("Truncate", AttrValue::Bool(true));
        let out = d.run("Cast", &attrs, &[Arg::from(&t)]).unwrap();
        assert_cast_eq(&out[0], DType::F32, dst, &vals, true);
    }
    // 1 + 2^-10 + 2^-11 + 2^-12 rounds up to 1 + 2^-9 but truncates to 1 + 2^-10.
    let x = d.upload(&[1.001_709f32, -1.001_709], &[2]).unwrap();
    let attrs = cast_attrs(DType::F32, DType::F16).with("Truncate", AttrValue::Bool(true));
    let out = d.run("Cast", &attrs, &[Arg::from(&x)]).unwrap();
    assert_eq!(
        out[0].download::<f16>().unwrap(),
        vec![f16::from_f32(1.000_976_6), f16::from_f32(-1.000_976_6)]
    );
}

#[test]
fn cast_errors() {
    let d = dev();
    let x = d.upload(&[1.0f32, 2.0], &[2]).unwrap();
    // The input's dtype must be SrcT.
    let e = d
        .run(
            "Cast",
            &cast_attrs(DType::I32, DType::F32),
            &[Arg::from(&x)],
        )
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("Cast") && msg.contains("float32") && msg.contains("int32"),
        "{msg}"
    );
    // DstT is required.
    let attrs = Attrs::new().with("SrcT", AttrValue::Type(DType::F32));
    let e = d.run("Cast", &attrs, &[Arg::from(&x)]).err().unwrap();
    assert!(e.to_string().contains("DstT"), "{e}");
    // DstT must be a type.
    let attrs = attrs.with("DstT", AttrValue::Int(3));
    assert!(d.run("Cast", &attrs, &[Arg::from(&x)]).is_err());
    // Without SrcT the input's dtype is the source.
    let attrs = Attrs::new().with("DstT", AttrValue::Type(DType::I32));
    let out = d.run("Cast", &attrs, &[Arg::from(&x)]).unwrap();
    assert_eq!(out[0].download::<i32>().unwrap(), vec![1, 2]);
    // One input only.
    let e = d
        .run(
            "Cast",
            &cast_attrs(DType::F32, DType::I32),
            &[Arg::from(&x), Arg::from(&x)],
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("Cast"), "{e}");
}
