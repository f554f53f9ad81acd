//! ExecutionContext: ordering and batching of GPU work on one queue.
//!
//! Dispatches and copies from every thread are recorded, in call order, into one command
//! encoder (one open compute pass between copies). The batch is submitted when it holds
//! `max_ops` commands, when it is older than `max_age` (a background thread checks), or when the
//! host needs a result. Each batch gets an id; ids complete in order, and `completed()` is the
//! highest finished id. Reading from the device is the only blocking call.

use crate::hostlog::{self, HostSpan, Kind};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result};

/// Submission thresholds.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// Submit when a batch holds this many commands (`TFWGPU_BATCH_OPS`).
    pub max_ops: usize,
    /// Submit a batch once it is this old (`TFWGPU_BATCH_US`, microseconds).
    pub max_age: Duration,
    /// Submit a batch of at least this many commands at once when the GPU is about to run out
    /// of work (`TFWGPU_BATCH_IDLE_OPS`; 0: never): fewer than `idle_inflight` submitted
    /// batches not yet complete. The batching above amortizes the cost of a submit while the
    /// GPU has plenty queued; when its queue is (nearly) empty, every command held back on the
    /// host is GPU time lost (the start of a step after a host sync, a stretch of kernels the
    /// GPU runs faster than the host records them).
    pub idle_ops: usize,
    /// See `idle_ops` (`TFWGPU_BATCH_IDLE_INFLIGHT`): 1 (the default) submits early only when
    /// the GPU is idle; 2 also while it runs its last batch, so that the next one is queued
    /// behind it instead of going out only after the host notices the GPU went idle (the
    /// completion callbacks run on the poller thread, up to a nap later). On the H200, 2 cut
    /// the small models' steps but not ResNet-50's, whose many more submits cost more idle
    /// time than they saved, in a noisy call (bench/RESULTS.md, 2026-11-30): 1 stays the
    /// default until a quiet measurement says otherwise.
    pub idle_inflight: u64,
    /// Submit a batch of any size once it is this old while the GPU is idle
    /// (`TFWGPU_BATCH_IDLE_US`, microseconds; 0: off, the default for one device since session
    /// 18). With two
    /// GPUs under MirroredStrategy the tail of each backward pass waited in its open batch for
    /// `max_age` while the collective waited for it (`TFWGPU_BATCH_US=100` for every batch cut
    /// the two-GPU step 28% but slowed the ResNet-50 replay, whose GPU stays busy:
    /// bench/RESULTS.md, session 5); this rule (50 us, the default from session 6 to 17)
    /// shortened that wait only when the GPU had nothing to do: session 6's replayed two-GPU CNN
    /// step 6.4-7.1 -> 3.6-4.2 ms. Session 18 (bench/RESULTS.md) A/B'd it within processes on
    /// one H200: on a short synchronized step it split the batch into two serialized submits
    /// (the replayed CNN inference step 0.29-0.41 ms against 0.22-0.30 without), and without
    /// it the Keras CNN (train and inference) and the Keras MirroredStrategy step on two
    /// logical devices were not slower, nor the ResNet-50 replay; off by the decision rule
    /// written before that run. Not re-measured on two GPUs: a runtime that opens several
    /// devices takes `idle_age_multi` instead.
    pub idle_age: Option<Duration>,
    /// `idle_age` for a runtime that opens two or more devices (default 50 us, the rule's
    /// measured two-GPU gain of session 6, until two GPUs say otherwise; `TFWGPU_BATCH_IDLE_US`
    /// sets both).
    pub idle_age_multi: Option<Duration>,
    /// What `idle_age` is measured from (`TFWGPU_BATCH_IDLE_RULE`, `age` or `quiet`; default
    /// `age`). See [`IdleRule`].
    pub idle_rule: IdleRule,
    /// Bind groups kept for reuse (`TFWGPU_BIND_GROUP_CACHE`, entries; 0: a new bind group
    /// for every dispatch). See [`ExecutionContext::dispatch`].
    pub bind_group_cache: usize,
    /// Uploads of at least this many bytes go through the queue's own staging
    /// (`TFWGPU_DIRECT_UPLOAD_BYTES`, default 64 KiB; 0: never). See
    /// [`ExecutionContext::upload`]. Smaller ones get a staging buffer mapped at creation,
    /// which wgpu zero-fills first: on the H200 a 0.2 MB upload took 60-76 us that way and
    /// 25-27 us through the queue's staging, 0.8 MB 139-195 against 71-83 us (session 7; the
    /// threshold was 1 MiB).
    pub direct_upload_bytes: u64,
    /// Submit a large upload's staging copy at once (`TFWGPU_UPLOAD_SUBMIT`, default on; 0:
    /// off), instead of with the next batch. See [`ExecutionContext::upload`].
    pub upload_submit: bool,
    /// A large upload stages, copies and submits outside the batch lock, in its own place in
    /// the submit order (`TFWGPU_DIRECT_UNLOCKED`, default on; 0: under the batch lock, as
    /// before session 10). See `ExecutionContext::upload_direct`.
    pub direct_unlocked: bool,
    /// Uploads of at most this many bytes (`TFWGPU_ARENA_UPLOAD_BYTES`, default 16 KiB; 0:
    /// none) are appended to the open batch's uniform arena, which the batch's submit writes
    /// to the GPU before its commands run, and copied from there in order: no staging buffer
    /// is created for them (a buffer mapped at creation per upload: a driver allocation, a
    /// zero-fill and a map for the few bytes of a label batch, a seed, a random key). See
    /// [`ExecutionContext::upload`].
    pub arena_upload_bytes: u64,
    /// How long a host waiting for the GPU ([`ExecutionContext::wait`]: reads, host syncs)
    /// polls for completion before it blocks in the driver (`TFWGPU_SPIN_US`, microseconds;
    /// 0: block at once; `None`: [`DEFAULT_SPIN`] on a GPU, 0 on a CPU adapter, whose
    /// execution threads need the cores a spinning host would take). A blocked thread wakes
    /// some time after the GPU finished (H200: a 4-byte read back after a small fill took
    /// 103 us blocking at once, 57 us polling for 30 us first: bench/RESULTS.md, session 6),
    /// and a training step of a small model waits for the GPU several times. Polls past
    /// [`TIGHT_SPIN`] yield the core to other threads between them (`std::thread::yield_now`).
    /// The default was 50 us until session 12: a wait for more than that (the replayed CNN
    /// inference step's GPU part is ~0.09 ms) blocked and paid the driver's wake-up. With 1 ms,
    /// over six interleaved rounds in two H200 calls, the replayed CNN inference step was
    /// lower in four (pooled medians ~0.30 -> ~0.27 ms) and the replayed training step in
    /// four (~0.98 -> ~0.89 ms); Keras's CNN step did not resolve a change (bench/RESULTS.md,
    /// session 12, infer13).
    pub spin: Option<Duration>,
    /// Batches that a recording thread finds due go to a submit thread of the device, which
    /// encodes and submits them while the recording thread goes on (`TFWGPU_SUBMIT_THREAD=1`;
    /// `0`: the recording thread encodes and submits them itself, outside the batch lock;
    /// `None`: on for a GPU, off for a CPU adapter (lavapipe), whose execution threads need
    /// the cores). On the H200 the Keras CNN's training step was shorter with it in 10 of 14
    /// alternated pairs over five calls (sessions 9 and 10: host9, the lead's two final calls,
    /// host10's two), by 0.1-0.8 ms, and longer by 0.1-0.3 ms in the other four; the Keras
    /// ResNet-50 step the same (71.3 / 19.7 ms against 70.3 / 19.5, one pair; bench/RESULTS.md,
    /// session 10, lead).
    pub submit_thread: Option<bool>,
}

/// The host's polling before it blocks on a GPU (see [`ExecConfig::spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(1000);

/// How long a waiting host polls back to back before it yields its core between polls (see
/// [`ExecConfig::spin`]; the whole spin before session 12).
pub const TIGHT_SPIN: Duration = Duration::from_micros(50);

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            max_ops: 128,
            max_age: Duration::from_micros(500),
            idle_ops: 16,
            idle_inflight: 1,
            idle_age: None,
            idle_age_multi: Some(Duration::from_micros(50)),
            idle_rule: IdleRule::Age,
            bind_group_cache: 16384,
            direct_upload_bytes: 64 << 10,
            upload_submit: true,
            direct_unlocked: true,
            arena_upload_bytes: 16 << 10,
            spin: None,
            submit_thread: None,
        }
    }
}

