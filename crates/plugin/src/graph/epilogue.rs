//! A product and its bias in one node: a Conv2D (NHWC) or MatMul on a tfwgpu GPU whose only
//! consumer is a BiasAdd (NHWC) that no elementwise group took (after [`super::fusion`]; the
//! bias of a convolution that batch norm follows is already in the statistics' reduction)
//! becomes one `_TfwgpuConv2DBiasAdd` / `_TfwgpuMatMulBiasAdd` node: the BiasAdd's name
//! (its consumers, control edges and fetches find it), the product's inputs then the bias, the
//! product's attributes, both nodes' control inputs. Its kernel (the runtime's
//! kernels/fused/bias.rs) records the product's kernel, then adds the bias in place: the same
//! GPU work and bits, one kernel call of TensorFlow's executor (and one graph node) fewer. The
//! Keras CNN has two per step (its second convolution's and its dense layer's), in training
//! and in inference.
//!
//! Left alone: a product read by anything else or waited on by a control edge, nodes to
//! preserve, other dtypes than float32/float16, NCHW. `TFWGPU_BIAS_EPILOGUE=0` turns the pass
//! off (read each time a graph is optimized).

use std::collections::{HashMap, HashSet};
use std::ffi::CString;

use tfwgpu_runtime::Result;
use tfwgpu_runtime::kernels::fused::bias::{OP_CONV, OP_MATMUL};
use tfwgpu_sys as sys;

use super::fusion::{attr_str, attr_varint, source};
use super::{Node, on_tfwgpu_gpu};

use crate::status::Status;

/// Whether the pass runs (`TFWGPU_BIAS_EPILOGUE`, default on).
pub fn enabled() -> bool {
    std::env::var("TFWGPU_BIAS_EPILOGUE").map_or(true, |v| v.trim() != "0")
}

/// The attributes of the fused ops: the product's (those TensorFlow 2.21 declares).
const CONV_ATTRS: &[&str] = &[
    "T",
    "strides",
    "use_cudnn_on_gpu",
    "padding",
    "explicit_paddings",
    "data_format",
    "dilations",
];
const MATMUL_ATTRS: &[&str] = &["T", "transpose_a", "transpose_b", "grad_a", "grad_b"];

fn nhwc(n: &Node) -> bool {
    n.attr("data_format")
        .and_then(attr_str)
        .is_none_or(|f| f == b"NHWC")
}

fn float_t(n: &Node) -> Option<u64> {
    let t = attr_varint(n.attr("T")?, 6)?;
    matches!(t, 1 | 19).then_some(t)
}

/// The rewritten graph, or `None` when no product and bias qualify.
pub fn bias_epilogues(graph: &[u8], preserve: &HashSet<String>) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let pairs = plan(&nodes, preserve);
    if pairs.is_empty() {
        return Ok(None);
    }
    let dropped: HashSet<usize> = pairs.values().copied().collect();
    let mut out = Vec::with_capacity(graph.len());
    for (i, raw, _) in &items {
        let Some(i) = *i else {
            out.extend_from_slice(raw);
            continue;
        };
        if dropped.contains(&i) {
            continue;
        }
        match pairs.get(&i) {
            Some(&p) => fused_node(&nodes[i], &nodes[p]).encode(&mut out),
            None => out.extend_from_slice(raw),
        }
    }
    Ok(Some(out))
}

