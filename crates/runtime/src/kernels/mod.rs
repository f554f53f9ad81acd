//! The kernel library, one module per op family. Each family has one registration table
//! (`OPS`); adding an op is a table row plus a kernel, and a test.

pub mod argminmax;
pub mod cast;
pub mod conv;
pub mod copy;
pub mod elementwise;
pub mod f16conv;
pub mod fill;
pub mod fused;
pub mod layout;
pub mod matmul;
pub mod nn;
pub mod nonzero;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod slice;
pub(crate) mod spatial;
pub mod wgsl;

use crate::DType;
use crate::kernel::{OpDef, TypeConstraint};

const I32_I64: &[DType] = &[DType::I32, DType::I64];

/// The second type attributes the kernels constrain (see `TypeConstraint`).
pub const TYPE_CONSTRAINTS: &[TypeConstraint] = &[
    TypeConstraint {
        op: "Cast",
        attr: "DstT",
        dtypes: &DType::ALL,
    },
    TypeConstraint {
        op: "GatherV2",
        attr: "Tindices",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "ScatterNd",
        attr: "Tindices",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "Conv3DBackpropInputV2",
        attr: "Tshape",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "MaxPool3DGrad",
        attr: "TInput",
        dtypes: &[DType::F32, DType::F16],
    },
    TypeConstraint {
        op: "ReverseSequence",
        attr: "Tlen",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "UnsortedSegmentSum",
        attr: "Tindices",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "OneHot",
        attr: "TI",
        dtypes: &[DType::U8, DType::I32, DType::I64],
    },
    TypeConstraint {
        op: "Bitcast",
        attr: "type",
        dtypes: random::bitwise::BITCAST_TYPES,
    },
    TypeConstraint {
        op: "ArgMax",
        attr: "output_type",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "ArgMin",
        attr: "output_type",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "SparseSoftmaxCrossEntropyWithLogits",
        attr: "Tlabels",
        dtypes: I32_I64,
    },
    TypeConstraint {
        op: "FusedBatchNormV2",
        attr: "U",
        dtypes: &[DType::F32],
    },
    TypeConstraint {
        op: "FusedBatchNormV3",
        attr: "U",
        dtypes: &[DType::F32],
    },
    TypeConstraint {
        op: "FusedBatchNormGradV2",
        attr: "U",
        dtypes: &[DType::F32],
    },
    TypeConstraint {
        op: "FusedBatchNormGradV3",
        attr: "U",
        dtypes: &[DType::F32],
    },
];

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
    defs.extend_from_slice(resize::OPS);
    defs.extend_from_slice(pool::OPS);
    defs.extend_from_slice(norm::OPS);
    defs.extend_from_slice(random::OPS);
    defs.extend_from_slice(random::OPS_UINT64);
    defs.extend_from_slice(conv::OPS);
    defs.extend_from_slice(nonzero::OPS);
    defs.extend_from_slice(fused::OPS);
    defs.extend_from_slice(fused::bias::OPS);
}

/// The shader module of a memory-bound kernel (elementwise, reductions, softmax, batch norm,
/// pooling). Checked by default; `TFWGPU_MEMBOUND_CHECKS=trusted` compiles them without naga's
/// runtime checks (index clamps on private and workgroup arrays, loop bounding) to measure
/// what those checks cost. Buffer accesses stay bounds-checked either way on Vulkan devices
/// with robustBufferAccess2 (wgpu leaves those to the driver), and every index of these
/// kernels is guarded by the sizes in their params.
pub(crate) fn membound_shader(wgsl: String) -> crate::kernel_manager::ShaderSource {
    use std::sync::OnceLock;
    static TRUSTED: OnceLock<bool> = OnceLock::new();
    let mut s = crate::kernel_manager::ShaderSource::new(wgsl);
    if *TRUSTED.get_or_init(|| {
        std::env::var("TFWGPU_MEMBOUND_CHECKS").is_ok_and(|v| v.eq_ignore_ascii_case("trusted"))
    }) {
        s.checks = crate::kernel_manager::Checks::Trusted;
    }
    s
}
