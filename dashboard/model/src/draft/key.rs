//! The client key's inputs: which kind of key, the header, parameter or cookie it names,
//! the trusted hops of a client IP, where in dynamic metadata a verified identity is read,
//! which certificate field, or the parts of a composite key (each one of those); and what a
//! request without a key gets. The same inputs say which value a `match.values` condition
//! reads (the match's value conditions).

use sluice_core::spec::{
    ClientIpSpec, KeyMissingSpec, KeySpec, MetadataKeySpec, PeerCertificateField,
};

use super::choice::Choice;
use super::number::{Number, Numbers};

/// The kinds of key the form edits: `KeySpec` without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Header,
    ClientIp,
    Query,
    Path,
    Global,
    Metadata,
    PeerCertificate,
    Cookie,
    /// Several of the others joined ([`KeyDraft::parts`]).
    Composite,
}

impl Choice for KeyKind {
    const ALL: &'static [Self] = &[
        KeyKind::Header,
        KeyKind::ClientIp,
        KeyKind::Query,
        KeyKind::Path,
        KeyKind::Global,
        KeyKind::Metadata,
        KeyKind::PeerCertificate,
        KeyKind::Cookie,
        KeyKind::Composite,
    ];

    /// The key's name on the wire.
    fn value(self) -> &'static str {
        match self {
            KeyKind::Header => "header",
            KeyKind::ClientIp => "client_ip",
            KeyKind::Query => "query",
            KeyKind::Path => "path",
            KeyKind::Global => "global",
            KeyKind::Metadata => "metadata",
            KeyKind::PeerCertificate => "peer_certificate",
            KeyKind::Cookie => "cookie",
            KeyKind::Composite => "composite",
        }
    }
}

/// The certificate field `<select>`, named as on the wire.
impl Choice for PeerCertificateField {
    const ALL: &'static [Self] = &[
        PeerCertificateField::UriSan,
        PeerCertificateField::DnsSan,
        PeerCertificateField::Subject,
    ];

    fn value(self) -> &'static str {
        match self {
            PeerCertificateField::UriSan => "uri_san",
            PeerCertificateField::DnsSan => "dns_san",
            PeerCertificateField::Subject => "subject",
        }
    }
}

/// Separates a metadata path's segments in its one text input (`claims, tenant, id`): a
/// claim name may hold dots and slashes (`https://example.com/roles`), rarely a comma.
const PATH_SEPARATOR: char = ',';

/// The client key's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDraft {
    pub kind: KeyKind,
    /// The header's, query parameter's or cookie's name (one input, so switching between
    /// them keeps it).
    pub name: String,
    /// Used by [`KeyKind::ClientIp`]; empty means 0, the TCP peer.
    pub hops: Number<u32>,
    /// Used by [`KeyKind::Metadata`]: the namespace (`envoy.filters.http.jwt_authn`).
    pub metadata_filter: String,
    /// Used by [`KeyKind::Metadata`]: the path's segments, comma-separated.
    pub metadata_path: String,
    /// Used by [`KeyKind::PeerCertificate`].
    pub certificate: PeerCertificateField,
    /// Used by [`KeyKind::Composite`]: its parts, in order, each of another kind (kept as
    /// typed while another kind is picked).
    pub parts: Vec<KeyDraft>,
}

/// Whether the form's inputs can show `spec`: exactly when they read back to it. A
/// metadata path whose segments a comma-separated text cannot hold, and a composite key
/// nested in another (which the core refuses anyway), are edited as JSON.
pub fn form_shows(spec: &KeySpec) -> bool {
    KeyDraft::from_spec(spec).to_spec(&mut Numbers::default()) == *spec
}

impl Default for KeyDraft {
    /// A global key, every other input empty.
    fn default() -> KeyDraft {
        KeyDraft::from_spec(&KeySpec::Global)
    }
}

impl KeyDraft {
    /// A new part of a composite key: a header, named as typed.
    pub fn new_part() -> KeyDraft {
        KeyDraft {
            kind: KeyKind::Header,
            ..KeyDraft::default()
        }
    }

