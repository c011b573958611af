//! GPU-only checks of the CUDA backing. They need an NVIDIA GPU with its driver and
//! NVRTC, so they are `#[ignore]`d: run with `cargo test --release -- --ignored`.
//! The same checks ship in the binary as `vramtop::backing::cuda::self_check`, for
//! GPU machines without cargo.

use vramtop::backing::cuda::{self_check, time_alloc_free, CudaBacking};
use vramtop::backing::Backing;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_self_check_passes() {
    let check = self_check(0);
    assert!(check.passed, "{}", check.report);
    println!("{}", check.report);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_backing_round_trip() {
    let mut b = CudaBacking::open(0, 64 << 20).expect("open device 0");
    assert!(b.kernels_ready(), "{}", b.kernel_status());
    let a = b.alloc_segment(4 << 20).expect("alloc");
    assert_eq!(b.fill(a, 4 << 20, 11), Ok(true));
    assert_eq!(b.verify(a, 4 << 20, 11), Ok(Some(0)));
    let p = b.page_size();
    let r = b.reserve_range(4 * p).expect("reserve");
    b.map_pages(r, 2 * p).expect("map");
    assert_eq!(b.held(), (4 << 20) + 2 * p);
    assert_eq!(b.fill(r, 2 * p, 12), Ok(true));
    assert_eq!(b.verify(r, 2 * p, 12), Ok(Some(0)));
    b.unmap_pages(r, 2 * p).expect("unmap");
    b.release_range(r, 4 * p).expect("release");
    b.free_segment(a, 4 << 20).expect("free");
    assert_eq!(b.held(), 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_alloc_free_timing() {
    let rows = time_alloc_free(0, &[512, 2 << 20, 64 << 20], 50).expect("timing");
    for (size, us) in rows {
        println!("{size} B: {us:.1} us");
    }
}
