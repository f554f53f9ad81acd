//! Binary elementwise ops with broadcasting.
//!
//! The two input shapes are broadcast as NumPy/TensorFlow do (aligned on the right; each pair
//! of dimensions equal, or one of them 1). The output shape is then simplified for the shader:
//! size-1 dimensions are dropped and adjacent dimensions along which both inputs advance
//! contiguously (or both are broadcast) are merged. What remains travels in the params uniform:
//! at most `MAX_RANK` dimensions with an element stride per input (0 on broadcast dimensions).
//! When at most one dimension remains (same shapes, or a scalar operand), a "flat" pipeline
//! computes each input's offset as `e * stride` (stride 0 or 1) and skips the index
//! arithmetic.

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::PipelineKey;
use crate::kernels::f16conv;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{
    COMMON_WGSL, INT64_WGSL, MATH_WGSL, bind_out, compute_type, fmt_shape, load_expr, rt_expr,
    store_stmt, words_for,
};

const BINARY_WGSL: &str = include_str!("binary.wgsl");
const POW_WGSL: &str = include_str!("pow.wgsl");

/// Most dimensions a broadcast may have after merging.
pub(crate) const MAX_RANK: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division only.
    RealDiv,
    /// Float division, or truncating int32 division.
    Div,
    Maximum,
    Minimum,
    SquaredDifference,
    Pow,
    DivNoNan,
    FloorDiv,
    FloorMod,
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    LogicalAnd,
    LogicalOr,
    /// (gradients, features): gradients where features > 0.
    ReluGrad,
    /// (gradients, features).
    SoftplusGrad,
    /// (y, dy) for the ops below: the gradient through y = f(x).
    SigmoidGrad,
    TanhGrad,
    SqrtGrad,
    RsqrtGrad,
    ReciprocalGrad,
    /// (gradients, features) for the activations below.
    Relu6Grad,
    /// (gradients, activations).
    EluGrad,
    /// (gradients, activations).
    SeluGrad,
    /// (gradients, features), with the kernel's `alpha`.
    LeakyReluGrad,
    /// (gradients, features).
    SoftsignGrad,
}

