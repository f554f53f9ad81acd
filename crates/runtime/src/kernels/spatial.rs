//! Attribute parsing and window arithmetic shared by the 3-D ops (Conv3D and its gradients,
//! the 3-D pooling ops): TensorFlow's 5-D data formats, SAME / VALID padding, 5-value
//! attribute lists and `GetWindowedOutputSizeVerbose`.

use crate::kernel::{AttrValue, Attrs};
use crate::{Result, bail_invalid};

/// Whether a 5-D op's `data_format` is NCDHW (NDHWC when absent).
pub(crate) fn ncdhw(name: &str, attrs: &Attrs) -> Result<bool> {
    match attrs.get("data_format") {
        None => Ok(false),
        Some(AttrValue::Str(s)) if s == "NDHWC" => Ok(false),
        Some(AttrValue::Str(s)) if s == "NCDHW" => Ok(true),
        Some(other) => bail_invalid!("{name}: Invalid data format {other:?}"),
    }
}

/// The (batch, channel) and (depth, rows, columns) positions of a 5-D attribute list.
pub(crate) fn dims_5d(ncdhw: bool) -> ([usize; 2], [usize; 3]) {
    if ncdhw {
        ([0, 1], [2, 3, 4])
    } else {
        ([0, 4], [1, 2, 3])
    }
}

/// Whether `padding` is SAME (true) or VALID (false).
pub(crate) fn same_padding(name: &str, attrs: &Attrs) -> Result<bool> {
    match attrs.get("padding") {
        Some(AttrValue::Str(s)) if s == "SAME" => Ok(true),
        Some(AttrValue::Str(s)) if s == "VALID" => Ok(false),
        None => bail_invalid!("{name}: missing attribute padding"),
        Some(other) => bail_invalid!("{name}: padding must be SAME or VALID, got {other:?}"),
    }
}

/// A list attribute of 5 ints (`default` repeated when absent, if given).
pub(crate) fn five_ints(
    name: &str,
    attrs: &Attrs,
    attr: &str,
    default: Option<i64>,
) -> Result<Vec<i64>> {
    match attrs.get(attr) {
        Some(AttrValue::Ints(v)) if v.len() == 5 => Ok(v.clone()),
        Some(AttrValue::Ints(v)) => bail_invalid!(
            "{name}: Sliding window {attr} field must specify 5 dimensions, got {}",
            v.len()
        ),
        None => match default {
            Some(d) => Ok(vec![d; 5]),
            None => bail_invalid!("{name}: missing attribute {attr}"),
        },
        Some(other) => {
            bail_invalid!("{name}: attribute {attr} must be a list of ints, got {other:?}")
        }
    }
}

/// Output size and padding before along one dimension (TensorFlow's
/// `GetWindowedOutputSizeVerbose`): `eff` the effective window ((k - 1) * dilation + 1).
pub(crate) fn windowed(
    name: &str,
    same: bool,
    input: usize,
    eff: usize,
    stride: usize,
) -> Result<(usize, usize)> {
    let (i, f, s) = (input as i64, eff as i64, stride as i64);
    let (out, before) = if same {
        let out = (i + s - 1) / s;
        (out, ((out - 1) * s + f - i).max(0) / 2)
    } else {
        ((i - f + s) / s, 0)
    };
    if out < 0 {
        bail_invalid!(
            "{name}: Computed output size would be negative: {out} [input_size: {i}, \
             effective_filter_size: {f}, stride: {s}]"
        );
    }
    Ok((out as usize, before as usize))
}
