//! `tfwgpu-bench ops`: MatMul / BatchMatMul and the memory-bound kernels (elementwise,
//! reductions, softmax, batch-norm, max-pool) beside the copy bandwidth of the same run.
//!
//! Every case runs on fresh random inputs into output buffers poisoned with 0xFFFFFFFF, is
//! checked against a CPU reference computed here (f64 accumulation), then timed with
//! `cases::time_runs`. Case names are built from the shapes by the same rules as in
//! `bench/torch_ref.py`, so the two JSON files line up in `bench/compare.py`.

use rand::{SeedableRng, rngs::StdRng};
use tfwgpu_runtime::{
    Arg, AttrValue, Attrs, DType, Device, DeviceRef, HostTensor, Kernel, KernelContext, Operand,
    PipelineKey, TensorDesc, f16,
    kernel::grid_1d,
    kernel_manager::{Checks, ShaderSource},
};

#[path = "copylab.rs"]
pub(crate) mod copylab;

use crate::cases::{
    Res, Row, Timing, Work, err, flag, poisoned_outputs, random, record, rel_err, time_runs,
    write_json,
};

#[derive(Clone, Copy, PartialEq)]
enum CopyHow {
    /// The runtime's device-to-device copy (`Device::copy`: a buffer copy between two
    /// buffers, the runtime's word-copy shader inside one heap).
    Buffer,
    /// A plain compute copy, one u32 per invocation.
    U32,
    /// A plain compute copy, one vec4<u32> per invocation.
    Vec4,
    /// Four vec4<u32> per invocation (all four loads issued before the stores), a quarter of
    /// the invocations: more bytes in flight per invocation, fewer workgroups to launch.
    Vec4x4,
    /// Vec4x4 without wgpu's runtime bounds checks (every index is checked against p.n).
    Vec4x4Trusted,
}

#[derive(Clone)]
enum Kind {
    /// `batch == 0`: MatMul; else BatchMatMulV2 over `batch` matrices.
    MatMul {
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        ta: bool,
        tb: bool,
    },
    /// AddV2 / Mul of a [rows, cols] tensor and a [rows, cols] or [cols] one.
    Binary {
        op: &'static str,
        rows: usize,
        cols: usize,
        bcast: bool,
    },
    /// BiasAddGrad of an NHWC tensor (the per-channel sum over N, H, W: a column reduction);
    /// `half`: float16 (read as halves, summed in float32, rounded once).
    BiasGrad {
        shape: [usize; 4],
        half: bool,
    },
    /// Sum / Max of [rows, cols] over axis 1 (last) or 0 (first).
    Reduce {
        op: &'static str,
        rows: usize,
        cols: usize,
        axis: usize,
    },
    Softmax {
        rows: usize,
        cols: usize,
    },
    /// FusedBatchNormV3 (`grad`: FusedBatchNormGradV3), training, NHWC; `half`: T = float16
    /// (U float32), as Keras' mixed precision runs it.
    BatchNorm {
        shape: [usize; 4],
        grad: bool,
        half: bool,
    },
    /// MaxPool (`grad`: MaxPoolGrad) 3x3, stride 2, SAME, NHWC; `half`: float16.
    MaxPool {
        shape: [usize; 4],
        grad: bool,
        half: bool,
    },
    Copy {
        elems: usize,
        how: CopyHow,
    },
    /// Cast of an NHWC activation float32 -> float16 (`to_half`) or float16 -> float32, as
    /// Keras' mixed precision runs at layer boundaries.
    Cast {
        shape: [usize; 4],
        to_half: bool,
    },
    /// AddV2 of two same-shape NHWC tensors (a residual add), float32 or float16 (`half`).
    AddSame {
        shape: [usize; 4],
        half: bool,
    },
}

impl Kind {
    fn name(&self) -> String {
        let dims = |d: &[usize]| {
            d.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("x")
        };
        match *self {
            Kind::MatMul {
                batch,
                m,
                k,
                n,
                ta,
                tb,
            } => {
                let sizes = if batch == 0 && m == k && k == n {
                    m.to_string()
                } else if batch == 0 {
                    dims(&[m, k, n])
                } else {
                    dims(&[batch, m, k, n])
                };
                let (pa, pb) = if batch == 0 {
                    ("_ta", "_tb")
                } else {
                    ("_adjx", "_adjy")
                };
                format!(
                    "{}_{sizes}{}{}",
                    if batch == 0 { "matmul" } else { "bmm" },
                    if ta { pa } else { "" },
                    if tb { pb } else { "" }
                )
            }
            Kind::Binary {
                op,
                rows,
                cols,
                bcast,
            } => format!(
                "{}{}_{}",
                if op == "AddV2" { "add" } else { "mul" },
                if bcast { "_bcast" } else { "" },
                dims(&[rows, cols])
            ),
            Kind::Reduce {
                op,
                rows,
                cols,
                axis,
            } => format!(
                "{}_{}_{}",
                op.to_lowercase(),
                if axis == 1 { "last" } else { "first" },
                dims(&[rows, cols])
            ),
            Kind::BiasGrad { shape, half } => {
                format!(
                    "biasgrad_{}{}",
                    dims(&shape),
                    if half { "_f16" } else { "" }
                )
            }
            Kind::Softmax { rows, cols } => format!("softmax_{}", dims(&[rows, cols])),
            Kind::BatchNorm { shape, grad, half } => format!(
                "bn_{}_{}{}",
                if grad { "grad" } else { "train" },
                dims(&shape),
                if half { "_f16" } else { "" }
            ),
            Kind::MaxPool { shape, grad, half } => format!(
                "maxpool{}3s2_{}{}",
                if grad { "grad" } else { "" },
                dims(&shape),
                if half { "_f16" } else { "" }
            ),
            Kind::Cast { shape, to_half } => format!(
                "cast_{}_{}",
                if to_half { "f32_f16" } else { "f16_f32" },
                dims(&shape)
            ),
            Kind::AddSame { shape, half } => {
                format!("add_{}{}", dims(&shape), if half { "_f16" } else { "" })
            }
            Kind::Copy { elems, how } => format!(
                "copy_{}_{}",
                match how {
                    CopyHow::Buffer => "buffer",
                    CopyHow::U32 => "u32",
                    CopyHow::Vec4 => "vec4",
                    CopyHow::Vec4x4 => "vec4x4",
                    CopyHow::Vec4x4Trusted => "vec4x4t",
                },
                if elems * 4 >= 1 << 20 {
                    format!("{}MiB", (elems * 4) >> 20)
                } else {
                    format!("{}KiB", (elems * 4) >> 10)
                }
            ),
        }
    }
}

