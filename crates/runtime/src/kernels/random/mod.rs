//! Random family: TensorFlow's Philox4x32-10 random ops (stateless V1 with a seed input,
//! stateless V2 with key / counter / alg inputs, and the stateful ops with seed / seed2
//! attributes), plus the small integer ops that seed handling runs (bitwise ops, shifts,
//! Bitcast; see `bitwise.rs`).
//!
//! Every op produces the values TensorFlow's own kernels produce for the same key and
//! counter: the same Philox blocks for the same output elements (group g of a distribution
//! uses block counter + g; the truncated normal's group g starts at block counter + 256 g),
//! TensorFlow's uint32 -> float conversions, and its Box-Muller transform (see
//! `philox.wgsl`). Uniform floats and integers are bit-identical; normal and truncated normal
//! values are within a few ULP (TensorFlow calls libm's log and sincos; the shader computes
//! them by argument reduction and series).
//!
//! Host memory mirrors TensorFlow's GPU registrations: `shape`, `seed`, `alg`, `minval` and
//! `maxval` are host inputs; the V2 ops' `key` and `counter` are device inputs.

pub mod bitwise;

use std::hash::{BuildHasher, Hasher};

use parking_lot::Mutex;

use crate::kernel::{DeviceRef, Kernel, KernelContext, OpDef, Operand, TensorDesc, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, MATH_WGSL, bind_out, fmt_shape};
use crate::kernels::wgsl::{LINEAR_INDEX, WG, params};
use crate::{Attrs, DType, Error, HostTensor, Result, bail_invalid};

const PHILOX_WGSL: &str = include_str!("philox.wgsl");

const FLOATS: &[DType] = &[DType::F32, DType::F16];
const INTS: &[DType] = &[DType::I32, DType::I64];

/// Host-memory inputs: the shape, the seed or (V2) the algorithm, and UniformInt's bounds.
const SHAPE: &[(usize, &str)] = &[(0, "shape")];
const SHAPE_BOUNDS: &[(usize, &str)] = &[(0, "shape"), (1, "minval"), (2, "maxval")];
const SEED: &[(usize, &str)] = &[(0, "shape"), (1, "seed")];
const SEED_BOUNDS: &[(usize, &str)] = &[(0, "shape"), (1, "seed"), (2, "minval"), (3, "maxval")];
const ALG: &[(usize, &str)] = &[(0, "shape"), (3, "alg")];
const ALG_BOUNDS: &[(usize, &str)] = &[(0, "shape"), (3, "alg"), (4, "minval"), (5, "maxval")];

/// A stateless op of `Dist::$dist` seeded by `Source::$src`.
macro_rules! stateless_row {
    ($op:literal, $dist:ident, $src:ident, $dtypes:expr, $host:expr) => {
        OpDef {
            op: $op,
            type_attr: "dtype",
            dtypes: $dtypes,
            host_inputs: $host,
            factory: |a| RandomOp::build($op, Dist::$dist, Source::$src, a),
        }
    };
}

/// A stateful op of `Dist::$dist`.
macro_rules! stateful_row {
    ($op:literal, $dist:ident, $type_attr:literal, $dtypes:expr, $host:expr) => {
        OpDef {
            op: $op,
            type_attr: $type_attr,
            dtypes: $dtypes,
            host_inputs: $host,
            factory: |a| RandomOp::build_stateful($op, Dist::$dist, a),
        }
    };
}

/// A bitwise op (`bitwise::BitOp::$bit`).
macro_rules! bit_row {
    ($op:literal, $bit:ident) => {
        OpDef {
            op: $op,
            type_attr: "T",
            dtypes: bitwise::INT_TYPES,
            host_inputs: &[],
            factory: |_| Ok(Box::new(bitwise::Bitwise::new(bitwise::BitOp::$bit))),
        }
    };
}

