#!/usr/bin/env bash
# The test command: starts the backend servers when needed (and the TLS-only ones,
# stopped again on exit), then runs every test (unit, integration against the real
# servers, doctests, examples built) with all features, then, for a whole run, the
# Lambda example under cargo-lambda's emulator (scripts/lambda_emulator.sh). The
# console's browser test drives examples/console.rs, which this run builds, in a
# headless Chromium; its screenshots land in target/console-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
wg_start_services
wg_start_dynamodb
wg_start_tls_services
wg_start_valkey
# Chromium and chromedriver for the console's browser test (tests/console_browser.rs).
wg_start_chromedriver
trap 'wg_stop_tls_services; wg_stop_dynamodb; wg_stop_valkey; wg_stop_chromedriver' EXIT
# Deliveries signed by the providers' own SDKs (npm, PyPI), for tests/it/sdk_vectors.rs.
WG_SDK_VECTORS="$(bash scripts/sdk_vectors.sh)"
export WG_SDK_VECTORS
# Deliveries signed and judged by the SDKs of Square, SendGrid, Adyen and others
# (npm), for tests/it/providers_b.rs.
mkdir -p target
bash scripts/sdk_vectors_b.sh target/sdk-vectors-b.jsonl
export WG_SDK_VECTORS_B="$PWD/target/sdk-vectors-b.jsonl"
# The browser test runs the console example's binary: built first, so that a run of
# that test alone (`scripts/test.sh --test console_browser`) finds it too.
cargo build --all-features --example console
cargo test --all-features "$@"
# The whole run (no filter given) also runs the Lambda example under the local
# Lambda emulator.
if [ $# -eq 0 ]; then
  bash scripts/lambda_emulator.sh
fi
