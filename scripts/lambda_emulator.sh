#!/usr/bin/env bash
# Runs examples/lambda_stripe.rs under cargo-lambda's local Lambda runtime emulator
# (`cargo lambda watch`) and sends it Stripe-signed deliveries through its function
# URL with the operator tool's `send`: processed, then duplicate, and a delivery
# signed with another secret refused. scripts/test.sh runs it after the tests, which
# build `target/debug/webhook-guard`. cargo-lambda comes from PyPI; without it this
# fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-lambda >/dev/null; then
  python3 -m pip install -q cargo-lambda >/dev/null 2>&1 \
    || python3 -m pip install -q --break-system-packages cargo-lambda >/dev/null 2>&1 || true
  command -v pyenv >/dev/null && pyenv rehash 2>/dev/null || true
fi
command -v cargo-lambda >/dev/null || { echo "lambda emulator: cargo-lambda could not be installed" >&2; exit 1; }
[ -x target/debug/webhook-guard ] || cargo build -q --features cli --bin webhook-guard
port=${WG_LAMBDA_PORT:-9310}
log=$(mktemp)
# Built first, so that the emulator's first invocation does not wait on the compiler.
cargo build -q --example lambda_stripe --features lambda
STRIPE_WEBHOOK_SECRET=whsec_emulator0123456789abcdefghijklmn cargo lambda watch --example lambda_stripe \
  --features lambda -P "$port" >"$log" 2>&1 &
watch=$!
trap 'kill "$watch" 2>/dev/null || true; pkill -f "examples/lambda_stripe" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 120); do grep -q "starting Runtime server" "$log" && break; sleep 0.5; done
grep -q "starting Runtime server" "$log" || { cat "$log" >&2; echo "lambda emulator: did not start" >&2; exit 1; }
send() { # secret, then send's own options
  WEBHOOK_GUARD_SECRET=$1 target/debug/webhook-guard send --provider stripe \
    --url "http://127.0.0.1:$port/" "${@:2}"
}
out=$(send whsec_emulator0123456789abcdefghijklmn --duplicates 1 || true)
echo "$out"
grep -q "200 processed" <<<"$out" && grep -q "200 duplicate" <<<"$out" \
  || { cat "$log" >&2; echo "lambda emulator: expected processed, then duplicate" >&2; exit 1; }
out=$(send whsec_anothersecret0123456789abcdefghi || true) # send exits non-zero on a refusal
echo "$out"
grep -q "401" <<<"$out" || { echo "lambda emulator: a forged delivery was not refused" >&2; exit 1; }
echo "lambda emulator: examples/lambda_stripe processed, then duplicate; forged refused (401)"
