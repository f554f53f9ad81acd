//! Host kernels: int32 shape arithmetic that TensorFlow keeps in host memory on a GPU.
//!
//! TensorFlow's CUDA build registers the int32 versions of ops such as StridedSlice, Pack and
//! Prod for the GPU with every argument in host memory and computes them on the CPU: int32
//! tensors in a GPU graph are shapes, sizes and indices, and their consumers (Reshape, Fill,
//! ...) need them on the host. Where TensorFlow offers such a kernel for every device
//! (DEVICE_DEFAULT) the plugin uses TensorFlow's; where it offers it only to its own GPU
//! device, the kernels below fill in, so shape arithmetic never waits for the GPU.

use crate::kernel::Attrs;
use crate::{DType, Error, HostTensor, Result, bail_invalid};

/// A kernel whose inputs and outputs all live in host memory.
pub trait HostKernel: Send + Sync {
    /// TensorFlow's op name.
    fn op(&self) -> &'static str;
    /// Computes the outputs from the inputs.
    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>>;
}

/// Builds a host kernel from a node's attributes.
pub type HostFactory = fn(&Attrs) -> Result<Box<dyn HostKernel>>;

/// One row of the host kernel table.
#[derive(Clone, Copy)]
pub struct HostOpDef {
    pub op: &'static str,
    /// The attribute constrained to `dtypes`.
    pub type_attr: &'static str,
    pub dtypes: &'static [DType],
    /// Every input and output argument name of the op's TensorFlow definition (all of them
    /// are placed in host memory).
    pub args: &'static [&'static str],
    pub factory: HostFactory,
}

/// The host kernel table.
pub const HOST_OPS: &[HostOpDef] = &[
    HostOpDef {
        op: "Pack",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["values", "output"],
        factory: |a| Ok(Box::new(Pack::new(a)?)),
    },
    HostOpDef {
        op: "Unpack",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["value", "output"],
        factory: |a| Ok(Box::new(Unpack::new(a)?)),
    },
    HostOpDef {
        op: "StridedSlice",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["input", "begin", "end", "strides", "output"],
        factory: |a| Ok(Box::new(StridedSliceHost::new(a)?)),
    },
    HostOpDef {
        op: "StatelessRandomGetKeyCounter",
        type_attr: "Tseed",
        dtypes: &[DType::I32, DType::I64],
        args: &["seed", "key", "counter"],
        factory: |_| Ok(Box::new(GetKeyCounter)),
    },
    HostOpDef {
        op: "StatelessRandomGetAlg",
        type_attr: "",
        dtypes: &[],
        args: &["alg"],
        factory: |_| Ok(Box::new(GetAlg)),
    },
    HostOpDef {
        op: "GatherV2",
        type_attr: "Tparams",
        dtypes: &[DType::I32],
        args: &["params", "indices", "axis", "output"],
        factory: |a| Ok(Box::new(GatherHost::new(a)?)),
    },
    HostOpDef {
        op: "DynamicStitch",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["indices", "data", "merged"],
        factory: |_| Ok(Box::new(DynamicStitchHost)),
    },
    HostOpDef {
        op: "SelectV2",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["condition", "t", "e", "output"],
        factory: |_| Ok(Box::new(SelectHost)),
    },
    HostOpDef {
        op: "Sum",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["input", "reduction_indices", "output"],
        factory: |a| Reduce::build("Sum", a),
    },
    HostOpDef {
        op: "Prod",
        type_attr: "T",
        dtypes: &[DType::I32],
        args: &["input", "reduction_indices", "output"],
        factory: |a| Reduce::build("Prod", a),
    },
];

/// Host kernels the plugin registers only under a kernel label, beside the op's device kernel
/// (which stays the default): a graph pass picks them for nodes whose inputs are all in host
/// memory (a loop's condition: `LogicalAnd` of two int32 comparisons, which TensorFlow
/// computes in host memory), so the result never goes to the GPU and back.
pub const LABELED_HOST_OPS: &[HostOpDef] = &[
    HostOpDef {
        op: "LogicalAnd",
        type_attr: "",
        dtypes: &[],
        args: &["x", "y", "z"],
        factory: |_| Ok(Box::new(Logical("LogicalAnd"))),
    },
    HostOpDef {
        op: "LogicalOr",
        type_attr: "",
        dtypes: &[],
        args: &["x", "y", "z"],
        factory: |_| Ok(Box::new(Logical("LogicalOr"))),
    },
    HostOpDef {
        op: "LogicalNot",
        type_attr: "",
        dtypes: &[],
        args: &["x", "y"],
        factory: |_| Ok(Box::new(Logical("LogicalNot"))),
    },
];

