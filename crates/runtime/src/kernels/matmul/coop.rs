//! Tensor-core MatMul through cooperative matrices (wgpu's `EXPERIMENTAL_COOPERATIVE_MATRIX`):
//! float16 inputs, float32 accumulation, float16 output (what TensorFlow's GPU kernels do for
//! half), and, only where `TFWGPU_ALLOW_REDUCED_PRECISION=1` is set, float32 MatMul with its
//! operands rounded to float16 while they are staged (float32 accumulation and output).
//!
//! The path is taken only where the adapter lists the 16x16x16 f16 -> f32 configuration and
//! the device has `SHADER_F16` and subgroups of one fixed size; everywhere else (lavapipe, CI)
//! the float32 kernels run, as before.
//!
//! One shader, generated per tile and layout (`CoopSpec::wgsl`): a workgroup computes a
//! BM x BN block of C with `sg_m x sg_n` subgroups, each owning (BM / sg_m) x (BN / sg_n) of
//! it as 16 x 16 accumulators (`coop_mat16x16<f32, C>`). The K loop stages BM x BK of A and
//! BK x BN of B through workgroup memory (two buffers, one barrier per K tile, the next tile's
//! global loads issued one or two tiles ahead of its products; or one buffer, two barriers
//! per K tile), keeping each operand's contiguous dimension contiguous there, so that
//! transposed operands only switch between `coopLoad` (column-major) and `coopLoadT`
//! (row-major). Global loads read 8 halves (`vec4<u32>` words, `wide` tiles), 4 elements
//! (`vec4<f16>` or `vec4<f32>`) or 1 at a time, as the contiguous dimensions allow;
//! out-of-range elements are staged as zeros, so any M, N, K works (`free` tiles: without a
//! branch in the loop body, the staging also runs past the last tile and each load reads
//! through an index `select`ed in range). Each accumulator is written back through a
//! 16 x 16 float32 scratch in workgroup memory (one per subgroup, or fewer taken in turns),
//! with bounds checks, converted to the output type. Variants and their H200 figures:
//! bench/NOTES-coop.md.

use std::sync::{Once, OnceLock};

use super::{MAX_BATCH_DIMS, MatMul, Variant, batch_dims, to_u32};
use crate::kernel::{DeviceRef, Factory, Kernel, KernelContext, MAX_GROUPS_X, Operand, TensorDesc};
use crate::kernel_manager::{Checks, PipelineKey, ShaderSource};
use crate::kernels::wgsl::params;
use crate::{AttrValue, Attrs, DType, Error, Result};

/// The environment variable that lets float32 MatMul (and Conv2D) run on float16 tensor cores.
pub const REDUCED_PRECISION_VAR: &str = "TFWGPU_ALLOW_REDUCED_PRECISION";

/// Whether `TFWGPU_ALLOW_REDUCED_PRECISION=1` was set (read once per process).
pub fn reduced_precision_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var(REDUCED_PRECISION_VAR).is_ok_and(|v| v.trim() == "1"))
}

/// Logs, once per process, that float32 products run with float16 operands.
pub(crate) fn log_reduced_precision() {
    static LOGGED: Once = Once::new();
    LOGGED.call_once(|| {
        tracing::info!(
            "{REDUCED_PRECISION_VAR}=1: float32 MatMul/Conv2D operands are rounded to float16 \
             for the tensor cores (float32 accumulation)"
        )
    });
}

/// A tile of the cooperative-matrix kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    /// The specialization name.
    pub name: &'static str,
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Depth of a staged K tile (a multiple of 16).
    pub bk: u32,
    /// Subgroups along M.
    pub sg_m: u32,
    /// Subgroups along N.
    pub sg_n: u32,
    /// The element type of the workgroup arrays (and so of the fragment pointers).
    pub smem: Smem,
    /// Launch order: groups of this many tile rows walked column by column (tiles that share
    /// operand rows and columns run together, for the L2 cache); 0: row-major.
    pub group: u32,
    /// Staging buffers: 2 (one barrier per K tile; the next tile is stored to the other
    /// buffer after the products) or 1 (two barriers per K tile, half the memory, so K
    /// tiles twice as deep fit).
    pub nbuf: u32,
    /// K tiles between a global load and its shared store: 1 (the next tile's loads are
    /// issued before the current tile's products) or 2 (two register sets: the loads of
    /// tile t + 2 are issued before the products of tile t and stored after those of tile
    /// t + 1, so their latency overlaps two tiles' products; two buffers only); 0 (`l`,
    /// late: the next tile's loads are issued after the current tile's products and stored
    /// at once, so no staged value is live during the products: fewer registers, for more
    /// workgroups per SM, where K is one or two tiles; one buffer, `free` 0, not
    /// persistent).
    pub depth: u32,
    /// 16-byte global loads of float16 operands (`vec4<u32>`: 8 packed halves) where the
    /// contiguous dimension is a multiple of 8, unpacked into two `vec4<f16>` shared stores
    /// (`unpack2x16float` and back to f16, exact); `Smem::Vec4` only.
    pub wide: bool,
    /// Branch-free K loop (`depth` 1 only): 0, the next tile's staging under `if more`
    /// (skipped after the last tile) and each global load under its own bounds check; 1
    /// (`f`), the staging unconditional (past the last tile its loads are out of range, so
    /// zeros, and its stores go to a buffer nobody reads any more); 2 (`fs`), also each load
    /// unconditional: the index is replaced by 0 where out of range and the value by zero
    /// with `select` (no branch in the loop body).
    pub free: u32,
    /// Epilogue scratch slots (16 x 16 floats, 1 KiB each): 0, one per subgroup; fewer
    /// (`e<slots>`), the subgroups write their accumulators back in turns, which frees
    /// workgroup memory for the K loop's buffers.
    pub slots: u32,
    /// Persistent over M tiles (`p`; plain products only, see [`CoopSpec::persists`]): a
    /// workgroup keeps its N tile and walks M tiles (grid y capped at the wave, see
    /// [`persist_wave`]); the last K tile's loads fetch the next M tile's first K tile, whose
    /// store to workgroup memory waits until after the epilogue, so those loads are in flight
    /// during the products and the epilogue's stores of C. For products of few K tiles (the
    /// 1x1 convolutions), where each tile's loads, products and stores otherwise run in
    /// sequence (NOTES-coop.md, session 18).
    pub persist: bool,
}

/// The element type of the staged tiles in workgroup memory.
///
/// (16-byte elements are out: NVIDIA's driver computes wrong products through pointers to
/// `mat2x4<f16>` elements and fails to compile (NVVM) loads of f16 fragments through
/// pointers to `vec4<u32>` words; see NOTES-coop.md.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smem {
    /// `f16`: one 2-byte store per staged half.
    Half,
    /// `vec4<f16>`: 8-byte stores; fragment loads through vector pointers, strides in
    /// vectors.
    Vec4,
}

impl Smem {
    /// Halves per workgroup array element.
    pub const fn unit(self) -> u32 {
        match self {
            Smem::Half => 1,
            Smem::Vec4 => 4,
        }
    }
}

impl CoopTile {
    /// Subgroups per workgroup.
    pub const fn subgroups(&self) -> u32 {
        self.sg_m * self.sg_n
    }

    /// 16 x 16 accumulators per subgroup along M and N.
    pub const fn frags(&self) -> (u32, u32) {
        (self.bm / self.sg_m / 16, self.bn / self.sg_n / 16)
    }
}

/// 128 x 128 per workgroup, 8 subgroups of 64 x 32 (4 x 2 accumulators).
pub const COOP_128X128_2X4: CoopTile = CoopTile {
    name: "c128x128x32_2x4",
    bm: 128,
    bn: 128,
    bk: 32,
    sg_m: 2,
    sg_n: 4,
    smem: Smem::Half,
    group: 0,
    nbuf: 2,
    depth: 1,
    wide: false,
    free: 0,
    slots: 0,
    persist: false,
};
/// 128 x 128 per workgroup, 4 subgroups of 64 x 64 (4 x 4 accumulators).
pub const COOP_128X128_2X2: CoopTile = CoopTile {
    name: "c128x128x32_2x2",
    sg_n: 2,
    ..COOP_128X128_2X4
};
/// 64 x 64 per workgroup, 4 subgroups of 32 x 32 (2 x 2 accumulators): more workgroups for
/// mid-sized products.
pub const COOP_64X64_2X2: CoopTile = CoopTile {
    name: "c64x64x32_2x2",
    bm: 64,
    bn: 64,
    bk: 32,
    sg_m: 2,
    sg_n: 2,
    smem: Smem::Half,
    group: 0,
    nbuf: 2,
    depth: 1,
    wide: false,
    free: 0,
    slots: 0,
    persist: false,
};

/// The same tiles with `vec4<f16>` workgroup arrays.
pub const COOP_128X128_2X4V: CoopTile = CoopTile {
    name: "c128x128x32_2x4v",
    smem: Smem::Vec4,
    ..COOP_128X128_2X4
};
pub const COOP_128X128_2X2V: CoopTile = CoopTile {
    name: "c128x128x32_2x2v",
    smem: Smem::Vec4,
    ..COOP_128X128_2X2
};
pub const COOP_64X64_2X2V: CoopTile = CoopTile {
    name: "c64x64x32_2x2v",
    smem: Smem::Vec4,
    ..COOP_64X64_2X2
};

/// 128 x 128 in 8 subgroups of 64 x 32 with `vec4<f16>` workgroup arrays, launched in
/// groups of 8 tile rows.
pub const COOP_128X128_2X4VG: CoopTile = CoopTile {
    name: "c128x128x32_2x4vg",
    group: 8,
    ..COOP_128X128_2X4V
};
/// 8 subgroups of 32 x 64.
pub const COOP_128X128_4X2VG: CoopTile = CoopTile {
    name: "c128x128x32_4x2vg",
    sg_m: 4,
    sg_n: 2,
    ..COOP_128X128_2X4VG
};
/// 128 x 64 in 4 subgroups of 64 x 32: 35 KiB of workgroup memory, more workgroups per SM.
pub const COOP_128X64_2X2VG: CoopTile = CoopTile {
    name: "c128x64x32_2x2vg",
    bn: 64,
    sg_n: 2,
    ..COOP_128X128_2X4VG
};
/// K tiles of 16: 29 KiB of workgroup memory.
pub const COOP_128X128X16_2X4VG: CoopTile = CoopTile {
    name: "c128x128x16_2x4vg",
    bk: 16,
    ..COOP_128X128_2X4VG
};
/// 256 x 128 in 8 subgroups of 64 x 64, K tiles of 16.
pub const COOP_256X128X16_4X2VG: CoopTile = CoopTile {
    name: "c256x128x16_4x2vg",
    bm: 256,
    bk: 16,
    sg_m: 4,
    sg_n: 2,
    ..COOP_128X128_2X4VG
};

/// Loads two K tiles ahead (`depth` 2).
pub const COOP_128X128_2X4VG2: CoopTile = CoopTile {
    name: "c128x128x32_2x4vg2",
    depth: 2,
    ..COOP_128X128_2X4VG
};
/// One staging buffer with K tiles of 64 (two barriers per 64 of K, twice the products
/// between them): 43 KiB.
pub const COOP_128X128X64_2X4VG1: CoopTile = CoopTile {
    name: "c128x128x64_2x4vg1",
    bk: 64,
    nbuf: 1,
    ..COOP_128X128_2X4VG
};
/// The default geometry with 16-byte global loads.
pub const COOP_128X128_2X4WG: CoopTile = CoopTile {
    name: "c128x128x32_2x4wg",
    wide: true,
    ..COOP_128X128_2X4VG
};
/// 16-byte global loads, two K tiles ahead.
pub const COOP_128X128_2X4WG2: CoopTile = CoopTile {
    name: "c128x128x32_2x4wg2",
    wide: true,
    ..COOP_128X128_2X4VG2
};
/// 16-byte global loads, K tiles of 64 in one buffer.
pub const COOP_128X128X64_2X4WG1: CoopTile = CoopTile {
    name: "c128x128x64_2x4wg1",
    wide: true,
    ..COOP_128X128X64_2X4VG1
};
/// 64 x 64 with K tiles of 64 in one buffer: the form of `c128x128x64_2x4vg1` that fits
/// lavapipe's 32 KiB of workgroup memory (its emulated test), 22.5 KiB.
pub const COOP_64X64X64_2X2V1: CoopTile = CoopTile {
    name: "c64x64x64_2x2v1",
    bk: 64,
    nbuf: 1,
    ..COOP_64X64_2X2V
};
/// 64 x 64 with 16-byte global loads, two K tiles ahead.
pub const COOP_64X64_2X2W2: CoopTile = CoopTile {
    name: "c64x64x32_2x2w2",
    wide: true,
    depth: 2,
    ..COOP_64X64_2X2V
};

