#!/usr/bin/python3
"""A host tool call's round trip, as the sandboxed code sees it: the time
pysbx.tools.echo(x=i) takes inside one run, from the call to its return,
with the host answering through the Python client (clients/python) at once.
Over a UNIX socket (`pysbx serve --listen`) and over HTTP (`pysbx serve
--http` on loopback), interleaved run by run; a plain `print(1)` run over
each for scale.

  bench/tools.py build/pysbx                  # 5 runs of 200 calls per transport
  bench/tools.py build/pysbx --runs 1 --calls 20 --out DIR   # (the smoke test)

Writes DIR/tools.txt when --out is given."""
import argparse, json, os, re, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from pysbx_client import Client  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("pysbx")
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--calls", type=int, default=200, help="tool calls per run")
ap.add_argument("--out")
args = ap.parse_args()

CODE = f"""
import json, pysbx, time
ts = []
for i in range({args.calls}):
    t0 = time.perf_counter()
    assert pysbx.tools.echo(x=i) == i
    ts.append((time.perf_counter() - t0) * 1e3)
print(json.dumps(ts))
"""


def quantile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


work = tempfile.mkdtemp(prefix="pysbx-bench-tools-")
os.chmod(work, 0o711)
env = {**os.environ, "TMPDIR": work}
sock = os.path.join(work, "s.sock")
servers = [subprocess.Popen([args.pysbx, "serve", "--listen", sock], stdin=subprocess.DEVNULL,
                            env=env, stderr=subprocess.DEVNULL),
           subprocess.Popen([args.pysbx, "serve", "--http", "127.0.0.1:0"],
                            stdin=subprocess.DEVNULL, env=env, stderr=subprocess.PIPE, text=True)]
try:
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", servers[1].stderr.readline())
    if not m:
        sys.exit("the HTTP server did not start")
    for _ in range(600):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    clients = {"socket": Client(sock, timeout=120), "http": Client(m.group(1), timeout=120)}
    calls = {k: [] for k in clients}
    plain = {k: [] for k in clients}
    for c in clients.values():  # warm: the pools filled, the client's imports done
        c.run("print(1)")
    for _ in range(args.runs):
        for name, c in clients.items():
            r = c.run(CODE, tools={"echo": lambda x: x}, max_tool_calls=args.calls,
                      limits={"wall_seconds": 120})
            if r.status != "completed" or r.exit_code != 0:
                sys.exit(f"{name}: {r.status} {r.stderr[-500:]}")
            calls[name] += json.loads(r.stdout)
            t0 = time.perf_counter()
            c.run("print(1)")
            plain[name].append((time.perf_counter() - t0) * 1e3)
finally:
    for p in servers:
        p.terminate()
        p.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)

lines = [f"host tool round trip: {args.runs} runs x {args.calls} calls per transport, "
         "interleaved; measured inside the sandbox around each call, the host answering "
         "through the Python client at once", "",
         f"{'':28} {'min ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'n':>6}"]
for name in clients:
    v = calls[name]
    lines.append(f"{'tool call, ' + name:28} {min(v):8.3f} {quantile(v, 0.5):8.3f} "
                 f"{quantile(v, 0.99):8.3f} {len(v):6}")
for name in clients:
    v = plain[name]
    lines.append(f"{'plain run print(1), ' + name:28} {min(v):8.3f} {statistics.median(v):8.3f} "
                 f"{max(v):8.3f} {len(v):6}")
text = "\n".join(lines) + "\n"
print(text, end="")
if args.out:
    with open(os.path.join(args.out, "tools.txt"), "w") as f:
        f.write(text)