/// LogicalAnd, LogicalOr (NumPy broadcasting) and LogicalNot of bool tensors.
struct Logical(&'static str);

impl HostKernel for Logical {
    fn op(&self) -> &'static str {
        self.0
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = self.0;
        let arity = if op == "LogicalNot" { 1 } else { 2 };
        if inputs.len() != arity {
            bail_invalid!("{op} takes {arity} inputs, got {}", inputs.len());
        }
        for x in inputs {
            if x.dtype != DType::Bool {
                bail_invalid!("{op}: inputs must be bool, got {}", x.dtype);
            }
        }
        let (a, b) = (&inputs[0], inputs[inputs.len() - 1]);
        let bc =
            crate::kernels::elementwise::Broadcast::of(&[&a.shape, &b.shape]).ok_or_else(|| {
                crate::invalid_arg!(
                    "Incompatible shapes: {} vs. {}",
                    crate::kernels::elementwise::fmt_shape(&a.shape),
                    crate::kernels::elementwise::fmt_shape(&b.shape)
                )
            })?;
        let mut out = Vec::with_capacity(bc.num_elements());
        let (x, y) = (&a.bytes, &b.bytes);
        bc.for_each(|o| {
            let (p, q) = (x[o[0]] != 0, y[o[1]] != 0);
            out.push(match op {
                "LogicalAnd" => p && q,
                "LogicalOr" => p || q,
                _ => !p,
            } as u8);
        });
        Ok(vec![HostTensor {
            dtype: DType::Bool,
            shape: bc.out_shape,
            bytes: out,
        }])
    }
}

fn i32s(op: &str, t: &HostTensor, what: &str) -> Result<Vec<i32>> {
    if t.dtype != DType::I32 {
        bail_invalid!("{op}: {what} must be int32, got {}", t.dtype);
    }
    t.to_vec::<i32>()
}

/// Integer indices of a host tensor of int32 or int64 (axes, shapes): `HostTensor::to_i64_vec`
/// with an error naming the op and the argument.
pub fn index_values(op: &str, t: &HostTensor, what: &str) -> Result<Vec<i64>> {
    if !matches!(t.dtype, DType::I32 | DType::I64) {
        bail_invalid!("{op}: {what} must be int32 or int64, got {}", t.dtype);
    }
    t.to_i64_vec()
}

/// A possibly negative axis of a rank-`rank` tensor, checked.
fn axis_of(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        bail_invalid!("{op}: axis {axis} is out of range for rank {rank}");
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Pack: stacks N tensors of one shape along a new axis.
struct Pack {
    axis: i64,
}

impl Pack {
    fn new(a: &Attrs) -> Result<Self> {
        Ok(Pack {
            axis: a.int_or("axis", 0)?,
        })
    }
}

impl HostKernel for Pack {
    fn op(&self) -> &'static str {
        "Pack"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let Some(first) = inputs.first() else {
            bail_invalid!("Pack needs at least one input");
        };
        let shape = &first.shape;
        let axis = axis_of("Pack", self.axis, shape.len() + 1)?;
        let mut values = Vec::with_capacity(inputs.len());
        for (i, t) in inputs.iter().enumerate() {
            if &t.shape != shape {
                bail_invalid!(
                    "Pack: shapes of all inputs must match: values[0].shape = {:?} != \
                     values[{i}].shape = {:?}",
                    shape,
                    t.shape
                );
            }
            values.push(i32s("Pack", t, "values")?);
        }
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis..].iter().product();
        let mut out = Vec::with_capacity(outer * inner * inputs.len());
        for o in 0..outer {
            for v in &values {
                out.extend_from_slice(&v[o * inner..(o + 1) * inner]);
            }
        }
        let mut out_shape = shape.clone();
        out_shape.insert(axis, inputs.len());
        Ok(vec![HostTensor::new(&out, &out_shape)?])
    }
}

/// Unpack: splits a tensor along an axis into `num` tensors.
struct Unpack {
    axis: i64,
    num: usize,
}

impl Unpack {
    fn new(a: &Attrs) -> Result<Self> {
        Ok(Unpack {
            axis: a.int_or("axis", 0)?,
            num: a.int_or("num", 0)?.max(0) as usize,
        })
    }
}

