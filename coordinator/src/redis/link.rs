//! How the coordinator reaches Redis: one server (`redis://`), or a Redis Cluster
//! (`redis+cluster://` seed nodes) through the `redis` crate's own cluster client, which
//! routes by hash slot, follows `MOVED` and `ASK`, waits out `TRYAGAIN` and finds a
//! promoted replica after a failover.
//!
//! Every command goes out in a [`Batch`] that names the key it is routed by. On one
//! server a batch is one pipeline, one round trip. On a cluster it is one pipeline per
//! hash slot, sent concurrently, each to the master of its slot: a cluster refuses a
//! pipeline that spans slots, and the coordinator's keys are grouped by hash tag so that
//! each command stays within one ([`super`]). A command with no key (`TIME`) is routed by
//! the key its caller names, so that every replica and every batch reads one node's clock
//! while that node is up (after its failover, its promoted replica's).
//!
//! Scripts run by `EVALSHA`. A node that does not hold one (a Redis restarted empty, a
//! replica just promoted, a node new to the cluster) answers `NOSCRIPT`; those commands
//! are sent again once, to the same node, behind a `SCRIPT LOAD`, so nothing needs
//! loading ahead and the usual batch carries no script text.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Client, Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};

/// The scheme of a Redis Cluster's seed nodes: `redis+cluster://HOST:PORT[,HOST:PORT...]`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// How long connecting to one node, and one answer (on a cluster, with its redirections
/// and retries), may take: a sync that cannot reach Redis answers 503 at once, and the
/// proxies fall back to their shares instead of waiting.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Retries of one cluster request (`TRYAGAIN` during a slot's migration, `CLUSTERDOWN`
/// and lost connections during a failover; redirections too), waiting 10 ms doubling to
/// 100 ms in between, all within [`TIMEOUT`].
const CLUSTER_RETRIES: u32 = 8;
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 100);

/// Where `--redis` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://HOST:PORT[/DB]`: one server (or a proxy in front of a cluster).
    Single(String),
    /// `redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`: a cluster's seed
    /// nodes, each as a `redis://` URL; the client learns the rest from them.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Reads `--redis`. A cluster has only database 0, so a path or query on a cluster
    /// URL is refused rather than ignored.
    pub fn parse(url: &str) -> RedisResult<RedisTarget> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(RedisTarget::Single(url.to_string()));
        };
        let invalid = |why: &str| {
            RedisError::from((
                ErrorKind::InvalidClientConfig,
                "invalid Redis Cluster URL",
                format!("{why}: expected {CLUSTER_SCHEME}[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]"),
            ))
        };
        let (user, nodes) = match rest.rsplit_once('@') {
            Some((user, nodes)) => (Some(user), nodes),
            None => (None, rest),
        };
        if nodes.contains(['/', '?', '#']) {
            return Err(invalid("a cluster has one database and takes no options"));
        }
        let seeds: Vec<String> = nodes
            .split(',')
            .map(|node| match user {
                Some(user) => format!("redis://{user}@{node}"),
                None => format!("redis://{node}"),
            })
            .collect();
        let well_formed = |node: &str| {
            node.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            })
        };
        if !nodes.split(',').all(well_formed) {
            return Err(invalid("every seed node needs a host and a port"));
        }
        Ok(RedisTarget::Cluster(seeds))
    }
}

