/**
 * A client of the pysbx server for Node (18 and later), with no dependencies.
 *
 *     import { PysbxSandbox, SandboxTimeoutError } from "pysbx-client";
 *
 *     const sandbox = new PysbxSandbox("/run/pysbx.sock");   // pysbx serve --listen PATH
 *     // const sandbox = new PysbxSandbox("http://10.0.0.5:8080", { token });  // --http
 *     const r = await sandbox.run("print(open('in.csv').read())\n6 * 7", {
 *       limits: { wallSeconds: 10, cpuSeconds: 5, memoryBytes: 256 << 20 },
 *       files: { "in.csv": "1,2" },
 *     });
 *     r.stdout, r.exitCode, r.value, r.error;
 *     for (const a of r.artifacts) a.name, a.content;   // Uint8Array, decoded
 *
 * run() resolves with a result for a run the code ended: status "completed"
 * (exitCode its exit status, error its uncaught exception) or "crashed"
 * (signal the signal's name). A run the sandbox stopped at a limit rejects
 * with SandboxTimeoutError (limit "wall" or "cpu") or SandboxMemoryError,
 * each carrying the partial result. A request the server refused (a bad
 * limit, a bad file name, the sandbox busy) rejects with SandboxError, whose
 * code is the server's stable error code (invalid_request, invalid_limit,
 * invalid_file, request_too_large, sandbox_unavailable, sandbox_busy, ...).
 * A server that answers nonsense rejects with ProtocolError; one that cannot
 * be reached, with the transport's own error.
 *
 * Over a UNIX socket each run is one connection, so runs at once are
 * independent; closing it cancels the run, which is what an AbortSignal
 * that fires does. Over HTTP each run is one POST /v1/run with the same JSON
 * body (fetch), and an aborted request closes its connection the same way.
 *
 * A session keeps state (variables, imports, files) from one cell to the
 * next; a cell that raises is rolled back (rollback "on_error", the
 * server's default; "on_stop" and "never" keep more). Over a UNIX socket it
 * is the connection's; over HTTP the token's, by its name (HttpSession):
 *
 *     const s = sandbox.session("nb");     // one connection, held open
 *     await s.run("rows = [1, 2]");
 *     const r = await s.run("print(len(rows))");  // r.session: {name: "nb", cell: 2, ...}
 *     await s.reset();                     // the next cell starts afresh
 *     await s.close();
 *
 * sandbox.runPythonTool(limits) gives a model a run_python tool whose
 * limits, when a run reaches them, come back as a sandbox_limit_exceeded
 * error result instead of an exception.
 */
import * as net from "node:net";

/** The most bytes an answer may have before the client gives up on it. */
export const MAX_ANSWER_BYTES = 2 ** 30;

/** How a run ended, as the server says it. */
export type RunStatus =
  | "completed"
  | "timeout"
  | "memory_limit"
  | "crashed"
  | "cancelled"
  | "sandbox_error";

/** What a session's failing cell does to it: on_error (the server's default) rolls
 * back a cell that raised or was stopped; on_stop only one that was stopped; never keeps all. */
export type Rollback = "on_error" | "on_stop" | "never";

/**
 * A run's limits; one left out is the server's default (its ceilings still
 * hold: a request asking more is refused, invalid_limit).
 */
export interface SandboxLimits {
  wallSeconds?: number;
  cpuSeconds?: number;
  memoryBytes?: number;
  /** Characters of stdout and of stderr each; then one line saying how much was cut. */
  maxOutputChars?: number;
  /** Bytes of each file returned; a longer one comes back cut (truncated). */
  maxArtifactBytes?: number;
  maxArtifacts?: number;
  maxArtifactsTotalBytes?: number;
}

/** A file the run left in its workspace. */
export interface SandboxArtifact {
  /** Relative, "/"-separated; escaped when its bytes are not UTF-8 (see rawName). */
  readonly name: string;
  readonly content: Uint8Array;
  /** content was cut at maxArtifactBytes. */
  readonly truncated: boolean;
  /** The file's real size. */
  readonly size: number;
  /** The name's bytes on disk. */
  readonly rawName: Uint8Array;
}

/**
 * A file (a directory when the name ends with "/") the run left and the
 * answer does not return: reason is max_artifacts,
 * max_artifacts_total_bytes, too_deep, unreadable or linked.
 */
export interface DroppedArtifact {
  readonly name: string;
  readonly reason: string;
  /** A file's size; null for a directory. */
  readonly size: number | null;
  readonly rawName: Uint8Array;
}

/**
 * The uncaught exception a run ended by, as the sandboxed interpreter
 * reported it: its type ("KeyError", "json.decoder.JSONDecodeError"), str()
 * of it, and the traceback as Python prints it.
 */
export interface CodeError {
  readonly type: string;
  readonly message: string;
  readonly traceback: string;
}

/** A session's cell: which session, the cell's number in it from 1, and
 * whether the session was put back as it was before the cell. */
export interface SessionCell {
  readonly name: string;
  readonly cell: number;
  readonly rolledBack: boolean;
}

