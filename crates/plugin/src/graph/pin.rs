//! Seed arithmetic on the host: Keras's random layers (Dropout, the `SeedGenerator`) keep their
//! seed state in a tiny int64 variable on the device and, every step, compute the next state
//! (`AddV2(state, [0, 1])` assigned back) and the op's seed (`Cast<int32>(FloorMod(state,
//! 2^31 - 2))`), which the stateless random op takes in host memory
//! (`StatelessRandomGetKeyCounter`'s `seed`, as TensorFlow's own GPU kernels register it).
//! Placed on the GPU, that seed is a kernel output the host must read back mid-step: a read
//! waits for every GPU command queued before it, so once the step's device sync no longer
//! waits for the GPU (`se::ordered_sync`), this read does, at the very start of the next step
//! (the seed chain is ready first), and the host and the GPU no longer overlap.
//!
//! This pass moves such chains to the host's CPU device: integer elementwise nodes on a
//! tfwgpu GPU (AddV2, Sub, Mul, FloorMod, FloorDiv, Maximum, Minimum, Identity on int64; Cast
//! from int64 to int32/int64) whose data inputs are reads of small int64 variables (at most
//! [`MAX_ELEMENTS`] elements, from the handle's `_handle_shapes` or `shape`), small integer
//! constants or other such nodes, and whose data consumers are such nodes, host-memory seed
//! inputs of stateless random ops, or assignments to variables whose reads feed those seeds.
//! The constants they read move along (or get a host copy when the GPU uses them too). Then:
//! the new state is computed on the host and uploaded for the assignment, which adopts the
//! uploaded buffer; the next step's read of the state is a copy of host-written bytes, which the
//! runtime's host mirror answers without waiting for the GPU; the seed never leaves the host.
//! The values are the same (the same integer ops on the same inputs).
//!
//! `TFWGPU_PIN_SEEDS=0` turns the pass off (read each time a graph is optimized).

use std::collections::{HashMap, HashSet};

use tfwgpu_runtime::Result;

use super::fusion::{const_ints, source};
use super::{Node, on_tfwgpu_gpu};
use crate::nodedef::{Field, Reader};

const DT_INT32: u64 = 3;
const DT_INT64: u64 = 9;

/// The most elements of a variable or constant the pass moves to the host.
pub const MAX_ELEMENTS: u64 = 16;

/// Integer elementwise ops the pass moves (and their data-input count).
const ARITH: &[(&str, usize)] = &[
    ("AddV2", 2),
    ("Add", 2),
    ("Sub", 2),
    ("Mul", 2),
    ("FloorMod", 2),
    ("FloorDiv", 2),
    ("Maximum", 2),
    ("Minimum", 2),
    ("Identity", 1),
    ("Cast", 1),
];

/// Ops that take a seed in host memory, and the seed's input index.
const HOST_SEED: &[(&str, usize)] = &[
    ("StatelessRandomGetKeyCounter", 0),
    ("StatelessRandomGetKeyCounterAlg", 0),
    ("StatelessRandomUniform", 1),
    ("StatelessRandomNormal", 1),
    ("StatelessTruncatedNormal", 1),
    ("StatelessRandomUniformInt", 1),
    ("StatelessRandomUniformFullInt", 1),
];

/// Whether the pass runs (`TFWGPU_PIN_SEEDS`, default on; read each time a graph is optimized).
pub fn enabled() -> bool {
    std::env::var("TFWGPU_PIN_SEEDS").map_or(true, |v| v.trim() != "0")
}

fn attr_type(n: &Node, key: &str) -> Option<u64> {
    let mut r = Reader::new(n.attr(key)?);
    while let Some((f, v)) = r.next().ok()? {
        if let (6, Field::Varint(t)) = (f, v) {
            return Some(t);
        }
    }
    None
}

/// Elements of a TensorShapeProto, when every dimension is known.
fn shape_elements(shape: &[u8]) -> Option<u64> {
    let mut count: u64 = 1;
    let mut r = Reader::new(shape);
    while let Some((f, v)) = r.next().ok()? {
        match (f, v) {
            (2, Field::Bytes(dim)) => {
                let mut dr = Reader::new(dim);
                let mut size = 0u64;
                while let Some((f, v)) = dr.next().ok()? {
                    if let (1, Field::Varint(x)) = (f, v) {
                        size = x;
                    }
                }
                // An unknown dimension is -1 (a huge varint).
                if size > u32::MAX as u64 {
                    return None;
                }
                count = count.checked_mul(size)?;
            }
            (3, Field::Varint(1)) => return None, // unknown_rank
            _ => {}
        }
    }
    Some(count)
}

