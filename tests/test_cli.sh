#!/usr/bin/env bash
# The command as a user types it: options, exit statuses, --json, artifacts.
# usage: test_cli.sh PATH/TO/pysbx SOURCE_DIR
set -u
PYSBX=$1
SRC=$2
PYSBX_ABS=$(cd "$(dirname "$PYSBX")" && pwd)/$(basename "$PYSBX")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

check() { # check NAME EXPECTED_STATUS ACTUAL_STATUS
    if [ "$2" != "$3" ]; then
        echo "FAIL $1: exit status $3, expected $2"; fails=$((fails + 1))
    else
        echo "ok   $1"
    fi
}
expect_in() { # expect_in NAME NEEDLE FILE
    if grep -qF -- "$2" "$3"; then echo "ok   $1"; else
        echo "FAIL $1: '$2' not in:"; cat "$3"; fails=$((fails + 1)); fi
}
# Debian's interpreter, which has python3-jsonschema (scripts/setup installs it).
PY=/usr/bin/python3
json_field() { # json_field FILE EXPR
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(($2))" "$1"
}

# --- usage ---
"$PYSBX" run --help >"$T/help" 2>&1; check "help" 0 $?
for opt in --json --wall --cpu --memory --max-output --max-artifact-bytes --max-artifacts \
           --file --artifacts-dir --connect; do
    expect_in "help documents $opt" "$opt" "$T/help"
done
"$PYSBX" >/dev/null 2>&1; check "no command" 2 $?
"$PYSBX" frobnicate >/dev/null 2>&1; check "unknown command" 2 $?
echo 'print(1)' >"$T/one.py"
"$PYSBX" run --bogus "$T/one.py" >/dev/null 2>"$T/err"; check "unknown option" 2 $?
expect_in "unknown option message" "unknown option" "$T/err"
"$PYSBX" run >/dev/null 2>&1; check "no script" 2 $?
"$PYSBX" serve --wall 5 </dev/null >/dev/null 2>"$T/err"; check "an option of another command" 2 $?
expect_in "it names the option, not its value" "serve does not take --wall" "$T/err"
"$PYSBX" run --cpu 5e0 --wall 1e1 "$T/one.py" >/dev/null 2>&1; check "seconds with an exponent" 0 $?
"$PYSBX" run --wall 0x10 "$T/one.py" >/dev/null 2>"$T/err"; check "hexadecimal seconds" 2 $?
expect_in "are refused by name" "--wall wants a number of seconds above 0, not '0x10'" "$T/err"
# Sizes in messages as a person writes them (sparse files: nothing is read
# past the limit).
truncate -s 65M "$T/big.py"
"$PYSBX" run "$T/big.py" >/dev/null 2>"$T/err"; check "a program past the code limit" 2 $?
expect_in "says the limit" "larger than the code limit of 64 MiB" "$T/err"
truncate -s 257M "$T/big.in"
"$PYSBX" run --stdin "$T/big.in" "$T/one.py" >/dev/null 2>"$T/err"
check "--stdin past the request limit" 2 $?
expect_in "says that limit" "larger than a request may be, 256 MiB" "$T/err"
rm -f "$T/big.py" "$T/big.in"
"$PYSBX" batch "$T/one.py" >"$T/out" 2>"$T/err"; check "batch of one .py file" 2 $?
expect_in "says what batch wants" "batch wants a directory of .py files or a .jsonl file" "$T/err"
printf '%s\n' '{"id": 1, "code": "import time\ntime.sleep(2)"}' \
    '{"id": 2, "code": "import time\ntime.sleep(1)", "limits": {"wall_seconds": 5}}' >"$T/lines.jsonl"
"$PYSBX" batch "$T/lines.jsonl" --wall 0.5 --jobs 2 >"$T/lines.out" 2>/dev/null
check "batch --wall is the default of request lines; a line's own limit wins" \
    "1 timeout wall 2 completed None" \
    "$($PY -c 'import json, sys
