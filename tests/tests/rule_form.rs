//! The rule form in a real browser against a real admin API: the inputs for token
//! budgets, keys from identity, rollouts and warn mode, composite keys and value
//! conditions (with the rule's dry-run estimate), and for elastic rules, each
//! saved rule read back from the API exactly and shown again when the form reopens, and
//! a viewer's page stating what was saved. Screenshots land in `target/screenshots/`.
//!
//! Needs the built `sluice` (with the dashboard embedded), Chromium and chromedriver:
//! `cargo xtask test` provides them all. The delay inputs are driven in `browser.rs`,
//! where their rule then shapes a real Envoy's traffic.

use anyhow::Result;
use fantoccini::Client as Web;
use sluice_core::spec::{Mode, RuleSpec};
use sluice_tests::browser::{AdminServer, Browser, browser_available};
use sluice_tests::page::{
    UI_WAIT, click, eventually, exists, fill_limit, nav, pick, save_rule, sign_in, start_new_rule,
    stored_spec, type_into, value_of, wait_for, wait_text,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_form_edits_token_budgets_identity_keys_and_rollouts() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let admin = AdminServer::start()?;
    let viewer = admin.create_token("viewer", "form-viewer")?;
    let browser = Browser::start().await?;
    let web = browser.client();
    let result = token_and_identity_form(&admin, &browser, web, &viewer).await;
    if result.is_err() {
        let _ = browser.screenshot("rule-form-tokens-failure").await;
    }
    browser.close().await;
    result
}