/// Registration table.
pub const OPS: &[OpDef] = &[
    stateless_row!("StatelessRandomUniform", Uniform, Seed, FLOATS, SEED),
    stateless_row!("StatelessRandomNormal", Normal, Seed, FLOATS, SEED),
    stateless_row!("StatelessTruncatedNormal", Truncated, Seed, FLOATS, SEED),
    stateless_row!(
        "StatelessRandomUniformInt",
        UniformInt,
        Seed,
        INTS,
        SEED_BOUNDS
    ),
    stateless_row!("StatelessRandomUniformFullInt", FullInt, Seed, INTS, SEED),
    stateful_row!("RandomUniform", Uniform, "dtype", FLOATS, SHAPE),
    stateful_row!("RandomStandardNormal", Normal, "dtype", FLOATS, SHAPE),
    stateful_row!("TruncatedNormal", Truncated, "dtype", FLOATS, SHAPE),
    stateful_row!("RandomUniformInt", UniformInt, "Tout", INTS, SHAPE_BOUNDS),
    bit_row!("BitwiseAnd", And),
    bit_row!("BitwiseOr", Or),
    bit_row!("BitwiseXor", Xor),
    bit_row!("LeftShift", LeftShift),
    bit_row!("RightShift", RightShift),
    OpDef {
        op: "Bitcast",
        type_attr: "T",
        dtypes: bitwise::BITCAST_TYPES,
        host_inputs: &[],
        factory: bitwise::Bitcast::build,
    },
];
/// The V2 stateless ops. Their `key` and `counter` inputs are uint64 tensors in device memory
/// (as TensorFlow's GPU kernels take them; StatelessRandomGetKeyCounter, which makes them, is
/// a host kernel in `host_ops`). The kernels accept any 8-byte integer dtype for key and
/// counter.
pub const OPS_UINT64: &[OpDef] = &[
    stateless_row!("StatelessRandomUniformV2", Uniform, KeyCounter, FLOATS, ALG),
    stateless_row!("StatelessRandomNormalV2", Normal, KeyCounter, FLOATS, ALG),
    stateless_row!(
        "StatelessTruncatedNormalV2",
        Truncated,
        KeyCounter,
        FLOATS,
        ALG
    ),
    stateless_row!(
        "StatelessRandomUniformIntV2",
        UniformInt,
        KeyCounter,
        INTS,
        ALG_BOUNDS
    ),
    stateless_row!(
        "StatelessRandomUniformFullIntV2",
        FullInt,
        KeyCounter,
        INTS,
        ALG
    ),
];

/// TensorFlow's algorithm ids (framework/rng_alg.h).
pub(crate) const RNG_ALG_PHILOX: i64 = 1;
const RNG_ALG_AUTO_SELECT: i64 = 3;

/// Philox4x32-10 on the host: key derivation and counter arithmetic.
pub mod philox {
    /// One Philox block: four random words for `counter` under `key`.
    pub fn block(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
        let mut c = counter;
        let mut k = key;
        for round in 0..10 {
            if round > 0 {
                k[0] = k[0].wrapping_add(0x9E37_79B9);
                k[1] = k[1].wrapping_add(0xBB67_AE85);
            }
            let p0 = 0xD251_1F53u64 * c[0] as u64;
            let p1 = 0xCD9E_8D57u64 * c[2] as u64;
            c = [
                (p1 >> 32) as u32 ^ c[1] ^ k[0],
                p1 as u32,
                (p0 >> 32) as u32 ^ c[3] ^ k[1],
                p0 as u32,
            ];
        }
        c
    }

    /// PhiloxRandom::Skip: advances the counter by `count` blocks, with TensorFlow's carries.
    pub fn skip(counter: [u32; 4], count: u64) -> [u32; 4] {
        let mut c = counter;
        let lo = count as u32;
        let mut hi = (count >> 32) as u32;
        c[0] = c[0].wrapping_add(lo);
        if c[0] < lo {
            hi = hi.wrapping_add(1);
        }
        c[1] = c[1].wrapping_add(hi);
        if c[1] < hi {
            c[2] = c[2].wrapping_add(1);
            if c[2] == 0 {
                c[3] = c[3].wrapping_add(1);
            }
        }
        c
    }

