//! The depthwise ops as direct kernels (`depthwise.wgsl`): one invocation per output word for
//! the forward pass and the input gradient (an f16 word is two elements, computed by the same
//! invocation), and for the filter gradient a workgroup per 64 filter columns, tap and split
//! of the N * OH * OW positions, with the splits summed by the conv family's finalize pass.

use crate::kernel::{DeviceRef, KernelContext, MAX_GROUPS_X, grid_1d};
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::{COMMON_WGSL, bind_out};
use crate::kernels::wgsl::{LINEAR_INDEX, params};
use crate::{DType, Error, Result};

use super::gemm::{finalize, load, store_type};
use super::{ConvAttrs, Geom};

const DEPTHWISE_WGSL: &str = include_str!("depthwise.wgsl");
const DEPTHWISE_VEC4_WGSL: &str = include_str!("depthwise_vec4.wgsl");

/// The forward pass (any stride) and the stride-1 input gradient of float32 NHWC depthwise
/// convolutions with multiplier 1 and channels a multiple of 4 (`depthwise_vec4.wgsl`): four
/// channels per invocation with 16-byte loads, a quarter of the index arithmetic of the
/// scalar kernel (which was instruction-bound: three divisions per output element); the same
/// fma order per element, so the same results.
#[allow(clippy::too_many_arguments)]
fn record_vec4(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let o = bind_out(ctx, op, out)?;
    let total = out.desc.num_elements() / 4;
    // Forward passes of filters up to 3x3: the unrolled variant (MODE 2).
    let mode_id = match mode {
        Mode::Forward if g.r <= 3 && g.s <= 3 => 2,
        Mode::Forward => 0,
        _ => 1,
    };
    let pipeline = ctx.pipeline(
        PipelineKey::new(
            "conv",
            Some(DType::F32),
            [
                "depthwise_v4_fwd",
                "depthwise_v4_bwd_input",
                "depthwise_v4_fwd3",
            ][mode_id],
        ),
        || {
            ShaderSource::new(
                DEPTHWISE_VEC4_WGSL
                    .replace("$LINEAR_INDEX", LINEAR_INDEX)
                    .replace("$MODE_ID", &mode_id.to_string()),
            )
        },
    )?;
    let (groups, row) = grid_1d(total as u64, 256);
    let words: Vec<u32> = [
        row as usize,
        total,
        g.h,
        g.w,
        g.c / 4,
        g.oh,
        g.ow,
        g.r,
        g.s,
        g.sh,
        g.sw,
        g.pt,
        g.pl,
        0,
        0,
        0,
    ]
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<_>>()?;
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    ctx.dispatch(&pipeline, &params(&words), &[a, b, o], groups)
}

const DEPTHWISE_BWDF_WGSL: &str = include_str!("depthwise_bwdf.wgsl");

/// Largest filter (rows and columns) of the vector filter-gradient kernel: its per-tap sums
/// live in registers, one vector per tap of a 3x3 window.
const BWDF_MAX_TAPS: usize = 3;

