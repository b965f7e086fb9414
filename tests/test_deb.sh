#!/bin/sh
# The Debian package: built with CPack, it holds the command, the helper, the
# library, the header, the pkg-config and CMake files; installed with apt
# into a clean root of the release it was built on (an overlay of
# scripts/debian-root's cached minbase root, so the cache stays clean), its
# Depends bring what it needs
# from Debian's mirror, and pysbx runs a program there (chroot), and serves
# one over HTTP, its metrics scraped.
# usage: test_deb.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD=$1
SRC=$2
fail() { echo "FAIL $*"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "SKIPPED: mounting the root and chroot need root"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

DEB=$("$SRC/scripts/deb" "$BUILD" "$T/pkg")
depends=$(dpkg-deb -f "$DEB" Depends)
echo "Depends: $depends"
for lib in libc6 libjansson4 libseccomp2 libcap2 libpython3 libmicrohttpd libssl; do
    echo "$depends" | grep -q "$lib" || fail "Depends lacks $lib"
done
# The interpreter is the system's shared libpython (its security updates
# reach the sandbox), not a copy linked in.
echo "$depends" | grep -Eq '(^|, )libpython3\.[0-9]+ \(' || fail "Depends lacks the shared libpython"
# The interpreter the package was built for (3.11 on Debian 12, 3.13 on 13):
# its standard library is a Depends, and the installed pysbx runs it.
PYVER=$(echo "$depends" | sed -n 's/.*libpython\(3\.[0-9]*\)-stdlib.*/\1/p')
[ -n "$PYVER" ] || fail "Depends lacks the standard library"
[ "$PYVER" = "$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ] ||
    fail "the package is built for Python $PYVER, this machine's python3 is another"
dpkg-deb -c "$DEB" | awk '{print $6}' >"$T/files"
for f in ./usr/bin/pysbx ./usr/libexec/pysbx/pysbx-template ./usr/include/pysbx.h \
         ./usr/lib/libpysbx.a ./usr/lib/libpysbx.so ./usr/lib/libpysbx.so.0.6 \
         ./usr/lib/pkgconfig/pysbx.pc ./usr/lib/cmake/pysbx/pysbx-config.cmake \
         ./usr/lib/cmake/pysbx/pysbx-config-version.cmake ./usr/share/man/man1/pysbx.1.gz \
         ./usr/share/man/man3/libpysbx.3.gz; do
    grep -qx "$f" "$T/files" || fail "the package lacks $f"
done
echo "ok   the package holds the command, helper, library, header, pkg-config and CMake files, man pages"
# Debian's own checker: no error (its warnings are about splitting the
# library into packages of its own, which this one package does not do).
command -v lintian >/dev/null || fail "lintian is not installed (scripts/setup installs it)"
lintian --allow-root "$DEB" >"$T/lintian" 2>&1 || true
! grep -q '^E:' "$T/lintian" || fail "lintian finds errors: $(grep '^E:' "$T/lintian" | tr '\n' ' ')"
echo "ok   lintian: no error ($(grep -c '^W:' "$T/lintian") warnings)"

BASE=$("$SRC/scripts/debian-root")
mkdir "$T/upper" "$T/work" "$T/root"
cp "$DEB" "$T/pkg/pysbx.deb"
cat >"$T/script.py" <<'PY'
import sys
print(open("in.txt").read().upper(), sys.version_info[:2])
open("out.txt", "w").write("written")
PY
# In a mount namespace of its own: nothing is left mounted when it ends.
unshare -m --propagation private sh -eu -s "$BASE" "$T" "$PYVER" <<'EOF2' || fail "in the clean root"
BASE=$1
T=$2
PYVER=$3
M=$T/root
mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$T/upper,workdir=$T/work" "$M"
mount -t proc proc "$M/proc"
mount --rbind /dev "$M/dev"
mkdir "$M/pkg"
mount --bind "$T/pkg" "$M/pkg"
in_root() { chroot "$M" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
if in_root dpkg -s libjansson4 >/dev/null 2>&1; then
    echo "FAIL the root is not clean: libjansson4 is there before the package"; exit 1
fi
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    /pkg/pysbx.deb >"$T/apt.log" 2>&1 || { cat "$T/apt.log"; exit 1; }
echo "ok   apt installs the package and its Depends into a clean root ($(. "$M/etc/os-release" && echo "$PRETTY_NAME"))"
in_root dpkg -s libjansson4 libseccomp2 libcap2 "libpython$PYVER-stdlib" >/dev/null
cp "$T/script.py" "$M/tmp/script.py"
echo "hello" >"$M/tmp/in.txt"
out=$(in_root pysbx run --file in.txt=/tmp/in.txt --artifacts-dir /tmp/out /tmp/script.py)
echo "$out"
[ "$out" = "HELLO
 (${PYVER%%.*}, ${PYVER#*.})" ] || { echo "FAIL pysbx run in the root printed that"; exit 1; }
[ "$(cat "$M/tmp/out/out.txt")" = written ] || { echo "FAIL no artifact"; exit 1; }
echo "ok   the installed pysbx runs a program there (default layers required)"
in_root pysbx doctor >"$T/doctor" || { cat "$T/doctor"; echo "FAIL pysbx doctor"; exit 1; }
cat "$T/doctor"
# The HTTP service from the installed package (the chroot shares the host's
# network: loopback only), one run, then its metrics.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# exec all the way down: $! is the server itself, which the kill below
# reaches (a backgrounded function would leave it running).
(exec chroot "$M" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin pysbx serve --http \
    "127.0.0.1:$port") >"$T/http.log" 2>&1 &
server=$!
cat >"$T/ask.py" <<'PY'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
req = urllib.request.Request(base + "/v1/run", data=b'{"id": 1, "code": "print(6 * 7)"}',
                             headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=5))
metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
runs = [l for l in metrics.splitlines() if l.startswith('pysbx_runs_total{status="completed"}')]
print(r["status"], r["stdout"].strip(), runs[0].split()[-1] if runs else "none")
PY
got=
for _ in $(seq 100); do
    got=$(/usr/bin/python3 "$T/ask.py" "$port" 2>/dev/null) && break
    sleep 0.1
done
kill -TERM "$server"; wait "$server" || true
[ "$got" = "completed 42 1" ] || { cat "$T/http.log"; echo "FAIL serve --http from the package: '$got'"; exit 1; }
echo "ok   the installed pysbx serves HTTP: a run answered, /metrics counts it"
EOF2
echo "deb test passed"
