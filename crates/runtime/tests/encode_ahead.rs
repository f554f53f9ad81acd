//! `ExecConfig::encode_ahead`: a batch encoded in parts on the encoder thread while recording
//! goes on, submitted once. The parts must run in recording order, share the batch's uniform
//! arena (dispatch params and small uploads), and keep GPU timings per command.

use std::time::Duration;

use tfwgpu_runtime::{Arg, Attrs, ExecConfig, Runtime, RuntimeOptions};

/// Batches that stay open until a host read (no count, age or idle rule submits them), encoded
/// in parts of `ahead` commands, with or without the submit thread.
fn runtime(ahead: usize, submit_thread: bool) -> Runtime {
    let mut opts = RuntimeOptions::from_env().unwrap();
    opts.exec = ExecConfig {
        max_ops: 100_000,
        max_age: Duration::from_secs(3600),
        idle_ops: 0,
        idle_age: None,
        submit_thread: Some(submit_thread),
        encode_ahead: ahead,
        ..ExecConfig::default()
    };
    Runtime::with_options(opts).unwrap()
}

/// A chain in one batch: `acc = acc + b_k` where each `b_k` is written through the uniform
/// arena just before its add, then `acc * c` with a fresh `c`; returns the final values and
/// the submits it took.
fn chain(rt: &Runtime, n: usize, rounds: usize) -> (Vec<f32>, u64) {
    let d = rt.device();
    let mut acc = d.upload(&vec![0.0f32; n], &[n]).unwrap();
    let b = d.upload(&vec![0.0f32; n], &[n]).unwrap();
    d.synchronize().unwrap();
    let before = d.exec_stats().submits;
    for k in 0..rounds {
        let v: Vec<u8> = (0..n)
            .flat_map(|i| ((k * 7 + i % 5) as f32).to_le_bytes())
            .collect();
        // 4 * n bytes, under the arena's upload limit: copied out of the uniform arena.
        d.write(b.addr(), &v).unwrap();
        acc = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&acc), Arg::from(&b)])
            .unwrap()
            .remove(0);
        if k % 4 == 3 {
            acc = d
                .run("Mul", &Attrs::new(), &[Arg::from(&acc), Arg::from(&acc)])
                .unwrap()
                .remove(0);
            acc = d
                .run("Sqrt", &Attrs::new(), &[Arg::from(&acc)])
                .unwrap()
                .remove(0);
        }
    }
    let out = acc.download::<f32>().unwrap();
    (out, d.exec_stats().submits - before)
}

fn expected(n: usize, rounds: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let mut a = 0.0f32;
            for k in 0..rounds {
                a += (k * 7 + i % 5) as f32;
                if k % 4 == 3 {
                    a = (a * a).sqrt();
                }
            }
            a
        })
        .collect()
}

#[test]
fn parts_of_one_batch_run_in_order_with_their_uniforms() {
    let (n, rounds) = (257, 24);
    let want = expected(n, rounds);
    for submit_thread in [false, true] {
        for ahead in [0, 1, 2, 3, 7] {
            let rt = runtime(ahead, submit_thread);
            let (got, submits) = chain(&rt, n, rounds);
            assert_eq!(
                got, want,
                "encode_ahead {ahead}, submit thread {submit_thread}"
            );
            // One batch for the whole chain and its readback copy: every part in one submit.
            assert_eq!(
                submits, 1,
                "encode_ahead {ahead}, submit thread {submit_thread}"
            );
        }
    }
}

#[test]
fn parts_from_many_threads_keep_each_threads_results() {
    let rt = runtime(2, true);
    let (n, rounds) = (64, 12);
    let want = expected(n, rounds);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| chain(&rt, n, rounds).0))
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), want);
        }
    });
}

#[test]
fn parts_keep_a_timestamp_pair_per_command() {
    let rt = runtime(3, false);
    let d = rt.device();
    let ex = d.exec();
    if let Err(e) = ex.set_timing(true) {
        println!("skipped: {e}");
        return;
    }
    let x = d.upload(&vec![1.5f32; 1024], &[1024]).unwrap();
    let _ = ex.take_timings().unwrap();
    let before = d.exec_stats().dispatches;
    let mut y = d
        .run("AddV2", &Attrs::new(), &[Arg::from(&x), Arg::from(&x)])
        .unwrap()
        .remove(0);
    for _ in 0..9 {
        y = d
            .run("AddV2", &Attrs::new(), &[Arg::from(&y), Arg::from(&x)])
            .unwrap()
            .remove(0);
    }
    assert_eq!(y.download::<f32>().unwrap()[1023], 1.5 * 11.0);
    let t = ex.take_timings().unwrap();
    let dispatches = (d.exec_stats().dispatches - before) as usize;
    let timed: Vec<_> = t
        .iter()
        .filter(|t| t.label.starts_with("elementwise"))
        .collect();
    assert_eq!(timed.len(), dispatches);
    assert!(timed.iter().all(|t| t.end_ns >= t.start_ns));
    // In recording order on the GPU: each add starts after the one before it started.
    assert!(timed.windows(2).all(|w| w[1].start_ns >= w[0].start_ns));
}
