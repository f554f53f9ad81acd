//! The strided-slice specification, computed on the host with TensorFlow's rules
//! (`ValidateStridedSliceOp`): the sparse spec (begin/end/strides with the ellipsis, new_axis
//! and shrink_axis masks) is expanded to one entry per input dimension, begin and end are
//! canonicalized (negative indices count from the end, masks select the whole range, values
//! are clamped), and the processing shape (one size per input dimension) and final shape
//! (new axes inserted, shrunk axes removed) are derived.

use crate::{Result, bail_invalid};

/// The five mask attributes of StridedSlice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Masks {
    pub begin: i64,
    pub end: i64,
    pub ellipsis: i64,
    pub new_axis: i64,
    pub shrink_axis: i64,
}

/// A canonical strided slice: per input dimension the first index, the step and the number
/// of elements taken; and the output's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedSpec {
    pub begin: Vec<i64>,
    pub stride: Vec<i64>,
    /// One size per input dimension.
    pub processing: Vec<usize>,
    /// The output shape.
    pub final_shape: Vec<usize>,
}

enum Out {
    Dim(usize),
    NewAxis,
    Shrink,
}

fn bit(mask: i64, i: usize) -> bool {
    i < 64 && (mask as u64 >> i) & 1 == 1
}

/// Computes the slice of `shape` that StridedSlice takes.
pub fn strided_slice_spec(
    shape: &[usize],
    begin: &[i64],
    end: &[i64],
    strides: &[i64],
    m: Masks,
) -> Result<StridedSpec> {
    if begin.len() != end.len() || begin.len() != strides.len() {
        bail_invalid!(
            "Expected begin, end, and strides to be 1D equal size tensors, but got lengths {}, {} and {}",
            begin.len(),
            end.len(),
            strides.len()
        );
    }
    if begin.len() > 32 {
        bail_invalid!(
            "StridedSlice: at most 32 slice dimensions, got {}",
            begin.len()
        );
    }
    let ell = m.ellipsis as u32 as u64;
    if ell & ell.wrapping_sub(1) != 0 {
        bail_invalid!("Multiple ellipses in slice spec not allowed");
    }
    // The sparse spec: an ellipsis is implied at the end when none is given.
    let mut sparse_dims = begin.len();
    let mut ellipsis_at = (0..sparse_dims).find(|&i| bit(m.ellipsis, i));
    let mut new_after_ellipsis = 0i64;
    if let Some(e) = ellipsis_at {
        new_after_ellipsis = (e + 1..sparse_dims).filter(|&i| bit(m.new_axis, i)).count() as i64;
    } else {
        ellipsis_at = Some(sparse_dims);
        sparse_dims += 1;
    }
    let ellipsis_at = ellipsis_at.unwrap_or(sparse_dims);

    // The dense spec: one entry per input dimension.
    let rank = shape.len();
    let mut d_begin = vec![0i64; rank];
    let mut d_end = vec![0i64; rank];
    let mut d_stride = vec![1i64; rank];
    let mut d_bmask = vec![false; rank];
    let mut d_emask = vec![false; rank];
    let mut d_shrink = vec![false; rank];
    let mut outs = vec![];
    let mut full = 0usize;
    for i in 0..sparse_dims {
        if i == ellipsis_at {
            let next = (rank as i64 - (sparse_dims - i) as i64 + 1 + new_after_ellipsis)
                .clamp(0, rank as i64) as usize;
            while full < next {
                d_bmask[full] = true;
                d_emask[full] = true;
                outs.push(Out::Dim(full));
                full += 1;
            }
        } else if bit(m.new_axis, i) {
            outs.push(Out::NewAxis);
        } else {
            if full == rank {
                bail_invalid!(
                    "Index out of range using input dim {full}; input has only {rank} dims"
                );
            }
            d_begin[full] = begin[i];
            d_end[full] = end[i];
            d_stride[full] = strides[i];
            d_bmask[full] = bit(m.begin, i);
            d_emask[full] = bit(m.end, i);
            if bit(m.shrink_axis, i) {
                d_shrink[full] = true;
                outs.push(Out::Shrink);
            } else {
                outs.push(Out::Dim(full));
            }
            full += 1;
        }
    }

    // Canonicalize each dimension.
    let mut spec = StridedSpec {
        begin: vec![0; rank],
        stride: vec![1; rank],
        processing: vec![0; rank],
        final_shape: vec![],
    };
    for i in 0..rank {
        let stride = d_stride[i];
        if stride == 0 {
            bail_invalid!("strides[{i}] must be non-zero");
        }
        if d_shrink[i] && stride < 0 {
            bail_invalid!("only stride 1 allowed on non-range indexing.");
        }
        let dim = shape[i] as i64;
        let (lo, hi) = if stride > 0 { (0, dim) } else { (-1, dim - 1) };
        let canonical = |x: i64, is_end: bool| -> i64 {
            let masked = if is_end { d_emask[i] } else { d_bmask[i] };
            if masked {
                // Forward: begin at lo, end at hi; backward: begin at hi, end at lo.
                if (stride > 0) != is_end { lo } else { hi }
            } else {
                let fwd = if x < 0 { dim.saturating_add(x) } else { x };
                fwd.clamp(lo, hi)
            }
        };
        let (b, e) = if d_shrink[i] {
            let fwd = if d_begin[i] < 0 {
                dim.saturating_add(d_begin[i])
            } else {
                d_begin[i]
            };
            if fwd < 0 || fwd >= dim {
                bail_invalid!("slice index {} of dimension {i} out of bounds.", d_begin[i]);
            }
            (fwd, fwd + 1)
        } else {
            (canonical(d_begin[i], false), canonical(d_end[i], true))
        };
        let interval = e - b;
        let size = if interval == 0 || ((interval < 0) != (stride < 0)) {
            0
        } else {
            interval / stride + i64::from(interval % stride != 0)
        };
        spec.begin[i] = b;
        spec.stride[i] = stride;
        spec.processing[i] = size as usize;
    }
    for o in outs {
        match o {
            Out::Dim(d) => spec.final_shape.push(spec.processing[d]),
            Out::NewAxis => spec.final_shape.push(1),
            Out::Shrink => {}
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shape: &[usize], b: &[i64], e: &[i64], s: &[i64], m: Masks) -> StridedSpec {
        strided_slice_spec(shape, b, e, s, m).unwrap()
    }

    #[test]
    fn python_style_slices() {
        // x[1:-1:2, ..., None] on [5, 3, 4]
        let m = Masks {
            ellipsis: 2,
            new_axis: 4,
            ..Default::default()
        };
        let s = spec(&[5, 3, 4], &[1, 0, 0], &[-1, 0, 0], &[2, 1, 1], m);
        assert_eq!(s.final_shape, vec![2, 3, 4, 1]);
        assert_eq!(s.begin, vec![1, 0, 0]);
        // x[::-1] on [7]
        let m = Masks {
            begin: 1,
            end: 1,
            ..Default::default()
        };
        let s = spec(&[7], &[0], &[0], &[-1], m);
        assert_eq!((s.begin[0], s.processing[0]), (6, 7));
        // x[-1] (shrink)
        let m = Masks {
            shrink_axis: 1,
            ..Default::default()
        };
        let s = spec(&[7, 2], &[-1], &[0], &[1], m);
        assert_eq!(s.final_shape, vec![2]);
        assert_eq!(s.begin, vec![6, 0]);
        // out-of-range ends clamp
        let s = spec(&[4], &[-10], &[10], &[3], Masks::default());
        assert_eq!((s.begin[0], s.processing[0]), (0, 2));
        let s = spec(&[4], &[10], &[-10], &[-3], Masks::default());
        assert_eq!((s.begin[0], s.processing[0]), (3, 2));
    }

    #[test]
    fn errors() {
        let m = Masks {
            ellipsis: 3,
            ..Default::default()
        };
        assert!(strided_slice_spec(&[2], &[0, 0], &[1, 1], &[1, 1], m).is_err());
        assert!(strided_slice_spec(&[2], &[0, 0], &[1, 1], &[1, 1], Masks::default()).is_err());
        assert!(strided_slice_spec(&[2], &[0], &[1], &[0], Masks::default()).is_err());
        let m = Masks {
            shrink_axis: 1,
            ..Default::default()
        };
        assert!(strided_slice_spec(&[2], &[2], &[3], &[1], m).is_err());
        assert!(strided_slice_spec(&[2], &[1], &[0], &[-1], m).is_err());
    }
}
