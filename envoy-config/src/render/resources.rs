//! What every rendered document shares: [`Rendered`] (YAML documents under a comment
//! header), [`RenderError`], Kubernetes names, labels and metadata, the policy targets
//! (`--target-ref`) and the default filter image.

use std::fmt;
use std::str::FromStr;

use serde_json::{Value, json};
use sluice_core::validation::ValidationErrors;

use crate::error::EnvoyConfigError;
use crate::output::as_comments;

/// A registry on the machine that pushes the images (`docker-registry`, a kind or k3d
/// cluster's registry): the documented default until an image is pushed elsewhere.
pub(super) const DEFAULT_REGISTRY: &str = "localhost:5000/sluice";

/// The default filter image, `oci://localhost:5000/sluice/sluice-filter:VERSION`.
pub fn default_filter_image() -> String {
    format!(
        "oci://{DEFAULT_REGISTRY}/sluice-filter:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Why nothing was rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Envoy(#[from] EnvoyConfigError),
    #[error("the filter configuration is invalid: {0}")]
    InvalidFilterConfig(ValidationErrors),
    #[error("{0}: `{1}` is not a SHA-256 digest (64 lowercase hex digits)")]
    Sha256(&'static str, String),
    #[error("{0}: `{1}` is not a Kubernetes name (lowercase letters, digits and '-', at most 63)")]
    Name(&'static str, String),
    #[error("{0}")]
    Conflict(String),
    #[error("cannot serialise the resources: {0}")]
    Serialise(String),
}

/// A policy's target (`--target-ref KIND/NAME`), its API group known from its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    pub group: &'static str,
    pub kind: String,
    pub name: String,
}

pub(super) const GATEWAY_API: &str = "gateway.networking.k8s.io";

impl TargetRef {
    pub fn gateway(name: &str) -> TargetRef {
        TargetRef {
            group: GATEWAY_API,
            kind: "Gateway".to_string(),
            name: name.to_string(),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({ "group": self.group, "kind": self.kind, "name": self.name })
    }
}

impl FromStr for TargetRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s
            .split_once('/')
            .filter(|(_, name)| is_name(name))
            .ok_or_else(|| format!("`{s}` is not KIND/NAME, e.g. Gateway/eg"))?;
        let group = match kind {
            "Gateway" | "GatewayClass" | "HTTPRoute" | "GRPCRoute" => GATEWAY_API,
            "Service" => "",
            "ServiceEntry" => "networking.istio.io",
            _ => {
                return Err(format!(
                    "`{kind}` is not a kind Sluice can target: Gateway, GatewayClass, HTTPRoute, \
                     GRPCRoute, Service or ServiceEntry"
                ));
            }
        };
        Ok(TargetRef {
            group,
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Rendered resources: YAML documents under a comment header.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Comment lines without the `# ` marker.
    pub header: Vec<String>,
    pub resources: Vec<Value>,
}

impl Rendered {
    /// The resources as one multi-document YAML stream.
    pub fn to_yaml(&self) -> Result<String, RenderError> {
        let mut out = comment(&self.header);
        for (i, resource) in self.resources.iter().enumerate() {
            if i > 0 || !out.is_empty() {
                out.push_str("---\n");
            }
            out.push_str(&yaml(resource)?);
        }
        Ok(out)
    }
}

/// Comment lines, wrapped (see [`wrap`]), as YAML comments.
pub(super) fn comment(lines: &[String]) -> String {
    as_comments(&wrap(lines))
}

/// Comment lines broken between words at [`COMMENT_WIDTH`] columns, so a header reads
/// in a terminal; continuation lines are indented.
pub(super) fn wrap(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for line in lines {
        let mut current = String::new();
        for word in line.split(' ') {
            if !current.trim().is_empty() && current.len() + 1 + word.len() > COMMENT_WIDTH - 2 {
                out.push(std::mem::replace(&mut current, "  ".to_string()));
            } else if !current.trim().is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push(current);
    }
    out
}

/// The width of header comments, `# ` included.
const COMMENT_WIDTH: usize = 88;

pub(super) fn yaml(value: &Value) -> Result<String, RenderError> {
    serde_norway::to_string(value).map_err(|e| RenderError::Serialise(e.to_string()))
}

/// The labels every resource Sluice renders carries.
pub(super) fn labels(component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "sluice",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "sluice",
    })
}

pub(super) fn metadata(name: &str, namespace: &str, component: &str) -> Value {
    json!({ "name": name, "namespace": namespace, "labels": labels(component) })
}

/// A DNS-1123 label: what Kubernetes accepts as a name and namespace.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(super) fn check_name(what: &'static str, s: &str) -> Result<(), RenderError> {
    if is_name(s) {
        Ok(())
    } else {
        Err(RenderError::Name(what, s.to_string()))
    }
}

pub(super) fn check_sha256(what: &'static str, s: &str) -> Result<(), RenderError> {
    if s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(RenderError::Sha256(what, s.to_string()))
    }
}
