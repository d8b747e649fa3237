"""tools/launch.py end to end, with the real ps-scheduler and ps-server from PS_BIN_DIR.

- ps-kvstore-check --rounds 20: a dist_sync KVStore job that exits 0 only when the values are
  exact and prints `kvstore-check: ok rank=R`; run by the local and by the ssh launcher.
- ps-test-node (the runtime's own test worker): barriers, and --block for the signal tests.
A test is skipped, saying which binary is missing, only when that binary is not built.
"""
import os
import re
import shutil
import signal
import time
import tempfile
import unittest

from launcher_testlib import (REPO, LauncherTest, Sshd, pids_with_marker, ssh_missing,
                              wait_until)

BIN = os.environ.get("PS_BIN_DIR") or os.path.join(REPO, "build", "bin")


def missing(*names):
    for name in names:
        if not os.access(os.path.join(BIN, name), os.X_OK):
            return f"{name} not built in {BIN} (PS_BIN_DIR)"
    return None


def binary(name):
    return os.path.join(BIN, name)


class RealBinaries:
    """Mixin: launcher runs with the real binaries and a marker in every process' environment."""

    def real_env(self):
        return self.env(PS_BIN_DIR=BIN)

    def marked(self):
        return ["--env", f"PSL_TEST_MARK={self.marker}"]

    def assert_kvstore_ok(self, r, workers):
        self.assertEqual(r.rc, 0, r)
        oks = self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+\b")
        self.assertEqual(sorted(oks), list(range(workers)), r)  # every worker printed it
        lines = [line for found in oks.values() for line in found]
        ranks = sorted(int(re.search(r"\brank=(\d+)", line).group(1)) for line in lines)
        self.assertEqual(ranks, list(range(workers)), r)  # ... each with its own rank
        for line in lines:  # the extra fields, when printed, agree with the job
            for key, want in (("workers", workers), ("rounds", 20)):
                m = re.search(rf"\b{key}=(\d+)", line)
                if m:
                    self.assertEqual(int(m.group(1)), want, line)

    def server_pids(self):
        """The pids of this test's ps-server processes."""
        return [pid for pid in pids_with_marker(self.marker, environ=True)
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "ps-server"]

    def assert_nothing_left_here(self):
        self.assert_nothing_left(timeout=10, environ_marker=True)

    def run_losing_a_server(self, launcher_args, rounds, victim, sig):
        """A ps-kvstore-check job of 2 workers and 3 servers, of which server_pids()[victim]
        gets signal `sig` after round 100. Returns the launcher's result once checked:
        exit 0, every worker exact."""
        proc = self.start_launcher(["-n", "2", "-s", "3"] + launcher_args + self.marked()
                                   + [binary("ps-kvstore-check"), "--rounds", str(rounds),
                                      "--report_every", "100"], env=self.real_env())
        self.wait_for_output(proc, "kvstore-check: round 100", 2)
        servers = self.server_pids()
        self.assertEqual(len(servers), 3, servers)
        os.kill(servers[victim], sig)
        r = self.finish_launcher(proc, timeout=120)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+")), [0, 1],
                         r)
        return r

    def wait_for_output(self, proc, text, count, timeout=30):
        ok = wait_until(lambda: proc.poll() is not None or
                        self.launcher_output(proc).out.count(text) >= count, timeout)
        self.assertTrue(ok and proc.poll() is None,
                        f"job not running as expected\n{self.launcher_output(proc)}")


