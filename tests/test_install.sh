#!/bin/sh
# The library installs to any prefix, and the install can be moved as a whole:
# the installed command runs without LD_LIBRARY_PATH or PYSBX_TEMPLATE, a C
# program builds against it with pkg-config alone, with find_package(pysbx),
# and statically beside symbols of its own, and runs. The exported symbols and
# the ABI rule (include/pysbx.h) are checked on the installed files.
# usage: test_install.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
unset PYSBX_TEMPLATE LD_LIBRARY_PATH
fail() { echo "FAIL $*"; exit 1; }

cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
# Move the install: nothing may remember where it was first put.
mv "$T/prefix" "$T/moved"
P=$T/moved
PC=$(find "$P" -name pysbx.pc)
LIBDIR=$(dirname "$(dirname "$PC")")
HELPER=$(find "$P" -name pysbx-template)
test -x "$HELPER" || fail "no helper installed"
echo 'print(6 * 7)' >"$T/six.py"

# The command: its RUNPATH is relative to itself, and the library finds the
# helper relative to itself. Without the helper the run fails (so no other
# copy is found anywhere), with it the run works.
readelf -d "$P/bin/pysbx" | grep -q 'RUNPATH.*\$ORIGIN' || fail "pysbx has no \$ORIGIN RUNPATH"
mv "$HELPER" "$T/helper"
status=0
"$P/bin/pysbx" run "$T/six.py" >"$T/out" 2>&1 || status=$?
[ "$status" = 70 ] || { cat "$T/out"; fail "without its helper pysbx exited $status, not 70"; }
grep -q "PYSBX_TEMPLATE" "$T/out" || { cat "$T/out"; fail "without its helper, no word of PYSBX_TEMPLATE"; }
mv "$T/helper" "$HELPER"
out=$("$P/bin/pysbx" run "$T/six.py") || fail "the moved install's pysbx run failed"
[ "$out" = 42 ] || fail "the moved install's pysbx run printed '$out'"
echo "ok   the moved install runs without LD_LIBRARY_PATH or PYSBX_TEMPLATE"

# Full RELRO on what is installed: no relocation left writable after start.
for f in "$P/bin/pysbx" "$HELPER" "$LIBDIR"/libpysbx.so.*.*.*; do
    readelf -d "$f" | grep -q 'FLAGS.*BIND_NOW' || fail "$f is not linked with -z now"
    readelf -lW "$f" | grep -q 'GNU_RELRO' || fail "$f has no RELRO segment"
done
echo "ok   the command, the helper and the library have full RELRO"

# pkg-config: the .pc file describes the prefix it is in. A prefix the
# dynamic linker does not search needs a run path (or LD_LIBRARY_PATH).
export PKG_CONFIG_PATH="$(dirname "$PC")"
[ "$(pkg-config --variable=libdir pysbx)" -ef "$LIBDIR" ] || fail "pysbx.pc names another libdir"
# shellcheck disable=SC2046
cc -Wall -Werror "$SRC/examples/embed/embed.c" $(pkg-config --cflags --libs pysbx) \
    -Wl,-rpath,"$(pkg-config --variable=libdir pysbx)" -o "$T/embed-pc"
out=$("$T/embed-pc")
echo "$out"
echo "$out" | grep -q "status completed, exit code 0" || fail "embed (pkg-config)"
echo "$out" | grep -q "artifact total.txt: 10" || fail "embed (pkg-config) artifact"

# pkg-config --static: what the static library needs besides itself, enough
# for a wholly static host (told where its helper is).
# shellcheck disable=SC2046
cc -Wall -Werror -static "$SRC/examples/embed/embed.c" $(pkg-config --static --cflags --libs pysbx) \
    -o "$T/embed-static" || fail "pkg-config --static does not link a static host"
file -L "$T/embed-static" | grep -q "statically linked" || fail "the host is not static"
out=$(PYSBX_TEMPLATE="$HELPER" "$T/embed-static")
echo "$out" | grep -q "status completed, exit code 0" || fail "embed (pkg-config --static)"
echo "ok   pkg-config --static links a wholly static host"

