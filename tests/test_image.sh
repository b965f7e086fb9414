#!/bin/sh
# The container image: scripts/image builds it with podman (the base image
# made locally, no registry), and programs run in containers of it: as its
# default non-root user with no extra flag, and with every layer required
# under the flags docs/deployment.md gives. Images live in a private store under
# .cache/podman (ignored by git), not the machine's.
# Last, one HTTP request to `pysbx serve --http` in a container through a
# port published on loopback, and deploy/kubernetes played by podman.
# Every container runs in a network namespace the test makes; only the
# build uses the host's network (the RUN step fetches from Debian's mirror).
# A published port needs a bridge, NAT rules and sysctls: made there, they
# go with the namespace, and nothing in the host's own namespace (another
# engine's bridge holding podman's subnet takes every connection to it)
# changes what the test sees.
# usage: test_image.sh BUILD_DIR SOURCE_DIR
set -eu
BUILD=$1
SRC=$2
fail() { echo "FAIL $*"; exit 1; }
if [ -z "${IMAGE_TEST_NETNS:-}" ]; then
    command -v podman >/dev/null || { echo "SKIPPED: podman is not installed"; exit 77; }
    [ "$(id -u)" = 0 ] || { echo "SKIPPED: the image test runs podman as root"; exit 77; }
    command -v ip >/dev/null || fail "ip is not installed (scripts/setup installs iproute2)"
    STORE=${PYSBX_PODMAN_STORE:-$SRC/.cache/podman}
    mkdir -p "$STORE"
    STORE=$(cd "$STORE" && pwd) # podman's store remembers the path it was made with
    PODMAN="podman --root $STORE/root --runroot $STORE/run"

    # What this host's podman needs to start a container at all, and a
    # build's RUN step: its default runtime, or runc (crun refuses hybrid
    # cgroup hierarchies), and the default rlimits, or lower ones (raising
    # them needs CAP_SYS_RESOURCE; podman 5 sets a build's even where a run
    # keeps the caller's).
    BASE=$(PODMAN="$PODMAN" "$SRC/scripts/image" --base)
    probe=$(mktemp -d)
    printf 'FROM %s\nRUN true\n' "$BASE" >"$probe/Containerfile"
    RUNFLAGS=
    found=
    for runtime in "" "--runtime runc"; do
        for ulimits in "" "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"; do
            if $PODMAN $runtime run --rm --network none $ulimits "$BASE" true >/dev/null 2>&1 &&
                $PODMAN $runtime build --pull=never --network none $ulimits -t pysbx-probe \
                    "$probe" >/dev/null 2>&1; then
                PODMAN="$PODMAN $runtime"
                RUNFLAGS=$ulimits
                found=1
                break 2
            fi
        done
    done
    why=
    [ -n "$found" ] || why=$($PODMAN run --rm --network none "$BASE" true 2>&1 &&
        $PODMAN build --pull=never --network none "$probe" 2>&1) || true
    $PODMAN rmi -f pysbx-probe >/dev/null 2>&1 || true
    rm -rf "$probe"
    # A machine that cannot start containers at all (no cgroup or namespace
    # support for them) is not a failure of the image: say so and skip.
    [ -n "$found" ] || { echo "SKIPPED: podman cannot start a container or a build here: $(echo "$why" | tail -1)"; exit 77; }
    echo "podman: $PODMAN, run flags: ${RUNFLAGS:-none}"
    # The base, as Debian's own image does, names its release's security
    # suite: the image's Python and libraries come with their security updates.
    # shellcheck disable=SC2086,SC2016
    security=$($PODMAN run --rm --network none $RUNFLAGS "$BASE" sh -c '. /etc/os-release &&
        apt-get indextargets --no-release-info --format "\$(RELEASE)" |
        grep -x "$VERSION_CODENAME-security" | head -1') || security=
    [ -n "$security" ] || fail "the base image's apt sources name no security suite"
    echo "ok   the base image's apt sources name $security"

    IMAGE=$(PODMAN="$PODMAN" PODMAN_BUILD_FLAGS="$RUNFLAGS" "$SRC/scripts/image" "$BUILD") ||
        fail "scripts/image"
    echo "built $IMAGE"
    export IMAGE_TEST_NETNS=1 PODMAN RUNFLAGS IMAGE
    exec unshare --net -- sh "$0" "$BUILD" "$SRC"
fi
# From here on in the test's own network namespace, which ends with the
# last process in it: its loopback is the only interface until podman adds
# its bridge, and any port on it is free.
ip link set lo up || fail "bringing up loopback in the test's network namespace"
# podman keeps the networks it makes (the one podman kube play makes for its
# pods) in a directory of the test's, not the machine's; and this host's
# rlimits for containers, as the runs need them, also for the pod.
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TOK=$T/http
KUBE=$T/kube
mkdir "$T/networks" "$TOK" "$KUBE"
printf '[network]\nnetwork_config_dir = "%s"\n' "$T/networks" >"$T/containers.conf"
if [ -n "$RUNFLAGS" ]; then
    printf '[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n' >>"$T/containers.conf"
fi
export CONTAINERS_CONF="$T/containers.conf"
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
# container's addresses (a token is then required), published on loopback
# only.
port=8081
trap 'rm -rf "$T"; $PODMAN rm -f pysbx-http-test >/dev/null 2>&1 || true' EXIT
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

# --- deploy/kubernetes, run by a real engine: podman kube play -----------------------
# The Deployment as it is, with its own security context, capabilities,
# probes and volumes; the test adds what a cluster would have: the Secret
# with the token (played first: podman keeps it as a secret of its own), a
# single replica, and (podman publishes only host ports) its two ports on
# loopback, each as its own number. catatonit is the pod's pause process.
command -v catatonit >/dev/null || fail "podman kube play needs catatonit (scripts/setup installs it)"
# podman keeps a Secret's volume as a named volume of its own, which kube
# down leaves: it is removed before and after, so a run never sees another's.
unplay() {
    $PODMAN kube down "$KUBE/play.yaml" >/dev/null 2>&1 || true
    $PODMAN secret rm pysbx-token >/dev/null 2>&1 || true
    $PODMAN volume rm -f pysbx-token >/dev/null 2>&1 || true
}
trap 'unplay; rm -rf "$T"' EXIT
kport=8080
mport=9090
/usr/bin/python3 - "$SRC/deploy/kubernetes/deployment.yaml" "$kport" "$mport" "$KUBE" "$IMAGE" <<'PY' ||
import base64, sys, yaml
dep = yaml.safe_load(open(sys.argv[1]))
dep["spec"]["replicas"] = 1
c = dep["spec"]["template"]["spec"]["containers"][0]
c["image"] = sys.argv[5]  # the image just built, of this machine's release
for p in c["ports"]:
    p["hostIP"] = "127.0.0.1"
    p["hostPort"] = int(sys.argv[2] if p["name"] == "http" else sys.argv[3])
open(sys.argv[4] + "/play.yaml", "w").write(yaml.safe_dump(dep, sort_keys=False))
secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pysbx-token"},
          "data": {"token": base64.b64encode(b"kube-play-token").decode()}}
