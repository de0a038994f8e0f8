//! Inputs for where a key (or a composite key's part, or a value condition's value) is
//! read: a header, a parameter, the client IP, who the caller is (dynamic metadata such as
//! a verified JWT claim, the mTLS peer certificate, a cookie) or a composite of them; what
//! a request without a key gets, and the rollout percentage.

use leptos::prelude::*;
use sluice_core::spec::PeerCertificateField;
use sluice_dashboard_model::draft::{KeyDraft, KeyKind, KeyMissing, Number};

use super::inputs::{Field, FormCtx, number, select, text};
use super::state::{KeyInputs, KeyMissingInputs, KeyPartRow};

/// Every kind a rule's key can be.
pub(super) const KEY_KINDS: &[(KeyKind, &str)] = &[
    (KeyKind::Header, "a request header"),
    (KeyKind::ClientIp, "the client IP"),
    (KeyKind::Query, "a query parameter"),
    (KeyKind::Path, "the path"),
    (KeyKind::Global, "everyone together (global)"),
    (KeyKind::Metadata, "verified identity (dynamic metadata)"),
    (KeyKind::PeerCertificate, "the mTLS peer certificate"),
    (KeyKind::Cookie, "a cookie"),
    (KeyKind::Composite, "several of these together (composite)"),
];

/// The kinds a composite key's part, or a value condition's value, can be: one value read
/// from the request (not global, not composite).
pub(super) const PART_KINDS: &[(KeyKind, &str)] = &[
    (KeyKind::Header, "a request header"),
    (KeyKind::ClientIp, "the client IP"),
    (KeyKind::Query, "a query parameter"),
    (KeyKind::Path, "the path"),
    (KeyKind::Metadata, "verified identity (dynamic metadata)"),
    (KeyKind::PeerCertificate, "the mTLS peer certificate"),
    (KeyKind::Cookie, "a cookie"),
];

/// `at.part`, the field path of one of a source's inputs, as the core names it.
fn field(at: Signal<String>, part: &'static str) -> Signal<String> {
    Signal::derive(move || format!("{}.{part}", at.get()))
}

/// The inputs of one key source at field path `at` (`key`, `key.composite[1]`,
/// `match.values[0].value`): its kind (a select named `kind_name`, offering `kinds`),
/// then what that kind names.
pub(super) fn key_source(
    key: KeyInputs,
    at: Signal<String>,
    label: &'static str,
    kind_name: Signal<String>,
    kinds: &'static [(KeyKind, &'static str)],
) -> impl IntoView {
    view! {
        <Field label=label path=at>{select(key.kind, Some(kind_name), kinds)}</Field>
        {move || match key.kind.get() {
            KeyKind::Header => view! { <Field label="Header name" path=field(at, "header")>{text(key.name, field(at, "header"), "x-api-key")}</Field> }.into_any(),
            KeyKind::Query => view! { <Field label="Parameter name" path=field(at, "query")>{text(key.name, field(at, "query"), "api_key")}</Field> }.into_any(),
            KeyKind::ClientIp => {
                let hops = field(at, "client_ip.trusted_hops");
                view! {
                    <Field label="Trusted proxy hops" path=hops hint="0 = the TCP peer; N = Nth X-Forwarded-For entry from the right">
                        {number(key.hops, hops, "0")}
                    </Field>
                }.into_any()
            }
            KeyKind::Metadata => metadata_fields(key, at).into_any(),
            KeyKind::PeerCertificate => certificate_field(key, at).into_any(),
            KeyKind::Cookie => cookie_field(key, at).into_any(),
            KeyKind::Composite => composite_parts(key, at),
            KeyKind::Path | KeyKind::Global => ().into_any(),
        }}
    }
}

