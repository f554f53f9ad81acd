//! `tfwgpu-bench replay TRACE --per-device`: replays a trace of several tfwgpu devices (a
//! `tf.distribute.MirroredStrategy` program) with every traced device on an adapter of its own
//! and one host thread per device, as TensorFlow drove them: each thread records its device's
//! events in trace order, and the threads meet only where the program's devices depended on
//! each other.
//!
//! - A copy between devices (`d2d` with `to_dev`) is what the plugin does: the issuing
//!   device's thread reads the source back (submitted, not waited for), and the destination's
//!   thread waits for that read and uploads the bytes before the first of its events that
//!   touches the destination range (or at its next host sync, mark, or the end). A thread
//!   thus waits for another device exactly where its data comes from there.
//! - Marks (step boundaries) are met by every thread: each drains its device, and the step's
//!   time is taken when the last one has.
//!
//! Steps of a program that used one device of several (`OneDeviceStrategy` before
//! `MirroredStrategy` in bench/mirrored.py) run on that device alone, so one trace gives the
//! one- and the multi-device step side by side (`--json` records both; labels of the form
//! `<n>gpu` are compared as images per step scaling with `n`).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use rand::{SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use tfwgpu_runtime::{Device, Kernel, ReadInFlight, Runtime};

use crate::replay::{
    Event, Input, Memory, Pass, Timed, Trace, apply_event, median_pass, random_bytes, report_steps,
    sub, write_json,
};

/// A copy between devices: issued by slot `from` (its source lives there), landing on slot `to`.
#[derive(Debug)]
struct CrossCopy {
    from: usize,
    to: usize,
    /// The `d2d` event.
    event: usize,
}

