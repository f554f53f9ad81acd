//! Image resize family, NHWC: ImageProjectiveTransformV2/V3 (Keras's RandomRotation, RandomZoom,
//! RandomTranslation; float32, float16; `transform.wgsl`, TensorFlow's coordinate mapping and
//! interpolation), ResizeBilinear (float32 and float16 images; float32 output, as
//! TensorFlow), ResizeBilinearGrad, ResizeNearestNeighbor (float32, float16, int32, int64,
//! uint8) and ResizeNearestNeighborGrad, with `align_corners` and `half_pixel_centers`.
//!
//! Semantics, messages and the float32 arithmetic are TensorFlow's CPU kernels'
//! (`image_resizer_state.h`, `resize_bilinear_op.cc`, `resize_nearest_neighbor_op.cc`): the
//! scale `in / out` (or `(in - 1) / (out - 1)` with align_corners), the source coordinate per
//! output position, bilinear taps at its floor and ceiling, the lerps in TensorFlow's order, a
//! same-size bilinear resize as a plain copy. The gradients gather instead of scattering (no
//! atomics; `resize.wgsl` visits only the resized positions near each pixel) and add in
//! TensorFlow's CPU order, so float32 sums round alike up to the GPU's contraction of
//! multiply-adds; where a pixel's window is long (upsampling by a large factor, `MAX_WINDOW`)
//! they scatter with atomic adds instead, in the GPU's order (as TensorFlow's GPU kernels).
//! float16 gradients accumulate in float32 and round once (TensorFlow's bilinear gradient does
//! so; its CPU nearest-neighbour gradient adds in half, and drifts from the exact sum where
//! many elements add into one pixel: 7,676 against 9,891 for a 1 x 1 image resized to 100 x
//! 100).

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{bind_out, fmt_shape};
use crate::kernels::layout::strided::select_block;
use crate::kernels::slice::{dispatch_words, load_fn, u32_of};
use crate::kernels::wgsl::{ATOMIC_ADD_OUT, LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Error, Result, bail_invalid};

const RESIZE_WGSL: &str = include_str!("resize.wgsl");
const TRANSFORM_WGSL: &str = include_str!("transform.wgsl");

const FLOAT: &[DType] = &[DType::F32, DType::F16];
const NEAREST: &[DType] = &[DType::F32, DType::F16, DType::I32, DType::I64, DType::U8];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "ImageProjectiveTransformV3",
        type_attr: "dtype",
        dtypes: FLOAT,
        host_inputs: &[(2, "output_shape"), (3, "fill_value")],
        factory: |a| {
            crate::kernels::nn::f16::build(
                |a| Ok(Box::new(Transform::new(a, true)?)),
                a,
                &["dtype"],
            )
        },
    },
    OpDef {
        op: "ImageProjectiveTransformV2",
        type_attr: "dtype",
        dtypes: FLOAT,
        host_inputs: &[(2, "output_shape")],
        factory: |a| {
            crate::kernels::nn::f16::build(
                |a| Ok(Box::new(Transform::new(a, false)?)),
                a,
                &["dtype"],
            )
        },
    },
    OpDef {
        op: "ResizeBilinear",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[(1, "size")],
        factory: |a| Ok(Box::new(Resize::new(a, Kind::Bilinear)?)),
    },
    OpDef {
        op: "ResizeBilinearGrad",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |a| {
            crate::kernels::nn::f16::build(
                |a| Ok(Box::new(Resize::new(a, Kind::BilinearGrad)?)),
                a,
                &["T"],
            )
        },
    },
    OpDef {
        op: "ResizeNearestNeighbor",
        type_attr: "T",
        dtypes: NEAREST,
        host_inputs: &[(1, "size")],
        factory: |a| Ok(Box::new(Resize::new(a, Kind::Nearest)?)),
    },
    OpDef {
        op: "ResizeNearestNeighborGrad",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[(1, "size")],
        factory: |a| {
            crate::kernels::nn::f16::build(
                |a| Ok(Box::new(Resize::new(a, Kind::NearestGrad)?)),
                a,
                &["T"],
            )
        },
    },
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Bilinear,
    BilinearGrad,
    Nearest,
    NearestGrad,
}

impl Kind {
    fn op(self) -> &'static str {
        match self {
            Kind::Bilinear => "ResizeBilinear",
            Kind::BilinearGrad => "ResizeBilinearGrad",
            Kind::Nearest => "ResizeNearestNeighbor",
            Kind::NearestGrad => "ResizeNearestNeighborGrad",
        }
    }
}

