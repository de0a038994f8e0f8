//! One load generator for the end-to-end tests, the benchmark and the demo.
//!
//! A [`Load`] drives requests at one or more targets over keep-alive HTTP/1.1
//! connections (bounded concurrency: one request in flight per connection), each sending
//! its next request when the last is answered, or on its own clock when paced. It runs
//! for a duration, up to a number of requests, or until a [`Stop`] is used: never a fixed
//! count that assumes a speed. Answers are counted by status ([`Tally`]) in total, per
//! target, and when asked per client key and per time bin, with the slowest answer of
//! each; [`Live`] counts can be read while it runs.
//!
//! * [`Load::run`] blocks on a runtime of its own (the benchmark), [`Load::drive`] runs on
//!   the caller's (the demo) and hands the connections back.
//! * [`Client`]: connections to one address kept across runs, driven from blocking code
//!   (the end-to-end tests), over TCP or a caller's [`Dialer`] (their TLS).

mod client;
mod connection;
mod drive;
mod message;
mod tally;

pub use client::Client;
pub use connection::{Connection, Dialer, Stream, tcp};
pub use drive::Load;
/// What request bodies are made of: built once and cloned per request without copying.
pub use hyper::body::Bytes;
pub use message::{Req, Resp};
pub use tally::{Live, Outcome, Stop, Tally};
