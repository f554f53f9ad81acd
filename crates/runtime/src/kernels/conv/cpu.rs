//! Conv2D and its gradients on CPU adapters (llvmpipe): implicit matrix products on the
//! subgroup register tile of `matmul/cpu.rs` (no shared memory, no barriers; see there for
//! why), for float32 NHWC convolutions with one group. Everything else keeps `gemm.rs`.
//!
//! A workgroup is one subgroup of S invocations and computes TM rows by S * TN columns of the
//! product (the table in `gemm.rs`). The reduction is walked as nested loops over the filter
//! taps (or the output pixels, for the filter gradient), so no index is ever divided inside
//! the loops: per tap, each invocation works out the input pixel of its TM / S cooperative
//! rows (zero outside the image: the address is clamped into the image and the value
//! masked), loads their values (16-byte vectors along the channels where the depth is a
//! multiple of 4), and `subgroupBroadcast` hands them to every invocation; each invocation
//! loads its own columns of the other operand. The filter gradient splits the batch across
//! workgroups (grid z) when it has few output tiles; the splits are summed by `finalize`.

use std::fmt::Write;

use crate::exec::BufferRange;
use crate::kernel::{DeviceRef, KernelContext, MAX_GROUPS_X};
use crate::kernel_manager::{Checks, PipelineKey, ShaderSource};
use crate::kernels::wgsl::{LOOP_BUDGET, LOOP_LIMIT, params};
use crate::{DType, Error, Result};

use super::gemm::{Mode, finalize};
use super::{ConvAttrs, Geom};

/// A register tile: TM rows per workgroup, TN columns per invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuConvTile {
    pub name: &'static str,
    pub tm: u32,
    pub tn: u32,
}

/// The tiles, for `_tfwgpu_tile` ("cpuconvTMxTN").
pub const CPU_CONV_TILES: &[CpuConvTile] = &[
    CpuConvTile {
        name: "cpuconv8x4",
        tm: 8,
        tn: 4,
    },
    CpuConvTile {
        name: "cpuconv32x8",
        tm: 32,
        tn: 8,
    },
    CpuConvTile {
        name: "cpuconv64x4",
        tm: 64,
        tn: 4,
    },
];

/// Whether this convolution can take the CPU path.
pub(super) fn applies(g: &Geom, dtype: DType) -> bool {
    dtype == DType::F32 && !g.nchw && g.groups == 1
}

/// The fixed subgroup size of the device, if it has subgroups of one size.
pub(super) fn fixed_lanes(ctx: &KernelContext) -> Option<u32> {
    let d = &ctx.dev.desc;
    (ctx.features().contains(wgpu::Features::SUBGROUP)
        && d.subgroup_min_size == d.subgroup_max_size
        && (1..=64).contains(&d.subgroup_min_size))
    .then_some(d.subgroup_min_size)
}

/// The tile for a product with `n` columns.
fn choose(n: usize) -> CpuConvTile {
    if n <= 32 {
        CPU_CONV_TILES[2]
    } else {
        CPU_CONV_TILES[1]
    }
}

/// How the shader reads: A in 16-byte vectors along the reduction; B in vectors along the
/// columns (`b_n4`) or along the reduction (`b_k4`), else scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Vec4s {
    a: bool,
    b_n4: bool,
    b_k4: bool,
}

impl Vec4s {
    fn of(mode: Mode, g: &Geom) -> Vec4s {
        let c4 = g.c.is_multiple_of(4);
        let k4 = g.k.is_multiple_of(4);
        match mode {
            Mode::Forward => Vec4s {
                a: c4,
                b_n4: k4,
                b_k4: false,
            },
            Mode::BackpropInput => Vec4s {
                a: k4,
                b_n4: false,
                b_k4: k4,
            },
            Mode::BackpropFilter => Vec4s {
                a: false,
                b_n4: k4,
                b_k4: false,
            },
        }
    }

