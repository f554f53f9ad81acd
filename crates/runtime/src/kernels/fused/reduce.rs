//! `_TfwgpuFusedReduce`: a float32 reduction (Sum, Mean, Max, Min, Prod, as TensorFlow's) of
//! the result of an elementwise program, which the plugin's graph pass makes of a reduction
//! whose input is computed by a group of elementwise nodes used by nothing else (Keras's
//! batch norm: `Mean(SquaredDifference(x, mean))` for the variance, `Sum(dy' * x_hat)` in its
//! gradient).
//!
//! Inputs: `reduction_indices` (host memory, int32 or int64, as Sum's), then the program's `N`
//! inputs. Attributes: `T` (float32: the reduce family's float type), `N`, `program` (the
//! fused family's program text, no Tile), `reduce` (the reduction's TensorFlow op name),
//! `keep_dims`. `_TfwgpuFusedReduceMulti` also has `M` and `exports`: outputs 1..=M are the
//! results of the program's instructions `exports` (values the group computes that are also
//! used elsewhere: the ReluGrad of batch norm's gradient, which its other sum and dx read; the
//! last instruction too, the reduced tensor itself: the BiasAdd whose mean batch norm takes).
//! Exports of the reduced tensor's shape are written by the reduction's first step, as it
//! computes each element; others by a dispatch of the elementwise kernel per shape.
//!
//! The reduce kernels' first step computes the program for each element it loads (a
//! prologue: every input read at its broadcast offset, the per-channel mean of
//! SquaredDifference included), so the elementwise result is neither written nor read back,
//! and one dispatch goes. The program's values are the fused elementwise kernel's (the same
//! WGSL, rounded and fenced after every instruction), and the reduction's passes and steps
//! are those of the plain reduction of a tensor of the program's output shape: the result is
//! bit for bit what the elementwise kernel followed by the reduction gives. A reduction that
//! reduces nothing (every reduced dimension of size 1) is the program's result, written by
//! the elementwise kernel.

use super::{
    Fused, MAX_RANK, OP_REDUCE, OP_REDUCE_MULTI, Program, Reads, bind_out, fmt_shape, key_text,
    words_for,
};
use crate::kernel::{DeviceRef, Kernel, KernelContext, Operand, TensorDesc};
use crate::kernels::elementwise::{COMMON_WGSL, MATH_WGSL};
use crate::kernels::reduce::{self as red, Plan, Prologue, ReduceOp};
use crate::{Attrs, DType, Error, Result, bail_invalid, invalid_arg};

/// One `_TfwgpuFusedReduce` (or `_TfwgpuFusedReduceMulti`) node's kernel.
pub struct FusedReduce {
    /// The op's name (with exports: `_TfwgpuFusedReduceMulti`).
    name: &'static str,
    /// The instructions whose results are outputs 1.. (the last one's too, possibly: the
    /// program's own exports are the others).
    exports: Vec<usize>,
    /// The elementwise kernel of the program (for a reduction of nothing).
    fused: Fused,
    rop: ReduceOp,
    keep_dims: bool,
    /// `fields` of the prologue (they depend on the number of inputs only).
    fields: String,
}

