//! Host writes recorded as one dispatch carrying their bytes (`TFWGPU_WRITE_DISPATCH_BYTES`,
//! `fill::write_small`): every length from 1 to 256 bytes at 4-byte aligned addresses that sit
//! anywhere in a binding-aligned block, checked byte for byte against a host model of the
//! whole region (the bytes around each write must keep their values), with the host mirror off
//! so that reads come from the GPU.
mod common;

use common::*;
use rand::Rng;

#[test]
fn small_writes_as_dispatches_are_exact_and_keep_their_neighbours() {
    // SAFETY: set before the first device use; this test binary has this one test.
    unsafe {
        std::env::set_var("TFWGPU_WRITE_DISPATCH_BYTES", "256");
        std::env::set_var("TFWGPU_HOST_MIRROR_BYTES", "0");
    }
    let d = dev();
    let mut rng = rng(21);
    let size = 2048usize;
    let addr = d.allocate(size as u64).unwrap();
    let mut model: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    // Larger than the switch: the usual upload path.
    d.write(addr, &model).unwrap();
    assert_eq!(d.read(addr, size).unwrap(), model, "the initial contents");
    let mut lens: Vec<usize> = vec![1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 252, 253, 255, 256];
    lens.extend((0..40).map(|_| rng.random_range(1..=256)));
    for (k, &len) in lens.iter().enumerate() {
        let off = 4 * rng.random_range(0..(size - len) / 4);
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let before = d.exec_stats().dispatches;
        d.write(addr + off as u64, &bytes).unwrap();
        assert_eq!(
            d.exec_stats().dispatches,
            before + 1,
            "a write of {len} bytes is one dispatch"
        );
        model[off..off + len].copy_from_slice(&bytes);
        if k % 5 == 4 || k + 1 == lens.len() {
            let got = d.read(addr, size).unwrap();
            if let Some(i) = got.iter().zip(&model).position(|(a, b)| a != b) {
                panic!(
                    "byte {i} is {:#x}, expected {:#x} (last write: {len} bytes at {off})",
                    got[i], model[i]
                );
            }
        }
    }
    // 257 bytes: the usual path again (no dispatch of this kind).
    let bytes: Vec<u8> = (0..257).map(|_| rng.random()).collect();
    d.write(addr + 512, &bytes).unwrap();
    model[512..769].copy_from_slice(&bytes);
    assert_eq!(d.read(addr, size).unwrap(), model, "after a 257-byte write");
    d.deallocate(addr).unwrap();
}
