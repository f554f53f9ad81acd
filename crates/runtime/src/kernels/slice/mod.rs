//! Slice family: index-mapping ops. Slice, StridedSlice, StridedSliceGrad, Pad, PadV2,
//! MirrorPad (REFLECT, SYMMETRIC), MirrorPadGrad, GatherV2, OneHot, MatrixBandPart, ReverseSequence,
//! SpaceToBatchND, BatchToSpaceND, Range, UnsortedSegmentSum (float32), ScatterNd (float32, int32, int64),
//! and the unary Erf and
//! Erfc.
//!
//! Every data-movement kernel here computes one 32-bit output word per invocation: the word's
//! elements (four for bool/uint8, two for float16, one for 32-bit types; 64-bit elements are
//! written as a (low, high) pair) are produced by a per-kernel WGSL function
//! `fn value(e: u32) -> vec2<u32>` (an element's bits) and packed by a shared store routine, so
//! no byte is written by two invocations and no atomics are needed.
//!
//! Semantics (TensorFlow is the spec):
//! - StridedSlice/StridedSliceGrad compute the slice on the host as TensorFlow's
//!   `ValidateStridedSliceOp` does (`spec.rs`): sparse-to-dense expansion of the ellipsis,
//!   new_axis and shrink_axis masks, canonicalized begin/end with clamping, negative strides,
//!   and TensorFlow's error messages. StridedSliceGrad is a gather (each output element checks
//!   whether it lies on the slice's lattice), zero elsewhere.
//! - GatherV2 follows TensorFlow's **GPU** kernel for out-of-range indices: the output slice is
//!   zero (TensorFlow's CPU kernel reports an InvalidArgument error instead).
//! - OneHot: indices outside [0, depth) give off_value everywhere, as TensorFlow.
//! - UnsortedSegmentSum adds rows into their segments with atomic compare-and-swap loops (the
//!   one kernel here that does; the output is zeroed first): the order of the additions is the
//!   GPU's, as in TensorFlow's GPU kernel, and ids outside [0, num_segments) drop their rows
//!   (TensorFlow's GPU kernel; its CPU kernel reports ids >= num_segments as an error).
//! - Range computes `start + i * delta` (TensorFlow's GPU kernel); TensorFlow's CPU kernel
//!   accumulates `val += delta`, so float32 results can differ from CPU:0 in the last bits for
//!   long ranges. The size is TensorFlow's: `ceil(|(limit - start) / delta|)` in the type.
//! - MirrorPadGrad sums the reflected contributions in f32 (f16 inputs are rounded once at the
//!   end); TensorFlow adds them in T one reflected slab at a time, so the last bit can differ.
//! - Erf/Erfc are this family's own f32 approximations (`erf.wgsl`), a few ULP.

mod band;
mod erf;
pub(crate) mod gather;
mod map;
mod mirror_grad;
mod onehot;
mod range;
mod revseq;
mod segment;
mod space;
pub mod spec;

use crate::kernel::{KernelContext, OpDef, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG};
use crate::{DType, Error, Result};

