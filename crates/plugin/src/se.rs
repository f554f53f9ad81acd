//! `SE_InitPlugin`: the StreamExecutor side of the PluggableDevice (platform "WGPU", device
//! type "GPU"). Every function maps onto the runtime: device memory is the Allocator's
//! addresses, copies and fills go through the ExecutionContext, and streams and events are
//! positions in its single ordered queue (batch ids), so waiting on an event waits for the
//! batch that held the work recorded before it.

use std::ffi::{CString, c_void};
use std::os::raw::c_char;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use tfwgpu_runtime::{Device, Error, Result, device_of_address};
use tfwgpu_sys as sys;

use crate::crossdev;
use crate::stats::{SeCall, timed};
use crate::status::{guard, quiet, set_error};

fn dev(device: *const sys::SP_Device) -> Result<&'static Device> {
    // SAFETY: TensorFlow passes the SP_Device we filled in create_device.
    let ordinal = unsafe { device.as_ref() }.map(|d| d.ordinal).unwrap_or(-1);
    crate::device(ordinal).ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {ordinal}")))
}

/// The TensorFlow ordinal of `device` (for the trace).
fn ordinal(device: *const sys::SP_Device) -> i32 {
    // SAFETY: TensorFlow passes the SP_Device we filled in create_device.
    unsafe { device.as_ref() }.map_or(-1, |d| d.ordinal)
}

fn addr(mem: *const sys::SP_DeviceMemoryBase) -> Result<u64> {
    // SAFETY: TensorFlow passes a valid SP_DeviceMemoryBase.
    let m = unsafe { mem.as_ref() }
        .ok_or_else(|| Error::InvalidArgument("null device memory".into()))?;
    Ok(m.opaque as u64)
}

// ---- platform ----

unsafe extern "C" fn get_device_count(
    _: *const sys::SP_Platform,
    count: *mut i32,
    status: *mut sys::TF_Status,
) {
    let n = guard(status, 0, || {
        Ok(crate::runtime().map_or(0, |rt| rt.devices.len() as i32))
    });
    // SAFETY: TensorFlow passes a valid out pointer.
    unsafe { *count = n };
}

/// Strings handed to TensorFlow in SP_Device, freed in destroy_device.
struct DeviceStrings {
    name: CString,
    vendor: CString,
    bus: CString,
}

unsafe extern "C" fn create_device(
    _: *const sys::SP_Platform,
    params: *mut sys::SE_CreateDeviceParams,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes valid params with an SP_Device to fill.
        let params = unsafe { &mut *params };
        let d = unsafe { &mut *params.device };
        let device = crate::device(params.ordinal)
            .ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {}", params.ordinal)))?;
        let desc = device.description();
        let strings = Box::new(DeviceStrings {
            name: CString::new(format!("{} ({})", desc.name, desc.backend).replace('\0', ""))
                .expect("no NUL"),
            vendor: CString::new(format!("{:#06x}", desc.vendor)).expect("no NUL"),
            bus: CString::new(format!("wgpu:{}", desc.index)).expect("no NUL"),
        });
        d.struct_size = sys::sizes::sp_device();
        d.ordinal = params.ordinal;
        d.hardware_name = strings.name.as_ptr();
        d.device_vendor = strings.vendor.as_ptr();
        d.pci_bus_id = strings.bus.as_ptr();
        d.device_handle = Box::into_raw(strings) as *mut c_void;
        Ok(())
    })
}

unsafe extern "C" fn destroy_device(_: *const sys::SP_Platform, device: *mut sys::SP_Device) {
    quiet((), || {
        // SAFETY: device_handle was made by Box::into_raw in create_device.
        if let Some(d) = unsafe { device.as_mut() }
            && !d.device_handle.is_null()
        {
            drop(unsafe { Box::from_raw(d.device_handle as *mut DeviceStrings) });
            d.device_handle = std::ptr::null_mut();
        }
    })
}

unsafe extern "C" fn create_device_fns(
    _: *const sys::SP_Platform,
    params: *mut sys::SE_CreateDeviceFnsParams,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes valid params.
        let fns = unsafe { &mut *(*params).device_fns };
        fns.struct_size = sys::sizes::sp_device_fns();
        Ok(())
    })
}

unsafe extern "C" fn destroy_device_fns(_: *const sys::SP_Platform, _: *mut sys::SP_DeviceFns) {}

// ---- memory ----

unsafe extern "C" fn allocate(
    device: *const sys::SP_Device,
    size: u64,
    _space: i64,
    mem: *mut sys::SP_DeviceMemoryBase,
) {
    let _span =
        tfwgpu_runtime::hostlog::HostSpan::start(tfwgpu_runtime::hostlog::Kind::Allocate, size);
    timed(SeCall::Allocate, || unsafe {
        allocate_impl(device, size, mem)
    })
}

