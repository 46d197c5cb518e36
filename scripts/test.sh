#!/usr/bin/env bash
# The test command: starts the backend servers when needed, then runs every test
# (unit, integration against the real servers, doctests, examples built) with all features.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
wg_start_services
wg_start_dynamodb
trap 'wg_stop_dynamodb; wg_stop_valkey' EXIT
wg_start_valkey
cargo test --all-features "$@"