struct Resize {
    kind: Kind,
    align_corners: bool,
    half_pixel: bool,
}

/// TensorFlow's `CalculateResizeScale`.
fn scale(in_size: usize, out_size: usize, align_corners: bool) -> f32 {
    if align_corners && out_size > 1 {
        (in_size - 1) as f32 / (out_size - 1) as f32
    } else {
        in_size as f32 / out_size as f32
    }
}

/// The longest window (resized positions per pixel, rows times columns) a gradient gathers
/// over in one invocation; longer ones scatter. (CPU adapters cut a shader loop short past
/// 65,535 iterations: lavapipe returned wrong sums for a 1 x 1 image resized to 260 x 260.)
const MAX_WINDOW: usize = 4096;

/// One resize: the image side (forward input, gradient output) and the resized side.
#[derive(Debug, PartialEq)]
struct Geometry {
    batch: usize,
    channels: usize,
    /// Image height and width.
    ih: usize,
    iw: usize,
    /// Resized height and width.
    oh: usize,
    ow: usize,
    out: TensorDesc,
}

/// The (height, width) of a `size` input, checked as TensorFlow does.
fn size_arg(inputs: &[Operand], op: &str, positive: &str) -> Result<(usize, usize)> {
    let t = inputs[1].host(op, 1)?;
    if t.shape.len() != 1 {
        bail_invalid!("shape_t must be 1-dimensional{}", fmt_shape(&t.shape));
    }
    if t.shape[0] != 2 {
        bail_invalid!("shape_t must have two elements{}", fmt_shape(&t.shape));
    }
    let v = t.to_i64_vec()?;
    if v[0] <= 0 || v[1] <= 0 {
        bail_invalid!("{positive}");
    }
    Ok((v[0] as usize, v[1] as usize))
}

impl Geometry {
    /// The most resized positions `resize.wgsl`'s `window` visits for one pixel: per axis the
    /// positions whose coordinate lies within one pixel, plus the margins (all of them when
    /// the scale is 0: align_corners from a size of 1).
    fn window(&self) -> usize {
        let axis = |image: usize, resized: usize| -> usize {
            let s = scale(image, resized, true).min(scale(image, resized, false));
            if s <= 0.0 {
                resized
            } else {
                ((2.0 / s).ceil() as usize + 4).min(resized)
            }
        };
        axis(self.ih, self.oh).saturating_mul(axis(self.iw, self.ow))
    }
}

impl Resize {
    fn new(attrs: &Attrs, kind: Kind) -> Result<Resize> {
        Ok(Resize {
            kind,
            align_corners: attrs.bool_or("align_corners", false)?,
            half_pixel: attrs.bool_or("half_pixel_centers", false)?,
        })
    }

    fn geometry(&self, inputs: &[Operand]) -> Result<Geometry> {
        let op = self.kind.op();
        if inputs.len() != 2 {
            bail_invalid!("{op} takes 2 inputs, got {}", inputs.len());
        }
        if self.half_pixel && self.align_corners {
            bail_invalid!("If half_pixel_centers is True, align_corners must be False.");
        }
        let x = inputs[0].shape();
        let dtype = inputs[0].dtype();
        match self.kind {
            Kind::Bilinear | Kind::Nearest => {
                if x.len() != 4 {
                    bail_invalid!("input must be 4-dimensional{}", fmt_shape(x));
                }
                if x[3] == 0 {
                    bail_invalid!("image must have at least one channel");
                }
                if x[1] == 0 || x[2] == 0 {
                    bail_invalid!("input image must be of non-zero size");
                }
                let (oh, ow) = size_arg(inputs, op, "output dimensions must be positive")?;
                let out_dtype = if self.kind == Kind::Bilinear {
                    DType::F32
                } else {
                    dtype
                };
                Ok(Geometry {
                    batch: x[0],
                    channels: x[3],
                    ih: x[1],
                    iw: x[2],
                    oh,
                    ow,
                    out: TensorDesc::new(out_dtype, &[x[0], oh, ow, x[3]]),
                })
            }
            Kind::BilinearGrad => {
                if x.len() != 4 {
                    bail_invalid!("input_grad must be 4-dimensional{}", fmt_shape(x));
                }
                if dtype != DType::F32 {
                    bail_invalid!("input_grad must be of type float{}", dtype.name());
                }
                if x[1] == 0 || x[2] == 0 {
                    bail_invalid!("resized dimensions must be positive");
                }
                let orig = inputs[1].shape();
                if orig.len() != 4 {
                    bail_invalid!("original_image must be 4-dimensional{}", fmt_shape(orig));
                }
                if orig[1] == 0 || orig[2] == 0 {
                    bail_invalid!("original dimensions must be positive");
                }
                Ok(Geometry {
                    batch: x[0],
                    channels: x[3],
                    ih: orig[1],
                    iw: orig[2],
                    oh: x[1],
                    ow: x[2],
                    out: TensorDesc::new(inputs[1].dtype(), &[x[0], orig[1], orig[2], x[3]]),
                })
            }
            Kind::NearestGrad => {
                if x.len() != 4 {
                    bail_invalid!("input must be 4-dimensional{}", fmt_shape(x));
                }
                let (ih, iw) = size_arg(inputs, op, "shape_t's elements must be positive")?;
                Ok(Geometry {
                    batch: x[0],
                    channels: x[3],
                    ih,
                    iw,
                    oh: x[1],
                    ow: x[2],
                    out: TensorDesc::new(dtype, &[x[0], ih, iw, x[3]]),
                })
            }
        }
    }