/// How the two input shapes of an op must relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shapes {
    /// NumPy/TensorFlow broadcasting.
    Broadcast,
    /// Equal shapes (TensorFlow's BinaryElementWiseOp: ReluGrad, SoftplusGrad).
    Same,
    /// Equal element counts, the output shaped like input 0 (TensorFlow's SimpleBinaryOp: the
    /// y/dy gradients).
    SameCount,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::RealDiv | BinaryOp::Div => "div",
            BinaryOp::Maximum => "max",
            BinaryOp::Minimum => "min",
            BinaryOp::SquaredDifference => "squared_difference",
            BinaryOp::Pow => "pow",
            BinaryOp::DivNoNan => "div_no_nan",
            BinaryOp::FloorDiv => "floor_div",
            BinaryOp::FloorMod => "floor_mod",
            BinaryOp::Equal => "equal",
            BinaryOp::NotEqual => "not_equal",
            BinaryOp::Less => "less",
            BinaryOp::LessEqual => "less_equal",
            BinaryOp::Greater => "greater",
            BinaryOp::GreaterEqual => "greater_equal",
            BinaryOp::LogicalAnd => "logical_and",
            BinaryOp::LogicalOr => "logical_or",
            BinaryOp::ReluGrad => "relu_grad",
            BinaryOp::SoftplusGrad => "softplus_grad",
            BinaryOp::SigmoidGrad => "sigmoid_grad",
            BinaryOp::TanhGrad => "tanh_grad",
            BinaryOp::SqrtGrad => "sqrt_grad",
            BinaryOp::RsqrtGrad => "rsqrt_grad",
            BinaryOp::ReciprocalGrad => "reciprocal_grad",
            BinaryOp::Relu6Grad => "relu6_grad",
            BinaryOp::EluGrad => "elu_grad",
            BinaryOp::SeluGrad => "selu_grad",
            BinaryOp::LeakyReluGrad => "leaky_relu_grad",
            BinaryOp::SoftsignGrad => "softsign_grad",
        }
    }

    fn supports(self, dtype: DType) -> bool {
        use BinaryOp::*;
        match self {
            RealDiv | DivNoNan | SoftplusGrad | SigmoidGrad | TanhGrad | SqrtGrad | RsqrtGrad
            | ReciprocalGrad | Relu6Grad | EluGrad | SeluGrad | LeakyReluGrad | SoftsignGrad => {
                dtype.is_float()
            }
            Equal | NotEqual => matches!(
                dtype,
                DType::F32 | DType::F16 | DType::I32 | DType::I64 | DType::Bool
            ),
            Less | LessEqual | Greater | GreaterEqual => {
                matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::I64)
            }
            LogicalAnd | LogicalOr => dtype == DType::Bool,
            Add | Sub | Mul | Div | Maximum | Minimum | SquaredDifference | FloorDiv | FloorMod => {
                matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::I64)
            }
            _ => matches!(dtype, DType::F32 | DType::F16 | DType::I32),
        }
    }

    /// The output dtype for inputs of `dtype`.
    fn output_dtype(self, dtype: DType) -> DType {
        use BinaryOp::*;
        match self {
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd
            | LogicalOr => DType::Bool,
            _ => dtype,
        }
    }

    fn shapes(self) -> Shapes {
        use BinaryOp::*;
        match self {
            ReluGrad | SoftplusGrad | Relu6Grad | EluGrad | SeluGrad | LeakyReluGrad
            | SoftsignGrad => Shapes::Same,
            SigmoidGrad | TanhGrad | SqrtGrad | RsqrtGrad | ReciprocalGrad => Shapes::SameCount,
            _ => Shapes::Broadcast,
        }
    }

    /// Whether the float shader needs `math.wgsl` (and `pow.wgsl`).
    fn math(self) -> (bool, bool) {
        use BinaryOp::*;
        match self {
            Pow => (true, true),
            FloorDiv | FloorMod | SoftplusGrad => (true, false),
            _ => (false, false),
        }
    }

    /// The body of `fn op(x: T, y: T) -> TOUT`. In float bodies `rt(v)` rounds an
    /// intermediate result to the dtype (identity for f32, to nearest f16 for f16), so f16
    /// ops round where Eigen's `half` arithmetic rounds.
    fn wgsl(self, dtype: DType) -> &'static str {
        use BinaryOp::*;
        match dtype {
            DType::F32 | DType::F16 => self.wgsl_float(),
            DType::I64 => self.wgsl_i64(),
            DType::Bool => match self {
                Equal => "    return x == y;",
                NotEqual => "    return x != y;",
                LogicalAnd => "    return x && y;",
                _ => "    return x || y;",
            },
            _ => self.wgsl_i32(),
        }
    }

    /// The body of `fn op(x: f32, y: f32) -> f32` (also the fused programs' binary ops).
    pub(crate) fn wgsl_float(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "    return x + y;",
            Sub => "    return x - y;",
            Mul => "    return x * y;",
            RealDiv | Div => "    return x / y;",
            // NaN from either side, else std::max / std::min (`x < y ? y : x`,
            // `y < x ? y : x`), decided on integer keys: a float compare plus select is
            // turned into a hardware max/min by some drivers, whose sign of zero differs.
            Maximum => {
                "    if is_nan(x) {
        return x;
    }
    if is_nan(y) {
        return y;
    }
    return bitcast<f32>(select(bitcast<u32>(x), bitcast<u32>(y), f32_less(x, y)));"
            }
            Minimum => {
                "    if is_nan(x) {
        return x;
    }
    if is_nan(y) {
        return y;
    }
    return bitcast<f32>(select(bitcast<u32>(x), bitcast<u32>(y), f32_less(y, x)));"
            }
            SquaredDifference => "    let d = rt(x - y);\n    return d * d;",
            Pow => "    return pow_f32(x, y);",
            DivNoNan => {
                "    if (bitcast<u32>(y) & 0x7fffffffu) == 0u {
        return 0.0;
    }
    return x / y;"
            }
            // floor of the correctly rounded quotient (TensorFlow: floor(x / y)).
            FloorDiv => "    return floor_f32(rt(div_rn_f32(x, y)));",
            // TensorFlow: t = fmod(x, y); t + y when t != 0 and t, y differ in sign.
            FloorMod => {
                "    let t = fmod_f32(x, y);
    let bt = bitcast<u32>(t);
    if (bt & 0x7fffffffu) != 0u && !is_nan(t) && !is_nan(y)
        && ((bt >> 31u) != (bitcast<u32>(y) >> 31u)) {
        return t + y;
    }
    return t;"
            }
            // Comparisons are false when either side is NaN (NotEqual: true).
            Equal => "    return !is_nan(x) && !is_nan(y) && !f32_less(x, y) && !f32_less(y, x);",
            NotEqual => "    return is_nan(x) || is_nan(y) || f32_less(x, y) || f32_less(y, x);",
            Less => "    return !is_nan(x) && !is_nan(y) && f32_less(x, y);",
            LessEqual => "    return !is_nan(x) && !is_nan(y) && !f32_less(y, x);",
            Greater => "    return !is_nan(x) && !is_nan(y) && f32_less(y, x);",
            GreaterEqual => "    return !is_nan(x) && !is_nan(y) && !f32_less(x, y);",
            LogicalAnd | LogicalOr => unreachable!("bool only"),
            // TensorFlow: gradients * (features > 0) (so NaN or inf gradients give NaN where
            // features <= 0, and negative gradients -0).
            ReluGrad => "    return x * select(0.0, 1.0, !is_nan(y) && f32_less(0.0, y));",
            SoftplusGrad => "    return x / rt(rt(exp_f32(-y)) + 1.0);",
            // The association of TensorFlow's (vectorized) CPU kernels.
            SigmoidGrad => "    return y * rt(x * rt(1.0 - x));",
            TanhGrad => "    return y * rt(1.0 - rt(x * x));",
            SqrtGrad => {
                "    if (bitcast<u32>(y) & 0x7fffffffu) == 0u {
        return 0.0;
    }
    return rt(0.5 / x) * y;"
            }
            RsqrtGrad => {
                "    if (bitcast<u32>(y) & 0x7fffffffu) == 0u {
        return 0.0;
    }
    return rt(-0.5 * rt(y * x)) * rt(x * x);"
            }
            ReciprocalGrad => {
                "    if (bitcast<u32>(y) & 0x7fffffffu) == 0u {
        return 0.0;
    }
    return rt(-x * x) * y;"
            }
            // gradients * ((features > 0) * (features < 6)).
            Relu6Grad => {
                "    return x * select(0.0, 1.0, !is_nan(y) && f32_less(0.0, y) && f32_less(y, 6.0));"
            }
            // activations < 0 ? (activations + 1) * gradients : gradients.
            EluGrad => {
                "    if !is_nan(y) && f32_less(y, 0.0) {
        return rt(y + 1.0) * x;
    }
    return x;"
            }
            // activations < 0 ? gradients * (activations + scale * alpha) : gradients * scale.
            SeluGrad => {
                "    if !is_nan(y) && f32_less(y, 0.0) {
        return x * rt(y + rt(SELU_SCALE_ALPHA));
    }
    return x * rt(SELU_SCALE);"
            }
            // features > 0 ? gradients : gradients * alpha.
            LeakyReluGrad => {
                "    if !is_nan(y) && f32_less(0.0, y) {
        return x;
    }
    return x * alpha();"
            }
            // gradients / (|features| + 1)^2.
            SoftsignGrad => {
                "    let d = rt(bitcast<f32>(bitcast<u32>(y) & 0x7fffffffu) + 1.0);
    return x / rt(d * d);"
            }
        }
    }

    /// int64 bodies on (low, high) word pairs (`int64.wgsl`); wrapping like TensorFlow,
    /// division by zero 0 as for int32.
    fn wgsl_i64(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "    return add64(x, y);",
            Sub => "    return sub64(x, y);",
            Mul => "    return mul64(x, y);",
            Div => "    return divmod64(x, y).xy;",
            Maximum => "    return select(x, y, lt64(x, y));",
            Minimum => "    return select(x, y, lt64(y, x));",
            SquaredDifference => "    let d = sub64(x, y);\n    return mul64(d, d);",
            FloorDiv => {
                "    let qr = divmod64(x, y);
    if !is_zero64(qr.zw) && (is_neg64(x) != is_neg64(y)) {
        return sub64(qr.xy, vec2<u32>(1u, 0u));
    }
    return qr.xy;"
            }
            FloorMod => {
                "    let r = divmod64(x, y).zw;
    if !is_zero64(r) && (is_neg64(r) != is_neg64(y)) {
        return add64(r, y);
    }
    return r;"
            }
            Equal => "    return all(x == y);",
            NotEqual => "    return any(x != y);",
            Less => "    return lt64(x, y);",
            LessEqual => "    return !lt64(y, x);",
            Greater => "    return lt64(y, x);",
            GreaterEqual => "    return !lt64(x, y);",
            _ => unreachable!("not an int64 op"),
        }
    }

    fn wgsl_i32(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "    return x + y;",
            Sub => "    return x - y;",
            Mul => "    return x * y;",
            // WGSL's i32 division truncates and gives INT_MIN for INT_MIN / -1, like
            // TensorFlow; division by zero is defined here as 0 (TensorFlow raises an error).
            RealDiv | Div => {
                "    if y == 0 {
        return 0;
    }
    return x / y;"
            }
            Maximum => "    return max(x, y);",
            Minimum => "    return min(x, y);",
            SquaredDifference => "    let d = x - y;\n    return d * d;",
            // Wrapping repeated squaring. A negative exponent (an error in TensorFlow) gives
            // the truncated quotient 1 / x^-y: 1 for x = 1, +-1 for x = -1, else 0.
            Pow => {
                "    if y < 0 {
        if x == 1 {
            return 1;
        }
        if x == -1 {
            return select(1, -1, (y & 1) != 0);
        }
        return 0;
    }
    var base = x;
    var e = y;
    var r = 1;
    loop {
        if (e & 1) != 0 {
            r = r * base;
        }
        e = e >> 1u;
        if e == 0 {
            break;
        }
        base = base * base;
    }
    return r;"
            }
            // Division by zero (an error in TensorFlow) gives 0.
            FloorDiv => {
                "    if y == 0 {
        return 0;
    }
    let q = x / y;
    if x % y != 0 && ((x < 0) != (y < 0)) {
        return q - 1;
    }
    return q;"
            }
            FloorMod => {
                "    if y == 0 {
        return 0;
    }
    let r = x % y;
    if r != 0 && ((r < 0) != (y < 0)) {
        return r + y;
    }
    return r;"
            }
            Equal => "    return x == y;",
            NotEqual => "    return x != y;",
            Less => "    return x < y;",
            LessEqual => "    return x <= y;",
            Greater => "    return x > y;",
            GreaterEqual => "    return x >= y;",
            ReluGrad => "    return select(0, x, y > 0);",
            _ => unreachable!("float only"),
        }
    }
}

