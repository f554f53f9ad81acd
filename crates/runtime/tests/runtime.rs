//! Allocator, execution context, pipeline cache and adapter selection.
mod common;
use common::*;

use std::time::Duration;

use tfwgpu_runtime::{
    AdapterDescription, Arg, Attrs, DType, Device, DeviceRef, Error, ExecConfig, IdleRule, Operand,
    Runtime, RuntimeOptions, Selection, TensorDesc,
};

fn runtime_with(f: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    let mut opts = RuntimeOptions::from_env().unwrap();
    f(&mut opts);
    Runtime::with_options(opts).unwrap()
}

#[test]
fn addresses_resolve_after_offset_arithmetic() {
    let d = dev();
    let addr = d.allocate(1000).unwrap();
    assert_eq!(addr % 256, 0, "addresses are 256-byte aligned");
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    d.write(addr, &data).unwrap();
    // Reads and writes through interior addresses, as TensorFlow's BFC allocator makes them.
    assert_eq!(d.read(addr + 500, 300).unwrap(), data[500..800]);
    d.write(addr + 256, &[9u8; 8]).unwrap();
    let back = d.read(addr, 1000).unwrap();
    assert_eq!(back[256..264], [9u8; 8]);
    assert_eq!(back[..256], data[..256]);
    assert_eq!(back[264..], data[264..]);
    // Odd sizes keep the bytes after them.
    d.write(addr + 4, &[1u8, 2, 3]).unwrap();
    let back = d.read(addr, 8).unwrap();
    assert_eq!(back, [data[0], data[1], data[2], data[3], 1, 2, 3, data[7]]);
    // Device-to-device copy between interior addresses.
    let other = d.allocate(512).unwrap();
    d.copy(addr + 512, other + 4, 100).unwrap();
    assert_eq!(d.read(other + 4, 100).unwrap(), data[512..612]);
    // Out of range and unknown addresses are errors, not crashes.
    assert!(d.read(addr + 900, 200).is_err());
    assert!(d.read(0x1234, 4).is_err());
    assert!(
        d.deallocate(addr + 8).is_err(),
        "only the start of an allocation can be freed"
    );
    d.deallocate(addr).unwrap();
    d.deallocate(other).unwrap();
    assert!(
        d.read(addr, 4).is_err(),
        "a freed allocation does not resolve"
    );
    assert!(d.deallocate(addr).is_err(), "double free is reported");
}

#[test]
fn freed_memory_is_not_reused_before_the_gpu_is_done() {
    // Batches are never submitted by time or count here: only a host wait submits them, so
    // the GPU cannot have completed the work when the allocator is asked again.
    let rt = runtime_with(|o| {
        o.exec = ExecConfig {
            max_ops: 1_000_000,
            max_age: Duration::from_secs(3600),
            idle_ops: 0,
            ..ExecConfig::default()
        }
    });
    let d = rt.device();
    let a = d.upload(&[1.0f32; 64], &[64]).unwrap();
    let z = d.run("ZerosLike", &Attrs::new(), &[Arg::from(&a)]).unwrap();
    let z_addr = z[0].addr();
    let tag = d.exec().tag();
    assert!(d.exec().completed() < tag);
    drop(z);
    assert_eq!(d.memory_stats().bytes_pending, 256);
    let b = d.allocate(256).unwrap();
    assert_ne!(
        b, z_addr,
        "a range still used by unsubmitted GPU work was handed out again"
    );
    d.synchronize().unwrap();
    assert!(d.exec().completed() >= tag);
    let c = d.allocate(256).unwrap();
    assert_eq!(c, z_addr, "after completion the range is reused (best fit)");
    assert_eq!(d.memory_stats().bytes_pending, 0);
    d.deallocate(b).unwrap();
    d.deallocate(c).unwrap();
}

