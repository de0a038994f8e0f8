//! A bucket's value in Redis: its state's bytes ([`BucketState::encode`]), then the id of
//! the proxy whose sync created it. Reading the creator with the state (the `MGET` every
//! batch sends anyway) tells a batch whose count of created buckets a bucket belongs to
//! without asking Redis. Buckets of Envoy's rate limit service, and those an older
//! coordinator wrote, have no creator.

use sluice_core::global::coordinator::{BucketState, STATE_LEN};

/// A stored bucket: its state (`None`: another layout, read as a full, quiet bucket) and
/// its creator, if it names one.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Stored {
    pub state: Option<BucketState>,
    pub creator: Option<String>,
}

impl Stored {
    pub fn decode(bytes: &[u8]) -> Self {
        let (state, rest) = bytes.split_at(STATE_LEN.min(bytes.len()));
        let state = BucketState::decode(state);
        let creator = std::str::from_utf8(rest)
            .ok()
            .filter(|id| sluice_core::report::is_proxy_id(id))
            .map(str::to_string);
        Self {
            // The creator only follows a state of this layout.
            creator: state.and(creator),
            state,
        }
    }
}

/// The bytes of `state` created by `creator`.
pub(crate) fn encode(state: &BucketState, creator: Option<&str>) -> Vec<u8> {
    let creator = creator.unwrap_or_default();
    let mut bytes = Vec::with_capacity(STATE_LEN + creator.len());
    bytes.extend_from_slice(&state.encode());
    bytes.extend_from_slice(creator.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> BucketState {
        BucketState {
            tat: 7,
            demand: 1.5,
            ..BucketState::default()
        }
    }

    #[test]
    fn a_value_is_the_states_bytes_then_its_creator() {
        let bytes = encode(&state(), Some("mesh-0001"));
        assert_eq!(&bytes[..STATE_LEN], state().encode().as_slice());
        assert_eq!(&bytes[STATE_LEN..], b"mesh-0001");
        let stored = Stored::decode(&bytes);
        assert_eq!(stored.state, Some(state()));
        assert_eq!(stored.creator.as_deref(), Some("mesh-0001"));
    }

    #[test]
    fn a_state_alone_has_no_creator_and_other_bytes_no_state() {
        let alone = Stored::decode(&state().encode());
        assert_eq!((alone.state, alone.creator), (Some(state()), None));
        let mut bad_id = encode(&state(), None);
        bad_id.extend_from_slice(b"has space");
        assert_eq!(Stored::decode(&bad_id).creator, None, "not a proxy id");
        let garbage = Stored::decode(b"\x09mesh-0001");
        assert_eq!((garbage.state, garbage.creator), (None, None));
        assert_eq!(Stored::decode(b"").state, None);
    }
}
