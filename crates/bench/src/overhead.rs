//! `tfwgpu-bench overhead`: the runtime's host cost per recorded kernel call, apart from the
//! GPU's execution of it (issue 7).
//!
//! The chain of `bench/op_overhead.py` (`x = x * m + b`, 2 kernel calls per step, each one
//! dispatch) on tensors of `--n` float32 elements, recorded through the address-level API the
//! plugin uses (`Device::output_descs` + `Device::record` on outputs allocated beforehand, so
//! allocation is not counted). Two phases per sample of `--calls` calls:
//! - record: the host time of recording the calls. The runtime is opened with batching
//!   thresholds so large that nothing is submitted while recording (except when a batch's
//!   uniform arena fills), so that on a software adapter (lavapipe, which executes on the same
//!   CPUs) the figure is the recording alone;
//! - drain: `synchronize()` after the recording: submit, the adapter's execution, the wait.
//!
//! With `--default-batching`, the runtime keeps the thresholds from the environment (batches
//! submitted during recording, as in a real program): the record figure then includes submits.
//! `--batch-ops K` is that with a batch submitted every K calls (`TFWGPU_BATCH_OPS`); with
//! `TFWGPU_HOST_LOG=FILE` the timed samples' host spans are written to FILE (submit phases:
//! `bench/hostlog.py FILE --steps N`).

use std::time::{Duration, Instant};

use serde_json::json;
use tfwgpu_runtime::{
    AttrValue, Attrs, DType, DeviceRef, ExecConfig, Operand, Runtime, RuntimeOptions, TensorDesc,
};

/// CPU time of the calling thread, in seconds: the recording cost without the time this
/// thread waited for a CPU (the development machine's 2 cores are shared; lavapipe's threads
/// and other jobs run beside it).
fn thread_cpu_s() -> f64 {
    tfwgpu_runtime::hostlog::thread_cpu_ns().map_or(f64::NAN, |ns| ns as f64 * 1e-9)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

pub fn run(args: &[String]) -> Result<(), String> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let calls: usize = flag("--calls")
        .map_or(Ok(4096), |s| s.parse())
        .map_err(|_| "bad --calls")?;
    let reps: usize = flag("--reps")
        .map_or(Ok(7), |s| s.parse())
        .map_err(|_| "bad --reps")?;
    let n: usize = flag("--n")
        .map_or(Ok(4), |s| s.parse())
        .map_err(|_| "bad --n")?;
    let default_batching = args.iter().any(|a| a == "--default-batching");
    // `--batch-ops K`: default batching, but a batch is submitted after K commands (many
    // submits per sample: the host cost of each submit, issue 7).
    let batch_ops: Option<usize> = flag("--batch-ops")
        .map(|s| s.parse())
        .transpose()
        .map_err(|_| "bad --batch-ops")?;
    let default_batching = default_batching || batch_ops.is_some();
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let mut opts = RuntimeOptions::from_env().map_err(e)?;
    if let Some(k) = batch_ops {
        opts.exec.max_ops = k.max(1);
    }
    if !default_batching {
        opts.exec = ExecConfig {
            max_ops: usize::MAX,
            max_age: Duration::from_secs(3600),
            idle_ops: 0,
            ..opts.exec
        };
    }
    let rt = Runtime::with_options(opts).map_err(e)?;
    let dev = rt.device();
    let d = dev.description();
    eprintln!(
        "adapter: {} ({}, {}, driver {} {})",
        d.name, d.backend, d.device_type, d.driver, d.driver_info
    );
    let attrs = Attrs::new().with("T", AttrValue::Type(DType::F32));
    let mul = dev.kernel("Mul", &attrs).map_err(e)?;
    let add = dev.kernel("AddV2", &attrs).map_err(e)?;
    let desc = TensorDesc::new(DType::F32, &[n]);
    let tensor = |v: f32| -> Result<DeviceRef, String> {
        let t = dev.upload(&vec![v; n], &[n]).map_err(e)?;
        let r = t.device_ref().clone();
        std::mem::forget(t); // lives for the whole run
        Ok(r)
    };
    let m = tensor(0.5)?;
    let b = tensor(1.0)?;
    let x = tensor(1.0)?;
    let y = tensor(0.0)?;
    assert_eq!(x.desc, desc);
    let sample = |count: usize| -> Result<(f64, f64, f64), String> {
        dev.synchronize().map_err(e)?;
        let c0 = thread_cpu_s();
        let t0 = Instant::now();
        for _ in 0..count / 2 {
            // y = x * m; x = y + b
            for (k, ins, out) in [(&mul, [&x, &m], &y), (&add, [&y, &b], &x)] {
                let ops = [Operand::Device(ins[0]), Operand::Device(ins[1])];
                let descs = dev.output_descs(k.as_ref(), &ops).map_err(e)?;
                debug_assert_eq!(descs[0], out.desc);
                dev.record(k.as_ref(), &ops, std::slice::from_ref(out))
                    .map_err(e)?;
            }
        }
        let rec = t0.elapsed().as_secs_f64();
        let cpu = thread_cpu_s() - c0;
        let t1 = Instant::now();
        dev.synchronize().map_err(e)?;
        Ok((rec, cpu, t1.elapsed().as_secs_f64()))
    };
    sample(256)?; // pipelines
    tfwgpu_runtime::hostlog::reset();
    let before = dev.exec_stats();
    let mut rec = vec![];
    let mut cpu = vec![];
    let mut drain = vec![];
    for _ in 0..reps.max(1) {
        let (r, c, d) = sample(calls)?;
        rec.push(r * 1e6 / calls as f64);
        cpu.push(c * 1e6 / calls as f64);
        drain.push(d * 1e6 / calls as f64);
    }
    let after = dev.exec_stats();
    if tfwgpu_runtime::hostlog::on() {
        tfwgpu_runtime::hostlog::dump().map_err(|e| format!("host log: {e}"))?;
    }
    let got = dev.read(x.addr, 4 * n).map_err(e)?;
    let v = f32::from_le_bytes([got[0], got[1], got[2], got[3]]);
    if (v - 2.0).abs() > 1e-3 {
        return Err(format!("the chain converged to {v}, not 2"));
    }
    let submits = (after.submits - before.submits) as f64 / reps.max(1) as f64;
    let (r, c, dr) = (median(&rec), median(&cpu), median(&drain));
    let created = (after.bind_groups - before.bind_groups) as f64 / (reps.max(1) * calls) as f64;
    println!(
        "{} kernel calls of {n} floats per sample, {} samples, {} batching: record {r:.2} us/call \
         wall (min {:.2}), {c:.2} us/call CPU of the recording thread; drain {dr:.2} us/call; \
         {submits:.1} submits per sample; {created:.3} bind groups created per call",
        calls,
        reps,
        if default_batching {
            "default"
        } else {
            "no automatic"
        },
        rec.iter().copied().fold(f64::INFINITY, f64::min),
    );
    if let Some(out) = flag("--json") {
        let doc = json!({
            "adapter": d.name, "backend": d.backend, "calls": calls, "n": n,
            "default_batching": default_batching,
            "record_us_per_call": rec, "record_cpu_us_per_call": cpu, "drain_us_per_call": drain,
            "record_us_median": r, "record_cpu_us_median": c, "drain_us_median": dr,
            "submits_per_sample": submits, "bind_groups_per_call": created,
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc).expect("json"))
            .map_err(|e| format!("{out}: {e}"))?;
    }
    Ok(())
}