impl HostKernel for Unpack {
    fn op(&self) -> &'static str {
        "Unpack"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let [x] = inputs else {
            bail_invalid!("Unpack takes 1 input, got {}", inputs.len());
        };
        if x.shape.is_empty() {
            bail_invalid!("Unpack: the input must have rank at least 1");
        }
        let axis = axis_of("Unpack", self.axis, x.shape.len())?;
        if x.shape[axis] != self.num {
            bail_invalid!(
                "Unpack: input.shape[{}] = {} does not match num = {}",
                self.axis,
                x.shape[axis],
                self.num
            );
        }
        let v = i32s("Unpack", x, "value")?;
        let outer: usize = x.shape[..axis].iter().product();
        let inner: usize = x.shape[axis + 1..].iter().product();
        let mut shape = x.shape.clone();
        shape.remove(axis);
        (0..self.num)
            .map(|k| {
                let mut out = Vec::with_capacity(outer * inner);
                for o in 0..outer {
                    let base = (o * self.num + k) * inner;
                    out.extend_from_slice(&v[base..base + inner]);
                }
                HostTensor::new(&out, &shape)
            })
            .collect()
    }
}

/// Sum / Prod of int32 over any axes (wrapping, as TensorFlow's int32 functors).
struct Reduce {
    op: &'static str,
    keep_dims: bool,
}

impl Reduce {
    fn build(op: &'static str, a: &Attrs) -> Result<Box<dyn HostKernel>> {
        Ok(Box::new(Reduce {
            op,
            keep_dims: a.bool_or("keep_dims", false)?,
        }))
    }
}

impl HostKernel for Reduce {
    fn op(&self) -> &'static str {
        self.op
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = self.op;
        let [x, axes] = inputs else {
            bail_invalid!("{op} takes 2 inputs, got {}", inputs.len());
        };
        let v = i32s(op, x, "input")?;
        let rank = x.shape.len();
        let mut reduced = vec![false; rank];
        for a in index_values(op, axes, "reduction_indices")? {
            if a < -(rank as i64) || a >= rank as i64 {
                bail_invalid!(
                    "{op}: invalid reduction dimension ({a} for input with {rank} dimension(s))"
                );
            }
            reduced[if a < 0 { a + rank as i64 } else { a } as usize] = true;
        }
        let out_full: Vec<usize> = (0..rank)
            .map(|d| if reduced[d] { 1 } else { x.shape[d] })
            .collect();
        let n_out: usize = out_full.iter().product();
        let init = if op == "Prod" { 1i32 } else { 0 };
        let mut out = vec![init; n_out];
        // Walk the input in order, mapping each index to its output position.
        let mut idx = vec![0usize; rank];
        for &value in &v {
            let mut o = 0;
            for d in 0..rank {
                o = o * out_full[d] + if reduced[d] { 0 } else { idx[d] };
            }
            out[o] = if op == "Prod" {
                out[o].wrapping_mul(value)
            } else {
                out[o].wrapping_add(value)
            };
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < x.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        let shape: Vec<usize> = if self.keep_dims {
            out_full
        } else {
            (0..rank)
                .filter(|&d| !reduced[d])
                .map(|d| x.shape[d])
                .collect()
        };
        Ok(vec![HostTensor::new(&out, &shape)?])
    }
}

/// GatherV2 of int32 (dimensions picked from a shape: Keras's batch-norm moments and global
/// pooling count their reduced elements as `Prod(GatherV2(Shape(x), axes))` when the batch size
/// is not known when the graph is built). The shape is in host memory and so is its consumer:
/// a device kernel here had the GPU read its result back twice per batch norm and step. (A
/// choice of this plugin: TensorFlow's CUDA build gathers int32 on the GPU.) The runtime's
/// device kernel for int32 data is registered under a label that the graph pass gives to
/// gathers of GPU-computed tensors. Out-of-range indices are an error, as on TensorFlow's CPU.
struct GatherHost {
    batch_dims: i64,
}

impl GatherHost {
    fn new(a: &Attrs) -> Result<Self> {
        Ok(GatherHost {
            batch_dims: a.int_or("batch_dims", 0)?,
        })
    }
}

impl HostKernel for GatherHost {
    fn op(&self) -> &'static str {
        "GatherV2"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = "GatherV2";
        let [params, indices, axis] = inputs else {
            bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
        };
        let g = crate::kernels::slice::gather::geometry(
            self.batch_dims,
            &params.shape,
            &indices.shape,
            indices.dtype,
            axis,
        )?;
        let p = i32s(op, params, "params")?;
        let idx = index_values(op, indices, "indices")?;
        let mut out = Vec::with_capacity(g.out.iter().product());
        if g.inner == 0 {
            // Empty slices: nothing to gather, and TensorFlow checks no index either.
            return Ok(vec![HostTensor::new(&out, &g.out)?]);
        }
        for b in 0..g.batch {
            for o in 0..g.outer {
                for j in 0..g.k {
                    let flat = b * g.k + j;
                    let i = idx[flat];
                    if i < 0 || i >= g.gather_n as i64 {
                        // TensorFlow names the index by its position in the indices' shape.
                        let mut at = vec![0usize; indices.shape.len()];
                        let mut r = flat;
                        for d in (0..at.len()).rev() {
                            at[d] = r % indices.shape[d];
                            r /= indices.shape[d];
                        }
                        let at: Vec<String> = at.iter().map(|v| v.to_string()).collect();
                        bail_invalid!(
                            "{op}: indices[{}] = {i} is not in [0, {})",
                            at.join(","),
                            g.gather_n
                        );
                    }
                    let src = ((b * g.outer + o) * g.gather_n + i as usize) * g.inner;
                    out.extend_from_slice(&p[src..src + g.inner]);
                }
            }
        }
        Ok(vec![HostTensor::new(&out, &g.out)?])
    }
}

