//! CudnnRNNV3 and CudnnRNNBackpropV3: a single-layer, unidirectional recurrent network (LSTM,
//! GRU, tanh and relu RNNs) over a whole sequence in one kernel call, with cuDNN's weight layout
//! and padded variable-length sequences. Keras's LSTM and GRU layers call these ops whenever
//! TensorFlow lists a GPU (the plugin's Keras hook keeps that choice for tfwgpu GPUs), so a
//! training step runs one forward and one backward kernel per layer instead of a `while` loop
//! of ~30 kernels per timestep.
//!
//! Forward: x W^T for every timestep in one MatMul, then per timestep a step (`rnn_fwd.wgsl`)
//! that applies the gates, updates the state and keeps what the gradient needs in the reserve
//! space (the gates' activations, c_{t-1}, h_{t-1}). Backward: per timestep, from the last, a
//! step (`rnn_bwd.wgsl`) that takes the next step's gate gradients times R; then dx, dW, dR and
//! the bias gradients each in one MatMul or column sum over all timesteps. A step's products
//! with R come from a MatMul dispatched before it, or, opt-in for small layers
//! (`TFWGPU_RNN_STEP=fused`; slower on an H200), from the step itself (`*_fused.wgsl`: one
//! dispatch per timestep instead of two, the row it multiplies in workgroup memory). All arithmetic is float32; float16 tensors are
//! converted on the way in and rounded once on the way out, and the reserve keeps float32.
//!
//! The layout follows cuDNN (and TensorFlow's `CudnnRNN` ops): params hold the input weights
//! W_g ([H, I] each), then the recurrent weights R_g ([H, H] each), then the input biases b_W,
//! then the recurrent biases b_R. LSTM gates in cuDNN's order i, f, c, o. GRU gates in the order
//! z, r, n: what Keras passes on TensorFlow builds without CUDA (the only ones this plugin loads
//! into; as on ROCm, whose MIOpen takes that order), where cuDNN's is r, z, n. The GRU is cuDNN's
//! (Keras's `reset_after=True`): n = tanh(x W_n + b_Wn + r * (h R_n + b_Rn)). A step at or past a
//! sequence's length outputs zeros and leaves its state as it is, so the final state is the
//! state at the sequence's last step.
//!
//! Not implemented (Unimplemented errors naming them): several layers or directions in one op,
//! `skip_input` / `auto_select` input modes, projections (`num_proj`).

use std::slice::from_ref;
use std::sync::OnceLock;

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, Registry, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, MATH_WGSL, bind_out};
use crate::kernels::nn::f16::convert;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{AttrValue, Attrs, DType, Error, HostTensor, Result, bail_invalid};

const RNN_WGSL: &str = include_str!("rnn.wgsl");
const FWD_WGSL: &str = include_str!("rnn_fwd.wgsl");
const FWD_PLAIN_WGSL: &str = include_str!("rnn_fwd_plain.wgsl");
const FWD_FUSED_WGSL: &str = include_str!("rnn_fwd_fused.wgsl");
const BWD_WGSL: &str = include_str!("rnn_bwd.wgsl");
const BWD_PLAIN_WGSL: &str = include_str!("rnn_bwd_plain.wgsl");
const BWD_FUSED_WGSL: &str = include_str!("rnn_bwd_fused.wgsl");

/// Invocations per workgroup of the fused steps.
const FUSED_WG: u32 = 64;
/// Words of the fused steps' workgroup row: an h row (forward) or a row of gate gradients
/// (backward), so G * H <= 2048 for the fused steps.
const FUSED_ROW: usize = 2048;
const ADD_WGSL: &str = include_str!("rnn_add.wgsl");

