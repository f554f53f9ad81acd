//! Unary elementwise ops. Float ops run in f32 (f16 is converted exactly and rounded to
//! nearest even on the way out); the transcendental functions come from `math.wgsl`.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::PipelineKey;
use crate::kernels::f16conv;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{
    COMMON_WGSL, INT64_WGSL, MATH_WGSL, bind_out, compute_type, fmt_shape, load_expr, rt_expr,
    store_stmt, words_for,
};

const UNARY_WGSL: &str = include_str!("unary.wgsl");
const TRIG_WGSL: &str = include_str!("trig.wgsl");

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
    Sin,
    Cos,
    Tan,
    Relu6,
    Elu,
    Selu,
    /// Uses the kernel's `alpha`.
    LeakyRelu,
    Softsign,
    /// Bool output.
    IsNan,
    /// Bool output.
    IsInf,
    /// Bool output.
    IsFinite,
}

/// SELU's scale and scale * alpha, rounded to f32 (TensorFlow's constants).
pub(crate) const SELU_SCALE: f32 = f32::from_bits(0x3f86_7d5f);
pub(crate) const SELU_SCALE_ALPHA: f32 = f32::from_bits(0x3fe1_0966);

/// WGSL declarations of `SELU_SCALE` and `SELU_SCALE_ALPHA` (f32 literals that round-trip).
pub(crate) fn selu_consts() -> String {
    format!(
        "const SELU_SCALE: f32 = {SELU_SCALE:?}f;\nconst SELU_SCALE_ALPHA: f32 = {SELU_SCALE_ALPHA:?}f;\n"
    )
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
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tan => "tan",
            UnaryOp::Relu6 => "relu6",
            UnaryOp::Elu => "elu",
            UnaryOp::Selu => "selu",
            UnaryOp::LeakyRelu => "leaky_relu",
            UnaryOp::Softsign => "softsign",
            UnaryOp::IsNan => "is_nan",
            UnaryOp::IsInf => "is_inf",
            UnaryOp::IsFinite => "is_finite",
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

    /// The output dtype for an input of `dtype`.
    fn output_dtype(self, dtype: DType) -> DType {
        match self {
            UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite => DType::Bool,
            _ => dtype,
        }
    }

    /// The body of `fn op(v: T) -> T`.
    fn wgsl(self, dtype: DType) -> &'static str {
        match self {
            UnaryOp::IsNan => return "    return is_nan(v);",
            UnaryOp::IsInf => {
                return "    return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u;";
            }
            UnaryOp::IsFinite => {
                return "    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;";
            }
            _ => {}
        }
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
                UnaryOp::Sin => "    return sincos_f32(v, false);",
                UnaryOp::Cos => "    return sincos_f32(v, true);",
                UnaryOp::Tan => "    return tan_f32(v);",
                // max(x, 0) then min(., 6), NaN propagating; -0 stays -0 (std::max).
                UnaryOp::Relu6 => {
                    "    if is_nan(v) {
        return v;
    }
    if f32_less(v, 0.0) {
        return 0.0;
    }
    if f32_less(6.0, v) {
        return 6.0;
    }
    return v;"
                }
                // TensorFlow: x < 0 ? exp(x) - 1 : x (exp(x) - 1, not expm1).
                UnaryOp::Elu => {
                    "    if !is_nan(v) && f32_less(v, 0.0) {
        return rt(exp_f32(v)) - 1.0;
    }
    return v;"
                }
                UnaryOp::Selu => {
                    "    if !is_nan(v) && f32_less(v, 0.0) {
        return rt(SELU_SCALE_ALPHA) * rt(rt(exp_f32(v)) - 1.0);
    }
    return rt(SELU_SCALE) * v;"
                }
                // TensorFlow: x > 0 ? x : x * alpha (alpha may exceed 1).
                UnaryOp::LeakyRelu => {
                    "    if !is_nan(v) && f32_less(0.0, v) {
        return v;
    }
    return v * alpha();"
                }
                UnaryOp::Softsign => {
                    "    return v / rt(bitcast<f32>(bitcast<u32>(v) & 0x7fffffffu) + 1.0);"
                }
                UnaryOp::LogicalNot | UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite => {
                    unreachable!("handled above")
                }
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
    /// LeakyRelu's `alpha` (unused by the other ops).
    alpha: f32,
}

