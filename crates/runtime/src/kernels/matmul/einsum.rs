//! Einsum (float32, float16): TensorFlow's equation language over one or two operands, with
//! the semantics and error messages of TensorFlow's kernel (`einsum_op_impl.h`): named labels
//! (any character but '.'), at most one ellipsis per subscript whose dimensions broadcast
//! NumPy-style between the operands, labels repeated within an input (a diagonal) or within
//! the output (written on a diagonal of an otherwise zero output), and the explicit `->`
//! output that TensorFlow's Python layer always passes.
//!
//! Each operand is first seen as a strided view with one dimension per distinct label
//! (a repeated label's strides add up: the diagonal). Labels found in one operand only and not
//! in the output are summed out by the reduce family's `Sum` (over a contiguous copy of the
//! view when it has a diagonal). One operand then is a strided copy (or a `Sum` written
//! straight to the output). Two operands are one `BatchMatMulV2` (the matmul family's kernels,
//! tensor cores for float16 where the adapter has them): batch labels (in both operands and
//! the output, the ellipsis's among them) outermost, then the free labels of each operand and
//! the contracted ones, each operand read in place when its view already has such a layout
//! (possibly transposed: `adj_x` / `adj_y`) and copied into one otherwise; the product is
//! written to the output directly when the output's order is the product's (or its transpose:
//! the operands swap), else permuted into it by one strided copy. Among the label orders that
//! produce a correct product the plan takes the one that copies the fewest elements; plans are
//! kept per input shapes.
//!
//! An output with repeated labels is one pass over the output (`INFLATE_WGSL`: the result's
//! element on the diagonal, zero elsewhere).
//!
//! Differences from TensorFlow's kernel: a label of the output found in no input is an
//! InvalidArgument error here (TensorFlow's Python layer rejects such equations before the op
//! is built); refused as Unimplemented: an output of more than 8 dimensions with repeated
//! labels, and a product whose batch dimensions, after merging those that broadcast alike,
//! are more than 8 (alternating broadcasts over 9 or more ellipsis dimensions); a size-0
//! label against a size-n one is reported with the wording of other size mismatches.

use std::sync::Arc;

use parking_lot::Mutex;

use super::super::layout::strided::{Dim, Region, View, copy, strides_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, Registry, TensorDesc};
use crate::kernels::elementwise::{bind_out, fmt_shape};
use crate::{AttrValue, Attrs, DType, Error, HostTensor, Result, bail_invalid};

/// The registered dtypes.
pub(super) const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// One label of a subscript.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    Named(usize),
    Ellipsis,
}

/// A parsed equation: labels numbered in order of first appearance.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Spec {
    inputs: Vec<Vec<Sub>>,
    output: Vec<Sub>,
    /// The characters of the named labels, by number.
    chars: Vec<char>,
}

impl Spec {
    fn parse(equation: &str) -> Result<Spec> {
        let parts: Vec<&str> = equation.split("->").collect();
        if parts.len() != 2 {
            bail_invalid!("Expecting exactly one '->' in einsum equation: {equation}");
        }
        let ins: Vec<&str> = parts[0].split(',').collect();
        if ins.len() != 1 && ins.len() != 2 {
            bail_invalid!(
                "Expecting 1 or 2 input subscripts in equation '{equation}' but got: {}",
                ins.len()
            );
        }
        let mut chars = vec![];
        let mut subscript = |s: &str| -> Result<Vec<Sub>> {
            let mut out = vec![];
            let mut rest = s;
            while let Some(c) = rest.chars().next() {
                if c == '.' {
                    if !rest.starts_with("...") {
                        bail_invalid!("Einsum: a '.' outside an ellipsis in '{equation}'");
                    }
                    if out.contains(&Sub::Ellipsis) {
                        bail_invalid!("Einsum: more than one ellipsis in subscript '{s}'");
                    }
                    out.push(Sub::Ellipsis);
                    rest = &rest[3..];
                    continue;
                }
                let label = match chars.iter().position(|&k| k == c) {
                    Some(l) => l,
                    None => {
                        chars.push(c);
                        chars.len() - 1
                    }
                };
                out.push(Sub::Named(label));
                rest = &rest[c.len_utf8()..];
            }
            Ok(out)
        };
        let inputs = ins
            .iter()
            .map(|s| subscript(s))
            .collect::<Result<Vec<_>>>()?;
        let output = subscript(parts[1])?;
        Ok(Spec {
            inputs,
            output,
            chars,
        })
    }

