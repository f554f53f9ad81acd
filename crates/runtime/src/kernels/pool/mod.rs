//! pool family: MaxPool, MaxPoolV2, AvgPool and the gradients MaxPoolGrad, MaxPoolGradV2,
//! AvgPoolGrad, MaxPoolGradGrad, MaxPoolGradGradV2; and the 3-D MaxPool3D, AvgPool3D,
//! MaxPool3DGrad, AvgPool3DGrad (`pool3d.rs`, their own shader). The 2-D ops (NHWC or NCHW, SAME / VALID, and
//! EXPLICIT padding where the op has `explicit_paddings`; float32 and float16), one shader,
//! `pool.wgsl`, one invocation per output word; MaxPool and MaxPoolGrad on NHWC with
//! C % 4 == 0 (float32 and float16) run `pool_vec4.wgsl` instead (four channels per invocation, bit-identical
//! results; MaxPoolGrad as two passes: argmax codes per output, then the gather per input, or
//! per 2 x 2 block of inputs for strides 2 x 2 and windows up to 4 x 4, and for 3x3 / 2
//! without top or left padding by straight-line code, MODE 7; `TFWGPU_POOL_GATHER3S2=0`: MODE
//! 6 there too). float16 MaxPool and
//! the argmax codes compare whole 3x3 windows in half arithmetic (`pool_f16n.wgsl`) where
//! `f16conv::f16_native` passed (`TFWGPU_POOL_F16_NATIVE=0`: widened).
//!
//! Semantics are TensorFlow's CPU kernels, checked against TensorFlow 2.21:
//! - Windows hold only in-bounds elements; padding is never a candidate. AvgPool divides by
//!   the number of in-bounds elements. Output sizes and SAME padding (the smaller half before)
//!   are `GetWindowedOutputSize`'s.
//! - MaxPool starts from the lowest finite value and takes an element only when it is greater
//!   (Eigen's `cwiseMax` in `SpatialMaxPool`): NaN is ignored, and a window of only NaN and -inf
//!   gives the lowest finite value (-3.4028235e38, f16 -65504), as TensorFlow's CPU does.
//! - MaxPoolGrad routes each gradient to TensorFlow's argmax (`SpatialMaxPoolWithArgMaxHelper`):
//!   the window's first element in row-major order, replaced only by a strictly greater one.
//!   Ties go to the first element; a NaN is picked only when it is the window's first element
//!   (it is then never replaced); otherwise NaN is ignored. It recomputes the argmax from
//!   orig_input (orig_output is only checked for its shape), and sums the gradients reaching
//!   one input in TensorFlow's order (outputs row by row), so f32 results are bit-identical.
//! - MaxPoolGradGrad takes, per output, the grad at the first window element equal to
//!   orig_output (0 when none is, e.g. a NaN output), as TensorFlow's CPU kernel.
//! - AvgPool sums row by row, then divides by the count; AvgPoolGrad adds grad * (1 / count)
//!   over the covering outputs in TensorFlow's order. For f16 every sum, product and quotient
//!   is rounded to half, as Eigen's half arithmetic does in TensorFlow's CPU kernels.
//! - Pooling over the batch or the channel dimension is Unimplemented (TensorFlow's GPU
//!   kernels do not have it either).

mod pool3d;

use pool3d::{Mode3, Pool3d};

use crate::kernel::{
    AttrValue, Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d,
};
use crate::kernel_manager::PipelineKey;
use crate::kernels::elementwise::{
    COMMON_WGSL, bind_out, fmt_shape, load_expr, store_stmt, words_for,
};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

const POOL_WGSL: &str = include_str!("pool.wgsl");
const POOL_VEC4_WGSL: &str = include_str!("pool_vec4.wgsl");
const POOL_F16N_WGSL: &str = include_str!("pool_f16n.wgsl");

/// `pool_vec4.wgsl`'s NATIVE functions where the native path is off (never called).
const NATIVE_STUBS: &str = "fn max_pool_native(n: u32, oy: u32, ox: u32, qd: u32, e: u32) -> bool {
    return false;
}
fn argmax_codes_native(n: u32, oy: u32, ox: u32, qd: u32, e: u32) -> bool {
    return false;
}";

/// `pool_f16n.wgsl` for `pool_vec4.wgsl`'s `$NATIVE_FNS`: on (`native`, `MAXFORM` with
/// `max_form`) or stubs.
fn native_fns(native: bool, max_form: bool) -> String {
    if !native {
        return NATIVE_STUBS.to_string();
    }
    POOL_F16N_WGSL.replace("$NATIVE_MAX", if max_form { "true" } else { "false" })
}