impl FusedReduce {
    pub fn build(attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let dtype = attrs.dtype("T")?;
        if dtype != DType::F32 {
            return Err(Error::Unimplemented(format!(
                "{OP_REDUCE} has no tfwgpu kernel for T={dtype}"
            )));
        }
        let n = attrs.int_or("N", -1)?;
        if n < 1 {
            bail_invalid!("{OP_REDUCE}: attribute N missing or not positive ({n})");
        }
        let text = match attrs.get("program") {
            Some(crate::AttrValue::Str(s)) => s.clone(),
            _ => bail_invalid!("{OP_REDUCE}: string attribute program missing"),
        };
        let rop = match attrs.get("reduce") {
            Some(crate::AttrValue::Str(s)) => ReduceOp::from_name(s).ok_or_else(|| {
                invalid_arg!("{OP_REDUCE}: reduce is {s:?}; Sum, Mean, Max, Min or Prod expected")
            })?,
            _ => bail_invalid!("{OP_REDUCE}: string attribute reduce missing"),
        };
        let keep_dims = attrs.bool_or("keep_dims", false)?;
        let exports: Vec<usize> = match attrs.get("exports") {
            None => vec![],
            Some(crate::AttrValue::Ints(v)) => v
                .iter()
                .map(|&e| {
                    usize::try_from(e).map_err(|_| {
                        invalid_arg!("{OP_REDUCE_MULTI}: exports holds {e}, not an index")
                    })
                })
                .collect::<Result<_>>()?,
            Some(_) => bail_invalid!("{OP_REDUCE_MULTI}: attribute exports is not a list of ints"),
        };
        let m = attrs.int_or("M", 0)?;
        if m != exports.len() as i64 {
            bail_invalid!(
                "{OP_REDUCE_MULTI}: M = {m} but exports names {} instructions",
                exports.len()
            );
        }
        // The last instruction (the reduced tensor) may be exported too, once.
        let last = text.split(';').count() - 1;
        if exports.iter().filter(|&&e| e == last).count() > 1 {
            bail_invalid!("{OP_REDUCE_MULTI}: exports names instruction {last} twice");
        }
        let inner: Vec<usize> = exports.iter().copied().filter(|&e| e != last).collect();
        let program = Program::parse_multi(&text, n as usize, &inner)?;
        if let Some(k) = program
            .instrs
            .iter()
            .position(|i| i.op == super::FusedOp::Tile)
        {
            return Err(Error::Unimplemented(format!(
                "{OP_REDUCE}: instruction {k}: Tile in a fused reduction's program"
            )));
        }
        let fields = format!(
            "    // 0 at run time (see `fence`), the rank of the merged broadcast.
    zero: u32,
    rank: u32,
    pro0: u32,
    pro1: u32,
    // Merged dims of the program's output, each input's element strides along them.
    shape: array<vec4<u32>, 2>,
    st: array<vec4<u32>, {}>,
",
            2 * program.inputs
        );
        Ok(Box::new(FusedReduce {
            name: if exports.is_empty() {
                OP_REDUCE
            } else {
                OP_REDUCE_MULTI
            },
            exports,
            fused: Fused {
                text: key_text(&program),
                program,
                dtype,
                restricted: Default::default(),
                plans: Default::default(),
                checked: Default::default(),
            },
            rop,
            keep_dims,
            fields,
        }))
    }

    /// The name in messages, e.g. `_TfwgpuFusedReduce (Sum)`.
    fn what(&self) -> String {
        format!("{} ({})", self.name, self.rop.name())
    }

    /// Validates the inputs; the shape of every instruction's result (the last one's is the
    /// reduced tensor's) and the reduced-axis mask.
    fn check(&self, inputs: &[Operand]) -> Result<(Vec<Vec<usize>>, Vec<bool>)> {
        let what = self.what();
        let program = &self.fused.program;
        if inputs.len() != program.inputs + 1 {
            bail_invalid!(
                "{what} takes {} inputs (reduction_indices and the program's {}), got {}",
                program.inputs + 1,
                program.inputs,
                inputs.len()
            );
        }
        let axes = inputs[0].host(&what, 0)?;
        if axes.shape.len() > 1 {
            bail_invalid!(
                "{what}: reduction_indices must be a scalar or a vector, got shape {:?}",
                axes.shape
            );
        }
        let axes = axes.to_i64_vec().map_err(|_| {
            invalid_arg!(
                "{what}: reduction_indices must be int32 or int64, got {}",
                axes.dtype
            )
        })?;
        for (k, i) in inputs[1..].iter().enumerate() {
            if i.dtype() != DType::F32 {
                bail_invalid!("{what}: input {} is {} but T is float32", k + 1, i.dtype());
            }
        }
        let shapes: Vec<&[usize]> = inputs[1..].iter().map(|i| i.shape()).collect();
        let temps = program.temp_shapes(&shapes)?;
        for o in program.output_instrs() {
            words_for(OP_REDUCE, DType::F32, temps[o].iter().product())?;
        }
        let shape = temps.last().expect("a program has an instruction");
        let mask = red::reduction_mask(&what, shape, &axes)?;
        Ok((temps, mask))
    }

