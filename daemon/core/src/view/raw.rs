//! JSON text assembled from pieces that already are JSON.
//!
//! Content blocks keep the exact JSON text they had in the transcript. When a stage
//! changes a block (a preview, a placeholder, a cache marker) the new text is put
//! together from the unchanged pieces of the old one, so long strings are never
//! unescaped and escaped again, and a request serializes by copying text.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;

/// The members of one JSON object, in order, each value as raw JSON text.
pub(crate) struct Fields<'a>(pub(crate) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    /// Reads an object; `None` when the text is not a JSON object.
    pub(crate) fn parse(json: &'a str) -> Option<Fields<'a>> {
        serde_json::from_str(json).ok()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// A member that is a JSON string, unescaped (borrowed when it has no escapes).
    pub(crate) fn str(&self, key: &str) -> Option<Cow<'a, str>> {
        self.get(key).and_then(as_str)
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// True when a member's name is not in `known`.
    pub(crate) fn has_other_than(&self, known: &[&str]) -> bool {
        self.0.iter().any(|(k, _)| !known.contains(&k.as_ref()))
    }

    /// The object again, with the members in `known` only.
    pub(crate) fn keep_only(&self, known: &[&str]) -> Arc<RawValue> {
        let pairs: Vec<(&str, &RawValue)> =
            self.0.iter().filter(|(k, _)| known.contains(&k.as_ref())).map(|(k, v)| (k.as_ref(), *v)).collect();
        object(&pairs)
    }

    /// The object again with `key` set to `value` (replaced in place, or added last).
    pub(crate) fn with(&self, key: &str, value: &RawValue) -> Arc<RawValue> {
        self.with_all(&[(key, value)])
    }

    /// The object again with each `(key, value)` set (replaced in place, or added last).
    pub(crate) fn with_all(&self, edits: &[(&str, &RawValue)]) -> Arc<RawValue> {
        let mut pairs: Vec<(&str, &RawValue)> = self.0.iter().map(|(k, v)| (k.as_ref(), *v)).collect();
        for &(key, value) in edits {
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some(pair) => pair.1 = value,
                None => pairs.push((key, value)),
            }
        }
        object(&pairs)
    }

    /// The object again without `key`.
    pub(crate) fn without(&self, key: &str) -> Arc<RawValue> {
        let pairs: Vec<(&str, &RawValue)> =
            self.0.iter().filter(|(k, _)| k != key).map(|(k, v)| (k.as_ref(), *v)).collect();
        object(&pairs)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    out.push((key.0, value));
                }
                Ok(Fields(out))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// A string that borrows from the input when it has no escapes.
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(StrVisitor(std::marker::PhantomData))
    }
}

/// The string a raw JSON value holds, if it is a string.
pub(crate) fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Str<'_>>(raw.get()).ok().map(|s| s.0)
}

/// Serializes as a JSON object whose values are raw JSON text.
struct RawObject<'a, 'b>(&'b [(&'b str, &'a RawValue)]);

impl Serialize for RawObject<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A JSON object from raw members.
pub(crate) fn object(pairs: &[(&str, &RawValue)]) -> Arc<RawValue> {
    to_raw(&RawObject(pairs))
}

/// Any serializable value as raw JSON text. Serializing plain data cannot fail; should it
/// ever, the value becomes `null` rather than an error, as the core has no errors to give.
pub(crate) fn to_raw<T: Serialize + ?Sized>(value: &T) -> Arc<RawValue> {
    match serde_json::value::to_raw_value(value) {
        Ok(boxed) => Arc::from(boxed),
        Err(_) => Arc::from(RawValue::NULL.to_owned()),
    }
}

/// A Rust string as a raw JSON string literal.
pub(crate) fn string(s: &str) -> Arc<RawValue> {
    to_raw(s)
}

/// A copy of borrowed raw JSON that can be shared.
pub(crate) fn shared(raw: &RawValue) -> Arc<RawValue> {
    Arc::from(raw.to_owned())
}

/// True when a raw JSON string holds only whitespace (or nothing). Reads the escaped text
/// directly so long strings are not unescaped just to be checked.
pub(crate) fn is_blank_string(raw: &RawValue) -> bool {
    let text = raw.get();
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'\\' => match bytes.get(i + 1) {
                Some(b'n' | b't' | b'r') => i += 2,
                Some(b'u') => match bytes.get(i + 2..i + 6) {
                    Some(b"0020" | b"000a" | b"000A" | b"0009" | b"000d" | b"000D") => i += 6,
                    _ => return false,
                },
                _ => return false,
            },
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn fields_keep_order_and_rebuild() {
        let text = r#"{"type":"tool_use","id":"t\u00e9","caller":{"a":1},"input":{}}"#;
        let fields = Fields::parse(text).unwrap();
        assert_eq!(fields.str("id").unwrap(), "t\u{e9}");
        assert!(fields.has_other_than(&["type", "id", "input"]));
        let kept = fields.keep_only(&["type", "id", "input"]);
        assert_eq!(kept.get(), r#"{"type":"tool_use","id":"t\u00e9","input":{}}"#);
        let marked = fields.with("cache_control", &raw(r#"{"type":"ephemeral"}"#));
        assert!(marked.get().ends_with(r#""cache_control":{"type":"ephemeral"}}"#));
        assert_eq!(Fields::parse(marked.get()).unwrap().without("cache_control").get(), text);
        assert!(Fields::parse("[1]").is_none());
    }

    #[test]
    fn blank_strings() {
        for blank in [r#""""#, r#"" \n\t""#, r#""\n\u0020  \r""#] {
            assert!(is_blank_string(&raw(blank)), "{blank}");
        }
        for text in [r#""a""#, r#"" \u00e9""#, r#""\"""#, "12"] {
            assert!(!is_blank_string(&raw(text)), "{text}");
        }
    }
}
