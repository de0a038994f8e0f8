//! Proxy tokens remembered between requests, so a proxy's own requests (its sync every 100
//! to 250 ms, its reports, its ruleset long-poll) never wait on the database.
//!
//! Why: with two replicas on PostgreSQL and 50,000 requests a second on a 2-core machine
//! (`cargo xtask bench --only global`), looking a token up took 100 to 450 ms while the
//! sync behind it took 2 ms. Syncs that outlived Envoy's 500 ms timeout put their proxies
//! on fallback shares while the others leased, and the fleet admitted 1.10 of its limit.
//!
//! **Architecture Invariant: a proxy's requests are authenticated from memory, and a
//! revoked token stops working within a bound.** A token found in the database is
//! remembered by the hash of its secret (never the secret). A remembered token younger than
//! [`REFRESH_AFTER`] is used at once; an older one is used at once too while one lookup
//! (one per token at a time) refreshes it in the background; past [`MAX_AGE`] it is not
//! used and the request waits for the database as before. So a token revoked through this
//! replica is refused at once ([`TokenCache::forget_id`]); one revoked elsewhere (another
//! replica, `sluice token revoke`) is refused by this replica within [`REFRESH_AFTER`] plus
//! one lookup while it is in use, and never after [`MAX_AGE`]. People's requests (rules,
//! tokens, the dashboard) always ask the database. Unknown secrets are never remembered:
//! each costs a lookup behind the failed-authentication limit. At most [`MAX_ENTRIES`]
//! tokens are remembered; past that a token is looked up each time.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::TokenInfo;

/// How long a remembered token is used without asking the database again.
pub const REFRESH_AFTER: Duration = Duration::from_secs(1);
/// How long a remembered token may be used while its refreshes fail (the database slow or
/// out of reach): after this, requests wait for the database again.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// Tokens remembered at most: far more than a fleet has, bounded whatever it sends.
pub const MAX_ENTRIES: usize = 4_096;

/// What the cache says of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recalled {
    /// Checked less than [`REFRESH_AFTER`] ago: use it.
    Fresh(TokenInfo),
    /// Use it, and look it up again now: the caller is the one to refresh it (the cache
    /// hands this out once per token until [`TokenCache::refreshed`]).
    Refresh(TokenInfo),
    /// Not remembered (or too old to use): look it up before answering.
    Unknown,
}

#[derive(Debug)]
struct Remembered {
    info: TokenInfo,
    checked_at: Instant,
    /// A lookup is on its way: others keep using the token meanwhile.
    refreshing: bool,
}

/// Active proxy tokens by the hash of their secret.
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    entries: Mutex<HashMap<String, Remembered>>,
    /// Ids revoked through this replica, so a lookup that read the token just before it
    /// was revoked does not bring it back (at most [`MAX_ENTRIES`]; cleared when full,
    /// since only lookups on their way at the revocation can race it).
    revoked: Mutex<HashSet<String>>,
}

impl TokenCache {
    /// The token whose secret hashes to `hash`, as remembered at `now`.
    pub(crate) fn recall(&self, hash: &str, now: Instant) -> Recalled {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(hash) else {
            return Recalled::Unknown;
        };
        let age = now.saturating_duration_since(entry.checked_at);
        if age >= MAX_AGE {
            entries.remove(hash);
            return Recalled::Unknown;
        }
        if age < REFRESH_AFTER || entry.refreshing {
            return Recalled::Fresh(entry.info.clone());
        }
        entry.refreshing = true;
        Recalled::Refresh(entry.info.clone())
    }