    /// The output descs: the reduction's, then the exported values'.
    fn descs(&self, temps: &[Vec<usize>], mask: &[bool]) -> Vec<TensorDesc> {
        let shape = temps.last().expect("a program has an instruction");
        let reduced = red::output_shape(shape, mask, self.keep_dims);
        std::iter::once(TensorDesc::new(DType::F32, &reduced))
            .chain(
                self.exports
                    .iter()
                    .map(|&e| TensorDesc::new(DType::F32, &temps[e])),
            )
            .collect()
    }

    /// Computes the values of instructions `values` (in decreasing order) into `outs` with
    /// the elementwise kernel, in one dispatch of `shape`.
    fn elementwise(
        &self,
        ctx: &KernelContext,
        data: &[Operand],
        values: &[usize],
        shape: &[usize],
        outs: &[&DeviceRef],
    ) -> Result<()> {
        let sub = self.fused.restricted(&self.fused.program, values, false);
        let sub_inputs: Vec<Operand> = sub.inputs.iter().map(|&i| data[i]).collect();
        self.fused
            .dispatch(ctx, &sub.program, &sub.text, &sub_inputs, shape, outs, true)
    }
}

/// How a prologue finds its inputs' offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
    /// Every input at `e * stride` (a broadcast of one merged dimension).
    Flat,
    /// Through the merged dims (a division per dimension and element).
    Bcast,
    /// As `Bcast`, and the innermost merged dim is a multiple of 4: the four elements of a
    /// vec4 load share their offsets but along that dim (computed once per vec4).
    Quad,
}

impl ReadMode {
    fn name(self) -> &'static str {
        match self {
            ReadMode::Flat => "flat",
            ReadMode::Bcast => "bcast",
            ReadMode::Quad => "quad",
        }
    }
}

/// Whether vec4 steps read the inputs contiguous along the innermost dim a vec4 at a time, and
/// store the written values so (`TFWGPU_REDUCE_VEC_LOADS=0`: a word at a time, four loads per
/// vec4, as the first version measured on the H200, whose fused reductions took about twice
/// the plain reduction's time of a tensor of their size).
fn vec_loads() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_REDUCE_VEC_LOADS", "0"))
}

/// Whether quad reads are on (`TFWGPU_REDUCE_QUAD=0` computes the offsets of each element of a
/// vec4 load, for comparison).
fn quad_reads() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_REDUCE_QUAD", "0"))
}

