//! conv family: Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter, DepthwiseConv2dNative,
//! DepthwiseConv2dNativeBackpropInput, DepthwiseConv2dNativeBackpropFilter, and Conv3D with its
//! V2 gradients as sums of the 2-D ops over depth taps (`conv3d.rs`) (float32, float16).
//!
//! Conv2D and its two gradients are implicit matrix products on one register-tiled shader
//! (`gemm.rs`, `conv_gemm.wgsl`): the forward pass is [N*OH*OW, R*S*C] x [R*S*C, K], the input
//! gradient [N*H*W, R*S*K] x [R*S*K, C] (taps that fall between strided outputs read as zero),
//! the filter gradient [R*S*C, N*OH*OW] x [N*OH*OW, K], with split-K when the product has few
//! output tiles. 1x1 stride-1 unpadded NHWC convolutions are plain products. Grouped
//! convolutions (filter depth a divisor of the input depth) run one product per group.
//! The depthwise ops are direct kernels (`depthwise.rs`).
//!
//! On GPU adapters, float32 NHWC one-group convolutions with output depth a multiple of 4
//! take faster paths on the matmul family's register-blocked vector shader (`gemm.rs`):
//! 1x1 stride-1 ones as plain products; others with input depth a multiple of 4 with the
//! windows addressed by hooks (`implicit.wgsl`; input gradient at stride 1); strided or
//! shallow input gradients as a product into columns plus `col2im.wgsl`; shallow forward
//! passes and filter gradients (ResNet's 3-channel first layer) through `im2col.wgsl`
//! columns. The tile of each (and the implicit GEMM's own tile) is chosen by the autotuner
//! (`crate::tune`) when tuning is on.
//!
//! float16 NHWC one-group Conv2D and both gradients run on cooperative matrices (tensor
//! cores) where the adapter has them (`coop.rs`).
//!
//! Both data formats are served by the same shaders (tensors are addressed through strides).
//! float16 tensors are read as f16 and accumulated in f32; results are rounded to f16 once.
//!
//! Validation follows TensorFlow's kernels (conv_ops.cc, conv_grad_*_ops.cc,
//! depthwise_conv_op.cc): 4-D tensors, strides and dilations of 4 values with 1 in the batch
//! and depth dimensions, SAME / VALID / EXPLICIT padding, output sizes as
//! `GetWindowedOutputSize` computes them.

mod conv3d;
mod coop;
mod cpu;
mod depthwise;
mod gemm;
mod winograd;

pub use cpu::CPU_CONV_TILES;

use crate::kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc,
};
use crate::{DType, Error, HostTensor, Result, bail_invalid};