fn mm(batch: usize, m: usize, k: usize, n: usize, ta: bool, tb: bool) -> Kind {
    Kind::MatMul {
        batch,
        m,
        k,
        n,
        ta,
        tb,
    }
}

/// The cases, in run order (copies first: the other cases' `% copy` needs them). `small`: the
/// preset for CPU adapters (lavapipe on 2 cores, 128 MiB bindings).
fn all_cases(small: bool) -> Vec<Kind> {
    let copy = |elems| {
        [
            CopyHow::Buffer,
            CopyHow::U32,
            CopyHow::Vec4,
            CopyHow::Vec4x4,
            CopyHow::Vec4x4Trusted,
        ]
        .into_iter()
        .map(move |how| Kind::Copy { elems, how })
    };
    let mut v: Vec<Kind> = vec![];
    if small {
        v.extend(copy(1 << 20));
        for s in [128, 256, 512] {
            v.push(mm(0, s, s, s, false, false));
        }
        v.push(mm(0, 256, 256, 256, true, false));
        v.push(mm(0, 256, 256, 256, false, true));
        v.push(mm(0, 64, 2048, 1000, false, false));
        v.push(mm(0, 1024, 64, 1024, false, false));
        v.push(mm(0, 4096, 256, 256, false, false));
        v.push(mm(8, 128, 64, 128, false, true));
        v.push(mm(8, 128, 128, 64, false, false));
        v.extend(binary_cases(1024, 1024, None));
        v.extend(reduce_cases(1024, 1024));
        v.push(Kind::Softmax {
            rows: 1024,
            cols: 1000,
        });
        v.push(Kind::Softmax {
            rows: 32,
            cols: 32768,
        });
        v.extend(bn_cases(
            &[[4, 56, 56, 64]],
            &[[8, 14, 14, 256]],
            &[[8, 14, 14, 256]],
        ));
        v.extend(pool_cases(None, [4, 112, 112, 64]));
        v.extend(f16_cases(&[[4, 14, 14, 256]]));
        v.extend(bias_grad_cases(&[[4, 28, 28, 64]]));
    } else {
        v.extend(copy(64 << 20));
        for s in [512, 1024, 2048, 4096, 8192] {
            v.push(mm(0, s, s, s, false, false));
        }
        v.push(mm(0, 4096, 4096, 4096, true, false));
        v.push(mm(0, 4096, 4096, 4096, false, true));
        v.push(mm(0, 64, 2048, 1000, false, false));
        // ResNet-50's classifier: the product above is its forward pass (16 tiles of 64 x 64
        // over K = 2048: K split in 8 on GPUs), this its input gradient (K split in 2).
        v.push(mm(0, 64, 1000, 2048, false, true));
        // The Keras CNN's Dense layer: few outputs over a long K (the split-K kernel on GPUs).
        v.push(mm(0, 64, 1152, 10, false, false));
        v.push(mm(0, 4096, 64, 4096, false, false));
        v.push(mm(0, 32768, 256, 256, false, false));
        v.push(mm(32, 512, 64, 512, false, true));
        v.push(mm(32, 512, 512, 64, false, false));
        v.push(mm(8, 1024, 1024, 1024, false, false));
        v.extend(binary_cases(65536, 1024, Some((1024, 1024))));
        v.extend(reduce_cases(8192, 8192));
        v.push(Kind::Softmax {
            rows: 65536,
            cols: 1000,
        });
        v.push(Kind::Softmax {
            rows: 2048,
            cols: 32768,
        });
        v.extend(bn_cases(
            &[[32, 56, 56, 64], [32, 14, 14, 256]],
            &RESNET50_BN,
            &[[64, 56, 56, 256], [64, 14, 14, 1024], [64, 7, 7, 2048]],
        ));
        v.extend(pool_cases(Some([32, 112, 112, 64]), [64, 112, 112, 64]));
        v.extend(f16_cases(&[[64, 56, 56, 256], [64, 14, 14, 1024]]));
        v.extend(bias_grad_cases(&[
            [64, 112, 112, 64],
            [64, 56, 56, 256],
            [64, 14, 14, 1024],
        ]));
        // Small copies (4 KiB: one workgroup; 256 KiB; 2 MiB), only when named: what one
        // dispatch costs at least (its span) next to the small batch-norm rows.
        for elems in [1 << 10, 1 << 16, 1 << 19] {
            v.push(Kind::Copy {
                elems,
                how: CopyHow::Vec4x4,
            });
        }
    }
    v
}

/// Cast float32 <-> float16 and a same-shape AddV2 in float16 and float32 on `shapes`.
fn f16_cases(shapes: &[[usize; 4]]) -> Vec<Kind> {
    let mut v = vec![];
    for &shape in shapes {
        for to_half in [true, false] {
            v.push(Kind::Cast { shape, to_half });
        }
        for half in [true, false] {
            v.push(Kind::AddSame { shape, half });
        }
    }
    v
}

/// BiasAddGrad of each NHWC shape in float32 and float16 (ResNet-50's convolution biases:
/// float16 took 2.5x float32's GPU time in a replayed mixed-precision step, session 26).
fn bias_grad_cases(shapes: &[[usize; 4]]) -> Vec<Kind> {
    let mut v = vec![];
    for &shape in shapes {
        for half in [false, true] {
            v.push(Kind::BiasGrad { shape, half });
        }
    }
    v
}

/// AddV2 [rows, cols] + [cols] and Mul of two [rows, cols] tensors, at the large size and
/// optionally at a second, small one.
fn binary_cases(rows: usize, cols: usize, also: Option<(usize, usize)>) -> Vec<Kind> {
    let mut v = vec![];
    for (r, c) in std::iter::once((rows, cols)).chain(also) {
        v.push(Kind::Binary {
            op: "AddV2",
            rows: r,
            cols: c,
            bcast: true,
        });
        v.push(Kind::Binary {
            op: "Mul",
            rows: r,
            cols: c,
            bcast: false,
        });
    }
    v
}

/// Batch-norm shapes of Keras ResNet-50 at batch 64 (NHWC), forward and gradient.
const RESNET50_BN: [[usize; 4]; 5] = [
    [64, 112, 112, 64],
    [64, 56, 56, 256],
    [64, 28, 28, 512],
    [64, 14, 14, 1024],
    [64, 7, 7, 2048],
];

