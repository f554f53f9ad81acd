//! The register-blocked, 16-byte-vector variant of the matmul kernel (`matmul_vec4.wgsl`).
//!
//! It applies where each operand's contiguous dimension is a multiple of 4 (see [`Layouts`]);
//! the scalar, strided kernel (`matmul.wgsl`) covers everything else. The host generates the
//! inner blocks of the shader fully unrolled from the tile constants; shapes and strides stay
//! in the params uniform.

use std::fmt::Write;

use crate::DType;

const MATMUL_VEC4_WGSL: &str = include_str!("matmul_vec4.wgsl");

/// A tile configuration of `matmul_vec4.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Vec4Tile {
    /// The specialization name.
    pub name: &'static str,
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Depth of the shared-memory tiles.
    pub bk: u32,
    /// Rows of C per invocation (a multiple of 4).
    pub tm: u32,
    /// Columns of C per invocation (a multiple of 4).
    pub tn: u32,
    /// Shared-memory buffers: 2 overlaps the next tile's stores with the products.
    pub stages: u32,
    /// Launch order: groups of this many tile rows (0: row-major).
    pub group: u32,
    /// With two buffers: stage the next tile's loads in this many parts, part p loaded before
    /// the p-th slice of the products (BK / parts K steps) and stored to the other buffer
    /// after it, so that 1 / parts of the staging registers are live at a time (one barrier
    /// per tile; the buffer's offset is computed, not unrolled). 0: the loop unrolled by two
    /// instead, every offset a constant, the whole next tile staged.
    pub parts: u32,
    /// Rows of the shared tiles padded by one vector (spreads the transposing stores over the
    /// banks; costs BK * 2 vectors per buffer).
    pub pad: bool,
}

/// Where each operand's contiguous dimension lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layouts {
    /// A is stored M x K (row-major, not transposed); else K x M.
    pub a_kfast: bool,
    /// B is stored K x N (row-major, not transposed); else N x K.
    pub b_nfast: bool,
}

impl Layouts {
    pub(super) fn suffix(&self) -> &'static str {
        match (self.a_kfast, self.b_nfast) {
            (true, true) => "ak_bn",
            (true, false) => "ak_bk",
            (false, true) => "am_bn",
            (false, false) => "am_bk",
        }
    }

    /// Whether the vector kernel can read A (M x K), B (K x N) and write C in these layouts:
    /// each stored row (the contiguous dimension) is a multiple of 4 elements, so every
    /// 16-byte vector lies within one row and at a 16-byte aligned offset (batch strides are
    /// products with that dimension, and bindings start at aligned offsets).
    pub fn fit(&self, m: usize, n: usize, k: usize) -> bool {
        let a_row = if self.a_kfast { k } else { m };
        let b_row = if self.b_nfast { n } else { k };
        a_row.is_multiple_of(4) && b_row.is_multiple_of(4) && n.is_multiple_of(4)
    }
}

impl Vec4Tile {
    /// Invocations per workgroup.
    pub const fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Bytes of workgroup memory.
    pub const fn shared_bytes(&self) -> u32 {
        let pad = self.pad as u32;
        self.stages * self.bk * ((self.bm / 4 + pad) + (self.bn / 4 + pad)) * 16
    }

    /// Whether the generated shader's assumptions hold: warps of 8 x 4 invocations, vector
    /// loads that cover each shared tile exactly.
    pub const fn is_valid(&self) -> bool {
        let t = self.threads();
        let tx = self.bn / self.tn;
        self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && self.bk.is_multiple_of(4)
            && tx.is_multiple_of(8)
            && t.is_multiple_of(32)
            && t <= 256
            && (self.bm * self.bk / 4).is_multiple_of(t)
            && (self.bn * self.bk / 4).is_multiple_of(t)
            && (self.stages == 1 || self.stages == 2)
            && (self.parts == 0 || (self.stages == 2 && self.bk.is_multiple_of(self.parts)))
    }

    /// The pipeline specialization for `layouts`.
    pub fn specialization(&self, layouts: Layouts) -> String {
        format!("v4_{}_{}", self.name, layouts.suffix())
    }

    /// The shader source for `dtype` (F32 or I32) and `layouts`.
    pub fn wgsl(&self, dtype: DType, layouts: Layouts) -> String {
        self.wgsl_hooked(dtype, layouts, None)
    }

