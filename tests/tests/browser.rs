//! The dashboard end to end, in a real browser, against a real admin API and a real Envoy
//! that follows it: sign in, create a rule in the form, throttle a client, watch it appear
//! on the overview and clients pages, change the limit and see it enforced, roll back, and
//! check that a viewer gets no edit controls; the form's delay inputs and shaped traffic
//! on the overview (the form's other inputs are driven in `rule_form.rs`). Screenshots of
//! every page land in `target/screenshots/`.
//!
//! Needs the built `sluice` (with the dashboard embedded), the filter, Envoy, Chromium and
//! chromedriver: `cargo xtask test` provides them all.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fantoccini::{Client as Web, Locator};
use serde_json::Value;
use sluice_core::response::{DELAY_WAIT_HEADER, WARNING_HEADER};
use sluice_core::spec::RuleSpec;
use sluice_envoy_config::AdminConnection;
use sluice_harness::upstream::DELAY_HEADER;
use sluice_tests::browser::{AdminServer, Browser, browser_available};
use sluice_tests::page::{
    UI_WAIT, click, eventually, exists, fill_limit, nav, save_rule, sign_in, start_new_rule,
    stored_spec, text_of, type_into, wait_exact, wait_for, wait_text,
};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req, Resp, Target, TestPki, Upstream};

/// Waits until the proxy runs ruleset `version` (it reports it on its next poll, which
/// follows the push at once), then until every worker has applied it. Each version is
/// waited for before the next is made, so each worker applies each one once: after
/// version v, the workers' applied count is `workers × v`.
async fn wait_proxy_version(admin: &AdminServer, envoy: &Envoy, version: u64) -> Result<()> {
    eventually(
        &format!("the proxy to run ruleset v{version}"),
        Duration::from_secs(15),
        async || {
            let proxies = admin.get_json("/api/v1/proxies").ok()?;
            proxies["proxies"]
                .as_array()?
                .iter()
                .any(|p| p["ruleset_version"].as_u64() == Some(version))
                .then_some(())
        },
    )
    .await?;
    let workers = u64::try_from(envoy.concurrency()).unwrap_or(u64::MAX);
    eventually(
        &format!("every worker to apply ruleset v{version}"),
        Duration::from_secs(15),
        async || {
            let applied = tokio::task::block_in_place(|| {
                envoy.counter("wasmcustom.sluice_rulesets_applied_total")
            });
            (applied >= workers * version).then_some(())
        },
    )
    .await
}

fn current_version(admin: &AdminServer) -> Result<u64> {
    let versions = admin.get_json("/api/v1/versions?limit=1")?;
    Ok(versions["versions"][0]["version"].as_u64().unwrap_or(0))
}

/// Sends `n` requests as `client` through Envoy; returns how many were throttled (429).
fn traffic(envoy: &Envoy, client: &str, n: usize) -> usize {
    tokio::task::block_in_place(|| {
        let http = Client::connect(envoy.listener_addr(), 1);
        http.run((0..n).map(|_| Req::get("/api/orders").header("x-api-key", client)))
            .iter()
            .filter(|r| r.status == 429)
            .count()
    })
}

/// An Envoy following `admin` as `envoy-test-1`, answering allowed requests itself,
/// running its ruleset version 0.
async fn following_envoy(admin: &AdminServer) -> Result<Envoy> {
    following_envoy_to(admin, Target::Direct).await
}

