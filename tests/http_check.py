"""pysbx serve --http as a client sees it, every answer checked against
docs/openapi.yaml (and the result schema it refers to). Run by test_http.sh
with Debian's python3 (python3-jsonschema, python3-yaml); exits non-zero when
a check failed. Servers listen on loopback only."""
import atexit, http.client, json, os, re, shutil, signal, socket, subprocess, sys, tempfile
import threading
import time

import jsonschema
import yaml
from procs import children, comm, none_of_uids
from statedir import flip, image_path, images, wait_for

PYSBX, SRC = sys.argv[1], sys.argv[2]
DOCS = os.path.join(SRC, "docs")
TOKEN = "t0ken-" + os.urandom(8).hex()
failures = 0
started = []
seen = {}  # what the first server answered: status or error code -> count


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


# --- the document ------------------------------------------------------------
with open(os.path.join(DOCS, "openapi.yaml")) as f:
    API = yaml.safe_load(f)
with open(os.path.join(DOCS, "result.schema.json")) as f:
    RESULT = json.load(f)
BASE = "file://" + DOCS + "/openapi.yaml"
RESOLVER = jsonschema.RefResolver(BASE, API, store={"file://" + DOCS + "/result.schema.json": RESULT})
jsonschema.Draft202012Validator.check_schema(RESULT)


def resolve(obj):
    while "$ref" in obj and obj["$ref"].startswith("#/"):
        obj = RESOLVER.resolve(obj["$ref"])[1]
    return obj


def conforms(path, method, status, resp_type, body):
    """Whether an answer is one the document describes: a documented status,
    its content type, and (for JSON) the schema."""
    # Unknown paths and methods: the document's NotFound and MethodNotAllowed.
    # A templated path ({run_id}) matches its parameter's pattern.
    ops = API["paths"].get(path)
    for templ, o in API["paths"].items():
        names = re.findall(r"\{(\w+)\}", templ)
        if ops is None and names:
            plist = o.get("parameters") or o.get("post", o.get("get", {})).get("parameters", [])
            params = {p["name"]: p["schema"].get("pattern", "^[^/]+$").strip("^$")
                      for p in map(resolve, plist)}
            rx = re.escape(templ)
            for n in names:
                rx = rx.replace(re.escape("{" + n + "}"), "(?:" + params.get(n, "[^/]+") + ")")
            if re.fullmatch(rx, path):
                ops = o
    op = (ops or {}).get(method.lower())
    if op is None:
        want = "NotFound" if ops is None else "MethodNotAllowed"
        op = {"responses": {"404" if ops is None else "405":
                            {"$ref": "#/components/responses/" + want}}}
    r = op["responses"].get(str(status))
    if r is None:
        return False, f"{method} {path} does not document {status}"
    r = resolve(r)
    content = r.get("content")
    if not content:
        return True, ""
    ctype = (resp_type or "").split(";")[0].strip()
    if ctype not in content:
        return False, f"content type {resp_type!r}, documented {list(content)}"
    if ctype != "application/json":
        return True, ""
    try:
        jsonschema.Draft202012Validator(content[ctype]["schema"], resolver=RESOLVER).validate(
            json.loads(body))
    except (jsonschema.ValidationError, ValueError) as e:
        return False, f"{str(e)[:300]} in {body[:300]!r}"
    return True, ""


# --- a server ----------------------------------------------------------------
def start(*args, token=True, wait=True, tokens=(TOKEN,), env=None):
    tf = None
    if token:
        tf = tempfile.NamedTemporaryFile("w", delete=False)
        tf.write("".join(t + "\n" for t in tokens))
        tf.close()
        args = ("--http-token-file", tf.name) + args
    args = ("--http", "127.0.0.1:0") + args
    p = subprocess.Popen([PYSBX, "serve", *args], stderr=subprocess.PIPE, text=True, env=env)
    started.append(p)
    if not wait:
        return p, None
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        raise SystemExit(f"the server did not start: {line!r}")
    threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
    return p, int(m.group(1))


class Client:
    def __init__(self, port, token=TOKEN):
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(self, method, path, body=None, headers=None, check_doc=True):
        h = dict(headers or {})
        if self.token is not None:
            h.setdefault("Authorization", "Bearer " + self.token)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        try:
            self.conn.request(method, path, body=body, headers=h)
            r = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.conn.request(method, path, body=body, headers=h)
            r = self.conn.getresponse()
        data = r.read().decode()
        if r.will_close:
            self.conn.close()
        if check_doc:
            ok, why = conforms(path, method if method != "HEAD" else "GET", r.status,
                               r.getheader("Content-Type"), data)
            check(f"{method} {path} -> {r.status} is as documented", ok, why)
        return r, data

    def run(self, req, **kw):
        r, data = self.request("POST", "/v1/run", req, **kw)
        a = json.loads(data) if data else None
        key = a.get("status") or a["error"]["code"]
        seen[key] = seen.get(key, 0) + 1
        return r.status, a


proc, port = start("--jobs", "2", "--max-line-bytes", "4096", "--max-wall", "5", "--grace", "5")
c = Client(port)

# --- health and runs -----------------------------------------------------------
for _ in range(100):  # the pool fills shortly after the start
    r, body = c.request("GET", "/healthz", check_doc=False)
    if r.status == 200:
        break
    time.sleep(0.05)
r, body = c.request("GET", "/healthz")
check("healthz: 200, ready, idle workers", r.status == 200 and json.loads(body)["status"] == "ready"
      and json.loads(body)["idle_workers"] > 0, body)
r, body = Client(port, token=None).request("GET", "/healthz")
check("healthz needs no token", r.status == 200, r.status)

st, a = c.run({"id": "one", "code": "print(6 * 7)"})
check("a run: 200 and its result", st == 200 and a["status"] == "completed"
      and a["stdout"] == "42\n" and a["id"] == "one", a)
r, data = c.request("POST", "/v1/run", '{"id": 1.00000000001, "code": "pass"}')
check("the id comes back as written", data.startswith('{"id":1.00000000001,'), data[:60])
seen["completed"] = seen.get("completed", 0) + 1
st, a = c.run({"id": 2, "code": "print(open('d/a.txt').read(), open('b', 'rb').read())",
               "files": {"d/a.txt": "hi"}, "files_base64": {"b": "aGk="}})
check("input files, text and base64", st == 200 and a["stdout"] == "hi b'hi'\n", a)
st, a = c.run({"id": 3, "code": "open('out.txt', 'w').write('x' * 10)"})
check("an artifact", st == 200 and [x["name"] for x in a["artifacts"]] == ["out.txt"], a)
st, a = c.run({"id": 4, "code": "raise ValueError('v')"})
check("an exception: completed, exit 1", st == 200 and a["exit_code"] == 1
      and "ValueError: v" in a["stderr"], a)
st, a = c.run({"id": 5, "code": "while True: pass", "limits": {"cpu_seconds": 0.3}})
check("a CPU spin: 200, timeout/cpu", st == 200 and a["status"] == "timeout"
      and a["limit"] == "cpu", a)

# --- refusals: the JSON-lines server's codes ---------------------------------------
for name, req, code in [
    ("not JSON", "this is not json", "invalid_request"),
    ("no code", {"id": 6}, "invalid_request"),
    ("an unknown field", {"id": 7, "code": "pass", "Code": "x"}, "invalid_request"),
    ("an unknown limit", {"id": 8, "code": "pass", "limits": {"bogus": 1}}, "invalid_limit"),
    ("an impossible limit", {"id": 9, "code": "pass", "limits": {"wall_seconds": -1}},
     "invalid_limit"),
    ("above the server's ceiling", {"id": 10, "code": "pass", "limits": {"wall_seconds": 100}},
     "invalid_limit"),
    ("an escaping file name", {"id": 11, "code": "pass", "files": {"../x": "x"}}, "invalid_file"),
    ("a cancel message", {"cancel": 1}, "invalid_request"),
    ("an empty body", "", "invalid_request"),
    ("a session", {"id": 13, "code": "pass", "session": "s"}, "invalid_request"),
    ("a session_close message", {"id": 14, "session_close": "s"}, "invalid_request"),
]:
    st, a = c.run(req)
    check(f"{name}: 400 {code}", st == 400 and a["error"]["code"] == code, (st, a))
    if "session" in name:
        check(f"{name}: says where sessions are served",
              a["id"] == req["id"] and "POST /v1/sessions/NAME/run" in a["error"]["message"], a)
