//! The JSON reader's tests: each path of it against serde_json.

/// [`fields_with`](super::fields_with) with owned answers, to compare.
fn fields<P: AsRef<str>, const N: usize>(body: &[u8], paths: [&[P]; N]) -> [Option<String>; N] {
    super::fields_with(body, paths, |values| values.map(|v| v.map(str::to_owned)))
}

use super::plain::{first_key_string, Leaf, Plain};
use super::seed::{Found, MultiSeed};
use super::*;

#[test]
fn reads_a_field_or_stops_at_the_first() {
    let body = br#"{"id":"evt_1","data":{"object":{"id":"ch_9","amount":5}}}"#;
    assert_eq!(field(body, &["id"]).unwrap(), "evt_1");
    assert_eq!(field(body, &["data", "object", "id"]).unwrap(), "ch_9");
    assert_eq!(field(body, &["data", "object", "amount"]).unwrap(), "5");
    let body = br#"{"id":"evt_1","data":{"big":"..."}}"#;
    assert_eq!(first_field(body, &["id"]).unwrap(), "evt_1");
}

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

/// The paths the property tests read from each generated body.
const PATHS: [&[&str]; 5] = [
    &["type"],
    &["created"],
    &["data", "object", "id"],
    &["id"],
    &["data"],
];

proptest::proptest! {
    #[test]
    fn fields_answers_what_field_answers(body in body_strategy()) {
        let paths = PATHS;
        let one_pass = fields(&body, paths);
        let each = paths.map(|p| field(&body, p).ok());
        proptest::prop_assert_eq!(one_pass, each);
    }

    #[test]
    fn the_plain_reader_answers_what_serde_answers(body in body_strategy()) {
        let paths = PATHS;
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
