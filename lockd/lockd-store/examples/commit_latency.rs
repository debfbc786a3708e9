//! Latency of one synced grant commit of the redb store (journal append + fdatasync).
//! Run: `cargo run --release -p lockd-store --example commit_latency`.
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
use lockd_store::{RedbStore, RedbStoreOptions, Store};
use std::time::Instant;
fn main() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let mut s = RedbStore::open(dir.path(), &RedbStoreOptions::default()).unwrap();
    let mut lat = vec![];
    for i in 1..=3000u64 {
        let rec = LeaseRecord {
            resource: ResourceName::new(&format!("bench-{}", i % 64)).unwrap(),
            lease_id: LeaseId::from_bytes([1; 16]),
            token: FencingToken::new(i).unwrap(),
            holder: "lockbench".into(),
            ttl_ms: 30000,
            request_id: Some(format!("{:032x}", i)),
            reentrant: None,
            permits: None,
            rw: None,
        };
        let t = Instant::now();
        s.commit(&[Op::Grant(rec.clone())], true).unwrap();
        lat.push(t.elapsed().as_micros());
        s.tidy().unwrap();
        s.commit(
            &[Op::Remove {
                resource: rec.resource.clone(),
                lease_id: rec.lease_id,
            }],
            false,
        )
        .unwrap();
        s.tidy().unwrap();
    }
    lat.sort();
    println!(
        "grant commit p50 {}us p99 {}us",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
}
