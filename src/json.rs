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

/// [`first_field`] for its most common case, without serde: a one-key `path` that is
/// the **first** key of the top-level object, spelled without escapes, whose value is
/// a non-empty string without escapes or control characters. serde_json would read
/// exactly these bytes (the same whitespace, the same checks on the key and the value,
/// UTF-8 included) and stop at the same place, so the answer is the same. Any other
/// shape answers `None`, and [`first_field`] goes through serde.
fn first_key_string(body: &[u8], path: &[&str]) -> Option<String> {
    let [head] = path else {
        return None;
    };
    let mut at = skip_whitespace(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_whitespace(body, at + 1);
    let (key, next) = plain_string(body, at)?;
    if key != head.as_bytes() {
        return None;
    }
    at = skip_whitespace(body, next);
    if body.get(at) != Some(&b':') {
        return None;
    }
    at = skip_whitespace(body, at + 1);
    let (value, _) = plain_string(body, at)?;
    if value.is_empty() {
        return None;
    }
    std::str::from_utf8(value).ok().map(str::to_owned)
}

/// JSON whitespace as serde_json skips it.
fn skip_whitespace(body: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = body.get(at) {
        at += 1;
    }
    at
}

/// The raw contents of the string starting at `at` and the index after its closing
/// quote, if it holds no escape and no control character (else `None`).
fn plain_string(body: &[u8], at: usize) -> Option<(&[u8], usize)> {
    if body.get(at) != Some(&b'"') {
        return None;
    }
    let rest = &body[at + 1..];
    let end = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    (rest[end] == b'"').then(|| (&rest[..end], at + 1 + end + 1))
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

/// What a path answers at one value, as [`Found`], borrowing the body (a string's
/// raw bytes, valid UTF-8 since the whole body is).
#[derive(Clone, Copy)]
enum Leaf<'b> {
    Value(&'b [u8]),
    Missing,
    NotScalar,
}

/// Deepest nesting [`Plain`] reads; serde_json's limit is 128.
const PLAIN_MAX_NESTING: usize = 100;

/// [`fields_with`] without serde, for the documents webhooks send: valid UTF-8, strings
/// without escapes or control characters, integers of at most 18 digits written
/// canonically (`0`, `-7`, `1700000000`: never `-0`, leading zeros, fractions or
/// exponents), nesting up to 100 levels. It answers what [`MultiSeed`] answers, and
/// gives up (`None`) on anything else: another number, an escape, broken syntax,
/// deeper nesting. Then [`fields_with`] asks serde_json, which decides. So a document
/// this reader takes is one serde_json takes too, with the same values (a canonical
/// integer's `to_string` is its text).
struct Plain<'b> {
    body: &'b [u8],
    at: usize,
}

impl<'b> Plain<'b> {
    fn scan<P: AsRef<str>, const N: usize>(
        body: &'b [u8],
        paths: &[&[P]; N],
        live: u8,
    ) -> Option<[Leaf<'b>; N]> {
        // One check for every string in the body: a string of a valid UTF-8 document
        // lies between two ASCII quotes, so it is valid UTF-8 too.
        std::str::from_utf8(body).ok()?;
        let mut reader = Plain { body, at: 0 };
        reader.skip_whitespace();
        let found = reader.value(paths, live, 0, 0)?;
        reader.skip_whitespace();
        (reader.at == body.len()).then_some(found)
    }

    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        self.at = skip_whitespace(self.body, self.at);
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// A string without escapes or control characters, raw.
    fn string(&mut self) -> Option<&'b [u8]> {
        let (raw, next) = plain_string(self.body, self.at)?;
        self.at = next;
        Some(raw)
    }

    /// A canonical integer of at most 18 digits, as written.
    fn integer(&mut self) -> Option<&'b [u8]> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let digits = self.body[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let first = self.peek()?;
        if digits == 0 || digits > 18 || (first == b'0' && (digits > 1 || negative)) {
            return None;
        }
        self.at += digits;
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(&self.body[start..self.at])
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.body[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// Reads one value; `live` holds the paths that lead here, having matched their
    /// first `depth` keys.
    fn value<P: AsRef<str>, const N: usize>(
        &mut self,
        paths: &[&[P]; N],
        live: u8,
        depth: usize,
        nesting: usize,
    ) -> Option<[Leaf<'b>; N]> {
        if live == 0 {
            self.skip(nesting)?;
            return Some([Leaf::Missing; N]);
        }
        let ends_here = |leaf: Leaf<'b>| {
            std::array::from_fn(|i| {
                if live & (1 << i) != 0 && paths[i].len() == depth {
                    leaf
                } else {
                    Leaf::Missing
                }
            })
        };
        match self.peek()? {
            b'{' => self.object(paths, live, depth, nesting + 1),
            b'[' => {
                self.array(nesting + 1)?;
                Some(ends_here(Leaf::NotScalar))
            }
            b'"' => self.string().map(|s| ends_here(Leaf::Value(s))),
            b'-' | b'0'..=b'9' => self.integer().map(|s| ends_here(Leaf::Value(s))),
            b't' => self.literal(b"true").map(|()| ends_here(Leaf::NotScalar)),
            b'f' => self.literal(b"false").map(|()| ends_here(Leaf::NotScalar)),
            b'n' => self.literal(b"null").map(|()| [Leaf::Missing; N]),
            _ => None,
        }
    }

    /// Reads one value that no path wants.
    fn skip(&mut self, nesting: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.skip_object(nesting + 1),
            b'[' => self.array(nesting + 1),
            b'"' => self.string().map(drop),
            b'-' | b'0'..=b'9' => self.integer().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => None,
        }
    }

    fn skip_object(&mut self, nesting: usize) -> Option<()> {
        if nesting > PLAIN_MAX_NESTING {
            return None;
        }
        self.eat(b'{')?;
        self.skip_whitespace();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.string()?;
            self.skip_whitespace();
            self.eat(b':')?;
            self.skip_whitespace();
            self.skip(nesting)?;
            self.skip_whitespace();
            if self.eat(b'}').is_some() {
                return Some(());
            }
            self.eat(b',')?;
            self.skip_whitespace();
        }
    }

    fn array(&mut self, nesting: usize) -> Option<()> {
        if nesting > PLAIN_MAX_NESTING {
            return None;
        }
        self.eat(b'[')?;
        self.skip_whitespace();
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            self.skip(nesting)?;
            self.skip_whitespace();
            if self.eat(b']').is_some() {
                return Some(());
            }
            self.eat(b',')?;
            self.skip_whitespace();
        }
    }

    fn object<P: AsRef<str>, const N: usize>(
        &mut self,
        paths: &[&[P]; N],
        live: u8,
        depth: usize,
        nesting: usize,
    ) -> Option<[Leaf<'b>; N]> {
        if nesting > PLAIN_MAX_NESTING {
            return None;
        }
        self.eat(b'{')?;
        // As MultiSeed: paths ending at an object answer NotScalar.
        let mut found: [Leaf<'b>; N] = std::array::from_fn(|i| {
            if live & (1 << i) != 0 && paths[i].len() == depth {
                Leaf::NotScalar
            } else {
                Leaf::Missing
            }
        });
        let deeper = (0..N)
            .filter(|&i| live & (1 << i) != 0 && paths[i].len() > depth)
            .fold(0u8, |mask, i| mask | 1 << i);
        self.skip_whitespace();
        if self.eat(b'}').is_some() {
            return Some(found);
        }
        loop {
            let key = self.string()?;
            self.skip_whitespace();
            self.eat(b':')?;
            self.skip_whitespace();
            // As MultiSeed: a path takes the first key that gives it an answer.
            let mut wanted = 0u8;
            for (i, leaf) in found.iter().enumerate() {
                if deeper & (1 << i) != 0
                    && matches!(leaf, Leaf::Missing)
                    && paths[i][depth].as_ref().as_bytes() == key
                {
                    wanted |= 1 << i;
                }
            }
            if wanted == 0 {
                self.skip(nesting)?;
            } else {
                let sub = self.value(paths, wanted, depth + 1, nesting)?;
                for i in 0..N {
                    if wanted & (1 << i) != 0 {
                        found[i] = sub[i];
                    }
                }
            }
            self.skip_whitespace();
            if self.eat(b'}').is_some() {
                return Some(found);
            }
            self.eat(b',')?;
            self.skip_whitespace();
        }
    }
}