/// DynamicStitch of int32 (shapes): TensorFlow's gradient of a sum or mean with unknown
/// dimensions builds the kept-dimensions shape as `DynamicStitch([range(rank), axes],
/// [Shape(x), ones])`. With no kernel on the device, TensorFlow placed it on the CPU, and with
/// it the `Shape` that feeds it, which then copied all of `x` to the host (a read that waits for
/// the GPU) to learn its shape: once per step in the gradient of every global average pooling
/// of a Keras model with an unknown batch size. Here every argument is in host memory (a
/// choice: TensorFlow's CUDA kernel keeps only the indices there).
struct DynamicStitchHost;

impl HostKernel for DynamicStitchHost {
    fn op(&self) -> &'static str {
        "DynamicStitch"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = "DynamicStitch";
        if inputs.is_empty() || !inputs.len().is_multiple_of(2) {
            bail_invalid!(
                "{op} takes N indices and N data tensors, got {}",
                inputs.len()
            );
        }
        let (indices, data) = inputs.split_at(inputs.len() / 2);
        let mut lists = Vec::with_capacity(indices.len());
        let mut max_index: i64 = -1;
        for (i, (ind, d)) in indices.iter().zip(data).enumerate() {
            if ind.dtype != DType::I32 {
                bail_invalid!("{op}: indices[{i}] must be int32, got {}", ind.dtype);
            }
            if !d.shape.starts_with(&ind.shape) {
                bail_invalid!(
                    "{op}: data[{i}].shape = {:?} does not start with indices[{i}].shape = {:?}",
                    d.shape,
                    ind.shape
                );
            }
            let v = i32s(op, ind, "indices")?;
            if let Some(&bad) = v.iter().find(|&&x| x < 0) {
                bail_invalid!("{op}: indices[{i}] holds {bad}, which is negative");
            }
            max_index = max_index.max(v.iter().copied().max().map_or(-1, i64::from));
            lists.push((v, i32s(op, d, "data")?, &d.shape[ind.shape.len()..]));
        }
        let inner_shape = lists[0].2;
        if lists.iter().any(|l| l.2 != inner_shape) {
            bail_invalid!("{op}: the data tensors' slices differ in shape");
        }
        let inner: usize = inner_shape.iter().product();
        let rows = (max_index + 1) as usize;
        let mut out: Vec<i32> = Vec::new();
        // At most 2^31 - 1 elements (a shape-sized result; the largest a host int32 tensor
        // here is given), and only if the memory is there.
        let total = rows
            .checked_mul(inner)
            .filter(|&n| n <= i32::MAX as usize && out.try_reserve_exact(n).is_ok());
        let Some(total) = total else {
            bail_invalid!("{op}: an output of {rows} rows of {inner} elements is too large");
        };
        out.resize(total, 0);
        // Later lists overwrite earlier ones where indices repeat, as TensorFlow's kernel does.
        for (ind, d, _) in &lists {
            for (j, &at) in ind.iter().enumerate() {
                let at = at as usize;
                out[at * inner..(at + 1) * inner].copy_from_slice(&d[j * inner..(j + 1) * inner]);
            }
        }
        let mut shape = vec![rows];
        shape.extend_from_slice(inner_shape);
        Ok(vec![HostTensor::new(&out, &shape)?])
    }
}

/// SelectV2 of int32 with NumPy broadcasting: Keras's `Embedding` remaps negative ids as
/// `where(ids < 0, ids + n, ids)` on the ids the input pipeline delivers (host memory), and a
/// host-memory Reshape takes the result; on the device, that was a read of the GPU every step.
/// A select of GPU-computed data keeps the device kernel through the graph pass's label.
struct SelectHost;

