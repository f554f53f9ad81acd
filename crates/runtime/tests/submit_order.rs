//! Batches are encoded and submitted outside the batch lock (one thread submits while others
//! record the next batch): work must still reach the queue in the order it was recorded,
//! large uploads (queue writes, which run before the next submit) included.

use std::time::Duration;

use tfwgpu_runtime::{Arg, Attrs, ExecConfig, Runtime, RuntimeOptions};

/// Tiny batches, so that submits happen all the time and from every thread (or, with
/// `submit_thread`, on the device's submit thread while every thread records).
fn tiny_batches(submit_thread: bool) -> Runtime {
    let mut opts = RuntimeOptions::from_env().unwrap();
    opts.exec = ExecConfig {
        max_ops: 6,
        max_age: Duration::from_micros(20),
        submit_thread: Some(submit_thread),
        ..ExecConfig::default()
    };
    Runtime::with_options(opts).unwrap()
}

#[test]
fn submits_from_many_threads_keep_each_threads_order() {
    many_threads_keep_their_order(false);
}

#[test]
fn a_submit_thread_keeps_each_threads_order() {
    many_threads_keep_their_order(true);
}

fn many_threads_keep_their_order(submit_thread: bool) {
    let rt = tiny_batches(submit_thread);
    let d = rt.device();
    // 128 KiB: above the 64 KiB from which uploads go through the queue's own staging.
    let n = 1 << 15;
    let rounds = 20;
    let run = |seed: usize| -> Vec<Vec<f32>> {
        let a = d.upload(&vec![0.0f32; n], &[n]).unwrap();
        let mut outs = vec![];
        for k in 0..rounds {
            let v = (seed * 1000 + k) as f32;
            let bytes: Vec<u8> = vec![v; n].iter().flat_map(|x| x.to_le_bytes()).collect();
            d.write(a.addr(), &bytes).unwrap();
            // Recorded after the upload, before the next one: must see exactly `v`.
            let y = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
            let z = d.run("Square", &Attrs::new(), &[Arg::from(&y[0])]).unwrap();
            outs.push(y);
            outs.push(z);
        }
        outs.iter()
            .map(|t| t[0].download::<f32>().unwrap())
            .collect()
    };
    let together: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8).map(|seed| s.spawn(move || run(seed))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, outs) in together.iter().enumerate() {
        for k in 0..rounds {
            let v = (seed * 1000 + k) as f32;
            let (y, z) = (&outs[2 * k], &outs[2 * k + 1]);
            assert!(
                y.iter().all(|&x| x == -v),
                "thread {seed} round {k}: Neg saw another upload ({} instead of {})",
                -y[0],
                v
            );
            assert!(z.iter().all(|&x| x == v * v), "thread {seed} round {k}");
        }
    }
    assert!(
        d.exec_stats().submits > (8 * rounds) as u64,
        "batches were submitted often: {:?}",
        d.exec_stats()
    );
}
