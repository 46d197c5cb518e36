#!/usr/bin/env bash
# The test command: starts the backend servers when needed (and the TLS-only ones,
# stopped again on exit), then runs every test (unit, integration against the real
# servers, doctests, examples built) with all features.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
wg_start_services
wg_start_dynamodb
wg_start_tls_services
wg_start_valkey
trap 'wg_stop_tls_services; wg_stop_dynamodb; wg_stop_valkey' EXIT
cargo test --all-features "$@"