/** What the sandbox measured of a run. */
export interface RunStats {
  readonly wallMs?: number;
  /** User and system, all threads. */
  readonly cpuMs?: number;
  readonly maxRssKb?: number;
  readonly [key: string]: unknown;
}

/**
 * A run's result. run() resolves with one whose status is "completed"
 * (exitCode its exit status) or "crashed" (exitCode null, signal the
 * signal's name); a SandboxTimeoutError or SandboxMemoryError carries one
 * with the output written before the sandbox stopped the run.
 */
export interface SandboxResult {
  readonly status: RunStatus;
  readonly exitCode: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly stdoutTruncated: boolean;
  readonly stderrTruncated: boolean;
  readonly signal: string | null;
  /** As in a notebook cell: repr() of the program's last statement when it
   * is an expression whose value is not None; else null. */
  readonly value: string | null;
  /** The uncaught exception the code ended by (exitCode 1); else null. */
  readonly error: CodeError | null;
  /** A session's cell; null for a run of its own. */
  readonly session: SessionCell | null;
  readonly artifacts: readonly SandboxArtifact[];
  /** All files not returned, listed in droppedArtifacts or not. */
  readonly artifactsDropped: number;
  /** The first of them, with why. */
  readonly droppedArtifacts: readonly DroppedArtifact[];
  readonly stats: RunStats;
  /** The sandbox's words for how the run ended; null when completed. */
  readonly reason: string | null;
  /** The code ran to its end and exited 0. */
  readonly ok: boolean;
  /** The answer as the server sent it. */
  readonly raw: Readonly<Record<string, unknown>>;
}

/** The server refused the request; code is its stable error code. */
export class SandboxError extends Error {
  readonly code: string;
  /** The HTTP status of the answer, over HTTP. */
  readonly httpStatus?: number;

  constructor(code: string, message: string, httpStatus?: number) {
    super(message);
    this.name = "SandboxError";
    this.code = code;
    if (httpStatus !== undefined) this.httpStatus = httpStatus;
  }
}

/** The sandbox stopped the run at its wall or CPU limit (limit says which);
 * result holds what it wrote before. */
export class SandboxTimeoutError extends SandboxError {
  readonly limit: "wall" | "cpu";
  readonly result: SandboxResult;

  constructor(result: SandboxResult, limit: "wall" | "cpu") {
    super("timeout", result.reason ?? `the ${limit} limit`);
    this.name = "SandboxTimeoutError";
    this.limit = limit;
    this.result = result;
  }
}

/** The sandbox took the run's process away at its memory limit; result
 * holds what it wrote before. */
export class SandboxMemoryError extends SandboxError {
  readonly limit = "memory" as const;
  readonly result: SandboxResult;

  constructor(result: SandboxResult) {
    super("memory_limit", result.reason ?? "the memory limit");
    this.name = "SandboxMemoryError";
    this.result = result;
  }
}

/** The server's answer was not an answer. */
export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ProtocolError";
  }
}

/** Input files: name to text, or to bytes for binary content. */
export type SandboxFiles = Readonly<Record<string, string | Uint8Array>>;

export interface RunOptions {
  limits?: SandboxLimits;
  files?: SandboxFiles;
  /** The program's standard input; without it input() raises EOFError. */
  stdin?: string | Uint8Array;
  /** sys.argv[1:]. */
  argv?: readonly string[];
  /** The program's name as python3 FILENAME takes it: sys.argv[0],
   * __file__ and the file its tracebacks name. */
  filename?: string;
  /** When it fires, the connection is closed (the server cancels the run)
   * and run() rejects with its reason. */
  signal?: AbortSignal;
}

export interface CellOptions {
  limits?: SandboxLimits;
  files?: SandboxFiles;
  rollback?: Rollback;
  argv?: readonly string[];
  /** When it fires, the session's connection is closed (which ends the cell
   * and the session) and run() rejects with its reason. */
  signal?: AbortSignal;
}

export interface SandboxOptions {
  /** Sent as "Authorization: Bearer TOKEN" (HTTP only). */
  token?: string;
}

type Json = Record<string, unknown>;

// The request's names of SandboxLimits' fields.
const LIMIT_NAMES: Readonly<Record<string, string>> = {
  wallSeconds: "wall_seconds",
  cpuSeconds: "cpu_seconds",
  memoryBytes: "memory_bytes",
  maxOutputChars: "max_output_chars",
  maxArtifactBytes: "max_artifact_bytes",
  maxArtifacts: "max_artifacts",
  maxArtifactsTotalBytes: "max_artifacts_total_bytes",
};

/** The limits as the request writes them; a name not known is sent as
 * written, for the server to refuse (invalid_limit). */
