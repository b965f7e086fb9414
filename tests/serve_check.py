"""pysbx serve and pysbx batch as a client sees them. Run by test_serve.sh
with Debian's python3; exits non-zero on the first failed check."""
import atexit, json, os, random, select, shutil, signal, socket, stat, subprocess, sys, tempfile, time
import base64, re
import jsonschema
from procs import children, comm, none_of_uids
from statedir import flip, image_path, images, wait_for

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


# Every result a server answers obeys the published schema.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                       "result.schema.json")) as f:
    SCHEMA = json.load(f)


def valid_results(answers):
    """The results among |answers| that do not obey the schema, with why."""
    bad = []
    for a in answers:
        if isinstance(a, dict) and "status" in a:
            try:
                jsonschema.validate(a, SCHEMA)
            except jsonschema.ValidationError as e:
                bad.append((a.get("id"), e.message))
    return bad


def refusal(a):
    """The error of a refused request: an error and no status (a result's
    error is its code's exception); {} for anything else."""
    return (a.get("error") or {}) if "status" not in a else {}


def serve(lines, *args):
    p = subprocess.run([PYSBX, "serve", *args], input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True, timeout=120)
    answers = [json.loads(l) for l in p.stdout.splitlines()]
    bad = valid_results(answers)
    if bad:
        check("the results obey the schema", False, bad)
    return p.returncode, answers


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
# Id 9 is left out: when its CPU-time limit fires depends on how much CPU a
# loaded machine gives it, and it may well end after the slow one.
order = [a.get("id") for a in answers]
check("answered as they finish: the slow one after the quick ones",
      all(order.index("slow") > order.index(i) for i in [1, 2, 3, 10]), order)
# A refusal: an error and no status (a result's error is its code's exception).
errors = {json.dumps(a.get("id")): a["error"]["code"] for a in answers if "status" not in a}
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
check("an exception: its error, typed", by_id['10'][0]["error"]["type"] == "ValueError"
      and by_id['10'][0]["error"]["message"] == "v"
      and by_id['10'][0]["error"]["traceback"].endswith("ValueError: v\n"), by_id.get('10'))
check("no exception: error null", by_id['1'][0]["error"] is None, by_id.get('1'))

# --- stdin and argv -----------------------------------------------------------
rc, answers = serve([
    json.dumps({"id": "in", "code": "import sys\nprint(input(), sys.argv, repr(sys.stdin.read()))",
                "stdin": "5\nrest", "argv": ["a", "-b"]}),
    json.dumps({"id": "in64", "code": "import sys\nprint(sys.stdin.buffer.read())",
                "stdin_base64": "/wA="}),
    json.dumps({"id": "none", "code": "input()"}),
    json.dumps({"id": "both", "code": "pass", "stdin": "a", "stdin_base64": "YQ=="}),
    json.dumps({"id": "badargv", "code": "pass", "argv": "a b"}),
    json.dumps({"id": "cellin", "session": "s", "code": "pass", "stdin": "x"}),
    json.dumps({"id": "cellargv", "session": "s", "code": "import sys\nprint(sys.argv)",
                "argv": ["c"]}),
    json.dumps({"id": "named", "code": "import sys\nprint(sys.argv, __file__)\n1/0",
                "filename": "report.py"}),
    json.dumps({"id": "badname", "code": "pass", "filename": 7}),
])
by = {a.get("id"): a for a in answers}
check("stdin and argv reach the program",
      by.get("in", {}).get("stdout") == "5 ['', 'a', '-b'] 'rest'\n"
      and by.get("in64", {}).get("stdout") == "b'\\xff\\x00'\n", answers)
check("no stdin: input() raises EOFError",
      (by.get("none", {}).get("error") or {}).get("type") == "EOFError", by.get("none"))
check("stdin and stdin_base64 together, or argv not a list: invalid_request",
      refusal(by.get("both", {})).get("code") == "invalid_request"
      and refusal(by.get("badargv", {})).get("code") == "invalid_request", answers)
check("filename: sys.argv[0], __file__ and the traceback's file",
      by.get("named", {}).get("stdout") == "['report.py'] report.py\n"
      and 'File "report.py", line 3' in (by.get("named", {}).get("error") or {}).get("traceback", "")
      and refusal(by.get("badname", {})).get("code") == "invalid_request", answers)
check("a session's cell takes argv, and refuses stdin, saying so",
      refusal(by.get("cellin", {})).get("code") == "invalid_request"
      and "stdin" in refusal(by.get("cellin", {})).get("message", "")
      and by.get("cellargv", {}).get("stdout") == "['', 'c']\n", answers)

check("the results obey the schema", not valid_results(answers), valid_results(answers))

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
# It appears only once it accepts (bound under a name of its own, renamed
# into place): a connect now is not refused, and nothing else is left.
check("the socket appears listening, under its name alone",
      sorted(os.listdir(d)) == ["pysbx.sock", "pysbx.sock.lock"], os.listdir(d))


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


# --- helpers for talking to a running server ---------------------------------


class Lines:
    """Lines from a descriptor (a pipe or a socket), each wait bounded."""

    def __init__(self, fd):
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self, timeout=60):
        """The next line, or None at the end; TimeoutError if none comes."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError(f"nothing in {timeout} s")
            try:
                d = os.read(self.fd, 1 << 20)
            except ConnectionResetError:
                d = b""
            self.eof = not d
            self.buf += d
        if not self.buf:
            return None
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            bad = valid_results([json.loads(line)])
        except ValueError:
            bad = []
        if bad:
            check("the results obey the schema", False, bad)
        return line.decode()

    def until(self, pred, timeout=60):
        """Lines until one satisfies pred; that line (TimeoutError, or None at the end)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.0, deadline - time.monotonic()))
            if line is None or pred(line):
                return line


def start(*args, stdin=None):
    p = subprocess.Popen([PYSBX, "serve", *args], stdin=stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    started.append(p)
    return p


def wait_gone(path, present=False, tries=600):
    """Waits (bounded) until |path| exists (present) or not."""
    for _ in range(tries):
        if os.path.exists(path) == present:
            return True
        time.sleep(0.05)
    return False


SOCKETS = tempfile.mkdtemp()
atexit.register(shutil.rmtree, SOCKETS, True)


def listening(*args):
    path = os.path.join(SOCKETS, f"s{len(started)}.sock")
    p = start("--listen", path, *args)
    wait_gone(path, present=True)
    return p, path, Lines(p.stderr.fileno())


def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s, Lines(s.fileno())


def send(sock_or_pipe, *msgs):
    data = "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in msgs).encode()
    if isinstance(sock_or_pipe, socket.socket):
        sock_or_pipe.sendall(data)
    else:
        sock_or_pipe.write(data)
        sock_or_pipe.flush()


SLEEP = "import time\ntime.sleep(120)"
LONG = {"wall_seconds": 300, "cpu_seconds": 10}


# A cancel for an id no one uses, sent after requests: lines are handled in
# order, so once its error answer is back, those requests are in flight.
MARKER = {"cancel": "marker"}


def marked(lines):
    if lines.until(lambda l: json.loads(l).get("cancel") == "marker") is None:
        raise EOFError("the server ended before answering the marker")


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
        # a carriage return between tokens would end the line for many readers
        ('[1, 2]', '{"id": [1,\r2], "code": "pass"}'),
    ]
    p = subprocess.run([PYSBX, "serve"], input="".join(l + "\n" for _, l in raw).encode(),
                       capture_output=True, timeout=120)
    out = p.stdout.decode().split("\n")[:-1]
    for text, _ in raw:
        got = [l for l in out if l.startswith('{"id":' + text + ",")]
        check(f"id {text} echoed as written, once", len(got) == 1, out)
    check("no other answers", len(out) == len(raw), out)


# --- ids of objects past what the parser holds -------------------------------


def ids_of_objects_past_what_the_parser_holds():
    """jansson reads no number past a double's range and nothing nested deeper
    than 2,048: such an object is refused, and its answer still carries its
    id, as written, found wherever it stands."""
    deep = "[" * 3000 + "]" * 3000
    big = "9" * 400  # a Python int as json.dumps writes it
    raw = [
        ('"big"', '{"id": "big", "code": "pass", "limits": {"wall_seconds": 1e400}}'),
        ('"after"', '{"code": "pass", "limits": {"wall_seconds": 1e400}, "id": "after"}'),
        ('"deep"', '{"code": "pass", "x": ' + deep + ', "id": "deep"}'),
        ('"deep first"', '{"id": "deep first", "x": {"y": ' + deep + '}}'),
        ('{"a": ["}", 1]}', '{"x": [' + deep + ', "]"], "\\u0069d": {"a": ["}", 1]}}'),
        ('1e400', '{"id": 1e400, "code": "pass"}'),
        ("-" + big, '{"code": "pass", "id": -' + big + ', "n": 1e999}'),
    ]
    p = subprocess.run([PYSBX, "serve"], input="".join(l + "\n" for _, l in raw).encode(),
                       capture_output=True, timeout=120)
    out = p.stdout.decode().split("\n")[:-1]
    for text, _ in raw:
        got = [l for l in out if l.startswith('{"id":' + text + ',"error":')]
        check(f"id {text[:20]} of an object past the parser's limits: echoed once, refused",
              len(got) == 1 and json.loads(got[0])["error"]["code"] == "invalid_request",
              [l[:200] for l in out])
    check("no other answers", len(out) == len(raw), len(out))


# --- the id scanner, on many generated objects --------------------------------


def generated_ids():
    """Ids of every kind, written with odd spacing, escaped keys, decoys
    before them (nested and escaped "id" keys, a repeated id): each comes
    back as written. The seed is fixed, so that a failure repeats."""
    rnd = random.Random(7)
    atoms = ["1", "-0", "1e5", "1.00000000001", "18446744073709551616", "3.14E-2", "true",
             "false", "null", '"\\u0069\\n\\/"', "[]", "{}"]
    strings = ["", "id", 'a"b', "\\", "\u00e9\u20ac\U0001d11e", "}", '{"id":1}', "\0", 'x\\"y']

    def value(depth=0):
        k = rnd.randrange(5 if depth < 3 else 2)
        if k == 0:
            return rnd.choice(atoms)
        if k == 1:
            return json.dumps(rnd.choice(strings), ensure_ascii=rnd.random() < 0.5)
        ws = rnd.choice(["", " ", "\t", " \r "])
        if k == 2:
            return "[" + ws + ",".join(value(depth + 1) for _ in range(rnd.randrange(3))) + "]"
        keys = ["id", "a", '\\"', "i d"]
        return "{" + ",".join(ws + json.dumps(rnd.choice(keys)) + ws + ":" + ws + value(depth + 1)
                              for _ in range(rnd.randrange(3))) + "}"

    ids, lines = [], []
    for _ in range(300):
        raw = value()
        key = rnd.choice(['"id"', '"\\u0069d"', '"i\\u0064"'])
        decoy = rnd.choice(['', '"a": {"id": 5}, ', '"id": "dup", ', '"x\\"id": [1,"id"], '])
        ws = rnd.choice(["", " ", " \t"])
        lines.append("{" + ws + decoy + key + ws + ":" + ws + raw + ws + ', "nope": 1}')
        ids.append(raw.replace("\r", " "))
    p = subprocess.run([PYSBX, "serve"], input=("\n".join(lines) + "\n").encode(),
                       capture_output=True, timeout=120)
    out = p.stdout.decode().split("\n")[:-1]
    wrong = [(l, o) for i, l, o in zip(ids, lines, out)
             if not o.startswith('{"id":' + i + ',"error"') or json.loads(o)["error"]["code"]
             != "invalid_request"]
    check("300 generated ids come back as written", len(out) == 300 and not wrong,
          (len(out), wrong[:3]))