/// The filter gradient of float32 NHWC depthwise convolutions with multiplier 1, channels a
/// multiple of 4 and filters of at most 3x3 (`depthwise_bwdf.wgsl`): per invocation 4 channels
/// and every tap, over a lane of the positions of its split; lanes summed in workgroup
/// memory, splits by `finalize`. The scalar kernel this replaces ran one workgroup per tap
/// (reading dy once per tap) and decomposed every position per tap and channel: 0.52 ms on
/// the 32x56x56x128 3x3 case against cuDNN's 0.059 (request 1 of the conv round).
#[allow(clippy::too_many_arguments)]
fn record_bwd_filter_vec4(
    ctx: &KernelContext,
    op: &str,
    g: &Geom,
    attrs: &ConvAttrs,
    x_ref: &DeviceRef,
    dy_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let cv = g.c / 4;
    let positions = g.n * g.oh * g.ow;
    let cvb = cv.next_power_of_two().min(256);
    let rows = 256 / cvb;
    let blocks = cv.div_ceil(cvb);
    let out_len = g.r * g.s * g.c;
    if blocks > MAX_GROUPS_X as usize {
        return Err(Error::Unimplemented(format!(
            "{op}: {} channels are too many",
            g.c
        )));
    }
    // Splits: about two workgroups per multiprocessor of a large GPU (TARGET_GROUPS in all),
    // each lane walking at least 32 positions (each workgroup ends with a reduction of 9 taps
    // over its lanes; twice as many splits ran 0.13 ms on the H200 where its 51 MB take ~0.05
    // at 1 TB/s, request 1); partial sums at most 64 MiB.
    let splits = attrs
        .splits
        .unwrap_or_else(|| {
            TARGET_GROUPS
                .div_ceil(blocks)
                .min(positions / (32 * rows))
                .max(1)
        })
        .min((64 << 20) / (out_len * 4))
        .clamp(1, MAX_GROUPS_X as usize);
    let chunk = positions.div_ceil(splits).max(1);
    let splits = positions.div_ceil(chunk).max(1);
    let o = bind_out(ctx, op, out)?;
    let part = if splits == 1 {
        o.clone()
    } else {
        ctx.temp((splits * out_len * 4) as u64)?
    };
    let pipeline = ctx.pipeline(
        PipelineKey::new("conv", Some(DType::F32), "depthwise_v4_bwd_filter"),
        || {
            let (mut decl, mut load, mut shift, mut fma, mut reduce) = (
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            );
            for r in 0..BWDF_MAX_TAPS {
                for s in 0..BWDF_MAX_TAPS {
                    decl.push_str(&format!(
                        "    var a{r}{s} = vec4<f32>();\n    var w{r}{s} = vec4<f32>();\n"
                    ));
                    load.push_str(&format!(
                        "                w{r}{s} = x_at(base, y0 + {r}, x0 + {s}, cv);\n"
                    ));
                    fma.push_str(&format!(
                        "            a{r}{s} = fma(w{r}{s}, d, a{r}{s});\n"
                    ));
                }
                shift.push_str(&format!(
                    "                w{r}0 = w{r}1;\n                w{r}1 = w{r}2;\n                w{r}2 = x_at(base, y0 + {r}, x0 + 2, cv);\n"
                ));
            }
            for r in 0..BWDF_MAX_TAPS {
                for s in 0..BWDF_MAX_TAPS {
                    let a = format!("a{r}{s}");
                    reduce.push_str(&format!(
                        "    {{
        red[l] = {a};
        workgroupBarrier();
        for (var st = p.rows / 2u; st > 0u; st = st / 2u) {{
            if lane < st {{
                red[l] = red[l] + red[l + st * p.cvb];
            }}
            workgroupBarrier();
        }}
        if lane == 0u && ok && {r}u < p.fr && {s}u < p.fs {{
            part[wid.y * p.out_len4 + ({r}u * p.fs + {s}u) * p.cv + cv] = red[l];
        }}
        workgroupBarrier();
    }}
"
                    ));
                }
            }
            ShaderSource::new(
                DEPTHWISE_BWDF_WGSL
                    .replace("GEN_DECL", &decl)
                    .replace("GEN_LOAD", &load)
                    .replace("GEN_SHIFT", &shift)
                    .replace("GEN_FMA", &fma)
                    .replace("GEN_REDUCE", &reduce),
            )
        },
    )?;
    let words: Vec<u32> = [
        g.h,
        g.w,
        cv,
        g.oh,
        g.ow,
        g.r,
        g.s,
        g.sh,
        g.sw,
        g.pt,
        g.pl,
        positions,
        chunk,
        cvb,
        rows,
        out_len / 4,
    ]
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<_>>()?;
    let x = ctx.bind(x_ref)?;
    let dy = ctx.bind(dy_ref)?;
    ctx.dispatch(
        &pipeline,
        &params(&words),
        &[x, dy, part.clone()],
        [blocks as u32, splits as u32, 1],
    )?;
    if splits > 1 {
        finalize(ctx, op, &part, splits, out_len, DType::F32, &o)?;
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Forward,
    BackpropInput,
    BackpropFilter,
}

