//! Copies between two devices ordered on the GPU side (`Device::gated_write`): the
//! destination records the write at once and holds back submitting it, and everything
//! recorded after it, until the bytes have landed. Two logical devices of one adapter (the
//! adapter opened twice). Every wait of these tests has a timeout: a hang fails the test.

use std::sync::mpsc;
use std::time::Duration;

use tfwgpu_runtime::{
    Arg, Attrs, Device, ExecConfig, IncomingCopy, Runtime, RuntimeOptions, Selection,
};

const LIMIT: Duration = Duration::from_secs(120);

/// The default adapter opened twice, as two devices, with `cfg`'s batching.
fn two_devices(cfg: ExecConfig) -> Runtime {
    let one = Runtime::new().expect("an adapter");
    let i = one.device().description().index;
    drop(one);
    let mut opts = RuntimeOptions::from_env().expect("options");
    opts.selection = Selection {
        visible: Some(vec![i, i]),
        name: None,
    };
    opts.exec = cfg;
    Runtime::with_options(opts).expect("the adapter opened twice")
}

/// Runs `f` on a thread of its own and fails if it does not finish within `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sent nothing and did not panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {limit:?} (a hang)")
        }
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One landing thread per issuing device, landing copies in the order they were issued.
struct Copier {
    tx: Option<mpsc::Sender<IncomingCopy>>,
    errors: mpsc::Receiver<String>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Copier {
    fn new() -> Copier {
        let (tx, rx) = mpsc::channel::<IncomingCopy>();
        let (etx, errors) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            for c in rx {
                if let Err(e) = c.land(Duration::ZERO) {
                    let _ = etx.send(e.to_string());
                }
            }
        });
        Copier {
            tx: Some(tx),
            errors,
            handle: Some(handle),
        }
    }

    fn send(&self, c: IncomingCopy) {
        self.tx.as_ref().unwrap().send(c).unwrap();
    }

    /// Stops the thread after it landed everything sent; the errors it saw.
    fn finish(mut self) -> Vec<String> {
        drop(self.tx.take());
        self.handle.take().unwrap().join().unwrap();
        self.errors.try_iter().collect()
    }
}

