//! `/api/v1/tokens`: API tokens and what each may do.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including tokens.
    Admin,
    /// Rules, versions and rollbacks; reads everything but tokens.
    Editor,
    /// Reads rules, versions, audit, proxies.
    Viewer,
    /// Only `GET /api/v1/ruleset` (and later reports): what an Envoy holds.
    Proxy,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Editor, Role::Viewer, Role::Proxy];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Editor => "editor",
            Role::Viewer => "viewer",
            Role::Proxy => "proxy",
        }
    }

    /// Whether the role may change rules (the dashboard shows its edit controls).
    pub fn can_edit_rules(self) -> bool {
        matches!(self, Role::Admin | Role::Editor)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not a role: use admin, editor, viewer or proxy"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: String,
    pub created_by: String,
    pub last_used_at: Option<String>,
    /// Set once revoked; a revoked token is refused with 401.
    pub revoked_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Who or what holds it, e.g. `ci-deploy` or `envoy-eu-1`: 1 to 128 characters, not
    /// all blank, without control characters.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = r"^[^\x00-\x1F\x7F-\x9F]*[^\s\x00-\x1F\x7F-\x9F][^\x00-\x1F\x7F-\x9F]*$"
        )
    )]
    pub name: String,
    pub role: Role,
}

/// A new token. `token` is the secret: it is shown this once and cannot be recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: TokenView,
}
