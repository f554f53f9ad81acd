//! The matmul variant for CPU adapters (Mesa's lavapipe/llvmpipe and other software Vulkan
//! drivers): no shared memory, no barriers, a register tile per invocation.
//!
//! How llvmpipe runs a compute shader (Mesa 22.3, `lp_bld_nir_soa.c`): a workgroup runs on one
//! thread, its invocations in the lanes of a SIMD vector (8 on AVX2); every value of the shader
//! is a vector of 8 lanes, so one `fma` is one AVX2 instruction for 8 invocations. A storage
//! or workgroup-memory access whose offset is not a compile-time uniform becomes a loop over
//! the 8 lanes, with a branch, a bounds check, a scalar load and an insert per lane and
//! component: a load costs ~8x-10x an arithmetic instruction, and a workgroup barrier is a
//! coroutine switch per 8 invocations. The GPU tiles (shared-memory staging, 64-256
//! invocations, two barriers per K step) are therefore the worst case there.
//!
//! This variant: workgroups of 8 invocations (one SIMD vector), arranged LX x LY; each
//! invocation computes TM x TN outputs, loading TM + TN values per K step straight from the
//! storage buffers (16-byte vectors along the contiguous dimension where [`Layouts::fit`]
//! holds, scalars through strides otherwise) and doing TM * TN fused multiply-adds, so the
//! ratio of arithmetic to loads grows with the tile. Rows and columns past the matrix are
//! clamped to its last row or column (their results are computed and dropped), so the K loop
//! has no bounds checks and no divergent control flow; only the final stores are checked.
//! The K loop is unrolled by 4.

use std::fmt::Write;

use super::Layouts;
use crate::DType;

/// A register tile of the CPU variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuTile {
    /// The specialization name.
    pub name: &'static str,
    /// Rows of C per invocation (a multiple of 4).
    pub tm: u32,
    /// Columns of C per invocation (a multiple of 4).
    pub tn: u32,
    /// Invocations along N in a workgroup.
    pub lx: u32,
    /// Invocations along M in a workgroup.
    pub ly: u32,
}

/// Invocations per workgroup: one SIMD vector of llvmpipe on AVX2.
pub const CPU_WG: u32 = 8;

impl CpuTile {
    /// Rows of C per workgroup.
    pub const fn bm(&self) -> u32 {
        self.tm * self.ly
    }

    /// Columns of C per workgroup.
    pub const fn bn(&self) -> u32 {
        self.tn * self.lx
    }

    pub const fn is_valid(&self) -> bool {
        self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.tm > 0
            && self.tn > 0
            && self.lx * self.ly == CPU_WG
    }

    /// The pipeline specialization: vector loads in `layouts`, or scalar strided loads.
    pub fn specialization(&self, layouts: Option<Layouts>) -> String {
        match layouts {
            Some(l) => format!("{}_{}", self.name, l.suffix()),
            None => format!("{}_scalar", self.name),
        }
    }

    /// The shader for `dtype` (F32 or I32): 16-byte vector loads in `layouts` (which must
    /// `fit` the product), or scalar loads through the params' strides (`None`, any shape).
    pub fn wgsl(&self, dtype: DType, layouts: Option<Layouts>) -> String {
        let elem = match dtype {
            DType::F32 => "f32",
            _ => "i32",
        };
        let body = match layouts {
            Some(l) => self.vector_body(dtype, l),
            None => self.scalar_body(dtype),
        };
        let arr = if layouts.is_some() {
            format!("vec4<{elem}>")
        } else {
            elem.to_string()
        };
        let mut src = String::from(super::MATMUL_COMMON_WGSL);
        let _ = write!(
            src,
            "
@group(0) @binding(1) var<storage, read_write> a: array<{arr}>;
@group(0) @binding(2) var<storage, read_write> b: array<{arr}>;
@group(0) @binding(3) var<storage, read_write> c: array<{arr}>;

@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {{
    let bidx = p.batch_base + wid.z;
    let offs = batch_offsets(bidx);
    let aoff = offs.x;
    let boff = offs.y;
    let m0 = (p.tile_base_y + wid.y) * {bm}u + (l / {lx}u) * {tm}u;
    let n0 = (p.tile_base_x + wid.x) * {bn}u + (l % {lx}u) * {tn}u;
    let cbase = bidx * p.m * p.n;
{body}}}
",
            wg = CPU_WG,
            bm = self.bm(),
            bn = self.bn(),
            lx = self.lx,
            tm = self.tm,
            tn = self.tn,
        );
        src
    }

