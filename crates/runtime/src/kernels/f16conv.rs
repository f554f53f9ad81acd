//! float16 <-> float32 conversions of two halves packed in a u32 word, in two forms:
//!
//! - software (`elementwise/common.wgsl`'s `f16_to_f32` / `f32_to_f16`): exact on every input,
//!   round to nearest even, whatever the driver does; 13-25 integer operations and 2-4
//!   branches per element, which make float16 batch norm and max pool ALU-bound on the H200
//!   (session 5: slower than their float32 counterparts);
//! - hardware (WGSL `unpack2x16float` / `pack2x16float`, one instruction per pair on NVIDIA).
//!   Neither WGSL nor Vulkan promises what TensorFlow needs from them: WGSL leaves the
//!   rounding of a value between two halves to the implementation ("either neighbour"), makes
//!   a value outside the finite half range an indeterminate result (TensorFlow: +-inf), and
//!   Vulkan lets a driver flush denormals (half subnormals) unless `DenormPreserve` is
//!   requested, which wgpu does not expose.
//!
//! So the hardware form is used only on an adapter where a self-test shows it bit-identical to
//! the software form (NaN: any NaN; its sign and payload are not compared) over the hard
//! cases: every one of the 65,536 halves as an input of `unpack2x16float`; and as inputs of
//! `pack2x16float`, for every half h: h's own value, the tie halfway to the next half (both
//! parities of h, the largest finite half's tie that must become infinity), one float32 ulp
//! either side of that tie, one ulp above h, values inside the interval, plus hashed float32
//! bit patterns (denormals, values far beyond 65504, infinities, NaN). The test runs once per
//! process and adapter/driver, on the first float16 kernel that asks (`f16_hardware`), and
//! takes one dispatch and one read back. `TFWGPU_F16_CONVERSIONS=software` forces the
//! software form, `hardware` the hardware form without the test (for measurements only),
//! `auto` (default) tests.
//!
//! NaN's sign and payload: IEEE 754 does not interpret the sign of a NaN, and the H200's
//! conversions (NVIDIA 580) return the canonical positive NaN (0x7fff, 0x7fffffff) for every NaN,
//! as CUDA's `__float2half_rn` does for TensorFlow's own GPU kernels; the software form keeps
//! sign and payload bits (as x86's F16C conversions in TensorFlow's CPU kernels do). The
//! self-test on the H200 (request mem3-1) differed from the software form on exactly the
//! 16,544 cases whose input is a negative NaN, which a model of "round to nearest even, NaN to
//! +0x7fff" reproduces case for case (first failing case 61, same count).
//!
//! Both forms are WGSL functions of the same names, so a shader includes one of the two:
//! `f16x2_to_f32(w: u32) -> vec2<f32>` (low half in .x) and `f32x2_to_f16(v: vec2<f32>) -> u32`,
//! and the one-half `h16_to_f32` / `f32_to_h16`. This module is the one source of the
//! choice: batch norm and max pool (`norm::vec4_io`), Cast, the elementwise binary and unary
//! ops and the float16 wrappers of `nn/f16.rs` include `f16x2_wgsl(choice(..))`.

use std::sync::Mutex;

use crate::kernel::KernelContext;
use crate::kernel_manager::{PipelineKey, ShaderSource};
use crate::kernels::elementwise::COMMON_WGSL;
use crate::kernels::wgsl::params;
use crate::{Error, Result};

/// The software pair (needs `COMMON_WGSL`): exact, independent of the driver; and the
/// one-half forms `h16_to_f32(h)` (h in the low 16 bits) / `f32_to_h16(x)` (the half in the
/// low 16 bits, 0 above).
pub(crate) const F16X2_SOFTWARE: &str = "fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return f32_to_f16(v.x) | (f32_to_f16(v.y) << 16u);
}
fn h16_to_f32(h: u32) -> f32 {
    return f16_to_f32(h);
}
fn f32_to_h16(x: f32) -> u32 {
    return f32_to_f16(x);
}
";

/// The hardware pair and one-half forms: valid where `f16_hardware` said so.
pub(crate) const F16X2_HARDWARE: &str = "fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return unpack2x16float(w);
}
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return pack2x16float(v);
}
fn h16_to_f32(h: u32) -> f32 {
    return unpack2x16float(h).x;
}
fn f32_to_h16(x: f32) -> u32 {
    return pack2x16float(vec2<f32>(x, 0.0));
}
";

