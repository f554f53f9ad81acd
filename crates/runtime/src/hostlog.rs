//! A timeline of the host's spans inside the runtime and the plugin (`TFWGPU_HOST_LOG=FILE`):
//! where a host-to-device copy, a submit, a dispatch's lock or a device poll spends its wall
//! time, on which thread, and what ran on the other threads meanwhile. A measuring mode: off,
//! each span costs one check of a flag; on, two clock reads and a push under a lock.
//!
//! Spans are kept in memory (at most [`MAX_SPANS`]) and written as JSON to FILE when
//! [`dump`] is called (the plugin does so at process exit). [`reset`] drops what was kept
//! (after a warm-up); [`mark`] adds a zero-length span with a label (a phase of the program).
//! `bench/hostlog.py` summarises a file.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// Spans kept at most (the newest are dropped past it).
pub const MAX_SPANS: usize = 1 << 21;

/// What a span times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A mark of the program ([`mark`]); `arg` is the label's index.
    Mark,
    /// The plugin's `memcpy_htod`, whole; `arg` = bytes.
    Htod,
    /// `Device::write` resolving the address (allocator lock).
    WriteResolve,
    /// The byte-masked fill of a write's last 1-3 bytes (a dispatch).
    WriteTail,
    /// Waiting for the batch lock in an upload through the uniform arena; `arg` = bytes.
    ArenaLock,
    /// An upload through the arena under the batch lock, up to its `after_record`.
    ArenaRecord,
    /// `after_record` of an upload (`arg` = 1: it took the batch for submission).
    ArenaAfter,
    /// `create_command_encoder` when a batch begins.
    EncoderNew,
    /// Waiting for the batch lock in a large (direct) upload; `arg` = bytes.
    DirectLock,
    /// A direct upload's submit of the open batch (under the lock).
    DirectSubmit,
    /// `Queue::write_buffer_with` (the queue's staging allocation) of a direct upload.
    DirectStage,
    /// The host's copy into that staging memory.
    DirectCopy,
    /// The empty submit that hands the queue's write to the GPU.
    DirectQueueSubmit,
    /// A medium upload's own staging buffer: created mapped, filled, unmapped; `arg` = bytes.
    StagedBuffer,
    /// `submit_now` from its turn to its end; `arg` = batch id.
    Submit,
    /// Waiting for the previous batch to be on the queue (`await_submitted` in `submit_now`).
    SubmitTurn,
    /// `CommandEncoder::finish` (wgpu encodes the batch's commands here).
    SubmitFinish,
    /// `Queue::write_buffer` of the batch's uniforms.
    SubmitUniforms,
    /// `Queue::submit`.
    SubmitQueue,
    /// Waiting for the batch lock in a dispatch.
    DispatchLock,
    /// A dispatch under the batch lock, `after_record` included (`arg` = 1: it submitted).
    DispatchHeld,
    /// `create_bind_group` (a bind group the cache did not hold).
    BindGroupNew,
    /// The poller's `Device::poll`.
    Poll,
    /// The poller's `flush_if_due` (batch lock, maybe a submit).
    PollerFlush,
    /// A kernel's compute callback in the plugin; `arg` = the op's label index.
    Compute,
    /// The plugin's `synchronize_all_activity`.
    Sync,
    /// The plugin's `memcpy_dtoh`; `arg` = bytes.
    Dtoh,
    /// `ExecutionContext::wait` blocking for the GPU; `arg` = batch id.
    Wait,
    /// A host-memory kernel's callback in the plugin; `arg` = the op's label index.
    HostCompute,
    /// The plugin's `allocate` (TensorFlow's allocator asking for device memory).
    Allocate,
}

const KIND_NAMES: [&str; 30] = [
    "mark",
    "htod",
    "write_resolve",
    "write_tail",
    "arena_lock",
    "arena_record",
    "arena_after",
    "encoder_new",
    "direct_lock",
    "direct_submit",
    "direct_stage",
    "direct_copy",
    "direct_queue_submit",
    "staged_buffer",
    "submit",
    "submit_turn",
    "submit_finish",
    "submit_uniforms",
    "submit_queue",
    "dispatch_lock",
    "dispatch_held",
    "bind_group_new",
    "poll",
    "poller_flush",
    "compute",
    "sync",
    "dtoh",
    "wait",
    "host_compute",
    "allocate",
];

#[derive(Clone, Copy)]
struct Span {
    kind: Kind,
    thread: u32,
    t0: u64,
    t1: u64,
    arg: u64,
}

struct Log {
    spans: Vec<Span>,
    labels: Vec<String>,
    label_ids: BTreeMap<String, u64>,
    /// Per thread index: (OS thread id, name).
    threads: Vec<(i64, String)>,
}

