//! Client keys: whose bucket a request draws from.

use std::borrow::Cow;

use crate::request::{RequestAttributes, RequestNeeds};
use crate::spec::KeySpec;
use crate::validation::{Problems, is_header_name};

/// How a rule finds whose bucket a request draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKey {
    Header(String),
    ClientIp { trusted_hops: u32 },
    Query(String),
    Path,
    Global,
    Composite(Vec<ClientKey>),
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
        }
    }
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
}
