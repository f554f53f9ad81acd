//! SpaceToBatchND and BatchToSpaceND (TensorFlow's atrous convolutions and dilated pooling
//! move blocks of space into the batch and back): one index map (`SPACE_WGSL`) between the
//! space side [batch, space..., depth] and the batch side [blocks * batch, space / block...,
//! depth], with TensorFlow's checks and messages. As TensorFlow does, leading and trailing
//! block dimensions of size 1 without padding join the batch and the depth, so at most four
//! block dimensions remain (TensorFlow's limit too).

use super::{dispatch_words, load_fn, pack8, u32_of};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernels::elementwise::fmt_shape;
use crate::{Error, HostTensor, Result, bail_invalid};

/// TensorFlow's `kMaxSpaceToBatchBlockDims`.
const MAX_BLOCK_DIMS: usize = 4;

/// Batch-side element e (to_batch) reads the space side at (n, o * block + k - offset) or is
/// zero outside it; space-side element e (!to_batch) reads the batch side at block k = (x +
/// offset) % block, o = (x + offset) / block. The batch side's batch index is k (row-major
/// over the block dims) * batch + n. `load_inp` and the packing come from mod.rs.
const SPACE_WGSL: &str = "struct Params {
    row: u32,
    n: u32,
    words: u32,
    m: u32,
    batch: u32,
    depth: u32,
    to_batch: u32,
    pad: u32,
    space: vec4<u32>,
    bside: vec4<u32>,
    block: vec4<u32>,
    offset: vec4<u32>,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> inp: array<u32>;

fn value(e: u32) -> vec2<u32> {
    let r = e % p.depth;
    var t = e / p.depth;
    var c: vec4<u32>;
    for (var k = 0u; k < p.m; k++) {
        let i = p.m - 1u - k;
        let size = select(p.space[i], p.bside[i], p.to_batch != 0u);
        c[i] = t % size;
        t = t / size;
    }
    if p.to_batch != 0u {
        // t: the batch side's batch index.
        let n = t % p.batch;
        var kidx = t / p.batch;
        var blocks: vec4<u32>;
        for (var k = 0u; k < p.m; k++) {
            let i = p.m - 1u - k;
            blocks[i] = kidx % p.block[i];
            kidx = kidx / p.block[i];
        }
        var src = n;
        for (var i = 0u; i < p.m; i++) {
            let x = i32(c[i] * p.block[i] + blocks[i]) - i32(p.offset[i]);
            if x < 0 || x >= i32(p.space[i]) {
                return vec2<u32>(0u, 0u);
            }
            src = src * p.space[i] + u32(x);
        }
        return load_inp(src * p.depth + r);
    }
    // t: the space side's batch index.
    var kidx = 0u;
    var o: vec4<u32>;
    for (var i = 0u; i < p.m; i++) {
        let u = c[i] + p.offset[i];
        o[i] = u / p.block[i];
        kidx = kidx * p.block[i] + u % p.block[i];
    }
    var src = kidx * p.batch + t;
    for (var i = 0u; i < p.m; i++) {
        src = src * p.bside[i] + o[i];
    }
    return load_inp(src * p.depth + r);
}
";

/// SpaceToBatchND (`to_batch`) or BatchToSpaceND.
pub(super) struct SpaceBatch {
    pub to_batch: bool,
}

/// The op's geometry, as TensorFlow's kernels compute it.
#[derive(Debug, PartialEq)]
struct Plan {
    out_shape: Vec<usize>,
    /// The space side's batch (the batch with the leading merged dims).
    batch: usize,
    /// Per remaining block dim: (space size, batch-side size, block, offset).
    dims: Vec<(usize, usize, usize, usize)>,
    depth: usize,
}

fn ints(t: &HostTensor) -> Result<Vec<i64>> {
    t.to_i64_vec()
}

