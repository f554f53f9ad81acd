//! matmul family: MatMul, BatchMatMul, BatchMatMulV2 and BatchMatMulV3 (float32, int32;
//! float16 through the float32 kernel: f16 in, f32 accumulate, f16 out), and Einsum (float32,
//! float16; `einsum.rs`: strided copies and sums around one BatchMatMulV2).
//!
//! One tiled kernel (`matmul.wgsl`) serves all four ops: transposed operands are read through
//! strides, and batch broadcasting (V2/V3, NumPy style) through per-dimension batch strides
//! that are 0 where an operand is broadcast. float32 accumulates in float32 with fma; int32
//! wraps.
//!
//! Two shaders: the scalar, strided `matmul.wgsl` serves every shape, layout and batch
//! pattern; the register-blocked `matmul_vec4.wgsl` (module `vec4`) serves operands whose
//! contiguous dimension is a multiple of 4, with 16-byte loads and stores. [`choose`] picks
//! the shader and tile for a product; the internal attribute `_tfwgpu_tile` (a tile name, for
//! benchmarks and tests) forces one.

pub mod coop;
mod cpu;
mod einsum;
mod vec4;

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, Kernel, KernelContext, MAX_GROUPS_X, OpDef, Operand, TensorDesc};
use crate::kernel_manager::{Checks, PipelineKey, ShaderSource};
use crate::kernels::wgsl::params;
use crate::tune::bucket;
use crate::{AttrValue, Attrs, DType, Error, Result, bail_invalid};
pub use cpu::{CPU_TILES, CpuTile, SG_TILES, SgModes, SgTile};
pub use vec4::{Hooks, Layouts, Vec4Tile};

const DTYPES: &[DType] = &[DType::F32, DType::I32];
/// Registered: float16 runs the float32 kernel on converted operands (f32 accumulation) and
/// rounds the product once (`nn::f16`).
const REG_DTYPES: &[DType] = &[DType::F32, DType::F16, DType::I32];

/// Registration table.
pub const OPS: &[OpDef] = &[
    OpDef {
        op: "MatMul",
        type_attr: "T",
        dtypes: REG_DTYPES,
        host_inputs: &[],
        factory: |a| {
            coop::build(Variant::MatMul, a, |a| {
                crate::kernels::nn::f16::build(|a| MatMul::build(Variant::MatMul, a), a, &["T"])
            })
        },
    },
    OpDef {
        op: "BatchMatMul",
        type_attr: "T",
        dtypes: REG_DTYPES,
        host_inputs: &[],
        factory: |a| {
            coop::build(Variant::BatchMatMul, a, |a| {
                crate::kernels::nn::f16::build(
                    |a| MatMul::build(Variant::BatchMatMul, a),
                    a,
                    &["T"],
                )
            })
        },
    },
    OpDef {
        op: "BatchMatMulV2",
        type_attr: "T",
        dtypes: REG_DTYPES,
        host_inputs: &[],
        factory: |a| {
            coop::build(Variant::BatchMatMulV2, a, |a| {
                crate::kernels::nn::f16::build(
                    |a| MatMul::build(Variant::BatchMatMulV2, a),
                    a,
                    &["T"],
                )
            })
        },
    },
    OpDef {
        op: "BatchMatMulV3",
        type_attr: "Ta",
        dtypes: REG_DTYPES,
        host_inputs: &[],
        factory: |a| {
            coop::build(Variant::BatchMatMulV3, a, |a| {
                crate::kernels::nn::f16::build(
                    |a| MatMul::build(Variant::BatchMatMulV3, a),
                    a,
                    &["Ta", "Tb", "Tout"],
                )
            })
        },
    },
    OpDef {
        op: "Einsum",
        type_attr: "T",
        dtypes: einsum::DTYPES,
        host_inputs: &[],
        factory: einsum::build,
    },
];

const MATMUL_WGSL: &str = include_str!("matmul.wgsl");
/// The params struct and batch decomposition both matmul shaders share, prepended to each.
pub(super) const MATMUL_COMMON_WGSL: &str = include_str!("matmul_common.wgsl");
const MATMUL_SPLITK_WGSL: &str = include_str!("matmul_splitk.wgsl");
const MATMUL_KSUM_WGSL: &str = include_str!("matmul_ksum.wgsl");

/// `body` (matmul.wgsl or matmul_splitk.wgsl) after the shared params, for `dtype`: float32
/// multiply-adds by `fma`, int32 exactly.
fn scalar_source(body: &str, dtype: DType) -> String {
    let (elem, mad) = match dtype {
        DType::F32 => ("f32", "return fma(x, y, acc);"),
        _ => ("i32", "return acc + x * y;"),
    };
    [MATMUL_COMMON_WGSL, body]
        .concat()
        .replace("ELEM", elem)
        .replace("MAD_BODY", mad)
}

/// A tile configuration of `matmul.wgsl`, named in the pipeline key's specialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    /// The specialization name, "BMxBNxBK".
    pub name: &'static str,
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Depth of the shared-memory tiles.
    pub bk: u32,
    /// Rows of C per invocation.
    pub tm: u32,
    /// Columns of C per invocation.
    pub tn: u32,
}

impl Tile {
    /// Invocations per workgroup.
    pub const fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Whether the shader's tile loads cover the tiles exactly.
    pub const fn is_valid(&self) -> bool {
        let t = self.threads();
        self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bm * self.bk).is_multiple_of(t)
            && (self.bn * self.bk).is_multiple_of(t)
            && t <= 256
    }

    /// The shader source for `dtype`.
    pub fn wgsl(&self, dtype: DType) -> String {
        scalar_source(MATMUL_WGSL, dtype)
            .replace("TILE_BM", &self.bm.to_string())
            .replace("TILE_BN", &self.bn.to_string())
            .replace("TILE_BK", &self.bk.to_string())
            .replace("TILE_TM", &self.tm.to_string())
            .replace("TILE_TN", &self.tn.to_string())
    }
}

/// The general-purpose tile: 64x64 outputs per workgroup, 4x4 per invocation, K steps of 8.
pub const TILE_64X64X8: Tile = Tile {
    name: "64x64x8",
    bm: 64,
    bn: 64,
    bk: 8,
    tm: 4,
    tn: 4,
};

/// A tile for small matrices (many of them, batched): 8x8 outputs per workgroup of 64
/// invocations, one output each.
pub const TILE_8X8X8: Tile = Tile {
    name: "8x8x8",
    bm: 8,
    bn: 8,
    bk: 8,
    tm: 1,
    tn: 1,
};

const _: () = assert!(TILE_64X64X8.is_valid() && TILE_8X8X8.is_valid());