function limitsJson(limits: SandboxLimits | undefined): Json | undefined {
  if (limits == null) return undefined;
  const out: Json = {};
  for (const [key, value] of Object.entries(limits)) {
    if (value !== undefined && value !== null) out[LIMIT_NAMES[key] ?? key] = value;
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function base64(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function fromBase64(text: unknown, what: string): Uint8Array {
  if (typeof text !== "string" || text.length % 4 !== 0 || !BASE64.test(text)) {
    throw new ProtocolError(`${what} is not base64`);
  }
  const buf = Buffer.from(text, "base64");
  // A small Buffer is a view of a shared pool: give the caller its own bytes.
  return buf.byteOffset === 0 && buf.buffer.byteLength === buf.byteLength
    ? new Uint8Array(buf.buffer, 0, buf.byteLength)
    : new Uint8Array(buf);
}

function addFiles(req: Json, files: SandboxFiles | undefined): void {
  const text: Record<string, string> = {};
  const binary: Record<string, string> = {};
  for (const [name, content] of Object.entries(files ?? {})) {
    if (typeof content === "string") text[name] = content;
    else if (content instanceof Uint8Array) binary[name] = base64(content);
    else throw new TypeError(`file ${JSON.stringify(name)}: content is a string or a Uint8Array`);
  }
  if (Object.keys(text).length > 0) req.files = text;
  if (Object.keys(binary).length > 0) req.files_base64 = binary;
}

function checkArgv(argv: readonly string[]): string[] {
  if (!Array.isArray(argv) || !argv.every((a) => typeof a === "string")) {
    throw new TypeError("argv is an array of strings");
  }
  return [...argv];
}

function runRequest(code: string, id: number, options: RunOptions): Json {
  if (typeof code !== "string") throw new TypeError("code is a string");
  const req: Json = { id, code };
  addFiles(req, options.files);
  const limits = limitsJson(options.limits);
  if (limits) req.limits = limits;
  const { stdin, argv, filename } = options;
  if (stdin !== undefined) {
    if (typeof stdin === "string") req.stdin = stdin;
    else if (stdin instanceof Uint8Array) req.stdin_base64 = base64(stdin);
    else throw new TypeError("stdin is a string or a Uint8Array");
  }
  if (argv !== undefined) req.argv = checkArgv(argv);
  if (filename !== undefined) {
    if (typeof filename !== "string") throw new TypeError("filename is a string");
    req.filename = filename;
  }
  return req;
}

function cellRequest(session: string, code: string, options: CellOptions): Json {
  if (typeof code !== "string") throw new TypeError("code is a string");
  const req: Json = { code };
  addFiles(req, options.files);
  const limits = limitsJson(options.limits);
  if (limits) req.limits = limits;
  req.session = session;
  if (options.argv !== undefined) req.argv = checkArgv(options.argv);
  if (options.rollback !== undefined) req.rollback = options.rollback;
  return req;
}

function parseAnswer(bytes: Buffer): unknown {
  if (bytes.length > MAX_ANSWER_BYTES) throw new ProtocolError("an answer past MAX_ANSWER_BYTES");
  let text: string;
  try {
    text = bytes.toString("utf8");
  } catch {
    throw new ProtocolError("an answer too long for a string");
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ProtocolError(`an answer that is not JSON (${(e as Error).message}): ${text.slice(0, 200)}`);
  }
}

/** What a server sent, shown in a message. JSON.stringify and String recurse,
 * and throw RangeError for what nests deep: that is shown by its kind. */
function describe(v: unknown): string {
  try {
    return String(JSON.stringify(v)).slice(0, 200);
  } catch {
    return Object.prototype.toString.call(v);
  }
}

/** The SandboxError of the error object of a refused request. */
function refusal(err: unknown, httpStatus?: number): SandboxError {
  if (!isObject(err) || typeof err.code !== "string" || typeof err.message !== "string") {
    throw new ProtocolError(`a malformed error: ${describe(err)}`);
  }
  return new SandboxError(err.code, err.message, httpStatus);
}

/** Raises the SandboxError of a refusal: an answer with an error and no status. */
function raiseRefusal(answer: Json, httpStatus?: number): void {
  const err = answer.error;
  if (err !== undefined && err !== null && !("status" in answer)) throw refusal(err, httpStatus);
}

/** The bytes of session |name|'s image, from the answer to its hibernation
 * (a refusal rejects as SandboxError). */
function hibernated(answer: unknown, name: string): number {
  if (!isObject(answer)) throw new ProtocolError(`not an answer to a hibernation: ${describe(answer)}`);
  raiseRefusal(answer);
  const done = answer.session_hibernated;
  if (!isObject(done) || done.name !== name || typeof done.bytes !== "number") {
    throw new ProtocolError(`not an answer to a hibernation: ${describe(answer)}`);
  }
  return done.bytes;
}

function str(v: unknown, what: string, fallback?: string): string {
  if (v === undefined && fallback !== undefined) return fallback;
  if (typeof v !== "string") throw new ProtocolError(`${what} is not a string`);
  return v;
}

function strOrNull(v: unknown, what: string): string | null {
  if (v === undefined || v === null) return null;
  return str(v, what);
}

function num(v: unknown, what: string): number {
  if (typeof v !== "number") throw new ProtocolError(`${what} is not a number`);
  return v;
}

function bool(v: unknown, what: string): boolean {
  if (v === undefined) return false;
  if (typeof v !== "boolean") throw new ProtocolError(`${what} is not a boolean`);
  return v;
}

function list(v: unknown, what: string): unknown[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new ProtocolError(`${what} is not an array`);
  return v;
}

function object(v: unknown, what: string): Json {
  if (!isObject(v)) throw new ProtocolError(`${what} is not an object`);
  return v;
}

/** A file's name on disk: name_base64 when the server escaped its name. */
function rawName(a: Json, name: string): Uint8Array {
  return "name_base64" in a ? fromBase64(a.name_base64, "name_base64") : new Uint8Array(Buffer.from(name));
}

function camel(key: string): string {
  return key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
}

/** The result an answer holds; raises SandboxError for a refusal and
 * ProtocolError for what is no answer. */
function toResult(answer: unknown): SandboxResult {
  if (!isObject(answer)) throw new ProtocolError(`an answer is a JSON object, not ${describe(answer)}`);
  raiseRefusal(answer);
  const status = str(answer.status, "status") as RunStatus;
  const artifacts = list(answer.artifacts, "artifacts").map((item) => {
    const a = object(item, "an artifact");
    const name = str(a.name, "an artifact's name");
    return Object.freeze({
      name,
      content: fromBase64(a.content_base64, `${name}'s content_base64`),
      truncated: bool(a.truncated, "an artifact's truncated"),
      size: num(a.size, "an artifact's size"),
      rawName: rawName(a, name),
    });
  });
  const dropped = list(answer.dropped_artifacts, "dropped_artifacts").map((item) => {
    const d = object(item, "a dropped artifact");
    const name = str(d.name, "a dropped artifact's name");
    return Object.freeze({
      name,
      reason: str(d.reason, "a dropped artifact's reason"),
      size: d.size === undefined || d.size === null ? null : num(d.size, "a dropped artifact's size"),
      rawName: rawName(d, name),
    });
  });
  let error: CodeError | null = null;
  if (answer.error !== undefined && answer.error !== null) {
    const e = answer.error;
    if (!isObject(e) || ![e.type, e.message, e.traceback].every((f) => typeof f === "string")) {
      throw new ProtocolError(`a malformed error of the code: ${describe(e)}`);
    }
    error = Object.freeze({ type: e.type as string, message: e.message as string, traceback: e.traceback as string });
  }
  let session: SessionCell | null = null;
  if (answer.session !== undefined && answer.session !== null) {
    const s = object(answer.session, "session");
    session = Object.freeze({
      name: str(s.name, "session's name"),
      cell: num(s.cell, "session's cell"),
      rolledBack: bool(s.rolled_back, "session's rolled_back"),
    });
  }
  const stats: Record<string, unknown> = {};
  if (answer.stats !== undefined && answer.stats !== null) {
    for (const [k, v] of Object.entries(object(answer.stats, "stats"))) stats[camel(k)] = v;
  }
  const exitCode =
    answer.exit_code === undefined || answer.exit_code === null ? null : num(answer.exit_code, "exit_code");
  const dropCount = answer.artifacts_dropped ?? 0;
  return Object.freeze({
    status,
    exitCode,
    stdout: str(answer.stdout, "stdout", ""),
    stderr: str(answer.stderr, "stderr", ""),
    stdoutTruncated: bool(answer.stdout_truncated, "stdout_truncated"),
    stderrTruncated: bool(answer.stderr_truncated, "stderr_truncated"),
    signal: strOrNull(answer.signal, "signal"),
    value: strOrNull(answer.value, "value"),
    error,
    session,
    artifacts: Object.freeze(artifacts),
    artifactsDropped: num(dropCount, "artifacts_dropped"),
    droppedArtifacts: Object.freeze(dropped),
    stats: Object.freeze(stats),
    reason: strOrNull(answer.reason, "reason"),
    ok: status === "completed" && exitCode === 0,
    raw: answer,
  });
}

/** The result of a run the code ended; raises for a run the sandbox stopped. */
function sandboxResult(answer: unknown): SandboxResult {
  const r = toResult(answer);
  if (r.status === "timeout") {
    const limit = r.raw.limit === "cpu" ? "cpu" : "wall";
    throw new SandboxTimeoutError(r, limit);
  }
  if (r.status === "memory_limit") throw new SandboxMemoryError(r);
  if (r.status !== "completed" && r.status !== "crashed") {
    // cancelled (the server is draining) or sandbox_error: no answer about
    // the code at all.
    throw new SandboxError(r.status, r.reason ?? r.status);
  }
  return r;
}

function checkId(answer: unknown, id: number): void {
  if (isObject(answer) && answer.id !== undefined && answer.id !== null && answer.id !== id) {
    throw new ProtocolError(`the answer is for id ${describe(answer.id)}, not ${id}`);
  }
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new Error("aborted");
}

/**
 * One request on a connection of its own: written, the writing side
 * closed (the server answers it and closes), and read to the end; the
 * first line is the answer. Closing the connection early, as an abort
 * does, cancels the run.
 */
function unixRequest(path: string, body: string, signal?: AbortSignal): Promise<unknown> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortReason(signal));
      return;
    }
    const sock = net.createConnection({ path });
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const finish = (err: unknown, value?: unknown) => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener("abort", onAbort);
      sock.destroy();
      if (err !== undefined) reject(err);
      else resolve(value);
    };
    const onAbort = () => finish(abortReason(signal as AbortSignal));
    signal?.addEventListener("abort", onAbort, { once: true });
    sock.on("error", (e) => {
      // A server that refused the request may close before reading all of
      // it: its answer, when it came whole, says more than the write's error.
      const data = Buffer.concat(chunks);
      const nl = data.indexOf(10);
      if (nl > 0) {
        try {
          finish(undefined, parseAnswer(data.subarray(0, nl)));
          return;
        } catch {
          // no answer after all: the error it is
        }
      }
      finish(e);
    });
    sock.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_ANSWER_BYTES) finish(new ProtocolError("an answer past MAX_ANSWER_BYTES"));
      else chunks.push(chunk);
    });
    sock.on("end", () => {
      const data = Buffer.concat(chunks);
      const nl = data.indexOf(10);
      const line = nl < 0 ? data : data.subarray(0, nl);
      if (line.length === 0) {
        finish(new ProtocolError("the server closed the connection without an answer"));
        return;
      }
      try {
        finish(undefined, parseAnswer(line));
      } catch (e) {
        finish(e);
      }
    });
    sock.on("close", () => finish(new ProtocolError("the server closed the connection without an answer")));
    sock.end(body + "\n");
  });
}

