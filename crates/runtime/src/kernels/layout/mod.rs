//! Layout family (part A): Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Tile,
//! BroadcastTo, ReverseV2, Reverse (v1: a bool `dims` vector). Every op is one or more strided copies (`strided.rs`): a source view
//! with signed strides (ReverseV2), zero strides (BroadcastTo), wrapped coordinates (Tile) or a
//! permutation (Transpose), written to the whole output or to a strided region of it
//! (ConcatV2, Pack: one copy per input).
//!
//! Host-memory arguments mirror TensorFlow's GPU registrations: perm, axis (ConcatV2,
//! ReverseV2), dims (Reverse), split_dim, size_splits, multiples, shape. int32 is registered only for Transpose
//! and Tile, whose TensorFlow GPU kernels keep int32 data in device memory; TensorFlow's GPU
//! int32 kernels of the other ops (and Unpack's int64 kernel) keep every argument in host
//! memory, so those dtypes are left to TensorFlow.
//!
//! Semantics follow TensorFlow, with one difference: where TensorFlow forwards the input
//! buffer unchanged (Transpose by the identity, Tile by ones, a one-way Split...), this family
//! copies it.

pub(crate) mod strided;

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc};
use crate::kernels::elementwise::fmt_shape;
use crate::{Attrs, DType, Error, HostTensor, Result, bail_invalid};
use strided::{Dim, Region, View, copy, strides_of};

/// Every dtype (Transpose, Tile).
const ALL: &[DType] = &DType::ALL;

/// Every dtype but int32.
const NO_I32: &[DType] = &[DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool];

/// Unpack: TensorFlow's GPU int32 and int64 Unpack kernels run in host memory.
const UNPACK_TYPES: &[DType] = &[DType::F32, DType::F16, DType::U8, DType::Bool];

/// Registration table. ConcatV2's `axis` is its last input (index N); the index below is
/// `usize::MAX` for "last".
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "Transpose",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[(1, "perm")],
        factory: |_| Ok(Box::new(Transpose)),
    },
    OpDef {
        op: "ConcatV2",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(usize::MAX, "axis")],
        factory: |a| {
            Ok(Box::new(Concat {
                n: count_attr(a, "N")?,
            }))
        },
    },
    OpDef {
        op: "Pack",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[],
        factory: |a| {
            Ok(Box::new(Pack {
                n: count_attr(a, "N")?,
                axis: a.int_or("axis", 0)?,
            }))
        },
    },
    OpDef {
        op: "Unpack",
        type_attr: "T",
        dtypes: UNPACK_TYPES,
        host_inputs: &[],
        factory: |a| {
            Ok(Box::new(Unpack {
                num: count_attr(a, "num")?,
                axis: a.int_or("axis", 0)?,
            }))
        },
    },
    OpDef {
        op: "Split",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(0, "split_dim")],
        factory: |a| {
            Ok(Box::new(Split {
                num: split_count(a, "Split")?,
            }))
        },
    },
    OpDef {
        op: "SplitV",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(1, "size_splits"), (2, "split_dim")],
        factory: |a| {
            Ok(Box::new(SplitV {
                num: split_count(a, "SplitV")?,
            }))
        },
    },
    OpDef {
        op: "Tile",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[(1, "multiples")],
        factory: |_| Ok(Box::new(Tile)),
    },
    OpDef {
        op: "BroadcastTo",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(1, "shape")],
        factory: |_| Ok(Box::new(BroadcastTo)),
    },
    OpDef {
        op: "ReverseV2",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(1, "axis")],
        factory: |_| Ok(Box::new(Reverse { v1: false })),
    },
    OpDef {
        op: "Reverse",
        type_attr: "T",
        dtypes: NO_I32,
        host_inputs: &[(1, "dims")],
        factory: |_| Ok(Box::new(Reverse { v1: true })),
    },
];

// ---- shared helpers ----

