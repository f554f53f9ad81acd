//! reduce family: Sum, Max, Min, Mean and Prod over any set of axes (float32, int32, float16),
//! and All / Any over bool. float16 reduces in float32 (as TensorFlow's GPU kernels accumulate
//! half in float): the first pass widens the halves exactly where it loads them (a prologue),
//! the float32 passes follow, the result is rounded once.
//!
//! The reduced axes (a host-memory int32/int64 scalar or vector, negative axes wrapping,
//! duplicates allowed) are simplified first: dimensions of size 1 are dropped and adjacent
//! dimensions that are all reduced or all kept are merged. What is left alternates kept and
//! reduced blocks. Each reduced block is one pass of `reduce.wgsl` over an (outer, r, inner)
//! view: a row reduction when the block is innermost (inner == 1), a column reduction
//! otherwise. Non-adjacent reduced blocks take one pass each, through temporaries.
//!
//! Semantics follow TensorFlow's CPU kernels: the reduction of no elements is the identity
//! (Sum 0, Prod 1, Max -inf / i32::MIN, Min +inf / i32::MAX, Mean NaN for float32 and 0 for
//! int32); Max and Min propagate NaN; int32 arithmetic wraps; int32 Mean truncates.
//!
//! All and Any (bool, no type attribute) are the int32 Min and Max of the input widened to
//! 0/1 words (`bool.wgsl`), narrowed back to bytes by the last step: All of no elements is
//! true, Any of no elements false.

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_2d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::params;
use crate::{DType, Error, Result, bail_invalid};

const DTYPES: &[DType] = &[DType::F32, DType::I32, DType::F16];

/// A reduction's registration: `reduction_indices` (input 1) in host memory.
macro_rules! reduce_row {
    ($name:literal, $op:expr, $type_attr:literal, $dtypes:expr) => {
        OpDef {
            op: $name,
            type_attr: $type_attr,
            dtypes: $dtypes,
            host_inputs: &[(1, "reduction_indices")],
            factory: |a| Reduce::build($op, a),
        }
    };
}

/// Registration table (All and Any: bool, no type attribute).
pub const OPS: &[OpDef] = &[
    reduce_row!("Sum", ReduceOp::Sum, "T", DTYPES),
    reduce_row!("Max", ReduceOp::Max, "T", DTYPES),
    reduce_row!("Min", ReduceOp::Min, "T", DTYPES),
    reduce_row!("Mean", ReduceOp::Mean, "T", DTYPES),
    reduce_row!("Prod", ReduceOp::Prod, "T", DTYPES),
    reduce_row!("All", ReduceOp::All, "", &[]),
    reduce_row!("Any", ReduceOp::Any, "", &[]),
];

const BOOL_WGSL: &str = include_str!("bool.wgsl");
const REDUCE_VEC4_WGSL: &str = include_str!("reduce_vec4.wgsl");

const REDUCE_WGSL: &str = include_str!("reduce.wgsl");

/// Invocations per workgroup of `reduce.wgsl`.
const WG: u32 = 256;
/// Elements each invocation should combine, at least, before a tree step pays off.
const PER_THREAD: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    Sum,
    Max,
    Min,
    Mean,
    Prod,
    /// Bool, computed as the int32 Min of 0/1 words.
    All,
    /// Bool, computed as the int32 Max of 0/1 words.
    Any,
}

impl ReduceOp {
    /// The float reduction TensorFlow names `name` (Sum, Mean, Max, Min, Prod): the ones a
    /// fused reduction may run.
    pub(crate) fn from_name(name: &str) -> Option<ReduceOp> {
        [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
        ]
        .into_iter()
        .find(|op| op.name() == name)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "Sum",
            ReduceOp::Max => "Max",
            ReduceOp::Min => "Min",
            ReduceOp::Mean => "Mean",
            ReduceOp::Prod => "Prod",
            ReduceOp::All => "All",
            ReduceOp::Any => "Any",
        }
    }

    fn is_bool(self) -> bool {
        matches!(self, ReduceOp::All | ReduceOp::Any)
    }

    /// The input dtypes the op takes.
    fn dtypes(self) -> &'static [DType] {
        if self.is_bool() {
            &[DType::Bool]
        } else {
            DTYPES
        }
    }

    /// The identity's bit pattern in `dtype` (f32 or i32).
    fn identity_bits(self, dtype: DType) -> u32 {
        let float = dtype == DType::F32;
        match self {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Prod if float => 1.0f32.to_bits(),
            ReduceOp::Prod => 1,
            ReduceOp::Max if float => f32::NEG_INFINITY.to_bits(),
            ReduceOp::Max => i32::MIN as u32,
            ReduceOp::Min if float => f32::INFINITY.to_bits(),
            ReduceOp::Min => i32::MAX as u32,
            ReduceOp::All => 1,
            ReduceOp::Any => 0,
        }
    }

    /// The WGSL of `combine(a, b)`.
    fn combine_body(self, dtype: DType) -> &'static str {
        let float = dtype == DType::F32;
        match self {
            ReduceOp::Sum | ReduceOp::Mean => "return a + b;",
            ReduceOp::Prod => "return a * b;",
            ReduceOp::Max if float => {
                "if is_nan(a) { return a; }\n    if is_nan(b) { return b; }\n    return max(a, b);"
            }
            ReduceOp::Max => "return max(a, b);",
            ReduceOp::Min if float => {
                "if is_nan(a) { return a; }\n    if is_nan(b) { return b; }\n    return min(a, b);"
            }
            ReduceOp::Min | ReduceOp::All => "return min(a, b);",
            ReduceOp::Any => "return max(a, b);",
        }
    }

    /// The WGSL of `finalize(v)` (applied by the last pass).
    fn finalize_body(self, dtype: DType) -> &'static str {
        match (self, dtype) {
            (ReduceOp::Mean, DType::F32) => {
                "if p.count == 0u { return bitcast<f32>(0x7fc00000u); }\n    return v / f32(p.count);"
            }
            (ReduceOp::Mean, _) => "if p.count == 0u { return 0; }\n    return v / i32(p.count);",
            _ => "return v;",
        }
    }

    /// Whether float rounding makes the pairwise cascade worthwhile.
    fn cascade(self, dtype: DType) -> bool {
        dtype == DType::F32 && matches!(self, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod)
    }
}

