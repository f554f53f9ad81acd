//! Reads a serialized `tensorflow.NodeDef`: the op name and every attribute, so that one
//! generic kernel-construction function serves every op. Only the protobuf wire format is
//! needed (varints and length-delimited fields); unknown fields are skipped.

use tfwgpu_runtime::{AttrValue, Attrs, DType, Error, Result};

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
}

pub(crate) enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
    Fixed64,
}

fn corrupt(what: &str) -> Error {
    Error::InvalidArgument(format!("malformed NodeDef from TensorFlow: {what}"))
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| corrupt("truncated varint"))?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint too long"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| corrupt("truncated field"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn next(&mut self) -> Result<Option<(u32, Field<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = (key >> 3) as u32;
        let f = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            )),
            w => return Err(corrupt(&format!("wire type {w}"))),
        };
        Ok(Some((field, f)))
    }
}

fn utf8(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| corrupt("non-UTF-8 string"))
}

/// TensorFlow's DataType enum value to a runtime dtype (`None` for types the runtime lacks).
pub fn dtype_from_tf(v: u32) -> Option<DType> {
    Some(match v {
        1 => DType::F32,
        3 => DType::I32,
        4 => DType::U8,
        9 => DType::I64,
        10 => DType::Bool,
        19 => DType::F16,
        22 => DType::U32,
        23 => DType::U64,
        _ => return None,
    })
}

/// A runtime dtype to TensorFlow's DataType enum value.
pub fn dtype_to_tf(d: DType) -> u32 {
    match d {
        DType::F32 => 1,
        DType::I32 => 3,
        DType::U8 => 4,
        DType::I64 => 9,
        DType::Bool => 10,
        DType::F16 => 19,
        DType::U32 => 22,
        DType::U64 => 23,
    }
}

/// Packed or repeated varints (proto3 repeated scalars).
fn varints(field: Field, out: &mut Vec<u64>) -> Result<()> {
    match field {
        Field::Varint(v) => out.push(v),
        Field::Bytes(b) => {
            let mut r = Reader::new(b);
            while r.pos < b.len() {
                out.push(r.varint()?);
            }
        }
        _ => return Err(corrupt("expected varints")),
    }
    Ok(())
}

fn floats(field: Field, out: &mut Vec<f32>) -> Result<()> {
    match field {
        Field::Fixed32(v) => out.push(f32::from_bits(v)),
        Field::Bytes(b) => {
            for c in b.chunks_exact(4) {
                out.push(f32::from_le_bytes(c.try_into().expect("4 bytes")));
            }
        }
        _ => return Err(corrupt("expected floats")),
    }
    Ok(())
}

fn shape(b: &[u8]) -> Result<Option<Vec<i64>>> {
    let mut r = Reader::new(b);
    let mut dims = vec![];
    let mut unknown_rank = false;
    while let Some((f, v)) = r.next()? {
        match (f, v) {
            (2, Field::Bytes(dim)) => {
                let mut d = Reader::new(dim);
                let mut size = 0i64;
                while let Some((f, v)) = d.next()? {
                    if let (1, Field::Varint(s)) = (f, v) {
                        size = s as i64;
                    }
                }
                dims.push(size);
            }
            (3, Field::Varint(u)) => unknown_rank = u != 0,
            _ => {}
        }
    }
    Ok(if unknown_rank { None } else { Some(dims) })
}

fn type_value(v: u64) -> Result<AttrValue> {
    dtype_from_tf(v as u32).map(AttrValue::Type).ok_or_else(|| {
        Error::Unimplemented(format!("TensorFlow dtype {v} is not supported by tfwgpu"))
    })
}

