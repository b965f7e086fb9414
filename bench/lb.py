#!/usr/bin/python3
"""Three `pysbx serve --http` instances on loopback behind nginx as the load
balancer; concurrent clients send requests, each with a unique id, and one
instance is SIGKILLed in the middle. Shows that every request got exactly
one answer (its own result, or a clear 502/503), that nginx passed on to
another instance only requests that never reached one, and reports the
aggregate throughput.

  bench/lb.py build/pysbx                          # the long form
  bench/lb.py build/pysbx --requests 600 --clients 6  # the short form (ctest)
  bench/lb.py build/pysbx --sessions 30 --cells 20   # sessions, pinned

With --sessions, nginx runs deploy/nginx/pysbx.conf as shipped (its replicas
and port replaced by loopback ones): each session's cells are pinned to a
replica by consistent hashing on the name in the path. Every cell checks the
state the earlier ones left; one replica is SIGKILLed midway. Exits 1 unless
the sessions of the other replicas lost nothing, each session of the killed
one was told session_lost once (after at most one 502 for a cell in flight)
and started again, and no cell was answered twice or by another replica
than its session's (nginx's log and each replica's /metrics).

Needs Debian's nginx (started here in the foreground with a temporary prefix
and configuration, stopped at the end; never the system's service). Exits 1
when a request was lost, answered twice or answered with another's result,
or when a retried request had reached an instance first."""
import argparse, http.client, json, os, random, re, shutil, signal, socket, subprocess, sys
import tempfile, threading, time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("pysbx")
ap.add_argument("--requests", type=int, default=5000)
ap.add_argument("--clients", type=int, default=16)
ap.add_argument("--instances", type=int, default=3)
ap.add_argument("--jobs", type=int, default=2, help="--jobs of each instance")
ap.add_argument("--kill-at", type=float, default=0.4,
                help="SIGKILL one instance once this share of the requests was answered")
ap.add_argument("--max-seconds", type=float, default=300, help="give up after this long")
ap.add_argument("--nginx", default="/usr/sbin/nginx")
ap.add_argument("--sessions", type=int, default=0, help="run this many sessions instead of runs")
ap.add_argument("--cells", type=int, default=20, help="with --sessions: cells of each session")
args = ap.parse_args()