/// The dtypes of both ops (float16 computed in float32).
pub(super) const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// The recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Lstm,
    Gru,
    Tanh,
    Relu,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "lstm" => Mode::Lstm,
            "gru" => Mode::Gru,
            "rnn_tanh" => Mode::Tanh,
            "rnn_relu" => Mode::Relu,
            other => bail_invalid!("unknown rnn_mode '{other}'"),
        })
    }

    /// Gate products per unit (the G of params' G * H rows).
    fn gates(self) -> usize {
        match self {
            Mode::Lstm => 4,
            Mode::Gru => 3,
            Mode::Tanh | Mode::Relu => 1,
        }
    }

    /// Words per unit of a reserve row of gates.
    fn gate_words(self) -> usize {
        match self {
            Mode::Lstm | Mode::Gru => 4,
            Mode::Tanh | Mode::Relu => 1,
        }
    }

    fn code(self) -> u32 {
        match self {
            Mode::Lstm => 0,
            Mode::Gru => 1,
            Mode::Tanh => 2,
            Mode::Relu => 3,
        }
    }
}

/// The attributes both ops share.
#[derive(Clone, Copy, Debug)]
struct Config {
    mode: Mode,
    dtype: DType,
    time_major: bool,
    training: bool,
}

impl Config {
    fn build(op: &str, attrs: &Attrs) -> Result<Config> {
        let text = |name: &str, default: &str| -> Result<String> {
            match attrs.get(name) {
                None => Ok(default.to_string()),
                Some(AttrValue::Str(s)) => Ok(s.clone()),
                Some(other) => {
                    bail_invalid!("{op}: attribute {name} must be a string, got {other:?}")
                }
            }
        };
        let mode = Mode::parse(&text("rnn_mode", "lstm")?)?;
        let input_mode = text("input_mode", "linear_input")?;
        if input_mode != "linear_input" {
            return Err(Error::Unimplemented(format!(
                "{op}: input_mode '{input_mode}' (tfwgpu implements linear_input)"
            )));
        }
        let direction = text("direction", "unidirectional")?;
        if direction != "unidirectional" {
            return Err(Error::Unimplemented(format!(
                "{op}: direction '{direction}' (tfwgpu implements unidirectional; Keras's \
                 Bidirectional layer runs two unidirectional ones)"
            )));
        }
        let proj = attrs.int_or("num_proj", 0)?;
        if proj != 0 {
            return Err(Error::Unimplemented(format!(
                "{op}: num_proj {proj} (tfwgpu implements no projection)"
            )));
        }
        Ok(Config {
            mode,
            dtype: attrs.dtype("T")?,
            time_major: attrs.bool_or("time_major", true)?,
            training: attrs.bool_or("is_training", true)?,
        })
    }

    /// The sizes of a call, checked against each other as TensorFlow's kernels check them.
    fn dims(&self, op: &str, inputs: &[Operand]) -> Result<Dims> {
        let x = inputs[0].shape();
        let h0 = inputs[1].shape();
        if x.len() != 3 {
            bail_invalid!("{op}: RNN input must be a 3-D vector, got shape {x:?}");
        }
        if h0.len() != 3 {
            bail_invalid!("{op}: RNN input_h must be a 3-D vector, got shape {h0:?}");
        }
        let (t, b) = if self.time_major {
            (x[0], x[1])
        } else {
            (x[1], x[0])
        };
        let (layers, hb) = if self.time_major {
            (h0[0], h0[1])
        } else {
            (h0[1], h0[0])
        };
        if hb != b || layers == 0 {
            bail_invalid!("{op}: Invalid input_h shape: {h0:?} for input {x:?}");
        }
        if layers != 1 {
            return Err(Error::Unimplemented(format!(
                "{op}: {layers} layers in one op (tfwgpu implements one)"
            )));
        }
        let (i, h) = (x[2], h0[2]);
        if self.mode == Mode::Lstm && inputs[2].shape() != h0 {
            bail_invalid!(
                "{op}: Invalid input_c shape: {:?} {h0:?}",
                inputs[2].shape()
            );
        }
        let g = self.mode.gates();
        let want = g * h * (i + h + 2);
        let params = inputs[3].shape();
        if params.len() != 1 || params[0] != want {
            bail_invalid!(
                "{op}: params size mismatch. Expected {want} elements ({g} gates, {h} units, \
                 input size {i}), got shape {params:?}"
            );
        }
        if inputs[4].shape() != [b] || inputs[4].dtype() != DType::I32 {
            bail_invalid!(
                "{op}: sequence_lengths must be int32 of shape [{b}], got {} {:?}",
                inputs[4].dtype(),
                inputs[4].shape()
            );
        }
        for (what, v) in [("batch", b), ("units", h), ("timesteps x batch", t * b)] {
            if v > u32::MAX as usize / 8 {
                bail_invalid!("{op}: {what} {v} is too large");
            }
        }
        Ok(Dims { t, b, i, h, g })
    }