    /// The key and counter TensorFlow derives from a stateless op's seed (GenerateKey in
    /// stateless_random_ops.cc, and StatelessRandomGetKeyCounter): the seed, sign-extended to
    /// 64 bits per element, scrambled through one Philox block.
    pub fn key_counter_from_seed(seed0: i64, seed1: i64) -> ([u32; 2], [u32; 4]) {
        let (s0, s1) = (seed0 as u64, seed1 as u64);
        let counter = [s0 as u32, (s0 >> 32) as u32, s1 as u32, (s1 >> 32) as u32];
        let mix = block(counter, [0x3ec8_f720, 0x0246_1e29]);
        ([mix[0], mix[1]], [0, 0, mix[2], mix[3]])
    }

    /// The generator of a stateful op with attributes seed and seed2 (PhiloxRandom(seed,
    /// seed2)): key from seed, counter words 2 and 3 from seed2.
    pub fn key_counter_from_attrs(seed: i64, seed2: i64) -> ([u32; 2], [u32; 4]) {
        let (s, s2) = (seed as u64, seed2 as u64);
        (
            [s as u32, (s >> 32) as u32],
            [0, 0, s2 as u32, (s2 >> 32) as u32],
        )
    }
}

/// What a random op draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dist {
    Uniform,
    Normal,
    Truncated,
    UniformInt,
    FullInt,
}

impl Dist {
    fn is_float(self) -> bool {
        matches!(self, Dist::Uniform | Dist::Normal | Dist::Truncated)
    }
}

/// Where a random op's key and counter come from.
enum Source {
    /// A host `seed` input (the V1 stateless ops).
    Seed,
    /// Device `key` and `counter` inputs and a host `alg` (the V2 stateless ops).
    KeyCounter,
    /// The kernel's own generator (the stateful ops): its key, and its next counter.
    Stateful(Mutex<([u32; 2], [u32; 4])>),
}

/// One random op.
struct RandomOp {
    name: &'static str,
    dist: Dist,
    dtype: DType,
    source: Source,
}

/// Bounds of a uniform integer draw: minval, and maxval - minval as an unsigned number.
struct IntRange {
    lo: u64,
    range: u64,
}

impl RandomOp {
    fn new(
        name: &'static str,
        dist: Dist,
        source: Source,
        attrs: &Attrs,
        type_attr: &str,
    ) -> Result<Self> {
        let dtype = match attrs.dtype_opt(type_attr)? {
            Some(t) => t,
            None if dist.is_float() => DType::F32,
            None => bail_invalid!("{name}: missing type attribute {type_attr}"),
        };
        let ok = if dist.is_float() {
            FLOATS.contains(&dtype)
        } else {
            INTS.contains(&dtype)
        };
        if !ok {
            return Err(Error::Unimplemented(format!(
                "{name} has no tfwgpu kernel for {type_attr}={dtype}"
            )));
        }
        Ok(RandomOp {
            name,
            dist,
            dtype,
            source,
        })
    }