/// One reduction kernel (one TensorFlow node).
struct Reduce {
    op: ReduceOp,
    keep_dims: bool,
}

impl Reduce {
    fn build(op: ReduceOp, attrs: &crate::Attrs) -> Result<Box<dyn Kernel>> {
        let keep_dims = attrs.bool_or("keep_dims", false)?;
        if !op.is_bool()
            && let Some(t) = attrs.dtype_opt("T")?
            && !DTYPES.contains(&t)
        {
            return Err(Error::Unimplemented(format!(
                "{} has no tfwgpu kernel for T={t}",
                op.name()
            )));
        }
        Ok(Box::new(Reduce { op, keep_dims }))
    }

    /// Validates the inputs; returns the reduced-axis mask.
    fn check(&self, inputs: &[Operand]) -> Result<Vec<bool>> {
        let op = self.op.name();
        if inputs.len() != 2 {
            bail_invalid!(
                "{op} takes 2 inputs (input, reduction_indices), got {}",
                inputs.len()
            );
        }
        let dtype = inputs[0].dtype();
        if !self.op.dtypes().contains(&dtype) {
            return Err(Error::Unimplemented(format!(
                "{op} has no tfwgpu kernel for T={dtype}"
            )));
        }
        let axes = inputs[1].host(op, 1)?;
        if axes.shape.len() > 1 {
            bail_invalid!(
                "{op}: reduction_indices must be a scalar or a vector, got shape {:?}",
                axes.shape
            );
        }
        let axes = axes.to_i64_vec().map_err(|_| {
            crate::invalid_arg!(
                "{op}: reduction_indices must be int32 or int64, got {}",
                axes.dtype
            )
        })?;
        reduction_mask(op, inputs[0].shape(), &axes)
    }
}

/// The reduced-dimension mask of `shape` for `axes` (negative axes wrap, duplicates allowed).
pub(crate) fn reduction_mask(op: &str, shape: &[usize], axes: &[i64]) -> Result<Vec<bool>> {
    let rank = shape.len() as i64;
    let mut mask = vec![false; shape.len()];
    for &a in axes {
        if a < -rank || a >= rank {
            bail_invalid!(
                "{op}: Invalid reduction dimension ({a} for input with {rank} dimension(s)), \
                 input shape {shape:?}"
            );
        }
        mask[a.rem_euclid(rank.max(1)) as usize] = true;
    }
    Ok(mask)
}

/// The output shape of a reduction.
pub(crate) fn output_shape(shape: &[usize], mask: &[bool], keep_dims: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&d, &m)| match (m, keep_dims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// One pass: reduce the middle axis of an (outer, r, inner) view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    outer: usize,
    r: usize,
    inner: usize,
}

/// What a reduction records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// The output is empty.
    Nothing,
    /// Nothing is reduced (every reduced dimension has size 1): the output is the input.
    Copy,
    /// Passes in order; the last one writes the output.
    Passes(Vec<Pass>),
}

pub(crate) fn plan(shape: &[usize], mask: &[bool]) -> Plan {
    let out_elems: usize = shape
        .iter()
        .zip(mask)
        .filter(|&(_, &m)| !m)
        .map(|(&d, _)| d)
        .product();
    if out_elems == 0 {
        return Plan::Nothing;
    }
    if shape.contains(&0) {
        // A reduced dimension is empty: every output is the identity.
        return Plan::Passes(vec![Pass {
            outer: out_elems,
            r: 0,
            inner: 1,
        }]);
    }
    // Drop size-1 dimensions, merge runs of equal status.
    let mut blocks: Vec<(usize, bool)> = vec![];
    for (&d, &m) in shape.iter().zip(mask) {
        if d == 1 {
            continue;
        }
        match blocks.last_mut() {
            Some((size, red)) if *red == m => *size *= d,
            _ => blocks.push((d, m)),
        }
    }
    let mut passes = vec![];
    // Reduce the largest reduced block first: it shrinks the data the most.
    while let Some(j) = (0..blocks.len())
        .filter(|&j| blocks[j].1)
        .max_by_key(|&j| (blocks[j].0, j))
    {
        let outer: usize = blocks[..j].iter().map(|b| b.0).product();
        let inner: usize = blocks[j + 1..].iter().map(|b| b.0).product();
        passes.push(Pass {
            outer,
            r: blocks[j].0,
            inner,
        });
        blocks.remove(j);
        // The kept neighbours of the removed block are now adjacent.
        if j > 0 && j < blocks.len() && !blocks[j - 1].1 && !blocks[j].1 {
            let size = blocks[j].0;
            blocks[j - 1].0 *= size;
            blocks.remove(j);
        }
    }
    if passes.is_empty() {
        Plan::Copy
    } else {
        Plan::Passes(passes)
    }
}

/// Invocations that cooperate on one output (a power of two, at most the workgroup size).
fn threads_per_output(r: usize) -> u32 {
    (r.div_ceil(PER_THREAD).max(1).next_power_of_two()).min(WG as usize) as u32
}

