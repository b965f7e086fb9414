#!/bin/sh
# pysbx mcp through the official MCP TypeScript SDK client, driven by Node.
# usage: test_mcp.sh PATH/TO/pysbx SOURCE_DIR WORK_DIR
set -eu
PYSBX=$1
SRC=$2
WORK=$3
# What an SDK client hides (bytes, cancellation), line by line first.
/usr/bin/python3 "$SRC/tests/mcp_raw.py" "$PYSBX"
command -v node >/dev/null || { echo "node is not installed (scripts/setup installs it)"; exit 1; }
mkdir -p "$WORK"
cp "$SRC/tests/mcp/package.json" "$SRC/tests/mcp/client.mjs" "$WORK/"
if [ ! -d "$WORK/node_modules/@modelcontextprotocol/sdk" ]; then
    (cd "$WORK" && npm install --no-audit --no-fund --loglevel=error)
fi
exec node "$WORK/client.mjs" "$PYSBX"
