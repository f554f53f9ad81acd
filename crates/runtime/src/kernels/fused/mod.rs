//! Fused elementwise family: `_TfwgpuFusedElementwise`, one kernel for a group of elementwise
//! ops that the plugin's graph pass (crates/plugin/src/graph/fusion.rs) found chained on one
//! device, so that a chain of k ops costs one dispatch and one pass over memory instead of k.
//!
//! Attributes: `T` (f32 or f16), `N` (the number of inputs, at most [`MAX_INPUTS`]) and
//! `program`, the group as instructions separated by `;`, each `Op(arg,arg)` with a TensorFlow
//! op name ([`FUSIBLE`]) and arguments `iK` (input K) or `tK` (the result of instruction K,
//! an earlier one); the last instruction's result is the output, and every other instruction's
//! result is used by a later one. Example, Adam's update of a variable:
//! `Mul(i0,i1);Sqrt(i2);AddV2(t1,i3);RealDiv(t0,t2);Sub(i4,t3)`.
//!
//! Shapes: each instruction broadcasts its operands as the op does in TensorFlow (NumPy
//! broadcasting for the binary ops; BiasAdd: a value of rank >= 2 and a bias of its last
//! dimension's size), so the output has the op's shape and every input broadcasts to it. The
//! shader computes each output element once, reading every input at its broadcast offset
//! (dimensions merged as the elementwise family does; at most 8 after merging).
//!
//! Numerics: the bodies are the elementwise family's expressions (its f32 math functions,
//! Maximum/Minimum on integer keys with NaN propagation, Relu(NaN) = NaN, f16 computed in f32),
//! and every instruction's result is rounded to the dtype (f16) and passed through an
//! integer XOR with a zero the compiler cannot see, so no product is contracted with a later
//! sum into an FMA, or otherwise reassociated, across instructions: the result is bit for bit
//! what the unfused kernels give on the same driver.
//!
//! The pipeline key names the program (op names and argument wiring) and whether the
//! broadcast is flat; shapes and strides travel in the params.

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{
    BinaryOp, COMMON_WGSL, MATH_WGSL, bind_out, fmt_shape, load_expr, rt_expr, store_stmt,
    words_for,
};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Error, Result, bail_invalid, invalid_arg};

/// TensorFlow's name of the fused op (registered by the plugin).
pub const OP: &str = "_TfwgpuFusedElementwise";

/// The same kernel under the name the plugin gives groups holding a Tile (a broadcast that can
/// make the output larger than every input), whose shape function leaves the shape unknown.
pub const OP_TILED: &str = "_TfwgpuFusedElementwiseTiled";

/// The same kernel with several outputs (`M` of them): output 0 is the last instruction's
/// result, output k (k >= 1) the result of instruction `exports[k - 1]` (a group whose
/// intermediate values are also used outside it: batch-norm statistics, an optimizer's new
/// state that is both assigned and applied). Each output has its own shape. Outputs of the
/// last instruction's shape are written by the same invocations, in one dispatch; outputs of
/// another shape take one more dispatch per shape, which computes only the instructions they
/// depend on.
pub const OP_MULTI: &str = "_TfwgpuFusedElementwiseMulti";

/// A float32 reduction of a program's result, computed as it is loaded (see [`reduce`]).
pub const OP_REDUCE: &str = "_TfwgpuFusedReduce";

/// The same kernel with more outputs: values of the program also used elsewhere.
pub const OP_REDUCE_MULTI: &str = "_TfwgpuFusedReduceMulti";

pub mod bias;
mod reduce;

/// The elementwise family's f32 pow (needs `opaque`).
const POW_WGSL: &str = include_str!("../elementwise/pow.wgsl");

/// Most inputs of one fused node (16 storage bindings with the output). An adapter may offer
/// fewer (WebGPU guarantees 8 per shader stage): [`max_inputs`] is the bound for a device.
pub const MAX_INPUTS: usize = 15;

/// Most inputs of one fused node on a device with `limits` (at least 7: every WebGPU adapter
/// has 8 storage bindings per stage).
pub fn max_inputs(limits: &wgpu::Limits) -> usize {
    (limits.max_storage_buffers_per_shader_stage as usize)
        .saturating_sub(1)
        .clamp(7, MAX_INPUTS)
}

/// Most instructions of one program.
pub const MAX_INSTRUCTIONS: usize = 64;

/// Most dimensions of the broadcast after merging.
const MAX_RANK: usize = 8;

const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: OP,
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: Fused::build,
    },
    OpDef {
        op: OP_TILED,
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: Fused::build,
    },
    OpDef {
        op: OP_MULTI,
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: Fused::build,
    },
    OpDef {
        op: OP_REDUCE,
        type_attr: "T",
        dtypes: &[DType::F32],
        host_inputs: &[(0, "reduction_indices")],
        factory: reduce::FusedReduce::build,
    },
    OpDef {
        op: OP_REDUCE_MULTI,
        type_attr: "T",
        dtypes: &[DType::F32],
        host_inputs: &[(0, "reduction_indices")],
        factory: reduce::FusedReduce::build,
    },
];

/// The operations a program may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    SquaredDifference,
    Pow,
    /// value + bias over the last axis.
    BiasAdd,
    Neg,
    Abs,
    Relu,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Square,
    Tanh,
    Sigmoid,
    Reciprocal,
    Softplus,
    Log1p,
    Expm1,
    /// gradients * (features > 0), equal shapes.
    ReluGrad,
    /// The gradient of Rsqrt from its result y and dy, equal shapes (TensorFlow's rule).
    RsqrtGrad,
    /// The gradients of Sigmoid and Tanh from their result y and dy, equal shapes (the
    /// elementwise family's association).
    SigmoidGrad,
    TanhGrad,
    /// A Tile whose input has size 1 on every tiled dimension: a broadcast to the tiled shape.
    Tile,
    /// x / y, 0 where y is 0 (either sign).
    DivNoNan,
    /// The comparisons: a bool held in the program (1.0 or 0.0), only ever SelectV2's
    /// condition; false where either side is NaN (NotEqual: true).
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    /// condition ? then : else, the condition a comparison of the program.
    SelectV2,
}

/// The TensorFlow ops a program may hold (float `T`; BiasAdd with `data_format` NHWC).
pub const FUSIBLE: &[(&str, FusedOp)] = &[
    ("AddV2", FusedOp::Add),
    ("Add", FusedOp::Add),
    ("Sub", FusedOp::Sub),
    ("Mul", FusedOp::Mul),
    ("RealDiv", FusedOp::Div),
    ("Div", FusedOp::Div),
    ("Maximum", FusedOp::Maximum),
    ("Minimum", FusedOp::Minimum),
    ("SquaredDifference", FusedOp::SquaredDifference),
    ("Pow", FusedOp::Pow),
    ("BiasAdd", FusedOp::BiasAdd),
    ("Neg", FusedOp::Neg),
    ("Abs", FusedOp::Abs),
    ("Relu", FusedOp::Relu),
    ("Exp", FusedOp::Exp),
    ("Log", FusedOp::Log),
    ("Sqrt", FusedOp::Sqrt),
    ("Rsqrt", FusedOp::Rsqrt),
    ("Square", FusedOp::Square),
    ("Tanh", FusedOp::Tanh),
    ("Sigmoid", FusedOp::Sigmoid),
    ("Reciprocal", FusedOp::Reciprocal),
    ("Softplus", FusedOp::Softplus),
    ("Log1p", FusedOp::Log1p),
    ("Expm1", FusedOp::Expm1),
    ("ReluGrad", FusedOp::ReluGrad),
    ("RsqrtGrad", FusedOp::RsqrtGrad),
    ("SigmoidGrad", FusedOp::SigmoidGrad),
    ("TanhGrad", FusedOp::TanhGrad),
    ("Tile", FusedOp::Tile),
    ("DivNoNan", FusedOp::DivNoNan),
    ("Equal", FusedOp::Equal),
    ("NotEqual", FusedOp::NotEqual),
    ("Less", FusedOp::Less),
    ("LessEqual", FusedOp::LessEqual),
    ("Greater", FusedOp::Greater),
    ("GreaterEqual", FusedOp::GreaterEqual),
    ("SelectV2", FusedOp::SelectV2),
];