fn to_u32(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Unimplemented(format!(
            "{op}: tensors of more than 2^32 elements are not supported"
        ))
    })
}

impl Kernel for Reduce {
    fn op(&self) -> &'static str {
        self.op.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let mask = self.check(inputs)?;
        let shape = output_shape(inputs[0].shape(), &mask, self.keep_dims);
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.op.name();
        let mask = self.check(inputs)?;
        let input = inputs[0].device(op, 0)?;
        let output = &outputs[0];
        let dtype = input.desc.dtype;
        let shape = &input.desc.shape;
        to_u32(op, input.desc.num_elements())?;
        let passes = match plan(shape, &mask) {
            Plan::Nothing => return Ok(()),
            Plan::Copy => {
                let src = ctx.bind(input)?;
                let dst = ctx.bind(output)?;
                // Outputs are padded: a bool copy may round up to whole words.
                return ctx.copy(&src, &dst, output.desc.byte_size().next_multiple_of(4));
            }
            Plan::Passes(p) => p,
        };
        if dtype == DType::Bool {
            // Widen to 0/1 words, reduce as int32, narrow the result back to bytes.
            let n = input.desc.num_elements();
            let src = ctx.bind(input)?;
            let wide = ctx.temp((n.max(1) * 4) as u64)?;
            bool_convert(ctx, "widen", &src, &wide, n)?;
            let m = output.desc.num_elements();
            let res = ctx.temp((m * 4) as u64)?;
            self.passes(ctx, wide, res.clone(), DType::I32, shape, &mask, &passes)?;
            let dst = crate::kernels::elementwise::bind_out(ctx, op, output)?;
            return bool_convert(ctx, "narrow", &res, &dst, m);
        }
        if dtype == DType::F16 {
            // The first step loads the halves and widens them where it loads (no float32
            // copy of the input: it would need twice the input's bytes, past the binding
            // limit of 128 MiB adapters from 32M elements); the float32 result is rounded
            // once.
            let (hw, suffix) = crate::kernels::f16conv::choice(ctx, true)?;
            let wgsl = |_: bool| half_prologue_wgsl(hw);
            let pro = Prologue {
                key: format!("f16{suffix}"),
                wgsl: &wgsl,
                fields: "",
                words: vec![],
                inputs: vec![ctx.bind(input)?],
                outputs: vec![],
            };
            let res = ctx.temp_tensor(TensorDesc::new(DType::F32, &output.desc.shape))?;
            run_passes(
                ctx,
                self.op,
                First::Prologue(&pro),
                ctx.bind(&res)?,
                DType::F32,
                shape,
                &mask,
                &passes,
            )?;
            return crate::kernels::nn::f16::convert(ctx, op, &res, output);
        }
        let src = ctx.bind(input)?;
        let dst = ctx.bind(output)?;
        self.passes(ctx, src, dst, dtype, shape, &mask, &passes)
    }
}

/// The prologue of a float16 reduction: element `e` of the packed halves (two per word, the
/// lower first), widened exactly to float32 (`f16conv`'s conversions, in hardware where the
/// adapter passed its self-test).
fn half_prologue_wgsl(hw: bool) -> String {
    format!(
        "@group(0) @binding(1) var<storage, read_write> xh: array<u32>;
{}
{}
fn elem(e: u32) -> f32 {{
    return f16x2_to_f32(xh[e >> 1u])[e & 1u];
}}
fn elem4(e: u32) -> vec4<f32> {{
    let w = e >> 1u;
    return vec4<f32>(f16x2_to_f32(xh[w]), f16x2_to_f32(xh[w + 1u]));
}}
",
        crate::kernels::elementwise::COMMON_WGSL,
        crate::kernels::f16conv::f16x2_wgsl(hw)
    )
}

/// Converts `n` bools (bytes) to 0/1 int32 words ("widen") or back ("narrow").
fn bool_convert(
    ctx: &KernelContext,
    dir: &'static str,
    src: &crate::exec::BufferRange,
    dst: &crate::exec::BufferRange,
    n: usize,
) -> Result<()> {
    let pipeline = ctx.pipeline(PipelineKey::new("reduce", Some(DType::Bool), dir), || {
        ShaderSource::new(
            BOOL_WGSL
                .replace("$LINEAR_INDEX", crate::kernels::wgsl::LINEAR_INDEX)
                .replace("$NARROW", &(dir == "narrow").to_string()),
        )
    })?;
    let threads = if dir == "narrow" { n.div_ceil(4) } else { n };
    let (groups, row) = crate::kernel::grid_1d(threads as u64, 256);
    ctx.dispatch(
        &pipeline,
        &params(&[row, to_u32(dir, n)?, to_u32(dir, threads)?, 0]),
        &[src.clone(), dst.clone()],
        groups,
    )
}

impl Reduce {
    /// Records the passes of a reduction of `shape` over `mask` from `src` to `dst`.
    #[allow(clippy::too_many_arguments)]
    fn passes(
        &self,
        ctx: &KernelContext,
        src: crate::exec::BufferRange,
        output: crate::exec::BufferRange,
        dtype: DType,
        shape: &[usize],
        mask: &[bool],
        passes: &[Pass],
    ) -> Result<()> {
        run_passes(
            ctx,
            self.op,
            First::Buffer(src),
            output,
            dtype,
            shape,
            mask,
            passes,
        )
    }
}

