//! Authentication (a bearer token, or the dashboard's session cookie) and role checks.
//!
//! A handler states what it needs in its signature, `Auth<WriteRules>`, and the extractor
//! answers 401 or 403 before the request body is even read: a viewer posting a malformed
//! rule learns that it may not write, not what is wrong with the rule.
//!
//! Scripts send `Authorization: Bearer TOKEN`. The dashboard signs in once
//! (`POST /api/v1/session`) and then sends only its HttpOnly, SameSite=Strict session
//! cookie, which acts as the token that opened it. When both are sent, the header wins.

use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};

use std::time::Instant;

use super::body::{Peer, header_items};
use super::failed_auth::Credential;
use super::token_cache::Recalled;
use super::{ApiError, AppState};
use crate::store::{Actor, Role, StoreError, TokenInfo, hash_token, now_ms};
use crate::tls::OverTls;

/// The dashboard's session cookie.
pub(crate) const SESSION_COOKIE: &str = "sluice_session";

/// Something a role may or may not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permission {
    /// Rules, versions, diffs, export, audit log, proxies.
    Read,
    /// Create, change, delete, apply, roll back.
    WriteRules,
    /// `GET /api/v1/ruleset`: the proxies' long-poll.
    PollRuleset,
    /// Create, list and revoke tokens.
    ManageTokens,
    /// `POST /api/v1/reports`: a proxy's decision statistics.
    SendReports,
    /// `POST /api/v1/quota/sync`: a proxy's leases of global buckets.
    SyncQuota,
    /// Calls to Envoy's rate limit and quota services (`--rls-listen`).
    AskRateLimit,
}

impl Permission {
    /// Every permission, in declaration order.
    #[cfg(test)]
    const ALL: [Permission; 7] = [
        Permission::Read,
        Permission::WriteRules,
        Permission::PollRuleset,
        Permission::ManageTokens,
        Permission::SendReports,
        Permission::SyncQuota,
        Permission::AskRateLimit,
    ];

    /// What the permission allows, for 403 messages.
    fn describe(self) -> &'static str {
        match self {
            Permission::Read => "read rules, versions, audit, proxies or metrics",
            Permission::WriteRules => "change rules",
            Permission::PollRuleset => "poll the ruleset",
            Permission::ManageTokens => "manage tokens",
            Permission::SendReports => "send reports",
            Permission::SyncQuota => "sync global buckets",
            Permission::AskRateLimit => "call the rate limit or quota service",
        }
    }
}

impl Permission {
    /// A proxy's own requests, frequent and bound by its timeouts: their tokens are
    /// authenticated from memory ([`super::token_cache`]).
    fn proxys_own(self) -> bool {
        matches!(
            self,
            Permission::PollRuleset
                | Permission::SendReports
                | Permission::SyncQuota
                | Permission::AskRateLimit
        )
    }
}

/// The one place roles are mapped to permissions.
pub(crate) fn allows(role: Role, permission: Permission) -> bool {
    match role {
        Role::Admin => true,
        Role::Editor => !matches!(
            permission,
            Permission::ManageTokens
                | Permission::SendReports
                | Permission::SyncQuota
                | Permission::AskRateLimit
        ),
        Role::Viewer => matches!(permission, Permission::Read | Permission::PollRuleset),
        Role::Proxy => matches!(
            permission,
            Permission::PollRuleset
                | Permission::SendReports
                | Permission::SyncQuota
                | Permission::AskRateLimit
        ),
    }
}

/// A permission as a type, for [`Auth`].
pub(crate) trait Need: Send + Sync {
    const PERMISSION: Permission;
}

/// A type for each [`Permission`], named alike: `Auth<WriteRules>`.
macro_rules! needs {
    ($($permission:ident),*) => {
        $(
            #[doc = concat!("[`Permission::", stringify!($permission), "`] as a type.")]
            #[derive(Debug)]
            pub(crate) struct $permission;

            impl Need for $permission {
                const PERMISSION: Permission = Permission::$permission;
            }
        )*
    };
}