    /// Labels and sizes for inputs of `shapes`: named labels first, then the ellipsis's
    /// broadcast labels (aligned right, as NumPy broadcasts).
    fn resolve(&self, shapes: &[&[usize]]) -> Result<Resolved> {
        if shapes.len() != self.inputs.len() {
            bail_invalid!(
                "Expected {} inputs but got: {}",
                self.inputs.len(),
                shapes.len()
            );
        }
        let named = self.chars.len();
        let mut sizes: Vec<Option<usize>> = vec![None; named];
        // Broadcast dimensions each input's ellipsis stands for.
        let mut bcast = vec![0usize; shapes.len()];
        for (i, (subs, shape)) in self.inputs.iter().zip(shapes).enumerate() {
            let ellipsis = subs.iter().position(|s| *s == Sub::Ellipsis);
            let rank = shape.len();
            let n = match ellipsis {
                None => {
                    if rank != subs.len() {
                        bail_invalid!(
                            "Expected input {i} to have rank {} but got: {rank}",
                            subs.len()
                        );
                    }
                    0
                }
                Some(_) => {
                    if rank + 1 < subs.len() {
                        bail_invalid!(
                            "Expected input {i} to have rank at least {} but got: {rank}",
                            subs.len() - 1
                        );
                    }
                    rank + 1 - subs.len()
                }
            };
            bcast[i] = n;
            let mut axis = 0;
            for s in subs {
                match *s {
                    Sub::Ellipsis => axis += n,
                    Sub::Named(l) => {
                        let d = shape[axis];
                        match sizes[l] {
                            Some(k) if k != d => bail_invalid!(
                                "Expected dimension {k} at axis {axis} of the input shaped {} \
                                 but got dimension {d}",
                                fmt_shape(shape)
                            ),
                            _ => sizes[l] = Some(d),
                        }
                        axis += 1;
                    }
                }
            }
        }
        let max_b = bcast.iter().copied().max().unwrap_or(0);
        let out_ellipsis = self.output.contains(&Sub::Ellipsis);
        if max_b > 0 && !out_ellipsis {
            bail_invalid!(
                "Output contains {max_b} broadcasting dimension(s) but no ellipsis (...) was \
                 found in the output subscripts."
            );
        }
        // Broadcast label j (0..max_b) is dimension j of the broadcast shape.
        let mut bsizes = vec![1usize; max_b];
        for (i, shape) in shapes.iter().enumerate() {
            let Some(e) = self.inputs[i].iter().position(|s| *s == Sub::Ellipsis) else {
                continue;
            };
            for t in 0..bcast[i] {
                let j = max_b - bcast[i] + t;
                let d = shape[e + t];
                if bsizes[j] == 1 {
                    bsizes[j] = d;
                } else if d != 1 && d != bsizes[j] {
                    bail_invalid!(
                        "Einsum: the inputs' ellipsis dimensions do not broadcast: {} and {}",
                        fmt_shape(shapes[0]),
                        fmt_shape(shapes[shapes.len() - 1])
                    );
                }
            }
        }
        let expand = |subs: &[Sub], n: usize| -> Vec<usize> {
            let mut labels = vec![];
            for s in subs {
                match *s {
                    Sub::Named(l) => labels.push(l),
                    Sub::Ellipsis => labels.extend((max_b - n..max_b).map(|j| named + j)),
                }
            }
            labels
        };
        let inputs: Vec<Vec<usize>> = self
            .inputs
            .iter()
            .zip(&bcast)
            .map(|(s, &n)| expand(s, n))
            .collect();
        let output = expand(&self.output, max_b);
        let mut all = Vec::with_capacity(named + max_b);
        for (l, s) in sizes.iter().enumerate() {
            match s {
                Some(s) => all.push(*s),
                None if output.contains(&l) => bail_invalid!(
                    "Einsum: output label '{}' appears in no input",
                    self.chars[l]
                ),
                None => all.push(0),
            }
        }
        all.extend(bsizes);
        Ok(Resolved {
            sizes: all,
            inputs,
            shapes: shapes.iter().map(|s| s.to_vec()).collect(),
            output,
            bcast: max_b,
        })
    }
}

/// An equation applied to input shapes.
#[derive(Debug)]
struct Resolved {
    /// Size of each label (broadcast labels: the broadcast size).
    sizes: Vec<usize>,
    /// Each input's label per axis.
    inputs: Vec<Vec<usize>>,
    shapes: Vec<Vec<usize>>,
    /// The output's label per axis.
    output: Vec<usize>,
    /// How many broadcast labels (the last ones) the ellipsis stands for.
    bcast: usize,
}

impl Resolved {
    fn out_shape(&self) -> Vec<usize> {
        self.output.iter().map(|&l| self.sizes[l]).collect()
    }
}

/// A tensor seen through one dimension per label: (label, size, element stride), from element
/// zero of the tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LView(Vec<(usize, usize, i64)>);