    /// The shader source, with the addressing of A and/or B replaced by `hooks` (implicit
    /// GEMM: the conv family's windows; see [`Hooks`]).
    pub fn wgsl_hooked(&self, dtype: DType, layouts: Layouts, hooks: Option<&Hooks>) -> String {
        let elem = match dtype {
            DType::F32 => "f32",
            _ => "i32",
        };
        let mad = |x: &str, y: &str, acc: &str| match dtype {
            DType::F32 => format!("{acc} = fma(vec4<f32>({x}), {y}, {acc});"),
            _ => format!("{acc} = {acc} + vec4<i32>({x}) * {y};"),
        };
        let (tm, tn, bk) = (self.tm, self.tn, self.bk);
        let nt = self.threads();
        let la = self.bm * bk / 4 / nt;
        let lb = self.bn * bk / 4 / nt;
        let a = Operand {
            x: "a",
            xs: "As",
            stride: "SA",
            outer: "BM",
            o0: "m0",
            bound: "p.m",
            off: "aoff",
            s_outer: "p.sa_m",
            s_k: "p.sa_k",
            kfast: layouts.a_kfast,
            count: la,
            hook: hooks.is_some_and(|h| h.a),
        };
        let b = Operand {
            x: "b",
            xs: "Bs",
            stride: "SB",
            outer: "BN",
            o0: "n0",
            bound: "p.n",
            off: "boff",
            s_outer: "p.sb_n",
            s_k: "p.sb_k",
            kfast: !layouts.b_nfast,
            count: lb,
            hook: hooks.is_some_and(|h| h.b),
        };
        let ind = "    ";
        let mut decl = String::new();
        for i in 0..tm {
            for j in 0..tn / 4 {
                let _ = writeln!(decl, "{ind}var c_{i}_{j} = vec4<{elem}>();");
            }
        }
        a.decl(&mut decl, elem);
        b.decl(&mut decl, elem);
        let load = |part: Option<(u32, u32)>| {
            let mut out = String::new();
            a.load(&mut out, elem, part);
            b.load(&mut out, elem, part);
            out
        };
        let store = |part: Option<(u32, u32)>| {
            let mut out = String::new();
            a.store(&mut out, part);
            b.store(&mut out, part);
            out
        };
        let xyzw = ["x", "y", "z", "w"];
        let compute = |ks: std::ops::Range<u32>| {
            let mut compute = String::new();
            let ind3 = "            ";
            for kk in ks {
                let _ = writeln!(compute, "{ind3}{{");
                for g in 0..tm / 4 {
                    let _ = writeln!(
                        compute,
                        "{ind3}    let a{g} = As[(kb + {kk}u) * SA + ty + {g}u * TY];"
                    );
                }
                for j in 0..tn / 4 {
                    let _ = writeln!(
                        compute,
                        "{ind3}    let b{j} = Bs[(kb + {kk}u) * SB + tx + {j}u * TX];"
                    );
                }
                for g in 0..tm / 4 {
                    for (r, comp) in xyzw.iter().enumerate() {
                        let i = g * 4 + r as u32;
                        for j in 0..tn / 4 {
                            let _ = writeln!(
                                compute,
                                "{ind3}    {}",
                                mad(
                                    &format!("a{g}.{comp}"),
                                    &format!("b{j}"),
                                    &format!("c_{i}_{j}")
                                )
                            );
                        }
                    }
                }
                let _ = writeln!(compute, "{ind3}}}");
            }
            compute
        };
        let all = None;
        let prologue = format!(
            "    {{\n        let k0 = 0u;\n{}    }}\n    {{\n        let kb = 0u;\n{}    }}\n    workgroupBarrier();\n",
            load(all),
            store(all)
        );
        let mainloop = if self.parts > 0 {
            // Tile t in buffer t % 2; the next tile's loads in `parts` parts, each loaded
            // before a slice of the products and stored to the other buffer after it. The
            // loads run unconditionally: past the last tile they read zeros (gk >= K) and
            // store them to the buffer nobody reads any more (the previous tile's, behind
            // the last barrier), which keeps the loop body free of branches.
            let parts = self.parts;
            let mut body = String::new();
            for q in 0..parts {
                let part = Some((q, parts));
                let _ = write!(
                    body,
                    "        {{\n{}        }}\n        {{\n{}        }}\n        {{\n            let kb = kn;\n{}        }}\n",
                    load(part),
                    compute(q * bk / parts..(q + 1) * bk / parts),
                    store(part)
                );
            }
            format!(
                "    for (var t = 0u; t < ntiles; t += 1u) {{
        let kb = (t % 2u) * BK;
        let kn = BK - kb;
        let k0 = (t + 1u) * BK;
{body}        workgroupBarrier();
    }}
"
            )
        } else {
            // With two buffers the loop is unrolled by two, so that every shared-memory offset
            // is a constant: tile t lives in buffer 0, tile t + 1 in buffer 1. As above, the
            // next tile's loads and stores run unconditionally (zeros past the last tile, to a
            // buffer nobody reads any more): no branches around them (v7: a branch-free loop
            // body ran 17% faster on the H200).
            let second = if self.stages == 2 {
                format!(
                    "        if t + 1u < ntiles {{
            {{
                let k0 = (t + 2u) * BK;
{}            }}
            {{
                let kb = BK;
{}            }}
            {{
                let kb = 0u;
{}            }}
            workgroupBarrier();
        }}
",
                    load(all),
                    compute(0..bk),
                    store(all)
                )
            } else {
                String::new()
            };
            format!(
                "    for (var t = 0u; t < ntiles; t += STAGES) {{
        {{
            {{
                let k0 = (t + 1u) * BK;
{}            }}
            {{
                let kb = 0u;
{}            }}
            if STAGES == 1u {{
                workgroupBarrier();
            }}
            {{
                let kb = (STAGES - 1u) * BK;
{}            }}
            workgroupBarrier();
        }}
{second}    }}
",
                load(all),
                compute(0..bk),
                store(all)
            )
        };
        let mut output = String::new();
        for g in 0..tm / 4 {
            for r in 0..4 {
                let i = g * 4 + r;
                let _ = writeln!(output, "{ind}{{");
                let _ = writeln!(
                    output,
                    "{ind}    let gm = m0 + 4u * (ty + {g}u * TY) + {r}u;"
                );
                let _ = writeln!(output, "{ind}    if gm < p.m {{");
                let _ = writeln!(output, "{ind}        let row = cbase + gm * p.n;");
                for j in 0..tn / 4 {
                    let _ = writeln!(
                        output,
                        "{ind}        {{ let gn = n0 + 4u * (tx + {j}u * TX); \
                         if gn < p.n {{ c[(row + gn) / 4u] = c_{i}_{j}; }} }}"
                    );
                }
                let _ = writeln!(output, "{ind}    }}");
                let _ = writeln!(output, "{ind}}}");
            }
        }
        let common = match hooks {
            None => super::MATMUL_COMMON_WGSL.to_string(),
            Some(h) => super::MATMUL_COMMON_WGSL.replace(
                "    bstr: array<vec4<u32>, 2>,\n};",
                &format!(
                    "    bstr: array<vec4<u32>, 2>,\n    hp: array<vec4<u32>, {}>,\n}};\n{}",
                    HOOK_PARAM_VECS, h.wgsl
                ),
            ),
        };
        [common.as_str(), MATMUL_VEC4_WGSL]
            .concat()
            .replace("ELEM", elem)
            .replace("TILE_BM", &self.bm.to_string())
            .replace("TILE_BN", &self.bn.to_string())
            .replace("TILE_BK", &self.bk.to_string())
            .replace("TILE_TM", &self.tm.to_string())
            .replace("TILE_TN", &self.tn.to_string())
            .replace("TILE_STAGES", &self.stages.to_string())
            .replace("TILE_GROUP", &self.group.to_string())
            .replace("TILE_PAD", &(self.pad as u32).to_string())
            .replace("GEN_DECL", &decl)
            .replace("GEN_PROLOGUE", &prologue)
            .replace("GEN_MAINLOOP", &mainloop)
            .replace("GEN_OUTPUT", &output)
    }
}

