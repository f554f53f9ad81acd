//! Integer bit ops with TensorFlow's broadcasting: BitwiseAnd / BitwiseOr / BitwiseXor,
//! LeftShift / RightShift (the shift amount clamped to [0, bits - 1], left shifts done
//! unsigned, right shifts arithmetic for signed types), and Bitcast (a reinterpreting copy).

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{bind_out, fmt_shape};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Error, Result, bail_invalid};

const BITWISE_WGSL: &str = include_str!("bitwise.wgsl");

/// Dtypes of the bit ops (TensorFlow's GPU kernels also take int8/int16/uint16/uint32/uint64,
/// which the runtime does not store).
pub const INT_TYPES: &[DType] = &[DType::I32, DType::I64, DType::U8];

/// Dtypes Bitcast converts between.
pub const BITCAST_TYPES: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64, DType::U8];

/// Most dimensions a broadcast may have after merging.
const MAX_RANK: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitOp {
    And,
    Or,
    Xor,
    LeftShift,
    RightShift,
}

impl BitOp {
    fn name(self) -> &'static str {
        match self {
            BitOp::And => "BitwiseAnd",
            BitOp::Or => "BitwiseOr",
            BitOp::Xor => "BitwiseXor",
            BitOp::LeftShift => "LeftShift",
            BitOp::RightShift => "RightShift",
        }
    }

    fn id(self) -> u32 {
        self as u32
    }
}

/// A binary bit op.
pub struct Bitwise {
    op: BitOp,
}

impl Bitwise {
    pub fn new(op: BitOp) -> Self {
        Bitwise { op }
    }
}

/// A broadcast of two shapes, simplified: size-1 output dimensions dropped and adjacent
/// dimensions merged where both inputs step over them contiguously (or both broadcast).
struct Bcast {
    out_shape: Vec<usize>,
    dims: Vec<usize>,
    sa: Vec<usize>,
    sb: Vec<usize>,
}

fn broadcast(name: &str, a: &[usize], b: &[usize]) -> Result<Bcast> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(a), pad(b));
    let mut out_shape = Vec::with_capacity(rank);
    for d in 0..rank {
        let n = match (pa[d], pb[d]) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => bail_invalid!(
                "{name}: incompatible shapes {} and {}",
                fmt_shape(a),
                fmt_shape(b)
            ),
        };
        out_shape.push(n);
    }
    let strides = |s: &[usize]| {
        let mut st = vec![0; rank];
        let mut acc = 1;
        for d in (0..rank).rev() {
            st[d] = if s[d] == 1 { 0 } else { acc };
            acc *= s[d];
        }
        st
    };
    let (fa, fb) = (strides(&pa), strides(&pb));
    let (mut dims, mut sa, mut sb) = (vec![], vec![], vec![]);
    for d in 0..rank {
        let n = out_shape[d];
        if n == 1 {
            continue;
        }
        if let (Some(la), Some(lb)) = (sa.last_mut(), sb.last_mut())
            && *la == fa[d] * n
            && *lb == fb[d] * n
        {
            *dims.last_mut().expect("same length") *= n;
            *la = fa[d];
            *lb = fb[d];
            continue;
        }
        dims.push(n);
        sa.push(fa[d]);
        sb.push(fb[d]);
    }
    if dims.len() > MAX_RANK {
        return Err(Error::Unimplemented(format!(
            "{name}: broadcasting {} with {} needs {} dimensions after merging; at most \
             {MAX_RANK} are supported",
            fmt_shape(a),
            fmt_shape(b),
            dims.len()
        )));
    }
    Ok(Bcast {
        out_shape,
        dims,
        sa,
        sb,
    })
}

impl Bitwise {
    fn check(&self, inputs: &[Operand]) -> Result<(DType, Bcast)> {
        let name = self.op.name();
        if inputs.len() != 2 {
            bail_invalid!("{name} takes 2 inputs, got {}", inputs.len());
        }
        let (ta, tb) = (inputs[0].dtype(), inputs[1].dtype());
        if ta != tb {
            bail_invalid!("{name}: input 0 is {ta} but input 1 is {tb}; both must have one dtype");
        }
        if !INT_TYPES.contains(&ta) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={ta}"
            )));
        }
        let bc = broadcast(name, inputs[0].shape(), inputs[1].shape())?;
        let n: usize = bc.out_shape.iter().product();
        if n > u32::MAX as usize / 2 {
            return Err(Error::Unimplemented(format!(
                "{name}: tensors of more than 2^31-1 elements are not supported (got {n})"
            )));
        }
        Ok((ta, bc))
    }
}

