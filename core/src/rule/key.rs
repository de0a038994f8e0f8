//! Client keys: whose bucket a request draws from.

use std::borrow::Cow;

use crate::identity::{MAX_METADATA_NAME, MAX_METADATA_PATH, MetadataValue};
use crate::request::{RequestAttributes, RequestNeeds};
use crate::spec::{KeySpec, MetadataKeySpec, PeerCertificateField};
use crate::validation::{Problems, is_header_name};

/// How a rule finds whose bucket a request draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKey {
    Header(String),
    ClientIp {
        trusted_hops: u32,
    },
    Query(String),
    Path,
    Global,
    Composite(Vec<ClientKey>),
    /// A value in a dynamic metadata namespace (a verified JWT claim and the like).
    Metadata {
        namespace: String,
        path: Vec<String>,
    },
    PeerCertificate(PeerCertificateField),
    Cookie(String),
}

/// Separates the parts of a composite key. Override `client` values use it too.
pub const COMPOSITE_SEPARATOR: char = '|';

impl ClientKey {
    pub(super) fn build(
        spec: &KeySpec,
        field: &str,
        nested: bool,
        problems: &mut Problems,
    ) -> Option<ClientKey> {
        match spec {
            KeySpec::Header(name) => {
                let name = name.to_ascii_lowercase();
                if is_header_name(&name) {
                    Some(ClientKey::Header(name))
                } else {
                    problems.add(format!("{field}.header"), "must be a header name");
                    None
                }
            }
            KeySpec::ClientIp(ip) => {
                if ip.trusted_hops > 16 {
                    problems.add(
                        format!("{field}.client_ip.trusted_hops"),
                        "must be at most 16",
                    );
                    return None;
                }
                Some(ClientKey::ClientIp {
                    trusted_hops: ip.trusted_hops,
                })
            }
            KeySpec::Query(name) => {
                // Characters, as the schema's `maxLength` counts.
                if name.is_empty() || name.chars().count() > 256 {
                    problems.add(format!("{field}.query"), "must be a query parameter name");
                    return None;
                }
                Some(ClientKey::Query(name.clone()))
            }
            KeySpec::Path => Some(ClientKey::Path),
            KeySpec::Metadata(m) => build_metadata(m, &format!("{field}.metadata"), problems),
            KeySpec::PeerCertificate(f) => Some(ClientKey::PeerCertificate(*f)),
            KeySpec::Cookie(name) => {
                // A cookie name is an RFC 6265 token, as a header name is.
                if is_header_name(name) {
                    Some(ClientKey::Cookie(name.clone()))
                } else {
                    problems.add(format!("{field}.cookie"), "must be a cookie name");
                    None
                }
            }
            KeySpec::Global => {
                if nested {
                    problems.add(field, "`global` cannot be part of a composite key");
                    return None;
                }
                Some(ClientKey::Global)
            }
            KeySpec::Composite(parts) => {
                if nested {
                    problems.add(field, "composite keys cannot be nested");
                    return None;
                }
                if !(2..=4).contains(&parts.len()) {
                    problems.add(format!("{field}.composite"), "must have 2 to 4 parts");
                    return None;
                }
                let built: Vec<ClientKey> = parts
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| {
                        ClientKey::build(p, &format!("{field}.composite[{i}]"), true, problems)
                    })
                    .collect();
                (built.len() == parts.len()).then_some(ClientKey::Composite(built))
            }
        }
    }

    pub(crate) fn add_needs(&self, needs: &mut RequestNeeds) {
        match self {
            ClientKey::Header(name) => needs.header(name),
            ClientKey::ClientIp { trusted_hops } => {
                needs.peer_ip = true;
                if *trusted_hops > 0 {
                    needs.header("x-forwarded-for");
                }
            }
            ClientKey::Query(_) | ClientKey::Path => needs.path = true,
            ClientKey::Global => {}
            ClientKey::Composite(parts) => parts.iter().for_each(|p| p.add_needs(needs)),
            ClientKey::Metadata { namespace, path } => needs.metadata(namespace, path),
            ClientKey::PeerCertificate(field) => needs.peer_certificate(*field),
            ClientKey::Cookie(_) => needs.header("cookie"),
        }
    }

    /// Whether this key's value for `request` is `expected`: for an array claim, whether
    /// any of its values is.
    pub(crate) fn value_equals(&self, request: &impl RequestAttributes, expected: &str) -> bool {
        match self {
            ClientKey::Metadata { namespace, path } => {
                metadata_value(request, namespace, path).is_some_and(|v| v.equals(expected))
            }
            _ => self.extract(request).is_some_and(|v| v == expected),
        }
    }

    /// The client's key for this request, or `None` when the request does not carry one
    /// (the rule then does not apply to it).
    pub fn extract<'r>(&self, request: &'r impl RequestAttributes) -> Option<Cow<'r, str>> {
        match self {
            ClientKey::Header(name) => request.header(name).map(Cow::Borrowed),
            ClientKey::ClientIp { trusted_hops } => client_ip(request, *trusted_hops),
            ClientKey::Query(name) => form_urlencoded::parse(request.query().as_bytes())
                .find(|(k, _)| k == name)
                .map(|(_, v)| Cow::Owned(v.into_owned())),
            ClientKey::Path => Some(Cow::Borrowed(request.path_only())),
            ClientKey::Global => Some(Cow::Borrowed("")),
            ClientKey::Composite(parts) => {
                let mut key = String::new();
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        key.push(COMPOSITE_SEPARATOR);
                    }
                    key.push_str(&part.extract(request)?);
                }
                Some(Cow::Owned(key))
            }
            ClientKey::Metadata { namespace, path } => {
                metadata_value(request, namespace, path)?.key_text()
            }
            ClientKey::PeerCertificate(field) => request
                .peer_certificate(*field)
                .filter(|v| !v.is_empty())
                .map(Cow::Borrowed),
            ClientKey::Cookie(name) => cookie(request.header("cookie")?, name).map(Cow::Borrowed),
        }
    }
}

