//! Transfers between two devices without a host copy (runtime peer.rs, `RuntimeOptions::peer`):
//! host memory imported into both devices, one device's queue copies into it, the other's out
//! of it, ordered by a timeline semaphore shared between them (`OPAQUE_FD`, `Device::peer_link`)
//! where the devices have one (else by a host wait for the source's batch, which `wait_ticket`
//! reports). Two logical devices of one adapter. On an adapter without host memory import (or
//! off Vulkan) the tests check that the runtime says so, and print that they skipped the
//! transfer. lavapipe has no `VK_KHR_external_semaphore_fd`: there the semaphore path cannot
//! run and the test says so (it ran on two H200s: bench/RESULTS.md, session 12).

use tfwgpu_runtime::Runtime;
use tfwgpu_runtime::peer::{HostShared, Ticket};

fn two_peer_devices(peer: bool) -> Runtime {
    Runtime::default_adapter_twice(|o| o.peer = peer).expect("the adapter opened twice")
}

fn bytes(seed: u32, n: usize) -> Vec<u8> {
    (0..n as u32)
        .flat_map(|i| (i.wrapping_mul(2654435761) ^ seed).to_le_bytes())
        .collect()
}

#[test]
fn without_the_option_devices_offer_no_peer_transfers() {
    let rt = two_peer_devices(false);
    let d = &rt.devices[0];
    assert!(d.peer_caps().is_none());
    let host = HostShared::new(4096, 4096).unwrap();
    let err = d.import_host(&host).err().expect("no import");
    assert!(err.to_string().contains("TFWGPU_PEER=1"), "{err}");
    assert!(d.peer_link(&rt.devices[1]).is_err());
    // Without a link the ticket is the batch id (host-ordered).
    assert!(matches!(
        d.flush_signal(&[]).unwrap()[..],
        [Ticket::Batch(_)]
    ));
}

#[test]
fn bytes_cross_through_imported_host_memory_in_order() {
    let rt = two_peer_devices(true);
    let (a, b) = (&rt.devices[0], &rt.devices[1]);
    let caps = a.peer_caps().cloned();
    eprintln!("peer caps: {caps:?}");
    let Some(caps) = caps.filter(|c| c.host_memory) else {
        eprintln!("SKIPPED: this adapter cannot import host memory");
        return;
    };
    let n = 3000usize; // 12,000 bytes: the host memory spans several pages
    let host = HostShared::new(2 * 4 * n as u64, caps.host_align).unwrap();
    let (ia, ib) = (a.import_host(&host).unwrap(), b.import_host(&host).unwrap());
    let src = a.allocate(4 * n as u64).unwrap();
    let dst = b.allocate(4 * n as u64).unwrap();
    let link = if caps.timeline_fd {
        Some(a.peer_link(b).unwrap())
    } else {
        eprintln!(
            "SEMAPHORE PATH NOT RUN: no OPAQUE_FD timeline semaphores here ({:?}); host-ordered",
            caps.missing
        );
        assert!(a.peer_link(b).is_err());
        None
    };
    // A link starts at its source and ends at its destination.
    if let Some(l) = &link {
        assert!(b.flush_signal(&[l]).is_err());
        assert!(a.wait_ticket(b, Some(l), Ticket::Value(1)).is_err());
        assert!(b.wait_ticket(a, None, Ticket::Value(1)).is_err());
    }
    for round in 0..3u32 {
        let data = bytes(round, n);
        // A: write, then copy into the second half of the host memory; B: poison its tensor.
        a.write(src, &data).unwrap();
        a.copy_to_buffer(src, &ia.buffer, 4 * n as u64, 4 * n as u64)
            .unwrap();
        b.write(dst, &vec![0xAB; 4 * n]).unwrap();
        let links: Vec<_> = link.iter().collect();
        let tickets = a.flush_signal(&links).unwrap();
        let ticket = tickets[0];
        assert_eq!(tickets.len(), 1);
        if link.is_some() {
            // Each submit signals the next value of the link's timeline.
            assert_eq!(ticket, Ticket::Value(round as u64 + 1));
        } else {
            assert!(matches!(ticket, Ticket::Batch(_)), "{ticket:?}");
        }
        let host_waited = b.wait_ticket(a, link.as_ref(), ticket).unwrap();
        assert_eq!(host_waited, link.is_none());
        b.copy_from_buffer(&ib.buffer, 4 * n as u64, dst, 4 * n as u64)
            .unwrap();
        assert_eq!(b.read(dst, 4 * n).unwrap(), data, "round {round}");
        assert_eq!(host.snapshot(4 * n as u64, 4 * n as u64), data);
        // The first half was never written.
        assert!(host.snapshot(0, 4 * n as u64).iter().all(|&x| x == 0));
        // The next round overwrites the source tensor: A must not run ahead of B's copy.
        a.synchronize().unwrap();
        b.synchronize().unwrap();
    }
    // Misuse is refused, not recorded.
    assert!(b.copy_from_buffer(&ib.buffer, 0, dst, 1 << 20).is_err());
    assert!(a.copy_to_buffer(src, &ia.buffer, 0, 6).is_err());
    a.deallocate(src).unwrap();
    b.deallocate(dst).unwrap();
    drop(link);
}