/// An optional non-negative count attribute (N, num): `None` when absent (the runtime API may
/// leave it out; it is then taken from the inputs).
fn count_attr(a: &Attrs, name: &str) -> Result<Option<usize>> {
    match a.get(name) {
        None => Ok(None),
        Some(_) => {
            let v = a.int_or(name, 0)?;
            if v < 0 {
                bail_invalid!("attribute {name} must be non-negative, got {v}");
            }
            Ok(Some(v as usize))
        }
    }
}

/// `num_split` of Split and SplitV: required, positive.
fn split_count(a: &Attrs, op: &str) -> Result<usize> {
    let n = a.int_or("num_split", 0)?;
    if n <= 0 {
        bail_invalid!("{op}: number of ways to split (num_split) should be > 0, but got {n}");
    }
    Ok(n as usize)
}

/// Split's and SplitV's `split_dim` in [-rank, rank) made non-negative.
fn split_axis(op: &str, d: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if d < -r || d >= r {
        bail_invalid!("{op}: -input rank(-{r}) <= split_dim < input rank ({r}), but got {d}");
    }
    Ok(if d < 0 { d + r } else { d } as usize)
}

fn check_arity(op: &str, inputs: &[Operand], n: usize, names: &str) -> Result<()> {
    if inputs.len() != n {
        bail_invalid!("{op} takes {n} inputs ({names}), got {}", inputs.len());
    }
    Ok(())
}

/// The integers of a host-memory argument (int32 or int64).
fn host_ints(op: &str, name: &str, t: &HostTensor) -> Result<Vec<i64>> {
    t.to_i64_vec()
        .map_err(|e| Error::InvalidArgument(format!("{op}: {name}: {e}")))
}

/// A host-memory vector argument.
fn host_vector(op: &str, name: &str, t: &HostTensor) -> Result<Vec<i64>> {
    if t.shape.len() != 1 {
        bail_invalid!(
            "{op}: {name} must be a vector, got shape {}",
            fmt_shape(&t.shape)
        );
    }
    host_ints(op, name, t)
}

/// A host-memory argument holding exactly one integer (TensorFlow's Split and SplitV accept
/// any shape of one element; ConcatV2 checks for a scalar itself).
fn host_single(op: &str, name: &str, t: &HostTensor) -> Result<i64> {
    let v = host_ints(op, name, t)?;
    if v.len() != 1 {
        bail_invalid!(
            "{op}: {name} must have exactly one element, got shape {}",
            fmt_shape(&t.shape)
        );
    }
    Ok(v[0])
}

/// `axis` in [-rank, rank) made non-negative.
fn canonical_axis(op: &str, what: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        bail_invalid!("{op}: {what} = {axis} is not in [-{r}, {r})");
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// The device tensors among `inputs[range]`, with one dtype.
fn device_inputs<'a>(op: &str, inputs: &[Operand<'a>]) -> Result<Vec<&'a DeviceRef>> {
    let v = inputs
        .iter()
        .enumerate()
        .map(|(i, x)| x.device(op, i))
        .collect::<Result<Vec<_>>>()?;
    if let Some(first) = v.first() {
        for (i, x) in v.iter().enumerate() {
            if x.desc.dtype != first.desc.dtype {
                bail_invalid!(
                    "{op}: all inputs must have one dtype: input 0 is {}, input {i} is {}",
                    first.desc.dtype,
                    x.desc.dtype
                );
            }
        }
    }
    Ok(v)
}

/// Views of the pieces of a tensor of `shape` cut along `axis` into `sizes`.
fn pieces(shape: &[usize], axis: usize, sizes: &[usize]) -> Vec<View> {
    let outer = product(&shape[..axis]);
    let inner = product(&shape[axis + 1..]);
    let total = shape[axis];
    let mut off = 0;
    sizes
        .iter()
        .map(|&s| {
            let v = View {
                dims: vec![
                    Dim {
                        size: outer,
                        stride: (total * inner) as i64,
                        wrap: 0,
                    },
                    Dim {
                        size: s * inner,
                        stride: 1,
                        wrap: 0,
                    },
                ],
                base: (off * inner) as i64,
            };
            off += s;
            v
        })
        .collect()
}