static LOG: Mutex<Log> = Mutex::new(Log {
    spans: Vec::new(),
    labels: Vec::new(),
    label_ids: BTreeMap::new(),
    threads: Vec::new(),
});
static NEXT_THREAD: AtomicU32 = AtomicU32::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// The file named by `TFWGPU_HOST_LOG`, when set (read once).
pub fn path() -> Option<&'static str> {
    static P: OnceLock<Option<String>> = OnceLock::new();
    P.get_or_init(|| {
        std::env::var("TFWGPU_HOST_LOG")
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
    .as_deref()
}

/// Whether spans are kept.
#[inline]
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = path().is_some();
        if on {
            epoch();
        }
        on
    })
}

/// Nanoseconds since the log's epoch (0 when the log is off: no clock read).
#[inline]
pub fn now() -> u64 {
    if on() {
        epoch().elapsed().as_nanos() as u64
    } else {
        0
    }
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`): host cost
/// without the time the thread waited for a CPU. A system call each (~0.1-0.3 us). None where
/// the clock is missing (not Linux, or the call failed).
#[cfg(target_os = "linux")]
pub fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out pointer; the clock id is Linux's.
    (unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0)
        .then(|| ts.sec as u64 * 1_000_000_000 + ts.nsec as u64)
}

/// CPU time of the calling thread: not measured off Linux.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_ns() -> Option<u64> {
    None
}

fn thread_index() -> u32 {
    thread_local! {
        static IDX: u32 = {
            let i = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            let name = std::fs::read_to_string("/proc/thread-self/comm")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| std::thread::current().name().unwrap_or("?").to_string());
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<i64>().ok())
                .unwrap_or(-1);
            let mut log = LOG.lock();
            let slot = i as usize;
            if log.threads.len() <= slot {
                log.threads.resize(slot + 1, (-1, String::new()));
            }
            log.threads[slot] = (tid, name);
            i
        };
    }
    IDX.with(|i| *i)
}

/// Keeps a span of `kind` from `t0` (a [`now`] reading) to now.
#[inline]
pub fn span(kind: Kind, t0: u64, arg: u64) {
    if on() {
        push(kind, t0, now(), arg);
    }
}

/// Keeps a span of `kind` from `t0` to `t1` (both [`now`] readings).
#[inline]
pub fn span_to(kind: Kind, t0: u64, t1: u64, arg: u64) {
    if on() {
        push(kind, t0, t1, arg);
    }
}

fn push(kind: Kind, t0: u64, t1: u64, arg: u64) {
    let thread = thread_index();
    let mut log = LOG.lock();
    if log.spans.len() < MAX_SPANS {
        log.spans.push(Span {
            kind,
            thread,
            t0,
            t1,
            arg,
        });
    }
}

/// A span kept when dropped.
pub struct HostSpan(Kind, u64, u64);

impl HostSpan {
    /// Starts a span of `kind` with `arg`.
    #[inline]
    pub fn start(kind: Kind, arg: u64) -> HostSpan {
        HostSpan(kind, now(), arg)
    }
}

impl Drop for HostSpan {
    #[inline]
    fn drop(&mut self) {
        span(self.0, self.1, self.2);
    }
}

/// The index of `label` (for a span's `arg`), interned.
pub fn label(label: &str) -> u64 {
    if !on() {
        return 0;
    }
    let mut log = LOG.lock();
    if let Some(&i) = log.label_ids.get(label) {
        return i;
    }
    let i = log.labels.len() as u64;
    log.labels.push(label.to_string());
    log.label_ids.insert(label.to_string(), i);
    i
}

/// Adds a mark with `text` at the current time.
pub fn mark(text: &str) {
    if on() {
        let i = label(text);
        let t = now();
        push(Kind::Mark, t, t, i);
    }
}

/// Drops the spans kept so far (labels and threads stay).
pub fn reset() {
    if on() {
        LOG.lock().spans.clear();
    }
}

/// Writes the spans to the `TFWGPU_HOST_LOG` file as JSON: `kinds`, `labels`, `threads`
/// (`[os tid, name]` by index) and `spans` (`[kind, thread, t0 ns, t1 ns, arg]`).
pub fn dump() -> std::io::Result<()> {
    let Some(p) = path() else { return Ok(()) };
    let log = LOG.lock();
    let spans: Vec<serde_json::Value> = log
        .spans
        .iter()
        .map(|s| serde_json::json!([s.kind as u8, s.thread, s.t0, s.t1, s.arg]))
        .collect();
    let v = serde_json::json!({
        "kinds": KIND_NAMES,
        "labels": log.labels,
        "threads": log.threads,
        "spans": spans,
    });
    std::fs::write(p, v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_cover_every_kind() {
        assert_eq!(KIND_NAMES[Kind::Htod as usize], "htod");
        assert_eq!(KIND_NAMES[Kind::Allocate as usize], "allocate");
    }
}
