"""tools/launch.py, ssh launcher, against a real sshd that the test starts on a loopback port.

Two "hosts", 127.0.0.1 and 127.0.0.2, served by one throwaway sshd (its own host key and
authorized key, in a temp dir; stopped by pid). The nodes are the stand-ins of fake_node.py.
Remote processes are on this machine too, so "nothing left" is checked by pid and by the test's
marker in /proc, remote shells and ssh clients included.
"""
import os
import signal
import time
import unittest

from launcher_testlib import FAKE, PY, LauncherTest, Sshd, pids_with_marker, ssh_missing

SKIP = ssh_missing()


@unittest.skipIf(SKIP, SKIP)
class SshLauncher(LauncherTest):

    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.sshd_tmp = tempfile.mkdtemp(prefix="psl-sshd-")
        cls.sshd = Sshd(cls.sshd_tmp)
        cls.sshd.start()

    @classmethod
    def tearDownClass(cls):
        import shutil
        cls.sshd.stop()
        shutil.rmtree(cls.sshd_tmp, ignore_errors=True)

    def hostfile(self, lines):
        path = os.path.join(self.tmp, "hosts")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def two_hosts(self):
        p = self.sshd.port
        return self.hostfile(["# two loopback 'hosts' served by the test's sshd",
                              f"127.0.0.1:{p}", "", f"127.0.0.2:{p}   # second host"])

    def ssh_args(self, hostfile=None):
        return ["-H", hostfile or self.two_hosts(), "--ssh-opts", self.sshd.ssh_opts(),
                "--env", f"FAKE_RECORD_DIR={self.rec}"]

    def test_job_over_ssh_with_sync_dst_dir(self):
        # The project dir holds the stand-in binaries and the worker program; it is rsynced to
        # DST on both hosts and the remote processes run the copies, in DST.
        proj = os.path.join(self.tmp, "proj")
        os.makedirs(proj)
        with open(FAKE) as src, open(os.path.join(proj, "worker.py"), "w") as dst:
            dst.write(src.read())
        self.fake_bin_dir(where=os.path.join(proj, "bin"))
        dst_dir = os.path.join(self.tmp, "dst dir")  # a space, to test quoting
        r = self.run_launcher(
            ["-n", "3", "-s", "2", "--sync-dst-dir", dst_dir] + self.ssh_args()
            + [PY, "worker.py", "--marker", self.marker, "--lines", "2"],
            cwd=proj, env=self.env(PS_BIN_DIR=os.path.join(proj, "bin")))
        self.assertEqual(r.rc, 0, r)
        self.assertIn("syncing", r.err)
        self.assert_prefixed(r.out)
        self.assertEqual(sorted(self.worker_lines(r.out, r"^fake-worker: ok rank=\d$")),
                         [0, 1, 2], r)
        self.assertTrue(os.path.isfile(os.path.join(dst_dir, "worker.py")))
        self.assertTrue(os.path.isfile(os.path.join(dst_dir, "bin", "ps-server")))

        sched, = self.records("scheduler")
        servers = sorted(self.records("server"), key=lambda r: r["env"]["DMLC_NODE_HOST"])
        workers = self.records("worker")
        # the scheduler runs on the launching host, in the launcher's directory, the original
        self.assertEqual(sched["cwd"], proj)
        self.assertEqual(sched["env"]["T_SCRIPT"], os.path.join(proj, "bin", "ps-scheduler"))
        self.assertEqual(sched["env"]["DMLC_PS_ROOT_PORT"], "0")
        self.assertEqual(sched["env"]["DMLC_PS_ROOT_URI"], "127.0.0.1")
        # servers on distinct hosts first, then workers round-robin after them (MXNet's order)
        self.assertEqual([s["env"]["DMLC_NODE_HOST"] for s in servers],
                         ["127.0.0.1", "127.0.0.2"])
        self.assertEqual(sorted(w["env"]["DMLC_NODE_HOST"] for w in workers),
                         ["127.0.0.1", "127.0.0.1", "127.0.0.2"])
        for rec in servers + workers:
            self.assertEqual(rec["cwd"], dst_dir)
            self.assertEqual(rec["env"]["DMLC_PS_ROOT_URI"], "127.0.0.1")
            self.assertEqual(rec["env"]["DMLC_PS_ROOT_PORT"], str(sched["port"]))
            self.assertEqual(rec["env"]["DMLC_NUM_SERVER"], "2")
            self.assertEqual(rec["env"]["DMLC_NUM_WORKER"], "3")
        for s in servers:  # the default ps-server was the synced copy
            self.assertEqual(s["env"]["T_SCRIPT"], os.path.join(dst_dir, "bin", "ps-server"))
        self.assert_nothing_left(timeout=5)

    def test_env_quoting_survives_the_remote_shell(self):
        odd = "a b \"c\" 'd' $HOME `id` $(id) ; & | < > * ? ~ \\ \\n é\ttab\nnewline"
        p = self.sshd.port
        hosts = self.hostfile(["127.0.0.1", "127.0.0.2 slots=2"])  # port from --ssh-opts -p
        r = self.run_launcher(
            ["-n", "2", "-s", "1", "--same-cmd-for-all-roles", "-H", hosts,
             "--ssh-opts", self.sshd.ssh_opts() + f" -p {p}",
             "--env", f"FAKE_RECORD_DIR={self.rec}", "--env", f"T_ODD={odd}",
             "--env", "T_FWD", "--env-worker", "T_ROLE=worker 'w'",
             "--env-server", "T_ROLE=server \"s\""]
            + self.fake_cmd("--tag", odd), env=self.env(T_FWD="from the launcher's env",
                                                         PS_VERBOSE="1", PS_TCP_RCVBUF="65536"))
        self.assertEqual(r.rc, 0, r)
        recs = self.records("server") + self.records("worker")
        self.assertEqual(len(recs), 3)
        for rec in recs:
            self.assertEqual(rec["env"]["T_ODD"], odd)
            self.assertEqual(rec["env"]["T_FWD"], "from the launcher's env")
            self.assertEqual(rec["env"]["PS_VERBOSE"], "1")  # forwarded by default
            self.assertEqual(rec["env"]["PS_TCP_RCVBUF"], "65536")
            want = "worker 'w'" if rec["role"] == "worker" else 'server "s"'
            self.assertEqual(rec["env"]["T_ROLE"], want)
            self.assertEqual(rec["argv"][-2:], ["--tag", odd])  # command words survive too
        # slots=2 on 127.0.0.2: slot list is [.1, .2, .2]; server 0 -> .1, workers -> .2, .2
        self.assertEqual(self.records("server")[0]["env"]["DMLC_NODE_HOST"], "127.0.0.1")
        self.assertEqual({w["env"]["DMLC_NODE_HOST"] for w in self.records("worker")},
                         {"127.0.0.2"})

    def test_servers_on_hosts_of_their_own(self):
        # BytePS's layout: workers on the -H host (127.0.0.1), servers on the
        # --server-hostfile host (127.0.0.2); -s defaults to its slots (2)
        p = self.sshd.port
        workers = self.hostfile([f"127.0.0.1:{p}"])
        servers = os.path.join(self.tmp, "servers")
        with open(servers, "w") as f:
            f.write(f"127.0.0.2:{p} slots=2\n")
        r = self.run_launcher(["-n", "3", "--same-cmd-for-all-roles", "--server-hostfile",
                               servers] + self.ssh_args(workers) + self.fake_cmd())
        self.assertEqual(r.rc, 0, r)
        servers_run = self.records("server")
        workers_run = self.records("worker")
        self.assertEqual(len(servers_run), 2)
        self.assertEqual(len(workers_run), 3)
        for rec in servers_run:
            self.assertEqual(rec["env"]["DMLC_NODE_HOST"], "127.0.0.2")
            self.assertEqual(rec["env"]["DMLC_NUM_SERVER"], "2")
        for rec in workers_run:
            self.assertEqual(rec["env"]["DMLC_NODE_HOST"], "127.0.0.1")
        self.assertEqual(sorted(w["env"]["PS_LOCAL_RANK"] for w in workers_run),
                         ["0", "1", "2"])
        self.assert_nothing_left(timeout=5)

    def test_scheduler_on_a_remote_host(self):
        proc = self.start_launcher(
            ["-n", "1", "-s", "1", "--same-cmd-for-all-roles", "--scheduler-host",
             f"127.0.0.2:{self.sshd.port}"] + self.ssh_args()
            + self.fake_cmd("--sleep", "60"))
        self.wait_records({"scheduler": 1, "server": 1, "worker": 1}, timeout=30)
        sched, = self.records("scheduler")
        self.assertEqual(sched["env"]["DMLC_NODE_HOST"], "127.0.0.2")
        self.assertEqual(sched["env"]["DMLC_PS_ROOT_URI"], "127.0.0.2")
        self.assertIn("sshd", self._ancestors(sched["pid"]))
        for rec in self.records("server") + self.records("worker"):
            self.assertEqual(rec["env"]["DMLC_PS_ROOT_URI"], "127.0.0.2")
        proc.send_signal(signal.SIGTERM)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 143, r)
        self.assert_nothing_left()

    def test_many_processes_on_one_host(self):
        # 16 processes on one host: more ssh connections than sshd's default MaxStartups (10)
        # lets through at once; the launcher starts them a few at a time.
        hosts = self.hostfile([f"127.0.0.2:{self.sshd.port}"])
        r = self.run_launcher(["-n", "14", "-s", "2", "--same-cmd-for-all-roles", "-q"]
                              + self.ssh_args(hosts) + self.fake_cmd(), timeout=90)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(self.worker_lines(r.out, "fake-worker: ok")), list(range(14)))
        self.assertEqual(len(self.records("server") + self.records("worker")), 16)

    def test_failing_worker_over_ssh_stops_every_host(self):
        t0 = time.monotonic()
        r = self.run_launcher(["-n", "3", "-s", "2", "--same-cmd-for-all-roles"]
                              + self.ssh_args()
                              + self.fake_cmd("--fail-rank", "2", "--exit-code", "3",
                                              "--sleep", "60", "--grandchild"), timeout=60)
        self.assertLess(time.monotonic() - t0, 40)
        self.assertEqual(r.rc, 3, r)
        self.assertRegex(r.err, r"worker \d on 127\.0\.0\.[12] exited with status 3; last lines:")
        self.assertIn("fake-worker: failing on purpose rank=2 code=3", r.err)
        self.assertEqual(len(self.records("grandchild")), 6)
        self.assert_nothing_left()

    def start_long_job(self):
        proc = self.start_launcher(["-n", "2", "-s", "2", "--same-cmd-for-all-roles"]
                                   + self.ssh_args()
                                   + self.fake_cmd("--sleep", "60", "--grandchild"))
        self.wait_records({"scheduler": 1, "server": 2, "worker": 2, "grandchild": 5}, timeout=30)
        return proc

    def test_sigint_mid_job_leaves_nothing_on_any_host(self):
        proc = self.start_long_job()
        remote = [r for r in self.records() if r["role"] in ("server", "worker")]
        self.assertEqual({r["env"]["DMLC_NODE_HOST"] for r in remote}, {"127.0.0.1", "127.0.0.2"})
        # the remote processes really run under sshd; the scheduler under the launcher
        for rec in remote:
            self.assertIn("sshd", self._ancestors(rec["pid"]), rec)
        self.assertNotIn("sshd", self._ancestors(self.records("scheduler")[0]["pid"]))
        proc.send_signal(signal.SIGINT)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 130, r)
        self.assert_nothing_left()

    def test_dropped_ssh_connection_kills_the_remote_process(self):
        proc = self.start_long_job()
        # Kill one ssh client (as a network failure would end it): its remote worker must die
        # with it, and the launcher must fail the job and stop the rest.
        clients = [pid for pid in pids_with_marker(self.marker) if self._argv0(pid) == "ssh"
                   and "DMLC_ROLE=worker" in self._cmdline(pid)]
        self.assertTrue(clients)
        os.kill(clients[0], signal.SIGKILL)
        r = self.finish_launcher(proc, timeout=30)
        self.assertNotEqual(r.rc, 0, r)
        self.assertRegex(r.err, r"worker \d on 127\.0\.0\.[12] exited with status 137")
        self.assert_nothing_left()

    def test_unreachable_host_fails_fast(self):
        hosts = self.hostfile([f"127.0.0.1:{self.sshd.port}", f"127.0.0.3:{self.sshd.port}"])
        r = self.run_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                              + self.ssh_args(hosts) + self.fake_cmd("--sleep", "60"),
                              timeout=60)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn("on 127.0.0.3 exited with status 255 (ssh failed", r.err)
        self.assertIn("[launch] could not start worker 0 on host 127.0.0.3: ssh ended with "
                      "status 255 before the command ran: ssh: connect to host 127.0.0.3 port "
                      f"{self.sshd.port}: Connection refused: no sshd listens there", r.err)
        self.assert_nothing_left()

    @staticmethod
    def _ancestors(pid, depth=4):
        """The command names of up to `depth` ancestors of pid."""
        names = []
        for _ in range(depth):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/comm") as f:
                    names.append(f.read().strip())
            except (OSError, ValueError):
                break
        return names

    @staticmethod
    def _cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def _argv0(self, pid):
        return os.path.basename(self._cmdline(pid).split(" ", 1)[0])


if __name__ == "__main__":
    unittest.main()
