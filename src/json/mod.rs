//! Reading one field out of a raw JSON body without building or re-serializing it.

/// Implements [`DeserializeSeed`] for a seed that is its own visitor: the
/// deserializer is asked for its value with `$how` (such as `deserialize_any`).
/// `[$generics]` are the impl's parameters beside `'de`.
macro_rules! visitor_seed {
    ([$($generics:tt)*] $seed:ty => $value:ty, $how:ident) => {
        impl<'de, $($generics)*> serde::de::DeserializeSeed<'de> for $seed {
            type Value = $value;

            fn deserialize<D: serde::de::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<$value, D::Error> {
                d.$how(self)
            }
        }
    };
}

mod borrowed;
mod plain;
mod seed;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use serde::de::DeserializeSeed;

pub(crate) use borrowed::{strings, MAX_STRINGS};
use plain::{first_key_string, Leaf, Plain};
use seed::{Found, MultiSeed, PathSeed};

/// The JSON reader for the fuzz targets under `fuzz/`, re-exported as the crate's
/// hidden `__fuzz` module. The reader is private to the crate; the fuzz crate
/// enables the `__fuzz` feature, without which this module does not exist. Not
/// public API: hidden from the docs and outside semver.
#[cfg(feature = "__fuzz")]
pub mod fuzz {
    /// What the crate's `json::field` answers for `path` in `body`: the value's
    /// text, or why there is none.
    ///
    /// # Errors
    /// The text of the reader's error.
    pub fn json_field(body: &[u8], path: &[&str]) -> Result<String, String> {
        super::field(body, path).map_err(|e| e.to_string())
    }
}

/// Why a field could not be read from a JSON body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum FieldError {
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
/// # Errors
/// [`FieldError`] when the body is not JSON, the path is absent, or the value is not
/// a scalar.
pub(crate) fn field(body: &[u8], path: &[&str]) -> Result<String, FieldError> {
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
/// # Errors
/// As [`field`], for the part of the body read before the value was found.
pub(crate) fn first_field(body: &[u8], path: &[&str]) -> Result<String, FieldError> {
    if let Some(value) = first_key_string(body, path) {
        return Ok(value);
    }
    first_field_serde(body, path)
}

/// [`first_field`] through serde, for every shape.
fn first_field_serde(body: &[u8], path: &[&str]) -> Result<String, FieldError> {
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

/// Most paths [`fields_with`] reads in one pass.
const MAX_PATHS: usize = 8;

/// Reads several paths in **one** pass over `body` and hands the answers to `read`:
/// entry `i` is `field(body, paths[i]).ok()`, the same answer (the whole body is
/// checked to be valid JSON, as [`field`] does), for a third of the cost of three
/// calls. The answers are borrowed (from the body itself when they need no
/// unescaping), so a caller that only parses a value does not allocate it. With more
/// than 8 paths, it calls [`field`] for each.
pub(crate) fn fields_with<P: AsRef<str>, R, const N: usize>(
    body: &[u8],
    paths: [&[P]; N],
    read: impl FnOnce([Option<&str>; N]) -> R,
) -> R {
    if N > MAX_PATHS {
        let owned = paths.map(|path| {
            let path: Vec<&str> = path.iter().map(AsRef::as_ref).collect();
            field(body, &path).ok()
        });
        return read(std::array::from_fn(|i| owned[i].as_deref()));
    }
    let live = (0..N).fold(0u8, |mask, i| mask | 1 << i);
    if let Some(found) = Plain::scan(body, &paths, live) {
        return read(found.map(|f| match f {
            Leaf::Value(v) if !v.is_empty() => std::str::from_utf8(v).ok(),
            _ => None,
        }));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = MultiSeed::<P, N> {
        paths: &paths,
        live,
        depth: 0,
    }
    .deserialize(&mut de);
    match found {
        Ok(found) if de.end().is_ok() => read(std::array::from_fn(|i| match &found[i] {
            Found::Value(v) if !v.is_empty() => Some(v.as_str()),
            _ => None,
        })),
        _ => read([None; N]),
    }
}
