//! Allocator: tensors sub-allocated out of large wgpu buffers ("heaps").
//!
//! An address is `((device + 1) << DEVICE_SHIFT) | ((heap + 1) << HEAP_SHIFT) | offset`, so
//! the addresses of two devices never coincide and a copy between devices can tell which
//! device owns each side (`device_of_address`). Any address inside a live allocation,
//! including one computed by adding an offset to its start (TensorFlow's BFC allocator splits
//! chunks that way), resolves to (buffer, offset). Address 0 is never handed out. A freed range
//! is reused only after the GPU work recorded before the free has completed.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::Mutex;

use crate::exec::{BufferRange, ExecutionContext, env_parse};
use crate::{Error, Result};

/// Empty buffers of their own (allocations over half a heap) kept for reuse by an allocation
/// of the same size.
const SPARE_DEDICATED: usize = 4;

/// Bits of an address that hold the offset inside a heap.
pub const HEAP_SHIFT: u32 = 40;
/// Where the device tag starts: bits 40..56 hold the heap, 56..64 the device.
pub const DEVICE_SHIFT: u32 = 56;
const OFFSET_MASK: u64 = (1 << HEAP_SHIFT) - 1;
const HEAP_MASK: u64 = (1 << (DEVICE_SHIFT - HEAP_SHIFT)) - 1;
/// Most devices one process can open.
pub const MAX_DEVICES: usize = 255;

/// The index of the device that handed out `addr` (0 for the first device), or `None` when
/// it is no device address.
pub fn device_of_address(addr: u64) -> Option<usize> {
    let tag = addr >> DEVICE_SHIFT;
    (tag != 0 && (addr >> HEAP_SHIFT) & HEAP_MASK != 0).then(|| tag as usize - 1)
}

/// Memory figures, as TensorFlow's allocator stats want them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes of live allocations (rounded to the allocation granule).
    pub bytes_in_use: u64,
    /// Highest `bytes_in_use` seen.
    pub peak_bytes_in_use: u64,
    /// Bytes freed but waiting for the GPU to finish with them.
    pub bytes_pending: u64,
    /// Bytes of device memory held in heaps.
    pub bytes_reserved: u64,
    /// The limit on `bytes_reserved`.
    pub bytes_limit: u64,
    /// Number of heaps.
    pub heaps: u64,
    /// Live allocations.
    pub num_allocs: u64,
    /// Largest single allocation seen.
    pub largest_alloc: u64,
}

struct Heap {
    buffer: wgpu::Buffer,
    size: u64,
    /// Free ranges, coalesced: offset -> size.
    free: BTreeMap<u64, u64>,
    /// Live allocations: offset -> size.
    live: BTreeMap<u64, u64>,
    /// Ranges freed but not yet reusable.
    pending: u64,
    /// Holds one large allocation; released to the driver when that is freed.
    dedicated: bool,
}

impl Heap {
    fn take(&mut self, size: u64) -> Option<u64> {
        // Best fit: the smallest free range that holds `size`.
        let (&off, &len) = self
            .free
            .iter()
            .filter(|(_, l)| **l >= size)
            .min_by_key(|(_, l)| **l)?;
        self.free.remove(&off);
        if len > size {
            self.free.insert(off + size, len - size);
        }
        self.live.insert(off, size);
        Some(off)
    }

    fn give_back(&mut self, off: u64, size: u64) {
        let mut start = off;
        let mut len = size;
        if let Some((&prev, &plen)) = self.free.range(..off).next_back()
            && prev + plen == off
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = self.free.get(&(off + size)) {
            self.free.remove(&(off + size));
            len += nlen;
        }
        self.free.insert(start, len);
    }

    fn is_empty(&self) -> bool {
        self.live.is_empty() && self.pending == 0
    }
}

struct Pending {
    tag: u64,
    heap: usize,
    offset: u64,
    size: u64,
}

#[derive(Default)]
struct State {
    heaps: Vec<Option<Heap>>,
    pending: VecDeque<Pending>,
    stats: AllocatorStats,
}

/// Sub-allocating device memory manager. Thread-safe.
pub struct Allocator {
    device: wgpu::Device,
    /// The device's index + 1, in the top bits of every address.
    tag: u64,
    granule: u64,
    heap_size: u64,
    max_binding: u64,
    max_buffer: u64,
    state: Mutex<State>,
}

/// A resolved address: the heap buffer, the offset of the address in it, and how many bytes of
/// the live allocation lie at and after it.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub remaining: u64,
}

impl Resolved {
    /// A binding of `size` bytes at this address.
    pub fn range(&self, size: u64) -> BufferRange {
        BufferRange {
            buffer: self.buffer.clone(),
            offset: self.offset,
            size,
        }
    }
}