#[test]
fn memory_stays_flat_over_10000_cycles() {
    let rt = runtime_with(|_| {});
    let d = rt.device();
    let warm = d.upload(&[0.5f32; 100], &[100]).unwrap();
    let _ = d
        .run("OnesLike", &Attrs::new(), &[Arg::from(&warm)])
        .unwrap();
    d.synchronize().unwrap();
    let before = d.memory_stats();
    for i in 0..10_000u32 {
        let n = 1 + (i as usize % 300);
        let t = d.upload(&vec![i as f32; n], &[n]).unwrap();
        let o = d.run("OnesLike", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        if i % 1000 == 999 {
            assert_eq!(o[0].download::<f32>().unwrap(), vec![1.0; n]);
        }
    }
    d.synchronize().unwrap();
    d.allocator().trim(d.exec().completed());
    let after = d.memory_stats();
    assert_eq!(after.bytes_in_use, before.bytes_in_use);
    assert_eq!(after.num_allocs, before.num_allocs);
    assert!(
        after.bytes_reserved <= before.bytes_reserved,
        "{before:?} -> {after:?}"
    );
    assert!(after.heaps <= before.heaps.max(1));
    let s = d.exec_stats();
    assert!(s.submits < 10_000, "work was batched: {s:?}");
}

#[test]
fn many_threads_get_the_results_of_one() {
    let d = dev();
    let run = |seed: u64| -> Vec<Vec<u8>> {
        let mut out = vec![];
        for k in 0..30u64 {
            let n = 1 + ((seed * 31 + k * 17) % 500) as usize;
            let addr = d.allocate(n as u64 * 4).unwrap();
            let pattern = (seed as u32) << 16 | k as u32;
            d.fill_u32(addr, n as u64 * 4, pattern).unwrap();
            let x = d.upload(&vec![seed as i32; n], &[n]).unwrap();
            let y = d.run("ZerosLike", &Attrs::new(), &[Arg::from(&x)]).unwrap();
            let mut bytes = d.read(addr, n * 4).unwrap();
            bytes.extend(y[0].download_host().unwrap().bytes);
            bytes.extend(x.download_host().unwrap().bytes);
            d.deallocate(addr).unwrap();
            out.push(bytes);
        }
        out
    };
    let alone: Vec<_> = (0..16u64).map(run).collect();
    let together: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16u64).map(|seed| s.spawn(move || run(seed))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
}

#[test]
fn pipeline_cache_hits_and_lru_bound() {
    let rt = runtime_with(|o| o.kernel_cache_size = 2);
    let d = rt.device();
    let x = d.upload(&[1.0f32, 2.0], &[2]).unwrap();
    let s0 = d.cache_stats();
    let _ = d.run("ZerosLike", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    let s1 = d.cache_stats();
    assert_eq!(s1.misses, s0.misses + 1);
    let _ = d.run("OnesLike", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    let s2 = d.cache_stats();
    assert_eq!(s2.hits, s1.hits + 1, "the same kernel again is a cache hit");
    assert_eq!(s2.misses, s1.misses);
    // Distinct pipelines beyond the capacity evict the least recently used one.
    for op in ["AddV2", "Mul", "Sub", "Maximum"] {
        if let Ok(out) = d.run(op, &Attrs::new(), &[Arg::from(&x), Arg::from(&x)]) {
            drop(out);
        }
    }
    let s3 = d.cache_stats();
    assert!(s3.entries <= 2, "{s3:?}");
    if s3.misses > s2.misses + 1 {
        assert!(s3.evictions >= 1, "{s3:?}");
    }
    assert_eq!(s3.capacity, 2);
}

#[test]
fn out_of_memory_is_an_error() {
    let rt = runtime_with(|o| o.memory_limit = Some(1 << 20));
    let d = rt.device();
    let too_big = d.allocator().max_allocation() + 1;
    match d.allocate(too_big) {
        Err(Error::OutOfMemory(msg)) => assert!(msg.contains("bind"), "{msg}"),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    match d.allocate(2 << 20) {
        Err(Error::OutOfMemory(msg)) => assert!(msg.contains("limit"), "{msg}"),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Within the limit it works, and the memory comes back when freed.
    let a = d.allocate(512 << 10).unwrap();
    d.deallocate(a).unwrap();
    let b = d.allocate(900 << 10).unwrap();
    d.deallocate(b).unwrap();
}

#[test]
fn unknown_op_and_bad_arguments_are_errors() {
    let d = dev();
    let x = d.upload(&[1.0f32], &[1]).unwrap();
    match d.run("NoSuchOp", &Attrs::new(), &[Arg::from(&x)]) {
        Err(Error::Unimplemented(m)) => assert!(m.contains("NoSuchOp")),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(d.upload(&[1.0f32, 2.0], &[3]).is_err());
}

fn fake(index: usize, name: &str, kind: &str, backend: &str) -> AdapterDescription {
    AdapterDescription {
        index,
        name: name.into(),
        backend: backend.into(),
        driver: String::new(),
        driver_info: String::new(),
        device_type: kind.into(),
        vendor: index as u32,
        device: 0,
        subgroup_min_size: 0,
        subgroup_max_size: 0,
        limits: Default::default(),
        features: Default::default(),
        device_memory: None,
        cooperative_matrix: vec![],
    }
}

#[test]
fn adapter_selection_rules() {
    let adapters = vec![
        fake(0, "llvmpipe", "cpu", "Vulkan"),
        fake(1, "Intel UHD", "integrated", "Vulkan"),
        fake(2, "NVIDIA H200", "discrete", "Vulkan"),
        fake(3, "NVIDIA H200", "discrete", "Gl"),
    ];
    let none = Selection::default();
    // Best first; software adapters dropped when hardware exists; GL duplicate dropped.
    let mut fakes = adapters.clone();
    fakes[3].vendor = 2;
    assert_eq!(none.choose(&fakes).unwrap(), vec![2, 1]);
    // Two identical GPUs on one backend are two devices; their GL twin is dropped.
    let mut two = vec![
        fake(0, "NVIDIA H200", "discrete", "Vulkan"),
        fake(1, "NVIDIA H200", "discrete", "Vulkan"),
        fake(2, "NVIDIA H200", "discrete", "Gl"),
    ];
    for a in &mut two {
        a.vendor = 0x10de;
    }
    assert_eq!(none.choose(&two).unwrap(), vec![0, 1]);
    let only_cpu = vec![fake(0, "llvmpipe", "cpu", "Vulkan")];
    assert_eq!(none.choose(&only_cpu).unwrap(), vec![0]);
    let by_name = Selection {
        visible: None,
        name: Some("llvm".into()),
    };
    assert_eq!(by_name.choose(&adapters).unwrap(), vec![0]);
    let by_index = Selection {
        visible: Some(vec![1, 0]),
        name: None,
    };
    assert_eq!(by_index.choose(&adapters).unwrap(), vec![1, 0]);
    let bad = Selection {
        visible: Some(vec![9]),
        name: None,
    };
    assert!(matches!(bad.choose(&adapters), Err(Error::NoAdapter(_))));
    let nomatch = Selection {
        visible: None,
        name: Some("radeon".into()),
    };
    let e = nomatch.choose(&adapters).unwrap_err().to_string();
    assert!(e.contains("radeon") && e.contains("H200"), "{e}");
    let e = none.choose(&[]).unwrap_err().to_string();
    assert!(e.contains("mesa-vulkan-drivers"), "{e}");
}

#[test]
fn device_reports_adapter_limits_and_features() {
    let d = dev();
    let desc = d.description();
    assert!(!desc.name.is_empty());
    assert!(!desc.backend.is_empty());
    // The device was opened with the adapter's own limits, not wgpu's defaults.
    assert_eq!(
        d.limits().max_storage_buffer_binding_size,
        desc.limits.max_storage_buffer_binding_size
    );
    for f in desc.useful_features() {
        assert!(!f.is_empty());
    }
}

#[test]
fn one_adapter_opened_as_two_devices_keeps_addresses_apart() {
    // TFWGPU_VISIBLE_DEVICES=0,0 opens the same adapter twice: two devices with their own
    // queues and memory, which is how the multi-device path is tested on one adapter.
    let first = dev().description().index;
    let rt = runtime_with(|o| {
        o.selection = Selection {
            visible: Some(vec![first, first]),
            name: None,
        }
    });
    assert_eq!(rt.devices.len(), 2);
    let (a, b) = (&rt.devices[0], &rt.devices[1]);
    let pa = a.allocate(1024).unwrap();
    let pb = b.allocate(1024).unwrap();
    assert_ne!(pa, pb);
    assert_eq!(tfwgpu_runtime::device_of_address(pa), Some(0));
    assert_eq!(tfwgpu_runtime::device_of_address(pb), Some(1));
    assert_eq!(tfwgpu_runtime::device_of_address(0), None);
    assert_eq!(tfwgpu_runtime::device_of_address(12345), None);
    a.write(pa, &[7u8; 1024]).unwrap();
    b.write(pb, &[9u8; 1024]).unwrap();
    // Each device reads its own memory; the other's address is an error, not a wrong buffer.
    assert_eq!(a.read(pa, 1024).unwrap(), vec![7u8; 1024]);
    assert_eq!(b.read(pb, 1024).unwrap(), vec![9u8; 1024]);
    let e = a.read(pb, 16).unwrap_err().to_string();
    assert!(e.contains("belongs to device 1"), "{e}");
    assert!(b.copy(pa, pb, 16).is_err());
    // Work on both devices at once.
    let x = a.upload(&[1f32, 2.0, 3.0], &[3]).unwrap();
    let y = b.upload(&[10f32, 20.0, 30.0], &[3]).unwrap();
    let sa = a
        .run("AddV2", &Attrs::new(), &[Arg::from(&x), Arg::from(&x)])
        .unwrap();
    let sb = b
        .run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&y)])
        .unwrap();
    assert_eq!(sa[0].download::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    assert_eq!(sb[0].download::<f32>().unwrap(), vec![20.0, 40.0, 60.0]);
    a.deallocate(pa).unwrap();
    b.deallocate(pb).unwrap();
}

#[test]
fn gpu_timings_bracket_every_command() {
    // Big batches, so that one batch needs more timestamp queries than a query set holds.
    let rt = runtime_with(|o| o.exec.max_ops = 1000);
    let d = rt.device();
    let ex = d.exec();
    if let Err(e) = ex.set_timing(true) {
        println!("skipped: {e}");
        return;
    }
    let x = d.upload(&vec![1.5f32; 4096], &[4096]).unwrap();
    let _ = ex.take_timings().unwrap(); // the upload's copy
    let before = d.exec_stats().dispatches;
    let mut y = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&x), Arg::from(&x)])
        .unwrap()
        .remove(0);
    for _ in 0..299 {
        y = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&x)])
            .unwrap()
            .remove(0);
    }
    assert_eq!(y.download::<f32>().unwrap()[4095], 1.5 * 301.0);
    let t = ex.take_timings().unwrap();
    let dispatches = (d.exec_stats().dispatches - before) as usize;
    let timed = t
        .iter()
        .filter(|t| t.label.starts_with("elementwise"))
        .count();
    assert_eq!(
        timed,
        dispatches,
        "every dispatch is timed: {:?}",
        &t[..3.min(t.len())]
    );
    assert!(dispatches >= 300);
    // 300 dispatches + the readback copy need more than one query set: several batches.
    assert!(
        t.iter()
            .map(|t| t.batch)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            >= 2
    );
    for w in t.windows(2) {
        assert!(w[0].end_ns >= w[0].start_ns);
        // One queue: commands run in order (a dispatch may overlap the next only on the GPU's
        // own pipelining, never start before the previous one started).
        assert!(w[1].start_ns >= w[0].start_ns, "{w:?}");
    }
    let s = tfwgpu_runtime::TimingSummary::of(&t);
    assert_eq!(s.commands, t.len());
    assert!(s.busy_ns > 0.0 && s.busy_ns <= s.span_ns + 1.0 && s.busy_ns <= s.sum_ns + 1.0);
    // Off: nothing more is timed.
    ex.set_timing(false).unwrap();
    d.run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&x)])
        .unwrap();
    assert!(ex.take_timings().unwrap().is_empty());
}

