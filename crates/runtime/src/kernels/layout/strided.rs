//! The strided copy behind every layout op: a source view (dims with signed element strides and
//! an optional wrap, for Tile) read in row-major order of its dims, written to a region of the
//! destination (runs of contiguous elements at a fixed stride). Views are coalesced first
//! (dims of size 1 dropped, adjacent dims merged where the strides allow), so common cases run
//! at rank 1 to 3. The shader takes up to 8 dims; a view with more after coalescing runs as one
//! dispatch per coordinate of its outer dims.
//!
//! Element sizes: 4- and 8-byte elements are copied one invocation per element; 2- and 1-byte
//! elements (f16, bool, uint8) one invocation per destination word (see strided.wgsl).

use std::sync::Arc;

use crate::exec::{BufferRange, Pipeline};
use crate::kernel::{DeviceRef, KernelContext, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::bind_out;
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result};

/// The most dimensions a view may have after coalescing.
pub(crate) const MAX_RANK: usize = 8;

const STRIDED_WGSL: &str = include_str!("strided.wgsl");

/// One dimension of a source view: `size` coordinates, each step moving `stride` elements
/// (negative for a reversed dimension); with `wrap` > 0 the coordinate is taken modulo `wrap`
/// before the stride applies (a tiled dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dim {
    pub size: usize,
    pub stride: i64,
    pub wrap: usize,
}

/// A source view: dims outermost first, and the element offset of coordinate zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub dims: Vec<Dim>,
    pub base: i64,
}

/// Row-major element strides of a shape.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as i64;
    }
    s
}

impl View {
    /// The elements of a tensor of `shape`, in order, starting at element `base`.
    pub fn contiguous(shape: &[usize], base: i64) -> View {
        let strides = strides_of(shape);
        View {
            dims: shape
                .iter()
                .zip(strides)
                .map(|(&size, stride)| Dim {
                    size,
                    stride,
                    wrap: 0,
                })
                .collect(),
            base,
        }
    }

    /// Number of elements the view reads.
    pub fn len(&self) -> usize {
        self.dims.iter().map(|d| d.size).product()
    }

    /// An equivalent view with fewer dims: size-1 dims dropped, wraps that never apply
    /// removed, and neighbours merged when the outer stride is the inner one times the inner
    /// size (and the inner dim does not wrap).
    pub fn coalesce(&self) -> View {
        let mut out: Vec<Dim> = vec![];
        for d in &self.dims {
            if d.size == 1 {
                continue;
            }
            let mut d = *d;
            if d.wrap == 1 {
                // Every coordinate wraps to 0.
                d.stride = 0;
            }
            if d.stride == 0 || d.wrap >= d.size {
                d.wrap = 0;
            }
            if let Some(prev) = out.last_mut()
                && d.wrap == 0
                && prev.stride == d.stride * d.size as i64
            {
                *prev = Dim {
                    size: prev.size * d.size,
                    stride: d.stride,
                    wrap: if prev.wrap == 0 || d.stride == 0 {
                        0
                    } else {
                        prev.wrap * d.size
                    },
                };
                continue;
            }
            out.push(d);
        }
        View {
            dims: out,
            base: self.base,
        }
    }
}

/// Where the copied elements go: `rows` runs of `len` elements, run `r` starting at element
/// `base + r * stride` of the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub base: usize,
    pub rows: usize,
    pub len: usize,
    pub stride: usize,
}

impl Region {
    /// The whole destination of `n` elements.
    pub fn all(n: usize) -> Region {
        Region {
            base: 0,
            rows: 1,
            len: n,
            stride: n,
        }
    }

    fn count(&self) -> usize {
        self.rows * self.len
    }
}

fn pipeline(ctx: &KernelContext, dtype: DType) -> Result<Arc<Pipeline>> {
    let (variant, keep, consts): (&str, &str, &[(&str, &str)]) = match dtype.size() {
        4 => ("words1", "WORDS", &[("WORDS", "1u"), ("DST_ELEM", "u32")]),
        8 => ("words2", "WORDS", &[("WORDS", "2u"), ("DST_ELEM", "u32")]),
        2 => (
            "packed2",
            "PACKED",
            &[("EPW", "2u"), ("DST_ELEM", "atomic<u32>")],
        ),
        _ => (
            "packed4",
            "PACKED",
            &[("EPW", "4u"), ("DST_ELEM", "atomic<u32>")],
        ),
    };
    ctx.pipeline(PipelineKey::new("layout", None, variant), || {
        let mut src = select_block(STRIDED_WGSL, keep)
            .replace("LINEAR_INDEX", LINEAR_INDEX)
            .replace("WG", &WG.to_string());
        for (name, value) in consts {
            src = src.replace(name, value);
        }
        ShaderSource::new(src)
    })
}

