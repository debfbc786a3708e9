//! The replicated fence: marks in PostgreSQL, so that several fence-proxy processes in front of
//! one upstream enforce one rule (DESIGN.md invariants 3 and 4 across replicas).
//!
//! Table `fence_proxy.marks (resource text primary key, token bigint)`, created at start-up
//! (idempotently, under an advisory lock so that replicas starting together do not race).
//!
//! A fenced request with token `t`:
//!
//! 1. is refused at once if a mark this replica has seen committed is above `t` (a cache that
//!    can only be behind the table, so it never refuses wrongly);
//! 2. opens a transaction and reads the mark `FOR SHARE`:
//!    - equal to `t`: the request is relayed *inside* that transaction, which ends when the
//!      request does. Its share lock is what makes a newer token wait for it, on any replica;
//!    - above `t`: refused (stale);
//!    - below `t` or absent: the transaction ends, and another one raises the mark with an atomic
//!      conditional upsert (`... ON CONFLICT DO UPDATE ... WHERE marks.token < $2`). That update
//!      waits for the share locks of the older-token requests still in flight, on every replica
//!      (the barrier), at most `barrier_wait_ms` (`lock_timeout`); it commits, so the mark is
//!      durable before anything with it is relayed; then step 2 runs again.
//!
//! Requests that arrive while a raise waits queue behind it on the row, so a stream of older
//! requests cannot starve the new holder. Each request in flight holds one pooled connection:
//! `fence.postgres_pool_size` bounds the fenced requests in flight per replica.

use std::time::Duration;

use compact_str::CompactString;
use dashmap::DashMap;
use fencing::{FencingToken, ResourceName};
use http_relay::{BoxFuture, Fence, Permit, Refusal};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

/// SQLSTATE of `lock_timeout` expiring: the barrier wait ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

const SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS fence_proxy;
CREATE TABLE IF NOT EXISTS fence_proxy.marks (
    resource text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0)
);";

/// The records of marks changed by hand (`fence-proxy marks`, admin.rs).
pub const CHANGES_SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS fence_proxy;
CREATE TABLE IF NOT EXISTS fence_proxy.mark_changes (
    at        timestamptz NOT NULL DEFAULT now(),
    resource  text        NOT NULL,
    action    text        NOT NULL,
    old_token bigint,
    new_token bigint,
    actor     text        NOT NULL,
    reason    text        NOT NULL
);";

/// See the module documentation.
pub struct PgFence {
    pool: PgPool,
    /// Marks known committed (never above the table's).
    cache: DashMap<CompactString, i64>,
    barrier_wait: Duration,
}

impl PgFence {
    /// Connects, and creates the table if needed.
    pub async fn connect(
        url: &str,
        pool_size: u32,
        barrier_wait: Duration,
    ) -> anyhow::Result<PgFence> {
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(barrier_wait)
            .connect(url)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL for the marks: {e}"))?;
        let mut tx = pool.begin().await?;
        // Replicas starting together: one creates, the others find it created.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fence_proxy.schema'))")
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(PgFence {
            pool,
            cache: DashMap::new(),
            barrier_wait,
        })
    }

    /// Marks in the table (for logs at start-up).
    pub async fn count(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM fence_proxy.marks")
            .fetch_one(&self.pool)
            .await?)
    }

    fn seen(&self, resource: &ResourceName, token: i64) {
        let mut e = self
            .cache
            .entry(CompactString::new(resource.as_str()))
            .or_insert(token);
        *e = (*e).max(token);
    }

    async fn admit_pg(
        &self,
        resource: ResourceName,
        token: FencingToken,
    ) -> Result<Permit, Refusal> {
        let t = token.as_i64();
        if let Some(cached) = self.cache.get(resource.as_str()).map(|c| *c)
            && cached > t
        {
            return Err(stale(resource, token, cached));
        }
        let unavailable = |e: sqlx::Error| Refusal::Unavailable {
            resource: resource.clone(),
            reason: e.to_string(),
        };
        let deadline = tokio::time::Instant::now() + self.barrier_wait;
        loop {
            let mut tx = self.pool.begin().await.map_err(unavailable)?;
            let current: Option<i64> = sqlx::query_scalar(
                "SELECT token FROM fence_proxy.marks WHERE resource = $1 FOR SHARE",
            )
            .bind(resource.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
            match current {
                Some(c) if c == t => {
                    self.seen(&resource, c);
                    return Ok(Permit::new(Shared { tx: Some(tx) }));
                }
                Some(c) if c > t => {
                    self.seen(&resource, c);
                    return Err(stale(resource, token, c));
                }
                _ => {
                    drop(tx); // ends the share lock before raising
                    self.raise(&resource, t, deadline).await?;
                }
            }
        }
    }

    /// Raises the mark to `t` (if it is below) and commits; waits for older requests' share
    /// locks until `deadline`.
    async fn raise(
        &self,
        resource: &ResourceName,
        t: i64,
        deadline: tokio::time::Instant,
    ) -> Result<(), Refusal> {
        let unavailable = |e: sqlx::Error| Refusal::Unavailable {
            resource: resource.clone(),
            reason: e.to_string(),
        };
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis()
            .max(1);
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        // The bounded barrier: how long the update below may wait for older requests' locks.
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(format!("{left}ms"))
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        let raised = sqlx::query(
            "INSERT INTO fence_proxy.marks AS m (resource, token) VALUES ($1, $2)
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE m.token < EXCLUDED.token",
        )
        .bind(resource.as_str())
        .bind(t)
        .execute(&mut *tx)
        .await;
        let rows = match raised {
            Ok(done) => done.rows_affected(),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                return Err(Refusal::Barrier {
                    resource: resource.clone(),
                    older: 0,
                });
            }
            Err(e) => return Err(unavailable(e)),
        };
        tx.commit().await.map_err(unavailable)?;
        tracing::debug!(%resource, token = t, "mark raised in PostgreSQL");
        if rows > 0 {
            opskit::fence::get().raised(opskit::fence::Mode::Http, resource.as_str(), t as u64);
        }
        Ok(())
    }
}

fn stale(resource: ResourceName, token: FencingToken, highest: i64) -> Refusal {
    let highest = FencingToken::new(highest as u64).expect("stored marks are valid tokens");
    Refusal::Stale {
        resource,
        token,
        highest,
    }
}

impl Fence for PgFence {
    fn admit<'a>(
        &'a self,
        resource: &'a ResourceName,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Permit, Refusal>> {
        Box::pin(self.admit_pg(resource.clone(), token))
    }
}

/// The share-lock transaction of a request in flight; ends (and releases the lock) when the
/// request does.
struct Shared {
    tx: Option<Transaction<'static, Postgres>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // Nothing was written in it: ending it releases the share lock, now rather than
            // whenever the pooled connection is next used.
            rt.spawn(async move {
                let _ = tx.commit().await;
            });
        }
    }
}
