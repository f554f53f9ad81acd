//! Copies between two tfwgpu devices, asynchronous for the stream that issues them.
//!
//! wgpu has no peer-to-peer copies, so a copy from device A to device B goes through host
//! memory: A's queue copies the source into a mappable staging buffer (recorded and submitted
//! at once, ordered after A's earlier work), then a per-device copier thread waits for that
//! batch, and records B's upload of the mapped bytes (ordered before anything recorded on B
//! later). The stream that issued the copy (TensorFlow passes the sender's device to
//! `memcpy_dtod`) returns at once; what TensorFlow orders after the copy on that stream waits
//! for the copier instead: events recorded after it ([`Mark`]), host callbacks, and
//! synchronization. TensorFlow hands the destination tensor to its consumers only after such an
//! event or callback, so B's upload is always recorded before B's first use of the tensor.
//!
//! The copier threads never run TensorFlow code, so waiting for them cannot deadlock with a
//! TensorFlow callback.
//!
//! With `TFWGPU_PEER=1` (devices opened with the runtime's peer extensions, runtime `peer.rs`),
//! a copy goes through a ring of host memory both devices import instead ([`Route`]): A's queue
//! copies into it and signals a timeline semaphore shared with B, B's queue waits for it and
//! copies out, both recorded before `start` returns. Nothing waits on the host (between CPU
//! adapters, which have no such semaphores, the host waits for A's batch instead: reported
//! once; GPUs without them keep the copier), so the stream's
//! later events need not wait for a copier, and the host goes on recording while the GPUs carry
//! the bytes. Copies the route does not take (over half its ring, or not 4-byte multiples) go
//! through the copier as before, after the copier's earlier copies of the same stream.

use std::sync::OnceLock;
use std::sync::mpsc;

use parking_lot::{Condvar, Mutex};
use tfwgpu_runtime::peer::Route;
use tfwgpu_runtime::{Device, Error, ReadInFlight, Result};

/// A copy the copier thread finishes: `read` on `from`, written to `to` at `dst`.
struct Job {
    from: &'static Device,
    read: ReadInFlight,
    to: &'static Device,
    dst: u64,
    size: usize,
}

/// The copies one device's streams issued: how many, how many are done, and the first error.
struct Lane {
    tx: Mutex<mpsc::Sender<Job>>,
    state: Mutex<LaneState>,
    done_cv: Condvar,
}

#[derive(Default)]
struct LaneState {
    issued: u64,
    done: u64,
    error: Option<String>,
}

/// A position in one device's sequence of cross-device copies: work ordered after it waits
/// until every copy issued before it has been recorded on its destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark(pub u64);

fn lanes() -> &'static [Lane] {
    static LANES: OnceLock<Vec<Lane>> = OnceLock::new();
    LANES.get_or_init(|| {
        let n = crate::runtime().map_or(0, |rt| rt.devices.len());
        (0..n).map(spawn_lane).collect()
    })
}

fn spawn_lane(ordinal: usize) -> Lane {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name(format!("tfwgpu-copier-{ordinal}"))
        .spawn(move || {
            for job in rx {
                let (size, dst) = (job.size, job.dst);
                spin_until_read(job.from, &job.read);
                let r = job
                    .from
                    .finish_read(job.read, |bytes| job.to.write(job.dst, bytes))
                    .and_then(|r| r);
                if crate::trace::on() {
                    crate::trace::copied(ordinal as i32, dst, size as u64);
                }
                let lane = &lanes()[ordinal];
                let mut st = lane.state.lock();
                if let Err(e) = r {
                    st.error.get_or_insert_with(|| e.to_string());
                }
                st.done += 1;
                lane.done_cv.notify_all();
            }
        })
        .expect("spawning a tfwgpu copier thread");
    Lane {
        tx: Mutex::new(tx),
        state: Mutex::new(LaneState::default()),
        done_cv: Condvar::new(),
    }
}

