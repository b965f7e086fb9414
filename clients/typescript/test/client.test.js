// Tests of pysbx-client through its public API (the package's own exports),
// against real servers this file starts and stops: pysbx serve on a UNIX
// socket, on HTTP loopback, and on HTTP loopback with a token.
// usage: PYSBX=PATH/TO/pysbx node --test test/*.test.js   (after npm run build)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import {
  ProtocolError,
  PysbxSandbox,
  SandboxError,
  SandboxMemoryError,
  SandboxTimeoutError,
} from "pysbx-client";

const PYSBX = path.resolve(process.env.PYSBX ?? "pysbx");
// Each test is bounded; the slowest sleeps a few seconds.
const T = { timeout: 60_000 };

/** Resolves once pred() holds; rejects when the server exits or time runs out. */
async function waitFor(pred, what, server, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  while (!(await pred())) {
    if (server.exited) throw new Error(`the server exited (${server.exited}) before ${what}:\n${server.log()}`);
    if (Date.now() > deadline) throw new Error(`no ${what} after ${seconds} s:\n${server.log()}`);
    await sleep(50);
  }
}

/**
 * pysbx serve with args ("{dir}" in them names its own temporary directory,
 * also its TMPDIR), stopped with SIGTERM (then SIGKILL).
 */
class Server {
  constructor(...args) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "pysbx-ts-client-"));
    fs.chmodSync(this.dir, 0o711); // the workers' uids pass through it
    this.logPath = path.join(this.dir, "serve.log");
    const fd = fs.openSync(this.logPath, "w");
    // Its output goes to a file: this process's stdout is the test report.
    this.proc = spawn(PYSBX, ["serve", ...args.map((a) => a.replaceAll("{dir}", this.dir))], {
      stdio: ["ignore", fd, fd],
      env: { ...process.env, TMPDIR: this.dir },
    });
    fs.closeSync(fd);
    this.exited = null;
    this.done = new Promise((resolve) => {
      this.proc.on("error", (e) => {
        this.exited = e.message;
        resolve();
      });
      this.proc.on("exit", (code, signal) => {
        this.exited = signal ?? `status ${code}`;
        resolve();
      });
    });
  }

  log() {
    try {
      return fs.readFileSync(this.logPath, "utf8").slice(-2000);
    } catch {
      return "";
    }
  }

  /** Resolves true once the server exited, false after ms. */
  async exitWithin(ms) {
    const timer = new AbortController();
    const late = sleep(ms, false, { signal: timer.signal }).catch(() => true);
    const exited = await Promise.race([this.done.then(() => true), late]);
    timer.abort(); // a pending timer would keep this process alive
    return exited;
  }

  async stop() {
    if (!this.exited) {
      this.proc.kill("SIGTERM");
      if (!(await this.exitWithin(30_000))) {
        this.proc.kill("SIGKILL");
        await this.exitWithin(10_000);
      }
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

async function unixServer(...more) {
  const server = new Server("--listen", "{dir}/s.sock", "--jobs", "4", ...more);
  const sock = path.join(server.dir, "s.sock");
  await waitFor(() => fs.existsSync(sock), "the socket", server);
  return { server, address: sock };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function canConnect(port) {
  return new Promise((resolve) => {
    const c = net.createConnection({ host: "127.0.0.1", port });
    c.setTimeout(1000);
    c.on("connect", () => {
      c.destroy();
      resolve(true);
    });
    c.on("error", () => resolve(false));
    c.on("timeout", () => {
      c.destroy();
      resolve(false);
    });
  });
}

async function httpServer(...more) {
  const port = await freePort();
  const server = new Server("--http", `127.0.0.1:${port}`, "--jobs", "4", ...more);
  await waitFor(() => canConnect(port), "the HTTP port", server);
  return { server, address: `http://127.0.0.1:${port}` };
}

let clockTicks = 100;
try {
  clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
} catch {
  // /proc counts in USER_HZ, 100 on Linux unless getconf says otherwise.
}

/** User and system seconds of every live process below pid. */
function descendantsCpu(pid) {
  const kids = new Map();
  for (const d of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let fields;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, "utf8");
      fields = stat.slice(stat.lastIndexOf(")") + 1).trim().split(/\s+/);
    } catch {
      continue; // gone meanwhile
    }
    const parent = Number(fields[1]);
    if (!kids.has(parent)) kids.set(parent, []);
    kids.get(parent).push([Number(d), fields]);
  }
  let total = 0;
  const todo = [pid];
  while (todo.length > 0) {
    for (const [child, fields] of kids.get(todo.pop()) ?? []) {
      total += (Number(fields[11]) + Number(fields[12])) / clockTicks;
      todo.push(child);
    }
  }
  return total;
}

const bytes = (...b) => Uint8Array.from(b);
const range256 = Uint8Array.from({ length: 256 }, (_, i) => i);

/** The same checks over either transport; ctx.sandbox and ctx.server are set by before(). */
function common(ctx, over) {
  test(`${over}: a run completes with its output, value and exit code`, T, async () => {
    const r = await ctx.sandbox.run("print(6 * 7)");
    assert.equal(r.status, "completed");
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "42\n");
    assert.equal(r.stderr, "");
    assert.equal(r.ok, true);
    assert.equal(r.value, null); // print() is a call whose value is None: none shown
    assert.equal(r.error, null);
    assert.equal(typeof r.stats.wallMs, "number");
    const v = await ctx.sandbox.run("x = 6\nx * 7");
    assert.equal(v.stdout, "");
    assert.equal(v.value, "42");
  });

  test(`${over}: text and binary files in, artifacts out`, T, async () => {
    const r = await ctx.sandbox.run(
      "open('out.bin', 'wb').write(bytes(range(256)))\n" +
        "open('echo.bin', 'wb').write(open('in.bin', 'rb').read()[::-1])\n" +
        "print(open('a.txt').read())",
      { files: { "a.txt": "h\u00e9", "in.bin": bytes(0, 1, 255) } },
    );
    assert.equal(r.status, "completed", r.stderr);
    assert.equal(r.stdout, "h\u00e9\n");
    assert.deepEqual(
      r.artifacts.map((a) => a.name),
      ["echo.bin", "out.bin"],
    );
    const [echo, out] = r.artifacts;
    assert.ok(out.content instanceof Uint8Array);
    assert.deepEqual(out.content, range256);
    assert.equal(out.size, 256);
    assert.equal(out.truncated, false);
    assert.deepEqual(echo.content, bytes(255, 1, 0));
  });

  test(`${over}: stdin, argv and a file name reach the program`, T, async () => {
    let r = await ctx.sandbox.run("import sys\nprint(input(), sys.argv[1:], repr(sys.stdin.read()))", {
      stdin: "x\n\u00e9",
      argv: ["a", "-b"],
    });
    assert.equal(r.stdout, "x ['a', '-b'] '\u00e9'\n");
    r = await ctx.sandbox.run("import sys\nprint(sys.stdin.buffer.read())", { stdin: bytes(0xff, 0) });
    assert.equal(r.stdout, "b'\\xff\\x00'\n");
    r = await ctx.sandbox.run("import sys\nprint(sys.argv, __file__)\n1/0", { filename: "job.py" });
    assert.equal(r.stdout, "['job.py'] job.py\n");
    assert.match(r.error.traceback, /File "job\.py", line 3/);
  });

  test(`${over}: an exception comes back as the result's error`, T, async () => {
    const r = await ctx.sandbox.run("raise ValueError('boom')");
    assert.equal(r.status, "completed");
    assert.equal(r.exitCode, 1);
    assert.equal(r.ok, false);
    assert.equal(r.error.type, "ValueError");
    assert.equal(r.error.message, "boom");
    assert.match(r.error.traceback, /ValueError: boom/);
    assert.match(r.stderr, /ValueError: boom/);
    const exit = await ctx.sandbox.run("import sys\nsys.exit(3)");
    assert.equal(exit.exitCode, 3);
    assert.equal(exit.error, null);
  });

  test(`${over}: output and artifact limits cut, and say so`, T, async () => {
    let r = await ctx.sandbox.run("print('x' * 50)", { limits: { maxOutputChars: 10 } });
    assert.equal(r.stdoutTruncated, true);
    r = await ctx.sandbox.run("open('big', 'wb').write(b'y' * 100)", { limits: { maxArtifactBytes: 10 } });
    assert.equal(r.artifacts[0].size, 100);
    assert.equal(r.artifacts[0].truncated, true);
    assert.deepEqual(r.artifacts[0].content, new Uint8Array(10).fill(0x79));
  });

  test(`${over}: the wall limit rejects with the output written before`, T, async () => {
    await assert.rejects(
      ctx.sandbox.run("import time\nprint('started', flush=True)\ntime.sleep(30)", {
        limits: { wallSeconds: 0.5 },
      }),
      (e) => {
        assert.ok(e instanceof SandboxTimeoutError);
        assert.ok(e instanceof SandboxError);
        assert.equal(e.code, "timeout");
        assert.equal(e.limit, "wall");
        assert.equal(e.result.status, "timeout");
        assert.equal(e.result.stdout, "started\n");
        return true;
      },
    );
  });

  test(`${over}: the CPU limit rejects with limit cpu`, T, async () => {
    await assert.rejects(
      ctx.sandbox.run("while True: pass", { limits: { cpuSeconds: 0.3, wallSeconds: 10 } }),
      (e) => e instanceof SandboxTimeoutError && e.limit === "cpu",
    );
  });

  test(`${over}: the memory limit rejects with SandboxMemoryError`, T, async () => {
    await assert.rejects(
      ctx.sandbox.run("print('before', flush=True)\nx = bytearray(512 << 20)", {
        limits: { memoryBytes: 64 << 20 },
      }),
      (e) => {
        assert.ok(e instanceof SandboxMemoryError);
        assert.equal(e.code, "memory_limit");
        assert.equal(e.limit, "memory");
        assert.equal(e.result.stdout, "before\n");
        return true;
      },
    );
  });

  test(`${over}: a refusal rejects with the server's stable code`, T, async () => {
    await assert.rejects(ctx.sandbox.run("pass", { limits: { wallSeconds: -1 } }), (e) => {
      assert.ok(e instanceof SandboxError);
      assert.ok(!(e instanceof SandboxTimeoutError));
      assert.equal(e.code, "invalid_limit");
      assert.equal(e.httpStatus, over === "HTTP" ? 400 : undefined);
      return true;
    });
    await assert.rejects(ctx.sandbox.run("pass", { limits: { wall_secs: 1 } }), { code: "invalid_limit" });
    await assert.rejects(ctx.sandbox.run("pass", { files: { "../x": "x" } }), { code: "invalid_file" });
  });

  test(`${over}: an aborted run rejects and stops using CPU`, T, async () => {
    const controller = new AbortController();
    const run = ctx.sandbox.run("while True: pass", {
      limits: { cpuSeconds: 60, wallSeconds: 60 },
      signal: controller.signal,
    });
    await sleep(1000);
    controller.abort();
    await assert.rejects(run, (e) => e === controller.signal.reason);
    await sleep(500); // the server's answer to the hang-up
    const pid = ctx.server.proc.pid;
    const before = descendantsCpu(pid);
    await sleep(1000);
    const used = descendantsCpu(pid) - before;
    assert.ok(used < 0.3, `a busy loop went on after its run was aborted (${used} s of CPU in 1 s)`);
    assert.equal((await ctx.sandbox.run("print(1)")).stdout, "1\n");
    // A signal aborted before the call: nothing is sent.
    await assert.rejects(ctx.sandbox.run("pass", { signal: AbortSignal.abort("never mind") }), (e) => e === "never mind");
  });

  test(`${over}: many runs at once`, T, async () => {
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => ctx.sandbox.run(`print(${i} * 3)`)));
    assert.deepEqual(
      results.map((r) => r.stdout),
      Array.from({ length: 6 }, (_, i) => `${i * 3}\n`),
    );
  });

  test(`${over}: the run_python tool`, T, async () => {
    const tool = ctx.sandbox.runPythonTool({ wallSeconds: 0.5 });
    const def = tool.definition;
    assert.equal(def.name, "run_python");
    assert.match(def.description, /wall_seconds 0\.5/);
    assert.equal(def.input_schema.type, "object");
    assert.deepEqual(def.input_schema.required, ["code"]);
    assert.equal(def.input_schema.additionalProperties, false);
    assert.deepEqual(Object.keys(def.input_schema.properties), ["code", "files"]);
    let out = await tool.call({ code: "print(open('a').read())\n2 + 3", files: { a: "x" } });
    assert.deepEqual(out, { exit_code: 0, stdout: "x\n", stderr: "", value: "5" });
    out = await tool.call({ code: "open('o.txt', 'w').write('hi')\n{}['k']" });
    assert.equal(out.exit_code, 1);
    assert.deepEqual(out.exception, { type: "KeyError", message: "'k'" });
    assert.deepEqual(out.files, [{ name: "o.txt", size: 2, truncated: false }]);
    out = await tool.call({ code: "import time\nprint('so far', flush=True)\ntime.sleep(9)" });
    assert.equal(out.error.code, "sandbox_limit_exceeded");
    assert.equal(out.error.limit, "wall");
    assert.equal(out.stdout, "so far\n");
    // The model cannot raise the host's limits: there is no such argument.
    out = await tool.call({ code: "pass", limits: { wall_seconds: 100 } });
    assert.equal(out.error.code, "invalid_arguments");
    assert.equal((await tool.call({ code: 1 })).error.code, "invalid_arguments");
    assert.equal((await tool.call({ code: "pass", files: { a: 1 } })).error.code, "invalid_arguments");
    assert.equal((await tool.call({ code: "pass", session_id: "s" })).error.code, "invalid_arguments");
    assert.equal((await tool.call("print(1)")).error.code, "invalid_arguments");
    // A refusal of the server's comes back as its code, for the model to read.
    out = await ctx.sandbox.runPythonTool().call({ code: "pass", files: { "../x": "x" } });
    assert.equal(out.error.code, "invalid_file");
  });
}