rs = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda r: r["id"])
print(*("%s %s %s" % (r["id"], r["status"], r["limit"]) for r in rs))' "$T/lines.out")"
# A count as well as seconds: --max-output is a default too.
printf '%s\n' '{"id": 1, "code": "print(\"x\" * 50)"}' \
    '{"id": 2, "code": "print(\"x\" * 50)", "limits": {"max_output_chars": 100}}' >"$T/out.jsonl"
"$PYSBX" batch "$T/out.jsonl" --max-output 10 >"$T/out.out" 2>/dev/null
check "batch --max-output is the default of request lines; a line's own wins" "1 True 2 False" \
    "$($PY -c 'import json, sys
rs = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda r: r["id"])
print(*("%s %s" % (r["id"], r["stdout_truncated"]) for r in rs))' "$T/out.out")"
printf 'open("made", "w").write("1")\nprint("ran")\n' >"$T/makes.py"
touch "$T/not-a-dir"
"$PYSBX" run --artifacts-dir "$T/not-a-dir" "$T/makes.py" >"$T/out" 2>"$T/err"
check "--artifacts-dir that cannot take the files" 2 $?
expect_in "is said" "--artifacts-dir $T/not-a-dir: Not a directory" "$T/err"
check "before the code runs" "" "$(cat "$T/out")"
mkdir -p "$T/mods" && echo 'X = 41' >"$T/mods/mymod.py"
echo 'import mymod; print(mymod.X + 1)' >"$T/usemod.py"
check "--module-dir makes its modules importable" 42 \
    "$("$PYSBX" run --module-dir "$T/mods" "$T/usemod.py" 2>&1; echo $? >"$T/rc")" 2>/dev/null
check "--module-dir: exit 0" 0 "$(cat "$T/rc")"
"$PYSBX" run --module-dir "$T/no-such-dir" "$T/usemod.py" >/dev/null 2>&1
check "--module-dir of nothing is refused" 2 $?
printf 'import mymod, os\nd = os.path.dirname(mymod.__file__)\ntry:\n    open(os.path.join(d, "mine.py"), "w")\n    print("written")\nexcept OSError as e:\n    print("refused")\n' >"$T/writemod.py"
check "--module-dir is read-only to the code" refused \
    "$("$PYSBX" run --module-dir "$T/mods" "$T/writemod.py" 2>&1)"
check "and nothing was written there" no "$([ -e "$T/mods/mine.py" ] && echo yes || echo no)"
printf 'with open("big", "wb") as f:\n    for i in range(140):\n        f.write(bytes(1 << 20))\nprint("wrote 140 MiB")\n' >"$T/big.py"
"$PYSBX" run "$T/big.py" >/dev/null 2>&1
check "140 MiB do not fit the default workspace" 1 $?
"$PYSBX" run --workspace-size 256M "$T/big.py" >/dev/null 2>&1
check "--workspace-size 256M: they do" 0 $?
"$PYSBX" run "$T/missing.py" >/dev/null 2>&1; check "missing script" 2 $?
for bad in "--wall 0" "--wall -1" "--wall abc" "--cpu nan" "--memory 12Q" "--memory 0" \
           "--memory 1K" "--max-output -5" "--max-artifacts x" "--wall 1e9"; do
    # shellcheck disable=SC2086
    "$PYSBX" run $bad "$T/one.py" >/dev/null 2>"$T/err"; check "refuses $bad" 2 $?
    [ -s "$T/err" ] || { echo "FAIL $bad: no message"; fails=$((fails + 1)); }
done
for bad in "../x=$T/one.py" "/abs=$T/one.py" "a/../b=$T/one.py" "noequals" "x=$T/nope"; do
    "$PYSBX" run --file "$bad" "$T/one.py" >/dev/null 2>&1; check "refuses --file $bad" 2 $?
done

"$PYSBX" run --require bogus "$T/one.py" >/dev/null 2>&1; check "refuses --require bogus" 2 $?
"$PYSBX" run --require none "$T/one.py" >/dev/null; check "--require none" 0 $?
"$PYSBX" run --require seccomp,caps,rlimits "$T/one.py" >/dev/null; check "--require present layers" 0 $?

