//! tfwgpu-bench: lists adapters and measures kernels on any adapter, without TensorFlow.
//!
//! ```text
//! tfwgpu-bench devices
//! tfwgpu-bench matmul [--sizes 512,1024,4096] [--reps N] [--json FILE] [--tiles auto,NAME,..]
//!                     [--transpose none|a|b|ab] [--dtype f32|f16] [--reduced] [--torch]
//! tfwgpu-bench conv [--cases demo1,demo2,resnet|resnet50|all|NAME,..] [--ops fwd,bwd_input,bwd_filter]
//!                   [--reps N] [--sample-ms MS] [--tiles auto,NAME,..] [--json FILE]
//!                   [--dtype f32|f16] [--reduced] [--detail] [--no-gpu-time]
//! tfwgpu-bench ops [--cases NAME,..|all] [--small] [--reps N] [--json FILE] [--list]
//! tfwgpu-bench demo
//! tfwgpu-bench replay TRACE [--repeat N] [--json FILE] [--top N] [--gpu-paths]
//! tfwgpu-bench overhead [--calls N] [--reps N] [--n ELEMENTS] [--default-batching] [--json FILE]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;
use tfwgpu_runtime::{Arg, AttrValue, Attrs, DType, Device, Runtime, f16, list_adapters};

mod cases;
mod coopdirect;
mod occupancy;
mod ops;
mod overhead;
mod replay;
mod replay_dp;
mod replay_multi;
mod torchref;
mod transfer;
mod vkprobe;

