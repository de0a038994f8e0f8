//! Who the caller is, as other filters verified it: dynamic metadata (a JWT's claims from
//! `jwt_authn`'s `payload_in_metadata`, what ext_authz or Lua set) and the TLS peer's
//! certificate.
//!
//! The filter reads each metadata value a rule names with one property read
//! (`metadata.filter_metadata.NAMESPACE.PATH...`): Envoy 1.40 answers a string leaf with
//! its bytes, but a whole namespace (a map) with its own pairs encoding, which loses the
//! values' types. [`metadata_tree`] puts the values read into the tree the key sources
//! walk ([`MetadataValue::at`]). [`MetadataValue::decode_struct`] reads a serialized
//! `google.protobuf.Struct` (as older Envoys answer a namespace read), bounded: at most
//! [`MAX_METADATA_BYTES`] are parsed, and prost refuses nesting deeper than 100.

use std::collections::BTreeMap;

use crate::spec::PeerCertificateField;

/// The most bytes of one metadata namespace decoded per request; a larger namespace
/// reads as missing (and its keys follow the rule's `key_missing`).
pub const MAX_METADATA_BYTES: usize = 64 * 1024;
/// The most segments in a metadata path.
pub const MAX_METADATA_PATH: usize = 8;
/// The longest metadata namespace or path segment, in characters.
pub const MAX_METADATA_NAME: usize = 256;

/// A value found in dynamic metadata. Numbers and booleans are kept as the text a key
/// gets: an integral number without a fraction (`42`), others as Rust prints an `f64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataValue {
    Text(String),
    List(Vec<MetadataValue>),
    Object(BTreeMap<String, MetadataValue>),
    Null,
}

impl MetadataValue {
    /// Decodes a serialized `google.protobuf.Struct`; `None` for bytes over
    /// [`MAX_METADATA_BYTES`] or that are not one.
    pub fn decode_struct(bytes: &[u8]) -> Option<MetadataValue> {
        if bytes.len() > MAX_METADATA_BYTES {
            return None;
        }
        let decoded = <wire::Struct as prost::Message>::decode(bytes).ok()?;
        Some(decoded.into())
    }

