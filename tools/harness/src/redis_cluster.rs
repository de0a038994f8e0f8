//! A throwaway Redis Cluster: three masters and a replica of each, six [`RedisServer`]s
//! in cluster mode on free loopback ports, each in its own temporary folder, formed with
//! `redis-cli --cluster create` and stopped on drop. Faults for tests: a master killed and
//! its replica promoted ([`RedisCluster::kill_master_of`]), a slot moved to another master
//! while in use ([`RedisCluster::migrate_slot`]). Administered with `redis-cli`, as an
//! operator would; the product's code talks to it with a real client.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::{CommandStats, RedisServer};

const MASTERS: usize = 3;
/// How long a node may be unreachable before the others mark it failed and its replica
/// takes over: short, so a failover takes about two seconds (Redis's default is 15 s).
const NODE_TIMEOUT_MS: &str = "1000";
/// How long forming the cluster, a failover or a migration's last step may take.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// A running cluster.
#[derive(Debug)]
pub struct RedisCluster {
    /// Masters first (as created; a failover changes roles, not this order).
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeView {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master it replicates (`None` for a master).
    replicates: Option<String>,
    /// Slot ranges served, inclusive.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts and forms the cluster; panics with what went wrong if it does not form.
    pub fn start() -> RedisCluster {
        RedisCluster::try_start().unwrap_or_else(|err| panic!("{err:#}"))
    }

    pub fn try_start() -> Result<RedisCluster> {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
        ];
        let nodes = (0..2 * MASTERS)
            .map(|_| RedisServer::try_start_with(&args))
            .collect::<Result<Vec<_>>>()?;
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(nodes.iter().map(|n| n.addr().to_string()));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let create: Vec<&str> = create.iter().map(String::as_str).collect();
        nodes[0].cli(&create).context("forming the cluster")?;
        let cluster = RedisCluster { nodes };
        cluster.wait_until_settled(|views| {
            views.iter().filter(|v| v.master).count() == MASTERS
                && views.iter().filter(|v| v.replicates.is_some()).count() == MASTERS
        })?;
        // A replica takes over only once it has copied its master.
        for node in &cluster.nodes {
            crate::wait_until("a replica to be in sync", SETTLE_LIMIT, || {
                let info = node.cli(&["INFO", "replication"])?;
                Ok(info.contains("role:master") || info.contains("master_link_status:up"))
            })?;
        }
        Ok(cluster)
    }

    /// `redis+cluster://` and every node, the form `sluice serve --redis` takes.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The hash slot of `key`.
    pub fn slot_of(&self, key: &str) -> Result<u16> {
        let out = self.any_live()?.cli(&["CLUSTER", "KEYSLOT", key])?;
        out.trim()
            .parse()
            .with_context(|| format!("CLUSTER KEYSLOT said {out}"))
    }

    /// The port of the master serving `slot` now.
    pub fn master_port_of(&mut self, slot: u16) -> Result<u16> {
        let views = self.views()?;
        Ok(owner(&views, slot)?.port)
    }

    /// Every key the cluster holds that matches `pattern`, from every live master.
    pub fn keys(&mut self, pattern: &str) -> Result<Vec<String>> {
        let views = self.views()?;
        let mut keys = Vec::new();
        for view in views.iter().filter(|v| v.master && !v.failed) {
            let out = self
                .node(view.port)?
                .cli(&["--scan", "--pattern", pattern])?;
            keys.extend(out.lines().filter(|l| !l.is_empty()).map(String::from));
        }
        Ok(keys)
    }

    /// The sum of one numeric `INFO` field over the live masters (`total_net_input_bytes`
    /// of `stats`: what the cluster's masters were sent).
    pub fn masters_info_field(&self, section: &str, field: &str) -> Result<u64> {
        self.info_field_sum(section, field, |v| v.master)
    }

    /// The sum of one numeric `INFO` field over every live node, replicas too
    /// (`used_cpu_user` of `cpu`: the whole cluster's CPU, replication included).
    pub fn nodes_info_field(&self, section: &str, field: &str) -> Result<f64> {
        self.info_field_sum(section, field, |_| true)
    }