    /// Elements of T in the reserve space of a training call (float32 words; two float16
    /// elements per word).
    fn reserve_len(&self, d: &Dims) -> usize {
        if !self.training {
            return 0;
        }
        let words =
            d.rows() * d.h * (self.mode.gate_words() + 1 + (self.mode == Mode::Lstm) as usize);
        if self.dtype == DType::F16 {
            2 * words
        } else {
            words
        }
    }

    /// output_c's (and input_c_backprop's) shape: input_c's for LSTM, a scalar otherwise.
    fn c_shape(&self, inputs: &[Operand]) -> Vec<usize> {
        if self.mode == Mode::Lstm {
            inputs[2].shape().to_vec()
        } else {
            vec![]
        }
    }

    /// The pipeline of `body` with its entry `main` (plain or fused step), named `name`.
    fn pipeline(
        &self,
        ctx: &KernelContext,
        name: &'static str,
        body: &'static str,
        main: &'static str,
    ) -> Result<std::sync::Arc<crate::exec::Pipeline>> {
        let key = PipelineKey::new(
            "rnn",
            Some(DType::F32),
            format!("{name}{}", self.mode.code()),
        );
        ctx.pipeline(key, || {
            ShaderSource::new(
                [COMMON_WGSL, MATH_WGSL, RNN_WGSL, body]
                    .concat()
                    .replace("$MAIN", main)
                    .replace("$MODE", &format!("{}u", self.mode.code()))
                    .replace("$NG", &format!("{}u", self.mode.gates()))
                    .replace("$ROW", &FUSED_ROW.to_string())
                    .replace("$FWG", &FUSED_WG.to_string())
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$WG", &WG.to_string()),
            )
        })
    }
}

/// The sizes of one call.
#[derive(Clone, Copy, Debug)]
struct Dims {
    t: usize,
    b: usize,
    i: usize,
    h: usize,
    /// Gates.
    g: usize,
}

impl Dims {
    fn rows(&self) -> usize {
        self.t * self.b
    }

    fn gh(&self) -> usize {
        self.g * self.h
    }

    /// Whether each timestep computes its products with R itself (one dispatch per step)
    /// rather than through a MatMul and a step (two): opt-in (`TFWGPU_RNN_STEP=fused`), for
    /// small layers (B * G * H * H <= 2^24, G * H <= 2048). On an H200 it was slower than the
    /// MatMul steps in Keras LSTM training (bench/RESULTS.md, session 24: each invocation sums
    /// its G * H products, or H * G in the backward step, in one serial loop).
    fn fused(&self) -> bool {
        static CHOICE: OnceLock<Option<bool>> = OnceLock::new();
        let forced = *CHOICE.get_or_init(|| match std::env::var("TFWGPU_RNN_STEP").as_deref() {
            Ok("fused") => Some(true),
            Ok("matmul") => Some(false),
            _ => None,
        });
        let fits = self.gh() <= FUSED_ROW && self.b <= crate::kernel::MAX_GROUPS_X as usize;
        fits && forced.unwrap_or(false) && self.b * self.gh() * self.h <= 1 << 24
    }

    /// The fused steps' grid: workgroups of `FUSED_WG` units by batch entries.
    fn fused_groups(&self) -> [u32; 3] {
        [self.h.div_ceil(FUSED_WG as usize) as u32, self.b as u32, 1]
    }
}

/// `t` seen as float32 `shape` from element `off` on (a view: no copy).
fn view(t: &DeviceRef, off: usize, shape: &[usize]) -> DeviceRef {
    DeviceRef {
        desc: TensorDesc::new(DType::F32, shape),
        addr: t.addr + 4 * off as u64,
    }
}

