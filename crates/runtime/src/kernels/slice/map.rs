//! Slice, StridedSlice, StridedSliceGrad, Pad, PadV2 and MirrorPad: one index-map shader
//! (`map.wgsl`) whose per-dimension begin/stride/bounds come from the host.

use super::spec::{Masks, StridedSpec, strided_slice_spec};
use super::{MAX_RANK, Pads, dispatch_words, fmt_shape, load_fn, pack8, strides_of, u32_of};
use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernels::fill::pattern_of;
use crate::{AttrValue, Error, HostTensor, Result, bail_invalid};

const MAP_WGSL: &str = include_str!("map.wgsl");

const CONSTANT: u32 = 0;
const REFLECT: u32 = 1;
const SYMMETRIC: u32 = 2;
const INVERSE: u32 = 3;

/// One dimension of an index map.
#[derive(Clone, Copy, Debug)]
struct Dim {
    out: usize,
    begin: i64,
    stride: i64,
    input: usize,
    in_stride: usize,
}

/// A whole index map: output dims over input dims, the mode and the fill value.
struct Plan {
    dims: Vec<Dim>,
    mode: u32,
    fill: (u32, u32),
}

impl Plan {
    fn new(out: &[usize], begin: &[i64], stride: &[i64], input: &[usize], mode: u32) -> Self {
        let in_strides = strides_of(input);
        let dims = (0..out.len())
            .map(|d| Dim {
                out: out[d],
                begin: begin[d],
                // A dimension with one output element only uses its begin; a step that
                // does not fit the shader's i32 cannot matter there.
                stride: if out[d] <= 1 && mode != INVERSE {
                    1
                } else if input[d] <= 1 && mode == INVERSE {
                    stride[d].signum()
                } else {
                    stride[d]
                },
                input: input[d],
                in_stride: in_strides[d],
            })
            .collect();
        Plan {
            dims,
            mode,
            fill: (0, 0),
        }
    }

    /// Records the map from `x` to `out`.
    fn record(&self, ctx: &KernelContext, op: &str, x: &DeviceRef, out: &DeviceRef) -> Result<()> {
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        // Dimensions of one output element that read a fixed in-range input index fold into
        // the base offset.
        let mut base = 0usize;
        let mut dims = vec![];
        for d in &self.dims {
            if d.out == 1 && self.mode != INVERSE && d.begin >= 0 && (d.begin as usize) < d.input {
                base += d.begin as usize * d.in_stride;
            } else {
                dims.push(*d);
            }
        }
        if dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{op}: more than {MAX_RANK} dimensions that are not of size 1"
            )));
        }
        let fits_i32 = |v: i64| i32::try_from(v).is_ok();
        for d in &dims {
            if !fits_i32(d.begin)
                || !fits_i32(d.stride)
                || !fits_i32(d.input as i64)
                || !fits_i32(d.out as i64)
            {
                return Err(Error::Unimplemented(format!(
                    "{op}: a dimension of {} or {} elements is too large",
                    d.out, d.input
                )));
            }
        }
        u32_of(op, "input size", x.desc.num_elements())?;
        let mut params = vec![
            0,
            0,
            0,
            dims.len() as u32,
            self.mode,
            self.fill.0,
            self.fill.1,
            base as u32,
        ];
        params.extend(pack8(dims.iter().map(|d| d.out as u32)));
        params.extend(pack8(dims.iter().map(|d| d.begin as i32 as u32)));
        params.extend(pack8(dims.iter().map(|d| d.stride as i32 as u32)));
        params.extend(pack8(dims.iter().map(|d| d.input as u32)));
        params.extend(pack8(dims.iter().map(|d| d.in_stride as u32)));
        let esize = out.desc.dtype.size();
        let xb = ctx.bind(x)?;
        let ob = super::bind_out(ctx, op, out)?;
        dispatch_words(
            ctx,
            "map",
            || format!("{MAP_WGSL}\n{}", load_fn("x", esize)),
            &mut params,
            &[ob, xb],
            n,
            out.desc.dtype,
        )
    }
}

