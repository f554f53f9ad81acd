//! Elementwise family: binary ops with NumPy/TensorFlow broadcasting (AddV2, Sub, Mul,
//! RealDiv, Div, Maximum, Minimum), unary ops (Neg, Abs, Exp, Log, Sqrt, Relu, Tanh,
//! Sigmoid), and the Identity/Snapshot device copy.
//!
//! Numerics (TensorFlow CPU is the spec):
//! - f16 is computed in f32 and rounded to nearest even, as Eigen's `half` does; the f16<->f32
//!   conversions are done on bits in the shader (`common.wgsl`), so they are exact and do not
//!   depend on the driver.
//! - Add, Sub, Mul, Maximum, Minimum are exact. Float division is WGSL's `/` (Vulkan allows
//!   2.5 ULP; IEEE hardware gives a correctly rounded quotient).
//! - int32 Add/Sub/Mul/Neg/Abs wrap (two's complement); `Abs(INT_MIN) = INT_MIN`.
//! - int32 Div truncates toward zero and `INT_MIN / -1 = INT_MIN`, as TensorFlow's CPU kernel.
//!   TensorFlow reports integer division by zero as an InvalidArgument error; a GPU kernel
//!   cannot raise one, so here **`x / 0 = 0` for int32** (the value TensorFlow's functor
//!   computes before it reports the error).
//! - Maximum/Minimum return NaN when either input is NaN (TensorFlow 2.x CPU); otherwise they
//!   are `std::max`/`std::min` (`a < b ? b : a`, `b < a ? b : a`).
//! - Exp, Log, Tanh, Sigmoid are computed by this family's own f32 code (`math.wgsl`):
//!   argument reduction and short series, a few ULP, with TensorFlow's special values
//!   (Log(0) = -inf, Log(x<0) = NaN, Exp(-inf) = 0, Tanh(+-inf) = +-1, Sigmoid saturating to
//!   0 and 1). Sqrt uses WGSL's `sqrt` (Vulkan allows a few ULP) with Sqrt(x<0) = NaN,
//!   Sqrt(-0) = -0. Relu(NaN) = NaN.
//! - Subnormal f32: Log and Sqrt read subnormal inputs exactly (on the bits) on every driver.
//!   Elsewhere subnormal inputs and results follow the driver (NVIDIA's Vulkan driver flushes
//!   them to zero, lavapipe keeps them); TensorFlow's CPU executor also runs kernels with
//!   denormals flushed (`port::ScopedFlushDenormal`).
//! - Maximum/Minimum decide on integer keys, so the sign of a zero result is std::max's on
//!   every driver (Maximum(-0, +0) = -0, Maximum(+0, -0) = +0).

mod binary;
mod unary;

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc};
use crate::{DType, Error, Result, bail_invalid};

pub(crate) use binary::BinaryOp;
pub(crate) use unary::UnaryOp;

/// WGSL helpers shared with the cast family: `is_nan`, exact `f16_to_f32` / `f32_to_f16`.
pub(crate) const COMMON_WGSL: &str = include_str!("common.wgsl");

const ALL: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];
const NUMERIC: &[DType] = &[DType::F32, DType::F16, DType::I32];
const FLOAT: &[DType] = &[DType::F32, DType::F16];

macro_rules! binary_row {
    ($name:literal, $op:expr, $dtypes:expr) => {
        OpDef {
            op: $name,
            type_attr: "T",
            dtypes: $dtypes,
            host_inputs: &[],
            factory: |_| Ok(Box::new(binary::Binary::new($name, $op))),
        }
    };
}

macro_rules! unary_row {
    ($name:literal, $op:expr, $dtypes:expr) => {
        OpDef {
            op: $name,
            type_attr: "T",
            dtypes: $dtypes,
            host_inputs: &[],
            factory: |_| Ok(Box::new(unary::Unary::new($name, $op))),
        }
    };
}

