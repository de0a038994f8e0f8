//! The `sluice` binary itself: `serve` prints its address, mints a first admin token and
//! stops on SIGTERM; `token`, `rules` and `migrate` work against a real database; `rules
//! import` converts envoyproxy/ratelimit configurations. On SQLite and PostgreSQL alike.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_admin::testing::{PATIENCE, TestDb, TestServer, example_rule, held_polls};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

sluice_admin::on_every_backend!(
    the_binary_serves_prints_its_address_and_stops_on_sigterm,
    the_first_start_prints_a_generated_admin_token_once,
    bad_serve_settings_stop_start_up_with_a_clear_message,
    the_cli_manages_tokens_and_applies_and_exports_rules,
    the_cli_imports_envoy_ratelimit_configurations_that_apply_accepts,
);

fn sluice() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env_remove("SLUICE_TOKEN")
        .env_remove("SLUICE_DATABASE")
        .env_remove("SLUICE_URL")
        .env("RUST_LOG", "info")
        .kill_on_drop(true);
    command
}

/// `sluice serve` on a free port; returns the child, its base URL and its stderr reader.
async fn serve(
    db: &TestDb,
    admin_token: Option<&str>,
) -> (
    Child,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
) {
    let mut command = sluice();
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--database", &db.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = admin_token {
        command.env("SLUICE_ADMIN_TOKEN", token);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PATIENCE, stdout.next_line())
        .await
        .expect("no listening line")
        .unwrap()
        .expect("stdout closed");
    let base = sluice_core::listening::Listening::parse(&line)
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .url();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    assert!(!base.ends_with(":0"), "{base}");
    let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, base, stderr)
}

async fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id().unwrap().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("sluice did not stop on SIGTERM")
        .unwrap()
}

