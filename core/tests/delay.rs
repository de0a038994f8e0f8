//! Delay instead of refuse (`on_limit: delay`), over the real decision path with the
//! in-memory stores, the worker's delay queue and a fake clock: what the filter does,
//! minus the host (queue a waiting request, pass it from the tick, refund it if it gives
//! up).

use sluice_core::delay::{DelayQueue, Delayed};
use sluice_core::limiter::LimiterCounters;
use sluice_core::report::Aggregate;
use sluice_core::request::{HttpRequest, WithBody};
use sluice_core::ruleset::{Decision, Outcome};
use sluice_core::time::{NANOS_PER_MILLI, NANOS_PER_SECOND, Nanos};
use sluice_core::tokens::BodyFacts;

const T0: u64 = 1_700_000_000 * NANOS_PER_SECOND;
const MS: u64 = NANOS_PER_MILLI;

mod support;

use support::TestFilter;

/// The filter under test, with a worker's delay queue.
struct Worker {
    filter: TestFilter,
    queue: DelayQueue,
    next_context: u32,
    /// The worker's per-rule statistics.
    stats: std::cell::RefCell<Aggregate>,
}

impl std::ops::Deref for Worker {
    type Target = TestFilter;

    fn deref(&self) -> &TestFilter {
        &self.filter
    }
}

/// What became of one request.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    Passed,
    /// Waiting in the queue under this context id, for this long.
    Queued(u32, u64),
    Refused,
}

/// Five requests a second per API key, two at most, delayed up to `max_delay_ms`.
fn delaying(max_delay_ms: u64, queue: &str) -> String {
    format!(
        r#"[{{"name":"smooth","key":{{"header":"x-api-key"}},
             "limits":[{{"requests":5,"period":"second","burst":2}}],
             "on_limit":"delay","delay":{{"max_delay_ms":{max_delay_ms}{queue}}}}}]"#
    )
}

fn key(k: &str) -> HttpRequest {
    HttpRequest::get("/work").with_header("x-api-key", k)
}

impl Worker {
    fn new(rules: &str) -> Self {
        Self {
            filter: TestFilter::new(rules),
            queue: DelayQueue::default(),
            next_context: 2,
            stats: Default::default(),
        }
    }

    fn decide(
        &self,
        request: &impl sluice_core::request::RequestAttributes,
        now: u64,
    ) -> Decision<'_> {
        let cx = self.filter.context(now, Some(&self.queue));
        let mut stats = self.stats.borrow_mut();
        self.config
            .ruleset
            .decide_observed(request, &cx, &mut *stats)
    }

    /// Decides a request and queues it if it must wait, as the filter does; the delayed
    /// part is kept for a refund.
    fn arrive(&mut self, request: &HttpRequest, now: u64) -> (Fate, Option<Delayed>) {
        let context = self.next_context;
        self.next_context += 1;
        let decision = self.decide(request, now);
        let fate = match (&decision.outcome, &decision.delayed) {
            (Outcome::Allowed, None) => Fate::Passed,
            (Outcome::Allowed, Some(d)) => Fate::Queued(context, d.wait_ns),
            _ => Fate::Refused,
        };
        let delayed = decision.delayed.clone();
        if let Some(d) = &delayed {
            let due = Nanos::new(now + d.wait_ns);
            self.queue.push(context, Nanos::new(now), due, &d.keys);
        }
        (fate, delayed)
    }

    fn fate(&mut self, request: &HttpRequest, now: u64) -> Fate {
        self.arrive(request, now).0
    }

    /// A waiting request gives up: out of the queue, its tokens given back.
    fn give_up(&mut self, context: u32, delayed: &Delayed, now: u64) {
        assert!(self.queue.cancel(context).is_some());
        let failures = delayed.refund(
            &self.config.table,
            &self.store,
            Nanos::new(now),
            &mut LimiterCounters::default(),
        );
        assert_eq!(failures, 0);
    }
}

