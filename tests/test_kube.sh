#!/bin/sh
# deploy/kubernetes validated offline against the Kubernetes schemas
# (kubernetes-models from npm, installed into WORK_DIR as test_mcp.sh does).
# usage: test_kube.sh PATH/TO/pysbx SOURCE_DIR WORK_DIR
set -eu
PYSBX=$1
SRC=$2
WORK=$3
command -v node >/dev/null || { echo "node is not installed (scripts/setup installs it)"; exit 1; }
mkdir -p "$WORK"
cp "$SRC/tests/kube/package.json" "$SRC/tests/kube/validate.mjs" "$WORK/"
if [ ! -d "$WORK/node_modules/kubernetes-models" ]; then
    (cd "$WORK" && npm install --no-audit --no-fund --loglevel=error)
fi
exec node "$WORK/validate.mjs" "$PYSBX" "$SRC"