/** A response body, read to its end but no further than MAX_ANSWER_BYTES. */
async function readCapped(response: Response): Promise<Buffer> {
  const length = Number(response.headers.get("content-length") ?? NaN);
  if (length > MAX_ANSWER_BYTES) throw new ProtocolError("an answer past MAX_ANSWER_BYTES");
  if (response.body === null) return Buffer.alloc(0);
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > MAX_ANSWER_BYTES) {
      await reader.cancel().catch(() => undefined);
      throw new ProtocolError("an answer past MAX_ANSWER_BYTES");
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks);
}

async function httpRequest(
  url: string,
  token: string | undefined,
  body: string | undefined,
  signal?: AbortSignal,
  method = "POST",
): Promise<unknown> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token !== undefined) headers.Authorization = `Bearer ${token}`;
  let status: number;
  let statusText: string;
  let text: Buffer;
  try {
    const response = await fetch(url, { method, headers, body, signal });
    status = response.status;
    statusText = response.statusText;
    text = await readCapped(response);
  } catch (e) {
    // Aborting closes the connection, which cancels the run; fetch's own
    // AbortError says less than the reason the caller gave.
    if (signal?.aborted) throw abortReason(signal);
    throw e;
  }
  if (status === 200) return parseAnswer(text);
  // An error answer comes with a 4xx or 5xx status and the same body.
  let answer: unknown;
  try {
    answer = JSON.parse(text.toString("utf8"));
  } catch {
    answer = undefined;
  }
  const err = isObject(answer) ? answer.error : undefined;
  if (isObject(err) && typeof err.code === "string" && typeof err.message === "string") {
    throw refusal(err, status);
  }
  throw new SandboxError(`http_${status}`, text.toString("utf8").slice(0, 500) || statusText, status);
}