impl LView {
    /// Input `labels` over a row-major tensor of `shape`: a repeated label's strides add up.
    fn of(labels: &[usize], shape: &[usize]) -> LView {
        let strides = strides_of(shape);
        let mut dims: Vec<(usize, usize, i64)> = vec![];
        for (axis, &l) in labels.iter().enumerate() {
            match dims.iter_mut().find(|d| d.0 == l) {
                Some(d) => d.2 += strides[axis],
                None => dims.push((l, shape[axis], strides[axis])),
            }
        }
        LView(dims)
    }

    /// A row-major tensor with these labels and sizes.
    fn contiguous(dims: &[(usize, usize)]) -> LView {
        let shape: Vec<usize> = dims.iter().map(|d| d.1).collect();
        let strides = strides_of(&shape);
        LView(
            dims.iter()
                .zip(strides)
                .map(|(&(l, s), st)| (l, s, st))
                .collect(),
        )
    }

    fn labels(&self) -> Vec<usize> {
        self.0.iter().map(|d| d.0).collect()
    }

    /// (size, stride) of `label`; a label the view lacks is one element (a broadcast label
    /// the other operand has).
    fn get(&self, label: usize) -> (usize, i64) {
        self.0
            .iter()
            .find(|d| d.0 == label)
            .map_or((1, 0), |d| (d.1, d.2))
    }

    fn has(&self, label: usize) -> bool {
        self.0.iter().any(|d| d.0 == label)
    }

    fn elements(&self) -> usize {
        self.0.iter().map(|d| d.1).product()
    }

    /// Whether the view reads a row-major tensor whose dims are `order` (same elements, no
    /// copy needed): its dims of more than one element, in `order`'s order, have row-major
    /// strides.
    fn row_major_in(&self, order: &[usize]) -> bool {
        // (A label the view lacks is one element: anywhere in `order`.)
        if self.0.iter().any(|d| !order.contains(&d.0)) {
            return false;
        }
        let mut expect = 1i64;
        for &l in order.iter().rev() {
            let (size, stride) = self.get(l);
            if size > 1 && stride != expect {
                return false;
            }
            expect *= size as i64;
        }
        true
    }

    /// The strided view reading this view's elements in `order`.
    fn view_in(&self, order: &[usize]) -> View {
        View {
            dims: order
                .iter()
                .map(|&l| {
                    let (size, stride) = self.get(l);
                    Dim {
                        size,
                        stride,
                        wrap: 0,
                    }
                })
                .collect(),
            base: 0,
        }
    }

    fn sizes_in(&self, order: &[usize]) -> Vec<usize> {
        order.iter().map(|&l| self.get(l).0).collect()
    }
}

/// How one input is prepared before the product: its diagonal copied out (when it has one and
/// labels must be summed), the labels of no other operand summed out.
#[derive(Debug)]
struct Prep {
    /// Copy of the input's distinct-label view into a temporary of this shape.
    gather: Option<(View, Vec<usize>)>,
    /// Sum over these axes, to a tensor of this shape.
    sum: Option<(Vec<i32>, Vec<usize>)>,
    /// The prepared tensor (the input, or the sum).
    view: LView,
}

/// How the result reaches the output.
#[derive(Debug)]
enum Finish {
    /// The last step wrote the output itself.
    Direct,
    /// One strided copy (a permutation of the result's labels).
    Copy(View),
    /// An output with repeated labels: every element is the result's element on the
    /// diagonal, zero elsewhere (`INFLATE_WGSL`).
    Inflate(Inflate),
}

/// The output's dims, each dim's first dim of the same label, and the result's element
/// stride on a label's first dim (0 on the others).
#[derive(Debug, PartialEq, Eq)]
struct Inflate {
    dims: Vec<u32>,
    first: Vec<u32>,
    stride: Vec<u32>,
}

/// Output element e (row-major over p.dims): zero unless every dim holds the coordinate of
/// the first dim with its label, else the result's element at the sum of the first dims'
/// coordinates times their strides. `load_src` and the packing come from the slice family.
const INFLATE_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    words: u32,
    rank: u32,
    dims: array<vec4<u32>, 2>,
    first: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> src: array<u32>;

fn value(e: u32) -> vec2<u32> {
    var c: array<u32, 8>;
    var rem = e;
    for (var k = 0u; k < p.rank; k++) {
        let d = p.rank - 1u - k;
        let size = p.dims[d >> 2u][d & 3u];
        c[d] = rem % size;
        rem = rem / size;
    }
    var off = 0u;
    for (var d = 0u; d < p.rank; d++) {
        if c[d] != c[p.first[d >> 2u][d & 3u]] {
            return vec2<u32>(0u, 0u);
        }
        off += c[d] * p.stride[d >> 2u][d & 3u];
    }
    return load_src(off);
}
";

enum Body {
    Single(Finish),
    Contract(Box<Contract>),
}

