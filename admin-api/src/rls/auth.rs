//! Who may call the rate limit and quota services. With [`RlsAuth::Token`] every call
//! carries a token in its metadata (`authorization: Bearer TOKEN`, which Envoy sends from
//! the gRPC service's `initial_metadata`), checked as the HTTP API checks a proxy's: the
//! same token store, the same remembered tokens, and the same failed-authentication limit
//! per client address (`--auth-failures`). Client certificates (`--rls-client-ca`) are
//! checked by the listener's TLS handshake, before any call is read.
//!
//! The check runs before the call's message is converted or any rule is read: a refused
//! call charges nothing and learns nothing but its status.

use axum::http::header::AUTHORIZATION;

use crate::http::auth::{Permission, allows, bearer, remembered};
use crate::http::{ApiError, AppState, Peer, ReasonLabel};

/// What a caller of `--rls-listen` must show besides what TLS asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RlsAuth {
    /// A token with the `proxy` role (or `admin`) in every call.
    #[default]
    Token,
    /// Nothing: whoever reaches the address is answered (a listener only trusted peers
    /// reach, or one whose peers `--rls-client-ca` checks).
    None,
}

/// Whether `call` may be answered under `auth`; when not, the status to answer, counted
/// in `sluice_rls_unauthenticated_total{reason}`.
pub(crate) async fn check<T>(
    state: &AppState,
    auth: RlsAuth,
    call: &tonic::Request<T>,
) -> Result<(), tonic::Status> {
    if auth == RlsAuth::None {
        return Ok(());
    }
    let refuse = |reason: &'static str, status: tonic::Status| {
        state
            .rls_metrics()
            .unauthenticated
            .get_or_create(&ReasonLabel { reason })
            .inc();
        status
    };
    let metadata = call.metadata().as_ref();
    if !metadata.contains_key(AUTHORIZATION) {
        return Err(refuse(
            "missing_token",
            tonic::Status::unauthenticated(
                "missing authorization metadata: send `authorization: Bearer TOKEN` with a \
                 proxy token (Envoy: the gRPC service's initial_metadata)",
            ),
        ));
    }
    let secret = bearer(metadata)
        .map_err(|err| refuse("bad_token", tonic::Status::unauthenticated(err.to_string())))?;
    match remembered(state, Peer(call.remote_addr()), secret).await {
        Ok(Some(token)) if allows(token.role, Permission::AskRateLimit) => Ok(()),
        Ok(Some(token)) => Err(refuse(
            "wrong_role",
            tonic::Status::permission_denied(format!(
                "a token with role `{}` may not call the rate limit service: use a proxy token",
                token.role
            )),
        )),
        Ok(None) => Err(refuse(
            "bad_token",
            tonic::Status::unauthenticated("unknown or revoked token"),
        )),
        Err(ApiError::TooManyFailures { retry_after }) => Err(refuse(
            "throttled",
            tonic::Status::resource_exhausted(format!(
                "too many failed authentications from this address: retry in {} s",
                retry_after.as_secs().max(1)
            )),
        )),
        Err(err) => {
            tracing::warn!(%err, "rate limit service: the token store did not answer");
            Err(refuse(
                "unavailable",
                tonic::Status::unavailable("the token store did not answer"),
            ))
        }
    }
}
