#!/usr/bin/env python3
"""A multi-host test bed on one machine: N hosts made as Linux network namespaces.

    id=$(tools/testbed.py up -n 4 --rate 1gbit)           # prints the bed id on stdout
    tools/testbed.py exec $id h0 -- tools/launch.py -n 4 -s 4 \\
        -H $(tools/testbed.py hostfile $id --path) \\
        --ssh-opts "$(tools/testbed.py info $id --ssh-opts)" build/bin/ps-kvstore-check
    tools/testbed.py down $id

Each host is a network namespace with its own stack, joined by a veth pair to a Linux bridge in
a switch namespace of its own. Addresses come from 198.18.0.0/15 (RFC 2544, benchmarking); no
host has a route out and nothing is attached to the machine's own interfaces, so traffic stays
inside the namespaces the bed made. Each link can be shaped with tc (rate: HTB; delay: netem)
on both of its ends, so it is full duplex like a NIC; where the kernel has no netem, a delay
line (tools/delayline.py, through iptables NFQUEUE) holds each packet where it arrives. Every
host runs an sshd on its own address with a host key made for the bed; one user key made for
the bed logs in as the current user (root), so tools/launch.py --launcher ssh reaches the hosts as
separate machines. The filesystem is shared: the hosts see the project's binaries at the
same absolute paths.

Names carry a prefix and the bed's id (namespaces psbed-<id>-h<i> and psbed-<id>-sw,
interfaces pb<id>h<i>, pb<id>s<i>, pb<id>br), and the state of each bed is written to
<state-dir>/<id>/state.json before anything is made, so `down` removes exactly what `up` made,
also after a crash. Needs root and iproute2 (`ip netns`, `tc`); see docs/testbed.md.
Python 3 standard library only.
"""

import argparse
import fcntl
import getpass
import ipaddress
import json
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from cli_args import join_negative_values  # noqa: E402 (beside this file)

# Where the words of a command passed on begin (exec's): no flag of this tool after them.
COMMAND_STARTS = ("--", "exec")
import time

PROG = "testbed.py"
PREFIX = "psbed"  # namespaces: psbed-<id>-sw, psbed-<id>-h<i>
IF_PREFIX = "pb"  # interfaces: pb<id>h<i> (host end), pb<id>s<i> (switch end), pb<id>br
BED_NET = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: benchmarking networks
ID_RE = re.compile(r"^[a-z0-9]{1,6}$")
NS_RE = re.compile(rf"^{PREFIX}-([a-z0-9]{{1,6}})-(sw|h\d+)$")
MAX_HOSTS = 250
DEFAULT_STATE_DIR = "/run/psbed"
SSHD = "/usr/sbin/sshd"
IPTABLES = "iptables-legacy"  # the NFQUEUE target; nftables' queue is often not built in
DELAYLINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayline.py")
QUEUE_S = 0.05  # a shaped link's queue holds this much time at its rate (plus in-flight delay)
MIN_QUEUE_BYTES = 256 * 1024
STATE_VERSION = 1


class UsageError(Exception):
    """A mistake on the command line: exit status 2."""


class BedError(Exception):
    """Something the bed could not do: exit status 1."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP during up: the partly made bed is removed."""


def say(msg):
    sys.stderr.write(f"[testbed] {msg}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# units


RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
              "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}
DELAY_UNITS = {"us": 1, "usec": 1, "ms": 1000, "msec": 1000, "s": 10**6, "sec": 10**6}


def parse_rate(text, given=None):
    """'100mbit', '1gbit', '10Gbit', '2.5gbit' (tc's units: bit, kbit, mbit, gbit, tbit; bps,
    kbps, mbps, gbps are bytes per second) -> bits per second; 'none'/'off'/'0' -> None.
    given: the flag and value a negative rate's refusal names (default --rate TEXT)."""
    t = text.strip().lower()
    if t in ("none", "off", "0", "unlimited"):
        return None
    if t.startswith("-"):
        raise UsageError(f"{given or '--rate ' + text}: want a positive rate, e.g. 100mbit or "
                         "1gbit (or none)")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)", t)
    if not m or m.group(2) not in RATE_UNITS:
        raise UsageError(f"bad rate '{text}': want a number and a unit, e.g. 100mbit, 1gbit, "
                         f"10gbit (units: {', '.join(RATE_UNITS)}), or 'none'")
    bits = int(round(float(m.group(1)) * RATE_UNITS[m.group(2)]))
    if bits < 8000:
        raise UsageError(f"rate '{text}' is below 8kbit")
    if bits > 400 * 10**9:
        raise UsageError(f"rate '{text}' is above 400gbit")
    return bits


def parse_delay(text, given=None):
    """'5ms', '200us', '0.5ms', '1s', '0' -> microseconds. given: the flag and value a negative
    delay's refusal names (default --delay TEXT)."""
    t = text.strip().lower()
    if t in ("0", "none", "off"):
        return 0
    if t.startswith("-"):
        raise UsageError(f"{given or '--delay ' + text}: want a positive delay, e.g. 200us or "
                         "5ms (or 0)")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)", t)
    if not m or m.group(2) not in DELAY_UNITS:
        raise UsageError(f"bad delay '{text}': want a number and a unit, e.g. 200us, 5ms, "
                         "0.1s, or 0")
    us = int(round(float(m.group(1)) * DELAY_UNITS[m.group(2)]))
    if us > 10 * 10**6:
        raise UsageError(f"delay '{text}' is above 10 s")
    return us


def fmt_rate(bits):
    if bits is None:
        return "unshaped"
    for unit, div in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= div:
            return f"{bits / div:g}{unit}"
    return f"{bits}bit"


def fmt_delay(us):
    if not us:
        return "0"
    if us >= 1000:
        return f"{us / 1000:g}ms"
    return f"{us}us"


def parse_link_spec(text):
    """--link HOST=RATE[,DELAY] -> (host, rate or None, delay or None); either part may be
    empty to keep the bed's default."""
    host, sep, rest = text.partition("=")
    if not sep or not host:
        raise UsageError(f"--link {text}: want HOST=RATE[,DELAY], e.g. h2=100mbit,5ms")
    rate_s, _, delay_s = rest.partition(",")
    rate = parse_rate(rate_s, f"--link {text}") if rate_s else "default"
    delay = parse_delay(delay_s, f"--link {text}") if delay_s else "default"
    return host, rate, delay


# --------------------------------------------------------------------------------------------
# running commands


def run(argv, check=True, timeout=30, what=None):
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BedError(f"{what or shlex.join(argv)}: no answer within {timeout} s") from None
    except FileNotFoundError:
        raise BedError(f"{argv[0]} not found: install iproute2 (tools/install-deps.sh)") from None
    if check and r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise BedError(f"{what or shlex.join(argv)} failed (status {r.returncode}): {msg}")
    return r


def netns_list():
    r = run(["ip", "netns", "list"], check=False)
    if r.returncode != 0:
        return []
    # lines: "name" or "name (id: 3)"
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def netns_pids(ns):
    r = run(["ip", "netns", "pids", ns], check=False)
    if r.returncode != 0:
        return []
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def proc_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def proc_alive(pid, start=None):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] in ("Z", "X"):
        return False
    return start is None or int(fields[19]) == start


