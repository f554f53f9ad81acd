//! matmul family (in progress).

use crate::kernel::OpDef;

/// Registration table.
pub const OPS: &[OpDef] = &[];
