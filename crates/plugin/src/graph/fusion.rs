//! Elementwise fusion: groups of elementwise nodes on a tfwgpu GPU become one
//! `_TfwgpuFusedElementwise` node (the runtime's `fused` family), one dispatch instead of one
//! per op. The small models' training steps are bound by their dispatch count, and an
//! optimizer's update of each variable is a dozen elementwise ops (bench/RESULTS.md).
//!
//! A group is a tree of fusible nodes ([`fused::FUSIBLE`], float `T`, BiasAdd in NHWC; AddN of
//! up to 9 inputs, which the program adds left to right as TensorFlow's AddN does; a Tile that
//! is a broadcast, see below) on one device with one `T`, whose every member but the root has exactly one data consumer node (a
//! member) and is not a node to preserve (fetched, fed, kept); at most [`max_inputs`]
//! distinct input tensors. Each group of two or more nodes becomes one node that keeps the
//! root's name (so consumers, control edges and fetches find it), its device, the members'
//! control inputs, and a program (the members in topological order).
//!
//! A control edge from an interior member (`^m`: "after m") becomes control edges from m's own
//! inputs, data and control (expanded again where those are interior members): an elementwise
//! op has no side effect, so "after m" means "after what m waits for". The rewrite of
//! AssignAddVariableOp makes such edges (its read waits for the update's delta, see
//! `super::read_after`); pointing them at the fused node instead would make a cycle, as the
//! fused node consumes the read.
//!
//! Tile: the gradient of a mean or sum over some axes (Keras's batch statistics) tiles a
//! tensor of size 1 on those axes back to the input's shape, then scales and adds it: a
//! broadcast written out in full, then read again. A Tile with constant multiples joins a
//! group (as `Tile[m..](x)`, the multiples in the program; its input stays an input of the
//! group, one of its own): the fused kernel reads a broadcast at broadcast offsets, and
//! materializes any other Tile with the Tile kernel first. Such groups become
//! `_TfwgpuFusedElementwiseTiled` nodes (the same kernel), whose shape function leaves the
//! output shape unknown (the output can be larger than every input).
//!
//! Multi-output groups: a group whose root is also used outside the group that consumes it
//! joins that group, and the fused node exports its value as one more output
//! (`_TfwgpuFusedElementwiseMulti`: `M` outputs, output k >= 1 the result of instruction
//! `exports[k-1]`; consumers read `root:k`, control edges on it wait for its inputs as for an
//! interior member). Keras's batch norm computes scale = gamma * rsqrt(var + eps) once for the
//! forward and the gradient, SGD's momentum m' is assigned and added to the variable (after
//! `super::forward_assigned_reads`), a ReluGrad feeds two reductions and a product: each was a
//! group of its own, one dispatch more. Merges are tried consumers first (chains collapse), and
//! made only where no path leaves the merged group and comes back (through other nodes, data
//! or control edges, where every other group counts as one node: see `acyclic`) and the
//! inputs and outputs fit the bindings. The runtime computes outputs of the root's shape in the
//! same dispatch, others in one dispatch per shape. `TFWGPU_FUSION_MULTI=0` keeps the
//! single-output groups (and the reads as they are).
//!
//! Reductions: a float32 Sum, Mean, Max, Min or Prod on a tfwgpu GPU roots a group of the
//! fusible nodes that compute its input (the same rule: each member's data consumers are in
//! the group), which becomes one `_TfwgpuFusedReduce` node (the reduction's name, device,
//! attributes and axes, the axes its first input, in host memory; `reduce` names the op): its
//! kernel computes the program for each element the reduction loads, so the elementwise
//! result is neither written nor read back (Keras's batch-norm variance
//! `Mean(SquaredDifference(x, mean))`, the gradient's `Sum(dy' * x_hat)`). A group whose root
//! is also used outside joins such a group as an export too (`_TfwgpuFusedReduceMulti`: the
//! reduction is output 0, the exported values outputs 1..; batch norm's ReluGrad, which the
//! gradient's other sum and dx read; the reduced tensor itself, the convolution's BiasAdd
//! whose mean batch norm takes), unless the group holds a Tile (the reduction's kernel has no
//! place to materialize one).
//! `TFWGPU_FUSION_REDUCE=0` turns reduction groups off.
//!
//! `TFWGPU_FUSION=0` turns the pass off (and everything above).

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_char};

use tfwgpu_runtime::Result;
use tfwgpu_runtime::kernels::fused::{self, OP, OP_MULTI, OP_REDUCE, OP_REDUCE_MULTI, OP_TILED};
use tfwgpu_sys as sys;

use super::{Node, bytes_field, int_attr, on_tfwgpu_gpu};
use crate::nodedef::{Field, Reader};
use crate::status::Status;

/// Whether the pass runs (`TFWGPU_FUSION=0` turns it off).
pub fn enabled() -> bool {
    std::env::var("TFWGPU_FUSION").map_or(true, |v| v.trim() != "0")
}

/// TensorFlow's DT_FLOAT and DT_HALF: the dtypes the fused kernel has.
const FUSIBLE_TYPES: &[u64] = &[1, 19];

/// The reductions that can take a program as their input's prologue (`_TfwgpuFusedReduce`),
/// for `T` float32 (DT_FLOAT, the reduce family's float type).
const REDUCIBLE: &[&str] = &["Sum", "Mean", "Max", "Min", "Prod"];

/// Whether groups may end in a reduction (`TFWGPU_FUSION_REDUCE=0` turns that off).
pub fn reduce_groups() -> bool {
    std::env::var("TFWGPU_FUSION_REDUCE").map_or(true, |v| v.trim() != "0")
}

/// Whether `n` is a reduction that can root a group: a float32 Sum/Mean/Max/Min/Prod on a
/// tfwgpu GPU with its two data inputs (the tensor and the axes).
fn reducible(n: &Node) -> bool {
    on_tfwgpu_gpu(&n.device)
        && REDUCIBLE.contains(&n.op.as_str())
        && operands_all(n).count() == 2
        && n.attr("T").and_then(|t| attr_varint(t, 6)) == Some(1)
}

/// The value of a varint field of an encoded AttrValue (`type` is 6).
pub(super) fn attr_varint(value: &[u8], field: u32) -> Option<u64> {
    let mut r = Reader::new(value);
    while let Ok(Some((f, v))) = r.next() {
        if let (true, Field::Varint(x)) = (f == field, v) {
            return Some(x);
        }
    }
    None
}

/// The string of an encoded AttrValue (`s`, field 2).
pub(super) fn attr_str(value: &[u8]) -> Option<&[u8]> {
    let mut r = Reader::new(value);
    while let Ok(Some((f, v))) = r.next() {
        if let (2, Field::Bytes(b)) = (f, v) {
            return Some(b);
        }
    }
    None
}

/// An encoded AttrValue holding a string.
pub(super) fn str_attr(s: &str) -> Vec<u8> {
    let mut v = vec![];
    bytes_field(2, s.as_bytes(), &mut v);
    v
}

/// (producer node, output port) of a data input.
pub(super) fn source(input: &str) -> (&str, u32) {
    match input.rsplit_once(':') {
        Some((n, p)) => match p.parse() {
            Ok(port) => (n, port),
            Err(_) => (input, 0),
        },
        None => (input, 0),
    }
}

/// Most inputs of an AddN the pass fuses: TensorFlow sums up to 9 inputs left to right (more
/// in groups of 8, an order the program's chain of additions would not follow).
const ADDN_MAX: usize = 9;

/// The data inputs of a node that become operands in a program: all of them, except Tile's
/// multiples (which the program holds).
fn operands(n: &Node) -> impl Iterator<Item = &String> {
    let take = if n.op == "Tile" { 1 } else { usize::MAX };
    operands_all(n).take(take)
}

/// What fusion may do with a node: its `T`, when it is fusible at all (a Tile also needs
/// [`tile_multiples`]).
fn fusible(n: &Node) -> Option<u64> {
    if !on_tfwgpu_gpu(&n.device) {
        return None;
    }
    let data = operands_all(n).count();
    let arity_ok = match n.op.as_str() {
        "AddN" => {
            (2..=ADDN_MAX).contains(&data)
                && n.attr("N").and_then(super::attr_int) == Some(data as i64)
        }
        "Tile" => data == 2,
        op => fused::fusible_arity(op) == Some(data),
    };
    if !arity_ok {
        return None;
    }
    let t = attr_varint(n.attr("T")?, 6)?;
    if !FUSIBLE_TYPES.contains(&t) {
        return None;
    }
    if n.op == "BiasAdd"
        && n.attr("data_format")
            .and_then(attr_str)
            .is_some_and(|f| f != b"NHWC")
    {
        return None;
    }
    // Equal/NotEqual with `incompatible_shape_error` false give a scalar for shapes that do
    // not broadcast: not a program's broadcast.
    if matches!(n.op.as_str(), "Equal" | "NotEqual")
        && n.attr("incompatible_shape_error")
            .and_then(|v| attr_varint(v, 5))
            == Some(0)
    {
        return None;
    }
    Some(t)
}

/// Comparisons read by several fusible SelectV2 nodes (Keras's dropout mask: the forward's
/// select and the gradient's): a comparison's bool lives only inside a program, so it joins
/// the group of its consumer when it has one consumer; with several, each further consumer
/// gets a copy of its own (the same inputs, attributes and device: the same bool, computed
/// again from its inputs in that consumer's program), `<name>/tfwgpu_copy_<k>`. A comparison
/// that is to be preserved, waited on by a control edge, or read by anything but a SelectV2's
/// condition is left alone. The rewritten graph, or `None` when nothing was copied.
fn copy_predicates(graph: &[u8], preserve: &HashSet<String>) -> Result<Option<Vec<u8>>> {
    let (items, nodes) = super::split_graph(graph)?;
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let candidates: HashSet<usize> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            fused::is_predicate(&n.op) && fusible(n).is_some() && !preserve.contains(&n.name)
        })
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    // Per candidate: its consumers (node, data input index), or None when one is not a
    // SelectV2's condition or the candidate is waited on.
    let mut uses: HashMap<usize, Option<Vec<usize>>> =
        candidates.iter().map(|&i| (i, Some(vec![]))).collect();
    for (c, n) in nodes.iter().enumerate() {
        let mut k = 0;
        for i in &n.inputs {
            if let Some(ctl) = i.strip_prefix('^') {
                if let Some(p) = by_name.get(ctl)
                    && let Some(u) = uses.get_mut(p)
                {
                    *u = None;
                }
                continue;
            }
            let (src, port) = source(i);
            if let Some(p) = by_name.get(src)
                && let Some(u) = uses.get_mut(p)
            {
                let cond = k == 0
                    && port == 0
                    && n.op == "SelectV2"
                    && fusible(n).is_some()
                    && n.device == nodes[*p].device;
                match (cond, u.as_mut()) {
                    (true, Some(list)) if !list.contains(&c) => list.push(c),
                    (true, Some(_)) => {}
                    _ => *u = None,
                }
            }
            k += 1;
        }
    }
    // consumer -> (the comparison it reads, the copy it reads instead)
    let mut rewire: HashMap<usize, (usize, String)> = HashMap::new();
    let mut copies: HashMap<usize, Vec<Node>> = HashMap::new();
    for (&p, u) in &uses {
        let Some(list) = u else { continue };
        for (k, &c) in list.iter().enumerate().skip(1) {
            let mut copy = nodes[p].clone();
            copy.name = format!("{}/tfwgpu_copy_{k}", nodes[p].name);
            rewire.insert(c, (p, copy.name.clone()));
            copies.entry(p).or_default().push(copy);
        }
    }
    if copies.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(graph.len() + 512);
    for (i, raw, _) in &items {
        let Some(i) = *i else {
            out.extend_from_slice(raw);
            continue;
        };
        match rewire.get(&i) {
            Some((_, to)) => {
                let mut n = nodes[i].clone();
                let first = n
                    .inputs
                    .iter_mut()
                    .find(|x| !x.starts_with('^'))
                    .expect("a SelectV2 has its condition");
                *first = to.clone();
                n.encode(&mut out);
            }
            None => out.extend_from_slice(raw),
        }
        for c in copies.get(&i).into_iter().flatten() {
            c.encode(&mut out);
        }
    }
    Ok(Some(out))
}

