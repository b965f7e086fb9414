#!/bin/sh
# clients/typescript as a package: in a copy of it (node_modules and dist
# stay out of the source tree), npm installs its build tools, tsc builds it,
# its tests run through the package's own exports against real servers they
# start and stop (a UNIX socket, HTTP loopback, HTTP with a token), and
# npm pack shows the package holds the built module and its types.
# usage: test_typescript_client.sh PATH/TO/pysbx SOURCE_DIR WORK_DIR
set -eu
PYSBX=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$3
fail() { echo "FAIL $*"; exit 1; }
# scripts/setup installs node and npm: without them this is a failure, not a skip.
command -v node >/dev/null || fail "node is not installed (scripts/setup installs it)"
command -v npm >/dev/null || fail "npm is not installed (scripts/setup installs it)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' ||
    fail "node $(node --version) is older than 18 (no fetch, no node --test)"

mkdir -p "$WORK"
WORK=$(realpath "$WORK")
# What a run before left is built afresh; node_modules is kept (npm checks it).
rm -rf "$WORK/src" "$WORK/test" "$WORK/dist"
for f in package.json tsconfig.json README.md src test; do
    cp -r "$SRC/clients/typescript/$f" "$WORK/"
done
cd "$WORK"
npm install --no-audit --no-fund --loglevel=error || fail "npm install"
npx tsc -p . || fail "tsc"
[ -f dist/index.js ] && [ -f dist/index.d.ts ] || fail "tsc wrote no dist/index.js and dist/index.d.ts"
echo "ok   tsc builds dist/index.js and dist/index.d.ts"

# The files, not the directory: node 22 and later take no directory here.
PYSBX="$PYSBX" node --test test/*.test.js || fail "node --test"

npm pack --dry-run --json --loglevel=error >pack.json || fail "npm pack --dry-run"
node -e '
const files = JSON.parse(require("fs").readFileSync("pack.json", "utf8"))[0].files.map((f) => f.path);
const want = ["package.json", "README.md", "dist/index.js", "dist/index.d.ts"];
const missing = want.filter((f) => !files.includes(f));
const extra = files.filter((f) => f.startsWith("src/") || f.startsWith("test/") || f.startsWith("node_modules/"));
console.log("the package holds: " + files.join(" "));
if (missing.length || extra.length) {
    console.log("FAIL missing: " + missing.join(" ") + "; not to ship: " + extra.join(" "));
    process.exit(1);
}' || fail "npm pack"
echo "ok   npm pack holds dist/index.js and dist/index.d.ts"
