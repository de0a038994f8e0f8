//! Who the caller is, as other filters verified it, read from Envoy lazily: values in
//! dynamic metadata namespaces (verified JWT claims, ext_authz, Lua) and the TLS peer
//! certificate's fields.
//!
//! Each value a rule names is one property read (a host call), made when a rule first
//! reads its namespace and at most once per request, however many rules read it. Rules
//! that read none of these cost nothing here (the lists are empty: no allocation).

use std::cell::OnceCell;

use proxy_wasm::hostcalls;
use sluice_core::identity::{
    MAX_METADATA_BYTES, MetadataValue, metadata_property, metadata_tree, peer_certificate_property,
};
use sluice_core::request::{Identity, RequestNeeds};
use sluice_core::spec::PeerCertificateField;
use smallvec::SmallVec;

/// One request's identity attributes, each fetched from the host on first use.
#[derive(Debug)]
pub struct LazyIdentity<'n> {
    /// The namespaces the rules read, each built from the values they name, by index of
    /// the namespace's first value in `needs.metadata`.
    metadata: SmallVec<[OnceCell<MetadataValue>; 1]>,
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

    /// A namespace the rules read, holding the values they name that the request has
    /// (text within `MAX_METADATA_BYTES`; others read as missing, and so does
    /// everything when the host refuses).
    pub fn metadata(&self, namespace: &str) -> Option<&MetadataValue> {
        let index = self
            .needs
            .metadata
            .iter()
            .position(|(n, _)| n == namespace)?;
        let tree = self.metadata.get(index)?.get_or_init(|| {
            let values = self
                .needs
                .metadata
                .iter()
                .filter(|(n, _)| n == namespace)
                .filter_map(|(_, path)| Some((path.as_slice(), read_text(namespace, path)?)));
            metadata_tree(values)
        });
        Some(tree)
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
        let mut namespaces: Vec<&str> = Vec::new();
        for (n, _) in &self.needs.metadata {
            if !namespaces.contains(&n.as_str()) {
                namespaces.push(n);
            }
        }
        Identity {
            metadata: namespaces
                .into_iter()
                .filter_map(|n| Some((n.to_string(), self.metadata(n)?.clone())))
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

/// One metadata value as text: Envoy answers a string leaf with its bytes.
fn read_text(namespace: &str, path: &[String]) -> Option<String> {
    let bytes = hostcalls::get_property(metadata_property(namespace, path)).ok()??;
    if bytes.is_empty() || bytes.len() > MAX_METADATA_BYTES {
        return None;
    }
    String::from_utf8(bytes).ok()
}
