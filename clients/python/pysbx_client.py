"""A client of the pysbx server: one file, the standard library only.

    from pysbx_client import Client, SandboxError

    sbx = Client("/run/pysbx.sock")             # pysbx serve --listen /run/pysbx.sock
    # sbx = Client("http://10.0.0.5:8080", token="...")   # pysbx serve --http ADDR:PORT
    r = sbx.run("print(open('a.txt').read())", files={"a.txt": "hi"},
                limits={"wall_seconds": 5})
    print(r.status, r.exit_code, r.stdout)      # completed 0 hi
    for a in r.artifacts:
        a.name, a.content                       # bytes, decoded

run() returns a Result for every run the sandbox carried out, whatever the
code did (an exception, a timeout: see status). A request the server refused
(a bad limit, a bad file name, the sandbox busy) raises SandboxError, whose
code is the server's stable error code (invalid_request, invalid_limit,
invalid_file, request_too_large, sandbox_unavailable, sandbox_busy, ...).
A server that cannot be reached or answers nonsense raises ConnectionError
(OSError) or ProtocolError.

Over a UNIX socket each run() is one connection (so runs from many threads
at once are independent); closing it, as a timeout does, cancels the run.
Over HTTP each run() is one POST /v1/run with the same JSON body.

on_output=fn(stream, text) (run() and a session's run()) asks for the output
as it is written: fn is called with "stdout" or "stderr" and each piece, in
the order written, before run() returns the whole result.

A session keeps state (variables, imports, files) from one cell to the next;
a cell that raises is rolled back (rollback="on_error", the server's
default; "on_stop" and "never" keep more):

    with sbx.session("nb") as s:                # one connection, held open
        s.run("import csv\nrows = list(csv.reader(open('a.csv')))",
              files={"a.csv": "x\n1\n"})
        r = s.run("print(len(rows))")           # r.session: {"name": "nb", "cell": 2, ...}
        s.reset()                               # the next cell starts afresh

Over a UNIX socket a session belongs to its connection: closing it
(close(), the end of the with block, a timeout) closes it. Over HTTP it is
the token's session of that name (POST /v1/sessions/NAME/run), which
close() closes (DELETE); each cell says the number it expects to be, so
that a replica that does not hold the session at that number (behind a
load balancer, after another was lost) answers session_lost instead of
running the cell in another state. A lost session (the server's idle time
ran out, say) raises SandboxError("session_lost"); the next run() starts a
new one.

For asyncio hosts, PysbxSandbox has the shape of the usual sandbox kits:

    sandbox = PysbxSandbox("/run/pysbx.sock")   # or "http://127.0.0.1:8080", token=...
    result = await sandbox.run(code, limits=SandboxLimits(wall_seconds=10.0, cpu_seconds=5,
                               memory_bytes=256 * 1024 * 1024), files={"in.csv": "1,2"})
    result.stdout, result.exit_code, result.value, result.error
    for a in result.artifacts:                  # a tuple of SandboxArtifact
        a.name, a.content, a.truncated

A run the sandbox stopped at a limit raises SandboxTimeoutError (limit
"wall" or "cpu") or SandboxMemoryError, each carrying the partial result;
a run the code ended (an exception, a non-zero exit, a signal) is a result.
Cancelling the awaiting task closes the connection, which cancels the run.
sandbox.session(name) keeps state between cells (either transport), and
sandbox.run_python_tool(limits) gives a model a run_python tool whose
limits, when a run reaches them, come back as a sandbox_limit_exceeded
error result instead of an exception.
"""
import asyncio
import base64
import http.client
import itertools
import json
import os
import re
import reprlib
import socket
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

__all__ = ["Client", "Session", "Result", "Artifact", "SandboxError", "ProtocolError",
           "PysbxSandbox", "AsyncSession", "SandboxLimits", "SandboxResult", "SandboxArtifact",
           "SandboxTimeoutError", "SandboxMemoryError", "RunPythonTool"]

# The most bytes an answer may have before the client gives up on it.
MAX_ANSWER_BYTES = 1 << 30

# What a server sent, shown in a message: a few levels and characters of it
# (repr() of whatever nests deep would raise RecursionError).
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother = 3, 80, 80


def _shown(value: Any) -> str:
    return _SHOW.repr(value)[:200]


class SandboxError(Exception):
    """The server refused the request; |code| is its stable error code."""

    def __init__(self, code: str, message: str, http_status: Optional[int] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.http_status = http_status


class ProtocolError(Exception):
    """The server's answer was not an answer."""


@dataclass
class Artifact:
    name: str  # escaped when not valid UTF-8 (see raw_name)
    size: int  # the file's real size
    truncated: bool  # content cut at the request's max_artifact_bytes
    content: bytes
    raw_name: bytes = b""  # the name's bytes on disk

    @property
    def path(self) -> str:
        """The name as os.fsdecode() gives it: bytes that are not UTF-8 as
        surrogates, so that open(artifact.path, "wb") makes the true name."""
        return os.fsdecode(self.raw_name or self.name.encode())


@dataclass
class DroppedArtifact:
    """A file (a directory when the name ends with "/") the run left and the
    answer does not return: reason is max_artifacts,
    max_artifacts_total_bytes, too_deep, unreadable or linked."""
    name: str
    reason: str
    size: Optional[int] = None  # a file's size; None for a directory
    raw_name: bytes = b""


@dataclass
class CodeError:
    """The uncaught exception a run ended by, as the sandboxed interpreter
    reported it: its type ("KeyError", "json.decoder.JSONDecodeError"),
    str() of it, and the traceback as Python prints it."""
    type: str
    message: str
    traceback: str


@dataclass
class Result:
    status: str  # completed, timeout, memory_limit, crashed, cancelled, sandbox_error
    exit_code: Optional[int]
    stdout: str
    stderr: str
    limit: Optional[str] = None  # wall, cpu or memory for timeout and memory_limit
    signal: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    partial: bool = False
    artifacts: List[Artifact] = field(default_factory=list)
    artifacts_dropped: int = 0  # all files not returned, listed or not
    dropped_artifacts: List[DroppedArtifact] = field(default_factory=list)  # the first, with why
    stats: Dict[str, Any] = field(default_factory=dict)
    reason: Optional[str] = None
    # As in a notebook cell: repr() of the program's last statement when it
    # is an expression; else None (and for runs the sandbox stopped).
    value: Optional[str] = None
    # A session's cell: {"name": ..., "cell": N, "rolled_back": bool}; else None.
    session: Optional[Dict[str, Any]] = None
    # When the code ended by an uncaught exception (exit_code 1): what the
    # sandboxed interpreter reported of it; else None.
    error: Optional["CodeError"] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)  # the answer as sent

    @property
    def ok(self) -> bool:
        """The code ran to its end and exited 0."""
        return self.status == "completed" and self.exit_code == 0


