"""An agent host whose model writes a program that calls the host's tools.

The model's program (MODEL_CODE below, as a model might write it) looks up
open orders and sums them per region by calling two host tools in a loop.
The orders never pass through the model's context, and the credential the
tools use (API_KEY) never enters the sandbox: the program sees only what
each tool returns.

    python3 examples/agent_tools.py [PATH/TO/pysbx]

It starts `pysbx serve --listen` on a socket in a temporary directory, runs
the program through the Python client with tools={...}, prints what came
back, and stops the server.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from pysbx_client import Client  # noqa: E402

# The host's side: its data and its credential.
API_KEY = "sk-host-only-" + os.urandom(4).hex()
ORDERS = {
    "A-1": {"region": "north", "total": 120.5, "status": "open"},
    "A-2": {"region": "south", "total": 80.0, "status": "open"},
    "A-3": {"region": "north", "total": 42.25, "status": "shipped"},
    "A-4": {"region": "east", "total": 300.0, "status": "open"},
    "A-5": {"region": "north", "total": 19.75, "status": "open"},
}
calls = []


def search_orders(status):
    """Ids of the orders with this status."""
    calls.append(("search_orders", status))
    assert API_KEY  # the host's call to its own backend would use it here
    return sorted(k for k, v in ORDERS.items() if v["status"] == status)


def get_order(order_id):
    """One order: region and total."""
    calls.append(("get_order", order_id))
    o = ORDERS[order_id]
    return {"region": o["region"], "total": o["total"]}


MODEL_CODE = """
import pysbx
totals = {}
for oid in pysbx.tools.search_orders(status="open"):
    order = pysbx.tools.get_order(order_id=oid)
    totals[order["region"]] = totals.get(order["region"], 0) + order["total"]
for region, total in sorted(totals.items()):
    print(f"{region}: {total:.2f}")
"""


def main():
    pysbx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build", "pysbx")
    work = tempfile.mkdtemp(prefix="pysbx-example-")
    os.chmod(work, 0o711)
    sock = os.path.join(work, "pysbx.sock")
    server = subprocess.Popen([pysbx, "serve", "--listen", sock], stdin=subprocess.DEVNULL,
                              env={**os.environ, "TMPDIR": work})
    try:
        for _ in range(600):
            if os.path.exists(sock) or server.poll() is not None:
                break
            time.sleep(0.05)
        r = Client(sock, timeout=60).run(MODEL_CODE, limits={"wall_seconds": 10},
                                         tools={"search_orders": search_orders,
                                                "get_order": get_order})
        print(r.stdout, end="")
        print(f"status {r.status}, exit code {r.exit_code}; the host answered {len(calls)} "
              f"tool calls: {', '.join(f'{n}({a})' for n, a in calls)}")
        return 0 if r.status == "completed" and r.exit_code == 0 else 1
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