/// Vectors of 4 u32 the hooks' parameters take after the matmul params (`p.hp`).
pub const HOOK_PARAM_VECS: usize = 6;

/// Addressing hooks for an implicit GEMM on the vector shader: for each hooked operand X ("a"
/// or "b") the WGSL in `wgsl` defines `struct XPre`, `fn x_pre(go: u32) -> XPre` (the outer
/// index's part, computed once per load slot: go is the row of A or the column of B, outside
/// the matrix included) and `fn x_load(q: XPre, gk: u32, off: u32) -> vec4<ELEM>` (the vector
/// at K index gk, `off` the operand's batch offset; zero outside the matrix, gk >= p.k
/// included). The hooks read their own parameters from `p.hp` (HOOK_PARAM_VECS vectors).
pub struct Hooks {
    pub a: bool,
    pub b: bool,
    pub wgsl: String,
}

/// How one operand's tile is loaded: `count` vectors per invocation, each either along K
/// (`kfast`: stored rows run along K) or along the outer dimension (M for A, N for B).
struct Operand {
    x: &'static str,
    xs: &'static str,
    stride: &'static str,
    outer: &'static str,
    o0: &'static str,
    bound: &'static str,
    off: &'static str,
    s_outer: &'static str,
    s_k: &'static str,
    kfast: bool,
    count: u32,
    /// Addressed by the hooks `x_pre` / `x_load`.
    hook: bool,
}

