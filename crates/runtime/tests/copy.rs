//! Device-to-device copies (kernels/copy.rs): inside one heap buffer and between two buffers
//! (shader copies, vec4 words where offsets and size are multiples of 16 bytes, else 32-bit
//! words), with the bytes around the destination untouched.
mod common;

use tfwgpu_runtime::{Runtime, RuntimeOptions};

/// A runtime whose heaps are 1 MiB, so that allocations over 512 KiB get buffers of their own
/// (this test binary is its own process: the variable reaches no other test).
fn runtime() -> Runtime {
    // SAFETY: set before any thread of this process reads the environment.
    unsafe { std::env::set_var("TFWGPU_HEAP_MB", "1") };
    Runtime::with_options(RuntimeOptions::from_env().unwrap()).unwrap()
}

#[test]
fn copies_between_and_inside_buffers() {
    let rt = runtime();
    let d = rt.device();
    let big = 600 << 10;
    // Two dedicated buffers and one small allocation in a shared heap.
    let a = d.allocate(big).unwrap();
    let b = d.allocate(big).unwrap();
    let c = d.allocate(4096).unwrap();
    let pattern = |seed: u32, n: usize| -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as u8)
            .collect()
    };
    let src = pattern(7, big as usize);
    d.write(a, &src).unwrap();
    // (source offset, destination offset, size): vec4 words (all multiples of 16), 32-bit
    // words (4-aligned), sizes of one word, odd word counts, a whole buffer.
    let cases: &[(u64, u64, u64)] = &[
        (0, 0, big),
        (256, 512, 4096),
        (16, 48, 160),
        (4, 8, 4),
        (12, 0, 1000),
        (260, 4, 100_004),
        (0, 16, 16),
        (1024, 2048, 48),
    ];
    for &(so, dof, n) in cases {
        for (to, room) in [(b, big), (c, 4096)] {
            if dof + n > room {
                continue;
            }
            let before = pattern(dof as u32 + 1, room as usize);
            d.write(to, &before).unwrap();
            d.copy(a + so, to + dof, n).unwrap();
            let got = d.read(to, room as usize).unwrap();
            let mut want = before.clone();
            want[dof as usize..(dof + n) as usize]
                .copy_from_slice(&src[so as usize..(so + n) as usize]);
            assert!(
                got == want,
                "copy of {n} bytes from +{so} to +{dof} ({} buffer)",
                if to == b { "another" } else { "a shared" }
            );
        }
    }
    // Inside one buffer (the single-binding word copy), and overlapping ranges are errors.
    d.copy(a + 64, a + 100_000, 4000).unwrap();
    let got = d.read(a + 100_000, 4000).unwrap();
    assert_eq!(got, src[64..4064]);
    assert!(d.copy(a, a + 8, 64).is_err());
    for x in [a, b, c] {
        d.deallocate(x).unwrap();
    }
}

#[test]
fn a_freed_buffer_of_its_own_serves_the_next_allocation_of_its_size() {
    let rt = runtime();
    let d = rt.device();
    let big = 700 << 10;
    let a = d.allocate(big).unwrap();
    d.write(a, &vec![7u8; big as usize]).unwrap();
    let before = d.memory_stats();
    d.deallocate(a).unwrap();
    d.synchronize().unwrap();
    for _ in 0..3 {
        // The same buffer again (a new one would read as zeros: wgpu clears new buffers).
        let b = d.allocate(big).unwrap();
        let s = d.memory_stats();
        assert_eq!(
            (s.heaps, s.bytes_reserved),
            (before.heaps, before.bytes_reserved)
        );
        assert_eq!(d.read(b, 16).unwrap(), vec![7u8; 16], "a reused buffer");
        d.deallocate(b).unwrap();
        d.synchronize().unwrap();
    }
    // Another size gets a buffer of its own.
    let c = d.allocate(big + 4096).unwrap();
    assert_eq!(d.memory_stats().heaps, before.heaps + 1);
    d.deallocate(c).unwrap();
}