/// Register-blocked vector tiles (`matmul_vec4.wgsl`), named "BMxBNxBK_TMxTN" (outputs per
/// workgroup, K depth, outputs per invocation), then the K loop's form: "s1" one shared-memory
/// buffer (two barriers per K tile); "h", "q", "w" two buffers with the next K tile staged in
/// halves, quarters or whole during the products (one barrier per K tile); no letter two
/// buffers with the loop unrolled by two; "p0" unpadded shared rows. The measurements that
/// chose them, and those of the variants tried and dropped (whose knobs remain: tile sizes,
/// stages, parts, padding, launch grouping are fields of `Vec4Tile`), are in
/// bench/NOTES-matmul.md.
///
/// 128x256, 8x16 per invocation, 256 invocations, one buffer: the H200's best at 2048 and 4096
/// up to v6 (~240 registers, one workgroup per multiprocessor); 41.6 TFLOP/s at 4096 once
/// branch-free (v7).
pub const V4_128X256X16_8X16S1: Vec4Tile = Vec4Tile {
    name: "128x256x16_8x16s1",
    bm: 128,
    bn: 256,
    bk: 16,
    tm: 8,
    tn: 16,
    stages: 1,
    group: 8,
    parts: 0,
    pad: true,
};
/// Its transpose, for outputs with more rows than columns.
pub const V4_256X128X16_16X8S1: Vec4Tile = Vec4Tile {
    name: "256x128x16_16x8s1",
    bm: 256,
    bn: 128,
    tm: 16,
    tn: 8,
    ..V4_128X256X16_8X16S1
};
/// 128x128, 8x16 per invocation, 128 invocations (cuBLAS's float32 kernels on Hopper use
/// 128x128x8 tiles with 4 warps); 255 registers on the H200, two workgroups per multiprocessor.
pub const V4_128X128X16_8X16S1: Vec4Tile = Vec4Tile {
    name: "128x128x16_8x16s1",
    bn: 128,
    ..V4_128X256X16_8X16S1
};
/// 128x128, 8x8 per invocation, 256 invocations: exactly 128 registers on the H200 (two
/// workgroups per multiprocessor), but shared-memory bound (4 LDS.128 per 64 FFMA); the
/// large tile that fits WebGPU's default 16 KiB of workgroup memory.
pub const V4_128X128X8_8X8S1: Vec4Tile = Vec4Tile {
    name: "128x128x8_8x8s1",
    bk: 8,
    tn: 8,
    ..V4_128X128X16_8X16S1
};
/// 64x64, 4x4 per invocation: enough workgroups for mid-sized products (1024^2: 256).
pub const V4_64X64X32_4X4S1: Vec4Tile = Vec4Tile {
    name: "64x64x32_4x4s1",
    bm: 64,
    bn: 64,
    bk: 32,
    tm: 4,
    tn: 4,
    stages: 1,
    group: 0,
    parts: 0,
    pad: true,
};
pub const V4_64X64X16_4X4S1: Vec4Tile = Vec4Tile {
    name: "64x64x16_4x4s1",
    bk: 16,
    ..V4_64X64X32_4X4S1
};
/// Two shared-memory buffers, the loop unrolled by two (every shared offset a constant):
/// kept (and tested) for adapters with other register budgets.
pub const V4_64X64X16_4X4: Vec4Tile = Vec4Tile {
    name: "64x64x16_4x4",
    stages: 2,
    ..V4_64X64X16_4X4S1
};

// v7: two buffers, the next K tile staged during the products (bench/NOTES-matmul.md).
/// 128x256, 8x16 per invocation, BK 8, two padded buffers (25 KiB), the next tile staged in
/// halves: the H200's default at 2048 and up (213 registers, one workgroup of 8 warps per
/// multiprocessor; 42.7-43.0 TFLOP/s at 4096, 0.85-0.86 of PyTorch's float32).
pub const V4_128X256X8_8X16H: Vec4Tile = Vec4Tile {
    name: "128x256x8_8x16h",
    bk: 8,
    stages: 2,
    parts: 2,
    ..V4_128X256X16_8X16S1
};
/// 128x256 at BK 16 in quarters, two unpadded buffers: 48 KiB (devices with more than
/// lavapipe's 32 KiB; tested through its twin 64x128x16_8x16qp0). As fast as 128x256x8_8x16h
/// at 4096 (42.4-42.9); a tuning candidate.
pub const V4_128X256X16_8X16QP0: Vec4Tile = Vec4Tile {
    name: "128x256x16_8x16qp0",
    stages: 2,
    parts: 4,
    pad: false,
    ..V4_128X256X16_8X16S1
};
/// The half-size twin of 128x256x16_8x16qp0 (the same generated code at 24 KiB).
pub const V4_64X128X16_8X16QP0: Vec4Tile = Vec4Tile {
    name: "64x128x16_8x16qp0",
    bm: 64,
    bn: 128,
    ..V4_128X256X16_8X16QP0
};
/// 128x128, 8x16 per invocation, BK 8, two buffers, whole next tile staged (17 KiB, two
/// workgroups per multiprocessor): 40.2 at 4096, for outputs with too few 128x256 tiles.
pub const V4_128X128X8_8X16W: Vec4Tile = Vec4Tile {
    name: "128x128x8_8x16w",
    bn: 128,
    parts: 1,
    ..V4_128X256X8_8X16H
};
/// The same staged in halves (39.1 at 4096): the split path at 128 invocations.
pub const V4_128X128X8_8X16H: Vec4Tile = Vec4Tile {
    name: "128x128x8_8x16h",
    parts: 2,
    ..V4_128X128X8_8X16W
};
/// 64x64, 4x4 per invocation, BK 16, two buffers, whole next tile staged (17 KiB): the
/// H200's default below 2048 (29.4-29.6 at 1024, 0.77 of PyTorch).
pub const V4_64X64X16_4X4W: Vec4Tile = Vec4Tile {
    name: "64x64x16_4x4w",
    stages: 2,
    parts: 1,
    ..V4_64X64X16_4X4S1
};
/// The same unpadded: 16 KiB, WebGPU's default workgroup memory.
pub const V4_64X64X16_4X4WP0: Vec4Tile = Vec4Tile {
    name: "64x64x16_4x4wp0",
    pad: false,
    ..V4_64X64X16_4X4W
};

/// Every vector tile, for `_tfwgpu_tile`.
pub const VEC4_TILES: &[Vec4Tile] = &[
    V4_128X256X8_8X16H,
    V4_128X256X16_8X16QP0,
    V4_64X128X16_8X16QP0,
    V4_128X128X8_8X16W,
    V4_128X128X8_8X16H,
    V4_64X64X16_4X4W,
    V4_64X64X16_4X4WP0,
    V4_128X256X16_8X16S1,
    V4_256X128X16_16X8S1,
    V4_128X128X16_8X16S1,
    V4_128X128X8_8X8S1,
    V4_64X64X32_4X4S1,
    V4_64X64X16_4X4S1,
    V4_64X64X16_4X4,
];

/// The split-K shader (`matmul_splitk.wgsl`): a workgroup of `wg` invocations computes `nc`
/// columns of one row of C, its invocations sharing K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitK {
    /// The specialization name, "splitkWGxNC".
    pub name: &'static str,
    /// Invocations per workgroup (a power of two: the partial sums are added as a tree).
    pub wg: u32,
    /// Columns of C per workgroup.
    pub nc: u32,
}

impl SplitK {
    /// Whether the shader's reduction and stores work with these sizes.
    pub const fn is_valid(&self) -> bool {
        self.wg.is_power_of_two() && self.wg <= 256 && self.nc >= 1 && self.nc <= self.wg
    }

    /// The shader source for `dtype`.
    pub fn wgsl(&self, dtype: DType) -> String {
        scalar_source(MATMUL_SPLITK_WGSL, dtype)
            .replace("SPLITK_WG", &self.wg.to_string())
            .replace("SPLITK_NC", &self.nc.to_string())
    }
}

/// 128 invocations share K; 8 columns per workgroup.
pub const SPLITK_128X8: SplitK = SplitK {
    name: "splitk128x8",
    wg: 128,
    nc: 8,
};
const _: () = assert!(SPLITK_128X8.is_valid());

/// Products with at most this many outputs (all batches) and ...
const SPLITK_MAX_OUTPUTS: usize = 4096;
/// ... at least this deep go to the split-K kernel on GPU adapters (see [`splitk_applies`]).
const SPLITK_MIN_K: usize = 256;

/// Whether the automatic choice on a GPU adapter sends a product to the split-K kernel
/// (`TFWGPU_MATMUL_SPLITK=0`: never; read once per process).
fn splitk_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_MATMUL_SPLITK", "0"))
}