/// Workgroups that keep a large GPU busy.
const TARGET_GROUPS: usize = 264;

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::Unimplemented(format!("{op}: a size of {v} does not fit 32 bits")))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    ctx: &KernelContext,
    op: &str,
    mode: Mode,
    g: &Geom,
    attrs: &ConvAttrs,
    a_ref: &DeviceRef,
    b_ref: &DeviceRef,
    out: &DeviceRef,
) -> Result<()> {
    let dtype = out.desc.dtype;
    if dtype == DType::F32
        && !g.nchw
        && g.mult() == 1
        && g.c.is_multiple_of(4)
        && attrs.tile.is_none()
        && (mode == Mode::Forward || (mode == Mode::BackpropInput && g.sh == 1 && g.sw == 1))
    {
        return record_vec4(ctx, op, mode, g, a_ref, b_ref, out);
    }
    if mode == Mode::BackpropFilter
        && dtype == DType::F32
        && !g.nchw
        && g.mult() == 1
        && g.c.is_multiple_of(4)
        && g.r <= BWDF_MAX_TAPS
        && g.s <= BWDF_MAX_TAPS
        && attrs.tile.is_none()
    {
        return record_bwd_filter_vec4(ctx, op, g, attrs, a_ref, b_ref, out);
    }
    let total = out.desc.num_elements();
    let x = g.x_strides();
    let y = g.y_strides();
    let mult = g.mult();
    let positions = g.n * g.oh * g.ow;
    let o = bind_out(ctx, op, out)?;

    // The filter gradient: splits of the positions, partial sums summed by `finalize`.
    let (splits, chunk, blocks) = if mode == Mode::BackpropFilter {
        let blocks = (g.c * mult).div_ceil(64);
        let taps = g.r * g.s;
        if taps > MAX_GROUPS_X as usize || blocks > MAX_GROUPS_X as usize {
            return Err(Error::Unimplemented(format!(
                "{op}: a {}x{} filter with {} columns is too large",
                g.r,
                g.s,
                g.c * mult
            )));
        }
        let wgs = blocks * taps;
        let mut splits = attrs.splits.unwrap_or_else(|| {
            if wgs >= TARGET_GROUPS {
                1
            } else {
                (2 * TARGET_GROUPS)
                    .div_ceil(wgs)
                    .min(positions / 256)
                    .clamp(1, 1024)
            }
        });
        let max_bind = ctx.limits().max_storage_buffer_binding_size as usize;
        splits = splits
            .min((super::gemm::column_budget(ctx).min(max_bind) / (total * 4)).max(1))
            .min(MAX_GROUPS_X as usize);
        if ctx.loop_limited() {
            // An invocation walks a quarter of its split's positions: at most LOOP_BUDGET.
            splits = splits.max(positions.div_ceil(4 * crate::kernels::wgsl::LOOP_BUDGET));
        }
        let chunk = positions.div_ceil(splits).max(1);
        let splits = positions.div_ceil(chunk).max(1);
        (splits, chunk, blocks)
    } else {
        (1, 0, 0)
    };
    let direct = mode != Mode::BackpropFilter || (dtype == DType::F32 && splits == 1);
    let part = if direct {
        o.clone()
    } else {
        ctx.temp((splits * total * 4) as u64)?
    };

    let (mode_id, spec) = match mode {
        Mode::Forward => (0, "depthwise_fwd"),
        Mode::BackpropInput => (1, "depthwise_bwd_input"),
        Mode::BackpropFilter => (2, "depthwise_bwd_filter"),
    };
    // The output array: packed words for f16 outputs of modes 0 and 1, else f32.
    let packed = dtype == DType::F16 && mode != Mode::BackpropFilter;
    let pipeline = ctx.pipeline(PipelineKey::new("conv", Some(dtype), spec), || {
        let (out_ty, store, partial) = if packed {
            (
                "u32",
                "    let e0 = w * 2u;
    let lo = f32_to_f16(elem(e0));
    var hi = 0u;
    if e0 + 1u < p.total {
        hi = f32_to_f16(elem(e0 + 1u));
    }
    out[w] = lo | (hi << 16u);",
                "bitcast<u32>(sum)",
            )
        } else {
            ("f32", "    out[w] = elem(w);", "sum")
        };
        let (wx, wy) = if mode == Mode::BackpropFilter {
            (64, 4)
        } else {
            (256, 1)
        };
        ShaderSource::new(
            DEPTHWISE_WGSL
                .replace("$LINEAR_INDEX", LINEAR_INDEX)
                .replace("$COMMON", COMMON_WGSL)
                .replace("$STORE", store_type(dtype))
                .replace("$OUT", out_ty)
                .replace("$ELEM_STORE", store)
                .replace("$PARTIAL", partial)
                .replace("$LOAD_A", &load(dtype, "src_a"))
                .replace("$LOAD_B", &load(dtype, "src_b"))
                .replace("$MODE_ID", &mode_id.to_string())
                .replace("$WG_X", &wx.to_string())
                .replace("$WG_Y", &wy.to_string()),
        )
    })?;
    let words_out = if packed { total.div_ceil(2) } else { total };
    let (groups, row) = match mode {
        Mode::BackpropFilter => ([blocks as u32, (g.r * g.s) as u32, splits as u32], 0),
        _ => grid_1d(words_out as u64, 256),
    };
    let words: Vec<u32> = [
        row as usize,
        words_out,
        total,
        g.nchw as usize,
        g.h,
        g.w,
        g.c,
        mult,
        g.oh,
        g.ow,
        g.r,
        g.s,
        g.sh,
        g.sw,
        g.pt,
        g.pl,
        x[0],
        x[1],
        x[2],
        x[3],
        y[0],
        y[1],
        y[2],
        y[3],
        positions,
        chunk,
        total,
        0,
    ]
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<_>>()?;
    let a = ctx.bind(a_ref)?;
    let b = ctx.bind(b_ref)?;
    ctx.dispatch(&pipeline, &params(&words), &[a, b, part.clone()], groups)?;
    if !direct {
        finalize(ctx, op, &part, splits, total, dtype, &o)?;
    }
    Ok(())
}