/**
 * A pysbx server: address is a UNIX socket path (pysbx serve --listen) or
 * http://host:port (pysbx serve --http; https too). Each run is a
 * connection of its own, so runs at once are independent.
 */
export class PysbxSandbox {
  readonly address: string;
  readonly token: string | undefined;
  private readonly url: string | undefined;
  private readonly base: string | undefined;
  private nextId = 1;

  constructor(address: string, options: SandboxOptions = {}) {
    this.address = address;
    this.token = options.token;
    const http = /^https?:\/\//.test(address);
    this.base = http ? address.replace(/\/+$/, "") : undefined;
    this.url = http ? this.base + "/v1/run" : undefined;
    if (this.token !== undefined && !http) throw new Error("a token is for an HTTP server");
  }

  /** Runs code in a fresh sandbox. */
  async run(code: string, options: RunOptions = {}): Promise<SandboxResult> {
    const id = this.nextId++;
    const body = JSON.stringify(runRequest(code, id, options));
    const answer =
      this.url !== undefined
        ? await httpRequest(this.url, this.token, body, options.signal)
        : await unixRequest(this.address, body, options.signal);
    checkId(answer, id);
    return sandboxResult(answer);
  }

  /** A session: over a UNIX socket on a connection of its own (closing it
   * ends the session); over HTTP this token's session of that name, its
   * cells numbered from nextCell (a session another client ran can be taken
   * up where it was). */
  session(name = "main", nextCell = 1): Session | HttpSession {
    if (this.base !== undefined) return new HttpSession(this.base, this.token, name, nextCell);
    return new Session(this.address, name);
  }

