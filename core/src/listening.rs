//! The line `sluice serve` prints on standard output once it listens:
//! `listening on http://127.0.0.1:8080`, or `listening on https://...` over TLS.
//!
//! It is the contract between the server and whatever starts it on port 0 (the test
//! harnesses, `cargo xtask demo` and `bench`, scripts): they learn the bound address and
//! the scheme from it. It lives here, the one crate all of them share, so the format has
//! one definition.

use std::fmt;
use std::net::SocketAddr;

/// What the admin API speaks on its listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    /// TLS (`sluice serve --tls-cert ... --tls-key ...`).
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Where `sluice serve` listens, as its listening line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub scheme: Scheme,
    pub addr: SocketAddr,
}

const PREFIX: &str = "listening on ";

impl Listening {
    /// Reads a listening line (surrounding whitespace ignored); `None` for any other line.
    pub fn parse(line: &str) -> Option<Listening> {
        let url = line.trim().strip_prefix(PREFIX)?;
        let (scheme, addr) = if let Some(addr) = url.strip_prefix("https://") {
            (Scheme::Https, addr)
        } else {
            (Scheme::Http, url.strip_prefix("http://")?)
        };
        Some(Listening {
            scheme,
            addr: addr.parse().ok()?,
        })
    }

    /// The base URL, e.g. `https://127.0.0.1:8443`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme.as_str(), self.addr)
    }
}

impl fmt::Display for Listening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.url())
    }
}

/// Where `sluice serve --rls-listen` serves Envoy's rate limit service, as the line it
/// prints before its listening line says: `rate limit service listening on
/// grpc://127.0.0.1:8081` (`grpcs://` over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlsListening {
    pub tls: bool,
    pub addr: SocketAddr,
}

const RLS_PREFIX: &str = "rate limit service listening on ";

impl RlsListening {
    /// Reads a rate limit service's listening line; `None` for any other line.
    pub fn parse(line: &str) -> Option<RlsListening> {
        let url = line.trim().strip_prefix(RLS_PREFIX)?;
        let (tls, addr) = match url.strip_prefix("grpcs://") {
            Some(addr) => (true, addr),
            None => (false, url.strip_prefix("grpc://")?),
        };
        Some(RlsListening {
            tls,
            addr: addr.parse().ok()?,
        })
    }
}

impl fmt::Display for RlsListening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "grpcs" } else { "grpc" };
        write!(f, "{RLS_PREFIX}{scheme}://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_service_lines_round_trip_and_are_not_listening_lines() {
        for tls in [false, true] {
            let rls = RlsListening {
                tls,
                addr: "127.0.0.1:8081".parse().unwrap(),
            };
            let line = rls.to_string();
            assert_eq!(RlsListening::parse(&line), Some(rls));
            assert_eq!(Listening::parse(&line), None, "{line}");
        }
        assert_eq!(
            RlsListening {
                tls: false,
                addr: "127.0.0.1:1".parse().unwrap()
            }
            .to_string(),
            "rate limit service listening on grpc://127.0.0.1:1"
        );
        assert_eq!(RlsListening::parse("listening on http://127.0.0.1:1"), None);
    }

    #[test]
    fn lines_round_trip() {
        for (scheme, addr) in [
            (Scheme::Http, "127.0.0.1:8080"),
            (Scheme::Https, "[::1]:8443"),
        ] {
            let listening = Listening {
                scheme,
                addr: addr.parse().unwrap(),
            };
            assert_eq!(Listening::parse(&listening.to_string()), Some(listening));
        }
        assert_eq!(
            Listening {
                scheme: Scheme::Https,
                addr: "127.0.0.1:8443".parse().unwrap()
            }
            .to_string(),
            "listening on https://127.0.0.1:8443"
        );
    }

    #[test]
    fn other_lines_are_not_listening_lines() {
        for line in [
            "",
            "listening on ",
            "listening on 127.0.0.1:8080",
            "listening on ftp://127.0.0.1:21",
            "listening on http://localhost:8080",
            "admin API ready",
        ] {
            assert_eq!(Listening::parse(line), None, "{line}");
        }
        assert_eq!(
            Listening::parse("  listening on http://127.0.0.1:1\n")
                .unwrap()
                .addr
                .port(),
            1
        );
    }
}