/// Copies `view` of `src` to the whole of `out`.
fn copy_all(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    view: &View,
    out: &DeviceRef,
) -> Result<()> {
    let all = Region::all(out.desc.num_elements());
    copy(ctx, op, src, view, out, all)
}

/// Copies each piece of `src` to one output.
fn record_pieces(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    axis: usize,
    sizes: &[usize],
    outputs: &[DeviceRef],
) -> Result<()> {
    for (view, out) in pieces(&src.desc.shape, axis, sizes).iter().zip(outputs) {
        copy_all(ctx, op, src, view, out)?;
    }
    Ok(())
}

/// Writes each input (all of one shape except along `axis`, `sizes[k]` there; or, for Pack,
/// of the output's shape less the packed axis) to its slab of `out`.
fn record_concat(
    ctx: &KernelContext,
    op: &str,
    srcs: &[&DeviceRef],
    out: &DeviceRef,
    axis: usize,
    sizes: &[usize],
) -> Result<()> {
    let shape = &out.desc.shape;
    let outer = product(&shape[..axis]);
    let inner = product(&shape[axis + 1..]);
    let total = shape[axis];
    let mut off = 0;
    for (src, &s) in srcs.iter().zip(sizes) {
        let n = src.desc.num_elements();
        let region = Region {
            base: off * inner,
            rows: outer,
            len: s * inner,
            stride: total * inner,
        };
        copy(ctx, op, src, &View::contiguous(&[n], 0), out, region)?;
        off += s;
    }
    Ok(())
}

// ---- Transpose ----

/// Transpose(x, perm): output dim i is input dim perm[i].
struct Transpose;

impl Transpose {
    fn perm(inputs: &[Operand]) -> Result<Vec<usize>> {
        check_arity("Transpose", inputs, 2, "x, perm")?;
        let shape = inputs[0].shape();
        let rank = shape.len();
        let t = inputs[1].host("Transpose", 1)?;
        let perm = host_ints("Transpose", "perm", t)?;
        if t.shape.len() != 1 || perm.len() != rank {
            bail_invalid!(
                "Transpose: perm must be a vector of size {rank} (the rank of x, shape {}), got \
                 shape {}",
                fmt_shape(shape),
                fmt_shape(&t.shape)
            );
        }
        let mut seen = vec![false; rank];
        for (i, &p) in perm.iter().enumerate() {
            if p < 0 || p >= rank as i64 {
                bail_invalid!("Transpose: perm[{i}] = {p} is out of range [0, {rank})");
            }
            seen[p as usize] = true;
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            bail_invalid!("Transpose: {missing} is missing from perm {perm:?}");
        }
        Ok(perm.into_iter().map(|p| p as usize).collect())
    }
}

impl Kernel for Transpose {
    fn op(&self) -> &'static str {
        "Transpose"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let perm = Self::perm(inputs)?;
        let shape = inputs[0].shape();
        let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let perm = Self::perm(inputs)?;
        let x = inputs[0].device("Transpose", 0)?;
        let strides = strides_of(&x.desc.shape);
        let view = View {
            dims: perm
                .iter()
                .map(|&p| Dim {
                    size: x.desc.shape[p],
                    stride: strides[p],
                    wrap: 0,
                })
                .collect(),
            base: 0,
        };
        copy_all(ctx, "Transpose", x, &view, &outputs[0])
    }
}

// ---- ConcatV2 ----

/// ConcatV2(values..., axis).
struct Concat {
    n: Option<usize>,
}

