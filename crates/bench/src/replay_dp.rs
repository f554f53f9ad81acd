//! `tfwgpu-bench replay TRACE --data-parallel 1,2`: data-parallel training measured at the
//! runtime level (issue 8), from a trace of the one-device training program.
//!
//! Each of N devices replays the one-device part of the trace (the steps labelled `1gpu` by
//! bench/mirrored.py, or a whole one-device trace) on its own host thread, with data of its own,
//! and the weight gradients are all-reduced between the devices the way a data-parallel
//! framework does it (PyTorch's DDP: buckets all-reduced while the backward pass goes on):
//!
//! - The gradients are found in the trace: the float32 outputs of the gradient tape's kernels
//!   (node names containing `gradient_tape`) that a kernel outside the tape reads (the
//!   optimizer); their shapes are the variables'. They are grouped in production order into
//!   buckets, a bucket closing where the first of its gradients is consumed (or at
//!   `--bucket-kb`).
//! - Right after a bucket's last gradient is recorded, the device's thread starts reading the
//!   bytes it must send back to the host (`Device::read_async`: ordered after the work
//!   recorded so far, not waited for) and goes on recording; a communication thread per device
//!   finishes the reads, hands the bytes to the other devices' communication threads, uploads
//!   what it receives into staging tensors and records the sum on its device.
//! - `--allreduce exchange` (default): every device sends its whole bucket to the others and
//!   sums all of them itself (for two devices: one host round trip, each device reads back and
//!   uploads every gradient byte once). `--allreduce halves` (two devices): reduce-scatter then
//!   all-gather: each device owns half of each gradient, sums the other's copy of that half
//!   into its own, reads the sum back and sends it, and uploads the sum of the other half it
//!   receives (two round trips, the same bytes). `--allreduce none`: no all-reduce at all, the
//!   devices train apart (what the devices and the host give without communication).
//! - Every event outside the tape that touches a gradient after it is produced (up to the next
//!   write of its memory: its free, say) is recorded only once that gradient's bucket's sum is
//!   recorded on its device, as it must be; the first of them records it. (Until session 16
//!   only the bucket's first consumer waited: a reader of the bucket's other gradient, or that
//!   gradient's free, could go ahead of it while it was held back, and the sum then landed in
//!   whatever the replay put at the freed address next: the rare wrong sums of `--check`.)
//!   By default the device's thread holds such a kernel back, with every later event that
//!   touches memory a held-back event touches, and goes on with the rest (the rest of the
//!   backward pass, the other buckets), as TensorFlow's executor runs every op whose inputs are
//!   ready; marks and host syncs replay everything held back first. `--no-defer`: the thread
//!   blocks at the first such kernel instead (the trace's order kept, the backward pass's
//!   recording stalled behind the all-reduce).
//! - `--allreduce peer` (devices opened with `TFWGPU_PEER=1`; Vulkan): no host copy and, where
//!   the driver shares timeline semaphores between the devices, no host wait. Every device
//!   imports the same host memory (`VK_EXT_external_memory_host`, runtime peer.rs); per ordered
//!   pair of devices one timeline semaphore of the source is imported into the destination once
//!   (`OPAQUE_FD`, `Device::peer_link`). Right after a bucket's last gradient is recorded, the
//!   device's thread records copies of the bucket into its own region there and submits, the
//!   submit signalling the next value of each outgoing link (the "ticket", a number, goes to
//!   the peer's thread). A device's thread sums a bucket where its first consumer is replayed
//!   (held back until the peers' tickets arrived): its next submit waits (on the GPU) for the
//!   tickets' values, then it records copies of the peers' regions into staging tensors and the
//!   Adds. No communication thread, and the host never waits for a GPU in the all-reduce. Where a
//!   device has no such semaphores (lavapipe: no `VK_KHR_external_semaphore_fd`), or with
//!   `TFWGPU_PEER_ORDER=host`, the ticket is the source's batch id: the bucket's consumers are
//!   held back until that batch completed and the sum is recorded then (counted: `host_waits`;
//!   `TFWGPU_PEER_ORDER=block` blocks the thread on it instead). Where a device has no host
//!   memory import, the run falls back to `exchange` and says so. `--allreduce peer-host`:
//!   `peer` ordered on the host even where the semaphores exist (the A/B in one process; the
//!   wrong sums it gave now and then, sessions 12-15, were the waiting rule above).
//!   (`peer-async`, the bucket's batch handed to the submit thread, hung there and was removed.)
//! - A bucket is issued once every one of its producers has been replayed on the device (the
//!   deferral below may replay them out of trace order).
//! - Several modes (`--allreduce exchange,peer,none`) alternate pass by pass in one process,
//!   after one one-device pass per round that they share.
//! - Marks (step boundaries) are met by every device's thread: each drains its device, and the
//!   step's time is taken when the last one has, as `replay --per-device` does. With
//!   `--free-run` only the first labelled mark and the last one are met: the threads run the
//!   steps between them freely (the trace's own host syncs still replayed), as a training loop
//!   does, and the steps are timed as a whole.
//!
//! Passes with each device count in the list alternate in one process; the step times give
//! images/s with 1 and N devices at the traced per-device batch. `--check` reads every
//! gradient back before and after its all-reduce (blocking reads: a pass for correctness, not
//! timing) and checks that every device got the same sum of the devices' gradients.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use rand::{SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use tfwgpu_runtime::peer::{HostShared, Imported, PeerLink, Ticket};
use tfwgpu_runtime::{
    AttrValue, Attrs, DType, Device, DeviceRef, Kernel, Operand, ReadInFlight, Runtime, TensorDesc,
};

use crate::replay::{
    Event, Input, Memory, Pass, Timed, Trace, apply_event, median, random_bytes, report_steps, sub,
    write_json,
};
use crate::replay_multi::{self, OTHER_FAILED};

/// How the gradients are all-reduced between the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduce {
    /// Every device sends every gradient to every other and sums them itself.
    Exchange,
    /// Two devices: each sums its half of each gradient and sends the sum back.
    Halves,
    /// No all-reduce: the devices train apart (the ceiling the all-reduce is measured from).
    None,
    /// Like `Exchange`, through host memory every device imports, ordered by timeline
    /// semaphores between the queues (no host copy, no host wait; see the module's notes).
    Peer,
    /// `Peer` ordered on the host even where the devices share timeline semaphores (the A/B of
    /// the GPU-side ordering in one process; `TFWGPU_PEER_ORDER=host` makes `Peer` this too).
    PeerHost,
}

impl AllReduce {
    pub fn parse(s: &str) -> Result<AllReduce, String> {
        match s {
            "exchange" => Ok(AllReduce::Exchange),
            "halves" => Ok(AllReduce::Halves),
            "none" => Ok(AllReduce::None),
            "peer" => Ok(AllReduce::Peer),
            "peer-host" => Ok(AllReduce::PeerHost),
            _ => Err(format!(
                "--allreduce {s:?}: exchange, halves, peer, peer-host or none"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            AllReduce::Exchange => "exchange",
            AllReduce::Halves => "halves",
            AllReduce::None => "none",
            AllReduce::Peer => "peer",
            AllReduce::PeerHost => "peer-host",
        }
    }

    /// Through host memory every device imports.
    fn is_peer(self) -> bool {
        matches!(self, AllReduce::Peer | AllReduce::PeerHost)
    }
}

/// A weight gradient of the traced program, one per step it was computed in.
#[derive(Clone, Debug)]
pub struct Grad {
    /// The kernel event that wrote it.
    pub producer: usize,
    /// Its traced address and size.
    pub addr: u64,
    pub bytes: u64,
    pub shape: Vec<usize>,
    /// The first event outside the gradient tape that touches it after its producer (it and
    /// the later ones up to its memory's next write wait for its sum: `DpPlan::wait_before`).
    pub consumer: usize,
}

/// `DpPass::peer_bytes`: per device, per gradient, (its region of the shared memory, its
/// staging tensor).
pub type PeerBytes = Vec<Vec<(Vec<u8>, Vec<u8>)>>;

/// Gradients all-reduced together: their reads start after `issue_after`; the events that
/// wait for their sum are `DpPlan::wait_before`'s.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub grads: Vec<usize>,
    pub issue_after: usize,
    /// Its position among the buckets of its step (0 = the first all-reduced).
    pub pos: usize,
}

/// What every device replays, and where the all-reduce starts and is waited for.
#[derive(Debug)]
pub struct DpPlan {
    /// The events every device replays, in trace order (marks included).
    pub events: Vec<usize>,
    pub grads: Vec<Grad>,
    pub buckets: Vec<Bucket>,
    /// Per producer event: the buckets with a gradient it writes (a bucket is issued once
    /// every one of its producers has been replayed, in whatever order the deferral replays
    /// them: `issue_after` is only the last in trace order).
    produced_by: HashMap<usize, Vec<usize>>,
    /// Per bucket: how many distinct events produce its gradients.
    producers: Vec<usize>,
    /// Per event: the buckets whose sum it waits for (it touches one of their gradients).
    wait_before: HashMap<usize, Vec<usize>>,
    /// Per trace event: the traced address ranges it reads and writes (an allocation and a
    /// free write theirs).
    touch: Vec<Ranges>,
    /// Per trace event: a mark or host sync (everything held back is replayed before it).
    barrier: Vec<bool>,
}

/// Address ranges `[start, end)` an event reads, and those it writes.
type Ranges = (Vec<(u64, u64)>, Vec<(u64, u64)>);

fn is_tape(node: &str) -> bool {
    node.contains("gradient_tape")
}

impl DpPlan {
    /// The one-device part of `trace`: every event up to the first mark after the `label`
    /// marks that has another label (the whole trace if none), all on one device.
    /// `bucket_bytes` > 0 also closes a bucket once it holds that many bytes.
    pub fn new(trace: &Trace, label: &str, bucket_bytes: u64) -> Result<DpPlan, String> {
        let mut end = trace.events.len();
        let mut seen = false;
        for (i, ev) in trace.events.iter().enumerate() {
            if let Event::Mark(l) = ev {
                if l == label {
                    seen = true;
                } else if seen {
                    end = i + 1;
                    break;
                }
            }
        }
        let events: Vec<usize> = (0..end).collect();
        let devs: Vec<i64> = {
            let mut d: Vec<i64> = events
                .iter()
                .map(|&i| trace.dev_of[i])
                .filter(|&d| d >= 0)
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        };
        if devs.len() > 1 {
            return Err(format!(
                "--data-parallel replays a one-device program: events 0..{end} used devices {devs:?}"
            ));
        }
        // Gradients: tape outputs read by a kernel outside the tape.
        let mut last_writer: HashMap<u64, (usize, bool)> = HashMap::new();
        let mut found: HashMap<(usize, u64), usize> = HashMap::new();
        let mut grads: Vec<Grad> = vec![];
        for &i in &events {
            match &trace.events[i] {
                Event::Kernel(k) => {
                    let tape = is_tape(&k.node);
                    for inp in &k.inputs {
                        if let Input::Device(d, a) = inp
                            && !tape
                            && d.dtype == DType::F32
                            && d.num_elements() > 0
                            && let Some(&(w, true)) = last_writer.get(a)
                            && !found.contains_key(&(w, *a))
                        {
                            found.insert((w, *a), grads.len());
                            grads.push(Grad {
                                producer: w,
                                addr: *a,
                                bytes: d.byte_size(),
                                shape: d.shape.clone(),
                                consumer: i,
                            });
                        }
                    }
                    for (_, a) in &k.outputs {
                        last_writer.insert(*a, (i, tape));
                    }
                }
                Event::H2d { dst: a, .. } | Event::Fill { addr: a, .. } => {
                    last_writer.insert(*a, (i, false));
                }
                Event::D2d { dst, .. } => {
                    last_writer.insert(*dst, (i, false));
                }
                _ => {}
            }
        }
        let mut sizes: HashMap<u64, u64> = HashMap::new();
        let mut touch: Vec<Ranges> = vec![];
        let mut barrier = vec![];
        for ev in &trace.events {
            let (mut r, mut w) = (vec![], vec![]);
            let mut b = false;
            match ev {
                // An allocation or a free writes its range: a traced address freed and
                // allocated again must not be remapped under a held-back event.
                Event::Alloc { addr, size } => {
                    sizes.insert(*addr, *size);
                    w.push((*addr, addr + size));
                }
                Event::Free { addr } => {
                    if let Some(size) = sizes.get(addr) {
                        w.push((*addr, addr + size));
                    }
                }
                Event::H2d { dst, size, .. } => w.push((*dst, dst + size)),
                Event::Fill { addr, size, .. } => w.push((*addr, addr + size)),
                Event::D2d { src, dst, size, .. } => {
                    r.push((*src, src + size));
                    w.push((*dst, dst + size));
                }
                Event::Kernel(k) => {
                    for inp in &k.inputs {
                        if let Input::Device(d, a) = inp {
                            r.push((*a, a + d.byte_size()));
                        }
                    }
                    for (d, a) in &k.outputs {
                        w.push((*a, a + d.byte_size()));
                    }
                }
                // A host read of a gradient must see its sum too (it is a barrier as well).
                Event::D2h { src, size } => {
                    r.push((*src, src + size));
                    b = true;
                }
                Event::Sync | Event::HostKernel | Event::Mark(_) => b = true,
            }
            touch.push((r, w));
            barrier.push(b);
        }
        // Per gradient: every event outside the tape that touches it after its producer, up to
        // and including the next write of its memory (its free, say); each waits for the
        // gradient's bucket's sum (module doc). The first of them is the gradient's consumer
        // for the buckets below.
        grads.sort_by_key(|g| (g.producer, g.addr));
        let mut waiters: Vec<Vec<usize>> = vec![];
        for g in &mut grads {
            // The bytes of the gradient not yet written over since its producer.
            let mut left = vec![(g.addr, g.addr + g.bytes)];
            let mut v = vec![];
            for (i, (r, w)) in touch.iter().enumerate().take(end).skip(g.producer + 1) {
                let hit = |x: &(u64, u64)| left.iter().any(|&l| overlaps(*x, l));
                let writes = w.iter().any(hit);
                if !writes && !r.iter().any(hit) {
                    continue;
                }
                // The tape's own reads see the device's gradient; its next write (the next
                // step's gradient) ends this one, as any write or free does; a write of part
                // of it ends that part only.
                if !matches!(&trace.events[i], Event::Kernel(k) if is_tape(&k.node)) {
                    v.push(i);
                }
                for &x in w {
                    left = subtract(&left, x);
                }
                if left.is_empty() {
                    break;
                }
            }
            if let Some(&first) = v.first() {
                g.consumer = g.consumer.min(first);
            }
            waiters.push(v);
        }

        // Buckets in production order; one closes before a gradient produced after one of its
        // gradients was consumed (or a mark), or once it holds `bucket_bytes`.
        let mark_between = |a: usize, b: usize| {
            trace.events[a.min(b)..a.max(b)]
                .iter()
                .any(|e| matches!(e, Event::Mark(_)))
        };
        let mut buckets: Vec<Bucket> = vec![];
        let mut open: Vec<usize> = vec![];
        let mut pos = 0;
        let close = |open: &mut Vec<usize>, buckets: &mut Vec<Bucket>, pos: usize| {
            if open.is_empty() {
                return;
            }
            let g = std::mem::take(open);
            buckets.push(Bucket {
                issue_after: g.iter().map(|&j| grads[j].producer).max().unwrap_or(0),
                grads: g,
                pos,
            });
        };
        for (j, g) in grads.iter().enumerate() {
            if let Some(&first) = open.first() {
                let consumed = open.iter().map(|&k| grads[k].consumer).min().unwrap_or(0);
                let bytes: u64 = open.iter().map(|&k| grads[k].bytes).sum();
                let new_step = mark_between(grads[first].producer, g.producer);
                if consumed < g.producer || new_step || (bucket_bytes > 0 && bytes >= bucket_bytes)
                {
                    close(&mut open, &mut buckets, pos);
                    pos = if new_step { 0 } else { pos + 1 };
                }
            }
            open.push(j);
        }
        close(&mut open, &mut buckets, pos);
        let mut produced_by: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut producers = vec![];
        for (b, k) in buckets.iter().enumerate() {
            let mut ps: Vec<usize> = k.grads.iter().map(|&j| grads[j].producer).collect();
            ps.sort_unstable();
            ps.dedup();
            for &p in &ps {
                produced_by.entry(p).or_default().push(b);
            }
            producers.push(ps.len());
        }
        // A bucket closes before a gradient produced after one of its gradients is first
        // touched, so every waiter comes after the bucket's last producer.
        let mut wait_before: HashMap<usize, Vec<usize>> = HashMap::new();
        for (b, k) in buckets.iter().enumerate() {
            for &j in &k.grads {
                for &i in &waiters[j] {
                    debug_assert!(
                        i > k.issue_after,
                        "event {i} waits for bucket {b} too early"
                    );
                    let v = wait_before.entry(i).or_default();
                    if !v.contains(&b) {
                        v.push(b);
                    }
                }
            }
        }
        Ok(DpPlan {
            events,
            grads,
            buckets,
            produced_by,
            producers,
            wait_before,
            touch,
            barrier,
        })
    }