const USAGE: &str = "usage:
  tfwgpu-bench devices                       list every adapter with its limits and features
  tfwgpu-bench peerprobe [--all]            per adapter: host memory import and sync-file semaphores
                                             between devices (TFWGPU_PEER=1), related Vulkan extensions
  tfwgpu-bench matmul [--sizes 512,1024,4096] [--reps N] [--json FILE] [--tiles auto,NAME,..]
                      [--transpose none|a|b|ab] [--dtype f32|f16] [--reduced]
                      [--torch [--python PYTHON]]
                                             MatMul GFLOP/s per square size (and per forced
                                             kernel tile: auto is the kernel's choice); f16:
                                             f16 in and out (cooperative matrices where the
                                             adapter has them); --reduced sets
                                             TFWGPU_ALLOW_REDUCED_PRECISION=1 (f32 operands on
                                             f16 tensor cores); --torch: PyTorch on CUDA on the
                                             same GPU, same sizes, beside ours (bench/torch_ref.py,
                                             built in; PYTHON or TFWGPU_TORCH_PYTHON, default
                                             python3, with PyTorch): float32 TF32 off and on,
                                             float16, the speed ratio and issue 6's goal
  tfwgpu-bench conv [--cases demo1,demo2,resnet|resnet50|all|NAME,..]
                    [--ops fwd,bwd_input,bwd_filter] [--reps N] [--sample-ms MS]
                    [--tiles auto,NAME,..] [--json FILE] [--dtype f32|f16] [--reduced]
                    [--detail] [--no-gpu-time] [--torch [--python PYTHON]]
                                             float32 NHWC Conv2D (and DepthwiseConv2dNative) and
                                             the gradients, TFLOP/s per case (wall time; GPU
                                             time from timestamps where the adapter has them,
                                             --detail: per kernel) (demo1:
                                             128x28x28x1 -> 32 3x3, demo2: 128x13x13x32 -> 64
                                             3x3, resnet: 8x56x56x64 -> 64 3x3 SAME; resnet50:
                                             the ResNet-50 layer shapes r50_* and depthwise
                                             dw_*), sampled against an f64 reference; --dtype and
                                             --reduced as for matmul; --torch: cuDNN beside ours
                                             (bench/torch_conv.py, built in), as for matmul
  tfwgpu-bench ops [--cases NAME,..|all] [--small] [--reps N] [--json FILE] [--list]
                                             MatMul/BatchMatMul (TFLOP/s) and memory-bound
                                             kernels (GB/s and % of the copy bandwidth of the
                                             same run): copies (runtime buffer copy, u32 and
                                             vec4 compute copies), AddV2 with broadcasting, Mul,
                                             Sum/Max over the last/first axis, Softmax,
                                             FusedBatchNormV3 (training, NHWC), MaxPool 3x3 s2;
                                             each checked against a CPU reference on random
                                             inputs with poisoned outputs. --small: sizes for
                                             CPU adapters (lavapipe); --list: the case names
  tfwgpu-bench demo                          a short tour of the runtime on the best adapter
  tfwgpu-bench replay TRACE [--repeat N] [--json FILE] [--top N] [--sync-each] [--per-device]
                     [--gpu-paths]
                                             re-runs a kernel trace (TFWGPU_TRACE=TRACE) with
                                             random data: wall time (median of N), dispatches,
                                             submits, host time per op (total and median call);
                                             --gpu-paths: convolutions on the GPU adapters' path
                                             on any adapter (with TFWGPU_TUNE=1: tuned, as on a
                                             GPU); --per-device: each traced
                                             device on its own adapter, one thread per device,
                                             steps per mark label and <n>gpu scaling;
                                             --data-parallel 1,2: the one-device steps on 1 and
                                             2 devices, gradients all-reduced in buckets through
                                             the host ([--allreduce exchange|halves]
                                             [--bucket-kb K] [--per-device-batch B] [--check])
  tfwgpu-bench transfer [--mb 0.8,38.5] [--reps N] [--latency N] [--json FILE]
                                             host-to-device and device-to-host copies through
                                             Device::write/read (the plugin's memcpy path),
                                             timed until the bytes arrived, checked; --latency:
                                             N host syncs after a small fill (read, synchronize)
  tfwgpu-bench overhead [--calls N] [--reps N] [--n ELEMENTS] [--default-batching] [--json FILE]
                                             host time per recorded kernel call (a Mul/AddV2
                                             chain on tiny tensors), apart from the drain
  tfwgpu-bench coopdirect [--shapes M:N:K,..] [--tiles d<BM>x<BN>_<SGM>x<SGN>_s<S>,..]
                         [--dump DIR] [--json FILE]
                                             experiment: float16 products with cooperative
                                             fragments loaded from the storage buffers (no
                                             staging), timed and checked
  tfwgpu-bench occupancy [--threads L] [--shared-kib L] [--regs L] [--iters N] [--grid N]
                       [--dump DIR] [--json FILE]
                                             how many workgroups the driver keeps resident at
                                             once per workgroup size, workgroup memory and
                                             live registers (a counter in a spinning probe)
  tfwgpu-bench vkprobe [--pair A,B] [--rounds N]
                                             raw Vulkan: each device's UUIDs and external
                                             semaphore handle types, the device groups, and
                                             whether an OPAQUE_FD timeline semaphore of device A
                                             orders device B's queue (host-observed latency)
environment: TFWGPU_VISIBLE_DEVICES, TFWGPU_ADAPTER select the adapter; TFWGPU_LOG sets logging";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TFWGPU_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("devices") => devices(),
        Some("peerprobe") => peerprobe(&args[1..]),
        Some("matmul") => matmul(&args[1..]),
        Some("conv") => conv(&args[1..]),
        Some("ops") => ops::run(&args[1..]),
        Some("demo") => demo(),
        Some("overhead") => overhead::run(&args[1..]),
        Some("occupancy") => occupancy::run(&args[1..]),
        Some("coopdirect") => coopdirect::run(&args[1..]),
        Some("replay") => open().and_then(|rt| replay::run(&args[1..], &rt)),
        Some("transfer") => open().and_then(|rt| transfer::run(&args[1..], rt.device())),
        Some("vkprobe") => vkprobe::run(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tfwgpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn devices() -> Result<(), String> {
    let adapters = list_adapters();
    if adapters.is_empty() {
        return Err("no adapter found (install mesa-vulkan-drivers or a GPU driver)".into());
    }
    let chosen = tfwgpu_runtime::Selection::from_env()
        .and_then(|s| s.choose(&adapters))
        .map_err(|e| e.to_string())?;
    for a in &adapters {
        let mark = if chosen.first() == Some(&a.index) {
            " (selected)"
        } else if chosen.contains(&a.index) {
            " (visible)"
        } else {
            ""
        };
        println!("[{}] {}{}", a.index, a.name, mark);
        println!(
            "    backend {}, type {}, driver {} {}",
            a.backend, a.device_type, a.driver, a.driver_info
        );
        println!("    vendor {:#06x}, device {:#06x}", a.vendor, a.device);
        let l = &a.limits;
        println!(
            "    max_buffer_size {} MiB, max_storage_buffer_binding_size {} MiB, storage offset alignment {}",
            l.max_buffer_size >> 20,
            l.max_storage_buffer_binding_size >> 20,
            l.min_storage_buffer_offset_alignment
        );
        println!(
            "    workgroup: {} invocations, size {}x{}x{}, {} KiB shared; {} groups per dimension; subgroup {}..{}",
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroup_size_x,
            l.max_compute_workgroup_size_y,
            l.max_compute_workgroup_size_z,
            l.max_compute_workgroup_storage_size / 1024,
            l.max_compute_workgroups_per_dimension,
            a.subgroup_min_size,
            a.subgroup_max_size
        );
        if let Some(m) = a.device_memory {
            println!("    device-local memory: {} MiB", m >> 20);
        }
        println!("    features: {}", a.useful_features().join(", "));
    }
    Ok(())
}

/// `peerprobe [--all]`: per adapter, what it offers for transfers between devices without the
/// host (see the runtime's peer.rs), and the related Vulkan extensions it reports (`--all`:
/// every extension).
fn peerprobe(args: &[String]) -> Result<(), String> {
    let all = args.iter().any(|a| a == "--all");
    let related = [
        "external_memory",
        "external_semaphore",
        "external_fence",
        "timeline_semaphore",
        "dma_buf",
        "drm_format",
        "device_group",
    ];
    for (d, caps, exts) in tfwgpu_runtime::peer::probe_adapters() {
        println!(
            "[{}] {} ({}, {}, driver {} {})",
            d.index, d.name, d.backend, d.device_type, d.driver, d.driver_info
        );
        match caps {
            Some(c) => println!(
                "    peer: host memory import {} (minImportedHostPointerAlignment {}), OPAQUE_FD timeline semaphores {}{}",
                c.host_memory,
                c.host_align,
                c.timeline_fd,
                if c.missing.is_empty() {
                    String::new()
                } else {
                    format!("; missing: {}", c.missing.join(", "))
                }
            ),
            None => println!("    peer: not a Vulkan adapter"),
        }
        let mut shown: Vec<&String> = exts
            .iter()
            .filter(|e| all || related.iter().any(|r| e.contains(r)))
            .collect();
        shown.sort();
        println!(
            "    extensions ({} of {}): {}",
            shown.len(),
            exts.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

fn open() -> Result<Runtime, String> {
    let rt = Runtime::new().map_err(|e| e.to_string())?;
    let d = rt.device().description();
    eprintln!(
        "adapter: {} ({}, {}, driver {} {})",
        d.name, d.backend, d.device_type, d.driver, d.driver_info
    );
    Ok(rt)
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Largest relative error of sampled output entries against an f64 dot product (A stored
/// transposed, K x M, if `ta`; B stored N x K if `tb`).
#[allow(clippy::too_many_arguments)]
fn check_matmul(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
    rng: &mut StdRng,
) -> f64 {
    let mut worst = 0.0f64;
    // The four corners (the last, partial tiles) and 256 random elements.
    let corners = [(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)];
    for s in 0..corners.len() + 256 {
        let (i, j) = match corners.get(s) {
            Some(&c) => c,
            None => (rng.random_range(0..m), rng.random_range(0..n)),
        };
        let mut want = 0.0f64;
        let mut scale = 0.0f64;
        for p in 0..k {
            let x = if ta { a[p * m + i] } else { a[i * k + p] };
            let y = if tb { b[j * k + p] } else { b[p * n + j] };
            let t = x as f64 * y as f64;
            want += t;
            scale += t.abs();
        }
        let err = (c[i * n + j] as f64 - want).abs() / scale.max(f64::MIN_POSITIVE);
        worst = worst.max(if c[i * n + j].is_nan() {
            f64::INFINITY
        } else {
            err
        });
    }
    worst
}

struct MatmulResult {
    size: usize,
    median_ms: f64,
    min_ms: f64,
    gflops: f64,
    rel_err: f64,
    inner: usize,
}

/// `v` rounded to float16 (and back).
fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}

/// Times float32 MatMul of `size`^3: the median over `reps` samples of `inner` back-to-back
/// runs followed by one host wait, `inner` chosen so that a sample lasts ~25 ms (at most 500
/// runs). The runtime submits batches while the host records more, so the figure is the
/// device's throughput unless recording one run takes the host longer than the device.
#[allow(clippy::too_many_arguments)]
fn bench_matmul(
    dev: &Device,
    size: usize,
    reps: usize,
    tile: Option<&str>,
    ta: bool,
    tb: bool,
    dtype: DType,
    rng: &mut StdRng,
) -> Result<MatmulResult, String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let (m, k, n) = (size, size, size);
    let mut a = random(rng, m * k);
    let mut b = random(rng, k * n);
    let ta_shape = if ta { [k, m] } else { [m, k] };
    let tb_shape = if tb { [n, k] } else { [k, n] };
    let half = dtype == DType::F16;
    let (gpu_a, gpu_b) = if half {
        // The reference is the exact product of the f16-rounded inputs.
        a = round_f16(&a);
        b = round_f16(&b);
        let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        (
            dev.upload(&h(&a), &ta_shape).map_err(e)?,
            dev.upload(&h(&b), &tb_shape).map_err(e)?,
        )
    } else {
        (
            dev.upload(&a, &ta_shape).map_err(e)?,
            dev.upload(&b, &tb_shape).map_err(e)?,
        )
    };
    let mut attrs = Attrs::new()
        .with("T", AttrValue::Type(dtype))
        .with("transpose_a", AttrValue::Bool(ta))
        .with("transpose_b", AttrValue::Bool(tb));
    if let Some(t) = tile {
        attrs.set("_tfwgpu_tile", AttrValue::Str(t.to_string()));
    }
    let kernel = dev.kernel("MatMul", &attrs).map_err(e)?;
    let run = || {
        dev.run_kernel(kernel.as_ref(), &[Arg::from(&gpu_a), Arg::from(&gpu_b)])
            .map_err(e)
    };
    // Poison: fill the memory the checked output will likely take with NaN first.
    drop(dev.upload(&vec![f32::NAN; m * n], &[m * n]).map_err(e)?);
    let out = run()?;
    let got = if half {
        let h = out[0].download::<f16>().map_err(e)?;
        h.iter().map(|x| x.to_f32()).collect()
    } else {
        out[0].download::<f32>().map_err(e)?
    };
    let rel_err = check_matmul(&a, &b, &got, (m, k, n), ta, tb, rng);
    drop(out);
    // Calibrate: one run, then a few, to size the samples.
    let flops = 2.0 * (m * k * n) as f64;
    let t0 = Instant::now();
    for _ in 0..3 {
        drop(run()?);
    }
    dev.synchronize().map_err(e)?;
    let one = t0.elapsed().as_secs_f64() / 3.0;
    let inner = ((0.025 / one.max(1e-7)) as usize).clamp(1, 500);
    // Keep the GPU busy before timing: an idle H200 runs its SM clock at a fraction of the
    // full rate for the first few hundred ms of load (bench/NOTES-membound.md).
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < WARM_UP_S {
        for _ in 0..inner {
            drop(run()?);
        }
        dev.synchronize().map_err(e)?;
    }
    let mut samples = vec![];
    for _ in 0..reps.max(1) {
        dev.synchronize().map_err(e)?;
        let t0 = Instant::now();
        for _ in 0..inner {
            drop(run()?);
        }
        dev.synchronize().map_err(e)?;
        samples.push(t0.elapsed().as_secs_f64() / inner as f64);
    }
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    Ok(MatmulResult {
        size,
        median_ms: median * 1e3,
        min_ms: samples[0] * 1e3,
        gflops: flops / median / 1e9,
        rel_err,
        inner,
    })
}

fn matmul(args: &[String]) -> Result<(), String> {
    let sizes: Vec<usize> = flag(args, "--sizes")
        .unwrap_or("512,1024,4096")
        .split(',')
        .map(|s| s.trim().parse().map_err(|_| format!("bad size {s:?}")))
        .collect::<Result<_, _>>()?;
    let reps: usize = flag(args, "--reps")
        .unwrap_or("5")
        .parse()
        .map_err(|_| "bad --reps")?;
    let tiles: Vec<&str> = flag(args, "--tiles").unwrap_or("auto").split(',').collect();
    let (ta, tb) = match flag(args, "--transpose").unwrap_or("none") {
        "none" => (false, false),
        "a" => (true, false),
        "b" => (false, true),
        "ab" => (true, true),
        t => return Err(format!("bad --transpose {t:?} (none, a, b or ab)")),
    };
    let dtype = match flag(args, "--dtype").unwrap_or("f32") {
        "f32" | "float32" => DType::F32,
        "f16" | "float16" => DType::F16,
        t => return Err(format!("bad --dtype {t:?} (f32 or f16)")),
    };
    let reduced = args.iter().any(|a| a == "--reduced");
    if reduced {
        // SAFETY: set before the runtime (or any other thread) exists.
        unsafe { std::env::set_var("TFWGPU_ALLOW_REDUCED_PRECISION", "1") };
    }
    let dname = match (dtype, reduced) {
        (DType::F16, _) => "float16",
        (_, true) => "float32-reduced",
        _ => "float32",
    };
    let rt = open()?;
    let dev = rt.device();
    let mut rng = StdRng::seed_from_u64(7);
    println!(
        "{:>6} {:>14} {:>10} {:>10} {:>10} {:>8} {:>6}",
        "size", "tile", "median ms", "min ms", "GFLOP/s", "rel err", "inner"
    );
    let mut rows = vec![];
    // (size, tile, median ms, GFLOP/s) of each case that ran.
    let mut ours: Vec<(usize, &str, f64, f64)> = vec![];
    for &s in &sizes {
        for &t in &tiles {
            let tile = (t != "auto").then_some(t);
            // Warm-up (compiles the pipeline).
            if let Err(err) = bench_matmul(dev, s.min(64), 1, tile, ta, tb, dtype, &mut rng)
                .and_then(|_| bench_matmul(dev, s, reps, tile, ta, tb, dtype, &mut rng))
                .map(|r| {
                    println!(
                        "{:>6} {:>14} {:>10.4} {:>10.4} {:>10.1} {:>8.1e} {:>6}",
                        r.size, t, r.median_ms, r.min_ms, r.gflops, r.rel_err, r.inner
                    );
                    ours.push((s, t, r.median_ms, r.gflops));
                    rows.push(
                        json!({"op": "MatMul", "dtype": dname, "m": s, "n": s, "k": s,
                        "transpose_a": ta, "transpose_b": tb, "tile": t,
                        "median_ms": r.median_ms, "min_ms": r.min_ms, "gflops": r.gflops,
                        "rel_err": r.rel_err, "inner": r.inner, "reps": reps}),
                    );
                })
            {
                println!("{s:>6} {t:>14} failed: {err}");
            }
        }
    }
    let d = dev.description();
    let mut doc = json!({
        "adapter": d.name, "backend": d.backend, "device_type": d.device_type,
        "driver": format!("{} {}", d.driver, d.driver_info), "results": rows,
    });
    if let Some(python) = torch_python(args) {
        eprintln!("running PyTorch ({python} bench/torch_ref.py) on the same sizes...");
        match torchref::run(&python, &sizes, (ta, tb), reps.max(3)) {
            Ok(t) => {
                print_torch_table(&ours, &t, dtype, reduced, (ta, tb));
                doc["torch"] = t;
            }
            Err(e) => println!("PyTorch reference not run: {e}"),
        }
    }
    let path = flag(args, "--json").unwrap_or("bench-matmul.json");
    std::fs::write(path, serde_json::to_string_pretty(&doc).expect("json"))
        .map_err(|e| format!("{path}: {e}"))?;
    eprintln!("wrote {path}");
    Ok(())
}

/// With `--torch`: the Python that runs the PyTorch reference (`--python`, else
/// `TFWGPU_TORCH_PYTHON`, else `python3`).
fn torch_python(args: &[String]) -> Option<String> {
    args.iter().any(|a| a == "--torch").then(|| {
        flag(args, "--python")
            .map(str::to_string)
            .or_else(|| std::env::var("TFWGPU_TORCH_PYTHON").ok())
            .unwrap_or_else(|| "python3".to_string())
    })
}

/// `matmul --torch`: our figures beside PyTorch's (torch_ref.py's document `t`) per size and
/// tile. The ratio is PyTorch's time over ours (> 1: we are faster) against PyTorch in the
/// mode ours is compared with: float32 with TF32 off (exact float32 arithmetic) for our float32,
/// float16 for our float16 and TF32 for our reduced-precision float32 (float16 tensor cores).
fn print_torch_table(
    ours: &[(usize, &str, f64, f64)],
    t: &serde_json::Value,
    dtype: DType,
    reduced: bool,
    (ta, tb): (bool, bool),
) {
    let vs = match (dtype, reduced) {
        (DType::F16, _) => "f16",
        (_, true) => "tf32",
        _ => "f32",
    };
    println!(
        "PyTorch {} (CUDA {}) on {}, TFLOP/s; ratio = PyTorch {vs} time / ours:",
        t["torch"].as_str().unwrap_or("?"),
        t["cuda"].as_str().unwrap_or("?"),
        t["device"].as_str().unwrap_or("?")
    );
    println!(
        "{:>6} {:>14} {:>10} {:>9} {:>9} {:>9} {:>8} {:>11}",
        "size", "tile", "ours", "torch f32", "tf32", "f16", "ratio", "goal"
    );
    for &(size, tile, ms, gflops) in ours {
        let name = torchref::case_name(size, ta, tb);
        let at = |mode| torchref::figure(t, &name, None, mode);
        let ratio = at(vs).map(|(tms, _)| tms / ms);
        // The goal judges the kernel's own choice, not a forced tile.
        let exact = dtype == DType::F32 && !reduced && tile == "auto";
        let goal = torchref::goal(size).filter(|_| exact);
        println!(
            "{size:>6} {tile:>14} {:>10.1} {:>9} {:>9} {:>9} {:>8} {:>11}",
            gflops / 1e3,
            torchref::cell(at("f32")),
            torchref::cell(at("tf32")),
            torchref::cell(at("f16")),
            torchref::ratio_cell(ratio),
            torchref::goal_cell(goal, ratio),
        );
    }
}

/// `conv --torch`: our rows beside cuDNN's (torch_conv.py's document `t`): TFLOP/s with TF32
/// off and on, the ratio of times against TF32 off for our float32 (TF32 on for float16 and
/// reduced precision), and issue 6's goal (>= 0.5x cuDNN float32) for our float32 rows of the
/// kernels' own choice.
fn print_torch_conv_table(
    ours: &[(&str, &str, &str, f64, f64)],
    t: &serde_json::Value,
    dtype: DType,
    reduced: bool,
) {
    let exact = dtype == DType::F32 && !reduced;
    let vs = if exact { "f32" } else { "tf32" };
    println!(
        "PyTorch {} (CUDA {}, cuDNN {}) on {}, TFLOP/s; ratio = PyTorch {vs} time / ours:",
        t["torch"].as_str().unwrap_or("?"),
        t["cuda"].as_str().unwrap_or("?"),
        t["cudnn"].as_i64().unwrap_or(0),
        t["device"].as_str().unwrap_or("?")
    );
    println!(
        "{:>24} {:>10} {:>14} {:>8} {:>9} {:>8} {:>7} {:>12}",
        "case", "op", "tile", "ours", "torch f32", "tf32", "ratio", "goal"
    );
    for &(case, op, tile, ms, tflops) in ours {
        let at = |mode| torchref::figure(t, case, Some(op), mode);
        let ratio = at(vs).map(|(tms, _)| tms / ms);
        let goal = Some(0.5).filter(|_| exact && tile == "auto");
        println!(
            "{case:>24} {op:>10} {tile:>14} {tflops:>8.1} {:>9} {:>8} {:>7} {:>12}",
            torchref::cell(at("f32")),
            torchref::cell(at("tf32")),
            torchref::ratio_cell(ratio),
            torchref::goal_cell(goal, ratio),
        );
    }
}

/// One convolution case: input [n, h, w, c] (NHWC), filter [r, r, c, k] (HWIO; depthwise:
/// [r, r, c, 1], output channels k = c), stride `stride` in both spatial dimensions.
struct ConvCase {
    name: &'static str,
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    r: usize,
    k: usize,
    stride: usize,
    same: bool,
    depthwise: bool,
}

const fn cc(
    name: &'static str,
    n: usize,
    hw: usize,
    c: usize,
    r: usize,
    k: usize,
    stride: usize,
) -> ConvCase {
    ConvCase {
        name,
        n,
        h: hw,
        w: hw,
        c,
        r,
        k,
        stride,
        same: true,
        depthwise: false,
    }
}

const CONV_CASES: &[ConvCase] = &[
    ConvCase {
        name: "demo1",
        n: 128,
        h: 28,
        w: 28,
        c: 1,
        r: 3,
        k: 32,
        stride: 1,
        same: false,
        depthwise: false,
    },
    ConvCase {
        name: "demo2",
        n: 128,
        h: 13,
        w: 13,
        c: 32,
        r: 3,
        k: 64,
        stride: 1,
        same: false,
        depthwise: false,
    },
    cc("resnet", 8, 56, 64, 3, 64, 1),
    // ResNet-50 (v1.5) layer shapes, NHWC, SAME padding.
    cc("r50_conv1", 32, 224, 3, 7, 64, 2),
    cc("r50_56_1x1_64_64", 32, 56, 64, 1, 64, 1),
    cc("r50_56_3x3_64_64", 32, 56, 64, 3, 64, 1),
    cc("r50_56_3x3_64_64_b64", 64, 56, 64, 3, 64, 1),
    cc("r50_56_1x1_64_256", 32, 56, 64, 1, 256, 1),
    cc("r50_56_1x1_256_64", 32, 56, 256, 1, 64, 1),
    cc("r50_56_1x1_256_128_s2", 32, 56, 256, 1, 128, 2),
    cc("r50_56_3x3_128_128_s2", 32, 56, 128, 3, 128, 2),
    cc("r50_28_3x3_128_128", 32, 28, 128, 3, 128, 1),
    cc("r50_28_1x1_512_128", 32, 28, 512, 1, 128, 1),
    cc("r50_14_3x3_256_256", 32, 14, 256, 3, 256, 1),
    cc("r50_14_3x3_256_256_b64", 64, 14, 256, 3, 256, 1),
    cc("r50_14_1x1_1024_256", 32, 14, 1024, 1, 256, 1),
    cc("r50_7_3x3_512_512", 32, 7, 512, 3, 512, 1),
    cc("r50_7_1x1_2048_512", 32, 7, 2048, 1, 512, 1),
    // The plain products (1x1) with the M, N and K of the 3x3 layers' forward products
    // (M = N*OH*OW, K = 9*C, N = K): the window addressing's cost, by difference.
    cc("gemm_28_1x1_1152_128", 32, 28, 1152, 1, 128, 1),
    cc("gemm_14_1x1_2304_256", 32, 14, 2304, 1, 256, 1),
    cc("gemm_7_1x1_4608_512", 32, 7, 4608, 1, 512, 1),
    ConvCase {
        depthwise: true,
        ..cc("dw_56_3x3_128", 32, 56, 128, 3, 128, 1)
    },
    ConvCase {
        depthwise: true,
        ..cc("dw_14_3x3_512", 32, 14, 512, 3, 512, 1)
    },
    cc("wide", 32, 28, 128, 3, 128, 1),
];

/// Named lists of cases for `--cases`.
fn conv_case_group(name: &str) -> Option<Vec<&'static str>> {
    let r50: Vec<&str> = CONV_CASES
        .iter()
        .filter(|c| c.name.starts_with("r50_") || c.name.starts_with("dw_"))
        .map(|c| c.name)
        .collect();
    match name {
        "resnet50" => Some(r50),
        "all" => Some(CONV_CASES.iter().map(|c| c.name).collect()),
        _ => None,
    }
}

impl ConvCase {
    /// Output (rows, columns) and padding before (rows = columns), as TensorFlow's
    /// GetWindowedOutputSize computes them.
    fn out_hw(&self) -> (usize, usize, usize) {
        let s = self.stride;
        if self.same {
            let oh = self.h.div_ceil(s);
            let ow = self.w.div_ceil(s);
            let need = ((oh - 1) * s + self.r).saturating_sub(self.h);
            (oh, ow, need / 2)
        } else {
            ((self.h - self.r) / s + 1, (self.w - self.r) / s + 1, 0)
        }
    }

    fn filter_shape(&self) -> [usize; 4] {
        if self.depthwise {
            [self.r, self.r, self.c, 1]
        } else {
            [self.r, self.r, self.c, self.k]
        }
    }

    /// Multiply-adds of one forward pass (the same for both gradients).
    fn flops(&self) -> f64 {
        let (oh, ow, _) = self.out_hw();
        let per_out = if self.depthwise { 1 } else { self.c };
        2.0 * (self.n * oh * ow * self.k * self.r * self.r * per_out) as f64
    }

    fn shape_text(&self) -> String {
        format!(
            "{}x{}x{}x{} {}x{}x{}x{} s{} {}{}",
            self.n,
            self.h,
            self.w,
            self.c,
            self.r,
            self.r,
            self.c,
            if self.depthwise { 1 } else { self.k },
            self.stride,
            if self.same { "SAME" } else { "VALID" },
            if self.depthwise { " depthwise" } else { "" }
        )
    }
}

/// Largest relative error of 256 sampled results of `op` against f64 sums.
fn check_conv(
    c: &ConvCase,
    op: &str,
    (x, f, dy): (&[f32], &[f32], &[f32]),
    got: &[f32],
    rng: &mut StdRng,
) -> f64 {
    let (oh, ow, pad) = c.out_hw();
    let st = c.stride;
    let xi = |n: usize, y: i64, xx: i64, ch: usize| -> Option<usize> {
        (y >= 0 && xx >= 0 && (y as usize) < c.h && (xx as usize) < c.w)
            .then(|| ((n * c.h + y as usize) * c.w + xx as usize) * c.c + ch)
    };
    let [_, _, fc, fk] = c.filter_shape();
    let fi = |r: usize, s: usize, ch: usize, k: usize| {
        if c.depthwise {
            (r * c.r + s) * fc + ch
        } else {
            ((r * c.r + s) * fc + ch) * fk + k
        }
    };
    // Input channels feeding output channel k.
    let chans = |k: usize| if c.depthwise { k..k + 1 } else { 0..c.c };
    let outs = |ch: usize| if c.depthwise { ch..ch + 1 } else { 0..c.k };
    let mut worst = 0.0f64;
    for _ in 0..256 {
        let (mut want, mut scale) = (0.0f64, 0.0f64);
        let mut add = |a: f32, b: f32| {
            let t = a as f64 * b as f64;
            want += t;
            scale += t.abs();
        };
        let idx = match op {
            "fwd" => {
                let (n, oy, ox, k) = (
                    rng.random_range(0..c.n),
                    rng.random_range(0..oh),
                    rng.random_range(0..ow),
                    rng.random_range(0..c.k),
                );
                for r in 0..c.r {
                    for s in 0..c.r {
                        for ch in chans(k) {
                            let y = (oy * st + r) as i64 - pad as i64;
                            let xx = (ox * st + s) as i64 - pad as i64;
                            if let Some(i) = xi(n, y, xx, ch) {
                                add(x[i], f[fi(r, s, ch, k)]);
                            }
                        }
                    }
                }
                ((n * oh + oy) * ow + ox) * c.k + k
            }
            "bwd_input" => {
                let (n, y, xx, ch) = (
                    rng.random_range(0..c.n),
                    rng.random_range(0..c.h),
                    rng.random_range(0..c.w),
                    rng.random_range(0..c.c),
                );
                for r in 0..c.r {
                    for s in 0..c.r {
                        let ty = (y + pad) as i64 - r as i64;
                        let tx = (xx + pad) as i64 - s as i64;
                        if ty < 0 || tx < 0 || ty % st as i64 != 0 || tx % st as i64 != 0 {
                            continue;
                        }
                        let (oy, ox) = (ty as usize / st, tx as usize / st);
                        if oy >= oh || ox >= ow {
                            continue;
                        }
                        for k in outs(ch) {
                            let d = ((n * oh + oy) * ow + ox) * c.k + k;
                            add(dy[d], f[fi(r, s, ch, k)]);
                        }
                    }
                }
                ((n * c.h + y) * c.w + xx) * c.c + ch
            }
            _ => {
                let (r, s, ch) = (
                    rng.random_range(0..c.r),
                    rng.random_range(0..c.r),
                    rng.random_range(0..c.c),
                );
                let k = if c.depthwise {
                    ch
                } else {
                    rng.random_range(0..c.k)
                };
                for n in 0..c.n {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let y = (oy * st + r) as i64 - pad as i64;
                            let xx = (ox * st + s) as i64 - pad as i64;
                            if let Some(i) = xi(n, y, xx, ch) {
                                add(x[i], dy[((n * oh + oy) * ow + ox) * c.k + k]);
                            }
                        }
                    }
                }
                fi(r, s, ch, k)
            }
        };
        let err = (got[idx] as f64 - want).abs() / scale.max(f64::MIN_POSITIVE);
        worst = worst.max(if got[idx].is_nan() {
            f64::INFINITY
        } else {
            err
        });
    }
    worst
}

/// One timed sample of `time_runs`: wall time per run, the host's recording time per run
/// (until the last run was recorded, before the wait), the allocator's heaps after it.
struct Sample {
    ms: f64,
    record_ms: f64,
    heaps: u64,
}

/// Seconds of back-to-back runs before a conv case's timings.
const WARM_UP_S: f64 = 0.3;

/// Times `run`: a warm-up (one run, then WARM_UP_S of runs), then the median over `reps` samples of `inner` back-to-back
/// runs and one host wait (`inner` sized for ~`target` seconds per sample, at most 200).
/// Returns (median, inner, every sample in the order taken).
fn time_runs(
    dev: &Device,
    reps: usize,
    target: f64,
    run: &dyn Fn() -> Result<(), String>,
) -> Result<(f64, usize, Vec<Sample>), String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    run()?;
    dev.synchronize().map_err(e)?;
    // Warm-up: ~0.3 s of back-to-back runs. A GPU left idle (the host checking the previous
    // case, uploading the next one's inputs) drops its clocks and raises them again only under
    // sustained load: on the H200 the SM clock stayed at 345-1140 MHz instead of 1980 for ~15 s
    // of the conv table (every kernel 4-5x slower by its own timestamps; conv request 2's
    // nvidia-smi log).
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < WARM_UP_S {
        for _ in 0..4 {
            run()?;
        }
        dev.synchronize().map_err(e)?;
    }
    let t0 = Instant::now();
    run()?;
    dev.synchronize().map_err(e)?;
    let one = t0.elapsed().as_secs_f64();
    let inner = ((target / one.max(1e-7)) as usize).clamp(1, 200);
    // Untimed samples of `inner` runs until the allocator stops growing (at most 4): a sample
    // keeps up to `inner` outputs in flight where the warm-up kept 4, and the heaps that takes
    // are created then (a 256 MiB buffer each, and a clear of each range on first use: on the
    // H200 0.1-0.5 ms of host time per run while it lasted, conv16 request 1). A program
    // running the op repeatedly (a training step) pays that once.
    for _ in 0..4 {
        let heaps = dev.allocator().stats().heaps;
        for _ in 0..inner {
            run()?;
        }
        dev.synchronize().map_err(e)?;
        if dev.allocator().stats().heaps == heaps {
            break;
        }
    }
    let mut samples = vec![];
    let mut taken = vec![];
    for _ in 0..reps.max(1) {
        dev.synchronize().map_err(e)?;
        let t0 = Instant::now();
        for _ in 0..inner {
            run()?;
        }
        let recorded = t0.elapsed().as_secs_f64() / inner as f64;
        dev.synchronize().map_err(e)?;
        samples.push(t0.elapsed().as_secs_f64() / inner as f64);
        taken.push(Sample {
            ms: samples[samples.len() - 1] * 1e3,
            record_ms: recorded * 1e3,
            heaps: dev.allocator().stats().heaps,
        });
    }
    samples.sort_by(f64::total_cmp);
    Ok((samples[samples.len() / 2], inner, taken))
}

/// GPU time of one run from timestamps: from the first command's start to the last one's end
/// (`span_ms`), the time some command ran (`busy_ms`), and per pipeline label the summed
/// command time and count, per run.
struct GpuTime {
    span_ms: f64,
    busy_ms: f64,
    kernels: Vec<(String, f64, f64)>,
}

/// `inner` more runs with GPU timestamps on (apart from the wall-clock samples: the
/// timestamps add work); None where the device cannot time dispatches.
fn gpu_time_conv(
    dev: &Device,
    inner: usize,
    run: &dyn Fn() -> Result<(), String>,
) -> Result<Option<GpuTime>, String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let ex = dev.exec();
    if ex.set_timing(true).is_err() {
        return Ok(None);
    }
    let timed = (|| {
        ex.take_timings().map_err(e)?;
        for _ in 0..inner.max(1) {
            run()?;
        }
        ex.take_timings().map_err(e)
    })();
    ex.set_timing(false).map_err(e)?;
    let t = timed?;
    if t.is_empty() {
        return Ok(None);
    }
    let runs = inner.max(1) as f64;
    let s = tfwgpu_runtime::TimingSummary::of(&t);
    let mut kernels: Vec<(String, f64, f64)> = vec![];
    for d in &t {
        let ms = (d.end_ns - d.start_ns) / 1e6;
        match kernels.iter_mut().find(|k| *k.0 == *d.label) {
            Some(k) => {
                k.1 += ms;
                k.2 += 1.0;
            }
            None => kernels.push((d.label.to_string(), ms, 1.0)),
        }
    }
    for k in &mut kernels {
        k.1 /= runs;
        k.2 /= runs;
    }
    Ok(Some(GpuTime {
        span_ms: s.span_ns / 1e6 / runs,
        busy_ms: s.busy_ns / 1e6 / runs,
        kernels,
    }))
}

fn conv(args: &[String]) -> Result<(), String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let mut cases: Vec<&str> = vec![];
    for name in flag(args, "--cases")
        .unwrap_or("demo1,demo2,resnet")
        .split(',')
    {
        match conv_case_group(name) {
            Some(list) => cases.extend(list),
            None => cases.push(name),
        }
    }
    let ops: Vec<&str> = flag(args, "--ops")
        .unwrap_or("fwd,bwd_input,bwd_filter")
        .split(',')
        .collect();
    let tiles: Vec<&str> = flag(args, "--tiles").unwrap_or("auto").split(',').collect();
    let reps: usize = flag(args, "--reps")
        .unwrap_or("3")
        .parse()
        .map_err(|_| "bad --reps")?;
    let target: f64 = flag(args, "--sample-ms")
        .unwrap_or("100")
        .parse::<f64>()
        .map_err(|_| "bad --sample-ms")?
        / 1e3;
    let dtype = match flag(args, "--dtype").unwrap_or("f32") {
        "f32" | "float32" => DType::F32,
        "f16" | "float16" => DType::F16,
        t => return Err(format!("bad --dtype {t:?} (f32 or f16)")),
    };
    let reduced = args.iter().any(|a| a == "--reduced");
    if reduced {
        // SAFETY: set before the runtime (or any other thread) exists.
        unsafe { std::env::set_var("TFWGPU_ALLOW_REDUCED_PRECISION", "1") };
    }
    // Relative error allowed (to the sum of |products|): f16 rounding of the output or of
    // the inputs (2^-11 each) dominates the accumulation's.
    let max_err = if dtype == DType::F16 || reduced {
        1e-3
    } else {
        1e-5
    };
    let half = dtype == DType::F16;
    let rt = open()?;
    let dev = rt.device();
    let mut rng = StdRng::seed_from_u64(11);
    let no_gpu_time = args.iter().any(|a| a == "--no-gpu-time");
    let detail = args.iter().any(|a| a == "--detail");
    println!(
        "{:>24} {:>10} {:>14} {:>10} {:>8} {:>8} {:>6} {:>9} {:>9}",
        "case", "op", "tile", "median ms", "TFLOP/s", "rel err", "inner", "gpu ms", "busy ms"
    );
    let mut rows = vec![];
    // (case, op, tile, ms, TFLOP/s) of each row that ran.
    let mut ours: Vec<(&str, &str, &str, f64, f64)> = vec![];
    let mut wrong = 0usize;
    for &name in &cases {
        let c = CONV_CASES
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("no conv case {name:?}"))?;
        let (oh, ow, _) = c.out_hw();
        let fshape = c.filter_shape();
        let mut x = random(&mut rng, c.n * c.h * c.w * c.c);
        let mut f = random(&mut rng, fshape.iter().product());
        let mut dy = random(&mut rng, c.n * oh * ow * c.k);
        if half {
            // The reference is then exact for the f16 inputs.
            (x, f, dy) = (round_f16(&x), round_f16(&f), round_f16(&dy));
        }
        let up = |v: &[f32], shape: &[usize]| {
            if half {
                let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                dev.upload(&h, shape).map_err(e)
            } else {
                dev.upload(v, shape).map_err(e)
            }
        };
        let gx = up(&x, &[c.n, c.h, c.w, c.c])?;
        let gf = up(&f, &fshape)?;
        let gdy = up(&dy, &[c.n, oh, ow, c.k])?;
        let xs =
            tfwgpu_runtime::HostTensor::vec_i32(&[c.n as i32, c.h as i32, c.w as i32, c.c as i32]);
        let fs = tfwgpu_runtime::HostTensor::vec_i32(&fshape.map(|d| d as i32));
        let flops = c.flops();
        let prefix = if c.depthwise {
            "DepthwiseConv2dNative"
        } else {
            "Conv2D"
        };
        for &op in &ops {
            for &t in &tiles {
                let st = c.stride as i64;
                let mut attrs = Attrs::new()
                    .with("T", AttrValue::Type(dtype))
                    .with("strides", AttrValue::Ints(vec![1, st, st, 1]))
                    .with(
                        "padding",
                        AttrValue::Str(if c.same { "SAME" } else { "VALID" }.into()),
                    );
                if t != "auto" {
                    attrs.set("_tfwgpu_tile", AttrValue::Str(t.into()));
                }
                let (tf_op, inputs, out_len): (String, Vec<Arg>, usize) = match op {
                    "fwd" => (
                        prefix.to_string(),
                        vec![Arg::from(&gx), Arg::from(&gf)],
                        dy.len(),
                    ),
                    "bwd_input" => (
                        format!("{prefix}BackpropInput"),
                        vec![Arg::from(&xs), Arg::from(&gf), Arg::from(&gdy)],
                        x.len(),
                    ),
                    "bwd_filter" => (
                        format!("{prefix}BackpropFilter"),
                        vec![Arg::from(&gx), Arg::from(&fs), Arg::from(&gdy)],
                        f.len(),
                    ),
                    o => return Err(format!("bad op {o:?} (fwd, bwd_input, bwd_filter)")),
                };
                let kernel = dev.kernel(&tf_op, &attrs).map_err(e)?;
                let run = || dev.run_kernel(kernel.as_ref(), &inputs).map_err(e);
                let result = (|| {
                    // Poison the memory the checked output will likely take.
                    drop(
                        dev.upload(&vec![f32::NAN; out_len], &[out_len])
                            .map_err(e)?,
                    );
                    let out = run()?;
                    let got = if half {
                        let h = out[0].download::<f16>().map_err(e)?;
                        h.iter().map(|x| x.to_f32()).collect()
                    } else {
                        out[0].download::<f32>().map_err(e)?
                    };
                    let err = check_conv(c, op, (&x, &f, &dy), &got, &mut rng);
                    drop(out);
                    let (med, inner, taken) = time_runs(dev, reps, target, &|| run().map(drop))?;
                    let gpu = if no_gpu_time {
                        None
                    } else {
                        gpu_time_conv(dev, inner.min(50), &|| run().map(drop))?
                    };
                    Ok::<_, String>((med, err, inner, gpu, taken))
                })();
                match result {
                    Ok((med, err, inner, gpu, taken)) => {
                        let (gpu_ms, busy_ms) = gpu
                            .as_ref()
                            .map(|g| (g.span_ms, g.busy_ms))
                            .unwrap_or((f64::NAN, f64::NAN));
                        println!(
                            "{:>24} {:>10} {:>14} {:>10.4} {:>8.2} {:>8.1e} {:>6} {:>9.4} {:>9.4}",
                            c.name,
                            op,
                            t,
                            med * 1e3,
                            flops / med / 1e12,
                            err,
                            inner,
                            gpu_ms,
                            busy_ms
                        );
                        if detail && let Some(g) = &gpu {
                            for (label, ms, n) in &g.kernels {
                                println!("{:>40} {:>9.4} ms x{n}  {label}", "", ms);
                            }
                        }
                        let kernels: Vec<serde_json::Value> = gpu
                            .as_ref()
                            .map(|g| {
                                g.kernels
                                    .iter()
                                    .map(|(l, ms, n)| json!({"label": l, "ms": ms, "count": n}))
                                    .collect()
                            })
                            .unwrap_or_default();
                        ours.push((c.name, op, t, med * 1e3, flops / med / 1e12));
                        rows.push(json!({"case": c.name, "op": op, "shape": c.shape_text(),
                            "dtype": if half { "f16" } else if reduced { "f32-reduced" } else { "f32" }, "impl": "tfwgpu", "tile": t,
                            "ms": med * 1e3, "tflops": flops / med / 1e12,
                            "rel_err": err, "inner": inner, "reps": reps,
                            "samples_ms": taken.iter().map(|t| t.ms).collect::<Vec<_>>(),
                            "samples_record_ms": taken.iter().map(|t| t.record_ms).collect::<Vec<_>>(),
                            "samples_heaps": taken.iter().map(|t| t.heaps).collect::<Vec<_>>(),
                            "gpu_ms": gpu.as_ref().map(|g| g.span_ms),
                            "gpu_busy_ms": gpu.as_ref().map(|g| g.busy_ms),
                            "gpu_tflops": gpu.as_ref().map(|g| flops / g.busy_ms / 1e9),
                            "unix_s": std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_secs_f64())
                                .unwrap_or(0.0),
                            "heaps": dev.allocator().stats().heaps,
                            "reserved_mb": dev.allocator().stats().bytes_reserved >> 20,
                            "kernels": kernels}));
                        if err > max_err {
                            // Reported and counted; the other rows still run (a wrong tile
                            // must not cost the rest of a device call).
                            println!(
                                "{:>24} {op:>10} {t:>14} WRONG: relative error {err:.1e} against \
                                 the reference (> {max_err:.0e})",
                                c.name
                            );
                            wrong += 1;
                        }
                    }
                    Err(err) => println!("{:>24} {op:>10} {t:>14} failed: {err}", c.name),
                }
            }
        }
        write_conv_json(dev, args, &rows, None)?;
    }
    let mut torch = None;
    if let Some(python) = torch_python(args) {
        eprintln!("running PyTorch ({python} bench/torch_conv.py) on the same cases...");
        match torchref::run_conv(&python, &cases, &ops, reps.max(3)) {
            Ok(t) => {
                print_torch_conv_table(&ours, &t, dtype, reduced);
                torch = Some(t);
            }
            Err(e) => println!("PyTorch reference not run: {e}"),
        }
    }
    write_conv_json(dev, args, &rows, torch.as_ref())?;
    eprintln!(
        "wrote {}",
        flag(args, "--json").unwrap_or("bench-conv.json")
    );
    if wrong > 0 {
        return Err(format!(
            "{wrong} row(s) over the relative error bound {max_err:.0e}"
        ));
    }
    Ok(())
}