/// Whether a fusible TensorFlow op is a comparison (its bool result lives only inside a
/// program, as a SelectV2's condition: it never roots a group).
pub fn is_predicate(tf_op: &str) -> bool {
    FUSIBLE
        .iter()
        .any(|(n, op)| *n == tf_op && op.is_predicate())
}

/// The number of inputs of a fusible TensorFlow op; `None` for an op programs cannot hold.
pub fn fusible_arity(tf_op: &str) -> Option<usize> {
    FUSIBLE
        .iter()
        .find(|(n, _)| *n == tf_op)
        .map(|(_, op)| op.arity())
}

/// Whether programs handle `dtype`.
pub fn fusible_dtype(dtype: DType) -> bool {
    DTYPES.contains(&dtype)
}

impl FusedOp {
    pub fn arity(self) -> usize {
        use FusedOp::*;
        match self {
            Add | Sub | Mul | Div | Maximum | Minimum | SquaredDifference | Pow | BiasAdd
            | ReluGrad | RsqrtGrad | SigmoidGrad | TanhGrad | DivNoNan | Equal | NotEqual
            | Less | LessEqual | Greater | GreaterEqual => 2,
            SelectV2 => 3,
            _ => 1,
        }
    }

    /// A comparison: its result is a bool (1.0 or 0.0 in the program), SelectV2's condition.
    pub fn is_predicate(self) -> bool {
        use FusedOp::*;
        matches!(
            self,
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual
        )
    }

    /// The body of `fn opK(x: f32[, y: f32]) -> f32`, as the elementwise family computes
    /// the op (`rt` rounds an intermediate result to the dtype where Eigen's half does).
    fn wgsl(self) -> &'static str {
        use FusedOp::*;
        match self {
            // The binary ops: the elementwise family's float bodies, the same text.
            Add | BiasAdd => BinaryOp::Add.wgsl_float(),
            Sub => BinaryOp::Sub.wgsl_float(),
            Mul => BinaryOp::Mul.wgsl_float(),
            Div => BinaryOp::RealDiv.wgsl_float(),
            Maximum => BinaryOp::Maximum.wgsl_float(),
            Minimum => BinaryOp::Minimum.wgsl_float(),
            SquaredDifference => BinaryOp::SquaredDifference.wgsl_float(),
            Pow => BinaryOp::Pow.wgsl_float(),
            ReluGrad => BinaryOp::ReluGrad.wgsl_float(),
            RsqrtGrad => BinaryOp::RsqrtGrad.wgsl_float(),
            SigmoidGrad => BinaryOp::SigmoidGrad.wgsl_float(),
            TanhGrad => BinaryOp::TanhGrad.wgsl_float(),
            DivNoNan => BinaryOp::DivNoNan.wgsl_float(),
            Neg => "    return bitcast<f32>(bitcast<u32>(x) ^ 0x80000000u);",
            Abs => "    return bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu);",
            Relu => "    return relu_f32(x);",
            Exp => "    return exp_f32(x);",
            Log => "    return log_f32(x);",
            Sqrt => "    return sqrt_f32(x);",
            Rsqrt => "    return rsqrt_f32(x);",
            Square => "    return x * x;",
            Tanh => "    return tanh_f32(x);",
            Sigmoid => "    return sigmoid_f32(x);",
            Reciprocal => "    return 1.0 / x;",
            Softplus => "    return softplus_f32(x);",
            Log1p => "    return log1p_f32(x);",
            Expm1 => "    return expm1_f32(x);",
            // The broadcast is in the reads.
            Tile => "    return x;",
            // As the elementwise family's comparisons, on bit patterns (NaN is false).
            Equal => {
                "    return select(0.0, 1.0, !is_nan(x) && !is_nan(y) && !f32_less(x, y) && !f32_less(y, x));"
            }
            NotEqual => {
                "    return select(0.0, 1.0, is_nan(x) || is_nan(y) || f32_less(x, y) || f32_less(y, x));"
            }
            Less => "    return select(0.0, 1.0, !is_nan(x) && !is_nan(y) && f32_less(x, y));",
            LessEqual => {
                "    return select(0.0, 1.0, !is_nan(x) && !is_nan(y) && !f32_less(y, x));"
            }
            Greater => "    return select(0.0, 1.0, !is_nan(x) && !is_nan(y) && f32_less(y, x));",
            GreaterEqual => {
                "    return select(0.0, 1.0, !is_nan(x) && !is_nan(y) && !f32_less(x, y));"
            }
            // The value moves as bits (NaN payloads and -0 kept).
            SelectV2 => {
                "    return bitcast<f32>(select(bitcast<u32>(z), bitcast<u32>(y), bitcast<u32>(x) != 0u));"
            }
        }
    }
}

/// An instruction's argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Input(usize),
    Temp(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    /// TensorFlow's op name (for messages).
    pub name: &'static str,
    pub op: FusedOp,
    pub args: Vec<Arg>,
    /// Tile's multiples (empty for every other op).
    pub multiples: Vec<usize>,
}

/// A parsed, validated program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    pub inputs: usize,
    pub instrs: Vec<Instr>,
    /// The instructions whose results are outputs 1.. (output 0 is the last instruction's).
    pub exports: Vec<usize>,
}

impl Program {
    /// Parses and validates `text` for `inputs` inputs (one output).
    pub fn parse(text: &str, inputs: usize) -> Result<Program> {
        Program::parse_multi(text, inputs, &[])
    }