def _code_error(err: Any) -> Optional[CodeError]:
    if err is None:
        return None
    if not isinstance(err, dict) or not all(isinstance(err.get(k), str)
                                            for k in ("type", "message", "traceback")):
        raise ProtocolError(f"a malformed error of the code: {_shown(err)}")
    return CodeError(err["type"], err["message"], err["traceback"])


def _raw_name(a: Dict[str, Any]) -> bytes:
    """A file's name on disk: name_base64 when the server escaped its name."""
    if "name_base64" in a:
        return base64.b64decode(a["name_base64"], validate=True)
    return a["name"].encode()


def _result(answer: Dict[str, Any]) -> Result:
    if not isinstance(answer, dict):
        raise ProtocolError(f"an answer is a JSON object, not {type(answer).__name__}")
    err = answer.get("error")
    # A refusal has an error and no status; a result's error is its code's.
    if err is not None and "status" not in answer:
        raise _refusal(err)
    for key, kinds in _FIELDS.items():
        if answer.get(key) is not None and not isinstance(answer[key], kinds):
            raise ProtocolError(f"a result whose {key} is {_shown(answer[key])}")
    try:
        arts = [Artifact(a["name"], a["size"], a["truncated"],
                         base64.b64decode(a["content_base64"], validate=True), _raw_name(a))
                for a in answer.get("artifacts") or []]
        gone = [DroppedArtifact(d["name"], d["reason"], d.get("size"), _raw_name(d))
                for d in answer.get("dropped_artifacts") or []]
        return Result(status=answer["status"], exit_code=answer.get("exit_code"),
                      stdout=answer.get("stdout", ""), stderr=answer.get("stderr", ""),
                      limit=answer.get("limit"), signal=answer.get("signal"),
                      stdout_truncated=answer.get("stdout_truncated", False),
                      stderr_truncated=answer.get("stderr_truncated", False),
                      partial=answer.get("partial", False), artifacts=arts,
                      artifacts_dropped=answer.get("artifacts_dropped", 0),
                      dropped_artifacts=gone,
                      stats=answer.get("stats") or {}, reason=answer.get("reason"),
                      value=answer.get("value"), session=answer.get("session"),
                      error=_code_error(answer.get("error")), raw=answer)
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a malformed result ({_shown(e)}): {_shown(answer)}") from None


# A result's fields, as the server sends them (each may be missing or null).
_FIELDS = {"status": str, "exit_code": int, "stdout": str, "stderr": str, "limit": str,
           "signal": str, "reason": str, "value": str, "session": dict, "stats": dict,
           "artifacts": list, "dropped_artifacts": list, "artifacts_dropped": int}


def _refusal(err: Any, http_status: Optional[int] = None) -> SandboxError:
    """The SandboxError of the error object |err| of a refused request."""
    if not isinstance(err, dict) or not all(isinstance(err.get(k), str)
                                            for k in ("code", "message")):
        raise ProtocolError(f"a malformed error: {_shown(err)}")
    return SandboxError(err["code"], err["message"], http_status)


# The events of a streamed answer that carry output.
_OUTPUT_EVENTS = ("stdout", "stderr")


class _Live:
    """A run's events and who takes them: output to on_output(stream,
    text), tool calls to the functions of |tools| (name -> fn(**arguments),
    which returns what JSON encodes, or raises to fail the call)."""

    def __init__(self, on_output=None, tools: Optional[Mapping[str, Any]] = None,
                 max_tool_calls: Optional[int] = None):
        if tools is not None and not all(callable(f) for f in tools.values()):
            raise TypeError("tools maps each name to a function")
        self.on_output, self.tools, self.run_id = on_output, tools, None
        self.max_tool_calls = max_tool_calls

    def ask(self, req: Dict[str, Any]) -> None:
        """Puts what it takes into the request."""
        if self.on_output is not None:
            req["stream"] = True
        if self.tools is not None:
            req["tools"] = [{"name": n, "description": (f.__doc__ or "").strip()}
                            for n, f in self.tools.items()]
            if self.max_tool_calls is not None:
                req["max_tool_calls"] = self.max_tool_calls

    def take(self, line: bytes) -> Tuple[Any, Optional[Tuple[str, Any]]]:
        """A line of the answer: (m, None) when it is the answer |m|; else
        what to do with the event: ("output", (stream, text)), ("call",
        (fn, event)), or ("", None)."""
        if not line.endswith(b"\n"):
            raise ProtocolError("the server closed the connection without an answer"
                                if not line else "an answer past MAX_ANSWER_BYTES")
        m = _loads(line)
        if not isinstance(m, dict) or "event" not in m:
            return m, None
        return m, self._event(m)

    def _event(self, m: Dict[str, Any]) -> Tuple[str, Any]:
        ev = m["event"]
        if ev in _OUTPUT_EVENTS and self.on_output is not None and isinstance(m.get("data"), str):
            return "output", (ev, m["data"])
        if ev == "started" and isinstance(m.get("run_id"), str):
            self.run_id = m["run_id"]
        if ev == "tool_call" and self.tools is not None:
            call, name, args = m.get("call"), m.get("name"), m.get("arguments", {})
            # Answered by number: a call that cannot be is no call.
            if (not isinstance(call, int) or isinstance(call, bool) or call < 1
                    or not isinstance(name, str) or not isinstance(args, dict)):
                raise ProtocolError(f"a malformed tool call: {_shown(m)}")
            return "call", (self.tools.get(name), m)
        return "", None  # "dropped": that output is in the answer all the same


