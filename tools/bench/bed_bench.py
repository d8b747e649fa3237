#!/usr/bin/env python3
"""bed_bench.py: the parameter server against MPI_Allreduce on a multi-host test bed.

Makes one bed with tools/testbed.py (hosts as network namespaces, links shaped with HTB, an
sshd per host): W worker hosts h0..h(W-1) and S server hosts after them, every link at the
same rate. On that bed and those links it runs, per model size:

  ps_beside  dist_sync push+pull, W workers and W servers, one of each per worker host
             (MXNet's layout; launch.py -H workers)
  ps_own     dist_sync push+pull, W workers on the worker hosts, S servers on hosts of their
             own (BytePS's layout; launch.py --server-hostfile)
  mpi_*      Open MPI's MPI_Allreduce of the same size across the W worker hosts, once per
             algorithm (coll_tuned_allreduce_algorithm: the default decision and ring), mpirun
             started in h0 and reaching the others over the bed's sshd

and a straggler case: one worker host's link at 1/F of the rate, dist_async (both layouts)
against dist_sync and all-reduce, next to dist_async on equal links.

Every job runs the project's own benchmark programs: ps-bench in its worker mode (one
KVStore::PushPull of one key of SIZE bytes plus WaitAll per iteration, every worker timing its
own loop) under tools/launch.py, and ps-bench-mpi-allreduce under mpirun. While a job runs, the
switch's interface counters (one veth per host: what the host sent, what it received) and
/proc/stat are sampled every 50 ms; over the timed loop (its wall-clock bounds are in the
programs' result lines) they give each link's throughput, the busiest link's utilisation
(bytes per second over the link's rate) and how busy the machine's CPU was.

Prints progress on stderr, a table and the target ratios on stdout, and writes
<out>/bed_bench.json, <out>/bed_bench.png (matplotlib) and every job's output under <out>/logs.
Needs root (network namespaces), iproute2, openssh, Open MPI (openmpi-bin, libopenmpi-dev:
tools/install-deps.sh) and the built ps-scheduler, ps-server, ps-bench, ps-bench-mpi-allreduce.
See docs/scaling.md.
"""
import argparse
import atexit
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROG = "bed_bench.py"


def _tool(name):
    """tools/NAME of the source tree, or NAME beside this script (an install puts bed_bench.py,
    launch.py and testbed.py in <prefix>/bin)."""
    for d in (HERE, os.path.join(REPO, "tools")):
        if os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    return os.path.join(REPO, "tools", name)


def _default_bin_dir():
    """$PS_BIN_DIR, else the source tree's build/bin, else this script's own directory (an
    install's bin, where ps-server and the others are)."""
    if os.environ.get("PS_BIN_DIR"):
        return os.environ["PS_BIN_DIR"]
    built = os.path.join(REPO, "build", "bin")
    return built if os.path.isdir(built) else HERE


TESTBED = _tool("testbed.py")
LAUNCH = _tool("launch.py")

# coll_tuned_allreduce_algorithm values of Open MPI 4 (ompi_info --param coll tuned --level 9)
MPI_ALGORITHMS = {"default": None, "linear": 1, "nonoverlapping": 2, "recursive_doubling": 3,
                  "ring": 4, "segmented_ring": 5, "rabenseifner": 6}

SKIP_CODE = 77  # no bed can be made here (not root, no ip netns, no sshd)


