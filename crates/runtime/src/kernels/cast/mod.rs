//! Cast family: TensorFlow's `Cast` (attrs `SrcT`, `DstT`, `Truncate`) between f32, f16, i32,
//! i64, u8 and bool, every pair; the same type is a copy.
//!
//! Semantics follow C++ `static_cast` as TensorFlow's CPU kernel applies it:
//! - float -> int truncates toward zero. Out of range is undefined in C++ (x86 TensorFlow CPU
//!   gives INT_MIN for NaN and every out-of-range value); here it **saturates**: values at or
//!   above 2^31 (2^63 for int64) give INT_MAX, values at or below -2^31 (-2^63) give INT_MIN,
//!   and **NaN gives 0**. float -> uint8 is the low 8 bits of that int32 conversion
//!   (-1.5 -> 255, 300.7 -> 44; NaN -> 0, +inf -> 255).
//! - float -> bool is `x != 0` (NaN -> true, -0 -> false); bool -> numeric is 0 or 1; any
//!   nonzero bool byte reads as true.
//! - int -> int keeps the low bits (two's complement), u8 and bool zero-extend, i32 sign-extends.
//! - int -> f32 (i32 and i64) rounds to nearest even, with a single rounding for every value.
//! - f32 -> f16 rounds to nearest even on the bits (overflow -> inf, f16 subnormals exact).
//!   int -> f16 goes through f32 as Eigen's `half(int)` constructor does (two roundings).
//!   f16 -> anything converts exactly to f32 first.
//! - The float16 conversions come from `f16conv` (the hardware ones where the adapter passed
//!   its self-test, else the exact software ones; both give the bits above). f32 <-> f16 with
//!   a multiple of 8 elements moves 8 elements per invocation (vec4 loads and stores).
//! - `Truncate = true` on f32 -> f16 clears the 13 low mantissa bits of the f32 before the
//!   conversion, as TensorFlow's `LSBZeroSetter` does (truncation toward zero in the normal
//!   range); it has no effect on the other pairs, as in TensorFlow.

use crate::kernel::{Attrs, DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, bind_out, fmt_shape, words_for};
use crate::kernels::f16conv;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

const CAST_WGSL: &str = include_str!("cast.wgsl");

const ALL: &[DType] = &DType::ALL;

/// Registration table.
pub const OPS: &[OpDef] = &[OpDef {
    op: "Cast",
    type_attr: "SrcT",
    dtypes: ALL,
    host_inputs: &[],
    factory: Cast::build,
}];

struct Cast {
    /// `SrcT`; when absent, the input's dtype.
    src: Option<DType>,
    dst: DType,
    truncate: bool,
}

impl Cast {
    fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let src = attrs
            .dtype_opt("SrcT")
            .map_err(|e| Error::InvalidArgument(format!("Cast: {e}")))?;
        let dst = attrs
            .dtype("DstT")
            .map_err(|e| Error::InvalidArgument(format!("Cast: {e}")))?;
        let truncate = attrs
            .bool_or("Truncate", false)
            .map_err(|e| Error::InvalidArgument(format!("Cast: {e}")))?;
        for t in src.iter().chain([&dst]) {
            if !ALL.contains(t) {
                return Err(Error::Unimplemented(format!(
                    "Cast has no tfwgpu kernel for {t}"
                )));
            }
        }
        Ok(Box::new(Cast { src, dst, truncate }))
    }

    fn check(&self, inputs: &[Operand]) -> Result<(DType, Vec<usize>)> {
        if inputs.len() != 1 {
            bail_invalid!("Cast takes 1 input, got {}", inputs.len());
        }
        let t = inputs[0].dtype();
        if let Some(src) = self.src
            && src != t
        {
            bail_invalid!("Cast: input 0 is {t} but SrcT is {src}");
        }
        let shape = inputs[0].shape().to_vec();
        let n = shape.iter().product();
        words_for("Cast", t, n)?;
        words_for("Cast", self.dst, n)?;
        Ok((t, shape))
    }
}

