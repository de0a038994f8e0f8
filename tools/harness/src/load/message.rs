//! What the load generator sends and, when asked to keep them, what comes back.

use hyper::Method;
use hyper::body::Bytes;
use serde_json::Value;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    pub method: Method,
    /// Path and query, e.g. `/api/items?page=2`.
    pub path: String,
    /// Sent as given; `host` is added (the target's address) unless present.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Req {
    pub fn new(method: Method, path: impl Into<String>) -> Req {
        Req {
            method,
            path: path.into(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    pub fn get(path: impl Into<String>) -> Req {
        Req::new(Method::GET, path)
    }

    pub fn post(path: impl Into<String>, body: impl Into<Bytes>) -> Req {
        Req {
            body: body.into(),
            ..Req::new(Method::POST, path)
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// One response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    pub status: u16,
    /// In arrival order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, decoded as UTF-8 (lossily).
    pub body: String,
}

impl Resp {
    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as JSON; panics (showing the body) if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("response body is not JSON ({err}): {}", self.body))
    }

    /// For the echo upstream ([`crate::upstream`]): a header of the request as the upstream
    /// received it.
    pub fn upstream_header(&self, name: &str) -> Option<String> {
        self.json()["headers"][name.to_ascii_lowercase()]
            .as_str()
            .map(str::to_string)
    }
}
