//! Logic of host values stays on the host.
//!
//! A `tf.while_loop` with `maximum_iterations` (Keras's recurrent layers, every
//! `tf.function` with a bounded loop) tests `LogicalAnd(Less(i, max), Less(t, n))` once per
//! iteration. The two comparisons are int32: TensorFlow computes them in host memory (its own
//! kernels, as on CUDA). `LogicalAnd` of bool has a device kernel here, so TensorFlow uploaded
//! both inputs, ran it on the GPU, and `LoopCond` (which takes its input in host memory) read
//! the result back: a read that waits for every GPU command recorded before it, once per
//! iteration (an LSTM over 20 timesteps: 21 of its 41 reads per training step).
//!
//! This pass labels such nodes (`_kernel` = [`LABEL`]), which selects the runtime's host
//! kernel registered under that label (`host_ops::LABELED_HOST_OPS`, every argument in host
//! memory): `LogicalAnd`, `LogicalOr` and `LogicalNot` on a tfwgpu GPU whose every data input
//! is a host-memory result: an int32 comparison the int32 pass left to TensorFlow's host kernel,
//! or another labeled node. Same values (exact boolean logic, the same broadcasting); a
//! consumer that needs the result on the device gets an upload, which does not wait for the
//! GPU. Run after the int32 pass (which moves comparisons of GPU-computed data to the device).
//!
//! `TFWGPU_HOST_LOGIC=0` turns the pass off (read each time a graph is optimized).

use std::collections::{HashMap, HashSet};

use tfwgpu_runtime::Result;

use super::fusion::{attr_varint, operands_all, source};
use super::{Node, on_tfwgpu_gpu};

/// The label of the runtime's labeled host kernels (TensorFlow's `_kernel` attribute).
pub const LABEL: &str = "tfwgpu_host";

/// The ops the pass labels.
const LOGIC: &[&str] = &["LogicalAnd", "LogicalOr", "LogicalNot"];

/// int32 comparisons, whose kernel on any device is TensorFlow's, in host memory.
const INT32_COMPARISONS: &[&str] = &[
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "Equal",
    "NotEqual",
];

const DT_INT32: u64 = 3;

pub fn enabled() -> bool {
    std::env::var("TFWGPU_HOST_LOGIC").map_or(true, |v| v.trim() != "0")
}

/// The rewritten graph, or `None` when no node qualifies. `registered(op)`: whether
/// TensorFlow accepted the op's labeled host kernel (it does not fall back from a labeled
/// lookup to an unlabeled one).
pub(super) fn label_host_logic(
    graph: &[u8],
    registered: &dyn Fn(&str) -> bool,
) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let labeled = plan(&nodes, registered);
    if labeled.is_empty() {
        return Ok(None);
    }
    Ok(Some(super::int32::with_label(&items, &labeled, LABEL)))
}

/// Whether `n`'s result is in host memory on a tfwgpu GPU: an int32 comparison with no
/// kernel label (the int32 pass labels those it sends to the device).
fn host_result(n: &Node) -> bool {
    on_tfwgpu_gpu(&n.device)
        && INT32_COMPARISONS.contains(&n.op.as_str())
        && n.attr("T").and_then(|t| attr_varint(t, 6)) == Some(DT_INT32)
        && n.attr("_kernel").is_none()
}

/// The nodes [`label_host_logic`] labels.
fn plan(nodes: &[Node], registered: &dyn Fn(&str) -> bool) -> HashSet<usize> {
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let n = &nodes[i];
            LOGIC.contains(&n.op.as_str())
                && on_tfwgpu_gpu(&n.device)
                && n.attr("_kernel").is_none()
                && registered(&n.op)
        })
        .collect();
    // Labeled nodes feed others (LogicalNot of a LogicalAnd).
    super::int32::grow(&candidates, |i, labeled| {
        let mut inputs = operands_all(&nodes[i]).peekable();
        inputs.peek().is_some()
            && inputs.all(|x| {
                by_name
                    .get(source(x).0)
                    .is_some_and(|&p| labeled.contains(&p) || host_result(&nodes[p]))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::super::type_attr;
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
    const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

    fn node(name: &str, op: &str, inputs: &[&str], t: Option<u64>, device: &str) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: device.into(),
            attrs: t.map(|t| ("T".into(), type_attr(t))).into_iter().collect(),
        }
    }

    fn labels<'a>(nodes: &'a [Node], registered: &dyn Fn(&str) -> bool) -> Vec<&'a str> {
        let mut v: Vec<&str> = plan(nodes, registered)
            .into_iter()
            .map(|i| nodes[i].name.as_str())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn loop_conditions_of_host_comparisons_are_labeled() {
        let i32 = Some(DT_INT32);
        let mut device_less = node("dless", "Less", &["i", "n"], i32, GPU);
        device_less
            .attrs
            .push(("_kernel".into(), super::super::fusion::str_attr("x")));
        let nodes = vec![
            node("i", "Merge", &["a", "b"], i32, GPU),
            node("n", "Const", &[], None, GPU),
            node("less", "Less", &["i", "n", "^ctl"], i32, GPU),
            node("less1", "Less", &["i", "n"], i32, GPU),
            // The loop's condition, and a chain on it.
            node("and", "LogicalAnd", &["less", "less1"], None, GPU),
            node("not", "LogicalNot", &["and"], None, GPU),
            // A float comparison is a device result: not labeled.
            node("x", "Placeholder", &[], None, GPU),
            node("fless", "Less", &["x", "x"], Some(1), GPU),
            node("mixed", "LogicalAnd", &["less", "fless"], None, GPU),
            // A comparison the int32 pass sent to the device: not a host result.
            device_less,
            node("dand", "LogicalOr", &["less", "dless"], None, GPU),
            // On the CPU: not ours.
            node("cpu", "LogicalAnd", &["less", "less1"], None, CPU),
            // Already labeled: stays.
            {
                let mut n = node("lab", "LogicalAnd", &["less", "less1"], None, GPU);
                n.attrs
                    .push(("_kernel".into(), super::super::fusion::str_attr("y")));
                n
            },
            // A bool from elsewhere (a device kernel): not labeled.
            node("b", "IsNan", &["x"], Some(1), GPU),
            node("orb", "LogicalOr", &["b", "less"], None, GPU),
        ];
        assert_eq!(labels(&nodes, &|_| true), ["and", "not"]);
        // Only the registered ops.
        assert_eq!(labels(&nodes, &|op| op == "LogicalAnd"), ["and"]);
    }

    #[test]
    fn labeled_graph_carries_the_host_label() {
        let nodes = vec![
            node("a", "Less", &[], Some(DT_INT32), GPU),
            node("b", "Less", &[], Some(DT_INT32), GPU),
            node("and", "LogicalAnd", &["a", "b"], None, GPU),
        ];
        let mut g = vec![];
        for n in &nodes {
            n.encode(&mut g);
        }
        let out = label_host_logic(&g, &|_| true).unwrap().unwrap();
        let (_, parsed) = super::super::split_graph(&out).unwrap();
        let and = parsed.iter().find(|n| n.name == "and").unwrap();
        assert_eq!(
            and.attr("_kernel").and_then(super::super::fusion::attr_str),
            Some(LABEL.as_bytes())
        );
        assert_eq!(
            (&and.inputs, &and.device),
            (&nodes[2].inputs, &nodes[2].device)
        );
        assert!(label_host_logic(&g, &|_| false).unwrap().is_none());
    }
}