impl Concat {
    /// The canonical axis and the output shape.
    fn parse(&self, inputs: &[Operand]) -> Result<(usize, Vec<usize>)> {
        let op = "ConcatV2";
        if inputs.len() < 2 {
            bail_invalid!(
                "{op} takes at least 2 inputs (values..., axis), got {}",
                inputs.len()
            );
        }
        let n = inputs.len() - 1;
        if let Some(want) = self.n
            && want != n
        {
            bail_invalid!("{op}: attribute N = {want} but {n} values were given");
        }
        let axis_t = inputs[n].host(op, n)?;
        if !axis_t.shape.is_empty() {
            bail_invalid!(
                "{op}: axis must be a scalar, got shape {}",
                fmt_shape(&axis_t.shape)
            );
        }
        let axis = host_single(op, "axis", axis_t)?;
        device_inputs(op, &inputs[..n])?;
        let s0 = inputs[0].shape();
        let rank = s0.len();
        if rank == 0 {
            bail_invalid!("{op}: can't concatenate scalars (use tf.stack instead)");
        }
        let axis = canonical_axis(op, "axis", axis, rank)?;
        let mut out = s0.to_vec();
        out[axis] = 0;
        for (i, x) in inputs[..n].iter().enumerate() {
            let s = x.shape();
            if s.len() != rank {
                bail_invalid!(
                    "{op}: ranks of all input tensors should match: shape[0] = {} vs. shape[{i}] \
                     = {}",
                    fmt_shape(s0),
                    fmt_shape(s)
                );
            }
            for d in 0..rank {
                if d != axis && s[d] != s0[d] {
                    bail_invalid!(
                        "{op}: dimension {d} in both shapes must be equal: shape[0] = {} vs. \
                         shape[{i}] = {}",
                        fmt_shape(s0),
                        fmt_shape(s)
                    );
                }
            }
            out[axis] += s[axis];
        }
        Ok((axis, out))
    }
}

impl Kernel for Concat {
    fn op(&self) -> &'static str {
        "ConcatV2"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, out) = self.parse(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (axis, _) = self.parse(inputs)?;
        let n = inputs.len() - 1;
        let srcs = device_inputs("ConcatV2", &inputs[..n])?;
        let sizes: Vec<usize> = srcs.iter().map(|s| s.desc.shape[axis]).collect();
        record_concat(ctx, "ConcatV2", &srcs, &outputs[0], axis, &sizes)
    }
}

// ---- Pack ----

/// Pack(values...): stacks N tensors of one shape along a new axis.
struct Pack {
    n: Option<usize>,
    axis: i64,
}

impl Pack {
    fn parse(&self, inputs: &[Operand]) -> Result<(usize, Vec<usize>)> {
        let op = "Pack";
        let n = inputs.len();
        if n == 0 {
            bail_invalid!("{op} needs at least one input");
        }
        if let Some(want) = self.n
            && want != n
        {
            bail_invalid!("{op}: attribute N = {want} but {n} values were given");
        }
        device_inputs(op, inputs)?;
        let s0 = inputs[0].shape();
        for (i, x) in inputs.iter().enumerate() {
            if x.shape() != s0 {
                bail_invalid!(
                    "{op}: shapes of all inputs must match: values[0].shape = {} != \
                     values[{i}].shape = {}",
                    fmt_shape(s0),
                    fmt_shape(x.shape())
                );
            }
        }
        let axis = canonical_axis(op, "axis", self.axis, s0.len() + 1)?;
        let mut out = s0.to_vec();
        out.insert(axis, n);
        Ok((axis, out))
    }
}

impl Kernel for Pack {
    fn op(&self) -> &'static str {
        "Pack"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, out) = self.parse(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (axis, _) = self.parse(inputs)?;
        let srcs = device_inputs("Pack", inputs)?;
        record_concat(ctx, "Pack", &srcs, &outputs[0], axis, &vec![1; srcs.len()])
    }
}

// ---- Unpack ----

/// Unpack(value): the slices of `value` along `axis`, that axis removed.
struct Unpack {
    num: Option<usize>,
    axis: i64,
}

