"""What the Python checks look at of a process: its children and its name,
from /proc."""
import os


def children(pid):
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass  # a thread that ended meanwhile
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def of_uids(lo, hi):
    """The processes whose real uid is in [lo, hi), with their names."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                uid = next(int(l.split()[1]) for l in f if l.startswith("Uid:"))
        except (OSError, StopIteration, ValueError):
            continue  # gone meanwhile
        if lo <= uid < hi:
            out.append((int(d), comm(d)))
    return out


def none_of_uids(lo, hi, within=5.0):
    """Waits (boundedly) until no process has a uid in [lo, hi); returns
    those left at the end."""
    import time
    end = time.monotonic() + within
    while True:
        left = of_uids(lo, hi)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)
