//! int32 ops on device tensors stay on the device.
//!
//! TensorFlow registers its own kernels for int32 arithmetic and comparisons on every device
//! (DEVICE_DEFAULT) with all arguments in host memory, as its CUDA build does: int32 is mostly
//! shape arithmetic, which the host needs. The plugin leaves those to TensorFlow
//! (`kernels::register_all`). But some int32 tensors are data computed on the GPU: Keras's
//! `argmax` (behind the `accuracy` metrics) tests the sign bit of every logit as
//! `Less(BitwiseAnd(Bitcast<int32>(x), INT_MIN), 0)`, where Bitcast and BitwiseAnd run on the
//! GPU. Feeding such a tensor to a host-memory kernel copies it to the host, and that read
//! waits for every GPU command recorded before it: in the middle of every training step, the
//! host stops until the GPU has run the forward pass, then the GPU idles while the host records
//! the backward pass.
//!
//! GatherV2 of int32 params is the same case the other way round: the runtime computes it on
//! the host (`host_ops`), since Keras's batch-norm moments and global pooling gather the reduced
//! dimensions of `Shape(x)` every step when the batch size is unknown, and a device kernel had
//! the GPU read that result back twice per layer and step; a gather of GPU-computed int32 data
//! keeps the device kernel through the label below.
//!
//! This pass labels such nodes (`_kernel` = [`LABEL`]), which selects the runtime's own kernel,
//! registered with that label and its data in device memory: an int32 node (by the op's type
//! attribute) of [`crate::kernels::DEVICE_INT32_OPS`] on a tfwgpu GPU at least one of whose
//! data inputs a device kernel on a tfwgpu GPU produces (or another labeled node). Its other
//! inputs are copied to the device by TensorFlow (uploads, which do not wait for the GPU); its
//! result stays there, where its consumers (LogicalAnd, Select...) read it. The values are the
//! same: the ops are exact integer arithmetic, comparisons and gathers (division, whose error
//! on a zero divisor the GPU cannot raise, is not among them); one difference: a labeled
//! GatherV2 gives zeros for an index out of range, as TensorFlow's GPU kernels do, where the
//! host kernel reports the error, as its CPU kernel does. A consumer that needs the result in
//! host memory still gets a copy, one read instead of the one before. Eager ops do not pass
//! through graph passes: eagerly, an int32 gather of GPU-computed data goes to the host.
//!
//! `TFWGPU_DEVICE_INT32=0` turns the pass off (read each time a graph is optimized).

use std::collections::{HashMap, HashSet};

use tfwgpu_runtime::{Registry, Result};

use super::fusion::{attr_varint, operands_all, source};
use super::{Node, bytes_field, on_tfwgpu_gpu};
use crate::kernels::DEVICE_INT32_OPS;

/// The label of the runtime's device-memory int32 kernels (TensorFlow's `_kernel` attribute).
pub const LABEL: &str = "tfwgpu_device_int32";

const DT_INT32: u64 = 3;

pub fn enabled() -> bool {
    std::env::var("TFWGPU_DEVICE_INT32").map_or(true, |v| v.trim() != "0")
}

/// What the pass asks of the kernel registry about a node.
pub(super) struct Kernels<'a> {
    /// Whether `n`'s kernel on a tfwgpu GPU is the runtime's, with its outputs in device memory.
    pub device_output: &'a dyn Fn(&Node) -> bool,
    /// Whether `n` would find the labeled device kernel (registered, its type attributes within
    /// the kernel's constraints): TensorFlow does not fall back to an unlabeled kernel.
    pub labeled: &'a dyn Fn(&Node) -> bool,
}

/// The rewritten graph, or `None` when no node qualifies.
pub(super) fn label_device_int32(graph: &[u8], k: &Kernels) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let labeled = plan(&nodes, k);
    if labeled.is_empty() {
        return Ok(None);
    }
    Ok(Some(with_label(&items, &labeled, LABEL)))
}

