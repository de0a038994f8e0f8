//! Validation errors: what every check at the edge reports, with the field it is about.
//!
//! Rules ([`crate::rule`]), rulesets ([`crate::ruleset`]) and configurations
//! ([`crate::config`]) all report through these types, and the admin API answers with
//! them, so an operator sees the same field paths (`rules[2].limits[0].requests`) whether a
//! rule came from the API, a file or the filter's configuration.

use std::fmt;

/// One problem with one field: `limits[0].requests`, `rules[2].name`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// Every problem found in a rule or ruleset. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

impl From<FieldError> for ValidationErrors {
    fn from(e: FieldError) -> Self {
        ValidationErrors(vec![e])
    }
}

/// Collects field errors under a path prefix while a spec is checked.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    errors: Vec<FieldError>,
}

impl Problems {
    pub(crate) fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Adds another set of errors with their fields prefixed by `prefix`.
    pub(crate) fn nest(&mut self, prefix: &str, inner: ValidationErrors) {
        for e in inner.0 {
            self.add(format!("{prefix}.{}", e.field), e.message);
        }
    }

    /// Adds errors whose fields are already complete paths; returns them unchanged for
    /// `map_err` chains.
    pub(crate) fn nest_top(&mut self, inner: ValidationErrors) -> ValidationErrors {
        self.errors.extend(inner.0.iter().cloned());
        inner
    }

    pub(crate) fn into_errors(self) -> ValidationErrors {
        ValidationErrors(self.errors)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub(crate) fn finish<T>(self, value: impl FnOnce() -> T) -> Result<T, ValidationErrors> {
        if self.errors.is_empty() {
            Ok(value())
        } else {
            Err(ValidationErrors(self.errors))
        }
    }
}

/// Whether `name` is a valid lowercase HTTP header name (RFC 9110 token characters), as
/// matchers, client keys and costs require.
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b))
}