    /// The shader's params: sizes, flags, scales (image over resized) and the coordinate's
    /// (a, b).
    fn params(&self, g: &Geometry, n: usize, words: Option<usize>) -> Result<Vec<u32>> {
        let op = self.kind.op();
        let nearest = matches!(self.kind, Kind::Nearest | Kind::NearestGrad);
        let (a, b) = match (self.half_pixel, nearest) {
            (true, false) => (0.5f32, -0.5f32),
            (true, true) => (0.5, 0.0),
            _ => (0.0, 0.0),
        };
        let mut flags = 0u32;
        if nearest && self.align_corners {
            flags |= 1;
        }
        if self.kind == Kind::Bilinear && g.oh == g.ih && g.ow == g.iw {
            flags |= 2;
        }
        if self.kind == Kind::NearestGrad {
            flags |= 4;
        }
        let dims = [g.channels, g.ow, g.oh, g.iw, g.ih]
            .iter()
            .map(|&d| u32_of(op, "dimension", d))
            .collect::<Result<Vec<u32>>>()?;
        let mut v = vec![0, u32_of(op, "output size", n)?];
        if let Some(w) = words {
            v.push(u32_of(op, "output words", w)?);
        }
        v.extend(dims);
        v.push(flags);
        v.push(scale(g.ih, g.oh, self.align_corners).to_bits());
        v.push(scale(g.iw, g.ow, self.align_corners).to_bits());
        v.push(a.to_bits());
        v.push(b.to_bits());
        while v.len() % 4 != 0 {
            v.push(0);
        }
        Ok(v)
    }
}

/// The nearest-neighbour forward: one output word per invocation through the slice family's
/// packing, any element size.
const NEAREST_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    words: u32,
    c: u32,
    ow: u32,
    oh: u32,
    iw: u32,
    ih: u32,
    flags: u32,
    hs: f32,
    ws: f32,
    a: f32,
    b: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> inp: array<u32>;

fn nearest(o: u32, s: f32, size: u32) -> u32 {
    let v = (f32(o) + p.a) * s + p.b;
    var k = floor(v);
    if (p.flags & 1u) != 0u {
        let t = trunc(v);
        k = select(t, t + 1.0, v - t >= 0.5);
    }
    return u32(clamp(i32(k), 0, i32(size) - 1));
}

fn value(e: u32) -> vec2<u32> {
    let ch = e % p.c;
    var r = e / p.c;
    let x = r % p.ow;
    r = r / p.ow;
    let y = r % p.oh;
    let b = r / p.oh;
    let iy = nearest(y, p.hs, p.ih);
    let ix = nearest(x, p.ws, p.iw);
    return load_inp(((b * p.ih + iy) * p.iw + ix) * p.c + ch);
}
";