impl Kernel for Cast {
    fn op(&self) -> &'static str {
        "Cast"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (_, shape) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(self.dst, &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (src, shape) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc.dtype != self.dst || out.desc.shape != shape {
            bail_invalid!(
                "Cast: output is {} {} but the op computes {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                self.dst,
                fmt_shape(&shape)
            );
        }
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let input = ctx.bind(inputs[0].device("Cast", 0)?)?;
        let o = bind_out(ctx, "Cast", out)?;
        if src == self.dst {
            // Allocations are padded, so the copy may round up to whole words.
            return ctx.copy(&input, &o, out.desc.byte_size().next_multiple_of(4));
        }
        let dst = self.dst;
        let truncate = self.truncate && src == DType::F32 && dst == DType::F16;
        let (hw, suffix) = f16conv::choice(ctx, src == DType::F16 || dst == DType::F16)?;
        let pair = matches!(
            (src, dst),
            (DType::F32, DType::F16) | (DType::F16, DType::F32)
        );
        let aligned =
            (ctx.limits().min_storage_buffer_offset_alignment as usize).is_multiple_of(16);
        // float16 -> float32: four elements per invocation (one 8-byte load, one 16-byte store;
        // the stores of neighbouring invocations contiguous). Request mem5-2 (H200,
        // 64x56x56x256): 87.9 us against 131.9 with eight per invocation (two 16-byte stores
        // 16 bytes apart per invocation, so each store instruction of a warp wrote every other
        // 16 bytes of 1 KiB); `TFWGPU_CAST_F16_F32=x8` keeps eight (measurements).
        if pair && dst == DType::F32 && n.is_multiple_of(4) && aligned && cast_f16_f32_x4() {
            let key = PipelineKey::new("cast", Some(src), format!("{}/x4{suffix}", dst.name()));
            let pipeline = ctx.pipeline(key, || {
                crate::kernels::membound_shader(
                    CAST_X8_WGSL
                        .replace("$LINEAR_INDEX", LINEAR_INDEX)
                        .replace("$COMMON", COMMON_WGSL)
                        .replace("$F16", f16conv::f16x2_wgsl(hw))
                        .replace("$BODY", X4_FROM_F16)
                        .replace("$SRC", "vec2<u32>")
                        .replace("$DST", "vec4<f32>")
                        .replace("$WG", &WG.to_string()),
                )
            })?;
            let units = (n / 4) as u32;
            let (groups, row) = grid_1d(units as u64, WG);
            return ctx.dispatch(&pipeline, &params(&[row, units, 0, 0]), &[input, o], groups);
        }
        if pair && !truncate && n.is_multiple_of(8) && aligned {
            let to_f16 = dst == DType::F16;
            let key = PipelineKey::new("cast", Some(src), format!("{}/x8{suffix}", dst.name()));
            let pipeline = ctx.pipeline(key, || {
                crate::kernels::membound_shader(
                    CAST_X8_WGSL
                        .replace("$LINEAR_INDEX", LINEAR_INDEX)
                        .replace("$COMMON", COMMON_WGSL)
                        .replace("$F16", f16conv::f16x2_wgsl(hw))
                        .replace("$BODY", if to_f16 { X8_TO_F16 } else { X8_FROM_F16 })
                        .replace("$SRC", if to_f16 { "vec4<f32>" } else { "vec4<u32>" })
                        .replace("$DST", if to_f16 { "vec4<u32>" } else { "vec4<f32>" })
                        .replace("$WG", &WG.to_string()),
                )
            })?;
            let units = (n / 8) as u32;
            let (groups, row) = grid_1d(units as u64, WG);
            return ctx.dispatch(&pipeline, &params(&[row, units, 0, 0]), &[input, o], groups);
        }
        let key = PipelineKey::new(
            "cast",
            Some(src),
            format!(
                "{}{}{suffix}",
                dst.name(),
                if truncate { "/truncate" } else { "" }
            ),
        );
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(src, dst, truncate, hw)))?;
        let units = if dst == DType::I64 {
            n as u32
        } else {
            words_for("Cast", dst, n)?
        };
        let (groups, row) = grid_1d(units as u64, WG);
        ctx.dispatch(
            &pipeline,
            &params(&[row, n as u32, units, 0]),
            &[input, o],
            groups,
        )
    }
}

/// The body of `fn load(e: u32) -> S`, and S.
fn load(src: DType) -> (&'static str, &'static str) {
    match src {
        DType::F32 => ("f32", "    return bitcast<f32>(src[e]);"),
        DType::F16 => (
            "f32",
            "    return f16_to_f32((src[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);",
        ),
        DType::I32 => (
            "vec2<u32>",
            "    let v = src[e];
    return vec2<u32>(v, select(0u, 0xffffffffu, (v & 0x80000000u) != 0u));",
        ),
        DType::I64 => (
            "vec2<u32>",
            "    return vec2<u32>(src[2u * e], src[2u * e + 1u]);",
        ),
        DType::U8 => (
            "vec2<u32>",
            "    return vec2<u32>((src[e >> 2u] >> ((e & 3u) * 8u)) & 0xffu, 0u);",
        ),
        DType::Bool => (
            "vec2<u32>",
            "    let bv = (src[e >> 2u] >> ((e & 3u) * 8u)) & 0xffu;
    return vec2<u32>(select(0u, 1u, bv != 0u), 0u);",
        ),
        DType::U32 | DType::U64 => unreachable!("Cast::build rejects unsigned types"),
    }
}