/// Registration table.
pub const OPS: &[OpDef] = &[
    binary_row!("AddV2", BinaryOp::Add, NUMERIC),
    binary_row!("Add", BinaryOp::Add, NUMERIC),
    binary_row!("Sub", BinaryOp::Sub, NUMERIC),
    binary_row!("Mul", BinaryOp::Mul, NUMERIC),
    binary_row!("RealDiv", BinaryOp::RealDiv, FLOAT),
    binary_row!("Div", BinaryOp::Div, NUMERIC),
    binary_row!("Maximum", BinaryOp::Maximum, NUMERIC),
    binary_row!("Minimum", BinaryOp::Minimum, NUMERIC),
    unary_row!("Neg", UnaryOp::Neg, NUMERIC),
    unary_row!("Abs", UnaryOp::Abs, NUMERIC),
    unary_row!("Relu", UnaryOp::Relu, NUMERIC),
    unary_row!("Exp", UnaryOp::Exp, FLOAT),
    unary_row!("Log", UnaryOp::Log, FLOAT),
    unary_row!("Sqrt", UnaryOp::Sqrt, FLOAT),
    unary_row!("Tanh", UnaryOp::Tanh, FLOAT),
    unary_row!("Sigmoid", UnaryOp::Sigmoid, FLOAT),
    OpDef {
        op: "Identity",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(DeviceCopy { name: "Identity" })),
    },
    OpDef {
        op: "Snapshot",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(DeviceCopy { name: "Snapshot" })),
    },
];

/// A shape as TensorFlow prints it: `[2,3]`.
pub(crate) fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// A storage binding for an output tensor. Outputs are written in place, so unlike
/// `KernelContext::bind` (which copies a misaligned input to a temporary) a misaligned output
/// is an error.
pub(crate) fn bind_out(ctx: &KernelContext, op: &str, t: &DeviceRef) -> Result<BufferRange> {
    let r = ctx.dev.alloc.resolve(t.addr)?;
    let size = t.desc.byte_size();
    if size > r.remaining {
        bail_invalid!(
            "{op}: output of {size} bytes at {:#x} runs past its allocation",
            t.addr
        );
    }
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    if !r.offset.is_multiple_of(align) {
        return Err(Error::Unimplemented(format!(
            "{op}: output address {:#x} is not {align}-byte aligned",
            t.addr
        )));
    }
    Ok(r.range(size))
}

/// Elements per 32-bit word of a packed dtype's storage, and the number of words that hold
/// `n` elements; fails for tensors beyond 32-bit indexing.
pub(crate) fn words_for(op: &str, dtype: DType, n: usize) -> Result<u32> {
    let per_word = match dtype {
        DType::F16 => 2,
        DType::U8 | DType::Bool => 4,
        _ => 1,
    };
    if n > u32::MAX as usize {
        return Err(Error::Unimplemented(format!(
            "{op}: tensors of more than 2^32-1 elements are not supported (got {n})"
        )));
    }
    Ok(n.div_ceil(per_word) as u32)
}

/// WGSL expression loading element `i` of the storage array `arr` as the compute type
/// (f32 for f32 and f16, i32 for i32).
pub(crate) fn load_expr(dtype: DType, arr: &str) -> String {
    match dtype {
        DType::F32 => format!("bitcast<f32>({arr}[i])"),
        DType::F16 => format!("f16_to_f32(({arr}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu)"),
        _ => format!("bitcast<i32>({arr}[i])"),
    }
}

/// WGSL statements writing output word `w` from `elem(e)` (with `p.n` elements in all).
pub(crate) fn store_stmt(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => {
            "    let e0 = w * 2u;
    let lo = f32_to_f16(elem(e0));
    var hi = 0u;
    if e0 + 1u < p.n {
        hi = f32_to_f16(elem(e0 + 1u));
    }
    out[w] = lo | (hi << 16u);"
        }
        _ => "    out[w] = bitcast<u32>(elem(w));",
    }
}

/// The WGSL compute type of a dtype handled by the arithmetic kernels.
pub(crate) fn compute_type(dtype: DType) -> &'static str {
    if dtype.is_float() { "f32" } else { "i32" }
}

/// Identity / Snapshot: a device copy of the input.
struct DeviceCopy {
    name: &'static str,
}

impl Kernel for DeviceCopy {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        if inputs.len() != 1 {
            bail_invalid!("{} takes 1 input, got {}", self.name, inputs.len());
        }
        inputs[0].device(self.name, 0)?;
        Ok(vec![inputs[0].desc()])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let src = inputs[0].device(self.name, 0)?;
        let out = &outputs[0];
        let size = out.desc.byte_size();
        if size == 0 {
            return Ok(());
        }
        if src.desc.byte_size() != size {
            bail_invalid!(
                "{}: output of {size} bytes for an input of {} bytes",
                self.name,
                src.desc.byte_size()
            );
        }
        let s = ctx.bind(src)?;
        let d = bind_out(ctx, self.name, out)?;
        // Allocations are padded, so the copy may round up to whole words.
        ctx.copy(&s, &d, size.next_multiple_of(4))
    }
}