/// `Route`: many copies both ways through a small ring (reused many times over), with the
/// source overwritten right after each copy is recorded and the destination reading each copy
/// right after it: every destination holds the bytes its source held when its copy was recorded.
#[test]
fn routes_copy_in_order_through_a_reused_ring() {
    use tfwgpu_runtime::peer::Route;
    let rt = two_peer_devices(true);
    let (a, b) = (&rt.devices[0], &rt.devices[1]);
    if !a.peer_caps().is_some_and(|c| c.host_memory) {
        eprintln!("SKIPPED: this adapter cannot import host memory");
        assert!(Route::new(a, b, 1 << 16).is_err());
        return;
    }
    let ring = 1u64 << 16;
    let ab = Route::new(a, b, ring).unwrap();
    let ba = Route::new(b, a, ring).unwrap();
    eprintln!("{ab:?}");
    assert!(ab.ring_bytes() >= ring);
    let gpu = ab.gpu_ordered();
    if !gpu {
        eprintln!("SEMAPHORE PATH NOT RUN: host-ordered routes (no OPAQUE_FD timeline semaphores)");
    }
    let big = 1usize << 14; // bytes per source tensor
    let (sa, sb) = (
        a.allocate(big as u64).unwrap(),
        b.allocate(big as u64).unwrap(),
    );
    // Refused, not recorded: a length or address that is not a multiple of 4, more than half
    // the ring.
    let d0 = b.allocate(64).unwrap();
    assert!(!ab.copy(sa, d0, 6).unwrap());
    assert!(!ab.copy(sa + 2, d0, 8).unwrap());
    assert!(!ab.copy(sa, d0, ab.ring_bytes() / 2 + 4).unwrap());
    assert!(ab.copy(sa, d0, 0).unwrap());
    let mut expect = vec![];
    for i in 0..40u32 {
        // Sizes from 4 bytes to 16 KiB: 40 copies each way pass through the 64 KiB ring
        // several times.
        let len = [4usize, 252, 1000, 4096, 9996, big][i as usize % 6];
        for (route, from, to, src) in [(&ab, a, b, sa), (&ba, b, a, sb)] {
            let data = bytes(i * 2 + (src == sb) as u32, len / 4);
            from.write(src, &data).unwrap();
            let dst = to.allocate(len as u64).unwrap();
            let seen = to.allocate(len as u64).unwrap();
            assert!(route.copy(src, dst, len as u64).unwrap());
            // The source goes on: its tensor is overwritten at once.
            from.write(src, &vec![0xEE; len]).unwrap();
            // The destination reads the copy at once.
            to.copy(dst, seen, len as u64).unwrap();
            expect.push((to, seen, data, dst));
        }
    }
    for (k, (to, seen, data, dst)) in expect.into_iter().enumerate() {
        assert_eq!(to.read(seen, data.len()).unwrap(), data, "copy {k}");
        to.deallocate(seen).unwrap();
        to.deallocate(dst).unwrap();
    }
    // Host-ordered: one host wait per copy (the empty copy records nothing).
    assert_eq!(ab.host_waits(), if gpu { 0 } else { 40 });
    assert_eq!(ba.host_waits(), if gpu { 0 } else { 40 });
    eprintln!(
        "ring waits: {} and {}; host waits {} and {}",
        ab.ring_waits(),
        ba.ring_waits(),
        ab.host_waits(),
        ba.host_waits()
    );
    a.deallocate(sa).unwrap();
    b.deallocate(sb).unwrap();
    b.deallocate(d0).unwrap();
}