/// FusedBatchNormV3 training on `fwd_only`, then forward and gradient on `both`, then
/// forward and gradient in float16 on `half`.
fn bn_cases(fwd_only: &[[usize; 4]], both: &[[usize; 4]], half: &[[usize; 4]]) -> Vec<Kind> {
    let mut v: Vec<Kind> = fwd_only
        .iter()
        .map(|&shape| Kind::BatchNorm {
            shape,
            grad: false,
            half: false,
        })
        .collect();
    for (list, half) in [(both, false), (half, true)] {
        for &shape in list {
            for grad in [false, true] {
                v.push(Kind::BatchNorm { shape, grad, half });
            }
        }
    }
    v
}

/// MaxPool 3x3/2 SAME on `fwd_only`, then MaxPool and MaxPoolGrad on `both` in float32 and
/// float16.
fn pool_cases(fwd_only: Option<[usize; 4]>, both: [usize; 4]) -> Vec<Kind> {
    let mut v: Vec<Kind> = fwd_only
        .map(|shape| Kind::MaxPool {
            shape,
            grad: false,
            half: false,
        })
        .into_iter()
        .collect();
    for half in [false, true] {
        for grad in [false, true] {
            v.push(Kind::MaxPool {
                shape: both,
                grad,
                half,
            });
        }
    }
    v
}

fn reduce_cases(rows: usize, cols: usize) -> Vec<Kind> {
    let mut v = vec![];
    for op in ["Sum", "Max"] {
        for axis in [1, 0] {
            v.push(Kind::Reduce {
                op,
                rows,
                cols,
                axis,
            });
        }
    }
    v
}

pub fn run(args: &[String]) -> Res<()> {
    if args.iter().any(|a| a == "--copy-lab") {
        return copylab::run(args);
    }
    let small = args.iter().any(|a| a == "--small");
    // `--no-same-copy`: skip the copy of each memory-bound case's own bytes.
    let same_copy = !args.iter().any(|a| a == "--no-same-copy");
    let reps: usize = flag(args, "--reps")
        .unwrap_or("5")
        .parse()
        .map_err(|_| "bad --reps")?;
    let all = all_cases(small);
    if args.iter().any(|a| a == "--list") {
        for k in &all {
            println!("{}", k.name());
        }
        return Ok(());
    }
    let selected: Vec<Kind> = match flag(args, "--cases") {
        None | Some("all") => all.clone(),
        Some(list) => {
            let want: Vec<&str> = list.split(',').map(str::trim).collect();
            for w in &want {
                if !all.iter().any(|k| k.name() == *w) {
                    return Err(format!(
                        "no case {w:?} (tfwgpu-bench ops --list{} names them)",
                        if small { " --small" } else { "" }
                    ));
                }
            }
            // The copies always run first when a memory-bound case is selected.
            let membound = all
                .iter()
                .filter(|k| want.contains(&k.name().as_str()))
                .any(|k| !matches!(k, Kind::MatMul { .. }));
            // `--one-copy`: of the large copies only the four-vec4 shader copy (the best in
            // every H200 run so far; the others take seconds of a short device call).
            let one_copy = args.iter().any(|a| a == "--one-copy");
            all.iter()
                .filter(|k| {
                    want.contains(&k.name().as_str())
                        || (membound
                            && match k {
                                // Not the small copies (`copy_vec4x4_4KiB` ..): named only.
                                Kind::Copy { how, elems } => {
                                    *elems >= 1 << 20 && (!one_copy || *how == CopyHow::Vec4x4)
                                }
                                _ => false,
                            })
                })
                .cloned()
                .collect()
        }
    };
    if let Some(ms) = flag(args, "--warm-ms") {
        let ms: u64 = ms.parse().map_err(|_| "bad --warm-ms")?;
        crate::cases::WARM_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    let path = flag(args, "--json").unwrap_or("bench-ops.json");
    let rt = crate::open()?;
    let dev = rt.device();
    let mut rng = StdRng::seed_from_u64(17);
    println!("{}", Row::header());
    let mut rows: Vec<Row> = vec![];
    let mut failed = vec![];
    for k in &selected {
        match run_case(dev, k, reps, &mut rng) {
            Ok(mut row) => {
                if let (Work::Bytes(b), false) = (row.work, matches!(k, Kind::Copy { .. })) {
                    row.pct_copy = copy_gbps(&rows).and_then(|c| row.gbps().map(|g| g / c * 100.0));
                    if same_copy {
                        // The better of two shader copies of the same bytes (b / 2 read, b / 2
                        // written): one vec4 per invocation, four per invocation (which of the
                        // two is faster changed between runs on the H200).
                        let elems = ((b / 8.0) as usize / 4 * 4).max(4);
                        for how in [CopyHow::Vec4, CopyHow::Vec4x4] {
                            let ck = Kind::Copy { elems, how };
                            match run_case(dev, &ck, reps, &mut rng) {
                                Ok(c) => {
                                    if c.gbps() > row.copy_same_gbps {
                                        row.copy_same_gbps = c.gbps();
                                    }
                                }
                                Err(e) => {
                                    println!("{:<28} same-bytes copy failed: {e}", k.name())
                                }
                            }
                        }
                        row.pct_copy_same = row
                            .copy_same_gbps
                            .and_then(|cg| row.gbps().map(|g| g / cg * 100.0));
                    }
                }
                println!("{}", row.line());
                if row.timing.breakdown.len() > 1 {
                    let parts: Vec<String> = row
                        .timing
                        .breakdown
                        .iter()
                        .map(|(l, ms)| format!("{l} {:.1} us", ms * 1e3))
                        .collect();
                    println!("    gpu per run: {}", parts.join(", "));
                }
                if row.rel_err.is_nan() || row.rel_err > tolerance(k) {
                    failed.push(format!("{}: relative error {:.1e}", row.case, row.rel_err));
                }
                rows.push(row);
                // Written after every case, so that a run cut short keeps what it measured.
                write_json(path, dev, copy_gbps(&rows), &rows)?;
            }
            Err(e) => {
                println!("{:<28} failed: {e}", k.name());
                failed.push(format!("{}: {e}", k.name()));
            }
        }
    }
    let copy = copy_gbps(&rows);
    if let Some(c) = copy {
        println!("copy bandwidth of this run (best copy case): {c:.1} GB/s");
    }
    write_json(path, dev, copy, &rows)?;
    eprintln!("wrote {path}");
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} case(s) failed: {}",
            failed.len(),
            failed.join("; ")
        ))
    }
}

/// The best copy bandwidth measured so far in the run (the ceiling of memory-bound kernels).
fn copy_gbps(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .filter(|r| r.op.starts_with("copy"))
        .filter_map(Row::gbps)
        .max_by(f64::total_cmp)
}

