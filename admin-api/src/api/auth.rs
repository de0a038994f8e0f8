//! Bearer-token authentication and role checks.
//!
//! A handler states what it needs in its signature, `Auth<WriteRules>`, and the extractor
//! answers 401 or 403 before the request body is even read: a viewer posting a malformed
//! rule learns that it may not write, not what is wrong with the rule.

use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::{ApiError, AppState};
use crate::store::{Actor, Role, TokenInfo};

/// Something a role may or may not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Rules, versions, diffs, export, audit log, proxies.
    Read,
    /// Create, change, delete, apply, roll back.
    WriteRules,
    /// `GET /api/v1/ruleset`: the proxies' long-poll.
    PollRuleset,
    /// Create, list and revoke tokens.
    ManageTokens,
}

impl Permission {
    /// What the permission allows, for 403 messages.
    fn describe(self) -> &'static str {
        match self {
            Permission::Read => "read rules, versions, audit or proxies",
            Permission::WriteRules => "change rules",
            Permission::PollRuleset => "poll the ruleset",
            Permission::ManageTokens => "manage tokens",
        }
    }
}

/// The one place roles are mapped to permissions.
pub fn allows(role: Role, permission: Permission) -> bool {
    match role {
        Role::Admin => true,
        Role::Editor => permission != Permission::ManageTokens,
        Role::Viewer => matches!(permission, Permission::Read | Permission::PollRuleset),
        Role::Proxy => permission == Permission::PollRuleset,
    }
}

/// A permission as a type, for [`Auth`].
pub trait Need: Send + Sync {
    const PERMISSION: Permission;
}

#[derive(Debug)]
pub struct Read;
#[derive(Debug)]
pub struct WriteRules;
#[derive(Debug)]
pub struct PollRuleset;
#[derive(Debug)]
pub struct ManageTokens;

impl Need for Read {
    const PERMISSION: Permission = Permission::Read;
}
impl Need for WriteRules {
    const PERMISSION: Permission = Permission::WriteRules;
}
impl Need for PollRuleset {
    const PERMISSION: Permission = Permission::PollRuleset;
}
impl Need for ManageTokens {
    const PERMISSION: Permission = Permission::ManageTokens;
}

/// An authenticated caller whose role has permission `N`.
#[derive(Debug)]
pub struct Auth<N> {
    pub token: TokenInfo,
    need: PhantomData<N>,
}

impl<N> Auth<N> {
    /// The caller as the audit log names it.
    pub fn actor(&self) -> Actor {
        Actor {
            id: Some(self.token.id.clone()),
            name: self.token.name.clone(),
        }
    }
}

/// The token in `Authorization: Bearer TOKEN` (scheme case-insensitive, RFC 9110).
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
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

impl<N: Need> FromRequestParts<AppState> for Auth<N> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secret = bearer(parts)?;
        let token = state
            .store()
            .authenticate(secret)
            .await?
            .ok_or(ApiError::Unauthenticated("unknown or revoked token"))?;
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
        use Permission::*;
        let table = [
            (Role::Admin, [true, true, true, true]),
            (Role::Editor, [true, true, true, false]),
            (Role::Viewer, [true, false, true, false]),
            (Role::Proxy, [false, false, true, false]),
        ];
        for (role, expected) in table {
            let got = [Read, WriteRules, PollRuleset, ManageTokens].map(|p| allows(role, p));
            assert_eq!(got, expected, "{role}");
        }
    }
}
