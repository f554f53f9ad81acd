//! `tfwgpu-bench replay TRACE`: re-runs a kernel trace written by the plugin with
//! `TFWGPU_TRACE=path` (the format is documented in the plugin's `trace.rs`) on any adapter,
//! with fresh data in the same dataflow: each traced allocation gets an allocation of the same
//! size, addresses (interior ones too) map into it, host-to-device copies write random data
//! (floats in [-1, 1] where a kernel reads the copy as f32/f16, zeros otherwise so that integer
//! indices stay in range), host-memory inputs get their traced values, kernels are rebuilt from
//! (op, attrs) through the registry and recorded in order, and device-to-host copies are
//! blocking reads. `mark` events (step boundaries the program wrote) split the pass into steps:
//! at each mark the replay waits for the device and notes the time (see `Pass::marks`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use tfwgpu_runtime::hostlog;
use tfwgpu_runtime::{
    AttrValue, Attrs, DType, Device, DeviceRef, ExecStats, HostTensor, IdleRule, Kernel, Operand,
    Runtime, TensorDesc, TimingSummary, f16,
};

#[derive(Debug)]
pub enum Input {
    Device(TensorDesc, u64),
    Host(HostTensor),
}

#[derive(Debug)]
pub struct KernelRec {
    pub seq: u64,
    pub op: String,
    /// The TensorFlow node's name ("" when the trace has none).
    pub node: String,
    pub attrs: Attrs,
    /// The attributes' JSON text: the key of the kernel cache.
    pub key: String,
    pub inputs: Vec<Input>,
    pub outputs: Vec<(TensorDesc, u64)>,
    pub dispatches: u64,
    pub host_us: f64,
    pub skipped: bool,
}

#[derive(Debug)]
pub enum Event {
    Alloc {
        addr: u64,
        size: u64,
    },
    Free {
        addr: u64,
    },
    /// `fill`: the dtype a kernel later reads this copy as, if any.
    H2d {
        dst: u64,
        size: u64,
        fill: Option<DType>,
    },
    D2h {
        src: u64,
        size: u64,
    },
    D2d {
        src: u64,
        dst: u64,
        size: u64,
        /// The destination's device when the copy crosses devices (the source is on the
        /// issuing device).
        to_dev: Option<i64>,
    },
    Fill {
        addr: u64,
        size: u64,
        pattern: u32,
    },
    Sync,
    Kernel(Box<KernelRec>),
    /// A step boundary (`mark`): its label.
    Mark(String),
    /// A host-memory kernel: TensorFlow's host work, nothing to replay.
    HostKernel,
}

/// A parsed trace.
#[derive(Debug, Default)]
pub struct Trace {
    pub events: Vec<Event>,
    /// The device (TensorFlow ordinal) of each event; -1 for marks.
    pub dev_of: Vec<i64>,
    /// Devices (ordinals) the trace used; the replay runs all of them on one device unless
    /// `--per-device` maps each to an adapter of its own.
    pub devices: Vec<i64>,
}

fn u(v: &Value, k: &str, line: usize) -> Result<u64, String> {
    v.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("line {line}: missing or bad {k:?}"))
}

fn dtype(v: &Value, line: usize) -> Result<DType, String> {
    let s = v
        .as_str()
        .ok_or_else(|| format!("line {line}: bad dtype {v}"))?;
    DType::from_name(s).map_err(|e| format!("line {line}: {e}"))
}

fn float(v: &Value, line: usize) -> Result<f32, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| format!("line {line}: bad float {v}")),
        Value::String(s) => match s.as_str() {
            "nan" => Ok(f32::NAN),
            "inf" => Ok(f32::INFINITY),
            "-inf" => Ok(f32::NEG_INFINITY),
            _ => Err(format!("line {line}: bad float {v}")),
        },
        _ => Err(format!("line {line}: bad float {v}")),
    }
}

fn ints(v: &Value, line: usize) -> Result<Vec<i64>, String> {
    v.as_array()
        .ok_or_else(|| format!("line {line}: bad int list {v}"))?
        .iter()
        .map(|x| {
            x.as_i64()
                .ok_or_else(|| format!("line {line}: bad int {x}"))
        })
        .collect()
}

fn attr(v: &Value, line: usize) -> Result<AttrValue, String> {
    let (k, x) = v
        .as_object()
        .and_then(|m| m.iter().next())
        .ok_or_else(|| format!("line {line}: bad attribute {v}"))?;
    let bad = || format!("line {line}: bad attribute {v}");
    Ok(match k.as_str() {
        "b" => AttrValue::Bool(x.as_bool().ok_or_else(bad)?),
        "i" => AttrValue::Int(x.as_i64().ok_or_else(bad)?),
        "f" => AttrValue::Float(float(x, line)?),
        "type" => AttrValue::Type(dtype(x, line)?),
        "s" => AttrValue::Str(x.as_str().ok_or_else(bad)?.to_string()),
        "ints" => AttrValue::Ints(ints(x, line)?),
        "floats" => AttrValue::Floats(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|f| float(f, line))
                .collect::<Result<_, _>>()?,
        ),
        "types" => AttrValue::Types(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|t| dtype(t, line))
                .collect::<Result<_, _>>()?,
        ),
        "shape" => AttrValue::Shape(if x.is_null() {
            None
        } else {
            Some(ints(x, line)?)
        }),
        _ => return Err(bad()),
    })
}

fn shape(v: &Value, line: usize) -> Result<Vec<usize>, String> {
    v.get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("line {line}: missing shape"))?
        .iter()
        .map(|d| {
            d.as_u64()
                .map(|d| d as usize)
                .ok_or_else(|| format!("line {line}: bad dimension {d}"))
        })
        .collect()
}

fn unhex(s: &str, line: usize) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(format!("line {line}: bad hex bytes"));
    }
    (0..s.len() / 2)
        .map(|i| {
            u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("line {line}: bad hex bytes"))
        })
        .collect()
}

fn tensor(v: &Value, line: usize) -> Result<Input, String> {
    let dt = dtype(
        v.get("dtype")
            .ok_or_else(|| format!("line {line}: missing dtype"))?,
        line,
    )?;
    let shape = shape(v, line)?;
    if let Some(h) = v.get("host") {
        let bytes = unhex(
            h.as_str()
                .ok_or_else(|| format!("line {line}: bad host bytes"))?,
            line,
        )?;
        return Ok(Input::Host(HostTensor {
            dtype: dt,
            shape,
            bytes,
        }));
    }
    Ok(Input::Device(
        TensorDesc::new(dt, &shape),
        u(v, "addr", line)?,
    ))
}

fn list<'a>(v: &'a Value, k: &str, line: usize) -> Result<&'a Vec<Value>, String> {
    v.get(k)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("line {line}: missing {k:?}"))
}

