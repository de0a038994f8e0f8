//! Proxy ids: one rule for every path that names a proxy, and each id tied to the token
//! that first used it.
//!
//! A proxy names itself in a sync's `proxy`, a report's `proxy_id` and the ruleset poll's
//! `x-sluice-proxy-id` header. All three take exactly [`sluice_core::report::is_proxy_id`]
//! (1 to 128 visible ASCII characters), so an id the API lists is one every path accepts.
//! A proxy token is shared by a whole fleet's configuration and leaks more easily than an
//! operator's; so that one token cannot speak for another token's proxies (nor spread its
//! traffic over unbounded ids), the first token to use an id owns it for the life of this
//! process, and one token may use at most [`MAX_IDS_PER_TOKEN`] ids. Admin tokens are
//! bound the same way. The claim lives in this process: after a restart, or on another
//! replica, the first token to use an id owns it there.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_core::report::{PROXY_ID_RULE, is_proxy_id};

use crate::store::{Role, TokenInfo};

/// Proxy ids one token may use by default: a large fleet behind one token, not an
/// unbounded set of made-up ids.
pub const MAX_IDS_PER_TOKEN: usize = 1_000;

/// Where a proxy named itself, for the metric's `path` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IdPath {
    Sync,
    Report,
    Ruleset,
}

/// Why an id was refused, for the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IdRefusal {
    /// Not 1 to 128 visible ASCII characters.
    Invalid,
    /// First used with another token.
    OtherToken,
    /// The token already uses [`MAX_IDS_PER_TOKEN`] ids.
    TooManyIds,
}

impl IdPath {
    fn as_str(self) -> &'static str {
        match self {
            IdPath::Sync => "sync",
            IdPath::Report => "report",
            IdPath::Ruleset => "ruleset",
        }
    }
}

impl IdRefusal {
    fn as_str(self) -> &'static str {
        match self {
            IdRefusal::Invalid => "invalid",
            IdRefusal::OtherToken => "other_token",
            IdRefusal::TooManyIds => "too_many_ids",
        }
    }

    /// What the client is told.
    pub(crate) fn message(self, id: &str) -> String {
        match self {
            IdRefusal::Invalid => format!("a proxy id {PROXY_ID_RULE}"),
            IdRefusal::OtherToken => {
                format!("the proxy id `{id}` is in use with another token")
            }
            IdRefusal::TooManyIds => {
                format!("this token already uses {MAX_IDS_PER_TOKEN} proxy ids")
            }
        }
    }
}

crate::pipeline::fixed_label_value!(IdPath, IdRefusal);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Labels {
    path: IdPath,
    reason: IdRefusal,
}

/// The ids this process has seen and their tokens.
#[derive(Debug)]
pub(crate) struct ProxyIds {
    inner: Mutex<Claims>,
    refused: Family<Labels, Counter>,
}

#[derive(Debug, Default)]
struct Claims {
    /// Token id by proxy id.
    owner: HashMap<String, String>,
    /// Proxy ids by token id.
    per_token: HashMap<String, usize>,
}

impl ProxyIds {
    pub(crate) fn new(registry: &mut Registry) -> ProxyIds {
        let refused = Family::<Labels, Counter>::default();
        registry.register(
            "sluice_admin_proxy_ids_refused",
            "Proxy ids refused, by where they were sent (sync, report, ruleset) and why (invalid, other_token, too_many_ids)",
            refused.clone(),
        );
        ProxyIds {
            inner: Mutex::new(Claims::default()),
            refused,
        }
    }

    /// Checks `id` as sent on `path` with `token`, claiming it for a proxy token if it is
    /// new; counts a refusal.
    pub(crate) fn claim(&self, path: IdPath, id: &str, token: &TokenInfo) -> Result<(), IdRefusal> {
        let result = if !is_proxy_id(id) {
            Err(IdRefusal::Invalid)
        } else if token.role == Role::Admin {
            Ok(())
        } else {
            self.try_claim(id, &token.id)
        };
        if let Err(reason) = result {
            self.refused.get_or_create(&Labels { path, reason }).inc();
        }
        result
    }

    fn try_claim(&self, id: &str, token_id: &str) -> Result<(), IdRefusal> {
        let mut claims = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match claims.owner.get(id) {
            Some(owner) if owner == token_id => Ok(()),
            Some(_) => Err(IdRefusal::OtherToken),
            None => {
                let used = claims.per_token.get(token_id).copied().unwrap_or(0);
                if used >= MAX_IDS_PER_TOKEN {
                    return Err(IdRefusal::TooManyIds);
                }
                claims.per_token.insert(token_id.to_string(), used + 1);
                claims.owner.insert(id.to_string(), token_id.to_string());
                Ok(())
            }
        }
    }
}