# --- doctor tells the truth ---
"$PYSBX" doctor >"$T/doctor"; check "doctor" 0 $?
for layer in seccomp landlock netns mountns ipcns utsns user rlimits caps; do
    expect_in "doctor reports $layer" "$layer" "$T/doctor"
done
"$PYSBX" doctor --json >"$T/doctor.json"; check "doctor --json" 0 $?
# Landlock: the ABI doctor reports is the one the kernel reports to us.
abi=$($PY -c 'import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1))')
reported=$(json_field "$T/doctor.json" 'r["layers"]["landlock"]["active"], r["layers"]["landlock"]["detail"].split(":")[0]')
if [ "$abi" -gt 0 ]; then want="(True, 'ABI $abi')"; else want="False"; fi
case "$reported" in "$want"*) echo "ok   doctor landlock matches the kernel ($abi)";;
    *) echo "FAIL doctor landlock: $reported, kernel ABI $abi"; fails=$((fails + 1));; esac
# Seccomp: a run's own view of itself (there is no /proc to read it from):
# fork is refused with EPERM only by the filter.
printf 'import os\ntry:\n    os.fork()\nexcept OSError as e:\n    print(e.errno)\n' |
    "$PYSBX" run - >"$T/sc"; [ "$(cat "$T/sc")" = 1 ] && echo "ok   runs are in seccomp filter mode" ||
    { echo "FAIL seccomp mode: $(cat "$T/sc")"; fails=$((fails + 1)); }
uid_active=$(json_field "$T/doctor.json" 'r["layers"]["uidrun"]["active"]')
want_req="['seccomp'] [['landlock', 'root']]"
[ "$(id -u)" -eq 0 ] && want_req="['seccomp', 'uidrun'] [['landlock', 'root']]"
check_eq() { # check_eq NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then echo "ok   $1"; else
        echo "FAIL $1: got '$3', expected '$2'"; fails=$((fails + 1)); fi
}
check_eq "doctor --json marks what the default --require requires" "$want_req" \
    "$(json_field "$T/doctor.json" '"%s %s" % ([k for k, v in r["layers"].items() if v["required"]], r["required_one_of"])')"
"$PYSBX" doctor --json --require netns >"$T/doctor2.json"
check_eq "and what a given --require does" "['netns'] []" \
    "$(json_field "$T/doctor2.json" '"%s %s" % ([k for k, v in r["layers"].items() if v["required"]], r["required_one_of"])')"
expect_in "doctor's text says it too" "required: " "$T/doctor"
run_uid=$(echo 'import os; print(os.getuid())' | "$PYSBX" run -)
if [ "$(id -u)" -eq 0 ]; then
    [ "$uid_active" = True ] && [ "$run_uid" -ge 2130706432 ] &&
        echo "ok   root: workers run as uids of the default range" ||
        { echo "FAIL uidrun layer: $uid_active, code ran as $run_uid"; fails=$((fails + 1)); }
fi

# --- running ---
out=$("$PYSBX" run "$T/one.py"); check "run" 0 $?
[ "$out" = "1" ] || { echo "FAIL run output: $out"; fails=$((fails + 1)); }
echo 'import sys; print("hi"); print("oops", file=sys.stderr); sys.exit(7)' | "$PYSBX" run - \
    >"$T/out" 2>"$T/err"; check "exit status passes through" 7 $?
expect_in "stdout kept" "hi" "$T/out"
expect_in "stderr kept" "oops" "$T/err"
echo 'raise ValueError("bad")' | "$PYSBX" run - >/dev/null 2>"$T/err"; check "exception" 1 $?
expect_in "traceback" "ValueError: bad" "$T/err"
echo 'while True: pass' | "$PYSBX" run --cpu 0.2 - >/dev/null 2>"$T/err"; check "cpu timeout" 124 $?
expect_in "cpu timeout says which" "CPU time limit" "$T/err"
echo 'import time; time.sleep(5)' | "$PYSBX" run --wall 0.3 - >/dev/null 2>"$T/err"
check "wall timeout" 124 $?
expect_in "wall timeout says which" "wall time limit" "$T/err"
echo 'x = bytearray(1 << 30)' | "$PYSBX" run --memory 64M - >/dev/null 2>"$T/err"
check "memory limit" 125 $?
expect_in "memory limit says which, as the user wrote it" "memory limit of 64 MiB exceeded" "$T/err"
echo 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)' | "$PYSBX" run - >/dev/null 2>&1
check "crash" $((128 + 11)) $?

