"""Jobs over bad but working network paths of a test bed (tools/testbed.py).

One bed of 3 hosts (1 Gbit/s links) for the class; the launcher runs on host h0. Each test
changes one host's link and restores it:
- h2 at 200 kbit/s with PS_HEARTBEAT_TIMEOUT=3: the job's pushes hold the heartbeats in the
  link's queue past the timeout. The job ends, and the message names the path (nothing sent was
  acknowledged, packets resent), never a stopped or hung scheduler;
- h1 1.5 s from every other host each way (a 3 s round trip): registration takes several round
  trips and ZeroMQ's handshake more than 5 s; the job registers and runs exact; at a 2 s
  round trip with PS_HEARTBEAT_TIMEOUT=5 it cannot, and h1's nodes say what to set;
- h2 at 1 Mbit/s: a dist_sync wait's note names the worker's own bytes still on their way to
  the servers; the job runs exact;
- jumbo frames everywhere but h2's switch port (an MTU black hole): ssh to h2 connects and
  stalls; the launcher says so, and names h2's processes when the scheduler gives up on them.
Needs root and `ip netns` (ctest label `multihost`; exits 77, "skipped", otherwise).
"""
import os
import re
import subprocess
import unittest

from bed_testlib import BedJobTest, binary, main, missing_binaries, testbed

KV = missing_binaries("ps-kvstore-check")


