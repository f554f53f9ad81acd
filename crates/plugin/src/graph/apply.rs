//! The fused optimizer updates (`ResourceApplyAdam` and friends) placed on a tfwgpu GPU,
//! expanded into ops that run here: one `ReadVariableOp` per variable, the update as
//! elementwise ops (`AddV2`, `Sub`, `Mul`, `RealDiv`, `Sqrt`, `Rsqrt`, `Square`, a `Const` 1),
//! one `AssignVariableOp` per variable, and a `NoOp` that keeps the node's name and waits for
//! every assignment (these ops have no outputs: their consumers hold control edges).
//!
//! The formulas and their order of operations are those of TensorFlow's CPU functors
//! (tensorflow/core/kernels/training_ops.cc), one op per Eigen operation, so that the rounding
//! matches: e.g. Adam's `var -= (m * alpha) / (v.sqrt() + epsilon)` with
//! `alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)` computed from the scalars.
//!
//! The reads take over the node's control inputs and wait for its other inputs (see
//! `super::read_after`), so they still run after whatever the update was ordered after. `use_locking` cannot be honoured: the reads and assignments of one update
//! are not atomic with respect to another update of the same variable running concurrently.

use super::{Node, varint};

/// (op, its resource inputs in order): the ops expanded here. Their other inputs are tensors
/// of type `T`; the plugin registers guard kernels for them (crate::variables) so that
/// TensorFlow places them on the GPU, where this rewrite replaces them.
pub const APPLY_OPS: &[(&str, &[&str])] = &[
    ("ResourceApplyGradientDescent", &["var"]),
    ("ResourceApplyMomentum", &["var", "accum"]),
    ("ResourceApplyKerasMomentum", &["var", "accum"]),
    ("ResourceApplyAdam", &["var", "m", "v"]),
    ("ResourceApplyRMSProp", &["var", "ms", "mom"]),
    ("ResourceApplyCenteredRMSProp", &["var", "mg", "ms", "mom"]),
    ("ResourceApplyAdagrad", &["var", "accum"]),
    ("ResourceApplyAdagradV2", &["var", "accum"]),
];

/// TensorFlow's DataType values the expansion handles: DT_FLOAT and DT_HALF (the float types
/// of the runtime's elementwise kernels).
const DT_FLOAT: u64 = 1;
const DT_HALF: u64 = 19;

/// The number of data inputs of each op (resources included).
fn arity(op: &str) -> Option<usize> {
    Some(match op {
        "ResourceApplyGradientDescent" => 3,
        "ResourceApplyMomentum" | "ResourceApplyKerasMomentum" => 5,
        "ResourceApplyAdam" => 10,
        "ResourceApplyRMSProp" => 8,
        "ResourceApplyCenteredRMSProp" => 9,
        "ResourceApplyAdagrad" => 4,
        "ResourceApplyAdagradV2" => 5,
        _ => return None,
    })
}

/// Reads one varint field of an encoded AttrValue (`type` is field 6, `b` is field 5).
fn attr_varint(value: &[u8], field: u32) -> Option<u64> {
    let mut r = crate::nodedef::Reader::new(value);
    let mut found = None;
    while let Ok(Some((f, v))) = r.next() {
        if let (true, crate::nodedef::Field::Varint(x)) = (f == field, v) {
            found = Some(x);
        }
    }
    found
}

fn attr_bool(node: &Node, key: &str) -> bool {
    node.attr(key)
        .and_then(|v| attr_varint(v, 5))
        .is_some_and(|b| b != 0)
}

/// An encoded AttrValue holding a bool.
fn bool_attr(b: bool) -> Vec<u8> {
    let mut v = vec![];
    varint(5 << 3, &mut v);
    varint(b as u64, &mut v);
    v
}

/// An encoded AttrValue holding a scalar TensorProto with the value 1 of `dt`.
fn one_tensor_attr(dt: u64) -> Vec<u8> {
    let mut t = vec![];
    varint(1 << 3, &mut t); // dtype
    varint(dt, &mut t);
    let mut shape = vec![];
    super::bytes_field(2, &[], &mut shape); // tensor_shape: a scalar
    t.extend_from_slice(&shape);
    if dt == DT_HALF {
        varint(13 << 3, &mut t); // half_val: the bits of 1.0 as an int32
        varint(0x3c00, &mut t);
    } else {
        varint((5 << 3) | 5, &mut t); // float_val, fixed32
        t.extend_from_slice(&1.0f32.to_le_bytes());
    }
    let mut v = vec![];
    super::bytes_field(8, &t, &mut v);
    v
}