/// The broadcast of several shapes, simplified for the shader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Broadcast {
    /// The output shape (TensorFlow's).
    pub out_shape: Vec<usize>,
    /// Merged dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Element strides of each input along `dims` (0 on broadcast dimensions).
    pub strides: Vec<Vec<usize>>,
}

impl Broadcast {
    /// Broadcasts `a` with `b`; errors name the op and both shapes.
    pub fn new(op: &str, a: &[usize], b: &[usize]) -> Result<Self> {
        Self::of(&[a, b]).ok_or_else(|| {
            crate::invalid_arg!(
                "{op}: incompatible shapes {} and {}",
                fmt_shape(a),
                fmt_shape(b)
            )
        })
    }

    /// Broadcasts any number of shapes (aligned on the right; each dimension equal, or 1);
    /// `None` when they are incompatible.
    pub fn of(shapes: &[&[usize]]) -> Option<Self> {
        let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
        let padded: Vec<Vec<usize>> = shapes
            .iter()
            .map(|s| {
                let mut v = vec![1; rank - s.len()];
                v.extend_from_slice(s);
                v
            })
            .collect();
        let mut out_shape = Vec::with_capacity(rank);
        for d in 0..rank {
            let mut n = 1;
            for p in &padded {
                if p[d] != 1 {
                    if n != 1 && n != p[d] {
                        return None;
                    }
                    n = p[d];
                }
            }
            // A dimension of 0 against 1 is 0; 0 against anything else is incompatible.
            out_shape.push(n);
        }
        let full: Vec<Vec<usize>> = padded
            .iter()
            .map(|s| {
                let mut st = vec![0; rank];
                let mut acc = 1;
                for d in (0..rank).rev() {
                    st[d] = if s[d] == 1 { 0 } else { acc };
                    acc *= s[d];
                }
                st
            })
            .collect();
        let (dims, strides) = merge_dims(&out_shape, &full);
        Some(Broadcast {
            out_shape,
            dims,
            strides,
        })
    }

