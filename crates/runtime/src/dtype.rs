//! Element types and host-side tensors.

use crate::{Error, Result};

/// Element types the runtime stores. The GPU representation: f32/i32/u32 as 32-bit words, f16
/// as two halves per word, i64/u64 as (low, high) word pairs, bool and u8 as four bytes per
/// word. u32 and u64 exist for the few ops that take them (the random ops' key and counter,
/// bit ops, Bitcast); most families register the six types of `DType::ALL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    I32,
    I64,
    U8,
    Bool,
    U32,
    U64,
}

impl DType {
    /// The dtypes with kernels in most families, in a fixed order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::I64 | DType::U64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// TensorFlow's name for the type (`float32`, `int64`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
        }
    }

    /// Parses TensorFlow's name (`float32`, `float`, `int32`...).
    pub fn from_name(name: &str) -> Result<DType> {
        Ok(match name {
            "float32" | "float" | "f32" => DType::F32,
            "float16" | "half" | "f16" => DType::F16,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "bool" => DType::Bool,
            "uint32" | "u32" => DType::U32,
            "uint64" | "u64" => DType::U64,
            other => {
                return Err(Error::Unimplemented(format!(
                    "dtype {other} is not supported"
                )));
            }
        })
    }

    /// Floating point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust element types that map to a `DType`.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
impl Element for u64 {
    const DTYPE: DType = DType::U64;
}

/// Number of elements of a shape (1 for a scalar).
pub fn num_elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A tensor in host memory: a shape argument, an axis list, or data read back from the device.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// Wraps typed data; fails when the data's length does not match the shape.
    pub fn new<T: Element>(data: &[T], shape: &[usize]) -> Result<Self> {
        if data.len() != num_elements(shape) {
            return Err(Error::InvalidArgument(format!(
                "host tensor of shape {shape:?} needs {} elements, got {}",
                num_elements(shape),
                data.len()
            )));
        }
        Ok(HostTensor {
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            bytes: bytemuck::cast_slice(data).to_vec(),
        })
    }

    /// A boolean tensor (one byte per element, 0 or 1).
    pub fn from_bools(data: &[bool], shape: &[usize]) -> Result<Self> {
        let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
        let mut t = HostTensor::new(&bytes, shape)?;
        t.dtype = DType::Bool;
        Ok(t)
    }

    /// A rank-1 int32 tensor (axes, shapes).
    pub fn vec_i32(values: &[i32]) -> Self {
        HostTensor {
            dtype: DType::I32,
            shape: vec![values.len()],
            bytes: bytemuck::cast_slice(values).to_vec(),
        }
    }

    /// A scalar.
    pub fn scalar<T: Element>(value: T) -> Self {
        HostTensor {
            dtype: T::DTYPE,
            shape: vec![],
            bytes: bytemuck::bytes_of(&value).to_vec(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        num_elements(&self.shape)
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The data as a typed vector; fails on a dtype mismatch.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype != T::DTYPE && !(self.dtype == DType::Bool && T::DTYPE == DType::U8) {
            return Err(Error::InvalidArgument(format!(
                "host tensor holds {}, asked for {}",
                self.dtype,
                T::DTYPE
            )));
        }
        Ok(bytemuck::pod_collect_to_vec(&self.bytes))
    }

    /// Integer contents (int32 or int64) widened to i64: axes, shapes, sizes.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        match self.dtype {
            DType::I32 => Ok(self.to_vec::<i32>()?.into_iter().map(i64::from).collect()),
            DType::I64 => self.to_vec::<i64>(),
            other => Err(Error::InvalidArgument(format!(
                "expected an int32 or int64 tensor, got {other}"
            ))),
        }
    }
}