/// A reduction's input computed where it is loaded: WGSL that declares the storage bindings
/// it reads (its input 0 at binding 1, input k >= 1 at binding k + 2: binding 2 is the
/// reduction's output), `fn elem(e: u32) -> f32`, element `e` (row-major) of the reduced
/// tensor, and `fn elem4(e: u32) -> vec4<f32>`, elements `e` to `e + 3` (`e` a multiple of
/// 4, for vec4 loads), using the uniform fields it adds to the reduce's params. The fused family's
/// programs are such prologues (`_TfwgpuFusedReduce`): the elementwise result is never
/// written, and the reduction folds the same values in the same order as it folds the
/// written tensor (its passes are those of the plain reduction of that shape).
pub(crate) struct Prologue<'a> {
    /// Names the WGSL, in the pipeline keys (the program, its read mode).
    pub key: String,
    /// The bindings, helper functions and `elem` (built when the pipeline is), for a step
    /// loading vec4 (`true`: `elem4` is what it calls) or words; they must define `is_nan`,
    /// which the reduce shaders use.
    pub wgsl: &'a dyn Fn(bool) -> String,
    /// Fields appended to the reduce's `Params` (WGSL, each `name: type,` on its own line;
    /// they start 16-byte aligned).
    pub fields: &'a str,
    /// Their values, as u32 words.
    pub words: Vec<u32>,
    /// The bindings of its inputs, in order.
    pub inputs: Vec<crate::exec::BufferRange>,
    /// The bindings of the tensors it writes (at the elements it computes: each once, in the
    /// first step), bound after its inputs.
    pub outputs: Vec<crate::exec::BufferRange>,
}

/// Where the first step of a reduction loads from.
pub(crate) enum First<'a> {
    /// A tensor.
    Buffer(crate::exec::BufferRange),
    /// A prologue's elements.
    Prologue(&'a Prologue<'a>),
}

/// The float32 reduction `rop` of the elements `prologue` computes for a tensor of `shape`
/// over `mask`, into `output` (of the reduction's output shape): the passes and steps of the
/// plain reduction of such a tensor, so that the result has the same bits. `Plan::Copy` (no
/// element is reduced) is the caller's: the output is then the elementwise result itself.
pub(crate) fn record_prologue(
    ctx: &KernelContext,
    rop: ReduceOp,
    prologue: &Prologue<'_>,
    shape: &[usize],
    mask: &[bool],
    output: &DeviceRef,
) -> Result<()> {
    let op = rop.name();
    to_u32(op, shape.iter().product())?;
    let passes = match plan(shape, mask) {
        Plan::Nothing => return Ok(()),
        Plan::Copy => bail_invalid!("{op}: a fused reduction that reduces nothing is a copy"),
        Plan::Passes(p) => p,
    };
    let dst = ctx.bind(output)?;
    run_passes(
        ctx,
        rop,
        First::Prologue(prologue),
        dst,
        DType::F32,
        shape,
        mask,
        &passes,
    )
}

/// The WGSL of a prologue's variant of a reduce shader (`src`, every placeholder substituted):
/// the prologue's fields in `Params`, its bindings and functions instead of the input binding
/// `x` and of `is_nan`, and each load `x[i]` replaced by `ldx(i)` (`elem(i)`, or four
/// consecutive elements for a vec4 load).
fn with_prologue(src: &str, pro: &Prologue<'_>, vec4: bool) -> std::result::Result<String, String> {
    let internal = |what: &str| format!("reduce prologue: {what} not found");
    let end = "    chunk: u32,\n};";
    if !src.contains(end) {
        return Err(internal("the end of Params"));
    }
    let s = src.replacen(end, &format!("    chunk: u32,\n{}}};", pro.fields), 1);
    let decl = "@group(0) @binding(1) var<storage, read_write> x: ";
    let at = s.find(decl).ok_or_else(|| internal("the binding of x"))?;
    let eol = at
        + s[at..]
            .find('\n')
            .ok_or_else(|| internal("the binding's line"))?;
    let s = format!("{}{}", &s[..at], &s[eol + 1..]);
    let nan = "fn is_nan(v: f32) -> bool {\n    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;\n}\n";
    if !s.contains(nan) {
        return Err(internal("is_nan"));
    }
    let ldx = if vec4 {
        "fn ldx(i: u32) -> vec4<f32> {\n    return elem4(4u * i);\n}\n"
    } else {
        "fn ldx(i: u32) -> f32 {\n    return elem(i);\n}\n"
    };
    let s = s.replacen(nan, &format!("{}\n{ldx}", (pro.wgsl)(vec4)), 1);
    // Loads: `x[` after a character that cannot end an identifier, up to the next `]`.
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    let mut loads = 0;
    while let Some(k) = rest.find("x[") {
        let boundary = rest[..k]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !boundary {
            out.push_str(&rest[..k + 2]);
            rest = &rest[k + 2..];
            continue;
        }
        let close = rest[k..]
            .find(']')
            .ok_or_else(|| internal("a load's end"))?
            + k;
        if rest[k + 2..close].contains('[') {
            return Err(internal("a plain load index"));
        }
        out.push_str(&rest[..k]);
        out.push_str("ldx(");
        out.push_str(&rest[k + 2..close]);
        out.push(')');
        rest = &rest[close + 1..];
        loads += 1;
    }
    out.push_str(rest);
    if loads == 0 {
        return Err(internal("a load of x"));
    }
    Ok(out)
}

