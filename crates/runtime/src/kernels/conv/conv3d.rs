//! Conv3D, Conv3DBackpropInputV2 and Conv3DBackpropFilterV2 (float32, float16; NDHWC, and
//! NCDHW through transposes) as sums of the family's Conv2D kernels over the filter's depth taps.
//!
//! Output depth slice `od` of a 3-D convolution is the sum over depth taps `kd` of a 2-D
//! convolution of input depth slice `id = od * sd + kd * dd - pd` (when it lies in the input)
//! with filter slice `kd`. So, per tap with at least one such pair:
//! - forward: at depth stride 1, one Conv2D of every input slice at once (the input seen as
//!   [N*D, H, W, C], no copy); at larger strides, one Conv2D of the slices the tap reads,
//!   gathered first (a strided copy of N*OD slices). Then one pass (`depth_sum.wgsl`) sums each
//!   output slice's taps in float32, in tap order, and writes the output once;
//! - input gradient: one Conv2DBackpropInput of every output-gradient slice with the tap's
//!   filter slice; the pass sums, for each input slice, the products of the output slices that
//!   read it;
//! - filter gradient: one Conv2DBackpropFilter per tap, of the gathered input slices (zeros
//!   where the tap falls in the padding) against the whole output gradient, into the tap's
//!   filter slice.
//!
//! Numerics: float32 as the 2-D ops, plus one more float32 addition per tap. float16: each
//! tap's 2-D product is rounded to float16 (the 2-D ops' output), the taps are summed in
//! float32 and rounded once more, so a forward or input-gradient element carries up to KD + 1
//! float16 roundings where TensorFlow's GPU kernel rounds once (the filter gradient: one).
//! The taps' products share one temporary, bound whole by the sum pass; where they do not all
//! fit one binding (lavapipe: 128 MiB) they are summed in groups into a float32 accumulator
//! (float16 outputs then rounded once from it).
//!
//! A single tap that maps slices one to one (1 x 1 x 1 depth, stride 1, no depth padding) is one
//! 2-D op straight into the output. The 2-D ops are the family's own kernels (tiles, tensor
//! cores for float16, the autotuner), so the products run at Conv2D's speed; the extra traffic is
//! the products of each tap (KD output-sized temporaries) and their sum.
//!
//! Checks and messages follow TensorFlow's conv_ops_3d.cc / conv_grad_ops_3d.cc: 5-D tensors,
//! strides and dilations of 5 with 1 in the batch and channel dimensions, SAME or VALID. Input
//! depths that are a multiple of the filter's (grouped convolutions) run as grouped Conv2Ds;
//! TensorFlow's CPU kernels refuse them.

use crate::kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, Operand, Registry, TensorDesc, grid_1d,
};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::bind_out_bytes;
use crate::kernels::layout::strided::{Region, View, copy};
use crate::kernels::spatial;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, HostTensor, Result, bail_invalid};

const DEPTH_SUM_WGSL: &str = include_str!("depth_sum.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op3 {
    Forward,
    BackpropInput,
    BackpropFilter,
}

impl Op3 {
    fn name(self) -> &'static str {
        match self {
            Op3::Forward => "Conv3D",
            Op3::BackpropInput => "Conv3DBackpropInputV2",
            Op3::BackpropFilter => "Conv3DBackpropFilterV2",
        }
    }
}

pub(super) struct Conv3d {
    op: Op3,
    dtype: DType,
    /// (depth, rows, columns).
    strides: [usize; 3],
    dilations: [usize; 3],
    same: bool,
    ncdhw: bool,
    /// Internal, for tests (`_tfwgpu_taps`): the most depth taps summed in one pass.
    max_taps: Option<usize>,
}

/// The geometry of one 3-D convolution in NDHWC: input [n, d, h, w, c], filter
/// [kd, kh, kw, cg, k], output [n, od, oh, ow, k].
#[derive(Clone, Copy, Debug)]
struct Geom3 {
    n: usize,
    d: usize,
    h: usize,
    w: usize,
    c: usize,
    kd: usize,
    kh: usize,
    kw: usize,
    cg: usize,
    k: usize,
    od: usize,
    oh: usize,
    ow: usize,
    /// Depth padding before.
    pd: usize,
}

impl Geom3 {
    fn input(&self) -> [usize; 5] {
        [self.n, self.d, self.h, self.w, self.c]
    }

