//! Staging buffers for large uploads, kept mapped and reused.
//!
//! A large upload (a model's input batch) needs host-visible memory the GPU copies from. wgpu's
//! `Queue::write_buffer_with` allocates that memory per upload and frees it once the copy ran.
//! When uploads come one per training step, the freed block can go back to the driver between
//! two steps, so every step maps fresh memory and the host's copy into it pays a page fault per
//! page (ResNet-50's 38.5 MB batch: 6.8-7.7 ms of host time per upload inside the replay against
//! 1.5-1.6 ms back to back in `tfwgpu-bench transfer`, bench/RESULTS.md session 8).
//!
//! Here a staging buffer (MAP_WRITE | COPY_SRC) is taken mapped from the pool, written, unmapped
//! and its copy recorded in the open batch like any copy, so it is ordered with every other
//! command by construction. Once the batch holding the copy is submitted, the buffer is mapped
//! again (`map_async`, which completes after the GPU has run the copy) and its callback returns
//! it to the pool, with its pages still resident.

use std::sync::Arc;

use parking_lot::Mutex;

/// Capacities are whole MiB (or a power of two below 1 MiB), so that uploads of nearly the same
/// size share buffers.
pub(crate) fn capacity_for(size: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    if size >= MIB {
        size.next_multiple_of(MIB)
    } else {
        size.next_power_of_two().max(256)
    }
}

/// Mapped staging buffers ready for the next upload, at most `limit` bytes of them.
pub(crate) struct UploadPool {
    limit: u64,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    free: Vec<(u64, wgpu::Buffer)>,
    bytes: u64,
    /// Uploads served by a pooled buffer / by a new one (statistics for tests and benches).
    reused: u64,
    created: u64,
}

impl UploadPool {
    pub(crate) fn new(limit: u64) -> Arc<UploadPool> {
        Arc::new(UploadPool {
            limit,
            state: Mutex::new(PoolState::default()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// A mapped buffer of at least `size` bytes (and at most twice as many, so a small upload
    /// does not hold a large buffer): a pooled one, or a new one mapped at creation.
    pub(crate) fn take(&self, device: &wgpu::Device, size: u64) -> wgpu::Buffer {
        {
            let mut s = self.state.lock();
            let best = s
                .free
                .iter()
                .enumerate()
                .filter(|(_, (cap, _))| *cap >= size && *cap <= size.saturating_mul(2).max(256))
                .min_by_key(|(_, (cap, _))| *cap)
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (cap, buf) = s.free.swap_remove(i);
                s.bytes -= cap;
                s.reused += 1;
                return buf;
            }
            s.created += 1;
        }
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tfwgpu upload staging"),
            size: capacity_for(size),
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        })
    }

    /// Maps `buf` again once the GPU has run the work submitted so far that reads it, and
    /// returns it to the pool then (dropped instead if the pool is full or the map failed).
    /// Call only after the batch holding its copy has been submitted.
    pub(crate) fn recycle(self: &Arc<Self>, buf: wgpu::Buffer) {
        let pool = self.clone();
        let b = buf.clone();
        buf.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            if r.is_ok() {
                pool.put(b);
            }
        });
    }

    fn put(&self, buf: wgpu::Buffer) {
        let cap = buf.size();
        let mut s = self.state.lock();
        // Full: drop the smallest buffers first (the large ones are the costly ones to remake).
        while s.bytes + cap > self.limit && !s.free.is_empty() {
            let i = (0..s.free.len())
                .min_by_key(|&i| s.free[i].0)
                .expect("nonempty");
            if s.free[i].0 > cap {
                return;
            }
            let (c, _) = s.free.swap_remove(i);
            s.bytes -= c;
        }
        if s.bytes + cap <= self.limit {
            s.bytes += cap;
            s.free.push((cap, buf));
        }
    }

    /// (uploads served by a pooled buffer, buffers created, bytes pooled now).
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let s = self.state.lock();
        (s.reused, s.created, s.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::capacity_for;

    #[test]
    fn capacities_round_to_mib_or_powers_of_two() {
        assert_eq!(capacity_for(1), 256);
        assert_eq!(capacity_for(65536), 65536);
        assert_eq!(capacity_for(65537), 131072);
        assert_eq!(capacity_for(1 << 20), 1 << 20);
        assert_eq!(capacity_for((1 << 20) + 4), 2 << 20);
        assert_eq!(capacity_for(38_535_168), 37 << 20);
    }
}
