use sluice_core::identity::{MAX_METADATA_BYTES, MetadataValue};

/// `MetadataValue::decode_struct`: a dynamic metadata namespace as Envoy serializes it
/// (a `google.protobuf.Struct`), which the filter reads for keys from verified identity.
/// Other filters fill it, partly from what clients sent (a token's claims).
///
/// Asserts: decoding never panics or overflows the stack, whatever the nesting; nothing
/// over `MAX_METADATA_BYTES` decodes; a decoded namespace is an object, and walking any
/// path of its own field names and list indexes finds each value again, and reading it
/// as a key or a condition never panics.
pub fn metadata_struct(bytes: &[u8]) {
    let Some(value) = MetadataValue::decode_struct(bytes) else {
        return;
    };
    assert!(bytes.len() <= MAX_METADATA_BYTES);
    assert!(matches!(value, MetadataValue::Object(_)));
    walk(&value, &value, &mut Vec::new());
}

/// Reads every value below `value` by its path from `root`, as a rule's key would.
fn walk(root: &MetadataValue, value: &MetadataValue, path: &mut Vec<String>) {
    assert_eq!(root.at(path), Some(value), "{path:?}");
    let _ = value.key_text();
    let _ = value.equals("x");
    match value {
        MetadataValue::Object(fields) => {
            for (name, child) in fields {
                path.push(name.clone());
                walk(root, child, path);
                path.pop();
            }
        }
        MetadataValue::List(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(i.to_string());
                walk(root, child, path);
                path.pop();
            }
        }
        MetadataValue::Text(_) | MetadataValue::Null => {}
    }
}
