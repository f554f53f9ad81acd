//! A small autotuner: for a kernel family and a shape class, time the valid variants once on
//! first use, remember the fastest in memory and in an on-disk cache, per adapter and driver.
//!
//! - Key of a decision: a string the kernel builds from its family, dtype and shape class
//!   (bucketed sizes, layouts), e.g. `matmul/f32/nn/m4096/n4096/k4096/b1`.
//! - Cache file: `TFWGPU_TUNE_CACHE` if set, else `$XDG_CACHE_HOME/tfwgpu/tune-v1.json`, else
//!   `$HOME/.cache/tfwgpu/tune-v1.json`. JSON: `{"format": "tfwgpu-tune-v1", "adapters":
//!   {ADAPTER: {KEY: {"variant": NAME, "us": MICROSECONDS}}}}` where ADAPTER is the adapter's
//!   name, backend, driver, driver info and the runtime's version. Writes go to a temporary
//!   file renamed over the cache (atomic); entries of other adapters are kept. A file that
//!   cannot be read or parsed, or has another format, is ignored with a warning (and replaced
//!   on the next write), never an error.
//! - `TFWGPU_TUNE=0` turns tuning off (each kernel's heuristic choice); `TFWGPU_TUNE=1` turns it
//!   on everywhere. Unset: on for GPU adapters, off for CPU adapters (lavapipe, SwiftShader),
//!   where compiling and timing every variant costs seconds of host time per shape class and
//!   the CPU variants have their own fixed choice.
//! - Timing: every variant runs once (pipeline compile), then ~150 ms of back-to-back runs of
//!   the first one bring the GPU's clocks up (an idle GPU drops them), then each variant runs
//!   once more alone to size the sample, then the median of three samples of back-to-back runs
//!   (~2 ms each) with one host wait each: synchronous wall time (no GPU timestamps yet).
//!   A variant that fails to record is skipped; if all fail, the heuristic choice stands.
//!
//! Tuning never changes what is computed: every variant of a family computes the same exact
//! float32 fma sums, in its own order. One exception: the conv family's Winograd variants
//! (3x3 stride-1 layers, `kernels/conv/winograd.rs`) sum transformed products (additions,
//! subtractions and halvings of the same terms, then the same products): the same value up
//! to rounding, with an error bound of their own (tests/conv.rs `check_winograd`);
//! `TFWGPU_CONV_WINOGRAD=0` leaves them out of the candidates.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::{Map, Value, json};

use crate::kernel::KernelContext;
use crate::kernel_manager::FastMap;
use crate::{AdapterDescription, Result};

/// The cache file's format tag.
pub const FORMAT: &str = "tfwgpu-tune-v1";

/// Whether tuning is on, from `TFWGPU_TUNE` and the adapter type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    On,
    /// On for GPU adapters, off for CPU adapters.
    Auto,
}

impl Mode {
    pub fn from_env() -> Mode {
        match crate::env_word("TFWGPU_TUNE").as_deref() {
            Some("0") | Some("off") | Some("false") => Mode::Off,
            Some("1") | Some("on") | Some("true") => Mode::On,
            _ => Mode::Auto,
        }
    }

    pub fn enabled(self, desc: &AdapterDescription) -> bool {
        match self {
            Mode::Off => false,
            Mode::On => true,
            Mode::Auto => desc.device_type != "cpu",
        }
    }
}

/// The cache file path from the environment (None: no file, memory only).
pub fn cache_path_from_env() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TFWGPU_TUNE_CACHE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tfwgpu").join("tune-v1.json"))
}

/// The identity of an adapter and driver in the cache.
pub fn adapter_key(desc: &AdapterDescription) -> String {
    format!(
        "{} | {} | {} | {} | tfwgpu {}",
        desc.name,
        desc.backend,
        desc.driver,
        desc.driver_info,
        env!("CARGO_PKG_VERSION")
    )
}

/// One remembered decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub variant: String,
    /// The winner's time per run, microseconds (informative).
    pub us: f64,
}

