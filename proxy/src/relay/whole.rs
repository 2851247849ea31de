//! Answers that arrive whole (non-streamed answers and upstream errors): read with a size
//! cap and a deadline, and checked to be JSON before they reach the client.
//!
//! An engine answers JSON, errors included. A body that is not (an HTML error page from
//! an ingress in front of the engine, a plain-text "Internal Server Error", bytes from
//! something that is not an engine at all) would reach an OpenAI client as a decode
//! error far from its cause; the client gets a 502 in OpenAI's shape instead, quoting the
//! start of what the upstream said.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use crate::error::ProxyError;
use crate::upstream::InFlight;

/// The whole body of `resp`, or the error that ends the request: past `limit` bytes or
/// `timeout`, or when the body breaks off.
pub async fn read_whole(
    resp: reqwest::Response,
    in_flight: &InFlight,
    limit: u64,
    timeout: Duration,
) -> Result<Bytes, ProxyError> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut body = resp.bytes_stream();
    let read = async {
        let mut buf = BytesMut::new();
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| in_flight.broken(format!("broke off its answer: {e}")))?;
            if buf.len() + piece.len() > limit {
                return Err(in_flight.broken(format!(
                    "sent an answer longer than upstream.max_response_bytes ({limit} bytes)"
                )));
            }
            buf.extend_from_slice(&piece);
        }
        Ok(buf.freeze())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(ProxyError::UpstreamTimeout {
            upstream: in_flight.upstream().name.clone(),
            after_s: timeout.as_secs_f64(),
        }),
    }
}

/// `Ok` when `body` is JSON; otherwise the 502 that replaces it.
pub fn require_json(
    body: &[u8],
    status: reqwest::StatusCode,
    content_type: Option<&str>,
    in_flight: &InFlight,
) -> Result<(), ProxyError> {
    if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
        return Ok(());
    }
    let kind = content_type.map_or_else(|| "no content type".to_owned(), |t| format!("content type {t}"));
    let said = if body.is_empty() { "an empty body".to_owned() } else { format!("\"{}\"", quote(body)) };
    Err(in_flight.broken(format!("answered {status} with a body that is not JSON ({kind}): {said}")))
}

/// The start of a body, readable in an error message: at most 120 characters, control
/// characters and runs of whitespace as one space.
fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(480)]);
    let mut out = String::new();
    let mut space = false;
    for ch in text.chars() {
        if ch.is_whitespace() || ch.is_control() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        if out.chars().count() >= 120 {
            out.push('…');
            break;
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quotes_are_short_single_line_and_lossy() {
        assert_eq!(
            quote(b"<html>\r\n  <body>502 Bad Gateway</body>\n</html>"),
            "<html> <body>502 Bad Gateway</body> </html>"
        );
        assert_eq!(quote(b"\xff\xfeok"), "\u{fffd}\u{fffd}ok");
        let long = quote("x".repeat(1000).as_bytes());
        assert_eq!(long.chars().count(), 121);
        assert!(long.ends_with('…'));
    }
}