async fn the_binary_serves_prints_its_address_and_stops_on_sigterm(db: TestDb) {
    let token = "env-bootstrap-token-for-the-binary-test";
    let (mut child, base, _stderr) = serve(&db, Some(token)).await;
    let http = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let created = http
        .post(format!("{base}/api/v1/rules"))
        .bearer_auth(token)
        .json(&example_rule())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // A held poll must not keep the process from stopping.
    let poll = tokio::spawn(
        http.get(format!("{base}/api/v1/ruleset?after=1&wait=60"))
            .bearer_auth(token)
            .send(),
    );
    // Only a poll the server is holding tests the shutdown; one still on its way would
    // meet a closed port instead.
    let deadline = Instant::now() + PATIENCE;
    while held_polls(&http, &base).await < 1 {
        assert!(Instant::now() < deadline, "the poll was never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let start = Instant::now();
    let status = sigterm(&mut child).await;
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        poll.await.unwrap().unwrap().status(),
        StatusCode::NOT_MODIFIED
    );
    // The env token was stored hashed, once, and survives a restart.
    let (mut child, base, _stderr) = serve(&db, Some(token)).await;
    let rules = http
        .get(format!("{base}/api/v1/rules"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(rules.status(), StatusCode::OK);
    assert_eq!(rules.json::<Value>().await.unwrap()["total"], 1);
    assert_eq!(db.store.list_tokens().await.unwrap().len(), 1);
    assert!(sigterm(&mut child).await.success());
}

async fn the_first_start_prints_a_generated_admin_token_once(db: TestDb) {
    let (mut child, base, mut stderr) = serve(&db, None).await;
    let mut secret = None;
    let deadline = Instant::now() + PATIENCE;
    while secret.is_none() && Instant::now() < deadline {
        let Ok(Ok(Some(line))) = tokio::time::timeout(PATIENCE, stderr.next_line()).await else {
            break;
        };
        secret = line
            .split_whitespace()
            .find(|w| w.starts_with("slc_"))
            .map(str::to_string);
    }
    let secret = secret.expect("no generated token on stderr");
    let http = reqwest::Client::new();
    let tokens = http
        .get(format!("{base}/api/v1/tokens"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(tokens.status(), StatusCode::OK);
    assert!(sigterm(&mut child).await.success());

    // Tokens exist now: a second start mints none.
    let (mut child, _base, mut stderr) = serve(&db, None).await;
    assert!(sigterm(&mut child).await.success());
    while let Ok(Some(line)) = stderr.next_line().await {
        assert!(!line.contains("slc_"), "a second token was printed: {line}");
    }
    assert_eq!(db.store.list_tokens().await.unwrap().len(), 1);
}

/// A bootstrap token anyone could guess, connection limits that cannot be served with,
/// or a rate limit service whose callers' authentication was not chosen, stop `sluice
/// serve` at start-up with exit status 2 and a message naming the setting; nothing is
/// stored.
async fn bad_serve_settings_stop_start_up_with_a_clear_message(db: TestDb) {
    let cases: [(&str, &[&str], &str); 5] = [
        ("abc", &[], "SLUICE_ADMIN_TOKEN is 3 characters long"),
        (
            "a-long-enough-bootstrap-secret-0123456789",
            &["--max-connections", "0"],
            "--max-connections 0",
        ),
        (
            "a-long-enough-bootstrap-secret-0123456789",
            &["--header-read-timeout", "0s"],
            "--header-read-timeout must be at least 1ms",
        ),
        (
            "a-long-enough-bootstrap-secret-0123456789",
            &["--rls-listen", "127.0.0.1:0"],
            "--rls-listen needs --rls-auth: `token`",
        ),
        (
            "a-long-enough-bootstrap-secret-0123456789",
            &[
                "--rls-listen",
                "127.0.0.1:0",
                "--rls-auth",
                "none",
                "--rls-client-ca",
                "/nonexistent/ca.pem",
            ],
            // Client certificates need TLS.
            "--tls-cert <FILE>",
        ),
    ];
    for (token, flags, message) in cases {
        let output = sluice()
            .args(["serve", "--listen", "127.0.0.1:0", "--database", &db.url])
            .args(flags)
            .env("SLUICE_ADMIN_TOKEN", token)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
    }
    assert!(db.store.list_tokens().await.unwrap().is_empty());
}

async fn the_cli_manages_tokens_and_applies_and_exports_rules(db: TestDb) {
    let run = |args: Vec<String>| async move {
        let output = sluice().args(&args).output().await.unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let with_db = |args: &[&str]| {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(["--database".to_string(), db.url.clone()]);
        v
    };

    let (code, stdout, _) = run(with_db(&["migrate"])).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("migrated"), "{stdout}");

    let (code, stdout, stderr) = run(with_db(&[
        "token", "create", "--role", "editor", "--name", "ci",
    ]))
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let editor = stdout.trim().to_string();
    assert!(editor.starts_with("slc_"), "{stdout}");
    assert!(stderr.contains("editor"), "{stderr}");
    let (code, _, stderr) = run(with_db(&[
        "token", "create", "--role", "root", "--name", "x",
    ]))
    .await;
    assert_eq!(code, Some(2), "{stderr}");

    let (code, stdout, _) = run(with_db(&["token", "list"])).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("ci") && stdout.contains("editor") && stdout.contains("active"));
    assert!(!stdout.contains(&editor));
    let id = db.store.list_tokens().await.unwrap()[0].id.clone();
    assert!(stdout.contains(&id));

    let api = TestServer::start(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(
        &file,
        "- {name: api-per-key, match: {path_prefix: /api/}, key: {header: x-api-key}, limits: [{requests: 5, period: second, burst: 10}]}\n",
    )
    .unwrap();
    let rules = |args: &[&str], token: &str| {
        let mut v: Vec<String> = vec!["rules".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        v.extend([
            "--url".to_string(),
            api.base.clone(),
            "--token".to_string(),
            token.to_string(),
        ]);
        v
    };
    let file_arg = file.display().to_string();
    let (code, stdout, stderr) = run(rules(&["apply", "-f", &file_arg], &editor)).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("ruleset version 1") && stdout.contains("added: api-per-key"),
        "{stdout}"
    );
    let (code, stdout, _) = run(rules(&["apply", "-f", &file_arg], &editor)).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("no changes"), "{stdout}");

    let (code, stdout, _) = run(rules(&["export", "--format", "json"], &editor)).await;
    assert_eq!(code, Some(0));
    let exported: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(exported["rules"][0]["name"], "api-per-key");
    let (code, stdout, _) = run(rules(&["export"], &editor)).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("name: api-per-key"), "{stdout}");
    let exported_file = dir.path().join("exported.yaml");
    std::fs::write(&exported_file, &stdout).unwrap();
    let (code, stdout, _) = run(rules(
        &[
            "apply",
            "--prune",
            "-f",
            &exported_file.display().to_string(),
        ],
        &editor,
    ))
    .await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("no changes"), "{stdout}");

    // A bad file is the user's to fix: status 2 and the field.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"[{"name":"b","key":"global","limits":[{"requests":0,"period":"second"}]}]"#,
    )
    .unwrap();
    let (code, _, stderr) = run(rules(&["apply", "-f", &bad.display().to_string()], &editor)).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("rules[0].limits[0].requests"), "{stderr}");

    let (code, stdout, _) = run(with_db(&["token", "revoke", &id])).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains(&id));
    let (code, _, stderr) = run(rules(&["export"], &editor)).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let (code, _, _) = run(with_db(&["token", "revoke", "tok_nope"])).await;
    assert_eq!(code, Some(2));
    api.server.stop().await.unwrap();

    // Nothing listens here: an environment problem, status 1.
    let (code, _, stderr) = run(rules(&["export"], &editor)).await;
    assert_eq!(code, Some(1), "{stderr}");
}