/// The decisions of one adapter, backed by a file shared with other adapters.
pub struct Tuner {
    enabled: bool,
    adapter: String,
    path: Option<PathBuf>,
    entries: Mutex<HashMap<String, Entry>>,
    /// [`Tuner::choose_memo`]'s answers by the words that determine a call site's key and
    /// variant names: a kernel that runs on the same shapes step after step finds its
    /// decision here without formatting its key and names (strings) on every call.
    memo: Mutex<FastMap<Box<[u64]>, usize>>,
}

/// Most answers [`Tuner::choose_memo`] keeps (cleared when full: a program whose shapes keep
/// changing formats keys and names again, as without the memo).
pub const MEMO_ENTRIES: usize = 4096;

/// Whether [`Tuner::choose_memo`] keeps answers (`TFWGPU_TUNE_MEMO=0`: off, every call
/// formats its key and names and asks [`Tuner::choose`], as before the memo). Read once.
pub fn memo_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !crate::env_is("TFWGPU_TUNE_MEMO", "0"))
}

/// Reads the entries of `adapter` from `path`; a missing file is empty, a bad one is empty
/// with a warning.
pub fn load(path: &std::path::Path, adapter: &str) -> HashMap<String, Entry> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            tracing::warn!("tune cache {}: {e}; ignored", path.display());
            return HashMap::new();
        }
    };
    let Some(adapters) = parse(&text) else {
        tracing::warn!(
            "tune cache {}: not a {FORMAT} file; ignored",
            path.display()
        );
        return HashMap::new();
    };
    let mut out = HashMap::new();
    if let Some(Value::Object(entries)) = adapters.get(adapter) {
        for (k, v) in entries {
            let variant = v.get("variant").and_then(Value::as_str);
            let us = v.get("us").and_then(Value::as_f64).unwrap_or(0.0);
            match variant {
                Some(name) => {
                    out.insert(
                        k.clone(),
                        Entry {
                            variant: name.to_string(),
                            us,
                        },
                    );
                }
                None => tracing::warn!("tune cache {}: bad entry {k:?}", path.display()),
            }
        }
    }
    out
}

/// The `adapters` object of a cache file's text, if it is one.
fn parse(text: &str) -> Option<Map<String, Value>> {
    let v: Value = serde_json::from_str(text).ok()?;
    if v.get("format")?.as_str()? != FORMAT {
        return None;
    }
    match v.get("adapters")? {
        Value::Object(m) => Some(m.clone()),
        _ => None,
    }
}

/// Writes the entries of `adapter` into `path` (keeping other adapters' entries of a valid
/// file), through a temporary file and a rename.
pub fn store(
    path: &std::path::Path,
    adapter: &str,
    entries: &HashMap<String, Entry>,
) -> std::io::Result<()> {
    let mut adapters = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| parse(&t))
        .unwrap_or_default();
    let mut mine = Map::new();
    let mut keys: Vec<&String> = entries.keys().collect();
    keys.sort();
    for k in keys {
        let e = &entries[k];
        mine.insert(k.clone(), json!({"variant": e.variant, "us": e.us}));
    }
    adapters.insert(adapter.to_string(), Value::Object(mine));
    let doc = json!({"format": FORMAT, "adapters": Value::Object(adapters)});
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

impl Tuner {
    /// A tuner for `desc` with an explicit mode and cache file.
    pub fn new(desc: &AdapterDescription, mode: Mode, path: Option<PathBuf>) -> Tuner {
        let adapter = adapter_key(desc);
        let enabled = mode.enabled(desc);
        let entries = match (&path, enabled) {
            (Some(p), true) => load(p, &adapter),
            _ => HashMap::new(),
        };
        Tuner {
            enabled,
            adapter,
            path,
            entries: Mutex::new(entries),
            memo: Mutex::new(FastMap::default()),
        }
    }

