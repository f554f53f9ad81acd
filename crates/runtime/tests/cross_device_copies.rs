//! Copies between two devices through the host, as the plugin's copier threads make them
//! (crates/plugin/src/crossdev.rs): the source's read is started at issue time, in the
//! source's order ([`Device::read_async`]); a copier thread per issuing device finishes it and
//! records the destination's upload of the bytes ([`Device::finish_read`] +
//! [`Device::write`]), in the order the copies were issued; the destination's consumers are
//! recorded only once the copy has landed (TensorFlow hands them the tensor after the copy's
//! event). Two logical devices of one adapter (the adapter opened twice). Every wait of these
//! tests has a timeout: a hang fails the test.

use std::sync::mpsc;
use std::time::Duration;

use tfwgpu_runtime::{Arg, Attrs, DType, Device, ExecConfig, ReadInFlight, Runtime};

const LIMIT: Duration = Duration::from_secs(120);

/// The default adapter opened twice, as two devices, with `cfg`'s batching.
fn two_devices(cfg: ExecConfig) -> Runtime {
    Runtime::default_adapter_twice(|o| o.exec = cfg).expect("the adapter opened twice")
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

/// A copy handed to a copier: `read` on `from`, written to `to` at `dst`.
struct Job {
    from: Device,
    read: ReadInFlight,
    to: Device,
    dst: u64,
    landed: mpsc::Sender<Result<(), String>>,
}

/// A copy in flight: [`Landing::wait`] returns once its bytes are recorded on the destination.
#[must_use = "the copy's consumers must wait for it"]
struct Landing(mpsc::Receiver<Result<(), String>>);

impl Landing {
    /// The copy's result (a hang fails the test).
    fn result(self) -> Result<(), String> {
        self.0
            .recv_timeout(LIMIT)
            .expect("the copier finished the copy")
    }

    fn wait(self) {
        self.result().expect("the copy landed");
    }
}

/// One copier thread per issuing device, finishing copies in the order they were issued.
struct Copier {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Copier {
    fn new() -> Copier {
        let (tx, rx) = mpsc::channel::<Job>();
        let handle = std::thread::spawn(move || {
            for j in rx {
                let r = j
                    .from
                    .finish_read(j.read, |bytes| j.to.write(j.dst, bytes))
                    .and_then(|r| r)
                    .map_err(|e| e.to_string());
                let _ = j.landed.send(r);
            }
        });
        Copier {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Starts copying `len` bytes at `src` on `from` to `dst` on `to`: the read is recorded on
    /// `from` now; this copier lands it.
    fn copy(&self, from: &Device, src: u64, to: &Device, dst: u64, len: usize) -> Landing {
        let read = from.read_async(src, len).expect("the source read started");
        let (landed, rx) = mpsc::channel();
        self.tx
            .as_ref()
            .unwrap()
            .send(Job {
                from: from.clone(),
                read,
                to: to.clone(),
                dst,
                landed,
            })
            .unwrap();
        Landing(rx)
    }

    /// Stops the thread after it finished everything sent.
    fn finish(mut self) {
        drop(self.tx.take());
        self.handle.take().unwrap().join().unwrap();
    }
}

/// The destination's upload is recorded when the copy lands, in the destination's order:
/// work recorded there before sees the old bytes, a consumer recorded after sees the new ones.
#[test]
fn the_copy_lands_in_the_destinations_order() {
    within(LIMIT, "order on the destination", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let copier = Copier::new();
        let n = 1000;
        let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let x = a.upload(&src, &[n]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let t = b.upload(&vec![3.0f32; n], &[n]).unwrap();
        let before = b.run("Square", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        copier.copy(a, y[0].addr(), b, t.addr(), n * 4).wait();
        let after = b.run("Square", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        assert!(
            before[0]
                .download::<f32>()
                .unwrap()
                .iter()
                .all(|&v| v == 9.0),
            "earlier work saw the copy"
        );
        let want: Vec<f32> = src.iter().map(|v| v * v).collect();
        assert_eq!(
            after[0].download::<f32>().unwrap(),
            want,
            "the consumer did not see the copied bytes"
        );
        copier.finish();
    });
}

/// Copies in both directions at once, with a copier per direction: each round sends the
/// negation of A's value to B and of B's to A (a temporary freed right after the copy is
/// issued, its memory reused while the copy is in flight), and each side adds what it got to
/// what it has, so every round's result depends on the copies of all rounds before.
fn both_ways(cfg: ExecConfig, rounds: usize, n: usize) {
    let rt = two_devices(cfg);
    let (a, b) = (&rt.devices[0], &rt.devices[1]);
    let ca = Copier::new();
    let cb = Copier::new();
    let mut va = a.upload(&vec![1.0f32; n], &[n]).unwrap();
    let mut vb = b.upload(&vec![2.0f32; n], &[n]).unwrap();
    let (mut ha, mut hb) = (1.0f64, 2.0f64);
    for r in 0..rounds {
        let ina = a.empty(DType::F32, &[n]).unwrap();
        let inb = b.empty(DType::F32, &[n]).unwrap();
        let sa = a.run("Neg", &Attrs::new(), &[Arg::from(&va)]).unwrap();
        let sb = b.run("Neg", &Attrs::new(), &[Arg::from(&vb)]).unwrap();
        let la = ca.copy(a, sa[0].addr(), b, inb.addr(), n * 4);
        let lb = cb.copy(b, sb[0].addr(), a, ina.addr(), n * 4);
        drop((sa, sb));
        // Work on both sources while their copies are in flight, in the freed memory.
        let junk_a = a.upload(&vec![-99.0f32; n], &[n]).unwrap();
        let junk_b = b.upload(&vec![-98.0f32; n], &[n]).unwrap();
        // The consumers wait for their copies, as TensorFlow's executor makes them.
        la.wait();
        lb.wait();
        let na = a
            .run("AddV2", &Attrs::new(), &[Arg::from(&va), Arg::from(&ina)])
            .unwrap();
        let nb = b
            .run("AddV2", &Attrs::new(), &[Arg::from(&vb), Arg::from(&inb)])
            .unwrap();
        (ha, hb) = (ha - hb, hb - ha);
        va = na.into_iter().next().unwrap();
        vb = nb.into_iter().next().unwrap();
        if r % 4 == 3 {
            assert!(
                junk_a
                    .download::<f32>()
                    .unwrap()
                    .iter()
                    .all(|&v| v == -99.0)
            );
            assert!(
                junk_b
                    .download::<f32>()
                    .unwrap()
                    .iter()
                    .all(|&v| v == -98.0)
            );
        }
    }
    let ga = va.download::<f32>().unwrap();
    let gb = vb.download::<f32>().unwrap();
    ca.finish();
    cb.finish();
    // Every value is an integer below 2^24: exact in float32.
    assert!(ga.iter().all(|&v| v as f64 == ha), "A: {} want {ha}", ga[0]);
    assert!(gb.iter().all(|&v| v as f64 == hb), "B: {} want {hb}", gb[0]);
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
                submit_thread: Some(true),
                ..ExecConfig::default()
            },
            8,
            300,
        )
    });
}

/// A chain of hops where each copy's source is the result of the previous copy on the other
/// device (an all-reduce's ring), with small batches: every hop lands, in order.
#[test]
fn a_chain_of_hops_lands_in_order() {
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
            let dst = devs[to].empty(DType::F32, &[n]).unwrap();
            copiers[at]
                .copy(devs[at], cur.addr(), devs[to], dst.addr(), n * 4)
                .wait();
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
        c0.finish();
        c1.finish();
    });
}