# --- unknown fields ----------------------------------------------------------


def unknown_fields():
    rc, answers = serve([json.dumps({"id": 1, "code": "1", "limit": {}}),
                         json.dumps({"id": 2, "code": "1", "Code": "2"}),
                         json.dumps({"cancel": 5, "id": 3})])
    errs = {a["id"]: refusal(a) for a in answers}
    check("an unknown field is refused, named", errs.get(1, {}).get("code") == "invalid_request"
          and "'limit'" in errs[1].get("message", ""), answers)
    check("field names are case-sensitive", errs.get(2, {}).get("code") == "invalid_request"
          and "'Code'" in errs[2].get("message", ""), answers)
    check("a cancel message has only cancel", errs.get(3, {}).get("code") == "invalid_request"
          and "'id'" in errs[3].get("message", ""), answers)


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
        json.dumps({"id": "at", "code": "pass", "limits": {"max_artifacts_total_bytes": 8193}}),
        json.dumps({"id": "atok", "code": "open('a', 'w').write('x' * 5000)\nopen('b', 'w').write('y')",
                    "limits": {"max_artifacts_total_bytes": 4000}}),
        json.dumps({"id": "ok", "code": "print(1)", "limits": {"wall_seconds": 1, "max_artifacts": 2}}),
        json.dumps({"id": "lowered", "code": "import time\nprint('before')\ntime.sleep(5)"}),
    ], "--max-wall", "1", "--max-cpu", "2", "--max-memory", "64M", "--max-output", "1000",
        "--max-artifact-bytes", "4096", "--max-artifacts", "2",
        "--max-artifacts-total-bytes", "8192")
    by = {a.get("id"): a for a in answers}
    msg = lambda k: refusal(by.get(k, {})).get("message", "")
    check("over a ceiling: invalid_limit naming it",
          all(refusal(by.get(k, {})).get("code") == "invalid_limit"
              for k in ("wall", "mem", "arts", "out", "cpu", "ab", "at"))
          and msg("wall") == "wall_seconds 100 exceeds the server's ceiling of 1"
          and msg("mem") == "memory_bytes 1 GiB exceeds the server's ceiling of 64 MiB"
          and msg("arts") == "max_artifacts 3 exceeds the server's ceiling of 2"
          and msg("cpu") == "cpu_seconds 2.5 exceeds the server's ceiling of 2", answers)
    check("at the ceiling: runs", by.get("ok", {}).get("stdout") == "1\n", by.get("ok"))
    check("max_artifacts_total_bytes: a file past what is left is counted, not returned",
          [a["name"] for a in by.get("atok", {}).get("artifacts", [])] == ["b"]
          and by["atok"]["artifacts_dropped"] == 1, by.get("atok"))
    check("a default above a ceiling is lowered to it",
          by.get("lowered", {}).get("status") == "timeout" and by["lowered"]["limit"] == "wall"
          and "1 s" in by["lowered"]["reason"], by.get("lowered"))
    check("what it printed before the limit, unflushed, is in the answer",
          by.get("lowered", {}).get("stdout") == "before\n" and by["lowered"]["partial"] is True,
          by.get("lowered"))
    for bad in (["--max-memory", "1M"], ["--max-wall", "0"], ["--max-artifacts", "x"],
                ["--grace", "-1"], ["--max-pending-bytes", "10"]):
        p = subprocess.run([PYSBX, "serve", *bad], capture_output=True, text=True, timeout=60)
        check(f"serve {' '.join(bad)}: usage error", p.returncode == 2, (p.returncode, p.stderr))
    h = subprocess.run([PYSBX, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    check("serve --help documents the new options", all(
        o in h for o in ("--grace", "--max-pending-bytes", "--max-wall", "--max-cpu", "--max-memory",
                         "--max-output", "--max-artifact-bytes", "--max-artifacts", "cancel",
                         "--max-sessions", "session_close", "rollback")), h)
    for bad in (["--max-sessions", "0"], ["--max-sessions", "4097"], ["--max-sessions", "x"]):
        p = subprocess.run([PYSBX, "serve", *bad], capture_output=True, text=True, timeout=60)
        check(f"serve {' '.join(bad)}: usage error", p.returncode == 2
              and "--max-sessions" in p.stderr, (p.returncode, p.stderr))
    p = subprocess.run([PYSBX, "batch", "x.jsonl", "--max-sessions", "2"], capture_output=True,
                       text=True, timeout=60)
    check("batch does not take --max-sessions", p.returncode == 2, (p.returncode, p.stderr))


# --- cancel, on standard input ------------------------------------------------


def files_the_code_hides():
    """Every file the code left comes back or is listed with why: a deep
    tree, a long path, two names of one file, unreadable ones, names that
    are not UTF-8 (each its own name, with its bytes)."""
    code = ("import os\n"
            "top = os.open('.', os.O_RDONLY)\n"
            "for _ in range(70):\n    os.makedirs('d', exist_ok=True); os.chdir('d')\n"
            "open('deep', 'w').write('deep')\nos.fchdir(top)\n"
            "for _ in range(20):\n    os.makedirs('L' * 250, exist_ok=True); os.chdir('L' * 250)\n"
            "open('long', 'w').write('long')\nos.fchdir(top)\n"
            "open('a', 'w').write('linked')\nos.link('a', 'b')\nos.chmod('a', 0)\n"
            "for n in (b'\\xff', b'\\xfe', '\\ufffd'):\n    open(n, 'w').write('x')\n")
    rc, answers = serve([json.dumps({"id": "hide", "code": code}),
                         json.dumps({"id": "few", "code": code, "limits": {"max_artifacts": 2}})])
    by = {a.get("id"): a for a in answers}
    h, few = by.get("hide", {}), by.get("few", {})
    raw = [base64.b64decode(a["name_base64"]) if "name_base64" in a else a["name"].encode()
           for a in h.get("artifacts", [])]
    short = lambda a: {k: [(x["name"][:40], x.get("reason")) for x in a.get(k, [])]
                       for k in ("artifacts", "dropped_artifacts")}
    check("serve: every file comes back under its own name",
          len(raw) == 7 and raw == sorted(raw) and len({a["name"] for a in h["artifacts"]}) == 7
          and raw[:3] == [b"L" * 250 + (b"/" + b"L" * 250) * 19 + b"/long", b"a", b"b"]
          and raw[3] == b"d/" * 70 + b"deep" and raw[4:] == [b"\xef\xbf\xbd", b"\xfe", b"\xff"]
          and h["artifacts"][1]["content_base64"] == "bGlua2Vk"  # "linked", mode 000
          and h["artifacts_dropped"] == 0 and h["dropped_artifacts"] == [], short(h))
    check("serve: what is not returned is counted and listed with why",
          few.get("artifacts_dropped") == 5
          and [d["reason"] for d in few.get("dropped_artifacts", [])] == ["max_artifacts"] * 5
          and few["dropped_artifacts"][0] == {"name": "b", "size": 6, "reason": "max_artifacts"},
          short(few))


def cancel_on_standard_input():
    srv = start("--grace", "60", stdin=subprocess.PIPE)
    out = Lines(srv.stdout.fileno())
    send(srv.stdin, {"id": "s", "code": SLEEP, "limits": LONG},
         {"id": 1.0, "code": SLEEP, "limits": LONG},
         {"cancel": "s"})
    a = json.loads(out.next())
    check("cancel: the request answers cancelled", a.get("id") == "s"
          and a.get("status") == "cancelled" and a.get("partial") is True, a)
    send(srv.stdin, {"cancel": 1})
    a = out.next()
    check("cancel for an unknown id (1 is not 1.0): an error with the id given",
          a.startswith('{"id":null,"cancel":1,"error":{"code":"invalid_request"'), a)
    send(srv.stdin, {"cancel": 1.0})
    a = out.next()
    check("cancel compares the id as written", a.startswith('{"id":1.0,"status":"cancelled"'), a)
    send(srv.stdin, {"cancel": "s"})
    a = json.loads(out.next())
    check("cancel after the answer: an error", a.get("cancel") == "s" and "error" in a, a)
    srv.stdin.close()
    check("stdin: exit 0 at end of input", srv.wait(timeout=60) == 0)


# --- cancel, behind more requests than run at once ---------------------------


def cancel_behind_the_queue():
    """With one run at a time, requests wait their turn; the server reads
    ahead, so a cancel sent behind them is seen, and a waiting request is
    answered at once, not when its turn comes."""
    srv = start("--jobs", "1", "--grace", "60", stdin=subprocess.PIPE)
    out = Lines(srv.stdout.fileno())
    send(srv.stdin, *({"id": k, "code": SLEEP, "limits": LONG} for k in "abc"), {"cancel": "c"})
    a = json.loads(out.next())
    check("a waiting request is cancelled at once", a.get("id") == "c"
          and a.get("status") == "cancelled", a)
    send(srv.stdin, {"cancel": "a"})
    a = json.loads(out.next())
    check("the running one then", a.get("id") == "a" and a.get("status") == "cancelled", a)
    send(srv.stdin, {"cancel": "b"})
    a = json.loads(out.next())
    check("and the next in turn", a.get("id") == "b" and a.get("status") == "cancelled", a)
    srv.stdin.close()
    check("then the end: exit 0", out.next() is None and srv.wait(timeout=60) == 0)


# --- SIGTERM on standard input: the grace, then cancelled ------------------------


def sigterm_on_standard_input_the_grace_then_cancelled():
    srv = start("--grace", "5", stdin=subprocess.PIPE)
    out = Lines(srv.stdout.fileno())
    send(srv.stdin, {"id": "short", "code": "import time\ntime.sleep(0.2)\nprint('short')"},
         {"id": "slow", "code": SLEEP, "limits": LONG}, MARKER)
    marked(out)
    srv.send_signal(signal.SIGTERM)
    got = {a.get("id"): a for a in (json.loads(out.next()) for _ in range(2))}
    check("stdin, SIGTERM: in flight and done within the grace is answered",
          got.get("short", {}).get("stdout") == "short\n", got)
    check("stdin, SIGTERM: left over after the grace is answered cancelled",
          got.get("slow", {}).get("status") == "cancelled", got)
    check("stdin, SIGTERM: nothing more", out.next() is None)
    check("stdin, SIGTERM: exit 0", srv.wait(timeout=60) == 0)


# --- a UNIX socket: hang-ups, slow readers, shutdown ------------------------------


def a_client_that_hangs_up():
    # One run at a time in all (--jobs 1 is also the sandbox's own bound): a
    # second client's request runs only once the first client's run has ended.
    srv, path, log = listening("--jobs", "1", "--grace", "60")
    a_sock, a_in = connect(path)
    send(a_sock, {"id": "hang", "code": SLEEP, "limits": LONG}, MARKER)
    marked(a_in)
    a_sock.close()
    check("a client that hangs up: logged",
          log.until(lambda l: "hung up" in l, timeout=60) is not None)
    b_sock, b_in = connect(path)
    send(b_sock, {"id": "after", "code": "print('after')"})
    a = json.loads(b_in.next(timeout=60))
    check("a client that hangs up has its run cancelled (the next one runs)",
          a.get("stdout") == "after\n", a)
    # Half-closed: a client that only says it is done still gets its answers.
    b_sock.sendall((json.dumps({"id": "half", "code": "print('half')"}) + "\n").encode())
    b_sock.shutdown(socket.SHUT_WR)
    a = json.loads(b_in.next(timeout=60))
    check("shutting only the writing side: still answered", a.get("stdout") == "half\n", a)
    check("then the server closes the connection", b_in.next(timeout=60) is None)
    b_sock.close()
    srv.send_signal(signal.SIGTERM)
    check("SIGTERM with nothing in flight: exit 0", srv.wait(timeout=60) == 0)
    check("the socket is removed", not os.path.exists(path))


def a_client_that_does_not_read():
    """Cut off past --max-pending-bytes, without holding up anyone else."""
    srv, path, log = listening("--max-pending-bytes", "1M", "--grace", "5")
    big = {"code": "print('x' * 1000000)", "limits": {"max_output_chars": 1000000}}
    s_sock, s_in = connect(path)
    send(s_sock, *({"id": i, **big} for i in range(6)))
    f_sock, f_in = connect(path)
    send(f_sock, {"id": "fast", "code": "print(2)"})
    a = json.loads(f_in.next(timeout=60))
    check("another client is answered while one does not read", a.get("stdout") == "2\n", a)
    check("the one that does not read is dropped: logged",
          log.until(lambda l: "answers unread" in l, timeout=120) is not None)
    n = 0
    try:
        while s_in.next(timeout=60) is not None:
            n += 1
    except TimeoutError:
        n = -1
    check("... and its connection is closed with fewer answers than asked", 0 <= n < 6, n)
    f_sock.close()
    srv.send_signal(signal.SIGTERM)
    check("a dropped client does not hold up shutdown", srv.wait(timeout=60) == 0)
    s_sock.close()


def sigterm_on_a_socket():
    """In flight past the grace is cancelled, answered, and the server ends."""
    srv, path, log = listening("--grace", "0.5")
    c_sock, c_in = connect(path)
    send(c_sock, {"id": "g", "code": SLEEP, "limits": LONG}, MARKER)
    marked(c_in)
    srv.send_signal(signal.SIGTERM)
    a = json.loads(c_in.next(timeout=60))
    check("socket, SIGTERM: left over after the grace is answered cancelled",
          a.get("id") == "g" and a.get("status") == "cancelled", a)
    check("socket, SIGTERM: exit 0", srv.wait(timeout=60) == 0)
    check("socket, SIGTERM: the socket is removed", not os.path.exists(path))
    c_sock.close()


def a_socket_left_by_a_killed_server_is_taken_over():
    """A restart needs no hand: the socket a SIGKILLed server left is
    replaced; one a live server holds is not, nor a link or a file."""
    srv, path, log = listening()
    srv.kill()
    srv.wait(timeout=60)
    check("SIGKILL leaves the socket behind", os.path.exists(path))
    again = start("--listen", path)
    ok = wait_gone(path, present=True)
    sock = None
    for _ in range(200):
        try:
            sock, lines = connect(path)
            break
        except OSError:
            time.sleep(0.05)
    check("a new server takes over the killed one's socket", sock is not None and ok,
          again.poll())
    if sock:
        send(sock, {"id": "r", "code": "print('again')"})
        check("and answers on it", json.loads(lines.next()).get("stdout") == "again\n")
    second = subprocess.run([PYSBX, "serve", "--listen", path], capture_output=True, text=True,
                            timeout=60)
    check("a second server on a live one's socket refuses, saying so",
          second.returncode == 1 and "listening there already" in second.stderr, second.stderr)
    if sock:
        send(sock, {"id": "r2", "code": "print('still')"})
        check("the live one goes on", json.loads(lines.next()).get("stdout") == "still\n")
        sock.close()
    again.send_signal(signal.SIGTERM)
    again.wait(timeout=60)
    # A link or a file where the socket would go is not the server's to remove.
    target = os.path.join(SOCKETS, "precious")
    open(target, "w").write("keep")
    for name, make in (("link.sock", lambda p: os.symlink(target, p)),
                       ("file.sock", lambda p: open(p, "w").write("x"))):
        p = os.path.join(SOCKETS, name)
        make(p)
        r = subprocess.run([PYSBX, "serve", "--listen", p], capture_output=True, text=True,
                           timeout=60)
        check(f"serve --listen on a {name.split('.')[0]}: refused, left as it was",
              r.returncode == 1 and os.path.lexists(p) and open(target).read() == "keep",
              r.stderr)


def a_second_signal():
    """At once, whatever the grace."""
    srv, path, log = listening("--grace", "600")
    c_sock, c_in = connect(path)
    send(c_sock, {"id": "g", "code": SLEEP, "limits": LONG}, MARKER)
    marked(c_in)
    srv.send_signal(signal.SIGTERM)
    check("the first signal removes the socket at once", wait_gone(path))
    srv.send_signal(signal.SIGINT)
    try:
        code = srv.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    check("a second signal exits at once, status 1", code == 1, code)
    check("the socket is gone", not os.path.exists(path))
    c_sock.close()


# --- sessions -------------------------------------------------------------------


def cell_of(a):
    """(cell, rolled_back) of a session answer, or the answer itself when it is not one."""
    s = a.get("session") if isinstance(a, dict) else None
    return (s["cell"], s["rolled_back"]) if isinstance(s, dict) else a


def sessions_on_standard_input():
    """Cells sent one after another without waiting run in that order, with
    state kept; a failing cell is rolled back, unless on_stop; a closed name
    starts afresh; the refusals are invalid_request."""
    lines = [
        {"id": "c1", "session": "s", "code": "x = 1\nopen('f.txt', 'w').write('one')"},
        {"id": "c2", "session": "s", "code": "x += 1; print(x)"},
        {"id": "c3", "session": "s",
         "code": "x = 100\nopen('f.txt', 'w').write('changed')\nraise ValueError('no')"},
        {"id": "c4", "session": "s", "code": "print(x, open('f.txt').read())"},
        {"id": "c5", "session": "s", "rollback": "on_stop", "code": "x = 7\nraise KeyError('k')"},
        {"id": "c6", "session": "s", "code": "print(x)", "rollback": "never"},
        {"id": "other", "session": "t", "code": "print('x' in globals())"},
        {"id": "close", "session_close": "s"},
        {"id": "fresh", "session": "s", "code": "print(x)"},
        {"id": "unknown", "session_close": "never-opened"},
        {"id": "badrb", "session": "s", "rollback": "sometimes", "code": "pass"},
        {"id": "rbalone", "rollback": "never", "code": "pass"},
        {"id": "empty", "session": "", "code": "pass"},
        {"id": "long", "session": "n" * 129, "code": "pass"},
        {"id": "notstr", "session": 5, "code": "pass"},
        {"id": "close2", "session_close": "t", "code": "pass"},
        {"id": "plain", "code": "print('x' in globals())"},
        {"id": "n-skip", "session": "v", "code": "print('ran')", "cell": 3},
        {"id": "n1", "session": "u", "code": "y = 5", "cell": 1},
        {"id": "n2", "session": "u", "code": "print(y)", "cell": 2},
        {"id": "n-again", "session": "u", "code": "print(y)", "cell": 2},
        {"id": "n-alone", "code": "pass", "cell": 1},
        {"id": "n-zero", "session": "u", "code": "pass", "cell": 0},
    ]
    rc, answers = serve([json.dumps(l) for l in lines], "--jobs", "4")
    by = {}
    for a in answers:
        by.setdefault(a.get("id"), []).append(a)
    check("sessions: every line answered exactly once",
          sorted(by) == sorted(l["id"] for l in lines) and all(len(v) == 1 for v in by.values()),
          answers)
    by = {k: v[0] for k, v in by.items()}
    get = lambda k: by.get(k, {})
    check("a session answer is the result with session: {name, cell, rolled_back}",
          get("c1").get("status") == "completed"
          and get("c1").get("session") == {"name": "s", "cell": 1, "rolled_back": False},
          get("c1"))
    check("state is kept across cells: x += 1 prints 2, cell 2",
          get("c2").get("stdout") == "2\n" and cell_of(get("c2")) == (2, False), get("c2"))
    check("an exception rolls the cell back (on_error)",
          get("c3").get("exit_code") == 1 and "ValueError: no" in get("c3").get("stderr", "")
          and cell_of(get("c3")) == (3, True), get("c3"))
    check("after the rollback, variables and files are as before the cell",
          get("c4").get("stdout") == "2 one\n" and cell_of(get("c4"))[1] is False, get("c4"))
    check("rollback on_stop: an exception keeps what ran before it",
          get("c5").get("exit_code") == 1 and cell_of(get("c5"))[1] is False
          and get("c6").get("stdout") == "7\n", (get("c5"), get("c6")))
    check("another name is another session",
          get("other").get("stdout") == "False\n" and cell_of(get("other")) == (1, False),
          get("other"))
    check("session_close is answered session_closed",
          get("close") == {"id": "close", "session_closed": "s"}, get("close"))
    check("after session_close the name starts a fresh session (NameError, cell 1)",
          get("fresh").get("exit_code") == 1 and "NameError" in get("fresh").get("stderr", "")
          and cell_of(get("fresh")) == (1, True), get("fresh"))
    err = lambda k: refusal(get(k))
    check("closing an unknown session: invalid_request naming it",
          err("unknown").get("code") == "invalid_request"
          and "never-opened" in err("unknown").get("message", ""), get("unknown"))
    check("a bad rollback value: invalid_request",
          err("badrb").get("code") == "invalid_request"
          and "on_error" in err("badrb").get("message", ""), get("badrb"))
    check("rollback without a session: invalid_request",
          err("rbalone").get("code") == "invalid_request", get("rbalone"))
    check("a session name must be a string of 1 to 128 bytes",
          all(err(k).get("code") == "invalid_request" for k in ("empty", "long", "notstr")),
          [get(k) for k in ("empty", "long", "notstr")])
    check("a session_close message has only id and session_close",
          err("close2").get("code") == "invalid_request"
          and "'code'" in err("close2").get("message", ""), get("close2"))
    check("a request without a session is a fresh run, no session in the answer",
          get("plain").get("stdout") == "False\n" and "session" not in get("plain"), get("plain"))
    check("a numbered cell that finds no session: session_lost, nothing run",
          err("n-skip").get("code") == "session_lost" and "stdout" not in get("n-skip"),
          get("n-skip"))
    check("numbered cells run as their session's next",
          get("n2").get("stdout") == "5\n" and cell_of(get("n2")) == (2, False), get("n2"))
    check("a number already run: session_lost, the session ended",
          err("n-again").get("code") == "session_lost", get("n-again"))
    check("cell goes with a session, and counts from 1",
          err("n-alone").get("code") == "invalid_request"
          and err("n-zero").get("code") == "invalid_request", (get("n-alone"), get("n-zero")))
    check("serve exits 0 with sessions open at the end of input", rc == 0, rc)


def branches_on_standard_input():
    """session_fork waits for the cells of its origin read before it, and
    the branch's cells read after it wait for it, whatever --jobs is; the
    branch starts from the state, then each goes its own way; refusals."""
    lines = [
        {"id": "p1", "session": "p", "code": "x = 1\nopen('f', 'w').write('one')"},
        {"id": "p2", "session": "p", "code": "import time\ntime.sleep(0.3)\nx = 2"},
        {"id": "fork", "session_fork": {"from": "p", "to": "q"}},
        {"id": "q1", "session": "q", "code": "print(x, open('f').read())\nx = 10"},
        {"id": "p3", "session": "p", "code": "print(x)"},
        {"id": "q2", "session": "q", "code": "print(x)"},
        {"id": "nofrom", "session_fork": {"from": "nope", "to": "r"}},
        {"id": "open", "session_fork": {"from": "p", "to": "q"}},
        {"id": "same", "session_fork": {"from": "p", "to": "p"}},
        {"id": "notobj", "session_fork": "p"},
        {"id": "extra", "session_fork": {"from": "p", "to": "s"}, "code": "pass"},
        {"id": "extra2", "session_fork": {"from": "p", "to": "s", "x": 1}},
    ]
    rc, answers = serve([json.dumps(l) for l in lines], "--jobs", "4")
    by = {a.get("id"): a for a in answers}
    check("branches: every line answered once", len(answers) == len(lines)
          and sorted(by) == sorted(l["id"] for l in lines), answers)
    check("session_fork is answered session_forked, with the origin's last cell",
          by.get("fork") == {"id": "fork", "session_forked": {"from": "p", "to": "q", "cell": 2}},
          by.get("fork"))
    check("the branch starts where its origin's cells read before the fork left it",
          by.get("q1", {}).get("stdout") == "2 one\n" and cell_of(by.get("q1", {})) == (3, False),
          by.get("q1"))
    check("then each goes its own way", by.get("p3", {}).get("stdout") == "2\n"
          and by.get("q2", {}).get("stdout") == "10\n", (by.get("p3"), by.get("q2")))
    for k, part in [("nofrom", "nope"), ("open", "is open"), ("same", "two names"),
                    ("notobj", "from"), ("extra", "only id and session_fork"),
                    ("extra2", "only from and to")]:
        e = refusal(by.get(k, {}))
        check(f"a bad session_fork ({k}): invalid_request", e.get("code") == "invalid_request"
              and part in e.get("message", ""), by.get(k))
    check("serve exits 0", rc == 0, rc)


def kept_files_on_standard_input():
    """A sqlite3 connection and an open file kept in variables from one
    cell to the next; a failed cell that wrote 100 bytes through the file,
    seeked it and committed rows is rolled back exactly (the file's offset
    and content, the database's rows); a pipe left open is still refused,
    the reason naming it; a branch carries the files as its own."""
    lines = [
        {"id": "k1", "session": "k",
         "code": "import sqlite3\nc = sqlite3.connect('db.sqlite')\n"
                 "c.execute('create table t (x)')\nc.execute('insert into t values (1)')\n"
                 "c.commit()\nf = open('log.txt', 'w+')\nf.write('hello')\nf.flush()\n"
                 "print(f.tell())"},
        {"id": "k2", "session": "k",
         "code": "f.write('x' * 100)\nf.flush()\nf.seek(0)\n"
                 "c.execute('insert into t values (2)')\nc.commit()\nraise ValueError('undo')"},
        {"id": "k3", "session": "k",
         "code": "print(f.tell(), repr(open('log.txt').read()), "
                 "c.execute('select x from t').fetchall())"},
        {"id": "k4", "session": "k",
         "code": "f.write(' world')\nf.flush()\nc.execute('insert into t values (3)')\n"
                 "c.commit()\nprint(open('log.txt').read(), c.execute('select x from t').fetchall())"},
        {"id": "k5", "session": "k", "code": "import os\nr, w = os.pipe()\nprint(r)"},
        {"id": "k6", "session": "k", "code": "print('r' in globals(), f.tell())"},
        {"id": "kfork", "session_fork": {"from": "k", "to": "kb"}},
        {"id": "kb1", "session": "kb",
         "code": "f.write('!')\nf.flush()\nprint(f.tell(), open('log.txt').read())"},
        {"id": "k7", "session": "k", "code": "print(f.tell(), open('log.txt').read())"},
    ]
    rc, answers = serve([json.dumps(l) for l in lines], "--jobs", "2")
    by = {a.get("id"): a for a in answers}
    get = lambda k: by.get(k, {})
    check("kept files: a cell that leaves a sqlite3 connection and a file open is kept",
          get("k1").get("stdout") == "5\n" and cell_of(get("k1")) == (1, False), get("k1"))
    check("a failed cell that wrote, seeked and committed through them is rolled back",
          cell_of(get("k2")) == (2, True) and "ValueError" in get("k2").get("stderr", ""),
          get("k2"))
    check("after it, the file's offset and content and the database are the state's",
          get("k3").get("stdout") == "5 'hello' [(1,)]\n" and cell_of(get("k3")) == (3, False),
          get("k3"))
    check("and the next cells go on through them",
          get("k4").get("stdout") == "hello world [(1,), (3,)]\n"
          and cell_of(get("k4")) == (4, False), get("k4"))
    fd = get("k5").get("stdout", "").strip()
    check("a pipe left open is still refused, the reason naming it",
          cell_of(get("k5")) == (5, True) and f"fd {fd} (a pipe)" in (get("k5").get("reason") or ""),
          get("k5"))
    check("after it, the session is as before", get("k6").get("stdout") == "False 11\n", get("k6"))
    check("a branch carries the kept files as its own",
          get("kb1").get("stdout") == "12 hello world!\n"
          and get("k7").get("stdout") == "11 hello world\n", (get("kb1"), get("k7")))
    check("serve exits 0", rc == 0, rc)


def a_sessions_memory_is_its_first_cells():
    """A session's memory limit is fixed when it opens: its first cell's
    (the default when it asks for none); a later cell's figure does not move
    it, and the reason names the session's limit."""
    code = "b = bytearray(400 << 20)\nprint(len(b) >> 20)"
    lines = [
        {"id": "big1", "session": "big", "code": code, "limits": {"memory_bytes": "800M"}},
        {"id": "big2", "session": "big", "code": "del b\n" + code},
        {"id": "dflt1", "session": "dflt", "code": code},
        {"id": "dflt2", "session": "dflt", "code": code, "limits": {"memory_bytes": "800M"}},
    ]
    rc, answers = serve([json.dumps(l) for l in lines], "--max-memory", "900M")
    by = {a.get("id"): a for a in answers}
    get = lambda k: by.get(k, {})
    check("a session opened by a cell asking for 800 MiB holds 400 MB, in later cells too",
          all(get(k).get("stdout") == "400\n" for k in ("big1", "big2")), answers)
    check("a session opened with the default 256 MiB stops 400 MB, and says 256 MiB",
          all(get(k).get("status") == "memory_limit" and get(k).get("limit") == "memory"
              and "256 MiB" in (get(k).get("reason") or "") for k in ("dflt1", "dflt2")),
          answers)
    check("serve exits 0", rc == 0, rc)


def sessions_need_the_templates_own_proc():
    """Under a pid namespace whose /proc is still an outer one's (unshare
    --pid without --mount-proc), /proc's numbers name other processes: the
    template refuses sessions and says why; plain runs go on."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("skip sessions under a foreign /proc: needs root and unshare")
        return
    lines = [{"id": "plain", "code": "print(1)"}, {"id": "cell", "session": "s", "code": "print(2)"}]
    p = subprocess.run(["timeout", "-k", "10", "60", "unshare", "--pid", "--fork", "--kill-child",
                        PYSBX, "serve", "--require", "none"],
                       input="".join(json.dumps(l) + "\n" for l in lines), capture_output=True,
                       text=True, timeout=90)
    by = {a.get("id"): a for a in (json.loads(l) for l in p.stdout.splitlines())}
    check("a plain run works under a foreign /proc", by.get("plain", {}).get("stdout") == "1\n",
          (by, p.stderr))
    err = refusal(by.get("cell", {}))
    check("a session under a foreign /proc is refused, naming /proc",
          err.get("code") == "sandbox_unavailable" and "/proc" in err.get("message", ""),
          (by, p.stderr))


def two_servers_never_share_a_uid():
    """Two servers on one machine: their runs' uids never meet, and a tenant
    of one holding its uid's whole thread quota leaves the other's runs
    alone (as root, where each run has a uid of its own)."""
    if os.geteuid() != 0:
        print("skip two servers' uids: needs root")
        return
    a, path_a, _ = listening()
    b, path_b, _ = listening()
    sa, la = connect(path_a)
    sb, lb = connect(path_b)
    hog = ("import os, threading, time\n"
           "threading.stack_size(65536)\n"
           "stop = threading.Event()\n"
           "n = 0\n"
           "try:\n"
           "    while n < 5000:\n"
           "        threading.Thread(target=stop.wait, daemon=True).start()\n"
           "        n += 1\n"
           "except RuntimeError:\n"
           "    pass\n"
           "print(os.getuid(), n > 1000)\n"
           "time.sleep(8)\n"
           "stop.set()\n")
    # Address space enough for every thread its uid may start (2,048 stacks
    # and what malloc reserves per thread): the uid's thread quota, not the
    # memory limit, is what ends its loop.
    send(sa, {"id": "hog", "code": hog,
              "limits": {"wall_seconds": 30, "memory_bytes": 2 << 30}})
    time.sleep(4)  # its threads are up: the next runs overlap it
    # Python 3.13 keeps a finished thread's stack (8 MiB) until it is
    # joined: 50 of them at the default stack size pass the memory limit.
    uid_code = ("import os, threading\n"
                "threading.stack_size(1 << 20)\n"
                "ts = [threading.Thread(target=lambda: None) for _ in range(50)]\n"
                "[t.start() for t in ts]\n[t.join() for t in ts]\n"
                "print(os.getuid())\n")
    send(sa, *[{"id": i, "code": uid_code} for i in range(6)])
    send(sb, *[{"id": i, "code": uid_code} for i in range(12)])
    got_a = [json.loads(la.next()) for _ in range(7)]
    got_b = [json.loads(lb.next()) for _ in range(12)]
    hog_a = [g for g in got_a if g.get("id") == "hog"]
    uids_a = {g.get("stdout") for g in got_a if g.get("id") != "hog"}
    uids_b = {g.get("stdout") for g in got_b}
    check("two servers: every run of each completed, its 50 threads started",
          all(g.get("status") == "completed" and g.get("exit_code") == 0 for g in got_a + got_b),
          [g for g in got_a + got_b if g.get("exit_code") != 0])
    hog_out = hog_a[0].get("stdout", "").split() if hog_a else []
    check("two servers: the hog held its uid's thread quota", hog_out[1:] == ["True"], hog_a)
    hog_uid = hog_out[0] + "\n" if hog_out else None
    check("two servers: the runs' uids are apart (none of one server's is the other's)",
          not (uids_a | {hog_uid}) & uids_b, (uids_a, hog_uid, uids_b))
    for s in (sa, sb):
        s.close()
    for p in (a, b):
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    # Each server's ids are a range of 4,096 aligned to its size; the range's
    # first id is held by a process of the template's for as long as it lives.
    ranges = {int(u) & ~4095 for u in uids_a | uids_b | {hog_uid} if u and u.strip().isdigit()}
    left = [p for lo in ranges for p in none_of_uids(lo, lo + 4096)]
    check("two servers gone: no process has any of their ids", ranges and not left, (ranges, left))


def nothing_outlives_a_one_shot_run():
    """pysbx run exits, and with it every process that held its ids."""
    if os.geteuid() != 0:
        print("skip one-shot ids: needs root")
        return
    for i in range(3):
        p = subprocess.run([PYSBX, "run", "--json", "-"], input="import os; print(os.getuid())",
                           capture_output=True, text=True, timeout=60)
        r = json.loads(p.stdout)
        lo = int(r["stdout"]) & ~4095
        left = none_of_uids(lo, lo + 4096)
        check(f"one-shot run {i}: no process of its ids is left", not left, (r, left))


def sessions_are_the_connections():
    """Two connections using the same name have two sessions; a connection
    that ends takes its sessions with it."""
    srv, path, log = listening("--max-sessions", "2")
    a_sock, a_in = connect(path)
    b_sock, b_in = connect(path)
    send(a_sock, {"id": 1, "session": "a", "code": "who = 'A'"})
    send(b_sock, {"id": 1, "session": "a", "code": "who = 'B'"})
    ra, rb = json.loads(a_in.next()), json.loads(b_in.next())
    check("the same name on two connections: each its cell 1",
          cell_of(ra) == (1, False) and cell_of(rb) == (1, False), (ra, rb))
    send(a_sock, {"id": 2, "session": "a", "code": "print(who)"})
    send(b_sock, {"id": 2, "session": "a", "code": "print(who)"})
    ra, rb = json.loads(a_in.next()), json.loads(b_in.next())
    check("... and its own state", ra.get("stdout") == "A\n" and rb.get("stdout") == "B\n"
          and cell_of(ra) == (2, False), (ra, rb))
    # --max-sessions 2: both are open; a third is refused with sandbox_busy.
    send(a_sock, {"id": 3, "session": "c", "code": "pass"})
    r = json.loads(a_in.next())
    check("past --max-sessions: sandbox_busy", refusal(r).get("code") == "sandbox_busy", r)
    send(a_sock, {"id": 4, "session_close": "a"})
    r = json.loads(a_in.next())
    check("session_close on a socket", r == {"id": 4, "session_closed": "a"}, r)
    send(a_sock, {"id": 5, "session": "c", "code": "print('c')"})
    r = json.loads(a_in.next())
    check("a closed session frees its place", r.get("stdout") == "c\n"
          and cell_of(r) == (1, False), r)
    send(b_sock, {"id": 3, "session": "a", "code": "print(who)"})
    r = json.loads(b_in.next())
    check("closing it on one connection leaves the other's", r.get("stdout") == "B\n", r)
    # The end of a connection closes its sessions: their places are free.
    a_sock.close()
    b_sock.close()
    c_sock, c_in = connect(path)
    got = []
    for name in ["p", "q"]:
        # The server sees the hang-ups in its own time: busy until then.
        for i in range(300):
            send(c_sock, {"id": i, "session": name, "code": "print('ok')"})
            r = json.loads(c_in.next())
            if refusal(r).get("code") != "sandbox_busy":
                break
            time.sleep(0.1)
        got.append(r)
    check("a connection that ends closes its sessions (two new ones open under --max-sessions 2)",
          all(r.get("stdout") == "ok\n" for r in got), got)
    c_sock.close()
    srv.send_signal(signal.SIGTERM)
    check("sessions: SIGTERM exits 0", srv.wait(timeout=60) == 0)


def session_lost_and_cancelled():
    """A cell of a session cancels as a run does; a session whose template
    is killed is lost (session_lost), and its name then starts afresh."""
    srv = start("--grace", "60", stdin=subprocess.PIPE)
    out = Lines(srv.stdout.fileno())
    send(srv.stdin, {"id": "v", "session": "s", "code": "v = 5"})
    a = json.loads(out.next())
    check("a first cell", cell_of(a) == (1, False), a)
    send(srv.stdin, {"id": "slow", "session": "s", "code": "v = 6\n" + SLEEP, "limits": LONG},
         {"id": "queued", "session": "s", "code": "print('queued ran')"}, MARKER)
    marked(out)
    # The waiting one first: it keeps its place behind the running one, and
    # is answered once that one has ended.
    send(srv.stdin, {"cancel": "queued"}, {"cancel": "slow"})
    got = [json.loads(out.next()) for _ in range(2)]
    by = {a.get("id"): a for a in got}
    # Whether it had started when the cancel came is the machine's business;
    # either way it does not become the session's state.
    check("a running cell is cancelled, and rolled back if it had started",
          by.get("slow", {}).get("status") == "cancelled"
          and cell_of(by["slow"]) in ((2, True), (0, False)), got)
    check("a cell cancelled while it waited for its turn is answered cancelled, not run (cell 0)",
          by.get("queued", {}).get("status") == "cancelled"
          and by["queued"].get("stdout") == "" and cell_of(by["queued"]) == (0, False), got)
    send(srv.stdin, {"id": "after", "session": "s", "code": "print(v)"})
    a = json.loads(out.next())
    check("the session goes on after a cancelled cell, as it was before it",
          a.get("stdout") == "5\n", a)
    tmpl = [p for p in children(srv.pid) if comm(p).startswith("pysbx-templ")]
    check("the template is the server's child", len(tmpl) == 1, tmpl)
    if tmpl:
        os.kill(tmpl[0], signal.SIGKILL)
    send(srv.stdin, {"id": "lost", "session": "s", "code": "print(v)"})
    a = json.loads(out.next())
    check("the template killed: the session answers session_lost",
          refusal(a).get("code") == "session_lost", a)
    send(srv.stdin, {"id": "new", "session": "s", "code": "print('v' in globals())"})
    a = json.loads(out.next(timeout=120))
    check("then the name starts a new session", a.get("stdout") == "False\n"
          and cell_of(a) == (1, False), a)
    srv.stdin.close()
    check("sessions on stdin: exit 0", srv.wait(timeout=60) == 0)


# --- hibernation: --state-dir ------------------------------------------------------

STATE_CELL = "x = 41\nopen('f.txt', 'w').write('kept')\nimport os\nprint(os.getuid())"


def ask(sock, lines, msg, timeout=60):
    """Sends |msg| and reads its answer (the connection's only request in flight)."""
    send(sock, msg)
    return json.loads(lines.next(timeout))


def state_dir():
    d = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, d, True)
    return os.path.join(d, "state")


def no_process_of(uid):
    """Whether no process has |uid| (as root, where a session has a uid of
    its own); True when not root."""
    return os.geteuid() != 0 or not none_of_uids(uid, uid + 1)


def hibernation_on_a_socket():
    """--state-dir: a hibernated session keeps no process; its next cell,
    from any connection (names are the server's with a state directory),
    finds its variables and files, restored; a flipped byte is refused and
    the server goes on; a restarted server restores it; a second server is
    refused the directory."""
    d = state_dir()
    srv, path, log = listening("--state-dir", d)
    a, ain = connect(path)
    r = ask(a, ain, {"id": 1, "session": "nb", "code": STATE_CELL})
    uid = int(r.get("stdout") or -1)
    h = ask(a, ain, {"id": 2, "session_hibernate": "nb"})
    check("session_hibernate is answered session_hibernated, with its image's bytes",
          set(h) == {"id", "session_hibernated"} and h["session_hibernated"]["name"] == "nb"
          and h["session_hibernated"]["bytes"] > 0, h)
    check("a hibernated session keeps no process (none of its uid is left)",
          uid > 0 and no_process_of(uid), (uid, none_of_uids(uid, uid + 1)))
    on_disk = images(d)
    check("its image is in the state directory, which is 0700, with a key 0600",
          len(on_disk) == 1 and stat.S_IMODE(os.stat(d).st_mode) == 0o700
          and stat.S_IMODE(os.stat(os.path.join(d, "key")).st_mode) == 0o600
          and os.path.getsize(image_path(d, on_disk[0])) == h["session_hibernated"]["bytes"],
          (on_disk, oct(os.stat(d).st_mode)))
    b, bin_ = connect(path)
    r = ask(b, bin_, {"id": 3, "session": "nb", "code": "print(x + 1, open('f.txt').read())"})
    check("its next cell, from another connection, restores it: variables, files, restored: true",
          r.get("stdout") == "42 kept\n" and r.get("session") ==
          {"name": "nb", "cell": 2, "rolled_back": False, "restored": True}, r)
    check("restored, its image leaves the directory", images(d) == [], images(d))
    r = ask(b, bin_, {"id": 4, "session": "nb", "code": "x += 1"})
    check("the cell after has no restored", r.get("session") ==
          {"name": "nb", "cell": 3, "rolled_back": False}, r)
    r = ask(a, ain, {"id": 5, "session_hibernate": "never-opened"})
    check("hibernating a session nobody opened: invalid_request",
          refusal(r).get("code") == "invalid_request" and "never-opened" in r["error"]["message"],
          r)
    r = ask(a, ain, {"id": 6, "session_hibernate": "nb", "code": "pass"})
    check("a session_hibernate message has only id and session_hibernate",
          refusal(r).get("code") == "invalid_request", r)
    # One byte of an image changed on disk: refused, removed, and the server goes on.
    ask(a, ain, {"id": 7, "session": "fl", "code": "y = 1"})
    ask(a, ain, {"id": 8, "session_hibernate": "fl"})
    fl = images(d)
    if fl:
        flip(image_path(d, fl[0]))
    r = ask(a, ain, {"id": 9, "session": "fl", "code": "print(y)"})
    check("a flipped byte: session_lost, the image failed its check, nothing ran",
          len(fl) == 1 and refusal(r).get("code") == "session_lost"
          and "failed its check" in r["error"]["message"] and "stdout" not in r, (fl, r))
    check("the refused image is removed", images(d) == [], images(d))
    r = ask(a, ain, {"id": 10, "session": "fl", "code": "print('y' in globals())"})
    check("and the server goes on: the name starts a new session",
          r.get("stdout") == "False\n" and cell_of(r) == (1, False), r)
    # A byte of the server's own head (its cell count, at offset 128), which
    # the library never sees: only the MAC covers it.
    ask(a, ain, {"id": 12, "session_hibernate": "fl"})
    fl = images(d)
    if fl:
        flip(image_path(d, fl[0]), at=128)
    r = ask(a, ain, {"id": 13, "session": "fl", "code": "print('y' in globals())"})
    check("a changed head (the cell count the server keeps): refused as failing its check",
          len(fl) == 1 and refusal(r).get("code") == "session_lost"
          and "failed its check" in r["error"]["message"], (fl, r))
    ask(a, ain, {"id": 14, "session": "fl", "code": "pass"})
    # A session whose state keeps a file open cannot hibernate.
    r = ask(a, ain, {"id": 15, "session": "kf", "code": "k = open('k.txt', 'w')"})
    check("a cell that keeps a file open is kept", cell_of(r) == (1, False), r)
    # A restart: SIGTERM hibernates what is open; the next server restores it.
    a.close()
    b.close()
    srv.send_signal(signal.SIGTERM)
    check("--state-dir: SIGTERM exits 0", srv.wait(timeout=60) == 0)
    check("at shutdown the open sessions hibernate", len(images(d)) == 2, images(d))
    srv, path, log = listening("--state-dir", d)
    c, cin = connect(path)
    r = ask(c, cin, {"id": 11, "session": "nb", "cell": 4,
                     "code": "print(x, open('f.txt').read())"})
    check("a restarted server with the same --state-dir restores it, its cells numbered on",
          r.get("stdout") == "42 kept\n" and r.get("session") ==
          {"name": "nb", "cell": 4, "rolled_back": False, "restored": True}, r)
    # The one that could not hibernate: a cell without a number cannot tell
    # a new session from it, so it is told it is lost, once.
    r = ask(c, cin, {"id": 16, "session": "kf", "code": "print('k' in globals())"})
    check("a session that could not hibernate at shutdown: its next cell is session_lost, "
          "saying why, and nothing ran", refusal(r).get("code") == "session_lost"
          and "could not hibernate" in r["error"]["message"] and "stdout" not in r, r)
    r = ask(c, cin, {"id": 17, "session": "kf", "code": "print('k' in globals())"})
    check("and the cell after starts a new session", r.get("stdout") == "False\n"
          and cell_of(r) == (1, False), r)
    p = subprocess.run([PYSBX, "serve", "--state-dir", d], input="", capture_output=True,
                       text=True, timeout=60)
    check("a second server on the same --state-dir is refused", p.returncode == 1
          and "another server uses this state directory" in p.stderr, (p.returncode, p.stderr))
    c.close()
    srv.send_signal(signal.SIGTERM)
    check("--state-dir: the restarted server exits 0", srv.wait(timeout=60) == 0)


def hibernated_sessions_among_the_others():
    """A restore takes a place among --max-sessions (none free: sandbox_busy,
    the image kept); a branch of a hibernated session restores it first;
    closing a hibernated session removes its image."""
    d = state_dir()
    srv, path, log = listening("--state-dir", d, "--max-sessions", "2")
    s, lines = connect(path)
    ask(s, lines, {"id": 1, "session": "a", "code": "x = 1"})
    ask(s, lines, {"id": 2, "session": "b", "code": "pass"})
    ask(s, lines, {"id": 3, "session_hibernate": "a"})
    r = ask(s, lines, {"id": 4, "session": "c", "code": "pass"})
    check("a hibernated session holds no place among --max-sessions", cell_of(r) == (1, False), r)
    r = ask(s, lines, {"id": 5, "session": "a", "code": "print(x)"})
    check("no place to restore it in: sandbox_busy, and its image stays",
          refusal(r).get("code") == "sandbox_busy" and len(images(d)) == 1, (r, images(d)))
    ask(s, lines, {"id": 6, "session_close": "b"})
    ask(s, lines, {"id": 7, "session_close": "c"})
    r = ask(s, lines, {"id": 8, "session_fork": {"from": "a", "to": "a2"}})
    check("a branch of a hibernated session restores it, then branches it",
          r.get("session_forked") == {"from": "a", "to": "a2", "cell": 1}, r)
    r = ask(s, lines, {"id": 9, "session": "a2", "code": "print(x)"})
    check("the branch has its state", r.get("stdout") == "1\n" and cell_of(r) == (2, False), r)
    ask(s, lines, {"id": 10, "session_hibernate": "a2"})
    r = ask(s, lines, {"id": 11, "session_close": "a2"})
    check("closing a hibernated session: session_closed, its image removed",
          r.get("session_closed") == "a2" and images(d) == [], (r, images(d)))
    r = ask(s, lines, {"id": 12, "session": "a2", "code": "print('x' in globals())"})
    check("and its name then starts afresh", r.get("stdout") == "False\n", r)
    s.close()
    srv.send_signal(signal.SIGTERM)
    check("--max-sessions with --state-dir: SIGTERM exits 0", srv.wait(timeout=60) == 0)


def hibernation_on_standard_input():
    """On standard input the sessions hibernate at the end of input, and a
    server run again with the same directory restores them."""
    d = state_dir()
    rc, first = serve([json.dumps({"id": 1, "session": "s", "code": "z = [1, 2]"})],
                      "--state-dir", d)
    rc2, second = serve([json.dumps({"id": 2, "session": "s", "code": "z.append(3)\nprint(z)"})],
                        "--state-dir", d)
    check("standard input: the end of input hibernates, the next run restores",
          rc == 0 and rc2 == 0 and second and second[0].get("stdout") == "[1, 2, 3]\n"
          and second[0].get("session", {}).get("restored") is True, (first, second))
    rc, answers = serve([json.dumps({"id": 1, "session_hibernate": "s"})])
    check("without --state-dir, session_hibernate is invalid_request, saying so",
          answers and refusal(answers[0]).get("code") == "invalid_request"
          and "--state-dir" in answers[0]["error"]["message"], answers)
    for args, want in [(["--hibernate-after", "5"], "goes with --state-dir"),
                       (["--state-max-bytes", "1G"], "goes with --state-dir"),
                       (["--state-dir", d, "--hibernate-after", "700"], "not below --session-idle"),
                       (["--state-dir", d, "--state-max-bytes", "1M"], "at least 16M"),
                       (["--state-dir", d, "--backend", "python3"], "no sessions")]:
        p = subprocess.run([PYSBX, "serve", *args], input="", capture_output=True, text=True,
                           timeout=60)
        check(f"serve {' '.join(args)}: refused, saying why", p.returncode == 2
              and want in p.stderr, (p.returncode, p.stderr))


def hibernation_by_itself_and_the_cap():
    """--hibernate-after: an idle session hibernates by itself. --state-max-bytes:
    past it the oldest image is dropped, and its next cell says so; an image
    larger than the cap alone is not kept, and its session goes on."""
    d = state_dir()
    srv, path, log = listening("--state-dir", d, "--hibernate-after", "1", "--session-idle", "60",
                               "--state-max-bytes", "20M")
    s, lines = connect(path)
    r = ask(s, lines, {"id": 1, "session": "idle", "code": "import os\nw = 'idle'\nprint(os.getuid())"})
    uid = int(r.get("stdout") or -1)
    gone = wait_for(lambda: len(images(d)) == 1 and no_process_of(uid), 30)
    check("--hibernate-after 1: an idle session hibernates by itself, its processes gone", gone,
          (images(d), none_of_uids(uid, uid + 1)))
    r = ask(s, lines, {"id": 2, "session": "idle", "code": "print(w)"})
    check("and its next cell restores it", r.get("stdout") == "idle\n"
          and r.get("session", {}).get("restored") is True, r)
    ask(s, lines, {"id": 3, "session_close": "idle"})
    sizes = {}
    for i, name in enumerate(["c1", "c2", "c3"]):
        ask(s, lines, {"id": f"o{i}", "session": name, "code": f"v = {i}"})
        h = ask(s, lines, {"id": f"h{i}", "session_hibernate": name})
        sizes[name] = h.get("session_hibernated", {}).get("bytes", 0)
    cap = 20 << 20
    fits = sizes["c1"] + sizes["c2"] <= cap < sum(sizes.values())
    on_disk = sum(os.path.getsize(image_path(d, f)) for f in images(d))
    check("--state-max-bytes 20M: the images together stay within it", fits and on_disk <= cap
          and len(images(d)) == 2, (sizes, on_disk, images(d)))
    r = ask(s, lines, {"id": 4, "session": "c1", "code": "print(v)"})
    check("the oldest image was dropped: its next cell is session_lost, saying why",
          refusal(r).get("code") == "session_lost"
          and "--state-max-bytes" in r["error"]["message"], r)
    r = ask(s, lines, {"id": 5, "session": "c1", "code": "print('v' in globals())"})
    check("then the name starts a new session", r.get("stdout") == "False\n", r)
    r = ask(s, lines, {"id": 6, "session": "c2", "code": "print(v)"})
    check("the newer images are restored", r.get("stdout") == "1\n"
          and r.get("session", {}).get("restored") is True, r)
    ask(s, lines, {"id": 7, "session": "big", "code": "b = bytearray(24 << 20)\nb[::4096] = b'x' * len(b[::4096])"})
    r = ask(s, lines, {"id": 8, "session_hibernate": "big"})
    check("an image larger than --state-max-bytes alone is not kept: sandbox_unavailable",
          refusal(r).get("code") == "sandbox_unavailable" and "larger" in r["error"]["message"],
          r)
    r = ask(s, lines, {"id": 9, "session": "big", "code": "print(len(b))"})
    check("and its session goes on, as it was", r.get("stdout") == f"{24 << 20}\n"
          and "restored" not in r.get("session", {}), r)
    s.close()
    srv.send_signal(signal.SIGTERM)
    check("--hibernate-after: SIGTERM exits 0", srv.wait(timeout=60) == 0)



def sessions_need_a_backend_that_has_them():
    rc, answers = serve([json.dumps({"id": 1, "session": "s", "code": "print(1)"}),
                         json.dumps({"id": 2, "code": "print(2)"})], "--backend", "python3")
    by = {a.get("id"): a for a in answers}
    e = refusal(by.get(1, {}))
    check("--backend python3: a session is invalid_request, saying it has none",
          e.get("code") == "invalid_request" and "no sessions" in e.get("message", ""), answers)
    check("--backend python3: a plain request still runs", by.get(2, {}).get("stdout") == "2\n",
          answers)


# --- "stream": true -------------------------------------------------------

TICKS = ("import sys, time\n"
         "for i in range(3):\n"
         "    print('tick', i, flush=True)\n"
         "    print('err', i, file=sys.stderr, flush=True)\n"
         "    time.sleep(0.4)\n"
         "sys.stdout.buffer.write('é'.encode()[:1]); sys.stdout.flush(); time.sleep(0.2)\n"
         "sys.stdout.buffer.write('é'.encode()[1:] + b'\\n')\n")


def timed_lines(lines, rid, timeout=60):
    """(seconds since the call, line) of |rid|'s lines up to its answer."""
    t0, got = time.monotonic(), []
    while True:
        line = lines.until(lambda l: json.loads(l).get("id") == rid, timeout=timeout)
        if line is None:
            raise EOFError("the stream ended before the answer")
        m = json.loads(line)
        got.append((time.monotonic() - t0, m))
        if "event" not in m:
            return got


def same_answer(streamed, plain):
    """The answers but for their timings."""
    drop = lambda a: {k: v for k, v in a.items() if k not in ("id", "stats")}
    return drop(streamed) == drop(plain)


def check_stream(where, got, plain):
    events = [(t, m) for t, m in got if "event" in m]
    answer = got[-1][1]
    out = "".join(m["data"] for _, m in events if m["event"] == "stdout")
    err = "".join(m["data"] for _, m in events if m["event"] == "stderr")
    ticks = [t for t, m in events if m["event"] == "stdout" and m["data"].startswith("tick")]
    check(f"{where}: the output as events, then the answer",
          out == answer["stdout"] and err == answer["stderr"] and "tick 2" in out, got)
    check(f"{where}: each line as it is written (0.4 s apart), long before the answer",
          len(ticks) == 3 and ticks[1] - ticks[0] > 0.25 and ticks[2] - ticks[1] > 0.25
          and got[-1][0] - ticks[0] > 1.0, [(round(t, 2), m.get("data")) for t, m in got])
    check(f"{where}: a character written in two pieces comes whole in one event",
          "\ufffd" not in out and any("é" in m["data"] for _, m in events), events)
    check(f"{where}: the answer is the one a run without streaming gets",
          same_answer(answer, plain), (answer, plain))


def streaming_on_standard_input():
    rc, answers = serve([json.dumps({"id": "p", "code": TICKS})])
    plain = answers[0]
    srv = start(stdin=subprocess.PIPE)
    lines = Lines(srv.stdout.fileno())
    send(srv.stdin, {"id": "s", "code": TICKS, "stream": True})
    check_stream("stdin", timed_lines(lines, "s"), plain)
    send(srv.stdin, {"id": "f", "code": "print(1)", "stream": False},
         {"id": "b", "code": "pass", "stream": "yes"})
    got = [json.loads(lines.next()) for _ in range(2)]
    check("stream false: the answer alone", any(m.get("id") == "f" and "status" in m
                                                for m in got), got)
    check("stream not a boolean: invalid_request", any(
        m.get("id") == "b" and refusal(m).get("code") == "invalid_request" for m in got), got)
    # A session's cell streams too.
    send(srv.stdin, {"id": "c1", "session": "S", "code": "x = 5"},
         {"id": "c2", "session": "S", "code": "print(x * 2)", "stream": True})
    got = timed_lines(lines, "c2")
    check("a session's cell: its output as events, then its answer",
          [m.get("event") for _, m in got] == ["stdout", None] and got[0][1]["data"] == "10\n"
          and got[-1][1].get("session", {}).get("cell") == 2, got)
    srv.stdin.close()
    check("serve ends at the end of input", srv.wait(timeout=60) == 0)


def streaming_on_a_socket():
    rc, answers = serve([json.dumps({"id": "p", "code": TICKS})])
    srv, path, log = listening()
    sock, lines = connect(path)
    send(sock, {"id": 7, "code": TICKS, "stream": True})
    check_stream("socket", timed_lines(lines, 7), answers[0])
    # The events are bounded like the result: at most max_output_chars.
    send(sock, {"id": 8, "stream": True, "limits": {"max_output_chars": 50},
                "code": "for i in range(200):\n    print('é' * 10, flush=True)"})
    got = timed_lines(lines, 8)
    out = "".join(m["data"] for _, m in got if m.get("event") == "stdout")
    check("streamed output is cut where the result is, the note included",
          out == got[-1][1]["stdout"] and got[-1][1]["stdout_truncated"]
          and out.startswith(("é" * 10 + "\n") * 4 + "é" * 6 + "\n[pysbx: output cut"), out)
    sock.close()


def a_stream_nobody_reads():
    """A reader that does not keep up: its events are dropped and said so,
    never the run held up (its clock), the server or another client."""
    srv, path, log = listening("--max-pending-bytes", "64K")
    flood = ("import sys\nfor i in range(2000):\n    print('y' * 999, flush=True)\n"
             "print('end', file=sys.stderr)")
    s_sock, s_in = connect(path)
    send(s_sock, {"id": "flood", "stream": True, "code": flood,
                  "limits": {"max_output_chars": 4000000}})
    f_sock, f_in = connect(path)
    send(f_sock, {"id": "fast", "code": "print(2)"})
    a = json.loads(f_in.next(timeout=60))
    check("another client is answered while a stream is not read", a.get("stdout") == "2\n", a)
    time.sleep(4)  # the flood ends meanwhile, its events left unread
    got = timed_lines(s_in, "flood")
    answer = got[-1][1]
    dropped = [m for _, m in got if m.get("event") == "dropped"]
    shown = sum(len(m["data"].encode()) for _, m in got if m.get("event") == "stdout")
    check("the answer holds all the output", answer.get("stdout", "").count("y" * 999) == 2000,
          answer.get("stdout_truncated"))
    check("what was not sent as events is said, just before the answer",
          len(dropped) == 1 and got[-2][1] is dropped[0]
          and dropped[0]["stdout"] + shown == len(answer["stdout"].encode())
          and dropped[0]["stderr"] == 0, (dropped, shown))
    check("the run was not held up by its reader (it ended before the reader came back)",
          answer["stats"]["wall_ms"] < 3500, answer["stats"])
    check("a stream left unread does not cut the client off",
          not any("unread" in l for l in log.buf.decode().splitlines()), log.buf)
    # A tool call that would take a client past its allowance of unread
    # events (its arguments are 70 KB): the client is not asked, the call
    # fails at once in the code.
    send(s_sock, {"id": "ask", "stream": True, "tools": [{"name": "double"}],
                  "limits": {"max_output_chars": 4000000},
                  "code": flood + "\nimport pysbx\ntry:\n    pysbx.tools.double(x='z' * 70000)\n"
                                  "except pysbx.ToolError as e:\n    print('ToolError', e)"})
    time.sleep(4)
    got = timed_lines(s_in, "ask")
    check("a client that has left too much unread is not asked: the call fails in the code",
          not any(m.get("event") == "tool_call" for _, m in got)
          and "ToolError the client was not asked" in got[-1][1].get("stdout", ""),
          [m.get("event") for _, m in got][-3:])
    s_sock.close()
    f_sock.close()


# --- host tools --------------------------------------------------------------

TOOLS = [{"name": "lookup", "description": "Looks a word up.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
         {"name": "double"}]


def serve_tools(lines, sender, rid, answer, timeout=60):
    """Reads |rid|'s lines until its answer, answering each tool_call with
    answer(event) (a tool_result body, or None to leave it). Returns
    (calls, refusals, answer)."""
    calls, refusals = [], []
    while True:
        line = lines.next(timeout=timeout)
        if line is None:
            raise EOFError("the stream ended before the answer")
        m = json.loads(line)
        if "tool_result" in m and "error" in m:
            refusals.append(m)
        elif m.get("id") != rid:
            continue
        elif m.get("event") == "tool_call":
            calls.append(m)
            body = answer(m)
            if body is not None:
                send(sender, {"id": rid, "tool_result": {"call": m["call"], **body}})
        elif "event" not in m:
            return calls, refusals, m


def tools_over_json_lines():
    srv = start(stdin=subprocess.PIPE)
    lines = Lines(srv.stdout.fileno())
    code = ("import pysbx\ntotal = 0\nfor i in range(3):\n"
            "    total += pysbx.tools.lookup(q=str(i))['n']\n"
            "    total += pysbx.call_tool('double', {'x': i})\n"
            "print(total, pysbx.tools.lookup.__doc__)")
    send(srv.stdin, {"id": "t", "code": code, "tools": TOOLS})
    calls, refusals, a = serve_tools(
        lines, srv.stdin, "t",
        lambda m: {"content": {"n": 10}} if m["name"] == "lookup"
        else {"content": m["arguments"]["x"] * 2})
    check("a program calls two tools in a loop: each result comes back",
          a.get("stdout") == "36 Looks a word up.\n" and not refusals, (a, refusals))
    check("the host sees each call once, numbered in order, with its arguments",
          [(m["call"], m["name"], m["arguments"]) for m in calls]
          == [(1, "lookup", {"q": "0"}), (2, "double", {"x": 0}), (3, "lookup", {"q": "1"}),
              (4, "double", {"x": 1}), (5, "lookup", {"q": "2"}), (6, "double", {"x": 2})],
          calls)

    # Forged and late results: refused with a line of their own, nothing changes.
    code = "import pysbx\nprint(pysbx.tools.lookup(q='a'))"
    send(srv.stdin, {"id": "f", "code": code, "tools": TOOLS})

    def forge(m):
        send(srv.stdin, {"id": "f", "tool_result": {"call": 2, "content": "forged"}},
             {"id": "nobody", "tool_result": {"call": 1, "content": "forged"}},
             {"id": "f", "tool_result": {"content": "no call"}},
             {"id": "f", "tool_result": {"call": 1, "content": "x" * (2 << 20)}})
        send(srv.stdin, {"id": "f", "tool_result": {"call": 1, "content": "real"}})
        return {"content": "second"}
    calls, refusals, a = serve_tools(lines, srv.stdin, "f", forge)
    codes = sorted((r["tool_result"]["id"], r["tool_result"]["call"], r["error"]["code"])
                   for r in refusals)
    check("forged, unknown, malformed, oversized and second results are refused apart",
          a.get("stdout") == "real\n" and codes == sorted([
              ("f", 2, "invalid_request"), ("nobody", 1, "invalid_request"),
              ("f", 0, "invalid_request"), ("f", 1, "request_too_large"),
              ("f", 1, "invalid_request")]), (a.get("stdout"), refusals))
    send(srv.stdin, {"id": "f", "tool_result": {"call": 1, "content": "late"}})
    late = json.loads(lines.next())
    check("a result after the run ended is refused", late.get("tool_result") == {"id": "f", "call": 1}
          and late["error"]["code"] == "invalid_request", late)

    # A flood of calls: past max_tool_calls the code is refused, the host sees none.
    code = ("import pysbx\nok = bad = 0\nfor i in range(40):\n    try:\n"
            "        pysbx.tools.double(x=i); ok += 1\n"
            "    except pysbx.ToolError as e:\n        bad += 1; why = str(e)\nprint(ok, bad, why)")
    send(srv.stdin, {"id": "flood", "code": code, "tools": TOOLS, "max_tool_calls": 5})
    calls, refusals, a = serve_tools(lines, srv.stdin, "flood", lambda m: {"content": 0})
    check("a flood of calls: max_tool_calls reach the host, the rest raise ToolError",
          len(calls) == 5 and a.get("stdout", "").startswith("5 35 this run's 5 tool calls"),
          (len(calls), a.get("stdout")))

    # What the code may send that is not a call: each refused to the code alone.
    code = ("import os, struct, pysbx\nres = []\n"
            "for f in [b'not json', b'[1]', b'{\"name\": \"lookup\", \"arguments\": 5}',"
            " b'{\"name\": \"lookup\", \"x\": 1}', b'{\"name\": \"nope\"}']:\n"
            "    os.write(3, struct.pack('<I', len(f)) + f)\n"
            "    n = struct.unpack('<I', os.read(3, 4))[0]\n"
            "    res.append(os.read(3, n).decode())\n"
            "try:\n    pysbx.call_tool('lookup', {'q': 'x' * 5000})\n"
            "except pysbx.ToolError as e:\n    res.append(str(e))\n"
            "try:\n    pysbx.tools.lookup(q=object())\nexcept TypeError:\n    res.append('TypeError')\n"
            "print('\\n'.join(res))")
    send(srv.stdin, {"id": "raw", "code": code, "tools": TOOLS, "max_tool_bytes": 2048})
    calls, refusals, a = serve_tools(lines, srv.stdin, "raw", lambda m: {"content": 0})
    out = a.get("stdout", "").splitlines()
    check("frames that are not calls, unknown names, oversized arguments: refused to the code, "
          "never reaching the host",
          not calls and len(out) == 7 and all('"error"' in l for l in out[:5])
          and "no tool named nope" in out[4] and "more than max_tool_bytes (2048)" in out[5]
          and out[6] == "TypeError", (calls, out))
    # A frame longer than max_tool_bytes, written raw: the channel closes,
    # the run goes on.
    code = ("import os, struct, pysbx\nos.write(3, struct.pack('<I', 1 << 30))\n"
            "try:\n    os.write(3, b'x' * 100000)\nexcept OSError as e:\n    print('write', e.errno)\n"
            "try:\n    print(pysbx.tools.double(x=1))\n"
            "except pysbx.ToolError as e:\n    print('ToolError', e)\nprint('done')")
    send(srv.stdin, {"id": "huge", "code": code, "tools": TOOLS, "max_tool_bytes": 4096})
    calls, refusals, a = serve_tools(lines, srv.stdin, "huge", lambda m: {"content": 0})
    check("a frame past max_tool_bytes closes the channel; the run goes on and ends",
          not calls and a.get("status") == "completed" and a["stdout"].endswith("done\n")
          and "ToolError" in a["stdout"], (calls, a.get("stdout")))

    # Many threads: each gets its own answer.
    code = ("import pysbx, threading\nout = {}\n"
            "def go(i):\n    out[i] = pysbx.tools.double(x=i)\n"
            "ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out.items()))")
    send(srv.stdin, {"id": "threads", "code": code, "tools": TOOLS})
    pending = []

    def later(m):  # answered in reverse order, all at once
        pending.append(m)
        if len(pending) == 8:
            for p in reversed(pending):
                send(srv.stdin, {"id": "threads", "tool_result":
                                 {"call": p["call"], "content": p["arguments"]["x"] * 2}})
        return None
    calls, refusals, a = serve_tools(lines, srv.stdin, "threads", later)
    check("calls from eight threads, answered out of order: each thread gets its own",
          a.get("stdout") == str([(i, 2 * i) for i in range(8)]) + "\n" and len(calls) == 8,
          (a.get("stdout"), len(calls)))

    # A client that never answers: the wall limit ends the run, which used no CPU waiting.
    send(srv.stdin, {"id": "silent", "code": "import pysbx\npysbx.tools.lookup(q='?')",
                     "tools": TOOLS, "limits": {"wall_seconds": 1}})
    calls, refusals, a = serve_tools(lines, srv.stdin, "silent", lambda m: None)
    check("a client that never answers: the run ends at its wall limit, no CPU spent waiting",
          len(calls) == 1 and a.get("status") == "timeout" and a.get("limit") == "wall"
          and a["stats"]["cpu_ms"] < 500, a)
    send(srv.stdin, {"id": "silent", "tool_result": {"call": 1, "content": "too late"}})
    late = json.loads(lines.next())
    check("... and its call can no longer be answered", "error" in late
          and late.get("tool_result") == {"id": "silent", "call": 1}, late)

    # A call waiting when a ceiling fires (a thread spins past the CPU
    # limit): the run ends as any run does, and its call is void.
    send(srv.stdin, {"id": "spin", "tools": TOOLS, "limits": {"cpu_seconds": 0.5},
                     "code": "import pysbx, threading\n"
                             "def spin():\n    while True:\n        pass\n"
                             "threading.Thread(target=spin, daemon=True).start()\n"
                             "pysbx.tools.lookup(q='?')"})
    calls, refusals, a = serve_tools(lines, srv.stdin, "spin", lambda m: None)
    check("a call waiting when the CPU limit fires: the run ends at it",
          len(calls) == 1 and a.get("status") == "timeout" and a.get("limit") == "cpu", a)
    send(srv.stdin, {"id": "spin", "tool_result": {"call": 1, "content": "after"}})
    late = json.loads(lines.next())
    check("... and a result sent after it is refused", "error" in late
          and late.get("tool_result") == {"id": "spin", "call": 1}, late)

    # Without tools: no module, no channel.
    send(srv.stdin, {"id": "none", "code": "import os\ntry:\n    import pysbx\n"
                     "except ImportError as e:\n    print(type(e).__name__)\n"
                     "try:\n    os.write(3, b'\\0\\0\\0\\0')\nexcept OSError as e:\n"
                     "    print(e.errno)"})
    a = json.loads(lines.until(lambda l: json.loads(l).get("id") == "none"))
    check("a run that declared no tools has neither the module nor the channel",
          a.get("stdout") == "ModuleNotFoundError\n9\n", a)
    for name, req, want in [
        ("a bad tool name", {"tools": [{"name": "1x"}]}, "invalid_request"),
        ("two tools of one name", {"tools": [{"name": "a"}, {"name": "a"}]}, "invalid_request"),
        ("65 tools", {"tools": [{"name": f"t{i}"} for i in range(65)]}, "invalid_request"),
        ("an unknown tool field", {"tools": [{"name": "a", "schema": {}}]}, "invalid_request"),
        ("max_tool_calls without tools", {"max_tool_calls": 3}, "invalid_request"),
        ("max_tool_bytes too small", {"tools": TOOLS, "max_tool_bytes": 10}, "invalid_limit"),
        ("tools in a session's cell", {"tools": TOOLS, "session": "s"}, "invalid_request"),
    ]:
        send(srv.stdin, {"id": name, "code": "pass", **req})
        a = json.loads(lines.until(lambda l: json.loads(l).get("id") == name))
        check(f"refused: {name}", refusal(a).get("code") == want, a)
    srv.stdin.close()
    check("serve ends at the end of input", srv.wait(timeout=60) == 0)


def code_that_never_reads_its_answers():
    """The server stops reading a run's calls once 64 KiB of answers wait for
    it, so its memory stays flat (2 million empty frames would be ~170 MB of
    refusals), and the code blocks on its own writes until its wall limit.
    Measured with AddressSanitizer's quarantine off where it is on (freed
    memory it holds back would count as the server's)."""
    env = {**os.environ, "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0"}
    srv = subprocess.Popen([PYSBX, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
    started.append(srv)
    lines = Lines(srv.stdout.fileno())

    def peak_kb(pid):  # the most the server has held at once
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))
    send(srv.stdin, {"id": "warm", "code": "print(1)"})
    lines.next()
    before = peak_kb(srv.pid)
    send(srv.stdin, {"id": "deaf", "tools": TOOLS, "limits": {"wall_seconds": 3},
                     "code": "import os\nfor i in range(4):\n    os.write(3, bytes(2 << 20))"})
    calls, refusals, a = serve_tools(lines, srv.stdin, "deaf", lambda m: None)
    grew = peak_kb(srv.pid) - before
    check("code that floods calls and never reads: the server's peak memory stays flat, the "
          "run ends at its wall limit", not calls and a.get("limit") == "wall" and grew < 32768,
          (grew, a.get("status"), a.get("limit")))
    srv.stdin.close()
    check("serve ends at the end of input", srv.wait(timeout=60) == 0)


def a_deep_call_is_refused_to_the_code():
    """Arguments nested past the bound are refused to the code, as an
    oversized call is: the host never gets a line its JSON reader cannot
    take (Python's stops at about 1,000 levels)."""
    srv = start(stdin=subprocess.PIPE)
    lines = Lines(srv.stdout.fileno())
    code = ("import os, struct, pysbx\nres = []\n"
            "for depth in (63, 64, 1200):\n"
            "    f = b'{\"name\": \"lookup\", \"arguments\": {\"q\": ' + b'[' * depth"
            " + b']' * depth + b'}}'\n"
            "    os.write(3, struct.pack('<I', len(f)) + f)\n"
            "    n = struct.unpack('<I', os.read(3, 4))[0]\n"
            "    res.append(os.read(3, n).decode())\n"
            "print('\\n'.join(res))")
    send(srv.stdin, {"id": "deep", "code": code, "tools": TOOLS})
    calls, refusals, a = serve_tools(lines, srv.stdin, "deep", lambda m: {"content": 0})
    out = a.get("stdout", "").splitlines()
    check("arguments 64 deep reach the host; 65 or 1,201 deep are refused to the code alone",
          len(calls) == 1 and len(out) == 3 and '"content":0' in out[0].replace(" ", "")
          and all('"error"' in l and "nested deeper than 64" in l for l in out[1:]),
          (len(calls), out))


def tools_on_a_socket():
    srv, path, log = listening()
    sock, lines = connect(path)
    send(sock, {"id": 1, "code": "import pysbx\nprint(pysbx.tools.double(x=21))", "tools": TOOLS})
    calls, refusals, a = serve_tools(lines, sock, 1, lambda m: {"content": m["arguments"]["x"] * 2})
    check("a tool over a socket", a.get("stdout") == "42\n" and len(calls) == 1, a)
    send(sock, {"id": 2, "code": "import pysbx\npysbx.tools.double(x=1)", "tools": TOOLS})
    calls, refusals, a = serve_tools(lines, sock, 2, lambda m: {"error": "no such thing"})
    check("a tool's error is ToolError in the code", a.get("exit_code") == 1
          and a["error"]["type"] == "pysbx.ToolError" and a["error"]["message"] == "no such thing"
          and 'File "<pysbx>"' in a["stderr"], a)
    sock.close()


section(streaming_on_standard_input)
section(streaming_on_a_socket)
section(a_stream_nobody_reads)
section(tools_over_json_lines)
section(tools_on_a_socket)
section(a_deep_call_is_refused_to_the_code)
section(code_that_never_reads_its_answers)
section(sessions_on_standard_input)
section(branches_on_standard_input)
section(kept_files_on_standard_input)
section(a_sessions_memory_is_its_first_cells)
section(sessions_need_the_templates_own_proc)
section(two_servers_never_share_a_uid)
section(nothing_outlives_a_one_shot_run)
section(sessions_are_the_connections)
section(session_lost_and_cancelled)
section(hibernation_on_a_socket)
section(hibernation_on_standard_input)
section(hibernated_sessions_among_the_others)
section(hibernation_by_itself_and_the_cap)
section(sessions_need_a_backend_that_has_them)
section(the_id_comes_back_as_written)
section(ids_of_objects_past_what_the_parser_holds)
section(generated_ids)
section(unknown_fields)
section(messages_cut_inside_a_character_still_make_an_answer_with_the_id)
section(ceilings)
section(files_the_code_hides)
section(cancel_on_standard_input)
section(cancel_behind_the_queue)
section(sigterm_on_standard_input_the_grace_then_cancelled)
section(a_client_that_hangs_up)
section(a_client_that_does_not_read)
section(sigterm_on_a_socket)
section(a_second_signal)
section(a_socket_left_by_a_killed_server_is_taken_over)

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
    f.write(json.dumps({"id": "sess", "session": "s", "code": "pass"}) + "\n")
    f.write(json.dumps({"id": "tool", "tools": [{"name": "t"}], "code": "pass"}) + "\n")
    f.write(json.dumps({"id": "in", "code": "import sys\nprint(input(), sys.argv[1:])",
                        "stdin": "6\n", "argv": ["z"]}) + "\n")
out = os.path.join(d, "out.jsonl")
p = subprocess.run([PYSBX, "batch", jl, "--out", out], capture_output=True, text=True,
                   timeout=120)
lines = [json.loads(l) for l in open(out)]
check("batch of JSONL: one line each, labelled", sorted(l["program"] for l in lines)
      == ["line 1", "line 2", "line 3", "line 4", "line 5", "line 6", "line 7"], lines)
check("batch refuses host tools (it has no one to answer them)",
      any(l.get("id") == "tool" and refusal(l).get("code") == "invalid_request"
          and "no tool calls" in l["error"]["message"] for l in lines), lines)
check("batch of JSONL: a line's stdin and argv", any(l.get("id") == "in"
                                                     and l.get("stdout") == "6 ['z']\n"
                                                     for l in lines), lines)
check("batch refuses a session (served over JSON lines and MCP)",
      any(l.get("id") == "sess" and refusal(l).get("code") == "invalid_request"
          and "JSON lines and MCP" in l["error"]["message"] for l in lines), lines)
check("batch of JSONL: the id as written",
      '{"program":"line 4","id":1.00000000001,"status":"completed"' in open(out).read())
check("batch of JSONL: ids and errors", any(l.get("id") == "x" and l["stdout"] == "4\n"
                                             for l in lines)
      and any("status" not in l and "error" in l and l["program"] == "line 2" for l in lines),
      lines)
check("batch exit 1 when a request was refused", p.returncode == 1, p.returncode)
for f in os.listdir(d):
    os.unlink(os.path.join(d, f))
os.rmdir(d)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