/// float16 MaxPool and the argmax codes compare whole 3x3 windows in half arithmetic
/// (`pool_f16n.wgsl`, where `f16conv::f16_native` passed) instead of widening every element to
/// float32 and testing it for NaN (~40 conversions and ~36 NaN tests per invocation that the
/// float32 kernel does not have); MaxPool takes the maximum with the built-in max. Requests
/// mem7-1/2 (H200, 64x112x112x64, span): MaxPool 61-62 us widened, 52.3-53.7
/// compare-and-select, 50.6-50.7 built-in max; the codes pass 71.2-72.0 -> 55.0-55.6.
/// `TFWGPU_POOL_F16_NATIVE=0` widens, `=select` takes MaxPool by compare-and-select
/// (measurements). Returns (on, max form).
fn f16_native_mode() -> (bool, bool) {
    use std::sync::OnceLock;
    static ON: OnceLock<(bool, bool)> = OnceLock::new();
    *ON.get_or_init(
        || match crate::env_word("TFWGPU_POOL_F16_NATIVE").as_deref() {
            Some("0") => (false, false),
            Some("select") => (true, false),
            _ => (true, true),
        },
    )
}

/// `TFWGPU_POOL_BLOCK_GATHER=0` (see its use in the vec4 path), read once per process.
fn block_gather_off() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::env_is("TFWGPU_POOL_BLOCK_GATHER", "0"))
}

/// MaxPoolGrad's gather for 3x3 windows, strides 2 x 2 and no top / left padding (ResNet's
/// pool) as `pool_vec4.wgsl`'s MODE 7 instead of MODE 6 (default; `TFWGPU_POOL_GATHER3S2=0`
/// keeps MODE 6): straight-line code with every code position a constant, and 2 of MODE 6's 9
/// float16 round trips per block (the others cannot change a value). Same results bit for
/// bit. On the H200 (session 14) the float16 gather of 64x112x112x64 ran 47 us against 71
/// (float32 74 against 76). Read once per process.
fn gather3s2_on() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_POOL_GATHER3S2", "0"))
}

/// The WGSL of `pool_vec4.wgsl`'s pass `pass` (0 MaxPool, 5 the argmax codes, 2 / 6 / 7 the
/// gathers) for `dtype` (float32 or float16), as `Pool::record` compiles it: `hw` the hardware
/// float16 conversions, `grid3` the three-dimensional grid with its workgroup size (passes 6
/// and 7 need it; None: the linear grid, workgroups of `WG`), `native`
/// the half comparisons of pool_f16n.wgsl (passes 0 and 5, float16; `max_form` its built-in
/// max), `fast` the built-in max on whole 3x3 windows. Public for the offline translation
/// tests.
pub fn vec4_source(
    pass: u32,
    dtype: DType,
    hw: bool,
    grid3: Option<u32>,
    (native, max_form): (bool, bool),
    fast: bool,
) -> String {
    let src = crate::kernels::norm::vec4_io(
        POOL_VEC4_WGSL
            .replace("$NATIVE_FNS", &native_fns(native, max_form))
            .replace("$NATIVEB", if native { "true" } else { "false" })
            .replace("$MODE", &pass.to_string())
            .replace("$HALF", if dtype == DType::F16 { "true" } else { "false" })
            .replace("$GRID3", if grid3.is_some() { "true" } else { "false" })
            .replace("$WGX", &grid3.unwrap_or(WG).to_string())
            .replace("$FAST", if fast { "true" } else { "false" })
            .replace("$LINEAR_INDEX", LINEAR_INDEX)
            .replace("$KEYS", vec4_keys(dtype))
            .replace(
                "$LOWEST_BITS",
                if dtype == DType::F16 {
                    "0xfbff"
                } else {
                    "0xff7fffff"
                },
            ),
        dtype,
        hw,
    );
    if native {
        format!("enable f16;\n\n{src}")
    } else {
        src
    }
}

/// The dtypes of every pooling op (TensorFlow's GPU kernels also have float64 and, for
/// MaxPool, int32 kept on the host; neither is a tfwgpu dtype here).
pub(crate) const DTYPES: &[DType] = &[DType::F32, DType::F16];

/// A pooling op's registration: (name, mode, V2 with host ksize and strides, host inputs).
macro_rules! pool_row {
    ($name:literal, $mode:expr, $v2:literal, $host:expr) => {
        OpDef {
            op: $name,
            type_attr: "T",
            dtypes: DTYPES,
            host_inputs: $host,
            factory: |a| Pool::build($mode, $name, $v2, a),
        }
    };
}

/// A 3-D pooling op's registration (`pool3d.rs`).
macro_rules! pool3d_row {
    ($name:literal, $mode:expr, $host:expr) => {
        OpDef {
            op: $name,
            type_attr: "T",
            dtypes: DTYPES,
            host_inputs: $host,
            factory: |a| Pool3d::build($mode, a),
        }
    };
}