    /// A flat view of `n` elements read contiguously by `inputs` inputs.
    pub fn flat(shape: &[usize], inputs: usize) -> Self {
        let n: usize = shape.iter().product();
        let (dims, st) = if n == 1 {
            (vec![], vec![])
        } else {
            (vec![n], vec![1])
        };
        Broadcast {
            out_shape: shape.to_vec(),
            dims,
            strides: vec![st; inputs],
        }
    }

    pub fn num_elements(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// Calls `f` with each input's element offset for every output element, in order (host
    /// kernels).
    pub fn for_each(&self, mut f: impl FnMut(&[usize])) {
        let mut idx = vec![0usize; self.dims.len()];
        let mut offs = vec![0usize; self.strides.len()];
        for _ in 0..self.num_elements() {
            for (o, st) in offs.iter_mut().zip(&self.strides) {
                *o = idx.iter().zip(st).map(|(i, s)| i * s).sum();
            }
            f(&offs);
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < self.dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// The params words of the dims and strides (`array<vec4<u32>, 2>` each), for shaders
    /// taking at most `MAX_RANK` dimensions.
    pub fn param_words(&self) -> Vec<u32> {
        let mut w = vec![];
        for v in std::iter::once(&self.dims).chain(&self.strides) {
            let mut a8 = [0u32; MAX_RANK];
            for (dst, &src) in a8.iter_mut().zip(v.iter()) {
                *dst = src as u32;
            }
            w.extend_from_slice(&a8);
        }
        w
    }
}

/// What a binary kernel computes for given inputs.
enum Plan {
    /// Elementwise over a broadcast.
    Elementwise(Broadcast),
    /// Equal / NotEqual with `incompatible_shape_error = false` on incompatible shapes: a
    /// scalar bool.
    Constant(bool),
}

/// One binary op (a table row: TensorFlow's name and the operation).
pub(crate) struct Binary {
    name: &'static str,
    op: BinaryOp,
    /// Equal / NotEqual's `incompatible_shape_error` (true for every other op).
    incompatible_shape_error: bool,
    /// LeakyReluGrad's `alpha` (unused by the other ops).
    alpha: f32,
}

impl Binary {
    pub fn new(name: &'static str, op: BinaryOp) -> Self {
        Binary {
            name,
            op,
            incompatible_shape_error: true,
            alpha: 0.0,
        }
    }

    /// LeakyReluGrad, reading `alpha` (default 0.2, as TensorFlow's op definition).
    pub fn build_leaky_relu_grad(attrs: &crate::Attrs) -> Result<Box<dyn Kernel>> {
        let alpha = attrs
            .float_or("alpha", 0.2)
            .map_err(|e| crate::invalid_arg!("LeakyReluGrad: {e}"))?;
        Ok(Box::new(Binary {
            alpha,
            ..Binary::new("LeakyReluGrad", BinaryOp::LeakyReluGrad)
        }))
    }

    /// Equal / NotEqual, reading `incompatible_shape_error` (default true).
    pub fn build_equality(
        name: &'static str,
        op: BinaryOp,
        attrs: &crate::Attrs,
    ) -> Result<Box<dyn Kernel>> {
        let incompatible_shape_error = attrs
            .bool_or("incompatible_shape_error", true)
            .map_err(|e| crate::invalid_arg!("{name}: {e}"))?;
        Ok(Box::new(Binary {
            incompatible_shape_error,
            ..Binary::new(name, op)
        }))
    }

    /// Validates the inputs; returns their dtype and the plan.
    fn check(&self, inputs: &[Operand]) -> Result<(DType, Plan)> {
        let name = self.name;
        if inputs.len() != 2 {
            bail_invalid!("{name} takes 2 inputs, got {}", inputs.len());
        }
        let (ta, tb) = (inputs[0].dtype(), inputs[1].dtype());
        if ta != tb {
            bail_invalid!("{name}: input 0 is {ta} but input 1 is {tb}; both must have one dtype");
        }
        if !self.op.supports(ta) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={ta}"
            )));
        }
        let (sa, sb) = (inputs[0].shape(), inputs[1].shape());
        let bc = match self.op.shapes() {
            Shapes::Broadcast => match Broadcast::new(name, sa, sb) {
                Ok(bc) => bc,
                Err(_) if !self.incompatible_shape_error => {
                    return Ok((ta, Plan::Constant(self.op == BinaryOp::NotEqual)));
                }
                Err(e) => return Err(e),
            },
            Shapes::Same => {
                if sa != sb {
                    bail_invalid!(
                        "Inputs to operation {name} of type {name} must have the same size and \
                         shape.  Input 0: {} != input 1: {}",
                        fmt_shape(sa),
                        fmt_shape(sb)
                    );
                }
                Broadcast::flat(sa, 2)
            }
            Shapes::SameCount => {
                let (na, nb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
                if na != nb {
                    bail_invalid!(
                        "{name}: the two arguments to a cwise op must have same number of \
                         elements, got {na} ({}) and {nb} ({})",
                        fmt_shape(sa),
                        fmt_shape(sb)
                    );
                }
                Broadcast::flat(sa, 2)
            }
        };
        if bc.dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{name}: broadcasting {} with {} needs {} dimensions after merging; at most \
                 {MAX_RANK} are supported",
                fmt_shape(sa),
                fmt_shape(sb),
                bc.dims.len()
            )));
        }
        words_for(name, ta, bc.num_elements())?;
        Ok((ta, Plan::Elementwise(bc)))
    }
}