  /** A run_python tool for a model, every call under limits. */
  runPythonTool(limits?: SandboxLimits, options: { sessions?: boolean } = {}): RunPythonTool {
    return new RunPythonTool(this, limits, options);
  }
}

/**
 * A connection of JSON lines: each request written, its answer the next
 * line. Idle, it does not keep the process alive.
 */
class LineSocket {
  private readonly sock: net.Socket;
  private readonly lines: Buffer[] = [];
  private partial: Buffer[] = [];
  private partialSize = 0;
  private failure: unknown = undefined;
  private waiter: { resolve(line: Buffer): void; reject(e: unknown): void } | undefined;

  constructor(path: string) {
    this.sock = net.createConnection({ path });
    this.sock.unref();
    this.sock.on("data", (chunk: Buffer) => this.take(chunk));
    this.sock.on("error", (e) => this.fail(e));
    this.sock.on("end", () => this.fail(new ProtocolError("the server closed the connection without an answer")));
    this.sock.on("close", () => this.fail(new ProtocolError("the server closed the connection without an answer")));
  }

  ask(line: string, signal?: AbortSignal): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      if (this.failure !== undefined) {
        reject(this.failure);
        return;
      }
      const onAbort = () => {
        // Settled first, so that the closing below does not settle it.
        done(reject, abortReason(signal as AbortSignal));
        this.destroy();
      };
      const done = <T>(settle: (v: T) => void, v: T) => {
        signal?.removeEventListener("abort", onAbort);
        this.waiter = undefined;
        this.sock.unref();
        settle(v);
      };
      this.waiter = { resolve: (l) => done(resolve, l), reject: (e) => done(reject, e) };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.sock.ref();
      this.sock.write(line);
      this.flush();
    });
  }

  destroy(): void {
    this.fail(new Error("the connection is closed"));
  }

  private take(chunk: Buffer): void {
    let start = 0;
    for (let nl = chunk.indexOf(10); nl >= 0; nl = chunk.indexOf(10, start)) {
      this.partial.push(chunk.subarray(start, nl));
      this.lines.push(Buffer.concat(this.partial));
      this.partial = [];
      this.partialSize = 0;
      start = nl + 1;
    }
    if (start < chunk.length) {
      this.partialSize += chunk.length - start;
      if (this.partialSize > MAX_ANSWER_BYTES) {
        this.fail(new ProtocolError("an answer past MAX_ANSWER_BYTES"));
        return;
      }
      this.partial.push(chunk.subarray(start));
    }
    this.flush();
  }

  private flush(): void {
    if (this.waiter !== undefined && this.lines.length > 0) {
      this.waiter.resolve(this.lines.shift() as Buffer);
    }
  }

  private fail(e: unknown): void {
    if (this.failure === undefined) this.failure = e;
    this.sock.destroy();
    this.waiter?.reject(this.failure);
  }
}

/**
 * The cells of one session on one connection, one at a time (calls made
 * while a cell runs wait their turn). Closing the connection (close(), an
 * aborted cell) ends the session; the next run() after an abort or a lost
 * connection starts a new one. A lost session (the server's idle time ran
 * out, say) rejects with SandboxError("session_lost").
 */
export class Session {
  readonly address: string;
  readonly name: string;
  private conn: LineSocket | undefined;
  private nextId = 1;
  private tail: Promise<unknown> = Promise.resolve();
  private closing = false;

  constructor(address: string, name: string) {
    this.address = address;
    this.name = name;
  }

  /** The session's next cell. A cell stopped at a limit rejects as
   * PysbxSandbox.run() does (its result says whether the session was
   * rolled back). */
  async run(code: string, options: CellOptions = {}): Promise<SandboxResult> {
    const answer = await this.ask(cellRequest(this.name, code, options), options.signal);
    return sandboxResult(answer);
  }

  /** Has the server (started with --state-dir) write the session to its
   * state directory and end its processes; the next run() restores it.
   * Resolves to the image's bytes. SandboxError when the server keeps no
   * images or holds no such session ("invalid_request"), or could not
   * write it ("sandbox_unavailable": the session goes on). */
  async hibernate(): Promise<number> {
    return hibernated(await this.ask({ session_hibernate: this.name }), this.name);
  }

  /** Closes the session on the server: the next run() starts afresh.
   * SandboxError when it has none open (no cell ran, or it was lost). */
  async reset(): Promise<void> {
    const answer = await this.ask({ session_close: this.name });
    raiseRefusal(answer);
    if (answer.session_closed !== this.name) {
      throw new ProtocolError(`not an answer to session_close: ${describe(answer)}`);
    }
  }

  /** Ends the connection, and with it the session, once the cells already
   * asked for are done; to stop one, abort its signal. */
  close(): Promise<void> {
    this.closing = true;
    const closed = this.tail.then(() => this.drop());
    this.tail = closed;
    return closed;
  }

  private drop(): void {
    this.conn?.destroy();
    this.conn = undefined;
  }

