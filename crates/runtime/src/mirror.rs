//! Host copies of small tensors the host wrote, so that reading them back does not wait for
//! the GPU.
//!
//! TensorFlow's programs read small values back that they uploaded themselves: a stateless
//! RNG's key and counter (computed by a host kernel, uploaded, read back by the next step's
//! host kernel), a replica's labels (uploaded, then read back for an int32 op that runs on the
//! host), scalars another device sent. A device-to-host copy is ordered after all the work
//! recorded before it, so each such read waited for the GPU to finish everything queued (on
//! two H200s: 0.15-0.42 ms per read, on the critical path of a MirroredStrategy step). When
//! the bytes at an address are still the ones the host wrote, the read is answered from this
//! copy at once: same bytes, no GPU round trip.
//!
//! An entry stays valid until something else writes its range: every write path of
//! [`crate::Device`] (kernel outputs, device-to-device copies, fills, host writes) reports the
//! range it writes here first. TensorFlow orders conflicting accesses of one buffer on the
//! host (an op starts after the ops it depends on have been issued), so the order in which
//! these calls reach the device is the order of the work.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// Entries kept at most (the oldest goes first).
const MAX_ENTRIES: usize = 64;

/// Writes are checked against entries over whole granules: a kernel may write the rest of its
/// output's last granule (allocations are padded to it).
const GRANULE: u64 = 256;

/// Small host-written byte ranges of one device, by address.
pub(crate) struct HostMirror {
    /// Largest write remembered, in bytes (0: none).
    max_bytes: usize,
    entries: Mutex<Vec<(u64, Box<[u8]>)>>,
    /// `entries.len()`, readable without the lock (most writes find no entry).
    count: AtomicUsize,
}

/// True when `[a, a + n)` and `[b, b + m)` overlap, each widened to whole granules.
fn overlaps(a: u64, n: u64, b: u64, m: u64) -> bool {
    let end = |x: u64, len: u64| x.saturating_add(len.max(1).next_multiple_of(GRANULE));
    a < end(b, m) && b < end(a, n)
}

impl HostMirror {
    pub(crate) fn new(max_bytes: usize) -> HostMirror {
        HostMirror {
            max_bytes,
            entries: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }

    /// The host wrote `data` at `addr` (after the write was recorded).
    pub(crate) fn wrote(&self, addr: u64, data: &[u8]) {
        if data.len() > self.max_bytes {
            self.written(addr, data.len() as u64);
            return;
        }
        let mut e = self.entries.lock();
        e.retain(|(a, b)| !overlaps(*a, b.len() as u64, addr, data.len() as u64));
        if e.len() >= MAX_ENTRIES {
            e.remove(0);
        }
        e.push((addr, data.into()));
        self.count.store(e.len(), Ordering::Release);
    }

    /// Something other than a host write is about to write `len` bytes at `addr`.
    pub(crate) fn written(&self, addr: u64, len: u64) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut e = self.entries.lock();
        e.retain(|(a, b)| !overlaps(*a, b.len() as u64, addr, len));
        self.count.store(e.len(), Ordering::Release);
    }

    /// Fills `dst` with the bytes at `addr` if one entry holds all of them.
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        if self.count.load(Ordering::Acquire) == 0 || dst.is_empty() {
            return false;
        }
        let e = self.entries.lock();
        let hit = e
            .iter()
            .rev()
            .find(|(a, b)| addr >= *a && addr - *a + dst.len() as u64 <= b.len() as u64);
        match hit {
            Some((a, b)) => {
                let from = (addr - a) as usize;
                dst.copy_from_slice(&b[from..from + dst.len()]);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_answer_reads_inside_them_until_written_over() {
        let m = HostMirror::new(1024);
        m.wrote(4096, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut b = [0u8; 4];
        assert!(m.read(4100, &mut b));
        assert_eq!(b, [5, 6, 7, 8]);
        let mut past = [0u8; 8];
        assert!(!m.read(4100, &mut past), "a read past the entry's end");
        assert!(!m.read(4000, &mut b), "a read before it");
        // A write elsewhere in another granule keeps it; one in its granule removes it.
        m.written(4096 + 256, 4);
        assert!(m.read(4096, &mut b));
        m.written(4096 - 256, 260);
        assert!(!m.read(4096, &mut b));
    }

    #[test]
    fn large_writes_replace_entries_without_being_kept_and_old_entries_go() {
        let m = HostMirror::new(16);
        m.wrote(0, &[9; 8]);
        m.wrote(0, &[7; 32]);
        let mut b = [0u8; 8];
        assert!(
            !m.read(0, &mut b),
            "a write too large to keep still removes the entry"
        );
        for k in 0..(MAX_ENTRIES as u64 + 1) {
            m.wrote(k * GRANULE, &[k as u8; 4]);
        }
        let mut w = [0u8; 4];
        assert!(!m.read(0, &mut w), "the oldest entry went");
        assert!(m.read(GRANULE * MAX_ENTRIES as u64, &mut w));
        assert_eq!(w, [MAX_ENTRIES as u8; 4]);
        let off = HostMirror::new(0);
        off.wrote(0, &[1; 4]);
        assert!(!off.read(0, &mut w), "size 0 keeps nothing");
    }
}
