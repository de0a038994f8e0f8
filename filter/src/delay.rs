//! Requests waiting for their tokens (`on_limit: delay`), on one worker: queued by their
//! own context when the decision says they must wait (the headers callback returns
//! `Pause`), resumed by the worker's root from its tick once due, or taken out of the
//! queue and refunded by their own context when their stream ends first. The queue, its
//! order and its bounds are the core's (`sluice_core::delay`); this is the host side.
//!
//! Resuming another context from the root is `set_effective_context(request)` then
//! `resume_http_request()`, and back with `set_effective_context(root)`; Envoy runs the
//! resumed filter chain after the tick returns, never inside it.

use std::cell::{Ref, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use proxy_wasm::hostcalls;
use sluice_core::delay::{DelayQueue, Delayed};
use sluice_core::time::{NANOS_PER_MILLI, Nanos};

use crate::metrics::DelayMetrics;

/// The worker's longest tick while its ruleset has a rule that delays: a waiting request
/// passes at most this long after its tokens are due. While requests wait, the tick is
/// aimed at the first one's due time ([`DelayedRequests::next_tick`]).
pub const DELAY_TICK: Duration = Duration::from_millis(10);

/// One worker's waiting requests, and what the passed ones tell their responses.
#[derive(Debug, Default)]
pub struct DelayedRequests {
    queue: RefCell<DelayQueue>,
    /// Passed requests: their computed wait and time queued (ns), until their response
    /// headers take them (or their stream ends).
    passed: RefCell<HashMap<u32, (u64, u64)>>,
}

impl DelayedRequests {
    /// The queue, for a decision to see whether it has room.
    pub fn queue(&self) -> Ref<'_, DelayQueue> {
        self.queue.borrow()
    }

    /// Queues request `context`, decided at `now`, until its tokens are due.
    pub fn hold(&self, context: u32, now: Nanos, delayed: &Delayed) {
        let due = now.saturating_add(Nanos::new(delayed.wait_ns));
        self.queue
            .borrow_mut()
            .push(context, now, due, &delayed.keys);
    }

    /// From the root's tick: resumes every request due by `now`, in the order they are
    /// due, then makes `root` the effective context again.
    pub fn resume_due(&self, root: u32, now: Nanos, metrics: &DelayMetrics) {
        let due = self.queue.borrow_mut().take_due(now);
        if due.is_empty() {
            return;
        }
        for waiter in due {
            // A request whose stream ended left the queue then, so this finds it live;
            // the first call's result is checked all the same (a failed one would make
            // the second act on the root).
            let resumed = hostcalls::set_effective_context(waiter.context)
                .and_then(|()| hostcalls::resume_http_request());
            if resumed.is_err() {
                metrics.failures.inc();
                continue;
            }
            let queued = now.get().saturating_sub(waiter.queued_at.get());
            metrics.passed.inc();
            metrics.queued_ms.add(queued / NANOS_PER_MILLI);
            metrics
                .late_ms
                .add(now.get().saturating_sub(waiter.due.get()) / NANOS_PER_MILLI);
            self.passed
                .borrow_mut()
                .insert(waiter.context, (waiter.wait_ns(), queued));
        }
        let _ = hostcalls::set_effective_context(root);
    }

    /// Request `context`'s wait and time queued, once, if it waited and passed.
    pub fn take_passed(&self, context: u32) -> Option<(u64, u64)> {
        self.passed.borrow_mut().remove(&context)
    }

    /// Request `context`'s stream ended: whether it was still waiting (then it is taken
    /// out of the queue, and its caller gives its tokens back).
    pub fn give_up(&self, context: u32) -> bool {
        self.passed.borrow_mut().remove(&context);
        self.queue.borrow_mut().cancel(context).is_some()
    }

    /// Whether any request waits.
    pub fn is_empty(&self) -> bool {
        self.queue.borrow().is_empty()
    }

    /// The tick that passes the first waiting request as soon after its due time as
    /// Envoy's millisecond timer allows: the time until then, rounded up to a whole
    /// millisecond, at least 1 ms and at most [`DELAY_TICK`] (also when none waits).
    pub fn next_tick(&self, now: Nanos) -> Duration {
        let Some(due) = self.queue.borrow().next_due() else {
            return DELAY_TICK;
        };
        let ms = due
            .get()
            .saturating_sub(now.get())
            .div_ceil(NANOS_PER_MILLI);
        Duration::from_millis(ms).clamp(Duration::from_millis(1), DELAY_TICK)
    }
}