impl Trace {
    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut t = Trace::default();
        let mut header = false;
        for (i, l) in text.lines().enumerate() {
            let line = i + 1;
            if l.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(l).map_err(|e| format!("line {line}: {e}"))?;
            let ev = v.get("ev").and_then(Value::as_str).unwrap_or("");
            if ev == "header" {
                if v["format"] != "tfwgpu-trace" || v["version"] != 1 {
                    return Err(format!("line {line}: not a version-1 tfwgpu trace"));
                }
                header = true;
                continue;
            }
            if !header {
                return Err("not a tfwgpu trace (no header line)".into());
            }
            // Diagnosis-only events (the copier's completion of a copy between devices).
            if ev == "copied" {
                continue;
            }
            let dev = if ev == "mark" {
                -1
            } else {
                v.get("dev").and_then(Value::as_i64).unwrap_or(0)
            };
            if dev >= 0 && !t.devices.contains(&dev) {
                t.devices.push(dev);
            }
            t.dev_of.push(dev);
            t.events.push(match ev {
                "alloc" => Event::Alloc {
                    addr: u(&v, "addr", line)?,
                    size: u(&v, "size", line)?,
                },
                "free" => Event::Free {
                    addr: u(&v, "addr", line)?,
                },
                "h2d" => Event::H2d {
                    dst: u(&v, "dst", line)?,
                    size: u(&v, "size", line)?,
                    fill: None,
                },
                "d2h" => Event::D2h {
                    src: u(&v, "src", line)?,
                    size: u(&v, "size", line)?,
                },
                "d2d" => Event::D2d {
                    src: u(&v, "src", line)?,
                    dst: u(&v, "dst", line)?,
                    size: u(&v, "size", line)?,
                    to_dev: v
                        .get("to_dev")
                        .and_then(Value::as_i64)
                        .filter(|&t| t != dev),
                },
                "fill" => Event::Fill {
                    addr: u(&v, "addr", line)?,
                    size: u(&v, "size", line)?,
                    pattern: u(&v, "pattern", line)? as u32,
                },
                "sync" => Event::Sync,
                "host_kernel" => Event::HostKernel,
                "mark" => Event::Mark(v["label"].as_str().unwrap_or("step").to_string()),
                "kernel" => {
                    let a = v
                        .get("attrs")
                        .and_then(Value::as_object)
                        .ok_or_else(|| format!("line {line}: missing attrs"))?;
                    let mut attrs = Attrs::new();
                    for (k, x) in a {
                        attrs.set(k, attr(x, line)?);
                    }
                    let op = v["op"]
                        .as_str()
                        .ok_or_else(|| format!("line {line}: missing op"))?
                        .to_string();
                    let outputs = list(&v, "outputs", line)?
                        .iter()
                        .map(|o| match tensor(o, line)? {
                            Input::Device(d, a) => Ok((d, a)),
                            Input::Host(_) => Err(format!("line {line}: a host output")),
                        })
                        .collect::<Result<_, String>>()?;
                    Event::Kernel(Box::new(KernelRec {
                        seq: u(&v, "seq", line)?,
                        key: format!("{op} {}", v["attrs"]),
                        op,
                        node: v["node"].as_str().unwrap_or("").to_string(),
                        attrs,
                        inputs: list(&v, "inputs", line)?
                            .iter()
                            .map(|x| tensor(x, line))
                            .collect::<Result<_, _>>()?,
                        outputs,
                        dispatches: u(&v, "dispatches", line)?,
                        host_us: v["host_us"].as_f64().unwrap_or(0.0),
                        skipped: v["skipped"].as_bool().unwrap_or(false),
                    }))
                }
                other => return Err(format!("line {line}: unknown event {other:?}")),
            });
        }
        if !header {
            return Err("not a tfwgpu trace (empty)".into());
        }
        t.infer_fill_types();
        Ok(t)
    }

    /// Marks each host-to-device copy with the dtype of the first kernel input that reads it
    /// at the same address before anything else writes there.
    fn infer_fill_types(&mut self) {
        let mut pending: HashMap<u64, usize> = HashMap::new();
        let mut found: Vec<(usize, DType)> = vec![];
        for (i, e) in self.events.iter().enumerate() {
            match e {
                Event::H2d { dst, .. } => {
                    pending.insert(*dst, i);
                }
                Event::Kernel(k) => {
                    for inp in &k.inputs {
                        if let Input::Device(d, a) = inp
                            && let Some(j) = pending.remove(a)
                        {
                            found.push((j, d.dtype));
                        }
                    }
                    for (_, a) in &k.outputs {
                        pending.remove(a);
                    }
                }
                Event::D2d { src, dst, .. } => {
                    // A copy of an h2d buffer: its reader decides for both.
                    if let Some(j) = pending.get(src).copied() {
                        pending.insert(*dst, j);
                    }
                }
                _ => {}
            }
        }
        for (j, dt) in found {
            if let Event::H2d { fill, .. } = &mut self.events[j]
                && fill.is_none()
            {
                *fill = Some(dt);
            }
        }
    }

    pub fn kernels(&self) -> impl Iterator<Item = &KernelRec> {
        self.events.iter().filter_map(|e| match e {
            Event::Kernel(k) => Some(k.as_ref()),
            _ => None,
        })
    }
}

/// Per-op totals of one replay.
#[derive(Clone, Debug, Default)]
pub struct OpTime {
    pub calls: u64,
    pub host_s: f64,
    pub dispatches: u64,
    /// The host time the capture measured (output shapes + record), summed.
    pub traced_host_s: f64,
    /// With `--sync-each`: record + submit + GPU execution of each call, the device drained
    /// after every kernel call (0 otherwise).
    pub synced_s: f64,
    /// Each call's host time (shapes + record), seconds: the median call is the figure a
    /// stray submit or a preempted thread does not move.
    pub host_calls: Vec<f64>,
}

/// `--sync-each`: drain the device after every kernel call and charge the time to its op (a
/// per-op GPU-time estimate that needs no timestamps; it serializes the pass).
static SYNC_EACH: AtomicBool = AtomicBool::new(false);

/// `--gpu-paths`: the convolutions take the GPU adapters' automatic path (`_tfwgpu_tile` =
/// "gpu": tuned tiles where tuning is on) on any adapter, so that a CPU adapter (lavapipe)
/// records what a GPU records; with `TFWGPU_TUNE=1` the tuner's choices too (issue 7: the
/// host cost of those paths, profiled where there is no GPU).
static GPU_PATHS: AtomicBool = AtomicBool::new(false);

/// The ops `--gpu-paths` sends down the GPU adapters' path.
const CONV_OPS: [&str; 4] = [
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "_TfwgpuConv2DBiasAdd",
];

fn sync_each_kernel(dev: &Device, t0: Instant, o: &mut OpTime) -> Result<(), String> {
    if SYNC_EACH.load(Ordering::Relaxed) {
        dev.synchronize().map_err(|e| e.to_string())?;
        o.synced_s += t0.elapsed().as_secs_f64();
    }
    Ok(())
}

/// What one pass over the trace did.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    pub wall_s: f64,
    pub stats: ExecStats,
    pub kernels: u64,
    pub kernels_skipped: u64,
    /// Dispatches recorded by kernel calls (not copies or fills).
    pub kernel_dispatches: u64,
    /// Kernel calls whose dispatch count differs from the traced one.
    pub dispatch_mismatches: u64,
    /// Kernel calls whose output descs on the replayed data differ from the traced ones
    /// (data-dependent shapes); the traced descs are used.
    pub shape_mismatches: u64,
    pub host_syncs: u64,
    pub host_kernels: u64,
    /// Bytes of host-to-device payloads drawn before the pass, and the time that took (not
    /// part of `wall_s`).
    pub payload_bytes: u64,
    pub payload_s: f64,
    /// Host time in uploads of at least 1 MiB (count, seconds, the longest one's seconds).
    pub big_uploads: (u64, f64, f64),
    /// Host time in reads back and host syncs (each waits for the GPU).
    pub waits_s: f64,
    pub per_op: BTreeMap<String, OpTime>,
    /// The device's dispatch counter when the pass began.
    pub first_dispatch: u64,
    /// (first dispatch counter value, dispatches, op) of each kernel call, in recording order:
    /// attributes GPU timestamps to ops.
    pub dispatch_ops: Vec<(u64, u64, String)>,
    /// Each `mark` event's label and the time (seconds since the pass began) at which the
    /// device had finished everything before it.
    pub marks: Vec<(String, f64)>,
    /// For each mark: the last batch submitted when it was reached (all work before the mark
    /// is in batches up to this id), to split GPU timestamps into steps.
    pub mark_batches: Vec<u64>,
    /// For each mark, where the host's time to it went: see [`MarkChain`].
    pub mark_chain: Vec<MarkChain>,
}

/// The host's chain up to one mark (issue 7: where a synchronized step's latency goes). The
/// mark's synchronize is split into its flush (the open batch encoded and submitted on the
/// replaying thread, or the wait for a batch another thread took to reach the queue) and its
/// wait (from then until the host knows the GPU finished).
#[derive(Clone, Copy, Debug, Default)]
pub struct MarkChain {
    /// Seconds since the pass began at which the mark event was reached (everything before it
    /// recorded).
    pub reached_s: f64,
    pub flush_s: f64,
    pub wait_s: f64,
}

/// `--no-mark-sync`: marks do not synchronize (steps are then the host's pace of recording and
/// submitting, with the GPU running behind, as Keras's inference loop and PyTorch's
/// event-timed steps measure them); the pass still synchronizes at its end.
static NO_MARK_SYNC: AtomicBool = AtomicBool::new(false);

pub(crate) fn sub(a: ExecStats, b: ExecStats) -> ExecStats {
    ExecStats {
        submits: a.submits - b.submits,
        dispatches: a.dispatches - b.dispatches,
        copies: a.copies - b.copies,
        uploads: a.uploads - b.uploads,
        reads: a.reads - b.reads,
        bind_groups: a.bind_groups - b.bind_groups,
    }
}

/// Maps traced addresses to this replay's allocations.
pub(crate) struct Memory<'d> {
    dev: &'d Device,
    /// traced base -> (size, new base)
    regions: BTreeMap<u64, (u64, u64)>,
    /// For empty tensors at addresses no allocation holds.
    dummy: Option<u64>,
}