#[test]
fn a_consumer_recorded_before_the_bytes_land_reads_them_and_earlier_work_does_not() {
    within(LIMIT, "gated copy", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 1000;
        let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let x = a.upload(&src, &[n]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let t = b.upload(&vec![3.0f32; n], &[n]).unwrap();
        // Recorded on B before the copy: must see the old bytes.
        let before = b.run("Square", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        let copy = a.copy_to_device(y[0].addr(), b, t.addr(), n * 4).unwrap();
        // Recorded on B after the copy, before its bytes land: must see the new ones.
        let after = b.run("Square", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        // Held: the poller submits an open batch within ~0.5 ms; the batch with the copy and
        // the consumer's stay off the queue until the copy lands.
        std::thread::sleep(Duration::from_millis(100));
        let held_at = b.exec().submitted();
        assert!(
            b.exec().tag() > held_at && b.exec().gates_pending() > 0,
            "the copy's batch was held (tag {}, submitted {held_at})",
            b.exec().tag()
        );
        copy.land(Duration::ZERO).unwrap();
        assert_eq!(b.exec().gates_pending(), 0);
        let before = before[0].download::<f32>().unwrap();
        let after = after[0].download::<f32>().unwrap();
        assert!(
            before.iter().all(|&v| v == 9.0),
            "earlier work saw the copy"
        );
        let want: Vec<f32> = src.iter().map(|v| v * v).collect();
        assert_eq!(after, want, "the consumer did not see the copied bytes");
        assert_eq!(
            t.download::<f32>().unwrap(),
            src.iter().map(|v| -v).collect::<Vec<_>>()
        );
    });
}

#[test]
fn reads_and_syncs_of_the_destination_wait_for_the_bytes() {
    within(LIMIT, "reads wait", || {
        let rt = std::sync::Arc::new(two_devices(ExecConfig::default()));
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 64;
        let x = a.upload(&vec![-5.0f32; n], &[n]).unwrap();
        // A kernel's output: the source's host mirror cannot answer its read.
        let x = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let t = b.upload(&vec![1.0f32; n], &[n]).unwrap();
        let copy = a.copy_to_device(x[0].addr(), b, t.addr(), n * 4).unwrap();
        assert_eq!(b.pending_incoming(), 1, "registered, not recorded");
        let addr = t.addr();
        let (rtx, rrx) = mpsc::channel();
        let (stx, srx) = mpsc::channel();
        let rt2 = rt.clone();
        std::thread::spawn(move || {
            let _ = rtx.send(rt2.devices[1].read(addr, 4 * n));
        });
        let rt3 = rt.clone();
        std::thread::spawn(move || {
            let _ = stx.send(rt3.devices[1].synchronize());
        });
        // Neither may finish before the bytes land (the old bytes are all 1.0, and a sync
        // that returns has not run the copy).
        assert!(
            rrx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a read of the destination returned before the copy landed"
        );
        assert!(
            srx.recv_timeout(Duration::from_millis(10)).is_err(),
            "a sync of the destination returned before the copy landed"
        );
        copy.land(Duration::ZERO).unwrap();
        let got = rrx.recv_timeout(LIMIT).expect("the read finished").unwrap();
        assert_eq!(got, f32s(&vec![5.0f32; n]));
        srx.recv_timeout(LIMIT).expect("the sync finished").unwrap();
        drop(t);
        drop(x);
    });
}

/// Copies in both directions at once, many in flight, with tiny batches: each round sends
/// A's value to B and B's to A, and each side adds what it got to what it has, so every
/// round's result depends on the copies of all rounds before.
fn both_ways(cfg: ExecConfig, rounds: usize, n: usize) {
    let rt = two_devices(cfg);
    let (a, b) = (&rt.devices[0], &rt.devices[1]);
    let ca = Copier::new();
    let cb = Copier::new();
    let mut va = a.upload(&vec![1.0f32; n], &[n]).unwrap();
    let mut vb = b.upload(&vec![2.0f32; n], &[n]).unwrap();
    let (mut ha, mut hb) = (1.0f64, 2.0f64);
    let mut keep = vec![];
    for _ in 0..rounds {
        let ina = a.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
        let inb = b.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
        ca.send(a.copy_to_device(va.addr(), b, inb.addr(), n * 4).unwrap());
        cb.send(b.copy_to_device(vb.addr(), a, ina.addr(), n * 4).unwrap());
        let na = a
            .run("AddV2", &Attrs::new(), &[Arg::from(&va), Arg::from(&ina)])
            .unwrap();
        let nb = b
            .run("AddV2", &Attrs::new(), &[Arg::from(&vb), Arg::from(&inb)])
            .unwrap();
        (ha, hb) = (ha + hb, hb + ha);
        keep.push((ina, inb));
        va = na.into_iter().next().unwrap();
        vb = nb.into_iter().next().unwrap();
        // Freed tensors' memory is reused while copies are in flight.
        if keep.len() > 3 {
            keep.remove(0);
        }
    }
    let ga = va.download::<f32>().unwrap();
    let gb = vb.download::<f32>().unwrap();
    assert!(ca.finish().is_empty() && cb.finish().is_empty());
    assert!(ga.iter().all(|&v| v as f64 == ha), "A: {} want {ha}", ga[0]);
    assert!(gb.iter().all(|&v| v as f64 == hb), "B: {} want {hb}", gb[0]);
    assert_eq!(a.exec().gates_pending(), 0);
    assert_eq!(b.exec().gates_pending(), 0);
}

#[test]
fn copies_both_ways_at_once_with_default_batches() {
    within(LIMIT, "both ways", || {
        both_ways(ExecConfig::default(), 12, 300)
    });
}

#[test]
fn copies_both_ways_at_once_with_tiny_batches() {
    within(LIMIT, "both ways, tiny batches", || {
        both_ways(
            ExecConfig {
                max_ops: 1,
                max_age: Duration::from_micros(10),
                ..ExecConfig::default()
            },
            12,
            300,
        )
    });
}

#[test]
fn copies_both_ways_at_once_with_a_submit_thread() {
    within(LIMIT, "both ways, submit thread", || {
        both_ways(
            ExecConfig {
                max_ops: 2,
                submit_thread: true,
                ..ExecConfig::default()
            },
            8,
            300,
        )
    });
}

/// A chain of hops where each copy's source is the result of the previous copy on the other
/// device (an all-reduce's ring): each read is recorded behind the gate of the copy before
/// it; landing in issue order must never deadlock.
#[test]
fn a_chain_of_hops_lands_in_issue_order_without_deadlock() {
    within(LIMIT, "hop chain", || {
        let rt = two_devices(ExecConfig {
            max_ops: 3,
            ..ExecConfig::default()
        });
        let devs = [&rt.devices[0], &rt.devices[1]];
        let copiers = [Copier::new(), Copier::new()];
        let n = 257;
        let ones = [
            devs[0].upload(&vec![1.0f32; n], &[n]).unwrap(),
            devs[1].upload(&vec![1.0f32; n], &[n]).unwrap(),
        ];
        let mut cur = devs[0].upload(&vec![0.0f32; n], &[n]).unwrap();
        let mut at = 0usize;
        let hops = 24;
        for _ in 0..hops {
            let to = 1 - at;
            let dst = devs[to].empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
            copiers[at].send(
                devs[at]
                    .copy_to_device(cur.addr(), devs[to], dst.addr(), n * 4)
                    .unwrap(),
            );
            cur = devs[to]
                .run(
                    "AddV2",
                    &Attrs::new(),
                    &[Arg::from(&dst), Arg::from(&ones[to])],
                )
                .unwrap()
                .into_iter()
                .next()
                .unwrap();
            at = to;
        }
        assert_eq!(cur.download::<f32>().unwrap(), vec![hops as f32; n]);
        let [c0, c1] = copiers;
        assert!(c0.finish().is_empty() && c1.finish().is_empty());
    });
}

/// Large uploads normally go through the queue's staging (a queue write that runs before the
/// next submit): while a batch is held, they must take the ordered path instead, or they would
/// overtake the held copy.
#[test]
fn uploads_stay_in_order_around_a_held_copy() {
    within(LIMIT, "uploads around a gate", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        // 256 KiB: above the 64 KiB from which uploads are queue writes.
        let n = 1 << 16;
        let x = a.upload(&vec![4.0f32; n], &[n]).unwrap();
        let t = b.upload(&vec![0.0f32; n], &[n]).unwrap();
        let u = b.upload(&vec![0.0f32; n], &[n]).unwrap();
        // Upload before the copy into the same place: the copy's bytes win.
        b.write(t.addr(), &f32s(&vec![6.0f32; n])).unwrap();
        let c1 = a.copy_to_device(x.addr(), b, t.addr(), n * 4).unwrap();
        let r1 = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        // The copy into `u`, then an upload over it: the upload's bytes win.
        let c2 = a.copy_to_device(x.addr(), b, u.addr(), n * 4).unwrap();
        b.write(u.addr(), &f32s(&vec![8.0f32; n])).unwrap();
        let r2 = b.run("Neg", &Attrs::new(), &[Arg::from(&u)]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        c1.land(Duration::ZERO).unwrap();
        c2.land(Duration::ZERO).unwrap();
        assert!(r1[0].download::<f32>().unwrap().iter().all(|&v| v == -4.0));
        assert!(r2[0].download::<f32>().unwrap().iter().all(|&v| v == -8.0));
    });
}

/// A copy whose bytes never come (its source failed, or it was dropped unlanded) poisons the
/// destination: the held work is released, reads and syncs report the failure, nothing hangs.
#[test]
fn a_failed_copy_poisons_the_destination_without_a_hang() {
    within(LIMIT, "failed copy", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 16;
        let x = a.upload(&vec![-1.0f32; n], &[n]).unwrap();
        let x = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let x = &x[0];
        let t = b.upload(&vec![2.0f32; n], &[n]).unwrap();
        let copy = a.copy_to_device(x.addr(), b, t.addr(), n * 4).unwrap();
        let y = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        assert!(b.exec().gates_pending() > 0);
        drop(copy);
        assert_eq!(
            b.exec().gates_pending(),
            0,
            "the held batches were released"
        );
        let err = y[0].download::<f32>().unwrap_err().to_string();
        assert!(err.contains("another device"), "{err}");
        assert!(b.synchronize().is_err(), "a sync reports it");
        assert!(b.exec().check().is_err(), "the poison is sticky");
        // The source is unaffected.
        assert_eq!(x.download::<f32>().unwrap(), vec![1.0f32; n]);
        a.synchronize().unwrap();
    });
}

/// What the plugin's copier does, under load: two issuing threads per device copying to the
/// other device in loops while other threads record, with copiers landing in issue order.
#[test]
fn stress_loops_of_copies_both_ways() {
    within(LIMIT, "stress", || {
        let rt = std::sync::Arc::new(two_devices(ExecConfig {
            max_ops: 4,
            ..ExecConfig::default()
        }));
        let copiers: std::sync::Arc<[std::sync::Mutex<Copier>; 2]> = std::sync::Arc::new([
            std::sync::Mutex::new(Copier::new()),
            std::sync::Mutex::new(Copier::new()),
        ]);
        let n = 129;
        let rounds = 20;
        let hs: Vec<_> = (0..4)
            .map(|k| {
                let rt = rt.clone();
                let copiers = copiers.clone();
                std::thread::spawn(move || {
                    let from = k % 2;
                    let (a, b) = (&rt.devices[from], &rt.devices[1 - from]);
                    for r in 0..rounds {
                        let v = (k * 100 + r) as f32;
                        let x = a.upload(&vec![v; n], &[n]).unwrap();
                        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
                        let t = b.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
                        {
                            // The read, the gate and the hand-over in one critical section
                            // per issuing device, as the plugin's lanes do.
                            let c = copiers[from].lock().unwrap();
                            c.send(a.copy_to_device(y[0].addr(), b, t.addr(), n * 4).unwrap());
                        }
                        let z = b.run("Square", &Attrs::new(), &[Arg::from(&t)]).unwrap();
                        let got = z[0].download::<f32>().unwrap();
                        assert!(
                            got.iter().all(|&g| g == v * v),
                            "thread {k} round {r}: {}",
                            got[0]
                        );
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let copiers = std::sync::Arc::try_unwrap(copiers).ok().unwrap();
        for c in copiers {
            assert!(c.into_inner().unwrap().finish().is_empty());
        }
    });
}

#[test]
fn small_and_odd_sized_copies_keep_the_bytes_after_them_and_use_the_mirror() {
    within(LIMIT, "odd sizes", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b): (&Device, &Device) = (&rt.devices[0], &rt.devices[1]);
        let src = a.allocate(256).unwrap();
        let dst = b.allocate(256).unwrap();
        a.write(src, &(0u8..64).collect::<Vec<_>>()).unwrap();
        b.write(dst, &[0xEEu8; 64]).unwrap();
        // The host mirror answers the source's read: the bytes are written at once.
        let c = a.copy_to_device(src + 4, b, dst + 8, 3).unwrap();
        assert_eq!(b.exec().gates_pending(), 0, "nothing to wait for");
        c.land(Duration::ZERO).unwrap();
        let got = b.read(dst, 16).unwrap();
        assert_eq!(got[8..11], [4, 5, 6]);
        assert_eq!(got[11], 0xEE, "the byte after the copy is kept");
        // A kernel output as the source: through the GPU, behind a gate.
        let x = a.upload(&[1.5f32, 2.5, 3.5], &[3]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let c = a.copy_to_device(y[0].addr(), b, dst + 16, 12).unwrap();
        assert_eq!(b.pending_incoming(), 1);
        // A read of the bytes before it: not held by the copy.
        assert_eq!(b.read(dst + 8, 3).unwrap(), [4, 5, 6]);
        c.land(Duration::ZERO).unwrap();
        assert_eq!(b.read(dst + 16, 12).unwrap(), f32s(&[-1.5, -2.5, -3.5]));
        a.deallocate(src).unwrap();
        b.deallocate(dst).unwrap();
    });
}

/// Staging buffers are reused once the work that copied out of them completed, and a reused
/// buffer carries the new copy's bytes, never the old ones.
#[test]
fn staging_buffers_are_reused_with_the_new_bytes() {
    within(LIMIT, "staging reuse", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 1000;
        let t = b.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
        for k in 0..12 {
            let x = a.upload(&vec![-(k as f32); n], &[n]).unwrap();
            let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
            let c = a.copy_to_device(y[0].addr(), b, t.addr(), n * 4).unwrap();
            // A consumer before the bytes land: the write goes behind a gate, from staging.
            let z = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
            c.land(Duration::ZERO).unwrap();
            assert_eq!(
                z[0].download::<f32>().unwrap(),
                vec![-(k as f32); n],
                "copy {k}"
            );
        }
        let (created, reused) = b.incoming_staging();
        assert_eq!(created + reused, 12);
        assert!(reused >= 8, "created {created}, reused {reused}");
    });
}

/// Work on the destination that does not touch the copy's range is not held behind it, and a
/// copy whose bytes land before anything touched its range is written as an ordinary upload.
#[test]
fn work_elsewhere_is_not_held_and_an_untouched_copy_lands_as_an_upload() {
    within(LIMIT, "untouched copy", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 500;
        let x = a.upload(&vec![-2.0f32; n], &[n]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let t = b.upload(&vec![0.0f32; n], &[n]).unwrap();
        let u = b.upload(&vec![3.0f32; n], &[n]).unwrap();
        let c = a.copy_to_device(y[0].addr(), b, t.addr(), n * 4).unwrap();
        assert_eq!(b.pending_incoming(), 1);
        // Elsewhere on B: recorded, submitted and read back while the copy is in flight.
        let v = b.run("Square", &Attrs::new(), &[Arg::from(&u)]).unwrap();
        assert_eq!(v[0].download::<f32>().unwrap(), vec![9.0f32; n]);
        assert_eq!(b.exec().gates_pending(), 0, "nothing was held");
        assert_eq!(b.pending_incoming(), 1, "the copy is still pending");
        c.land(Duration::ZERO).unwrap();
        assert_eq!(b.pending_incoming(), 0);
        assert_eq!(
            b.incoming_staging(),
            (0, 0),
            "landed as an upload, no staging buffer"
        );
        let z = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        assert_eq!(z[0].download::<f32>().unwrap(), vec![-2.0f32; n]);
    });
}

/// Freeing the destination's allocation while a copy into it is pending records the copy
/// first: the memory is reused only after it ran, and the copy does not land in a new owner.
#[test]
fn freeing_a_pending_destination_records_the_copy_first() {
    within(LIMIT, "free pending", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let n = 256;
        let x = a.upload(&vec![-7.0f32; n], &[n]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let dst = b.allocate(4 * n as u64).unwrap();
        let c = a.copy_to_device(y[0].addr(), b, dst, n * 4).unwrap();
        b.deallocate(dst).unwrap();
        assert_eq!(b.pending_incoming(), 0, "recorded at the free");
        assert!(b.exec().gates_pending() > 0, "behind a gate");
        c.land(Duration::ZERO).unwrap();
        b.synchronize().unwrap();
        assert_eq!(b.exec().gates_pending(), 0);
    });
}

/// The copier landing a copy races with the destination recording its consumer: whichever
/// comes first, the consumer sees the new bytes (a landing that took the copy off the pending
/// list before recording its upload let a consumer that found the list empty go first).
#[test]
fn landing_and_a_consumer_racing_keep_their_order() {
    within(LIMIT, "landing race", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let copier = Copier::new();
        let n = 64;
        let t = b.empty(tfwgpu_runtime::DType::F32, &[n]).unwrap();
        for k in 0..150 {
            let x = a.upload(&vec![-(k as f32); n], &[n]).unwrap();
            let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
            // Make sure the source's bytes are there, so the landing is quick.
            a.synchronize().unwrap();
            copier.send(a.copy_to_device(y[0].addr(), b, t.addr(), n * 4).unwrap());
            if k % 3 == 1 {
                std::thread::yield_now();
            }
            let z = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
            assert_eq!(
                z[0].download::<f32>().unwrap(),
                vec![-(k as f32); n],
                "round {k}"
            );
        }
        assert!(copier.finish().is_empty());
    });
}
