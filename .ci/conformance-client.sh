#!/usr/bin/env bash
# Run the official MCP conformance suite's client scenarios against herald's client: the
# example `conformance_client` (herald's upstream client, the one the gateway connects with,
# and its tool calls; see examples/conformance_client.rs), which the suite starts once per
# scenario with its mock server's URL as the argument and the scenario's name in
# MCP_CONFORMANCE_SCENARIO.
#
#   cargo build --example conformance_client
#   .ci/conformance-client.sh target/debug/examples/conformance_client
#
# Environment:
#   HERALD_CI_CACHE             cache root (default ~/.cache/herald-ci); the suite and Node 22
#                               are installed in $HERALD_CI_CACHE/conformance when missing
#                               (.ci/conformance-suite.sh, shared with .ci/conformance.sh)
#   HERALD_CONFORMANCE_OUT      where results go (default: a fresh temp dir)
#
# Scored scenarios run here, all on the 2026-07-28 wire (--spec-version 2026-07-28).
# Not run yet:
#   - the auth extension scenarios (auth/client-credentials-jwt, -basic, dpop, dpop-nonce,
#     enterprise-managed-authorization, wif-jwt-bearer): not scored for 2026-07-28; herald's
#     client speaks client credentials with a secret, but not JWT client assertions, DPoP,
#     or token exchange.
#   - auth/2025-03-26-*: the 2025-03-26 wire (no resource metadata).
#   - initialize, sse-retry, elicitation-sep1034-client-defaults: the initialize-era wire
#     (2025-11-25), not 2026-07-28.
#   - json-schema-2020-12-preservation, sep-2640-*: not in the scored 2026-07-28 set asked for
#     here (issue 28, item 3).
#
# Prints a PASS/FAIL line per scenario with the counts from its checks.json, then exactly one
# line `conformance-client: N passed, M failed`. Exit status is non-zero when any scenario
# fails (a FAILURE or WARNING check, or the client exiting non-zero).
set -euo pipefail

SCENARIOS=(
  tools_call
  request-metadata
  sep-2322-client-request-state
  http-standard-headers
  http-custom-headers
  http-invalid-tool-headers
  json-schema-ref-no-deref
  # OAuth 2.1 (issue 34): the 25 scored auth scenarios of 2026-07-28.
  auth/metadata-default
  auth/metadata-var1
  auth/metadata-var2
  auth/metadata-var3
  auth/basic-cimd
  auth/scope-from-www-authenticate
  auth/scope-from-scopes-supported
  auth/scope-omitted-when-undefined
  auth/scope-step-up
  auth/scope-retry-limit
  auth/token-endpoint-auth-basic
  auth/token-endpoint-auth-post
  auth/token-endpoint-auth-none
  auth/pre-registration
  auth/resource-mismatch
  auth/offline-access-scope
  auth/offline-access-not-supported
  auth/authorization-server-migration
  auth/iss-supported
  auth/iss-not-advertised
  auth/iss-supported-missing
  auth/iss-wrong-issuer
  auth/iss-unexpected
  auth/iss-normalized
  auth/metadata-issuer-mismatch
)
SCENARIO_TIMEOUT_MS=30000   # the suite's per-client-run timeout (its default)
RUN_TIMEOUT_S=120           # hard cap per scenario run

die() { echo "conformance-client: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 path/to/conformance_client (cargo build --example conformance_client)"
client=$1
[[ -x $client ]] || die "client '$client' not found or not executable; build it with cargo build --example conformance_client"
client=$(cd "$(dirname "$client")" && pwd)/$(basename "$client")
# The suite splits its --command on spaces.
[[ $client != *" "* ]] || die "the client's path '$client' has a space, which the suite cannot run; move it"

out=${HERALD_CONFORMANCE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/herald-conformance-client.XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# shellcheck source=conformance-suite.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/conformance-suite.sh"
install_suite conformance-client

# One scenario's checks.json: "<passed> <failed> <warnings> <skipped>", then one line per
# FAILURE or WARNING check.
summarize_js='
const checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const n = s => checks.filter(c => c.status === s).length;
console.log(`${n("SUCCESS")} ${n("FAILURE")} ${n("WARNING")} ${n("SKIPPED")}`);
for (const c of checks) {
  if (c.status !== "FAILURE" && c.status !== "WARNING") continue;
  console.log(`    ${c.status} ${c.id} ${c.name}: ${c.errorMessage || c.description || ""}`);
}
'

echo "conformance-client: $SUITE_PKG@$SUITE_VERSION, spec $SPEC_VERSION, client $client; results in $out"
pass=0
fail=0
declare -a summary=()
for s in "${SCENARIOS[@]}"; do
  sdir=$out/${s//\//-}
  mkdir -p "$sdir"
  st=$SECONDS
  rc=0
  timeout "$RUN_TIMEOUT_S" "$node22" "$suite" client --command "$client" --scenario "$s" \
    --spec-version "$SPEC_VERSION" --timeout "$SCENARIO_TIMEOUT_MS" -o "$sdir" \
    </dev/null >"$sdir/run.log" 2>&1 || rc=$?
  dt=$((SECONDS - st))
  strip_ansi <"$sdir/run.log" >"$sdir/run.txt"
  checks=$(find "$sdir" -name checks.json -print | head -n 1)
  if [[ -z $checks ]]; then
    summary+=("FAIL  $s: no checks.json written (suite exit $rc, ${dt} s); see $sdir/run.txt")
    sed -n '1,40p' "$sdir/run.txt" | sed 's/^/    /' >&2
    fail=$((fail + 1))
    continue
  fi
  details=$("$node22" -e "$summarize_js" "$checks") \
    || { summary+=("FAIL  $s: cannot read $checks"); fail=$((fail + 1)); continue; }
  read -r n_ok n_fail n_warn n_skip <<<"$(head -n 1 <<<"$details")"
  counts="$n_ok passed, $n_fail failed, $n_warn warnings, $n_skip skipped"
  if ((rc == 0 && n_fail == 0 && n_warn == 0 && n_ok > 0)); then
    summary+=("PASS  $s: $counts [${dt} s]")
    pass=$((pass + 1))
  else
    why="suite exit $rc"
    ((n_ok == 0)) && why+="; no check passed"
    block="FAIL  $s: $counts [${dt} s] ($why)"
    failing=$(tail -n +2 <<<"$details")
    [[ -n $failing ]] && block+=$'\n'"$failing"
    client_err=$(dirname "$checks")/stderr.txt
    [[ -s $client_err ]] && block+=$'\n'"$(tail -n 5 "$client_err" | strip_ansi | sed 's/^/    client: /')"
    block+=$'\n'"    checks: $checks"
    summary+=("$block")
    fail=$((fail + 1))
  fi
done

echo
printf '%s\n' "${summary[@]}"
echo "conformance-client: $pass passed, $fail failed"
((fail == 0))