    /// Every live node's command stats (replicas' too: what replication costs them),
    /// summed command by command.
    pub fn nodes_command_stats(&self) -> Result<CommandStats> {
        let views = self.views()?;
        views
            .iter()
            .filter(|v| !v.failed)
            .try_fold(CommandStats::default(), |sum, v| {
                Ok(sum.plus(&self.node(v.port)?.command_stats()?))
            })
    }

    fn info_field_sum<T: std::str::FromStr + std::iter::Sum>(
        &self,
        section: &str,
        field: &str,
        which: impl Fn(&NodeView) -> bool,
    ) -> Result<T> {
        let views = self.views()?;
        views
            .iter()
            .filter(|v| !v.failed && which(v))
            .map(|v| self.node(v.port)?.info_field(section, field))
            .sum()
    }

    /// Kills the master serving `slot` (SIGKILL, as a crash would) and waits until its
    /// replica serves the slot and every live node says the cluster is whole again.
    /// Returns how long the slot had no master.
    pub fn kill_master_of(&mut self, slot: u16) -> Result<Duration> {
        let views = self.views()?;
        let master = owner(&views, slot)?.clone();
        let killed_at = Instant::now();
        self.node_mut(master.port)?.kill();
        self.wait_until_settled(|views| {
            owner(views, slot).is_ok_and(|now| now.id != master.id)
                && views.iter().any(|v| v.id == master.id && v.failed)
        })?;
        Ok(killed_at.elapsed())
    }