/// Keeps the `#ifdef keep` ... `#endif` blocks of `src` (without the markers) and drops the
/// other such blocks.
pub(crate) fn select_block(src: &str, keep: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut state: Option<bool> = None;
    for line in src.lines() {
        if let Some(name) = line.strip_prefix("#ifdef ") {
            state = Some(name.trim() == keep);
            continue;
        }
        if line.starts_with("#endif") {
            state = None;
            continue;
        }
        if state != Some(false) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn fits_u32(op: &str, what: &str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Unimplemented(format!(
            "{op}: {what} {v} is beyond 32-bit indexing (tensor too large)"
        ))
    })
}

/// Records the copy of `view` (of `src`) into `region` of `dst`. `src` and `dst` have the same
/// dtype; the view must read exactly `region`'s element count.
pub(crate) fn copy(
    ctx: &KernelContext,
    op: &str,
    src: &DeviceRef,
    view: &View,
    dst: &DeviceRef,
    region: Region,
) -> Result<()> {
    let n = region.count();
    if view.len() != n {
        return Err(Error::Gpu(format!(
            "{op}: internal error: a view of {} elements copied to a region of {n}",
            view.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let dtype = dst.desc.dtype;
    if src.desc.dtype.size() != dtype.size() {
        return Err(Error::Gpu(format!(
            "{op}: internal error: copy from {} to {dtype}",
            src.desc.dtype
        )));
    }
    // Every element index (and, for 8-byte elements, word index) must fit 32 bits.
    let words_in = (src.desc.byte_size().div_ceil(4)) as i64;
    let words_out = (dst.desc.byte_size().div_ceil(4)) as i64;
    fits_u32(op, "input word count", words_in)?;
    fits_u32(op, "output word count", words_out)?;
    let pipeline = pipeline(ctx, dtype)?;
    let s = ctx.bind(src)?;
    let d = bind_out(ctx, op, dst)?;
    let v = view.coalesce();
    if v.dims.len() <= MAX_RANK {
        return dispatch(ctx, op, &pipeline, dtype, &s, &d, &v, region);
    }
    // More dims than the shader takes: one dispatch per coordinate of the outer dims. Only
    // whole-output copies get here (concatenation reads its inputs as plain vectors).
    if region.rows != 1 {
        return Err(Error::Gpu(format!(
            "{op}: internal error: a strided region with a view of {} dims",
            v.dims.len()
        )));
    }
    let (outer, inner) = v.dims.split_at(v.dims.len() - MAX_RANK);
    let inner_n: usize = inner.iter().map(|d| d.size).product();
    let outer_n: usize = outer.iter().map(|d| d.size).product();
    for t in 0..outer_n {
        let mut rem = t;
        let mut base = v.base;
        for dim in outer.iter().rev() {
            let mut c = rem % dim.size;
            rem /= dim.size;
            if dim.wrap != 0 {
                c %= dim.wrap;
            }
            base += c as i64 * dim.stride;
        }
        let part = View {
            dims: inner.to_vec(),
            base,
        };
        let r = Region {
            base: region.base + t * inner_n,
            rows: 1,
            len: inner_n,
            stride: inner_n,
        };
        dispatch(ctx, op, &pipeline, dtype, &s, &d, &part, r)?;
    }
    Ok(())
}

/// One dispatch of the shader: a coalesced view of at most `MAX_RANK` dims.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    ctx: &KernelContext,
    op: &str,
    pipeline: &Pipeline,
    dtype: DType,
    s: &BufferRange,
    d: &BufferRange,
    v: &View,
    region: Region,
) -> Result<()> {
    let mut dims = [0u32; MAX_RANK];
    let mut strides = [0u32; MAX_RANK];
    let mut wraps = [0u32; MAX_RANK];
    for (i, dim) in v.dims.iter().rev().enumerate() {
        dims[i] = fits_u32(op, "dimension", dim.size as i64)?;
        // Two's complement: the shader's wrapping u32 arithmetic adds negative strides.
        strides[i] = dim.stride as u32;
        wraps[i] = fits_u32(op, "dimension", dim.wrap as i64)?;
    }
    let (count, per_row) = match dtype.size() {
        4 | 8 => (region.count(), 0),
        size => {
            let epw = 4 / size;
            let aligned = region.base.is_multiple_of(epw)
                && (region.rows == 1 || region.stride.is_multiple_of(epw));
            let per_row = region.len.div_ceil(epw) + usize::from(!aligned);
            (region.rows * per_row, per_row)
        }
    };
    let count = fits_u32(op, "element count", count as i64)?;
    let (groups, row) = grid_1d(count as u64, WG);
    let mut words = vec![
        row,
        count,
        v.dims.len() as u32,
        fits_u32(op, "offset", v.base)?,
        fits_u32(op, "offset", region.base as i64)?,
        fits_u32(op, "row count", region.rows as i64)?,
        fits_u32(op, "row length", region.len as i64)?,
        fits_u32(op, "row stride", region.stride as i64)?,
        per_row as u32,
        0,
        0,
        0,
    ];
    words.extend_from_slice(&dims);
    words.extend_from_slice(&strides);
    words.extend_from_slice(&wraps);
    ctx.dispatch(pipeline, &params(&words), &[s.clone(), d.clone()], groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source offsets a view reads, in order (the shader's arithmetic, on the CPU).
    fn offsets(v: &View) -> Vec<i64> {
        let n = v.len();
        (0..n)
            .map(|q| {
                let mut rem = q;
                let mut off = v.base;
                for d in v.dims.iter().rev() {
                    let mut c = rem % d.size;
                    rem /= d.size;
                    if d.wrap != 0 {
                        c %= d.wrap;
                    }
                    off += c as i64 * d.stride;
                }
                off
            })
            .collect()
    }

    #[test]
    fn coalescing_keeps_offsets() {
        let views = [
            View::contiguous(&[2, 3, 4], 5),
            View {
                // Tile of [3, 4] by [2, 1] then [1, 3].
                dims: vec![
                    Dim {
                        size: 6,
                        stride: 4,
                        wrap: 3,
                    },
                    Dim {
                        size: 4,
                        stride: 1,
                        wrap: 0,
                    },
                ],
                base: 0,
            },
            View {
                dims: vec![
                    Dim {
                        size: 2,
                        stride: 12,
                        wrap: 0,
                    },
                    Dim {
                        size: 3,
                        stride: 4,
                        wrap: 0,
                    },
                    Dim {
                        size: 12,
                        stride: 1,
                        wrap: 4,
                    },
                ],
                base: 0,
            },
            // Reverse of every dim of [3, 5].
            View {
                dims: vec![
                    Dim {
                        size: 3,
                        stride: -5,
                        wrap: 0,
                    },
                    Dim {
                        size: 5,
                        stride: -1,
                        wrap: 0,
                    },
                ],
                base: 14,
            },
            // Broadcast [1, 3] -> [4, 1, 3] with stride-0 dims and a size-1 dim.
            View {
                dims: vec![
                    Dim {
                        size: 4,
                        stride: 0,
                        wrap: 0,
                    },
                    Dim {
                        size: 2,
                        stride: 0,
                        wrap: 0,
                    },
                    Dim {
                        size: 1,
                        stride: 7,
                        wrap: 0,
                    },
                    Dim {
                        size: 3,
                        stride: 1,
                        wrap: 0,
                    },
                ],
                base: 0,
            },
        ];
        let ranks = [1, 1, 2, 1, 2];
        for (v, want_rank) in views.iter().zip(ranks) {
            let c = v.coalesce();
            assert_eq!(offsets(&c), offsets(v), "{v:?} -> {c:?}");
            assert_eq!(c.dims.len(), want_rank, "{v:?} -> {c:?}");
        }
    }

    #[test]
    fn blocks_are_selected() {
        let s = "a\n#ifdef X\nx\n#endif\n#ifdef Y\ny\n#endif\nb\n";
        assert_eq!(select_block(s, "X"), "a\nx\nb\n");
        assert_eq!(select_block(s, "Y"), "a\ny\nb\n");
    }
}