    /// The value at `path` below this one: object fields by name, list items by index.
    pub fn at<'v>(&'v self, path: &[String]) -> Option<&'v MetadataValue> {
        path.iter().try_fold(self, |value, segment| match value {
            MetadataValue::Object(fields) => fields.get(segment),
            MetadataValue::List(items) => items.get(segment.parse::<usize>().ok()?),
            MetadataValue::Text(_) | MetadataValue::Null => None,
        })
    }

    /// The text a key gets from this value: text as it is, a list's texts joined with
    /// `,` (an array claim); `None` for an object, a null, or an empty list.
    pub fn key_text(&self) -> Option<std::borrow::Cow<'_, str>> {
        match self {
            MetadataValue::Text(text) => Some(std::borrow::Cow::Borrowed(text)),
            MetadataValue::List(items) => {
                let texts: Vec<&str> = items
                    .iter()
                    .filter_map(|i| match i {
                        MetadataValue::Text(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                (!texts.is_empty()).then(|| std::borrow::Cow::Owned(texts.join(",")))
            }
            MetadataValue::Object(_) | MetadataValue::Null => None,
        }
    }

    /// Whether this value is `expected`, or, for a list, holds it.
    pub fn equals(&self, expected: &str) -> bool {
        match self {
            MetadataValue::Text(text) => text == expected,
            MetadataValue::List(items) => items
                .iter()
                .any(|i| matches!(i, MetadataValue::Text(t) if t == expected)),
            MetadataValue::Object(_) | MetadataValue::Null => false,
        }
    }
}

/// The Envoy property path that reads one value of a metadata namespace. Envoy 1.40
/// answers a string leaf with its bytes (a map, as pairs of its own encoding), so the
/// filter reads each value a rule names rather than the whole namespace.
pub fn metadata_property<'a>(namespace: &'a str, path: &'a [String]) -> Vec<&'a str> {
    let mut property = vec!["metadata", "filter_metadata", namespace];
    property.extend(path.iter().map(String::as_str));
    property
}

/// The namespace holding `values` (each a path and its text) as the tree keys walk.
pub fn metadata_tree<'p>(
    values: impl IntoIterator<Item = (&'p [String], String)>,
) -> MetadataValue {
    let mut root = MetadataValue::Object(BTreeMap::new());
    for (path, text) in values {
        let mut node = &mut root;
        for segment in path {
            let MetadataValue::Object(fields) = node else {
                break;
            };
            node = fields
                .entry(segment.clone())
                .or_insert_with(|| MetadataValue::Object(BTreeMap::new()));
        }
        if matches!(node, MetadataValue::Object(f) if f.is_empty()) {
            *node = MetadataValue::Text(text);
        }
    }
    root
}

/// The Envoy property path (attribute) of a peer certificate field.
pub fn peer_certificate_property(field: PeerCertificateField) -> [&'static str; 2] {
    let name = match field {
        PeerCertificateField::UriSan => "uri_san_peer_certificate",
        PeerCertificateField::DnsSan => "dns_san_peer_certificate",
        PeerCertificateField::Subject => "subject_peer_certificate",
    };
    ["connection", name]
}

/// `google.protobuf.Struct` and `Value`, as prost decodes them (the field numbers of
/// `google/protobuf/struct.proto`).
mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Struct {
        #[prost(btree_map = "string, message", tag = "1")]
        pub fields: std::collections::BTreeMap<String, Value>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListValue {
        #[prost(message, repeated, tag = "1")]
        pub values: Vec<Value>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(int32, tag = "1")]
        Null(i32),
        #[prost(double, tag = "2")]
        Number(f64),
        #[prost(string, tag = "3")]
        Text(String),
        #[prost(bool, tag = "4")]
        Bool(bool),
        #[prost(message, tag = "5")]
        Struct(Struct),
        #[prost(message, tag = "6")]
        List(ListValue),
    }
}

impl From<wire::Struct> for MetadataValue {
    fn from(s: wire::Struct) -> Self {
        MetadataValue::Object(s.fields.into_iter().map(|(k, v)| (k, v.into())).collect())
    }
}

impl From<wire::Value> for MetadataValue {
    fn from(v: wire::Value) -> Self {
        match v.kind {
            None | Some(wire::Kind::Null(_)) => MetadataValue::Null,
            Some(wire::Kind::Number(n)) => MetadataValue::Text(number_text(n)),
            Some(wire::Kind::Text(t)) => MetadataValue::Text(t),
            Some(wire::Kind::Bool(b)) => MetadataValue::Text(b.to_string()),
            Some(wire::Kind::Struct(s)) => s.into(),
            Some(wire::Kind::List(l)) => {
                MetadataValue::List(l.values.into_iter().map(Into::into).collect())
            }
        }
    }
}

/// JSON numbers arrive as doubles: `42.0` is the claim `42`.
fn number_text(n: f64) -> String {
    // Below 2^53 every integer is exact in an f64.
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
        #[allow(clippy::cast_possible_truncation)]
        let whole = n as i64;
        whole.to_string()
    } else {
        n.to_string()
    }
}