def proc_cmd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def kill_pids(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if proc_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def why_unavailable(need_tc=False):
    """Why a bed cannot be made here (a sentence naming what to change), or None."""
    if os.geteuid() != 0:
        return ("needs root: network namespaces, veth links and tc need CAP_NET_ADMIN and "
                "CAP_SYS_ADMIN (run as root)")
    if not shutil.which("ip"):
        return "ip (iproute2) not found: install iproute2 (tools/install-deps.sh)"
    if need_tc and not shutil.which("tc"):
        return "tc (iproute2) not found: install iproute2 (tools/install-deps.sh)"
    probe = f"{PREFIX}-probe{os.getpid()}"
    r = run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return (f"'ip netns add' does not work here ({r.stderr.strip() or 'no output'}): a "
                "container needs CAP_SYS_ADMIN and a writable /run/netns")
    try:
        r = run(["ip", "-n", probe, "link", "add", "pbprobe0", "type", "veth", "peer", "name",
                 "pbprobe1"], check=False)
        if r.returncode != 0:
            return f"cannot make veth links ({r.stderr.strip()}): the kernel needs CONFIG_VETH"
        r = run(["ip", "-n", probe, "link", "add", "pbprobebr", "type", "bridge"], check=False)
        if r.returncode != 0:
            return f"cannot make a bridge ({r.stderr.strip()}): the kernel needs CONFIG_BRIDGE"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def delay_method():
    """How links are delayed here: "netem" (tc), "nfqueue" (a delay line, where the kernel
    has no netem) or None. Probed in throwaway namespaces."""
    if netem_available():
        return "netem"
    return "nfqueue" if nfqueue_available() else None


def works_in_probe_namespace(check):
    """check(ns), a test that returns a bool, run in a throwaway namespace removed afterwards;
    False when no namespace can be made."""
    probe = f"{PREFIX}-probe{os.getpid()}"
    if run(["ip", "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        return check(probe)
    finally:
        run(["ip", "netns", "del", probe], check=False)


def nfqueue_available():
    """Whether an iptables NFQUEUE rule and a delay line work here (kernel, iptables-legacy)."""
    if shutil.which(IPTABLES) is None or not os.path.exists(DELAYLINE):
        return False
    return works_in_probe_namespace(lambda ns: (
        run(["ip", "netns", "exec", ns, IPTABLES, "-w", "-t", "mangle", "-A", "PREROUTING",
             "-j", "NFQUEUE", "--queue-num", "0"], check=False).returncode == 0
        and run(["ip", "netns", "exec", ns, sys.executable, DELAYLINE, "--probe"],
                check=False).returncode == 0))


NO_DELAY = ("link delays need tc netem (CONFIG_NET_SCH_NETEM) or, without it, iptables NFQUEUE "
            f"for a delay line ({IPTABLES}, from Debian's iptables, and "
            "CONFIG_NETFILTER_NETLINK_QUEUE); neither works here, so links can be "
            "rate-limited (HTB) but not delayed: use --delay 0")


def netem_available():
    """Whether tc's netem (delay) works in this kernel; probed in a throwaway namespace."""
    return works_in_probe_namespace(lambda ns: run(
        ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        check=False).returncode == 0)


# --------------------------------------------------------------------------------------------
# state


class Bed:
    """One bed's names, paths and state file (<state-dir>/<id>/state.json)."""

    def __init__(self, state_dir, bed_id):
        self.state_dir = state_dir
        self.id = bed_id
        self.dir = os.path.join(state_dir, bed_id)
        self.state_path = os.path.join(self.dir, "state.json")
        self.state = None

    @property
    def switch_ns(self):
        return f"{PREFIX}-{self.id}-sw"

    @property
    def bridge(self):
        return f"{IF_PREFIX}{self.id}br"

    def host_ns(self, i):
        return f"{PREFIX}-{self.id}-h{i}"

    def load(self):
        try:
            with open(self.state_path) as f:
                self.state = json.load(f)
        except FileNotFoundError:
            self.state = None
        except (OSError, ValueError) as e:
            raise BedError(f"cannot read {self.state_path}: {e}") from None
        return self.state

    def save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.state_path)

    def hosts(self):
        return self.state["hosts"] if self.state else []

    def host(self, name):
        """A host by name (h2), index (2) or address (198.18.0.3)."""
        hosts = self.hosts()
        for h in hosts:
            if name in (h["name"], h["addr"]) or (name.isdigit() and h["name"] == f"h{name}"):
                return h
        known = ", ".join(f"{h['name']} ({h['addr']})" for h in hosts)
        raise UsageError(f"bed {self.id} has no host '{name}' (hosts: {known})")

    def ssh_opts(self):
        return f"-F {self.state['ssh_config']}"


def state_dir_from(args):
    return os.path.abspath(args.state_dir)


def lock_state_dir(state_dir):
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(state_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def bed_ids(state_dir):
    """Ids of beds with a state directory, plus ids seen only in namespace names."""
    ids = set()
    try:
        for name in os.listdir(state_dir):
            if ID_RE.match(name) and os.path.isdir(os.path.join(state_dir, name)):
                ids.add(name)
    except FileNotFoundError:
        pass
    for ns in netns_list():
        m = NS_RE.match(ns)
        if m:
            ids.add(m.group(1))
    return sorted(ids)


def used_subnets(state_dir, ids):
    """Subnets of the beds in `state_dir` and of every bed whose first host's namespace
    exists (beds of other state directories too). Beds never share a network, so two with
    one subnet would still work; distinct subnets keep their addresses apart in logs."""
    used = set()
    for other in ids:
        try:
            st = Bed(state_dir, other).load()
        except BedError:
            st = None
        if st and st.get("subnet"):
            used.add(ipaddress.ip_network(st["subnet"]))
    for ns in netns_list():
        m = NS_RE.match(ns)
        if not m or m.group(2) != "h0":
            continue
        r = run(["ip", "-n", ns, "-4", "-o", "addr", "show"], check=False)
        for addr in re.findall(r"inet (198\.1[89]\.[0-9.]+/\d+)", r.stdout):
            used.add(ipaddress.ip_interface(addr).network)
    return used


def open_bed(args, must_be_up=True):
    bed = Bed(state_dir_from(args), args.bed)
    if not ID_RE.match(args.bed):
        raise UsageError(f"'{args.bed}' is not a bed id (1-6 of a-z, 0-9)")
    if bed.load() is None:
        raise BedError(f"no bed '{args.bed}' in {bed.state_dir} (tools/testbed.py list shows "
                       "the beds)")
    if must_be_up and bed.state.get("status") != "up":
        raise BedError(f"bed {bed.id} is not up (status: {bed.state.get('status')}); "
                       f"remove it with: {PROG} down {bed.id}")
    return bed


# --------------------------------------------------------------------------------------------
# links


def shape_commands(ns, dev, rate, delay_us):
    """tc commands that shape the egress of `dev` in `ns`: HTB at `rate` (bits/s, None: no
    limit), then netem for `delay_us` (0: none), else a byte-limited FIFO."""
    tc = ["tc", "-n", ns]
    cmds = []
    if rate is None and not delay_us:
        return cmds
    rate_bytes = (rate or 10**10) / 8
    queue_bytes = max(MIN_QUEUE_BYTES, int(rate_bytes * (QUEUE_S + delay_us / 1e6)))
    parent = ["root"]
    if rate is not None:
        # burst: 2 ms at the rate, at least two 64 KiB GSO packets (veth passes them whole)
        burst = max(2 * 65536 + 3000, int(rate_bytes * 0.002))
        cmds.append(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                          "default", "1"])
        cmds.append(tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                          "rate", f"{rate}bit", "ceil", f"{rate}bit", "burst", str(burst),
                          "cburst", str(burst), "quantum", "60000"])
        parent = ["parent", "1:1"]
    if delay_us:
        limit = max(1000, queue_bytes // 1500)
        cmds.append(tc + ["qdisc", "add", "dev", dev] + parent + ["handle", "10:", "netem",
                          "delay", f"{delay_us}us", "limit", str(limit)])
    else:
        cmds.append(tc + ["qdisc", "add", "dev", dev] + parent + ["handle", "10:", "bfifo",
                          "limit", str(queue_bytes)])
    return cmds


def apply_shape(bed, h, method):
    """tc on both ends of h's link: its rate, and its delay when `method` is netem (a delay
    line is set up for all hosts at once, by apply_delay_lines)."""
    if h["delay_us"] and method is None:
        raise BedError(f"delay {fmt_delay(h['delay_us'])} on {h['name']}: {NO_DELAY}")
    delay_us = h["delay_us"] if method == "netem" else 0
    for ns, dev in ((h["ns"], h["if_host"]), (bed.switch_ns, h["if_switch"])):
        run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        for cmd in shape_commands(ns, dev, h["rate_bit"], delay_us):
            run(cmd)


def delay_line_queues(bed, h):
    """h's delay line: a queue per sender (numbered by its index), holding the sender's
    packets for the sender's link delay plus h's, the two one-way delays a packet crosses."""
    return {i: s["delay_us"] + h["delay_us"] for i, s in enumerate(bed.hosts())
            if s is not h and s["delay_us"] + h["delay_us"] > 0}


def stop_delay_line(h):
    pid = h.get("delayline_pid")
    if pid and proc_alive(pid, h.get("delayline_start")):
        kill_pids([pid], signal.SIGTERM)
        kill_pids(wait_gone([pid], 3.0), signal.SIGKILL)
        wait_gone([pid], 5.0)
    h["delayline_pid"] = h["delayline_start"] = None


def apply_delay_lines(bed):
    """Without netem: in every host, a delay line holding each incoming packet for its
    sender's link delay plus the host's (tools/delayline.py), fed by iptables NFQUEUE rules per
    sender. Packets are held where they arrive: held where they leave, they would still count
    against the sending socket's TCP small-queue budget and throttle it."""
    for h in bed.hosts():
        ipt = ["ip", "netns", "exec", h["ns"], IPTABLES, "-w", "-t", "mangle"]
        run(ipt + ["-F", "PREROUTING"])  # undelayed while the line changes
        stop_delay_line(h)
        queues = delay_line_queues(bed, h)
        if not queues:
            continue
        # A fresh log per line: the wait below looks for this line's "holding"
        log = open(os.path.join(bed.dir, f"{h['name']}_delayline.log"), "wb")
        argv = ["ip", "netns", "exec", h["ns"], sys.executable, DELAYLINE]
        for q, us in sorted(queues.items()):
            argv += ["--queue", f"{q}:{us}"]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        log.close()
        h["delayline_pid"] = p.pid
        bed.save()  # on record before anything waits on it
        h["delayline_start"] = proc_start(p.pid)
        deadline = time.monotonic() + 10
        # bound before the rules go in: rules without a listener drop packets
        while "holding" not in log_tail(bed, h, "delayline"):
            if p.poll() is not None or time.monotonic() > deadline:
                raise BedError(f"the delay line of {h['name']} did not start: "
                               f"{log_tail(bed, h, 'delayline')}")
            time.sleep(0.02)
        for q in sorted(queues):
            run(ipt + ["-A", "PREROUTING", "-i", h["if_host"], "-s", bed.hosts()[q]["addr"],
                       "-j", "NFQUEUE", "--queue-num", str(q)])
    bed.save()


# --------------------------------------------------------------------------------------------
# sshd


SSHD_CONFIG = """\
# sshd of test bed {id}, host {name} ({addr}); written by tools/testbed.py
ListenAddress {addr}
Port 22
HostKey {hostkey}
AuthorizedKeysFile {auth}
PidFile none
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
PermitTunnel no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
"""

SSH_CONFIG = """\
# ssh client settings for test bed {id}; use as: ssh -F {path} HOST
Host *
    User {user}
    Port 22
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    CheckHostIP no
    BatchMode yes
    PasswordAuthentication no
    ControlMaster no
    ControlPath none
    ConnectTimeout 10
    LogLevel ERROR
"""


def ssh_missing():
    for path, pkg in ((SSHD, "openssh-server"), ("ssh", "openssh-client"),
                      ("ssh-keygen", "openssh-client")):
        if not (os.path.exists(path) if path.startswith("/") else shutil.which(path)):
            return f"{path} not found: install {pkg} (tools/install-deps.sh installs it)"
    return None


def keygen(path, comment):
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    with open(path + ".pub") as f:
        return f.read().strip()


def tcp_listening(pid, addr, port):
    """Whether process `pid`'s network namespace has a socket listening on addr:port."""
    want = "%08X:%04X" % (int.from_bytes(ipaddress.ip_address(addr).packed, "little"), port)
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] == want and fields[3] == "0A":
                    return True
    except (OSError, StopIteration, IndexError):
        pass
    return False


def start_sshds(bed):
    st = bed.state
    user_pub = keygen(os.path.join(bed.dir, "user_key"), f"psbed-{bed.id}-user")
    auth = os.path.join(bed.dir, "authorized_keys")
    with open(auth, "w") as f:
        f.write(user_pub + "\n")
    known = os.path.join(bed.dir, "known_hosts")
    known_lines = []
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    for h in st["hosts"]:
        hostkey = os.path.join(bed.dir, f"{h['name']}_host_key")
        pub = keygen(hostkey, f"psbed-{bed.id}-{h['name']}")
        known_lines.append(f"{h['addr']} {' '.join(pub.split()[:2])}")
        cfg = os.path.join(bed.dir, f"{h['name']}_sshd_config")
        with open(cfg, "w") as f:
            f.write(SSHD_CONFIG.format(id=bed.id, name=h["name"], addr=h["addr"],
                                       hostkey=hostkey, auth=auth))
    with open(known, "w") as f:
        f.write("\n".join(known_lines) + "\n")
    with open(st["ssh_config"], "w") as f:
        f.write(SSH_CONFIG.format(id=bed.id, path=st["ssh_config"], user=st["user"],
                                  key=os.path.join(bed.dir, "user_key"), known=known))
    for h in st["hosts"]:
        cfg = os.path.join(bed.dir, f"{h['name']}_sshd_config")
        log = open(os.path.join(bed.dir, f"{h['name']}_sshd.log"), "ab")
        # `ip netns exec` execs sshd, so the pid is sshd's; -D: no fork, -e: log to the file
        p = subprocess.Popen(["ip", "netns", "exec", h["ns"], SSHD, "-D", "-e", "-f", cfg],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        log.close()
        h["sshd_pid"] = p.pid
        h["sshd_start"] = None
        bed.save()  # the pid is on record before we wait for anything
        h["sshd_start"] = proc_start(p.pid)  # it outlives this process (never reaped here)
    bed.save()
    deadline = time.monotonic() + 15
    for h in st["hosts"]:
        while not tcp_listening(h["sshd_pid"], h["addr"], 22):
            if not proc_alive(h["sshd_pid"], h["sshd_start"]):
                raise BedError(f"sshd of {h['name']} exited: {log_tail(bed, h)}")
            if time.monotonic() > deadline:
                raise BedError(f"sshd of {h['name']} did not listen on {h['addr']}:22 within "
                               f"15 s: {log_tail(bed, h)}")
            time.sleep(0.02)


def log_tail(bed, h, what="sshd"):
    """The end of h's log of `what` (sshd, delayline) in the bed's directory."""
    try:
        with open(os.path.join(bed.dir, f"{h['name']}_{what}.log"), errors="replace") as f:
            text = f.read().strip()
    except OSError:
        text = ""
    return text[-500:] or "(its log is empty)"


def check_logins(bed, from_host):
    """ssh from `from_host` to every host, in parallel: proves the bridge, the keys and sshd."""
    procs = []
    for h in bed.hosts():
        argv = ["ip", "netns", "exec", from_host["ns"], "ssh", "-F", bed.state["ssh_config"],
                h["addr"], "echo", "psbed-login-ok", h["name"]]
        procs.append((h, subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True)))
    bad = []
    for h, p in procs:
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            err = "no answer within 30 s"
        if p.returncode != 0 or f"psbed-login-ok {h['name']}" not in out:
            bad.append(f"{h['name']} ({h['addr']}): status {p.returncode}: "
                       f"{err.strip() or out.strip()}")
    if bad:
        raise BedError(f"ssh from {from_host['name']} failed: " + "; ".join(bad))


# --------------------------------------------------------------------------------------------
# up / down


def cmd_up(args):
    rate, delay, per_host, subnet, method = check_up_args(args)
    state_dir = state_dir_from(args)
    bed, subnet = record_bed(args, state_dir, rate, delay, per_host, subnet, method)
    bed_id = bed.id

    def interrupted(signum, frame):
        raise Interrupted(signum)
    old = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM,
                                                       signal.SIGHUP)}
    t0 = time.monotonic()
    try:
        build_bed(bed, subnet, method, not args.no_sshd)
    except (BedError, Interrupted, OSError) as e:
        what = (f"interrupted by {signal.Signals(e.args[0]).name}"
                if isinstance(e, Interrupted) else str(e))
        say(f"up failed: {what}; removing bed {bed_id}")
        bed.state["status"] = "failed"
        bed.save()
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        teardown(state_dir, bed_id, quiet=True)
        remove_empty_state_dir(state_dir)
        return 128 + e.args[0] if isinstance(e, Interrupted) else 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    say(f"bed {bed_id} up in {time.monotonic() - t0:.1f} s: {args.hosts} host(s) on {subnet}")
    describe(bed, sys.stderr)
    if args.json:
        print(json.dumps(bed.state, indent=1))
    else:
        print(bed_id)
    return 0