/// [`following_envoy`] in front of `upstream`.
async fn following_envoy_to(admin: &AdminServer, upstream: Target) -> Result<Envoy> {
    let proxy_token = admin.create_token("proxy", "envoy-browser-test")?;
    let url = format!("http://{}", admin.addr())
        .parse()
        .map_err(anyhow::Error::msg)?;
    let mut connection = AdminConnection::new(url, proxy_token);
    connection.proxy_id = Some("envoy-test-1".to_string());
    connection.poll_timeout_seconds = 20;
    let envoy = tokio::task::block_in_place(|| {
        Envoy::start(EnvoyOptions {
            admin: Some(connection),
            upstream,
            ..Default::default()
        })
    });
    wait_proxy_version(admin, &envoy, 0).await?;
    Ok(envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_end_to_end() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test` (it installs Debian's \
         chromium and chromium-driver), or set SLUICE_CHROMIUM and SLUICE_CHROMEDRIVER"
    );
    let admin = AdminServer::start()?;
    let viewer_token = admin.create_token("viewer", "dana-viewer")?;
    let envoy = following_envoy(&admin).await?;

    let browser = Browser::start().await?;
    let web = browser.client();
    let result = scenario(&admin, &envoy, &browser, web, &viewer_token).await;
    if result.is_err() {
        // What the page showed when it went wrong.
        let _ = browser.screenshot("failure").await;
    }
    browser.close().await;
    result
}

/// Shaped traffic on the overview: a real Envoy admits a client over a soft limit with a
/// warning, and the rule table names the warned requests under the rule (they are also in
/// its allowed count); a rule that shaped nothing names nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_names_a_rules_shaped_traffic() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let admin = AdminServer::start()?;
    let envoy = following_envoy(&admin).await?;
    // 5 a minute with a 100% soft margin: of 20 requests at once, 5 pass, 5 more pass
    // warned, 10 are refused.
    let soft = serde_json::json!({
        "name": "soft", "match": {"path_prefix": "/api/"}, "key": {"header": "x-api-key"},
        "limits": [{"requests": 5, "period": "minute", "soft_percent": 100}],
    });
    let plain = serde_json::json!({
        "name": "plain", "match": {"path_prefix": "/elsewhere/"}, "key": {"header": "x-api-key"},
        "limits": [{"requests": 5, "period": "minute"}],
    });
    for (version, rule) in [(1, &soft), (2, &plain)] {
        let (status, body) = admin.call("POST", "/api/v1/rules", Some(rule))?;
        assert_eq!(status, 201, "{body}");
        wait_proxy_version(&admin, &envoy, version).await?;
    }
    assert_eq!(
        traffic(&envoy, "bob", 20),
        10,
        "5 pass, 5 warned, 10 refused"
    );

    let browser = Browser::start().await?;
    let web = browser.client();
    let result = async {
        web.goto(&admin.url("/")).await?;
        wait_for(web, "form.signin").await?;
        sign_in(web, admin.admin_token()).await?;
        wait_text(
            web,
            "[data-test=rule-metrics] [data-rule=soft] [data-test=rule-shaping]",
            "5 warned",
        )
        .await?;
        let soft_row = text_of(web, "[data-test=rule-metrics] [data-rule=soft]").await;
        let soft_row = soft_row.context("the soft rule's row")?;
        assert!(!soft_row.contains("delayed"), "{soft_row}");
        wait_for(web, "[data-test=rule-metrics] [data-rule=plain]").await?;
        assert!(
            !exists(web, "[data-rule=plain] [data-test=rule-shaping]").await,
            "a rule that shaped nothing names nothing"
        );
        browser.screenshot("overview-shaping").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    if result.is_err() {
        let _ = browser.screenshot("overview-shaping-failure").await;
    }
    browser.close().await;
    result
}

/// A delay rule made in the rule form, and shaped traffic from a real Envoy on the
/// overview: the form shows the delay's inputs only while the rule delays, names a
/// missing maximum and a client queue over the rule's beside their inputs, keeps what was
/// typed while refuse is picked, and saves a rule the API reads back field for field;
/// then requests delayed by it, warned over a soft limit and refused by an in-flight
/// limit reach the overview's cards, chart legend and rule table, and the rules list, in
/// the numbers the Envoy's responses showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_form_delays_and_the_overview_shows_shaped_traffic() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let admin = AdminServer::start()?;
    let upstream = Upstream::start();
    let envoy = following_envoy_to(&admin, upstream.target()).await?;
    let browser = Browser::start().await?;
    let web = browser.client();
    let result = delay_form_and_shaped_traffic(&admin, &envoy, &browser, web).await;
    if result.is_err() {
        let _ = browser.screenshot("delay-form-failure").await;
    }
    browser.close().await;
    result
}

/// `n` requests for `path` as `client`, `connections` at a time, each held `hold_ms` by
/// the upstream.
fn shaped_traffic(
    envoy: &Envoy,
    path: &str,
    client: &str,
    n: usize,
    connections: usize,
    hold_ms: u64,
) -> Vec<Resp> {
    tokio::task::block_in_place(|| {
        let http = Client::connect(envoy.listener_addr(), connections);
        http.run((0..n).map(|_| {
            Req::get(path)
                .header("x-api-key", client)
                .header(DELAY_HEADER, hold_ms.to_string())
        }))
    })
}

async fn delay_form_and_shaped_traffic(
    admin: &AdminServer,
    envoy: &Envoy,
    browser: &Browser,
    web: &Web,
) -> Result<()> {
    web.goto(&admin.url("/")).await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, admin.admin_token()).await?;
    nav(web, "Rules").await?;

    // 2 requests a second per API key under /api/, the rest delayed.
    start_new_rule(web, "smooth").await?;
    type_into(web, "input[name='match.path_prefix']", "/api/").await?;
    fill_limit(web, 0, "2", "second").await?;
    assert!(
        !exists(web, "input[name='delay.max_delay_ms']").await,
        "no delay inputs while the rule refuses"
    );
    click(web, "select[name=on_limit] option[value=delay]").await?;
    // Saving without a maximum: named beside its input, and nothing is sent.
    click(web, "[data-test=save]").await?;
    wait_text(
        web,
        ".field-error[data-field='delay.max_delay_ms']",
        "is required",
    )
    .await?;
    type_into(web, "input[name='delay.max_delay_ms']", "3000").await?;
    type_into(web, "input[name='delay.queue_per_worker']", "64").await?;
    type_into(web, "input[name='delay.queue_per_key']", "100").await?;
    wait_text(
        web,
        ".field-error[data-field='delay.queue_per_key']",
        "must be between 1 and `queue_per_worker` (64)",
    )
    .await?;
    type_into(web, "input[name='delay.queue_per_key']", "4").await?;
    // Refuse hides the inputs and keeps what they hold for a return to delay.
    click(web, "select[name=on_limit] option[value=refuse]").await?;
    eventually("the delay inputs to go", UI_WAIT, async || {
        (!exists(web, "input[name='delay.max_delay_ms']").await).then_some(())
    })
    .await?;
    click(web, "select[name=on_limit] option[value=delay]").await?;
    let max = wait_for(web, "input[name='delay.max_delay_ms']").await?;
    assert_eq!(max.prop("value").await?.as_deref(), Some("3000"));
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    let preview = wait_for(web, "details.preview pre").await?;
    let body = preview.prop("textContent").await?.unwrap_or_default();
    assert!(
        body.contains(r#""on_limit": "delay""#) && body.contains(r#""queue_per_key": 4"#),
        "the request body shows the delay: {body}"
    );
    browser.screenshot("rule-form-delay").await?;
    save_rule(web, "smooth").await?;
    let expected: RuleSpec = serde_json::from_value(serde_json::json!({
        "name": "smooth", "match": {"path_prefix": "/api/"}, "key": {"header": "x-api-key"},
        "limits": [{"requests": 2, "period": "second"}],
        "on_limit": "delay",
        "delay": {"max_delay_ms": 3000, "queue_per_key": 4, "queue_per_worker": 64},
    }))?;
    assert_eq!(stored_spec(admin, "smooth")?, expected);
    // Opened again, the form shows the rule as saved.
    click(web, "[data-rule=smooth] [data-test=edit]").await?;
    let on_limit = wait_for(web, "select[name=on_limit]").await?;
    assert_eq!(on_limit.prop("value").await?.as_deref(), Some("delay"));
    let per_key = wait_for(web, "input[name='delay.queue_per_key']").await?;
    assert_eq!(per_key.prop("value").await?.as_deref(), Some("4"));

    // Beside it, through the API: a soft limit (5 a minute, 100% over it warned) and an
    // in-flight limit (2 at once).
    let soft = serde_json::json!({
        "name": "soft", "match": {"path_prefix": "/soft/"}, "key": {"header": "x-api-key"},
        "limits": [{"requests": 5, "period": "minute", "soft_percent": 100}],
    });
    let in_flight = serde_json::json!({
        "name": "in-flight", "match": {"path_prefix": "/slow/"}, "key": {"header": "x-api-key"},
        "limits": [{"concurrent": 2}],
    });
    wait_proxy_version(admin, envoy, 1).await?;
    for (version, rule) in [(2, &soft), (3, &in_flight)] {
        let (status, body) = admin.call("POST", "/api/v1/rules", Some(rule))?;
        assert_eq!(status, 201, "{body}");
        wait_proxy_version(admin, envoy, version).await?;
    }

    // Six at once past a burst of 2: the rest wait their turn (2 a second, all due
    // within 3 s, at most 4 of the key waiting on a worker).
    let smooth = shaped_traffic(envoy, "/api/orders", "carol", 6, 6, 0);
    assert!(smooth.iter().all(|r| r.status == 200), "{smooth:?}");
    let delayed = smooth
        .iter()
        .filter(|r| r.header(DELAY_WAIT_HEADER).is_some())
        .count();
    assert!(delayed >= 1, "a burst of 6 over 2: some wait");
    // Twenty in a row over 5 a minute with a 100% margin: 5 warned, 10 refused.
    let soft = shaped_traffic(envoy, "/soft/x", "bob", 20, 1, 0);
    let warned = soft
        .iter()
        .filter(|r| r.header(WARNING_HEADER).is_some())
        .count();
    assert_eq!(warned, 5, "5 pass, 5 warned, 10 refused");
    // Five at once, each held 1.5 s by the upstream: two in flight, the rest refused.
    let slow = shaped_traffic(envoy, "/slow/x", "dave", 5, 5, 1_500);
    let refused = slow.iter().filter(|r| r.status == 429).count();
    assert!(refused >= 1, "five at once over 2 in flight: some refused");

    // The overview, from the Envoy's reports: a card each, a chart line each, and each
    // rule's own under its name.
    nav(web, "Overview").await?;
    wait_exact(web, "[data-test=delayed] .stat-value", &delayed.to_string()).await?;
    wait_text(web, "[data-test=delayed] .stat-note", "mean wait").await?;
    wait_exact(web, "[data-test=warned] .stat-value", &warned.to_string()).await?;
    wait_exact(
        web,
        "[data-test=in-flight-refused] .stat-value",
        &refused.to_string(),
    )
    .await?;
    for label in ["Delayed", "Warned", "In-flight refused"] {
        wait_text(web, ".legend", label).await?;
    }
    let row = |rule: &str| {
        format!("[data-test=rule-metrics] [data-rule={rule}] [data-test=rule-shaping]")
    };
    wait_text(
        web,
        &row("smooth"),
        &format!("{delayed} delayed, mean wait"),
    )
    .await?;
    wait_exact(web, &row("soft"), &format!("{warned} warned")).await?;
    wait_exact(
        web,
        &row("in-flight"),
        &format!("{refused} in-flight refused"),
    )
    .await?;
    browser.screenshot("overview-shaped-traffic").await?;

    // The rules list names the same under each rule.
    nav(web, "Rules").await?;
    wait_text(
        web,
        "[data-rule=smooth] [data-test=rule-shaping]",
        &format!("{delayed} delayed, mean wait"),
    )
    .await?;
    wait_text(
        web,
        "[data-rule=in-flight] [data-test=rule-shaping]",
        &format!("{refused} in-flight refused"),
    )
    .await?;
    browser.screenshot("rules-shaped-traffic").await?;
    Ok(())
}

/// The dashboard served by `sluice serve --tls-cert/--tls-key` with a certificate from a
/// CA made here: a browser told to trust that certificate signs in over https, and the
/// session cookie it gets is Secure (it must come back over https for the signed-in pages
/// to load); a browser not told so refuses the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_over_https() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let pki = TestPki::new();
    let admin = AdminServer::start_tls(&pki)?;
    let url = admin.url("/");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let viewer = admin.create_token("viewer", "tls-viewer")?;

    let browser = Browser::start_trusting(&pki).await?;
    let web = browser.client();
    let result = async {
        web.goto(&url).await?;
        wait_for(web, "form.signin").await?;
        sign_in(web, &viewer).await?;
        let at = web.current_url().await?;
        if at.scheme() != "https" {
            bail!("the dashboard left https: {at}");
        }
        let cookie = web.get_named_cookie("sluice_session").await?;
        if cookie.secure() != Some(true) || cookie.http_only() != Some(true) {
            bail!("the session cookie over https: {cookie:?}");
        }
        // (The top bar that `sign_in` waited for shows only once the app has read
        // `/api/v1/session` with that cookie, so it came back over https.) The harness's
        // own calls speak TLS to the same server.
        let (status, rules) = admin.call("GET", "/api/v1/rules", None)?;
        if status != 200 {
            bail!("the API over TLS: {status} {rules}");
        }
        browser.screenshot("https-overview").await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = browser.screenshot("https-failure").await;
    }
    browser.close().await;
    result?;

    // Without the certificate's key in its list, Chromium refuses the same page: it shows
    // its certificate interstitial in place of the dashboard.
    let untrusting = Browser::start().await?;
    let web = untrusting.client();
    let refused = async {
        web.goto(&url).await?;
        let page = eventually("Chromium's certificate error page", UI_WAIT, async || {
            web.source()
                .await
                .ok()
                .filter(|page| page.contains("ERR_CERT_AUTHORITY_INVALID"))
        })
        .await?;
        if exists(web, "form.signin").await {
            bail!("the sign-in form beside the certificate error: {page}");
        }
        untrusting.screenshot("https-untrusted").await?;
        Ok(())
    }
    .await;
    untrusting.close().await;
    refused
}

/// The rule form edits token limits and their budget, keys from verified identity, a
/// missing key's fallback and the rollout percentage: a rule made with them in the form
/// reads back from the API field for field, its token limit edits in place, and a viewer
/// sees all of it in words.
async fn scenario(
    admin: &AdminServer,
    envoy: &Envoy,
    browser: &Browser,
    web: &Web,
    viewer: &str,
) -> Result<()> {
    // Sign in as the admin.
    web.goto(&admin.url("/")).await?;
    wait_for(web, "form.signin").await?;
    browser.screenshot("signin").await?;
    type_into(web, "input[name=token]", "slc_wrong").await?;
    click(web, "form.signin button[type=submit]").await?;
    wait_text(
        web,
        "form.signin .field-error",
        "unknown or has been revoked",
    )
    .await?;
    sign_in(web, admin.admin_token()).await?;
    wait_for(web, "[data-test=role][data-role=admin]").await?;

    // Create a rule through the form, seeing the live validation on the way.
    nav(web, "Rules").await?;
    wait_text(web, ".state.empty", "No rules yet").await?;
    start_new_rule(web, "api-per-key").await?;
    type_into(
        web,
        "input[name=description]",
        "Per API key, for everything under /api/",
    )
    .await?;
    type_into(web, "input[name='match.path_prefix']", "/api/").await?;
    type_into(web, "input[name='limits[0].requests']", "0").await?;
    let error = wait_text(
        web,
        ".field-error[data-field='limits[0].requests']",
        "must be between",
    )
    .await?;
    assert!(error.contains("1000000000"), "the core's message: {error}");
    wait_text(web, "[data-test=live-check]", "1 problem").await?;
    browser.screenshot("rule-form-invalid").await?;
    fill_limit(web, 0, "5", "minute").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    browser.screenshot("rule-form").await?;
    save_rule(web, "api-per-key").await?;
    wait_text(web, "[data-rule=api-per-key] [data-test=limits]", "5/min").await?;
    let v1 = current_version(admin)?;
    assert_eq!(v1, 1);
    wait_proxy_version(admin, envoy, v1).await?;

    // Throttle a client: 5 of 20 get through.
    assert_eq!(
        traffic(envoy, "alice", 20),
        15,
        "5/min lets 5 of 20 through"
    );

    // The overview shows the throttled requests and the client within a few seconds.
    nav(web, "Overview").await?;
    let started = Instant::now();
    wait_text(web, "[data-test=top-clients]", "alice").await?;
    wait_text(web, "[data-test=stats]", "15 throttled").await?;
    wait_text(web, "[data-test=rule-metrics]", "api-per-key").await?;
    wait_text(web, "[data-test=proxies]", "envoy-test-1").await?;
    // The fleet: no rule here is fleet-wide, so the Envoy syncs only to stay counted, and
    // says so; the coordinator's answer times are shown.
    wait_text(web, "[data-test=fleet-sync]", "idle · every 4 s").await?;
    // (The stats' labels are shown in capitals: their notes and values are matched.)
    wait_text(web, "[data-test=stats]", "syncs in ").await?;
    wait_text(web, "[data-test=stats]", "p99 ").await?;
    eprintln!(
        "overview showed the throttling {:.1} s after the traffic",
        started.elapsed().as_secs_f32()
    );

    // The clients page, the client's drill-down, and the jump to an override for it.
    nav(web, "Clients").await?;
    wait_text(web, "[data-test=clients]", "alice").await?;
    wait_text(web, "[data-client=alice]", "15").await?;
    browser.screenshot("clients").await?;
    click(web, "[data-client=alice] a.client").await?;
    wait_text(web, "[data-test=client-rule]", "api-per-key").await?;
    wait_for(web, "[data-test=client-rule] .chart svg path").await?;
    browser.screenshot("client-detail").await?;
    click(web, "[data-test=create-override]").await?;
    wait_for(web, "[data-test=override-notice]").await?;
    let client = wait_for(web, "input[name='overrides[0].client']").await?;
    assert_eq!(client.prop("value").await?.as_deref(), Some("alice"));
    let requests = wait_for(web, "input[name='overrides[0].limits[0].requests']").await?;
    assert_eq!(
        requests.prop("value").await?.as_deref(),
        Some("5"),
        "prefilled from the rule"
    );
    // The page scrolls the prefilled override into view.
    tokio::time::sleep(Duration::from_millis(800)).await;
    browser.screenshot("override-form").await?;

    // Edit the limit (dropping the unsaved override) and see the new limit enforced.
    nav(web, "Rules").await?;
    click(web, "[data-rule=api-per-key] [data-test=edit]").await?;
    let requests = wait_for(web, "input[name='limits[0].requests']").await?;
    assert_eq!(requests.prop("value").await?.as_deref(), Some("5"));
    type_into(web, "input[name='limits[0].requests']", "20").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    browser.screenshot("rule-edit").await?;
    click(web, "[data-test=save]").await?;
    wait_text(web, "[data-rule=api-per-key] [data-test=limits]", "20/min").await?;
    let v2 = current_version(admin)?;
    assert_eq!(v2, 2);
    wait_proxy_version(admin, envoy, v2).await?;
    assert_eq!(
        traffic(envoy, "alice", 25),
        5,
        "the new 20/min limit lets 20 of 25 through"
    );
    browser.screenshot("rules").await?;

    // Roll back to version 1 from the history page: 5/min again.
    nav(web, "History").await?;
    click(web, "[data-test=version][data-version='2']").await?;
    wait_text(web, "[data-test=version-detail]", "changed").await?;
    wait_for(web, ".diff-line.add").await?;
    browser.screenshot("history").await?;
    click(web, "[data-test=version][data-version='1']").await?;
    click(web, "[data-test=rollback]").await?;
    wait_for(web, ".modal").await?;
    browser.screenshot("rollback-confirm").await?;
    click(web, "[data-test=confirm]").await?;
    wait_text(web, ".flash", "Rolled back to version 1").await?;
    let v3 = current_version(admin)?;
    assert_eq!(v3, 3);
    let rule = admin.get_json("/api/v1/rules/api-per-key")?;
    assert_eq!(rule["spec"]["limits"][0]["requests"], Value::from(5));
    wait_proxy_version(admin, envoy, v3).await?;
    assert_eq!(
        traffic(envoy, "bob", 10),
        5,
        "after the rollback, 5/min again"
    );

    nav(web, "Audit log").await?;
    wait_text(web, "[data-test=audit]", "ruleset.rollback").await?;
    browser.screenshot("audit").await?;

    // The overview, for the README: a few seconds of steady traffic first.
    for i in 0..6 {
        let _ = traffic(envoy, &format!("client-{i}"), 8);
        let _ = traffic(envoy, "alice", 3);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    nav(web, "Overview").await?;
    click(web, ".segmented button:first-child").await?;
    wait_text(web, "[data-test=top-clients]", "client-").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    browser.screenshot("overview").await?;
    web.set_window_size(390, 1400).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.screenshot("overview-phone").await?;
    nav(web, "Rules").await?;
    wait_for(web, "[data-rule=api-per-key]").await?;
    browser.screenshot("rules-phone").await?;
    web.set_window_size(1440, 1000).await?;

    // A viewer sees the same pages with no edit controls at all.
    click(web, ".who button").await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, viewer).await?;
    wait_for(web, "[data-test=role][data-role=viewer]").await?;
    nav(web, "Rules").await?;
    wait_for(web, "[data-rule=api-per-key]").await?;
    for control in [
        "[data-test=new-rule]",
        "[data-test=enable-toggle]",
        "[data-test=mode-toggle]",
        "[data-test=edit]",
        "[data-test=delete]",
    ] {
        assert!(!exists(web, control).await, "a viewer sees {control}");
    }
    browser.screenshot("viewer-rules").await?;
    web.find(Locator::Css("[data-rule=api-per-key] a.rule-name"))
        .await?
        .click()
        .await?;
    wait_text(web, ".facts", "5/min").await?;
    assert!(
        !exists(web, "[data-test=save]").await,
        "a viewer gets no form"
    );
    assert!(
        !exists(web, "input[name=name]").await,
        "a viewer gets no form"
    );
    browser.screenshot("viewer-rule").await?;
    nav(web, "History").await?;
    wait_for(web, "[data-test=version-detail]").await?;
    assert!(
        !exists(web, "[data-test=rollback]").await,
        "a viewer cannot roll back"
    );
    nav(web, "Clients").await?;
    click(web, "[data-client=alice] a.client").await?;
    wait_for(web, "[data-test=client-rule]").await?;
    assert!(
        !exists(web, "[data-test=create-override]").await,
        "a viewer cannot add overrides"
    );
    // And the API refuses a viewer's change even without the UI.
    let (status, _) = admin.call_as(viewer, "POST", "/api/v1/rules/api-per-key/disable", None)?;
    assert_eq!(status, 403, "a viewer's token may not change rules");
    Ok(())
}
