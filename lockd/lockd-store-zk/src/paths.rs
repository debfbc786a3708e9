//! Where lockd keeps its state in ZooKeeper, under one prefix (`/lockd` by default). Everything
//! is readable with `zkCli.sh`:
//!
//! | node | data | kind |
//! |---|---|---|
//! | `{p}/election/member-{sequence}` | [`LeaderRecord`](lockd_store_kv::records::LeaderRecord) as JSON: a candidate, and where to reach it | ephemeral, sequential: the lowest leads |
//! | `{p}/high-water` | the highest token ever granted, decimal | persistent |
//! | `{p}/batch` | the last committed batch, `{term node}:{store nonce}:{number}`; its version orders the batches | persistent |
//! | `{p}/locks/{bucket}/{resource}` | [`LockRecord`](lockd_store_kv::records::LockRecord) as JSON | persistent |
//! | `{p}/requests/{bucket}/{request id}` | [`RequestRecord`](lockd_store_kv::records::RequestRecord) as JSON | persistent |
//!
//! Names are percent-encoded (ASCII letters, digits and `-_:@` stay; every other byte is
//! `%XX`), because a ZooKeeper node name may hold no `/` and may not be `.` or `..`. The
//! records spread over [`BUCKETS`] buckets by a hash of the name, because ZooKeeper lists a
//! node's children in one answer of at most 1 MiB (`jute.maxbuffer`): a million request ids
//! in one node could not be listed.
//!
//! Only the leader writes, and every write of the leader is a multi-op that checks its own
//! election node first: once that node is gone (its session ended), nothing it sends commits.

use lockd_store_kv::Key;

use crate::ZkError;

/// Buckets of the locks and of the request records each.
pub const BUCKETS: usize = 256;

/// The paths under one prefix.
pub struct Paths {
    prefix: String,
    election: String,
    high_water: String,
    batch: String,
    locks: String,
    requests: String,
}

impl Paths {
    /// The paths under `prefix`: an absolute ZooKeeper path (`/lockd`, `/teams/a/lockd`).
    pub fn new(given: &str) -> Result<Paths, ZkError> {
        let bad = |why: &str| {
            ZkError::Config(format!(
                "zk_prefix {given:?} {why}; use an absolute path such as /lockd"
            ))
        };
        if !given.starts_with('/') {
            return Err(bad("does not start with /"));
        }
        // A trailing slash is dropped ("/lockd/" is "/lockd"); the root is no prefix.
        let prefix = given.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(bad("is the root, which holds ZooKeeper's own nodes"));
        }
        if prefix
            .split('/')
            .skip(1)
            .any(|part| part.is_empty() || part == "." || part == "..")
        {
            return Err(bad("has an empty, . or .. part"));
        }
        if prefix == "/zookeeper" || prefix.starts_with("/zookeeper/") {
            return Err(bad("is ZooKeeper's own"));
        }
        if prefix.chars().any(|c| c.is_control()) {
            return Err(bad("holds a control character"));
        }
        Ok(Paths {
            election: format!("{prefix}/election"),
            high_water: format!("{prefix}/high-water"),
            batch: format!("{prefix}/batch"),
            locks: format!("{prefix}/locks"),
            requests: format!("{prefix}/requests"),
            prefix: prefix.to_string(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The paths above the prefix (`/a`, `/a/b` for `/a/b/c`), nearest last.
    pub fn ancestors(&self) -> Vec<String> {
        let parts: Vec<&str> = self.prefix.split('/').skip(1).collect();
        (1..parts.len())
            .map(|n| format!("/{}", parts[..n].join("/")))
            .collect()
    }

    /// The parent of the candidates' nodes.
    pub fn election(&self) -> &str {
        &self.election
    }

    /// The path of a candidate's node before ZooKeeper appends its sequence number.
    pub fn candidate(&self) -> String {
        format!("{}/member-", self.election)
    }

    pub fn high_water(&self) -> &str {
        &self.high_water
    }

    pub fn batch(&self) -> &str {
        &self.batch
    }

    /// The parent of the lock buckets.
    pub fn locks(&self) -> &str {
        &self.locks
    }

    /// The parent of the request buckets.
    pub fn requests(&self) -> &str {
        &self.requests
    }

    /// Every node lockd creates when it first meets a ZooKeeper: the prefix's own parts, the
    /// parents and their buckets (the high-water and the batch nodes are created with data).
    pub fn skeleton(&self) -> Vec<String> {
        let mut nodes = Vec::new();
        let mut at = String::new();
        for part in self.prefix.split('/').skip(1) {
            at = format!("{at}/{part}");
            nodes.push(at.clone());
        }
        nodes.extend([
            self.election.clone(),
            self.locks.clone(),
            self.requests.clone(),
        ]);
        for parent in [&self.locks, &self.requests] {
            nodes.extend((0..BUCKETS).map(|b| format!("{parent}/{b:02x}")));
        }
        nodes
    }

    /// The path of a record's place.
    pub fn name(&self, key: &Key) -> String {
        match key {
            Key::HighWater => self.high_water.clone(),
            Key::Lock(resource) => in_bucket(&self.locks, resource.as_str()),
            Key::Request(id) => in_bucket(&self.requests, id),
        }
    }

    /// The record's place of the node `node` in bucket `bucket` of `parent` (the locks' or the
    /// requests'), or why it is not one lockd writes.
    pub fn parse(&self, parent: &str, bucket: &str, node: &str) -> Result<Key, ZkError> {
        let path = format!("{parent}/{bucket}/{node}");
        let corrupt = |why: &str| ZkError::Corrupt(format!("{path}: {why}"));
        let name = decode(node).ok_or_else(|| corrupt("not a name lockd encodes"))?;
        if format!("{:02x}", bucket_of(&name)) != bucket {
            return Err(corrupt("in another bucket than its name's"));
        }
        if parent == self.locks {
            fencing::ResourceName::new(&name)
                .map(Key::Lock)
                .map_err(|e| corrupt(&e.to_string()))
        } else {
            Ok(Key::Request(name))
        }
    }
}

impl Paths {
    /// The length of [`Paths::name`]'s path for `key`, without building it (a batch is cut
    /// by its bytes before it is sent).
    pub fn name_len(&self, key: &Key) -> usize {
        let in_bucket = |parent: &str, name: &str| {
            let encoded: usize = name.bytes().map(|b| if kept(b) { 1 } else { 3 }).sum();
            parent.len() + "/00/".len() + encoded
        };
        match key {
            Key::HighWater => self.high_water.len(),
            Key::Lock(resource) => in_bucket(&self.locks, resource.as_str()),
            Key::Request(id) => in_bucket(&self.requests, id),
        }
    }
}

fn in_bucket(parent: &str, name: &str) -> String {
    format!("{parent}/{:02x}/{}", bucket_of(name), encode(name))
}

/// The bucket of a name: FNV-1a, its low byte.
fn bucket_of(name: &str) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h as usize) % BUCKETS
}

fn kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'@')
}

