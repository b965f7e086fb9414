"""pysbx serve and pysbx batch as a client sees them. Run by test_serve.sh
with Debian's python3; exits non-zero on the first failed check."""
import json, os, socket, stat, subprocess, sys, tempfile, time

PYSBX = sys.argv[1]
failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failures += not ok


def serve(lines, *args):
    p = subprocess.run([PYSBX, "serve", *args], input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True, timeout=120)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines()]


# --- stdin / stdout -------------------------------------------------------
reqs = [
    json.dumps({"id": "slow", "code": "import time\ntime.sleep(1)\nprint('slow')"}),
    json.dumps({"id": 1, "code": "print(1)"}),
    json.dumps({"id": 2, "code": "print(open('a.txt').read())", "files": {"a.txt": "hi"}}),
    json.dumps({"id": 3, "code": "print(open('b', 'rb').read())", "files_base64": {"b": "aGk="}}),
    "this is not json",
    json.dumps({"id": 4}),
    json.dumps({"id": 5, "code": "pass", "limits": {"bogus": 1}}),
    json.dumps({"id": 6, "code": "pass", "limits": {"wall_seconds": -1}}),
    json.dumps({"id": 7, "code": "pass", "files": {"../x": "x"}}),
    json.dumps({"id": 8, "code": "x" * 5000}),
    json.dumps({"id": 9, "code": "while True: pass", "limits": {"cpu_seconds": 0.3}}),
    json.dumps({"id": 10, "code": "raise ValueError('v')"}),
    "",
]
rc, answers = serve(reqs, "--jobs", "4", "--max-line-bytes", "2048")
check("serve exits 0 at end of input", rc == 0, rc)
by_id = {}
for a in answers:
    by_id.setdefault(json.dumps(a.get("id")), []).append(a)
for i in ["slow", 1, 2, 3, 5, 6, 7, 9, 10]:
    check(f"id {i!r} answered exactly once", len(by_id.get(json.dumps(i), [])) == 1)
check("results", by_id['1'][0]["stdout"] == "1\n" and by_id['2'][0]["stdout"] == "hi\n"
      and by_id['3'][0]["stdout"] == "b'hi'\n" and by_id['"slow"'][0]["stdout"] == "slow\n",
      answers)
check("answered as they finish: the slow one last",
      answers[-1].get("id") == "slow", [a.get("id") for a in answers])
errors = {json.dumps(a.get("id")): a["error"]["code"] for a in answers if "error" in a}
check("not JSON: invalid_request, id null", errors.get("null") in
      ("invalid_request", "request_too_large"), errors)
check("no code: invalid_request", errors.get("4") == "invalid_request", errors)
check("unknown limit: invalid_limit", errors.get("5") == "invalid_limit", errors)
check("impossible limit: invalid_limit", errors.get("6") == "invalid_limit", errors)
check("escaping file name: invalid_file", errors.get("7") == "invalid_file", errors)
nulls = [a for a in answers if a.get("id") is None]
check("too long a line and not JSON: two errors with id null",
      sorted(a["error"]["code"] for a in nulls) == ["invalid_request", "request_too_large"], nulls)
check("a CPU spin: timeout/cpu", by_id['9'][0]["status"] == "timeout"
      and by_id['9'][0]["limit"] == "cpu", by_id.get('9'))
check("an exception: completed, exit 1", by_id['10'][0]["exit_code"] == 1
      and "ValueError: v" in by_id['10'][0]["stderr"], by_id.get('10'))

# --- a UNIX socket --------------------------------------------------------
d = tempfile.mkdtemp()
path = os.path.join(d, "pysbx.sock")
srv = subprocess.Popen([PYSBX, "serve", "--listen", path], stderr=subprocess.PIPE, text=True)
for _ in range(200):
    if os.path.exists(path):
        break
    time.sleep(0.05)
check("the socket is 0600", os.path.exists(path) and stat.S_IMODE(os.stat(path).st_mode) == 0o600)


def client(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rw")
    for i in range(n):
        f.write(json.dumps({"id": i, "code": f"print({i} * 3)"}) + "\n")
    f.flush()
    return s, f


c1, f1 = client(3)
c2, f2 = client(2)
got1 = sorted((a["id"], a["stdout"]) for a in (json.loads(f1.readline()) for _ in range(3)))
got2 = sorted((a["id"], a["stdout"]) for a in (json.loads(f2.readline()) for _ in range(2)))
check("each connection gets its own answers", got1 == [(0, "0\n"), (1, "3\n"), (2, "6\n")]
      and got2 == [(0, "0\n"), (1, "3\n")], (got1, got2))
c2.close()
# In flight when the server is told to stop: still answered.
f1.write(json.dumps({"id": "late", "code": "import time\ntime.sleep(0.5)\nprint('late')"}) + "\n")
f1.flush()
time.sleep(0.2)
srv.terminate()
late = json.loads(f1.readline())
check("a request in flight at SIGTERM is still answered", late.get("stdout") == "late\n", late)
c1.close()
check("SIGTERM: exit 0", srv.wait(timeout=30) == 0)
check("the socket is removed", not os.path.exists(path))
os.rmdir(d)

# --- batch ----------------------------------------------------------------
d = tempfile.mkdtemp()
for name, code in [("a_ok.py", "print('a')"), ("b_raise.py", "raise KeyError('k')"),
                   ("c_spin.py", "while True: pass"), ("notes.txt", "not a program")]:
    open(os.path.join(d, name), "w").write(code)
p = subprocess.run([PYSBX, "batch", d, "--jobs", "2", "--cpu", "0.3"], capture_output=True,
                   text=True, timeout=120)
lines = [json.loads(l) for l in p.stdout.splitlines()]
progs = {l["program"]: l for l in lines}
check("batch of a directory: every .py once", sorted(progs) == ["a_ok.py", "b_raise.py",
                                                                 "c_spin.py"], sorted(progs))
check("batch results", progs["a_ok.py"]["stdout"] == "a\n"
      and progs["b_raise.py"]["exit_code"] == 1 and progs["c_spin.py"]["limit"] == "cpu", lines)
check("batch summary", "completed 2 (1 with a non-zero exit code), timeout 1" in p.stderr
      and "p50" in p.stderr and "p99" in p.stderr, p.stderr)
check("batch exit 0 when everything ran", p.returncode == 0, p.returncode)
jl = os.path.join(d, "reqs.jsonl")
with open(jl, "w") as f:
    f.write(json.dumps({"id": "x", "code": "print(2 + 2)"}) + "\n")
    f.write("{broken\n")
    f.write(json.dumps({"code": "print('no id')"}) + "\n")
out = os.path.join(d, "out.jsonl")
p = subprocess.run([PYSBX, "batch", jl, "--out", out], capture_output=True, text=True,
                   timeout=120)
lines = [json.loads(l) for l in open(out)]
check("batch of JSONL: one line each, labelled", sorted(l["program"] for l in lines)
      == ["line 1", "line 2", "line 3"], lines)
check("batch of JSONL: ids and errors", any(l.get("id") == "x" and l["stdout"] == "4\n"
                                             for l in lines)
      and any("error" in l and l["program"] == "line 2" for l in lines), lines)
check("batch exit 1 when a request was refused", p.returncode == 1, p.returncode)
for f in os.listdir(d):
    os.unlink(os.path.join(d, f))
os.rmdir(d)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