/// Whether a product of `batches` x M x N outputs over K goes to the split-K kernel: few
/// outputs over a long K, where the tiled kernels run one or two workgroups that each walk all
/// of K serially (the Keras CNN's Dense layer, 64 x 10 over K = 1152 at batch 64: one 64x64
/// workgroup, 144 steps of 8 with two barriers each: 189 us per call with its bias on the H200,
/// 27 us with this kernel; bench/RESULTS.md, session 11). The split-K kernel runs
/// M x ceil(N / 8) workgroups of 128 invocations, each summing K / 128 terms per output, then
/// a tree of 7 levels; it reads A once per block of 8 columns and B once per row, which stays
/// small under these bounds.
pub fn splitk_applies(batches: usize, m: usize, n: usize, k: usize) -> bool {
    k >= SPLITK_MIN_K && batches.saturating_mul(m).saturating_mul(n) <= SPLITK_MAX_OUTPUTS
}

/// The automatic plan on a GPU adapter: the split-K kernel where [`splitk_applies`] (unless
/// `TFWGPU_MATMUL_SPLITK=0`), else [`choose`].
pub fn choose_gpu(
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    layouts: Layouts,
    shared: u32,
) -> Plan {
    if splitk_on() && splitk_applies(batches, m, n, k) {
        return Plan::SplitK(SPLITK_128X8);
    }
    let base = choose(batches, m, n, k, layouts, shared);
    match base {
        Plan::Vec4(t, l) if ksplit_on() => match ksplit_count(batches, m, n, k, t, l) {
            Some(s) => Plan::KSplit(t, l, s),
            None => base,
        },
        _ => base,
    }
}

/// Whether the automatic choice on a GPU adapter may split K across workgroups of the tiled
/// kernel (`TFWGPU_MATMUL_KSPLIT=0`: never; read once per process).
fn ksplit_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_MATMUL_KSPLIT", "0"))
}

/// Workgroups the K-split choice aims at: about one per multiprocessor of a large GPU (the
/// H200 has 132).
const KSPLIT_TARGET_GROUPS: usize = 144;
/// Each split keeps at least this much of K.
const KSPLIT_MIN_KC: usize = 128;

/// Into how many parts the automatic choice splits K for the vector tile `t`, if at all:
/// where the product has fewer than half as many tiles as [`KSPLIT_TARGET_GROUPS`] (so most
/// multiprocessors would idle while a few walk all of K: ResNet-50's classifier, 64 x 1000
/// over K = 2048, is 16 tiles of 64 x 64), the largest count S <= 16 with S x tiles within the
/// target, K divisible by S, each part a multiple of 4 (the vector loads) and at least
/// [`KSPLIT_MIN_KC`] deep. Single products only (the split becomes the outermost batch).
pub fn ksplit_count(
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    t: Vec4Tile,
    layouts: Layouts,
) -> Option<u32> {
    let tiles = batches * m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    if batches != 1 || 2 * tiles > KSPLIT_TARGET_GROUPS {
        return None;
    }
    (2..=16usize)
        .rev()
        .find(|&s| {
            let kc = k / s;
            s * tiles <= KSPLIT_TARGET_GROUPS
                && k.is_multiple_of(s)
                && kc >= KSPLIT_MIN_KC
                && layouts.fit(m, n, kc)
        })
        .map(|s| s as u32)
}

/// Every scalar tile, for `_tfwgpu_tile`.
pub const SCALAR_TILES: &[Tile] = &[TILE_64X64X8, TILE_8X8X8];

const _: () = {
    let mut i = 0;
    while i < VEC4_TILES.len() {
        assert!(VEC4_TILES[i].is_valid());
        i += 1;
    }
};

/// The shader and tile of one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plan {
    Scalar(Tile),
    Vec4(Vec4Tile, Layouts),
    /// The CPU-adapter variant: vector loads in these layouts, or scalar (`None`).
    Cpu(CpuTile, Option<Layouts>),
    /// The subgroup form of the CPU variant, for subgroups of this many invocations.
    Sg(SgTile, u32, SgModes),
    /// The split-K shader: one row of C per workgroup, K shared by its invocations.
    SplitK(SplitK),
    /// The vector tile over K split into this many equal parts (each part's product an
    /// outermost batch of a temporary), then the parts added (`matmul_ksum.wgsl`).
    KSplit(Vec4Tile, Layouts, u32),
}

impl Plan {
    fn bm(&self) -> u32 {
        match self {
            Plan::Scalar(t) => t.bm,
            Plan::Vec4(t, _) => t.bm,
            Plan::Cpu(t, _) => t.bm(),
            Plan::Sg(t, _, _) => t.bm(),
            Plan::SplitK(_) => 1,
            Plan::KSplit(t, _, _) => t.bm,
        }
    }

    fn bn(&self) -> u32 {
        match self {
            Plan::Scalar(t) => t.bn,
            Plan::Vec4(t, _) => t.bn,
            Plan::Cpu(t, _) => t.bn(),
            Plan::Sg(t, lanes, _) => t.bn(*lanes),
            Plan::SplitK(t) => t.nc,
            Plan::KSplit(t, _, _) => t.bn,
        }
    }
}

/// The scalar tile for an M x N output.
fn choose_tile(m: usize, n: usize) -> Tile {
    if m <= 8 && n <= 8 {
        TILE_8X8X8
    } else {
        TILE_64X64X8
    }
}

/// The plan for `batches` products of M x N x K in `layouts`, on a device with `shared` bytes
/// of workgroup memory.
///
/// Measured on an H200 (bench/NOTES-matmul.md, v2-v7): the 128x256 tile wins once it gives
/// about one workgroup per multiprocessor (2048^2 and up), then 128x128; below
/// that, 64x64 tiles with 4x4 per invocation keep the GPU full (1024^2: 64 tiles of 128x128
/// would leave half of 132 multiprocessors idle). Since v7 each is the two-buffer form with
/// the next K tile staged during the products (one barrier per K tile). Shapes under 64 keep
/// the scalar kernel. Other adapters get the same choice, bounded by their workgroup memory
/// (the one-buffer and unpadded tiles are the fallbacks); none has been measured yet.
pub fn choose(batches: usize, m: usize, n: usize, k: usize, layouts: Layouts, shared: u32) -> Plan {
    let tiles = |bm: usize, bn: usize| batches * m.div_ceil(bm) * n.div_ceil(bn);
    // Outputs computed per output wanted (partial tiles).
    let padded =
        |bm: usize, bn: usize| (m.div_ceil(bm) * bm * n.div_ceil(bn) * bn) as f64 / (m * n) as f64;
    let mut preferred: Vec<Vec4Tile> = vec![];
    if m >= 64 && n >= 64 && layouts.fit(m, n, k) {
        // The 128x256 tile in either orientation of the output (its 16x8 transpose measured
        // 23% slower, v7), unless its partial tiles waste >10% more than 128x128's.
        if tiles(128, 256) >= 120 && padded(128, 256) <= 1.1 * padded(128, 128) {
            preferred.push(V4_128X256X8_8X16H);
        }
        if tiles(128, 128) >= 192 {
            preferred.extend([V4_128X128X8_8X16W, V4_128X128X8_8X8S1]);
        }
        preferred.extend([V4_64X64X16_4X4W, V4_64X64X16_4X4WP0, V4_64X64X16_4X4S1]);
    }
    // The first that fits the device's workgroup memory.
    preferred
        .into_iter()
        .find(|t| t.shared_bytes() <= shared)
        .map(|t| Plan::Vec4(t, layouts))
        .unwrap_or(Plan::Scalar(choose_tile(m, n)))
}