#[test]
fn gpu_timings_per_pass_bracket_each_compute_pass() {
    let rt = runtime_with(|o| o.exec.max_ops = 1000);
    let d = rt.device();
    let ex = d.exec();
    if let Err(e) = ex.set_timing(true) {
        println!("skipped: {e}");
        return;
    }
    ex.set_timing_per_pass(true);
    let x = d.upload(&vec![2.0f32; 1024], &[1024]).unwrap();
    let _ = ex.take_timings().unwrap();
    let passes_before = d.exec_stats().submits;
    // Two runs of dispatches separated by a copy: two compute passes in one batch.
    let mut y = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&x), Arg::from(&x)])
        .unwrap()
        .remove(0);
    for _ in 0..19 {
        y = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&x)])
            .unwrap()
            .remove(0);
    }
    let z = d
        .run("Identity", &Attrs::new(), &[Arg::from(&y)])
        .unwrap()
        .remove(0);
    for _ in 0..20 {
        y = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&z)])
            .unwrap()
            .remove(0);
    }
    assert_eq!(y.download::<f32>().unwrap()[1023], 42.0 + 20.0 * 42.0);
    let t = ex.take_timings().unwrap();
    let passes: Vec<_> = t
        .iter()
        .filter(|t| &*t.label == tfwgpu_runtime::PASS_LABEL)
        .collect();
    // No dispatch is timed on its own; every pass is, and there are at most as many passes as
    // runs of dispatches between commands outside a pass (here: a copy or none at all).
    assert!(
        t.iter().all(|t| &*t.label == tfwgpu_runtime::PASS_LABEL
            || &*t.label == "copy"
            || &*t.label == "clear"),
        "{t:?}"
    );
    // Per batch: one pass, plus one more after each copy that split it.
    assert!(passes.len() >= 2, "{t:?}");
    for b in t
        .iter()
        .map(|t| t.batch)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let n = |l: &str| t.iter().filter(|t| t.batch == b && &*t.label == l).count();
        assert!(
            n(tfwgpu_runtime::PASS_LABEL) <= 1 + n("copy"),
            "batch {b}: {t:?}"
        );
    }
    for p in &passes {
        assert!(p.end_ns >= p.start_ns, "{p:?}");
    }
    assert!(d.exec_stats().submits > passes_before);
    ex.set_timing(false).unwrap();
    ex.set_timing_per_pass(false);
}

