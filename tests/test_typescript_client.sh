#!/bin/sh
# clients/typescript as a package, as a fresh clone holds it (no dist/, no
# node_modules), in a copy of it: `npm install` alone installs its build
# tools and builds it, `npm test` runs its tests through the package's own
# exports against real servers they start and stop (a UNIX socket, HTTP
# loopback, HTTP with a token), and `npm pack` makes a package holding the
# built module and its types. That package is then installed in a new
# project, which type-checks a program of its own against it and runs it
# against a real server.
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
CLONE=$WORK/clone
PROJECT=$WORK/project
SERVER=
stop_server() {
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
    SERVER=
}
trap stop_server EXIT
# What a run before left goes: each run starts from what a clone holds
# (npm's own cache keeps the downloads).
rm -rf "$CLONE" "$PROJECT"
mkdir -p "$CLONE" "$PROJECT"
for f in package.json tsconfig.json README.md .gitignore src test; do
    cp -r "$SRC/clients/typescript/$f" "$CLONE/"
done
cd "$CLONE"
[ ! -e dist ] || fail "the copy holds dist/ before anything was built"
npm install --no-audit --no-fund --loglevel=error || fail "npm install"
[ -f dist/index.js ] && [ -f dist/index.d.ts ] ||
    fail "npm install built no dist/index.js and dist/index.d.ts"
echo "ok   npm install in a fresh clone builds dist/index.js and dist/index.d.ts"

PYSBX="$PYSBX" npm test --loglevel=error || fail "npm test"
echo "ok   npm test"

rm -rf dist # npm pack builds what it ships
npm pack --loglevel=error >pack.out || fail "npm pack"
TARBALL=$CLONE/$(tail -n 1 pack.out)
[ -f "$TARBALL" ] || fail "npm pack made no $TARBALL"
files=$(tar -tzf "$TARBALL" | sed 's|^package/||' | sort | tr '\n' ' ')
echo "the package holds: $files"
for want in package.json README.md dist/index.js dist/index.d.ts; do
    case " $files " in *" $want "*) ;; *) fail "npm pack: $want is not in the package" ;; esac
done
case " $files " in *" src/"* | *" test/"* | *" node_modules/"*) fail "npm pack ships more" ;; esac
echo "ok   npm pack holds dist/index.js and dist/index.d.ts, and no source or tests"

# A new project: the packed client, and the TypeScript its devDependencies name.
cd "$PROJECT"
ts=$(node -p 'require(process.argv[1]).devDependencies.typescript' "$CLONE/package.json")
types=$(node -p 'require(process.argv[1]).devDependencies["@types/node"]' "$CLONE/package.json")
printf '{"name": "a-host", "version": "1.0.0", "private": true, "type": "module"}\n' >package.json
npm install --no-audit --no-fund --loglevel=error "$TARBALL" "typescript@$ts" "@types/node@$types" ||
    fail "npm install of the packed client in a new project"
cat >tsconfig.json <<'EOF'
{"compilerOptions": {"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
                     "strict": true, "types": ["node"]}, "files": ["host.ts"]}
EOF
cat >host.ts <<'EOF'
import { PysbxSandbox, SandboxError, type SandboxResult } from "pysbx-client";

const sandbox = new PysbxSandbox(process.argv[2]);
const r: SandboxResult = await sandbox.run("print(6 * 7)");
if (r.stdout !== "42\n" || r.exitCode !== 0) throw new Error(`not 42: ${JSON.stringify(r)}`);
try {
  await sandbox.run("pass", { limits: { wallSeconds: -1 } });
  throw new Error("a bad limit was run");
} catch (e) {
  if (!(e instanceof SandboxError) || e.code !== "invalid_limit") throw e;
}
console.log("the packed client ran print(6 * 7):", JSON.stringify(r.stdout));
EOF
npx tsc -p . || fail "the packed client's types do not check in a new project"
echo "ok   a new project's program type-checks against the packed client"

dir=$(mktemp -d)
chmod 711 "$dir" # the workers' uids pass through it
TMPDIR=$dir "$PYSBX" serve --listen "$dir/s.sock" >"$dir/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 300); do
    [ -S "$dir/s.sock" ] && break
    kill -0 "$SERVER" 2>/dev/null || fail "the server exited: $(cat "$dir/serve.log")"
    sleep 0.1
done
timeout 120 node host.js "$dir/s.sock" || fail "the packed client in a new project"
stop_server
rm -rf "$dir"
echo "ok   the packed client runs code in a new project"