impl Unpack {
    fn parse(&self, inputs: &[Operand]) -> Result<usize> {
        let op = "Unpack";
        check_arity(op, inputs, 1, "value")?;
        let s = inputs[0].shape();
        let axis = canonical_axis(op, "axis", self.axis, s.len())?;
        if let Some(num) = self.num
            && s[axis] != num
        {
            bail_invalid!(
                "{op}: input shape axis {axis} must equal {num}, got shape {}",
                fmt_shape(s)
            );
        }
        Ok(axis)
    }
}

impl Kernel for Unpack {
    fn op(&self) -> &'static str {
        "Unpack"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let axis = self.parse(inputs)?;
        let s = inputs[0].shape();
        let mut out = s.to_vec();
        out.remove(axis);
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out); s[axis]])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let axis = self.parse(inputs)?;
        let x = inputs[0].device("Unpack", 0)?;
        record_pieces(
            ctx,
            "Unpack",
            x,
            axis,
            &vec![1; x.desc.shape[axis]],
            outputs,
        )
    }
}

// ---- Split ----

/// Split(split_dim, value): `num` equal pieces along `split_dim`.
struct Split {
    num: usize,
}

impl Split {
    fn parse(&self, inputs: &[Operand]) -> Result<(usize, Vec<usize>)> {
        let op = "Split";
        check_arity(op, inputs, 2, "split_dim, value")?;
        let d = host_single(op, "split_dim", inputs[0].host(op, 0)?)?;
        let s = inputs[1].shape();
        let axis = split_axis(op, d, s.len())?;
        if !s[axis].is_multiple_of(self.num) {
            bail_invalid!(
                "{op}: number of ways to split should evenly divide the split dimension, but got \
                 split_dim {axis} (size = {}) and num_split {}",
                s[axis],
                self.num
            );
        }
        Ok((axis, vec![s[axis] / self.num; self.num]))
    }
}

impl Kernel for Split {
    fn op(&self) -> &'static str {
        "Split"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (axis, sizes) = self.parse(inputs)?;
        Ok(piece_descs(inputs[1].desc(), axis, &sizes))
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (axis, sizes) = self.parse(inputs)?;
        let x = inputs[1].device("Split", 1)?;
        record_pieces(ctx, "Split", x, axis, &sizes, outputs)
    }
}

fn piece_descs(x: TensorDesc, axis: usize, sizes: &[usize]) -> Vec<TensorDesc> {
    sizes
        .iter()
        .map(|&s| {
            let mut shape = x.shape.clone();
            shape[axis] = s;
            TensorDesc::new(x.dtype, &shape)
        })
        .collect()
}

// ---- SplitV ----

/// SplitV(value, size_splits, split_dim): pieces of the given sizes (one may be -1: the rest).
struct SplitV {
    num: usize,
}

impl SplitV {
    fn parse(&self, inputs: &[Operand]) -> Result<(usize, Vec<usize>)> {
        let op = "SplitV";
        check_arity(op, inputs, 3, "value, size_splits, split_dim")?;
        let s = inputs[0].shape();
        let d = host_single(op, "split_dim", inputs[2].host(op, 2)?)?;
        let axis = split_axis(op, d, s.len())?;
        let sizes = host_vector(op, "size_splits", inputs[1].host(op, 1)?)?;
        if sizes.len() != self.num {
            bail_invalid!(
                "{op}: size_splits must have num_split = {} elements, got {}",
                self.num,
                sizes.len()
            );
        }
        let mut unknown = None;
        let mut known: i64 = 0;
        for (i, &v) in sizes.iter().enumerate() {
            if v == -1 {
                if unknown.is_some() {
                    bail_invalid!("{op}: there can only be one -1 in size_splits");
                }
                unknown = Some(i);
            } else if v < 0 {
                bail_invalid!("{op}: split size at index {i} must be >= 0 (or -1), got {v}");
            } else {
                known = known.saturating_add(v);
            }
        }
        let dim = s[axis] as i64;
        if (unknown.is_none() && known != dim) || (unknown.is_some() && known > dim) {
            bail_invalid!(
                "{op}: determined shape must either match input shape along split_dim exactly \
                 if fully specified, or be less than the size of the input along split_dim if \
                 not fully specified. Got: {known} (split_dim {axis} has size {dim}, \
                 size_splits {sizes:?})"
            );
        }
        let mut out: Vec<usize> = sizes.iter().map(|&v| v.max(0) as usize).collect();
        if let Some(i) = unknown {
            out[i] = (dim - known) as usize;
        }
        Ok((axis, out))
    }
}

