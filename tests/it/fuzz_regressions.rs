//! Every input a fuzz target under `fuzz/` found crashing, kept as a normal test so
//! the fix stays fixed without a nightly toolchain. Add each new crash here.

use webhook_guard::meta::{parse_time, MetaExtractor};

/// `fuzz/run.sh` (target `meta`, 20 s): fifteen digits read as milliseconds gave the
/// year 12532, which RFC 3339 cannot print or read back; one such signed
/// `created_at` would leave every later event of its object "stale". Times past the
/// year 9999 are now refused.
#[test]
fn meta_far_future_millis_are_refused() {
    assert_eq!(parse_time("333333333333333"), None);
    let meta = MetaExtractor::json(&["type"], &["created_at"], &["object"]);
    let m = meta.extract(br#"{"type":"a.b","created_at":333333333333333,"object":"o"}"#);
    assert_eq!(m.created_at, None);
    // Still accepted: seconds, milliseconds, RFC 3339, up to the year 9999.
    assert!(parse_time("1700000000").is_some());
    assert!(parse_time("1700000000000").is_some());
    assert!(parse_time("253402300799").is_some()); // 9999-12-31T23:59:59Z
    assert_eq!(parse_time("253402300800"), None); // 10000-01-01
    for text in [
        "1700000000",
        "1700000000123",
        "253402300799999",
        "2024-01-01T00:00:00Z",
    ] {
        let t = parse_time(text).unwrap();
        assert_eq!(parse_time(&t.to_rfc3339()), Some(t), "{text}");
    }
}