describe("over a UNIX socket", () => {
  const ctx = {};
  before(async () => {
    const { server, address } = await unixServer();
    ctx.server = server;
    ctx.address = address;
    ctx.sandbox = new PysbxSandbox(address);
  });
  after(async () => {
    await ctx.server?.stop();
  });

  common(ctx, "socket");

  sessionKeepsState(ctx, "socket");

  test("socket: an aborted cell ends its session; the next starts a new one", T, async () => {
    const s = ctx.sandbox.session("ab");
    try {
      await s.run("kept = 1");
      const controller = new AbortController();
      const cell = s.run("while True: pass", { limits: { cpuSeconds: 60, wallSeconds: 60 }, signal: controller.signal });
      await sleep(500);
      controller.abort();
      await assert.rejects(cell, (e) => e === controller.signal.reason);
      const r = await s.run("print('kept' in globals())");
      assert.equal(r.stdout, "False\n");
      assert.equal(r.session.cell, 1);
    } finally {
      await s.close();
    }
  });

  test("socket: sessions of two connections are apart; resetting one never opened is refused", T, async () => {
    const a = ctx.sandbox.session("same");
    const b = ctx.sandbox.session("same");
    try {
      await a.run("who = 'a'");
      await b.run("who = 'b'");
      assert.equal((await a.run("print(who)")).stdout, "a\n");
      assert.equal((await b.run("print(who)")).stdout, "b\n");
    } finally {
      await a.close();
      await b.close();
    }
    const c = ctx.sandbox.session();
    try {
      await assert.rejects(c.reset(), (e) => e instanceof SandboxError && e.code === "invalid_request");
    } finally {
      await c.close();
    }
  });

  test("socket: the run_python tool with sessions", T, async () => {
    const tool = ctx.sandbox.runPythonTool(undefined, { sessions: true });
    assert.ok("session_id" in tool.definition.input_schema.properties);
    assert.match(tool.definition.description, /the server's defaults/);
    try {
      await tool.call({ code: "n = 41", session_id: "t" });
      const out = await tool.call({ code: "n + 1", session_id: "t" });
      assert.equal(out.value, "42");
      assert.deepEqual(out.session, { name: "t", cell: 2, rolled_back: false });
    } finally {
      await tool.close();
    }
  });

  test("socket: a token is for HTTP; no server rejects", T, async () => {
    assert.throws(() => new PysbxSandbox(ctx.address, { token: "t" }));
    const none = new PysbxSandbox(path.join(ctx.server.dir, "nothing.sock"));
    await assert.rejects(none.run("pass"), { code: "ENOENT" });
  });

  test("socket: an answer that is not one rejects with ProtocolError", T, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pysbx-ts-fake-"));
    const answers = ["not json\n", "", '{"id": 99, "status": "completed"}\n', '{"status": "completed", "artifacts": [{}]}\n'];
    const fake = net.createServer((c) => {
      c.on("data", () => {});
      c.on("end", () => c.end(answers.shift()));
    });
    await new Promise((resolve) => fake.listen(path.join(dir, "fake.sock"), resolve));
    try {
      const sandbox = new PysbxSandbox(path.join(dir, "fake.sock"));
      for (const what of [/not JSON/, /without an answer/, /for id 99/, /name is not a string/]) {
        await assert.rejects(sandbox.run("pass"), (e) => e instanceof ProtocolError && what.test(e.message));
      }
    } finally {
      await new Promise((resolve) => fake.close(resolve));
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Lines a server may send that are no answer, or that hold what a client
// cannot take as it is (nesting a recursive printer cannot show, fields of
// the wrong type): each rejects with ProtocolError or SandboxError, or
// resolves, whether a run's or a session cell's; nothing else, no hang.
describe("hostile lines", () => {
  const deep = (n) => "[".repeat(n) + "]".repeat(n);
  const lines = [
    deep(100_000),
    `{"id": 1, "status": ${deep(100_000)}}`,
    `{"id": ${deep(100_000)}, "status": "completed"}`,
    `{"id": 1, "error": ${deep(100_000)}}`,
    `{"id": 1, "error": {"code": ${deep(100_000)}, "message": "m"}}`,
    `{"id": 1, "status": "completed", "error": ${deep(100_000)}}`,
    `{"id": 1, "status": "completed", "session": ${deep(100_000)}}`,
    `{"id": 1, "session_closed": ${deep(100_000)}}`,
    '{"id": 1, "status": "completed", "artifacts": "abc"}',
    '{"id": 1, "status": "completed", "stats": 5}',
    "1".repeat(5000),
    "\xff\xfe",
    "null",
  ];
  test("each rejects with ProtocolError or SandboxError, or resolves", T, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pysbx-ts-hostile-"));
    let line = "";
    const fake = net.createServer((c) => {
      c.on("error", () => {});
      c.once("data", () => c.end(line + "\n"));
    });
    await new Promise((resolve) => fake.listen(path.join(dir, "fake.sock"), resolve));
    try {
      const sandbox = new PysbxSandbox(path.join(dir, "fake.sock"));
      for (line of lines) {
        for (const [what, call] of [
          ["run", () => sandbox.run("pass")],
          ["cell", async () => {
            const s = sandbox.session("s");
            try {
              return await s.run("pass");
            } finally {
              await s.close();
            }
          }],
          ["reset", async () => {
            const s = sandbox.session("s");
            try {
              return await s.reset();
            } finally {
              await s.close();
            }
          }],
        ]) {
          try {
            await call();
          } catch (e) {
            if (!(e instanceof ProtocolError || e instanceof SandboxError)) {
              assert.fail(`${what}: ${e?.constructor?.name}: ${String(e?.message).slice(0, 120)} ` +
                          `from ${line.slice(0, 40)}...`);
            }
          }
        }
      }
    } finally {
      await new Promise((resolve) => fake.close(resolve));
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Through either transport: a session's cells, rollback, reset, close.
function sessionKeepsState(ctx, over) {
  test(`${over}: a session keeps state, rolls back a stopped cell, resets and closes`, T, async () => {
    const s = ctx.sandbox.session("nb");
    try {
      let r = await s.run("rows = [1, 2]\nopen('f.txt', 'w').write('kept')");
      assert.deepEqual(r.session, { name: "nb", cell: 1, rolledBack: false });
      r = await s.run("rows.append(3)\nraise ValueError('no')");
      assert.equal(r.exitCode, 1);
      assert.equal(r.error.type, "ValueError");
      assert.equal(r.session.rolledBack, true);
      assert.equal((await s.run("print(rows, open('f.txt').read())")).stdout, "[1, 2] kept\n");
      // A cell stopped at a limit rejects; its result says it was rolled back.
      await assert.rejects(
        s.run("rows.append(3)\nimport time\ntime.sleep(9)", { limits: { wallSeconds: 0.5 } }),
        (e) => e instanceof SandboxTimeoutError && e.result.session.rolledBack === true,
      );
      assert.equal((await s.run("print(rows)")).stdout, "[1, 2]\n");
      r = await s.run("rows.append(3)\nraise ValueError('no')", { rollback: "on_stop" });
      assert.equal(r.session.rolledBack, false);
      assert.equal((await s.run("print(rows)")).stdout, "[1, 2, 3]\n");
      // Cells asked for at once run one at a time, in order.
      const cells = await Promise.all([s.run("n = 1"), s.run("n += 1"), s.run("n * 10")]);
      assert.equal(cells[2].value, "20");
      assert.deepEqual(
        cells.map((c) => c.session.cell),
        [cells[0].session.cell, cells[0].session.cell + 1, cells[0].session.cell + 2],
      );
      await s.reset();
      r = await s.run("print('rows' in globals())", { argv: ["x"] });
      assert.equal(r.stdout, "False\n");
      assert.equal(r.session.cell, 1);
      await assert.rejects(s.run("pass", { rollback: "sometimes" }), { code: "invalid_request" });
    } finally {
      await s.close();
    }
    await assert.rejects(s.run("pass"), /the session is closed/);
  });
}

describe("over HTTP", () => {
  const ctx = {};
  before(async () => {
    const { server, address } = await httpServer();
    ctx.server = server;
    ctx.sandbox = new PysbxSandbox(address);
  });
  after(async () => {
    await ctx.server?.stop();
  });

  common(ctx, "HTTP");

  sessionKeepsState(ctx, "HTTP");

  test("HTTP: a session is the token's, by name; its cells are numbered", T, async () => {
    const a = ctx.sandbox.session("shared");
    await a.run("n = 1");
    // Another client takes it up at cell 2.
    const b = new PysbxSandbox(ctx.sandbox.address).session("shared", 2);
    assert.equal((await b.run("n += 1\nprint(n)")).stdout, "2\n");
    // |a| still expects cell 2: told the session is lost, never run in a
    // state it did not see; its next cell starts a new one.
    await assert.rejects(a.run("print(n)"), { code: "session_lost", httpStatus: 410 });
    const r = await a.run("print('n' in globals())");
    assert.equal(r.stdout, "False\n");
    assert.equal(r.session.cell, 1);
    await a.close();
    await a.close();
    await assert.rejects(b.run("print(n)"), { code: "session_lost" });
    await b.close();
    assert.throws(() => ctx.sandbox.session("a/b"), /A-Z a-z 0-9/);
  });
});

// Hibernation (pysbx serve --state-dir): the session written to disk, its
// processes ended, and restored by its next cell, over either transport;
// a server that keeps no images refuses.
describe("hibernation", () => {
  const ctx = {};
  before(async () => {
    ctx.unix = await unixServer("--state-dir", "{dir}/state");
    ctx.http = await httpServer("--state-dir", "{dir}/state");
  });
  after(async () => {
    await ctx.unix?.server.stop();
    await ctx.http?.server.stop();
  });

  for (const over of ["unix", "http"]) {
    test(`${over}: a hibernated session comes back with its state at its next cell`, T, async () => {
      const s = new PysbxSandbox(ctx[over].address).session("sleeper");
      try {
        await s.run("kept = 7\nopen('f.txt', 'w').write('on disk')");
        const bytes = await s.hibernate();
        assert.ok(Number.isInteger(bytes) && bytes > 0, `the image's bytes: ${bytes}`);
        const r = await s.run("print(kept, open('f.txt').read())");
        assert.equal(r.stdout, "7 on disk\n");
        assert.equal(r.session.cell, 2);
      } finally {
        await s.close();
      }
    });
  }

  test("a server without --state-dir refuses; over HTTP an unknown session is a 404", T, async () => {
    const plain = await unixServer();
    try {
      const s = new PysbxSandbox(plain.address).session("nowhere");
      try {
        await s.run("x = 1");
        await assert.rejects(s.hibernate(), (e) => e instanceof SandboxError && e.code === "invalid_request");
        assert.equal((await s.run("print(x)")).stdout, "1\n");
      } finally {
        await s.close();
      }
    } finally {
      await plain.server.stop();
    }
    const h = new PysbxSandbox(ctx.http.address).session("never-opened");
    await assert.rejects(h.hibernate(), (e) => e instanceof SandboxError && e.httpStatus === 404);
    await h.close();
  });
});

describe("over HTTP with a token", () => {
  const ctx = {};
  const token = "s3cret-" + process.pid;
  before(async () => {
    const tokenDir = fs.mkdtempSync(path.join(os.tmpdir(), "pysbx-ts-token-"));
    ctx.tokenDir = tokenDir;
    fs.writeFileSync(path.join(tokenDir, "token"), token, { mode: 0o600 });
    const { server, address } = await httpServer("--http-token-file", path.join(tokenDir, "token"));
    ctx.server = server;
    ctx.address = address;
  });
  after(async () => {
    await ctx.server?.stop();
    if (ctx.tokenDir) fs.rmSync(ctx.tokenDir, { recursive: true, force: true });
  });

  test("HTTP token: the right token runs; none, or a wrong one, is a 401", T, async () => {
    const r = await new PysbxSandbox(ctx.address, { token }).run("print('in')");
    assert.equal(r.stdout, "in\n");
    for (const sandbox of [new PysbxSandbox(ctx.address), new PysbxSandbox(ctx.address, { token: "wrong" })]) {
      await assert.rejects(sandbox.run("print('in')"), (e) => {
        assert.ok(e instanceof SandboxError);
        assert.equal(e.httpStatus, 401);
        assert.equal(e.code, "unauthorized");
        return true;
      });
    }
  });
});