/// The CPU variant with `tile`: vector loads where the layouts fit the shape, else scalar.
fn cpu_plan(tile: CpuTile, m: usize, n: usize, k: usize, layouts: Layouts) -> Plan {
    Plan::Cpu(tile, layouts.fit(m, n, k).then_some(layouts))
}

/// The plan on a CPU adapter (see `cpu.rs`; measurements in bench/RESULTS.md), with
/// subgroups of `lanes` invocations where the device has subgroups of one fixed size.
pub fn choose_cpu(
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    layouts: Layouts,
    lanes: Option<u32>,
) -> Plan {
    let _ = batches;
    // 64 columns per workgroup, or 32 for narrow products.
    let name = if n <= 32 { "sg64x4" } else { "sg32x8" };
    if let Some(s) = lanes
        && let Some(t) = SG_TILES.iter().find(|t| t.name == name && t.is_valid(s))
    {
        return Plan::Sg(*t, s, SgModes::of(layouts, n, k));
    }
    cpu_plan(CPU_TILES[2], m, n, k, layouts)
}

/// The fixed subgroup size of a device, where subgroups can be used.
fn fixed_lanes(ctx: &KernelContext) -> Option<u32> {
    let d = &ctx.dev.desc;
    (ctx.features().contains(wgpu::Features::SUBGROUP)
        && d.subgroup_min_size == d.subgroup_max_size
        && (1..=64).contains(&d.subgroup_min_size))
    .then_some(d.subgroup_min_size)
}

/// The plan `name` forces, if it applies.
#[allow(clippy::too_many_arguments)]
fn forced(
    op: &str,
    name: &str,
    m: usize,
    n: usize,
    k: usize,
    layouts: Layouts,
    shared: u32,
    lanes: Option<u32>,
) -> Result<Plan> {
    if let Some(t) = SG_TILES.iter().find(|t| t.name == name) {
        return match lanes {
            Some(s) if t.is_valid(s) => Ok(Plan::Sg(*t, s, SgModes::of(layouts, n, k))),
            _ => Err(Error::Unimplemented(format!(
                "{op}: _tfwgpu_tile {name:?} needs subgroups of a fixed size dividing {}",
                t.tm
            ))),
        };
    }
    if let Some(t) = SCALAR_TILES.iter().find(|t| t.name == name) {
        return Ok(Plan::Scalar(*t));
    }
    if name == SPLITK_128X8.name {
        return Ok(Plan::SplitK(SPLITK_128X8));
    }
    if let Some(t) = CPU_TILES.iter().find(|t| t.name == name) {
        return Ok(cpu_plan(*t, m, n, k, layouts));
    }
    // "NAME_scalar": a CPU tile with scalar loads whatever the layout (for tests).
    if let Some(t) = name
        .strip_suffix("_scalar")
        .and_then(|base| CPU_TILES.iter().find(|t| t.name == base))
    {
        return Ok(Plan::Cpu(*t, None));
    }
    // "ksS_TILE": the vector tile TILE over K split into S parts.
    if let Some((s, base)) = name.strip_prefix("ks").and_then(|r| r.split_once('_'))
        && let Ok(s) = s.parse::<u32>()
    {
        let Plan::Vec4(t, l) = forced(op, base, m, n, k, layouts, shared, lanes)? else {
            bail_invalid!("{op}: _tfwgpu_tile {name:?}: K splits apply to the vector tiles only");
        };
        let parts = s as usize;
        if parts < 2 || !k.is_multiple_of(parts) || !l.fit(m, n, k / parts) {
            bail_invalid!(
                "{op}: _tfwgpu_tile {name:?} needs K ({k}) split into {s} >= 2 equal parts \
                 that keep the vector layout"
            );
        }
        return Ok(Plan::KSplit(t, l, s));
    }
    let Some(t) = VEC4_TILES.iter().find(|t| t.name == name) else {
        bail_invalid!("{op}: _tfwgpu_tile {name:?} names no matmul tile");
    };
    if !layouts.fit(m, n, k) {
        bail_invalid!(
            "{op}: _tfwgpu_tile {name:?} needs contiguous dimensions that are multiples of 4 \
             (M {m}, N {n}, K {k}, {layouts:?})"
        );
    }
    if t.shared_bytes() > shared {
        bail_invalid!(
            "{op}: _tfwgpu_tile {name:?} needs {} bytes of workgroup memory, the device has {shared}",
            t.shared_bytes()
        );
    }
    Ok(Plan::Vec4(*t, layouts))
}

/// Batch dimensions the shader's params hold (after merging).
pub(super) const MAX_BATCH_DIMS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    MatMul,
    BatchMatMul,
    BatchMatMulV2,
    BatchMatMulV3,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::MatMul => "MatMul",
            Variant::BatchMatMul => "BatchMatMul",
            Variant::BatchMatMulV2 => "BatchMatMulV2",
            Variant::BatchMatMulV3 => "BatchMatMulV3",
        }
    }
}

struct MatMul {
    variant: Variant,
    /// A tile forced by the `_tfwgpu_tile` attribute.
    tile: Option<String>,
    /// Transpose (adjoint, for real types) the first operand.
    ta: bool,
    /// Transpose the second operand.
    tb: bool,
}