fn metadata_value<'r>(
    request: &'r impl RequestAttributes,
    namespace: &str,
    path: &[String],
) -> Option<&'r MetadataValue> {
    request.metadata(namespace)?.at(path)
}

fn build_metadata(
    spec: &MetadataKeySpec,
    field: &str,
    problems: &mut Problems,
) -> Option<ClientKey> {
    // Any characters: a NUL would only split the segment in Envoy's property path, and
    // the document's schema (which states these bounds) has no way to refuse it.
    let fits = |s: &str| !s.is_empty() && s.chars().count() <= MAX_METADATA_NAME;
    let mut ok = true;
    if !fits(&spec.filter) {
        problems.add(
            format!("{field}.filter"),
            format!("must be a metadata namespace of 1 to {MAX_METADATA_NAME} characters"),
        );
        ok = false;
    }
    if spec.path.is_empty() || spec.path.len() > MAX_METADATA_PATH {
        problems.add(
            format!("{field}.path"),
            format!("must have 1 to {MAX_METADATA_PATH} segments"),
        );
        ok = false;
    }
    for (i, segment) in spec.path.iter().enumerate() {
        if !fits(segment) {
            problems.add(
                format!("{field}.path[{i}]"),
                format!("must be 1 to {MAX_METADATA_NAME} characters"),
            );
            ok = false;
        }
    }
    ok.then(|| ClientKey::Metadata {
        namespace: spec.filter.clone(),
        path: spec.path.clone(),
    })
}

/// The value of cookie `name` in a `Cookie` header (`a=1; b=2`), unquoted; the first one
/// when the name repeats.
fn cookie<'h>(header: &'h str, name: &str) -> Option<&'h str> {
    header.split(';').find_map(|pair| {
        let (n, v) = pair.split_once('=')?;
        if n.trim() != name {
            return None;
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        (!v.is_empty()).then_some(v)
    })
}

