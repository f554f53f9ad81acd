// Erf and Erfc in f32 (f16 is computed in f32 and rounded once). Needs COMMON (is_nan) and
// MATH (exp_f32) from the elementwise family; the polynomial coefficients are this family's
// own fits (Chebyshev fits of exp(x^2) erfc(x) converted to monomials in a centred variable,
// and the Taylor series of erf(x) / x), each within about 1e-7 relative error in f32.
// $OP is erf_f32 or erfc_f32; $LOAD_F32(e) reads element e as f32, $STORE_BITS(v) gives the
// output element's bits.
struct Params {
    row: u32,
    n: u32,
    words: u32,
    pad0: u32,
};
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<u32>;

// erfcx(x) = exp(x^2) erfc(x) on [0.5, 2], u = (x - 1.25) / 0.75 (Chebyshev fit, degree 11).
fn erfcx_mid(u: f32) -> f32 {
    var r = -8.713901706869365e-07;
    r = r * u + 3.6089209061174188e-06;
    r = r * u + -1.2056631931045558e-05;
    r = r * u + 4.6794695663265884e-05;
    r = r * u + -0.00017707986989989877;
    r = r * u + 0.0006327226874418557;
    r = r * u + -0.002155080670490861;
    r = r * u + 0.0069644516333937645;
    r = r * u + -0.02118583768606186;
    r = r * u + 0.06007251515984535;
    r = r * u + -0.15661640465259552;
    r = r * u + 0.36782291531562805;
    return r;
}
// x erfcx(x) on x in [2, 10.1] as a function of t = 1/x, u = (t - 0.29950493574142456) / 0.20049504935741425 (degree 9).
fn xerfcx_tail(u: f32) -> f32 {
    var r = 4.601933198955521e-07;
    r = r * u + -7.684511160732654e-07;
    r = r * u + -3.4550528198451502e-06;
    r = r * u + 2.2468953829957172e-05;
    r = r * u + -5.166613482288085e-05;
    r = r * u + -0.00013121604570187628;
    r = r * u + 0.0016782694729045033;
    r = r * u + -0.005462652537971735;
    r = r * u + -0.026959892362356186;
    r = r * u + 0.5416998267173767;
    return r;
}
// Tail interval constants.
const TAIL_MID: f32 = 0.29950493574142456;
const TAIL_INV_HALF: f32 = 4.987654209136963;
// erf(x) / x = 2/sqrt(pi) sum_n (-1)^n x^(2n) / (n! (2n + 1)), s = x^2, |x| < 0.5 (Taylor, 9 terms).
fn erf_small_poly(s: f32) -> f32 {
    var r = 1.6462114444948384e-06;
    r = r * s + -1.4925650248187594e-05;
    r = r * s + 0.00012055332626914605;
    r = r * s + -0.0008548327023163438;
    r = r * s + 0.005223977845162153;
    r = r * s + -0.02686617150902748;
    r = r * s + 0.11283791810274124;
    r = r * s + -0.37612637877464294;
    r = r * s + 1.128379225730896;
    return r;
}

// exp(-x * x) for x >= 0, with x * x carried exactly as xh * xh + (2 xh + xl) xl (xh keeps
// the top 12 significant bits, so xh * xh is exact): the rounding of x * x would otherwise cost
// up to x^2 * 2^-24 relative error (60 ULP near x = 10).
fn exp_neg_sq(v: f32) -> f32 {
    let xh = bitcast<f32>(bitcast<u32>(v) & 0xfffff000u);
    let xl = v - xh;
    return exp_f32(-(xh * xh)) * exp_f32(-((2.0 * xh + xl) * xl));
}

// erfc(a) for a >= 0.5 (0 beyond 10.1, where erfc is below half the smallest subnormal).
fn erfc_pos(a: f32) -> f32 {
    if a >= 10.1 {
        return 0.0;
    }
    let e = exp_neg_sq(a);
    if a < 2.0 {
        return e * erfcx_mid((a - 1.25) * 1.3333333333333333);
    }
    let t = 1.0 / a;
    return e * (xerfcx_tail((t - TAIL_MID) * TAIL_INV_HALF) * t);
}

fn erf_f32(v: f32) -> f32 {
    if is_nan(v) {
        return v;
    }
    let a = abs(v);
    if a < 0.5 {
        return v * erf_small_poly(v * v);
    }
    let r = 1.0 - erfc_pos(a);
    return select(r, -r, v < 0.0);
}

fn erfc_f32(v: f32) -> f32 {
    if is_nan(v) {
        return v;
    }
    let a = abs(v);
    if a < 0.5 {
        return 1.0 - v * erf_small_poly(v * v);
    }
    let c = erfc_pos(a);
    return select(c, 2.0 - c, v < 0.0);
}

fn value(e: u32) -> vec2<u32> {
    return vec2<u32>($STORE_BITS($OP($LOAD_F32(e))), 0u);
}