/// The values of an integer Const node (int32 or int64 `value`), if `name` is one.
pub(super) fn const_ints(
    nodes: &[Node],
    by_name: &HashMap<&str, usize>,
    input: &str,
) -> Option<Vec<i64>> {
    let (name, port) = source(input);
    let n = &nodes[*by_name.get(name)?];
    if n.op != "Const" || port != 0 {
        return None;
    }
    let mut r = Reader::new(n.attr("value")?);
    let tensor = loop {
        match r.next().ok()?? {
            (8, Field::Bytes(t)) => break t,
            _ => continue,
        }
    };
    let (mut dtype, mut count, mut content, mut vals) = (0, 1i64, None, vec![]);
    let mut r = Reader::new(tensor);
    while let Some((f, v)) = r.next().ok()? {
        match (f, v) {
            (1, Field::Varint(d)) => dtype = d,
            (2, Field::Bytes(shape)) => {
                let mut sr = Reader::new(shape);
                while let Some((f, v)) = sr.next().ok()? {
                    if let (2, Field::Bytes(dim)) = (f, v) {
                        let mut dr = Reader::new(dim);
                        let mut size = 0;
                        while let Some((f, v)) = dr.next().ok()? {
                            if let (1, Field::Varint(x)) = (f, v) {
                                size = x as i64;
                            }
                        }
                        count *= size;
                    }
                }
            }
            (4, Field::Bytes(c)) => content = Some(c),
            // int_val (int32) or int64_val, packed or not.
            (7 | 10, Field::Varint(x)) => vals.push(x as i64),
            (7 | 10, Field::Bytes(packed)) => {
                let mut pr = Reader::new(packed);
                while pr.pos < packed.len() {
                    vals.push(pr.varint().ok()? as i64);
                }
            }
            _ => {}
        }
    }
    let width = match dtype {
        3 => 4,
        9 => 8,
        _ => return None,
    };
    let count = usize::try_from(count).ok()?;
    let mut out: Vec<i64> = match content {
        Some(c) if c.len() == count * width => c
            .chunks_exact(width)
            .map(|b| match width {
                4 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
                _ => i64::from_le_bytes(b.try_into().expect("8 bytes")),
            })
            .collect(),
        Some(_) => return None,
        None if vals.len() == count => vals,
        // One value stands for all (TensorFlow's compact form).
        None if vals.len() == 1 => vec![vals[0]; count],
        None if vals.is_empty() => vec![0; count],
        None => return None,
    };
    if width == 4 {
        // int_val holds int32 values sign-extended to 64 bits as varints.
        for v in &mut out {
            *v = *v as i32 as i64;
        }
    }
    Some(out)
}

/// A Tile node's multiples, when they are a constant.
fn tile_multiples(nodes: &[Node], by_name: &HashMap<&str, usize>, t: &Node) -> Option<Vec<usize>> {
    let multiples = const_ints(nodes, by_name, operands_all(t).nth(1)?)?;
    multiples.iter().map(|&m| usize::try_from(m).ok()).collect()
}

/// The identity of a group's input `input` of member `n` (node index `m`): the producer and
/// port, except that a Tile's input is an input of its own (the kernel may replace it by the
/// materialized Tile), shared only with Tiles by the same multiples.
fn input_key(n: &Node, m: usize, input: &str, tiles: &HashMap<usize, Vec<usize>>) -> (String, u32) {
    let (src, port) = source(input);
    match tiles.get(&m) {
        Some(mult) if n.op == "Tile" => (format!("{src}\u{0}{mult:?}"), port),
        _ => (src.to_string(), port),
    }
}

/// Every data input of a node.
pub(super) fn operands_all(n: &Node) -> impl Iterator<Item = &String> {
    n.inputs.iter().filter(|i| !i.starts_with('^'))
}

/// One group: its members, producers before consumers (the root last), and the members
/// whose results are also used outside the group (outputs 1.. of the fused node, in order).
struct Group {
    members: Vec<usize>,
    exports: Vec<usize>,
}

/// The fused node of a group (`tiles`: the multiples of the fusible Tile nodes).
fn fused_node(
    nodes: &[Node],
    g: &Group,
    redirect: &HashMap<String, Vec<String>>,
    renamed: &HashMap<String, String>,
    tiles: &HashMap<usize, Vec<usize>>,
) -> Node {
    let root = &nodes[*g.members.last().expect("a group has a root")];
    let mut externals: Vec<String> = vec![];
    let mut keys: Vec<(String, u32)> = vec![];
    let mut control: Vec<String> = vec![];
    let mut instrs: Vec<String> = vec![];
    // Each member's result: the temporary of its last instruction.
    let mut result: HashMap<&str, usize> = HashMap::new();
    let mut tiled = false;
    // A reduction's group: the members before it are its input's program.
    let reduce = REDUCIBLE.contains(&root.op.as_str());
    for &m in &g.members {
        let n = &nodes[m];
        for i in n.inputs.iter().filter(|i| i.starts_with('^')) {
            if !control.contains(i) {
                control.push(i.clone());
            }
        }
        if reduce && std::ptr::eq(n, root) {
            continue;
        }
        let mut args = vec![];
        for i in operands(n) {
            let (src, port) = source(i);
            if let (Some(&k), 0) = (result.get(src), port) {
                args.push(format!("t{k}"));
                continue;
            }
            let key = input_key(n, m, i, tiles);
            let k = match keys.iter().position(|x| *x == key) {
                Some(k) => k,
                None => {
                    keys.push(key);
                    externals.push(i.clone());
                    keys.len() - 1
                }
            };
            args.push(format!("i{k}"));
        }
        match n.op.as_str() {
            // TensorFlow's AddN adds up to 9 inputs left to right, rounding each sum.
            "AddN" => {
                let mut acc = args[0].clone();
                for a in &args[1..] {
                    instrs.push(format!("AddV2({acc},{a})"));
                    acc = format!("t{}", instrs.len() - 1);
                }
            }
            "Tile" => {
                let m: Vec<String> = tiles[&m].iter().map(|v| v.to_string()).collect();
                instrs.push(format!("Tile[{}]({})", m.join("x"), args[0]));
                tiled = true;
            }
            op => instrs.push(format!("{op}({})", args.join(","))),
        }
        result.insert(n.name.as_str(), instrs.len() - 1);
    }
    let program = instrs.join(";");
    let control = redirected(&control, redirect);
    // Inputs that are outputs of other fused nodes now.
    let externals = externals.into_iter().map(|i| {
        let (src, port) = source(&i);
        match renamed.get(src) {
            Some(to) if port == 0 => to.clone(),
            _ => i,
        }
    });
    let mut attrs = vec![
        (
            "T".into(),
            root.attr("T").expect("fusible nodes have T").to_vec(),
        ),
        ("N".into(), int_attr(keys.len() as i64)),
        ("program".into(), str_attr(&program)),
    ];
    let exports: Vec<i64> = g
        .exports
        .iter()
        .map(|e| result[nodes[*e].name.as_str()] as i64)
        .collect();
    let op = if reduce {
        attrs.push(("reduce".into(), str_attr(&root.op)));
        for key in ["keep_dims", "Tidx"] {
            if let Some(v) = root.attr(key) {
                attrs.push((key.into(), v.to_vec()));
            }
        }
        if exports.is_empty() {
            OP_REDUCE
        } else {
            // Outputs 1..=M: the exported values.
            attrs.push(("M".into(), int_attr(exports.len() as i64)));
            attrs.push(("exports".into(), ints_attr(&exports)));
            OP_REDUCE_MULTI
        }
    } else if !g.exports.is_empty() {
        attrs.push(("M".into(), int_attr(exports.len() as i64 + 1)));
        attrs.push(("exports".into(), ints_attr(&exports)));
        OP_MULTI
    } else if tiled {
        OP_TILED
    } else {
        OP
    };
    // A reduction's axes come first (its kernel's host-memory input 0).
    let axes = reduce.then(|| {
        operands_all(root)
            .nth(1)
            .expect("a reduction has its axes")
            .clone()
    });
    Node {
        name: root.name.clone(),
        op: op.into(),
        inputs: axes.into_iter().chain(externals).chain(control).collect(),
        device: root.device.clone(),
        attrs,
    }
}

/// An encoded AttrValue holding a list of ints.
fn ints_attr(v: &[i64]) -> Vec<u8> {
    let mut packed = vec![];
    for &x in v {
        super::varint(x as u64, &mut packed);
    }
    let mut list = vec![];
    bytes_field(3, &packed, &mut list);
    let mut out = vec![];
    bytes_field(1, &list, &mut out);
    out
}

/// `inputs` with each control edge from an interior member replaced by that member's
/// dependencies (`redirect`), duplicates dropped.
fn redirected(inputs: &[String], redirect: &HashMap<String, Vec<String>>) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for i in inputs {
        let repl = i.strip_prefix('^').and_then(|n| redirect.get(n));
        for j in repl.map_or(std::slice::from_ref(i), |r| r.as_slice()) {
            if !j.starts_with('^') || !out.contains(j) {
                out.push(j.clone());
            }
        }
    }
    out
}

/// For each interior member, the control edges that replace a control edge from it: from the
/// producers of its inputs and its control inputs, those that are interior members expanded
/// in turn.
fn redirections(nodes: &[Node], interior: &HashSet<usize>) -> HashMap<String, Vec<String>> {
    let names: HashSet<&str> = interior.iter().map(|&i| nodes[i].name.as_str()).collect();
    let by_name: HashMap<&str, usize> = interior
        .iter()
        .map(|&i| (nodes[i].name.as_str(), i))
        .collect();
    fn expand(
        n: &str,
        nodes: &[Node],
        by_name: &HashMap<&str, usize>,
        names: &HashSet<&str>,
        out: &mut Vec<String>,
    ) {
        for i in &nodes[by_name[n]].inputs {
            let src = i.strip_prefix('^').unwrap_or_else(|| source(i).0);
            if names.contains(src) {
                expand(src, nodes, by_name, names, out);
            } else {
                let edge = format!("^{src}");
                if !out.contains(&edge) {
                    out.push(edge);
                }
            }
        }
    }
    names
        .iter()
        .map(|&n| {
            let mut out = vec![];
            expand(n, nodes, &by_name, &names, &mut out);
            (n.to_string(), out)
        })
        .collect()
}

/// A serialized NodeDef with its inputs replaced, every other field kept as it was.
pub(super) fn with_inputs(nb: &[u8], inputs: &[String]) -> Result<Vec<u8>> {
    let mut r = Reader::new(nb);
    let mut b = Vec::with_capacity(nb.len() + 64);
    let mut done = false;
    loop {
        let start = r.pos;
        let Some((f, _)) = r.next()? else { break };
        if f == 3 {
            if !done {
                for i in inputs {
                    bytes_field(3, i.as_bytes(), &mut b);
                }
                done = true;
            }
            continue;
        }
        b.extend_from_slice(&nb[start..r.pos]);
    }
    if !done {
        for i in inputs {
            bytes_field(3, i.as_bytes(), &mut b);
        }
    }
    let mut out = vec![];
    bytes_field(1, &b, &mut out);
    Ok(out)
}

