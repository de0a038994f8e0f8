//! Chaos: the admin API and its database failing under load, with real processes.
//!
//! * `sluice serve` SIGKILLed while several writers create, replace and delete rules, then
//!   started again on the same database (SQLite, and PostgreSQL on the suite's server).
//! * PostgreSQL stopped and started again under reads and writes, on a server of the
//!   test's own (the suite's shared one must not go down).
//!
//! Afterwards the history must hold together: every acknowledged (2xx) write is in the
//! version it was acknowledged with, with the content acknowledged; versions run 1..=head
//! with no gap and no duplicate; each has exactly one audit entry, and replaying the audit
//! entries in version order gives every version's snapshot and the current rules, so
//! nothing is half-written. Writes that were not acknowledged may have happened or not, but
//! any version they made is one of them, whole.
//!
//! Nothing depends on the machine's speed: load runs until a condition holds (every writer
//! has had writes acknowledged, every writer has seen the outage), bounded by deadlines,
//! and time is asserted only as upper bounds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_harness::{PostgresDatabase, PostgresServer, postgres_available};
use sluice_tests::{ADMIN_TOKEN, AdminServer, Client, Method, Req, Resp, wait_for};

const WRITERS: usize = 4;
/// Rules each writer cycles through (its own: no writer touches another's).
const RULES_PER_WRITER: usize = 3;
/// Writes each writer must have had acknowledged before the fault.
const ACKED_BEFORE_FAULT: u64 = 5;
/// Load lasts at least this long before the fault, so the fault lands mid-stream.
const LOAD_BEFORE_FAULT: Duration = Duration::from_millis(500);
/// Every load thread stops by itself after this, whatever happens.
const LOAD_LIMIT: Duration = Duration::from_secs(180);
/// A request with no answer by then is a failure (a hang).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest any answer may take, outage or not: the server waits up to 10 s for a
/// database connection (`store::ACQUIRE_TIMEOUT`) and then answers 503; the rest is room
/// for a busy machine.
const ANSWER_BOUND: Duration = Duration::from_secs(30);
/// How long the test waits for a condition the server should reach by itself.
const CONDITION_LIMIT: Duration = Duration::from_secs(90);

fn api(method: Method, path: &str, body: Option<&Value>) -> Req {
    let mut req = Req::new(method, path).header("authorization", format!("Bearer {ADMIN_TOKEN}"));
    if let Some(body) = body {
        req = req.header("content-type", "application/json");
        req.body = body.to_string().into();
    }
    req
}

/// One request on a client of its own; `Err` when no answer came.
fn send(client: &Client, req: Req) -> Result<Resp, String> {
    client
        .try_run([req])
        .pop()
        .unwrap_or_else(|| Err("no result".to_string()))
}

fn client(addr: SocketAddr) -> Client {
    Client::connect(addr, 1)
        .with_timeouts(REQUEST_TIMEOUT, REQUEST_TIMEOUT + Duration::from_secs(5))
}

/// The version an acknowledged write made, from `x-sluice-ruleset-version`.
fn version_of(resp: &Resp) -> u64 {
    resp.header("x-sluice-ruleset-version")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ruleset version on an acknowledged write: {resp:?}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Replace,
    Delete,
}

impl Op {
    /// The audit log's and the versions' name for it.
    fn action(self) -> &'static str {
        match self {
            Op::Create => "rule.create",
            Op::Replace => "rule.update",
            Op::Delete => "rule.delete",
        }
    }
}

/// One write a writer sent, and what came of it.
#[derive(Debug, Clone)]
struct Attempt {
    op: Op,
    id: String,
    /// What was sent (create, replace); its description is unique to this attempt.
    sent: Option<Value>,
    sent_at: Instant,
    took: Duration,
    /// The status, or `None` for no answer (connection refused or reset, timeout).
    status: Option<u16>,
    /// The ruleset version a 2xx answer named.
    version: Option<u64>,
    /// The rule as a 2xx answer gave it back (create, replace).
    acked_spec: Option<Value>,
    /// For an error answer: its content type and problem `type`.
    problem: Option<(String, String)>,
    error: Option<String>,
}