/// Host inputs: the V2 forward ops' ksize and strides (after x), the V2 gradients' (after
/// three device inputs), AvgPoolGrad's input shape.
const V2_FWD: &[(usize, &str)] = &[(1, "ksize"), (2, "strides")];
const V2_GRAD: &[(usize, &str)] = &[(3, "ksize"), (4, "strides")];
const IN_SHAPE: &[(usize, &str)] = &[(0, "orig_input_shape")];

/// Registration table.
pub const OPS: &[OpDef] = &[
    pool_row!("MaxPool", Mode::Max, false, &[]),
    pool_row!("MaxPoolV2", Mode::Max, true, V2_FWD),
    pool_row!("AvgPool", Mode::Avg, false, &[]),
    pool_row!("MaxPoolGrad", Mode::MaxGrad, false, &[]),
    pool_row!("MaxPoolGradV2", Mode::MaxGrad, true, V2_GRAD),
    pool_row!("AvgPoolGrad", Mode::AvgGrad, false, IN_SHAPE),
    pool_row!("MaxPoolGradGrad", Mode::MaxGradGrad, false, &[]),
    pool_row!("MaxPoolGradGradV2", Mode::MaxGradGrad, true, V2_GRAD),
    pool3d_row!("MaxPool3D", Mode3::Max, &[]),
    pool3d_row!("AvgPool3D", Mode3::Avg, &[]),
    pool3d_row!("MaxPool3DGrad", Mode3::MaxGrad, &[]),
    pool3d_row!("AvgPool3DGrad", Mode3::AvgGrad, IN_SHAPE),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Max,
    Avg,
    MaxGrad,
    AvgGrad,
    MaxGradGrad,
}

impl Mode {
    fn index(self) -> u32 {
        match self {
            Mode::Max => 0,
            Mode::Avg => 1,
            Mode::MaxGrad => 2,
            Mode::AvgGrad => 3,
            Mode::MaxGradGrad => 4,
        }
    }

