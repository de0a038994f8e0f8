//! The body of every error answer: an RFC 9457 problem document.

use serde::{Deserialize, Serialize};

/// One problem with one field (`limits[0].requests`, `rules[2].name`): the core's, which
/// finds most of them.
pub use sluice_core::validation::FieldError;

/// An RFC 9457 problem document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URN naming the kind of problem, e.g. `urn:sluice:invalid`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// For `urn:sluice:invalid`: every problem found, by field path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

impl Problem {
    /// The problem as lines a person reads: the detail (or the title), then each field's
    /// problem.
    pub fn describe(&self) -> String {
        let mut message = if self.detail.is_empty() {
            self.title.clone()
        } else {
            self.detail.clone()
        };
        for error in &self.errors {
            message.push_str(&format!("\n  {}: {}", error.field, error.message));
        }
        message
    }
}
