"""pysbx serve and pysbx batch as a client sees them. Run by test_serve.sh
with Debian's python3; exits non-zero on the first failed check."""
import atexit, json, os, socket, stat, subprocess, sys, tempfile, time

PYSBX = sys.argv[1]
failures = 0
started = []  # every server a check starts; killed at exit if still running


@atexit.register
def stop_servers():
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


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
started.append(srv)
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

def section(fn):
    """Runs one group of checks: an exception (a timeout, a server that died)
    is a failure, and the servers it started are stopped before the next."""
    n = len(started)
    try:
        fn()
    except Exception as e:
        check(fn.__name__, False, repr(e))
    finally:
        for p in started[n:]:
            if p.poll() is None:
                p.kill()
                p.wait()


# --- the id comes back as written -------------------------------------------


def the_id_comes_back_as_written():
    raw = [
        ('1.00000000001', '{"id": 1.00000000001, "code": "pass"}'),
        ('1.00000000002', '{"id": 1.00000000002, "code": "pass"}'),
        ('18446744073709551616', '{"id": 18446744073709551616, "code": "pass"}'),
        ('-0.0e00', '{"code": "pass", "id": -0.0e00}'),
        ('"\\u00e9\\"x"', '{"id": "\\u00e9\\"x", "code": "pass"}'),
        ('[1, {"id": 2}]', '{"id": [1, {"id": 2}], "code": "pass"}'),
        ('"esc"', '{"\\u0069d": "esc", "code": "pass"}'),
        ('"last"', '{"id": "first", "code": "pass", "id": "last"}'),
        ('"nested"', '{"files": {"id": "x"}, "id": "nested", "code": "pass"}'),
        ('9.99999999999999999999', '{"id": 9.99999999999999999999, "code": 7}'),
        ('123456789012345678901234567890', '{"id": 123456789012345678901234567890, "x": 1}'),
    ]
    p = subprocess.run([PYSBX, "serve"], input="".join(l + "\n" for _, l in raw).encode(),
                       capture_output=True, timeout=120)
    out = p.stdout.decode().splitlines()
    for text, _ in raw:
        got = [l for l in out if l.startswith('{"id":' + text + ",")]
        check(f"id {text} echoed as written, once", len(got) == 1, out)
    check("no other answers", len(out) == len(raw), out)


# --- unknown fields ----------------------------------------------------------


def unknown_fields():
    rc, answers = serve([json.dumps({"id": 1, "code": "1", "limit": {}}),
                         json.dumps({"id": 2, "code": "1", "Code": "2"})])
    errs = {a["id"]: a.get("error", {}) for a in answers}
    check("an unknown field is refused, named", errs.get(1, {}).get("code") == "invalid_request"
          and "'limit'" in errs[1].get("message", ""), answers)
    check("field names are case-sensitive", errs.get(2, {}).get("code") == "invalid_request"
          and "'Code'" in errs[2].get("message", ""), answers)


# --- messages cut inside a character still make an answer with the id -----------


def messages_cut_inside_a_character_still_make_an_answer_with_the_id():
    long_name = "a" + "\u00e9" * 200
    rc, answers = serve([json.dumps({"id": "f", "code": "pass", "files": {long_name: 5}}),
                         json.dumps({"id": "g", "code": "pass", long_name: 1}),
                         json.dumps({"id": "h", "code": "pass", "limits": {long_name: 1}})])
    by = {a.get("id"): a for a in answers}
    check("a message cut in a character: answered with the id", sorted(map(str, by)) == ["f", "g", "h"]
          and by["f"]["error"]["code"] == "invalid_file"
          and by["g"]["error"]["code"] == "invalid_request"
          and by["h"]["error"]["code"] == "invalid_limit"
          and all(by[k]["error"]["message"].startswith(("file a\u00e9", "unknown"))
                  for k in "fgh"), answers)


# --- ceilings ----------------------------------------------------------------


