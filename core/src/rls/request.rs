//! What Envoy asks in one `ShouldRateLimit` call, and the bounds it is held to before
//! any rule or bucket is looked at.

use super::{MAX_DESCRIPTORS, MAX_DOMAIN_LEN, MAX_ENTRIES, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::rule::MAX_COST;

/// One `RateLimitRequest`, as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsRequest {
    pub domain: String,
    pub descriptors: Vec<RlsDescriptor>,
    /// The request's `hits_addend`: tokens each descriptor costs (Envoy's 0 means 1).
    pub hits_addend: u64,
}

/// One descriptor of a request: its entries in order, and its own `hits_addend` when set
/// (it then replaces the request's; 0 checks the limits without taking a token).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsDescriptor {
    pub entries: Vec<(String, String)>,
    pub hits_addend: Option<u64>,
}

/// Why a request was refused whole (gRPC `INVALID_ARGUMENT`): the field and the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> Result<(), RequestError> {
    Err(RequestError {
        field: field.into(),
        message: message.into(),
    })
}

fn too_long(s: &str, max: usize) -> bool {
    s.len() > max * 4 || s.chars().count() > max
}

impl RlsRequest {
    /// Checks every bound; the first one broken is named.
    pub fn check(&self) -> Result<(), RequestError> {
        if self.domain.is_empty() || too_long(&self.domain, MAX_DOMAIN_LEN) {
            return refuse(
                "domain",
                format!("must be 1 to {MAX_DOMAIN_LEN} characters"),
            );
        }
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return refuse(
                "descriptors",
                format!("at most {MAX_DESCRIPTORS} descriptors per request"),
            );
        }
        if self.hits_addend > MAX_COST {
            return refuse("hits_addend", format!("must be at most {MAX_COST}"));
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
                return refuse(
                    format!("descriptors[{i}].entries"),
                    format!("must have 1 to {MAX_ENTRIES} entries"),
                );
            }
            if d.hits_addend.is_some_and(|h| h > MAX_COST) {
                return refuse(
                    format!("descriptors[{i}].hits_addend"),
                    format!("must be at most {MAX_COST}"),
                );
            }
            for (j, (key, value)) in d.entries.iter().enumerate() {
                if key.is_empty() || too_long(key, MAX_KEY_LEN) {
                    return refuse(
                        format!("descriptors[{i}].entries[{j}].key"),
                        format!("must be 1 to {MAX_KEY_LEN} characters"),
                    );
                }
                if too_long(value, MAX_VALUE_LEN) {
                    return refuse(
                        format!("descriptors[{i}].entries[{j}].value"),
                        format!("must be at most {MAX_VALUE_LEN} characters"),
                    );
                }
            }
        }
        Ok(())
    }
}

impl RlsDescriptor {
    /// Tokens this descriptor costs in a request whose `hits_addend` is `request_hits`.
    pub fn cost(&self, request_hits: u64) -> u64 {
        self.hits_addend.unwrap_or(request_hits.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(entries: usize, descriptors: usize) -> RlsRequest {
        RlsRequest {
            domain: "edge".into(),
            descriptors: (0..descriptors)
                .map(|_| RlsDescriptor {
                    entries: (0..entries)
                        .map(|i| (format!("k{i}"), "v".into()))
                        .collect(),
                    hits_addend: None,
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn field(r: &RlsRequest) -> String {
        r.check().unwrap_err().field
    }

    #[test]
    fn requests_within_every_bound_pass() {
        request(MAX_ENTRIES, MAX_DESCRIPTORS).check().unwrap();
        request(1, 0).check().unwrap();
    }

    #[test]
    fn each_bound_refuses_one_past_it_naming_the_field() {
        assert_eq!(field(&request(1, MAX_DESCRIPTORS + 1)), "descriptors");
        assert_eq!(
            field(&request(MAX_ENTRIES + 1, 1)),
            "descriptors[0].entries"
        );
        assert_eq!(field(&request(0, 1)), "descriptors[0].entries");
        let mut r = request(1, 1);
        r.domain = "d".repeat(MAX_DOMAIN_LEN + 1);
        assert_eq!(field(&r), "domain");
        r.domain = String::new();
        assert_eq!(field(&r), "domain");
        let mut r = request(1, 1);
        r.descriptors[0].entries[0].0 = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(field(&r), "descriptors[0].entries[0].key");
        let mut r = request(1, 1);
        r.descriptors[0].entries[0].1 = "é".repeat(MAX_VALUE_LEN + 1);
        assert_eq!(field(&r), "descriptors[0].entries[0].value");
        let mut r = request(1, 1);
        r.hits_addend = MAX_COST + 1;
        assert_eq!(field(&r), "hits_addend");
        let mut r = request(1, 1);
        r.descriptors[0].hits_addend = Some(MAX_COST + 1);
        assert_eq!(field(&r), "descriptors[0].hits_addend");
    }

    #[test]
    fn hits_addend_zero_is_one_and_a_descriptors_own_replaces_it() {
        let d = RlsDescriptor::default();
        assert_eq!(d.cost(0), 1);
        assert_eq!(d.cost(5), 5);
        let own = RlsDescriptor {
            hits_addend: Some(0),
            ..RlsDescriptor::default()
        };
        assert_eq!(own.cost(5), 0);
    }
}
