//! Select and SelectV2: `condition ? then : else` elementwise, for every dtype (the data moves
//! as raw bits).
//!
//! SelectV2 broadcasts all three inputs. Select (v1) keeps TensorFlow's older rules: `then`
//! and `else` have one shape; `condition` is a scalar (picking a whole input), has that same
//! shape, or is a vector whose length is the first dimension of `then` (picking rows).

use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{DType, Error, Result, bail_invalid};

use super::binary::{Broadcast, MAX_RANK};
use super::{bind_out, fmt_shape};

const SELECT_WGSL: &str = include_str!("select.wgsl");

pub(crate) struct Select {
    name: &'static str,
    /// SelectV2's broadcasting, else Select's rules.
    v2: bool,
}

impl Select {
    pub fn new(name: &'static str, v2: bool) -> Self {
        Select { name, v2 }
    }

    fn check(&self, inputs: &[Operand]) -> Result<(DType, Broadcast)> {
        let name = self.name;
        if inputs.len() != 3 {
            bail_invalid!(
                "{name} takes 3 inputs (condition, then, else), got {}",
                inputs.len()
            );
        }
        if inputs[0].dtype() != DType::Bool {
            bail_invalid!("{name}: condition must be bool, got {}", inputs[0].dtype());
        }
        let (tt, te) = (inputs[1].dtype(), inputs[2].dtype());
        if tt != te {
            bail_invalid!("{name}: then is {tt} but else is {te}; both must have one dtype");
        }
        let (c, t, e) = (inputs[0].shape(), inputs[1].shape(), inputs[2].shape());
        let same = |a: &[usize], b: &[usize], ia: usize, ib: usize| -> Result<()> {
            if a != b {
                bail_invalid!(
                    "Inputs to operation {name} of type {name} must have the same size and \
                     shape.  Input {ia}: {} != input {ib}: {}",
                    fmt_shape(a),
                    fmt_shape(b)
                );
            }
            Ok(())
        };
        let then_else = || -> Result<()> {
            if t != e {
                bail_invalid!(
                    "{name}: 'then' and 'else' must have the same size.  but received: {} vs. {}",
                    fmt_shape(t),
                    fmt_shape(e)
                );
            }
            Ok(())
        };
        let bc = if self.v2 {
            Broadcast::of(&[c, t, e]).ok_or_else(|| {
                crate::invalid_arg!(
                    "{name}: condition {}, then {}, and else {} must be broadcastable",
                    fmt_shape(c),
                    fmt_shape(t),
                    fmt_shape(e)
                )
            })?
        } else if c.is_empty() {
            then_else()?;
            Broadcast::of(&[c, t, e]).expect("a scalar broadcasts")
        } else if c.len() == 1 && t.len() != 1 {
            // A vector condition picks rows of `then` / `else`.
            if t.is_empty() {
                bail_invalid!(
                    "{name}: 'then' must be at least a vector, but saw shape: {}",
                    fmt_shape(t)
                );
            }
            if c[0] != t[0] {
                bail_invalid!(
                    "{name}: Number of batches of 'then' must match size of 'cond', but saw: {} \
                     vs. {}",
                    t[0],
                    c[0]
                );
            }
            then_else()?;
            let mut rows = vec![1; t.len()];
            rows[0] = c[0];
            Broadcast::of(&[&rows, t, e]).expect("rows broadcast")
        } else {
            same(c, t, 0, 1)?;
            same(c, e, 0, 2)?;
            Broadcast::flat(t, 3)
        };
        if bc.dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{name}: broadcasting {}, {} and {} needs {} dimensions after merging; at most \
                 {MAX_RANK} are supported",
                fmt_shape(c),
                fmt_shape(t),
                fmt_shape(e),
                bc.dims.len()
            )));
        }
        let n = bc.num_elements();
        if n.saturating_mul(tt.size()) / 4 > u32::MAX as usize {
            return Err(Error::Unimplemented(format!(
                "{name}: tensors of more than 2^32 words are not supported (got {n} elements)"
            )));
        }
        Ok((tt, bc))
    }
}

const OFFSETS_FLAT: &str = "    return vec3<u32>(e * p.sc[0].x, e * p.st[0].x, e * p.se[0].x);";

const OFFSETS_BCAST: &str = "    var rem = e;
    var o = vec3<u32>(0u, 0u, 0u);
    for (var d = p.rank; d > 0u; d = d - 1u) {
        let k = d - 1u;
        let dim = p.shape[k / 4u][k % 4u];
        let c = rem % dim;
        rem = rem / dim;
        o = o + c * vec3<u32>(p.sc[k / 4u][k % 4u], p.st[k / 4u][k % 4u], p.se[k / 4u][k % 4u]);
    }
    return o;";

fn shader(elem_size: usize, flat: bool) -> String {
    let (ppw, bits, mask) = match elem_size {
        1 => (4, 8, 0xff),
        2 => (2, 16, 0xffff),
        _ => (1, 32, 0xffff_ffffu32),
    };
    SELECT_WGSL
        .replace("$LINEAR_INDEX", LINEAR_INDEX)
        .replace("$OFFSETS", if flat { OFFSETS_FLAT } else { OFFSETS_BCAST })
        .replace("$PPW", &ppw.to_string())
        .replace("$BITS", &bits.to_string())
        .replace("$MASK", &format!("{mask:#x}"))
        .replace("$WIDE", &(elem_size == 8).to_string())
        .replace("$WG", &WG.to_string())
}

impl Kernel for Select {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (dtype, bc) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(dtype, &bc.out_shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let (dtype, bc) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc.dtype != dtype || out.desc.shape != bc.out_shape {
            bail_invalid!(
                "{}: output is {} {} but the op computes {} {}",
                self.name,
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                dtype,
                fmt_shape(&bc.out_shape)
            );
        }
        let n = bc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let c = ctx.bind(inputs[0].device(self.name, 0)?)?;
        let t = ctx.bind(inputs[1].device(self.name, 1)?)?;
        let e = ctx.bind(inputs[2].device(self.name, 2)?)?;
        let o = bind_out(ctx, self.name, out)?;
        let size = dtype.size();
        let flat = bc.dims.len() <= 1;
        let key = PipelineKey::new(
            "elementwise",
            None,
            format!("select/{size}/{}", if flat { "flat" } else { "bcast" }),
        );
        let pipeline = ctx.pipeline(key, || ShaderSource::new(shader(size, flat)))?;
        let words = (n * size).div_ceil(4) as u32;
        let (groups, row) = grid_1d(words as u64, WG);
        let mut w = vec![row, n as u32, bc.dims.len() as u32, words];
        w.extend(bc.param_words());
        ctx.dispatch(&pipeline, &params(&w), &[c, t, e, o], groups)
    }
}