def check_up_args(args):
    """`up`'s flags, checked, and what this machine must offer for them: returns the rate, the
    delay, the per-host links, the subnet (None: pick one) and the delay method."""
    if not 1 <= args.hosts <= MAX_HOSTS:
        raise UsageError(f"-n {args.hosts}: want 1 to {MAX_HOSTS} hosts")
    rate = parse_rate(args.rate)
    delay = parse_delay(args.delay)
    per_host = {}
    for spec in args.link:
        name, r, d = parse_link_spec(spec)
        m = re.fullmatch(r"h?(\d+)", name)
        if not m or int(m.group(1)) >= args.hosts:
            raise UsageError(f"--link {spec}: no host '{name}' (hosts are h0..h{args.hosts - 1})")
        per_host[int(m.group(1))] = (r, d)
    if args.id is not None and not ID_RE.match(args.id):
        raise UsageError(f"--id {args.id}: want 1-6 characters of a-z, 0-9")
    subnet = None
    if args.subnet:
        try:
            subnet = ipaddress.ip_network(args.subnet)
        except ValueError as e:
            raise UsageError(f"--subnet {args.subnet}: {e}") from None
        if subnet.version != 4 or not subnet.subnet_of(BED_NET):
            raise UsageError(f"--subnet {args.subnet}: must lie in {BED_NET} (the range "
                             "reserved for benchmarking networks)")
        if subnet.num_addresses - 2 < args.hosts:
            raise UsageError(f"--subnet {args.subnet} has room for {subnet.num_addresses - 2} "
                             f"hosts, not {args.hosts}")
    shaped = rate is not None or delay or per_host
    why = why_unavailable(need_tc=bool(shaped))
    if why:
        raise BedError(f"cannot make a test bed: {why}")
    if not args.no_sshd:
        why = ssh_missing()
        if why:
            raise BedError(f"cannot start sshd in the hosts: {why} (or use --no-sshd)")
    delays = [delay] + [d for _, d in per_host.values() if d != "default"]
    method = delay_method() if any(delays) else None
    if any(delays) and method is None:
        raise BedError(NO_DELAY)

    return rate, delay, per_host, subnet, method