    /// The process-wide tuner of an adapter (mode and cache file from the environment).
    pub fn of(desc: &AdapterDescription) -> Arc<Tuner> {
        static TUNERS: OnceLock<Mutex<HashMap<String, Arc<Tuner>>>> = OnceLock::new();
        let key = adapter_key(desc);
        TUNERS
            .get_or_init(Default::default)
            .lock()
            .entry(key)
            .or_insert_with(|| Arc::new(Tuner::new(desc, Mode::from_env(), cache_path_from_env())))
            .clone()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The remembered decision for `key`.
    pub fn get(&self, key: &str) -> Option<Entry> {
        self.entries.lock().get(key).cloned()
    }

    /// Remembers a decision and writes the cache file (a failed write is a warning).
    pub fn put(&self, key: &str, entry: Entry) {
        let mut entries = self.entries.lock();
        entries.insert(key.to_string(), entry);
        if let Some(p) = &self.path
            && let Err(e) = store(p, &self.adapter, &entries)
        {
            tracing::warn!("tune cache {}: {e}; not saved", p.display());
        }
    }

    /// Chooses among `names` (variant names, all valid for the shape) for `key`: the
    /// remembered choice if it is one of them, else (tuning on) the fastest by timing `run`,
    /// else `names[heuristic]`. `run(i)` records one run of variant `i` on `ctx`.
    pub fn choose(
        &self,
        ctx: &KernelContext,
        key: &str,
        names: &[String],
        heuristic: usize,
        run: &dyn Fn(usize) -> Result<()>,
    ) -> usize {
        self.decide(ctx, key, names, heuristic, run).0
    }

    /// [`Tuner::choose`] behind a memo of its answers: `memo` holds every value that
    /// determines the call site's `key` and `names` (a tag of the site first, then the shape
    /// and the attributes it builds them from), which are formatted only when the memo has no
    /// answer for `memo`. An answer is kept once it is final: the remembered or newly tuned
    /// choice, or the heuristic where there is nothing to choose (not the heuristic a failed
    /// tuning fell back to: that call site tunes again next time, as `choose` does).
    #[allow(clippy::too_many_arguments)]
    pub fn choose_memo(
        &self,
        ctx: &KernelContext,
        memo: &[u64],
        key: impl FnOnce() -> String,
        names: impl FnOnce() -> Vec<String>,
        heuristic: usize,
        run: &dyn Fn(usize) -> Result<()>,
    ) -> usize {
        let on = memo_on();
        if on && let Some(&i) = self.memo.lock().get(memo) {
            return i;
        }
        let names = names();
        let (i, fin) = self.decide(ctx, &key(), &names, heuristic, run);
        if on && fin {
            let mut m = self.memo.lock();
            if m.len() >= MEMO_ENTRIES {
                m.clear();
            }
            m.insert(memo.into(), i);
        }
        i
    }

    /// `choose`, and whether its answer is final (see `choose_memo`).
    fn decide(
        &self,
        ctx: &KernelContext,
        key: &str,
        names: &[String],
        heuristic: usize,
        run: &dyn Fn(usize) -> Result<()>,
    ) -> (usize, bool) {
        let heuristic = heuristic.min(names.len().saturating_sub(1));
        if !self.enabled || names.len() < 2 {
            return (heuristic, true);
        }
        if let Some(e) = self.get(key)
            && let Some(i) = names.iter().position(|n| *n == e.variant)
        {
            return (i, true);
        }
        let exec = &ctx.dev.exec;
        // First every variant once (pipeline compilation: host time, the GPU idle), then
        // ~WARM_UP of back-to-back runs of the first one that works: an idle GPU drops its
        // clocks (the H200 to 345 MHz of 1980 within a second of idling, and then ramped back
        // up only under sustained load: conv request 2), which would time the first variants
        // at a fraction of the speed of the later ones.
        let mut ok = vec![false; names.len()];
        for (i, flag) in ok.iter_mut().enumerate() {
            *flag = run(i).is_ok();
        }
        if exec.synchronize().is_err() {
            return (heuristic, false);
        }
        if let Some(first) = ok.iter().position(|&f| f) {
            let t0 = Instant::now();
            while t0.elapsed().as_secs_f64() < WARM_UP {
                for _ in 0..4 {
                    if run(first).is_err() {
                        break;
                    }
                }
                if exec.synchronize().is_err() {
                    return (heuristic, false);
                }
            }
        }
        let time = |i: usize| -> Result<f64> {
            if !ok[i] {
                return Err(crate::Error::InvalidArgument(format!(
                    "variant {} failed to record",
                    names[i]
                )));
            }
            exec.synchronize()?;
            run(i)?;
            exec.synchronize()?;
            let t0 = Instant::now();
            run(i)?;
            exec.synchronize()?;
            let one = t0.elapsed().as_secs_f64();
            let n = ((2e-3 / one.max(1e-7)) as usize).clamp(1, 50);
            let mut samples = [0.0f64; 3];
            for s in &mut samples {
                let t0 = Instant::now();
                for _ in 0..n {
                    run(i)?;
                }
                exec.synchronize()?;
                *s = t0.elapsed().as_secs_f64() / n as f64;
            }
            samples.sort_by(f64::total_cmp);
            Ok(samples[1])
        };
        let mut best: Option<(usize, f64)> = None;
        for (i, name) in names.iter().enumerate() {
            match time(i) {
                Ok(t) => {
                    tracing::debug!("tune {key}: {name} {:.1} us", t * 1e6);
                    if best.is_none_or(|(_, b)| t < b) {
                        best = Some((i, t));
                    }
                }
                Err(e) => tracing::debug!("tune {key}: {name} failed: {e}"),
            }
        }
        match best {
            Some((i, t)) => {
                tracing::info!(
                    "tune {key}: {} ({:.1} us; heuristic {})",
                    names[i],
                    t * 1e6,
                    names[heuristic]
                );
                self.put(
                    key,
                    Entry {
                        variant: names[i].clone(),
                        us: t * 1e6,
                    },
                );
                (i, true)
            }
            None => (heuristic, false),
        }
    }
}

/// Seconds of back-to-back runs before a tuner's timings (see `Tuner::choose`).
const WARM_UP: f64 = 0.15;

/// The bucket of a size: powers of two, exact below 64 (shape classes of similar tile counts).
pub fn bucket(v: usize) -> usize {
    if v < 64 { v } else { v.next_power_of_two() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(name: &str, device_type: &str) -> AdapterDescription {
        AdapterDescription {
            index: 0,
            name: name.into(),
            backend: "Vulkan".into(),
            driver: "drv".into(),
            driver_info: "1.2.3".into(),
            device_type: device_type.into(),
            vendor: 0,
            device: 0,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            limits: wgpu::Limits::default(),
            features: wgpu::Features::empty(),
            device_memory: None,
            cooperative_matrix: vec![],
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tfwgpu-tune-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn cache_round_trip_keeps_other_adapters() {
        let path = tmp("round.json");
        let _ = std::fs::remove_file(&path);
        let a = adapter_key(&desc("GPU A", "gpu"));
        let b = adapter_key(&desc("GPU B", "gpu"));
        let mut ea = HashMap::new();
        ea.insert(
            "matmul/f32/x".to_string(),
            Entry {
                variant: "128x256x16_8x16s1".into(),
                us: 3700.0,
            },
        );
        store(&path, &a, &ea).unwrap();
        let mut eb = HashMap::new();
        eb.insert(
            "conv/f32/y".to_string(),
            Entry {
                variant: "64x64x8_4x4".into(),
                us: 12.5,
            },
        );
        store(&path, &b, &eb).unwrap();
        assert_eq!(load(&path, &a), ea);
        assert_eq!(load(&path, &b), eb);
        assert!(load(&path, "another adapter").is_empty());
        // No temporary file left behind.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("round.tmp"))
            .collect();
        assert!(left.is_empty());
        // Through a tuner: put, then a fresh tuner of the same adapter reads it back.
        let d = desc("GPU C", "gpu");
        let t = Tuner::new(&d, Mode::Auto, Some(path.clone()));
        assert!(t.enabled());
        t.put(
            "k",
            Entry {
                variant: "v".into(),
                us: 1.0,
            },
        );
        let t2 = Tuner::new(&d, Mode::Auto, Some(path.clone()));
        assert_eq!(t2.get("k").map(|e| e.variant), Some("v".to_string()));
        assert_eq!(load(&path, &a), ea);
    }

    #[test]
    fn corrupt_or_foreign_cache_is_ignored_and_replaced() {
        let d = desc("GPU", "gpu");
        let key = adapter_key(&d);
        for (i, text) in [
            "{ not json",
            "{\"format\": \"something-else\", \"adapters\": {}}",
            "[1, 2, 3]",
            "{\"format\": \"tfwgpu-tune-v1\", \"adapters\": 7}",
        ]
        .iter()
        .enumerate()
        {
            let path = tmp(&format!("bad{i}.json"));
            std::fs::write(&path, text).unwrap();
            assert!(load(&path, &key).is_empty(), "{text}");
            let t = Tuner::new(&d, Mode::On, Some(path.clone()));
            assert!(t.get("k").is_none());
            t.put(
                "k",
                Entry {
                    variant: "v".into(),
                    us: 2.0,
                },
            );
            assert_eq!(load(&path, &key)["k"].variant, "v");
        }
        // A bad entry is skipped, good ones kept.
        let path = tmp("entry.json");
        std::fs::write(
            &path,
            format!(
                "{{\"format\": \"{FORMAT}\", \"adapters\": {{{}: {{\"a\": {{\"variant\": \"x\"}}, \"b\": 5}}}}}}",
                serde_json::to_string(&key).unwrap()
            ),
        )
        .unwrap();
        let got = load(&path, &key);
        assert_eq!(got.len(), 1);
        assert_eq!(got["a"].variant, "x");
        // A missing file or directory is empty, and an unwritable path only warns.
        assert!(load(&tmp("missing.json"), &key).is_empty());
        let t = Tuner::new(
            &d,
            Mode::On,
            Some(PathBuf::from("/proc/nonexistent/tune.json")),
        );
        t.put(
            "k",
            Entry {
                variant: "v".into(),
                us: 1.0,
            },
        );
        assert_eq!(t.get("k").unwrap().variant, "v");
    }

    #[test]
    fn modes() {
        let gpu = desc("GPU", "gpu");
        let cpu = desc("llvmpipe", "cpu");
        assert!(Mode::Auto.enabled(&gpu));
        assert!(!Mode::Auto.enabled(&cpu));
        assert!(Mode::On.enabled(&cpu));
        assert!(!Mode::Off.enabled(&gpu));
        // Disabled: nothing is read, and the file is never consulted.
        let path = tmp("off.json");
        let mut e = HashMap::new();
        e.insert(
            "k".to_string(),
            Entry {
                variant: "v".into(),
                us: 1.0,
            },
        );
        store(&path, &adapter_key(&gpu), &e).unwrap();
        let t = Tuner::new(&gpu, Mode::Off, Some(path.clone()));
        assert!(!t.enabled());
        assert!(t.get("k").is_none());
        assert_eq!(bucket(7), 7);
        assert_eq!(bucket(100), 128);
        assert_eq!(bucket(4096), 4096);
    }

    #[test]
    fn memo_answers_without_keys_or_names_once_final() {
        use std::cell::Cell;
        let rt = crate::Runtime::new().unwrap();
        let dev = rt.device();
        let t = Tuner::new(dev.description(), Mode::On, None);
        dev.with_context(|ctx| {
            let made = Cell::new(0);
            let names = || {
                made.set(made.get() + 1);
                vec!["a".to_string(), "b".to_string()]
            };
            let key = || "memo/test/final".to_string();
            // First call: tuned (both variants record nothing), the answer kept.
            let i = t.choose_memo(ctx, &[7, 1, 2], key, names, 0, &|_| Ok(()));
            assert!(i < 2);
            assert_eq!(made.get(), 1);
            assert_eq!(
                t.get("memo/test/final").map(|e| e.variant),
                Some(["a", "b"][i].into())
            );
            // Second call: the memo answers; neither the key nor the names are built.
            let again = t.choose_memo(
                ctx,
                &[7, 1, 2],
                || panic!("key built"),
                || panic!("names built"),
                0,
                &|_| panic!("run"),
            );
            assert_eq!(again, i);
            // Other words: asked again.
            let other = t.choose_memo(ctx, &[7, 1, 3], key, names, 0, &|_| Ok(()));
            assert_eq!(made.get(), 2);
            assert_eq!(other, i, "same key, remembered decision");
            // A tuning that failed (every variant fails to record) falls back to the heuristic
            // and is not kept: the next call builds its names and tries again.
            let fail_key = || "memo/test/failed".to_string();
            let err = || Err(crate::Error::InvalidArgument("no".into()));
            let f = t.choose_memo(ctx, &[8], fail_key, names, 1, &|_| err());
            assert_eq!((f, made.get()), (1, 3));
            let f = t.choose_memo(ctx, &[8], fail_key, names, 1, &|_| err());
            assert_eq!((f, made.get()), (1, 4));
            assert!(t.get("memo/test/failed").is_none());
        });
    }
}