    /// The gradients and buckets of the last whole step (between the last two marks, or of
    /// the whole plan without marks): (gradients, float32 elements, bytes, buckets).
    pub fn per_step(&self, trace: &Trace) -> (usize, u64, u64, usize) {
        let marks: Vec<usize> = self
            .events
            .iter()
            .copied()
            .filter(|&i| matches!(trace.events[i], Event::Mark(_)))
            .collect();
        let (lo, hi) = match marks.len() {
            0 | 1 => (0, usize::MAX),
            m => (marks[m - 2], marks[m - 1]),
        };
        let inside: Vec<&Bucket> = self
            .buckets
            .iter()
            .filter(|b| b.issue_after > lo && b.issue_after < hi)
            .collect();
        let n = inside.iter().map(|b| b.grads.len()).sum();
        let bytes: u64 = inside
            .iter()
            .flat_map(|b| &b.grads)
            .map(|&j| self.grads[j].bytes)
            .sum();
        (n, bytes / 4, bytes, inside.len())
    }
}

/// The part of gradient `j` (`bytes` long) that device `s` of two owns under `halves`:
/// (byte offset, byte length). Halves split at a multiple of 64 elements; a gradient of fewer
/// than 128 elements is owned whole by device `j % 2`.
fn owned(j: usize, bytes: u64, s: usize) -> (u64, u64) {
    let n = bytes / 4;
    let h = n / 2 / 64 * 64;
    if h == 0 {
        return if j % 2 == s { (0, bytes) } else { (0, 0) };
    }
    if s == 0 {
        (0, h * 4)
    } else {
        (h * 4, bytes - h * 4)
    }
}

/// A bucket handed by a device's thread to its communication thread.
struct Job {
    bucket: usize,
    /// Per gradient of the bucket: its address on this device, and the read of the part sent.
    addrs: Vec<u64>,
    reads: Vec<ReadInFlight>,
    issued_us: f64,
}

/// Bytes between two communication threads.
struct Msg {
    from: usize,
    bucket: usize,
    /// 0: a device's own gradients (or, under `halves`, its copy of the receiver's half);
    /// 1: under `halves`, the sum of the receiver's other half.
    phase: u8,
    parts: Vec<Vec<u8>>,
}

/// When one bucket's all-reduce went where on one device (microseconds since the pass began).
#[derive(Clone, Debug, Default)]
pub struct BucketTimes {
    pub bucket: usize,
    pub issued_us: f64,
    pub read_us: f64,
    pub received_us: f64,
    pub done_us: f64,
}

/// What `Shared` holds for the data-parallel replay.
struct Dp {
    /// Per device, per bucket: its sum is recorded there.
    done: Vec<Vec<bool>>,
    /// Per device: its communication thread is still running.
    comm_running: Vec<bool>,
    /// `peer`: per device, per bucket: (source device, ticket) of the peers' copies.
    tickets: Vec<Vec<Vec<(usize, Ticket)>>>,
}

type Shared = replay_multi::Shared<Dp>;

impl Shared {
    fn set_done(&self, s: usize, b: usize) {
        self.update(|dp| dp.done[s][b] = true);
    }

    fn wait_done(&self, s: usize, b: usize) -> Result<(), String> {
        self.wait_for(|dp| dp.done[s][b].then_some(()))
    }

    fn comm_finished(&self, s: usize) {
        self.update(|dp| dp.comm_running[s] = false);
    }

    /// Waits until device `s`'s communication thread has stopped (it records on the device and
    /// writes into its memory until then).
    fn wait_comm(&self, s: usize) {
        self.wait_while(|dp| dp.comm_running[s]);
    }
}

/// Per gradient: its bytes on one device before and after the all-reduce (`--check`).
pub type Checked = HashMap<usize, (Vec<u8>, Vec<u8>)>;

/// One data-parallel pass over the plan's events on `n` devices.
#[derive(Debug, Default)]
pub struct DpPass {
    pub n: usize,
    pub wall_s: f64,
    pub marks: Vec<(String, f64)>,
    pub devices: Vec<Pass>,
    /// Per device: seconds its thread waited for all-reduced buckets.
    pub waits_s: Vec<f64>,
    /// Per device, per mark: seconds waited since the previous mark (or the pass's start).
    pub mark_waits_s: Vec<Vec<f64>>,
    /// Per device: each bucket's times.
    pub comm: Vec<Vec<BucketTimes>>,
    /// With `check`: per device, per gradient, (bytes before, bytes after the all-reduce).
    pub checked: Vec<Checked>,
    /// `peer` with `check`: per device, per gradient, after the pass: (its region of the shared
    /// host memory, what it pushed; its staging tensor, what it last copied in from a peer's
    /// region), to tell a wrong push, a wrong copy in and a wrong Add apart when a sum is wrong.
    pub peer_bytes: PeerBytes,
    /// Per device: the most events held back at once behind an all-reduce.
    pub deferred_max: Vec<usize>,
    /// `peer`: per device, the host waits for a peer's batch (the fallback without sync
    /// files; 0 with them).
    pub host_waits: Vec<usize>,
    /// Per device, per mark (every one, met or passed by): [seconds since the pass's start when
    /// its thread got there, when it left (drained and met the others, or passed by), seconds
    /// it had spent blocked in the trace's host syncs and reads, seconds blocked on the
    /// all-reduce]: where a step's time went on each thread.
    pub mark_log: Vec<Vec<[f64; 4]>>,
}

impl Timed for DpPass {
    fn wall_s(&self) -> f64 {
        self.wall_s
    }
    fn marks(&self) -> &[(String, f64)] {
        &self.marks
    }
}

struct DeviceRun {
    mark_log: Vec<[f64; 4]>,
    deferred_max: usize,
    host_waits: usize,
    peer_times: Vec<BucketTimes>,
    pass: Pass,
    wait_s: f64,
    mark_waits: Vec<f64>,
    checked: Checked,
}

/// What a device's thread needs besides its device.
struct Ctx<'a> {
    trace: &'a Trace,
    plan: &'a DpPlan,
    shared: &'a Shared,
    mode: AllReduce,
    n: usize,
    t0: Instant,
    check: bool,
    defer: bool,
    /// Every device of the pass (`peer`'s host-ordered fallback waits on a peer's batch).
    devs: &'a [&'a Device],
    /// `peer` on several devices: the shared memory and semaphores.
    peer: Option<&'a PeerRes>,
    /// `peer`, host-ordered: a bucket's consumers are ready once the peers' tickets are here
    /// (the summing thread then waits for their batches) instead of once those batches
    /// completed (`TFWGPU_PEER_ORDER=block`).
    peer_block: bool,
    /// `peer`: per device, per gradient: its staging tensor.
    staging: &'a [Vec<u64>],
    /// `--free-run`: the two marks that drain and meet (`DpOptions::free_run`).
    free_run: Option<(usize, usize)>,
}

/// What `--allreduce peer` uses during a pass: host memory imported into every device, each
/// device's region of it per gradient, and the semaphores.
struct PeerRes {
    /// Per device: the shared host memory, imported there.
    imports: Vec<Imported>,
    /// Per device, per gradient: the byte offset of that device's copy in the host memory.
    off: Vec<Vec<u64>>,
    /// Per source device, per destination: the timeline semaphore that orders the
    /// destination after the source's copies (`None` on the diagonal and where a device has no
    /// `OPAQUE_FD` timeline semaphores: host-ordered).
    links: Vec<Vec<Option<PeerLink>>>,
}

