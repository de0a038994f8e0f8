//! A request's token reservations, from its decision to the end of its response: host
//! glue over `sluice_core::tokens`.
//!
//! The response body is read as it passes, chunk by chunk, by one `UsageReader` per
//! reservation; nothing is held back or delayed (the filter returns `Continue` for every
//! chunk). The reservation is settled once: at the end of the response with the usage
//! read (or, unreadable, the reservation as the charge), or refunded when the upstream
//! answered 5xx or the stream ended early (client reset, upstream abort: `on_log`).

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use sluice_core::config::FilterConfig;
use sluice_core::tokens::{Reservation, SettleContext, Settlement};
use sluice_core::usage::UsageReader;

use crate::clock;
use crate::global_channel;
use crate::metrics::Metrics;
use crate::shared::Shared;

/// What one allowed request reserved, and the readers of its response.
#[derive(Debug)]
pub struct TokenFlow {
    /// The configuration the request was decided with (its tables are where the tokens
    /// were taken).
    config: Rc<FilterConfig>,
    reservations: Vec<Reservation>,
    /// One per reservation once the response headers arrived; empty before, and for a
    /// response that refunds.
    readers: Vec<UsageReader>,
    /// The upstream failed (5xx): refund at the end.
    refund: bool,
}

impl TokenFlow {
    pub fn new(config: Rc<FilterConfig>, reservations: Vec<Reservation>) -> Option<TokenFlow> {
        (!reservations.is_empty()).then_some(TokenFlow {
            config,
            reservations,
            readers: Vec::new(),
            refund: false,
        })
    }

    /// The response's headers: a 5xx refunds; anything else is read for its usage, framed
    /// as its content type says.
    pub fn on_response_headers(&mut self) {
        let status = response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.trim().parse::<u16>().ok())
            .unwrap_or(0);
        if status >= 500 {
            self.refund = true;
            return;
        }
        let content_type = response_header("content-type");
        let content_type = content_type
            .as_deref()
            .and_then(|c| std::str::from_utf8(c).ok());
        self.readers = self
            .reservations
            .iter()
            .map(|r| UsageReader::new(r.format.clone(), content_type))
            .collect();
    }

    /// One chunk of the response body, read where it is (it goes on unchanged).
    pub fn on_response_body(&mut self, size: usize) {
        if self.readers.is_empty() || size == 0 {
            return;
        }
        let Ok(Some(chunk)) = hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size) else {
            return;
        };
        for reader in &mut self.readers {
            reader.feed(&chunk);
        }
    }

    /// The response ended whole: commits the usage read (a 5xx refunds).
    pub fn finish(self, shared: &Shared) {
        let metrics = shared.metrics();
        let refund = self.refund;
        let mut readers = self.readers.into_iter();
        let settlements: Vec<Settlement> = self
            .reservations
            .iter()
            .map(|_| {
                if refund {
                    return Settlement::Refund;
                }
                // No reader: the response ended at its headers, with no body to read.
                match readers.next().map(UsageReader::finish) {
                    Some(Ok(usage)) => Settlement::Used(usage),
                    Some(Err(e)) => {
                        metrics.tokens.unknown(e);
                        Settlement::Unknown
                    }
                    None => {
                        metrics
                            .tokens
                            .unknown(sluice_core::usage::UsageError::Missing);
                        Settlement::Unknown
                    }
                }
            })
            .collect();
        settle(
            &self.config,
            &self.reservations,
            &settlements,
            shared,
            &metrics,
        );
    }

    /// The request ended before its response did (client reset, upstream abort, local
    /// reply): everything reserved goes back.
    pub fn abandon(self, shared: &Shared) {
        let metrics = shared.metrics();
        let refunds = vec![Settlement::Refund; self.reservations.len()];
        settle(&self.config, &self.reservations, &refunds, shared, &metrics);
    }
}

fn settle(
    config: &FilterConfig,
    reservations: &[Reservation],
    settlements: &[Settlement],
    shared: &Shared,
    metrics: &Metrics,
) {
    let Some(now) = clock::now() else {
        // Without a clock nothing can be written; the reservations stand as the charge.
        metrics.errors.inc();
        return;
    };
    let cx = SettleContext {
        store: &shared.store,
        table: &config.table,
        lease_table: &config.lease_table,
        leases: &shared.leases,
        view: shared.view.get(),
        now,
    };
    let mut global_created = 0;
    let mut statistics = shared.statistics.borrow_mut();
    for (reservation, settlement) in reservations.iter().zip(settlements) {
        let settled = reservation.settle(*settlement, &cx);
        metrics.record_limiter(&settled.counters);
        metrics.tokens.record(*settlement, &settled);
        global_created += settled.global_created;
        let used = reservation.tokens_used(*settlement);
        if used > 0 {
            statistics.record_tokens_used(&reservation.rule_id, used);
        }
    }
    drop(statistics);
    if global_created > 0 {
        global_channel::note_new_buckets(now);
    }
}

fn response_header(name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok()?
}