/// The groups of a graph's nodes (each of two or more members), and the multiples of the
/// fusible Tile nodes.
fn groups(
    nodes: &[Node],
    preserve: &HashSet<String>,
    max_inputs: usize,
    opts: Options,
) -> (Vec<Group>, HashMap<usize, Vec<usize>>) {
    let multi = opts.multi;
    let by_name: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut tiles: HashMap<usize, Vec<usize>> = HashMap::new();
    // Reductions that may root a group (their type: float32).
    let is_reduce: Vec<bool> = nodes.iter().map(|n| opts.reduce && reducible(n)).collect();
    let types: Vec<Option<u64>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if is_reduce[i] {
                return Some(1);
            }
            let t = fusible(n)?;
            if n.op == "Tile" {
                tiles.insert(i, tile_multiples(nodes, &by_name, n)?);
            }
            Some(t)
        })
        .collect();
    // Data consumers (distinct nodes) of each node; whether a consumer reads another output
    // port than 0. A lowered while loop's back edges (out of NextIteration, into the Merge of
    // the next iteration) are left out: within one iteration the body is acyclic, so its
    // nodes get an order below and the cycle check of multi-output merges does not follow a
    // value into the next iteration (another execution of the nodes it reaches).
    let back = |p: usize| nodes[p].op == "NextIteration";
    let mut consumers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    let mut blocked = vec![false; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        for i in &n.inputs {
            if i.starts_with('^') {
                continue;
            }
            let (src, port) = source(i);
            if let Some(&p) = by_name.get(src)
                && !back(p)
            {
                if port != 0 {
                    blocked[p] = true;
                }
                if !consumers[p].contains(&c) {
                    consumers[p].push(c);
                }
            }
        }
    }
    // A SelectV2 is fusible only with the comparison that computes its condition: a fusible
    // comparison of the same T on the same device that only it reads (after
    // `copy_predicates`), not to be preserved, read at port 0. That comparison then always
    // joins its group (its inputs and instruction are counted with the SelectV2's).
    let mut types = types;
    for (i, n) in nodes.iter().enumerate() {
        if n.op != "SelectV2" || types[i].is_none() {
            continue;
        }
        let ok = operands_all(n).next().is_some_and(|c| {
            let (src, port) = source(c);
            by_name.get(src).is_some_and(|&p| {
                port == 0
                    && fused::is_predicate(&nodes[p].op)
                    && types[p] == types[i]
                    && nodes[p].device == n.device
                    && !blocked[p]
                    && !preserve.contains(&nodes[p].name)
                    && consumers[p] == [i]
            })
        });
        if !ok {
            types[i] = None;
        }
    }
    // Kahn's order over the data edges (producers first), without the back edges: the nodes
    // of a loop's body are ordered and fused like any others (every data edge between two
    // fusible nodes stays inside one frame, so a group and its inputs are in its members'
    // frame). Nodes on any other cycle get no order and are left alone.
    let mut pending: Vec<usize> = vec![0; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        let mut seen: Vec<usize> = vec![];
        for i in operands_all(n) {
            if let Some(&p) = by_name.get(source(i).0)
                && !back(p)
                && !seen.contains(&p)
            {
                seen.push(p);
            }
        }
        pending[c] = seen.len();
    }
    let mut topo: Vec<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut k = 0;
    while k < topo.len() {
        let p = topo[k];
        k += 1;
        for &c in &consumers[p] {
            pending[c] -= 1;
            if pending[c] == 0 {
                topo.push(c);
            }
        }
    }
    // Consumers first: a fusible node joins the group of its consumers when they all belong
    // to one group (so the group stays a single-output subgraph: a tree or a DAG whose shared
    // results are used only inside it), with the same T and device, no Tile reads it (a
    // Tile's input stays an input), it is not to be preserved or read at another port, and
    // the group's distinct inputs stay within max_inputs. Otherwise it roots a group.
    struct Growing {
        members: Vec<usize>,
        externals: HashSet<(String, u32)>,
        /// Instructions of the group's program so far (at most `fused::MAX_INSTRUCTIONS`).
        instrs: usize,
    }
    let mut growing: Vec<Growing> = vec![];
    let mut group_of: Vec<Option<usize>> = vec![None; nodes.len()];
    for &n in topo.iter().rev() {
        let Some(t) = types[n] else { continue };
        let node = &nodes[n];
        if is_reduce[n] {
            // A reduction roots a group of the nodes computing its input (and joins none).
            let input = operands_all(node)
                .next()
                .expect("a reduction has its input");
            group_of[n] = Some(growing.len());
            growing.push(Growing {
                members: vec![n],
                externals: [input_key(node, n, input, &tiles)].into_iter().collect(),
                instrs: instructions(node),
            });
            continue;
        }
        let join = (|| {
            if blocked[n] || preserve.contains(&node.name) || consumers[n].is_empty() {
                return None;
            }
            let g = group_of[consumers[n][0]]?;
            let root = growing[g].members[0];
            let same = consumers[n]
                .iter()
                .all(|&c| group_of[c] == Some(g) && nodes[c].op != "Tile");
            if !same || types[root] != Some(t) || nodes[root].device != node.device {
                return None;
            }
            // A reduction's program holds no Tile (its kernel has no place to materialize
            // one); its axes are no member.
            if is_reduce[root]
                && (node.op == "Tile"
                    || operands_all(&nodes[root]).nth(1).map(|a| source(a).0)
                        == Some(node.name.as_str()))
            {
                return None;
            }
            let mut next = growing[g].externals.clone();
            next.remove(&(node.name.clone(), 0));
            next.extend(operand_keys(nodes, &by_name, n, &tiles));
            // A long chain splits into groups whose programs fit the kernel's limit.
            let fits = growing[g].instrs + instructions(node) <= fused::MAX_INSTRUCTIONS;
            (next.len() <= max_inputs && fits).then_some((g, next))
        })();
        match join {
            Some((g, next)) => {
                growing[g].members.push(n);
                growing[g].externals = next;
                growing[g].instrs += instructions(node);
                group_of[n] = Some(g);
            }
            // A comparison's bool is no output of a program: it only ever joins its consumer.
            None if fused::is_predicate(&node.op) => {}
            None => {
                let externals = operand_keys(nodes, &by_name, n, &tiles)
                    .into_iter()
                    .collect();
                group_of[n] = Some(growing.len());
                growing.push(Growing {
                    members: vec![n],
                    externals,
                    instrs: instructions(node),
                });
            }
        }
    }
    // Multi-output merges: a group whose root is also used outside the group that consumes it
    // (batch-norm statistics read by the forward and the gradient; SGD's new momentum, both
    // assigned and added to the variable) joins that group, its root becoming one more output
    // of the fused node. Groups are tried consumers first (the order they were made in), so
    // that chains of such groups collapse.
    let mut control_consumers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (c, n) in nodes.iter().enumerate() {
        for i in n.inputs.iter().filter_map(|i| i.strip_prefix('^')) {
            if let Some(&p) = by_name.get(i)
                && !back(p)
                && !control_consumers[p].contains(&c)
            {
                control_consumers[p].push(c);
            }
        }
    }
    let mut sets: Vec<Vec<usize>> = growing.iter().map(|g| g.members.clone()).collect();
    let mut alive = vec![true; sets.len()];
    for p in 0..sets.len() {
        if !alive[p] || !multi {
            continue;
        }
        let r = sets[p][0];
        // A reduction's result is no elementwise value.
        if blocked[r] || preserve.contains(&nodes[r].name) || is_reduce[r] {
            continue;
        }
        let mut candidates: Vec<usize> = vec![];
        for &c in &consumers[r] {
            if let Some(g) = group_of[c]
                && g != p
                && !candidates.contains(&g)
            {
                candidates.push(g);
            }
        }
        for c in candidates {
            let root = sets[c][0];
            if types[root] != types[r] || nodes[root].device != nodes[r].device {
                continue;
            }
            // A reduction's group takes the value as one more output (the reduced tensor
            // itself, too: the BiasAdd whose mean batch norm takes) when no Tile comes with it.
            if is_reduce[root] && sets[p].iter().any(|&m| nodes[m].op == "Tile") {
                continue;
            }
            let merged: Vec<usize> = sets[c].iter().chain(&sets[p]).copied().collect();
            if !mergeable(nodes, &by_name, &merged, &consumers, &tiles, max_inputs) {
                continue;
            }
            if !acyclic(&merged, &group_of, &sets, &consumers, &control_consumers) {
                continue;
            }
            for &m in &sets[p] {
                group_of[m] = Some(c);
            }
            sets[c] = merged;
            sets[p].clear();
            alive[p] = false;
            break;
        }
    }
    for (g, s) in growing.iter_mut().zip(sets) {
        g.members = s;
    }
    let out = growing
        .into_iter()
        .filter(|g| g.members.len() >= 2)
        .map(|g| {
            // Producers before consumers: post-order from the root (added first) along the
            // operands in their order, each member once.
            let set: HashSet<usize> = g.members.iter().copied().collect();
            let mut members = Vec::with_capacity(set.len());
            let mut done: HashSet<usize> = HashSet::new();
            let mut stack = vec![(g.members[0], false)];
            while let Some((m, expanded)) = stack.pop() {
                if expanded {
                    members.push(m);
                    continue;
                }
                if !done.insert(m) {
                    continue;
                }
                stack.push((m, true));
                let ops: Vec<usize> = operands(&nodes[m])
                    .filter_map(|i| by_name.get(source(i).0).copied())
                    .filter(|p| set.contains(p) && !done.contains(p))
                    .collect();
                stack.extend(ops.into_iter().rev().map(|p| (p, false)));
            }
            let root = g.members[0];
            let exports = members
                .iter()
                .copied()
                .filter(|&m| m != root && consumers[m].iter().any(|c| !set.contains(c)))
                .collect();
            Group { members, exports }
        })
        .collect();
    (out, tiles)
}

/// Whether groups may have several outputs (`TFWGPU_FUSION_MULTI=0` turns that off: groups
/// are then the single-output groups of before).
pub fn multi_output() -> bool {
    std::env::var("TFWGPU_FUSION_MULTI").map_or(true, |v| v.trim() != "0")
}

/// The instructions a member adds to its group's program (an AddN of k inputs: k - 1 adds).
fn instructions(n: &Node) -> usize {
    if n.op == "AddN" {
        operands(n).count().saturating_sub(1)
    } else if n.op == "SelectV2" {
        // Its condition's comparison, which joins with it (see `groups`), counted here.
        2
    } else if fused::is_predicate(&n.op) {
        0
    } else {
        1
    }
}

/// The identities of the inputs a member brings to its group: its operands' (see
/// `input_key`), a SelectV2's condition replaced by the operands of the comparison that
/// computes it (which always joins the SelectV2's group, see `groups`).
fn operand_keys(
    nodes: &[Node],
    by_name: &HashMap<&str, usize>,
    n: usize,
    tiles: &HashMap<usize, Vec<usize>>,
) -> Vec<(String, u32)> {
    let node = &nodes[n];
    let mut keys = vec![];
    for (k, i) in operands(node).enumerate() {
        if k == 0
            && node.op == "SelectV2"
            && let Some(&p) = by_name.get(source(i).0)
        {
            keys.extend(operands(&nodes[p]).map(|x| input_key(&nodes[p], p, x, tiles)));
            continue;
        }
        keys.push(input_key(node, n, i, tiles));
    }
    keys
}