/// Data-movement dtypes (int32 is left out where TensorFlow's GPU int32 kernel keeps every
/// argument in host memory: Slice, StridedSlice, StridedSliceGrad, Pad, PadV2).
const MOVE: &[DType] = &[DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool];
/// GatherV2 and OneHot: TensorFlow's GPU kernels take int32 data in device memory. (GatherV2 of
/// int32 runs on the host, `host_ops`, unless the plugin's graph pass labels a gather of
/// GPU-computed data.)
const MOVE_I32: &[DType] = &DType::ALL;
const FLOAT: &[DType] = &[DType::F32, DType::F16];
/// Range: int32 is TensorFlow's all-host-memory kernel.
const RANGE: &[DType] = &[DType::F32, DType::I64];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "Slice",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(1, "begin"), (2, "size")],
        factory: |_| Ok(Box::new(map::Slice)),
    },
    OpDef {
        op: "StridedSlice",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(1, "begin"), (2, "end"), (3, "strides")],
        factory: |a| map::StridedSlice::build(a, false),
    },
    OpDef {
        op: "StridedSliceGrad",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(0, "shape"), (1, "begin"), (2, "end"), (3, "strides")],
        factory: |a| map::StridedSlice::build(a, true),
    },
    OpDef {
        op: "Pad",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(1, "paddings")],
        factory: |_| Ok(Box::new(map::Pad { v2: false })),
    },
    OpDef {
        op: "PadV2",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(1, "paddings"), (2, "constant_values")],
        factory: |_| Ok(Box::new(map::Pad { v2: true })),
    },
    OpDef {
        op: "MirrorPad",
        type_attr: "T",
        dtypes: MOVE,
        host_inputs: &[(1, "paddings")],
        factory: map::MirrorPad::build,
    },
    OpDef {
        op: "MirrorPadGrad",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[(1, "paddings")],
        factory: mirror_grad::MirrorPadGrad::build,
    },
    OpDef {
        op: "GatherV2",
        type_attr: "Tparams",
        dtypes: MOVE_I32,
        host_inputs: &[(2, "axis")],
        factory: gather::GatherV2::build,
    },
    OpDef {
        op: "ScatterNd",
        type_attr: "T",
        dtypes: &[DType::F32, DType::I32, DType::I64],
        host_inputs: &[(2, "shape")],
        factory: |_| Ok(Box::new(segment::ScatterNd)),
    },
    OpDef {
        op: "UnsortedSegmentSum",
        type_attr: "T",
        dtypes: &[DType::F32],
        host_inputs: &[(2, "num_segments")],
        factory: |_| Ok(Box::new(segment::UnsortedSegmentSum)),
    },
    OpDef {
        op: "MatrixBandPart",
        type_attr: "T",
        dtypes: MOVE_I32,
        host_inputs: &[(1, "num_lower"), (2, "num_upper")],
        factory: |_| Ok(Box::new(band::MatrixBandPart)),
    },
    OpDef {
        op: "ReverseSequence",
        type_attr: "T",
        dtypes: MOVE_I32,
        host_inputs: &[],
        factory: revseq::ReverseSequence::build,
    },
    OpDef {
        op: "SpaceToBatchND",
        type_attr: "T",
        dtypes: MOVE_I32,
        host_inputs: &[(1, "block_shape"), (2, "paddings")],
        factory: |_| Ok(Box::new(space::SpaceBatch { to_batch: true })),
    },
    OpDef {
        op: "BatchToSpaceND",
        type_attr: "T",
        dtypes: MOVE_I32,
        host_inputs: &[(1, "block_shape"), (2, "crops")],
        factory: |_| Ok(Box::new(space::SpaceBatch { to_batch: false })),
    },
    OpDef {
        op: "OneHot",
        type_attr: "T",
        dtypes: MOVE_I32,
        host_inputs: &[(1, "depth")],
        factory: onehot::OneHot::build,
    },
    OpDef {
        op: "Range",
        type_attr: "Tidx",
        dtypes: RANGE,
        host_inputs: &[(0, "start"), (1, "limit"), (2, "delta")],
        factory: |_| Ok(Box::new(range::Range)),
    },
    OpDef {
        op: "Erf",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |_| Ok(Box::new(erf::ErfOp { complement: false })),
    },
    OpDef {
        op: "Erfc",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |_| Ok(Box::new(erf::ErfOp { complement: true })),
    },
];

/// The largest rank the index-mapping kernels take (TensorFlow's GPU kernels stop at 8 too).
pub(crate) const MAX_RANK: usize = 8;

/// (before, after) paddings per dimension.
pub(crate) type Pads = Vec<(i64, i64)>;

/// `[1, 2, 3]` for error messages.
pub(crate) fn fmt_shape(shape: &[usize]) -> String {
    format!("{shape:?}")
}

/// Row-major element strides of a shape.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Eight u32 slots (unused ones zero) for an `array<vec4<u32>, 2>` uniform field.
pub(crate) fn pack8(v: impl IntoIterator<Item = u32>) -> [u32; 8] {
    let mut out = [0u32; 8];
    for (o, x) in out.iter_mut().zip(v) {
        *o = x;
    }
    out
}

/// A u32 that a shader index can hold, or an error naming the op.
pub(crate) fn u32_of(op: &str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Unimplemented(format!("{op}: {what} ({v}) exceeds 2^32")))
}

/// Invocations (output words) for `n` elements of `dtype`: four bool/uint8 or two float16
/// elements per word, one 32- or 64-bit element per invocation.
pub(crate) fn words(dtype: DType, n: usize) -> usize {
    match dtype.size() {
        1 => n.div_ceil(4),
        2 => n.div_ceil(2),
        _ => n,
    }
}