/// A name as a node name: see the module documentation.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if kept(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The name a node name encodes, if it is one [`encode`] makes (and only that: a name has
/// one node name).
pub fn decode(node: &str) -> Option<String> {
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = node.get(i + 1..i + 3)?;
            if hex.bytes().any(|h| h.is_ascii_lowercase()) {
                return None;
            }
            let v = u8::from_str_radix(hex, 16).ok()?;
            if kept(v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else if kept(b) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_one_node_name_that_zookeeper_takes() {
        for name in [
            "a",
            "inventory:sku-1",
            "tenant/a/b",
            ".",
            "..",
            "a.b",
            "q 1",
            "%41",
            "x@y",
        ] {
            let node = encode(name);
            assert!(
                !node.contains('/') && node != "." && node != "..",
                "{name} -> {node}"
            );
            assert_eq!(decode(&node).as_deref(), Some(name), "{name} -> {node}");
        }
        // Another spelling of the same name is not a node lockd writes.
        for other in ["%61", "%2f", "a%2", "a/b", "", "a b", "%"] {
            assert_eq!(decode(other), None, "{other:?} must not decode");
        }
    }

    #[test]
    fn a_node_is_parsed_back_to_its_key_and_only_in_its_bucket() {
        let p = Paths::new("/lockd/").unwrap();
        let key = Key::Lock(fencing::ResourceName::new("cron/nightly").unwrap());
        let path = p.name(&key);
        let rest = path.strip_prefix("/lockd/locks/").unwrap();
        let (bucket, node) = rest.split_once('/').unwrap();
        assert_eq!(p.parse(p.locks(), bucket, node).unwrap(), key);
        assert_eq!(p.name_len(&key), path.len());
        let other = format!("{:02x}", (bucket_of("cron/nightly") + 1) % BUCKETS);
        assert!(matches!(
            p.parse(p.locks(), &other, node),
            Err(ZkError::Corrupt(_))
        ));
        let q = Key::Request("retry 1/2".to_string());
        let path = p.name(&q);
        let (bucket, node) = path
            .strip_prefix("/lockd/requests/")
            .unwrap()
            .split_once('/')
            .unwrap();
        assert_eq!(p.parse(p.requests(), bucket, node).unwrap(), q);
        assert_eq!(p.name_len(&q), path.len());
        assert_eq!(p.name_len(&Key::HighWater), p.name(&Key::HighWater).len());
    }

    #[test]
    fn a_prefix_must_be_an_absolute_path_of_lockds_own() {
        for bad in [
            "lockd",
            "/a//b",
            "/a/./b",
            "/zookeeper",
            "/zookeeper/x",
            "/a/..",
            "/",
            "//",
        ] {
            let Err(e) = Paths::new(bad) else {
                panic!("{bad} must be refused");
            };
            // Named as it was given.
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert_eq!(Paths::new("/a/").unwrap().prefix(), "/a");
        assert_eq!(Paths::new("/a/b/c").unwrap().ancestors(), ["/a", "/a/b"]);
        assert!(Paths::new("/a").unwrap().ancestors().is_empty());
        let p = Paths::new("/teams/a").unwrap();
        assert_eq!(&p.skeleton()[..2], ["/teams", "/teams/a"]);
        assert_eq!(p.skeleton().len(), 2 + 3 + 2 * BUCKETS);
    }
}