impl Attempt {
    fn acked(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// One read a reader sent.
#[derive(Debug, Clone)]
struct Read {
    path: &'static str,
    sent_at: Instant,
    took: Duration,
    status: Option<u16>,
    problem: Option<(String, String)>,
}

/// Writer and reader threads against one admin API, until told to stop (or
/// [`LOAD_LIMIT`]).
struct Load {
    stop: Arc<AtomicBool>,
    acked: Vec<Arc<AtomicU64>>,
    /// Per writer, writes answered 503.
    refused: Vec<Arc<AtomicU64>>,
    /// Per reader, reads answered 503.
    reads_refused: Vec<Arc<AtomicU64>>,
    writers: Vec<JoinHandle<Vec<Attempt>>>,
    readers: Vec<JoinHandle<Vec<Read>>>,
    started: Instant,
}

impl Load {
    /// `prefix` names this run's rules; with `stop_at_no_answer` a writer stops at its
    /// first write that got no answer (the server is gone), else it carries on.
    fn start(addr: SocketAddr, prefix: &str, readers: usize, stop_at_no_answer: bool) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Vec<Arc<AtomicU64>> = (0..WRITERS).map(|_| Arc::default()).collect();
        let refused: Vec<Arc<AtomicU64>> = (0..WRITERS).map(|_| Arc::default()).collect();
        let writers = (0..WRITERS)
            .map(|w| {
                let counts = Counts {
                    stop: Arc::clone(&stop),
                    acked: Arc::clone(&acked[w]),
                    refused: Arc::clone(&refused[w]),
                };
                let prefix = format!("{prefix}-w{w}");
                std::thread::spawn(move || writer(addr, &prefix, &counts, stop_at_no_answer))
            })
            .collect();
        let reads_refused: Vec<Arc<AtomicU64>> = (0..readers).map(|_| Arc::default()).collect();
        let readers = reads_refused
            .iter()
            .map(|refused| {
                let stop = Arc::clone(&stop);
                let refused = Arc::clone(refused);
                std::thread::spawn(move || reader(addr, &stop, &refused))
            })
            .collect();
        Load {
            stop,
            acked,
            refused,
            reads_refused,
            writers,
            readers,
            started: Instant::now(),
        }
    }

    /// Waits until every writer has had [`ACKED_BEFORE_FAULT`] writes acknowledged and
    /// the load has run [`LOAD_BEFORE_FAULT`].
    fn wait_until_under_way(&self) {
        wait_for(
            "every writer to have writes acknowledged",
            CONDITION_LIMIT,
            || {
                self.started.elapsed() >= LOAD_BEFORE_FAULT
                    && self
                        .acked
                        .iter()
                        .all(|n| n.load(Ordering::Relaxed) >= ACKED_BEFORE_FAULT)
            },
        );
    }

    fn acked_counts(&self) -> Vec<u64> {
        self.acked
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    fn refused_counts(&self) -> Vec<u64> {
        self.refused
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    fn reads_refused_counts(&self) -> Vec<u64> {
        self.reads_refused
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops the threads (each finishes the request it is in) and returns what they did.
    fn finish(self) -> (Vec<Attempt>, Vec<Read>) {
        self.stop.store(true, Ordering::Relaxed);
        let attempts = self
            .writers
            .into_iter()
            .flat_map(|w| w.join().expect("a writer panicked"))
            .collect();
        let reads = self
            .readers
            .into_iter()
            .flat_map(|r| r.join().expect("a reader panicked"))
            .collect();
        (attempts, reads)
    }
}

/// A 503 is the API's problem+json saying it is unavailable (`problem` as
/// [`problem_of`] reads it; `what` shown on failure).
fn assert_unavailable(problem: Option<&(String, String)>, what: &impl std::fmt::Debug) {
    let (content_type, kind) = problem.cloned().unwrap_or_default();
    assert_eq!(content_type, "application/problem+json", "{what:?}");
    assert_eq!(kind, "urn:sluice:unavailable", "{what:?}");
}

fn problem_of(resp: &Resp) -> Option<(String, String)> {
    if (200..300).contains(&resp.status) {
        return None;
    }
    let content_type = resp.header("content-type").unwrap_or_default().to_string();
    let kind = serde_json::from_str::<Value>(&resp.body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .unwrap_or_default();
    Some((content_type, kind))
}

/// Creates, replaces and deletes its own rules in turn. What it knows of a rule after a
/// write without a 2xx answer is unsure (it may have happened), so it reads the rule back
/// before touching it again.
/// What a writer shares with the test while it runs.
struct Counts {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

fn writer(
    addr: SocketAddr,
    prefix: &str,
    counts: &Counts,
    stop_at_no_answer: bool,
) -> Vec<Attempt> {
    let client = client(addr);
    let started = Instant::now();
    // Per rule: Some(present?) when known, None when unsure.
    let mut known: Vec<Option<bool>> = vec![Some(false); RULES_PER_WRITER];
    let mut attempts = Vec::new();
    let mut n: u64 = 0;
    while !counts.stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_LIMIT {
        n += 1;
        let r = usize::try_from(n).unwrap_or(0) % RULES_PER_WRITER;
        let id = format!("{prefix}-r{r}");
        let present = match known[r] {
            Some(present) => present,
            None => match send(
                &client,
                api(Method::GET, &format!("/api/v1/rules/{id}"), None),
            ) {
                Ok(resp) if resp.status == 200 || resp.status == 404 => resp.status == 200,
                _ => {
                    // Still unsure (the database is away): pause, then try another rule.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let (op, req, sent) = if !present {
            let spec = json!({
                "name": id, "description": format!("{prefix} write {n}"), "key": "global",
                "limits": [{"requests": n, "period": "second"}]
            });
            (
                Op::Create,
                api(Method::POST, "/api/v1/rules", Some(&spec)),
                Some(spec),
            )
        } else if n % 4 == 0 {
            (
                Op::Delete,
                api(Method::DELETE, &format!("/api/v1/rules/{id}"), None),
                None,
            )
        } else {
            let spec = json!({
                "name": id, "description": format!("{prefix} write {n}"), "key": "global",
                "limits": [{"requests": n, "period": "minute"}]
            });
            let req = api(Method::PUT, &format!("/api/v1/rules/{id}"), Some(&spec));
            (Op::Replace, req, Some(spec))
        };
        let sent_at = Instant::now();
        let answer = send(&client, req);
        let took = sent_at.elapsed();
        let mut attempt = Attempt {
            op,
            id,
            sent,
            sent_at,
            took,
            status: None,
            version: None,
            acked_spec: None,
            problem: None,
            error: None,
        };
        match answer {
            Ok(resp) => {
                attempt.status = Some(resp.status);
                attempt.problem = problem_of(&resp);
                if attempt.acked() {
                    attempt.version = Some(version_of(&resp));
                    if op != Op::Delete {
                        attempt.acked_spec = Some(resp.json()["spec"].clone());
                    }
                    known[r] = Some(op != Op::Delete);
                    counts.acked.fetch_add(1, Ordering::Relaxed);
                } else {
                    if resp.status == 503 {
                        counts.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    known[r] = None;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Err(err) => {
                attempt.error = Some(err);
                known[r] = None;
            }
        }
        let no_answer = attempt.status.is_none();
        attempts.push(attempt);
        if no_answer {
            if stop_at_no_answer {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    attempts
}

/// Lists rules and versions in turn.
fn reader(addr: SocketAddr, stop: &AtomicBool, refused: &AtomicU64) -> Vec<Read> {
    let client = client(addr);
    let started = Instant::now();
    let mut reads = Vec::new();
    let paths = ["/api/v1/rules?limit=50", "/api/v1/versions?limit=5"];
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_LIMIT {
        let path = paths[n % paths.len()];
        n += 1;
        let sent_at = Instant::now();
        let answer = send(&client, api(Method::GET, path, None));
        let took = sent_at.elapsed();
        let (status, problem) = match &answer {
            Ok(resp) => (Some(resp.status), problem_of(resp)),
            Err(_) => (None, None),
        };
        reads.push(Read {
            path,
            sent_at,
            took,
            status,
            problem,
        });
        if status == Some(503) {
            refused.fetch_add(1, Ordering::Relaxed);
        }
        if status != Some(200) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    reads
}

/// The rule's id as the API names it: its `id`, or its name.
fn id_of(spec: &Value) -> String {
    spec["id"]
        .as_str()
        .or_else(|| spec["name"].as_str())
        .unwrap_or_else(|| panic!("a rule without a name: {spec}"))
        .to_string()
}

fn get_ok(client: &Client, path: &str) -> Resp {
    let resp = send(client, api(Method::GET, path, None))
        .unwrap_or_else(|err| panic!("GET {path}: {err}"));
    assert_eq!(resp.status, 200, "GET {path}: {}", resp.body);
    resp
}

/// Every version, newest first, paging back.
fn all_versions(client: &Client) -> Vec<Value> {
    all_pages(client, "/api/v1/versions", "versions", "version")
}

/// Every audit entry, newest first, paging back.
fn all_audit(client: &Client) -> Vec<Value> {
    all_pages(client, "/api/v1/audit", "entries", "id")
}

/// Every item of a list the API pages newest first: `path?limit=1000&before=CURSOR`, the
/// items under `items`, each page's last item's `cursor` naming the next page.
fn all_pages(client: &Client, path: &str, items: &str, cursor: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let before = out
            .last()
            .map(|v| format!("&before={}", v[cursor]))
            .unwrap_or_default();
        let page = get_ok(client, &format!("{path}?limit=1000{before}")).json();
        let page = page[items].as_array().cloned().unwrap_or_default();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// Rules by id from a list of specs.
fn by_id(specs: &[Value]) -> BTreeMap<String, Value> {
    specs.iter().map(|s| (id_of(s), s.clone())).collect()
}

/// Checks the stored history against what the writers did (see the module's comment);
/// returns the head version.
fn verify_history(addr: SocketAddr, attempts: &[Attempt]) -> u64 {
    let client = client(addr);
    // What the proxies get: the current version and its rules.
    let document = get_ok(&client, "/api/v1/ruleset?wait=0").json();
    let head = document["version"].as_u64().expect("a current version");
    let document_rules = document["rules"].as_array().expect("the rules").clone();
    let listed_rules: Vec<Value> = get_ok(&client, "/api/v1/rules?limit=1000").json()["rules"]
        .as_array()
        .expect("a rule list")
        .iter()
        .map(|r| r["spec"].clone())
        .collect();

    // Versions: exactly 1..=head, each once.
    let versions: Vec<u64> = all_versions(&client)
        .iter()
        .map(|v| v["version"].as_u64().expect("a version number"))
        .collect();
    let expected: Vec<u64> = (1..=head).rev().collect();
    assert_eq!(
        versions, expected,
        "versions must run from 1 to {head}, each once"
    );

    // Audit: exactly one ruleset entry per version.
    let mut audit: BTreeMap<u64, Value> = BTreeMap::new();
    for entry in all_audit(&client) {
        let Some(version) = entry["version"].as_u64() else {
            continue;
        };
        if let Some(earlier) = audit.insert(version, entry.clone()) {
            panic!("two audit entries for version {version}: {earlier} and {entry}");
        }
    }
    let audited: Vec<u64> = audit.keys().copied().collect();
    assert_eq!(
        audited,
        (1..=head).collect::<Vec<_>>(),
        "one audit entry for every version"
    );

    // Replaying the audit log gives every snapshot and, at the head, the current rules.
    let mut state: BTreeMap<String, Value> = BTreeMap::new();
    for version in 1..=head {
        let entry = &audit[&version];
        let target = entry["target"].as_str().expect("a target").to_string();
        assert_eq!(
            state.get(&target).cloned().unwrap_or(Value::Null),
            entry["before"],
            "version {version}: the audit's `before` is the rule as the previous version had it"
        );
        match &entry["after"] {
            Value::Null => state.remove(&target),
            after => state.insert(target, after.clone()),
        };
        let detail = get_ok(&client, &format!("/api/v1/versions/{version}")).json();
        let snapshot = detail["rules"].as_array().expect("a snapshot");
        assert_eq!(
            detail["rule_count"].as_u64(),
            Some(snapshot.len() as u64),
            "version {version}: its rule count and its snapshot agree"
        );
        assert_eq!(
            detail["action"], entry["action"],
            "version {version}: the version and its audit entry name the same action"
        );
        assert_eq!(
            by_id(snapshot),
            state,
            "version {version}: the snapshot is what the audit log adds up to"
        );
    }
    assert_eq!(
        by_id(&document_rules),
        state,
        "the proxies' ruleset is the head's"
    );
    assert_eq!(
        by_id(&listed_rules),
        state,
        "the stored rules are the head's"
    );

    // Every acknowledged write is the version it was acknowledged with, as acknowledged.
    let mut explained: BTreeSet<u64> = BTreeSet::new();
    for attempt in attempts.iter().filter(|a| a.acked()) {
        let version = attempt.version.expect("acked with a version");
        assert!(
            explained.insert(version),
            "two acknowledged writes with version {version}"
        );
        let entry = audit
            .get(&version)
            .unwrap_or_else(|| panic!("acknowledged version {version} is missing: {attempt:?}"));
        assert_eq!(entry["target"], json!(attempt.id), "version {version}");
        assert_eq!(
            entry["action"],
            json!(attempt.op.action()),
            "version {version}"
        );
        let acked = attempt.acked_spec.clone().unwrap_or(Value::Null);
        assert_eq!(
            entry["after"], acked,
            "version {version}: the content acknowledged"
        );
        if let Some(sent) = &attempt.sent {
            assert_eq!(
                acked["description"], sent["description"],
                "the answer is the write sent"
            );
        }
    }
    // Any other version is one of the unacknowledged writes, whole.
    let mut unacked: Vec<&Attempt> = attempts.iter().filter(|a| !a.acked()).collect();
    for (version, entry) in &audit {
        if explained.contains(version) {
            continue;
        }
        let found = unacked.iter().position(|a| {
            entry["target"] == json!(a.id)
                && entry["action"] == json!(a.op.action())
                && a.sent
                    .as_ref()
                    .is_none_or(|s| entry["after"]["description"] == s["description"])
        });
        let Some(found) = found else {
            panic!("version {version} matches no write that was sent: {entry}");
        };
        unacked.swap_remove(found);
    }
    head
}

/// Kills `sluice serve` (SIGKILL) under writers twice, restarting it on the same database
/// each time, then checks the history and that writing goes on where it stopped.
fn kill_nine_under_writers(mut server: AdminServer) {
    let mut attempts = Vec::new();
    for round in 0..2 {
        let load = Load::start(server.addr(), &format!("k{round}"), 0, true);
        load.wait_until_under_way();
        server.stop();
        let killed_at = Instant::now();
        let acked = load.acked_counts();
        let (done, _) = load.finish();
        eprintln!(
            "round {round}: killed after {acked:?} acknowledged writes per writer; writers \
             stopped {:?} after the kill",
            killed_at.elapsed()
        );
        // Each writer stopped at its first write without an answer: the kill.
        for attempt in &done {
            if let Some(status) = attempt.status {
                assert!(
                    (200..300).contains(&status),
                    "before the kill every write succeeds: {attempt:?}"
                );
            }
        }
        assert!(done.iter().filter(|a| a.status.is_none()).count() <= WRITERS);
        attempts.extend(done);
        server.restart();
    }
    let head = verify_history(server.addr(), &attempts);
    let acked = attempts.iter().filter(|a| a.acked()).count();
    eprintln!("{acked} acknowledged writes, {head} versions");

    // Restarted on the same database, the next write makes the next version.
    let client = client(server.addr());
    let spec = json!({"name": "after-restart", "key": "global",
                      "limits": [{"requests": 1, "period": "second"}]});
    let resp = send(&client, api(Method::POST, "/api/v1/rules", Some(&spec)))
        .expect("a write after the restart");
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert_eq!(version_of(&resp), head + 1);
}

#[test]
fn chaos_kill_nine_under_writers_on_sqlite() {
    kill_nine_under_writers(AdminServer::start());
}

#[test]
fn chaos_kill_nine_under_writers_on_postgres() {
    let Some(database) = PostgresDatabase::on_the_suites_server("sluice_chaos") else {
        return;
    };
    kill_nine_under_writers(AdminServer::start_on_database(database.url()));
}

/// Status and time of one unauthenticated probe.
fn probe(client: &Client, path: &str) -> (Option<u16>, Duration) {
    let start = Instant::now();
    let status = send(client, Req::get(path)).ok().map(|r| r.status);
    (status, start.elapsed())
}

#[test]
fn chaos_postgres_stopped_and_started_under_load() {
    if !postgres_available() {
        return;
    }
    let mut postgres = PostgresServer::start();
    let url = postgres
        .create_database("sluice_chaos")
        .expect("a database");
    let server = AdminServer::start_on_database(&url);
    let probes = client(server.addr());
    assert_eq!(probe(&probes, "/readyz").0, Some(200));

    let load = Load::start(server.addr(), "pg", 2, false);
    load.wait_until_under_way();
    let before_outage = load.acked_counts();
    let refused_at_stop = load.refused_counts();
    let reads_refused_at_stop = load.reads_refused_counts();
    // The outage begins as the stop begins: sessions end while pg_ctl waits.
    let stopped_at = Instant::now();
    postgres.stop();

    // Not ready, promptly; still alive.
    let mut ready_took = Duration::ZERO;
    wait_for("/readyz to answer 503", CONDITION_LIMIT, || {
        let (status, took) = probe(&probes, "/readyz");
        ready_took = took;
        status == Some(503)
    });
    let not_ready_after = stopped_at.elapsed();
    assert!(
        ready_took < Duration::from_secs(10),
        "/readyz took {ready_took:?}"
    );
    assert_eq!(
        probe(&probes, "/healthz").0,
        Some(200),
        "alive while the database is down"
    );

    // A write of our own during the outage: a clear 503, bounded.
    let spec = json!({"name": "during-outage", "key": "global",
                      "limits": [{"requests": 1, "period": "second"}]});
    let sent_at = Instant::now();
    let resp = send(&probes, api(Method::POST, "/api/v1/rules", Some(&spec)))
        .expect("an answer during the outage");
    let write_took = sent_at.elapsed();
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        resp.json()["type"],
        "urn:sluice:unavailable",
        "{}",
        resp.body
    );
    assert!(
        write_took < ANSWER_BOUND,
        "a write during the outage took {write_took:?}"
    );

    // Every writer has been told 503 about writes it sent after the stop began: two
    // refusals more than at the stop, since at most one of its writes was under way then;
    // likewise every reader.
    let two_more = |now: Vec<u64>, then: &[u64]| now.iter().zip(then).all(|(n, t)| *n >= t + 2);
    wait_for(
        "every writer and reader to be refused",
        CONDITION_LIMIT,
        || {
            two_more(load.refused_counts(), &refused_at_stop)
                && two_more(load.reads_refused_counts(), &reads_refused_at_stop)
        },
    );
    assert_eq!(probe(&probes, "/healthz").0, Some(200));

    postgres.restart();
    let restarted_at = Instant::now();
    wait_for("/readyz to answer 200 again", CONDITION_LIMIT, || {
        probe(&probes, "/readyz").0 == Some(200)
    });
    let ready_again_after = restarted_at.elapsed();
    let at_restart = load.acked_counts();
    wait_for(
        "every writer to have writes acknowledged again",
        CONDITION_LIMIT,
        || {
            load.acked_counts()
                .iter()
                .zip(&at_restart)
                .all(|(now, then)| now > then)
        },
    );
    let writes_again_after = restarted_at.elapsed();
    let (attempts, reads) = load.finish();
    eprintln!(
        "acknowledged before the outage {before_outage:?}; /readyz 503 after {not_ready_after:?}, \
         200 again {ready_again_after:?} after the restart; every writer writing again after \
         {writes_again_after:?}"
    );

    // Every answer, to writes and reads, was a 2xx or a clear 503 within the bound.
    for attempt in &attempts {
        let status = attempt
            .status
            .unwrap_or_else(|| panic!("the admin API never went away, yet: {attempt:?}"));
        assert!(
            (200..300).contains(&status) || status == 503,
            "a write answered neither 2xx nor 503: {attempt:?}"
        );
        if status == 503 {
            assert_unavailable(attempt.problem.as_ref(), attempt);
        }
        assert!(
            attempt.took < ANSWER_BOUND,
            "a write took {:?}",
            attempt.took
        );
    }
    for read in &reads {
        assert!(
            matches!(read.status, Some(200 | 503)),
            "a read answered neither 200 nor 503: {read:?}"
        );
        if read.status == Some(503) {
            assert_unavailable(read.problem.as_ref(), read);
        }
        assert!(
            read.took < ANSWER_BOUND,
            "a read of {} took {:?}",
            read.path,
            read.took
        );
    }
    // The outage was seen by the load itself: writes sent while PostgreSQL was down got
    // 503s, and reads too.
    let refused_writes = attempts
        .iter()
        .filter(|a| a.status == Some(503) && a.sent_at >= stopped_at && a.sent_at < restarted_at)
        .count();
    assert!(
        refused_writes > 0,
        "no write of the load was refused during the outage"
    );
    let refused_reads = reads
        .iter()
        .filter(|r| r.status == Some(503) && r.sent_at >= stopped_at)
        .count();
    assert!(
        refused_reads > 0,
        "no read of the load was refused during the outage"
    );

    let head = verify_history(server.addr(), &attempts);
    eprintln!(
        "{} acknowledged writes, {refused_writes} refused during the outage, {head} versions; \
         {} reads, {refused_reads} refused",
        attempts.iter().filter(|a| a.acked()).count(),
        reads.len()
    );
}