/// Batching that never submits by count or age: only host waits, large uploads and (when
/// `idle_ops > 0`) an idle GPU submit.
fn manual_batching(idle_ops: usize) -> Runtime {
    runtime_with(|o| {
        o.exec = ExecConfig {
            max_ops: 1_000_000,
            max_age: Duration::from_secs(3600),
            idle_ops,
            idle_inflight: 1,
            idle_age: None,
            ..ExecConfig::default()
        }
    })
}

/// Batching by the idle rule alone: no count, no age, no size rule (idle_ops 0).
fn idle_batching(age: Duration, rule: IdleRule) -> Runtime {
    runtime_with(|o| {
        o.exec = ExecConfig {
            max_ops: 1_000_000,
            max_age: Duration::from_secs(3600),
            idle_ops: 0,
            idle_inflight: 1,
            idle_age: Some(age),
            idle_rule: rule,
            ..ExecConfig::default()
        }
    })
}

/// Calls `each` every `step` until `d` has submitted more than `submits` batches; fails after
/// 20 s with `what`.
fn until_submitted(d: &Device, submits: u64, step: Duration, what: &str, mut each: impl FnMut()) {
    let t0 = std::time::Instant::now();
    while d.exec_stats().submits == submits {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(step);
        each();
    }
}

#[test]
fn an_idle_gpu_gets_an_old_batch_of_any_size_with_an_idle_age() {
    // TFWGPU_BATCH_IDLE_US: one command, no size rule (idle_ops 0), a 300 ms age while idle
    // (long enough that a loaded machine records the command well within it).
    let rt = idle_batching(Duration::from_millis(300), IdleRule::Age);
    let d = rt.device();
    let x = d.upload(&[2.0f32; 16], &[16]).unwrap();
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let y = d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    assert_eq!(
        d.exec_stats().submits,
        submits,
        "younger than the age: held"
    );
    let t0 = std::time::Instant::now();
    until_submitted(
        d,
        submits,
        Duration::from_millis(1),
        "the batch was never submitted",
        || {},
    );
    assert!(t0.elapsed() >= Duration::from_millis(100));
    assert_eq!(y[0].download::<f32>().unwrap(), vec![-2.0; 16]);
    // Without the age, the same command waits for a host sync.
    let rt = manual_batching(0);
    let d = rt.device();
    let x = d.upload(&[2.0f32; 16], &[16]).unwrap();
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let _y = d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(d.exec_stats().submits, submits);
}

#[test]
fn the_quiet_rule_leaves_a_batch_whole_while_the_host_records_and_sends_it_once_quiet() {
    // TFWGPU_BATCH_IDLE_RULE=quiet: the idle age counts from the latest command. Commands come
    // every 20 ms for 1.6 s against an age of 1 s: the age rule would submit the batch during
    // the stream, the quiet rule holds it until the host has been quiet for the age.
    let age = Duration::from_millis(1000);
    let rt = idle_batching(age, IdleRule::Quiet);
    let d = rt.device();
    assert_eq!(d.exec().idle(), (Some(age), IdleRule::Quiet));
    let x = d.upload(&[2.0f32; 16], &[16]).unwrap();
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let t0 = std::time::Instant::now();
    let mut y = d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
    while t0.elapsed() < age + Duration::from_millis(600) {
        std::thread::sleep(Duration::from_millis(20));
        y = d.run("Neg", &Attrs::new(), &[Arg::from(&y[0])]).unwrap();
    }
    let split = d.exec_stats().submits - submits;
    let last = std::time::Instant::now();
    assert_eq!(
        split, 0,
        "a batch older than the age was split while recording"
    );
    until_submitted(
        d,
        submits,
        Duration::from_millis(1),
        "the quiet batch was never submitted",
        || {},
    );
    assert!(
        last.elapsed() >= age / 2,
        "sent before the host was quiet for the age"
    );
    let n = y[0].download::<f32>().unwrap();
    assert!(n.iter().all(|&v| v == n[0] && v.abs() == 2.0), "{n:?}");

    // Switched to the age rule in the same context: the same stream is split while recording.
    d.exec()
        .set_idle(Some(Duration::from_millis(200)), IdleRule::Age);
    assert_eq!(
        d.exec().idle(),
        (Some(Duration::from_millis(200)), IdleRule::Age)
    );
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    until_submitted(
        d,
        submits,
        Duration::from_millis(20),
        "the age rule never split the stream",
        || y = d.run("Neg", &Attrs::new(), &[Arg::from(&y[0])]).unwrap(),
    );
    // And off: nothing but a host sync sends the batch.
    d.exec().set_idle(None, IdleRule::Quiet);
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let _z = d.run("Neg", &Attrs::new(), &[Arg::from(&y[0])]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.exec_stats().submits, submits);
}