/// `t` itself where its address can be bound, else an aligned copy: for tensors bound by every
/// timestep's dispatch (binding copies a misaligned tensor each time).
fn aligned(ctx: &KernelContext, t: DeviceRef) -> Result<DeviceRef> {
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    if t.addr.is_multiple_of(align) || t.desc.num_elements() == 0 {
        return Ok(t);
    }
    let copy = ctx.temp_tensor(t.desc.clone())?;
    let size = t.desc.byte_size().next_multiple_of(4);
    ctx.copy(&ctx.bind(&t)?, &ctx.bind(&copy)?, size)?;
    Ok(copy)
}

/// Input `i` in float32 (converted from float16), bindable.
fn wide(ctx: &KernelContext, op: &str, inputs: &[Operand], i: usize) -> Result<DeviceRef> {
    let d = inputs[i].device(op, i)?;
    if d.desc.dtype == DType::F16 {
        let t = ctx.temp_tensor(TensorDesc::new(DType::F32, &d.desc.shape))?;
        convert(ctx, op, d, &t)?;
        return Ok(t);
    }
    aligned(ctx, d.clone())
}

/// Output `o` itself for float32, else a float32 temporary to round into it at the end.
fn wide_out(ctx: &KernelContext, o: &DeviceRef) -> Result<DeviceRef> {
    if o.desc.dtype == DType::F16 {
        ctx.temp_tensor(TensorDesc::new(DType::F32, &o.desc.shape))
    } else {
        Ok(o.clone())
    }
}

/// Rounds the float32 `w` into the float16 output `o` (nothing when `o` is float32).
fn narrow(ctx: &KernelContext, op: &str, w: &DeviceRef, o: &DeviceRef) -> Result<()> {
    if o.desc.dtype == DType::F16 {
        convert(ctx, op, w, o)?;
    }
    Ok(())
}

/// Copies `words` float32 words from `src` to `dst` at word `off` (any 4-byte offset).
fn copy_words(
    ctx: &KernelContext,
    src: &DeviceRef,
    dst: &DeviceRef,
    off: usize,
    words: usize,
) -> Result<()> {
    if words == 0 {
        return Ok(());
    }
    let size = 4 * words as u64;
    let s = ctx.dev.alloc.resolve(src.addr)?.range(size);
    let d = ctx
        .dev
        .alloc
        .resolve(dst.addr + 4 * off as u64)?
        .range(size);
    ctx.copy(&s, &d, size)
}

/// Zero-fills a (possibly scalar float16) tensor: whole words, within its allocation.
fn clear(ctx: &KernelContext, t: &DeviceRef) -> Result<()> {
    let size = t.desc.byte_size().next_multiple_of(4).max(4);
    let r = ctx.dev.alloc.resolve(t.addr)?.range(size);
    ctx.clear(&r, size)
}

/// A float32 MatMul kernel with the given transposes.
fn matmul(ta: bool, tb: bool) -> Result<Box<dyn Kernel>> {
    Registry::global().build_kernel(
        "MatMul",
        &Attrs::new()
            .with("T", AttrValue::Type(DType::F32))
            .with("transpose_a", AttrValue::Bool(ta))
            .with("transpose_b", AttrValue::Bool(tb)),
    )
}

fn run(
    k: &dyn Kernel,
    ctx: &KernelContext,
    a: &DeviceRef,
    b: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    k.record(
        ctx,
        &[Operand::Device(a), Operand::Device(b)],
        from_ref(out),
    )
}

/// The step shaders' params (see rnn.wgsl).
struct StepParams {
    words: [u32; 16],
}

impl StepParams {
    fn new(cfg: &Config, d: &Dims, row: u32) -> StepParams {
        let (rs_t, rs_b) = if cfg.time_major {
            (d.b as u32, 1)
        } else {
            (1, d.t as u32)
        };
        let rows = d.rows();
        let gw = cfg.mode.gate_words() * d.h;
        let cprev = rows * gw;
        let hprev = cprev
            + if cfg.mode == Mode::Lstm {
                rows * d.h
            } else {
                0
            };
        let mut words = [0u32; 16];
        words[0] = row;
        words[1] = (d.b * d.h) as u32;
        words[2] = d.h as u32;
        words[4] = rs_t;
        words[5] = rs_b;
        words[6] = d.gh() as u32;
        words[12] = cprev as u32;
        words[13] = hprev as u32;
        words[14] = gw as u32;
        StepParams { words }
    }

