//! Strings read from a JSON body in one pass, borrowed from the body where they
//! need no unescaping: what routing reads an event's type with, so that a delivery
//! allocates nothing for it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::seed::{KeyIn, Skip};

/// Most paths [`strings`] reads in one pass.
pub(crate) const MAX_STRINGS: usize = 8;

/// The strings [`strings`] found, entry `i` for path `i`.
pub(crate) type Strings<'de> = [Option<Cow<'de, str>>; MAX_STRINGS];

/// Reads the string at each of `paths` (object keys, outermost first; at most
/// [`MAX_STRINGS`], the others are not read) in **one** pass over `body`. Entry `i`
/// is the string at `paths[i]`: borrowed from the body unless it holds an escape,
/// `None` when the path is absent, leads to something other than a string, or to an
/// empty string. `None` as a whole when the body is not valid JSON (the whole body
/// is checked, with serde_json's nesting limit).
pub(crate) fn strings<'de, P: AsRef<str>>(body: &'de [u8], paths: &[&[P]]) -> Option<Strings<'de>> {
    let paths = &paths[..paths.len().min(MAX_STRINGS)];
    let live = (0..paths.len()).fold(0u8, |mask, i| mask | 1 << i);
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Seed {
        paths,
        live,
        depth: 0,
    }
    .deserialize(&mut de)
    .ok()?;
    de.end().ok()?;
    Some(found)
}

/// Reads the paths in `live` (bit `i` for `paths[i]`), which share their first
/// `depth` keys, at one value.
struct Seed<'p, P> {
    paths: &'p [&'p [P]],
    live: u8,
    depth: usize,
}

fn none<'de>() -> Strings<'de> {
    std::array::from_fn(|_| None)
}

impl<P> Seed<'_, P> {
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.paths.len()).filter(|i| self.live & (1 << i) != 0)
    }

    /// `text` for each live path ending at this value.
    fn leaf<'de>(&self, text: Cow<'de, str>) -> Strings<'de> {
        let mut found = none();
        if text.is_empty() {
            return found;
        }
        for i in self.live() {
            if self.paths[i].len() == self.depth {
                found[i] = Some(text.clone());
            }
        }
        found
    }
}

visitor_seed!([P: AsRef<str>] Seed<'_, P> => Strings<'de>, deserialize_any);

impl<'de, P: AsRef<str>> Visitor<'de> for Seed<'_, P> {
    type Value = Strings<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strings<'de>, A::Error> {
        let mut found = none();
        let deeper = self
            .live()
            .filter(|&i| self.paths[i].len() > self.depth)
            .fold(0u8, |mask, i| mask | 1 << i);
        // The next key of each path going deeper, `""` for the others (masked out).
        let mut heads = [""; MAX_STRINGS];
        for (i, head) in heads.iter_mut().enumerate().take(self.paths.len()) {
            if deeper & (1 << i) != 0 {
                *head = self.paths[i][self.depth].as_ref();
            }
        }
        let mut answered = 0u8;
        while let Some(matching) = map.next_key_seed(KeyIn(&heads[..self.paths.len()]))? {
            // A path takes the first key that leads to it (a repeated key is skipped).
            let wanted = deeper & matching & !answered;
            if wanted == 0 {
                map.next_value_seed(Skip)?;
                continue;
            }
            answered |= wanted;
            let mut sub = map.next_value_seed(Seed {
                paths: self.paths,
                live: wanted,
                depth: self.depth + 1,
            })?;
            for (i, slot) in found.iter_mut().enumerate() {
                if wanted & (1 << i) != 0 {
                    *slot = sub[i].take();
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strings<'de>, A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(none())
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Strings<'de>, E> {
        Ok(self.leaf(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Strings<'de>, E> {
        Ok(self.leaf(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Strings<'de>, E> {
        Ok(self.leaf(Cow::Owned(v)))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Strings<'de>, E> {
        Ok(none())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Strings<'de>, E> {
        Ok(none())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Strings<'de>, E> {
        Ok(none())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Strings<'de>, E> {
        Ok(none())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Strings<'de>, E> {
        Ok(none())
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::strings;

    #[test]
    fn strings_are_borrowed_unless_escaped_and_read_in_one_pass() {
        let body = br#"{"event":{"type":"app_mention","n":[1,{"type":"x"}]},"type":"event_callback","action":"op\u0065ned","e":""}"#;
        let found = strings(
            body,
            &[
                &["event", "type"][..],
                &["type"],
                &["action"],
                &["e"],
                &["missing"],
            ],
        )
        .unwrap();
        assert!(matches!(&found[0], Some(Cow::Borrowed("app_mention"))));
        assert!(matches!(&found[1], Some(Cow::Borrowed("event_callback"))));
        assert_eq!(found[2].as_deref(), Some("opened"));
        assert!(matches!(&found[2], Some(Cow::Owned(_))));
        assert_eq!(found[3], None, "an empty string counts as absent");
        assert_eq!(found[4], None);
        assert!(found[5..].iter().all(Option::is_none));
    }

    #[test]
    fn non_strings_repeats_and_bad_json() {
        let found = strings(
            br#"{"type":7,"a":{"b":true},"c":"1","c":"2"}"#,
            &[&["type"][..], &["a", "b"], &["c"]],
        )
        .unwrap();
        assert_eq!(found[0], None);
        assert_eq!(found[1], None);
        assert_eq!(
            found[2].as_deref(),
            Some("1"),
            "the first of a repeated key"
        );
        assert!(strings(br#"{"type":"a""#, &[&["type"][..]]).is_none());
        assert!(strings(br#"{"type":"a"} x"#, &[&["type"][..]]).is_none());
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        assert!(strings(deep.as_bytes(), &[&["type"][..]]).is_none());
    }
}