const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "Conv2D",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: |a| Conv::build(Op::Conv2D, a),
    },
    OpDef {
        op: "Conv2DBackpropInput",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(0, "input_sizes")],
        factory: |a| Conv::build(Op::Conv2DBackpropInput, a),
    },
    OpDef {
        op: "Conv2DBackpropFilter",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(1, "filter_sizes")],
        factory: |a| Conv::build(Op::Conv2DBackpropFilter, a),
    },
    OpDef {
        op: "DepthwiseConv2dNative",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: |a| Conv::build(Op::Depthwise, a),
    },
    OpDef {
        op: "DepthwiseConv2dNativeBackpropInput",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(0, "input_sizes")],
        factory: |a| Conv::build(Op::DepthwiseBackpropInput, a),
    },
    OpDef {
        op: "DepthwiseConv2dNativeBackpropFilter",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(1, "filter_sizes")],
        factory: |a| Conv::build(Op::DepthwiseBackpropFilter, a),
    },
    OpDef {
        op: "Conv3D",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: |a| conv3d::Conv3d::build(conv3d::Op3::Forward, a),
    },
    OpDef {
        op: "Conv3DBackpropInputV2",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(0, "input_sizes")],
        factory: |a| conv3d::Conv3d::build(conv3d::Op3::BackpropInput, a),
    },
    OpDef {
        op: "Conv3DBackpropFilterV2",
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[(1, "filter_sizes")],
        factory: |a| conv3d::Conv3d::build(conv3d::Op3::BackpropFilter, a),
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Conv2D,
    Conv2DBackpropInput,
    Conv2DBackpropFilter,
    Depthwise,
    DepthwiseBackpropInput,
    DepthwiseBackpropFilter,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Conv2D => "Conv2D",
            Op::Conv2DBackpropInput => "Conv2DBackpropInput",
            Op::Conv2DBackpropFilter => "Conv2DBackpropFilter",
            Op::Depthwise => "DepthwiseConv2dNative",
            Op::DepthwiseBackpropInput => "DepthwiseConv2dNativeBackpropInput",
            Op::DepthwiseBackpropFilter => "DepthwiseConv2dNativeBackpropFilter",
        }
    }

    fn depthwise(self) -> bool {
        matches!(
            self,
            Op::Depthwise | Op::DepthwiseBackpropInput | Op::DepthwiseBackpropFilter
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Padding {
    Same,
    Valid,
    Explicit,
}

/// The validated attributes of a convolution node.
#[derive(Clone, Debug)]
struct ConvAttrs {
    nchw: bool,
    /// (rows, columns).
    strides: [usize; 2],
    dilations: [usize; 2],
    padding: Padding,
    /// (top, bottom, left, right) for EXPLICIT.
    explicit: [usize; 4],
    /// Internal, for tests and benchmarks: a GEMM tile name (`gemm::TILES`).
    tile: Option<String>,
    /// Internal: the number of K splits of the GEMM (or of the depthwise filter gradient).
    splits: Option<usize>,
    /// Internal (`_tfwgpu_tile` "gemm"): the implicit GEMM with its heuristic tile, no tuning,
    /// 1x1 convolutions not routed to the matmul kernels.
    heuristic_gemm: bool,
    /// Internal, for tests: the images per group of the column paths (`_tfwgpu_col_images`).
    col_images: Option<usize>,
}

fn ints(op: &str, attrs: &Attrs, name: &str) -> Result<Option<Vec<i64>>> {
    match attrs.get(name) {
        None => Ok(None),
        Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
        Some(other) => {
            bail_invalid!("{op}: attribute {name} must be a list of ints, got {other:?}")
        }
    }
}

/// Dimension indices (batch, rows, columns, channels) of a 4-D tensor in a data format.
fn dims_of(nchw: bool) -> [usize; 4] {
    if nchw { [0, 2, 3, 1] } else { [0, 1, 2, 3] }
}

impl ConvAttrs {
    fn parse(op: Op, attrs: &Attrs) -> Result<Self> {
        let name = op.name();
        let nchw = match attrs.get("data_format") {
            None => false,
            Some(AttrValue::Str(s)) if s == "NHWC" => false,
            Some(AttrValue::Str(s)) if s == "NCHW" => true,
            Some(other) => bail_invalid!("{name}: Invalid data format {other:?}"),
        };
        let [dn, dh, dw, dc] = dims_of(nchw);
        let strides = ints(name, attrs, "strides")?
            .ok_or_else(|| Error::InvalidArgument(format!("{name}: missing attribute strides")))?;
        if strides.len() != 4 {
            bail_invalid!(
                "{name}: Sliding window strides field must specify 4 dimensions, got {}",
                strides.len()
            );
        }
        if strides[dn] != 1 || strides[dc] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: Current implementation does not yet support strides in the batch and \
                 depth dimensions (strides {strides:?})."
            )));
        }
        if strides[dh] <= 0 || strides[dw] <= 0 {
            bail_invalid!("{name}: Row and column strides should be larger than 0 ({strides:?}).");
        }
        if op.depthwise() && strides[dh] != strides[dw] {
            bail_invalid!(
                "{name}: Current implementation only supports equal length strides in the row \
                 and column dimensions ({strides:?})."
            );
        }
        let dilations = ints(name, attrs, "dilations")?.unwrap_or_else(|| vec![1; 4]);
        if dilations.len() != 4 {
            bail_invalid!(
                "{name}: Sliding window dilations field must specify 4 dimensions, got {}",
                dilations.len()
            );
        }
        if dilations[dn] != 1 || dilations[dc] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: Current implementation does not yet support dilations in the batch and \
                 depth dimensions (dilations {dilations:?})."
            )));
        }
        if dilations[dh] <= 0 || dilations[dw] <= 0 {
            bail_invalid!("{name}: Dilated rates should be larger than 0 ({dilations:?}).");
        }
        if op.depthwise() && (dilations[dh] != 1 || dilations[dw] != 1) {
            return Err(Error::Unimplemented(format!(
                "{name}: Current kernel implementation does not support dilations, received \
                 {dilations:?}"
            )));
        }
        let padding = match attrs.get("padding") {
            Some(AttrValue::Str(s)) if s == "SAME" => Padding::Same,
            Some(AttrValue::Str(s)) if s == "VALID" => Padding::Valid,
            Some(AttrValue::Str(s)) if s == "EXPLICIT" => Padding::Explicit,
            None => bail_invalid!("{name}: missing attribute padding"),
            Some(other) => {
                bail_invalid!("{name}: padding must be SAME, VALID or EXPLICIT, got {other:?}")
            }
        };
        let pads = ints(name, attrs, "explicit_paddings")?.unwrap_or_default();
        let mut explicit = [0usize; 4];
        if padding == Padding::Explicit {
            if pads.len() != 8 {
                bail_invalid!(
                    "{name}: explicit_paddings attribute must contain 8 values, but got: {}",
                    pads.len()
                );
            }
            if pads.iter().any(|&v| v < 0) {
                bail_invalid!(
                    "{name}: All elements of explicit_paddings must be nonnegative ({pads:?})"
                );
            }
            if pads[2 * dn] != 0
                || pads[2 * dn + 1] != 0
                || pads[2 * dc] != 0
                || pads[2 * dc + 1] != 0
            {
                bail_invalid!(
                    "{name}: Nonzero explicit padding in the batch or depth dimensions is not \
                     supported ({pads:?})"
                );
            }
            explicit = [
                pads[2 * dh] as usize,
                pads[2 * dh + 1] as usize,
                pads[2 * dw] as usize,
                pads[2 * dw + 1] as usize,
            ];
        } else if !pads.is_empty() {
            bail_invalid!(
                "{name}: explicit_paddings attribute must be empty if the padding attribute is \
                 not EXPLICIT"
            );
        }
        let tile = match attrs.get("_tfwgpu_tile") {
            None => None,
            Some(AttrValue::Str(s)) => Some(s.clone()),
            Some(v) => bail_invalid!("{name}: _tfwgpu_tile must be a string, got {v:?}"),
        };
        let splits = match attrs.get("_tfwgpu_splits") {
            None => None,
            Some(AttrValue::Int(v)) if *v >= 1 && *v <= 1024 => Some(*v as usize),
            Some(v) => {
                bail_invalid!("{name}: _tfwgpu_splits must be an int in [1, 1024], got {v:?}")
            }
        };
        let col_images = match attrs.get("_tfwgpu_col_images") {
            None => None,
            Some(AttrValue::Int(v)) if *v >= 1 => Some(*v as usize),
            Some(v) => {
                bail_invalid!("{name}: _tfwgpu_col_images must be a positive int, got {v:?}")
            }
        };
        Ok(ConvAttrs {
            nchw,
            strides: [strides[dh] as usize, strides[dw] as usize],
            dilations: [dilations[dh] as usize, dilations[dw] as usize],
            padding,
            explicit,
            tile,
            splits,
            heuristic_gemm: false,
            col_images,
        })
    }

    /// Output size and padding before, along one spatial dimension (`dim` 0 rows, 1 columns),
    /// as TensorFlow's `GetWindowedOutputSizeVerbose` computes them.
    fn windowed(
        &self,
        op: &str,
        dim: usize,
        input: usize,
        filter: usize,
    ) -> Result<(usize, usize)> {
        let (i, f) = (input as i64, filter as i64);
        let (s, d) = (self.strides[dim] as i64, self.dilations[dim] as i64);
        let eff = (f - 1) * d + 1;
        let (out, before) = match self.padding {
            Padding::Valid => ((i - eff + s) / s, 0),
            Padding::Same => {
                let out = (i + s - 1) / s;
                let needed = ((out - 1) * s + eff - i).max(0);
                (out, needed / 2)
            }
            Padding::Explicit => {
                let (b, a) = (
                    self.explicit[2 * dim] as i64,
                    self.explicit[2 * dim + 1] as i64,
                );
                ((i + b + a - eff + s) / s, b)
            }
        };
        if out < 0 {
            bail_invalid!(
                "{op}: Computed output size would be negative: {out} [input_size: {i}, \
                 effective_filter_size: {eff}, stride: {s}]"
            );
        }
        Ok((out as usize, before as usize))
    }
}

