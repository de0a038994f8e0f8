//! Failed authentications, rate limited per client address with Sluice's own limiter (the
//! core's GCRA), so that guessing tokens or session ids from one address is slow.
//!
//! Every request that presents a secret and is refused for it (an unknown or revoked
//! bearer token, an expired or unknown session cookie, a failed dashboard sign-in) spends
//! one token of its address's bucket: [`ALLOWED_FAILURES`] at once, then one more every
//! [`REFILL`]. An address with an empty bucket is answered 429 with `Retry-After` for every
//! wrong secret it sends. A valid secret is always accepted, whatever its address's
//! failures: only failures are throttled, so an attacker behind the same NAT or load
//! balancer as the proxies cannot lock them out (a token is 256 random bits: throttling
//! guesses, not confirming a correct one, is what keeps guessing hopeless). Requests
//! without a secret (no `Authorization`, no cookie) are ordinary 401s and spend nothing.
//! The address is the TCP peer's: forwarding headers (`X-Forwarded-For`, `Forwarded`) are
//! never read here, so a client cannot pick another address to fail from.
//!
//! Failures are logged at most [`LOG_LINES`] times per [`LOG_WINDOW`]; the next line says
//! how many went unlogged, and `sluice_admin_auth_failures_total` counts every one.
//!
//! IPv6 clients are keyed by their /64, which one host usually holds whole. Behind a
//! reverse proxy every client shares the proxy's address: the limit then protects the
//! tokens, at the price of throttling everyone behind that proxy during an attack.
//!
//! Memory is bounded: at most [`MAX_ADDRESSES`] addresses are tracked; when full, those
//! whose bucket has refilled are forgotten, then the one closest to full.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_core::gcra::Gcra;
use sluice_core::time::Nanos;

/// Failures an address may make at once, by default (`sluice serve --auth-failures`).
pub const ALLOWED_FAILURES: u64 = 10;
/// Then one more every this long (6 a minute), by default (`--auth-failure-refill`).
pub(crate) const REFILL: Duration = Duration::from_secs(10);

/// How many failed authentications an address may make: `allowed` at once, then one more
/// every `refill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureLimit {
    pub allowed: u64,
    pub refill: Duration,
}

impl Default for FailureLimit {
    fn default() -> Self {
        FailureLimit {
            allowed: ALLOWED_FAILURES,
            refill: REFILL,
        }
    }
}

impl FailureLimit {
    /// The limit as a token bucket; `None` when it cannot be one (nothing allowed, a
    /// refill under a nanosecond, or one so long the bucket would outgrow 146 years).
    pub fn gcra(self) -> Option<Gcra> {
        let refill = NonZeroU64::new(u64::try_from(self.refill.as_nanos()).ok()?)?;
        Gcra::new(NonZeroU64::MIN, refill, NonZeroU64::new(self.allowed)?).ok()
    }
}
/// Failed authentications logged per [`LOG_WINDOW`] at most: a flood of wrong tokens
/// (150,000 of them once wrote 25 MB of log) becomes a few lines a minute.
pub(crate) const LOG_LINES: u32 = 10;
/// The window [`LOG_LINES`] counts in.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The failure log's budget in the current window.
#[derive(Debug, Default)]
struct LogWindow {
    /// When the window began, in ns since the limiter's epoch.
    started: u64,
    logged: u32,
    /// Failures not logged since the last line.
    unlogged: u64,
}

/// Addresses tracked at most (about 3 MB).
pub(crate) const MAX_ADDRESSES: usize = 65_536;

/// Which secret failed, for the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Credential {
    Bearer,
    Session,
    SignIn,
}

