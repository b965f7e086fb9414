"""pysbx mcp spoken to line by line, for what an SDK client hides: the bytes
of images and of output, binary input files, cancellation (a cancelled
request gets no answer), and the cells of a session sent without waiting. Run by test_mcp.sh with Debian's python3.
usage: mcp_raw.py PATH/TO/pysbx"""
import base64, glob, hashlib, json, os, subprocess, sys, tempfile, time

PYSBX = sys.argv[1]
failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail!r}"))
    failures += not ok


def session(messages):
    """Sends |messages| (then the end of input) to a fresh server; returns its
    answers by id, and the ids answered more than once."""
    init = [{"jsonrpc": "2.0", "id": "init", "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    text = "".join(json.dumps(m) + "\n" for m in init + messages)
    p = subprocess.run([PYSBX, "mcp", "--wall", "20", "--cpu", "5", "--jobs", "3"], input=text,
                       capture_output=True, text=True, timeout=120)
    answers, seen_twice = {}, []
    for line in p.stdout.splitlines():
        m = json.loads(line)
        if m.get("id") in answers:
            seen_twice.append(m.get("id"))
        answers[m.get("id")] = m
    return answers, seen_twice


def call(id, code, files=None, **more):
    args = {"code": code, **more}
    if files is not None:
        args["files"] = files
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_python", "arguments": args}}


def tool(id, name, args):
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": args}}


def texts(answer):
    return "\n".join(c["text"] for c in answer["result"]["content"] if c["type"] == "text")


png = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00"
       b"\x00\x00\x00IEND\xaeB`\x82")
blob = bytes(range(256)) * 4
make_files = (
    "import base64\n"
    f"open('pic.JPG', 'wb').write(base64.b64decode('{base64.b64encode(png).decode()}'))\n"
    "open('fake.jpg', 'wb').write(bytes(range(256)))\n"
    "open('note.png', 'w').write('not an image')\n"
)
answers, twice = session([
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    call(2, "import sys\nsys.stdout.write('before\\0after\\n')\nsys.stderr.write('e\\0f')"),
    call(3, make_files),
    call(4, "import hashlib\nprint(hashlib.sha256(open('b.bin', 'rb').read()).hexdigest())\n"
            "print(open('t.txt').read(), open('u.txt').read())",
         {"b.bin": {"content": base64.b64encode(blob).decode(), "encoding": "base64"},
          "t.txt": {"content": "plain", "encoding": "utf-8"}, "u.txt": "text"}),
    call(5, "pass", {"x": {"content": "00", "encoding": "hex"}}),
    call(6, "pass", {"x": {"content": "@@", "encoding": "base64"}}),
    call(7, "import time\nprint('up', flush=True)\ntime.sleep(15)"),
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}},
    {"jsonrpc": "2.0", "id": 8, "method": "ping"},
    # Cells of one session sent at once run in the order they were called.
    call(10, "n = 1", session_id="o"),
    call(11, "import time\ntime.sleep(0.3)\nn += 1", session_id="o"),
    call(12, "n *= 10\nprint(n)", session_id="o"),
    # A branch of it, its own from then on; the origin as it was.
    call(19, "n += 1\nprint(n)", session_id="o2", fork_from="o"),
    call(20, "print(n)", session_id="o"),
    call(21, "pass", fork_from="o"),
    call(13, "pass", session_id="x" * 129),
    call(14, "pass", rollback="never"),
    tool(15, "reset_session", {}),
    tool(16, "reset_session", {"session_id": "o"}),
    call(17, "open('ran', 'w')\nprint('ran')", sesion_id="misspelt"),
    tool(18, "reset_session", {"session_id": "o", "all": True}),
])
check("every request answered once", not twice, twice)

schema = answers[1]["result"]["tools"][0]["inputSchema"]
file_schema = schema["properties"]["files"]["additionalProperties"]["anyOf"]
check("the input schema documents base64 files",
      {"type": "string"} in file_schema and
      any(s.get("properties", {}).get("encoding", {}).get("enum") == ["utf-8", "base64"]
          for s in file_schema), file_schema)

t = texts(answers[2])
check("text after a NUL byte reaches the model, the NUL shown",
      "stdout:\nbefore\\x00after\n" in t and "stderr:\ne\\x00f" in t, t)

content = answers[3]["result"]["content"]
images = [c for c in content if c["type"] == "image"]
resources = {c["resource"]["uri"].rsplit("/", 1)[1]: c["resource"] for c in content
             if c["type"] == "resource"}
check("an image is typed by its bytes: pic.JPG holding a PNG is image/png",
      len(images) == 1 and images[0]["mimeType"] == "image/png" and
      base64.b64decode(images[0]["data"]) == png, images)