impl HostKernel for SelectHost {
    fn op(&self) -> &'static str {
        "SelectV2"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = "SelectV2";
        let [c, t, e] = inputs else {
            bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
        };
        if c.dtype != DType::Bool {
            bail_invalid!("{op}: condition must be bool, got {}", c.dtype);
        }
        // The elementwise kernels' broadcast: merged dimensions, each input's strides.
        let Some(bc) = crate::kernels::elementwise::Broadcast::of(&[&c.shape, &t.shape, &e.shape])
        else {
            bail_invalid!(
                "{op}: condition {:?}, then {:?} and else {:?} are not broadcastable",
                c.shape,
                t.shape,
                e.shape
            );
        };
        let (cv, tv, ev) = (c.to_vec::<u8>()?, i32s(op, t, "t")?, i32s(op, e, "e")?);
        let mut out = Vec::with_capacity(bc.num_elements());
        bc.for_each(|o| out.push(if cv[o[0]] != 0 { tv[o[1]] } else { ev[o[2]] }));
        let out_shape = bc.out_shape;
        Ok(vec![HostTensor::new(&out, &out_shape)?])
    }
}

/// StridedSlice of int32 (shapes): the slice computed with TensorFlow's rules
/// (`kernels::slice::spec`), then gathered.
struct StridedSliceHost {
    masks: crate::kernels::slice::spec::Masks,
}

impl StridedSliceHost {
    fn new(a: &Attrs) -> Result<Self> {
        Ok(StridedSliceHost {
            masks: crate::kernels::slice::spec::Masks {
                begin: a.int_or("begin_mask", 0)?,
                end: a.int_or("end_mask", 0)?,
                ellipsis: a.int_or("ellipsis_mask", 0)?,
                new_axis: a.int_or("new_axis_mask", 0)?,
                shrink_axis: a.int_or("shrink_axis_mask", 0)?,
            },
        })
    }
}

impl HostKernel for StridedSliceHost {
    fn op(&self) -> &'static str {
        "StridedSlice"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = "StridedSlice";
        let [x, b, e, st] = inputs else {
            bail_invalid!("{op} takes 4 inputs, got {}", inputs.len());
        };
        let spec = crate::kernels::slice::spec::strided_slice_spec(
            &x.shape,
            &index_values(op, b, "begin")?,
            &index_values(op, e, "end")?,
            &index_values(op, st, "strides")?,
            self.masks,
        )
        .map_err(|err| match err {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{op}: {m}")),
            other => other,
        })?;
        let v = i32s(op, x, "input")?;
        let rank = x.shape.len();
        let mut in_strides = vec![1i64; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            in_strides[d] = in_strides[d + 1] * x.shape[d + 1] as i64;
        }
        let n: usize = spec.processing.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            let mut at = 0i64;
            for d in 0..rank {
                at += (spec.begin[d] + idx[d] as i64 * spec.stride[d]) * in_strides[d];
            }
            out.push(v[at as usize]);
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < spec.processing[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(vec![HostTensor::new(&out, &spec.final_shape)?])
    }
}

/// The key and counter TensorFlow's stateless random ops derive from a seed (as its GPU
/// kernel, in host memory): uint64 key [1] and counter [2] from the Philox words.
struct GetKeyCounter;

impl HostKernel for GetKeyCounter {
    fn op(&self) -> &'static str {
        "StatelessRandomGetKeyCounter"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        let op = self.op();
        let [seed] = inputs else {
            bail_invalid!("{op} takes 1 input, got {}", inputs.len());
        };
        let s = index_values(op, seed, "seed")?;
        if seed.shape != [2] {
            bail_invalid!("{op}: seed must have shape [2], not {:?}", seed.shape);
        }
        let (k, c) = crate::kernels::random::philox::key_counter_from_seed(s[0], s[1]);
        let word = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
        Ok(vec![
            HostTensor::new(&[word(k[0], k[1])], &[1])?,
            HostTensor::new(&[word(c[0], c[1]), word(c[2], c[3])], &[2])?,
        ])
    }
}

/// The algorithm TensorFlow's stateless random ops use on this device: Philox, the one the
/// runtime's random kernels implement.
struct GetAlg;