open(sys.argv[4] + "/secret.yaml", "w").write(yaml.safe_dump(secret))
PY
    fail "making the play files"
unplay
$PODMAN kube play "$KUBE/secret.yaml" >"$KUBE/play.out" 2>&1 &&
    $PODMAN kube play "$KUBE/play.yaml" >>"$KUBE/play.out" 2>&1 ||
    { tail -5 "$KUBE/play.out"; fail "podman kube play deploy/kubernetes/deployment.yaml"; }
ctr=$($PODMAN ps --format '{{.Names}}' | grep -- '-pysbx$' | head -1)
[ -n "$ctr" ] || { $PODMAN ps -a; fail "no container of the Deployment is running"; }
health=
for _ in $(seq 300); do
    health=$(/usr/bin/python3 -c 'import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=2).status)' "$kport" 2>/dev/null) && break
    sleep 0.1
done
[ "$health" = 200 ] || { $PODMAN logs "$ctr" 2>&1 | tail -5; fail "/healthz of the played Deployment: '$health'"; }
# The engine's own probe (the liveness probe, as podman runs it: curl in
# the container).
$PODMAN healthcheck run "$ctr" >/dev/null 2>&1 ||
    fail "the manifest's probe, run by podman: $($PODMAN inspect "$ctr" --format '{{json .Config.Healthcheck}}')"
echo "ok   podman kube play: the Deployment's pod is up; its probe, run by podman, answers"
caps=$($PODMAN inspect "$ctr" --format '{{.EffectiveCaps}} user={{.Config.User}} ro={{.HostConfig.ReadonlyRootfs}}')
# Exactly the six the manifest adds (podman lists them sorted), as root,
# on a read-only root file system.
[ "$caps" = "[CAP_DAC_OVERRIDE CAP_KILL CAP_SETGID CAP_SETPCAP CAP_SETUID CAP_SYS_ADMIN] user=0:0 ro=true" ] ||
    fail "not the manifest's security context: $caps"
echo "ok   with the manifest's security context: $caps"
# The token as the Secret's volume holds it (podman 4.3 writes a Secret's
# data there still base64-encoded, where a kubelet decodes it: the server
# wants what the file says).
token=$($PODMAN exec "$ctr" cat /etc/pysbx/token) || fail "the Secret's volume"
answer=$(/usr/bin/python3 "$TOK/ask.py" "$kport" "$token" 2>&1)
[ "$answer" = "7 completed 42" ] || fail "a run through the played Deployment's port: '$answer'"
echo "ok   a run through the published port, with the Secret's token"
scraped=$(/usr/bin/python3 -c 'import sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print([l for l in t.splitlines() if l.startswith("pysbx_runs_total{status=\"completed\"}")][0])' "$mport" 2>&1)
[ "$scraped" = 'pysbx_runs_total{status="completed"} 1' ] ||
    fail "the metrics port as the annotations name it: '$scraped'"
echo "ok   the annotations' port and path answer a scraper without the token"
$PODMAN kube down "$KUBE/play.yaml" >/dev/null 2>&1 || fail "podman kube down"
unplay
left=$($PODMAN ps -a --format '{{.Names}}' | grep -c pysbx || true)
pods=$($PODMAN pod ps --format '{{.Name}}' | grep -c pysbx || true)
[ "$left" = 0 ] && [ "$pods" = 0 ] || fail "podman kube down left $left containers, $pods pods"
echo "ok   podman kube down leaves no pod and no container"

$PODMAN image prune -f >/dev/null # the images of earlier runs
echo "image test passed"
