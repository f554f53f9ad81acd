//! nn family: BiasAdd / BiasAddV1 / BiasAddGrad, Softmax / LogSoftmax, the softmax
//! cross-entropies (SparseSoftmaxCrossEntropyWithLogits, SoftmaxCrossEntropyWithLogits) and
//! L2Loss. See each module for the numerics.

mod bias;
mod l2loss;
mod softmax;

use crate::kernel::OpDef;
use softmax::{Mode, SoftmaxKernel};

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "BiasAdd",
        type_attr: "T",
        dtypes: bias::BIAS_ADD_DTYPES,
        host_inputs: &[],
        factory: |a| bias::BiasAdd::build("BiasAdd", a),
    },
    OpDef {
        op: "BiasAddV1",
        type_attr: "T",
        dtypes: bias::BIAS_ADD_DTYPES,
        host_inputs: &[],
        factory: |a| bias::BiasAdd::build("BiasAddV1", a),
    },
    OpDef {
        op: "BiasAddGrad",
        type_attr: "T",
        dtypes: bias::BIAS_GRAD_DTYPES,
        host_inputs: &[],
        factory: bias::BiasAddGrad::build,
    },
    OpDef {
        op: "Softmax",
        type_attr: "T",
        dtypes: softmax::DTYPES,
        host_inputs: &[],
        factory: |a| SoftmaxKernel::build(Mode::Softmax, a),
    },
    OpDef {
        op: "LogSoftmax",
        type_attr: "T",
        dtypes: softmax::DTYPES,
        host_inputs: &[],
        factory: |a| SoftmaxKernel::build(Mode::LogSoftmax, a),
    },
    OpDef {
        op: "SparseSoftmaxCrossEntropyWithLogits",
        type_attr: "T",
        dtypes: softmax::DTYPES,
        host_inputs: &[],
        factory: |a| SoftmaxKernel::build(Mode::SparseXent, a),
    },
    OpDef {
        op: "SoftmaxCrossEntropyWithLogits",
        type_attr: "T",
        dtypes: softmax::DTYPES,
        host_inputs: &[],
        factory: |a| SoftmaxKernel::build(Mode::Xent, a),
    },
    OpDef {
        op: "L2Loss",
        type_attr: "T",
        dtypes: l2loss::DTYPES,
        host_inputs: &[],
        factory: |_| Ok(Box::new(l2loss::L2Loss)),
    },
];