check("fake.jpg holding other bytes is no image",
      resources.get("fake.jpg", {}).get("mimeType") == "application/octet-stream" and
      base64.b64decode(resources["fake.jpg"]["blob"]) == bytes(range(256)), resources.get("fake.jpg"))
check("note.png holding text is text",
      resources.get("note.png", {}).get("text") == "not an image" and
      resources["note.png"]["mimeType"] == "text/plain", resources.get("note.png"))

t = texts(answers[4])
check("binary input files arrive byte for byte, text files as text",
      hashlib.sha256(blob).hexdigest() in t and "plain text" in t, t)
check("an unknown encoding is refused", answers[5].get("error", {}).get("code") == -32602, answers[5])
r6 = answers[6].get("result", {})
check("bad base64 is an error result", r6.get("isError") is True and "base64" in texts(answers[6]),
      answers[6])
check("a cancelled call gets no answer", 7 not in answers, answers.get(7))
check("the server goes on after a cancel", answers.get(8, {}).get("result") == {}, answers.get(8))
check("cells of a session sent at once run in order",
      "stdout:\n20\n" in texts(answers[12]) and "session: o, cell 3, kept" in texts(answers[12]),
      answers.get(12))
check("fork_from: the code runs in a copy of the session, numbered on",
      "stdout:\n21\n" in texts(answers[19]) and "session: o2, cell 4, kept" in texts(answers[19]),
      answers.get(19))
check("fork_from: the origin is as it was", "stdout:\n20\n" in texts(answers[20]), answers.get(20))
check("fork_from without session_id is invalid params",
      answers.get(21, {}).get("error", {}).get("code") == -32602, answers.get(21))
check("a session_id over 128 bytes is invalid params",
      answers.get(13, {}).get("error", {}).get("code") == -32602, answers.get(13))
check("rollback without session_id is invalid params",
      answers.get(14, {}).get("error", {}).get("code") == -32602, answers.get(14))
check("reset_session without session_id is invalid params",
      answers.get(15, {}).get("error", {}).get("code") == -32602, answers.get(15))
check("reset_session finds a session whose cells were just called",
      answers.get(16, {}).get("result", {}).get("isError") is False, answers.get(16))
check("an argument run_python does not know is invalid params, and nothing runs",
      answers.get(17, {}).get("error", {}).get("code") == -32602
      and "sesion_id" in answers[17]["error"].get("message", "")
      and "result" not in answers[17], answers.get(17))
check("so is one reset_session does not know",
      answers.get(18, {}).get("error", {}).get("code") == -32602, answers.get(18))
check("both schemas say so", all(t["inputSchema"].get("additionalProperties") is False
                                 for t in answers[1]["result"]["tools"]), answers[1])

