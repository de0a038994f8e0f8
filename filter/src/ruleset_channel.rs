//! Rulesets pushed by the admin API, passed from the control service to every worker
//! through shared data.
//!
//! Two keys: `sluice.ruleset.doc` holds the encoded [`RulesetDocument`], and
//! `sluice.ruleset.version` its version as 8 little-endian bytes. The control service
//! writes the document first and the version second, so a worker that sees a new
//! version always finds a document at least that new. Workers poll only the small
//! version key on their tick and read the document when it changed.

use proxy_wasm::hostcalls;
use sluice_core::wire::RulesetDocument;

use crate::channel::ChannelError;

const DOC_KEY: &str = "sluice.ruleset.doc";
const VERSION_KEY: &str = "sluice.ruleset.version";

/// Publishes `doc` to every worker. Only the control service calls this.
pub fn publish(doc: &RulesetDocument) -> Result<(), ChannelError> {
    hostcalls::set_shared_data(DOC_KEY, Some(&doc.encode()), None)
        .map_err(ChannelError::host("publishing the ruleset document"))?;
    hostcalls::set_shared_data(VERSION_KEY, Some(&doc.version.to_le_bytes()), None)
        .map_err(ChannelError::host("publishing the ruleset version"))
}

/// The version of the published ruleset, `None` if none was published yet.
pub fn published_version() -> Result<Option<u64>, ChannelError> {
    let (bytes, _) = hostcalls::get_shared_data(VERSION_KEY)
        .map_err(ChannelError::host("reading the ruleset version"))?;
    Ok(bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(u64::from_le_bytes))
}

/// The published ruleset document.
pub fn published_document() -> Result<Option<RulesetDocument>, ChannelError> {
    let (bytes, _) = hostcalls::get_shared_data(DOC_KEY)
        .map_err(ChannelError::host("reading the ruleset document"))?;
    bytes
        .map(|b| RulesetDocument::decode(&b).map_err(ChannelError::Undecodable))
        .transpose()
}