    pub fn from_spec(spec: &KeySpec) -> KeyDraft {
        let mut draft = KeyDraft {
            kind: KeyKind::Global,
            name: String::new(),
            hops: Number::from(0),
            metadata_filter: String::new(),
            metadata_path: String::new(),
            certificate: PeerCertificateField::UriSan,
            parts: Vec::new(),
        };
        match spec {
            KeySpec::Header(h) => (draft.kind, draft.name) = (KeyKind::Header, h.clone()),
            KeySpec::ClientIp(ip) => {
                (draft.kind, draft.hops) = (KeyKind::ClientIp, Number::from(ip.trusted_hops));
            }
            KeySpec::Query(q) => (draft.kind, draft.name) = (KeyKind::Query, q.clone()),
            KeySpec::Path => draft.kind = KeyKind::Path,
            KeySpec::Metadata(m) => {
                draft.kind = KeyKind::Metadata;
                draft.metadata_filter = m.filter.clone();
                draft.metadata_path = m.path.join(&format!("{PATH_SEPARATOR} "));
            }
            KeySpec::PeerCertificate(field) => {
                (draft.kind, draft.certificate) = (KeyKind::PeerCertificate, *field);
            }
            KeySpec::Cookie(c) => (draft.kind, draft.name) = (KeyKind::Cookie, c.clone()),
            KeySpec::Composite(parts) => {
                draft.kind = KeyKind::Composite;
                // A nested composite part would read back as global: `form_shows` then
                // keeps the rule in JSON.
                draft.parts = parts
                    .iter()
                    .map(|p| match p {
                        KeySpec::Composite(_) => KeyDraft::from_spec(&KeySpec::Global),
                        other => KeyDraft::from_spec(other),
                    })
                    .collect();
            }
            KeySpec::Global => {}
        }
        draft
    }

    /// The rule's key the inputs describe; a bad number is named under `key`.
    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> KeySpec {
        self.to_spec_at(numbers, "key")
    }

    /// The key (or a value source) the inputs describe, bad numbers named under `field`
    /// (`key`, `key.composite[1]`, `match.values[0].value`), as the core names them.
    pub(super) fn to_spec_at(&self, numbers: &mut Numbers, field: &str) -> KeySpec {
        match self.kind {
            KeyKind::Header => KeySpec::Header(self.name.trim().to_string()),
            KeyKind::Query => KeySpec::Query(self.name.trim().to_string()),
            KeyKind::ClientIp => KeySpec::ClientIp(ClientIpSpec {
                trusted_hops: numbers
                    .optional(&self.hops, &format!("{field}.client_ip.trusted_hops"))
                    .unwrap_or(0),
            }),
            KeyKind::Path => KeySpec::Path,
            KeyKind::Global => KeySpec::Global,
            KeyKind::Metadata => KeySpec::Metadata(MetadataKeySpec {
                filter: self.metadata_filter.trim().to_string(),
                path: metadata_path(&self.metadata_path),
            }),
            KeyKind::PeerCertificate => KeySpec::PeerCertificate(self.certificate),
            KeyKind::Cookie => KeySpec::Cookie(self.name.trim().to_string()),
            KeyKind::Composite => KeySpec::Composite(
                self.parts
                    .iter()
                    .enumerate()
                    .map(|(i, part)| match part.kind {
                        // Only a nested composite could come here (the view offers no
                        // such part): read as global, which the core names.
                        KeyKind::Composite => KeySpec::Global,
                        _ => part.to_spec_at(numbers, &format!("{field}.composite[{i}]")),
                    })
                    .collect(),
            ),
        }
    }
}

/// A metadata path's segments as typed, each trimmed; no text is no segment (an empty
/// segment between two commas stays, for the core to name).
fn metadata_path(text: &str) -> Vec<String> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    text.split(PATH_SEPARATOR)
        .map(|segment| segment.trim().to_string())
        .collect()
}

/// What a matching request without a client key gets: the `<select>`'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMissing {
    /// The rule does not apply to it.
    Skip,
    /// It draws from the bucket named in [`KeyMissingDraft::fallback`].
    Fallback,
}

impl Choice for KeyMissing {
    const ALL: &'static [Self] = &[KeyMissing::Skip, KeyMissing::Fallback];

    /// The wire's names.
    fn value(self) -> &'static str {
        match self {
            KeyMissing::Skip => "skip",
            KeyMissing::Fallback => "fallback",
        }
    }
}

/// The inputs of `key_missing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMissingDraft {
    pub choice: KeyMissing,
    /// The fallback client key; kept as typed while `Skip` is picked.
    pub fallback: String,
}