/// Integer contents of a host input that must be a vector of `len` elements.
fn host_vec(op: &str, t: &HostTensor, name: &str) -> Result<Vec<i64>> {
    if t.shape.len() != 1 {
        bail_invalid!(
            "{op}: {name} must be a vector, got shape {}",
            fmt_shape(&t.shape)
        );
    }
    t.to_i64_vec()
        .map_err(|e| Error::InvalidArgument(format!("{op}: {name}: {e}")))
}

fn count(op: &str, inputs: &[Operand], n: usize) -> Result<()> {
    if inputs.len() != n {
        bail_invalid!("{op} takes {n} inputs, got {}", inputs.len());
    }
    Ok(())
}

fn out_ref<'a>(op: &str, outputs: &'a [DeviceRef]) -> Result<&'a DeviceRef> {
    outputs
        .first()
        .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))
}

/// Slice(input, begin, size).
pub(super) struct Slice;

impl Slice {
    fn check(inputs: &[Operand]) -> Result<(Vec<i64>, Vec<usize>)> {
        count("Slice", inputs, 3)?;
        let shape = inputs[0].shape();
        let begin = inputs[1].host("Slice", 1)?;
        let size = inputs[2].host("Slice", 2)?;
        let r = shape.len();
        if begin.shape.len() != 1 || size.shape.len() != 1 || begin.len() != r || size.len() != r {
            bail_invalid!(
                "Slice: Expected begin and size arguments to be 1-D tensors of size {r}, but got shapes {} and {} instead.",
                fmt_shape(&begin.shape),
                fmt_shape(&size.shape)
            );
        }
        let b = begin.to_i64_vec()?;
        let s = size.to_i64_vec()?;
        let mut out = vec![];
        for i in 0..r {
            let dim = shape[i] as i64;
            if b[i] < 0 || b[i] > dim {
                bail_invalid!("Slice: Expected begin[{i}] in [0, {dim}], but got {}", b[i]);
            }
            let si = if s[i] == -1 { dim - b[i] } else { s[i] };
            if si < 0 || si > dim - b[i] {
                bail_invalid!(
                    "Slice: Expected size[{i}] in [0, {}], but got {}",
                    dim - b[i],
                    s[i]
                );
            }
            out.push(si as usize);
        }
        Ok((b, out))
    }
}

impl Kernel for Slice {
    fn op(&self) -> &'static str {
        "Slice"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, size) = Slice::check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &size)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (begin, size) = Slice::check(inputs)?;
        let x = inputs[0].device("Slice", 0)?;
        let ones = vec![1; size.len()];
        Plan::new(&size, &begin, &ones, &x.desc.shape, CONSTANT).record(
            ctx,
            "Slice",
            x,
            out_ref("Slice", outputs)?,
        )
    }
}

/// StridedSlice(input, begin, end, strides) and StridedSliceGrad(shape, begin, end, strides,
/// dy).
pub(super) struct StridedSlice {
    masks: Masks,
    grad: bool,
}

impl StridedSlice {
    pub fn build(a: &Attrs, grad: bool) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(StridedSlice {
            masks: Masks {
                begin: a.int_or("begin_mask", 0)?,
                end: a.int_or("end_mask", 0)?,
                ellipsis: a.int_or("ellipsis_mask", 0)?,
                new_axis: a.int_or("new_axis_mask", 0)?,
                shrink_axis: a.int_or("shrink_axis_mask", 0)?,
            },
            grad,
        }))
    }

    fn name(&self) -> &'static str {
        if self.grad {
            "StridedSliceGrad"
        } else {
            "StridedSlice"
        }
    }

    /// The input (or gradient output) shape and the spec.
    fn check(&self, inputs: &[Operand]) -> Result<(Vec<usize>, StridedSpec)> {
        let op = self.name();
        count(op, inputs, if self.grad { 5 } else { 4 })?;
        let first = 1;
        let shape: Vec<usize> = if self.grad {
            let s = host_vec(op, inputs[0].host(op, 0)?, "shape")?;
            if s.iter().any(|&d| d < 0) {
                bail_invalid!("{op}: shape must be non-negative, got {s:?}");
            }
            s.iter().map(|&d| d as usize).collect()
        } else {
            inputs[0].shape().to_vec()
        };
        let b = inputs[first].host(op, first)?;
        let e = inputs[first + 1].host(op, first + 1)?;
        let s = inputs[first + 2].host(op, first + 2)?;
        if b.shape.len() != 1 || e.shape != b.shape || s.shape != b.shape {
            bail_invalid!(
                "{op}: Expected begin, end, and strides to be 1D equal size tensors, but got shapes {}, {}, and {} instead.",
                fmt_shape(&b.shape),
                fmt_shape(&e.shape),
                fmt_shape(&s.shape)
            );
        }
        let spec = strided_slice_spec(
            &shape,
            &b.to_i64_vec()?,
            &e.to_i64_vec()?,
            &s.to_i64_vec()?,
            self.masks,
        )
        .map_err(|err| match err {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{op}: {m}")),
            other => other,
        })?;
        if self.grad && inputs[4].shape() != spec.final_shape.as_slice() {
            bail_invalid!(
                "{op}: shape of dy was {} instead of {}",
                fmt_shape(inputs[4].shape()),
                fmt_shape(&spec.final_shape)
            );
        }
        Ok((shape, spec))
    }
}

