"""Helpers shared by the launcher tests: stand-in binaries, an sshd on loopback, process checks.

Every wait here is bounded in count and time; all traffic stays on 127.0.0.0/8.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LAUNCH = os.path.join(REPO, "tools", "launch.py")
FAKE = os.path.join(HERE, "fake_node.py")
PY = sys.executable
SSHD = "/usr/sbin/sshd"


# --------------------------------------------------------------------------------------------
# processes


def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_alive(pid, start=None):
    """True when `pid` runs and is not a zombie (and, given `start`, is that same process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] in ("Z", "X"):
        return False
    return start is None or int(fields[19]) == start


def pids_with_marker(marker, environ=False):
    """Pids of live processes whose command line (or, with environ, environment) has marker."""
    found = []
    me = os.getpid()
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/{'environ' if environ else 'cmdline'}", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if needle in data and is_alive(int(name)):
            found.append(int(name))
    return found


def describe(pids):
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            cmd = "?"
        lines.append(f"  pid {pid}: {cmd}")
    return "\n".join(lines)


def wait_until(pred, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def can_connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Result:
    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self):
        return f"rc={self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


# --------------------------------------------------------------------------------------------
# test base


class LauncherTest(unittest.TestCase):
    """Per test: a temp dir, a record dir for the fakes, a unique marker, and a safety net that
    kills whatever a failed test left behind (so one failure does not leak into the next)."""

    maxDiff = None

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="psl-test-")
        self.rec = os.path.join(self.tmp, "rec")
        os.mkdir(self.rec)
        self.marker = "psl-mark-" + uuid.uuid4().hex[:12]
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        for pid in pids_with_marker(self.marker) + pids_with_marker(self.marker, environ=True):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for r in self.records():
            if is_alive(r["pid"], r.get("start")):
                try:
                    os.kill(r["pid"], signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- stand-ins
    def fake_cmd(self, *args):
        """The worker command: the stand-in node, tagged with this test's marker."""
        return [PY, FAKE, "--marker", self.marker] + list(args)

    def fake_bin_dir(self, where=None, args=(), server_args=(), scheduler_args=()):
        """A directory with stand-in ps-scheduler and ps-server scripts (for PS_BIN_DIR)."""
        d = where or os.path.join(self.tmp, "bin")
        os.makedirs(d, exist_ok=True)
        for name, extra in (("ps-scheduler", scheduler_args), ("ps-server", server_args)):
            path = os.path.join(d, name)
            words = shlex.join([PY, FAKE, "--marker", self.marker] + list(args) + list(extra))
            with open(path, "w") as f:
                f.write("#!/bin/sh\n# stand-in written by the launcher tests\n"
                        f'T_SCRIPT="$0"; export T_SCRIPT\nexec {words} "$@"\n')
            os.chmod(path, 0o755)
        return d

    # ---- running the launcher
    def env(self, **extra):
        env = dict(os.environ)
        env.pop("DMLC_PS_ROOT_PORT", None)
        env.pop("DMLC_PS_ROOT_URI", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["FAKE_RECORD_DIR"] = self.rec
        env.update(extra)
        return env

    def launch_argv(self, args):
        return [PY, LAUNCH] + list(args)

    def run_launcher(self, args, timeout=60, env=None, cwd=None):
        """Runs launch.py to its end (bounded by timeout); returns a Result."""
        proc = subprocess.Popen(self.launch_argv(args), env=env or self.env(), cwd=cwd or self.tmp,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            self.fail(f"launcher still running after {timeout} s\n"
                      f"{Result(proc.returncode, out.decode(), err.decode())}")
        return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def start_launcher(self, args, env=None, cwd=None):
        """Starts launch.py in the background (output to files); see finish_launcher."""
        out = open(os.path.join(self.tmp, "launcher.out"), "wb")
        err = open(os.path.join(self.tmp, "launcher.err"), "wb")
        self.addCleanup(out.close)
        self.addCleanup(err.close)
        proc = subprocess.Popen(self.launch_argv(args), env=env or self.env(), cwd=cwd or self.tmp,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)

        def kill_it():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.addCleanup(kill_it)
        return proc

    def finish_launcher(self, proc, timeout=30):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.fail(f"launcher did not exit within {timeout} s\n{self.launcher_output(proc)}")
        return self.launcher_output(proc)

    def launcher_output(self, proc):
        with open(os.path.join(self.tmp, "launcher.out"), "rb") as f:
            out = f.read().decode(errors="replace")
        with open(os.path.join(self.tmp, "launcher.err"), "rb") as f:
            err = f.read().decode(errors="replace")
        return Result(proc.returncode, out, err)

    # ---- what the fakes recorded
    def records(self, role=None):
        recs = []
        try:
            names = sorted(os.listdir(self.rec))
        except OSError:
            return recs
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.rec, name)) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                continue
            if role is None or r["role"] == role:
                recs.append(r)
        return recs

    def wait_records(self, counts, timeout=20):
        """Waits until the fakes recorded at least counts[role] processes of each role."""
        def enough():
            return all(len(self.records(role)) >= n for role, n in counts.items())
        if not wait_until(enough, timeout):
            got = {role: len(self.records(role)) for role in counts}
            self.fail(f"processes did not all start within {timeout} s: want {counts}, got {got}")

    def assert_nothing_left(self, timeout=10, environ_marker=False):
        """No recorded process (fake node or its grandchild) and no process carrying this test's
        marker (wrappers, ssh clients, remote shells) is alive, within `timeout` s."""
        def left():
            pids = {r["pid"] for r in self.records() if is_alive(r["pid"], r.get("start"))}
            pids.update(pids_with_marker(self.marker))
            if environ_marker:
                pids.update(pids_with_marker(self.marker, environ=True))
            return sorted(pids)
        if not wait_until(lambda: not left(), timeout):
            pids = left()
            self.fail(f"{len(pids)} process(es) left behind after {timeout} s:\n{describe(pids)}")

    def assert_prefixed(self, out):
        """Every output line of the job carries a [role rank] prefix."""
        for line in out.splitlines():
            self.assertRegex(line, r"^\[(scheduler|server \d+|worker \d+)\] ", msg=repr(line))

    def worker_lines(self, out, pattern):
        """{worker label index: [lines matching pattern]} from the launcher's stdout."""
        found = {}
        for line in out.splitlines():
            m = re.match(r"^\[worker (\d+)\] (.*)$", line)
            if m and re.search(pattern, m.group(2)):
                found.setdefault(int(m.group(1)), []).append(m.group(2))
        return found


# --------------------------------------------------------------------------------------------
# sshd on loopback


def ssh_missing():
    """Why the ssh tests cannot run here, or None."""
    for path, pkg in ((SSHD, "openssh-server"), ("ssh", "openssh-client"),
                      ("ssh-keygen", "openssh-client"), ("rsync", "rsync")):
        if not (os.path.exists(path) if path.startswith("/") else shutil.which(path)):
            return f"{path} not found: install {pkg} (tools/install-deps.sh installs it)"
    return None


class Sshd:
    """An sshd of the test's own, on 127.0.0.1 and 127.0.0.2 at a free port, with a throwaway
    host key and a throwaway authorized key. Stopped by pid."""

    HOSTS = ("127.0.0.1", "127.0.0.2")

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "sshd")
        os.makedirs(self.dir)
        self.key = os.path.join(self.dir, "user_key")
        self.proc = None
        self.port = None
        self.log = os.path.join(self.dir, "sshd.log")

    def start(self):
        hostkey = os.path.join(self.dir, "host_key")
        for path in (hostkey, self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "psl-test",
                            "-f", path], check=True, stdin=subprocess.DEVNULL)
        auth = os.path.join(self.dir, "authorized_keys")
        shutil.copy(self.key + ".pub", auth)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        last = ""
        for _ in range(3):  # a free port may be taken before sshd binds it: retry
            self.port = free_port()
            cfg = os.path.join(self.dir, "sshd_config")
            with open(cfg, "w") as f:
                f.write(f"Port {self.port}\n"
                        + "".join(f"ListenAddress {h}\n" for h in self.HOSTS)
                        + f"HostKey {hostkey}\n"
                        f"AuthorizedKeysFile {auth}\n"
                        f"PidFile {os.path.join(self.dir, 'sshd.pid')}\n"
                        "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
                        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                        "X11Forwarding no\nAllowTcpForwarding no\nPrintMotd no\n"
                        "LogLevel ERROR\n")  # MaxStartups left at its default, 10:30:100
            log = open(self.log, "ab")
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", cfg], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
            log.close()
            ok = wait_until(lambda: self.proc.poll() is not None or
                            all(can_connect(h, self.port) for h in self.HOSTS), 10)
            if ok and self.proc.poll() is None:
                return
            self.stop()
            with open(self.log, errors="replace") as f:
                last = f.read()[-2000:]
        raise RuntimeError(f"sshd did not start on 127.0.0.1/127.0.0.2; its log:\n{last}")

    def ssh_opts(self):
        return (f"-F /dev/null -i {self.key} -o IdentitiesOnly=yes "
                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
