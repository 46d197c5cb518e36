//! Secrets and store URLs read from a file (`--secret-file`, `--store-url-file`):
//! kept out of the command line, which other local users can read, and out of the
//! environment, which child processes inherit.

use std::path::Path;

use crate::Fail;

/// Largest file read as a secret or a URL.
const MAX_LEN: u64 = 64 * 1024;

/// The text of `file` when given (without one trailing line end, which an editor or
/// `echo` adds; any other surrounding whitespace is kept, for the receiver's checks
/// to refuse), else the value given on the command line or in the environment.
/// `flag` names the option in errors; the value itself is never shown.
pub(crate) fn value_or_file(
    value: Option<&str>,
    file: Option<&Path>,
    flag: &str,
) -> Result<String, Fail> {
    match (file, value) {
        (Some(path), _) => read(path, flag),
        (None, Some(value)) => Ok(value.to_owned()),
        (None, None) => Err(Fail::Usage(format!(
            "--{flag} or --{flag}-file is required"
        ))),
    }
}

fn read(path: &Path, flag: &str) -> Result<String, Fail> {
    let shown = path.display().to_string().escape_debug().to_string();
    let fail = |why: String| Fail::Usage(format!("--{flag}-file {shown}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > MAX_LEN {
        return Err(fail(format!("larger than {MAX_LEN} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let mut text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8".into()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(fail("empty".into()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_line_end_goes_and_the_rest_stays() {
        let dir = std::env::temp_dir().join(format!("wg-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        for (written, read) in [
            ("whsec_abc\n", "whsec_abc"),
            ("whsec_abc\r\n", "whsec_abc"),
            ("whsec_abc", "whsec_abc"),
            ("whsec_abc \n\n", "whsec_abc \n"),
        ] {
            std::fs::write(&path, written).unwrap();
            assert_eq!(value_or_file(None, Some(&path), "secret").unwrap(), read);
        }
        assert_eq!(value_or_file(Some("env"), None, "secret").unwrap(), "env");
        std::fs::write(&path, "\n").unwrap();
        assert!(
            matches!(value_or_file(None, Some(&path), "secret"), Err(Fail::Usage(m)) if m.contains("empty"))
        );
        assert!(
            matches!(value_or_file(None, None, "secret"), Err(Fail::Usage(m)) if m.contains("--secret-file"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