class BedPaths(BedJobTest):
    HOSTS = 3

    @unittest.skipIf(KV, KV)
    def test_link_too_slow_for_the_timeout_is_named(self):
        """h2's link at 200 kbit/s: its queue holds the job's pushes for longer than
        PS_HEARTBEAT_TIMEOUT (3 s), with the heartbeats behind them. The job cannot go on,
        and the message says the path, not a stopped or hung scheduler, is what failed."""
        heartbeat_timeout = 3
        self.addCleanup(self.bed.tool, "shape", self.bed.id, "h2", "--rate", "1gbit",
                        check=False)
        self.bed.tool("shape", self.bed.id, "h2", "--rate", "200kbit")
        r = self.run_launcher(["-n", "3", "-s", "3"] + self.bed_args()
                              + ["--env", f"PS_HEARTBEAT_TIMEOUT={heartbeat_timeout}",
                                 binary("ps-kvstore-check"), "--rounds", "3", "--big-size",
                                 "50000"], env=self.real_env(), timeout=120)
        self.bed.tool("shape", self.bed.id, "h2", "--rate", "1gbit")
        self.assertNotEqual(r.rc, 0, r)
        out = r.out + r.err
        # said by a node on h2 of the scheduler, or by the scheduler of a node on h2
        self.assertIn("was acknowledged: its host is down, or the network between them is cut, "
                      "drops the packets, or holds them in a queue for longer than "
                      "PS_HEARTBEAT_TIMEOUT", out)
        self.assertNotIn("stopped (e.g. by SIGSTOP)", out)
        self.assertRegex(r.err, rf"\[launch\] .*{re.escape(self.bed.addr('h2'))}")
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_three_second_round_trip_registers_and_runs(self):
        """h1 1.5 s away from every other host each way (a 3 s round trip): registration takes
        several round trips, ZeroMQ's handshake must get more than the 5 s it used to, and the
        scheduler's connection back to h1's nodes opens seconds after they registered (their
        silence counts from then); the job runs exact. The wait says the path is slow, never
        that the secret may be wrong."""
        if testbed.delay_method() is None:
            self.skipTest("no link delay here (neither tc netem nor an NFQUEUE delay line)")
        self.addCleanup(self.bed.tool, "shape", self.bed.id, "h1", "--rate", "1gbit",
                        "--delay", "0", check=False)
        self.bed.tool("shape", self.bed.id, "h1", "--rate", "1gbit", "--delay", "1500ms")
        hosts = self.bed.write_hostfile(os.path.join(self.tmp, "two"), ["h0", "h1"])
        r = self.run_launcher(["-n", "2", "-s", "2"] + self.bed_args(hosts)
                              + ["--env", "PS_REGISTER_TIMEOUT=120",
                                 binary("ps-kvstore-check"), "--rounds", "2", "--keys", "2",
                                 "--size", "1000"], env=self.real_env(), timeout=200)
        self.bed.tool("shape", self.bed.id, "h1", "--rate", "1gbit", "--delay", "0")
        self.assertEqual(r.rc, 0, r)
        oks = self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+\b")
        self.assertEqual(sorted(oks), [0, 1], r)
        # the nodes on h1 wait several seconds, and say why: the round trip, not the secret
        self.assertRegex(r.out + r.err, r"\[(server|worker) 1\] .*waiting for the scheduler at "
                         r"[0-9.:]+: the port accepts connections, but a round trip to it "
                         r"takes about 3(\.\d)? s: .* ZeroMQ's handshake gets 20 s "
                         r"\(PS_HEARTBEAT_TIMEOUT, within 5 to 30 s\), enough for three")
        self.assertNotIn("PS_JOB_SECRET", r.out + r.err)
        self.assert_nothing_left_here()
        # a 2 s round trip with PS_HEARTBEAT_TIMEOUT=5: the handshake gets 5 s, too short for
        # three round trips; the job cannot start, and the nodes on h1 say what to set
        self.bed.tool("shape", self.bed.id, "h1", "--rate", "1gbit", "--delay", "1s")
        r = self.run_launcher(["-n", "2", "-s", "2"] + self.bed_args(hosts)
                              + ["--env", "PS_REGISTER_TIMEOUT=40", "--env",
                                 "PS_HEARTBEAT_TIMEOUT=5", binary("ps-kvstore-check"),
                                 "--rounds", "1"], env=self.real_env(), timeout=200)
        self.bed.tool("shape", self.bed.id, "h1", "--rate", "1gbit", "--delay", "0")
        self.assertNotEqual(r.rc, 0, r)
        self.assertRegex(r.out + r.err, r"\[(server|worker) 1\] .*ZeroMQ's handshake gets 5 s "
                         r"\(PS_HEARTBEAT_TIMEOUT, within 5 to 30 s\), less than the three it "
                         r"needs, so this node cannot register: start every node of the job "
                         r"with PS_HEARTBEAT_TIMEOUT of at least [67]\b")
        self.assert_nothing_left_here()

    @unittest.skipIf(KV, KV)
    def test_wait_behind_a_slow_link_names_the_bytes_on_their_way(self):
        """h2 at 1 Mbit/s: pushes to and from h2 take seconds to arrive, and a worker's
        long-wait note (after half of PS_STALL_TIMEOUT) says its own bytes are still on their
        way, not only that a worker may still be computing. Exact."""
        self.addCleanup(self.bed.tool, "shape", self.bed.id, "h2", "--rate", "1gbit",
                        check=False)
        self.bed.tool("shape", self.bed.id, "h2", "--rate", "1mbit")
        r = self.run_launcher(["-n", "3", "-s", "3"] + self.bed_args()
                              + ["--env", "PS_STALL_TIMEOUT=6", binary("ps-kvstore-check"),
                                 "--rounds", "1", "--big-size", "200000"],
                              env=self.real_env(), timeout=150)
        self.bed.tool("shape", self.bed.id, "h2", "--rate", "1gbit")
        self.assertEqual(r.rc, 0, r)
        oks = self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+\b")
        self.assertEqual(sorted(oks), [0, 1, 2], r)
        # which worker waits with bytes still on their way, and to which servers, is timing
        self.assertRegex(r.out + r.err, r"\[worker \d\] .*WaitAll has waited .*; \d+ KiB of "
                         r"this worker's own messages are still on their way to server\(s\) "
                         r"[\d, ]+ \(in its TCP send buffers")
        self.assert_nothing_left_here()

    def set_mtu(self, mtu_of_h2_port, mtu_elsewhere):
        """Every host's interface and switch port at `mtu_elsewhere`, h2's switch port at
        `mtu_of_h2_port` (a bridge drops a frame too big for its outgoing port, silently)."""
        for h in self.bed.hosts:
            subprocess.run(["ip", "-n", h["ns"], "link", "set", h["if_host"], "mtu",
                            str(mtu_elsewhere)], check=True)
            port_mtu = mtu_of_h2_port if h["name"] == "h2" else mtu_elsewhere
            subprocess.run(["ip", "-n", self.bed.switch_ns, "link", "set", h["if_switch"],
                            "mtu", str(port_mtu)], check=True)

    @unittest.skipIf(KV, KV)
    def test_ssh_that_never_starts_its_command_is_named(self):
        """Jumbo frames everywhere but h2's switch port: ssh to h2 connects (small packets
        pass) and its key exchange stalls. The launcher says so while it waits, and names
        h2's processes as the cause when the scheduler gives up on them; it never blames the
        healthy hosts."""
        self.addCleanup(self.set_mtu, 1500, 1500)
        self.set_mtu(1500, 9000)
        r = self.run_launcher(["-n", "3", "-s", "3"] + self.bed_args()
                              + ["--env", "PS_REGISTER_TIMEOUT=40", binary("ps-kvstore-check"),
                                 "--rounds", "1"], env=self.real_env(), timeout=120)
        self.set_mtu(1500, 1500)
        self.assertNotEqual(r.rc, 0, r)
        h2 = re.escape(self.bed.addr("h2"))
        self.assertRegex(r.err, rf"\[launch\] (server|worker) 2, (server|worker) 2 on {h2}: ssh "
                                r"has not started the command in \d+ s; still waiting")
        self.assertRegex(r.err, rf"\[launch\] (server|worker) 2, (server|worker) 2 on {h2}: ssh "
                                r"has not started the command in \d+ s, so they never joined "
                                r"the job: the connection opened but the session stalls")
        self.assertIn("exited with status 1, after the loss named above", r.err)
        self.assert_nothing_left_here()


if __name__ == "__main__":
    main()