    /// Device inputs before the V2 ops' host ksize/strides.
    fn arity(self) -> usize {
        match self {
            Mode::Max | Mode::Avg => 1,
            Mode::AvgGrad => 2,
            Mode::MaxGrad | Mode::MaxGradGrad => 3,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Padding {
    Same,
    Valid,
    /// (top, bottom, left, right).
    Explicit([i64; 4]),
}

/// One pooling kernel (one TensorFlow node).
struct Pool {
    mode: Mode,
    name: &'static str,
    /// V2 ops: ksize and strides are host inputs.
    v2: bool,
    ksize: Option<Vec<i64>>,
    strides: Option<Vec<i64>>,
    padding: Padding,
    nchw: bool,
}

/// The workgroup size of `pool_vec4.wgsl`'s three-dimensional grid for rows of `rowq` items:
/// the largest multiple of 32 from 256 down to 128 that leaves the fewest idle invocations at
/// the end of each row (ResNet's 56 x 64-channel rows are 896 quads: 224 leaves none where 256
/// leaves 128 of 1024 idle). `TFWGPU_POOL_WG3=256` keeps 256 everywhere.
fn grid3_wg(rowq: usize) -> u32 {
    use std::sync::OnceLock;
    static FIXED: OnceLock<Option<u32>> = OnceLock::new();
    let fixed = *FIXED.get_or_init(|| {
        std::env::var("TFWGPU_POOL_WG3")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|w| (32..=256).contains(w) && w % 32 == 0)
    });
    if let Some(w) = fixed {
        return w;
    }
    (128..=WG)
        .rev()
        .step_by(32)
        .min_by_key(|&w| rowq.div_ceil(w as usize) * w as usize - rowq)
        .unwrap_or(WG)
}

/// The workgroup size of `pool_vec4.wgsl`'s three-dimensional grid (x: a row of `cols` items'
/// channel quads, y: `rows`, z: the batch, [`grid3_wg`]) where that grid fits the dispatch
/// limits and `div_small` is exact; None where it does not.
fn grid3_fits(g: &Geo, cols: usize, rows: usize) -> Option<u32> {
    let rowq = cols * (g.c / 4);
    let wg = grid3_wg(rowq);
    let limit = crate::kernel::MAX_GROUPS_X as usize;
    (rowq < 1 << 22
        && rowq.div_ceil(wg as usize) <= limit
        && rows <= limit
        && g.n <= limit
        && g.h + g.pt < 1 << 22
        && g.w + g.pl < 1 << 22)
        .then_some(wg)
}

/// Spatial geometry of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geo {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
}

impl Geo {
    /// The geometry words of the pooling shaders' params (n, h, w, c, oh, ow, kh, kw, sh, sw,
    /// pt, pl), after their first four.
    fn words(&self) -> [u32; 12] {
        [
            self.n, self.h, self.w, self.c, self.oh, self.ow, self.kh, self.kw, self.sh, self.sw,
            self.pt, self.pl,
        ]
        .map(|v| v as u32)
    }
}

fn ints_attr(name: &str, attrs: &Attrs, attr: &str) -> Result<Option<Vec<i64>>> {
    match attrs.get(attr) {
        None => Ok(None),
        Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
        Some(other) => {
            bail_invalid!("{name}: attribute {attr} must be a list of ints, got {other:?}")
        }
    }
}

impl Pool {
    fn build(mode: Mode, name: &'static str, v2: bool, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        if let Some(t) = attrs.dtype_opt("T")?
            && !DTYPES.contains(&t)
        {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={t}"
            )));
        }
        let nchw = match attrs.get("data_format") {
            None => false,
            Some(AttrValue::Str(s)) if s == "NHWC" => false,
            Some(AttrValue::Str(s)) if s == "NCHW" => true,
            Some(other) => {
                return Err(Error::Unimplemented(format!(
                    "{name}: data_format {other:?} is not supported (NHWC or NCHW)"
                )));
            }
        };
        let explicit = ints_attr(name, attrs, "explicit_paddings")?.unwrap_or_default();
        let padding = match attrs.get("padding") {
            Some(AttrValue::Str(s)) if s == "SAME" => Padding::Same,
            Some(AttrValue::Str(s)) if s == "VALID" => Padding::Valid,
            Some(AttrValue::Str(s)) if s == "EXPLICIT" => {
                if explicit.len() != 8 {
                    bail_invalid!(
                        "{name}: explicit_paddings must have 8 entries with EXPLICIT padding, got {}",
                        explicit.len()
                    );
                }
                if explicit.iter().any(|&v| v < 0) {
                    bail_invalid!(
                        "{name}: explicit_paddings must be nonnegative, got {explicit:?}"
                    );
                }
                if explicit.iter().any(|&v| v > u16::MAX as i64) {
                    return Err(Error::Unimplemented(format!(
                        "{name}: explicit paddings above 65535 are not supported, got {explicit:?}"
                    )));
                }
                // Pairs per dimension in data_format order.
                let (hd, wd, nd, cd) = if nchw { (2, 3, 0, 1) } else { (1, 2, 0, 3) };
                if explicit[2 * nd] != 0
                    || explicit[2 * nd + 1] != 0
                    || explicit[2 * cd] != 0
                    || explicit[2 * cd + 1] != 0
                {
                    bail_invalid!(
                        "{name}: explicit_paddings must be 0 in the batch and depth dimensions, \
                         got {explicit:?}"
                    );
                }
                Padding::Explicit([
                    explicit[2 * hd],
                    explicit[2 * hd + 1],
                    explicit[2 * wd],
                    explicit[2 * wd + 1],
                ])
            }
            None => bail_invalid!("{name}: missing attribute padding"),
            Some(other) => bail_invalid!("{name}: invalid padding {other:?}"),
        };
        let (ksize, strides) = if v2 {
            (None, None)
        } else {
            let k = ints_attr(name, attrs, "ksize")?;
            let s = ints_attr(name, attrs, "strides")?;
            if k.is_none() || s.is_none() {
                bail_invalid!("{name}: missing attribute ksize or strides");
            }
            (k, s)
        };
        let p = Pool {
            mode,
            name,
            v2,
            ksize,
            strides,
            padding,
            nchw,
        };
        if let (Some(k), Some(s)) = (&p.ksize, &p.strides) {
            p.window(k, s)?;
        }
        Ok(Box::new(p))
    }

    /// Validates ksize and strides; returns (kh, kw, sh, sw).
    fn window(&self, k: &[i64], s: &[i64]) -> Result<[usize; 4]> {
        let name = self.name;
        if k.len() != 4 {
            bail_invalid!(
                "{name}: Sliding window ksize field must specify 4 dimensions, got {k:?}"
            );
        }
        if s.len() != 4 {
            bail_invalid!(
                "{name}: Sliding window strides field must specify 4 dimensions, got {s:?}"
            );
        }
        let (hd, wd, cd) = if self.nchw { (2, 3, 1) } else { (1, 2, 3) };
        if k[0] != 1 || s[0] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: Pooling is not yet supported on the batch dimension (ksize {k:?}, \
                 strides {s:?})"
            )));
        }
        if k[cd] != 1 || s[cd] != 1 {
            return Err(Error::Unimplemented(format!(
                "{name}: pooling over the depth dimension is not supported (ksize {k:?}, \
                 strides {s:?})"
            )));
        }
        if k.iter().any(|&v| v <= 0) || s.iter().any(|&v| v <= 0) {
            bail_invalid!(
                "{name}: ksize and strides must be positive, got ksize {k:?}, strides {s:?}"
            );
        }
        if [k[hd], k[wd], s[hd], s[wd]]
            .iter()
            .any(|&v| v > u16::MAX as i64)
        {
            return Err(Error::Unimplemented(format!(
                "{name}: windows and strides above 65535 are not supported"
            )));
        }
        Ok([
            k[hd] as usize,
            k[wd] as usize,
            s[hd] as usize,
            s[wd] as usize,
        ])
    }

    /// One spatial dimension: (output size, padding before).
    fn out_size(&self, dim: usize, input: usize, k: usize, s: usize) -> Result<(usize, usize)> {
        let (i, k, s) = (input as i64, k as i64, s as i64);
        let (out, before) = match &self.padding {
            Padding::Valid => ((i - k + s) / s, 0),
            Padding::Same => {
                let out = (i + s - 1) / s;
                let needed = ((out - 1) * s + k - i).max(0);
                (out, needed / 2)
            }
            Padding::Explicit(p) => {
                let (b, a) = (p[2 * dim], p[2 * dim + 1]);
                ((i + b + a - k + s) / s, b)
            }
        };
        if out < 0 {
            bail_invalid!(
                "{}: Computed output size would be negative: {out} [input_size: {i}, \
                 effective_filter_size: {k}, stride: {s}]",
                self.name
            );
        }
        Ok((out as usize, before as usize))
    }

    fn geometry(&self, shape: &[usize], k: &[i64], s: &[i64]) -> Result<Geo> {
        let name = self.name;
        if shape.len() != 4 {
            bail_invalid!(
                "{name}: input must be 4-dimensional, got shape {}",
                fmt_shape(shape)
            );
        }
        let [kh, kw, sh, sw] = self.window(k, s)?;
        let (n, h, w, c) = if self.nchw {
            (shape[0], shape[2], shape[3], shape[1])
        } else {
            (shape[0], shape[1], shape[2], shape[3])
        };
        let (oh, pt) = self.out_size(0, h, kh, sh)?;
        let (ow, pl) = self.out_size(1, w, kw, sw)?;
        Ok(Geo {
            n,
            h,
            w,
            c,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
        })
    }

    fn shape_of(&self, n: usize, h: usize, w: usize, c: usize) -> Vec<usize> {
        if self.nchw {
            vec![n, c, h, w]
        } else {
            vec![n, h, w, c]
        }
    }

    /// Validates the inputs; returns the geometry and the output's desc.
    fn check(&self, inputs: &[Operand]) -> Result<(Geo, TensorDesc)> {
        let name = self.name;
        let arity = self.mode.arity() + if self.v2 { 2 } else { 0 };
        if inputs.len() != arity {
            bail_invalid!("{name} takes {arity} inputs, got {}", inputs.len());
        }
        let (k, s) = if self.v2 {
            let k = inputs[arity - 2].host(name, arity - 2)?.to_i64_vec()?;
            let s = inputs[arity - 1].host(name, arity - 1)?.to_i64_vec()?;
            (k, s)
        } else {
            (
                self.ksize.clone().unwrap_or_default(),
                self.strides.clone().unwrap_or_default(),
            )
        };
        // The tensor giving the pooled input's shape, and the T-typed tensors.
        let dtype;
        let in_shape: Vec<usize>;
        let mut typed: Vec<(usize, &str)> = vec![];
        match self.mode {
            Mode::AvgGrad => {
                let shp = inputs[0].host(name, 0)?;
                if shp.shape.len() != 1 || shp.shape[0] != 4 {
                    bail_invalid!(
                        "{name}: orig_input_shape must be 1-dimensional and 4 elements, got \
                         shape {}",
                        fmt_shape(&shp.shape)
                    );
                }
                let v = shp.to_i64_vec()?;
                if v.iter().any(|&d| d < 0) {
                    bail_invalid!("{name}: orig_input_shape must be nonnegative, got {v:?}");
                }
                in_shape = v.iter().map(|&d| d as usize).collect();
                dtype = inputs[1].dtype();
                typed.push((1, "grad"));
            }
            _ => {
                in_shape = inputs[0].shape().to_vec();
                dtype = inputs[0].dtype();
                typed.push((0, "input"));
                if self.mode.arity() == 3 {
                    typed.push((1, "orig_output"));
                    typed.push((2, "grad"));
                }
            }
        }
        if !DTYPES.contains(&dtype) {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for T={dtype}"
            )));
        }
        for &(i, what) in &typed {
            if inputs[i].dtype() != dtype {
                bail_invalid!(
                    "{name}: {what} is {} but the op's T is {dtype}",
                    inputs[i].dtype()
                );
            }
        }
        let g = self.geometry(&in_shape, &k, &s)?;
        let pooled = self.shape_of(g.n, g.oh, g.ow, g.c);
        let check_shape =
            |i: usize, what: &str, want: &[usize]| expect_shape(name, inputs, i, what, want);
        let out_shape = match self.mode {
            Mode::Max | Mode::Avg => pooled,
            Mode::AvgGrad => {
                check_shape(1, "grad", &pooled)?;
                in_shape.clone()
            }
            Mode::MaxGrad => {
                check_shape(1, "orig_output", &pooled)?;
                check_shape(2, "grad", &pooled)?;
                in_shape.clone()
            }
            Mode::MaxGradGrad => {
                check_shape(1, "orig_output", &pooled)?;
                check_shape(2, "grad", &in_shape)?;
                pooled
            }
        };
        words_for(name, dtype, num(&in_shape).max(num(&out_shape)))?;
        Ok((g, TensorDesc::new(dtype, &out_shape)))
    }
}