def _tool_body(m: Dict[str, Any], result: Any, error: Optional[str]) -> Dict[str, Any]:
    """The tool_result for call event |m|."""
    if error is None:
        try:
            json.dumps(result)
            return {"call": m["call"], "content": result}
        except (TypeError, ValueError, RecursionError) as e:
            error = f"the tool's result is not JSON: {e}"
    return {"call": m["call"], "error": error}


def _call_tool(fn, m: Dict[str, Any]) -> Tuple[Any, Optional[str]]:
    """Calls the host's function for call event |m|: (its value, None), or
    (None, what it raised)."""
    try:
        if fn is None:
            raise LookupError(f"no tool {m.get('name')!r} on this client")
        return fn(**(m.get("arguments") or {})), None
    except Exception as e:  # noqa: BLE001 - the tool's failure is the call's
        return None, f"{type(e).__name__}: {e}"


def _follow(readline, live: _Live, reply=None) -> Any:
    """The answer among the lines readline() gives; events to |live|, tool
    results to reply(body)."""
    while True:
        m, what = live.take(readline())
        if what is None:
            return m
        if what[0] == "output":
            live.on_output(*what[1])
        elif what[0] == "call":
            reply(_tool_body(what[1][1], *_call_tool(*what[1])))


def _request(code: str, files, limits, id) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError("code is a str")
    req: Dict[str, Any] = {"id": id, "code": code}
    text, binary = {}, {}
    for name, content in (files or {}).items():
        if isinstance(content, str):
            text[name] = content
        elif isinstance(content, (bytes, bytearray, memoryview)):
            binary[name] = base64.b64encode(bytes(content)).decode("ascii")
        else:
            raise TypeError(f"file {name!r}: content is str or bytes")
    if text:
        req["files"] = text
    if binary:
        req["files_base64"] = binary
    if limits:
        req["limits"] = dict(limits)
    return req


def _add_input(req: Dict[str, Any], stdin, argv, filename) -> None:
    """A request's stdin (str or bytes), argv (list of str) and filename."""
    if stdin is not None:
        if isinstance(stdin, str):
            req["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            req["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
        else:
            raise TypeError("stdin is str or bytes")
    if argv is not None:
        if not all(isinstance(a, str) for a in argv):
            raise TypeError("argv is a list of str")
        req["argv"] = list(argv)
    if filename is not None:
        if not isinstance(filename, str):
            raise TypeError("filename is a str")
        req["filename"] = filename


def _cell(session: str, code, files, limits, rollback, argv) -> Dict[str, Any]:
    req = _request(code, files, limits, None)
    req["session"] = session
    _add_input(req, None, argv, None)
    if rollback is not None:
        req["rollback"] = rollback
    return req


class Client:
    """A pysbx server at |target|: a UNIX socket path, or http(s)://host:port.

    token: sent as "Authorization: Bearer TOKEN" (HTTP only).
    timeout: seconds a run() waits for its answer (None: as long as it takes;
    the request's own wall limit bounds the run itself)."""

    def __init__(self, target: str, token: Optional[str] = None,
                 timeout: Optional[float] = None):
        self.target = target
        self.token = token
        self.timeout = timeout
        self._http = target.startswith(("http://", "https://"))
        if token is not None and not self._http:
            raise ValueError("a token is for an HTTP server")
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def run(self, code: str, files: Optional[Mapping[str, Union[str, bytes]]] = None,
            limits: Optional[Mapping[str, Any]] = None,
            stdin: Optional[Union[str, bytes]] = None,
            argv: Optional[List[str]] = None, filename: Optional[str] = None,
            on_output=None, tools: Optional[Mapping[str, Any]] = None,
            max_tool_calls: Optional[int] = None) -> Result:
        """Runs |code| with |files| (name to str, or to bytes for binary
        content) in the workspace and |limits| (wall_seconds, cpu_seconds,
        memory_bytes, max_output_chars, max_artifact_bytes, max_artifacts);
        |stdin| (str or bytes) is its standard input, |argv| its
        sys.argv[1:], |filename| its name (sys.argv[0], __file__ and the
        file its tracebacks name, as python3 FILENAME gives them);
        on_output(stream, text) is called with the output as it comes;
        tools (name -> function) are host tools the code may call (import
        pysbx; pysbx.tools.NAME(**arguments)): each call is answered with
        what the function returns (JSON), or fails with what it raises;
        max_tool_calls: how many calls may reach them (the server's default
        64)."""
        with self._lock:
            id = next(self._ids)
        live = _Live(on_output, tools, max_tool_calls)
        req = _request(code, files, limits, id)
        _add_input(req, stdin, argv, filename)
        live.ask(req)
        body = json.dumps(req).encode()
        answer = self._post(body, live, id) if self._http else self._unix(body, live, id)
        if isinstance(answer, dict) and answer.get("id") not in (id, None):
            raise ProtocolError(f"the answer is for id {_shown(answer.get('id'))}, not {id}")
        return _result(answer)

    def session(self, name: str = "main", next_cell: int = 1) -> Union["Session", "HttpSession"]:
        """A session of this server's: over a UNIX socket on a connection of
        its own (closing it ends the session); over HTTP the session of this
        token called |name| on the server (or the replica its name is pinned
        to), whose cells are numbered from |next_cell| (another process's
        session of that name can be taken up where it was)."""
        if self._http:
            return HttpSession(self, name, next_cell)
        return Session(self, name)

    def _unix(self, body: bytes, live: _Live, id: int) -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            s.connect(self.target)
            s.sendall(body + b"\n")
            if live.tools is None:
                s.shutdown(socket.SHUT_WR)  # one request: the server answers it and closes

            def reply(result: Dict[str, Any]) -> None:
                s.sendall(json.dumps({"id": id, "tool_result": result}).encode() + b"\n")
            if live.on_output is not None or live.tools is not None:
                with s.makefile("rb") as f:
                    return _follow(lambda: f.readline(MAX_ANSWER_BYTES + 1), live, reply)
            chunks, size = [], 0
            while True:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ProtocolError("an answer past MAX_ANSWER_BYTES")
        line = b"".join(chunks).split(b"\n", 1)[0]
        if not line:
            raise ProtocolError("the server closed the connection without an answer")
        return _loads(line)

    def _post(self, body: Optional[bytes], live: Optional[_Live] = None, id: Any = None,
              path: str = "/v1/run", method: str = "POST") -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.target.rstrip("/") + path, data=body,
                                     headers=headers, method=method)

        def reply(result: Dict[str, Any]) -> None:
            self._post(json.dumps(result).encode(),
                       path=f"/v1/runs/{live.run_id}/tool_results")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if live is not None and (live.on_output is not None or live.tools is not None):
                    return _follow(lambda: resp.readline(MAX_ANSWER_BYTES + 1), live, reply)
                return _loads(resp.read(MAX_ANSWER_BYTES + 1))
        except urllib.error.HTTPError as e:
            text = e.read(1 << 20)
            e.close()
            raise _http_error(e.code, text, e.reason) from None
        except http.client.HTTPException as e:
            raise ProtocolError(f"HTTP: {e!r}") from None


