//! The device's arrival counters shared by two kernel families: a training batch norm whose
//! statistics are finalized by their last workgroup (`TFWGPU_NORM_ONEPASS=0`: two dispatches)
//! and float16 Conv2D products whose split sums are added by each tile's last arrival
//! (`TFWGPU_CONV_COOP_LAST=force`, emulated cooperative matrices), run one after the other:
//! each leaves the counters at zero for the other, so every result stays right. A binary of
//! its own with one test: the settings are read once per process, and the products' checks
//! capture the labels of every kernel run meanwhile.
mod common;
mod coop_cases;

use tfwgpu_runtime::kernels::matmul::coop::COOP_64X64X64_2X2W1FS;

fn setup() {
    coop_cases::setup_emulated(&[
        ("TFWGPU_CONV_COOP_SPLITS", "1000"),
        ("TFWGPU_CONV_COOP_LAST", "force"),
        ("TFWGPU_NORM_ONEPASS", "0"),
    ]);
}

/// A training batch norm whose statistics are finalized by their last workgroup (two
/// dispatches, `TFWGPU_NORM_ONEPASS=0`), checked against float64; it shares the device's
/// arrival counters with the products above.
fn batch_norm_last_arrival(seed: u64) {
    use tfwgpu_runtime::{AttrValue, Attrs, DType};
    let (n, h, w, c) = (3, 9, 11, 64);
    let mut r = common::rng(seed);
    let x = common::rand_f32(&mut r, n * h * w * c, -2.0, 3.0);
    let scale = common::rand_f32(&mut r, c, 0.5, 1.5);
    let offset = common::rand_f32(&mut r, c, -1.0, 1.0);
    let zeros = vec![0f32; c];
    let d = common::dev();
    let t = |v: &[f32], s: &[usize]| d.upload(v, s).unwrap();
    let (xt, st, ot, mt, vt) = (
        t(&x, &[n, h, w, c]),
        t(&scale, &[c]),
        t(&offset, &[c]),
        t(&zeros, &[c]),
        t(&zeros, &[c]),
    );
    let eps = 1e-3f32;
    let attrs = Attrs::new()
        .with("T", AttrValue::Type(DType::F32))
        .with("U", AttrValue::Type(DType::F32))
        .with("epsilon", AttrValue::Float(eps))
        .with("exponential_avg_factor", AttrValue::Float(1.0))
        .with("data_format", AttrValue::Str("NHWC".into()))
        .with("is_training", AttrValue::Bool(true));
    let args = [&xt, &st, &ot, &mt, &vt].map(tfwgpu_runtime::Arg::from);
    let mut out = vec![];
    let labels = coop_cases::kernels_run(|| {
        out = d.run("FusedBatchNormV3", &attrs, &args).unwrap();
        d.exec().synchronize().unwrap();
    });
    if let Some(labels) = labels {
        assert!(
            labels.iter().any(|l| l.contains("stats_last")),
            "expected the statistics finalized by their last workgroup: {labels:?}"
        );
    }
    let y = out[0].download::<f32>().unwrap();
    let rows = n * h * w;
    for ch in 0..c {
        let col = (0..rows).map(|i| x[i * c + ch] as f64);
        let mean = col.clone().sum::<f64>() / rows as f64;
        let var = col.map(|v| (v - mean) * (v - mean)).sum::<f64>() / rows as f64;
        let k = scale[ch] as f64 / (var + eps as f64).sqrt();
        for i in 0..rows {
            let want = (x[i * c + ch] as f64 - mean) * k + offset[ch] as f64;
            let got = y[i * c + ch] as f64;
            // float32 statistics over `rows` values: a few ulps of the normalized value.
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "batch norm [{i}, {ch}]: got {got}, want {want}"
            );
        }
    }
}

#[test]
fn batch_norm_and_products_share_the_arrival_counters() {
    setup();
    batch_norm_last_arrival(1);
    coop_cases::conv2d_split_k(&[COOP_64X64X64_2X2W1FS]);
    batch_norm_last_arrival(2);
    coop_cases::conv2d_backprop_filter_split_sums(&[COOP_64X64X64_2X2W1FS], 1000);
    batch_norm_last_arrival(3);
}