/// The largest relative error a correct kernel may show: f32 rounding of the result (exact
/// ops), of long dot products and sums (sampled reductions are scaled by sum |terms|, so
/// eps-sized bounds hold), of exp/rsqrt chains (softmax, batch norm).
fn tolerance(k: &Kind) -> f64 {
    match k {
        Kind::Copy { .. } | Kind::MaxPool { grad: false, .. } => 0.0,
        // Sums of up to 4 gradients, in TensorFlow's order on the GPU (float16: rounded after
        // each addition), f64 here.
        Kind::MaxPool {
            grad: true,
            half: false,
            ..
        } => 3e-7,
        Kind::MaxPool { grad: true, .. } => 2e-3,
        // float16 outputs: one rounding to half (2^-11 relative) on top of float32's error.
        Kind::BatchNorm { half: true, .. } => 1e-3,
        Kind::Binary { .. } => 1.2e-7,
        Kind::Reduce { op, .. } if *op == "Max" => 0.0,
        Kind::Reduce { .. } | Kind::MatMul { .. } | Kind::BiasGrad { half: false, .. } => 1e-5,
        // One rounding to half of the float32 sum (relative to the sum of |x|).
        Kind::BiasGrad { half: true, .. } => 1e-3,
        Kind::Softmax { .. } => 2e-5,
        Kind::BatchNorm { .. } => 1e-4,
        // Exact: the results are compared bit for bit (rel_err 0 or inf).
        Kind::Cast { .. } | Kind::AddSame { .. } => 0.0,
    }
}

fn attrs(pairs: &[(&str, AttrValue)]) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in pairs {
        a.set(k, v.clone());
    }
    a
}

/// Uploads random inputs, runs `kernel` once into poisoned outputs, checks them with `check`
/// (given the host inputs and the downloaded float outputs), then times it.
struct Measured {
    timing: Timing,
    rel_err: f64,
}

fn measure(
    dev: &Device,
    kernel: &dyn Kernel,
    inputs: &[(Vec<f32>, Vec<usize>)],
    host: &[HostTensor],
    reps: usize,
    check: impl FnOnce(&[&[f32]], &[Vec<f32>]) -> f64,
) -> Res<Measured> {
    measure_t(dev, kernel, inputs, &[], host, reps, check)
}

/// `measure` with the inputs at indices `half` uploaded as float16 (their values must be
/// halves already, see `to_half`) and float16 outputs downloaded as f32.
fn measure_t(
    dev: &Device,
    kernel: &dyn Kernel,
    inputs: &[(Vec<f32>, Vec<usize>)],
    half: &[usize],
    host: &[HostTensor],
    reps: usize,
    check: impl FnOnce(&[&[f32]], &[Vec<f32>]) -> f64,
) -> Res<Measured> {
    let tensors = inputs
        .iter()
        .enumerate()
        .map(|(i, (d, s))| {
            if half.contains(&i) {
                let h: Vec<f16> = d.iter().map(|&v| f16::from_f32(v)).collect();
                dev.upload(&h, s).map_err(err)
            } else {
                dev.upload(d, s).map_err(err)
            }
        })
        .collect::<Res<Vec<_>>>()?;
    let mut args: Vec<Arg> = tensors.iter().map(Arg::from).collect();
    args.extend(host.iter().map(Arg::from));
    let outs = poisoned_outputs(dev, kernel, &args)?;
    record(dev, kernel, &args, &outs)?;
    let got = outs
        .iter()
        .map(|t| match t.dtype() {
            DType::F32 => t.download::<f32>().map_err(err),
            DType::F16 => Ok(t
                .download::<f16>()
                .map_err(err)?
                .into_iter()
                .map(f16::to_f32)
                .collect()),
            _ => Ok(vec![]),
        })
        .collect::<Res<Vec<_>>>()?;
    let host_in: Vec<&[f32]> = inputs.iter().map(|(d, _)| d.as_slice()).collect();
    let rel_err = check(&host_in, &got);
    drop(got);
    let timing = time_runs(dev, reps, 0.025, || record(dev, kernel, &args, &outs))?;
    Ok(Measured { timing, rel_err })
}

/// What one case measured: (op, input shapes, work, timing and error).
type Case = (String, Vec<Vec<usize>>, Work, Measured);

fn f32b(n: usize) -> f64 {
    (n * 4) as f64
}

/// Bytes of `n` elements of float16 (`half`) or float32.
fn tb(half: bool, n: usize) -> f64 {
    if half { (n * 2) as f64 } else { f32b(n) }
}

/// The values rounded to float16 (so that the host reference sees what the GPU gets).
fn to_half(v: Vec<f32>) -> Vec<f32> {
    v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect()
}