def ceilings():
    rc, answers = serve([
        json.dumps({"id": "wall", "code": "pass", "limits": {"wall_seconds": 100}}),
        json.dumps({"id": "mem", "code": "pass", "limits": {"memory_bytes": "1G"}}),
        json.dumps({"id": "arts", "code": "pass", "limits": {"max_artifacts": 3}}),
        json.dumps({"id": "out", "code": "pass", "limits": {"max_output_chars": 1001}}),
        json.dumps({"id": "cpu", "code": "pass", "limits": {"cpu_seconds": 2.5}}),
        json.dumps({"id": "ab", "code": "pass", "limits": {"max_artifact_bytes": 4097}}),
        json.dumps({"id": "ok", "code": "print(1)", "limits": {"wall_seconds": 1, "max_artifacts": 2}}),
        json.dumps({"id": "lowered", "code": "import time\ntime.sleep(5)"}),
    ], "--max-wall", "1", "--max-cpu", "2", "--max-memory", "64M", "--max-output", "1000",
        "--max-artifact-bytes", "4096", "--max-artifacts", "2")
    by = {a.get("id"): a for a in answers}
    msg = lambda k: by.get(k, {}).get("error", {}).get("message", "")
    check("over a ceiling: invalid_limit naming it",
          all(by.get(k, {}).get("error", {}).get("code") == "invalid_limit"
              for k in ("wall", "mem", "arts", "out", "cpu", "ab"))
          and msg("wall") == "wall_seconds 100 exceeds the server's ceiling of 1"
          and msg("mem") == "memory_bytes 1073741824 exceeds the server's ceiling of 67108864"
          and msg("arts") == "max_artifacts 3 exceeds the server's ceiling of 2"
          and msg("cpu") == "cpu_seconds 2.5 exceeds the server's ceiling of 2", answers)
    check("at the ceiling: runs", by.get("ok", {}).get("stdout") == "1\n", by.get("ok"))
    check("a default above a ceiling is lowered to it",
          by.get("lowered", {}).get("status") == "timeout" and by["lowered"]["limit"] == "wall"
          and "1 s" in by["lowered"]["reason"], by.get("lowered"))
    for bad in (["--max-memory", "1M"], ["--max-wall", "0"], ["--max-artifacts", "x"]):
        p = subprocess.run([PYSBX, "serve", *bad], capture_output=True, text=True, timeout=60)
        check(f"serve {' '.join(bad)}: usage error", p.returncode == 2, (p.returncode, p.stderr))
    h = subprocess.run([PYSBX, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    check("serve --help documents the ceilings", all(
        o in h for o in ("--max-wall", "--max-cpu", "--max-memory", "--max-output",
                         "--max-artifact-bytes", "--max-artifacts")), h)


section(the_id_comes_back_as_written)
section(unknown_fields)
section(messages_cut_inside_a_character_still_make_an_answer_with_the_id)
section(ceilings)

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
    f.write('{"id": 1.00000000001, "code": "pass"}\n')
out = os.path.join(d, "out.jsonl")
p = subprocess.run([PYSBX, "batch", jl, "--out", out], capture_output=True, text=True,
                   timeout=120)
lines = [json.loads(l) for l in open(out)]
check("batch of JSONL: one line each, labelled", sorted(l["program"] for l in lines)
      == ["line 1", "line 2", "line 3", "line 4"], lines)
check("batch of JSONL: the id as written",
      '{"program":"line 4","id":1.00000000001,"status":"completed"' in open(out).read())
check("batch of JSONL: ids and errors", any(l.get("id") == "x" and l["stdout"] == "4\n"
                                             for l in lines)
      and any("error" in l and l["program"] == "line 2" for l in lines), lines)
check("batch exit 1 when a request was refused", p.returncode == 1, p.returncode)
for f in os.listdir(d):
    os.unlink(os.path.join(d, f))
os.rmdir(d)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