    fn mad(dtype: DType, acc: &str, x: &str, y: &str) -> String {
        match dtype {
            DType::F32 => format!("{acc} = fma({x}, {y}, {acc});"),
            _ => format!("{acc} = {acc} + {x} * {y};"),
        }
    }

    /// Scalar loads through strides: A[m, k] at aoff + m * sa_m + k * sa_k, B[k, n] at
    /// boff + k * sb_k + n * sb_n.
    fn scalar_body(&self, dtype: DType) -> String {
        let (tm, tn) = (self.tm, self.tn);
        let elem = if dtype == DType::F32 { "f32" } else { "i32" };
        let mut s = String::new();
        let ind = "    ";
        for r in 0..tm {
            let _ = writeln!(
                s,
                "{ind}let ar{r} = aoff + min(m0 + {r}u, p.m - 1u) * p.sa_m;"
            );
        }
        for j in 0..tn {
            let _ = writeln!(
                s,
                "{ind}let bc{j} = boff + min(n0 + {j}u, p.n - 1u) * p.sb_n;"
            );
        }
        for r in 0..tm {
            for j in 0..tn {
                let _ = writeln!(s, "{ind}var c_{r}_{j} = {elem}();");
            }
        }
        // One K step, at `k` (an expression).
        let step = |s: &mut String, k: &str, ind: &str| {
            let _ = writeln!(s, "{ind}{{");
            let _ = writeln!(s, "{ind}    let ka = ({k}) * p.sa_k;");
            let _ = writeln!(s, "{ind}    let kb = ({k}) * p.sb_k;");
            for r in 0..tm {
                let _ = writeln!(s, "{ind}    let a{r} = a[ar{r} + ka];");
            }
            for j in 0..tn {
                let _ = writeln!(s, "{ind}    let b{j} = b[bc{j} + kb];");
            }
            for r in 0..tm {
                for j in 0..tn {
                    let _ = writeln!(
                        s,
                        "{ind}    {}",
                        Self::mad(
                            dtype,
                            &format!("c_{r}_{j}"),
                            &format!("a{r}"),
                            &format!("b{j}")
                        )
                    );
                }
            }
            let _ = writeln!(s, "{ind}}}");
        };
        let _ = writeln!(s, "{ind}let k4 = p.k & ~3u;");
        let _ = writeln!(s, "{ind}for (var k = 0u; k < k4; k += 4u) {{");
        for kk in 0..4 {
            step(&mut s, &format!("k + {kk}u"), "        ");
        }
        let _ = writeln!(s, "{ind}}}");
        let _ = writeln!(s, "{ind}for (var k = k4; k < p.k; k += 1u) {{");
        step(&mut s, "k", "        ");
        let _ = writeln!(s, "{ind}}}");
        for r in 0..tm {
            let _ = writeln!(s, "{ind}if m0 + {r}u < p.m {{");
            let _ = writeln!(s, "{ind}    let row = cbase + (m0 + {r}u) * p.n + n0;");
            for j in 0..tn {
                let _ = writeln!(
                    s,
                    "{ind}    if n0 + {j}u < p.n {{ c[row + {j}u] = c_{r}_{j}; }}"
                );
            }
            let _ = writeln!(s, "{ind}}}");
        }
        s
    }