# The shared library exports only the API, under the SONAME of the ABI rule.
bad=$(nm -D --defined-only "$LIBDIR/libpysbx.so" | awk '{print $3}' | grep -v '^sbx_' || true)
[ -z "$bad" ] || fail "libpysbx.so exports more than sbx_*: $bad"
nm -D --defined-only "$LIBDIR/libpysbx.so" | grep -q ' sbx_run$' || fail "libpysbx.so lacks sbx_run"
soname=$(readelf -d "$LIBDIR/libpysbx.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
# This release's 0.y (the ABI rule), from the header; the ones around it.
minor=$(sed -n 's/^#define PYSBX_VERSION_MINOR \([0-9]*\)$/\1/p' "$SRC/include/pysbx.h")
this=0.$minor before=0.$((minor - 1)) after=0.$((minor + 1))
[ "$soname" = "libpysbx.so.$this" ] || fail "SONAME is '$soname', not libpysbx.so.$this"
grep -q "^#define PYSBX_SONAME \"$soname\"" "$P/include/pysbx.h" || fail "pysbx.h names another SONAME"
echo "ok   libpysbx.so exports sbx_* only; SONAME $soname"

# The static library's only global symbols are the API's; a host with its
# own now_ns and fmt links against it and both work.
bad=$(nm -g --defined-only "$LIBDIR/libpysbx.a" | awk 'NF == 3 {print $3}' | grep -v '^sbx_' || true)
[ -z "$bad" ] || fail "libpysbx.a has global symbols beyond sbx_*: $bad"
cat >"$T/host.c" <<'EOF'
#include <pysbx.h>
#include <stdio.h>
#include <string.h>

/* The host's own, under names the library uses inside. */
long long now_ns(void) { return 7; }
const char *fmt(void) { return "host fmt"; }
int read_full(int x) { return x + 1; }

int main(void)
{
    struct sbx_config cfg;
    struct sbx_request req;
    struct sbx *sbx;
    struct sbx_result *res;
    struct sbx_error err;

    sbx_config_init(&cfg);
    if (sbx_open(&cfg, &sbx, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    sbx_request_init(&req);
    req.code = "print(6 * 7)";
    req.code_len = strlen(req.code);
    int rc = sbx_run(sbx, &req, &res, &err);
    if (rc == 0) {
        printf("%s %s", sbx_status_name(res->status), res->stdout_text);
        sbx_result_free(res);
    }
    sbx_close(sbx);
    printf("%lld %s %d\n", now_ns(), fmt(), read_full(1));
    return rc == 0 ? 0 : 1;
}
EOF
# shellcheck disable=SC2046
cc -Wall -Werror -I"$P/include" "$T/host.c" "$LIBDIR/libpysbx.a" $(pkg-config --libs jansson libxxhash) \
    -lpthread -o "$T/host" || fail "a host defining now_ns, fmt, read_full does not link"
out=$(PYSBX_TEMPLATE="$HELPER" "$T/host")
printf '%s\n' "$out"
[ "$out" = "completed 42
7 host fmt 2" ] || fail "the static host printed the wrong thing"
echo "ok   libpysbx.a: the API only; a host's now_ns, fmt and read_full stay its own"
# A program linked with the static library, installed in the prefix's bin/
# and started by a bare name on PATH, finds the helper relative to itself.
cp "$T/host" "$P/bin/pysbx-host"
out=$(cd "$T" && PATH="$P/bin:$PATH" pysbx-host) || fail "a static host in bin/ finds no helper"
[ "$out" = "completed 42
7 host fmt 2" ] || fail "the static host in bin/ printed the wrong thing"
echo "ok   a static host in the prefix's bin/ finds the helper relative to itself"

# find_package: the moved prefix, the run path CMake gives a build tree.
cmake -S "$SRC/examples/embed" -B "$T/embed-build" -DCMAKE_PREFIX_PATH="$P" >/dev/null
cmake --build "$T/embed-build" >/dev/null
"$T/embed-build/embed" | grep -q "status completed, exit code 0" || fail "embed (find_package)"

# The CMake package follows the ABI rule: this 0.y is accepted, the ones
# around it and 0.0 are not.
mkdir "$T/want"
cat >"$T/want/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(want C)
find_package(pysbx ${WANT} REQUIRED)
EOF
for want in $this $this.0 $before $after 0.0 1.0; do
    status=0
    cmake -S "$T/want" -B "$T/want-$want" -DWANT="$want" -DCMAKE_PREFIX_PATH="$P" \
        >"$T/want.log" 2>&1 || status=$?
    case $want in "$this" | "$this.0") expect=0 ;; *) expect=1 ;; esac
    [ "$status" -eq 0 ] && got=0 || got=1
    [ "$got" = "$expect" ] || { cat "$T/want.log"; fail "find_package(pysbx $want): status $status"; }
done
grep -q "not compatible\|version" "$T/want.log" || fail "a refused version says nothing"
echo "ok   find_package(pysbx $this) found; $before, $after, 0.0, 1.0 refused"
echo "install test passed"
