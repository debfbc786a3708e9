//! Reading the whole stored state back: a new leader's load.

use fencing::ResourceName;
use lockd_store_kv::{Key, Stored};
use redis::aio::MultiplexedConnection;

use crate::{Cluster, RedisError};

/// Fields asked for per `HSCAN` call: Redis serves other clients between calls.
const SCAN_COUNT: usize = 1000;

/// The state as read, and the id of the last batch (the next batch is conditional on it).
pub(crate) struct Read {
    pub stored: Stored,
    pub batch: String,
}

impl Cluster {
    /// The id of the last batch (`""`: none yet).
    pub(crate) async fn batch_id(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<String, RedisError> {
        let batch: Option<String> = self
            .within(
                "reading the batch key",
                redis::cmd("GET").arg(&self.keys.batch).query_async(conn),
            )
            .await?;
        Ok(batch.unwrap_or_default())
    }

    /// Reads the whole state through `conn` (the term's connection to its master).
    pub(crate) async fn read_state(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<Read, RedisError> {
        let mut stored = Stored::default();
        let hw: Option<Vec<u8>> = self
            .within(
                &format!("reading {}", self.keys.high_water),
                redis::cmd("GET")
                    .arg(&self.keys.high_water)
                    .query_async(conn),
            )
            .await?;
        if let Some(hw) = hw {
            stored
                .put(&Key::HighWater, &self.keys.high_water, &hw)
                .map_err(|e| RedisError::Corrupt(e.to_string()))?;
        }
        for (hash, lock) in [(&self.keys.locks, true), (&self.keys.requests, false)] {
            let mut cursor = 0u64;
            loop {
                let (next, fields): (u64, Vec<(String, Vec<u8>)>) = self
                    .within(
                        &format!("reading {hash}"),
                        redis::cmd("HSCAN")
                            .arg(hash)
                            .arg(cursor)
                            .arg("COUNT")
                            .arg(SCAN_COUNT)
                            .query_async(conn),
                    )
                    .await?;
                for (field, value) in fields {
                    let name = format!("{hash} {field:?}");
                    let key = if lock {
                        Key::Lock(ResourceName::new(&field).map_err(|e| {
                            RedisError::Corrupt(format!("{name} is not a record lockd wrote: {e}"))
                        })?)
                    } else {
                        Key::Request(field)
                    };
                    stored
                        .put(&key, &name, &value)
                        .map_err(|e| RedisError::Corrupt(e.to_string()))?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let batch = self.batch_id(conn).await?;
        Ok(Read { stored, batch })
    }
}
