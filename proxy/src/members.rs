//! A JSON object's members, read in one parse: each key with its value as the raw text
//! that was sent. The proxy reads the few fields it acts on from them, and rewrites an
//! object (a request body: Meridian's extension out, a budget or the hook's arguments in;
//! a continued stream's chunk: its id, labels and usage) by writing the members again
//! around the values it changes, every other value copied verbatim. A 220 KB prompt is
//! then copied, not parsed into a tree of strings and encoded again (which is what a
//! `serde_json::Map` round trip costs).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The members of a JSON object, in the order sent (duplicates kept, as sent).
#[derive(Debug, Default)]
pub struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// A value to put in a rewritten body.
pub enum Edit<'v> {
    /// Leave the member out.
    Remove,
    /// Put this JSON text in its place (appended when the body has no such member).
    Set(Cow<'v, str>),
}

impl<'a> Members<'a> {
    /// Every value sent under `key`.
    pub fn all<'s>(&'s self, key: &'s str) -> impl Iterator<Item = &'a RawValue> + 's {
        self.0.iter().filter(move |(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The value under `key`: the last one sent, as JSON parsers read duplicates.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.all(key).last()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.all(key).next().is_some()
    }

    /// The object written again with `edits` applied, in the order sent: an edited
    /// member where it was (every copy of it, when sent twice), a new one at the end.
    pub fn rewrite(&self, edits: &[(&str, Edit<'_>)], size_hint: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_hint + 64);
        out.push(b'{');
        let mut first = true;
        let mut member = |out: &mut Vec<u8>, key: &str, value: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_key(out, key);
            out.extend_from_slice(value.as_bytes());
        };
        for (key, value) in &self.0 {
            match edits.iter().find(|(k, _)| k == key) {
                None => member(&mut out, key, value.get()),
                Some((_, Edit::Remove)) => {}
                Some((_, Edit::Set(v))) => member(&mut out, key, v),
            }
        }
        for (key, edit) in edits {
            if let Edit::Set(v) = edit
                && !self.contains(key)
            {
                member(&mut out, key, v);
            }
        }
        out.push(b'}');
        out
    }
}

/// `"key":`, the key escaped as JSON requires.
fn write_key(out: &mut Vec<u8>, key: &str) {
    out.push(b'"');
    let mut start = 0;
    for (i, b) in key.bytes().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.extend_from_slice(&key.as_bytes()[start..i]);
        match escape {
            Some(e) => out.extend_from_slice(e),
            None => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
        }
        start = i + 1;
    }
    out.extend_from_slice(&key.as_bytes()[start..]);
    out.extend_from_slice(b"\":");
}

/// A key, borrowed from the body unless it had escapes to undo. (serde borrows a
/// `Cow<str>` only when told to: hence the wrapper.)
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some(Key(key)) = map.next_key()? {
                    let value: &'de RawValue = map.next_value()?;
                    out.push((key, value));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn members(s: &str) -> Members<'_> {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn untouched_values_are_copied_as_sent() {
        let body = r#"{ "model" : "m", "messages": [ {"role":"user", "content":"hi \u00e9"} ], "meridian": {"x":1} }"#;
        let out = members(body).rewrite(&[("meridian", Edit::Remove), ("budget", Edit::Set("7".into()))], 0);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"model":"m","messages":[ {"role":"user", "content":"hi \u00e9"} ],"budget":7}"#
        );
    }

    #[test]
    fn an_edited_member_keeps_its_place_and_keys_are_escaped_again() {
        let body = r#"{"a\"b":1,"n":2,"c\u0001":3}"#;
        let out = members(body).rewrite(&[("n", Edit::Set("5".into()))], 0);
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a\"b":1,"n":5,"c\u0001":3}"#);
        assert!(serde_json::from_str::<Members<'_>>("[1]").is_err(), "an array is not an object");
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "[a-z\"\\\\é\n ]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec(("[a-z\"]{1,4}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// A rewrite means what editing the parsed object means, whatever the members.
        #[test]
        fn a_rewrite_agrees_with_editing_the_parsed_object(
            object in prop::collection::vec(("[a-z\"\\\\]{1,5}", json_value()), 0..6),
            remove in "[a-z]{1,2}",
            set in "[a-z\"]{1,3}",
            value in json_value(),
            pretty in any::<bool>(),
        ) {
            let object: Map<String, Value> = object.into_iter().collect();
            let body = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                serde_json::to_string(&object).unwrap()
            };
            let text = value.to_string();
            let edits = [(remove.as_str(), Edit::Remove), (set.as_str(), Edit::Set(text.as_str().into()))];
            let out = members(&body).rewrite(&edits, body.len());
            let got: Map<String, Value> = serde_json::from_slice(&out).unwrap();
            let mut want = object.clone();
            want.remove(&remove);
            want.insert(set.clone(), value.clone());
            if remove == set {
                // Both edits name one member: the first edit listed wins where it stands.
                want.remove(&remove);
                if !object.contains_key(&remove) {
                    want.insert(set, value);
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
