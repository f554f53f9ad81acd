//! Elementwise family: binary ops with NumPy/TensorFlow broadcasting (AddV2, Sub, Mul,
//! RealDiv, Div, Maximum, Minimum, SquaredDifference, Pow, DivNoNan, FloorDiv, FloorMod), the
//! comparisons (Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual: bool output),
//! LogicalAnd/Or/Not, the activation gradients (ReluGrad, SoftplusGrad, SigmoidGrad, TanhGrad,
//! SqrtGrad, RsqrtGrad, ReciprocalGrad), unary ops (Neg, Abs, Exp, Log, Sqrt, Relu, Tanh,
//! Sigmoid, Square, Rsqrt, Reciprocal, Sign, Floor, Ceil, Round, Log1p, Expm1, Softplus),
//! Select/SelectV2, AddN, and the Identity/Snapshot device copy; Sin, Cos, Tan, Relu6, Elu, Selu,
//! LeakyRelu, Softsign, IsNan, IsInf, IsFinite (bool output), their gradients (Relu6Grad, EluGrad,
//! SeluGrad, LeakyReluGrad, SoftsignGrad), and ClipByValue.
//!
//! Numerics (TensorFlow CPU is the spec):
//! - f16 is computed in f32 and rounded to nearest even, as Eigen's `half` does; the f16<->f32
//!   conversions are done on bits in the shader (`common.wgsl`), so they are exact and do not
//!   depend on the driver. Where TensorFlow's f16 kernel rounds an intermediate result to half
//!   (SquaredDifference, FloorDiv, the gradients, AddN), so does this one (`rt`); the unary
//!   functions (Log1p, Softplus...) round once, at the end.
//! - Add, Sub, Mul, Maximum, Minimum, SquaredDifference, Square are exact. Float division
//!   (RealDiv, Div, DivNoNan, Reciprocal, SqrtGrad) is WGSL's `/` (Vulkan allows 2.5 ULP; IEEE
//!   hardware gives a correctly rounded quotient).
//! - FloorDiv on floats is floor(x / y) with the quotient correctly rounded by long division
//!   on the mantissas (`div_rn_f32`), so quotients next to an integer floor as TensorFlow's
//!   do on every driver. FloorMod on floats is TensorFlow's fmod-then-adjust, with an exact
//!   fmod (`fmod_f32`): FloorMod(x, 0) = NaN, FloorMod(5, -inf) = -inf.
//! - int32 Add/Sub/Mul/Neg/Abs/Square/SquaredDifference/Pow wrap (two's complement);
//!   `Abs(INT_MIN) = INT_MIN`. int64 (Add, Sub, Mul, Div, Maximum, Minimum,
//!   SquaredDifference, FloorDiv, FloorMod, Neg, Abs, Sign, Square: what Keras's seed
//!   arithmetic and TensorFlow's int64 GPU kernels need) works on (low, high) word pairs
//!   (`int64.wgsl`) with the same wrapping and division rules as int32.
//! - int32 Div truncates toward zero and `INT_MIN / -1 = INT_MIN`, as TensorFlow's CPU kernel;
//!   FloorDiv/FloorMod round toward -inf. TensorFlow reports integer division by zero as an
//!   InvalidArgument error; a GPU kernel cannot raise one, so here **`x / 0 = 0` for int32
//!   Div, FloorDiv and FloorMod** (for Div, the value TensorFlow's functor computes before it
//!   reports the error). Likewise int32 Pow with a negative exponent (an error in TensorFlow)
//!   gives the truncated quotient 1 / x^-y: 1 for x = 1, +-1 for x = -1, 0 otherwise.
//! - Pow on floats has C's special values (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN,
//!   negative bases need integer exponents, signed zeros and infinities) and is computed as
//!   exp(y log|x|) with log|x| and the product carried in two floats (`pow.wgsl`): within
//!   2.5 ULP over the whole range.
//! - Maximum/Minimum return NaN when either input is NaN (TensorFlow 2.x CPU); otherwise they
//!   are `std::max`/`std::min` (`a < b ? b : a`, `b < a ? b : a`).
//! - Comparisons are decided on the bits (WGSL lets drivers assume no NaN): false when either
//!   side is NaN (NotEqual: true), -0 == +0. int64 compares (low, high) word pairs. Equal and
//!   NotEqual take `incompatible_shape_error`: when false and the shapes do not broadcast, the
//!   result is the scalar false (Equal) or true (NotEqual), as TensorFlow.
//! - Exp, Log, Tanh, Sigmoid, Log1p, Expm1, Softplus are computed by this family's own f32
//!   code (`math.wgsl`): argument reduction and short series, a few ULP, with TensorFlow's
//!   special values (Log(0) = -inf, Log(x<0) = NaN, Exp(-inf) = 0, Tanh(+-inf) = +-1, Sigmoid
//!   saturating to 0 and 1, Log1p(-1) = -inf, Expm1(-inf) = -1). Softplus follows
//!   TensorFlow's thresholds (x above 13.942385, exp(x) below -13.942385, log1p(exp(x))
//!   between; f16 is computed in f32 with the same thresholds, which gives TensorFlow 2.21's
//!   values). Sqrt uses WGSL's `sqrt` and Rsqrt WGSL's `inverseSqrt` (Vulkan allows a few ULP)
//!   with Sqrt(x<0) = NaN, Sqrt(-0) = -0, Rsqrt(+-0) = +-inf. Relu(NaN) = NaN.
//! - Sign(+-0) = +0, Sign(NaN) = NaN. Floor, Ceil and Round (half to even) keep the sign of a
//!   zero result (Ceil(-0.5) = -0, Round(-0.2) = -0); int32 Round is the identity.
//! - The gradients use TensorFlow's formulas in the association of its vectorized CPU kernels:
//!   ReluGrad = gradients * (features > 0) (so a NaN or infinite gradient gives NaN where
//!   features <= 0), SigmoidGrad = dy * (y * (1 - y)), TanhGrad = dy * (1 - y * y), SqrtGrad =
//!   (0.5 / y) * dy, RsqrtGrad = (-0.5 * (dy * y)) * (y * y), ReciprocalGrad = (-y * y) * dy,
//!   the last three 0 where dy = 0; SoftplusGrad = gradients / (exp(-features) + 1).
//!   ReluGrad and SoftplusGrad need equal shapes, the y/dy gradients equal element counts
//!   (output shaped like y); none broadcasts, as in TensorFlow. (A driver may contract a
//!   product and a sum into an FMA, which changes the last bit of SigmoidGrad and TanhGrad.)
//! - Subnormal f32: Log, Sqrt, Rsqrt, Sign, FloorMod, FloorDiv and the comparisons read
//!   subnormal inputs exactly (on the bits) on every driver. Elsewhere subnormal inputs and
//!   results follow the driver (NVIDIA's Vulkan driver flushes them to zero, lavapipe keeps
//!   them). TensorFlow's CPU executor runs kernels with denormals flushed
//!   (`port::ScopedFlushDenormal`), so there Rsqrt(1e-40) = inf and Sign(1e-40) = 0 where
//!   this family gives 1e20 and 1.
//! - Sin, Cos and Tan reduce the argument exactly for every finite f32 (Payne-Hanek with the bits
//!   of 2/pi, `trig.wgsl`), then use Taylor series on [-pi/4, pi/4]: within 3 ULP over the
//!   whole range (Sin(1e30), Cos(f32::MAX) included); Sin(-0) = -0, Sin/Cos(inf) = NaN. Tan is
//!   the quotient of the two series (or -cos / sin in odd quadrants): within 7 ULP.
//! - The activations follow TensorFlow's functors: Relu6 = min(max(x, 0), 6) propagating NaN;
//!   Elu = x < 0 ? exp(x) - 1 : x (exp(x) - 1, as TensorFlow, not expm1); Selu with
//!   TensorFlow's constants rounded to the dtype; LeakyRelu = x > 0 ? x : x * alpha (alpha
//!   rounded to the dtype); Softsign = x / (|x| + 1). The gradients: Relu6Grad = g * (0 < f <
//!   6), EluGrad = a < 0 ? (a + 1) * g : g, SeluGrad = a < 0 ? g * (a + scale * alpha) : g *
//!   scale, LeakyReluGrad = f > 0 ? g : g * alpha, SoftsignGrad = g / (|f| + 1)^2; equal
//!   shapes, no broadcasting. f16 rounds where Eigen's `half` does.
//! - ClipByValue is std::max(std::min(t, max), min) (a NaN in t stays, a NaN bound leaves t);
//!   each bound is a scalar or has t's shape (TensorFlow does not broadcast it). f32, f16,
//!   int64; int32 stays on the host (TensorFlow's GPU int32 kernel is all host memory).
//! - Maximum/Minimum decide on integer keys, so the sign of a zero result is std::max's on
//!   every driver (Maximum(-0, +0) = -0, Maximum(+0, -0) = +0).