impl<'d> Memory<'d> {
    pub(crate) fn new(dev: &'d Device) -> Self {
        Memory {
            dev,
            regions: BTreeMap::new(),
            dummy: None,
        }
    }

    pub(crate) fn map(
        &mut self,
        addr: u64,
        len: u64,
        seq: &dyn Fn() -> String,
    ) -> Result<u64, String> {
        if let Some((&base, &(size, new))) = self.regions.range(..=addr).next_back()
            && addr + len <= base + size
            && (addr < base + size || len == 0)
        {
            return Ok(new + (addr - base));
        }
        if len == 0 {
            if self.dummy.is_none() {
                self.dummy = Some(self.dev.allocate(256).map_err(|e| e.to_string())?);
            }
            return Ok(self.dummy.unwrap_or_default());
        }
        Err(format!(
            "{}: address {addr:#x} (+{len} bytes) lies in no traced allocation",
            seq()
        ))
    }

    pub(crate) fn free_all(&mut self) -> Result<(), String> {
        for (_, (_, new)) in std::mem::take(&mut self.regions) {
            self.dev.deallocate(new).map_err(|e| e.to_string())?;
        }
        if let Some(d) = self.dummy.take() {
            self.dev.deallocate(d).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

pub(crate) fn random_bytes(rng: &mut StdRng, dt: Option<DType>, size: u64) -> Vec<u8> {
    let size = size as usize;
    let mut out = Vec::with_capacity(size);
    match dt {
        Some(DType::F32) => {
            while out.len() + 4 <= size {
                out.extend_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        Some(DType::F16) => {
            while out.len() + 2 <= size {
                let h = f16::from_f32(rng.random_range(-1.0f32..1.0));
                out.extend_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        _ => {}
    }
    out.resize(size, 0);
    out
}

/// Replays the trace once on `dev`; kernels are built once and kept in `cache`.
pub fn replay_once(
    dev: &Device,
    trace: &Trace,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    seed: u64,
) -> Result<Pass, String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mem = Memory::new(dev);
    let mut pass = Pass::default();
    // The host-to-device payloads are drawn before the clock starts: in the traced program the
    // data was ready on the host (tf.data); drawing ResNet-50's 38.5 MB input batch inside the
    // step charged ~10^7 random numbers of the harness to the step as host time.
    let drawn = Instant::now();
    let payloads = trace
        .events
        .iter()
        .filter_map(|ev| match ev {
            Event::H2d { size, fill, .. } => Some(random_bytes(&mut rng, *fill, *size)),
            _ => None,
        })
        .collect::<Vec<_>>();
    pass.payload_bytes = payloads.iter().map(|p| p.len() as u64).sum();
    pass.payload_s = drawn.elapsed().as_secs_f64();
    let mut payloads = payloads.into_iter();
    dev.synchronize().map_err(e)?;
    let before = dev.exec_stats();
    pass.first_dispatch = before.dispatches;
    let t0 = Instant::now();
    let result = (|| -> Result<(), String> {
        for (i, ev) in trace.events.iter().enumerate() {
            if let Event::Mark(label) = ev {
                let reached = t0.elapsed().as_secs_f64();
                let mut chain = MarkChain {
                    reached_s: reached,
                    ..MarkChain::default()
                };
                if !NO_MARK_SYNC.load(Ordering::Relaxed) {
                    // `Device::synchronize` in its two parts, timed apart.
                    let id = dev.exec().flush().map_err(e)?;
                    let flushed = t0.elapsed().as_secs_f64();
                    dev.exec().wait(id).map_err(e)?;
                    let done = t0.elapsed().as_secs_f64();
                    chain.flush_s = flushed - reached;
                    chain.wait_s = done - flushed;
                }
                // In the host log (`TFWGPU_HOST_LOG`) too, the mark sits after its synchronize.
                hostlog::mark(label);
                pass.marks.push((label.clone(), t0.elapsed().as_secs_f64()));
                pass.mark_chain.push(chain);
                pass.mark_batches.push(dev.exec().submitted());
            } else {
                apply_event(dev, i, ev, cache, &mut mem, &mut payloads, &mut pass)?;
            }
        }
        dev.synchronize().map_err(e)
    })();
    pass.wall_s = t0.elapsed().as_secs_f64();
    pass.stats = sub(dev.exec_stats(), before);
    let freed = mem.free_all();
    result?;
    freed?;
    Ok(pass)
}

/// Replays one event on `dev` (everything but marks; a copy between devices is replayed as a
/// copy on `dev`). `payloads` yields the data of each host-to-device copy, in order.
pub(crate) fn apply_event(
    dev: &Device,
    i: usize,
    ev: &Event,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    mem: &mut Memory,
    payloads: &mut dyn Iterator<Item = Vec<u8>>,
    pass: &mut Pass,
) -> Result<(), String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let at = || format!("event {i}");
    match ev {
        Event::Alloc { addr, size } => {
            let new = dev.allocate(*size).map_err(e)?;
            if let Some((_, old)) = mem.regions.insert(*addr, (*size, new)) {
                // Freed without a traced free (should not happen): free ours too.
                dev.deallocate(old).map_err(e)?;
            }
        }
        Event::Free { addr } => {
            if let Some((_, new)) = mem.regions.remove(addr) {
                dev.deallocate(new).map_err(e)?;
            }
        }
        Event::H2d { dst, size, .. } => {
            let a = mem.map(*dst, *size, &at)?;
            let data = payloads.next().expect("one payload per h2d event");
            let t = Instant::now();
            dev.write(a, &data).map_err(e)?;
            if data.len() >= 1 << 20 {
                let s = t.elapsed().as_secs_f64();
                let b = &mut pass.big_uploads;
                *b = (b.0 + 1, b.1 + s, b.2.max(s));
            }
        }
        Event::D2h { src, size } => {
            let a = mem.map(*src, *size, &at)?;
            let t = Instant::now();
            dev.read(a, *size as usize).map_err(e)?;
            pass.waits_s += t.elapsed().as_secs_f64();
            pass.host_syncs += 1;
        }
        Event::D2d { src, dst, size, .. } => {
            let s = mem.map(*src, *size, &at)?;
            let d = mem.map(*dst, *size, &at)?;
            dev.copy(s, d, *size).map_err(e)?;
        }
        Event::Fill {
            addr,
            size,
            pattern,
        } => {
            let a = mem.map(*addr, *size, &at)?;
            dev.fill_u32(a, *size, *pattern).map_err(e)?;
        }
        Event::Sync => {
            let t = Instant::now();
            dev.synchronize().map_err(e)?;
            pass.waits_s += t.elapsed().as_secs_f64();
            pass.host_syncs += 1;
        }
        Event::HostKernel => pass.host_kernels += 1,
        Event::Mark(_) => unreachable!("marks are the caller's"),
        Event::Kernel(k) => replay_kernel(dev, k, cache, mem, pass)?,
    }
    Ok(())
}

fn replay_kernel(
    dev: &Device,
    k: &KernelRec,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    mem: &mut Memory,
    pass: &mut Pass,
) -> Result<(), String> {
    let at = || format!("{} (seq {})", k.op, k.seq);
    let kernel = match cache.entry(k.key.clone()) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let gpu = GPU_PATHS.load(Ordering::Relaxed)
                && CONV_OPS.contains(&k.op.as_str())
                && k.attrs.get("_tfwgpu_tile").is_none();
            let attrs = if gpu {
                k.attrs
                    .clone()
                    .with("_tfwgpu_tile", AttrValue::Str("gpu".into()))
            } else {
                k.attrs.clone()
            };
            v.insert(
                dev.kernel(&k.op, &attrs)
                    .map_err(|err| format!("{}: {err}", at()))?,
            )
        }
    };
    let mut refs = Vec::with_capacity(k.inputs.len());
    for inp in &k.inputs {
        refs.push(match inp {
            Input::Device(d, a) => Some(DeviceRef {
                desc: d.clone(),
                addr: mem.map(*a, d.byte_size(), &at)?,
            }),
            Input::Host(_) => None,
        });
    }
    let operands: Vec<Operand> = k
        .inputs
        .iter()
        .zip(&refs)
        .map(|(inp, r)| match (inp, r) {
            (_, Some(r)) => Operand::Device(r),
            (Input::Host(h), None) => Operand::Host(h),
            (Input::Device(..), None) => unreachable!("every device input was mapped"),
        })
        .collect();
    let mut outputs = Vec::with_capacity(k.outputs.len());
    for (d, a) in &k.outputs {
        outputs.push(DeviceRef {
            desc: d.clone(),
            addr: mem.map(*a, d.byte_size(), &at)?,
        });
    }
    let d0 = dev.exec_stats().dispatches;
    let t0 = Instant::now();
    let descs = dev
        .output_descs(kernel.as_ref(), &operands)
        .map_err(|err| format!("{}: {err}", at()))?;
    if descs.len() != outputs.len() {
        return Err(format!(
            "{}: {} outputs on replay, {} traced",
            at(),
            descs.len(),
            outputs.len()
        ));
    }
    if descs.iter().zip(&outputs).any(|(a, b)| *a != b.desc) {
        pass.shape_mismatches += 1;
    }
    if !k.skipped {
        dev.record(kernel.as_ref(), &operands, &outputs)
            .map_err(|err| format!("{}: {err}", at()))?;
    }
    let host = t0.elapsed().as_secs_f64();
    let n = dev.exec_stats().dispatches - d0;
    pass.kernels += 1;
    pass.kernels_skipped += k.skipped as u64;
    pass.kernel_dispatches += n;
    pass.dispatch_ops.push((d0, n, k.op.clone()));
    pass.dispatch_mismatches += (n != k.dispatches) as u64;
    let o = pass.per_op.entry(k.op.clone()).or_default();
    o.calls += 1;
    o.host_s += host;
    o.host_calls.push(host);
    o.dispatches += n;
    o.traced_host_s += k.host_us * 1e-6;
    sync_each_kernel(dev, t0, o)
}

/// A replay pass: its wall time and its marks (a one-device [`Pass`] or a per-device
/// `MultiPass`).
pub trait Timed {
    fn wall_s(&self) -> f64;
    /// Each mark's label and its time in seconds since the pass began.
    fn marks(&self) -> &[(String, f64)];
}

impl Timed for Pass {
    fn wall_s(&self) -> f64 {
        self.wall_s
    }
    fn marks(&self) -> &[(String, f64)] {
        &self.marks
    }
}

/// The passes' wall times, their median, and the pass whose wall time is the median (its
/// counters are the ones reported).
pub(crate) fn median_pass<P: Timed>(passes: &[P]) -> (Vec<f64>, f64, &P) {
    let walls: Vec<f64> = passes.iter().map(Timed::wall_s).collect();
    let med = median(&walls);
    let p = passes
        .iter()
        .find(|p| p.wall_s() == med)
        .unwrap_or(&passes[0]);
    (walls, med, p)
}

/// Per-step times: the intervals between consecutive marks of each pass, grouped by the label
/// of the mark that opens the interval, in ms. Passes after the first only when there are
/// several (the first compiles pipelines).
pub fn step_times<P: Timed>(passes: &[P]) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let skip = usize::from(passes.len() > 1);
    for p in &passes[skip..] {
        for w in p.marks().windows(2) {
            out.entry(w[0].0.clone())
                .or_default()
                .push((w[1].1 - w[0].1) * 1e3);
        }
    }
    out
}

/// With `--sync-each`: the ops by synchronized time (record + GPU), the heaviest first.
fn report_synced(p: &Pass, top: usize) {
    if !SYNC_EACH.load(Ordering::Relaxed) {
        return;
    }
    let total: f64 = p.per_op.values().map(|t| t.synced_s).sum();
    let mut ops: Vec<(&String, &OpTime)> = p.per_op.iter().collect();
    ops.sort_by(|a, b| b.1.synced_s.total_cmp(&a.1.synced_s));
    println!(
        "  {:<28} {:>7} {:>10} {:>9} {:>6}   (--sync-each: record + GPU, drained after each call; {:.3} ms in all)",
        "op (synchronized time)",
        "calls",
        "total ms",
        "us/call",
        "share",
        total * 1e3
    );
    for (op, t) in ops.iter().take(top) {
        println!(
            "  {:<28} {:>7} {:>10.3} {:>9.1} {:>5.1}%",
            op,
            t.calls,
            t.synced_s * 1e3,
            t.synced_s * 1e6 / t.calls as f64,
            100.0 * t.synced_s / total.max(1e-12)
        );
    }
}

/// Prints the per-step times and returns them as JSON (`{label: {steps, median_ms, min_ms,
/// ms}}`); nothing when the trace has fewer than two marks.
pub(crate) fn report_steps<P: Timed>(passes: &[P]) -> Value {
    let steps = step_times(passes);
    let mut doc = serde_json::Map::new();
    for (label, ms) in &steps {
        let med = median(ms);
        let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "  steps {label:?}: {} intervals between marks, median {med:.3} ms, min {min:.3} ms",
            ms.len()
        );
        doc.insert(
            label.clone(),
            json!({"steps": ms.len(), "median_ms": med, "min_ms": min, "ms": ms}),
        );
    }
    Value::Object(doc)
}

/// Prints and records (into `steps`' JSON, key `chain` of each label) where the host's time of
/// each step went: `record_ms` from the opening mark's end to the closing mark being reached
/// (the step's events recorded), `flush_ms` and `wait_ms` of the closing mark's synchronize
/// (see [`MarkChain`]); medians over the passes after the first (as [`step_times`]).
fn report_chain(passes: &[Pass], steps: &mut Value) {
    let skip = usize::from(passes.len() > 1);
    let parts = chain_parts(&passes[skip..]);
    for (label, [_, rec, flush, wait]) in &parts {
        println!(
            "  chain {label:?}: record {:.3} ms, flush (submit) {:.3} ms, wait (GPU + noticing) {:.3} ms (medians of {})",
            median(rec),
            median(flush),
            median(wait),
            rec.len()
        );
        if let Some(doc) = steps.get_mut(label) {
            doc["chain"] = json!({
                "record_ms": median(rec), "flush_ms": median(flush), "wait_ms": median(wait),
                "record_all": rec, "flush_all": flush, "wait_all": wait,
            });
        }
    }
}

/// Where the GPU was idle inside a list of timed commands (issue 7's bubbles), from their
/// timestamps: idle time between two commands of the same batch (one command buffer: the GPU's
/// own launch and barrier latency, which no host work can remove), and idle time between the
/// end of one batch's commands and the start of the next batch's (the queue ran dry: the host
/// had not submitted the next batch yet). `span = busy + intra + inter`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gaps {
    pub intra_ns: f64,
    pub inter_ns: f64,
    /// Idle stretches between batches, and the longest one.
    pub inter_count: u64,
    pub inter_max_ns: f64,
    /// The longest idle stretches between batches (longest first, at most `TOP_STRETCHES`).
    pub top: Vec<Stretch>,
}

