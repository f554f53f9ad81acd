//! `TF_InitGraph`: a graph rewrite for tfwgpu devices.
//!
//! AssignAddVariableOp / AssignSubVariableOp placed on a tfwgpu GPU become
//! `ReadVariableOp -> AddV2/Sub -> AssignVariableOp` (the last keeps the original name, so
//! control edges and fetches still find it; the read takes over its control inputs, so it still
//! runs after the updates it was ordered after, and after the other inputs of the update, see
//! [`read_after`]). TensorFlow 2.21's wheels do not export
//! `TF_AssignUpdateVariable` to plugins, so this is how Keras optimizers update variables on
//! the GPU inside `tf.function` (Keras `fit`). Everything else in the graph is copied byte for
//! byte. Then [`fusion`] merges chains of elementwise nodes on tfwgpu GPUs into fused nodes
//! (off with `TFWGPU_FUSION=0`).

use std::ffi::c_void;

use tfwgpu_runtime::{Error, Result};
use tfwgpu_sys as sys;

use crate::nodedef::{Field, Reader};
use crate::status::guard;

pub mod apply;
pub mod epilogue;
pub mod fusion;
pub mod host_logic;
pub mod int32;
pub mod pin;

/// Appends a protobuf varint.
pub(crate) fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Appends a length-delimited protobuf field.
pub(crate) fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    varint(((field as u64) << 3) | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// A GraphDef's top-level fields in order, each raw, with the index of its parsed node and
/// the NodeDef's own bytes for the nodes (field 1), `None` and the raw field again for the
/// rest (library, versions); and the parsed nodes.
type GraphItems<'a> = (Vec<(Option<usize>, &'a [u8], &'a [u8])>, Vec<Node>);

/// Splits a serialized GraphDef into [`GraphItems`], for the passes that rewrite some nodes and
/// re-encode the rest unchanged.
fn split_graph(graph: &[u8]) -> Result<GraphItems<'_>> {
    let mut r = Reader::new(graph);
    let mut items: Vec<(Option<usize>, &[u8], &[u8])> = vec![];
    let mut nodes = vec![];
    loop {
        let start = r.pos;
        let Some((f, v)) = r.next()? else { break };
        let raw = &graph[start..r.pos];
        match (f, v) {
            (1, Field::Bytes(nb)) => {
                items.push((Some(nodes.len()), raw, nb));
                nodes.push(Node::parse(nb)?);
            }
            _ => items.push((None, raw, raw)),
        }
    }
    Ok((items, nodes))
}

/// The parts of a NodeDef the rewrite needs; `attrs` keeps each map entry's encoded value.
#[derive(Clone, Default)]
struct Node {
    name: String,
    op: String,
    inputs: Vec<String>,
    device: String,
    attrs: Vec<(String, Vec<u8>)>,
}

impl Node {
    fn parse(b: &[u8]) -> Result<Node> {
        let mut r = Reader::new(b);
        let mut n = Node::default();
        let s = |b: &[u8]| {
            String::from_utf8(b.to_vec())
                .map_err(|_| Error::InvalidArgument("non-UTF-8 NodeDef".into()))
        };
        while let Some((f, v)) = r.next()? {
            if let Field::Bytes(b) = v {
                match f {
                    1 => n.name = s(b)?,
                    2 => n.op = s(b)?,
                    3 => n.inputs.push(s(b)?),
                    4 => n.device = s(b)?,
                    5 => {
                        let mut e = Reader::new(b);
                        let (mut key, mut val) = (String::new(), vec![]);
                        while let Some((f, v)) = e.next()? {
                            match (f, v) {
                                (1, Field::Bytes(k)) => key = s(k)?,
                                (2, Field::Bytes(a)) => val = a.to_vec(),
                                _ => {}
                            }
                        }
                        n.attrs.push((key, val));
                    }
                    _ => {}
                }
            }
        }
        Ok(n)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let mut b = vec![];
        bytes_field(1, self.name.as_bytes(), &mut b);
        bytes_field(2, self.op.as_bytes(), &mut b);
        for i in &self.inputs {
            bytes_field(3, i.as_bytes(), &mut b);
        }
        bytes_field(4, self.device.as_bytes(), &mut b);
        for (k, v) in &self.attrs {
            let mut e = vec![];
            bytes_field(1, k.as_bytes(), &mut e);
            bytes_field(2, v, &mut e);
            bytes_field(5, &e, &mut b);
        }
        bytes_field(1, &b, out);
    }