    /// 16-byte vector loads along each operand's contiguous dimension (see `Layouts::fit`:
    /// every stored row is a multiple of 4 elements, so vectors are aligned and never straddle
    /// rows; clamped vector starts stay multiples of 4).
    fn vector_body(&self, dtype: DType, l: Layouts) -> String {
        let (tm, tn) = (self.tm, self.tn);
        let elem = if dtype == DType::F32 { "f32" } else { "i32" };
        let xyzw = ["x", "y", "z", "w"];
        let mut s = String::new();
        let ind = "    ";
        if l.a_kfast {
            // A row r starts at (aoff + m * K) / 4 vectors; K % 4 == 0.
            for r in 0..tm {
                let _ = writeln!(
                    s,
                    "{ind}let ar{r} = (aoff + min(m0 + {r}u, p.m - 1u) * p.sa_m) / 4u;"
                );
            }
        } else {
            // A stored K x M, M % 4 == 0: vector g covers rows m0 + 4g .. + 4.
            let _ = writeln!(s, "{ind}let sak = p.sa_k / 4u;");
            for g in 0..tm / 4 {
                let _ = writeln!(
                    s,
                    "{ind}let ac{g} = (aoff + min(m0 + {}u, p.m - 4u)) / 4u;",
                    4 * g
                );
            }
        }
        if l.b_nfast {
            // B stored K x N, N % 4 == 0: vector j covers columns n0 + 4j .. + 4.
            let _ = writeln!(s, "{ind}let sbk = p.sb_k / 4u;");
            for j in 0..tn / 4 {
                let _ = writeln!(
                    s,
                    "{ind}let bc{j} = (boff + min(n0 + {}u, p.n - 4u)) / 4u;",
                    4 * j
                );
            }
        } else {
            // B stored N x K, K % 4 == 0: column c starts at (boff + n * K) / 4 vectors.
            for c in 0..tn {
                let _ = writeln!(
                    s,
                    "{ind}let br{c} = (boff + min(n0 + {c}u, p.n - 1u) * p.sb_n) / 4u;"
                );
            }
        }
        for r in 0..tm {
            for j in 0..tn / 4 {
                let _ = writeln!(s, "{ind}var c_{r}_{j} = vec4<{elem}>();");
            }
        }
        // A value (row r, k offset kk within the step) and B vector (kk, column vector j).
        let a_val = |r: u32, kk: usize| -> String {
            if l.a_kfast {
                format!("a{r}.{}", xyzw[kk])
            } else {
                format!("a{kk}_{}.{}", r / 4, xyzw[(r % 4) as usize])
            }
        };
        let b_vec = |kk: usize, j: u32| -> String {
            if l.b_nfast {
                format!("b{kk}_{j}")
            } else {
                let c = 4 * j;
                format!(
                    "vec4<{elem}>(b{c}.{x}, b{}.{x}, b{}.{x}, b{}.{x})",
                    c + 1,
                    c + 2,
                    c + 3,
                    x = xyzw[kk]
                )
            }
        };
        // A step of `ks` K values (4, or 1 in the tail) at `k`.
        let step = |s: &mut String, ks: usize, ind: &str| {
            if l.a_kfast {
                for r in 0..tm {
                    let _ = writeln!(s, "{ind}let a{r} = a[ar{r} + k / 4u];");
                }
            } else {
                for kk in 0..ks {
                    for g in 0..tm / 4 {
                        let _ = writeln!(s, "{ind}let a{kk}_{g} = a[ac{g} + (k + {kk}u) * sak];");
                    }
                }
            }
            if l.b_nfast {
                for kk in 0..ks {
                    for j in 0..tn / 4 {
                        let _ = writeln!(s, "{ind}let b{kk}_{j} = b[bc{j} + (k + {kk}u) * sbk];");
                    }
                }
            } else {
                for c in 0..tn {
                    let _ = writeln!(s, "{ind}let b{c} = b[br{c} + k / 4u];");
                }
            }
            for kk in 0..ks {
                for r in 0..tm {
                    let x = format!("vec4<{elem}>({})", a_val(r, kk));
                    for j in 0..tn / 4 {
                        let _ = writeln!(
                            s,
                            "{ind}{}",
                            Self::mad(dtype, &format!("c_{r}_{j}"), &x, &b_vec(kk, j))
                        );
                    }
                }
            }
        };
        let _ = writeln!(s, "{ind}let k4 = p.k & ~3u;");
        let _ = writeln!(s, "{ind}for (var k = 0u; k < k4; k += 4u) {{");
        step(&mut s, 4, "        ");
        let _ = writeln!(s, "{ind}}}");
        if !l.a_kfast && l.b_nfast {
            // Only this layout allows K % 4 != 0.
            let _ = writeln!(s, "{ind}for (var k = k4; k < p.k; k += 1u) {{");
            step(&mut s, 1, "        ");
            let _ = writeln!(s, "{ind}}}");
        }
        for r in 0..tm {
            let _ = writeln!(s, "{ind}if m0 + {r}u < p.m {{");
            let _ = writeln!(
                s,
                "{ind}    let row = (cbase + (m0 + {r}u) * p.n + n0) / 4u;"
            );
            for j in 0..tn / 4 {
                let _ = writeln!(
                    s,
                    "{ind}    if n0 + {}u < p.n {{ c[row + {j}u] = c_{r}_{j}; }}",
                    4 * j
                );
            }
            let _ = writeln!(s, "{ind}}}");
        }
        s
    }
}