    fn build(
        name: &'static str,
        dist: Dist,
        source: Source,
        attrs: &Attrs,
    ) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(Self::new(name, dist, source, attrs, "dtype")?))
    }

    fn build_stateful(name: &'static str, dist: Dist, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        let seed = attrs.int_or("seed", 0)?;
        let seed2 = attrs.int_or("seed2", 0)?;
        let (seed, seed2) = if seed == 0 && seed2 == 0 {
            // Both unspecified: TensorFlow seeds the generator nondeterministically.
            (random_i64(), random_i64())
        } else {
            (seed, seed2)
        };
        let state = philox::key_counter_from_attrs(seed, seed2);
        let type_attr = if dist == Dist::UniformInt {
            "Tout"
        } else {
            "dtype"
        };
        Ok(Box::new(Self::new(
            name,
            dist,
            Source::Stateful(Mutex::new(state)),
            attrs,
            type_attr,
        )?))
    }

    /// Number of inputs before minval / maxval.
    fn base_inputs(&self) -> usize {
        match self.source {
            Source::Seed => 2,
            Source::KeyCounter => 4,
            Source::Stateful(_) => 1,
        }
    }

    fn expected_inputs(&self) -> usize {
        self.base_inputs() + if self.dist == Dist::UniformInt { 2 } else { 0 }
    }

    /// Validates the inputs; returns the output shape and, for integer draws, the range.
    fn check(&self, inputs: &[Operand]) -> Result<(Vec<usize>, Option<IntRange>)> {
        let name = self.name;
        if inputs.len() != self.expected_inputs() {
            bail_invalid!(
                "{name} takes {} inputs, got {}",
                self.expected_inputs(),
                inputs.len()
            );
        }
        let shape = output_shape(name, inputs[0].host(name, 0)?)?;
        let n: usize = shape.iter().product();
        match self.source {
            Source::Seed => {
                let seed = inputs[1].host(name, 1)?;
                if seed.shape != [2] {
                    bail_invalid!(
                        "{name}: seed must have shape [2], not {}",
                        fmt_shape(&seed.shape)
                    );
                }
                seed.to_i64_vec().map_err(|_| {
                    crate::invalid_arg!("{name}: Invalid seed type: {}", seed.dtype)
                })?;
            }
            Source::KeyCounter => {
                let alg = inputs[3].host(name, 3)?;
                if !alg.shape.is_empty() || alg.dtype != DType::I32 {
                    bail_invalid!(
                        "{name}: alg (input 3) must be an int32 scalar, got {} {}",
                        alg.dtype,
                        fmt_shape(&alg.shape)
                    );
                }
                let a = alg.to_i64_vec()?[0];
                if a != RNG_ALG_PHILOX && a != RNG_ALG_AUTO_SELECT {
                    bail_invalid!("{name}: Unsupported algorithm id: {a}");
                }
                let key = inputs[1].device(name, 1)?;
                let counter = inputs[2].device(name, 2)?;
                for (what, t) in [("key", key), ("counter", counter)] {
                    if t.desc.dtype.size() != 8 || t.desc.dtype.is_float() {
                        bail_invalid!(
                            "{name}: {what} must be a uint64 tensor, got {}",
                            t.desc.dtype
                        );
                    }
                }
                if key.desc.shape != [1] {
                    bail_invalid!(
                        "{name}: key must have shape [1], not {}. (Note that an RNG key has \
                         shape [1] for the Philox algorithm.)",
                        fmt_shape(&key.desc.shape)
                    );
                }
                if counter.desc.shape.len() != 1 || counter.desc.shape[0] < 2 {
                    bail_invalid!(
                        "{name}: counter must be a vector of length at least 2 for the Philox \
                         algorithm, not {}",
                        fmt_shape(&counter.desc.shape)
                    );
                }
            }
            Source::Stateful(_) => {}
        }
        let range = if self.dist == Dist::UniformInt {
            let b = self.base_inputs();
            let lo = int_scalar(name, "minval", inputs[b].host(name, b)?, self.dtype)?;
            let hi = int_scalar(name, "maxval", inputs[b + 1].host(name, b + 1)?, self.dtype)?;
            // As TensorFlow: an empty output needs no valid range.
            if n > 0 && lo >= hi {
                bail_invalid!("{name}: Need minval < maxval, got {lo} >= {hi}");
            }
            Some(IntRange {
                lo: lo as u64,
                range: (hi as u64).wrapping_sub(lo as u64),
            })
        } else {
            None
        };
        if n > u32::MAX as usize {
            return Err(Error::Unimplemented(format!(
                "{name}: outputs of more than 2^32-1 elements are not supported (got {n})"
            )));
        }
        Ok((shape, range))
    }

    /// Elements per Philox group.
    fn group_size(&self) -> usize {
        if !self.dist.is_float() && self.dtype == DType::I64 {
            2
        } else {
            4
        }
    }

    fn variant(&self) -> (u32, &'static str) {
        let f16 = self.dtype == DType::F16;
        let i64 = self.dtype == DType::I64;
        match (self.dist, f16 || i64) {
            (Dist::Uniform, false) => (0, "uniform"),
            (Dist::Uniform, true) => (1, "uniform"),
            (Dist::Normal, false) => (2, "normal"),
            (Dist::Normal, true) => (3, "normal"),
            (Dist::Truncated, false) => (4, "truncated"),
            (Dist::Truncated, true) => (5, "truncated"),
            (Dist::UniformInt, false) => (6, "uniform_int"),
            (Dist::UniformInt, true) => (7, "uniform_int"),
            (Dist::FullInt, false) => (8, "full_int"),
            (Dist::FullInt, true) => (9, "full_int"),
        }
    }
}

/// A random seed for a stateful op whose seed and seed2 are both 0.
fn random_i64() -> i64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as i64
}