#[test]
fn a_runtime_of_several_devices_takes_the_multi_device_idle_age() {
    // One device: `idle_age` (off by default since session 18); two devices of the same
    // adapter: `idle_age_multi` (the two-GPU rule of session 6).
    let index = dev().description().index;
    let exec = ExecConfig {
        idle_age: None,
        idle_age_multi: Some(Duration::from_micros(70)),
        ..ExecConfig::default()
    };
    let open = |visible: Vec<usize>| {
        runtime_with(|o| {
            o.selection = Selection {
                visible: Some(visible),
                name: None,
            };
            o.exec = exec.clone();
        })
    };
    let one = open(vec![index]);
    assert_eq!(one.devices.len(), 1);
    assert_eq!(one.device().exec().idle(), (None, IdleRule::Age));
    let two = open(vec![index, index]);
    assert_eq!(two.devices.len(), 2);
    for d in &two.devices {
        assert_eq!(
            d.exec().idle(),
            (Some(Duration::from_micros(70)), IdleRule::Age)
        );
    }
    assert_eq!(ExecConfig::default().idle_age, None);
    assert_eq!(
        ExecConfig::default().idle_age_multi,
        Some(Duration::from_micros(50))
    );
}

#[test]
fn large_uploads_keep_their_place_in_the_order_of_work() {
    // Uploads of 64 KiB and more go through the queue's own staging, which runs before the next
    // submitted batch: work recorded before the upload must still see the old bytes.
    let rt = manual_batching(0);
    let d = rt.device();
    let n = 1 << 18; // 1 MiB of f32
    let a = d.upload(&vec![1.0f32; n], &[n]).unwrap();
    let uploads = d.exec_stats().uploads;
    let submits = d.exec_stats().submits;
    let before = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
    assert_eq!(
        d.exec_stats().submits,
        submits,
        "Neg is recorded, not submitted"
    );
    let two: Vec<u8> = vec![2.0f32; n]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    d.write(a.addr(), &two).unwrap();
    assert_eq!(d.exec_stats().uploads, uploads + 1);
    assert_eq!(
        d.exec_stats().submits,
        submits + 1,
        "the batch holding Neg was submitted before the upload"
    );
    let after = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
    // A small upload into the same buffer, then a large one: each lands in order.
    d.write(a.addr(), &[0u8, 0, 64, 64]).unwrap(); // a[0] = 3.0
    let third = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
    let four: Vec<u8> = vec![4.0f32; n]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    d.write(a.addr(), &four).unwrap();
    let fourth = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
    let b = before[0].download::<f32>().unwrap();
    let c = after[0].download::<f32>().unwrap();
    let t = third[0].download::<f32>().unwrap();
    let f = fourth[0].download::<f32>().unwrap();
    assert!(
        b.iter().all(|&v| v == -1.0),
        "work before the upload saw its bytes"
    );
    assert!(
        c.iter().all(|&v| v == -2.0),
        "work after the upload saw the new bytes"
    );
    assert_eq!((t[0], t[1], t[n - 1]), (-3.0, -2.0, -2.0));
    assert!(f.iter().all(|&v| v == -4.0));
    assert_eq!(a.download::<f32>().unwrap(), vec![4.0; n]);
}

#[test]
fn large_uploads_from_many_threads_keep_their_place() {
    // A large upload takes its own place in the submit order and submits outside the batch
    // lock, while other threads record (and upload) into the next batch: each thread's work
    // before its upload sees the old bytes, its work after sees the new ones, with the submit
    // thread on and off.
    for submit_thread in [false, true] {
        let rt = runtime_with(|o| {
            o.exec = ExecConfig {
                submit_thread: Some(submit_thread),
                direct_unlocked: true,
                ..ExecConfig::default()
            }
        });
        let d = rt.device();
        std::thread::scope(|s| {
            for t in 0..4u32 {
                s.spawn(move || {
                    let n = (1 << 16) + 64 * t as usize; // >= 256 KiB: direct uploads
                    let a = d.upload(&vec![0.5f32; n], &[n]).unwrap();
                    for round in 1..=6u32 {
                        let v = (t * 100 + round) as f32;
                        let before = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
                        let bytes: Vec<u8> =
                            vec![v; n].iter().flat_map(|x| x.to_le_bytes()).collect();
                        d.write(a.addr(), &bytes).unwrap();
                        let after = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
                        let old = if round == 1 {
                            0.5
                        } else {
                            (t * 100 + round - 1) as f32
                        };
                        let b = before[0].download::<f32>().unwrap();
                        let c = after[0].download::<f32>().unwrap();
                        assert!(
                            b.iter().all(|&x| x == -old),
                            "thread {t} round {round}: before"
                        );
                        assert!(
                            c.iter().all(|&x| x == -v),
                            "thread {t} round {round}: after"
                        );
                    }
                });
            }
        });
        d.synchronize().unwrap();
    }
}

#[test]
fn back_to_back_large_uploads_keep_their_bytes_apart() {
    // Uploads of >= 64 KiB go through the queue's staging: back-to-back uploads of several
    // sizes (both sides of that threshold) while earlier ones are in flight, with work reading
    // each in between, in rounds.
    let rt = manual_batching(0);
    let d = rt.device();
    let sizes = [
        1usize << 18,
        (1 << 18) + 7,
        3 << 17,
        1 << 18,
        (1 << 19) + 1,
        5 << 16,
        (1 << 14) + 3,
        1 << 15,
        (1 << 14) - 1,
    ];
    for round in 0..3u32 {
        let mut tensors = vec![];
        for (k, &n) in sizes.iter().enumerate() {
            let data: Vec<f32> = (0..n)
                .map(|i| (i as u32 ^ (round << 20) ^ ((k as u32) << 24)) as f32)
                .collect();
            let t = d.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            d.write(t.addr(), &bytes).unwrap();
            // Work between uploads reads what came before.
            let neg = d.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
            tensors.push((t, neg, data));
        }
        for (k, (t, neg, data)) in tensors.iter().enumerate() {
            assert_eq!(
                &t.download::<f32>().unwrap(),
                data,
                "round {round}, upload {k}"
            );
            let want: Vec<f32> = data.iter().map(|v| -v).collect();
            assert_eq!(
                neg[0].download::<f32>().unwrap(),
                want,
                "round {round}, Neg {k}"
            );
        }
    }
}