/// `snippet` (WGSL generated with `COMMON_WGSL`'s exact one-half conversions `f16_to_f32` /
/// `f32_to_f16`, e.g. `elementwise::load_expr`) with those calls routed through the
/// one-half forms of `f16x2_wgsl(hw)`: the shader includes that pair, and its float16
/// conversions follow the adapter's choice. The software form computes the same bits.
pub(crate) fn routed(snippet: &str) -> String {
    snippet
        .replace("f16_to_f32(", "h16_to_f32(")
        .replace("f32_to_f16(", "f32_to_h16(")
}

/// For a kernel family's float16 pipelines: whether they use the hardware conversions
/// (`f16_hardware`, asked only when `uses_f16`), and the pipeline key suffix ("/hw" or "")
/// that keeps the two forms' pipelines apart.
pub(crate) fn choice(ctx: &KernelContext, uses_f16: bool) -> Result<(bool, &'static str)> {
    let hw = uses_f16 && f16_hardware(ctx)?;
    Ok((hw, if hw { "/hw" } else { "" }))
}

/// The pair to include for `hw` (`f16_hardware`'s answer).
pub(crate) fn f16x2_wgsl(hw: bool) -> &'static str {
    if hw { F16X2_HARDWARE } else { F16X2_SOFTWARE }
}

/// Cases of the self-test: 8 float32 inputs per half for `pack2x16float`, then one word per
/// half for `unpack2x16float`.
const PACK_CASES: u32 = 65536 * 8;
const UNPACK_CASES: u32 = 65536;
const WG: u32 = 256;

/// The self-tests' shared pieces: their parameters (`$PARAMS`) and the case hash and NaN test
/// (`$HELPERS`).
const TEST_PARAMS_WGSL: &str = "struct Params {
    n: u32,
    groups_x: u32,
    pad0: u32,
    pad1: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
";
const TEST_HELPERS_WGSL: &str = "fn hash(x: u32) -> u32 {
    var h = x * 0x9e3779b1u;
    h = (h ^ (h >> 15u)) * 0x85ebca77u;
    h = (h ^ (h >> 13u)) * 0xc2b2ae3du;
    return h ^ (h >> 16u);
}

fn is_nan16(h: u32) -> bool {
    return (h & 0x7fffu) > 0x7c00u;
}
";

const SELF_TEST_WGSL: &str = "$PARAMS
// [0]: cases that differ, [1]: 0xffffffff - the first such case (atomicMax from 0).
@group(0) @binding(1) var<storage, read_write> res: array<atomic<u32>>;

$COMMON
$HW

$HELPERS
// The hardware result equals the software one: the same bits, or both NaN (any sign and
// payload).
fn same16(hw: u32, sw: u32) -> bool {
    if is_nan16(sw) {
        return is_nan16(hw);
    }
    return hw == sw;
}

fn same32(hw: f32, sw: f32) -> bool {
    if is_nan(sw) {
        return is_nan(hw);
    }
    return bitcast<u32>(hw) == bitcast<u32>(sw);
}

