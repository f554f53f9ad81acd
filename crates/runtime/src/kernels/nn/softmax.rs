//! Softmax and LogSoftmax over the last axis, SparseSoftmaxCrossEntropyWithLogits and
//! SoftmaxCrossEntropyWithLogits (float32), one row per group of invocations
//! (`softmax.wgsl`).
//!
//! Numerics follow TensorFlow's kernels: the row maximum m is subtracted first; Softmax is
//! exp(x - m) / sum, LogSoftmax (x - m) - log(sum); the cross-entropy loss is
//! log(sum) - (x_label - m) (sparse) or sum_j labels_j (log(sum) - (x_j - m)) (dense), its
//! gradient exp(x - m) / sum - labels. exp and log are the elementwise family's (a few ULP),
//! sums are per-invocation partial sums combined by a tree (Softmax / LogSoftmax of contiguous
//! rows: `softmax_rows.wgsl`, whose rows held by one whole workgroup reduce through subgroup
//! operations where the device has them; `TFWGPU_SOFTMAX_SUBGROUP=0` keeps the trees). A row
//! holding NaN or +inf, or only -inf, gives NaN throughout, as in TensorFlow; a -inf logit
//! gives probability 0 and log probability -inf. In the dense cross-entropy a zero label at a
//! -inf logit gives a NaN loss (0 * inf), as in TensorFlow.
//!
//! Deviation: TensorFlow's CPU kernel of SparseSoftmaxCrossEntropyWithLogits reports a label
//! outside [0, classes) as an InvalidArgument error. A GPU kernel cannot raise one, so here —
//! as in TensorFlow's GPU kernel — that row's loss and every element of its gradient are NaN.

use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_2d};
use crate::kernel_manager::PipelineKey;
use crate::kernels::elementwise::{COMMON_WGSL, MATH_WGSL, fmt_shape};
use crate::kernels::wgsl::params;
use crate::{DType, Error, Result, bail_invalid};

const SOFTMAX_WGSL: &str = include_str!("softmax.wgsl");
const SOFTMAX_ROWS_WGSL: &str = include_str!("softmax_rows.wgsl");

pub(super) const DTYPES: &[DType] = &[DType::F32];
pub(super) const LABEL_DTYPES: &[DType] = &[DType::I32, DType::I64];

/// Invocations per workgroup of `softmax.wgsl`.
const WG: usize = 256;
/// Elements per invocation a row should have before more invocations share it.
const PER_THREAD: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Softmax,
    LogSoftmax,
    SparseXent,
    Xent,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Softmax => "Softmax",
            Mode::LogSoftmax => "LogSoftmax",
            Mode::SparseXent => "SparseSoftmaxCrossEntropyWithLogits",
            Mode::Xent => "SoftmaxCrossEntropyWithLogits",
        }
    }

    fn index(self) -> u32 {
        match self {
            Mode::Softmax => 0,
            Mode::LogSoftmax => 1,
            Mode::SparseXent => 2,
            Mode::Xent => 3,
        }
    }
}

pub(super) struct SoftmaxKernel {
    mode: Mode,
    /// SparseSoftmaxCrossEntropyWithLogits' `Tlabels`, when given.
    tlabels: Option<DType>,
}

impl SoftmaxKernel {
    pub fn build(mode: Mode, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let mut tlabels = None;
        if mode == Mode::SparseXent {
            tlabels = attrs
                .dtype_opt("Tlabels")
                .map_err(|e| crate::invalid_arg!("{}: {e}", mode.name()))?;
            if let Some(t) = tlabels
                && !LABEL_DTYPES.contains(&t)
            {
                return Err(Error::Unimplemented(format!(
                    "{} has no tfwgpu kernel for Tlabels={t}",
                    mode.name()
                )));
            }
        }
        Ok(Box::new(SoftmaxKernel { mode, tlabels }))
    }
}

/// The rows x cols view of a call, with the element strides of the logits and labels.
#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    rows: usize,
    cols: usize,
    x: (usize, usize),
    labels: (usize, usize),
    /// Sparse labels' dtype.
    label_dtype: Option<DType>,
}

