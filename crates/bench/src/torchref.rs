//! `tfwgpu-bench matmul --torch` and `conv --torch`: PyTorch's figures for the same cases on
//! the same GPU, printed beside ours (issue 6: "tfwgpu-bench matmul on a GPU prints figures
//! next to the PyTorch reference"). Runs bench/torch_ref.py or bench/torch_conv.py (compiled
//! into the binary, so a binary carried alone to a GPU host still has them) with the Python of
//! `--python` (default `TFWGPU_TORCH_PYTHON`, else `python3`); that Python needs PyTorch with
//! CUDA. Where it cannot run, the reason is printed and our figures stand alone.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

const TORCH_REF: &str = include_str!("../../../bench/torch_ref.py");
const TORCH_CONV: &str = include_str!("../../../bench/torch_conv.py");

/// The case name torch_ref.py gives a square product of `size` with these transposes.
pub fn case_name(size: usize, ta: bool, tb: bool) -> String {
    format!(
        "matmul_{size}{}{}",
        if ta { "_ta" } else { "" },
        if tb { "_tb" } else { "" }
    )
}

/// How long torch_ref.py may run (CUDA start-up included) before it is stopped.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Runs torch_ref.py for square products of `sizes` (transposes `ta`, `tb`), `reps` timed
/// batches each. Returns its JSON document.
pub fn run(
    python: &str,
    sizes: &[usize],
    (ta, tb): (bool, bool),
    reps: usize,
) -> Result<Value, String> {
    let list: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let transpose = match (ta, tb) {
        (false, false) => "none",
        (true, false) => "a",
        (false, true) => "b",
        (true, true) => "ab",
    };
    let args = [
        "--sizes".to_string(),
        list.join(","),
        "--transpose".to_string(),
        transpose.to_string(),
        "--reps".to_string(),
        reps.to_string(),
    ];
    run_script(python, ("bench/torch_ref.py", TORCH_REF), &args)
}

/// Runs torch_conv.py for the convolution cases `cases` and ops `ops` (float32 with TF32 off
/// and on), `reps` samples each. Returns its JSON document.
pub fn run_conv(python: &str, cases: &[&str], ops: &[&str], reps: usize) -> Result<Value, String> {
    let args = [
        "--cases".to_string(),
        cases.join(","),
        "--ops".to_string(),
        ops.join(","),
        "--reps".to_string(),
        reps.to_string(),
    ];
    run_script(python, ("bench/torch_conv.py", TORCH_CONV), &args)
}

