// The forward step (after rnn.wgsl). Reserve row r: gates at r * gw (LSTM i, f, g, o; GRU r, z,
// n and the recurrent n product with its bias, in that order whatever the params' order; the
// RNNs' activation), c_{t-1} at cprev + r * H
// (LSTM), h_{t-1} at hprev + r * H.
@group(0) @binding(0) var<uniform> p: Params;
// [rows, gh]: x W^T (no bias).
@group(0) @binding(1) var<storage, read_write> xw: array<f32>;
// [B, gh]: h_{t-1} R^T (no bias); in the fused step R^T itself, [H, gh].
@group(0) @binding(2) var<storage, read_write> hr: array<f32>;
// The weights and biases (float32).
@group(0) @binding(3) var<storage, read_write> par: array<f32>;
// The states: h_{t-1} at hin, h_t at hout.
@group(0) @binding(4) var<storage, read_write> hs: array<f32>;
// [B, H]: the cell state, updated in place (LSTM).
@group(0) @binding(5) var<storage, read_write> c: array<f32>;
// [rows, H]: the output.
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<storage, read_write> res: array<f32>;
@group(0) @binding(8) var<storage, read_write> lens: array<i32>;

$LINEAR_INDEX

// Gate products per unit.
const NG: u32 = $NG;

// The gate pre-activation of gate g: ((x W + b_W) + h R) + b_R, Keras's order where b_W is 0;
// `rec` the products h R.
fn pre(xo: u32, rec: array<f32, 4>, g: u32, j: u32) -> f32 {
    let k = g * p.h + j;
    return ((xw[xo + k] + par[p.bw + k]) + rec[g]) + par[p.br + k];
}

$MAIN

// Unit j of batch entry b (i = b * H + j), given the recurrent products of its gates.
fn cell(i: u32, b: u32, j: u32, rec: array<f32, 4>) {
    let r = row_of(b);
    let live = i32(p.t) < lens[b];
    let h_prev = hs[p.hin + i];
    let xo = r * p.gh;
    let go = r * p.gw;
    var h_new = h_prev;
    var g0 = 0.0;
    var g1 = 0.0;
    var g2 = 0.0;
    var g3 = 0.0;
    if MODE == 0u {
        let c_prev = c[i];
        if live {
            g0 = sigmoid_f32(pre(xo, rec, 0u, j));
            g1 = sigmoid_f32(pre(xo, rec, 1u, j));
            g2 = tanh_f32(pre(xo, rec, 2u, j));
            g3 = sigmoid_f32(pre(xo, rec, 3u, j));
            let c_new = g1 * c_prev + g0 * g2;
            c[i] = c_new;
            h_new = g3 * tanh_f32(c_new);
        }
        if p.flag != 0u {
            res[p.cprev + r * p.h + j] = c_prev;
        }
    } else if MODE == 1u {
        if live {
            // Gate columns z, r, n (see GRU_R, GRU_Z).
            let kr = GRU_R * p.h + j;
            let kz = GRU_Z * p.h + j;
            let kn = 2u * p.h + j;
            let xr = xw[xo + kr] + par[p.bw + kr];
            let xz = xw[xo + kz] + par[p.bw + kz];
            let xn = xw[xo + kn] + par[p.bw + kn];
            let hr_ = rec[GRU_R] + par[p.br + kr];
            let hz = rec[GRU_Z] + par[p.br + kz];
            g3 = rec[2u] + par[p.br + kn];
            g0 = sigmoid_f32(xr + hr_);
            g1 = sigmoid_f32(xz + hz);
            g2 = tanh_f32(xn + g0 * g3);
            h_new = g1 * h_prev + (1.0 - g1) * g2;
        }
    } else {
        if live {
            let z = pre(xo, rec, 0u, j);
            if MODE == 2u {
                g0 = tanh_f32(z);
            } else {
                g0 = select(z, 0.0, z < 0.0);
            }
            h_new = g0;
        }
    }
    hs[p.hout + i] = h_new;
    y[r * p.h + j] = select(0.0, h_new, live);
    if p.flag != 0u {
        res[go + j] = g0;
        if MODE <= 1u {
            res[go + p.h + j] = g1;
            res[go + 2u * p.h + j] = g2;
            res[go + 3u * p.h + j] = g3;
        }
        res[p.hprev + r * p.h + j] = h_prev;
    }
}