/// Encodes a JSON object as Envoy serializes a metadata namespace: for tests and fuzzing
/// seeds (the end-to-end tests read what Envoy really sends).
pub fn encode_struct(json: &serde_json::Value) -> Vec<u8> {
    fn value(json: &serde_json::Value) -> wire::Value {
        use serde_json::Value as J;
        let kind = match json {
            J::Null => wire::Kind::Null(0),
            J::Bool(b) => wire::Kind::Bool(*b),
            J::Number(n) => wire::Kind::Number(n.as_f64().unwrap_or_default()),
            J::String(s) => wire::Kind::Text(s.clone()),
            J::Array(items) => wire::Kind::List(wire::ListValue {
                values: items.iter().map(value).collect(),
            }),
            J::Object(_) => wire::Kind::Struct(object(json)),
        };
        wire::Value { kind: Some(kind) }
    }
    fn object(json: &serde_json::Value) -> wire::Struct {
        wire::Struct {
            fields: json
                .as_object()
                .map(|o| o.iter().map(|(k, v)| (k.clone(), value(v))).collect())
                .unwrap_or_default(),
        }
    }
    prost::Message::encode_to_vec(&object(json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn claims_decode_and_nested_paths_and_list_indexes_find_them() {
        let bytes = encode_struct(&json!({
            "payload": {
                "sub": "alice", "tenant": {"id": "acme"}, "plan_level": 3, "ratio": 0.5,
                "admin": false, "groups": ["eng", "ops"], "nothing": null,
            }
        }));
        let tree = MetadataValue::decode_struct(&bytes).unwrap();
        let text = |p: &[&str]| {
            tree.at(&path(p))
                .and_then(MetadataValue::key_text)
                .map(|c| c.into_owned())
        };
        assert_eq!(text(&["payload", "sub"]).as_deref(), Some("alice"));
        assert_eq!(text(&["payload", "tenant", "id"]).as_deref(), Some("acme"));
        assert_eq!(text(&["payload", "plan_level"]).as_deref(), Some("3"));
        assert_eq!(text(&["payload", "ratio"]).as_deref(), Some("0.5"));
        assert_eq!(text(&["payload", "admin"]).as_deref(), Some("false"));
        assert_eq!(text(&["payload", "groups"]).as_deref(), Some("eng,ops"));
        assert_eq!(text(&["payload", "groups", "1"]).as_deref(), Some("ops"));
        assert_eq!(text(&["payload", "groups", "2"]), None);
        assert_eq!(text(&["payload", "groups", "x"]), None);
        assert_eq!(text(&["payload", "nothing"]), None);
        assert_eq!(text(&["payload", "tenant"]), None, "an object is no key");
        assert_eq!(text(&["payload", "sub", "deeper"]), None);
        assert_eq!(text(&["missing"]), None);
        let groups = tree.at(&path(&["payload", "groups"])).unwrap();
        assert!(groups.equals("ops") && groups.equals("eng") && !groups.equals("eng,ops"));
    }

    #[test]
    fn values_read_one_by_one_make_the_tree_keys_walk() {
        let (sub, org) = (path(&["claims", "sub"]), path(&["claims", "org", "id"]));
        let tree = metadata_tree([
            (&sub[..], "alice".to_string()),
            (&org[..], "acme".to_string()),
        ]);
        assert_eq!(tree.at(&sub), Some(&MetadataValue::Text("alice".into())));
        assert_eq!(tree.at(&org), Some(&MetadataValue::Text("acme".into())));
        assert_eq!(tree.at(&path(&["claims", "other"])), None);
        assert_eq!(
            metadata_property("ns", &sub),
            ["metadata", "filter_metadata", "ns", "claims", "sub"]
        );
    }

    #[test]
    fn oversized_or_malformed_bytes_read_as_missing() {
        let big = encode_struct(&json!({"k": "x".repeat(MAX_METADATA_BYTES)}));
        assert!(big.len() > MAX_METADATA_BYTES);
        assert_eq!(MetadataValue::decode_struct(&big), None);
        let fits = encode_struct(&json!({"k": "x".repeat(MAX_METADATA_BYTES - 16)}));
        assert!(fits.len() <= MAX_METADATA_BYTES);
        assert!(MetadataValue::decode_struct(&fits).is_some());
        assert_eq!(MetadataValue::decode_struct(&[0xff, 0xff, 0xff]), None);
        assert_eq!(
            MetadataValue::decode_struct(&[]),
            Some(MetadataValue::Object(BTreeMap::new())),
            "an empty namespace is an empty object"
        );
    }

    #[test]
    fn nesting_deeper_than_prost_allows_is_refused_not_overflowed() {
        let mut deep = json!("leaf");
        for _ in 0..200 {
            deep = json!({ "a": deep });
        }
        assert_eq!(MetadataValue::decode_struct(&encode_struct(&deep)), None);
    }
}