/// One idle stretch between batches: where it is and what ran around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stretch {
    pub idle_ns: f64,
    /// Index (in start order) of the command that ended it, and the time from the first
    /// command's start to its start.
    pub index: usize,
    pub at_ns: f64,
    pub before: std::sync::Arc<str>,
    pub after: std::sync::Arc<str>,
}

const TOP_STRETCHES: usize = 6;

impl Gaps {
    pub fn of(timings: &[tfwgpu_runtime::DispatchTiming]) -> Gaps {
        let mut v: Vec<&tfwgpu_runtime::DispatchTiming> = timings.iter().collect();
        v.sort_by(|a, b| a.start_ns.total_cmp(&b.start_ns));
        let first = v.first().map_or(0.0, |t| t.start_ns);
        let mut g = Gaps::default();
        // (end of busy time so far, its batch, the command that reached it)
        let mut cur: Option<(f64, u64, &std::sync::Arc<str>)> = None;
        for (i, t) in v.iter().enumerate() {
            let (s, e, batch) = (t.start_ns, t.end_ns.max(t.start_ns), t.batch);
            match cur {
                Some((ce, cb, before)) if s > ce => {
                    if batch == cb {
                        g.intra_ns += s - ce;
                    } else {
                        g.inter_ns += s - ce;
                        g.inter_count += 1;
                        g.inter_max_ns = g.inter_max_ns.max(s - ce);
                        g.top.push(Stretch {
                            idle_ns: s - ce,
                            index: i,
                            at_ns: s - first,
                            before: before.clone(),
                            after: t.label.clone(),
                        });
                        g.top.sort_by(|a, b| b.idle_ns.total_cmp(&a.idle_ns));
                        g.top.truncate(TOP_STRETCHES);
                    }
                    cur = Some((e, batch, &t.label));
                }
                Some((ce, _, _)) if e >= ce => cur = Some((e, batch, &t.label)),
                Some(_) => {}
                None => cur = Some((e, batch, &t.label)),
            }
        }
        g
    }
}