/// Whether `members` (the root first) can be one fused node: no Tile reads a member (a
/// Tile's input stays an input), its distinct inputs and its outputs fit the bindings, and
/// its program the instruction limit.
fn mergeable(
    nodes: &[Node],
    by_name: &HashMap<&str, usize>,
    members: &[usize],
    consumers: &[Vec<usize>],
    tiles: &HashMap<usize, Vec<usize>>,
    max_inputs: usize,
) -> bool {
    let set: HashSet<usize> = members.iter().copied().collect();
    let mut externals: HashSet<(String, u32)> = HashSet::new();
    let mut instrs = 0;
    for &m in members {
        let n = &nodes[m];
        instrs += instructions(n);
        // A reduction (the root of its group) reads its axes in host memory: no binding.
        let reduction = m == members[0] && REDUCIBLE.contains(&n.op.as_str());
        let take = if reduction { 1 } else { usize::MAX };
        for i in operands(n).take(take) {
            let (src, port) = source(i);
            let member = by_name.get(src).is_some_and(|p| set.contains(p));
            if member && n.op == "Tile" {
                return false;
            }
            if !(member && port == 0) {
                externals.insert(input_key(n, m, i, tiles));
            }
        }
    }
    let root = members[0];
    let exports = members
        .iter()
        .filter(|&&m| m != root && consumers[m].iter().any(|c| !set.contains(c)))
        .count();
    externals.len() + exports <= max_inputs && instrs <= fused::MAX_INSTRUCTIONS
}

/// Most nodes [`acyclic`] visits before it gives up (and the merge is not made).
const CYCLE_CHECK_BUDGET: usize = 200_000;

/// Whether the group of `members` (the root first) would be on no cycle once fused: no path
/// leaves it (through the data consumers of its members, or the control consumers of its
/// root; control edges from other members are redirected to their inputs) and comes back,
/// where each existing group counts as one node (all its members' consumers, data and
/// control, leave it).
fn acyclic(
    members: &[usize],
    group_of: &[Option<usize>],
    sets: &[Vec<usize>],
    consumers: &[Vec<usize>],
    control_consumers: &[Vec<usize>],
) -> bool {
    let set: HashSet<usize> = members.iter().copied().collect();
    let mut stack: Vec<usize> = vec![];
    for &m in members {
        stack.extend(consumers[m].iter().filter(|c| !set.contains(c)));
    }
    stack.extend(
        control_consumers[members[0]]
            .iter()
            .filter(|c| !set.contains(c)),
    );
    let mut seen_nodes: HashSet<usize> = HashSet::new();
    let mut seen_groups: HashSet<usize> = HashSet::new();
    let mut budget = CYCLE_CHECK_BUDGET;
    while let Some(y) = stack.pop() {
        if set.contains(&y) {
            return false;
        }
        let single;
        let unit: &[usize] = match group_of[y] {
            Some(g) => {
                if !seen_groups.insert(g) {
                    continue;
                }
                &sets[g]
            }
            None => {
                if !seen_nodes.insert(y) {
                    continue;
                }
                single = [y];
                &single
            }
        };
        for &u in unit {
            budget = match budget.checked_sub(1 + consumers[u].len() + control_consumers[u].len()) {
                Some(b) => b,
                None => return false,
            };
            stack.extend(&consumers[u]);
            stack.extend(&control_consumers[u]);
        }
    }
    true
}

/// The most inputs a fused node may have: what every tfwgpu device of the process binds
/// ([`fused::max_inputs`]; 7 without a device).
pub fn max_inputs() -> usize {
    crate::runtime()
        .and_then(|rt| {
            rt.devices
                .iter()
                .map(|d| fused::max_inputs(d.limits()))
                .min()
        })
        .unwrap_or(7)
}

/// What kinds of groups the pass makes beyond single-output elementwise groups.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Groups with several outputs ([`multi_output`]).
    pub multi: bool,
    /// Groups ending in a reduction ([`reduce_groups`]).
    pub reduce: bool,
}

/// Fuses a serialized GraphDef into groups of at most `max_inputs` inputs (inputs and outputs
/// beyond the first together), with several outputs where [`multi_output`] allows and
/// reductions of programs where [`reduce_groups`] does; `None` when no group was found.
pub fn fuse(
    graph: &[u8],
    preserve: &HashSet<String>,
    max_inputs: usize,
) -> Result<Option<Vec<u8>>> {
    let opts = Options {
        multi: multi_output(),
        reduce: reduce_groups(),
    };
    fuse_opts(graph, preserve, max_inputs, opts)
}

/// [`fuse`], with multi-output groups (`multi`) or without, and reduction groups.
pub fn fuse_with(
    graph: &[u8],
    preserve: &HashSet<String>,
    max_inputs: usize,
    multi: bool,
) -> Result<Option<Vec<u8>>> {
    fuse_opts(
        graph,
        preserve,
        max_inputs,
        Options {
            multi,
            reduce: true,
        },
    )
}

/// [`fuse`] with the kinds of groups `opts` allows.
pub fn fuse_opts(
    graph: &[u8],
    preserve: &HashSet<String>,
    max_inputs: usize,
    opts: Options,
) -> Result<Option<Vec<u8>>> {
    let copied = copy_predicates(graph, preserve)?;
    let graph: &[u8] = copied.as_deref().unwrap_or(graph);
    let (items, nodes) = super::split_graph(graph)?;
    let (groups, tiles) = groups(&nodes, preserve, max_inputs, opts);
    if groups.is_empty() {
        return Ok(copied);
    }
    // Interior members disappear; a root is replaced by its group's node.
    let mut replaced: HashMap<usize, Node> = HashMap::new();
    let mut dropped: HashSet<usize> = HashSet::new();
    for g in &groups {
        let (_, interior) = g.members.split_last().expect("nonempty");
        dropped.extend(interior.iter().copied());
    }
    let redirect = redirections(&nodes, &dropped);
    // Members used outside their group: their consumers read output k of the fused node.
    let mut renamed: HashMap<String, String> = HashMap::new();
    for g in &groups {
        let root = &nodes[*g.members.last().expect("nonempty")].name;
        for (k, &e) in g.exports.iter().enumerate() {
            renamed.insert(nodes[e].name.clone(), format!("{root}:{}", k + 1));
        }
    }
    for g in &groups {
        let root = *g.members.last().expect("nonempty");
        replaced.insert(root, fused_node(&nodes, g, &redirect, &renamed, &tiles));
    }
    let mut out = Vec::with_capacity(graph.len());
    for &(i, raw, nb) in &items {
        match i {
            None => out.extend_from_slice(raw),
            Some(i) => {
                if dropped.contains(&i) {
                    continue;
                }
                if let Some(n) = replaced.get(&i) {
                    n.encode(&mut out);
                    continue;
                }
                let inputs = &nodes[i].inputs;
                let waits_on_interior = inputs.iter().any(|x| {
                    x.strip_prefix('^')
                        .is_some_and(|n| redirect.contains_key(n))
                });
                let reads_exported = inputs
                    .iter()
                    .any(|x| !x.starts_with('^') && renamed.contains_key(source(x).0));
                if waits_on_interior || reads_exported {
                    let inputs: Vec<String> = inputs
                        .iter()
                        .map(|x| {
                            let (src, port) = source(x);
                            match renamed.get(src) {
                                Some(to) if !x.starts_with('^') && port == 0 => to.clone(),
                                _ => x.clone(),
                            }
                        })
                        .collect();
                    out.extend_from_slice(&with_inputs(nb, &redirected(&inputs, &redirect))?);
                } else {
                    out.extend_from_slice(raw);
                }
            }
        }
    }
    tracing::debug!(
        "fusion: {} groups of {} nodes",
        groups.len(),
        groups.iter().map(|g| g.members.len()).sum::<usize>()
    );
    Ok(Some(out))
}

/// The names of the nodes the optimizer must keep (fetches, feeds, kept ops).
///
/// # Safety
/// `item` is the grappler item TensorFlow passed to the optimizer.
pub(crate) unsafe fn nodes_to_preserve(
    item: *const sys::TF_GrapplerItem,
) -> Result<HashSet<String>> {
    let st = Status::new();
    let (mut n, mut size) = (0, 0usize);
    // SAFETY: valid item and status (the caller's contract).
    unsafe { sys::TF_GetNodesToPreserveListSize(item, &mut n, &mut size, st.0) };
    st.check("nodes to preserve")?;
    let n = n.max(0) as usize;
    let mut values: Vec<*mut c_char> = vec![std::ptr::null_mut(); n];
    let mut lengths = vec![0usize; n];
    let mut storage = vec![0u8; size.max(1)];
    // SAFETY: arrays of the sizes TensorFlow asked for.
    unsafe {
        sys::TF_GetNodesToPreserveList(
            item,
            values.as_mut_ptr(),
            lengths.as_mut_ptr(),
            n as i32,
            storage.as_mut_ptr() as *mut _,
            storage.len(),
            st.0,
        )
    };
    st.check("nodes to preserve")?;
    Ok(values
        .iter()
        .zip(&lengths)
        .map(|(&p, &l)| {
            // SAFETY: each value points at `l` bytes inside `storage`.
            let b = unsafe { std::slice::from_raw_parts(p as *const u8, l) };
            String::from_utf8_lossy(b).into_owned()
        })
        .collect())
}

/// Shape function of the fused op: the input that every other input broadcasts to, when one
/// does (the usual case: a tensor and scalars, a bias, or tensors of one shape); else unknown.
unsafe extern "C" fn shape_fn(
    ctx: *mut sys::TF_ShapeInferenceContext,
    status: *mut sys::TF_Status,
) {
    // SAFETY: TensorFlow passes a valid context and status for the call.
    unsafe {
        let n = sys::TF_ShapeInferenceContextNumInputs(ctx).max(0) as i32;
        let st = Status::new();
        let handles: Vec<*mut sys::TF_ShapeHandle> =
            (0..n).map(|_| sys::TF_NewShapeHandle()).collect();
        let mut dims: Vec<Option<Vec<Option<i64>>>> = vec![];
        for (i, &h) in handles.iter().enumerate() {
            sys::TF_ShapeInferenceContextGetInput(ctx, i as i32, h, st.0);
            if st.check("input shape").is_err()
                || sys::TF_ShapeInferenceContextRankKnown(ctx, h) == 0
            {
                dims.push(None);
                continue;
            }
            let rank = sys::TF_ShapeInferenceContextRank(ctx, h);
            let d = sys::TF_NewDimensionHandle();
            let v = (0..rank)
                .map(|k| {
                    sys::TF_ShapeInferenceContextDim(ctx, h, k, d);
                    (sys::TF_DimensionHandleValueKnown(d) != 0)
                        .then(|| sys::TF_DimensionHandleValue(d))
                })
                .collect();
            sys::TF_DeleteDimensionHandle(d);
            dims.push(Some(v));
        }
        match dominant(&dims) {
            Some(k) => sys::TF_ShapeInferenceContextSetOutput(ctx, 0, handles[k], status),
            None => sys::TF_ShapeInferenceContextSetUnknownShape(ctx, status),
        }
        for h in handles {
            sys::TF_DeleteShapeHandle(h);
        }
    }
}

/// The input every other input broadcasts to (dims: `None` for an unknown rank, inner `None`
/// for an unknown dimension), if there is one for every value the unknown dims may take.
fn dominant(shapes: &[Option<Vec<Option<i64>>>]) -> Option<usize> {
    let known: Vec<&Vec<Option<i64>>> = shapes.iter().map(|s| s.as_ref()).collect::<Option<_>>()?;
    'candidates: for (c, sc) in known.iter().enumerate() {
        for (i, si) in known.iter().enumerate() {
            if i == c {
                continue;
            }
            if si.len() > sc.len() {
                continue 'candidates;
            }
            let pad = sc.len() - si.len();
            for (k, di) in si.iter().enumerate() {
                let ok = match (sc[k + pad], *di) {
                    (None, _) => true,
                    (Some(1), d) => d == Some(1),
                    (Some(x), d) => d.is_none_or(|d| d == 1 || d == x),
                };
                if !ok {
                    continue 'candidates;
                }
            }
        }
        return Some(c);
    }
    None
}

/// Shape function of the tiled fused op: unknown (a Tile in the program can make the output
/// larger than every input, and the program is not visible here).
pub(super) unsafe extern "C" fn unknown_shape_fn(
    ctx: *mut sys::TF_ShapeInferenceContext,
    status: *mut sys::TF_Status,
) {
    // SAFETY: TensorFlow passes a valid context and status for the call.
    unsafe { sys::TF_ShapeInferenceContextSetUnknownShape(ctx, status) }
}

