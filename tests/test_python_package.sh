#!/usr/bin/env bash
# clients/python as a package: pip installs it into a fresh virtual
# environment with no network (no index; what Debian provides builds it),
# and the installed module, not the source tree's, runs code on a real
# server this test starts on a UNIX socket and stops.
# usage: test_python_package.sh PATH/TO/pysbx SOURCE_DIR
set -u
PYSBX=$(realpath "$1")
SRC=$(realpath "$2")
fail() { echo "FAIL $*"; exit 1; }
/usr/bin/python3 -c 'import venv, wheel' 2>/dev/null ||
    { echo "skipped: python3-venv and python3-wheel are not installed"; exit 77; }
T=$(mktemp -d)
chmod 711 "$T"
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

# Debian's wheel package is the one thing a build needs that a plain venv
# lacks: the system's site-packages give it, and only the index is off.
# The build writes beside the sources: a copy of them, not the tree.
/usr/bin/python3 -m venv --system-site-packages "$T/venv" || fail "python3 -m venv"
cp -r "$SRC/clients/python" "$T/client"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    "$T/venv/bin/pip" install --quiet --no-index --no-build-isolation "$T/client" \
    >"$T/pip.out" 2>&1 || { cat "$T/pip.out"; fail "pip install ./clients/python"; }
echo "ok   pip installs clients/python offline"
where=$(cd "$T" && "$T/venv/bin/python" -c 'import pysbx_client; print(pysbx_client.__file__)')
case "$where" in
"$T/venv/"*) echo "ok   the module comes from the environment" ;;
*) fail "pysbx_client imported from $where" ;;
esac

TMPDIR="$T" "$PYSBX" serve --listen "$T/s.sock" </dev/null 2>"$T/serve.err" &
server=$!
for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
[ -S "$T/s.sock" ] || { cat "$T/serve.err"; fail "the server did not listen"; }
out=$(cd "$T" && "$T/venv/bin/python" - "$T/s.sock" <<'PYEOF'
import asyncio, sys
from pysbx_client import Client, PysbxSandbox, SandboxLimits, SandboxTimeoutError

async def main():
    sandbox = PysbxSandbox(sys.argv[1])
    r = await sandbox.run("print(open('in.csv').read().split(','))",
                          limits=SandboxLimits(wall_seconds=10.0, cpu_seconds=5,
                                               memory_bytes=256 * 1024 * 1024),
                          files={"in.csv": "1,2"})
    print(r.stdout.strip())
    try:
        await sandbox.run("while True: pass", limits=SandboxLimits(cpu_seconds=0.2))
    except SandboxTimeoutError as e:
        print("timeout", e.limit)

asyncio.run(main())
print(Client(sys.argv[1]).run("print(6 * 7)").stdout.strip())
PYEOF
)
[ "$out" = "['1', '2']
timeout cpu
42" ] || fail "the installed client printed: $out"
echo "ok   the installed client runs code, asyncio and synchronous"