impl HostKernel for GetAlg {
    fn op(&self) -> &'static str {
        "StatelessRandomGetAlg"
    }

    fn compute(&self, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
        if !inputs.is_empty() {
            bail_invalid!("StatelessRandomGetAlg takes no inputs");
        }
        Ok(vec![HostTensor::new(
            &[crate::kernels::random::RNG_ALG_PHILOX as i32],
            &[],
        )?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;

    fn t(v: &[i32], s: &[usize]) -> HostTensor {
        HostTensor::new(v, s).unwrap()
    }

    fn build(op: &str, a: &Attrs) -> Box<dyn HostKernel> {
        let def = HOST_OPS.iter().find(|d| d.op == op).unwrap();
        (def.factory)(a).unwrap()
    }

    #[test]
    fn logical_ops_broadcast_like_tensorflow() {
        let b = |v: &[u8], s: &[usize]| HostTensor {
            dtype: DType::Bool,
            shape: s.to_vec(),
            bytes: v.to_vec(),
        };
        let k = |op: &str| {
            let def = LABELED_HOST_OPS.iter().find(|d| d.op == op).unwrap();
            (def.factory)(&Attrs::new()).unwrap()
        };
        // A loop's condition: two scalars.
        let o = k("LogicalAnd")
            .compute(&[&b(&[1], &[]), &b(&[0], &[])])
            .unwrap();
        assert_eq!((o[0].shape.clone(), o[0].bytes.clone()), (vec![], vec![0]));
        // [2, 1] with [3]: [2, 3].
        let (x, y) = (b(&[1, 0], &[2, 1]), b(&[1, 0, 1], &[3]));
        let o = k("LogicalAnd").compute(&[&x, &y]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].bytes.clone()),
            (vec![2, 3], vec![1, 0, 1, 0, 0, 0])
        );
        let o = k("LogicalOr").compute(&[&x, &y]).unwrap();
        assert_eq!(o[0].bytes, vec![1, 1, 1, 1, 0, 1]);
        let o = k("LogicalNot").compute(&[&y]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].bytes.clone()),
            (vec![3], vec![0, 1, 0])
        );
        // Empty, TensorFlow's error, and a non-bool input.
        let o = k("LogicalOr")
            .compute(&[&b(&[], &[0]), &b(&[1], &[1])])
            .unwrap();
        assert_eq!(o[0].shape, vec![0]);
        let e = k("LogicalAnd")
            .compute(&[&b(&[1, 1], &[2]), &y])
            .unwrap_err();
        assert!(
            e.to_string().contains("Incompatible shapes: [2] vs. [3]"),
            "{e}"
        );
        assert!(k("LogicalNot").compute(&[&t(&[1], &[1])]).is_err());
    }

    #[test]
    fn gather_of_shapes() {
        let axis = |v: i32| t(&[v], &[]);
        let k = build("GatherV2", &Attrs::new());
        // Keras's moments: the reduced dimensions of an NHWC shape.
        let shape = t(&[64, 28, 28, 16], &[4]);
        let o = k
            .compute(&[&shape, &t(&[0, 1, 2], &[3]), &axis(0)])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![3], vec![64, 28, 28])
        );
        // int64 indices, a scalar index, axis 1 of a matrix, negative axis.
        let i64s = HostTensor::new(&[2i64, 0], &[2]).unwrap();
        let m = t(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let o = k.compute(&[&m, &i64s, &axis(1)]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2, 2], vec![3, 1, 6, 4])
        );
        let o = k.compute(&[&m, &t(&[1], &[]), &axis(-2)]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![3], vec![4, 5, 6])
        );
        // batch_dims 1: row b picks its own columns.
        let kb = build(
            "GatherV2",
            &Attrs::new().with("batch_dims", AttrValue::Int(1)),
        );
        let o = kb
            .compute(&[&m, &t(&[2, 2, 0, 1], &[2, 2]), &axis(1)])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2, 2], vec![3, 3, 4, 5])
        );
        // Out of range, as TensorFlow's CPU kernel: an error naming the index's position.
        let e = k.compute(&[&shape, &t(&[4], &[1]), &axis(0)]).unwrap_err();
        assert!(
            e.to_string().contains("indices[0] = 4 is not in [0, 4)"),
            "{e}"
        );
        let e = k
            .compute(&[&shape, &t(&[0, 1, 2, 9], &[2, 2]), &axis(0)])
            .unwrap_err();
        assert!(
            e.to_string().contains("indices[1,1] = 9 is not in [0, 4)"),
            "{e}"
        );
        // Empty slices: no index is checked (TensorFlow's CPU kernel), the result is empty.
        let o = k
            .compute(&[&t(&[], &[3, 0]), &t(&[5], &[1]), &axis(0)])
            .unwrap();
        assert_eq!(o[0].shape, vec![1, 0]);
        assert!(k.compute(&[&shape, &t(&[-1], &[1]), &axis(0)]).is_err());
        assert!(k.compute(&[&shape, &t(&[0], &[1]), &axis(1)]).is_err());
        // Empty index lists give empty results.
        let o = k.compute(&[&shape, &t(&[], &[0]), &axis(0)]).unwrap();
        assert_eq!(o[0].shape, vec![0]);
    }

    #[test]
    fn select_with_broadcasting() {
        let k = build("SelectV2", &Attrs::new());
        let b = |v: &[bool], s: &[usize]| HostTensor::from_bools(v, s).unwrap();
        // Keras's id remap: where(ids < 0, ids + n, ids).
        let ids = t(&[3, -1, 0, -2], &[2, 2]);
        let o = k
            .compute(&[
                &b(&[false, true, false, true], &[2, 2]),
                &t(&[13, 9, 10, 8], &[2, 2]),
                &ids,
            ])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2, 2], vec![3, 9, 0, 8])
        );
        // A row condition, a scalar else, a column then.
        let o = k
            .compute(&[
                &b(&[true, false, true], &[3]),
                &t(&[1, 2], &[2, 1]),
                &t(&[7], &[]),
            ])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2, 3], vec![1, 7, 1, 2, 7, 2])
        );
        assert!(
            k.compute(&[
                &b(&[true, false], &[2]),
                &t(&[1, 2, 3], &[3]),
                &t(&[0], &[])
            ])
            .is_err()
        );
        // Empty results.
        let o = k
            .compute(&[&b(&[], &[0]), &t(&[1], &[1]), &t(&[0], &[])])
            .unwrap();
        assert_eq!(o[0].shape, vec![0]);
    }

    #[test]
    fn dynamic_stitch_of_shapes() {
        let k = build("DynamicStitch", &Attrs::new());
        // The kept-dimensions shape of a mean over axes 1 and 2 of an NHWC tensor.
        let o = k
            .compute(&[
                &t(&[0, 1, 2, 3], &[4]),
                &t(&[1, 2], &[2]),
                &t(&[64, 14, 14, 16], &[4]),
                &t(&[1, 1], &[2]),
            ])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![4], vec![64, 1, 1, 16])
        );
        // Slices of rank 1, a matrix of indices, unset rows stay zero.
        let o = k
            .compute(&[
                &t(&[3, 0], &[2]),
                &t(&[5], &[1, 1]),
                &t(&[1, 2, 3, 4], &[2, 2]),
                &t(&[9, 9], &[1, 1, 2]),
            ])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![6, 2], vec![3, 4, 0, 0, 0, 0, 1, 2, 0, 0, 9, 9])
        );
        assert!(k.compute(&[&t(&[-1], &[1]), &t(&[1], &[1])]).is_err());
        assert!(k.compute(&[&t(&[0, 1], &[2]), &t(&[1], &[1])]).is_err());
        assert!(k.compute(&[&t(&[0], &[1])]).is_err());
        // An index too large for memory is an error, not an abort.
        assert!(
            k.compute(&[&t(&[i32::MAX - 1], &[1]), &t(&[1, 2, 3, 4], &[1, 4])])
                .is_err()
        );
    }

    #[test]
    fn pack_and_unpack() {
        let a = t(&[1, 2, 3], &[3]);
        let b = t(&[4, 5, 6], &[3]);
        let k = build("Pack", &Attrs::new());
        let o = k.compute(&[&a, &b]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2, 3], vec![1, 2, 3, 4, 5, 6])
        );
        let k = build("Pack", &Attrs::new().with("axis", AttrValue::Int(-1)));
        let o = k.compute(&[&a, &b]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![3, 2], vec![1, 4, 2, 5, 3, 6])
        );
        // Scalars stack to a vector (the usual shape-building case).
        let o = build("Pack", &Attrs::new())
            .compute(&[&t(&[7], &[]), &t(&[9], &[])])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2], vec![7, 9])
        );
        assert!(
            build("Pack", &Attrs::new())
                .compute(&[&a, &t(&[1], &[1])])
                .is_err()
        );
        assert!(
            build("Pack", &Attrs::new().with("axis", AttrValue::Int(3)))
                .compute(&[&a])
                .is_err()
        );

        let x = t(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let k = build(
            "Unpack",
            &Attrs::new()
                .with("num", AttrValue::Int(3))
                .with("axis", AttrValue::Int(1)),
        );
        let o = k.compute(&[&x]).unwrap();
        let got: Vec<Vec<i32>> = o.iter().map(|t| t.to_vec().unwrap()).collect();
        assert_eq!(got, vec![vec![1, 4], vec![2, 5], vec![3, 6]]);
        assert!(o.iter().all(|t| t.shape == vec![2]));
        let k = build("Unpack", &Attrs::new().with("num", AttrValue::Int(3)));
        assert!(k.compute(&[&x]).is_err());
    }

    #[test]
    fn strided_slice_of_shapes() {
        let x = t(&[2, 3, 4, 5], &[4]);
        let one = |v: i32| t(&[v], &[1]);
        // s[0] (shrink), s[1:] , s[::-2].
        let shrink = Attrs::new().with("shrink_axis_mask", AttrValue::Int(1));
        let o = build("StridedSlice", &shrink)
            .compute(&[&x, &one(0), &one(1), &one(1)])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![], vec![2])
        );
        let o = build(
            "StridedSlice",
            &Attrs::new().with("end_mask", AttrValue::Int(1)),
        )
        .compute(&[&x, &one(1), &one(0), &one(1)])
        .unwrap();
        assert_eq!(o[0].to_vec::<i32>().unwrap(), vec![3, 4, 5]);
        let all = Attrs::new()
            .with("begin_mask", AttrValue::Int(1))
            .with("end_mask", AttrValue::Int(1));
        let o = build("StridedSlice", &all)
            .compute(&[&x, &one(0), &one(0), &one(-2)])
            .unwrap();
        assert_eq!(o[0].to_vec::<i32>().unwrap(), vec![5, 3]);
        // 2-D with a negative index, as x[:, -1].
        let m = t(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let two = |a: i32, b: i32| t(&[a, b], &[2]);
        let a = Attrs::new()
            .with("begin_mask", AttrValue::Int(1))
            .with("end_mask", AttrValue::Int(1))
            .with("shrink_axis_mask", AttrValue::Int(2));
        let o = build("StridedSlice", &a)
            .compute(&[&m, &two(0, -1), &two(0, 0), &two(1, 1)])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2], vec![3, 6])
        );
        assert!(
            build("StridedSlice", &shrink)
                .compute(&[&x, &one(7), &one(8), &one(1)])
                .is_err()
        );
        assert!(
            build("StridedSlice", &Attrs::new())
                .compute(&[&x, &one(0), &one(1), &one(0)])
                .is_err()
        );
    }

    #[test]
    fn key_counter_and_alg() {
        let seed = HostTensor::new(&[7i64, -3], &[2]).unwrap();
        let o = build("StatelessRandomGetKeyCounter", &Attrs::new())
            .compute(&[&seed])
            .unwrap();
        let (k, c) = crate::kernels::random::philox::key_counter_from_seed(7, -3);
        assert_eq!(
            o[0].to_vec::<u64>().unwrap(),
            vec![k[0] as u64 | (k[1] as u64) << 32]
        );
        assert_eq!(
            o[1].to_vec::<u64>().unwrap(),
            vec![0, c[2] as u64 | (c[3] as u64) << 32]
        );
        let seed32 = t(&[7, -3], &[2]);
        let o32 = build("StatelessRandomGetKeyCounter", &Attrs::new())
            .compute(&[&seed32])
            .unwrap();
        assert_eq!(o32, o);
        assert!(
            build("StatelessRandomGetKeyCounter", &Attrs::new())
                .compute(&[&t(&[1], &[1])])
                .is_err()
        );
        let a = build("StatelessRandomGetAlg", &Attrs::new())
            .compute(&[])
            .unwrap();
        assert_eq!(a[0].to_vec::<i32>().unwrap(), vec![1]);
    }

    #[test]
    fn sum_and_prod() {
        let x = t(&[1, 2, 3, 4, 5, 6], &[2, 3]);
        let axes = t(&[1], &[1]);
        let o = build("Sum", &Attrs::new()).compute(&[&x, &axes]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2], vec![6, 15])
        );
        let keep = Attrs::new().with("keep_dims", AttrValue::Bool(true));
        let o = build("Prod", &keep).compute(&[&x, &t(&[0], &[])]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![1, 3], vec![4, 10, 18])
        );
        let all = HostTensor::new(&[0i64, -1], &[2]).unwrap();
        let o = build("Prod", &Attrs::new()).compute(&[&x, &all]).unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![], vec![720])
        );
        // No axes: the identity; an empty input: the neutral element.
        let o = build("Sum", &Attrs::new())
            .compute(&[&x, &t(&[], &[0])])
            .unwrap();
        assert_eq!(o[0].to_vec::<i32>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
        let o = build("Prod", &Attrs::new())
            .compute(&[&t(&[], &[0, 2]), &t(&[0], &[1])])
            .unwrap();
        assert_eq!(
            (o[0].shape.clone(), o[0].to_vec::<i32>().unwrap()),
            (vec![2], vec![1, 1])
        );
        // Wrapping.
        let o = build("Sum", &Attrs::new())
            .compute(&[&t(&[i32::MAX, 1], &[2]), &t(&[0], &[])])
            .unwrap();
        assert_eq!(o[0].to_vec::<i32>().unwrap(), vec![i32::MIN]);
        assert!(
            build("Sum", &Attrs::new())
                .compute(&[&x, &t(&[2], &[])])
                .is_err()
        );
    }
}