impl SoftmaxKernel {
    fn check(&self, inputs: &[Operand]) -> Result<View> {
        let name = self.mode.name();
        let arity = if matches!(self.mode, Mode::Softmax | Mode::LogSoftmax) {
            1
        } else {
            2
        };
        if inputs.len() != arity {
            bail_invalid!("{name} takes {arity} input(s), got {}", inputs.len());
        }
        let x = inputs[0].desc();
        if !DTYPES.contains(&x.dtype) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={}",
                x.dtype
            )));
        }
        let view = match self.mode {
            Mode::Softmax | Mode::LogSoftmax => {
                if x.shape.is_empty() {
                    bail_invalid!("{name}: logits must have >= 1 dimension, got []");
                }
                let cols = *x.shape.last().expect("rank >= 1");
                let rows = x.shape[..x.shape.len() - 1].iter().product();
                View {
                    rows,
                    cols,
                    x: (cols, 1),
                    labels: (0, 0),
                    label_dtype: None,
                }
            }
            Mode::SparseXent => {
                let labels = inputs[1].desc();
                if !LABEL_DTYPES.contains(&labels.dtype) {
                    bail_invalid!(
                        "{name}: labels must be int32 or int64, got {}",
                        labels.dtype
                    );
                }
                if let Some(t) = self.tlabels
                    && t != labels.dtype
                {
                    bail_invalid!("{name}: labels are {} but Tlabels is {t}", labels.dtype);
                }
                if x.shape.len() != 2 {
                    bail_invalid!(
                        "{name}: logits must be 2-D, but got shape {}",
                        fmt_shape(&x.shape)
                    );
                }
                if labels.shape.len() != 1 {
                    bail_invalid!(
                        "{name}: labels must be 1-D, but got shape {}",
                        fmt_shape(&labels.shape)
                    );
                }
                if labels.shape[0] != x.shape[0] {
                    bail_invalid!(
                        "{name}: logits and labels must have the same first dimension, got \
                         logits shape {} and labels shape {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&labels.shape)
                    );
                }
                if x.shape[1] == 0 {
                    bail_invalid!(
                        "{name}: Must have at least one class, but got logits shape {}",
                        fmt_shape(&x.shape)
                    );
                }
                View {
                    rows: x.shape[0],
                    cols: x.shape[1],
                    x: (x.shape[1], 1),
                    labels: (0, 0),
                    label_dtype: Some(labels.dtype),
                }
            }
            Mode::Xent => {
                let labels = inputs[1].desc();
                if labels.dtype != x.dtype {
                    bail_invalid!(
                        "{name}: features are {} but labels are {}; both must have one dtype",
                        x.dtype,
                        labels.dtype
                    );
                }
                let bc = crate::kernels::elementwise::broadcast_shape(&[&x.shape, &labels.shape])
                    .ok_or_else(|| {
                    crate::invalid_arg!(
                        "{name}: logits and labels must be broadcastable: logits_size={} \
                             labels_size={}",
                        fmt_shape(&x.shape),
                        fmt_shape(&labels.shape)
                    )
                })?;
                if bc.len() != 2 {
                    bail_invalid!(
                        "{name}: logits and labels must be either 2-dimensional, or broadcasted \
                         to be 2-dimensional (logits {}, labels {})",
                        fmt_shape(&x.shape),
                        fmt_shape(&labels.shape)
                    );
                }
                // Strides of an input of rank <= 2 on the [rows, cols] output.
                let strides = |s: &[usize]| -> (usize, usize) {
                    let mut p = vec![1; 2 - s.len()];
                    p.extend_from_slice(s);
                    (
                        if p[0] == 1 { 0 } else { p[1] },
                        if p[1] == 1 { 0 } else { 1 },
                    )
                };
                View {
                    rows: bc[0],
                    cols: bc[1],
                    x: strides(&x.shape),
                    labels: strides(&labels.shape),
                    label_dtype: None,
                }
            }
        };
        let total = view.rows.saturating_mul(view.cols);
        if total > u32::MAX as usize {
            return Err(Error::Unimplemented(format!(
                "{name}: tensors of more than 2^32-1 elements are not supported (got {total})"
            )));
        }
        Ok(view)
    }
}

