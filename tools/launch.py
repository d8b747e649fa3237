#!/usr/bin/env python3
"""Start a parameter-server job (1 scheduler, S servers, N workers) locally or over ssh.

    tools/launch.py -n 4 -s 2 -H hosts build/bin/ps-train --kvstore dist_sync

Flags follow MXNet's tools/launch.py; see docs/launcher.md for the full contract.
Python 3 standard library only.

How processes are run and stopped (the part MXNet gets wrong):
  Every process, local or remote, runs under a small /bin/sh wrapper (WRAPPER below). The wrapper
  starts the command in a new session (its own process group), reports that group's id on stdout,
  and starts a watcher that blocks reading the wrapper's stdin. The launcher holds the write end
  of that stdin (through ssh for a remote process) and never writes to it. When the launcher closes
  it (to stop the job), exits, or is killed, or when the ssh connection drops, the watcher reads EOF
  and kills the whole process group: TERM, then KILL 5 s later. So no process outlives the launcher
  on any host, even when the launcher itself is killed with SIGKILL.
"""

import signal
import sys

if __name__ == "__main__":
    # Ctrl-C before the job starts (the imports below, the arguments): nothing runs yet, so
    # the launcher ends quietly with 130 rather than a traceback. run() handles it from there.
    signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(130))

import argparse
import collections
import ipaddress
import math
import os
import queue
import re
import resource
import secrets
import select
import shlex
import shutil
import socket
import stat
import subprocess
import threading
import time