/// A composite key's parts, each a source of its own, with buttons to add and remove them.
/// (A concrete view type: [`key_source`] shows this, and this shows `key_source`.)
fn composite_parts(key: KeyInputs, at: Signal<String>) -> AnyView {
    let parts = key.parts;
    let index = move |id: usize| parts.with(|ps| ps.iter().position(|p| p.id == id).unwrap_or(0));
    view! {
        <div class="composite" data-test="composite-parts">
            <For each=move || parts.get() key=|p| p.id let:part>
                {
                    let part_at = Signal::derive(move || format!("{}.composite[{}]", at.get(), index(part.id)));
                    let kind_name = Signal::derive(move || format!("{}.kind", part_at.get()));
                    view! {
                        <div class="inline-row">
                            {key_source(part.key, part_at, "Part", kind_name, PART_KINDS)}
                            <button type="button" class="icon-btn" aria-label="Remove key part"
                                on:click=move |_| parts.update(|ps| ps.retain(|x| x.id != part.id))>"×"</button>
                        </div>
                    }
                }
            </For>
            <Field label="" path=field(at, "composite")>
                <button type="button" class="btn small" data-test="add-key-part"
                    on:click=move |_| parts.update(|ps| ps.push(KeyPartRow::new(KeyDraft::new_part())))>"+ Key part"</button>
            </Field>
        </div>
    }
    .into_any()
}

const CERTIFICATE_FIELDS: &[(PeerCertificateField, &str)] = &[
    (
        PeerCertificateField::UriSan,
        "first URI SAN (e.g. SPIFFE id)",
    ),
    (PeerCertificateField::DnsSan, "first DNS SAN"),
    (PeerCertificateField::Subject, "subject"),
];

const KEY_MISSING: &[(KeyMissing, &str)] = &[
    (KeyMissing::Skip, "skip the rule"),
    (KeyMissing::Fallback, "use a fallback key"),
];

/// Where in the request's dynamic metadata the value is read.
fn metadata_fields(key: KeyInputs, at: Signal<String>) -> impl IntoView {
    let form = expect_context::<FormCtx>();
    let path = field(at, "metadata.path");
    // The core names a bad segment by its index (`key.metadata.path[2]`): the one input
    // shows the first such problem.
    let path_field = Signal::derive(move || {
        let prefix = path.get();
        form.errors
            .with(|es| {
                es.iter()
                    .find(|e| e.field.starts_with(&prefix))
                    .map(|e| e.field.clone())
            })
            .unwrap_or(prefix)
    });
    let filter = field(at, "metadata.filter");
    view! {
        <Field label="Metadata namespace" path=filter hint="usually the filter that wrote it">
            {text(key.metadata_filter, filter, "envoy.filters.http.jwt_authn")}
        </Field>
        <Field label="Path" path=path_field hint="segments, comma-separated">
            {text(key.metadata_path, path, "claims, tenant")}
        </Field>
    }
}

/// Which field of the verified TLS peer certificate is the value.
fn certificate_field(key: KeyInputs, at: Signal<String>) -> impl IntoView {
    let path = field(at, "peer_certificate");
    view! {
        <Field label="Certificate field" path=path>
            {select(key.certificate, Some(path), CERTIFICATE_FIELDS)}
        </Field>
    }
}

/// The cookie whose value is the value.
fn cookie_field(key: KeyInputs, at: Signal<String>) -> impl IntoView {
    let path = field(at, "cookie");
    view! { <Field label="Cookie name" path=path>{text(key.name, path, "session")}</Field> }
}

/// What a matching request that carries no key gets.
#[component]
pub(super) fn KeyMissingFields(inputs: KeyMissingInputs) -> impl IntoView {
    view! {
        <div class="grid2">
            <Field label="A request without this key" path="key_missing">
                {select(inputs.choice, Some("key_missing".into()), KEY_MISSING)}
            </Field>
            <Show when=move || inputs.choice.get() == KeyMissing::Fallback>
                <Field label="Fallback key" path="key_missing.fallback" hint="one bucket shared by every such request">
                    {text(inputs.fallback, "key_missing.fallback", "anonymous")}
                </Field>
            </Show>
        </div>
    }
}

/// The share of clients an enforce-mode rule is enforced for.
#[component]
pub(super) fn RolloutField(percent: RwSignal<Number<u8>>) -> impl IntoView {
    view! {
        <Field label="Enforced for (% of clients)" path="enforce_percent" hint="0 to 100; chosen by a hash of the client key, the rest in shadow mode">
            {number(percent, "enforce_percent", "100")}
        </Field>
    }
}