impl Allocator {
    /// An allocator for the `index`-th device of the process (`index < MAX_DEVICES`).
    pub(crate) fn new(device: wgpu::Device, index: usize, limit: u64) -> Self {
        assert!(index < MAX_DEVICES, "at most {MAX_DEVICES} devices");
        let limits = device.limits();
        // 256 bytes covers every adapter's storage offset alignment and TensorFlow's
        // 64-byte alignment check on host and device buffers.
        let granule = (limits.min_storage_buffer_offset_alignment as u64).max(256);
        let max_binding = limits.max_storage_buffer_binding_size;
        let max_buffer = limits.max_buffer_size;
        let default_heap = 256 << 20;
        let heap_size = env_parse::<u64>("TFWGPU_HEAP_MB")
            .map(|mb| mb << 20)
            .unwrap_or(default_heap)
            .min(max_binding)
            .min(max_buffer)
            .max(granule)
            / granule
            * granule;
        let state = State {
            stats: AllocatorStats {
                bytes_limit: limit,
                ..Default::default()
            },
            ..Default::default()
        };
        Allocator {
            device,
            tag: index as u64 + 1,
            granule,
            heap_size,
            max_binding,
            max_buffer,
            state: Mutex::new(state),
        }
    }

    /// Alignment of every address handed out.
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// Size of a regular heap.
    pub fn heap_size(&self) -> u64 {
        self.heap_size
    }

    /// Largest allocation a kernel can bind whole.
    pub fn max_allocation(&self) -> u64 {
        self.max_binding.min(self.max_buffer)
    }

    /// Current figures.
    pub fn stats(&self) -> AllocatorStats {
        self.state.lock().stats
    }

    /// Allocates `size` bytes (0 is allowed and gets a granule). May wait for the GPU to finish
    /// with freed memory when the limit would otherwise be exceeded.
    pub fn allocate(&self, size: u64, exec: &ExecutionContext) -> Result<u64> {
        let rounded = size.max(1).next_multiple_of(self.granule);
        if rounded > self.max_allocation() {
            return Err(Error::OutOfMemory(format!(
                "an allocation of {size} bytes is larger than the adapter can bind in one \
                 buffer ({} bytes, max_storage_buffer_binding_size / max_buffer_size)",
                self.max_allocation()
            )));
        }
        loop {
            let completed = exec.completed();
            let mut st = self.state.lock();
            self.reclaim(&mut st, completed);
            if let Some(addr) = self.take(&mut st, rounded) {
                return Ok(addr);
            }
            // A new heap, if the limit allows. Large allocations get a heap of their own;
            // regular heaps shrink to the budget left under the limit.
            let dedicated = rounded > self.heap_size / 2;
            let budget = st.stats.bytes_limit.saturating_sub(st.stats.bytes_reserved);
            let heap_bytes = if dedicated {
                rounded
            } else {
                (self.heap_size.min(budget) / self.granule * self.granule).max(rounded)
            };
            if heap_bytes <= budget {
                let heap = self.new_heap(heap_bytes, dedicated)?;
                let idx = match st.heaps.iter().position(Option::is_none) {
                    Some(i) => {
                        st.heaps[i] = Some(heap);
                        i
                    }
                    None if (st.heaps.len() as u64) < HEAP_MASK => {
                        st.heaps.push(Some(heap));
                        st.heaps.len() - 1
                    }
                    None => {
                        return Err(Error::OutOfMemory(format!(
                            "{} heaps are live, the most one device can address",
                            st.heaps.len()
                        )));
                    }
                };
                st.stats.bytes_reserved += heap_bytes;
                st.stats.heaps += 1;
                tracing::debug!("new heap {idx}: {heap_bytes} bytes (dedicated: {dedicated})");
                let off = st.heaps[idx].as_mut().and_then(|h| h.take(rounded));
                let off = off.expect("a new heap holds the allocation it was made for");
                self.account(&mut st, rounded);
                return Ok(self.encode(idx, off));
            }
            // Memory freed but still in use by the GPU: wait for it, then try again.
            if let Some(tag) = st.pending.front().map(|p| p.tag) {
                drop(st);
                exec.wait(tag)?;
                continue;
            }
            // Release empty heaps that do not fit the request, then retry once more.
            if self.release_empty(&mut st) {
                continue;
            }
            return Err(Error::OutOfMemory(format!(
                "cannot allocate {size} bytes: {} bytes in use in {} heaps, limit {} bytes \
                 (set TFWGPU_MEMORY_LIMIT_MB to change it)",
                st.stats.bytes_in_use, st.stats.heaps, st.stats.bytes_limit
            )));
        }
    }

    fn account(&self, st: &mut State, size: u64) {
        st.stats.bytes_in_use += size;
        st.stats.num_allocs += 1;
        st.stats.peak_bytes_in_use = st.stats.peak_bytes_in_use.max(st.stats.bytes_in_use);
        st.stats.largest_alloc = st.stats.largest_alloc.max(size);
    }

    fn take(&self, st: &mut State, size: u64) -> Option<u64> {
        let found = st.heaps.iter_mut().enumerate().find_map(|(i, h)| {
            let h = h.as_mut()?;
            // Dedicated heaps hold exactly one allocation.
            if h.dedicated && (!h.live.is_empty() || h.size != size) {
                return None;
            }
            h.take(size).map(|off| (i, off))
        });
        let (i, off) = found?;
        self.account(st, size);
        Some(self.encode(i, off))
    }