#[test]
fn over_the_limit_requests_wait_their_turn_within_the_delay_then_are_refused() {
    let mut w = Worker::new(&delaying(500, ""));
    assert_eq!(w.fate(&key("a"), T0), Fate::Passed);
    assert_eq!(w.fate(&key("a"), T0), Fate::Passed);
    // A token every 200 ms: the next two are due in 200 and 400 ms.
    assert_eq!(w.fate(&key("a"), T0), Fate::Queued(4, 200 * MS));
    assert_eq!(w.fate(&key("a"), T0), Fate::Queued(5, 400 * MS));
    // Due in 600 ms: past the 500 ms delay, refused as ever, and nothing reserved.
    let d = w.decide(&key("a"), T0);
    let Outcome::Denied(limited) = d.outcome else {
        panic!("{:?}", d.outcome)
    };
    assert_eq!(limited.verdict().retry_after_ns, 600 * MS);
    assert!(d.delayed.is_none());
    // Another key is untouched.
    assert_eq!(w.fate(&key("b"), T0), Fate::Passed);
    // Exactly at its due time the first waiter passes, not a nanosecond before.
    assert!(w.queue.take_due(Nanos::new(T0 + 200 * MS - 1)).is_empty());
    let due = w.queue.take_due(Nanos::new(T0 + 200 * MS));
    assert_eq!(due.iter().map(|w| w.context).collect::<Vec<_>>(), [4]);
    // The two that waited are counted apart (still among the allowed), with their waits.
    let batch = w.stats.borrow_mut().take();
    let c = &batch.rules[0].counts;
    assert_eq!(
        (c.allowed, c.delayed, c.delay_wait_ms, c.denied),
        (5, 2, 600, 1)
    );
}

#[test]
fn a_full_queue_refuses_without_reserving_and_the_key_bound_is_per_key() {
    let mut w = Worker::new(&delaying(
        10_000,
        r#","queue_per_key":2,"queue_per_worker":3"#,
    ));
    for _ in 0..2 {
        assert_eq!(w.fate(&key("a"), T0), Fate::Passed);
    }
    assert!(matches!(
        w.fate(&key("a"), T0),
        Fate::Queued(_, 200_000_000)
    ));
    assert!(matches!(
        w.fate(&key("a"), T0),
        Fate::Queued(_, 400_000_000)
    ));
    // Key `a` has its two waiting: the next is refused, well within the delay.
    assert_eq!(w.fate(&key("a"), T0), Fate::Refused);
    // Nothing was reserved by the refusal: once a waiter passes, the next one is due
    // right after the last reserved one (600 ms), not later.
    w.queue.take_due(Nanos::new(T0 + 200 * MS));
    assert!(matches!(
        w.fate(&key("a"), T0 + 200 * MS),
        Fate::Queued(_, 400_000_000)
    ));
    // The rule's bound (3 on this worker) is shared by every key.
    for _ in 0..2 {
        assert_eq!(w.fate(&key("b"), T0), Fate::Passed);
    }
    assert!(matches!(w.fate(&key("b"), T0), Fate::Queued(..)));
    assert_eq!(w.queue.len(), 3);
    assert_eq!(
        w.fate(&key("c"), T0),
        Fate::Passed,
        "a fresh key is not delayed"
    );
    for _ in 0..2 {
        w.fate(&key("d"), T0);
    }
    assert_eq!(
        w.fate(&key("d"), T0),
        Fate::Refused,
        "the rule's queue is full"
    );
}

#[test]
fn a_waiter_that_gives_up_is_refunded_and_the_bucket_sums_back() {
    let mut w = Worker::new(&delaying(10_000, ""));
    for _ in 0..2 {
        w.fate(&key("a"), T0);
    }
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let (fate, delayed) = w.arrive(&key("a"), T0);
        let Fate::Queued(context, _) = fate else {
            panic!("{fate:?}")
        };
        waiting.push((context, delayed.unwrap()));
    }
    // Every waiter gives up, in any order: the queue is empty and the bucket is as the
    // two that passed left it, so the next request waits 200 ms again.
    waiting.reverse();
    for (context, delayed) in &waiting {
        w.give_up(*context, delayed, T0 + MS);
    }
    assert!(w.queue.is_empty());
    assert!(matches!(
        w.fate(&key("a"), T0 + MS),
        Fate::Queued(_, 199_000_000)
    ));
    // One that passed is not in the queue to give up.
    assert!(w.queue.cancel(waiting[0].0).is_none());
}

