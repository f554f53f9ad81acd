//! Fill family: Fill, ZerosLike, OnesLike, and the byte-pattern fill behind memset.

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

const ALL: &[DType] = &DType::ALL;

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "Fill",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[(0, "dims")],
        factory: |_| Ok(Box::new(Fill)),
    },
    OpDef {
        op: "ZerosLike",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(ConstLike { one: false })),
    },
    OpDef {
        op: "OnesLike",
        type_attr: "T",
        dtypes: ALL,
        host_inputs: &[],
        factory: |_| Ok(Box::new(ConstLike { one: true })),
    },
];

/// Shader: each invocation writes one 32-bit word of the output, keeping the bytes of the
/// word that lie outside [start, start + len) (so unaligned and partial fills are exact).
/// The pattern comes from the params or, for Fill, from the value tensor's first word(s).
const FILL_WGSL: &str = r#"
struct Params { row: u32, start: u32, len: u32, pattern: u32, elem_size: u32, from_value: u32, words: u32, pattern_hi: u32, first_word: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> value: array<u32>;
LINEAR_INDEX
fn replicate(v: u32, size: u32) -> u32 {
    if size == 1u { let b = v & 0xffu; return b | (b << 8u) | (b << 16u) | (b << 24u); }
    if size == 2u { let h = v & 0xffffu; return h | (h << 16u); }
    return v;
}
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = linear_index(gid);
    if r >= p.words { return; }
    var lo = p.pattern;
    var hi = p.pattern_hi;
    if p.from_value == 1u {
        lo = replicate(value[0], p.elem_size);
        hi = lo;
        if p.elem_size == 8u { hi = value[1]; }
    }
    // Bytes of word r, relative to the first touched word; the fill covers [start, start + len)
    // with start < 4 (8-byte elements always start at 0).
    let byte0 = r * 4u;
    var pat = lo;
    if p.elem_size == 8u && (byte0 / 4u) % 2u == 1u { pat = hi; }
    var mask = 0xffffffffu;
    if byte0 < p.start { mask = mask << (8u * (p.start - byte0)); }
    let end = p.start + p.len;
    if byte0 + 4u > end { mask = mask & (0xffffffffu >> (8u * (byte0 + 4u - end))); }
    let w = p.first_word + r;
    if mask == 0xffffffffu { out[w] = pat; } else { out[w] = (out[w] & ~mask) | (pat & mask); }
}
"#;

fn pipeline(ctx: &KernelContext) -> Result<std::sync::Arc<crate::exec::Pipeline>> {
    ctx.pipeline(PipelineKey::new("fill", None, ""), || {
        ShaderSource::new(
            FILL_WGSL
                .replace("LINEAR_INDEX", LINEAR_INDEX)
                .replace("WG", &WG.to_string()),
        )
    })
}

/// Fills `len` bytes at `addr` with the 32-bit `pattern` (memset32; a byte pattern replicated
/// four times is memset). Any alignment of `addr` and `len` is exact.
pub fn fill_bytes(ctx: &KernelContext, addr: u64, len: u64, pattern: u32) -> Result<()> {
    fill_impl(ctx, addr, len, pattern, pattern, 4, None)
}

fn fill_impl(
    ctx: &KernelContext,
    addr: u64,
    len: u64,
    lo: u32,
    hi: u32,
    elem_size: u32,
    value: Option<&DeviceRef>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let r = ctx.dev.alloc.resolve(addr)?;
    if len > r.remaining {
        bail_invalid!("a fill of {len} bytes at {addr:#x} runs past its allocation");
    }
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    let base = r.offset / align * align;
    let start = r.offset - base;
    // Bind from the aligned base; the shader skips whole words, then masks bytes.
    let skip_words = start / 4;
    let start_in_word = (start % 4) as u32;
    let words = (start_in_word as u64 + len).div_ceil(4);
    if words > u32::MAX as u64 {
        return Err(Error::OutOfMemory("fill larger than 16 GiB".into()));
    }
    let bind_size = (skip_words + words) * 4;
    let out = crate::exec::BufferRange {
        buffer: r.buffer.clone(),
        offset: base,
        size: bind_size,
    };
    let pipeline = pipeline(ctx)?;
    let val = match value {
        Some(v) => ctx.bind_bytes(v.addr, v.desc.byte_size().max(4))?,
        None => out.clone(),
    };
    if len > u32::MAX as u64 - 4 {
        return Err(Error::OutOfMemory("fill larger than 4 GiB".into()));
    }
    let (groups, row) = grid_1d(words, WG);
    let p = params(&[
        row,
        start_in_word,
        len as u32,
        lo,
        elem_size,
        value.is_some() as u32,
        words as u32,
        hi,
        skip_words as u32,
    ]);
    ctx.dispatch(&pipeline, &p, &[out, val], groups)
}

/// The most bytes [`write_small`] takes (the uniform array of its shader holds 68 words: the
/// bytes, shifted by up to 3 within their first word).
pub const SMALL_WRITE_MAX: usize = 256;

/// Shader: each invocation writes one 32-bit word of the output from the params' data words,
/// keeping the bytes outside [start, start + len) of the touched words (any alignment and
/// length is exact, as for the fill).
const WRITE_WGSL: &str = r#"
struct Params { start: u32, len: u32, words: u32, first_word: u32, data: array<vec4<u32>, 17> };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if r >= p.words { return; }
    let v = p.data[r / 4u][r % 4u];
    let byte0 = r * 4u;
    var mask = 0xffffffffu;
    if byte0 < p.start { mask = mask << (8u * (p.start - byte0)); }
    let end = p.start + p.len;
    if byte0 + 4u > end { mask = mask & (0xffffffffu >> (8u * (byte0 + 4u - end))); }
    let w = p.first_word + r;
    if mask == 0xffffffffu { out[w] = v; } else { out[w] = (out[w] & ~mask) | (v & mask); }
}
"#;