impl ExecConfig {
    /// Defaults overridden by `TFWGPU_BATCH_OPS`, `TFWGPU_BATCH_US`, `TFWGPU_BATCH_IDLE_OPS`,
    /// `TFWGPU_BATCH_IDLE_INFLIGHT`, `TFWGPU_BATCH_IDLE_US`, `TFWGPU_BATCH_IDLE_RULE`,
    /// `TFWGPU_BIND_GROUP_CACHE`,
    /// `TFWGPU_DIRECT_UPLOAD_BYTES`, `TFWGPU_UPLOAD_SUBMIT`, `TFWGPU_ARENA_UPLOAD_BYTES` and
    /// `TFWGPU_SPIN_US`.
    pub fn from_env() -> Self {
        let mut c = ExecConfig::default();
        if let Some(n) = env_parse::<usize>("TFWGPU_BATCH_OPS") {
            c.max_ops = n.max(1);
        }
        if let Some(us) = env_parse::<u64>("TFWGPU_BATCH_US") {
            c.max_age = Duration::from_micros(us);
        }
        if let Some(n) = env_parse::<usize>("TFWGPU_BATCH_IDLE_OPS") {
            c.idle_ops = n;
        }
        if let Some(n) = env_parse::<u64>("TFWGPU_BATCH_IDLE_INFLIGHT") {
            c.idle_inflight = n.max(1);
        }
        if let Some(us) = env_parse::<u64>("TFWGPU_BATCH_IDLE_US") {
            c.idle_age = (us > 0).then(|| Duration::from_micros(us));
            c.idle_age_multi = c.idle_age;
        }
        if let Ok(v) = std::env::var("TFWGPU_BATCH_IDLE_RULE") {
            match IdleRule::parse(&v) {
                Some(r) => c.idle_rule = r,
                None => tracing::warn!("ignoring TFWGPU_BATCH_IDLE_RULE={v:?}: not age or quiet"),
            }
        }
        if let Some(n) = env_parse::<usize>("TFWGPU_BIND_GROUP_CACHE") {
            c.bind_group_cache = n;
        }
        if let Some(n) = env_parse::<u64>("TFWGPU_DIRECT_UPLOAD_BYTES") {
            c.direct_upload_bytes = n;
        }
        if let Some(n) = env_parse::<u64>("TFWGPU_UPLOAD_SUBMIT") {
            c.upload_submit = n != 0;
        }
        if let Some(n) = env_parse::<u64>("TFWGPU_DIRECT_UNLOCKED") {
            c.direct_unlocked = n != 0;
        }
        if let Some(n) = env_parse::<u64>("TFWGPU_ARENA_UPLOAD_BYTES") {
            c.arena_upload_bytes = n.min(ARENA_SIZE / 4);
        }
        if let Some(us) = env_parse::<u64>("TFWGPU_SPIN_US") {
            c.spin = Some(Duration::from_micros(us));
        }
        if let Some(n) = env_parse::<u32>("TFWGPU_SUBMIT_THREAD") {
            c.submit_thread = Some(n > 0);
        }

        c
    }

    /// True when a batch of `ops` commands is due for submission on a GPU with nothing to do:
    /// it holds `idle_ops` commands, or the idle rule's clock (`since`: the batch's first
    /// command under [`IdleRule::Age`], its latest under [`IdleRule::Quiet`]) has run `age`.
    fn due_when_idle(&self, ops: usize, age: Option<Duration>, since: Option<Instant>) -> bool {
        (self.idle_ops > 0 && ops >= self.idle_ops)
            || age
                .zip(since)
                .is_some_and(|(age, t)| ops > 0 && t.elapsed() >= age)
    }
}

/// Bit 63 of [`ExecutionContext`]'s idle word: the quiet rule.
const QUIET_BIT: u64 = 1 << 63;

/// The idle word of `age` (microseconds, at least 1 when set, saturated below bit 63) and
/// `rule`.
fn idle_word(age: Option<Duration>, rule: IdleRule) -> u64 {
    let us = age.map_or(0, |a| {
        u64::try_from(a.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, QUIET_BIT - 1)
    });
    us | if rule == IdleRule::Quiet {
        QUIET_BIT
    } else {
        0
    }
}

/// What the idle age of a batch (`ExecConfig::idle_age`) counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleRule {
    /// From the batch's first command: a batch that has been open `idle_age` goes to an idle
    /// GPU at its next command (or the poller's next round), even while the host is still
    /// recording: the GPU starts early on a long recording, at the cost of a second submit
    /// on a short one that the closing synchronize then waits behind (bench/NOTES-infer.md).
    Age,
    /// From the batch's latest command: the batch goes to an idle GPU once the host has
    /// recorded nothing for `idle_age` (the poller's check; the age is never what splits a
    /// batch while commands are being recorded, though `idle_ops` and `max_ops` still do). A
    /// short burst of commands followed by a synchronize stays one submit; a burst followed
    /// by host work elsewhere (Python, a collective's wait) goes out `idle_age` after its last
    /// command.
    Quiet,
}

impl IdleRule {
    /// `age` or `quiet`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "age" => Some(IdleRule::Age),
            "quiet" => Some(IdleRule::Quiet),
            _ => None,
        }
    }
}

pub(crate) fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(x) => Some(x),
        Err(_) => {
            tracing::warn!("ignoring {name}={v:?}: not a number");
            None
        }
    }
}

/// A storage-buffer binding: a range of a wgpu buffer.
#[derive(Clone, Debug)]
pub struct BufferRange {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

/// A compiled compute pipeline and its bind group layout.
#[derive(Debug)]
pub struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// `kernel:dtype:specialization`, the name its dispatches have in GPU timings.
    pub label: Arc<str>,
    /// `Some(n)`: the pipeline uses the shared layout of the binding convention with `n`
    /// storage bindings and a dynamic offset on the uniform (its bind groups are cached, see
    /// [`ExecutionContext::dispatch`]); `None`: its own layout, derived by wgpu.
    pub storage_bindings: Option<usize>,
    /// The shared layout's storage bindings have dynamic offsets as well (see
    /// `KernelManager::shared_layout`): bind groups bind each tensor's buffer at offset 0 and
    /// each dispatch passes the tensors' offsets.
    pub dynamic_storage: bool,
}

/// A device-to-host read in flight: its copy is submitted, its bytes are not yet on the host.
/// Finish it with [`ExecutionContext::read_finish`] on the context that started it.
#[must_use = "a pending read holds a staging buffer until it is finished"]
pub struct PendingRead {
    staging: Option<wgpu::Buffer>,
    /// The bytes read (the staging buffer may be larger).
    size: u64,
    id: u64,
    mapped: Option<std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>>,
}

impl PendingRead {
    /// A read of nothing: finishing it waits for nothing.
    pub(crate) fn empty() -> PendingRead {
        PendingRead {
            staging: None,
            size: 0,
            id: 0,
            mapped: None,
        }
    }

    /// The batch whose completion makes the bytes available.
    pub fn batch(&self) -> u64 {
        self.id
    }
}

/// Counters, for tests and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    pub submits: u64,
    pub dispatches: u64,
    pub copies: u64,
    pub uploads: u64,
    pub reads: u64,
    /// Bind groups created for dispatches (the rest came from the cache).
    pub bind_groups: u64,
}

/// Bytes of uniform params one batch can hold (see `uniforms`).
const ARENA_SIZE: u64 = 64 * 1024;

/// Most storage bindings of a dispatch whose bind group is cached.
const MAX_CACHED_BINDINGS: usize = 16;

/// What a cached bind group binds: the shared layout (by its number of storage bindings), the
/// size of the uniform binding, and each storage binding's buffer, offset and size. The
/// uniform binding is the context's one uniform buffer at a dynamic offset, so it is not part
/// of the key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    storage: usize,
    uniform_size: u64,
    buffers: [Option<(wgpu::Buffer, u64, u64)>; MAX_CACHED_BINDINGS],
}

/// Bind groups of earlier dispatches. A training step repeats the same kernels on the same
/// tensors (same heap buffers, same offsets) every step, so after the first step nearly every
/// dispatch finds its bind group here instead of creating one (wgpu validates every entry,
/// tracks every buffer and allocates a descriptor set per bind group). Entries keep their
/// buffers alive; a heap the allocator destroys is never bound again (new heaps are new
/// buffers), so its entries only wait for the next clear. Bounded: cleared when full.
#[derive(Default)]
struct BindGroupCache {
    map: crate::kernel_manager::FastMap<BindKey, wgpu::BindGroup>,
}

/// Timestamp queries per batch (two per timed command); a batch that fills them is submitted.
const TIMING_QUERIES: u32 = 512;

/// The label of a compute pass timed as a whole (see [`ExecutionContext::set_timing_per_pass`]).
pub const PASS_LABEL: &str = "pass";

/// One command timed with GPU timestamps (see [`ExecutionContext::set_timing`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchTiming {
    /// The batch (submission) the command was in.
    pub batch: u64,
    /// The pipeline's label for dispatches; `copy` or `clear` for transfer commands.
    pub label: Arc<str>,
    /// Start and end on the queue's timestamp clock, in nanoseconds. Only differences mean
    /// anything; commands of one queue share the clock.
    pub start_ns: f64,
    pub end_ns: f64,
}

/// What a list of timed commands adds up to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimingSummary {
    pub commands: usize,
    /// From the first start to the last end.
    pub span_ns: f64,
    /// Time in which at least one command ran (the union of their intervals).
    pub busy_ns: f64,
    /// The sum of the commands' own durations (more than `busy_ns` where they overlap).
    pub sum_ns: f64,
}