unsafe fn allocate_impl(
    device: *const sys::SP_Device,
    size: u64,
    mem: *mut sys::SP_DeviceMemoryBase,
) {
    quiet((), || {
        // SAFETY: TensorFlow passes a valid SP_DeviceMemoryBase to fill.
        let m = unsafe { &mut *mem };
        m.struct_size = sys::sizes::sp_device_memory_base();
        m.opaque = std::ptr::null_mut();
        m.size = 0;
        match dev(device).and_then(|d| d.allocate(size)) {
            Ok(a) => {
                m.opaque = a as *mut c_void;
                m.size = size;
                if crate::trace::on() {
                    crate::trace::alloc(ordinal(device), a, size);
                }
            }
            // A null pointer is how TensorFlow learns of out-of-memory. Its BFC allocator
            // probes: it asks for a large region first and retries 10% smaller until one
            // fits, so a failure is expected at start-up on small adapters (lavapipe's
            // 128 MiB binding limit): the first is a warning, later ones debug lines.
            Err(e) => {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::debug!("allocation of {size} bytes failed: {e}");
                } else {
                    tracing::warn!(
                        "allocation of {size} bytes failed: {e} (TensorFlow's allocator \
                         retries smaller sizes; further failures are logged at debug level, \
                         TFWGPU_LOG=debug)"
                    );
                }
            }
        }
    })
}

unsafe extern "C" fn deallocate(device: *const sys::SP_Device, mem: *mut sys::SP_DeviceMemoryBase) {
    timed(SeCall::Deallocate, || deallocate_impl(device, mem))
}

fn deallocate_impl(device: *const sys::SP_Device, mem: *mut sys::SP_DeviceMemoryBase) {
    quiet((), || {
        let Ok(a) = addr(mem) else { return };
        if a == 0 {
            return;
        }
        if crate::trace::on() {
            crate::trace::free(ordinal(device), a);
        }
        if let Err(e) = dev(device).and_then(|d| d.deallocate(a)) {
            tracing::error!("deallocate {a:#x}: {e}");
        }
        // SAFETY: valid SP_DeviceMemoryBase.
        unsafe {
            (*mem).opaque = std::ptr::null_mut();
            (*mem).size = 0;
        }
    })
}

const HOST_ALIGN: usize = 64;

unsafe extern "C" fn host_memory_allocate(_: *const sys::SP_Device, size: u64) -> *mut c_void {
    quiet(std::ptr::null_mut(), || {
        // A 64-byte header in front of the block remembers its size for deallocation.
        let Ok(layout) =
            std::alloc::Layout::from_size_align(size as usize + HOST_ALIGN, HOST_ALIGN)
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: non-zero size layout.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return p as *mut c_void;
        }
        // SAFETY: the block is at least HOST_ALIGN bytes.
        unsafe {
            (p as *mut u64).write(size);
            p.add(HOST_ALIGN) as *mut c_void
        }
    })
}

unsafe extern "C" fn host_memory_deallocate(_: *const sys::SP_Device, mem: *mut c_void) {
    quiet((), || {
        if mem.is_null() {
            return;
        }
        // SAFETY: mem came from host_memory_allocate, which put the size in front of it.
        unsafe {
            let p = (mem as *mut u8).sub(HOST_ALIGN);
            let size = (p as *const u64).read() as usize;
            std::alloc::dealloc(
                p,
                std::alloc::Layout::from_size_align_unchecked(size + HOST_ALIGN, HOST_ALIGN),
            );
        }
    })
}

unsafe extern "C" fn get_allocator_stats(
    device: *const sys::SP_Device,
    stats: *mut sys::SP_AllocatorStats,
) -> u8 {
    quiet(0, || {
        let Ok(d) = dev(device) else { return 0 };
        let s = d.memory_stats();
        // SAFETY: TensorFlow passes a valid stats struct.
        let out = unsafe { &mut *stats };
        out.struct_size = sys::sizes::sp_allocator_stats();
        out.num_allocs = s.num_allocs as i64;
        out.bytes_in_use = s.bytes_in_use as i64;
        out.peak_bytes_in_use = s.peak_bytes_in_use as i64;
        out.largest_alloc_size = s.largest_alloc as i64;
        out.has_bytes_limit = 1;
        out.bytes_limit = s.bytes_limit as i64;
        out.bytes_reserved = s.bytes_reserved as i64;
        out.peak_bytes_reserved = s.bytes_reserved as i64;
        out.has_bytes_reservable_limit = 0;
        out.largest_free_block_bytes = 0;
        1
    })
}