/// The product of two prepared operands.
struct Contract {
    /// Per operand: a copy into a temporary of this shape (row-major in the chosen layout).
    copies: [Option<(View, Vec<usize>)>; 2],
    /// The matmul's operand shapes (its left operand first).
    shapes: [Vec<usize>; 2],
    /// Whether input 1 is the matmul's left operand.
    swap: bool,
    matmul: Box<dyn Kernel>,
    /// The product's shape.
    r_shape: Vec<usize>,
    finish: Finish,
}

struct Plan {
    out_shape: Vec<usize>,
    preps: Vec<Prep>,
    sum: Option<Box<dyn Kernel>>,
    body: Body,
}

/// Orders of `set` by first position in each sequence of `refs` (labels absent from a
/// sequence after the others, in `set`'s order), without duplicates.
fn orders(set: &[usize], refs: &[&[usize]]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![];
    for r in refs {
        let mut o: Vec<usize> = r.iter().copied().filter(|l| set.contains(l)).collect();
        let mut seen = vec![];
        o.retain(|l| {
            let new = !seen.contains(l);
            seen.push(*l);
            new
        });
        o.extend(set.iter().filter(|l| !seen.contains(l)));
        if !out.contains(&o) {
            out.push(o);
        }
    }
    out
}

/// How `src` (labels with sizes and strides) reaches a row-major output whose axes carry
/// `out_labels` (labels may repeat: a diagonal).
fn finish(src: &LView, out_labels: &[usize], out_shape: &[usize]) -> Result<Finish> {
    let firsts: Vec<usize> = out_labels
        .iter()
        .map(|l| out_labels.iter().position(|k| k == l).unwrap_or(0))
        .collect();
    if firsts.iter().enumerate().all(|(d, &f)| f == d) {
        return Ok(Finish::Copy(src.view_in(out_labels)));
    }
    if out_labels.len() > super::MAX_BATCH_DIMS {
        return Err(Error::Unimplemented(format!(
            "Einsum: an output of rank {} with repeated labels (at most {} on tfwgpu)",
            out_labels.len(),
            super::MAX_BATCH_DIMS
        )));
    }
    let u32s = |v: Vec<usize>| -> Result<Vec<u32>> {
        v.into_iter()
            .map(|x| crate::kernels::slice::u32_of("Einsum", "size", x))
            .collect()
    };
    let stride = out_labels
        .iter()
        .zip(&firsts)
        .enumerate()
        .map(|(d, (&l, &f))| if f == d { src.get(l).1 as usize } else { 0 })
        .collect();
    Ok(Finish::Inflate(Inflate {
        dims: u32s(out_shape.to_vec())?,
        first: u32s(firsts)?,
        stride: u32s(stride)?,
    }))
}

/// Layout of one matmul operand: `Some(transposed)` when the view is already row-major in one
/// of the operand's two layouts (`normal` = [batch, rows, cols] or `flipped` = [batch, cols,
/// rows], the latter read transposed).
fn layout_of(v: &LView, normal: &[usize], flipped: &[usize]) -> Option<bool> {
    if v.row_major_in(normal) {
        Some(false)
    } else if v.row_major_in(flipped) {
        Some(true)
    } else {
        None
    }
}

/// Merges adjacent batch dimensions where both operands agree on broadcasting and drops
/// dimensions of one element in both, for fewer batch dimensions in the matmul.
fn merge_batch(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut ma, mut mb): (Vec<usize>, Vec<usize>) = (vec![], vec![]);
    for (&x, &y) in a.iter().zip(b) {
        if x == 1 && y == 1 {
            continue;
        }
        if let (Some(px), Some(py)) = (ma.last_mut(), mb.last_mut()) {
            let same = *px == *py && x == y;
            if same || (*px == 1 && x == 1) || (*py == 1 && y == 1) {
                *px *= x;
                *py *= y;
                continue;
            }
        }
        ma.push(x);
        mb.push(y);
    }
    (ma, mb)
}

fn product(v: &LView, labels: &[usize]) -> usize {
    labels.iter().map(|&l| v.get(l).0).product()
}