/// A copy that fails (its source range or its destination range runs past the allocation)
/// reports the error without a hang, writes nothing, and leaves both devices working; so does
/// a read abandoned before it was finished.
#[test]
fn a_failed_copy_reports_its_error_without_a_hang() {
    within(LIMIT, "failed copy", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b) = (&rt.devices[0], &rt.devices[1]);
        let copier = Copier::new();
        // 256 bytes: whole allocation granules, so that one word more runs past them.
        let n = 64;
        let x = a.upload(&vec![-1.0f32; n], &[n]).unwrap();
        let x = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let x = &x[0];
        let t = b.upload(&vec![2.0f32; n], &[n]).unwrap();
        // The source range runs past its allocation: refused at issue time.
        let err = a.read_async(x.addr(), 4 * n + 4).err().expect("refused");
        assert!(err.to_string().contains("past its allocation"), "{err}");
        // The destination range runs past its allocation: the landing fails.
        let big = a.upload(&vec![5.0f32; 2 * n], &[2 * n]).unwrap();
        let big = a.run("Neg", &Attrs::new(), &[Arg::from(&big)]).unwrap();
        let err = copier
            .copy(a, big[0].addr(), b, t.addr(), 8 * n)
            .result()
            .expect_err("a write past the destination's allocation");
        assert!(err.contains("past its allocation"), "{err}");
        assert_eq!(
            t.download::<f32>().unwrap(),
            vec![2.0f32; n],
            "nothing written"
        );
        // A read abandoned in flight.
        drop(a.read_async(x.addr(), 4 * n).unwrap());
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        // Both devices go on working, copies included.
        copier.copy(a, x.addr(), b, t.addr(), 4 * n).wait();
        let y = b.run("Neg", &Attrs::new(), &[Arg::from(&t)]).unwrap();
        assert_eq!(y[0].download::<f32>().unwrap(), vec![-1.0f32; n]);
        assert_eq!(x.download::<f32>().unwrap(), vec![1.0f32; n]);
        copier.finish();
    });
}