unsafe extern "C" fn device_memory_usage(
    device: *const sys::SP_Device,
    free: *mut i64,
    total: *mut i64,
) -> u8 {
    quiet(0, || {
        let Ok(d) = dev(device) else { return 0 };
        let s = d.memory_stats();
        // SAFETY: valid out pointers.
        unsafe {
            *total = s.bytes_limit as i64;
            *free = s.bytes_limit.saturating_sub(s.bytes_reserved) as i64;
        }
        1
    })
}

// ---- streams and events ----
// The device has one in-order queue: every stream is a view of it, so dependencies between
// streams hold by construction. An event is the batch id that covers the work recorded
// before it.

struct Stream;

unsafe extern "C" fn create_stream(
    _: *const sys::SP_Device,
    stream: *mut sys::SP_Stream,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: valid out pointer.
        unsafe { *stream = Box::into_raw(Box::new(Stream)) as sys::SP_Stream };
        Ok(())
    })
}

unsafe extern "C" fn destroy_stream(_: *const sys::SP_Device, stream: sys::SP_Stream) {
    if !stream.is_null() {
        // SAFETY: made by create_stream.
        drop(unsafe { Box::from_raw(stream as *mut Stream) });
    }
}

unsafe extern "C" fn create_stream_dependency(
    _: *const sys::SP_Device,
    _: sys::SP_Stream,
    _: sys::SP_Stream,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || Ok(()))
}

unsafe extern "C" fn get_stream_status(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        crossdev::status(ordinal(device))?;
        dev(device)?.exec().check()
    })
}

/// The batch that covers the work recorded before the event, and the position in the
/// device's cross-device copies (see `crossdev`) issued before it.
struct Event {
    tag: AtomicU64,
    copies: AtomicU64,
}

fn event<'a>(e: sys::SP_Event) -> Result<&'a Event> {
    // SAFETY: made by create_event.
    unsafe { (e as *const Event).as_ref() }
        .ok_or_else(|| Error::InvalidArgument("null event".into()))
}

unsafe extern "C" fn create_event(
    _: *const sys::SP_Device,
    ev: *mut sys::SP_Event,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: valid out pointer.
        let e = Event {
            tag: AtomicU64::new(0),
            copies: AtomicU64::new(0),
        };
        unsafe { *ev = Box::into_raw(Box::new(e)) as sys::SP_Event };
        Ok(())
    })
}

unsafe extern "C" fn destroy_event(_: *const sys::SP_Device, ev: sys::SP_Event) {
    if !ev.is_null() {
        // SAFETY: made by create_event.
        drop(unsafe { Box::from_raw(ev as *mut Event) });
    }
}

unsafe extern "C" fn get_event_status(
    device: *const sys::SP_Device,
    ev: sys::SP_Event,
) -> sys::SE_EventStatus {
    timed(SeCall::EventStatus, || event_status(device, ev))
}

fn event_status(device: *const sys::SP_Device, ev: sys::SP_Event) -> sys::SE_EventStatus {
    quiet(sys::SE_EventStatus_SE_EVENT_ERROR, || {
        let (Ok(d), Ok(e)) = (dev(device), event(ev)) else {
            return sys::SE_EventStatus_SE_EVENT_ERROR;
        };
        if d.exec().check().is_err() {
            return sys::SE_EventStatus_SE_EVENT_ERROR;
        }
        let tag = e.tag.load(Ordering::Acquire);
        let exec = d.exec();
        if events_when_ordered() {
            let copies = crossdev::Mark(e.copies.load(Ordering::Acquire));
            return match crossdev::reached(ordinal(device), copies) {
                Err(_) => sys::SE_EventStatus_SE_EVENT_ERROR,
                Ok(true) => sys::SE_EventStatus_SE_EVENT_COMPLETE,
                Ok(false) => sys::SE_EventStatus_SE_EVENT_PENDING,
            };
        }
        if exec.completed() < tag {
            // TensorFlow polls an event when something waits for it (a copy's done callback,
            // a collective's next step): submit its batch now instead of when it ages out, and
            // look for finished batches now instead of at the background poller's next round.
            if exec.submitted() < tag && exec.flush().is_err() {
                return sys::SE_EventStatus_SE_EVENT_ERROR;
            }
            exec.poll_completions();
        }
        let copies = crossdev::Mark(e.copies.load(Ordering::Acquire));
        match crossdev::reached(ordinal(device), copies) {
            Err(_) => sys::SE_EventStatus_SE_EVENT_ERROR,
            Ok(true) if exec.completed() >= tag => sys::SE_EventStatus_SE_EVENT_COMPLETE,
            Ok(_) => sys::SE_EventStatus_SE_EVENT_PENDING,
        }
    })
}