impl MatMul {
    fn build(variant: Variant, attrs: &Attrs) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(MatMul::new(variant, attrs)?))
    }

    fn new(variant: Variant, attrs: &Attrs) -> Result<MatMul> {
        let op = variant.name();
        let (ta, tb) = match variant {
            Variant::MatMul => (
                attrs.bool_or("transpose_a", false)?,
                attrs.bool_or("transpose_b", false)?,
            ),
            _ => (
                attrs.bool_or("adj_x", false)?,
                attrs.bool_or("adj_y", false)?,
            ),
        };
        let types: &[&str] = match variant {
            Variant::BatchMatMulV3 => &["Ta", "Tb", "Tout"],
            _ => &["T"],
        };
        let mut first = None;
        for name in types {
            if let Some(t) = attrs.dtype_opt(name)? {
                if !DTYPES.contains(&t) {
                    return Err(Error::Unimplemented(format!(
                        "{op} has no tfwgpu kernel for {name}={t}"
                    )));
                }
                match first {
                    None => first = Some(t),
                    Some(f) if f != t => {
                        return Err(Error::Unimplemented(format!(
                            "{op}: only Ta == Tb == Tout is supported, got {name}={t} \
                             next to {f}"
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        let tile = match attrs.get("_tfwgpu_tile") {
            None => None,
            Some(AttrValue::Str(s)) => Some(s.clone()),
            Some(v) => bail_invalid!("{op}: _tfwgpu_tile must be a string, got {v:?}"),
        };
        Ok(MatMul {
            variant,
            tile,
            ta,
            tb,
        })
    }
}

/// A shape as TensorFlow prints it: `[2,3]`.
fn fmt_shape(s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(","))
}

/// The validated geometry of one product.
#[derive(Debug, PartialEq, Eq)]
struct Geometry {
    m: usize,
    n: usize,
    k: usize,
    /// Output batch dimensions.
    batch: Vec<usize>,
    /// Batch dimensions of the operands, left-padded with 1 to `batch`'s rank.
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    dtype: DType,
}

impl Geometry {
    fn output_shape(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.m, self.n]);
        s
    }
}

impl MatMul {
    fn geometry(&self, inputs: &[Operand]) -> Result<Geometry> {
        let op = self.variant.name();
        if inputs.len() != 2 {
            bail_invalid!("{op} takes 2 inputs, got {}", inputs.len());
        }
        let (da, db) = (inputs[0].dtype(), inputs[1].dtype());
        if da != db {
            bail_invalid!("{op}: In[0] is {da} but In[1] is {db}; they must match");
        }
        if !DTYPES.contains(&da) {
            return Err(Error::Unimplemented(format!(
                "{op} has no tfwgpu kernel for {da}"
            )));
        }
        let (sa, sb) = (inputs[0].shape(), inputs[1].shape());
        // The shapes as text, only for an error (not formatted on every call).
        let (fa, fb) = (|| fmt_shape(sa), || fmt_shape(sb));
        match self.variant {
            Variant::MatMul => {
                for (i, s) in [sa, sb].into_iter().enumerate() {
                    if s.len() != 2 {
                        bail_invalid!(
                            "{op}: In[{i}] is not a matrix. Instead it has shape {}",
                            fmt_shape(s)
                        );
                    }
                }
            }
            _ => {
                for (i, s) in [sa, sb].into_iter().enumerate() {
                    if s.len() < 2 {
                        bail_invalid!(
                            "{op}: In[{i}] ndims must be >= 2, got shape {}",
                            fmt_shape(s)
                        );
                    }
                }
            }
        }
        let (ra, rb) = (sa.len(), sb.len());
        let (m, ka) = if self.ta {
            (sa[ra - 1], sa[ra - 2])
        } else {
            (sa[ra - 2], sa[ra - 1])
        };
        let (kb, n) = if self.tb {
            (sb[rb - 1], sb[rb - 2])
        } else {
            (sb[rb - 2], sb[rb - 1])
        };
        let (bat_a, bat_b) = (&sa[..ra - 2], &sb[..rb - 2]);
        let rank = bat_a.len().max(bat_b.len());
        let pad = |s: &[usize]| -> Vec<usize> {
            let mut v = vec![1; rank - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (a_batch, b_batch) = (pad(bat_a), pad(bat_b));
        let batch = if self.variant == Variant::BatchMatMul {
            if ra != rb || bat_a != bat_b {
                bail_invalid!(
                    "{op}: In[0] and In[1] must have the same batch dimensions: {} vs. {}",
                    fa(),
                    fb()
                );
            }
            bat_a.to_vec()
        } else {
            let mut out = Vec::with_capacity(rank);
            for (&x, &y) in a_batch.iter().zip(&b_batch) {
                if x != y && x != 1 && y != 1 {
                    bail_invalid!(
                        "{op}: In[0] and In[1] must have compatible batch dimensions: \
                         {} vs. {}",
                        fa(),
                        fb()
                    );
                }
                out.push(if x == 1 { y } else { x });
            }
            out
        };
        if ka != kb {
            bail_invalid!(
                "{op}: Matrix size-incompatible: In[0]: {}, In[1]: {}{}",
                fa(),
                fb(),
                match (self.ta, self.tb) {
                    (false, false) => String::new(),
                    (ta, tb) => format!(" (transposed: In[0] {ta}, In[1] {tb})"),
                }
            );
        }
        Ok(Geometry {
            m,
            n,
            k: ka,
            batch,
            a_batch,
            b_batch,
            dtype: da,
        })
    }
}

/// Batch dimensions for the shader, innermost first: (size, A stride, B stride), with size-1
/// dimensions dropped and contiguous runs merged.
fn batch_dims(g: &Geometry) -> Vec<(usize, usize, usize)> {
    let rank = g.batch.len();
    let (a_mat, b_mat) = (g.m * g.k, g.k * g.n);
    let mut dims = vec![];
    let (mut sa, mut sb) = (a_mat, b_mat);
    for d in (0..rank).rev() {
        let size = g.batch[d];
        if size != 1 {
            let a = if g.a_batch[d] == 1 { 0 } else { sa };
            let b = if g.b_batch[d] == 1 { 0 } else { sb };
            match dims.last_mut() {
                // The previous (inner) dimension continues into this one for both operands.
                Some((isize, ia, ib)) if *ia * *isize == a && *ib * *isize == b => {
                    *isize *= size;
                }
                _ => dims.push((size, a, b)),
            }
        }
        sa *= g.a_batch[d];
        sb *= g.b_batch[d];
    }
    dims
}

fn to_u32(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Unimplemented(format!(
            "{op}: tensors of more than 2^32 elements are not supported"
        ))
    })
}

impl Kernel for MatMul {
    fn op(&self) -> &'static str {
        self.variant.name()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        let g = self.geometry(inputs)?;
        Ok(vec![TensorDesc::new(g.dtype, &g.output_shape())])
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.variant.name();
        let g = self.geometry(inputs)?;
        let out = &outputs[0];
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let c = ctx.bind(out)?;
        if g.k == 0 {
            return ctx.clear(&c, out.desc.byte_size());
        }
        let a_ref = inputs[0].device(op, 0)?;
        let b_ref = inputs[1].device(op, 1)?;
        for r in [a_ref, b_ref, out] {
            to_u32(op, r.desc.num_elements())?;
        }
        let dims = batch_dims(&g);
        if dims.len() > MAX_BATCH_DIMS {
            return Err(Error::Unimplemented(format!(
                "{op}: batch broadcasting of {} and {} needs more than {MAX_BATCH_DIMS} \
                 batch dimensions",
                fmt_shape(a_ref.desc.shape.as_slice()),
                fmt_shape(b_ref.desc.shape.as_slice())
            )));
        }
        let batches: usize = g.batch.iter().product();
        let dtype = g.dtype;
        let layouts = Layouts {
            a_kfast: !self.ta,
            b_nfast: !self.tb,
        };
        let shared = ctx.limits().max_compute_workgroup_storage_size;
        let a = ctx.bind(a_ref)?;
        let b = ctx.bind(b_ref)?;
        let gm = Gemm {
            m: g.m,
            n: g.n,
            k: g.k,
            ta: self.ta,
            tb: self.tb,
            dims,
            batches,
        };
        let plan = match &self.tile {
            // "gpu": the GPU adapters' automatic choice (for comparisons on CPU adapters).
            Some(name) if name == "gpu" => choose_gpu(batches, g.m, g.n, g.k, layouts, shared),
            Some(name) => forced(op, name, g.m, g.n, g.k, layouts, shared, fixed_lanes(ctx))?,
            None => {
                // The heuristic choice; the tuner (when on: GPU adapters by default) may
                // replace it with a faster valid variant.
                let heuristic = if ctx.dev.desc.device_type == "cpu" {
                    choose_cpu(batches, g.m, g.n, g.k, layouts, fixed_lanes(ctx))
                } else {
                    choose_gpu(batches, g.m, g.n, g.k, layouts, shared)
                };
                let cands = candidates(heuristic, batches, g.m, g.n, g.k, layouts, shared);
                tuned(ctx, op, dtype, &gm, &cands, (&a, &b, &c))?
            }
        };
        tracing::debug!(
            "{op} {}x{}x{} x{batches}: {plan:?} ({} adapter)",
            g.m,
            g.n,
            g.k,
            ctx.dev.desc.device_type
        );
        record_plan(ctx, op, plan, dtype, &gm, &a, &b, &c)
    }
}

/// One (batched) product as the shaders see it: C[b] (M x N, row-major, batch b at b * M * N)
/// = A[b] x B[b], A stored M x K (or K x M if `ta`), B K x N (or N x K if `tb`), batch offsets
/// of A and B from `dims` ((size, A stride, B stride), innermost first; see `batch_dims`).
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
    pub dims: Vec<(usize, usize, usize)>,
    pub batches: usize,
}

impl Gemm {
    fn layouts(&self) -> Layouts {
        Layouts {
            a_kfast: !self.ta,
            b_nfast: !self.tb,
        }
    }
}

/// A plan as one word for memo keys (`Tuner::choose_memo`): its hash.
fn plan_key(plan: &Plan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::kernel_manager::FastHasher::default();
    plan.hash(&mut h);
    h.finish()
}

/// The name of a plan's pipeline (its specialization).
fn plan_name(plan: &Plan) -> String {
    match plan {
        Plan::Scalar(t) => t.name.to_string(),
        Plan::Vec4(t, l) => t.specialization(*l),
        Plan::Cpu(t, l) => t.specialization(*l),
        Plan::Sg(t, lanes, modes) => t.specialization(*lanes, *modes),
        Plan::SplitK(t) => t.name.to_string(),
        Plan::KSplit(t, l, s) => format!("ks{s}_{}", t.specialization(*l)),
    }
}

/// The plans the tuner may choose among for a product: the heuristic choice first, then the
/// other vector tiles kept after the H200 measurements (bench/NOTES-matmul.md) that fit the
/// layout and the workgroup memory. Shapes the vector shader cannot serve keep the heuristic
/// (scalar) plan alone.
pub(crate) fn candidates(
    heuristic: Plan,
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    layouts: Layouts,
    shared: u32,
) -> Vec<Plan> {
    let _ = batches;
    let mut out = vec![heuristic];
    if !(layouts.fit(m, n, k) && m >= 16 && n >= 16) {
        return out;
    }
    for t in [
        V4_128X256X8_8X16H,
        V4_128X256X16_8X16QP0,
        V4_256X128X16_16X8S1,
        V4_128X128X8_8X16W,
        V4_64X64X16_4X4W,
        V4_64X64X32_4X4S1,
    ] {
        // Tiles far larger than the output waste most of their work.
        let waste = t.bm as usize > 2 * m.max(32) || t.bn as usize > 2 * n.max(32);
        let plan = Plan::Vec4(t, layouts);
        if t.shared_bytes() <= shared && !waste && !out.contains(&plan) {
            out.push(plan);
        }
    }
    out
}

/// The tuner's choice among `cands` for this product (the first candidate, the heuristic, when
/// tuning is off). Timing runs write the real output `c`, which the chosen plan then writes
/// again.
pub(crate) fn tuned(
    ctx: &KernelContext,
    op: &str,
    dtype: DType,
    gm: &Gemm,
    cands: &[Plan],
    (a, b, c): (&BufferRange, &BufferRange, &BufferRange),
) -> Result<Plan> {
    let tuner = ctx.tuner();
    if !tuner.enabled() || cands.len() < 2 {
        return Ok(cands[0]);
    }
    let key = || {
        format!(
            "matmul/{dtype}/{}/m{}/n{}/k{}/b{}",
            gm.layouts().suffix(),
            bucket(gm.m),
            bucket(gm.n),
            bucket(gm.k),
            bucket(gm.batches)
        )
    };
    let names = || cands.iter().map(plan_name).collect();
    // The candidates follow from the shape, the layouts and the heuristic plan (the first):
    // the memo holds the shape and the layouts, and the candidates' number and first plan's
    // index among those of its kind, so that two call sites with different heuristics for
    // one shape do not share an answer.
    let memo = [
        u64::from_le_bytes(*b"matmul\0\0"),
        dtype as u64,
        gm.m as u64,
        gm.n as u64,
        gm.k as u64,
        gm.batches as u64,
        gm.ta as u64,
        gm.tb as u64,
        cands.len() as u64,
        plan_key(&cands[0]),
    ];
    let i = tuner.choose_memo(ctx, &memo, key, names, 0, &|i| {
        record_plan(ctx, op, cands[i], dtype, gm, a, b, c)
    });
    Ok(cands[i])
}

/// Records the dispatches of `plan` for the product `gm`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_plan(
    ctx: &KernelContext,
    op: &str,
    plan: Plan,
    dtype: DType,
    gm: &Gemm,
    a: &BufferRange,
    b: &BufferRange,
    c: &BufferRange,
) -> Result<()> {
    record_plan_hooked(ctx, op, plan, dtype, gm, (a, b, c), None)
}

