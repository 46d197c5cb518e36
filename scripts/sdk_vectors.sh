#!/usr/bin/env bash
# Deliveries signed by the providers' own SDKs, for tests/it/sdk_vectors.rs:
# installs twilio, @hubspot/api-client and discord-interactions from npm and
# twilio and PyNaCl from PyPI (pinned, into a cache directory, once), has them sign
# random bodies (scripts/sdk_vectors/gen.cjs, gen.py) with a tampered twin each,
# and prints the path of the JSON file of vectors. A missing node, npm or python3
# fails the run.
#
#   export WG_SDK_VECTORS="$(bash scripts/sdk_vectors.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in node npm python3; do
  command -v "$tool" >/dev/null || { echo "sdk_vectors: $tool is required" >&2; exit 1; }
done
cache="${WG_SDK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/webhook-guard/sdk-vectors}"
npm_pins="twilio@6.3.1 @hubspot/api-client@13.5.0 discord-interactions@4.4.0"
pip_pins="twilio==9.13.0 PyNaCl==1.6.2"
mkdir -p "$cache/node"
if [ "$(cat "$cache/node/.pins" 2>/dev/null)" != "$npm_pins" ]; then
  echo "sdk_vectors: npm install $npm_pins" >&2
  (cd "$cache/node" && npm install --no-audit --no-fund --no-save --silent $npm_pins >&2)
  echo "$npm_pins" > "$cache/node/.pins"
fi
if [ "$(cat "$cache/venv/.pins" 2>/dev/null)" != "$pip_pins" ]; then
  echo "sdk_vectors: pip install $pip_pins" >&2
  rm -rf "$cache/venv"
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install --quiet --disable-pip-version-check $pip_pins >&2
  echo "$pip_pins" > "$cache/venv/.pins"
fi
out="$PWD/target/sdk-vectors"
mkdir -p "$out"
NODE_PATH="$cache/node/node_modules" node scripts/sdk_vectors/gen.cjs "$out/node.json"
"$cache/venv/bin/python" scripts/sdk_vectors/gen.py "$out/python.json"
echo "$out/node.json:$out/python.json"
