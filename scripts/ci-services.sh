#!/usr/bin/env bash
# Install the OS packages the reliability tests need: PostgreSQL (a throwaway cluster per test
# run, started by the tests themselves on 127.0.0.1) and Debian's Chromium (driven by Playwright).
# Idempotent: does nothing when both are present; runs `apt-get update` only when it must install.
# Not root and something missing: cannot install, so says so and exits 0; the tests that need the
# missing package then SKIP with that reason (as root, e.g. in CI, a missing package FAILS them).
set -euo pipefail

PACKAGES=(postgresql chromium)

have_postgresql() {
  # the server binaries the tests call (initdb, pg_ctl, postgres), from any installed major version
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}
have_chromium() { [ -x /usr/bin/chromium ]; }

missing=()
have_postgresql || missing+=(postgresql)
have_chromium || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  echo "[ci-services] postgresql and chromium already installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "[ci-services] WARNING: missing ${missing[*]} and not root, so not installing them;" \
    "the tests that need them will be SKIPPED (to run them: sudo apt-get install -y ${missing[*]})" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[ci-services] ERROR: missing ${missing[*]} and apt-get is not available on this machine" >&2
  exit 1
fi

start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp /tmp/ci-services.XXXXXX.log)
echo "[ci-services] installing: ${missing[*]} (log: $log)"

apt_update() {
  echo "[ci-services] apt-get update"
  if ! apt-get update -qq >>"$log" 2>&1; then
    echo "[ci-services] ERROR: apt-get update failed; last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}
apt_install() {
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" >>"$log" 2>&1
}

# `apt-get update` at most once: first when the package lists know no candidate for what we need,
# else only if installing from the existing (possibly stale) lists fails.
updated=0
for p in "${missing[@]}"; do
  cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then updated=1; fi
done
[ $updated -eq 1 ] && apt_update
if ! apt_install; then
  if [ $updated -eq 0 ]; then
    apt_update
    apt_install || install_failed=1
  else
    install_failed=1
  fi
fi
if [ "${install_failed:-0}" -eq 1 ]; then
  echo "[ci-services] ERROR: apt-get install ${missing[*]} failed; last lines of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi

# Debian's postgresql package creates a default cluster and, where services may start (no
# policy-rc.d veto), starts it on localhost:5432. The tests never use it (each run starts its own
# cluster in a temp dir), so stop what this install started.
if [[ " ${missing[*]} " == *" postgresql "* ]] && command -v pg_lsclusters >/dev/null; then
  pg_lsclusters --no-header 2>/dev/null | awk '$4 == "online" {print $1, $2}' | while read -r ver name; do
    pg_ctlcluster "$ver" "$name" stop >>"$log" 2>&1 || true
  done
fi
have_postgresql || { echo "[ci-services] ERROR: postgresql installed but initdb/pg_ctl not found" >&2; exit 1; }
have_chromium || { echo "[ci-services] ERROR: chromium installed but /usr/bin/chromium not found" >&2; exit 1; }
echo "[ci-services] installed ${missing[*]} in $(( $(date +%s) - start ))s"
