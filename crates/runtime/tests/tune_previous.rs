//! Where the tuner's answer for a float32 column path (an input depth not a multiple of 4:
//! `im2col_gemm` for the forward pass, `bwd_input_col2im` for the input gradient) is the
//! previous implicit GEMM, the column path records nothing of its own: no columns, no copy of
//! the filter into a padded temporary (the H200 host log showed that copy in every Keras
//! inference call of the CNN's first layer, one channel, where the tuner had chosen the
//! previous path). The answers are put in the tuner before the first call, as a cache file
//! would give them; the cache file then holds those answers only, so no key was missed (a
//! missed key would have been timed and added). Its own binary: the tuner's mode comes from
//! the environment.
mod common;

use common::*;
use tfwgpu_runtime::tune::{Entry, Tuner, bucket};
use tfwgpu_runtime::{Arg, AttrValue, Attrs, HostTensor};

#[test]
fn previous_answer_records_no_column_work() {
    let (dir, path) = tuning_with_fresh_cache("tune-prev");
    let d = dev();
    // x [2, 10, 9, 3], f [3, 3, 3, 16], strides 2, SAME: 2 x 5 x 5 outputs; columns of
    // R*S*C = 27 padded to 28, both images in one group (M 50).
    let keys = [
        format!(
            "conv/f32/im2col_fwd/m{}/n{}/k{}/g{}",
            bucket(50),
            bucket(16),
            bucket(28),
            bucket(1)
        ),
        format!(
            "conv/f32/col2im/r3s3/st2x2/m{}/n{}/k{}",
            bucket(50),
            bucket(28),
            bucket(16)
        ),
    ];
    let tuner = Tuner::of(d.description());
    for key in &keys {
        tuner.put(
            key,
            Entry {
                variant: "previous".into(),
                us: 1.0,
            },
        );
    }
    let mut rng = rng(3);
    let x = rand_f32(&mut rng, 2 * 10 * 9 * 3, -1.0, 1.0);
    let f = rand_f32(&mut rng, 3 * 3 * 3 * 16, -1.0, 1.0);
    let dy = rand_f32(&mut rng, 2 * 5 * 5 * 16, -1.0, 1.0);
    let tx = d.upload(&x, &[2, 10, 9, 3]).unwrap();
    let tf = d.upload(&f, &[3, 3, 3, 16]).unwrap();
    let tdy = d.upload(&dy, &[2, 5, 5, 16]).unwrap();
    let xs = HostTensor::vec_i32(&[2, 10, 9, 3]);
    let run = |op: &str, args: &[Arg], tile: &str| {
        let a = Attrs::new()
            .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
            .with("padding", AttrValue::Str("SAME".into()))
            .with("_tfwgpu_tile", AttrValue::Str(tile.into()));
        // The second call's dispatches (the first may compile pipelines).
        d.run(op, &a, args).unwrap();
        let before = d.exec_stats().dispatches;
        let y = d.run(op, &a, args).unwrap()[0].download::<f32>().unwrap();
        (d.exec_stats().dispatches - before, y)
    };
    for (op, args) in [
        ("Conv2D", vec![Arg::from(&tx), Arg::from(&tf)]),
        (
            "Conv2DBackpropInput",
            vec![Arg::from(&xs), Arg::from(&tf), Arg::from(&tdy)],
        ),
    ] {
        // "gpu": the GPU path with the tuner (its answer: previous); "gemm": the implicit
        // GEMM alone, what the previous path records.
        let (tuned, y_tuned) = run(op, &args, "gpu");
        let (gemm, y_gemm) = run(op, &args, "gemm");
        assert_eq!(
            tuned, gemm,
            "{op}: dispatches of one call tuned to the previous path {tuned}, the implicit GEMM \
             {gemm}"
        );
        assert_eq!(y_tuned, y_gemm, "{op}: the same path, the same sums");
    }
    // Nothing was timed: the cache holds the two answers put, nothing else.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the tuner's cache")).unwrap();
    let entries: Vec<&String> = doc["adapters"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|a| a.as_object().unwrap().keys())
        .collect();
    assert_eq!(entries.len(), keys.len(), "{entries:?}");
    for key in &keys {
        assert!(entries.contains(&key), "{key} not in {entries:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
