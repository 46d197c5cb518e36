//! The JSON reader through serde: one path ([`PathSeed`]) or several at once
//! ([`MultiSeed`]), skipping every value off the paths without building it.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};

/// [`PathSeed`] for several paths at once. `live` holds the paths that lead to the
/// value being read (they share their first `depth` keys); the answer holds, for each
/// of them, what [`PathSeed`] would answer for the rest of its path, and `Missing`
/// for the others. Off-path values are skipped with [`Skip`], as [`PathSeed`] does,
/// so the same nesting limit applies.
pub(super) struct MultiSeed<'p, P, const N: usize> {
    pub(super) paths: &'p [&'p [P]; N],
    pub(super) live: u8,
    pub(super) depth: usize,
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

visitor_seed!([P: AsRef<str>, const N: usize] MultiSeed<'_, P, N> => [Found; N], deserialize_any);

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

pub(super) enum Found {
    Value(String),
    Missing,
    NotScalar,
}

pub(super) struct PathSeed<'p> {
    pub(super) path: &'p [&'p str],
    /// Where to leave the value when reading stops as soon as it is found.
    pub(super) stop: Option<&'p RefCell<Option<String>>>,
}

/// The error message that carries "found, stop reading" out of serde.
const STOPPED: &str = "webhook-guard: field found";

visitor_seed!([] PathSeed<'_> => Found, deserialize_any);

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
pub(super) struct KeyIn<'n>(pub(super) &'n [&'n str]);

visitor_seed!([] KeyIn<'_> => u8, deserialize_str);

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
pub(super) struct Skip;

visitor_seed!([] Skip => (), deserialize_any);

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