/// v4 (NOTES-coop.md): branch-free K loops (`free`) with 16-byte loads and K tiles of 64 in
/// one buffer. `wg1f`: the staging unconditional, each load under its bounds check (the
/// float16 default for at least 128 tiles: 196 TFLOP/s at 4096 on the H200); `wg1fs`: the
/// loads through `select` too (181).
pub const COOP_128X128X64_2X4WG1F: CoopTile = CoopTile {
    name: "c128x128x64_2x4wg1f",
    free: 1,
    ..COOP_128X128X64_2X4WG1
};
pub const COOP_128X128X64_2X4WG1FS: CoopTile = CoopTile {
    name: "c128x128x64_2x4wg1fs",
    free: 2,
    ..COOP_128X128X64_2X4WG1
};
/// 16 subgroups of 32 x 32 (512 invocations: the driver holds them at 128 registers, 16
/// warps per SM) with the epilogue in two turns of 8 KiB (43 KiB): `vec4<f16>` loads (173)
/// and 16-byte loads (189).
pub const COOP_128X128X64_4X4VG1FSE8: CoopTile = CoopTile {
    name: "c128x128x64_4x4vg1fse8",
    sg_m: 4,
    sg_n: 4,
    free: 2,
    slots: 8,
    ..COOP_128X128X64_2X4VG1
};
pub const COOP_128X128X64_4X4WG1FSE8: CoopTile = CoopTile {
    name: "c128x128x64_4x4wg1fse8",
    wide: true,
    ..COOP_128X128X64_4X4VG1FSE8
};
/// K tiles of 80 (five steps of 16 between barriers; 47 KiB with 4 KiB of scratch in two
/// turns): 169.
pub const COOP_128X128X80_2X4WG1FSE4: CoopTile = CoopTile {
    name: "c128x128x80_2x4wg1fse4",
    bk: 80,
    slots: 4,
    ..COOP_128X128X64_2X4WG1FS
};
/// 64 x 64 with 16-byte loads through `select`, K 64 in one buffer: the float16 default for
/// fewer than 128 tiles of 128 x 128 (93 TFLOP/s at 1024), and the lavapipe form of the
/// 128 x 128 `wg1fs` tile.
pub const COOP_64X64X64_2X2W1FS: CoopTile = CoopTile {
    name: "c64x64x64_2x2w1fs",
    wide: true,
    free: 2,
    ..COOP_64X64X64_2X2V1
};
/// Lavapipe forms (the same generator paths within its 32 KiB) for the emulated tests: of
/// the `wg1f` default, of the 16-subgroup tiles (epilogue in four turns), of the K-80 tile
/// (two turns), and `free` 1 with two buffers.
pub const COOP_64X64X64_2X2W1F: CoopTile = CoopTile {
    name: "c64x64x64_2x2w1f",
    free: 1,
    ..COOP_64X64X64_2X2W1FS
};
pub const COOP_64X64X64_4X4W1FSE4: CoopTile = CoopTile {
    name: "c64x64x64_4x4w1fse4",
    sg_m: 4,
    sg_n: 4,
    slots: 4,
    ..COOP_64X64X64_2X2W1FS
};
pub const COOP_64X64X80_2X2W1FSE2: CoopTile = CoopTile {
    name: "c64x64x80_2x2w1fse2",
    bk: 80,
    slots: 2,
    ..COOP_64X64X64_2X2W1FS
};
pub const COOP_64X64_2X2VF: CoopTile = CoopTile {
    name: "c64x64x32_2x2vf",
    free: 1,
    ..COOP_64X64_2X2V
};

/// Conv2D (v5, NOTES-coop.md): 128 x 64 in 8 subgroups of 32 x 32 with the v4 loop (16-byte
/// loads, K 64 in one buffer, unconditional staging; `fs`: loads through `select`), for
/// products with 64 output columns (ResNet's 64-channel layers), 35 KiB.
pub const COOP_128X64X64_4X2WG1F: CoopTile = CoopTile {
    name: "c128x64x64_4x2wg1f",
    bn: 64,
    sg_m: 4,
    sg_n: 2,
    ..COOP_128X128X64_2X4WG1F
};
pub const COOP_128X64X64_4X2WG1FS: CoopTile = CoopTile {
    name: "c128x64x64_4x2wg1fs",
    free: 2,
    ..COOP_128X64X64_4X2WG1F
};
/// The lavapipe form of the 8-subgroup 128 x 64 tiles (8 subgroups of 16 x 32, grouped
/// launch order), 26 KiB.
pub const COOP_64X64X64_4X2WG1FS: CoopTile = CoopTile {
    name: "c64x64x64_4x2wg1fs",
    bm: 64,
    ..COOP_128X64X64_4X2WG1FS
};
/// 64 x 128 in 8 subgroups of 32 x 32 (the 128 x 64 tile turned over), the v4 loop: for
/// products with few K tiles and 128+ columns (ResNet's 1x1 layers at 56 x 56: K 64-256),
/// where 128 x 128's 2-3 workgroups per SM run each tile's loads, products and stores in
/// sequence (NOTES-coop.md, session 18); twice the tiles, fewer registers per workgroup.
/// Not measured yet (bench/h200/coop1x1-sweep.sh).
pub const COOP_64X128X64_2X4WG1F: CoopTile = CoopTile {
    name: "c64x128x64_2x4wg1f",
    bm: 64,
    ..COOP_128X128X64_2X4WG1F
};
/// Its lavapipe form (32 x 128, 8 subgroups of 16 x 32), 28 KiB.
pub const COOP_32X128X64_2X4WG1F: CoopTile = CoopTile {
    name: "c32x128x64_2x4wg1f",
    bm: 32,
    ..COOP_64X128X64_2X4WG1F
};
/// Persistent forms (`persist`) of the 128 x 128 and 64 x 128 `wg1f` tiles, and their
/// lavapipe forms. On the H200 (session 19, bench/RESULTS.md) the 128 x 128 one ran 5-13%
/// under its twin on plain 1x1 products with K <= 128 (the conv chooser's pick there), 1-5%
/// over it on square MatMuls; the 64 x 128 one slower than both.
pub const COOP_128X128X64_2X4WG1FP: CoopTile = CoopTile {
    name: "c128x128x64_2x4wg1fp",
    persist: true,
    ..COOP_128X128X64_2X4WG1F
};
pub const COOP_64X128X64_2X4WG1FP: CoopTile = CoopTile {
    name: "c64x128x64_2x4wg1fp",
    persist: true,
    ..COOP_64X128X64_2X4WG1F
};
/// Late staging (`depth` 0) of the 128 x 128 and 128 x 64 one-buffer tiles with 16-byte
/// loads, and their lavapipe form. Measured in session 20 (bench/RESULTS.md): 18-28 registers
/// fewer, still one 128 x 128 workgroup per SM, 5-16% slower than the chooser's picks; not
/// chosen.
pub const COOP_128X128X64_2X4WG1L: CoopTile = CoopTile {
    name: "c128x128x64_2x4wg1l",
    depth: 0,
    ..COOP_128X128X64_2X4WG1
};
pub const COOP_128X64X64_4X2WG1L: CoopTile = CoopTile {
    name: "c128x64x64_4x2wg1l",
    bn: 64,
    sg_m: 4,
    sg_n: 2,
    ..COOP_128X128X64_2X4WG1L
};
pub const COOP_64X64X64_2X2W1L: CoopTile = CoopTile {
    name: "c64x64x64_2x2w1l",
    depth: 0,
    free: 0,
    ..COOP_64X64X64_2X2W1FS
};
pub const COOP_64X64X64_2X2W1FP: CoopTile = CoopTile {
    name: "c64x64x64_2x2w1fp",
    persist: true,
    ..COOP_64X64X64_2X2W1F
};
pub const COOP_32X128X64_2X4WG1FP: CoopTile = CoopTile {
    name: "c32x128x64_2x4wg1fp",
    persist: true,
    ..COOP_32X128X64_2X4WG1F
};

/// Session 20: 16 subgroups of 32 x 32 with a scratch slot each, K tiles of 32 in one buffer
/// (35-37 KiB with the 16 KiB of scratch). The 1x1 rows' epilogue is ~40% of their time and
/// runs as 8 rounds of 8 subgroups on the 8-subgroup tile (bench/RESULTS.md, session 20); here
/// it is 4 rounds of 16, twice the warps storing per round. Measured 3-5% under the pick
/// (persistent form), not chosen; with its persistent form and the lavapipe forms
/// (tests/coop_emulated_sg16.rs).
pub const COOP_128X128X32_4X4WG1F: CoopTile = CoopTile {
    name: "c128x128x32_4x4wg1f",
    bk: 32,
    sg_m: 4,
    sg_n: 4,
    slots: 0,
    ..COOP_128X128X64_2X4WG1F
};
pub const COOP_128X128X32_4X4WG1FP: CoopTile = CoopTile {
    name: "c128x128x32_4x4wg1fp",
    persist: true,
    ..COOP_128X128X32_4X4WG1F
};
/// Their lavapipe forms (32 KiB of workgroup memory): the scratch in two turns of 8 slots
/// (27-29 KiB). A 64 x 64 form cannot take 16-byte loads with 512 invocations and K 32.
pub const COOP_128X128X32_4X4WG1FE8: CoopTile = CoopTile {
    name: "c128x128x32_4x4wg1fe8",
    slots: 8,
    ..COOP_128X128X32_4X4WG1F
};
pub const COOP_128X128X32_4X4WG1FPE8: CoopTile = CoopTile {
    name: "c128x128x32_4x4wg1fpe8",
    slots: 8,
    ..COOP_128X128X32_4X4WG1FP
};

/// Session 20: tiles within ~24 KiB of workgroup memory. The occupancy probe (`tfwgpu-bench
/// occupancy`) found this driver keeps one workgroup per SM as soon as a workgroup declares
/// 28 KiB or more, two at 20-24 KiB (three at 16, four at 12), whatever the registers; every
/// staged tile above (35-45 KiB) runs alone on its SM. With K tiles of 32 in one buffer the
/// 128 x 64 and 64 x 128 tiles fit 22-23 KiB (two per SM if they keep <= 127 registers for 256
/// invocations: 100-114 measured), the 64 x 64 one 14 KiB (three). The Conv2D chooser's v10
/// picks (`choose_conv_tile`): the persistent 128 x 64 and 64 x 128 forms for plain products
/// with small K, `c64x64x32_2x2w1f` and `c64x128x32_2x4wg1f` for strided 1x1 filters. They
/// run in the emulated tests as they are (tests/coop_emulated_sg16.rs,
/// coop_emulated_persist.rs).
pub const COOP_128X64X32_4X2WG1F: CoopTile = CoopTile {
    name: "c128x64x32_4x2wg1f",
    bk: 32,
    ..COOP_128X64X64_4X2WG1F
};
pub const COOP_64X128X32_2X4WG1F: CoopTile = CoopTile {
    name: "c64x128x32_2x4wg1f",
    bk: 32,
    ..COOP_64X128X64_2X4WG1F
};
pub const COOP_64X64X32_2X2W1F: CoopTile = CoopTile {
    name: "c64x64x32_2x2w1f",
    bk: 32,
    ..COOP_64X64X64_2X2W1F
};
pub const COOP_128X64X32_4X2WG1FP: CoopTile = CoopTile {
    name: "c128x64x32_4x2wg1fp",
    persist: true,
    ..COOP_128X64X32_4X2WG1F
};
pub const COOP_64X128X32_2X4WG1FP: CoopTile = CoopTile {
    name: "c64x128x32_2x4wg1fp",
    persist: true,
    ..COOP_64X128X32_2X4WG1F
};
pub const COOP_64X64X32_2X2W1FP: CoopTile = CoopTile {
    name: "c64x64x32_2x2w1fp",
    persist: true,
    ..COOP_64X64X32_2X2W1F
};

/// Workgroups in flight that a persistent launch (`CoopTile::persist`) is sized for, over
/// all N tiles (`TFWGPU_COOP_PERSIST_WAVE`; default 264: two per SM of the H200's 132, which
/// the K-32 tiles of <= 24 KiB get; the 128 x 128 K-64 tiles get one (session 20's occupancy
/// probe), so half of their workgroups wait for the first half, which measured faster than 528
/// in session 19; 132 was not measured). Read once.
pub fn persist_wave() -> usize {
    static W: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        crate::exec::env_parse::<usize>("TFWGPU_COOP_PERSIST_WAVE")
            .filter(|&w| w > 0)
            .unwrap_or(264)
    })
}

/// Every cooperative-matrix tile (for `_tfwgpu_tile` and the offline shader tests).
pub const COOP_TILES: &[CoopTile] = &[
    COOP_128X128_2X4,
    COOP_128X128_2X2,
    COOP_64X64_2X2,
    COOP_128X128_2X4V,
    COOP_128X128_2X2V,
    COOP_64X64_2X2V,
    COOP_128X128_2X4VG,
    COOP_128X128_4X2VG,
    COOP_128X64_2X2VG,
    COOP_128X128X16_2X4VG,
    COOP_256X128X16_4X2VG,
    COOP_128X128_2X4VG2,
    COOP_128X128X64_2X4VG1,
    COOP_128X128_2X4WG,
    COOP_128X128_2X4WG2,
    COOP_128X128X64_2X4WG1,
    COOP_64X64_2X2W2,
    COOP_64X64X64_2X2V1,
    COOP_128X128X64_2X4WG1F,
    COOP_128X128X64_2X4WG1FS,
    COOP_128X128X64_4X4VG1FSE8,
    COOP_128X128X64_4X4WG1FSE8,
    COOP_128X128X80_2X4WG1FSE4,
    COOP_64X64X64_2X2W1FS,
    COOP_64X64X64_2X2W1F,
    COOP_64X64X64_4X4W1FSE4,
    COOP_64X64X80_2X2W1FSE2,
    COOP_64X64_2X2VF,
    COOP_128X64X64_4X2WG1F,
    COOP_128X64X64_4X2WG1FS,
    COOP_64X64X64_4X2WG1FS,
    COOP_64X128X64_2X4WG1F,
    COOP_32X128X64_2X4WG1F,
    COOP_128X128X64_2X4WG1FP,
    COOP_64X128X64_2X4WG1FP,
    COOP_64X64X64_2X2W1FP,
    COOP_32X128X64_2X4WG1FP,
    COOP_128X128X64_2X4WG1L,
    COOP_128X64X64_4X2WG1L,
    COOP_64X64X64_2X2W1L,
    COOP_128X128X32_4X4WG1F,
    COOP_128X128X32_4X4WG1FP,
    COOP_128X128X32_4X4WG1FE8,
    COOP_128X128X32_4X4WG1FPE8,
    COOP_128X64X32_4X2WG1F,
    COOP_64X128X32_2X4WG1F,
    COOP_64X64X32_2X2W1F,
    COOP_128X64X32_4X2WG1FP,
    COOP_64X128X32_2X4WG1FP,
    COOP_64X64X32_2X2W1FP,
];