impl Kernel for SplitV {
    fn op(&self) -> &'static str {
        "SplitV"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (axis, sizes) = self.parse(inputs)?;
        Ok(piece_descs(inputs[0].desc(), axis, &sizes))
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (axis, sizes) = self.parse(inputs)?;
        let x = inputs[0].device("SplitV", 0)?;
        record_pieces(ctx, "SplitV", x, axis, &sizes, outputs)
    }
}

// ---- Tile ----

/// Tile(input, multiples).
struct Tile;

impl Tile {
    fn multiples(inputs: &[Operand]) -> Result<Vec<usize>> {
        let op = "Tile";
        check_arity(op, inputs, 2, "input, multiples")?;
        let rank = inputs[0].shape().len();
        let m = host_vector(op, "multiples", inputs[1].host(op, 1)?)?;
        if m.len() != rank {
            bail_invalid!(
                "{op}: expected multiples argument to be a vector of length {rank} (the rank of \
                 input, shape {}) but got length {}",
                fmt_shape(inputs[0].shape()),
                m.len()
            );
        }
        m.iter()
            .enumerate()
            .map(|(i, &v)| {
                if v < 0 {
                    bail_invalid!("{op}: expected multiples[{i}] >= 0, but got {v}");
                }
                Ok(v as usize)
            })
            .collect()
    }
}

impl Kernel for Tile {
    fn op(&self) -> &'static str {
        "Tile"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let m = Self::multiples(inputs)?;
        let out: Vec<usize> = inputs[0]
            .shape()
            .iter()
            .zip(&m)
            .map(|(a, b)| a * b)
            .collect();
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let m = Self::multiples(inputs)?;
        tile_into(ctx, inputs[0].device("Tile", 0)?, &m, &outputs[0])
    }
}

/// Records `out` = Tile(`x`, `m`) (`out` of `x`'s shape times `m`); also for the fused
/// elementwise kernel, which materializes a Tile that is not a broadcast this way.
pub(crate) fn tile_into(
    ctx: &KernelContext,
    x: &DeviceRef,
    m: &[usize],
    out: &DeviceRef,
) -> Result<()> {
    {
        let strides = strides_of(&x.desc.shape);
        let view = View {
            dims: x
                .desc
                .shape
                .iter()
                .zip(m)
                .zip(strides)
                .map(|((&n, &k), stride)| Dim {
                    size: n * k,
                    stride,
                    wrap: n,
                })
                .collect(),
            base: 0,
        };
        copy_all(ctx, "Tile", x, &view, out)
    }
}

// ---- BroadcastTo ----

/// BroadcastTo(input, shape).
struct BroadcastTo;

impl BroadcastTo {
    fn shape(inputs: &[Operand]) -> Result<Vec<usize>> {
        let op = "BroadcastTo";
        check_arity(op, inputs, 2, "input, shape")?;
        let want = host_vector(op, "shape", inputs[1].host(op, 1)?)?;
        if let Some(v) = want.iter().find(|&&v| v < 0) {
            bail_invalid!("{op}: shape must be non-negative, got {v} in {want:?}");
        }
        let out: Vec<usize> = want.iter().map(|&v| v as usize).collect();
        let s = inputs[0].shape();
        let ok = s.len() <= out.len()
            && s.iter()
                .zip(&out[out.len() - s.len()..])
                .all(|(&a, &b)| a == b || a == 1);
        if !ok {
            bail_invalid!(
                "{op}: unable to broadcast tensor of shape {} to tensor of shape {}",
                fmt_shape(s),
                fmt_shape(&out)
            );
        }
        Ok(out)
    }
}

