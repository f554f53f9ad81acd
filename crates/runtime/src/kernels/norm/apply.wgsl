// Elementwise part of a batch norm, one invocation per output word (two f16 elements), with
// the per-channel coefficients of norm_finalize (rows 4..7 of `res`):
//   p.mode 0/1 (forward): y = (x - r4) * r5 + r6
//   p.mode 2 (training gradient): x_backprop = r5 * ((dy - r6) - (x - r4) * r7)
//   p.mode 3 (inference gradient): x_backprop = dy * r5
// float32 writes four words per invocation, p.groups_x (the number of invocations) apart.
// Placeholders: LOAD_X, LOAD_DY, STORE, COMMON, NORM_COMMON, LINEAR_INDEX.
$NORM_COMMON
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> dy: array<u32>;
@group(0) @binding(3) var<storage, read_write> res: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

$COMMON
$LINEAR_INDEX

fn load_x(i: u32) -> f32 {
    return $LOAD_X;
}
fn load_dy(i: u32) -> f32 {
    return $LOAD_DY;
}

fn elem(e: u32) -> f32 {
    var ch = e % p.c;
    if p.inner != 1u {
        ch = (e / p.inner) % p.c;
    }
    let k = res[5u * p.c + ch];
    if p.mode < 2u {
        return (load_x(e) - res[4u * p.c + ch]) * k + res[6u * p.c + ch];
    }
    if p.mode == 3u {
        return load_dy(e) * k;
    }
    let xc = load_x(e) - res[4u * p.c + ch];
    return k * ((load_dy(e) - res[6u * p.c + ch]) - xc * res[7u * p.c + ch]);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = linear_index(gid);
    if w >= p.words {
        return;
    }
$STORE
}
