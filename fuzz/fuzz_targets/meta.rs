#![no_main]

//! `meta::parse_time` and `MetaExtractor::json` never panic on arbitrary input.

use libfuzzer_sys::fuzz_target;
use webhook_guard::meta::{parse_time, MetaExtractor};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(t) = parse_time(text) {
            // A parsed time prints and parses back to itself.
            assert_eq!(parse_time(&t.to_rfc3339()), Some(t), "{text:?}");
        }
    }
    let meta = MetaExtractor::json(&["type"], &["created_at"], &["data", "object", "id"]);
    let _ = meta.extract(data);
});
