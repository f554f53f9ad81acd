//! `tfwgpu-bench transfer`: host-to-device and device-to-host copies through the runtime's
//! address-level API (`Device::write`, `Device::read_into`: what the plugin's `memcpy_htod` and
//! `memcpy_dtoh` call), timed until the bytes are on the other side (`synchronize` after the
//! write). A model's input batch crosses this path every training step (ResNet-50 at batch 64:
//! 38.5 MB), so its bandwidth is part of the step (issue 7).
//!
//! Every sample writes fresh bytes and reads them back to check them, outside the clock.

use std::time::Instant;

use serde_json::json;
use tfwgpu_runtime::Device;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String], dev: &Device) -> Result<(), String> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let sizes: Vec<f64> = flag("--mb")
        .map_or("0.8,38.5", String::as_str)
        .split(',')
        .map(|s| s.parse::<f64>().map_err(|_| format!("bad --mb {s:?}")))
        .collect::<Result<_, _>>()?;
    let reps: usize = flag("--reps")
        .map_or(Ok(10), |s| s.parse())
        .map_err(|_| "bad --reps")?;
    let g = |e: tfwgpu_runtime::Error| e.to_string();
    let mut rows = Vec::new();
    for mb in sizes {
        let bytes = ((mb * 1e6) as usize).next_multiple_of(4).max(4);
        let addr = dev.allocate(bytes as u64).map_err(g)?;
        let mut host: Vec<u8> = vec![0; bytes];
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for rep in 0..reps + 1 {
            // Fresh contents each sample (a word counter seeded by the sample), made before the
            // clock starts.
            for (i, w) in host.chunks_exact_mut(4).enumerate() {
                w.copy_from_slice(
                    &((i as u32).wrapping_mul(2654435761) ^ rep as u32).to_le_bytes(),
                );
            }
            dev.synchronize().map_err(g)?;
            let t = Instant::now();
            dev.write(addr, &host).map_err(g)?;
            dev.synchronize().map_err(g)?;
            let tu = t.elapsed().as_secs_f64();
            let mut back = vec![0u8; bytes];
            let t = Instant::now();
            dev.read_into(addr, &mut back).map_err(g)?;
            let td = t.elapsed().as_secs_f64();
            if back != host {
                return Err(format!(
                    "transfer of {bytes} bytes: the bytes read back differ"
                ));
            }
            // The first sample warms the paths up (allocations, staging).
            if rep > 0 {
                up.push(tu);
                down.push(td);
            }
        }
        dev.deallocate(addr).map_err(g)?;
        let (u, d) = (median(&mut up), median(&mut down));
        println!(
            "{:>8.2} MB  host->device {:8.3} ms {:6.2} GB/s   device->host {:8.3} ms {:6.2} GB/s",
            bytes as f64 / 1e6,
            u * 1e3,
            bytes as f64 / u / 1e9,
            d * 1e3,
            bytes as f64 / d / 1e9
        );
        rows.push(
            json!({"bytes": bytes, "h2d_ms": u * 1e3, "h2d_gb_s": bytes as f64 / u / 1e9,
                         "d2h_ms": d * 1e3, "d2h_gb_s": bytes as f64 / d / 1e9, "reps": reps}),
        );
    }
    // Latency of a host sync on an almost idle GPU: one small fill, then a 4-byte read back
    // (the plugin's memcpy_dtoh of a loss or a step counter) or a synchronize.
    let n: usize = flag("--latency")
        .map_or(Ok(0), |s| s.parse())
        .map_err(|_| "bad --latency")?;
    let mut latency = json!(null);
    if n > 0 {
        let addr = dev.allocate(256).map_err(g)?;
        let (mut read, mut sync) = (Vec::new(), Vec::new());
        for rep in 0..n + 1 {
            dev.fill_u32(addr, 4, rep as u32).map_err(g)?;
            let t = Instant::now();
            let back = dev.read(addr, 4).map_err(g)?;
            let tr = t.elapsed().as_secs_f64();
            if back != (rep as u32).to_le_bytes() {
                return Err("latency: the word read back differs".into());
            }
            dev.fill_u32(addr, 4, !(rep as u32)).map_err(g)?;
            let t = Instant::now();
            dev.synchronize().map_err(g)?;
            let ts = t.elapsed().as_secs_f64();
            if rep > 0 {
                read.push(tr);
                sync.push(ts);
            }
        }
        dev.deallocate(addr).map_err(g)?;
        let pct = |v: &mut Vec<f64>, q: f64| {
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * q) as usize] * 1e6
        };
        let (r50, r10, r90) = (
            pct(&mut read, 0.5),
            pct(&mut read, 0.1),
            pct(&mut read, 0.9),
        );
        let (s50, s10, s90) = (
            pct(&mut sync, 0.5),
            pct(&mut sync, 0.1),
            pct(&mut sync, 0.9),
        );
        println!(
            "host sync after one small fill ({n} samples): 4-byte read {r50:.1} us (p10 {r10:.1}, p90 {r90:.1}), synchronize {s50:.1} us (p10 {s10:.1}, p90 {s90:.1})"
        );
        latency = json!({"samples": n, "read_us": {"p10": r10, "p50": r50, "p90": r90},
            "sync_us": {"p10": s10, "p50": s50, "p90": s90}});
    }
    if let Some(path) = flag("--json") {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({"transfer": rows, "latency": latency})).unwrap(),
        )
        .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
