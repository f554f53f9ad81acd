//! nn family: BiasAdd / BiasAddV1 / BiasAddGrad, Softmax / LogSoftmax, the softmax
//! cross-entropies (SparseSoftmaxCrossEntropyWithLogits, SoftmaxCrossEntropyWithLogits) and
//! L2Loss, the metrics' Cumsum and InTopKV2 (`metric`), and the recurrent layers' CudnnRNNV3 /
//! CudnnRNNBackpropV3 (`rnn`). See each module for the numerics. float16 Softmax, LogSoftmax, the
//! cross-entropies run their float32 kernel on converted inputs and round the
//! outputs once (`f16`), as TensorFlow's GPU kernels compute half in float; float16 BiasAddGrad
//! is the reduce family's float16 Sum (halves widened where they are loaded, summed in float32,
//! rounded once: the same numerics without a float32 copy of its input).

mod bias;
pub(crate) mod f16;
mod l2loss;
mod metric;
mod rnn;
mod softmax;

use crate::DType;
use crate::kernel::OpDef;
use softmax::{Mode, SoftmaxKernel};

/// float32, and float16 computed in float32 (`f16`).
const FLOAT: &[DType] = &[DType::F32, DType::F16];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "CudnnRNNV3",
        type_attr: "T",
        dtypes: rnn::DTYPES,
        host_inputs: &[],
        factory: rnn::build_forward,
    },
    OpDef {
        op: "CudnnRNNBackpropV3",
        type_attr: "T",
        dtypes: rnn::DTYPES,
        host_inputs: &[],
        factory: rnn::build_backward,
    },
    OpDef {
        op: "Cumsum",
        type_attr: "T",
        dtypes: &[DType::F32],
        host_inputs: &[(1, "axis")],
        factory: metric::Cumsum::build,
    },
    OpDef {
        op: "InTopKV2",
        type_attr: "T",
        dtypes: &[DType::I32, DType::I64],
        host_inputs: &[(2, "k")],
        factory: |_| Ok(Box::new(metric::InTopK)),
    },
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
        dtypes: &[DType::F32, DType::F16, DType::I32],
        host_inputs: &[],
        factory: bias::BiasAddGrad::build,
    },
    OpDef {
        op: "Softmax",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |a| f16::build(|a| SoftmaxKernel::build(Mode::Softmax, a), a, &["T"]),
    },
    OpDef {
        op: "LogSoftmax",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |a| f16::build(|a| SoftmaxKernel::build(Mode::LogSoftmax, a), a, &["T"]),
    },
    OpDef {
        op: "SparseSoftmaxCrossEntropyWithLogits",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |a| f16::build(|a| SoftmaxKernel::build(Mode::SparseXent, a), a, &["T"]),
    },
    OpDef {
        op: "SoftmaxCrossEntropyWithLogits",
        type_attr: "T",
        dtypes: FLOAT,
        host_inputs: &[],
        factory: |a| f16::build(|a| SoftmaxKernel::build(Mode::Xent, a), a, &["T"]),
    },
    OpDef {
        op: "L2Loss",
        type_attr: "T",
        dtypes: l2loss::DTYPES,
        host_inputs: &[],
        factory: |_| Ok(Box::new(l2loss::L2Loss)),
    },
];
