//! What the core needs to know about a request, and a plain owned implementation.
//!
//! The filter implements [`RequestAttributes`] over Envoy lazily (`filter/src/request.rs`
//! reads only what the rules ask for, each at most once); [`HttpRequest`] is the plain
//! owned implementation that tests, benchmarks and examples build directly. Header names
//! are lowercase, as HTTP/2 and Envoy present them.

use std::net::IpAddr;

use crate::identity::MetadataValue;
use crate::spec::PeerCertificateField;
use crate::tokens::BodyFacts;

/// The parts of a request that rules can look at.
pub trait RequestAttributes {
    fn method(&self) -> &str;
    /// The `:authority` (Host) as sent, possibly with a port.
    fn authority(&self) -> &str;
    /// The `:path`, including any query string.
    fn path(&self) -> &str;
    /// The first value of a header, by lowercase name.
    fn header(&self, name: &str) -> Option<&str>;
    /// The address of the TCP peer.
    fn peer_ip(&self) -> Option<IpAddr>;

    /// What the request body said, when the host read it before deciding (a rule with
    /// token limits reserves from it); `None` when it was not read.
    fn body_facts(&self) -> Option<BodyFacts> {
        None
    }

    /// One namespace of the request's dynamic metadata (what other filters verified),
    /// decoded; `None` when the request has none or the host did not read it.
    fn metadata(&self, _namespace: &str) -> Option<&MetadataValue> {
        None
    }

    /// A field of the TLS peer's certificate as Envoy verified it; `None` without mTLS.
    fn peer_certificate(&self, _field: PeerCertificateField) -> Option<&str> {
        None
    }

    /// The path without its query string.
    fn path_only(&self) -> &str {
        let path = self.path();
        path.split_once('?').map_or(path, |(p, _)| p)
    }

    /// The query string, without the `?`.
    fn query(&self) -> &str {
        self.path().split_once('?').map_or("", |(_, q)| q)
    }

    /// The host without a port, e.g. `api.example.com` for `api.example.com:8443`.
    fn host(&self) -> &str {
        strip_port(self.authority())
    }
}

fn strip_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]:8080`.
        return rest.split_once(']').map_or(authority, |(ip, _)| ip);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// A request held by value: pseudo-headers split out, other headers in arrival order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub authority: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub peer_ip: Option<IpAddr>,
    pub identity: Identity,
}

/// What other filters verified about the caller: dynamic metadata namespaces (decoded)
/// and TLS peer certificate fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub metadata: Vec<(String, MetadataValue)>,
    pub peer_certificate: Vec<(PeerCertificateField, String)>,
}

impl Identity {
    pub fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        self.metadata
            .iter()
            .find(|(n, _)| n == namespace)
            .map(|(_, v)| v)
    }

    pub fn peer_certificate(&self, field: PeerCertificateField) -> Option<&str> {
        self.peer_certificate
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }
}

impl HttpRequest {
    /// A `GET` for `path` on `localhost`, for tests and examples.
    pub fn get(path: &str) -> Self {
        Self {
            method: "GET".into(),
            authority: "localhost".into(),
            path: path.into(),
            ..Self::default()
        }
    }

    /// Adds a header (builder style).
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Builds a request from the header list Envoy hands a filter, where the
    /// pseudo-headers `:method`, `:authority` and `:path` come first.
    pub fn from_header_pairs(pairs: Vec<(String, String)>, peer_ip: Option<IpAddr>) -> Self {
        let mut request = HttpRequest {
            peer_ip,
            ..Self::default()
        };
        for (name, value) in pairs {
            match name.as_str() {
                ":method" => request.method = value,
                ":authority" => request.authority = value,
                ":path" => request.path = value,
                _ => request.headers.push((name, value)),
            }
        }
        request
    }
}

impl RequestAttributes for HttpRequest {
    fn method(&self) -> &str {
        &self.method
    }

    fn authority(&self) -> &str {
        &self.authority
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_ip
    }

    fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        self.identity.metadata(namespace)
    }

    fn peer_certificate(&self, field: PeerCertificateField) -> Option<&str> {
        self.identity.peer_certificate(field)
    }
}

/// A request with what its body said: the body-reading half of a host, for tests and
/// benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WithBody<R> {
    pub request: R,
    pub facts: BodyFacts,
}

impl<R: RequestAttributes> RequestAttributes for WithBody<R> {
    fn method(&self) -> &str {
        self.request.method()
    }

    fn authority(&self) -> &str {
        self.request.authority()
    }

    fn path(&self) -> &str {
        self.request.path()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.request.header(name)
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.request.peer_ip()
    }

    fn body_facts(&self) -> Option<BodyFacts> {
        Some(self.facts)
    }

    fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        self.request.metadata(namespace)
    }

    fn peer_certificate(&self, field: PeerCertificateField) -> Option<&str> {
        self.request.peer_certificate(field)
    }
}

/// What the rules of a ruleset can look at, so a host reads only that from a request
/// (each header read from Envoy is a host call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestNeeds {
    pub method: bool,
    pub authority: bool,
    pub path: bool,
    pub peer_ip: bool,
    /// Lowercase header names, without duplicates.
    pub headers: Vec<String>,
    /// Dynamic metadata values (namespace, path), without duplicates: each is one host
    /// call (a property read) per request that asks, so rules that read none cost nothing.
    pub metadata: Vec<(String, Vec<String>)>,
    /// Peer certificate fields, without duplicates; one property read each.
    pub peer_certificate: Vec<PeerCertificateField>,
}

impl RequestNeeds {
    pub(crate) fn header(&mut self, name: &str) {
        if !self.headers.iter().any(|h| h == name) {
            self.headers.push(name.to_string());
        }
    }

    pub(crate) fn metadata(&mut self, namespace: &str, path: &[String]) {
        if !self
            .metadata
            .iter()
            .any(|(n, p)| n == namespace && p == path)
        {
            self.metadata.push((namespace.to_string(), path.to_vec()));
        }
    }

    pub(crate) fn peer_certificate(&mut self, field: PeerCertificateField) {
        if !self.peer_certificate.contains(&field) {
            self.peer_certificate.push(field);
        }
    }
}

/// Parses Envoy's `source.address` property (`1.2.3.4:5678` or `[::1]:5678`).
pub fn parse_socket_ip(address: &str) -> Option<IpAddr> {
    if let Ok(ip) = address.parse() {
        return Some(ip);
    }
    address.parse::<std::net::SocketAddr>().ok().map(|s| s.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_drops_the_port_including_for_ipv6_literals() {
        let mut r = HttpRequest::get("/");
        for (authority, host) in [
            ("api.example.com:8443", "api.example.com"),
            ("api.example.com", "api.example.com"),
            ("[::1]:8080", "::1"),
            ("[::1]", "::1"),
        ] {
            r.authority = authority.into();
            assert_eq!(r.host(), host);
        }
    }

    #[test]
    fn path_and_query_are_split_at_the_first_question_mark() {
        let r = HttpRequest::get("/a/b?x=1&y=?");
        assert_eq!(r.path_only(), "/a/b");
        assert_eq!(r.query(), "x=1&y=?");
        assert_eq!(HttpRequest::get("/plain").query(), "");
    }

    #[test]
    fn socket_addresses_parse_with_or_without_ports() {
        assert_eq!(
            parse_socket_ip("10.0.0.1:443"),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(parse_socket_ip("[::1]:80"), Some("::1".parse().unwrap()));
        assert_eq!(parse_socket_ip("::1"), Some("::1".parse().unwrap()));
        assert_eq!(parse_socket_ip("garbage"), None);
    }
}