/// An implicit GEMM's hooks for the vector shader: (specialization name, hooks, the
/// HOOK_PARAM_VECS * 4 words of their parameters).
pub(crate) type HookArgs<'a> = (&'a str, &'a vec4::Hooks, &'a [u32]);

/// `record_plan`, with the operands' addressing optionally replaced by hooks (vector plans
/// only). The hooks' loads are range-checked by the hooks themselves (see their module).
pub(crate) fn record_plan_hooked(
    ctx: &KernelContext,
    op: &str,
    plan: Plan,
    dtype: DType,
    gm: &Gemm,
    (a, b, c): (&BufferRange, &BufferRange, &BufferRange),
    hooks: Option<HookArgs>,
) -> Result<()> {
    let (m, n, k) = (gm.m, gm.n, gm.k);
    if hooks.is_some() && !matches!(plan, Plan::Vec4(..)) {
        bail_invalid!("{op}: addressing hooks need a vector plan, got {plan:?}");
    }
    // A K split runs the vector tile's own pipeline over the parts.
    let (shader_plan, splits) = match plan {
        Plan::KSplit(t, l, s) => (Plan::Vec4(t, l), s as usize),
        p => (p, 1),
    };
    let spec = match hooks {
        Some((name, _, _)) => format!("{name}_{}", plan_name(&shader_plan)),
        None => plan_name(&shader_plan),
    };
    // Bounds checks are off (they cost ~1.6x on lavapipe, clamping every shared-memory read
    // of the inner loop). The indexing is in range by construction: shared and private
    // arrays are indexed by loop counters below their constant sizes (the tile loads cover
    // BM*BK and BN*BK exactly, `Tile::is_valid`, `Vec4Tile::is_valid`; the two-buffer
    // offsets are 0 or BK rows of STAGES * BK); global reads happen
    // only for gm < M, gn < N, gk < K at batch offsets of batch indices below the grid's
    // batch count, so they stay inside A (M*K per batch) and B (K*N); stores only for
    // gm < M, gn < N. All of these fit u32 (`to_u32` on every tensor's element count
    // by the callers). The vector shader reads and writes 16-byte vectors at element offsets
    // that are multiples of 4 (`Layouts::fit`), each wholly inside its row, so a vector is in
    // range exactly when its first element is.
    // The split-K shader reads A and B only for rows below M, k below K and columns below N
    // (the grid starts no column block at or past N), indexes its shared partial sums by
    // j < NC and l (+ s) < WG (`SplitK::is_valid`), and stores only those columns of rows
    // below M.
    let pipeline = ctx.pipeline(PipelineKey::new("matmul", Some(dtype), spec), || {
        let mut src = ShaderSource::new(match shader_plan {
            Plan::Scalar(tile) => tile.wgsl(dtype),
            Plan::Sg(tile, lanes, modes) => tile.wgsl(dtype, lanes, modes),
            Plan::Cpu(tile, layouts) => tile.wgsl(dtype, layouts),
            Plan::Vec4(tile, layouts) => tile.wgsl_hooked(dtype, layouts, hooks.map(|h| h.1)),
            Plan::SplitK(t) => t.wgsl(dtype),
            Plan::KSplit(..) => unreachable!("a K split runs its vector tile's shader"),
        });
        src.checks = Checks::Trusted;
        src
    })?;
    // Strides of A (M x K) and B (K x N) as stored.
    let (sa_m, sa_k) = if gm.ta { (1, m) } else { (k, 1) };
    let (sb_k, sb_n) = if gm.tb { (1, k) } else { (n, 1) };
    // With a K split, part j is batch j of the outermost batch dimension: A and B start j * KC
    // terms further along K, the part's product goes to slice j of a temporary, and the
    // kernel walks KC = K / S terms (its row strides stay those of the whole K).
    let mut dims = gm.dims.clone();
    let mut batches = gm.batches;
    let (k, parts) = if splits > 1 {
        let kc = k / splits;
        if !k.is_multiple_of(splits) || dims.len() >= MAX_BATCH_DIMS {
            bail_invalid!("{op}: K ({k}) cannot be split into {splits} parts here");
        }
        dims.push((splits, kc * sa_k, kc * sb_k));
        batches *= splits;
        let bytes = (batches * m * n * dtype.size()) as u64;
        (kc, Some(ctx.scratch("matmul_ksplit", bytes)?))
    } else {
        (k, None)
    };
    // On CPU adapters (llvmpipe leaves a shader's loops after 65,535 iterations) the CPU
    // tiles, which walk K / 4 steps per invocation, take K in chunks of 4 * LOOP_BUDGET terms:
    // chunk j reads A and B from its first term on (an offset of a multiple of 64 elements:
    // bindable), keeps the whole K's strides, and writes slice j of a temporary that one more
    // pass adds up in chunk order.
    let kc = 4 * crate::kernels::wgsl::LOOP_BUDGET;
    let chunked = splits == 1
        && k > kc
        && ctx.loop_limited()
        && matches!(shader_plan, Plan::Cpu(..) | Plan::Sg(..));
    if chunked {
        let chunks = k.div_ceil(kc);
        let len = gm.batches * m * n;
        let esize = dtype.size() as u64;
        // Slices at bindable offsets.
        let align = ctx.limits().min_storage_buffer_offset_alignment as usize / esize as usize;
        let stride = len.next_multiple_of(align.max(1));
        let t = ctx.scratch("matmul_kchunks", chunks as u64 * stride as u64 * esize)?;
        let at = |r: &BufferRange, elems: usize| BufferRange {
            buffer: r.buffer.clone(),
            offset: r.offset + elems as u64 * esize,
            size: r.size - elems as u64 * esize,
        };
        for j in 0..chunks {
            let k0 = j * kc;
            let slice = at(&t, j * stride);
            let (a_off, b_off) = (k0 * sa_k, k0 * sb_k);
            record_dispatches(
                ctx,
                op,
                &pipeline,
                (plan, gm, dims.as_slice(), batches, hooks),
                (kc.min(k - k0), [sa_m, sa_k, sb_k, sb_n]),
                (&at(a, a_off), &at(b, b_off), &slice),
            )?;
        }
        return record_ksum_scalar(ctx, op, dtype, &t, c, (len, stride), chunks);
    }
    let out = parts.as_ref().unwrap_or(c);
    record_dispatches(
        ctx,
        op,
        &pipeline,
        (plan, gm, dims.as_slice(), batches, hooks),
        (k, [sa_m, sa_k, sb_k, sb_n]),
        (a, b, out),
    )?;
    if let Some(t) = &parts {
        record_ksum(ctx, op, dtype, t, c, gm.batches * m * n, splits)?;
    }
    Ok(())
}