    /// Parses and validates `text` for `inputs` inputs, with the results of instructions
    /// `exports` as outputs 1.. (each an instruction before the last, at most once).
    pub fn parse_multi(text: &str, inputs: usize, exports: &[usize]) -> Result<Program> {
        if inputs == 0 || inputs > MAX_INPUTS {
            bail_invalid!("{OP}: N = {inputs}; 1 to {MAX_INPUTS} inputs are supported");
        }
        let mut instrs: Vec<Instr> = vec![];
        for (k, part) in text.split(';').enumerate() {
            let bad =
                || invalid_arg!("{OP}: instruction {k} of the program is malformed: {part:?}");
            let (head, rest) = part.split_once('(').ok_or_else(bad)?;
            let args = rest.strip_suffix(')').ok_or_else(bad)?;
            // `Tile[m0xm1x...]`: the multiples travel in the instruction.
            let (name, multiples) = match head.split_once('[') {
                Some((n, m)) => {
                    let m = m.strip_suffix(']').ok_or_else(bad)?;
                    let m: Vec<usize> = m
                        .split('x')
                        .map(|v| v.parse().map_err(|_| bad()))
                        .collect::<Result<_>>()?;
                    (n, Some(m))
                }
                None => (head, None),
            };
            let (name, op) = FUSIBLE
                .iter()
                .find(|(n, _)| *n == name)
                .copied()
                .ok_or_else(|| invalid_arg!("{OP}: instruction {k}: no fusible op {name:?}"))?;
            let args: Vec<Arg> = args
                .split(',')
                .map(|a| {
                    let (kind, idx) = a.split_at_checked(1).ok_or_else(bad)?;
                    let idx: usize = idx.parse().map_err(|_| bad())?;
                    match kind {
                        "i" if idx < inputs => Ok(Arg::Input(idx)),
                        "t" if idx < k => Ok(Arg::Temp(idx)),
                        _ => Err(invalid_arg!(
                            "{OP}: instruction {k} ({name}) refers to {a}, which is not an \
                             input or an earlier result"
                        )),
                    }
                })
                .collect::<Result<_>>()?;
            if args.len() != op.arity() {
                bail_invalid!(
                    "{OP}: instruction {k}: {name} takes {} arguments, got {}",
                    op.arity(),
                    args.len()
                );
            }
            let multiples = match (op, multiples) {
                (FusedOp::Tile, Some(m)) => m,
                (FusedOp::Tile, None) => bail_invalid!(
                    "{OP}: instruction {k}: Tile needs its multiples, as Tile[m0xm1x..](arg)"
                ),
                (_, Some(_)) => {
                    bail_invalid!("{OP}: instruction {k}: {name} takes no bracketed values")
                }
                (_, None) => vec![],
            };
            instrs.push(Instr {
                name,
                op,
                args,
                multiples,
            });
        }
        if instrs.len() > MAX_INSTRUCTIONS {
            bail_invalid!(
                "{OP}: {} instructions; at most {MAX_INSTRUCTIONS} are supported",
                instrs.len()
            );
        }
        let last = instrs.len() - 1;
        if inputs + 1 + exports.len() > MAX_INPUTS + 1 {
            bail_invalid!(
                "{OP}: {inputs} inputs and {} outputs; at most {} tensors are supported",
                exports.len() + 1,
                MAX_INPUTS + 1
            );
        }
        for (j, &e) in exports.iter().enumerate() {
            if e >= last || exports[..j].contains(&e) {
                bail_invalid!(
                    "{OP}: output {} exports instruction {e}: outputs must be distinct \
                     instructions before the last ({last})",
                    j + 1
                );
            }
        }
        for k in 0..last {
            let used = instrs[k + 1..]
                .iter()
                .any(|i| i.args.contains(&Arg::Temp(k)));
            if !used && !exports.contains(&k) {
                bail_invalid!("{OP}: the result of instruction {k} is never used");
            }
        }
        // A comparison's bool is only ever a SelectV2's condition (never an output, an input
        // of another op or a SelectV2's value), and a SelectV2's condition is a comparison.
        for (k, ins) in instrs.iter().enumerate() {
            if ins.op.is_predicate() && (k == last || exports.contains(&k)) {
                bail_invalid!(
                    "{OP}: instruction {k} ({}) is a comparison, whose bool result can only be \
                     a SelectV2's condition, not an output",
                    ins.name
                );
            }
            for (j, a) in ins.args.iter().enumerate() {
                let pred = matches!(*a, Arg::Temp(t) if instrs[t].op.is_predicate());
                let cond = ins.op == FusedOp::SelectV2 && j == 0;
                if pred != cond {
                    bail_invalid!(
                        "{OP}: instruction {k} ({}): argument {j} {}",
                        ins.name,
                        if cond {
                            "(the condition) must be the result of a comparison"
                        } else {
                            "is a comparison's bool, which only a SelectV2's condition takes"
                        }
                    );
                }
            }
        }
        Ok(Program {
            inputs,
            instrs,
            exports: exports.to_vec(),
        })
    }

    /// The instruction computing each output (output 0: the last one).
    pub fn output_instrs(&self) -> Vec<usize> {
        std::iter::once(self.instrs.len() - 1)
            .chain(self.exports.iter().copied())
            .collect()
    }

    /// The program that computes only the results of instructions `values` (the last of them
    /// its output 0, the others exported in the given order): the instructions they depend
    /// on, renumbered, reading only the inputs they use; and for each of its inputs, the
    /// index of that input in this program.
    pub fn restrict(&self, values: &[usize]) -> (Program, Vec<usize>) {
        let mut needed = vec![false; self.instrs.len()];
        for &v in values {
            needed[v] = true;
        }
        for k in (0..self.instrs.len()).rev() {
            if needed[k] {
                for a in &self.instrs[k].args {
                    if let Arg::Temp(t) = *a {
                        needed[t] = true;
                    }
                }
            }
        }
        let mut temp_map = vec![usize::MAX; self.instrs.len()];
        let mut input_map: Vec<usize> = vec![];
        let mut instrs = vec![];
        for (k, ins) in self.instrs.iter().enumerate() {
            if !needed[k] {
                continue;
            }
            let args = ins
                .args
                .iter()
                .map(|a| match *a {
                    Arg::Temp(t) => Arg::Temp(temp_map[t]),
                    Arg::Input(i) => Arg::Input(match input_map.iter().position(|&x| x == i) {
                        Some(j) => j,
                        None => {
                            input_map.push(i);
                            input_map.len() - 1
                        }
                    }),
                })
                .collect();
            temp_map[k] = instrs.len();
            instrs.push(Instr {
                args,
                ..ins.clone()
            });
        }
        let root = *values.iter().max().expect("a value to compute");
        let exports = values
            .iter()
            .filter(|&&v| v != root)
            .map(|&v| temp_map[v])
            .collect();
        (
            Program {
                inputs: input_map.len(),
                instrs,
                exports,
            },
            input_map,
        )
    }

    /// The program's text (what `parse` reads).
    pub fn text(&self) -> String {
        self.render(true)
    }

    /// The text with or without Tile's multiples (which the shader does not depend on: they
    /// shape the output, and the broadcast is in the reads' strides).
    fn render(&self, multiples: bool) -> String {
        let parts: Vec<String> = self
            .instrs
            .iter()
            .map(|i| {
                let name = if multiples && i.op == FusedOp::Tile {
                    let m: Vec<String> = i.multiples.iter().map(|m| m.to_string()).collect();
                    format!("{}[{}]", i.name, m.join("x"))
                } else {
                    i.name.to_string()
                };
                let args: Vec<String> = i
                    .args
                    .iter()
                    .map(|a| match a {
                        Arg::Input(k) => format!("i{k}"),
                        Arg::Temp(k) => format!("t{k}"),
                    })
                    .collect();
                format!("{name}({})", args.join(","))
            })
            .collect();
        parts.join(";")
    }

    /// The output shape for inputs of `shapes`: each instruction's shape as its op defines
    /// it; errors name the instruction's op and the shapes.
    pub fn output_shape(&self, shapes: &[&[usize]]) -> Result<Vec<usize>> {
        let mut temps = self.temp_shapes(shapes)?;
        Ok(temps.pop().expect("a program has an instruction"))
    }