mod addn;
mod binary;
mod clip;
mod select;
mod unary;

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc};
use crate::{DType, Error, Result, bail_invalid};

pub(crate) use binary::{BinaryOp, Broadcast, merge_dims};
pub(crate) use unary::UnaryOp;

/// WGSL helpers shared with the cast family: `is_nan`, exact `f16_to_f32` / `f32_to_f16`.
pub(crate) const COMMON_WGSL: &str = include_str!("common.wgsl");
/// The f32 math functions (needs `COMMON_WGSL`): exp, log, log1p, expm1, tanh, sigmoid,
/// sqrt, rsqrt, softplus, exact fmod and correctly rounded division.
pub(crate) const MATH_WGSL: &str = include_str!("math.wgsl");
/// Signed 64-bit arithmetic on (low, high) word pairs.
pub(crate) const INT64_WGSL: &str = include_str!("int64.wgsl");

const ALL: &[DType] = &DType::ALL;
const NUMERIC: &[DType] = &[DType::F32, DType::F16, DType::I32];
/// Numeric types with int64: the arithmetic TensorFlow's GPU kernels have for int64.
const NUMERIC64: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64];
const FLOAT: &[DType] = &[DType::F32, DType::F16];
/// Types that order: the comparisons.
const ORDERED: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64];
/// Types with equality.
const EQUALITY: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64, DType::Bool];

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