/// `sluice rules import --from envoy-ratelimit ARGS...`: its exit status and standard error.
async fn import_envoy_ratelimit(args: &[&str]) -> (Option<i32>, String) {
    let output = sluice()
        .args(["rules", "import", "--from", "envoy-ratelimit"])
        .args(args)
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn the_cli_imports_envoy_ratelimit_configurations_that_apply_accepts(db: TestDb) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/envoy-ratelimit");
    let config = examples.join("config.yaml").display().to_string();
    let envoy = examples.join("envoy.yaml").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("imported.yaml").display().to_string();
    let (code, stderr) =
        import_envoy_ratelimit(&[&config, "--envoy", &envoy, "-o", &imported]).await;
    assert_eq!(code, Some(0), "{stderr}");
    // What could not be converted is named, with the reason.
    assert!(
        stderr.contains("skipped descriptor (destination_cluster, legacy)")
            && stderr.contains("the `destination_cluster` action has no Sluice equivalent")
            && stderr.contains("converted 3 rule(s)"),
        "{stderr}"
    );

    let api = TestServer::start(&db).await;
    let output = sluice()
        .args(["rules", "apply", "--dry-run", "-f", &imported])
        .args(["--url", &api.base, "--token", &api.admin])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("would change")
            && stdout.contains("edge-remote_address")
            && stdout.contains("edge-generic_key-slowpath-api_key")
            && stdout.contains("edge-header_match-beta-writes"),
        "{stdout}"
    );
    // A dry run changes nothing.
    let rules: Value = api.json("/api/v1/rules").await;
    assert_eq!(rules["rules"], json!([]), "{rules}");
    api.server.stop().await.unwrap();

    // Nothing convertible: an error the user must act on, status 2.
    let unbound = dir.path().join("unbound.yaml");
    std::fs::write(
        &unbound,
        "domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let (code, stderr) = import_envoy_ratelimit(&[&unbound.display().to_string()]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--header api_key=HEADER-NAME")
            && stderr.contains("nothing could be converted"),
        "{stderr}"
    );
}