#[test]
fn host_waits_that_poll_before_blocking_see_every_result() {
    // TFWGPU_SPIN_US: waits poll for completion first; results and their order are the same
    // whether the GPU finishes within the spin or after it.
    for spin in [Duration::from_micros(1), Duration::from_millis(20)] {
        let rt = runtime_with(|o| o.exec.spin = Some(spin));
        let d = rt.device();
        let mut x = d.upload(&[1.5f32; 4096], &[4096]).unwrap();
        for i in 0..20 {
            x = d
                .run("Neg", &Attrs::new(), &[Arg::from(&x)])
                .unwrap()
                .remove(0);
            let want = if i % 2 == 0 { -1.5 } else { 1.5 };
            assert_eq!(
                x.download::<f32>().unwrap(),
                vec![want; 4096],
                "spin {spin:?}, {i}"
            );
        }
        d.synchronize().unwrap();
    }
}

#[test]
fn an_idle_gpu_gets_the_open_batch_without_a_host_wait() {
    let rt = manual_batching(4);
    let d = rt.device();
    let x = d.upload(&[1.0f32; 64], &[64]).unwrap();
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let mut keep = vec![];
    for _ in 0..3 {
        keep.push(d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap());
    }
    assert_eq!(
        d.exec_stats().submits,
        submits,
        "3 commands stay on the host"
    );
    keep.push(d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap());
    assert_eq!(
        d.exec_stats().submits,
        submits + 1,
        "the 4th command goes out at once: the GPU had nothing to do"
    );
    // 4 more while that batch may still run: submitted by the recording thread or, once the
    // GPU is done, by the background thread; never held until a host wait.
    for _ in 0..4 {
        keep.push(d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap());
    }
    let t0 = std::time::Instant::now();
    while d.exec_stats().submits < submits + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the second batch was never submitted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Fewer than idle_ops commands are held back, however idle the GPU.
    d.synchronize().unwrap();
    let s = d.exec_stats().submits;
    keep.push(d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(d.exec_stats().submits, s);
    for k in keep {
        assert_eq!(k[0].download::<f32>().unwrap(), vec![-1.0; 64]);
    }
}

#[test]
fn bind_groups_are_reused_for_the_same_tensors() {
    use tfwgpu_runtime::{DType, Operand};
    for capacity in [16384, 1, 0] {
        let rt = runtime_with(|o| o.exec.bind_group_cache = capacity);
        let d = rt.device();
        let x = d.upload(&[1.0f32; 100], &[100]).unwrap();
        let y = d.upload(&[2.0f32; 100], &[100]).unwrap();
        let add = d.kernel("AddV2", &Attrs::new()).unwrap();
        let outs = [
            d.empty(DType::F32, &[100]).unwrap(),
            d.empty(DType::F32, &[100]).unwrap(),
        ];
        let record = |a: &tfwgpu_runtime::Tensor, o: &tfwgpu_runtime::Tensor| {
            let ins = [
                Operand::Device(a.device_ref()),
                Operand::Device(y.device_ref()),
            ];
            d.record(add.as_ref(), &ins, std::slice::from_ref(o.device_ref()))
                .unwrap()
        };
        record(&x, &outs[0]); // compiles the pipeline
        let created = d.exec_stats().bind_groups;
        for _ in 0..10 {
            record(&x, &outs[0]);
        }
        let same = d.exec_stats().bind_groups - created;
        for i in 0..10 {
            record(&x, &outs[i % 2]);
        }
        let alternating = d.exec_stats().bind_groups - created - same;
        // Both outputs hold 1 + 2 = 3 now; then out1 = out0 + 2 = 5 and out0 = out1 + 2 = 7.
        record(&outs[0], &outs[1]);
        record(&outs[1], &outs[0]);
        assert_eq!(outs[0].download::<f32>().unwrap(), vec![7.0; 100]);
        assert_eq!(outs[1].download::<f32>().unwrap(), vec![5.0; 100]);
        // With dynamic storage offsets (the default where the device allows 3 per layout), a
        // bind group names buffers and sizes only: the second output, in the same heap buffer
        // at another offset, uses the same one.
        let dynamic = std::env::var("TFWGPU_DYNAMIC_STORAGE").map_or(true, |v| v.trim() != "0")
            && d.limits().max_dynamic_storage_buffers_per_pipeline_layout >= 3;
        match (capacity, dynamic) {
            (0, _) => assert_eq!((same, alternating), (10, 10)),
            (_, true) => assert_eq!((same, alternating), (0, 0)),
            // The same tensors find their bind group; a second output needs one more.
            (16384, false) => assert_eq!((same, alternating), (0, 1)),
            // A cache of one entry: alternating outputs clear it every time.
            _ => assert_eq!((same, alternating), (0, 9)),
        }
    }
}

#[test]
fn one_bind_group_serves_tensors_that_moved_within_their_heap() {
    // TensorFlow's allocator puts a step's tensors at other offsets every step; with dynamic
    // storage offsets the kernel's bind group is found anyway, and each dispatch reads and
    // writes the tensors at their own offsets.
    use tfwgpu_runtime::{DType, Operand};
    let rt = runtime_with(|_| {});
    let d = rt.device();
    if d.limits().max_dynamic_storage_buffers_per_pipeline_layout < 3
        || std::env::var("TFWGPU_DYNAMIC_STORAGE").is_ok_and(|v| v.trim() == "0")
    {
        eprintln!("skipped: no dynamic storage offsets on this device");
        return;
    }
    let add = d.kernel("AddV2", &Attrs::new()).unwrap();
    let xs: Vec<_> = (0..6)
        .map(|i| d.upload(&[i as f32; 37], &[37]).unwrap())
        .collect();
    let outs: Vec<_> = (0..6)
        .map(|_| d.empty(DType::F32, &[37]).unwrap())
        .collect();
    let run = |i: usize, j: usize| {
        let ins = [
            Operand::Device(xs[i].device_ref()),
            Operand::Device(xs[j].device_ref()),
        ];
        d.record(
            add.as_ref(),
            &ins,
            std::slice::from_ref(outs[i].device_ref()),
        )
        .unwrap()
    };
    run(0, 1);
    let created = d.exec_stats().bind_groups;
    for i in 0..6 {
        run(i, (i + 1) % 6);
    }
    assert_eq!(
        d.exec_stats().bind_groups,
        created,
        "every dispatch found its bind group"
    );
    for (i, o) in outs.iter().enumerate() {
        let want = (i + (i + 1) % 6) as f32;
        assert_eq!(o.download::<f32>().unwrap(), vec![want; 37], "output {i}");
    }
}

#[test]
fn a_batch_goes_out_behind_the_last_one_the_gpu_runs() {
    // idle_inflight 2: with one batch in flight (or none), a batch of idle_ops commands is
    // submitted at once, without waiting for the host to learn that the GPU went idle.
    let rt = runtime_with(|o| {
        o.exec = ExecConfig {
            max_ops: 1_000_000,
            max_age: Duration::from_secs(3600),
            idle_ops: 4,
            idle_inflight: 2,
            idle_age: None,
            ..ExecConfig::default()
        }
    });
    let d = rt.device();
    let x = d.upload(&[1.0f32; 64], &[64]).unwrap();
    d.synchronize().unwrap();
    let submits = d.exec_stats().submits;
    let mut keep = vec![];
    for _ in 0..8 {
        keep.push(d.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap());
    }
    assert_eq!(
        d.exec_stats().submits,
        submits + 2,
        "two batches of 4 went out back to back"
    );
    for k in keep {
        assert_eq!(k[0].download::<f32>().unwrap(), vec![-1.0; 64]);
    }
}

#[test]
fn reads_into_a_host_buffer_copy_every_byte_of_large_and_odd_sizes() {
    // Device::read_into (the plugin's memcpy_dtoh): reads of >= 8 MiB are copied out of the
    // mapped memory by several threads; odd lengths and offsets inside an allocation too.
    let rt = Runtime::new().unwrap();
    let d = rt.device();
    for len in [3usize, 4096 + 1, (9 << 20) + 3] {
        let bytes: Vec<u8> = (0..len + 8).map(|i| (i * 131 + len) as u8).collect();
        let addr = d.allocate((len + 8) as u64).unwrap();
        d.write(addr, &bytes[..(len + 8) / 4 * 4]).unwrap();
        let mut back = vec![0u8; len];
        d.read_into(addr + 4, &mut back).unwrap();
        assert!(back == bytes[4..4 + len], "{len} bytes read back differ");
        d.deallocate(addr).unwrap();
    }
}

#[test]
fn reused_readback_buffers_never_return_stale_or_extra_bytes() {
    // Small reads take their readback buffer from a pool (power-of-two classes): reads of
    // sizes that share a class, in turn, with new contents each round.
    let rt = Runtime::new().unwrap();
    let d = rt.device();
    let addr = d.allocate(8192).unwrap();
    for round in 0..4u8 {
        for len in [4usize, 12, 200, 256, 260, 1000, 4096, 5000] {
            let bytes: Vec<u8> = (0..len)
                .map(|i| (i as u8) ^ round.wrapping_mul(37))
                .collect();
            d.write(addr, &bytes).unwrap();
            let back = d.read(addr, len).unwrap();
            assert_eq!(back, bytes, "round {round}, {len} bytes");
        }
    }
    d.deallocate(addr).unwrap();
}

#[test]
fn asynchronous_reads_see_the_data_of_their_place_in_the_queue() {
    let rt = Runtime::new().unwrap();
    let d = rt.device();
    let n = 3000usize;
    let first: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let t = d.upload(&first, &[n]).unwrap();
    // Started before the overwrite and the doubling: it must hold the first values...
    let early = d.read_async(t.addr(), n * 4).unwrap();
    let second: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    d.write(t.addr(), bytemuck::cast_slice(&second)).unwrap();
    let doubled = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&t), Arg::from(&t)])
        .unwrap();
    // ...and one started after them the doubled second values, finished in either order,
    // with a length that is not a whole number of words.
    let late = d.read_async(doubled[0].addr(), n * 4 - 3).unwrap();
    assert!(late.batch() >= early.batch());
    let got_late = d.finish_read(late, |b| b.to_vec()).unwrap();
    let got_early: Vec<f32> = d
        .finish_read(early, |b| bytemuck::cast_slice::<u8, f32>(b).to_vec())
        .unwrap();
    assert_eq!(got_early, first);
    assert_eq!(got_late.len(), n * 4 - 3);
    let want: Vec<u8> = second
        .iter()
        .flat_map(|v| (v * 2.0).to_le_bytes())
        .take(n * 4 - 3)
        .collect();
    assert_eq!(got_late, want);
    // A read of nothing waits for nothing.
    let none = d.read_async(t.addr(), 0).unwrap();
    assert!(d.finish_read(none, |b| b.is_empty()).unwrap());
}