    fn step(&mut self, t: usize, flag: bool) -> Vec<u8> {
        self.words[3] = t as u32;
        self.words[7] = flag as u32;
        params(&self.words)
    }

    /// Word offset of the h_{t-1} rows in the reserve.
    fn hprev(&self) -> usize {
        self.words[13] as usize
    }
}

/// CudnnRNNV3.
struct Forward {
    cfg: Config,
    xw: Box<dyn Kernel>,
    step: Box<dyn Kernel>,
    transpose: Box<dyn Kernel>,
}

pub(super) fn build_forward(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(Forward {
        cfg: Config::build("CudnnRNNV3", attrs)?,
        xw: matmul(false, true)?,
        step: matmul(false, true)?,
        transpose: Registry::global().build_kernel(
            "Transpose",
            &Attrs::new()
                .with("T", AttrValue::Type(DType::F32))
                .with("Tperm", AttrValue::Type(DType::I32)),
        )?,
    }))
}

impl Kernel for Forward {
    fn op(&self) -> &'static str {
        "CudnnRNNV3"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        check_count("CudnnRNNV3", inputs, 5)?;
        let d = self.cfg.dims("CudnnRNNV3", inputs)?;
        let x = inputs[0].shape();
        let t = self.cfg.dtype;
        Ok(vec![
            TensorDesc::new(t, &[x[0], x[1], d.h]),
            inputs[1].desc(),
            TensorDesc::new(t, &self.cfg.c_shape(inputs)),
            TensorDesc::new(t, &[self.cfg.reserve_len(&d)]),
            TensorDesc::new(DType::U8, &[0]),
        ])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = "CudnnRNNV3";
        let cfg = &self.cfg;
        let d = cfg.dims(op, inputs)?;
        let lstm = cfg.mode == Mode::Lstm;
        let (y, oh, oc) = (&outputs[0], &outputs[1], &outputs[2]);
        if !lstm {
            clear(ctx, oc)?;
        }
        if d.b * d.h == 0 {
            return Ok(());
        }
        let (rows, gh, bh) = (d.rows(), d.gh(), d.b * d.h);
        let x = wide(ctx, op, inputs, 0)?;
        let h0 = wide(ctx, op, inputs, 1)?;
        let par = wide(ctx, op, inputs, 3)?;
        let lens = aligned(ctx, inputs[4].device(op, 4)?.clone())?;
        let (y32, oh32) = (wide_out(ctx, y)?, wide_out(ctx, oh)?);
        // The whole sequence's input products.
        let xw = ctx.temp_tensor(TensorDesc::new(DType::F32, &[rows, gh]))?;
        if rows > 0 {
            if d.i > 0 {
                let x2 = view(&x, 0, &[rows, d.i]);
                run(&*self.xw, ctx, &x2, &view(&par, 0, &[gh, d.i]), &xw)?;
            } else {
                clear(ctx, &xw)?;
            }
        }
        let r = aligned(ctx, view(&par, gh * d.i, &[gh, d.h]))?;
        // Two states, each at a bindable offset: h_{t-1} and h_t alternate.
        let align = ctx.limits().min_storage_buffer_offset_alignment as usize / 4;
        let stride = bh.next_multiple_of(align.max(1));
        let hs = ctx.temp_tensor(TensorDesc::new(DType::F32, &[2 * stride]))?;
        copy_words(ctx, &h0, &hs, 0, bh)?;
        let c = if lstm {
            let c0 = wide(ctx, op, inputs, 2)?;
            let c = wide_out(ctx, oc)?;
            copy_words(ctx, &c0, &c, 0, bh)?;
            Some(c)
        } else {
            None
        };
        if d.t > 0 {
            self.steps(
                ctx,
                &d,
                [&xw, &r, &par, &hs, &y32, &outputs[3], &lens],
                stride,
                c.as_ref(),
            )?;
        }
        copy_words(ctx, &view(&hs, (d.t % 2) * stride, &[bh]), &oh32, 0, bh)?;
        narrow(ctx, op, &y32, y)?;
        narrow(ctx, op, &oh32, oh)?;
        if let Some(c) = &c {
            narrow(ctx, op, c, oc)?;
        }
        Ok(())
    }
}