/// One product's dispatches (grids of at most MAX_GROUPS_X per axis) walking `k` terms with
/// the strides `st` (A's along M and K, B's along K and N).
#[allow(clippy::type_complexity)]
fn record_dispatches(
    ctx: &KernelContext,
    op: &str,
    pipeline: &crate::exec::Pipeline,
    (plan, gm, dims, batches, hooks): (
        Plan,
        &Gemm,
        &[(usize, usize, usize)],
        usize,
        Option<HookArgs>,
    ),
    (k, [sa_m, sa_k, sb_k, sb_n]): (usize, [usize; 4]),
    (a, b, out): (&BufferRange, &BufferRange, &BufferRange),
) -> Result<()> {
    let (m, n) = (gm.m, gm.n);
    let mut bdims = [0u32; MAX_BATCH_DIMS];
    let mut astr = [0u32; MAX_BATCH_DIMS];
    let mut bstr = [0u32; MAX_BATCH_DIMS];
    for (i, &(size, sa, sb)) in dims.iter().enumerate() {
        bdims[i] = to_u32(op, size)?;
        astr[i] = to_u32(op, sa)?;
        bstr[i] = to_u32(op, sb)?;
    }
    let tiles_x = n.div_ceil(plan.bn() as usize);
    let tiles_y = m.div_ceil(plan.bm() as usize);
    let max = MAX_GROUPS_X as usize;
    for z0 in (0..batches).step_by(max) {
        let gz = (batches - z0).min(max);
        for y0 in (0..tiles_y).step_by(max) {
            let gy = (tiles_y - y0).min(max);
            for x0 in (0..tiles_x).step_by(max) {
                let gx = (tiles_x - x0).min(max);
                let mut words = vec![
                    to_u32(op, m)?,
                    to_u32(op, n)?,
                    to_u32(op, k)?,
                    z0 as u32,
                    to_u32(op, sa_m)?,
                    to_u32(op, sa_k)?,
                    to_u32(op, sb_k)?,
                    to_u32(op, sb_n)?,
                    (!gm.ta) as u32,
                    (!gm.tb) as u32,
                    dims.len() as u32,
                    x0 as u32,
                    y0 as u32,
                    0,
                    0,
                    0,
                ];
                words.extend_from_slice(&bdims);
                words.extend_from_slice(&astr);
                words.extend_from_slice(&bstr);
                if let Some((_, _, hp)) = hooks {
                    let mut extra = [0u32; vec4::HOOK_PARAM_VECS * 4];
                    extra[..hp.len()].copy_from_slice(hp);
                    words.extend_from_slice(&extra);
                }
                ctx.dispatch(
                    pipeline,
                    &params(&words),
                    &[a.clone(), b.clone(), out.clone()],
                    [gx as u32, gy as u32, gz as u32],
                )?;
            }
        }
    }
    Ok(())
}

/// Adds the `splits` slices of `len` elements in `t` into `c` (`matmul_ksum.wgsl`; `len` is a
/// multiple of 4: the vector layout holds for N).
fn record_ksum(
    ctx: &KernelContext,
    op: &str,
    dtype: DType,
    t: &BufferRange,
    c: &BufferRange,
    len: usize,
    splits: usize,
) -> Result<()> {
    let elem = match dtype {
        DType::F32 => "f32",
        DType::I32 => "i32",
        other => bail_invalid!("{op}: no K split for {other}"),
    };
    // Indexes stay below len4 (checked in the shader) and splits * len4 (the temporary's
    // vectors, all written by the product's dispatches).
    let pipeline = ctx.pipeline(PipelineKey::new("matmul", Some(dtype), "ksum"), || {
        let mut src = ShaderSource::new(MATMUL_KSUM_WGSL.replace("ELEM", elem));
        src.checks = Checks::Trusted;
        src
    })?;
    let len4 = len / 4;
    let groups = len4.div_ceil(256);
    let row = groups.min(MAX_GROUPS_X as usize);
    let words = [to_u32(op, len4)?, to_u32(op, splits)?, row as u32, 0];
    ctx.dispatch(
        &pipeline,
        &params(&words),
        &[t.clone(), c.clone()],
        [row as u32, groups.div_ceil(row) as u32, 1],
    )
}