impl Plan {
    fn build(res: &Resolved, dtype: DType) -> Result<Plan> {
        let out_shape = res.out_shape();
        let n = res.inputs.len();
        let mut preps = vec![];
        for (i, labels) in res.inputs.iter().enumerate() {
            let view = LView::of(labels, &res.shapes[i]);
            let kept =
                |l: &usize| res.output.contains(l) || (n == 2 && res.inputs[1 - i].contains(l));
            if view.0.iter().all(|d| kept(&d.0)) {
                preps.push(Prep {
                    gather: None,
                    sum: None,
                    view,
                });
                continue;
            }
            // Sum out the labels of this operand only, over a contiguous tensor of the
            // distinct labels (the input itself when it has no diagonal).
            let dims: Vec<(usize, usize)> = view.0.iter().map(|d| (d.0, d.1)).collect();
            let gather = (view.0.len() != labels.len()).then(|| {
                let order = view.labels();
                (view.view_in(&order), view.sizes_in(&order))
            });
            let axes: Vec<i32> = (0..dims.len())
                .filter(|&a| !kept(&dims[a].0))
                .map(|a| a as i32)
                .collect();
            let left: Vec<(usize, usize)> = dims.iter().copied().filter(|d| kept(&d.0)).collect();
            preps.push(Prep {
                gather,
                sum: Some((axes, left.iter().map(|d| d.1).collect())),
                view: LView::contiguous(&left),
            });
        }
        let sum = if preps.iter().any(|p| p.sum.is_some()) {
            let attrs = Attrs::new()
                .with("T", AttrValue::Type(dtype))
                .with("keep_dims", AttrValue::Bool(false));
            Some(match dtype {
                DType::F16 => crate::kernels::nn::f16::build(
                    |a| Registry::global().build_kernel("Sum", a),
                    &attrs,
                    &["T"],
                )?,
                _ => Registry::global().build_kernel("Sum", &attrs)?,
            })
        } else {
            None
        };
        let body = if n == 1 {
            let v = &preps[0].view;
            let distinct = res
                .output
                .iter()
                .enumerate()
                .all(|(i, l)| !res.output[..i].contains(l));
            let direct = preps[0].sum.is_some()
                && distinct
                && res.output.iter().all(|l| v.has(*l))
                && v.row_major_in(&res.output);
            Body::Single(if direct {
                Finish::Direct
            } else {
                finish(v, &res.output, &out_shape)?
            })
        } else {
            Body::Contract(Box::new(Self::contract(res, &preps, dtype, &out_shape)?))
        };
        Ok(Plan {
            out_shape,
            preps,
            sum,
            body,
        })
    }