/// Decodes one `AttrValue`. Attributes the runtime has no use for (tensors, functions) are
/// returned as `None`.
fn attr_value(b: &[u8]) -> Result<Option<AttrValue>> {
    let mut r = Reader::new(b);
    let mut value = None;
    while let Some((f, v)) = r.next()? {
        value = match (f, v) {
            (2, Field::Bytes(s)) => Some(AttrValue::Str(utf8(s)?)),
            (3, Field::Varint(i)) => Some(AttrValue::Int(i as i64)),
            (4, Field::Fixed32(x)) => Some(AttrValue::Float(f32::from_bits(x))),
            (5, Field::Varint(x)) => Some(AttrValue::Bool(x != 0)),
            // An unsupported dtype is kept as absent: the kernel's type check reports it.
            (6, Field::Varint(t)) => type_value(t).ok(),
            (7, Field::Bytes(s)) => Some(AttrValue::Shape(shape(s)?)),
            (1, Field::Bytes(list)) => Some(list_value(list)?),
            _ => value,
        };
    }
    Ok(value)
}

fn list_value(b: &[u8]) -> Result<AttrValue> {
    let mut r = Reader::new(b);
    let (mut ints, mut fl, mut types, mut bools, mut strs) =
        (vec![], vec![], vec![], vec![], vec![]);
    while let Some((f, v)) = r.next()? {
        match f {
            2 => {
                if let Field::Bytes(s) = v {
                    strs.push(utf8(s)?);
                }
            }
            3 => varints(v, &mut ints)?,
            4 => floats(v, &mut fl)?,
            5 => varints(v, &mut bools)?,
            6 => varints(v, &mut types)?,
            _ => {}
        }
    }
    Ok(if !ints.is_empty() {
        AttrValue::Ints(ints.into_iter().map(|i| i as i64).collect())
    } else if !fl.is_empty() {
        AttrValue::Floats(fl)
    } else if !types.is_empty() {
        AttrValue::Types(
            types
                .into_iter()
                .filter_map(|t| dtype_from_tf(t as u32))
                .collect(),
        )
    } else if !bools.is_empty() {
        AttrValue::Ints(bools.into_iter().map(|b| b as i64).collect())
    } else if !strs.is_empty() {
        AttrValue::Str(strs.join(","))
    } else {
        AttrValue::Ints(vec![])
    })
}

/// The op name and attributes of a serialized NodeDef.
pub fn parse(buf: &[u8]) -> Result<(String, Attrs)> {
    let mut r = Reader::new(buf);
    let mut op = String::new();
    let mut attrs = Attrs::new();
    while let Some((f, v)) = r.next()? {
        match (f, v) {
            (2, Field::Bytes(s)) => op = utf8(s)?,
            (5, Field::Bytes(entry)) => {
                let mut e = Reader::new(entry);
                let (mut key, mut val) = (String::new(), None);
                while let Some((f, v)) = e.next()? {
                    match (f, v) {
                        (1, Field::Bytes(k)) => key = utf8(k)?,
                        (2, Field::Bytes(a)) => val = attr_value(a)?,
                        _ => {}
                    }
                }
                if let Some(v) = val {
                    attrs.set(&key, v);
                }
            }
            _ => {}
        }
    }
    if op.is_empty() {
        return Err(corrupt("no op name"));
    }
    Ok((op, attrs))
}

/// The number of arguments (inputs and outputs) of every op in a serialized
/// `tensorflow.OpList` (what `TF_GetAllOpList` returns).
pub fn op_arg_counts(op_list: &[u8]) -> Result<std::collections::HashMap<String, usize>> {
    let mut out = std::collections::HashMap::new();
    let mut r = Reader::new(op_list);
    while let Some((f, v)) = r.next()? {
        let (1, Field::Bytes(def)) = (f, v) else {
            continue;
        };
        let (mut name, mut args) = (String::new(), 0);
        let mut d = Reader::new(def);
        while let Some((f, v)) = d.next()? {
            match (f, v) {
                (1, Field::Bytes(n)) => name = utf8(n)?,
                (2 | 3, Field::Bytes(_)) => args += 1,
                _ => {}
            }
        }
        out.insert(name, args);
    }
    Ok(out)
}

