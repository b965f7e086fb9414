#!/bin/sh
# The library installs, and a C program builds against the installed copy
# with pkg-config alone, and with find_package(pysbx), and runs.
# usage: test_install.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
PC=$(find "$T/prefix" -name pysbx.pc)
LIBDIR=$(dirname "$(dirname "$PC")")
export PKG_CONFIG_PATH="$(dirname "$PC")"
# The installed library looks for its helper where it was configured to be
# installed; a relocated install says where it is.
export PYSBX_TEMPLATE="$T/prefix/libexec/pysbx/pysbx-template"
test -x "$PYSBX_TEMPLATE"

# shellcheck disable=SC2046
cc -Wall -Werror "$SRC/examples/embed/embed.c" $(pkg-config --cflags --libs pysbx) \
    -Wl,-rpath,"$LIBDIR" -o "$T/embed-pc"
out=$("$T/embed-pc")
echo "$out"
echo "$out" | grep -q "status completed, exit code 0"
echo "$out" | grep -q "artifact total.txt: 10"
# Only the API is exported.
if nm -D --defined-only "$LIBDIR/libpysbx.so" | awk '{print $3}' | grep -v '^sbx_'; then
    echo "libpysbx.so exports more than sbx_*"
    exit 1
fi

cmake -S "$SRC/examples/embed" -B "$T/embed-build" -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null
cmake --build "$T/embed-build" >/dev/null
LD_LIBRARY_PATH="$LIBDIR" "$T/embed-build/embed" | grep -q "status completed, exit code 0"
echo "install test passed"