impl Forward {
    /// Records the T > 0 timesteps (then y and the reserve are not empty: TensorFlow gives
    /// empty tensors host addresses, which cannot be bound). `t`: x W^T, R, params, the states,
    /// y, the reserve, the lengths.
    fn steps(
        &self,
        ctx: &KernelContext,
        d: &Dims,
        t: [&DeviceRef; 7],
        stride: usize,
        c: Option<&DeviceRef>,
    ) -> Result<()> {
        let [xw, r, par, hs, y32, reserve, lens] = t;
        let (op, cfg, gh) = ("CudnnRNNV3", &self.cfg, d.gh());
        let fused = d.fused();
        // The fused step reads R^T ([H, gh]: neighbouring units at neighbouring words); the
        // plain one a MatMul's products h_{t-1} R^T.
        let hr = if fused {
            let rt = ctx.temp_tensor(TensorDesc::new(DType::F32, &[d.h, gh]))?;
            let perm = HostTensor::vec_i32(&[1, 0]);
            self.transpose.record(
                ctx,
                &[Operand::Device(r), Operand::Host(&perm)],
                from_ref(&rt),
            )?;
            rt
        } else {
            ctx.temp_tensor(TensorDesc::new(DType::F32, &[d.b, gh]))?
        };
        let pipeline = if fused {
            cfg.pipeline(ctx, "fwdf", FWD_WGSL, FWD_FUSED_WGSL)?
        } else {
            cfg.pipeline(ctx, "fwd", FWD_WGSL, FWD_PLAIN_WGSL)?
        };
        let (groups, row) = grid_1d((d.b * d.h) as u64, WG);
        let groups = if fused { d.fused_groups() } else { groups };
        let mut sp = StepParams::new(cfg, d, row);
        sp.words[8] = (gh * (d.i + d.h)) as u32;
        sp.words[9] = (gh * (d.i + d.h + 1)) as u32;
        let bindings = [
            ctx.bind(xw)?,
            ctx.bind(&hr)?,
            ctx.bind(par)?,
            ctx.bind(hs)?,
            match c {
                Some(c) => bind_out(ctx, op, c)?,
                None => ctx.temp(4)?,
            },
            bind_out(ctx, op, y32)?,
            if cfg.training {
                bind_out(ctx, op, reserve)?
            } else {
                ctx.temp(4)?
            },
            ctx.bind(lens)?,
        ];
        for t in 0..d.t {
            let (hin, hout) = ((t % 2) * stride, ((t + 1) % 2) * stride);
            if !fused {
                run(&*self.step, ctx, &view(hs, hin, &[d.b, d.h]), r, &hr)?;
            }
            sp.words[10] = hin as u32;
            sp.words[11] = hout as u32;
            ctx.dispatch(&pipeline, &sp.step(t, cfg.training), &bindings, groups)?;
        }
        Ok(())
    }
}

fn check_count(op: &str, inputs: &[Operand], n: usize) -> Result<()> {
    if inputs.len() != n {
        bail_invalid!("{op} takes {n} inputs, got {}", inputs.len());
    }
    Ok(())
}

/// CudnnRNNBackpropV3.
struct Backward {
    cfg: Config,
    step: Box<dyn Kernel>,
    dx: Box<dyn Kernel>,
    dw: Box<dyn Kernel>,
    dr: Box<dyn Kernel>,
    db: Box<dyn Kernel>,
}

pub(super) fn build_backward(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(Backward {
        cfg: Config::build("CudnnRNNBackpropV3", attrs)?,
        step: matmul(false, false)?,
        dx: matmul(false, false)?,
        dw: matmul(true, false)?,
        dr: matmul(true, false)?,
        db: Registry::global().build_kernel(
            "BiasAddGrad",
            &Attrs::new()
                .with("T", AttrValue::Type(DType::F32))
                .with("data_format", AttrValue::Str("NHWC".into())),
        )?,
    }))
}