impl TimingSummary {
    pub fn of(timings: &[DispatchTiming]) -> TimingSummary {
        let mut iv: Vec<(f64, f64)> = timings
            .iter()
            .map(|t| (t.start_ns, t.end_ns.max(t.start_ns)))
            .collect();
        iv.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut busy = 0.0;
        let mut cur: Option<(f64, f64)> = None;
        for (s, e) in iv.iter().copied() {
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    busy += ce - cs;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
        }
        let first = iv.first().map(|x| x.0).unwrap_or(0.0);
        let last = iv.iter().map(|x| x.1).fold(first, f64::max);
        TimingSummary {
            commands: timings.len(),
            span_ns: last - first,
            busy_ns: busy,
            sum_ns: iv.iter().map(|(s, e)| e - s).sum(),
        }
    }
}

/// The query set and buffers of one batch's timestamps.
struct TimingSlot {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// A batch's timestamps: where they go and what each pair of queries timed.
struct BatchTiming {
    slot: TimingSlot,
    labels: Vec<Arc<str>>,
}

/// A submitted batch whose timestamps are on their way back.
struct PendingTiming {
    batch: u64,
    timing: BatchTiming,
    mapped: Arc<Mutex<Option<std::result::Result<(), wgpu::BufferAsyncError>>>>,
}

struct Batch {
    /// Id this batch will have when submitted.
    id: u64,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    ops: usize,
    started: Option<Instant>,
    /// When the latest command was recorded, under [`IdleRule::Quiet`] (its clock; None
    /// otherwise).
    last: Option<Instant>,
    uniforms: Vec<u8>,
    bind_groups: BindGroupCache,
    timing: Option<BatchTiming>,
    /// The query pair of the open compute pass, when passes are timed as a whole.
    pass_timing: Option<u32>,
}

/// A batch taken out for submission (see [`ExecutionContext::take_locked`]).
struct Taken {
    encoder: wgpu::CommandEncoder,
    uniforms: Vec<u8>,
    timing: Option<BatchTiming>,
    id: u64,
    /// Called with the queue right before the batch's submit, in submit order (see
    /// [`ExecutionContext::flush_with`]).
    before_submit: Option<BeforeSubmit>,
}

/// What [`ExecutionContext::flush_with`] runs right before its batch's submit.
pub(crate) type BeforeSubmit = Box<dyn FnOnce(&wgpu::Queue) + Send>;

/// Work for the submit thread (`ExecConfig::submit_thread`), in submit order.
enum Job {
    /// A batch taken for submission.
    Batch(Taken),
    /// A large upload's staged bytes, handed to the queue in its place (see
    /// [`ExecutionContext::upload_direct`]).
    Write(wgpu::QueueWriteBufferView, u64),
}

struct Shared {
    completed: AtomicU64,
    stop: AtomicBool,
    wake: Condvar,
    wake_lock: Mutex<bool>,
    error: Mutex<Option<Error>>,
    lost: Mutex<Option<String>>,
}

/// GPU timing state: on or off, and the timestamps not yet taken.
#[derive(Default)]
struct Timing {
    on: AtomicBool,
    /// The device can time transfer commands too (TIMESTAMP_QUERY_INSIDE_ENCODERS).
    transfers: AtomicBool,
    /// Time each compute pass as a whole (two timestamps per pass) instead of every dispatch.
    per_pass: AtomicBool,
    pending: Mutex<Vec<PendingTiming>>,
    slots: Mutex<Vec<TimingSlot>>,
}

/// Orders and batches GPU work for one device. Thread-safe.
pub struct ExecutionContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    cfg: ExecConfig,
    uniform_align: u64,
    /// The uniform params of every dispatch of the open batch, written at its submit
    /// (`Queue::write_buffer`, which the queue runs after the work submitted before and before
    /// the batch's own commands: one buffer serves every batch in turn).
    uniform_buffer: wgpu::Buffer,
    batch: Mutex<Batch>,
    /// Batches reach the queue in id order: a batch taken out of the batch lock (see
    /// [`ExecutionContext::take_locked`]) is submitted once `submitted` is the id before its
    /// own; threads wait for their turn (and for batches on their way) on this condvar.
    turn: Mutex<()>,
    turn_cv: Condvar,
    /// `TFWGPU_SUBMIT_THREAD=1`: batches that recording threads take out go to this device's
    /// submit thread, which encodes and submits them while the recording thread goes on.
    submitter: std::sync::OnceLock<std::sync::mpsc::Sender<Job>>,
    /// What [`ExecutionContext::tag`] returns: the id of the newest batch holding a command.
    recorded_tag: AtomicU64,
    /// (batch id, wgpu submission index) of batches submitted and maybe not yet complete.
    inflight: Mutex<VecDeque<(u64, wgpu::SubmissionIndex)>>,
    submitted: AtomicU64,
    shared: Arc<Shared>,
    stats: Mutex<ExecStats>,
    timing: Timing,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Readback buffers of small reads, unmapped and ready for the next one (see `read_begin`).
    read_pool: Mutex<Vec<wgpu::Buffer>>,
    /// The idle rule in force, as one word (read and replaced together): `cfg.idle_age` in
    /// microseconds (0: off) in the low 63 bits, [`IdleRule::Quiet`] in bit 63;
    /// [`ExecutionContext::set_idle`] changes it while work runs (an A/B of the rules within
    /// one process, where the host's speed is the same for both).
    idle: AtomicU64,
}

/// Reads of at most this many bytes take their readback buffer from a pool (sizes rounded up
/// to a power of two, at least 256 bytes), which keeps at most `READ_POOL_BUFFERS`.
const READ_POOL_MAX_BYTES: u64 = 1 << 20;
const READ_POOL_BUFFERS: usize = 16;