def say(msg):
    print(f"[bed-bench] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------------- units

_SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_size(text):
    """'16MB' -> 16777216 (binary units, as ps-bench's --sizes)."""
    m = re.fullmatch(r"\s*(\d+)\s*(B|KB|MB|GB)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}': want a size such as 16MB (units B, KB, "
                                         "MB, GB; binary)")
    value = int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if value <= 0 or value % 4:
        raise argparse.ArgumentTypeError(f"'{text}': want a positive multiple of 4 bytes")
    return value


def parse_size_or_zero(text):
    """parse_size, or '0' -> 0 (a setting's "off")."""
    return 0 if text.strip() == "0" else parse_size(text)


def size_name(n):
    for unit in ("GB", "MB", "KB"):
        if n % _SIZE_UNITS[unit] == 0:
            return f"{n // _SIZE_UNITS[unit]}{unit}"
    return f"{n}B"


def parse_rate_bits(text):
    """tc-style rate ('100mbit', '1gbit', '500kbit') -> bits per second."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}': want a rate such as 100mbit (bit, kbit, "
                                         "mbit, gbit)")
    mult = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2).lower()]
    bits = float(m.group(1)) * mult
    if bits < 1e6:
        raise argparse.ArgumentTypeError(f"'{text}': want at least 1mbit")
    return bits


def fmt_rate(bits):
    if bits >= 1e9 and bits % 1e9 == 0:
        return f"{bits / 1e9:g}gbit"
    if bits >= 1e6:
        return f"{bits / 1e6:g}mbit"
    return f"{bits / 1e3:g}kbit"


def comma_list(choices=None):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("want a comma-separated list")
        if choices is not None:
            bad = [t for t in items if t not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from "
                                                 f"{', '.join(choices)})")
        return items
    return parse


# ---------------------------------------------------------------------------------- the bed

LIVE = {}  # state dir -> bed id, for the emergency teardown


def _teardown_all():
    for state_dir, bed_id in list(LIVE.items()):
        subprocess.run([sys.executable, TESTBED, "--state-dir", state_dir, "down", bed_id],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=90)
        LIVE.pop(state_dir, None)
        shutil.rmtree(state_dir, ignore_errors=True)


atexit.register(_teardown_all)


class Bed:
    """A bed of tools/testbed.py in a state dir of its own; down() removes it."""

    def __init__(self, hosts, rate_bits, delay_us=0):
        self.state_dir = tempfile.mkdtemp(prefix="psbed-bench-")
        self.id = None
        self.sampler_proc = None
        LIVE[self.state_dir] = None
        r = subprocess.run([sys.executable, TESTBED, "--state-dir", self.state_dir, "up", "-n",
                            str(hosts), "--rate", fmt_rate(rate_bits),
                            "--delay", f"{delay_us}us", "--json"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise BenchError(f"testbed up failed (status {r.returncode}): {r.stderr.strip()}")
        self.state = json.loads(r.stdout)
        self.id = self.state["id"]
        LIVE[self.state_dir] = self.id

    @property
    def hosts(self):
        return self.state["hosts"]

    def host(self, name):
        return next(h for h in self.hosts if h["name"] == name)

    def tool(self, *args, timeout=60):
        r = subprocess.run([sys.executable, TESTBED, "--state-dir", self.state_dir] + list(args),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise BenchError(f"testbed {' '.join(args)}: status {r.returncode}: "
                             f"{r.stderr.strip()}")
        return r

    def shape(self, name, rate_bits):
        self.tool("shape", self.id, name, "--rate", fmt_rate(rate_bits))
        self.host(name)["rate_bit"] = rate_bits

    def rate(self, name):
        return float(self.host(name)["rate_bit"])

    def exec_argv(self, name, argv):
        return ["ip", "netns", "exec", self.host(name)["ns"]] + list(argv)

    def write_hostfile(self, path, names, server_weights=None):
        """server_weights: {host name: the hostfile's server_weight} (launch.py's field)."""
        with open(path, "w") as f:
            for n in names:
                weight = (server_weights or {}).get(n)
                f.write(self.host(n)["addr"]
                        + (f" server_weight={weight:g}" if weight is not None else "") + "\n")
        return path

    def ssh_opts(self):
        return f"-F {self.state['ssh_config']}"

    def set_tcp_cc(self, algorithm):
        """Every host's TCP congestion control (a per-namespace sysctl); returns what each
        host uses afterwards."""
        used = set()
        for h in self.hosts:
            path = "/proc/sys/net/ipv4/tcp_congestion_control"
            if algorithm:
                r = subprocess.run(["ip", "netns", "exec", h["ns"], "sh", "-c",
                                    f"echo {shlex.quote(algorithm)} > {path}"],
                                   capture_output=True, text=True, timeout=10)
                if r.returncode != 0:
                    raise BenchError(f"cannot set TCP congestion control {algorithm} on "
                                     f"{h['name']}: {r.stderr.strip()}")
            r = subprocess.run(["ip", "netns", "exec", h["ns"], "cat", path],
                               capture_output=True, text=True, timeout=10)
            used.add(r.stdout.strip())
        return ",".join(sorted(used))

    def start_counter_reader(self):
        """A sleeper in the switch namespace: /proc/<its pid>/net/dev is the switch's view."""
        self.sampler_proc = subprocess.Popen(
            ["ip", "netns", "exec", self.state["switch_ns"], "sleep", "1000000"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        path = f"/proc/{self.sampler_proc.pid}/net/dev"
        deadline = time.monotonic() + 10
        want = {h["if_switch"] for h in self.hosts}
        while time.monotonic() < deadline:
            try:
                if want <= set(read_net_dev(path)):
                    return path
            except OSError:
                pass
            time.sleep(0.05)
        raise BenchError("cannot read the switch namespace's interface counters")

    def down(self):
        if self.sampler_proc is not None and self.sampler_proc.poll() is None:
            self.sampler_proc.kill()
            self.sampler_proc.wait()
        problems = ""
        if self.id is not None:
            r = subprocess.run([sys.executable, TESTBED, "--state-dir", self.state_dir, "down",
                                self.id], stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=90)
            problems = r.stderr.strip() if r.returncode != 0 else ""
        LIVE.pop(self.state_dir, None)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return problems


def read_net_dev(path):
    """{interface: (rx_bytes, tx_bytes)} from a /proc/<pid>/net/dev."""
    out = {}
    with open(path) as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def read_proc_table(path, prefix):
    """{name: value} of a /proc/<pid>/net/{snmp,netstat} table (a header line and a value line
    that both start with `prefix`)."""
    with open(path) as f:
        lines = [line.split() for line in f if line.startswith(prefix)]
    out = {}
    for head, values in zip(lines[0::2], lines[1::2]):
        out.update({k: int(v) for k, v in zip(head[1:], values[1:]) if v.lstrip("-").isdigit()})
    return out


def read_net_health(bed):
    """Totals over the bed: TCP segments retransmitted and retransmission timeouts (each
    host's namespace, read through its sshd's /proc entry), and packets the links' queues
    dropped (tc, both ends of every link)."""
    retrans = timeouts = drops = 0
    for h in bed.hosts:
        pid = h.get("sshd_pid")
        if pid:
            try:
                retrans += read_proc_table(f"/proc/{pid}/net/snmp", "Tcp:").get("RetransSegs", 0)
                timeouts += read_proc_table(f"/proc/{pid}/net/netstat", "TcpExt:").get(
                    "TCPTimeouts", 0)
            except OSError:
                pass
        for ns, dev in ((h["ns"], h["if_host"]), (bed.state["switch_ns"], h["if_switch"])):
            r = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True, timeout=10)
            try:
                # the leaf FIFO (or netem) drops; HTB's own count repeats its children's
                drops += sum(q.get("drops", 0) for q in json.loads(r.stdout or "[]")
                             if q.get("kind") in ("bfifo", "pfifo", "netem"))
            except ValueError:
                pass
    return {"tcp_retransmitted_segments": retrans, "tcp_timeouts": timeouts,
            "queue_drops": drops}


def read_cpu():
    """(busy, total, softirq) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total, fields[6]


class BedCpu:
    """CPU time of every process in the bed's network namespaces (the job's processes, their
    ssh sessions and sshds, mpirun), summed over pids as they come and go."""

    def __init__(self, namespaces):
        self.inodes = set()
        for ns in namespaces:
            try:
                self.inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
            except OSError:
                pass
        self.last = {}  # (pid, start) -> utime + stime
        self.total = 0

    def read(self):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.stat(f"/proc/{pid}/ns/net").st_ino not in self.inodes:
                    continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            key = (pid, fields[19])  # start time: a reused pid is another process
            used = int(fields[11]) + int(fields[12])
            self.total += max(0, used - self.last.get(key, 0))
            self.last[key] = used
        return self.total


class Sampler(threading.Thread):
    """Samples the switch ports' byte counters and /proc/stat every `period` seconds."""

    def __init__(self, net_dev_path, ports, bed_cpu=None, period=0.05, cpu_every=5):
        super().__init__(daemon=True)
        self.path, self.ports, self.period = net_dev_path, ports, period
        self.bed_cpu, self.cpu_every = bed_cpu, cpu_every
        # (unix time, {host: (bytes from host, bytes to host)}, (busy, total, softirq) jiffies
        # of the machine, jiffies of the bed's processes or None)
        self.samples = []
        self.stop_event = threading.Event()

    def sample(self, with_bed_cpu=True):
        t = time.time()
        dev = read_net_dev(self.path)
        cpu = read_cpu()
        bed = self.bed_cpu.read() if self.bed_cpu and with_bed_cpu else None
        # the switch end's rx is what the host sent; its tx is what the host received
        self.samples.append((t, {h: dev[i] for h, i in self.ports.items()}, cpu, bed))

    def run(self):
        n = 0
        while not self.stop_event.is_set():
            self.sample(with_bed_cpu=n % self.cpu_every == 0)
            n += 1
            self.stop_event.wait(self.period)

    def stop(self):
        self.stop_event.set()
        self.join(5)
        self.sample()


def interpolate(samples, t, get):
    """Linear interpolation of the value get(sample) at time t."""
    if t <= samples[0][0]:
        return get(samples[0])
    for a, b in zip(samples, samples[1:]):
        if a[0] <= t <= b[0]:
            if b[0] == a[0]:
                return get(b)
            f = (t - a[0]) / (b[0] - a[0])
            return get(a) + f * (get(b) - get(a))
    return get(samples[-1])


def timeseries(samples, t0, t1, step=0.1):
    """Each host's link throughput (Mbit/s sent, received) in steps of `step` over [t0, t1]:
    {"t": [seconds from t0], host: {"sent": [...], "received": [...]}}."""
    if t1 <= t0 or len(samples) < 2:
        return None
    n = max(1, int((t1 - t0) / step))
    ts = [t0 + i * step for i in range(n + 1)]
    out = {"t": [round(t - t0, 3) for t in ts[1:]]}
    for h in samples[0][1]:
        series = {}
        for d, k in (("sent", 0), ("received", 1)):
            vals = [interpolate(samples, t, lambda s: s[1][h][k]) for t in ts]
            series[d] = [round((b - a) * 8 / step / 1e6, 2) for a, b in zip(vals, vals[1:])]
        out[h] = series
    return out


def window_stats(samples, t0, t1, rates):
    """Per-link throughput, the busiest link's utilisation and the CPU over [t0, t1]."""
    seconds = t1 - t0
    if seconds <= 0 or len(samples) < 2:
        return None
    links = {}
    for h in samples[0][1]:
        sent = (interpolate(samples, t1, lambda s: s[1][h][0])
                - interpolate(samples, t0, lambda s: s[1][h][0]))
        recv = (interpolate(samples, t1, lambda s: s[1][h][1])
                - interpolate(samples, t0, lambda s: s[1][h][1]))
        links[h] = {"sent_bytes": round(sent), "received_bytes": round(recv),
                    "sent_util": sent * 8 / seconds / rates[h],
                    "received_util": recv * 8 / seconds / rates[h]}
    busiest_host, busiest_dir, busiest = None, None, -1.0
    for h, v in links.items():
        for d in ("sent", "received"):
            if v[f"{d}_util"] > busiest:
                busiest_host, busiest_dir, busiest = h, d, v[f"{d}_util"]
    busy = (interpolate(samples, t1, lambda s: s[2][0])
            - interpolate(samples, t0, lambda s: s[2][0]))
    total = (interpolate(samples, t1, lambda s: s[2][1])
             - interpolate(samples, t0, lambda s: s[2][1]))
    softirq = (interpolate(samples, t1, lambda s: s[2][2])
               - interpolate(samples, t0, lambda s: s[2][2]))
    bed = [s for s in samples if s[3] is not None]
    bed_busy = None
    if len(bed) >= 2 and total > 0:
        used = (interpolate(bed, t1, lambda s: s[3]) - interpolate(bed, t0, lambda s: s[3]))
        bed_busy = used / total
    return {"seconds": seconds, "links": links, "busiest_link": f"{busiest_host} {busiest_dir}",
            "link_utilisation": busiest,
            # fractions of all the machine's cores over the window: the machine as a whole
            # (anything else running on it included), the processes in the bed's namespaces
            # (user + system time), and softirq time (the network stack; not in either process
            # figure when the kernel accounts IRQ time separately)
            "cpu_busy": busy / total if total > 0 else None,
            "cpu_bed_processes": bed_busy,
            "cpu_softirq": softirq / total if total > 0 else None}


# ---------------------------------------------------------------------------------- jobs

def run_logged(argv, log_path, timeout, env=None):
    """Runs argv (its own session), output into log_path; returns (status, output)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        log.flush()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            status = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)  # launch.py / mpirun stop their job on TERM
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            status = None
        except BaseException:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            raise
    with open(log_path) as f:
        return status, f.read()


def tail(text, n=15):
    return "\n".join(text.splitlines()[-n:])


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin_dir
        self.out = args.out
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.W = args.workers
        self.S = args.server_hosts
        self.worker_hosts = [f"h{i}" for i in range(self.W)]
        self.server_hosts = [f"h{i}" for i in range(self.W, self.W + self.S)]
        self.cases = []
        self.bed = None
        self.sampler_path = None
        self.case_no = 0

    # -- estimates, for iteration counts and timeouts only
    def estimate_seconds(self, size, kind):
        bytes_per_s = self.args.rate / 8 * 0.93
        if kind == "ps_own":
            return 2.0 * size / bytes_per_s
        return 2.0 * (self.W - 1) / self.W * size / bytes_per_s

    def iterations_for(self, size, kind, slow=1.0):
        if self.args.iterations:
            return self.args.iterations
        per = self.estimate_seconds(size, kind) * slow
        return max(2, min(30, math.ceil(self.args.seconds / per)))

    def warmup_for(self, size):
        if self.args.warmup is not None:
            return self.args.warmup
        return 2 if size < (64 << 20) else 1

    def timeout_for(self, size, kind, iterations, slow=1.0):
        per = self.estimate_seconds(size, kind) * slow
        return 90 + 4 * per * (iterations + self.warmup_for(size) + 3)

    # -- the runs
    def sampled(self, label, argv, timeout, env=None):
        self.case_no += 1
        log = os.path.join(self.logs, f"{self.case_no:02d}-{label}.log")
        ports = {h["name"]: h["if_switch"] for h in self.bed.hosts}
        sampler = Sampler(self.sampler_path, ports, self.bed_cpu())
        health0 = read_net_health(self.bed)
        sampler.sample()
        sampler.start()
        t0 = time.monotonic()
        try:
            status, out = run_logged(argv, log, timeout, env)
        finally:
            sampler.stop()
        health1 = read_net_health(self.bed)
        self.last_health = {k: health1[k] - health0[k] for k in health0}
        return status, out, sampler.samples, time.monotonic() - t0, log

    def bed_cpu(self):
        return BedCpu([h["ns"] for h in self.bed.hosts] + [self.bed.state["switch_ns"]])

    def rates(self):
        return {h["name"]: float(h["rate_bit"]) for h in self.bed.hosts}

    def ps_case(self, label, size, layout, mode, iterations, timeout, extra=None,
                compression=("none", "none"), server_weights=None):
        """server_weights: {host: weight} for the servers beside the workers (hostfile
        server_weight=, hence PS_SERVER_WEIGHTS)."""
        hf_workers = self.bed.write_hostfile(os.path.join(self.out, "workers.hosts"),
                                             self.worker_hosts, server_weights)
        argv = [sys.executable, LAUNCH, "-n", str(self.W), "-H", hf_workers,
                "--ssh-opts", self.bed.ssh_opts(), "--env", "OMP_NUM_THREADS=1"]
        if layout == "own":
            hf_servers = self.bed.write_hostfile(os.path.join(self.out, "servers.hosts"),
                                                 self.server_hosts)
            argv += ["--server-hostfile", hf_servers, "-s", str(self.S)]
        else:
            argv += ["-s", str(self.W)]
        if self.args.chunk_bytes:
            argv += ["--env", f"PS_CHUNK_BYTES={self.args.chunk_bytes}"]
        argv += ["--env", f"PS_REPLICATION={self.args.replication}"]
        if self.args.tcp_rcvbuf:
            argv += ["--env", f"PS_TCP_RCVBUF={self.args.tcp_rcvbuf}"]
        argv += [os.path.join(self.bin, "ps-bench"), "--worker_mode", f"--mode={mode}",
                 f"--sizes={size_name(size)}", "--ops=pushpull", f"--iterations={iterations}",
                 f"--warmup={self.warmup_for(size)}", f"--compression={compression[0]}",
                 f"--pull_compression={compression[1]}"]
        env = dict(os.environ, PS_BIN_DIR=self.bin)
        status, out, samples, wall, log = self.sampled(
            label, self.bed.exec_argv(self.worker_hosts[0], argv), timeout, env)
        if status != 0:
            raise BenchError(f"{label}: launch.py exited with "
                             f"{'a timeout' if status is None else status} (log {log}):\n"
                             f"{tail(out)}")
        per_worker = {}
        for line in out.splitlines():
            m = re.match(r"^\[worker (\d+)\] ps-bench-(samples|result) (.*)$", line)
            if not m:
                continue
            fields = dict(kv.split("=", 1) for kv in m.group(3).split())
            rank = int(fields["rank"])
            entry = per_worker.setdefault(rank, {"samples_s": []})
            if m.group(2) == "samples":
                entry["samples_s"] += [int(x) / 1e9 for x in fields["ns"].split(",") if x]
            else:
                entry["iterations"] = int(fields["iterations"])
                entry["start"] = int(fields["start_unix_us"]) / 1e6
                entry["end"] = int(fields["end_unix_us"]) / 1e6
        if sorted(per_worker) != list(range(self.W)) or any(
                len(e["samples_s"]) != e.get("iterations", -1) for e in per_worker.values()):
            raise BenchError(f"{label}: incomplete results from the workers (log {log})")
        workers = []
        for rank, e in sorted(per_worker.items()):
            mean = sum(e["samples_s"]) / len(e["samples_s"])
            workers.append({"rank": rank, "iterations": e["iterations"], "mean_s": mean,
                            "median_s": sorted(e["samples_s"])[len(e["samples_s"]) // 2],
                            "samples_s": e["samples_s"], "start": e["start"], "end": e["end"],
                            "bytes_per_s": size / mean})
        if mode == "dist_sync":
            # every worker ran the same rounds: the window all of them were in their loops
            t0 = max(w["start"] for w in workers)
            t1 = min(w["end"] for w in workers)
            iteration = sum(w["mean_s"] for w in workers) / len(workers)
        else:
            # dist_async: the window every worker was still running its loop
            t0 = max(w["start"] for w in workers)
            t1 = min(w["end"] for w in workers)
            iteration = None
        stats = window_stats(samples, t0, t1, self.rates())
        if stats:
            stats["timeseries"] = timeseries(samples, t0, t1)
        case = {"label": label, "system": "ps", "layout": layout, "mode": mode,
                "size": size, "workers": self.W,
                "servers": self.S if layout == "own" else self.W,
                "server_hosts": self.S if layout == "own" else 0,
                "iterations": iterations, "iteration_s": iteration,
                "per_worker": workers, "window": stats, "wall_s": wall, "log": log,
                "chunk_bytes": self.args.chunk_bytes or None,
                "tcp_rcvbuf": self.args.tcp_rcvbuf or None}
        if compression != ("none", "none"):
            case["compression"] = {"push": compression[0], "pull": compression[1]}
        if server_weights:
            # by server rank: beside the workers, server i runs on worker host i
            case["server_weights"] = [server_weights.get(h, 1.0) for h in self.worker_hosts]
        return case

    def mpi_case(self, label, size, algorithm, iterations, timeout):
        subnet = self.bed.state["subnet"]
        hosts = ",".join(f"{self.bed.host(h)['addr']}:1" for h in self.worker_hosts)
        argv = ["mpirun", "--allow-run-as-root", "-np", str(self.W), "--host", hosts,
                "--map-by", "node", "--mca", "plm_rsh_agent", "ssh",
                "--mca", "plm_rsh_args", self.bed.ssh_opts(),
                "--mca", "plm_rsh_no_tree_spawn", "1",
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
                "--mca", "mpi_yield_when_idle", "1"]
        code = MPI_ALGORITHMS[algorithm]
        if code is not None:
            argv += ["--mca", "coll_tuned_use_dynamic_rules", "1",
                     "--mca", "coll_tuned_allreduce_algorithm", str(code)]
        argv += [os.path.join(self.bin, "ps-bench-mpi-allreduce"), f"--sizes={size_name(size)}",
                 f"--iterations={iterations}", f"--warmup={self.warmup_for(size)}"]
        status, out, samples, wall, log = self.sampled(
            label, self.bed.exec_argv(self.worker_hosts[0], argv), timeout)
        m = re.search(r"^mpi-allreduce: (size=.*)$", out, re.MULTILINE)
        if status != 0 or not m:
            raise BenchError(f"{label}: mpirun exited with "
                             f"{'a timeout' if status is None else status} (log {log}):\n"
                             f"{tail(out)}")
        fields = dict(kv.split("=", 1) for kv in m.group(1).split())
        t0 = int(fields["start_unix_us"]) / 1e6
        t1 = int(fields["end_unix_us"]) / 1e6
        stats = window_stats(samples, t0, t1, self.rates())
        if stats:
            stats["timeseries"] = timeseries(samples, t0, t1)
        return {"label": label, "system": "mpi", "algorithm": algorithm,
                "algorithm_code": code, "size": size, "workers": self.W,
                "iterations": int(fields["iterations"]),
                "iteration_s": float(fields["mean_us"]) / 1e6,
                "median_s": float(fields["p50_us"]) / 1e6,
                "min_s": float(fields["min_us"]) / 1e6, "max_s": float(fields["max_us"]) / 1e6,
                "window": stats, "wall_s": wall, "log": log}

    def reference_case(self):
        """One TCP flow h0 -> h1 (testbed measure): what a saturated link reads as."""
        ports = {h["name"]: h["if_switch"] for h in self.bed.hosts}
        sampler = Sampler(self.sampler_path, ports, self.bed_cpu())
        sampler.sample()
        sampler.start()
        try:
            r = self.bed.tool("measure", self.bed.id, "h0", "h1", "--seconds", "4", "--json",
                              timeout=120)
        finally:
            sampler.stop()
        res = json.loads(r.stdout)[0]
        # the transfer's last 2.5 s (its start has the TCP ramp-up): it ends at the last
        # sample where h0 was still sending in bulk
        samples = sampler.samples
        end = max(i for i in range(1, len(samples))
                  if samples[i][1]["h0"][0] - samples[i - 1][1]["h0"][0] > 10000)
        t1 = samples[end - 1][0]
        stats = window_stats(samples, t1 - 2.5, t1, self.rates())
        # The fraction of the rate a saturated flow carries in its steady state: the window's
        # (the counters count a GSO packet's payload with one set of headers: within 0.1% of
        # the payload). The mean over the whole transfer includes the ramp-up, which a link
        # delay stretches (a 20 ms round trip: 0.78 against 0.96).
        return {"label": "tcp_reference", "system": "tcp", "mbit_per_s": res["mbit_per_s"],
                "goodput_fraction": stats["links"]["h0"]["sent_util"],
                "mean_goodput_fraction": res["mbit_per_s"] * 1e6 / self.args.rate,
                "window": stats}

    def record(self, case):
        # over the whole job (start, warm-up and timed loop), not only the window
        case["network"] = getattr(self, "last_health", None)
        self.cases.append(case)
        w = case.get("window") or {}
        it = case.get("iteration_s")
        util = w.get("link_utilisation")
        cpu = w.get("cpu_busy")
        msg = f"{case['label']}: "
        if it is not None:
            msg += f"iteration {it:.3f} s, "
        elif case.get("per_worker"):
            msg += "per-worker iteration " + ", ".join(
                f"{x['mean_s']:.2f}" for x in case["per_worker"]) + " s, "
        if util is not None:
            msg += f"busiest link {w['busiest_link']} at {util:.3f} of its rate, "
        if cpu is not None:
            msg += (f"CPU {100 * cpu:.0f}% busy (the bed's processes "
                    f"{100 * (w.get('cpu_bed_processes') or 0):.0f}%, softirq "
                    f"{100 * (w.get('cpu_softirq') or 0):.0f}%)")
        net = case.get("network")
        if net:
            msg += (f"; in the job: {net['queue_drops']} packets dropped by link queues, "
                    f"{net['tcp_retransmitted_segments']} TCP segments retransmitted, "
                    f"{net['tcp_timeouts']} retransmission timeouts")
        say(msg)
        self.write_json()

    # -- the whole run
    def run(self):
        a = self.args
        n_hosts = self.W + self.S
        say(f"making a bed of {n_hosts} hosts at {fmt_rate(a.rate)} "
            f"(workers on {self.worker_hosts[0]}..{self.worker_hosts[-1]}, "
            f"server hosts {self.server_hosts[0]}..{self.server_hosts[-1]})")
        self.bed = Bed(n_hosts, a.rate, a.delay_us)
        try:
            self.sampler_path = self.bed.start_counter_reader()
            self.tcp_cc = self.bed.set_tcp_cc(a.tcp_cc)
            say(f"bed {self.bed.id} up on {self.bed.state['subnet']}, TCP congestion control "
                f"{self.tcp_cc}")
            ref = self.reference_case()
            self.reference = ref
            say(f"reference: one TCP flow h0 -> h1: {ref['mbit_per_s']:.1f} Mbit/s of payload; "
                f"the counters read {ref['window']['links']['h0']['sent_util']:.3f} of the rate")
            self.write_json()
            for size in a.sizes:
                if "main" in a.parts:
                    for layout in a.layouts:
                        kind = f"ps_{layout}"
                        n = self.iterations_for(size, kind)
                        say(f"{kind} dist_sync {size_name(size)}: {n} iterations ...")
                        self.record(self.ps_case(f"{kind}_sync_{size_name(size)}", size, layout,
                                                 "dist_sync", n,
                                                 self.timeout_for(size, kind, n)))
                    if a.mpi != "off":
                        for alg in a.mpi_algorithms:
                            n = self.iterations_for(size, "mpi")
                            say(f"mpi {alg} {size_name(size)}: {n} iterations ...")
                            self.record(self.mpi_case(f"mpi_{alg}_{size_name(size)}", size, alg,
                                                      n, self.timeout_for(size, "mpi", n)))
            if "straggler" in a.parts:
                self.straggler()
            if "compression" in a.parts:
                self.compression()
        finally:
            problems = self.bed.down()
            if problems:
                say(f"testbed down reported: {problems}")
            else:
                say(f"bed {self.bed.id} removed")
        self.write_json()
        return self.cases

    def compression(self):
        """dist_sync push+pull with servers beside the workers, with 2bit, 1bit and fp16
        pushes, then with 2bit pushes and pulls, against the same job uncompressed (measured
        here unless the main part measured it)."""
        size = self.args.straggler_size
        kind = "ps_beside"
        n = self.iterations_for(size, kind)
        if not find(self.cases, f"{kind}_sync_{size_name(size)}"):
            say(f"{kind} dist_sync {size_name(size)}: {n} iterations ...")
            self.record(self.ps_case(f"{kind}_sync_{size_name(size)}", size, "beside",
                                     "dist_sync", n, self.timeout_for(size, kind, n)))
        for push, pull in (("2bit", "none"), ("1bit", "none"), ("fp16", "none"),
                           ("2bit", "2bit")):
            name = push if pull == "none" else f"{push}-{pull}"
            say(f"{kind} dist_sync {size_name(size)}, compression {push}/{pull}: "
                f"{n} iterations ...")
            self.record(self.ps_case(f"compress_{name}_{kind}_sync_{size_name(size)}", size,
                                     "beside", "dist_sync", n, self.timeout_for(size, kind, n),
                                     compression=(push, pull)))

    def straggler(self):
        a = self.args
        size = a.straggler_size
        slow_host = self.worker_hosts[-1]
        f = a.straggler_factor
        # dist_async on equal links first: the baseline the straggler's effect is measured on
        for layout in a.layouts:
            kind = f"ps_{layout}"
            n = self.iterations_for(size, kind)
            say(f"{kind} dist_async {size_name(size)} on equal links: {n} iterations ...")
            self.record(self.ps_case(f"{kind}_async_{size_name(size)}", size, layout,
                                     "dist_async", n, self.timeout_for(size, kind, n)))
        say(f"straggler: {slow_host}'s link at {fmt_rate(a.rate / f)} (1/{f:g} of the rate)")
        self.bed.shape(slow_host, a.rate / f)
        try:
            for layout in a.layouts:
                kind = f"ps_{layout}"
                for mode in ("dist_async", "dist_sync"):
                    # dist_async: as many iterations as on equal links, so that the other
                    # workers' loops are as long as there (the slow one takes longer)
                    n = self.iterations_for(size, kind, slow=f if mode == "dist_sync" else 1)
                    short = "async" if mode == "dist_async" else "sync"
                    say(f"{kind} {mode} {size_name(size)} with the straggler: {n} iterations ...")
                    case = self.ps_case(f"straggler_{kind}_{short}_{size_name(size)}", size,
                                        layout, mode, n, self.timeout_for(size, kind, n, slow=f))
                    case["straggler"] = {"host": slow_host, "factor": f}
                    self.record(case)
            if "beside" in a.layouts and a.straggler_server_weight > 0:
                # the slow host's server holds less of the model (hostfile server_weight=)
                w = a.straggler_server_weight
                n = self.iterations_for(size, "ps_beside")
                say(f"ps_beside dist_async {size_name(size)} with the straggler, its server at "
                    f"weight {w:g}: {n} iterations ...")
                case = self.ps_case(f"straggler_ps_beside_weighted_async_{size_name(size)}",
                                    size, "beside", "dist_async", n,
                                    self.timeout_for(size, "ps_beside", n, slow=f),
                                    server_weights={slow_host: w})
                case["straggler"] = {"host": slow_host, "factor": f}
                self.record(case)
            if a.mpi != "off":
                for alg in a.mpi_algorithms:
                    n = self.iterations_for(size, "mpi", slow=f)
                    say(f"mpi {alg} {size_name(size)} with the straggler: {n} iterations ...")
                    case = self.mpi_case(f"straggler_mpi_{alg}_{size_name(size)}", size, alg, n,
                                         self.timeout_for(size, "mpi", n, slow=f))
                    case["straggler"] = {"host": slow_host, "factor": f}
                    self.record(case)
        finally:
            self.bed.shape(slow_host, a.rate)

    # -- results
    def meta(self):
        cpu_model = ""
        try:
            with open("/proc/cpuinfo") as fh:
                m = re.search(r"^model name\s*:\s*(.*)$", fh.read(), re.MULTILINE)
                cpu_model = m.group(1) if m else ""
        except OSError:
            pass
        mpi_version = ""
        if shutil.which("mpirun"):
            r = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
            mpi_version = r.stdout.splitlines()[0] if r.stdout else ""
        return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                "kernel": platform.release(), "cpu_model": cpu_model,
                "cores": os.cpu_count(), "mpi": mpi_version,
                "command": " ".join(shlex.quote(x) for x in sys.argv),
                "rate_bit": self.args.rate, "delay_us": self.args.delay_us,
                "replication": self.args.replication,
                "delay_method": self.bed.state.get("delay_method"),
                "workers": self.W, "server_hosts": self.S,
                "chunk_bytes": self.args.chunk_bytes or None,
                "tcp_rcvbuf": self.args.tcp_rcvbuf or None, "warmup": self.args.warmup,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "tcp_congestion_control": getattr(self, "tcp_cc", None),
                "loadavg_at_end": os.getloadavg()}

    def write_json(self):
        doc = {"meta": self.meta(), "reference": getattr(self, "reference", None),
               "cases": self.cases, "ratios": ratios(self.cases, self.W)}
        path = os.path.join(self.out, "bed_bench.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(path + ".tmp", path)
        return path


def find(cases, label):
    return next((c for c in cases if c["label"] == label), None)


def ratios(cases, workers):
    """The bed's targets (docs/scaling.md), each a ratio of figures of this run (None where
    not measured)."""
    out = []
    sizes = sorted({c["size"] for c in cases if c.get("system") in ("ps", "mpi")})
    for size in sizes:
        s = size_name(size)
        mpis = [c for c in cases if c["label"].startswith("mpi_") and c["size"] == size
                and not c.get("straggler")]
        best = min(mpis, key=lambda c: c["iteration_s"]) if mpis else None
        for layout, bound, what in (("beside", 1.1, "servers beside workers"),
                                    ("own", 0.75, f"servers on {workers} hosts of their own")):
            ps = find(cases, f"ps_{layout}_sync_{s}")
            if ps and best:
                value = ps["iteration_s"] / best["iteration_s"]
                out.append({"id": f"{layout}_vs_mpi_{s}",
                            "what": f"{s} dist_sync iteration, {what}, over the best "
                                    f"MPI_Allreduce ({best['algorithm']})",
                            "value": value, "target": f"<= {bound}" if s == "16MB" else "",
                            "met": value <= bound if s == "16MB" else None})
        for c in cases:
            if c["size"] == size and c.get("system") == "ps" and c["mode"] == "dist_sync" \
                    and not c.get("straggler") and not c.get("compression") \
                    and c.get("window"):
                u = c["window"]["link_utilisation"]
                out.append({"id": f"util_{c['label']}",
                            "what": f"busiest link's utilisation, {c['label']}",
                            "value": u, "target": ">= 0.9", "met": u >= 0.9})
    for layout in ("own", "beside", "beside_weighted"):
        for c in cases:
            if not (c.get("straggler") and c["label"].startswith(f"straggler_ps_{layout}_async")):
                continue
            # against the same layout on equal links, without weights
            base = find(cases, f"ps_{layout.split('_')[0]}_async_{size_name(c['size'])}")
            if not base:
                continue
            slow_rank_host = c["straggler"]["host"]
            # workers are ranked by host address: rank i runs on h<i>
            slow_rank = int(slow_rank_host[1:])
            fast = [w for w in c["per_worker"] if w["rank"] != slow_rank]
            fast_base = [w for w in base["per_worker"] if w["rank"] != slow_rank]
            thr = sum(w["bytes_per_s"] for w in fast) / len(fast)
            thr_base = sum(w["bytes_per_s"] for w in fast_base) / len(fast_base)
            drop = 1 - thr / thr_base
            weighted = (f", the slow host's server at weight {min(c['server_weights']):g}"
                        if c.get("server_weights") else "")
            out.append({"id": f"straggler_async_drop_{layout}",
                        "what": f"dist_async, servers {layout.split('_')[0]}{weighted}: drop "
                                "of the other workers' "
                                f"throughput with one host at 1/{c['straggler']['factor']:g} "
                                "of the rate",
                        "value": drop, "target": "<= 0.1", "met": drop <= 0.1})
    for c in cases:
        if not (c.get("compression") and c.get("iteration_s")):
            continue
        base = find(cases, f"ps_beside_sync_{size_name(c['size'])}")
        if not (base and base.get("iteration_s")):
            continue
        push, pull = c["compression"]["push"], c["compression"]["pull"]
        # the targets are 2bit's; the other types are reported beside them
        bound = {("2bit", "none"): 1.8, ("2bit", "2bit"): 5.0}.get((push, pull))
        speedup = base["iteration_s"] / c["iteration_s"]
        out.append({"id": f"speedup_{c['label']}",
                    "what": f"{size_name(c['size'])} dist_sync iteration, servers beside, "
                            f"uncompressed over {push} pushes"
                            + (f" and {pull} pulls" if pull != "none" else ""),
                    "value": speedup, "target": f">= {bound:g}" if bound else "",
                    "met": speedup >= bound if bound else None})
    for c in cases:
        if c.get("straggler") and c.get("iteration_s"):
            base_label = c["label"][len("straggler_"):]
            base = find(cases, base_label)
            if base and base.get("iteration_s"):
                out.append({"id": f"slowdown_{base_label}",
                            "what": f"{base_label}: iteration time with the straggler over "
                                    "equal links", "value": c["iteration_s"] / base["iteration_s"],
                            "target": "", "met": None})
    return out


# ---------------------------------------------------------------------------------- report

def pct(x):
    return f"{100 * x:.0f}%" if x is not None else "-"


def print_report(doc, out=None):
    out = out or sys.stdout
    meta = doc["meta"]
    print(f"bed_bench: {meta['workers']} worker hosts, {meta['server_hosts']} server hosts, "
          f"links {fmt_rate(meta['rate_bit'])}"
          + (f" with {meta['delay_us'] / 1000:g} ms delay each way" if meta.get("delay_us") else "")
          + f", {meta['date']} on {meta['host']} "
          f"({meta['cores']} cores, {meta['cpu_model']})", file=out)
    ref = doc.get("reference")
    if ref:
        print(f"reference: one TCP flow reaches {ref['mbit_per_s']:.1f} Mbit/s of payload; the "
              f"counters read {ref['window']['links']['h0']['sent_util']:.3f} of the link's "
              "rate for it", file=out)
    print(f"{'case':36} {'size':>6} {'iter s':>8} {'median':>8} {'busiest link':>16} "
          f"{'util':>6} {'CPU':>5} {'bed':>5} {'sirq':>5}", file=out)
    for c in doc["cases"]:
        w = c.get("window") or {}
        it = c.get("iteration_s")
        if it is None and c.get("per_worker"):
            it_txt = "/".join(f"{x['mean_s']:.2f}" for x in c["per_worker"])
            med = ""
        else:
            it_txt = f"{it:.3f}" if it is not None else "-"
            med = c.get("median_s")
            if med is None and c.get("per_worker"):
                med = sorted(x["median_s"] for x in c["per_worker"])[len(c["per_worker"]) // 2]
            med = f"{med:.3f}" if med is not None else ""
        util = w.get("link_utilisation")
        cpu = w.get("cpu_busy")
        print(f"{c['label']:36} {size_name(c['size']):>6} {it_txt:>8} {med:>8} "
              f"{w.get('busiest_link', '-'):>16} "
              f"{(f'{util:.3f}' if util is not None else '-'):>6} "
              f"{(f'{100 * cpu:.0f}%' if cpu is not None else '-'):>5} "
              f"{pct(w.get('cpu_bed_processes')):>5} {pct(w.get('cpu_softirq')):>5}", file=out)
    print("CPU: the machine's cores busy over the timed loop (anything else running on the "
          "machine included); bed: the processes in the bed's namespaces; sirq: softirq (the "
          f"network stack); all as fractions of {meta['cores']} cores", file=out)
    print("ratios:", file=out)
    for r in doc["ratios"]:
        met = {True: "met", False: "NOT met", None: ""}[r["met"]]
        print(f"  {r['value']:7.3f}  {r['target']:8} {met:8} {r['what']}", file=out)


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = doc["cases"]
    meta = doc["meta"]
    main = [c for c in cases if not c.get("straggler") and not c.get("compression")
            and c.get("iteration_s")]
    sizes = sorted({c["size"] for c in main})
    strag = [c for c in cases if c.get("straggler") or c["label"].startswith("ps_")
             and "_async_" in c["label"]]
    fig, axes = plt.subplots(1, len(sizes) + (1 if strag else 0),
                             figsize=(5.2 * (len(sizes) + (1 if strag else 0)), 4.6),
                             squeeze=False)
    colours = {"ps_beside": "tab:blue", "ps_own": "tab:green", "mpi": "tab:orange"}
    for ax, size in zip(axes[0], sizes):
        cs = [c for c in main if c["size"] == size]
        names = [c["label"].rsplit("_", 1)[0].replace("_sync", "") for c in cs]
        vals = [c["iteration_s"] for c in cs]
        cols = [colours["mpi"] if c["system"] == "mpi" else colours[f"ps_{c['layout']}"]
                for c in cs]
        bars = ax.bar(range(len(cs)), vals, color=cols)
        for b, c in zip(bars, cs):
            w = c.get("window") or {}
            u, cpu = w.get("link_utilisation"), w.get("cpu_bed_processes")
            if u is not None:
                text = f"util {u:.2f}" + (f"\nbed cpu {100 * cpu:.0f}%" if cpu is not None
                                          else "")
                ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cs)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("iteration time (s)")
        ax.set_ylim(0, max(vals) * 1.25)
        ax.set_title(f"{size_name(size)}, {meta['workers']} worker hosts, "
                     f"{fmt_rate(meta['rate_bit'])} links"
                     + (f", {meta['delay_us'] / 1000:g} ms delay" if meta.get("delay_us") else ""),
                     fontsize=10)
    if strag:
        ax = axes[0][-1]
        labels, vals, cols = [], [], []
        def name(c):
            base = c["label"].replace("straggler_", "").rsplit("_", 1)[0]
            base = base.replace("ps_", "PS ").replace("mpi_", "MPI ").replace("_", " ")
            return base + (", one slow" if c.get("straggler") else ", equal links")
        for c in strag:
            if c["system"] == "ps" and c["mode"] == "dist_async":
                slow = c.get("straggler", {}).get("host")
                fast = [w for w in c["per_worker"] if f"h{w['rank']}" != (slow or "h3")]
                vals.append(sum(w["bytes_per_s"] for w in fast) / len(fast) / 1e6)
            else:
                vals.append(c["size"] / c["iteration_s"] / 1e6)
            labels.append(name(c))
            cols.append(colours["mpi"] if c["system"] == "mpi" else colours[f"ps_{c['layout']}"])
        ax.barh(range(len(vals)), vals, color=cols)
        ax.set_yticks(range(len(vals)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("MB/s per worker (async: mean of the full-rate workers)")
        ax.set_title("straggler: one host at 1/%g of the rate" % (
            next((c["straggler"]["factor"] for c in strag if c.get("straggler")), 4)),
            fontsize=10)
    fig.suptitle(f"PS vs MPI_Allreduce on the test bed ({meta['date'][:10]}, "
                 f"{meta['cores']} cores)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------- main

def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The parameter server (dist_sync push+pull; servers beside the workers "
                    "and on hosts of their own) against Open MPI's MPI_Allreduce on a test bed "
                    "of tools/testbed.py with shaped links; a straggler case; JSON and a plot. "
                    "Needs root.",
        epilog="Example (about 12 minutes on 2 cores):\n"
               "  sudo tools/bench/bed_bench.py --rate 100mbit --out /tmp/bed-bench\n"
               "Smoke run (seconds): tools/bench/bed_bench.py --smoke --out /tmp/bb-smoke\n"
               "See docs/scaling.md.")
    p.add_argument("--rate", type=parse_rate_bits, default=parse_rate_bits("100mbit"),
                   help="every link's rate, tc units (default 100mbit: low enough that the "
                        "links, not two cores, set the speed)")
    p.add_argument("--delay", default="0", metavar="DELAY",
                   help="every link's one-way delay, each direction, as testbed.py takes it: "
                        "200us, 1ms, ... (default 0; host to host crosses two links)")
    p.add_argument("--workers", type=int, default=4, help="worker hosts (default 4)")
    p.add_argument("--server-hosts", type=int, default=None,
                   help="server hosts of their own for the BytePS layout (default: as many as "
                        "worker hosts)")
    p.add_argument("--sizes", type=comma_list(), default=["16MB", "100MB"],
                   help="model sizes, binary units (default 16MB,100MB)")
    p.add_argument("--layouts", type=comma_list(["beside", "own"]), default=["beside", "own"],
                   help="PS layouts (default beside,own)")
    p.add_argument("--mpi-algorithms", type=comma_list(list(MPI_ALGORITHMS)),
                   default=["default", "ring"],
                   help="coll_tuned_allreduce_algorithm choices to run (default default,ring); "
                        "the best is the rival")
    p.add_argument("--mpi", choices=["on", "off", "auto"], default="auto",
                   help="run MPI_Allreduce: on (missing: an error), off, auto (when mpirun and "
                        "ps-bench-mpi-allreduce exist)")
    p.add_argument("--parts", type=comma_list(["main", "straggler", "compression"]),
                   default=["main", "straggler"],
                   help="main, straggler, compression (2bit, 1bit, fp16 pushes, then 2bit "
                        "pushes and pulls, at --straggler-size; default: main and straggler)")
    p.add_argument("--straggler-factor", type=float, default=4.0,
                   help="the slow host's link runs at rate / F (default 4)")
    p.add_argument("--straggler-size", type=parse_size, default=parse_size("16MB"),
                   help="model size of the straggler case (default 16MB)")
    p.add_argument("--straggler-server-weight", type=float, default=0.05,
                   help="also run the straggler's dist_async case with servers beside the "
                        "workers and the slow host's server at this weight (its hostfile "
                        "server_weight=; default 0.05; 0: not)")
    p.add_argument("--seconds", type=float, default=12.0,
                   help="timed seconds to aim for per case (iterations: 2..30)")
    p.add_argument("--iterations", type=int, default=0,
                   help="exactly this many timed iterations per case (0: from --seconds)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up iterations (default: 2 below 64MB, else 1)")
    p.add_argument("--chunk-bytes", type=parse_size, default=parse_size("64KB"),
                   help="PS_CHUNK_BYTES for the PS jobs (default 64KB: the runtime's 4MB "
                        "leaves one slice per server of a 16MB key, so a slice's pull cannot "
                        "overlap another's push; see docs/scaling.md)")
    p.add_argument("--tcp-rcvbuf", type=parse_size_or_zero, default=parse_size("64KB"),
                   help="PS_TCP_RCVBUF for the PS jobs (default 64KB: the windows of the flows "
                        "into one link then fit its queue, so none loses packets; 0: the "
                        "kernel's autotuning; see docs/scaling.md)")
    p.add_argument("--replication", choices=("0", "1"), default="0",
                   help="PS_REPLICATION for the PS jobs (default 0: all-reduce keeps no second "
                        "copy either; 1 measures what replication costs on the links)")
    p.add_argument("--bin-dir", default=_default_bin_dir(),
                   help="where ps-scheduler, ps-server, ps-bench, ps-bench-mpi-allreduce are "
                        "($PS_BIN_DIR, else the source tree's build/bin, else this script's "
                        "directory)")
    p.add_argument("--out", default=None,
                   help="output directory (default ./bed-bench-<date>): bed_bench.json, "
                        "bed_bench.png, logs/")
    p.add_argument("--tcp-cc", default="reno",
                   help="TCP congestion control of every host, a per-namespace sysctl (default "
                        "reno: on the bed's FIFO links both MPI and the PS run faster with it "
                        "than with bbr; '' keeps the machine's default; a bed host may choose "
                        "only among net.ipv4.tcp_allowed_congestion_control)")
    p.add_argument("--nice", type=int, default=-10,
                   help="scheduling priority of the bed (its sshds, so every process of every "
                        "job) and this driver (default -10: the benchmark outranks whatever "
                        "else runs on the machine; 0 leaves it alone)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--smoke", action="store_true",
                   help="a quick check of the whole path: 2 worker and 2 server hosts at "
                        "1gbit, 1MB, 2 iterations, default MPI algorithm, no straggler")
    p.add_argument("--report", metavar="JSON",
                   help="print the table of an earlier run's JSON (and redraw its plot with "
                        "--out); runs nothing")
    p.add_argument("--compact", metavar="FILE",
                   help="with --report: also write the JSON without the links' time series "
                        "(a tenth of the size)")
    p.add_argument("--plot-only", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.report:
        with open(args.report) as fh:
            doc = json.load(fh)
        doc["ratios"] = ratios(doc["cases"], doc["meta"]["workers"])
        if args.compact:
            for c in doc["cases"]:
                (c.get("window") or {}).pop("timeseries", None)
            with open(args.compact, "w") as fh:
                json.dump(doc, fh, indent=1)
        if args.plot_only:
            plot(doc, os.path.join(args.out or ".", "bed_bench.png"))
            return 0
        print_report(doc)
        if args.out and not args.no_plot:
            os.makedirs(args.out, exist_ok=True)
            draw(doc, os.path.abspath(args.report), args.out)
        return 0
    if args.smoke:
        args.workers, args.server_hosts = 2, 2
        args.rate = parse_rate_bits("1gbit")
        args.sizes = ["1MB"]
        args.iterations = args.iterations or 2
        args.mpi_algorithms = ["default"]
        args.parts = ["main"]
    if args.server_hosts is None:
        args.server_hosts = args.workers
    if not 2 <= args.workers <= 16 or not 1 <= args.server_hosts <= 16 \
            or args.workers + args.server_hosts > 32:
        p.error("want 2..16 worker hosts and 1..16 server hosts")
    args.sizes = [parse_size(s) for s in args.sizes]
    if args.straggler_factor < 1:
        p.error("--straggler-factor: want at least 1")
    if args.out is None:
        args.out = os.path.abspath(f"bed-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out = os.path.abspath(args.out)
    args.bin_dir = os.path.abspath(args.bin_dir)

    # what is needed, checked before anything is made
    import importlib.util
    spec = importlib.util.spec_from_file_location("testbed", TESTBED)
    testbed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(testbed)
    why = testbed.why_unavailable(need_tc=True) or testbed.ssh_missing()
    if why:
        print(f"SKIP: multi-host test bed unavailable: {why}", flush=True)
        return SKIP_CODE
    try:
        args.delay_us = testbed.parse_delay(args.delay)
    except testbed.UsageError as e:
        p.error(f"--delay: {e}")
    for name in ("ps-scheduler", "ps-server", "ps-bench"):
        if not os.access(os.path.join(args.bin_dir, name), os.X_OK):
            print(f"{PROG}: error: {name} not built in {args.bin_dir} (--bin-dir, PS_BIN_DIR)",
                  file=sys.stderr)
            return 2
    mpi_missing = None
    if not shutil.which("mpirun"):
        mpi_missing = "mpirun not found (Debian: openmpi-bin, tools/install-deps.sh)"
    elif not os.access(os.path.join(args.bin_dir, "ps-bench-mpi-allreduce"), os.X_OK):
        mpi_missing = (f"ps-bench-mpi-allreduce not built in {args.bin_dir} (install "
                       "libopenmpi-dev and re-run cmake)")
    if mpi_missing:
        if args.mpi == "on":
            print(f"{PROG}: error: {mpi_missing}", file=sys.stderr)
            return 2
        if args.mpi == "auto":
            say(f"no MPI baseline: {mpi_missing}")
            args.mpi = "off"

    def stop(signum, frame):
        raise SystemExit(128 + signum)  # unwinds: the bed is removed in run()'s finally
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, stop)

    if args.nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as e:
            say(f"cannot set the priority to {args.nice} ({e.strerror}); running at "
                f"{os.getpriority(os.PRIO_PROCESS, 0)}")
    os.makedirs(args.out, exist_ok=True)
    bench = Bench(args)
    try:
        bench.run()
    except BenchError as e:
        say(f"error: {e}")
        bench.write_json()
        return 1
    path = bench.write_json()
    with open(path) as fh:
        doc = json.load(fh)
    print_report(doc)
    plotted = None if args.no_plot else draw(doc, path, args.out)
    say(f"wrote {path}" + (f" and {plotted}" if plotted else ""))
    return 0


def draw(doc, json_path, out_dir):
    """Writes out_dir/bed_bench.png; with a python3 that lacks matplotlib (a private one
    first in PATH), through the system's /usr/bin/python3. Returns the path, or None."""
    png = os.path.join(out_dir, "bed_bench.png")
    try:
        plot(doc, png)
        return png
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.access(
                system, os.X_OK):
            r = subprocess.run([system, os.path.abspath(__file__), "--report", json_path,
                                "--plot-only", "--out", out_dir], capture_output=True, text=True)
            if r.returncode == 0:
                return png
        say("no plot: matplotlib is missing (python3-matplotlib, tools/install-deps.sh)")
        return None


if __name__ == "__main__":
    sys.exit(main())