impl SpaceBatch {
    fn name(&self) -> &'static str {
        if self.to_batch {
            "SpaceToBatchND"
        } else {
            "BatchToSpaceND"
        }
    }

    fn plan(&self, inputs: &[Operand]) -> Result<Plan> {
        let op = self.name();
        if inputs.len() != 3 {
            bail_invalid!("{op} takes 3 inputs, got {}", inputs.len());
        }
        let x = inputs[0].shape();
        let bt = inputs[1].host(op, 1)?;
        let pt = inputs[2].host(op, 2)?;
        let what = if self.to_batch { "paddings" } else { "crops" };
        if bt.shape.len() != 1 {
            bail_invalid!("block_shape rank should be 1 instead of {}", bt.shape.len());
        }
        let m = bt.shape[0];
        if x.len() < 1 + m {
            bail_invalid!("input rank should be >= {} instead of {}", 1 + m, x.len());
        }
        if pt.shape.len() != 2 || pt.shape[0] != m || pt.shape[1] != 2 {
            bail_invalid!(
                "{what} should have shape [{m}, 2] instead of {}",
                fmt_shape(&pt.shape)
            );
        }
        let block = ints(bt)?;
        let pads = ints(pt)?;
        let trivial = |d: usize| pads[2 * d] == 0 && pads[2 * d + 1] == 0 && block[d] == 1;
        let prefix = (0..m).take_while(|&d| trivial(d)).count();
        let suffix = (prefix..m).rev().take_while(|&d| trivial(d)).count();
        let mut product: i64 = 1;
        for (d, &b) in block.iter().enumerate() {
            if self.to_batch && b < 1 {
                bail_invalid!(
                    "All values in block_shape must be positive, got value, {b} at index {d}."
                );
            }
            product = product.saturating_mul(b);
        }
        if product <= 0 {
            bail_invalid!("Product of block sizes must be positive, got {product}");
        }
        let product = product as usize;
        let inner = m - prefix - suffix;
        if inner > MAX_BLOCK_DIMS {
            bail_invalid!(
                "Maximum number of non-combined block dimensions is {inner} but must not \
                 exceed {MAX_BLOCK_DIMS}"
            );
        }
        if !self.to_batch && !x[0].is_multiple_of(product) {
            bail_invalid!(
                "Input batch dimension ({}) is not divisible by product of block sizes ({product})",
                x[0]
            );
        }
        let mut out_shape = vec![if self.to_batch {
            x[0] * product
        } else {
            x[0] / product
        }];
        // The space side's batch: with the leading merged dims.
        let mut batch = if self.to_batch { x[0] } else { x[0] / product };
        for d in 0..prefix {
            out_shape.push(x[1 + d]);
            batch *= x[1 + d];
        }
        let mut dims = vec![];
        for d in prefix..m - suffix {
            let (start, end) = (pads[2 * d], pads[2 * d + 1]);
            let size = x[1 + d] as i64;
            let b = block[d];
            if self.to_batch {
                if start < 0 || end < 0 {
                    bail_invalid!("Paddings must be non-negative");
                }
                let padded = size + start + end;
                if padded % b != 0 {
                    bail_invalid!(
                        "padded_shape[{d}]={padded} is not divisible by block_shape[{d}]={b}"
                    );
                }
                out_shape.push((padded / b) as usize);
                dims.push((x[1 + d], (padded / b) as usize, b as usize, start as usize));
            } else {
                if start < 0 || end < 0 {
                    bail_invalid!("Crops must be non-negative");
                }
                let cropped = size * b - start - end;
                if cropped < 0 {
                    bail_invalid!("cropped_shape[{d}]={cropped} must be non-negative");
                }
                out_shape.push(cropped as usize);
                dims.push((cropped as usize, x[1 + d], b as usize, start as usize));
            }
        }
        let depth: usize = x[1 + m - suffix..].iter().product();
        out_shape.extend_from_slice(&x[1 + m - suffix..]);
        Ok(Plan {
            out_shape,
            batch,
            dims,
            depth,
        })
    }
}

impl Kernel for SpaceBatch {
    fn op(&self) -> &'static str {
        self.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let p = self.plan(inputs)?;
        Ok(vec![TensorDesc::new(inputs[0].dtype(), &p.out_shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.name();
        let plan = self.plan(inputs)?;
        let out = outputs
            .first()
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no output")))?;
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let x = inputs[0].device(op, 0)?;
        let col = |f: fn(&(usize, usize, usize, usize)) -> usize| -> Result<Vec<u32>> {
            plan.dims
                .iter()
                .map(|d| u32_of(op, "dimension", f(d)))
                .collect()
        };
        let quad = |v: Vec<u32>| -> [u32; 4] {
            let p = pack8(v);
            [p[0], p[1], p[2], p[3]]
        };
        let mut params = vec![
            0,
            0,
            0,
            plan.dims.len() as u32,
            u32_of(op, "batch", plan.batch)?,
            u32_of(op, "depth", plan.depth.max(1))?,
            self.to_batch as u32,
            0,
        ];
        params.extend(quad(col(|d| d.0)?));
        params.extend(quad(col(|d| d.1)?));
        params.extend(quad(col(|d| d.2)?));
        params.extend(quad(col(|d| d.3)?));
        let esize = x.desc.dtype.size();
        let bindings = [super::bind_out(ctx, op, out)?, ctx.bind(x)?];
        dispatch_words(
            ctx,
            "space_batch",
            || format!("{SPACE_WGSL}\n{}", load_fn("inp", esize)),
            &mut params,
            &bindings,
            n,
            out.desc.dtype,
        )
    }
}