fn run_case(dev: &Device, k: &Kind, reps: usize, rng: &mut StdRng) -> Res<Row> {
    let (op, shape, work, m): Case = match *k {
        Kind::MatMul {
            batch,
            m,
            k: kk,
            n,
            ta,
            tb,
        } => {
            let b = batch.max(1);
            let sa = if ta { vec![kk, m] } else { vec![m, kk] };
            let sb = if tb { vec![n, kk] } else { vec![kk, n] };
            let (sa, sb, op, a) = if batch == 0 {
                let a = attrs(&[
                    ("transpose_a", AttrValue::Bool(ta)),
                    ("transpose_b", AttrValue::Bool(tb)),
                ]);
                (sa, sb, "MatMul", a)
            } else {
                let a = attrs(&[
                    ("adj_x", AttrValue::Bool(ta)),
                    ("adj_y", AttrValue::Bool(tb)),
                ]);
                let pre = |s: Vec<usize>| [vec![batch], s].concat();
                (pre(sa), pre(sb), "BatchMatMulV2", a)
            };
            let kernel = dev.kernel(op, &a).map_err(err)?;
            let av = random(rng, b * m * kk);
            let bv = random(rng, b * kk * n);
            let mut srng = StdRng::seed_from_u64(b as u64 * 31 + m as u64);
            let inputs = [(av, sa.clone()), (bv, sb.clone())];
            let meas = measure(dev, kernel.as_ref(), &inputs, &[], reps, |i, o| {
                check_matmul(i[0], i[1], &o[0], (b, m, kk, n), ta, tb, &mut srng)
            })?;
            let flops = 2.0 * (b * m * kk * n) as f64;
            (op.into(), vec![sa, sb], Work::Flops(flops), meas)
        }
        Kind::Binary {
            op,
            rows,
            cols,
            bcast,
        } => {
            let kernel = dev.kernel(op, &Attrs::new()).map_err(err)?;
            let n = rows * cols;
            let sb = if bcast { vec![cols] } else { vec![rows, cols] };
            let nb = if bcast { cols } else { n };
            let inputs = [
                (random(rng, n), vec![rows, cols]),
                (random(rng, nb), sb.clone()),
            ];
            let add = op == "AddV2";
            let meas = measure(dev, kernel.as_ref(), &inputs, &[], reps, |i, o| {
                let (a, b) = (i[0], i[1]);
                rel_err(&o[0], |e| {
                    let (x, y) = (a[e] as f64, b[e % b.len()] as f64);
                    if add {
                        (x + y, x.abs() + y.abs())
                    } else {
                        (x * y, x * y)
                    }
                })
            })?;
            let bytes = f32b(2 * n + nb);
            (
                op.into(),
                vec![vec![rows, cols], sb],
                Work::Bytes(bytes),
                meas,
            )
        }
        Kind::Reduce {
            op,
            rows,
            cols,
            axis,
        } => {
            let kernel = dev.kernel(op, &Attrs::new()).map_err(err)?;
            let axes = HostTensor::vec_i32(&[axis as i32]);
            let inputs = [(random(rng, rows * cols), vec![rows, cols])];
            let is_sum = op == "Sum";
            let outs = if axis == 1 { rows } else { cols };
            let meas = measure(dev, kernel.as_ref(), &inputs, &[axes], reps, |i, o| {
                let x = i[0];
                // Reference per output: (sum or max, sum |x|).
                let mut want = vec![(if is_sum { 0.0 } else { f64::NEG_INFINITY }, 0.0); outs];
                for r in 0..rows {
                    for c in 0..cols {
                        let v = x[r * cols + c] as f64;
                        let w = &mut want[if axis == 1 { r } else { c }];
                        w.0 = if is_sum { w.0 + v } else { w.0.max(v) };
                        w.1 += v.abs();
                    }
                }
                rel_err(&o[0], |e| {
                    if is_sum {
                        want[e]
                    } else {
                        (want[e].0, want[e].0)
                    }
                })
            })?;
            (
                op.into(),
                vec![vec![rows, cols], vec![1]],
                Work::Bytes(f32b(rows * cols + outs)),
                meas,
            )
        }
        Kind::BiasGrad { shape, half } => {
            let n = shape.iter().product::<usize>();
            let c = shape[3];
            let kernel = dev.kernel("BiasAddGrad", &Attrs::new()).map_err(err)?;
            let x = random(rng, n);
            let x = if half { to_half(x) } else { x };
            let inputs = [(x, shape.to_vec())];
            let hx: &[usize] = if half { &[0] } else { &[] };
            let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
                // Per channel: the sum and the sum of |x| (the rounding error's scale).
                let mut want = vec![(0.0f64, 0.0f64); c];
                for (e, &v) in i[0].iter().enumerate() {
                    let w = &mut want[e % c];
                    w.0 += v as f64;
                    w.1 += (v as f64).abs();
                }
                rel_err(&o[0], |ch| want[ch])
            })?;
            (
                "BiasAddGrad".into(),
                vec![shape.to_vec()],
                Work::Bytes(tb(half, n) + tb(half, c)),
                meas,
            )
        }
        Kind::Softmax { rows, cols } => {
            let kernel = dev.kernel("Softmax", &Attrs::new()).map_err(err)?;
            let inputs = [(random(rng, rows * cols), vec![rows, cols])];
            let meas = measure(dev, kernel.as_ref(), &inputs, &[], reps, |i, o| {
                let x = i[0];
                let mut worst = 0.0f64;
                for r in 0..rows {
                    let row = &x[r * cols..(r + 1) * cols];
                    let mx = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                    let sum: f64 = row.iter().map(|&v| (v as f64 - mx).exp()).sum();
                    let got = &o[0][r * cols..(r + 1) * cols];
                    worst = worst.max(rel_err(got, |c| {
                        let w = (row[c] as f64 - mx).exp() / sum;
                        (w, w)
                    }));
                }
                worst
            })?;
            (
                "Softmax".into(),
                vec![vec![rows, cols]],
                Work::Bytes(f32b(2 * rows * cols)),
                meas,
            )
        }
        Kind::BatchNorm {
            shape,
            grad: true,
            half,
        } => bn_grad_case(dev, shape, half, reps, rng)?,
        Kind::BatchNorm {
            shape,
            grad: false,
            half,
        } => {
            let c = shape[3];
            let n = shape.iter().product::<usize>();
            let eps = 0.001f32;
            let kernel = bn_kernel(dev, "FusedBatchNormV3", eps)?;
            // x = 2 + uniform(-1, 1): a mean far from 0, as activations have.
            let x: Vec<f32> = random(rng, n).into_iter().map(|v| v + 2.0).collect();
            let x = if half { to_half(x) } else { x };
            let inputs = [
                (x, shape.to_vec()),
                (random(rng, c), vec![c]),
                (random(rng, c), vec![c]),
                (vec![0.0; c], vec![c]),
                (vec![1.0; c], vec![c]),
            ];
            let hx: &[usize] = if half { &[0] } else { &[] };
            let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
                let (x, gamma, beta) = (i[0], i[1], i[2]);
                let rest = n / c;
                let mut mean = vec![0.0f64; c];
                let mut abs = vec![0.0f64; c];
                for (e, &v) in x.iter().enumerate() {
                    mean[e % c] += v as f64;
                    abs[e % c] += (v as f64).abs();
                }
                mean.iter_mut().for_each(|m| *m /= rest as f64);
                let mut var = vec![0.0f64; c];
                for (e, &v) in x.iter().enumerate() {
                    var[e % c] += (v as f64 - mean[e % c]).powi(2);
                }
                var.iter_mut().for_each(|v| *v /= rest as f64);
                let y = rel_err(&o[0], |e| {
                    let ch = e % c;
                    let inv = 1.0 / (var[ch] + eps as f64).sqrt() * gamma[ch] as f64;
                    let d = x[e] as f64 - mean[ch];
                    // x - mean rounds relative to |x| (and the mean's own rounding), not to
                    // |x - mean|, which cancels for x near the mean.
                    let scale = (x[e].abs() as f64 + mean[ch].abs()) * inv.abs();
                    (d * inv + beta[ch] as f64, scale + (beta[ch] as f64).abs())
                });
                let bm = rel_err(&o[1], |ch| (mean[ch], abs[ch] / rest as f64));
                let corr = rest as f64 / (rest as f64 - 1.0).max(1.0);
                let bv = rel_err(&o[2], |ch| (var[ch] * corr, var[ch] * corr));
                // reserve_space_3: a float32 0 (the poisoned output must have been written).
                let r3 = if o[5] == [0.0] { 0.0 } else { f64::INFINITY };
                y.max(bm).max(bv).max(r3)
            })?;
            (
                "FusedBatchNormV3".into(),
                vec![shape.to_vec(), vec![c], vec![c], vec![c], vec![c]],
                Work::Bytes(tb(half, 2 * n) + f32b(7 * c)),
                meas,
            )
        }
        Kind::MaxPool {
            shape,
            grad: true,
            half,
        } => pool_grad_case(dev, shape, half, reps, rng)?,
        Kind::MaxPool {
            shape,
            grad: false,
            half,
        } => {
            let [bn, h, w, c] = shape;
            let (oh, ow) = (h.div_ceil(2), w.div_ceil(2));
            // SAME: pad_before = (total padding) / 2.
            let pad_h = ((oh - 1) * 2 + 3).saturating_sub(h) / 2;
            let pad_w = ((ow - 1) * 2 + 3).saturating_sub(w) / 2;
            let kernel = dev
                .kernel(
                    "MaxPool",
                    &attrs(&[
                        ("ksize", AttrValue::Ints(vec![1, 3, 3, 1])),
                        ("strides", AttrValue::Ints(vec![1, 2, 2, 1])),
                        ("padding", AttrValue::Str("SAME".into())),
                    ]),
                )
                .map_err(err)?;
            let x = random(rng, bn * h * w * c);
            let x = if half { to_half(x) } else { x };
            let inputs = [(x, shape.to_vec())];
            let hx: &[usize] = if half { &[0] } else { &[] };
            let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
                let x = i[0];
                rel_err(&o[0], |e| {
                    let ch = e % c;
                    let ox = (e / c) % ow;
                    let oy = (e / c / ow) % oh;
                    let b = e / c / ow / oh;
                    let mut m = f64::NEG_INFINITY;
                    for dy in 0..3 {
                        for dx in 0..3 {
                            let (y, xx) = (
                                (oy * 2 + dy) as i64 - pad_h as i64,
                                (ox * 2 + dx) as i64 - pad_w as i64,
                            );
                            if y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w {
                                m = m.max(
                                    x[((b * h + y as usize) * w + xx as usize) * c + ch] as f64,
                                );
                            }
                        }
                    }
                    (m, m)
                })
            })?;
            (
                "MaxPool".into(),
                vec![shape.to_vec()],
                Work::Bytes(tb(half, bn * h * w * c + bn * oh * ow * c)),
                meas,
            )
        }
        Kind::Cast {
            shape,
            to_half: narrow,
        } => {
            let n = shape.iter().product::<usize>();
            let (src, dst) = if narrow {
                (DType::F32, DType::F16)
            } else {
                (DType::F16, DType::F32)
            };
            let kernel = dev
                .kernel(
                    "Cast",
                    &attrs(&[
                        ("SrcT", AttrValue::Type(src)),
                        ("DstT", AttrValue::Type(dst)),
                        ("Truncate", AttrValue::Bool(false)),
                    ]),
                )
                .map_err(err)?;
            // Uniform(-1, 1): about 6e-5 of the values are float16 subnormals.
            let x = random(rng, n);
            let x = if narrow { x } else { to_half(x) };
            let inputs = [(x, shape.to_vec())];
            let hx: &[usize] = if narrow { &[] } else { &[0] };
            let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
                // Both directions are exact: float16 rounds to nearest even once.
                let exact = i[0]
                    .iter()
                    .zip(&o[0])
                    .all(|(&x, &y)| f16::from_f32(x).to_f32().to_bits() == y.to_bits());
                if exact { 0.0 } else { f64::INFINITY }
            })?;
            (
                "Cast".into(),
                vec![shape.to_vec()],
                Work::Bytes((n * 6) as f64),
                meas,
            )
        }
        Kind::AddSame { shape, half } => {
            let n = shape.iter().product::<usize>();
            let kernel = dev.kernel("AddV2", &Attrs::new()).map_err(err)?;
            let (a, b) = (random(rng, n), random(rng, n));
            let (a, b) = if half {
                (to_half(a), to_half(b))
            } else {
                (a, b)
            };
            let inputs = [(a, shape.to_vec()), (b, shape.to_vec())];
            let hx: &[usize] = if half { &[0, 1] } else { &[] };
            let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
                // The f32 sum of two halves is exact; float16 rounds it once.
                let exact = i[0].iter().zip(i[1]).zip(&o[0]).all(|((&x, &y), &z)| {
                    let s = x + y;
                    let want = if half { f16::from_f32(s).to_f32() } else { s };
                    want.to_bits() == z.to_bits()
                });
                if exact { 0.0 } else { f64::INFINITY }
            })?;
            (
                "AddV2".into(),
                vec![shape.to_vec(), shape.to_vec()],
                Work::Bytes(tb(half, 3 * n)),
                meas,
            )
        }
        Kind::Copy { elems, how } => {
            let src_data = random(rng, elems);
            let src = dev.upload(&src_data, &[elems]).map_err(err)?;
            let bytes = (elems * 4) as u64;
            let kernel = CopyKernel { how };
            let dst = if how == CopyHow::Buffer {
                let d = dev.empty(DType::F32, &[elems]).map_err(err)?;
                dev.fill_u32(d.addr(), bytes, 0xFFFF_FFFF).map_err(err)?;
                dev.copy(src.addr(), d.addr(), bytes).map_err(err)?;
                d
            } else {
                let args = [Arg::from(&src)];
                let outs = poisoned_outputs(dev, &kernel, &args)?;
                record(dev, &kernel, &args, &outs)?;
                outs.into_iter().next().expect("one output")
            };
            let got = dst.download::<f32>().map_err(err)?;
            let rel = if got
                .iter()
                .zip(&src_data)
                .all(|(a, b)| a.to_bits() == b.to_bits())
            {
                0.0
            } else {
                f64::INFINITY
            };
            drop(got);
            let timing = time_runs(dev, reps, 0.025, || {
                if how == CopyHow::Buffer {
                    dev.copy(src.addr(), dst.addr(), bytes).map_err(err)
                } else {
                    let args = [Arg::from(&src)];
                    record(dev, &kernel, &args, std::slice::from_ref(&dst))
                }
            })?;
            let op = match how {
                CopyHow::Buffer => "copy (Device::copy)",
                CopyHow::U32 => "copy (u32 shader)",
                CopyHow::Vec4 => "copy (vec4 shader)",
                CopyHow::Vec4x4 => "copy (4 vec4/inv.)",
                CopyHow::Vec4x4Trusted => "copy (4 vec4, trust)",
            };
            (
                op.into(),
                vec![vec![elems]],
                Work::Bytes(2.0 * bytes as f64),
                Measured {
                    timing,
                    rel_err: rel,
                },
            )
        }
    };
    let half = matches!(
        k,
        Kind::BatchNorm { half: true, .. }
            | Kind::MaxPool { half: true, .. }
            | Kind::AddSame { half: true, .. }
            | Kind::BiasGrad { half: true, .. }
            | Kind::Cast { to_half: false, .. }
    );
    Ok(Row {
        case: k.name(),
        op,
        shape,
        dtype: if half { DType::F16 } else { DType::F32 },
        timing: m.timing,
        work,
        rel_err: m.rel_err,
        reps,
        pct_copy: None,
        copy_same_gbps: None,
        pct_copy_same: None,
    })
}