/// Writes the host bytes `data` (at most [`SMALL_WRITE_MAX`]) at `addr` with one dispatch
/// whose params carry them: recorded in the open compute pass like any kernel, in order, with
/// no copy command (a copy ends the pass) and no staging buffer. Any alignment and length.
pub fn write_small(ctx: &KernelContext, addr: u64, data: &[u8]) -> Result<()> {
    let len = data.len();
    if len == 0 {
        return Ok(());
    }
    if len > SMALL_WRITE_MAX {
        bail_invalid!("a small write of {len} bytes: at most {SMALL_WRITE_MAX}");
    }
    let r = ctx.dev.alloc.resolve(addr)?;
    if len as u64 > r.remaining {
        bail_invalid!("a write of {len} bytes at {addr:#x} runs past its allocation");
    }
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    let base = r.offset / align * align;
    let start = r.offset - base;
    let skip_words = start / 4;
    let start_in_word = (start % 4) as usize;
    let words = (start_in_word + len).div_ceil(4);
    let out = crate::exec::BufferRange {
        buffer: r.buffer.clone(),
        offset: base,
        size: (skip_words + words as u64) * 4,
    };
    let pipeline = ctx.pipeline(PipelineKey::new("write", None, ""), || {
        ShaderSource::new(WRITE_WGSL.to_string())
    })?;
    let mut p = [0u32; 4 + 68];
    p[0] = start_in_word as u32;
    p[1] = len as u32;
    p[2] = words as u32;
    p[3] = skip_words as u32;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut p[4..]);
    bytes[start_in_word..start_in_word + len].copy_from_slice(data);
    ctx.dispatch(&pipeline, bytemuck::cast_slice(&p), &[out], [1, 1, 1])
}

/// Fill(dims, value): a tensor of shape `dims` with every element `value`.
struct Fill;

impl Kernel for Fill {
    fn op(&self) -> &'static str {
        "Fill"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        if inputs.len() != 2 {
            bail_invalid!("Fill takes 2 inputs (dims, value), got {}", inputs.len());
        }
        let dims = inputs[0].host("Fill", 0)?;
        if dims.shape.len() != 1 {
            bail_invalid!("Fill: dims must be a vector, got shape {:?}", dims.shape);
        }
        if !inputs[1].shape().is_empty() {
            bail_invalid!(
                "Fill: value must be a scalar, got shape {:?}",
                inputs[1].shape()
            );
        }
        let mut shape = vec![];
        for d in dims.to_i64_vec()? {
            if d < 0 {
                bail_invalid!("Fill: dims must be non-negative, got {d}");
            }
            shape.push(d as usize);
        }
        Ok(vec![TensorDesc::new(inputs[1].dtype(), &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let out = &outputs[0];
        let size = out.desc.dtype.size() as u32;
        match inputs[1] {
            Operand::Device(v) => {
                fill_impl(ctx, out.addr, out.desc.byte_size(), 0, 0, size, Some(v))
            }
            Operand::Host(h) => {
                let (lo, hi) = pattern_of(&h.bytes, size);
                fill_impl(ctx, out.addr, out.desc.byte_size(), lo, hi, size, None)
            }
        }
    }
}

/// The 32-bit fill pattern (and the high word for 8-byte types) of one element's bytes.
pub fn pattern_of(bytes: &[u8], size: u32) -> (u32, u32) {
    let mut b = [0u8; 8];
    b[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
    match size {
        1 => (u32::from_le_bytes([b[0]; 4]), 0),
        2 => {
            let h = u16::from_le_bytes([b[0], b[1]]) as u32;
            (h | (h << 16), 0)
        }
        4 => (u32::from_le_bytes([b[0], b[1], b[2], b[3]]), 0),
        _ => (
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        ),
    }
}

/// The bytes of zero or one in `dtype`.
fn const_bytes(dtype: DType, one: bool) -> Vec<u8> {
    if !one {
        return vec![0; dtype.size()];
    }
    match dtype {
        DType::F32 => 1.0f32.to_le_bytes().to_vec(),
        DType::F16 => half::f16::ONE.to_le_bytes().to_vec(),
        DType::I32 => 1i32.to_le_bytes().to_vec(),
        DType::I64 => 1i64.to_le_bytes().to_vec(),
        DType::U32 => 1u32.to_le_bytes().to_vec(),
        DType::U64 => 1u64.to_le_bytes().to_vec(),
        DType::U8 | DType::Bool => vec![1],
    }
}

/// ZerosLike / OnesLike.
struct ConstLike {
    one: bool,
}

impl Kernel for ConstLike {
    fn op(&self) -> &'static str {
        if self.one { "OnesLike" } else { "ZerosLike" }
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        if inputs.len() != 1 {
            bail_invalid!("{} takes 1 input, got {}", self.op(), inputs.len());
        }
        Ok(vec![inputs[0].desc()])
    }

    fn record(
        &self,
        ctx: &KernelContext,
        _inputs: &[Operand],
        outputs: &[DeviceRef],
    ) -> Result<()> {
        let out = &outputs[0];
        let size = out.desc.dtype.size() as u32;
        let (lo, hi) = pattern_of(&const_bytes(out.desc.dtype, self.one), size);
        fill_impl(ctx, out.addr, out.desc.byte_size(), lo, hi, size, None)
    }
}
