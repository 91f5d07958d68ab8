#!/usr/bin/env bash
# The distribution part of .ci/run (issue 13): build the static binary and the packages
# (packaging/build), check that the binary is static and runs with nothing around it, install
# the .deb and use it, list the .rpm's files, and verify and score every systemd unit. Ends
# with `dist: N passed, 0 failed`. What needs root (the minimal root, dpkg -i) is skipped with
# a message when not root. .ci/run installs the tools (file, systemd, rpm, cargo-deb,
# cargo-generate-rpm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

triple=x86_64-unknown-linux-gnu
bin=target/$triple/release/herald
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
passed=0
ok() {
  passed=$((passed + 1))
  echo "dist: ok: $*"
}
skip() { echo "dist: skipped: $*"; }
fail() {
  echo "dist: FAILED: $*" >&2
  exit 1
}
is_root() { [ "$(id -u)" = 0 ]; }

scratch=$(mktemp -d)
server=
roles=()
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  for p in "${roles[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

# --- build ----------------------------------------------------------------------------------
start=$SECONDS
packaging/build
echo "dist: packaging/build took $((SECONDS - start)) s"
ok "packaging/build: $bin ($(stat -c %s "$bin") bytes), the .deb and the .rpm"

# --- the static binary ----------------------------------------------------------------------
out=$(file -b "$bin")
echo "file: $out"
case "$out" in
  *"static-pie linked"* | *"statically linked"*) ok "file says the binary is statically linked" ;;
  *) fail "file says: $out" ;;
esac
# Shipped without its symbol table (a per-package profile override once dropped `strip`).
case "$out" in
  *", stripped"*) ok "file says the binary is stripped" ;;
  *) fail "the binary is not stripped (strip = true in its profile, and in herald's own override): $out" ;;
esac
# The binary's size budget: what it is now and a little room (issue 33 item 5; where the bytes
# go, and why it is not yet 25 MiB: docs/benchmarks.md). A change that passes it (a crate or a
# feature, trace logging compiled in again: 0.88 MB) raises the budget here, said in its commit.
budget=33900000
size=$(stat -c %s "$bin")
if [ "$size" -le "$budget" ]; then
  ok "the binary's size, $size bytes, is within its budget of $budget"
else
  fail "the binary is $size bytes, over its budget of $budget: compare the symbol sizes of an unstripped build (cargo static --config 'profile.release.strip=false' --config 'profile.release.package.herald.strip=false', then nm -S --size-sort -C) with the last stop's, as docs/benchmarks.md does (\"2026-12-08 (stop 62)\"), and raise the budget here only on purpose"
fi
out=$(ldd "$bin" 2>&1 || true)
echo "ldd: $out"
case "$out" in
  *"not a dynamic executable"* | *"statically linked"*) ok "ldd finds no shared library" ;;
  *) fail "ldd says: $out" ;;
esac
out=$(env -i "$bin" --version)
[ "$out" = "herald $version" ] || fail "env -i herald --version said: $out"
ok "env -i herald --version: $out"

# A root holding only the binary, /proc and /dev/null: no /etc, so no /etc/hosts, no
# resolv.conf, no nsswitch.conf, no libc. A memo server outside it (same network namespace)
# is reached by name from inside, over HTTP (reqwest's resolver) and QUIC (herald's own):
# `localhost` resolves without any file. glibc's getaddrinfo cannot do that here.
if ! is_root; then
  skip "the minimal root needs root (unshare --mount, mount, chroot); run .ci/run as root"
elif ! unshare --mount true 2>/dev/null; then
  skip "the minimal root: unshare --mount is not permitted on this machine"