/// [`PathSeed`] for several paths at once. `live` holds the paths that lead to the
/// value being read (they share their first `depth` keys); the answer holds, for each
/// of them, what [`PathSeed`] would answer for the rest of its path, and `Missing`
/// for the others. Off-path values are skipped with [`Skip`], as [`PathSeed`] does,
/// so the same nesting limit applies.
struct MultiSeed<'p, P, const N: usize> {
    paths: &'p [&'p [P]; N],
    live: u8,
    depth: usize,
}

fn all_missing<const N: usize>() -> [Found; N] {
    std::array::from_fn(|_| Found::Missing)
}

impl<P: AsRef<str>, const N: usize> MultiSeed<'_, P, N> {
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.paths.len()).filter(|i| self.live & (1 << i) != 0)
    }

    /// What every live path answers for a value that is not a map: `at_end` for the
    /// paths that end here, `Missing` for those that go deeper.
    fn leaf(&self, mut at_end: impl FnMut() -> Found) -> [Found; N] {
        let mut found = all_missing();
        for i in self.live() {
            if self.paths[i].len() == self.depth {
                found[i] = at_end();
            }
        }
        found
    }
}

impl<'de, P: AsRef<str>, const N: usize> DeserializeSeed<'de> for MultiSeed<'_, P, N> {
    type Value = [Found; N];

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<[Found; N], D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, P: AsRef<str>, const N: usize> Visitor<'de> for MultiSeed<'_, P, N> {
    type Value = [Found; N];

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<[Found; N], A::Error> {
        // Paths ending at a map answer NotScalar; the others look for their next key.
        let mut found = self.leaf(|| Found::NotScalar);
        let deeper = self
            .live()
            .filter(|&i| self.paths[i].len() > self.depth)
            .fold(0u8, |mask, i| mask | 1 << i);
        // The next key of each path, `""` for the others (masked out below).
        let heads: [&str; N] = std::array::from_fn(|i| {
            if deeper & (1 << i) != 0 {
                self.paths[i][self.depth].as_ref()
            } else {
                ""
            }
        });
        while let Some(matching) = map.next_key_seed(KeyIn(&heads))? {
            // Like PathSeed: a path takes the first key that gives it an answer.
            let wanted = (0..self.paths.len())
                .filter(|&i| deeper & matching & (1 << i) != 0)
                .filter(|&i| matches!(found[i], Found::Missing))
                .fold(0u8, |mask, i| mask | 1 << i);
            if wanted == 0 {
                map.next_value_seed(Skip)?;
                continue;
            }
            let mut sub = map.next_value_seed(MultiSeed {
                paths: self.paths,
                live: wanted,
                depth: self.depth + 1,
            })?;
            for i in 0..self.paths.len() {
                if wanted & (1 << i) != 0 {
                    found[i] = std::mem::replace(&mut sub[i], Found::Missing);
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[Found; N], A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(self.leaf(|| Found::NotScalar))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<[Found; N], E> {
        Ok(self.leaf(|| Found::Value(v.to_owned())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<[Found; N], E> {
        Ok(self.leaf(|| Found::Value(v.to_string())))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<[Found; N], E> {
        Ok(self.leaf(|| Found::Value(v.to_string())))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<[Found; N], E> {
        Ok(self.leaf(|| Found::NotScalar))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<[Found; N], E> {
        Ok(self.leaf(|| Found::NotScalar))
    }

    fn visit_unit<E: de::Error>(self) -> Result<[Found; N], E> {
        Ok(all_missing())
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
        while let Some(is_head) = map.next_key_seed(KeyIn(&[*head]))? {
            if matches!(found, Found::Missing) && is_head != 0 {
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

/// Reads an object key and compares it with up to 8 names without copying it: the
/// answer has bit `i` set when the key equals `names[i]`. (Reading it as a
/// `Cow<str>` would allocate a `String` for every key: serde's `Cow` always owns.)
struct KeyIn<'n>(&'n [&'n str]);

impl<'de> DeserializeSeed<'de> for KeyIn<'_> {
    type Value = u8;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u8, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIn<'_> {
    type Value = u8;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<u8, E> {
        Ok(self
            .0
            .iter()
            .enumerate()
            .filter(|(_, name)| **name == key)
            .fold(0u8, |mask, (i, _)| mask | 1 << i))
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
    /// [`fields_with`](super::fields_with) with owned answers, to compare.
    fn fields<P: AsRef<str>, const N: usize>(body: &[u8], paths: [&[P]; N]) -> [Option<String>; N] {
        super::fields_with(body, paths, |values| values.map(|v| v.map(str::to_owned)))
    }

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

    /// JSON-ish bodies built from pieces that exercise the readers: the keys of the
    /// paths below (some escaped, some repeated), nesting, every kind of value, empty
    /// strings, control characters, bad UTF-8, and broken syntax.
    fn body_strategy() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just(&b"{"[..]),
            Just(&b"}"[..]),
            Just(&b"["[..]),
            Just(&b"]"[..]),
            Just(&b","[..]),
            Just(&b":"[..]),
            Just(&b" "[..]),
            Just(&b"\n"[..]),
            Just(&br#""id""#[..]),
            Just(&br#""i\u0064""#[..]),
            Just(&br#""type""#[..]),
            Just(&br#""created""#[..]),
            Just(&br#""data""#[..]),
            Just(&br#""object""#[..]),
            Just(&br#""evt_1""#[..]),
            Just(&br#""""#[..]),
            Just(&br#""a\"b""#[..]),
            Just(&b"\"\x01\""[..]),
            Just(&b"\"\xff\""[..]),
            Just(&b"\"\xc3\xa9\""[..]),
            Just(&b"12"[..]),
            Just(&b"-7"[..]),
            Just(&b"1.5"[..]),
            Just(&b"1e400"[..]),
            Just(&b"true"[..]),
            Just(&b"null"[..]),
            Just(&b"-0"[..]),
            Just(&b"0"[..]),
            Just(&b"01"[..]),
            Just(&b"-"[..]),
            Just(&b"123456789012345678901"[..]),
            Just(&b"tru"[..]),
            Just(&br#""\u00e9""#[..]),
            Just(&b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["[..]),
        ];
        let shaped = (
            proptest::collection::vec(piece.clone(), 0..6),
            proptest::collection::vec(piece, 0..24),
        )
            .prop_map(|(a, b)| {
                // Often a well-formed start: `{"id":` then anything.
                let mut body = br#"{"id":"#.to_vec();
                body.extend(a.concat());
                body.extend(b.concat());
                body
            });
        let valid = proptest::collection::vec(
            prop_oneof![
                Just(r#""id":"evt_9""#),
                Just(r#""id":"""#),
                Just(r#""id":null"#),
                Just(r#""id":5"#),
                Just(r#""type":"charge.succeeded""#),
                Just(r#""created":1700000000"#),
                Just(r#""created":1.5"#),
                Just(r#""data":{"object":{"id":"ch_1"}}"#),
                Just(r#""data":{"object":{"id":null},"object":{"id":"ch_2"}}"#),
                Just(r#""data":{"object":[1,{"id":"x"}]}"#),
                Just(r#""data":{"object":"s"}"#),
                Just(r#""x":[[],{},"é"]"#),
                Just(r#""created":-12"#),
                Just(r#""created":0"#),
                Just(r#""type":"\u00e9""#),
                Just(r#""data":{"object":{"id":"ch_3","n":[true,false,null,-1]}}"#),
                Just(r#""data" : { "object" : { "id" : 42 } }"#),
            ],
            0..6,
        )
        .prop_map(|entries| format!("{{{}}}", entries.join(",")).into_bytes());
        prop_oneof![shaped, valid]
    }

    proptest::proptest! {
        #[test]
        fn fields_answers_what_field_answers(body in body_strategy()) {
            let paths: [&[&str]; 5] = [
                &["type"],
                &["created"],
                &["data", "object", "id"],
                &["id"],
                &["data"],
            ];
            let one_pass = fields(&body, paths);
            let each = paths.map(|p| field(&body, p).ok());
            proptest::prop_assert_eq!(one_pass, each);
        }

        #[test]
        fn the_plain_reader_answers_what_serde_answers(body in body_strategy()) {
            let paths: [&[&str]; 5] = [
                &["type"],
                &["created"],
                &["data", "object", "id"],
                &["id"],
                &["data"],
            ];
            if let Some(plain) = Plain::scan(&body, &paths, 0b11111) {
                let mut de = serde_json::Deserializer::from_slice(&body);
                let serde = MultiSeed::<&str, 5> { paths: &paths, live: 0b11111, depth: 0 }
                    .deserialize(&mut de)
                    .expect("serde takes what the plain reader takes");
                de.end().expect("serde takes what the plain reader takes");
                for (plain, serde) in plain.iter().zip(&serde) {
                    let same = match (plain, serde) {
                        (Leaf::Value(a), Found::Value(b)) => *a == b.as_bytes(),
                        (Leaf::Missing, Found::Missing) | (Leaf::NotScalar, Found::NotScalar) => true,
                        _ => false,
                    };
                    proptest::prop_assert!(same, "{:?}", String::from_utf8_lossy(&body));
                }
            }
        }

        #[test]
        fn first_field_fast_path_answers_what_serde_answers(body in body_strategy()) {
            for path in [&["id"][..], &["data", "object", "id"], &["type"]] {
                proptest::prop_assert_eq!(
                    first_field(&body, path),
                    first_field_serde(&body, path)
                );
            }
        }
    }

    #[test]
    fn the_plain_reader_takes_webhook_bodies_and_leaves_the_rest_to_serde() {
        let paths: [&[&str]; 2] = [&["type"], &["data", "object", "id"]];
        let body = br#" {"id":"evt_1","type":"charge.succeeded","created":1700000000,"livemode":false,"data":{"object":{"id":"ch_9","amount":-5,"x":[1,{"a":null}]}}} "#;
        assert!(Plain::scan(body, &paths, 0b11).is_some());
        for other in [
            &br#"{"type":"a\nb"}"#[..],
            br#"{"n":1.5}"#,
            br#"{"n":1e3}"#,
            br#"{"n":-0}"#,
            br#"{"n":01}"#,
            br#"{"n":1234567890123456789}"#,
            br#"{"a":1,}"#,
            br#"{"a":1} x"#,
            b"{\"a\":\"\xff\"}",
        ] {
            assert!(Plain::scan(other, &paths, 0b11).is_none(), "{other:?}");
        }
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
        assert!(Plain::scan(deep.as_bytes(), &paths, 0b11).is_none());
        assert_eq!(
            fields(deep.as_bytes(), paths),
            paths.map(|p| field(deep.as_bytes(), p).ok())
        );
    }

    #[test]
    fn fields_reads_several_paths_in_one_pass() {
        let body = br#"{"id":"evt_1","type":"charge.succeeded","created":1700000000,"data":{"object":{"id":"ch_9"}}}"#;
        assert_eq!(
            fields(
                body,
                [&["type"][..], &["created"], &["data", "object", "id"]]
            ),
            [
                Some("charge.succeeded".to_owned()),
                Some("1700000000".to_owned()),
                Some("ch_9".to_owned())
            ]
        );
        // The whole body is checked, as `field` does.
        let broken = br#"{"type":"charge.succeeded"} trailing"#;
        assert_eq!(fields(broken, [&["type"][..]]), [None]);
        // More paths than one pass takes: one call each.
        let many: [&[&str]; 9] = [&["id"]; 9];
        assert!(fields(body, many)
            .iter()
            .all(|v| v.as_deref() == Some("evt_1")));
    }

    #[test]
    fn first_field_fast_path_takes_only_plain_first_strings() {
        assert_eq!(
            first_key_string(b" {\n\"id\" :\t\"evt_1\", oops", &["id"]).as_deref(),
            Some("evt_1")
        );
        for body in [
            &br#"{"id":"ev\"t"}"#[..],
            br#"{"i\u0064":"evt"}"#,
            br#"{"type":"x","id":"evt"}"#,
            br#"{"id":""}"#,
            br#"{"id":5}"#,
            b"{\"id\":\"\x01\"}",
            b"{\"id\":\"\xff\"}",
            br#"["id"]"#,
        ] {
            assert_eq!(first_key_string(body, &["id"]), None, "{body:?}");
        }
        assert_eq!(first_key_string(br#"{"id":"a"}"#, &["id", "x"]), None);
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
