//! Who the caller is, as other filters verified it, read from Envoy lazily: dynamic
//! metadata namespaces (verified JWT claims, ext_authz, Lua) and the TLS peer
//! certificate's fields.
//!
//! Each is one property read (a host call), made only when a rule asks and at most once
//! per request, however many rules read it: the claims of one token are one read. Rules
//! that read none of these cost nothing here (the lists are empty: no allocation).

use std::cell::OnceCell;

use proxy_wasm::hostcalls;
use sluice_core::identity::{MetadataValue, metadata_property, peer_certificate_property};
use sluice_core::request::{Identity, RequestNeeds};
use sluice_core::spec::PeerCertificateField;
use smallvec::SmallVec;

/// One request's identity attributes, each fetched from the host on first use.
#[derive(Debug)]
pub struct LazyIdentity<'n> {
    /// Decoded namespaces, by index in `needs.metadata`.
    metadata: SmallVec<[OnceCell<Option<MetadataValue>>; 1]>,
    /// Certificate fields, by index in `needs.peer_certificate`.
    peer_certificate: SmallVec<[OnceCell<Option<String>>; 1]>,
    needs: &'n RequestNeeds,
}

impl<'n> LazyIdentity<'n> {
    pub fn new(needs: &'n RequestNeeds) -> Self {
        LazyIdentity {
            metadata: needs.metadata.iter().map(|_| OnceCell::new()).collect(),
            peer_certificate: needs
                .peer_certificate
                .iter()
                .map(|_| OnceCell::new())
                .collect(),
            needs,
        }
    }

    /// A namespace the rules read, decoded; `None` when the request has none, it is
    /// larger than the core decodes, or the host refused (the key is then missing).
    pub fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        let index = self.needs.metadata.iter().position(|n| n == namespace)?;
        self.metadata
            .get(index)?
            .get_or_init(|| {
                let bytes =
                    hostcalls::get_property(metadata_property(namespace).to_vec()).ok()??;
                MetadataValue::decode_struct(&bytes)
            })
            .as_ref()
    }

    pub fn peer_certificate(&self, field: PeerCertificateField) -> Option<&str> {
        let index = self
            .needs
            .peer_certificate
            .iter()
            .position(|f| *f == field)?;
        self.peer_certificate
            .get(index)?
            .get_or_init(|| {
                let bytes =
                    hostcalls::get_property(peer_certificate_property(field).to_vec()).ok()??;
                String::from_utf8(bytes).ok()
            })
            .as_deref()
    }

    /// Everything the rules can read, read now, owned (see `LazyRequest::snapshot`).
    pub fn snapshot(&self) -> Identity {
        Identity {
            metadata: self
                .needs
                .metadata
                .iter()
                .filter_map(|n| Some((n.clone(), self.metadata(n)?.clone())))
                .collect(),
            peer_certificate: self
                .needs
                .peer_certificate
                .iter()
                .filter_map(|f| Some((*f, self.peer_certificate(*f)?.to_string())))
                .collect(),
        }
    }
}
