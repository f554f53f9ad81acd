//! Copies between ranges of device memory. wgpu cannot copy a buffer onto itself, and tensors
//! share heap buffers, so a copy inside one heap runs as a compute shader over 32-bit words.

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
        return ctx
            .dev
            .exec
            .copy(&src.buffer, src.offset, &dst.buffer, dst.offset, size);
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