impl Kernel for Binary {
    fn op(&self) -> &'static str {
        self.name
    }

    /// An input with the output's shape is read at the output's own element index, by the
    /// invocation that writes that element's word, before it writes.
    fn forwardable_inputs(&self) -> &'static [usize] {
        &[0, 1]
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (dtype, plan) = self.check(inputs)?;
        Ok(vec![match plan {
            Plan::Elementwise(bc) => TensorDesc::new(self.op.output_dtype(dtype), &bc.out_shape),
            Plan::Constant(_) => TensorDesc::new(DType::Bool, &[]),
        }])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (dtype, plan) = self.check(inputs)?;
        let out = &outputs[0];
        let bc = match plan {
            Plan::Constant(v) => {
                if out.desc != TensorDesc::new(DType::Bool, &[]) {
                    bail_invalid!(
                        "{}: output is {} {} but the op computes a bool scalar",
                        self.name,
                        out.desc.dtype,
                        fmt_shape(&out.desc.shape)
                    );
                }
                return crate::kernels::fill::fill_bytes(ctx, out.addr, 1, v as u32 * 0x01010101);
            }
            Plan::Elementwise(bc) => bc,
        };
        let out_dtype = self.op.output_dtype(dtype);
        let n = bc.num_elements();
        if n == 0 {
            return Ok(());
        }
        if out.desc.dtype != out_dtype || out.desc.shape != bc.out_shape {
            bail_invalid!(
                "{}: output is {} {} but the op computes {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                out_dtype,
                fmt_shape(&bc.out_shape)
            );
        }
        let a = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let b = ctx.bind(inputs[1].device(self.name, 1)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let op = self.op;
        let multi = multi_word(dtype, out_dtype);
        // float16 in and out: vec4 words of 8 halves.
        let half = dtype == DType::F16 && out_dtype == DType::F16;
        let (hw, suffix) = f16conv::choice(ctx, dtype == DType::F16)?;
        let per = if half { 8 } else { 4 };
        if (multi || half)
            && let Some((ma, mb)) =
                vec4_moduli(&bc, ctx.limits().min_storage_buffer_offset_alignment, per)
        {
            let key = PipelineKey::new(
                "elementwise",
                Some(dtype),
                format!("{}/vec4{suffix}", op.name()),
            );
            let pipeline = ctx.pipeline(key, || {
                crate::kernels::membound_shader(vec4_shader(op, dtype, hw))
            })?;
            let n4 = (n / per) as u32;
            let threads = n4.div_ceil(VEC4_PER_INVOCATION);
            let (groups, row) = grid_1d(threads as u64, WG);
            let w = [
                row,
                n4,
                threads,
                ma,
                mb,
                1.0f32.to_bits(),
                self.alpha.to_bits(),
                0,
            ];
            return ctx.dispatch(&pipeline, &params(&w), &[a, b, o], groups);
        }
        let flat = bc.dims.len() <= 1;
        let key = PipelineKey::new(
            "elementwise",
            Some(dtype),
            format!(
                "{}/{}{}{suffix}",
                op.name(),
                if flat { "flat" } else { "bcast" },
                if multi { "/x4" } else { "" }
            ),
        );
        let pipeline = ctx.pipeline(key, || {
            crate::kernels::membound_shader(shader(op, dtype, flat, multi, hw))
        })?;
        let words = words_for(self.name, out_dtype, n)?;
        let threads = if multi { words.div_ceil(4) } else { words };
        let (groups, row) = grid_1d(threads as u64, WG);
        let mut w = vec![
            row,
            n as u32,
            bc.dims.len() as u32,
            words,
            1.0f32.to_bits(),
            self.alpha.to_bits(),
            threads,
            0,
        ];
        w.extend(bc.param_words());
        ctx.dispatch(&pipeline, &params(&w), &[a, b, o], groups)
    }
}