/// Builds the replacement nodes of one update.
struct Expansion<'a> {
    node: &'a Node,
    dtype: Vec<u8>,
    dt: u64,
    nodes: Vec<Node>,
    assigns: Vec<String>,
    one: Option<String>,
}

impl Expansion<'_> {
    fn push(
        &mut self,
        tag: &str,
        op: &str,
        inputs: Vec<String>,
        attrs: Vec<(String, Vec<u8>)>,
    ) -> String {
        let name = format!("{}/tfwgpu_{tag}", self.node.name);
        self.nodes.push(Node {
            name: name.clone(),
            op: op.into(),
            inputs,
            device: self.node.device.clone(),
            attrs,
        });
        name
    }

    fn read(&mut self, tag: &str, resource: &str, control: &[String]) -> String {
        let inputs = std::iter::once(resource.to_string())
            .chain(control.iter().cloned())
            .collect();
        let attrs = vec![("dtype".into(), self.dtype.clone())];
        self.push(&format!("read_{tag}"), "ReadVariableOp", inputs, attrs)
    }

    fn bin(&mut self, tag: &str, op: &str, a: &str, b: &str) -> String {
        let attrs = vec![("T".into(), self.dtype.clone())];
        self.push(tag, op, vec![a.into(), b.into()], attrs)
    }

    fn un(&mut self, tag: &str, op: &str, a: &str) -> String {
        let attrs = vec![("T".into(), self.dtype.clone())];
        self.push(tag, op, vec![a.into()], attrs)
    }

    /// The constant 1 of the update's type (one node per update).
    fn one(&mut self) -> String {
        if let Some(one) = &self.one {
            return one.clone();
        }
        let attrs = vec![
            ("dtype".into(), self.dtype.clone()),
            ("value".into(), one_tensor_attr(self.dt)),
        ];
        let one = self.push("one", "Const", vec![], attrs);
        self.one = Some(one.clone());
        one
    }

    /// `1 - x`
    fn one_minus(&mut self, tag: &str, x: &str) -> String {
        let one = self.one();
        self.bin(tag, "Sub", &one, x)
    }

    fn assign(&mut self, tag: &str, resource: &str, value: &str) {
        let attrs = vec![
            ("dtype".into(), self.dtype.clone()),
            // A result of another shape than the variable's (a broadcasting gradient) fails
            // here, as TensorFlow's kernel fails on shapes that differ.
            ("validate_shape".into(), bool_attr(true)),
        ];
        let a = self.push(
            &format!("assign_{tag}"),
            "AssignVariableOp",
            vec![resource.into(), value.into()],
            attrs,
        );
        self.assigns.push(a);
    }

    /// The node that keeps the original name: done when every assignment is.
    fn finish(mut self) -> Vec<Node> {
        let inputs = self.assigns.iter().map(|a| format!("^{a}")).collect();
        self.nodes.push(Node {
            name: self.node.name.clone(),
            op: "NoOp".into(),
            inputs,
            device: self.node.device.clone(),
            attrs: vec![],
        });
        self.nodes
    }
}