st, a = c.run({"id": 12, "code": "x" * 5000})
check("a body over --max-line-bytes: 413 request_too_large",
      st == 413 and a["error"]["code"] == "request_too_large", (st, a))


def chunked_too_large():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/run", body=iter([b"x" * 3000, b"y" * 3000]), encode_chunked=True,
                 headers={"Authorization": "Bearer " + TOKEN})
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    return r.status, json.loads(data)


st, a = chunked_too_large()
check("a chunked body over the limit: 413", st == 413
      and a["error"]["code"] == "request_too_large", (st, a))
try:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/run", body=iter([b"x" * 1000] * 100), encode_chunked=True,
                 headers={"Authorization": "Bearer " + TOKEN})
    got = conn.getresponse().status
except (OSError, http.client.HTTPException) as e:
    got = e
conn.close()
check("a chunked body going on past twice the limit: cut off, not read to its end",
      isinstance(got, (OSError, http.client.HTTPException)), got)
r, _ = c.request("GET", "/healthz", headers={"X-Big": "a" * 70000})
check("headers over 64 KiB: 431", r.status == 431, r.status)
r, body = c.request("GET", "/nope")
check("an unknown path: 404 not_found", r.status == 404
      and json.loads(body)["error"]["code"] == "not_found", body)
r, body = c.request("GET", "/v1/run")
check("GET /v1/run: 405 method_not_allowed, Allow: POST", r.status == 405
      and r.getheader("Allow") == "POST"
      and json.loads(body)["error"]["code"] == "method_not_allowed", (r.status, body))
r, body = c.request("DELETE", "/healthz", check_doc=False)
check("DELETE /healthz: 405, Allow: GET, HEAD", r.status == 405
      and r.getheader("Allow") == "GET, HEAD"
      and json.loads(body)["error"]["code"] == "method_not_allowed", body)

# --- the token ----------------------------------------------------------------------
for name, tok in [("no token", None), ("a wrong token", TOKEN[:-1] + "x"),
                  ("a token too short", TOKEN[:-1]), ("a token too long", TOKEN + "x"),
                  ("another scheme", "")]:
    cl = Client(port, token=tok)
    hdr = {"Authorization": "Basic " + TOKEN} if tok == "" else None
    if tok == "":
        cl.token = None
    st, a = cl.run({"id": 13, "code": "print('ran')"}, headers=hdr)
    check(f"{name}: 401, nothing run", st == 401 and "error" in a, (st, a))
    r, _ = cl.request("GET", "/metrics", headers=hdr)
    check(f"{name}: /metrics 401", r.status == 401, r.status)

# --- keep-alive and concurrency --------------------------------------------------------
k = Client(port)
k.run({"code": "pass"})
sock = k.conn.sock
for i in range(3):
    k.run({"id": i, "code": "pass"})
check("keep-alive: one connection for several requests", sock is not None and k.conn.sock is sock)

answers = {}


def one(i):
    st, a = Client(port).run({"id": f"c{i}", "code": f"import time; time.sleep(0.05); print({i})"},
                             check_doc=False)
    answers.setdefault(a.get("id"), []).append((st, a))