const OFFSETS_FLAT: &str = "    return vec2<u32>(e * p.sa[0].x, e * p.sb[0].x);";

// The coordinates of element e, innermost dimension first; the outermost needs no division
// (e < p.n, so what is left is its coordinate): one div/mod pair per element fewer.
const OFFSETS_BCAST: &str = "    var rem = e;
    var ia = 0u;
    var ib = 0u;
    for (var d = p.rank; d > 1u; d = d - 1u) {
        let k = d - 1u;
        let dim = p.shape[k / 4u][k % 4u];
        let c = rem % dim;
        rem = rem / dim;
        ia = ia + c * p.sa[k / 4u][k % 4u];
        ib = ib + c * p.sb[k / 4u][k % 4u];
    }
    return vec2<u32>(ia + rem * p.sa[0].x, ib + rem * p.sb[0].x);";

/// Whether the 4-words-per-invocation variant applies: 32-bit input and output elements (one
/// element per word). One word per invocation left each invocation one load in flight and
/// launched a workgroup per 256 words; on the H200 that ran at a fraction of the copy
/// bandwidth (bench/NOTES-membound.md).
fn multi_word(dtype: DType, out_dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::I32) && matches!(out_dtype, DType::F32 | DType::I32)
}

/// The store of the 4-words variant: the four results first (their loads can all be in
/// flight: out may share a buffer with a and b, so a store would order the loads after it),
/// then the four stores. Invocations past p.stride (the last row of a 2-D grid) return: their
/// words belong to other invocations, which may write them in place over an input.
const STORE_X4: &str = "    if w >= p.stride {
        return;
    }
    let w1 = w + p.stride;
    let w2 = w1 + p.stride;
    let w3 = w2 + p.stride;
    let r0 = elem(w);
    var r1: $TOUT;
    var r2: $TOUT;
    var r3: $TOUT;
    if w1 < p.words {
        r1 = elem(w1);
    }
    if w2 < p.words {
        r2 = elem(w2);
    }
    if w3 < p.words {
        r3 = elem(w3);
    }
    out[w] = bitcast<u32>(r0);
    if w1 < p.words {
        out[w1] = bitcast<u32>(r1);
    }
    if w2 < p.words {
        out[w2] = bitcast<u32>(r2);
    }
    if w3 < p.words {
        out[w3] = bitcast<u32>(r3);
    }";