fn shader(mode: Mode, label_dtype: Option<DType>) -> String {
    let f = "@group(0) @binding";
    let (decls, funcs) = match mode {
        Mode::Softmax | Mode::LogSoftmax => (
            format!(
                "{f}(1) var<storage, read_write> x: array<f32>;
{f}(2) var<storage, read_write> out: array<f32>;"
            ),
            "fn write_out(i: u32, v: f32) {
    out[i] = v;
}
fn write_loss(r: u32, v: f32) {}
fn label_value(row: u32, j: u32) -> f32 {
    return 0.0;
}
fn label_index(row: u32) -> i32 {
    return -1;
}"
            .to_string(),
        ),
        Mode::SparseXent | Mode::Xent => {
            let label = if mode == Mode::Xent {
                "fn label_value(row: u32, j: u32) -> f32 {
    return bitcast<f32>(labels[row * p.l_rs + j * p.l_cs]);
}
fn label_index(row: u32) -> i32 {
    return -1;
}"
            } else if label_dtype == Some(DType::I64) {
                "fn label_value(row: u32, j: u32) -> f32 {
    return 0.0;
}
// The label of a row, -1 when it is outside [0, cols).
fn label_index(row: u32) -> i32 {
    let lo = labels[2u * row];
    let hi = labels[2u * row + 1u];
    if hi != 0u || lo >= p.cols {
        return -1;
    }
    return i32(lo);
}"
            } else {
                "fn label_value(row: u32, j: u32) -> f32 {
    return 0.0;
}
// The label of a row, -1 when it is outside [0, cols).
fn label_index(row: u32) -> i32 {
    let v = bitcast<i32>(labels[row]);
    if v < 0 || u32(v) >= p.cols {
        return -1;
    }
    return v;
}"
            };
            (
                format!(
                    "{f}(1) var<storage, read_write> x: array<f32>;
{f}(2) var<storage, read_write> labels: array<u32>;
{f}(3) var<storage, read_write> loss: array<f32>;
{f}(4) var<storage, read_write> backprop: array<f32>;"
                ),
                format!(
                    "fn write_out(i: u32, v: f32) {{
    backprop[i] = v;
}}
fn write_loss(r: u32, v: f32) {{
    loss[r] = v;
}}
{label}"
                ),
            )
        }
    };
    SOFTMAX_WGSL
        .replace("$DECLS", &decls)
        .replace("$FUNCS", &funcs)
        .replace("$MODE", &mode.index().to_string())
        .replace("$COMMON", COMMON_WGSL)
        .replace("$MATH", MATH_WGSL)
}

