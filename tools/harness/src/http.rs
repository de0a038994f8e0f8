//! One blocking HTTP/1.1 exchange on loopback, for Envoy's admin interface and for the
//! admin API's calls in the benchmark and `cargo xtask test`.
//!
//! Plain blocking I/O, so it works from any caller, async or not. Every request says
//! `Connection: close`: the end of the stream marks the end of the answer, and Envoy
//! answers HTTP/1.0 with 426 Upgrade Required.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// How long connecting, sending or reading may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One request with `headers` and `body`: `(status, body)`, a chunked body decoded.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .with_context(|| format!("sending {method} {path}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("reading the answer to {method} {path}"))?;
    parse_http_response(&response).with_context(|| format!("{method} {path}"))
}

fn parse_http_response(response: &[u8]) -> Result<(u16, String)> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers in the response")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status line in {head:?}"))?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunked body")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let Some(chunk) = body.get(..size) else {
            bail!("truncated chunk");
        };
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).context("truncated chunk")?;
    }
}

/// `text` as one query-string value: everything but unreserved characters percent-encoded.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n";
        assert_eq!(
            parse_http_response(plain).unwrap(),
            (200, "LIVE\n".to_string())
        );
        let chunked =
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked).unwrap(),
            (503, "abcde".to_string())
        );
    }

    #[test]
    fn a_truncated_chunk_is_an_error() {
        let truncated = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab";
        assert!(parse_http_response(truncated).is_err());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent_encode("^a\\.b$"), "%5Ea%5C.b%24");
    }
}