ts = [threading.Thread(target=one, args=(i,)) for i in range(12)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check("12 concurrent requests, each answered once with its own output",
      all(len(answers.get(f"c{i}", [])) == 1 and answers[f"c{i}"][0][1]["stdout"] == f"{i}\n"
          for i in range(12)), answers)

# --- metrics ---------------------------------------------------------------------------
r, text = c.request("GET", "/metrics")
check("metrics: text format", r.status == 200
      and r.getheader("Content-Type").startswith("text/plain; version=0.0.4"), r.status)
vals = {}
for line in text.splitlines():
    if line and not line.startswith("#"):
        name, value = line.rsplit(" ", 1)
        vals[name] = float(value)
for status in ["completed", "timeout"]:
    n = vals.get(f'pysbx_runs_total{{status="{status}"}}', -1)
    check(f"metrics: {status} runs counted", n == seen[status], (n, seen))
# The chunked 413 did not go through Client.run.
for code, extra in [("invalid_limit", 0), ("invalid_file", 0), ("request_too_large", 1)]:
    n = vals.get(f'pysbx_requests_refused_total{{code="{code}"}}', -1)
    check(f"metrics: {code} refusals counted", n == seen[code] + extra, (n, seen))
bucket = [v for n, v in vals.items() if n.startswith("pysbx_run_duration_seconds_bucket")]
check("metrics: the histogram is cumulative and counts every run",
      bucket == sorted(bucket)
      and bucket[-1] == vals["pysbx_run_duration_seconds_count"] == seen["completed"] + 1
      and vals["pysbx_run_duration_seconds_sum"] > 0, bucket)
for g in ["pysbx_queue_depth", "pysbx_idle_workers", "pysbx_runs_in_flight",
          "pysbx_template_restarts_total", "pysbx_template_up", "pysbx_ready"]:
    check(f"metrics: {g}", g in vals, list(vals)[:5])
check("metrics: build info", any(n.startswith("pysbx_build_info{version=") for n in vals), vals)
for name in {n.split("{")[0] for n in vals}:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    check(f"metrics: {name} has HELP and TYPE",
          f"# HELP {base} " in text and f"# TYPE {base} " in text)

# --- a client that hangs up -----------------------------------------------------------
hang = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"code": "import time; time.sleep(4); print('finished')"})
hang.sendall((f"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
time.sleep(0.5)  # the run has started
hang.close()
metric = lambda text, name: float(re.search(re.escape(name) + r" (\S+)\n", text).group(1))
for _ in range(100):  # its end, whichever it is: cancelled, or completed after 4 s
    r, text = c.request("GET", "/metrics", check_doc=False)
    ended = (metric(text, 'pysbx_runs_total{status="cancelled"}')
             + metric(text, 'pysbx_runs_total{status="completed"}') - seen["completed"])
    if ended:
        break
    time.sleep(0.1)
check("a client that hangs up has its run cancelled",
      metric(text, 'pysbx_runs_total{status="cancelled"}') == 1, text[:600])
seen["cancelled"] = 1

# --- health when the template dies ------------------------------------------------------


tmpl = [p for p in children(proc.pid) if comm(p).startswith("pysbx-templ")]
check("the template is the server's child", len(tmpl) == 1, tmpl)
if tmpl:
    os.kill(tmpl[0], signal.SIGKILL)
    for _ in range(100):
        r, body = c.request("GET", "/healthz", check_doc=False)
        if r.status == 503:
            break
        time.sleep(0.05)
    r, body = c.request("GET", "/healthz")
    check("the template killed: healthz 503 with a reason", r.status == 503
          and json.loads(body)["status"] == "unavailable" and json.loads(body)["reason"], body)
    r, text = c.request("GET", "/metrics")
    check("the template killed: template_up 0", "\npysbx_template_up 0\n" in text, text[-400:])
    for _ in range(50):  # the next run restarts it, after a backoff
        st, a = c.run({"code": "print('back')"}, check_doc=False)
        if st == 200 and a["status"] == "completed":
            break
        time.sleep(0.1)
    check("a run after it: a new template", st == 200 and a["stdout"] == "back\n", (st, a))
    r, text = c.request("GET", "/metrics")
    check("the restart counted", "\npysbx_template_restarts_total 1\n" in text, text[-400:])

# --- hostile clients -------------------------------------------------------------------
def raw(port, data, timeout=10, source=None):
    """Sends |data| on a fresh connection; what comes back until the server
    closes it (or |timeout|)."""
    s = socket.socket()
    if source:
        s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    s.sendall(data)
    got = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
    except OSError:
        pass
    s.close()
    return got


hidden = b'{"code": "print(1)"}'
second = (b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
          + b"\r\nContent-Length: " + str(len(hidden)).encode() + b"\r\n\r\n" + hidden)
body = b'{"code": "print(2)"}'
chunked = hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
smuggle = (b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
           + b"\r\nContent-Length: " + str(len(chunked)).encode()
           + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + second)
got = raw(port, smuggle)
answers = got.count(b"HTTP/1.1 ")
check("Content-Length and Transfer-Encoding together: 400 bad_framing, one answer, closed",
      got.startswith(b"HTTP/1.1 400") and b'"bad_framing"' in got and answers == 1, got[:300])
got = raw(port, b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
          + b"\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n")
# libmicrohttpd 1.0 (Debian 13) refuses such a coding itself, with its own
# 400 and the connection closed, before the server sees the request.
check("a Transfer-Encoding other than chunked: 400 bad_framing (or libmicrohttpd's own 400)",
      got.startswith(b"HTTP/1.1 400") and (b'"bad_framing"' in got
                                           or b"Unsupported Transfer-Encoding" in got)
      and got.count(b"HTTP/1.1 ") == 1, got[:300])


# What libmicrohttpd refuses itself, before the server sees a request (it
# gives the application no say there): not JSON, and docs/serving.md names each.
for name, data, want in [
    ("a header line without a colon", b"GET /healthz HTTP/1.1\r\nHost: x\r\nbad\r\n\r\n",
     b"HTTP/1.1 400"),
    ("an HTTP version it does not know", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
     b"HTTP/1.1 505"),
    ("a request line it cannot parse", b"GARBAGE\r\n\r\n", b""),
]:
    got = raw(port, data)
    check(f"libmicrohttpd's own refusal, {name}: {want.decode() or 'closed'}",
          got.startswith(want) if want else got == b"", got[:80])


def slow_flood(port, n, hold):
    """|n| connections, from as many loopback addresses as it takes, that
    send the start of a request and then a header line every second, never
    ending their headers; held |hold| seconds."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((f"127.0.{2 + i // 200}.{1 + i % 200}", 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/run HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass
        socks.append(s)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        for s in socks:
            try:
                s.send(b"X-Slow: a\r\n")
            except OSError:
                pass
        time.sleep(1)
    for s in socks:
        s.close()


flood = threading.Thread(target=slow_flood, args=(port, 600, 16))
flood.start()
time.sleep(3)  # the flood is in: its 600 connections are open or cut
lat, failed = [], []
t_end = time.monotonic() + 10
while time.monotonic() < t_end:
    for path in ("/healthz", "/v1/run"):
        t0 = time.monotonic()
        try:
            g = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            hdr = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}
            if path == "/healthz":
                g.request("GET", path)
            else:
                g.request("POST", path, body='{"code": "print(1)"}', headers=hdr)
            r = g.getresponse()
            r.read()
            g.close()
            if r.status != 200:
                failed.append((path, r.status))
        except OSError as e:
            failed.append((path, repr(e)))
        lat.append((time.monotonic() - t0) * 1000)
    time.sleep(0.1)
flood.join(60)
lat.sort()
print(f"a good client under 600 slow connections: {len(lat)} requests, p50 "
      f"{lat[len(lat) // 2]:.1f} ms, p99 {lat[min(len(lat) - 1, len(lat) * 99 // 100)]:.1f} ms")
check("600 slow connections: every request of a good client is answered 200", not failed,
      failed[:5])
r, text = c.request("GET", "/metrics")
m = re.search(r'pysbx_connections_cut_total\{why="evicted"\} (\d+)', text)
check("the slow connections were cut off (metrics)", m and int(m.group(1)) > 0, text[-600:])
# From one address: at most --max-client-connections of them.
many = []
for i in range(200):
    s = socket.socket()
    s.bind(("127.0.1.9", 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        pass
    many.append(s)
time.sleep(1)
alive = 0
for s in many:
    try:
        s.settimeout(0.01)
        alive += s.recv(1) != b""
    except socket.timeout:
        alive += 1
    except OSError:
        pass
    s.close()
check("one address holds at most --max-client-connections (128) connections", 0 < alive <= 128,
      alive)

# --- "stream": true, read by curl -N as a client would ----------------------------------
LINE = {"$ref": "#/paths/~1v1~1run/post/responses/200/content/application~1x-ndjson/x-pysbx-line"}
TICKS = ("import sys, time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
         "    time.sleep(0.4)\nprint('err', file=sys.stderr)")


def not_as_documented(lines):
    """Why each line of a streamed answer that the document does not describe is not."""
    bad = []
    for m in lines:
        try:
            jsonschema.Draft202012Validator(LINE, resolver=RESOLVER).validate(m)
        except jsonschema.ValidationError as e:
            bad.append(str(e)[:200])
    return bad


def curl_stream(body, timeout=60):
    """(seconds since the start, line) as curl -N gives them; headers apart."""
    p = subprocess.Popen(["curl", "-sS", "-N", "-D", "/dev/stderr", "-H",
                          "Authorization: Bearer " + TOKEN, "-H", "Content-Type: application/json",
                          "--data-binary", json.dumps(body), "--max-time", str(timeout),
                          f"http://127.0.0.1:{port}/v1/run"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, got = time.monotonic(), []
    for line in p.stdout:
        got.append((time.monotonic() - t0, line))
    return got, p.stderr.read(), p.wait()


got, headers, rc = curl_stream({"id": "s", "code": TICKS, "stream": True})
lines = [json.loads(l) for _, l in got]
bad = not_as_documented(lines)
check("stream: 200, application/x-ndjson, chunked", rc == 0 and " 200 " in headers.splitlines()[0]
      and "content-type: application/x-ndjson" in headers.lower()
      and "transfer-encoding: chunked" in headers.lower(), headers)
check("stream: every line is as the document says", not bad and lines, bad)
ticks = [t for (t, _), m in zip(got, lines) if m.get("event") == "stdout"]
check("stream: each line as it is written (0.4 s apart), the result last",
      len(ticks) == 3 and ticks[1] - ticks[0] > 0.25 and ticks[2] - ticks[1] > 0.25
      and "status" in lines[-1] and got[-1][0] - ticks[0] > 1.0,
      [(round(t, 2), l[:60]) for t, l in got])
st, plain = c.run({"id": "s", "code": TICKS})
streamed = {k: v for k, v in lines[-1].items() if k != "stats"}
check("stream: the result is the one a run without streaming gets",
      streamed == {k: v for k, v in plain.items() if k != "stats"}
      and "".join(m["data"] for m in lines if m.get("event") == "stdout") == plain["stdout"]
      and "".join(m["data"] for m in lines if m.get("event") == "stderr") == plain["stderr"],
      (streamed, plain))
got, headers, rc = curl_stream({"id": "bad", "code": "pass", "stream": True,
                                "limits": {"wall_seconds": 100}})
check("stream: a refused request is its usual 400, not a stream", " 400 " in headers.splitlines()[0]
      and json.loads(got[0][1])["error"]["code"] == "invalid_limit", (headers, got))


def runs_total(status):
    r, text = c.request("GET", "/metrics", check_doc=False)
    m = re.search(r'^pysbx_runs_total\{status="%s"\} (\d+)' % status, text, re.M)
    return int(m.group(1)) if m else 0


before = runs_total("cancelled")
got, headers, rc = curl_stream({"id": "gone", "stream": True, "limits": {"wall_seconds": 5},
                                "code": "import time\nwhile True:\n    print(1, flush=True)\n"
                                        "    time.sleep(0.1)"}, timeout=1)
for _ in range(40):
    if runs_total("cancelled") > before:
        break
    time.sleep(0.05)
check("stream: a client that hangs up has its run cancelled at once (not at its wall limit)",
      rc == 28 and got and runs_total("cancelled") == before + 1, (rc, len(got)))

# A stream nobody reads: events past --max-pending-bytes are dropped and
# said, never the run held up (its clock) or the server.
sp, sport = start("--max-pending-bytes", "64K")
flood = json.dumps({"id": "flood", "stream": True, "limits": {"max_output_chars": 12000000},
                    "code": "for i in range(8000):\n    print('y' * 999, flush=True)"}).encode()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # what the kernel holds for us stays small
s.settimeout(60)
s.connect(("127.0.0.1", sport))
s.sendall(b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
          + b"\r\nContent-Length: " + str(len(flood)).encode() + b"\r\n\r\n" + flood)
st, other = Client(sport).run({"id": "other", "code": "print(2)"}, check_doc=False)
check("stream: another client is answered while a stream is not read",
      st == 200 and other.get("stdout") == "2\n", other)
time.sleep(5)  # the flood ends meanwhile, its events left unread
got = b""
while not got.endswith(b"0\r\n\r\n"):
    d = s.recv(1 << 20)
    if not d:
        break
    got += d
s.close()
rest, body = got.partition(b"\r\n\r\n")[2], b""
while rest:  # the chunked body
    size, _, rest = rest.partition(b"\r\n")
    n = int(size.split(b";")[0], 16)
    body, rest = body + rest[:n], rest[n + 2:]
    if n == 0:
        break
events = [json.loads(l) for l in body.splitlines()]
answer = events[-1] if events else {}
dropped = [m for m in events if m.get("event") == "dropped"]
check("stream: a reader that falls behind misses events, said once before the result, "
      "which has them all", len(dropped) == 1 and events[-2] is dropped[0]
      and answer.get("stdout", "").count("y" * 999) == 8000, (dropped, answer.get("status")))
check("stream: the run was not held up by its reader (it ended before the reader came back)",
      answer.get("stats", {}).get("wall_ms", 1e9) < 4500, answer.get("stats"))
sp.send_signal(signal.SIGTERM)
check("stream: that server exits 0", sp.wait(30) == 0, sp.returncode)

# --- host tools over HTTP: the run streamed, its calls answered by POST ------------------
def tool_run(body, answer, timeout=60):
    """Runs |body| (with tools), answering each tool_call with answer(event)
    through POST /v1/runs/RUN_ID/tool_results; (lines, posts, status)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/run", body=json.dumps(body),
                 headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    r = conn.getresponse()
    lines, posts, run_id = [], [], None
    while r.status == 200:
        line = r.readline()
        if not line:
            break
        m = json.loads(line)
        lines.append(m)
        if m.get("event") == "started":
            run_id = m["run_id"]
        if m.get("event") == "tool_call":
            for b in answer(m):
                rr, data = c.request("POST", f"/v1/runs/{run_id}/tool_results", b)
                posts.append((rr.status, json.loads(data)))
    conn.close()
    return lines, posts, r.status


TOOLS = [{"name": "lookup", "description": "Looks a word up."}, {"name": "double"}]
code = ("import pysbx\nt = 0\nfor i in range(3):\n    t += pysbx.tools.lookup(q=str(i))['n']\n"
        "    t += pysbx.tools.double(x=i)\nprint(t)")
lines, posts, st = tool_run({"id": "tl", "code": code, "tools": TOOLS},
                            lambda m: [{"call": m["call"], "content": {"n": 10}}]
                            if m["name"] == "lookup"
                            else [{"call": m["call"], "content": m["arguments"]["x"] * 2}])
bad = not_as_documented(lines)
check("tools over HTTP: started, six calls answered by POST, the result last, as documented",
      st == 200 and lines[0].get("event") == "started" and not bad
      and [m["call"] for m in lines if m.get("event") == "tool_call"] == [1, 2, 3, 4, 5, 6]
      and all(p == 200 for p, _ in posts) and lines[-1].get("stdout") == "36\n", (bad, lines, posts))
check("tools over HTTP: no output events unless asked for",
      not any(m.get("event") in ("stdout", "stderr") for m in lines), lines)
run_id = lines[0]["run_id"]
# The run stays a second after its answer: the second answer must find it in
# flight (a run that ended is 404, below).
lines, posts, st = tool_run({"id": "tf", "code": "import pysbx, time\n"
                             "print(pysbx.tools.double(x=1), flush=True)\ntime.sleep(1)",
                             "tools": TOOLS, "max_tool_bytes": 1024},
                            lambda m: [{"call": m["call"] + 1, "content": 0},
                                       {"call": m["call"], "content": "x" * 2000},
                                       {"call": m["call"], "result": 1},
                                       {"call": m["call"], "content": 2},
                                       {"call": m["call"], "content": 3}])
check("tools over HTTP: an unknown call 409, too large 413, malformed 400, a second answer 409; "
      "the first good one is taken", [p for p, _ in posts] == [409, 413, 400, 200, 409]
      and lines[-1].get("stdout") == "2\n", (posts, lines[-1]))
r, data = c.request("POST", f"/v1/runs/{run_id}/tool_results", {"call": 1, "content": 0})
check("tools over HTTP: a run that ended is 404", r.status == 404
      and json.loads(data)["error"]["code"] == "not_found", (r.status, data))
r, data = Client(port, token="wrong").request("POST", f"/v1/runs/{lines[0]['run_id']}/tool_results",
                                              {"call": 1, "content": 0})
check("tools over HTTP: results want the token", r.status == 401, r.status)
r, data = c.request("POST", "/v1/runs/not-an-id/tool_results", {"call": 1, "content": 0})
check("tools over HTTP: a malformed run id is no path", r.status == 404, r.status)

# --- shutdown ---------------------------------------------------------------------------
slow = {}


def slow_run(port, key, code):
    try:
        slow[key] = Client(port).run({"id": key, "code": code}, check_doc=False)
    except Exception as e:  # noqa: BLE001 - recorded and checked below
        slow[key] = (0, repr(e))


t = threading.Thread(target=slow_run, args=(port, "slow", "import time; time.sleep(1.5); print('done')"))
t.start()
time.sleep(0.5)
idle = Client(port)  # an open keep-alive connection
idle.run({"code": "pass"}, check_doc=False)
proc.send_signal(signal.SIGTERM)
time.sleep(0.3)
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    refused = False
except OSError:
    refused = True
check("SIGTERM: new connections refused at once", refused)
st, a = idle.run({"code": "pass"})
check("SIGTERM: a new request on an open connection is 503", st == 503
      and a["error"]["code"] == "sandbox_unavailable", (st, a))
t.join(30)
st, a = slow.get("slow", (0, None))
check("SIGTERM: the run in flight finishes within the grace", st == 200
      and a["status"] == "completed" and a["stdout"] == "done\n", (st, a))
check("SIGTERM: exits 0", proc.wait(30) == 0, proc.returncode)

p2, port2 = start("--grace", "0.5")
t = threading.Thread(target=slow_run, args=(port2, "long", "import time; time.sleep(30)"))
t.start()
time.sleep(0.5)
p2.send_signal(signal.SIGTERM)
t.join(30)
st, a = slow.get("long", (0, None))
check("past the grace: cancelled and answered", st == 200 and a["status"] == "cancelled"
      and a["partial"] is True, (st, a))
check("past the grace: exits 0", p2.wait(30) == 0, p2.returncode)

# --- sessions: two tenants, expiry, loss, order, the limit -------------------------------
TOKEN_B = "other-" + os.urandom(8).hex()
sp, sport = start("--session-idle", "2", "--max-sessions", "3", "--jobs", "4",
                  tokens=(TOKEN, TOKEN_B))
A, B = Client(sport), Client(sport, token=TOKEN_B)


cells_answered = []


def cell(client, name, req, **kw):
    r, data = client.request("POST", f"/v1/sessions/{name}/run", req, **kw)
    if r.status == 200:
        cells_answered.append(name)
    return r.status, json.loads(data)


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = children(p)
        except OSError:
            kids = []  # gone meanwhile
        out += kids
        todo += kids
    return out


for _ in range(100):
    if A.request("GET", "/healthz", check_doc=False)[0].status == 200:
        break
    time.sleep(0.05)
st, a = cell(A, "nb", {"id": 1, "code": "x = 41\nopen('f.txt', 'w').write('kept')", "cell": 1})
check("sessions over HTTP: cell 1", st == 200 and a["session"] == {"name": "nb", "cell": 1,
                                                                     "rolled_back": False}, a)
st, a = cell(A, "nb", {"id": 2, "code": "print(x + 1, open('f.txt').read())", "cell": 2})
check("sessions over HTTP: cell 2 sees cell 1's variables and files",
      st == 200 and a["stdout"] == "42 kept\n" and a["session"]["cell"] == 2, a)
st, a = cell(A, "nb", {"code": "x = 0\nopen('f.txt', 'w').write('lost')\nraise KeyError(1)"})
check("sessions over HTTP: a cell that raises is rolled back", st == 200
      and a["session"]["rolled_back"] is True and a["error"]["type"] == "KeyError", a)
st, a = cell(A, "nb", {"code": "print(x, open('f.txt').read())", "rollback": "never"})
check("sessions over HTTP: as it was before, variables and files", st == 200
      and a["stdout"] == "41 kept\n" and a["session"]["cell"] == 4, a)
# Another tenant: its own sessions, never A's, even by A's name.
r, data = B.request("GET", "/v1/sessions")
check("another token lists none of A's sessions", r.status == 200
      and json.loads(data) == {"sessions": []}, data)
st, a = cell(B, "nb", {"code": "print(x)", "cell": 5})
check("another token's cell 5 of A's session name: 410 session_lost, nothing run", st == 410
      and a["error"]["code"] == "session_lost" and "stdout" not in a, (st, a))
st, a = cell(B, "nb", {"code": "import os\nprint('x' in dir(), sorted(os.listdir('.')))"})
check("another token's session of the same name is its own, with none of A's state", st == 200
      and a["stdout"] == "False []\n" and a["session"]["cell"] == 1, a)
r, data = B.request("DELETE", "/v1/sessions/nb")
check("another token closes its own session only", r.status == 200
      and json.loads(data) == {"session_closed": "nb"}, (r.status, data))
r, data = B.request("DELETE", "/v1/sessions/nb")
check("closing it again: 404", r.status == 404 and json.loads(data)["error"]["code"] == "not_found",
      (r.status, data))
r, data = A.request("GET", "/v1/sessions")
info = json.loads(data)["sessions"] if r.status == 200 else []
check("A's session is still listed, with its cells and memory", len(info) == 1
      and info[0]["name"] == "nb" and info[0]["cells"] == 4 and info[0]["max_rss_kb"] > 0
      and info[0]["memory_limit_bytes"] > 0 and not info[0]["running"], data)
st, a = cell(A, "nb", {"code": "print(x)", "cell": 5})
check("and runs on", st == 200 and a["stdout"] == "41\n", a)
# A branch: a copy of the state, then its own; of its origin's family.
r, data = A.request("POST", "/v1/sessions/nb/fork", {"to": "nb~b"})
check("a fork over HTTP: 200, numbered on from its origin", r.status == 200 and json.loads(data)
      == {"session_forked": {"from": "nb", "to": "nb~b", "cell": 5}}, (r.status, data))
st, a = cell(A, "nb~b", {"code": "x = 7\nopen('f.txt', 'w').write('b')\nprint(x)", "cell": 6})
check("the branch starts from the state, then goes its own way", st == 200
      and a["stdout"] == "7\n" and a["session"] == {"name": "nb~b", "cell": 6,
                                                    "rolled_back": False}, a)
st, a = cell(A, "nb", {"code": "print(x, open('f.txt').read())", "cell": 6})
check("the origin sees nothing of its branch", st == 200 and a["stdout"] == "41 kept\n", a)
st, a = cell(B, "nb~b", {"code": "print(x)", "cell": 7})
check("another token's cell of A's branch: 410, nothing run", st == 410
      and "stdout" not in a, (st, a))
for name, who, body, want in [
    ("a fork of another token's session", B, {"to": "nb~c"}, 404),
    ("a fork onto an open session", A, {"to": "nb~b"}, 409),
    ("a fork outside its family", A, {"to": "other"}, 400),
    ("a fork without to", A, {"from": "nb"}, 400),
]:
    r, data = who.request("POST", "/v1/sessions/nb/fork", body)
    check(f"{name}: {want}", r.status == want and json.loads(data)["error"]["code"]
          == "invalid_request", (r.status, data))
r, data = A.request("DELETE", "/v1/sessions/nb~b")
check("a branch closes as any session", r.status == 200, (r.status, data))
# Kept files: a sqlite3 connection and an open file from one cell to the
# next; a failed cell through them rolled back exactly; a pipe refused.
st, a = cell(A, "kf", {"code": "import sqlite3\nc = sqlite3.connect('db.sqlite')\n"
                               "c.execute('create table t (x)')\n"
                               "c.execute('insert into t values (1)')\nc.commit()\n"
                               "f = open('log.txt', 'w+')\nf.write('hello')\nf.flush()\n"
                               "print(f.tell())"})
check("kept files over HTTP: a cell that leaves a sqlite3 connection and a file open is kept",
      st == 200 and a["stdout"] == "5\n" and a["session"]["rolled_back"] is False, a)
st, a = cell(A, "kf", {"code": "f.write('x' * 100)\nf.flush()\nf.seek(0)\n"
                               "c.execute('insert into t values (2)')\nc.commit()\n"
                               "raise ValueError('undo')"})
check("kept files over HTTP: a failed cell through them is rolled back",
      st == 200 and a["session"]["rolled_back"] is True and a["error"]["type"] == "ValueError", a)
st, a = cell(A, "kf", {"code": "print(f.tell(), repr(open('log.txt').read()), "
                               "c.execute('select x from t').fetchall())"})
check("kept files over HTTP: the offset, the file and the database are the state's",
      st == 200 and a["stdout"] == "5 'hello' [(1,)]\n" and not a["session"]["rolled_back"], a)
st, a = cell(A, "kf", {"code": "import os\nr, w = os.pipe()\nprint(r)"})
check("kept files over HTTP: a pipe left open is refused, the reason naming it",
      st == 200 and a["session"]["rolled_back"] is True
      and f"fd {a['stdout'].strip()} (a pipe)" in (a.get("reason") or ""), a)
r, data = A.request("POST", "/v1/sessions/kf/fork", {"to": "kf~b"})
st, a = cell(A, "kf~b", {"code": "f.write(' from b')\nf.flush()\n"
                                 "print(f.tell(), open('log.txt').read())"})
check("kept files over HTTP: a branch carries them as its own", r.status == 200 and st == 200
      and a["stdout"] == "12 hello from b\n", (r.status, data, a))
st, a = cell(A, "kf", {"code": "print(f.tell(), open('log.txt').read())"})
check("kept files over HTTP: and its origin's are the origin's",
      st == 200 and a["stdout"] == "5 hello\n", a)
A.request("DELETE", "/v1/sessions/kf~b")
A.request("DELETE", "/v1/sessions/kf")
st, a = cell(A, "nb", {"code": "print(x)", "cell": 9})
check("a cell number that is not the next: 410 session_lost, the session ended", st == 410
      and a["error"]["code"] == "session_lost", (st, a))
st, a = cell(A, "nb", {"code": "print('x' in dir())", "cell": 1})
check("then cell 1 starts a new session", st == 200 and a["stdout"] == "False\n", a)
for name, path, method, want in [
    ("a name with a slash", "/v1/sessions/a%2Fb/run", "POST", 404),
    ("a name too long", "/v1/sessions/" + "n" * 129 + "/run", "POST", 404),
    ("a session's run by GET", "/v1/sessions/nb/run", "GET", 405),
    ("a session by POST", "/v1/sessions/nb", "POST", 405),
    ("the list by DELETE", "/v1/sessions", "DELETE", 405),
]:
    r, data = A.request(method, path, {"code": "print(1)"} if method == "POST" else None)
    check(f"sessions: {name} is {want}", r.status == want and "stdout" not in data,
          (r.status, data))
# Objects past what the parser holds (a number past a double's range,
# nesting deeper than 2,048): refused, with their ids, a run as a cell.
for name, body in [
        ("a number past a double's range",
         '{"id": "big", "code": "pass", "limits": {"wall_seconds": 1e400}}'),
        ("nesting 3,000 deep", '{"code": "pass", "x": ' + "[" * 3000 + "]" * 3000 + ', "id": "big"}')]:
    for path in ("/v1/run", "/v1/sessions/nb/run"):
        r, data = A.request("POST", path, body)
        check(f"{path}, {name}: 400 invalid_request, with the id", r.status == 400
              and data.startswith('{"id":"big","error":{"code":"invalid_request"'), data[:200])
# A front end that escapes the names its users choose passes on what they
# wrote: an escaped NUL cuts no name (the session called "victim" stays
# open), and a path whose bytes are not UTF-8 is answered like any other.
st, a = cell(A, "victim", {"code": "v = 1", "cell": 1})
for name, method, path in [
    ("a name with an escaped NUL", "DELETE", "/v1/sessions/victim%00-of-someone-else"),
    ("a cell of a name with an escaped NUL", "POST", "/v1/sessions/victim%00x/run"),
    ("a fork of a name with an escaped NUL", "POST", "/v1/sessions/victim%00x/fork"),
    ("a run's path with an escaped NUL", "POST", "/v1/run%00"),
    ("a name escaped as bytes that are not UTF-8", "POST", "/v1/sessions/%ff/run"),
    ("an overlong encoding of a slash", "GET", "/%c0%af"),
]:
    for who, tag in [(A, ""), (Client(sport, token=None), ", without a token")]:
        r, data = who.request(method, path, {"code": "print(1)"} if method == "POST" else None)
        body = json.loads(data) if data.startswith("{") else {}
        check(f"{name}{tag}: 404 not_found, a JSON body", r.status == 404
              and body.get("error", {}).get("code") == "not_found" and "stdout" not in data,
              (r.status, data))
st, a = cell(A, "victim", {"code": "print(v)", "cell": 2})
check("the session whose name came before the NUL is still open", st == 200
      and a["stdout"] == "1\n", (st, a))
A.request("DELETE", "/v1/sessions/victim")
for name, data in [("a raw byte that is not UTF-8 in the path", b"GET /\xff HTTP/1.1\r\n"),
                   ("one in a session's name", b"POST /v1/sessions/\xc0\xaf/run HTTP/1.1\r\n"),
                   ("one in the method", b"G\xffT /healthz HTTP/1.1\r\n")]:
    for auth, tag in [(b"Authorization: Bearer " + TOKEN.encode() + b"\r\n", ""),
                      (b"", ", without a token")]:
        got = raw(sport, data + b"Host: x\r\nConnection: close\r\n" + auth
                  + b"Content-Length: 0\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        try:
            err = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            err = None
        check(f"{name}{tag}: an answer, its body the JSON error",
              head.startswith((b"HTTP/1.1 404", b"HTTP/1.1 405"))
              and err in ("not_found", "method_not_allowed"), got[:300])
for name, req in [("session in the body", {"code": "1", "session": "other"}),
                  ("tools", {"code": "1", "tools": [{"name": "t"}]}),
                  ("a session_close message", {"session_close": "nb"})]:
    st, a = cell(A, "nb", req)
    check(f"a cell with {name}: 400", st == 400 and a["error"]["code"] == "invalid_request", a)
r, data = Client(sport, token=None).request("POST", "/v1/sessions/nb/run", {"code": "print(1)"})
check("a cell without a token: 401", r.status == 401, r.status)

# A run's tool results are taken only with the token that started it.
conn = http.client.HTTPConnection("127.0.0.1", sport, timeout=60)
conn.request("POST", "/v1/run", body=json.dumps({"code": "import pysbx\nprint(pysbx.tools.t())",
                                                 "tools": [{"name": "t"}]}),
             headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
resp, tlines, tposts = conn.getresponse(), [], []
while resp.status == 200 and (line := resp.readline()):
    tlines.append(json.loads(line))
    if tlines[-1].get("event") == "tool_call":
        path = f"/v1/runs/{tlines[0]['run_id']}/tool_results"
        for who in (B, A):
            r, data = who.request("POST", path, {"call": tlines[-1]["call"], "content": 7})
            tposts.append(r.status)
conn.close()
check("another token's tool result: 404, the starter's taken", tposts == [404, 200]
      and tlines[-1].get("stdout") == "7\n", (tposts, tlines[-1:]))

# The order of concurrent cells: each runs alone, in the order they arrived.
st, a = cell(A, "order", {"code": "log = []"})
order = {}


def ordered(i):
    conn = Client(sport)
    order[i] = cell(conn, "order", {"code": f"import time\nn = len(log)\ntime.sleep(0.02)\n"
                                           f"log.append({i})\nprint(n)"}, check_doc=False)


threads = [threading.Thread(target=ordered, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
st, a = cell(A, "order", {"code": "print(log)"})
log = json.loads(a["stdout"]) if st == 200 else []
got = sorted((v[1]["session"]["cell"], int(v[1]["stdout"]), i) for i, v in order.items()
             if v[0] == 200)
check("8 concurrent cells of one session: each ran alone, one after another",
      len(got) == 8 and [n for _, n, _ in got] == list(range(8))
      and [c for c, _, _ in got] == list(range(2, 10)) and [i for *_, i in got] == log, (got, log))

# --max-sessions 3 holds across tenants; a closed one makes room. A's two
# sessions are used just before, so that neither is near its idle time.
cell(A, "nb", {"code": "pass"})
cell(A, "order", {"code": "pass"})
st, a = cell(B, "b1", {"code": "pass"})
st, a = cell(B, "b2", {"code": "pass"})
check("--max-sessions: the fourth session is 503 sandbox_busy", st == 503
      and a["error"]["code"] == "sandbox_busy", (st, a))
B.request("DELETE", "/v1/sessions/b1")
st, a = cell(B, "b2", {"code": "print(2)"})
check("--max-sessions: a closed one makes room", st == 200 and a["stdout"] == "2\n", (st, a))

# Idle expiry: unlisted, session_lost once, then a new session.
time.sleep(2.5)
r, data = A.request("GET", "/v1/sessions")
check("idle sessions are not listed", json.loads(data) == {"sessions": []}, data)
st, a = cell(A, "order", {"code": "print(len(log))"})
check("an idle session's next cell: 410 session_lost", st == 410
      and a["error"]["code"] == "session_lost" and "no cell for 2 s" in a["error"]["message"],
      (st, a))
st, a = cell(A, "order", {"code": "print('log' in dir())"})
check("and the one after starts a new session", st == 200 and a["stdout"] == "False\n"
      and a["session"]["cell"] == 1, a)
r, text = A.request("GET", "/metrics", check_doc=False)
check("metrics: session cells and open sessions counted",
      f"pysbx_session_cells_total {len(cells_answered)}\n" in text
      and "pysbx_sessions_open 1\n" in text, [l for l in text.splitlines() if "session" in l])
before = descendants(sp.pid)
sp.send_signal(signal.SIGTERM)
check("sessions: the server exits 0", sp.wait(30) == 0, sp.returncode)
left = [p for p in before if os.path.exists(f"/proc/{p}")]
check("sessions: and leaves none of its processes (the template, the sessions')",
      len(before) >= 2 and not left, (before, left))

# --- hibernation: --state-dir -----------------------------------------------------------
# A session hibernated frees its processes; its next cell restores it
# (restored: true); the listing shows it hibernated; an image changed on
# disk, or another tenant's copied into a tenant's place, is refused (410)
# and the server goes on; a restarted server restores its tenants' sessions
# (by token, wherever the token is in the file).
STATE = os.path.join(tempfile.mkdtemp(), "state")
hp_, hport_ = start("--state-dir", STATE, tokens=(TOKEN, TOKEN_B))
HA, HB = Client(hport_), Client(hport_, token=TOKEN_B)


def no_process_of(uid):
    return os.geteuid() != 0 or not none_of_uids(uid, uid + 1)


def hibernate(client, name, **kw):
    r, data = client.request("POST", f"/v1/sessions/{name}/hibernate", **kw)
    return r.status, json.loads(data) if data else None


for _ in range(100):
    if HA.request("GET", "/healthz", check_doc=False)[0].status == 200:
        break
    time.sleep(0.05)
st, a = cell(HA, "nb", {"code": "x = 41\nopen('f.txt', 'w').write('kept')\nimport os\n"
                                "print(os.getuid())"})
uid = int(a.get("stdout") or -1)
st, h = hibernate(HA, "nb")
check("POST /v1/sessions/NAME/hibernate: 200 session_hibernated, with its image's bytes",
      st == 200 and h["session_hibernated"]["name"] == "nb" and h["session_hibernated"]["bytes"]
      == sum(os.path.getsize(image_path(STATE, f)) for f in images(STATE)), (st, h))
check("a hibernated session keeps no process (none of its uid is left)",
      uid > 0 and no_process_of(uid), (uid, none_of_uids(uid, uid + 1)))
r, data = HA.request("GET", "/v1/sessions")
listed = json.loads(data)["sessions"] if r.status == 200 else []
check("GET /v1/sessions lists it hibernated, with its cells", len(listed) == 1
      and listed[0]["hibernated"] is True and listed[0]["name"] == "nb" and listed[0]["cells"] == 1
      and listed[0]["running"] is False, listed)
r, data = HB.request("GET", "/v1/sessions")
check("another token does not see it", json.loads(data) == {"sessions": []}, data)
st, a = cell(HA, "nb", {"code": "print(x + 1, open('f.txt').read())"})
check("its next cell restores it: variables and files, restored: true", st == 200
      and a["stdout"] == "42 kept\n"
      and a["session"] == {"name": "nb", "cell": 2, "rolled_back": False, "restored": True}, a)
st, a = cell(HA, "nb", {"code": "x += 1"})
check("the cell after has no restored", st == 200 and "restored" not in a["session"], a)
r, data = HA.request("GET", "/v1/sessions")
check("restored, it is listed open", [(i["name"], i["hibernated"]) for i in
                                      json.loads(data)["sessions"]] == [("nb", False)], data)
for name, path, method, body, want in [
    ("no such session", "/v1/sessions/nope/hibernate", "POST", None, 404),
    ("a body that is not {}", "/v1/sessions/nb/hibernate", "POST", {"to": "x"}, 400),
    ("by GET", "/v1/sessions/nb/hibernate", "GET", None, 405),
]:
    r, data = HA.request(method, path, body)
    check(f"hibernate: {name} is {want}", r.status == want, (r.status, data))
# Another tenant's image copied into a tenant's place (a session of the
# same name, so that only the tenant tells them apart): refused.
cell(HA, "twin", {"code": "secret = 'A'"})
before = set(images(STATE))
hibernate(HA, "twin")
mine = sorted(set(images(STATE)) - before)
cell(HB, "twin", {"code": "secret = 'B'"})
before = set(images(STATE))
hibernate(HB, "twin")
theirs = sorted(set(images(STATE)) - before)
if len(mine) == 1 and len(theirs) == 1:
    shutil.copyfile(image_path(STATE, mine[0]), image_path(STATE, theirs[0]))
st, a = cell(HB, "twin", {"code": "print(secret)"})
check("another tenant's image copied into a tenant's place: 410 session_lost, nothing run",
      len(mine) == 1 and len(theirs) == 1 and st == 410 and a["error"]["code"] == "session_lost"
      and "not this tenant's" in a["error"]["message"] and "stdout" not in a, (mine, theirs, st, a))
check("the refused copy is removed, the original stays", images(STATE) == mine, images(STATE))
st, a = cell(HA, "twin", {"code": "print(secret)"})
check("and the tenant whose image it was restores its own", st == 200 and a["stdout"] == "A\n"
      and a["session"].get("restored") is True, a)
hibernate(HA, "twin")
r, data = HA.request("DELETE", "/v1/sessions/twin")
check("DELETE of a hibernated session: 200, its image removed", r.status == 200
      and images(STATE) == [], (r.status, data, images(STATE)))
# One byte changed: refused, and the server goes on.
cell(HA, "fl", {"code": "y = 1"})
hibernate(HA, "fl")
fl = images(STATE)
if fl:
    flip(image_path(STATE, fl[0]))
st, a = cell(HA, "fl", {"code": "print(y)"})
check("a flipped byte in an image: 410 session_lost, it failed its check", len(fl) == 1
      and st == 410 and "failed its check" in a["error"]["message"], (fl, st, a))
st, a = cell(HA, "fl", {"code": "print('y' in globals())"})
check("and the server goes on: the name starts a new session", st == 200
      and a["stdout"] == "False\n" and a["session"]["cell"] == 1, (st, a))
r, text = HA.request("GET", "/metrics", check_doc=False)
check("metrics: hibernated sessions and the state directory's bytes",
      re.search(r"^pysbx_sessions_hibernated 0$", text, re.M)
      and re.search(r"^pysbx_state_bytes 0$", text, re.M), [l for l in text.splitlines()
                                                             if "hibernated" in l or "state" in l])
# A restart: SIGTERM hibernates the open sessions; the next server, its
# tokens in another order, restores each tenant's own.
hp_.send_signal(signal.SIGTERM)
check("--state-dir over HTTP: SIGTERM exits 0", hp_.wait(30) == 0, hp_.returncode)
hp_, hport_ = start("--state-dir", STATE, tokens=(TOKEN_B, TOKEN))
HA, HB = Client(hport_), Client(hport_, token=TOKEN_B)
st, a = cell(HA, "nb", {"code": "print(x, open('f.txt').read())", "cell": 4})
check("a restarted server (tokens in another order) restores the tenant's session, numbered on",
      st == 200 and a["stdout"] == "42 kept\n"
      and a["session"] == {"name": "nb", "cell": 4, "rolled_back": False, "restored": True}, a)
r, data = HB.request("GET", "/v1/sessions")
check("and the other tenant still sees none of it", all(i["name"] != "nb" for i in
                                                         json.loads(data)["sessions"]), data)
hp_.send_signal(signal.SIGTERM)
check("--state-dir: the restarted server exits 0", hp_.wait(30) == 0, hp_.returncode)
# --hibernate-after and --state-max-bytes.
hp_, hport_ = start("--state-dir", os.path.join(STATE, "..", "other"), "--hibernate-after", "1",
                    "--session-idle", "60", "--state-max-bytes", "20M")
HA = Client(hport_)
STATE2 = os.path.join(STATE, "..", "other")
st, a = cell(HA, "idle", {"code": "import os\nw = 'idle'\nprint(os.getuid())"})
uid = int(a.get("stdout") or -1)


def listed_hibernated():
    r, data = HA.request("GET", "/v1/sessions", check_doc=False)
    return [i["name"] for i in json.loads(data)["sessions"] if i["hibernated"]] == ["idle"]


check("--hibernate-after 1: an idle session hibernates by itself, its processes gone",
      wait_for(lambda: listed_hibernated() and no_process_of(uid), 30), uid)
st, a = cell(HA, "idle", {"code": "print(w)"})
check("and its next cell restores it", st == 200 and a["stdout"] == "idle\n"
      and a["session"].get("restored") is True, a)
HA.request("DELETE", "/v1/sessions/idle")
sizes = {}
for i, name in enumerate(["c1", "c2", "c3"]):
    cell(HA, name, {"code": f"v = {i}"})
    st, h = hibernate(HA, name)
    sizes[name] = (h or {}).get("session_hibernated", {}).get("bytes", 0)
on_disk = sum(os.path.getsize(image_path(STATE2, f)) for f in images(STATE2))
check("--state-max-bytes 20M: within it, the oldest image dropped to make room",
      sizes["c1"] + sizes["c2"] <= 20 << 20 < sum(sizes.values()) and on_disk <= 20 << 20
      and len(images(STATE2)) == 2, (sizes, on_disk))
st, a = cell(HA, "c1", {"code": "print(v)"})
check("its next cell: 410 session_lost, saying why", st == 410
      and "--state-max-bytes" in a["error"]["message"], (st, a))
st, a = cell(HA, "c3", {"code": "print(v)"})
check("a newer one restores", st == 200 and a["stdout"] == "2\n", (st, a))
hp_.send_signal(signal.SIGTERM)
check("--hibernate-after over HTTP: SIGTERM exits 0", hp_.wait(30) == 0, hp_.returncode)
shutil.rmtree(os.path.dirname(STATE), True)

# --- start-up refusals --------------------------------------------------------------------
for name, args, want in [
    ("a non-loopback address without a token", ("--http", "0.0.0.0:0"), "not a loopback"),
    ("no port", ("--http", "127.0.0.1"), "ADDR:PORT"),
    ("--http with --listen", ("--http", "127.0.0.1:0", "--listen", "/tmp/x.sock"), "choose one"),
]:
    p = subprocess.run([PYSBX, "serve", *args], capture_output=True, text=True, timeout=60)
    check(f"refused at start: {name}", p.returncode == 2 and want in p.stderr,
          (p.returncode, p.stderr))
# A host name is resolved: localhost, only where /etc/hosts names it (else
# the lookup would leave the machine).
hosts = open("/etc/hosts").read() if os.path.exists("/etc/hosts") else ""
if re.search(r"^\s*(127\.\d+\.\d+\.\d+|::1)\s.*\blocalhost\b", hosts, re.M):
    p = subprocess.Popen([PYSBX, "serve", "--http", "localhost:0"], stderr=subprocess.PIPE,
                         text=True)
    started.append(p)
    line = p.stderr.readline()
    m = re.search(r"listening on http://(127\.0\.0\.1|\[::1\]):(\d+)", line)
    check("--http localhost:0 listens on a loopback address", m is not None, line)
    if m:
        host = m.group(1).strip("[]")
        conn = http.client.HTTPConnection(host, int(m.group(2)), timeout=60)
        conn.request("POST", "/v1/run", body=json.dumps({"code": "print(6 * 7)"}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        a = json.loads(r.read())
        check("and answers there", r.status == 200 and a["stdout"] == "42\n", (r.status, a))
    p.send_signal(signal.SIGTERM)
    check("and exits 0", p.wait(30) == 0, p.returncode)
else:
    print("skip --http localhost:0: /etc/hosts does not name localhost")
# --- answers nobody reads: held within the client's and the server's bounds -------------
# A tenant POSTs runs whose answers are megabytes and never reads them. Each
# answer is held for its client only within the tenant's allowance
# (--max-pending-bytes; one alone may pass it) and the server's
# (--max-held-bytes); past them the connection is cut and the answer is not
# kept, so the server's memory does not grow with unread answers, and another
# tenant is answered meanwhile.
def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])


def metric(client, name):
    r, text = client.request("GET", "/metrics", check_doc=False)
    m = re.search(r"^%s (\d+)" % re.escape(name), text, re.M)
    return int(m.group(1)) if m else -1


def wait_metric(client, name, ok, seconds=60):
    end = time.monotonic() + seconds
    while True:
        v = metric(client, name)
        if ok(v) or time.monotonic() > end:
            return v
        time.sleep(0.1)


# Measured with AddressSanitizer's quarantine off where it is on (freed
# memory it holds back would count as the server's).
hp, hport = start("--max-pending-bytes", "4M", "--max-held-bytes", "6M", "--max-output",
                  "2097152", "--jobs", "2", tokens=(TOKEN, TOKEN_B),
                  env={**os.environ,
                       "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0"})
ha, hb = Client(hport), Client(hport, token=TOKEN_B)
ha.run({"code": "print(1)"})
rss0 = vm_rss_kb(hp.pid)
BIG = {"code": "import sys\nsys.stdout.write('a' * 2097152); sys.stderr.write('b' * 2097152)",
       "limits": {"max_output_chars": 2097152}}
body = json.dumps(BIG).encode()
unread = []
for i in range(8):
    s = socket.create_connection(("127.0.0.1", hport))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body)
    unread.append(s)
wait_metric(ha, 'pysbx_runs_total{status="completed"}', lambda v: v == 9)
time.sleep(0.5)
held = metric(ha, "pysbx_answer_bytes_held")
grown = vm_rss_kb(hp.pid) - rss0
check("unread answers: held within the tenant's allowance, the rest cut",
      4 << 20 <= held <= 6 << 20 and metric(ha, "pysbx_answers_not_held_total") >= 6,
      (held, metric(ha, "pysbx_answers_not_held_total")))
check("unread answers: the server grew by what it holds, not by what it was asked",
      grown < (6 << 10) + (16 << 10), f"{grown} KiB more for 8 unread answers of 4 MiB")
st, b = hb.run({"code": "print('b' * 999999)", "limits": {"max_output_chars": 1000000}})
check("unread answers: another tenant's answer of 1 MB is given meanwhile",
      st == 200 and len(b.get("stdout", "")) == 1000000, st)
cut = 0
for s in unread:
    s.settimeout(0.5)
    try:
        cut += s.recv(64) == b""
    except (socket.timeout, ConnectionError):
        pass
check("unread answers: the connections whose answer was not kept are closed", cut >= 6, cut)
for s in unread:
    s.close()
check("unread answers: nothing held once their clients are gone",
      wait_metric(ha, "pysbx_answer_bytes_held", lambda v: v == 0, 30) == 0)
hp.send_signal(signal.SIGTERM)
check("unread answers: the server exits 0", hp.wait(30) == 0, hp.returncode)

# --- --metrics-http: a scraper's address, /metrics alone and no token ------------------
# What a Prometheus configured by the manifest's annotations does: GET /metrics
# on the metrics port, no Authorization. Parsed with Prometheus' own Python
# text parser (Debian's python3-prometheus-client).
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

mp, mport = start("--metrics-http", "127.0.0.1:0", wait=False)[0], None
line = mp.stderr.readline()
m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
line2 = mp.stderr.readline()
m2 = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line2)
check("--metrics-http: the server says where", m is not None and m2 is not None, (line, line2))
if m and m2:
    threading.Thread(target=lambda: mp.stderr.read(), daemon=True).start()
    main, mport = int(m.group(1)), int(m2.group(1))
    r, _ = Client(main).run({"code": "print(1)"})
    scrape = Client(mport, token=None)
    r, text = scrape.request("GET", "/metrics", check_doc=False)
    families = {f.name: f for f in text_string_to_metric_families(text)} if r.status == 200 else {}
    runs = {s.labels.get("status"): s.value for s in families["pysbx_runs"].samples
            if s.name == "pysbx_runs_total"} if "pysbx_runs" in families else {}
    check("--metrics-http: scraped without a token, parsed by Prometheus' parser",
          r.status == 200 and runs.get("completed") == 1.0, (r.status, runs, text[:200]))
    check("--metrics-http: every family the main /metrics has",
          {"pysbx_run_duration_seconds", "pysbx_ready", "pysbx_template_up"} <= set(families),
          sorted(families))
    for method, path, want in [("POST", "/v1/run", 404), ("GET", "/healthz", 404),
                               ("POST", "/metrics", 405)]:
        r, text = scrape.request(method, path, body=json.dumps({"code": "print(1)"})
                                 if method == "POST" else None, check_doc=False)
        check(f"--metrics-http: {method} {path} is {want}, nothing runs", r.status == want
              and "stdout" not in text, (r.status, text[:200]))
    r, _ = Client(main, token=None).request("GET", "/metrics", check_doc=False)
    check("--metrics-http: the main address still wants the token for /metrics",
          r.status == 401, r.status)
    mp.send_signal(signal.SIGTERM)
    check("--metrics-http: the server exits 0", mp.wait(30) == 0, mp.returncode)
p = subprocess.run([PYSBX, "serve", "--metrics-http", "127.0.0.1:0"], capture_output=True,
                   text=True, timeout=60)
check("--metrics-http without --http is refused", p.returncode == 2
      and "--metrics-http goes with --http" in p.stderr, (p.returncode, p.stderr))

with tempfile.NamedTemporaryFile("w") as empty:
    p = subprocess.run([PYSBX, "serve", "--http", "127.0.0.1:0", "--http-token-file", empty.name],
                       capture_output=True, text=True, timeout=60)
    check("refused at start: an empty token file", p.returncode == 2 and "empty" in p.stderr,
          (p.returncode, p.stderr))
with tempfile.NamedTemporaryFile("w") as twice:
    twice.write("same\nother\nsame\n")
    twice.flush()
    p = subprocess.run([PYSBX, "serve", "--http", "127.0.0.1:0", "--http-token-file", twice.name],
                       capture_output=True, text=True, timeout=60)
    check("refused at start: a token twice", p.returncode == 2 and "line 3" in p.stderr
          and "twice" in p.stderr, (p.returncode, p.stderr))

sys.exit(1 if failures else 0)
