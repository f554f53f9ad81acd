mod common;
use common::*;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, HostTensor, f16};

#[test]
fn fill_every_dtype_and_awkward_sizes() {
    let d = dev();
    for n in [0usize, 1, 3, 7, 129, 1000] {
        let dims = HostTensor::new(&[n as i64], &[1]).unwrap();
        let v = d.upload(&[2.5f32], &[]).unwrap();
        let out = d
            .run("Fill", &Attrs::new(), &[Arg::from(&dims), Arg::from(&v)])
            .unwrap();
        assert_eq!(out[0].download::<f32>().unwrap(), vec![2.5; n]);
        let v = d.upload(&[-7i64 << 40], &[]).unwrap();
        let out = d
            .run("Fill", &Attrs::new(), &[Arg::from(&dims), Arg::from(&v)])
            .unwrap();
        assert_eq!(out[0].download::<i64>().unwrap(), vec![-7i64 << 40; n]);
        let v = d.upload(&[f16::from_f32(1.5)], &[]).unwrap();
        let out = d
            .run("Fill", &Attrs::new(), &[Arg::from(&dims), Arg::from(&v)])
            .unwrap();
        assert_eq!(
            out[0].download::<f16>().unwrap(),
            vec![f16::from_f32(1.5); n]
        );
        let v = d.upload(&[200u8], &[]).unwrap();
        let out = d
            .run("Fill", &Attrs::new(), &[Arg::from(&dims), Arg::from(&v)])
            .unwrap();
        assert_eq!(out[0].download::<u8>().unwrap(), vec![200u8; n]);
    }
}

#[test]
fn fill_shape_and_errors() {
    let d = dev();
    let dims = HostTensor::new(&[2i32, 3], &[2]).unwrap();
    let v = d.upload(&[4i32], &[]).unwrap();
    let out = d
        .run("Fill", &Attrs::new(), &[Arg::from(&dims), Arg::from(&v)])
        .unwrap();
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[0].download::<i32>().unwrap(), vec![4; 6]);
    let bad = HostTensor::new(&[-1i32], &[1]).unwrap();
    let e = d
        .run("Fill", &Attrs::new(), &[Arg::from(&bad), Arg::from(&v)])
        .err()
        .unwrap();
    assert!(e.to_string().contains("non-negative"), "{e}");
    let vec_value = d.upload(&[1i32, 2], &[2]).unwrap();
    assert!(
        d.run(
            "Fill",
            &Attrs::new(),
            &[Arg::from(&dims), Arg::from(&vec_value)]
        )
        .is_err()
    );
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::F32));
    assert!(d.kernel("Fill", &attrs).is_ok());
}

#[test]
fn zeros_and_ones_like() {
    let d = dev();
    let x = d.upload(&[5.0f32; 13], &[13]).unwrap();
    let z = d.run("ZerosLike", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    assert_eq!(z[0].download::<f32>().unwrap(), vec![0.0; 13]);
    let o = d.run("OnesLike", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    assert_eq!(o[0].download::<f32>().unwrap(), vec![1.0; 13]);
    let b = d
        .upload_host(&HostTensor::from_bools(&[false; 5], &[5]).unwrap())
        .unwrap();
    let o = d.run("OnesLike", &Attrs::new(), &[Arg::from(&b)]).unwrap();
    assert_eq!(o[0].download::<u8>().unwrap(), vec![1u8; 5]);
}

#[test]
fn memset_unaligned_ranges_are_exact() {
    let d = dev();
    let addr = d.allocate(64).unwrap();
    d.write(addr, &[0xAAu8; 64]).unwrap();
    // Byte fill of [3, 3 + 6): the bytes around it stay.
    d.fill_u32(addr + 3, 6, 0x1111_1111).unwrap();
    let got = d.read(addr, 64).unwrap();
    let mut want = vec![0xAAu8; 64];
    want[3..9].fill(0x11);
    assert_eq!(got, want);
    // 32-bit pattern fill of an aligned range.
    d.fill_u32(addr + 8, 16, 0xDEAD_BEEF).unwrap();
    let got = d.read(addr + 8, 16).unwrap();
    assert_eq!(got, 0xDEAD_BEEFu32.to_le_bytes().repeat(4));
    // Zero fill.
    d.fill_u32(addr, 64, 0).unwrap();
    assert_eq!(d.read(addr, 64).unwrap(), vec![0u8; 64]);
    d.deallocate(addr).unwrap();
}