# Progress: a call with a progressToken gets its output as notifications
# before its answer; one without gets none; a cancelled one gets neither.
init = [{"jsonrpc": "2.0", "id": "init", "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}]
with_token = call(21, "import time\nfor i in range(3):\n    print(i, 'é' * 3, flush=True)\n"
                      "    time.sleep(0.3)")
with_token["params"]["_meta"] = {"progressToken": "p21"}
cut = call(23, "import time\nprint('up', flush=True)\ntime.sleep(15)")
cut["params"]["_meta"] = {"progressToken": "p23"}
p = subprocess.Popen([PYSBX, "mcp", "--wall", "20", "--max-output", "7"], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, text=True)
p.stdin.write("".join(json.dumps(m) + "\n" for m in
                      init + [with_token, call(22, "print('quiet')"), cut]))
p.stdin.flush()
lines = []
while True:
    m = json.loads(p.stdout.readline())
    lines.append(m)
    if m.get("id") == 21:
        break
p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": 23}}) + "\n")
p.stdin.close()
lines += [json.loads(l) for l in p.stdout]
p.wait(timeout=60)
prog = [m["params"] for m in lines if m.get("method") == "notifications/progress"]
mine = [x for x in prog if x["progressToken"] == "p21"]
answer = next(m for m in lines if m.get("id") == 21)
check("progress: the output before the answer, in order, cut where the answer is cut",
      "".join(x["message"] for x in mine).startswith("0 ééé\n1")
      and "output cut" in "".join(x["message"] for x in mine)
      and [x["progress"] for x in mine] == list(range(1, len(mine) + 1))
      and lines.index(answer) > max(i for i, m in enumerate(lines) if m.get("method")), lines)
check("progress: none for a call without a token", len(prog) == len(mine) + sum(
    x["progressToken"] == "p23" for x in prog), prog)
check("progress: a cancelled call gets no answer", not any(m.get("id") == 23 for m in lines), lines)

# --state-dir: the sessions outlive the process, through their images.
def mcp_with_state(state_dir, messages):
    text = "".join(json.dumps(m) + "\n" for m in init + messages)
    p = subprocess.run([PYSBX, "mcp", "--state-dir", state_dir], input=text,
                       capture_output=True, text=True, timeout=120)
    return {m.get("id"): m for m in map(json.loads, p.stdout.splitlines())}, p


with tempfile.TemporaryDirectory() as d:
    sd = os.path.join(d, "state")
    a, p = mcp_with_state(sd, [call(30, "x = 41\nopen('f.txt', 'w').write('kept')",
                                    session_id="s")])
    images = glob.glob(os.path.join(sd, "images", "*.img"))
    check("--state-dir: the open session is written at the end of input",
          "session: s, cell 1, kept" in texts(a[30]) and len(images) == 1
          and "1 session hibernated" in p.stderr, (a.get(30), images, p.stderr))
    a, p = mcp_with_state(sd, [call(31, "print(x + 1, open('f.txt').read())", session_id="s")])
    check("--state-dir: a later pysbx mcp restores it at its next call",
          "stdout:\n42 kept\n" in texts(a[31]) and "session: s, cell 2, kept" in texts(a[31]),
          a.get(31))
    # One process holds the directory: another is refused before it serves.
    holder = subprocess.Popen([PYSBX, "mcp", "--state-dir", sd], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    holder.stdin.write(json.dumps(init[0]) + "\n")
    holder.stdin.flush()
    up = json.loads(holder.stdout.readline())
    second = subprocess.run([PYSBX, "mcp", "--state-dir", sd], input="", capture_output=True,
                            text=True, timeout=60)
    holder.stdin.close()
    holder.wait(timeout=60)
    check("--state-dir: a second pysbx mcp on the directory is refused",
          up.get("id") == "init" and second.returncode != 0 and "--state-dir" in second.stderr,
          (second.returncode, second.stderr))
    s_image = glob.glob(os.path.join(sd, "images", "*.img"))[0]
    # --hibernate-after: an idle session hibernates while the server goes on,
    # and its next call restores it.
    live = subprocess.Popen([PYSBX, "mcp", "--state-dir", sd, "--hibernate-after", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    live.stdin.write("".join(json.dumps(m) + "\n" for m in
                             init + [call(35, "y = 7", session_id="idle")]))
    live.stdin.flush()
    while json.loads(live.stdout.readline()).get("id") != 35:
        pass
    waited = 0.0
    while len(glob.glob(os.path.join(sd, "images", "*.img"))) < 2 and waited < 10:
        time.sleep(0.2)
        waited += 0.2
    held = len(glob.glob(os.path.join(sd, "images", "*.img")))
    live.stdin.write(json.dumps(call(36, "print(y * 6)", session_id="idle")) + "\n")
    live.stdin.close()
    after = {m.get("id"): m for m in map(json.loads, live.stdout)}
    live.wait(timeout=60)
    check("--hibernate-after: an idle session hibernates, its next call restores it",
          held == 2 and "stdout:\n42\n" in texts(after[36])
          and "session: idle, cell 2, kept" in texts(after[36]), (held, after.get(36)))
    # A session that keeps a file open cannot hibernate: it ends with the
    # process, and its next call is told so rather than run in a new one.
    a, p = mcp_with_state(sd, [call(37, "f = open('log.txt', 'w')\nn = 5", session_id="k")])
    b, p2 = mcp_with_state(sd, [call(38, "print(n)", session_id="k")])
    c, p3 = mcp_with_state(sd, [call(39, "print('n' in globals())", session_id="k")])
    check("--state-dir: a session that could not hibernate is lost, said at its next call",
          "could not hibernate" in p.stderr and b.get(38, {}).get("result", {}).get("isError")
          and "session_lost" in texts(b[38]) and "could not hibernate" in texts(b[38])
          and "stdout:\nFalse\n" in texts(c[39]) and "session: k, cell 1, kept" in texts(c[39]),
          (p.stderr, b.get(38), c.get(39)))
    # An image changed on disk is not restored: the call says the session
    # is lost (and so does one called behind it), and a later one starts
    # afresh.
    with open(s_image, "r+b") as f:
        f.seek(os.path.getsize(s_image) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    a, p = mcp_with_state(sd, [call(32, "print(x)", session_id="s"),
                               call(33, "print(x)", session_id="s")])
    b, p = mcp_with_state(sd, [call(34, "print('x' in globals())", session_id="s")])
    check("--state-dir: a changed image is refused, the session lost",
          all(a.get(i, {}).get("result", {}).get("isError") is True
              and "session_lost" in texts(a[i]) for i in (32, 33))
          and "refused" in texts(a[32]) and "stdout:\nFalse\n" in texts(b[34])
          and "session: s, cell 1, kept" in texts(b[34]), (a, b.get(34)))

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
