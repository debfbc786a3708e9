//! Resident memory of the core with a million held leases (SDK-style request ids).
//! Run: `cargo run --release -p lockd-core --example core_memory`.
use fencing::{LeaseId, ResourceName};
use lockd_core::*;
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}
fn main() {
    let before = rss();
    let mut n = 0u64;
    let limits = Limits::default();
    let mut core = Core::new(
        limits.clone(),
        Box::new(move || {
            n += 1;
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&n.to_le_bytes());
            LeaseId::from_bytes(b)
        }),
    );
    let mut fx = Vec::new();
    for i in 0..1_000_000u64 {
        let req = AcquireRequest {
            resource: ResourceName::new(&format!("fill-1234abcd-{i:07}")).unwrap(),
            request_id: Some(RequestId::new(&format!("{:022}", i * 7919), &limits).unwrap()),
            holder: Holder::new("lockbench", &limits).unwrap(),
            ttl_ms: 3_600_000,
            wait_ms: 0,
            owner: None,
            permits: 0,
            rw: None,
        };
        core.acquire(1, req, &mut fx).unwrap();
        fx.clear();
    }
    println!("core with 1M leases: {} MiB", (rss() - before) / 1024);
}
