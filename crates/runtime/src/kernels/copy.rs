//! Copies between ranges of device memory, as compute shaders: wgpu cannot copy a buffer onto
//! itself (tensors share heap buffers), and between two buffers NVIDIA's Vulkan driver ran
//! vkCmdCopyBuffer (wgpu's copy_buffer_to_buffer) at 0.84 TB/s on an H200 where a shader copy
//! reached 1.9-2.1 TB/s (bench/NOTES-membound.md); a dispatch also keeps the compute pass
//! open. Ranges whose offsets and size are multiples of 16 bytes move vec4 words, two per
//! invocation (both loads before the stores); others one 32-bit word per invocation.

use crate::exec::BufferRange;
use crate::kernel::{KernelContext, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Error, Result};

const COPY_WGSL: &str = r#"
struct Params { row: u32, words: u32, src: u32, dst: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> buf: array<u32>;
LINEAR_INDEX
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.words { return; }
    buf[p.dst + i] = buf[p.src + i];
}
"#;

/// Between two buffers: `src` and `dst` bindings (aligned down to the offset alignment), word
/// offsets p.src / p.dst into them; ELEM u32 or vec4<u32>; p.words counts ELEM.
const COPY2_WGSL: &str = r#"
struct Params { row: u32, words: u32, src: u32, dst: u32, stride: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> dst: array<ELEM>;
LINEAR_INDEX
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = linear_index(gid);
    if i >= p.stride { return; }
    let j = i + p.stride;
    let a = src[p.src + i];
    var b: ELEM;
    if j < p.words {
        b = src[p.src + j];
    }
    dst[p.dst + i] = a;
    if j < p.words {
        dst[p.dst + j] = b;
    }
}
"#;

/// Records a copy of `size` bytes (a multiple of 4; offsets multiples of 4) from `src` to
/// `dst`. The ranges must not overlap.
pub fn copy_range(
    ctx: &KernelContext,
    src: &BufferRange,
    dst: &BufferRange,
    size: u64,
) -> Result<()> {
    if size == 0 {
        return Ok(());
    }
    if src.buffer != dst.buffer {
        return copy_between(ctx, src, dst, size);
    }
    if src.offset < dst.offset + size && dst.offset < src.offset + size {
        return Err(Error::InvalidArgument(format!(
            "overlapping device copy: {size} bytes from offset {} to {}",
            src.offset, dst.offset
        )));
    }
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    let base = src.offset.min(dst.offset) / align * align;
    let end = (src.offset + size).max(dst.offset + size);
    let words = size / 4;
    let (s, d) = ((src.offset - base) / 4, (dst.offset - base) / 4);
    if end - base > u32::MAX as u64 * 4 {
        return Err(Error::OutOfMemory(
            "device copy spans more than 16 GiB".into(),
        ));
    }
    let pipeline = ctx.pipeline(PipelineKey::new("copy", None, "words"), || {
        ShaderSource::new(
            COPY_WGSL
                .replace("LINEAR_INDEX", LINEAR_INDEX)
                .replace("WG", &WG.to_string()),
        )
    })?;
    let (groups, row) = grid_1d(words, WG);
    let binding = BufferRange {
        buffer: src.buffer.clone(),
        offset: base,
        size: end - base,
    };
    ctx.dispatch(
        &pipeline,
        &params(&[row, words as u32, s as u32, d as u32]),
        &[binding],
        groups,
    )
}

/// A copy between two buffers through `COPY2_WGSL`.
fn copy_between(
    ctx: &KernelContext,
    src: &BufferRange,
    dst: &BufferRange,
    size: u64,
) -> Result<()> {
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    let (sb, db) = (src.offset / align * align, dst.offset / align * align);
    let (so, dof) = (src.offset - sb, dst.offset - db);
    let vec4 = so.is_multiple_of(16) && dof.is_multiple_of(16) && size.is_multiple_of(16);
    let unit = if vec4 { 16 } else { 4 };
    let words = size / unit;
    if (so + size) / 4 > u32::MAX as u64 || (dof + size) / 4 > u32::MAX as u64 {
        return Err(Error::OutOfMemory(
            "device copy spans more than 16 GiB".into(),
        ));
    }
    let pipeline = ctx.pipeline(
        PipelineKey::new("copy", None, if vec4 { "between/vec4" } else { "between" }),
        || {
            ShaderSource::new(
                COPY2_WGSL
                    .replace("ELEM", if vec4 { "vec4<u32>" } else { "u32" })
                    .replace("LINEAR_INDEX", LINEAR_INDEX)
                    .replace("WG", &WG.to_string()),
            )
        },
    )?;
    let threads = words.div_ceil(2);
    let (groups, row) = grid_1d(threads, WG);
    let bind = |r: &BufferRange, base: u64, off: u64| BufferRange {
        buffer: r.buffer.clone(),
        offset: base,
        size: off + size,
    };
    ctx.dispatch(
        &pipeline,
        &params(&[
            row,
            words as u32,
            (so / unit) as u32,
            (dof / unit) as u32,
            threads as u32,
            0,
            0,
            0,
        ]),
        &[bind(src, sb, so), bind(dst, db, dof)],
        groups,
    )
}