/// The element type of the operands in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// float16 operands, float16 output.
    F16,
    /// float32 operands (rounded to float16 while staged), float32 output.
    F32,
}

/// One shader variant: tile, subgroup size, operand layouts and load widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopSpec {
    pub tile: CoopTile,
    /// Invocations per subgroup.
    pub lanes: u32,
    /// A is stored M x K (else K x M).
    pub a_kfast: bool,
    /// B is stored K x N (else N x K).
    pub b_nfast: bool,
    /// Elements per global load of A and of B (8, 2 or 1 halves; 4 or 1 floats).
    pub wa: u32,
    pub wb: u32,
    pub input: Input,
    /// A is the windows of an NHWC Conv2D input (rows m = (n, oy, ox), columns k = (r, s, c);
    /// `wa` divides the channels), B the HWIO filter: Conv2D forward as an implicit product.
    /// (Conv2DBackpropInput with stride 1 takes the same A: the windows of dy, with the
    /// dilations and paddings negated in the params.)
    pub conv: bool,
    /// Conv2DBackpropInput: B[k = (r, s, kc), n = c] = f[r, s, c, kc] (HWIO filter), stored
    /// N x K per tap (`!b_nfast`); a K tile lies within one tap (BK divides the filter's
    /// output channels, checked at launch), whose offset (`p.ftap` elements per tap) is
    /// computed once per tile.
    pub bwd_input: bool,
    /// Conv2DBackpropFilter (with `conv`, `!a_kfast`, `b_nfast`, `split`): A[m = (r, s, c),
    /// k = (n, oy, ox)] = x[n, oy*sh - pt + r*dh, ox*sw - pl + s*dw, c] stored K x M (the
    /// windows of x transposed: each invocation's columns m, so its tap and channel, are
    /// fixed; its rows k advance by BK per tile without a division), B = dy [K, N]; the
    /// product is the HWIO filter gradient [R*S*C, K].
    pub wgrad: bool,
    /// Split K: workgroup z of the grid (the batch index, no batch dimensions) takes K rows
    /// [z * p.ftap, min(p.k, (z + 1) * p.ftap)) and writes its own slice of C: rows
    /// [p.bstr[0].x, p.bstr[0].x + p.bstr[0].y) of C (all M rows, or those of the launch's
    /// tile rows, `Launch::row_tiles`), slice z at z * p.bstr[0].y * N.
    pub split: bool,
    /// C is float32 whatever the input type (split-K partial sums, added up afterwards).
    pub out_f32: bool,
    /// Conv2DBackpropInput with strides (`bwd_input`): p.sh and p.sw are the forward strides;
    /// A[m = (n, y, x), k = (r, s, kc)] = dy[n, (y + pt - r*dh) / sh, (x + pl - s*dw) / sw, kc]
    /// where both divisions are exact and in range, else zero (the taps between strided
    /// outputs are multiplied as zeros).
    pub strided: bool,
    /// Conv2DBackpropInput with strides by output phase (sub-pixel decomposition): the
    /// stride-1 `bwd_input` form on a phase's rows m = (n, Y, X) (p.oh x p.ow of them per
    /// image; p.sh = p.sw = 1), one phase per grid z (up to 4 in one launch; every phase of a
    /// launch has p.m rows). Per phase z: its taps R | S << 8 | r0 << 16 | s0
    /// << 24 in p.bdims[0][z] (K = R * S * p.cg, the windows' tap row length S), the window
    /// offsets (two's complement, the padding words of the stride-1 form) in p.bdims[1][z]
    /// and p.bstr[1][z], (py | px << 16) in p.astr[1][z]. Common: (sh, sw, W, H) of dx in
    /// p.astr[0]; the sub-filter's tap steps (rows, columns, in filter elements), the filter
    /// elements per filter row S * C * kc, and the zero-fill flag in p.bstr[0] (p.ftap = C *
    /// kc). A's tap step and its window origin come through p.dh / p.dw and the offsets; B's
    /// tap (j, i) is at filter element r0 * p.bstr[0].z + s0 * p.ftap + j * p.bstr[0].x + i *
    /// p.bstr[0].y; row m is written to dx row (n, py + Y * sh, px + X * sw). A phase without
    /// taps (K = 0) writes its rows' zeros; with p.bstr[0].w set, each row also writes the
    /// zeros of the other phases' pixels of its (n, Y, X) (where only one phase has taps).
    /// No split K, no batches.
    pub phase: bool,
    /// Split K summed in the product's epilogue by the last workgroup of each tile to arrive
    /// (`split`, output of the final type, not `out_f32`; with `vout`): each workgroup writes
    /// its float32 partial tile to slice z of `part` (binding 4, `vec4<f32>`, rows as
    /// `split`), then, after a device-scope barrier (release), increments its tile's arrival
    /// counter (binding 5, `atomic<u32>` per output tile, zero before the launch); the
    /// workgroup that takes the count to p.bstr[0].z (the number of splits) resets the
    /// counter to zero (it is the tile's last arrival in this launch: the counters stay zero
    /// between launches, no clear), and after a second barrier (acquire) adds up the slices
    /// of its tile in split order, 0, 1, ..., from memory, and writes C: the order of the
    /// additions does not depend on which workgroup arrives last.
    pub sum_last: bool,
    /// Head and tail in one launch (with `sum_last`): a 1-D grid whose first p.bstr[0].w
    /// workgroups take whole output tiles (tiles 0, 1, ... in row-major order, all of K,
    /// written to C directly) and the rest the remaining tiles (from tile p.bstr[0].w on,
    /// rows from p.bstr[0].x) in p.bstr[0].z splits of p.ftap rows of K, summed by each
    /// tile's last arrival: workgroup p.bstr[0].w + z * T + i takes split z of tail tile i
    /// (T tail tiles). The tail's workgroups start as the head's finish, in one launch (v8).
    pub head_tail: bool,
    /// Stream-K (with `sum_last`, `split`; not `head_tail`, `phase`, `wgrad`): a 1-D grid of
    /// G = p.bstr[0].w workgroups over the T x KT iterations (output tile, K tile) of the
    /// product, tile-major; workgroup w takes iterations [w * T * KT / G, (w + 1) * T * KT /
    /// G), as segments split at tile boundaries, each one pass of the body with its own K
    /// range. A segment that covers all of its tile's K writes C; the others write slice z
    /// of `part` (z = w minus the first workgroup of the tile: the K order), and the tile's
    /// last arrival (counting the workgroups that cover the tile, from the same division)
    /// adds the slices in order z = 0, 1, ... and writes C.
    pub stream_k: bool,
    /// Vector epilogue: each invocation writes 8 consecutive halves as one 16-byte store
    /// (`vec4<u32>` of packed pairs; 4 floats as a `vec4<f32>` for float32 output) instead of
    /// one element per store; needs N a multiple of that width (checked by the caller).
    pub vout: bool,
    /// Test form for adapters without cooperative matrices (`TFWGPU_COOP_EMULATE=1`): the
    /// same staging, loop, barriers and epilogue, with each 16 x 16 accumulator held as
    /// 256 / `lanes` floats per invocation and the fragment loads and products replaced by
    /// plain loops over the workgroup arrays that follow SPV_KHR_cooperative_matrix's
    /// layout rules (row- or column-major, strides in array elements); subgroups are
    /// `lanes` consecutive invocations. Slow; for checking the generator on lavapipe.
    pub emulate: bool,
}

/// The elements per global load of an operand whose contiguous dimension has `len`
/// elements: 8 (a `vec4<u32>` of packed halves) for a `wide` tile's float16 operands where
/// 8 divides `len`, else the widest of 4 (a `vec4` of halves or floats) and 1 that divides
/// `len`. (naga 30 translates `bitcast` from u32 words to f16 vectors wrongly, so the packed
/// words are unpacked through `unpack2x16float`.)
pub fn load_width(input: Input, tile: &CoopTile, len: usize) -> u32 {
    if tile.wide && input == Input::F16 && len.is_multiple_of(8) {
        8
    } else if len.is_multiple_of(4) {
        4
    } else {
        1
    }
}

/// The params both forms take: the matmul fields (as `matmul_common.wgsl`), then those of a
/// convolution's input windows (zero for products).
const COOP_COMMON_WGSL: &str = "struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_base: u32,
    sa_m: u32,
    sa_k: u32,
    sb_k: u32,
    sb_n: u32,
    a_kfast: u32,
    b_nfast: u32,
    nbd: u32,
    tile_base_x: u32,
    tile_base_y: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    bdims: array<vec4<u32>, 2>,
    astr: array<vec4<u32>, 2>,
    bstr: array<vec4<u32>, 2>,
    // Conv2D forward, NHWC: A[m = (n, oy, ox), k = (r, s, c)] = x[n, oy*sh - pt + r*dh,
    // ox*sw - pl + s*dw, c] (zero outside the input).
    oh: u32,
    ow: u32,
    cg: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    xn: u32,
    xh: u32,
    xw: u32,
    ih: u32,
    iw: u32,
    // Conv2DBackpropInput: filter elements per tap (c * k).
    ftap: u32,
};
@group(0) @binding(0) var<uniform> p: Params;

// Offsets of batch `bidx` in A and B: the index decomposed over the (merged) batch
// dimensions, innermost first; a stride is 0 where that operand is broadcast.
fn batch_offsets(bidx: u32) -> vec2<u32> {
    var rem = bidx;
    var off = vec2<u32>(0u, 0u);
    for (var d = 0u; d < p.nbd; d += 1u) {
        let size = p.bdims[d / 4u][d % 4u];
        let idx = rem % size;
        rem = rem / size;
        off += idx * vec2<u32>(p.astr[d / 4u][d % 4u], p.bstr[d / 4u][d % 4u]);
    }
    return off;
}
";

/// Padding (in halves) after each staged row: keeps rows 16-byte aligned and spreads the
/// 8 rows of one 16 x 16 fragment load over distinct banks.
const PAD: u32 = 8;

impl CoopSpec {
    /// Invocations per workgroup.
    pub fn threads(&self) -> u32 {
        self.lanes * self.tile.subgroups()
    }

    /// (rows, contiguous columns) of the staged A and B tiles.
    fn a_dims(&self) -> (u32, u32) {
        if self.a_kfast {
            (self.tile.bm, self.tile.bk)
        } else {
            (self.tile.bk, self.tile.bm)
        }
    }

    fn b_dims(&self) -> (u32, u32) {
        if self.b_nfast {
            (self.tile.bk, self.tile.bn)
        } else {
            (self.tile.bn, self.tile.bk)
        }
    }

    /// Halves of one staged buffer of A and of B.
    fn stage_sizes(&self) -> (u32, u32) {
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        (ar * (ac + PAD), br * (bc + PAD))
    }

    /// Floats of C per invocation and step of the `sum_last` epilogue's sum: one store of
    /// the vector epilogue (8 halves, or 4 floats).
    fn sum_group(&self) -> u32 {
        if self.input == Input::F16 && !self.out_f32 {
            8
        } else {
            4
        }
    }

    /// Bytes of workgroup memory.
    pub fn shared_bytes(&self) -> u32 {
        let (a, b) = self.stage_sizes();
        self.tile.nbuf * (a + b) * 2 + self.scratch_slots() * 256 * 4
    }

    /// 16 x 16 float32 epilogue scratch slots: one per subgroup unless `slots` is set.
    pub fn scratch_slots(&self) -> u32 {
        let t = &self.tile;
        if t.slots == 0 || t.slots > t.subgroups() {
            t.subgroups()
        } else {
            t.slots
        }
    }

    /// Whether the shader walks M tiles (`CoopTile::persist`): plain products only (no
    /// windows, splits, phases, stream-K or head/tail launches), one register set and
    /// unconditional staging (`depth` 1, `free` > 0). Elsewhere a persistent tile runs as its
    /// plain form.
    pub fn persists(&self) -> bool {
        let t = &self.tile;
        t.persist
            && !self.conv
            && !self.wgrad
            && !self.split
            && !self.phase
            && !self.strided
            && !self.bwd_input
            && !self.sum_last
            && !self.head_tail
            && !self.stream_k
            && t.depth == 1
            && t.free > 0
    }