/// One timed step: GPU busy, wall and the GPU's view of the gaps.
#[derive(Clone, Debug, Default)]
struct TimedStep {
    busy_ms: f64,
    wall_ms: f64,
    span_ms: f64,
    gaps: Gaps,
}

/// GPU timestamps of one replay pass.
struct GpuPass {
    wall_s: f64,
    summary: TimingSummary,
    /// Per mark label: each interval it opens.
    steps: BTreeMap<String, Vec<TimedStep>>,
    /// Per op: dispatches and GPU nanoseconds.
    per_op: BTreeMap<String, (u64, f64)>,
}

/// One more pass with GPU timing on (kept apart from the wall-time passes: timestamps add
/// work of their own). Copies and clears count in `summary`, not in `per_op`.
/// `per_pass`: time each compute pass as a whole instead of every dispatch (see
/// `ExecutionContext::set_timing_per_pass`); `per_op` is then empty.
fn timed_pass(
    dev: &Device,
    trace: &Trace,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    seed: u64,
    per_pass: bool,
) -> Result<GpuPass, String> {
    let ex = dev.exec();
    ex.set_timing_per_pass(per_pass);
    ex.set_timing(true).map_err(|e| e.to_string())?;
    // Two timed passes, the first one unused: the runtime makes a query set and two buffers
    // for every batch that finds no free timing slot, and slots come back only when the
    // timings are taken, so the first pass creates hundreds of them in the middle of its
    // steps (host time that shows up as GPU idle between batches). The second pass reuses
    // them.
    let run = (|| {
        let mut last = None;
        for _ in 0..2 {
            ex.take_timings().map_err(|e| e.to_string())?;
            let p = replay_once(dev, trace, cache, seed)?;
            let t = ex.take_timings().map_err(|e| e.to_string())?;
            last = Some((p, t));
        }
        Ok::<_, String>(last.expect("two passes"))
    })();
    ex.set_timing(false).map_err(|e| e.to_string())?;
    ex.set_timing_per_pass(false);
    let (p, t) = run?;
    // Dispatch number i of the pass (copies and clears are not dispatches) -> its kernel call.
    let mut owner: Vec<Option<&str>> = vec![None; t.len()];
    for (d0, n, op) in &p.dispatch_ops {
        let first = (d0 - p.first_dispatch) as usize;
        for o in owner.iter_mut().skip(first).take(*n as usize) {
            *o = Some(op);
        }
    }
    let mut per_op: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    let dispatches = t
        .iter()
        .filter(|d| !per_pass && &*d.label != "copy" && &*d.label != "clear");
    for (i, d) in dispatches.enumerate() {
        let op = owner
            .get(i)
            .copied()
            .flatten()
            .unwrap_or("(runtime copies and fills)");
        let e = per_op.entry(op.to_string()).or_default();
        e.0 += 1;
        e.1 += d.end_ns - d.start_ns;
    }
    let mut steps: BTreeMap<String, Vec<TimedStep>> = BTreeMap::new();
    for (w, b) in p.marks.windows(2).zip(p.mark_batches.windows(2)) {
        let inside: Vec<_> = t
            .iter()
            .filter(|d| d.batch > b[0] && d.batch <= b[1])
            .cloned()
            .collect();
        let sum = TimingSummary::of(&inside);
        steps.entry(w[0].0.clone()).or_default().push(TimedStep {
            busy_ms: sum.busy_ns * 1e-6,
            wall_ms: (w[1].1 - w[0].1) * 1e3,
            span_ms: sum.span_ns * 1e-6,
            gaps: Gaps::of(&inside),
        });
    }
    Ok(GpuPass {
        wall_s: p.wall_s,
        summary: TimingSummary::of(&t),
        steps,
        per_op,
    })
}