/// A shape as TensorFlow prints it: `[2,3]`.
fn fmt_shape(s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// The geometry of one convolution: input [n, h, w, c], filter [r, s, cg, k] (`groups` = c / cg
/// groups; for depthwise ops cg = 1, groups = c, k = c * multiplier), output [n, oh, ow, k].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Geom {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    r: usize,
    s: usize,
    cg: usize,
    k: usize,
    groups: usize,
    oh: usize,
    ow: usize,
    /// Padding before, rows and columns.
    pt: usize,
    pl: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    nchw: bool,
}

impl Geom {
    /// Input channels per group (cg) and output channels per group.
    fn kg(&self) -> usize {
        self.k / self.groups
    }

    /// Depthwise channel multiplier.
    fn mult(&self) -> usize {
        self.k / self.c.max(1)
    }

    fn shape(&self, n: usize, h: usize, w: usize, c: usize) -> Vec<usize> {
        if self.nchw {
            vec![n, c, h, w]
        } else {
            vec![n, h, w, c]
        }
    }

    fn output_shape(&self) -> Vec<usize> {
        self.shape(self.n, self.oh, self.ow, self.k)
    }

    /// Strides (n, h, w, c) of a contiguous tensor of h x w pixels and c channels.
    fn strides(&self, h: usize, w: usize, c: usize) -> [usize; 4] {
        if self.nchw {
            [c * h * w, w, 1, h * w]
        } else {
            [h * w * c, w * c, c, 1]
        }
    }