impl Kernel for StridedSlice {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (shape, spec) = self.check(inputs)?;
        Ok(vec![if self.grad {
            TensorDesc::new(inputs[4].dtype(), &shape)
        } else {
            TensorDesc::new(inputs[0].dtype(), &spec.final_shape)
        }])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.name();
        let (shape, spec) = self.check(inputs)?;
        let out = out_ref(op, outputs)?;
        if self.grad {
            let dy = inputs[4].device(op, 4)?;
            Plan::new(&shape, &spec.begin, &spec.stride, &spec.processing, INVERSE)
                .record(ctx, op, dy, out)
        } else {
            let x = inputs[0].device(op, 0)?;
            Plan::new(
                &spec.processing,
                &spec.begin,
                &spec.stride,
                &shape,
                CONSTANT,
            )
            .record(ctx, op, x, out)
        }
    }
}

/// Validated paddings: (before, after) per dimension.
fn paddings(op: &str, shape: &[usize], t: &HostTensor) -> Result<Pads> {
    if t.shape.len() != 2 || t.shape[1] != 2 {
        bail_invalid!(
            "{op}: paddings must be a matrix with 2 columns: {}",
            fmt_shape(&t.shape)
        );
    }
    if t.shape[0] != shape.len() {
        bail_invalid!(
            "{op}: The first dimension of paddings must be the rank of inputs {} {}",
            fmt_shape(&t.shape),
            fmt_shape(shape)
        );
    }
    let v = t.to_i64_vec()?;
    let mut out = vec![];
    for d in 0..shape.len() {
        let (b, a) = (v[2 * d], v[2 * d + 1]);
        if b < 0 || a < 0 {
            bail_invalid!("{op}: Paddings must be non-negative: {b} {a}");
        }
        out.push((b, a));
    }
    Ok(out)
}

fn padded_shape(op: &str, shape: &[usize], pads: &[(i64, i64)]) -> Result<Vec<usize>> {
    shape
        .iter()
        .zip(pads)
        .map(|(&d, &(b, a))| {
            (d as i64)
                .checked_add(b)
                .and_then(|v| v.checked_add(a))
                .filter(|&v| v <= i32::MAX as i64)
                .map(|v| v as usize)
                .ok_or_else(|| Error::InvalidArgument(format!("{op}: padded dimension too large")))
        })
        .collect()
}

/// Pad(input, paddings) and PadV2(input, paddings, constant_values).
pub(super) struct Pad {
    pub v2: bool,
}

impl Pad {
    fn name(&self) -> &'static str {
        if self.v2 { "PadV2" } else { "Pad" }
    }

    fn check(&self, inputs: &[Operand]) -> Result<(Pads, Vec<usize>)> {
        let op = self.name();
        count(op, inputs, if self.v2 { 3 } else { 2 })?;
        let shape = inputs[0].shape();
        let pads = paddings(op, shape, inputs[1].host(op, 1)?)?;
        if self.v2 {
            let c = inputs[2].host(op, 2)?;
            if !c.shape.is_empty() {
                bail_invalid!(
                    "{op}: constant_values must be a scalar. Found: {}",
                    fmt_shape(&c.shape)
                );
            }
            if c.dtype != inputs[0].dtype() {
                bail_invalid!(
                    "{op}: constant_values is {} but the input is {}",
                    c.dtype,
                    inputs[0].dtype()
                );
            }
        }
        let out = padded_shape(op, shape, &pads)?;
        Ok((pads, out))
    }
}