/// vec4 loads and stores (`VEC4_WGSL`) of `per` elements each (4 for 32-bit dtypes, 8 for
/// float16) when every operand is either the output's shape or a row vector repeated over
/// the rows of a [rows, cols] output, with cols (and so the element count) a multiple of
/// `per` and bindings 16-byte aligned: the vec4 index of an operand is the output's modulo
/// (ma, mb) (the output's vec4 count for a full operand, cols / per for a row vector). None
/// otherwise (a scalar operand, other broadcasts).
fn vec4_moduli(bc: &Broadcast, align: u32, per: usize) -> Option<(u32, u32)> {
    if !align.is_multiple_of(16) {
        return None;
    }
    let n = bc.num_elements();
    let cols = *bc.dims.last()?;
    if !cols.is_multiple_of(per) || bc.dims.len() > 2 || n / per > u32::MAX as usize {
        return None;
    }
    let modulus = |st: &[usize]| -> Option<u32> {
        match st {
            [1] => Some((n / per) as u32),
            [s, 1] if *s == cols => Some((n / per) as u32),
            [0, 1] => Some((cols / per) as u32),
            _ => None,
        }
    };
    Some((modulus(&bc.strides[0])?, modulus(&bc.strides[1])?))
}

/// `op4` of `VEC4_WGSL` for 32-bit dtypes: four elements per vec4.
const OP4_32: &str = "fn op4(x: vec4<u32>, y: vec4<u32>) -> vec4<u32> {
    return vec4<u32>(
        bitcast<u32>(op(bitcast<$T>(x.x), bitcast<$T>(y.x))),
        bitcast<u32>(op(bitcast<$T>(x.y), bitcast<$T>(y.y))),
        bitcast<u32>(op(bitcast<$T>(x.z), bitcast<$T>(y.z))),
        bitcast<u32>(op(bitcast<$T>(x.w), bitcast<$T>(y.w))),
    );
}";

/// `op4` of `VEC4_WGSL` for float16: eight halves per vec4, widened and rounded in pairs
/// (`f16conv`'s pair conversions).
const OP4_F16: &str = "fn op2(x: u32, y: u32) -> u32 {
    let a = f16x2_to_f32(x);
    let b = f16x2_to_f32(y);
    return f32x2_to_f16(vec2<f32>(op(a.x, b.x), op(a.y, b.y)));
}

fn op4(x: vec4<u32>, y: vec4<u32>) -> vec4<u32> {
    return vec4<u32>(op2(x.x, y.x), op2(x.y, y.y), op2(x.z, y.z), op2(x.w, y.w));
}";

/// vec4 loads per invocation of `VEC4_WGSL` (p.stride apart, all loads before the stores).
const VEC4_PER_INVOCATION: u32 = 2;

/// A binary op on 32-bit dtypes, four elements per load (see `vec4_moduli`), two vec4 per
/// invocation p.stride apart with both loads issued before either result is stored (out
/// may be one of the inputs).
const VEC4_WGSL: &str = "struct Params {
    row: u32,
    n4: u32,
    stride: u32,
    ma: u32,
    mb: u32,
    one: u32,
    alpha: u32,
    pad0: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<u32>>;

$LINEAR_INDEX
$COMMON

fn opaque(v: f32) -> f32 {
    return v * bitcast<f32>(p.one);
}

fn rt(v: f32) -> f32 {
    return $RT;
}

fn alpha() -> f32 {
    return rt(bitcast<f32>(p.alpha));
}

$EXTRA

fn op(x: $T, y: $T) -> $TOUT {
$OP
}

$OP4

fn index(i: u32, m: u32) -> u32 {
    if m == p.n4 {
        return i;
    }
    return i % m;
}

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i0 = linear_index(gid);
    if i0 >= p.stride {
        return;
    }
    let i1 = i0 + p.stride;
    let a0 = a[index(i0, p.ma)];
    let b0 = b[index(i0, p.mb)];
    var a1 = vec4<u32>();
    var b1 = vec4<u32>();
    if i1 < p.n4 {
        a1 = a[index(i1, p.ma)];
        b1 = b[index(i1, p.mb)];
    }
    let r0 = op4(a0, b0);
    let r1 = op4(a1, b1);
    out[i0] = r0;
    if i1 < p.n4 {
        out[i1] = r1;
    }
}
";

fn vec4_shader(op: BinaryOp, dtype: DType, hw: bool) -> String {
    let (math, pow) = op.math();
    let float = dtype.is_float();
    let mut extra = String::new();
    if float && math {
        extra.push_str(MATH_WGSL);
    }
    if float && pow {
        extra.push_str(POW_WGSL);
    }
    if op == BinaryOp::SeluGrad {
        extra.push_str(&super::unary::selu_consts());
    }
    let half = dtype == DType::F16;
    if half {
        extra.push_str(f16conv::f16x2_wgsl(hw));
    }
    VEC4_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace("$EXTRA", &extra)
        .replace("$OP4", if half { OP4_F16 } else { OP4_32 })
        .replace("$RT", &f16conv::routed(rt_expr(dtype)))
        .replace("$OP", op.wgsl(dtype))
        .replace("$TOUT", compute_type(op.output_dtype(dtype)))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}