/// `softmax_rows.wgsl` for Softmax (`log` false) or LogSoftmax, loading `vec4` floats at a
/// time or one, in workgroups of `wgs` invocations; `cached`: rows of at most `k` loads per
/// invocation, kept in registers; `sg`: the row reductions through subgroup operations (one
/// row per workgroup only).
fn rows_shader(log: bool, vec4: bool, cached: bool, k: usize, wgs: usize, sg: bool) -> String {
    let (v, funcs) = if vec4 {
        (
            "vec4<f32>",
            "fn lanes_max(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}
fn lanes_nan(v: vec4<f32>) -> bool {
    return any((bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
}
fn lanes_sum_exp(v: vec4<f32>, m: f32) -> f32 {
    return ((exp_le0(v.x - m) + exp_le0(v.y - m)) + exp_le0(v.z - m)) + exp_le0(v.w - m);
}
fn lanes_exp(v: vec4<f32>, m: f32) -> vec4<f32> {
    return vec4<f32>(exp_le0(v.x - m), exp_le0(v.y - m), exp_le0(v.z - m), exp_le0(v.w - m));
}
fn lanes_sum(v: vec4<f32>) -> f32 {
    return ((v.x + v.y) + v.z) + v.w;
}
fn lanes_splat(v: f32) -> vec4<f32> {
    return vec4<f32>(v);
}
fn out_vec(v: vec4<f32>, m: f32, s: f32, log_s: f32) -> vec4<f32> {
    return vec4<f32>(out_value(v.x, m, s, log_s), out_value(v.y, m, s, log_s),
        out_value(v.z, m, s, log_s), out_value(v.w, m, s, log_s));
}",
        )
    } else {
        (
            "f32",
            "fn lanes_max(v: f32) -> f32 {
    return v;
}
fn lanes_nan(v: f32) -> bool {
    return is_nan(v);
}
fn lanes_sum_exp(v: f32, m: f32) -> f32 {
    return exp_le0(v - m);
}
fn lanes_exp(v: f32, m: f32) -> f32 {
    return exp_le0(v - m);
}
fn lanes_sum(v: f32) -> f32 {
    return v;
}
fn lanes_splat(v: f32) -> f32 {
    return v;
}
fn out_vec(v: f32, m: f32, s: f32, log_s: f32) -> f32 {
    return out_value(v, m, s, log_s);
}",
        )
    };
    // The CACHED code for k loads per invocation (k = 4 when not cached: dead code then).
    let k = if cached { k } else { 4 };
    let lines = |f: &dyn Fn(usize) -> String| (0..k).map(f).collect::<Vec<_>>().join("\n");
    let off = |i: usize| {
        if i == 0 {
            String::new()
        } else {
            format!(" + {i}u * t")
        }
    };
    // The maximum of the loads as a balanced tree, the sum of their exps from the left.
    fn tree(v: &[String]) -> String {
        if v.len() == 1 {
            return v[0].clone();
        }
        let (a, b) = v.split_at(v.len() / 2);
        format!("max({}, {})", tree(a), tree(b))
    }
    let maxes: Vec<String> = (0..k).map(|i| format!("lanes_max(c{i})")).collect();
    let mut sum = "lanes_sum(e0)".to_string();
    for i in 1..k {
        sum = format!("({sum}) + lanes_sum(e{i})");
    }
    SOFTMAX_ROWS_WGSL
        .replace(
            "$C_DECLS",
            &lines(&|i| {
                format!("    var c{i} = ninf;\n    var e{i} = lanes_splat(0.0);")
            }),
        )
        .replace(
            "$C_LOADS",
            &lines(&|i| {
                format!(
                    "        if tid{o} < n {{\n            c{i} = x[j{o}];\n        }}",
                    o = off(i)
                )
            }),
        )
        .replace("$C_MAX", &tree(&maxes))
        .replace(
            "$C_EXP",
            &lines(&|i| format!("            e{i} = lanes_exp(c{i}, mv);")),
        )
        .replace("$C_SUM", &sum)
        .replace(
            "$C_NAN",
            &(0..k)
                .map(|i| format!("lanes_nan(c{i})"))
                .collect::<Vec<_>>()
                .join(" || "),
        )
        .replace(
            "$C_STORE",
            &lines(&|i| {
                format!(
                    "        if tid{o} < n {{\n            out[j{o}] = cached_out(c{i}, e{i}, m, f, log_s);\n        }}",
                    o = off(i)
                )
            }),
        )
        .replace("$WGS", &wgs.to_string())
        .replace("$SG_FNS", if sg { SG_FNS } else { SG_STUBS })
        .replace(
            "$SG_ARGS",
            if sg {
                ", @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32,
        @builtin(subgroup_id) sid: u32, @builtin(num_subgroups) nsg: u32"
            } else {
                ""
            },
        )
        .replace("$SG_PASS", if sg { ", sgi, sgs, sid, nsg" } else { "" })
        .replace("$SG", &sg.to_string())
        .replace("$VFUNCS", funcs)
        .replace("$V", v)
        .replace("$LOG", &log.to_string())
        .replace("$CACHED", &cached.to_string())
        .replace("$COMMON", COMMON_WGSL)
        .replace("$MATH", MATH_WGSL)
}

/// `softmax_rows.wgsl`'s row reductions over one workgroup through subgroups: a subgroup
/// reduction, one shared slot per subgroup, the first subgroup reduces the slots (each lane a
/// strided part, then a subgroup reduction), and every invocation reads the result.
const SG_FNS: &str = "fn wg_max(v: f32, sgi: u32, sgs: u32, sid: u32, nsg: u32) -> f32 {
    let a = subgroupMax(v);
    if sgi == 0u {
        sh[sid] = a;
    }
    workgroupBarrier();
    if sid == 0u {
        var b = bitcast<f32>(NEG_INF_BITS);
        for (var k = sgi; k < nsg; k = k + sgs) {
            b = max(b, sh[k]);
        }
        b = subgroupMax(b);
        if sgi == 0u {
            sh_out = b;
        }
    }
    workgroupBarrier();
    return sh_out;
}
fn wg_sum(v: f32, sgi: u32, sgs: u32, sid: u32, nsg: u32) -> f32 {
    let a = subgroupAdd(v);
    if sgi == 0u {
        sh[sid] = a;
    }
    workgroupBarrier();
    if sid == 0u {
        var b = 0.0;
        for (var k = sgi; k < nsg; k = k + sgs) {
            b = b + sh[k];
        }
        b = subgroupAdd(b);
        if sgi == 0u {
            sh_out = b;
        }
    }
    workgroupBarrier();
    return sh_out;
}";