/// Writes the rows so far (after every case, so that a run cut short keeps what it measured).
fn write_conv_json(
    dev: &Device,
    args: &[String],
    rows: &[serde_json::Value],
    torch: Option<&serde_json::Value>,
) -> Result<(), String> {
    let d = dev.description();
    let mut doc = json!({
        "adapter": d.name, "backend": d.backend, "device_type": d.device_type,
        "driver": format!("{} {}", d.driver, d.driver_info), "results": rows,
    });
    if let Some(t) = torch {
        doc["torch"] = t.clone();
    }
    let path = flag(args, "--json").unwrap_or("bench-conv.json");
    std::fs::write(path, serde_json::to_string_pretty(&doc).expect("json"))
        .map_err(|e| format!("{path}: {e}"))
}

fn demo() -> Result<(), String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let rt = open()?;
    let dev = rt.device();
    println!("tfwgpu runtime on {}", dev.description().name);
    let mut rng = StdRng::seed_from_u64(1);
    // A small dense layer: relu(x @ w + b), checked against the CPU.
    let (batch, inp, out) = (64, 784, 128);
    let x = random(&mut rng, batch * inp);
    let w = random(&mut rng, inp * out);
    let b = random(&mut rng, out);
    let t0 = Instant::now();
    let tx = dev.upload(&x, &[batch, inp]).map_err(e)?;
    let tw = dev.upload(&w, &[inp, out]).map_err(e)?;
    let tb = dev.upload(&b, &[out]).map_err(e)?;
    let y = dev
        .run("MatMul", &Attrs::new(), &[Arg::from(&tx), Arg::from(&tw)])
        .map_err(e)?;
    let y = dev
        .run("AddV2", &Attrs::new(), &[Arg::from(&y[0]), Arg::from(&tb)])
        .map_err(e)?;
    let y = dev
        .run("Relu", &Attrs::new(), &[Arg::from(&y[0])])
        .map_err(e)?;
    let s = dev
        .run(
            "Sum",
            &Attrs::new(),
            &[
                Arg::from(&y[0]),
                Arg::from(&tfwgpu_runtime::HostTensor::vec_i32(&[1])),
            ],
        )
        .map_err(e)?;
    let got = s[0].download::<f32>().map_err(e)?;
    let elapsed = t0.elapsed();
    let mut worst = 0.0f64;
    for r in 0..batch {
        let mut row_sum = 0.0f64;
        for j in 0..out {
            let mut acc = b[j] as f64;
            for p in 0..inp {
                acc += x[r * inp + p] as f64 * w[p * out + j] as f64;
            }
            row_sum += acc.max(0.0);
        }
        worst = worst.max((got[r] as f64 - row_sum).abs() / row_sum.abs().max(1.0));
    }
    println!(
        "dense layer relu(x @ w + b) summed per row, batch {batch}: {elapsed:?}, max rel. error vs CPU {worst:.1e}"
    );
    let st = dev.memory_stats();
    let ex = dev.exec_stats();
    let cache = dev.cache_stats();
    println!(
        "memory: {} KiB in use, peak {} KiB, {} heap(s); {} dispatches in {} submits; {} pipelines compiled",
        st.bytes_in_use / 1024,
        st.peak_bytes_in_use / 1024,
        st.heaps,
        ex.dispatches,
        ex.submits,
        cache.misses
    );
    if worst > 1e-4 {
        return Err(format!(
            "the GPU result differs from the CPU (rel. error {worst:.1e})"
        ));
    }
    Ok(())
}