    fn filter(&self) -> [usize; 5] {
        [self.kd, self.kh, self.kw, self.cg, self.k]
    }

    fn output(&self) -> [usize; 5] {
        [self.n, self.od, self.oh, self.ow, self.k]
    }
}

/// (n, d, h, w, c) of a 5-D shape in a data format.
fn ndhwc(s: &[usize], ncdhw: bool) -> [usize; 5] {
    if ncdhw {
        [s[0], s[2], s[3], s[4], s[1]]
    } else {
        [s[0], s[1], s[2], s[3], s[4]]
    }
}

/// A 5-D NDHWC shape in the data format.
fn in_format(s: [usize; 5], ncdhw: bool) -> Vec<usize> {
    if ncdhw {
        vec![s[0], s[4], s[1], s[2], s[3]]
    } else {
        s.to_vec()
    }
}

fn fmt_shape(s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

impl Conv3d {
    pub(super) fn build(op: Op3, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let name = op.name();
        let dtype = attrs.dtype("T")?;
        let ncdhw = spatial::ncdhw(name, attrs)?;
        // Indices of (n, c) and of (d, h, w) in the attributes' order.
        let (nc, dhw) = spatial::dims_5d(ncdhw);
        let strides = spatial::five_ints(name, attrs, "strides", None)?;
        if nc.iter().any(|&i| strides[i] != 1) {
            return Err(Error::Unimplemented(format!(
                "{name}: Current implementation does not yet support strides in the batch and \
                 depth dimensions."
            )));
        }
        if dhw.iter().any(|&i| strides[i] <= 0) {
            bail_invalid!("{name}: Spatial strides should be larger than 0 ({strides:?}).");
        }
        let dilations = spatial::five_ints(name, attrs, "dilations", Some(1))?;
        if nc.iter().any(|&i| dilations[i] != 1) {
            return Err(Error::Unimplemented(format!(
                "{name}: Current implementation does not yet support dilations in the batch \
                 and depth dimensions."
            )));
        }
        if dhw.iter().any(|&i| dilations[i] <= 0) {
            bail_invalid!("{name}: Dilated rates should be larger than 0 ({dilations:?}).");
        }
        let same = spatial::same_padding(name, attrs)?;
        let max_taps = match attrs.get("_tfwgpu_taps") {
            None => None,
            Some(AttrValue::Int(v)) if *v >= 1 => Some(*v as usize),
            Some(v) => bail_invalid!("{name}: _tfwgpu_taps must be a positive int, got {v:?}"),
        };
        Ok(Box::new(Conv3d {
            max_taps,
            op,
            dtype,
            strides: dhw.map(|i| strides[i] as usize),
            dilations: dhw.map(|i| dilations[i] as usize),
            same,
            ncdhw,
        }))
    }

    /// Output size and padding before along spatial dimension `dim`.
    fn windowed(&self, dim: usize, input: usize, filter: usize) -> Result<(usize, usize)> {
        let eff = (filter - 1) * self.dilations[dim] + 1;
        spatial::windowed(self.op.name(), self.same, input, eff, self.strides[dim])
    }

    /// The geometry from the input's and filter's 5-D shapes (in the data format for the
    /// input; the filter is always [kd, kh, kw, cg, k]).
    fn geom(&self, input: &[usize], filter: &[usize]) -> Result<Geom3> {
        let name = self.op.name();
        if input.len() != 5 {
            bail_invalid!("{name}: input must be 5-dimensional: {}", fmt_shape(input));
        }
        if filter.len() != 5 {
            bail_invalid!(
                "{name}: filter must be 5-dimensional: {}",
                fmt_shape(filter)
            );
        }
        let [n, d, h, w, c] = ndhwc(input, self.ncdhw);
        let [kd, kh, kw, cg, k] = [filter[0], filter[1], filter[2], filter[3], filter[4]];
        if filter.contains(&0) {
            bail_invalid!(
                "{name}: filter must not have zero elements (i.e. all dimensions must be \
                 non-zero)"
            );
        }
        if c == 0 || c % cg != 0 {
            bail_invalid!(
                "{name}: Input depth must be evenly divisible by filter depth: {c} vs {cg}"
            );
        }
        if k % (c / cg) != 0 {
            bail_invalid!(
                "{name}: Output depth must be evenly divisible by number of groups: {k} vs {}",
                c / cg
            );
        }
        let (od, pd) = self.windowed(0, d, kd)?;
        let (oh, _) = self.windowed(1, h, kh)?;
        let (ow, _) = self.windowed(2, w, kw)?;
        Ok(Geom3 {
            n,
            d,
            h,
            w,
            c,
            kd,
            kh,
            kw,
            cg,
            k,
            od,
            oh,
            ow,
            pd,
        })
    }

    /// Sizes from a host input (input_sizes / filter_sizes): 5 values.
    fn sizes(&self, t: &HostTensor, what: &str) -> Result<Vec<usize>> {
        let name = self.op.name();
        let v = t.to_i64_vec()?;
        if t.shape.len() != 1 || v.len() != 5 {
            bail_invalid!(
                "{name}: {what} must be a vector of 5 values, got {}",
                fmt_shape(&t.shape)
            );
        }
        if v.iter().any(|&x| x < 0) {
            bail_invalid!("{name}: {what} must be non-negative, got {v:?}");
        }
        // TensorFlow aborts the process on a shape of more than 2^63 - 1 elements.
        if v.iter()
            .try_fold(1i64, |acc, &x| acc.checked_mul(x))
            .is_none()
        {
            bail_invalid!("{name}: {what} {v:?} has more elements than a tensor can hold");
        }
        Ok(v.into_iter().map(|x| x as usize).collect())
    }

    /// The geometry and the output shape (in the data format) of a node's inputs.
    fn plan(&self, inputs: &[Operand]) -> Result<(Geom3, Vec<usize>)> {
        let name = self.op.name();
        let want = if self.op == Op3::Forward { 2 } else { 3 };
        if inputs.len() != want {
            bail_invalid!("{name} takes {want} inputs, got {}", inputs.len());
        }
        for (i, x) in inputs.iter().enumerate() {
            let host_input = match self.op {
                Op3::Forward => false,
                Op3::BackpropInput => i == 0,
                Op3::BackpropFilter => i == 1,
            };
            if !host_input && x.dtype() != self.dtype {
                bail_invalid!("{name}: input {i} is {} but T is {}", x.dtype(), self.dtype);
            }
        }
        match self.op {
            Op3::Forward => {
                let g = self.geom(inputs[0].shape(), inputs[1].shape())?;
                Ok((g, in_format(g.output(), self.ncdhw)))
            }
            Op3::BackpropInput => {
                let sizes = self.sizes(inputs[0].host(name, 0)?, "input_sizes")?;
                let g = self.geom(&sizes, inputs[1].shape())?;
                self.check_out_backprop(&g, inputs[2].shape())?;
                Ok((g, sizes))
            }
            Op3::BackpropFilter => {
                let sizes = self.sizes(inputs[1].host(name, 1)?, "filter_sizes")?;
                let g = self.geom(inputs[0].shape(), &sizes)?;
                self.check_out_backprop(&g, inputs[2].shape())?;
                Ok((g, sizes))
            }
        }
    }

    fn check_out_backprop(&self, g: &Geom3, shape: &[usize]) -> Result<()> {
        let want = in_format(g.output(), self.ncdhw);
        if shape != want.as_slice() {
            bail_invalid!(
                "{}: out_backprop has shape {} but the convolution's output is {}",
                self.op.name(),
                fmt_shape(shape),
                fmt_shape(&want)
            );
        }
        Ok(())
    }

    /// Attributes of the 2-D ops: NHWC, the rows' and columns' strides and dilations.
    fn attrs2d(&self) -> Attrs {
        Attrs::new()
            .with("T", AttrValue::Type(self.dtype))
            .with(
                "strides",
                AttrValue::Ints(vec![1, self.strides[1] as i64, self.strides[2] as i64, 1]),
            )
            .with(
                "dilations",
                AttrValue::Ints(vec![
                    1,
                    self.dilations[1] as i64,
                    self.dilations[2] as i64,
                    1,
                ]),
            )
            .with(
                "padding",
                AttrValue::Str(if self.same { "SAME" } else { "VALID" }.into()),
            )
            .with("data_format", AttrValue::Str("NHWC".into()))
    }

    /// Whether depth tap `t` reads any input slice.
    fn tap_live(&self, g: &Geom3, t: usize) -> bool {
        let (lo, hi) = self.tap_range(g, t);
        lo < hi
    }

    /// The output slices [lo, hi) that depth tap `t` reads from the input.
    fn tap_range(&self, g: &Geom3, t: usize) -> (usize, usize) {
        let (sd, off) = (
            self.strides[0] as i64,
            (t * self.dilations[0]) as i64 - g.pd as i64,
        );
        // id = od * sd + off in [0, d)
        let lo = if off >= 0 { 0 } else { (-off + sd - 1) / sd };
        let hi = if (g.d as i64) - off <= 0 {
            0
        } else {
            ((g.d as i64 - 1 - off) / sd + 1).min(g.od as i64)
        };
        (lo as usize, (hi.max(lo)) as usize)
    }
}

fn conv2d(op: &str, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
    Registry::global().build_kernel(op, attrs)
}

fn view(t: &DeviceRef, dtype: DType, shape: &[usize]) -> DeviceRef {
    DeviceRef {
        desc: TensorDesc::new(dtype, shape),
        addr: t.addr,
    }
}

/// Elements per product slot in the taps' shared temporary: each slot starts on the adapter's
/// storage-offset alignment, so each product is an output of its own.
fn pitch(ctx: &KernelContext, dtype: DType, elements: usize) -> usize {
    let align = (ctx.limits().min_storage_buffer_offset_alignment as usize).max(4);
    (elements * dtype.size()).next_multiple_of(align) / dtype.size()
}

/// Filter slice `t` ([kh, kw, cg, k]) of `f`: a view where its address can be read, else a
/// copy.
fn filter_tap(
    ctx: &KernelContext,
    op: &str,
    f: &DeviceRef,
    g: &Geom3,
    t: usize,
) -> Result<DeviceRef> {
    let dtype = f.desc.dtype;
    let per = g.kh * g.kw * g.cg * g.k;
    let shape = [g.kh, g.kw, g.cg, g.k];
    let bytes = (t * per * dtype.size()) as u64;
    if bytes.is_multiple_of(4) {
        return Ok(DeviceRef {
            desc: TensorDesc::new(dtype, &shape),
            addr: f.addr + bytes,
        });
    }
    let tmp = ctx.temp_tensor(TensorDesc::new(dtype, &shape))?;
    copy(
        ctx,
        op,
        f,
        &View::contiguous(&[per], (t * per) as i64),
        &tmp,
        Region::all(per),
    )?;
    Ok(tmp)
}

/// How the sum pass picks a source row for output row (n, o) and tap t (see depth_sum.wgsl).
#[derive(Clone, Copy)]
struct RowMap {
    a: i64,
    bt: i64,
    cc: i64,
    dv: i64,
    r_count: usize,
    rs: usize,
    src_o: bool,
}

/// One sum pass: the `taps` products in `src` (slots of `pitch` elements of `src_dtype`; slot t
/// holds the op's tap t0 + t) summed into `out` ([n, o_count, row_len] elements), added to
/// what `out` (float32) holds with `accumulate`.
#[allow(clippy::too_many_arguments)]
fn depth_sum(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    src_dtype: DType,
    (taps, t0, pitch): (usize, usize, usize),
    out: &DeviceRef,
    accumulate: bool,
    o_count: usize,
    row_len: usize,
    m: RowMap,
) -> Result<()> {
    let dtype = out.desc.dtype;
    let elements = out.desc.num_elements();
    if elements == 0 {
        return Ok(());
    }
    let half = dtype == DType::F16;
    let src_half = src_dtype == DType::F16;
    let words = if half { elements.div_ceil(2) } else { elements };
    let u = |v: usize, what: &str| -> Result<u32> {
        u32::try_from(v).map_err(|_| {
            Error::Unimplemented(format!("{op}: {what} {v} is beyond 32-bit indexing"))
        })
    };
    let i = |v: i64, what: &str| -> Result<u32> {
        i32::try_from(v).map(|x| x as u32).map_err(|_| {
            Error::Unimplemented(format!("{op}: {what} {v} is beyond 32-bit indexing"))
        })
    };
    u(taps * pitch, "temporary size")?;
    let (grid, row) = grid_1d(words as u64, WG);
    let p = params(&[
        u(words, "output size")?,
        row,
        u(t0, "tap")?,
        u(o_count, "rows")?,
        u(row_len, "row length")?,
        u(taps, "taps")?,
        u(pitch, "pitch")?,
        i(m.a, "stride")?,
        i(m.bt, "tap step")?,
        i(m.cc, "offset")?,
        i(m.dv, "divisor")?,
        i(m.r_count as i64, "source rows")?,
        u(m.rs, "source rows")?,
        m.src_o as u32,
        u(elements, "output size")?,
        accumulate as u32,
    ]);
    let variant = format!(
        "{}{}",
        if src_half { "h" } else { "f" },
        if half { "h" } else { "f" }
    );
    let pipeline = ctx.pipeline(PipelineKey::new("conv3d_sum", Some(dtype), variant), || {
        ShaderSource::new(
            DEPTH_SUM_WGSL
                .replace("$LINEAR_INDEX", LINEAR_INDEX)
                .replace("$WG", &WG.to_string())
                .replace("SRC_HALF", if src_half { "true" } else { "false" })
                .replace("OUT_HALF", if half { "true" } else { "false" }),
        )
    })?;
    let o = bind_out_bytes(
        ctx,
        op,
        out,
        (words * if half { 4 } else { dtype.size() }) as u64,
    )?;
    ctx.dispatch(&pipeline, &p, &[o, ctx.bind(src)?], grid)
}

/// The products of the depth taps and their sum into `out`: `record(t, addr)` writes tap t's
/// product (slot of `slot` elements of `dtype`) at `addr`, for the taps `live(t)`. The taps
/// share one temporary bound whole by the sum pass; where they do not all fit one binding (or
/// more than `max_group` are asked for), they run in groups of as many as fit, each group's sum
/// added to a float32 accumulator (the output itself in float32).
#[allow(clippy::too_many_arguments)]
fn sum_over_taps(
    ctx: &KernelContext,
    op: &str,
    dtype: DType,
    (taps, slot, max_group): (usize, usize, Option<usize>),
    out: &DeviceRef,
    o_count: usize,
    row_len: usize,
    m: RowMap,
    live: impl Fn(usize) -> bool,
    mut record: impl FnMut(usize, u64) -> Result<()>,
) -> Result<()> {
    let slot_bytes = (slot * dtype.size()) as u64;
    let limit = ctx.limits().max_storage_buffer_binding_size;
    if slot_bytes > limit {
        return Err(Error::Unimplemented(format!(
            "{op}: one depth tap's product takes {slot_bytes} bytes, more than this adapter \
             binds at once ({limit})"
        )));
    }
    let fit = usize::try_from(limit / slot_bytes)
        .unwrap_or(usize::MAX)
        .max(1);
    let group = max_group.map_or(fit, |g| g.clamp(1, fit));
    let mut run_group = |t0: usize, n: usize, target: &DeviceRef, accumulate: bool| -> Result<()> {
        let prod = ctx.temp_tensor(TensorDesc::new(dtype, &[n * slot]))?;
        for t in t0..t0 + n {
            if live(t) {
                record(t, prod.addr + ((t - t0) * slot * dtype.size()) as u64)?;
            }
        }
        depth_sum(
            ctx,
            op,
            &prod,
            dtype,
            (n, t0, slot),
            target,
            accumulate,
            o_count,
            row_len,
            m,
        )
    };
    if group >= taps {
        return run_group(0, taps, out, false);
    }
    let acc = if dtype == DType::F32 {
        out.clone()
    } else {
        ctx.temp_tensor(TensorDesc::new(DType::F32, &out.desc.shape))?
    };
    for t0 in (0..taps).step_by(group) {
        run_group(t0, group.min(taps - t0), &acc, t0 > 0)?;
    }
    if dtype == DType::F16 {
        crate::kernels::nn::f16::convert(ctx, op, &acc, out)?;
    }
    Ok(())
}

impl Conv3d {
    /// NDHWC forward: `x` [n, d, h, w, c], `f`, into `out` [n, od, oh, ow, k].
    fn forward(
        &self,
        ctx: &KernelContext,
        x: &DeviceRef,
        f: &DeviceRef,
        out: &DeviceRef,
        g: &Geom3,
    ) -> Result<()> {
        let op = self.op.name();
        let dt = self.dtype;
        let k2 = conv2d("Conv2D", &self.attrs2d())?;
        let sd = self.strides[0];
        let plane = g.oh * g.ow * g.k;
        if g.kd == 1 && sd == 1 && g.pd == 0 && g.od == g.d {
            let x2 = view(x, dt, &[g.n * g.d, g.h, g.w, g.c]);
            let o2 = view(out, dt, &[g.n * g.od, g.oh, g.ow, g.k]);
            let f0 = filter_tap(ctx, op, f, g, 0)?;
            return k2.record(ctx, &[Operand::Device(&x2), Operand::Device(&f0)], &[o2]);
        }
        // At stride 1 every input slice is convolved (rows n * d + id); else the slices each
        // tap reads are gathered (rows n * od + od).
        let all = sd == 1;
        let rows = if all { g.n * g.d } else { g.n * g.od };
        let slot = pitch(ctx, dt, rows * plane);
        // Output slice od reads input slice od * sd + t * dd - pd: row n * d + that slice of
        // the products over every input slice, or row n * od + od of the gathered ones.
        let m = RowMap {
            a: sd as i64,
            bt: self.dilations[0] as i64,
            cc: -(g.pd as i64),
            dv: 1,
            r_count: g.d,
            rs: if all { g.d } else { g.od },
            src_o: !all,
        };
        sum_over_taps(
            ctx,
            op,
            dt,
            (g.kd, slot, self.max_taps),
            out,
            g.od,
            plane,
            m,
            |t| self.tap_live(g, t),
            |t, addr| {
                let (lo, hi) = self.tap_range(g, t);
                let ft = filter_tap(ctx, op, f, g, t)?;
                let xs = if all {
                    view(x, dt, &[rows, g.h, g.w, g.c])
                } else {
                    let xs = ctx.temp_tensor(TensorDesc::new(dt, &[rows, g.h, g.w, g.c]))?;
                    let first = (lo * sd + t * self.dilations[0]) as i64 - g.pd as i64;
                    gather_slices(ctx, op, x, &xs, g, first, sd, lo, hi)?;
                    xs
                };
                let yt = DeviceRef {
                    desc: TensorDesc::new(dt, &[rows, g.oh, g.ow, g.k]),
                    addr,
                };
                k2.record(ctx, &[Operand::Device(&xs), Operand::Device(&ft)], &[yt])
            },
        )
    }

    /// NDHWC input gradient: `f`, `dy` [n, od, oh, ow, k], into `dx` [n, d, h, w, c].
    fn backprop_input(
        &self,
        ctx: &KernelContext,
        f: &DeviceRef,
        dy: &DeviceRef,
        dx: &DeviceRef,
        g: &Geom3,
    ) -> Result<()> {
        let op = self.op.name();
        let dt = self.dtype;
        let k2 = conv2d("Conv2DBackpropInput", &self.attrs2d())?;
        let sizes = HostTensor::vec_i32(&[(g.n * g.od) as i32, g.h as i32, g.w as i32, g.c as i32]);
        let dy2 = view(dy, dt, &[g.n * g.od, g.oh, g.ow, g.k]);
        let plane = g.h * g.w * g.c;
        let sd = self.strides[0];
        if g.kd == 1 && sd == 1 && g.pd == 0 && g.od == g.d {
            let f0 = filter_tap(ctx, op, f, g, 0)?;
            let dx2 = view(dx, dt, &[g.n * g.d, g.h, g.w, g.c]);
            return k2.record(
                ctx,
                &[
                    Operand::Host(&sizes),
                    Operand::Device(&f0),
                    Operand::Device(&dy2),
                ],
                &[dx2],
            );
        }
        let rows = g.n * g.od;
        let slot = pitch(ctx, dt, rows * plane);
        // Input slice id takes, from tap t, output slice od with od * sd = id + pd - t * dd.
        // Taps that read nothing leave their slots unwritten; the map never reaches them (their
        // v / dv lies outside [0, od) for every input slice).
        let m = RowMap {
            a: 1,
            bt: -(self.dilations[0] as i64),
            cc: g.pd as i64,
            dv: sd as i64,
            r_count: g.od,
            rs: g.od,
            src_o: false,
        };
        sum_over_taps(
            ctx,
            op,
            dt,
            (g.kd, slot, self.max_taps),
            dx,
            g.d,
            plane,
            m,
            |t| self.tap_live(g, t),
            |t, addr| {
                let ft = filter_tap(ctx, op, f, g, t)?;
                let gt = DeviceRef {
                    desc: TensorDesc::new(dt, &[rows, g.h, g.w, g.c]),
                    addr,
                };
                k2.record(
                    ctx,
                    &[
                        Operand::Host(&sizes),
                        Operand::Device(&ft),
                        Operand::Device(&dy2),
                    ],
                    &[gt],
                )
            },
        )
    }

    /// NDHWC filter gradient: `x`, `dy`, into `df` [kd, kh, kw, cg, k].
    fn backprop_filter(
        &self,
        ctx: &KernelContext,
        x: &DeviceRef,
        dy: &DeviceRef,
        df: &DeviceRef,
        g: &Geom3,
    ) -> Result<()> {
        let op = self.op.name();
        let dt = self.dtype;
        let k2 = conv2d("Conv2DBackpropFilter", &self.attrs2d())?;
        let sizes = HostTensor::vec_i32(&[g.kh as i32, g.kw as i32, g.cg as i32, g.k as i32]);
        let rows = g.n * g.od;
        let dy2 = view(dy, dt, &[rows, g.oh, g.ow, g.k]);
        let per = g.kh * g.kw * g.cg * g.k;
        let sd = self.strides[0];
        let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
        let df_base = ctx.dev.alloc.resolve(df.addr)?.offset;
        for t in 0..g.kd {
            let (lo, hi) = self.tap_range(g, t);
            let bytes = (t * per * dt.size()) as u64;
            let direct = (df_base + bytes).is_multiple_of(align);
            let dft = if direct {
                DeviceRef {
                    desc: TensorDesc::new(dt, &[g.kh, g.kw, g.cg, g.k]),
                    addr: df.addr + bytes,
                }
            } else {
                ctx.temp_tensor(TensorDesc::new(dt, &[g.kh, g.kw, g.cg, g.k]))?
            };
            if lo >= hi || rows == 0 {
                // The tap only meets padding: its gradient is zero.
                let size = (per * dt.size()).next_multiple_of(4) as u64;
                let r = ctx.dev.alloc.resolve(dft.addr)?.range(size);
                if direct && !(per * dt.size()).is_multiple_of(4) {
                    // Would clear past the slice into the next tap's: copy zeros instead.
                    let z = ctx.temp_tensor(TensorDesc::new(dt, &[per]))?;
                    let zr = ctx.dev.alloc.resolve(z.addr)?.range(size);
                    ctx.clear(&zr, size)?;
                    copy(
                        ctx,
                        op,
                        &z,
                        &View::contiguous(&[per], 0),
                        df,
                        region_at(t * per, per),
                    )?;
                    continue;
                }
                ctx.clear(&r, size)?;
            } else {
                let full =
                    sd == 1 && lo == 0 && hi == g.od && g.n == 1 && t * self.dilations[0] == g.pd;
                let xs = if full {
                    view(x, dt, &[rows, g.h, g.w, g.c])
                } else {
                    let xs = ctx.temp_tensor(TensorDesc::new(dt, &[rows, g.h, g.w, g.c]))?;
                    if hi - lo < g.od {
                        let size = xs.desc.byte_size().next_multiple_of(4);
                        let r = ctx.dev.alloc.resolve(xs.addr)?.range(size);
                        ctx.clear(&r, size)?;
                    }
                    let first = (lo * sd + t * self.dilations[0]) as i64 - g.pd as i64;
                    gather_slices(ctx, op, x, &xs, g, first, sd, lo, hi)?;
                    xs
                };
                k2.record(
                    ctx,
                    &[
                        Operand::Device(&xs),
                        Operand::Host(&sizes),
                        Operand::Device(&dy2),
                    ],
                    std::slice::from_ref(&dft),
                )?;
            }
            if !direct {
                copy(
                    ctx,
                    op,
                    &dft,
                    &View::contiguous(&[per], 0),
                    df,
                    region_at(t * per, per),
                )?;
            }
        }
        Ok(())
    }
}

fn region_at(base: usize, len: usize) -> Region {
    Region {
        base,
        rows: 1,
        len,
        stride: len,
    }
}

/// Copies input slices `first + j * sd` (j < hi - lo) of every image of `x` into rows
/// `n * od + lo + j` of `xs`.
#[allow(clippy::too_many_arguments)]
fn gather_slices(
    ctx: &KernelContext,
    op: &str,
    x: &DeviceRef,
    xs: &DeviceRef,
    g: &Geom3,
    first: i64,
    sd: usize,
    lo: usize,
    hi: usize,
) -> Result<()> {
    use crate::kernels::layout::strided::Dim;
    let plane = g.h * g.w * g.c;
    let dims = vec![
        Dim {
            size: g.n,
            stride: (g.d * plane) as i64,
            wrap: 0,
        },
        Dim {
            size: hi - lo,
            stride: (sd * plane) as i64,
            wrap: 0,
        },
        Dim {
            size: plane,
            stride: 1,
            wrap: 0,
        },
    ];
    let v = View {
        dims,
        base: first * plane as i64,
    };
    let region = Region {
        base: lo * plane,
        rows: g.n,
        len: (hi - lo) * plane,
        stride: g.od * plane,
    };
    copy(ctx, op, x, &v, xs, region)
}

/// The NDHWC shape of an NCDHW one (`to_last`) or the other way round.
fn transposed_shape(s: &[usize], to_last: bool) -> Vec<usize> {
    if to_last {
        vec![s[0], s[2], s[3], s[4], s[1]]
    } else {
        vec![s[0], s[4], s[1], s[2], s[3]]
    }
}

/// Copies `src` into `dst` transposed between NCDHW and NDHWC (`to_last`: NCDHW -> NDHWC).
fn transpose(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    dst: &DeviceRef,
    to_last: bool,
) -> Result<()> {
    use crate::kernels::layout::strided::{Dim, strides_of};
    let s = &src.desc.shape;
    let perm = if to_last {
        [0, 2, 3, 4, 1]
    } else {
        [0, 4, 1, 2, 3]
    };
    let strides = strides_of(s);
    let dims = perm
        .iter()
        .map(|&p| Dim {
            size: s[p],
            stride: strides[p],
            wrap: 0,
        })
        .collect();
    let n = src.desc.num_elements();
    copy(ctx, op, src, &View { dims, base: 0 }, dst, Region::all(n))
}

impl Kernel for Conv3d {
    fn op(&self) -> &'static str {
        self.op.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, shape) = self.plan(inputs)?;
        Ok(vec![TensorDesc::new(self.dtype, &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.op.name();
        let (g, _) = self.plan(inputs)?;
        let out = &outputs[0];
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let dt = self.dtype;
        // NCDHW runs as NDHWC between transposes.
        let last = |i: usize| -> Result<DeviceRef> {
            let t = inputs[i].device(op, i)?;
            if self.ncdhw && t.desc.num_elements() > 0 {
                let tl =
                    ctx.temp_tensor(TensorDesc::new(dt, &transposed_shape(&t.desc.shape, true)))?;
                transpose(ctx, op, t, &tl, true)?;
                Ok(tl)
            } else {
                Ok(view(t, dt, &t.desc.shape))
            }
        };
        let result = |shape: [usize; 5]| -> Result<DeviceRef> {
            if self.ncdhw && self.op != Op3::BackpropFilter {
                ctx.temp_tensor(TensorDesc::new(dt, &shape))
            } else {
                Ok(view(out, dt, &shape))
            }
        };
        let r = match self.op {
            Op3::Forward => {
                let (x, f) = (last(0)?, inputs[1].device(op, 1)?);
                let r = result(g.output())?;
                if g.n * g.d * g.h * g.w * g.c == 0 {
                    clear_all(ctx, &r)?;
                } else {
                    self.forward(ctx, &x, f, &r, &g)?;
                }
                r
            }
            Op3::BackpropInput => {
                let (f, dy) = (inputs[1].device(op, 1)?, last(2)?);
                let r = result(g.input())?;
                if g.n * g.od * g.oh * g.ow == 0 {
                    clear_all(ctx, &r)?;
                } else {
                    self.backprop_input(ctx, f, &dy, &r, &g)?;
                }
                r
            }
            Op3::BackpropFilter => {
                let (x, dy) = (last(0)?, last(2)?);
                let r = view(out, dt, &g.filter());
                if g.n * g.od * g.oh * g.ow * g.h * g.w == 0 {
                    clear_all(ctx, &r)?;
                } else {
                    self.backprop_filter(ctx, &x, &dy, &r, &g)?;
                }
                return Ok(());
            }
        };
        if self.ncdhw {
            transpose(ctx, op, &r, out, false)?;
        }
        Ok(())
    }
}

fn clear_all(ctx: &KernelContext, t: &DeviceRef) -> Result<()> {
    let size = t.desc.byte_size().next_multiple_of(4).max(4);
    let r = ctx.dev.alloc.resolve(t.addr)?.range(size);
    ctx.clear(&r, size)
}