/// Prints and records (into `steps`' JSON) the per-step GPU busy share and idle of a timed
/// pass; keys get a `_per_pass` suffix when `per_pass`.
fn report_timed_steps(g: &GpuPass, per_pass: bool, steps: &mut Value) {
    let (unit, units, sfx) = if per_pass {
        ("pass", "passes", "_per_pass")
    } else {
        ("command", "commands", "")
    };
    for (label, v) in &g.steps {
        let med = |f: &dyn Fn(&TimedStep) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        let busy = med(&|x| x.busy_ms);
        let pct = med(&|x| 100.0 * x.busy_ms / x.wall_ms.max(1e-9));
        let wall = med(&|x| x.wall_ms);
        let intra = med(&|x| x.gaps.intra_ns * 1e-6);
        let inter = med(&|x| x.gaps.inter_ns * 1e-6);
        let inter_n = med(&|x| x.gaps.inter_count as f64);
        let inter_max = med(&|x| x.gaps.inter_max_ns * 1e-6);
        let edges = med(&|x| (x.wall_ms - x.span_ms).max(0.0));
        println!(
            "  steps {label:?} (timed per {unit}): GPU busy median {busy:.3} ms, {pct:.1}% of the \
             step (wall {wall:.3} ms)"
        );
        if busy > 0.0 {
            println!(
                "    idle (medians): {intra:.3} ms between {units} of one batch, {inter:.3} ms \
                 between batches ({inter_n:.0} stretches, longest {inter_max:.3} ms), \
                 {edges:.3} ms at the step's edges (wall - first-to-last {unit})"
            );
            if let Some(last) = v.last() {
                println!(
                    "    longest idle stretches between batches in its last step \
                     (index, ms into the step, idle ms, what ran around it):"
                );
                for st in &last.gaps.top {
                    println!(
                        "      #{:<6} {:>9.3} {:>8.3}  {} -> {}",
                        st.index,
                        st.at_ns * 1e-6,
                        st.idle_ns * 1e-6,
                        st.before,
                        st.after
                    );
                }
            }
        }
        if let Some(Value::Object(o)) = steps.get_mut(label) {
            let mut put = |k: &str, v: f64| {
                o.insert(format!("{k}{sfx}"), json!(v));
            };
            put("gpu_busy_median_ms", busy);
            put("gpu_busy_pct_median", pct);
            put("timed_wall_median_ms", wall);
            put("gpu_idle_intra_batch_median_ms", intra);
            put("gpu_idle_inter_batch_median_ms", inter);
            put("gpu_idle_inter_batch_stretches_median", inter_n);
            put("gpu_idle_inter_batch_longest_median_ms", inter_max);
            put("gpu_idle_edges_median_ms", edges);
        }
    }
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// The `replay` command.
pub fn run(args: &[String], rt: &Runtime) -> Result<(), String> {
    const USAGE: &str = "usage: tfwgpu-bench replay TRACE [--repeat N] [--json FILE] [--top N] \
                         [--sync-each] [--no-mark-sync] [--gpu-paths] [--idle-variants V,V,...] \
                         [--per-device [--timeline FILE]] [--data-parallel N,M \
                         [--allreduce exchange|halves|peer|peer-host|none[,...]] [--bucket-kb K] \
                         [--label L] [--per-device-batch B] [--check] [--no-defer] [--free-run]]";
    let dev = rt.device();
    let mut path = None;
    let mut per_device = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--repeat" | "--json" | "--top" | "--timeline" | "--data-parallel" | "--allreduce"
            | "--bucket-kb" | "--label" | "--per-device-batch" | "--idle-variants" => i += 2,
            "--check" | "--no-defer" | "--free-run" => i += 1,
            "--sync-each" => {
                SYNC_EACH.store(true, Ordering::Relaxed);
                i += 1;
            }
            "--no-mark-sync" => {
                NO_MARK_SYNC.store(true, Ordering::Relaxed);
                i += 1;
            }
            "--gpu-paths" => {
                GPU_PATHS.store(true, Ordering::Relaxed);
                i += 1;
            }
            "--per-device" => {
                per_device = true;
                i += 1;
            }
            a if a.starts_with("--") => return Err(format!("unknown flag {a:?}\n{USAGE}")),
            a if path.is_none() => {
                path = Some(a);
                i += 1;
            }
            a => return Err(format!("unexpected argument {a:?}\n{USAGE}")),
        }
    }
    let path = path.ok_or(USAGE)?;
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let repeat: usize = flag("--repeat")
        .map_or(Ok(1), |s| s.parse())
        .map_err(|_| "bad --repeat")?;
    let top: usize = flag("--top")
        .map_or(Ok(15), |s| s.parse())
        .map_err(|_| "bad --top")?;
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(format!(
            "{path} is gzip-compressed: decompress it first (zcat {path} > trace), or pass \
             <(zcat {path})"
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| format!("{path}: not a text trace: {e}"))?;
    let trace = Trace::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let traced_kernels = trace.kernels().count() as u64;
    let traced_dispatches: u64 = trace.kernels().map(|k| k.dispatches).sum();
    if args.iter().any(|a| a == "--idle-variants")
        && (per_device || args.iter().any(|a| a == "--data-parallel"))
    {
        return Err("--idle-variants applies to the one-device replay only".into());
    }
    if args.iter().any(|a| a == "--data-parallel") {
        return crate::replay_dp::run(args, path, &trace, rt);
    }
    if per_device {
        return crate::replay_multi::run(
            path,
            &trace,
            rt,
            repeat,
            flag("--json").map(|s| s.as_str()),
            flag("--timeline").map(|s| s.as_str()),
        );
    }
    if trace.devices.len() > 1 {
        eprintln!(
            "the trace used {} devices; replaying all of their work on one (--per-device: one \
             adapter each)",
            trace.devices.len()
        );
    }
    let variants = flag("--idle-variants")
        .map(|s| parse_idle_variants(s))
        .transpose()?
        .unwrap_or_default();
    if !variants.is_empty() && repeat < variants.len() + 1 {
        return Err(format!(
            "--idle-variants with {} variants needs --repeat {} or more (the first pass builds \
             the pipelines; each variant needs a pass of its own)",
            variants.len(),
            variants.len() + 1
        ));
    }
    let idle_before = dev.exec().idle();
    let mut cache = HashMap::new();
    let mut passes = vec![];
    for r in 0..repeat.max(1) {
        if r == 1 {
            // The host log (`TFWGPU_HOST_LOG`) keeps the passes after the first (which builds
            // the pipelines), up to the GPU-timed passes below.
            hostlog::reset();
        }
        if !variants.is_empty() {
            let v = &variants[r.saturating_sub(1) % variants.len()];
            dev.exec().set_idle(v.age, v.rule);
        }
        passes.push(replay_once(dev, &trace, &mut cache, r as u64)?);
    }
    dev.exec().set_idle(idle_before.0, idle_before.1);
    let idle_doc = report_idle_variants(&variants, &passes);
    if hostlog::on() {
        hostlog::dump().map_err(|e| format!("host log: {e}"))?;
    }
    let (walls, med, p) = median_pass(&passes);
    let timestamps = dev
        .description()
        .useful_features()
        .contains(&"TIMESTAMP_QUERY");
    println!(
        "trace {path}: {} events, {traced_kernels} kernel calls ({traced_dispatches} dispatches traced), {} host kernels",
        trace.events.len(),
        p.host_kernels
    );
    println!(
        "replay x{}: wall median {:.3} ms (first {:.3} ms, min {:.3} ms){}",
        passes.len(),
        med * 1e3,
        walls[0] * 1e3,
        walls.iter().copied().fold(f64::INFINITY, f64::min) * 1e3,
        if variants.is_empty() {
            ""
        } else {
            " (every --idle-variants variant together, as the figures below; each one's above)"
        }
    );
    println!(
        "  {} kernels ({} with empty outputs), {} dispatches by kernels, {} dispatches in all, {} submits, {} copies, {} uploads, {} reads, {} host syncs",
        p.kernels,
        p.kernels_skipped,
        p.kernel_dispatches,
        p.stats.dispatches,
        p.stats.submits,
        p.stats.copies,
        p.stats.uploads,
        p.stats.reads,
        p.host_syncs
    );
    println!(
        "  host-to-device payloads: {:.1} MB of random data drawn in {:.1} ms before the pass (outside the timed wall)",
        p.payload_bytes as f64 * 1e-6,
        p.payload_s * 1e3
    );
    println!(
        "  host time in the pass: {} uploads of >= 1 MiB {:.3} ms (longest {:.3} ms), reads back and host syncs {:.3} ms",
        p.big_uploads.0,
        p.big_uploads.1 * 1e3,
        p.big_uploads.2 * 1e3,
        p.waits_s * 1e3
    );
    if p.dispatch_mismatches > 0 || p.shape_mismatches > 0 {
        println!(
            "  {} kernel calls dispatched a different number of times than traced; {} had other output shapes on the replayed data",
            p.dispatch_mismatches, p.shape_mismatches
        );
    }
    // GPU time twice: per pass first (two timestamps per compute pass: the step runs nearly
    // as untimed, so its busy share is the step's), then per dispatch (per-op GPU time and the
    // gaps between dispatches, with the timestamps' own cost in them).
    let mut steps = report_steps(&passes);
    report_chain(&passes, &mut steps);
    let mut gpu = None;
    for per_pass in [true, false] {
        let what = if per_pass {
            "timestamps around each compute pass"
        } else {
            "timestamps around each command"
        };
        match timed_pass(dev, &trace, &mut cache, repeat as u64, per_pass) {
            Ok(g) => {
                println!(
                    "  GPU ({what}, one more pass): busy {:.3} ms of its {:.3} ms wall = {:.1}% \
                     (first to last command {:.3} ms; sum of commands {:.3} ms; {} commands)",
                    g.summary.busy_ns * 1e-6,
                    g.wall_s * 1e3,
                    100.0 * g.summary.busy_ns * 1e-9 / g.wall_s,
                    g.summary.span_ns * 1e-6,
                    g.summary.sum_ns * 1e-6,
                    g.summary.commands
                );
                report_timed_steps(&g, per_pass, &mut steps);
                if !per_pass {
                    gpu = Some(g);
                }
            }
            Err(why) => {
                println!(
                    "  GPU time ({what}): not measured ({why}{})",
                    if timestamps {
                        ""
                    } else {
                        "; the adapter lacks TIMESTAMP_QUERY"
                    }
                );
                break;
            }
        }
    }
    let mut ops: Vec<(&String, &OpTime)> = p.per_op.iter().collect();
    ops.sort_by(|a, b| b.1.host_s.total_cmp(&a.1.host_s));
    println!(
        "  {:<28} {:>7} {:>10} {:>9} {:>9} {:>12} {:>10}",
        "op (host time: shapes + record)",
        "calls",
        "total ms",
        "us/call",
        "median us",
        "traced us/c",
        "dispatches"
    );
    for (op, t) in ops.iter().take(top) {
        println!(
            "  {:<28} {:>7} {:>10.3} {:>9.1} {:>9.1} {:>12.1} {:>10}",
            op,
            t.calls,
            t.host_s * 1e3,
            t.host_s * 1e6 / t.calls as f64,
            median(&t.host_calls) * 1e6,
            t.traced_host_s * 1e6 / t.calls as f64,
            t.dispatches
        );
    }
    let all: Vec<f64> = p
        .per_op
        .values()
        .flat_map(|t| t.host_calls.iter().copied())
        .collect();
    if !all.is_empty() {
        let medians: f64 = p
            .per_op
            .values()
            .map(|t| median(&t.host_calls) * t.calls as f64)
            .sum();
        println!(
            "  host time of all {} kernel calls: {:.3} ms, {:.3} ms as the sum of each op's \
             median call x calls",
            all.len(),
            all.iter().sum::<f64>() * 1e3,
            medians * 1e3
        );
    }
    if let Some(g) = &gpu {
        let mut by_gpu: Vec<(&String, &(u64, f64))> = g.per_op.iter().collect();
        by_gpu.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        println!(
            "  {:<28} {:>10} {:>10} {:>8}",
            "op (GPU time, timestamps)", "dispatches", "GPU ms", "% busy"
        );
        for (op, (n, ns)) in by_gpu.iter().take(top) {
            println!(
                "  {:<28} {:>10} {:>10.3} {:>8.1}",
                op,
                n,
                ns * 1e-6,
                100.0 * ns / g.summary.busy_ns.max(1.0)
            );
        }
    }
    report_synced(p, top);
    if let Some(out) = flag("--json") {
        let d = dev.description();
        let mut doc = json!({
            "adapter": d.name, "backend": d.backend, "trace": path,
            "events": trace.events.len(), "traced_kernels": traced_kernels,
            "traced_dispatches": traced_dispatches,
            "repeat": passes.len(), "wall_ms": walls.iter().map(|w| w * 1e3).collect::<Vec<_>>(),
            "wall_median_ms": med * 1e3,
            "kernels": p.kernels, "kernels_skipped": p.kernels_skipped,
            "kernel_dispatches": p.kernel_dispatches,
            "dispatch_mismatches": p.dispatch_mismatches, "shape_mismatches": p.shape_mismatches,
            "dispatches": p.stats.dispatches, "submits": p.stats.submits,
            "copies": p.stats.copies, "uploads": p.stats.uploads, "reads": p.stats.reads,
            "host_syncs": p.host_syncs, "host_kernels": p.host_kernels,
            "payload_bytes": p.payload_bytes, "payload_draw_ms": p.payload_s * 1e3,
            "big_uploads": p.big_uploads.0, "big_uploads_host_ms": p.big_uploads.1 * 1e3,
            "big_upload_longest_ms": p.big_uploads.2 * 1e3, "waits_host_ms": p.waits_s * 1e3,
            "bind_groups_created": p.stats.bind_groups,
            "gpu_busy_ms": gpu.as_ref().map(|g| g.summary.busy_ns * 1e-6),
            "gpu_span_ms": gpu.as_ref().map(|g| g.summary.span_ns * 1e-6),
            "gpu_sum_ms": gpu.as_ref().map(|g| g.summary.sum_ns * 1e-6),
            "gpu_timed_wall_ms": gpu.as_ref().map(|g| g.wall_s * 1e3),
            "gpu_busy_pct": gpu.as_ref().map(|g| 100.0 * g.summary.busy_ns * 1e-9 / g.wall_s),
            "gpu_per_op_ms": gpu.as_ref().map(|g| g.per_op.iter().map(|(k, (n, ns))| (k.clone(), json!({
                "dispatches": n, "gpu_ms": ns * 1e-6,
            }))).collect::<serde_json::Map<_, _>>()),
            "per_op": p.per_op.iter().map(|(k, t)| (k.clone(), op_json(t))).collect::<serde_json::Map<_, _>>(),
        });
        doc["steps"] = steps;
        if !variants.is_empty() {
            doc["idle_variants"] = idle_doc;
        }
        write_json(out, &doc)?;
    }
    Ok(())
}

