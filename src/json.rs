//! Reading one field out of a raw JSON body without building or re-serializing it.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why a field could not be read from a JSON body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The body is not valid JSON.
    #[error("body is not valid JSON: {0}")]
    InvalidJson(String),
    /// The path does not lead to a value.
    #[error("field `{0}` is missing")]
    Missing(String),
    /// The value at the path is neither a string nor a number.
    #[error("field `{0}` is not a string or a number")]
    NotScalar(String),
}

/// Reads the string or number at `path` (object keys, outermost first) from `body`.
///
/// Fields off the path are skipped without being built; the result is the value's
/// text (a number is returned as written). Empty strings count as missing.
///
/// ```
/// let body = br#"{"id":"evt_1","data":{"object":{"id":"ch_9","amount":5}}}"#;
/// assert_eq!(webhook_guard::json::field(body, &["id"]).unwrap(), "evt_1");
/// assert_eq!(webhook_guard::json::field(body, &["data", "object", "id"]).unwrap(), "ch_9");
/// assert_eq!(webhook_guard::json::field(body, &["data", "object", "amount"]).unwrap(), "5");
/// ```
///
/// # Errors
/// [`FieldError`] when the body is not JSON, the path is absent, or the value is not
/// a scalar.
pub fn field(body: &[u8], path: &[&str]) -> Result<String, FieldError> {
    let joined = || path.join(".");
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = PathSeed { path, stop: None }
        .deserialize(&mut de)
        .map_err(|e| FieldError::InvalidJson(e.to_string()))?;
    de.end()
        .map_err(|e| FieldError::InvalidJson(e.to_string()))?;
    match found {
        Found::Value(v) if !v.is_empty() => Ok(v),
        Found::Value(_) | Found::Missing => Err(FieldError::Missing(joined())),
        Found::NotScalar => Err(FieldError::NotScalar(joined())),
    }
}

/// Like [`field`], but stops reading as soon as the value is found: the rest of the
/// body is not checked to be valid JSON. For bodies whose integrity is already
/// established — a verified signature — where the id usually comes first (Stripe's
/// `id`), so the cost of finding it does not grow with the body.
///
/// ```
/// let body = br#"{"id":"evt_1","data":{"big":"..."}}"#;
/// assert_eq!(webhook_guard::json::first_field(body, &["id"]).unwrap(), "evt_1");
/// ```
///
/// # Errors
/// As [`field`], for the part of the body read before the value was found.
pub fn first_field(body: &[u8], path: &[&str]) -> Result<String, FieldError> {
    let stop = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = PathSeed {
        path,
        stop: Some(&stop),
    }
    .deserialize(&mut de);
    if let Some(v) = stop.into_inner() {
        return Ok(v);
    }
    let found = read.map_err(|e| FieldError::InvalidJson(e.to_string()))?;
    de.end()
        .map_err(|e| FieldError::InvalidJson(e.to_string()))?;
    match found {
        Found::Value(v) if !v.is_empty() => Ok(v),
        Found::Value(_) | Found::Missing => Err(FieldError::Missing(path.join("."))),
        Found::NotScalar => Err(FieldError::NotScalar(path.join("."))),
    }
}

enum Found {
    Value(String),
    Missing,
    NotScalar,
}

struct PathSeed<'p> {
    path: &'p [&'p str],
    /// Where to leave the value when reading stops as soon as it is found.
    stop: Option<&'p RefCell<Option<String>>>,
}

/// The error message that carries "found, stop reading" out of serde.
const STOPPED: &str = "webhook-guard: field found";