impl ExecutionContext {
    pub(crate) fn new(device: wgpu::Device, queue: wgpu::Queue, cfg: ExecConfig) -> Arc<Self> {
        let shared = Arc::new(Shared {
            completed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
            error: Mutex::new(None),
            lost: Mutex::new(None),
        });
        {
            let s = Arc::downgrade(&shared);
            device.set_device_lost_callback(move |reason, msg| {
                if let Some(s) = s.upgrade() {
                    *s.lost.lock() = Some(format!("{reason:?}: {msg}"));
                }
            });
            let s = Arc::downgrade(&shared);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                tracing::error!("uncaptured wgpu error: {e}");
                if let Some(s) = s.upgrade() {
                    let mut slot = s.error.lock();
                    if slot.is_none() {
                        *slot = Some(match e {
                            wgpu::Error::OutOfMemory { .. } => {
                                Error::OutOfMemory(format!("the GPU API reported: {e}"))
                            }
                            _ => Error::Gpu(e.to_string()),
                        });
                    }
                }
            }));
        }
        let uniform_align = device.limits().min_uniform_buffer_offset_alignment as u64;
        let uniform_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tfwgpu uniforms"),
            size: ARENA_SIZE,
            // COPY_SRC: small uploads are copied out of it (`ExecConfig::arena_upload_bytes`).
            usage: wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let idle = idle_word(cfg.idle_age, cfg.idle_rule);
        let ctx = Arc::new(ExecutionContext {
            device,
            queue,
            cfg,
            uniform_align,
            uniform_buffer,
            batch: Mutex::new(Batch {
                id: 1,
                encoder: None,
                pass: None,
                ops: 0,
                started: None,
                last: None,
                uniforms: vec![],
                bind_groups: BindGroupCache::default(),
                timing: None,
                pass_timing: None,
            }),
            turn: Mutex::new(()),
            turn_cv: Condvar::new(),
            submitter: std::sync::OnceLock::new(),
            recorded_tag: AtomicU64::new(0),
            inflight: Mutex::new(VecDeque::new()),
            submitted: AtomicU64::new(0),
            shared,
            stats: Mutex::new(ExecStats::default()),
            timing: Timing::default(),
            poller: Mutex::new(None),
            read_pool: Mutex::new(Vec::new()),
            idle: AtomicU64::new(idle),
        });
        let weak = Arc::downgrade(&ctx);
        let shared = ctx.shared.clone();
        let handle = std::thread::Builder::new()
            .name("tfwgpu-poller".into())
            .spawn(move || poller(weak, shared))
            .expect("spawning the tfwgpu poller thread");
        *ctx.poller.lock() = Some(handle);
        if ctx.cfg.submit_thread == Some(true) {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let weak = Arc::downgrade(&ctx);
            std::thread::Builder::new()
                .name("tfwgpu-submit".into())
                .spawn(move || {
                    for job in rx {
                        let Some(ctx) = weak.upgrade() else { return };
                        let r = match job {
                            Job::Batch(t) => ctx.submit_in_turn(t),
                            Job::Write(view, place) => ctx.write_in_place(view, place),
                        };
                        if let Err(e) = r {
                            tracing::warn!("submit: {e}");
                            let mut slot = ctx.shared.error.lock();
                            if slot.is_none() {
                                *slot = Some(e);
                            }
                        }
                    }
                })
                .expect("spawning the tfwgpu submit thread");
            let _ = ctx.submitter.set(tx);
        }
        ctx
    }

    /// Highest batch id whose GPU work has completed.
    pub fn completed(&self) -> u64 {
        self.shared.completed.load(Ordering::Acquire)
    }

    /// Highest batch id submitted to the queue.
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Acquire)
    }

    /// The id after whose completion all work recorded so far is done. Memory freed now may be
    /// reused once `completed() >= tag`; an event recorded now is reached at this id.
    pub fn tag(&self) -> u64 {
        // Without the batch lock (TensorFlow records an event or frees memory on one thread
        // while another records or submits): the id of the newest batch that holds a command,
        // stored when the batch got its first one. Taking a batch out for submission does not
        // change it (the next id minus one is the taken batch's own id).
        self.recorded_tag.load(Ordering::Acquire)
    }

    /// Counts a host-to-device upload recorded by other means than [`Self::upload`] (a small
    /// write recorded as a dispatch, `fill::write_small`).
    pub(crate) fn count_upload(&self) {
        self.stats.lock().uploads += 1;
    }

    /// Counters.
    pub fn stats(&self) -> ExecStats {
        *self.stats.lock()
    }

    /// The sticky device-lost error, or the first uncaptured GPU error since the last check.
    pub fn check(&self) -> Result<()> {
        if let Some(msg) = self.shared.lost.lock().clone() {
            return Err(Error::DeviceLost(msg));
        }
        if let Some(e) = self.shared.error.lock().take() {
            return Err(e);
        }
        Ok(())
    }

    fn begin(&self, b: &mut Batch) {
        if b.encoder.is_none() {
            let t0 = hostlog::now();
            b.encoder = Some(
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("tfwgpu batch"),
                    }),
            );
            hostlog::span(Kind::EncoderNew, t0, 0);
        }
        if b.started.is_none() {
            b.started = Some(Instant::now());
            let mut w = self.shared.wake_lock.lock();
            *w = true;
            self.shared.wake.notify_one();
        }
    }

    fn after_record(&self, mut b: parking_lot::MutexGuard<'_, Batch>) -> Result<()> {
        b.ops += 1;
        if b.ops == 1 {
            self.recorded_tag.store(b.id, Ordering::Release);
        }
        // Under the quiet rule the host is recording now: only the poller's check applies, on
        // the clock of the latest command (read only under that rule: this is every command's
        // path). A switch to it mid-batch starts that clock at the next command.
        let (age, rule) = self.idle();
        let since = match rule {
            IdleRule::Age => b.started,
            IdleRule::Quiet => {
                b.last = Some(Instant::now());
                None
            }
        };
        if b.ops >= self.cfg.max_ops
            || (self.cfg.due_when_idle(b.ops, age, since) && self.gpu_idle())
        {
            let taken = self.take_locked(&mut b);
            return match (taken, self.submitter.get()) {
                // Sent before the batch lock is let go: the submit thread receives batches in
                // id order (it waits for each one's turn, so one received out of order would
                // wait for a batch queued behind it).
                (Some(t), Some(tx)) => match send_batch(tx, t) {
                    None => Ok(()),
                    Some(t) => {
                        drop(b);
                        self.submit_in_turn(t)
                    }
                },
                (t, _) => {
                    drop(b);
                    self.submit_taken(t)
                }
            };
        }
        Ok(())
    }

    /// The idle rule in force: its age (None: off) and what the age counts from.
    pub fn idle(&self) -> (Option<Duration>, IdleRule) {
        let w = self.idle.load(Ordering::Relaxed);
        let us = w & !QUIET_BIT;
        let rule = if w & QUIET_BIT != 0 {
            IdleRule::Quiet
        } else {
            IdleRule::Age
        };
        ((us > 0).then(|| Duration::from_micros(us)), rule)
    }

    /// Replaces the idle rule (`ExecConfig::idle_age`, `ExecConfig::idle_rule`) from now on;
    /// the open batch is judged by the new one at its next check.
    pub fn set_idle(&self, age: Option<Duration>, rule: IdleRule) {
        self.idle.store(idle_word(age, rule), Ordering::Relaxed);
    }

    /// True when fewer than `idle_inflight` submitted batches are not complete, as far as the
    /// completion callbacks have told (the poller thread polls while work is in flight, so
    /// this lags by at most a nap): the GPU is idle or runs its last queued batch.
    fn gpu_idle(&self) -> bool {
        self.submitted().saturating_sub(self.completed()) < self.cfg.idle_inflight.max(1)
    }

    /// Records one compute dispatch. `params` go to binding 0 (uniform); `buffers` are bound
    /// at bindings 1, 2, ... in order. Ranges must be aligned as the device requires.
    pub fn dispatch(
        &self,
        pipeline: &Pipeline,
        params: &[u8],
        buffers: &[BufferRange],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let t0 = hostlog::now();
        let b = self.batch.lock();
        let t1 = hostlog::now();
        hostlog::span_to(Kind::DispatchLock, t0, t1, 0);
        let r = self.dispatch_in(b, pipeline, params, buffers, groups);
        hostlog::span(Kind::DispatchHeld, t1, 0);
        r
    }

    fn dispatch_in(
        &self,
        mut b: parking_lot::MutexGuard<'_, Batch>,
        pipeline: &Pipeline,
        params: &[u8],
        buffers: &[BufferRange],
        groups: [u32; 3],
    ) -> Result<()> {
        if Self::timing_full(&b) {
            self.submit_locked(&mut b)?;
        }
        let psize = (params.len() as u64).max(16).next_multiple_of(16);
        let offset = (b.uniforms.len() as u64).next_multiple_of(self.uniform_align);
        if offset + psize > ARENA_SIZE {
            self.submit_locked(&mut b)?;
            return self.dispatch_locked(b, pipeline, params, buffers, groups, 0, psize);
        }
        self.dispatch_locked(b, pipeline, params, buffers, groups, offset, psize)
    }

    // `BindKey` holds `wgpu::Buffer`s, whose handles have interior mutability; their `Hash` and
    // `Eq` use the buffer's id only, which never changes.
    #[allow(clippy::too_many_arguments, clippy::mutable_key_type)]
    fn dispatch_locked(
        &self,
        mut b: parking_lot::MutexGuard<'_, Batch>,
        pipeline: &Pipeline,
        params: &[u8],
        buffers: &[BufferRange],
        groups: [u32; 3],
        offset: u64,
        psize: u64,
    ) -> Result<()> {
        // `TFWGPU_LOG=warn,tfwgpu_dispatch=trace`: every dispatch asked for, by its kernel's
        // label (before the binding checks below).
        tracing::trace!(target: "tfwgpu_dispatch", "{} {:?}", pipeline.label, groups);
        self.begin(&mut b);
        b.uniforms.resize(offset as usize, 0);
        b.uniforms.extend_from_slice(params);
        b.uniforms.resize((offset + psize) as usize, 0);
        // Dynamic storage offsets: the bind group binds each tensor's buffer at offset 0 (or,
        // past u32 offsets, at its own offset) and the dispatch passes the offsets.
        let dynamic_storage = pipeline.dynamic_storage
            && pipeline.storage_bindings == Some(buffers.len())
            && buffers.len() <= crate::kernel_manager::MAX_DYNAMIC_STORAGE;
        let fits = |r: &BufferRange| r.offset <= u32::MAX as u64;
        let static_offset = |r: &BufferRange| {
            if dynamic_storage && fits(r) {
                0
            } else {
                r.offset
            }
        };
        let mut offsets = [0u32; 1 + crate::kernel_manager::MAX_DYNAMIC_STORAGE];
        offsets[0] = offset as u32;
        let n_offsets = if dynamic_storage {
            for (o, r) in offsets[1..].iter_mut().zip(buffers) {
                *o = if fits(r) { r.offset as u32 } else { 0 };
            }
            1 + buffers.len()
        } else {
            1
        };
        let cached = pipeline
            .storage_bindings
            .filter(|&n| {
                n == buffers.len() && n <= MAX_CACHED_BINDINGS && self.cfg.bind_group_cache > 0
            })
            .map(|n| BindKey {
                storage: n,
                uniform_size: psize,
                buffers: std::array::from_fn(|i| {
                    buffers
                        .get(i)
                        .map(|r| (r.buffer.clone(), static_offset(r), binding_size(r)))
                }),
            });
        let (bind_group, dynamic) = match cached {
            Some(key) => {
                let found = b.bind_groups.map.get(&key).cloned();
                let bg = match found {
                    Some(bg) => bg,
                    None => {
                        let bg = self.bind_group(pipeline, 0, psize, buffers, static_offset);
                        let cache = &mut b.bind_groups.map;
                        if cache.len() >= self.cfg.bind_group_cache {
                            cache.clear();
                        }
                        cache.insert(key, bg.clone());
                        bg
                    }
                };
                (bg, Some(&offsets[..n_offsets]))
            }
            None if pipeline
                .storage_bindings
                .is_some_and(|n| n != buffers.len()) =>
            {
                return Err(Error::Gpu(format!(
                    "kernel {} binds {} tensors; its shader declares {}",
                    pipeline.label,
                    buffers.len(),
                    pipeline.storage_bindings.unwrap_or_default()
                )));
            }
            // A shared layout with a dynamic offset, but the cache is off or the dispatch binds
            // too many tensors: a bind group of its own, still at a dynamic offset.
            None if pipeline.storage_bindings.is_some() => (
                self.bind_group(pipeline, 0, psize, buffers, static_offset),
                Some(&offsets[..n_offsets]),
            ),
            None => (
                self.bind_group(pipeline, offset, psize, buffers, |r| r.offset),
                None,
            ),
        };
        let timing_on = self.timing.on.load(Ordering::Relaxed);
        let per_pass = self.timing.per_pass.load(Ordering::Relaxed);
        if b.pass.is_none() {
            let enc = b.encoder.as_mut().expect("encoder begun");
            let pass = enc
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime();
            b.pass = Some(pass);
            if timing_on && per_pass {
                let i = self.timing_index(&mut b, Arc::from(PASS_LABEL));
                let batch = &mut *b;
                if let (Some(pass), Some(t)) = (batch.pass.as_mut(), batch.timing.as_ref()) {
                    pass.write_timestamp(&t.slot.set, 2 * i);
                }
                batch.pass_timing = Some(i);
            }
        }
        let timed =
            (timing_on && !per_pass).then(|| self.timing_index(&mut b, pipeline.label.clone()));
        let batch = &mut *b;
        let pass = batch.pass.as_mut().expect("pass begun");
        let set = timed.and(batch.timing.as_ref()).map(|t| &t.slot.set);
        if let (Some(i), Some(set)) = (timed, set) {
            pass.write_timestamp(set, 2 * i);
        }
        pass.set_pipeline(&pipeline.pipeline);
        match dynamic {
            Some(o) => pass.set_bind_group(0, &bind_group, o),
            None => pass.set_bind_group(0, &bind_group, &[]),
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if let (Some(i), Some(set)) = (timed, set) {
            pass.write_timestamp(set, 2 * i + 1);
        }
        self.stats.lock().dispatches += 1;
        self.after_record(b)
    }

    /// A new bind group for `pipeline`: the uniform buffer at `uniform_offset` (0 for the
    /// shared layouts, whose offset is dynamic), then `buffers`, each at `storage_offset` of it
    /// (its own offset, or 0 where the layout's storage offsets are dynamic).
    fn bind_group(
        &self,
        pipeline: &Pipeline,
        uniform_offset: u64,
        uniform_size: u64,
        buffers: &[BufferRange],
        storage_offset: impl Fn(&BufferRange) -> u64,
    ) -> wgpu::BindGroup {
        let mut entries = Vec::with_capacity(buffers.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.uniform_buffer,
                offset: uniform_offset,
                size: wgpu::BufferSize::new(uniform_size),
            }),
        });
        for (i, r) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &r.buffer,
                    offset: storage_offset(r),
                    size: wgpu::BufferSize::new(binding_size(r)),
                }),
            });
        }
        self.stats.lock().bind_groups += 1;
        let t0 = hostlog::now();
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.layout,
            entries: &entries,
        });
        hostlog::span(Kind::BindGroupNew, t0, 0);
        bg
    }

    /// Records a buffer-to-buffer copy (offsets and size multiples of 4).
    pub fn copy(
        &self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) -> Result<()> {
        self.record_on_encoder("copy", size, |enc| {
            enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, size)
        })?;
        self.stats.lock().copies += (size > 0) as u64;
        Ok(())
    }

    /// Records a fill of a range with zero bytes (offset and size multiples of 4).
    pub fn clear(&self, dst: &wgpu::Buffer, offset: u64, size: u64) -> Result<()> {
        self.record_on_encoder("clear", size, |enc| {
            enc.clear_buffer(dst, offset, Some(size))
        })
    }

    /// Records a command that needs the encoder outside a compute pass (copies, clears).
    fn record_on_encoder(
        &self,
        label: &'static str,
        size: u64,
        f: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let mut b = self.batch.lock();
        if Self::timing_full(&b) {
            self.submit_locked(&mut b)?;
        }
        self.begin(&mut b);
        Self::end_pass(&mut b);
        let timed = (self.timing.on.load(Ordering::Relaxed)
            && self.timing.transfers.load(Ordering::Relaxed))
        .then(|| self.timing_index(&mut b, Arc::from(label)));
        let batch = &mut *b;
        let enc = batch.encoder.as_mut().expect("encoder begun");
        let set = timed.and(batch.timing.as_ref()).map(|t| &t.slot.set);
        if let (Some(i), Some(set)) = (timed, set) {
            enc.write_timestamp(set, 2 * i);
        }
        f(enc);
        if let (Some(i), Some(set)) = (timed, set) {
            enc.write_timestamp(set, 2 * i + 1);
        }
        self.after_record(b)
    }

    /// True when the open batch has no timestamp queries left for one more command.
    fn timing_full(b: &Batch) -> bool {
        b.timing
            .as_ref()
            .is_some_and(|t| (t.labels.len() as u32 + 1) * 2 > TIMING_QUERIES)
    }

    /// Reserves the next pair of timestamp queries of the open batch for a command.
    fn timing_index(&self, b: &mut Batch, label: Arc<str>) -> u32 {
        let t = b.timing.get_or_insert_with(|| BatchTiming {
            slot: self
                .timing
                .slots
                .lock()
                .pop()
                .unwrap_or_else(|| self.timing_slot()),
            labels: vec![],
        });
        t.labels.push(label);
        t.labels.len() as u32 - 1
    }

    fn timing_slot(&self) -> TimingSlot {
        let bytes = TIMING_QUERIES as u64 * wgpu::QUERY_SIZE as u64;
        TimingSlot {
            set: self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("tfwgpu timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: TIMING_QUERIES,
            }),
            resolve: self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tfwgpu timestamps resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tfwgpu timestamps readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        }
    }

    /// Turns GPU timing on or off. While on, every dispatch (and, where the device can, every
    /// copy and clear) is bracketed by timestamps; [`Self::take_timings`] returns them. Needs
    /// TIMESTAMP_QUERY and TIMESTAMP_QUERY_INSIDE_PASSES; costs two timestamp writes per
    /// command and one small readback per batch, so it is for measuring, not for production.
    pub fn set_timing(&self, on: bool) -> Result<()> {
        let f = self.device.features();
        let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        if on && !f.contains(need) {
            return Err(Error::Unimplemented(
                "GPU timing needs TIMESTAMP_QUERY and TIMESTAMP_QUERY_INSIDE_PASSES, which this \
                 adapter lacks"
                    .into(),
            ));
        }
        self.timing.transfers.store(
            f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
            Ordering::Relaxed,
        );
        self.timing.on.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// While timing is on, time each compute pass (a batch's run of dispatches between copies)
    /// as one command labelled [`PASS_LABEL`] instead of every dispatch; copies and clears are
    /// still timed one by one. Two timestamp writes per pass instead of two per dispatch: the
    /// timed work runs nearly as it does untimed (a timestamp inside a pass waits for the work
    /// before it, which costs the GPU several microseconds per dispatch), at the price of not
    /// telling the dispatches of a pass apart (the launch and barrier latency between them
    /// counts as part of the pass). Takes effect from the next pass.
    pub fn set_timing_per_pass(&self, per_pass: bool) {
        self.timing.per_pass.store(per_pass, Ordering::Relaxed);
    }

    /// True while GPU timing is on.
    pub fn timing(&self) -> bool {
        self.timing.on.load(Ordering::Relaxed)
    }

    /// Waits for all work recorded so far and returns the timings of every command timed since
    /// the last call, in submission order.
    pub fn take_timings(&self) -> Result<Vec<DispatchTiming>> {
        self.synchronize()?;
        let pending = std::mem::take(&mut *self.timing.pending.lock());
        let period = self.queue.get_timestamp_period() as f64;
        let mut out = vec![];
        for p in pending {
            let r = loop {
                if let Some(r) = p.mapped.lock().take() {
                    break r;
                }
                self.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::DeviceLost(e.to_string()))?;
            };
            r.map_err(|e| Error::Gpu(format!("mapping timestamps: {e}")))?;
            let n = p.timing.labels.len() * 2;
            {
                let view = p
                    .timing
                    .slot
                    .readback
                    .slice(..(n * 8) as u64)
                    .get_mapped_range()
                    .map_err(|e| Error::Gpu(format!("reading timestamps: {e}")))?;
                let ticks: &[u64] = bytemuck::cast_slice(&view);
                for (i, label) in p.timing.labels.iter().enumerate() {
                    let (s, e) = (ticks[2 * i], ticks[2 * i + 1]);
                    out.push(DispatchTiming {
                        batch: p.batch,
                        label: label.clone(),
                        start_ns: s as f64 * period,
                        end_ns: e.max(s) as f64 * period,
                    });
                }
            }
            p.timing.slot.readback.unmap();
            self.timing.slots.lock().push(p.timing.slot);
        }
        Ok(out)
    }

    /// Stages host bytes and records their copy into `dst`; does not wait for the GPU.
    /// `offset` and `data.len()` must be multiples of 4.
    pub fn upload(&self, dst: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let size = data.len() as u64;
        if self.cfg.direct_upload_bytes > 0 && size >= self.cfg.direct_upload_bytes {
            if self.cfg.upload_submit && self.cfg.direct_unlocked {
                return self.upload_direct(dst, offset, data);
            }
            // A large upload (a model's input batch) goes through the queue's own staging:
            // `Queue::write_buffer` copies the bytes into a staging buffer it allocates without
            // zero-filling it, whereas a buffer mapped at creation is zero-filled by wgpu first
            // (ResNet-50's 38.5 MB batch: one pass over the memory fewer). The queue runs such
            // writes before the command buffers of the next submit, so the open batch is
            // submitted first, under the batch lock: every command recorded before this upload
            // runs before it, every command recorded after it runs after it.
            let t0 = hostlog::now();
            let mut b = self.batch.lock();
            let t1 = hostlog::now();
            hostlog::span_to(Kind::DirectLock, t0, t1, size);
            // Queue writes run before the next submit's commands: the batches recorded before
            // this upload must all be on the queue first (another thread may still be
            // submitting one it took), and none may go out between them and the write (none
            // can be taken while the batch lock is held).
            if b.ops > 0 {
                let taken = self.take_locked(&mut b);
                self.submit_taken(taken)?;
            } else {
                self.await_submitted(b.id - 1);
            }
            let t2 = hostlog::now();
            hostlog::span_to(Kind::DirectSubmit, t1, t2, 0);
            match self.queue.write_buffer_with(
                dst,
                offset,
                wgpu::BufferSize::new(size).expect("nonempty"),
            ) {
                Some(mut view) => {
                    let t3 = hostlog::now();
                    hostlog::span_to(Kind::DirectStage, t2, t3, size);
                    parallel_copy(view.slice(..), data, upload_threads());
                    hostlog::span(Kind::DirectCopy, t3, size);
                }
                // Invalid (wgpu reports why through the device's error): as before.
                None => self.queue.write_buffer(dst, offset, data),
            }
            // The queue holds the write until its next submit: submit it now (an empty
            // submit carries the queue's pending writes).
            if self.cfg.upload_submit {
                let t4 = hostlog::now();
                self.queue.submit([]);
                hostlog::span(Kind::DirectQueueSubmit, t4, 0);
            }
            drop(b);
            self.stats.lock().uploads += 1;
            return self.check();
        }
        if size <= self.cfg.arena_upload_bytes {
            return self.upload_via_arena(dst, offset, data);
        }
        let t0 = hostlog::now();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tfwgpu upload"),
            size,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut view = staging
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Gpu(format!("mapping an upload buffer: {e}")))?;
            view.copy_from_slice(data);
        }
        staging.unmap();
        hostlog::span(Kind::StagedBuffer, t0, size);
        self.stats.lock().uploads += 1;
        // wgpu keeps the staging buffer alive until the copy has executed.
        self.copy(&staging, 0, dst, offset, size)
    }

    /// A large upload (a model's input batch) through the queue's own staging, in its own place
    /// in the submit order, without holding the batch lock while it stages, copies or submits.
    ///
    /// `Queue::write_buffer_with` hands out staging memory that wgpu allocates without
    /// zero-filling it (a buffer mapped at creation is zero-filled first: ResNet-50's 38.5 MB
    /// batch, one pass over the memory fewer); the host copies the bytes into it (split over a
    /// few threads: one thread writes ~9 GB/s into the H200's write-combined upload memory). The
    /// queue runs such a write before the command buffers of its next submit, so the write is
    /// handed to the queue (the view dropped) in its turn: after every batch recorded before
    /// this upload is on the queue, before any batch recorded after it. Under the batch lock
    /// the upload only takes the open batch and the next batch id for itself (the write's
    /// place); the open batch is submitted, the write handed over and submitted (an empty
    /// submit carries the queue's pending writes) outside the lock, in turn, while other
    /// threads record into the next batch (whose submit waits for this one). Held under the
    /// lock, the two submits and the copy made every other upload and dispatch of the step wait
    /// (the Keras CNN's 200 KB input batch on the H200: ~180 us, its five small uploads ~100 us
    /// each; bench/RESULTS.md, session 10, host10). With a submit thread
    /// (`ExecConfig::submit_thread`), the open batch and the write go to it, and this thread
    /// returns once the bytes are staged (outside the lock, the uploading thread spent ~180 us
    /// per CNN step waiting for its place and submitting: its consumers wait for it).
    fn upload_direct(&self, dst: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        let size = data.len() as u64;
        let t0 = hostlog::now();
        let Some(mut view) = self.queue.write_buffer_with(
            dst,
            offset,
            wgpu::BufferSize::new(size).expect("nonempty"),
        ) else {
            // Invalid (wgpu reports why through the device's error).
            return self.check();
        };
        let t1 = hostlog::now();
        hostlog::span_to(Kind::DirectStage, t0, t1, size);
        parallel_copy(view.slice(..), data, upload_threads());
        let t2 = hostlog::now();
        hostlog::span_to(Kind::DirectCopy, t1, t2, size);
        let (taken, place, view) = {
            let mut b = self.batch.lock();
            let taken = if b.ops > 0 {
                self.take_locked(&mut b)
            } else {
                None
            };
            let place = b.id;
            b.id += 1;
            // Work recorded from now on completes after the write.
            self.recorded_tag.store(place, Ordering::Release);
            // With a submit thread, the open batch and then the write go to it, sent before the
            // batch lock is let go (see `after_record`): this thread returns as soon as the
            // bytes are staged (TensorFlow's `memcpy_htod`, whose consumers wait for it).
            match self.submitter.get() {
                Some(tx) => match taken.and_then(|t| send_batch(tx, t)) {
                    None => match tx.send(Job::Write(view, place)) {
                        Ok(()) => {
                            drop(b);
                            hostlog::span(Kind::DirectLock, t2, 1);
                            self.stats.lock().uploads += 1;
                            return self.check();
                        }
                        Err(e) => match e.0 {
                            Job::Write(view, _) => (None, place, view),
                            Job::Batch(_) => unreachable!("a write was sent"),
                        },
                    },
                    // The thread is gone: both here, in order.
                    taken => (taken, place, view),
                },
                None => (taken, place, view),
            }
        };
        hostlog::span(Kind::DirectLock, t2, 0);
        self.stats.lock().uploads += 1;
        // The open batch first (its turn), then the write in the place after it.
        let first = match taken {
            Some(t) => self.submit_in_turn(t),
            None => Ok(()),
        };
        let second = self.write_in_place(view, place);
        first?;
        second
    }

    /// Hands a large upload's staged bytes to the queue in `place` (a batch id reserved for
    /// it, see [`Self::upload_direct`]): waits until every batch before it is on the queue,
    /// drops the view (the queue runs the write before the command buffers of its next
    /// submit) and submits at once (an empty submit carries the queue's pending writes), so
    /// the GPU copies while the host records what follows; then the next batch may go.
    fn write_in_place(&self, view: wgpu::QueueWriteBufferView, place: u64) -> Result<()> {
        let t0 = hostlog::now();
        self.await_submitted(place - 1);
        let t1 = hostlog::now();
        hostlog::span_to(Kind::DirectSubmit, t0, t1, place);
        drop(view);
        let index = self.queue.submit([]);
        let shared = self.shared.clone();
        self.queue.on_submitted_work_done(move || {
            shared.completed.fetch_max(place, Ordering::AcqRel);
        });
        self.inflight.lock().push_back((place, index));
        {
            let _g = self.turn.lock();
            self.submitted.store(place, Ordering::Release);
            self.turn_cv.notify_all();
        }
        // (The empty submit is not counted as a batch's, as before.)
        hostlog::span(Kind::DirectQueueSubmit, t1, place);
        self.check()
    }

    /// A small upload through the open batch's uniform arena: the bytes are appended to the
    /// arena (which `submit_locked` writes to the uniform buffer before the batch's commands
    /// run) and a copy from there to `dst` is recorded in order, like any copy. A full arena
    /// submits the batch first.
    fn upload_via_arena(&self, dst: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        let size = data.len() as u64;
        let t0 = hostlog::now();
        let mut b = self.batch.lock();
        let t1 = hostlog::now();
        hostlog::span_to(Kind::ArenaLock, t0, t1, size);
        if Self::timing_full(&b) {
            self.submit_locked(&mut b)?;
        }
        let mut at = (b.uniforms.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if at + size > ARENA_SIZE {
            self.submit_locked(&mut b)?;
            at = 0;
        }
        self.begin(&mut b);
        Self::end_pass(&mut b);
        b.uniforms.resize(at as usize, 0);
        b.uniforms.extend_from_slice(data);
        let batch = &mut *b;
        let enc = batch.encoder.as_mut().expect("encoder begun");
        enc.copy_buffer_to_buffer(&self.uniform_buffer, at, dst, offset, size);
        {
            let mut st = self.stats.lock();
            st.uploads += 1;
            st.copies += 1;
        }
        let t2 = hostlog::now();
        hostlog::span_to(Kind::ArenaRecord, t1, t2, size);
        let submitted = b.id;
        let r = self.after_record(b);
        hostlog::span(Kind::ArenaAfter, t2, (self.submitted() >= submitted) as u64);
        r
    }

    /// Submits the current batch (if it holds anything); returns the id up to which all recorded
    /// work has been submitted.
    pub fn flush(&self) -> Result<u64> {
        let mut b = self.batch.lock();
        let id = if b.ops > 0 { b.id } else { b.id - 1 };
        let taken = (b.ops > 0).then(|| self.take_locked(&mut b)).flatten();
        drop(b);
        if taken.is_none() {
            // A batch another thread took may still be on its way to the queue.
            self.await_submitted(id);
            return Ok(id);
        }
        self.submit_taken(taken)?;
        Ok(id)
    }

    /// [`Self::flush`] on the calling thread that runs `before_submit` with the queue right
    /// before the submit of the open batch, with no other submit of this queue in between
    /// (what wgpu-hal's staged semaphores attach to: the queue's next submit). Without an open
    /// batch, an empty submit (once every batch taken before is on the queue; none can be taken
    /// meanwhile). Returns the id up to which recorded work is submitted.
    pub(crate) fn flush_with(&self, before_submit: BeforeSubmit) -> Result<u64> {
        let mut b = self.batch.lock();
        if b.ops > 0
            && let Some(mut taken) = self.take_locked(&mut b)
        {
            drop(b);
            let id = taken.id;
            taken.before_submit = Some(before_submit);
            self.submit_in_turn(taken)?;
            return Ok(id);
        }
        let id = b.id - 1;
        self.await_submitted(id);
        before_submit(&self.queue);
        self.queue.submit([]);
        drop(b);
        self.check()?;
        Ok(id)
    }

    /// [`Self::flush`] that hands the open batch to the device's submit thread when there is
    /// one (`ExecConfig::submit_thread`) instead of encoding and submitting it on the calling
    /// thread: returns the same id, but the batch reaches the queue shortly after (in order).
    /// For syncs that only bound how far the host runs ahead (the plugin's ordered
    /// `synchronize_all_activity`: Keras fit's `has_value()` every step on Python's thread).
    /// An error of that submit is reported by a later check.
    pub fn flush_async(&self) -> Result<u64> {
        let Some(tx) = self.submitter.get() else {
            return self.flush();
        };
        let mut b = self.batch.lock();
        if b.ops == 0 {
            drop(b);
            return self.flush();
        }
        let id = b.id;
        if let Some(t) = self.take_locked(&mut b)
            && let Some(t) = send_batch(tx, t)
        {
            drop(b);
            self.submit_in_turn(t)?;
        }
        Ok(id)
    }

    /// Ends the open compute pass, writing its end timestamp when passes are timed.
    fn end_pass(b: &mut Batch) {
        if let Some(i) = b.pass_timing.take()
            && let (Some(pass), Some(t)) = (b.pass.as_mut(), b.timing.as_ref())
        {
            pass.write_timestamp(&t.slot.set, 2 * i + 1);
        }
        b.pass = None;
    }

    /// Submits the open batch while the batch lock is held (paths that go on recording into
    /// the next batch under the same lock).
    fn submit_locked(&self, b: &mut Batch) -> Result<()> {
        let taken = self.take_locked(b);
        self.submit_taken(taken)
    }

    /// Takes the open batch out for submission: its encoder, uniforms, timing and id. The
    /// caller may release the batch lock before [`Self::submit_taken`] (or hand the batch to
    /// the submit thread): recording into the next batch then proceeds while this one is
    /// encoded and submitted (wgpu encodes a compute pass's commands when its encoder
    /// finishes). Batches still reach the queue in id order (`submit_in_turn`).
    fn take_locked(&self, b: &mut Batch) -> Option<Taken> {
        Self::end_pass(b);
        let encoder = b.encoder.take()?;
        let taken = Taken {
            encoder,
            uniforms: std::mem::take(&mut b.uniforms),
            timing: b.timing.take(),
            id: b.id,
            before_submit: None,
        };
        b.id += 1;
        b.ops = 0;
        b.started = None;
        b.last = None;
        Some(taken)
    }

    /// Encodes and submits a batch taken by [`Self::take_locked`].
    fn submit_taken(&self, taken: Option<Taken>) -> Result<()> {
        match taken {
            Some(t) => self.submit_in_turn(t),
            None => Ok(()),
        }
    }

    /// Blocks until every batch up to `id` is on the queue.
    fn await_submitted(&self, id: u64) {
        if self.submitted() >= id {
            return;
        }
        let mut g = self.turn.lock();
        while self.submitted() < id {
            self.turn_cv.wait(&mut g);
        }
    }

    /// Waits until the batch before `taken` is on the queue, then encodes and submits it.
    /// Only the thread holding the next id passes, so submits (and the uniform arena's write
    /// before each) never overlap.
    fn submit_in_turn(&self, taken: Taken) -> Result<()> {
        let t0 = hostlog::now();
        self.await_submitted(taken.id - 1);
        let t1 = hostlog::now();
        hostlog::span_to(Kind::SubmitTurn, t0, t1, taken.id);
        let Taken {
            mut encoder,
            uniforms,
            timing,
            id,
            before_submit,
        } = taken;
        let timing = timing.filter(|t| !t.labels.is_empty());
        let timing_bytes = timing.as_ref().map(|t| {
            let n = t.labels.len() as u32 * 2;
            encoder.resolve_query_set(&t.slot.set, 0..n, &t.slot.resolve, 0);
            let bytes = n as u64 * wgpu::QUERY_SIZE as u64;
            encoder.copy_buffer_to_buffer(&t.slot.resolve, 0, &t.slot.readback, 0, bytes);
            bytes
        });
        let t2 = hostlog::now();
        if !uniforms.is_empty() {
            self.queue.write_buffer(&self.uniform_buffer, 0, &uniforms);
        }
        let t3 = hostlog::now();
        hostlog::span_to(Kind::SubmitUniforms, t2, t3, uniforms.len() as u64);
        let cb = encoder.finish();
        let t4 = hostlog::now();
        hostlog::span_to(Kind::SubmitFinish, t3, t4, id);
        if let Some(f) = before_submit {
            f(&self.queue);
        }
        let index = self.queue.submit([cb]);
        hostlog::span(Kind::SubmitQueue, t4, id);
        let shared = self.shared.clone();
        self.queue.on_submitted_work_done(move || {
            shared.completed.fetch_max(id, Ordering::AcqRel);
        });
        if let (Some(timing), Some(bytes)) = (timing, timing_bytes) {
            let mapped = Arc::new(Mutex::new(None));
            let m = mapped.clone();
            timing
                .slot
                .readback
                .slice(..bytes)
                .map_async(wgpu::MapMode::Read, move |r| *m.lock() = Some(r));
            let mut pending = self.timing.pending.lock();
            // Nobody is taking them: keep the newest, drop the oldest.
            if pending.len() >= 4096 {
                pending.remove(0);
            }
            pending.push(PendingTiming {
                batch: id,
                timing,
                mapped,
            });
        }
        self.inflight.lock().push_back((id, index));
        {
            let _g = self.turn.lock();
            self.submitted.store(id, Ordering::Release);
            self.turn_cv.notify_all();
        }
        self.stats.lock().submits += 1;
        hostlog::span(Kind::Submit, t1, id);
        self.check()
    }

    /// Blocks until batch `id` (and every one before it) has completed; submits first if needed.
    pub fn wait(&self, id: u64) -> Result<()> {
        if self.completed() >= id {
            return self.check();
        }
        if self.submitted() < id {
            self.flush()?;
        }
        let index = {
            let mut q = self.inflight.lock();
            let done = self.completed();
            while q.front().is_some_and(|(i, _)| *i <= done) {
                q.pop_front();
            }
            q.iter().find(|(i, _)| *i >= id).map(|(_, s)| s.clone())
        };
        let spin = self.cfg.spin.unwrap_or_default();
        if !spin.is_zero() {
            let t0 = Instant::now();
            loop {
                let spun = t0.elapsed();
                if spun >= spin {
                    break;
                }
                let _ = self.device.poll(wgpu::PollType::Poll);
                if self.completed() >= id {
                    return self.check();
                }
                // Past the tight span, the spin gives way to any other thread that wants this
                // core between two polls.
                if spun >= TIGHT_SPIN {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        if let Some(index) = index {
            let _w = HostSpan::start(Kind::Wait, id);
            self.device
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: None,
                })
                .map_err(|e| match e {
                    wgpu::PollError::Timeout => Error::Gpu("timed out waiting for the GPU".into()),
                    other => Error::DeviceLost(other.to_string()),
                })?;
        }
        // Completion callbacks for the waited-for submission have run by now.
        if self.completed() < id {
            self.shared.completed.fetch_max(id, Ordering::AcqRel);
        }
        self.check()
    }

    /// Blocks until all work recorded so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        let id = self.flush()?;
        self.wait(id)
    }

    /// Copies `size` bytes at `offset` of `src` back to the host: the one blocking call.
    /// `offset` and `size` must be multiples of 4.
    pub fn read(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let pending = self.read_begin(src, offset, size)?;
        self.read_finish(pending, |bytes| bytes.to_vec())
    }

    /// Starts a read of `size` bytes at `offset` of `src`: records the copy into a mappable
    /// staging buffer and submits it, without waiting. [`ExecutionContext::read_finish`] waits
    /// for it and hands out the bytes. `offset` and `size` must be multiples of 4.
    pub fn read_begin(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<PendingRead> {
        if size == 0 {
            return Ok(PendingRead::empty());
        }
        // A host sync of a small value (a loss, a step counter) is on the critical path of a
        // training step: reuse readback buffers instead of creating one per read.
        let class = if size <= READ_POOL_MAX_BYTES {
            size.next_power_of_two().max(256)
        } else {
            size
        };
        let pooled = {
            let mut pool = self.read_pool.lock();
            let i = pool.iter().position(|b| b.size() == class);
            i.map(|i| pool.swap_remove(i))
        };
        let staging = pooled.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tfwgpu readback"),
                size: class,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        self.copy(src, offset, &staging, 0, size)?;
        let id = self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Ok(PendingRead {
            staging: Some(staging),
            size,
            id,
            mapped: Some(rx),
        })
    }

    /// Waits for a read started by [`ExecutionContext::read_begin`] on this context and calls
    /// `f` with its bytes (valid only during the call: the staging buffer is unmapped after).
    pub fn read_finish<R>(&self, pending: PendingRead, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let (Some(staging), Some(rx)) = (pending.staging, pending.mapped) else {
            return Ok(f(&[]));
        };
        self.wait(pending.id)?;
        // The map callback fires in a poll after the copy completed.
        let result = loop {
            match rx.try_recv() {
                Ok(r) => break r,
                Err(_) => {
                    self.device
                        .poll(wgpu::PollType::wait_indefinitely())
                        .map_err(|e| Error::DeviceLost(e.to_string()))?;
                }
            }
        };
        result.map_err(|e| Error::Gpu(format!("mapping a readback buffer: {e}")))?;
        let out = {
            let view = staging
                .slice(..pending.size)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("reading a readback buffer: {e}")))?;
            f(&view)
        };
        staging.unmap();
        if staging.size() <= READ_POOL_MAX_BYTES {
            let mut pool = self.read_pool.lock();
            if pool.len() < READ_POOL_BUFFERS {
                pool.push(staging);
            }
        }
        self.stats.lock().reads += 1;
        Ok(out)
    }

    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Runs the completion callbacks of finished batches now (a non-blocking poll), for a
    /// caller that checks [`ExecutionContext::completed`] in a loop and should not wait for the
    /// background thread's next round.
    pub fn poll_completions(&self) {
        self.poll_once();
    }

    fn poll_once(&self) {
        if self.submitted() > self.completed() {
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
    }

    /// Submits the open batch when it is older than `max_age`, or when the GPU ran out of
    /// work and the batch is due by `idle_ops` or the idle rule (see `ExecConfig::idle_ops`,
    /// [`IdleRule`]).
    fn flush_if_due(&self) {
        let (age, rule) = self.idle();
        let mut b = self.batch.lock();
        let since = match rule {
            IdleRule::Age => b.started,
            IdleRule::Quiet => b.last,
        };
        if !(b.ops > 0
            && (b.started.is_some_and(|t| t.elapsed() >= self.cfg.max_age)
                || (self.cfg.due_when_idle(b.ops, age, since) && self.gpu_idle())))
        {
            return;
        }
        let taken = self.take_locked(&mut b);
        drop(b);
        if let Err(e) = self.submit_taken(taken) {
            tracing::warn!("background submit: {e}");
            // Keep the error for the next caller that checks.
            let mut slot = self.shared.error.lock();
            if slot.is_none() {
                *slot = Some(e);
            }
        }
    }

    fn busy(&self) -> bool {
        let b = self.batch.lock();
        // A batch taken out of the lock but not yet on the queue counts (see `take_locked`).
        b.ops > 0 || b.id - 1 > self.submitted() || self.submitted() > self.completed()
    }
}