/// One idle rule of `--idle-variants` (see [`tfwgpu_runtime::IdleRule`]).
struct IdleVariant {
    name: String,
    age: Option<std::time::Duration>,
    rule: IdleRule,
}

/// `--idle-variants age:50,quiet:50,off`: the idle rules that the passes after the first take
/// in turn (pass r >= 1 runs variant (r - 1) mod n; the first pass, which builds the
/// pipelines, runs the first variant), so that they are compared in one process, on one host
/// speed (bench/RESULTS.md, session 18: processes of one call recorded a step 2.5x apart).
fn parse_idle_variants(s: &str) -> Result<Vec<IdleVariant>, String> {
    let bad =
        || format!("bad --idle-variants {s:?}: want age:US, quiet:US or off, comma-separated");
    let names: Vec<&str> = s.split(',').map(str::trim).collect();
    if (1..names.len()).any(|i| names[..i].contains(&names[i])) {
        return Err(format!("--idle-variants {s:?} names a variant twice"));
    }
    s.split(',')
        .map(|v| {
            let v = v.trim();
            if v == "off" {
                return Ok(IdleVariant {
                    name: v.into(),
                    age: None,
                    rule: IdleRule::Age,
                });
            }
            let (rule, us) = v.split_once(':').ok_or_else(bad)?;
            let rule = IdleRule::parse(rule).ok_or_else(bad)?;
            let us: u64 = us.parse().map_err(|_| bad())?;
            Ok(IdleVariant {
                name: v.into(),
                age: (us > 0).then(|| std::time::Duration::from_micros(us)),
                rule,
            })
        })
        .collect()
}

/// Per label of the mark that opens each step, over `passes`: the step's ms, then where the
/// host's time to its closing mark went (record, flush, wait ms; see [`MarkChain`]).
fn chain_parts<'a>(passes: impl IntoIterator<Item = &'a Pass>) -> BTreeMap<String, [Vec<f64>; 4]> {
    let mut parts: BTreeMap<String, [Vec<f64>; 4]> = BTreeMap::new();
    for p in passes {
        for (w, c) in p.marks.windows(2).zip(p.mark_chain.iter().skip(1)) {
            let e = parts.entry(w[0].0.clone()).or_default();
            e[0].push((w[1].1 - w[0].1) * 1e3);
            e[1].push((c.reached_s - w[0].1) * 1e3);
            e[2].push(c.flush_s * 1e3);
            e[3].push(c.wait_s * 1e3);
        }
    }
    parts
}

/// With `--idle-variants`: each variant's step medians and host chain (record / flush / wait)
/// over its passes; the JSON value `{variant: {passes, submits, steps: {label: {median_ms,
/// record_ms, flush_ms, wait_ms, ms}}}}`.
fn report_idle_variants(variants: &[IdleVariant], passes: &[Pass]) -> Value {
    let mut doc = serde_json::Map::new();
    for (k, v) in variants.iter().enumerate() {
        let mine: Vec<&Pass> = (1..passes.len())
            .filter(|r| (r - 1) % variants.len() == k)
            .map(|r| &passes[r])
            .collect();
        let parts = chain_parts(mine.iter().copied());
        let submits: u64 = mine.iter().map(|p| p.stats.submits).sum();
        let mut steps = serde_json::Map::new();
        let mut line = vec![];
        for (label, [ms, rec, flush, wait]) in &parts {
            if median(ms) < 0.01 {
                continue;
            }
            line.push(format!(
                "{label} {:.3} ms (record {:.3} / flush {:.3} / wait {:.3})",
                median(ms),
                median(rec),
                median(flush),
                median(wait)
            ));
            steps.insert(
                label.clone(),
                json!({"median_ms": median(ms), "record_ms": median(rec), "flush_ms": median(flush),
                       "wait_ms": median(wait), "ms": ms}),
            );
        }
        println!(
            "  idle {}: {} passes, {:.1} submits per pass; {}",
            v.name,
            mine.len(),
            submits as f64 / mine.len().max(1) as f64,
            line.join("; ")
        );
        doc.insert(
            v.name.clone(),
            json!({"passes": mine.len(), "submits": submits, "steps": steps}),
        );
    }
    Value::Object(doc)
}

/// One op's figures in the JSON report.
fn op_json(t: &OpTime) -> Value {
    json!({
        "calls": t.calls, "host_ms": t.host_s * 1e3, "dispatches": t.dispatches,
        "traced_host_ms": t.traced_host_s * 1e3, "synced_ms": t.synced_s * 1e3,
        "host_us_median": median(&t.host_calls) * 1e6,
    })
}