    /// Remembers an active token just read from the database at `now`.
    pub(crate) fn remember(&self, hash: &str, info: TokenInfo, now: Instant) {
        if self.lock_revoked().contains(&info.id) {
            return;
        }
        let mut entries = self.lock();
        if !entries.contains_key(hash) && entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| now.saturating_duration_since(e.checked_at) < MAX_AGE);
            if entries.len() >= MAX_ENTRIES {
                return;
            }
        }
        let entry = Remembered {
            info,
            checked_at: now,
            refreshing: false,
        };
        entries.insert(hash.to_owned(), entry);
    }

    /// What a refresh handed out by [`Self::recall`] found: the token again (remembered
    /// anew), nothing (revoked or deleted: forgotten), or an error (kept as it was, to be
    /// refreshed again by the next request until [`MAX_AGE`]).
    pub(crate) fn refreshed<E>(
        &self,
        hash: &str,
        found: Result<Option<TokenInfo>, E>,
        now: Instant,
    ) {
        match found {
            Ok(Some(info)) => self.remember(hash, info, now),
            Ok(None) => {
                self.lock().remove(hash);
            }
            Err(_) => {
                if let Some(entry) = self.lock().get_mut(hash) {
                    entry.refreshing = false;
                }
            }
        }
    }

    /// Forgets the token with this id (revoked through this replica).
    pub(crate) fn forget_id(&self, id: &str) {
        let mut revoked = self.lock_revoked();
        if revoked.len() >= MAX_ENTRIES {
            revoked.clear();
        }
        revoked.insert(id.to_owned());
        drop(revoked);
        self.lock().retain(|_, e| e.info.id != id);
    }

    fn lock_revoked(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.revoked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Role;

    fn token(id: &str) -> TokenInfo {
        TokenInfo {
            id: id.into(),
            name: "edge".into(),
            role: Role::Proxy,
            created_at: 0,
            created_by: "cli".into(),
            last_used_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn a_token_is_used_from_memory_then_refreshed_once_then_dropped_when_too_old() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        assert_eq!(cache.recall("h", t0), Recalled::Unknown);
        cache.remember("h", token("tok_a"), t0);
        let just_before = t0 + REFRESH_AFTER - Duration::from_millis(1);
        assert_eq!(
            cache.recall("h", just_before),
            Recalled::Fresh(token("tok_a"))
        );
        let due = t0 + REFRESH_AFTER;
        assert_eq!(cache.recall("h", due), Recalled::Refresh(token("tok_a")));
        // One refresh at a time: the others keep using it meanwhile.
        assert_eq!(cache.recall("h", due), Recalled::Fresh(token("tok_a")));
        // A failed refresh keeps it; the next request refreshes again.
        cache.refreshed::<()>("h", Err(()), due);
        assert_eq!(cache.recall("h", due), Recalled::Refresh(token("tok_a")));
        // Never used past the maximum age, however its refreshes went.
        assert_eq!(cache.recall("h", t0 + MAX_AGE), Recalled::Unknown);
        assert_eq!(cache.recall("h", t0), Recalled::Unknown, "forgotten");
    }

    #[test]
    fn a_refresh_that_finds_nothing_forgets_the_token_and_one_that_finds_it_renews_it() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        cache.remember("h", token("tok_a"), t0);
        let due = t0 + REFRESH_AFTER;
        assert!(matches!(cache.recall("h", due), Recalled::Refresh(_)));
        cache.refreshed::<()>("h", Ok(Some(token("tok_a"))), due);
        assert_eq!(cache.recall("h", due), Recalled::Fresh(token("tok_a")));
        let later = due + REFRESH_AFTER;
        assert!(matches!(cache.recall("h", later), Recalled::Refresh(_)));
        cache.refreshed::<()>("h", Ok(None), later);
        assert_eq!(cache.recall("h", later), Recalled::Unknown);
    }

    #[test]
    fn revoking_through_this_replica_forgets_at_once() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        cache.remember("h1", token("tok_a"), t0);
        cache.remember("h2", token("tok_b"), t0);
        cache.forget_id("tok_a");
        assert_eq!(cache.recall("h1", t0), Recalled::Unknown);
        // A lookup that read it before the revocation does not bring it back.
        cache.refreshed::<()>("h1", Ok(Some(token("tok_a"))), t0);
        assert_eq!(cache.recall("h1", t0), Recalled::Unknown);
        assert_eq!(cache.recall("h2", t0), Recalled::Fresh(token("tok_b")));
    }

    #[test]
    fn the_revoked_ids_kept_against_racing_lookups_are_bounded() {
        let cache = TokenCache::default();
        for i in 0..=MAX_ENTRIES {
            cache.forget_id(&format!("tok_{i}"));
        }
        assert!(cache.lock_revoked().len() <= MAX_ENTRIES);
        let newest = format!("tok_{MAX_ENTRIES}");
        assert!(cache.lock_revoked().contains(&newest), "the newest is kept");
    }

    #[test]
    fn at_most_max_entries_are_remembered_and_old_ones_make_room() {
        let cache = TokenCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES {
            cache.remember(&format!("h{i}"), token("tok"), t0);
        }
        cache.remember("one more", token("tok"), t0 + Duration::from_secs(1));
        assert_eq!(
            cache.recall("one more", t0 + Duration::from_secs(1)),
            Recalled::Unknown,
            "full: looked up each time instead"
        );
        // A remembered one is still renewed when full.
        cache.remember("h0", token("tok"), t0 + Duration::from_secs(1));
        assert!(matches!(
            cache.recall("h0", t0 + Duration::from_secs(1)),
            Recalled::Fresh(_)
        ));
        // Entries past the maximum age make room.
        let late = t0 + MAX_AGE;
        cache.remember("one more", token("tok"), late);
        assert!(matches!(cache.recall("one more", late), Recalled::Fresh(_)));
        assert!(cache.lock().len() <= MAX_ENTRIES);
    }
}
