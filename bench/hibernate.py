#!/usr/bin/python3
"""Hibernation through the server, as a client sees it: `pysbx serve
--listen SOCK --state-dir DIR` (the directory on this machine's disk), a
session that ran a small cell, or one that wrote 100 MB (every page of a
bytearray); the time from sending session_hibernate to its answer, and,
after a pause, from sending the next cell to its answer (the restore and
the cell). Alternating, each session made afresh, a 50 ms pause before
each timed request; a cell of a session that stays open for scale.

  bench/hibernate.py build/pysbx                  # 10 rounds of each
  bench/hibernate.py build/pysbx --rounds 3 --out DIR

Writes DIR/hibernate.txt when --out is given."""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("pysbx")
ap.add_argument("--rounds", type=int, default=10)
ap.add_argument("--out")
args = ap.parse_args()

STATES = {"small": "small = []",
          "100 MB": "b = bytearray(b'x') * (100 * 1000 * 1000)\nsmall = []"}
PAUSE = 0.05

work = tempfile.mkdtemp(prefix="pysbx-hibernate-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
sock_path = os.path.join(work, "s.sock")
srv = subprocess.Popen([args.pysbx, "serve", "--listen", sock_path, "--state-dir",
                        os.path.join(work, "state"), "--jobs", "2"], stderr=subprocess.DEVNULL)
try:
    for _ in range(600):
        if os.path.exists(sock_path):
            break
        time.sleep(0.05)
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    f = s.makefile("rwb")
    ids = iter(range(1, 1 << 30))

    def ask(msg):
        msg["id"] = next(ids)
        t0 = time.perf_counter()
        f.write(json.dumps(msg).encode() + b"\n")
        f.flush()
        a = json.loads(f.readline())
        ms = (time.perf_counter() - t0) * 1e3
        if "error" in a and "status" not in a:
            raise SystemExit(f"refused: {a}")
        return a, ms

    times = {(k, w): [] for k in STATES for w in ("hibernate", "first cell after")}
    sizes = {k: 0 for k in STATES}
    open_cell = []
    for i in range(args.rounds):
        for j, kind in enumerate(STATES if i % 2 == 0 else reversed(list(STATES))):
            name = f"{kind[0]}{i}{j}"
            a, _ = ask({"session": name, "code": STATES[kind],
                        "limits": {"memory_bytes": 1 << 30}})
            time.sleep(PAUSE)
            a, ms = ask({"session_hibernate": name})
            times[(kind, "hibernate")].append(ms)
            sizes[kind] = a["session_hibernated"]["bytes"]
            time.sleep(PAUSE)
            a, ms = ask({"session": name, "code": "small.append(len(small))"})
            if not a.get("session", {}).get("restored"):
                raise SystemExit(f"not restored: {a}")
            times[(kind, "first cell after")].append(ms)
            time.sleep(PAUSE)
            a, ms = ask({"session": name, "code": "small.append(len(small))"})
            open_cell.append(ms)
            ask({"session_close": name})
    s.close()
finally:
    srv.terminate()
    srv.wait(timeout=60)
    shutil.rmtree(work, True)

lines = [f"uptime: {open('/proc/loadavg').read().split()[:3]} (1, 5, 15 min load)",
         f"{args.rounds} rounds; images: " +
         ", ".join(f"{k} {sizes[k] / 1e6:.1f} MB" for k in STATES), "",
         f"{'':34} {'min ms':>8} {'p50 ms':>8} {'max ms':>8}"]
for (kind, what), v in times.items():
    lines.append(f"{what + ', ' + kind:34} {min(v):8.2f} {statistics.median(v):8.2f} "
                 f"{max(v):8.2f}")
lines.append(f"{'a cell of an open session':34} {min(open_cell):8.2f} "
             f"{statistics.median(open_cell):8.2f} {max(open_cell):8.2f}")
text = "\n".join(lines) + "\n"
sys.stdout.write(text)
if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hibernate.txt"), "w") as out:
        out.write(text)