// The k-th float32 input derived from half h (k < 8).
fn pack_input(h: u32, k: u32, i: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let mag = h & 0x7fffu;
    let r = hash(i);
    if k == 7u {
        // Any float32: denormals, huge values, infinities, NaN with any payload.
        return bitcast<f32>(r);
    }
    if mag >= 0x7c00u {
        // Infinity or NaN: the value itself, and NaN payloads (quiet and signalling).
        if k == 0u {
            return f16_to_f32(h);
        }
        return bitcast<f32>(sign | 0x7f800000u | max(r & 0x7fffffu, 1u));
    }
    let v = bitcast<u32>(f16_to_f32(mag));
    // The tie halfway to the next half up in magnitude, as float32 bits (exact: a normal
    // half's ulp is 0x2000 float32 units; a subnormal's tie (2m + 1) * 2^-25 is a normal
    // float32).
    var tie: u32;
    if mag < 0x0400u {
        tie = bitcast<u32>(f32(2u * mag + 1u) * 2.98023223876953125e-8);
    } else {
        tie = v + 0x1000u;
    }
    var b: u32;
    switch k {
        case 0u: { b = v; }
        case 1u: { b = tie; }
        case 2u: { b = tie - 1u; }
        case 3u: { b = tie + 1u; }
        case 4u: { b = v + 1u; }
        case 5u: { b = v + 1u + (r % max(tie - v, 1u)); }
        default: { b = tie + (r % max(tie - v, 1u)); }
    }
    return bitcast<f32>(sign | b);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x + gid.x;
    if i >= p.n {
        return;
    }
    var ok = true;
    if i < 524288u {
        let x = pack_input(i >> 3u, i & 7u, i);
        // The second lane: another case's input, so both lanes see every kind of value.
        let j = (i * 2654435761u) % 524288u;
        let y = pack_input(j >> 3u, j & 7u, j);
        let w = f32x2_to_f16(vec2<f32>(x, y));
        ok = same16(w & 0xffffu, f32_to_f16(x)) && same16(w >> 16u, f32_to_f16(y));
    } else {
        let h = i - 524288u;
        let h2 = (h * 40503u + 7u) & 0xffffu;
        let v = f16x2_to_f32(h | (h2 << 16u));
        ok = same32(v.x, f16_to_f32(h)) && same32(v.y, f16_to_f32(h2));
    }
    if !ok {
        atomicAdd(&res[0], 1u);
        atomicMax(&res[1], 0xffffffffu - i);
    }
}
";

/// A self-test's answer for this adapter and driver from `cache` (`what` names it in the
/// poisoned-lock error), else `run`'s, remembered there.
fn cached(
    cache: &Mutex<Vec<(String, bool)>>,
    ctx: &KernelContext,
    what: &str,
    run: impl FnOnce() -> Result<bool>,
) -> Result<bool> {
    let d = &ctx.dev.desc;
    let key = format!("{}|{}|{}|{}", d.backend, d.name, d.driver, d.driver_info);
    if let Some((_, v)) = cache
        .lock()
        .map_err(|_| Error::Gpu(format!("the {what} cache is poisoned")))?
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(*v);
    }
    let v = run()?;
    if let Ok(mut t) = cache.lock() {
        t.push((key, v));
    }
    Ok(v)
}

/// How the conversions were chosen, per adapter and driver: (key, hardware usable).
static TESTED: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

/// Whether float16 kernels on this device may use the hardware conversions
/// (`F16X2_HARDWARE`); see the module documentation.
pub fn f16_hardware(ctx: &KernelContext) -> Result<bool> {
    let mode = std::env::var("TFWGPU_F16_CONVERSIONS").unwrap_or_default();
    match mode.to_ascii_lowercase().as_str() {
        "software" => return Ok(false),
        "hardware" => return Ok(true),
        "" | "auto" => {}
        other => {
            return Err(Error::InvalidArgument(format!(
                "TFWGPU_F16_CONVERSIONS={other}: expected auto, software or hardware"
            )));
        }
    }
    cached(&TESTED, ctx, "float16 conversion", || {
        let d = &ctx.dev.desc;
        let (bad, first) = self_test(ctx)?;
        let hw = bad == 0;
        if hw {
            tracing::info!(
                "float16 conversions on {} ({}): hardware (self-test passed)",
                d.name,
                d.driver
            );
        } else {
            tracing::warn!(
                "float16 conversions on {} ({}): software ({bad} self-test cases differ, first {first})",
                d.name,
                d.driver
            );
        }
        Ok(hw)
    })
}

/// Runs the self-test: (cases that differ, the first of them).
fn self_test(ctx: &KernelContext) -> Result<(u32, u32)> {
    self_test_of(ctx, "hardware", F16X2_HARDWARE)
}

/// Conversions the self-test must reject, one failure mode each (the tests check that it
/// does): round toward zero, subnormal halves flushed to zero (both directions), overflow
/// saturating at 65504.
const FAULTY: &[(&str, &str)] = &[
    (
        "rtz",
        "fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}
fn rtz(x: f32) -> u32 {
    let h = f32_to_f16(x);
    if !is_nan(x) && abs(f16_to_f32(h)) > abs(x) {
        return h - 1u;
    }
    return h;
}
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return rtz(v.x) | (rtz(v.y) << 16u);
}
",
    ),
    (
        "ftz",
        "fn ftz(h: u32) -> u32 {
    if (h & 0x7c00u) == 0u {
        return h & 0x8000u;
    }
    return h;
}
fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(ftz(w & 0xffffu)), f16_to_f32(ftz(w >> 16u)));
}
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return ftz(f32_to_f16(v.x)) | (ftz(f32_to_f16(v.y)) << 16u);
}
",
    ),
    (
        "saturate",
        "fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}
fn sat(x: f32) -> u32 {
    let h = f32_to_f16(x);
    if (h & 0x7fffu) == 0x7c00u && (bitcast<u32>(x) & 0x7fffffffu) != 0x7f800000u {
        return h - 1u;
    }
    return h;
}
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return sat(v.x) | (sat(v.y) << 16u);
}
",
    ),
];

