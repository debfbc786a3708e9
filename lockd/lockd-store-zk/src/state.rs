//! Reading the whole stored state back: a new leader's load.

use futures_util::StreamExt;
use lockd_store_kv::{Key, Stored};
use zookeeper_client as zk;

use crate::paths::BUCKETS;
use crate::{Cluster, ZkError, failed};

/// Calls in flight at once while the state is read.
const READ_AHEAD: usize = 256;

/// A bucket's parent, its name, and its children.
type Listed = (String, String, Vec<String>);

/// The state as read, and the version of `{p}/batch` (the next batch is conditional on it).
pub(crate) struct Read {
    pub stored: Stored,
    pub batch_version: i32,
}

impl Cluster {
    /// The version of `{p}/batch`, read through `client` after a sync.
    pub(crate) async fn batch_version(&self, client: &zk::Client) -> Result<i32, ZkError> {
        let doing = "reading the batch node";
        self.within(doing, client.sync(self.paths.batch())).await?;
        let (_, stat) = self
            .within(doing, client.get_data(self.paths.batch()))
            .await?;
        Ok(stat.version)
    }

    /// Reads the whole state through `client` (the term's session, which has seen its own
    /// election: every batch of the leaders before it is visible to it, after a sync).
    pub(crate) async fn read_state(&self, client: &zk::Client) -> Result<Read, ZkError> {
        let doing = "reading the state";
        self.within(doing, client.sync(self.paths.prefix())).await?;
        let mut stored = Stored::default();
        let hw = self.paths.high_water();
        let (data, _) = self.within(doing, client.get_data(hw)).await?;
        stored
            .put(&Key::HighWater, hw, &data)
            .map_err(|e| ZkError::Corrupt(e.to_string()))?;
        let (_, batch) = self
            .within(doing, client.get_data(self.paths.batch()))
            .await?;
        let buckets: Vec<(String, String)> = [self.paths.locks(), self.paths.requests()]
            .into_iter()
            .flat_map(|parent| (0..BUCKETS).map(move |b| (parent.to_string(), format!("{b:02x}"))))
            .collect();
        let listed: Vec<Result<Listed, ZkError>> = futures_util::stream::iter(buckets)
            .map(|(parent, bucket)| async move {
                let path = format!("{parent}/{bucket}");
                let children = self.within(doing, client.list_children(&path)).await?;
                Ok((parent, bucket, children))
            })
            .buffer_unordered(READ_AHEAD)
            .collect()
            .await;
        let mut nodes = Vec::new();
        for listed in listed {
            let (parent, bucket, children) = listed?;
            for child in children {
                let key = self.paths.parse(&parent, &bucket, &child)?;
                nodes.push((format!("{parent}/{bucket}/{child}"), key));
            }
        }
        let mut values = futures_util::stream::iter(nodes)
            .map(|(path, key)| async move {
                match self.answer(doing, client.get_data(&path)).await? {
                    Ok((data, _)) => Ok(Some((path, key, data))),
                    // Deleted between the list and the read: only a leader writes, and this
                    // reader leads, so only by hand.
                    Err(zk::Error::NoNode) => Ok(None),
                    Err(e) => Err(failed(doing, e)),
                }
            })
            .buffer_unordered(READ_AHEAD);
        while let Some(value) = values.next().await {
            if let Some((path, key, data)) = value? {
                stored
                    .put(&key, &path, &data)
                    .map_err(|e| ZkError::Corrupt(e.to_string()))?;
            }
        }
        Ok(Read {
            stored,
            batch_version: batch.version,
        })
    }
}