needs! { Read, WriteRules, PollRuleset, ManageTokens, SendReports, SyncQuota }

/// An authenticated caller whose role has permission `N`.
#[derive(Debug)]
pub(crate) struct Auth<N> {
    pub(crate) token: TokenInfo,
    need: PhantomData<N>,
}

impl<N> Auth<N> {
    /// The caller as the audit log names it.
    pub(crate) fn actor(&self) -> Actor {
        Actor {
            id: Some(self.token.id.clone()),
            name: self.token.name.clone(),
        }
    }
}

/// The token in `Authorization: Bearer TOKEN` (scheme case-insensitive, RFC 9110): an
/// HTTP request's headers, or a gRPC call's metadata.
pub(crate) fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(ApiError::Unauthenticated(
            "missing Authorization header: send `Authorization: Bearer TOKEN`",
        ))?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthenticated("the Authorization header is not valid ASCII"))?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::Unauthenticated(
        "the Authorization header must be `Bearer TOKEN`",
    ))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::Unauthenticated(
            "the Authorization header must be `Bearer TOKEN`",
        ));
    }
    Ok(token)
}

/// The value of the session cookie, if the request carries one.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    header_items(headers, header::COOKIE, ';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// A cookie is sent by the browser whoever made the page, so a change made with one must
/// come from the dashboard's own origin. SameSite=Strict already keeps other sites'
/// requests cookie-less in current browsers; this is the second line of defence, and it
/// fails closed: a change is accepted only when the browser says it is same-origin, with
/// `Sec-Fetch-Site: same-origin`, or with an `Origin` that is exactly this server's
/// scheme and host (browsers send `Origin` on every same-origin request that is not a GET
/// or HEAD). No `Origin` at all, another scheme on the right host, or any other
/// `Sec-Fetch-Site` (`same-site`, `cross-site`, `none`) is refused.
fn check_same_origin(parts: &Parts) -> Result<(), ApiError> {
    if matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let value = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let same = match value(SEC_FETCH_SITE) {
        Some(site) => site.eq_ignore_ascii_case("same-origin"),
        None => match (value(header::ORIGIN.as_str()), value(header::HOST.as_str())) {
            (Some(origin), Some(host)) => {
                let tls = parts.extensions.get::<OverTls>().is_some();
                let scheme = if over_https(&parts.headers, tls) {
                    "https"
                } else {
                    "http"
                };
                origin
                    .strip_prefix(scheme)
                    .and_then(|rest| rest.strip_prefix("://"))
                    .is_some_and(|o| o.eq_ignore_ascii_case(host))
            }
            _ => false,
        },
    };
    if same {
        Ok(())
    } else {
        Err(ApiError::Unauthenticated(
            "the session cookie changes things only from the dashboard's own origin (send \
             `Origin` with this server's scheme and host, or `Sec-Fetch-Site: same-origin`)",
        ))
    }
}