    fn x_strides(&self) -> [usize; 4] {
        self.strides(self.h, self.w, self.c)
    }

    fn y_strides(&self) -> [usize; 4] {
        self.strides(self.oh, self.ow, self.k)
    }
}

/// (n, h, w, c) of a 4-D shape in a data format.
fn nhwc(shape: &[usize], nchw: bool) -> [usize; 4] {
    let [dn, dh, dw, dc] = dims_of(nchw);
    [shape[dn], shape[dh], shape[dw], shape[dc]]
}

struct Conv {
    op: Op,
    a: ConvAttrs,
}

impl Conv {
    fn build(op: Op, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let a = ConvAttrs::parse(op, attrs)?;
        Ok(Box::new(Conv { op, a }))
    }

    /// The geometry from an input shape and a filter shape (both 4-D, validated here).
    fn geometry(&self, input: &[usize], filter: &[usize]) -> Result<Geom> {
        let name = self.op.name();
        if input.len() != 4 {
            bail_invalid!("{name}: input must be 4-dimensional: {}", fmt_shape(input));
        }
        if filter.len() != 4 {
            bail_invalid!(
                "{name}: filter must be 4-dimensional: {}",
                fmt_shape(filter)
            );
        }
        let [n, h, w, c] = nhwc(input, self.a.nchw);
        let (r, s) = (filter[0], filter[1]);
        let (cg, k, groups) = if self.op.depthwise() {
            if filter[2] != c {
                bail_invalid!(
                    "{name}: input and filter must have the same depth: {c} vs {}",
                    filter[2]
                );
            }
            (1, c * filter[3], c)
        } else {
            let (cg, k) = (filter[2], filter[3]);
            if cg == 0 {
                bail_invalid!("{name}: filter depth must be stricly positive, got {cg}");
            }
            if c % cg != 0 {
                bail_invalid!(
                    "{name}: input depth must be evenly divisible by filter depth: {c} vs {cg}"
                );
            }
            let groups = c / cg;
            if k % groups != 0 {
                bail_invalid!(
                    "{name}: output depth must be evenly divisible by number of groups: {k} vs \
                     {groups}"
                );
            }
            (cg, k, groups)
        };
        let (oh, pt) = self.a.windowed(name, 0, h, r)?;
        let (ow, pl) = self.a.windowed(name, 1, w, s)?;
        let g = Geom {
            n,
            h,
            w,
            c,
            r,
            s,
            cg,
            k,
            groups,
            oh,
            ow,
            pt,
            pl,
            sh: self.a.strides[0],
            sw: self.a.strides[1],
            dh: self.a.dilations[0],
            dw: self.a.dilations[1],
            nchw: self.a.nchw,
        };
        // Offsets are 32-bit in the shaders.
        for (what, count) in [
            ("input", n * h * w * c),
            ("filter", r * s * filter[2] * filter[3]),
            ("output", n * oh * ow * k),
        ] {
            if count > u32::MAX as usize / 2 {
                return Err(Error::Unimplemented(format!(
                    "{name}: the {what} has {count} elements; tensors of 2^31 elements or more \
                     are not supported"
                )));
            }
        }
        Ok(g)
    }