impl Drop for ExecutionContext {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let mut w = self.shared.wake_lock.lock();
            *w = true;
            self.shared.wake.notify_all();
        }
        if let Some(h) = self.poller.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}

/// Sends a batch to the submit thread; gives it back if the thread is gone.
fn send_batch(tx: &std::sync::mpsc::Sender<Job>, t: Taken) -> Option<Taken> {
    match tx.send(Job::Batch(t)) {
        Ok(()) => None,
        Err(e) => match e.0 {
            Job::Batch(t) => Some(t),
            Job::Write(..) => unreachable!("a batch was sent"),
        },
    }
}

/// Threads that copy a large upload into staging memory (`TFWGPU_UPLOAD_THREADS`; default:
/// up to 4, as the machine has cores).
fn upload_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        env_parse::<usize>("TFWGPU_UPLOAD_THREADS")
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
    })
}

/// Into how many parts of at least 4 MiB, at most `threads`, a host copy of `len` bytes splits.
fn copy_parts(len: usize, threads: usize) -> usize {
    const MIN_PART: usize = 4 << 20;
    threads.min(len / MIN_PART).max(1)
}

/// Copies mapped readback memory `src` into `dst` (of the same length) with up to
/// `threads` threads (`TFWGPU_UPLOAD_THREADS`), each taking a contiguous part of at least
/// 4 MiB. Reading mapped memory is slow for one core (the H200's readback memory: ~1.4 GB/s
/// for one thread): several threads keep more reads in flight.
pub(crate) fn parallel_read(dst: &mut [u8], src: &[u8]) {
    let parts = copy_parts(src.len(), upload_threads());
    if parts == 1 || dst.len() != src.len() {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(parts);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(part).zip(src.chunks(part)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// Copies `src` into `dst` (of the same length) with up to `threads` threads, each taking a
/// contiguous part of at least 4 MiB.
fn parallel_copy(mut dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8], threads: usize) {
    let parts = copy_parts(src.len(), threads);
    if parts == 1 || dst.len() != src.len() {
        dst.copy_from_slice(src);
        return;
    }
    /// A part's destination, sent to its thread.
    struct Dst(std::ptr::NonNull<u8>);
    // SAFETY: each thread writes its own disjoint range of the mapping, which outlives the
    // scope (`dst` is borrowed until it ends).
    unsafe impl Send for Dst {}
    let base = dst.as_raw_ptr().cast::<u8>();
    let part = src.len().div_ceil(parts);
    std::thread::scope(|s| {
        for (k, chunk) in src.chunks(part).enumerate() {
            // SAFETY: k * part < src.len() == dst.len(): inside the mapping.
            let to = Dst(unsafe { base.add(k * part) });
            s.spawn(move || {
                let to = to;
                // SAFETY: `chunk.len()` bytes from `to` lie inside the mapping, disjoint from
                // every other thread's; the mapping is valid for writes.
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), to.0.as_ptr(), chunk.len()) }
            });
        }
    });
}