/// The client address after `trusted_hops` proxies that each appended to
/// `X-Forwarded-For`: the Nth entry from the right, or the leftmost when the header is
/// shorter (the request passed fewer proxies), or the TCP peer when there is none.
fn client_ip<'r>(request: &'r impl RequestAttributes, trusted_hops: u32) -> Option<Cow<'r, str>> {
    if trusted_hops > 0 {
        if let Some(xff) = request.header("x-forwarded-for") {
            let hops = trusted_hops as usize;
            let entry = xff
                .rsplit(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .take(hops)
                .last();
            if let Some(entry) = entry {
                return Some(Cow::Borrowed(entry));
            }
        }
    }
    request.peer_ip().map(|ip| Cow::Owned(ip.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::HttpRequest;

    #[test]
    fn client_keys_come_from_headers_ips_queries_paths_and_composites() {
        let request = HttpRequest {
            path: "/p/q?api_key=k%201&x=2".into(),
            headers: vec![
                ("x-api-key".into(), "alice".into()),
                (
                    "x-forwarded-for".into(),
                    "203.0.113.9, 10.0.0.2 , 10.0.0.1".into(),
                ),
            ],
            peer_ip: Some("192.0.2.1".parse().unwrap()),
            ..HttpRequest::get("/")
        };
        let key = |k: ClientKey| k.extract(&request).map(Cow::into_owned);
        assert_eq!(
            key(ClientKey::Header("x-api-key".into())).as_deref(),
            Some("alice")
        );
        assert_eq!(key(ClientKey::Header("x-missing".into())), None);
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 0 }).as_deref(),
            Some("192.0.2.1")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 1 }).as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 3 }).as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            key(ClientKey::ClientIp { trusted_hops: 9 }).as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            key(ClientKey::Query("api_key".into())).as_deref(),
            Some("k 1")
        );
        assert_eq!(key(ClientKey::Path).as_deref(), Some("/p/q"));
        assert_eq!(key(ClientKey::Global).as_deref(), Some(""));
        let composite =
            ClientKey::Composite(vec![ClientKey::Header("x-api-key".into()), ClientKey::Path]);
        assert_eq!(key(composite).as_deref(), Some("alice|/p/q"));
        let broken = ClientKey::Composite(vec![
            ClientKey::Header("x-api-key".into()),
            ClientKey::Query("nope".into()),
        ]);
        assert_eq!(key(broken), None);
    }

    #[test]
    fn keys_come_from_claims_certificates_and_cookies_and_compose_with_the_others() {
        let claims = MetadataValue::decode_struct(&crate::identity::encode_struct(
            &serde_json::json!({"payload": {"sub": "alice", "groups": ["eng", "ops"]}}),
        ))
        .unwrap();
        let request = HttpRequest {
            identity: crate::request::Identity {
                metadata: vec![("envoy.filters.http.jwt_authn".into(), claims)],
                peer_certificate: vec![(
                    PeerCertificateField::UriSan,
                    "spiffe://example.org/billing".into(),
                )],
            },
            ..HttpRequest::get("/p")
        }
        .with_header("cookie", "theme=dark; session=\"s-42\" ;empty=");
        let key = |k: &ClientKey| k.extract(&request).map(Cow::into_owned);
        let claim = |path: &[&str]| ClientKey::Metadata {
            namespace: "envoy.filters.http.jwt_authn".into(),
            path: path.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(key(&claim(&["payload", "sub"])).as_deref(), Some("alice"));
        assert_eq!(
            key(&claim(&["payload", "groups"])).as_deref(),
            Some("eng,ops")
        );
        assert_eq!(key(&claim(&["payload", "nope"])), None);
        let other_namespace = ClientKey::Metadata {
            namespace: "ext_authz".into(),
            path: vec!["sub".into()],
        };
        assert_eq!(key(&other_namespace), None);
        assert!(claim(&["payload", "groups"]).value_equals(&request, "ops"));
        assert!(!claim(&["payload", "groups"]).value_equals(&request, "eng,ops"));
        assert!(claim(&["payload", "sub"]).value_equals(&request, "alice"));
        assert_eq!(
            key(&ClientKey::PeerCertificate(PeerCertificateField::UriSan)).as_deref(),
            Some("spiffe://example.org/billing")
        );
        assert_eq!(
            key(&ClientKey::PeerCertificate(PeerCertificateField::DnsSan)),
            None
        );
        assert_eq!(
            key(&ClientKey::Cookie("session".into())).as_deref(),
            Some("s-42")
        );
        assert_eq!(
            key(&ClientKey::Cookie("theme".into())).as_deref(),
            Some("dark")
        );
        assert_eq!(key(&ClientKey::Cookie("empty".into())), None);
        assert_eq!(key(&ClientKey::Cookie("sess".into())), None);
        let composite = ClientKey::Composite(vec![claim(&["payload", "sub"]), ClientKey::Path]);
        assert_eq!(key(&composite).as_deref(), Some("alice|/p"));
    }

    #[test]
    fn metadata_paths_are_bounded_at_the_edge() {
        let build = |json: &str| {
            let spec: KeySpec = serde_json::from_str(json).unwrap();
            let mut problems = Problems::default();
            let key = ClientKey::build(&spec, "key", false, &mut problems);
            (key, problems.into_errors().0)
        };
        let (key, problems) =
            build(r#"{"metadata":{"filter":"f","path":["a","b","c","d","e","f","g","h"]}}"#);
        assert!(key.is_some() && problems.is_empty(), "{problems:?}");
        let (key, problems) =
            build(r#"{"metadata":{"filter":"f","path":["a","b","c","d","e","f","g","h","i"]}}"#);
        assert!(key.is_none());
        assert_eq!(problems[0].field, "key.metadata.path");
        let (_, problems) = build(r#"{"metadata":{"filter":"","path":[]}}"#);
        let fields: Vec<_> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["key.metadata.filter", "key.metadata.path"]);
        let long = "x".repeat(MAX_METADATA_NAME + 1);
        let (_, problems) = build(&format!(
            r#"{{"metadata":{{"filter":"f","path":["{long}"]}}}}"#
        ));
        assert_eq!(problems[0].field, "key.metadata.path[0]");
        let (_, problems) = build(r#"{"cookie":"a b"}"#);
        assert_eq!(problems[0].field, "key.cookie");
        let (key, _) = build(r#"{"peer_certificate":"uri_san"}"#);
        assert_eq!(
            key,
            Some(ClientKey::PeerCertificate(PeerCertificateField::UriSan))
        );
    }
}