impl KeyMissingDraft {
    pub(super) fn from_spec(spec: &KeyMissingSpec) -> KeyMissingDraft {
        match spec {
            KeyMissingSpec::Skip => KeyMissingDraft {
                choice: KeyMissing::Skip,
                fallback: String::new(),
            },
            KeyMissingSpec::Fallback(client) => KeyMissingDraft {
                choice: KeyMissing::Fallback,
                fallback: client.clone(),
            },
        }
    }

    pub(super) fn to_spec(&self) -> KeyMissingSpec {
        match self.choice {
            KeyMissing::Skip => KeyMissingSpec::Skip,
            KeyMissing::Fallback => KeyMissingSpec::Fallback(self.fallback.trim().to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::choice::tests::options_round_trip;
    use super::*;

    #[test]
    fn key_options_are_the_wire_names() {
        options_round_trip::<KeyKind>();
        for &kind in KeyKind::ALL {
            let draft = KeyDraft {
                kind,
                name: "x".into(),
                hops: Number::from(1),
                ..KeyDraft::from_spec(&KeySpec::Global)
            };
            let json = serde_json::to_value(draft.to_spec(&mut Numbers::default())).unwrap();
            let name = match &json {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Object(o) => o.keys().next().unwrap().clone(),
                other => panic!("{other}"),
            };
            assert_eq!(name, kind.value(), "{json}");
        }
    }

    #[test]
    fn each_key_kind_reads_back_from_its_inputs() {
        let key = |kind, name: &str, hops: &str| {
            let mut numbers = Numbers::default();
            let draft = KeyDraft {
                kind,
                name: name.into(),
                hops: Number::parse(hops),
                ..KeyDraft::from_spec(&KeySpec::Global)
            };
            (draft.to_spec(&mut numbers), numbers.problems)
        };
        assert_eq!(
            key(KeyKind::Header, " x-user ", "").0,
            KeySpec::Header("x-user".into())
        );
        assert_eq!(
            key(KeyKind::Query, "token", "").0,
            KeySpec::Query("token".into())
        );
        assert_eq!(key(KeyKind::Path, "ignored", "").0, KeySpec::Path);
        assert_eq!(key(KeyKind::Global, "", "").0, KeySpec::Global);
        let (spec, problems) = key(KeyKind::ClientIp, "", "3");
        assert_eq!(spec, KeySpec::ClientIp(ClientIpSpec { trusted_hops: 3 }));
        assert!(problems.is_empty());
        let (spec, problems) = key(KeyKind::ClientIp, "", "");
        assert_eq!(
            spec,
            KeySpec::ClientIp(ClientIpSpec { trusted_hops: 0 }),
            "no hops: the TCP peer"
        );
        assert!(problems.is_empty(), "hops are optional");
        let (_, problems) = key(KeyKind::ClientIp, "", "two");
        assert_eq!(problems[0].field, "key.client_ip.trusted_hops");
        assert_eq!(problems[0].message, "must be a whole number");
        let (_, problems) = key(KeyKind::Header, "x", "two");
        assert!(problems.is_empty(), "hops are read only for a client IP");
    }

    #[test]
    fn a_composite_key_reads_back_from_its_parts() {
        let key: KeySpec = serde_json::from_str(
            r#"{"composite":[{"header":"x-tenant"},"path",{"client_ip":{"trusted_hops":2}},
                {"metadata":{"filter":"f","path":["claims","sub"]}}]}"#,
        )
        .unwrap();
        let draft = KeyDraft::from_spec(&key);
        assert_eq!(draft.kind, KeyKind::Composite);
        let kinds: Vec<KeyKind> = draft.parts.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                KeyKind::Header,
                KeyKind::Path,
                KeyKind::ClientIp,
                KeyKind::Metadata
            ]
        );
        assert!(form_shows(&key));
        assert!(form_shows(&KeySpec::Path));
        // Typed parts: names trimmed, a bad number named at its part.
        let mut typed = draft.clone();
        typed.parts[0].name = " x-org ".into();
        typed.parts[2].hops = Number::parse("two");
        let mut numbers = Numbers::default();
        let KeySpec::Composite(parts) = typed.to_spec(&mut numbers) else {
            panic!()
        };
        assert_eq!(parts[0], KeySpec::Header("x-org".into()));
        assert_eq!(
            numbers.problems[0].field,
            "key.composite[2].client_ip.trusted_hops"
        );
        // Switching away and back keeps the parts as typed.
        let global = KeyDraft {
            kind: KeyKind::Global,
            ..typed.clone()
        };
        assert_eq!(global.to_spec(&mut Numbers::default()), KeySpec::Global);
        assert_eq!(global.parts, typed.parts);
        // A new part is a header waiting for its name.
        assert_eq!(KeyDraft::new_part().kind, KeyKind::Header);
    }

    #[test]
    fn a_nested_composite_key_stays_in_json() {
        // The core refuses it; the form cannot show it, so the page keeps it as JSON.
        let key: KeySpec =
            serde_json::from_str(r#"{"composite":[{"composite":["path","global"]},"path"]}"#)
                .unwrap();
        assert!(!form_shows(&key));
    }

    #[test]
    fn identity_keys_and_cookies_read_back_from_their_inputs() {
        for json in [
            r#"{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["payload","sub"]}}"#,
            r#"{"metadata":{"filter":"ext_authz","path":["https://example.com/roles"]}}"#,
            r#"{"peer_certificate":"uri_san"}"#,
            r#"{"peer_certificate":"dns_san"}"#,
            r#"{"peer_certificate":"subject"}"#,
            r#"{"cookie":"session"}"#,
        ] {
            let key: KeySpec = serde_json::from_str(json).unwrap();
            assert!(form_shows(&key), "{json}");
        }
        let draft = KeyDraft::from_spec(
            &serde_json::from_str(r#"{"metadata":{"filter":"f","path":["claims","tenant","id"]}}"#)
                .unwrap(),
        );
        assert_eq!(draft.metadata_path, "claims, tenant, id");
        let typed = KeyDraft {
            metadata_filter: " f ".into(),
            metadata_path: " claims ,tenant,, ".into(),
            ..draft
        };
        assert_eq!(
            typed.to_spec(&mut Numbers::default()),
            KeySpec::Metadata(MetadataKeySpec {
                filter: "f".into(),
                path: vec![
                    "claims".into(),
                    "tenant".into(),
                    String::new(),
                    String::new()
                ],
            }),
            "empty segments stay, for the core to name"
        );
        let none = KeyDraft {
            metadata_path: "  ".into(),
            ..typed
        };
        let KeySpec::Metadata(m) = none.to_spec(&mut Numbers::default()) else {
            panic!()
        };
        assert!(m.path.is_empty(), "no text is no segment");
        options_round_trip::<PeerCertificateField>();
        for &field in PeerCertificateField::ALL {
            assert_eq!(serde_json::to_value(field).unwrap(), field.value());
        }
    }

    #[test]
    fn metadata_paths_the_text_cannot_hold_stay_in_json() {
        for json in [
            r#"{"metadata":{"filter":"f","path":["a,b"]}}"#,
            r#"{"metadata":{"filter":"f","path":[" padded"]}}"#,
            r#"{"metadata":{"filter":"f","path":[""]}}"#,
        ] {
            let key: KeySpec = serde_json::from_str(json).unwrap();
            assert!(!form_shows(&key), "{json}");
        }
    }

    #[test]
    fn a_missing_key_is_skipped_or_gets_the_fallback_typed() {
        options_round_trip::<KeyMissing>();
        for (spec, json) in [
            (KeyMissingSpec::Skip, r#""skip""#),
            (
                KeyMissingSpec::Fallback("anonymous".into()),
                r#"{"fallback":"anonymous"}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&spec).unwrap(), json);
            let draft = KeyMissingDraft::from_spec(&spec);
            assert_eq!(draft.to_spec(), spec);
            assert!(json.contains(draft.choice.value()), "{json}");
        }
        let typed = KeyMissingDraft {
            choice: KeyMissing::Skip,
            fallback: " anonymous ".into(),
        };
        assert_eq!(
            typed.to_spec(),
            KeyMissingSpec::Skip,
            "the name is kept, unused"
        );
        let fallback = KeyMissingDraft {
            choice: KeyMissing::Fallback,
            ..typed
        };
        assert_eq!(
            fallback.to_spec(),
            KeyMissingSpec::Fallback("anonymous".into())
        );
    }
}