/// Without subgroups: never called (SG is false).
const SG_STUBS: &str = "fn wg_max(v: f32) -> f32 {
    return v;
}
fn wg_sum(v: f32) -> f32 {
    return v;
}";

/// Whether `softmax_rows.wgsl` may reduce its rows through subgroups (one row per
/// workgroup, SUBGROUP on the device); `TFWGPU_SOFTMAX_SUBGROUP=0` keeps the trees
/// (measurements, tests of the tree path on devices with subgroups).
fn subgroups_enabled(ctx: &KernelContext) -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    ctx.features().contains(wgpu::Features::SUBGROUP)
        && *ON.get_or_init(|| !crate::env_is("TFWGPU_SOFTMAX_SUBGROUP", "0"))
}

/// The workgroup size of `softmax_rows.wgsl`'s 8-load registers variant.
const BIG_WG: usize = 1024;

/// Invocations per row of `softmax_rows.wgsl` for rows of `loads` loads: about 4 loads (two
/// iterations of its main loop) per invocation, a power of two, at most the workgroup size.
fn rows_threads(loads: usize) -> usize {
    loads.div_ceil(4).max(1).next_power_of_two().min(WG)
}

/// Invocations per row (a power of two, at most the workgroup size).
fn threads_per_row(cols: usize) -> usize {
    cols.div_ceil(PER_THREAD).max(1).next_power_of_two().min(WG)
}

impl Kernel for SoftmaxKernel {
    fn op(&self) -> &'static str {
        self.mode.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let v = self.check(inputs)?;
        Ok(match self.mode {
            Mode::Softmax | Mode::LogSoftmax => vec![inputs[0].desc()],
            _ => vec![
                TensorDesc::new(DType::F32, &[v.rows]),
                TensorDesc::new(DType::F32, &[v.rows, v.cols]),
            ],
        })
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.mode.name();
        let v = self.check(inputs)?;
        let want = self.outputs(inputs)?;
        for (o, w) in outputs.iter().zip(&want) {
            if &o.desc != w {
                bail_invalid!(
                    "{name}: output is {} {} but the op computes {} {}",
                    o.desc.dtype,
                    fmt_shape(&o.desc.shape),
                    w.dtype,
                    fmt_shape(&w.shape)
                );
            }
        }
        if outputs.len() != want.len() {
            bail_invalid!(
                "{name}: {} outputs for {} results",
                outputs.len(),
                want.len()
            );
        }
        // Nothing to compute without rows; without columns only the dense loss (0) is.
        if v.rows == 0 || (v.cols == 0 && self.mode != Mode::Xent) {
            return Ok(());
        }
        let mut binds = vec![ctx.bind(inputs[0].device(name, 0)?)?];
        if inputs.len() > 1 {
            binds.push(ctx.bind(inputs[1].device(name, 1)?)?);
        }
        for o in outputs {
            binds.push(if o.desc.byte_size() == 0 {
                ctx.temp(4)?
            } else {
                crate::kernels::elementwise::bind_out(ctx, name, o)?
            });
        }
        let mode = self.mode;
        if matches!(mode, Mode::Softmax | Mode::LogSoftmax) {
            return record_rows(ctx, mode, &v, &binds);
        }
        let key = PipelineKey::new(
            "nn",
            v.label_dtype,
            format!("softmax/{}", mode.name().to_ascii_lowercase()),
        );
        let pipeline = ctx.pipeline(key, || {
            crate::kernels::membound_shader(shader(mode, v.label_dtype))
        })?;
        let t = threads_per_row(v.cols);
        let g = WG / t;
        let groups = v.rows.div_ceil(g);
        let (gx, gy) = grid_2d(groups, || format!("{name}: {} rows", v.rows))?;
        let p = params(&[
            v.rows as u32,
            v.cols as u32,
            g as u32,
            t as u32,
            gx as u32,
            v.x.0 as u32,
            v.x.1 as u32,
            v.labels.0 as u32,
            v.labels.1 as u32,
            0,
            0,
            0,
        ]);
        ctx.dispatch(&pipeline, &p, &binds, [gx as u32, gy as u32, 1])
    }
}

