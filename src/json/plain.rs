//! The JSON reader without serde, for the shapes webhooks send: the first key of a
//! body ([`first_key_string`]) and several paths in one pass ([`Plain`]). Each gives
//! up (`None`) on anything it does not read exactly as serde_json would.

/// [`first_field`](super::first_field) for its most common case, without serde: a one-key `path` that is
/// the **first** key of the top-level object, spelled without escapes, whose value is
/// a non-empty string without escapes or control characters. serde_json would read
/// exactly these bytes (the same whitespace, the same checks on the key and the value,
/// UTF-8 included) and stop at the same place, so the answer is the same. Any other
/// shape answers `None`, and [`first_field`](super::first_field) goes through serde.
pub(super) fn first_key_string(body: &[u8], path: &[&str]) -> Option<String> {
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

/// What a path answers at one value, as [`Found`](super::seed::Found), borrowing the body (a string's
/// raw bytes, valid UTF-8 since the whole body is).
#[derive(Clone, Copy)]
pub(super) enum Leaf<'b> {
    Value(&'b [u8]),
    Missing,
    NotScalar,
}

/// The paths [`Plain`] reads a value for: `live` holds those that lead to it,
/// having matched their first `depth` keys.
struct Reading<'p, P, const N: usize> {
    paths: &'p [&'p [P]; N],
    live: u8,
    depth: usize,
}

// By hand: a derive would ask `P: Copy`, and only a reference to `P` is held.
impl<P, const N: usize> Clone for Reading<'_, P, N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P, const N: usize> Copy for Reading<'_, P, N> {}

impl<P, const N: usize> Reading<'_, P, N> {
    /// `leaf` for each live path that ends at this value, `Missing` for the others.
    fn ends_here<'b>(self, leaf: Leaf<'b>) -> [Leaf<'b>; N] {
        std::array::from_fn(|i| {
            if self.live & (1 << i) != 0 && self.paths[i].len() == self.depth {
                leaf
            } else {
                Leaf::Missing
            }
        })
    }
}

/// Deepest nesting [`Plain`] reads; serde_json's limit is 128.
const PLAIN_MAX_NESTING: usize = 100;

/// [`fields_with`](super::fields_with) without serde, for the documents webhooks send: valid UTF-8, strings
/// without escapes or control characters, integers of at most 18 digits written
/// canonically (`0`, `-7`, `1700000000`: never `-0`, leading zeros, fractions or
/// exponents), nesting up to 100 levels. It answers what [`MultiSeed`](super::seed::MultiSeed) answers, and
/// gives up (`None`) on anything else: another number, an escape, broken syntax,
/// deeper nesting. Then [`fields_with`](super::fields_with) asks serde_json, which decides. So a document
/// this reader takes is one serde_json takes too, with the same values (a canonical
/// integer's `to_string` is its text).
pub(super) struct Plain<'b> {
    body: &'b [u8],
    at: usize,
}

impl<'b> Plain<'b> {
    pub(super) fn scan<P: AsRef<str>, const N: usize>(
        body: &'b [u8],
        paths: &[&[P]; N],
        live: u8,
    ) -> Option<[Leaf<'b>; N]> {
        // One check for every string in the body: a string of a valid UTF-8 document
        // lies between two ASCII quotes, so it is valid UTF-8 too.
        std::str::from_utf8(body).ok()?;
        let mut reader = Plain { body, at: 0 };
        reader.skip_whitespace();
        let reading = Reading {
            paths,
            live,
            depth: 0,
        };
        let found = reader.value(reading, 0)?;
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

    /// Reads one value for the paths of `reading`.
    fn value<P: AsRef<str>, const N: usize>(
        &mut self,
        reading: Reading<'_, P, N>,
        nesting: usize,
    ) -> Option<[Leaf<'b>; N]> {
        if reading.live == 0 {
            self.skip(nesting)?;
            return Some([Leaf::Missing; N]);
        }
        let ends_here = |leaf| reading.ends_here(leaf);
        match self.peek()? {
            b'{' => self.object(reading, nesting + 1),
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
        self.members(nesting, b'{', b'}', |reader| {
            reader.key()?;
            reader.skip(nesting)
        })
    }

    fn array(&mut self, nesting: usize) -> Option<()> {
        self.members(nesting, b'[', b']', |reader| reader.skip(nesting))
    }

    /// Reads an array or object nested `nesting` deep, from `open` to `close`,
    /// each member with `member` (an object's member: its key, then its value).
    #[inline(always)]
    fn members(
        &mut self,
        nesting: usize,
        open: u8,
        close: u8,
        mut member: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        if nesting > PLAIN_MAX_NESTING {
            return None;
        }
        self.eat(open)?;
        self.skip_whitespace();
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            member(self)?;
            self.skip_whitespace();
            if self.eat(close).is_some() {
                return Some(());
            }
            self.eat(b',')?;
            self.skip_whitespace();
        }
    }

    /// An object member's key and the `:` after it, with the whitespace around.
    fn key(&mut self) -> Option<&'b [u8]> {
        let key = self.string()?;
        self.skip_whitespace();
        self.eat(b':')?;
        self.skip_whitespace();
        Some(key)
    }

    fn object<P: AsRef<str>, const N: usize>(
        &mut self,
        reading: Reading<'_, P, N>,
        nesting: usize,
    ) -> Option<[Leaf<'b>; N]> {
        let Reading { paths, live, depth } = reading;
        // As MultiSeed: paths ending at an object answer NotScalar.
        let mut found = reading.ends_here(Leaf::NotScalar);
        let deeper = (0..N)
            .filter(|&i| live & (1 << i) != 0 && paths[i].len() > depth)
            .fold(0u8, |mask, i| mask | 1 << i);
        self.members(nesting, b'{', b'}', |reader| {
            let key = reader.key()?;
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
                return reader.skip(nesting);
            }
            let below = Reading {
                paths,
                live: wanted,
                depth: depth + 1,
            };
            let sub = reader.value(below, nesting)?;
            for i in 0..N {
                if wanted & (1 << i) != 0 {
                    found[i] = sub[i];
                }
            }
            Some(())
        })?;
        Some(found)
    }
}