/// SAME padding before the data of a 3x3 / stride 2 window over `h` rows: (out, pad).
fn same_3s2(h: usize) -> (usize, usize) {
    let o = h.div_ceil(2);
    (o, ((o - 1) * 2 + 3).saturating_sub(h) / 2)
}

/// The training (is_training), NHWC batch-norm kernel `op` with epsilon `eps`.
fn bn_kernel(dev: &Device, op: &str, eps: f32) -> Res<Box<dyn Kernel>> {
    dev.kernel(
        op,
        &attrs(&[
            ("epsilon", AttrValue::Float(eps)),
            ("is_training", AttrValue::Bool(true)),
            ("data_format", AttrValue::Str("NHWC".into())),
        ]),
    )
    .map_err(err)
}

/// FusedBatchNormGradV3 (is_training, NHWC): dy, x, scale, the batch mean and the biased
/// batch variance (reserve_space_1 / 2, as the forward op saves them), reserve_space_3.
fn bn_grad_case(
    dev: &Device,
    shape: [usize; 4],
    half: bool,
    reps: usize,
    rng: &mut StdRng,
) -> Res<Case> {
    let c = shape[3];
    let n = shape.iter().product::<usize>();
    let rest = n / c;
    let eps = 0.001f32;
    let kernel = bn_kernel(dev, "FusedBatchNormGradV3", eps)?;
    let x: Vec<f32> = random(rng, n).into_iter().map(|v| v + 2.0).collect();
    let dy = random(rng, n);
    let (x, dy) = if half {
        (to_half(x), to_half(dy))
    } else {
        (x, dy)
    };
    // The saved statistics of x (f64, rounded once), as the forward op would give them.
    let mut mean = vec![0.0f64; c];
    for (e, &v) in x.iter().enumerate() {
        mean[e % c] += v as f64;
    }
    mean.iter_mut().for_each(|m| *m /= rest as f64);
    let mut var = vec![0.0f64; c];
    for (e, &v) in x.iter().enumerate() {
        var[e % c] += (v as f64 - mean[e % c]).powi(2);
    }
    var.iter_mut().for_each(|v| *v /= rest as f64);
    let mean32: Vec<f32> = mean.iter().map(|&m| m as f32).collect();
    let var32: Vec<f32> = var.iter().map(|&v| v as f32).collect();
    let inputs = [
        (dy, shape.to_vec()),
        (x, shape.to_vec()),
        (random(rng, c), vec![c]),
        (mean32, vec![c]),
        (var32, vec![c]),
        (vec![0.0], vec![]),
    ];
    let hx: &[usize] = if half { &[0, 1] } else { &[] };
    let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |i, o| {
        let (dy, x, gamma, m, v) = (i[0], i[1], i[2], i[3], i[4]);
        // Per channel: sum dy, sum dy (x - m), and the magnitudes their rounding scales with.
        let (mut sdy, mut sdyx, mut adx, mut ady) = (
            vec![0.0f64; c],
            vec![0.0f64; c],
            vec![0.0f64; c],
            vec![0.0f64; c],
        );
        for e in 0..n {
            let ch = e % c;
            let (d, xv) = (dy[e] as f64, x[e] as f64);
            let xc = xv - m[ch] as f64;
            sdy[ch] += d;
            sdyx[ch] += d * xc;
            ady[ch] += d.abs();
            adx[ch] += d.abs() * (xv.abs() + (m[ch] as f64).abs());
        }
        let coef0: Vec<f64> = v
            .iter()
            .map(|&v| 1.0 / (v as f64 + eps as f64).sqrt())
            .collect();
        let r = rest as f64;
        let dx = rel_err(&o[0], |e| {
            let ch = e % c;
            let k = gamma[ch] as f64 * coef0[ch];
            let c2 = coef0[ch] * coef0[ch];
            let xv = x[e] as f64;
            let xc = xv - m[ch] as f64;
            let want = k * ((dy[e] as f64 - sdy[ch] / r) - xc * c2 * (sdyx[ch] / r));
            let scale = k.abs()
                * ((dy[e] as f64).abs()
                    + ady[ch] / r
                    + (xv.abs() + (m[ch] as f64).abs()) * c2 * (adx[ch] / r));
            (want, scale)
        });
        let ds = rel_err(&o[1], |ch| (sdyx[ch] * coef0[ch], adx[ch] * coef0[ch]));
        let db = rel_err(&o[2], |ch| (sdy[ch], ady[ch]));
        dx.max(ds).max(db)
    })?;
    Ok((
        "FusedBatchNormGradV3".into(),
        vec![shape.to_vec(), shape.to_vec(), vec![c], vec![c], vec![c]],
        Work::Bytes(tb(half, 3 * n) + f32b(5 * c)),
        meas,
    ))
}

