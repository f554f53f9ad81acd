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

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// Entries kept at most (the oldest go first). A recurrent layer's training step pushes the
/// shapes of each timestep's intermediates (int32 vectors the host computed) onto TensorLists
/// on the device and pops them back for the gradient: a GRU over 20 timesteps writes ~220 of
/// them before the first is read back (64 entries left most of them to the GPU: 170 reads per
/// step).
const MAX_ENTRIES: usize = 4096;

/// Bytes kept at most over all entries (the oldest go first).
const MAX_TOTAL_BYTES: usize = 4 << 20;

/// Writes are checked against entries over whole granules: a kernel may write the rest of its
/// output's last granule (allocations are padded to it).
const GRANULE: u64 = 256;

/// The entries, by address (they never overlap), and their order of arrival.
#[derive(Default)]
struct Entries {
    /// Address -> (arrival number, bytes).
    map: BTreeMap<u64, (u64, Box<[u8]>)>,
    /// (address, arrival number), oldest first; records of entries already gone are skipped.
    order: VecDeque<(u64, u64)>,
    next: u64,
    bytes: usize,
}

impl Entries {
    /// Removes the entries overlapping `[addr, addr + len)` (both widened to granules);
    /// entries are at most `max_bytes` long.
    fn remove_overlapping(&mut self, addr: u64, len: u64, max_bytes: usize) {
        let reach = (max_bytes as u64).max(1).next_multiple_of(GRANULE);
        let hi = addr.saturating_add(len.max(1).next_multiple_of(GRANULE));
        let hit: Vec<u64> = self
            .map
            .range(addr.saturating_sub(reach)..hi)
            .filter(|(a, (_, b))| overlaps(**a, b.len() as u64, addr, len))
            .map(|(a, _)| *a)
            .collect();
        for a in hit {
            if let Some((_, b)) = self.map.remove(&a) {
                self.bytes -= b.len();
            }
        }
    }

    /// Drops the oldest entries until the limits hold.
    fn evict(&mut self) {
        while self.map.len() > MAX_ENTRIES || self.bytes > MAX_TOTAL_BYTES {
            let Some((a, seq)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&a).is_some_and(|(s, _)| *s == seq)
                && let Some((_, b)) = self.map.remove(&a)
            {
                self.bytes -= b.len();
            }
        }
        // Records of removed entries pile up when writes remove entries: drop them.
        if self.order.len() > 2 * MAX_ENTRIES {
            let map = &self.map;
            self.order
                .retain(|(a, seq)| map.get(a).is_some_and(|(s, _)| s == seq));
        }
    }
}

/// Small host-written byte ranges of one device, by address.
pub(crate) struct HostMirror {
    /// Largest write remembered, in bytes (0: none).
    max_bytes: usize,
    entries: Mutex<Entries>,
    /// The number of entries, readable without the lock (most writes find no entry).
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
            entries: Mutex::new(Entries::default()),
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
        e.remove_overlapping(addr, data.len() as u64, self.max_bytes);
        let seq = e.next;
        e.next += 1;
        e.map.insert(addr, (seq, data.into()));
        e.order.push_back((addr, seq));
        e.bytes += data.len();
        e.evict();
        self.count.store(e.map.len(), Ordering::Release);
    }

    /// Something other than a host write is about to write `len` bytes at `addr`.
    pub(crate) fn written(&self, addr: u64, len: u64) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut e = self.entries.lock();
        e.remove_overlapping(addr, len, self.max_bytes);
        self.count.store(e.map.len(), Ordering::Release);
    }

    /// Fills `dst` with the bytes at `addr` if one entry holds all of them.
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        if self.count.load(Ordering::Acquire) == 0 || dst.is_empty() {
            return false;
        }
        let e = self.entries.lock();
        // Entries do not overlap: the one starting last at or before `addr` is the only
        // candidate.
        let hit = e
            .map
            .range(..=addr)
            .next_back()
            .filter(|(a, (_, b))| addr - **a + dst.len() as u64 <= b.len() as u64);
        match hit {
            Some((a, (_, b))) => {
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

    #[test]
    fn many_entries_and_the_byte_budget() {
        let m = HostMirror::new(16384);
        // Thousands of small entries stay readable (a recurrent step's pushed shapes).
        for k in 0..3000u64 {
            m.wrote(k * GRANULE, &(k as u32).to_le_bytes());
        }
        let mut w = [0u8; 4];
        for k in [0u64, 1, 1500, 2999] {
            assert!(m.read(k * GRANULE, &mut w), "entry {k}");
            assert_eq!(u32::from_le_bytes(w), k as u32);
        }
        // Writes over some of them remove just those.
        m.written(1500 * GRANULE, 4);
        assert!(!m.read(1500 * GRANULE, &mut w));
        assert!(m.read(1501 * GRANULE, &mut w) && m.read(1499 * GRANULE, &mut w));
        // Large entries: the oldest go once the bytes kept pass the budget.
        let big = 16384u64;
        let n = (MAX_TOTAL_BYTES as u64 / big) + 8;
        let base = 1 << 32;
        for k in 0..n {
            m.wrote(base + k * big, &vec![k as u8; big as usize]);
        }
        assert!(!m.read(0, &mut w), "small old entries went first");
        let mut b = vec![0u8; big as usize];
        assert!(m.read(base + (n - 1) * big, &mut b));
        assert!(b.iter().all(|&x| x == (n - 1) as u8));
        assert!(!m.read(base, &mut b), "the oldest large entry went");
        let e = m.entries.lock();
        assert!(e.bytes <= MAX_TOTAL_BYTES && e.map.len() <= MAX_ENTRIES);
        assert!(e.order.len() <= 2 * MAX_ENTRIES + 1);
    }
}