/// What each device's thread replays, and where it waits for copies from other devices.
/// Slots are positions in `Trace::devices`.
#[derive(Debug)]
pub struct Plan {
    /// Per slot: the indices of its events in trace order, every mark included.
    lists: Vec<Vec<usize>>,
    /// (slot, event index) -> the copies into that slot that must land before the event.
    waits: HashMap<(usize, usize), Vec<usize>>,
    /// Per slot: copies that no later event of the slot waited for (landed at the end).
    tail: Vec<Vec<usize>>,
    copies: Vec<CrossCopy>,
    /// `d2d` event index -> its copy.
    copy_of: HashMap<usize, usize>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl Plan {
    pub fn new(trace: &Trace) -> Result<Plan, String> {
        let n = trace.devices.len();
        let slot_of = |d: i64, i: usize| {
            trace
                .devices
                .iter()
                .position(|&x| x == d)
                .ok_or_else(|| format!("event {i}: device {d} is not in the trace's devices"))
        };
        let mut plan = Plan {
            lists: vec![vec![]; n],
            waits: HashMap::new(),
            tail: vec![],
            copies: vec![],
            copy_of: HashMap::new(),
        };
        // Per slot: copies landing there that nothing has waited for yet: (id, [dst, end)).
        let mut pending: Vec<Vec<(usize, (u64, u64))>> = vec![vec![]; n];
        // Traced allocation sizes (addresses carry their device, so one map serves all).
        let mut sizes: HashMap<u64, u64> = HashMap::new();
        for (i, ev) in trace.events.iter().enumerate() {
            if let Event::Mark(_) = ev {
                for (s, p) in pending.iter_mut().enumerate() {
                    plan.lists[s].push(i);
                    if !p.is_empty() {
                        plan.waits
                            .insert((s, i), p.drain(..).map(|c| c.0).collect());
                    }
                }
                continue;
            }
            let s = slot_of(trace.dev_of[i], i)?;
            plan.lists[s].push(i);
            let mut ranges: Vec<(u64, u64)> = vec![];
            let mut all = false;
            match ev {
                Event::Alloc { addr, size } => {
                    sizes.insert(*addr, *size);
                }
                Event::Free { addr } => {
                    if let Some(size) = sizes.remove(addr) {
                        ranges.push((*addr, addr + size));
                    }
                }
                Event::H2d { dst, size, .. } => ranges.push((*dst, dst + size)),
                Event::D2h { src, size } => ranges.push((*src, src + size)),
                Event::Fill { addr, size, .. } => ranges.push((*addr, addr + size)),
                Event::D2d {
                    src,
                    dst,
                    size,
                    to_dev,
                } => {
                    ranges.push((*src, src + size));
                    match to_dev {
                        None => ranges.push((*dst, dst + size)),
                        Some(t) => {
                            let to = slot_of(*t, i)?;
                            let id = plan.copies.len();
                            plan.copies.push(CrossCopy {
                                from: s,
                                to,
                                event: i,
                            });
                            plan.copy_of.insert(i, id);
                            pending[to].push((id, (*dst, dst + size)));
                        }
                    }
                }
                Event::Kernel(k) => {
                    for inp in &k.inputs {
                        if let Input::Device(d, a) = inp {
                            ranges.push((*a, a + d.byte_size()));
                        }
                    }
                    for (d, a) in &k.outputs {
                        ranges.push((*a, a + d.byte_size()));
                    }
                }
                Event::Sync => all = true,
                Event::HostKernel | Event::Mark(_) => {}
            }
            let p = &mut pending[s];
            let mut hit = vec![];
            p.retain(|&(id, r)| {
                let wait = all || ranges.iter().any(|&x| overlaps(x, r));
                if wait {
                    hit.push(id);
                }
                !wait
            });
            if !hit.is_empty() {
                plan.waits.insert((s, i), hit);
            }
        }
        plan.tail = pending
            .into_iter()
            .map(|p| p.into_iter().map(|c| c.0).collect())
            .collect();
        Ok(plan)
    }
}

/// What the device threads of a multi-device replay share (`--per-device` here, and
/// `replay_dp`): a barrier for marks, the marks, a failure flag that releases every waiting
/// thread when one fails, and the replay's own state `S`.
pub(crate) struct Shared<S> {
    state: Mutex<State<S>>,
    cv: Condvar,
    threads: usize,
}

pub(crate) struct State<S> {
    arrived: usize,
    generation: u64,
    failed: bool,
    pub(crate) marks: Vec<(String, f64)>,
    /// The replay's own state.
    pub(crate) own: S,
}

pub(crate) const OTHER_FAILED: &str = "another device's replay failed";

impl<S> Shared<S> {
    pub(crate) fn new(threads: usize, own: S) -> Self {
        Shared {
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                failed: false,
                marks: vec![],
                own,
            }),
            cv: Condvar::new(),
            threads,
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every thread got here; the last one to arrive returns true.
    pub(crate) fn barrier(&self) -> Result<bool, String> {
        let mut st = self.lock();
        if st.failed {
            return Err(OTHER_FAILED.into());
        }
        st.arrived += 1;
        if st.arrived == self.threads {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(true);
        }
        let g = st.generation;
        while st.generation == g && !st.failed {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.generation == g {
            return Err(OTHER_FAILED.into());
        }
        Ok(false)
    }

    /// A mark: the barrier, then the last thread to arrive records `label` at its time since
    /// `t0`.
    pub(crate) fn mark(&self, label: &str, t0: Instant) -> Result<(), String> {
        if self.barrier()? {
            self.lock()
                .marks
                .push((label.to_string(), t0.elapsed().as_secs_f64()));
        }
        Ok(())
    }

    /// Changes the replay's own state and wakes the waiting threads.
    pub(crate) fn update(&self, f: impl FnOnce(&mut S)) {
        f(&mut self.lock().own);
        self.cv.notify_all();
    }

    /// Waits until `f` returns something, or another thread failed.
    pub(crate) fn wait_for<T>(&self, mut f: impl FnMut(&mut S) -> Option<T>) -> Result<T, String> {
        let mut st = self.lock();
        loop {
            if let Some(r) = f(&mut st.own) {
                return Ok(r);
            }
            if st.failed {
                return Err(OTHER_FAILED.into());
            }
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits while `f` holds, whether or not another thread failed.
    pub(crate) fn wait_while(&self, mut f: impl FnMut(&S) -> bool) {
        let mut st = self.lock();
        while f(&st.own) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(crate) fn failed(&self) -> bool {
        self.lock().failed
    }

    pub(crate) fn fail(&self) {
        self.lock().failed = true;
        self.cv.notify_all();
    }
}

/// The reads of copies between devices in flight, by copy (the state `--per-device` adds to
/// `Shared`).
type Reads = Vec<Option<ReadInFlight>>;

impl Shared<Reads> {
    fn put_read(&self, id: usize, read: ReadInFlight) {
        self.update(|reads| reads[id] = Some(read));
    }

    fn take_read(&self, id: usize) -> Result<ReadInFlight, String> {
        self.wait_for(|reads| reads[id].take())
    }
}

/// One replay of the whole trace on several devices.
#[derive(Debug, Default)]
pub struct MultiPass {
    pub wall_s: f64,
    /// Each mark's label and the time (seconds since the pass began) at which every device
    /// had finished the work before it.
    pub marks: Vec<(String, f64)>,
    /// Per slot: that device's counters (its `marks` are empty).
    pub devices: Vec<Pass>,
    /// Per slot: copies it issued to other devices, and their bytes.
    pub cross_copies: Vec<(u64, u64)>,
    /// Per slot: when its thread replayed each of its events.
    pub timelines: Vec<Vec<Span>>,
}

/// When one device's thread replayed an event (microseconds since the pass began): it began,
/// the copies it waited for had landed, it was done.
#[derive(Clone, Debug)]
pub struct Span {
    pub event: usize,
    pub start_us: f64,
    pub landed_us: f64,
    pub end_us: f64,
}

/// One device's counters, the (count, bytes) of the copies it issued to other devices, and
/// its timeline.
struct DeviceRun {
    pass: Pass,
    issued: (u64, u64),
    timeline: Vec<Span>,
}

type DeviceResult = Result<DeviceRun, String>;

#[allow(clippy::too_many_arguments)]
fn device_thread(
    s: usize,
    devs: &[&Device],
    trace: &Trace,
    plan: &Plan,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    shared: &Shared<Reads>,
    payloads: Vec<Vec<u8>>,
    t0: Instant,
) -> DeviceResult {
    let dev = devs[s];
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let mut mem = Memory::new(dev);
    let mut pass = Pass::default();
    let mut issued = (0u64, 0u64);
    let mut timeline = Vec::with_capacity(plan.lists[s].len());
    let mut payloads = payloads.into_iter();
    let before = dev.exec_stats();
    pass.first_dispatch = before.dispatches;
    let land = |id: usize, mem: &mut Memory| -> Result<(), String> {
        let c = &plan.copies[id];
        debug_assert_eq!(c.to, s);
        let Event::D2d { dst, size, .. } = &trace.events[c.event] else {
            unreachable!("copies are d2d events")
        };
        let read = shared.take_read(id)?;
        let a = mem.map(*dst, *size, &|| format!("event {}", c.event))?;
        devs[c.from]
            .finish_read(read, |bytes| dev.write(a, bytes))
            .map_err(e)?
            .map_err(e)
    };
    let result = (|| -> Result<(), String> {
        for &i in &plan.lists[s] {
            let t_in = t0.elapsed().as_secs_f64();
            if let Some(ids) = plan.waits.get(&(s, i)) {
                for &id in ids {
                    land(id, &mut mem)?;
                }
            }
            let t_landed = t0.elapsed().as_secs_f64();
            match &trace.events[i] {
                Event::Mark(label) => {
                    dev.synchronize().map_err(e)?;
                    shared.mark(label, t0)?;
                }
                Event::D2d {
                    src,
                    size,
                    to_dev: Some(_),
                    ..
                } => {
                    let a = mem.map(*src, *size, &|| format!("event {i}"))?;
                    let read = dev.read_async(a, *size as usize).map_err(e)?;
                    shared.put_read(plan.copy_of[&i], read);
                    issued.0 += 1;
                    issued.1 += size;
                }
                ev => apply_event(dev, i, ev, cache, &mut mem, &mut payloads, &mut pass)?,
            }
            timeline.push(Span {
                event: i,
                start_us: t_in * 1e6,
                landed_us: t_landed * 1e6,
                end_us: t0.elapsed().as_secs_f64() * 1e6,
            });
        }
        for &id in &plan.tail[s] {
            land(id, &mut mem)?;
        }
        dev.synchronize().map_err(e)
    })();
    if result.is_err() {
        shared.fail();
    }
    pass.wall_s = t0.elapsed().as_secs_f64();
    pass.stats = sub(dev.exec_stats(), before);
    let freed = mem.free_all();
    result?;
    freed?;
    Ok(DeviceRun {
        pass,
        issued,
        timeline,
    })
}

/// Replays the trace once with slot `s` on `devs[s]`, one thread per device.
pub fn replay_multi(
    devs: &[&Device],
    trace: &Trace,
    plan: &Plan,
    caches: &mut [HashMap<String, Box<dyn Kernel>>],
    seed: u64,
) -> Result<MultiPass, String> {
    assert_eq!(devs.len(), trace.devices.len());
    assert_eq!(caches.len(), devs.len());
    let mut rng = StdRng::seed_from_u64(seed);
    let payloads: Vec<Vec<Vec<u8>>> = plan
        .lists
        .iter()
        .map(|list| {
            list.iter()
                .filter_map(|&i| match &trace.events[i] {
                    Event::H2d { size, fill, .. } => Some(random_bytes(&mut rng, *fill, *size)),
                    _ => None,
                })
                .collect()
        })
        .collect();
    for d in devs {
        d.synchronize().map_err(|e| e.to_string())?;
    }
    let shared = Shared::new(
        devs.len(),
        (0..plan.copies.len()).map(|_| None).collect::<Reads>(),
    );
    let t0 = Instant::now();
    let results: Vec<DeviceResult> = std::thread::scope(|sc| {
        let handles: Vec<_> = caches
            .iter_mut()
            .zip(payloads)
            .enumerate()
            .map(|(s, (cache, p))| {
                let shared = &shared;
                sc.spawn(move || device_thread(s, devs, trace, plan, cache, shared, p, t0))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a replay thread panicked".into()))
            })
            .collect()
    });
    let wall_s = t0.elapsed().as_secs_f64();
    // The first real error, not the "another device failed" of the threads it released.
    if let Some(err) = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .find(|e| e.as_str() != OTHER_FAILED)
        .or_else(|| results.iter().find_map(|r| r.as_ref().err()))
    {
        return Err(err.clone());
    }
    let mut out = MultiPass {
        wall_s,
        marks: std::mem::take(&mut shared.lock().marks),
        ..MultiPass::default()
    };
    for r in results.into_iter().map(Result::unwrap) {
        out.devices.push(r.pass);
        out.cross_copies.push(r.issued);
        out.timelines.push(r.timeline);
    }
    Ok(out)
}

/// Writes the median pass's timeline: one JSON line per replayed event and device thread,
/// `{"dev", "event", "ev", "op"?, "size"?, "to_dev"?, "start_us", "landed_us", "end_us"}`,
/// then the marks (`{"mark", "t_us"}`), for reading where each thread waited.
fn write_timeline(out: &str, trace: &Trace, p: &MultiPass) -> Result<(), String> {
    let mut text = String::new();
    for (s, tl) in p.timelines.iter().enumerate() {
        for sp in tl {
            let mut v = json!({
                "dev": trace.devices[s], "event": sp.event,
                "start_us": sp.start_us, "landed_us": sp.landed_us, "end_us": sp.end_us,
            });
            let (kind, extra) = match &trace.events[sp.event] {
                Event::Kernel(k) => ("kernel", json!({"op": k.op})),
                Event::D2d { size, to_dev, .. } => ("d2d", json!({"size": size, "to_dev": to_dev})),
                Event::H2d { size, .. } => ("h2d", json!({"size": size})),
                Event::D2h { size, .. } => ("d2h", json!({"size": size})),
                Event::Sync => ("sync", json!({})),
                Event::Mark(l) => ("mark", json!({"label": l})),
                Event::Alloc { .. } => ("alloc", json!({})),
                Event::Free { .. } => ("free", json!({})),
                Event::Fill { .. } => ("fill", json!({})),
                Event::HostKernel => ("host_kernel", json!({})),
            };
            v["ev"] = json!(kind);
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            text += &v.to_string();
            text.push('\n');
        }
    }
    for (l, t) in &p.marks {
        text += &json!({"mark": l, "t_us": t * 1e6}).to_string();
        text.push('\n');
    }
    std::fs::write(out, text).map_err(|e| format!("{out}: {e}"))
}

impl Timed for MultiPass {
    fn wall_s(&self) -> f64 {
        self.wall_s
    }
    fn marks(&self) -> &[(String, f64)] {
        &self.marks
    }
}

/// Images-per-step scaling between steps labelled `<n>gpu`: for each such label other than
/// `1gpu`, `(n / median ms) / (1 / median ms of 1gpu)`.
pub fn scaling(steps: &Value) -> Vec<(String, f64)> {
    let med = |l: &str| steps.get(l).and_then(|v| v["median_ms"].as_f64());
    let Some(one) = med("1gpu") else {
        return vec![];
    };
    let Some(map) = steps.as_object() else {
        return vec![];
    };
    map.keys()
        .filter_map(|l| {
            let n: f64 = l.strip_suffix("gpu")?.parse().ok()?;
            let m = med(l)?;
            (n > 1.0).then(|| (l.clone(), n * one / m))
        })
        .collect()
}

/// `replay TRACE --per-device [--repeat N] [--json FILE]`.
pub fn run(
    path: &str,
    trace: &Trace,
    rt: &Runtime,
    repeat: usize,
    json_out: Option<&str>,
    timeline_out: Option<&str>,
) -> Result<(), String> {
    let mut devs = vec![];
    for &o in &trace.devices {
        let d = usize::try_from(o)
            .ok()
            .and_then(|o| rt.devices.get(o))
            .ok_or_else(|| {
                format!(
                    "--per-device: the trace used device {o}, but {} device(s) are open \
                     (TFWGPU_VISIBLE_DEVICES=0,0 opens one adapter twice)",
                    rt.devices.len()
                )
            })?;
        devs.push(d);
    }
    let plan = Plan::new(trace)?;
    let mut caches: Vec<HashMap<String, Box<dyn Kernel>>> =
        devs.iter().map(|_| HashMap::new()).collect();
    let mut passes = vec![];
    for r in 0..repeat.max(1) {
        passes.push(replay_multi(&devs, trace, &plan, &mut caches, r as u64)?);
    }
    let (walls, med, p) = median_pass(&passes);
    println!(
        "trace {path}: {} events, {} devices, {} copies between devices",
        trace.events.len(),
        devs.len(),
        plan.copies.len()
    );
    println!(
        "replay --per-device x{}: wall median {:.3} ms (first {:.3} ms)",
        passes.len(),
        med * 1e3,
        walls[0] * 1e3
    );
    let mut per_device = vec![];
    for (s, (d, q)) in devs.iter().zip(&p.devices).enumerate() {
        let (n, bytes) = p.cross_copies[s];
        println!(
            "  device {} -> {} ({}): {} kernels, {} dispatches, {} submits, {} host syncs, \
             {n} copies to other devices ({:.2} MB)",
            trace.devices[s],
            s,
            d.description().name,
            q.kernels,
            q.stats.dispatches,
            q.stats.submits,
            q.host_syncs,
            bytes as f64 * 1e-6
        );
        per_device.push(json!({
            "trace_device": trace.devices[s], "adapter": d.description().name,
            "kernels": q.kernels, "dispatches": q.stats.dispatches, "submits": q.stats.submits,
            "host_syncs": q.host_syncs, "cross_copies": n, "cross_copy_bytes": bytes,
            "dispatch_mismatches": q.dispatch_mismatches, "shape_mismatches": q.shape_mismatches,
        }));
    }
    let steps = report_steps(&passes);
    let scale = scaling(&steps);
    for (label, x) in &scale {
        println!("  {label} against 1gpu: {x:.2}x the images per second");
    }
    if let Some(out) = timeline_out {
        write_timeline(out, trace, p)?;
    }
    if let Some(out) = json_out {
        let doc = json!({
            "trace": path, "per_device": true, "repeat": passes.len(),
            "wall_ms": walls.iter().map(|w| w * 1e3).collect::<Vec<_>>(),
            "wall_median_ms": med * 1e3, "devices": per_device,
            "copies_between_devices": plan.copies.len(),
            "steps": steps,
            "scaling": scale.iter().map(|(l, x)| (l.clone(), json!(x))).collect::<serde_json::Map<_, _>>(),
        });
        write_json(out, &doc)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One line of a trace.
    pub(crate) fn line(v: Value) -> String {
        v.to_string() + "\n"
    }

    /// The default adapter opened twice, as two devices (also `replay_dp`'s tests).
    pub(crate) fn two_devices() -> Runtime {
        Runtime::default_adapter_twice(|_| {}).expect("the adapter opened twice")
    }

    const A: u64 = 0x1_0000_0000;
    const B: u64 = 0x2_0000_0000;

    /// Two devices: one step on device 0 alone, then a step where device 0's result crosses to
    /// device 1, is added there, and crosses back. `bad` makes device 1's Add read an address
    /// no allocation holds.
    fn two_device_trace(bad: bool) -> String {
        let f = |a: u64| json!({"dtype": "float32", "shape": [7, 3], "addr": a});
        let t = json!({"T": {"type": "float32"}});
        let mut s = line(json!({"ev": "header", "format": "tfwgpu-trace", "version": 1}));
        let mut ev = |v: Value| s += &line(v);
        ev(json!({"ev": "alloc", "seq": 0, "dev": 0, "addr": A, "size": 4096}));
        ev(json!({"ev": "alloc", "seq": 1, "dev": 1, "addr": B, "size": 4096}));
        ev(json!({"ev": "mark", "seq": 2, "dev": -1, "label": "1gpu"}));
        ev(json!({"ev": "h2d", "seq": 3, "dev": 0, "dst": A, "size": 84}));
        ev(
            json!({"ev": "kernel", "seq": 4, "dev": 0, "op": "Relu", "node": "r", "attrs": t,
            "inputs": [f(A)], "outputs": [f(A + 256)], "dispatches": 1, "host_us": 1.0}),
        );
        ev(json!({"ev": "mark", "seq": 5, "dev": -1, "label": "2gpu"}));
        ev(json!({"ev": "h2d", "seq": 6, "dev": 1, "dst": B, "size": 84}));
        ev(
            json!({"ev": "d2d", "seq": 7, "dev": 0, "src": A + 256, "dst": B + 512,
            "size": 84, "to_dev": 1}),
        );
        ev(
            json!({"ev": "kernel", "seq": 8, "dev": 1, "op": "Relu", "node": "r1", "attrs": t,
            "inputs": [f(B)], "outputs": [f(B + 256)], "dispatches": 1, "host_us": 1.0}),
        );
        let other = if bad { B + 8192 } else { B + 512 };
        ev(
            json!({"ev": "kernel", "seq": 9, "dev": 1, "op": "AddV2", "node": "a", "attrs": t,
            "inputs": [f(B + 256), f(other)], "outputs": [f(B + 1024)], "dispatches": 1,
            "host_us": 1.0}),
        );
        ev(
            json!({"ev": "d2d", "seq": 10, "dev": 1, "src": B + 1024, "dst": A + 1024,
            "size": 84, "to_dev": 0}),
        );
        ev(json!({"ev": "mark", "seq": 11, "dev": -1, "label": "end"}));
        ev(json!({"ev": "d2h", "seq": 12, "dev": 0, "src": A + 1024, "size": 84}));
        ev(json!({"ev": "free", "seq": 13, "dev": 0, "addr": A}));
        ev(json!({"ev": "free", "seq": 14, "dev": 1, "addr": B}));
        s
    }

    #[test]
    fn plan_waits_for_a_copy_where_its_destination_is_first_touched() {
        let trace = Trace::parse(&two_device_trace(false)).unwrap();
        assert_eq!(trace.devices, vec![0, 1]);
        let plan = Plan::new(&trace).unwrap();
        // Events: 0 alloc A, 1 alloc B, 2 mark, 3 h2d, 4 relu, 5 mark, 6 h2d, 7 copy 0->1,
        // 8 relu (dev 1), 9 add (reads the copy), 10 copy 1->0, 11 mark, 12 d2h, 13/14 free.
        assert_eq!(plan.lists[0], [0, 2, 3, 4, 5, 7, 11, 12, 13]);
        assert_eq!(plan.lists[1], [1, 2, 5, 6, 8, 9, 10, 11, 14]);
        assert_eq!(plan.copies.len(), 2);
        assert_eq!((plan.copies[0].from, plan.copies[0].to), (0, 1));
        assert_eq!((plan.copies[1].from, plan.copies[1].to), (1, 0));
        // Device 1's Relu does not touch the copy's destination; its Add does.
        assert_eq!(plan.waits.get(&(1, 8)), None);
        assert_eq!(plan.waits[&(1, 9)], [0]);
        // Nothing on device 0 touches the second copy before the mark: it lands there.
        assert_eq!(plan.waits[&(0, 11)], [1]);
        assert_eq!(plan.waits.len(), 2);
        assert!(plan.tail.iter().all(Vec::is_empty));
    }

    #[test]
    fn replays_each_device_on_its_own_thread_with_the_copies_between_them() {
        let rt = two_devices();
        let devs: Vec<&Device> = rt.devices.iter().collect();
        let trace = Trace::parse(&two_device_trace(false)).unwrap();
        let plan = Plan::new(&trace).unwrap();
        let mut caches = vec![HashMap::new(), HashMap::new()];
        let in_use: Vec<u64> = devs.iter().map(|d| d.memory_stats().bytes_in_use).collect();
        for seed in 0..2 {
            let p = replay_multi(&devs, &trace, &plan, &mut caches, seed).unwrap();
            let labels: Vec<&str> = p.marks.iter().map(|m| m.0.as_str()).collect();
            assert_eq!(labels, ["1gpu", "2gpu", "end"]);
            assert!(p.marks.windows(2).all(|w| w[0].1 <= w[1].1));
            assert_eq!(p.cross_copies, [(1, 84), (1, 84)]);
            assert_eq!(p.devices[0].kernels, 1);
            assert_eq!(p.devices[1].kernels, 2);
            assert_eq!(p.devices[0].host_syncs, 1, "the d2h");
            assert!(p.devices.iter().all(|d| d.dispatch_mismatches == 0));
            for (tl, list) in p.timelines.iter().zip(&plan.lists) {
                let events: Vec<usize> = tl.iter().map(|sp| sp.event).collect();
                assert_eq!(&events, list, "one span per event, in order");
                assert!(
                    tl.iter()
                        .all(|sp| sp.start_us <= sp.landed_us && sp.landed_us <= sp.end_us)
                );
                assert!(tl.windows(2).all(|w| w[0].end_us <= w[1].start_us));
            }
        }
        assert_eq!(caches[1].len(), 2, "kernels are built once per device");
        let now: Vec<u64> = devs.iter().map(|d| d.memory_stats().bytes_in_use).collect();
        assert_eq!(now, in_use, "every replayed allocation was freed");
    }

    #[test]
    fn a_failing_device_releases_the_others_and_reports_its_error() {
        let rt = two_devices();
        let devs: Vec<&Device> = rt.devices.iter().collect();
        let trace = Trace::parse(&two_device_trace(true)).unwrap();
        let plan = Plan::new(&trace).unwrap();
        let mut caches = vec![HashMap::new(), HashMap::new()];
        // Device 0 waits at the "end" mark for device 1, whose Add fails.
        let err = replay_multi(&devs, &trace, &plan, &mut caches, 0).unwrap_err();
        assert!(err.contains("lies in no traced allocation"), "{err}");
    }

    #[test]
    fn scaling_compares_images_per_step_by_device_count() {
        let steps = json!({"1gpu": {"median_ms": 10.0}, "2gpu": {"median_ms": 11.0},
            "end": {"median_ms": 3.0}});
        let s = scaling(&steps);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].0, "2gpu");
        assert!((s[0].1 - 2.0 * 10.0 / 11.0).abs() < 1e-12);
        assert!(scaling(&json!({"2gpu": {"median_ms": 1.0}})).is_empty());
    }
}