impl Program {
    /// WGSL of the program as a reduction's prologue (see [`red::Prologue`]): input 0 bound at
    /// 1, input k >= 1 at k + 2; the helpers of `COMMON_WGSL` and `MATH_WGSL`, the program's
    /// functions, `elem(e)` and `elem4(e)` (elements e to e + 3, e a multiple of 4).
    ///
    /// `writes`: (instruction, output binding) of the values `elem` and `elem4` also store,
    /// at the elements they compute.
    fn prologue_wgsl(
        &self,
        dtype: DType,
        mode: ReadMode,
        writes: &[(usize, usize)],
        vec: Option<&[bool]>,
    ) -> String {
        let flat = mode == ReadMode::Flat;
        let mut s = String::new();
        // With `vec` (a vec4 step, flat or quad reads): the inputs it marks are bound as
        // vec4 words and read a vec4 at a time (each is contiguous along the innermost dim,
        // which is a multiple of 4, and e is: their offsets are multiples of 4), the written
        // values stored a vec4 at a time; the other inputs are broadcast along the innermost
        // dim (one value for the four elements).
        let is_vec = |k: usize| vec.is_some_and(|v| v[k]);
        for k in 0..self.inputs {
            let binding = if k == 0 { 1 } else { k + 2 };
            let ty = if is_vec(k) { "vec4<u32>" } else { "u32" };
            s.push_str(&format!(
                "@group(0) @binding({binding}) var<storage, read_write> in{k}: array<{ty}>;\n"
            ));
        }
        s.push_str(COMMON_WGSL);
        s.push_str(MATH_WGSL);
        let mut functions = self.functions(dtype);
        for k in (0..self.inputs).filter(|&k| is_vec(k)) {
            // Scalar loads of a vec4-bound input (elem's; unused by the vec4 steps).
            functions = functions.replace(
                &format!("bitcast<f32>(in{k}[i])"),
                &format!("bitcast<f32>(in{k}[i >> 2u][i & 3u])"),
            );
        }
        s.push_str(&functions);
        let ty = if vec.is_some() { "vec4<u32>" } else { "u32" };
        for &(_, b) in writes {
            s.push_str(&format!(
                "@group(0) @binding({b}) var<storage, read_write> ex{b}: array<{ty}>;\n"
            ));
        }
        let uniform = vec![false; self.instrs.len()];
        // elem(e): as the elementwise kernel's, storing the written values (in the vec4
        // variant, elem is not called: elem4 stores them).
        s.push_str("fn elem(e: u32) -> f32 {\n");
        s.push_str(&self.offsets(flat));
        for (k, &r) in self.reads(&uniform, false).iter().enumerate() {
            if r {
                s.push_str(&format!("    let x{k} = ld{k}(o{k});\n"));
            }
        }
        self.body(&mut s, &uniform, false);
        if vec.is_none() {
            for &(t, b) in writes {
                s.push_str(&format!("    ex{b}[e] = bitcast<u32>(t{t});\n"));
            }
        }
        let last = self.instrs.len() - 1;
        s.push_str(&format!("    return t{last};\n}}\n"));
        s.push_str("fn elem4(e: u32) -> vec4<f32> {\n");
        if vec.is_some() {
            s.push_str(&self.offsets(flat));
            for k in 0..self.inputs {
                if is_vec(k) {
                    s.push_str(&format!("    let v{k} = in{k}[o{k} >> 2u];\n"));
                } else {
                    s.push_str(&format!("    let x{k} = ld{k}(o{k});\n"));
                }
            }
            for &(_, b) in writes {
                s.push_str(&format!("    var w{b}: vec4<u32>;\n"));
            }
            s.push_str("    var v: vec4<f32>;\n    for (var j = 0u; j < 4u; j = j + 1u) {\n");
            for k in (0..self.inputs).filter(|&k| is_vec(k)) {
                s.push_str(&format!("        let x{k} = bitcast<f32>(v{k}[j]);\n"));
            }
        } else if mode == ReadMode::Quad {
            // Offsets of element e, and each input's stride along the innermost merged dim
            // (0 or 1): the four elements are in one row of it.
            s.push_str(&self.offsets(false));
            s.push_str("    let inner = p.rank - 1u;\n");
            for k in 0..self.inputs {
                s.push_str(&format!(
                    "    let s{k} = p.st[{} + inner / 4u][inner % 4u];\n",
                    2 * k
                ));
            }
            s.push_str("    var v: vec4<f32>;\n    for (var j = 0u; j < 4u; j = j + 1u) {\n");
            for k in 0..self.inputs {
                s.push_str(&format!("        let x{k} = ld{k}(o{k} + j * s{k});\n"));
            }
        } else {
            s.push_str(
                "    return vec4<f32>(elem(e), elem(e + 1u), elem(e + 2u), elem(e + 3u));\n}\n",
            );
            return s;
        }
        let mut body = String::new();
        self.body(&mut body, &uniform, false);
        for line in body.lines() {
            s.push_str(&format!("    {line}\n"));
        }
        for &(t, b) in writes {
            if vec.is_some() {
                s.push_str(&format!("        w{b}[j] = bitcast<u32>(t{t});\n"));
            } else {
                s.push_str(&format!("        ex{b}[e + j] = bitcast<u32>(t{t});\n"));
            }
        }
        s.push_str(&format!("        v[j] = t{last};\n    }}\n"));
        if vec.is_some() {
            for &(_, b) in writes {
                s.push_str(&format!("    ex{b}[e >> 2u] = w{b};\n"));
            }
        }
        s.push_str("    return v;\n}\n");
        s
    }
}