macro_rules! equality_row {
    ($name:literal, $op:expr) => {
        OpDef {
            op: $name,
            type_attr: "T",
            dtypes: EQUALITY,
            host_inputs: &[],
            factory: |a| binary::Binary::build_equality($name, $op, a),
        }
    };
}

/// A bool op: no type attribute.
macro_rules! logical_row {
    ($name:literal, $factory:expr) => {
        OpDef {
            op: $name,
            type_attr: "",
            dtypes: &[],
            host_inputs: &[],
            factory: $factory,
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
    binary_row!("AddV2", BinaryOp::Add, NUMERIC64),
    binary_row!("Add", BinaryOp::Add, NUMERIC64),
    binary_row!("Sub", BinaryOp::Sub, NUMERIC64),
    binary_row!("Mul", BinaryOp::Mul, NUMERIC64),
    binary_row!("RealDiv", BinaryOp::RealDiv, FLOAT),
    binary_row!("Div", BinaryOp::Div, NUMERIC64),
    binary_row!("Maximum", BinaryOp::Maximum, NUMERIC64),
    binary_row!("Minimum", BinaryOp::Minimum, NUMERIC64),
    binary_row!("SquaredDifference", BinaryOp::SquaredDifference, NUMERIC64),
    binary_row!("Pow", BinaryOp::Pow, NUMERIC),
    binary_row!("DivNoNan", BinaryOp::DivNoNan, FLOAT),
    binary_row!("FloorDiv", BinaryOp::FloorDiv, NUMERIC64),
    binary_row!("FloorMod", BinaryOp::FloorMod, NUMERIC64),
    equality_row!("Equal", BinaryOp::Equal),
    equality_row!("NotEqual", BinaryOp::NotEqual),
    binary_row!("Less", BinaryOp::Less, ORDERED),
    binary_row!("LessEqual", BinaryOp::LessEqual, ORDERED),
    binary_row!("Greater", BinaryOp::Greater, ORDERED),
    binary_row!("GreaterEqual", BinaryOp::GreaterEqual, ORDERED),
    logical_row!("LogicalAnd", |_| Ok(Box::new(binary::Binary::new(
        "LogicalAnd",
        BinaryOp::LogicalAnd
    )))),
    logical_row!("LogicalOr", |_| Ok(Box::new(binary::Binary::new(
        "LogicalOr",
        BinaryOp::LogicalOr
    )))),
    logical_row!("LogicalNot", |_| Ok(Box::new(unary::Unary::new(
        "LogicalNot",
        UnaryOp::LogicalNot
    )))),
    binary_row!("ReluGrad", BinaryOp::ReluGrad, NUMERIC),
    binary_row!("SoftplusGrad", BinaryOp::SoftplusGrad, FLOAT),
    binary_row!("SigmoidGrad", BinaryOp::SigmoidGrad, FLOAT),
    binary_row!("TanhGrad", BinaryOp::TanhGrad, FLOAT),
    binary_row!("SqrtGrad", BinaryOp::SqrtGrad, FLOAT),
    binary_row!("RsqrtGrad", BinaryOp::RsqrtGrad, FLOAT),
    binary_row!("ReciprocalGrad", BinaryOp::ReciprocalGrad, FLOAT),
    unary_row!("Neg", UnaryOp::Neg, NUMERIC64),
    unary_row!("Abs", UnaryOp::Abs, NUMERIC64),
    unary_row!("Relu", UnaryOp::Relu, NUMERIC),
    unary_row!("Exp", UnaryOp::Exp, FLOAT),
    unary_row!("Log", UnaryOp::Log, FLOAT),
    unary_row!("Sqrt", UnaryOp::Sqrt, FLOAT),
    unary_row!("Tanh", UnaryOp::Tanh, FLOAT),
    unary_row!("Sigmoid", UnaryOp::Sigmoid, FLOAT),
    unary_row!("Square", UnaryOp::Square, NUMERIC64),
    unary_row!("Rsqrt", UnaryOp::Rsqrt, FLOAT),
    unary_row!("Reciprocal", UnaryOp::Reciprocal, FLOAT),
    unary_row!("Sign", UnaryOp::Sign, NUMERIC64),
    unary_row!("Floor", UnaryOp::Floor, FLOAT),
    unary_row!("Ceil", UnaryOp::Ceil, FLOAT),
    unary_row!("Round", UnaryOp::Round, NUMERIC),
    unary_row!("Log1p", UnaryOp::Log1p, FLOAT),
    unary_row!("Expm1", UnaryOp::Expm1, FLOAT),
    unary_row!("Softplus", UnaryOp::Softplus, FLOAT),
    unary_row!("Sin", UnaryOp::Sin, FLOAT),
    unary_row!("Cos", UnaryOp::Cos, FLOAT),
    unary_row!("Tan", UnaryOp::Tan, FLOAT),
    unary_row!("Relu6", UnaryOp::Relu6, FLOAT),
    unary_row!("Elu", UnaryOp::Elu, FLOAT),
    unary_row!("Selu", UnaryOp::Selu, FLOAT),
    unary_row!("Softsign", UnaryOp::Softsign, FLOAT),
    unary_row!("IsNan", UnaryOp::IsNan, FLOAT),
    unary_row!("IsInf", UnaryOp::IsInf, FLOAT),
    unary_row!("IsFinite", UnaryOp::IsFinite, FLOAT),
    OpDef {
        op: "LeakyRelu",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: unary::Unary::build_leaky_relu,
    },
    binary_row!("Relu6Grad", BinaryOp::Relu6Grad, FLOAT),
    binary_row!("EluGrad", BinaryOp::EluGrad, FLOAT),
    binary_row!("SeluGrad", BinaryOp::SeluGrad, FLOAT),
    binary_row!("SoftsignGrad", BinaryOp::SoftsignGrad, FLOAT),
    OpDef {
        op: "LeakyReluGrad",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: binary::Binary::build_leaky_relu_grad,
    },
    OpDef {
        op: "ClipByValue",
        type_attr: "T",
        dtypes: &[DType::F32, DType::F16, DType::I64],
        host_inputs: &[],
        factory: |_| Ok(Box::new(clip::ClipByValue)),
    },
    OpDef {
        op: "AddN",
        type_attr: "T",
        dtypes: NUMERIC,
        host_inputs: &[],
        factory: addn::AddN::build,
    },
    OpDef {
        op: "Select",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(select::Select::new("Select", false))),
    },
    OpDef {
        op: "SelectV2",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(select::Select::new("SelectV2", true))),
    },
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

/// TensorFlow's broadcast of several shapes; `None` when they are incompatible.
pub(crate) fn broadcast_shape(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    binary::Broadcast::of(shapes).map(|b| b.out_shape)
}

/// A shape as TensorFlow prints it: `[2,3]`.
pub(crate) fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// A storage binding for an output tensor. Outputs are written in place, so unlike
/// `KernelContext::bind` (which copies a misaligned input to a temporary) a misaligned output
/// is an error.
pub(crate) fn bind_out(ctx: &KernelContext, op: &str, t: &DeviceRef) -> Result<BufferRange> {
    bind_out_bytes(ctx, op, t, t.desc.byte_size())
}

/// `bind_out` for a binding of `size` bytes from the tensor's address (slice's shaders write
/// whole words past a packed tensor's last byte).
pub(crate) fn bind_out_bytes(
    ctx: &KernelContext,
    op: &str,
    t: &DeviceRef,
    size: u64,
) -> Result<BufferRange> {
    let r = ctx.dev.alloc.resolve(t.addr)?;
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
/// (f32 for f32 and f16, i32 for i32, bool for bool, (low, high) words for i64).
pub(crate) fn load_expr(dtype: DType, arr: &str) -> String {
    match dtype {
        DType::F32 => format!("bitcast<f32>({arr}[i])"),
        DType::F16 => format!("f16_to_f32(({arr}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu)"),
        DType::Bool => format!("(({arr}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u"),
        DType::I64 => format!("vec2<u32>({arr}[2u * i], {arr}[2u * i + 1u])"),
        _ => format!("bitcast<i32>({arr}[i])"),
    }
}

/// WGSL statements writing output word `w` from `elem(e)` (with `p.n` elements in all), for
/// an output of `dtype` (f32, f16, i32 or bool).
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
        DType::Bool => {
            "    let e0 = w * 4u;
    var v = 0u;
    for (var k = 0u; k < 4u; k = k + 1u) {
        if e0 + k < p.n && elem(e0 + k) {
            v = v | (1u << (8u * k));
        }
    }
    out[w] = v;"
        }
        DType::I64 => {
            "    let v = elem(w);
    out[2u * w] = v.x;
    out[2u * w + 1u] = v.y;"
        }
        _ => "    out[w] = bitcast<u32>(elem(w));",
    }
}

/// The WGSL compute type of a dtype handled by the elementwise kernels.
pub(crate) fn compute_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 => "f32",
        DType::Bool => "bool",
        DType::I64 => "vec2<u32>",
        _ => "i32",
    }
}

/// The WGSL expression of `rt(v)`: an intermediate float result rounded to the dtype (f16
/// ops round where Eigen's `half` arithmetic rounds).
pub(crate) fn rt_expr(dtype: DType) -> &'static str {
    if dtype == DType::F16 {
        "f16_to_f32(f32_to_f16(v))"
    } else {
        "v"
    }
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