/// Records the steps of a reduction of `shape` over `mask` (its `passes`) from `first` to
/// `output`: the first step loads from `first`, later steps from temporaries.
#[allow(clippy::too_many_arguments)]
fn run_passes(
    ctx: &KernelContext,
    rop: ReduceOp,
    first: First<'_>,
    output: crate::exec::BufferRange,
    dtype: DType,
    shape: &[usize],
    mask: &[bool],
    passes: &[Pass],
) -> Result<()> {
    let op = rop.name();
    let count: usize = shape
        .iter()
        .zip(mask)
        .filter(|&(_, &m)| m)
        .map(|(&d, _)| d)
        .product();
    let scalar_src = || {
        crate::kernels::membound_shader(
            REDUCE_WGSL
                .replace("ELEM", if dtype == DType::F32 { "f32" } else { "i32" })
                .replace("COMBINE_BODY", rop.combine_body(dtype))
                .replace("FINALIZE_BODY", rop.finalize_body(dtype))
                .replace("CASCADE_FLAG", &rop.cascade(dtype).to_string()),
        )
    };
    // Looked up where a step needs it (the vector steps and the prologue's step do not).
    let pipeline = || {
        ctx.pipeline(
            PipelineKey::new("reduce", Some(dtype), rop.name().to_ascii_lowercase()),
            scalar_src,
        )
    };
    // vec4 loads need 16-byte aligned bindings (every binding starts at a multiple of the
    // offset alignment).
    let aligned = (ctx.limits().min_storage_buffer_offset_alignment as usize).is_multiple_of(16);
    let steps = steps(passes, aligned, rop.cascade(dtype));
    let mut src = match &first {
        First::Buffer(b) => Some(b.clone()),
        First::Prologue(_) => None,
    };
    for (k, st) in steps.iter().enumerate() {
        let last = k + 1 == steps.len();
        let outs = st.outer * st.split * st.inner;
        let dst = if last {
            output.clone()
        } else {
            ctx.temp((outs * dtype.size()) as u64)?
        };
        // In vec4 units along the loaded axis (see reduce_vec4.wgsl).
        let (r, inner, chunk, slots) = match st.vec4 {
            None => (st.r, st.inner, st.chunk, outs),
            Some(false) => (st.r / 4, 1, st.chunk / 4, outs),
            Some(true) => (st.r, st.inner / 4, st.chunk, outs / 4),
        };
        let (t, g) = layout(chunk, inner);
        let groups = slots.div_ceil(g as usize);
        let (gx, gy) = grid_2d(groups, || format!("{op}: {outs} outputs"))?;
        let mut p = vec![
            to_u32(op, slots)?,
            to_u32(op, r)?,
            to_u32(op, inner)?,
            g,
            t,
            (inner > 1) as u32,
            gx as u32,
            last as u32,
            to_u32(op, count)?,
            rop.identity_bits(dtype),
            to_u32(op, st.split)?,
            to_u32(op, chunk)?,
        ];
        let variant = match st.vec4 {
            None => rop.name().to_ascii_lowercase(),
            Some(col) => format!(
                "{}/vec4{}",
                rop.name().to_ascii_lowercase(),
                if col { "/col" } else { "/row" }
            ),
        };
        let binds = match (&src, &first) {
            (Some(s), _) => {
                let pipe = match st.vec4 {
                    None => pipeline()?,
                    Some(col) => ctx
                        .pipeline(PipelineKey::new("reduce", Some(dtype), variant), || {
                            crate::kernels::membound_shader(vec4_shader(rop, dtype, col))
                        })?,
                };
                ctx.dispatch(
                    &pipe,
                    &params(&p),
                    &[s.clone(), dst.clone()],
                    [gx as u32, gy as u32, 1],
                )?;
                src = Some(dst);
                continue;
            }
            (None, First::Prologue(pro)) => {
                p.extend_from_slice(&pro.words);
                let mut b = Vec::with_capacity(pro.inputs.len() + 1);
                b.push(pro.inputs[0].clone());
                b.push(dst.clone());
                b.extend(pro.inputs[1..].iter().cloned());
                b.extend(pro.outputs.iter().cloned());
                (pro, b)
            }
            (None, First::Buffer(_)) => unreachable!("a buffer source is set from the start"),
        };
        let (pro, b) = binds;
        let key = PipelineKey::new("reduce", Some(dtype), format!("{variant}/pro:{}", pro.key));
        let pipe = ctx.pipeline(key, || {
            let plain = match st.vec4 {
                None => REDUCE_WGSL
                    .replace("ELEM", "f32")
                    .replace("COMBINE_BODY", rop.combine_body(dtype))
                    .replace("FINALIZE_BODY", rop.finalize_body(dtype))
                    .replace("CASCADE_FLAG", &rop.cascade(dtype).to_string()),
                Some(col) => vec4_shader(rop, dtype, col),
            };
            let wgsl = with_prologue(&plain, pro, st.vec4.is_some())
                .expect("the reduce shaders hold what a prologue replaces");
            crate::kernels::membound_shader(wgsl)
        })?;
        ctx.dispatch(&pipe, &params(&p), &b, [gx as u32, gy as u32, 1])?;
        src = Some(dst);
    }
    Ok(())
}

/// `reduce_vec4.wgsl` for `rop` on `dtype` (f32 or i32), column mode or row mode.
fn vec4_shader(rop: ReduceOp, dtype: DType, col: bool) -> String {
    let elem = if dtype == DType::F32 { "f32" } else { "i32" };
    REDUCE_VEC4_WGSL
        .replace(
            "OUT_T",
            if col {
                if dtype == DType::F32 {
                    "vec4<f32>"
                } else {
                    "vec4<i32>"
                }
            } else {
                elem
            },
        )
        .replace(
            "STORE_BODY",
            if col { "y[out] = v;" } else { "y[out] = v.x;" },
        )
        .replace("ELEM", elem)
        .replace("COMBINE_BODY", rop.combine_body(dtype))
        .replace("FINALIZE_BODY", rop.finalize_body(dtype))
        .replace("COL_FLAG", &col.to_string())
}