else
  root=$scratch/root
  mkdir -p "$root/proc" "$root/dev"
  install -m 755 "$bin" "$root/herald"
  : >"$root/dev/null"
  "$bin" --store :memory: memo --http 127.0.0.1:0 --quic 127.0.0.1:0 2>"$scratch/memo.log" &
  server=$!
  for _ in $(seq 100); do
    grep -q 'listening on quic' "$scratch/memo.log" && break
    sleep 0.1
  done
  http_port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/mcp.*|\1|p' "$scratch/memo.log")
  quic_port=$(sed -n 's|.*listening on quic://127.0.0.1:\([0-9]*\) .*|\1|p' "$scratch/memo.log")
  pin=$(sed -n 's|.*certificate sha256 \([0-9a-f]*\).*|\1|p' "$scratch/memo.log")
  [ -n "$http_port" ] && [ -n "$quic_port" ] && [ -n "$pin" ] ||
    fail "the memo server did not start: $(cat "$scratch/memo.log")"
  chroot_bin=$(command -v chroot)
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare --mount --fork sh -c '
    set -e
    mount -t proc proc "$1/proc"
    mount --bind /dev/null "$1/dev/null"
    env -i "$2" "$1" /herald --version
    env -i "$2" "$1" /herald ls --mcp-http "http://localhost:$3/mcp"
    env -i "$2" "$1" /herald ls --mcp-quic "localhost:$4" --tls-pin "$5"
  ' sh "$root" "$chroot_bin" "$http_port" "$quic_port" "$pin" >"$scratch/chroot.out" 2>&1 ||
    fail "in the minimal root: $(cat "$scratch/chroot.out")"
  cat "$scratch/chroot.out"
  [ "$(grep -c '^  memo_set ' "$scratch/chroot.out")" = 2 ] ||
    fail "in the minimal root, ls did not list memo_set twice"
  ok "in a root with only the binary, /proc and /dev/null: --version, and ls over HTTP and QUIC to localhost"
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=
fi

