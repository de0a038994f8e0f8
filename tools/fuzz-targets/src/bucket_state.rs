use std::num::NonZeroU64;

use arbitrary::{Arbitrary, Unstructured};
use sluice_core::gcra::Gcra;
use sluice_core::global::coordinator::{BucketState, STATE_LEN, Settings, Usage, settle};
use sluice_core::time::Nanos;

/// `BucketState::decode`: a global bucket's state as the Redis coordinator stores it (any
/// client of that Redis can write the key).
///
/// Asserts: decoding never panics; bytes that decode are exactly the encoding of what
/// they decode to, with a finite, non-negative demand; and settling a proxy's usage (the
/// arithmetic every sync runs on that state, with usage and clock taken from the input)
/// leaves a state that still encodes and decodes to itself. A settled state that no
/// longer decoded would be read as a full, quiet bucket: a fresh burst for the fleet.
pub fn bucket_state(input: &[u8]) {
    // The state's bytes come first, so the seed corpus is plain encoded states; whatever
    // follows drives one settlement.
    let (bytes, rest) = input.split_at(input.len().min(STATE_LEN));
    let Some(state) = BucketState::decode(bytes) else {
        return;
    };
    assert!(state.demand.is_finite() && state.demand >= 0.0);
    assert_eq!(state.encode().as_slice(), bytes);

    let mut u = Unstructured::new(rest);
    let Ok(step) = Settlement::arbitrary(&mut u) else {
        return;
    };
    let mut settled = state;
    let _grant = settle(
        &mut settled,
        &step.limit,
        &step.usage,
        Nanos::new(step.covers_ns),
        Nanos::new(step.now),
        &step.settings,
    );
    assert_eq!(
        BucketState::decode(&settled.encode()),
        Some(settled),
        "a settled state must read back: {settled:?}"
    );
}

/// One settlement within what the admin API lets through (`admin-api/src/quota/mod.rs`
/// `validate`): a valid limit, counts up to `MAX_COUNT`, a sync interval of 50 ms to 10 s,
/// usage covering up to 60 intervals, and the coordinator's clock (2^40 ns and later).
#[derive(Debug)]
struct Settlement {
    limit: Gcra,
    usage: Usage,
    covers_ns: u64,
    now: u64,
    settings: Settings,
}

const MAX_COUNT: u64 = 1_000_000_000_000;
const MS: u64 = 1_000_000;

impl<'a> Arbitrary<'a> for Settlement {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let interval_ns = NonZeroU64::new(u.int_in_range(1..=u64::MAX)?).unwrap_or(NonZeroU64::MIN);
        let burst = NonZeroU64::new(u.int_in_range(1..=u64::MAX)?).unwrap_or(NonZeroU64::MIN);
        let limit = Gcra::new(NonZeroU64::MIN, interval_ns, burst)
            .map_err(|_| arbitrary::Error::IncorrectFormat)?;
        let mut count = || u.int_in_range(0..=MAX_COUNT);
        let usage = Usage {
            attempts: count()?,
            unleased: count()?,
            returned: count()?,
            want: count()?,
            first_use_ns: u.int_in_range(0..=u64::MAX)?,
            known_full_in_ns: u.int_in_range(0..=u64::MAX)?,
        };
        let interval_ms = u.int_in_range(50..=10_000u64)?;
        let mut settings = Settings::for_interval(Nanos::new(interval_ms * MS));
        settings.warming_up = u.arbitrary()?;
        settings.fleet_size = u.int_in_range(1..=u32::MAX)?;
        Ok(Settlement {
            limit,
            usage,
            covers_ns: u.int_in_range(1..=60 * 10_000u64)? * MS,
            now: (1 << 40) + u.int_in_range(0..=1u64 << 62)?,
            settings,
        })
    }
}