impl Kernel for BroadcastTo {
    fn op(&self) -> &'static str {
        "BroadcastTo"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let out = Self::shape(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let out_shape = Self::shape(inputs)?;
        let x = inputs[0].device("BroadcastTo", 0)?;
        let s = &x.desc.shape;
        let strides = strides_of(s);
        let lead = out_shape.len() - s.len();
        let view = View {
            dims: out_shape
                .iter()
                .enumerate()
                .map(|(i, &size)| Dim {
                    size,
                    stride: if i >= lead && s[i - lead] == size {
                        strides[i - lead]
                    } else {
                        0
                    },
                    wrap: 0,
                })
                .collect(),
            base: 0,
        };
        copy_all(ctx, "BroadcastTo", x, &view, &outputs[0])
    }
}

// ---- ReverseV2 ----

/// ReverseV2(tensor, axis): reverses the listed dimensions; Reverse(tensor, dims), the older
/// op: reverses the dimensions whose `dims` entry is true.
struct Reverse {
    v1: bool,
}

impl Reverse {
    fn name(&self) -> &'static str {
        if self.v1 { "Reverse" } else { "ReverseV2" }
    }

    /// Reverse's `dims`: a bool vector with one entry per dimension.
    fn dims_v1(inputs: &[Operand]) -> Result<Vec<bool>> {
        let op = "Reverse";
        check_arity(op, inputs, 2, "tensor, dims")?;
        let rank = inputs[0].shape().len();
        let dims = inputs[1].host(op, 1)?;
        if dims.dtype != DType::Bool {
            bail_invalid!("{op}: dims must be bool, got {}", dims.dtype);
        }
        if dims.shape.len() != 1 {
            bail_invalid!("{op}: 'dims' must be 1-dimension, not {}", dims.shape.len());
        }
        if dims.shape[0] != rank {
            bail_invalid!(
                "{op}: 'dims' must have the same number of values as 'input' has dimensions. \
                 'input' has {rank}'dims' has {} values",
                dims.shape[0]
            );
        }
        if rank > 8 {
            bail_invalid!("{op}: reverse is not implemented for tensors of rank > 8.");
        }
        Ok(dims.bytes.iter().take(rank).map(|&b| b != 0).collect())
    }

    fn axes(&self, inputs: &[Operand]) -> Result<Vec<bool>> {
        if self.v1 {
            return Self::dims_v1(inputs);
        }
        let op = "ReverseV2";
        check_arity(op, inputs, 2, "tensor, axis")?;
        let rank = inputs[0].shape().len();
        let axes = host_vector(op, "axis", inputs[1].host(op, 1)?)?;
        let mut rev = vec![false; rank];
        for (i, &a) in axes.iter().enumerate() {
            let r = rank as i64;
            if a < -r || a >= r {
                bail_invalid!("{op}: 'axis'[{i}] = {a} is out of valid range [-{r}, {r})");
            }
            let c = if a < 0 { a + r } else { a } as usize;
            if rev[c] {
                bail_invalid!("{op}: axis {c} specified more than once");
            }
            rev[c] = true;
        }
        Ok(rev)
    }
}

impl Kernel for Reverse {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        self.axes(inputs)?;
        Ok(vec![inputs[0].desc()])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let rev = self.axes(inputs)?;
        let x = inputs[0].device(self.name(), 0)?;
        let s = &x.desc.shape;
        let strides = strides_of(s);
        let mut base = 0i64;
        let dims = s
            .iter()
            .zip(strides)
            .zip(&rev)
            .map(|((&size, stride), &r)| {
                if r && size > 0 {
                    base += (size as i64 - 1) * stride;
                    Dim {
                        size,
                        stride: -stride,
                        wrap: 0,
                    }
                } else {
                    Dim {
                        size,
                        stride,
                        wrap: 0,
                    }
                }
            })
            .collect();
        copy_all(ctx, self.name(), x, &View { dims, base }, &outputs[0])
    }
}