impl Kernel for Resize {
    fn op(&self) -> &'static str {
        self.kind.op()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.geometry(inputs)?.out])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.kind.op();
        let g = self.geometry(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))?;
        if out.desc != g.out {
            bail_invalid!(
                "{op}: output is {} {} but the op computes {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                g.out.dtype,
                fmt_shape(&g.out.shape)
            );
        }
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device(op, 0)?;
        if self.kind == Kind::Nearest {
            let esize = x.desc.dtype.size();
            let mut p = self.params(&g, n, Some(0))?;
            let bindings = [bind_out(ctx, op, out)?, ctx.bind(x)?];
            return dispatch_words(
                ctx,
                "resize_nearest",
                || format!("{NEAREST_WGSL}\n{}", load_fn("inp", esize)),
                &mut p,
                &bindings,
                n,
                out.desc.dtype,
            );
        }
        // float32 source: a float16 image is widened first (the bilinear forward; the
        // gradients' float16 runs through `nn::f16`).
        let src = if x.desc.dtype == DType::F16 {
            let t = ctx.temp_tensor(TensorDesc::new(DType::F32, &x.desc.shape))?;
            crate::kernels::nn::f16::convert(ctx, op, x, &t)?;
            t
        } else {
            x.clone()
        };
        if src.desc.dtype != DType::F32 || out.desc.dtype != DType::F32 {
            return Err(Error::Gpu(format!(
                "{op}: internal error: {} to {}",
                src.desc.dtype, out.desc.dtype
            )));
        }
        // A gradient gathers over each pixel's window of resized positions, unless that window
        // is long (`MAX_WINDOW`): then the gradient elements scatter into the zeroed output.
        let scatter = self.kind != Kind::Bilinear && g.window() > MAX_WINDOW;
        let variant = match self.kind {
            Kind::Bilinear => "BILINEAR",
            _ if scatter => "SCATTER",
            _ => "GATHER",
        };
        let pipeline = ctx.pipeline(
            PipelineKey::new("resize", Some(DType::F32), variant.to_lowercase()),
            || {
                ShaderSource::new(
                    select_block(RESIZE_WGSL, variant)
                        .replace("ATOMIC_ADD_OUT", ATOMIC_ADD_OUT)
                        .replace("LINEAR_INDEX", LINEAR_INDEX)
                        .replace("WG", &WG.to_string()),
                )
            },
        )?;
        let o = bind_out(ctx, op, out)?;
        // The scatter runs over the gradient's elements, into zeros.
        let threads = if scatter {
            ctx.clear(&o, out.desc.byte_size())?;
            src.desc.num_elements()
        } else {
            n
        };
        let (groups, row) = grid_1d(threads as u64, WG);
        let mut p = self.params(&g, threads, None)?;
        p[0] = row;
        ctx.dispatch(&pipeline, &params(&p), &[ctx.bind(&src)?, o], groups)
    }
}

/// ImageProjectiveTransformV3 (`fill_value` input) or V2 (fill 0).
struct Transform {
    v3: bool,
    bilinear: bool,
    /// 0 reflect, 1 wrap, 2 constant, 3 nearest.
    mode: u32,
}

impl Transform {
    fn new(attrs: &Attrs, v3: bool) -> Result<Transform> {
        let s = |name: &str, default: &str| -> Result<String> {
            match attrs.get(name) {
                None => Ok(default.to_string()),
                Some(crate::AttrValue::Str(v)) => Ok(v.clone()),
                Some(v) => bail_invalid!("attribute {name} must be a string, got {v:?}"),
            }
        };
        let interpolation = s("interpolation", "BILINEAR")?;
        let bilinear = match interpolation.as_str() {
            "BILINEAR" => true,
            "NEAREST" => false,
            other => {
                bail_invalid!("Invalid interpolation {other}. Supported types: NEAREST, BILINEAR")
            }
        };
        let fill_mode = s("fill_mode", "CONSTANT")?;
        let mode = match fill_mode.as_str() {
            "REFLECT" => 0,
            "WRAP" => 1,
            "CONSTANT" => 2,
            "NEAREST" => 3,
            other => bail_invalid!(
                "Invalid mode {other}. Supported types: REFLECT, WRAP, CONSTANT, NEAREST"
            ),
        };
        Ok(Transform { v3, bilinear, mode })
    }