/// Whether an event is complete once the work before it is ordered on the device's queue
/// (the default), rather than once the GPU has run it (`TFWGPU_EVENTS=completed`).
///
/// TensorFlow polls events (its EventMgr, every 10 us while any is pending) to learn that a
/// stream reached a point, and then runs the callback that waits on it: a host-to-device
/// copy's `done` (which lets the executor run the copy's consumers: the input batch's
/// convolution, the dropout's key and counter), a device-to-host copy's `done`, the release of
/// the tensors a copy holds. What waiting for the GPU protects on a CUDA stream is host memory
/// that the device still reads or writes asynchronously. Here nothing does: a host-to-device
/// copy takes its bytes into staging memory before `memcpy_htod` returns, a device-to-host copy
/// has its bytes when `memcpy_dtoh` returns (it waits), and every device-side consumer of
/// memory is recorded after its producer on the one in-order queue, which also orders the
/// reuse of freed memory. So the event is reached as soon as it is recorded, except for the
/// copies between devices still in flight on a copier thread (`crossdev`), which it still waits
/// for. Waiting for the GPU instead cost each such callback a submit, a GPU round trip and
/// TensorFlow's polling (~80 polls per Keras CNN training step, 9 events). Host callbacks,
/// `block_host_for_event` and the synchronizations still wait for the GPU.
fn events_when_ordered() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TFWGPU_EVENTS").map_or(true, |v| v.trim() != "completed"))
}

unsafe extern "C" fn record_event(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    ev: sys::SP_Event,
    status: *mut sys::TF_Status,
) {
    let t0 = std::time::Instant::now();
    guard(status, (), || {
        let d = dev(device)?;
        let e = event(ev)?;
        e.copies
            .store(crossdev::mark(ordinal(device)).0, Ordering::Release);
        e.tag.store(d.exec().tag(), Ordering::Release);
        Ok(())
    });
    crate::stats::se_call(SeCall::RecordEvent, t0.elapsed().as_nanos() as u64);
}

unsafe extern "C" fn wait_for_event(
    _: *const sys::SP_Device,
    _: sys::SP_Stream,
    _: sys::SP_Event,
    status: *mut sys::TF_Status,
) {
    // One in-order queue: work enqueued after this point already runs after the event.
    guard(status, (), || Ok(()))
}

unsafe extern "C" fn block_host_for_event(
    device: *const sys::SP_Device,
    ev: sys::SP_Event,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::BlockHostForEvent);
    guard(status, (), || {
        if crate::trace::on() {
            crate::trace::sync(ordinal(device), "block_host_for_event");
        }
        let e = event(ev)?;
        let copies = crossdev::Mark(e.copies.load(Ordering::Acquire));
        crossdev::wait(ordinal(device), copies)?;
        dev(device)?.exec().wait(e.tag.load(Ordering::Acquire))
    })
}

unsafe extern "C" fn block_host_until_done(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::BlockHostUntilDone);
    guard(status, (), || {
        if crate::trace::on() {
            crate::trace::sync(ordinal(device), "block_host_until_done");
        }
        crossdev::wait_all(ordinal(device))?;
        dev(device)?.synchronize()
    })
}

unsafe extern "C" fn synchronize_all_activity(
    device: *const sys::SP_Device,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::SynchronizeAllActivity);
    let _span = tfwgpu_runtime::hostlog::HostSpan::start(tfwgpu_runtime::hostlog::Kind::Sync, 0);
    guard(status, (), || {
        if crate::trace::on() {
            crate::trace::sync(ordinal(device), "synchronize_all_activity");
        }
        crossdev::wait_all(ordinal(device))?;
        let d = dev(device)?;
        match sync_mode() {
            SyncMode::Completed => d.synchronize(),
            SyncMode::Ordered => ordered_sync(ordinal(device), d),
        }
    })
}

/// How `synchronize_all_activity` (TensorFlow's `Device::Sync`, i.e.
/// `PluggableDeviceUtil::SyncAll`) waits: `TFWGPU_SYNC=completed` for all the GPU work recorded
/// so far (a CUDA device's meaning), `ordered` (the default) only for it to be submitted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SyncMode {
    Completed,
    Ordered,
}

/// `TFWGPU_SYNC`, read once.
pub fn sync_mode() -> SyncMode {
    static MODE: OnceLock<SyncMode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TFWGPU_SYNC") {
        Ok(v) if v.trim() == "completed" => SyncMode::Completed,
        _ => SyncMode::Ordered,
    })
}

