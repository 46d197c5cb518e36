#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(t) = webhook_guard::verify::__fuzz::parse_template(text) {
        // Printing and re-parsing gives the same template.
        let again = webhook_guard::verify::__fuzz::parse_template(&t.to_string()).unwrap();
        assert_eq!(t, again);
    }
    let _ = webhook_guard::verify::__fuzz::parse_unix_seconds(text.as_bytes(), "t");
});
