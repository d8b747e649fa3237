"""launch.py over ssh onto the hosts of a test bed (tools/testbed.py), with the real binaries.

One bed of 4 hosts (1 Gbit/s links) for the class. The launcher runs on host h0 (the bed's
hosts are reachable only from inside the bed); servers and workers run on the hosts through
each host's sshd, each advertising its own 198.18.x address.
- ps-kvstore-check, 4 workers and 4 servers, servers beside workers: exact results, every
  node registered from its own host, every host's link carried traffic;
- the BytePS layout (--server-hostfile): workers on h0 h1, servers on h2 h3, exact results;
  with h3 at server_weight=0.25, h3's link carries a quarter of h2's;
- a host whose processes are killed: the job ends with an error naming that host, well within
  the heartbeat timeout; a host whose link is cut: the heartbeat timeout finds it, and the
  launcher names it; a worker's host and a server's host that cannot reach each other (a
  firewall between them): the job ends naming both;
- PS_ENCRYPT=1: a capture of every packet through the bed's switch holds none of the pushed
  gradient's bytes (and does in clear).
Needs root and `ip netns` (ctest label `multihost`; exits 77, "skipped", otherwise).
"""
import os
import re
import subprocess
import sys
import time
import unittest

from bed_testlib import BedJobTest, binary, main, missing_binaries, wait_for
from test_encryption_capture import CAPTURE, CAPTURE_LIMIT, PLAIN_GRADIENT

KV = missing_binaries("ps-kvstore-check")


