//! The leader's store: the core's batches as etcd transactions conditional on the leader key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{Op, Snapshot};
use lockd_store::{Store, StoreError, View, check_batch};
use tokio::runtime::Handle;
use tracing::error;

use crate::Cluster;
use crate::election::Term;
use crate::highwater::MARGIN;
use crate::keys::{LockRecord, ReentrantRecord, RequestRecord, RwSide};
use crate::state::Stored;

/// Most bytes of keys and values in one transaction: well under etcd's default
/// `--max-request-bytes` (1.5 MiB), whatever the limits on names, holders and request ids.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// What the store holds, as far as the preconditions need it (the leader is the only writer,
/// so this mirror is exact while the term lasts).
#[derive(Default)]
struct Mirror {
    leases: HashMap<ResourceName, LeaseId>,
    /// The stored record of every reentrant lease: a change of its holds rewrites it whole.
    reentrant: HashMap<ResourceName, LockRecord>,
    requests: HashSet<String>,
    last_token: Option<FencingToken>,
}

impl View for Mirror {
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError> {
        Ok(self.leases.get(resource).copied())
    }
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(self.requests.contains(request_id))
    }
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError> {
        Ok(self.last_token)
    }
}

impl Mirror {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Atomic(parts) => parts.iter().for_each(|p| self.apply(p)),
            Op::Grant(r) => {
                self.last_token = Some(r.token);
                self.leases.insert(r.resource.clone(), r.lease_id);
                if let Some(id) = &r.request_id {
                    self.requests.insert(id.clone());
                }
                if r.reentrant.is_some() {
                    self.reentrant.insert(r.resource.clone(), lock_record(r));
                }
            }
            Op::Remove { resource, .. } => {
                self.leases.remove(resource);
                self.reentrant.remove(resource);
            }
            Op::ForgetRequest { request_id } => {
                self.requests.remove(request_id);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                if let Some(rec) = self.reentrant.get_mut(resource) {
                    with_holds(rec, op);
                }
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    self.requests.insert(id.clone());
                }
            }
        }
    }
}

fn lock_record(r: &lockd_core::LeaseRecord) -> LockRecord {
    LockRecord {
        lease_id: r.lease_id.to_string(),
        token: r.token.get(),
        holder: r.holder.clone(),
        ttl_ms: r.ttl_ms,
        request_id: r.request_id.clone(),
        reentrant: r.reentrant.as_ref().map(ReentrantRecord::of),
        permits: r.permits,
        rw: r.rw.map(RwSide::of),
    }
}

/// `rec` with the holds a `Reenter` or `Unhold` sets.
fn with_holds(rec: &mut LockRecord, op: &Op) {
    let Some(r) = rec.reentrant.as_mut() else {
        return;
    };
    if let Op::Reenter { holds, .. } | Op::Unhold { holds, .. } = op {
        r.holds = *holds;
    }
}

/// The request record remembering the grant of `lock` (a lock record of `resource`).
fn request_change(resource: &str, lock: &LockRecord) -> Change {
    let request = RequestRecord {
        resource: resource.to_string(),
        lease_id: lock.lease_id.clone(),
        token: lock.token,
        holder: lock.holder.clone(),
        ttl_ms: lock.ttl_ms,
    };
    Change::Put(serde_json::to_string(&request).expect("a request record serialises"))
}

/// The state of one term in etcd. See the crate documentation.
pub struct EtcdStore {
    cluster: Arc<Cluster>,
    term: Arc<Term>,
    mirror: Mirror,
    /// Batches of this store committed so far, and the revision of the last one (`None`:
    /// none yet). Each batch is conditional on `{p}/batch` having that revision.
    batches: u64,
    last_batch: Option<i64>,
    /// Tells this store's batches from any other's in `{p}/batch`.
    nonce: u64,
    /// The runtime the etcd calls run on (`commit` is called from plain threads).
    runtime: Handle,
}

/// The value put under a key, or its deletion.
enum Change {
    Put(String),
    Delete,
}

impl Change {
    fn bytes(&self) -> usize {
        match self {
            Change::Put(v) => v.len(),
            Change::Delete => 0,
        }
    }
}