    /// The cheapest product of two prepared operands (fewest elements copied).
    fn contract(
        res: &Resolved,
        preps: &[Prep],
        dtype: DType,
        out_shape: &[usize],
    ) -> Result<Contract> {
        let (va, vb) = (&preps[0].view, &preps[1].view);
        let (la, lb) = (va.labels(), vb.labels());
        let out = &res.output;
        let mut distinct_out = vec![];
        for &l in out {
            if !distinct_out.contains(&l) {
                distinct_out.push(l);
            }
        }
        let inflate = distinct_out.len() != out.len();
        let in_both = |l: &usize| va.has(*l) && vb.has(*l);
        // Broadcast labels are batch labels even where one operand lacks them (it is
        // broadcast along them).
        let is_bcast = |l: &usize| *l >= res.sizes.len() - res.bcast;
        let batch: Vec<usize> = distinct_out
            .iter()
            .copied()
            .filter(|l| in_both(l) || is_bcast(l))
            .collect();
        let free_a: Vec<usize> = distinct_out
            .iter()
            .copied()
            .filter(|l| va.has(*l) && !batch.contains(l))
            .collect();
        let free_b: Vec<usize> = distinct_out
            .iter()
            .copied()
            .filter(|l| vb.has(*l) && !batch.contains(l))
            .collect();
        let contracted: Vec<usize> = la
            .iter()
            .copied()
            .filter(|l| vb.has(*l) && !out.contains(l))
            .collect();
        struct Choice {
            cost: usize,
            orders: [Vec<usize>; 4],
            ta: Option<bool>,
            tb: Option<bool>,
            direct: Option<bool>,
        }
        let mut best: Option<Choice> = None;
        for bo in orders(&batch, &[&distinct_out, &la, &lb]) {
            for ko in orders(&contracted, &[&la, &lb]) {
                for fa in orders(&free_a, &[&distinct_out, &la]) {
                    for fb in orders(&free_b, &[&distinct_out, &lb]) {
                        let cat = |parts: &[&[usize]]| parts.concat();
                        let ta = layout_of(va, &cat(&[&bo, &fa, &ko]), &cat(&[&bo, &ko, &fa]));
                        let tb = layout_of(vb, &cat(&[&bo, &ko, &fb]), &cat(&[&bo, &fb, &ko]));
                        let mut cost = 0;
                        if ta.is_none() {
                            cost += va.elements();
                        }
                        if tb.is_none() {
                            cost += vb.elements();
                        }
                        // The product [batch, free_a, free_b] (or, operands swapped,
                        // [batch, free_b, free_a]) is the output when its order matches.
                        let r = LView::contiguous(
                            &cat(&[&bo, &fa, &fb])
                                .iter()
                                .map(|&l| (l, res.sizes[l]))
                                .collect::<Vec<_>>(),
                        );
                        let rs = LView::contiguous(
                            &cat(&[&bo, &fb, &fa])
                                .iter()
                                .map(|&l| (l, res.sizes[l]))
                                .collect::<Vec<_>>(),
                        );
                        let direct = if inflate {
                            None
                        } else if r.row_major_in(out) {
                            Some(false)
                        } else if rs.row_major_in(out) {
                            Some(true)
                        } else {
                            None
                        };
                        if direct.is_none() {
                            cost += out_shape.iter().product::<usize>();
                        }
                        if best.as_ref().is_none_or(|b| cost < b.cost) {
                            best = Some(Choice {
                                cost,
                                orders: [bo.clone(), ko.clone(), fa.clone(), fb.clone()],
                                ta,
                                tb,
                                direct,
                            });
                        }
                    }
                }
            }
        }
        let c = best.expect("every label set has at least one order");
        let [bo, ko, fa, fb] = &c.orders;
        // Operand copies (row-major [batch, free, contracted] for a, [batch, contracted, free]
        // for b) where the view is in neither layout.
        let mut copies: [Option<(View, Vec<usize>)>; 2] = [None, None];
        let (ta, tb) = (c.ta.unwrap_or(false), c.tb.unwrap_or(false));
        if c.ta.is_none() {
            let order = [bo.as_slice(), fa, ko].concat();
            copies[0] = Some((va.view_in(&order), va.sizes_in(&order)));
        }
        if c.tb.is_none() {
            let order = [bo.as_slice(), ko, fb].concat();
            copies[1] = Some((vb.view_in(&order), vb.sizes_in(&order)));
        }
        let (ab, bb) = merge_batch(&va.sizes_in(bo), &vb.sizes_in(bo));
        if ab.len() > 8 {
            return Err(Error::Unimplemented(format!(
                "Einsum: {} batch dimensions after merging (at most 8 on tfwgpu)",
                ab.len()
            )));
        }
        let (m, k, nn) = (product(va, fa), product(va, ko), product(vb, fb));
        let a_shape = [ab.clone(), if ta { vec![k, m] } else { vec![m, k] }].concat();
        let b_shape = [bb.clone(), if tb { vec![nn, k] } else { vec![k, nn] }].concat();
        let batch_out: Vec<usize> = ab.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
        let swap = c.direct == Some(true);
        // Swapped: b^T a^T = (a b)^T; an operand read transposed in one order is read
        // plainly in the other.
        let (shapes, adj_x, adj_y, r_shape) = if swap {
            (
                [b_shape, a_shape],
                !tb,
                !ta,
                [batch_out, vec![nn, m]].concat(),
            )
        } else {
            (
                [a_shape, b_shape],
                ta,
                tb,
                [batch_out, vec![m, nn]].concat(),
            )
        };
        let matmul = Registry::global().build_kernel(
            "BatchMatMulV2",
            &Attrs::new()
                .with("T", AttrValue::Type(dtype))
                .with("adj_x", AttrValue::Bool(adj_x))
                .with("adj_y", AttrValue::Bool(adj_y)),
        )?;
        let finish = match c.direct {
            Some(_) => Finish::Direct,
            None => {
                let r = LView::contiguous(
                    &[bo.as_slice(), fa, fb]
                        .concat()
                        .iter()
                        .map(|&l| (l, res.sizes[l]))
                        .collect::<Vec<_>>(),
                );
                finish(&r, out, out_shape)?
            }
        };
        Ok(Contract {
            copies,
            shapes,
            swap,
            matmul,
            r_shape,
            finish,
        })
    }
}

/// A plan and the input shapes it was made for.
type KeptPlan = (Vec<Vec<usize>>, Arc<Plan>);

/// The Einsum kernel: the parsed equation and the plan of the last input shapes.
struct Einsum {
    spec: Spec,
    dtype: DType,
    plan: Mutex<Option<KeptPlan>>,
}

/// Builds the kernel from the node's `equation`, `N` and `T`.
pub(super) fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
    let equation = match attrs.get("equation") {
        Some(AttrValue::Str(s)) => s.clone(),
        Some(v) => bail_invalid!("Einsum: equation must be a string, got {v:?}"),
        None => bail_invalid!("Einsum: missing attribute equation"),
    };
    let dtype = attrs.dtype("T")?;
    if !DTYPES.contains(&dtype) {
        return Err(Error::Unimplemented(format!(
            "Einsum has no tfwgpu kernel for T={dtype}"
        )));
    }
    let spec = Spec::parse(&equation)?;
    let n = attrs.int_or("N", spec.inputs.len() as i64)?;
    if n != spec.inputs.len() as i64 {
        bail_invalid!("Expected {} inputs but got: {n}", spec.inputs.len());
    }
    Ok(Box::new(Einsum {
        spec,
        dtype,
        plan: Mutex::new(None),
    }))
}