/// Writes `doc` as pretty JSON to `out` and says so on stderr.
pub(crate) fn write_json(out: &str, doc: &Value) -> Result<(), String> {
    std::fs::write(out, serde_json::to_string_pretty(doc).expect("json"))
        .map_err(|e| format!("{out}: {e}"))?;
    eprintln!("wrote {out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfwgpu_runtime::{Arg, DispatchTiming, Runtime};

    #[test]
    fn gaps_split_idle_time_by_batch() {
        let t = |batch: u64, s: f64, e: f64| DispatchTiming {
            batch,
            label: "k".into(),
            start_ns: s,
            end_ns: e,
        };
        // Batch 1: [0,10] [12,20] (2 ns intra); batch 2 starts at 50 (30 ns inter), overlaps
        // inside itself; batch 3 starts exactly when batch 2 ends (no gap).
        let g = Gaps::of(&[
            t(1, 0.0, 10.0),
            t(1, 12.0, 20.0),
            t(2, 50.0, 60.0),
            t(2, 55.0, 58.0),
            t(2, 61.0, 70.0),
            t(3, 70.0, 80.0),
        ]);
        assert_eq!(g.intra_ns, 3.0);
        assert_eq!(g.inter_ns, 30.0);
        assert_eq!(g.inter_count, 1);
        assert_eq!(g.inter_max_ns, 30.0);
        assert_eq!(g.top.len(), 1);
        assert_eq!(
            (g.top[0].index, g.top[0].at_ns, g.top[0].idle_ns),
            (2, 50.0, 30.0)
        );
        let all = [t(1, 0.0, 10.0), t(1, 12.0, 20.0), t(2, 50.0, 60.0)];
        let sum = TimingSummary::of(&all);
        let g = Gaps::of(&all);
        assert_eq!(sum.busy_ns + g.intra_ns + g.inter_ns, sum.span_ns);
        assert_eq!(Gaps::of(&[]), Gaps::default());
    }

    fn line(v: Value) -> String {
        v.to_string() + "\n"
    }

    /// A synthetic trace of an add, a reduction with a host-memory axis, an empty kernel and
    /// the copies around them, at interior addresses of one allocation.
    fn synthetic(sum_dispatches: u64) -> String {
        let base: u64 = 0x7000_0000;
        let f = |a: u64| json!({"dtype": "float32", "shape": [7, 3], "addr": a});
        let mut s = line(json!({"ev": "header", "format": "tfwgpu-trace", "version": 1}));
        s += &line(json!({"ev": "alloc", "seq": 0, "dev": 0, "addr": base, "size": 4096}));
        s += &line(json!({"ev": "h2d", "seq": 1, "dev": 0, "dst": base, "size": 84}));
        s += &line(json!({"ev": "h2d", "seq": 2, "dev": 0, "dst": base + 256, "size": 84}));
        s += &line(
            json!({"ev": "kernel", "seq": 3, "dev": 0, "op": "AddV2", "node": "add",
            "attrs": {"T": {"type": "float32"}}, "inputs": [f(base), f(base + 256)],
            "outputs": [f(base + 512)], "dispatches": 1, "host_us": 5.0}),
        );
        s += &line(
            json!({"ev": "kernel", "seq": 4, "dev": 0, "op": "Sum", "node": "sum",
            "attrs": {"T": {"type": "float32"}, "Tidx": {"type": "int32"}, "keep_dims": {"b": false}},
            "inputs": [f(base + 512), {"dtype": "int32", "shape": [1], "host": "00000000"}],
            "outputs": [{"dtype": "float32", "shape": [3], "addr": base + 1024}],
            "dispatches": sum_dispatches, "host_us": 5.0}),
        );
        s += &line(
            json!({"ev": "kernel", "seq": 5, "dev": 0, "op": "Relu", "node": "r",
            "attrs": {"T": {"type": "float32"}},
            "inputs": [{"dtype": "float32", "shape": [0, 3], "addr": base + 1536}],
            "outputs": [{"dtype": "float32", "shape": [0, 3], "addr": base + 1536}],
            "dispatches": 0, "host_us": 1.0, "skipped": true}),
        );
        s += &line(json!({"ev": "d2h", "seq": 6, "dev": 0, "src": base + 1024, "size": 12}));
        s += &line(json!({"ev": "free", "seq": 7, "dev": 0, "addr": base}));
        s
    }

    #[test]
    fn replays_a_synthetic_trace_with_the_traced_dispatches() {
        let rt = Runtime::new().expect("an adapter");
        let dev = rt.device();
        // The number of dispatches Sum of a [7, 3] float32 over axis 0 takes on this adapter.
        let x = dev.upload(&[0.5f32; 21], &[7, 3]).unwrap();
        let axes = HostTensor::vec_i32(&[0]);
        dev.synchronize().unwrap();
        let d0 = dev.exec_stats().dispatches;
        let y = dev
            .run("Sum", &Attrs::new(), &[Arg::from(&x), Arg::from(&axes)])
            .unwrap();
        let sum_dispatches = dev.exec_stats().dispatches - d0;
        assert_eq!(y[0].download::<f32>().unwrap(), vec![3.5; 3]);
        assert!(sum_dispatches >= 1);

        let trace = Trace::parse(&synthetic(sum_dispatches)).unwrap();
        assert_eq!(trace.kernels().count(), 3);
        // Both uploads are read as float32 by the add.
        let fills: Vec<Option<DType>> = trace
            .events
            .iter()
            .filter_map(|e| match e {
                Event::H2d { fill, .. } => Some(*fill),
                _ => None,
            })
            .collect();
        assert_eq!(fills, vec![Some(DType::F32), Some(DType::F32)]);
        let in_use = dev.memory_stats().bytes_in_use;
        let mut cache = HashMap::new();
        for seed in 0..2 {
            let p = replay_once(dev, &trace, &mut cache, seed).unwrap();
            assert_eq!(p.kernels, 3);
            assert_eq!(p.kernels_skipped, 1);
            // Kernels that dispatch: the add (1) and the sum.
            assert_eq!(p.kernel_dispatches, 1 + sum_dispatches);
            assert_eq!(p.stats.dispatches, 1 + sum_dispatches);
            assert_eq!(p.dispatch_mismatches, 0);
            assert_eq!(p.shape_mismatches, 0);
            assert_eq!(p.host_syncs, 1);
            assert_eq!(p.per_op["AddV2"].calls, 1);
        }
        assert_eq!(cache.len(), 3, "kernels are built once per (op, attrs)");
        // Every replayed allocation was freed.
        assert_eq!(dev.memory_stats().bytes_in_use, in_use);
    }

    #[test]
    fn marks_split_each_pass_into_steps() {
        let rt = Runtime::new().expect("an adapter");
        let dev = rt.device();
        let mark = |l: &str| line(json!({"ev": "mark", "seq": 0, "dev": -1, "label": l}));
        let base = synthetic(1);
        let lines: Vec<&str> = base.lines().collect();
        // header, alloc, | step | h2d, h2d, add, | step | sum, empty relu, d2h, | end | free
        let mut text = String::new();
        for (i, l) in lines.iter().enumerate() {
            match i {
                2 | 5 => text += &mark("step"),
                8 => text += &mark("end"),
                _ => {}
            }
            text += l;
            text.push('\n');
        }
        let trace = Trace::parse(&text).unwrap();
        assert_eq!(trace.devices, vec![0], "marks belong to no device");
        let mut cache = HashMap::new();
        let passes: Vec<Pass> = (0..3)
            .map(|seed| replay_once(dev, &trace, &mut cache, seed).unwrap())
            .collect();
        for p in &passes {
            let labels: Vec<&str> = p.marks.iter().map(|m| m.0.as_str()).collect();
            assert_eq!(labels, ["step", "step", "end"]);
            assert!(p.marks.windows(2).all(|w| w[0].1 <= w[1].1));
            assert!(p.marks[2].1 <= p.wall_s);
            // Each mark's chain: reached after the mark before it ended, then its flush and
            // its wait, which end no later than the mark's own time.
            assert_eq!(p.mark_chain.len(), 3);
            for (i, c) in p.mark_chain.iter().enumerate() {
                let before = if i == 0 { 0.0 } else { p.marks[i - 1].1 };
                assert!(c.reached_s >= before, "{i}: {c:?}");
                assert!(c.flush_s >= 0.0 && c.wait_s >= 0.0, "{i}: {c:?}");
                assert!(
                    c.reached_s + c.flush_s + c.wait_s <= p.marks[i].1 + 1e-9,
                    "{i}: {c:?}"
                );
            }
        }
        let steps = step_times(&passes);
        // Two intervals per pass open with "step"; the first pass is left out.
        assert_eq!(steps.keys().collect::<Vec<_>>(), ["step"]);
        assert_eq!(steps["step"].len(), 4);
        assert!(steps["step"].iter().all(|ms| *ms >= 0.0));
        assert_eq!(step_times(&passes[..1])["step"].len(), 2);
    }

    #[test]
    fn sync_each_charges_each_op_its_synchronized_time() {
        let rt = Runtime::new().expect("an adapter");
        let dev = rt.device();
        let trace = Trace::parse(&synthetic(1)).unwrap();
        let mut cache = HashMap::new();
        let plain = replay_once(dev, &trace, &mut cache, 0).unwrap();
        assert!(plain.per_op.values().all(|t| t.synced_s == 0.0));
        SYNC_EACH.store(true, Ordering::Relaxed);
        let synced = replay_once(dev, &trace, &mut cache, 0);
        SYNC_EACH.store(false, Ordering::Relaxed);
        let synced = synced.unwrap();
        for op in ["AddV2", "Sum", "Relu"] {
            let t = &synced.per_op[op];
            assert!(t.synced_s > 0.0 && t.synced_s >= t.host_s, "{op}: {t:?}");
        }
        assert_eq!(synced.kernel_dispatches, plain.kernel_dispatches);
    }

    #[test]
    fn rejects_addresses_outside_traced_allocations_and_bad_files() {
        let rt = Runtime::new().expect("an adapter");
        let dev = rt.device();
        let bad = synthetic(1).replace(
            "\"size\":4096",
            "\"size\":512", // the sum's output now lies past the allocation
        );
        let trace = Trace::parse(&bad).unwrap();
        let err = replay_once(dev, &trace, &mut HashMap::new(), 0).unwrap_err();
        assert!(err.contains("lies in no traced allocation"), "{err}");
        assert!(Trace::parse("{\"ev\":\"alloc\",\"addr\":1,\"size\":2}").is_err());
        let unknown = synthetic(1) + "{\"ev\":\"teleport\",\"seq\":9}\n";
        assert!(
            Trace::parse(&unknown)
                .unwrap_err()
                .contains("unknown event")
        );
    }
}