impl Kernel for Bitwise {
    fn op(&self) -> &'static str {
        self.op.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (dtype, bc) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(dtype, &bc.out_shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.op.name();
        let (dtype, bc) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc != TensorDesc::new(dtype, &bc.out_shape) {
            bail_invalid!(
                "{name}: output is {} {} but the op computes {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                dtype,
                fmt_shape(&bc.out_shape)
            );
        }
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let a = ctx.bind(inputs[0].device(name, 0)?)?;
        let b = ctx.bind(inputs[1].device(name, 1)?)?;
        let o = bind_out(ctx, name, out)?;
        // One invocation per element (int32, int64) or per output word (uint8: four).
        let (type_id, threads) = match dtype {
            DType::I32 => (0u32, n),
            DType::I64 => (1, n),
            _ => (2, n.div_ceil(4)),
        };
        let key = PipelineKey::new("random", Some(dtype), format!("bitwise/{name}"));
        let pipeline = ctx.pipeline(key, || {
            ShaderSource::new(
                BITWISE_WGSL
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$TYPE", &type_id.to_string())
                    .replace("$OP", &self.op.id().to_string())
                    .replace("$WG", &WG.to_string()),
            )
        })?;
        let (grid, row) = grid_1d(threads as u64, WG);
        let mut w = vec![row, n as u32, bc.dims.len() as u32, threads as u32];
        for v in [&bc.dims, &bc.sa, &bc.sb] {
            let mut a8 = [0u32; MAX_RANK];
            for (dst, &src) in a8.iter_mut().zip(v.iter()) {
                *dst = src as u32;
            }
            w.extend_from_slice(&a8);
        }
        ctx.dispatch(&pipeline, &params(&w), &[a, b, o], grid)
    }
}

/// Bitcast: the input's bytes as another dtype. Equal sizes keep the shape; a smaller output
/// type adds a last dimension of in_size / out_size; a larger one removes the last dimension,
/// which must be out_size / in_size.
pub struct Bitcast {
    from: DType,
    to: DType,
}

impl Bitcast {
    pub fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let from = attrs.dtype("T")?;
        let to = attrs.dtype("type")?;
        for t in [from, to] {
            if !BITCAST_TYPES.contains(&t) {
                return Err(Error::Unimplemented(format!(
                    "Bitcast has no tfwgpu kernel for {from} -> {to}"
                )));
            }
        }
        let (a, b) = (from.size(), to.size());
        if a.max(b) % a.min(b) != 0 {
            bail_invalid!("Bitcast: cannot convert between datatype {from} and {to}");
        }
        Ok(Box::new(Bitcast { from, to }))
    }

    fn out_shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let (a, b) = (self.from.size(), self.to.size());
        let mut s = shape.to_vec();
        if a > b {
            s.push(a / b);
        } else if a < b {
            if s.last() != Some(&(b / a)) {
                bail_invalid!(
                    "Bitcast: Cannot bitcast from {} to {}: shape {}",
                    self.from,
                    self.to,
                    fmt_shape(shape)
                );
            }
            s.pop();
        }
        Ok(s)
    }
}

impl Kernel for Bitcast {
    fn op(&self) -> &'static str {
        "Bitcast"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        if inputs.len() != 1 {
            bail_invalid!("Bitcast takes 1 input, got {}", inputs.len());
        }
        if inputs[0].dtype() != self.from {
            bail_invalid!(
                "Bitcast: input is {} but T is {}",
                inputs[0].dtype(),
                self.from
            );
        }
        Ok(vec![TensorDesc::new(
            self.to,
            &self.out_shape(inputs[0].shape())?,
        )])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let src = inputs[0].device("Bitcast", 0)?;
        let out = &outputs[0];
        let size = out.desc.byte_size();
        if size != src.desc.byte_size() {
            bail_invalid!(
                "Bitcast: output of {size} bytes for an input of {} bytes",
                src.desc.byte_size()
            );
        }
        if size == 0 {
            return Ok(());
        }
        let s = ctx.bind(src)?;
        let d = bind_out(ctx, "Bitcast", out)?;
        // Allocations are padded to whole words.
        ctx.copy(&s, &d, size.next_multiple_of(4))
    }
}
