//! 3-D pooling: MaxPool3D, AvgPool3D, MaxPool3DGrad and AvgPool3DGrad (float32, float16;
//! NDHWC or NCDHW; SAME or VALID), one shader (`pool3d.wgsl`), one invocation per output word,
//! every result gathered.
//!
//! Semantics are TensorFlow 2.21's CPU kernels (checked against them): windows hold only
//! in-bounds elements; MaxPool3D starts from the lowest finite value and takes only greater
//! elements (NaN ignored); AvgPool3D divides by the in-bounds count; MaxPool3DGrad routes each
//! output's gradient to every element of its window within 1e-5 of orig_output (the CPU
//! kernel's mask `|in - out| < 1e-5`, computed in the tensor's type: tied and nearly tied
//! maxima all receive it, an infinite maximum gives none; TensorFlow's GPU kernels pick one
//! element); AvgPool3DGrad adds
//! grad / count over the covering outputs. Sums run in float32 and float16 results are rounded
//! once (TensorFlow's CPU kernels add halves in half). Pooling over the batch or the channels is
//! Unimplemented, as in TensorFlow.

use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::PipelineKey;
use crate::kernels::elementwise::{bind_out, fmt_shape, words_for};
use crate::kernels::spatial;
use crate::kernels::wgsl::{WG, params};
use crate::{DType, Error, Result, bail_invalid};

const POOL3D_WGSL: &str = include_str!("pool3d.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode3 {
    Max,
    Avg,
    MaxGrad,
    AvgGrad,
}

impl Mode3 {
    fn name(self) -> &'static str {
        match self {
            Mode3::Max => "MaxPool3D",
            Mode3::Avg => "AvgPool3D",
            Mode3::MaxGrad => "MaxPool3DGrad",
            Mode3::AvgGrad => "AvgPool3DGrad",
        }
    }

    fn index(self) -> u32 {
        match self {
            Mode3::Max => 0,
            Mode3::Avg => 1,
            Mode3::MaxGrad => 2,
            Mode3::AvgGrad => 3,
        }
    }
}

pub(super) struct Pool3d {
    mode: Mode3,
    ncdhw: bool,
    /// (depth, rows, columns).
    ksize: [usize; 3],
    strides: [usize; 3],
    same: bool,
}

/// Sizes and padding of one pooling: input (n, d, h, w, c), output (od, oh, ow), padding
/// before (pd, ph, pw).
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    dhw: [usize; 3],
    c: usize,
    out: [usize; 3],
    pad: [usize; 3],
}

impl Pool3d {
    pub(super) fn build(mode: Mode3, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let name = mode.name();
        let ncdhw = spatial::ncdhw(name, attrs)?;
        let (nc, dhw) = spatial::dims_5d(ncdhw);
        let ksize = spatial::five_ints(name, attrs, "ksize", None)?;
        let strides = spatial::five_ints(name, attrs, "strides", None)?;
        if ksize[nc[0]] != 1 || strides[nc[0]] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: Pooling is not yet supported on the batch dimension."
            )));
        }
        if ksize[nc[1]] != 1 || strides[nc[1]] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: Pooling is not yet supported on the depth (channel) dimension."
            )));
        }
        if dhw.iter().any(|&i| ksize[i] <= 0 || strides[i] <= 0) {
            bail_invalid!("{name}: Sliding window ksize and strides must be positive");
        }
        let same = spatial::same_padding(name, attrs)?;
        Ok(Box::new(Pool3d {
            mode,
            ncdhw,
            ksize: dhw.map(|i| ksize[i] as usize),
            strides: dhw.map(|i| strides[i] as usize),
            same,
        }))
    }

    /// The geometry of a 5-D input shape in the data format.
    fn geom(&self, shape: &[usize]) -> Result<Geom> {
        let name = self.mode.name();
        if shape.len() != 5 {
            bail_invalid!(
                "{name}: tensor_in must be 5-dimensional, got {}",
                fmt_shape(shape)
            );
        }
        let (n, dhw, c) = if self.ncdhw {
            (shape[0], [shape[2], shape[3], shape[4]], shape[1])
        } else {
            (shape[0], [shape[1], shape[2], shape[3]], shape[4])
        };
        let mut out = [0usize; 3];
        let mut pad = [0usize; 3];
        for i in 0..3 {
            (out[i], pad[i]) =
                spatial::windowed(name, self.same, dhw[i], self.ksize[i], self.strides[i])?;
        }
        Ok(Geom {
            n,
            dhw,
            c,
            out,
            pad,
        })
    }

    fn shape(&self, g: &Geom, dhw: [usize; 3]) -> Vec<usize> {
        if self.ncdhw {
            vec![g.n, g.c, dhw[0], dhw[1], dhw[2]]
        } else {
            vec![g.n, dhw[0], dhw[1], dhw[2], g.c]
        }
    }

    /// Validates the inputs: the geometry and the output's descriptor.
    fn check(&self, inputs: &[Operand]) -> Result<(Geom, TensorDesc)> {
        let name = self.mode.name();
        let want = match self.mode {
            Mode3::Max | Mode3::Avg => 1,
            Mode3::AvgGrad => 2,
            Mode3::MaxGrad => 3,
        };
        if inputs.len() != want {
            bail_invalid!("{name} takes {want} inputs, got {}", inputs.len());
        }
        let (in_shape, dtype) = match self.mode {
            Mode3::AvgGrad => {
                let s = inputs[0].host(name, 0)?.to_i64_vec()?;
                if s.len() != 5 || s.iter().any(|&v| v < 0) {
                    bail_invalid!(
                        "{name}: orig_input_shape must have 5 non-negative elements, got {s:?}"
                    );
                }
                (
                    s.iter().map(|&v| v as usize).collect::<Vec<_>>(),
                    inputs[1].dtype(),
                )
            }
            Mode3::MaxGrad => (inputs[0].shape().to_vec(), inputs[2].dtype()),
            _ => (inputs[0].shape().to_vec(), inputs[0].dtype()),
        };
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={dtype}"
            )));
        }
        let g = self.geom(&in_shape)?;
        let pooled = self.shape(&g, g.out);
        let check_shape =
            |i: usize, what: &str, want: &[usize]| super::expect_shape(name, inputs, i, what, want);
        let out_shape = match self.mode {
            Mode3::Max | Mode3::Avg => pooled,
            Mode3::AvgGrad => {
                check_shape(1, "grad", &pooled)?;
                in_shape.clone()
            }
            Mode3::MaxGrad => {
                for i in [0, 1] {
                    if inputs[i].dtype() != dtype {
                        return Err(Error::Unimplemented(format!(
                            "{name}: orig_input / orig_output of {} with gradients of {dtype}",
                            inputs[i].dtype()
                        )));
                    }
                }
                check_shape(1, "orig_output", &pooled)?;
                check_shape(2, "grad", &pooled)?;
                in_shape.clone()
            }
        };
        let n: usize = out_shape
            .iter()
            .product::<usize>()
            .max(in_shape.iter().product());
        words_for(name, dtype, n)?;
        Ok((g, TensorDesc::new(dtype, &out_shape)))
    }
}