    /// Whether the generated shader's loops cover its tiles exactly.
    pub fn is_valid(&self) -> bool {
        let t = &self.tile;
        let wg = self.threads();
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        let width_ok = |w: u32| {
            w == 1
                || w == 4
                || (w == 8 && t.wide && t.smem == Smem::Vec4 && self.input == Input::F16)
        };
        t.bk.is_multiple_of(16)
            && (t.nbuf == 1 || t.nbuf == 2)
            && (t.depth == 1
                || (t.depth == 2 && t.nbuf == 2)
                || (t.depth == 0 && t.nbuf == 1 && t.free == 0 && !t.persist))
            && (t.free == 0 || (t.free <= 2 && t.depth == 1))
            && t.subgroups().is_multiple_of(self.scratch_slots())
            && t.bm.is_multiple_of(16 * t.sg_m)
            && t.bn.is_multiple_of(16 * t.sg_n)
            && self.lanes > 0
            && 256 % self.lanes == 0
            && width_ok(self.wa)
            && width_ok(self.wb)
            && ac.is_multiple_of(self.wa)
            && bc.is_multiple_of(self.wb)
            && (ar * ac / self.wa).is_multiple_of(wg)
            && (br * bc / self.wb).is_multiple_of(wg)
            && (!self.conv || wg.is_multiple_of(ac / self.wa))
            && (!self.conv || self.a_kfast || self.wgrad)
            && (!self.bwd_input || (self.conv && !self.b_nfast && !self.wgrad))
            && (!self.strided || self.bwd_input)
            && (!self.phase || (self.bwd_input && !self.strided && !self.split))
            && (!self.wgrad || (self.conv && !self.a_kfast && self.b_nfast && self.split))
            && (!self.emulate || 256 % self.lanes == 0)
            && (!self.sum_last
                || (self.split
                    && !self.out_f32
                    && !self.phase
                    && self.vout
                    && (t.bm * t.bn).is_multiple_of(self.sum_group() * wg)))
            && (!self.head_tail || self.sum_last)
            && (!self.stream_k || (self.sum_last && !self.head_tail && !self.phase && !self.wgrad))
    }

    /// The pipeline key's specialization.
    pub fn specialization(&self) -> String {
        format!(
            "{}{}_l{}_{}{}_w{}x{}_{}{}{}{}{}{}",
            match (self.conv, self.bwd_input, self.wgrad) {
                (true, true, _) if self.strided => "convbis_",
                (true, true, _) if self.phase => "convbip_",
                (true, true, _) => "convbi_",
                (true, false, true) => "convbf_",
                (true, false, false) => "conv_",
                _ => "",
            },
            self.tile.name,
            self.lanes,
            if self.a_kfast { "ak" } else { "am" },
            if self.b_nfast { "bn" } else { "bk" },
            self.wa,
            self.wb,
            match self.input {
                Input::F16 => "h",
                Input::F32 => "f",
            },
            if self.split { "_sk" } else { "" },
            if self.out_f32 { "_o32" } else { "" },
            if self.head_tail {
                "_ht"
            } else if self.stream_k {
                "_stk"
            } else if self.sum_last {
                "_sl"
            } else {
                ""
            },
            if self.vout { "_vo" } else { "" },
            if self.emulate { "_emu" } else { "" },
        )
    }

    /// The WGSL type of one global load of `w` elements.
    fn load_type(&self, w: u32) -> &'static str {
        match (self.input, w) {
            (Input::F16, 8) => "vec4<u32>",
            (Input::F16, 4) => "vec4<f16>",
            (Input::F16, _) => "f16",
            (Input::F32, 4) => "vec4<f32>",
            (Input::F32, _) => "f32",
        }
    }

    /// The emulated 16 x 16 x 16 product of the `emulate` form: invocation `lane` of a
    /// subgroup owns elements e = lane + q * lanes (row e / 16, column e % 16) of the
    /// accumulator; A and B are read at their fragment origins `ia`, `ib` (in array elements)
    /// with the layouts and strides the cooperative loads would use.
    fn emu_mma(&self) -> String {
        use std::fmt::Write;
        let unit = self.tile.smem.unit();
        let (_, ac) = self.a_dims();
        let (_, bc) = self.b_dims();
        let (sa_h, sb_h) = (ac + PAD, bc + PAD);
        // Half offsets of A(r, k) and B(k, c) from the fragment origins.
        let a_off = if self.a_kfast {
            format!("r * {sa_h}u + k")
        } else {
            format!("k * {sa_h}u + r")
        };
        let b_off = if self.b_nfast {
            format!("k * {sb_h}u + c")
        } else {
            format!("c * {sb_h}u + k")
        };
        let el = |arr: &str, idx: &str| match self.tile.smem {
            Smem::Half => format!("{arr}[{idx}]"),
            Smem::Vec4 => format!("{arr}[({idx}) / 4u][({idx}) % 4u]"),
        };
        // The 16 steps of k unrolled, the loop over the invocation's elements kept (with a
        // trip count the compiler cannot see, p._pad2 being 0): fully unrolled, the many
        // inlined copies take lavapipe's LLVM minutes to compile; as two loops, llvmpipe's
        // loop limiter (65535 iterations) cuts long K loops short.
        let mut steps = String::new();
        for k in 0..16 {
            let fa = a_off.replace('k', &format!("{k}u"));
            let fb = b_off.replace('k', &format!("{k}u"));
            let _ = writeln!(
                steps,
                "        sum += f32({}) * f32({});",
                el("sa", &format!("ia * {unit}u + {fa}")),
                el("sb", &format!("ib * {unit}u + {fb}"))
            );
        }
        format!(
            "
fn emu_mma(acc: ptr<function, array<f32, {per}>>, ia: u32, ib: u32, lane: u32) {{
    for (var q = 0u; q < {per}u + p._pad2; q += 1u) {{
        let e = lane + q * {lanes}u;
        let r = e / 16u;
        let c = e % 16u;
        var sum = (*acc)[q];
{steps}        (*acc)[q] = sum;
    }}
}}
",
            per = 256 / self.lanes,
            lanes = self.lanes,
        )
    }

    /// The WGSL source.
    pub fn wgsl(&self) -> String {
        use std::fmt::Write;
        let t = &self.tile;
        let (tm, tn) = t.frags();
        let wg = self.threads();
        let (asz, bsz) = self.stage_sizes();
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        let (sa_stride, sb_stride) = (ac + PAD, bc + PAD);
        // Workgroup arrays of vec4<f16> (fragment pointers and strides then count vectors)
        // or of f16.
        let unit = t.smem.unit();
        let out_ty = match (self.input, self.vout) {
            (Input::F16, false) if !self.out_f32 => "f16",
            (Input::F16, true) if !self.out_f32 => "vec4<u32>",
            (_, true) => "vec4<f32>",
            _ => "f32",
        };
        let smem_ty = match t.smem {
            Smem::Half => "f16",
            Smem::Vec4 => "vec4<f16>",
        };
        let mut s = String::new();
        let emu = self.emulate;
        // K, the windows' taps per row and their offsets: the params', or the phase's.
        let (pk, pfs, ppt, ppl) = if self.phase {
            ("ph_k", "ph_fs", "ph_pt", "ph_pl")
        } else {
            ("p.k", "p.fs", "p.pt", "p.pl")
        };
        if emu {
            s.push_str("enable f16;\n\n");
        } else {
            s.push_str("enable f16;\nenable wgpu_cooperative_matrix;\n\n");
        }
        s.push_str(COOP_COMMON_WGSL);
        let _ = write!(
            s,
            "
@group(0) @binding(1) var<storage, read_write> a: array<{ea}>;
@group(0) @binding(2) var<storage, read_write> b: array<{eb}>;
@group(0) @binding(3) var<storage, read_write> c: array<{out_ty}>;

{sum_bind}
var<workgroup> sa: array<{smem_ty}, {sa_len}>;
var<workgroup> sb: array<{smem_ty}, {sb_len}>;
var<workgroup> sc: array<f32, {sc_len}>;
{emu_fn}
@compute @workgroup_size({wg})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
{nwg_param}{sg_params}) {{{sg_lets}{sk_open}
    var tile = wid.xy;{ht_tile}
    if {group}u > 0u {{
        // Groups of GROUP tile rows, walked column by column (gx, gy: this dispatch's grid).
        let gx = p._pad0;
        let gy = p._pad1;
        let lin = wid.y * gx + wid.x;
        let per_group = {group}u * gx;
        let first = (lin / per_group) * {group}u;
        let rows = min(gy - first, {group}u);
        let r = lin % per_group;
        tile = vec2<u32>(r / rows, first + r % rows);
    }}
    {m0_decl}
    let n0 = (p.tile_base_x + tile.x) * {bn}u;
    let bidx = {bidx};
    let offs = batch_offsets(bidx);
    let sg_row = (sg / {sg_n}u) * {sub_m}u;
    let sg_col = (sg % {sg_n}u) * {sub_n}u;
{phase}{krange}",
            ea = self.load_type(self.wa),
            eb = self.load_type(self.wb),
            sa_len = t.nbuf * asz / unit,
            sb_len = t.nbuf * bsz / unit,
            sc_len = self.scratch_slots() * 256,
            bn = t.bn,
            sg_n = t.sg_n,
            sub_m = t.bm / t.sg_m,
            sub_n = t.bn / t.sg_n,
            // (Head and tail in one launch: the tile and split of this workgroup.)
            nwg_param = if self.persists() {
                "    @builtin(num_workgroups) nwg: vec3<u32>,\n"
            } else {
                ""
            },
            // (Persistent: this workgroup's first M tile; it walks every nwg.y-th one of the
            // dispatch's p._pad1 tile rows. p._pad2 stays 0: the emulated products read it.)
            m0_decl = if self.persists() {
                format!(
                    "var m0 = (p.tile_base_y + tile.y) * {bm}u;
    let mstep = nwg.y * {bm}u;
    let mend = min(p.m, (p.tile_base_y + p._pad1) * {bm}u);
    var m0n = m0 + mstep;",
                    bm = t.bm
                )
            } else {
                format!("let m0 = (p.tile_base_y + tile.y) * {}u;", t.bm)
            },
            group = if self.head_tail || self.stream_k || self.persists() {
                0
            } else {
                t.group
            },
            // (Stream-K: the loop over this workgroup's segments, each one output tile.)
            sk_open = if self.stream_k {
                format!(
                    "
    let sk_tx = (p.n + {bn}u - 1u) / {bn}u;
    let sk_kt = (p.k + {bk}u - 1u) / {bk}u;
    let sk_total = sk_tx * ((p.m + {bm}u - 1u) / {bm}u) * sk_kt;
    let sk_g = p.bstr[0].w;
    let sk_end = ((wid.x + 1u) * sk_total) / sk_g;
    var sk_it = (wid.x * sk_total) / sk_g;
    loop {{
    if sk_it >= sk_end {{
        break;
    }}
    let sk_i = sk_it / sk_kt;
    let sk_lo = sk_i * sk_kt;
    let sk_stop = min(sk_end, sk_lo + sk_kt);
    let sk_first = ((sk_lo + 1u) * sk_g - 1u) / sk_total;
    let sk_n = ((sk_lo + sk_kt) * sk_g - 1u) / sk_total - sk_first + 1u;
    let ht_whole = sk_n == 1u;
    let ht_z = wid.x - sk_first;",
                    bm = t.bm,
                    bn = t.bn,
                    bk = t.bk
                )
            } else {
                String::new()
            },
            ht_tile = if self.head_tail {
                format!(
                    "
    let ht_tx = (p.n + {bn}u - 1u) / {bn}u;
    let ht_head = p.bstr[0].w;
    let ht_whole = wid.x < ht_head;
    let ht_tail = max(ht_tx * ((p.m + {bm}u - 1u) / {bm}u) - min(ht_head, ht_tx * ((p.m + {bm}u - 1u) / {bm}u)), 1u);
    let ht_u = select(wid.x - ht_head, 0u, ht_whole);
    let ht_t = select(ht_head + ht_u % ht_tail, wid.x, ht_whole);
    let ht_z = select(ht_u / ht_tail, 0u, ht_whole);
    tile = vec2<u32>(ht_t % ht_tx, ht_t / ht_tx);",
                    bm = t.bm,
                    bn = t.bn
                )
            } else if self.stream_k {
                "\n    tile = vec2<u32>(sk_i % sk_tx, sk_i / sk_tx);".to_string()
            } else {
                String::new()
            },
            bidx = if self.head_tail || self.stream_k {
                "ht_z"
            } else {
                "p.batch_base + wid.z"
            },
            phase = if self.phase {
                "    let ph_t = p.bdims[0][bidx];
    let ph_fs = max((ph_t >> 8u) & 255u, 1u);
    let ph_k = (ph_t & 255u) * ((ph_t >> 8u) & 255u) * p.cg;
    let ph_fb = ((ph_t >> 16u) & 255u) * p.bstr[0].z + (ph_t >> 24u) * p.ftap;
    let ph_pt = p.bdims[1][bidx];
    let ph_pl = p.bstr[1][bidx];
    let ph_py = p.astr[1][bidx] & 65535u;
    let ph_px = p.astr[1][bidx] >> 16u;
"
            } else {
                ""
            },
            krange = if self.stream_k {
                format!(
                    "    let kb = (sk_it - sk_lo) * {bk}u;\n    let kend = min(p.k, (sk_stop - sk_lo) * {bk}u);\n    let ntiles = sk_stop - sk_it;\n",
                    bk = t.bk
                )
            } else if self.head_tail {
                format!(
                    "    let kb = select(bidx * p.ftap, 0u, ht_whole);\n    let kend = select(min(p.k, kb + p.ftap), p.k, ht_whole);\n    let ntiles = (kend - kb + {bk}u - 1u) / {bk}u;\n",
                    bk = t.bk
                )
            } else if self.split {
                format!(
                    "    let kb = bidx * p.ftap;\n    let kend = min(p.k, kb + p.ftap);\n    let ntiles = (kend - kb + {bk}u - 1u) / {bk}u;\n",
                    bk = t.bk
                )
            } else {
                format!("    let ntiles = ({pk} + {bk}u - 1u) / {bk}u;\n", bk = t.bk)
            },
            emu_fn = if emu { self.emu_mma() } else { String::new() },
            sum_bind = if self.sum_last {
                "@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;\n@group(0) @binding(5) var<storage, read_write> arrivals: array<atomic<u32>>;\nvar<workgroup> sl_old: u32;"
            } else {
                ""
            },
            sg_params = if emu {
                ""
            } else {
                "    @builtin(subgroup_id) sg: u32,\n    @builtin(subgroup_invocation_id) lane: u32,\n"
            },
            sg_lets = if emu {
                format!(
                    "\n    let sg = lid / {l}u;\n    let lane = lid % {l}u;",
                    l = self.lanes
                )
            } else {
                String::new()
            },
        );
        // A cleared accumulator (persistent tiles clear theirs again for each M tile).
        let acc_zero = if emu {
            format!("array<f32, {}>()", 256 / self.lanes)
        } else {
            "coop_mat16x16<f32, C>()".to_string()
        };
        for i in 0..tm {
            for j in 0..tn {
                let _ = writeln!(s, "    var acc_{i}_{j} = {acc_zero};");
            }
        }
        // How one operand is staged: its tile's rows and contiguous columns, load width,
        // the global row and column origins and limits, row stride and batch offset.
        struct Op {
            name: &'static str,
            rows: u32,
            cols: u32,
            w: u32,
            row0: &'static str,
            col0: &'static str,
            rlim: &'static str,
            clim: &'static str,
            ld: &'static str,
            off: &'static str,
            ty: &'static str,
            stage: u32,
        }
        // The K origin and limit of a staged tile (split K: this workgroup's range).
        let (k0, klim) = if self.split {
            ("(kb + k0)", "kend")
        } else {
            ("k0", pk)
        };
        // The M origin of A's staged rows (persistent: the next tile's, at the last K tile).
        let persist = self.persists();
        let m_org = if persist { "lm0" } else { "m0" };
        let a_op = Op {
            name: "a",
            rows: ar,
            cols: ac,
            w: self.wa,
            row0: if self.a_kfast { m_org } else { k0 },
            col0: if self.a_kfast { k0 } else { m_org },
            rlim: if self.a_kfast { "p.m" } else { klim },
            clim: if self.a_kfast { klim } else { "p.m" },
            ld: if self.a_kfast { "p.sa_m" } else { "p.sa_k" },
            off: "offs.x",
            ty: self.load_type(self.wa),
            stage: asz,
        };
        let b_op = Op {
            name: "b",
            rows: br,
            cols: bc,
            w: self.wb,
            row0: if self.b_nfast { k0 } else { "n0" },
            col0: if self.b_nfast { "n0" } else { k0 },
            rlim: if self.b_nfast { klim } else { "p.n" },
            clim: if self.b_nfast { "p.n" } else { klim },
            ld: if self.b_nfast { "p.sb_k" } else { "p.sb_n" },
            off: "offs.y",
            ty: self.load_type(self.wb),
            stage: bsz,
        };
        let zero = |ty: &str| -> String { format!("{ty}()") };
        // Registers of the staged loads: one set per K tile in flight.
        let sets: &[&str] = if t.depth == 2 { &["x", "y"] } else { &[""] };
        for op in [&a_op, &b_op] {
            for set in sets {
                for it in 0..op.rows * op.cols / op.w / wg {
                    let _ = writeln!(s, "    var r{}{set}{it}: {};", op.name, op.ty);
                }
            }
        }
        let conv = self.conv;
        let wgrad = self.wgrad;
        if wgrad {
            // The filter gradient's A (K x M, the windows of x transposed): this
            // invocation's columns m (so its tap and channel) are fixed; each of its rows
            // k = (n, oy, ox) is tracked over the K loop and advanced by BK per tile.
            let per_row = a_op.cols / a_op.w;
            let _ = write!(
                s,
                "    let wm = m0 + (lid % {per_row}u) * {w}u;
    let wmok = wm < p.m;
    let wmm = select(0u, wm, wmok);
    let wc = wmm % p.cg;
    let wt = wmm / p.cg;
    let wdy = i32((wt / p.fs) * p.dh) - i32(p.pt);
    let wdx = i32((wt % p.fs) * p.dw) - i32(p.pl);
    let wsy = {bk}u / p.ow;
    let wsx = {bk}u % p.ow;
",
                w = a_op.w,
                bk = t.bk
            );
            for it in 0..a_op.rows * a_op.cols / a_op.w / wg {
                let _ = write!(
                    s,
                    "    var wk{it} = kb + (lid + {q0}u) / {per_row}u;
    var wox{it} = wk{it} % p.ow;
    var woy{it} = (wk{it} / p.ow) % p.oh;
    var wn{it} = (wk{it} / p.ow / p.oh) * p.xn;
",
                    q0 = it * wg
                );
            }
        } else if conv {
            // The window origin of each A row this invocation stages (fixed over the K loop).
            let per_row = a_op.cols / a_op.w;
            for it in 0..a_op.rows * a_op.cols / a_op.w / wg {
                let _ = write!(
                    s,
                    "    let cm{it} = m0 + (lid + {q0}u) / {per_row}u;
    let cok{it} = cm{it} < p.m;
    let cmm{it} = select(0u, cm{it}, cok{it});
    let cox{it} = cmm{it} % p.ow;
    let coy{it} = (cmm{it} / p.ow) % p.oh;
    let cbase{it} = (cmm{it} / p.ow / p.oh) * p.xn;
    let cy{it} = i32(coy{it}{ys}) - i32({ppt});
    let cx{it} = i32(cox{it}{xs}) - i32({ppl});
",
                    q0 = it * wg,
                    ys = if self.strided { "" } else { " * p.sh" },
                    xs = if self.strided { "" } else { " * p.sw" },
                );
            }
            // The tap (r, s) and channel c of this invocation's columns of the K tile being
            // loaded: the same for every row it stages (the workgroup is a multiple of the
            // row's loads), advanced by BK after each tile's loads (no divisions in the loop).
            let _ = write!(
                s,
                "    let ckc = (lid % {per_row}u) * {w}u;
    var cc = {kc0} % p.cg;
    var cs = ({kc0} / p.cg) % {pfs};
    var cr = ({kc0} / p.cg) / {pfs};
",
                w = a_op.w,
                kc0 = if self.split { "(kb + ckc)" } else { "ckc" },
            );
        }
        // Global -> registers for the K tile starting at `k0`.
        let bwd_input = self.bwd_input;
        let free = t.free;
        let load = |s: &mut String, op: &Op, set: &str| {
            let per_row = op.cols / op.w;
            if bwd_input && op.name == "b" {
                let _ = writeln!(s, "        let btap = {k0} / p.cg;");
            }
            for it in 0..op.rows * op.cols / op.w / wg {
                let n = op.name;
                let (q0, w, z) = (it * wg, op.w, zero(op.ty));
                if wgrad && n == "a" {
                    // Branch-free window load, then the row advanced by BK (ox by BK % OW
                    // with one carry, oy by BK / OW, whole images into n).
                    let _ = write!(
                        s,
                        "        {{
            let iy = i32(woy{it} * p.sh) + wdy;
            let ix = i32(wox{it} * p.sw) + wdx;
            let ok = wmok && wk{it} < kend && iy >= 0 && ix >= 0 && u32(iy) < p.ih && u32(ix) < p.iw;
            let e = select(0u, wn{it} + u32(iy) * p.xh + u32(ix) * p.xw + wc, ok);
            ra{set}{it} = select({z}, a[e / {w}u], ok);
            wk{it} += {bk}u;
            wox{it} += wsx;
            let wrap = wox{it} >= p.ow;
            wox{it} = select(wox{it}, wox{it} - p.ow, wrap);
            woy{it} += wsy + select(0u, 1u, wrap);
            while woy{it} >= p.oh {{
                woy{it} -= p.oh;
                wn{it} += p.xn;
            }}
        }}
",
                        bk = t.bk
                    );
                    continue;
                }
                if conv && n == "a" && self.strided {
                    // The input gradient's window at a stride: the dy position is the tap's
                    // offset divided by the stride where that division is exact.
                    let _ = write!(
                        s,
                        "        {{
            let ty = cy{it} + i32(cr * p.dh);
            let tx = cx{it} + i32(cs * p.dw);
            let qy = u32(ty) / p.sh;
            let qx = u32(tx) / p.sw;
            let ok = cok{it} && {k0} + ckc < {klim} && ty >= 0 && tx >= 0 && qy * p.sh == u32(ty) && qx * p.sw == u32(tx) && qy < p.ih && qx < p.iw;
            let e = select(0u, cbase{it} + qy * p.xh + qx * p.xw + cc, ok);
            ra{set}{it} = select({z}, a[e / {w}u], ok);
        }}
"
                    );
                } else if conv && n == "a" && free == 2 {
                    // Branch-free window load: the row's validity (`cok`) is fixed for the
                    // whole K loop, the tap's rows and columns change once per tap; an
                    // out-of-window element reads element 0 and is replaced by zero.
                    let _ = write!(
                        s,
                        "        {{
            let iy = cy{it} + i32(cr * p.dh);
            let ix = cx{it} + i32(cs * p.dw);
            let ok = cok{it} && {k0} + ckc < {klim} && iy >= 0 && ix >= 0 && u32(iy) < p.ih && u32(ix) < p.iw;
            let e = select(0u, cbase{it} + u32(iy) * p.xh + u32(ix) * p.xw + cc, ok);
            ra{set}{it} = select({z}, a[e / {w}u], ok);
        }}
"
                    );
                } else if conv && n == "a" {
                    let _ = write!(
                        s,
                        "        {{
            ra{set}{it} = {z};
            if cok{it} && {k0} + ckc < {klim} {{
                let iy = cy{it} + i32(cr * p.dh);
                let ix = cx{it} + i32(cs * p.dw);
                if iy >= 0 && ix >= 0 && u32(iy) < p.ih && u32(ix) < p.iw {{
                    let e = cbase{it} + u32(iy) * p.xh + u32(ix) * p.xw + cc;
                    ra{set}{it} = a[e / {w}u];
                }}
            }}
        }}