def record_bed(args, state_dir, rate, delay, per_host, subnet, method):
    """Picks the bed's id and subnet and writes its state file, under the state directory's
    lock, before anything is made: `down` works after any crash. Returns the bed and subnet."""
    fd = lock_state_dir(state_dir)
    try:
        taken = set(bed_ids(state_dir))
        if args.id is not None:
            if args.id in taken:
                raise BedError(f"a bed '{args.id}' exists already (state in "
                               f"{os.path.join(state_dir, args.id)}, or namespaces named "
                               f"{PREFIX}-{args.id}-*): remove it with {PROG} down {args.id}")
            bed_id = args.id
        else:
            bed_id = next((i for i in (secrets.token_hex(3) for _ in range(100))
                           if i not in taken), None)
            if bed_id is None:
                raise BedError(f"no free bed id after 100 tries ({len(taken)} beds exist)")
        if subnet is None:
            used = used_subnets(state_dir, taken)
            for k in range(BED_NET.num_addresses // 256):
                cand = ipaddress.ip_network((int(BED_NET.network_address) + 256 * k, 24))
                if not any(cand.overlaps(u) for u in used):
                    subnet = cand
                    break
            else:
                raise BedError(f"every /24 of {BED_NET} is in use by a bed")
        bed = Bed(state_dir, bed_id)
        os.makedirs(bed.dir, mode=0o700)
        addrs = list(subnet.hosts())
        hosts = []
        for i in range(args.hosts):
            r, d = per_host.get(i, ("default", "default"))
            hosts.append({
                "name": f"h{i}", "ns": bed.host_ns(i), "addr": str(addrs[i]),
                "if_host": f"{IF_PREFIX}{bed_id}h{i}", "if_switch": f"{IF_PREFIX}{bed_id}s{i}",
                "rate_bit": rate if r == "default" else r,
                "delay_us": delay if d == "default" else d,
                "sshd_pid": None, "sshd_start": None,
                "delayline_pid": None, "delayline_start": None})
        bed.state = {
            "version": STATE_VERSION, "id": bed_id, "status": "creating",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "creator_pid": os.getpid(),
            "subnet": str(subnet), "switch_ns": bed.switch_ns, "bridge": bed.bridge,
            "dir": bed.dir, "user": getpass.getuser(), "sshd": not args.no_sshd,
            "ssh_config": os.path.join(bed.dir, "ssh_config"),
            "hostfile": os.path.join(bed.dir, "hostfile"), "delay_method": method,
            "hosts": hosts}
        bed.save()  # on record before anything is made: `down` works after any crash
    finally:
        os.close(fd)

    return bed, subnet


def build_bed(bed, subnet, method, with_sshd):
    st = bed.state
    sw = bed.switch_ns
    say(f"bed {bed.id}: making {len(st['hosts'])} host(s) and a switch on {subnet}")
    run(["ip", "netns", "add", sw])
    run(["ip", "-n", sw, "link", "set", "lo", "up"])
    disable_ipv6(sw)
    run(["ip", "-n", sw, "link", "add", bed.bridge, "type", "bridge", "stp_state", "0",
         "forward_delay", "0"])
    run(["ip", "-n", sw, "link", "set", bed.bridge, "up"])
    for h in st["hosts"]:
        run(["ip", "netns", "add", h["ns"]])
        run(["ip", "-n", h["ns"], "link", "set", "lo", "up"])
        disable_ipv6(h["ns"])
        # both ends are made in their namespaces at once: nothing appears in the machine's own
        run(["ip", "link", "add", h["if_host"], "netns", h["ns"], "type", "veth", "peer",
             "name", h["if_switch"], "netns", sw])
        run(["ip", "-n", sw, "link", "set", h["if_switch"], "master", bed.bridge])
        run(["ip", "-n", sw, "link", "set", h["if_switch"], "up"])
        run(["ip", "-n", h["ns"], "addr", "add", f"{h['addr']}/{subnet.prefixlen}", "dev",
             h["if_host"]])
        run(["ip", "-n", h["ns"], "link", "set", h["if_host"], "up"])
        apply_shape(bed, h, method)
    if method == "nfqueue":
        apply_delay_lines(bed)
    # no host has a route out: only the subnet's own (kernel) route exists
    for h in st["hosts"]:
        r = run(["ip", "-n", h["ns"], "-4", "route", "show", "default"])
        if r.stdout.strip():
            raise BedError(f"{h['name']} has a default route: {r.stdout.strip()}")
    with open(st["hostfile"], "w") as f:
        f.write(f"# test bed {bed.id}: {len(st['hosts'])} hosts on {subnet}; ssh with "
                f"-F {st['ssh_config']}\n")
        for h in st["hosts"]:
            f.write(f"{h['addr']}\n")
    if with_sshd:
        say(f"bed {bed.id}: starting sshd on {len(st['hosts'])} host(s)")
        start_sshds(bed)
        check_logins(bed, st["hosts"][0])
    st["status"] = "up"
    bed.save()


def disable_ipv6(ns):
    """The bed is IPv4 only: no IPv6 link-local chatter (DAD, router solicitations) on it."""
    run(["ip", "netns", "exec", ns, "sh", "-c",
         "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 "
         "/proc/sys/net/ipv6/conf/default/disable_ipv6; do "
         "[ -w $f ] && echo 1 > $f; done; true"], check=False)


def describe(bed, out):
    st = bed.state
    out.write(f"  bed {bed.id}  subnet {st['subnet']}  switch {st['switch_ns']} (bridge "
              f"{st['bridge']})  status {st['status']}\n")
    for h in st["hosts"]:
        sshd = ""
        if h.get("sshd_pid"):
            alive = proc_alive(h["sshd_pid"], h.get("sshd_start"))
            sshd = f"  sshd pid {h['sshd_pid']}{'' if alive else ' (not running)'}"
        blocked = f"  blocked from {','.join(h['blocked'])}" if h.get("blocked") else ""
        out.write(f"  {h['name']:>4}  {h['addr']:<15} ns {h['ns']:<18} link "
                  f"{fmt_rate(h['rate_bit'])}, delay {fmt_delay(h['delay_us'])}{sshd}"
                  f"{blocked}\n")
    if st.get("delay_method") == "nfqueue":
        out.write("  delays:      by a delay line in each host (tools/delayline.py; this kernel "
                  "has no tc netem)\n")
    out.write(f"  hostfile:    {st['hostfile']}\n")
    if st.get("sshd", True):
        out.write(f"  ssh options: -F {st['ssh_config']}\n")
    out.write(f"  run a job:   tools/{PROG} exec {bed.id} h0 -- tools/launch.py -H "
              f"{st['hostfile']} --ssh-opts \"-F {st['ssh_config']}\" ...\n")
    out.write(f"  remove it:   tools/{PROG} down {bed.id}\n")
    out.flush()


def teardown(state_dir, bed_id, quiet=False):
    """Removes bed `bed_id`: every process in its namespaces, the namespaces (their veths and
    bridge go with them), stray links in this namespace, and its state directory.
    Returns a list of problems (empty: everything is gone)."""
    bed = Bed(state_dir, bed_id)
    try:
        st = bed.load()
    except BedError:
        st = None
    names = set(netns_list())
    ours = {ns for ns in names if (m := NS_RE.match(ns)) and m.group(1) == bed_id}
    planned = set()
    if st:
        planned = {st.get("switch_ns")} | {h["ns"] for h in st.get("hosts", [])}
        planned.discard(None)
    nss = sorted(ours | (planned & names))
    problems = []
    # 1. processes: whatever runs in the bed's namespaces (sshd, jobs, `exec` sessions)
    pids = {p for ns in nss for p in netns_pids(ns)} - {os.getpid()}
    for h in (st or {}).get("hosts", []):
        if h.get("sshd_pid") and proc_alive(h["sshd_pid"], h.get("sshd_start")):
            pids.add(h["sshd_pid"])
        if h.get("delayline_pid") and proc_alive(h["delayline_pid"], h.get("delayline_start")):
            pids.add(h["delayline_pid"])
    pids = sorted(pids)
    if pids:
        if not quiet:
            say(f"bed {bed_id}: stopping {len(pids)} process(es)")
        kill_pids(pids, signal.SIGTERM)
        left = wait_gone(pids, 2.0)
        kill_pids(left, signal.SIGKILL)
        left = wait_gone(left, 5.0)
        for ns in nss:  # anything started meanwhile
            more = [p for p in netns_pids(ns) if p != os.getpid()]
            kill_pids(more, signal.SIGKILL)
            left += wait_gone(more, 5.0)
        for pid in left:
            problems.append(f"process {pid} did not exit: {proc_cmd(pid)}")
    # 2. namespaces, hosts first; their veth ends and the bridge go with them
    for ns in sorted(nss, key=lambda n: n.endswith("-sw")):
        r = run(["ip", "netns", "del", ns], check=False)
        if r.returncode != 0 and ns in netns_list():
            problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
    # 3. links of ours in this namespace (none is ever made here; a crash of ip could leave one)
    r = run(["ip", "-o", "link", "show"], check=False)
    for line in r.stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(f"{IF_PREFIX}{bed_id}") and re.fullmatch(
                    rf"{IF_PREFIX}{bed_id}(h\d+|s\d+|br)", name):
                rr = run(["ip", "link", "del", name], check=False)
                if rr.returncode != 0:
                    problems.append(f"ip link del {name}: {rr.stderr.strip()}")
    left_ns = [ns for ns in netns_list() if (m := NS_RE.match(ns)) and m.group(1) == bed_id]
    if left_ns:
        problems.append(f"namespaces still there: {', '.join(left_ns)}")
    # 4. files
    if os.path.isdir(bed.dir):
        if problems:
            problems.append(f"kept {bed.dir} (run {PROG} down {bed_id} again)")
        else:
            shutil.rmtree(bed.dir, ignore_errors=True)
            if os.path.exists(bed.dir):
                problems.append(f"could not remove {bed.dir}")
    if not quiet:
        if problems:
            for p in problems:
                say(f"bed {bed_id}: {p}")
        elif nss or st:
            say(f"bed {bed_id} removed ({len(nss)} namespace(s))")
        else:
            say(f"bed {bed_id}: nothing to remove")
    return problems


def cmd_down(args):
    state_dir = state_dir_from(args)
    if os.geteuid() != 0:
        raise BedError("down needs root, as up did")
    if args.all:
        ids = bed_ids(state_dir)
        if not ids:
            say("no beds")
    else:
        if not args.beds:
            raise UsageError("down: give bed ids, or --all")
        for b in args.beds:
            if not ID_RE.match(b):
                raise UsageError(f"'{b}' is not a bed id (1-6 of a-z, 0-9)")
        ids = args.beds
    failed = False
    for b in ids:
        if teardown(state_dir, b):
            failed = True
    remove_empty_state_dir(state_dir)
    return 1 if failed else 0


def remove_empty_state_dir(state_dir):
    """Once the last bed is gone, its state dir goes too (it holds only the lock file)."""
    if not os.path.isdir(state_dir):
        return
    fd = lock_state_dir(state_dir)
    try:
        if os.listdir(state_dir) == [".lock"]:
            os.unlink(os.path.join(state_dir, ".lock"))
            os.rmdir(state_dir)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# the other commands


def cmd_list(args):
    state_dir = state_dir_from(args)
    ids = bed_ids(state_dir)
    if not ids:
        say(f"no beds (state in {state_dir})")
        return 0
    names = netns_list()
    for b in ids:
        bed = Bed(state_dir, b)
        try:
            st = bed.load()
        except BedError:
            st = None
        nss = [ns for ns in names if (m := NS_RE.match(ns)) and m.group(1) == b]
        if st is None:
            print(f"{b}  (no state file; namespaces: {', '.join(nss)})  remove: {PROG} down {b}")
            continue
        status = st["status"]
        if status == "creating" and not proc_alive(st.get("creator_pid", 0)):
            status = "creating, but its 'up' is gone: remove it with down"
        print(f"{b}  {status}  {len(st['hosts'])} host(s)  {st['subnet']}  "
              f"{len(nss)} namespace(s)  {st['dir']}")
    return 0


def cmd_info(args):
    bed = open_bed(args, must_be_up=False)
    st = bed.state
    if args.json:
        print(json.dumps(st, indent=1))
    elif args.ssh_config:
        print(st["ssh_config"])
    elif args.ssh_opts:
        print(bed.ssh_opts())
    else:
        describe(bed, sys.stdout)
    return 0


def parse_host_list(bed, text):
    """'h0,h2', 'h1-h3', '0-1', addresses -> hosts, in the order given."""
    out = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"h?(\d+)-h?(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise UsageError(f"--hosts {text}: empty range '{part}'")
            out.extend(bed.host(f"h{i}") for i in range(lo, hi + 1))
        elif part:
            out.append(bed.host(part))
    if not out:
        raise UsageError(f"--hosts {text}: no hosts")
    return out


def cmd_hostfile(args):
    bed = open_bed(args, must_be_up=False)
    if args.path:
        print(bed.state["hostfile"])
        return 0
    hosts = parse_host_list(bed, args.hosts) if args.hosts else bed.hosts()
    if args.slots is not None and args.slots < 1:
        raise UsageError(f"--slots {args.slots}: want at least 1")
    lines = [f"# test bed {bed.id}: {', '.join(h['name'] for h in hosts)}; ssh with "
             f"-F {bed.state['ssh_config']}"]
    for h in hosts:
        lines.append(h["addr"] + (f" slots={args.slots}" if args.slots else ""))
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        say(f"wrote {args.output}: {len(hosts)} host(s)")
    else:
        sys.stdout.write(text)
    return 0


def cmd_exec(args):
    bed = open_bed(args)
    h = bed.host(args.host)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("exec: no command given (exec BED HOST -- CMD ...)")
    sys.stdout.flush()
    try:
        os.execvp("ip", ["ip", "netns", "exec", h["ns"]] + command)
    except OSError as e:
        raise BedError(f"cannot run ip netns exec: {e}") from None


def cmd_shape(args):
    bed = open_bed(args)
    hosts = bed.hosts() if args.host == "all" else parse_host_list(bed, args.host)
    if args.rate is None and args.delay is None:
        raise UsageError("shape: give --rate and/or --delay")
    rate = parse_rate(args.rate) if args.rate is not None else "keep"
    delay = parse_delay(args.delay) if args.delay is not None else "keep"
    if shutil.which("tc") is None:
        raise BedError("tc (iproute2) not found: install iproute2 (tools/install-deps.sh)")
    method = bed.state.get("delay_method")
    if method is None and any((delay if delay != "keep" else h["delay_us"]) for h in hosts):
        method = delay_method()
        if method is None:
            raise BedError(NO_DELAY)
    bed.state["delay_method"] = method
    for h in hosts:
        if rate != "keep":
            h["rate_bit"] = rate
        if delay != "keep":
            h["delay_us"] = delay
        apply_shape(bed, h, method)
        say(f"{h['name']} ({h['addr']}): link {fmt_rate(h['rate_bit'])}, delay "
            f"{fmt_delay(h['delay_us'])}, both directions")
    if method == "nfqueue" and delay != "keep":  # a rate change leaves the lines running
        apply_delay_lines(bed)
    bed.save()
    return 0


def cmd_link(args):
    bed = open_bed(args)
    h = bed.host(args.host)
    run(["ip", "-n", bed.switch_ns, "link", "set", h["if_switch"], args.state])
    run(["ip", "-n", h["ns"], "link", "set", h["if_host"], args.state])
    h["link"] = args.state
    bed.save()
    say(f"{h['name']} ({h['addr']}): link {args.state}")
    return 0


def cmd_block(args):
    """A firewall between two hosts: each drops every packet from the other on arrival, so
    neither kernel hears of it (no reset, no ICMP) while both still reach every other host."""
    bed = open_bed(args)
    pair = (bed.host(args.host), bed.host(args.peer))
    if pair[0] is pair[1]:
        raise UsageError(f"block {args.host} {args.peer}: name two different hosts")
    for h, other in (pair, pair[::-1]):
        rule = ["INPUT", "-s", other["addr"], "-j", "DROP"]
        ipt = ["ip", "netns", "exec", h["ns"], IPTABLES, "-w"]
        present = run(ipt + ["-C"] + rule, check=False).returncode == 0
        if args.state == "on" and not present:
            run(ipt + ["-I"] + rule)
        elif args.state == "off" and present:
            run(ipt + ["-D"] + rule)
        blocked = set(h.get("blocked", []))
        (blocked.add if args.state == "on" else blocked.discard)(other["name"])
        h["blocked"] = sorted(blocked)
    bed.save()
    say(f"{pair[0]['name']} ({pair[0]['addr']}) and {pair[1]['name']} ({pair[1]['addr']}): "
        f"traffic between them {'dropped' if args.state == 'on' else 'flows again'}")
    return 0


def cmd_kill(args):
    bed = open_bed(args)
    h = bed.host(args.host)
    sig = getattr(signal, "SIG" + args.signal.upper().removeprefix("SIG"), None)
    if not isinstance(sig, signal.Signals):
        raise UsageError(f"--signal {args.signal}: not a signal name (TERM, KILL, ...)")
    keep = set()
    if not args.with_sshd and h.get("sshd_pid") and proc_alive(h["sshd_pid"], h.get("sshd_start")):
        keep.add(h["sshd_pid"])
    # The delay line is part of the link, not of the host's work: it stays (`link down` cuts it).
    if h.get("delayline_pid") and proc_alive(h["delayline_pid"], h.get("delayline_start")):
        keep.add(h["delayline_pid"])
    pids = [p for p in netns_pids(h["ns"]) if p not in keep and p != os.getpid()]
    for p in pids:
        say(f"{h['name']}: {sig.name} to pid {p}: {proc_cmd(p)}")
    kill_pids(pids, sig)
    left = wait_gone(pids, args.wait) if args.wait > 0 else []
    say(f"{h['name']} ({h['addr']}): sent {sig.name} to {len(pids)} process(es)"
        + (f"; {len(left)} still running after {args.wait:g} s" if left else ""))
    return 1 if left else 0


# The two ends of `measure`, run with `python3 -c` inside the hosts' namespaces.
MEASURE_RECV = r"""
import json, socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(30)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(60); s.close()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[2])):
    b = c.recv(1)
    if not b: break
    c.sendall(b)
# Bytes that arrive in the `secs` from the first one: however slow the link, the window ends
# on time (what the sender's buffers still hold is not waited for).
secs = float(sys.argv[3])
# A slow link's packets come in lumps (64 KiB GSO packets pass whole): the window is the
# whole `secs` unless the sender ends first.
buf = bytearray(1 << 20); total = 0; t0 = None; seconds = 0.0
while True:
    if t0 is not None:
        left = t0 + secs - time.monotonic()
        if left <= 0:
            seconds = secs
            break
        c.settimeout(left)
    try:
        k = c.recv_into(buf)
    except TimeoutError:
        seconds = secs if t0 is not None else 0.0
        break
    if not k:
        seconds = time.monotonic() - t0 if t0 is not None else 0.0
        break
    if t0 is None: t0 = time.monotonic()
    total += k
print(json.dumps({"bytes": total, "seconds": seconds}), flush=True)
"""

MEASURE_SEND = r"""
import json, socket, sys, time
addr, port, pings, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
start_at = float(sys.argv[5])  # wall clock: every pair's bulk transfer starts together
c = socket.create_connection((addr, port), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(pings):
    t = time.monotonic(); c.sendall(b"x"); c.recv(1); rtts.append(time.monotonic() - t)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
time.sleep(min(5.0, max(0.0, start_at - time.time())))
# Sends for `secs`, each send bounded by the time left: a slow link takes what it can.
buf = b"\0" * (1 << 20); end = time.monotonic() + secs
try:
    while (left := end - time.monotonic()) > 0:
        c.settimeout(left)
        c.send(buf)
except (TimeoutError, ConnectionError):
    pass  # the time is up, or the receiver's window ended and it closed
c.close()
print(json.dumps({"rtts": rtts}), flush=True)
"""


def start_pair(bed, src, dst, pings, seconds, start_at):
    recv = subprocess.Popen(["ip", "netns", "exec", dst["ns"], sys.executable, "-c",
                             MEASURE_RECV, dst["addr"], str(pings), str(seconds)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([recv.stdout], [], [], 30)
    port = recv.stdout.readline().strip() if ready else ""
    if not port.isdigit():
        recv.kill()
        _, err = recv.communicate()
        raise BedError(f"measure: receiver on {dst['name']} did not start: {err.strip()}")
    send = subprocess.Popen(["ip", "netns", "exec", src["ns"], sys.executable, "-c",
                             MEASURE_SEND, dst["addr"], port, str(pings), str(seconds),
                             repr(start_at)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return recv, send


def finish_pair(pair, src, dst, timeout):
    out = {}
    for name, p in zip(("recv", "send"), pair):
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            o, e = p.communicate()
            raise BedError(f"measure {src['name']} -> {dst['name']}: no result within "
                           f"{timeout:g} s") from None
        if p.returncode != 0:
            raise BedError(f"measure {src['name']} -> {dst['name']}: {name} side failed: "
                           f"{e.strip()[-300:]}")
        out.update(json.loads(o.strip().splitlines()[-1]))
    rtts = sorted(out["rtts"])
    return {"from": src["name"], "to": dst["name"], "bytes": out["bytes"],
            "seconds": out["seconds"],
            "mbit_per_s": out["bytes"] * 8 / out["seconds"] / 1e6 if out["seconds"] else 0.0,
            "rtt_ms_median": rtts[len(rtts) // 2] * 1000 if rtts else None}


def cmd_measure(args):
    bed = open_bed(args)
    src, dst = bed.host(args.src), bed.host(args.dst)
    if src is dst:
        raise UsageError("measure: FROM and TO are the same host")
    if not 0.2 <= args.seconds <= 60:
        raise UsageError(f"--seconds {args.seconds}: want 0.2 to 60")
    pairs = [(src, dst)] + ([(dst, src)] if args.both else [])
    started = []
    # the round trips are timed on idle links; then the transfers start at the same moment
    start_at = time.time() + 1.0 + 0.01 * args.pings * (1 + args.both)
    try:
        for s, d in pairs:
            started.append((start_pair(bed, s, d, args.pings, args.seconds, start_at), s, d))
        results = [finish_pair(p, s, d, args.seconds + 60) for p, s, d in started]
    finally:
        for (recv, send), _, _ in started:
            for p in (recv, send):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(f"{r['from']} -> {r['to']}: {r['mbit_per_s']:.1f} Mbit/s over "
                  f"{r['seconds']:.2f} s, rtt {r['rtt_ms_median']:.3f} ms (median)")
            # A shaped link passes a burst of about 134 KiB at once (two 64 KiB GSO packets),
            # and TCP needs some round trips to fill a long path: a short window reads either.
            window_bits = r["mbit_per_s"] * 1e6 * r["seconds"]
            rtt_s = (r["rtt_ms_median"] or 0) / 1000
            if r["seconds"] and (window_bits < 10 * 134 * 1024 * 8 or r["seconds"] < 20 * rtt_s):
                print(f"  (a short window for this link: its burst or TCP's start-up weighs in; "
                      f"measure over --seconds {max(30, int(40 * rtt_s))} for its sustained rate)")
    return 0


def cmd_check(args):
    why = why_unavailable(need_tc=True) or (None if args.no_sshd else ssh_missing())
    if why:
        print(f"unavailable: {why}")
        return 1
    method = delay_method()
    print("ok: test beds can be made here; link delay "
          + {"netem": "available (tc netem)",
             "nfqueue": "available (a delay line through iptables NFQUEUE: this kernel has "
                        "no tc netem)",
             None: "NOT available (no tc netem, no iptables NFQUEUE delay line): rate "
                   "shaping only"}[method])
    return 0


# --------------------------------------------------------------------------------------------
# command line


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Make a multi-host test bed on this machine: N hosts as network "
                    "namespaces on a bridge, 198.18.0.0/15 addresses, tc-shaped links, an "
                    "sshd per host. Needs root. See docs/testbed.md.",
        epilog="example: id=$(tools/testbed.py up -n 4 --rate 1gbit); "
               "tools/testbed.py exec $id h0 -- tools/launch.py -H "
               "$(tools/testbed.py hostfile $id --path) --ssh-opts \"-F "
               "$(tools/testbed.py info $id --ssh-config)\" -n 4 build/bin/ps-kvstore-check; "
               "tools/testbed.py down $id")
    p.add_argument("--state-dir", default=os.environ.get("PSBED_STATE_DIR", DEFAULT_STATE_DIR),
                   metavar="DIR", help="where beds keep their state, keys and logs "
                   f"(default $PSBED_STATE_DIR or {DEFAULT_STATE_DIR})")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = sub.add_parser("up", help="make a bed; prints its id on stdout",
                       description="Make a bed of N hosts. Prints the bed's id on stdout "
                                   "(the summary goes to stderr).")
    s.add_argument("-n", "--hosts", type=int, default=4, help="number of hosts (default 4)")
    s.add_argument("--id", help="the bed's id (1-6 of a-z, 0-9; default: random)")
    s.add_argument("--rate", default="none", metavar="RATE",
                   help="every link's rate, each direction: 100mbit, 1gbit, 10gbit, ... "
                        "(default none: unshaped)")
    s.add_argument("--delay", default="0", metavar="DELAY",
                   help="every link's one-way delay, each direction: 200us, 5ms, ... "
                        "(default 0; tc netem, else a delay line through iptables NFQUEUE)")
    s.add_argument("--link", action="append", default=[], metavar="HOST=RATE[,DELAY]",
                   help="one host's link, e.g. h3=100mbit,2ms (repeatable; wins over "
                        "--rate/--delay)")
    s.add_argument("--subnet", metavar="CIDR",
                   help="addresses (inside 198.18.0.0/15; default: a free /24)")
    s.add_argument("--no-sshd", action="store_true", help="start no sshd in the hosts")
    s.add_argument("--json", action="store_true", help="print the bed's state as JSON "
                   "instead of its id")
    s.set_defaults(func=cmd_up)

    s = sub.add_parser("down", help="remove beds (also half-made ones, after a crash)",
                       description="Stop every process in the bed's namespaces, delete the "
                                   "namespaces (with their links) and the bed's files.")
    s.add_argument("beds", nargs="*", metavar="BED", help="bed ids")
    s.add_argument("--all", action="store_true", help="every bed (state dir and namespaces "
                   f"named {PREFIX}-<id>-*)")
    s.set_defaults(func=cmd_down)

    s = sub.add_parser("list", help="list beds")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("info", help="show a bed: hosts, addresses, links, files")
    s.add_argument("bed", metavar="BED")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="the state file")
    g.add_argument("--ssh-config", action="store_true", help="only the ssh_config path")
    g.add_argument("--ssh-opts", action="store_true",
                   help="only the options for launch.py --ssh-opts")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("hostfile", help="print a hostfile for launch.py -H",
                       description="Print a launch.py hostfile of the bed's hosts (all, or "
                                   "--hosts); one address per line.")
    s.add_argument("bed", metavar="BED")
    s.add_argument("--hosts", metavar="LIST", help="which hosts, in order: h0,h2 or h1-h3")
    s.add_argument("--slots", type=int, metavar="N", help="add slots=N to each line")
    s.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    s.add_argument("--path", action="store_true", help="print the path of the bed's own "
                   "hostfile (all hosts) instead")
    s.set_defaults(func=cmd_hostfile)

    s = sub.add_parser("exec", help="run a command on a host (in its namespace)",
                       description="Run CMD in HOST's network namespace (the filesystem and "
                                   "environment are this machine's). HOST: h2, 2 or an address.")
    s.add_argument("bed", metavar="BED")
    s.add_argument("host", metavar="HOST")
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    s.set_defaults(func=cmd_exec)

    s = sub.add_parser("shape", help="change links' rate and delay on a live bed")
    s.add_argument("bed", metavar="BED")
    s.add_argument("host", metavar="HOST", help="h2, h1-h3, h0,h2, or all")
    s.add_argument("--rate", metavar="RATE", help="100mbit, 1gbit, ... or none")
    s.add_argument("--delay", metavar="DELAY", help="one-way, each direction: 5ms, ... or 0")
    s.set_defaults(func=cmd_shape)

    s = sub.add_parser("link", help="take a host's link down or up (a cut cable)")
    s.add_argument("bed", metavar="BED")
    s.add_argument("host", metavar="HOST")
    s.add_argument("state", choices=("up", "down"))
    s.set_defaults(func=cmd_link)

    s = sub.add_parser("block", help="drop all traffic between two hosts, or let it flow "
                       "again (a firewall between them)")
    s.add_argument("bed", metavar="BED")
    s.add_argument("host", metavar="HOST")
    s.add_argument("peer", metavar="PEER")
    s.add_argument("state", choices=("on", "off"))
    s.set_defaults(func=cmd_block)

    s = sub.add_parser("kill", help="kill every process on a host (its sshd survives)",
                       description="Signal every process in HOST's namespace: the job's "
                                   "processes, remote shells, ssh sessions; the host's sshd "
                                   "too with --with-sshd. A delay line (the link's delay "
                                   "without netem) always survives.")
    s.add_argument("bed", metavar="BED")
    s.add_argument("host", metavar="HOST")
    s.add_argument("--signal", default="KILL", help="signal name (default KILL)")
    s.add_argument("--with-sshd", action="store_true", help="kill the host's sshd too")
    s.add_argument("--wait", type=float, default=5.0, metavar="SEC",
                   help="wait this long for them to exit (default 5)")
    s.set_defaults(func=cmd_kill)

    s = sub.add_parser("measure", help="measure a link: TCP throughput and round-trip time",
                       description="Send TCP data from FROM to TO for --seconds (and back at "
                                   "the same time with --both); report Mbit/s and the median "
                                   "round-trip time of 1-byte ping-pongs.")
    s.add_argument("bed", metavar="BED")
    s.add_argument("src", metavar="FROM")
    s.add_argument("dst", metavar="TO")
    s.add_argument("--seconds", type=float, default=2.0, help="how long to send (default 2)")
    s.add_argument("--pings", type=int, default=20, help="round trips timed (default 20)")
    s.add_argument("--both", action="store_true", help="both directions at once")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    s.set_defaults(func=cmd_measure)

    s = sub.add_parser("check", help="say whether a bed can be made here (exit 0) or why not")
    s.add_argument("--no-sshd", action="store_true", help="do not require sshd")
    s.set_defaults(func=cmd_check)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(
        join_negative_values(sys.argv[1:] if argv is None else argv, stop=COMMAND_STARTS))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except UsageError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except BedError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
