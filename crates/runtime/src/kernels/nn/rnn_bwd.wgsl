// The backward step (after rnn.wgsl), from t = T - 1 down to 0. dL/dh_t is the output's gradient
// at t, plus `pass` (what reaches h_t from step t + 1 other than through R, and the gradient of
// the final state at t = T - 1), plus `dhr` (the gradient of step t + 1's gates times R) when
// p.flag is 1. Writes the gates' pre-activation gradients: `dgx` for x W and b_W, `dgh` (GRU,
// in `aux`) for h R and b_R, and `dgr` = dgh's rows of this step, contiguous, for the next
// product with R. LSTM keeps dL/dc in `aux`, in place.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> dhr: array<f32>;
@group(0) @binding(3) var<storage, read_write> pass_: array<f32>;
@group(0) @binding(4) var<storage, read_write> aux: array<f32>;
@group(0) @binding(5) var<storage, read_write> res: array<f32>;
@group(0) @binding(6) var<storage, read_write> dgx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dgr: array<f32>;
@group(0) @binding(8) var<storage, read_write> lens: array<i32>;

$LINEAR_INDEX

$MAIN

// Unit j of batch entry b (i = b * H + j), given the product of step t + 1's gate gradients
// with R (`rec`, when p.flag is 1). Writes this step's `dgr` rows at word p.hout.
fn cell(i: u32, b: u32, j: u32, rec: f32) {
    let r = row_of(b);
    let live = i32(p.t) < lens[b];
    var dh = pass_[i];
    if p.flag != 0u {
        dh = dh + rec;
    }
    let xo = r * p.gh;
    let ro = p.hout + b * p.gh;
    let ng = select(1u, 4u, MODE == 0u);
    let ngx = select(ng, 3u, MODE == 1u);
    if !live {
        // A padded step: the state passes through; its gates get nothing.
        pass_[i] = dh;
        for (var g = 0u; g < ngx; g++) {
            dgx[xo + g * p.h + j] = 0.0;
            dgr[ro + g * p.h + j] = 0.0;
            if MODE == 1u {
                aux[xo + g * p.h + j] = 0.0;
            }
        }
        return;
    }
    dh = dh + dy[r * p.h + j];
    let go = r * p.gw;
    let g0 = res[go + j];
    if MODE == 0u {
        let g1 = res[go + p.h + j];
        let g2 = res[go + 2u * p.h + j];
        let g3 = res[go + 3u * p.h + j];
        let c_prev = res[p.cprev + r * p.h + j];
        let tc = tanh_f32(g1 * c_prev + g0 * g2);
        let dc = aux[i] + dh * g3 * (1.0 - tc * tc);
        let di = dc * g2 * g0 * (1.0 - g0);
        let df = dc * c_prev * g1 * (1.0 - g1);
        let dg = dc * g0 * (1.0 - g2 * g2);
        let do_ = dh * tc * g3 * (1.0 - g3);
        aux[i] = dc * g1;
        pass_[i] = 0.0;
        dgx[xo + j] = di;
        dgx[xo + p.h + j] = df;
        dgx[xo + 2u * p.h + j] = dg;
        dgx[xo + 3u * p.h + j] = do_;
        dgr[ro + j] = di;
        dgr[ro + p.h + j] = df;
        dgr[ro + 2u * p.h + j] = dg;
        dgr[ro + 3u * p.h + j] = do_;
    } else if MODE == 1u {
        let z = res[go + p.h + j];
        let n = res[go + 2u * p.h + j];
        let hn = res[go + 3u * p.h + j];
        let h_prev = res[p.hprev + r * p.h + j];
        let dn = dh * (1.0 - z) * (1.0 - n * n);
        let dr = dn * hn * g0 * (1.0 - g0);
        let dz = dh * (h_prev - n) * z * (1.0 - z);
        pass_[i] = dh * z;
        let kr = GRU_R * p.h + j;
        let kz = GRU_Z * p.h + j;
        let kn = 2u * p.h + j;
        dgx[xo + kr] = dr;
        dgx[xo + kz] = dz;
        dgx[xo + kn] = dn;
        aux[xo + kr] = dr;
        aux[xo + kz] = dz;
        aux[xo + kn] = dn * g0;
        dgr[ro + kr] = dr;
        dgr[ro + kz] = dz;
        dgr[ro + kn] = dn * g0;
    } else {
        var d = 0.0;
        if MODE == 2u {
            d = dh * (1.0 - g0 * g0);
        } else if g0 > 0.0 {
            d = dh;
        }
        pass_[i] = 0.0;
        dgx[xo + j] = d;
        dgr[ro + j] = d;
    }
}