/// Runs `script` (its name for messages, its text) with `args` and `--json FILE`, and returns
/// that JSON document. The script goes to Python on its standard input; its JSON and its error
/// output go to a directory made for this run (none other can have placed a file there),
/// removed afterwards.
fn run_script(python: &str, script: (&str, &str), args: &[String]) -> Result<Value, String> {
    let dir = private_dir()?;
    let res = run_in(&dir, python, script, args);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// A new directory under the temporary one, created (not found) here.
fn private_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = base.join(format!("tfwgpu-torch-ref-{}-{t}", std::process::id()));
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn run_in(
    dir: &Path,
    python: &str,
    (name, text): (&str, &str),
    args: &[String],
) -> Result<Value, String> {
    let out = dir.join("torch.json");
    let err_path = dir.join("stderr.txt");
    let err_file = std::fs::File::create(&err_path).map_err(|e| format!("{e}"))?;
    let mut child = Command::new(python)
        .arg("-")
        .args(args)
        .arg("--json")
        .arg(&out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .map_err(|e| format!("{python}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A Python that exits at once closes the pipe: its status says why.
        let _ = stdin.write_all(text.as_bytes());
    }
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| format!("{python}: {e}"))? {
            Some(st) => break st,
            None if t0.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{python} {name} did not finish in {} s: stopped",
                    TIMEOUT.as_secs()
                ));
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    if !status.success() {
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(format!(
            "{python} {name} failed ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{name}'s JSON: {e}"))
}

/// The (ms, TFLOP/s) of `case` (and `op`, for a convolution) in `mode` (f32 = TF32 off, tf32,
/// f16) in a document of torch_ref.py (which names the mode `mode`) or torch_conv.py (`dtype`).
pub fn figure(doc: &Value, case: &str, op: Option<&str>, mode: &str) -> Option<(f64, f64)> {
    doc["results"].as_array()?.iter().find_map(|x| {
        (x["case"].as_str() == Some(case)
            && op.is_none_or(|o| x["op"].as_str() == Some(o))
            && x["mode"].as_str().or(x["dtype"].as_str()) == Some(mode))
        .then(|| Some((x["ms"].as_f64()?, x["tflops"].as_f64()?)))
        .flatten()
    })
}

/// A table cell: the TFLOP/s of a figure, or "-".
pub fn cell(v: Option<(f64, f64)>) -> String {
    v.map_or("-".to_string(), |(_, tf)| format!("{tf:.1}"))
}

/// A ratio cell ("1.23x" or "-").
pub fn ratio_cell(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |x| format!("{x:.2}x"))
}

/// A goal cell: whether ratio `x` meets goal `g` (">=0.8x met"), or "-" without either.
pub fn goal_cell(g: Option<f64>, x: Option<f64>) -> String {
    match (g, x) {
        (Some(g), Some(x)) => format!(">={g}x {}", if x >= g { "met" } else { "not met" }),
        _ => "-".to_string(),
    }
}

/// Issue 6's goal for a float32 square product of `size` against PyTorch with TF32 off, as a
/// ratio of speeds: 0.8 at 4096, 0.6 at 1024.
pub fn goal(size: usize) -> Option<f64> {
    match size {
        4096 => Some(0.8),
        1024 => Some(0.6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_pair_by_case_and_mode() {
        let doc = json!({"results": [
            {"case": "matmul_1024", "mode": "f32", "ms": 0.1, "tflops": 21.5},
            {"case": "matmul_1024", "mode": "tf32", "ms": 0.02, "tflops": 107.0},
            {"case": "matmul_1024", "mode": "f16", "ms": 0.01, "tflops": 215.0},
            {"case": "matmul_1024_tb", "mode": "f32", "ms": 0.2, "tflops": 10.7},
            {"case": "matmul_4096", "mode": "f32", "ms": null, "tflops": 1.0}
        ]});
        let at = |size, tb, mode| figure(&doc, &case_name(size, false, tb), None, mode);
        assert_eq!(at(1024, false, "f32"), Some((0.1, 21.5)));
        assert_eq!(at(1024, false, "tf32"), Some((0.02, 107.0)));
        assert_eq!(at(1024, false, "f16"), Some((0.01, 215.0)));
        assert_eq!(at(1024, true, "f32"), Some((0.2, 10.7)));
        // A row without a time, or a size not run, gives nothing.
        for mode in ["f32", "tf32", "f16"] {
            assert_eq!(at(4096, false, mode), None);
            assert_eq!(at(512, false, mode), None);
        }
    }

    #[test]
    fn conv_rows_pair_by_case_op_and_mode() {
        let doc = json!({"results": [
            {"case": "r50_14", "op": "fwd", "dtype": "f32", "ms": 0.2, "tflops": 30.0},
            {"case": "r50_14", "op": "fwd", "dtype": "tf32", "ms": 0.1, "tflops": 60.0},
            {"case": "r50_14", "op": "bwd_input", "dtype": "f32", "ms": 0.3, "tflops": 20.0}
        ]});
        let at = |case, op, mode| figure(&doc, case, Some(op), mode);
        assert_eq!(at("r50_14", "fwd", "tf32"), Some((0.1, 60.0)));
        assert_eq!(at("r50_14", "bwd_input", "f32"), Some((0.3, 20.0)));
        assert_eq!(at("r50_14", "bwd_filter", "f32"), None);
        assert_eq!(at("r50_7", "fwd", "f32"), None);
    }

    #[test]
    fn cells() {
        assert_eq!(cell(Some((0.1, 21.54))), "21.5");
        assert_eq!(cell(None), "-");
        assert_eq!(ratio_cell(Some(0.766)), "0.77x");
        assert_eq!(goal_cell(Some(0.8), Some(0.89)), ">=0.8x met");
        assert_eq!(goal_cell(Some(0.6), Some(0.5)), ">=0.6x not met");
        assert_eq!(goal_cell(None, Some(0.5)), "-");
    }

    /// The embedded scripts take the options `run` and `run_conv` pass.
    #[test]
    fn the_embedded_scripts_take_the_options_passed() {
        for opt in ["\"--sizes\"", "\"--transpose\"", "\"--reps\"", "\"--json\""] {
            assert!(TORCH_REF.contains(opt), "{opt}");
        }
        for opt in ["\"--cases\"", "\"--ops\"", "\"--reps\"", "\"--json\""] {
            assert!(TORCH_CONV.contains(opt), "{opt}");
        }
        assert_eq!(case_name(64, true, true), "matmul_64_ta_tb");
    }

    /// Without a Python that can run the script, `run` says why instead of failing silently.
    #[test]
    fn a_missing_python_is_reported() {
        let err = run("/nonexistent/python3", &[64], (false, false), 1).unwrap_err();
        assert!(err.contains("/nonexistent/python3"), "{err}");
        // A Python that runs the script and fails: its last error lines are reported.
        if let Ok(st) = Command::new("python3").arg("-c").arg("pass").status()
            && st.success()
        {
            let err = run("python3", &[64], (false, false), 1);
            if let Err(e) = err {
                assert!(e.contains("failed"), "{e}");
            }
        }
    }
}