class LocalEndToEnd(RealBinaries, LauncherTest):

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_kvstore_job_exact_result(self):
        r = self.run_launcher(["-n", "3", "-s", "2"] + self.marked()
                              + [binary("ps-kvstore-check"), "--rounds", "20"],
                              env=self.real_env(), timeout=60)
        self.assert_kvstore_ok(r, 3)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-kvstore-check"), missing("ps-kvstore-check"))
    def test_kvstore_job_same_program_for_every_role(self):
        # MXNet style: KVStore::Create runs the scheduler and server roles in the user's
        # program, and those set up logging themselves (no glog "before InitGoogleLogging").
        r = self.run_launcher(["-n", "2", "-s", "2", "--same-cmd-for-all-roles"] + self.marked()
                              + [binary("ps-kvstore-check"), "--rounds", "20"],
                              env=self.real_env(), timeout=60)
        self.assert_kvstore_ok(r, 2)
        self.assertIn("all 2 server(s) and 2 worker(s) registered", r.err + r.out, r)
        self.assertNotIn("before InitGoogleLogging", r.err + r.out, r)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_a_stopped_launcher_does_not_end_the_job(self):
        # Every message logged (PS_VERBOSE=2) and the launcher stopped (Ctrl-Z, SIGSTOP) for
        # three heartbeat timeouts: nobody reads the nodes' output, whose pipes fill. Their log
        # lines wait or are dropped, but no node stops its heartbeats for them
        # (ps/src/stderr_log.h).
        proc = self.start_launcher(["-n", "2", "-s", "2", "--env", "PS_VERBOSE=2",
                                    "--env", "PS_HEARTBEAT_INTERVAL=0.5",
                                    "--env", "PS_HEARTBEAT_TIMEOUT=2"] + self.marked()
                                   + [binary("ps-kvstore-check"), "--rounds", "5000",
                                      "--report_every", "100"], env=self.real_env())
        self.wait_for_output(proc, "kvstore-check: round 100", 2)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(6)  # the stop itself: three PS_HEARTBEAT_TIMEOUTs, not a wait for
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        r = self.finish_launcher(proc, timeout=120)
        self.assertNotIn(" is dead: ", r.out + r.err, r)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+")), [0, 1],
                         r)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-test-node"),
                     missing("ps-scheduler", "ps-server", "ps-test-node"))
    def test_runtime_barriers(self):
        r = self.run_launcher(["-n", "3", "-s", "2"] + self.marked()
                              + [binary("ps-test-node"), "--barriers", "5"],
                              env=self.real_env(), timeout=60)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(self.worker_lines(r.out, "5 barriers done")), [0, 1, 2], r)
        self.assertIn("ps-scheduler: listening on 127.0.0.1:", r.out)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server"), missing("ps-scheduler", "ps-server"))
    def test_failing_worker_stops_real_scheduler_and_servers(self):
        r = self.run_launcher(["-n", "2", "-s", "2"] + self.marked()
                              + ["sh", "-c", "echo worker giving up; exit 3"],
                              env=self.real_env(), timeout=60)
        self.assertEqual(r.rc, 3, r)
        self.assertIn("exited with status 3; last lines:", r.err)
        self.assertIn("worker giving up", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-test-exit-worker"),
                     missing("ps-scheduler", "ps-server", "ps-test-exit-worker"))
    def test_worker_exiting_without_destroying_its_store_is_named(self):
        # Its process ends 0 with the store alive: the job counts it as dead (it never said it
        # finished), and the launcher names the program's omission, not a lost host.
        r = self.run_launcher(["-n", "2", "-s", "1"] + self.marked()
                              + [binary("ps-test-exit-worker")],
                              env=self.real_env(), timeout=60)
        self.assertEqual(r.rc, 1, r)
        self.assertRegex(r.err, r"worker [01] at \S+ exited 0 but was declared dead by the "
                                r"scheduler: its program ended without destroying its KVStore")
        self.assertIn("counts as dead too", r.out + r.err)
        self.assertNotIn("network", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_killed_server_is_survived_with_replication(self):
        # 3 servers (replication on by default): one killed mid-job, the job finishes exact,
        # the launcher names the lost server and exits 0.
        r = self.run_losing_a_server([], 3000, 1, signal.SIGKILL)
        self.assertIn("the job goes on, the other servers serve its keys (PS_REPLICATION)", r.err)
        self.assertIn("the job finished without 1 lost server(s)", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server"), missing("ps-scheduler", "ps-server"))
    def test_workers_that_never_joined_end_the_job_at_once(self):
        # Workers that exit 0 without a KVStore leave a job that can never fill: the launcher
        # stops it once the scheduler did not say it filled, not after --shutdown-timeout.
        r = self.run_launcher(["-n", "1", "-s", "1", "--shutdown-timeout", "600"]
                              + self.marked() + ["true"], env=self.real_env(), timeout=60)
        self.assertEqual(r.rc, 1, r)
        self.assertIn("every worker exited 0, but the job never started: the scheduler did not "
                      "see every node register. Does the command create a dist KVStore on "
                      "every worker", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_the_last_server_lost_is_named_not_one_the_job_survived(self):
        # 2 servers: the first death is survived, the second ends the job. The report names
        # the second and the scheduler's word that none is left; the first was reported when
        # it died (it used to be named first, and its status was the launcher's).
        proc = self.start_launcher(["-n", "2", "-s", "2"] + self.marked()
                                   + [binary("ps-kvstore-check"), "--rounds", "1000000",
                                      "--report_every", "100"], env=self.real_env())
        self.wait_for_output(proc, "kvstore-check: round 100", 2)
        first, second = self.server_pids()
        os.kill(first, signal.SIGKILL)
        self.wait_for_output(proc, "the job goes on without server", 1, timeout=60)
        os.kill(second, signal.SIGKILL)
        r = self.finish_launcher(proc, timeout=120)
        self.assertEqual(r.rc, 128 + signal.SIGKILL, r)
        survived = re.search(r"server (\d) on localhost exited with status 137 \(killed by "
                             r"SIGKILL[^\n]*; the job goes on", r.err)
        ended = re.search(r"\[launch\] server (\d) on localhost exited with status 137 "
                          r"\(killed by SIGKILL[^\n;]*; last lines:", r.err)
        self.assertIsNotNone(survived, r)
        self.assertIsNotNone(ended, r)
        self.assertNotEqual(survived.group(1), ended.group(1), r)
        self.assertNotIn(f"also failed: server {survived.group(1)}", r.err)
        self.assertIn("and no server is left (server", r.err + r.out)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_stopped_server_is_survived_and_stopped_when_the_job_ends(self):
        # A server stopped (SIGSTOP) past the heartbeat timeout: the job goes on without it and
        # finishes exact; the launcher then stops it at once, not after --shutdown-timeout
        # (600 s here, beyond this test's own limit).
        r = self.run_losing_a_server(["--shutdown-timeout", "600",
                                      "--env", "PS_HEARTBEAT_INTERVAL=0.5",
                                      "--env", "PS_HEARTBEAT_TIMEOUT=3"], 2000, 1, signal.SIGSTOP)
        self.assertRegex(r.err, r"server \d on localhost did not exit after the job finished "
                                r"\(stopped or hung: the job went on without it")
        self.assertIn("the job finished without 1 lost server(s)", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_server_restarts_put_a_new_server_in_the_dead_ones_place(self):
        # --server-restarts 1: a killed server is replaced by a new one, which then carries the
        # job alone once the other two servers of the start were killed in turn (each after the
        # copies its death causes): the sums stay exact only if the new server got every update.
        # Rounds enough to outlast the three kills on a fast machine (half a millisecond each).
        proc = self.start_launcher(["-n", "2", "-s", "3", "--server-restarts", "1"]
                                   + self.marked()
                                   + [binary("ps-kvstore-check"), "--rounds", "30000",
                                      "--report_every", "100"], env=self.real_env())
        self.wait_for_output(proc, "kvstore-check: round 100", 2)
        originals = self.server_pids()
        self.assertEqual(len(originals), 3, originals)
        os.kill(originals[1], signal.SIGKILL)
        self.wait_for_output(proc, "joined the job in the place of dead server", 1, timeout=60)
        self.assertEqual(len(set(self.server_pids()) - set(originals)), 1)
        for victim, deaths in ((originals[0], 2), (originals[2], 3)):
            time.sleep(1.5)  # the copies the last change caused (a few ms here); not a sync
            os.kill(victim, signal.SIGKILL)
            self.wait_for_output(proc, "the job goes on without server", deaths, timeout=60)
        r = self.finish_launcher(proc, timeout=180)
        self.assertEqual(r.rc, 0, r)
        self.assertIn("in the place of the dead one (0 of --server-restarts left)", r.err)
        self.assertIn("--server-restarts 1 used up", r.err)
        self.assertIn("the job finished without 3 lost server(s)", r.err)
        self.assertEqual(sorted(self.worker_lines(r.out, r"^kvstore-check: ok rank=\d+")), [0, 1],
                         r)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_a_server_lost_before_the_job_started_is_named_so(self):
        # --server-restarts replaces servers the job went on without; one that dies before
        # every node registered leaves a job that cannot start, and the launcher says why.
        server_cmd = (f'if [ "$PS_RANK" = 1 ]; then echo cannot start; exit 7; fi; '
                      f'exec {binary("ps-server")}')
        r = self.run_launcher(["-n", "1", "-s", "2", "--server-restarts", "1",
                               "--server-cmd", f"sh -c '{server_cmd}'"]
                              + [binary("ps-kvstore-check"), "--rounds", "3"],
                              env=self.real_env(), timeout=120)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn("server 1 on localhost exited with status 7", r.err)
        self.assertIn("server 1 exited before every node had registered, so the job could not "
                      "start: --server-restarts replaces servers that die once it has", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-kvstore-check"),
                     missing("ps-scheduler", "ps-server", "ps-kvstore-check"))
    def test_a_new_server_that_cannot_start_leaves_the_job_going(self):
        # The server command fails the second time it runs for a rank (as on a host that went
        # down): the new server never joins, the launcher says so, and the job finishes exact.
        server_cmd = ('if [ -e "$PSL_TMP/started-$PS_RANK" ]; then echo cannot start; exit 7; '
                      f'fi; touch "$PSL_TMP/started-$PS_RANK"; exec {binary("ps-server")}')
        r = self.run_losing_a_server(["--server-restarts", "1",
                                      "--server-cmd", f"sh -c '{server_cmd}'",
                                      "--env", f"PSL_TMP={self.tmp}"], 6000, 0, signal.SIGKILL)
        self.assertRegex(r.err, r"the new server \d on localhost exited with status 7 before it "
                                r"joined the job; the job goes on without it")
        self.assertIn("the job finished without 2 lost server(s)", r.err)
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-scheduler", "ps-server", "ps-test-node"),
                     missing("ps-scheduler", "ps-server", "ps-test-node"))
    def test_sigint_stops_real_job(self):
        proc = self.start_launcher(["-n", "2", "-s", "2"] + self.marked()
                                   + [binary("ps-test-node"), "--block"], env=self.real_env())
        self.wait_for_output(proc, "registered as worker", 2)
        proc.send_signal(signal.SIGINT)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 130, r)
        self.assert_nothing_left_here()


SSH_SKIP = ssh_missing()


@unittest.skipIf(SSH_SKIP, SSH_SKIP)
class SshEndToEnd(RealBinaries, LauncherTest):

    @classmethod
    def setUpClass(cls):
        if missing("ps-scheduler", "ps-server"):
            raise unittest.SkipTest(missing("ps-scheduler", "ps-server"))
        cls.sshd_tmp = tempfile.mkdtemp(prefix="psl-sshd-")
        cls.sshd = Sshd(cls.sshd_tmp)
        cls.sshd.start()

    @classmethod
    def tearDownClass(cls):
        cls.sshd.stop()
        shutil.rmtree(cls.sshd_tmp, ignore_errors=True)

    def ssh_args(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write(f"127.0.0.1:{self.sshd.port}\n127.0.0.2:{self.sshd.port}\n")
        proj = os.path.join(self.tmp, "proj")
        os.makedirs(proj, exist_ok=True)
        with open(os.path.join(proj, "job.txt"), "w") as f:
            f.write("synced by the launcher\n")
        return ["-H", hosts, "--ssh-opts", self.sshd.ssh_opts(),
                "--sync-dst-dir", os.path.join(self.tmp, "dst")] + self.marked()

    @unittest.skipIf(missing("ps-kvstore-check"), missing("ps-kvstore-check"))
    def test_kvstore_job_exact_result_over_ssh(self):
        args = self.ssh_args()
        r = self.run_launcher(["-n", "2", "-s", "2"] + args
                              + [binary("ps-kvstore-check"), "--rounds", "20"],
                              env=self.real_env(), cwd=os.path.join(self.tmp, "proj"),
                              timeout=60)
        self.assert_kvstore_ok(r, 2)
        self.assertTrue(os.path.isfile(os.path.join(self.tmp, "dst", "job.txt")))
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-test-node"), missing("ps-test-node"))
    def test_runtime_barriers_over_ssh(self):
        args = self.ssh_args()
        r = self.run_launcher(["-n", "3", "-s", "2"] + args
                              + [binary("ps-test-node"), "--barriers", "5"],
                              env=self.real_env(), cwd=os.path.join(self.tmp, "proj"),
                              timeout=60)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(self.worker_lines(r.out, "5 barriers done")), [0, 1, 2], r)
        self.assertTrue(os.path.isfile(os.path.join(self.tmp, "dst", "job.txt")))
        self.assert_nothing_left_here()

    @unittest.skipIf(missing("ps-test-node"), missing("ps-test-node"))
    def test_sigint_stops_real_job_over_ssh(self):
        args = self.ssh_args()
        proc = self.start_launcher(["-n", "2", "-s", "2"] + args
                                   + [binary("ps-test-node"), "--block"], env=self.real_env(),
                                   cwd=os.path.join(self.tmp, "proj"))
        self.wait_for_output(proc, "registered as worker", 2)
        proc.send_signal(signal.SIGINT)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 130, r)
        self.assert_nothing_left_here()


if __name__ == "__main__":
    unittest.main()