/// `sluice envoy-config --rls --rules`: the route's descriptors made from the rules'
/// `descriptor` sections, in their one domain; several domains need `--rls-domain`, and a
/// domain no rule names is refused.
#[tokio::test]
async fn envoy_config_makes_the_rate_limit_descriptors_from_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "- {name: a, key: global, limits: [{requests: 1, period: second}],\n   \
         descriptor: {domain: edge, entries: [{key: api_key}]}}\n\
         - {name: b, key: global, limits: [{requests: 1, period: second}],\n   \
         descriptor: {domain: other, entries: [{key: remote_address}]}}\n",
    )
    .unwrap();
    let render = |extra: &[&str]| {
        let mut command = sluice();
        command
            .args(["envoy-config", "--listen", "127.0.0.1:10000"])
            .args([
                "--upstream",
                "127.0.0.1:8000",
                "--rls",
                "127.0.0.1:8081",
                "--rules",
            ])
            .arg(&rules)
            .args(extra);
        command.output()
    };
    let ambiguous = render(&[]).await.unwrap();
    assert_eq!(ambiguous.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&ambiguous.stderr).contains("--rls-domain"),
        "{}",
        String::from_utf8_lossy(&ambiguous.stderr)
    );
    let edge = render(&[
        "--rls-domain",
        "edge",
        "--rls-key-header",
        "api_key=x-api-key",
    ])
    .await
    .unwrap();
    let yaml = String::from_utf8_lossy(&edge.stdout);
    assert_eq!(
        edge.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&edge.stderr)
    );
    for needle in [
        "domain: edge",
        "header_name: x-api-key",
        "descriptor_key: api_key",
    ] {
        assert!(yaml.contains(needle), "{needle} in\n{yaml}");
    }
    assert!(!yaml.contains("remote_address"), "{yaml}");
    let none = render(&["--rls-domain", "nowhere"]).await.unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no rule has a descriptor"));
    // Envoy's ratelimit filter skips routes that answer themselves: refused, not ignored.
    let direct = sluice()
        .args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--upstream",
            "direct",
        ])
        .args(["--rls", "127.0.0.1:8081"])
        .output()
        .await
        .unwrap();
    assert_eq!(direct.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&direct.stderr).contains("--upstream"));
}

/// `sluice envoy-config --rls`: Envoy's native ratelimit filter pointed at the rate limit
/// service, with no wasm filter (so no `--filter`), the actions in order; the flags that
/// only make sense for the wasm filter are refused beside it.
#[tokio::test]
async fn envoy_config_writes_the_native_ratelimit_filter_for_the_rate_limit_service() {
    let output = sluice()
        .args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--upstream",
            "127.0.0.1:8000",
        ])
        .args(["--rls", "127.0.0.1:8081", "--rls-domain", "edge"])
        .args([
            "--rls-action",
            "generic:path=/login",
            "--rls-action",
            "remote_address",
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let yaml = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "envoy.filters.http.ratelimit",
        "domain: edge",
        "cluster_name: sluice_rls",
        "port_value: 8081",
        "descriptor_value: /login",
        "remote_address: {}",
        "DRAFT_VERSION_03",
    ] {
        assert!(yaml.contains(needle), "{needle} in\n{yaml}");
    }
    assert!(!yaml.contains("envoy.filters.http.wasm"), "{yaml}");

    let refused = sluice()
        .args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--upstream",
            "direct",
        ])
        .args(["--rls", "127.0.0.1:8081", "--filter", "x.wasm"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let bad_action = sluice()
        .args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--upstream",
            "direct",
        ])
        .args(["--rls", "127.0.0.1:8081", "--rls-action", "cookie:a=b"])
        .output()
        .await
        .unwrap();
    assert_eq!(bad_action.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad_action.stderr)
            .contains("remote_address, header:NAME=KEY or generic:KEY=VALUE")
    );
}

/// A proxy token goes to a rate limit service that is not on loopback only over TLS, or
/// with `--rls-insecure`, which the file then warns of; to loopback, in clear text.
#[tokio::test]
async fn envoy_config_sends_the_rls_token_in_clear_text_only_where_told() {
    let config = |addr: &'static str, extra: &'static [&'static str]| {
        let mut command = sluice();
        command
            .args(["envoy-config", "--listen", "127.0.0.1:10000"])
            .args(["--upstream", "127.0.0.1:8000", "--rls", addr])
            .args(["--rls-token", "slc_proxy_secret"])
            .args(extra);
        async move { command.output().await.unwrap() }
    };
    let remote = config("10.0.0.7:8081", &[]).await;
    let stderr = String::from_utf8_lossy(&remote.stderr);
    assert_eq!(remote.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--rls-insecure"), "{stderr}");
    assert!(remote.stdout.is_empty());

    let insecure = config("10.0.0.7:8081", &["--rls-insecure"]).await;
    assert_eq!(insecure.status.code(), Some(0));
    let yaml = String::from_utf8_lossy(&insecure.stdout);
    assert!(yaml.contains("WARNING: --rls-insecure"), "{yaml}");
    assert!(yaml.contains("Bearer slc_proxy_secret"), "{yaml}");

    let loopback = config("127.0.0.1:8081", &[]).await;
    assert_eq!(loopback.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&loopback.stdout).contains("WARNING"));
}
