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

A session keeps state (variables, imports, files) from one cell to the next,
over a UNIX socket only; a cell that raises is rolled back (rollback=
"on_error", the server's default; "on_stop" and "never" keep more):

    with sbx.session("nb") as s:                # one connection, held open
        s.run("import csv\nrows = list(csv.reader(open('a.csv')))",
              files={"a.csv": "x\n1\n"})
        r = s.run("print(len(rows))")           # r.session: {"name": "nb", "cell": 2, ...}
        s.reset()                               # the next cell starts afresh

Its sessions belong to the connection: closing it (close(), the end of the
with block, a timeout) closes them. A lost session (the server's idle time
ran out, say) raises SandboxError("session_lost"); the next run() starts a
new one.
"""
import base64
import http.client
import itertools
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

__all__ = ["Client", "Session", "Result", "Artifact", "SandboxError", "ProtocolError"]

# The most bytes an answer may have before the client gives up on it.
MAX_ANSWER_BYTES = 1 << 30


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
        raise ProtocolError(f"a malformed error of the code: {err!r:.200}")
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
        if not isinstance(err, dict):
            raise ProtocolError(f"a malformed error: {err!r}")
        raise SandboxError(str(err.get("code")), str(err.get("message")))
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
        raise ProtocolError(f"a malformed result ({e!r}): {answer!r:.200}") from None


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
            argv: Optional[List[str]] = None, filename: Optional[str] = None) -> Result:
        """Runs |code| with |files| (name to str, or to bytes for binary
        content) in the workspace and |limits| (wall_seconds, cpu_seconds,
        memory_bytes, max_output_chars, max_artifact_bytes, max_artifacts);
        |stdin| (str or bytes) is its standard input, |argv| its
        sys.argv[1:], |filename| its name (sys.argv[0], __file__ and the
        file its tracebacks name, as python3 FILENAME gives them)."""
        with self._lock:
            id = next(self._ids)
        req = _request(code, files, limits, id)
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
        body = json.dumps(req).encode()
        answer = self._post(body) if self._http else self._unix(body)
        if isinstance(answer, dict) and answer.get("id") not in (id, None):
            raise ProtocolError(f"the answer is for id {answer.get('id')!r}, not {id}")
        return _result(answer)

    def session(self, name: str = "main") -> "Session":
        """A session of this server's (UNIX socket only), on a connection
        of its own."""
        if self._http:
            raise ValueError("sessions are served over a UNIX socket (and MCP), not HTTP")
        return Session(self, name)

    def _unix(self, body: bytes) -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            s.connect(self.target)
            s.sendall(body + b"\n")
            s.shutdown(socket.SHUT_WR)  # one request: the server answers it and closes
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

    def _post(self, body: bytes) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.target.rstrip("/") + "/v1/run", data=body,
                                     headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return _loads(resp.read(MAX_ANSWER_BYTES + 1))
        except urllib.error.HTTPError as e:
            # An error answer comes with a 4xx or 5xx status and the same body.
            text = e.read(1 << 20)
            e.close()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                err = answer["error"]
                raise SandboxError(str(err.get("code")), str(err.get("message")),
                                   e.code) from None
            raise SandboxError(f"http_{e.code}", text.decode("utf-8", "replace")[:500] or e.reason,
                               e.code) from None
        except http.client.HTTPException as e:
            raise ProtocolError(f"HTTP: {e!r}") from None


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
            rollback: Optional[str] = None, argv: Optional[List[str]] = None) -> Result:
        """Runs |code| as the session's next cell (files, limits and argv as
        for Client.run; a cell has no stdin); rollback: on_error (the
        default), on_stop or never."""
        req = _request(code, files, limits, None)
        req["session"] = self.name
        if argv is not None:
            if not all(isinstance(a, str) for a in argv):
                raise TypeError("argv is a list of str")
            req["argv"] = list(argv)
        if rollback is not None:
            req["rollback"] = rollback
        return _result(self._ask(req))

    def reset(self) -> None:
        """Closes the session on the server: the next run() starts a new one.
        SandboxError when it has none open (no cell ran, or it was lost)."""
        answer = self._ask({"session_close": self.name})
        if isinstance(answer, dict) and "error" in answer:
            _result(answer)  # raises SandboxError
        if answer.get("session_closed") != self.name:
            raise ProtocolError(f"not an answer to session_close: {answer!r:.200}")

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

    def _ask(self, req: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            if self._sock is None:
                raise ValueError("the session is closed")
            req["id"] = next(self._ids)
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._in.readline(MAX_ANSWER_BYTES + 1)
                if not line.endswith(b"\n"):
                    raise ProtocolError("the server closed the connection without an answer"
                                        if not line else "an answer past MAX_ANSWER_BYTES")
            except BaseException:
                # A cell still running, or an answer half read: the
                # connection can serve no more; closing it ends the cell.
                self._drop()
                raise
        answer = _loads(line)
        if not isinstance(answer, dict) or answer.get("id") not in (req["id"], None):
            raise ProtocolError(f"not the answer to request {req['id']}: {answer!r:.200}")
        return answer


def _loads(text: bytes) -> Any:
    if len(text) > MAX_ANSWER_BYTES:
        raise ProtocolError("an answer past MAX_ANSWER_BYTES")
    try:
        return json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"an answer that is not JSON ({e}): {text[:200]!r}") from None
