//! The settings of the coordination services lockd's high-availability mode runs over
//! (ZooKeeper, Redis with Sentinel), checked.

use super::{Config, ConfigError, loopback_url};

impl Config {
    /// The ZooKeeper settings, checked (backend zookeeper).
    pub(super) fn validate_zookeeper(&self) -> Result<(), ConfigError> {
        macro_rules! bail {
            ($($arg:tt)*) => { return Err(ConfigError::Invalid(format!($($arg)*))) };
        }
        if self.zk_endpoints.is_empty() {
            bail!("zk_endpoints must name at least one ZooKeeper server");
        }
        self.host_port_endpoints(
            &self.zk_endpoints,
            "ZooKeeper endpoint",
            "e.g. 127.0.0.1:2181 (no scheme, no path: the path is zk_prefix)",
            "lockd speaks to ZooKeeper in plaintext: run lockd next to a ZooKeeper server",
        )?;
        lockd_store_zk::paths::Paths::new(&self.zk_prefix)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if !(100..=60_000).contains(&self.zk_request_timeout_ms) {
            bail!("zk_request_timeout_ms must be 100 ..= 60000");
        }
        if !(1_000..=120_000).contains(&self.zk_session_timeout_ms) {
            bail!("zk_session_timeout_ms must be 1000 ..= 120000");
        }
        Ok(())
    }

    /// The Redis settings, checked (backend redis).
    pub(super) fn validate_redis(&self) -> Result<(), ConfigError> {
        macro_rules! bail {
            ($($arg:tt)*) => { return Err(ConfigError::Invalid(format!($($arg)*))) };
        }
        if self.redis_endpoints.is_empty() {
            bail!("redis_endpoints must name at least one Sentinel");
        }
        self.host_port_endpoints(
            &self.redis_endpoints,
            "Sentinel endpoint",
            "e.g. 127.0.0.1:26379 (no scheme: lockd asks the Sentinels for the master)",
            "lockd speaks to Sentinel and Redis in plaintext: run lockd next to them",
        )?;
        let name_fine = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if self.redis_master.is_empty()
            || self.redis_master.len() > 64
            || !self.redis_master.chars().all(name_fine)
        {
            bail!(
                "redis_master {:?} must be 1 to 64 of: letters, digits, - _ . (the name in Sentinel's `sentinel monitor`)",
                self.redis_master
            );
        }
        lockd_store_redis::Keys::new(&self.redis_prefix)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if !(100..=60_000).contains(&self.redis_request_timeout_ms) {
            bail!("redis_request_timeout_ms must be 100 ..= 60000");
        }
        if !(1_000..=120_000).contains(&self.redis_leader_ttl_ms) {
            bail!("redis_leader_ttl_ms must be 1000 ..= 120000");
        }
        if self.redis_wait_replicas > 16 {
            bail!("redis_wait_replicas must be 0 ..= 16");
        }
        Ok(())
    }

    /// Each of `endpoints` (`what`, e.g. "Sentinel endpoint") checked as `host:port`, and on
    /// loopback unless `insecure`: `example` and `plaintext` go in the errors.
    fn host_port_endpoints(
        &self,
        endpoints: &[String],
        what: &str,
        example: &str,
        plaintext: &str,
    ) -> Result<(), ConfigError> {
        for e in endpoints {
            let port = e
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            match port {
                Some((host, Ok(p)))
                    if !host.is_empty() && p > 0 && !host.contains(['/', '@', ',']) => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{what} {e:?} must be host:port, {example}"
                    )));
                }
            }
            if !self.insecure && !loopback_url(&format!("http://{e}")) {
                return Err(ConfigError::Invalid(format!(
                    "{what} {e:?} is not on loopback, and {plaintext}, or set insecure = true"
                )));
            }
        }
        Ok(())
    }
}