/// The body of `fn conv(v: S) -> D`, and D.
fn conv(src: DType, dst: DType, truncate: bool) -> (&'static str, &'static str) {
    if src.is_float() {
        match dst {
            DType::F32 => ("f32", "    return v;"),
            DType::F16 if truncate => (
                "u32",
                "    var x = v;
    if !is_nan(x) {
        x = bitcast<f32>(bitcast<u32>(x) & 0xffffe000u);
    }
    return f32_to_f16(x);",
            ),
            DType::F16 => ("u32", "    return f32_to_f16(v);"),
            DType::I32 => ("i32", "    return f32_to_i32(v);"),
            DType::I64 => ("vec2<u32>", "    return f32_to_i64(v);"),
            DType::U8 => ("u32", "    return bitcast<u32>(f32_to_i32(v)) & 0xffu;"),
            DType::Bool => (
                "u32",
                "    return select(0u, 1u, (bitcast<u32>(v) & 0x7fffffffu) != 0u);",
            ),
            DType::U32 | DType::U64 => unreachable!("Cast::build rejects unsigned types"),
        }
    } else {
        match dst {
            DType::F32 => ("f32", "    return i64_to_f32(v);"),
            DType::F16 => ("u32", "    return f32_to_f16(i64_to_f32(v));"),
            DType::I32 => ("i32", "    return bitcast<i32>(v.x);"),
            DType::I64 => ("vec2<u32>", "    return v;"),
            DType::U8 => ("u32", "    return v.x & 0xffu;"),
            DType::Bool => ("u32", "    return select(0u, 1u, (v.x | v.y) != 0u);"),
            DType::U32 | DType::U64 => unreachable!("Cast::build rejects unsigned types"),
        }
    }
}

/// Statements writing output unit `w` (a word; an element for i64).
fn store(dst: DType) -> &'static str {
    match dst {
        DType::F32 | DType::I32 => "    out[w] = bitcast<u32>(conv(load(w)));",
        DType::I64 => {
            "    let v = conv(load(w));
    out[2u * w] = v.x;
    out[2u * w + 1u] = v.y;"
        }
        DType::F16 => {
            "    let e0 = 2u * w;
    var hi = 0u;
    if e0 + 1u < p.n {
        hi = conv(load(e0 + 1u));
    }
    out[w] = conv(load(e0)) | (hi << 16u);"
        }
        DType::U8 | DType::Bool => {
            "    let e0 = 4u * w;
    var word = 0u;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if e0 + j < p.n {
            word = word | ((conv(load(e0 + j)) & 0xffu) << (8u * j));
        }
    }
    out[w] = word;"
        }
        DType::U32 | DType::U64 => unreachable!("Cast::build rejects unsigned types"),
    }
}

/// f32 <-> f16 of 8 elements per invocation (n % 8 == 0, 16-byte aligned bindings): two
/// vec4<f32> and one vec4<u32> of 8 halves, through `f16conv`'s pair conversions.
const CAST_X8_WGSL: &str = "struct Params {
    row: u32,
    units: u32,
    pad0: u32,
    pad1: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<$SRC>;
@group(0) @binding(2) var<storage, read_write> out: array<$DST>;

$LINEAR_INDEX
$COMMON
$F16

@compute @workgroup_size($WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.units {
        return;
    }
$BODY
}
";

const X8_TO_F16: &str = "    let a = src[2u * i];
    let b = src[2u * i + 1u];
    out[i] = vec4<u32>(
        f32x2_to_f16(a.xy),
        f32x2_to_f16(a.zw),
        f32x2_to_f16(b.xy),
        f32x2_to_f16(b.zw),
    );";

const X8_FROM_F16: &str = "    let w = src[i];
    out[2u * i] = vec4<f32>(f16x2_to_f32(w.x), f16x2_to_f32(w.y));
    out[2u * i + 1u] = vec4<f32>(f16x2_to_f32(w.z), f16x2_to_f32(w.w));";

const X4_FROM_F16: &str = "    let w = src[i];
    out[i] = vec4<f32>(f16x2_to_f32(w.x), f16x2_to_f32(w.y));";

/// float16 -> float32 four elements per invocation, unless `TFWGPU_CAST_F16_F32=x8`.
fn cast_f16_f32_x4() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_CAST_F16_F32", "x8"))
}

/// The one-word-per-invocation shader; float16 loads and stores through `f16conv`'s one-half
/// forms (`hw`: the hardware ones).
fn shader(src: DType, dst: DType, truncate: bool, hw: bool) -> String {
    let (s, load_body) = load(src);
    let (d, conv_body) = conv(src, dst, truncate);
    CAST_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace(
            "$COMMON",
            &format!("{COMMON_WGSL}\n{}", f16conv::f16x2_wgsl(hw)),
        )
        .replace("$LOAD", &f16conv::routed(load_body))
        .replace("$CONV", &f16conv::routed(conv_body))
        .replace("$STORE", store(dst))
        .replace("$S", s)
        .replace("$D", d)
        .replace("$WG", &WG.to_string())
}
