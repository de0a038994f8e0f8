//! TLS between the parts, with certificates made by the test (`TestPki`): `sluice serve
//! --tls-cert/--tls-key`, its Secure session cookie, the CLI over https, and a real Envoy
//! taking its rules from the admin API and sending its reports over TLS that it verifies.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    AdminServer, Artifacts, Client, Envoy, EnvoyOptions, Method, Req, TestPki, burst_rule, wait_for,
};

/// The promise: a saved rule is enforced within this.
const PROPAGATION: Duration = Duration::from_secs(1);

fn sluice(args: &[&str]) -> Output {
    Command::new(Artifacts::from_env().sluice_bin())
        .args(args)
        .env_remove("SLUICE_TOKEN")
        .env_remove("SLUICE_URL")
        .env_remove("SLUICE_CA")
        .env("RUST_LOG", "warn")
        .output()
        .expect("running sluice")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn serve_refuses_unusable_certificate_files_naming_the_flag_and_file() {
    let pki = TestPki::new();
    let database = format!("sqlite://{}", pki.dir().join("unused.db").display());
    let cert = pki.server_cert();
    let key = pki.server_key();
    let missing = pki.dir().join("missing.pem");
    let serve = |tls: &[&str]| {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--database", &database];
        args.extend_from_slice(tls);
        sluice(&args)
    };
    let refused = |tls: &[&str], expected: &str| {
        let out = serve(tls);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tls:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{tls:?}: expected {expected:?} in {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "{tls:?} printed {}",
            text(&out.stdout)
        );
    };

    // Both or neither (clap names the missing flag).
    refused(&["--tls-cert", path(&cert)], "--tls-key");
    refused(&["--tls-key", path(&key)], "--tls-cert");
    refused(
        &["--tls-cert", path(&missing), "--tls-key", path(&key)],
        &format!("--tls-cert {}: cannot read it", missing.display()),
    );
    refused(
        &["--tls-cert", path(&cert), "--tls-key", path(&missing)],
        &format!("--tls-key {}: cannot read it", missing.display()),
    );
    // A key where the certificate belongs, and the other way round.
    refused(
        &["--tls-cert", path(&key), "--tls-key", path(&key)],
        &format!("--tls-cert {}: no PEM certificate", key.display()),
    );
    refused(
        &["--tls-cert", path(&cert), "--tls-key", path(&cert)],
        &format!("--tls-key {}: no PEM private key", cert.display()),
    );
    refused(
        &[
            "--tls-cert",
            path(&cert),
            "--tls-key",
            path(&pki.other_key()),
        ],
        &format!(
            "--tls-key {} does not belong to the certificate in --tls-cert {}",
            pki.other_key().display(),
            cert.display()
        ),
    );
}

#[test]
fn over_tls_the_session_cookie_is_secure_and_plain_http_gets_nothing() {
    let pki = TestPki::new();
    let admin = AdminServer::start_tls(&pki);
    assert!(
        admin.url().starts_with("https://127.0.0.1:"),
        "{}",
        admin.url()
    );

    let (status, body) = admin.call(Method::GET, "/api/v1/rules", None);
    assert_eq!(status, 200, "{body}");

    let sign_in = |token: &str| {
        admin.client(1).send(
            Req::post("/api/v1/session", json!({ "token": token }).to_string())
                .header("content-type", "application/json"),
        )
    };
    let viewer = admin.create_token("viewer", "tls-viewer");
    let resp = sign_in(&viewer);
    assert_eq!(resp.status, 201, "{}", resp.body);
    let cookie = resp.header("set-cookie").expect("a session cookie");
    assert!(cookie.starts_with("sluice_session="), "{cookie}");
    assert!(cookie.contains("; Secure"), "over TLS: {cookie}");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let session = cookie.split(';').next().expect("name=value").to_string();
    let out = admin
        .client(1)
        .send(Req::new(Method::DELETE, "/api/v1/session").header("cookie", session.as_str()));
    assert_eq!(out.status, 204, "{}", out.body);
    let cleared = out.header("set-cookie").expect("the cookie is cleared");
    assert!(
        cleared.contains("Max-Age=0") && cleared.contains("; Secure"),
        "{cleared}"
    );

    // Plain HTTP to the TLS port: the handshake fails and the request gets no answer.
    let plain = Client::connect(admin.addr(), 1).try_run([Req::get("/healthz")]);
    assert!(plain[0].is_err(), "plain HTTP was answered: {:?}", plain[0]);
    // The server goes on serving TLS clients.
    let (status, _) = admin.call(Method::GET, "/api/v1/rules", None);
    assert_eq!(status, 200);
}

#[test]
fn the_cli_applies_and_exports_rules_over_https_trusting_the_ca_file() {
    let pki = TestPki::new();
    let admin = AdminServer::start_tls(&pki);
    let url = admin.url();
    let rules = pki.dir().join("rules.yaml");
    std::fs::write(
        &rules,
        "- {name: over-tls, key: global, limits: [{requests: 5, period: second}]}\n",
    )
    .expect("writing the rules file");
    let ca = admin.ca().expect("a TLS server has a CA");
    let api = ["--url", url.as_str(), "--token", sluice_tests::ADMIN_TOKEN];
    let trusted = [&api[..], &["--ca", path(&ca)]].concat();

    let out = sluice(&[&["rules", "apply", "-f", path(&rules)][..], &trusted].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("applied"),
        "{}",
        text(&out.stdout)
    );

    let out = sluice(&[&["rules", "export", "--format", "json"][..], &trusted].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let exported: Value = serde_json::from_slice(&out.stdout).expect("JSON rules");
    assert_eq!(exported["rules"][0]["name"], "over-tls", "{exported}");

    // Without the CA, the certificate is not trusted: an error, not a silent fallback.
    let out = sluice(&[&["rules", "export"][..], &api[..]].concat());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// Sends `n` requests to the rule's path and returns how many passed.
fn passed(client: &Client, n: usize) -> usize {
    client.passed(&Req::get("/p/x"), n)
}

#[test]
fn rules_and_reports_cross_tls_between_envoy_and_the_admin_api() {
    let pki = TestPki::new();
    let admin = AdminServer::start_tls(&pki);
    let proxy_token = admin.create_token("proxy", "tls-envoy");
    let connection = admin.connection(&proxy_token, "tls-proxy");
    assert!(connection.tls.is_some(), "the Envoy checks the certificate");
    let envoy = Envoy::start(EnvoyOptions {
        admin: Some(connection),
        ..Default::default()
    });
    wait_for(
        "the proxy to poll over TLS",
        Duration::from_secs(10),
        || {
            let (_, proxies) = admin.call(Method::GET, "/api/v1/proxies", None);
            proxies.to_string().contains("tls-proxy")
        },
    );
    let client = Client::connect(envoy.listener_addr(), 8);
    assert_eq!(passed(&client, 20), 20, "no rules yet");

    let rule = burst_rule("pushed", "p", 5);
    let (status, body) = admin.call(Method::POST, "/api/v1/rules", Some(rule));
    let saved = Instant::now();
    assert_eq!(status, 201, "{body}");
    std::thread::sleep(PROPAGATION.saturating_sub(saved.elapsed()));
    assert_eq!(passed(&client, 100), 5, "the pushed rule is enforced");
    assert_eq!(
        envoy.counter("wasmcustom.sluice_control_ruleset_version"),
        1
    );

    // The control service's reports arrive over the same TLS cluster: exactly what the
    // workers decided.
    wait_for("the reports to arrive", Duration::from_secs(20), || {
        let (status, overview) = admin.call(Method::GET, "/api/v1/metrics/overview", None);
        assert_eq!(status, 200, "{overview}");
        overview["allowed"] == 5 && overview["denied"] == 95
    });

    // And it was TLS: Envoy's admin cluster handshook, and verified every certificate.
    let handshakes = envoy
        .stat("cluster.sluice_admin.ssl.handshake")
        .unwrap_or(0);
    assert!(handshakes > 0, "no TLS handshakes on the admin cluster");
    for failure in ["fail_verify_error", "fail_verify_san", "connection_error"] {
        assert_eq!(
            envoy.stat(&format!("cluster.sluice_admin.ssl.{failure}")),
            Some(0),
            "{failure}"
        );
    }
    assert_eq!(envoy.counter("wasmcustom.sluice_control_errors_total"), 0);
}

#[test]
fn envoy_refuses_an_admin_api_whose_certificate_it_cannot_verify() {
    let pki = TestPki::new();
    let stranger = TestPki::new();
    let admin = AdminServer::start_tls(&pki);
    let proxy_token = admin.create_token("proxy", "tls-envoy");

    // A certificate from a CA the Envoy does not trust, and one that names another host.
    let untrusted = {
        let mut connection = admin.connection(&proxy_token, "untrusted-proxy");
        if let Some(tls) = connection.tls.as_mut() {
            tls.ca = stranger.ca();
        }
        connection
    };
    let misnamed = {
        let mut connection = admin.connection(&proxy_token, "misnamed-proxy");
        if let Some(tls) = connection.tls.as_mut() {
            tls.sni = Some("elsewhere.example".to_string());
        }
        connection
    };
    for (connection, failure) in [
        (untrusted, "fail_verify_error"),
        (misnamed, "fail_verify_san"),
    ] {
        let id = connection.proxy_id.clone().unwrap_or_default();
        let envoy = Envoy::start(EnvoyOptions {
            admin: Some(connection),
            ..Default::default()
        });
        let stat = format!("cluster.sluice_admin.ssl.{failure}");
        wait_for(&format!("{id}: {stat}"), Duration::from_secs(15), || {
            envoy.stat(&stat).unwrap_or(0) > 0
                && envoy.counter("wasmcustom.sluice_control_errors_total") > 0
        });
        let (_, proxies) = admin.call(Method::GET, "/api/v1/proxies", None);
        assert!(
            !proxies.to_string().contains(&id),
            "{id} reached the admin API: {proxies}"
        );
    }
}

#[test]
fn envoy_config_for_an_https_admin_api_validates_and_plain_http_needs_insecure() {
    let artifacts = Artifacts::from_env();
    let pki = TestPki::new();
    let (client_cert, client_key) = pki.client_cert();
    let config = pki.dir().join("envoy.yaml");
    let base = [
        "envoy-config",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:8081",
        "--filter",
        path(artifacts.filter_wasm()),
        "--proxy-token",
        "slc_example",
        "--output",
        path(&config),
    ];
    let config_with = |extra: &[&str]| sluice(&[&base[..], extra].concat());

    for tls in [
        vec![
            "--admin-url",
            "https://localhost:8443",
            "--admin-ca",
            path(&pki.ca()),
        ],
        vec![
            "--admin-url",
            "https://127.0.0.1:8443",
            "--admin-ca",
            path(&pki.ca()),
            "--admin-sni",
            "localhost",
            "--admin-client-cert",
            path(&client_cert),
            "--admin-client-key",
            path(&client_key),
        ],
    ] {
        let out = config_with(&tls);
        assert!(out.status.success(), "{tls:?}: {}", text(&out.stderr));
        let yaml = std::fs::read_to_string(&config).expect("the config");
        assert!(yaml.contains("UpstreamTlsContext"), "{yaml}");
        // Envoy loads the CA and client certificate files in validation.
        let validated = Command::new(artifacts.envoy())
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(&config)
            .output()
            .expect("running envoy --mode validate");
        assert!(
            validated.status.success() && text(&validated.stdout).contains("OK"),
            "{tls:?}: Envoy refused the config:\n{}\n{}\n{yaml}",
            text(&validated.stdout),
            text(&validated.stderr)
        );
    }

    // The proxy token is not sent in clear text beyond this host unless told so.
    let out = config_with(&["--admin-url", "http://admin.internal:8080"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");
    let out = config_with(&["--admin-url", "http://admin.internal:8080", "--insecure"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // An https URL without a CA would have Envoy accept any certificate.
    let out = config_with(&["--admin-url", "https://admin.internal:8443"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--admin-ca"), "{stderr}");
    let out = config_with(&[
        "--admin-url",
        "https://admin.internal:8443",
        "--admin-ca",
        path(&pki.dir().join("missing.pem")),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--admin-ca"),
        "{}",
        text(&out.stderr)
    );
}