    /// The shape of every instruction's result for inputs of `shapes`.
    pub fn temp_shapes(&self, shapes: &[&[usize]]) -> Result<Vec<Vec<usize>>> {
        let mut temps: Vec<Vec<usize>> = Vec::with_capacity(self.instrs.len());
        for (k, ins) in self.instrs.iter().enumerate() {
            let shape_of = |a: &Arg| -> Vec<usize> {
                match *a {
                    Arg::Input(i) => shapes[i].to_vec(),
                    Arg::Temp(t) => temps[t].clone(),
                }
            };
            let s = match ins.op {
                FusedOp::BiasAdd => {
                    let (v, b) = (shape_of(&ins.args[0]), shape_of(&ins.args[1]));
                    if v.len() < 2 {
                        bail_invalid!(
                            "{OP}: instruction {k}: BiasAdd: Input tensor must be at least 2D: \
                             {}",
                            fmt_shape(&v)
                        );
                    }
                    if b.len() != 1 || b[0] != v[v.len() - 1] {
                        bail_invalid!(
                            "{OP}: instruction {k}: BiasAdd: Must provide as many biases as the \
                             last dimension of the input tensor: {} vs. {}",
                            fmt_shape(&b),
                            fmt_shape(&v)
                        );
                    }
                    v
                }
                FusedOp::ReluGrad
                | FusedOp::RsqrtGrad
                | FusedOp::SigmoidGrad
                | FusedOp::TanhGrad => {
                    let (a, b) = (shape_of(&ins.args[0]), shape_of(&ins.args[1]));
                    if a != b {
                        let what = if ins.op == FusedOp::ReluGrad {
                            "gradients and features"
                        } else {
                            "y and dy"
                        };
                        bail_invalid!(
                            "{OP}: instruction {k}: {}: {what} must have the same shape: {} \
                             vs. {}",
                            ins.name,
                            fmt_shape(&a),
                            fmt_shape(&b)
                        );
                    }
                    a
                }
                FusedOp::Tile => {
                    let x = shape_of(&ins.args[0]);
                    let m = &ins.multiples;
                    if x.len() != m.len() {
                        bail_invalid!(
                            "{OP}: instruction {k}: Tile: Expected multiples argument to be a \
                             vector of length {} but got length {}",
                            x.len(),
                            m.len()
                        );
                    }
                    x.iter().zip(m).map(|(&a, &b)| a * b).collect()
                }
                FusedOp::SelectV2 => {
                    let (c, t, e) = (
                        shape_of(&ins.args[0]),
                        shape_of(&ins.args[1]),
                        shape_of(&ins.args[2]),
                    );
                    broadcast2(&c, &t)
                        .and_then(|ct| broadcast2(&ct, &e))
                        .ok_or_else(|| {
                            invalid_arg!(
                                "{OP}: instruction {k}: SelectV2: condition {}, then {} and else \
                                 {} do not broadcast",
                                fmt_shape(&c),
                                fmt_shape(&t),
                                fmt_shape(&e)
                            )
                        })?
                }
                _ if ins.args.len() == 2 => {
                    let (a, b) = (shape_of(&ins.args[0]), shape_of(&ins.args[1]));
                    broadcast2(&a, &b).ok_or_else(|| {
                        invalid_arg!(
                            "{OP}: instruction {k}: {}: incompatible shapes {} and {}",
                            ins.name,
                            fmt_shape(&a),
                            fmt_shape(&b)
                        )
                    })?
                }
                _ => shape_of(&ins.args[0]),
            };
            temps.push(s);
        }
        Ok(temps)
    }

    /// Which instructions compute a single value (all their operands are one-element inputs
    /// or such instructions) when the output has more than one element; the shader computes
    /// those once per workgroup instead of once per element (Adam's bias corrections, two
    /// `Pow` per variable, would otherwise run for every element of the variable).
    pub fn uniform_instrs(&self, shapes: &[&[usize]], out_elements: usize) -> Vec<bool> {
        let mut uniform: Vec<bool> = Vec::with_capacity(self.instrs.len());
        for ins in &self.instrs {
            let u = out_elements > 1
                && ins.args.iter().all(|a| match *a {
                    Arg::Input(i) => shapes[i].iter().product::<usize>() == 1,
                    Arg::Temp(t) => uniform[t],
                });
            uniform.push(u);
        }
        uniform
    }

    /// The WGSL of the program: `flat` when every input is read at `e * stride`; `uniform`
    /// instructions (see `uniform_instrs`) computed by one invocation per workgroup into
    /// workgroup memory.
    fn shader(&self, dtype: DType, flat: bool, uniform: &[bool]) -> String {
        let n = self.inputs;
        let mut s = String::new();
        s.push_str(&format!(
            "struct Params {{
    row: u32,
    n: u32,
    rank: u32,
    words: u32,
    // 0 at run time: see `fence`.
    zero: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    // Merged output dims, and each input's element strides along them (input k's at
    // st[2k], st[2k + 1]; 0 on broadcast dims).
    shape: array<vec4<u32>, 2>,
    st: array<vec4<u32>, {}>,
}};
@group(0) @binding(0) var<uniform> p: Params;
",
            2 * n
        ));
        for k in 0..n {
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, read_write> in{k}: array<u32>;\n",
                k + 1
            ));
        }
        // Output 0 is `out` (what `store_stmt` writes), output k `out{k}`.
        let outs = self.output_instrs();
        for k in 0..outs.len() {
            let name = if k == 0 {
                "out".to_string()
            } else {
                format!("out{k}")
            };
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, read_write> {name}: array<u32>;\n",
                n + 1 + k
            ));
        }
        s.push_str(LINEAR_INDEX);
        s.push_str(COMMON_WGSL);
        s.push_str(MATH_WGSL);
        s.push_str(&self.functions(dtype));
        s.push_str(&self.elem_fn(flat, uniform));
        let k_out = outs.len();
        let any_uniform = uniform.iter().any(|&u| u);
        if any_uniform {
            s.push_str(&format!(
                "var<workgroup> wg: array<f32, {}>;\nfn uniform_values() {{\n",
                self.instrs.len()
            ));
            for (k, &r) in self.reads(uniform, true).iter().enumerate() {
                if r {
                    s.push_str(&format!("    let x{k} = ld{k}(0u);\n"));
                }
            }
            self.body(&mut s, uniform, true);
            for (k, &u) in uniform.iter().enumerate() {
                if u {
                    s.push_str(&format!("    wg[{k}] = t{k};\n"));
                }
            }
            s.push_str("}\n");
        }
        let prologue = if any_uniform {
            "    if lid == 0u {
        uniform_values();
    }
    workgroupBarrier();