async fn token_and_identity_form(
    admin: &AdminServer,
    browser: &Browser,
    web: &Web,
    viewer: &str,
) -> Result<()> {
    web.goto(&admin.url("/")).await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, admin.admin_token()).await?;
    nav(web, "Rules").await?;
    start_new_rule(web, "llm-per-tenant").await?;

    // Whose bucket: a verified JWT claim, a fallback for requests without one, and a
    // rollout to a quarter of the clients.
    click(web, "select[name=key_kind] option[value=metadata]").await?;
    type_into(
        web,
        "input[name='key.metadata.filter']",
        "envoy.filters.http.jwt_authn",
    )
    .await?;
    type_into(web, "input[name='key.metadata.path']", "claims, tenant").await?;
    click(web, "select[name=key_missing] option[value=fallback]").await?;
    type_into(web, "input[name='key_missing.fallback']", "anonymous").await?;
    type_into(web, "input[name=enforce_percent]", "25").await?;

    // 60 requests a minute, and 20,000 output tokens a minute beside it.
    fill_limit(web, 0, "60", "minute").await?;
    assert!(
        !exists(web, "[data-test=token-budget]").await,
        "no token budget without a token limit"
    );
    click(web, "[data-test=add-limit]").await?;
    click(
        web,
        "select[name='limits[1].counts'] option[value=output_tokens]",
    )
    .await?;
    type_into(web, "input[name='limits[1].tokens']", "20000").await?;
    click(web, "select[name='limits[1].period'] option[value=minute]").await?;
    type_into(web, "input[name='limits[1].burst']", "30000").await?;
    wait_for(web, "[data-test=token-budget]").await?;

    // Saving before saying where usage is read: the form shows the API's own refusal.
    click(web, "[data-test=save]").await?;
    let refused = wait_text(
        web,
        ".field-error[data-field=tokens]",
        "is required when a limit counts tokens",
    )
    .await?;
    let without_budget = serde_json::json!({
        "name": "no-budget", "key": "global",
        "limits": [{"tokens": 10, "period": "minute"}],
    });
    let (status, body) = admin.call("POST", "/api/v1/rules", Some(&without_budget))?;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains(&refused),
        "the API says {body}; the form said {refused}"
    );

    // JSON pointers: one that does not parse is named at its input.
    click(
        web,
        "select[name='tokens.usage'] option[value=json_pointer]",
    )
    .await?;
    type_into(
        web,
        "input[name='tokens.usage.json_pointer.output']",
        "usage/out",
    )
    .await?;
    wait_text(
        web,
        ".field-error[data-field='tokens.usage.json_pointer.output']",
        "must be empty or start with '/'",
    )
    .await?;
    type_into(
        web,
        "input[name='tokens.usage.json_pointer.output']",
        "/usage/out",
    )
    .await?;
    type_into(
        web,
        "input[name='tokens.usage.json_pointer.input']",
        "/usage/in",
    )
    .await?;
    type_into(web, "input[name='tokens.default_estimate']", "500").await?;
    click(web, "input[name='tokens.estimate_input_from_body']").await?;
    // Asking streams for their usage is OpenAI's only: refused here, then taken back.
    click(web, "input[name='tokens.include_usage']").await?;
    wait_text(
        web,
        ".field-error[data-field='tokens.include_usage']",
        "applies only to `usage: openai`",
    )
    .await?;
    click(web, "input[name='tokens.include_usage']").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    browser.screenshot("rule-form-tokens").await?;
    save_rule(web, "llm-per-tenant").await?;
    wait_text(
        web,
        "[data-rule=llm-per-tenant] [data-test=limits]",
        "20,000 output tokens/min",
    )
    .await?;

    let expected = |tokens_limit: &str| -> Result<RuleSpec> {
        Ok(serde_json::from_str(&format!(
            r#"{{"name":"llm-per-tenant",
                "key":{{"metadata":{{"filter":"envoy.filters.http.jwt_authn","path":["claims","tenant"]}}}},
                "key_missing":{{"fallback":"anonymous"}},"enforce_percent":25,
                "limits":[{{"requests":60,"period":"minute"}},{tokens_limit}],
                "tokens":{{"usage":{{"json_pointer":{{"input":"/usage/in","output":"/usage/out"}}}},
                          "default_estimate":500,"estimate_input_from_body":true}}}}"#
        ))?)
    };
    assert_eq!(
        stored_spec(admin, "llm-per-tenant")?,
        expected(r#"{"tokens":20000,"period":"minute","burst":30000,"count":"output"}"#)?
    );

    // Edit the token limit in the form (the metadata key opens in the form, not as JSON):
    // 40,000 tokens counting input and output alike.
    click(web, "[data-rule=llm-per-tenant] [data-test=edit]").await?;
    let path = wait_for(web, "input[name='key.metadata.path']").await?;
    assert_eq!(path.prop("value").await?.as_deref(), Some("claims, tenant"));
    let amount = wait_for(web, "input[name='limits[1].tokens']").await?;
    assert_eq!(amount.prop("value").await?.as_deref(), Some("20000"));
    let counts = wait_for(web, "select[name='limits[1].counts']").await?;
    assert_eq!(
        counts.prop("value").await?.as_deref(),
        Some("output_tokens")
    );
    let pointer = wait_for(web, "input[name='tokens.usage.json_pointer.input']").await?;
    assert_eq!(pointer.prop("value").await?.as_deref(), Some("/usage/in"));
    type_into(web, "input[name='limits[1].tokens']", "40000").await?;
    click(web, "select[name='limits[1].counts'] option[value=tokens]").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    browser.screenshot("rule-edit-tokens").await?;
    click(web, "[data-test=save]").await?;
    wait_text(
        web,
        "[data-rule=llm-per-tenant] [data-test=limits]",
        "40,000 tokens/min",
    )
    .await?;
    assert_eq!(
        stored_spec(admin, "llm-per-tenant")?,
        expected(r#"{"tokens":40000,"period":"minute","burst":30000}"#)?,
        "only the token limit changed"
    );

    // A check-only limit in warn mode with a soft margin (500% refused as the API refuses
    // it): the list shows its mode, with no enforce/shadow pill that would turn it into a
    // shadow rule.
    start_new_rule(web, "plan-warning").await?;
    click(web, "select[name=mode] option[value=warn]").await?;
    fill_limit(web, 0, "100", "second").await?;
    type_into(web, "input[name='limits[0].soft_percent']", "500").await?;
    wait_text(
        web,
        ".field-error[data-field='limits[0].soft_percent']",
        "must be between 1 and 100",
    )
    .await?;
    type_into(web, "input[name='limits[0].soft_percent']", "50").await?;
    save_rule(web, "plan-warning").await?;
    wait_text(
        web,
        "[data-rule=plan-warning] [data-test=mode-warn]",
        "Warn",
    )
    .await?;
    assert!(
        !exists(web, "[data-rule=plan-warning] [data-test=mode-toggle]").await,
        "a warn rule has no enforce/shadow pill"
    );
    assert!(
        exists(web, "[data-rule=llm-per-tenant] [data-test=mode-toggle]").await,
        "an enforce rule keeps its pill"
    );
    let stored = stored_spec(admin, "plan-warning")?;
    assert_eq!(stored.mode, Mode::Warn);
    assert_eq!(stored.limits[0].soft_percent, Some(50));

    // A viewer reads the same settings in words.
    click(web, ".who button").await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, viewer).await?;
    nav(web, "Rules").await?;
    click(web, "[data-rule=llm-per-tenant] a.rule-name").await?;
    wait_text(web, ".facts", "40,000 tokens/min").await?;
    wait_text(web, ".facts", "envoy.filters.http.jwt_authn claims.tenant").await?;
    wait_text(web, "[data-test=key-missing]", "the fallback key anonymous").await?;
    wait_text(web, "[data-test=rollout]", "25% of clients").await?;
    wait_text(
        web,
        "[data-test=token-budget]",
        "JSON pointers (input /usage/in, output /usage/out)",
    )
    .await?;
    browser.screenshot("viewer-rule-tokens").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_form_makes_an_elastic_rule() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let admin = AdminServer::start()?;
    let viewer = admin.create_token("viewer", "elastic-viewer")?;
    let browser = Browser::start().await?;
    let web = browser.client();
    let result = elastic_form(&admin, &browser, web, &viewer).await;
    if result.is_err() {
        let _ = browser.screenshot("rule-form-elastic-failure").await;
    }
    browser.close().await;
    result
}