# --- JSON ---
echo 'print("x" * 50); open("o.txt", "w").write("data")' |
    "$PYSBX" run --json --max-output 10 - >"$T/r.json"; check "json" 0 $?
[ "$(json_field "$T/r.json" 'sorted(r)')" = "['artifacts', 'artifacts_dropped', 'dropped_artifacts', 'error', 'exit_code', 'limit', 'partial', 'reason', 'signal', 'stats', 'status', 'stderr', 'stderr_truncated', 'stdout', 'stdout_truncated', 'value']" ] ||
    { echo "FAIL json fields: $(json_field "$T/r.json" 'sorted(r)')"; fails=$((fails + 1)); }
[ "$(json_field "$T/r.json" 'r["status"], r["exit_code"], r["stdout_truncated"], r["artifacts"][0]["name"], r["artifacts"][0]["content_base64"]')" = "('completed', 0, True, 'o.txt', 'ZGF0YQ==')" ] ||
    { echo "FAIL json values"; cat "$T/r.json"; fails=$((fails + 1)); }
echo 'while True: pass' | "$PYSBX" run --json --cpu 0.2 - >"$T/t.json"; check "json timeout" 0 $?
[ "$(json_field "$T/t.json" 'r["status"], r["limit"], r["exit_code"], r["partial"]')" = "('timeout', 'cpu', None, True)" ] ||
    { echo "FAIL json timeout"; cat "$T/t.json"; fails=$((fails + 1)); }

# What the code printed before a limit fired, without flushing, is there.
printf 'import time\nfor i in range(100): print("step", i)\ntime.sleep(5)\n' |
    "$PYSBX" run --json --wall 1 - >"$T/w.json"; check "json wall" 0 $?
[ "$(json_field "$T/w.json" 'r["status"], r["limit"], r["partial"], r["stdout"].count("step"), r["stdout"].endswith("step 99\n")')" = "('timeout', 'wall', True, 100, True)" ] ||
    { echo "FAIL output before the wall limit"; cat "$T/w.json"; fails=$((fails + 1)); }

# Arguments and standard input reach the program; without --stdin its
# stdin is empty.
printf 'import sys\nprint(sys.argv, input())\n' >"$T/args.py"
echo hello >"$T/in.txt"
check "run FILE ARG... --stdin FILE" "['$T/args.py', 'a', 'b c'] hello" \
    "$("$PYSBX" run "$T/args.py" a "b c" --stdin "$T/in.txt")"
check "run --stdin - FILE -- -v" "['$T/args.py', '-v', 'x'] piped" \
    "$(echo piped | "$PYSBX" run --stdin - "$T/args.py" -- -v x)"
"$PYSBX" run "$T/args.py" </dev/null >/dev/null 2>"$T/err"; check "no --stdin: input() meets its end" 1 $?
expect_in "no --stdin: EOFError" "EOFError" "$T/err"
# The program's name, as python3 FILE gives it: sys.argv[0], __file__, the
# traceback's file; standard input's is "<stdin>".
expect_in "a traceback names the file as given" "File \"$T/args.py\", line 2, in <module>" "$T/err"
printf 'print(__file__)\n1/0\n' >"$T/named.py"
(cd "$T" && "$PYSBX_ABS" run named.py) >"$T/out" 2>"$T/err"
check "__file__ is the name given" "named.py" "$(cat "$T/out")"
expect_in "and the traceback shows its line" "    1/0" "$T/err"
printf 'import sys\nprint(__file__, sys.argv)\n1/0\n' | "$PYSBX" run - >"$T/out" 2>"$T/err"
check "standard input's: <stdin>, argv[0] -" "<stdin> ['-']" "$(cat "$T/out")"
expect_in "standard input's traceback" 'File "<stdin>", line 3' "$T/err"
echo x | "$PYSBX" run --stdin - - >/dev/null 2>&1; check "--stdin - with the program on stdin: usage error" 2 $?