/// The replacement of a fused optimizer update, or `None` when `node` is not one this rewrite
/// handles (another op, a type the GPU kernels lack, a malformed input list).
pub(super) fn expand(node: &Node) -> Option<Vec<Node>> {
    let arity = arity(&node.op)?;
    let dtype = node.attr("T")?.to_vec();
    let dt = attr_varint(&dtype, 6)?;
    if dt != DT_FLOAT && dt != DT_HALF {
        return None;
    }
    let (d, control): (Vec<String>, Vec<String>) = node
        .inputs
        .iter()
        .cloned()
        .partition(|i| !i.starts_with('^'));
    if d.len() != arity {
        return None;
    }
    let resources = APPLY_OPS.iter().find(|a| a.0 == node.op)?.1.len();
    let control = super::read_after(&d[resources..], &control);
    let nesterov = attr_bool(node, "use_nesterov");
    // ResourceApplyAdagrad(V2)'s update_slots defaults to true.
    let update_slots = node
        .attr("update_slots")
        .and_then(|v| attr_varint(v, 5))
        .is_none_or(|b| b != 0);
    let mut x = Expansion {
        node,
        dtype,
        dt,
        nodes: vec![],
        assigns: vec![],
        one: None,
    };
    match node.op.as_str() {
        "ResourceApplyGradientDescent" => {
            // var -= grad * lr
            let (var, lr, grad) = (&d[0], &d[1], &d[2]);
            let v0 = x.read("var", var, &control);
            let step = x.bin("step", "Mul", grad, lr);
            let v1 = x.bin("var_new", "Sub", &v0, &step);
            x.assign("var", var, &v1);
        }
        "ResourceApplyMomentum" => {
            // accum = accum * momentum + grad
            // var -= grad * lr + accum * momentum * lr   (nesterov)
            // var -= accum * lr
            let (var, accum, lr, grad, mom) = (&d[0], &d[1], &d[2], &d[3], &d[4]);
            let v0 = x.read("var", var, &control);
            let a0 = x.read("accum", accum, &control);
            let am = x.bin("accum_momentum", "Mul", &a0, mom);
            let a1 = x.bin("accum_new", "AddV2", &am, grad);
            let step = if nesterov {
                let gl = x.bin("grad_lr", "Mul", grad, lr);
                let a1m = x.bin("accum_new_momentum", "Mul", &a1, mom);
                let a1ml = x.bin("accum_new_momentum_lr", "Mul", &a1m, lr);
                x.bin("step", "AddV2", &gl, &a1ml)
            } else {
                x.bin("step", "Mul", &a1, lr)
            };
            let v1 = x.bin("var_new", "Sub", &v0, &step);
            x.assign("accum", accum, &a1);
            x.assign("var", var, &v1);
        }
        "ResourceApplyKerasMomentum" => {
            // accum = accum * momentum - grad * lr
            // var += accum * momentum - grad * lr   (nesterov)
            // var += accum
            let (var, accum, lr, grad, mom) = (&d[0], &d[1], &d[2], &d[3], &d[4]);
            let v0 = x.read("var", var, &control);
            let a0 = x.read("accum", accum, &control);
            let am = x.bin("accum_momentum", "Mul", &a0, mom);
            let gl = x.bin("grad_lr", "Mul", grad, lr);
            let a1 = x.bin("accum_new", "Sub", &am, &gl);
            let step = if nesterov {
                let a1m = x.bin("accum_new_momentum", "Mul", &a1, mom);
                x.bin("step", "Sub", &a1m, &gl)
            } else {
                a1.clone()
            };
            let v1 = x.bin("var_new", "AddV2", &v0, &step);
            x.assign("accum", accum, &a1);
            x.assign("var", var, &v1);
        }
        "ResourceApplyAdam" => {
            // alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
            // m += (grad - m) * (1 - beta1)
            // v += (grad^2 - v) * (1 - beta2)
            // var -= ((grad * (1 - beta1) + beta1 * m) * alpha) / (sqrt(v) + epsilon)  (nesterov)
            // var -= (m * alpha) / (sqrt(v) + epsilon)
            let (var, m, v) = (&d[0], &d[1], &d[2]);
            let (b1p, b2p, lr, b1, b2, eps, grad) =
                (&d[3], &d[4], &d[5], &d[6], &d[7], &d[8], &d[9]);
            let v0 = x.read("var", var, &control);
            let m0 = x.read("m", m, &control);
            let s0 = x.read("v", v, &control);
            let omb2p = x.one_minus("one_minus_beta2_power", b2p);
            let sq = x.un("sqrt_one_minus_beta2_power", "Sqrt", &omb2p);
            let lsq = x.bin("lr_sqrt", "Mul", lr, &sq);
            let omb1p = x.one_minus("one_minus_beta1_power", b1p);
            let alpha = x.bin("alpha", "RealDiv", &lsq, &omb1p);
            let omb1 = x.one_minus("one_minus_beta1", b1);
            let gm = x.bin("grad_minus_m", "Sub", grad, &m0);
            let dm = x.bin("m_delta", "Mul", &gm, &omb1);
            let m1 = x.bin("m_new", "AddV2", &m0, &dm);
            let omb2 = x.one_minus("one_minus_beta2", b2);
            let g2 = x.un("grad_square", "Square", grad);
            let g2v = x.bin("grad_square_minus_v", "Sub", &g2, &s0);
            let dv = x.bin("v_delta", "Mul", &g2v, &omb2);
            let s1 = x.bin("v_new", "AddV2", &s0, &dv);
            let num = if nesterov {
                let g1 = x.bin("grad_one_minus_beta1", "Mul", grad, &omb1);
                let b1m = x.bin("beta1_m", "Mul", b1, &m1);
                let sum = x.bin("nesterov_m", "AddV2", &g1, &b1m);
                x.bin("numerator", "Mul", &sum, &alpha)
            } else {
                x.bin("numerator", "Mul", &m1, &alpha)
            };
            let sv = x.un("sqrt_v", "Sqrt", &s1);
            let den = x.bin("denominator", "AddV2", &sv, eps);
            let step = x.bin("step", "RealDiv", &num, &den);
            let v1 = x.bin("var_new", "Sub", &v0, &step);
            x.assign("m", m, &m1);
            x.assign("v", v, &s1);
            x.assign("var", var, &v1);
        }
        "ResourceApplyRMSProp" => {
            // ms += (grad^2 - ms) * (1 - rho)
            // mom = mom * momentum + (grad * lr) / sqrt(ms + epsilon)
            // var -= mom
            let (var, ms, mom) = (&d[0], &d[1], &d[2]);
            let (lr, rho, momentum, eps, grad) = (&d[3], &d[4], &d[5], &d[6], &d[7]);
            let v0 = x.read("var", var, &control);
            let ms0 = x.read("ms", ms, &control);
            let mom0 = x.read("mom", mom, &control);
            let g2 = x.un("grad_square", "Square", grad);
            let g2ms = x.bin("grad_square_minus_ms", "Sub", &g2, &ms0);
            let omr = x.one_minus("one_minus_rho", rho);
            let dms = x.bin("ms_delta", "Mul", &g2ms, &omr);
            let ms1 = x.bin("ms_new", "AddV2", &ms0, &dms);
            let mm = x.bin("mom_momentum", "Mul", &mom0, momentum);
            let gl = x.bin("grad_lr", "Mul", grad, lr);
            let mse = x.bin("ms_epsilon", "AddV2", &ms1, eps);
            let den = x.un("denominator", "Sqrt", &mse);
            let q = x.bin("scaled_grad", "RealDiv", &gl, &den);
            let mom1 = x.bin("mom_new", "AddV2", &mm, &q);
            let v1 = x.bin("var_new", "Sub", &v0, &mom1);
            x.assign("ms", ms, &ms1);
            x.assign("mom", mom, &mom1);
            x.assign("var", var, &v1);
        }
        "ResourceApplyCenteredRMSProp" => {
            // ms += (grad^2 - ms) * (1 - rho)
            // mg += (grad - mg) * (1 - rho)
            // mom = mom * momentum + (grad * lr) / sqrt((ms - mg^2) + epsilon)
            // var -= mom
            let (var, mg, ms, mom) = (&d[0], &d[1], &d[2], &d[3]);
            let (lr, rho, momentum, eps, grad) = (&d[4], &d[5], &d[6], &d[7], &d[8]);
            let v0 = x.read("var", var, &control);
            let mg0 = x.read("mg", mg, &control);
            let ms0 = x.read("ms", ms, &control);
            let mom0 = x.read("mom", mom, &control);
            let omr = x.one_minus("one_minus_rho", rho);
            let g2 = x.un("grad_square", "Square", grad);
            let g2ms = x.bin("grad_square_minus_ms", "Sub", &g2, &ms0);
            let dms = x.bin("ms_delta", "Mul", &g2ms, &omr);
            let ms1 = x.bin("ms_new", "AddV2", &ms0, &dms);
            let gmg = x.bin("grad_minus_mg", "Sub", grad, &mg0);
            let dmg = x.bin("mg_delta", "Mul", &gmg, &omr);
            let mg1 = x.bin("mg_new", "AddV2", &mg0, &dmg);
            let mg2 = x.un("mg_square", "Square", &mg1);
            let var_est = x.bin("ms_minus_mg_square", "Sub", &ms1, &mg2);
            let de = x.bin("denominator_squared", "AddV2", &var_est, eps);
            let mm = x.bin("mom_momentum", "Mul", &mom0, momentum);
            let gl = x.bin("grad_lr", "Mul", grad, lr);
            let den = x.un("denominator", "Sqrt", &de);
            let q = x.bin("scaled_grad", "RealDiv", &gl, &den);
            let mom1 = x.bin("mom_new", "AddV2", &mm, &q);
            let v1 = x.bin("var_new", "Sub", &v0, &mom1);
            x.assign("ms", ms, &ms1);
            x.assign("mg", mg, &mg1);
            x.assign("mom", mom, &mom1);
            x.assign("var", var, &v1);
        }
        "ResourceApplyAdagrad" | "ResourceApplyAdagradV2" => {
            // accum += grad^2   (update_slots)
            // var -= grad * lr * rsqrt(accum)            (Adagrad)
            // var -= grad * lr / (sqrt(accum) + epsilon) (AdagradV2)
            let v2 = node.op == "ResourceApplyAdagradV2";
            let (var, accum, lr) = (&d[0], &d[1], &d[2]);
            let grad = if v2 { &d[4] } else { &d[3] };
            let v0 = x.read("var", var, &control);
            let a0 = x.read("accum", accum, &control);
            let a1 = if update_slots {
                let g2 = x.un("grad_square", "Square", grad);
                x.bin("accum_new", "AddV2", &a0, &g2)
            } else {
                a0
            };
            let gl = x.bin("grad_lr", "Mul", grad, lr);
            let step = if v2 {
                let sa = x.un("sqrt_accum", "Sqrt", &a1);
                let den = x.bin("denominator", "AddV2", &sa, &d[3]);
                x.bin("step", "RealDiv", &gl, &den)
            } else {
                let ra = x.un("rsqrt_accum", "Rsqrt", &a1);
                x.bin("step", "Mul", &gl, &ra)
            };
            let v1 = x.bin("var_new", "Sub", &v0, &step);
            if update_slots {
                x.assign("accum", accum, &a1);
            }
            x.assign("var", var, &v1);
        }
        _ => return None,
    }
    Some(x.finish())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::{Node, bytes_field, rewrite};
    use super::*;
    use crate::nodedef::{Field, Reader};

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

    fn type_attr(dt: u64) -> Vec<u8> {
        let mut v = vec![];
        varint(6 << 3, &mut v);
        varint(dt, &mut v);
        v
    }

    fn apply_node(op: &str, inputs: &[&str], dt: u64, flags: &[(&str, bool)]) -> Node {
        let mut attrs = vec![("T".to_string(), type_attr(dt))];
        attrs.push(("use_locking".into(), bool_attr(true)));
        for (k, b) in flags {
            attrs.push((k.to_string(), bool_attr(*b)));
        }
        Node {
            name: "train/update".into(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            device: GPU.into(),
            attrs,
        }
    }

    fn rewritten(nodes: &[Node]) -> Vec<Node> {
        let mut g = vec![];
        for n in nodes {
            n.encode(&mut g);
        }
        let out = rewrite(&g).unwrap().expect("rewritten");
        let mut r = Reader::new(&out);
        let mut parsed = vec![];
        while let Some((f, v)) = r.next().unwrap() {
            if let (1, Field::Bytes(b)) = (f, v) {
                parsed.push(Node::parse(b).unwrap());
            }
        }
        assert!(rewrite(&out).unwrap().is_none(), "nothing left to rewrite");
        parsed
    }

    fn const_value(n: &Node) -> f32 {
        let value = n.attr("value").expect("Const has a value");
        let mut r = Reader::new(value);
        let Some((8, Field::Bytes(t))) = r.next().unwrap() else {
            panic!("value is no tensor")
        };
        let mut r = Reader::new(t);
        let mut v = None;
        while let Some((f, x)) = r.next().unwrap() {
            if let (5, Field::Fixed32(bits)) = (f, x) {
                v = Some(f32::from_bits(bits));
            }
        }
        v.expect("a float_val")
    }

    /// Runs an expanded graph in f32, one op at a time, in the order given (each node's data
    /// inputs come before it): `feeds` holds the tensors fed by name, `vars` the variables by
    /// the name of their handle. Scalars broadcast against vectors.
    fn run(nodes: &[Node], feeds: &HashMap<&str, Vec<f32>>, vars: &mut HashMap<String, Vec<f32>>) {
        let mut vals: HashMap<String, Vec<f32>> = feeds
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let bin = |a: &[f32], b: &[f32], f: &dyn Fn(f32, f32) -> f32| -> Vec<f32> {
            let n = a.len().max(b.len());
            (0..n)
                .map(|i| {
                    f(
                        a[if a.len() == 1 { 0 } else { i }],
                        b[if b.len() == 1 { 0 } else { i }],
                    )
                })
                .collect()
        };
        for n in nodes {
            if matches!(n.op.as_str(), "VarHandleOp" | "Placeholder") {
                continue;
            }
            let ins: Vec<&str> = n
                .inputs
                .iter()
                .filter(|i| !i.starts_with('^'))
                .map(|s| s.as_str())
                .collect();
            let arg = |i: usize| vals[ins[i]].clone();
            let out = match n.op.as_str() {
                "Const" => vec![const_value(n)],
                "ReadVariableOp" => vars[ins[0]].clone(),
                "AssignVariableOp" => {
                    let v = arg(1);
                    assert_eq!(v.len(), vars[ins[0]].len(), "{}: shape kept", n.name);
                    vars.insert(ins[0].to_string(), v);
                    continue;
                }
                "NoOp" => continue,
                "AddV2" => bin(&arg(0), &arg(1), &|a, b| a + b),
                "Sub" => bin(&arg(0), &arg(1), &|a, b| a - b),
                "Mul" => bin(&arg(0), &arg(1), &|a, b| a * b),
                "RealDiv" => bin(&arg(0), &arg(1), &|a, b| a / b),
                "Sqrt" => arg(0).iter().map(|a| a.sqrt()).collect(),
                "Rsqrt" => arg(0).iter().map(|a| 1.0 / a.sqrt()).collect(),
                "Square" => arg(0).iter().map(|a| a * a).collect(),
                op => panic!("unexpected op {op} in the expansion"),
            };
            vals.insert(n.name.clone(), out);
        }
    }

    /// Random-ish values in [lo, hi).
    fn data(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                lo + (hi - lo) * (s as f32 / u32::MAX as f32)
            })
            .collect()
    }

    /// Expands `op`, checks the shape of the result (names, devices, control edges, the NoOp
    /// that keeps the name), runs it, and returns the variables after the update.
    fn check(
        op: &str,
        resources: &[&str],
        scalars: &[(&str, f32)],
        flags: &[(&str, bool)],
        init: &[(&str, Vec<f32>)],
        grad: &[f32],
    ) -> HashMap<String, Vec<f32>> {
        let mut inputs: Vec<&str> = resources.to_vec();
        // The op's non-resource inputs in order: the named scalars and "grad".
        let order: Vec<&str> = scalars.iter().map(|s| s.0).collect();
        inputs.extend(order.iter());
        inputs.push("^before");
        let node = apply_node(op, &inputs, DT_FLOAT, flags);
        let later = Node {
            name: "after".into(),
            op: "NoOp".into(),
            inputs: vec!["^train/update".into()],
            device: GPU.into(),
            attrs: vec![],
        };
        let nodes = rewritten(&[node, later]);
        let last = nodes.len() - 1;
        assert_eq!(nodes[last].name, "after", "nodes after the update are kept");
        let keeper = &nodes[last - 1];
        assert_eq!(
            (keeper.name.as_str(), keeper.op.as_str()),
            ("train/update", "NoOp")
        );
        let assigns: Vec<_> = nodes
            .iter()
            .filter(|n| n.op == "AssignVariableOp")
            .collect();
        assert_eq!(
            keeper.inputs,
            assigns
                .iter()
                .map(|a| format!("^{}", a.name))
                .collect::<Vec<_>>()
        );
        for n in &nodes[..last] {
            assert_eq!(n.device, GPU, "{} keeps the device", n.name);
            assert!(n.name.starts_with("train/update"), "{}", n.name);
            if n.op == "ReadVariableOp" {
                // After the update's control inputs and its other inputs.
                let after: Vec<String> = order
                    .iter()
                    .map(|i| format!("^{i}"))
                    .chain(["^before".to_string()])
                    .collect();
                assert_eq!(n.inputs[1..], after, "{}", n.name);
                assert_eq!(n.attr("dtype"), Some(type_attr(DT_FLOAT).as_slice()));
            }
        }
        let mut vars: HashMap<String, Vec<f32>> = init
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let mut feeds: HashMap<&str, Vec<f32>> =
            scalars.iter().map(|(k, v)| (*k, vec![*v])).collect();
        feeds.insert("grad", grad.to_vec());
        run(&nodes, &feeds, &mut vars);
        vars
    }

    const N: usize = 37;

    #[test]
    fn gradient_descent_matches_the_cpu_functor() {
        let (var, g) = (data(N, 1, -1.0, 1.0), data(N, 2, -1.0, 1.0));
        let lr = 0.37f32;
        let got = check(
            "ResourceApplyGradientDescent",
            &["var"],
            &[("lr", lr), ("grad", 0.0)],
            &[],
            &[("var", var.clone())],
            &g,
        );
        let want: Vec<f32> = (0..N).map(|i| var[i] - g[i] * lr).collect();
        assert_eq!(got["var"], want);
    }

    #[test]
    fn momentum_both_forms_match_the_cpu_functor() {
        let (var, acc, g) = (
            data(N, 3, -1.0, 1.0),
            data(N, 4, -1.0, 1.0),
            data(N, 5, -1.0, 1.0),
        );
        let (lr, mom) = (0.1f32, 0.9f32);
        for keras in [false, true] {
            for nesterov in [false, true] {
                let op = if keras {
                    "ResourceApplyKerasMomentum"
                } else {
                    "ResourceApplyMomentum"
                };
                let got = check(
                    op,
                    &["var", "accum"],
                    &[("lr", lr), ("grad", 0.0), ("momentum", mom)],
                    &[("use_nesterov", nesterov)],
                    &[("var", var.clone()), ("accum", acc.clone())],
                    &g,
                );
                let (mut wv, mut wa) = (var.clone(), acc.clone());
                for i in 0..N {
                    if keras {
                        wa[i] = acc[i] * mom - g[i] * lr;
                        wv[i] += if nesterov {
                            wa[i] * mom - g[i] * lr
                        } else {
                            wa[i]
                        };
                    } else {
                        wa[i] = acc[i] * mom + g[i];
                        wv[i] -= if nesterov {
                            g[i] * lr + wa[i] * mom * lr
                        } else {
                            wa[i] * lr
                        };
                    }
                }
                assert_eq!(got["accum"], wa, "{op} nesterov={nesterov}");
                assert_eq!(got["var"], wv, "{op} nesterov={nesterov}");
            }
        }
    }

    #[test]
    fn adam_matches_the_cpu_functor() {
        let (var, m, v, g) = (
            data(N, 6, -1.0, 1.0),
            data(N, 7, -0.1, 0.1),
            data(N, 8, 0.0, 0.01),
            data(N, 9, -1.0, 1.0),
        );
        let (b1p, b2p, lr, b1, b2, eps) = (0.9f32 * 0.9, 0.999f32 * 0.999, 0.01, 0.9, 0.999, 1e-7);
        for nesterov in [false, true] {
            let got = check(
                "ResourceApplyAdam",
                &["var", "m", "v"],
                &[
                    ("beta1_power", b1p),
                    ("beta2_power", b2p),
                    ("lr", lr),
                    ("beta1", b1),
                    ("beta2", b2),
                    ("epsilon", eps),
                    ("grad", 0.0),
                ],
                &[("use_nesterov", nesterov)],
                &[("var", var.clone()), ("m", m.clone()), ("v", v.clone())],
                &g,
            );
            let alpha = lr * (1.0 - b2p).sqrt() / (1.0 - b1p);
            let (mut wv, mut wm, mut ws) = (var.clone(), m.clone(), v.clone());
            for i in 0..N {
                wm[i] += (g[i] - wm[i]) * (1.0 - b1);
                ws[i] += (g[i] * g[i] - ws[i]) * (1.0 - b2);
                let num = if nesterov {
                    (g[i] * (1.0 - b1) + b1 * wm[i]) * alpha
                } else {
                    wm[i] * alpha
                };
                wv[i] -= num / (ws[i].sqrt() + eps);
            }
            assert_eq!(got["m"], wm);
            assert_eq!(got["v"], ws);
            assert_eq!(got["var"], wv, "nesterov={nesterov}");
        }
    }

    #[test]
    fn rmsprop_plain_and_centered_match_the_cpu_functors() {
        let (var, ms, mom, mg, g) = (
            data(N, 10, -1.0, 1.0),
            data(N, 11, 0.0, 0.5),
            data(N, 12, -0.1, 0.1),
            data(N, 13, -0.1, 0.1),
            data(N, 14, -1.0, 1.0),
        );
        let (lr, rho, momentum, eps) = (0.01f32, 0.9f32, 0.5f32, 1e-6f32);
        let scalars = [
            ("lr", lr),
            ("rho", rho),
            ("momentum", momentum),
            ("epsilon", eps),
            ("grad", 0.0),
        ];
        let got = check(
            "ResourceApplyRMSProp",
            &["var", "ms", "mom"],
            &scalars,
            &[],
            &[
                ("var", var.clone()),
                ("ms", ms.clone()),
                ("mom", mom.clone()),
            ],
            &g,
        );
        let (mut wv, mut wms, mut wmom) = (var.clone(), ms.clone(), mom.clone());
        for i in 0..N {
            wms[i] += (g[i] * g[i] - wms[i]) * (1.0 - rho);
            wmom[i] = wmom[i] * momentum + (g[i] * lr) / (wms[i] + eps).sqrt();
            wv[i] -= wmom[i];
        }
        assert_eq!((&got["ms"], &got["mom"], &got["var"]), (&wms, &wmom, &wv));

        let got = check(
            "ResourceApplyCenteredRMSProp",
            &["var", "mg", "ms", "mom"],
            &scalars,
            &[],
            &[
                ("var", var.clone()),
                ("mg", mg.clone()),
                ("ms", ms.clone()),
                ("mom", mom.clone()),
            ],
            &g,
        );
        let (mut wv, mut wmg, mut wms, mut wmom) =
            (var.clone(), mg.clone(), ms.clone(), mom.clone());
        for i in 0..N {
            wms[i] += (g[i] * g[i] - wms[i]) * (1.0 - rho);
            wmg[i] += (g[i] - wmg[i]) * (1.0 - rho);
            let den = (wms[i] - wmg[i] * wmg[i]) + eps;
            wmom[i] = wmom[i] * momentum + (g[i] * lr) / den.sqrt();
            wv[i] -= wmom[i];
        }
        assert_eq!((&got["ms"], &got["mg"]), (&wms, &wmg));
        assert_eq!((&got["mom"], &got["var"]), (&wmom, &wv));
    }

    #[test]
    fn adagrad_both_versions_and_update_slots_match_the_cpu_functors() {
        let (var, acc, g) = (
            data(N, 15, -1.0, 1.0),
            data(N, 16, 0.1, 1.0),
            data(N, 17, -1.0, 1.0),
        );
        let (lr, eps) = (0.05f32, 1e-7f32);
        for v2 in [false, true] {
            for update_slots in [false, true] {
                let (op, scalars): (_, &[(&str, f32)]) = if v2 {
                    (
                        "ResourceApplyAdagradV2",
                        &[("lr", lr), ("epsilon", eps), ("grad", 0.0)],
                    )
                } else {
                    ("ResourceApplyAdagrad", &[("lr", lr), ("grad", 0.0)])
                };
                let got = check(
                    op,
                    &["var", "accum"],
                    scalars,
                    &[("update_slots", update_slots)],
                    &[("var", var.clone()), ("accum", acc.clone())],
                    &g,
                );
                let (mut wv, mut wa) = (var.clone(), acc.clone());
                for i in 0..N {
                    if update_slots {
                        wa[i] += g[i] * g[i];
                    }
                    wv[i] -= if v2 {
                        g[i] * lr / (wa[i].sqrt() + eps)
                    } else {
                        g[i] * lr * (1.0 / wa[i].sqrt())
                    };
                }
                assert_eq!(got["accum"], wa, "{op} update_slots={update_slots}");
                assert_eq!(got["var"], wv, "{op} update_slots={update_slots}");
            }
        }
    }

    #[test]
    fn reads_wait_for_every_input_of_the_update() {
        let data = ["lr:0".to_string(), "grads/g:1".into(), "lr".into()];
        let control = ["^a".to_string(), "^grads/g".into()];
        assert_eq!(
            super::super::read_after(&data, &control),
            ["^lr", "^grads/g", "^a"]
        );
    }

    #[test]
    fn only_float_updates_on_the_gpu_are_rewritten() {
        let inputs = ["var", "lr", "grad"];
        let cpu = Node {
            device: "/job:localhost/replica:0/task:0/device:CPU:0".into(),
            ..apply_node("ResourceApplyGradientDescent", &inputs, DT_FLOAT, &[])
        };
        let f64_gpu = apply_node("ResourceApplyGradientDescent", &inputs, 2, &[]);
        let malformed = apply_node("ResourceApplyGradientDescent", &inputs[..2], DT_FLOAT, &[]);
        let other = apply_node("ResourceApplyAdaMax", &inputs, DT_FLOAT, &[]);
        for n in [cpu, f64_gpu, malformed, other] {
            let mut g = vec![];
            n.encode(&mut g);
            assert!(rewrite(&g).unwrap().is_none(), "{} {}", n.op, n.device);
        }
    }

    #[test]
    fn half_updates_use_a_half_constant() {
        let n = apply_node(
            "ResourceApplyAdam",
            &[
                "var", "m", "v", "b1p", "b2p", "lr", "b1", "b2", "eps", "grad",
            ],
            DT_HALF,
            &[],
        );
        let nodes = rewritten(&[n]);
        let one = nodes
            .iter()
            .find(|n| n.op == "Const")
            .expect("a constant 1");
        assert_eq!(one.attr("dtype"), Some(type_attr(DT_HALF).as_slice()));
        let mut want = vec![];
        varint(1 << 3, &mut want);
        varint(DT_HALF, &mut want);
        bytes_field(2, &[], &mut want);
        varint(13 << 3, &mut want);
        varint(0x3c00, &mut want);
        let mut attr = vec![];
        bytes_field(8, &want, &mut attr);
        assert_eq!(one.attr("value"), Some(attr.as_slice()));
        assert!(
            nodes
                .iter()
                .filter(|n| n.op != "Const" && n.op != "NoOp")
                .all(|n| n.attr("T").or(n.attr("dtype")) == Some(type_attr(DT_HALF).as_slice()))
        );
        assert_eq!(
            nodes.iter().filter(|n| n.op == "AssignVariableOp").count(),
            3
        );
    }
}