impl Operand {
    /// The loads of part `q` of `parts` of this operand's tile (possibly none), or all of them.
    fn part(&self, part: Option<(u32, u32)>) -> std::ops::Range<u32> {
        match part {
            None => 0..self.count,
            Some((q, parts)) => q * self.count / parts..(q + 1) * self.count / parts,
        }
    }

    /// Per-invocation constants: which vector of the tile each load takes; the registers.
    fn decl(&self, out: &mut String, elem: &str) {
        let (x, outer) = (self.x, self.outer);
        for s in 0..self.count {
            let _ = writeln!(out, "    let {x}e{s} = l + {s}u * NT;");
            if self.kfast {
                // (outer index, vector along K)
                let _ = writeln!(out, "    let {x}v{s} = {x}e{s} % (BK / 4u);");
                let _ = writeln!(out, "    let {x}o{s} = {x}e{s} / (BK / 4u);");
            } else {
                // (vector along the outer dimension, K index)
                let _ = writeln!(out, "    let {x}v{s} = {x}e{s} % ({outer} / 4u);");
                let _ = writeln!(out, "    let {x}o{s} = {x}e{s} / ({outer} / 4u);");
            }
            let _ = writeln!(out, "    var r{x}{s} = vec4<{elem}>();");
            if self.hook {
                let go = if self.kfast {
                    format!("{} + {x}o{s}", self.o0)
                } else {
                    format!("{} + 4u * {x}v{s}", self.o0)
                };
                let _ = writeln!(out, "    let {x}h{s} = {x}_pre({go});");
            }
        }
    }

    /// Global loads of the tile at K offset `k0` into the registers (zero outside the matrix).
    fn load(&self, out: &mut String, elem: &str, part: Option<(u32, u32)>) {
        let (x, o0, bound, off) = (self.x, self.o0, self.bound, self.off);
        let ind = "            ";
        for s in self.part(part) {
            let _ = writeln!(out, "{ind}{{");
            if self.kfast {
                let _ = writeln!(out, "{ind}    let go = {o0} + {x}o{s};");
                let _ = writeln!(out, "{ind}    let gk = k0 + 4u * {x}v{s};");
                if self.hook {
                    let _ = writeln!(out, "{ind}    r{x}{s} = {x}_load({x}h{s}, gk, {off});");
                } else {
                    let _ = writeln!(out, "{ind}    r{x}{s} = vec4<{elem}>();");
                    let _ = writeln!(
                        out,
                        "{ind}    if go < {bound} && gk < p.k {{ r{x}{s} = {x}[({off} + go * {} + gk) / 4u]; }}",
                        self.s_outer
                    );
                }
            } else {
                let _ = writeln!(out, "{ind}    let go = {o0} + 4u * {x}v{s};");
                let _ = writeln!(out, "{ind}    let gk = k0 + {x}o{s};");
                if self.hook {
                    let _ = writeln!(out, "{ind}    r{x}{s} = {x}_load({x}h{s}, gk, {off});");
                } else {
                    let _ = writeln!(out, "{ind}    r{x}{s} = vec4<{elem}>();");
                    let _ = writeln!(
                        out,
                        "{ind}    if go < {bound} && gk < p.k {{ r{x}{s} = {x}[({off} + gk * {} + go) / 4u]; }}",
                        self.s_k
                    );
                }
            }
            let _ = writeln!(out, "{ind}}}");
        }
    }

    /// Stores of the registers into the shared buffer at row `kb` (k-major).
    fn store(&self, out: &mut String, part: Option<(u32, u32)>) {
        let (x, xs, stride) = (self.x, self.xs, self.stride);
        let ind = "            ";
        for s in self.part(part) {
            if self.kfast {
                for (i, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "{ind}{xs}[(kb + 4u * {x}v{s} + {i}u) * {stride} + {x}o{s} / 4u][{x}o{s} % 4u] = r{x}{s}.{comp};"
                    );
                }
            } else {
                let _ = writeln!(
                    out,
                    "{ind}{xs}[(kb + {x}o{s}) * {stride} + {x}v{s}] = r{x}{s};"
                );
            }
        }
    }
}
