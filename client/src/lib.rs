//! The command line's client for a running admin API (`sluice rules apply|export`): http
//! or https (rustls, trusting the system's roots and optionally a CA file), bearer token,
//! problem documents turned into readable errors.

use std::path::Path;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use sluice_api::{ChangeSummary, Problem};

use sluice_rules_file::RulesFormat;

/// Why a call to the API failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("`{0}` is not an http:// or https:// URL")]
    BadUrl(String),
    #[error("--ca {path}: {message}")]
    BadCa { path: String, message: String },
    #[error("cannot reach the admin API at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The API refused the request; `message` is the problem's detail and field errors.
    #[error("{status}: {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from the admin API: {0}")]
    Unexpected(String),
}

impl ClientError {
    /// Whether the user's input (the file, the token) is what to fix.
    pub fn is_client_error(&self) -> bool {
        match self {
            ClientError::Refused { status, .. } => (400..500).contains(status),
            ClientError::BadUrl(_) | ClientError::BadCa { .. } => true,
            ClientError::Unreachable { .. } | ClientError::Unexpected(_) => false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client of the API at `url`; `ca`: a PEM file of CA certificates trusted besides
    /// the system's, for a server whose certificate a private CA issued.
    pub fn new(url: &str, token: &str, ca: Option<&Path>) -> Result<ApiClient, ClientError> {
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(ClientError::BadUrl(url.to_string()));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            // rustls even if another TLS backend is ever compiled in: --ca is read for it.
            .use_rustls_tls();
        if let Some(path) = ca {
            let bad = |message: String| ClientError::BadCa {
                path: path.display().to_string(),
                message,
            };
            let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            let certificates =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(e.to_string()))?;
            if certificates.is_empty() {
                return Err(bad("no PEM certificate in it".to_string()));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Unexpected(e.to_string()))?;
        Ok(ApiClient {
            base: url.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http,
        })
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = request
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: self.base.clone(),
                source,
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        Err(ClientError::Refused {
            status,
            message: describe_problem(&body),
        })
    }

    /// `POST /api/v1/rules:apply` with a rules file; returns the change summary.
    pub async fn apply(
        &self,
        file: String,
        format: RulesFormat,
        prune: bool,
        dry_run: bool,
    ) -> Result<ChangeSummary, ClientError> {
        let content_type = match format {
            RulesFormat::Json => "application/json",
            RulesFormat::Yaml => "application/yaml",
        };
        let url = format!(
            "{}/api/v1/rules:apply?prune={prune}&dry_run={dry_run}",
            self.base
        );
        let response = self
            .send(
                self.http
                    .post(url)
                    .header(CONTENT_TYPE, content_type)
                    .body(file),
            )
            .await?;
        response
            .json()
            .await
            .map_err(|e| ClientError::Unexpected(e.to_string()))
    }

    /// `GET /api/v1/export` as YAML or JSON text.
    pub async fn export(&self, format: RulesFormat) -> Result<String, ClientError> {
        let accept = match format {
            RulesFormat::Json => "application/json",
            RulesFormat::Yaml => "application/yaml",
        };
        let response = self
            .send(
                self.http
                    .get(format!("{}/api/v1/export", self.base))
                    .header(ACCEPT, accept),
            )
            .await?;
        response
            .text()
            .await
            .map_err(|e| ClientError::Unexpected(e.to_string()))
    }
}

/// A problem document as lines a person reads (see [`Problem::describe`]); a body that
/// is no problem document, as it came.
pub fn describe_problem(body: &str) -> String {
    match serde_json::from_str::<Problem>(body) {
        Ok(problem) => problem.describe(),
        Err(_) => body.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_read_as_lines() {
        let body = r#"{"type":"urn:sluice:invalid","title":"Invalid rules","status":422,
            "detail":"2 problems found; nothing was changed",
            "errors":[{"field":"rules[0].limits[0].requests","message":"must be between 1 and 1000000000"},
                      {"field":"rules[1].name","message":"`a` is used by another rule"}]}"#;
        assert_eq!(
            describe_problem(body),
            "2 problems found; nothing was changed\n  rules[0].limits[0].requests: must be between 1 and 1000000000\n  rules[1].name: `a` is used by another rule"
        );
        assert_eq!(describe_problem("plain text\n"), "plain text");
    }

    #[test]
    fn http_and_https_urls_only() {
        assert!(ApiClient::new("ftp://x", "t", None).is_err());
        assert!(ApiClient::new("127.0.0.1:8080", "t", None).is_err());
        assert!(ApiClient::new("https://x", "t", None).is_ok());
        assert!(ApiClient::new("http://127.0.0.1:8080/", "t", None).is_ok());
    }

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let Err(err) = ApiClient::new("https://x", "t", Some(&missing)) else {
            panic!("a missing CA file was accepted");
        };
        assert!(err.to_string().starts_with("--ca "), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let Err(err) = ApiClient::new("https://x", "t", Some(&empty)) else {
            panic!("a CA file without certificates was accepted");
        };
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }
}