impl EtcdStore {
    /// The store of `term`, whose etcd calls run on the current runtime.
    pub fn new(cluster: Arc<Cluster>, term: Arc<Term>) -> EtcdStore {
        EtcdStore {
            cluster,
            term,
            mirror: Mirror::default(),
            batches: 0,
            last_batch: None,
            nonce: {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b)
                    .expect("the operating system's random number generator failed");
                u64::from_le_bytes(b)
            },
            runtime: Handle::current(),
        }
    }

    /// Reads the whole state at one revision, and applies the high-water rule (see
    /// [`highwater`](crate::highwater)).
    pub async fn load_async(&mut self) -> Result<Snapshot, StoreError> {
        let (stored, _) = self.cluster.read_state().await?;
        self.load_from(&stored).await
    }

    /// Starts from `stored` (a follower's warm copy, at or after the term's revision) instead
    /// of reading it, and applies the high-water rule.
    pub async fn load_from(&mut self, stored: &Stored) -> Result<Snapshot, StoreError> {
        let (mut snapshot, stored_hw) = stored.snapshot();
        let local = self.cluster.high_water().value();
        let mut last = stored_hw;
        if local > stored_hw {
            // Within the token range: at its top the core answers tokens_exhausted.
            last = local.saturating_add(MARGIN).min(FencingToken::MAX.get());
            error!(
                stored = stored_hw,
                local,
                continue_at = last,
                "etcd's token high-water is behind tokens this lockd has seen (etcd lost data, or was restored from a backup); tokens continue above this instance's high-water plus a margin"
            );
            // Written down at once, so that other instances continue from here too.
            self.put_high_water(last).await?;
        }
        snapshot.last_token = FencingToken::new(last);
        self.mirror = Mirror {
            leases: snapshot
                .leases
                .iter()
                .map(|r| (r.resource.clone(), r.lease_id))
                .collect(),
            requests: snapshot
                .requests
                .iter()
                .filter_map(|r| r.request_id.clone())
                .collect(),
            reentrant: snapshot
                .leases
                .iter()
                .filter(|r| r.reentrant.is_some())
                .map(|r| (r.resource.clone(), lock_record(r)))
                .collect(),
            last_token: snapshot.last_token,
        };
        self.cluster.high_water().saw(last);
        Ok(snapshot)
    }

    async fn put_high_water(&mut self, value: u64) -> Result<(), StoreError> {
        let mut changes = BTreeMap::new();
        changes.insert(
            self.cluster.keys().high_water().to_string(),
            Change::Put(value.to_string()),
        );
        self.apply(changes).await
    }

    /// One transaction of `changes`, conditional on the term twice (this instance's own
    /// check that its term is in force, by its clock checked against etcd's; and etcd's
    /// compare of the leader key's create revision and lease with the term's), and on the
    /// term's previous batch being the last one committed (`{p}/batch`'s mod revision).
    ///
    /// The last condition makes retries safe: a call that timed out on one member is sent
    /// again to another, and the first attempt may still land later. Landing after a later
    /// batch, it would undo that batch (a release's delete after the next grant's put); with
    /// the condition it fails and changes nothing. An attempt that fails because an earlier
    /// attempt of the same batch committed finds its own id in `{p}/batch`, and succeeds.
    async fn apply(&mut self, changes: BTreeMap<String, Change>) -> Result<(), StoreError> {
        if !self
            .term
            .wait_in_force(self.cluster.request_timeout())
            .await
        {
            return Err(StoreError::Deposed(format!(
                "this instance's term is over by its own clock{}",
                self.term
                    .ended()
                    .map_or(String::new(), |why| format!(": {why}"))
            )));
        }
        let keys = self.cluster.keys();
        let id = format!(
            "{}:{:016x}:{}",
            self.term.revision(),
            self.nonce,
            self.batches + 1
        );
        let mut ops: Vec<TxnOp> = changes
            .into_iter()
            .map(|(k, c)| match c {
                Change::Put(v) => TxnOp::put(k, v, None),
                Change::Delete => TxnOp::delete(k, None),
            })
            .collect();
        ops.push(TxnOp::put(keys.batch(), id.clone(), None));
        let after = match self.last_batch {
            Some(revision) => Compare::mod_revision(keys.batch(), CompareOp::Equal, revision),
            // The previous terms' batches all committed before this term's key was written.
            None => Compare::mod_revision(keys.batch(), CompareOp::Less, self.term.revision()),
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(keys.leader(), CompareOp::Equal, self.term.revision()),
                Compare::lease(keys.leader(), CompareOp::Equal, self.term.lease()),
                after,
            ])
            .and_then(ops)
            .or_else([TxnOp::get(keys.batch(), None)]);
        let r = self.cluster.txn("committing a batch", txn).await?;
        let committed = if r.succeeded() {
            r.header().map(|h| h.revision())
        } else {
            // An earlier attempt of this very batch may have committed (its answer lost).
            match r.op_responses().first() {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .filter(|kv| kv.value() == id.as_bytes())
                    .map(etcd_client::KeyValue::mod_revision),
                _ => None,
            }
        };
        match committed {
            Some(revision) => {
                self.batches += 1;
                self.last_batch = Some(revision);
                Ok(())
            }
            None => Err(StoreError::Deposed(format!(
                "{} is no longer this instance's key (revision {}, lease {}), or another batch was committed in between",
                keys.leader(),
                self.term.revision(),
                self.term.lease()
            ))),
        }
    }

    /// The key changes of `op`, merged into `changes` (a later change of a key replaces an
    /// earlier one: etcd allows one operation per key in a transaction). `before` holds the
    /// changes of the ops before it that the mirror does not show yet.
    fn changes_of(
        &self,
        op: &Op,
        before: &BTreeMap<String, Change>,
        changes: &mut BTreeMap<String, Change>,
    ) {
        let keys = self.cluster.keys();
        match op {
            // One op, so one transaction: its grants' keys are distinct (check_batch made
            // sure every part is a grant of another free resource), and a set of SET_MAX fits
            // in TXN_OPS_MIN operations, the fewest lockd is configured with.
            Op::Atomic(parts) => {
                for part in parts {
                    self.changes_of(part, before, changes);
                }
            }
            Op::Grant(r) => {
                let lock = lock_record(r);
                changes.insert(
                    keys.lock(r.resource.as_str()),
                    Change::Put(serde_json::to_string(&lock).expect("a lock record serialises")),
                );
                if let Some(id) = &r.request_id {
                    changes.insert(keys.request(id), request_change(r.resource.as_str(), &lock));
                }
                changes.insert(
                    keys.high_water().to_string(),
                    Change::Put(r.token.get().to_string()),
                );
            }
            Op::Remove { resource, .. } => {
                changes.insert(keys.lock(resource.as_str()), Change::Delete);
            }
            Op::ForgetRequest { request_id } => {
                changes.insert(keys.request(request_id), Change::Delete);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                // The record as the batch left it so far: put earlier in this transaction, or
                // as the mirror has it (check_batch made sure it is the stored lease).
                let key = keys.lock(resource.as_str());
                let earlier = match before.get(&key) {
                    Some(Change::Put(v)) => serde_json::from_str(v).ok(),
                    _ => None,
                };
                let Some(mut rec) =
                    earlier.or_else(|| self.mirror.reentrant.get(resource).cloned())
                else {
                    return;
                };
                with_holds(&mut rec, op);
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    // Remembered as a grant's is: a retried re-entry is a duplicate.
                    changes.insert(keys.request(id), request_change(resource.as_str(), &rec));
                }
                changes.insert(
                    key,
                    Change::Put(serde_json::to_string(&rec).expect("a lock record serialises")),
                );
            }
        }
    }

    /// Commits `ops` as few transactions as etcd's limits allow (`max_txn_ops` operations,
    /// [`MAX_TXN_BYTES`]), each a prefix-closed piece of
    /// the batch (a grant's lock, request record and high-water always travel together).
    async fn commit_async(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        // Refused before anything is sent: a refused batch changes nothing.
        check_batch(&self.mirror, ops)?;
        // One operation of each transaction is the put of `{p}/batch`.
        let max = self.cluster.max_txn_ops - 1;
        let mut start = 0;
        while start < ops.len() {
            let mut changes = BTreeMap::new();
            let (mut end, mut bytes) = (start, 0);
            while end < ops.len() {
                let mut next = BTreeMap::new();
                self.changes_of(&ops[end], &changes, &mut next);
                let fresh = next.keys().filter(|k| !changes.contains_key(*k)).count();
                let more: usize = next.iter().map(|(k, c)| k.len() + c.bytes()).sum();
                if end > start && (changes.len() + fresh > max || bytes + more > MAX_TXN_BYTES) {
                    break;
                }
                changes.extend(next);
                bytes += more;
                end += 1;
            }
            self.apply(changes).await?;
            for op in &ops[start..end] {
                self.mirror.apply(op);
            }
            if let Some(last) = self.mirror.last_token {
                self.cluster.high_water().saw(last.get());
            }
            start = end;
        }
        Ok(())
    }
}

impl Store for EtcdStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.load_async())
    }

    /// Every commit is durable (replicated to a majority) when it returns, `sync` or not.
    fn commit_runs_a_runtime(&self) -> bool {
        true
    }

    fn commit(&mut self, ops: &[Op], _sync: bool) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        let runtime = self.runtime.clone();
        runtime.block_on(self.commit_async(ops))
    }
}