"
                    );
                }
                if conv && n == "a" {
                    if it + 1 == op.rows * op.cols / op.w / wg {
                        let _ = write!(
                            s,
                            "        cc += {bk}u;
        while cc >= p.cg {{
            cc -= p.cg;
            cs += 1u;
            if cs == {pfs} {{
                cs = 0u;
                cr += 1u;
            }}
        }}
",
                            bk = t.bk
                        );
                    }
                    continue;
                }
                // Conv2DBackpropInput's B: the tap of the tile (k0 / (channels of dy)) picks
                // the filter's [c, kc] matrix, whose row stride (`ld`) is kc.
                let e = if bwd_input && n == "b" {
                    // (Split K takes p.ftap for its K range: c * k elements per tap is N * kc.)
                    if self.phase {
                        // (The phase's sub-filter: tap (j, i) at its own offset.)
                        "ph_fb + (btap / ph_fs) * p.bstr[0].x + (btap % ph_fs) * p.bstr[0].y + gr * p.sb_n + (gc - btap * p.cg)".to_string()
                    } else if self.split {
                        "btap * p.n * p.cg + gr * p.sb_n + (gc - btap * p.cg)".to_string()
                    } else {
                        "btap * p.ftap + gr * p.sb_n + (gc - btap * p.cg)".to_string()
                    }
                } else {
                    format!("{} + gr * {} + gc", op.off, op.ld)
                };
                if free == 2 {
                    // No branch: an out-of-range element reads element 0 (every binding
                    // holds one load's width: the widths divide the contiguous dimension)
                    // and is replaced by zero.
                    let _ = write!(
                        s,
                        "        {{
            let q = lid + {q0}u;
            let gr = {row0} + q / {per_row}u;
            let gc = {col0} + (q % {per_row}u) * {w}u;
            let ok = gr < {rlim} && gc < {clim};
            let e = select(0u, {e}, ok);
            r{n}{set}{it} = select({z}, {n}[e / {w}u], ok);
        }}
",
                        row0 = op.row0,
                        col0 = op.col0,
                        rlim = op.rlim,
                        clim = op.clim,
                    );
                    continue;
                }
                let _ = write!(
                    s,
                    "        {{
            let q = lid + {q0}u;
            let gr = {row0} + q / {per_row}u;
            let gc = {col0} + (q % {per_row}u) * {w}u;
            r{n}{set}{it} = {z};
            if gr < {rlim} && gc < {clim} {{
                let e = {e};
                r{n}{set}{it} = {n}[e / {w}u];
            }}
        }}