    /// A 4-value size vector from a host tensor.
    fn sizes(&self, t: &HostTensor, what: &str) -> Result<Vec<i64>> {
        let name = self.op.name();
        if t.shape.len() != 1 {
            bail_invalid!(
                "{name}: {what} must be 1-dimensional, got shape {}",
                fmt_shape(&t.shape)
            );
        }
        let v = t.to_i64_vec()?;
        if v.iter().any(|&d| d < 0) {
            bail_invalid!("{name}: {what} must be non-negative, got {v:?}");
        }
        Ok(v)
    }

    /// Checks that out_backprop has the shape the forward pass of `g` produces.
    fn check_backprop(&self, g: &Geom, dy: &[usize]) -> Result<()> {
        let name = self.op.name();
        if dy.len() != 4 {
            bail_invalid!(
                "{name}: out_backprop must be 4-dimensional: {}",
                fmt_shape(dy)
            );
        }
        let [n, oh, ow, k] = nhwc(dy, g.nchw);
        if n != g.n {
            bail_invalid!(
                "{name}: input and out_backprop must have the same batch size, input batch: {} \
                 outbackprop batch: {n}",
                g.n
            );
        }
        if k != g.k {
            bail_invalid!(
                "{name}: filter and out_backprop must have the same out_depth: {} vs {k} \
                 (out_backprop {})",
                g.k,
                fmt_shape(dy)
            );
        }
        for (dim, actual, computed, input, filter, stride, dilation) in [
            (1, oh, g.oh, g.h, g.r, g.sh, g.dh),
            (2, ow, g.ow, g.w, g.s, g.sw, g.dw),
        ] {
            if actual != computed {
                bail_invalid!(
                    "{name}: Size of out_backprop doesn't match computed: actual = {actual}, \
                     computed = {computed} spatial_dim: {dim} input: {input} filter: {filter} \
                     output: {actual} stride: {stride} dilation: {dilation}"
                );
            }
        }
        Ok(())
    }

    /// Validates the inputs: (geometry, dtype, output shape).
    fn check(&self, inputs: &[Operand]) -> Result<(Geom, DType, Vec<usize>)> {
        let name = self.op.name();
        if inputs.len() != 3 && !matches!(self.op, Op::Conv2D | Op::Depthwise) {
            bail_invalid!("{name} takes 3 inputs, got {}", inputs.len());
        }
        let data = |i: usize| -> Result<DType> {
            let t = inputs[i].dtype();
            if !DTYPES.contains(&t) {
                return Err(Error::Unimplemented(format!(
                    "{name} has no tfwgpu kernel for T={t}"
                )));
            }
            Ok(t)
        };
        match self.op {
            Op::Conv2D | Op::Depthwise => {
                if inputs.len() != 2 {
                    bail_invalid!(
                        "{name} takes 2 inputs (input, filter), got {}",
                        inputs.len()
                    );
                }
                let (tx, tf) = (data(0)?, data(1)?);
                if tx != tf {
                    bail_invalid!("{name}: input is {tx} but filter is {tf}; they must match");
                }
                let g = self.geometry(inputs[0].shape(), inputs[1].shape())?;
                let out = g.output_shape();
                Ok((g, tx, out))
            }
            Op::Conv2DBackpropInput | Op::DepthwiseBackpropInput => {
                let sizes = self.sizes(inputs[0].host(name, 0)?, "input_sizes")?;
                let (tf, tdy) = (data(1)?, data(2)?);
                if tf != tdy {
                    bail_invalid!(
                        "{name}: filter is {tf} but out_backprop is {tdy}; they must match"
                    );
                }
                let (filter, dy) = (inputs[1].shape(), inputs[2].shape());
                if filter.len() != 4 {
                    bail_invalid!(
                        "{name}: filter must be 4-dimensional: {}",
                        fmt_shape(filter)
                    );
                }
                if dy.len() != 4 {
                    bail_invalid!(
                        "{name}: out_backprop must be 4-dimensional: {}",
                        fmt_shape(dy)
                    );
                }
                let input: Vec<usize> = match sizes.len() {
                    4 => sizes.iter().map(|&d| d as usize).collect(),
                    2 if self.op == Op::Conv2DBackpropInput => {
                        let n = nhwc(dy, self.a.nchw)[0];
                        let (h, w) = (sizes[0] as usize, sizes[1] as usize);
                        if self.a.nchw {
                            vec![n, filter[2], h, w]
                        } else {
                            vec![n, h, w, filter[2]]
                        }
                    }
                    k => bail_invalid!(
                        "{name} requires input_sizes to contain 4 values{}, but got: {k}",
                        if self.op == Op::Conv2DBackpropInput {
                            " or 2 values"
                        } else {
                            ""
                        }
                    ),
                };
                let g = self.geometry(&input, filter)?;
                self.check_backprop(&g, dy)?;
                Ok((g, tf, input))
            }
            Op::Conv2DBackpropFilter | Op::DepthwiseBackpropFilter => {
                let sizes = self.sizes(inputs[1].host(name, 1)?, "filter_sizes")?;
                let (tx, tdy) = (data(0)?, data(2)?);
                if tx != tdy {
                    bail_invalid!(
                        "{name}: input is {tx} but out_backprop is {tdy}; they must match"
                    );
                }
                if sizes.len() != 4 {
                    bail_invalid!(
                        "{name}: filter_sizes must contain 4 values, but got: {}",
                        sizes.len()
                    );
                }
                let filter: Vec<usize> = sizes.iter().map(|&d| d as usize).collect();
                let g = self.geometry(inputs[0].shape(), &filter)?;
                self.check_backprop(&g, inputs[2].shape())?;
                Ok((g, tx, filter))
            }
        }
    }
}

