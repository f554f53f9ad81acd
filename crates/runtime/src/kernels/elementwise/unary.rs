//! Unary elementwise ops. Float ops run in f32 (f16 is converted exactly and rounded to
//! nearest even on the way out); the transcendental functions come from `math.wgsl`.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{
    COMMON_WGSL, INT64_WGSL, MATH_WGSL, bind_out, compute_type, fmt_shape, load_expr, store_stmt,
    words_for,
};

const UNARY_WGSL: &str = include_str!("unary.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnaryOp {
    Neg,
    Abs,
    Relu,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Sigmoid,
    Square,
    Rsqrt,
    Reciprocal,
    Sign,
    Floor,
    Ceil,
    Round,
    Log1p,
    Expm1,
    Softplus,
    LogicalNot,
}

impl UnaryOp {
    fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Square => "square",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Softplus => "softplus",
            UnaryOp::LogicalNot => "logical_not",
        }
    }

    fn supports(self, dtype: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Square | UnaryOp::Sign => {
                matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::I64)
            }
            UnaryOp::Round => matches!(dtype, DType::F32 | DType::F16 | DType::I32),
            UnaryOp::LogicalNot => dtype == DType::Bool,
            _ => dtype.is_float(),
        }
    }

    /// The body of `fn op(v: T) -> T`.
    fn wgsl(self, dtype: DType) -> &'static str {
        if dtype == DType::Bool {
            return "    return !v;";
        }
        if dtype.is_float() {
            match self {
                // Sign-bit operations: exact for every value, NaN included.
                UnaryOp::Neg => "    return bitcast<f32>(bitcast<u32>(v) ^ 0x80000000u);",
                UnaryOp::Abs => "    return bitcast<f32>(bitcast<u32>(v) & 0x7fffffffu);",
                UnaryOp::Relu => "    return relu_f32(v);",
                UnaryOp::Exp => "    return exp_f32(v);",
                UnaryOp::Log => "    return log_f32(v);",
                UnaryOp::Sqrt => "    return sqrt_f32(v);",
                UnaryOp::Tanh => "    return tanh_f32(v);",
                UnaryOp::Sigmoid => "    return sigmoid_f32(v);",
                UnaryOp::Square => "    return v * v;",
                UnaryOp::Rsqrt => "    return rsqrt_f32(v);",
                UnaryOp::Reciprocal => "    return 1.0 / v;",
                // -1, 0 or 1; Sign(+-0) = +0, Sign(NaN) = NaN (TensorFlow).
                UnaryOp::Sign => {
                    "    let b = bitcast<u32>(v);
    if is_nan(v) {
        return v;
    }
    if (b & 0x7fffffffu) == 0u {
        return 0.0;
    }
    return select(1.0, -1.0, (b >> 31u) == 1u);"
                }
                UnaryOp::Floor => "    return floor_f32(v);",
                UnaryOp::Ceil => "    return ceil_f32(v);",
                UnaryOp::Round => "    return round_f32(v);",
                UnaryOp::Log1p => "    return log1p_f32(v);",
                UnaryOp::Expm1 => "    return expm1_f32(v);",
                UnaryOp::Softplus => "    return softplus_f32(v);",
                UnaryOp::LogicalNot => unreachable!("bool only"),
            }
        } else if dtype == DType::I64 {
            // Wrapping, as int32.
            match self {
                UnaryOp::Neg => "    return neg64(v);",
                UnaryOp::Abs => "    return abs64(v);",
                UnaryOp::Square => "    return mul64(v, v);",
                UnaryOp::Sign => {
                    "    if is_zero64(v) {
        return v;
    }
    return select(vec2<u32>(1u, 0u), vec2<u32>(0xffffffffu), is_neg64(v));"
                }
                _ => "    return select(v, vec2<u32>(0u), is_neg64(v));",
            }
        } else {
            // i32 arithmetic wraps: Neg(INT_MIN) = Abs(INT_MIN) = INT_MIN.
            match self {
                UnaryOp::Neg => "    return 0 - v;",
                UnaryOp::Abs => "    return select(v, 0 - v, v < 0);",
                UnaryOp::Square => "    return v * v;",
                UnaryOp::Sign => "    return select(select(0, 1, v > 0), -1, v < 0);",
                UnaryOp::Round => "    return v;",
                _ => "    return max(v, 0);",
            }
        }
    }
}

/// One unary op (a table row: TensorFlow's name and the operation).
pub(crate) struct Unary {
    name: &'static str,
    op: UnaryOp,
}

impl Unary {
    pub fn new(name: &'static str, op: UnaryOp) -> Self {
        Unary { name, op }
    }

    fn check(&self, inputs: &[Operand]) -> Result<TensorDesc> {
        if inputs.len() != 1 {
            bail_invalid!("{} takes 1 input, got {}", self.name, inputs.len());
        }
        let desc = inputs[0].desc();
        if !self.op.supports(desc.dtype) {
            return Err(Error::Unimplemented(format!(
                "{} has no tfwgpu kernel for T={}",
                self.name, desc.dtype
            )));
        }
        words_for(self.name, desc.dtype, desc.num_elements())?;
        Ok(desc)
    }
}

impl Kernel for Unary {
    fn op(&self) -> &'static str {
        self.name
    }

    /// Each invocation reads the elements of the word it writes, then writes it.
    fn forwardable_inputs(&self) -> &'static [usize] {
        &[0]
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let out = &outputs[0];
        if out.desc != desc {
            bail_invalid!(
                "{}: output is {} {} but the input is {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                desc.dtype,
                fmt_shape(&desc.shape)
            );
        }
        let x = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let (op, dtype) = (self.op, desc.dtype);
        let key = PipelineKey::new("elementwise", Some(dtype), op.name());
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(op, dtype)))?;
        let words = words_for(self.name, dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        ctx.dispatch(
            &pipeline,
            &params(&[row, n as u32, words, 0]),
            &[x, o],
            groups,
        )
    }
}

fn shader(op: UnaryOp, dtype: DType) -> String {
    UNARY_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace(
            "$MATH",
            match dtype {
                DType::F32 | DType::F16 => MATH_WGSL,
                DType::I64 => INT64_WGSL,
                _ => "",
            },
        )
        .replace("$LOAD", &load_expr(dtype, "x"))
        .replace("$OP", op.wgsl(dtype))
        .replace("$STORE", store_stmt(dtype))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}