/// How many syncs back an ordered sync waits for (`TFWGPU_SYNC_DEPTH`, default 2, at least 1):
/// the host runs at most that many sync intervals ahead of the GPU. A Keras training step synced
/// twice while eager ops ran as one-op functions (`TFWGPU_EAGER_OPS_DIRECT=0`: the loop's
/// `has_value()` flag, copied to the device, on the main thread, then the loss, which may come
/// late): depth 1 made a step wait for the loss sync just before it. By default the flag stays
/// on the host and a step syncs once, for the loss, whose read waits for the GPU anyway.
fn sync_depth() -> usize {
    static D: OnceLock<usize> = OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("TFWGPU_SYNC_DEPTH")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(2)
            .clamp(1, 64)
    })
}

/// Whether an ordered sync hands the open batch to the device's submit thread, when it has one
/// (`TFWGPU_SYNC_ASYNC`, default on; 0: the syncing thread submits it).
fn sync_async() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TFWGPU_SYNC_ASYNC").map_or(true, |v| v.trim() != "0"))
}

/// Per device: the batch ids the last `sync_depth()` ordered syncs submitted up to, oldest
/// first.
fn previous_syncs(ordinal: i32) -> Option<&'static Mutex<std::collections::VecDeque<u64>>> {
    static PREV: OnceLock<Vec<Mutex<std::collections::VecDeque<u64>>>> = OnceLock::new();
    let v = PREV.get_or_init(|| {
        let n = crate::runtime().map_or(0, |rt| rt.devices.len());
        (0..n).map(|_| Mutex::new(Default::default())).collect()
    });
    v.get(usize::try_from(ordinal).ok()?)
}

/// A device sync that submits everything recorded but does not wait for the GPU to run it.
///
/// What TensorFlow 2.21 does after `Device::Sync` on a PluggableDevice, and why none of it
/// needs the GPU to have finished here:
/// - `TensorHandle::CopyToDevice` (eager/tensor_handle.cc: `TF_RETURN_IF_ERROR(srcd->Sync())`,
///   then `CopyTensor::ViaDMA`): every read of an eager tensor off the device (`.numpy()`,
///   `bool()`, Keras fit's `has_value()` flag and its loss every step) and every eager copy to
///   another device. The sync exists for CUDA's separate compute / host-to-device /
///   device-to-host streams (its own comment says so). The copy that follows is our
///   `memcpy_dtoh`, which waits for the bytes it reads (a read is ordered after all recorded
///   work; the host mirror answers only bytes nothing on the device has written since), or a
///   `memcpy_dtod` to another tfwgpu device (`crossdev`: it reads the source the same way).
/// - `ExecutorState::Finish` with `sync_on_finish` (DirectSession and distributed GraphMgr
///   steps; not eager functions): "control is not returned to the user until the step (and
///   its side-effects) has actually completed". The side effects are device memory, which the
///   host sees only through a copy, which waits as above; later steps are recorded behind them
///   on the one in-order queue.
/// - Freeing memory after a sync: TensorFlow's BFC allocator reuses a freed chunk at once and
///   relies on stream order, which the one queue gives (uploads into reused memory are recorded
///   behind earlier kernels: the open batch is submitted before a staged upload); the runtime's
///   allocator itself reuses a range only once the GPU has completed the batch that freed it.
/// - Host memory: nothing of ours holds a host pointer after the call returns (uploads are
///   staged in `memcpy_htod`, reads complete in `memcpy_dtoh`), so freeing pinned host buffers
///   after a sync is safe.
/// - Errors: the submit checks the sticky device-lost / uncaptured error state, and every read,
///   event, host callback and the next sync check it again.
///
/// `SyncDevice` (tf.test.experimental.sync_devices) is a no-op kernel on DEVICE_DEFAULT, and
/// `BlockHostUntilDone` (`sync_every_op`, `PluggableDeviceUtil::Sync`) still waits.
///
/// Bound on running ahead: each sync waits for the work the device's sync `sync_depth()` syncs
/// back submitted (`TFWGPU_SYNC_DEPTH`, default 2: a Keras training step syncs twice), so a
/// GPU-bound loop cannot queue staging buffers without end.
fn ordered_sync(ordinal: i32, d: &Device) -> Result<()> {
    let exec = d.exec();
    // With a submit thread (`TFWGPU_SUBMIT_THREAD`), the open batch goes to it: the calling
    // thread (Python's, in Keras fit's `has_value()`) does not encode and submit it itself.
    let now = if sync_async() {
        exec.flush_async()?
    } else {
        exec.flush()?
    };
    // The id `sync_depth()` syncs back (none until that many syncs ran).
    let back = previous_syncs(ordinal).and_then(|q| {
        let mut q = q.lock().ok()?;
        q.push_back(now);
        (q.len() > sync_depth()).then(|| q.pop_front()).flatten()
    });
    if let Some(back) = back
        && back > 0
        && exec.completed() < back.min(now)
    {
        crate::stats::sync_wait();
        exec.wait(back.min(now))?;
    }
    exec.check()
}