/// A connection to the coordinator's Redis, whichever kind. Cheap to clone: clones share
/// the connections.
#[derive(Clone)]
pub(crate) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Link {
    /// Connects, and checks that Redis answers `PING` (on a cluster, the slots are read
    /// from the seed nodes first): `sluice serve --redis` stops at start-up rather than
    /// serving without it.
    pub async fn connect(target: &RedisTarget) -> RedisResult<Link> {
        let mut link = match target {
            RedisTarget::Single(url) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT))
                    .set_number_of_retries(1);
                let client = Client::open(url.as_str())?;
                Link::Single(client.get_connection_manager_with_config(config).await?)
            }
            RedisTarget::Cluster(seeds) => {
                let (min_wait, max_wait) = CLUSTER_RETRY_WAIT_MS;
                let client = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(TIMEOUT)
                    .response_timeout(TIMEOUT)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(min_wait)
                    .max_retry_wait(max_wait)
                    .build()?;
                Link::Cluster(client.get_async_connection().await?)
            }
        };
        let mut ping = Batch::default();
        // Any node will do.
        ping.on("ping", "PING");
        link.send(&ping, &[]).await?;
        Ok(link)
    }

    /// Sends `batch` and returns one reply per command, in order; a command Redis refused
    /// fails the whole call. A command refused with `NOSCRIPT` is sent again once, with
    /// `scripts` loaded before it on the same node.
    pub async fn send(&mut self, batch: &Batch, scripts: &[&Script]) -> RedisResult<Vec<Value>> {
        let all: Vec<usize> = (0..batch.commands.len()).collect();
        let mut replies = self.send_some(batch, &all, &[]).await?;
        let unloaded: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, reply)| is_no_script(reply))
            .map(|(i, _)| i)
            .collect();
        if !unloaded.is_empty() && !scripts.is_empty() {
            let again = self.send_some(batch, &unloaded, scripts).await?;
            for (i, reply) in unloaded.into_iter().zip(again) {
                replies[i] = reply;
            }
        }
        replies
            .into_iter()
            .map(|reply| match reply {
                Value::ServerError(_) => reply.extract_error(),
                reply => Ok(reply),
            })
            .collect()
    }

    /// Sends the commands `which` of `batch`, each slot's behind `SCRIPT LOAD`s of
    /// `scripts`; returns their replies (server errors as values) in the order of `which`.
    async fn send_some(
        &mut self,
        batch: &Batch,
        which: &[usize],
        scripts: &[&Script],
    ) -> RedisResult<Vec<Value>> {
        if which.is_empty() {
            return Ok(Vec::new());
        }
        let pipeline = |commands: &[usize]| {
            let mut pipe = redis::pipe();
            for script in scripts {
                pipe.load_script(script);
            }
            for &i in commands {
                pipe.add_command(batch.commands[i].1.clone());
            }
            pipe
        };
        match self {
            Link::Single(con) => {
                let pipe = pipeline(which);
                con.req_packed_commands(&pipe, scripts.len(), which.len())
                    .await
            }
            Link::Cluster(con) => {
                let mut by_slot: HashMap<Route, Vec<usize>> = HashMap::new();
                for &i in which {
                    by_slot.entry(batch.commands[i].0).or_default().push(i);
                }
                let sent = by_slot.into_iter().map(|(route, commands)| {
                    let pipe = pipeline(&commands);
                    let mut con = con.clone();
                    async move {
                        let count = commands.len();
                        let routing = SingleNodeRoutingInfo::SpecificNode(route);
                        let replies = con
                            .route_pipeline(pipe, scripts.len(), count, routing)
                            .await?;
                        RedisResult::Ok(commands.into_iter().zip(replies).collect::<Vec<_>>())
                    }
                });
                let mut replies: HashMap<usize, Value> =
                    try_join_all(sent).await?.into_iter().flatten().collect();
                which
                    .iter()
                    .map(|i| {
                        replies.remove(i).ok_or_else(|| {
                            RedisError::from((ErrorKind::Client, "a cluster reply went missing"))
                        })
                    })
                    .collect()
            }
        }
    }
}

fn is_no_script(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// Commands to send together, each with the route of the key it touches.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    commands: Vec<(Route, Cmd)>,
}

impl Batch {
    /// A command sent to the master of `key`'s hash slot: one touching `key` (and only
    /// keys of its slot), or one with no key that this node should answer. Add its
    /// arguments, `key` included where it is one, to the command returned.
    pub fn on(&mut self, key: &str, name: &str) -> &mut Cmd {
        self.push(key, redis::cmd(name))
    }

    /// `EVALSHA` of `script` over `keys` (all in one hash slot); add its `ARGV` to the
    /// command returned.
    pub fn script(&mut self, script: &Script, keys: &[String]) -> &mut Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        self.push(keys.first().map_or("", String::as_str), cmd)
    }

    fn push(&mut self, key: &str, cmd: Cmd) -> &mut Cmd {
        self.commands
            .push((Route::with_key(key, SlotAddr::Master), cmd));
        let last = self.commands.len() - 1;
        &mut self.commands[last].1
    }
}

/// Reads one reply as `T`.
pub(crate) fn read<T: redis::FromRedisValue>(reply: Value) -> RedisResult<T> {
    Ok(redis::from_redis_value(reply)?)
}

/// Redis's `TIME` reply in nanoseconds.
pub(crate) fn nanos(reply: Value) -> RedisResult<u64> {
    let (seconds, micros): (u64, u64) = read(reply)?;
    Ok(seconds * 1_000_000_000 + micros * 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_url_is_kept_as_given() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379/2").unwrap(),
            RedisTarget::Single("redis://127.0.0.1:6379/2".into())
        );
    }

    #[test]
    fn a_cluster_url_names_each_seed_node_with_its_credentials() {
        assert_eq!(
            RedisTarget::parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            RedisTarget::Cluster(vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ])
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://u:p%40ss@redis-0:6379").unwrap(),
            RedisTarget::Cluster(vec!["redis://u:p%40ss@redis-0:6379".into()])
        );
    }

    #[test]
    fn a_cluster_url_without_ports_or_with_a_database_is_refused() {
        for bad in [
            "redis+cluster://",
            "redis+cluster://127.0.0.1",
            "redis+cluster://127.0.0.1:7000,",
            "redis+cluster://:7000",
            "redis+cluster://127.0.0.1:0",
            "redis+cluster://127.0.0.1:7000/1",
            "redis+cluster://127.0.0.1:7000?protocol=3",
        ] {
            let err = RedisTarget::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidClientConfig, "{bad}");
        }
    }

    #[test]
    fn commands_are_routed_by_hash_tag() {
        let mut batch = Batch::default();
        batch.on("sluice:quota:epoch:2", "TIME");
        batch.on("sluice:quota:epoch:2", "GET");
        batch.on("sluice:quota:{07}:b:0000000000000007", "GET");
        batch.script(&Script::new("return 1"), &["sluice:quota:{07}:b:1".into()]);
        assert_eq!(batch.commands[0].0, batch.commands[1].0);
        assert_ne!(batch.commands[0].0, batch.commands[2].0);
        assert_eq!(
            batch.commands[2].0, batch.commands[3].0,
            "one group, one slot"
        );
    }
}