def _http_error(status: int, text: bytes, reason: str) -> SandboxError:
    """An error answer: a 4xx or 5xx status and the error object as its body
    (else the body's first words, under the code http_STATUS)."""
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        answer = None
    err = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(err, dict) and all(isinstance(err.get(k), str) for k in ("code", "message")):
        return _refusal(err, status)
    return SandboxError(f"http_{status}", text.decode("utf-8", "replace")[:500] or reason, status)


class Session:
    """The cells of one session, on one connection to the server, one at a
    time (calls from several threads wait their turn)."""

    def __init__(self, client: Client, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(client.timeout)
            self._sock.connect(client.target)
        except BaseException:
            self._sock.close()
            raise
        self._in = self._sock.makefile("rb")

    def run(self, code: str, files: Optional[Mapping[str, Union[str, bytes]]] = None,
            limits: Optional[Mapping[str, Any]] = None,
            rollback: Optional[str] = None, argv: Optional[List[str]] = None,
            on_output=None) -> Result:
        """Runs |code| as the session's next cell (files, limits, argv and
        on_output as for Client.run; a cell has no stdin); rollback:
        on_error (the default), on_stop or never."""
        req = _cell(self.name, code, files, limits, rollback, argv)
        if on_output is not None:
            req["stream"] = True
        return _result(self._ask(req, on_output))

    def hibernate(self) -> int:
        """Has the server (started with --state-dir) write the session to
        its state directory and end its processes; the next run() restores
        it (its result's session then says "restored": True). Returns the
        image's bytes. SandboxError when the server keeps no images or
        holds no such session (invalid_request), or could not write it
        (sandbox_unavailable: the session goes on)."""
        answer = self._ask({"session_hibernate": self.name})
        if isinstance(answer, dict) and "error" in answer:
            _result(answer)  # raises SandboxError
        done = answer.get("session_hibernated")
        if not isinstance(done, dict) or done.get("name") != self.name:
            raise ProtocolError(f"not an answer to session_hibernate: {_shown(answer)}")
        return done["bytes"]

    def reset(self) -> None:
        """Closes the session on the server: the next run() starts a new one.
        SandboxError when it has none open (no cell ran, or it was lost)."""
        answer = self._ask({"session_close": self.name})
        if isinstance(answer, dict) and "error" in answer:
            _result(answer)  # raises SandboxError
        if answer.get("session_closed") != self.name:
            raise ProtocolError(f"not an answer to session_close: {_shown(answer)}")

    def close(self) -> None:
        """Ends the connection, and with it the session."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._in.close()
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ask(self, req: Dict[str, Any], on_output=None) -> Dict[str, Any]:
        with self._lock:
            if self._sock is None:
                raise ValueError("the session is closed")
            req["id"] = next(self._ids)
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                answer = _follow(lambda: self._in.readline(MAX_ANSWER_BYTES + 1),
                                 _Live(on_output))
            except BaseException:
                # A cell still running, or an answer half read: the
                # connection can serve no more; closing it ends the cell.
                self._drop()
                raise
        if not isinstance(answer, dict) or answer.get("id") not in (req["id"], None):
            raise ProtocolError(f"not the answer to request {req['id']}: {_shown(answer)}")
        return answer


_SESSION_NAME = re.compile(r"[A-Za-z0-9._~-]{1,128}")


def _http_session_name(name: str) -> str:
    """|name|, when the path of /v1/sessions/NAME can hold it as it is."""
    if not _SESSION_NAME.fullmatch(name):
        raise ValueError("over HTTP a session's name is 1 to 128 of A-Z a-z 0-9 . _ ~ -")
    return name


def _http_cell(name: str, code, files, limits, rollback, argv, on_output,
               cell: int) -> Dict[str, Any]:
    """A cell's body over HTTP: the path names the session; "cell" says
    which number the client expects it to be."""
    req = _cell(name, code, files, limits, rollback, argv)
    del req["session"]
    req["cell"] = cell
    if on_output is not None:
        req["stream"] = True
    return req


class HttpSession:
    """A session over HTTP (pysbx serve --http): the cells of this token's
    session |name|, one at a time. Each cell says the number it expects to
    be; a server (or a replica behind a load balancer) that does not hold
    the session at that number answers session_lost rather than running the
    cell in another state, and the next run() starts a new session (cell
    1). close() (and the end of a with block) closes it on the server."""

    def __init__(self, client: Client, name: str, next_cell: int = 1):
        self.name = _http_session_name(name)
        self.next_cell = next_cell
        self._client = client
        self._lock = threading.Lock()
        self._closed = False

    def run(self, code: str, files: Optional[Mapping[str, Union[str, bytes]]] = None,
            limits: Optional[Mapping[str, Any]] = None,
            rollback: Optional[str] = None, argv: Optional[List[str]] = None,
            on_output=None) -> Result:
        """As Session.run. SandboxError("session_lost") when the session is
        gone; the next run() starts a new one."""
        with self._lock:
            if self._closed:
                raise ValueError("the session is closed")
            req = _http_cell(self.name, code, files, limits, rollback, argv, on_output,
                             self.next_cell)
            try:
                answer = self._client._post(json.dumps(req).encode(), _Live(on_output),
                                            path=f"/v1/sessions/{self.name}/run")
            except SandboxError as e:
                if e.code == "session_lost":
                    self.next_cell = 1
                raise
            r = _result(answer)
            if r.session:
                self.next_cell = r.session["cell"] + 1
            return r

    def fork(self, name: str) -> "HttpSession":
        """A branch: the token's session |name| (of this one's family, its
        name up to the first "~": "nb~2" for a branch of "nb") made an exact
        copy of this session's state, then a session of its own; returns
        it. SandboxError when this session is not open here (not_found) or
        lost (session_lost), or |name| is open (invalid_request, 409)."""
        name = _http_session_name(name)
        with self._lock:
            if self._closed:
                raise ValueError("the session is closed")
            answer = self._client._post(json.dumps({"to": name}).encode(),
                                        path=f"/v1/sessions/{self.name}/fork")
        forked = answer.get("session_forked") if isinstance(answer, dict) else None
        if not isinstance(forked, dict) or forked.get("to") != name:
            raise ProtocolError(f"not an answer to a fork: {_shown(answer)}")
        return HttpSession(self._client, name, next_cell=forked["cell"] + 1)

    def hibernate(self) -> int:
        """As Session.hibernate, over HTTP (POST /v1/sessions/NAME/hibernate):
        SandboxError not_found when the token has no such session here."""
        with self._lock:
            if self._closed:
                raise ValueError("the session is closed")
            answer = self._client._post(b"{}", path=f"/v1/sessions/{self.name}/hibernate")
        done = answer.get("session_hibernated") if isinstance(answer, dict) else None
        if not isinstance(done, dict) or done.get("name") != self.name:
            raise ProtocolError(f"not an answer to a hibernation: {_shown(answer)}")
        return done["bytes"]

    def reset(self) -> None:
        """Closes the session on the server: the next run() starts a new one.
        SandboxError (not_found) when it has none open."""
        with self._lock:
            self.next_cell = 1
            self._client._post(None, path=f"/v1/sessions/{self.name}", method="DELETE")

    def close(self) -> None:
        """Closes the session on the server (one already gone is no error)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._client._post(None, path=f"/v1/sessions/{self.name}", method="DELETE")
            except SandboxError as e:
                if e.code != "not_found":
                    raise

    def __enter__(self) -> "HttpSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _loads(text: bytes) -> Any:
    if len(text) > MAX_ANSWER_BYTES:
        raise ProtocolError("an answer past MAX_ANSWER_BYTES")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        # RecursionError: nested past what this interpreter's decoder takes.
        raise ProtocolError(f"an answer that is not JSON this client reads ({e}): "
                            f"{text[:200]!r}") from None


