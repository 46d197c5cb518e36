#![no_main]

//! The crate's JSON reader (`json::field`, reached through the hidden `__fuzz`
//! feature) never panics on arbitrary bytes, and on canonical JSON (no duplicate
//! keys) it agrees with a full parse.

use libfuzzer_sys::fuzz_target;

const PATHS: [&[&str]; 3] = [&["id"], &["data", "object", "id"], &["a", "b"]];

fuzz_target!(|data: &[u8]| {
    for path in PATHS {
        if let Ok(v) = webhook_guard::__fuzz::json_field(data, path) {
            assert!(!v.is_empty(), "empty strings count as missing");
        }
    }
    let Ok(full) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let canonical = serde_json::to_vec(&full).unwrap();
    for path in PATHS {
        let expected = path
            .iter()
            .try_fold(&full, |at, key| at.get(key))
            .and_then(|v| match v {
                serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            });
        let got = webhook_guard::__fuzz::json_field(&canonical, path).ok();
        assert_eq!(got, expected, "path {path:?} in {}", String::from_utf8_lossy(&canonical));
    }
});