",
                    row0 = op.row0,
                    col0 = op.col0,
                    rlim = op.rlim,
                    clim = op.clim,
                );
            }
        };
        // Registers -> workgroup buffer `buf` (halves converted from f32 where needed).
        let input = self.input;
        let smem = t.smem;
        let store = |s: &mut String, op: &Op, set: &str, buf: &str| {
            let per_row = op.cols / op.w;
            let stride = op.cols + PAD;
            for it in 0..op.rows * op.cols / op.w / wg {
                let n = op.name;
                let _ = write!(
                    s,
                    "        {{
            let q = lid + {q0}u;
            let o = {buf} * {stage}u + (q / {per_row}u) * {stride}u + (q % {per_row}u) * {w}u;
",
                    q0 = it * wg,
                    stage = op.stage,
                    w = op.w,
                );
                let v = match (input, op.w) {
                    (Input::F16, _) => format!("r{n}{set}{it}"),
                    (Input::F32, 4) => format!("vec4<f16>(r{n}{set}{it})"),
                    (Input::F32, _) => format!("f16(r{n}{set}{it})"),
                };
                match (smem, op.w) {
                    (Smem::Vec4, 8) => {
                        let _ = write!(
                            s,
                            "            let h = {v};
            s{n}[o / 4u] = vec4<f16>(vec2<f16>(unpack2x16float(h.x)), vec2<f16>(unpack2x16float(h.y)));
            s{n}[o / 4u + 1u] = vec4<f16>(vec2<f16>(unpack2x16float(h.z)), vec2<f16>(unpack2x16float(h.w)));
"
                        );
                    }
                    (Smem::Vec4, 4) => {
                        let _ = writeln!(s, "            s{n}[o / 4u] = {v};");
                    }
                    (Smem::Vec4, _) => {
                        let _ = writeln!(s, "            s{n}[o / 4u][o % 4u] = {v};");
                    }
                    (Smem::Half, 4) => {
                        let _ = write!(
                            s,
                            "            let h = {v};
            s{n}[o] = h.x;
            s{n}[o + 1u] = h.y;
            s{n}[o + 2u] = h.z;
            s{n}[o + 3u] = h.w;
"
                        );
                    }
                    (Smem::Half, _) => {
                        let _ = writeln!(s, "            s{n}[o] = {v};");
                    }
                }
                s.push_str("        }\n");
            }
        };
        // Prologue: K tile 0 into buffer 0 (and, two tiles ahead, tile 1 into registers).
        s.push_str("    {\n        let k0 = 0u;\n");
        if persist {
            s.push_str("        let lm0 = m0;\n");
        }
        load(&mut s, &a_op, sets[0]);
        load(&mut s, &b_op, sets[0]);
        store(&mut s, &a_op, sets[0], "0u");
        store(&mut s, &b_op, sets[0], "0u");
        s.push_str("    }\n");
        // Products of the buffer `cur` (offsets in units of the workgroup arrays).
        let products = |s: &mut String, cur: &str| {
            let _ = writeln!(
                s,
                "        let abase = {cur} * {ab}u;\n        let bbase = {cur} * {bb}u;\n        let sa_stride = {sas}u;\n        let sb_stride = {sbs}u;",
                ab = asz / unit,
                bb = bsz / unit,
                sas = sa_stride / unit,
                sbs = sb_stride / unit,
            );
            for kk in 0..t.bk / 16 {
                let k = kk * 16;
                for i in 0..tm {
                    let (off, f) = if self.a_kfast {
                        (
                            format!("((sg_row + {}u) * {sa_stride}u + {k}u) / {unit}u", i * 16),
                            "coopLoadT",
                        )
                    } else {
                        (
                            format!("({}u + sg_row + {}u) / {unit}u", k * sa_stride, i * 16),
                            "coopLoad",
                        )
                    };
                    let _ = writeln!(s, "        let ia{kk}_{i} = abase + {off};");
                    if !emu {
                        let _ = writeln!(
                            s,
                            "        let fa{kk}_{i} = {f}<coop_mat16x16<f16, A>>(&sa[ia{kk}_{i}], sa_stride);"
                        );
                    }
                }
                for j in 0..tn {
                    let (off, f) = if self.b_nfast {
                        (
                            format!("({}u + sg_col + {}u) / {unit}u", k * sb_stride, j * 16),
                            "coopLoadT",
                        )
                    } else {
                        (
                            format!("((sg_col + {}u) * {sb_stride}u + {k}u) / {unit}u", j * 16),
                            "coopLoad",
                        )
                    };
                    let _ = writeln!(s, "        let ib{kk}_{j} = bbase + {off};");
                    if !emu {
                        let _ = writeln!(
                            s,
                            "        let fb{kk}_{j} = {f}<coop_mat16x16<f16, B>>(&sb[ib{kk}_{j}], sb_stride);"
                        );
                    }
                }
                for i in 0..tm {
                    for j in 0..tn {
                        if emu {
                            let _ = writeln!(
                                s,
                                "        emu_mma(&acc_{i}_{j}, ia{kk}_{i}, ib{kk}_{j}, lane);"
                            );
                        } else {
                            let _ = writeln!(
                                s,
                                "        acc_{i}_{j} = coopMultiplyAdd(fa{kk}_{i}, fb{kk}_{j}, acc_{i}_{j});"
                            );
                        }
                    }
                }
            }
        };
        if t.depth == 0 {
            // Late staging: the products of the one buffer, a barrier (every subgroup done
            // reading it), then the next tile's loads stored at once (no staged value lives
            // across the products), a barrier.
            let _ = write!(
                s,
                "    workgroupBarrier();
    for (var t = 0u; t < ntiles; t += 1u) {{
        let more = t + 1u < ntiles;
"
            );
            products(&mut s, "0u");
            let _ = write!(
                s,
                "        workgroupBarrier();
        if more {{
            let k0 = (t + 1u) * {bk}u;
",
                bk = t.bk
            );
            load(&mut s, &a_op, "");
            load(&mut s, &b_op, "");
            store(&mut s, &a_op, "", "0u");
            store(&mut s, &b_op, "", "0u");
            s.push_str("        }\n        workgroupBarrier();\n    }\n");
        } else if t.depth == 1 {
            // With `free`, the staging of the tile after the last one runs too (its loads
            // are past K: zeros; its stores go to a buffer no product reads any more).
            if persist {
                // (The walk over M tiles; `pw`: the last K tile, whose loads fetch the next
                // M tile's first one, stored after the epilogue.)
                s.push_str("    loop {\n");
            }
            let _ = write!(
                s,
                "    workgroupBarrier();
    for (var t = 0u; t < ntiles; t += 1u) {{
        let cur = {cur};
{cond}{{
            {k0}
",
                cur = if t.nbuf == 2 { "t & 1u" } else { "0u" },
                cond = if persist {
                    "        let pw = t + 1u >= ntiles;\n        "
                } else if t.free > 0 {
                    "        "
                } else {
                    "        let more = t + 1u < ntiles;\n        if more "
                },
                k0 = if persist {
                    format!(
                        "let k0 = select((t + 1u) * {bk}u, 0u, pw);\n            let lm0 = select(m0, m0n, pw);",
                        bk = t.bk
                    )
                } else {
                    format!("let k0 = (t + 1u) * {}u;", t.bk)
                },
            );
            load(&mut s, &a_op, "");
            load(&mut s, &b_op, "");
            s.push_str("        }\n");
            products(&mut s, "cur");
            // Two buffers: the next tile goes to the other one (read last before the
            // previous barrier); one buffer: after every subgroup's products.
            let next = if t.nbuf == 2 {
                "(1u - cur)"
            } else {
                s.push_str("        workgroupBarrier();\n");
                "0u"
            };
            s.push_str(if persist {
                "        if !pw {\n"
            } else if t.free > 0 {
                "        {\n"
            } else {
                "        if more {\n"
            });
            store(&mut s, &a_op, "", next);
            store(&mut s, &b_op, "", next);
            s.push_str("        }\n        workgroupBarrier();\n    }\n");
        } else {
            // Tile j's loads go to register set j % 2 and its products use buffer j % 2;
            // the loop is unrolled by 2 so that both are fixed in each half. The halves
            // are unconditional (naga wants cooperative operations in uniform control
            // flow, and a condition on the loop counter is not uniform to it): an odd
            // count of K tiles gets one more, beyond K, which is staged as zeros.
            let _ = write!(
                s,
                "    let ntiles2 = (ntiles + 1u) & ~1u;
    if ntiles2 > 1u {{
        let k0 = {bk}u;
",
                bk = t.bk
            );
            load(&mut s, &a_op, "y");
            load(&mut s, &b_op, "y");
            s.push_str(
                "    }\n    workgroupBarrier();\n    for (var t = 0u; t < ntiles2; t += 2u) {\n",
            );
            for (half, (ld, st)) in [("x", "y"), ("y", "x")].into_iter().enumerate() {
                let _ = write!(
                    s,
                    "    {{
        let tt = t + {half}u;
        if tt + 2u < ntiles2 {{
            let k0 = (tt + 2u) * {bk}u;
",
                    bk = t.bk
                );
                load(&mut s, &a_op, ld);
                load(&mut s, &b_op, ld);
                s.push_str("        }\n");
                products(&mut s, if half == 0 { "0u" } else { "1u" });
                let next = if half == 0 { "1u" } else { "0u" };
                s.push_str("        if tt + 1u < ntiles2 {\n");
                store(&mut s, &a_op, st, next);
                store(&mut s, &b_op, st, next);
                s.push_str("        }\n        workgroupBarrier();\n    }\n");
            }
            s.push_str("    }\n");
        }
        // Epilogue: each accumulator through the subgroup's 16 x 16 f32 scratch.
        let _ = writeln!(
            s,
            "    let cbase = {};\n    let sc_base = {} * 256u;\n    let sc_stride = 16u;",
            if self.phase {
                "0u"
            } else if self.split {
                // (Split K: slice bidx of p.bstr[0].y rows from row p.bstr[0].x on.)
                "bidx * p.bstr[0].y * p.n"
            } else {
                "bidx * p.m * p.n"
            },
            if self.scratch_slots() == t.subgroups() {
                "sg".to_string()
            } else {
                format!("(sg % {}u)", self.scratch_slots())
            }
        );
        let conv_out = match self.input {
            Input::F16 if !self.out_f32 => "f16",
            _ => "",
        };
        // With fewer scratch slots than subgroups, the subgroups take turns (`rounds`),
        // each turn between workgroup barriers (in uniform control flow; the cooperative
        // store under a condition on the subgroup index is uniform within the subgroup).
        let slots = self.scratch_slots();
        let rounds = t.subgroups() / slots;
        // The output row of product row gm: gm itself, or (phase) its dx row.
        let (prow, orow) = if self.phase {
            (
                "
            let pq = gm % (p.oh * p.ow);
            let prow = (gm / (p.oh * p.ow)) * p.astr[0].w * p.astr[0].z + (ph_py + (pq / p.ow) * p.astr[0].x) * p.astr[0].z + ph_px + (pq % p.ow) * p.astr[0].y;",
                "prow",
            )
        } else if self.split {
            ("", "(gm - p.bstr[0].x)")
        } else {
            ("", "gm")
        };
        // Phase products with p.bstr[0].w set: the other phases of this row's (n, Y, X) have
        // no taps, and this one writes their zeros too (dx rows py' + Y * sh below the height,
        // columns px' + X * sw below the width).
        let zfill = |idx: &str, zero: &str| -> String {
            if !self.phase {
                return String::new();
            }
            format!(
                "
            if p.bstr[0].w != 0u {{
                let zimg = (gm / (p.oh * p.ow)) * p.astr[0].w * p.astr[0].z;
                let zy = (pq / p.ow) * p.astr[0].x;
                let zx = (pq % p.ow) * p.astr[0].y;
                for (var qy = 0u; qy < p.astr[0].x; qy += 1u) {{
                    for (var qx = 0u; qx < p.astr[0].y; qx += 1u) {{
                        let yy = zy + qy;
                        let xx = zx + qx;
                        if (qy != ph_py || qx != ph_px) && yy < p.astr[0].w && xx < p.astr[0].z {{
                            let zrow = zimg + yy * p.astr[0].z + xx;
                            c[{idx}] = {zero};
                        }}
                    }}
                }}
            }}"
            )
        };
        // The epilogue's passes: `Out` the accumulators to C (`c`; split K: the slice of
        // `cbase`), `Partial` (`sum_last`) to this workgroup's float32 slice of `part`,
        // `Whole` (`head_tail`'s head) to C's rows.
        #[derive(Clone, Copy, PartialEq)]
        enum Pass {
            Out,
            Partial,
            Whole,
        }
        let out_vw = self.sum_group();
        let epilogue = |s: &mut String, pass: Pass| {
            let (target, base, vw, orow) = match pass {
                Pass::Out => ("c", "cbase", out_vw, orow),
                Pass::Partial => ("part", "pbase", 4, orow),
                Pass::Whole => ("c", "0u", out_vw, "gm"),
            };
            for i in 0..tm {
                for j in 0..tn {
                    for r in 0..rounds {
                        let (open, close) = if rounds > 1 {
                            (format!("    if sg / {slots}u == {r}u {{\n"), "    }\n")
                        } else {
                            (String::new(), "")
                        };
                        s.push_str(&open);
                        if emu {
                            let _ = write!(
                                s,
                                "    for (var q = 0u; q < {per}u; q += 1u) {{
        sc[sc_base + lane + q * {lanes}u] = acc_{i}_{j}[q];
    }}
",
                                per = 256 / self.lanes,
                                lanes = self.lanes
                            );
                        } else {
                            let _ = writeln!(
                                s,
                                "    coopStoreT(acc_{i}_{j}, &sc[sc_base], sc_stride);"
                            );
                        }
                        s.push_str(close);
                        s.push_str("    workgroupBarrier();\n");
                        s.push_str(&open);
                        if self.vout {
                            // 8 halves (or 4 floats) of one row per store.
                            let sv = |q: u32| format!("sc[o + {q}u]");
                            let pack = if vw == 8 {
                                format!(
                                    "vec4<u32>(pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})))",
                                    sv(0),
                                    sv(1),
                                    sv(2),
                                    sv(3),
                                    sv(4),
                                    sv(5),
                                    sv(6),
                                    sv(7)
                                )
                            } else {
                                format!("vec4<f32>({}, {}, {}, {})", sv(0), sv(1), sv(2), sv(3))
                            };
                            let _ = write!(
                                s,
                                "    for (var e = lane; e < {pieces}u; e += {lanes}u) {{
        let row = e / {per_row}u;
        let col = (e % {per_row}u) * {vw}u;
        let gm = m0 + sg_row + {r0}u + row;
        let gn = n0 + sg_col + {c0}u + col;
        if gm < p.m && gn < p.n {{
            let o = sc_base + row * 16u + col;{prow}
            {target}[({base} + {orow} * p.n + gn) / {vw}u] = {pack};{zf}
        }}
    }}
",
                                pieces = 256 / vw,
                                per_row = 16 / vw,
                                lanes = self.lanes,
                                r0 = i * 16,
                                c0 = j * 16,
                                prow = prow,
                                zf = zfill(
                                    &format!("(cbase + zrow * p.n + gn) / {vw}u"),
                                    &format!("{}()", out_ty)
                                ),
                            );
                            s.push_str(close);
                            s.push_str("    workgroupBarrier();\n");
                            continue;
                        }
                        // (`sum_last` has the vector epilogue: `is_valid`.)
                        let _ = write!(
                            s,
                            "    for (var e = lane; e < 256u; e += {lanes}u) {{
        let gm = m0 + sg_row + {r0}u + e / 16u;
        let gn = n0 + sg_col + {c0}u + e % 16u;
        if gm < p.m && gn < p.n {{{prow}
            c[cbase + {orow} * p.n + gn] = {conv_out}(sc[sc_base + e]);{zf}
        }}
    }}
",
                            lanes = self.lanes,
                            r0 = i * 16,
                            c0 = j * 16,
                            prow = prow,
                            zf = zfill("cbase + zrow * p.n + gn", &format!("{}()", out_ty)),
                        );
                        s.push_str(close);
                        s.push_str("    workgroupBarrier();\n");
                    }
                }
            }
        };
        if self.sum_last {
            // Own partial out, a device-scope barrier (release), the arrival; the last
            // workgroup of the tile resets its counter and (acquire) adds up the tile's
            // slices in split order: GROUPS runs of `sum_group` floats per invocation, whose
            // loads of one split are independent (in flight together).
            let gw = self.sum_group();
            let per_row = t.bn / gw;
            let groups = t.bm * t.bn / (gw * wg);
            let _ = write!(
                s,
                "    let pbase = bidx * p.bstr[0].y * p.n;
    let sl_tile = (p.tile_base_y + tile.y) * ((p.n + {bn}u - 1u) / {bn}u) + p.tile_base_x + tile.x;
",
                bn = t.bn
            );
            if self.head_tail || self.stream_k {
                s.push_str("    if ht_whole {\n");
                epilogue(&mut s, Pass::Whole);
                s.push_str("    } else {\n");
            }
            epilogue(&mut s, Pass::Partial);
            // (The arrivals that complete the tile: the splits, or under stream-K the
            // workgroups that cover the tile.)
            let target = if self.stream_k { "sk_n" } else { "p.bstr[0].z" };
            s.push_str(
                &"    storageBarrier();
    if lid == 0u {
        sl_old = atomicAdd(&arrivals[sl_tile], 1u);
    }
    if workgroupUniformLoad(&sl_old) + 1u == {target} {
        storageBarrier();
        if lid == 0u {
            atomicStore(&arrivals[sl_tile], 0u);
        }
        let sl_slice = p.bstr[0].y * p.n / 4u;
"
                .replace("{target}", target),
            );
            let vecs = gw / 4;
            for g in 0..groups {
                let _ = write!(
                    s,
                    "        let sl_e{g} = lid + {off}u;
        let sl_gm{g} = m0 + sl_e{g} / {per_row}u;
        let sl_gn{g} = n0 + (sl_e{g} % {per_row}u) * {gw}u;
        let sl_ok{g} = sl_gm{g} < p.m && sl_gn{g} < p.n;
        let sl_i{g} = select(0u, ((sl_gm{g} - p.bstr[0].x) * p.n + sl_gn{g}) / 4u, sl_ok{g});
",
                    off = g * wg
                );
                for v in 0..vecs {
                    let _ = writeln!(s, "        var sl_s{g}_{v} = vec4<f32>();");
                }
            }
            let _ = write!(
                s,
                "        for (var z = 0u; z < {target}; z += 1u) {{\n            let zb = z * sl_slice;\n"
            );
            for g in 0..groups {
                for v in 0..vecs {
                    let _ = writeln!(s, "            sl_s{g}_{v} += part[zb + sl_i{g} + {v}u];");
                }
            }
            s.push_str("        }\n");
            for g in 0..groups {
                let val = if gw == 8 {
                    format!(
                        "vec4<u32>(pack2x16float(sl_s{g}_0.xy), pack2x16float(sl_s{g}_0.zw), pack2x16float(sl_s{g}_1.xy), pack2x16float(sl_s{g}_1.zw))"
                    )
                } else {
                    format!("sl_s{g}_0")
                };
                let _ = write!(
                    s,
                    "        if sl_ok{g} {{
            c[(sl_gm{g} * p.n + sl_gn{g}) / {gw}u] = {val};
        }}
"
                );
            }
            s.push_str("    }\n");
            if self.head_tail || self.stream_k {
                s.push_str("    }\n");
            }
        } else {
            epilogue(&mut s, Pass::Out);
        }
        if persist {
            // The next M tile's first K tile, loaded before the products, to buffer 0 now
            // that every subgroup is past the products (the epilogue's last barrier); then
            // the next tile, with cleared accumulators.
            s.push_str("    workgroupBarrier();\n    {\n");
            store(&mut s, &a_op, "", "0u");
            store(&mut s, &b_op, "", "0u");
            s.push_str("    }\n    m0 = m0n;\n    m0n += mstep;\n    if m0 >= mend {\n        break;\n    }\n");
            for i in 0..tm {
                for j in 0..tn {
                    let _ = writeln!(s, "    acc_{i}_{j} = {acc_zero};");
                }
            }
            s.push_str("    }\n");
        }
        if self.stream_k {
            // The next segment (the workgroup arrays and `sl_old` are reused).
            s.push_str("    sk_it = sk_stop;\n    workgroupBarrier();\n    }\n");
        }
        s.push_str("}\n");
        s
    }
}

/// The subgroup size the cooperative-matrix kernels can use on this device, if the device
/// has everything they need: the experimental feature with the 16x16x16 f16 -> f32
/// configuration listed by the adapter, `SHADER_F16`, and subgroups of one fixed size.
pub fn coop_lanes(ctx: &KernelContext) -> Option<u32> {
    lanes_of(ctx.features(), &ctx.dev.desc)
}

/// The environment variable that runs the cooperative kernels in their emulated form
/// (`CoopSpec::emulate`) on any device with `SHADER_F16`: for tests on lavapipe.
pub const EMULATE_VAR: &str = "TFWGPU_COOP_EMULATE";

/// Whether `TFWGPU_COOP_EMULATE=1` was set (read once per process).
pub fn emulation_requested() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(EMULATE_VAR).is_ok_and(|v| v.trim() == "1"))
}

/// The subgroup size and form of the cooperative kernels on this device: the emulated form
/// with subgroups of 32 where `TFWGPU_COOP_EMULATE=1` is set (and the device has
/// `SHADER_F16`), else [`coop_lanes`] with real cooperative matrices.
pub(crate) fn coop_mode(ctx: &KernelContext) -> Option<(u32, bool)> {
    if emulation_requested() {
        return ctx
            .features()
            .contains(wgpu::Features::SHADER_F16)
            .then_some((32, true));
    }
    coop_lanes(ctx).map(|l| (l, false))
}

/// Whether `dev` runs float16 MatMul on cooperative matrices ([`coop_lanes`]).
pub fn device_supports(dev: &crate::Device) -> bool {
    lanes_of(dev.features(), dev.description()).is_some()
}

fn lanes_of(features: wgpu::Features, d: &crate::AdapterDescription) -> Option<u32> {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    (features.contains(needed)
        && has_f16_config(&d.cooperative_matrix)
        && d.subgroup_min_size == d.subgroup_max_size
        && [16, 32, 64].contains(&d.subgroup_min_size))
    .then_some(d.subgroup_min_size)
}

/// Whether the 16x16x16 f16 x f16 -> f32 configuration is listed.
pub fn has_f16_config(props: &[wgpu::CooperativeMatrixProperties]) -> bool {
    props.iter().any(|p| {
        p.m_size == 16
            && p.n_size == 16
            && p.k_size == 16
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    })
}

/// The tile for `batches` products of M x N with `input` operands (measured on the H200,
/// NOTES-coop.md, v4):
/// - M or N at most 64: 64 x 64 (`c64x64x32_2x2v`; Conv2D with 64 channels);
/// - float16, at least 128 tiles of 128 x 128: `c128x128x64_2x4wg1f` (16-byte loads, K tiles
///   of 64 in one buffer, no branch around the staging: 196 TFLOP/s at 4096 against 152 for
///   v3's `c128x128x64_2x4vg1`; 179 at 2048);
/// - float16, fewer (1024^2: 64 tiles for 132 SMs): `c64x64x64_2x2w1fs` (64 x 64, 16-byte
///   loads through `select`, K 64 in one buffer: 93 TFLOP/s at 1024 against 69 for v3's
///   `c64x64x32_2x2w2`);
/// - float32 opt-in: `c128x128x32_2x4vg` (the K-64 tiles' float32 staging registers were
///   not measured; 16-byte loads are for float16 only).
pub fn choose_tile(input: Input, batches: usize, m: usize, n: usize) -> CoopTile {
    if n <= 64 || m <= 64 {
        return COOP_64X64_2X2V;
    }
    if input == Input::F32 {
        return COOP_128X128_2X4VG;
    }
    let tiles = batches
        .saturating_mul(m.div_ceil(128))
        .saturating_mul(n.div_ceil(128));
    if tiles < 128 {
        COOP_64X64X64_2X2W1FS
    } else {
        COOP_128X128X64_2X4WG1F
    }
}

/// `_tfwgpu_tile` value that forces the fallback (float32) kernels with their own choice.
pub const NO_COOP: &str = "nocoop";

/// A MatMul whose float16 (or opted-in float32) products run on cooperative matrices where
/// the device has them, and in `fallback` (the float32 kernels) elsewhere.
pub(super) struct CoopMatMul {
    geom: MatMul,
    input: Input,
    /// `_tfwgpu_tile`: a cooperative tile name forces it; any other value the fallback.
    tile: Option<String>,
    fallback: Box<dyn Kernel>,
}

/// The kernel for `variant`: the cooperative-matrix wrapper around `fallback(attrs)` for
/// float16 (and float32 with `TFWGPU_ALLOW_REDUCED_PRECISION=1`), `fallback(attrs)` itself
/// for the other types.
pub(super) fn build(variant: Variant, attrs: &Attrs, fallback: Factory) -> Result<Box<dyn Kernel>> {
    let type_attr = match variant {
        Variant::BatchMatMulV3 => "Ta",
        _ => "T",
    };
    let input = match attrs.dtype_opt(type_attr)? {
        Some(DType::F16) => Input::F16,
        Some(DType::F32) if reduced_precision_allowed() => Input::F32,
        _ => return fallback(attrs),
    };
    let tile = match attrs.get("_tfwgpu_tile") {
        Some(AttrValue::Str(s)) => Some(s.clone()),
        _ => None,
    };
    // The geometry (shapes, flags) is MatMul's own; validate the other attributes as float32.
    let mut f32_attrs = attrs.clone();
    for a in ["T", "Ta", "Tb", "Tout"] {
        if attrs.get(a).is_some() {
            f32_attrs.set(a, AttrValue::Type(DType::F32));
        }
    }
    let geom = MatMul::new(variant, &f32_attrs)?;
    let fallback = if tile.as_deref() == Some(NO_COOP)
        || COOP_TILES.iter().any(|t| Some(t.name) == tile.as_deref())
    {
        // A cooperative tile (or "nocoop") is no tile of the fallback: it chooses its own.
        let mut a = Attrs::new();
        for (k, v) in attrs.iter().filter(|(k, _)| *k != "_tfwgpu_tile") {
            a.set(k, v.clone());
        }
        fallback(&a)?
    } else {
        fallback(attrs)?
    };
    Ok(Box::new(CoopMatMul {
        geom,
        input,
        tile,
        fallback,
    }))
}

/// `desc` as float32 (for MatMul's shape checks).
fn as_f32(r: &DeviceRef) -> DeviceRef {
    DeviceRef {
        desc: TensorDesc::new(DType::F32, &r.desc.shape),
        addr: r.addr,
    }
}

impl Kernel for CoopMatMul {
    fn op(&self) -> &'static str {
        self.fallback.op()
    }

    fn outputs(&self, inputs: &[Operand]) -> Result<Vec<TensorDesc>> {
        self.fallback.outputs(inputs)
    }

    fn record(&self, ctx: &KernelContext, inputs: &[Operand], outputs: &[DeviceRef]) -> Result<()> {
        let op = self.geom.variant.name();
        let want = match self.input {
            Input::F16 => DType::F16,
            Input::F32 => DType::F32,
        };
        let forced = self
            .tile
            .as_deref()
            .and_then(|n| COOP_TILES.iter().find(|t| t.name == n));
        let mode = coop_mode(ctx);
        let dtypes_ok = inputs.len() == 2 && inputs.iter().all(|i| i.dtype() == want);
        if mode.is_none() || !dtypes_ok || (self.tile.is_some() && forced.is_none()) {
            // (A non-cooperative `_tfwgpu_tile` went to the fallback, which applies it.)
            if forced.is_some() {
                return Err(Error::Unimplemented(format!(
                    "{op}: _tfwgpu_tile {:?} needs cooperative matrices (16x16x16 f16 -> f32), \
                     SHADER_F16 and subgroups of a fixed size",
                    self.tile.as_deref().unwrap_or_default()
                )));
            }
            return self.fallback.record(ctx, inputs, outputs);
        }
        let (lanes, emulate) = mode.unwrap_or((32, false));
        let (a_ref, b_ref) = (inputs[0].device(op, 0)?, inputs[1].device(op, 1)?);
        let (a32, b32) = (as_f32(a_ref), as_f32(b_ref));
        let g = self
            .geom
            .geometry(&[Operand::Device(&a32), Operand::Device(&b32)])?;
        let out = &outputs[0];
        if out.desc.num_elements() == 0 {
            return Ok(());
        }
        let dims = batch_dims(&g);
        let batches: usize = g.batch.iter().product();
        let (ta, tb) = (self.geom.ta, self.geom.tb);
        let (a_len, b_len) = (if ta { g.m } else { g.k }, if tb { g.k } else { g.n });
        let tile = forced
            .copied()
            .unwrap_or_else(|| choose_tile(self.input, batches, g.m, g.n));
        let spec = CoopSpec {
            tile,
            lanes,
            a_kfast: !ta,
            b_nfast: !tb,
            wa: load_width(self.input, &tile, a_len),
            wb: load_width(self.input, &tile, b_len),
            input: self.input,
            conv: false,
            bwd_input: false,
            wgrad: false,
            split: false,
            out_f32: false,
            strided: false,
            phase: false,
            vout: false,
            sum_last: false,
            head_tail: false,
            stream_k: false,
            emulate,
        };
        if g.k == 0 || dims.len() > MAX_BATCH_DIMS || !fits(ctx, &spec) {
            if forced.is_some() && g.k != 0 {
                return Err(Error::Unimplemented(format!(
                    "{op}: cooperative tile {} does not apply here ({spec:?})",
                    tile.name
                )));
            }
            return self.fallback.record(ctx, inputs, outputs);
        }
        tracing::debug!("{op} {}x{}x{} x{batches}: cooperative", g.m, g.n, g.k);
        let (sa_m, sa_k) = if ta { (1, g.m) } else { (g.k, 1) };
        let (sb_k, sb_n) = if tb { (1, g.k) } else { (g.n, 1) };
        let l = Launch {
            m: g.m,
            n: g.n,
            k: g.k,
            batches,
            strides: [sa_m, sa_k, sb_k, sb_n],
            dims,
            conv: [0; 16],
            aux: [0; 24],
            row_tiles: None,
        };
        launch(ctx, op, &spec, &l, a_ref, b_ref, out)
    }
}