# The bytes of all artifacts together are bounded: 32 sparse files of a
# gigabyte give at most the ceiling, the rest counted.
printf 'for i in range(32):\n    with open("s%%02d" %% i, "wb") as f: f.truncate(1 << 30)\n' >"$T/sparse.py"
"$PYSBX" run --json --memory 1G --max-artifacts-total-bytes 5000000 "$T/sparse.py" >"$T/s.json"; check "json sparse" 0 $?
check "the artifacts' total is bounded" "1 31 True" \
    "$(json_field "$T/s.json" 'len(r["artifacts"]), r["artifacts_dropped"], sum(len(a["content_base64"]) for a in r["artifacts"]) <= 4 * 5000000 // 3 + 4' | tr -d "(),")"
"$PYSBX" run --max-artifacts-total-bytes 2000000000 "$T/sparse.py" >/dev/null 2>&1; check "a total past the range: usage error" 2 $?


# --- the shipped example, files in and out ---
"$PYSBX" run --file sales.csv="$SRC/examples/sales.csv" --artifacts-dir "$T/arts" \
    "$SRC/examples/report.py" >"$T/ex"; check "example" 0 $?
expect_in "example output" "best region: east" "$T/ex"
expect_in "example artifact" "east,31,131.75" "$T/arts/summary.csv"
[ -e "$T/arts/sales.csv" ] && { echo "FAIL unchanged input came back"; fails=$((fails + 1)); }
echo 'import os; os.makedirs("sub/dir"); open("sub/dir/x.txt", "w").write("x")' |
    "$PYSBX" run --artifacts-dir "$T/nested" - ; check "nested artifact" 0 $?
[ "$(cat "$T/nested/sub/dir/x.txt")" = "x" ] || { echo "FAIL nested artifact"; fails=$((fails + 1)); }

# An artifact name that meets a symbolic link already in DIR does not follow it.
mkdir -p "$T/dir" "$T/outside"
ln -s "$T/outside" "$T/dir/link"
echo 'import os; os.mkdir("link"); open("link/planted", "w").write("x")' |
    "$PYSBX" run --artifacts-dir "$T/dir" - >/dev/null 2>&1
[ -e "$T/outside/planted" ] && { echo "FAIL artifact followed a link"; fails=$((fails + 1)); } ||
    echo "ok   artifacts-dir does not follow links"

# Names that are not UTF-8 stay apart: each its own escaped name with its
# bytes, and --artifacts-dir writes each under its true name.
printf 'for n in (b"\\xff", b"\\xfe", "\\ufffd"):\n    open(n, "w").write(repr(n))\nimport os\nopen("a", "w").write("a")\nos.link("a", "b")\nos.chmod("a", 0)\n' >"$T/odd.py"
"$PYSBX" run --json "$T/odd.py" >"$T/odd.json"; check "odd names: run --json" 0 $?
check "odd names: five files, five names, their bytes" "5 5 ['a', 'b', '\\ufffd', '\\xfe', '\\xff'] 0" \
    "$(json_field "$T/odd.json" '" ".join(map(str, (len(r["artifacts"]), len({a["name"] for a in r["artifacts"]}), ascii([__import__("base64").b64decode(a.get("name_base64") or __import__("base64").b64encode(a["name"].encode())).decode("utf-8", "surrogateescape") for a in r["artifacts"]]), r["artifacts_dropped"])))' | sed 's/\\udc/\\x/g')"