impl Credential {
    fn label(self) -> &'static str {
        match self {
            Credential::Bearer => "bearer",
            Credential::Session => "session",
            Credential::SignIn => "sign_in",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CredentialLabels {
    credential: &'static str,
}

/// The failed-authentication buckets of every client address.
#[derive(Debug)]
pub(crate) struct FailedAuths {
    limit: Gcra,
    /// Each tracked address's theoretical arrival time, in ns since `epoch`.
    buckets: Mutex<HashMap<Address, u64>>,
    epoch: Instant,
    failures: Family<CredentialLabels, Counter>,
    throttled: Counter,
    log: Mutex<LogWindow>,
}

/// A client address as the limit counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Address {
    V4([u8; 4]),
    /// The first 64 bits.
    V6([u8; 8]),
    /// No peer address known (the router driven without a socket, in tests).
    Unknown,
}

impl Address {
    fn of(ip: Option<IpAddr>) -> Address {
        match ip.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(v4)) => Address::V4(v4.octets()),
            Some(IpAddr::V6(v6)) => {
                let o = v6.octets();
                Address::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
            }
            None => Address::Unknown,
        }
    }
}

impl FailedAuths {
    /// Limits failures to `limit` (the default when it is not a valid bucket: see
    /// [`FailureLimit::gcra`]; `sluice serve` checks its flags with it first). Registers
    /// `sluice_admin_auth_failures_total{credential}` and `sluice_admin_auth_throttled_total`
    /// in `registry`.
    pub(crate) fn new(limit: FailureLimit, registry: &mut Registry) -> FailedAuths {
        let failures = Family::<CredentialLabels, Counter>::default();
        let throttled = Counter::default();
        registry.register(
            "sluice_admin_auth_failures",
            "Requests refused for a wrong secret, by credential (bearer, session, sign_in)",
            failures.clone(),
        );
        registry.register(
            "sluice_admin_auth_throttled",
            "Requests answered 429 because their address failed to authenticate too often",
            throttled.clone(),
        );
        let default = FailureLimit::default().gcra();
        let Some(limit) = limit.gcra().or(default) else {
            unreachable!("the default limit is a valid bucket")
        };
        FailedAuths {
            limit,
            buckets: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            failures,
            throttled,
            log: Mutex::new(LogWindow::default()),
        }
    }