    /// Moves `slot` to another master while clients use it, the way `redis-cli --cluster
    /// reshard` does, slowly enough to be seen: marks it migrating at its master and
    /// importing at the next one, waits `hold` (its keys still at the source), moves
    /// every key with `MIGRATE`, waits `hold` again (clients are sent on with `ASK`),
    /// then gives the slot to the new master on every node. Returns the new master's port.
    pub fn migrate_slot(&mut self, slot: u16, hold: Duration) -> Result<u16> {
        let views = self.views()?;
        let source = owner(&views, slot)?.clone();
        let masters: Vec<&NodeView> = views.iter().filter(|v| v.master && !v.failed).collect();
        let at = masters
            .iter()
            .position(|m| m.id == source.id)
            .context("the slot's master is not live")?;
        let target = masters[(at + 1) % masters.len()].clone();
        let slot_arg = slot.to_string();
        self.node(target.port)?
            .cli(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source.id])?;
        self.node(source.port)?
            .cli(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target.id])?;
        std::thread::sleep(hold);
        loop {
            let from = self.node(source.port)?;
            let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"])?;
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = target.port.to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys);
            from.cli(&migrate)?;
        }
        std::thread::sleep(hold);
        // The new owner first, then the old one, then the rest, as redis-cli does.
        let others = masters
            .iter()
            .filter(|m| m.id != source.id && m.id != target.id)
            .map(|m| m.port);
        for port in [target.port, source.port].into_iter().chain(others) {
            self.node(port)?
                .cli(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target.id])?;
        }
        self.wait_until_settled(|views| owner(views, slot).is_ok_and(|now| now.id == target.id))?;
        Ok(target.port)
    }

    /// Waits until every live node says `cluster_state:ok` and sees the same slot owners,
    /// and `check` holds for what one of them sees.
    fn wait_until_settled(&self, check: impl Fn(&[NodeView]) -> bool) -> Result<()> {
        crate::wait_until("the cluster to settle", SETTLE_LIMIT, || {
            let mut owners = None;
            for node in self.nodes.iter().filter(|n| n.is_started()) {
                let Ok(info) = node.cli(&["CLUSTER", "INFO"]) else {
                    return Ok(false);
                };
                if !info.contains("cluster_state:ok") {
                    return Ok(false);
                }
                let Ok(views) = node.cli(&["CLUSTER", "NODES"]).map(|out| parse_nodes(&out)) else {
                    return Ok(false);
                };
                let mut mine: Vec<(String, Vec<(u16, u16)>)> = views
                    .iter()
                    .filter(|v| v.master && !v.slots.is_empty())
                    .map(|v| (v.id.clone(), v.slots.clone()))
                    .collect();
                mine.sort();
                if !check(&views) || owners.get_or_insert_with(|| mine.clone()) != &mine {
                    return Ok(false);
                }
            }
            Ok(owners.is_some())
        })
    }

    fn views(&self) -> Result<Vec<NodeView>> {
        Ok(parse_nodes(&self.any_live()?.cli(&["CLUSTER", "NODES"])?))
    }

    fn any_live(&self) -> Result<&RedisServer> {
        self.nodes
            .iter()
            .find(|n| n.is_started())
            .context("no node of the cluster is running")
    }

    fn node(&self, port: u16) -> Result<&RedisServer> {
        self.nodes
            .iter()
            .find(|n| n.addr().port() == port)
            .with_context(|| format!("no node on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> Result<&mut RedisServer> {
        self.nodes
            .iter_mut()
            .find(|n| n.addr().port() == port)
            .with_context(|| format!("no node on port {port}"))
    }
}

/// The live master serving `slot` in `views`.
fn owner(views: &[NodeView], slot: u16) -> Result<&NodeView> {
    views
        .iter()
        .find(|v| v.master && !v.failed && v.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
        .with_context(|| format!("no live master serves slot {slot}"))
}

/// Reads `CLUSTER NODES`: `ID HOST:PORT@BUS FLAGS MASTER PING PONG EPOCH LINK SLOT...`,
/// where a slot is `N` or `A-B` (and `[N->-ID]` or `[N-<-ID]` while migrating, skipped).
fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, addr, flags, master, _, _, _, _, slots @ ..] = fields.as_slice() else {
                return None;
            };
            let port = addr
                .split(['@', ','])
                .next()?
                .rsplit_once(':')?
                .1
                .parse()
                .ok()?;
            let flags: Vec<&str> = flags.split(',').collect();
            let slots = slots
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeView {
                id: id.to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                replicates: (*master != "-").then(|| master.to_string()),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_available;

    #[test]
    fn cluster_nodes_are_read_with_their_roles_and_slots() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [77->-b2]
b2 127.0.0.1:7001@17001,host master,fail - 0 0 2 connected 5461 5462-10922
c3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
";
        let views = parse_nodes(text);
        assert_eq!(views.len(), 3);
        assert!(views[0].master && !views[0].failed);
        assert_eq!(views[0].slots, [(0, 5460)]);
        assert_eq!((views[1].port, views[1].failed), (7001, true));
        assert_eq!(views[1].slots, [(5461, 5461), (5462, 10922)]);
        assert_eq!(views[2].replicates.as_deref(), Some("a1"));
        assert!(!views[2].master);
        assert_eq!(owner(&views, 100).unwrap().id, "a1");
        assert!(
            owner(&views, 6000).is_err(),
            "a failed master serves nothing"
        );
    }

    #[test]
    fn a_cluster_forms_moves_a_slot_and_fails_over() {
        if !redis_available() {
            return;
        }
        let mut cluster = RedisCluster::start();
        assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
        let key = "{harness}:k";
        let slot = cluster.slot_of(key).unwrap();
        let first = cluster.master_port_of(slot).unwrap();
        cluster
            .node(first)
            .unwrap()
            .cli(&["SET", key, "v"])
            .unwrap();

        let moved_to = cluster.migrate_slot(slot, Duration::ZERO).unwrap();
        assert_ne!(moved_to, first);
        assert_eq!(cluster.master_port_of(slot).unwrap(), moved_to);
        let value = cluster.node(moved_to).unwrap().cli(&["GET", key]).unwrap();
        assert_eq!(value.trim(), "v", "the key moved with its slot");

        let took = cluster.kill_master_of(slot).unwrap();
        let promoted = cluster.master_port_of(slot).unwrap();
        assert_ne!(promoted, moved_to);
        let value = cluster.node(promoted).unwrap().cli(&["GET", key]).unwrap();
        assert_eq!(value.trim(), "v", "the replica had the key: {took:?}");
        assert_eq!(cluster.keys("{harness}:*").unwrap(), [key]);
    }
}
