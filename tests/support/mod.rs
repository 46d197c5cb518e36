//! Shared helpers for the integration tests.
#![allow(dead_code, unreachable_pub)]

/// The URL of a live server from the environment variable `var`.
///
/// In CI (`CI` set) a missing variable fails the test: a missing server is a failure,
/// never a skip. Outside CI the test says clearly that it was skipped and returns `None`.
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} is not set: CI requires every backend's server")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set, so this test did not run (see README: Testing)");
            None
        }
    }
}

pub mod backends;
pub mod proxy;