impl Einsum {
    fn resolve(&self, inputs: &[Operand]) -> Result<Resolved> {
        for (i, x) in inputs.iter().enumerate() {
            if x.dtype() != self.dtype {
                bail_invalid!("Einsum: input {i} is {} but T is {}", x.dtype(), self.dtype);
            }
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape()).collect();
        self.spec.resolve(&shapes)
    }

    /// The plan for these inputs' shapes (kept for the next call with the same shapes).
    fn plan(&self, inputs: &[Operand]) -> Result<Arc<Plan>> {
        let mut kept = self.plan.lock();
        if let Some((shapes, plan)) = kept.as_ref()
            && shapes.len() == inputs.len()
            && shapes.iter().zip(inputs).all(|(s, x)| s == x.shape())
        {
            return Ok(plan.clone());
        }
        let res = self.resolve(inputs)?;
        let plan = Arc::new(Plan::build(&res, self.dtype)?);
        *kept = Some((res.shapes, plan.clone()));
        Ok(plan)
    }
}

/// `t`'s buffer seen with another shape of as many elements.
fn reshaped(t: &DeviceRef, shape: &[usize]) -> DeviceRef {
    DeviceRef {
        desc: TensorDesc::new(t.desc.dtype, shape),
        addr: t.addr,
    }
}

impl Finish {
    fn record(&self, ctx: &KernelContext, src: &DeviceRef, out: &DeviceRef) -> Result<()> {
        match self {
            Finish::Direct => Ok(()),
            Finish::Copy(view) => copy(ctx, "Einsum", src, view, out, Region::all(view.len())),
            Finish::Inflate(f) => {
                let dtype = out.desc.dtype;
                let pack = |v: &[u32]| crate::kernels::slice::pack8(v.iter().copied());
                let mut params = vec![0, 0, 0, f.dims.len() as u32];
                params.extend(pack(&f.dims));
                params.extend(pack(&f.first));
                params.extend(pack(&f.stride));
                let bindings = [bind_out(ctx, "Einsum", out)?, ctx.bind(src)?];
                crate::kernels::slice::dispatch_words(
                    ctx,
                    "einsum_inflate",
                    || {
                        format!(
                            "{INFLATE_WGSL}\n{}",
                            crate::kernels::slice::load_fn("src", dtype.size())
                        )
                    },
                    &mut params,
                    &bindings,
                    out.desc.num_elements(),
                    dtype,
                )
            }
        }
    }
}