/// One dispatch of `reduce.wgsl`: reduce the `r` axis of an (outer, r, inner) view in `split`
/// chunks of `chunk` rows, giving (outer, split, inner) results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Step {
    outer: usize,
    r: usize,
    inner: usize,
    split: usize,
    chunk: usize,
    /// `reduce_vec4.wgsl` in column mode (Some(true)) or row mode (Some(false)), else
    /// `reduce.wgsl`.
    vec4: Option<bool>,
}

/// A row-mode pass (inner == 1) with fewer outputs than this and at least `SPLIT_MIN_R` rows
/// is split in chunks.
const SPLIT_MAX_OUTPUTS: usize = 512;
const SPLIT_MIN_R: usize = 16384;
/// Rows per chunk of a split row-mode pass (at least), and the most chunks of any pass.
const SPLIT_CHUNK: usize = 4096;
const SPLIT_MAX: usize = 1024;
/// Most chunks of a vec4 column pass: enough that no invocation folds more than
/// `VEC4_MAX_PER_LANE` rows of a long column reduction (a batch-norm statistic over
/// N x H x W = 802,816 rows of 64 channels needs 3,136 chunks); the partials (chunks x
/// columns) are a small fraction of the input.
const COL4_SPLIT_MAX: usize = 65536;
/// Column mode: at most this many neighbouring columns per workgroup (32 columns: a warp's
/// loads of one row are one 128-byte line), and a pass is split along its rows until it has
/// about `TARGET_GROUPS` workgroups (enough to fill a large GPU: 132 SMs x 8), as long as
/// every invocation keeps at least `MIN_PER_THREAD` rows of its chunk.
const COL_G: usize = 32;
const TARGET_GROUPS: usize = 1024;
const MIN_PER_THREAD: usize = 16;
/// Most vec4 one invocation of `reduce_vec4.wgsl` folds sequentially per lane in a float
/// Sum/Mean/Prod (the rounding error of the sequential part: at most 16 additions).
const VEC4_MAX_PER_LANE: usize = 16;

/// (t, g) of a dispatch reducing chunks of `chunk` rows: t invocations per output, g outputs
/// per workgroup (t * g == WG). Row mode (inner == 1): t from the row length, so one group
/// reads a row with neighbouring invocations on neighbouring elements. Column mode: up to
/// `COL_G` neighbouring columns per workgroup first (coalesced), then t along the rows; a
/// workgroup with one column and 256 invocations on 256 different rows reads 4 bytes of every
/// 32-byte sector it touches (8x the traffic: a first-axis reduction ran at a fraction of the
/// copy bandwidth so).
fn layout(chunk: usize, inner: usize) -> (u32, u32) {
    let t = if inner > 1 {
        let g = inner.next_power_of_two().min(COL_G) as u32;
        threads_per_output(chunk).min(WG / g)
    } else {
        threads_per_output(chunk)
    };
    (t, WG / t)
}

/// The dispatches of a plan's passes: a long reduction with few outputs becomes two
/// dispatches (chunks, then the chunks' results), so that it fills the GPU.
///
/// With `aligned` (16-byte aligned bindings), a pass whose layout allows it loads vec4
/// (`reduce_vec4.wgsl`): a column pass with inner % 4 == 0 (split so that an invocation folds
/// at most `VEC4_MAX_PER_LANE` rows of its chunk and the pass has about `TARGET_GROUPS`
/// workgroups), a row pass with r % 4 == 0 (chunks rounded to multiples of 4). With
/// `cascade` (float Sum/Mean/Prod), a step whose invocations would fold more than
/// `VEC4_MAX_PER_LANE` vec4 sequentially stays on `reduce.wgsl` and its pairwise cascade.
fn steps(passes: &[Pass], aligned: bool, cascade: bool) -> Vec<Step> {
    let mut out = vec![];
    for p in passes {
        push_steps(&mut out, p, aligned, cascade);
    }
    out
}

