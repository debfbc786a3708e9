//! How long a checkpoint takes, by how many commits it covers (see `CHECKPOINT_OPS`).
//! Run: `cargo run --release -p lockd-store --example checkpoint_cost -- 64` (commits per checkpoint).
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
use lockd_store::{RedbStore, RedbStoreOptions, Store};
use std::time::Instant;
fn rec(i: u64) -> LeaseRecord {
    LeaseRecord {
        resource: ResourceName::new(&format!("open-abcdef12-{i}")).unwrap(),
        lease_id: LeaseId::from_bytes([i as u8; 16]),
        token: FencingToken::new(i).unwrap(),
        holder: "lockbench".into(),
        ttl_ms: 30000,
        request_id: Some(format!("{:022}", i)),
        reentrant: None,
        permits: None,
        rw: None,
    }
}
fn main() {
    let k: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let mut s = RedbStore::open(
        dir.path(),
        &RedbStoreOptions {
            journal_bytes: 1 << 30,
            checkpoint_ops: usize::MAX,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 1..=20000u64 {
        s.commit(&[Op::Grant(rec(i))], false).unwrap();
    }
    s.flush().unwrap();
    let (mut c, mut f) = (vec![], vec![]);
    for j in 0..8000u64 {
        let i = 20001 + j;
        let old = rec(i - 20000);
        let ops = vec![
            Op::Remove {
                resource: old.resource.clone(),
                lease_id: old.lease_id,
            },
            Op::Grant(rec(i)),
        ];
        let t = Instant::now();
        s.commit(&ops, true).unwrap();
        s.tidy().unwrap();
        c.push(t.elapsed().as_micros());
        if j % k == k - 1 {
            let t = Instant::now();
            s.flush().unwrap();
            f.push(t.elapsed().as_micros());
        }
    }
    c.sort();
    f.sort();
    println!(
        "k={k}: commit+apply p50 {} p99 {} | checkpoint p50 {} p99 {} max {} | per-op checkpoint cost {:.0}us",
        c[c.len() / 2],
        c[c.len() * 99 / 100],
        f[f.len() / 2],
        f[f.len() * 99 / 100],
        f[f.len() - 1],
        f.iter().sum::<u128>() as f64 / 8000.0
    );
}