impl Kernel for Backward {
    fn op(&self) -> &'static str {
        "CudnnRNNBackpropV3"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let op = "CudnnRNNBackpropV3";
        check_count(op, inputs, 13)?;
        let d = self.cfg.dims(op, inputs)?;
        let x = inputs[0].shape();
        let want_y = [x[0], x[1], d.h];
        let want_c = self.cfg.c_shape(inputs);
        for (i, name, want) in [
            (8, "output_backprop", &want_y[..]),
            (9, "output_h_backprop", inputs[1].shape()),
            (10, "output_c_backprop", &want_c[..]),
        ] {
            if inputs[i].shape() != want {
                bail_invalid!(
                    "{op}: {name} has shape {:?}, expected {want:?}",
                    inputs[i].shape()
                );
            }
        }
        let reserve = self.cfg.reserve_len(&d);
        if !self.cfg.training || inputs[11].shape() != [reserve] {
            bail_invalid!(
                "{op}: reserve_space has shape {:?}, expected [{reserve}] from a training-mode \
                 CudnnRNNV3 with the same shapes",
                inputs[11].shape()
            );
        }
        Ok(vec![
            inputs[0].desc(),
            inputs[1].desc(),
            TensorDesc::new(self.cfg.dtype, &want_c),
            inputs[3].desc(),
        ])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = "CudnnRNNBackpropV3";
        self.outputs(inputs)?;
        let cfg = &self.cfg;
        let d = cfg.dims(op, inputs)?;
        let (mode, lstm) = (cfg.mode, cfg.mode == Mode::Lstm);
        let (dx, dh0, dc0, dp) = (&outputs[0], &outputs[1], &outputs[2], &outputs[3]);
        if !lstm {
            clear(ctx, dc0)?;
        }
        let (rows, gh, bh) = (d.rows(), d.gh(), d.b * d.h);
        if bh == 0 {
            // No state: nothing flows back through the recurrence or into the weights.
            for o in [dx, dp] {
                if o.desc.num_elements() > 0 {
                    clear(ctx, o)?;
                }
            }
            return Ok(());
        }
        let x = wide(ctx, op, inputs, 0)?;
        let par = wide(ctx, op, inputs, 3)?;
        let lens = aligned(ctx, inputs[4].device(op, 4)?.clone())?;
        let dy = wide(ctx, op, inputs, 8)?;
        let dh = wide(ctx, op, inputs, 9)?;
        let reserve = inputs[11].device(op, 11)?;
        let (dx32, dh032, dp32) = (wide_out(ctx, dx)?, wide_out(ctx, dh0)?, wide_out(ctx, dp)?);
        let f32t = |shape: &[usize]| ctx.temp_tensor(TensorDesc::new(DType::F32, shape));
        let pass = f32t(&[bh])?;
        copy_words(ctx, &dh, &pass, 0, bh)?;
        let dgx = f32t(&[rows, gh])?;
        let dgh = if mode == Mode::Gru {
            Some(f32t(&[rows, gh])?)
        } else {
            None
        };
        let dc = if lstm {
            let dc_in = wide(ctx, op, inputs, 10)?;
            let dc = wide_out(ctx, dc0)?;
            copy_words(ctx, &dc_in, &dc, 0, bh)?;
            Some(dc)
        } else {
            None
        };
        // Each step's gate gradients for the next product with R, in two halves at bindable
        // offsets: step t writes one while reading step t + 1's from the other.
        let align = ctx.limits().min_storage_buffer_offset_alignment as usize / 4;
        let half = (d.b * gh).next_multiple_of(align.max(1));
        let dgr = f32t(&[2 * half])?;
        let dgr_at = |t: usize| view(&dgr, (t % 2) * half, &[d.b, gh]);
        let dhr = f32t(&[d.b, d.h])?;
        let r = aligned(ctx, view(&par, gh * d.i, &[gh, d.h]))?;
        let fused = d.fused();
        let (groups, row) = grid_1d(bh as u64, WG);
        let mut sp = StepParams::new(cfg, &d, row);
        let pipeline = if fused {
            cfg.pipeline(ctx, "bwdf", BWD_WGSL, BWD_FUSED_WGSL)?
        } else {
            cfg.pipeline(ctx, "bwd", BWD_WGSL, BWD_PLAIN_WGSL)?
        };
        let bindings = [
            ctx.bind(&dy)?,
            // The fused step reads R itself ([gh, H]: neighbouring units at neighbouring words).
            ctx.bind(if fused { &r } else { &dhr })?,
            ctx.bind(&pass)?,
            match (&dc, &dgh) {
                (Some(c), _) => bind_out(ctx, op, c)?,
                (None, Some(g)) => ctx.bind(g)?,
                (None, None) => ctx.temp(4)?,
            },
            ctx.bind(reserve)?,
            ctx.bind(&dgx)?,
            ctx.bind(&dgr)?,
            ctx.bind(&lens)?,
        ];
        let step_groups = if fused { d.fused_groups() } else { groups };
        for t in (0..d.t).rev() {
            let rec = t + 1 < d.t;
            if rec && !fused {
                run(&*self.step, ctx, &dgr_at(t + 1), &r, &dhr)?;
            }
            sp.words[10] = (((t + 1) % 2) * half) as u32;
            sp.words[11] = ((t % 2) * half) as u32;
            ctx.dispatch(&pipeline, &sp.step(t, rec), &bindings, step_groups)?;
        }
        // dL/dh_0: the first step's gate gradients times R, plus what passed around R.
        if d.t > 0 {
            run(&*self.step, ctx, &dgr_at(0), &r, &dhr)?;
        }
        let add = cfg.pipeline(ctx, "add", ADD_WGSL, "")?;
        ctx.dispatch(
            &add,
            &sp.step(0, d.t > 0),
            &[
                bind_out(ctx, op, &dh032)?,
                ctx.bind(&dhr)?,
                ctx.bind(&pass)?,
            ],
            groups,
        )?;
        // The weights' gradients over every timestep at once.
        let dgh = dgh.as_ref().unwrap_or(&dgx);
        let (dw, dr) = (f32t(&[gh, d.i])?, f32t(&[gh, d.h])?);
        let (dbw, dbr) = (f32t(&[gh])?, f32t(&[gh])?);
        if rows == 0 {
            for t in [&dw, &dr, &dbw, &dbr] {
                clear(ctx, t)?;
            }
            if dx32.desc.num_elements() > 0 {
                clear(ctx, &dx32)?;
            }
        } else {
            if d.i > 0 {
                let dx2 = view(&dx32, 0, &[rows, d.i]);
                run(&*self.dx, ctx, &dgx, &view(&par, 0, &[gh, d.i]), &dx2)?;
                run(&*self.dw, ctx, &dgx, &view(&x, 0, &[rows, d.i]), &dw)?;
            }
            let hprev = DeviceRef {
                desc: TensorDesc::new(DType::F32, &[rows, d.h]),
                addr: reserve.addr + 4 * sp.hprev() as u64,
            };
            run(&*self.dr, ctx, dgh, &hprev, &dr)?;
            self.db
                .record(ctx, &[Operand::Device(&dgx)], from_ref(&dbw))?;
            self.db
                .record(ctx, &[Operand::Device(dgh)], from_ref(&dbr))?;
        }
        let at = [0, gh * d.i, gh * (d.i + d.h), gh * (d.i + d.h + 1)];
        copy_words(ctx, &dw, &dp32, at[0], gh * d.i)?;
        copy_words(ctx, &dr, &dp32, at[1], gh * d.h)?;
        copy_words(ctx, &dbw, &dp32, at[2], gh)?;
        copy_words(ctx, &dbr, &dp32, at[3], gh)?;
        narrow(ctx, op, &dx32, dx)?;
        narrow(ctx, op, &dh032, dh0)?;
        narrow(ctx, op, &dp32, dp)?;
        if let Some(c) = &dc {
            narrow(ctx, op, c, dc0)?;
        }
        Ok(())
    }
}
