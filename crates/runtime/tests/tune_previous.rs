//! Where the tuner's answer for a float32 column path (`im2col_gemm`, an input depth not a
//! multiple of 4) is the previous implicit GEMM, the column path records nothing of its own:
//! no columns, no copy of the filter into a padded temporary (the H200 host log showed that
//! copy in every Keras inference call of the CNN's first layer, one channel, where the tuner
//! had chosen the previous path). The answer is put in the tuner before the first call, as a
//! cache file would give it. Its own binary: the tuner's mode comes from the environment.
mod common;

use common::*;
use tfwgpu_runtime::tune::{Entry, Tuner, bucket};
use tfwgpu_runtime::{Arg, AttrValue, Attrs};

#[test]
fn previous_answer_records_no_column_work() {
    let dir = std::env::temp_dir().join(format!("tfwgpu-tune-prev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: set before the first device use; this test binary has this one test.
    unsafe {
        std::env::set_var("TFWGPU_TUNE", "1");
        std::env::set_var("TFWGPU_TUNE_CACHE", dir.join("tune.json"));
    }
    let d = dev();
    // x [2, 10, 9, 3], f [3, 3, 3, 16], strides 2, SAME: 2 x 5 x 5 outputs; columns of
    // R*S*C = 27 padded to 28, both images in one group.
    let key = format!(
        "conv/f32/im2col_fwd/m{}/n{}/k{}/g{}",
        bucket(50),
        bucket(16),
        bucket(28),
        bucket(1)
    );
    Tuner::of(d.description()).put(
        &key,
        Entry {
            variant: "previous".into(),
            us: 1.0,
        },
    );
    let mut rng = rng(3);
    let x = rand_f32(&mut rng, 2 * 10 * 9 * 3, -1.0, 1.0);
    let f = rand_f32(&mut rng, 3 * 3 * 3 * 16, -1.0, 1.0);
    let tx = d.upload(&x, &[2, 10, 9, 3]).unwrap();
    let tf = d.upload(&f, &[3, 3, 3, 16]).unwrap();
    let run = |tile: &str| {
        let a = Attrs::new()
            .with("strides", AttrValue::Ints(vec![1, 2, 2, 1]))
            .with("padding", AttrValue::Str("SAME".into()))
            .with("_tfwgpu_tile", AttrValue::Str(tile.into()));
        // The second call's dispatches (the first may compile pipelines).
        d.run("Conv2D", &a, &[Arg::from(&tx), Arg::from(&tf)])
            .unwrap();
        let before = d.exec_stats().dispatches;
        let y = d
            .run("Conv2D", &a, &[Arg::from(&tx), Arg::from(&tf)])
            .unwrap()[0]
            .download::<f32>()
            .unwrap();
        (d.exec_stats().dispatches - before, y)
    };
    // "gpu": the GPU path with the tuner (its answer: previous); "gemm": the implicit GEMM
    // alone, what the previous path records.
    let (tuned, y_tuned) = run("gpu");
    let (gemm, y_gemm) = run("gemm");
    assert_eq!(
        tuned, gemm,
        "dispatches of one Conv2D call: tuned to the previous path {tuned}, the implicit GEMM {gemm}"
    );
    assert_eq!(y_tuned, y_gemm, "the same path, the same sums");
    assert_eq!(
        Tuner::of(d.description()).get(&key).map(|e| e.variant),
        Some("previous".to_string())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