/// The output shape from a host shape tensor (int32 or int64 vector of non-negative sizes).
fn output_shape(name: &str, t: &HostTensor) -> Result<Vec<usize>> {
    if t.shape.len() > 1 {
        bail_invalid!(
            "{name}: shape must be a vector of {{int32,int64}}, got shape {}",
            fmt_shape(&t.shape)
        );
    }
    let dims = t.to_i64_vec().map_err(|_| {
        crate::invalid_arg!("{name}: shape must be int32 or int64, got {}", t.dtype)
    })?;
    dims.iter()
        .map(|&d| {
            if d < 0 {
                Err(crate::invalid_arg!(
                    "{name}: shape dimensions must be non-negative, got {d}"
                ))
            } else {
                Ok(d as usize)
            }
        })
        .collect()
}

/// minval / maxval: a scalar of the output's dtype.
fn int_scalar(name: &str, what: &str, t: &HostTensor, dtype: DType) -> Result<i64> {
    if !t.shape.is_empty() {
        bail_invalid!(
            "{name}: {what} must be 0-D, got shape {}",
            fmt_shape(&t.shape)
        );
    }
    if t.dtype != dtype {
        bail_invalid!("{name}: {what} must be {dtype}, got {}", t.dtype);
    }
    Ok(t.to_i64_vec()?[0])
}

impl Kernel for RandomOp {
    fn op(&self) -> &'static str {
        self.name
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let (shape, _) = self.check(inputs)?;
        Ok(vec![TensorDesc::new(self.dtype, &shape)])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let name = self.name;
        let (shape, range) = self.check(inputs)?;
        let out = &outputs[0];
        if out.desc != TensorDesc::new(self.dtype, &shape) {
            bail_invalid!(
                "{name}: output is {} {} but the op computes {} {}",
                out.desc.dtype,
                fmt_shape(&out.desc.shape),
                self.dtype,
                fmt_shape(&shape)
            );
        }
        let n = out.desc.num_elements();
        if n == 0 {
            return Ok(());
        }
        let o = bind_out(ctx, name, out)?;
        let (key, counter, key_buf, counter_buf, from_mem) = match &self.source {
            Source::Seed => {
                let seed = inputs[1].host(name, 1)?.to_i64_vec()?;
                let (k, c) = philox::key_counter_from_seed(seed[0], seed[1]);
                (k, c, o.clone(), o.clone(), 0)
            }
            Source::KeyCounter => {
                let kb = ctx.bind(inputs[1].device(name, 1)?)?;
                let cb = ctx.bind(inputs[2].device(name, 2)?)?;
                ([0; 2], [0; 4], kb, cb, 1)
            }
            Source::Stateful(state) => {
                // GuardedPhiloxRandom::ReserveRandomOutputs(n, 256): this call uses the
                // generator as it is, the next one starts 256 blocks per element later.
                let mut s = state.lock();
                let counter = s.1;
                s.1 = philox::skip(counter, n as u64 * 256);
                (s.0, counter, o.clone(), o.clone(), 0)
            }
        };
        let (lo, rg) = range.map_or((0, 0), |r| (r.lo, r.range));
        let groups = n.div_ceil(self.group_size()) as u32;
        let (dist_id, variant) = self.variant();
        let key_ = PipelineKey::new("random", Some(self.dtype), variant);
        let pipeline = ctx.pipeline(key_, || {
            ShaderSource::new(
                PHILOX_WGSL
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$COMMON", COMMON_WGSL)
                    .replace("$MATH", MATH_WGSL)
                    .replace("$DIST", &dist_id.to_string())
                    .replace("$WG", &WG.to_string()),
            )
        })?;
        let (grid, row) = grid_1d(groups as u64, WG);
        let p = params(&[
            row,
            n as u32,
            groups,
            from_mem,
            key[0],
            key[1],
            counter[0],
            counter[1],
            counter[2],
            counter[3],
            lo as u32,
            (lo >> 32) as u32,
            rg as u32,
            (rg >> 32) as u32,
            0,
            0,
        ]);
        ctx.dispatch(&pipeline, &p, &[o, key_buf, counter_buf], grid)
    }
}