    fn name(&self) -> &'static str {
        if self.v3 {
            "ImageProjectiveTransformV3"
        } else {
            "ImageProjectiveTransformV2"
        }
    }

    /// (output desc, whether every image has its own transform row, the fill value).
    fn check(&self, inputs: &[Operand]) -> Result<(TensorDesc, bool, f32)> {
        let op = self.name();
        let want = if self.v3 { 4 } else { 3 };
        if inputs.len() != want {
            bail_invalid!("{op} takes {want} inputs, got {}", inputs.len());
        }
        let x = inputs[0].shape();
        if x.len() != 4 {
            bail_invalid!("Input images must have rank 4");
        }
        let t = inputs[1].shape();
        if inputs[1].dtype() != DType::F32
            || t.len() != 2
            || !(t[0] == x[0] || t[0] == 1)
            || t[1] != 8
        {
            bail_invalid!("Input transform should be num_images x 8 or 1 x 8");
        }
        let st = inputs[2].host(op, 2)?;
        if st.shape.len() != 1 {
            bail_invalid!("output shape must be 1-dimensional{}", fmt_shape(&st.shape));
        }
        if st.shape[0] != 2 {
            bail_invalid!(
                "output shape must have two elements{}",
                fmt_shape(&st.shape)
            );
        }
        let v = st.to_i64_vec()?;
        if v[0] <= 0 || v[1] <= 0 {
            bail_invalid!("output dimensions must be positive");
        }
        let fill = if self.v3 {
            let f = inputs[3].host(op, 3)?;
            if !f.shape.is_empty() {
                bail_invalid!("fill_value must be a scalar{}", fmt_shape(&f.shape));
            }
            f.to_vec::<f32>()?[0]
        } else {
            0.0
        };
        let out = TensorDesc::new(
            inputs[0].dtype(),
            &[x[0], v[0] as usize, v[1] as usize, x[3]],
        );
        Ok((out, t[0] == x[0] && x[0] != 1, fill))
    }
}

impl Kernel for Transform {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?.0])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.name();
        let (desc, per_image, fill) = self.check(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))?;
        if out.desc != desc || desc.dtype != DType::F32 {
            return Err(Error::Gpu(format!(
                "{op}: internal error: output {:?}, expected float32 {:?}",
                out.desc, desc
            )));
        }
        let n = desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device(op, 0)?;
        let t = inputs[1].device(op, 1)?;
        let dims = [
            x.desc.shape[3],
            desc.shape[2],
            desc.shape[1],
            x.desc.shape[2],
            x.desc.shape[1],
        ]
        .iter()
        .map(|&d| u32_of(op, "dimension", d))
        .collect::<Result<Vec<u32>>>()?;
        let (groups, row) = grid_1d(n as u64, WG);
        let mut p = vec![row, u32_of(op, "output size", n)?];
        p.extend(dims);
        p.push(self.bilinear as u32 | (self.mode << 1));
        p.push(if per_image { 8 } else { 0 });
        p.push(fill.to_bits());
        p.extend([0, 0]);
        let pipeline = ctx.pipeline(
            PipelineKey::new("resize", Some(DType::F32), "projective"),
            || {
                ShaderSource::new(
                    TRANSFORM_WGSL
                        .replace("LINEAR_INDEX", LINEAR_INDEX)
                        .replace("WG", &WG.to_string()),
                )
            },
        )?;
        ctx.dispatch(
            &pipeline,
            &params(&p),
            &[ctx.bind(x)?, ctx.bind(t)?, bind_out(ctx, op, out)?],
            groups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_tensorflows() {
        assert_eq!(scale(4, 8, false), 0.5);
        assert_eq!(scale(4, 7, true), 0.5);
        assert_eq!(scale(5, 1, true), 5.0);
        assert_eq!(scale(1, 6, true), 0.0);
    }

    #[test]
    fn params_layout_matches_the_shaders() {
        let r = Resize {
            kind: Kind::Bilinear,
            align_corners: false,
            half_pixel: true,
        };
        let g = Geometry {
            batch: 2,
            channels: 3,
            ih: 4,
            iw: 5,
            oh: 8,
            ow: 10,
            out: TensorDesc::new(DType::F32, &[2, 8, 10, 3]),
        };
        let p = r.params(&g, 480, None).unwrap();
        assert_eq!(p.len(), 12);
        assert_eq!(&p[1..8], &[480, 3, 10, 8, 5, 4, 0]);
        assert_eq!(f32::from_bits(p[8]), 0.5);
        assert_eq!((f32::from_bits(p[10]), f32::from_bits(p[11])), (0.5, -0.5));
        // The word kernel's params have `words` third: 16 words with padding.
        let nn = Resize {
            kind: Kind::Nearest,
            align_corners: true,
            half_pixel: false,
        };
        let p = nn.params(&g, 480, Some(0)).unwrap();
        assert_eq!(p.len(), 16);
        assert_eq!(p[8], 1);
    }
}