procs = []  # (Popen, the pids of its descendants, seen at the start)
tmp = tempfile.mkdtemp(prefix="pysbx-lb-")


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def cleanup():
    for p, kids in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM if p.args[0] != args.nginx else signal.SIGQUIT)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for k in kids:  # the killed instance's template, if it outlived it
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
    shutil.rmtree(tmp, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_instance():
    extra = ["--max-sessions", str(max(64, args.sessions))] if args.sessions else []
    p = subprocess.Popen([args.pysbx, "serve", "--http", "127.0.0.1:0", "--jobs", str(args.jobs),
                          "--grace", "5", *extra], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        raise SystemExit(f"an instance did not start: {line!r}")
    threading.Thread(target=p.stderr.read, daemon=True).start()
    procs.append((p, []))
    procs[-1] = (p, descendants(p.pid))
    return p, int(m.group(1))


NGINX_HEAD = """
daemon off;
master_process on;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    log_format lb '$http_x_request_id $status "$upstream_addr" "$upstream_status" '
                  '"$upstream_bytes_sent"';
    access_log {tmp}/access.log lb;
"""
NGINX_CONF = NGINX_HEAD + """
    client_max_body_size 64m;
    upstream pysbx {{
{servers}
        keepalive 64;
        keepalive_timeout 20s;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://pysbx;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Another instance is tried only for a request that never reached
            # one (refused, reset before sending); POST is not idempotent, so
            # one sent and then lost is a 502, never run twice.
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
            proxy_connect_timeout 2s;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "nginx",
                       "pysbx.conf")


def shipped_conf(ports, port):
    """deploy/nginx/pysbx.conf with loopback replicas and port: its upstream's
    server lines become one per replica (their options kept), its listen
    line the port."""
    with open(SHIPPED) as f:
        text = f.read()
    lines = re.findall(r"^(\s*)server \S+:\d+( [^;]*)?;.*$", text, re.M)
    if not lines or len(re.findall(r"^\s*listen \S+;", text, re.M)) != 1:
        raise SystemExit(f"{SHIPPED}: no server or one listen line to replace")
    indent, opts = lines[0]
    servers = "\n".join(f"{indent}server 127.0.0.1:{p}{opts};" for p in ports)
    text = re.sub(r"^\s*server \S+:\d+( [^;]*)?;.*\n", "", text, flags=re.M)
    text = text.replace("    hash $pysbx_session consistent;\n",
                        "    hash $pysbx_session consistent;\n" + servers + "\n")
    return re.sub(r"^(\s*)listen \S+;", rf"\1listen 127.0.0.1:{port};", text, flags=re.M)


def start_nginx(ports):
    port = free_port()
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=1s;" for p in ports)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        if args.sessions:
            f.write(NGINX_HEAD.format(tmp=tmp) + shipped_conf(ports, port) + "}\n")
        else:
            f.write(NGINX_CONF.format(tmp=tmp, servers=servers, port=port))
    p = subprocess.Popen([args.nginx, "-p", tmp, "-c", conf, "-e", os.path.join(tmp, "error.log")])
    procs.append((p, []))
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.05)
    with open(os.path.join(tmp, "error.log")) as f:
        raise SystemExit("nginx did not start:\n" + f.read())


answers = {}  # request id -> [(HTTP status, answer)]
lock = threading.Lock()
done = 0
deadline = 0.0


def post(conn, path, body, rid):
    """POSTs |body| with X-Request-Id |rid|: (HTTP status, the answer, as JSON
    when it says it is). When nginx itself failed us: (0, why), the
    connection closed; never retried here (it may have run)."""
    try:
        conn.request("POST", path, body=body, headers={"X-Request-Id": rid,
                                                       "Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        got = (r.status, json.loads(data) if r.getheader("Content-Type", "").startswith(
            "application/json") else data[:200].decode(errors="replace"))
        if r.will_close:
            conn.close()
        return got
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        return 0, repr(e)


def client(port, ids):
    global done
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for rid in ids:
        if time.monotonic() > deadline:
            return
        body = json.dumps({"id": rid, "code": f"import time\ntime.sleep({random.random() * 0.02:.4f})\n"
                                              f"print({rid!r})"})
        got = post(conn, "/v1/run", body, rid)
        with lock:
            answers.setdefault(rid, []).append(got)
            done += 1


def scrape_total(port, name):
    """The sum of the samples of |name| (with or without labels), or None."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except OSError:
        return None
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name + "{") or l.startswith(name + " "))


