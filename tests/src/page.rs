//! Driving a page of the dashboard in the browser, as the browser tests share it: wait
//! for an element or a text, click, type, navigate, sign in; and the rule form's steps
//! (start a new rule, fill a limit, save) with the rule as the API then stores it.
//!
//! Every wait polls until a condition holds or [`UI_WAIT`] passes, so nothing depends on
//! how fast this machine is.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fantoccini::{Client as Web, Locator};
use sluice_core::spec::RuleSpec;

use crate::browser::AdminServer;

/// How long the page may take to show something the API already knows.
pub const UI_WAIT: Duration = Duration::from_secs(20);

/// Polls `check` every 200 ms until it gives a value, or fails naming `what`.
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {} s waiting for {what}", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn text_of(web: &Web, css: &str) -> Option<String> {
    let el = web.find(Locator::Css(css)).await.ok()?;
    el.text().await.ok()
}

/// Waits until the element `css` exists and its text contains `needle`.
pub async fn wait_text(web: &Web, css: &str, needle: &str) -> Result<String> {
    eventually(&format!("`{needle}` in {css}"), UI_WAIT, async || {
        text_of(web, css).await.filter(|t| t.contains(needle))
    })
    .await
}

pub async fn wait_for(web: &Web, css: &str) -> Result<fantoccini::elements::Element> {
    eventually(&format!("{css} to appear"), UI_WAIT, async || {
        web.find(Locator::Css(css)).await.ok()
    })
    .await
}

pub async fn exists(web: &Web, css: &str) -> bool {
    web.find_all(Locator::Css(css))
        .await
        .map(|v| !v.is_empty())
        .unwrap_or(false)
}

pub async fn click(web: &Web, css: &str) -> Result<()> {
    wait_for(web, css)
        .await?
        .click()
        .await
        .with_context(|| format!("clicking {css}"))
}

pub async fn type_into(web: &Web, css: &str, text: &str) -> Result<()> {
    let input = wait_for(web, css).await?;
    input.clear().await?;
    input
        .send_keys(text)
        .await
        .with_context(|| format!("typing into {css}"))
}

/// Picks `value` in the form's `<select>` named `name`.
pub async fn pick(web: &Web, name: &str, value: &str) -> Result<()> {
    click(web, &format!("select[name='{name}'] option[value={value}]")).await
}

/// The value property of the input or `<select>` `css`.
pub async fn value_of(web: &Web, css: &str) -> Result<Option<String>> {
    Ok(wait_for(web, css).await?.prop("value").await?)
}

/// From the rules page, opens the form for a new rule and names it.
pub async fn start_new_rule(web: &Web, name: &str) -> Result<()> {
    click(web, "[data-test=new-rule]").await?;
    type_into(web, "input[name=name]", name).await
}

/// Sets the amount of the form's limit `index` and picks its period (a named one).
pub async fn fill_limit(web: &Web, index: usize, amount: &str, period: &str) -> Result<()> {
    type_into(
        web,
        &format!("input[name='limits[{index}].requests']"),
        amount,
    )
    .await?;
    click(
        web,
        &format!("select[name='limits[{index}].period'] option[value={period}]"),
    )
    .await
}

/// Waits for the form's live check to pass, saves, and waits for the rules list to show
/// the rule `id`.
pub async fn save_rule(web: &Web, id: &str) -> Result<()> {
    wait_text(web, "[data-test=live-check]", "Valid rule").await?;
    click(web, "[data-test=save]").await?;
    wait_for(web, &format!("[data-test=rule-row][data-rule='{id}']")).await?;
    Ok(())
}

/// Waits until the element `css` exists and its whole text is `expected`.
pub async fn wait_exact(web: &Web, css: &str, expected: &str) -> Result<()> {
    eventually(&format!("`{expected}` as {css}"), UI_WAIT, async || {
        text_of(web, css)
            .await
            .filter(|t| t.trim() == expected)
            .map(|_| ())
    })
    .await
}

/// Navigates inside the app the way a person does: through a link in the top bar.
pub async fn nav(web: &Web, label: &str) -> Result<()> {
    let link = web
        .find(Locator::XPath(&format!(
            "//nav[@class='nav']/a[normalize-space()='{label}']"
        )))
        .await
        .with_context(|| format!("the {label} link"))?;
    link.click().await?;
    Ok(())
}

pub async fn sign_in(web: &Web, token: &str) -> Result<()> {
    type_into(web, "input[name=token]", token).await?;
    click(web, "form.signin button[type=submit]").await?;
    wait_for(web, "header.topbar").await?;
    Ok(())
}

/// The rule `id` as the API stores it.
pub fn stored_spec(admin: &AdminServer, id: &str) -> Result<RuleSpec> {
    let rule = admin.get_json(&format!("/api/v1/rules/{id}"))?;
    Ok(serde_json::from_value(rule["spec"].clone())?)
}
