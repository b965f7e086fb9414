"""Where a run's CPU goes, part by part, in pysbx and in the floor.

Run by bench/phases, against a build with -DPYSBX_PROFILE=ON. pysbx: N
runs of print(1) through `pysbx serve`, one at a time, each on an idle
worker of the default pool (a pause after each lets the replacement get
ready, so the figures are of the parts, not of contention). Each worker
reports its CPU clock at each step and the template's cost of making it;
wait4 gives the worker's whole CPU, exit included; /proc gives the
template's and the server's CPU per run. The floor: the same N runs through
pysbx-floor, which reports the same parts of its own.
"""
import json
import os
import statistics
import subprocess
import sys
import time

build, n = sys.argv[1], int(sys.argv[2])
PAUSE = 0.03


def proc_cpu_us(pid, children=False):
    """utime + stime of one process, in µs; with |children|, also of the
    children it reaped."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks * 1e6 / os.sysconf("SC_CLK_TCK")


def child_of(pid, comm):
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        ppid = int(s.rsplit(")", 1)[1].split()[1])
        if ppid == pid and name == comm:
            return int(entry)
    return None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# --- pysbx ---
serve = subprocess.Popen([f"{build}/pysbx", "serve"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1)
rows, worker_cpu = [], []
template = keeper = None
for i in range(n + 5):
    serve.stdin.write(json.dumps({"id": i, "code": "print(1)\n"}) + "\n")
    answer = json.loads(serve.stdout.readline())
    if i == 4:  # the first runs made the pool and learnt the page plan
        template = child_of(serve.pid, "pysbx-template")
        keeper = child_of(template, "pysbx-keeper")
        t0, s0 = proc_cpu_us(template), proc_cpu_us(serve.pid)
        k0 = proc_cpu_us(keeper, children=True) if keeper else 0
    if i >= 5:
        line = next(l for l in answer["stderr"].splitlines() if l.startswith("pysbx-profile:"))
        rows.append({k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])})
        # cpu_ms counts from the code's start: the marks give what came before
        worker_cpu.append(answer["stats"]["cpu_ms"] * 1000 + rows[-1]["started"])
    time.sleep(PAUSE)
t1, s1 = proc_cpu_us(template), proc_cpu_us(serve.pid)
k1 = proc_cpu_us(keeper, children=True) if keeper else 0
serve.stdin.close()
serve.wait()

marks = ["prefault", "afterfork", "fds", "workspace", "prepare", "confine", "request",
         "started", "ran"]
m = {k: med([r[k] for r in rows]) for k in marks + ["tfork", "tspawn"]}
parts = {}
prev = 0.0
for k in marks:
    parts[k] = m[k] - prev
    prev = m[k]
exit_us = med([c - r["ran"] for c, r in zip(worker_cpu, rows)])
template_us = (t1 - t0) / n
server_us = (s1 - s0) / n
holder_us = (k1 - k0) / n

# --- the floor ---
floor = subprocess.Popen([f"{build}/pysbx-floor"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, bufsize=1)
frows = []
for i in range(n + 5):
    floor.stdin.write("L 9\nprint(1)\n")
    f = floor.stdout.readline().split()
    if i >= 5:
        frows.append({k: float(v) for k, v in (kv.split("=") for kv in f[2:])})
    time.sleep(PAUSE)
floor.stdin.close()
floor.wait()
fm = {k: med([r[k] for r in frows]) for k in ["fork", "afterfork", "ran", "child", "parent"]}

table = [
    ("template/parent: fork()", m["tfork"], fm["fork"]),
    ("template: the rest of making a worker", m["tspawn"] - m["tfork"], None),
    ("template: the rest (announce, timers, reap, status)", template_us - m["tspawn"], None),
    ("worker: planned pages copied (prefault)", parts["prefault"], None),
    ("worker: fork's return, CPython after-fork", parts["afterfork"], fm["afterfork"]),
    ("worker: descriptors", parts["fds"], None),
    ("worker: session, workspace attached", parts["workspace"], None),
    ("worker: environment, rehearsal", parts["prepare"], None),
    ("worker: limits, ids, capabilities, Landlock, seccomp", parts["confine"], None),
    ("worker: request read", parts["request"], None),
    ("worker: request limits, CPU timer", parts["started"], None),
    ("worker: the code (print(1)), flush", parts["ran"], fm["ran"] - fm["afterfork"]),
    ("worker: exit (address space, namespace, descriptors)", exit_us, fm["child"] - fm["ran"]),
    ("holder: the teardown after the answer; its init's reaping", holder_us, None),
    ("supervisor (pysbx serve: JSON, sbx_run) / floor parent", server_us, fm["parent"]),
]
total = sum(r[1] for r in table)
ftotal = sum(r[2] for r in table if r[2] is not None)
print(f"CPU per run of print(1), median of {n}, µs (user + system)")
print(f"{'part':56s} {'pysbx':>8s} {'floor':>8s}")
for name, a, b in table:
    print(f"{name:56s} {a:8.0f} {'' if b is None else f'{b:8.0f}':>8s}")
print(f"{'total':56s} {total:8.0f} {ftotal:8.0f}   ({total / ftotal:.2f}x)")