/// Elements of the variable behind a resource handle node: a function's `_Arg` with one
/// `_handle_shapes` entry, or a `VarHandleOp`'s `shape`.
fn handle_elements(n: &Node) -> Option<u64> {
    if n.op == "VarHandleOp" {
        let mut r = Reader::new(n.attr("shape")?);
        while let Some((f, v)) = r.next().ok()? {
            if let (7, Field::Bytes(s)) = (f, v) {
                return shape_elements(s);
            }
        }
        return None;
    }
    let mut r = Reader::new(n.attr("_handle_shapes")?);
    let list = loop {
        match r.next().ok()?? {
            (1, Field::Bytes(l)) => break l,
            _ => continue,
        }
    };
    let mut shapes = vec![];
    let mut lr = Reader::new(list);
    while let Some((f, v)) = lr.next().ok()? {
        if let (7, Field::Bytes(s)) = (f, v) {
            shapes.push(shape_elements(s));
        }
    }
    match shapes.as_slice() {
        [one] => *one,
        _ => None,
    }
}

/// The CPU device of the host of a placed device name.
fn host_device(device: &str) -> String {
    match device.rfind("device:") {
        Some(i) => format!("{}device:CPU:0", &device[..i]),
        None => "/device:CPU:0".into(),
    }
}

fn data_inputs(n: &Node) -> impl Iterator<Item = (usize, &String)> {
    n.inputs.iter().filter(|i| !i.starts_with('^')).enumerate()
}

/// The rewritten graph, or `None` when no chain qualifies.
pub fn pin_seed_chains(graph: &[u8]) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let Some(plan) = plan(&nodes) else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(graph.len() + 512);
    for (i, raw, _) in &items {
        let Some(i) = *i else {
            out.extend_from_slice(raw);
            continue;
        };
        if let Some(n) = plan.replaced.get(&i) {
            n.encode(&mut out);
            if let Some(copy) = plan.host_copies.get(&i) {
                copy.encode(&mut out);
            }
        } else {
            out.extend_from_slice(raw);
        }
    }
    Ok(Some(out))
}

struct Plan {
    /// Nodes whose encoding changes (moved to the host, or inputs rewired to a host copy).
    replaced: HashMap<usize, Node>,
    /// Host copies of constants the GPU still uses, written after the original.
    host_copies: HashMap<usize, Node>,
}

