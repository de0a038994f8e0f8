use sluice_core::wire::{RULESET_FORMAT_VERSION, RulesetDocument};

/// The ruleset document: `RulesetDocument::from_json` (the admin API's long-poll answer,
/// read by the control service) and `RulesetDocument::decode` (the same document in shared
/// data, read by every worker).
///
/// The input is read both ways: whole as the JSON answer, and whole as shared-data bytes
/// (a format byte, then JSON), so one corpus serves both decoders.
///
/// Asserts: neither decoder panics; the two agree (shared-data bytes decode exactly when
/// the JSON after their format byte does, to the same document); a decoded document
/// round-trips through `encode`; and validating it (`compile`, as the control service and
/// every worker do) never panics and gives the same verdict after the round trip.
pub fn ruleset_document(bytes: &[u8]) {
    if let Ok(document) = RulesetDocument::from_json(bytes) {
        check(&document);
    }
    let decoded = RulesetDocument::decode(bytes);
    match bytes.split_first() {
        Some((&RULESET_FORMAT_VERSION, json)) => {
            let from_json = RulesetDocument::from_json(json).ok();
            assert_eq!(decoded.as_ref().ok(), from_json.as_ref());
        }
        _ => assert!(decoded.is_err(), "only the known format byte decodes"),
    }
    if let Ok(document) = decoded {
        check(&document);
    }
}

fn check(document: &RulesetDocument) {
    let compiled = document.compile();
    let encoded = document.encode();
    let again = RulesetDocument::decode(&encoded).expect("an encoded document decodes");
    assert_eq!(&again, document);
    assert_eq!(again.compile().is_ok(), compiled.is_ok());
}
