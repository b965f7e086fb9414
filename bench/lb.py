#!/usr/bin/python3
"""Three `pysbx serve --http` instances on loopback behind nginx as the load
balancer; concurrent clients send requests, each with a unique id, and one
instance is SIGKILLed in the middle. Shows that every request got exactly
one answer (its own result, or a clear 502/503), that nginx passed on to
another instance only requests that never reached one, and reports the
aggregate throughput.

  bench/lb.py build/pysbx                          # the long form
  bench/lb.py build/pysbx --requests 600 --clients 6  # the short form (ctest)

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
    p = subprocess.Popen([args.pysbx, "serve", "--http", "127.0.0.1:0", "--jobs", str(args.jobs),
                          "--grace", "5"], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        raise SystemExit(f"an instance did not start: {line!r}")
    threading.Thread(target=p.stderr.read, daemon=True).start()
    procs.append((p, []))
    procs[-1] = (p, descendants(p.pid))
    return p, int(m.group(1))


NGINX_CONF = """
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
    client_max_body_size 64m;
    log_format lb '$http_x_request_id $status "$upstream_addr" "$upstream_status" '
                  '"$upstream_bytes_sent"';
    access_log {tmp}/access.log lb;
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


def start_nginx(ports):
    port = free_port()
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=1s;" for p in ports)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
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


def client(port, ids):
    global done
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for rid in ids:
        if time.monotonic() > deadline:
            return
        body = json.dumps({"id": rid, "code": f"import time\ntime.sleep({random.random() * 0.02:.4f})\n"
                                              f"print({rid!r})"})
        try:
            conn.request("POST", "/v1/run", body=body, headers={"X-Request-Id": rid,
                                                                 "Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            got = (r.status, json.loads(data) if r.getheader("Content-Type", "").startswith(
                "application/json") else data[:200].decode(errors="replace"))
            if r.will_close:
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            # nginx itself failed us: recorded, never retried (it may have run).
            got = (0, repr(e))
            conn.close()
        with lock:
            answers.setdefault(rid, []).append(got)
            done += 1


def scrape(port, name):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except OSError:
        return None
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))


def main():
    global deadline
    if not os.access(args.nginx, os.X_OK):
        print(f"{args.nginx} is not installed (Debian's nginx; scripts/setup installs it)")
        return 77
    instances = [start_instance() for _ in range(args.instances)]
    ports = [p for _, p in instances]
    lb = start_nginx(ports)
    ids = [f"r{i:06d}-{os.urandom(3).hex()}" for i in range(args.requests)]
    share = [ids[i::args.clients] for i in range(args.clients)]
    victim, vport = instances[1]
    t0 = time.monotonic()
    deadline = t0 + args.max_seconds
    threads = [threading.Thread(target=client, args=(lb, s)) for s in share]
    for t in threads:
        t.start()
    killed_at = None
    while any(t.is_alive() for t in threads):
        if killed_at is None and done >= args.requests * args.kill_at:
            victim.kill()
            killed_at = done
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    runs_by_survivors = {p: scrape(p, "pysbx_runs_total") for p in ports if p != vport}

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
    with open(os.path.join(tmp, "access.log")) as f:
        for line in f:
            m = re.match(r'(\S+) (\d+) "([^"]*)" "([^"]*)" "([^"]*)"', line)
            if not m:
                continue
            rid, st, addrs, sts, sent = m.groups()
            lines[rid] = lines.get(rid, 0) + 1
            sent = [s.strip() for s in re.split(r"[,:]", sent) if s.strip()]
            if len(sent) > 1:
                retried += 1
                example = line.strip()
                if any(s not in ("0", "-") for s in sent[:-1]):
                    fails.append(f"{rid}: passed on after reaching an instance: {line.strip()}")
    for rid in ids:
        if lines.get(rid, 0) != 1 and answers.get(rid, [(0,)])[0][0] != 0:
            fails.append(f"{rid}: {lines.get(rid, 0)} lines in nginx's log")
    by_instance = {}
    with open(os.path.join(tmp, "access.log")) as f:
        for line in f:
            m = re.match(r'(\S+) 200 "([^"]*)"', line)
            if m:
                last = m.group(2).split(",")[-1].strip().split(":")[-1]
                by_instance[int(last)] = by_instance.get(int(last), 0) + 1
    for p, n in runs_by_survivors.items():
        # Each surviving instance ran exactly the runs it answered: none twice.
        if n is None or int(n) != by_instance.get(p, 0):
            fails.append(f"instance {p}: {n} runs, {by_instance.get(p, 0)} answered through nginx")

    print(f"{args.requests} requests from {args.clients} clients through nginx to "
          f"{args.instances} instances (--jobs {args.jobs} each); instance :{vport} SIGKILLed "
          f"after {killed_at} answers")
    print(f"  answered: {ok} with their own result, {refused} with 502/503 (in flight on the "
          f"killed instance), {len(ids) - ok - refused} otherwise")
    print(f"  passed on to another instance by nginx (never reached the first): {retried}")
    if example:
        print(f"    e.g. (id, status, upstreams, their statuses, bytes sent to each): {example}")
    print(f"  answered by instance: " + ", ".join(f":{p} {n}" for p, n in sorted(by_instance.items())))
    print(f"  {elapsed:.2f} s, {len(ids) / elapsed:.0f} requests/s aggregate")
    if killed_at is None:
        fails.append("the instance was never killed")
    for f in fails[:20]:
        print("FAIL " + f)
    if fails:
        print(f"FAIL {len(fails)} problems")
        return 1
    print("every request got exactly one answer")
    return 0


try:
    rc = main()
finally:
    cleanup()
sys.exit(rc)
