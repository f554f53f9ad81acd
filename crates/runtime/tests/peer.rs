//! Transfers between two devices without a host copy (runtime peer.rs, `RuntimeOptions::peer`):
//! host memory imported into both devices, one device's queue copies into it, the other's out
//! of it, ordered by a sync-file semaphore where the devices have them (else by a host wait for
//! the source's batch, which `wait_ticket` reports). Two logical devices of one adapter. On an
//! adapter without host memory import (or off Vulkan) the tests check that the runtime says
//! so, and print that they skipped the transfer.

use tfwgpu_runtime::peer::{HostShared, Ticket};
use tfwgpu_runtime::{Runtime, RuntimeOptions, Selection};

fn two_peer_devices(peer: bool) -> Runtime {
    let one = Runtime::new().expect("an adapter");
    let i = one.device().description().index;
    drop(one);
    let mut opts = RuntimeOptions::from_env().expect("options");
    opts.selection = Selection {
        visible: Some(vec![i, i]),
        name: None,
    };
    opts.peer = peer;
    Runtime::with_options(opts).expect("the adapter opened twice")
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
    assert!(d.peer_semaphore(true).is_err());
    // Without a semaphore the ticket is the batch id (host-ordered).
    assert!(matches!(d.flush_signal(None).unwrap(), Ticket::Batch(_)));
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
    let sems = if caps.sync_fd {
        Some((
            a.peer_semaphore(true).unwrap(),
            b.peer_semaphore(false).unwrap(),
        ))
    } else {
        None
    };
    for round in 0..3u32 {
        let data = bytes(round, n);
        // A: write, then copy into the second half of the host memory; B: poison its tensor.
        a.write(src, &data).unwrap();
        a.copy_to_buffer(src, &ia.buffer, 4 * n as u64, 4 * n as u64)
            .unwrap();
        b.write(dst, &vec![0xAB; 4 * n]).unwrap();
        let ticket = a.flush_signal(sems.as_ref().map(|s| &s.0)).unwrap();
        assert_eq!(matches!(ticket, Ticket::Fd(_)), caps.sync_fd, "{ticket:?}");
        let host_waited = b
            .wait_ticket(a, sems.as_ref().map(|s| &s.1), ticket)
            .unwrap();
        assert_eq!(host_waited, !caps.sync_fd);
        b.copy_from_buffer(&ib.buffer, 4 * n as u64, dst, 4 * n as u64)
            .unwrap();
        assert_eq!(b.read(dst, 4 * n).unwrap(), data, "round {round}");
        assert_eq!(host.snapshot(4 * n as u64, 4 * n as u64), data);
        // The first half was never written.
        assert!(host.snapshot(0, 4 * n as u64).iter().all(|&x| x == 0));
        // The semaphores are reused once both devices synchronized (the signal exported, the
        // temporary import used up by its wait).
        a.synchronize().unwrap();
        b.synchronize().unwrap();
    }
    // Misuse is refused, not recorded.
    assert!(b.copy_from_buffer(&ib.buffer, 0, dst, 1 << 20).is_err());
    assert!(a.copy_to_buffer(src, &ia.buffer, 0, 6).is_err());
    a.deallocate(src).unwrap();
    b.deallocate(dst).unwrap();
}