    fn attr(&self, key: &str) -> Option<&[u8]> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
}

/// The control inputs of the reads that replace an update of a variable: the update's control
/// inputs, and a control edge from each of its other (non-resource) data inputs. TensorFlow
/// runs an op when all its inputs are ready, and grappler drops a control edge that a data
/// input already implies (a constant made under the same control dependency): the read must
/// wait for those inputs too, or it could run before an assignment the update was ordered
/// after.
pub(crate) fn read_after(tensor_inputs: &[String], control: &[String]) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    let edges = tensor_inputs.iter().map(|i| {
        let node = i.rsplit_once(':').map_or(i.as_str(), |(n, _)| n);
        format!("^{node}")
    });
    for c in edges.chain(control.iter().cloned()) {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

fn on_tfwgpu_gpu(device: &str) -> bool {
    // Placed graphs name the device in full; the plugin's devices are of type GPU.
    device.contains("GPU") || device.contains("gpu")
}

/// An encoded AttrValue holding a type.
fn type_attr(tf_type: u64) -> Vec<u8> {
    let mut v = vec![];
    varint(6 << 3, &mut v);
    varint(tf_type, &mut v);
    v
}

/// An encoded AttrValue holding an int.
fn int_attr(i: i64) -> Vec<u8> {
    let mut v = vec![];
    varint(3 << 3, &mut v);
    varint(i as u64, &mut v);
    v
}

/// The int in an encoded AttrValue (`i`, field 3), if it is one.
fn attr_int(b: &[u8]) -> Option<i64> {
    let mut r = Reader::new(b);
    while let Ok(Some((f, v))) = r.next() {
        if let (3, Field::Varint(i)) = (f, v) {
            return Some(i as i64);
        }
    }
    None
}

/// An encoded AttrValue holding an int32 scalar tensor.
fn int32_scalar_attr(v: i32) -> Vec<u8> {
    let mut t = vec![];
    varint(1 << 3, &mut t); // dtype
    varint(3, &mut t); // DT_INT32
    bytes_field(2, &[], &mut t); // scalar shape
    varint(7 << 3, &mut t); // int_val
    varint(v as i64 as u64, &mut t);
    let mut a = vec![];
    bytes_field(8, &t, &mut a);
    a
}

/// The read of the variable `data[0]` that replaces `node` (an update or gather of it): after
/// the node's other inputs and its control inputs (see `read_after`).
fn read_node(node: &Node, data: &[String], control: &[String], dtype: &[u8]) -> Node {
    Node {
        name: format!("{}/tfwgpu_read", node.name),
        op: "ReadVariableOp".into(),
        inputs: std::iter::once(data[0].clone())
            .chain(read_after(&data[1..], control))
            .collect(),
        device: node.device.clone(),
        attrs: vec![("dtype".into(), dtype.to_vec())],
    }
}

/// ResourceGather on a tfwgpu GPU (tf.gather on a variable inside tf.function) becomes
/// ReadVariableOp + GatherV2 (axis = batch_dims), the gather keeping the node's name for its
/// consumers: TensorFlow's own ResourceGather kernel would gather on the CPU from a device
/// address.
fn gather_from_read(node: &Node) -> Option<Vec<Node>> {
    let (data, control): (Vec<_>, Vec<_>) = node
        .inputs
        .iter()
        .cloned()
        .partition(|i| !i.starts_with('^'));
    if data.len() != 2 {
        return None;
    }
    let dtype = node.attr("dtype")?.to_vec();
    let tindices = node.attr("Tindices")?.to_vec();
    let batch_dims = node.attr("batch_dims").and_then(attr_int).unwrap_or(0);
    let read = read_node(node, &data, &control, &dtype);
    let axis = Node {
        name: format!("{}/tfwgpu_axis", node.name),
        op: "Const".into(),
        inputs: vec![],
        device: node.device.clone(),
        attrs: vec![
            ("dtype".into(), type_attr(3)),
            ("value".into(), int32_scalar_attr(batch_dims as i32)),
        ],
    };
    let gather = Node {
        name: node.name.clone(),
        op: "GatherV2".into(),
        inputs: vec![read.name.clone(), data[1].clone(), axis.name.clone()],
        device: node.device.clone(),
        attrs: vec![
            ("Tparams".into(), dtype),
            ("Tindices".into(), tindices),
            ("Taxis".into(), type_attr(3)),
            ("batch_dims".into(), int_attr(batch_dims)),
        ],
    };
    Some(vec![read, axis, gather])
}

/// Rewrites a serialized GraphDef; returns `None` when nothing needed rewriting.
pub fn rewrite(graph: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut r = Reader::new(graph);
    let mut out = Vec::with_capacity(graph.len() + 256);
    let mut changed = false;
    loop {
        let start = r.pos;
        let Some((f, v)) = r.next()? else { break };
        let raw = &graph[start..r.pos];
        let (1, Field::Bytes(nb)) = (f, v) else {
            out.extend_from_slice(raw);
            continue;
        };
        let node = Node::parse(nb)?;
        if on_tfwgpu_gpu(&node.device)
            && let Some(nodes) = apply::expand(&node)
        {
            for n in &nodes {
                n.encode(&mut out);
            }
            changed = true;
            continue;
        }
        if node.op == "ResourceGather"
            && on_tfwgpu_gpu(&node.device)
            && let Some(nodes) = gather_from_read(&node)
        {
            for n in &nodes {
                n.encode(&mut out);
            }
            changed = true;
            continue;
        }
        let update = match node.op.as_str() {
            "AssignAddVariableOp" => "AddV2",
            "AssignSubVariableOp" => "Sub",
            _ => "",
        };
        if update.is_empty() || !on_tfwgpu_gpu(&node.device) || node.inputs.len() < 2 {
            out.extend_from_slice(raw);
            continue;
        }
        let Some(dtype) = node.attr("dtype").map(<[u8]>::to_vec) else {
            out.extend_from_slice(raw);
            continue;
        };
        let (data, control): (Vec<_>, Vec<_>) = node
            .inputs
            .iter()
            .cloned()
            .partition(|i| !i.starts_with('^'));
        let read = read_node(&node, &data, &control, &dtype);
        let combine = Node {
            name: format!("{}/tfwgpu_{}", node.name, update.to_lowercase()),
            op: update.into(),
            inputs: vec![read.name.clone(), data[1].clone()],
            device: node.device.clone(),
            attrs: vec![("T".into(), dtype.clone())],
        };
        let mut no_validate = vec![];
        varint(5 << 3, &mut no_validate);
        varint(0, &mut no_validate);
        let assign = Node {
            name: node.name.clone(),
            op: "AssignVariableOp".into(),
            inputs: vec![data[0].clone(), combine.name.clone()],
            device: node.device.clone(),
            attrs: vec![
                ("dtype".into(), dtype),
                ("validate_shape".into(), no_validate),
            ],
        };
        read.encode(&mut out);
        combine.encode(&mut out);
        assign.encode(&mut out);
        changed = true;
    }
    Ok(changed.then_some(out))
}

unsafe extern "C" fn free_buffer(data: *mut c_void, _len: usize) {
    // SAFETY: allocated with malloc in optimize.
    unsafe { libc::free(data) };
}

/// Reads of a variable right after an assignment to it return the assigned tensor: a
/// `ReadVariableOp` on a tfwgpu GPU whose only control input is an `AssignVariableOp` of the
/// same handle (TensorFlow's automatic control dependencies chain the ops on one resource, so
/// nothing writes the variable in between) gives its data consumers the assigned value
/// instead. Keras's SGD with momentum assigns m' to m, then adds m (read again) to the
/// variable: with the value itself, m' and the update of the variable fuse into one kernel of
/// two outputs.
///
/// The read stays, with its control input: it keeps the assignment in the graph (TensorFlow
/// prunes what no fetch or control output reaches, and a function's control outputs are the
/// read's consumers, not the assignment). So that the read stays reachable, the graph's
/// control output (a preserved NoOp nothing depends on) gets a control edge from it; without
/// one, the nodes that depend on its consumers (data or control) do (which can make a cycle
/// with a fused group that both computes the value and consumes the read's consumer: the
/// fusion pass then leaves them apart); a read that is fetched or has control consumers is
/// reachable already; a read with a consumer on which nothing depends is not forwarded. The consumers themselves no longer wait for the
/// assignment, only for the value's producer: the variables' values are the same, only the
/// order of two writes to different variables is no longer fixed. Returns `None` when no read
/// qualifies.
pub fn forward_assigned_reads(
    graph: &[u8],
    preserve: &std::collections::HashSet<String>,
) -> Result<Option<Vec<u8>>> {
    use std::collections::HashMap;
    let (items, nodes) = split_graph(graph)?;
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    // Every node that depends on each node (data or control), and whether by control.
    let mut dependents: Vec<Vec<(usize, bool)>> = vec![vec![]; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        for i in &n.inputs {
            let (src, control) = match i.strip_prefix('^') {
                Some(s) => (s, true),
                None => (fusion::source(i).0, false),
            };
            if let Some(&p) = by_name.get(src) {
                dependents[p].push((c, control));
            }
        }
    }
    fn handle(s: &str) -> (&str, u32) {
        fusion::source(s)
    }
    // Preserved NoOps nothing depends on: a function's control outputs.
    let sinks: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            nodes[i].op == "NoOp" && preserve.contains(&nodes[i].name) && dependents[i].is_empty()
        })
        .collect();
    // Read -> the assigned value; node -> reads it must wait for.
    let mut value: HashMap<String, String> = HashMap::new();
    let mut keep_alive: HashMap<usize, Vec<String>> = HashMap::new();
    for (ri, n) in nodes.iter().enumerate() {
        if n.op != "ReadVariableOp" || !on_tfwgpu_gpu(&n.device) {
            continue;
        }
        let [h, ctl] = n.inputs.as_slice() else {
            continue;
        };
        let Some(a) = ctl.strip_prefix('^').and_then(|a| by_name.get(a)) else {
            continue;
        };
        let a = &nodes[*a];
        let data: Vec<&String> = a.inputs.iter().filter(|i| !i.starts_with('^')).collect();
        if a.op != "AssignVariableOp"
            || a.device != n.device
            || data.len() != 2
            || handle(data[0]) != handle(h)
            || a.attr("dtype").is_none()
            || a.attr("dtype") != n.attr("dtype")
        {
            continue;
        }
        let reached = preserve.contains(&n.name) || dependents[ri].iter().any(|&(_, c)| c);
        let mut waits: Vec<usize> = vec![];
        if !reached && let Some(&s) = sinks.first() {
            // The function's control output: it waits for the read (and so the assignment).
            waits.push(s);
        } else if !reached {
            let mut ok = true;
            for &(c, _) in &dependents[ri] {
                if dependents[c].is_empty() {
                    ok = false;
                }
                waits.extend(dependents[c].iter().map(|&(d, _)| d));
            }
            if !ok || waits.is_empty() {
                continue;
            }
        }
        for d in waits {
            let w = keep_alive.entry(d).or_default();
            let edge = format!("^{}", n.name);
            if !w.contains(&edge) {
                w.push(edge);
            }
        }
        value.insert(n.name.clone(), data[1].clone());
    }
    if value.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(graph.len());
    for (i, raw, nb) in items {
        let Some(i) = i else {
            out.extend_from_slice(raw);
            continue;
        };
        let n = &nodes[i];
        let reads = n.inputs.iter().any(|x| {
            let (src, port) = fusion::source(x);
            !x.starts_with('^') && port == 0 && value.contains_key(src)
        });
        let waits = keep_alive.get(&i);
        if !reads && waits.is_none() {
            out.extend_from_slice(raw);
            continue;
        }
        let mut inputs: Vec<String> = n
            .inputs
            .iter()
            .map(|x| {
                let (src, port) = fusion::source(x);
                match value.get(src) {
                    Some(v) if !x.starts_with('^') && port == 0 => v.clone(),
                    _ => x.clone(),
                }
            })
            .collect();
        for w in waits.into_iter().flatten() {
            if !inputs.contains(w) {
                inputs.push(w.clone());
            }
        }
        out.extend_from_slice(&fusion::with_inputs(nb, &inputs)?);
    }
    Ok(Some(out))
}

