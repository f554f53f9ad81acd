// One timestep of a single-layer recurrent network (CudnnRNNV3 and its gradient), one
// invocation per (batch entry b, unit j): i = b * H + j. The products with the recurrent weights
// come from a MatMul dispatched before each step (`hr`, `dhr`); this shader does the gates, the
// state update and what the gradient keeps. All float32. MODE: 0 LSTM, 1 GRU, 2 tanh RNN, 3
// relu RNN. Rows of x-shaped tensors: row(t, b) = t * rs_t + b * rs_b (time- or batch-major).
// A step at t >= lens[b] leaves b's state as it is and outputs zeros (cuDNN's padded sequences).
// Needs common.wgsl and math.wgsl (tanh_f32, sigmoid_f32).
struct Params {
    row: u32,
    n: u32,
    h: u32,
    t: u32,
    rs_t: u32,
    rs_b: u32,
    // G * H: the width of the gate products.
    gh: u32,
    // Forward: 1 to write the reserve (training). Backward: 1 when dhr holds a product.
    flag: u32,
    // Forward: word offsets of the input and recurrent biases in `par`.
    bw: u32,
    br: u32,
    // Forward: word offsets of h_{t-1} and h_t in `hs`. Backward: of step t + 1's gate
    // gradients (read) and step t's (written) in `dgr`.
    hin: u32,
    hout: u32,
    // Word offsets of the c_{t-1} rows (LSTM) and h_{t-1} rows in the reserve.
    cprev: u32,
    hprev: u32,
    // Words per reserve row of gates (4H for LSTM and GRU, H otherwise).
    gw: u32,
    pad: u32,
};

const MODE: u32 = $MODE;
// The GRU's gate columns in params and in the products: update z first, then reset r, then n
// (Keras's order, which it passes unchanged on TensorFlow builds without CUDA; cuDNN's own
// order is r, z, n).
const GRU_Z: u32 = 0u;
const GRU_R: u32 = 1u;

fn row_of(b: u32) -> u32 {
    return p.t * p.rs_t + b * p.rs_b;
}