impl<'de> DeserializeSeed<'de> for PathSeed<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PathSeed<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let Some((head, rest)) = self.path.split_first() else {
            while map.next_key_seed(Skip)?.is_some() {
                map.next_value_seed(Skip)?;
            }
            return Ok(Found::NotScalar);
        };
        let mut found = Found::Missing;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if matches!(found, Found::Missing) && key == *head {
                found = map.next_value_seed(PathSeed {
                    path: rest,
                    stop: self.stop,
                })?;
                if let (Some(stop), Found::Value(v)) = (self.stop, &mut found) {
                    if !v.is_empty() {
                        *stop.borrow_mut() = Some(std::mem::take(v));
                        return Err(de::Error::custom(STOPPED));
                    }
                }
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(if self.path.is_empty() {
            Found::NotScalar
        } else {
            Found::Missing
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Found, E> {
        Ok(self.scalar(v.to_owned()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Found, E> {
        Ok(self.scalar(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Found, E> {
        Ok(self.scalar(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Found, E> {
        Ok(self.other())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Found, E> {
        Ok(self.other())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Found, E> {
        Ok(Found::Missing)
    }
}

/// Skips one value. Unlike `IgnoredAny`, it goes through `deserialize_any` at every
/// level, so serde_json's nesting limit (128) applies to skipped values too.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

impl PathSeed<'_> {
    fn scalar(&self, v: String) -> Found {
        if self.path.is_empty() {
            Found::Value(v)
        } else {
            Found::Missing
        }
    }

    fn other(&self) -> Found {
        if self.path.is_empty() {
            Found::NotScalar
        } else {
            Found::Missing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_fields_and_skips_the_rest() {
        let body = br#"{"a":[1,{"id":"x"}],"id":"top","n":{"id":42}}"#;
        assert_eq!(field(body, &["id"]).unwrap(), "top");
        assert_eq!(field(body, &["n", "id"]).unwrap(), "42");
        assert_eq!(
            field(body, &["a", "id"]),
            Err(FieldError::Missing("a.id".into()))
        );
        assert_eq!(field(body, &["n"]), Err(FieldError::NotScalar("n".into())));
    }

    #[test]
    fn first_field_stops_at_the_value_and_agrees_with_field() {
        let body = br#"{"id":"evt_1","data":{"object":{"id":"ch_9"}},"n":5}"#;
        for path in [
            &["id"][..],
            &["data", "object", "id"],
            &["n"],
            &["missing"],
            &["data"],
        ] {
            assert_eq!(first_field(body, path), field(body, path), "{path:?}");
        }
        // The tail after the value is not read: a verified body's id is found even if
        // something after it is broken; before the value, errors are reported.
        assert_eq!(
            first_field(br#"{"id":"evt_2", oops"#, &["id"]).unwrap(),
            "evt_2"
        );
        assert!(field(br#"{"id":"evt_2", oops"#, &["id"]).is_err());
        assert!(matches!(
            first_field(br#"{oops "id":"x"}"#, &["id"]),
            Err(FieldError::InvalidJson(_))
        ));
        assert_eq!(
            first_field(br#"{"id":"","id":"b"}"#, &["id"]),
            Err(FieldError::Missing("id".into()))
        );
    }

    #[test]
    fn escaped_keys_and_values_are_decoded() {
        let body = br#"{"i\u0064":"ev\"t"}"#;
        assert_eq!(field(body, &["id"]).unwrap(), "ev\"t");
    }

    #[test]
    fn bad_json_and_deep_nesting_are_errors() {
        assert!(matches!(
            field(b"{", &["id"]),
            Err(FieldError::InvalidJson(_))
        ));
        assert!(matches!(
            field(br#"{"id":"a"} trailing"#, &["id"]),
            Err(FieldError::InvalidJson(_))
        ));
        // Nesting deeper than 128 levels is refused, on the path or off it.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            field(deep.as_bytes(), &["id"]),
            Err(FieldError::InvalidJson(_))
        ));
        let deep = format!(r#"{{"x":{}{}}}"#, "[".repeat(100_000), "]".repeat(99_999));
        assert!(matches!(
            field(deep.as_bytes(), &["id"]),
            Err(FieldError::InvalidJson(_))
        ));
        assert_eq!(
            field(br#"{"id":""}"#, &["id"]),
            Err(FieldError::Missing("id".into()))
        );
        assert_eq!(
            field(br#"{"id":null}"#, &["id"]),
            Err(FieldError::Missing("id".into()))
        );
    }
}