#[test]
fn small_host_writes_are_read_back_without_the_gpu_until_written_over() {
    // A read of bytes the host wrote is answered from the host's copy: no read goes to the
    // GPU and the open batch stays open. Every other write to the range (a kernel's output,
    // a device-to-device copy, a fill) must end that, or the read would return stale bytes.
    let rt = manual_batching(0);
    let d = rt.device();
    let n = 6usize;
    let desc = TensorDesc::new(DType::F32, &[n]);
    let addr = d.allocate(desc.byte_size()).unwrap();
    let other = d.allocate(desc.byte_size()).unwrap();
    let vals = [1.5f32, -2.0, 3.25, 4.0, -5.5, 6.0];
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let floats = |b: Vec<u8>| {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<f32>>()
    };
    d.write(addr, &bytes(&vals)).unwrap();
    d.write(other, &bytes(&[9.0; 6])).unwrap();
    // Work recorded and not submitted: a GPU read would have to submit it.
    let neg = d.kernel("Neg", &Attrs::new()).unwrap();
    let src = DeviceRef {
        desc: desc.clone(),
        addr,
    };
    let dst = DeviceRef {
        desc: desc.clone(),
        addr: other,
    };
    d.record(
        neg.as_ref(),
        &[Operand::Device(&src)],
        std::slice::from_ref(&dst),
    )
    .unwrap();
    let s = d.exec_stats();
    assert_eq!(floats(d.read(addr + 4, 8).unwrap()), vals[1..3].to_vec());
    let mut whole = vec![0u8; 24];
    d.read_into(addr, &mut whole).unwrap();
    assert_eq!(floats(whole), vals.to_vec());
    let after = d.exec_stats();
    assert_eq!(
        (after.submits, after.reads),
        (s.submits, s.reads),
        "reads of host-written bytes went to the GPU"
    );
    // `other` was written by the host, then by Neg: its read must see Neg's output.
    let want: Vec<f32> = vals.iter().map(|v| -v).collect();
    assert_eq!(floats(d.read(other, 24).unwrap()), want, "kernel output");
    // A copy over `addr`, then a fill over `other`.
    d.copy(other, addr, 24).unwrap();
    assert_eq!(floats(d.read(addr, 24).unwrap()), want, "copy");
    d.fill_u32(other, 24, 0x3f80_0000).unwrap();
    assert_eq!(floats(d.read(other, 24).unwrap()), vec![1.0; 6], "fill");
    // A host write after those is mirrored again, and an unaligned one keeps its exact bytes.
    d.write(addr, &[1, 2, 3, 4, 5]).unwrap();
    assert_eq!(d.read(addr, 5).unwrap(), vec![1, 2, 3, 4, 5]);
    let reads = d.exec_stats().reads;
    assert_eq!(d.read(addr + 1, 3).unwrap(), vec![2, 3, 4]);
    assert_eq!(d.exec_stats().reads, reads);
    // With the mirror off every read goes to the GPU.
    let off = runtime_with(|o| o.host_mirror_bytes = 0);
    let d = off.device();
    let a = d.allocate(16).unwrap();
    d.write(a, &[7; 16]).unwrap();
    let r = d.exec_stats().reads;
    assert_eq!(d.read(a, 16).unwrap(), vec![7; 16]);
    assert_eq!(d.exec_stats().reads, r + 1);
}