fn self_test_of(ctx: &KernelContext, name: &'static str, conv: &str) -> Result<(u32, u32)> {
    let pipeline = ctx.pipeline(PipelineKey::new("f16conv", None, name), || {
        ShaderSource::new(
            SELF_TEST_WGSL
                .replace("$PARAMS", TEST_PARAMS_WGSL)
                .replace("$HELPERS", TEST_HELPERS_WGSL)
                .replace("$COMMON", COMMON_WGSL)
                .replace("$HW", conv),
        )
    })?;
    let n = PACK_CASES + UNPACK_CASES;
    let groups = n.div_ceil(WG);
    let gx = groups.min(crate::kernel::MAX_GROUPS_X);
    let gy = groups.div_ceil(gx);
    let res = ctx.temp(8)?;
    ctx.clear(&res, 8)?;
    ctx.dispatch(
        &pipeline,
        &params(&[n, gx, 0, 0]),
        std::slice::from_ref(&res),
        [gx, gy, 1],
    )?;
    let bytes = ctx.read(&res, 8)?;
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok((word(0), u32::MAX - word(4)))
}

/// Runs `f` with a kernel context of `dev`, the way a kernel gets one (a kernel with no inputs
/// or outputs, recorded through `Device::record`): how tests and benchmarks reach the
/// self-test. `what` names it in the error if it did not run.
fn with_context<T: Send>(
    dev: &crate::Device,
    what: &str,
    f: impl Fn(&KernelContext) -> Result<T> + Send + Sync,
) -> Result<T> {
    struct Run<F, T>(F, Mutex<Option<T>>);
    impl<F, T> crate::kernel::Kernel for Run<F, T>
    where
        F: Fn(&KernelContext) -> Result<T> + Send + Sync,
        T: Send,
    {
        fn op(&self) -> &'static str {
            "f16conv_probe"
        }
        fn outputs(
            &self,
            _inputs: &[crate::kernel::Operand],
        ) -> Result<Vec<crate::kernel::TensorDesc>> {
            Ok(vec![])
        }
        fn record(
            &self,
            ctx: &KernelContext,
            _inputs: &[crate::kernel::Operand],
            _outputs: &[crate::kernel::DeviceRef],
        ) -> Result<()> {
            let r = (self.0)(ctx)?;
            if let Ok(mut g) = self.1.lock() {
                *g = Some(r);
            }
            Ok(())
        }
    }
    let run = Run(f, Mutex::new(None));
    dev.record(&run, &[], &[])?;
    let r = run.1.into_inner().ok().flatten();
    r.ok_or_else(|| Error::Gpu(format!("the float16 conversion {what} did not run")))
}

/// Whether `dev`'s float16 kernels use the hardware conversions (runs the self-test on first
/// use; follows `TFWGPU_F16_CONVERSIONS`).
pub fn f16_hardware_on(dev: &crate::Device) -> Result<bool> {
    with_context(dev, "probe", f16_hardware)
}

/// Runs the self-test on `dev` now (uncached, whatever `TFWGPU_F16_CONVERSIONS` says) on
/// `conversions`: `hardware` (what `f16_hardware` tests) or one of the faulty software
/// conversions it must reject (`rtz`, `ftz`, `saturate`): the number of cases where they
/// differ from the exact software conversions, and the first of them.
pub fn self_test_on(dev: &crate::Device, conversions: &str) -> Result<(u32, u32)> {
    let (name, conv) = std::iter::once(("hardware", F16X2_HARDWARE))
        .chain(FAULTY.iter().copied())
        .find(|(n, _)| *n == conversions)
        .ok_or_else(|| {
            Error::InvalidArgument(format!("no float16 conversions named {conversions:?}"))
        })?;
    with_context(dev, "self-test", |ctx| self_test_of(ctx, name, conv))
}