impl Unary {
    pub fn new(name: &'static str, op: UnaryOp) -> Self {
        Unary {
            name,
            op,
            alpha: 0.0,
        }
    }

    /// LeakyRelu, reading `alpha` (default 0.2, as TensorFlow's op definition).
    pub fn build_leaky_relu(attrs: &crate::Attrs) -> Result<Box<dyn Kernel>> {
        let alpha = attrs
            .float_or("alpha", 0.2)
            .map_err(|e| crate::invalid_arg!("LeakyRelu: {e}"))?;
        Ok(Box::new(Unary {
            name: "LeakyRelu",
            op: UnaryOp::LeakyRelu,
            alpha,
        }))
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

    fn out_desc(&self, desc: &TensorDesc) -> TensorDesc {
        TensorDesc::new(self.op.output_dtype(desc.dtype), &desc.shape)
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
        let desc = self.check(inputs)?;
        Ok(vec![self.out_desc(&desc)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let out = &outputs[0];
        let want = self.out_desc(&desc);
        if out.desc != want {
            bail_invalid!(
                "{}: output is {} {} but the op computes {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                want.dtype,
                fmt_shape(&want.shape)
            );
        }
        let x = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let (op, dtype) = (self.op, desc.dtype);
        let (hw, suffix) = f16conv::choice(ctx, dtype == DType::F16)?;
        let key = PipelineKey::new("elementwise", Some(dtype), format!("{}{suffix}", op.name()));
        let pipeline = ctx.pipeline(key, || {
            crate::kernels::membound_shader(shader(op, dtype, hw))
        })?;
        let words = words_for(self.name, want.dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        ctx.dispatch(
            &pipeline,
            &params(&[row, n as u32, words, self.alpha.to_bits()]),
            &[x, o],
            groups,
        )
    }
}

/// The store of a float16 -> float16 op: one word load, both halves widened together.
const STORE_F16_PAIR: &str = "    let v = f16x2_to_f32(x[w]);
    var hi = 0.0;
    if 2u * w + 1u < p.n {
        hi = op(v.y);
    }
    out[w] = f32x2_to_f16(vec2<f32>(op(v.x), hi));";

/// The shader of `op` on `dtype`; float16 converts through `f16conv` (`hw`: the hardware
/// conversions).
fn shader(op: UnaryOp, dtype: DType, hw: bool) -> String {
    let mut math = match dtype {
        DType::F32 | DType::F16 => MATH_WGSL.to_string(),
        DType::I64 => INT64_WGSL.to_string(),
        _ => String::new(),
    };
    if matches!(op, UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan) {
        math.push_str(TRIG_WGSL);
    }
    if matches!(op, UnaryOp::Selu) {
        math.push_str(&selu_consts());
    }
    let out_dtype = op.output_dtype(dtype);
    if dtype == DType::F16 {
        math.push_str(f16conv::f16x2_wgsl(hw));
    }
    let store = if dtype == DType::F16 && out_dtype == DType::F16 {
        STORE_F16_PAIR.to_string()
    } else {
        f16conv::routed(store_stmt(out_dtype))
    };
    UNARY_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace("$MATH", &math)
        .replace("$LOAD", &f16conv::routed(&load_expr(dtype, "x")))
        .replace("$OP", op.wgsl(dtype))
        .replace("$STORE", &store)
        .replace("$RT", &f16conv::routed(rt_expr(dtype)))
        .replace("$TOUT", compute_type(out_dtype))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}