/// Registers `_TfwgpuFusedElementwise`, `_TfwgpuFusedElementwiseTiled`,
/// `_TfwgpuFusedElementwiseMulti` and `_TfwgpuFusedReduce` with TensorFlow (before any graph
/// is optimized).
pub fn register_op() {
    type ShapeFn = unsafe extern "C" fn(*mut sys::TF_ShapeInferenceContext, *mut sys::TF_Status);
    let c = |s: &str| CString::new(s).expect("no NUL");
    let common = [
        c("T: {float, half}"),
        c("N: int >= 1"),
        c("program: string"),
    ];
    // The multi-output op: M outputs, output k >= 1 the result of instruction exports[k-1];
    // shapes unknown (each output has its own, which the program decides).
    let multi = [c("M: int >= 2"), c("exports: list(int)")];
    // The reduction of a program's result: TensorFlow's reduction attributes (`reduce`: the
    // op's name), its axes first (in host memory), float32 only.
    let reduce = [
        c("reduce: string"),
        c("keep_dims: bool = false"),
        c("Tidx: {int32, int64} = DT_INT32"),
    ];
    let reduce_common = [c("T: {float}"), c("N: int >= 1"), c("program: string")];
    let reduce_multi = [
        c("reduce: string"),
        c("keep_dims: bool = false"),
        c("Tidx: {int32, int64} = DT_INT32"),
        c("M: int >= 1"),
        c("exports: list(int)"),
    ];
    let (x, axes) = (c("x: N * T"), c("reduction_indices: Tidx"));
    let elementwise: &[&CString] = &[&x];
    /// (name, inputs, output, attributes, more attributes, shape function).
    type Def<'a> = (
        &'a str,
        &'a [&'a CString],
        &'a str,
        &'a [CString],
        &'a [CString],
        ShapeFn,
    );
    let ops: [Def; 5] = [
        (OP, elementwise, "y: T", &common, &[], shape_fn),
        (
            OP_TILED,
            elementwise,
            "y: T",
            &common,
            &[],
            unknown_shape_fn,
        ),
        (
            OP_MULTI,
            elementwise,
            "y: M * T",
            &common,
            &multi,
            unknown_shape_fn,
        ),
        (
            OP_REDUCE,
            &[&axes, &x],
            "y: T",
            &reduce_common,
            &reduce,
            unknown_shape_fn,
        ),
        // The reduction, then the M exported values.
        (
            OP_REDUCE_MULTI,
            &[&axes, &x],
            "y: T;e: M * T",
            &reduce_common,
            &reduce_multi,
            unknown_shape_fn,
        ),
    ];
    let st = Status::new();
    for (op, inputs, output, common, extra, shape) in ops {
        let (name, output) = (c(op), c(output));
        // SAFETY: plain calls into TensorFlow's op registration API with valid strings
        // (copied by the builder); the builder is consumed by TF_RegisterOpDefinition.
        unsafe {
            let b = sys::TF_NewOpDefinitionBuilder(name.as_ptr());
            for input in inputs {
                sys::TF_OpDefinitionBuilderAddInput(b, input.as_ptr());
            }
            for o in output.to_str().expect("ASCII").split(';') {
                let o = c(o);
                sys::TF_OpDefinitionBuilderAddOutput(b, o.as_ptr());
            }
            for attr in common.iter().chain(extra) {
                sys::TF_OpDefinitionBuilderAddAttr(b, attr.as_ptr());
            }
            sys::TF_OpDefinitionBuilderSetShapeInferenceFunction(b, Some(shape));
            sys::TF_RegisterOpDefinition(b, st.0);
        }
        if let Err(e) = st.check("registering the fused op") {
            tracing::warn!("{op} not registered, fusion is off: {e}");
            return;
        }
    }
    REGISTERED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the fused op is registered (the pass runs only then).
