// The MCP server as an agent host sees it, through the official TypeScript
// SDK client: list the tools, call run_python with code, with files, with an
// exception, with a CPU spin, with an image artifact, in a session (state
// kept, a failing cell rolled back, reset_session); then a server with the
// vetted packages, whose matplotlib figures come back as images.
// usage: node client.mjs PATH/TO/pysbx
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const pysbx = process.argv[2];
const transport = new StdioClientTransport({
  command: pysbx,
  args: ["mcp", "--cpu", "1", "--wall", "5"],
  stderr: "inherit",
});
const client = new Client({ name: "pysbx-test", version: "1.0.0" });
await client.connect(transport);
let failures = 0;

async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.message}`);
  }
}

const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
const call = (args) => client.callTool({ name: "run_python", arguments: args });

await check("server info", async () => {
  assert.equal(client.getServerVersion().name, "pysbx");
});

await check("tools/list offers run_python and reset_session with their schemas", async () => {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name), ["run_python", "reset_session"]);
  assert.deepEqual(tools[0].inputSchema.required, ["code"]);
  assert.equal(tools[0].inputSchema.properties.code.type, "string");
  assert.equal(tools[0].inputSchema.properties.files.type, "object");
  assert.equal(tools[0].inputSchema.properties.session_id.type, "string");
  assert.deepEqual(tools[0].inputSchema.properties.rollback.enum, ["on_error", "on_stop", "never"]);
  assert.match(tools[0].description, /1 s of CPU/);
  assert.match(tools[0].description, /session_id/);
  assert.deepEqual(tools[1].inputSchema.required, ["session_id"]);
});

await check("code runs", async () => {
  const r = await call({ code: "print(6 * 7)" });
  assert.equal(r.isError, false);
  assert.match(text(r), /exit_code: 0/);
  assert.match(text(r), /stdout:\n42\n/);
});

await check("output as it is written: progress notifications, the SDK's onprogress", async () => {
  const seen = [];
  const t0 = Date.now();
  const code =
    "import sys, time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n" +
    "print('err', file=sys.stderr)";
  const r = await client.callTool({ name: "run_python", arguments: { code } }, undefined, {
    onprogress: (p) => seen.push({ at: Date.now() - t0, ...p }),
  });
  const done = Date.now() - t0;
  assert.equal(r.isError, false);
  // The server sends every notification before the answer (mcp_raw.py checks
  // the bytes); the SDK runs notification handlers a microtask later than it
  // settles a response, so one that arrives in the same read as the answer
  // may find its handler gone. What it did deliver is a prefix, in order.
  assert.ok("tick 0\ntick 1\ntick 2\nerr\n".startsWith(seen.map((p) => p.message).join("")),
    JSON.stringify(seen));
  assert.deepEqual(seen.map((p) => p.progress), seen.map((_, i) => i + 1));
  const ticks = seen.filter((p) => p.message.startsWith("tick")).map((p) => p.at);
  assert.ok(ticks.length >= 2, JSON.stringify(seen));
  assert.ok(ticks[1] - ticks[0] > 250, JSON.stringify(seen));
  assert.ok(done - ticks[0] > 700, JSON.stringify({ seen, done }));
  assert.match(text(r), /stdout:\ntick 0\ntick 1\ntick 2\n/);
});

await check("input files", async () => {
  const r = await call({
    code: "import csv\nrows = list(csv.reader(open('data/in.csv')))\nprint(len(rows), rows[1])",
    files: { "data/in.csv": "a,b\n1,2\n" },
  });
  assert.equal(r.isError, false);
  assert.match(text(r), /2 \['1', '2'\]/);
});

await check("an exception is an error result with its traceback", async () => {
  const r = await call({ code: "def f():\n    raise ValueError('boom')\nf()" });
  assert.equal(r.isError, true);
  assert.match(text(r), /exit_code: 1 \(an uncaught exception: ValueError: boom\)/);
  assert.match(text(r), /ValueError: boom/);
  assert.match(text(r), /raise ValueError\('boom'\)/);
});

await check("stdin and argv reach the program", async () => {
  const r = await call({ code: "import sys\nprint(input(), sys.argv[1:])", stdin: "hi\n", argv: ["a", "-b"] });
  assert.equal(r.isError, false);
  assert.match(text(r), /hi \['a', '-b'\]/);
  const none = await call({ code: "input()" });
  assert.match(text(none), /an uncaught exception: EOFError/);
});

await check("a CPU spin is stopped: sandbox_limit_exceeded, cpu", async () => {
  const r = await call({ code: "print('spinning', flush=True)\nwhile True: pass" });
  assert.equal(r.isError, true);
  assert.match(text(r), /sandbox_limit_exceeded: timeout \(limit: cpu\)/);
  assert.match(text(r), /spinning/);
});

await check("files written come back: images as images, others as resources", async () => {
  const code = [
    "import zlib, struct",
    "def chunk(t, d):",
    "    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))",
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))",
    "png += chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')",
    "open('plot.png', 'wb').write(png)",
    "open('summary.csv', 'w').write('a,b\\n1,2\\n')",
  ].join("\n");
  const r = await call({ code });
  assert.equal(r.isError, false);
  const image = r.content.find((c) => c.type === "image");
  assert.ok(image, "an image content");
  assert.equal(image.mimeType, "image/png");
  assert.equal(Buffer.from(image.data, "base64").subarray(1, 4).toString(), "PNG");
  const res = r.content.find((c) => c.type === "resource");
  assert.ok(res, "a resource content");
  assert.equal(res.resource.mimeType, "text/csv");
  assert.equal(res.resource.text, "a,b\n1,2\n");
  assert.match(res.resource.uri, /summary\.csv$/);
});

await check("no network", async () => {
  const r = await call({
    code: "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n" +
      "except OSError as e:\n    print('refused', type(e).__name__)",
  });
  assert.match(text(r), /refused/);
});

await check("calls run concurrently and each gets its own answer", async () => {
  const rs = await Promise.all([1, 2, 3, 4].map((i) => call({ code: `print(${i} * 11)` })));
  rs.forEach((r, i) => assert.match(text(r), new RegExp(`stdout:\\n${(i + 1) * 11}\\n`)));
});

await check("the last expression's value comes back as text", async () => {
  const r = await call({ code: "x = 6\nx * 7" });
  assert.equal(r.isError, false);
  assert.match(text(r), /value:\n42/);
  assert.doesNotMatch(text(r), /stdout:/);
});

const sessionLine = (r) => text(r).split("\n").find((l) => l.startsWith("session: "));

await check("a session keeps state across calls; a failing cell is rolled back", async () => {
  let r = await call({ session_id: "nb", code: "import csv, io\nrows = [1, 2, 3]\ntotal = sum(rows)" });
  assert.equal(r.isError, false, text(r));
  assert.equal(sessionLine(r), "session: nb, cell 1, kept");
  r = await call({ session_id: "nb", code: "rows = [r * 10 for r in rows]\ntotal = rows[7]" });
  assert.equal(r.isError, true);
  assert.match(text(r), /IndexError/);
  assert.match(sessionLine(r), /^session: nb, cell 2, rolled back/);
  r = await call({ session_id: "nb", code: "rows = [r * 10 for r in rows]\nprint(rows, sum(rows))" });
  assert.equal(r.isError, false, text(r));
  assert.match(text(r), /stdout:\n\[10, 20, 30\] 60\n/);
  assert.equal(sessionLine(r), "session: nb, cell 3, kept");
});

await check("a call without session_id sees nothing of a session", async () => {
  const r = await call({ code: "print('rows' in globals())" });
  assert.match(text(r), /stdout:\nFalse\n/);
  assert.equal(sessionLine(r), undefined);
});

await check("reset_session closes it: the next call starts afresh", async () => {
  let r = await client.callTool({ name: "reset_session", arguments: { session_id: "nb" } });
  assert.equal(r.isError, false, text(r));
  assert.match(text(r), /nb closed/);
  r = await call({ session_id: "nb", code: "print('rows' in globals())" });
  assert.match(text(r), /stdout:\nFalse\n/);
  assert.equal(sessionLine(r), "session: nb, cell 1, kept");
});

await check("reset_session of an unknown id is a tool error", async () => {
  const r = await client.callTool({ name: "reset_session", arguments: { session_id: "nope" } });
  assert.equal(r.isError, true);
  assert.match(text(r), /no open session is called "nope"/);
});

await check("rollback on_stop keeps what ran before an exception", async () => {
  let r = await call({ session_id: "st", rollback: "on_stop", code: "y = 1\nraise ValueError('after y')" });
  assert.equal(r.isError, true);
  assert.equal(sessionLine(r), "session: st, cell 1, kept");
  r = await call({ session_id: "st", code: "print(y)" });
  assert.match(text(r), /stdout:\n1\n/);
});

await check("a bad rollback is refused as invalid params", async () => {
  await assert.rejects(
    call({ session_id: "st", rollback: "sometimes", code: "pass" }),
    /on_error/,
  );
});

await client.close();

// A server with the vetted packages: a matplotlib chart the code leaves open
// comes back as an image the client can decode.
const charts = new Client({ name: "pysbx-test-charts", version: "1.0.0" });
await charts.connect(new StdioClientTransport({
  command: pysbx,
  args: ["mcp", "--packages", "pandas,matplotlib", "--wall", "20"],
  stderr: "inherit",
}));

await check("with packages, the tool says what it has", async () => {
  const { tools } = await charts.listTools();
  assert.match(tools[0].description, /pandas, matplotlib \(already imported\)/);
});

await check("an open matplotlib figure comes back as image content", async () => {
  const r = await charts.callTool({
    name: "run_python",
    arguments: {
      code: "import pandas as pd, matplotlib.pyplot as plt\n" +
        "df = pd.DataFrame({'x': range(10), 'y': [v * v for v in range(10)]})\n" +
        "df.plot(x='x', y='y', title='squares')\n" +
        "print(df.y.sum())",
    },
  });
  assert.equal(r.isError, false, text(r));
  assert.match(text(r), /stdout:\n285\n/);
  assert.match(text(r), /file figure-1\.png/);
  const images = r.content.filter((c) => c.type === "image");
  assert.equal(images.length, 1);
  assert.equal(images[0].mimeType, "image/png");
  const png = Buffer.from(images[0].data, "base64");
  assert.equal(png.subarray(1, 4).toString(), "PNG");
  // IHDR: width and height of matplotlib's default figure at 100 dpi.
  assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [640, 480]);
});

await charts.close();
console.log(`${failures} failure(s)`);
process.exit(failures ? 1 : 0);
