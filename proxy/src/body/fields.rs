//! Type and range checks for the OpenAI request fields the proxy reads or rewrites.
//!
//! The proxy relays most of a request untouched, but the fields it acts on (`stream`,
//! the token limits a continuation shortens, `messages` it appends to, Meridian's own
//! extension) must have the shape it expects. A wrong one gets a 400 naming the field
//! (`param`), as OpenAI's API does, before anything reaches an engine.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::MeridianExtension;
use crate::error::ProxyError;

/// The largest token limit accepted: no model's context comes near it, and it keeps the
/// continuation's arithmetic (limit minus tokens spent) far from overflow.
pub const MAX_TOKEN_LIMIT: u64 = u32::MAX as u64;

fn wrong_type(name: &'static str, expected: &str) -> ProxyError {
    ProxyError::bad_request(format!("{name} must be {expected}"), Some(name), "invalid_type")
}

/// A field's value, unless it is absent or `null` (which OpenAI's API treats alike).
fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
}

/// A field read as `T`; absent or `null` is `None`.
pub fn typed<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    name: &'static str,
    expected: &str,
) -> Result<Option<T>, ProxyError> {
    present(raw).map(|r| serde_json::from_str(r.get()).map_err(|_| wrong_type(name, expected))).transpose()
}

/// `max_tokens` / `max_completion_tokens`: a whole number from 1 to [`MAX_TOKEN_LIMIT`].
pub fn token_limit(raw: Option<&RawValue>, name: &'static str) -> Result<(), ProxyError> {
    let Some(raw) = present(raw) else { return Ok(()) };
    let text = raw.get();
    let is_integer = text.bytes().enumerate().all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
        && text.bytes().any(|b| b.is_ascii_digit());
    if !is_integer {
        return Err(wrong_type(name, "an integer"));
    }
    match text.parse::<i128>() {
        Ok(n) if (1..=i128::from(MAX_TOKEN_LIMIT)).contains(&n) => Ok(()),
        _ => Err(ProxyError::bad_request(
            format!("{name} must be between 1 and {MAX_TOKEN_LIMIT}, got {}", shorten(text)),
            Some(name),
            "invalid_value",
        )),
    }
}

/// A field whose JSON value must start with a byte `accept` allows (`[` for an array).
pub fn shaped(
    raw: Option<&RawValue>,
    name: &'static str,
    expected: &str,
    accept: impl Fn(u8) -> bool,
) -> Result<(), ProxyError> {
    match present(raw) {
        Some(r) if !r.get().bytes().next().is_some_and(accept) => Err(wrong_type(name, expected)),
        _ => Ok(()),
    }
}

/// Meridian's extension object, strictly: unknown fields are refused, so a misspelt
/// budget is an error rather than silently ignored.
pub fn extension(raw: Option<&RawValue>) -> Result<Option<MeridianExtension>, ProxyError> {
    let Some(raw) = present(raw) else { return Ok(None) };
    serde_json::from_str(raw.get()).map(Some).map_err(|e| {
        ProxyError::bad_request(format!("bad meridian extension: {e}"), Some("meridian"), "invalid_json")
    })
}

/// Deepest nesting of arrays and objects accepted: serde_json's own limit, which the
/// proxy meets when it rewrites a body, and far beyond any real request.
pub const MAX_NESTING: usize = 128;

/// Whether `body` (valid UTF-8 JSON or not) nests arrays and objects deeper than `max`.
/// serde_json skips a field it does not read without a depth limit, so such a body would
/// otherwise reach the engine, whose own parser may fail on it less gracefully.
///
/// Most of a request's bytes are inside strings (the prompt), which are crossed with
/// `memchr` rather than byte by byte: about 10 µs for a 220 KB prompt.
pub fn nests_deeper_than(body: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'"' => {
                // To the closing quote, over escaped characters.
                loop {
                    // A body may end anywhere, even right after a backslash.
                    let Some(rest) = body.get(i + 1..) else { return false };
                    match memchr::memchr2(b'"', b'\\', rest) {
                        None => return false,
                        Some(j) if rest[j] == b'\\' => i += j + 2,
                        Some(j) => {
                            i += j + 1;
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// At most 40 characters of a client's value, for an error message.
fn shorten(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn limit(s: &str) -> Result<(), (Option<&'static str>, &'static str)> {
        token_limit(Some(&raw(s)), "max_tokens").map_err(|e| match e {
            ProxyError::BadRequest { param, code, .. } => (param, code),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn token_limits_are_whole_numbers_in_range() {
        for ok in ["1", "512", "4294967295", "null"] {
            assert_eq!(limit(ok), Ok(()), "{ok}");
        }
        for bad in ["0", "-1", "4294967296", "100000000000000000000000000000000000000000"] {
            assert_eq!(limit(bad), Err((Some("max_tokens"), "invalid_value")), "{bad}");
        }
        for bad in ["1.5", "1e30", "-0.5", "\"ten\"", "true", "[1]"] {
            assert_eq!(limit(bad), Err((Some("max_tokens"), "invalid_type")), "{bad}");
        }
    }

    #[test]
    fn nesting_is_measured_outside_strings() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nests_deeper_than(deep(128).as_bytes(), 128));
        assert!(nests_deeper_than(deep(129).as_bytes(), 128));
        let quoted = format!(r#"{{"a":"{}","b":"\"[[[","c":[[1]]}}"#, "[".repeat(500));
        assert!(!nests_deeper_than(quoted.as_bytes(), 3), "brackets inside strings do not count");
        assert!(nests_deeper_than(quoted.as_bytes(), 2));
        assert!(nests_deeper_than(br#"{"a":[[{"b":1}]]}"#, 3));
        assert!(!nests_deeper_than(br#"{"unterminated":"[[[[["#, 1));
        // Found by the request_body fuzz target: a body ending in an escape's backslash.
        assert!(!nests_deeper_than(b"{l\"ode\\\\(( \\", 1));
        assert!(!nests_deeper_than(b"\"\\", 1));
    }

    #[test]
    fn shapes_and_types_name_the_field() {
        assert!(shaped(Some(&raw("[]")), "messages", "an array", |c| c == b'[').is_ok());
        assert!(shaped(Some(&raw("null")), "messages", "an array", |c| c == b'[').is_ok());
        let Err(ProxyError::BadRequest { param, code, .. }) =
            shaped(Some(&raw("5")), "messages", "an array", |c| c == b'[')
        else {
            panic!("accepted")
        };
        assert_eq!((param, code), (Some("messages"), "invalid_type"));
        assert_eq!(typed::<bool>(Some(&raw("null")), "stream", "a boolean").unwrap(), None);
        assert!(typed::<bool>(Some(&raw("\"yes\"")), "stream", "a boolean").is_err());
    }
}