#[test]
fn writes_of_any_length_keep_the_other_bytes_of_their_last_word() {
    // 1-3 trailing bytes go in with a byte-masked fill: the rest of their word must stay.
    // The mirror is off so that every read comes from the GPU.
    let rt = runtime_with(|o| o.host_mirror_bytes = 0);
    let d = rt.device();
    let a = d.allocate(32).unwrap();
    d.write(a, &[0xAA; 32]).unwrap();
    d.write(a + 4, &[1]).unwrap();
    d.write(a + 8, &[2, 3, 4]).unwrap();
    d.write(a + 16, &[5, 6, 7, 8, 9, 10]).unwrap();
    let mut want = vec![0xAAu8; 32];
    want[4] = 1;
    want[8..11].copy_from_slice(&[2, 3, 4]);
    want[16..22].copy_from_slice(&[5, 6, 7, 8, 9, 10]);
    assert_eq!(d.read(a, 32).unwrap(), want);
}

#[test]
fn small_uploads_through_the_arena_keep_their_order_and_bytes() {
    // Uploads of at most `arena_upload_bytes` go through the batch's uniform arena: between
    // dispatches (whose params share the arena), on both sides of the size limit, several per
    // batch and across batches, each lands where and when it was recorded.
    let rt = manual_batching(0);
    let d = rt.device();
    let sizes = [1usize, 3, 4, 64, 1000, 4096, 4097, 20000];
    for round in 0..3u32 {
        let mut outs = vec![];
        for (k, &n) in sizes.iter().enumerate() {
            let t = d.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
            let first: Vec<f32> = (0..n)
                .map(|i| (i as u32 + round * 7 + k as u32) as f32)
                .collect();
            let bytes: Vec<u8> = first.iter().flat_map(|v| v.to_le_bytes()).collect();
            d.write(t.addr(), &bytes).unwrap();
            let neg1 = d.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
            // Overwrite right after: the Neg before must still see the first bytes.
            let second: Vec<f32> = first.iter().map(|v| v * 3.0 + 1.0).collect();
            let bytes: Vec<u8> = second.iter().flat_map(|v| v.to_le_bytes()).collect();
            d.write(t.addr(), &bytes).unwrap();
            let neg2 = d.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
            outs.push((t, neg1, neg2, first, second));
        }
        for (k, (t, n1, n2, first, second)) in outs.iter().enumerate() {
            let w1: Vec<f32> = first.iter().map(|v| -v).collect();
            let w2: Vec<f32> = second.iter().map(|v| -v).collect();
            assert_eq!(
                n1[0].download::<f32>().unwrap(),
                w1,
                "round {round}, size {}",
                sizes[k]
            );
            assert_eq!(
                n2[0].download::<f32>().unwrap(),
                w2,
                "round {round}, size {}",
                sizes[k]
            );
            assert_eq!(
                &t.download::<f32>().unwrap(),
                second,
                "round {round}, size {}",
                sizes[k]
            );
        }
    }
}