/// BiasAdd node -> its product node.
fn plan(nodes: &[Node], preserve: &HashSet<String>) -> HashMap<usize, usize> {
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    // Data consumers (with repeats) and whether a control edge waits on each node.
    let mut uses = vec![0usize; nodes.len()];
    let mut waited = vec![false; nodes.len()];
    for n in nodes {
        for i in &n.inputs {
            match i.strip_prefix('^') {
                Some(c) => {
                    if let Some(&p) = by_name.get(c) {
                        waited[p] = true;
                    }
                }
                None => {
                    if let Some(&p) = by_name.get(source(i).0) {
                        uses[p] += 1;
                    }
                }
            }
        }
    }
    let mut pairs = HashMap::new();
    for (b, n) in nodes.iter().enumerate() {
        if n.op != "BiasAdd" || !on_tfwgpu_gpu(&n.device) || !nhwc(n) {
            continue;
        }
        let Some(t) = float_t(n) else { continue };
        let mut data = n.inputs.iter().filter(|i| !i.starts_with('^'));
        let (Some(x), Some(_), None) = (data.next(), data.next(), data.next()) else {
            continue;
        };
        let (src, port) = source(x);
        let Some(&p) = by_name.get(src) else { continue };
        let prod = &nodes[p];
        let ok = port == 0
            && matches!(prod.op.as_str(), "Conv2D" | "MatMul")
            && prod.device == n.device
            && float_t(prod) == Some(t)
            && nhwc(prod)
            && uses[p] == 1
            && !waited[p]
            && !preserve.contains(&prod.name)
            && prod.inputs.iter().filter(|i| !i.starts_with('^')).count() == 2;
        if ok {
            pairs.insert(b, p);
        }
    }
    pairs
}

/// The fused node replacing BiasAdd `b` of product `p`.
fn fused_node(b: &Node, p: &Node) -> Node {
    let (op, keep) = if p.op == "Conv2D" {
        (OP_CONV, CONV_ATTRS)
    } else {
        (OP_MATMUL, MATMUL_ATTRS)
    };
    let data = |n: &Node| -> Vec<String> {
        n.inputs
            .iter()
            .filter(|i| !i.starts_with('^'))
            .cloned()
            .collect()
    };
    let bias = data(b)[1].clone();
    let mut inputs = data(p);
    inputs.push(bias);
    for c in p.inputs.iter().chain(&b.inputs) {
        if c.starts_with('^') && !inputs.contains(c) {
            inputs.push(c.clone());
        }
    }
    Node {
        name: b.name.clone(),
        op: op.into(),
        inputs,
        device: b.device.clone(),
        attrs: p
            .attrs
            .iter()
            .filter(|(k, _)| keep.contains(&k.as_str()))
            .cloned()
            .collect(),
    }
}

/// Registers the two ops with TensorFlow (their kernels come with the runtime's registry);
/// false if TensorFlow refused (the pass then stays off).
pub fn register_ops() -> bool {
    let c = |s: &str| CString::new(s).expect("no NUL");
    let conv: (&str, [&str; 3], Vec<&str>) = (
        OP_CONV,
        ["input: T", "filter: T", "bias: T"],
        vec![
            "T: {float, half}",
            "strides: list(int)",
            "use_cudnn_on_gpu: bool = true",
            "padding: {'SAME', 'VALID', 'EXPLICIT'}",
            "explicit_paddings: list(int) = []",
            "data_format: {'NHWC', 'NCHW'} = 'NHWC'",
            "dilations: list(int) = [1, 1, 1, 1]",
        ],
    );
    let matmul: (&str, [&str; 3], Vec<&str>) = (
        OP_MATMUL,
        ["a: T", "b: T", "bias: T"],
        vec![
            "transpose_a: bool = false",
            "transpose_b: bool = false",
            "T: {float, half}",
            "grad_a: bool = false",
            "grad_b: bool = false",
        ],
    );
    let st = Status::new();
    for (op, inputs, attrs) in [conv, matmul] {
        let name = c(op);
        let output = c("output: T");
        let inputs: Vec<CString> = inputs.iter().map(|s| c(s)).collect();
        let attrs: Vec<CString> = attrs.iter().map(|s| c(s)).collect();
        // SAFETY: plain calls into TensorFlow's op registration API with valid strings
        // (copied by the builder); the builder is consumed by TF_RegisterOpDefinition.
        unsafe {
            let b = sys::TF_NewOpDefinitionBuilder(name.as_ptr());
            for i in &inputs {
                sys::TF_OpDefinitionBuilderAddInput(b, i.as_ptr());
            }
            sys::TF_OpDefinitionBuilderAddOutput(b, output.as_ptr());
            for a in &attrs {
                sys::TF_OpDefinitionBuilderAddAttr(b, a.as_ptr());
            }
            sys::TF_OpDefinitionBuilderSetShapeInferenceFunction(
                b,
                Some(super::fusion::unknown_shape_fn),
            );
            sys::TF_RegisterOpDefinition(b, st.0);
        }
        if let Err(e) = st.check("registering a product-and-bias op") {
            tracing::warn!("{op} not registered, bias epilogues are off: {e}");
            return false;
        }
    }
    true
}

