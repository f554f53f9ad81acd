//! The kernel library, one module per op family. Each family has one registration table
//! (`OPS`); adding an op is a table row plus a kernel, and a test.

pub mod argminmax;
pub mod cast;
pub mod conv;
pub mod copy;
pub mod elementwise;
pub mod fill;
pub mod layout;
pub mod matmul;
pub mod nn;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod slice;
pub mod wgsl;

use crate::kernel::OpDef;

/// Collects every family's registration table.
pub fn register_all(defs: &mut Vec<OpDef>) {
    defs.extend_from_slice(fill::OPS);
    defs.extend_from_slice(elementwise::OPS);
    defs.extend_from_slice(cast::OPS);
    defs.extend_from_slice(reduce::OPS);
    defs.extend_from_slice(matmul::OPS);
    defs.extend_from_slice(nn::OPS);
    defs.extend_from_slice(argminmax::OPS);
    defs.extend_from_slice(layout::OPS);
    defs.extend_from_slice(slice::OPS);
    defs.extend_from_slice(pool::OPS);
    defs.extend_from_slice(norm::OPS);
    defs.extend_from_slice(random::OPS);
    defs.extend_from_slice(conv::OPS);
}