/// How long a copier thread polls for its source read before it blocks in the driver
/// (`TFWGPU_COPIER_SPIN_US`, microseconds; default 2000 on GPUs, 0 on CPU adapters, whose
/// execution threads need the cores). A hop of MirroredStrategy's all-reduce is on the
/// training step's critical path, and a thread blocked in the driver wakes 40-60 us after the
/// GPU finished (bench/RESULTS.md, session 6: host-sync latency); the copier is a thread of its
/// own, so polling costs no other work its core.
fn copier_spin(from: &Device) -> std::time::Duration {
    static US: OnceLock<Option<u64>> = OnceLock::new();
    let us = US.get_or_init(|| {
        std::env::var("TFWGPU_COPIER_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    let default = if from.description().device_type == "cpu" {
        0
    } else {
        2000
    };
    std::time::Duration::from_micros(us.unwrap_or(default))
}

/// Polls `from` until the batch that makes `read`'s bytes available completed, for at most
/// [`copier_spin`]; `finish_read` then finds it done (or blocks for the rest).
fn spin_until_read(from: &Device, read: &ReadInFlight) {
    let batch = read.batch();
    let exec = from.exec();
    if batch == 0 || exec.completed() >= batch {
        return;
    }
    let spin = copier_spin(from);
    let t0 = std::time::Instant::now();
    while exec.completed() < batch && t0.elapsed() < spin {
        exec.poll_completions();
        std::hint::spin_loop();
    }
}

fn lane(ordinal: i32) -> Result<&'static Lane> {
    usize::try_from(ordinal)
        .ok()
        .and_then(|i| lanes().get(i))
        .ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {ordinal}")))
}

type Routes = Mutex<std::collections::HashMap<(usize, usize), Option<&'static Route>>>;
static ROUTES: OnceLock<Routes> = OnceLock::new();

/// The peer routes made so far, for `tensorflow_wgpu.stats()`: each one's devices and ordering,
/// and how often the host waited for a source's batch or for a ring region.
pub fn routes_json() -> serde_json::Value {
    let Some(routes) = ROUTES.get() else {
        return serde_json::json!([]);
    };
    routes
        .lock()
        .values()
        .flatten()
        .map(|r| {
            serde_json::json!({
                "route": format!("{r:?}"),
                "gpu_ordered": r.gpu_ordered(),
                "host_waits": r.host_waits(),
                "ring_waits": r.ring_waits(),
            })
        })
        .collect()
}

/// The route from `from` to `to` through host memory both import, made on first use (None,
/// remembered, where either device was opened without `TFWGPU_PEER=1` or cannot import host
/// memory, or where the route would be ordered on the host between GPUs). Its ring holds
/// `TFWGPU_PEER_RING_MB` MiB (default 64). Routes live as long as the process.
fn route(from: &'static Device, to: &'static Device) -> Option<&'static Route> {
    let can = |d: &Device| d.peer_caps().is_some_and(|c| c.host_memory);
    if !can(from) || !can(to) {
        return None;
    }
    // Ordered on the host, a GPU's copy into the shared memory was not always visible to the
    // other device once its batch completed (the replay's `peer-host` on an H200, session 14):
    // only CPU adapters, whose device writes are host writes, take a host-ordered route.
    let cpu = |d: &Device| d.description().device_type == "cpu";
    if !(Route::orders_on_gpus(from, to) || cpu(from) && cpu(to)) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "tfwgpu: no peer route between GPUs without OPAQUE_FD timeline semaphores (host \
                 ordering is used only between CPU adapters); copies go through the host"
            )
        });
        return None;
    }
    let key = (
        std::ptr::from_ref(from) as usize,
        std::ptr::from_ref(to) as usize,
    );
    let mut routes = ROUTES.get_or_init(Routes::default).lock();
    *routes.entry(key).or_insert_with(|| {
        let mb: u64 = std::env::var("TFWGPU_PEER_RING_MB")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(64);
        match Route::new(from, to, mb << 20) {
            Ok(r) => {
                if r.gpu_ordered() {
                    tracing::info!("tfwgpu: copies between devices through {r:?}");
                } else {
                    tracing::warn!(
                        "tfwgpu: copies between devices through {r:?}: no OPAQUE_FD timeline \
                         semaphores, so the host waits for each copy's source"
                    );
                }
                Some(&*Box::leak(Box::new(r)))
            }
            Err(e) => {
                tracing::warn!(
                    "tfwgpu: no peer route between devices ({e}); copies go through the host"
                );
                None
            }
        }
    })
}