/// The native half arithmetic self-test (`f16_native`): for every half h and eight partners b
/// each (h itself, -h, minus the next half up (cancellations down to one subnormal ulp), the
/// smallest subnormals of both signs, the largest subnormal, a hashed half, a hashed half of
/// small magnitude), in `enable f16` arithmetic: `h > b` must equal the float32 comparison
/// (false where either is NaN), and `max(h, b)` must be the larger one's bits (either one's
/// where they compare equal; the number or a NaN where one is NaN) [counted in res[0], first
/// case in res[1]]; and, counted apart (res[2], res[3]: `f16_native` logs them, no kernel adds
/// in half), the half sum `h + b` against the float32 sum rounded once (Eigen's half addition;
/// any NaN for NaN). The halves enter and leave native arithmetic through the hardware
/// conversions (tested by `f16_hardware` first) and `f16(x)` / `f32(v)`.
const NATIVE_TEST_WGSL: &str = "enable f16;

$PARAMS
// [0]: comparison / max cases that differ, [1]: 0xffffffff - the first such case (atomicMax
// from 0); [2], [3]: the same for the sums.
@group(0) @binding(1) var<storage, read_write> res: array<atomic<u32>>;

$COMMON
$CONV

$HELPERS
fn partner(h: u32, k: u32, i: u32) -> u32 {
    switch k {
        case 0u: { return h; }
        case 1u: { return h ^ 0x8000u; }
        case 2u: { return ((h + 1u) & 0xffffu) ^ 0x8000u; }
        case 3u: { return 0x0001u; }
        case 4u: { return 0x8001u; }
        case 5u: { return 0x03ffu; }
        case 6u: { return hash(i) & 0xffffu; }
        default: { return hash(i) & 0x87ffu; }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.groups_x * 256u;
    if i >= p.n {
        return;
    }
    let a = i & 0xffffu;
    let b = partner(a, i >> 16u, i);
    let fa = f16_to_f32(a);
    let fb = f16_to_f32(b);
    let sw = f32_to_f16(fa + fb);
    let hw = native_add(a, b);
    if select(hw != sw, !is_nan16(hw), is_nan16(sw)) {
        atomicAdd(&res[2], 1u);
        atomicMax(&res[3], 0xffffffffu - i);
    }
    let mx = native_max(a, b);
    var bad = false;
    if !is_nan16(a) && !is_nan16(b) {
        bad = native_gt(a, b) != (fa > fb);
        if fa == fb {
            bad = bad || (mx != a && mx != b);
        } else {
            bad = bad || mx != select(b, a, fa > fb);
        }
    } else {
        // Nothing is greater than NaN, nor NaN than anything; max gives the number or a NaN.
        bad = native_gt(a, b);
        let num = select(a, b, is_nan16(a));
        bad = bad || (mx != num && !is_nan16(mx));
    }
    if bad {
        atomicAdd(&res[0], 1u);
        atomicMax(&res[1], 0xffffffffu - i);
    }
}
";

/// The native forms under test: the real one, and faulty ones the test must reject.
const NATIVE_FORMS: [(&str, &str); 2] = [
    (
        "native",
        "fn to_h(bits: u32) -> f16 {
    return f16(unpack2x16float(bits).x);
}
fn native_add(a: u32, b: u32) -> u32 {
    return pack2x16float(vec2<f32>(f32(to_h(a) + to_h(b)), 0.0)) & 0xffffu;
}
fn native_gt(a: u32, b: u32) -> bool {
    return to_h(a) > to_h(b);
}
fn native_max(a: u32, b: u32) -> u32 {
    return pack2x16float(vec2<f32>(f32(max(to_h(a), to_h(b))), 0.0)) & 0xffffu;
}
",
    ),
    (
        "ftz",
        "fn ftz(h: u32) -> u32 {
    if (h & 0x7c00u) == 0u {
        return h & 0x8000u;
    }
    return h;
}
fn to_h(bits: u32) -> f16 {
    return f16(unpack2x16float(ftz(bits)).x);
}
fn native_add(a: u32, b: u32) -> u32 {
    return ftz(pack2x16float(vec2<f32>(f32(to_h(a) + to_h(b)), 0.0)) & 0xffffu);
}
fn native_gt(a: u32, b: u32) -> bool {
    return to_h(a) > to_h(b);
}
fn native_max(a: u32, b: u32) -> u32 {
    return ftz(pack2x16float(vec2<f32>(f32(max(to_h(a), to_h(b))), 0.0)) & 0xffffu);
}
",
    ),
];