/// Whether `spec` is valid and fits the device's workgroup limits.
pub(crate) fn fits(ctx: &KernelContext, spec: &CoopSpec) -> bool {
    spec.is_valid()
        && spec.shared_bytes() <= ctx.limits().max_compute_workgroup_storage_size
        && spec.threads() <= ctx.limits().max_compute_invocations_per_workgroup
}

/// The sizes of one cooperative product (or convolution).
pub(crate) struct Launch {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batches: usize,
    /// Strides of A (M, K) and B (K, N) as stored.
    pub strides: [usize; 4],
    /// Merged batch dimensions: (size, A stride, B stride).
    pub dims: Vec<(usize, usize, usize)>,
    /// The convolution fields of the params (`COOP_COMMON_WGSL`).
    pub conv: [usize; 16],
    /// Strided input gradients by phase (`CoopSpec::phase`): the words of p.bdims, p.astr
    /// and p.bstr (no batch dimensions there).
    pub aux: [u32; 24],
    /// Only tile rows [start, start + count) of C (None: all).
    pub row_tiles: Option<(usize, usize)>,
}

/// Records the dispatches of `spec` for `l`: C (`out`, M x N per batch) = A x B.
pub(crate) fn launch(
    ctx: &KernelContext,
    op: &str,
    spec: &CoopSpec,
    l: &Launch,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    launch_with(ctx, op, spec, l, a_ref, b_ref, out, &[])
}