// ---- copies and fills ----

unsafe extern "C" fn memcpy_dtoh(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    dst: *mut c_void,
    src: *const sys::SP_DeviceMemoryBase,
    size: u64,
    status: *mut sys::TF_Status,
) {
    unsafe { sync_memcpy_dtoh(device, dst, src, size, status) }
}

unsafe extern "C" fn sync_memcpy_dtoh(
    device: *const sys::SP_Device,
    dst: *mut c_void,
    src: *const sys::SP_DeviceMemoryBase,
    size: u64,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::MemcpyDtoH);
    let _span = tfwgpu_runtime::hostlog::HostSpan::start(tfwgpu_runtime::hostlog::Kind::Dtoh, size);
    guard(status, (), || {
        if size == 0 {
            return Ok(());
        }
        crate::stats::d2h(size);
        let src = addr(src)?;
        if crate::trace::on() {
            crate::trace::d2h(ordinal(device), src, size);
        }
        // SAFETY: TensorFlow's host buffer holds `size` bytes, and nothing else writes it
        // during the copy.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, size as usize) };
        // A small read of bytes the host wrote, with no kernel, copy or fill since, is
        // answered by the runtime's host mirror without a GPU round trip (Keras fit's
        // `has_value()` flag every step).
        dev(device)?.read_into(src, dst)
    })
}

unsafe extern "C" fn memcpy_htod(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    dst: *mut sys::SP_DeviceMemoryBase,
    src: *const c_void,
    size: u64,
    status: *mut sys::TF_Status,
) {
    unsafe { sync_memcpy_htod(device, dst, src, size, status) }
}

unsafe extern "C" fn sync_memcpy_htod(
    device: *const sys::SP_Device,
    dst: *mut sys::SP_DeviceMemoryBase,
    src: *const c_void,
    size: u64,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::MemcpyHtoD);
    let _span = tfwgpu_runtime::hostlog::HostSpan::start(tfwgpu_runtime::hostlog::Kind::Htod, size);
    guard(status, (), || {
        if size == 0 {
            return Ok(());
        }
        // SAFETY: TensorFlow's host buffer holds `size` bytes; the runtime copies it into a
        // staging buffer before returning.
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, size as usize) };
        crate::stats::h2d(size);
        let dst = addr(dst)?;
        if crate::trace::on() {
            crate::trace::h2d(ordinal(device), dst, size);
        }
        // A tail of 1-3 bytes (a bool scalar: Keras fit's `has_value()` flag crosses to the
        // device every step) is written by a byte-masked fill inside `Device::write`, without
        // reading the word back (that read waited for all the GPU work recorded before).
        let t0 = std::time::Instant::now();
        let r = dev(device)?.write(dst, data);
        crate::stats::h2d_wall(size, t0.elapsed().as_nanos() as u64);
        r
    })
}

/// Charges the wall time until it is dropped to one stream-executor call.
struct SeTimer(SeCall, std::time::Instant);

impl SeTimer {
    fn start(c: SeCall) -> SeTimer {
        SeTimer(c, std::time::Instant::now())
    }
}

impl Drop for SeTimer {
    fn drop(&mut self) {
        crate::stats::se_call(self.0, self.1.elapsed().as_nanos() as u64);
    }
}

unsafe extern "C" fn memcpy_dtod(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    dst: *mut sys::SP_DeviceMemoryBase,
    src: *const sys::SP_DeviceMemoryBase,
    size: u64,
    status: *mut sys::TF_Status,
) {
    timed(SeCall::MemcpyDtoD, || {
        guard(status, (), || dtod(device, dst, src, size, false))
    })
}

unsafe extern "C" fn sync_memcpy_dtod(
    device: *const sys::SP_Device,
    dst: *mut sys::SP_DeviceMemoryBase,
    src: *const sys::SP_DeviceMemoryBase,
    size: u64,
    status: *mut sys::TF_Status,
) {
    timed(SeCall::MemcpyDtoD, || {
        guard(status, (), || dtod(device, dst, src, size, true))
    })
}