/// The CPU tiles without subgroups, named "cpuTMxTN_LXxLY", for `_tfwgpu_tile` and for
/// devices without subgroups of a fixed size. On llvmpipe at 256^3 (512^3): 4x4 0.4 (1.0),
/// 4x8 0.6 (1.2), 8x8 1.6 (1.7, scalar loads) GFLOP/s.
pub const CPU_TILES: &[CpuTile] = &[
    CpuTile {
        name: "cpu4x4_8x1",
        tm: 4,
        tn: 4,
        lx: 8,
        ly: 1,
    },
    CpuTile {
        name: "cpu4x8_2x4",
        tm: 4,
        tn: 8,
        lx: 2,
        ly: 4,
    },
    CpuTile {
        name: "cpu8x8_8x1",
        tm: 8,
        tn: 8,
        lx: 8,
        ly: 1,
    },
];

const _: () = {
    let mut i = 0;
    while i < CPU_TILES.len() {
        assert!(CPU_TILES[i].is_valid());
        i += 1;
    }
};

/// A tile of the subgroup form of the CPU variant (`SgTile::wgsl`): a workgroup is one
/// subgroup of S invocations (S = 8 on llvmpipe with AVX2); it computes TM rows x S * TN
/// columns. The TM values of A of each K step are loaded cooperatively, TM / S per invocation,
/// and handed to every invocation with `subgroupBroadcast` (an extract and a broadcast on
/// llvmpipe, no memory access); each invocation loads only its own TN values of B. Loads per
/// invocation and K step: TM / S + TN, for TM * TN fused multiply-adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SgTile {
    pub name: &'static str,
    /// Rows of C per workgroup (a multiple of the subgroup size).
    pub tm: u32,
    /// Columns of C per invocation (a multiple of 4).
    pub tn: u32,
}

/// How the subgroup tile reads each operand (chosen per product by [`SgModes::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SgModes {
    /// A row-major (M x K) with K % 4 == 0: 16-byte vectors along K; else scalars.
    pub a_k4: bool,
    /// B row-major (K x N) with N % 4 == 0: vectors along N.
    pub b_n4: bool,
    /// B transposed (N x K) with K % 4 == 0: vectors along K.
    pub b_k4: bool,
}

impl SgModes {
    pub fn of(layouts: Layouts, n: usize, k: usize) -> SgModes {
        SgModes {
            a_k4: layouts.a_kfast && k.is_multiple_of(4),
            b_n4: layouts.b_nfast && n.is_multiple_of(4),
            b_k4: !layouts.b_nfast && k.is_multiple_of(4),
        }
    }

    fn suffix(&self) -> String {
        format!(
            "{}_{}",
            if self.a_k4 { "ak4" } else { "as" },
            if self.b_n4 {
                "bn4"
            } else if self.b_k4 {
                "bk4"
            } else {
                "bs"
            }
        )
    }
}

impl SgTile {
    /// Rows of C per workgroup.
    pub const fn bm(&self) -> u32 {
        self.tm
    }

    /// Columns of C per workgroup with subgroups of `lanes`.
    pub const fn bn(&self, lanes: u32) -> u32 {
        self.tn * lanes
    }

    pub const fn is_valid(&self, lanes: u32) -> bool {
        lanes > 0 && self.tm.is_multiple_of(lanes) && self.tn.is_multiple_of(4) && self.tn > 0
    }

    pub fn specialization(&self, lanes: u32, modes: SgModes) -> String {
        format!("{}_s{lanes}_{}", self.name, modes.suffix())
    }

