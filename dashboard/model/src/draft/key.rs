//! The client key's inputs: which kind of key, the header or parameter it names, the
//! trusted hops of a client IP.

use sluice_core::spec::{ClientIpSpec, KeySpec};

use super::choice::Choice;
use super::number::{Number, Numbers};

/// The kinds of key the form edits: `KeySpec` without its data. Composite keys are
/// edited as JSON; the form would show one as global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Header,
    ClientIp,
    Query,
    Path,
    Global,
}

impl Choice for KeyKind {
    const ALL: &'static [Self] = &[
        KeyKind::Header,
        KeyKind::ClientIp,
        KeyKind::Query,
        KeyKind::Path,
        KeyKind::Global,
    ];

    /// The key's name on the wire.
    fn value(self) -> &'static str {
        match self {
            KeyKind::Header => "header",
            KeyKind::ClientIp => "client_ip",
            KeyKind::Query => "query",
            KeyKind::Path => "path",
            KeyKind::Global => "global",
        }
    }
}

/// The client key's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDraft {
    pub kind: KeyKind,
    /// The header's or query parameter's name (one input, so switching between the two
    /// keeps it).
    pub name: String,
    /// Used by [`KeyKind::ClientIp`]; empty means 0, the TCP peer.
    pub hops: Number<u32>,
}

/// Whether the form's inputs can show `spec`: composite keys and keys from verified
/// identity (metadata, certificates) and cookies are edited as JSON, since the form would
/// save them as global.
pub fn form_shows(spec: &KeySpec) -> bool {
    matches!(
        spec,
        KeySpec::Header(_)
            | KeySpec::ClientIp(_)
            | KeySpec::Query(_)
            | KeySpec::Path
            | KeySpec::Global
    )
}

impl KeyDraft {
    pub(super) fn from_spec(spec: &KeySpec) -> KeyDraft {
        let (kind, name, hops) = match spec {
            KeySpec::Header(h) => (KeyKind::Header, h.clone(), 0),
            KeySpec::ClientIp(ip) => (KeyKind::ClientIp, String::new(), ip.trusted_hops),
            KeySpec::Query(q) => (KeyKind::Query, q.clone(), 0),
            KeySpec::Path => (KeyKind::Path, String::new(), 0),
            KeySpec::Global
            | KeySpec::Composite(_)
            | KeySpec::Metadata(_)
            | KeySpec::PeerCertificate(_)
            | KeySpec::Cookie(_) => (KeyKind::Global, String::new(), 0),
        };
        KeyDraft {
            kind,
            name,
            hops: Number::from(hops),
        }
    }

    pub(super) fn to_spec(&self, numbers: &mut Numbers) -> KeySpec {
        match self.kind {
            KeyKind::Header => KeySpec::Header(self.name.trim().to_string()),
            KeyKind::Query => KeySpec::Query(self.name.trim().to_string()),
            KeyKind::ClientIp => KeySpec::ClientIp(ClientIpSpec {
                trusted_hops: numbers
                    .optional(&self.hops, "key.client_ip.trusted_hops")
                    .unwrap_or(0),
            }),
            KeyKind::Path => KeySpec::Path,
            KeyKind::Global => KeySpec::Global,
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
    fn a_composite_key_is_not_shown_by_the_form() {
        // The page opens such a rule in JSON mode and refuses to switch to the form, because
        // the form would save it as a global key.
        let key: KeySpec =
            serde_json::from_str(r#"{"composite":[{"header":"x-tenant"},"path"]}"#).unwrap();
        assert_eq!(KeyDraft::from_spec(&key).kind, KeyKind::Global);
        assert!(!form_shows(&key));
        for json in [
            r#"{"metadata":{"filter":"envoy.filters.http.jwt_authn","path":["payload","sub"]}}"#,
            r#"{"peer_certificate":"uri_san"}"#,
            r#"{"cookie":"session"}"#,
        ] {
            assert!(!form_shows(&serde_json::from_str(json).unwrap()), "{json}");
        }
        assert!(form_shows(&KeySpec::Path));
    }
}
