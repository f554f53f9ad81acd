//! The uniform ring (`ExecConfig::uniform_ring`): each batch's uniforms reach the GPU through a
//! mapped staging buffer of a ring, copied into the one uniform buffer at the batch's first
//! uniform use. The uniforms of one batch must never be seen by another: many tiny batches
//! from several threads, each dispatch with its own params (its length) and small uploads
//! through the arena (their bytes are in the uniforms too), every result checked.

use std::time::Duration;

use tfwgpu_runtime::{Arg, Attrs, ExecConfig, Runtime, RuntimeOptions};

fn runtime(submit_thread: bool, max_ops: usize) -> Runtime {
    let mut opts = RuntimeOptions::from_env().unwrap();
    opts.exec = ExecConfig {
        max_ops,
        max_age: Duration::from_micros(20),
        submit_thread: Some(submit_thread),
        uniform_ring: Some(true),
        ..ExecConfig::default()
    };
    Runtime::with_options(opts).unwrap()
}

#[test]
fn ring_batches_keep_their_own_uniforms() {
    no_leaks(false, 2);
}

#[test]
fn ring_batches_keep_their_own_uniforms_with_a_submit_thread() {
    no_leaks(true, 3);
}

/// Batches large enough that their arena outgrows the ring's first copy span (4 KiB): 8 KiB
/// uploads through the arena, several per batch (the bytes past the span go through the queue).
#[test]
fn ring_batches_larger_than_the_copy_span() {
    no_leaks(false, 24);
}

fn no_leaks(submit_thread: bool, max_ops: usize) {
    let rt = runtime(submit_thread, max_ops);
    let d = rt.device();
    let rounds = 40;
    let run = |seed: usize| -> Vec<(usize, f32, Vec<f32>, Vec<f32>)> {
        let mut outs = vec![];
        for k in 0..rounds {
            // Lengths vary with the round (the dispatches' params hold them): a dispatch that
            // saw a shorter length of another batch would leave elements unwritten.
            let n = 1 + (seed * 131 + k * 37) % 2048;
            let v = (seed * 1000 + k) as f32;
            // At most 8 KiB: through the uniform arena.
            let a = d.upload(&vec![v; n], &[n]).unwrap();
            let half = d.upload(&[0.5f32], &[1]).unwrap();
            let y = d.run("Neg", &Attrs::new(), &[Arg::from(&a)]).unwrap();
            let z = d
                .run("Mul", &Attrs::new(), &[Arg::from(&y[0]), Arg::from(&half)])
                .unwrap();
            outs.push((n, v, y, z));
            // Even threads wait for each round (few batches in flight: the ring's buffers are
            // taken again and again); odd ones record all rounds first (more batches in flight
            // than the ring holds: those batches write their uniforms without it).
            if seed.is_multiple_of(2) {
                d.synchronize().unwrap();
            }
        }
        outs.into_iter()
            .map(|(n, v, y, z)| {
                (
                    n,
                    v,
                    y[0].download::<f32>().unwrap(),
                    z[0].download::<f32>().unwrap(),
                )
            })
            .collect()
    };
    let together: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|seed| s.spawn(move || run(seed))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, outs) in together.iter().enumerate() {
        for (k, (n, v, y, z)) in outs.iter().enumerate() {
            assert_eq!(y.len(), *n);
            assert!(
                y.iter().all(|&x| x == -v),
                "thread {seed} round {k}: Neg of {n} elements of {v} gave {:?}",
                y.iter().find(|&&x| x != -v)
            );
            assert!(
                z.iter().all(|&x| x == -v * 0.5),
                "thread {seed} round {k}: Mul of {n} elements gave {:?}",
                z.iter().find(|&&x| x != -v * 0.5)
            );
        }
    }
    let st = d.exec_stats();
    assert!(
        st.submits > rounds as u64,
        "batches were submitted often: {st:?}"
    );
    // Every dispatch and arena upload has uniforms; a batch holds at most `max_ops` of them.
    // The ring's 32 buffers were used, and taken again where batches were many.
    let with_uniforms = (4 * rounds * 4) as u64;
    let least = (with_uniforms / max_ops as u64 / 2).min(64);
    assert!(
        st.ring_batches >= least,
        "the ring carried the batches' uniforms ({least} at least): {st:?}"
    );
}