#[test]
fn passes_never_exceed_burst_plus_rate_times_elapsed_and_wait_at_most_one_tick_more() {
    const TICK: u64 = 10 * MS;
    let mut w = Worker::new(&delaying(
        1_000,
        r#","queue_per_key":1000,"queue_per_worker":1000"#,
    ));
    let mut passes: Vec<u64> = Vec::new();
    let mut arrivals = std::collections::HashMap::new();
    let mut now = T0;
    let mut tick = T0;
    // Arrivals every 7 ms (about 143/s against 5/s) for 3 s, the queue emptied at
    // every tick as the worker's root does.
    while now < T0 + 3 * NANOS_PER_SECOND {
        while tick <= now {
            for waiter in w.queue.take_due(Nanos::new(tick)) {
                let (arrived, wait) = arrivals[&waiter.context];
                assert!(tick >= arrived + wait, "never early");
                assert!(tick < arrived + wait + TICK, "at most one tick late");
                passes.push(tick);
            }
            tick += TICK;
        }
        match w.arrive(&key("a"), now).0 {
            Fate::Passed => passes.push(now),
            Fate::Queued(context, wait) => {
                arrivals.insert(context, (now, wait));
            }
            Fate::Refused => {}
        }
        now += 7 * MS;
    }
    let queued = arrivals.len();
    assert!(queued > 5, "some waited: {queued}");
    passes.sort_unstable();
    // Burst 2 plus 5/s over any window, measured from any pass.
    for (i, first) in passes.iter().enumerate() {
        for (j, last) in passes.iter().enumerate().skip(i) {
            let allowed = 2 + (last - first) * 5 / NANOS_PER_SECOND;
            assert!(
                (j - i + 1) as u64 <= allowed,
                "{} passes in {} ns",
                j - i + 1,
                last - first
            );
        }
    }
    // And the limit is used, not starved: over 3 s, about burst + 15.
    assert!(passes.len() >= 15, "{}", passes.len());
}

#[test]
fn a_refusing_rule_beside_a_delaying_one_is_charged_as_of_the_pass() {
    let rules = r#"[
        {"name":"smooth","key":{"header":"x-api-key"},
         "limits":[{"requests":5,"period":"second","burst":1}],
         "on_limit":"delay","delay":{"max_delay_ms":1000}},
        {"name":"strict","key":{"header":"x-api-key"},
         "limits":[{"requests":1,"period":"second","burst":1}]}]"#;
    let mut w = Worker::new(rules);
    assert_eq!(w.fate(&key("a"), T0), Fate::Passed);
    // `smooth` would let it pass in 200 ms, but `strict` holds a token only at 1 s: as of
    // 200 ms it refuses, so the request is refused whole, nothing charged or queued.
    assert_eq!(w.fate(&key("a"), T0), Fate::Refused);
    assert!(w.queue.is_empty());
    // At 900 ms `smooth` is full, `strict` still empty: refused (strict refuses).
    assert_eq!(w.fate(&key("a"), T0 + 900 * MS), Fate::Refused);
    assert_eq!(w.fate(&key("a"), T0 + NANOS_PER_SECOND), Fate::Passed);
}

#[test]
fn a_token_limit_delays_by_its_estimate_and_shadow_clients_never_wait() {
    let rules = r#"[{"name":"llm","key":{"header":"x-api-key"},
        "limits":[{"tokens":100,"period":"second","burst":100}],
        "tokens":{"usage":"openai","default_estimate":60},
        "on_limit":"delay","delay":{"max_delay_ms":1000}}]"#;
    let mut w = Worker::new(rules);
    let llm = |k: &str| WithBody {
        request: HttpRequest::get("/v1/chat/completions").with_header("x-api-key", k),
        facts: BodyFacts::default(),
    };
    let d = w.decide(&llm("a"), T0);
    assert!(d.is_allowed() && d.delayed.is_none());
    // 60 more tokens are due once 20 have refilled: 200 ms.
    let d = w.decide(&llm("a"), T0);
    let delayed = d.delayed.clone().unwrap();
    assert_eq!(delayed.wait_ns, 200 * MS);
    assert_eq!(
        d.reservations.len(),
        1,
        "the estimate is reserved, to settle later"
    );
    assert!(
        delayed.refunds.is_empty(),
        "token limits are refunded by the reservation"
    );
    w.queue.push(
        3,
        Nanos::new(T0),
        Nanos::new(T0 + delayed.wait_ns),
        &delayed.keys,
    );

    let shadow = r#"[{"name":"s","key":{"header":"x-api-key"},"mode":"shadow",
        "limits":[{"requests":1,"period":"second","burst":1}],
        "on_limit":"delay","delay":{"max_delay_ms":1000}}]"#;
    let w = Worker::new(shadow);
    for _ in 0..3 {
        let d = w.decide(&key("a"), T0);
        assert!(d.is_allowed() && d.delayed.is_none());
    }
}