/// `launch` with bindings after C (`CoopSpec::sum_last`: the partial slices and the arrival
/// counters).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_with(
    ctx: &KernelContext,
    op: &str,
    spec: &CoopSpec,
    l: &Launch,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
    extra: &[&DeviceRef],
) -> Result<()> {
    for r in [a_ref, b_ref, out] {
        to_u32(op, r.desc.num_elements())?;
    }
    if spec.input == Input::F32 {
        log_reduced_precision();
    }
    // Bounds checks are off: global reads happen only for rows and columns below the
    // operand's limits (vector loads lie wholly inside one stored row, the widths dividing
    // the contiguous dimension; convolution windows are checked against the input's height
    // and width), at batch offsets of batch indices below the grid's count; stores only for
    // gm < M, gn < N; workgroup arrays are indexed below their sizes by construction
    // (`CoopSpec::is_valid`).
    let dtype = match spec.input {
        Input::F16 => DType::F16,
        Input::F32 => DType::F32,
    };
    let pipeline = ctx.pipeline(
        PipelineKey::new("matmul_coop", Some(dtype), spec.specialization()),
        || {
            let mut src = ShaderSource::new(spec.wgsl());
            src.checks = Checks::Trusted;
            src
        },
    )?;
    // Bindings rounded up to whole words (f16 tensors; allocations are padded); for 16-byte
    // loads the tensor's size is a multiple of 16 already.
    let bind = |r: &DeviceRef| ctx.bind_bytes(r.addr, r.desc.byte_size().next_multiple_of(4));
    let (a, b, c) = (bind(a_ref)?, bind(b_ref)?, bind(out)?);
    let mut bindings = vec![a, b, c];
    for r in extra {
        bindings.push(bind(r)?);
    }
    let mut bdims = [0u32; MAX_BATCH_DIMS];
    let mut astr = [0u32; MAX_BATCH_DIMS];
    let mut bstr = [0u32; MAX_BATCH_DIMS];
    for (i, &(size, sa, sb)) in l.dims.iter().enumerate() {
        bdims[i] = to_u32(op, size)?;
        astr[i] = to_u32(op, sa)?;
        bstr[i] = to_u32(op, sb)?;
    }
    if spec.phase {
        bdims.copy_from_slice(&l.aux[..MAX_BATCH_DIMS]);
        astr.copy_from_slice(&l.aux[MAX_BATCH_DIMS..2 * MAX_BATCH_DIMS]);
        bstr.copy_from_slice(&l.aux[2 * MAX_BATCH_DIMS..]);
    }
    let conv: Vec<u32> = l
        .conv
        .iter()
        .map(|&v| to_u32(op, v))
        .collect::<Result<_>>()?;
    let tiles_x = l.n.div_ceil(spec.tile.bn as usize);
    let (ty0, tiles_y) = l
        .row_tiles
        .unwrap_or((0, l.m.div_ceil(spec.tile.bm as usize)));
    if spec.split {
        // The rows of C this launch writes (the split slices hold only those).
        let bm = spec.tile.bm as usize;
        bstr[0] = to_u32(op, ty0 * bm)?;
        bstr[1] = to_u32(op, ((ty0 + tiles_y) * bm).min(l.m).saturating_sub(ty0 * bm))?;
        // (`sum_last`: the number of splits, the arrivals that complete a tile.)
        bstr[2] = to_u32(op, l.batches)?;
    }
    if spec.head_tail || spec.stream_k {
        // One 1-D launch: the head's ty0 tile rows whole, then the tail's tiles x splits;
        // stream-K: l.batches workgroups over every tile's K tiles (the iteration counts,
        // times the workgroups, within u32: the shader's division).
        let head = ty0 * tiles_x;
        let gx = if spec.stream_k {
            let iters = tiles_y * tiles_x * l.k.div_ceil(spec.tile.bk as usize);
            if ty0 != 0 || l.batches == 0 || (iters + 1) * l.batches > u32::MAX as usize {
                return Err(crate::Error::InvalidArgument(format!(
                    "{op}: stream-K over {iters} iterations in {} workgroups",
                    l.batches
                )));
            }
            l.batches
        } else {
            head + tiles_y * tiles_x * l.batches
        };
        bstr[3] = to_u32(op, if spec.stream_k { gx } else { head })?;
        if gx > MAX_GROUPS_X as usize {
            return Err(crate::Error::InvalidArgument(format!(
                "{op}: {gx} workgroups in one head/tail launch"
            )));
        }
        let mut words = vec![
            to_u32(op, l.m)?,
            to_u32(op, l.n)?,
            to_u32(op, l.k)?,
            0,
            to_u32(op, l.strides[0])?,
            to_u32(op, l.strides[1])?,
            to_u32(op, l.strides[2])?,
            to_u32(op, l.strides[3])?,
            spec.a_kfast as u32,
            spec.b_nfast as u32,
            l.dims.len() as u32,
            0,
            0,
            gx as u32,
            1,
            0,
        ];
        words.extend_from_slice(&bdims);
        words.extend_from_slice(&astr);
        words.extend_from_slice(&bstr);
        words.extend_from_slice(&conv);
        return ctx.dispatch(&pipeline, &params(&words), &bindings, [gx as u32, 1, 1]);
    }
    let max = MAX_GROUPS_X as usize;
    for z0 in (0..l.batches).step_by(max) {
        let gz = (l.batches - z0).min(max);
        for y0 in (0..tiles_y).step_by(max) {
            let gy = (tiles_y - y0).min(max);
            for x0 in (0..tiles_x).step_by(max) {
                let gx = (tiles_x - x0).min(max);
                // Persistent: at most the wave's workgroups (over all N tiles and batches of
                // this dispatch) on its gy tile rows (p._pad1), each walking every
                // launched-th one.
                let launched = if spec.persists() {
                    gy.min((persist_wave() / (gx * gz)).max(1))
                } else {
                    gy
                };
                let mut words = vec![
                    to_u32(op, l.m)?,
                    to_u32(op, l.n)?,
                    to_u32(op, l.k)?,
                    z0 as u32,
                    to_u32(op, l.strides[0])?,
                    to_u32(op, l.strides[1])?,
                    to_u32(op, l.strides[2])?,
                    to_u32(op, l.strides[3])?,
                    spec.a_kfast as u32,
                    spec.b_nfast as u32,
                    l.dims.len() as u32,
                    x0 as u32,
                    (ty0 + y0) as u32,
                    gx as u32,
                    gy as u32,
                    0,
                ];
                words.extend_from_slice(&bdims);
                words.extend_from_slice(&astr);
                words.extend_from_slice(&bstr);
                words.extend_from_slice(&conv);
                ctx.dispatch(
                    &pipeline,
                    &params(&words),
                    &bindings,
                    [gx as u32, launched as u32, gz as u32],
                )?;
            }
        }
    }
    Ok(())
}

/// Every shader variant the kernel can generate for subgroups of `lanes` (for offline
/// validation): each tile, layout, load width and input type.
pub fn all_specs(lanes: u32) -> Vec<CoopSpec> {
    let mut v = vec![];
    for &tile in COOP_TILES {
        for input in [Input::F16, Input::F32] {
            let widths: &[u32] = &[8, 4, 1];
            for (a_kfast, b_nfast) in [(true, true), (false, false), (true, false), (false, true)] {
                for &wa in widths {
                    for &wb in widths {
                        let s = CoopSpec {
                            tile,
                            lanes,
                            a_kfast,
                            b_nfast,
                            wa,
                            wb,
                            input,
                            conv: false,
                            bwd_input: false,
                            wgrad: false,
                            split: false,
                            out_f32: false,
                            strided: false,
                            phase: false,
                            vout: false,
                            sum_last: false,
                            head_tail: false,
                            stream_k: false,
                            emulate: false,
                        };
                        // Products, Conv2D forward, backprop input; split-K products and the
                        // filter gradient, with float32 partial sums or the output type.
                        for (conv, bwd_input, wgrad, split) in [
                            (false, false, false, false),
                            (true, false, false, false),
                            (true, true, false, false),
                            (false, false, false, true),
                            (true, false, false, true),
                            (true, true, false, true),
                            (true, false, true, true),
                        ] {
                            // (Strided input gradients, with and without split K.)
                            if bwd_input {
                                let st = CoopSpec {
                                    conv,
                                    bwd_input,
                                    split,
                                    out_f32: split,
                                    strided: true,
                                    vout: true,
                                    sum_last: false,
                                    head_tail: false,
                                    stream_k: false,
                                    ..s
                                };
                                if st.is_valid() {
                                    v.push(st);
                                }
                                // (One phase of a strided input gradient.)
                                let ph = CoopSpec {
                                    conv,
                                    bwd_input,
                                    phase: true,
                                    vout: true,
                                    sum_last: false,
                                    head_tail: false,
                                    stream_k: false,
                                    ..s
                                };
                                if ph.is_valid() {
                                    v.push(ph);
                                }
                            }
                            for (out_f32, vout) in
                                [(false, false), (true, false), (false, true), (true, true)]
                            {
                                let s = CoopSpec {
                                    conv,
                                    bwd_input,
                                    wgrad,
                                    split,
                                    out_f32,
                                    // (The vector epilogue is for the Conv2D forms,
                                    // including 1x1 Conv2D run as plain products.)
                                    vout,
                                    sum_last: false,
                                    head_tail: false,
                                    stream_k: false,
                                    ..s
                                };
                                if s.is_valid() && (split || !out_f32) {
                                    v.push(s);
                                    // (Split K summed by each tile's last arrival.)
                                    let last = CoopSpec {
                                        sum_last: true,
                                        ..s
                                    };
                                    if split && last.is_valid() {
                                        v.push(last);
                                        v.push(CoopSpec {
                                            head_tail: true,
                                            stream_k: false,
                                            ..last
                                        });
                                        let stk = CoopSpec {
                                            stream_k: true,
                                            ..last
                                        };
                                        if stk.is_valid() {
                                            v.push(stk);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}