async fn elastic_form(
    admin: &AdminServer,
    browser: &Browser,
    web: &Web,
    viewer: &str,
) -> Result<()> {
    web.goto(&admin.url("/")).await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, admin.admin_token()).await?;
    nav(web, "Rules").await?;

    // 5 requests a second per API key, and over it while the rule has admitted under
    // 300 per 30 s (burst 400) in this Envoy.
    start_new_rule(web, "roomy").await?;
    fill_limit(web, 0, "5", "second").await?;
    assert!(
        !exists(web, "input[name='elastic.requests']").await,
        "no ceiling inputs while the rule is not elastic"
    );
    click(web, "input[name=elastic]").await?;
    wait_text(web, "[data-test=elastic-ceiling]", "all clients together").await?;
    type_into(web, "input[name='elastic.requests']", "300").await?;
    click(web, "select[name='elastic.period'] option[value=custom]").await?;
    type_into(web, "input[name='elastic.period.seconds']", "30").await?;
    type_into(web, "input[name='elastic.burst']", "400").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;

    // A soft limit beside it is refused, named at the switch; removing it clears it.
    click(web, "[data-test=add-limit]").await?;
    fill_limit(web, 1, "100", "minute").await?;
    type_into(web, "input[name='limits[1].soft_percent']", "20").await?;
    wait_text(
        web,
        ".field-error[data-field=elastic]",
        "an elastic rule has no soft limits",
    )
    .await?;
    assert!(
        !exists(web, ".field-error[data-field='limits[1].soft_percent']").await,
        "the problem is the combination, shown at the elastic switch"
    );
    web.execute(
        "document.querySelector('[data-test=elastic]').scrollIntoView({block: 'center'})",
        vec![],
    )
    .await?;
    browser.screenshot("rule-form-elastic-refused").await?;
    click(
        web,
        ".limits .limit-row:nth-child(2) button[aria-label='Remove limit']",
    )
    .await?;
    eventually("the refusal to go", UI_WAIT, async || {
        (!exists(web, ".field-error[data-field=elastic]").await).then_some(())
    })
    .await?;

    // Off hides the ceiling and keeps what it holds for when it is on again.
    click(web, "input[name=elastic]").await?;
    eventually("the ceiling inputs to go", UI_WAIT, async || {
        (!exists(web, "input[name='elastic.requests']").await).then_some(())
    })
    .await?;
    click(web, "input[name=elastic]").await?;
    assert_eq!(
        value_of(web, "input[name='elastic.requests']")
            .await?
            .as_deref(),
        Some("300")
    );
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    let preview = wait_for(web, "details.preview pre").await?;
    let body = preview.prop("textContent").await?.unwrap_or_default();
    assert!(
        body.contains(r#""elastic""#) && body.contains(r#""burst": 400"#),
        "the request body shows the ceiling: {body}"
    );
    browser.screenshot("rule-form-elastic").await?;
    save_rule(web, "roomy").await?;
    let expected: RuleSpec = serde_json::from_value(serde_json::json!({
        "name": "roomy", "key": {"header": "x-api-key"},
        "limits": [{"requests": 5, "period": "second"}],
        "elastic": {"requests": 300, "period": 30, "burst": 400},
    }))?;
    assert_eq!(stored_spec(admin, "roomy")?, expected);
    wait_text(web, "[data-rule=roomy] [data-test=elastic]", "Elastic").await?;

    // Opened again, the form shows the rule as saved.
    click(web, "[data-rule=roomy] [data-test=edit]").await?;
    let switch = wait_for(web, "input[name=elastic]").await?;
    assert_eq!(switch.prop("checked").await?.as_deref(), Some("true"));
    for (input, value) in [
        ("input[name='elastic.requests']", "300"),
        ("select[name='elastic.period']", "custom"),
        ("input[name='elastic.period.seconds']", "30"),
        ("input[name='elastic.burst']", "400"),
    ] {
        assert_eq!(
            value_of(web, input).await?.as_deref(),
            Some(value),
            "{input}"
        );
    }

    // A viewer reads the ceiling in words.
    click(web, ".who button").await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, viewer).await?;
    nav(web, "Rules").await?;
    click(web, "[data-rule=roomy] a.rule-name").await?;
    wait_text(
        web,
        "[data-test=elastic]",
        "clients pass their limits while all of them together are under 300 per 30 s, burst 400",
    )
    .await?;
    browser.screenshot("viewer-rule-elastic").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_form_makes_a_composite_key_and_a_value_condition() -> Result<()> {
    assert!(
        browser_available(),
        "Chromium and chromedriver are missing: run `cargo xtask test`"
    );
    let admin = AdminServer::start()?;
    let browser = Browser::start().await?;
    let web = browser.client();
    let result = composite_form(&admin, &browser, web).await;
    if result.is_err() {
        let _ = browser.screenshot("rule-form-composite-failure").await;
    }
    browser.close().await;
    result
}