"
        } else {
            ""
        };
        s.push_str(&format!(
            "
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
{prologue}    let w = linear_index(gid);
    if w >= p.words {{
        return;
    }}
{}
}}
",
            if k_out == 1 {
                store_stmt(dtype).to_string()
            } else {
                store_multi(dtype, k_out)
            }
        ));
        s
    }

    /// The inputs that the `uniform` instructions (`want`) or the others read.
    fn reads(&self, uniform: &[bool], want: bool) -> Vec<bool> {
        let mut r = vec![false; self.inputs];
        for (ins, &u) in self.instrs.iter().zip(uniform) {
            for a in &ins.args {
                if let (Arg::Input(i), true) = (*a, u == want) {
                    r[i] = true;
                }
            }
        }
        r
    }

    /// WGSL statements computing the `uniform` instructions (`want`) or the others, each
    /// `let tK = fence(opK(..));`.
    fn body(&self, s: &mut String, uniform: &[bool], want: bool) {
        for (k, ins) in self.instrs.iter().enumerate() {
            if uniform[k] != want {
                continue;
            }
            // An operand given twice (`Sub(i0,i0)`) is passed the second time through the
            // opaque XOR: shader compilers fold `x - x` to 0 and the like when they may assume
            // no inf or NaN (Mesa's lavapipe did: inf - inf came out 0, not NaN), where
            // the unfused kernel loads the two operands from two bindings.
            let args: Vec<String> = ins
                .args
                .iter()
                .enumerate()
                .map(|(j, a)| {
                    let v = match a {
                        Arg::Input(i) => format!("x{i}"),
                        Arg::Temp(t) => format!("t{t}"),
                    };
                    if ins.args[..j].contains(a) {
                        format!("bitcast<f32>(bitcast<u32>({v}) ^ p.zero)")
                    } else {
                        v
                    }
                })
                .collect();
            s.push_str(&format!(
                "    let t{k} = fence(op{k}({}));\n",
                args.join(", ")
            ));
        }
    }

    /// WGSL functions of the program: `rt`, `fence`, Pow's helpers where needed, `ldK` (input
    /// K's element `i`) and `opK` (instruction K's body).
    fn functions(&self, dtype: DType) -> String {
        let n = self.inputs;
        let mut s = String::new();
        s.push_str(&format!(
            "
fn rt(v: f32) -> f32 {{
    return {};
}}

// An instruction's result as a kernel of its own stores it: rounded to the dtype, and opaque
// to the compiler, which can then neither contract it into an FMA with a later instruction
// nor reassociate across instructions.
fn fence(v: f32) -> f32 {{
    return bitcast<f32>(bitcast<u32>(rt(v)) ^ p.zero);
}}
",
            rt_expr(dtype)
        ));
        if self.instrs.iter().any(|i| i.op == FusedOp::Pow) {
            // v, in a way the compiler cannot simplify (as the elementwise family's).
            s.push_str("fn opaque(v: f32) -> f32 {\n    return bitcast<f32>(bitcast<u32>(v) ^ p.zero);\n}\n");
            s.push_str(POW_WGSL);
        }
        for k in 0..n {
            s.push_str(&format!(
                "fn ld{k}(i: u32) -> f32 {{\n    return {};\n}}\n",
                load_expr(dtype, &format!("in{k}"))
            ));
        }
        for (k, ins) in self.instrs.iter().enumerate() {
            let params = match ins.op.arity() {
                3 => "x: f32, y: f32, z: f32",
                2 => "x: f32, y: f32",
                _ => "x: f32",
            };
            s.push_str(&format!(
                "fn op{k}({params}) -> f32 {{\n{}\n}}\n",
                ins.op.wgsl()
            ));
        }
        s
    }

    /// WGSL statements computing `oK`, input K's offset for output element `e` (`flat`: `e`
    /// times its stride; else through the merged dims `p.shape` and strides `p.st`).
    fn offsets(&self, flat: bool) -> String {
        let n = self.inputs;
        let mut s = String::new();
        if flat {
            for k in 0..n {
                s.push_str(&format!("    let o{k} = e * p.st[{}].x;\n", 2 * k));
            }
        } else {
            s.push_str("    var rem = e;\n");
            for k in 0..n {
                s.push_str(&format!("    var o{k} = 0u;\n"));
            }
            s.push_str(
                "    for (var d = p.rank; d > 1u; d = d - 1u) {
        let k = d - 1u;
        let dim = p.shape[k / 4u][k % 4u];
        let c = rem % dim;
        rem = rem / dim;
",
            );
            for k in 0..n {
                s.push_str(&format!(
                    "        o{k} = o{k} + c * p.st[{} + k / 4u][k % 4u];\n",
                    2 * k
                ));
            }
            s.push_str("    }\n");
            for k in 0..n {
                s.push_str(&format!("    o{k} = o{k} + rem * p.st[{}].x;\n", 2 * k));
            }
        }
        s
    }

    /// WGSL of `elem(e)`: the outputs' values at element `e` of the output (one value, or an
    /// array of them), every input read at its broadcast offset (`flat`: `e * stride`); the
    /// `uniform` instructions' results read from workgroup memory `wg`.
    fn elem_fn(&self, flat: bool, uniform: &[bool]) -> String {
        let outs = self.output_instrs();
        let mut s = String::new();
        let k_out = outs.len();
        if k_out == 1 {
            s.push_str("fn elem(e: u32) -> f32 {\n");
        } else {
            s.push_str(&format!("fn elem(e: u32) -> array<f32, {k_out}> {{\n"));
        }
        s.push_str(&self.offsets(flat));
        for (k, &r) in self.reads(uniform, false).iter().enumerate() {
            if r {
                s.push_str(&format!("    let x{k} = ld{k}(o{k});\n"));
            }
        }
        for (k, &u) in uniform.iter().enumerate() {
            if u {
                s.push_str(&format!("    let t{k} = wg[{k}];\n"));
            }
        }
        self.body(&mut s, uniform, false);
        if k_out == 1 {
            s.push_str(&format!("    return t{};\n}}\n", self.instrs.len() - 1));
        } else {
            let vals: Vec<String> = outs.iter().map(|o| format!("t{o}")).collect();
            s.push_str(&format!(
                "    return array<f32, {k_out}>({});\n}}\n",
                vals.join(", ")
            ));
        }
        s
    }
}

/// WGSL statements writing word `w` of each of `k` outputs from `elem(e)` (an array of the
/// outputs' values at element `e`), as `store_stmt` writes one.
fn store_multi(dtype: DType, k: usize) -> String {
    let mut s = String::new();
    if dtype == DType::F16 {
        s.push_str(&format!(
            "    let e0 = w * 2u;
    let lo = elem(e0);
    var hi = array<f32, {k}>();
    if e0 + 1u < p.n {{
        hi = elem(e0 + 1u);
    }}
"
        ));
        for j in 0..k {
            let name = if j == 0 {
                "out".to_string()
            } else {
                format!("out{j}")
            };
            s.push_str(&format!(
                "    {name}[w] = f32_to_f16(lo[{j}]) | (f32_to_f16(hi[{j}]) << 16u);\n"
            ));
        }
    } else {
        s.push_str("    let v = elem(w);\n");
        for j in 0..k {
            let name = if j == 0 {
                "out".to_string()
            } else {
                format!("out{j}")
            };
            s.push_str(&format!("    {name}[w] = bitcast<u32>(v[{j}]);\n"));
        }
    }
    s
}

/// Whether Tile by `m` of a tensor of `shape` only repeats size-1 dimensions (a broadcast,
/// which the fused kernel does in its reads).
fn tile_is_broadcast(shape: &[usize], m: &[usize]) -> bool {
    shape.iter().zip(m).all(|(&d, &k)| d == 1 || k == 1)
}