"$PYSBX" run --artifacts-dir "$T/odd" "$T/odd.py" 2>"$T/err"; check "odd names: --artifacts-dir" 0 $?
check "odd names: each written under its true name" "a b $(printf '\xef\xbf\xbd \xfe \xff')" "$(cd "$T/odd" && ls | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')"
check "odd names: what each holds" "b'\\xff'" "$(cat "$T/odd/$(printf '\xff')")"
# What is not returned is said, with why.
printf 'for n in "abc":\n    open(n, "w").write(n)\n' >"$T/three.py"
"$PYSBX" run --json --max-artifacts 1 "$T/three.py" >"$T/three.json"
check "dropped files are listed with why" "['b', 'c'] max_artifacts 2" \
    "$(json_field "$T/three.json" '[d["name"] for d in r["dropped_artifacts"]], r["dropped_artifacts"][0]["reason"], r["artifacts_dropped"]' | tr -d "(),'" | sed "s/\[b c\]/['b', 'c']/")"
"$PYSBX" run --max-artifacts 1 --artifacts-dir "$T/three" "$T/three.py" 2>"$T/err"
expect_in "--artifacts-dir says what was not returned" "not returned: b (past --max-artifacts)" "$T/err"

# Every JSON answer obeys the published schema.
for f in "$T/r.json" "$T/t.json" "$T/w.json" "$T/odd.json" "$T/three.json"; do
    $PY - "$SRC/docs/result.schema.json" "$f" <<'PYEOF' && echo "ok   schema $(basename "$f")" ||
import json, sys, jsonschema
jsonschema.validate(json.load(open(sys.argv[2])), json.load(open(sys.argv[1])))
PYEOF
    { echo "FAIL $f does not match the schema"; fails=$((fails + 1)); }
done

# --- nothing left behind ---
# SIGTERM (and SIGINT) cancel the run, close the sandbox and remove its work
# directory; the exit status says which signal.
W=$(mktemp -d)
chmod 711 "$W"
trap 'rm -rf "$T" "$W"' EXIT
mkdir -p "$W"
chmod 711 "$W"
echo 'import time; print("up", flush=True); time.sleep(30)' >"$T/sleep.py"
TMPDIR="$W" "$PYSBX" run "$T/sleep.py" >"$T/sig.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q up "$T/sig.out" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
check "SIGTERM: run exits 128+15" 143 "$status"
left=$(ls -A "$W")
check "SIGTERM: run leaves nothing in the work root" "" "$left"
mkdir -p "$T/progs"
for i in 1 2 3 4 5 6; do cp "$T/sleep.py" "$T/progs/p$i.py"; done
TMPDIR="$W" "$PYSBX" batch "$T/progs" --jobs 2 >"$T/batch.out" 2>"$T/batch.err" &
pid=$!
for _ in $(seq 100); do [ -s "$T/batch.err" ] || [ -n "$(ls -A "$W")" ] && break; sleep 0.05; done
sleep 0.5
kill -INT "$pid"
status=0
wait "$pid" || status=$?
check "SIGINT: batch exits 128+2" 130 "$status"
expect_in "SIGINT: batch still prints its summary" "stopped by signal 2" "$T/batch.err"
check "SIGINT: batch leaves nothing in the work root" "" "$(ls -A "$W")"
# pysbx mcp: SIGTERM ends the input, answers what is in flight, closes.
mkfifo "$T/mcp.in"
TMPDIR="$W" "$PYSBX" mcp <"$T/mcp.in" >"$T/mcp.out" 2>&1 &
pid=$!
exec 9>"$T/mcp.in" # the client: input stays open
for _ in $(seq 100); do [ -n "$(ls -A "$W")" ] && break; sleep 0.05; done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
exec 9>&-
check "SIGTERM: mcp exits 128+15" 143 "$status"
check "SIGTERM: mcp leaves nothing in the work root" "" "$(ls -A "$W")"
# The interpreter is the system's shared libpython, mapped from its file
# (a security update of it reaches the next template), not a copy linked in.
"$PYSBX" run "$T/sleep.py" >"$T/m.out" 2>&1 &
run=$!
for _ in $(seq 100); do grep -q up "$T/m.out" 2>/dev/null && break; sleep 0.05; done
tmpl=$(pgrep -P "$run" -x pysbx-template | head -1)
check "the template maps the system's libpython" 1 \
    "$([ -n "$tmpl" ] && grep -c 'libpython3\.[0-9]*\.so' <(awk '{print $6}' "/proc/$tmpl/maps" | sort -u))"
