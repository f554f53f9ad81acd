//! A product and the BiasAdd after it in one kernel call: `_TfwgpuConv2DBiasAdd` (Conv2D's
//! inputs and attributes, then the bias) and `_TfwgpuMatMulBiasAdd` (MatMul's, then the bias),
//! which the plugin's graph pass makes of a Conv2D or MatMul whose only consumer is a BiasAdd
//! that no elementwise group took (crates/plugin/src/graph/fusion.rs, `bias_epilogues`).
//!
//! The kernel records the product's own kernel into the output, then adds the bias over the
//! last dimension in place (the fused family's `BiasAdd(i0,i1)` program, which reads each
//! element before writing it at the same index): the same two dispatches and the same bits as
//! the two nodes, one compute call of TensorFlow's executor fewer. (A step of a small model is
//! bound by the host's work per kernel call, not by the GPU.)

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc};
use crate::{AttrValue, Attrs, DType, Result, bail_invalid};

use super::Fused;

/// Conv2D (input, filter), then BiasAdd of the bias (input 2).
pub const OP_CONV: &str = "_TfwgpuConv2DBiasAdd";
/// MatMul (a, b), then BiasAdd of the bias (input 2).
pub const OP_MATMUL: &str = "_TfwgpuMatMulBiasAdd";

const DTYPES: &[DType] = &[DType::F32, DType::F16];

pub const OPS: &[OpDef] = &[
    OpDef {
        op: OP_CONV,
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: |a| ProductBias::build(OP_CONV, "Conv2D", crate::kernels::conv::OPS, a),
    },
    OpDef {
        op: OP_MATMUL,
        type_attr: "T",
        dtypes: DTYPES,
        host_inputs: &[],
        factory: |a| ProductBias::build(OP_MATMUL, "MatMul", crate::kernels::matmul::OPS, a),
    },
];

/// The product's kernel and the in-place bias addition.
pub struct ProductBias {
    op: &'static str,
    product: Box<dyn Kernel>,
    bias: Box<dyn Kernel>,
    dtype: DType,
}

impl ProductBias {
    fn build(
        op: &'static str,
        product_op: &str,
        table: &[OpDef],
        attrs: &Attrs,
    ) -> Result<Box<dyn Kernel>> {
        let dtype = attrs.dtype("T")?;
        if !DTYPES.contains(&dtype) {
            return Err(crate::Error::Unimplemented(format!(
                "{op} has no tfwgpu kernel for T={dtype}"
            )));
        }
        if let Some(AttrValue::Str(f)) = attrs.get("data_format")
            && f != "NHWC"
        {
            bail_invalid!("{op}: data_format {f}: only NHWC adds the bias over the last axis");
        }
        let def = table
            .iter()
            .find(|d| d.op == product_op)
            .expect("the product's registration");
        let product = (def.factory)(attrs)?;
        let bias = Fused::build(
            &Attrs::new()
                .with("T", AttrValue::Type(dtype))
                .with("N", AttrValue::Int(2))
                .with("program", AttrValue::Str("BiasAdd(i0,i1)".into())),
        )?;
        Ok(Box::new(ProductBias {
            op,
            product,
            bias,
            dtype,
        }))
    }

    /// The product's output, after checking the bias against it.
    fn check(&self, inputs: &[Operand]) -> Result<TensorDesc> {
        if inputs.len() != 3 {
            bail_invalid!("{} takes 3 inputs, got {}", self.op, inputs.len());
        }
        let out = self.product.outputs(&inputs[..2])?;
        let [out] = out.as_slice() else {
            bail_invalid!("{}: the product has {} outputs", self.op, out.len());
        };
        let b = &inputs[2];
        if b.dtype() != self.dtype {
            bail_invalid!("{}: bias is {} but T is {}", self.op, b.dtype(), self.dtype);
        }
        let last = out.shape.last().copied();
        if b.shape().len() != 1 || Some(b.shape()[0]) != last {
            bail_invalid!(
                "{}: BiasAdd: Must provide as many biases as the last dimension of the input \
                 tensor: {:?} vs. {:?}",
                self.op,
                b.shape(),
                out.shape
            );
        }
        Ok(out.clone())
    }
}

impl Kernel for ProductBias {
    fn op(&self) -> &'static str {
        self.op
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        Ok(vec![self.check(inputs)?])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let desc = self.check(inputs)?;
        let [out] = outputs else {
            bail_invalid!("{}: {} outputs given, 1 expected", self.op, outputs.len());
        };
        if out.desc != desc {
            bail_invalid!(
                "{}: the output is {:?}, the product {:?}",
                self.op,
                out.desc,
                desc
            );
        }
        self.product.record(ctx, &inputs[..2], outputs)?;
        // In place: each element read, then written at the same index by the same invocation.
        self.bias
            .record(ctx, &[Operand::Device(out), inputs[2]], outputs)
    }
}