/// NumPy broadcast of two shapes.
fn broadcast2(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], d: usize| {
        let pad = rank - s.len();
        if d < pad { 1 } else { s[d - pad] }
    };
    (0..rank)
        .map(|d| {
            let (x, y) = (dim(a, d), dim(b, d));
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

/// The reads of inputs broadcast to `out`: merged dimensions (size-1 dimensions dropped,
/// adjacent dimensions merged where every input steps over them contiguously or not at all)
/// and each input's element strides along them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reads {
    pub dims: Vec<usize>,
    pub strides: Vec<Vec<usize>>,
}

impl Reads {
    /// `None` when an input does not broadcast to `out`.
    pub fn of(out: &[usize], inputs: &[&[usize]]) -> Option<Reads> {
        let rank = out.len();
        let mut full: Vec<Vec<usize>> = vec![];
        for s in inputs {
            if s.len() > rank {
                return None;
            }
            let pad = rank - s.len();
            let mut st = vec![0; rank];
            let mut acc = 1;
            for d in (0..rank).rev() {
                let n = if d < pad { 1 } else { s[d - pad] };
                if n != 1 && n != out[d] {
                    return None;
                }
                st[d] = if n == 1 { 0 } else { acc };
                acc *= n;
            }
            full.push(st);
        }
        let (dims, strides) = crate::kernels::elementwise::merge_dims(out, &full);
        Some(Reads { dims, strides })
    }
}

/// Input indices 0..MAX_INPUTS, for `forwardable_inputs`.
const INDICES: [usize; MAX_INPUTS] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];

/// One fused node's kernel.
pub struct Fused {
    program: Program,
    dtype: DType,
    /// The program's key text (see [`key_text`]).
    text: String,
    /// Programs restricted to the outputs of one shape (by their instructions, in dispatch
    /// order), with their inputs and key text: computed once per set of outputs.
    restricted: std::sync::Mutex<Vec<(Vec<usize>, std::sync::Arc<Restricted>)>>,
    /// What a dispatch of a program (by its key text) on inputs of given shapes needs, kept
    /// from the first call (TensorFlow runs a node on the same shapes step after step): the
    /// merged broadcast, the params, the pipeline key's variant, built once instead of on
    /// every call.
    plans: std::sync::Mutex<Vec<std::sync::Arc<DispatchPlan>>>,
    /// `check`'s result by input shapes, kept from the first call (both `outputs` and `record`
    /// check the inputs on every call; the shapes repeat step after step).
    checked: std::sync::Mutex<Vec<(Vec<Vec<usize>>, Checked)>>,
}

/// Every instruction's result shape and the output instructions of a program on inputs of
/// given shapes (see `Fused::check`).
type Checked = std::sync::Arc<(Vec<Vec<usize>>, Vec<usize>)>;

/// One dispatch's shape-dependent parts (see `Fused::plans`).
struct DispatchPlan {
    text: String,
    shapes: Vec<Vec<usize>>,
    out: Vec<usize>,
    variant: String,
    flat: bool,
    uniform: Vec<bool>,
    params: Vec<u8>,
    groups: [u32; 3],
    /// The plan's pipeline, once looked up (`KernelContext::pipeline_kept`).
    pipeline: std::sync::OnceLock<(u64, std::sync::Arc<crate::exec::Pipeline>)>,
}

/// Whether a kept plan keeps its pipeline too (`TFWGPU_KEPT_PIPELINES=0`: off, every dispatch
/// builds its pipeline key and looks it up, as before). Read once.
fn kept_pipelines() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_KEPT_PIPELINES", "0"))
}

/// Most plans a kernel keeps (a node whose shapes keep changing builds them afresh).
const MAX_PLANS: usize = 8;

/// A program restricted to some of the outputs, its inputs in the whole program and its key
/// text.
struct Restricted {
    program: Program,
    inputs: Vec<usize>,
    text: String,
}

/// The part of the pipeline key a program decides: its text without Tile's multiples (the
/// shader does not depend on them: they shape the output, and the broadcast is in the reads'
/// strides) and its exported instructions.
fn key_text(program: &Program) -> String {
    let mut t = program.render(false);
    if !program.exports.is_empty() {
        let e: Vec<String> = program.exports.iter().map(|e| e.to_string()).collect();
        t.push_str(&format!("/out:{}", e.join(",")));
    }
    t
}