/// The graph of `items` with the attribute map entry `_kernel: label` appended to the bytes of
/// each node in `labeled` (every other field of those NodeDefs, and every other node, stays as
/// it was).
pub(super) fn with_label(
    items: &[(Option<usize>, &[u8], &[u8])],
    labeled: &HashSet<usize>,
    label: &str,
) -> Vec<u8> {
    let mut value = vec![];
    bytes_field(2, label.as_bytes(), &mut value);
    let mut entry = vec![];
    bytes_field(1, b"_kernel", &mut entry);
    bytes_field(2, &value, &mut entry);
    let size: usize = items.iter().map(|(_, raw, _)| raw.len()).sum();
    let mut out = Vec::with_capacity(size + 48 * labeled.len());
    for (i, raw, nb) in items {
        match *i {
            Some(i) if labeled.contains(&i) => {
                let mut b = nb.to_vec();
                bytes_field(5, &entry, &mut b);
                bytes_field(1, &b, &mut out);
            }
            _ => out.extend_from_slice(raw),
        }
    }
    out
}

/// The nodes [`label_device_int32`] labels.
fn plan(nodes: &[Node], k: &Kernels) -> HashSet<usize> {
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let candidate = |n: &Node| {
        DEVICE_INT32_OPS.contains(&n.op.as_str())
            && on_tfwgpu_gpu(&n.device)
            && Registry::global()
                .get(&n.op)
                .and_then(|def| n.attr(def.type_attr))
                .and_then(|t| attr_varint(t, 6))
                == Some(DT_INT32)
            && n.attr("_kernel").is_none()
            && (k.labeled)(n)
    };
    let candidates: Vec<usize> = (0..nodes.len()).filter(|&i| candidate(&nodes[i])).collect();
    // Labeled nodes feed others (a chain of int32 ops on a device tensor).
    grow(&candidates, |i, labeled| {
        operands_all(&nodes[i])
            .filter_map(|x| by_name.get(source(x).0).copied())
            .any(|p| {
                on_tfwgpu_gpu(&nodes[p].device)
                    && (labeled.contains(&p) || (k.device_output)(&nodes[p]))
            })
    })
}