/// MaxPoolGrad 3x3 / stride 2 SAME (NHWC): orig_input, orig_output, grad. The reference
/// routes each gradient to TensorFlow's argmax (the first window element in row-major order,
/// replaced only by a strictly greater one) and sums in f64.
fn pool_grad_case(
    dev: &Device,
    shape: [usize; 4],
    half: bool,
    reps: usize,
    rng: &mut StdRng,
) -> Res<Case> {
    let [bn, h, w, c] = shape;
    let ((oh, pad_h), (ow, pad_w)) = (same_3s2(h), same_3s2(w));
    let pool_attrs = attrs(&[
        ("ksize", AttrValue::Ints(vec![1, 3, 3, 1])),
        ("strides", AttrValue::Ints(vec![1, 2, 2, 1])),
        ("padding", AttrValue::Str("SAME".into())),
    ]);
    let kernel = dev.kernel("MaxPoolGrad", &pool_attrs).map_err(err)?;
    let n = bn * h * w * c;
    let m = bn * oh * ow * c;
    let x = random(rng, n);
    let x = if half { to_half(x) } else { x };
    // orig_output: the forward max (only its shape matters to the kernel).
    let mut argmax = vec![0usize; m];
    let mut out = vec![0.0f32; m];
    for (e, (a, o)) in argmax.iter_mut().zip(out.iter_mut()).enumerate() {
        let ch = e % c;
        let ox = (e / c) % ow;
        let oy = (e / c / ow) % oh;
        let b = e / c / ow / oh;
        let mut best: Option<usize> = None;
        for dy in 0..3 {
            for dx in 0..3 {
                let (y, xx) = (
                    (oy * 2 + dy) as i64 - pad_h as i64,
                    (ox * 2 + dx) as i64 - pad_w as i64,
                );
                if y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w {
                    let i = ((b * h + y as usize) * w + xx as usize) * c + ch;
                    if best.is_none_or(|k| x[i] > x[k]) {
                        best = Some(i);
                    }
                }
            }
        }
        *a = best.expect("SAME windows are never empty");
        *o = x[*a];
    }
    let grad = random(rng, m);
    let grad = if half { to_half(grad) } else { grad };
    let mut want = vec![(0.0f64, 0.0f64); n];
    for (e, &a) in argmax.iter().enumerate() {
        want[a].0 += grad[e] as f64;
        want[a].1 += (grad[e] as f64).abs();
    }
    drop(argmax);
    let inputs = [
        (x, shape.to_vec()),
        (out, vec![bn, oh, ow, c]),
        (grad, vec![bn, oh, ow, c]),
    ];
    let hx: &[usize] = if half { &[0, 1, 2] } else { &[] };
    let meas = measure_t(dev, kernel.as_ref(), &inputs, hx, &[], reps, |_, o| {
        rel_err(&o[0], |e| want[e])
    })?;
    Ok((
        "MaxPoolGrad".into(),
        vec![shape.to_vec(), vec![bn, oh, ow, c], vec![bn, oh, ow, c]],
        Work::Bytes(tb(half, 2 * n + 2 * m)),
        meas,
    ))
}