# --- asyncio --------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxLimits:
    """A run's limits; None leaves one to the server's default (its
    ceilings still hold: a request asking more is refused, invalid_limit)."""
    wall_seconds: Optional[float] = None
    cpu_seconds: Optional[float] = None
    memory_bytes: Optional[int] = None
    max_output_chars: Optional[int] = None
    max_artifact_bytes: Optional[int] = None
    max_artifacts: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class SandboxArtifact:
    name: str
    content: bytes
    truncated: bool = False  # content cut at max_artifact_bytes
    # The file's real size: neither compared nor shown, so that an artifact
    # equals SandboxArtifact(name=..., content=...) as the kits write it.
    size: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class SandboxResult:
    """A run the code ended: status "completed" (exit_code its exit status)
    or "crashed" (exit_code None, signal the signal's name)."""
    status: str
    exit_code: Optional[int]
    stdout: str
    stderr: str
    artifacts: Tuple[SandboxArtifact, ...] = ()
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    signal: Optional[str] = None
    value: Optional[str] = None  # repr() of a last expression, as in a notebook
    error: Optional[CodeError] = None  # the uncaught exception, if the code ended by one
    session: Optional[Dict[str, Any]] = None  # a cell's {"name", "cell", "rolled_back"}
    dropped_artifacts: Tuple[DroppedArtifact, ...] = ()
    stats: Dict[str, Any] = field(default_factory=dict)
    reason: Optional[str] = None  # the sandbox's words for how the run ended
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.exit_code == 0