/// Whether the ops are registered (the pass runs only then).
pub static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::super::{bytes_field, type_attr};
    use super::*;
    use crate::nodedef::{Field, Reader};

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

    fn node(name: &str, op: &str, inputs: &[&str]) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: GPU.into(),
            attrs: vec![("T".into(), type_attr(1))],
        }
    }

    fn str_attr(s: &str) -> Vec<u8> {
        let mut v = vec![];
        bytes_field(2, s.as_bytes(), &mut v);
        v
    }

    fn rewrite(nodes: &[Node], preserve: &[&str]) -> Option<Vec<Node>> {
        let mut g = vec![];
        for n in nodes {
            n.encode(&mut g);
        }
        let keep = preserve.iter().map(|s| s.to_string()).collect();
        bias_epilogues(&g, &keep).unwrap().map(|out| {
            let mut r = Reader::new(&out);
            let mut v = vec![];
            while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
                v.push(Node::parse(b).unwrap());
            }
            v
        })
    }

    #[test]
    fn conv_and_dense_biases_join_their_products() {
        let mut conv = node("conv", "Conv2D", &["x", "w", "^ctl_a"]);
        conv.attrs.push(("padding".into(), str_attr("VALID")));
        conv.attrs.push(("_output_shapes".into(), vec![]));
        let nodes = vec![
            conv,
            node("bias", "BiasAdd", &["conv", "b", "^ctl_b"]),
            node("pool", "AvgPool", &["bias"]),
            node("mm", "MatMul", &["h", "k"]),
            node("dense", "BiasAdd", &["mm", "c"]),
            node(
                "xent",
                "SparseSoftmaxCrossEntropyWithLogits",
                &["dense", "y"],
            ),
        ];
        let out = rewrite(&nodes, &[]).expect("rewritten");
        let ops: Vec<(&str, &str)> = out
            .iter()
            .map(|n| (n.name.as_str(), n.op.as_str()))
            .collect();
        assert_eq!(
            ops,
            [
                ("bias", OP_CONV),
                ("pool", "AvgPool"),
                ("dense", OP_MATMUL),
                ("xent", "SparseSoftmaxCrossEntropyWithLogits")
            ]
        );
        assert_eq!(out[0].inputs, ["x", "w", "b", "^ctl_a", "^ctl_b"]);
        let keys: Vec<&str> = out[0].attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["T", "padding"]);
        assert_eq!(out[2].inputs, ["h", "k", "c"]);
    }

    #[test]
    fn products_used_elsewhere_waited_on_or_kept_stay() {
        let base = || {
            vec![
                node("conv", "Conv2D", &["x", "w"]),
                node("bias", "BiasAdd", &["conv", "b"]),
            ]
        };
        let mut used = base();
        used.push(node("other", "Relu", &["conv"]));
        assert!(rewrite(&used, &[]).is_none());
        let mut waited = base();
        waited.push(node("after", "NoOp", &["^conv"]));
        assert!(rewrite(&waited, &[]).is_none());
        assert!(rewrite(&base(), &["conv"]).is_none());
        let mut nchw = base();
        nchw[0].attrs.push(("data_format".into(), str_attr("NCHW")));
        assert!(rewrite(&nchw, &[]).is_none());
        let mut f64s = base();
        for n in &mut f64s {
            n.attrs = vec![("T".into(), type_attr(2))];
        }
        assert!(rewrite(&f64s, &[]).is_none());
        assert!(rewrite(&base(), &[]).is_some());
    }
}