impl Fused {
    pub fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let dtype = attrs.dtype("T")?;
        if !fusible_dtype(dtype) {
            return Err(Error::Unimplemented(format!(
                "{OP} has no tfwgpu kernel for T={dtype}"
            )));
        }
        let n = attrs.int_or("N", -1)?;
        if n < 1 {
            bail_invalid!("{OP}: attribute N missing or not positive ({n})");
        }
        let text = match attrs.get("program") {
            Some(crate::AttrValue::Str(s)) => s.clone(),
            _ => bail_invalid!("{OP}: string attribute program missing"),
        };
        let exports: Vec<usize> = match attrs.get("exports") {
            None => vec![],
            Some(crate::AttrValue::Ints(v)) => v
                .iter()
                .map(|&e| {
                    usize::try_from(e)
                        .map_err(|_| invalid_arg!("{OP_MULTI}: exports holds {e}, not an index"))
                })
                .collect::<Result<_>>()?,
            Some(_) => bail_invalid!("{OP_MULTI}: attribute exports is not a list of ints"),
        };
        let m = attrs.int_or("M", 1)?;
        if m != exports.len() as i64 + 1 {
            bail_invalid!(
                "{OP_MULTI}: M = {m} outputs but exports names {} instructions (M - 1 expected)",
                exports.len()
            );
        }
        let program = Program::parse_multi(&text, n as usize, &exports)?;
        Ok(Box::new(Fused {
            text: key_text(&program),
            program,
            dtype,
            restricted: Default::default(),
            checked: Default::default(),
            plans: Default::default(),
        }))
    }

    /// Validates the inputs; the shape of every instruction's result.
    fn check(&self, inputs: &[Operand]) -> Result<Checked> {
        if inputs.len() != self.program.inputs {
            bail_invalid!(
                "{OP} takes {} inputs, got {}",
                self.program.inputs,
                inputs.len()
            );
        }
        for (k, i) in inputs.iter().enumerate() {
            if i.dtype() != self.dtype {
                bail_invalid!("{OP}: input {k} is {} but T is {}", i.dtype(), self.dtype);
            }
        }
        let same = |(shapes, _): &&(Vec<Vec<usize>>, Checked)| {
            shapes.iter().zip(inputs).all(|(s, i)| s == i.shape())
        };
        if let Some((_, c)) = self
            .checked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(same)
        {
            return Ok(c.clone());
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|i| i.shape()).collect();
        let temps = self.program.temp_shapes(&shapes)?;
        let outs = self.program.output_instrs();
        for &o in &outs {
            words_for(OP, self.dtype, temps[o].iter().product())?;
        }
        let c = std::sync::Arc::new((temps, outs));
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if checked.len() >= MAX_PLANS {
            checked.remove(0);
        }
        checked.push((shapes.iter().map(|s| s.to_vec()).collect(), c.clone()));
        Ok(c)
    }

    /// `program` restricted to the results of instructions `values` (see
    /// [`Program::restrict`]); cached unless `fresh` (a program whose Tiles were materialized).
    fn restricted(
        &self,
        program: &Program,
        values: &[usize],
        fresh: bool,
    ) -> std::sync::Arc<Restricted> {
        let make = || {
            let (program, inputs) = program.restrict(values);
            std::sync::Arc::new(Restricted {
                text: key_text(&program),
                program,
                inputs,
            })
        };
        if fresh {
            return make();
        }
        let mut cache = self.restricted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, r)) = cache.iter().find(|(v, _)| v == values) {
            return r.clone();
        }
        let r = make();
        cache.push((values.to_vec(), r.clone()));
        r
    }

    /// One dispatch of `program` (every instruction's result of `shape` or broadcasting to
    /// it) writing its outputs `outs` in order; its plan is kept when `cache` (a program that
    /// lives as long as the kernel: not one whose Tiles were materialized for this call).
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        ctx: &KernelContext,
        program: &Program,
        text: &str,
        inputs: &[Operand],
        shape: &[usize],
        outs: &[&DeviceRef],
        cache: bool,
    ) -> Result<()> {
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let bindings_needed = (program.inputs + outs.len()) as u32;
        if bindings_needed > ctx.limits().max_storage_buffers_per_shader_stage {
            return Err(Error::Unimplemented(format!(
                "{OP}: {bindings_needed} storage bindings needed, the adapter allows {}",
                ctx.limits().max_storage_buffers_per_shader_stage
            )));
        }
        let found = cache
            .then(|| {
                let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
                plans
                    .iter()
                    .find(|p| {
                        p.text == text
                            && p.out == shape
                            && p.shapes.len() == inputs.len()
                            && p.shapes.iter().zip(inputs).all(|(s, i)| s == i.shape())
                    })
                    .cloned()
            })
            .flatten();
        let plan = match found {
            Some(p) => p,
            None => {
                let p = std::sync::Arc::new(self.plan(program, text, inputs, shape)?);
                if cache {
                    let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
                    if plans.len() >= MAX_PLANS {
                        plans.remove(0);
                    }
                    plans.push(p.clone());
                }
                p
            }
        };
        let mut binds = Vec::with_capacity(inputs.len() + outs.len());
        for (k, i) in inputs.iter().enumerate() {
            binds.push(ctx.bind(i.device(OP, k)?)?);
        }
        for o in outs {
            binds.push(bind_out(ctx, OP, o)?);
        }
        let key = || PipelineKey::new("fused", Some(self.dtype), plan.variant.as_str());
        let source = || ShaderSource::new(program.shader(self.dtype, plan.flat, &plan.uniform));
        let pipeline = if cache && kept_pipelines() {
            ctx.pipeline_kept(&plan.pipeline, key, source)?
        } else {
            ctx.pipeline(key(), source)?
        };
        ctx.dispatch(&pipeline, &plan.params, &binds, plan.groups)
    }

    /// The shape-dependent parts of a dispatch of `program` on `inputs` for an output of
    /// `shape` (not empty).
    fn plan(
        &self,
        program: &Program,
        text: &str,
        inputs: &[Operand],
        shape: &[usize],
    ) -> Result<DispatchPlan> {
        let n: usize = shape.iter().product();
        let shapes: Vec<&[usize]> = inputs.iter().map(|i| i.shape()).collect();
        let reads = Reads::of(shape, &shapes).ok_or_else(|| {
            invalid_arg!(
                "{OP}: an input does not broadcast to the output {}",
                fmt_shape(shape)
            )
        })?;
        if reads.dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{OP}: the broadcast to {} needs {} dimensions after merging; at most \
                 {MAX_RANK} are supported",
                fmt_shape(shape),
                reads.dims.len()
            )));
        }
        let flat = reads.dims.len() <= 1;
        let uniform = program.uniform_instrs(&shapes, n);
        let mut variant = format!("{text}/{}", if flat { "flat" } else { "bcast" });
        if uniform.iter().any(|&u| u) {
            variant.push_str("/uniform:");
            variant.extend(uniform.iter().map(|&u| if u { '1' } else { '0' }));
        }
        let words = words_for(OP, self.dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let mut w = vec![row, n as u32, reads.dims.len() as u32, words, 0, 0, 0, 0];
        let mut a8 = [0u32; MAX_RANK];
        for (dst, &src) in a8.iter_mut().zip(&reads.dims) {
            *dst = src as u32;
        }
        w.extend_from_slice(&a8);
        for st in &reads.strides {
            let mut a8 = [0u32; MAX_RANK];
            for (dst, &src) in a8.iter_mut().zip(st) {
                *dst = src as u32;
            }
            w.extend_from_slice(&a8);
        }
        Ok(DispatchPlan {
            text: text.to_string(),
            shapes: shapes.iter().map(|s| s.to_vec()).collect(),
            out: shape.to_vec(),
            variant,
            flat,
            uniform,
            params: params(&w),
            groups,
            pipeline: Default::default(),
        })
    }
}