/// `fn load_NAME(i: u32) -> vec2<u32>`: element `i` of storage array `name` (bits; the high
/// word only for 8-byte elements).
pub(crate) fn load_fn(name: &str, elem_size: usize) -> String {
    let body = match elem_size {
        1 => format!("vec2<u32>(({name}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu, 0u)"),
        2 => format!("vec2<u32>(({name}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu, 0u)"),
        4 => format!("vec2<u32>({name}[i], 0u)"),
        _ => format!("vec2<u32>({name}[2u * i], {name}[2u * i + 1u])"),
    };
    format!("fn load_{name}(i: u32) -> vec2<u32> {{\n    return {body};\n}}\n")
}

/// `fn index_NAME(i: u32) -> vec2<u32>`: integer element `i` of `name` (uint8, int32 or
/// int64) as a sign-extended (low, high) pair.
pub(crate) fn index_fn(name: &str, dtype: DType) -> Result<String> {
    let body = match dtype {
        DType::U8 => format!("vec2<u32>(({name}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu, 0u)"),
        DType::I32 => {
            format!("vec2<u32>({name}[i], select(0u, 0xffffffffu, {name}[i] >= 0x80000000u))")
        }
        DType::I64 => format!("vec2<u32>({name}[2u * i], {name}[2u * i + 1u])"),
        other => {
            return Err(Error::Unimplemented(format!(
                "indices of type {other} are not supported (uint8, int32, int64)"
            )));
        }
    };
    Ok(format!(
        "fn index_{name}(i: u32) -> vec2<u32> {{\n    return {body};\n}}\n"
    ))
}

/// The shared tail of every word-per-invocation shader: `store_word` packs `value(e)` of the
/// word's elements into `out`, and `main` runs it for words below `p.words`. The kernel's
/// source must declare `p` (with `row`, `n`, `words` fields), `out`, and `fn value`.
fn store_tail(elem_size: usize) -> String {
    let store = match elem_size {
        1 | 2 => {
            let (per, bits, mask) = if elem_size == 1 {
                (4, 8, "0xffu")
            } else {
                (2, 16, "0xffffu")
            };
            format!(
                "    let e0 = w * {per}u;
    var word = 0u;
    for (var k = 0u; k < {per}u; k = k + 1u) {{
        if e0 + k < p.n {{
            word = word | ((value(e0 + k).x & {mask}) << ({bits}u * k));
        }}
    }}
    out[w] = word;"
            )
        }
        4 => "    out[w] = value(w).x;".to_string(),
        _ => "    let v = value(w);
    out[2u * w] = v.x;
    out[2u * w + 1u] = v.y;"
            .to_string(),
    };
    format!(
        "{LINEAR_INDEX}
fn store_word(w: u32) {{
{store}
}}

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let w = linear_index(gid);
    if w >= p.words {{
        return;
    }}
    store_word(w);
}}
"
    )
}

/// Builds (once) and records a word-per-invocation shader: `body` plus the shared store tail.
/// `params` must start with (row, n, words), filled in here; the element size is the output's.
pub(crate) fn dispatch_words(
    ctx: &KernelContext,
    key: &str,
    body: impl FnOnce() -> String,
    params: &mut [u32],
    bindings: &[crate::exec::BufferRange],
    n: usize,
    out_dtype: DType,
) -> Result<()> {
    let elem_size = out_dtype.size();
    let w = words(out_dtype, n);
    if w == 0 {
        return Ok(());
    }
    let w32 = u32_of(key, "output size", w)?;
    let spec = format!("{key}_e{elem_size}");
    let pipeline = ctx.pipeline(PipelineKey::new("slice", None, &spec), || {
        ShaderSource::new(format!("{}\n{}", body(), store_tail(elem_size)))
    })?;
    let (groups, row) = grid_1d(w as u64, WG);
    params[0] = row;
    params[1] = u32_of(key, "output size", n)?;
    params[2] = w32;
    ctx.dispatch(
        &pipeline,
        &crate::kernels::wgsl::params(params),
        bindings,
        groups,
    )
}

/// The binding of an output tensor. The shaders write whole 32-bit words (the allocation is
/// padded), so the output must start on a storage-aligned address; a copy to a temporary (what
/// `ctx.bind` does for unaligned inputs) would lose the results.
pub(crate) fn bind_out(
    ctx: &KernelContext,
    op: &str,
    t: &crate::kernel::DeviceRef,
) -> Result<crate::exec::BufferRange> {
    let size = t.desc.byte_size().next_multiple_of(4);
    crate::kernels::elementwise::bind_out_bytes(ctx, op, t, size)
}
