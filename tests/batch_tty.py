"""pysbx batch on a terminal, as a user at one sees it: the progress bar on
stderr only when that is a terminal and the result lines are not, no stale
characters left by a shorter line, and p50 <= p99 in the summary.
Run by test_cli.sh with Debian's python3.
usage: batch_tty.py PATH/TO/pysbx WORK_DIR"""
import json, os, pty, re, select, subprocess, sys

PYSBX, WORK = sys.argv[1], sys.argv[2]
failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail!r}"))
    failures += not ok


def screen(data):
    """The lines a terminal shows for |data|: \\r returns to the start of the
    line, ESC [ K clears to its end, \\n ends it."""
    lines, line, col, i = [], [], 0, 0
    while i < len(data):
        c = data[i]
        if data.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(line))
            line, col = [], 0
        else:
            if col < len(line):
                line[col] = c
            else:
                line.append(c)
            col += 1
        i += 1
    if line:
        lines.append("".join(line))
    return lines


def run_on_pty(args, stdout_file=None):
    """Runs pysbx with stderr (and stdout unless |stdout_file|) on a pty;
    returns (status, what the terminal received)."""
    master, slave = pty.openpty()
    out = open(stdout_file, "wb") if stdout_file else slave
    p = subprocess.Popen([PYSBX, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=slave)
    os.close(slave)
    if stdout_file:
        out.close()
    got = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    return p.wait(timeout=60), got.decode("utf-8", "replace")


progs = os.path.join(WORK, "tty-progs")
os.makedirs(progs, exist_ok=True)
# The first two finish at once (a high rate on the first drawn line), the
# last takes a second (a lower rate, a shorter line, at the end).
for name, code in [("a.py", "print(1)"), ("b.py", "print(2)\nraise SystemExit(3)"),
                   ("c.py", "import time\ntime.sleep(1.2)\nprint(3)")]:
    with open(os.path.join(progs, name), "w") as f:
        f.write(code)

results = os.path.join(WORK, "tty-results.jsonl")
status, term = run_on_pty(["batch", progs, "--jobs", "1"], stdout_file=results)
check("batch with results in a file exits 0", status == 0, status)
lines = open(results).read().splitlines()
check("the results file holds only the result lines",
      len(lines) == 3 and all(json.loads(l)["status"] == "completed" for l in lines), lines)
check("the bar is drawn on the terminal", "\r[" in term, term)
shown = screen(term)
bars = [l for l in shown if l.startswith("[")]
check("the last bar shows no stale characters",
      len(bars) == 1 and re.fullmatch(
          r"\[=+\] 3/3  exit 0 2  exit non-zero 1  stopped 0  refused 0  [0-9.]+ runs/s", bars[0]),
      shown)
check("a bar drawn before the end has an ETA", re.search(r"1/3 .* ETA \d+m\d\ds", term), term)
m = re.search(r"p50 ([0-9.]+) ms, p99 ([0-9.]+) ms", term)
check("p50 <= p99", m and float(m.group(1)) <= float(m.group(2)), m and m.group(0))

# Three programs: the nearest-rank p99 is the slowest, p50 the middle one.
m50, m99 = float(m.group(1)), float(m.group(2))
check("p99 of three is the slow one (over a second)", m99 >= 1000 and m50 < 1000, (m50, m99))

status, term = run_on_pty(["batch", progs, "--jobs", "2"])
check("batch on a terminal exits 0", status == 0, status)
check("no bar when the result lines go to the terminal", "\r[" not in term and "\x1b[K" not in term,
      term)
shown = screen(term)
results = [l for l in shown if l.startswith("{")]
check("each result line whole on the terminal",
      len(results) == 3 and all(json.loads(l)["status"] == "completed" for l in results), shown)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
