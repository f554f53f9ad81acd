//! ReverseSequence(input, seq_lengths; seq_dim, batch_dim): for each entry b of the batch axis,
//! the first seq_lengths[b] steps of the sequence axis reversed (`tf.reverse_sequence`; Keras's
//! recurrent layers with `go_backwards`, Bidirectional), with TensorFlow's shape checks.

use super::{bind_out, dispatch_words, index_fn, load_fn, u32_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::{Attrs, Result, bail_invalid};

const REVSEQ_WGSL: &str = include_str!("revseq.wgsl");

pub(super) struct ReverseSequence {
    seq_dim: i64,
    batch_dim: i64,
}

impl ReverseSequence {
    pub(super) fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(ReverseSequence {
            seq_dim: attrs.int_or("seq_dim", 0)?,
            batch_dim: attrs.int_or("batch_dim", 0)?,
        }))
    }

    /// (seq axis, batch axis), checked against the input as TensorFlow checks them.
    fn axes(&self, inputs: &[Operand]) -> Result<(usize, usize)> {
        if inputs.len() != 2 {
            bail_invalid!("ReverseSequence takes 2 inputs, got {}", inputs.len());
        }
        let shape = inputs[0].shape();
        let lens = inputs[1].shape();
        let rank = shape.len() as i64;
        // TensorFlow's checks and messages, in its order (reverse_sequence_op.cc).
        let (sd, bd) = (self.seq_dim, self.batch_dim);
        if lens.len() != 1 {
            bail_invalid!("seq_lengths must be 1-dim, not {}", lens.len());
        }
        if sd == bd {
            bail_invalid!("batch_dim == seq_dim == {sd}");
        }
        if sd < 0 || sd >= rank {
            bail_invalid!("seq_dim must be < input rank ( {sd} vs. {rank})");
        }
        if bd < 0 || bd >= rank {
            bail_invalid!("batch_dim must be < input rank ( {bd} vs. {rank})");
        }
        if lens[0] != shape[bd as usize] {
            bail_invalid!(
                "Length of seq_lengths != input.dims({bd}), ({} vs. {})",
                lens[0],
                shape[bd as usize]
            );
        }
        Ok((sd as usize, bd as usize))
    }
}

impl Kernel for ReverseSequence {
    fn op(&self) -> &'static str {
        "ReverseSequence"
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        self.axes(inputs)?;
        Ok(vec![inputs[0].desc()])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = "ReverseSequence";
        let (sd, bd) = self.axes(inputs)?;
        let out = &outputs[0];
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let shape = &out.desc.shape;
        let stride = |axis: usize| shape[axis + 1..].iter().product::<usize>();
        let x = inputs[0].device(op, 0)?;
        let lens = inputs[1].device(op, 1)?;
        let mut params = vec![
            0,
            0,
            0,
            u32_of(op, "sequence axis", shape[sd])?,
            u32_of(op, "sequence stride", stride(sd))?,
            u32_of(op, "batch axis", shape[bd])?,
            u32_of(op, "batch stride", stride(bd))?,
            0,
        ];
        let bindings = [bind_out(ctx, op, out)?, ctx.bind(x)?, ctx.bind(lens)?];
        let ldt = lens.desc.dtype;
        let esize = out.desc.dtype.size();
        let key = match ldt {
            crate::DType::I64 => "revseq64",
            _ => "revseq32",
        };
        dispatch_words(
            ctx,
            key,
            || {
                format!(
                    "{REVSEQ_WGSL}\n{}\n{}",
                    load_fn("inp", esize),
                    index_fn("lens", ldt).expect("int32 or int64 lengths")
                )
            },
            &mut params,
            &bindings,
            n,
            out.desc.dtype,
        )
    }
}