/// The steps of one pass: unsplit, or its chunks and then the chunks' partials, which are
/// split again while one step over them would fold more than `VEC4_MAX_PER_LANE` rows per
/// invocation (a single step over 1,024 partials of 64 columns runs two workgroups whose
/// invocations each fold 128 rows one after another: latency, not bandwidth).
fn push_steps(out: &mut Vec<Step>, p: &Pass, aligned: bool, cascade: bool) {
    let outs = p.outer * p.inner;
    let col4 = aligned && p.inner > 1 && p.inner.is_multiple_of(4);
    let row4 = aligned && p.inner == 1 && p.r > 0 && p.r.is_multiple_of(4);
    let split = if col4 {
        let (t, g) = layout(p.r, p.inner / 4);
        let t = t as usize;
        let groups = (outs / 4).div_ceil(g as usize).max(1);
        // At most VEC4_MAX_PER_LANE rows per invocation, and enough workgroups to fill
        // the GPU while every invocation keeps at least 4 rows.
        let fill = TARGET_GROUPS.div_ceil(groups).min(p.r / (t * 4)).max(1);
        p.r.div_ceil(t * VEC4_MAX_PER_LANE)
            .max(fill)
            .min(COL4_SPLIT_MAX)
    } else if p.inner > 1 {
        let (t, g) = layout(p.r, p.inner);
        let groups = outs.div_ceil(g as usize).max(1);
        let most = p.r / (t as usize * MIN_PER_THREAD);
        TARGET_GROUPS.div_ceil(groups).min(most).min(SPLIT_MAX)
    } else if outs < SPLIT_MAX_OUTPUTS && p.r >= SPLIT_MIN_R {
        p.r.div_ceil(SPLIT_CHUNK).min(SPLIT_MAX)
    } else {
        1
    };
    let mut chunk = p.r.div_ceil(split.max(1));
    if row4 {
        chunk = chunk.next_multiple_of(4);
    }
    // With the chunk rounded up, fewer chunks may cover the rows.
    let split = p.r.div_ceil(chunk.max(1)).max(1);
    let vec4 = |r: usize, chunk: usize| -> Option<bool> {
        let (col, loads, inner) = if col4 {
            (true, chunk, p.inner / 4)
        } else if row4 && r.is_multiple_of(4) && chunk.is_multiple_of(4) {
            (false, chunk / 4, 1)
        } else {
            return None;
        };
        let (t, _) = layout(loads, inner);
        (!cascade || loads.div_ceil(t as usize) <= VEC4_MAX_PER_LANE).then_some(col)
    };
    if split > 1 && split < p.r {
        out.push(Step {
            outer: p.outer,
            r: p.r,
            inner: p.inner,
            split,
            chunk,
            vec4: vec4(p.r, chunk),
        });
        let partials = Pass {
            outer: p.outer,
            r: split,
            inner: p.inner,
        };
        // Rows each invocation of one step over the partials would fold.
        let units = if p.inner > 1 && col4 {
            p.inner / 4
        } else {
            p.inner
        };
        let (t, _) = layout(split, units);
        if split.div_ceil(t as usize) > VEC4_MAX_PER_LANE {
            push_steps(out, &partials, aligned, cascade);
        } else {
            out.push(Step {
                outer: p.outer,
                r: split,
                inner: p.inner,
                split: 1,
                chunk: split,
                vec4: vec4(split, split),
            });
        }
    } else {
        out.push(Step {
            outer: p.outer,
            r: p.r,
            inner: p.inner,
            split: 1,
            chunk: p.r,
            vec4: vec4(p.r, p.r),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes(shape: &[usize], axes: &[i64]) -> Plan {
        plan(shape, &reduction_mask("Sum", shape, axes).unwrap())
    }

    #[test]
    fn plans() {
        let p = |outer, r, inner| Pass { outer, r, inner };
        assert_eq!(passes(&[4, 5], &[1]), Plan::Passes(vec![p(4, 5, 1)]));
        assert_eq!(passes(&[4, 5], &[0]), Plan::Passes(vec![p(1, 4, 5)]));
        assert_eq!(passes(&[2, 3, 4], &[1, 2]), Plan::Passes(vec![p(2, 12, 1)]));
        assert_eq!(
            passes(&[2, 1, 3, 4], &[0, -1]),
            Plan::Passes(vec![p(6, 4, 1), p(1, 2, 3)])
        );
        assert_eq!(
            passes(&[2, 3, 4, 5, 6], &[0, 2, 4]),
            Plan::Passes(vec![p(120, 6, 1), p(6, 4, 5), p(1, 2, 15)])
        );
        assert_eq!(passes(&[3, 1, 4], &[1]), Plan::Copy);
        assert_eq!(passes(&[3, 4], &[]), Plan::Copy);
        assert_eq!(passes(&[], &[]), Plan::Copy);
        assert_eq!(passes(&[0, 4], &[0]), Plan::Passes(vec![p(4, 0, 1)]));
        assert_eq!(passes(&[0, 4], &[1]), Plan::Nothing);
        assert_eq!(passes(&[3, 3], &[1, 1, -1]), Plan::Passes(vec![p(3, 3, 1)]));
    }

    #[test]
    fn masks_and_shapes() {
        assert!(reduction_mask("Sum", &[2, 3], &[2]).is_err());
        assert!(reduction_mask("Sum", &[2, 3], &[-3]).is_err());
        assert!(reduction_mask("Sum", &[], &[0]).is_err());
        let m = reduction_mask("Sum", &[2, 3, 4], &[-1, 0]).unwrap();
        assert_eq!(m, vec![true, false, true]);
        assert_eq!(output_shape(&[2, 3, 4], &m, false), vec![3]);
        assert_eq!(output_shape(&[2, 3, 4], &m, true), vec![1, 3, 1]);
    }

    #[test]
    fn long_reductions_split() {
        let p = Pass {
            outer: 1,
            r: (1 << 20) + 3,
            inner: 3,
        };
        // Column mode: 4 columns per workgroup, 64 invocations per column, 1024 chunks.
        assert_eq!(layout(p.r, 3), (64, 4));
        let st = steps(&[p], false, true);
        assert_eq!(st.len(), 2);
        assert_eq!((st[0].split, st[0].chunk), (1024, 1025));
        assert!(st[0].split * st[0].chunk >= p.r);
        assert!((st[0].split - 1) * st[0].chunk < p.r);
        assert_eq!((st[1].r, st[1].split, st[1].inner), (1024, 1, 3));
        // A long row: 257 chunks of 4081.
        let row = Pass {
            outer: 1,
            r: (1 << 20) + 3,
            inner: 1,
        };
        let st = steps(&[row], false, true);
        assert_eq!((st[0].split, st[0].chunk, st[1].r), (257, 4081, 257));
        // A first-axis reduction of [8192, 8192]: 32 columns per workgroup (8 invocations
        // each), 256 workgroups, split in 4 chunks of 2048 rows.
        let first = Pass {
            outer: 1,
            r: 8192,
            inner: 8192,
        };
        assert_eq!(layout(8192, 8192), (8, 32));
        let st = steps(&[first], false, true);
        assert_eq!((st[0].split, st[0].chunk, st[1].r), (4, 2048, 4));
        assert_eq!(layout(st[1].chunk, 8192), (1, 256));
        // Too short to split: every invocation would get fewer than 16 rows.
        let short_cols = Pass {
            outer: 1,
            r: 100,
            inner: 64,
        };
        assert_eq!(steps(&[short_cols], false, true).len(), 1);
        let short = Pass {
            outer: 600,
            r: 1 << 20,
            inner: 1,
        };
        assert_eq!(steps(&[short], false, true).len(), 1);
        // vec4 loads: the first-axis [8192, 8192] in 64 chunks of 128 rows (8 invocations of
        // 32 vec4 columns fold 16 rows each), then the 64 partials; the last axis unsplit,
        // 256 invocations per row folding 8 vec4 each.
        let st = steps(&[first], true, true);
        assert_eq!(
            (st[0].split, st[0].chunk, st[0].vec4),
            (64, 128, Some(true))
        );
        assert_eq!((st[1].r, st[1].vec4), (64, Some(true)));
        let last = Pass {
            outer: 8192,
            r: 8192,
            inner: 1,
        };
        let st = steps(&[last], true, true);
        assert_eq!((st.len(), st[0].vec4), (1, Some(false)));
        // A long row: 256 chunks of 4096, then the 256 partials, both with vec4 loads.
        let st = steps(
            &[Pass {
                outer: 1,
                r: 1 << 20,
                inner: 1,
            }],
            true,
            true,
        );
        assert_eq!(
            (st[0].split, st[0].chunk, st[0].vec4),
            (256, 4096, Some(false))
        );
        assert_eq!(st[1].vec4, Some(false));
        // Keras's batch statistics in ResNet-50 (NHWC, over N, H, W): long columns split
        // until every invocation folds at most 16 vec4, so they load vec4 (with 1,024
        // chunks at most they fell back to the scalar cascade, at a fifth of the bandwidth).
        for (r, inner, split) in [(802_816, 64, 3136), (200_704, 256, 1568), (3136, 2048, 64)] {
            let st = steps(&[Pass { outer: 1, r, inner }], true, true);
            assert_eq!(
                (st[0].split, st[0].vec4),
                (split, Some(true)),
                "{r} x {inner}"
            );
            assert!(
                st[0]
                    .chunk
                    .div_ceil(layout(st[0].chunk, inner / 4).0 as usize)
                    <= 16
            );
        }
        // Their partials (1,024 or more chunks x 64 columns) are split again instead of
        // folded 64-128 rows per invocation: three steps, every one on vec4 loads.
        for r in [200_704, 802_816] {
            let st = steps(
                &[Pass {
                    outer: 1,
                    r,
                    inner: 64,
                }],
                true,
                true,
            );
            assert_eq!(st.len(), 3, "{r}: {st:?}");
            assert_eq!(st[1].r, st[0].split);
            assert_eq!(st[2].r, st[1].split);
            assert!(st.iter().all(|s| s.vec4 == Some(true)), "{st:?}");
        }
        // Too long per invocation for a float sum without the cascade; fine for Max.
        let long = Pass {
            outer: 600,
            r: 1 << 20,
            inner: 1,
        };
        assert_eq!(steps(&[long], true, true)[0].vec4, None);
        assert_eq!(steps(&[long], true, false)[0].vec4, Some(false));
        // Odd sizes and empty reductions stay scalar.
        for (outer, r, inner) in [(3, 7, 1), (1, 8, 6), (4, 0, 1)] {
            let st = steps(&[Pass { outer, r, inner }], true, true);
            assert_eq!(st[0].vec4, None, "{outer} x {r} x {inner}");
        }
    }

    #[test]
    fn every_reduce_shader_takes_a_prologue() {
        let wgsl = |_: bool| {
            "fn is_nan(v: f32) -> bool { return v != v; }\nfn elem(e: u32) -> f32 { return f32(e); }\nfn elem4(e: u32) -> vec4<f32> { return vec4<f32>(elem(e)); }\n".to_string()
        };
        let pro = Prologue {
            key: "k".into(),
            wgsl: &wgsl,
            fields: "    zero: u32,\n",
            words: vec![0],
            inputs: vec![],
            outputs: vec![],
        };
        for rop in [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
        ] {
            let scalar = REDUCE_WGSL
                .replace("ELEM", "f32")
                .replace("COMBINE_BODY", rop.combine_body(DType::F32))
                .replace("FINALIZE_BODY", rop.finalize_body(DType::F32))
                .replace("CASCADE_FLAG", &rop.cascade(DType::F32).to_string());
            let variants = [
                (scalar, false),
                (vec4_shader(rop, DType::F32, true), true),
                (vec4_shader(rop, DType::F32, false), true),
            ];
            for (src, vec4) in variants {
                let s = with_prologue(&src, &pro, vec4).unwrap();
                // No load of x is left, its binding is gone, `is_nan` is the prologue's.
                assert!(
                    !s.contains(" x[") && !s.contains("(x[") && !s.contains(" x:"),
                    "{s}"
                );
                assert!(s.contains("ldx(") && s.contains("zero: u32,\n};"));
                assert_eq!(s.matches("fn is_nan").count(), 1);
                let loads = src.matches("x[").count();
                assert_eq!(
                    s.matches("ldx(").count(),
                    loads + 1,
                    "calls and the definition"
                );
            }
        }
    }

    #[test]
    fn threads() {
        assert_eq!(threads_per_output(0), 1);
        assert_eq!(threads_per_output(8), 1);
        assert_eq!(threads_per_output(9), 2);
        assert_eq!(threads_per_output(1 << 20), 256);
    }
}