/// A device-to-device copy issued on a stream of `device`. Within one device it is recorded on
/// the queue. Between two tfwgpu devices (TensorFlow issues these on the sender's stream) it
/// goes through host memory: `blocking` (the sync_ variant) waits for the source and records
/// the write before returning; otherwise the copy continues on a copier thread and the
/// stream's later events, callbacks and synchronizations wait for it (see `crossdev`).
fn dtod(
    device: *const sys::SP_Device,
    dst: *mut sys::SP_DeviceMemoryBase,
    src: *const sys::SP_DeviceMemoryBase,
    size: u64,
    blocking: bool,
) -> Result<()> {
    let (s, d) = (addr(src)?, addr(dst)?);
    if crate::trace::on() && size > 0 {
        let (from, to) = (device_of_address(s), device_of_address(d));
        let cross = match (from, to) {
            (Some(a), Some(b)) if a != b => Some(b as u32),
            _ => None,
        };
        crate::trace::d2d(ordinal(device), s, d, size, cross);
    }
    match (device_of_address(s), device_of_address(d)) {
        (Some(a), Some(b)) if a != b && size > 0 => {
            let from = crate::device(a as i32)
                .ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {a}")))?;
            let to = crate::device(b as i32)
                .ok_or_else(|| Error::NoAdapter(format!("no tfwgpu device {b}")))?;
            crate::stats::d2d(size);
            if blocking || crossdev::blocking() {
                // Copies this stream issued before are recorded on their targets first.
                crossdev::wait_all(ordinal(device))?;
                let bytes = from.read(s, size as usize)?;
                to.write(d, &bytes)
            } else {
                crossdev::start(ordinal(device), from, s, to, d, size as usize)
            }
        }
        _ => dev(device)?.copy(s, d, size),
    }
}

unsafe extern "C" fn mem_zero(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    loc: *mut sys::SP_DeviceMemoryBase,
    size: u64,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::Memset);
    guard(status, (), || {
        let a = addr(loc)?;
        if crate::trace::on() && size > 0 {
            crate::trace::fill(ordinal(device), a, size, 0);
        }
        dev(device)?.fill_u32(a, size, 0)
    })
}

unsafe extern "C" fn memset(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    loc: *mut sys::SP_DeviceMemoryBase,
    pattern: u8,
    size: u64,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::Memset);
    guard(status, (), || {
        let a = addr(loc)?;
        let pattern = u32::from_le_bytes([pattern; 4]);
        if crate::trace::on() && size > 0 {
            crate::trace::fill(ordinal(device), a, size, pattern);
        }
        dev(device)?.fill_u32(a, size, pattern)
    })
}

unsafe extern "C" fn memset32(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    loc: *mut sys::SP_DeviceMemoryBase,
    pattern: u32,
    size: u64,
    status: *mut sys::TF_Status,
) {
    let _t = SeTimer::start(SeCall::Memset);
    guard(status, (), || {
        let a = addr(loc)?;
        if crate::trace::on() && size > 0 {
            crate::trace::fill(ordinal(device), a, size, pattern);
        }
        dev(device)?.fill_u32(a, size, pattern)
    })
}

// ---- host callbacks ----
// Run on one thread per device, in order, each after the GPU work recorded before it
// completed. (One thread for all devices made a callback of one device wait behind another
// device's GPU: with MirroredStrategy, every replica's completions queued behind the slowest.)

struct Callback {
    ordinal: i32,
    tag: u64,
    copies: crossdev::Mark,
    f: unsafe extern "C" fn(*mut c_void, *mut sys::TF_Status),
    arg: *mut c_void,
}
// SAFETY: TensorFlow's callbacks may run on any thread.
unsafe impl Send for Callback {}

/// The callback thread of device `ordinal` (started on first use).
fn callback_queue(ordinal: i32) -> Option<&'static Mutex<mpsc::Sender<Callback>>> {
    static Q: OnceLock<Vec<OnceLock<Mutex<mpsc::Sender<Callback>>>>> = OnceLock::new();
    let queues = Q.get_or_init(|| {
        let n = crate::runtime().map_or(0, |rt| rt.devices.len());
        (0..n).map(|_| OnceLock::new()).collect()
    });
    let q = queues.get(usize::try_from(ordinal).ok()?)?;
    Some(q.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Callback>();
        std::thread::Builder::new()
            .name(format!("tfwgpu-callbacks-{ordinal}"))
            .spawn(move || {
                for cb in rx {
                    quiet((), || {
                        let st = crate::status::Status::new();
                        let r = crate::device(cb.ordinal)
                            .ok_or_else(|| Error::NoAdapter("device gone".into()))
                            .and_then(|d| d.exec().wait(cb.tag))
                            .and_then(|()| crossdev::wait(cb.ordinal, cb.copies));
                        match r {
                            Ok(()) => crate::status::set_ok(st.0),
                            Err(e) => set_error(st.0, &e),
                        }
                        // SAFETY: TensorFlow's callback with its own argument.
                        unsafe { (cb.f)(cb.arg, st.0) };
                    })
                }
            })
            .expect("spawning a tfwgpu callback thread");
        Mutex::new(tx)
    }))
}