impl Kernel for Conv {
    fn op(&self) -> &'static str {
        self.op.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, dtype, shape) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(dtype, &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.op.name();
        let (g, dtype, shape) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc.shape != shape || out.desc.dtype != dtype {
            bail_invalid!(
                "{name}: output is {} {} but must be {dtype} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                fmt_shape(&shape)
            );
        }
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let dev = |i: usize| inputs[i].device(name, i);
        // CPU adapters: the subgroup register tile (`cpu.rs`) where it applies, unless a GEMM
        // tile is forced.
        let forced_cpu = self
            .a
            .tile
            .as_deref()
            .is_some_and(|t| CPU_CONV_TILES.iter().any(|c| c.name == t));
        let gemm_forced = self.a.tile.is_some() && !forced_cpu;
        // "gemm": the implicit GEMM with its heuristic tile (for comparisons on CPU adapters
        // and with the tuned path).
        let auto_gemm;
        // "gpu": the GPU adapters' automatic path (1x1 convolutions on the matmul kernels,
        // tuned tiles where tuning is on).
        let attrs = match self.a.tile.as_deref() {
            Some(t @ ("gemm" | "gpu")) => {
                auto_gemm = ConvAttrs {
                    tile: None,
                    heuristic_gemm: t == "gemm",
                    ..self.a.clone()
                };
                &auto_gemm
            }
            // A cooperative-matrix tile where that path does not apply (shape, dtype,
            // device): the GEMM with its own choice.
            Some(t)
                if crate::kernels::matmul::coop::COOP_TILES
                    .iter()
                    .any(|c| c.name == t) =>
            {
                auto_gemm = ConvAttrs {
                    tile: None,
                    ..self.a.clone()
                };
                &auto_gemm
            }
            _ => &self.a,
        };
        let coop_forced = self.a.tile.as_deref().is_some_and(|t| {
            crate::kernels::matmul::coop::COOP_TILES
                .iter()
                .any(|c| c.name == t)
        });
        let mode = match self.op {
            Op::Conv2D => Some((gemm::Mode::Forward, 0, 1)),
            Op::Conv2DBackpropInput => Some((gemm::Mode::BackpropInput, 2, 1)),
            Op::Conv2DBackpropFilter => Some((gemm::Mode::BackpropFilter, 0, 2)),
            _ => None,
        };
        if let Some((mode, ia, ib)) = mode {
            let lanes = cpu::fixed_lanes(ctx);
            let wanted = forced_cpu
                || (!gemm_forced && ctx.dev.desc.device_type == "cpu" && lanes.is_some());
            if wanted {
                match lanes {
                    // float16 on a CPU adapter without cooperative matrices (real, or the
                    // tests' emulated ones): the operands widened exactly to float32, the
                    // float32 register tile, the result rounded once (the products of halves
                    // are exact in float32 either way; the generic float16 GEMM ran 10-20x
                    // slower than this on lavapipe).
                    Some(s)
                        if dtype == DType::F16
                            && cpu::applies(&g, DType::F32)
                            && crate::kernels::matmul::coop::coop_mode(ctx).is_none() =>
                    {
                        let wide = |r: &DeviceRef| -> Result<DeviceRef> {
                            let w = ctx.temp_tensor(TensorDesc::new(DType::F32, &r.desc.shape))?;
                            crate::kernels::nn::f16::convert(ctx, name, r, &w)?;
                            Ok(w)
                        };
                        let (a, b) = (wide(dev(ia)?)?, wide(dev(ib)?)?);
                        let res = ctx.temp_tensor(TensorDesc::new(DType::F32, &shape))?;
                        cpu::record(ctx, name, mode, &g, &self.a, s, &a, &b, &res)?;
                        return crate::kernels::nn::f16::convert(ctx, name, &res, out);
                    }
                    Some(s) if cpu::applies(&g, dtype) => {
                        return cpu::record(
                            ctx,
                            name,
                            mode,
                            &g,
                            &self.a,
                            s,
                            dev(ia)?,
                            dev(ib)?,
                            out,
                        );
                    }
                    _ if forced_cpu => {
                        return Err(Error::Unimplemented(format!(
                            "{name}: the CPU tiles need float32 NHWC with one group and \
                             subgroups of a fixed size"
                        )));
                    }
                    _ => {}
                }
            }
        }
        if self.op == Op::Conv2D
            && !forced_cpu
            && coop::try_forward(ctx, name, &g, &self.a, dev(0)?, dev(1)?, out)?
        {
            return Ok(());
        }
        if self.op == Op::Conv2DBackpropInput
            && !forced_cpu
            && coop::try_backprop_input(ctx, name, &g, &self.a, dev(2)?, dev(1)?, out)?
        {
            return Ok(());
        }
        if self.op == Op::Conv2DBackpropFilter
            && !forced_cpu
            && coop::try_backprop_filter(ctx, name, &g, &self.a, dev(0)?, dev(2)?, out)?
        {
            return Ok(());
        }
        if coop_forced {
            // Reported, once per op and tile: whoever forced the tile (a benchmark) gets the
            // GEMM's time under that tile's name otherwise.
            static SEEN: std::sync::OnceLock<
                parking_lot::Mutex<std::collections::HashSet<String>>,
            > = std::sync::OnceLock::new();
            let key = format!("{name} {}", self.a.tile.as_deref().unwrap_or_default());
            if SEEN.get_or_init(Default::default).lock().insert(key) {
                tracing::warn!(
                    "{name}: the forced cooperative-matrix tile {:?} does not apply here; the \
                     GEMM runs instead",
                    self.a.tile
                );
            }
        }
        match self.op {
            Op::Conv2D => gemm::record(
                ctx,
                name,
                gemm::Mode::Forward,
                &g,
                attrs,
                dev(0)?,
                dev(1)?,
                out,
            ),
            Op::Conv2DBackpropInput => gemm::record(
                ctx,
                name,
                gemm::Mode::BackpropInput,
                &g,
                attrs,
                dev(2)?,
                dev(1)?,
                out,
            ),
            Op::Conv2DBackpropFilter => gemm::record(
                ctx,
                name,
                gemm::Mode::BackpropFilter,
                &g,
                attrs,
                dev(0)?,
                dev(2)?,
                out,
            ),
            Op::Depthwise => depthwise::record(
                ctx,
                name,
                depthwise::Mode::Forward,
                &g,
                attrs,
                dev(0)?,
                dev(1)?,
                out,
            ),
            Op::DepthwiseBackpropInput => depthwise::record(
                ctx,
                name,
                depthwise::Mode::BackpropInput,
                &g,
                attrs,
                dev(2)?,
                dev(1)?,
                out,
            ),
            Op::DepthwiseBackpropFilter => depthwise::record(
                ctx,
                name,
                depthwise::Mode::BackpropFilter,
                &g,
                attrs,
                dev(0)?,
                dev(2)?,
                out,
            ),
        }
    }
}