impl Kernel for Pool3d {
    fn op(&self) -> &'static str {
        self.mode.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?.1])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.mode.name();
        let (g, want) = self.check(inputs)?;
        let out = &outputs[0];
        super::expect_output(name, out, &want)?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        // Loop iterations of one invocation, the outer loops' counted too.
        let [kd, kh, kw] = self.ksize;
        let window = kd * kh * kw + kd * kh + kd;
        let [cd, ch, cw] = [0, 1, 2].map(|i| self.ksize[i].div_ceil(self.strides[i]));
        let covering = cd * ch * cw + cd * ch + cd;
        super::loop_check(
            ctx,
            name,
            match self.mode {
                Mode3::Max | Mode3::Avg => window,
                Mode3::MaxGrad | Mode3::AvgGrad => covering,
            },
        )?;
        let dtype = out.desc.dtype;
        let dev =
            |i: usize| -> Result<crate::exec::BufferRange> { ctx.bind(inputs[i].device(name, i)?) };
        let (a, b, c) = match self.mode {
            Mode3::Max | Mode3::Avg => (dev(0)?, ctx.temp(4)?, ctx.temp(4)?),
            Mode3::AvgGrad => (dev(1)?, ctx.temp(4)?, ctx.temp(4)?),
            Mode3::MaxGrad => (dev(0)?, dev(2)?, dev(1)?),
        };
        let o = bind_out(ctx, name, out)?;
        let mode = self.mode;
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "pool3d",
                Some(dtype),
                format!("{mode:?}").to_ascii_lowercase(),
            ),
            || {
                crate::kernels::membound_shader(super::shader_from(
                    POOL3D_WGSL,
                    mode.index(),
                    dtype,
                ))
            },
        )?;
        let words = words_for(name, dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let u = |v: usize| -> Result<u32> {
            u32::try_from(v).map_err(|_| {
                Error::Unimplemented(format!("{name}: size {v} is beyond 32-bit indexing"))
            })
        };
        let mut words_p = vec![row, u(n)?, words, self.ncdhw as u32];
        for v in [
            g.dhw[0],
            g.dhw[1],
            g.dhw[2],
            g.c,
            g.out[0],
            g.out[1],
            g.out[2],
            self.ksize[0],
            self.ksize[1],
            self.ksize[2],
            self.strides[0],
            self.strides[1],
            self.strides[2],
            g.pad[0],
            g.pad[1],
            g.pad[2],
        ] {
            words_p.push(u(v)?);
        }
        words_p.extend([0; 4]);
        ctx.dispatch(&pipeline, &params(&words_p), &[a, b, c, o], groups)
    }
}
