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
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::{COMMON_WGSL, bind_out, compute_type, fmt_shape, load_expr, store_stmt, words_for};

const BINARY_WGSL: &str = include_str!("binary.wgsl");

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
        }
    }

    fn supports(self, dtype: DType) -> bool {
        match self {
            BinaryOp::RealDiv => dtype.is_float(),
            _ => matches!(dtype, DType::F32 | DType::F16 | DType::I32),
        }
    }

    /// The body of `fn op(x: T, y: T) -> T`.
    fn wgsl(self, dtype: DType) -> &'static str {
        let float = dtype.is_float();
        match self {
            BinaryOp::Add => "    return x + y;",
            BinaryOp::Sub => "    return x - y;",
            BinaryOp::Mul => "    return x * y;",
            BinaryOp::RealDiv | BinaryOp::Div if float => "    return x / y;",
            // WGSL's i32 division truncates and gives INT_MIN for INT_MIN / -1, like
            // TensorFlow; division by zero is defined here as 0 (TensorFlow raises an error).
            BinaryOp::RealDiv | BinaryOp::Div => {
                "    if y == 0 {
        return 0;
    }
    return x / y;"
            }
            // NaN from either side, else std::max / std::min (`x < y ? y : x`,
            // `y < x ? y : x`), decided on integer keys: a float compare plus select is
            // turned into a hardware max/min by some drivers, whose sign of zero differs.
            BinaryOp::Maximum if float => {
                "    if is_nan(x) {
        return x;
    }
    if is_nan(y) {
        return y;
    }
    return bitcast<f32>(select(bitcast<u32>(x), bitcast<u32>(y), f32_less(x, y)));"
            }
            BinaryOp::Minimum if float => {
                "    if is_nan(x) {
        return x;
    }
    if is_nan(y) {
        return y;
    }
    return bitcast<f32>(select(bitcast<u32>(x), bitcast<u32>(y), f32_less(y, x)));"
            }
            BinaryOp::Maximum => "    return max(x, y);",
            BinaryOp::Minimum => "    return min(x, y);",
        }
    }
}

/// The broadcast of two shapes, simplified for the shader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Broadcast {
    /// The output shape (TensorFlow's).
    pub out_shape: Vec<usize>,
    /// Merged dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Element strides of `a` and `b` along `dims`.
    pub sa: Vec<usize>,
    pub sb: Vec<usize>,
}

impl Broadcast {
    /// Broadcasts `a` with `b`; errors name the op and both shapes.
    pub fn new(op: &str, a: &[usize], b: &[usize]) -> Result<Self> {
        let rank = a.len().max(b.len());
        let pad = |s: &[usize]| -> Vec<usize> {
            let mut v = vec![1; rank - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (pa, pb) = (pad(a), pad(b));
        let mut out_shape = Vec::with_capacity(rank);
        for (&x, &y) in pa.iter().zip(&pb) {
            out_shape.push(if x == y {
                x
            } else if x == 1 {
                y
            } else if y == 1 {
                x
            } else {
                bail_invalid!(
                    "{op}: incompatible shapes {} and {}",
                    fmt_shape(a),
                    fmt_shape(b)
                );
            });
        }
        let strides = |s: &[usize]| -> Vec<usize> {
            let mut st = vec![0; rank];
            let mut acc = 1;
            for d in (0..rank).rev() {
                st[d] = if s[d] == 1 { 0 } else { acc };
                acc *= s[d];
            }
            st
        };
        let (ta, tb) = (strides(&pa), strides(&pb));
        let (mut dims, mut sa, mut sb) = (vec![], vec![], vec![]);
        for d in 0..rank {
            let n = out_shape[d];
            if n == 1 {
                continue;
            }
            if let (Some(last), Some(&la), Some(&lb)) = (dims.last_mut(), sa.last(), sb.last())
                && la == ta[d] * n
                && lb == tb[d] * n
            {
                // The previous dimension steps over this one exactly in both inputs: merge.
                *last *= n;
                *sa.last_mut().expect("same length") = ta[d];
                *sb.last_mut().expect("same length") = tb[d];
                continue;
            }
            dims.push(n);
            sa.push(ta[d]);
            sb.push(tb[d]);
        }
        Ok(Broadcast {
            out_shape,
            dims,
            sa,
            sb,
        })
    }

    pub fn num_elements(&self) -> usize {
        self.out_shape.iter().product()
    }
}

/// One binary op (a table row: TensorFlow's name and the operation).
pub(crate) struct Binary {
    name: &'static str,
    op: BinaryOp,
}

impl Binary {
    pub fn new(name: &'static str, op: BinaryOp) -> Self {
        Binary { name, op }
    }

    /// Validates the inputs and returns their broadcast.
    fn check(&self, inputs: &[Operand]) -> Result<(DType, Broadcast)> {
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
        let bc = Broadcast::new(name, inputs[0].shape(), inputs[1].shape())?;
        if bc.dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{name}: broadcasting {} with {} needs {} dimensions after merging; at most \
                 {MAX_RANK} are supported",
                fmt_shape(inputs[0].shape()),
                fmt_shape(inputs[1].shape()),
                bc.dims.len()
            )));
        }
        words_for(name, ta, bc.num_elements())?;
        Ok((ta, bc))
    }
}