fn plan(nodes: &[Node]) -> Option<Plan> {
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let src = |input: &str| by_name.get(source(input).0).copied();
    // A read of a small int64 variable on a tfwgpu GPU: the handle node it reads.
    let var_read = |i: usize| -> Option<usize> {
        let n = &nodes[i];
        if n.op != "ReadVariableOp" || !on_tfwgpu_gpu(&n.device) {
            return None;
        }
        if attr_type(n, "dtype") != Some(DT_INT64) {
            return None;
        }
        let h = src(data_inputs(n).next()?.1)?;
        (handle_elements(&nodes[h])? <= MAX_ELEMENTS).then_some(h)
    };
    let small_const = |i: usize| -> bool {
        let n = &nodes[i];
        n.op == "Const"
            && on_tfwgpu_gpu(&n.device)
            && matches!(attr_type(n, "dtype"), Some(DT_INT32 | DT_INT64))
            && const_ints(nodes, &by_name, &n.name).is_some_and(|v| v.len() as u64 <= MAX_ELEMENTS)
    };
    let arith = |i: usize| -> bool {
        let n = &nodes[i];
        if !on_tfwgpu_gpu(&n.device) {
            return false;
        }
        let Some(&(_, arity)) = ARITH.iter().find(|(op, _)| *op == n.op) else {
            return false;
        };
        if data_inputs(n).count() != arity {
            return false;
        }
        if n.op == "Cast" {
            attr_type(n, "SrcT") == Some(DT_INT64)
                && matches!(attr_type(n, "DstT"), Some(DT_INT32 | DT_INT64))
        } else {
            attr_type(n, "T") == Some(DT_INT64)
        }
    };
    // Data consumers: (consumer, input index among its data inputs).
    let mut consumers: Vec<Vec<(usize, usize)>> = vec![vec![]; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        for (k, i) in data_inputs(n) {
            if let Some(p) = src(i) {
                consumers[p].push((c, k));
            }
        }
    }
    // Forward: arithmetic computed from small variable reads and constants only.
    let mut pinned: HashSet<usize> = HashSet::new();
    loop {
        let before = pinned.len();
        for (i, n) in nodes.iter().enumerate() {
            if pinned.contains(&i) || !arith(i) {
                continue;
            }
            let ok = data_inputs(n).all(|(_, x)| {
                src(x)
                    .is_some_and(|s| pinned.contains(&s) || var_read(s).is_some() || small_const(s))
            });
            if ok {
                pinned.insert(i);
            }
        }
        if pinned.len() == before {
            break;
        }
    }
    let host_seed = |c: usize, k: usize| {
        HOST_SEED
            .iter()
            .any(|&(op, idx)| nodes[c].op == op && idx == k && on_tfwgpu_gpu(&nodes[c].device))
    };
    let assign = |c: usize, k: usize| {
        nodes[c].op == "AssignVariableOp" && k == 1 && on_tfwgpu_gpu(&nodes[c].device)
    };
    // Backward: every consumer is pinned, a host-memory seed or an assignment.
    loop {
        let drop: Vec<usize> = pinned
            .iter()
            .copied()
            .filter(|&i| {
                consumers[i].is_empty()
                    || consumers[i]
                        .iter()
                        .any(|&(c, k)| !(pinned.contains(&c) || host_seed(c, k) || assign(c, k)))
            })
            .collect();
        if drop.is_empty() {
            break;
        }
        for i in drop {
            pinned.remove(&i);
        }
    }
    if pinned.is_empty() {
        return None;
    }
    // Components (over data edges between pinned nodes); keep those that feed a seed, and
    // those that assign a variable whose reads such a component takes.
    let mut comp: HashMap<usize, usize> = HashMap::new();
    let mut order: Vec<usize> = pinned.iter().copied().collect();
    order.sort_unstable();
    for &i in &order {
        if comp.contains_key(&i) {
            continue;
        }
        let mut stack = vec![i];
        comp.insert(i, i);
        while let Some(x) = stack.pop() {
            let ups = data_inputs(&nodes[x]).filter_map(|(_, s)| src(s));
            let downs = consumers[x].iter().map(|&(c, _)| c);
            for y in ups.chain(downs).collect::<Vec<_>>() {
                if pinned.contains(&y) && !comp.contains_key(&y) {
                    comp.insert(y, i);
                    stack.push(y);
                }
            }
        }
    }
    let mut seeds: HashSet<usize> = HashSet::new(); // components that feed a host seed
    for &i in &order {
        if consumers[i].iter().any(|&(c, k)| host_seed(c, k)) {
            seeds.insert(comp[&i]);
        }
    }
    // Variables whose reads those components take.
    let mut seed_vars: HashSet<usize> = HashSet::new();
    for &i in &order {
        if seeds.contains(&comp[&i]) {
            for (_, x) in data_inputs(&nodes[i]) {
                if let Some(h) = src(x).and_then(var_read) {
                    seed_vars.insert(h);
                }
            }
        }
    }
    let mut keep: HashSet<usize> = seeds.clone();
    for &i in &order {
        for &(c, k) in &consumers[i] {
            if assign(c, k)
                && data_inputs(&nodes[c])
                    .next()
                    .and_then(|(_, h)| src(h))
                    .is_some_and(|h| seed_vars.contains(&h))
            {
                keep.insert(comp[&i]);
            }
        }
    }
    let moved: Vec<usize> = order
        .iter()
        .copied()
        .filter(|i| keep.contains(&comp[i]))
        .collect();
    if moved.is_empty() {
        return None;
    }
    let moved_set: HashSet<usize> = moved.iter().copied().collect();
    let mut replaced: HashMap<usize, Node> = HashMap::new();
    let mut host_copies: HashMap<usize, Node> = HashMap::new();
    // Constants: moved when only moved nodes use them, else copied to the host.
    let mut const_host_name: HashMap<usize, String> = HashMap::new();
    for &i in &moved {
        for (_, x) in data_inputs(&nodes[i]) {
            let Some(s) = src(x) else { continue };
            if !small_const(s) || const_host_name.contains_key(&s) {
                continue;
            }
            let all_moved = consumers[s].iter().all(|(c, _)| moved_set.contains(c));
            let controls = nodes.iter().any(|n| {
                n.inputs
                    .iter()
                    .any(|x| x.strip_prefix('^') == Some(&nodes[s].name))
            });
            let mut c = nodes[s].clone();
            c.device = host_device(&nodes[s].device);
            if all_moved && !controls {
                const_host_name.insert(s, c.name.clone());
                replaced.insert(s, c);
            } else {
                c.name = format!("{}/tfwgpu_on_host", nodes[s].name);
                // A Const with control inputs keeps them (it runs in the same frame).
                const_host_name.insert(s, c.name.clone());
                host_copies.insert(s, c);
                replaced.insert(s, nodes[s].clone());
            }
        }
    }
    for &i in &moved {
        let mut n = nodes[i].clone();
        n.device = host_device(&n.device);
        for x in n.inputs.iter_mut() {
            if x.starts_with('^') {
                continue;
            }
            if let Some(s) = src(x)
                && let Some(h) = const_host_name.get(&s)
            {
                *x = h.clone();
            }
        }
        replaced.insert(i, n);
    }
    Some(Plan {
        replaced,
        host_copies,
    })
}