kill -TERM "$run"
wait "$run" 2>/dev/null || true
# A run killed with SIGKILL leaves its work directory; the next start
# removes it (its owner lock is free), but never a live one's.
TMPDIR="$W" "$PYSBX" run "$T/sleep.py" >"$T/k.out" 2>&1 &
killed=$!
for _ in $(seq 100); do grep -q up "$T/k.out" 2>/dev/null && break; sleep 0.05; done
kill -KILL "$killed"
wait "$killed" 2>/dev/null || true
stale=$(ls -A "$W")
TMPDIR="$W" "$PYSBX" run "$T/sleep.py" >"$T/l.out" 2>&1 &
live=$!
for _ in $(seq 100); do grep -q up "$T/l.out" 2>/dev/null && break; sleep 0.05; done
for d in "$W"/pysbx-*; do touch -d '1 minute ago' "$d/.owner"; done # both look old
echo 'print(1)' | TMPDIR="$W" "$PYSBX" run - >/dev/null
[ -n "$stale" ] && [ ! -e "$W/$stale" ] && echo "ok   a SIGKILLed run's work directory is removed by the next start" ||
    { echo "FAIL stale work directory $stale still there: $(ls -A "$W")"; fails=$((fails + 1)); }
check "a live run's work directory is left alone" 1 "$(ls -A "$W" | wc -l)"
kill -TERM "$live"
wait "$live" 2>/dev/null || true
check "and goes when it ends" "" "$(ls -A "$W")"

# --- without CAP_KILL (a container that dropped it): refused at start, never a
# run that goes on past its wall limit ---
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
    printf 'import time\ntime.sleep(3)\nprint("done")\n' >"$T/sleep3.py"
    setpriv --bounding-set -kill --inh-caps -kill "$PYSBX" run --wall 0.5 "$T/sleep3.py" >"$T/out" 2>"$T/err"
    check "no CAP_KILL: the sandbox refuses to start" 70 $?
    expect_in "no CAP_KILL: says why" "CAP_KILL" "$T/err"
    [ ! -s "$T/out" ] && echo "ok   no CAP_KILL: nothing ran" || { echo "FAIL no CAP_KILL: the code ran"; fails=$((fails + 1)); }
    # The process that held its ids (another uid, which it could not kill)
    # ends with it: none is left to the system's init.
    for _ in $(seq 50); do
        orphans=$(ps -eo ppid=,comm= | awk '$1 == 1 && $2 == "pysbx-claim"' | wc -l)
        [ "$orphans" -eq 0 ] && break
        sleep 0.1
    done
    check "no CAP_KILL: no process of its ids is left" 0 "$orphans"
else
    echo "skip no CAP_KILL (needs root and setpriv)"
fi