/// `pool_vec4.wgsl`'s order keys of four stored elements (`keyx`), their bits per lane
/// (`bitsx`) and back (`from_bitsx`): float32 through `key4`; float16 on the halves' own bits
/// (sign and magnitude: -x keys as -|x| - 1, -0 as +0, NaN as i32 min), never widened.
fn vec4_keys(dtype: DType) -> &'static str {
    if dtype == DType::F16 {
        "fn bitsx(v: vec2<u32>) -> vec4<u32> {
    return vec4<u32>(v.x & 0xffffu, v.x >> 16u, v.y & 0xffffu, v.y >> 16u);
}
fn from_bitsx(b: vec4<u32>) -> vec2<u32> {
    return vec2<u32>(b.x | (b.y << 16u), b.z | (b.w << 16u));
}
fn keyx(v: vec2<u32>) -> vec4<i32> {
    let h = bitsx(v);
    let mag = h & vec4<u32>(0x7fffu);
    let neg = (h & vec4<u32>(0x8000u)) != vec4<u32>(0u);
    let m = bitcast<vec4<i32>>(mag);
    let k = select(m, -m - vec4<i32>(1), neg & (mag != vec4<u32>(0u)));
    return select(k, vec4<i32>(-2147483647 - 1), mag > vec4<u32>(0x7c00u));
}"
    } else {
        "fn bitsx(v: vec4<f32>) -> vec4<u32> {
    return bitcast<vec4<u32>>(v);
}
fn from_bitsx(b: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(b);
}
fn keyx(v: vec4<f32>) -> vec4<i32> {
    return key4(v);
}"
    }
}

