"""Helpers for the multi-host tests: test beds of tools/testbed.py (network namespaces).

A bed made here lives in a state directory of the test's own (a temp dir), is registered in
LIVE_BEDS the moment its id is known, and is removed by the test's cleanup, by an atexit
handler, and on SIGTERM/SIGHUP/SIGINT of the test process (main() below turns those into an
exit), so no namespace, process or file outlives the test, whether it passes or fails. Every
wait is bounded. Traffic stays in 198.18.0.0/15 inside the bed's namespaces.

The modules that use it run under ctest with label `multihost` and exit with SKIP_CODE (77,
ctest's SKIP_RETURN_CODE) when beds cannot be made here: not root, no `ip netns`, no sshd.
"""
import atexit
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from launcher_testlib import PY, REPO, LauncherTest, wait_until

TESTBED = os.path.join(REPO, "tools", "testbed.py")
BIN = os.environ.get("PS_BIN_DIR") or os.path.join(REPO, "build", "bin")
SKIP_CODE = 77

_spec = importlib.util.spec_from_file_location("testbed", TESTBED)
testbed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testbed)

LIVE_BEDS = {}  # id -> state dir, for the emergency teardown


def _emergency_teardown():
    for bed_id, state_dir in list(LIVE_BEDS.items()):
        subprocess.run([PY, TESTBED, "--state-dir", state_dir, "down", bed_id],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        LIVE_BEDS.pop(bed_id, None)
        shutil.rmtree(state_dir, ignore_errors=True)


atexit.register(_emergency_teardown)

_unavailable = "unchecked"


def bed_unavailable():
    """Why beds cannot be made here (root, ip netns, veth, bridge, tc, sshd), or None."""
    global _unavailable
    if _unavailable == "unchecked":
        why = testbed.why_unavailable(need_tc=True) or testbed.ssh_missing()
        _unavailable = f"multi-host test bed unavailable: {why}" if why else None
    return _unavailable


def missing_binaries(*names):
    for name in names:
        if not os.access(os.path.join(BIN, name), os.X_OK):
            return f"{name} not built in {BIN} (PS_BIN_DIR)"
    return None


def binary(name):
    return os.path.join(BIN, name)


class Bed:
    """One bed: made by `up` in a temp state dir, removed by down()."""

    def __init__(self, hosts=4, args=(), timeout=60):
        self.state_dir = tempfile.mkdtemp(prefix="psbed-test-")
        self.id = None
        try:
            r = subprocess.run([PY, TESTBED, "--state-dir", self.state_dir, "up", "-n",
                                str(hosts), "--json"] + list(args), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            # up was killed half-way: its state file (written first) names the bed
            for name in os.listdir(self.state_dir):
                if testbed.ID_RE.match(name):
                    self.id = name
                    self.down()
            shutil.rmtree(self.state_dir, ignore_errors=True)
            raise
        self.up_stderr = r.stderr
        if r.returncode != 0:
            self.down()
            raise RuntimeError(f"testbed up failed (status {r.returncode}):\n{r.stderr}")
        self.state = json.loads(r.stdout)
        self.id = self.state["id"]
        LIVE_BEDS[self.id] = self.state_dir

    @property
    def hosts(self):
        return self.state["hosts"]

    def host(self, name):
        return next(h for h in self.hosts if h["name"] == name)

    def addr(self, name):
        return self.host(name)["addr"]

    def ns(self, name):
        return self.host(name)["ns"]

    @property
    def switch_ns(self):
        return self.state["switch_ns"]

    @property
    def hostfile(self):
        return self.state["hostfile"]

    def ssh_opts(self):
        return f"-F {self.state['ssh_config']}"

    def write_hostfile(self, path, names, slots=None):
        with open(path, "w") as f:
            for n in names:
                f.write(self.addr(n) + (f" slots={slots}" if slots else "") + "\n")
        return path

    def tool(self, *args, timeout=60, check=True):
        """Runs tools/testbed.py on this bed's state dir; returns the CompletedProcess."""
        r = subprocess.run([PY, TESTBED, "--state-dir", self.state_dir] + list(args),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"testbed {' '.join(args)}: status {r.returncode}\n"
                                 f"{r.stdout}\n{r.stderr}")
        return r

    def exec_argv(self, host, argv):
        return ["ip", "netns", "exec", self.ns(host)] + list(argv)

    def run_on(self, host, argv, timeout=30):
        return subprocess.run(self.exec_argv(host, argv), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def port_counters(self):
        """{host name: (bytes the switch received from it, bytes it sent to it)}."""
        r = subprocess.run(["ip", "-n", self.switch_ns, "-s", "-j", "link", "show"],
                           capture_output=True, text=True, timeout=10, check=True)
        by_if = {e["ifname"]: e["stats64"] for e in json.loads(r.stdout)}
        return {h["name"]: (by_if[h["if_switch"]]["rx"]["bytes"],
                            by_if[h["if_switch"]]["tx"]["bytes"]) for h in self.hosts}

    def down(self):
        """Removes the bed; returns the problems `down` reported (empty when all is gone)."""
        problems = ""
        if self.id is not None:
            r = subprocess.run([PY, TESTBED, "--state-dir", self.state_dir, "down", self.id],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0:
                problems = r.stderr
            LIVE_BEDS.pop(self.id, None)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return problems


def namespaces_of(bed_id):
    return [ns for ns in testbed.netns_list() if ns.startswith(f"{testbed.PREFIX}-{bed_id}-")]


class BedJobTest(LauncherTest):
    """A LauncherTest whose launcher runs inside host h0 of a bed (self.bed, made per class),
    with the real binaries and this test's marker in every process' environment."""

    HOSTS = 4
    BED_ARGS = ("--rate", "1gbit")

    @classmethod
    def setUpClass(cls):
        why = bed_unavailable() or missing_binaries("ps-scheduler", "ps-server")
        if why:
            raise unittest.SkipTest(why)
        cls.bed = Bed(cls.HOSTS, cls.BED_ARGS)

    @classmethod
    def tearDownClass(cls):
        problems = cls.bed.down()
        if problems:
            raise AssertionError(f"testbed down reported problems:\n{problems}")

    def launch_argv(self, args):
        return self.bed.exec_argv("h0", super().launch_argv(args))

    def real_env(self, **extra):
        return self.env(PS_BIN_DIR=BIN, **extra)

    def bed_args(self, hostfile=None):
        return ["-H", hostfile or self.bed.hostfile, "--ssh-opts", self.bed.ssh_opts(),
                "--env", f"PSL_TEST_MARK={self.marker}"]

    def assert_nothing_left_here(self):
        self.assert_nothing_left(timeout=15, environ_marker=True)

    def registrations(self, out):
        """{(role, launch index): advertised address} from PS_VERBOSE=1 output."""
        found = {}
        for line in out.splitlines():
            m = re.match(r"^\[(server|worker) (\d+)\] .*registered as \1 \d+ \(node \d+ at "
                         r"([0-9.]+):\d+\)", line)
            if m:
                found[(m.group(1), int(m.group(2)))] = m.group(3)
        return found


def main():
    """Runs the calling module's tests; exits SKIP_CODE when no bed can be made here."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)  # unwinds: cleanups, then atexit's teardown
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, stop)
    why = bed_unavailable()
    if why:
        print(f"SKIP: {why}", flush=True)
        sys.exit(SKIP_CODE)
    try:
        unittest.main(module="__main__", verbosity=2)
    finally:
        _emergency_teardown()


def wait_for(pred, timeout, what):
    if not wait_until(pred, timeout, interval=0.1):
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def elapsed_since(t0):
    return time.monotonic() - t0