/// `TFWGPU_CROSS_COPIES=blocking` makes every copy between devices wait for its source and
/// record its target write before returning (the behaviour before copies became asynchronous;
/// for comparison and debugging).
pub fn blocking() -> bool {
    static B: OnceLock<bool> = OnceLock::new();
    *B.get_or_init(|| std::env::var("TFWGPU_CROSS_COPIES").is_ok_and(|v| v == "blocking"))
}

/// Starts copying `size` bytes from `src` on `from` to `dst` on `to`, on behalf of a stream of
/// device `ordinal`; returns once the source read is submitted.
pub fn start(
    ordinal: i32,
    from: &'static Device,
    src: u64,
    to: &'static Device,
    dst: u64,
    size: usize,
) -> Result<()> {
    let lane = lane(ordinal)?;
    if let Some(route) = route(from, to) {
        // The copier's earlier copies of this stream land first (the order TensorFlow issued).
        let pending = {
            let st = lane.state.lock();
            st.done < st.issued
        };
        if pending {
            wait_all(ordinal)?;
        }
        if route.copy(src, dst, size as u64)? {
            crate::stats::d2d_routed();
            if crate::trace::on() {
                crate::trace::copied(ordinal, dst, size as u64);
            }
            return Ok(());
        }
    }
    let read = from.read_async(src, size)?;
    // Count it before the copier can finish it, so `done` never passes `issued`.
    lane.state.lock().issued += 1;
    let sent = lane.tx.lock().send(Job {
        from,
        read,
        to,
        dst,
        size,
    });
    if sent.is_err() {
        let mut st = lane.state.lock();
        st.issued -= 1;
        return Err(Error::Gpu(
            "the tfwgpu copier thread has stopped".to_string(),
        ));
    }
    Ok(())
}

/// The copies issued so far by device `ordinal`'s streams (an unknown ordinal has none).
pub fn mark(ordinal: i32) -> Mark {
    lane(ordinal).map_or(Mark(0), |l| Mark(l.state.lock().issued))
}

/// Whether every copy before `m` is done; Err with the first copy error of this device.
pub fn reached(ordinal: i32, m: Mark) -> Result<bool> {
    let Ok(lane) = lane(ordinal) else {
        return Ok(true);
    };
    let st = lane.state.lock();
    check(&st)?;
    Ok(st.done >= m.0)
}

/// Blocks until every copy before `m` is done.
pub fn wait(ordinal: i32, m: Mark) -> Result<()> {
    let Ok(lane) = lane(ordinal) else {
        return Ok(());
    };
    let mut st = lane.state.lock();
    while st.done < m.0 {
        lane.done_cv.wait(&mut st);
    }
    check(&st)
}

/// Blocks until every copy issued so far by device `ordinal`'s streams is done.
pub fn wait_all(ordinal: i32) -> Result<()> {
    wait(ordinal, mark(ordinal))
}

/// The first failed copy of a device's streams, as the error of that stream.
pub fn status(ordinal: i32) -> Result<()> {
    match lane(ordinal) {
        Ok(lane) => check(&lane.state.lock()),
        Err(_) => Ok(()),
    }
}

fn check(st: &LaneState) -> Result<()> {
    match &st.error {
        Some(e) => Err(Error::Gpu(format!(
            "a copy between tfwgpu devices failed: {e}"
        ))),
        None => Ok(()),
    }
}