/// With `TFWGPU_DUMP_GRAPHS=DIR`, writes each graph the optimizer is given (`in`) and returns
/// (`out`) as a serialized GraphDef, DIR/<n>-<which>.pb, and the names of the nodes to
/// preserve (`preserve`, one a line) (a debugging aid).
fn dump(which: &str, graph: &[u8]) {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Ok(dir) = std::env::var("TFWGPU_DUMP_GRAPHS") else {
        return;
    };
    let n = if which == "in" {
        COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    } else {
        COUNT
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(1)
    };
    let path = std::path::Path::new(&dir).join(format!("{n}-{which}.pb"));
    if let Err(e) = std::fs::write(&path, graph) {
        tracing::warn!("TFWGPU_DUMP_GRAPHS: {}: {e}", path.display());
    }
}

unsafe extern "C" fn optimize(
    _: *mut c_void,
    input: *const sys::TF_Buffer,
    item: *const sys::TF_GrapplerItem,
    output: *mut sys::TF_Buffer,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes the serialized input graph and an empty output buffer.
        let inb = unsafe { &*input };
        let graph = unsafe { std::slice::from_raw_parts(inb.data as *const u8, inb.length) };
        dump("in", graph);
        let fusing =
            fusion::enabled() && fusion::REGISTERED.load(std::sync::atomic::Ordering::Relaxed);
        let multi = fusing && fusion::multi_output();
        let epilogues =
            epilogue::enabled() && epilogue::REGISTERED.load(std::sync::atomic::Ordering::Relaxed);
        let preserve = if fusing || epilogues {
            // SAFETY: the item TensorFlow passed with the graph.
            unsafe { fusion::nodes_to_preserve(item) }?
        } else {
            Default::default()
        };
        if fusing {
            let mut names: Vec<&String> = preserve.iter().collect();
            names.sort();
            let list: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            dump("preserve", list.join("\n").as_bytes());
        }
        let mut cur: std::borrow::Cow<[u8]> = std::borrow::Cow::Borrowed(graph);
        // Keras's seed arithmetic to the host (its seed is read by the host every step).
        if pin::enabled()
            && let Some(g) = pin::pin_seed_chains(&cur)?
        {
            cur = g.into();
        }
        // Casts of the input pipeline's labels on the host.
        if pin::casts_enabled()
            && let Some(g) = pin::pin_host_casts(&cur)?
        {
            cur = g.into();
        }
        // int32 ops on GPU-computed tensors (Keras's argmax) on the device.
        if int32::enabled() {
            let dtype_of = |n: &Node, a: &str| {
                n.attr(a)
                    .and_then(|v| fusion::attr_varint(v, 6))
                    .and_then(|t| crate::nodedef::dtype_from_tf(t as u32))
            };
            let k = int32::Kernels {
                device_output: &|n| crate::kernels::device_kernel(&n.op, &|a| dtype_of(n, a)),
                labeled: &|n| crate::kernels::labeled_kernel(&n.op, &|a| dtype_of(n, a)),
            };
            if let Some(g) = int32::label_device_int32(&cur, &k)? {
                cur = g.into();
            }
        }
        // Logic of host values (a loop's condition) on the host, after the int32 pass.
        if host_logic::enabled()
            && let Some(g) =
                host_logic::label_host_logic(&cur, &crate::kernels::labeled_host_kernel)?
        {
            cur = g.into();
        }
        // Reads after assignments: before the AssignAdd rewrite (SGD's m is assigned, then
        // read by the variable's AssignAdd, whose read must not wait for m's read), and after
        // it (Adam's m and v are AssignAdds, then read by the variable's update).
        if multi && let Some(g) = forward_assigned_reads(&cur, &preserve)? {
            cur = g.into();
        }
        if let Some(g) = rewrite(&cur)? {
            cur = g.into();
        }
        if multi && let Some(g) = forward_assigned_reads(&cur, &preserve)? {
            cur = g.into();
        }
        if fusing && let Some(g) = fusion::fuse(&cur, &preserve, fusion::max_inputs())? {
            cur = g.into();
        }
        // A Conv2D or MatMul and the BiasAdd after it (that no group took): one node.
        if epilogues && let Some(g) = epilogue::bias_epilogues(&cur, &preserve)? {
            cur = g.into();
        }
        let bytes: &[u8] = &cur;
        dump("out", bytes);
        // SAFETY: a malloc'd copy owned by the output buffer, freed by its deallocator.
        unsafe {
            let p = libc::malloc(bytes.len().max(1)) as *mut u8;
            if p.is_null() {
                return Err(Error::OutOfMemory("graph rewrite".into()));
            }
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            let out = &mut *output;
            out.data = p as *const c_void;
            out.length = bytes.len();
            out.data_deallocator = Some(free_buffer);
        }
        Ok(())
    })
}