class SandboxTimeoutError(SandboxError):
    """The sandbox stopped the run at its wall or CPU limit (limit says
    which); result holds what it wrote before."""

    def __init__(self, result: SandboxResult, limit: str):
        super().__init__("timeout", result.reason or f"the {limit} limit")
        self.limit = limit
        self.result = result


class SandboxMemoryError(SandboxError):
    """The sandbox took the run's process away at its memory limit; result
    holds what it wrote before."""

    def __init__(self, result: SandboxResult):
        super().__init__("memory_limit", result.reason or "the memory limit")
        self.limit = "memory"
        self.result = result


def _sandbox_result(r: Result) -> SandboxResult:
    """The asyncio shape of |r|; raises for a run the sandbox stopped."""
    out = SandboxResult(
        status=r.status, exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr,
        artifacts=tuple(SandboxArtifact(a.name, a.content, a.truncated, a.size)
                        for a in r.artifacts),
        stdout_truncated=r.stdout_truncated, stderr_truncated=r.stderr_truncated,
        signal=r.signal, value=r.value, error=r.error, session=r.session,
        dropped_artifacts=tuple(r.dropped_artifacts), stats=r.stats, reason=r.reason, raw=r.raw)
    if r.status == "timeout":
        raise SandboxTimeoutError(out, r.limit or "wall")
    if r.status == "memory_limit":
        raise SandboxMemoryError(out)
    if r.status not in ("completed", "crashed"):
        # cancelled (the server is draining) or sandbox_error: no answer
        # about the code at all.
        raise SandboxError(r.status, r.reason or r.status)
    return out


def _limits_json(limits: Union[SandboxLimits, Mapping[str, Any], None]) -> Optional[Dict]:
    if limits is None:
        return None
    if isinstance(limits, SandboxLimits):
        return limits.to_json() or None
    return dict(limits)


async def _read_capped(reader: asyncio.StreamReader) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ProtocolError("an answer past MAX_ANSWER_BYTES")


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass


