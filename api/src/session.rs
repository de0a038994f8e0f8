//! `/api/v1/session`: the dashboard's sign-in.

use serde::{Deserialize, Serialize};

use crate::tokens::Role;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// An API token (`slc_...`) with the viewer, editor or admin role.
    pub token: String,
}

/// Who is signed in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionView {
    pub role: Role,
    pub token_name: String,
    pub token_id: String,
    /// When the session ends unless used (it slides with use); absent for a bearer token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}