/// Entry point TensorFlow calls to register the plugin's graph optimizer.
///
/// # Safety
/// Called by TensorFlow with valid registration params.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn TF_InitGraph(
    params: *mut sys::TP_OptimizerRegistrationParams,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes valid params with structs to fill.
        let p = unsafe { &mut *params };
        p.struct_size = sys::sizes::tp_optimizer_registration_params();
        p.major_version = sys::GO_MAJOR as i32;
        p.minor_version = sys::GO_MINOR as i32;
        p.patch_version = sys::GO_PATCH as i32;
        p.device_type = c"GPU".as_ptr();
        let configs = unsafe { &mut *p.optimizer_configs };
        configs.struct_size = sys::sizes::tp_optimizer_configs();
        // TensorFlow's layout optimizer turns NHWC graphs on "GPU" devices into NCHW by
        // inserting Transpose nodes, and the remapper fuses ops into kernels (_FusedConv2D,
        // _FusedMatMul...) that only CUDA has: both would leave nodes without a kernel here.
        configs.layout_optimizer = sys::TF_TriState_TF_TriState_Off;
        configs.remapping = sys::TF_TriState_TF_TriState_Off;
        // The scoped allocator packs the inputs of collective reductions (MirroredStrategy's
        // all-reduce) into one buffer and then requires their producers to forward an input
        // buffer as output; the runtime's kernels always write a fresh output.
        configs.scoped_allocator_optimization = sys::TF_TriState_TF_TriState_Off;
        let opt = unsafe { &mut *p.optimizer };
        opt.struct_size = sys::sizes::tp_optimizer();
        opt.create_func = None;
        opt.optimize_func = Some(optimize);
        opt.destroy_func = None;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        name: &str,
        op: &str,
        inputs: &[&str],
        device: &str,
        attrs: Vec<(String, Vec<u8>)>,
    ) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: device.into(),
            attrs,
        }
    }

    #[test]
    fn reads_right_after_an_assignment_give_the_assigned_value() {
        let gpu = "/job:localhost/replica:0/task:0/device:GPU:0";
        let dt = || vec![("dtype".to_string(), type_attr(1))];
        let nodes = [
            node(
                "sub",
                "Sub",
                &["a", "b"],
                gpu,
                vec![("T".into(), type_attr(1))],
            ),
            node("assign", "AssignVariableOp", &["m", "sub", "^c"], gpu, dt()),
            node("read", "ReadVariableOp", &["m", "^assign"], gpu, dt()),
            node("add", "AssignAddVariableOp", &["var", "read:0"], gpu, dt()),
            // The function's control output: waits for the update of var only.
            node("done", "NoOp", &["^add"], gpu, vec![]),
            // Another handle, another control input, another dtype, another device: kept.
            node("r2", "ReadVariableOp", &["other", "^assign"], gpu, dt()),
            node("r3", "ReadVariableOp", &["m", "^assign", "^c"], gpu, dt()),
            node(
                "r4",
                "ReadVariableOp",
                &["m", "^assign"],
                gpu,
                vec![("dtype".into(), type_attr(19))],
            ),
            node(
                "r5",
                "ReadVariableOp",
                &["m", "^assign"],
                "/device:CPU:0",
                dt(),
            ),
            node("use", "Pack", &["r2", "r3", "r4", "r5"], gpu, vec![]),
            node("ret", "Identity", &["use"], gpu, vec![]),
        ];
        let encode = |nodes: &[Node]| {
            let mut g = vec![];
            for n in nodes {
                n.encode(&mut g);
            }
            g
        };
        let decode = |g: &[u8]| {
            let mut r = Reader::new(g);
            let mut got = vec![];
            while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
                got.push(Node::parse(b).unwrap());
            }
            got
        };
        let none = std::collections::HashSet::new();
        let got = decode(
            &forward_assigned_reads(&encode(&nodes), &none)
                .unwrap()
                .expect("rewritten"),
        );
        assert_eq!(got.len(), nodes.len());
        assert_eq!(got[2].inputs, ["m", "^assign"], "the read stays");
        assert_eq!(got[3].inputs, ["var", "sub"]);
        // What waits for the consumer waits for the read (and so for the assignment) too.
        assert_eq!(got[4].inputs, ["^add", "^read"]);
        assert_eq!(got[9].inputs, ["r2", "r3", "r4", "r5"]);
        // With the graph's control output (a preserved NoOp nothing depends on), that waits
        // for the read instead.
        let out: std::collections::HashSet<String> = ["done".to_string()].into();
        let got = decode(
            &forward_assigned_reads(&encode(&nodes), &out)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(got[3].inputs, ["var", "sub"]);
        assert_eq!(got[4].inputs, ["^add", "^read"]);
        let mut mid = nodes.to_vec();
        mid[3] = node("add", "Mul", &["read", "x"], gpu, vec![]);
        mid.insert(4, node("neg", "Neg", &["add"], gpu, vec![]));
        mid[5].inputs = vec!["^neg".into()];
        let got = decode(
            &forward_assigned_reads(&encode(&mid), &out)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(got[3].inputs, ["sub", "x"]);
        assert_eq!(got[4].inputs, ["add"], "not the consumer's consumer");
        assert_eq!(got[5].inputs, ["^neg", "^read"]);
        // A read that something waits for by a control edge, or that is fetched, stays
        // reachable by itself: no edge added.
        let mut waited = nodes.to_vec();
        waited.push(node("w", "NoOp", &["^read"], gpu, vec![]));
        let got = decode(
            &forward_assigned_reads(&encode(&waited), &none)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(
            (&got[3].inputs, &got[4].inputs),
            (
                &vec!["var".to_string(), "sub".into()],
                &vec!["^add".to_string()]
            )
        );
        let fetched: std::collections::HashSet<String> = ["read".to_string()].into();
        let got = decode(
            &forward_assigned_reads(&encode(&nodes), &fetched)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(got[4].inputs, ["^add"]);
        // A consumer nothing depends on: the read is not forwarded.
        let mut alone = nodes.to_vec();
        alone.remove(4);
        assert!(
            forward_assigned_reads(&encode(&alone), &none)
                .unwrap()
                .is_none()
        );
        // Nothing to forward: None.
        assert!(
            forward_assigned_reads(&encode(&nodes[5..]), &none)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn resource_gather_on_gpu_becomes_read_gather() {
        let gpu = "/job:localhost/replica:0/task:0/device:GPU:0";
        let mut g = vec![];
        node(
            "emb",
            "ResourceGather",
            &["table", "ids", "^init"],
            gpu,
            vec![
                ("dtype".into(), type_attr(1)),
                ("Tindices".into(), type_attr(3)),
                ("batch_dims".into(), int_attr(1)),
            ],
        )
        .encode(&mut g);
        node(
            "cpu",
            "ResourceGather",
            &["t", "i"],
            "/device:CPU:0",
            vec![],
        )
        .encode(&mut g);
        let out = rewrite(&g).unwrap().expect("rewritten");
        let mut r = Reader::new(&out);
        let mut nodes = vec![];
        while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
            nodes.push(Node::parse(b).unwrap());
        }
        let ops: Vec<_> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.op.as_str()))
            .collect();
        assert_eq!(
            ops,
            [
                ("emb/tfwgpu_read", "ReadVariableOp"),
                ("emb/tfwgpu_axis", "Const"),
                ("emb", "GatherV2"),
                ("cpu", "ResourceGather"),
            ]
        );
        assert_eq!(nodes[0].inputs, ["table", "^ids", "^init"]);
        assert_eq!(
            nodes[2].inputs,
            ["emb/tfwgpu_read", "ids", "emb/tfwgpu_axis"]
        );
        assert_eq!(nodes[2].attr("Tparams"), Some(type_attr(1).as_slice()));
        assert_eq!(nodes[2].attr("batch_dims").and_then(attr_int), Some(1));
        assert_eq!(
            nodes[1].attr("value"),
            Some(int32_scalar_attr(1).as_slice())
        );
    }

    #[test]
    fn assign_add_on_gpu_becomes_read_add_assign() {
        let mut dtype = vec![];
        varint(6 << 3, &mut dtype);
        varint(1, &mut dtype);
        let gpu = "/job:localhost/replica:0/task:0/device:GPU:0";
        let mut g = vec![];
        node("v", "VarHandleOp", &[], gpu, vec![]).encode(&mut g);
        node(
            "upd",
            "AssignAddVariableOp",
            &["v", "delta", "^prev"],
            gpu,
            vec![("dtype".into(), dtype.clone())],
        )
        .encode(&mut g);
        node(
            "cpu_upd",
            "AssignSubVariableOp",
            &["w", "d"],
            "/device:CPU:0",
            vec![("dtype".into(), dtype.clone())],
        )
        .encode(&mut g);
        // A non-node field (versions) is kept as it was.
        bytes_field(4, b"\x08\x01", &mut g);
        let out = rewrite(&g).unwrap().expect("rewritten");
        let mut r = Reader::new(&out);
        let mut nodes = vec![];
        let mut other = 0;
        while let Some((f, v)) = r.next().unwrap() {
            match (f, v) {
                (1, Field::Bytes(b)) => nodes.push(Node::parse(b).unwrap()),
                _ => other += 1,
            }
        }
        assert_eq!(other, 1);
        let ops: Vec<_> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.op.as_str()))
            .collect();
        assert_eq!(
            ops,
            [
                ("v", "VarHandleOp"),
                ("upd/tfwgpu_read", "ReadVariableOp"),
                ("upd/tfwgpu_addv2", "AddV2"),
                ("upd", "AssignVariableOp"),
                ("cpu_upd", "AssignSubVariableOp"),
            ]
        );
        assert_eq!(nodes[1].inputs, ["v", "^delta", "^prev"]);
        assert_eq!(nodes[2].inputs, ["upd/tfwgpu_read", "delta"]);
        assert_eq!(nodes[3].inputs, ["v", "upd/tfwgpu_addv2"]);
        assert_eq!(nodes[2].attr("T"), Some(dtype.as_slice()));
        assert!(
            rewrite(&out).unwrap().is_none(),
            "a rewritten graph needs nothing more"
        );
    }
}