/// Per adapter and driver: whether native half arithmetic passed (`f16_native`).
static NATIVE_TESTED: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

/// Whether this device's native half comparisons and max (`enable f16`) are exact as the
/// native float16 pool kernels need them (`pool_f16n.wgsl`): the device has `SHADER_F16`, its
/// hardware conversions passed `f16_hardware`, and the native self-test (`NATIVE_TEST_WGSL`)
/// finds no difference in them (the sums it also checks are only logged). Vulkan lets a driver flush half subnormals
/// unless `DenormPreserve` is requested, which wgpu does not expose, so it is tested. Runs
/// once per process and adapter/driver.
pub fn f16_native(ctx: &KernelContext) -> Result<bool> {
    if !ctx.features().contains(wgpu::Features::SHADER_F16) || !f16_hardware(ctx)? {
        return Ok(false);
    }
    cached(&NATIVE_TESTED, ctx, "native float16", || {
        let d = &ctx.dev.desc;
        let t = native_test_of(ctx, NATIVE_FORMS[0].0, NATIVE_FORMS[0].1)?;
        let ok = t.bad == 0;
        if ok {
            tracing::info!(
                "native float16 comparisons on {} ({}): exact (self-test passed); half sums differ \
                 from float32 rounded once on {} of 524288 cases (first {})",
                d.name,
                d.driver,
                t.add_bad,
                t.add_first
            );
        } else {
            tracing::warn!(
                "native float16 comparisons on {} ({}): not used ({} self-test cases differ, first {})",
                d.name,
                d.driver,
                t.bad,
                t.first
            );
        }
        Ok(ok)
    })
}

/// The native self-test's counts: comparison / max cases that differ and the first of them;
/// sums that differ and the first of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeTest {
    pub bad: u32,
    pub first: u32,
    pub add_bad: u32,
    pub add_first: u32,
}

fn native_test_of(ctx: &KernelContext, name: &'static str, conv: &str) -> Result<NativeTest> {
    let pipeline = ctx.pipeline(PipelineKey::new("f16native", None, name), || {
        ShaderSource::new(
            NATIVE_TEST_WGSL
                .replace("$PARAMS", TEST_PARAMS_WGSL)
                .replace("$HELPERS", TEST_HELPERS_WGSL)
                .replace("$COMMON", COMMON_WGSL)
                .replace("$CONV", conv),
        )
    })?;
    let n = 65536 * 8u32;
    let groups = n.div_ceil(WG);
    let gx = groups.min(crate::kernel::MAX_GROUPS_X);
    let gy = groups.div_ceil(gx);
    let res = ctx.temp(16)?;
    ctx.clear(&res, 16)?;
    ctx.dispatch(
        &pipeline,
        &params(&[n, gx, 0, 0]),
        std::slice::from_ref(&res),
        [gx, gy, 1],
    )?;
    let bytes = ctx.read(&res, 16)?;
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok(NativeTest {
        bad: word(0),
        first: u32::MAX - word(4),
        add_bad: word(8),
        add_first: u32::MAX - word(12),
    })
}

/// Whether `dev` passes `f16_native` (runs the self-tests on first use).
pub fn f16_native_on(dev: &crate::Device) -> Result<bool> {
    with_context(dev, "native probe", f16_native)
}

/// Runs the native self-test on `dev` now (uncached) on `form`: `native` (what `f16_native`
/// tests) or `ftz` (native arithmetic that flushes half subnormals, which it must reject).
/// Needs `SHADER_F16`.
pub fn native_test_on(dev: &crate::Device, form: &str) -> Result<NativeTest> {
    let (name, conv) = NATIVE_FORMS
        .iter()
        .copied()
        .find(|(n, _)| *n == form)
        .ok_or_else(|| Error::InvalidArgument(format!("no native float16 form named {form:?}")))?;
    with_context(dev, "native self-test", |ctx| {
        native_test_of(ctx, name, conv)
    })
}