  private ask(req: Json, signal?: AbortSignal): Promise<Json> {
    if (this.closing) return Promise.reject(new Error("the session is closed"));
    const turn = this.tail.then(() => this.exchange(req, signal));
    this.tail = turn.catch(() => undefined);
    if (signal === undefined) return turn;
    // A call still waiting its turn rejects at once; exchange() then skips it.
    return new Promise((resolve, reject) => {
      const onAbort = () => reject(abortReason(signal));
      signal.addEventListener("abort", onAbort, { once: true });
      turn.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
    });
  }

  private async exchange(req: Json, signal?: AbortSignal): Promise<Json> {
    if (signal?.aborted) throw abortReason(signal);
    if (this.conn === undefined) this.conn = new LineSocket(this.address);
    const conn = this.conn;
    const id = this.nextId++;
    req.id = id;
    let answer: unknown;
    try {
      answer = parseAnswer(await conn.ask(JSON.stringify(req) + "\n", signal));
      if (!isObject(answer) || (answer.id !== undefined && answer.id !== null && answer.id !== id)) {
        throw new ProtocolError(`not the answer to request ${id}: ${describe(answer)}`);
      }
    } catch (e) {
      // A cell still running (aborted), or an answer out of step: the
      // connection can serve no more; closing it ends the cell.
      if (this.conn === conn) this.drop();
      throw e;
    }
    return answer;
  }
}

const SESSION_NAME = /^[A-Za-z0-9._~-]{1,128}$/;

/**
 * A session over HTTP (pysbx serve --http): this token's session `name`,
 * its cells one at a time. Each cell says the number it expects to be, so a
 * server (or a replica behind a load balancer) that does not hold the
 * session at that number rejects with SandboxError("session_lost") instead
 * of running the cell in another state; the next run() starts a new
 * session (cell 1). close() closes it on the server.
 */
export class HttpSession {
  readonly name: string;
  /** The number the next cell will say it is. */
  nextCell: number;
  private readonly base: string;
  private readonly token: string | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private closing = false;

  constructor(base: string, token: string | undefined, name: string, nextCell = 1) {
    if (!SESSION_NAME.test(name)) throw new Error("over HTTP a session's name is 1 to 128 of A-Z a-z 0-9 . _ ~ -");
    this.base = base;
    this.token = token;
    this.name = name;
    this.nextCell = nextCell;
  }

  /** As Session.run(). */
  run(code: string, options: CellOptions = {}): Promise<SandboxResult> {
    return this.turn(async () => {
      const req = cellRequest(this.name, code, options);
      delete req.session;
      req.cell = this.nextCell;
      let answer: unknown;
      try {
        answer = await httpRequest(
          `${this.base}/v1/sessions/${this.name}/run`, this.token, JSON.stringify(req), options.signal);
      } catch (e) {
        if (e instanceof SandboxError && e.code === "session_lost") this.nextCell = 1;
        throw e;
      }
      // A cell stopped at a limit rejects, but it ran: it is counted.
      let result: SandboxResult;
      try {
        result = sandboxResult(answer);
      } catch (e) {
        const cell = (e as { result?: SandboxResult }).result?.session?.cell;
        if (cell !== undefined) this.nextCell = cell + 1;
        throw e;
      }
      if (result.session !== null) this.nextCell = result.session.cell + 1;
      return result;
    });
  }

  /** As Session.hibernate(), over HTTP (POST /v1/sessions/NAME/hibernate):
   * a SandboxError with httpStatus 404 when the token has no such session
   * here, 410 when it was lost. */
  hibernate(): Promise<number> {
    return this.turn(async () =>
      hibernated(
        await httpRequest(`${this.base}/v1/sessions/${this.name}/hibernate`, this.token, "{}"),
        this.name,
      ),
    );
  }

  /** Closes the session on the server: the next run() starts afresh.
   * SandboxError (not_found) when it has none open. */
  reset(): Promise<void> {
    return this.turn(async () => {
      this.nextCell = 1;
      await httpRequest(`${this.base}/v1/sessions/${this.name}`, this.token, undefined, undefined, "DELETE");
    });
  }

  /** Closes the session on the server once the cells asked for are done
   * (one already gone is no error). */
  close(): Promise<void> {
    if (this.closing) return this.tail.then(() => undefined);
    const closed = this.turn(async () => {
      try {
        await httpRequest(`${this.base}/v1/sessions/${this.name}`, this.token, undefined, undefined, "DELETE");
      } catch (e) {
        if (!(e instanceof SandboxError && e.code === "not_found")) throw e;
      }
    });
    this.closing = true;
    return closed;
  }

  private turn<T>(f: () => Promise<T>): Promise<T> {
    if (this.closing) return Promise.reject(new Error("the session is closed"));
    const t = this.tail.then(f);
    this.tail = t.catch(() => undefined);
    return t;
  }
}

/** The tool as a model API takes it. */
export interface ToolDefinition {
  readonly name: string;
  readonly description: string;
  readonly input_schema: Readonly<Record<string, unknown>>;
}