/// Softmax / LogSoftmax of a contiguous [rows, cols] tensor through `softmax_rows.wgsl`.
fn record_rows(
    ctx: &KernelContext,
    mode: Mode,
    v: &View,
    binds: &[crate::exec::BufferRange],
) -> Result<()> {
    let name = mode.name();
    // vec4 loads need cols % 4 == 0 and 16-byte aligned bindings (rows then start aligned).
    let vec4 = v.cols.is_multiple_of(4)
        && (ctx.limits().min_storage_buffer_offset_alignment as usize).is_multiple_of(16);
    let log = mode == Mode::LogSoftmax;
    let loads = if vec4 { v.cols / 4 } else { v.cols };
    let mut t = rows_threads(loads);
    // At most 4 loads per invocation: the registers variant (one exp per element).
    let mut cached = loads <= 4 * t;
    let (mut k, mut wgs) = (4, WG);
    let l = ctx.limits();
    // `TFWGPU_SOFTMAX_REGS=4`: no 8-load variant (longer rows stream; for measurements),
    // read once per process.
    static REGS4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let big = !*REGS4.get_or_init(|| crate::env_is("TFWGPU_SOFTMAX_REGS", "4"));
    if !cached
        && big
        && loads <= 8 * BIG_WG
        && l.max_compute_invocations_per_workgroup as usize >= BIG_WG
        && l.max_compute_workgroup_size_x as usize >= BIG_WG
    {
        // Longer rows up to 8 loads per invocation in workgroups of 1024: still registers, so
        // the row is read once (streaming, pass 3 re-reads it, from DRAM once the rows in
        // flight outgrow the L2).
        t = loads.div_ceil(8).next_power_of_two().max(WG);
        cached = true;
        k = 8;
        wgs = BIG_WG;
    }
    let g = wgs / t;
    let sg = g == 1 && subgroups_enabled(ctx);
    let key = PipelineKey::new(
        "nn",
        None,
        format!(
            "softmax_rows/{}{}{}{}",
            if log { "log" } else { "softmax" },
            if vec4 { "/vec4" } else { "" },
            match (cached, k) {
                (false, _) => "",
                (true, 4) => "/cached",
                _ => "/cached8",
            },
            if sg { "/sg" } else { "" }
        ),
    );
    let pipeline = ctx.pipeline(key, || {
        crate::kernels::membound_shader(rows_shader(log, vec4, cached, k, wgs, sg))
    })?;
    let groups = v.rows.div_ceil(g);
    let (gx, gy) = grid_2d(groups, || format!("{name}: {} rows", v.rows))?;
    let p = params(&[
        v.rows as u32,
        loads as u32,
        g as u32,
        t as u32,
        gx as u32,
        0,
        0,
        0,
    ]);
    ctx.dispatch(&pipeline, &p, binds, [gx as u32, gy as u32, 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads() {
        assert_eq!(threads_per_row(1), 1);
        assert_eq!(threads_per_row(10), 2);
        assert_eq!(threads_per_row(1000), 128);
        assert_eq!(threads_per_row(1 << 20), 256);
        assert_eq!(rows_threads(1), 1);
        assert_eq!(rows_threads(250), 64);
        assert_eq!(rows_threads(8192), 256);
    }
}
