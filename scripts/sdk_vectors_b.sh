#!/usr/bin/env bash
# Writes the cross-check vectors of the Square, SendGrid, Adyen, Mailgun, Intercom,
# GitLab, Typeform, Calendly and Dropbox presets to OUT (JSON lines), signed and
# judged by the providers' own SDKs from npm (scripts/sdk_vectors_b.js says which).
# tests/it/providers_b.rs runs it (or reads WG_SDK_VECTORS_B when set). The packages
# are installed once, pinned, into a cache (WG_SDK_CACHE, default
# ~/.cache/webhook-guard/sdk-b). A missing node or npm, or a failed install, is an
# error: the cross-check never silently skips.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/sdk_vectors_b.sh OUT.jsonl}
cache=${WG_SDK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/webhook-guard/sdk-b}
packages=(@sendgrid/eventwebhook@8.0.0 square@46.0.0 @adyen/api-library@32.1.0)
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "sdk_vectors_b: $tool is required (apt-get install nodejs npm)" >&2; exit 1; }
done
stamp="$cache/installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "${packages[*]}" ]; then
  mkdir -p "$cache"
  [ -f "$cache/package.json" ] || echo '{"private": true}' >"$cache/package.json"
  npm install --prefix "$cache" --no-audit --no-fund --ignore-scripts --loglevel=error "${packages[@]}" >&2
  echo "${packages[*]}" >"$stamp"
fi
NODE_PATH="$cache/node_modules" node scripts/sdk_vectors_b.js >"$out.tmp"
mv "$out.tmp" "$out"
echo "sdk_vectors_b: $(wc -l <"$out") vectors in $out" >&2
