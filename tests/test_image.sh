#!/bin/sh
# The container image: scripts/image builds it with podman (the base image
# made locally, no registry), and programs run in containers of it: as its
# default non-root user with no extra flag, and with every layer required
# under the flags docs/deployment.md gives. Images live in a private store under
# .cache/podman (ignored by git), not the machine's.
# Last, one HTTP request to `pysbx serve --http` in a container, through a
# port published on the host's loopback.
# usage: test_image.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD=$1
SRC=$2
fail() { echo "FAIL $*"; exit 1; }
command -v podman >/dev/null || { echo "SKIPPED: podman is not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIPPED: the image test runs podman as root"; exit 77; }
STORE=${PYSBX_PODMAN_STORE:-$SRC/.cache/podman}
mkdir -p "$STORE"
STORE=$(cd "$STORE" && pwd) # podman's store remembers the path it was made with
PODMAN="podman --root $STORE/root --runroot $STORE/run"

# What this host's podman needs to start a container at all: its default
# runtime, or runc (crun refuses hybrid cgroup hierarchies), and the default
# rlimits, or lower ones (raising them needs CAP_SYS_RESOURCE).
BASE=$(PODMAN="$PODMAN" "$SRC/scripts/image" --base)
RUNFLAGS=
found=
for runtime in "" "--runtime runc"; do
    for ulimits in "" "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"; do
        if $PODMAN $runtime run --rm $ulimits "$BASE" true >/dev/null 2>&1; then
            PODMAN="$PODMAN $runtime"
            RUNFLAGS=$ulimits
            found=1
            break 2
        fi
    done
done
# A machine that cannot start containers at all (no cgroup or namespace
# support for them) is not a failure of the image: say so and skip.
[ -n "$found" ] || { echo "SKIPPED: podman cannot start a container here: $($PODMAN run --rm "$BASE" true 2>&1 | tail -1)"; exit 77; }
echo "podman: $PODMAN, run flags: ${RUNFLAGS:-none}"

IMAGE=$(PODMAN="$PODMAN" PODMAN_BUILD_FLAGS="$RUNFLAGS" "$SRC/scripts/image" "$BUILD") ||
    fail "scripts/image"
echo "built $IMAGE"
in_container() { # [NET=...] in_container [podman run flags...] -- [pysbx arguments...]
    flags=
    while [ "$1" != -- ]; do flags="$flags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    $PODMAN run --rm -i ${NET:---network none} $RUNFLAGS $flags "$IMAGE" "$@"
}

user=$(in_container --entrypoint id -- -un)
[ "$user" = pysbx ] || fail "the image's default user is '$user', not pysbx"
out=$(echo 'print(6 * 7)' | in_container -- run -) || fail "pysbx run as the default user"
[ "$out" = 42 ] || fail "pysbx run as the default user printed '$out'"
echo "ok   pysbx run in a container, as its non-root default user, no extra flag"

ALL=seccomp,landlock,netns,mountns,ipcns,utsns,user,rlimits,caps,root,uidrun
out=$(echo 'import os; print(os.getuid() >= 2130706432, os.uname().nodename)' |
      in_container --user 0 --cap-add SYS_ADMIN -- run --require "$ALL" -) ||
    fail "pysbx run --require every layer under --user 0 --cap-add SYS_ADMIN"
[ "$out" = "True sandbox" ] || fail "with every layer the run printed '$out'"
in_container --user 0 --cap-add SYS_ADMIN -- doctor --require "$ALL" >/dev/null ||
    fail "doctor does not show every layer active"
echo "ok   every layer active under --user 0 --cap-add SYS_ADMIN"
# One HTTP request answered from a container: serve --http on all of the
# container's addresses (a token is then required), published on the host's
# loopback only.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOK=$(mktemp -d)
trap 'rm -rf "$TOK"; $PODMAN rm -f pysbx-http-test >/dev/null 2>&1 || true' EXIT
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOK/token"
chmod 0644 "$TOK/token"
$PODMAN rm -f pysbx-http-test >/dev/null 2>&1 || true
NET="-p 127.0.0.1:$port:8080" in_container -d --name pysbx-http-test -v "$TOK/token:/token:ro" -- \
    serve --http 0.0.0.0:8080 --http-token-file /token >/dev/null ||
    fail "serve --http in a container"
cat >"$TOK/ask.py" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/run",
                             data=json.dumps({"id": 7, "code": "print(6 * 7)"}).encode(),
                             headers={"Authorization": f"Bearer {sys.argv[2]}",
                                      "Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=5))
print(r["id"], r["status"], r["stdout"].strip())
PY
answer=
for _ in $(seq 100); do
    answer=$(/usr/bin/python3 "$TOK/ask.py" "$port" "$(cat "$TOK/token")" 2>/dev/null) && break
    sleep 0.1
done
$PODMAN stop -t 2 pysbx-http-test >/dev/null 2>&1 || true
[ "$answer" = "7 completed 42" ] || fail "the HTTP answer from the container was '$answer'"
echo "ok   an HTTP request answered from a container (serve --http, published on loopback)"
$PODMAN image prune -f >/dev/null # the images of earlier runs
echo "image test passed"
