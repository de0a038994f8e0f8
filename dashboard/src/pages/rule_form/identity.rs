//! Inputs for keys from who the caller is (dynamic metadata such as a verified JWT claim,
//! the mTLS peer certificate, a cookie), what a request without a key gets, and the
//! rollout percentage.

use leptos::prelude::*;
use sluice_core::spec::PeerCertificateField;
use sluice_dashboard_model::draft::{KeyMissing, Number};

use super::inputs::{Field, FormCtx, number, select, text};
use super::state::{KeyInputs, KeyMissingInputs};

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

/// Where in the request's dynamic metadata the key is read.
pub(super) fn metadata_fields(key: KeyInputs) -> impl IntoView {
    let form = expect_context::<FormCtx>();
    // The core names a bad segment by its index (`key.metadata.path[2]`): the one input
    // shows the first such problem.
    let path_field = Signal::derive(move || {
        form.errors
            .with(|es| {
                es.iter()
                    .find(|e| e.field.starts_with("key.metadata.path"))
                    .map(|e| e.field.clone())
            })
            .unwrap_or_else(|| "key.metadata.path".to_string())
    });
    view! {
        <Field label="Metadata namespace" path="key.metadata.filter" hint="usually the filter that wrote it">
            {text(key.metadata_filter, "key.metadata.filter", "envoy.filters.http.jwt_authn")}
        </Field>
        <Field label="Path" path=path_field hint="segments, comma-separated">
            {text(key.metadata_path, "key.metadata.path", "claims, tenant")}
        </Field>
    }
}

/// Which field of the verified TLS peer certificate is the key.
pub(super) fn certificate_field(key: KeyInputs) -> impl IntoView {
    view! {
        <Field label="Certificate field" path="key.peer_certificate">
            {select(key.certificate, Some("key.peer_certificate".into()), CERTIFICATE_FIELDS)}
        </Field>
    }
}

/// The cookie whose value is the key.
pub(super) fn cookie_field(key: KeyInputs) -> impl IntoView {
    view! { <Field label="Cookie name" path="key.cookie">{text(key.name, "key.cookie", "session")}</Field> }
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