    fn new_heap(&self, size: u64, dedicated: bool) -> Result<Heap> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tfwgpu heap"),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::OutOfMemory(format!(
                "the device could not create a buffer of {size} bytes: {e}"
            )));
        }
        let mut free = BTreeMap::new();
        free.insert(0, size);
        Ok(Heap {
            buffer,
            size,
            free,
            live: BTreeMap::new(),
            pending: 0,
            dedicated,
        })
    }

    fn reclaim(&self, st: &mut State, completed: u64) {
        while st.pending.front().is_some_and(|p| p.tag <= completed) {
            let p = st.pending.pop_front().expect("checked non-empty");
            st.stats.bytes_pending -= p.size;
            let heap = st.heaps[p.heap]
                .as_mut()
                .expect("pending range of a live heap");
            heap.pending -= p.size;
            heap.give_back(p.offset, p.size);
            if heap.dedicated && heap.is_empty() {
                // Kept for the next allocation of the same size (a kernel's large temporary
                // comes back every step; a new buffer is a driver allocation and a clear), up
                // to `SPARE_DEDICATED` of them; `release_empty` frees them under pressure.
                let spare = st
                    .heaps
                    .iter()
                    .flatten()
                    .filter(|h| h.dedicated && h.is_empty())
                    .count();
                if spare > SPARE_DEDICATED {
                    let heap = st.heaps[p.heap].take().expect("checked");
                    heap.buffer.destroy();
                    st.stats.bytes_reserved -= heap.size;
                    st.stats.heaps -= 1;
                }
            }
        }
    }

    fn release_empty(&self, st: &mut State) -> bool {
        let mut released = false;
        for slot in st.heaps.iter_mut() {
            if slot.as_ref().is_some_and(Heap::is_empty) {
                let heap = slot.take().expect("checked");
                heap.buffer.destroy();
                st.stats.bytes_reserved -= heap.size;
                st.stats.heaps -= 1;
                released = true;
            }
        }
        released
    }

    /// Frees the allocation that starts at `addr`. The range becomes reusable once batch `tag`
    /// (see `ExecutionContext::tag`) has completed.
    pub fn free(&self, addr: u64, tag: u64) -> Result<()> {
        let (heap_idx, off) = self.decode(addr)?;
        let mut st = self.state.lock();
        let heap = st
            .heaps
            .get_mut(heap_idx)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::InvalidArgument(format!("free of unknown address {addr:#x}")))?;
        let size = heap.live.remove(&off).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "free of {addr:#x}, which is not the start of a live allocation"
            ))
        })?;
        heap.pending += size;
        st.stats.bytes_in_use -= size;
        st.stats.bytes_pending += size;
        st.stats.num_allocs -= 1;
        st.pending.push_back(Pending {
            tag,
            heap: heap_idx,
            offset: off,
            size,
        });
        Ok(())
    }

    /// Resolves any address inside a live allocation.
    pub fn resolve(&self, addr: u64) -> Result<Resolved> {
        let (heap_idx, off) = self.decode(addr)?;
        let st = self.state.lock();
        let heap = st
            .heaps
            .get(heap_idx)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("address {addr:#x} is in no heap")))?;
        match heap.live.range(..=off).next_back() {
            Some((&start, &len)) if off < start + len || (len == 0 && off == start) => {
                Ok(Resolved {
                    buffer: heap.buffer.clone(),
                    offset: off,
                    remaining: start + len - off,
                })
            }
            _ => Err(Error::InvalidArgument(format!(
                "address {addr:#x} is not inside a live allocation"
            ))),
        }
    }

    /// Releases heaps that hold nothing (after their pending ranges completed).
    pub fn trim(&self, completed: u64) {
        let mut st = self.state.lock();
        self.reclaim(&mut st, completed);
        self.release_empty(&mut st);
    }

    /// Changes the limit on reserved bytes.
    pub fn set_limit(&self, limit: u64) {
        self.state.lock().stats.bytes_limit = limit;
    }
}

impl Allocator {
    fn encode(&self, heap: usize, offset: u64) -> u64 {
        (self.tag << DEVICE_SHIFT) | ((heap as u64 + 1) << HEAP_SHIFT) | offset
    }

    fn decode(&self, addr: u64) -> Result<(usize, u64)> {
        match device_of_address(addr) {
            None => Err(Error::InvalidArgument(format!(
                "{addr:#x} is not a device address"
            ))),
            Some(d) if d as u64 + 1 != self.tag => Err(Error::InvalidArgument(format!(
                "address {addr:#x} belongs to device {d}, not device {}",
                self.tag - 1
            ))),
            Some(_) => {
                let h = (addr >> HEAP_SHIFT) & HEAP_MASK;
                Ok(((h - 1) as usize, addr & OFFSET_MASK))
            }
        }
    }
}