impl Kernel for Einsum {
    fn op(&self) -> &'static str {
        "Einsum"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let plan = self.plan(inputs)?;
        Ok(vec![TensorDesc::new(self.dtype, &plan.out_shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let plan = self.plan(inputs)?;
        let out = &outputs[0];
        if out.desc != TensorDesc::new(self.dtype, &plan.out_shape) {
            bail_invalid!(
                "Einsum: output is {} {} but the equation gives {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                self.dtype,
                fmt_shape(&plan.out_shape)
            );
        }
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let single_direct = matches!(plan.body, Body::Single(Finish::Direct));
        let mut prepared = Vec::with_capacity(inputs.len());
        for (i, p) in plan.preps.iter().enumerate() {
            let mut cur = inputs[i].device("Einsum", i)?.clone();
            if let Some((view, shape)) = &p.gather {
                let t = ctx.temp_tensor(TensorDesc::new(self.dtype, shape))?;
                copy(ctx, "Einsum", &cur, view, &t, Region::all(view.len()))?;
                cur = t;
            }
            if let (Some((axes, shape)), Some(sum)) = (&p.sum, &plan.sum) {
                let t = if single_direct {
                    reshaped(out, shape)
                } else {
                    ctx.temp_tensor(TensorDesc::new(self.dtype, shape))?
                };
                let axes = HostTensor::vec_i32(axes);
                sum.record(
                    ctx,
                    &[Operand::Device(&cur), Operand::Host(&axes)],
                    std::slice::from_ref(&t),
                )?;
                cur = t;
            }
            prepared.push(cur);
        }
        let c = match &plan.body {
            Body::Single(finish) => return finish.record(ctx, &prepared[0], out),
            Body::Contract(c) => c,
        };
        let mut operands = Vec::with_capacity(2);
        for (i, x) in prepared.iter().enumerate() {
            let src = match &c.copies[i] {
                Some((view, shape)) => {
                    let t = ctx.temp_tensor(TensorDesc::new(self.dtype, shape))?;
                    copy(ctx, "Einsum", x, view, &t, Region::all(view.len()))?;
                    t
                }
                None => x.clone(),
            };
            operands.push(src);
        }
        if c.swap {
            operands.swap(0, 1);
        }
        let a = reshaped(&operands[0], &c.shapes[0]);
        let b = reshaped(&operands[1], &c.shapes[1]);
        let r = match c.finish {
            Finish::Direct => reshaped(out, &c.r_shape),
            _ => ctx.temp_tensor(TensorDesc::new(self.dtype, &c.r_shape))?,
        };
        c.matmul.record(
            ctx,
            &[Operand::Device(&a), Operand::Device(&b)],
            std::slice::from_ref(&r),
        )?;
        c.finish.record(ctx, &r, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(eq: &str, shapes: &[&[usize]]) -> Plan {
        let res = Spec::parse(eq).unwrap().resolve(shapes).unwrap();
        Plan::build(&res, DType::F32).unwrap()
    }

    /// (operands copied, product written to the output directly, operands swapped).
    fn contract(p: &Plan) -> ([bool; 2], bool, bool) {
        let Body::Contract(c) = &p.body else {
            panic!("not a product");
        };
        (
            [c.copies[0].is_some(), c.copies[1].is_some()],
            matches!(c.finish, Finish::Direct),
            c.swap,
        )
    }

    #[test]
    fn keras_layouts_copy_only_what_they_must() {
        // EinsumDense: one product read and written in place.
        let p = plan("abc,cde->abde", &[&[2, 5, 8], &[8, 3, 4]]);
        assert_eq!(contract(&p), ([false, false], true, false));
        assert_eq!(p.out_shape, vec![2, 5, 3, 4]);
        assert_eq!(
            contract(&plan("abcd,cde->abe", &[&[2, 5, 3, 4], &[3, 4, 8]])),
            ([false, false], true, false)
        );
        // Attention scores: both operands have a free label between the batch labels; the
        // output is the swapped product.
        assert_eq!(
            contract(&plan("aecd,abcd->acbe", &[&[2, 6, 3, 4], &[2, 5, 3, 4]])),
            ([true, true], true, true)
        );
        // Attention output: the scores are read in place, the values copied, the product
        // permuted into the output.
        assert_eq!(
            contract(&plan("acbe,aecd->abcd", &[&[2, 3, 5, 6], &[2, 6, 3, 4]])),
            ([false, true], false, false)
        );
        // A matmul with the first operand transposed reads it in place.
        let p = plan("ji,jk->ik", &[&[4, 3], &[4, 5]]);
        assert_eq!(contract(&p), ([false, false], true, false));
        // Labels of one element need no copy wherever they are.
        assert_eq!(
            contract(&plan("aecd,abcd->acbe", &[&[2, 6, 1, 4], &[2, 5, 1, 4]])),
            ([false, false], true, true)
        );
    }

    #[test]
    fn single_operands() {
        // A sum written straight into the output.
        let p = plan("ijk->ik", &[&[3, 4, 5]]);
        assert!(matches!(p.body, Body::Single(Finish::Direct)));
        assert_eq!(p.preps[0].sum.as_ref().unwrap().0, vec![1]);
        // A transpose: one copy.
        let p = plan("ij->ji", &[&[3, 4]]);
        assert!(matches!(p.body, Body::Single(Finish::Copy(_))));
        // A diagonal summed: copied out first.
        let p = plan("iij->j", &[&[3, 3, 4]]);
        assert!(p.preps[0].gather.is_some());
        // An output diagonal: one pass over the output, whatever its size.
        let p = plan("ij->iji", &[&[3, 4]]);
        let Body::Single(Finish::Inflate(f)) = &p.body else {
            panic!()
        };
        assert_eq!(
            *f,
            Inflate {
                dims: vec![3, 4, 3],
                first: vec![0, 1, 0],
                stride: vec![4, 1, 0]
            }
        );
    }

    #[test]
    fn batch_dimensions_merge() {
        assert_eq!(merge_batch(&[2, 3, 4], &[2, 3, 4]), (vec![24], vec![24]));
        assert_eq!(
            merge_batch(&[2, 1, 4], &[2, 3, 4]),
            (vec![2, 1, 4], vec![2, 3, 4])
        );
        assert_eq!(
            merge_batch(&[1, 1, 4], &[2, 3, 4]),
            (vec![1, 4], vec![6, 4])
        );
        assert_eq!(merge_batch(&[1, 5], &[1, 5]), (vec![5], vec![5]));
    }

    #[test]
    fn ellipsis_labels() {
        let s = Spec::parse("...ij,j...->...i").unwrap();
        let r = s.resolve(&[&[2, 1, 3, 4], &[4, 1, 5]]).unwrap();
        assert_eq!(r.out_shape(), vec![2, 5, 3]);
        assert_eq!(r.bcast, 2);
        assert!(Spec::parse("i..j->ij").is_err());
        assert!(Spec::parse("...i...->i").is_err());
    }
}