/// One device's replay state: its memory map, counters, and the events deferred behind an
/// all-reduce.
struct DevState<'a> {
    s: usize,
    dev: &'a Device,
    cx: &'a Ctx<'a>,
    cache: &'a mut HashMap<String, Box<dyn Kernel>>,
    payloads: HashMap<usize, Vec<u8>>,
    jobs: Option<Sender<Job>>,
    mem: Memory<'a>,
    pass: Pass,
    wait_s: f64,
    since_mark: f64,
    mark_waits: Vec<f64>,
    mark_log: Vec<[f64; 4]>,
    checked: Checked,
    /// Events held back, in trace order: each waits for a bucket's sum, or touches memory
    /// an earlier held-back event touches.
    deferred: Vec<usize>,
    deferred_max: usize,
    /// `peer`: the Add kernel, the buckets summed here, host waits, per-bucket times.
    add: Option<Box<dyn Kernel>>,
    summed: Vec<bool>,
    host_waits: usize,
    peer_times: HashMap<usize, BucketTimes>,
    /// Per trace event: replayed on this device in this pass.
    replayed: Vec<bool>,
    /// Per bucket: its producer events not replayed yet here.
    left: Vec<usize>,
}

impl DevState<'_> {
    /// Every gradient of bucket `b` has been produced here (its producer replayed): what the
    /// bucket's copies and reads must come after.
    fn produced(&self, b: usize) -> Result<(), String> {
        let plan = self.cx.plan;
        for &j in &plan.buckets[b].grads {
            let p = plan.grads[j].producer;
            if !self.replayed[p] {
                return Err(format!(
                    "device {}: bucket {b} issued before event {p}, the producer of its gradient \
                     {j}, was replayed (held back)",
                    self.s
                ));
            }
        }
        Ok(())
    }

    fn err(e: tfwgpu_runtime::Error) -> String {
        e.to_string()
    }

    /// Whether this device all-reduces (a communication thread, or `peer`).
    fn reduces(&self) -> bool {
        self.jobs.is_some() || self.cx.peer.is_some()
    }

    /// Whether every bucket event `i` waits for has its sum recorded here (`peer`: or can be
    /// recorded now: every peer's ticket is here).
    fn ready(&self, i: usize) -> bool {
        let Some(bs) = self.cx.plan.wait_before.get(&i) else {
            return true;
        };
        if !self.reduces() {
            return true;
        }
        let st = self.cx.shared.lock();
        if self.cx.peer.is_some() {
            return bs
                .iter()
                .all(|&b| self.summed[b] || self.tickets_ready(&st.own.tickets[self.s][b]));
        }
        bs.iter().all(|&b| st.own.done[self.s][b])
    }

    /// `peer`: whether every peer's ticket for a bucket is here and, for a batch ticket (the
    /// host-ordered fallback), that batch has completed (unless `TFWGPU_PEER_ORDER=block`: the
    /// summing thread then blocks on it): the thread goes on recording meanwhile.
    fn tickets_ready(&self, tickets: &[(usize, Ticket)]) -> bool {
        tickets.len() == self.cx.n - 1
            && (self.cx.peer_block
                || tickets.iter().all(|(from, t)| match *t {
                    Ticket::Batch(id) => {
                        let x = self.cx.devs[*from].exec();
                        x.completed() >= id || {
                            x.poll_completions();
                            x.completed() >= id
                        }
                    }
                    Ticket::Value(_) => true,
                }))
    }

    /// Blocks until the buckets event `i` waits for are summed here (`peer`: until their
    /// tickets are here).
    fn wait(&mut self, i: usize) -> Result<(), String> {
        if let (Some(bs), true) = (self.cx.plan.wait_before.get(&i), self.reduces()) {
            let t = Instant::now();
            for &b in bs {
                if self.cx.peer.is_some() {
                    let (s, n, summed) = (self.s, self.cx.n, self.summed[b]);
                    let batches = self.cx.shared.wait_for(|dp| {
                        (summed || dp.tickets[s][b].len() == n - 1).then(|| {
                            dp.tickets[s][b]
                                .iter()
                                .filter_map(|(from, t)| match *t {
                                    Ticket::Batch(id) => Some((*from, id)),
                                    Ticket::Value(_) => None,
                                })
                                .collect::<Vec<_>>()
                        })
                    })?;
                    // The host-ordered fallback: the peers' batches too (else `pull` waits).
                    if !self.cx.peer_block {
                        for (from, id) in batches {
                            self.cx.devs[from].exec().wait(id).map_err(Self::err)?;
                        }
                    }
                } else {
                    self.cx.shared.wait_done(self.s, b)?;
                }
            }
            let w = t.elapsed().as_secs_f64();
            self.wait_s += w;
            self.since_mark += w;
        }
        Ok(())
    }

    /// Replays event `i` (its buckets are summed), then starts the all-reduce of the buckets
    /// whose last gradient it produced.
    fn exec(&mut self, i: usize) -> Result<(), String> {
        let (plan, cx) = (self.cx.plan, self.cx);
        let e = Self::err;
        if let (Some(bs), Some(_)) = (plan.wait_before.get(&i), cx.peer) {
            for &b in bs {
                if !self.summed[b] {
                    self.pull(b)?;
                }
            }
        }
        if let (Some(bs), true, true) = (plan.wait_before.get(&i), cx.check, self.reduces()) {
            // At the first event that waits for the bucket (later ones may see the gradient
            // changed or its memory reused).
            for &b in bs {
                for &j in &plan.buckets[b].grads {
                    if self.checked.get(&j).is_some_and(|c| !c.1.is_empty()) {
                        continue;
                    }
                    let g = &plan.grads[j];
                    let a = self.mem.map(g.addr, g.bytes, &|| format!("gradient {j}"))?;
                    let after = self.dev.read(a, g.bytes as usize).map_err(e)?;
                    self.checked.entry(j).or_default().1 = after;
                }
            }
        }
        match &cx.trace.events[i] {
            Event::Mark(label) => {
                let arrived = cx.t0.elapsed().as_secs_f64();
                // `--free-run`: the marks between the first and the last pass by.
                if cx.free_run.is_none_or(|(a, z)| i == a || i == z) {
                    self.mark_waits.push(std::mem::take(&mut self.since_mark));
                    self.dev.synchronize().map_err(e)?;
                    cx.shared.mark(label, cx.t0)?;
                }
                self.mark_log.push([
                    arrived,
                    cx.t0.elapsed().as_secs_f64(),
                    self.pass.waits_s,
                    self.wait_s,
                ]);
            }
            ev => {
                let mut data = self.payloads.remove(&i).into_iter();
                apply_event(
                    self.dev,
                    i,
                    ev,
                    self.cache,
                    &mut self.mem,
                    &mut data,
                    &mut self.pass,
                )?;
            }
        }
        self.replayed[i] = true;
        // The buckets whose last producer this was (in replay order, which the deferral may
        // change from the trace's).
        let mut ready = vec![];
        for &b in plan.produced_by.get(&i).into_iter().flatten() {
            self.left[b] -= 1;
            if self.left[b] == 0 {
                ready.push(b);
            }
        }
        if cx.peer.is_some() {
            for &b in &ready {
                self.produced(b)?;
                self.push(b)?;
            }
        }
        if let Some(tx) = &self.jobs {
            for &b in &ready {
                self.produced(b)?;
                let mut addrs = vec![];
                let mut reads = vec![];
                for &j in &plan.buckets[b].grads {
                    let g = &plan.grads[j];
                    let a = self.mem.map(g.addr, g.bytes, &|| format!("gradient {j}"))?;
                    if cx.check {
                        let bytes = self.dev.read(a, g.bytes as usize).map_err(e)?;
                        self.checked.entry(j).or_default().0 = bytes;
                    }
                    // The part this device sends: all of it, or the other device's half.
                    let (off, len) = match cx.mode {
                        AllReduce::Halves => owned(j, g.bytes, 1 - self.s),
                        _ => (0, g.bytes),
                    };
                    reads.push(self.dev.read_async(a + off, len as usize).map_err(e)?);
                    addrs.push(a);
                }
                tx.send(Job {
                    bucket: b,
                    addrs,
                    reads,
                    issued_us: cx.t0.elapsed().as_secs_f64() * 1e6,
                })
                .map_err(|_| "a communication thread stopped".to_string())?;
            }
        }
        Ok(())
    }

    /// `peer`: copies bucket `b` (just produced) into this device's region of the shared
    /// memory, submits, and hands the ticket to every peer.
    fn push(&mut self, b: usize) -> Result<(), String> {
        let (plan, cx) = (self.cx.plan, self.cx);
        let pr = cx.peer.expect("peer");
        let e = Self::err;
        let issued_us = cx.t0.elapsed().as_secs_f64() * 1e6;
        for &j in &plan.buckets[b].grads {
            let g = &plan.grads[j];
            let a = self.mem.map(g.addr, g.bytes, &|| format!("gradient {j}"))?;
            if cx.check {
                let bytes = self.dev.read(a, g.bytes as usize).map_err(e)?;
                self.checked.entry(j).or_default().0 = bytes;
            }
            self.dev
                .copy_to_buffer(a, &pr.imports[self.s].buffer, pr.off[self.s][j], g.bytes)
                .map_err(e)?;
        }
        let peers: Vec<usize> = (0..cx.n).filter(|&p| p != self.s).collect();
        let links: Vec<&PeerLink> = peers
            .iter()
            .filter_map(|&p| pr.links[self.s][p].as_ref())
            .collect();
        let tickets = self.dev.flush_signal(&links).map_err(e)?;
        // One ticket per peer (a timeline value per link), or the batch id for all of them.
        let out: Vec<(usize, Ticket)> = peers
            .iter()
            .enumerate()
            .map(|(k, &p)| (p, tickets[if links.is_empty() { 0 } else { k }]))
            .collect();
        let s = self.s;
        cx.shared.update(|dp| {
            for (p, t) in out {
                dp.tickets[p][b].push((s, t));
            }
        });
        self.peer_times.insert(
            b,
            BucketTimes {
                bucket: b,
                issued_us,
                read_us: cx.t0.elapsed().as_secs_f64() * 1e6,
                ..BucketTimes::default()
            },
        );
        Ok(())
    }

    /// `peer`: sums bucket `b` here from the peers' regions once their tickets are here:
    /// orders this device's next submit after theirs, then records the copies and Adds.
    fn pull(&mut self, b: usize) -> Result<(), String> {
        let (plan, cx) = (self.cx.plan, self.cx);
        let pr = cx.peer.expect("peer");
        let e = Self::err;
        let (s, n) = (self.s, cx.n);
        let tickets = cx.shared.wait_for(|dp| {
            (dp.tickets[s][b].len() == n - 1).then(|| std::mem::take(&mut dp.tickets[s][b]))
        })?;
        let received_us = cx.t0.elapsed().as_secs_f64() * 1e6;
        if self.add.is_none() {
            let add = self
                .dev
                .kernel(
                    "AddV2",
                    &Attrs::new().with("T", AttrValue::Type(DType::F32)),
                )
                .map_err(e)?;
            self.add = Some(add);
        }
        // The wait holds back the whole submit it attaches to: with `TFWGPU_PEER_WAIT=flush`,
        // the work recorded before it goes to the queue first (one more submit per bucket).
        if peer_wait_flush() && matches!(tickets.first(), Some((_, Ticket::Value(_)))) {
            self.dev.exec().flush().map_err(e)?;
        }
        for (from, t) in tickets {
            let link = pr.links[from][s].as_ref();
            if self.dev.wait_ticket(cx.devs[from], link, t).map_err(e)? {
                self.host_waits += 1;
            }
            for &j in &plan.buckets[b].grads {
                let g = &plan.grads[j];
                let a = self.mem.map(g.addr, g.bytes, &|| format!("gradient {j}"))?;
                self.dev
                    .copy_from_buffer(
                        &pr.imports[s].buffer,
                        pr.off[from][j],
                        cx.staging[s][j],
                        g.bytes,
                    )
                    .map_err(e)?;
                let add = self.add.as_deref().expect("made above");
                add_into(self.dev, add, a, cx.staging[s][j], g.bytes)?;
            }
        }
        self.summed[b] = true;
        cx.shared.set_done(s, b);
        let t = self.peer_times.entry(b).or_default();
        t.bucket = b;
        t.received_us = received_us;
        t.done_us = cx.t0.elapsed().as_secs_f64() * 1e6;
        Ok(())
    }

    /// Whether event `i` touches memory that one of the first `k` deferred events touches
    /// (one writes what the other reads or writes).
    fn conflicts(&self, i: usize, k: usize) -> bool {
        conflicts(&self.cx.plan.touch, i, &self.deferred[..k])
    }

    /// Replays the deferred events that may go now, in order.
    fn flush(&mut self) -> Result<(), String> {
        let mut k = 0;
        while k < self.deferred.len() {
            let i = self.deferred[k];
            if self.ready(i) && !self.conflicts(i, k) {
                self.deferred.remove(k);
                self.exec(i)?;
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    /// Replays every deferred event, waiting for their buckets.
    fn drain(&mut self) -> Result<(), String> {
        while let Some(&first) = self.deferred.first() {
            self.wait(first)?;
            self.flush()?;
        }
        Ok(())
    }

    /// Event `i` in trace order: replayed now, or, with deferral, held back while it waits
    /// for a bucket or touches what a held-back event touches. Host syncs and marks replay
    /// everything held back first.
    fn step(&mut self, i: usize) -> Result<(), String> {
        if !self.cx.defer || !self.reduces() {
            self.wait(i)?;
            return self.exec(i);
        }
        self.flush()?;
        if self.cx.plan.barrier[i] {
            self.drain()?;
            // A host read of a gradient waits for its sum too.
            self.wait(i)?;
            return self.exec(i);
        }
        let n = self.deferred.len();
        if !self.ready(i) || self.conflicts(i, n) {
            self.deferred.push(i);
            self.deferred_max = self.deferred_max.max(self.deferred.len());
            return Ok(());
        }
        self.exec(i)
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// The parts of the ranges `left` outside the range `x`.
fn subtract(left: &[(u64, u64)], x: (u64, u64)) -> Vec<(u64, u64)> {
    let mut out = vec![];
    for &(a, b) in left {
        if !overlaps((a, b), x) {
            out.push((a, b));
            continue;
        }
        if a < x.0 {
            out.push((a, x.0));
        }
        if x.1 < b {
            out.push((x.1, b));
        }
    }
    out
}

/// Whether event `i` must stay behind the `held` events: it writes what one of them reads or
/// writes, or reads what one of them writes.
fn conflicts(touch: &[Ranges], i: usize, held: &[usize]) -> bool {
    let (r, w) = (&touch[i].0, &touch[i].1);
    held.iter().any(|&d| {
        let (dr, dw) = (&touch[d].0, &touch[d].1);
        w.iter()
            .any(|&x| dr.iter().chain(dw).any(|&y| overlaps(x, y)))
            || r.iter().any(|&x| dw.iter().any(|&y| overlaps(x, y)))
    })
}

fn device_thread(
    s: usize,
    dev: &Device,
    cx: &Ctx,
    cache: &mut HashMap<String, Box<dyn Kernel>>,
    payloads: HashMap<usize, Vec<u8>>,
    jobs: Option<Sender<Job>>,
) -> Result<DeviceRun, String> {
    let before = dev.exec_stats();
    let mut st = DevState {
        s,
        dev,
        cx,
        cache,
        payloads,
        jobs,
        mem: Memory::new(dev),
        pass: Pass::default(),
        wait_s: 0.0,
        since_mark: 0.0,
        mark_waits: vec![],
        mark_log: vec![],
        checked: Checked::new(),
        deferred: vec![],
        deferred_max: 0,
        add: None,
        summed: vec![false; cx.plan.buckets.len()],
        host_waits: 0,
        peer_times: HashMap::new(),
        replayed: vec![false; cx.trace.events.len()],
        left: cx.plan.producers.clone(),
    };
    let result = (|| -> Result<(), String> {
        for &i in &cx.plan.events {
            st.step(i)?;
        }
        st.drain()?;
        dev.synchronize().map_err(DevState::err)
    })();
    if result.is_err() {
        cx.shared.fail();
    }
    // The communication thread stops once it has no jobs left (or another thread failed);
    // only then may this device's memory go.
    st.jobs = None;
    cx.shared.wait_comm(s);
    st.pass.wall_s = cx.t0.elapsed().as_secs_f64();
    st.pass.stats = sub(dev.exec_stats(), before);
    let freed = st.mem.free_all();
    result?;
    freed?;
    let mut peer_times: Vec<BucketTimes> = st.peer_times.into_values().collect();
    peer_times.sort_by_key(|t| t.bucket);
    Ok(DeviceRun {
        host_waits: st.host_waits,
        peer_times,
        pass: st.pass,
        wait_s: st.wait_s,
        mark_waits: st.mark_waits,
        mark_log: st.mark_log,
        checked: st.checked,
        deferred_max: st.deferred_max,
    })
}

/// Receives the next message for `bucket` in `phase` (from any peer), keeping others.
fn receive(
    inbox: &Receiver<Msg>,
    kept: &mut Vec<Msg>,
    bucket: usize,
    phase: u8,
    shared: &Shared,
) -> Result<Msg, String> {
    if let Some(k) = kept
        .iter()
        .position(|m| m.bucket == bucket && m.phase == phase)
    {
        return Ok(kept.swap_remove(k));
    }
    loop {
        match inbox.recv_timeout(Duration::from_millis(20)) {
            Ok(m) if m.bucket == bucket && m.phase == phase => return Ok(m),
            Ok(m) => kept.push(m),
            Err(RecvTimeoutError::Timeout) => {
                if shared.failed() {
                    return Err(OTHER_FAILED.into());
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err("a peer's communication thread stopped".into());
            }
        }
    }
}

/// Records `dst[..len] += staging[..len]` (float32) on `dev`.
fn add_into(
    dev: &Device,
    add: &dyn Kernel,
    dst: u64,
    staging: u64,
    len: u64,
) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let desc = TensorDesc::new(DType::F32, &[(len / 4) as usize]);
    let d = DeviceRef {
        desc: desc.clone(),
        addr: dst,
    };
    let st = DeviceRef {
        desc,
        addr: staging,
    };
    dev.record(
        add,
        &[Operand::Device(&d), Operand::Device(&st)],
        std::slice::from_ref(&d),
    )
    .map_err(|e| format!("all-reduce Add: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn comm_thread(
    s: usize,
    dev: &Device,
    cx: &Ctx,
    staging: &[u64],
    jobs: Receiver<Job>,
    inbox: Receiver<Msg>,
    peers: Vec<(usize, Sender<Msg>)>,
) -> Result<Vec<BucketTimes>, String> {
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let (plan, shared) = (cx.plan, cx.shared);
    let add = dev
        .kernel(
            "AddV2",
            &Attrs::new().with("T", AttrValue::Type(DType::F32)),
        )
        .map_err(e)?;
    let now = || cx.t0.elapsed().as_secs_f64() * 1e6;
    let mut kept = vec![];
    let mut times = vec![];
    let send = |m: &dyn Fn() -> Msg| -> Result<(), String> {
        for (_, tx) in &peers {
            tx.send(m())
                .map_err(|_| "a peer's communication thread stopped".to_string())?;
        }
        Ok(())
    };
    for job in jobs {
        let b = job.bucket;
        let grads = &plan.buckets[b].grads;
        let mut parts = vec![];
        for r in job.reads {
            parts.push(dev.finish_read(r, |x| x.to_vec()).map_err(e)?);
        }
        let read_us = now();
        send(&|| Msg {
            from: s,
            bucket: b,
            phase: 0,
            parts: parts.clone(),
        })?;
        let mut received_us = 0.0;
        match cx.mode {
            AllReduce::Exchange | AllReduce::None | AllReduce::Peer | AllReduce::PeerHost => {
                for _ in 0..cx.n - 1 {
                    let m = receive(&inbox, &mut kept, b, 0, shared)?;
                    received_us = now();
                    for (k, &j) in grads.iter().enumerate() {
                        dev.write(staging[j], &m.parts[k]).map_err(e)?;
                        add_into(
                            dev,
                            add.as_ref(),
                            job.addrs[k],
                            staging[j],
                            plan.grads[j].bytes,
                        )?;
                    }
                }
            }
            AllReduce::Halves => {
                let m = receive(&inbox, &mut kept, b, 0, shared)?;
                received_us = now();
                let mut sums = vec![];
                for (k, &j) in grads.iter().enumerate() {
                    let (off, len) = owned(j, plan.grads[j].bytes, s);
                    dev.write(staging[j], &m.parts[k]).map_err(e)?;
                    add_into(dev, add.as_ref(), job.addrs[k] + off, staging[j], len)?;
                    sums.push(
                        dev.read_async(job.addrs[k] + off, len as usize)
                            .map_err(e)?,
                    );
                }
                let mut reduced = vec![];
                for r in sums {
                    reduced.push(dev.finish_read(r, |x| x.to_vec()).map_err(e)?);
                }
                send(&|| Msg {
                    from: s,
                    bucket: b,
                    phase: 1,
                    parts: reduced.clone(),
                })?;
                let m = receive(&inbox, &mut kept, b, 1, shared)?;
                debug_assert_ne!(m.from, s);
                for (k, &j) in grads.iter().enumerate() {
                    let (off, _) = owned(j, plan.grads[j].bytes, m.from);
                    dev.write(job.addrs[k] + off, &m.parts[k]).map_err(e)?;
                }
            }
        }
        shared.set_done(s, b);
        times.push(BucketTimes {
            bucket: b,
            issued_us: job.issued_us,
            read_us,
            received_us,
            done_us: now(),
        });
    }
    Ok(times)
}

/// `TFWGPU_PEER_ORDER=host` (or `block`): `peer` orders each bucket's copies on the host even
/// where the devices share timeline semaphores (to measure the memory and the semaphores apart).
fn peer_host_order() -> bool {
    std::env::var("TFWGPU_PEER_ORDER").is_ok_and(|v| matches!(v.trim(), "host" | "block"))
}

/// `TFWGPU_PEER_WAIT=flush`: `peer` submits a device's open batch before staging its wait for
/// a peer's semaphore (which holds back the whole submit it attaches to).
fn peer_wait_flush() -> bool {
    std::env::var("TFWGPU_PEER_WAIT").is_ok_and(|v| v.trim() == "flush")
}

/// `peer`: host memory every device imports (a region per device and gradient, 256-byte
/// aligned) and, where every device shares timeline semaphores, a link per ordered pair.
fn peer_resources(devs: &[&Device], plan: &DpPlan, host_order: bool) -> Result<PeerRes, String> {
    let n = devs.len();
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    let mut align = 4096;
    let mut timeline = !host_order && !peer_host_order();
    for d in devs {
        let c = d.peer_caps().filter(|c| c.host_memory).ok_or_else(|| {
            format!(
                "--allreduce peer: {} cannot import host memory (open with TFWGPU_PEER=1, Vulkan \
                 with VK_EXT_external_memory_host)",
                d.description().name
            )
        })?;
        align = align.max(c.host_align.next_power_of_two());
        timeline &= c.timeline_fd;
    }
    let mut off = vec![vec![0u64; plan.grads.len()]; n];
    let mut at = 0u64;
    for o in off.iter_mut() {
        for (j, g) in plan.grads.iter().enumerate() {
            o[j] = at;
            at += g.bytes.next_multiple_of(256);
        }
    }
    let host = HostShared::new(at, align).map_err(e)?;
    let imports = devs
        .iter()
        .map(|d| d.import_host(&host))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    let mut links: Vec<Vec<Option<PeerLink>>> = (0..n).map(|_| vec![]).collect();
    for (a, from) in devs.iter().enumerate() {
        for (b, to) in devs.iter().enumerate() {
            links[a].push(if timeline && a != b {
                Some(from.peer_link(to).map_err(e)?)
            } else {
                None
            });
        }
    }
    Ok(PeerRes {
        imports,
        off,
        links,
    })
}

/// How a data-parallel pass runs.
#[derive(Clone, Copy, Debug)]
pub struct DpOptions {
    pub mode: AllReduce,
    /// Events that wait for a bucket's sum, and those touching what they touch, are held back
    /// while the thread goes on with the rest (as TensorFlow's executor runs the ops whose
    /// inputs are ready); without it, the thread blocks at the first such event.
    pub defer: bool,
    /// Read every gradient back before and after its all-reduce (blocking reads).
    pub check: bool,
    /// `--free-run`: only these two marks (the first labelled one and the last) drain the
    /// devices and meet; at the marks between them the threads go on (the steps' own host
    /// syncs of the trace stay), so the pass times the steps between the two as a whole.
    pub free_run: Option<(usize, usize)>,
}

/// One pass of the plan on `devs` (one thread per device, plus a communication thread each
/// when there are several).
pub fn replay_dp(
    devs: &[&Device],
    trace: &Trace,
    plan: &DpPlan,
    caches: &mut [HashMap<String, Box<dyn Kernel>>],
    opts: DpOptions,
    seed: u64,
) -> Result<DpPass, String> {
    let DpOptions {
        mode,
        defer,
        check,
        free_run,
    } = opts;
    let n = devs.len();
    assert!(caches.len() >= n);
    if mode == AllReduce::Halves && n > 2 {
        return Err("--allreduce halves takes two devices".into());
    }
    let e = |e: tfwgpu_runtime::Error| e.to_string();
    // Each device trains on data of its own.
    let payloads: Vec<HashMap<usize, Vec<u8>>> = (0..n)
        .map(|s| {
            let mut rng = StdRng::seed_from_u64(seed * 1000 + s as u64);
            plan.events
                .iter()
                .filter_map(|&i| match &trace.events[i] {
                    Event::H2d { size, fill, .. } => {
                        Some((i, random_bytes(&mut rng, *fill, *size)))
                    }
                    _ => None,
                })
                .collect()
        })
        .collect();
    // Staging tensors for the bytes received, per device and gradient.
    let peer = n > 1 && mode.is_peer();
    let comm = n > 1 && mode != AllReduce::None && !peer;
    let mut staging: Vec<Vec<u64>> = vec![];
    if comm || peer {
        for (s, d) in devs.iter().enumerate() {
            let mut v = vec![];
            for (j, g) in plan.grads.iter().enumerate() {
                let len = match mode {
                    AllReduce::Halves => owned(j, g.bytes, s).1,
                    _ => g.bytes,
                };
                v.push(d.allocate(len.max(4)).map_err(e)?);
            }
            staging.push(v);
        }
    }
    let peer_res = if peer {
        Some(
            peer_resources(devs, plan, mode == AllReduce::PeerHost).inspect_err(|_| {
                for (s, d) in devs.iter().enumerate() {
                    for &a in staging.get(s).into_iter().flatten() {
                        let _ = d.deallocate(a);
                    }
                }
            })?,
        )
    } else {
        None
    };
    for d in devs {
        d.synchronize().map_err(e)?;
    }
    let nb = plan.buckets.len();
    let shared = Shared::new(
        n,
        Dp {
            done: vec![vec![false; nb]; n],
            comm_running: vec![comm; n],
            tickets: (0..n).map(|_| (0..nb).map(|_| vec![]).collect()).collect(),
        },
    );
    let t0 = Instant::now();
    let cx = Ctx {
        trace,
        plan,
        shared: &shared,
        mode,
        n,
        t0,
        check,
        defer,
        devs,
        peer: peer_res.as_ref(),
        peer_block: std::env::var("TFWGPU_PEER_ORDER").is_ok_and(|v| v.trim() == "block"),
        staging: &staging,
        free_run,
    };
    type Res = (
        Result<DeviceRun, String>,
        Option<Result<Vec<BucketTimes>, String>>,
    );
    let results: Vec<Res> = std::thread::scope(|sc| {
        let (mut job_tx, mut job_rx) = (vec![], vec![]);
        let (mut msg_tx, mut msg_rx) = (vec![], vec![]);
        for _ in 0..n {
            let (t, r) = channel::<Job>();
            job_tx.push(Some(t));
            job_rx.push(Some(r));
            let (t, r) = channel::<Msg>();
            msg_tx.push(t);
            msg_rx.push(Some(r));
        }
        let mut comms = vec![];
        for s in 0..n {
            if !comm {
                comms.push(None);
                job_tx[s] = None;
                continue;
            }
            let peers: Vec<(usize, Sender<Msg>)> = (0..n)
                .filter(|&p| p != s)
                .map(|p| (p, msg_tx[p].clone()))
                .collect();
            let (jobs, inbox) = (job_rx[s].take().unwrap(), msg_rx[s].take().unwrap());
            let (dev, cx, st) = (devs[s], &cx, &staging[s]);
            comms.push(Some(sc.spawn(move || {
                // Tells the device's thread, even on a panic, that this thread stopped.
                struct Finished<'a>(&'a Shared, usize);
                impl Drop for Finished<'_> {
                    fn drop(&mut self) {
                        self.0.comm_finished(self.1);
                    }
                }
                let _finished = Finished(cx.shared, s);
                let r = comm_thread(s, dev, cx, st, jobs, inbox, peers);
                if r.is_err() {
                    cx.shared.fail();
                }
                r
            })));
        }
        drop(msg_tx);
        let handles: Vec<_> = caches
            .iter_mut()
            .take(n)
            .zip(payloads)
            .enumerate()
            .map(|(s, (cache, p))| {
                let (dev, cx, tx) = (devs[s], &cx, job_tx[s].take());
                sc.spawn(move || device_thread(s, dev, cx, cache, p, tx))
            })
            .collect();
        let devs: Vec<Result<DeviceRun, String>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a replay thread panicked".into()))
            })
            .collect();
        devs.into_iter()
            .zip(comms)
            .map(|(d, c)| {
                let c = c.map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a communication thread panicked".into()))
                });
                (d, c)
            })
            .collect()
    });
    let wall_s = t0.elapsed().as_secs_f64();
    let mut peer_bytes = vec![];
    if let Some(pr) = peer_res {
        // Semaphores and imports go once no submit that uses them is pending (a failed device
        // thread may not have synchronized).
        for d in devs {
            let _ = d.synchronize();
        }
        // A diagnostic only: taken when every thread succeeded, and left out where a read
        // fails (the run's own error, if any, is the one to report).
        let all_ok = results
            .iter()
            .all(|(d, c)| d.is_ok() && c.as_ref().is_none_or(|c| c.is_ok()));
        if check && all_ok {
            let taken: Option<PeerBytes> = (devs.iter().enumerate())
                .map(|(s, d)| {
                    (plan.grads.iter().enumerate())
                        .map(|(j, g)| {
                            let region = pr.imports[s].host.snapshot(pr.off[s][j], g.bytes);
                            Some((region, d.read(staging[s][j], g.bytes as usize).ok()?))
                        })
                        .collect()
                })
                .collect();
            peer_bytes = taken.unwrap_or_default();
        }
        drop(pr);
    }
    for (s, d) in devs.iter().enumerate() {
        if let Some(v) = staging.get(s) {
            for &a in v {
                d.deallocate(a).map_err(e)?;
            }
        }
    }
    // The devices' errors first: a communication thread fails after its device did.
    let errs: Vec<&String> = results
        .iter()
        .filter_map(|(d, _)| d.as_ref().err())
        .chain(
            results
                .iter()
                .filter_map(|(_, c)| c.as_ref().and_then(|c| c.as_ref().err())),
        )
        .collect();
    if let Some(err) = errs
        .iter()
        .find(|e| e.as_str() != OTHER_FAILED)
        .or(errs.first())
    {
        return Err((*err).clone());
    }
    let mut out = DpPass {
        n,
        wall_s,
        marks: std::mem::take(&mut shared.lock().marks),
        peer_bytes,
        ..DpPass::default()
    };
    for (d, c) in results {
        let d = d.expect("checked above");
        out.devices.push(d.pass);
        out.waits_s.push(d.wait_s);
        out.mark_waits_s.push(d.mark_waits);
        out.mark_log.push(d.mark_log);
        out.deferred_max.push(d.deferred_max);
        out.checked.push(d.checked);
        out.host_waits.push(d.host_waits);
        out.comm.push(match c {
            Some(c) => c.expect("checked above"),
            None => d.peer_times,
        });
    }
    Ok(out)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// With `check`: every gradient's value after the all-reduce is the same on every device and
/// is the sum of the devices' values before it (exact for two devices: float32 addition is
/// commutative; within n ulps of the sum of |terms| otherwise). Returns how many gradients,
/// elements and finite elements were checked (the replay's random optimizer state can turn
/// weights, and so later gradients, into NaN).
pub fn verify(p: &DpPass, plan: &DpPlan) -> Result<(usize, usize, usize), String> {
    // `peer`: element k of gradient j in each device's region and staging tensor.
    let peer_at = |j: usize, k: usize| -> String {
        let at = |b: &[u8]| f32s(b).get(k).copied();
        let v: Vec<String> = (p.peer_bytes.iter().enumerate())
            .map(|(s, g)| {
                let (region, staged) = &g[j];
                format!(
                    "device {s} pushed {:?}, copied in {:?}",
                    at(region),
                    at(staged)
                )
            })
            .collect();
        if v.is_empty() {
            String::new()
        } else {
            format!("; in the shared memory and staging: {}", v.join(", "))
        }
    };
    let mut grads = 0;
    let mut elems = 0;
    let mut finite = 0;
    for j in 0..plan.grads.len() {
        let per: Vec<&(Vec<u8>, Vec<u8>)> = p.checked.iter().filter_map(|c| c.get(&j)).collect();
        if per.is_empty() {
            continue;
        }
        if per.len() != p.n {
            return Err(format!(
                "gradient {j}: checked on {} of {} devices",
                per.len(),
                p.n
            ));
        }
        let before: Vec<Vec<f32>> = per.iter().map(|c| f32s(&c.0)).collect();
        for (s, c) in per.iter().enumerate() {
            // NaN payloads depend on the operands' order: any NaN matches any NaN.
            let same = |x: &f32, y: &f32| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
            let (a, b) = (f32s(&c.1), f32s(&per[0].1));
            if p.n <= 2 && !a.iter().zip(&b).all(|(x, y)| same(x, y)) {
                let k = a.iter().zip(&b).position(|(x, y)| !same(x, y));
                let k = k.unwrap_or(0);
                return Err(format!(
                    "gradient {j} ({:?}, event {}): device {s} got another sum than device 0: \
                     element {k}: {} against {} (before: {} and {}); {} elements differ{}",
                    plan.grads[j].shape,
                    plan.grads[j].producer,
                    a[k],
                    b[k],
                    before[s][k],
                    before[0][k],
                    a.iter().zip(&b).filter(|(x, y)| !same(x, y)).count(),
                    peer_at(j, k)
                ));
            }
            let after = a;
            for (k, &got) in after.iter().enumerate() {
                let want: f32 = before.iter().map(|v| v[k]).sum();
                let mag: f32 = before.iter().map(|v| v[k].abs()).sum();
                let tol = if p.n <= 2 {
                    0.0
                } else {
                    p.n as f32 * f32::EPSILON * mag
                };
                if got.is_nan() != want.is_nan() || (!want.is_nan() && (got - want).abs() > tol) {
                    let bad = after
                        .iter()
                        .enumerate()
                        .filter(|&(k, &g)| {
                            let w: f32 = before.iter().map(|v| v[k]).sum();
                            g.is_nan() != w.is_nan() || (!w.is_nan() && (g - w).abs() > tol)
                        })
                        .count();
                    return Err(format!(
                        "gradient {j} ({:?}, event {}) element {k} on device {s}: {got} after \
                         the all-reduce, the devices' sum is {want} (before: {:?}); {bad} of {} \
                         elements wrong{}",
                        plan.grads[j].shape,
                        plan.grads[j].producer,
                        before.iter().map(|v| v[k]).collect::<Vec<_>>(),
                        after.len(),
                        peer_at(j, k)
                    ));
                }
            }
            elems += after.len();
            finite += after.iter().filter(|x| x.is_finite()).count();
        }
        grads += 1;
    }
    Ok((grads, elems, finite))
}

/// `replay TRACE --data-parallel N[,M...] [--allreduce exchange|halves] [--bucket-kb K]
/// [--label L] [--per-device-batch B] [--repeat R] [--check] [--json FILE]`.
pub fn run(args: &[String], path: &str, trace: &Trace, rt: &Runtime) -> Result<(), String> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let counts: Vec<usize> = flag("--data-parallel")
        .ok_or("--data-parallel N[,M...]")?
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("bad device count {x:?}"))
        })
        .collect::<Result<_, _>>()?;
    // Several modes (comma-separated) alternate pass by pass in one process, after one
    // one-device pass per round that they share.
    let mut modes: Vec<AllReduce> = flag("--allreduce")
        .map_or("exchange", |s| s)
        .split(',')
        .map(|m| AllReduce::parse(m.trim()))
        .collect::<Result<_, _>>()?;
    let bucket_kb: u64 = flag("--bucket-kb")
        .map_or(Ok(0), |s| s.parse())
        .map_err(|_| "bad --bucket-kb")?;
    let label = flag("--label").map_or("1gpu", |s| s.as_str());
    let batch: Option<f64> = flag("--per-device-batch")
        .map(|s| s.parse().map_err(|_| "bad --per-device-batch"))
        .transpose()?;
    let repeat: usize = flag("--repeat")
        .map_or(Ok(3), |s| s.parse())
        .map_err(|_| "bad --repeat")?;
    let check = args.iter().any(|a| a == "--check");
    let defer = !args.iter().any(|a| a == "--no-defer");
    let max_n = counts.iter().copied().max().unwrap_or(1);
    if counts.contains(&0) || rt.devices.len() < max_n {
        return Err(format!(
            "--data-parallel {counts:?}: {} device(s) are open (TFWGPU_VISIBLE_DEVICES=0,0 opens \
             one adapter twice)",
            rt.devices.len()
        ));
    }
    let plan = DpPlan::new(trace, label, bucket_kb * 1024)?;
    let (ng, elems, bytes, nb) = plan.per_step(trace);
    let devs: Vec<&Device> = rt.devices.iter().take(max_n).collect();
    // `peer`: what the devices offer; without host memory import, the exchange instead.
    let mut peer_note = Value::Null;
    if modes.iter().any(|m| m.is_peer()) && max_n > 1 {
        let caps: Vec<_> = devs.iter().map(|d| d.peer_caps().cloned()).collect();
        let host = caps
            .iter()
            .all(|c| c.as_ref().is_some_and(|c| c.host_memory));
        let timeline = caps
            .iter()
            .all(|c| c.as_ref().is_some_and(|c| c.timeline_fd));
        let forced = timeline && peer_host_order();
        let missing: Vec<String> = caps
            .iter()
            .map(|c| {
                c.as_ref()
                    .map_or("not opened with TFWGPU_PEER=1 on Vulkan".into(), |c| {
                        c.missing.join(", ")
                    })
            })
            .collect();
        if !host {
            println!(
                "  --allreduce peer: FALLBACK to exchange: a device cannot import host memory \
                 ({missing:?})"
            );
            for m in modes.iter_mut().filter(|m| m.is_peer()) {
                *m = AllReduce::Exchange;
            }
            let mut seen = vec![];
            modes.retain(|m| {
                let new = !seen.contains(m);
                seen.push(*m);
                new
            });
        } else if forced {
            println!(
                "  --allreduce peer: shared host memory; ordering on the host \
                 (TFWGPU_PEER_ORDER), though the devices share timeline semaphores"
            );
        } else if !timeline {
            println!(
                "  --allreduce peer: shared host memory; FALLBACK ordering: no OPAQUE_FD timeline \
                 semaphores ({missing:?}), each bucket's copy is waited for on the host"
            );
        } else {
            println!(
                "  --allreduce peer: shared host memory, ordered on the GPUs by timeline \
                 semaphores (OPAQUE_FD; no host wait)"
            );
        }
        peer_note = json!({"host_memory": host, "timeline_fd": timeline, "missing": missing,
            "used": modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
            "host_order_forced": forced, "wait_flush": peer_wait_flush()});
    }
    println!(
        "trace {path}: {} events replayed per device, {} gradients found ({} per step: {elems} \
         float32, {:.1} KB, {nb} buckets), all-reduce {}, {}",
        plan.events.len(),
        plan.grads.len(),
        ng,
        bytes as f64 / 1e3,
        modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", "),
        if defer {
            "events waiting for it held back (--no-defer: the thread blocks)"
        } else {
            "the thread blocks at the first event waiting for it (--no-defer)"
        }
    );
    for (d, dev) in devs.iter().enumerate() {
        println!("  device {d}: {}", dev.description().name);
    }
    let mut caches: Vec<HashMap<String, Box<dyn Kernel>>> =
        devs.iter().map(|_| HashMap::new()).collect();
    let mut doc = serde_json::Map::new();
    if check && modes.contains(&AllReduce::None) {
        return Err("--check needs an all-reduce (--allreduce exchange or halves)".into());
    }
    // `--free-run`: the first labelled mark and the last mark stay meeting points; the steps
    // between them are timed as a whole (`free_steps` of them).
    let marks: Vec<usize> = plan
        .events
        .iter()
        .copied()
        .filter(|&i| matches!(&trace.events[i], Event::Mark(_)))
        .collect();
    let first_labelled = marks
        .iter()
        .copied()
        .find(|&i| matches!(&trace.events[i], Event::Mark(l) if l == label));
    let last_mark = marks.last().copied();
    let free_run = match (
        args.iter().any(|a| a == "--free-run"),
        first_labelled,
        last_mark,
    ) {
        (false, _, _) => None,
        (true, Some(a), Some(z)) if z > a => Some((a, z)),
        (true, _, _) => return Err(format!("--free-run: no steps labelled {label:?} to run")),
    };
    let free_steps = free_run.map_or(1, |(a, z)| {
        marks.iter().filter(|&&m| m > a && m <= z).count()
    });
    if let Some((a, z)) = free_run {
        println!(
            "  --free-run: the devices drain and meet only at events {a} and {z}; the {free_steps} \
             steps between are timed as a whole (their own host syncs replayed)"
        );
    }
    let opts = |mode, check| DpOptions {
        mode,
        defer,
        check,
        free_run: if check { None } else { free_run },
    };
    // One one-device pass per round (first mode), then every mode's passes on more devices.
    let mut combos: Vec<(AllReduce, usize)> = vec![];
    for &n in &counts {
        if n == 1 {
            combos.push((modes[0], 1));
        } else {
            combos.extend(modes.iter().map(|&m| (m, n)));
        }
    }
    if check {
        for &(mode, n) in combos.iter().filter(|c| c.1 > 1) {
            let p = replay_dp(&devs[..n], trace, &plan, &mut caches, opts(mode, true), 99)?;
            let (g, el, fin) = verify(&p, &plan)?;
            println!(
                "  check ({n} devices, {}): {g} all-reduced gradients, {el} elements ({fin} \
                 finite): every device has the devices' sum{}",
                mode.name(),
                if mode.is_peer() {
                    format!(" (host waits per device: {:?})", p.host_waits)
                } else {
                    String::new()
                }
            );
            let key = if modes.len() > 1 {
                format!("check_{n}_{}", mode.name())
            } else {
                format!("check_{n}")
            };
            doc.insert(
                key,
                json!({"gradients": g, "elements": el, "finite": fin,
                    "host_waits": p.host_waits}),
            );
        }
    }
    let mut passes: HashMap<(AllReduce, usize), Vec<DpPass>> = HashMap::new();
    for r in 0..repeat.max(1) {
        for &(mode, n) in &combos {
            let o = opts(mode, false);
            let p = replay_dp(&devs[..n], trace, &plan, &mut caches, o, r as u64)?;
            passes.entry((mode, n)).or_default().push(p);
        }
    }
    let mut one: Option<f64> = None;
    let mut rows = vec![];
    for &(mode, n) in &combos {
        let ps = &passes[&(mode, n)];
        println!(
            "  {n} device(s){}, {} passes:",
            if n > 1 {
                format!(", {}", mode.name())
            } else {
                String::new()
            },
            ps.len()
        );
        let steps = report_steps(ps);
        let Some(med) = steps.get(label).and_then(|v| v["median_ms"].as_f64()) else {
            return Err(format!("no steps labelled {label:?} in the trace"));
        };
        // `--free-run`: the labelled "step" spans every free-running step.
        let med = med / free_steps as f64;
        if n == 1 {
            one = Some(med);
        }
        let scale = one.map(|o| n as f64 * o / med);
        let ips = batch.map(|b| n as f64 * b / med * 1e3);
        // Where the devices waited for the all-reduce (passes after the first).
        let later = &ps[usize::from(ps.len() > 1)..];
        // Per step of `label` and device: the wait between its opening and closing marks.
        let mut wait_ms: Vec<f64> = vec![];
        for p in later {
            for w in &p.mark_waits_s {
                for (k, m) in p.marks.iter().enumerate() {
                    if m.0 == label
                        && let Some(x) = w.get(k + 1)
                    {
                        wait_ms.push(x * 1e3);
                    }
                }
            }
        }
        let wait = if wait_ms.is_empty() {
            0.0
        } else {
            median(&wait_ms) / free_steps as f64
        };
        let mut per_pos: std::collections::BTreeMap<usize, Vec<(f64, f64, f64)>> =
            std::collections::BTreeMap::new();
        // Buckets of the labelled steps only (the program's first, unmarked steps number
        // their buckets on).
        let first_mark = plan
            .events
            .iter()
            .copied()
            .find(|&i| matches!(&trace.events[i], Event::Mark(l) if l == label))
            .unwrap_or(0);
        for p in later {
            for c in p
                .comm
                .iter()
                .flatten()
                .filter(|c| plan.buckets[c.bucket].issue_after > first_mark)
            {
                per_pos
                    .entry(plan.buckets[c.bucket].pos)
                    .or_default()
                    .push((
                        c.read_us - c.issued_us,
                        c.received_us - c.issued_us,
                        c.done_us - c.issued_us,
                    ));
            }
        }
        println!(
            "    step median {med:.3} ms{}{}{}{}",
            if free_run.is_some() {
                format!(" (free-running: {free_steps} steps timed as a whole)")
            } else {
                String::new()
            },
            ips.map_or(String::new(), |x| format!(", {x:.0} images/s")),
            scale.map_or(String::new(), |x| if n > 1 {
                format!(
                    ", {x:.2}x one device ({:.0}% efficiency)",
                    100.0 * x / n as f64
                )
            } else {
                String::new()
            }),
            if n > 1 {
                let held = later
                    .iter()
                    .flat_map(|p| p.deferred_max.iter().copied())
                    .max()
                    .unwrap_or(0);
                format!(
                    ", blocked on the all-reduce {wait:.3} ms per step and device (median), up \
                     to {held} events held back"
                )
            } else {
                String::new()
            }
        );
        let mut buckets = vec![];
        for (pos, v) in &per_pos {
            let m = |f: fn(&(f64, f64, f64)) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
            let (rd, rc, dn) = (m(|x| x.0), m(|x| x.1), m(|x| x.2));
            let kb: u64 = plan
                .buckets
                .iter()
                .find(|b| b.pos == *pos)
                .map_or(0, |b| b.grads.iter().map(|&j| plan.grads[j].bytes).sum());
            if mode.is_peer() {
                println!(
                    "    bucket {pos} ({:.1} KB): from its copy's recording, submitted with its \
                     ticket {rd:.0} us, peers' tickets taken {rc:.0} us, sum recorded {dn:.0} us \
                     (medians)",
                    kb as f64 / 1e3
                );
            } else {
                println!(
                    "    bucket {pos} ({:.1} KB): from the read's start, read back {rd:.0} us, \
                     peer's bytes {rc:.0} us, sum recorded {dn:.0} us (medians)",
                    kb as f64 / 1e3
                );
            }
            buckets.push(
                json!({"pos": pos, "bytes": kb, "read_us": rd, "received_us": rc, "done_us": dn}),
            );
        }
        let dev_stats: Vec<Value> = later
            .last()
            .map(|p| {
                p.devices
                    .iter()
                    .enumerate()
                    .map(|(s, d)| {
                        json!({"kernels": d.kernels, "submits": d.stats.submits,
                        "dispatches": d.stats.dispatches, "host_syncs": d.host_syncs,
                        "peer_host_waits": p.host_waits.get(s)})
                    })
                    .collect()
            })
            .unwrap_or_default();
        if mode.is_peer() && n > 1 {
            let hw: usize = ps.iter().flat_map(|p| p.host_waits.iter()).sum();
            println!(
                "    peer: {hw} host waits for a peer's batch in {} passes",
                ps.len()
            );
        }
        rows.push(json!({
            "devices": n, "allreduce": mode.name(), "step_median_ms": med, "images_per_s": ips, "vs_one": scale,
            "efficiency": scale.map(|x| x / n as f64), "allreduce_wait_ms_per_step": wait,
            "free_run_steps": free_run.map(|_| free_steps),
            "buckets": buckets, "steps": steps, "per_device": dev_stats,
            "wall_ms": ps.iter().map(|p| p.wall_s * 1e3).collect::<Vec<_>>(),
            "mark_log": ps.iter().map(|p| &p.mark_log).collect::<Vec<_>>(),
        }));
    }
    if let Some(out) = flag("--json") {
        doc.insert("trace".into(), json!(path));
        doc.insert(
            "allreduce".into(),
            json!(modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(",")),
        );
        doc.insert("peer".into(), peer_note.clone());
        doc.insert("bucket_kb".into(), json!(bucket_kb));
        doc.insert("defer".into(), json!(defer));
        doc.insert("per_device_batch".into(), json!(batch));
        doc.insert(
            "gradients_per_step".into(),
            json!({"count": ng, "elements": elems, "bytes": bytes}),
        );
        doc.insert(
            "adapters".into(),
            json!(
                devs.iter()
                    .map(|d| d.description().name.clone())
                    .collect::<Vec<_>>()
            ),
        );
        doc.insert("runs".into(), json!(rows));
        write_json(out, &Value::Object(doc))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay_multi::tests::{line, two_devices};

    const A: u64 = 0x1_0000_0000;

    /// The first event that waits for bucket `b`'s sum.
    fn first_wait(plan: &DpPlan, b: usize) -> usize {
        (plan.wait_before.iter())
            .filter(|(_, bs)| bs.contains(&b))
            .map(|(&e, _)| e)
            .min()
            .expect("every bucket has a waiting event")
    }

    /// A map from events to buckets as (event, buckets) pairs in event order.
    fn sorted(m: &HashMap<usize, Vec<usize>>) -> Vec<(usize, Vec<usize>)> {
        let mut v: Vec<(usize, Vec<usize>)> = m.iter().map(|(&e, b)| (e, b.clone())).collect();
        v.sort();
        v
    }

    /// A float32 tensor of `n` elements at traced address `a`.
    fn tensor(a: u64, n: usize) -> Value {
        json!({"dtype": "float32", "shape": [n], "addr": a})
    }

    /// A float32 kernel event of `op` at graph node `node`.
    fn kernel(op: &str, node: &str, ins: Vec<Value>, out: Value) -> Value {
        json!({"ev": "kernel", "op": op, "node": node, "attrs": {"T": {"type": "float32"}},
            "inputs": ins, "outputs": [out], "dispatches": 1, "host_us": 1.0})
    }

    /// The text of a one-device trace of `evs`, numbered in order.
    fn trace_text(evs: impl IntoIterator<Item = Value>) -> String {
        let mut s = line(json!({"ev": "header", "format": "tfwgpu-trace", "version": 1}));
        for (seq, mut v) in evs.into_iter().enumerate() {
            v["seq"] = json!(seq);
            v["dev"] = json!(0);
            s += &line(v);
        }
        s
    }

    /// A one-device training program of `steps` steps: three gradients (21, 300 and 300
    /// float32), the first two consumed only after both were produced, the third produced
    /// after the first was consumed.
    fn dp_trace(steps: usize) -> String {
        let (f, k) = (tensor, kernel);
        let mut evs = vec![];
        let mut ev = |v: Value| evs.push(v);
        ev(json!({"ev": "alloc", "addr": A, "size": 16384}));
        for _ in 0..steps {
            ev(json!({"ev": "mark", "label": "1gpu"}));
            ev(json!({"ev": "h2d", "dst": A, "size": 84}));
            ev(json!({"ev": "h2d", "dst": A + 2048, "size": 1200}));
            ev(k("Relu", "model/relu", vec![f(A, 21)], f(A + 256, 21)));
            ev(k(
                "Relu",
                "gradient_tape/w",
                vec![f(A + 256, 21)],
                f(A + 512, 21),
            ));
            ev(k(
                "Relu",
                "gradient_tape/b",
                vec![f(A + 2048, 300)],
                f(A + 4096, 300),
            ));
            ev(k(
                "AddV2",
                "adam/w",
                vec![f(A + 512, 21), f(A + 256, 21)],
                f(A + 1024, 21),
            ));
            ev(k(
                "Neg",
                "gradient_tape/c",
                vec![f(A + 2048, 300)],
                f(A + 6144, 300),
            ));
            ev(k(
                "AddV2",
                "adam/b",
                vec![f(A + 4096, 300), f(A + 4096, 300)],
                f(A + 8192, 300),
            ));
            ev(k(
                "AddV2",
                "adam/c",
                vec![f(A + 6144, 300), f(A + 4096, 300)],
                f(A + 10240, 300),
            ));
        }
        ev(json!({"ev": "mark", "label": "end"}));
        ev(json!({"ev": "free", "addr": A}));
        trace_text(evs)
    }

    #[test]
    fn plan_finds_the_gradients_and_buckets_them_in_production_order() {
        let trace = Trace::parse(&dp_trace(2)).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        // Events: 0 alloc; step 1: 1 mark, 2-3 h2d, 4 relu, 5 w, 6 b, 7 adam/w, 8 c, 9-10 adam;
        // step 2: 11 mark, ..., 15 w, 16 b, 17 adam/w, 18 c; 21 end mark, 22 free.
        let got: Vec<(usize, u64, usize)> = plan
            .grads
            .iter()
            .map(|g| (g.producer, g.bytes, g.consumer))
            .collect();
        assert_eq!(
            got,
            [
                (5, 84, 7),
                (6, 1200, 9),
                (8, 1200, 10),
                (15, 84, 17),
                (16, 1200, 19),
                (18, 1200, 20)
            ]
        );
        let b: Vec<(Vec<usize>, usize, usize, usize)> = plan
            .buckets
            .iter()
            .enumerate()
            .map(|(k, b)| (b.grads.clone(), b.issue_after, first_wait(&plan, k), b.pos))
            .collect();
        assert_eq!(
            b,
            [
                (vec![0, 1], 6, 7, 0),
                (vec![2], 8, 10, 1),
                (vec![3, 4], 16, 17, 0),
                (vec![5], 18, 20, 1)
            ]
        );
        assert_eq!(plan.per_step(&trace), (3, 621, 2484, 2));
        // Every reader of a gradient outside the tape waits for its bucket, not only the first
        // (adam/b reads the first bucket's b after adam/w, the bucket's first reader, and
        // adam/c reads it too), until the tape writes the next step's gradient there.
        let waits = sorted(&plan.wait_before);
        assert_eq!(
            waits,
            [
                (7, vec![0]),
                (9, vec![0]),
                (10, vec![0, 1]),
                (17, vec![2]),
                (19, vec![2]),
                (20, vec![2, 3])
            ]
        );
        // Each bucket is issued once all of its producers were replayed (w and b for the first
        // bucket of a step: the deferral may hold w back behind the previous step's adam/w
        // while b goes on), not at the last of them in trace order alone.
        assert_eq!(plan.producers, [2, 1, 2, 1]);
        let by = sorted(&plan.produced_by);
        assert_eq!(
            by,
            [
                (5, vec![0]),
                (6, vec![0]),
                (8, vec![1]),
                (15, vec![2]),
                (16, vec![2]),
                (18, vec![3])
            ]
        );
        // A bucket size closes buckets earlier.
        let small = DpPlan::new(&trace, "1gpu", 64).unwrap();
        assert_eq!(small.buckets.len(), 6);
        assert_eq!(
            plan.events.len(),
            trace.events.len() - 1,
            "up to the end mark"
        );
    }

    #[test]
    fn plan_takes_the_one_device_steps_of_a_two_device_trace() {
        // A "2gpu" part after the one-device steps, on two devices, is left out.
        let mut text = dp_trace(1);
        let end = trace_len(&text);
        text += &line(json!({"ev": "mark", "seq": 100, "dev": -1, "label": "2gpu"}));
        text += &line(
            json!({"ev": "alloc", "seq": 101, "dev": 1, "addr": 0x2_0000_0000u64,
            "size": 4096}),
        );
        let trace = Trace::parse(&text).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        assert_eq!(
            plan.events.len(),
            end - 1,
            "up to the end mark, without the free"
        );
        // Without the label's steps first, a two-device trace is refused.
        let err = DpPlan::new(&trace, "none", 0).unwrap_err();
        assert!(err.contains("one-device program"), "{err}");
    }

    #[test]
    fn held_back_events_keep_their_order_against_what_touches_their_memory() {
        let trace = Trace::parse(&dp_trace(1)).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        let t = &plan.touch;
        // Events: 0 alloc, 1 mark, 2-3 h2d, 4 relu (A -> A+256), 5 w (A+256 -> A+512),
        // 6 b (A+2048 -> A+4096), 7 adam/w (A+512, A+256 -> A+1024), 8 c (A+2048 -> A+6144),
        // 9 adam/b (A+4096 -> A+8192), 10 adam/c (A+6144, A+4096 -> A+10240), 11 mark, 12 free.
        assert!(plan.barrier[1] && plan.barrier[11] && !plan.barrier[7]);
        // With adam/w held back, c and adam/b touch other memory (adam/b, which reads the
        // bucket's other gradient, still waits for the sum itself); adam/c only reads what
        // adam/b reads.
        assert!(!conflicts(t, 8, &[7]));
        assert!(!conflicts(t, 9, &[7]));
        assert!(!conflicts(t, 10, &[9]));
        // Writing what a held event reads, reading or writing what it writes: held too.
        assert!(
            conflicts(t, 4, &[7]),
            "relu rewrites A+256, which adam/w reads"
        );
        assert!(
            conflicts(t, 5, &[7]),
            "w rewrites the gradient adam/w reads"
        );
        assert!(conflicts(t, 10, &[8]), "adam/c reads the gradient c writes");
        assert!(
            conflicts(t, 12, &[9]),
            "the free of the allocation adam/b uses"
        );
        assert!(conflicts(t, 0, &[9]), "an allocation of its range");
        assert!(!conflicts(t, 2, &[9]), "an upload elsewhere");
    }

    /// A step whose second gradient (b) is freed after its reader and its memory reused,
    /// with an event `extra` (if any) inserted right after the first gradient's producer.
    fn freed_gradient_trace(extra: Option<Value>) -> Trace {
        let (f, k) = (tensor, kernel);
        let (x, b) = (A, A + 0x10000);
        let mut evs = vec![
            json!({"ev": "alloc", "addr": x, "size": 4096}),
            json!({"ev": "mark", "label": "1gpu"}),
            json!({"ev": "h2d", "dst": x, "size": 64}),
            k("Relu", "gradient_tape/w", vec![f(x, 16)], f(x + 256, 16)),
        ];
        evs.extend(extra);
        evs.extend([
            json!({"ev": "alloc", "addr": b, "size": 256}),
            k("Neg", "gradient_tape/b", vec![f(x, 16)], f(b, 16)),
            k(
                "AddV2",
                "sgd/w",
                vec![f(x + 256, 16), f(x, 16)],
                f(x + 512, 16),
            ),
            k("AddV2", "sgd/b", vec![f(b, 16), f(x, 16)], f(x + 768, 16)),
            json!({"ev": "free", "addr": b}),
            json!({"ev": "alloc", "addr": b, "size": 256}),
            json!({"ev": "h2d", "dst": b, "size": 64}),
            k("Relu", "model/next", vec![f(b, 16)], f(x + 1024, 16)),
            json!({"ev": "mark", "label": "end"}),
        ]);
        Trace::parse(&trace_text(evs)).unwrap()
    }

    #[test]
    fn every_event_touching_a_gradient_until_its_memory_is_rewritten_waits_for_the_sum() {
        let trace = freed_gradient_trace(None);
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        // Events: 0 alloc, 1 mark, 2 h2d, 3 w, 4 alloc b, 5 b, 6 sgd/w, 7 sgd/b, 8 free b,
        // 9 alloc b, 10 h2d b, 11 next, 12 mark.
        let buckets = |plan: &DpPlan| -> Vec<(Vec<usize>, usize, usize)> {
            (plan.buckets.iter().enumerate())
                .map(|(k, b)| (b.grads.clone(), b.issue_after, first_wait(plan, k)))
                .collect()
        };
        assert_eq!(buckets(&plan), [(vec![0, 1], 5, 6)]);
        // sgd/b and the free of b wait too (had the free gone ahead of a held-back sgd/w, the
        // sum would have gone into the tensor allocated at b's address next); what comes after
        // the free is another tensor.
        let waits = sorted(&plan.wait_before);
        assert_eq!(waits, [(6, vec![0]), (7, vec![0]), (8, vec![0])]);
        // A copy of w outside the tape (event 4) before b is produced (event 6): w is touched
        // first there, so its bucket closes before b and the copy waits for w's sum; b gets a
        // bucket of its own.
        let early = json!({"ev": "d2d", "src": A + 256, "dst": A + 2048, "size": 64});
        let plan = DpPlan::new(&freed_gradient_trace(Some(early)), "1gpu", 0).unwrap();
        assert_eq!(buckets(&plan), [(vec![0], 3, 4), (vec![1], 6, 8)]);
        let waits = sorted(&plan.wait_before);
        assert_eq!(
            waits,
            [(4, vec![0]), (7, vec![0]), (8, vec![1]), (9, vec![1])]
        );
        // A host read (d2h) of a gradient waits for its sum too.
        let read = json!({"ev": "d2h", "src": A + 256, "size": 64});
        let plan = DpPlan::new(&freed_gradient_trace(Some(read)), "1gpu", 0).unwrap();
        assert_eq!(sorted(&plan.wait_before)[0], (4, vec![0]));
    }

    /// A write of part of a gradient ends the wait for that part only: a later reader of the
    /// rest still waits for the sum.
    #[test]
    fn a_partial_write_of_a_gradient_leaves_the_rest_waiting() {
        let (f, k) = (tensor, kernel);
        let x = A;
        let evs = [
            json!({"ev": "alloc", "addr": x, "size": 4096}),
            json!({"ev": "mark", "label": "1gpu"}),
            json!({"ev": "h2d", "dst": x, "size": 64}),
            k("Relu", "gradient_tape/w", vec![f(x, 16)], f(x + 256, 16)),
            k(
                "AddV2",
                "sgd/w",
                vec![f(x + 256, 16), f(x, 16)],
                f(x + 512, 16),
            ),
            // Writes the first half of w, then the second half is read, then all of it is
            // written.
            k("Neg", "model/half", vec![f(x, 8)], f(x + 256, 8)),
            k("Relu", "model/rest", vec![f(x + 288, 8)], f(x + 1024, 8)),
            k("Neg", "model/all", vec![f(x, 16)], f(x + 256, 16)),
            k("Relu", "model/after", vec![f(x + 288, 8)], f(x + 1536, 8)),
            json!({"ev": "mark", "label": "end"}),
        ];
        let plan = DpPlan::new(&Trace::parse(&trace_text(evs)).unwrap(), "1gpu", 0).unwrap();
        assert_eq!(plan.grads.len(), 1);
        assert_eq!(
            sorted(&plan.wait_before),
            [(4, vec![0]), (5, vec![0]), (6, vec![0]), (7, vec![0])]
        );
        assert_eq!(subtract(&[(0, 10), (20, 30)], (5, 25)), [(0, 5), (25, 30)]);
    }

    fn trace_len(text: &str) -> usize {
        Trace::parse(text).unwrap().events.len()
    }

    #[test]
    fn halves_cover_each_gradient_once_split_at_256_bytes() {
        for (j, n) in [
            (0usize, 1u64),
            (1, 10),
            (2, 127),
            (3, 128),
            (4, 300),
            (5, 225034),
        ] {
            let bytes = n * 4;
            let (a, b) = (owned(j, bytes, 0), owned(j, bytes, 1));
            assert_eq!(a.1 + b.1, bytes, "{n}");
            if a.1 > 0 && b.1 > 0 {
                assert_eq!(a, (0, a.1));
                assert_eq!(b.0, a.1);
                assert_eq!(a.1 % 256, 0);
            } else {
                assert!(n < 128);
                assert_eq!((a.1 > 0) as usize, 1 - j % 2);
            }
        }
    }

    fn o(mode: AllReduce, defer: bool, check: bool) -> DpOptions {
        DpOptions {
            mode,
            defer,
            check,
            free_run: None,
        }
    }

    fn all_reduced(mode: AllReduce, defer: bool) {
        all_reduced_on(&two_devices(), mode, defer);
    }

    /// The adapter opened twice with `RuntimeOptions::peer`.
    fn two_peer_devices() -> Runtime {
        Runtime::default_adapter_twice(|o| o.peer = true).expect("the adapter opened twice")
    }

    fn all_reduced_on(rt: &Runtime, mode: AllReduce, defer: bool) {
        let devs: Vec<&Device> = rt.devices.iter().collect();
        let trace = Trace::parse(&dp_trace(3)).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        let mut caches = vec![HashMap::new(), HashMap::new()];
        let in_use: Vec<u64> = devs.iter().map(|d| d.memory_stats().bytes_in_use).collect();
        let marks: Vec<usize> = plan
            .events
            .iter()
            .copied()
            .filter(|&i| matches!(trace.events[i], Event::Mark(_)))
            .collect();
        for seed in 0..2 {
            // The second pass free-running: only the first and last marks meet.
            let free = seed == 1;
            let mut opts = o(mode, defer, true);
            opts.free_run = free.then(|| (marks[0], *marks.last().unwrap()));
            let p = replay_dp(&devs, &trace, &plan, &mut caches, opts, seed).unwrap();
            let (g, el, fin) = verify(&p, &plan).unwrap();
            assert_eq!((g, el, fin), (9, 2 * 3 * 621, 2 * 3 * 621));
            let labels: Vec<&str> = p.marks.iter().map(|m| m.0.as_str()).collect();
            if free {
                assert_eq!(labels, ["1gpu", "end"]);
                assert!(p.mark_waits_s.iter().all(|w| w.len() == 2));
            } else {
                assert_eq!(labels, ["1gpu", "1gpu", "1gpu", "end"]);
            }
            assert_eq!(p.comm.iter().map(Vec::len).collect::<Vec<_>>(), [6, 6]);
            for c in p.comm.iter().flatten() {
                assert!(c.issued_us <= c.read_us && c.read_us <= c.received_us);
                assert!(c.received_us <= c.done_us);
            }
            assert!(p.devices.iter().all(|d| d.kernels == 21));
            if mode.is_peer() {
                // Without shared timeline semaphores (lavapipe: the GPU-ordered path cannot run
                // there) or with `peer-host`, every bucket's copy is waited for on the host
                // (visibly); with them, never.
                let timeline = devs
                    .iter()
                    .all(|d| d.peer_caps().is_some_and(|c| c.timeline_fd));
                let want = if timeline && mode != AllReduce::PeerHost {
                    0
                } else {
                    6
                };
                assert_eq!(p.host_waits, [want, want]);
            }
            // The devices trained on different data: their gradients differed.
            let j = plan.buckets[0].grads[1];
            assert_ne!(p.checked[0][&j].0, p.checked[1][&j].0);
            // A wrong sum on one device is caught.
            let mut bad = p;
            let v = &mut bad.checked[1].get_mut(&j).unwrap().1;
            v[4] ^= 1;
            let err = verify(&bad, &plan).unwrap_err();
            assert!(err.contains("another sum"), "{err}");
            bad.checked[0].get_mut(&j).unwrap().1[4] ^= 1;
            let err = verify(&bad, &plan).unwrap_err();
            assert!(err.contains("the devices' sum"), "{err}");
        }
        // One device alone: no all-reduce, the same replay.
        let p = replay_dp(
            &devs[..1],
            &trace,
            &plan,
            &mut caches,
            o(mode, defer, false),
            0,
        )
        .unwrap();
        assert_eq!(p.marks.len(), 4);
        assert!(p.comm[0].is_empty());
        let now: Vec<u64> = devs.iter().map(|d| d.memory_stats().bytes_in_use).collect();
        assert_eq!(now, in_use, "every allocation and staging tensor was freed");
    }

    #[test]
    fn exchange_gives_every_device_the_sum_of_the_gradients() {
        all_reduced(AllReduce::Exchange, true);
        all_reduced(AllReduce::Exchange, false);
    }

    #[test]
    fn halves_give_every_device_the_sum_of_the_gradients() {
        all_reduced(AllReduce::Halves, true);
        all_reduced(AllReduce::Halves, false);
    }

    /// `peer` where the adapter can import host memory (lavapipe can; it has no OPAQUE_FD semaphores, so
    /// the ordering is the host-waited fallback there); elsewhere the replay refuses, saying
    /// why (and `run` falls back to `exchange`).
    #[test]
    fn peer_gives_every_device_the_sum_of_the_gradients() {
        let rt = two_peer_devices();
        let caps = rt.devices[0].peer_caps().cloned();
        eprintln!("peer caps: {caps:?}");
        if caps.as_ref().is_some_and(|c| c.host_memory) {
            all_reduced_on(&rt, AllReduce::Peer, true);
            all_reduced_on(&rt, AllReduce::Peer, false);
            all_reduced_on(&rt, AllReduce::PeerHost, true);
        } else {
            eprintln!("SKIPPED: no host memory import on this adapter; checking the refusal");
            let devs: Vec<&Device> = rt.devices.iter().collect();
            let trace = Trace::parse(&dp_trace(1)).unwrap();
            let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
            let mut caches = vec![HashMap::new(), HashMap::new()];
            let o = o(AllReduce::Peer, true, false);
            let err = replay_dp(&devs, &trace, &plan, &mut caches, o, 0).unwrap_err();
            assert!(err.contains("cannot import host memory"), "{err}");
        }
    }

    #[test]
    fn without_an_all_reduce_the_devices_train_apart() {
        let rt = two_devices();
        let devs: Vec<&Device> = rt.devices.iter().collect();
        let trace = Trace::parse(&dp_trace(2)).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        let mut caches = vec![HashMap::new(), HashMap::new()];
        let none = o(AllReduce::None, true, false);
        let p = replay_dp(&devs, &trace, &plan, &mut caches, none, 0).unwrap();
        assert_eq!(p.marks.len(), 3);
        assert!(p.comm.iter().all(Vec::is_empty));
        assert!(p.waits_s.iter().all(|&w| w == 0.0));
        assert!(p.devices.iter().all(|d| d.kernels == 14));
    }

    #[test]
    fn a_failing_device_releases_the_other_and_its_communication_thread() {
        let rt = two_devices();
        let devs: Vec<&Device> = rt.devices.iter().collect();
        // The last consumer reads an address no allocation holds: device threads fail there,
        // after buckets were handed to the communication threads.
        let text = dp_trace(2).replace(&format!("\"addr\":{}", A + 10240), "\"addr\":99");
        let trace = Trace::parse(&text).unwrap();
        let plan = DpPlan::new(&trace, "1gpu", 0).unwrap();
        let mut caches = vec![HashMap::new(), HashMap::new()];
        for mode in [AllReduce::Exchange, AllReduce::Halves] {
            for defer in [false, true] {
                let err = replay_dp(&devs, &trace, &plan, &mut caches, o(mode, defer, false), 0)
                    .unwrap_err();
                assert!(err.contains("lies in no traced allocation"), "{err}");
            }
        }
        let rt = two_peer_devices();
        if rt.devices[0].peer_caps().is_some_and(|c| c.host_memory) {
            let devs: Vec<&Device> = rt.devices.iter().collect();
            let mut caches = vec![HashMap::new(), HashMap::new()];
            for defer in [false, true] {
                let o = o(AllReduce::Peer, defer, false);
                let err = replay_dp(&devs, &trace, &plan, &mut caches, o, 0).unwrap_err();
                assert!(err.contains("lies in no traced allocation"), "{err}");
            }
        }
    }
}
