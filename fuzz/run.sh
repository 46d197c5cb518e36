#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each (default 60 s).
#
#   fuzz/run.sh            # 60 s per target
#   fuzz/run.sh 300        # 5 minutes per target
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
for target in $(cargo +nightly fuzz list); do
    echo "== fuzzing $target for ${seconds}s"
    cargo +nightly fuzz run "$target" -- -max_total_time="$seconds" -max_len=16384
done
