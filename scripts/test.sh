#!/usr/bin/env bash
# The test command: starts the backend servers when needed (and the TLS-only ones,
# stopped again on exit), then runs every test (unit, integration against the real
# servers, doctests, examples built) with all features, then, for a whole run, the
# Lambda example under cargo-lambda's emulator (scripts/lambda_emulator.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
wg_start_services
wg_start_dynamodb
wg_start_tls_services
wg_start_valkey
trap 'wg_stop_tls_services; wg_stop_dynamodb; wg_stop_valkey' EXIT
# Deliveries signed by the providers' own SDKs (npm, PyPI), for tests/it/sdk_vectors.rs.
WG_SDK_VECTORS="$(bash scripts/sdk_vectors.sh)"
export WG_SDK_VECTORS
cargo test --all-features "$@"
# The whole run (no filter given) also runs the Lambda example under the local
# Lambda emulator.
if [ $# -eq 0 ]; then
  bash scripts/lambda_emulator.sh
fi