# --- idle RSS per role ----------------------------------------------------------------------
# Issue 33's target: at most 15 MB (14,648 KiB) each, once a role is up and has served a
# request, with one worker thread (the default on the 2-core machine the target was set on).
# Most of it is the binary's own code, which stays small only while packaging/symbol-order.txt
# puts what the roles run together (packaging/README.md); a stale list shows here first.
rss_limit_kib=14648
idle=$scratch/idle
mkdir -p "$idle/demo"
# Waits for `pattern` in role `name`'s log while it runs, or fails.
await_line() {
  local pattern=$1 name=$2 pid=$3
  for _ in $(seq 300); do
    grep -qs "$pattern" "$idle/$name.log" && return 0
    kill -0 "$pid" 2>/dev/null || fail "herald $name ended: $(cat "$idle/$name.log")"
    sleep 0.1
  done
  fail "herald $name did not log '$pattern' within 30 s: $(cat "$idle/$name.log")"
}
url_in() { sed -n 's|.*listening on \(http://127.0.0.1:[0-9]*/mcp\).*|\1|p' "$idle/$1.log" | head -n 1; }
# Starts role `name` (the rest: its arguments), its log in $idle/NAME.log; sets `pid`.
role() {
  local name=$1
  shift
  env -u RUST_LOG -u HERALD_MODEL_URL -u HERALD_EVENTS_KEY TOKIO_WORKER_THREADS=1 "$bin" "$@" >/dev/null 2>"$idle/$name.log" &
  pid=$!
  roles+=("$pid")
}
# The RSS of role `name` (pid) against the limit.
rss_within() {
  local name=$1 pid=$2 kib file anon
  kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  file=$(awk '/^RssFile:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  anon=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ -n "$kib" ] || fail "herald $name ended before its RSS was read: $(cat "$idle/$name.log")"
  echo "dist: idle RSS of herald $name: $kib KiB (code and other file pages $file, heap and stacks $anon)"
  [ "$kib" -le "$rss_limit_kib" ] ||
    fail "herald $name idles at $kib KiB, over $rss_limit_kib (file pages $file KiB, anonymous $anon KiB). If the file pages grew, packaging/symbol-order.txt is stale (a dependency or toolchain update renames the functions it lists): run packaging/symbol-order, then cargo static. (The limit was set on Linux 6.18, which maps code in large folios; this is $(uname -r).)"
}
role memo --store :memory: memo --http 127.0.0.1:0
memo_pid=$pid
await_line "listening on http" memo "$memo_pid"
memo_url=$(url_in memo)
"$bin" ls --mcp-http "$memo_url" >/dev/null
rss_within memo "$memo_pid"
printf '[[slug]]\nname = "m"\nhttp = "%s"\n' "$memo_url" >"$idle/gateway.toml"
role gateway --store :memory: gateway --config "$idle/gateway.toml" --http 127.0.0.1:0
await_line "listening on http" gateway "$pid"
"$bin" call m__memo_set key=idle value=1 --mcp-http "$(url_in gateway)" >/dev/null
rss_within gateway "$pid"
role watch --store :memory: watch --mcp-http "$memo_url" --watch n=memo://notes
await_line "watching 1 resource" watch "$pid"
rss_within watch "$pid"
role up --store "$idle/up.redb" up --demo-dir "$idle/demo" --http 127.0.0.1:0 \
  --quic 127.0.0.1:0 --admin 127.0.0.1:0
await_line "listening on http" up "$pid"
await_line "watching [0-9]* resource" up "$pid"
"$bin" ls --mcp-http "$(url_in up)" >/dev/null
rss_within up "$pid"
for p in "${roles[@]}"; do kill "$p" 2>/dev/null || true; done
for p in "${roles[@]}"; do wait "$p" 2>/dev/null || true; done
roles=()
ok "idle RSS at most $rss_limit_kib KiB each: herald memo, gateway, watch and up"

# RUST_LOG asking for trace, which the release binary has compiled out, is taken as debug: a
# stdio memo (it ends as its stdin closes) logs its debug line, no filter warning, and with
# JSON logs every line is one JSON object.
for v in 'trace,herald=trace' 'herald=' 'herald=debug, warn'; do
  env -u HERALD_MODEL_URL -u HERALD_EVENTS_KEY RUST_LOG="$v" TOKIO_WORKER_THREADS=1 \
    timeout 30 "$bin" --store :memory: memo </dev/null >/dev/null 2>"$idle/text.log" ||
    fail "RUST_LOG='$v': a stdio memo did not end cleanly as its stdin closed: $(tail -n 3 "$idle/text.log")"
  grep -q 'DEBUG serving stdio' "$idle/text.log" ||
    fail "RUST_LOG='$v': no debug line (was RUST_LOG read?): $(head -n 5 "$idle/text.log")"
  if grep -q 'statically' "$idle/text.log"; then
    fail "RUST_LOG='$v': the filter warned of levels compiled out: $(head -n 5 "$idle/text.log")"
  fi
  env -u HERALD_MODEL_URL -u HERALD_EVENTS_KEY RUST_LOG="$v" TOKIO_WORKER_THREADS=1 \
    timeout 30 "$bin" --log-format json --store :memory: memo </dev/null >/dev/null 2>"$idle/json.log" ||
    fail "RUST_LOG='$v' --log-format json: a stdio memo did not end cleanly: $(tail -n 3 "$idle/json.log")"
  if grep -qv '^{' "$idle/json.log"; then
    fail "RUST_LOG='$v' --log-format json: a log line is not JSON: $(grep -v '^{' "$idle/json.log" | head -n 3)"
  fi
done
ok "RUST_LOG asking for trace on the release binary: debug lines, no warning, every JSON log line JSON"

# --- the .deb -------------------------------------------------------------------------------
deb=target/$triple/debian/herald_${version}-1_amd64.deb
dpkg-deb --info "$deb"
dpkg-deb --contents "$deb" | tee "$scratch/deb.list"
for f in ./usr/bin/herald ./usr/lib/systemd/system/herald@.service \
  ./usr/lib/systemd/system/herald-up.service ./usr/lib/systemd/system/herald-memo.service \
  ./usr/lib/sysusers.d/herald.conf ./etc/herald/up.toml ./etc/herald/gateway.toml \
  ./usr/share/bash-completion/completions/herald ./usr/share/zsh/vendor-completions/_herald \
  ./usr/share/fish/vendor_completions.d/herald.fish ./usr/share/man/man1/herald.1.gz \
  ./usr/share/man/man1/herald-watch.1.gz ./usr/share/doc/herald/LICENSE; do
  grep -q " $f\$" "$scratch/deb.list" || fail "the .deb lacks $f"
done
ok "the .deb holds the binary, the units, the sysusers file, /etc/herald, completions, man pages and the licence"
if dpkg-deb --field "$deb" Depends | grep -q .; then
  fail "the .deb depends on $(dpkg-deb --field "$deb" Depends); a static binary needs nothing"
fi
ok "the .deb has no Depends"

units=(herald@.service herald-up.service herald-memo.service)
if ! is_root; then
  skip "dpkg -i needs root; run .ci/run as root"
else
  dpkg -i "$deb"
  ok "dpkg -i $deb"
  out=$(/usr/bin/herald --version)
  [ "$out" = "herald $version" ] || fail "installed herald --version said: $out"
  ok "installed /usr/bin/herald --version: $out"
  for f in /etc/herald/*.toml; do
    /usr/bin/herald check "$f"
  done
  ok "installed herald check on every /etc/herald/*.toml: $(ls /etc/herald/*.toml | xargs)"
  getent passwd herald >/dev/null || fail "no herald user after dpkg -i"
  ok "the herald system user exists: $(getent passwd herald)"
  grep -q watch /usr/share/bash-completion/completions/herald ||
    fail "the installed bash completion does not know watch"
  zcat /usr/share/man/man1/herald.1.gz | grep -q '^\.TH herald 1' ||
    fail "the installed herald.1.gz is not a man page"
  ok "installed completions and man pages"

  # Every unit, as installed (verify wants ExecStart's binary to exist). The template is
  # checked as an instance (FILE:INSTANCE).
  unit_arg() {
    case "$1" in
      *@.service) echo "/usr/lib/systemd/system/$1:${1/@./@ci.}" ;;
      *) echo "/usr/lib/systemd/system/$1" ;;
    esac
  }
  for unit in "${units[@]}"; do
    systemd-analyze verify --man=no "$(unit_arg "$unit")" 2>&1 |
      tee "$scratch/verify.out"
    # verify exits non-zero only for errors; warnings are printed, and any warning fails CI.
    [ ! -s "$scratch/verify.out" ] || fail "systemd-analyze verify $unit: warnings above"
    ok "systemd-analyze verify $unit"
  done
  for unit in "${units[@]}"; do
    systemd-analyze security --offline=yes --no-pager "$(unit_arg "$unit")" \
      >"$scratch/security.out" 2>&1 || true
    score=$(grep -o 'Overall exposure level for .*' "$scratch/security.out" || true)
    [ -n "$score" ] || fail "systemd-analyze security $unit: $(cat "$scratch/security.out")"
    echo "dist: $score"
    ok "systemd-analyze security $unit"
  done

  dpkg -r herald
  [ ! -e /usr/bin/herald ] || fail "dpkg -r left /usr/bin/herald"
  [ -e /etc/herald/gateway.toml ] || fail "dpkg -r removed the conffile (only --purge should)"
  dpkg --purge herald
  for f in /etc/herald/up.toml /etc/herald/gateway.toml; do
    [ ! -e "$f" ] || fail "dpkg --purge left $f"
  done
  if dpkg-query -W herald >/dev/null 2>&1; then fail "dpkg still knows herald after --purge"; fi
  ok "dpkg -r and dpkg --purge removed the package cleanly"
fi

# --- the .rpm -------------------------------------------------------------------------------
rpmf=target/$triple/generate-rpm/herald-${version}-1.x86_64.rpm
if ! command -v rpm >/dev/null; then
  skip "rpm is not installed (apt-get install rpm); the .rpm was built but not listed"
else
  rpm -qlp "$rpmf" 2>/dev/null | tee "$scratch/rpm.list"
  for f in /usr/bin/herald /usr/lib/systemd/system/herald@.service \
    /usr/lib/systemd/system/herald-up.service /usr/lib/systemd/system/herald-memo.service \
    /usr/lib/sysusers.d/herald.conf /etc/herald/up.toml /etc/herald/gateway.toml \
    /usr/share/bash-completion/completions/herald /usr/share/zsh/site-functions/_herald \
    /usr/share/fish/vendor_completions.d/herald.fish /usr/share/man/man1/herald.1.gz \
    /usr/share/licenses/herald/LICENSE; do
    grep -qx "$f" "$scratch/rpm.list" || fail "the .rpm lacks $f"
  done
  rpm -qp --scripts "$rpmf" 2>/dev/null | grep -q systemd-sysusers ||
    fail "the .rpm has no %post creating the herald user"
  ok "rpm -qlp: the .rpm holds the binary, the units, /etc/herald, completions and man pages"
fi

echo "dist: the distribution checks took $((SECONDS - start)) s"
echo "dist: $passed passed, 0 failed"