async fn composite_form(admin: &AdminServer, browser: &Browser, web: &Web) -> Result<()> {
    web.goto(&admin.url("/")).await?;
    wait_for(web, "form.signin").await?;
    sign_in(web, admin.admin_token()).await?;
    nav(web, "Rules").await?;
    start_new_rule(web, "per-tenant-user").await?;

    // Whose bucket: the tenant header and the JWT's subject together.
    pick(web, "key_kind", "composite").await?;
    click(web, "[data-test=add-key-part]").await?;
    type_into(web, "input[name='key.composite[0].header']", "x-tenant").await?;
    // One part is not a composite key: the core's refusal shows at the parts.
    wait_text(
        web,
        ".field-error[data-field='key.composite']",
        "must have 2 to 4 parts",
    )
    .await?;
    click(web, "[data-test=add-key-part]").await?;
    pick(web, "key.composite[1].kind", "metadata").await?;
    type_into(
        web,
        "input[name='key.composite[1].metadata.filter']",
        "envoy.filters.http.jwt_authn",
    )
    .await?;
    type_into(
        web,
        "input[name='key.composite[1].metadata.path']",
        "payload, sub",
    )
    .await?;

    // Which requests: the JWT's plan claim is pro, and a beta cookie is present.
    click(web, "[data-test=add-value-condition]").await?;
    type_into(
        web,
        "input[name='match.values[0].value.metadata.path']",
        "payload, plan",
    )
    .await?;
    type_into(web, "input[name='match.values[0].equals']", "pro").await?;
    click(web, "[data-test=add-value-condition]").await?;
    pick(web, "match.values[1].value.kind", "cookie").await?;
    type_into(web, "input[name='match.values[1].value.cookie']", "beta").await?;
    pick(web, "match.values[1].condition", "present").await?;
    fill_limit(web, 0, "10", "second").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;

    // The dry run: nothing was ever recorded under this key, and the form says so.
    click(web, "[data-test=estimate-button]").await?;
    wait_text(web, "[data-test=estimate]", "no traffic was recorded").await?;
    browser.screenshot("rule-form-composite").await?;
    save_rule(web, "per-tenant-user").await?;
    let expected: RuleSpec = serde_json::from_str(
        r#"{"name":"per-tenant-user",
            "match":{"values":[
                {"value":{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["payload","plan"]}},"equals":"pro"},
                {"value":{"cookie":"beta"},"present":true}]},
            "key":{"composite":[{"header":"x-tenant"},
                {"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["payload","sub"]}}]},
            "limits":[{"requests":10,"period":"second"}]}"#,
    )?;
    assert_eq!(stored_spec(admin, "per-tenant-user")?, expected);

    // It opens in the form again (not as JSON), every part and condition as saved; an edit
    // of one part is saved as such.
    click(web, "[data-rule=per-tenant-user] [data-test=edit]").await?;
    for (input, value) in [
        ("select[name=key_kind]", "composite"),
        ("input[name='key.composite[0].header']", "x-tenant"),
        (
            "input[name='key.composite[1].metadata.path']",
            "payload, sub",
        ),
        ("input[name='match.values[0].equals']", "pro"),
        ("input[name='match.values[1].value.cookie']", "beta"),
    ] {
        assert_eq!(
            value_of(web, input).await?.as_deref(),
            Some(value),
            "{input}"
        );
    }
    type_into(web, "input[name='key.composite[0].header']", "x-org").await?;
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    click(web, "[data-test=save]").await?;
    eventually("the edited part to be stored", UI_WAIT, async || {
        let stored = stored_spec(admin, "per-tenant-user").ok()?;
        let json = serde_json::to_value(&stored.key).ok()?;
        (json["composite"][0]["header"] == "x-org").then_some(())
    })
    .await?;
    Ok(())
}