/// The `candidates` that `admit` takes, given those taken so far, repeated until none joins
/// (a taken node can admit the candidates it feeds).
pub(super) fn grow(
    candidates: &[usize],
    admit: impl Fn(usize, &HashSet<usize>) -> bool,
) -> HashSet<usize> {
    let mut taken: HashSet<usize> = HashSet::new();
    loop {
        let before = taken.len();
        for &i in candidates {
            if !taken.contains(&i) && admit(i, &taken) {
                taken.insert(i);
            }
        }
        if taken.len() == before {
            return taken;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::type_attr;
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
    const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

    fn node(name: &str, op: &str, inputs: &[&str], t: u64, device: &str) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: device.into(),
            attrs: vec![("T".into(), type_attr(t))],
        }
    }

    fn gather(name: &str, params: &str, t: u64, ti: u64) -> Node {
        let mut n = node(name, "GatherV2", &[params, "one", "zero"], t, GPU);
        n.attrs = vec![
            ("Tparams".into(), type_attr(t)),
            ("Tindices".into(), type_attr(ti)),
        ];
        n
    }

    /// Stands for the kernel registry: Bitcast and BitwiseAnd are device kernels, Const and
    /// Shape are not (host memory for int32).
    fn device_output(n: &Node) -> bool {
        matches!(n.op.as_str(), "Bitcast" | "BitwiseAnd" | "ArgMax")
    }

    /// Stands for the registered labeled kernels: GatherV2's only with int32 or int64 indices.
    fn labeled(n: &Node) -> bool {
        n.op != "GatherV2" || n.attr("Tindices").and_then(|t| attr_varint(t, 6)) != Some(5)
    }

    const K: Kernels = Kernels {
        device_output: &device_output,
        labeled: &labeled,
    };

    fn labels(nodes: &[Node]) -> Vec<&str> {
        let mut v: Vec<&str> = plan(nodes, &K)
            .into_iter()
            .map(|i| nodes[i].name.as_str())
            .collect();
        v.sort();
        v
    }

    /// Keras's signbit: Less(BitwiseAnd(Bitcast(x), c), 0), then a chain fed by the label.
    #[test]
    fn comparisons_of_device_tensors_are_labeled() {
        let nodes = vec![
            node("x", "Placeholder", &[], 1, GPU),
            node("bits", "Bitcast", &["x"], 1, GPU),
            node("min", "Const", &[], DT_INT32, GPU),
            node("and", "BitwiseAnd", &["bits", "min"], DT_INT32, GPU),
            node("zero", "Const", &[], DT_INT32, GPU),
            node("less", "Less", &["and", "zero", "^x"], DT_INT32, GPU),
            node("shape", "Shape", &["x"], DT_INT32, GPU),
            node("one", "Const", &[], DT_INT32, GPU),
            // Shape arithmetic: both inputs in host memory; stays with TensorFlow.
            node("n", "Sub", &["shape", "one"], DT_INT32, GPU),
            // Fed by a labeled node only through a control edge: stays.
            node("ctl", "AddV2", &["shape", "one", "^and"], DT_INT32, GPU),
            // float: not an int32 op.
            node("f", "Less", &["x", "x"], 1, GPU),
            // int32 on the CPU device: stays.
            node("cpu", "Less", &["and", "zero"], DT_INT32, CPU),
            // A division is never labeled.
            node("div", "FloorDiv", &["and", "one"], DT_INT32, GPU),
            node("am", "ArgMax", &["x", "one"], 1, GPU),
            node("plus", "AddV2", &["am", "one"], DT_INT32, GPU),
            node("neg", "Neg", &["plus"], DT_INT32, GPU),
            // GatherV2's type attribute is Tparams: a shape's dimensions stay on the host, a
            // gather of GPU-computed int32 data does not.
            gather("dims", "shape", DT_INT32, DT_INT32),
            gather("picked", "am", DT_INT32, DT_INT32),
            gather("floats", "x", 1, DT_INT32),
            // int16 indices: no labeled kernel takes them, so no label (TensorFlow would find
            // no kernel at all).
            gather("int16", "am", DT_INT32, 5),
        ];
        assert_eq!(labels(&nodes), ["less", "neg", "picked", "plus"]);
    }

    #[test]
    fn labeled_graph_carries_the_kernel_label() {
        let nodes = vec![
            node("bits", "Bitcast", &[], 1, GPU),
            node("zero", "Const", &[], DT_INT32, GPU),
            node("less", "Less", &["bits", "zero"], DT_INT32, GPU),
        ];
        let mut g = vec![];
        for n in &nodes {
            n.encode(&mut g);
        }
        let out = label_device_int32(&g, &K).unwrap().unwrap();
        let (_, parsed) = super::super::split_graph(&out).unwrap();
        assert_eq!(parsed.len(), 3);
        let less = parsed.iter().find(|n| n.name == "less").unwrap();
        assert_eq!(
            less.attr("_kernel")
                .and_then(super::super::fusion::attr_str),
            Some(LABEL.as_bytes())
        );
        // Everything else of the node as it was.
        assert_eq!(
            (&less.op, &less.inputs, &less.device, less.attr("T")),
            (
                &nodes[2].op,
                &nodes[2].inputs,
                &nodes[2].device,
                nodes[2].attr("T")
            )
        );
        assert!(
            parsed
                .iter()
                .filter(|n| n.name != "less")
                .all(|n| n.attr("_kernel").is_none())
        );
        // Nothing to label: no rewrite.
        let mut g = vec![];
        nodes[1].encode(&mut g);
        assert!(label_device_int32(&g, &K).unwrap().is_none());
    }
}