fn num(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn shader(mode: Mode, dtype: DType) -> String {
    shader_from(POOL_WGSL, mode.index(), dtype)
}

/// An InvalidArgument error unless the allocated output is what the op computes.
fn expect_output(name: &str, out: &DeviceRef, want: &TensorDesc) -> Result<()> {
    if out.desc != *want {
        bail_invalid!(
            "{name}: output is {} {} but the op computes {} {}",
            out.desc.dtype,
            fmt_shape(&out.desc.shape),
            want.dtype,
            fmt_shape(&want.shape)
        );
    }
    Ok(())
}

/// An InvalidArgument error unless input `i` (`what`) has shape `want`.
fn expect_shape(
    name: &str,
    inputs: &[Operand],
    i: usize,
    what: &str,
    want: &[usize],
) -> Result<()> {
    if inputs[i].shape() != want {
        bail_invalid!(
            "{name}: {what} must have shape {}, got {}",
            fmt_shape(want),
            fmt_shape(inputs[i].shape())
        );
    }
    Ok(())
}

/// Refuses (Unimplemented) a pooling whose invocations would loop more than
/// `wgsl::LOOP_LIMIT` times in all on a CPU adapter (lavapipe leaves a shader's loops there:
/// the results would be silently wrong).
fn loop_check(ctx: &KernelContext, name: &str, iterations: usize) -> Result<()> {
    if ctx.loop_limited() && iterations >= crate::kernels::wgsl::LOOP_LIMIT {
        return Err(Error::Unimplemented(format!(
            "{name}: one output's window takes {iterations} loop iterations, more than this CPU \
             adapter runs per shader invocation ({})",
            crate::kernels::wgsl::LOOP_LIMIT
        )));
    }
    Ok(())
}

/// A gathering pool shader (`pool.wgsl`, `pool3d.wgsl`) with its placeholders filled for
/// `mode` and `dtype`.
fn shader_from(src: &str, mode: u32, dtype: DType) -> String {
    let half = dtype == DType::F16;
    src.replace("$MODE", &mode.to_string())
        .replace("$HALF", if half { "true" } else { "false" })
        .replace(
            "$LOWEST",
            if half {
                "-65504.0"
            } else {
                "bitcast<f32>(0xff7fffffu)"
            },
        )
        .replace("$LOAD_A", &load_expr(dtype, "a"))
        .replace("$LOAD_B", &load_expr(dtype, "b"))
        .replace("$LOAD_C", &load_expr(dtype, "c"))
        .replace("$STORE", store_stmt(dtype))
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$COMMON", COMMON_WGSL)
}

impl Kernel for Pool {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?.1])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.name;
        let (g, want) = self.check(inputs)?;
        let out = &outputs[0];
        expect_output(name, out, &want)?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        // Loop iterations of one invocation, the outer loops' counted too: the window; the
        // covering outputs of a gradient (MaxPoolGrad's generic gather recomputes each one's
        // argmax over its window).
        let window = g.kh * g.kw + g.kh;
        let (cy, cx) = (g.kh.div_ceil(g.sh), g.kw.div_ceil(g.sw));
        let covering = cy * cx + cy;
        loop_check(
            ctx,
            name,
            match self.mode {
                Mode::Max | Mode::Avg | Mode::MaxGradGrad => window,
                Mode::AvgGrad => covering,
                Mode::MaxGrad => covering * (window + 1),
            },
        )?;
        let dtype = out.desc.dtype;
        let dev =
            |i: usize| -> Result<crate::exec::BufferRange> { ctx.bind(inputs[i].device(name, i)?) };
        let (a, b, c) = match self.mode {
            Mode::Max | Mode::Avg => (dev(0)?, ctx.temp(4)?, ctx.temp(4)?),
            Mode::AvgGrad => (dev(1)?, ctx.temp(4)?, ctx.temp(4)?),
            Mode::MaxGrad => (dev(0)?, dev(2)?, ctx.temp(4)?),
            Mode::MaxGradGrad => (dev(0)?, dev(2)?, dev(1)?),
        };
        let o = bind_out(ctx, name, out)?;
        let mode = self.mode;
        // MaxPool / MaxPoolGrad on NHWC with C % 4 == 0: `pool_vec4.wgsl`, four
        // channels per invocation (bit-identical results); MaxPoolGrad in two passes (argmax
        // codes per output, 8 bits per channel, then the gather), so windows of at most 255
        // elements.
        if matches!(dtype, DType::F32 | DType::F16)
            && !self.nchw
            && g.c.is_multiple_of(4)
            && (mode == Mode::Max || (mode == Mode::MaxGrad && g.kh * g.kw <= 255))
            && (ctx.limits().min_storage_buffer_offset_alignment as usize).is_multiple_of(16)
        {
            let u = |v: usize| v as u32;
            let (hw, suffix) = crate::kernels::norm::vec4_hw(ctx, dtype)?;
            // The built-in max on whole 3x3 windows (pool_vec4.wgsl's FAST): float32, and
            // float16 where its widening is one hardware conversion (the integer keys of its
            // halves without widening, on such a device: request mem5-2, H200, MaxPool 111 us
            // against 60, the codes pass 103 against 72).
            let fast = dtype == DType::F32 || hw;
            // Native half comparisons (MaxPool and the codes; the block gather stays widened:
            // request mem7-1 measured it in half arithmetic at 93 us against 73).
            let (native_on, max_form) = f16_native_mode();
            let native_ok = dtype == DType::F16
                && fast
                && native_on
                && crate::kernels::f16conv::f16_native(ctx)?;
            let vec4_pass = |pass: u32, words: usize, binds: Vec<crate::exec::BufferRange>| {
                let native = native_ok && (pass == 0 || pass == 5);
                // The items: outputs (MaxPool, codes) or inputs (the gather), row by row.
                let (cols, rows) = match pass {
                    2 => (g.w, g.h),
                    // 2 x 2 blocks of padded input positions.
                    6 | 7 => ((g.w + g.pl).div_ceil(2), (g.h + g.pt).div_ceil(2)),
                    _ => (g.ow, g.oh),
                };
                let rowq = cols * (g.c / 4);
                let grid3 = grid3_fits(&g, cols, rows);
                debug_assert!((pass != 6 && pass != 7) || grid3.is_some());
                let pipeline = ctx.pipeline(
                    PipelineKey::new(
                        "pool",
                        Some(dtype),
                        format!(
                            "max_vec4/{pass}{suffix}{}{}{}",
                            match grid3 {
                                Some(WG) => "/g3".to_string(),
                                Some(w) => format!("/g3w{w}"),
                                None => String::new(),
                            },
                            match (native, max_form) {
                                (false, _) => "",
                                (true, false) => "/native",
                                (true, true) => "/nativemax",
                            },
                            if fast { "/fast" } else { "" }
                        ),
                    ),
                    || {
                        crate::kernels::membound_shader(vec4_source(
                            pass,
                            dtype,
                            hw,
                            grid3,
                            (native, max_form),
                            fast,
                        ))
                    },
                )?;
                let (groups, row) = if let Some(w) = grid3 {
                    ([u(rowq.div_ceil(w as usize)), u(rows), u(g.n)], 0)
                } else {
                    grid_1d(words as u64, WG)
                };
                let inv = |d: usize| (1.0f32 / d as f32).to_bits();
                let p = params(
                    &[
                        &[row, u(n), u(words), 0][..],
                        &g.words(),
                        &[u(rowq), inv(g.c / 4), inv(g.sh), inv(g.sw)],
                    ]
                    .concat(),
                );
                ctx.dispatch(&pipeline, &p, &binds, groups)
            };
            if mode == Mode::Max {
                // Bindings 2 (a vec4 array) and 3 (the codes) unused: 16 bytes each.
                // Native: bindings 5 and 6 are the input and the output again (as vec4<f16>).
                let binds = if native_ok {
                    vec![a.clone(), ctx.temp(16)?, ctx.temp(16)?, o.clone(), a, o]
                } else {
                    vec![a, ctx.temp(16)?, ctx.temp(16)?, o]
                };
                return vec4_pass(0, n / 4, binds);
            }
            // MaxPoolGrad: grad (b) has the output's n * oh * ow * c elements; one code
            // word per output vec4.
            let outs = g.n * g.oh * g.ow * g.c;
            if outs == 0 {
                // No output covers any input: dx is zero.
                return crate::kernels::fill::fill_bytes(ctx, out.addr, out.desc.byte_size(), 0);
            }
            let codes = ctx.temp((outs as u64).max(16))?;
            let unused = ctx.temp(16)?;
            let mut binds = vec![a.clone(), unused.clone(), codes.clone(), unused.clone()];
            if native_ok {
                // Native: binding 5 the input again (as vec4<f16>), 6 unused.
                binds.extend([a.clone(), unused]);
            }
            vec4_pass(5, outs / 4, binds)?;
            // Strides 2 x 2 and windows up to 4 x 4: the gather per 2 x 2 block of inputs
            // (pool_vec4.wgsl's MODE 6; it needs the three-dimensional grid, whose limits
            // hold for the blocks where they hold for the inputs).
            // `TFWGPU_POOL_BLOCK_GATHER=0` keeps the per-input gather (measurements).
            let block = g.sh == 2
                && g.sw == 2
                && g.kh <= 4
                && g.kw <= 4
                && !block_gather_off()
                && grid3_fits(&g, (g.w + g.pl).div_ceil(2), (g.h + g.pt).div_ceil(2)).is_some();
            // 3x3 / 2 without top or left padding as MODE 7 (`TFWGPU_POOL_GATHER3S2=0`: MODE 6).
            let pass =
                if block && g.kh == 3 && g.kw == 3 && g.pt == 0 && g.pl == 0 && gather3s2_on() {
                    7
                } else if block {
                    6
                } else {
                    2
                };
            return vec4_pass(pass, n / 4, vec![a, b, codes, o]);
        }
        let pipeline = ctx.pipeline(
            PipelineKey::new(
                "pool",
                Some(dtype),
                format!("{mode:?}").to_ascii_lowercase(),
            ),
            || crate::kernels::membound_shader(shader(mode, dtype)),
        )?;
        let words = words_for(name, dtype, n)?;
        let (groups, row) = grid_1d(words as u64, WG);
        let u = |v: usize| v as u32;
        let p = params(&[&[row, u(n), words, self.nchw as u32][..], &g.words()].concat());
        ctx.dispatch(&pipeline, &p, &[a, b, c, o], groups)
    }
}

#[cfg(test)]
mod tests {
    use super::grid3_wg;

    /// The fewest idle invocations per row, the larger size on a tie (no `TFWGPU_POOL_WG3` in
    /// the test environment).
    #[test]
    fn grid3_workgroups_fit_the_rows() {
        assert_eq!(grid3_wg(896), 224); // 56 x 64 channels: 4 x 224, where 256 idles 128
        assert_eq!(grid3_wg(1024), 256);
        assert_eq!(grid3_wg(1792), 256); // 7 x 256
        assert_eq!(grid3_wg(448), 224); // 2 x 224
        assert_eq!(grid3_wg(12), 128); // one workgroup, the smallest
        assert_eq!(grid3_wg(3 * 192), 192);
    }
}