/// Adds the `chunks` slices of `len` elements (`stride` apart) in `t` into `c` in slice order,
/// one element per invocation (the K chunks of CPU adapters: any `len`).
fn record_ksum_scalar(
    ctx: &KernelContext,
    op: &str,
    dtype: DType,
    t: &BufferRange,
    c: &BufferRange,
    (len, stride): (usize, usize),
    chunks: usize,
) -> Result<()> {
    let elem = match dtype {
        DType::F32 => "f32",
        DType::I32 => "i32",
        other => bail_invalid!("{op}: no K chunks for {other}"),
    };
    let pipeline = ctx.pipeline(PipelineKey::new("matmul", Some(dtype), "kchunks"), || {
        ShaderSource::new(KCHUNKS_WGSL.replace("ELEM", elem))
    })?;
    let groups = len.div_ceil(256);
    let row = groups.clamp(1, MAX_GROUPS_X as usize);
    let words = [
        to_u32(op, len)?,
        to_u32(op, chunks)?,
        row as u32,
        to_u32(op, stride)?,
    ];
    ctx.dispatch(
        &pipeline,
        &params(&words),
        &[t.clone(), c.clone()],
        [row as u32, groups.div_ceil(row) as u32, 1],
    )
}

/// The sum of a product's K chunks (`record_ksum_scalar`).
const KCHUNKS_WGSL: &str = "struct Params {
    len: u32,
    chunks: u32,
    row_groups: u32,
    stride: u32,
};
@group(0) @binding(0) var<uniform> q: Params;
@group(0) @binding(1) var<storage, read_write> t: array<ELEM>;
@group(0) @binding(2) var<storage, read_write> c: array<ELEM>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let i = (wid.y * q.row_groups + wid.x) * 256u + l;
    if i >= q.len {
        return;
    }
    var s = t[i];
    for (var j = 1u; j < q.chunks; j += 1u) {
        s += t[j * q.stride + i];
    }
    c[i] = s;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(a_batch: &[usize], b_batch: &[usize], batch: &[usize]) -> Geometry {
        Geometry {
            m: 2,
            n: 3,
            k: 5,
            batch: batch.to_vec(),
            a_batch: a_batch.to_vec(),
            b_batch: b_batch.to_vec(),
            dtype: DType::F32,
        }
    }

    #[test]
    fn batch_dims_merge_and_broadcast() {
        // Same batch dims: one contiguous dimension.
        assert_eq!(
            batch_dims(&geom(&[2, 3], &[2, 3], &[2, 3])),
            vec![(6, 10, 15)]
        );
        // [2,1] x [1,3] (after padding): A broadcast on the inner, B on the outer.
        assert_eq!(
            batch_dims(&geom(&[2, 1], &[1, 3], &[2, 3])),
            vec![(3, 0, 15), (2, 10, 0)]
        );
        // Size-1 dimensions vanish; broadcast runs merge.
        assert_eq!(
            batch_dims(&geom(&[1, 1, 1], &[4, 1, 5], &[4, 1, 5])),
            vec![(20, 0, 15)]
        );
        assert_eq!(batch_dims(&geom(&[], &[], &[])), vec![]);
    }

    #[test]
    fn choice_by_shape_layout_and_memory() {
        let nn = Layouts {
            a_kfast: true,
            b_nfast: true,
        };
        let name = |p: Plan| match p {
            Plan::Scalar(t) => t.name,
            Plan::Vec4(t, _) => t.name,
            Plan::Cpu(t, _) => t.name,
            Plan::Sg(t, _, _) => t.name,
            Plan::SplitK(t) => t.name,
            Plan::KSplit(t, _, _) => t.name,
        };
        let big = 48 * 1024;
        // CPU adapters: the subgroup tiles with subgroups of a fixed size, else the plain one.
        assert_eq!(name(choose_cpu(1, 512, 512, 512, nn, Some(8))), "sg32x8");
        assert_eq!(name(choose_cpu(1, 5000, 32, 9, nn, Some(8))), "sg64x4");
        assert_eq!(name(choose_cpu(1, 512, 512, 512, nn, None)), "cpu8x8_8x1");
        assert_eq!(
            choose_cpu(1, 7, 5, 3, nn, None),
            Plan::Cpu(CPU_TILES[2], None),
            "scalar loads where the layout does not fit"
        );
        assert_eq!(
            name(choose(1, 4096, 4096, 4096, nn, big)),
            "128x256x8_8x16h"
        );
        // Tall outputs too (the 16x8 transpose is slower).
        assert_eq!(
            name(choose(1, 4096, 1024, 4096, nn, big)),
            "128x256x8_8x16h"
        );
        // 4.5 column tiles of 256: 11% padding against none with 128x128.
        assert_eq!(
            name(choose(1, 4096, 1152, 4096, nn, big)),
            "128x128x8_8x16w"
        );
        assert_eq!(
            name(choose(1, 4096, 1408, 4096, nn, big)),
            "128x256x8_8x16h"
        );
        assert_eq!(name(choose(1, 2048, 2048, 64, nn, big)), "128x256x8_8x16h");
        assert_eq!(name(choose(1, 1024, 1024, 1024, nn, big)), "64x64x16_4x4w");
        assert_eq!(name(choose(1, 1024, 1024, 16, nn, big)), "64x64x16_4x4w");
        assert_eq!(name(choose(64, 256, 256, 256, nn, big)), "128x256x8_8x16h");
        // K % 4 != 0 with A row-major: the scalar kernel.
        assert_eq!(name(choose(1, 1024, 1024, 1023, nn, big)), "64x64x8");
        assert_eq!(name(choose(1, 8, 8, 8, nn, big)), "8x8x8");
        // WebGPU's default 16 KiB of workgroup memory: the largest tiles that fit.
        assert_eq!(
            name(choose(1, 4096, 4096, 4096, nn, 16384)),
            "128x128x8_8x8s1"
        );
        assert_eq!(
            name(choose(1, 1024, 1024, 1024, nn, 16384)),
            "64x64x16_4x4wp0"
        );
        // GPU adapters: split-K for few outputs over a long K; K split across the vector
        // tile's workgroups where the product has few tiles (ResNet-50's classifier: 16 tiles
        // of 64 x 64, K 2048 in 8 parts; its input gradient: 32 tiles, K 1000 in 2 parts of
        // 500, since 4 parts of 250 break the vector loads); none once the tiles fill the GPU.
        assert_eq!(
            choose_gpu(1, 64, 10, 1152, nn, big),
            Plan::SplitK(SPLITK_128X8)
        );
        assert_eq!(
            choose_gpu(1, 64, 1000, 2048, nn, big),
            Plan::KSplit(V4_64X64X16_4X4W, nn, 8)
        );
        assert_eq!(
            choose_gpu(1, 64, 2048, 1000, nn, big),
            Plan::KSplit(V4_64X64X16_4X4W, nn, 2)
        );
        assert_eq!(
            choose_gpu(1, 1024, 1024, 1024, nn, big),
            Plan::Vec4(V4_64X64X16_4X4W, nn)
        );
        assert_eq!(
            choose_gpu(1, 64, 1000, 200, nn, big),
            Plan::Vec4(V4_64X64X16_4X4W, nn),
            "parts of at least 128 terms"
        );
        assert_eq!(
            choose_gpu(2, 64, 1000, 2048, nn, big),
            Plan::Vec4(V4_64X64X16_4X4W, nn),
            "single products only"
        );
        for t in VEC4_TILES {
            assert!(t.is_valid(), "{}", t.name);
            // Vulkan's common 48 KiB (NVIDIA); tiles above lavapipe's 32 KiB are tested
            // through a half-size twin (tests/matmul.rs).
            assert!(
                t.shared_bytes() <= 48 * 1024,
                "{} must fit 48 KiB of workgroup memory",
                t.name
            );
        }
    }

    #[test]
    fn tiles_are_valid() {
        assert!(TILE_64X64X8.is_valid());
        assert_eq!(TILE_64X64X8.threads(), 256);
        assert_eq!(TILE_8X8X8.threads(), 64);
        assert_eq!(choose_tile(8, 3), TILE_8X8X8);
        assert_eq!(choose_tile(9, 3), TILE_64X64X8);
    }
}
