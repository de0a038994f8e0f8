//! The request as the core sees it, read from Envoy lazily.
//!
//! Every header read is a host call, and reading all headers at once costs a map
//! serialisation and an allocation per header. The ruleset knows in advance which
//! attributes its rules can look at ([`RequestNeeds`]); this reads each of those at most
//! once, and only when a rule actually asks (a rule that does not match never reads its
//! key header).

use std::cell::OnceCell;
use std::net::IpAddr;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MapType;
use sluice_core::identity::MetadataValue;
use sluice_core::request::{HttpRequest, RequestAttributes, RequestNeeds, parse_socket_ip};
use sluice_core::spec::PeerCertificateField;
use sluice_core::tokens::BodyFacts;
use smallvec::SmallVec;

use crate::identity::LazyIdentity;

/// One request's attributes, each fetched from the host on first use.
#[derive(Debug)]
pub struct LazyRequest<'n> {
    method: OnceCell<String>,
    authority: OnceCell<String>,
    path: OnceCell<String>,
    peer_ip: OnceCell<Option<IpAddr>>,
    /// Values of the headers in `needs.headers`, by index (inline for a few: no
    /// allocation per request).
    headers: SmallVec<[OnceCell<Option<String>>; 4]>,
    needs: &'n RequestNeeds,
    /// What the body said, when it was read before deciding (token budgets).
    body: Option<BodyFacts>,
    /// Dynamic metadata and peer certificate fields.
    identity: LazyIdentity<'n>,
}

impl<'n> LazyRequest<'n> {
    pub fn new(needs: &'n RequestNeeds) -> Self {
        LazyRequest {
            method: OnceCell::new(),
            authority: OnceCell::new(),
            path: OnceCell::new(),
            peer_ip: OnceCell::new(),
            headers: needs.headers.iter().map(|_| OnceCell::new()).collect(),
            needs,
            body: None,
            identity: LazyIdentity::new(needs),
        }
    }

    /// The request with what its body said.
    pub fn with_body(mut self, facts: Option<BodyFacts>) -> Self {
        self.body = facts;
        self
    }

    /// Everything the ruleset can read, read now, as an owned request: for a decision
    /// taken later, in a body callback, where Envoy no longer hands out request headers.
    pub fn snapshot(&self) -> HttpRequest {
        let headers = self
            .needs
            .headers
            .iter()
            .filter_map(|name| Some((name.clone(), self.header(name)?.to_string())))
            .collect();
        HttpRequest {
            method: self.method().to_string(),
            authority: self.authority().to_string(),
            path: self.path().to_string(),
            headers,
            peer_ip: if self.needs.peer_ip {
                self.peer_ip()
            } else {
                None
            },
            identity: self.identity.snapshot(),
        }
    }
}

/// A request header's value; absent on host errors too (the request then simply does
/// not match, or has no key, which fails open).
fn read_header(name: &str) -> Option<String> {
    let bytes = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).ok()??;
    // Header values may carry arbitrary bytes (obs-text); matching and keys work on text,
    // so invalid UTF-8 is replaced rather than trusted or panicked on.
    Some(
        String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

impl RequestAttributes for LazyRequest<'_> {
    fn method(&self) -> &str {
        self.method
            .get_or_init(|| read_header(":method").unwrap_or_default())
    }

    fn authority(&self) -> &str {
        self.authority
            .get_or_init(|| read_header(":authority").unwrap_or_default())
    }

    fn path(&self) -> &str {
        self.path
            .get_or_init(|| read_header(":path").unwrap_or_default())
    }

    fn header(&self, name: &str) -> Option<&str> {
        // The ruleset listed every header name its rules use, so a miss here is a name no
        // rule reads.
        let index = self.needs.headers.iter().position(|h| h == name)?;
        self.headers
            .get(index)?
            .get_or_init(|| read_header(name))
            .as_deref()
    }

    fn body_facts(&self) -> Option<BodyFacts> {
        self.body
    }

    fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        self.identity.metadata(namespace)
    }

    fn peer_certificate(&self, field: PeerCertificateField) -> Option<&str> {
        self.identity.peer_certificate(field)
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        *self.peer_ip.get_or_init(|| {
            let bytes = hostcalls::get_property(vec!["source", "address"]).ok()??;
            std::str::from_utf8(&bytes).ok().and_then(parse_socket_ip)
        })
    }
}