/// Whether a serialized `tensorflow.KernelList` (what `TF_GetRegisteredKernelsForOp` returns)
/// holds a DEVICE_DEFAULT kernel whose `type_attr` allows `dtype` and that keeps all `n_args`
/// arguments in host memory: TensorFlow's own host-side kernel for that op and dtype on every
/// device. (A kernel with only some arguments in host memory, such as OnesLike's, may forward
/// a device input as its host output and write it on the CPU: not one to defer to.)
pub fn has_default_host_kernel(
    kernel_list: &[u8],
    type_attr: &str,
    dtype: DType,
    n_args: usize,
) -> Result<bool> {
    let mut r = Reader::new(kernel_list);
    while let Some((f, v)) = r.next()? {
        let (1, Field::Bytes(def)) = (f, v) else {
            continue;
        };
        let (mut device, mut allows, mut host_args) = (String::new(), false, 0);
        let mut k = Reader::new(def);
        while let Some((f, v)) = k.next()? {
            match (f, v) {
                (2, Field::Bytes(d)) => device = utf8(d)?,
                (3, Field::Bytes(c)) => {
                    let mut c = Reader::new(c);
                    let (mut name, mut values) = (String::new(), None);
                    while let Some((f, v)) = c.next()? {
                        match (f, v) {
                            (1, Field::Bytes(n)) => name = utf8(n)?,
                            (2, Field::Bytes(a)) => values = attr_value(a)?,
                            _ => {}
                        }
                    }
                    if name == type_attr {
                        allows = match values {
                            Some(AttrValue::Types(t)) => t.contains(&dtype),
                            Some(AttrValue::Type(t)) => t == dtype,
                            _ => false,
                        };
                    }
                }
                (4, Field::Bytes(_)) => host_args += 1,
                _ => {}
            }
        }
        if device == "DEFAULT" && allows && host_args > 0 && host_args >= n_args {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{bytes_field, varint};

    fn varint_field(f: u32, v: u64, out: &mut Vec<u8>) {
        varint((f as u64) << 3, out);
        varint(v, out);
    }
    fn attr(key: &str, value: &[u8], out: &mut Vec<u8>) {
        let mut e = vec![];
        bytes_field(1, key.as_bytes(), &mut e);
        bytes_field(2, value, &mut e);
        bytes_field(5, &e, out);
    }

    /// A KernelDef: device, one type constraint (as a list of TF dtype enums), host args.
    fn kernel_def(device: &str, attr: &str, types: &[u64], host: &[&str], out: &mut Vec<u8>) {
        let mut k = vec![];
        bytes_field(1, b"AddV2", &mut k);
        bytes_field(2, device.as_bytes(), &mut k);
        let mut list = vec![];
        for t in types {
            varint_field(6, *t, &mut list);
        }
        let mut value = vec![];
        bytes_field(1, &list, &mut value);
        let mut c = vec![];
        bytes_field(1, attr.as_bytes(), &mut c);
        bytes_field(2, &value, &mut c);
        bytes_field(3, &c, &mut k);
        for h in host {
            bytes_field(4, h.as_bytes(), &mut k);
        }
        bytes_field(1, &k, out);
    }

    #[test]
    fn finds_tensorflows_host_int32_kernels() {
        let (i32_, f32_) = (3u64, 1u64);
        let mut list = vec![];
        kernel_def("GPU", "T", &[i32_], &["x"], &mut list);
        kernel_def("DEFAULT", "T", &[f32_], &["x", "y", "z"], &mut list);
        assert!(!has_default_host_kernel(&list, "T", DType::I32, 3).unwrap());
        // A DEFAULT int32 kernel with nothing in host memory does not count either.
        kernel_def("DEFAULT", "T", &[i32_], &[], &mut list);
        assert!(!has_default_host_kernel(&list, "T", DType::I32, 3).unwrap());
        // Nor one with only some arguments in host memory.
        kernel_def("DEFAULT", "T", &[i32_], &["z"], &mut list);
        assert!(!has_default_host_kernel(&list, "T", DType::I32, 3).unwrap());
        // Another attribute allowing int32 does not count.
        kernel_def("DEFAULT", "Tidx", &[i32_], &["x", "y", "z"], &mut list);
        assert!(!has_default_host_kernel(&list, "T", DType::I32, 3).unwrap());
        kernel_def("DEFAULT", "T", &[i32_], &["x", "y", "z"], &mut list);
        assert!(has_default_host_kernel(&list, "T", DType::I32, 3).unwrap());
        assert!(has_default_host_kernel(&list, "T", DType::F32, 3).unwrap());
        assert!(!has_default_host_kernel(&list, "T", DType::F16, 3).unwrap());
        assert!(has_default_host_kernel(&[0xff], "T", DType::I32, 3).is_err());
    }

    #[test]
    fn counts_op_arguments() {
        let mut list = vec![];
        for (name, ins, outs) in [("AddV2", 2, 1), ("NoOp", 0, 0), ("Unpack", 1, 1)] {
            let mut d = vec![];
            bytes_field(1, name.as_bytes(), &mut d);
            for _ in 0..ins {
                bytes_field(2, b"\x0a\x01x", &mut d);
            }
            for _ in 0..outs {
                bytes_field(3, b"\x0a\x01y", &mut d);
            }
            bytes_field(1, &d, &mut list);
        }
        let c = op_arg_counts(&list).unwrap();
        assert_eq!((c["AddV2"], c["NoOp"], c["Unpack"]), (3, 0, 2));
    }

    #[test]
    fn parses_op_and_attrs() {
        let mut nd = vec![];
        bytes_field(1, b"model/dense/MatMul", &mut nd);
        bytes_field(2, b"MatMul", &mut nd);
        bytes_field(3, b"x", &mut nd);
        let mut v = vec![];
        varint_field(5, 1, &mut v);
        attr("transpose_a", &v, &mut nd);
        let mut v = vec![];
        varint_field(6, 1, &mut v);
        attr("T", &v, &mut nd);
        let mut v = vec![];
        varint_field(3, (-3i64) as u64, &mut v);
        attr("axis", &v, &mut nd);
        let mut v = vec![];
        varint((4 << 3) | 5, &mut v);
        v.extend_from_slice(&0.25f32.to_le_bytes());
        attr("alpha", &v, &mut nd);
        let mut list = vec![];
        let mut packed = vec![];
        for i in [1u64, 2, 2, 1] {
            varint(i, &mut packed);
        }
        bytes_field(3, &packed, &mut list);
        let mut v = vec![];
        bytes_field(1, &list, &mut v);
        attr("strides", &v, &mut nd);
        let mut dim = vec![];
        varint_field(1, 7, &mut dim);
        let mut shp = vec![];
        bytes_field(2, &dim, &mut shp);
        let mut v = vec![];
        bytes_field(7, &shp, &mut v);
        attr("shape", &v, &mut nd);
        let (op, attrs) = parse(&nd).unwrap();
        assert_eq!(op, "MatMul");
        assert_eq!(attrs.get("transpose_a"), Some(&AttrValue::Bool(true)));
        assert_eq!(attrs.get("T"), Some(&AttrValue::Type(DType::F32)));
        assert_eq!(attrs.get("axis"), Some(&AttrValue::Int(-3)));
        assert_eq!(attrs.get("alpha"), Some(&AttrValue::Float(0.25)));
        assert_eq!(
            attrs.get("strides"),
            Some(&AttrValue::Ints(vec![1, 2, 2, 1]))
        );
        assert_eq!(attrs.get("shape"), Some(&AttrValue::Shape(Some(vec![7]))));
    }

    #[test]
    fn rejects_truncated_input() {
        let mut nd = vec![];
        bytes_field(2, b"MatMul", &mut nd);
        nd.truncate(nd.len() - 2);
        assert!(parse(&nd).is_err());
        assert!(parse(&[]).is_err());
    }
}
