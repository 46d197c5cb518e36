#![no_main]

//! The Jamm content minifier: idempotent, and it never changes what valid JSON means.

use libfuzzer_sys::fuzz_target;
use webhook_guard::verify::__fuzz::jamm_minify;

fuzz_target!(|data: &[u8]| {
    let once = jamm_minify(data);
    assert_eq!(jamm_minify(&once), once, "idempotent");
    assert!(once.len() <= data.len());
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let w: serde_json::Value = serde_json::from_slice(&once).expect("minified JSON parses");
        assert_eq!(v, w);
    }
});