class PysbxSandbox:
    """A pysbx server for asyncio code: |address| is a UNIX socket path
    (pysbx serve --listen) or http://host:port (pysbx serve --http; https
    too); |token| is sent as a bearer token (HTTP only). Each run is a
    connection of its own, so runs from many tasks are independent."""

    def __init__(self, address: str, token: Optional[str] = None):
        self.address = address
        self.token = token
        self._url = urlsplit(address) if address.startswith(("http://", "https://")) else None
        if token is not None and self._url is None:
            raise ValueError("a token is for an HTTP server")
        self._ids = itertools.count(1)

    async def run(self, code: str, *, limits: Union[SandboxLimits, Mapping[str, Any], None] = None,
                  files: Optional[Mapping[str, Union[str, bytes]]] = None,
                  stdin: Optional[Union[str, bytes]] = None, argv: Optional[List[str]] = None,
                  filename: Optional[str] = None, on_output=None,
                  tools: Optional[Mapping[str, Any]] = None,
                  max_tool_calls: Optional[int] = None) -> SandboxResult:
        """Runs |code| in a fresh sandbox (files, stdin, argv and filename as
        Client.run has them); on_output(stream, text) and the functions of
        |tools| as Client.run has them, each a plain function or a
        coroutine function."""
        id = next(self._ids)
        live = _Live(on_output, tools, max_tool_calls)
        req = _request(code, files, _limits_json(limits), id)
        _add_input(req, stdin, argv, filename)
        live.ask(req)
        body = json.dumps(req).encode()
        answer = await (self._post(body, live) if self._url else self._unix(body, live, id))
        if isinstance(answer, dict) and answer.get("id") not in (id, None):
            raise ProtocolError(f"the answer is for id {_shown(answer.get('id'))}, not {id}")
        return _sandbox_result(_result(answer))

    def session(self, name: str = "main",
                next_cell: int = 1) -> Union["AsyncSession", "AsyncHttpSession"]:
        """A session: `async with sandbox.session("nb") as s` (over HTTP as
        Client.session has it)."""
        if self._url:
            return AsyncHttpSession(self, name, next_cell)
        return AsyncSession(self.address, name)

    def run_python_tool(self, limits: Union[SandboxLimits, Mapping[str, Any], None] = None,
                        sessions: bool = False) -> "RunPythonTool":
        """A run_python tool for a model, every call under |limits|."""
        return RunPythonTool(self, limits, sessions)

    async def _unix(self, body: bytes, live: _Live, id: int) -> Any:
        reader, writer = await asyncio.open_unix_connection(self.address,
                                                            limit=MAX_ANSWER_BYTES + 1)

        async def reply(result: Dict[str, Any]) -> None:
            writer.write(json.dumps({"id": id, "tool_result": result}).encode() + b"\n")
            await writer.drain()
        try:
            writer.write(body + b"\n")
            await writer.drain()
            if live.tools is None:
                writer.write_eof()  # one request: the server answers it and closes
            if live.on_output is not None or live.tools is not None:
                return await _afollow(reader.readline, live, reply)
            data = await _read_capped(reader)
        finally:
            # Also when the task is cancelled: the server sees the
            # connection close and cancels the run.
            await _close(writer)
        line = data.split(b"\n", 1)[0]
        if not line:
            raise ProtocolError("the server closed the connection without an answer")
        return _loads(line)

    async def _post(self, body: Optional[bytes], live: Optional[_Live] = None,
                    path: str = "/v1/run", method: str = "POST") -> Any:
        u = self._url
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        reader, writer = await asyncio.open_connection(
            u.hostname, port, ssl=ssl.create_default_context() if tls else None)
        try:
            host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
            if u.port is not None:
                host = f"{host}:{u.port}"
            body = body if body is not None else b""
            head = [f"{method} {u.path.rstrip('/')}{path} HTTP/1.1", f"Host: {host}",
                    "Content-Type: application/json", "Accept: application/json",
                    f"Content-Length: {len(body)}", "Connection: close"]
            if self.token is not None:
                head.append(f"Authorization: Bearer {self.token}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()

            async def reply(result: Dict[str, Any]) -> None:
                await self._post(json.dumps(result).encode(),
                                 path=f"/v1/runs/{live.run_id}/tool_results")
            status, headers, text = await _http_response(reader, live, reply)
        finally:
            await _close(writer)
        if status == 200:
            return _loads(text)
        raise _http_error(status, text, "")


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


async def _afollow(readline, live: _Live, reply=None) -> Any:
    """_follow for asyncio: on_output, the tools and reply may be
    coroutine functions."""
    while True:
        m, what = live.take(await readline())
        if what is None:
            return m
        if what[0] == "output":
            await _maybe_await(live.on_output(*what[1]))
        elif what[0] == "call":
            value, error = _call_tool(*what[1])
            if asyncio.iscoroutine(value):  # an async def tool
                try:
                    value = await value
                except Exception as e:  # noqa: BLE001 - the tool's failure is the call's
                    value, error = None, f"{type(e).__name__}: {e}"
            await reply(_tool_body(what[1][1], value, error))


class _ChunkedLines:
    """The lines of a chunked body as its chunks arrive."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader, self.buf, self.end, self.size = reader, b"", False, 0

    async def readline(self) -> bytes:
        while b"\n" not in self.buf and not self.end:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            self.size += size
            if self.size > MAX_ANSWER_BYTES:
                raise ProtocolError("an answer past MAX_ANSWER_BYTES")
            self.buf += (await self.reader.readexactly(size + 2))[:-2]
            self.end = size == 0
        line, nl, self.buf = self.buf.partition(b"\n")
        return line + nl


async def _http_response(reader: asyncio.StreamReader, live: Optional[_Live] = None,
                         reply=None) -> Tuple[int, Dict[str, str], bytes]:
    """An HTTP/1.1 response on a connection the server closes after it:
    its status, headers and body (Content-Length, chunked, or to the end);
    a streamed one's events handed to on_output and the answer's line as
    the body."""
    try:
        line = await reader.readuntil(b"\r\n")
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP response: {line[:100]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
            if len(headers) > 100:
                raise ProtocolError("too many HTTP headers")
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        streamed = live is not None and (live.on_output is not None or live.tools is not None)
        if chunked and streamed and status == 200:
            answer = await _afollow(_ChunkedLines(reader).readline, live, reply)
            return status, headers, json.dumps(answer).encode()
        if chunked:
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if len(body) + size > MAX_ANSWER_BYTES:
                    raise ProtocolError("an answer past MAX_ANSWER_BYTES")
                body += await reader.readexactly(size + 2)
                body = body[:-2]
                if size == 0:
                    return status, headers, body
        if "content-length" in headers:
            n = int(headers["content-length"])
            if n > MAX_ANSWER_BYTES:
                raise ProtocolError("an answer past MAX_ANSWER_BYTES")
            return status, headers, await reader.readexactly(n)
        return status, headers, await _read_capped(reader)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        raise ProtocolError(f"HTTP: {e!r}") from None


class AsyncSession:
    """The cells of one session on one connection, one at a time (tasks
    wait their turn). Closing the connection (close(), the end of the
    async with block, a cancelled cell) ends the session."""

    def __init__(self, address: str, name: str):
        self.address = address
        self.name = name
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._closed = False

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def run(self, code: str, *, limits: Union[SandboxLimits, Mapping[str, Any], None] = None,
                  files: Optional[Mapping[str, Union[str, bytes]]] = None,
                  rollback: Optional[str] = None,
                  argv: Optional[List[str]] = None, on_output=None) -> SandboxResult:
        """The session's next cell; rollback: on_error (the default),
        on_stop or never; on_output as for PysbxSandbox.run. A cell stopped
        at a limit raises as run() does (its result says whether the
        session was rolled back)."""
        req = _cell(self.name, code, files, _limits_json(limits), rollback, argv)
        if on_output is not None:
            req["stream"] = True
        return _sandbox_result(_result(await self._ask(req, on_output)))

    async def reset(self) -> None:
        """Closes the session on the server: the next run() starts afresh."""
        answer = await self._ask({"session_close": self.name})
        if isinstance(answer, dict) and "error" in answer:
            _result(answer)  # raises SandboxError
        if answer.get("session_closed") != self.name:
            raise ProtocolError(f"not an answer to session_close: {_shown(answer)}")

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            await self._drop()

    async def _drop(self) -> None:
        if self._writer is not None:
            w, self._writer, self._reader = self._writer, None, None
            await _close(w)

    async def _ask(self, req: Dict[str, Any], on_output=None) -> Dict[str, Any]:
        async with self._lock:
            if self._closed:
                raise ValueError("the session is closed")
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_unix_connection(
                    self.address, limit=MAX_ANSWER_BYTES + 1)
            req["id"] = next(self._ids)
            try:
                self._writer.write(json.dumps(req).encode() + b"\n")
                await self._writer.drain()
                answer = await _afollow(self._reader.readline, _Live(on_output))
            except BaseException:
                # A cell still running (cancelled), or an answer half read:
                # the connection can serve no more; closing it ends the cell.
                await asyncio.shield(self._drop())
                raise
        if not isinstance(answer, dict) or answer.get("id") not in (req["id"], None):
            raise ProtocolError(f"not the answer to request {req['id']}: {_shown(answer)}")
        return answer


class AsyncHttpSession:
    """HttpSession for asyncio code: the cells of this token's session
    |name| over HTTP, one at a time (tasks wait their turn)."""

    def __init__(self, sandbox: "PysbxSandbox", name: str, next_cell: int = 1):
        self.name = _http_session_name(name)
        self.next_cell = next_cell
        self._sandbox = sandbox
        self._lock = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> "AsyncHttpSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def run(self, code: str, *, limits: Union[SandboxLimits, Mapping[str, Any], None] = None,
                  files: Optional[Mapping[str, Union[str, bytes]]] = None,
                  rollback: Optional[str] = None,
                  argv: Optional[List[str]] = None, on_output=None) -> SandboxResult:
        """As AsyncSession.run; SandboxError("session_lost") when the session
        is gone, and the next run() starts a new one."""
        async with self._lock:
            if self._closed:
                raise ValueError("the session is closed")
            req = _http_cell(self.name, code, files, _limits_json(limits), rollback, argv,
                             on_output, self.next_cell)
            try:
                answer = await self._sandbox._post(json.dumps(req).encode(), _Live(on_output),
                                                   path=f"/v1/sessions/{self.name}/run")
            except SandboxError as e:
                if e.code == "session_lost":
                    self.next_cell = 1
                raise
            r = _result(answer)
            if r.session:
                self.next_cell = r.session["cell"] + 1
        return _sandbox_result(r)

    async def reset(self) -> None:
        """Closes the session on the server: the next run() starts afresh."""
        async with self._lock:
            self.next_cell = 1
            await self._sandbox._post(None, path=f"/v1/sessions/{self.name}", method="DELETE")

    async def close(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self._sandbox._post(None, path=f"/v1/sessions/{self.name}",
                                          method="DELETE")
            except SandboxError as e:
                if e.code != "not_found":
                    raise


class RunPythonTool:
    """run_python for a model: definition is the tool as a model API takes
    it (name, description, input_schema), and await tool(arguments) runs one
    call and returns what the model is shown, a dict that JSON encodes. The
    model gives code (and files, and with sessions a session_id); the
    limits are the host's. A run stopped at one comes back as
    {"error": {"code": "sandbox_limit_exceeded", "limit": ..., ...}} with
    the output it wrote; arguments that are not the schema's as
    {"error": {"code": "invalid_arguments", ...}}; a refusal of the server's
    as its code. Nothing a call does raises but a lost connection."""

    def __init__(self, sandbox: PysbxSandbox,
                 limits: Union[SandboxLimits, Mapping[str, Any], None] = None,
                 sessions: bool = False):
        self.sandbox = sandbox
        self.limits = limits
        self.sessions = sessions
        self._open: Dict[str, AsyncSession] = {}
        props: Dict[str, Any] = {
            "code": {"type": "string", "description": "Python 3 source code to run"},
            "files": {"type": "object", "additionalProperties": {"type": "string"},
                      "description": "Input files (name to text), written to the working "
                                     "directory before the code runs"},
        }
        if sessions:
            props["session_id"] = {
                "type": "string", "minLength": 1, "maxLength": 128,
                "description": "Run the code as the next cell of this session: variables, "
                               "imports and files of the cells before it are there"}
        lim = _limits_json(limits) or {}
        said = ", ".join(f"{k} {v}" for k, v in sorted(lim.items())) or "the server's defaults"
        self.definition = {
            "name": "run_python",
            "description": "Runs Python 3 code in a fresh, isolated sandbox (no network, no "
                           "host files) and returns its exit code, stdout, stderr, the value "
                           "of a last expression and the files it wrote. Limits: " + said + ".",
            "input_schema": {"type": "object", "required": ["code"], "properties": props,
                             "additionalProperties": False},
        }

    async def __call__(self, arguments: Mapping[str, Any]) -> Dict[str, Any]:
        known = set(self.definition["input_schema"]["properties"])
        if (not isinstance(arguments, Mapping) or not isinstance(arguments.get("code"), str)
                or set(arguments) - known
                or not isinstance(arguments.get("files", {}), Mapping)
                or not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in dict(arguments.get("files", {})).items())
                or not isinstance(arguments.get("session_id", ""), str)):
            return {"error": {"code": "invalid_arguments",
                              "message": "run_python takes {\"code\": string, \"files\": "
                                         "{name: text}}" +
                                         (" and a session_id" if self.sessions else "")}}
        try:
            sid = arguments.get("session_id")
            if sid:
                if sid not in self._open:
                    self._open[sid] = self.sandbox.session(sid)
                r = await self._open[sid].run(arguments["code"], limits=self.limits,
                                              files=arguments.get("files"))
            else:
                r = await self.sandbox.run(arguments["code"], limits=self.limits,
                                           files=arguments.get("files"))
        except (SandboxTimeoutError, SandboxMemoryError) as e:
            out = _tool_output(e.result)
            out["error"] = {"code": "sandbox_limit_exceeded", "limit": e.limit,
                            "message": f"{e.code} (limit: {e.limit}): {e.message}; the output "
                                       "is what the code wrote before it was stopped"}
            return out
        except SandboxError as e:
            return {"error": {"code": e.code, "message": e.message}}
        return _tool_output(r)

    async def close(self) -> None:
        """Closes the sessions the tool opened."""
        for s in self._open.values():
            await s.close()
        self._open.clear()


def _tool_output(r: SandboxResult) -> Dict[str, Any]:
    out: Dict[str, Any] = {"exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}
    if r.value is not None:
        out["value"] = r.value
    if r.error is not None:
        out["exception"] = {"type": r.error.type, "message": r.error.message}
    if r.signal:
        out["signal"] = r.signal
    if r.session:
        out["session"] = r.session
    if r.artifacts:
        out["files"] = [{"name": a.name, "size": a.size, "truncated": a.truncated}
                        for a in r.artifacts]
    return out