impl Kernel for Pad {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, out) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.name();
        let (pads, out_shape) = self.check(inputs)?;
        let x = inputs[0].device(op, 0)?;
        let begin: Vec<i64> = pads.iter().map(|p| -p.0).collect();
        let ones = vec![1; begin.len()];
        let mut plan = Plan::new(&out_shape, &begin, &ones, &x.desc.shape, CONSTANT);
        if self.v2 {
            let c = inputs[2].host(op, 2)?;
            plan.fill = pattern_of(&c.bytes, c.dtype.size() as u32);
            if c.dtype.size() < 4 {
                // The store routine takes the element's own bits from the low word.
                plan.fill.0 &= if c.dtype.size() == 1 { 0xff } else { 0xffff };
            }
        }
        plan.record(ctx, op, x, out_ref(op, outputs)?)
    }
}

/// MirrorPad(input, paddings), mode REFLECT or SYMMETRIC.
pub(super) struct MirrorPad {
    symmetric: bool,
}

/// The `mode` attribute of MirrorPad and MirrorPadGrad: true for SYMMETRIC.
pub(super) fn mirror_mode(op: &str, a: &Attrs) -> Result<bool> {
    match a.get("mode") {
        Some(AttrValue::Str(s)) if s == "REFLECT" => Ok(false),
        Some(AttrValue::Str(s)) if s == "SYMMETRIC" => Ok(true),
        other => bail_invalid!("{op}: mode must be either REFLECT or SYMMETRIC, got {other:?}"),
    }
}

/// Validated mirror paddings of `shape` (TensorFlow: rank at most 5; REFLECT paddings below
/// the dimension, SYMMETRIC paddings at most the dimension).
pub(super) fn mirror_paddings(
    op: &str,
    shape: &[usize],
    t: &HostTensor,
    symmetric: bool,
    sizes: &[usize],
) -> Result<Pads> {
    if shape.len() > 5 {
        return Err(Error::Unimplemented(format!(
            "{op}: inputs rank not in [0,5]: {}",
            shape.len()
        )));
    }
    let pads = paddings(op, shape, t)?;
    for (&(b, a), &d) in pads.iter().zip(sizes) {
        let d = d as i64;
        if symmetric && (b > d || a > d) {
            bail_invalid!(
                "{op}: paddings must be no greater than the dimension size: {b}, {a} greater than {d}"
            );
        }
        if !symmetric && (b >= d || a >= d) {
            bail_invalid!(
                "{op}: paddings must be less than the dimension size: {b}, {a} not less than {d}"
            );
        }
    }
    Ok(pads)
}

impl MirrorPad {
    pub fn build(a: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(MirrorPad {
            symmetric: mirror_mode("MirrorPad", a)?,
        }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(Pads, Vec<usize>)> {
        count("MirrorPad", inputs, 2)?;
        let shape = inputs[0].shape();
        let pads = mirror_paddings(
            "MirrorPad",
            shape,
            inputs[1].host("MirrorPad", 1)?,
            self.symmetric,
            shape,
        )?;
        let out = padded_shape("MirrorPad", shape, &pads)?;
        Ok((pads, out))
    }
}

impl Kernel for MirrorPad {
    fn op(&self) -> &'static str {
        "MirrorPad"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, out) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &out)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (pads, out_shape) = self.check(inputs)?;
        let x = inputs[0].device("MirrorPad", 0)?;
        let begin: Vec<i64> = pads.iter().map(|p| -p.0).collect();
        let ones = vec![1; begin.len()];
        let mode = if self.symmetric { SYMMETRIC } else { REFLECT };
        Plan::new(&out_shape, &begin, &ones, &x.desc.shape, mode).record(
            ctx,
            "MirrorPad",
            x,
            out_ref("MirrorPad", outputs)?,
        )
    }
}