/// Whether [`pin_host_casts`] runs (`TFWGPU_PIN_CASTS`, default on; read each time a graph
/// is optimized).
pub fn casts_enabled() -> bool {
    std::env::var("TFWGPU_PIN_CASTS").map_or(true, |v| v.trim() != "0")
}

/// TensorFlow's integer types a cast the host feeds may start from (labels, indices: small
/// tensors; image batches are uint8 or float, whose casts stay on the GPU).
const HOST_CAST_SRC: &[u64] = &[DT_INT32, DT_INT64];

/// Casts of host data on the host: a `Cast` on a tfwgpu GPU whose input comes from the host's
/// CPU device (the input pipeline's `IteratorGetNext`) and is int32 or int64, and the `Cast`s
/// that only such casts feed, move to the host's CPU device. Keras's sparse cross-entropy
/// casts its int32 labels to float32 and then to int64 (two kernel calls on the device every
/// step): on the host, TensorFlow's CPU kernels cast them, and the int64 labels are copied to
/// the device instead of the int32 ones (one copy either way). The values are the same (the
/// same casts).
///
/// The rewritten graph, or `None` when no such cast is on a tfwgpu GPU.
pub fn pin_host_casts(graph: &[u8]) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let moved = host_cast_plan(&nodes);
    if moved.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(graph.len() + 64);
    for (i, raw, _) in &items {
        match *i {
            Some(i) if moved.contains(&i) => {
                let mut n = nodes[i].clone();
                n.device = host_device(&n.device);
                n.encode(&mut out);
            }
            _ => out.extend_from_slice(raw),
        }
    }
    Ok(Some(out))
}