    fn suffix(&self) -> String {
        format!(
            "{}{}",
            if self.a { "a4" } else { "as" },
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

const PARAMS: &str = "struct Params {
    m: u32,
    n: u32,
    ih: u32,
    iw: u32,
    ic: u32,
    oh: u32,
    ow: u32,
    oc: u32,
    fr: u32,
    fs: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    nb: u32,
    nper: u32,
    out_len: u32,
    tile_base_y: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
";

/// The WGSL of `mode` with `tile`, subgroups of `s`, reads `v`.
fn wgsl(mode: Mode, tile: CpuConvTile, s: u32, v: Vec4s) -> String {
    let (tm, tn) = (tile.tm, tile.tn);
    let ng = tm / s;
    let xyzw = ["x", "y", "z", "w"];
    let ind = "    ";
    let mut b = String::new();
    // Per cooperative row g: the row m (clamped), and its mode-specific origin.
    for g in 0..ng {
        let _ = writeln!(b, "{ind}let mr{g} = min(m0 + l + {}u, p.m - 1u);", s * g);
        match mode {
            Mode::Forward => {
                let _ = writeln!(b, "{ind}let ox{g} = mr{g} % p.ow;");
                let _ = writeln!(b, "{ind}let t{g} = mr{g} / p.ow;");
                let _ = writeln!(b, "{ind}let y{g} = i32((t{g} % p.oh) * p.sh) - i32(p.pt);");
                let _ = writeln!(b, "{ind}let x{g} = i32(ox{g} * p.sw) - i32(p.pl);");
                let _ = writeln!(b, "{ind}let base{g} = (t{g} / p.oh) * p.ih * p.iw * p.ic;");
            }
            Mode::BackpropInput => {
                let _ = writeln!(b, "{ind}let ix{g} = mr{g} % p.iw;");
                let _ = writeln!(b, "{ind}let t{g} = mr{g} / p.iw;");
                let _ = writeln!(b, "{ind}let y{g} = i32(t{g} % p.ih + p.pt);");
                let _ = writeln!(b, "{ind}let x{g} = i32(ix{g} + p.pl);");
                let _ = writeln!(b, "{ind}let base{g} = (t{g} / p.ih) * p.oh * p.ow * p.oc;");
            }
            Mode::BackpropFilter => {
                // m = (r, s, c)
                let _ = writeln!(b, "{ind}let c{g} = mr{g} % p.ic;");
                let _ = writeln!(b, "{ind}let rs{g} = mr{g} / p.ic;");
                let _ = writeln!(b, "{ind}let y{g} = i32((rs{g} / p.fs) * p.dh) - i32(p.pt);");
                let _ = writeln!(b, "{ind}let x{g} = i32((rs{g} % p.fs) * p.dw) - i32(p.pl);");
            }
        }
    }
    // This invocation's columns.
    let accs = if v.b_n4 { tn / 4 } else { tn };
    if v.b_n4 {
        for j in 0..tn / 4 {
            let _ = writeln!(
                b,
                "{ind}let col{j} = min(n0 + 4u * l + {}u, p.n - 4u);",
                4 * s * j
            );
        }
    } else {
        for t in 0..tn {
            let _ = writeln!(b, "{ind}let col{t} = min(n0 + l + {}u, p.n - 1u);", s * t);
        }
    }
    let acc_ty = if v.b_n4 { "vec4<f32>" } else { "f32" };
    for r in 0..tm {
        for j in 0..accs {
            let _ = writeln!(b, "{ind}var c_{r}_{j} = {acc_ty}();");
        }
    }
    // The products of one step of `ks` reduction values: A values in ra{g} (vec4) or
    // ra{g}_{kk}, B in b{kk}_{j} (vectors along columns), bv{t} (vectors along the
    // reduction) or b{kk}_{t}.
    let fmas = |b: &mut String, ks: usize, ind: &str| {
        for r in 0..tm {
            let (g, lane) = (r / s, r % s);
            let xs: Vec<String> = if v.a && ks == 4 {
                let _ = writeln!(b, "{ind}let av{r} = subgroupBroadcast(ra{g}, {lane}u);");
                (0..4).map(|kk| format!("av{r}.{}", xyzw[kk])).collect()
            } else {
                (0..ks)
                    .map(|kk| {
                        let _ = writeln!(
                            b,
                            "{ind}let av{r}_{kk} = subgroupBroadcast(ra{g}_{kk}, {lane}u);"
                        );
                        format!("av{r}_{kk}")
                    })
                    .collect()
            };
            for j in 0..accs {
                for (kk, x) in xs.iter().enumerate() {
                    let (xx, y) = if v.b_n4 {
                        (format!("vec4<f32>({x})"), format!("b{kk}_{j}"))
                    } else if v.b_k4 && ks == 4 {
                        (x.clone(), format!("bv{j}.{}", xyzw[kk]))
                    } else {
                        (x.clone(), format!("b{kk}_{j}"))
                    };
                    let _ = writeln!(b, "{ind}c_{r}_{j} = fma({xx}, {y}, c_{r}_{j});");
                }
            }
        }
    };
    // B loads of rows kr + kk (row-major [K, N] with row stride oc): modes 0 and 2.
    let b_rows = |b: &mut String, ks: usize, kr: &str, ind: &str| {
        for kk in 0..ks {
            for j in 0..accs {
                if v.b_n4 {
                    let _ = writeln!(
                        b,
                        "{ind}let b{kk}_{j} = bm4[(({kr} + {kk}u) * p.oc + col{j}) / 4u];"
                    );
                } else {
                    let _ = writeln!(
                        b,
                        "{ind}let b{kk}_{j} = bm[({kr} + {kk}u) * p.oc + col{j}];"
                    );
                }
            }
        }
    };
    let mut body = String::new();
    match mode {
        Mode::Forward => {
            let _ = writeln!(body, "    for (var fr = 0u; fr < p.fr; fr += 1u) {{");
            let _ = writeln!(body, "    for (var fs = 0u; fs < p.fs; fs += 1u) {{");
            let i2 = "        ";
            for g in 0..ng {
                let _ = writeln!(body, "{i2}let iy{g} = y{g} + i32(fr * p.dh);");
                let _ = writeln!(body, "{i2}let ix{g} = x{g} + i32(fs * p.dw);");
                let _ = writeln!(
                    body,
                    "{i2}let ok{g} = iy{g} >= 0 && ix{g} >= 0 && iy{g} < i32(p.ih) && ix{g} < i32(p.iw);"
                );
                let _ = writeln!(
                    body,
                    "{i2}let ab{g} = base{g} + (u32(clamp(iy{g}, 0, i32(p.ih) - 1)) * p.iw + u32(clamp(ix{g}, 0, i32(p.iw) - 1))) * p.ic;"
                );
            }
            let _ = writeln!(body, "{i2}let kb = (fr * p.fs + fs) * p.ic;");
            let inner = |body: &mut String, ks: usize, ind: &str| {
                for g in 0..ng {
                    if v.a && ks == 4 {
                        let _ = writeln!(
                            body,
                            "{ind}let ra{g} = select(vec4<f32>(), am4[(ab{g} + c) / 4u], ok{g});"
                        );
                    } else {
                        for kk in 0..ks {
                            let _ = writeln!(
                                body,
                                "{ind}let ra{g}_{kk} = select(0.0, am[ab{g} + c + {kk}u], ok{g});"
                            );
                        }
                    }
                }
                b_rows(body, ks, "kb + c", ind);
                fmas(body, ks, ind);
            };
            let _ = writeln!(body, "{i2}let c4 = p.ic & ~3u;");
            let _ = writeln!(body, "{i2}for (var c = 0u; c < c4; c += 4u) {{");
            inner(&mut body, 4, "            ");
            let _ = writeln!(body, "{i2}}}");
            if !v.a {
                let _ = writeln!(body, "{i2}for (var c = c4; c < p.ic; c += 1u) {{");
                inner(&mut body, 1, "            ");
                let _ = writeln!(body, "{i2}}}");
            }
            let _ = writeln!(body, "    }}\n    }}");
        }
        Mode::BackpropInput => {
            let _ = writeln!(body, "    for (var fr = 0u; fr < p.fr; fr += 1u) {{");
            let _ = writeln!(body, "    for (var fs = 0u; fs < p.fs; fs += 1u) {{");
            let i2 = "        ";
            for g in 0..ng {
                let _ = writeln!(body, "{i2}let ty{g} = y{g} - i32(fr * p.dh);");
                let _ = writeln!(body, "{i2}let tx{g} = x{g} - i32(fs * p.dw);");
                let _ = writeln!(body, "{i2}let oy{g} = u32(max(ty{g}, 0)) / p.sh;");
                let _ = writeln!(body, "{i2}let ox{g} = u32(max(tx{g}, 0)) / p.sw;");
                let _ = writeln!(
                    body,
                    "{i2}let ok{g} = ty{g} >= 0 && tx{g} >= 0 && oy{g} * p.sh == u32(ty{g}) && ox{g} * p.sw == u32(tx{g}) && oy{g} < p.oh && ox{g} < p.ow;"
                );
                let _ = writeln!(
                    body,
                    "{i2}let ab{g} = base{g} + (min(oy{g}, p.oh - 1u) * p.ow + min(ox{g}, p.ow - 1u)) * p.oc;"
                );
            }
            // B[(fr, fs, kc), c] = f[fr, fs, c, kc].
            let _ = writeln!(body, "{i2}let fb = (fr * p.fs + fs) * p.ic * p.oc;");
            let inner = |body: &mut String, ks: usize, ind: &str| {
                for g in 0..ng {
                    if v.a && ks == 4 {
                        let _ = writeln!(
                            body,
                            "{ind}let ra{g} = select(vec4<f32>(), am4[(ab{g} + kc) / 4u], ok{g});"
                        );
                    } else {
                        for kk in 0..ks {
                            let _ = writeln!(
                                body,
                                "{ind}let ra{g}_{kk} = select(0.0, am[ab{g} + kc + {kk}u], ok{g});"
                            );
                        }
                    }
                }
                for t in 0..accs {
                    if v.b_k4 && ks == 4 {
                        let _ = writeln!(
                            body,
                            "{ind}let bv{t} = bm4[(fb + col{t} * p.oc + kc) / 4u];"
                        );
                    } else {
                        for kk in 0..ks {
                            let _ = writeln!(
                                body,
                                "{ind}let b{kk}_{t} = bm[fb + col{t} * p.oc + kc + {kk}u];"
                            );
                        }
                    }
                }
                fmas(body, ks, ind);
            };
            let _ = writeln!(body, "{i2}let k4 = p.oc & ~3u;");
            let _ = writeln!(body, "{i2}for (var kc = 0u; kc < k4; kc += 4u) {{");
            inner(&mut body, 4, "            ");
            let _ = writeln!(body, "{i2}}}");
            if !v.a {
                let _ = writeln!(body, "{i2}for (var kc = k4; kc < p.oc; kc += 1u) {{");
                inner(&mut body, 1, "            ");
                let _ = writeln!(body, "{i2}}}");
            }
            let _ = writeln!(body, "    }}\n    }}");
        }
        Mode::BackpropFilter => {
            let _ = writeln!(body, "    let nbeg = split * p.nper;");
            let _ = writeln!(body, "    let nend = min(p.nb, nbeg + p.nper);");
            let _ = writeln!(body, "    for (var nn = nbeg; nn < nend; nn += 1u) {{");
            let _ = writeln!(body, "    for (var oy = 0u; oy < p.oh; oy += 1u) {{");
            let i2 = "        ";
            for g in 0..ng {
                let _ = writeln!(body, "{i2}let iy{g} = y{g} + i32(oy * p.sh);");
                let _ = writeln!(body, "{i2}let oky{g} = iy{g} >= 0 && iy{g} < i32(p.ih);");
                let _ = writeln!(
                    body,
                    "{i2}let rb{g} = (nn * p.ih + u32(clamp(iy{g}, 0, i32(p.ih) - 1))) * p.iw;"
                );
            }
            let _ = writeln!(body, "{i2}let kr0 = (nn * p.oh + oy) * p.ow;");
            let inner = |body: &mut String, ks: usize, ind: &str| {
                for g in 0..ng {
                    for kk in 0..ks {
                        let _ = writeln!(
                            body,
                            "{ind}let ix{g}_{kk} = x{g} + i32((ox + {kk}u) * p.sw);"
                        );
                        let _ = writeln!(
                            body,
                            "{ind}let ra{g}_{kk} = select(0.0, am[(rb{g} + u32(clamp(ix{g}_{kk}, 0, i32(p.iw) - 1))) * p.ic + c{g}], oky{g} && ix{g}_{kk} >= 0 && ix{g}_{kk} < i32(p.iw));"
                        );
                    }
                }
                b_rows(body, ks, "kr0 + ox", ind);
                fmas(body, ks, ind);
            };
            let _ = writeln!(body, "{i2}let w4 = p.ow & ~3u;");
            let _ = writeln!(body, "{i2}for (var ox = 0u; ox < w4; ox += 4u) {{");
            inner(&mut body, 4, "            ");
            let _ = writeln!(body, "{i2}}}");
            let _ = writeln!(body, "{i2}for (var ox = w4; ox < p.ow; ox += 1u) {{");
            inner(&mut body, 1, "            ");
            let _ = writeln!(body, "{i2}}}");
            let _ = writeln!(body, "    }}\n    }}");
        }
    }
    b.push_str(&body);
    // Stores: C is row-major [M, N] in every mode (NHWC, one group), split s at s * out_len.
    let _ = writeln!(b, "{ind}let obase = split * p.out_len;");
    for r in 0..tm {
        let _ = writeln!(b, "{ind}if m0 + {r}u < p.m {{");
        let _ = writeln!(b, "{ind}    let row = obase + (m0 + {r}u) * p.n;");
        if v.b_n4 {
            for j in 0..tn / 4 {
                let _ = writeln!(
                    b,
                    "{ind}    {{ let gn = n0 + 4u * l + {}u; if gn < p.n {{ out4[(row + gn) / 4u] = c_{r}_{j}; }} }}",
                    4 * s * j
                );
            }
        } else {
            for t in 0..tn {
                let _ = writeln!(
                    b,
                    "{ind}    {{ let gn = n0 + l + {}u; if gn < p.n {{ out[row + gn] = c_{r}_{t}; }} }}",
                    s * t
                );
            }
        }
        let _ = writeln!(b, "{ind}}}");
    }
    let decl = |name: &str, vec: bool, binding: u32| {
        if vec {
            format!(
                "@group(0) @binding({binding}) var<storage, read_write> {name}4: array<vec4<f32>>;\n"
            )
        } else {
            format!("@group(0) @binding({binding}) var<storage, read_write> {name}: array<f32>;\n")
        }
    };
    let mut src = String::from(PARAMS);
    src.push_str(&decl("am", v.a, 1));
    src.push_str(&decl("bm", v.b_n4 || v.b_k4, 2));
    src.push_str(&decl("out", v.b_n4, 3));
    let _ = write!(
        src,
        "
@compute @workgroup_size({s})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) l: u32) {{
    let split = wid.z;
    let m0 = (p.tile_base_y + wid.y) * {tm}u;
    let n0 = wid.x * {bn}u;
{b}}}
",
        bn = s * tn,
    );
    src
}

/// Records `mode` on the CPU path: A is x (forward, filter gradient) or dy (input gradient);
/// B the filter (forward, input gradient) or dy (filter gradient).
#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    lanes: u32,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let dtype = out.desc.dtype;
    let (m, n, k) = match mode {
        Mode::Forward => (g.n * g.oh * g.ow, g.k, g.r * g.s * g.c),
        Mode::BackpropInput => (g.n * g.h * g.w, g.c, g.r * g.s * g.k),
        Mode::BackpropFilter => (g.r * g.s * g.c, g.k, g.n * g.oh * g.ow),
    };
    let tile = match &attrs.tile {
        Some(name) => *CPU_CONV_TILES
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{op}: _tfwgpu_tile {name:?} names no conv tile"))
            })?,
        None => choose(n),
    };
    if !tile.tm.is_multiple_of(lanes) {
        return Err(Error::Unimplemented(format!(
            "{op}: tile {} needs subgroups of a size dividing {}",
            tile.name, tile.tm
        )));
    }
    let v = Vec4s::of(mode, g);
    let bn = (lanes * tile.tn) as usize;
    let tiles_x = n.div_ceil(bn);
    let tiles_y = m.div_ceil(tile.tm as usize);
    let out_len = out.desc.num_elements();
    // Split the batch of the filter gradient when it has few tiles (two threads' worth of
    // work per split at least).
    let splits = match (mode, attrs.splits) {
        (Mode::BackpropFilter, Some(s)) => s.min(g.n).max(1),
        (Mode::BackpropFilter, None) => {
            let tiles = tiles_x * tiles_y;
            if tiles >= 16 || k < 4096 {
                1
            } else {
                16usize.div_ceil(tiles).clamp(1, g.n.clamp(1, 64))
            }
        }
        _ => 1,
    };
    // An invocation of the filter gradient loops over its split's images, their output rows
    // and each row's columns (four at a time, then one by one): at most LOOP_BUDGET iterations
    // in all (lavapipe leaves longer loops early), so large batches split further.
    let per_image = 1 + g.oh * (1 + g.ow / 4 + g.ow % 4);
    let mut nper = g.n.div_ceil(splits);
    if mode == Mode::BackpropFilter {
        if per_image >= LOOP_LIMIT {
            return Err(Error::Unimplemented(format!(
                "{op}: the filter gradient of {} x {} output pixels per image is more than one \
                 invocation of this CPU adapter's kernel can walk (llvmpipe leaves a shader's \
                 loops after {LOOP_LIMIT} iterations)",
                g.oh, g.ow
            )));
        }
        nper = nper.min(LOOP_BUDGET / per_image).max(1);
    }
    let splits = g.n.div_ceil(nper.max(1)).max(1);
    if tiles_x > MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{op}: {n} output columns are too many"
        )));
    }
    let o = crate::kernels::elementwise::bind_out(ctx, op, out)?;
    if k == 0 || a_ref.desc.num_elements() == 0 || b_ref.desc.num_elements() == 0 {
        // An empty reduction (the output itself is not empty): zeros.
        return ctx.clear(&o, out.desc.byte_size());
    }
    let direct = splits == 1;
    let part: BufferRange = if direct {
        o.clone()
    } else {
        ctx.temp((splits * out_len * 4) as u64)?
    };
    let spec = format!(
        "cpu_{}_{}_s{lanes}_{}",
        ["fwd", "bwd_input", "bwd_filter"][mode as usize],
        tile.name,
        v.suffix()
    );
    let pipeline = ctx.pipeline(PipelineKey::new("conv", Some(dtype), spec), || {
        let mut src = ShaderSource::new(wgsl(mode, tile, lanes, v));
        // Every index is clamped into its tensor (rows, columns, pixels) by construction.
        src.checks = Checks::Trusted;
        src
    })?;
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    let max = MAX_GROUPS_X as usize;
    for y0 in (0..tiles_y).step_by(max) {
        let gy = (tiles_y - y0).min(max);
        let words: Vec<u32> = [
            m, n, g.h, g.w, g.c, g.oh, g.ow, g.k, g.r, g.s, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl,
            g.n, nper, out_len, y0,
        ]
        .iter()
        .map(|&v| {
            u32::try_from(v)
                .map_err(|_| Error::Unimplemented(format!("{op}: a size of {v} exceeds 32 bits")))
        })
        .collect::<Result<_>>()?;
        ctx.dispatch(
            &pipeline,
            &params(&words),
            &[a.clone(), b.clone(), part.clone()],
            [tiles_x as u32, gy as u32, splits as u32],
        )?;
    }
    if !direct {
        finalize(ctx, op, &part, splits, out_len, dtype, &o)?;
    }
    Ok(())
}