    /// The shader for `dtype` (F32 or I32), subgroups (and workgroups) of `lanes`.
    pub fn wgsl(&self, dtype: DType, lanes: u32, modes: SgModes) -> String {
        let elem = if dtype == DType::F32 { "f32" } else { "i32" };
        let v4 = format!("vec4<{elem}>");
        let (tm, tn, s) = (self.tm, self.tn, lanes);
        let xyzw = ["x", "y", "z", "w"];
        let mad = |acc: &str, x: &str, y: &str| CpuTile::mad(dtype, acc, x, y);
        let mut b = String::new();
        let ind = "    ";
        // Cooperative A rows: invocation l loads rows m0 + l + S * g.
        for g in 0..tm / s {
            if modes.a_k4 {
                let _ = writeln!(
                    b,
                    "{ind}let ar{g} = (aoff + min(m0 + l + {}u, p.m - 1u) * p.sa_m) / 4u;",
                    s * g
                );
            } else {
                let _ = writeln!(
                    b,
                    "{ind}let ar{g} = aoff + min(m0 + l + {}u, p.m - 1u) * p.sa_m;",
                    s * g
                );
            }
        }
        // This invocation's columns: vectors n0 + 4 l + 4 S j (b_n4), else n0 + l + S t.
        let accs_per_row = if modes.b_n4 { tn / 4 } else { tn };
        if modes.b_n4 {
            let _ = writeln!(b, "{ind}let sbk = p.sb_k / 4u;");
            for j in 0..tn / 4 {
                let _ = writeln!(
                    b,
                    "{ind}let bc{j} = (boff + min(n0 + 4u * l + {}u, p.n - 4u)) / 4u;",
                    4 * s * j
                );
            }
        } else {
            for t in 0..tn {
                let div = if modes.b_k4 { " / 4u" } else { "" };
                let _ = writeln!(
                    b,
                    "{ind}let bc{t} = (boff + min(n0 + l + {}u, p.n - 1u) * p.sb_n){div};",
                    s * t
                );
            }
        }
        let acc_ty = if modes.b_n4 { v4.as_str() } else { elem };
        for r in 0..tm {
            for j in 0..accs_per_row {
                let _ = writeln!(b, "{ind}var c_{r}_{j} = {acc_ty}();");
            }
        }
        let kvec = modes.a_k4 || modes.b_k4;
        // One step of `ks` K values at `k`.
        let step = |b: &mut String, ks: usize, ind: &str| {
            // A: broadcast values av{r}_{kk} (scalars).
            for g in 0..tm / s {
                if modes.a_k4 {
                    let _ = writeln!(b, "{ind}let ra{g} = a[ar{g} + k / 4u];");
                } else {
                    for kk in 0..ks {
                        let _ =
                            writeln!(b, "{ind}let ra{g}_{kk} = a[ar{g} + (k + {kk}u) * p.sa_k];");
                    }
                }
            }
            // B.
            if modes.b_n4 {
                for kk in 0..ks {
                    for j in 0..tn / 4 {
                        let _ = writeln!(b, "{ind}let b{kk}_{j} = b[bc{j} + (k + {kk}u) * sbk];");
                    }
                }
            } else if modes.b_k4 {
                for t in 0..tn {
                    let _ = writeln!(b, "{ind}let bv{t} = b[bc{t} + k / 4u];");
                }
            } else {
                for kk in 0..ks {
                    for t in 0..tn {
                        let _ =
                            writeln!(b, "{ind}let b{kk}_{t} = b[bc{t} + (k + {kk}u) * p.sb_k];");
                    }
                }
            }
            for r in 0..tm {
                let (g, lane) = (r / s, r % s);
                if modes.a_k4 {
                    let _ = writeln!(b, "{ind}let av{r} = subgroupBroadcast(ra{g}, {lane}u);");
                }
                let xs: Vec<String> = (0..ks)
                    .map(|kk| {
                        if modes.a_k4 {
                            format!("av{r}.{}", xyzw[kk])
                        } else {
                            let _ = writeln!(
                                b,
                                "{ind}let av{r}_{kk} = subgroupBroadcast(ra{g}_{kk}, {lane}u);"
                            );
                            format!("av{r}_{kk}")
                        }
                    })
                    .collect();
                // Each accumulator's K updates back to back (one spill reload and store).
                for j in 0..accs_per_row {
                    for (kk, x) in xs.iter().enumerate() {
                        let (xx, y) = if modes.b_n4 {
                            (format!("{v4}({x})"), format!("b{kk}_{j}"))
                        } else if modes.b_k4 {
                            (x.clone(), format!("bv{j}.{}", xyzw[kk]))
                        } else {
                            (x.clone(), format!("b{kk}_{j}"))
                        };
                        let _ = writeln!(b, "{ind}{}", mad(&format!("c_{r}_{j}"), &xx, &y));
                    }
                }
            }
        };
        let _ = writeln!(b, "{ind}let k4 = p.k & ~3u;");
        let _ = writeln!(b, "{ind}for (var k = 0u; k < k4; k += 4u) {{");
        step(&mut b, 4, "        ");
        let _ = writeln!(b, "{ind}}}");
        if !kvec {
            let _ = writeln!(b, "{ind}for (var k = k4; k < p.k; k += 1u) {{");
            step(&mut b, 1, "        ");
            let _ = writeln!(b, "{ind}}}");
        }
        for r in 0..tm {
            let _ = writeln!(b, "{ind}if m0 + {r}u < p.m {{");
            if modes.b_n4 {
                let _ = writeln!(b, "{ind}    let row = (cbase + (m0 + {r}u) * p.n) / 4u;");
                for j in 0..tn / 4 {
                    let _ = writeln!(
                        b,
                        "{ind}    {{ let gn = n0 + 4u * l + {}u; if gn < p.n {{ c[row + gn / 4u] = c_{r}_{j}; }} }}",
                        4 * s * j
                    );
                }
            } else {
                let _ = writeln!(b, "{ind}    let row = cbase + (m0 + {r}u) * p.n;");
                for t in 0..tn {
                    let _ = writeln!(
                        b,
                        "{ind}    {{ let gn = n0 + l + {}u; if gn < p.n {{ c[row + gn] = c_{r}_{t}; }} }}",
                        s * t
                    );
                }
            }
            let _ = writeln!(b, "{ind}}}");
        }
        let arr = |vec: bool| if vec { v4.clone() } else { elem.to_string() };
        let mut src = String::from(super::MATMUL_COMMON_WGSL);
        let _ = write!(
            src,
            "
@group(0) @binding(1) var<storage, read_write> a: array<{aty}>;
@group(0) @binding(2) var<storage, read_write> b: array<{bty}>;
@group(0) @binding(3) var<storage, read_write> c: array<{cty}>;

@compute @workgroup_size({s})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) l: u32) {{
    let bidx = p.batch_base + wid.z;
    let offs = batch_offsets(bidx);
    let aoff = offs.x;
    let boff = offs.y;
    let m0 = (p.tile_base_y + wid.y) * {bm}u;
    let n0 = (p.tile_base_x + wid.x) * {bn}u;
    let cbase = bidx * p.m * p.n;
{b}}}
",
            aty = arr(modes.a_k4),
            bty = arr(modes.b_n4 || modes.b_k4),
            cty = arr(modes.b_n4),
            bm = self.bm(),
            bn = self.bn(s),
        );
        src
    }
}

/// The subgroup tiles, for `_tfwgpu_tile`, named "sgTMxTN". Measured on llvmpipe (AVX2, two
/// shared cores; bench/RESULTS.md) at 512^3: sg8x4 0.8 GFLOP/s, sg16x8 2.6, sg32x4 2.8,
/// sg32x8 4.7, sg64x4 4.4, sg64x8 4.6: the cost is the loads (each a loop over the 8 lanes
/// with a store-to-load forwarded insert per lane and component), so larger tiles win until
/// spilled accumulators catch up.
pub const SG_TILES: &[SgTile] = &[
    SgTile {
        name: "sg8x4",
        tm: 8,
        tn: 4,
    },
    SgTile {
        name: "sg16x8",
        tm: 16,
        tn: 8,
    },
    SgTile {
        name: "sg32x4",
        tm: 32,
        tn: 4,
    },
    SgTile {
        name: "sg32x8",
        tm: 32,
        tn: 8,
    },
    SgTile {
        name: "sg64x4",
        tm: 64,
        tn: 4,
    },
    SgTile {
        name: "sg64x8",
        tm: 64,
        tn: 8,
    },
];