/// The word-per-invocation shader; float16 converts through `f16conv`'s one-half forms
/// (`hw`: the hardware ones).
fn shader(op: BinaryOp, dtype: DType, flat: bool, multi: bool, hw: bool) -> String {
    let float = dtype.is_float();
    let (math, pow) = op.math();
    let mut extra = String::new();
    if float && math {
        extra.push_str(MATH_WGSL);
    }
    if float && pow {
        extra.push_str(POW_WGSL);
    }
    if dtype == DType::I64 {
        extra.push_str(INT64_WGSL);
    }
    if op == BinaryOp::SeluGrad {
        extra.push_str(&super::unary::selu_consts());
    }
    if dtype == DType::F16 {
        extra.push_str(f16conv::f16x2_wgsl(hw));
    }
    BINARY_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace("$EXTRA", &extra)
        .replace("$OFFSETS", if flat { OFFSETS_FLAT } else { OFFSETS_BCAST })
        .replace("$LOAD_A", &f16conv::routed(&load_expr(dtype, "a")))
        .replace("$LOAD_B", &f16conv::routed(&load_expr(dtype, "b")))
        .replace("$OP", op.wgsl(dtype))
        .replace(
            "$STORE",
            &if multi {
                STORE_X4.to_string()
            } else {
                f16conv::routed(store_stmt(op.output_dtype(dtype)))
            },
        )
        .replace("$RT", &f16conv::routed(rt_expr(dtype)))
        .replace("$TOUT", compute_type(op.output_dtype(dtype)))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}

/// Broadcast reads of several inputs over `out`: drops size-1 dimensions and merges a dimension
/// into the previous one when every input steps over it exactly (contiguously or not at all).
/// `full[i][d]` is input i's element stride along dimension d of `out` (0 where it broadcasts).
/// Returns the merged dimensions and each input's strides along them.
pub(crate) fn merge_dims(out: &[usize], full: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut dims: Vec<usize> = vec![];
    let mut strides: Vec<Vec<usize>> = vec![vec![]; full.len()];
    for (d, &n) in out.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let mergeable = !dims.is_empty()
            && strides
                .iter()
                .zip(full)
                .all(|(st, f)| *st.last().expect("same length") == f[d] * n);
        if mergeable {
            *dims.last_mut().expect("nonempty") *= n;
            for (st, f) in strides.iter_mut().zip(full) {
                *st.last_mut().expect("nonempty") = f[d];
            }
            continue;
        }
        dims.push(n);
        for (st, f) in strides.iter_mut().zip(full) {
            st.push(f[d]);
        }
    }
    (dims, strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_merges_dimensions() {
        let parts = |bc: Broadcast| (bc.dims, bc.strides[0].clone(), bc.strides[1].clone());
        let bc = Broadcast::new("AddV2", &[2, 3, 4], &[2, 3, 4]).unwrap();
        assert_eq!(parts(bc), (vec![24], vec![1], vec![1]));
        let bc = Broadcast::new("AddV2", &[], &[5]).unwrap();
        assert_eq!(parts(bc), (vec![5], vec![0], vec![1]));
        let bc = Broadcast::new("AddV2", &[3, 1], &[1, 4]).unwrap();
        assert_eq!(bc.out_shape, vec![3, 4]);
        assert_eq!(parts(bc), (vec![3, 4], vec![1, 0], vec![0, 1]));
        let bc = Broadcast::new("AddV2", &[2, 1, 3], &[4, 1]).unwrap();
        assert_eq!(bc.out_shape, vec![2, 4, 3]);
        assert_eq!(parts(bc), (vec![2, 4, 3], vec![3, 0, 1], vec![0, 1, 0]));
        // [6,5,4] with [5,4]: the last two dims merge.
        let bc = Broadcast::new("AddV2", &[6, 5, 4], &[5, 4]).unwrap();
        assert_eq!(parts(bc), (vec![6, 20], vec![20, 1], vec![0, 1]));
        // Three shapes.
        let bc = Broadcast::of(&[&[2, 1], &[3], &[]]).unwrap();
        assert_eq!(bc.out_shape, vec![2, 3]);
        assert_eq!(bc.dims, vec![2, 3]);
        assert_eq!(bc.strides, vec![vec![1, 0], vec![0, 1], vec![0, 0]]);
        let bc = Broadcast::of(&[&[4, 5], &[4, 5], &[4, 5]]).unwrap();
        assert_eq!((bc.dims, bc.strides), (vec![20], vec![vec![1]; 3]));
        assert!(Broadcast::of(&[&[2], &[3], &[1]]).is_none());
        assert_eq!(Broadcast::of(&[&[0], &[1]]).unwrap().out_shape, vec![0]);
        assert!(Broadcast::of(&[&[0], &[2]]).is_none());
        let e = Broadcast::new("AddV2", &[2, 3], &[4]).unwrap_err();
        assert_eq!(e.to_string(), "AddV2: incompatible shapes [2,3] and [4]");
    }
}