def drive(target, items, total):
    """Starts the instances and nginx, one target(nginx's port, share) thread
    per client over |items|, and SIGKILLs the second instance once
    total * kill_at answers are in. Returns the instances' ports, the
    killed one's, the seconds taken, and (answers, time) at the kill, or
    None if it never came."""
    global deadline
    instances = [start_instance() for _ in range(args.instances)]
    ports = [p for _, p in instances]
    lb = start_nginx(ports)
    victim, vport = instances[1]
    t0 = time.monotonic()
    deadline = t0 + args.max_seconds
    threads = [threading.Thread(target=target, args=(lb, items[i::args.clients]))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    killed = None
    while any(t.is_alive() for t in threads):
        if killed is None and done >= total * args.kill_at:
            victim.kill()
            killed = (done, time.monotonic())
        time.sleep(0.005)
    return ports, vport, time.monotonic() - t0, killed


def access_log():
    """nginx's log, a line at a time: (request id, status, the upstreams
    tried, the bytes sent to each, the line)."""
    with open(os.path.join(tmp, "access.log")) as f:
        for line in f:
            m = re.match(r'(\S+) (\d+) "([^"]*)" "([^"]*)" "([^"]*)"', line)
            if m:
                rid, st, addrs, _, sent = m.groups()
                yield (rid, int(st), addrs, [x.strip() for x in re.split(r"[,:]", sent) if x.strip()],
                       line.strip())


def verdict(fails, killed, ok_line):
    """Prints the problems found, or |ok_line|; the exit status."""
    if killed is None:
        fails.append("the second instance was never killed")
    for f in fails[:20]:
        print("FAIL " + f)
    if fails:
        print(f"FAIL {len(fails)} problems")
        return 1
    print(ok_line)
    return 0


def main():
    if not os.access(args.nginx, os.X_OK):
        print(f"{args.nginx} is not installed (Debian's nginx; scripts/setup installs it)")
        return 77
    ids = [f"r{i:06d}-{os.urandom(3).hex()}" for i in range(args.requests)]
    ports, vport, elapsed, killed = drive(client, ids, args.requests)
    runs_by_survivors = {p: scrape_total(p, "pysbx_runs_total") for p in ports if p != vport}

    fails = []
    ok = refused = 0
    for rid in ids:
        got = answers.get(rid, [])
        if len(got) != 1:
            fails.append(f"{rid}: {len(got)} answers")
            continue
        st, a = got[0]
        if st == 200 and isinstance(a, dict) and a.get("id") == rid and a.get("stdout") == rid + "\n":
            ok += 1
        elif st in (502, 503):
            refused += 1
        else:
            fails.append(f"{rid}: {st} {str(a)[:200]}")

    # nginx's log: one line per request; a request passed on to another
    # instance must have sent nothing to the ones before it.
    lines = {}
    retried = 0
    example = None
    by_instance = {}
    for rid, st, addrs, sent, line in access_log():
        lines[rid] = lines.get(rid, 0) + 1
        if len(sent) > 1:
            retried += 1
            example = line
            if any(s not in ("0", "-") for s in sent[:-1]):
                fails.append(f"{rid}: passed on after reaching an instance: {line}")
        if st == 200:
            last = int(addrs.split(",")[-1].strip().split(":")[-1])
            by_instance[last] = by_instance.get(last, 0) + 1
    for rid in ids:
        if lines.get(rid, 0) != 1 and answers.get(rid, [(0,)])[0][0] != 0:
            fails.append(f"{rid}: {lines.get(rid, 0)} lines in nginx's log")
    for p, n in runs_by_survivors.items():
        # Each surviving instance ran exactly the runs it answered: none twice.
        if n is None or int(n) != by_instance.get(p, 0):
            fails.append(f"instance {p}: {n} runs, {by_instance.get(p, 0)} answered through nginx")

    print(f"{args.requests} requests from {args.clients} clients through nginx to "
          f"{args.instances} instances (--jobs {args.jobs} each); instance :{vport} SIGKILLed "
          f"after {killed and killed[0]} answers")
    print(f"  answered: {ok} with their own result, {refused} with 502/503 (in flight on the "
          f"killed instance), {len(ids) - ok - refused} otherwise")
    print(f"  passed on to another instance by nginx (never reached the first): {retried}")
    if example:
        print(f"    e.g. (id, status, upstreams, their statuses, bytes sent to each): {example}")
    print("  answered by instance: " + ", ".join(f":{p} {n}" for p, n in sorted(by_instance.items())))
    print(f"  {elapsed:.2f} s, {len(ids) / elapsed:.0f} requests/s aggregate")
    return verdict(fails, killed, "every request got exactly one answer")


cell_log = []  # (session, epoch, cell, HTTP status, answer, seconds, time answered, request id)


def session_client(port, names):
    """Runs its sessions' cells round-robin, each cell checking the state the
    earlier ones left: tag is the session's name, acc counts its cells. A
    lost session (410) starts again at cell 1; a cell that got no answer
    from its replica (502: it died) is sent again, as a caller would."""
    global done
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    st = {n: {"cell": 0, "epoch": 0, "ok": 0, "sent": 0} for n in names}
    while time.monotonic() < deadline:
        todo = [n for n in names if st[n]["ok"] < args.cells]
        if not todo:
            break
        for n in todo:
            s = st[n]
            k = s["cell"] + 1
            code = (f"tag = {n!r}\nacc = 0\nprint(acc)" if k == 1 else
                    f"assert tag == {n!r} and acc == {k - 2}, (tag, acc)\nacc += 1\nprint(acc)")
            s["sent"] += 1
            rid = f"{n}.{s['epoch']}.{k}.{s['sent']}"
            t0 = time.monotonic()
            status, a = post(conn, f"/v1/sessions/{n}/run",
                             json.dumps({"id": rid, "code": code, "cell": k}), rid)
            with lock:
                cell_log.append((n, s["epoch"], k, status, a, time.monotonic() - t0,
                                 time.monotonic(), rid))
                done += 1
            if status == 200:
                s["cell"] = k
                s["ok"] += 1
            elif status == 410:
                s["epoch"] += 1
                s["cell"] = 0
    # Each session done, a branch of it (of its family, so pinned with it)
    # and one cell of the branch, which finds the origin's state.
    for n in names:
        if st[n]["ok"] < args.cells or time.monotonic() > deadline:
            continue
        k = st[n]["cell"] + 1
        got = [post(conn, f"/v1/sessions/{n}/fork", json.dumps({"to": f"{n}~b"}), f"{n}.fork"),
               post(conn, f"/v1/sessions/{n}~b/run",
                    json.dumps({"code": f"assert tag == {n!r} and acc == {k - 2}\nprint('branch')",
                                "cell": k}), f"{n}.branch")]
        with lock:
            branch_log.append((n, k, got))


branch_log = []  # (session, the branch's cell number, [(status, answer)] of fork and cell)


def main_sessions():
    names = [f"s{i:03d}-{os.urandom(2).hex()}" for i in range(args.sessions)]
    total = args.sessions * args.cells
    ports, vport, elapsed, killed = drive(session_client, names, total)
    killed_at = killed and killed[1]
    cells_by = {p: scrape_total(p, "pysbx_session_cells_total") for p in ports if p != vport}

    fails = []
    # nginx's log: the replica of each answer, by request id.
    upstream = {}
    for rid, st, addrs, sent, line in access_log():
        if rid in upstream:
            fails.append(f"{rid}: two lines in nginx's log")
        upstream[rid] = addrs.split(",")[-1].strip()
        if len(sent) > 1 and any(x not in ("0", "-") for x in sent[:-1]):
            fails.append(f"{rid}: passed on after reaching a replica: {line}")
    by = {}
    for n, epoch, k, status, a, secs, when, rid in cell_log:
        by.setdefault(n, []).append((epoch, k, status, rid, when))
        if status == 200 and not (isinstance(a, dict) and a.get("exit_code") == 0
                                  and a.get("stdout") == f"{k - 1}\n"
                                  and a.get("session", {}).get("cell") == k):
            fails.append(f"{n}.{epoch}.{k}: not the state its earlier cells left: {str(a)[:300]}")
        elif status not in (200, 410, 502):
            fails.append(f"{n}.{epoch}.{k}: {status} {str(a)[:200]}")
    moved = kept = 0
    answered_by = {}
    for n in names:
        cells = by.get(n, [])
        ok = [c for c in cells if c[2] == 200]
        lost = [c for c in cells if c[2] == 410]
        cut = [c for c in cells if c[2] == 502]
        if len(ok) != args.cells:
            fails.append(f"{n}: {len(ok)} cells answered, not {args.cells}")
        # Every cell of one life of a session, by one replica.
        homes = {}
        for epoch, k, status, rid, when in ok:
            homes.setdefault(epoch, set()).add(upstream.get(rid, "?"))
            port = int(upstream.get(rid, "0:0").rsplit(":", 1)[1])
            answered_by[port] = answered_by.get(port, 0) + 1
        if any(len(h) != 1 for h in homes.values()):
            fails.append(f"{n}: the cells of one life answered by several replicas: {homes}")
        first = next(iter(homes.get(0, {"?"})))
        on_victim = first.endswith(f":{vport}")
        after_kill = killed_at is not None and any(c[4] > killed_at for c in ok)
        if not on_victim and (lost or cut):
            fails.append(f"{n}: on a surviving replica, yet {len(lost)} session_lost and "
                         f"{len(cut)} 502: {[(c[0], c[1], c[2]) for c in lost + cut]}")
        elif on_victim and after_kill and (len(lost) != 1 or len(cut) > 1 or len(homes) != 2):
            fails.append(f"{n}: on the killed replica: {len(lost)} session_lost (want 1), "
                         f"{len(cut)} 502 (at most 1), {len(homes)} lives")
        moved += on_victim and after_kill
        kept += not on_victim
    # Branches: made, and their first cell answered, where the origin's
    # last cells were.
    home_of = {}
    for n, epoch, k, status, a, secs, when, rid in cell_log:
        if status == 200:
            home_of[n] = upstream.get(rid, "?")
    for n, k, (fork, cell) in branch_log:
        where = {upstream.get(f"{n}.fork"), upstream.get(f"{n}.branch"), home_of.get(n)}
        if not (fork[0] == 200 and isinstance(fork[1], dict)
                and fork[1].get("session_forked", {}).get("cell") == k - 1):
            fails.append(f"{n}: fork answered {fork[0]} {str(fork[1])[:200]}")
        elif not (cell[0] == 200 and isinstance(cell[1], dict)
                  and cell[1].get("stdout") == "branch\n"):
            fails.append(f"{n}~b: its first cell answered {cell[0]} {str(cell[1])[:200]}")
        elif len(where) != 1:
            fails.append(f"{n}: origin and branch on several replicas: {where}")
        else:
            port = int(upstream[f"{n}.branch"].rsplit(":", 1)[1])
            answered_by[port] = answered_by.get(port, 0) + 1
    if len(branch_log) != len(names):
        fails.append(f"{len(branch_log)} branches made, not {len(names)}")
    for p, n in cells_by.items():
        # Each surviving replica ran exactly the cells it answered: none twice.
        if n is None or int(n) != answered_by.get(p, 0):
            fails.append(f"replica :{p}: {n} cells in /metrics, {answered_by.get(p, 0)} "
                         f"answered through nginx")
    ok_secs = sorted(c[5] for c in cell_log if c[3] == 200)
    print(f"{args.sessions} sessions of {args.cells} cells from {args.clients} clients through "
          f"nginx (deploy/nginx/pysbx.conf) to {args.instances} replicas; replica :{vport} "
          f"SIGKILLed after {total * args.kill_at:.0f} cells")
    print(f"  sessions on the surviving replicas: {kept}, none lost a cell")
    print(f"  sessions of the killed replica: {moved} told session_lost once and started again "
          f"on another ({sum(1 for c in cell_log if c[3] == 502)} cells in flight answered 502)")
    print(f"  then a branch of each session (POST /v1/sessions/NAME/fork, NAME~b) and its first "
          f"cell: {len(branch_log)}, each on its origin's replica")
    print("  cells answered by replica: " + ", ".join(f":{p} {n}" for p, n in
                                                       sorted(answered_by.items())))
    if ok_secs:
        print(f"  {len(ok_secs)} cells in {elapsed:.2f} s ({len(ok_secs) / elapsed:.0f} cells/s); "
              f"a cell through nginx p50 {ok_secs[len(ok_secs) // 2] * 1000:.1f} ms, p99 "
              f"{ok_secs[min(len(ok_secs) - 1, len(ok_secs) * 99 // 100)] * 1000:.1f} ms")
    return verdict(fails, killed,
                   "every session kept its state on its replica, or was told it was lost once")


try:
    rc = main_sessions() if args.sessions else main()
finally:
    cleanup()
sys.exit(rc)