impl Kernel for FusedReduce {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (temps, mask) = self.check(inputs)?;
        Ok(self.descs(&temps, &mask))
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let what = self.what();
        let (temps, mask) = self.check(inputs)?;
        let descs = self.descs(&temps, &mask);
        if outputs.len() != descs.len() {
            bail_invalid!(
                "{what}: {} outputs given, the reduction has {}",
                outputs.len(),
                descs.len()
            );
        }
        for (k, (out, want)) in outputs.iter().zip(&descs).enumerate() {
            if out.desc != *want {
                bail_invalid!(
                    "{what}: output {k} is {} {} but the kernel computes {}",
                    out.desc.dtype,
                    fmt_shape(&out.desc.shape),
                    fmt_shape(&want.shape)
                );
            }
        }
        let data = &inputs[1..];
        let program = &self.fused.program;
        let last = program.instrs.len() - 1;
        let shape = &temps[last];
        // Exports of the reduced tensor's shape are written as its elements are computed
        // (in decreasing instruction order, as the elementwise kernel's restricted programs
        // take them); others by the elementwise kernel, one dispatch per shape.
        let mut inline: Vec<(usize, usize)> = vec![];
        // (instruction, output) of the exports, by shape.
        type Exports = Vec<(usize, usize)>;
        let mut others: Vec<(&Vec<usize>, Exports)> = vec![];
        for (k, &e) in self.exports.iter().enumerate() {
            if &temps[e] == shape {
                inline.push((e, k + 1));
                continue;
            }
            match others.iter_mut().find(|(s, _)| *s == &temps[e]) {
                Some((_, v)) => v.push((e, k + 1)),
                None => others.push((&temps[e], vec![(e, k + 1)])),
            }
        }
        inline.sort_by_key(|&(e, _)| std::cmp::Reverse(e));
        for (s, vals) in &mut others {
            vals.sort_by_key(|&(e, _)| std::cmp::Reverse(e));
            let values: Vec<usize> = vals.iter().map(|v| v.0).collect();
            let outs: Vec<&DeviceRef> = vals.iter().map(|v| &outputs[v.1]).collect();
            self.elementwise(ctx, data, &values, s, &outs)?;
        }
        let output = &outputs[0];
        match red::plan(shape, &mask) {
            // The reduced tensor is empty (a kept dimension is 0): so are its exports.
            Plan::Nothing => return Ok(()),
            // Nothing reduced: the output holds the program's result (the same elements).
            Plan::Copy => {
                let values: Vec<usize> = std::iter::once(last)
                    .chain(inline.iter().map(|v| v.0).filter(|&e| e != last))
                    .collect();
                let outs: Vec<&DeviceRef> = std::iter::once(output)
                    .chain(inline.iter().filter(|v| v.0 != last).map(|v| &outputs[v.1]))
                    .collect();
                self.elementwise(ctx, data, &values, shape, &outs)?;
                // The reduced tensor exported: the output's elements.
                if let Some(&(_, k)) = inline.iter().find(|v| v.0 == last) {
                    let bytes = output.desc.byte_size().next_multiple_of(4);
                    return ctx.copy(&ctx.bind(output)?, &ctx.bind(&outputs[k])?, bytes);
                }
                return Ok(());
            }
            Plan::Passes(_) => {}
        }
        let shapes: Vec<&[usize]> = data.iter().map(|i| i.shape()).collect();
        let reads = Reads::of(shape, &shapes).ok_or_else(|| {
            invalid_arg!(
                "{what}: an input does not broadcast to the program's output {}",
                fmt_shape(shape)
            )
        })?;
        if reads.dims.len() > MAX_RANK {
            return Err(Error::Unimplemented(format!(
                "{what}: the broadcast to {} needs {} dimensions after merging; at most \
                 {MAX_RANK} are supported",
                fmt_shape(shape),
                reads.dims.len()
            )));
        }
        let bindings_needed = (program.inputs + 1 + inline.len()) as u32;
        if bindings_needed > ctx.limits().max_storage_buffers_per_shader_stage {
            return Err(Error::Unimplemented(format!(
                "{what}: {bindings_needed} storage bindings needed, the adapter allows {}",
                ctx.limits().max_storage_buffers_per_shader_stage
            )));
        }
        let mode = if reads.dims.len() <= 1 {
            ReadMode::Flat
        } else if quad_reads() && reads.dims.last().is_some_and(|d| d % 4 == 0) {
            ReadMode::Quad
        } else {
            ReadMode::Bcast
        };
        let mut words = vec![0, reads.dims.len() as u32, 0, 0];
        let mut a8 = [0u32; MAX_RANK];
        for (dst, &src) in a8.iter_mut().zip(&reads.dims) {
            *dst = src as u32;
        }
        words.extend_from_slice(&a8);
        for st in &reads.strides {
            let mut a8 = [0u32; MAX_RANK];
            for (dst, &src) in a8.iter_mut().zip(st) {
                *dst = src as u32;
            }
            words.extend_from_slice(&a8);
        }
        let mut binds = Vec::with_capacity(data.len());
        for (k, i) in data.iter().enumerate() {
            binds.push(ctx.bind(i.device(OP_REDUCE, k + 1)?)?);
        }
        // Written values: (instruction, binding), bound after the inputs.
        let mut outs = Vec::with_capacity(inline.len());
        let mut writes = Vec::with_capacity(inline.len());
        for (j, &(e, k)) in inline.iter().enumerate() {
            outs.push(bind_out(ctx, OP_REDUCE, &outputs[k])?);
            writes.push((e, program.inputs + 2 + j));
        }
        // Inputs read a vec4 at a time by vec4 steps: contiguous along the innermost merged
        // dim (flat or quad reads).
        let vec_inputs: Option<Vec<bool>> = (mode != ReadMode::Bcast && vec_loads()).then(|| {
            reads
                .strides
                .iter()
                .map(|st| st.last() == Some(&1))
                .collect()
        });
        let wgsl = |vec4: bool| {
            let vec = vec_inputs.as_deref().filter(|_| vec4);
            program.prologue_wgsl(DType::F32, mode, &writes, vec)
        };
        let mut key = format!("{}/{}", self.fused.text, mode.name());
        if let Some(v) = &vec_inputs {
            key.push_str("/v:");
            key.extend(v.iter().map(|&b| if b { '1' } else { '0' }));
        }
        if !writes.is_empty() {
            let w: Vec<String> = writes.iter().map(|w| w.0.to_string()).collect();
            key.push_str(&format!("/w:{}", w.join(",")));
        }
        let prologue = Prologue {
            key,
            wgsl: &wgsl,
            fields: &self.fields,
            words,
            inputs: binds,
            outputs: outs,
        };
        red::record_prologue(ctx, self.rop, &prologue, shape, &mask, output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec4_steps_load_and_store_vec4_words() {
        // Batch norm's variance: x contiguous along the channels, the mean too (quad reads):
        // both bound as vec4 words and loaded once per vec4; a scalar input broadcast along
        // the channels is loaded once for the four elements.
        let p = Program::parse_multi("SquaredDifference(i0,i1);Mul(t0,i2)", 3, &[0]).unwrap();
        let s = p.prologue_wgsl(
            DType::F32,
            ReadMode::Quad,
            &[(0, 5)],
            Some(&[true, true, false]),
        );
        assert!(
            s.contains("var<storage, read_write> in0: array<vec4<u32>>;"),
            "{s}"
        );
        assert!(
            s.contains("var<storage, read_write> in1: array<vec4<u32>>;"),
            "{s}"
        );
        assert!(
            s.contains("var<storage, read_write> in2: array<u32>;"),
            "{s}"
        );
        assert!(s.contains("let v0 = in0[o0 >> 2u];") && s.contains("let v1 = in1[o1 >> 2u];"));
        assert!(s.contains("let x2 = ld2(o2);"), "{s}");
        assert!(
            s.contains("var<storage, read_write> ex5: array<vec4<u32>>;"),
            "{s}"
        );
        assert!(s.contains("ex5[e >> 2u] = w5;"), "{s}");
        // Word steps: words, the writes in elem.
        let s = p.prologue_wgsl(DType::F32, ReadMode::Quad, &[(0, 5)], None);
        assert!(!s.contains("vec4<u32>>"), "{s}");
        assert!(s.contains("ex5[e] = bitcast<u32>(t0);"), "{s}");
        assert!(s.contains("ex5[e + j] = bitcast<u32>(t0);"), "{s}");
    }
}
