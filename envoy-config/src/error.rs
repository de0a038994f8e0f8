//! Why no bootstrap was produced, and the core's refusals as field errors.

use std::path::PathBuf;

use sluice_core::config::ConfigError;
use sluice_core::validation::{FieldError, ValidationErrors};

/// Why no bootstrap was produced.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyConfigError {
    #[error("the filter path {} is not absolute", .0.display())]
    RelativeFilterPath(PathBuf),
    #[error("the filter configuration is invalid: {0}")]
    InvalidFilterConfig(ValidationErrors),
    #[error("the admin API connection is invalid: {0}")]
    InvalidControlConfig(ValidationErrors),
    #[error(
        "refusing to send the proxy token in clear text to {0}, which is not a loopback \
         address: use an https:// admin URL, or pass --insecure to accept plain HTTP on a \
         network you trust"
    )]
    PlainHttpToRemote(String),
    #[error(
        "refusing to send the proxy token (--rls-token) in clear text to the rate limit \
         service at {0}, which is not a loopback address: give --rls-ca to speak TLS to it \
         (`sluice serve --tls-cert`), or pass --rls-insecure on a network you trust (or one \
         a service mesh encrypts)"
    )]
    PlainRlsTokenToRemote(std::net::SocketAddr),
    #[error(
        "{0}: an https:// admin URL needs --admin-ca FILE, the PEM CA certificates Envoy \
         checks the admin API's certificate against (for a publicly trusted certificate, \
         the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt); without one Envoy \
         would accept any certificate"
    )]
    AdminCaMissing(String),
    #[error(
        "{0}: --admin-ca, --admin-sni and --admin-client-cert/--admin-client-key apply only \
         to an https:// admin URL"
    )]
    AdminTlsWithoutHttps(String),
    #[error("the TLS file path {} is not absolute", .0.display())]
    RelativeTlsPath(PathBuf),
    #[error(
        "the admin URLs {0} and {1} differ in scheme: replicas of one admin API are all \
         http:// or all https://"
    )]
    MixedAdminSchemes(String, String),
    #[error("{0}")]
    InvalidRlqs(String),
    #[error("cannot serialise the bootstrap: {0}")]
    Serialise(String),
}

/// A configuration refused by the core, as field errors: shape errors (only parsing makes
/// them) become one field error, so every refusal names where it is.
pub(crate) fn field_errors(error: ConfigError) -> ValidationErrors {
    match error {
        ConfigError::Invalid(errors) => errors,
        ConfigError::Shape { path, message } => ValidationErrors(vec![FieldError {
            field: path,
            message,
        }]),
    }
}
