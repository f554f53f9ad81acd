//! What every benchmark case shares: poisoned outputs, timing, error measures, result rows
//! and the JSON document.
//!
//! JSON schema (one document per run; `bench/compare.py` reads it, and `bench/torch_ref.py`
//! writes the same rows for PyTorch):
//!
//! ```text
//! {"tool": "tfwgpu-bench", "adapter": .., "backend": .., "device_type": .., "driver": ..,
//!  "copy_gbps": <best copy bandwidth of the run or null>,
//!  "results": [{"case", "op", "shape", "dtype", "ms", "wall_ms", "min_wall_ms", "gpu_ms",
//!               "gpu_busy_ms", "tflops" | "gbps", "bytes" | "flops", "pct_copy", "rel_err",
//!               "inner", "reps"}, ..]}
//! ```
//!
//! `shape` is a list of the input shapes. `ms` is the time of one run the rates are computed
//! from: `gpu_ms` (GPU timestamps: the span of a batch of back-to-back runs / runs, what CUDA
//! events around a batch measure) where the device has timestamps, else `wall_ms` (the median
//! wall-clock time of one run in batches of back-to-back runs, which includes the host's
//! recording time when that is longer than the GPU's). `pct_copy`: the percentage of the run's
//! best copy bandwidth (memory-bound cases, else null).

use std::time::Instant;

use rand::{Rng, rngs::StdRng};
use serde_json::{Value, json};
use tfwgpu_runtime::{Arg, DType, Device, Kernel, Operand, Tensor};

pub type Res<T> = std::result::Result<T, String>;

pub fn err(e: tfwgpu_runtime::Error) -> String {
    e.to_string()
}