unsafe extern "C" fn host_callback(
    device: *const sys::SP_Device,
    _: sys::SP_Stream,
    f: sys::SE_StatusCallbackFn,
    arg: *mut c_void,
) -> u8 {
    let _t = SeTimer::start(SeCall::HostCallback);
    quiet(0, || {
        let (Ok(d), Some(f)) = (dev(device), f) else {
            return 0;
        };
        // SAFETY: valid device.
        let ordinal = unsafe { (*device).ordinal };
        let cb = Callback {
            ordinal,
            copies: crossdev::mark(ordinal),
            tag: d.exec().tag(),
            f,
            arg,
        };
        let sent = callback_queue(ordinal)
            .and_then(|q| q.lock().ok().map(|q| q.send(cb).is_ok()))
            .unwrap_or(false);
        sent as u8
    })
}

// ---- stream executor and registration ----

unsafe extern "C" fn create_stream_executor(
    _: *const sys::SP_Platform,
    params: *mut sys::SE_CreateStreamExecutorParams,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes valid params.
        let se = unsafe { &mut *(*params).stream_executor };
        se.struct_size = sys::sizes::sp_stream_executor();
        se.allocate = Some(allocate);
        se.deallocate = Some(deallocate);
        se.host_memory_allocate = Some(host_memory_allocate);
        se.host_memory_deallocate = Some(host_memory_deallocate);
        se.get_allocator_stats = Some(get_allocator_stats);
        se.device_memory_usage = Some(device_memory_usage);
        se.create_stream = Some(create_stream);
        se.destroy_stream = Some(destroy_stream);
        se.create_stream_dependency = Some(create_stream_dependency);
        se.get_stream_status = Some(get_stream_status);
        se.create_event = Some(create_event);
        se.destroy_event = Some(destroy_event);
        se.get_event_status = Some(get_event_status);
        se.record_event = Some(record_event);
        se.wait_for_event = Some(wait_for_event);
        se.memcpy_dtoh = Some(memcpy_dtoh);
        se.memcpy_htod = Some(memcpy_htod);
        se.memcpy_dtod = Some(memcpy_dtod);
        se.sync_memcpy_dtoh = Some(sync_memcpy_dtoh);
        se.sync_memcpy_htod = Some(sync_memcpy_htod);
        se.sync_memcpy_dtod = Some(sync_memcpy_dtod);
        se.block_host_for_event = Some(block_host_for_event);
        se.block_host_until_done = Some(block_host_until_done);
        se.synchronize_all_activity = Some(synchronize_all_activity);
        se.host_callback = Some(host_callback);
        se.mem_zero = Some(mem_zero);
        se.memset = Some(memset);
        se.memset32 = Some(memset32);
        Ok(())
    })
}

unsafe extern "C" fn destroy_stream_executor(
    _: *const sys::SP_Platform,
    _: *mut sys::SP_StreamExecutor,
) {
}
unsafe extern "C" fn destroy_platform(_: *mut sys::SP_Platform) {}
unsafe extern "C" fn destroy_platform_fns(_: *mut sys::SP_PlatformFns) {}

static PLATFORM_NAME: &[u8] = b"WGPU\0";
static PLATFORM_TYPE: &[u8] = b"GPU\0";

/// Entry point TensorFlow calls when it loads the plugin.
///
/// # Safety
/// Called by TensorFlow with valid registration params.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn SE_InitPlugin(
    params: *mut sys::SE_PlatformRegistrationParams,
    status: *mut sys::TF_Status,
) {
    guard(status, (), || {
        // SAFETY: TensorFlow passes valid params with platform structs to fill.
        let p = unsafe { &mut *params };
        p.major_version = sys::SE_MAJOR as i32;
        p.minor_version = sys::SE_MINOR as i32;
        p.patch_version = sys::SE_PATCH as i32;
        let platform = unsafe { &mut *p.platform };
        platform.struct_size = sys::sizes::sp_platform();
        platform.name = PLATFORM_NAME.as_ptr() as *const c_char;
        platform.type_ = PLATFORM_TYPE.as_ptr() as *const c_char;
        platform.supports_unified_memory = 0;
        platform.use_bfc_allocator = 1;
        // BFC regions grow on demand: one region cannot exceed the adapter's binding limit.
        platform.force_memory_growth = 1;
        let fns = unsafe { &mut *p.platform_fns };
        fns.struct_size = sys::sizes::sp_platform_fns();
        fns.get_device_count = Some(get_device_count);
        fns.create_device = Some(create_device);
        fns.destroy_device = Some(destroy_device);
        fns.create_device_fns = Some(create_device_fns);
        fns.destroy_device_fns = Some(destroy_device_fns);
        fns.create_stream_executor = Some(create_stream_executor);
        fns.destroy_stream_executor = Some(destroy_stream_executor);
        p.destroy_platform = Some(destroy_platform);
        p.destroy_platform_fns = Some(destroy_platform_fns);
        Ok(())
    })
}
