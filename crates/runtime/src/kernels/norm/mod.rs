//! norm family (work in progress).
use crate::kernel::OpDef;

/// Registration table.
pub const OPS: &[OpDef] = &[];
