#!/usr/bin/env python3
"""Stand-in for ps-scheduler, ps-server and a worker, for testing tools/launch.py.

It follows the launcher's contract with the real binaries, over a tiny line protocol on TCP:
- The role comes from DMLC_ROLE. The scheduler binds DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT (0: an
  ephemeral port) and prints, flushed, `ps-scheduler: listening on HOST:PORT`.
- Servers and workers connect to DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT and say `hello ROLE`; once
  all DMLC_NUM_SERVER + DMLC_NUM_WORKER nodes said hello, the scheduler answers each `rank R`
  (per role, in order of arrival).
- A worker then does its "work" (prints, sleeps), says `done` and exits 0 (or fails on request).
- When every worker said done, the scheduler tells the servers `exit` and exits 0. When a
  connection drops before its node said done (worker) or was told to exit (server), the
  scheduler exits 1: "a node died", as the real one does.

Every process writes a record (pid, pgid, role, rank, cwd, environment) as JSON into
$FAKE_RECORD_DIR, so tests can check the environment contract and that no process is left.
"""
import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time


def log(msg):
    print(msg, flush=True)


def start_time(pid):
    """The process' start time (clock ticks since boot): with the pid, it names one process."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def parent_cmdline():
    """The command line of the process that started this one (the launcher's wrapper)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def record(role, rank, extra=None):
    d = os.environ.get("FAKE_RECORD_DIR")
    if not d:
        return
    rec = {
        "pid": os.getpid(), "start": start_time(os.getpid()), "ppid": os.getppid(),
        "pgid": os.getpgid(0), "sid": os.getsid(0),
        "role": role, "rank": rank, "cwd": os.getcwd(), "argv": sys.argv,
        "parent_cmdline": parent_cmdline(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("DMLC_", "PS_", "T_")) or k == "FAKE_RECORD_DIR"},
    }
    rec.update(extra or {})
    path = os.path.join(d, f"{role}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)


def spawn_grandchild(marker):
    """A grandchild in the same process group, to check that the group is stopped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
    d = os.environ.get("FAKE_RECORD_DIR")
    if d:
        with open(os.path.join(d, f"grandchild-{child.pid}.json"), "w") as f:
            json.dump({"pid": child.pid, "start": start_time(child.pid), "role": "grandchild"}, f)
    return child


def connect():
    uri = os.environ["DMLC_PS_ROOT_URI"]
    port = int(os.environ["DMLC_PS_ROOT_PORT"])
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((uri, port), timeout=5)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def scheduler(args):
    uri = os.environ["DMLC_PS_ROOT_URI"]
    port = int(os.environ["DMLC_PS_ROOT_PORT"])
    nworker = int(os.environ["DMLC_NUM_WORKER"])
    nserver = int(os.environ["DMLC_NUM_SERVER"])
    lsock = socket.socket()
    try:
        lsock.bind((uri, port))
    except OSError as e:
        log(f"fake-scheduler: cannot bind {uri}:{port}: {e}")
        return 1
    lsock.listen(64)
    if args.sched_delay:
        time.sleep(args.sched_delay)
    if not args.no_listen_line:
        log(f"ps-scheduler: listening on {uri}:{lsock.getsockname()[1]}")
    record("scheduler", 0, {"port": lsock.getsockname()[1]})
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    nodes = {}  # socket -> {"role", "rank", "buf", "done"}
    ranks = {"server": 0, "worker": 0}
    workers_done = 0
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is lsock:
                conn, _ = lsock.accept()
                nodes[conn] = {"role": None, "buf": b"", "done": False}
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            node = nodes[conn]
            data = conn.recv(4096)
            if not data:
                sel.unregister(conn)
                conn.close()
                del nodes[conn]
                if node["role"] is not None and not node["done"]:
                    log(f"fake-scheduler: {node['role']} {node['rank']} died")
                    return 1
                continue
            node["buf"] += data
            while b"\n" in node["buf"]:
                line, node["buf"] = node["buf"].split(b"\n", 1)
                words = line.decode().split()
                if words[:1] == ["hello"] and words[1] in ranks:
                    node["role"] = words[1]
                    node["rank"] = ranks[words[1]]
                    ranks[words[1]] += 1
                    if ranks["server"] + ranks["worker"] == nserver + nworker:
                        # Everybody registered (ps-lite's start barrier): hand out the ranks.
                        for c, n in nodes.items():
                            if n["role"] is not None:
                                c.sendall(f"rank {n['rank']}\n".encode())
                elif words == ["done"]:
                    node["done"] = True
                    workers_done += 1
        if workers_done == nworker:
            for conn, node in nodes.items():
                if node["role"] == "server":
                    node["done"] = True
                    try:
                        conn.sendall(b"exit\n")
                    except OSError:
                        pass
            log(f"fake-scheduler: all {nworker} workers done")
            return args.sched_exit_code


def hello(role):
    sock = connect()
    sock.sendall(f"hello {role}\n".encode())
    f = sock.makefile("rb")
    words = f.readline().decode().split()
    if words[:1] != ["rank"]:
        log(f"fake-{role}: bad answer from the scheduler: {words}")
        sys.exit(1)
    return sock, f, int(words[1])


def server(args):
    sock, f, rank = hello("server")
    record("server", rank)
    log(f"fake-server: up rank={rank}")
    if args.server_exit_code:
        log(f"fake-server: failing on purpose rank={rank} code={args.server_exit_code}")
        return args.server_exit_code
    line = f.readline()
    if line.strip() != b"exit":
        log("fake-server: lost the scheduler")
        return 1
    log(f"fake-server: exit rank={rank}")
    if args.linger:
        time.sleep(args.linger)
    return 0


def worker(args):
    sock, f, rank = hello("worker")
    record("worker", rank)
    if args.print_env:
        env = {k: v for k, v in os.environ.items() if k.startswith(("DMLC_", "T_"))}
        log("fake-env " + json.dumps(env, sort_keys=True))
    for i in range(args.lines):
        log(f"line {i} of rank {rank}")
    if args.fail_rank is not None and rank == args.fail_rank:
        log(f"fake-worker: failing on purpose rank={rank} code={args.exit_code}")
        return args.exit_code
    if args.sleep:
        time.sleep(args.sleep)
    sock.sendall(b"done\n")
    log(f"fake-worker: ok rank={rank}")
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--marker", help="ignored; a unique word tests look for in /proc")
    p.add_argument("--tag", help="ignored; tests check that odd words arrive intact")
    p.add_argument("--print-env", action="store_true")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0, help="worker: seconds of 'work'")
    p.add_argument("--fail-rank", type=int, help="worker with this rank exits --exit-code at once")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--no-listen-line", action="store_true",
                   help="scheduler: do not print the listening line")
    p.add_argument("--sched-delay", type=float, default=0.0,
                   help="scheduler: seconds between bind and the listening line")
    p.add_argument("--sched-exit-code", type=int, default=0)
    p.add_argument("--server-exit-code", type=int, default=0,
                   help="server: exit with this status right after registering")
    p.add_argument("--linger", type=float, default=0.0,
                   help="server: seconds to stay after the scheduler said exit")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    p.add_argument("--grandchild", action="store_true",
                   help="leave a grandchild in the process group")
    args = p.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    role = os.environ.get("DMLC_ROLE")
    if args.grandchild:
        spawn_grandchild(args.marker or "fake-grandchild")
    if role == "scheduler":
        return scheduler(args)
    if role == "server":
        return server(args)
    if role == "worker":
        return worker(args)
    log(f"fake: bad DMLC_ROLE={role!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