/// The casts [`pin_host_casts`] moves.
fn host_cast_plan(nodes: &[Node]) -> HashSet<usize> {
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let cast_input = |n: &Node| -> Option<usize> {
        if n.op != "Cast" || !on_tfwgpu_gpu(&n.device) {
            return None;
        }
        let mut data = data_inputs(n);
        let (_, x) = data.next()?;
        if data.next().is_some() {
            return None;
        }
        by_name.get(source(x).0).copied()
    };
    let mut moved: HashSet<usize> = HashSet::new();
    // First casts: fed by a node on the host (not a GPU), from int32 or int64.
    for (i, n) in nodes.iter().enumerate() {
        if let Some(p) = cast_input(n)
            && !on_tfwgpu_gpu(&nodes[p].device)
            && !nodes[p].device.is_empty()
            && attr_type(n, "SrcT").is_some_and(|t| HOST_CAST_SRC.contains(&t))
        {
            moved.insert(i);
        }
    }
    // Then casts that a moved cast feeds, when that cast feeds only casts (otherwise the
    // first cast's result goes to the device anyway, and so may the rest of the chain).
    let mut consumers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        for (_, x) in data_inputs(n) {
            if let Some(&p) = by_name.get(source(x).0) {
                consumers[p].push(c);
            }
        }
    }
    loop {
        let before = moved.len();
        for (i, n) in nodes.iter().enumerate() {
            if moved.contains(&i) {
                continue;
            }
            if let Some(p) = cast_input(n)
                && moved.contains(&p)
                && consumers[p].iter().all(|&c| nodes[c].op == "Cast")
            {
                moved.insert(i);
            }
        }
        if moved.len() == before {
            break;
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::super::{bytes_field, type_attr, varint};
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
    const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

    fn node(name: &str, op: &str, inputs: &[&str], attrs: Vec<(&str, Vec<u8>)>) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: GPU.into(),
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    fn shape(dims: &[i64]) -> Vec<u8> {
        let mut s = vec![];
        for &d in dims {
            let mut dim = vec![];
            varint(1 << 3, &mut dim);
            varint(d as u64, &mut dim);
            bytes_field(2, &dim, &mut s);
        }
        s
    }

    /// A resource `_Arg` of an int64 variable of shape `dims`.
    fn var_arg(name: &str, dims: &[i64]) -> Node {
        let mut list = vec![];
        bytes_field(7, &shape(dims), &mut list);
        let mut shapes = vec![];
        bytes_field(1, &list, &mut shapes);
        node(
            name,
            "_Arg",
            &[],
            vec![("T", type_attr(20)), ("_handle_shapes", shapes)],
        )
    }

    fn int64_const(name: &str, vals: &[i64]) -> Node {
        let mut t = vec![];
        varint(1 << 3, &mut t);
        varint(DT_INT64, &mut t);
        bytes_field(2, &shape(&[vals.len() as i64]), &mut t);
        let content: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes_field(4, &content, &mut t);
        let mut value = vec![];
        bytes_field(8, &t, &mut value);
        node(
            name,
            "Const",
            &[],
            vec![("dtype", type_attr(DT_INT64)), ("value", value)],
        )
    }

    fn i64op(name: &str, op: &str, inputs: &[&str]) -> Node {
        node(name, op, inputs, vec![("T", type_attr(DT_INT64))])
    }

    fn read(name: &str, handle: &str) -> Node {
        node(
            name,
            "ReadVariableOp",
            &[handle],
            vec![("dtype", type_attr(DT_INT64))],
        )
    }

    /// Keras's dropout seed: the state read twice, the next state assigned, the seed cast to
    /// int32 for StatelessRandomGetKeyCounter; `state_dims` is the variable's shape.
    fn seed_graph(state_dims: &[i64]) -> Vec<Node> {
        vec![
            var_arg("state", state_dims),
            read("read_a", "state"),
            int64_const("one", &[0, 1]),
            i64op("next", "AddV2", &["read_a", "one"]),
            node(
                "assign",
                "AssignVariableOp",
                &["state", "next", "^read_s"],
                vec![("dtype", type_attr(DT_INT64))],
            ),
            read("read_s", "state"),
            i64op("mul", "Identity", &["read_s"]),
            int64_const("m", &[2147483646]),
            i64op("mod", "FloorMod", &["mul", "m"]),
            node(
                "cast",
                "Cast",
                &["mod"],
                vec![("SrcT", type_attr(DT_INT64)), ("DstT", type_attr(DT_INT32))],
            ),
            node(
                "keycounter",
                "StatelessRandomGetKeyCounter",
                &["cast"],
                vec![],
            ),
        ]
    }

    fn moved(nodes: &[Node]) -> Vec<String> {
        let Some(p) = plan(nodes) else {
            return vec![];
        };
        let mut v: Vec<String> = p
            .replaced
            .values()
            .chain(p.host_copies.values())
            .filter(|n| n.device == CPU)
            .map(|n| n.name.clone())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn keras_seed_arithmetic_moves_to_the_host() {
        let nodes = seed_graph(&[2]);
        assert_eq!(
            moved(&nodes),
            ["cast", "m", "mod", "mul", "next", "one"].map(String::from)
        );
        // The reads, the assignment and the random op stay on the GPU.
        let p = plan(&nodes).expect("a plan");
        for i in [1, 4, 5, 10] {
            assert!(!p.replaced.contains_key(&i), "{}", nodes[i].name);
        }
        // The rewritten graph parses back with the new devices and the same edges.
        let mut g = vec![];
        for n in &nodes {
            n.encode(&mut g);
        }
        let out = pin_seed_chains(&g).unwrap().expect("rewritten");
        let mut r = Reader::new(&out);
        let mut back = vec![];
        while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
            back.push(Node::parse(b).unwrap());
        }
        assert_eq!(back.len(), nodes.len());
        for (a, b) in nodes.iter().zip(&back) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.inputs, b.inputs);
            let host = ["cast", "m", "mod", "mul", "next", "one"].contains(&a.name.as_str());
            assert_eq!(b.device, if host { CPU } else { GPU }, "{}", a.name);
        }
    }

    #[test]
    fn large_or_unknown_variables_stay_on_the_gpu() {
        assert!(moved(&seed_graph(&[4096])).is_empty());
        assert!(moved(&seed_graph(&[-1, 2])).is_empty());
    }

    #[test]
    fn chains_with_a_gpu_consumer_stay_on_the_gpu() {
        let mut nodes = seed_graph(&[2]);
        // The seed is also used by a kernel on the GPU (not a host-memory input).
        nodes.push(i64op("other", "Mul", &["cast", "cast"]));
        let m = moved(&nodes);
        assert!(!m.contains(&"cast".to_string()), "{m:?}");
        assert!(!m.contains(&"mod".to_string()), "{m:?}");
        // With no seed left to feed, the state update stays too.
        assert!(m.is_empty(), "{m:?}");
    }

    #[test]
    fn a_counter_nobody_reads_on_the_host_stays_on_the_gpu() {
        // An iteration counter: read, incremented, assigned; no seed reads the variable.
        let nodes = vec![
            var_arg("iterations", &[]),
            read("r", "iterations"),
            int64_const("one", &[1]),
            i64op("inc", "AddV2", &["r", "one"]),
            node(
                "assign",
                "AssignVariableOp",
                &["iterations", "inc"],
                vec![("dtype", type_attr(DT_INT64))],
            ),
        ];
        assert!(moved(&nodes).is_empty());
    }

    #[test]
    fn a_constant_the_gpu_also_uses_gets_a_host_copy() {
        let mut nodes = seed_graph(&[2]);
        nodes.push(i64op("gpu_use", "Mul", &["m", "m"]));
        nodes.push(node("sink", "_Retval", &["gpu_use"], vec![]));
        let p = plan(&nodes).expect("a plan");
        let m_index = nodes.iter().position(|n| n.name == "m").unwrap();
        let copy = p.host_copies.get(&m_index).expect("host copy of m");
        assert_eq!(copy.device, CPU);
        assert_eq!(copy.name, "m/tfwgpu_on_host");
        assert_eq!(p.replaced[&m_index].device, GPU);
        let mod_index = nodes.iter().position(|n| n.name == "mod").unwrap();
        assert_eq!(p.replaced[&mod_index].inputs, ["mul", "m/tfwgpu_on_host"]);
    }

    fn cast(name: &str, input: &str, src: u64, dst: u64) -> Node {
        node(
            name,
            "Cast",
            &[input],
            vec![("SrcT", type_attr(src)), ("DstT", type_attr(dst))],
        )
    }

    #[test]
    fn label_casts_of_host_data_move_to_the_host() {
        let mut it = node("IteratorGetNext", "IteratorGetNext", &["iterator"], vec![]);
        it.device = CPU.into();
        let nodes = vec![
            it,
            cast("Cast", "IteratorGetNext:1", DT_INT32, 1),
            cast("Cast_1", "Cast", 1, DT_INT64),
            node(
                "xent",
                "SparseSoftmaxCrossEntropyWithLogits",
                &["logits", "Cast_1"],
                vec![],
            ),
            // An image batch cast (uint8) stays on the GPU.
            cast("image", "IteratorGetNext", 4, 1),
            // A cast of a GPU tensor stays.
            cast("other", "xent", 1, DT_INT64),
        ];
        assert_eq!(host_cast_plan(&nodes), HashSet::from([1, 2]));
        let mut g = vec![];
        for n in &nodes {
            n.encode(&mut g);
        }
        let out = pin_host_casts(&g).unwrap().expect("rewritten");
        let mut r = Reader::new(&out);
        let mut back = vec![];
        while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
            back.push(Node::parse(b).unwrap());
        }
        let devices: Vec<&str> = back.iter().map(|n| n.device.as_str()).collect();
        assert_eq!(devices, [CPU, CPU, CPU, GPU, GPU, GPU]);
        for (a, b) in nodes.iter().zip(&back) {
            assert_eq!((&a.name, &a.op, &a.inputs), (&b.name, &b.op, &b.inputs));
        }
    }

    #[test]
    fn a_cast_whose_result_the_gpu_also_reads_ends_the_chain() {
        let mut it = node("it", "IteratorGetNext", &["iterator"], vec![]);
        it.device = CPU.into();
        let nodes = vec![
            it,
            cast("a", "it:1", DT_INT32, 1),
            cast("b", "a", 1, DT_INT64),
            node("gpu_use", "Mul", &["a", "a"], vec![]),
        ];
        // `a` moves (its result is copied to the device once, as `it:1` was); `b` stays.
        assert_eq!(host_cast_plan(&nodes), HashSet::from([1]));
    }
}