/// The fetch metadata header that says where a browser's request comes from.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// Whether the browser reached us over HTTPS: our own TLS (`over_tls`: `sluice serve
/// --tls-cert`), or a TLS-terminating proxy that says so.
pub(crate) fn over_https(headers: &HeaderMap, over_tls: bool) -> bool {
    over_tls
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// The active token behind a request for `permission`: its bearer token, or else its
/// session cookie.
pub(crate) async fn authenticate(
    parts: &Parts,
    state: &AppState,
    permission: Permission,
) -> Result<TokenInfo, ApiError> {
    let peer = Peer::of(parts);
    if parts.headers.contains_key(header::AUTHORIZATION) {
        let secret = bearer(&parts.headers)?;
        let found = if permission.proxys_own() {
            remembered(state, peer, secret).await?
        } else {
            looked_up(state, peer, secret).await?
        };
        return found.ok_or(ApiError::Unauthenticated("unknown or revoked token"));
    }
    let Some(session) = session_cookie(&parts.headers) else {
        return Err(ApiError::Unauthenticated(
            "missing Authorization header: send `Authorization: Bearer TOKEN` (or sign in to the dashboard)",
        ));
    };
    check_same_origin(parts)?;
    guarded(state, peer, Credential::Session, async {
        state.store().session(session, now_ms()).await
    })
    .await?
    .map(|s| s.token)
    .ok_or(ApiError::Unauthenticated(
        "the session has expired or was signed out: sign in again",
    ))
}

/// The active token with this secret, from the database.
async fn looked_up(
    state: &AppState,
    peer: Peer,
    secret: &str,
) -> Result<Option<TokenInfo>, ApiError> {
    guarded(state, peer, Credential::Bearer, async {
        state.store().authenticate(secret, now_ms()).await
    })
    .await
}

/// The active token with this secret, from memory where it is remembered (refreshed in
/// the background when due), else from the database, then remembered.
pub(crate) async fn remembered(
    state: &AppState,
    peer: Peer,
    secret: &str,
) -> Result<Option<TokenInfo>, ApiError> {
    let hash = hash_token(secret);
    match state.token_cache().recall(&hash, Instant::now()) {
        Recalled::Fresh(info) => Ok(Some(info)),
        Recalled::Refresh(info) => {
            let state = state.clone();
            let secret = secret.to_owned();
            tokio::spawn(async move {
                let found = state.store().authenticate(&secret, now_ms()).await;
                if let Err(err) = &found {
                    tracing::debug!(%err, "refreshing a remembered token failed");
                }
                state.token_cache().refreshed(&hash, found, Instant::now());
            });
            Ok(Some(info))
        }
        Recalled::Unknown => {
            let found = looked_up(state, peer, secret).await?;
            if let Some(info) = &found {
                state
                    .token_cache()
                    .remember(&hash, info.clone(), Instant::now());
            }
            Ok(found)
        }
    }
}

/// Looks a presented secret up behind the failed-authentication limit (see
/// [`super::failed_auth`]). A secret that finds something is accepted whatever its
/// address's failures: only failures are throttled, so an attacker sharing an address (a
/// NAT, a load balancer) with the proxies cannot lock them out. A secret that finds nothing
/// (`None`) is answered 429 while `peer`'s failures are spent, and otherwise spends one;
/// the failures are logged, a few lines a minute at most, with a count of the rest.
pub(crate) async fn guarded<T>(
    state: &AppState,
    peer: Peer,
    credential: Credential,
    lookup: impl Future<Output = Result<Option<T>, StoreError>>,
) -> Result<Option<T>, ApiError> {
    let found = lookup.await?;
    if found.is_some() {
        return Ok(found);
    }
    let limiter = state.failed_auths();
    let now = limiter.now_ns(Instant::now());
    if let Err(retry_after) = limiter.check(peer.ip(), now) {
        tracing::debug!(peer = ?peer.0, ?credential, "authentication throttled");
        return Err(ApiError::TooManyFailures { retry_after });
    }
    limiter.failed(peer.ip(), credential, now);
    if let Some(unlogged) = limiter.log_slot(now) {
        tracing::warn!(
            peer = ?peer.0,
            ?credential,
            unlogged_since_last_line = unlogged,
            "authentication failed: unknown, revoked or expired secret"
        );
    }
    Ok(found)
}

impl<N: Need> FromRequestParts<AppState> for Auth<N> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = authenticate(parts, state, N::PERMISSION).await?;
        if !allows(token.role, N::PERMISSION) {
            return Err(ApiError::Forbidden {
                role: token.role,
                action: N::PERMISSION.describe(),
            });
        }
        Ok(Auth {
            token,
            need: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_matrix() {
        let table = [
            (Role::Admin, [true, true, true, true, true, true, true]),
            (Role::Editor, [true, true, true, false, false, false, false]),
            (
                Role::Viewer,
                [true, false, true, false, false, false, false],
            ),
            (Role::Proxy, [false, false, true, false, true, true, true]),
        ];
        for (role, expected) in table {
            let got = Permission::ALL.map(|p| allows(role, p));
            assert_eq!(got, expected, "{role}");
        }
    }
}
