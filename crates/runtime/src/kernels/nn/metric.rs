//! Ops behind Keras's metrics: Cumsum (float32; AUC sums its confusion counts over the
//! thresholds) and InTopKV2 (top-k accuracy), with TensorFlow's semantics and messages.
//!
//! Cumsum adds along the axis in order (from the end with `reverse`; `exclusive` leaves each
//! element out of its own sum), as TensorFlow's CPU kernel does, so the float32 sums round
//! alike. InTopKV2 is true where fewer than k predictions exceed the target's; false for a
//! target out of range or whose prediction is not finite (TensorFlow's rule). Long axes run as
//! several dispatches of at most [`CHUNK`] elements each (CPU adapters stop a shader's loops
//! after 65,535 iterations in all).

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{bind_out, fmt_shape};
use crate::kernels::slice::{dispatch_words, index_fn, u32_of};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Result, bail_invalid};

const CUMSUM_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    len: u32,
    inner: u32,
    exclusive: u32,
    reverse: u32,
    start: u32,
    count: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

LINEAR_INDEX

// Element k (in scan order) of row (base): from the end with `reverse`.
fn at(base: u32, k: u32) -> u32 {
    var i = k;
    if p.reverse != 0u {
        i = p.len - 1u - k;
    }
    return base + i * p.inner;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    // Row e of the [outer, inner] rows: elements base + i * inner, i < len. This dispatch
    // scans elements [start, start + count) of it, from the sum the previous one left.
    let base = (e / p.inner) * p.len * p.inner + e % p.inner;
    var acc = 0.0;
    if p.start > 0u {
        let prev = at(base, p.start - 1u);
        acc = out[prev];
        if p.exclusive != 0u {
            acc += x[prev];
        }
    }
    for (var k = 0u; k < p.count; k++) {
        let i = at(base, p.start + k);
        let v = x[i];
        if p.exclusive != 0u {
            out[i] = acc;
            acc += v;
        } else {
            acc += v;
            out[i] = acc;
        }
    }
}
";

/// The elements one dispatch takes along a loop (CPU adapters stop a shader's loops after
/// 65,535 iterations in all, nested or not: longer axes run as several dispatches).
const CHUNK: usize = crate::kernels::wgsl::LOOP_BUDGET;

/// Per row: the predictions of classes [start, start + count) above the target's, added to
/// the count of the previous chunks.
const COUNT_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    classes: u32,
    start: u32,
    count: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> pred: array<u32>;
@group(0) @binding(2) var<storage, read_write> tg: array<u32>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;

LINEAR_INDEX
INDEX_TG

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = linear_index(gid);
    if e >= p.n {
        return;
    }
    var more = 0u;
    if p.start > 0u {
        more = counts[e];
    }
    let t = index_tg(e);
    if t.y == 0u && t.x < p.classes {
        let row = e * p.classes;
        let tv = bitcast<f32>(pred[row + t.x]);
        for (var k = 0u; k < p.count; k++) {
            if bitcast<f32>(pred[row + p.start + k]) > tv {
                more += 1u;
            }
        }
    }
    counts[e] = more;
}
";

/// InTopKV2's bool per row from the counts: false for a target out of range or whose
/// prediction is not finite.
const IN_TOP_K_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    words: u32,
    classes: u32,
    k: i32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> pred: array<u32>;
@group(0) @binding(3) var<storage, read_write> tg: array<u32>;
@group(0) @binding(4) var<storage, read_write> counts: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let t = index_tg(e);
    if t.y != 0u || t.x >= p.classes {
        return vec2<u32>(0u, 0u);
    }
    if (pred[e * p.classes + t.x] & 0x7f800000u) == 0x7f800000u {
        return vec2<u32>(0u, 0u);
    }
    return vec2<u32>(select(0u, 1u, below_k(counts[e], p.k)), 0u);
}

// count < k for a count up to 2^32 - 1 and any k.
fn below_k(count: u32, k: i32) -> bool {
    return k > 0 && count < u32(k);
}
";

/// Cumsum(x, axis) of float32.
pub(super) struct Cumsum {
    exclusive: bool,
    reverse: bool,
}

impl Cumsum {
    pub(super) fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(Cumsum {
            exclusive: attrs.bool_or("exclusive", false)?,
            reverse: attrs.bool_or("reverse", false)?,
        }))
    }

    /// (outer, len, inner) around the axis.
    fn split(inputs: &[Operand]) -> Result<(usize, usize, usize)> {
        if inputs.len() != 2 {
            bail_invalid!("Cumsum takes 2 inputs, got {}", inputs.len());
        }
        let shape = inputs[0].shape();
        let a = inputs[1].host("Cumsum", 1)?;
        if !a.shape.is_empty() {
            bail_invalid!("ScanOp: axis must be a scalar, not {}", fmt_shape(&a.shape));
        }
        let axis = a.to_i64_vec()?[0];
        let rank = shape.len() as i64;
        if axis < -rank || axis >= rank {
            bail_invalid!(
                "ScanOp: Expected scan axis in the range [{}, {rank}), but got {axis}",
                -rank
            );
        }
        let axis = axis.rem_euclid(rank.max(1)) as usize;
        Ok((
            shape[..axis].iter().product(),
            shape[axis],
            shape[axis + 1..].iter().product(),
        ))
    }
}