/// Largest relative error of 256 sampled output entries against f64 dot products, scaled by
/// sum |a b| (A stored transposed per matrix if `ta`, B if `tb`).
fn check_matmul(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    (batch, m, k, n): (usize, usize, usize, usize),
    ta: bool,
    tb: bool,
    rng: &mut StdRng,
) -> f64 {
    use rand::Rng;
    let mut worst = 0.0f64;
    for _ in 0..256 {
        let (q, i, j) = (
            rng.random_range(0..batch),
            rng.random_range(0..m),
            rng.random_range(0..n),
        );
        let (a, b, c) = (
            &a[q * m * k..(q + 1) * m * k],
            &b[q * k * n..(q + 1) * k * n],
            &c[q * m * n..(q + 1) * m * n],
        );
        let (mut want, mut scale) = (0.0f64, 0.0f64);
        for p in 0..k {
            let x = if ta { a[p * m + i] } else { a[i * k + p] };
            let y = if tb { b[j * k + p] } else { b[p * n + j] };
            let t = x as f64 * y as f64;
            want += t;
            scale += t.abs();
        }
        let g = c[i * n + j];
        let e = if g.is_nan() {
            f64::INFINITY
        } else {
            (g as f64 - want).abs() / scale.max(f64::MIN_POSITIVE)
        };
        worst = worst.max(e);
    }
    worst
}

/// A plain compute copy of a float32 tensor: one u32, one vec4<u32> or four vec4<u32> per
/// invocation: the ceiling a memory-bound shader can reach, and what the ways of writing one
/// cost.
struct CopyKernel {
    how: CopyHow,
}

const COPY_WGSL: &str = r#"
struct Params { row: u32, n: u32, stride: u32, pad1: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> dst: array<ELEM>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let base = gid.y * p.row + gid.x;
    if base >= p.stride { return; }
BODY
}
"#;

/// The body of the copy shader for `k` elements per invocation, `stride` apart: all loads,
/// then all stores, each guarded by `i < p.n` (so the indexing is in range without wgpu's
/// checks).
fn copy_body(k: usize) -> String {
    let mut b = String::new();
    for j in 0..k {
        b += &format!(
            "    let i{j} = base + {j}u * p.stride;\n    var v{j}: ELEM;\n    if i{j} < p.n {{ v{j} = src[i{j}]; }}\n"
        );
    }
    for j in 0..k {
        b += &format!("    if i{j} < p.n {{ dst[i{j}] = v{j}; }}\n");
    }
    b
}

impl Kernel for CopyKernel {
    fn op(&self) -> &'static str {
        "bench_copy"
    }

    fn outputs(&self, inputs: &[Operand]) -> tfwgpu_runtime::Result<Vec<TensorDesc>> {
        Ok(vec![inputs[0].desc()])
    }

    fn record(
        &self,
        ctx: &KernelContext,
        inputs: &[Operand],
        outputs: &[DeviceRef],
    ) -> tfwgpu_runtime::Result<()> {
        let src = inputs[0].device("bench_copy", 0)?;
        let words = src.desc.byte_size() / 4;
        let (vec4, k, trusted, variant) = match self.how {
            CopyHow::U32 => (false, 1, false, "u32"),
            CopyHow::Vec4 => (true, 1, false, "vec4"),
            CopyHow::Vec4x4 => (true, 4, false, "vec4x4"),
            _ => (true, 4, true, "vec4x4t"),
        };
        if vec4 && !words.is_multiple_of(4) {
            return Err(tfwgpu_runtime::Error::InvalidArgument(
                "bench_copy vec4: the size must be a multiple of 16 bytes".into(),
            ));
        }
        let n = if vec4 { words / 4 } else { words };
        let elem = if vec4 { "vec4<u32>" } else { "u32" };
        let pipeline = ctx.pipeline(PipelineKey::new("bench_copy", None, variant), || {
            let mut s = ShaderSource::new(
                COPY_WGSL
                    .replace("BODY", &copy_body(k))
                    .replace("ELEM", elem),
            );
            if trusted {
                // Every index is compared with p.n, the element count of both bindings.
                s.checks = Checks::Trusted;
            }
            s
        })?;
        let threads = n.div_ceil(k as u64);
        let (groups, row) = grid_1d(threads, 256);
        let params: Vec<u8> = [row, n as u32, threads as u32, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        ctx.dispatch(
            &pipeline,
            &params,
            &[ctx.bind(src)?, ctx.bind(&outputs[0])?],
            groups,
        )
    }
}