class BedJobs(BedJobTest):

    def assert_kvstore_ok(self, r, workers, rounds):
        self.assertEqual(r.rc, 0, r)
        oks = self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+\b")
        self.assertEqual(sorted(oks), list(range(workers)), r)
        for lines in oks.values():
            for line in lines:
                self.assertIn(f"workers={workers}", line)
                self.assertIn(f"rounds={rounds}", line)

    def byteps_layout(self):
        """launch.py arguments for 2 workers on h0 h1 and 2 servers on h2 h3."""
        workers = self.bed.write_hostfile(os.path.join(self.tmp, "workers"), ["h0", "h1"])
        servers = self.bed.write_hostfile(os.path.join(self.tmp, "servers"), ["h2", "h3"])
        return ["-n", "2", "--server-hostfile", servers] + self.bed_args(workers)

    @unittest.skipIf(KV, KV)
    def test_kvstore_check_4_workers_4_servers(self):
        before = self.bed.port_counters()
        r = self.run_launcher(["-n", "4", "-s", "4"] + self.bed_args()
                              + ["--env", "PS_VERBOSE=1",
                                 binary("ps-kvstore-check"), "--rounds", "20", "--size", "20000"],
                              env=self.real_env(), timeout=90)
        self.assert_kvstore_ok(r, 4, 20)
        addr = {f"h{i}": self.bed.addr(f"h{i}") for i in range(4)}
        self.assertIn(f"ps-scheduler: listening on {addr['h0']}:", r.out)
        # servers beside workers: server i and worker i on host i, each registered with its
        # own host's address
        want = {(role, i): addr[f"h{i}"] for role in ("server", "worker") for i in range(4)}
        self.assertEqual(self.registrations(r.out), want, r)
        # and the bytes went over the bed's links: every port of the switch saw traffic both
        # ways (4 workers x 20 rounds x 4 keys x 20000 floats, pushed and pulled)
        after = self.bed.port_counters()
        for name in addr:
            rx = after[name][0] - before[name][0]
            tx = after[name][1] - before[name][1]
            self.assertGreater(rx, 1_000_000, (name, rx, tx))
            self.assertGreater(tx, 1_000_000, (name, rx, tx))
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_encrypted_job_puts_no_tensor_bytes_on_the_links(self):
        """PS_ENCRYPT=1 across hosts: a capture of every packet through the bed's switch holds
        none of the pushed gradient's bytes; in clear it does (so the capture sees payload)."""
        captured = {}
        for encrypt in ("0", "1"):
            path = os.path.join(self.tmp, f"switch-capture-{encrypt}.bin")
            capture = subprocess.Popen(
                ["ip", "netns", "exec", self.bed.switch_ns, sys.executable, "-c", CAPTURE, path,
                 str(CAPTURE_LIMIT), ""], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
            try:
                self.assertEqual(capture.stdout.readline().strip(), "capturing")
                r = self.run_launcher(["-n", "2", "-s", "2"] + self.bed_args()
                                      + [binary("ps-kvstore-check"), "--keys", "2",
                                         "--size", "1000", "--rounds", "5"],
                                      env=self.real_env(PS_ENCRYPT=encrypt), timeout=90)
                self.assert_kvstore_ok(r, 2, 5)
            finally:
                capture.stdin.close()
                capture.wait(timeout=30)
                capture.stdout.close()
            with open(path, "rb") as f:
                captured[encrypt] = f.read()
        self.assertIn(PLAIN_GRADIENT, captured["0"], "the capture does not see the payload")
        self.assertGreater(len(captured["1"]), 1000 * 4 * 5, "the capture saw no traffic")
        self.assertNotIn(PLAIN_GRADIENT, captured["1"])
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_servers_on_hosts_of_their_own(self):
        before = self.bed.port_counters()
        r = self.run_launcher(self.byteps_layout()
                              + ["--env", "PS_VERBOSE=1",
                                 binary("ps-kvstore-check"), "--rounds", "20", "--size", "20000"],
                              env=self.real_env(), timeout=90)
        self.assert_kvstore_ok(r, 2, 20)
        self.assertIn("all 2 server(s) and 2 worker(s) registered", r.out)  # -s = the slots
        a = self.bed.addr
        self.assertEqual(self.registrations(r.out),
                         {("server", 0): a("h2"), ("server", 1): a("h3"),
                          ("worker", 0): a("h0"), ("worker", 1): a("h1")}, r)
        # the servers' hosts carried the pushes (in) and the pulls (out)
        after = self.bed.port_counters()
        moved = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after}
        payload = 20 * 4 * 20000 * 4  # rounds x keys x floats x bytes, per worker and way
        for n in ("h2", "h3"):
            self.assertGreater(min(moved[n]), 0.5 * payload, moved)
        self.assert_nothing_left_here()

    def start_paused_job(self, extra_env=()):
        """4 servers and 4 workers of ps-kvstore-check, paused mid-job (each host has server i
        and worker i); returns the launcher process once every worker paused."""
        env = []
        for e in extra_env:
            env += ["--env", e]
        proc = self.start_launcher(["-n", "4", "-s", "4"] + self.bed_args() + env
                                   + [binary("ps-kvstore-check"), "--rounds", "1000",
                                      "--pause-at-round", "3"],
                                   env=self.real_env())
        wait_for(lambda: proc.poll() is not None or
                 self.launcher_output(proc).out.count("kvstore-check: paused at round") >= 4,
                 60, "4 workers to pause")
        self.assertIsNone(proc.poll(), self.launcher_output(proc))
        return proc

    @unittest.skipIf(KV, KV)
    def test_server_weight_sets_each_servers_share(self):
        """A hostfile's server_weight reaches every process as PS_SERVER_WEIGHTS over ssh, and
        the servers' links carry their shares: h3's server at 0.25 holds 2 of every key's 10
        pieces, h2's 8."""
        workers = self.bed.write_hostfile(os.path.join(self.tmp, "workers"), ["h0", "h1"])
        servers = os.path.join(self.tmp, "weighted-servers")
        with open(servers, "w") as f:
            f.write(f"{self.bed.addr('h2')}\n{self.bed.addr('h3')} server_weight=0.25\n")
        before = self.bed.port_counters()
        r = self.run_launcher(["-n", "2", "--server-hostfile", servers]
                              + self.bed_args(workers)
                              + ["--env", "MXNET_KVSTORE_BIGARRAY_BOUND=1000",  # all sliced
                                 # no copies between the two servers: each link carries its
                                 # server's share alone
                                 "--env", "PS_REPLICATION=0",
                                 binary("ps-kvstore-check"), "--rounds", "20", "--size", "20000"],
                              env=self.real_env(), timeout=90)
        self.assert_kvstore_ok(r, 2, 20)
        after = self.bed.port_counters()
        moved = {n: sum(after[n]) - sum(before[n]) for n in ("h2", "h3")}
        self.assertGreater(moved["h3"], 0.15 * moved["h2"], moved)
        self.assertLess(moved["h3"], 0.35 * moved["h2"], moved)
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_host_whose_processes_are_killed_is_named(self):
        heartbeat_timeout = 10
        proc = self.start_paused_job([f"PS_HEARTBEAT_TIMEOUT={heartbeat_timeout}"])
        h3 = self.bed.addr("h3")
        t0 = time.monotonic()
        self.bed.tool("kill", self.bed.id, "h3")  # everything on h3 but its sshd
        named = (f"[launch] lost host {h3}: the ssh connections of all its processes "
                 "(server 3, worker 3)")
        wait_for(lambda: named in self.launcher_output(proc).err or proc.poll() is not None,
                 heartbeat_timeout + 15, "the launcher to name h3")
        elapsed = time.monotonic() - t0
        r = self.finish_launcher(proc, timeout=60)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn(named, r.err)
        self.assertRegex(r.err, rf"\[launch\] (worker|server) 3 on {re.escape(h3)} exited")
        # named within the heartbeat timeout (the launcher saw the connections end)
        self.assertLess(elapsed, heartbeat_timeout, r)
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_host_cut_off_is_found_by_the_heartbeat(self):
        heartbeat_timeout = 6
        proc = self.start_paused_job([f"PS_HEARTBEAT_TIMEOUT={heartbeat_timeout}"])
        h2 = self.bed.addr("h2")
        self.addCleanup(self.bed.tool, "link", self.bed.id, "h2", "up", check=False)
        t0 = time.monotonic()
        self.bed.tool("link", self.bed.id, "h2", "down")  # a cut cable: nothing exits there
        pattern = re.compile(rf"\[launch\] (server|worker) 2 at {re.escape(h2)} was declared "
                             r"dead by the scheduler, but its process has not exited as far as "
                             rf"the launcher sees: {re.escape(h2)} or the network to it is down")
        # named within the heartbeat timeout plus its check interval (2 s) and some slack
        wait_for(lambda: pattern.search(self.launcher_output(proc).err) or
                 proc.poll() is not None, heartbeat_timeout + 15, "the launcher to name h2")
        named_after = time.monotonic() - t0
        r = self.finish_launcher(proc, timeout=60)
        self.assertRegex(r.err, pattern)
        self.assertNotEqual(r.rc, 0, r)
        self.assertLess(named_after, heartbeat_timeout + 8, r)
        # the scheduler's probe of the quiet node went unacknowledged: not a stopped process
        # its processes there could not be killed either: said, not claimed done
        self.assertRegex(r.err, rf"\[launch\] could not reach {re.escape(h2)} to kill "
                                r"(server|worker) 2, (server|worker) 2 \(ssh failed or timed "
                                r"out\): they may still run there")
        self.assertRegex(r.out + r.err,
                         r"(server|worker) 2 \(node \d+ at [0-9.:]+\) is dead: no heartbeat for "
                         r"over 6 s \(PS_HEARTBEAT_TIMEOUT\), and nothing the scheduler sent it "
                         r"for [0-9.]+ s was acknowledged: its host is down, or the network")
        # the processes on h2 never learnt of it (their ssh sessions are cut off): end them as
        # the operator would, then nothing of the job is left anywhere
        self.bed.tool("link", self.bed.id, "h2", "up")
        self.bed.tool("kill", self.bed.id, "h2")
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_hosts_that_cannot_reach_each_other_are_named(self):
        """A firewall between a worker's host and a server's host, both still reaching the
        scheduler: nobody dies and no connection is reset (the packets just vanish), so only
        TCP's unacknowledged-data limit (the heartbeat timeout) and the scheduler's check that
        the peer lives can end the job; it ends naming both hosts."""
        heartbeat_timeout = 6
        proc = self.start_launcher(self.byteps_layout()
                                   + ["--env", f"PS_HEARTBEAT_TIMEOUT={heartbeat_timeout}",
                                      binary("ps-kvstore-check"), "--rounds", "1000000",
                                      "--report-every", "20"],
                                   env=self.real_env())
        wait_for(lambda: proc.poll() is not None or
                 self.launcher_output(proc).out.count("kvstore-check: round 40") >= 2,
                 60, "both workers to run 40 rounds")
        self.assertIsNone(proc.poll(), self.launcher_output(proc))
        self.addCleanup(self.bed.tool, "block", self.bed.id, "h1", "h3", "off", check=False)
        t0 = time.monotonic()
        self.bed.tool("block", self.bed.id, "h1", "h3", "on")
        r = self.finish_launcher(proc, timeout=90)
        elapsed = time.monotonic() - t0
        self.assertNotEqual(r.rc, 0, r)
        h1, h3 = (re.escape(self.bed.addr(h)) for h in ("h1", "h3"))
        node = r"(?:worker|server) 1 \(node \d+ at (?:{}):\d+\)"
        self.assertRegex(r.out + r.err,
                         rf"{node.format(h1)} cannot reach {node.format(h3)}: its connection "
                         rf"to it closed and has stayed closed for [0-9.]+ s, while .* still "
                         rf"answers the scheduler: the network between {h1} and {h3} drops "
                         r"their traffic|"
                         rf"{node.format(h3)} cannot reach {node.format(h1)}: .* the network "
                         rf"between {h3} and {h1} drops their traffic")
        # TCP gives up after the heartbeat timeout, the report follows a timeout later, and the
        # scheduler has the peer's answer and a second report within a heartbeat interval or
        # two (without any of it, TCP retries for about 15 minutes)
        self.assertLess(elapsed, 3 * heartbeat_timeout + 10, r)
        self.bed.tool("block", self.bed.id, "h1", "h3", "off")
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_hosts_blocked_from_the_start_are_named(self):
        """The firewall is there before the job starts: every node registers (all reach h0),
        but worker 1 never connects to server 1; the job ends naming both, not waiting for
        ever on the first request (a first connection gets at least 10 s)."""
        heartbeat_timeout = 6
        self.addCleanup(self.bed.tool, "block", self.bed.id, "h1", "h3", "off", check=False)
        self.bed.tool("block", self.bed.id, "h1", "h3", "on")
        t0 = time.monotonic()
        r = self.run_launcher(self.byteps_layout()
                              + ["--env", f"PS_HEARTBEAT_TIMEOUT={heartbeat_timeout}",
                                 binary("ps-kvstore-check"), "--rounds", "5"],
                              env=self.real_env(), timeout=90)
        elapsed = time.monotonic() - t0
        self.assertNotEqual(r.rc, 0, r)
        self.assertRegex(r.out + r.err,
                         r"(worker|server) 1 \(node \d+ at [0-9.:]+\) cannot reach "
                         r"(server|worker) 1 \(node \d+ at [0-9.:]+\): its connection to it "
                         r"has not opened in [0-9.]+ s, while .* still answers the scheduler: "
                         r"the network between [0-9.]+ and [0-9.]+ does not let them connect")
        self.assertLess(elapsed, 3 * heartbeat_timeout + 20, r)
        self.bed.tool("block", self.bed.id, "h1", "h3", "off")
        self.assert_nothing_left_here()


if __name__ == "__main__":
    main()