/// The size a storage binding of `r` has: at least 4 bytes, whole words.
fn binding_size(r: &BufferRange) -> u64 {
    r.size.max(4).next_multiple_of(4)
}

/// Background thread: submits batches that grew old and polls the device so that completion
/// callbacks run. Sleeps while there is nothing to do.
fn poller(weak: std::sync::Weak<ExecutionContext>, shared: Arc<Shared>) {
    let mut nap = Duration::from_micros(50);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        // Clear the wake flag before looking for work: work begun after this sets it again.
        *shared.wake_lock.lock() = false;
        let busy = {
            let Some(ctx) = weak.upgrade() else { return };
            // Poll first: completions seen now let an idle GPU get the open batch at once.
            let t0 = hostlog::now();
            ctx.poll_once();
            let t1 = hostlog::now();
            if ctx.submitted() > ctx.completed() || t1 > t0 + 2000 {
                hostlog::span_to(Kind::Poll, t0, t1, 0);
            }
            ctx.flush_if_due();
            let t2 = hostlog::now();
            if t2 > t1 + 2000 {
                hostlog::span_to(Kind::PollerFlush, t1, t2, 0);
            }
            ctx.busy()
        };
        if busy {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_micros(100));
        } else {
            nap = Duration::from_micros(50);
            let mut w = shared.wake_lock.lock();
            if !*w && !shared.stop.load(Ordering::Acquire) {
                shared.wake.wait_for(&mut w, Duration::from_millis(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: f64, e: f64) -> DispatchTiming {
        DispatchTiming {
            batch: 1,
            label: Arc::from("k"),
            start_ns: s,
            end_ns: e,
        }
    }

    /// `flush_with`'s closure runs once per call, before the call returns, with the open batch
    /// submitted (its id returned) or, without one, with an empty submit after the batches
    /// before it.
    #[test]
    fn flush_with_runs_its_closure_in_the_batch_submit() {
        let rt = crate::Runtime::new().expect("an adapter");
        let ex = rt.device().exec();
        let calls = Arc::new(AtomicU64::new(0));
        let f = |c: &Arc<AtomicU64>| -> BeforeSubmit {
            let c = c.clone();
            Box::new(move |_q| {
                c.fetch_add(1, Ordering::SeqCst);
            })
        };
        let dst = ex.device().create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 256,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        ex.synchronize().unwrap();
        let before = ex.submitted();
        ex.clear(&dst, 0, 256).unwrap();
        let id = ex.flush_with(f(&calls)).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(
            id > before,
            "the open batch was submitted: {id} after {before}"
        );
        assert!(ex.submitted() >= id);
        // Nothing open: an empty submit carries it; the id is the last batch's.
        let again = ex.flush_with(f(&calls)).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(again, id);
        ex.synchronize().unwrap();
    }

    #[test]
    fn summary_counts_overlaps_once() {
        let s = TimingSummary::of(&[t(10.0, 20.0), t(15.0, 25.0), t(40.0, 50.0), t(41.0, 42.0)]);
        assert_eq!(s.commands, 4);
        assert_eq!(s.span_ns, 40.0);
        assert_eq!(s.busy_ns, 25.0);
        assert_eq!(s.sum_ns, 31.0);
        assert_eq!(TimingSummary::of(&[]), TimingSummary::default());
    }
}