    /// Nanoseconds since this limiter was made: the clock its buckets run on.
    pub(crate) fn now_ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether `ip` may try a secret at `now_ns`; when not, how long until it may.
    pub(crate) fn check(&self, ip: Option<IpAddr>, now_ns: u64) -> Result<(), Duration> {
        let address = Address::of(ip);
        let Ok(buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let Some(&tat) = buckets.get(&address) else {
            return Ok(());
        };
        let verdict = self.limit.check(Nanos::new(tat), Nanos::new(now_ns), 1);
        if verdict.allowed {
            Ok(())
        } else {
            self.throttled.inc();
            Err(Duration::from_nanos(verdict.retry_after_ns))
        }
    }

    /// Whether a failure at `now_ns` may be logged: `Some(n)` with the `n` failures left
    /// unlogged since the last line, or `None` when this window's lines are spent.
    pub(crate) fn log_slot(&self, now_ns: u64) -> Option<u64> {
        let mut window = self.log.lock().ok()?;
        let length = u64::try_from(LOG_WINDOW.as_nanos()).unwrap_or(u64::MAX);
        if now_ns.saturating_sub(window.started) >= length {
            window.started = now_ns;
            window.logged = 0;
        }
        if window.logged < LOG_LINES {
            window.logged += 1;
            Some(std::mem::take(&mut window.unlogged))
        } else {
            window.unlogged += 1;
            None
        }
    }

    /// Spends one of `ip`'s failures at `now_ns`.
    pub(crate) fn failed(&self, ip: Option<IpAddr>, credential: Credential, now_ns: u64) {
        self.failures
            .get_or_create(&CredentialLabels {
                credential: credential.label(),
            })
            .inc();
        let address = Address::of(ip);
        let Ok(mut buckets) = self.buckets.lock() else {
            return;
        };
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&address) {
            // Forget the refilled buckets; if none has, the one nearest to full.
            buckets.retain(|_, tat| *tat > now_ns);
            if buckets.len() >= MAX_ADDRESSES
                && let Some(fullest) = buckets.iter().min_by_key(|(_, tat)| **tat).map(|(a, _)| *a)
            {
                buckets.remove(&fullest);
            }
        }
        let tat = buckets.get(&address).copied().unwrap_or(0);
        let verdict = self.limit.check(Nanos::new(tat), Nanos::new(now_ns), 1);
        if verdict.allowed {
            buckets.insert(address, verdict.new_tat.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn limiter() -> FailedAuths {
        FailedAuths::new(FailureLimit::default(), &mut Registry::default())
    }

    #[test]
    fn a_limit_is_a_bucket_only_when_it_can_be_one() {
        assert!(FailureLimit::default().gcra().is_some());
        let limit = |allowed, refill| FailureLimit { allowed, refill }.gcra();
        assert!(limit(0, REFILL).is_none());
        assert!(limit(1, Duration::ZERO).is_none());
        assert!(limit(1_000_000, Duration::from_secs(86_400 * 365 * 1000)).is_none());
        assert!(limit(100_000, Duration::from_millis(1)).is_some());
    }

    #[test]
    fn an_address_gets_its_failures_then_waits_for_the_refill() {
        let auths = limiter();
        let ip = Some("192.0.2.7".parse().unwrap());
        let now = 100 * SECOND;
        for _ in 0..ALLOWED_FAILURES {
            assert_eq!(auths.check(ip, now), Ok(()));
            auths.failed(ip, Credential::Bearer, now);
        }
        let wait = auths.check(ip, now).unwrap_err();
        assert_eq!(wait, REFILL);
        // Another address is not affected.
        assert_eq!(auths.check(Some("192.0.2.8".parse().unwrap()), now), Ok(()));
        // One failure is allowed again after one refill, not more.
        let later = now + u64::try_from(REFILL.as_nanos()).unwrap();
        assert_eq!(auths.check(ip, later), Ok(()));
        auths.failed(ip, Credential::Bearer, later);
        assert!(auths.check(ip, later).is_err());
    }

    #[test]
    fn an_ipv6_host_is_one_address_across_its_64() {
        let auths = limiter();
        for i in 0..ALLOWED_FAILURES {
            let ip = format!("2001:db8:1:2::{:x}", i + 1).parse().ok();
            auths.failed(ip, Credential::SignIn, SECOND);
        }
        assert!(
            auths
                .check("2001:db8:1:2::ffff".parse().ok(), SECOND)
                .is_err()
        );
        assert!(auths.check("2001:db8:1:3::1".parse().ok(), SECOND).is_ok());
        // An IPv4-mapped address is its IPv4 address.
        for _ in 0..ALLOWED_FAILURES {
            auths.failed(
                "::ffff:198.51.100.1".parse().ok(),
                Credential::Session,
                SECOND,
            );
        }
        assert!(auths.check("198.51.100.1".parse().ok(), SECOND).is_err());
    }

    #[test]
    fn failures_are_logged_a_few_lines_a_window_with_the_rest_counted() {
        let auths = limiter();
        let window = u64::try_from(LOG_WINDOW.as_nanos()).unwrap();
        let start = 5 * window;
        let logged = (0..1000)
            .filter(|_| auths.log_slot(start).is_some())
            .count();
        assert_eq!(logged, LOG_LINES as usize);
        // Just before the window ends: still quiet.
        assert_eq!(auths.log_slot(start + window - 1), None);
        // The next window's first line counts the unlogged ones (and only them).
        let unlogged = 1000 - u64::from(LOG_LINES) + 1;
        assert_eq!(auths.log_slot(start + window), Some(unlogged));
        assert_eq!(auths.log_slot(start + window), Some(0));
    }

    #[test]
    fn memory_stays_bounded_under_many_addresses() {
        let auths = limiter();
        for i in 0..(MAX_ADDRESSES as u32 + 100) {
            let ip = Some(IpAddr::V4(i.to_be_bytes().into()));
            auths.failed(ip, Credential::Bearer, SECOND);
        }
        assert!(auths.buckets.lock().unwrap().len() <= MAX_ADDRESSES);
    }
}