PROG = "launch.py"
LISTEN_RE = re.compile(r"^ps-scheduler: listening on (\S+):(\d+)\s*$")
MARKER_PID_RE = re.compile(r"^@@ps-launch pid=(\d+)$")
MARKER_WATCH_RE = re.compile(r"^@@ps-launch watch=(\d+)$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# How the runtime names a node it declared dead (docs/errors.md): "server 3 (node 7 at
# 10.0.0.4:38003) died" / "... is dead: no heartbeat ...".
# The scheduler's line when a job with replication goes on without a dead server.
SURVIVED_RE = re.compile(r"the job goes on without server (\d+) \(")
# The scheduler's line when a server started later took a dead one's rank.
JOINED_RE = re.compile(r"server (\d+) \(node \d+ at [^)]*\) joined the job in the place of dead")
# How long a server's non-zero exit waits for that line before it counts as a failure: the
# scheduler declares a closed connection dead after 1 s.
SURVIVAL_WAIT_S = 5.0
# After every worker exited 0 with the job never filled (the scheduler never said that every
# node registered): how long its last lines may still be on their way before that is final.
NEVER_FILLED_WAIT_S = 2.0
DEAD_NODE_RE = re.compile(r"\b(worker|server) (\d+) \(node \d+ at (\S+):\d+\) (?:died|is dead)")

# Variables the launcher sets itself; --env* may not change them.
LAUNCHER_OWNED = ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_NODE_HOST")
# Variables that must be equal in every process: settable by --env (all roles) only.
JOB_WIDE = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "PS_SERVER_WEIGHTS")
# The job secret (docs/launcher.md, "Job secret"): never on a command line or in --env; the
# launcher hands it to every process over the wrapper's standard input.
SECRET_VARS = ("PS_JOB_SECRET", "PS_JOB_SECRET_FILE")
# Forwarded from the launcher's environment to remote processes when set (MXNet forwards a
# similar list; credentials are deliberately not forwarded).
FORWARDED = ("PS_VERBOSE", "PS_ENCRYPT", "PS_REPLICATION", "PS_TCP_RCVBUF", "PS_SERVER_WEIGHTS",
             "DMLC_INTERFACE", "OMP_NUM_THREADS", "LD_LIBRARY_PATH")

DESCRIPTORS_OF_ITS_OWN = 32  # stdio, rsync, a start's pipes in progress, Python's own
STOP_GRACE_S = 8.0  # after a stop request: time before the launcher escalates to SIGKILL
# How long an ssh that kills a remote process group may take (ssh's ConnectTimeout, 10 s, and
# the command): past it the host is taken as unreachable.
REMOTE_KILL_WAIT_S = 15
LAST_LINES = 20  # lines kept per process for failure reports
# After processes exit, their output is shown to its end (EOF): while lines keep coming (a
# backlog behind a slow reader of the launcher's output), for up to DRAIN_LIMIT_S in all; a
# pipe silent for its quiet period is left (a child of the process may hold it open).
DRAIN_LIMIT_S = 120.0
PORT_ATTEMPTS = 3  # scheduler starts when the launcher picks the root port itself
SSH_STARTS_PER_HOST = 8  # ssh connections to one host in their handshake at once
# An ssh whose remote command has not started this long after it was run is named: past ssh's
# ConnectTimeout (10 s) its TCP connection opened, and a key exchange over a 2 s round trip
# takes about 25 s.
SSH_START_STALLED_S = 30.0

# The wrapper every process runs under: sh -c WRAPPER ps-launch WORKDIR CMD [ARGS...]
#  - read the job secret, the first line of stdin, into PS_JOB_SECRET (sh reads a pipe a
#    byte at a time, so nothing past that line is consumed);
#  - cd WORKDIR; start CMD in a new session (setsid does not fork: a background job of a
#    non-interactive shell is not a group leader), so its pid is its process-group id; CMD's
#    first output line is the marker "@@ps-launch pid=PGID";
#  - start the watcher, in its own session too, reading the wrapper's stdin (saved as fd 3,
#    because a background job's stdin is /dev/null otherwise); on EOF it sends TERM to CMD's
#    group, and CONT (a stopped process handles TERM only once it runs), and KILL 5 s later if
#    the group is still there; it exits as soon as the group is gone;
#  - wait for CMD; then kill the watcher, and whatever CMD left behind in its group (TERM, and
#    KILL 1 s later); exit with CMD's status (128+N when a signal N ended it).
WRAPPER = (
    'if IFS= read -r s && [ -n "$s" ]; then PS_JOB_SECRET=$s; export PS_JOB_SECRET; fi; '
    'unset s; '
    'd=$1; shift; '
    'cd "$d" || { echo "ps-launch: cannot cd to $d on $(uname -n)" >&2; exit 126; }; '
    'exec 3<&0; '
    "setsid sh -c 'echo \"@@ps-launch pid=$$\"; exec \"$@\"' ps-launch-child \"$@\" "
    "</dev/null 3<&- & "
    'p=$!; '
    "setsid sh -c 'while read -r _; do :; done; kill -s TERM -- -$1 2>/dev/null || exit 0; "
    "kill -s CONT -- -$1 2>/dev/null; "
    "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.5; kill -s 0 -- -$1 2>/dev/null || exit 0; done; "
    "kill -s KILL -- -$1 2>/dev/null' ps-launch-watch $p <&3 >/dev/null 2>&1 & "
    'w=$!; exec 3<&-; echo "@@ps-launch watch=$w"; '
    'wait $p; r=$?; '
    'kill -s KILL -- -$w 2>/dev/null; '
    'kill -s TERM -- -$p 2>/dev/null && { sleep 1; kill -s KILL -- -$p 2>/dev/null; }; '
    'exit $r'
)


# The scheduler's line when every worker finished through its KVStore (scheduler.cc).
SCHEDULER_DONE = "every worker finished: the job is done"
# The scheduler's line once every node registered: the job has started.
SCHEDULER_FILLED_RE = re.compile(r"all \d+ server\(s\) and \d+ worker\(s\) registered")


class UsageError(Exception):
    """A mistake in the command line or the hostfile: reported with exit status 2."""


# --------------------------------------------------------------------------------------------
# Hostfile and placement


USER_FILE_MAX_BYTES = 1 << 20  # a hostfile or a secret file; more is refused
USER_FILE_PIPE_S = 10.0  # a pipe (`<(echo ...)`) must reach its end within this


def read_text_file(path, what, encoding="utf-8-sig"):
    """The text of a file the user named (`what` names it in errors): UTF-8, by default with a
    byte-order mark dropped, as editors on Windows write one. Bounded: a device that never
    ends (/dev/zero), a FIFO nobody writes to or a huge file fails instead of filling memory or
    blocking; a pipe is read within USER_FILE_PIPE_S."""
    try:
        # Non-blocking: opening a FIFO without a writer returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{what}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{what}: Is a directory")
        pipe = stat.S_ISFIFO(mode)
        if not (stat.S_ISREG(mode) or pipe):
            raise UsageError(f"{what}: not a regular file (a device or a socket)")
        data = bytearray()
        deadline = time.monotonic() + USER_FILE_PIPE_S
        while len(data) <= USER_FILE_MAX_BYTES:
            try:
                chunk = os.read(fd, min(1 << 16, USER_FILE_MAX_BYTES + 1 - len(data)))
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise UsageError(f"{what}: a pipe that sent no end within "
                                     f"{USER_FILE_PIPE_S:g} s") from None
                continue
            except OSError as e:
                raise UsageError(f"{what}: {e.strerror}") from None
            if not chunk:
                break
            data += chunk
        if len(data) > USER_FILE_MAX_BYTES:
            raise UsageError(f"{what}: larger than {USER_FILE_MAX_BYTES} bytes")
    finally:
        os.close(fd)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise UsageError(f"{what}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") \
            from None


class Host:
    """One hostfile entry: [user@]name[:sshport] [slots=N] [server_weight=W]."""

    def __init__(self, name, user=None, port=None, slots=1):
        self.name = name  # what DMLC_NODE_HOST is set to
        self.user = user
        self.port = port  # ssh port, None for ssh's default
        self.slots = slots
        # the share of the keys each server placed here takes, relative to the others: below
        # 1 for a host whose link or CPU is slower (PS_SERVER_WEIGHTS)
        self.server_weight = 1.0

    @property
    def target(self):
        """The ssh destination."""
        return f"{self.user}@{self.name}" if self.user else self.name

    def key(self):
        return (self.user, self.name, self.port)

    def __repr__(self):
        port = f":{self.port}" if self.port else ""
        return f"Host({self.target}{port} slots={self.slots})"


def parse_host(text, where):
    """Parses '[user@]host[:port]' (IPv6 as [addr] or [addr]:port)."""
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
        if not user:
            raise UsageError(f"{where}: empty user name in '{text}'")
    port = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise UsageError(f"{where}: unbalanced '[' in '{text}'")
        name, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(f"{where}: unexpected '{rest}' after ']'")
            port = rest[1:]
    elif text.count(":") == 1:
        name, port = text.split(":")
    else:
        name = text  # plain name, or a bare IPv6 address without a port
    if not name:
        raise UsageError(f"{where}: empty host name")
    if ":" in name and not is_ipv6(name):
        raise UsageError(f"{where}: bad host '{text}' (want [user@]host[:sshport], an IPv6 "
                         "address in brackets: [addr]:sshport)")
    if ":" not in name and not HOST_NAME.fullmatch(name):
        raise UsageError(f"{where}: bad host name '{name}': letters, digits, '.', '-' and '_' "
                         "only, one host per line")
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{where}: bad ssh port '{port}' (want 1-65535)")
        port = int(port)
    return Host(name, user, port)


HOSTFILE_LINE = "'[user@]host[:sshport] [slots=N] [server_weight=W]'"
HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


def is_ipv6(name):
    try:
        return ipaddress.ip_address(name).version == 6
    except ValueError:
        return False


def refuse_ipv6_node_hosts(hosts, where, interface):
    """The job's nodes speak IPv4: an IPv6 address can name a host for ssh only when -i gives
    the nodes their addresses."""
    if interface:
        return
    for host in hosts:
        if is_ipv6(host.name):
            raise UsageError(f"{where}: {host.name} is an IPv6 address, and the job's nodes "
                             "speak IPv4 (each node's DMLC_NODE_HOST is its host's name): list "
                             "the host by a name or IPv4 address, or add -i IFACE to take each "
                             "node's address from that interface")


def parse_hostfile_text(text, path="hostfile"):
    """Lines: HOSTFILE_LINE, '# comment'. Returns [Host]."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        fields = line.split()
        host = parse_host(fields[0], where)
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if key == "slots" and sep:
                if not value.isdigit() or int(value) < 1:
                    raise UsageError(f"{where}: bad slots value '{value}' (want an integer >= 1)")
                host.slots = int(value)
            elif key == "server_weight" and sep:
                try:
                    host.server_weight = float(value)
                except ValueError:
                    host.server_weight = 0.0
                if not 0 < host.server_weight < float("inf"):
                    raise UsageError(f"{where}: bad server_weight value '{value}' (want a "
                                     "number > 0, e.g. 0.25 for a host at a quarter of the "
                                     "others' link rate)")
            else:
                raise UsageError(f"{where}: unknown field '{field}' (a line is "
                                 f"{HOSTFILE_LINE})")
        hosts.append(host)
    if not hosts:
        raise UsageError(f"{path}: no hosts in the hostfile")
    return hosts


def slot_list(hosts):
    """The hosts in file order, round after round: round r holds every host with more than r
    slots (a b c for 'a slots=2, b, c slots=3' round 0, then a c, then c)."""
    slots = []
    for r in range(max(h.slots for h in hosts)):
        slots.extend(h for h in hosts if h.slots > r)
    return slots


def place(hosts, num_servers, num_workers, server_hosts=None):
    """Assigns a host to each server and worker.

    Servers beside workers (MXNet's layout, server_hosts None): servers then workers are dealt
    out over the slot list of `hosts` round-robin, one global counter (as MXNet does), so
    servers land on distinct hosts first and a host with slots=2 takes two processes per cycle.
    More processes than slots: the cycle repeats.

    Servers on hosts of their own (BytePS's layout): servers are dealt round-robin over the
    slot list of `server_hosts`, workers over that of `hosts`, each from its first slot.
    Returns (server_hosts, worker_hosts).
    """
    if server_hosts:
        sslots, wslots = slot_list(server_hosts), slot_list(hosts)
        return ([sslots[i % len(sslots)] for i in range(num_servers)],
                [wslots[j % len(wslots)] for j in range(num_workers)])
    slots = slot_list(hosts)
    servers = [slots[i % len(slots)] for i in range(num_servers)]
    workers = [slots[(num_servers + j) % len(slots)] for j in range(num_workers)]
    return servers, workers


def is_loopback(name):
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def local_address_towards(name):
    """The local address the kernel would use to reach host `name` (no packet is sent), or
    None when `name` does not resolve here (an ssh config alias, say) or has no route."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(name, 22, 0, socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return None


# --------------------------------------------------------------------------------------------
# Command line


def parse_env_items(items, flag, environ):
    """--env items: K=V; MXNet's K:V; or a bare K, whose value is the launcher's own."""
    out = {}
    for item in items:
        if "=" in item:
            key, value = item.split("=", 1)
        elif ":" in item:
            key, value = item.split(":", 1)
        else:
            key = item
            if key not in environ:
                raise UsageError(f"{flag} {key}: {key} is not set in the launcher's environment "
                                 f"(write {flag} {key}=VALUE to give a value)")
            value = environ[key]
        if not ENV_NAME_RE.match(key):
            raise UsageError(f"{flag} {item}: '{key}' is not a valid variable name (want K=V)")
        if key in SECRET_VARS:
            # Not {item}: the secret itself, which the error would show to whoever reads it.
            raise UsageError(f"{flag} {key}=...: the job secret is not given on the command line; "
                             f"set {key} in the launcher's environment, and the launcher hands "
                             "it to every process over its standard input")
        if key in LAUNCHER_OWNED:
            raise UsageError(f"{flag} {item}: {key} is set by the launcher "
                             "(use -n/-s for the counts; the hostfile for the hosts)")
        if flag != "--env" and key in JOB_WIDE:
            raise UsageError(f"{flag} {item}: {key} must be the same for every process; "
                             "give it with --env")
        out[key] = value
    return out


def job_secret(environ):
    """PS_JOB_SECRET, else the first line of PS_JOB_SECRET_FILE, else a new random one: only
    the job's own processes can then join it or talk to its nodes."""
    secret, path = environ.get("PS_JOB_SECRET"), environ.get("PS_JOB_SECRET_FILE")
    if secret is not None and path is not None:
        raise UsageError("both PS_JOB_SECRET and PS_JOB_SECRET_FILE are set: set one of them")
    source = "PS_JOB_SECRET"
    if path is not None:
        source = f"PS_JOB_SECRET_FILE={path}: its first line"
        # Read as the nodes read it (a byte-order mark would be part of the secret there too).
        text = read_text_file(path, f"PS_JOB_SECRET_FILE={path}", encoding="utf-8")
        problem = secret_file_exposure(path)
        if problem:
            raise UsageError(f"PS_JOB_SECRET_FILE={path}: {problem}")
        secret = text.split("\n", 1)[0].removesuffix("\r")  # a line ends before CR LF too
        if not secret:
            raise UsageError(f"PS_JOB_SECRET_FILE={path}: its first line is empty")
    if secret is None:
        return secrets.token_hex(16)
    if not secret or "\n" in secret or len(secret.encode()) > 255:
        raise UsageError(f"{source}: want one line of 1 to 255 bytes")
    return secret


def secret_file_exposure(path):
    """Why a secret file lets other users in ("" when it does not), as the nodes judge it
    (ps/src/config.cc): a regular file that others may read or write."""
    try:
        st = os.stat(path)
    except OSError:
        return ""  # read_text_file said why already
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o077:
        return ""
    return (f"other users may read or write it (mode {stat.S_IMODE(st.st_mode):04o}), and with "
            f"the secret join the job: chmod 600 {shlex.quote(path)}")


class Once(argparse.Action):
    """The parser's default action: stores an option's one value, and refuses the option given
    again (-n 1 -n 2), where argparse would keep the last value. Flags (store_true) and the
    repeatable --env* options have actions of their own."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:  # an option, not the worker command
            given = namespace.__dict__.setdefault("_given_once", {})
            this = f"{option_string} {shlex.quote(str(values))}"
            if self.dest in given:
                raise UsageError(f"{'/'.join(self.option_strings)} given twice "
                                 f"({given[self.dest]}, then {this}): it takes one value; give "
                                 "it once")
            given[self.dest] = this
        setattr(namespace, self.dest, values)


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Launch a distributed parameter-server job: one scheduler, S servers and "
                    "N workers, on this machine or over ssh. Every line of every process is "
                    "shown prefixed with its role and rank. Exit status 0 only when every "
                    "process exited 0, except a server whose death the job survived with "
                    "replication (PS_REPLICATION, the default with 2 or more servers).",
        epilog="example: tools/launch.py -n 4 -s 2 -H hosts build/bin/ps-train --kvstore dist_sync"
               "   (see docs/launcher.md)")
    p.register("action", None, Once)
    p.add_argument("-n", "--num-workers", required=True, type=int,
                   help="number of worker processes to start (required)")
    p.add_argument("-s", "--num-servers", type=int,
                   help="number of server processes (default: the number of workers; with "
                        "--server-hostfile, its slots)")
    p.add_argument("-H", "--hostfile", "--host-file", dest="hostfile",
                   help="hosts to run servers and workers on, one per line: "
                        "[user@]host[:sshport] [slots=N] [server_weight=W] (e.g. node1, "
                        "alice@node2:2222 slots=2, node3 server_weight=0.25 for a host whose "
                        "servers should hold a quarter of the keys the others hold); "
                        "'#' starts a comment")
    p.add_argument("--server-hostfile", metavar="FILE",
                   help="BytePS layout: run the servers on these hosts (same format) and the "
                        "workers on the -H hosts; -s defaults to the slots in FILE (ssh "
                        "launcher)")
    p.add_argument("--launcher", choices=("local", "ssh"),
                   help="where processes run (default: ssh with a hostfile, local without)")
    p.add_argument("--sync-dst-dir", metavar="DIR",
                   help="rsync the current directory to DIR on every host first and run there "
                        "(ssh launcher)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set K=V for every process (repeatable); a bare K passes the launcher's "
                        "value of K; DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT here override the "
                        "launcher's choice")
    p.add_argument("--env-server", action="append", default=[], metavar="K=V",
                   help="set K=V for the servers only (repeatable; wins over --env)")
    p.add_argument("--env-worker", action="append", default=[], metavar="K=V",
                   help="set K=V for the workers only (repeatable; wins over --env)")
    p.add_argument("--env-scheduler", action="append", default=[], metavar="K=V",
                   help="set K=V for the scheduler only (repeatable; wins over --env)")
    p.add_argument("--server-cmd", metavar="CMD",
                   help="server command line, split like a shell would (default: ps-server from "
                        "the launcher's build or install, else PATH)")
    p.add_argument("--scheduler-cmd", metavar="CMD",
                   help="scheduler command line (default: ps-scheduler, found like ps-server)")
    p.add_argument("--same-cmd-for-all-roles", action="store_true",
                   help="MXNet style: run the worker command for every role, with DMLC_ROLE "
                        "set to scheduler, server or worker")
    p.add_argument("--scheduler-host", metavar="HOST[:SSHPORT]",
                   help="run the scheduler on this host over ssh instead of on the launching "
                        "host (ssh launcher)")
    p.add_argument("-i", "--interface", metavar="IFACE",
                   help="set DMLC_INTERFACE=IFACE (network interface) for every process: servers "
                   "and workers advertise its address instead of their hostfile name")
    p.add_argument("--ssh-opts", metavar="OPTS",
                   help="extra ssh options, e.g. \"-i KEY -o StrictHostKeyChecking=no\"; "
                        "also used by rsync")
    p.add_argument("--startup-timeout", type=positive_seconds, default=60.0, metavar="SEC",
                   help="how long to wait for the scheduler to listen (default 60)")
    p.add_argument("--shutdown-timeout", type=positive_seconds, default=30.0, metavar="SEC",
                   help="after every worker succeeded, how long the scheduler and servers may "
                        "take to exit before they are stopped and the job fails (default 30)")
    p.add_argument("--server-restarts", type=int, default=0, metavar="N",
                   help="when the job goes on without a dead server (PS_REPLICATION), start a "
                        "new one on its host, which takes its rank and becomes a replica; at "
                        "most N times per job (default 0: never)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="show only the workers' output (plus the launcher's own messages)")
    p.add_argument("--dry-run", action="store_true",
                   help="print every command the launcher would run, and exit")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the worker command and its arguments")
    return p


class Config:
    """Validated launcher configuration (everything parse_args decides)."""


def is_program(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_binary(name, environ, launcher_dir):
    """ps-server/ps-scheduler: $PS_BIN_DIR, <repo>/build/bin, next to launch.py, then PATH."""
    dirs = []
    if environ.get("PS_BIN_DIR"):
        dirs.append(environ["PS_BIN_DIR"])
    dirs.append(os.path.join(os.path.dirname(launcher_dir), "build", "bin"))
    dirs.append(launcher_dir)
    for d in dirs:
        path = os.path.join(d, name)
        if is_program(path):
            return os.path.abspath(path)
    return shutil.which(name, path=environ.get("PATH"))


def ps_bin_dir_lacks(environ, names):
    """(why, [the names it lacks]) when $PS_BIN_DIR is set but lacks some of `names` (so that
    find_binary looks further), else None."""
    d = environ.get("PS_BIN_DIR")
    if not d:
        return None
    if not os.path.isdir(d):
        where = "" if os.path.isabs(d) else f" ({os.path.abspath(d)})"
        return f"no such directory{where}", list(names)
    missing = [n for n in names if not is_program(os.path.join(d, n))]
    return (f"no {', '.join(missing)} there", missing) if missing else None


def ps_bin_dir_warning(environ, found):
    """found: {name: path or None} of the default binaries looked up. When $PS_BIN_DIR was
    passed over for some that were found elsewhere, one line saying why and what is used."""
    lacks = ps_bin_dir_lacks(environ, found)
    if lacks is None:
        return None
    why, missing = lacks
    used = {}  # directory -> the binaries taken from it
    for name in missing:
        if found[name] is not None:
            used.setdefault(os.path.dirname(found[name]), []).append(name)
    if not used:
        return None  # found nowhere: role_command's message names PS_BIN_DIR
    instead = ", ".join(f"{' and '.join(names)} from {d}" for d, names in used.items())
    return f"PS_BIN_DIR={environ['PS_BIN_DIR']}: {why}; using {instead} instead"


def positive_seconds(text):
    """argparse type of a timeout: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': want a number of seconds above 0")
    return value


# Options whose value often starts with '-' ("--ssh-opts '-i key'"), which argparse would take
# for an option: join them to their value as --opt=VALUE before parsing.
DASH_VALUE_OPTIONS = ("--ssh-opts", "--server-cmd", "--scheduler-cmd")


def join_dash_values(parser, argv):
    """Joins each DASH_VALUE_OPTIONS option to its value, up to the worker command."""
    out = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--" or not tok.startswith("-") or tok == "-":
            return out + argv[i:]  # the worker command starts here
        action = parser._option_string_actions.get(tok)
        takes_value = action is not None and action.nargs is None and action.const is None
        if takes_value and i + 1 < len(argv):
            if tok in DASH_VALUE_OPTIONS:
                out.append(f"{tok}={argv[i + 1]}")
            else:
                out += [tok, argv[i + 1]]
            i += 2
        else:
            out.append(tok)
            i += 1
    return out


# The most workers, and the most servers, a job may have: the bound the nodes put on
# DMLC_NUM_WORKER and DMLC_NUM_SERVER (ps/src/config.cc).
MAX_ROLE_COUNT = 65536


def check_count(flag, count, role, note=""):
    """Refuses a count of workers or servers the nodes would refuse, before anything starts;
    `note` ends the message (where a count the user did not give comes from)."""
    if not 1 <= count <= MAX_ROLE_COUNT:
        raise UsageError(f"{flag} {count}: a job takes 1 to {MAX_ROLE_COUNT} {role}s{note}")


# Options only the ssh launcher uses (argparse dest, flag): with the local launcher, an error.
SSH_ONLY = (("hostfile", "-H"), ("server_hostfile", "--server-hostfile"),
            ("sync_dst_dir", "--sync-dst-dir"), ("ssh_opts", "--ssh-opts"),
            ("scheduler_host", "--scheduler-host"))


def refuse_ssh_only(a):
    """With the local launcher, refuses the SSH_ONLY options rather than ignore them."""
    local = "--launcher local" if a.launcher else "the local launcher (the default without -H)"
    for dest, flag in SSH_ONLY:
        value = getattr(a, dest)
        if value is not None:
            raise UsageError(f"{flag} {shlex.quote(value)}: needs the ssh launcher (--launcher "
                             f"ssh, the default with -H HOSTFILE); {local} runs every process "
                             "on this machine")


def parse_args(argv, environ=None, cwd=None, launcher_dir=None):
    environ = dict(os.environ if environ is None else environ)
    cwd = os.path.abspath(cwd or os.getcwd())
    parser = build_parser()
    a = parser.parse_args(join_dash_values(parser, list(argv)))
    c = Config()
    c.environ = environ
    c.cwd = cwd
    command = list(a.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no worker command given (e.g. launch.py -n 2 build/bin/ps-train ...)")
    parse_counts(a, c)
    c.quiet = a.quiet
    c.dry_run = a.dry_run
    c.startup_timeout = a.startup_timeout
    c.shutdown_timeout = a.shutdown_timeout
    c.interface = a.interface
    c.warnings = []
    parse_ssh_opts(a, c)
    parse_hosts(a, c)
    parse_environment(a, c, environ)
    parse_commands(a, c, command, environ,
                   launcher_dir or os.path.dirname(os.path.abspath(__file__)))
    return c


def parse_counts(a, c):
    """-n, -s and the launcher they go with."""
    note = ""
    if a.num_servers is None and a.server_hostfile is None:  # -s defaults to -n
        note = (f"; -s was not given and defaults to -n, so the job would have {a.num_workers} "
                "servers too")
    check_count("-n", a.num_workers, "worker", note)
    c.num_workers = a.num_workers
    c.num_servers = a.num_workers if a.num_servers is None else a.num_servers
    if a.num_servers is not None and not (a.num_servers == 0 and a.server_hostfile is not None):
        check_count("-s", a.num_servers, "server")
    c.launcher = a.launcher or ("ssh" if a.hostfile is not None or a.server_hostfile is not None
                                else "local")
    if c.launcher == "local":
        refuse_ssh_only(a)


def parse_ssh_opts(a, c):
    try:
        c.ssh_opts = shlex.split(a.ssh_opts or "")
    except ValueError as e:
        raise UsageError(f"--ssh-opts: {e}") from None
    for bad in ("-n", "-f", "-N"):
        if bad in c.ssh_opts:
            raise UsageError(f"--ssh-opts: {bad} cannot be used: the launcher needs ssh's stdin "
                             "and the remote command to stop remote processes")


def parse_hosts(a, c):
    """-H, --server-hostfile and --scheduler-host (after parse_counts)."""
    c.hosts = None
    if c.launcher == "ssh":
        if not a.hostfile and a.server_hostfile:
            raise UsageError("--server-hostfile places the servers only: give the workers' "
                             "hosts with -H HOSTFILE")
        if not a.hostfile:
            raise UsageError("the ssh launcher needs -H HOSTFILE")
        c.hosts = parse_hostfile_text(read_text_file(a.hostfile, f"-H {a.hostfile}"), a.hostfile)
        refuse_ipv6_node_hosts(c.hosts, a.hostfile, a.interface)
    c.server_hosts = None
    if a.server_hostfile is not None:
        c.server_hosts = parse_hostfile_text(
            read_text_file(a.server_hostfile, f"--server-hostfile {a.server_hostfile}"),
            a.server_hostfile)
        refuse_ipv6_node_hosts(c.server_hosts, a.server_hostfile, a.interface)
        if a.num_servers is None:
            c.num_servers = sum(h.slots for h in c.server_hosts)
            check_count("-s", c.num_servers, "server",
                        " (-s was not given: it defaults to the slots in --server-hostfile "
                        f"{a.server_hostfile})")
        elif c.num_servers == 0:
            raise UsageError("-s 0 with --server-hostfile: there are no servers to place "
                             "(drop --server-hostfile, or give -s)")
        shared = sorted({h.name for h in c.hosts} & {h.name for h in c.server_hosts})
        if shared:
            c.warnings.append(f"{', '.join(shared)} in both -H and --server-hostfile: "
                              "servers and workers share those hosts' links")
    c.sync_dst_dir = a.sync_dst_dir or None
    c.scheduler_host = None
    if a.scheduler_host is not None:
        c.scheduler_host = parse_host(a.scheduler_host, "--scheduler-host")


def parse_environment(a, c, environ):
    """--env*, the job-wide variables the launcher reads, the job secret and replication."""
    c.env_all = parse_env_items(a.env, "--env", environ)
    c.env_role = {
        "server": parse_env_items(a.env_server, "--env-server", environ),
        "worker": parse_env_items(a.env_worker, "--env-worker", environ),
        "scheduler": parse_env_items(a.env_scheduler, "--env-scheduler", environ),
    }
    if c.server_hosts and any(h.server_weight != 1.0 for h in c.hosts):
        c.warnings.append("server_weight in the -H hostfile is ignored: with --server-hostfile "
                          "the servers run on that file's hosts (give their weights there)")
    weighted = any(h.server_weight != 1.0 for h in (c.server_hosts or c.hosts or []))
    if weighted and ("PS_SERVER_WEIGHTS" in c.env_all or "PS_SERVER_WEIGHTS" in environ):
        raise UsageError("PS_SERVER_WEIGHTS is set and the hostfile gives server_weight too: "
                         "give the weights one way (the hostfile's follow the servers' hosts)")
    given = c.env_all.pop("DMLC_PS_ROOT_PORT", None)
    port = given or environ.get("DMLC_PS_ROOT_PORT") or None
    c.root_port_from_shell = bool(port) and not given
    if port is not None and (not port.isdigit() or not 0 < int(port) < 65536):
        raise UsageError(f"DMLC_PS_ROOT_PORT={port}: want a port number 1-65535")
    c.user_root_port = int(port) if port else None
    c.user_root_uri = c.env_all.pop("DMLC_PS_ROOT_URI", None) or environ.get("DMLC_PS_ROOT_URI")
    c.job_secret = job_secret(environ)
    # With replication a dead server's keys live on in its replica and the job goes on
    # (docs/kvstore.md, "Replication and failover"): the launcher lets it.
    replication = c.env_all.get("PS_REPLICATION", c.env_role["server"].get(
        "PS_REPLICATION", environ.get("PS_REPLICATION")))
    c.replicated = (replication is None or replication in ("1", "true")) and c.num_servers >= 2
    if a.server_restarts < 0:
        raise UsageError(f"--server-restarts {a.server_restarts}: want 0 or more")
    if a.server_restarts and not c.replicated:
        raise UsageError("--server-restarts needs replication: 2 or more servers (-s) and "
                         "PS_REPLICATION unset or 1; without it a dead server ends the job")
    c.server_restarts = a.server_restarts


def parse_commands(a, c, command, environ, launcher_dir):
    """The workers', servers' and scheduler's commands."""
    c.worker_cmd = command
    if a.same_cmd_for_all_roles:
        if a.server_cmd is not None or a.scheduler_cmd is not None:
            raise UsageError("--same-cmd-for-all-roles conflicts with --server-cmd/--scheduler-cmd")
        c.server_cmd = list(command)
        c.scheduler_cmd = list(command)
    else:
        found = {}  # the default binaries looked up: name -> path, or None
        c.server_cmd = role_command(a.server_cmd, "--server-cmd", "ps-server", c, launcher_dir,
                                    found)
        c.scheduler_cmd = role_command(a.scheduler_cmd, "--scheduler-cmd", "ps-scheduler", c,
                                       launcher_dir, found)
        warning = ps_bin_dir_warning(environ, found)
        if warning:
            c.warnings.append(warning)
    # Our ps-scheduler binds port 0 and reports the port it got: no free-port race at all.
    c.scheduler_reports_port = os.path.basename(c.scheduler_cmd[0]) == "ps-scheduler"


def program_problem(program, cwd, path):
    """Why `program`, a command's first word, cannot be run here (None when it can): what the
    shell would say later, once the job had started, and with no fix."""
    if "/" not in program:
        if shutil.which(program, path=path) is None:
            return (f"{program} is not found in PATH: give its path (./{program} for one in "
                    "the current directory), or install it")
        return None
    full = os.path.join(cwd, program)
    if not os.path.exists(full):
        where = "" if os.path.isabs(program) else f" (relative to {cwd})"
        return f"{program} does not exist{where}: check the path, or build it"
    if os.path.isdir(full):
        return f"{program} is a directory, not a program"
    if not os.access(full, os.X_OK):
        return (f"{program} is not executable: chmod +x {program}, or put its interpreter "
                f"first (python3 {program}, bash {program})")
    return None


def role_command(text, flag, default_name, c, launcher_dir, found):
    """The command of a role: `text` split, or else the default binary (recorded in found)."""
    if text is not None:  # given, if only as "" (an unset shell variable): never the default
        try:
            cmd = shlex.split(text)
        except ValueError as e:
            raise UsageError(f"{flag}: {e}") from None
        if not cmd:
            raise UsageError(f"{flag}: empty command: give the {default_name} command line, or "
                             f"leave {flag} out for {default_name} from the launcher's build")
        return cmd
    path = found[default_name] = find_binary(default_name, c.environ, launcher_dir)
    if path is None:
        lacks = ps_bin_dir_lacks(c.environ, [default_name])
        bin_dir = (f"PS_BIN_DIR={c.environ['PS_BIN_DIR']}: {lacks[0]}" if lacks
                   else "PS_BIN_DIR not set")
        if c.launcher == "ssh":
            c.warnings.append(f"{default_name} not found locally ({bin_dir}); running "
                              f"'{default_name}' from the PATH of each host")
            return [default_name]
        raise UsageError(f"{default_name} not found in $PS_BIN_DIR, the build (build/bin), next "
                         f"to {PROG} or in PATH ({bin_dir}): build the project (cmake --build "
                         f"build) or give {flag}")
    return [path]


# --------------------------------------------------------------------------------------------
# Processes


class Spec:
    """What to run: one scheduler, server or worker."""

    def __init__(self, role, rank, host, argv, env):
        self.role = role
        self.rank = rank
        self.host = host  # Host for a remote process, None for a local one
        self.argv = argv
        self.env = env  # the variables the launcher sets (on top of the base environment)

    @property
    def label(self):
        return self.role if self.role == "scheduler" else f"{self.role} {self.rank}"

    @property
    def where(self):
        return self.host.target if self.host else "localhost"


class Launch:
    """One job: builds the specs, runs them, watches them, stops them."""

    def __init__(self, c, out=None, err=None):
        self.c = c
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.events = queue.Queue()
        self.procs = []
        self.lost_servers = []  # servers that died while the job went on (replication)
        # server rank -> how many times the scheduler said the job goes on without it (each
        # death of a server holding that rank: the first one, then each restarted one)
        self.survived_deaths = {}
        self.joins = {}  # server rank -> servers the scheduler admitted in a dead one's place
        self.job_filled = False  # the scheduler said every node registered
        self.deaths_heard = {}  # (role, rank) -> when a process's output first said it died
        self.stall_noted = set()  # hosts whose stalled ssh starts were said (note_stalled_starts)
        self.ranks_to_restart = []  # survived ranks for which a new server is due (watch)
        self.restarts_left = c.server_restarts
        self.waiting_on_scheduler = False  # a server exit awaits the scheduler's word (watch)
        self.signal_received = None
        self.signal_count = 0
        self.out_broken = False

    # ---- messages
    def say(self, msg):
        self.err.write(f"[launch] {msg}\n")
        self.err.flush()

    # ---- building commands
    def root_uri(self):
        c = self.c
        if c.user_root_uri:
            return c.user_root_uri
        if c.launcher == "local":
            return "127.0.0.1"
        if c.scheduler_host:
            return c.scheduler_host.name
        hosts = c.hosts + (c.server_hosts or [])
        if all(is_loopback(h.name) for h in hosts):
            return "127.0.0.1"
        # The local address towards the first host this machine can resolve and route to.
        remote = [h.name for h in hosts if not is_loopback(h.name)]
        for name in remote:
            address = local_address_towards(name)
            if address is not None:
                return address
        raise UsageError(f"cannot tell the scheduler's address for the hosts: none of "
                         f"{', '.join(dict.fromkeys(remote))} resolves or has a route from this "
                         "machine (ssh may still reach them, through its own configuration); "
                         "give the address they reach this machine at: --env "
                         "DMLC_PS_ROOT_URI=ADDRESS, or --scheduler-host HOST")

    def workdir(self, spec):
        if spec.host is not None and self.c.sync_dst_dir:
            return self.c.sync_dst_dir
        return self.c.cwd

    def dmlc_env(self, role, node_host, root_uri, root_port, rank=None, local_rank=None):
        c = self.c
        env = {}
        if rank is not None:
            # Ask for the rank the output prefix shows, so "[worker 1]" is KVStore rank 1.
            env["PS_RANK"] = str(rank)
        if local_rank is not None:
            # The worker's index among the workers on its host: ps-train's GPU there. Ranks
            # are dealt round-robin over the hosts, so rank modulo the GPU count would put two
            # workers of one host on the same GPU.
            env["PS_LOCAL_RANK"] = str(local_rank)
        if c.interface:
            env["DMLC_INTERFACE"] = c.interface
        env.update({
            "DMLC_ROLE": role,
            "DMLC_PS_ROOT_URI": root_uri,
            "DMLC_PS_ROOT_PORT": str(root_port),
            "DMLC_NUM_SERVER": str(c.num_servers),
            "DMLC_NUM_WORKER": str(c.num_workers),
        })
        # A node's own address: the hostfile's name, unless -i names the interface to take it
        # from (DMLC_NODE_HOST would win over DMLC_INTERFACE). The scheduler binds the root URI.
        if not c.interface or role == "scheduler":
            env["DMLC_NODE_HOST"] = node_host
        env.update(c.env_all)
        env.update(c.env_role[role])
        weights = self.server_weights()
        if weights:
            env["PS_SERVER_WEIGHTS"] = weights
        return env

    def server_weights(self):
        """PS_SERVER_WEIGHTS from the hostfiles' server_weight fields, by server rank (the
        rank each server is placed with), or None when every server's host has the default."""
        if self.c.launcher == "local":
            return None
        servers, _ = self.placement()
        if all(h.server_weight == 1.0 for h in servers):
            return None
        return ",".join(f"{h.server_weight:g}" for h in servers)

    def make_specs(self, root_uri, root_port_for_others):
        """Server and worker specs (the scheduler's is made by scheduler_spec)."""
        c = self.c
        if c.launcher == "local":
            server_hosts = [None] * c.num_servers
            worker_hosts = [None] * c.num_workers
        else:
            server_hosts, worker_hosts = self.placement()
        specs = []
        for i, h in enumerate(server_hosts):
            node = h.name if h else "127.0.0.1"
            specs.append(Spec("server", i, h, c.server_cmd,
                              self.dmlc_env("server", node, root_uri, root_port_for_others, i)))
        # host name -> workers placed there so far. Entries of one name are one machine (its
        # GPUs), even with different ssh ports.
        on_host = {}
        for i, h in enumerate(worker_hosts):
            node = h.name if h else "127.0.0.1"
            local_rank = on_host.get(node, 0)
            on_host[node] = local_rank + 1
            specs.append(Spec("worker", i, h, c.worker_cmd,
                              self.dmlc_env("worker", node, root_uri, root_port_for_others, i,
                                            local_rank)))
        return specs

    def scheduler_spec(self, root_uri, port):
        c = self.c
        host = c.scheduler_host
        node = host.name if host else root_uri
        return Spec("scheduler", 0, host, c.scheduler_cmd,
                    self.dmlc_env("scheduler", node, root_uri, port))

    def base_env(self, spec):
        """The environment of the wrapper: all of the launcher's (local) or a forwarded few."""
        if spec.host is None:
            env = {k: v for k, v in self.c.environ.items() if k not in SECRET_VARS}
            if "DMLC_NODE_HOST" not in spec.env:
                env.pop("DMLC_NODE_HOST", None)  # -i: the launcher's own would beat the interface
        else:
            env = {k: self.c.environ[k] for k in FORWARDED if k in self.c.environ}
        env.update(spec.env)
        return env

    def ssh_base(self, host):
        argv = ["ssh"]
        if host.port:
            argv += ["-p", str(host.port)]  # ssh: the first value given wins, so this beats opts
        argv += self.c.ssh_opts
        argv += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                 "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        return argv

    def command_for(self, spec):
        """spec.argv, where it runs. With --sync-dst-dir, a remote process whose program is an
        absolute path inside the synced directory runs the synced copy."""
        argv = list(spec.argv)
        c = self.c
        if spec.host is not None and c.sync_dst_dir and argv[0].startswith(c.cwd + os.sep):
            argv[0] = os.path.join(c.sync_dst_dir, os.path.relpath(argv[0], c.cwd))
        return argv

    def argv_for(self, spec):
        """(argv, env) of the local process that runs spec: the wrapper, or ssh to it."""
        wrapped = ["/bin/sh", "-c", WRAPPER, "ps-launch", self.workdir(spec)] + \
            self.command_for(spec)
        if spec.host is None:
            return wrapped, self.base_env(spec)
        env = self.base_env(spec)
        assigns = [f"{k}={v}" for k, v in env.items()]
        remote = "exec env " + shlex.join(assigns + wrapped)
        ssh_env = {k: v for k, v in self.c.environ.items() if k not in SECRET_VARS}
        return self.ssh_base(spec.host) + [spec.host.target, remote], ssh_env

    def rsync_argv(self, host):
        c = self.c
        ssh = ["ssh"] + (["-p", str(host.port)] if host.port else []) + c.ssh_opts + [
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]
        dst = c.sync_dst_dir.rstrip("/") or "/"
        return ["rsync", "-az", "-e", shlex.join(ssh),
                "--rsync-path", f"mkdir -p {shlex.quote(dst)} && rsync",
                c.cwd.rstrip("/") + "/", f"{host.target}:{dst}/"]

    def placement(self):
        c = self.c
        return place(c.hosts, c.num_servers, c.num_workers, c.server_hosts)

    def sync_hosts(self):
        hosts = {}
        servers, workers = self.placement()
        for h in servers + workers + ([self.c.scheduler_host] if self.c.scheduler_host else []):
            hosts.setdefault(h.key(), h)
        return list(hosts.values())

    # ---- dry run
    def dry_run(self):
        c = self.c
        root_uri = self.root_uri()
        if c.user_root_port:
            sched_port = others_port = c.user_root_port
        elif c.scheduler_reports_port:
            sched_port, others_port = 0, "<port reported by the scheduler>"
        else:
            sched_port = others_port = "<free port picked at start>"
        w = self.out.write
        layout = ""
        if c.launcher == "ssh":
            layout = ("servers on --server-hostfile hosts, workers on -H hosts; "
                      if c.server_hosts else "servers beside workers; ")
        w(f"# launcher: {c.launcher}; {c.num_servers} server(s), {c.num_workers} worker(s); "
          f"{layout}DMLC_PS_ROOT_URI={root_uri}\n")
        if c.sync_dst_dir:
            for h in self.sync_hosts():
                w(f"# sync to {h.target}\n{shlex.join(self.rsync_argv(h))}\n")
        specs = [self.scheduler_spec(root_uri, sched_port)] + self.make_specs(root_uri,
                                                                              others_port)
        for spec in specs:
            argv, _ = self.argv_for(spec)
            shown = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in spec.env.items())
            w(f"# [{spec.label}] on {spec.where} in {self.workdir(spec)}: {shown} "
              f"{shlex.join(self.command_for(spec))}\n")
            if spec.host is None:
                w(f"{shown} {shlex.join(argv)}\n")
            else:
                w(f"{shlex.join(argv)}\n")
        self.out.flush()
        return 0

    # ---- running
    def start(self, spec):
        argv, env = self.argv_for(spec)
        popen = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:  # the wrapper's first line of stdin; the pipe stays open for its watcher
            popen.stdin.write((self.c.job_secret + "\n").encode())
            popen.stdin.flush()
        except OSError:
            pass  # the process is already gone: its exit is reported like any other
        p = Proc(spec, popen)
        self.procs.append(p)
        t = threading.Thread(target=p.read_output, args=(self.events,), daemon=True)
        t.start()
        return p

    def on_signal(self, signum, frame):
        self.signal_count += 1
        if self.signal_received is None:
            self.signal_received = signum

    def show(self, p, line):
        if self.out_broken or (self.c.quiet and p.spec.role != "worker"):
            return
        try:
            self.out.write(f"[{p.spec.label}] {line}\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):
            # Whoever read our output went away (`launch.py ... | head`): the job goes on,
            # quietly; its end is still reported on stderr.
            self.out_broken = True

    def pump(self, timeout):
        """Handles output events for up to `timeout` s; reaps exited processes."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                p, line = self.events.get(timeout=max(0.0, min(remaining, 0.05)))
            except queue.Empty:
                p = None
            if p is not None:
                if line is None:
                    p.eof = True
                else:
                    p.lines_seen += 1
                    p.lines.append(line)
                    m = DEAD_NODE_RE.search(line)
                    if m:  # when the launcher first heard of each death
                        self.deaths_heard.setdefault((m.group(1), int(m.group(2))),
                                                     time.monotonic())
                    if SCHEDULER_DONE in line:
                        p.saw_job_end = True  # kept past the last lines that `lines` holds
                    self.show(p, line)
                    if p.spec.role == "scheduler" and p.port is None:
                        m = LISTEN_RE.match(line)
                        if m:
                            p.port = int(m.group(2))
                    if p.spec.role == "scheduler":
                        if SCHEDULER_FILLED_RE.search(line):
                            self.job_filled = True
                        m = SURVIVED_RE.search(line)
                        if m:
                            rank = int(m.group(1))
                            self.survived_deaths[rank] = self.survived_deaths.get(rank, 0) + 1
                            self.ranks_to_restart.append(rank)
                        m = JOINED_RE.search(line)
                        if m:
                            rank = int(m.group(1))
                            self.joins[rank] = self.joins.get(rank, 0) + 1
            for q in self.procs:
                q.poll()
            if remaining <= 0 or self.signal_received is not None:
                return

    def drain(self, procs, quiet=1.0):
        """Shows the output of `procs` to its end (EOF): bounded by `quiet` s without a line
        from them (others' lines do not count) and by DRAIN_LIMIT_S in all, after which what
        is left unshown is counted; a signal to the launcher ends it at once."""
        start = last_line = time.monotonic()
        while not all(p.eof for p in procs) and self.signal_received is None:
            now = time.monotonic()
            if now - last_line > quiet or now - start > DRAIN_LIMIT_S:
                break
            shown = sum(p.lines_seen for p in procs)
            self.pump(0.05)
            if sum(p.lines_seen for p in procs) != shown:
                last_line = time.monotonic()
        if time.monotonic() - start > DRAIN_LIMIT_S:
            self.say(f"stopped showing the processes' output after {DRAIN_LIMIT_S:g} s: about "
                     f"{self.events.qsize()} line(s) more were not shown (is the reader of "
                     "this output slow?)")

    def wait_scheduler_ready(self, sched, probe_port):
        """Waits for the scheduler's listening line (or, when probe_port, for the port to accept
        connections). Returns the root port, or None when the scheduler exited first, or raises
        TimeoutError."""
        deadline = time.monotonic() + self.c.startup_timeout
        next_probe = 0.0
        while True:
            self.pump(0.05)
            if self.signal_received is not None:
                return None
            if sched.port is not None:
                return sched.port
            if sched.returncode is not None:
                self.drain([sched])
                return sched.port
            now = time.monotonic()
            if probe_port and now >= next_probe:
                next_probe = now + 0.2
                try:
                    with socket.create_connection((sched.spec.env["DMLC_PS_ROOT_URI"],
                                                   probe_port), timeout=0.5):
                        return probe_port
                except OSError:
                    pass
            if now > deadline:
                raise TimeoutError

    def start_scheduler(self, root_uri):
        """Starts the scheduler and returns (proc, root port) or (proc, None) on failure."""
        c = self.c
        if c.user_root_port or c.scheduler_reports_port:
            attempts = 1
        else:
            attempts = PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if c.user_root_port:
                port, probe = c.user_root_port, c.user_root_port
                if c.scheduler_reports_port:
                    probe = None
            elif c.scheduler_reports_port:
                port, probe = 0, None
            else:
                port = pick_free_port(root_uri if c.scheduler_host is None else "")
                probe = port
            sched = self.start(self.scheduler_spec(root_uri, port))
            try:
                got = self.wait_scheduler_ready(sched, probe)
            except TimeoutError:
                self.say(f"scheduler did not report listening within {c.startup_timeout:g} s "
                         f"(--startup-timeout); last lines:")
                self.report_lines(sched)
                return sched, None
            if self.signal_received is not None:
                return sched, None
            if got is not None and sched.returncode is None:
                return sched, got
            port_taken = any("in use" in line for line in sched.lines)
            if sched.returncode is not None and port_taken and attempt < attempts:
                self.say(f"scheduler exited with status {sched.status_text()} before listening "
                         f"on port {port}, which is in use; retrying with another port")
                self.procs.remove(sched)
                continue
            self.say(f"scheduler on {sched.spec.where} exited with status "
                     f"{sched.status_text()} before it was ready; last lines:")
            self.report_lines(sched)
            if port_taken and c.root_port_from_shell:
                self.say(f"DMLC_PS_ROOT_PORT={port} came from the launcher's environment: "
                         "unset DMLC_PS_ROOT_PORT to let the scheduler pick a free port")
            return sched, None
        return None, None  # not reached

    def report_lines(self, p, count=LAST_LINES):
        if not p.lines:
            self.err.write(f"    (no output from {p.spec.label})\n")
        for line in list(p.lines)[-count:]:
            self.err.write(f"    [{p.spec.label}] {line}\n")
        self.err.flush()

    def run_sync(self):
        hosts = self.sync_hosts()
        self.say(f"syncing {self.c.cwd} to {self.c.sync_dst_dir} on "
                 f"{', '.join(h.target for h in hosts)}")
        running = []
        for h in hosts:
            pr = subprocess.Popen(self.rsync_argv(h), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
            running.append((h, pr))
        failed = False
        deadline = time.monotonic() + 3600
        while any(pr.poll() is None for _, pr in running):
            if self.signal_received is not None or time.monotonic() > deadline:
                for _, pr in running:
                    kill_group(pr.pid, signal.SIGKILL)
                for _, pr in running:
                    pr.wait()
                return False
            time.sleep(0.05)
        for h, pr in running:
            output = pr.stdout.read().decode("utf-8", "replace").strip()
            pr.stdout.close()
            if pr.returncode != 0:
                failed = True
                self.say(f"rsync to {h.target}:{self.c.sync_dst_dir} failed with status "
                         f"{pr.returncode}: {output}")
        return not failed

    def run(self):
        c = self.c
        for w in c.warnings:
            self.say(f"warning: {w}")
        if c.dry_run:
            return self.dry_run()
        handlers = {}
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handlers[s] = signal.signal(s, self.on_signal)
        try:
            return self._run()
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)

    def check_local_programs(self):
        """Refuses a command whose program cannot run here before any process starts."""
        c = self.c
        for role, cmd in (("worker", c.worker_cmd), ("server", c.server_cmd),
                          ("scheduler", c.scheduler_cmd)):
            path = {**c.environ, **c.env_all, **c.env_role[role]}.get("PATH", os.defpath)
            problem = program_problem(cmd[0], c.cwd, path)
            if problem:
                raise UsageError(f"the {role} command cannot run: {problem}")

    def signal_exit(self):
        name = signal.Signals(self.signal_received).name
        self.say(f"{name} received: stopping every process")
        self.stop_all()
        return 128 + self.signal_received

    def _run(self):
        c = self.c
        ensure_descriptors(1 + c.num_servers + c.num_workers + c.server_restarts)
        if c.launcher == "local":
            self.check_local_programs()
        root_uri = self.root_uri()
        if c.sync_dst_dir:
            if not self.run_sync():
                if self.signal_received is not None:
                    return 128 + self.signal_received
                return 1
        sched, port = self.start_scheduler(root_uri)
        if self.signal_received is not None:
            return self.signal_exit()
        if port is None:
            self.stop_all()
            return 1
        self.say(f"scheduler listening on {root_uri}:{port}; starting {c.num_servers} server(s) "
                 f"and {c.num_workers} worker(s)")
        for spec in self.make_specs(root_uri, port):
            if spec.host is not None:
                self.wait_for_ssh_slot(spec.host)
                if self.signal_received is not None:
                    break
            self.start(spec)
        return self.watch()

    def wait_for_ssh_slot(self, host):
        """Keeps at most SSH_STARTS_PER_HOST connections to one host in their handshake (sshd
        drops connections beyond its MaxStartups, 10 by default)."""
        def connecting():
            return sum(1 for p in self.procs
                       if p.starting_remotely() and p.spec.host.key() == host.key())
        while connecting() >= SSH_STARTS_PER_HOST and self.signal_received is None:
            self.pump(0.05)

    def watch(self):
        """Waits for the job to end. Returns the launcher's exit status."""
        c = self.c
        workers = [p for p in self.procs if p.spec.role == "worker"]
        shutdown_deadline = None
        while True:
            self.pump(0.1)
            if self.signal_received is not None:
                return self.signal_exit()
            self.waiting_on_scheduler = False
            self.note_stalled_starts()
            self.note_lost_servers()
            self.restart_servers()
            failed = [p for p in self.procs
                      if p.returncode not in (None, 0) and p not in self.lost_servers]
            if failed and self.waiting_on_scheduler and all(
                    p.spec.role == "server" for p in failed):
                continue  # a server's exit the scheduler may still declare survived
            if failed:
                return self.fail()
            if all(p.returncode == 0 or p in self.lost_servers for p in self.procs):
                self.drain(self.procs)
                if self.lost_servers:
                    self.say(f"the job finished without {len(self.lost_servers)} lost "
                             "server(s); every other process exited 0")
                else:
                    self.say("all processes exited 0")
                return 0
            sched_done = any(p.spec.role == "scheduler" and p.returncode == 0 for p in self.procs)
            if shutdown_deadline is None and (all(p.returncode == 0 for p in workers) or
                                              sched_done):
                shutdown_deadline = time.monotonic() + c.shutdown_timeout
            if shutdown_deadline is None:
                continue
            hung = [p for p in self.procs if p.returncode is None]
            # Servers the job went on without hold nothing it needs: not waited for.
            if self.finished_without(hung):
                return 0
            if self.never_filled(workers):
                self.say("every worker exited 0, but the job never started: the scheduler "
                         "did not see every node register. Does the command create a dist "
                         "KVStore on every worker (--help, --version and --kvstore local do "
                         "not)?")
                self.stop_all()
                return 1
            if time.monotonic() > shutdown_deadline:
                self.say(f"{', '.join(p.spec.label + ' on ' + p.spec.where for p in hung)} did "
                         f"not exit within {c.shutdown_timeout:g} s (--shutdown-timeout) after "
                         "the job finished; stopping")
                scheduler = next((p for p in hung if p.spec.role == "scheduler"), None)
                if scheduler is not None and not scheduler.saw_job_end:
                    # It did not log the job's end: likely the workers left without joining.
                    self.say("the workers exited 0, but the scheduler did not log that they "
                             "finished the job: if they never joined it, does the command "
                             "create a dist KVStore on every worker (--help, --version and "
                             "--kvstore local do not)?")
                for p in hung:
                    self.say(f"last lines of {p.spec.label}:")
                    self.report_lines(p)
                self.stop_all()
                return 1

    def never_filled(self, workers):
        """Whether the workers all exited 0 a while ago without the job having filled: with
        them gone it never can, and the scheduler and servers would only wait."""
        # Only ps-scheduler is known to log the line; another scheduler command may not.
        return (workers and self.c.scheduler_reports_port and not self.job_filled
                and self.scheduler_logs_info()
                and all(p.returncode == 0 for p in workers)
                and time.monotonic() - max(p.exit_time for p in workers) > NEVER_FILLED_WAIT_S)

    def finished_without(self, hung):
        """With replication, servers still there after a successful end (stopped or hung: the
        scheduler declared them dead and the job went on) are stopped; the job succeeded."""
        others = [p for p in self.procs if p not in hung]
        if not (self.c.replicated and hung
                and all(self.survived(p) or self.never_joined(p) for p in hung)
                and any(p.spec.role == "scheduler" for p in others)
                and all(p.returncode == 0 or p in self.lost_servers for p in others)):
            return False
        self.drain(others)  # the last lines of the processes that ended, as on a plain end
        for p in hung:
            self.say(f"{p.spec.label} on {p.spec.where} did not exit after the job finished "
                     "(stopped or hung: the job went on without it, PS_REPLICATION); stopping it")
        self.stop_all()
        self.lost_servers.extend(hung)
        self.say(f"the job finished without {len(self.lost_servers)} lost server(s); every "
                 "other process exited 0")
        return True

    def note_lost_servers(self):
        """With replication a server that dies while another lives and the scheduler runs is
        survived: reported once, not a failure of the job."""
        if not self.c.replicated:
            return
        scheduler_ok = all(p.returncode in (None, 0) for p in self.procs
                           if p.spec.role == "scheduler")
        for p in self.procs:
            if (p.spec.role != "server" or p.returncode in (None, 0) or p in self.lost_servers
                    or not scheduler_ok):
                continue
            if self.never_joined(p):
                # A server started in a dead one's place that exited before it took the place:
                # the job goes on as it did without the first.
                self.lost_servers.append(p)
                self.drain([p])
                self.say(f"the new {p.spec.label} on {p.spec.where} exited with status "
                         f"{p.status_text()} before it joined the job; the job goes on without "
                         "it; last lines:")
                self.report_lines(p, 3)
                continue
            if not self.survived(p):
                # Not (yet) a server the scheduler said the job goes on without: wait for its
                # word a few seconds, then the exit is a failure like any other.
                if time.monotonic() - p.exit_time < SURVIVAL_WAIT_S:
                    self.waiting_on_scheduler = True
                continue
            self.lost_servers.append(p)
            self.drain([p])
            self.say(f"{p.spec.label} on {p.spec.where} exited with status {p.status_text()}; "
                     "the job goes on, the other servers serve its keys (PS_REPLICATION); "
                     "last lines:")
            self.report_lines(p, 3)

    def server_procs(self, rank):
        """The server processes started for `rank`, in the order they were started."""
        return [q for q in self.procs if q.spec.role == "server" and q.spec.rank == rank]

    def rank_index(self, p):
        """Server process p's place among the processes started for its rank (0: the first)."""
        return self.server_procs(p.spec.rank).index(p)

    def survived(self, p):
        """Whether the scheduler said the job goes on without server process p: the n-th
        process started for a rank needs the n-th such word for that rank."""
        return (p.spec.role == "server"
                and self.survived_deaths.get(p.spec.rank, 0) > self.rank_index(p))

    def never_joined(self, p):
        """Whether p was started in a dead server's place (--server-restarts) and the
        scheduler never admitted it (refused, or its host is down)."""
        index = self.rank_index(p) if p.spec.role == "server" else 0
        return index > 0 and self.joins.get(p.spec.rank, 0) < index

    def restart_servers(self):
        """--server-restarts: for each rank the job goes on without, a new server on the host
        and with the command and environment of the rank's first one; the scheduler gives it
        the dead one's rank (docs/kvstore.md, "Replication and failover")."""
        workers = [p for p in self.procs if p.spec.role == "worker"]
        ending = any(p.returncode is not None for p in self.procs
                     if p.spec.role == "scheduler") or (
            workers and all(p.returncode == 0 for p in workers))
        while self.ranks_to_restart:
            rank = self.ranks_to_restart.pop(0)
            if ending:  # the job is over or ending: a new server could only wait for it
                continue
            if self.restarts_left <= 0:
                if self.c.server_restarts:
                    self.say(f"no new server for server {rank}: --server-restarts "
                             f"{self.c.server_restarts} used up")
                continue
            started = self.server_procs(rank)
            if not started:
                continue
            first = started[0]
            self.restarts_left -= 1
            self.say(f"starting a new server {rank} on {first.spec.where} in the place of the "
                     f"dead one ({self.restarts_left} of --server-restarts left)")
            if first.spec.host is not None:
                self.wait_for_ssh_slot(first.spec.host)
            self.start(first.spec)

    def fail(self):
        """A process failed: report it, stop the others, return the exit status."""
        # Let the consequences of the first failure arrive, to name the cause rather than them.
        settle = time.monotonic() + 0.3
        while time.monotonic() < settle:
            self.pump(0.05)
        # A server whose death the job survived was reported then: not a cause of this end.
        failed = self.culprits_first([p for p in self.procs if p.returncode not in (None, 0)
                                      and p not in self.lost_servers])
        primary = failed[0]
        self.drain(failed)
        # A host or process found lost is the cause; the exits are its consequences.
        consequence = ", after the loss named above" if self.report_lost_hosts(failed) else ""
        self.say(f"{primary.spec.label} on {primary.spec.where} exited with status "
                 f"{primary.status_text()}{consequence}; last lines:")
        self.report_lines(primary)
        if (primary.spec.role == "server" and self.c.server_restarts
                and self.scheduler_logs_info() and not self.job_filled):
            self.say(f"{primary.spec.label} exited before every node had registered, so the job "
                     "could not start: --server-restarts replaces servers that die once it has")
        for p in failed[1:]:
            self.say(f"also failed: {p.spec.label} on {p.spec.where} "
                     f"(status {p.status_text()}); last lines:")
            self.report_lines(p, 3)
        running = [p for p in self.procs if p.returncode is None]
        if running:
            self.say(f"stopping {len(running)} other process(es)")
        self.stop_all()
        return primary.exit_status() or 1

    @staticmethod
    def culprits_first(failed):
        """`failed` in the order to name them: a process that failed on its own before one
        that only relayed the job's failure (the scheduler told it: "the job failed: ..."),
        then a worker, else a server, else the scheduler (it exits 1 when any node dies, and
        the others fail when it does), the earliest within a role. Exit times across hosts are
        not precise enough to order roles: a remote worker's exit reaches the launcher through
        ssh, after the local scheduler may have reacted to it."""
        rank = {"worker": 0, "server": 1, "scheduler": 2}

        def relayed(p):
            return any("the job failed: " in line for line in p.lines)

        return sorted(failed, key=lambda p: (relayed(p), rank[p.spec.role], p.exit_time))

    def scheduler_logs_info(self):
        """Whether the scheduler's INFO lines (the one saying every node registered) reach the
        launcher: not with GLOG_minloglevel 1 or more."""
        spec = next((p.spec for p in self.procs if p.spec.role == "scheduler"), None)
        level = (spec.env if spec is not None else {}).get(
            "GLOG_minloglevel", os.environ.get("GLOG_minloglevel", "0"))
        try:
            return int(level) < 1
        except ValueError:
            return True

    def report_lost_hosts(self, failed):
        """Names the host first when the failure started there, not where it was noticed:
        - every process on a remote host failed with ssh's 255 (its processes were killed,
          the host went down, or sshd died): the host is named;
        - the scheduler declared a node dead (no heartbeat) whose process, as far as the
          launcher sees, still runs: its host or the network to it is down or too lossy or
          slow, or, when its host acknowledged the scheduler's messages, the process is stuck.
        Returns whether it named one."""
        remote = [p for p in self.procs if p.spec.host is not None]
        lost = []
        for name in dict.fromkeys(p.spec.host.name for p in failed if p.spec.host is not None):
            there = [p for p in remote if p.spec.host.name == name]
            if all(p.returncode == 255 for p in there):
                lost.append(name)
                labels = ", ".join(p.spec.label for p in there)
                if any(p.child_pgid is not None for p in there):
                    self.say(f"lost host {name}: the ssh connections of all its processes "
                             f"({labels}) ended with status 255 (its processes were killed, "
                             "or the host, its sshd or the network to it failed)")
                else:  # not one command ran there: ssh itself failed, and says why
                    self.say(f"could not start {labels} on host {name}: ssh ended with status "
                             f"255 before the command ran{ssh_failure_advice(there)}")
        named = bool(lost)
        for where, labels, waited in self.stalled_starts():
            self.say(f"{', '.join(labels)} on {where}: ssh has not started the command in "
                     f"{waited:.0f} s, so they never joined the job: the connection opened but "
                     "the session stalls (that host overloaded, or a network that loses big "
                     "packets while small ones pass: an MTU mismatch)")
            named = True
        for p in self.procs:
            # A stopped scheduler is silent, not gone: its nodes give up on it and fail first.
            if (p.spec.role == "scheduler" and p.returncode is None and p.spec.host is None
                    and process_state(p.child_pgid) in ("T", "t")):
                self.say(f"the scheduler on {p.spec.where} is stopped (SIGSTOP, Ctrl-Z or a "
                         "debugger): the nodes gave up waiting for it")
                named = True
        seen = set()
        for p in failed:
            for line in p.lines:
                m = DEAD_NODE_RE.search(line)
                if not m or (m.group(1), m.group(2)) in seen:
                    continue
                seen.add((m.group(1), m.group(2)))
                role, rank, addr = m.group(1), int(m.group(2)), m.group(3).strip("[]")
                node = next((q for q in self.procs if q.spec.role == role and q.spec.rank ==
                             rank), None)
                if node is not None and node.spec.host is not None and \
                        node.spec.host.name in lost:
                    continue
                heard = self.deaths_heard.get((role, rank))
                if (node is not None and role == "worker" and node.returncode == 0
                        and heard is not None and node.exit_time <= heard):
                    self.say(f"worker {rank} at {addr} exited 0 but was declared dead by the "
                             "scheduler: its program ended without destroying its KVStore, "
                             "which counts as dying (let the store be destroyed, or call "
                             "ReportFailure, before the process exits)")
                    named = True
                    continue
                if node is None or node.returncode is not None:
                    continue
                state = process_state(node.child_pgid) if node.spec.host is None else None
                if state is not None:
                    # On this machine there is no network to blame: the process is at hand.
                    self.say(f"{role} {rank} at {addr} was declared dead by the scheduler, but "
                             "its process has not exited: "
                             + ("it is stopped (SIGSTOP, Ctrl-Z or a debugger)"
                                if state in ("T", "t") else
                                "it runs but sent no heartbeat (it hangs, or the machine is "
                                "too busy for it to answer)"))
                    named = True
                    continue
                # The scheduler says whether the node's host acknowledged its last message
                # (ps/src/link_state.cc): then the network reaches it and the process is stuck.
                if ("its host acknowledges what the scheduler sends it, so the network "
                        "carries packets both ways" in line):
                    why = (f"{addr} acknowledges the scheduler's messages, so the process "
                           "there is stopped (SIGSTOP), hung or starved of CPU")
                else:
                    why = (f"{addr} or the network to it is down, or the network drops or "
                           "queues its packets for longer than PS_HEARTBEAT_TIMEOUT")
                self.say(f"{role} {rank} at {addr} was declared dead by the scheduler, but "
                         f"its process has not exited as far as the launcher sees: {why}")
                named = True
        return named

    def stalled_starts(self):
        """[(host, labels, seconds waited)] for each host with a remote process running without
        its command started (no pid marker yet) for SSH_START_STALLED_S or longer: the labels
        of all such processes there, the seconds of the longest wait."""
        now = time.monotonic()
        waiting = {}
        for p in self.procs:
            if p.starting_remotely():
                waiting.setdefault(p.spec.where, []).append(p)
        stalled = []
        for where, procs in waiting.items():
            waited = max(now - p.started for p in procs)
            if waited >= SSH_START_STALLED_S:
                stalled.append((where, [p.spec.label for p in procs], waited))
        return stalled

    def note_stalled_starts(self):
        """While the job waits: says once per host that its ssh sessions stall."""
        for where, labels, waited in self.stalled_starts():
            if where in self.stall_noted:
                continue
            self.stall_noted.add(where)
            self.say(f"{', '.join(labels)} on {where}: ssh has not started the command in "
                     f"{waited:.0f} s; still waiting (the host or the network to it is slow or "
                     "loses packets; the scheduler ends the job at PS_REGISTER_TIMEOUT if they "
                     "never join)")

    def stop_all(self):
        """Stops every process still running, on every host; bounded in time."""
        running = [p for p in self.procs if p.returncode is None]
        for p in running:
            p.request_stop()
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(p.returncode is None for p in running):
            if self.signal_count > 1:
                break  # a second Ctrl-C: no more grace
            self.pump(0.05)
        stubborn = [p for p in running if p.returncode is None]
        # Commands whose wrapper was killed (Proc.stop_orphan): TERMed then, killed now.
        for p in self.procs:
            if p.orphan_stopped:
                kill_group(p.child_pgid, signal.SIGKILL)
        killers = []  # (an ssh running the kill on a remote host, the process it kills)
        for p in stubborn:
            self.say(f"{p.spec.label} on {p.spec.where} did not stop; killing it")
            killers.extend((k, p) for k in p.kill(self))
        unreached = {}  # host -> labels of the processes its kill did not reach
        for k, p in killers:
            try:
                status = k.wait(timeout=REMOTE_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                kill_group(k.pid, signal.SIGKILL)
                k.wait()
                status = None
            if status != 0:  # the remote command ends in `true`: only ssh fails
                unreached.setdefault(p.spec.where, []).append(p.spec.label)
        for where, labels in unreached.items():
            self.say(f"could not reach {where} to kill {', '.join(labels)} (ssh failed or "
                     "timed out): they may still run there (a node fails once it has lost the "
                     "scheduler for PS_HEARTBEAT_TIMEOUT); end them there by hand if they do")
        for p in running:
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_group(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
            p.poll()
        self.drain(running, quiet=0.5)


def ensure_descriptors(processes):
    """Raises the launcher's soft descriptor limit to its hard one, as the nodes do, and checks
    that it holds two pipes per process started (its stdin and output), besides the launcher's
    own files and the pipes of a start in progress: a launcher out of them would fail halfway,
    with a job half started."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    need = 2 * processes + DESCRIPTORS_OF_ITS_OWN
    if soft != resource.RLIM_INFINITY and soft < need:
        raise UsageError(f"the launcher needs about {need} file descriptors for the job's "
                         f"{processes} processes (two pipes each, besides its own), and its limit "
                         f"(ulimit -n) is {soft}: raise it (ulimit -n {need}), or start fewer "
                         "processes")


def pick_free_port(addr):
    """A port that is free now (another process may take it before the scheduler binds it:
    the launcher then retries, see start_scheduler)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, 0))
        except OSError:
            s.bind(("", 0))
        return s.getsockname()[1]


def kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_state(pid):
    """The state letter of local process `pid` in /proc (R, S, T for stopped, ...), or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # pid (comm) state ...: comm may hold blanks and parentheses, the state follows
            # the last ')'.
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


# ssh's own complaint when it could not run a command (LogLevel=ERROR keeps it), and what to do.
SSH_FAILURES = (
    ("timed out", "the host did not answer within ssh's ConnectTimeout (10 s): check that it "
     "is up and reachable, and on a path of a long round trip (a second or more) give ssh more "
     "time (--ssh-opts \"-o ConnectTimeout=60\")"),
    ("Connection refused", "no sshd listens there: start it, or give the port (host:port in "
     "the hostfile)"),
    ("Could not resolve hostname", "check the host name in the hostfile"),
    ("Permission denied", "the host refused ssh's keys: the launcher runs ssh in batch mode "
     "(no password prompt), so key-based login must work (ssh-copy-id)"),
    ("Host key verification failed", "ssh does not know the host's key, or it changed: connect "
     "once by hand to add it to known_hosts"),
)


def ssh_failure_advice(procs):
    """': <ssh's complaint>: <what to do>' from the last lines of processes whose ssh failed
    before the command ran, or ''."""
    for p in procs:
        for line in reversed(p.lines):
            advice = next((what for key, what in SSH_FAILURES if key in line), None)
            if advice is not None:
                return f": {line}: {advice}"
            if line.startswith("ssh:"):
                return f": {line}"
    return ""


class Proc:
    """A running spec: the local process (wrapper, or ssh to the remote wrapper)."""

    def __init__(self, spec, popen):
        self.spec = spec
        self.popen = popen
        self.lines = collections.deque(maxlen=LAST_LINES)
        self.child_pgid = None  # the command's process group (on its host)
        self.watch_pgid = None  # the watcher's
        self.port = None  # scheduler: the port from its listening line
        self.returncode = None
        self.exit_time = None
        self.eof = False
        self.lines_seen = 0  # output lines the launcher took from this process so far
        self.started = time.monotonic()  # when its wrapper (or ssh) was started
        self.stop_requested = False
        self.saw_job_end = False  # the scheduler logged that every worker finished
        self.orphan_stopped = False  # its wrapper was killed while the command ran (poll)

    def starting_remotely(self):
        """Started over ssh, running, and its command not yet started: no pid marker yet."""
        return self.spec.host is not None and self.returncode is None and self.child_pgid is None

    def read_output(self, events):
        got_pid = got_watch = False
        stream = self.popen.stdout
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not got_pid:
                m = MARKER_PID_RE.match(line)
                if m:
                    self.child_pgid = int(m.group(1))
                    got_pid = True
                    continue
            if not got_watch:
                m = MARKER_WATCH_RE.match(line)
                if m:
                    self.watch_pgid = int(m.group(1))
                    got_watch = True
                    continue
            events.put((self, line))
        stream.close()
        events.put((self, None))

    def poll(self):
        if self.returncode is None:
            rc = self.popen.poll()
            if rc is not None:
                self.returncode = rc
                self.exit_time = time.monotonic()
                self.stop_orphan()
        return self.returncode

    def stop_orphan(self):
        """A local wrapper killed by a signal (a `kill` of the wrong pid) leaves its command
        running in its own session, out of the launcher's sight: it cannot tell when the
        command ends, so it stops it, and the status says so (status_text)."""
        if (self.spec.host is not None or self.returncode >= 0 or not self.child_pgid
                or self.stop_requested):
            return
        # The command itself, not a grandchild left in its group or a zombie.
        if process_state(self.child_pgid) in (None, "Z", "X"):
            return  # the command is gone too: a plain death
        self.orphan_stopped = True
        self.request_stop()  # its watcher, whose stdin this closes, escalates to KILL

    def exit_status(self):
        rc = self.returncode
        if rc is None:
            return None
        return 128 - rc if rc < 0 else rc

    def kill_hint(self, sig):
        """Who sends a SIGKILL that the launcher did not: the kernel, when memory runs out."""
        if sig != signal.SIGKILL or self.stop_requested:
            return ""
        return (": by a user or a tool, or by the kernel's OOM killer when the host or the "
                "process's cgroup ran out of memory (see dmesg)")

    def status_text(self):
        rc = self.returncode
        if rc is None:
            return "running"
        if self.orphan_stopped:
            return (f"{128 - rc} (its launcher wrapper, not the command, was killed by "
                    f"{signal.Signals(-rc).name}; the command, process group "
                    f"{self.child_pgid}, still ran: the launcher stops it)")
        if rc < 0:
            return f"{128 - rc} (killed by {signal.Signals(-rc).name}{self.kill_hint(-rc)})"
        if rc > 128 and rc - 128 < signal.NSIG:
            try:
                return f"{rc} (killed by {signal.Signals(rc - 128).name}{self.kill_hint(rc - 128)})"
            except ValueError:
                pass
        if rc == 255 and self.spec.host is not None:
            return "255 (ssh failed, or the command exited 255)"
        return str(rc)

    def request_stop(self):
        """Closing the wrapper's stdin makes its watcher TERM the command's group (then KILL
        5 s later); for a local process the launcher also signals the group directly."""
        self.stop_requested = True
        try:
            self.popen.stdin.close()
        except OSError:
            pass
        if self.spec.host is None and self.child_pgid:
            kill_group(self.child_pgid, signal.SIGTERM)
            kill_group(self.child_pgid, signal.SIGCONT)  # a stopped process handles TERM now

    def kill(self, launch):
        """Escalation. Returns helper processes (remote kills) to wait for."""
        helpers = []
        if self.spec.host is None:
            for pgid in (self.child_pgid, self.watch_pgid):
                if pgid:
                    kill_group(pgid, signal.SIGKILL)
        else:
            groups = " ".join(f"-{g}" for g in (self.child_pgid, self.watch_pgid) if g)
            if groups:
                argv = launch.ssh_base(self.spec.host) + [
                    self.spec.host.target, f"kill -s KILL -- {groups} 2>/dev/null; true"]
                helpers.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL,
                                                start_new_session=True))
        kill_group(self.popen.pid, signal.SIGKILL)
        return helpers


def main(argv=None):
    try:
        sys.stdout.reconfigure(errors="replace")
        sys.stderr.reconfigure(errors="replace")
    except AttributeError:
        pass
    try:
        c = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    try:
        return Launch(c).run()
    except UsageError as e:  # found before any process starts (the scheduler's address)
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