/** What the model is shown of a call; snake_case, as the model reads it. */
export interface ToolOutput {
  exit_code?: number | null;
  stdout?: string;
  stderr?: string;
  value?: string;
  exception?: { type: string; message: string };
  signal?: string;
  session?: unknown;
  files?: { name: string; size: number; truncated: boolean }[];
  error?: { code: string; message: string; limit?: string };
}

/**
 * run_python for a model: definition is the tool as a model API takes it
 * (name, description, input_schema), and call(arguments) runs one call and
 * resolves with what the model is shown, an object that JSON encodes. The
 * model gives code (and files, and with sessions a session_id); the limits
 * are the host's. A run stopped at one comes back as
 * {error: {code: "sandbox_limit_exceeded", limit, ...}} with the output it
 * wrote; arguments that are not the schema's as
 * {error: {code: "invalid_arguments", ...}}; a refusal of the server's as
 * its code. Nothing a call does rejects but a lost connection.
 */
export class RunPythonTool {
  readonly sandbox: PysbxSandbox;
  readonly limits: SandboxLimits | undefined;
  readonly sessions: boolean;
  readonly definition: ToolDefinition;
  private readonly open = new Map<string, Session | HttpSession>();

  constructor(sandbox: PysbxSandbox, limits?: SandboxLimits, options: { sessions?: boolean } = {}) {
    this.sandbox = sandbox;
    this.limits = limits;
    this.sessions = options.sessions ?? false;
    const props: Record<string, unknown> = {
      code: { type: "string", description: "Python 3 source code to run" },
      files: {
        type: "object",
        additionalProperties: { type: "string" },
        description: "Input files (name to text), written to the working directory before the code runs",
      },
    };
    if (this.sessions) {
      props.session_id = {
        type: "string",
        minLength: 1,
        maxLength: 128,
        description:
          "Run the code as the next cell of this session: variables, imports and files of the cells before it are there",
      };
    }
    const lim = limitsJson(limits) ?? {};
    const said =
      Object.keys(lim)
        .sort()
        .map((k) => `${k} ${String(lim[k])}`)
        .join(", ") || "the server's defaults";
    this.definition = {
      name: "run_python",
      description:
        "Runs Python 3 code in a fresh, isolated sandbox (no network, no host files) and returns its exit code, " +
        "stdout, stderr, the value of a last expression and the files it wrote. Limits: " +
        said +
        ".",
      input_schema: {
        type: "object",
        required: ["code"],
        properties: props,
        additionalProperties: false,
      },
    };
  }

  /** Runs one call of the model's. */
  async call(args: unknown): Promise<ToolOutput> {
    const known = new Set(["code", "files", ...(this.sessions ? ["session_id"] : [])]);
    const files = isObject(args) ? (args.files ?? {}) : undefined;
    if (
      !isObject(args) ||
      typeof args.code !== "string" ||
      Object.keys(args).some((k) => !known.has(k)) ||
      !isObject(files) ||
      !Object.values(files).every((v) => typeof v === "string") ||
      ("session_id" in args && typeof args.session_id !== "string")
    ) {
      return {
        error: {
          code: "invalid_arguments",
          message:
            'run_python takes {"code": string, "files": {name: text}}' + (this.sessions ? " and a session_id" : ""),
        },
      };
    }
    const code = args.code;
    const input = files as Record<string, string>;
    const sid = args.session_id as string | undefined;
    let r: SandboxResult;
    try {
      if (sid) {
        let session = this.open.get(sid);
        if (session === undefined) {
          session = this.sandbox.session(sid);
          this.open.set(sid, session);
        }
        r = await session.run(code, { limits: this.limits, files: input });
      } else {
        r = await this.sandbox.run(code, { limits: this.limits, files: input });
      }
    } catch (e) {
      if (e instanceof SandboxTimeoutError || e instanceof SandboxMemoryError) {
        const out = toolOutput(e.result);
        out.error = {
          code: "sandbox_limit_exceeded",
          limit: e.limit,
          message: `${e.code} (limit: ${e.limit}): ${e.message}; the output is what the code wrote before it was stopped`,
        };
        return out;
      }
      if (e instanceof SandboxError) return { error: { code: e.code, message: e.message } };
      throw e;
    }
    return toolOutput(r);
  }

  /** Closes the sessions the tool opened. */
  async close(): Promise<void> {
    const sessions = [...this.open.values()];
    this.open.clear();
    await Promise.all(sessions.map((s) => s.close()));
  }
}

function toolOutput(r: SandboxResult): ToolOutput {
  const out: ToolOutput = { exit_code: r.exitCode, stdout: r.stdout, stderr: r.stderr };
  if (r.value !== null) out.value = r.value;
  if (r.error !== null) out.exception = { type: r.error.type, message: r.error.message };
  if (r.signal) out.signal = r.signal;
  // The session as the server wrote it (name, cell, rolled_back).
  if (r.session !== null) out.session = r.raw.session;
  if (r.artifacts.length > 0) {
    out.files = r.artifacts.map((a) => ({ name: a.name, size: a.size, truncated: a.truncated }));
  }
  return out;
}
