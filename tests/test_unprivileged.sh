#!/bin/sh
# pysbx started by an ordinary user: the code cannot read, chmod or renice
# what belongs to that user, with the default layers and with the private
# root turned off (Landlock and seccomp's refusal of chmod/chown/utime by
# path then stand in), and a deployment with no file-system confinement at
# all refuses to start rather than run.
#
# With subordinate ids (/etc/subuid, newuidmap) each run gets a uid of its
# own; without, every run keeps the user's uid and doctor says why.
#
# Needs root to make the ordinary users (system accounts pysbx-test, with
# subordinate ids, and pysbx-test-nosub, without; made once and kept);
# skipped (exit 77) otherwise.
# usage: test_unprivileged.sh BUILD_DIR
set -eu
BUILD=$1
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: needs root to run as another, ordinary user"
    exit 77
fi
USERNAME=pysbx-test
NOSUB=pysbx-test-nosub
for u in "$USERNAME" "$NOSUB"; do
    id "$u" >/dev/null 2>&1 ||
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$u"
done
# A subordinate range for the first (from a block no one else uses here).
for f in /etc/subuid /etc/subgid; do
    grep -q "^$USERNAME:" "$f" 2>/dev/null || echo "$USERNAME:3000000000:65536" >>"$f"
done

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
chmod 755 "$T"
# The programs, where the user can reach them.
mkdir "$T/bin"
cp "$BUILD/pysbx" "$BUILD/pysbx-template" "$T/bin/"
cp -P "$BUILD"/libpysbx.so* "$T/bin/"
chmod -R a+rX "$T/bin"
# The user's own files: a key, a program, a private directory.
H="$T/home"
mkdir -p "$H/.ssh" "$H/bin" "$H/private"
echo "PRIVATE KEY" >"$H/.ssh/id_rsa"
chmod 600 "$H/.ssh/id_rsa"
printf '#!/bin/sh\necho tool\n' >"$H/bin/tool"
chmod 755 "$H/bin/tool"
chmod 700 "$H/.ssh" "$H/private"
chown -R "$USERNAME" "$H"
chmod 755 "$H"
snapshot() { stat -c '%n %a %u %Y' "$H/.ssh/id_rsa" "$H/bin/tool" "$H/private" "$H/.ssh"; }
before=$(snapshot)

cat >"$T/attack.py" <<EOF
import os
done = []
def attempt(name, f):
    try:
        f()
        done.append(name)
    except OSError:
        pass
attempt('read key', lambda: open('$H/.ssh/id_rsa').read())
attempt('chmod key 0666', lambda: os.chmod('$H/.ssh/id_rsa', 0o666))
attempt('setuid tool', lambda: os.chmod('$H/bin/tool', 0o4755))
attempt('open private dir', lambda: os.chmod('$H/private', 0o777))
attempt('utime key', lambda: os.utime('$H/.ssh/id_rsa', (0, 0)))
attempt('chown key', lambda: os.chown('$H/.ssh/id_rsa', os.getuid(), os.getgid()))
attempt('renice the user', lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt('list home', lambda: os.listdir('$H'))
print(done)
EOF
chmod 644 "$T/attack.py"

fails=0
run_as_user() { runuser -u "$USERNAME" -- env LD_LIBRARY_PATH="$T/bin" "$@"; }
run_as_nosub() { runuser -u "$NOSUB" -- env LD_LIBRARY_PATH="$T/bin" "$@"; }
check() { # name, expected, actual
    if [ "$2" = "$3" ]; then echo "ok   $1"; else
        echo "FAIL $1: got '$3', expected '$2'"
        fails=$((fails + 1))
    fi
}

out=$(run_as_user "$T/bin/pysbx" run "$T/attack.py" 2>&1)
check "default layers: nothing of the user's reachable" "[]" "$out"
out=$(run_as_user env PYSBX_TEST_DISABLE_LAYERS=root "$T/bin/pysbx" run --require none \
    "$T/attack.py" 2>&1)
check "no private root: Landlock and seccomp refuse the same" "[]" "$out"
check "the user's files are as they were" "$before" "$(snapshot)"

# With neither Landlock nor a private root, the default refuses to start.
status=0
run_as_user env PYSBX_TEST_DISABLE_LAYERS=root,landlock "$T/bin/pysbx" run "$T/attack.py" \
    >"$T/out" 2>&1 || status=$?
check "no file-system confinement: refuses to start (exit 70)" 70 "$status"
grep -q "file system is not confined" "$T/out" ||
    { echo "FAIL the refusal says why: $(cat "$T/out")"; fails=$((fails + 1)); }

# Doctor tells the truth about what an ordinary user gets.
expect_line() { # name, text, pattern
    if echo "$2" | grep -q "$3"; then echo "ok   $1"; else
        echo "FAIL $1: no line matching '$3' in:"
        echo "$2"
        fails=$((fails + 1))
    fi
}
doc=$(run_as_user "$T/bin/pysbx" doctor 2>&1 || true)
expect_line "doctor: the private root is active" "$doc" "^root      active"
if command -v newuidmap >/dev/null; then
    expect_line "doctor: subordinate ids give a uid per run" "$doc" "^uidrun    active .*subordinate"
    # Two runs of one sandbox: two uids, neither the user's.
    mkdir "$T/progs"
    for i in 1 2; do printf 'import os, time\ntime.sleep(0.3)\nprint(os.getuid())\n' \
        >"$T/progs/p$i.py"; done
    chmod -R a+rX "$T/progs"
    uids=$(run_as_user "$T/bin/pysbx" batch "$T/progs" --jobs 2 2>/dev/null |
        /usr/bin/python3 -c 'import json, sys
print(" ".join(sorted({json.loads(l)["stdout"].strip() for l in sys.stdin})))')
    n=$(echo "$uids" | wc -w)
    check "subordinate ids: concurrent runs have different uids ($uids)" 2 "$n"
fi
doc=$(run_as_nosub "$T/bin/pysbx" doctor 2>&1 || true)
expect_line "doctor without subordinate ids: one uid, and why" "$doc" \
    "^uidrun    UNAVAILABLE .*caller's uid"
out=$(printf 'print(6 * 7)\n' | run_as_nosub "$T/bin/pysbx" run - 2>&1)
check "without subordinate ids runs still work" 42 "$out"

# A single run with packages: its one worker imports them in a mount
# namespace of its own, inside the user's namespace, and the name it is
# given looks up its own uid (with subordinate ids and without).
if [ -d /usr/lib/python3/dist-packages/matplotlib ]; then
    printf '%s\n' 'import getpass, os, pwd, matplotlib.pyplot as plt' 'plt.plot([1, 2])' \
        'print(pwd.getpwnam(getpass.getuser()).pw_uid == os.getuid())' >"$T/chart.py"
    chmod 644 "$T/chart.py"
    for who in user nosub; do
        out=$(cd "$T" && "run_as_$who" "$T/bin/pysbx" run --packages matplotlib --json \
            "$T/chart.py" 2>&1 | /usr/bin/python3 -c 'import json, sys
r = json.load(sys.stdin)
print(r["status"], r["stdout"].strip(), [a["name"] for a in r["artifacts"]])' 2>&1)
        check "$who: a single run with packages, its figure, its own name" \
            "completed True ['figure-1.png']" "$out"
    done
fi

[ "$fails" -eq 0 ] && echo "unprivileged test passed"
exit "$fails"