impl Kernel for Cumsum {
    fn op(&self) -> &'static str {
        "Cumsum"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Self::split(inputs)?;
        Ok(vec![inputs[0].desc()])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (outer, len, inner) = Self::split(inputs)?;
        let out = &outputs[0];
        let rows = outer * inner;
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let x = inputs[0].device("Cumsum", 0)?;
        let pipeline = ctx.pipeline(PipelineKey::new("nn", Some(DType::F32), "cumsum"), || {
            ShaderSource::new(
                CUMSUM_WGSL
                    .replace("LINEAR_INDEX", LINEAR_INDEX)
                    .replace("WG", &WG.to_string()),
            )
        })?;
        let (groups, row) = grid_1d(rows as u64, WG);
        let (x, o) = (ctx.bind(x)?, bind_out(ctx, "Cumsum", out)?);
        u32_of("Cumsum", "size", out.desc.num_elements())?;
        for start in (0..len).step_by(CHUNK) {
            let p = [
                row,
                u32_of("Cumsum", "rows", rows)?,
                u32_of("Cumsum", "axis size", len)?,
                u32_of("Cumsum", "inner size", inner)?,
                self.exclusive as u32,
                self.reverse as u32,
                start as u32,
                CHUNK.min(len - start) as u32,
            ];
            ctx.dispatch(&pipeline, &params(&p), &[x.clone(), o.clone()], groups)?;
        }
        Ok(())
    }
}

/// InTopKV2(predictions, targets, k): bool per row.
pub(super) struct InTopK;

impl InTopK {
    /// (rows, classes, k).
    fn check(inputs: &[Operand]) -> Result<(usize, usize, i64)> {
        if inputs.len() != 3 {
            bail_invalid!("InTopKV2 takes 3 inputs, got {}", inputs.len());
        }
        let (p, t) = (inputs[0].shape(), inputs[1].shape());
        let k = inputs[2].host("InTopKV2", 2)?;
        if inputs[0].dtype() != DType::F32 {
            bail_invalid!(
                "InTopKV2: predictions must be float32, got {}",
                inputs[0].dtype()
            );
        }
        if p.len() != 2 {
            bail_invalid!("predictions must be 2-dimensional");
        }
        if t.len() != 1 {
            bail_invalid!("targets must be 1-dimensional");
        }
        if p[0] != t[0] {
            bail_invalid!(
                "First dimension of predictions {} must match length of targets {}",
                p[0],
                t[0]
            );
        }
        if !k.shape.is_empty() {
            bail_invalid!("k must be 0-D, got shape {}", fmt_shape(&k.shape));
        }
        Ok((p[0], p[1], k.to_i64_vec()?[0]))
    }
}

impl Kernel for InTopK {
    fn op(&self) -> &'static str {
        "InTopKV2"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (rows, _, _) = Self::check(inputs)?;
        Ok(vec![TensorDesc::new(DType::Bool, &[rows])])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (rows, classes, k) = Self::check(inputs)?;
        let out = &outputs[0];
        if rows == 0 {
            return Ok(());
        }
        let pred = inputs[0].device("InTopKV2", 0)?;
        let tg = inputs[1].device("InTopKV2", 1)?;
        u32_of("InTopKV2", "predictions", rows * classes)?;
        let mut p = vec![
            0,
            0,
            0,
            u32_of("InTopKV2", "classes", classes)?,
            k.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32,
            0,
            0,
            0,
        ];
        let idx = index_fn("tg", tg.desc.dtype)?;
        let counts = ctx.temp(rows as u64 * 4)?;
        let (pb, tb) = (ctx.bind(pred)?, ctx.bind(tg)?);
        let count = ctx.pipeline(
            PipelineKey::new(
                "nn",
                None,
                format!("in_top_k_count_{}", tg.desc.dtype.name()),
            ),
            || {
                ShaderSource::new(
                    COUNT_WGSL
                        .replace("LINEAR_INDEX", LINEAR_INDEX)
                        .replace("INDEX_TG", &idx)
                        .replace("WG", &WG.to_string()),
                )
            },
        )?;
        let (groups, row) = grid_1d(rows as u64, WG);
        for start in (0..classes.max(1)).step_by(CHUNK) {
            let c = [
                row,
                rows as u32,
                classes as u32,
                start as u32,
                CHUNK.min(classes - start.min(classes)) as u32,
                0,
                0,
                0,
            ];
            ctx.dispatch(
                &count,
                &params(&c),
                &[pb.clone(), tb.clone(), counts.clone()],
                groups,
            )?;
        }
        let bindings = [
            crate::kernels::slice::bind_out(ctx, "InTopKV2", out)?,
            pb,
            tb,
            counts,
        ];
        dispatch_words(
            ctx,
            &format!("in_top_k_{}", tg.desc.dtype.name()),
            || format!("{IN_TOP_K_WGSL}\n{idx}"),
            &mut p,
            &bindings,
            rows,
            DType::Bool,
        )
    }
}
