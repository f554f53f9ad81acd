//! Snapshots of small kernel outputs (`ExecConfig::snapshot_bytes`, `TFWGPU_READ_SNAPSHOT_BYTES`):
//! a read of such an output is answered from the copy recorded right behind its kernel, and
//! only while nothing has written its range since.

use std::time::Duration;

use tfwgpu_runtime::{Arg, Attrs, DeviceRef, ExecConfig, Operand, Runtime, RuntimeOptions};

/// Batches are submitted only when a host wait needs them (so a read finds its snapshot's
/// batch still open), snapshots of outputs up to `bytes`, the host mirror off (it would
/// answer reads of host-written bytes before the snapshots are looked at).
fn runtime(bytes: u64) -> Runtime {
    let mut o = RuntimeOptions::from_env().unwrap();
    o.exec = ExecConfig {
        max_ops: 1_000_000,
        max_age: Duration::from_secs(3600),
        idle_ops: 0,
        idle_age: None,
        snapshot_bytes: bytes,
        ..o.exec
    };
    o.host_mirror_bytes = 0;
    Runtime::with_options(o).unwrap()
}

/// Records `n` more kernels on an unrelated tensor (work behind the snapshot).
fn more_work(d: &tfwgpu_runtime::Device, n: usize) -> tfwgpu_runtime::Tensor {
    let mut t = d.upload(&vec![0.5f32; 4096], &[4096]).unwrap();
    for _ in 0..n {
        t = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&t), Arg::from(&t)])
            .unwrap()
            .remove(0);
    }
    t
}

#[test]
fn small_outputs_are_read_from_their_snapshot_and_large_ones_are_not() {
    let rt = runtime(16);
    let d = rt.device();
    let a = d.upload(&[2.5f32], &[]).unwrap();
    let b = d.upload(&[4.0f32], &[]).unwrap();
    let c = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&a), Arg::from(&b)])
        .unwrap()
        .remove(0);
    let v4 = d.upload(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let w4 = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&v4), Arg::from(&v4)])
        .unwrap()
        .remove(0);
    let v5 = d.upload(&[1.0f32; 5], &[5]).unwrap();
    let w5 = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&v5), Arg::from(&v5)])
        .unwrap()
        .remove(0);
    let tail = more_work(d, 6);
    let s0 = d.exec_stats();
    assert_eq!(c.download::<f32>().unwrap(), vec![6.5]);
    assert_eq!(w4.download::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    let s1 = d.exec_stats();
    assert_eq!(
        s1.snapshot_reads - s0.snapshot_reads,
        2,
        "two outputs of <= 16 bytes"
    );
    assert_eq!(s1.reads, s0.reads, "no read copied from the device");
    assert_eq!(w5.download::<f32>().unwrap(), vec![2.0; 5], "20 bytes");
    assert_eq!(tail.download::<f32>().unwrap(), vec![32.0; 4096]);
    let s2 = d.exec_stats();
    assert_eq!(
        s2.snapshot_reads, s1.snapshot_reads,
        "outputs over 16 bytes: read back"
    );
    assert_eq!(s2.reads - s1.reads, 2);
    // Read again, long after: the same bytes.
    assert_eq!(c.download::<f32>().unwrap(), vec![6.5]);
}

#[test]
fn a_write_after_the_kernel_replaces_its_snapshot() {
    let rt = runtime(16);
    let d = rt.device();
    let one = d.upload(&[1.0f32], &[]).unwrap();
    let scalar = || {
        d.run("AddV2", &Attrs::new(), &[Arg::from(&one), Arg::from(&one)])
            .unwrap()
            .remove(0)
    };
    // A host write.
    let c = scalar();
    d.write(c.addr(), &7.0f32.to_le_bytes()).unwrap();
    more_work(d, 2);
    assert_eq!(c.download::<f32>().unwrap(), vec![7.0], "host write");
    // A device-to-device copy.
    let c = scalar();
    let src = d.upload(&[-3.0f32], &[]).unwrap();
    d.copy(src.addr(), c.addr(), 4).unwrap();
    more_work(d, 2);
    assert_eq!(c.download::<f32>().unwrap(), vec![-3.0], "copy");
    // A fill.
    let c = scalar();
    d.fill_u32(c.addr(), 4, 5.0f32.to_bits()).unwrap();
    more_work(d, 2);
    assert_eq!(c.download::<f32>().unwrap(), vec![5.0], "fill");
    // Another kernel writing the same address (its output placed there).
    let c = scalar();
    let k = d.kernel("AddV2", &Attrs::new()).unwrap();
    let ten = d.upload(&[10.0f32], &[]).unwrap();
    let out = DeviceRef {
        desc: c.desc().clone(),
        addr: c.addr(),
    };
    d.record(
        k.as_ref(),
        &[
            Operand::Device(ten.device_ref()),
            Operand::Device(one.device_ref()),
        ],
        &[out],
    )
    .unwrap();
    more_work(d, 2);
    assert_eq!(c.download::<f32>().unwrap(), vec![11.0], "kernel output");
    // And the latest kernel's own snapshot answered that last read.
    let s = d.exec_stats();
    let c = scalar();
    assert_eq!(c.download::<f32>().unwrap(), vec![2.0]);
    assert_eq!(d.exec_stats().snapshot_reads - s.snapshot_reads, 1);
}

#[test]
fn off_by_default() {
    let rt = runtime(0);
    let d = rt.device();
    let a = d.upload(&[2.0f32], &[]).unwrap();
    let c = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&a), Arg::from(&a)])
        .unwrap()
        .remove(0);
    let s = d.exec_stats();
    assert_eq!(c.download::<f32>().unwrap(), vec![4.0]);
    assert_eq!(d.exec_stats().snapshot_reads, s.snapshot_reads);
    assert_eq!(ExecConfig::default().snapshot_bytes, 0);
}

/// Many snapshots in a row, read at once or later, some overwritten: their readback buffers are
/// reused (a pool) and every read gives the latest bytes.
#[test]
fn many_snapshots_reuse_their_buffers_and_stay_right() {
    let rt = runtime(16);
    let d = rt.device();
    let one = d.upload(&[1.0f32], &[]).unwrap();
    let mut kept = vec![];
    for i in 0..300 {
        let x = d.upload(&[i as f32], &[]).unwrap();
        let c = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&x), Arg::from(&one)])
            .unwrap()
            .remove(0);
        match i % 3 {
            0 => assert_eq!(c.download::<f32>().unwrap(), vec![i as f32 + 1.0]),
            1 => kept.push((i, c)),
            _ => {
                d.fill_u32(c.addr(), 4, (-(i as f32)).to_bits()).unwrap();
                assert_eq!(c.download::<f32>().unwrap(), vec![-(i as f32)]);
            }
        }
    }
    for (i, c) in &kept {
        assert_eq!(c.download::<f32>().unwrap(), vec![*i as f32 + 1.0], "{i}");
    }
    // At least every read right after its kernel (100); the kept ones only while their entry
    // is among the 16 newest.
    let n = d.exec_stats().snapshot_reads;
    assert!((100..200).contains(&n), "{n} reads answered by snapshots");
}