impl Kernel for Fused {
    fn op(&self) -> &'static str {
        OP
    }

    /// An input of output 0's shape is read at the output's element index only, by the
    /// invocation that writes that element's word, before it writes; outputs of other shapes
    /// are computed by dispatches recorded before the one that writes output 0.
    fn forwardable_inputs(&self) -> &'static [usize] {
        &INDICES[..self.program.inputs]
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let checked = self.check(inputs)?;
        let (temps, outs) = &*checked;
        Ok(outs
            .iter()
            .map(|&o| TensorDesc::new(self.dtype, &temps[o]))
            .collect())
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let checked = self.check(inputs)?;
        let (temps, out_instrs) = (&checked.0, &checked.1);
        if outputs.len() != out_instrs.len() {
            bail_invalid!(
                "{OP}: {} outputs given, the program has {}",
                outputs.len(),
                out_instrs.len()
            );
        }
        for (k, (out, &o)) in outputs.iter().zip(out_instrs).enumerate() {
            if out.desc != TensorDesc::new(self.dtype, &temps[o]) {
                bail_invalid!(
                    "{OP}: output {k} is {} {} but the program computes {} {}",
                    out.desc.dtype,
                    fmt_shape(&out.desc.shape),
                    self.dtype,
                    fmt_shape(&temps[o])
                );
            }
        }
        if outputs.iter().all(|o| o.desc.num_elements() == 0) {
            return Ok(());
        }
        // A Tile that repeats a dimension of size > 1 is no broadcast: materialize it into a
        // temporary with the Tile kernel, read that instead, and tile it by ones.
        let mut program = std::borrow::Cow::Borrowed(&self.program);
        let mut tiled: Vec<(usize, DeviceRef)> = vec![];
        for (k, ins) in self.program.instrs.iter().enumerate() {
            if ins.op != FusedOp::Tile {
                continue;
            }
            let i = match ins.args[0] {
                Arg::Input(i) => i,
                // The plugin never fuses a Tile's producer into its group.
                Arg::Temp(t) => {
                    if tile_is_broadcast(&temps[t], &ins.multiples) {
                        continue;
                    }
                    return Err(Error::Unimplemented(format!(
                        "{OP}: instruction {k}: Tile of a computed value that is not a broadcast"
                    )));
                }
            };
            let x = inputs[i].device(OP, i)?;
            if tile_is_broadcast(&x.desc.shape, &ins.multiples) {
                continue;
            }
            if tiled.iter().any(|(j, _)| *j == i) {
                // Another Tile of this input by the same multiples, materialized already.
                program.to_mut().instrs[k].multiples = vec![1; ins.multiples.len()];
                continue;
            }
            // Every instruction that reads the input must be such a Tile (in a valid program
            // no other op can combine the untiled input with the tiled one).
            let shared = self.program.instrs.iter().any(|other| {
                other.args.contains(&Arg::Input(i))
                    && !(other.op == FusedOp::Tile && other.multiples == ins.multiples)
            });
            if shared {
                return Err(Error::Unimplemented(format!(
                    "{OP}: instruction {k}: Tile (not a broadcast) of input {i}, which other \
                     instructions read too"
                )));
            }
            let desc = TensorDesc::new(
                self.dtype,
                &x.desc
                    .shape
                    .iter()
                    .zip(&ins.multiples)
                    .map(|(a, b)| a * b)
                    .collect::<Vec<_>>(),
            );
            let t = ctx.temp_tensor(desc)?;
            crate::kernels::layout::tile_into(ctx, x, &ins.multiples, &t)?;
            let p = program.to_mut();
            p.instrs[k].multiples = vec![1; ins.multiples.len()];
            tiled.push((i, t));
        }
        let replaced: Vec<Operand> = inputs
            .iter()
            .enumerate()
            .map(|(i, op)| match tiled.iter().find(|(j, _)| *j == i) {
                Some((_, t)) => Operand::Device(t),
                None => *op,
            })
            .collect();
        let root_shape = &temps[out_instrs[0]];
        if out_instrs.iter().all(|&o| &temps[o] == root_shape) {
            // One dispatch writes every output (a single-output program, or SGD's update).
            let outs: Vec<&DeviceRef> = outputs.iter().collect();
            let cache = tiled.is_empty();
            return self.dispatch(
                ctx, &program, &self.text, &replaced, root_shape, &outs, cache,
            );
        }
        // Outputs by shape: those of output 0's shape in the last dispatch (output 0 may be
        // written over an input, which the other dispatches read), the others one dispatch
        // per shape, each computing only what its outputs depend on.
        let mut classes: Vec<(&Vec<usize>, Vec<usize>)> = vec![];
        for (k, &o) in out_instrs.iter().enumerate().skip(1) {
            if &temps[o] == root_shape {
                continue;
            }
            match classes.iter_mut().find(|(s, _)| *s == &temps[o]) {
                Some((_, ks)) => ks.push(k),
                None => classes.push((&temps[o], vec![k])),
            }
        }
        let main: Vec<usize> = (0..out_instrs.len())
            .filter(|&k| &temps[out_instrs[k]] == root_shape)
            .collect();
        classes.push((root_shape, main));
        for (shape, ks) in &classes {
            // The values in order of their instructions (the restricted program's output 0
            // is the last of them).
            let mut ks = ks.clone();
            ks.sort_by_key(|&k| std::cmp::Reverse(out_instrs[k]));
            let values: Vec<usize> = ks.iter().map(|&k| out_instrs[k]).collect();
            let sub = self.restricted(&program, &values, !tiled.is_empty());
            let sub_inputs: Vec<Operand> = sub.inputs.iter().map(|&i| replaced[i]).collect();
            let outs: Vec<&DeviceRef> = ks.iter().map(|&k| &outputs[k]).collect();
            let cache = tiled.is_empty();
            self.dispatch(
                ctx,
                &sub.program,
                &sub.text,
                &sub_inputs,
                shape,
                &outs,
                cache,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_parse_and_print() {
        let text = "Mul(i0,i1);Sqrt(i2);AddV2(t1,i3);RealDiv(t0,t2);Sub(i4,t3)";
        let p = Program::parse(text, 5).unwrap();
        assert_eq!(p.instrs.len(), 5);
        assert_eq!(p.instrs[3].args, vec![Arg::Temp(0), Arg::Temp(2)]);
        assert_eq!(p.text(), text);
        for (bad, n) in [
            ("Mul(i0,i1)", 1),            // input out of range
            ("Mul(i0,t0)", 2),            // a temp not yet computed
            ("Sqrt(i0,i1)", 2),           // arity
            ("Foo(i0)", 1),               // unknown op
            ("Sqrt(i0);Exp(i0)", 1),      // t0 unused
            ("Sqrt(i0", 1),               // malformed
            ("Sqrt(x0)", 1),              // malformed argument
            ("Sqrt(i0)", 0),              // no inputs
            ("Sqrt(i0)", MAX_INPUTS + 1), // too many inputs
            ("Tile(i0)", 1),              // Tile without multiples
            ("Tile[2xa](i0)", 1),         // bad multiples
            ("Neg[2](i0)", 1),            // bracketed values on another op
        ] {
            assert!(Program::parse(bad, n).is_err(), "{bad} with {n} inputs");
        }
    }

    #[test]
    fn tile_keeps_its_multiples_in_the_text_but_not_in_the_key() {
        let text = "Tile[64x7x7x1](i0);Mul(i1,t0)";
        let p = Program::parse(text, 2).unwrap();
        assert_eq!(p.instrs[0].multiples, vec![64, 7, 7, 1]);
        assert_eq!(p.text(), text);
        assert_eq!(p.render(false), "Tile(i0);Mul(i1,t0)");
        assert_eq!(
            p.output_shape(&[&[1, 1, 1, 5], &[]]).unwrap(),
            vec![64, 7, 7, 5]
        );
    }

    #[test]
    fn shapes_follow_each_op() {
        let p = Program::parse("BiasAdd(i0,i1);Relu(t0)", 2).unwrap();
        assert_eq!(p.output_shape(&[&[4, 3], &[3]]).unwrap(), vec![4, 3]);
        let e = p.output_shape(&[&[4, 3], &[4]]).unwrap_err().to_string();
        assert!(e.contains("BiasAdd"), "{e}");
        assert!(
            p.output_shape(&[&[3], &[3]]).is_err(),
            "BiasAdd needs rank 2"
        );
        let p = Program::parse("AddV2(i0,i1);Mul(t0,i2)", 3).unwrap();
        assert_eq!(p.output_shape(&[&[3, 1], &[1], &[4]]).unwrap(), vec![3, 4]);
        let e = p
            .output_shape(&[&[2, 3], &[4], &[]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("AddV2: incompatible shapes [2,3] and [4]"),
            "{e}"
        );
    }

    #[test]
    fn reads_merge_dimensions() {
        let r = Reads::of(&[2, 3, 4], &[&[2, 3, 4], &[4], &[]]).unwrap();
        assert_eq!(r.dims, vec![6, 4]);
        assert_eq!(r.strides, vec![vec![4, 1], vec![0, 1], vec![0, 0]]);
        let r = Reads::of(&[5, 7], &[&[5, 7], &[5, 7]]).unwrap();
        assert_eq!((r.dims, r.strides), (vec![35], vec![vec![1], vec![1]]));
        let r = Reads::of(&[3, 1, 4], &[&[3, 1, 1], &[4]]).unwrap();
        assert_eq!(r.dims, vec![3, 4]);
        assert_eq!(r.strides, vec![vec![1, 0], vec![0, 1]]);
        assert!(Reads::of(&[3, 4], &[&[2, 4]]).is_none());
        assert!(Reads::of(&[4], &[&[2, 4]]).is_none());
    }
}