/// What the plugin's copiers do, under load: two issuing threads per device copying to the
/// other device in loops while the others record, one copier per issuing device.
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
                        let t = b.empty(DType::F32, &[n]).unwrap();
                        // The read and the hand-over in one critical section per issuing
                        // device, as the plugin's lanes do.
                        let landing =
                            copiers[from]
                                .lock()
                                .unwrap()
                                .copy(a, y[0].addr(), b, t.addr(), n * 4);
                        landing.wait();
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
            c.into_inner().unwrap().finish();
        }
    });
}

/// Copies of sizes that are not whole words keep the destination's bytes after them, from the
/// source's host mirror (no GPU read) and from a kernel's output (through the GPU).
#[test]
fn small_and_odd_sized_copies_keep_the_bytes_after_them_and_use_the_mirror() {
    within(LIMIT, "odd sizes", || {
        let rt = two_devices(ExecConfig::default());
        let (a, b): (&Device, &Device) = (&rt.devices[0], &rt.devices[1]);
        let copier = Copier::new();
        let src = a.allocate(256).unwrap();
        let dst = b.allocate(256).unwrap();
        a.write(src, &(0u8..64).collect::<Vec<_>>()).unwrap();
        b.write(dst, &[0xEEu8; 64]).unwrap();
        // The host mirror answers the source's read: no batch to wait for.
        let read = a.read_async(src + 4, 3).unwrap();
        assert_eq!(read.batch(), 0, "answered by the host mirror");
        drop(read);
        copier.copy(a, src + 4, b, dst + 8, 3).wait();
        let got = b.read(dst, 16).unwrap();
        assert_eq!(got[8..11], [4, 5, 6]);
        assert_eq!(got[11], 0xEE, "the byte after the copy is kept");
        // A kernel output as the source: through the GPU; 7 bytes of its 12.
        let x = a.upload(&[1.5f32, 2.5, 3.5], &[3]).unwrap();
        let y = a.run("Neg", &Attrs::new(), &[Arg::from(&x)]).unwrap();
        let read = a.read_async(y[0].addr(), 7).unwrap();
        assert!(read.batch() > 0, "read through the GPU");
        drop(read);
        copier.copy(a, y[0].addr(), b, dst + 16, 7).wait();
        let want = f32s(&[-1.5, -2.5, -3.5]);
        let got = b.read(dst + 16, 8).unwrap();
        assert_eq!(got[..7], want[..7]);
        assert_eq!(got[7], 0xEE, "the byte after the copy is kept");
        // The bytes before it were not touched.
        assert_eq!(b.read(dst + 8, 3).unwrap(), [4, 5, 6]);
        copier.finish();
        a.deallocate(src).unwrap();
        b.deallocate(dst).unwrap();
    });
}