pub static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::super::{bytes_field, type_attr, varint};
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
    const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

    fn node(name: &str, op: &str, inputs: &[&str], device: &str, t: u64) -> Node {
        Node {
            name: name.into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: device.into(),
            attrs: vec![("T".into(), type_attr(t))],
        }
    }

    fn graph(nodes: &[Node]) -> Vec<u8> {
        let mut g = vec![];
        for n in nodes {
            n.encode(&mut g);
        }
        g
    }

    fn parse(g: &[u8]) -> Vec<Node> {
        let mut r = Reader::new(g);
        let mut nodes = vec![];
        while let Some((1, Field::Bytes(b))) = r.next().unwrap() {
            nodes.push(Node::parse(b).unwrap());
        }
        nodes
    }

    fn fused(nodes: &[Node], preserve: &[&str]) -> Option<Vec<Node>> {
        fused_with(nodes, preserve, 7, true)
    }

    fn fused_with(
        nodes: &[Node],
        preserve: &[&str],
        max_inputs: usize,
        multi: bool,
    ) -> Option<Vec<Node>> {
        let keep = preserve.iter().map(|s| s.to_string()).collect();
        let out = fuse_with(&graph(nodes), &keep, max_inputs, multi)
            .unwrap()
            .map(|g| parse(&g));
        if let Some(o) = &out {
            assert_acyclic(o);
        }
        out
    }

    /// Every input names a node of the graph (or a placeholder the test left out), and the
    /// data and control edges make no cycle.
    fn assert_acyclic(nodes: &[Node]) {
        let by_name: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut pending = vec![0; nodes.len()];
        let mut consumers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
        for (c, n) in nodes.iter().enumerate() {
            for i in &n.inputs {
                let src = i.strip_prefix('^').unwrap_or_else(|| source(i).0);
                if let Some(&p) = by_name.get(src) {
                    pending[c] += 1;
                    consumers[p].push(c);
                }
            }
        }
        let mut ready: Vec<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
        let mut done = 0;
        while let Some(p) = ready.pop() {
            done += 1;
            for &c in &consumers[p] {
                pending[c] -= 1;
                if pending[c] == 0 {
                    ready.push(c);
                }
            }
        }
        assert_eq!(done, nodes.len(), "a cycle: {:?}", names_and_ops(nodes));
    }

    /// (name, op) of each node.
    fn names_and_ops(nodes: &[Node]) -> Vec<(&str, &str)> {
        nodes
            .iter()
            .map(|n| (n.name.as_str(), n.op.as_str()))
            .collect()
    }

    fn program(n: &Node) -> String {
        String::from_utf8(attr_str(n.attr("program").unwrap()).unwrap().to_vec()).unwrap()
    }

    /// Keras Adam's update of one variable after the rewrite of AssignSub: read m, v, var;
    /// var - m * alpha / (sqrt(v) + eps).
    fn adam_var() -> Vec<Node> {
        vec![
            node("m", "ReadVariableOp", &["m_h"], GPU, 1),
            node("mul", "Mul", &["m", "alpha"], GPU, 1),
            node("sqrt", "Sqrt", &["v:0"], GPU, 1),
            node("add", "AddV2", &["sqrt", "eps"], GPU, 1),
            node("div", "RealDiv", &["mul", "add"], GPU, 1),
            node("sub", "Sub", &["read_var", "div", "^ctl"], GPU, 1),
            node("assign", "AssignVariableOp", &["var_h", "sub"], GPU, 1),
        ]
    }

    #[test]
    fn a_tree_of_elementwise_nodes_becomes_one_node() {
        let out = fused(&adam_var(), &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [
                ("m", "ReadVariableOp"),
                ("sub", OP),
                ("assign", "AssignVariableOp")
            ]
        );
        let f = &out[1];
        assert_eq!(f.inputs, ["m", "alpha", "v:0", "eps", "read_var", "^ctl"]);
        assert_eq!(f.device, GPU);
        assert_eq!(
            program(f),
            "Mul(i0,i1);Sqrt(i2);AddV2(t1,i3);RealDiv(t0,t2);Sub(i4,t3)"
        );
        assert_eq!(f.attr("T"), Some(type_attr(1).as_slice()));
        assert_eq!(f.attr("N"), Some(int_attr(5).as_slice()));
        // The program is one the runtime accepts.
        fused::Program::parse(&program(f), 5).unwrap();
        // Nothing more to fuse.
        assert!(fused(&out, &[]).is_none());
    }

    #[test]
    fn a_long_chain_splits_into_programs_the_kernel_accepts() {
        // x = x * a + b, 100 times (200 ops, one consumer each): one group would be 200
        // instructions, over the kernel's limit (it failed at run time before).
        let mut nodes = vec![];
        let mut x = "x".to_string();
        for k in 0..100 {
            nodes.push(node(&format!("m{k}"), "Mul", &[&x, "a"], GPU, 1));
            nodes.push(node(
                &format!("s{k}"),
                "AddV2",
                &[&format!("m{k}"), "b"],
                GPU,
                1,
            ));
            x = format!("s{k}");
        }
        let out = fused(&nodes, &[]).expect("fused");
        let lens: Vec<usize> = out.iter().map(|n| program(n).split(';').count()).collect();
        assert!(
            lens.iter().all(|&l| l <= fused::MAX_INSTRUCTIONS),
            "program lengths {lens:?}"
        );
        assert_eq!(lens.iter().sum::<usize>(), 200, "every op in some group");
        assert_eq!(out.len(), 200usize.div_ceil(fused::MAX_INSTRUCTIONS));
    }

    #[test]
    fn shared_inputs_are_one_input() {
        // m + (g - m) * b: m read once, used twice.
        let nodes = vec![
            node("sub", "Sub", &["g", "m"], GPU, 1),
            node("mul", "Mul", &["sub", "b"], GPU, 1),
            node("add", "AddV2", &["m:0", "mul"], GPU, 1),
        ];
        let out = fused(&nodes, &[]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].inputs, ["g", "m", "b"]);
        assert_eq!(program(&out[0]), "Sub(i0,i1);Mul(t0,i2);AddV2(i1,t1)");
    }

    #[test]
    fn what_must_not_fuse() {
        let chain = |dev2: &str, t2: u64| {
            vec![
                node("a", "Mul", &["x", "y"], GPU, 1),
                node("b", "Relu", &["a"], dev2, t2),
            ]
        };
        // Another device, another dtype.
        assert!(fused(&chain(CPU, 1), &[]).is_none());
        assert!(fused(&chain(GPU, 19), &[]).is_none());
        // Half fuses with half.
        let mut h = chain(GPU, 19);
        h[0].attrs = vec![("T".into(), type_attr(19))];
        assert!(fused(&h, &[]).is_some());
        // int32 / double are not fusible.
        let mut i = chain(GPU, 3);
        i[0].attrs = vec![("T".into(), type_attr(3))];
        assert!(fused(&i, &[]).is_none());
        // Interior node with two consumers.
        let mut two = chain(GPU, 1);
        two.push(node("c", "Exp", &["a"], GPU, 1));
        let out = fused_with(&two, &[], 7, false);
        assert!(out.is_none(), "a has two consumers");
        // With multi-output groups, a is output 1 of one of its consumers' group.
        let out = fused(&two, &[]).expect("fused");
        assert_eq!(out.iter().filter(|n| n.op == OP_MULTI).count(), 1);
        // Interior node fetched (to preserve).
        assert!(fused(&chain(GPU, 1), &["a"]).is_none());

        // The root may be preserved (it keeps its name) and control-depended on.
        let mut root = chain(GPU, 1);
        root.push(node("n", "NoOp", &["^b"], GPU, 1));
        let out = fused(&root, &["b"]).unwrap();
        assert_eq!(out[0].name, "b");
        assert_eq!(out[1].inputs, ["^b"]);
        // Non-elementwise ops, NCHW BiasAdd.
        let mm = vec![
            node("a", "MatMul", &["x", "y"], GPU, 1),
            node("b", "Relu", &["a"], GPU, 1),
        ];
        assert!(fused(&mm, &[]).is_none());
        let mut nchw = vec![
            node("a", "BiasAdd", &["x", "bias"], GPU, 1),
            node("b", "Relu", &["a"], GPU, 1),
        ];
        nchw[0].attrs.push(("data_format".into(), str_attr("NCHW")));
        assert!(fused(&nchw, &[]).is_none());
        nchw[0].attrs[1] = ("data_format".into(), str_attr("NHWC"));
        let out = fused(&nchw, &[]).unwrap();
        assert_eq!(program(&out[0]), "BiasAdd(i0,i1);Relu(t0)");
    }

    /// A Const node holding int32 values (as `tensor_content`, or one `int_val` for all).
    fn const_i32(name: &str, v: &[i32], compact: bool) -> Node {
        let mut t = vec![];
        varint(1 << 3, &mut t);
        varint(3, &mut t); // DT_INT32
        let mut dim = vec![];
        varint(1 << 3, &mut dim);
        varint(v.len() as u64, &mut dim);
        let mut shape = vec![];
        bytes_field(2, &dim, &mut shape);
        bytes_field(2, &shape, &mut t);
        if compact {
            varint(7 << 3, &mut t);
            varint(v[0] as i64 as u64, &mut t);
        } else {
            let content: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            bytes_field(4, &content, &mut t);
        }
        let mut a = vec![];
        bytes_field(8, &t, &mut a);
        let mut n = node(name, "Const", &[], GPU, 1);
        n.attrs = vec![("value".into(), a), ("dtype".into(), type_attr(3))];
        n
    }

    /// Batch norm's apply, `out` = x * scale + (beta - mean * scale) with scale = gamma *
    /// rsqrt(var + eps) (nodes v, r, scale, xs, ms, shift, out).
    fn bn_apply(out: &str) -> Vec<Node> {
        vec![
            node("v", "AddV2", &["var", "eps"], GPU, 1),
            node("r", "Rsqrt", &["v"], GPU, 1),
            node("scale", "Mul", &["r", "gamma"], GPU, 1),
            node("xs", "Mul", &["x", "scale"], GPU, 1),
            node("ms", "Mul", &["mean", "scale"], GPU, 1),
            node("shift", "Sub", &["beta", "ms"], GPU, 1),
            node(out, "AddV2", &["xs", "shift"], GPU, 1),
        ]
    }

    #[test]
    fn a_result_used_twice_inside_the_group_is_computed_once() {
        // Batch norm's apply: scale = gamma * rsqrt(var + eps) feeds x * scale and
        // mean * scale; both uses are in the group, so scale joins it (a DAG).
        let nodes = bn_apply("y");
        let out = fused(&nodes, &[]).expect("fused");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "y");
        assert_eq!(out[0].inputs, ["var", "eps", "gamma", "x", "mean", "beta"]);
        let p = program(&out[0]);
        assert_eq!(
            p,
            "AddV2(i0,i1);Rsqrt(t0);Mul(t1,i2);Mul(i3,t2);Mul(i4,t2);Sub(i5,t4);AddV2(t3,t5)"
        );
        fused::Program::parse(&p, 6).unwrap();
        // With another consumer outside, `scale` stays a node of its own without
        // multi-output groups, and is output 1 of the group with them.
        let mut outside = nodes;
        outside.push(node("other", "Exp", &["scale"], GPU, 1));
        let out = fused_with(&outside, &[], 7, false).expect("fused");
        assert!(out.iter().any(|n| n.name == "scale"));
        let out = fused(&outside, &[]).expect("fused");
        assert_eq!(names_and_ops(&out), [("y", OP_MULTI), ("other", "Exp")]);
        assert_eq!(out[1].inputs, ["y:1"]);
    }

    #[test]
    fn addn_becomes_a_chain_of_additions_in_order() {
        let mut addn = node("s", "AddN", &["a", "b", "c"], GPU, 1);
        addn.attrs.push(("N".into(), int_attr(3)));
        let nodes = vec![
            node("b", "Mul", &["x", "y"], GPU, 1),
            addn,
            node("r", "ReluGrad", &["s", "f"], GPU, 1),
        ];
        let out = fused(&nodes, &[]).expect("fused");
        assert_eq!(out.len(), 1);
        // Producers first: b's inputs, then the AddN's others in order, then ReluGrad's.
        assert_eq!(out[0].inputs, ["x", "y", "a", "c", "f"]);
        let p = program(&out[0]);
        assert_eq!(p, "Mul(i0,i1);AddV2(i2,t0);AddV2(t1,i3);ReluGrad(t2,i4)");
        fused::Program::parse(&p, 5).unwrap();
        // AddN with N missing or over 9 inputs stays as it is.
        let mut bad = node("s", "AddN", &["a", "b"], GPU, 1);
        bad.attrs.push(("N".into(), int_attr(3)));
        assert!(fused(&[bad, node("r", "Relu", &["s"], GPU, 1)], &[]).is_none());
        let ins: Vec<String> = (0..10).map(|k| format!("x{k}")).collect();
        let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
        let mut ten = node("s", "AddN", &refs, GPU, 1);
        ten.attrs.push(("N".into(), int_attr(10)));
        assert!(fused(&[ten, node("r", "Relu", &["s"], GPU, 1)], &[]).is_none());
    }

    /// The gradient of a mean over N, H, W: Reshape to [1,1,1,C], Tile by [N,H,W,1], scale.
    fn mean_grad(shape: &[i32], multiples: &[i32], compact: bool) -> Vec<Node> {
        vec![
            const_i32("shape", shape, false),
            const_i32("mult", multiples, compact),
            node("rs", "Reshape", &["g", "shape"], GPU, 1),
            node("tile", "Tile", &["rs", "mult"], GPU, 1),
            node("div", "Mul", &["inv_n", "tile"], GPU, 1),
            node("sum", "AddV2", &["dx", "div", "^ctl"], GPU, 1),
        ]
    }

    #[test]
    fn tiles_with_constant_multiples_fuse() {
        let out = fused(&mean_grad(&[1, 1, 1, 8], &[4, 5, 6, 1], false), &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [
                ("shape", "Const"),
                ("mult", "Const"),
                ("rs", "Reshape"),
                ("sum", OP_TILED)
            ]
        );
        let f = &out[3];
        // The multiples are in the program, not an input.
        assert_eq!(f.inputs, ["rs", "inv_n", "dx", "^ctl"]);
        let p = program(f);
        assert_eq!(p, "Tile[4x5x6x1](i0);Mul(i1,t0);AddV2(i2,t1)");
        fused::Program::parse(&p, 3).unwrap();
        // Multiples given as one value for all: Tile by [3,3,3].
        let out = fused(&mean_grad(&[1, 1, 1], &[3, 3, 3], true), &[]).expect("fused");
        assert_eq!(program(&out[3]), "Tile[3x3x3](i0);Mul(i1,t0);AddV2(i2,t1)");
        // Any constant multiples join (the kernel materializes a Tile that is no broadcast);
        // the Tile's input stays an input, even when a member could produce it.
        let mut n = mean_grad(&[1, 1, 1, 8], &[4, 5, 6, 2], false);
        n[2] = node("rs", "Neg", &["g"], GPU, 1);
        let out = fused(&n, &[]).expect("fused");
        assert!(out.iter().any(|n| n.name == "rs" && n.op == "Neg"));
        let f = out
            .iter()
            .find(|n| n.op == OP_TILED)
            .expect("a tiled group");
        assert_eq!(program(f), "Tile[4x5x6x2](i0);Mul(i1,t0);AddV2(i2,t1)");
        // Its input is an input of its own even where another member reads the same tensor.
        let mut n = mean_grad(&[1, 1, 1, 8], &[4, 5, 6, 1], false);
        n[5].inputs[0] = "rs".into();
        let out = fused(&n, &[]).expect("fused");
        let f = out
            .iter()
            .find(|n| n.op == OP_TILED)
            .expect("a tiled group");
        assert_eq!(f.inputs, ["rs", "inv_n", "rs", "^ctl"]);
        assert_eq!(program(f), "Tile[4x5x6x1](i0);Mul(i1,t0);AddV2(i2,t1)");
        // Multiples that are no constant: the Tile stays, the rest fuses without it.
        let mut n = mean_grad(&[1, 1, 1, 8], &[4, 5, 6, 1], false);
        n[3].inputs[1] = "computed".into();
        let out = fused(&n, &[]).expect("the Mul and AddV2 fuse");
        assert!(out.iter().any(|n| n.op == "Tile"));
        let f = out.iter().find(|n| n.op == OP).expect("a plain fused node");
        assert_eq!(program(f), "Mul(i0,i1);AddV2(i2,t0)");
    }

    #[test]
    fn control_edges_from_interior_members_wait_for_their_inputs() {
        // The AssignAdd rewrite: the read waits for the delta (^d), whose producer chain is
        // fused into the add that consumes the read.
        let mut read = node("r", "ReadVariableOp", &["v_h", "^d", "^prev"], GPU, 1);
        read.attrs.push(("_extra".into(), int_attr(7)));
        let nodes = vec![
            node("s", "Sub", &["g", "m", "^c0"], GPU, 1),
            node("d", "Mul", &["s", "b:1"], GPU, 1),
            read,
            node("add", "AddV2", &["r", "d"], GPU, 1),
            node("n", "NoOp", &["^s", "^add"], CPU, 1),
        ];
        let out = fused(&nodes, &[]).unwrap();
        let ops = names_and_ops(&out);
        assert_eq!(ops, [("r", "ReadVariableOp"), ("add", OP), ("n", "NoOp")]);
        // ^d -> d's inputs (s expanded to g, m and its control input c0; b).
        assert_eq!(out[0].inputs, ["v_h", "^g", "^m", "^c0", "^b", "^prev"]);
        assert_eq!(out[0].attr("_extra"), Some(int_attr(7).as_slice()));
        assert_eq!(out[1].inputs, ["g", "m", "b:1", "r", "^c0"]);
        assert_eq!(program(&out[1]), "Sub(i0,i1);Mul(t0,i2);AddV2(i3,t1)");
        assert_eq!(out[2].inputs, ["^g", "^m", "^c0", "^add"]);
    }

    #[test]
    fn groups_stay_within_the_input_limit() {
        // A sum of 10 distinct tensors: ((x0 + x1) + x2) + ... : groups of at most 7 inputs.
        let mut nodes = vec![node("s1", "AddV2", &["x0", "x1"], GPU, 1)];
        for k in 2..10 {
            let prev = format!("s{}", k - 1);
            let x = format!("x{k}");
            nodes.push(node(&format!("s{k}"), "AddV2", &[&prev, &x], GPU, 1));
        }
        let out = fused(&nodes, &[]).unwrap();
        let f: Vec<_> = out.iter().filter(|n| n.op == OP).collect();
        assert_eq!(
            f.len(),
            2,
            "{:?}",
            out.iter().map(|n| &n.name).collect::<Vec<_>>()
        );
        let mut total = 0;
        for n in &f {
            let inputs = n.inputs.len();
            assert!(inputs <= 7);
            let p = program(n);
            fused::Program::parse(&p, inputs).unwrap();
            total += p.split(';').count();
        }
        assert_eq!(total, 9, "every node in exactly one group");
        assert_eq!(out.last().unwrap().name, "s9");
        // Where the devices bind 16 tensors, the whole sum is one group.
        let keep = HashSet::new();
        let out = parse(&fuse(&graph(&nodes), &keep, 15).unwrap().unwrap());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].inputs.len(), 10);
        fused::Program::parse(&program(&out[0]), 10).unwrap();
    }

    #[test]
    fn shape_function_picks_the_input_others_broadcast_to() {
        let s = |d: &[i64]| Some(d.iter().map(|&x| (x >= 0).then_some(x)).collect::<Vec<_>>());
        assert_eq!(dominant(&[s(&[3]), s(&[-1, 3]), s(&[])]), Some(1));
        assert_eq!(dominant(&[s(&[4, 1]), s(&[3])]), None);
        assert_eq!(dominant(&[s(&[5, 3]), s(&[-1])]), Some(0));
        assert_eq!(dominant(&[s(&[1]), s(&[-1])]), Some(1));
        assert_eq!(dominant(&[s(&[2]), None]), None);
    }

    #[test]
    fn other_graph_fields_and_untouched_nodes_are_kept_byte_for_byte() {
        let mut g = graph(&adam_var());
        bytes_field(4, b"\x08\x01", &mut g);
        let out = fuse(&g, &HashSet::new(), 7).unwrap().unwrap();
        assert!(out.ends_with(&{
            let mut v = vec![];
            bytes_field(4, b"\x08\x01", &mut v);
            v
        }));
        let mut first = vec![];
        adam_var()[0].encode(&mut first);
        assert!(out.starts_with(&first));
    }

    /// Keras SGD with momentum after the AssignAdd rewrite: m' = m * mom - g * lr is assigned
    /// to m and added to the variable, whose read waits for m' (`^d`).
    fn sgd_var() -> Vec<Node> {
        vec![
            node("mm", "Mul", &["m", "mom"], GPU, 1),
            node("gl", "Mul", &["g", "lr"], GPU, 1),
            node("d", "Sub", &["mm", "gl"], GPU, 1),
            node("assign_m", "AssignVariableOp", &["m_h", "d"], GPU, 1),
            node("read", "ReadVariableOp", &["var_h", "^d", "^c"], GPU, 1),
            node("add", "AddV2", &["read", "d"], GPU, 1),
            node("assign", "AssignVariableOp", &["var_h", "add"], GPU, 1),
            node("done", "NoOp", &["^assign", "^assign_m", "^d"], CPU, 1),
        ]
    }

    fn ints(n: &Node, key: &str) -> Vec<i64> {
        let mut r = Reader::new(n.attr(key).unwrap());
        let Some((1, Field::Bytes(list))) = r.next().unwrap() else {
            panic!("{key} is no list")
        };
        let mut r = Reader::new(list);
        let mut out = vec![];
        while let Some((f, v)) = r.next().unwrap() {
            match (f, v) {
                (3, Field::Bytes(packed)) => {
                    let mut p = Reader::new(packed);
                    while p.pos < packed.len() {
                        out.push(p.varint().unwrap() as i64);
                    }
                }
                (3, Field::Varint(x)) => out.push(x as i64),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn values_used_outside_become_more_outputs() {
        let out = fused(&sgd_var(), &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [
                ("assign_m", "AssignVariableOp"),
                ("read", "ReadVariableOp"),
                ("add", OP_MULTI),
                ("assign", "AssignVariableOp"),
                ("done", "NoOp"),
            ]
        );
        let f = &out[2];
        assert_eq!(f.inputs, ["m", "mom", "g", "lr", "read"]);
        let p = program(f);
        assert_eq!(p, "Mul(i0,i1);Mul(i2,i3);Sub(t0,t1);AddV2(i4,t2)");
        assert_eq!(f.attr("M"), Some(int_attr(2).as_slice()));
        assert_eq!(ints(f, "exports"), [2]);
        fused::Program::parse_multi(&p, 4 + 1, &[2]).unwrap();
        // m' is output 1 of the fused node; control edges from it wait for its inputs.
        assert_eq!(out[0].inputs, ["m_h", "add:1"]);
        assert_eq!(out[1].inputs, ["var_h", "^m", "^mom", "^g", "^lr", "^c"]);
        assert_eq!(
            out[4].inputs,
            ["^assign", "^assign_m", "^m", "^mom", "^g", "^lr"]
        );
        // Off: the single-output groups of before.
        let off = fused_with(&sgd_var(), &[], 7, false).expect("fused");
        assert!(off.iter().any(|n| n.name == "d" && n.op == OP));
        assert!(off.iter().all(|n| n.op != OP_MULTI));
    }

    #[test]
    fn what_must_not_become_an_output() {
        // A fetched (preserved) value keeps its node.
        let out = fused(&sgd_var(), &["d"]).expect("the Sub group fuses");
        assert!(out.iter().any(|n| n.name == "d" && n.op == OP));
        assert!(out.iter().all(|n| n.op != OP_MULTI));
        // The value's outside consumer feeds the group back (data): a cycle.
        let mut cyc = sgd_var();
        cyc[3] = node("assign_m", "Exp2", &["d"], GPU, 1);
        cyc[4] = node("read", "ReadVariableOp", &["var_h", "assign_m"], GPU, 1);
        let out = fused(&cyc, &[]).expect("the Sub group fuses");
        assert!(
            out.iter().all(|n| n.op != OP_MULTI),
            "{:?}",
            names_and_ops(&out)
        );
        // ... or through a control edge.
        let mut cyc = sgd_var();
        cyc[4].inputs.push("^assign_m".into());
        let out = fused(&cyc, &[]).expect("the Sub group fuses");
        assert!(
            out.iter().all(|n| n.op != OP_MULTI),
            "{:?}",
            names_and_ops(&out)
        );
        // ... or through another group only: j1 reads m' and j2 feeds the variable's read
        // (through k); j1 and j2 are in no path, but in one group once j2 is an output of
        // jr's group. One of the two merges is made, not both.
        let mut via = sgd_var();
        via.push(node("j1", "Neg", &["d"], GPU, 1));
        via.push(node("j2", "Exp", &["w"], GPU, 1));
        via.push(node("jr", "AddV2", &["j1", "j2"], GPU, 1));
        via.push(node("k", "Pack", &["j2"], GPU, 1));
        via[4].inputs.push("^k".into());
        let out = fused(&via, &[]).expect("fused");
        let multi: Vec<&str> = out
            .iter()
            .filter(|n| n.op == OP_MULTI)
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(multi.len(), 1, "{:?}", names_and_ops(&out));
        // Another device or dtype.
        let mut dev = sgd_var();
        dev[5].device = CPU.into();
        let out = fused(&dev, &[]).expect("the Sub group fuses");
        assert!(out.iter().all(|n| n.op != OP_MULTI));
        let mut half = sgd_var();
        half[5].attrs = vec![("T".into(), type_attr(19))];
        let out = fused(&half, &[]).expect("the Sub group fuses");
        assert!(out.iter().all(|n| n.op != OP_MULTI));
        // Read at another port: no output 0 to export.
        let mut port = sgd_var();
        port[3].inputs[1] = "d:1".into();
        let out = fused(&port, &[]);
        assert!(out.is_none_or(|o| o.iter().all(|n| n.op != OP_MULTI)));
        // Over the binding limit: 7 inputs and 2 outputs do not fit 8 bindings.
        let mut wide = sgd_var();
        wide[0] = node("mm", "Mul", &["m", "mom"], GPU, 1);
        wide.insert(0, node("s1", "AddV2", &["a1", "a2"], GPU, 1));
        wide.insert(0, node("s2", "AddV2", &["s1", "a3"], GPU, 1));
        let k = wide.iter().position(|n| n.name == "gl").unwrap();
        wide[k] = node("gl", "Mul", &["g", "s2"], GPU, 1);
        let out = fused(&wide, &[]).expect("fused");
        let f = out.iter().find(|n| n.name == "d").expect("d stays a node");
        assert_eq!(f.inputs.len(), 6);
    }

    #[test]
    fn chains_of_outside_uses_collapse_into_one_node() {
        // Batch norm: r = rsqrt(var + eps) and scale = r * gamma are used by the gradient too;
        // y = relu(x * scale + (beta - mean * scale)).
        let mut nodes = bn_apply("sum");
        nodes.extend([
            node("y", "Relu", &["sum"], GPU, 1),
            node("gr", "SqrtGrad", &["r", "dr"], GPU, 1),
            node("gs", "Conv2D", &["dy", "scale"], GPU, 1),
        ]);
        // 6 inputs and 3 outputs: more than 8 bindings.
        let out = fused(&nodes, &[]).expect("fused");
        assert!(out.iter().any(|n| n.name == "r" && n.op == OP));
        let out = fused_with(&nodes, &[], 15, true).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(ops, [("y", OP_MULTI), ("gr", "SqrtGrad"), ("gs", "Conv2D")]);
        let f = &out[0];
        let p = program(f);
        assert_eq!(
            p,
            "AddV2(i0,i1);Rsqrt(t0);Mul(t1,i2);Mul(i3,t2);Mul(i4,t2);Sub(i5,t4);AddV2(t3,t5);Relu(t6)"
        );
        // scale (output 1) joined first, then r (output 2): outputs in program order.
        assert_eq!(ints(f, "exports"), [1, 2]);
        assert_eq!(out[1].inputs, ["y:1", "dr"]);
        assert_eq!(out[2].inputs, ["dy", "y:2"]);
        fused::Program::parse_multi(&p, 6, &[1, 2]).unwrap();
    }

    /// A float reduction (`T` = `t`) of `x` over `axes`, with Keras's attributes.
    fn reduction(name: &str, op: &str, inputs: &[&str], device: &str, t: u64) -> Node {
        let mut n = node(name, op, inputs, device, t);
        let mut b = vec![];
        varint(5 << 3, &mut b);
        varint(1, &mut b);
        n.attrs.push(("keep_dims".into(), b));
        n.attrs.push(("Tidx".into(), type_attr(3)));
        n
    }

    fn str_of(n: &Node, key: &str) -> String {
        String::from_utf8(attr_str(n.attr(key).unwrap()).unwrap().to_vec()).unwrap()
    }

    /// Keras's moments: mean = Mean(x), variance = Mean(SquaredDifference(x, mean)).
    fn moments() -> Vec<Node> {
        vec![
            reduction("mean", "Mean", &["x", "axes"], GPU, 1),
            node("sq", "SquaredDifference", &["x", "mean", "^c0"], GPU, 1),
            reduction("var", "Mean", &["sq", "axes2", "^c1"], GPU, 1),
            node("use", "Rsqrt", &["var"], GPU, 1),
        ]
    }

    #[test]
    fn a_reduction_of_an_elementwise_result_becomes_one_node() {
        let out = fused(&moments(), &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [("mean", "Mean"), ("var", OP_REDUCE), ("use", "Rsqrt")]
        );
        let f = &out[1];
        // The axes first (host memory), then the program's inputs, then the control inputs.
        assert_eq!(f.inputs, ["axes2", "x", "mean", "^c0", "^c1"]);
        assert_eq!(f.device, GPU);
        assert_eq!(program(f), "SquaredDifference(i0,i1)");
        assert_eq!(str_of(f, "reduce"), "Mean");
        assert_eq!(f.attr("N"), Some(int_attr(2).as_slice()));
        assert_eq!(f.attr("T"), Some(type_attr(1).as_slice()));
        assert_eq!(f.attr("Tidx"), Some(type_attr(3).as_slice()));
        assert_eq!(f.attr("keep_dims"), out[0].attr("keep_dims"));
        fused::Program::parse(&program(f), 2).unwrap();
        // A chain: Sum(Relu(x * y + z)) is one node, the program in order.
        let chain = vec![
            node("m", "Mul", &["x", "y"], GPU, 1),
            node("a", "AddV2", &["m", "z"], GPU, 1),
            node("r", "Relu", &["a"], GPU, 1),
            reduction("s", "Sum", &["r", "axes"], GPU, 1),
        ];
        let out = fused(&chain, &[]).expect("fused");
        assert_eq!(names_and_ops(&out), [("s", OP_REDUCE)]);
        assert_eq!(out[0].inputs, ["axes", "x", "y", "z"]);
        assert_eq!(program(&out[0]), "Mul(i0,i1);AddV2(t0,i2);Relu(t1)");
        assert_eq!(str_of(&out[0], "reduce"), "Sum");
        // Every TensorFlow reduction the reduce family has for float32.
        for op in ["Sum", "Mean", "Max", "Min", "Prod"] {
            let mut g = moments();
            g[2] = reduction("var", op, &["sq", "axes2"], GPU, 1);
            let out = fused(&g, &[]).expect(op);
            assert_eq!(str_of(&out[1], "reduce"), op);
        }
        // Off (TFWGPU_FUSION_REDUCE=0): nothing to fuse here.
        let keep = HashSet::new();
        let off = Options {
            multi: true,
            reduce: false,
        };
        assert!(
            fuse_opts(&graph(&moments()), &keep, 7, off)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn values_used_elsewhere_are_more_outputs_of_the_reduction() {
        // Batch norm's gradient: rg = ReluGrad(dy + dr, y) feeds Sum(rg * x_hat), Sum(rg) and
        // dx; the product (used by the sum only) joins the reduction, and rg (used three
        // times) is computed by it too, as output 1.
        let nodes = vec![
            node("a", "AddV2", &["dy", "dr"], GPU, 1),
            node("rg", "ReluGrad", &["a", "y"], GPU, 1),
            node("m", "Mul", &["rg", "xhat"], GPU, 1),
            reduction("s1", "Sum", &["m", "axes"], GPU, 1),
            reduction("s2", "Sum", &["rg", "axes"], GPU, 1),
            node("dx", "Mul", &["rg", "s1"], GPU, 1),
        ];
        let out = fused(&nodes, &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [("s1", OP_REDUCE_MULTI), ("s2", "Sum"), ("dx", "Mul")],
            "{ops:?}"
        );
        let f = &out[0];
        assert_eq!(f.inputs, ["axes", "dy", "dr", "y", "xhat"]);
        let p = program(f);
        assert_eq!(p, "AddV2(i0,i1);ReluGrad(t0,i2);Mul(t1,i3)");
        assert_eq!(str_of(f, "reduce"), "Sum");
        assert_eq!(f.attr("M"), Some(int_attr(1).as_slice()));
        assert_eq!(ints(f, "exports"), [1]);
        fused::Program::parse_multi(&p, 4, &[1]).unwrap();
        assert_eq!(out[1].inputs, ["s1:1", "axes"]);
        assert_eq!(out[2].inputs, ["s1:1", "s1"]);
        // Without multi-output groups rg is a group of its own.
        let out = fused_with(&nodes, &[], 7, false).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [("rg", OP), ("s1", OP_REDUCE), ("s2", "Sum"), ("dx", "Mul")],
            "{ops:?}"
        );
        assert_eq!(out[1].inputs, ["axes", "rg", "xhat"]);
        assert_eq!(program(&out[1]), "Mul(i0,i1)");
        // Where rg's consumer outside feeds the first reduction's program (a cycle through
        // dx), rg is computed by the other reduction, whose input it is; a group holding a
        // Tile is no export.
        let mut cyc = nodes.clone();
        cyc[5] = node("dx", "Pack", &["rg"], GPU, 1);
        cyc[2] = node("m", "Mul", &["rg", "dx"], GPU, 1);
        let out = fused(&cyc, &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [("s1", OP_REDUCE), ("s2", OP_REDUCE_MULTI), ("dx", "Pack")],
            "{ops:?}"
        );
        assert_eq!(program(&out[1]), "AddV2(i0,i1);ReluGrad(t0,i2)");
        assert_eq!(ints(&out[1], "exports"), [1]);
        assert_eq!(out[0].inputs, ["axes", "s2:1", "dx"]);
        let mut tiled = nodes.clone();
        tiled.insert(0, const_i32("mult", &[4, 1], false));
        tiled[1] = node("a", "Tile", &["dy", "mult"], GPU, 1);
        let out = fused(&tiled, &[]).expect("fused");
        assert!(
            out.iter().all(|n| n.op != OP_REDUCE_MULTI),
            "{:?}",
            names_and_ops(&out)
        );
        assert!(
            out.iter().any(|n| n.op == OP_REDUCE),
            "{:?}",
            names_and_ops(&out)
        );
    }

    #[test]
    fn the_reduced_tensor_itself_can_be_an_output() {
        // A convolution's BiasAdd feeds batch norm's mean, its variance and the
        // normalization: the mean's kernel computes it (output 1) as it reduces it.
        let mut ba = node("ba", "BiasAdd", &["conv", "b"], GPU, 1);
        ba.attrs.push(("data_format".into(), str_attr("NHWC")));
        let nodes = vec![
            ba,
            reduction("mean", "Mean", &["ba", "axes"], GPU, 1),
            node("sq", "SquaredDifference", &["ba", "mean"], GPU, 1),
            reduction("var", "Mean", &["sq", "axes"], GPU, 1),
            node("norm", "Mul", &["ba", "var"], GPU, 1),
        ];
        let out = fused(&nodes, &[]).expect("fused");
        let ops = names_and_ops(&out);
        assert_eq!(
            ops,
            [
                ("mean", OP_REDUCE_MULTI),
                ("var", OP_REDUCE),
                ("norm", "Mul")
            ],
            "{ops:?}"
        );
        assert_eq!(out[0].inputs, ["axes", "conv", "b"]);
        assert_eq!(program(&out[0]), "BiasAdd(i0,i1)");
        assert_eq!(ints(&out[0], "exports"), [0]);
        assert_eq!(out[1].inputs, ["axes", "mean:1", "mean"]);
        assert_eq!(out[2].inputs, ["mean:1", "var"]);
    }

    #[test]
    fn what_must_not_join_a_reduction() {
        let no_reduce = |g: &[Node], preserve: &[&str]| {
            fused(g, preserve).is_none_or(|o| o.iter().all(|n| n.op != OP_REDUCE))
        };
        // The producer has another consumer (data), or is fetched.
        let mut two = moments();
        two.push(node("other", "Exp", &["sq"], GPU, 1));
        assert!(no_reduce(&two, &[]));
        assert!(no_reduce(&moments(), &["sq"]));
        // Another device: the reduction, or the producer.
        let mut dev = moments();
        dev[2].device = CPU.into();
        assert!(no_reduce(&dev, &[]));
        let mut dev = moments();
        dev[1].device = CPU.into();
        assert!(no_reduce(&dev, &[]));
        // Dtypes the reduce family has no float kernel for (half, double), or a half program.
        for t in [19, 2, 3] {
            let mut d = moments();
            d[1].attrs = vec![("T".into(), type_attr(t))];
            d[2].attrs[0] = ("T".into(), type_attr(t));
            assert!(no_reduce(&d, &[]), "T = {t}");
        }
        // A Tile (its kernel has no place to materialize one), a read at another port.
        let tile = vec![
            const_i32("mult", &[4, 1], false),
            node("t", "Tile", &["g", "mult"], GPU, 1),
            reduction("s", "Sum", &["t", "axes"], GPU, 1),
        ];
        assert!(no_reduce(&tile, &[]));
        let mut port = moments();
        port[2].inputs[0] = "sq:1".into();
        assert!(no_reduce(&port, &[]));
        // A reduction without its two data inputs is left alone.
        let mut one = moments();
        one[2].inputs = vec!["sq".into()];
        assert!(no_reduce(&one, &[]));
        // Non-reductions (ArgMax, All) stay as they are.
        let mut argmax = moments();
        argmax[2].op = "ArgMax".into();
        assert!(no_reduce(&argmax, &[]));
    }

    #[test]
    fn control_edges_around_a_reduction_group() {
        // A control edge from the interior member waits for its inputs; the member's own
        // control inputs move to the fused node.
        let mut g = moments();
        g.push(node("after", "NoOp", &["^sq", "^var"], CPU, 1));
        let out = fused(&g, &[]).expect("fused");
        let after = out.iter().find(|n| n.name == "after").unwrap();
        assert_eq!(after.inputs, ["^x", "^mean", "^c0", "^var"]);
        let f = out.iter().find(|n| n.op == OP_REDUCE).unwrap();
        assert_eq!(f.inputs, ["axes2", "x", "mean", "^c0", "^c1"]);
        // The reduction's result feeding back into its own program through a control edge
        // is a cycle TensorFlow would reject already; a producer that waits on another
        // reduction is fine.
        let mut g = moments();
        g[1].inputs.push("^mean".into());
        let out = fused(&g, &[]).expect("fused");
        let f = out.iter().find(|n| n.op == OP_REDUCE).unwrap();
        assert!(f.inputs.contains(&"^mean".to_string()), "{:?}", f.inputs);
    }

    #[test]
    fn encodes_string_attrs() {
        let mut v = vec![];
        varint(2 << 3 | 2, &mut v);
        varint(3, &mut v);
        v.extend_from_slice(b"abc");
        assert_eq!(str_attr("abc"), v);
    }

    /// Keras's dropout and its gradient: one comparison, read by the forward's select and the
    /// gradient's.
    fn dropout() -> Vec<Node> {
        vec![
            node("ge", "GreaterEqual", &["random", "rate"], GPU, 1),
            node("scaled", "Mul", &["x", "scale"], GPU, 1),
            node("fwd", "SelectV2", &["ge", "scaled", "zero"], GPU, 1),
            node("flat", "Reshape", &["fwd", "shape"], GPU, 1),
            node("back", "SelectV2", &["ge", "dy", "zero"], GPU, 1),
            node("grad", "Mul", &["back", "scale"], GPU, 1),
            node("pool_grad", "AvgPoolGrad", &["s", "grad"], GPU, 1),
        ]
    }

    #[test]
    fn a_comparison_read_by_two_selects_is_copied_into_both_programs() {
        let out = fused(&dropout(), &[]).expect("fused");
        let by: HashMap<&str, &Node> = out.iter().map(|n| (n.name.as_str(), n)).collect();
        assert_eq!(by["fwd"].op, OP);
        assert_eq!(
            program(by["fwd"]),
            "GreaterEqual(i0,i1);Mul(i2,i3);SelectV2(t0,t1,i4)"
        );
        assert_eq!(by["fwd"].inputs, ["random", "rate", "x", "scale", "zero"]);
        assert_eq!(by["grad"].op, OP);
        assert_eq!(
            program(by["grad"]),
            "GreaterEqual(i0,i1);SelectV2(t0,i2,i3);Mul(t1,i4)"
        );
        assert_eq!(by["grad"].inputs, ["random", "rate", "dy", "zero", "scale"]);
        // No comparison or select node is left.
        for n in &out {
            assert!(
                !matches!(n.op.as_str(), "GreaterEqual" | "SelectV2"),
                "{}",
                n.name
            );
        }
    }

    #[test]
    fn a_comparison_never_roots_a_group_and_waited_on_ones_are_not_copied() {
        // The comparison's bool is returned: it stays a node; its producer is not fused into
        // it (a program's output is never a bool).
        let nodes = vec![
            node("d", "Sub", &["a", "b"], GPU, 1),
            node("gt", "Greater", &["d", "c"], GPU, 1),
            node("ret", "_Retval", &["gt"], GPU, 10),
        ];
        assert!(fused(&nodes, &[]).is_none());
        // Waited on by a control edge: no copies, and a select whose condition its program
        // cannot compute is no member of any group (its condition would be a bool input):
        // here nothing is left to fuse.
        let mut nodes = dropout();
        nodes.push(node("after", "NoOp", &["^ge"], GPU, 1));
        assert!(fused(&nodes, &[]).is_none());
        // A select with another member: the product fuses, the select does not.
        let nodes = vec![
            node("m", "Relu", &["x"], GPU, 1),
            node("sel", "SelectV2", &["cond_in", "m", "zero"], GPU, 1),
            node("neg", "Neg", &["sel"], GPU, 1),
            node("r", "_Retval", &["neg"], GPU, 1),
        ];
        assert!(fused(&nodes, &[]).is_none());
    }
}