impl Kernel for Binary {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (dtype, bc) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(dtype, &bc.out_shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (dtype, bc) = self.check(inputs)?;
        let n = bc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let out = &outputs[0];
        if out.desc.dtype != dtype || out.desc.shape != bc.out_shape {
            bail_invalid!(
                "{}: output is {} {} but the op computes {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                dtype,
                fmt_shape(&bc.out_shape)
            );
        }
        let a = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let b = ctx.bind(inputs[1].device(self.name, 1)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let flat = bc.dims.len() <= 1;
        let op = self.op;
        let key = PipelineKey::new(
            "elementwise",
            Some(dtype),
            format!("{}/{}", op.name(), if flat { "flat" } else { "bcast" }),
        );
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(op, dtype, flat)))?;
        let words = words_for(self.name, dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let mut w = vec![row, n as u32, bc.dims.len() as u32, words];
        for v in [&bc.dims, &bc.sa, &bc.sb] {
            let mut a8 = [0u32; MAX_RANK];
            for (dst, &src) in a8.iter_mut().zip(v.iter()) {
                *dst = src as u32;
            }
            w.extend_from_slice(&a8);
        }
        ctx.dispatch(&pipeline, &params(&w), &[a, b, o], groups)
    }
}

const OFFSETS_FLAT: &str = "    return vec2<u32>(e * p.sa[0].x, e * p.sb[0].x);";

const OFFSETS_BCAST: &str = "    var rem = e;
    var ia = 0u;
    var ib = 0u;
    for (var d = p.rank; d > 0u; d = d - 1u) {
        let k = d - 1u;
        let dim = p.shape[k / 4u][k % 4u];
        let c = rem % dim;
        rem = rem / dim;
        ia = ia + c * p.sa[k / 4u][k % 4u];
        ib = ib + c * p.sb[k / 4u][k % 4u];
    }
    return vec2<u32>(ia, ib);";

fn shader(op: BinaryOp, dtype: DType, flat: bool) -> String {
    BINARY_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
        .replace("$OFFSETS", if flat { OFFSETS_FLAT } else { OFFSETS_BCAST })
        .replace("$LOAD_A", &load_expr(dtype, "a"))
        .replace("$LOAD_B", &load_expr(dtype, "b"))
        .replace("$OP", op.wgsl(dtype))
        .replace("$STORE", store_stmt(dtype))
        .replace("$T", compute_type(dtype))
        .replace("$WG", &WG.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_merges_dimensions() {
        let bc = Broadcast::new("AddV2", &[2, 3, 4], &[2, 3, 4]).unwrap();
        assert_eq!((bc.dims, bc.sa, bc.sb), (vec![24], vec![1], vec![1]));
        let bc = Broadcast::new("AddV2", &[], &[5]).unwrap();
        assert_eq!((bc.dims, bc.sa, bc.sb), (vec![5], vec![0], vec![1]));
        let bc = Broadcast::new("AddV2", &[3, 1], &[1, 4]).unwrap();
        assert_eq!(bc.out_shape, vec![3, 4]);
        assert_eq!(
            (bc.dims, bc.sa, bc.sb),
            (vec![3, 4], vec![1, 0], vec![0, 1])
        );
        let bc = Broadcast::new("AddV2", &[2, 1, 3], &[4, 1]).unwrap();
        assert_eq!(bc.out_shape, vec![2, 4, 3]);
        assert_eq!(bc.dims, vec![2, 4, 3]);
        assert_eq!((bc.sa, bc.sb), (vec![3, 0, 1], vec![0, 1, 0]));
        // [6,5,4] with [5,4]: the last two dims merge.
        let bc = Broadcast::new("AddV2", &[6, 5, 4], &[5, 4]).unwrap();
        assert_eq!(
            (bc.dims, bc.sa, bc.sb),
            (vec![6, 20], vec![20, 1], vec![0, 1])
        );
        let e = Broadcast::new("AddV2", &[2, 3], &[4]).unwrap_err();
        assert_eq!(e.to_string(), "AddV2: incompatible shapes [2,3] and [4]");
    }
}