# --- run --connect: the same program through a running server ---
SOCK="$T/serve.sock"
"$PYSBX" serve --listen "$SOCK" >"$T/serve.log" 2>&1 &
server=$!
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
printf 'import sys\nprint("out")\nprint("err", file=sys.stderr)\nopen("made.txt", "w").write("m")\nsys.exit(3)\n' >"$T/both.py"
"$PYSBX" run "$T/both.py" >"$T/l.out" 2>"$T/l.err"; local_status=$?
"$PYSBX" run --connect "$SOCK" "$T/both.py" >"$T/r.out" 2>"$T/r.err"; check "--connect: the same exit status" "$local_status" $?
cmp -s "$T/l.out" "$T/r.out" && echo "ok   --connect: the same stdout" || { echo "FAIL --connect stdout differs"; fails=$((fails + 1)); }
cmp -s "$T/l.err" "$T/r.err" && echo "ok   --connect: the same stderr" || { echo "FAIL --connect stderr differs"; diff "$T/l.err" "$T/r.err"; fails=$((fails + 1)); }
PYSBX_CONNECT="$SOCK" "$PYSBX" run --artifacts-dir "$T/rarts" "$T/both.py" >/dev/null 2>&1; check "PYSBX_CONNECT: the same exit status" 3 $?
[ "$(cat "$T/rarts/made.txt" 2>/dev/null)" = m ] && echo "ok   --connect: artifacts saved" || { echo "FAIL --connect artifacts"; fails=$((fails + 1)); }
"$PYSBX" run --connect "$SOCK" --json "$T/both.py" >"$T/r.json"; check "--connect --json" 0 $?
check "--connect --json: the result object" "completed 3 1" "$(json_field "$T/r.json" "r['status'], r['exit_code'], len(r['artifacts'])" | tr -d "(),'")"
echo '6*7' | "$PYSBX" run --connect "$SOCK" --json - >"$T/v.json"; check "--connect --json -: exit 0" 0 $?
check "--connect --json: the last expression's value as the server sent it" "42" "$(json_field "$T/v.json" "r['value']")"
printf 'import time\ntime.sleep(5)\n' >"$T/slow.py"
"$PYSBX" run --connect "$SOCK" --wall 0.3 "$T/slow.py" >/dev/null 2>"$T/err"; check "--connect: a limit given is sent" 124 $?
expect_in "--connect: says which limit" "wall time limit" "$T/err"
printf 'print(1' >"$T/syntax.py"
"$PYSBX" run --connect "$SOCK" "$T/syntax.py" >/dev/null 2>"$T/err"; check "--connect: a syntax error" 1 $?
expect_in "--connect: its traceback" "SyntaxError" "$T/err"
check "--connect: arguments, the name and stdin are sent" "['$T/args.py', 'a', '-b'] hello" \
    "$("$PYSBX" run --connect "$SOCK" --stdin "$T/in.txt" "$T/args.py" a -- -b)"
# An exception is a result (with its error), not a refusal of the request.
"$PYSBX" run --connect "$SOCK" --json "$T/syntax.py" >"$T/e.json"; check "--connect --json: an exception is a result" 0 $?
check "--connect --json: the code's error as the server sent it" "completed 1 SyntaxError" "$(json_field "$T/e.json" "r['status'], r['exit_code'], r['error']['type']" | tr -d "(),'")"
"$PYSBX" run --connect "$SOCK" --artifacts-dir "$T/rodd" "$T/odd.py" 2>"$T/err"; check "--connect: odd names saved" 0 $?
check "--connect: each under its true name" "a b $(printf '\xef\xbf\xbd \xfe \xff')" "$(cd "$T/rodd" && ls | LC_ALL=C sort | tr '\n' ' ' | sed 's/ $//')"
"$PYSBX" run --connect "$SOCK" --json --max-artifacts 1 "$T/three.py" >"$T/rthree.json"
check "--connect --json: the dropped list as the server sent it" "2 2" \
    "$(json_field "$T/rthree.json" 'len(r["dropped_artifacts"]), r["artifacts_dropped"]' | tr -d "(),")"
printf '\xff\xfe' >"$T/bytes.py"
"$PYSBX" run --connect "$SOCK" "$T/bytes.py" >/dev/null 2>"$T/err"; check "--connect: a program that is not UTF-8 is refused" 2 $?
"$PYSBX" run --connect "$SOCK" --template /bin/true "$T/one.py" >/dev/null 2>&1; check "--connect refuses local sandbox options" 2 $?
kill -TERM "$server"; wait "$server" 2>/dev/null
"$PYSBX" run --connect "$SOCK" "$T/one.py" >/dev/null 2>"$T/err"; check "--connect: no server is a sandbox failure" 70 $?
expect_in "--connect: says why" "--connect $SOCK" "$T/err"

# pysbx batch on a terminal: the bar, the result lines, the percentiles.
$PY "$SRC/tests/batch_tty.py" "$PYSBX" "$T" || fails=$((fails + 1))

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