pub fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Allocates the outputs `kernel` computes on `args`, each filled with 0xFFFFFFFF (a NaN for
/// float32, -1 for integers) so that an element the kernel skips fails the check.
pub fn poisoned_outputs(dev: &Device, kernel: &dyn Kernel, args: &[Arg]) -> Res<Vec<Tensor>> {
    let ops = operands(args);
    let descs = dev.output_descs(kernel, &ops).map_err(err)?;
    descs
        .iter()
        .map(|d| {
            let t = dev.empty(d.dtype, &d.shape).map_err(err)?;
            let bytes = d.byte_size().next_multiple_of(4);
            dev.fill_u32(t.addr(), bytes, 0xFFFF_FFFF).map_err(err)?;
            Ok(t)
        })
        .collect()
}

pub fn operands<'a>(args: &'a [Arg<'a>]) -> Vec<Operand<'a>> {
    args.iter()
        .map(|a| match a {
            Arg::Tensor(t) => Operand::Device(t.device_ref()),
            Arg::Host(h) => Operand::Host(h),
        })
        .collect()
}

/// Records `kernel` on `args` into the already-allocated `outputs`.
pub fn record(dev: &Device, kernel: &dyn Kernel, args: &[Arg], outputs: &[Tensor]) -> Res<()> {
    let ops = operands(args);
    let refs: Vec<_> = outputs.iter().map(|t| t.device_ref().clone()).collect();
    dev.record(kernel, &ops, &refs).map_err(err)
}

/// A timing: median and fastest time of one run over `reps` samples of `inner` runs each.
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub inner: usize,
    /// GPU time of one run from timestamps (devices with TIMESTAMP_QUERY inside passes): the
    /// span from the first command's start to the last command's end over `inner` back-to-back
    /// runs, divided by `inner` (what CUDA events around a batch measure), and the time in
    /// which some command of the batch ran (gaps between commands left out), per run.
    pub gpu_ms: Option<f64>,
    pub gpu_busy_ms: Option<f64>,
    /// GPU time per run of each pipeline (dispatch label, or `copy`/`clear`), in ms, in
    /// first-use order: where a multi-dispatch op spends its time.
    pub breakdown: Vec<(String, f64)>,
}

/// Milliseconds of back-to-back runs before a case is timed (`--warm-ms`, default 400).
pub static WARM_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(400);

/// Times `run`: one warm-up run (pipeline compiles, first-touch of memory), then back-to-back
/// runs for `WARM_MS` (the GPU's SM clock falls to 345-800 MHz within a second of light load
/// on the H200 and needs sustained load to return to 1980 MHz: without this, a case timed
/// right after the host computed its reference ran at a third of its speed), then `reps`
/// samples of `inner` back-to-back runs followed by one host wait, `inner` chosen so that a
/// sample lasts about `target_s` (at most 1000 runs). The runtime submits batches while the
/// host records more, so the figure is the device's throughput unless recording one run takes
/// the host longer than the device takes to run it (small cases: the figure is then an upper
/// bound of the device time).
pub fn time_runs(
    dev: &Device,
    reps: usize,
    target_s: f64,
    mut run: impl FnMut() -> Res<()>,
) -> Res<Timing> {
    run()?;
    dev.synchronize().map_err(err)?;
    let warm = std::time::Duration::from_millis(WARM_MS.load(std::sync::atomic::Ordering::Relaxed));
    let tw = Instant::now();
    let mut k = 0u64;
    while tw.elapsed() < warm {
        run()?;
        k += 1;
        if k.is_multiple_of(256) {
            // Bounded queue: the host would otherwise record far ahead of a slow case.
            dev.synchronize().map_err(err)?;
        }
    }
    dev.synchronize().map_err(err)?;
    let t0 = Instant::now();
    for _ in 0..3 {
        run()?;
    }
    dev.synchronize().map_err(err)?;
    let one = t0.elapsed().as_secs_f64() / 3.0;
    let inner = ((target_s / one.max(1e-7)) as usize).clamp(1, 1000);
    let mut samples = vec![];
    for _ in 0..reps.max(1) {
        dev.synchronize().map_err(err)?;
        let t0 = Instant::now();
        for _ in 0..inner {
            run()?;
        }
        dev.synchronize().map_err(err)?;
        samples.push(t0.elapsed().as_secs_f64() / inner as f64);
    }
    samples.sort_by(f64::total_cmp);
    let (gpu_ms, gpu_busy_ms, breakdown) = match gpu_time(dev, inner, &mut run)? {
        Some((span, busy, parts)) => (Some(span), Some(busy), parts),
        None => (None, None, vec![]),
    };
    Ok(Timing {
        median_ms: samples[samples.len() / 2] * 1e3,
        min_ms: samples[0] * 1e3,
        inner,
        gpu_ms,
        gpu_busy_ms,
        breakdown,
    })
}

/// (span, busy, time per label) of one run, in ms.
type GpuTime = (f64, f64, Vec<(String, f64)>);

/// One more batch of `inner` runs with GPU timestamps on (kept apart from the wall-clock
/// samples: the timestamps add work): (span, busy, time per label) per run in ms; None where
/// the device cannot time dispatches.
fn gpu_time(dev: &Device, inner: usize, run: &mut impl FnMut() -> Res<()>) -> Res<Option<GpuTime>> {
    let ex = dev.exec();
    if ex.set_timing(true).is_err() {
        return Ok(None);
    }
    let timed = (|| {
        ex.take_timings().map_err(err)?;
        for _ in 0..inner {
            run()?;
        }
        ex.take_timings().map_err(err)
    })();
    ex.set_timing(false).map_err(err)?;
    let t = timed?;
    if t.is_empty() {
        return Ok(None);
    }
    let s = tfwgpu_runtime::exec::TimingSummary::of(&t);
    let mut parts: Vec<(String, f64)> = vec![];
    for d in &t {
        let ms = (d.end_ns - d.start_ns).max(0.0) / 1e6 / inner as f64;
        match parts.iter_mut().find(|(l, _)| **l == *d.label) {
            Some(p) => p.1 += ms,
            None => parts.push((d.label.to_string(), ms)),
        }
    }
    Ok(Some((
        s.span_ns / 1e6 / inner as f64,
        s.busy_ns / 1e6 / inner as f64,
        parts,
    )))
}

/// Largest `|got - want| / scale` over the elements (infinite for a NaN where the reference
/// is finite: a skipped, poisoned element). `scale` is what the rounding error of the op is
/// proportional to (|want| for a product, sum |x| for a sum...), floored at the smallest
/// positive f64.
pub fn rel_err(got: &[f32], want: impl Fn(usize) -> (f64, f64)) -> f64 {
    let mut worst = 0.0f64;
    for (i, &g) in got.iter().enumerate() {
        let (w, scale) = want(i);
        let e = if g.is_nan() != w.is_nan() {
            f64::INFINITY
        } else if g.is_nan() || (g as f64 == w) {
            0.0
        } else {
            (g as f64 - w).abs() / scale.abs().max(f64::MIN_POSITIVE)
        };
        worst = worst.max(e);
    }
    worst
}

/// What a case does per run: floating-point operations (compute-bound) or bytes that it must
/// at least read and write (memory-bound).
#[derive(Clone, Copy)]
pub enum Work {
    Flops(f64),
    Bytes(f64),
}

/// One measured case.
pub struct Row {
    pub case: String,
    pub op: String,
    pub shape: Vec<Vec<usize>>,
    pub dtype: DType,
    pub timing: Timing,
    pub work: Work,
    pub rel_err: f64,
    pub reps: usize,
    /// Set for memory-bound cases once the run's copy bandwidth is known.
    pub pct_copy: Option<f64>,
    /// A vec4 shader copy of the case's counted bytes (half read, half written), measured
    /// right after the case: its rate, and the case's rate as a percentage of it. The large
    /// copy (`pct_copy`) is what the goal is judged on; this one shows how far a small case
    /// is from what any kernel of its size reaches (the per-dispatch cost is in both).
    pub copy_same_gbps: Option<f64>,
    pub pct_copy_same: Option<f64>,
}

impl Row {
    /// The time rates are computed from: the GPU span per run where timestamps exist (as
    /// CUDA events around a batch measure it for PyTorch), else the wall-clock median.
    pub fn ms(&self) -> f64 {
        self.timing.gpu_ms.unwrap_or(self.timing.median_ms)
    }

    pub fn gbps(&self) -> Option<f64> {
        match self.work {
            Work::Bytes(b) => Some(b / self.ms() / 1e6),
            Work::Flops(_) => None,
        }
    }

    pub fn tflops(&self) -> Option<f64> {
        match self.work {
            Work::Flops(f) => Some(f / self.ms() / 1e9),
            Work::Bytes(_) => None,
        }
    }

    pub fn header() -> String {
        format!(
            "{:<28} {:>20} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>6}",
            "case",
            "op",
            "wall ms",
            "gpu ms",
            "busy ms",
            "rate",
            "% copy",
            "% same",
            "rel err",
            "inner"
        )
    }

    pub fn line(&self) -> String {
        let rate = match (self.tflops(), self.gbps()) {
            (Some(t), _) if t < 0.1 => format!("{:.2} GF/s", t * 1e3),
            (Some(t), _) => format!("{t:.2} TF/s"),
            (_, Some(g)) if g < 10.0 => format!("{g:.2} GB/s"),
            (_, Some(g)) => format!("{g:.0} GB/s"),
            _ => String::new(),
        };
        let pct = self.pct_copy.map_or("-".into(), |p| format!("{p:.0}%"));
        let same = self
            .pct_copy_same
            .map_or("-".into(), |p| format!("{p:.0}%"));
        let opt = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.4}"));
        format!(
            "{:<28} {:>20} {:>10.4} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9.1e} {:>6}",
            self.case,
            self.op,
            self.timing.median_ms,
            opt(self.timing.gpu_ms),
            opt(self.timing.gpu_busy_ms),
            rate,
            pct,
            same,
            self.rel_err,
            self.timing.inner
        )
    }

    pub fn json(&self) -> Value {
        let mut v = json!({
            "case": self.case, "op": self.op, "shape": self.shape,
            "dtype": dtype_name(self.dtype), "ms": self.ms(),
            "wall_ms": self.timing.median_ms, "min_wall_ms": self.timing.min_ms,
            "gpu_ms": self.timing.gpu_ms, "gpu_busy_ms": self.timing.gpu_busy_ms,
            "pct_copy": self.pct_copy,
            "copy_same_gbps": self.copy_same_gbps, "pct_copy_same": self.pct_copy_same,
            "rel_err": finite_or_null(self.rel_err), "inner": self.timing.inner,
            "reps": self.reps,
            "gpu_breakdown": self.timing.breakdown.iter()
                .map(|(l, ms)| json!({"label": l, "ms": ms})).collect::<Vec<_>>(),
        });
        match self.work {
            Work::Flops(f) => {
                v["flops"] = json!(f);
                v["tflops"] = json!(self.tflops());
            }
            Work::Bytes(b) => {
                v["bytes"] = json!(b);
                v["gbps"] = json!(self.gbps());
            }
        }
        v
    }
}

fn finite_or_null(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// TensorFlow's dtype names (float32, float16...), as torch_ref.py writes them.
pub fn dtype_name(d: DType) -> &'static str {
    d.name()
}

/// Writes the run's JSON document.
pub fn write_json(path: &str, dev: &Device, copy_gbps: Option<f64>, rows: &[Row]) -> Res<()> {
    let d = dev.description();
    let doc = json!({
        "tool": "tfwgpu-bench", "adapter": d.name, "backend": d.backend,
        "device_type": d.device_type, "driver": format!("{} {}", d.driver, d.driver_info),
        "copy_gbps": copy_gbps, "results": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc).expect("json"))
        .map_err(|e| format!("{path}: {e}"))
}

pub fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}
