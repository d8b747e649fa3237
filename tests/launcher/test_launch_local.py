"""tools/launch.py, local launcher, against stand-in binaries (fake_node.py).

These test the launcher itself: the DMLC_* contract, output prefixes, exit status, failure
reports, signals, and that no process is left behind (checked by pid and start time).
"""
import os
import signal
import subprocess
import time
import unittest

from launcher_testlib import FAKE, PY, LauncherTest, free_port


class LocalJob(LauncherTest):

    def test_job_with_default_binaries_env_contract_and_prefixes(self):
        bindir = self.fake_bin_dir()
        r = self.run_launcher(["-n", "3", "-s", "2"] + self.fake_cmd("--lines", "3"),
                              env=self.env(PS_BIN_DIR=bindir))
        self.assertEqual(r.rc, 0, r)
        self.assert_prefixed(r.out)
        oks = self.worker_lines(r.out, r"^fake-worker: ok rank=\d+$")
        self.assertEqual(sorted(oks), [0, 1, 2], r)
        self.assertIn("all processes exited 0", r.err)

        sched, = self.records("scheduler")
        servers, workers = self.records("server"), self.records("worker")
        self.assertEqual(len(servers), 2)
        self.assertEqual(len(workers), 3)
        # ps-scheduler (found through PS_BIN_DIR) binds port 0 and reports the port it got.
        self.assertEqual(sched["env"]["DMLC_PS_ROOT_PORT"], "0")
        self.assertTrue(sched["env"]["T_SCRIPT"].startswith(bindir))
        port = str(sched["port"])
        for rec, role in [(sched, "scheduler")] + [(s, "server") for s in servers] + \
                [(w, "worker") for w in workers]:
            env = rec["env"]
            self.assertEqual(env["DMLC_ROLE"], role)
            self.assertEqual(env["DMLC_NUM_SERVER"], "2")
            self.assertEqual(env["DMLC_NUM_WORKER"], "3")
            self.assertEqual(env["DMLC_PS_ROOT_URI"], "127.0.0.1")
            self.assertEqual(env["DMLC_NODE_HOST"], "127.0.0.1")
            self.assertEqual(rec["cwd"], self.tmp)
            if role != "scheduler":
                self.assertEqual(env["DMLC_PS_ROOT_PORT"], port)
                self.assertTrue(env.get("T_SCRIPT", bindir).startswith(bindir))
        # every process runs in a process group of its own
        pgids = [r["pgid"] for r in self.records()]
        self.assertEqual(len(set(pgids)), len(pgids))
        self.assert_nothing_left(timeout=5)

    def test_same_cmd_for_all_roles_mxnet_style(self):
        r = self.run_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                              + self.fake_cmd())
        self.assertEqual(r.rc, 0, r)
        roles = sorted(rec["env"]["DMLC_ROLE"] for rec in self.records())
        self.assertEqual(roles, ["scheduler", "server", "worker", "worker"])
        # the launcher picked the port: everybody has the same, non-zero one
        ports = {rec["env"]["DMLC_PS_ROOT_PORT"] for rec in self.records()}
        self.assertEqual(len(ports), 1)
        self.assertNotEqual(ports, {"0"})

    def test_scheduler_without_listening_line_is_probed(self):
        # A user program in the scheduler role need not print the listening line: the launcher
        # then waits for the port it chose to accept connections.
        r = self.run_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                              + self.fake_cmd("--no-listen-line", "--sched-delay", "0.5"))
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(len(self.worker_lines(r.out, "fake-worker: ok")), 2, r)

    def test_root_port_from_environment_and_from_env_flag(self):
        bindir = self.fake_bin_dir()
        port = free_port()
        r = self.run_launcher(["-n", "1", "-s", "1"] + self.fake_cmd(),
                              env=self.env(PS_BIN_DIR=bindir, DMLC_PS_ROOT_PORT=str(port)))
        self.assertEqual(r.rc, 0, r)
        self.assertEqual({rec["env"]["DMLC_PS_ROOT_PORT"] for rec in self.records()}, {str(port)})
        self.assertEqual(self.records("scheduler")[0]["port"], port)

        for rec in self.records():
            os.unlink(os.path.join(self.rec, f"{rec['role']}-{rec['pid']}.json"))
        port = free_port()
        r = self.run_launcher(["-n", "1", "-s", "1", "--same-cmd-for-all-roles",
                               "--env", f"DMLC_PS_ROOT_PORT={port}"] + self.fake_cmd())
        self.assertEqual(r.rc, 0, r)
        self.assertEqual({rec["env"]["DMLC_PS_ROOT_PORT"] for rec in self.records()}, {str(port)})

    def test_env_flags_per_role_and_quoting(self):
        odd = "a b \"c\" 'd' $HOME `id` ; * \\ é\nsecond line"
        r = self.run_launcher(
            ["-n", "2", "-s", "1", "--same-cmd-for-all-roles",
             "--env", "T_ALL=all", "--env", f"T_ODD={odd}", "--env", "T_FROM_LAUNCHER",
             "--env", "T_OVER=all",
             "--env-server", "T_OVER=server", "--env-server", "T_SERVER_ONLY:mxnet-form",
             "--env-worker", "T_OVER=worker", "--env-scheduler", "T_OVER=scheduler",
             "-i", "lo"] + self.fake_cmd(),
            env=self.env(T_FROM_LAUNCHER="inherited value", T_NOT_PASSED="x",
                         DMLC_NODE_HOST="10.9.9.9"))
        self.assertEqual(r.rc, 0, r)
        for rec in self.records():
            env, role = rec["env"], rec["role"]
            self.assertEqual(env["T_ALL"], "all")
            self.assertEqual(env["T_ODD"], odd)
            self.assertEqual(env["T_FROM_LAUNCHER"], "inherited value")
            self.assertEqual(env["T_OVER"], role)
            self.assertEqual(env.get("T_SERVER_ONLY"), "mxnet-form" if role == "server" else None)
            self.assertEqual(env["DMLC_INTERFACE"], "lo")
            # -i: the nodes take their address from the interface, which DMLC_NODE_HOST
            # would override (the launcher's own included)
            self.assertEqual("DMLC_NODE_HOST" in env, role == "scheduler")
            self.assertNotEqual(env.get("DMLC_NODE_HOST"), "10.9.9.9")

    def test_job_secret_reaches_every_process_but_no_command_line(self):
        r = self.run_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                              + self.fake_cmd(), env=self.env(PS_JOB_SECRET="s3cret value"))
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(len(self.records()), 4)
        for rec in self.records():
            self.assertEqual(rec["env"].get("PS_JOB_SECRET"), "s3cret value")
            self.assertNotIn("s3cret", " ".join(rec["argv"]) + rec["parent_cmdline"])
            self.assertIn("ps-launch", rec["parent_cmdline"])  # the wrapper was looked at

    def test_quiet_shows_only_workers(self):
        r = self.run_launcher(["-q", "-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                              + self.fake_cmd("--lines", "2"))
        self.assertEqual(r.rc, 0, r)
        self.assertTrue(r.out.strip())
        for line in r.out.splitlines():
            self.assertRegex(line, r"^\[worker \d\] ")

    def test_output_behind_a_slow_reader_is_shown_to_its_end(self):
        # The launcher's reader falls behind: when the processes have exited, their output is
        # still queued (far more than a pipe holds). Every line must come through, the last
        # ones included, however long after the exits showing it takes.
        lines = 20000
        proc = subprocess.Popen(
            self.launch_argv(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                             + self.fake_cmd("--lines", str(lines))),
            env=self.env(), cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        chunks = []
        try:
            # A reader of 400 KB/s: the 1.6 MB of output takes seconds after the exits.
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                chunks.append(chunk)
                time.sleep(0.01)  # the slow reader's pace, not a synchronization
            proc.wait(timeout=30)
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        out = b"".join(chunks)
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        self.assertEqual(proc.returncode, 0, err[-2000:])
        for rank in range(2):
            shown = self.worker_lines(out, rf"line \d+ of rank {rank}$")
            count = sum(len(v) for v in shown.values())
            self.assertEqual(count, lines, f"rank {rank}: {count} of {lines} lines shown")
            self.assertEqual(len(self.worker_lines(out, rf"fake-worker: ok rank={rank}$")), 1)
        self.assertNotIn("not shown", err)

    def test_worker_command_not_found(self):
        r = self.run_launcher(["-n", "1", "-s", "1", "--server-cmd", f"{PY} {FAKE}",
                               "--scheduler-cmd", f"{PY} {FAKE}", "no-such-program-psl"])
        # Refused before anything starts (the shell's status 127 came once the job ran).
        self.assertEqual(r.rc, 2, r)
        self.assertIn("the worker command cannot run: no-such-program-psl is not found in PATH",
                      r.err)
        self.assertEqual(self.records(), [])
        self.assert_nothing_left(timeout=5)


class LocalFailures(LauncherTest):

    def test_failing_worker_exit_3_stops_everything(self):
        # Worker rank 1 fails at once; the others are mid-job (sleeping 60 s) and must be stopped.
        t0 = time.monotonic()
        r = self.run_launcher(["-n", "3", "-s", "2", "--same-cmd-for-all-roles"]
                              + self.fake_cmd("--fail-rank", "1", "--exit-code", "3",
                                              "--sleep", "60", "--grandchild"), timeout=40)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(r.rc, 3, r)
        failing = self.worker_lines(r.out, "failing on purpose")
        self.assertEqual(len(failing), 1, r)
        label = next(iter(failing))
        # it names the culprit, with its last lines
        self.assertRegex(r.err, rf"worker {label} on localhost exited with status 3; last lines:")
        self.assertIn(f"[worker {label}] fake-worker: failing on purpose rank=1 code=3", r.err)
        self.assertIn("stopping", r.err)
        self.assertEqual(len(self.records("grandchild")), 6)
        self.assert_nothing_left()

    def test_failing_server_fails_the_job(self):
        r = self.run_launcher(["-n", "2", "-s", "2",
                               "--server-cmd", f"{PY} {FAKE} --marker {self.marker} "
                                               "--server-exit-code 5",
                               "--scheduler-cmd", f"{PY} {FAKE} --marker {self.marker}"]
                              + self.fake_cmd("--sleep", "60"), timeout=40)
        self.assertNotEqual(r.rc, 0, r)
        self.assertRegex(r.err, r"(server \d|scheduler) on localhost exited with status")
        self.assertIn("failing on purpose", r.err)
        self.assert_nothing_left()

    def test_scheduler_dying_before_listening(self):
        r = self.run_launcher(["-n", "2", "-s", "1", "--scheduler-cmd",
                               "sh -c 'echo boom from the scheduler; exit 7'",
                               "--server-cmd", f"{PY} {FAKE} --marker {self.marker}"]
                              + self.fake_cmd())
        self.assertEqual(r.rc, 1, r)
        self.assertIn("scheduler on localhost exited with status 7 before it was ready", r.err)
        self.assertIn("boom from the scheduler", r.err)
        self.assertEqual(self.records("worker") + self.records("server"), [])

    def test_port_clash_is_retried(self):
        # A scheduler that fails the first time (as if its port had been taken meanwhile): the
        # launcher picks another port and starts it again.
        flag = os.path.join(self.tmp, "first-try")
        sched = (f"sh -c 'if [ ! -e {flag} ]; then touch {flag}; echo port 1 is already in use; "
                 "exit 1; fi; "
                 f"exec {PY} {FAKE} --marker {self.marker} --no-listen-line'")
        r = self.run_launcher(["-n", "1", "-s", "1", "--scheduler-cmd", sched,
                               "--server-cmd", f"{PY} {FAKE} --marker {self.marker}"]
                              + self.fake_cmd())
        self.assertEqual(r.rc, 0, r)
        self.assertIn("which is in use; retrying with another port", r.err)

    def test_a_port_in_use_from_the_shell_is_named(self):
        # A DMLC_PS_ROOT_PORT left exported (after starting roles by hand) is used, and the
        # scheduler finds it taken: the launcher says where the port came from. Given with
        # --env, the user chose it there: no note.
        sched = "sh -c 'echo port 9 is already in use; exit 1'"
        args = ["-n", "1", "-s", "1", "--scheduler-cmd", sched, "--server-cmd", f"{PY} {FAKE}"]
        note = ("DMLC_PS_ROOT_PORT=9 came from the launcher's environment: unset "
                "DMLC_PS_ROOT_PORT to let the scheduler pick a free port")
        r = self.run_launcher(args + self.fake_cmd(), env=self.env(DMLC_PS_ROOT_PORT="9"))
        self.assertEqual(r.rc, 1, r)
        self.assertIn(note, r.err)
        r = self.run_launcher(args + ["--env", "DMLC_PS_ROOT_PORT=9"] + self.fake_cmd())
        self.assertEqual(r.rc, 1, r)
        self.assertNotIn("came from the launcher's environment", r.err)

    def test_scheduler_exiting_for_another_reason_is_not_retried(self):
        # Only a port in use is worth another port: a scheduler command that exits at once
        # (here with status 0) is reported, once, with its last lines.
        r = self.run_launcher(["-n", "1", "-s", "1", "--scheduler-cmd", "sh -c 'echo done'",
                               "--server-cmd", f"{PY} {FAKE}"] + self.fake_cmd())
        self.assertEqual(r.rc, 1, r)
        self.assertIn("scheduler on localhost exited with status 0 before it was ready", r.err)
        self.assertIn("[scheduler] done", r.err)
        self.assertNotIn("retrying", r.err)
        self.assertEqual(self.records("worker") + self.records("server"), [])

    def test_scheduler_never_listening_times_out(self):
        r = self.run_launcher(["-n", "1", "-s", "1", "--startup-timeout", "1",
                               "--scheduler-cmd", f"sh -c 'echo never listening; exec {PY} "
                                                  f"-c \"import time; time.sleep(30)\" "
                                                  f"{self.marker}'",
                               "--server-cmd", f"{PY} {FAKE}"] + self.fake_cmd())
        self.assertEqual(r.rc, 1, r)
        self.assertIn("did not report listening within 1 s", r.err)
        self.assertIn("never listening", r.err)
        self.assert_nothing_left()

    def test_server_not_exiting_after_the_job_times_out(self):
        r = self.run_launcher(["-n", "1", "-s", "1", "--shutdown-timeout", "1",
                               "--server-cmd", f"{PY} {FAKE} --marker {self.marker} --linger 60",
                               "--scheduler-cmd", f"{PY} {FAKE} --marker {self.marker}"]
                              + self.fake_cmd())
        self.assertEqual(r.rc, 1, r)
        self.assertIn("server 0 on localhost did not exit within 1 s", r.err)
        self.assert_nothing_left()

    def test_workers_that_never_joined_are_named_as_the_cause(self):
        # The workers exit 0 without a KVStore (--version, say): the scheduler still waits for
        # them to register, and the report says so rather than blaming the shutdown.
        r = self.run_launcher(["-n", "1", "-s", "1", "--shutdown-timeout", "1",
                               "--server-cmd", f"{PY} {FAKE} --marker {self.marker}",
                               "--scheduler-cmd", f"{PY} {FAKE} --marker {self.marker}",
                               "/bin/true"])
        self.assertEqual(r.rc, 1, r)
        self.assertIn("scheduler on localhost", r.err)
        self.assertIn("the workers exited 0, but the scheduler did not log that they finished "
                      "the job: if they never joined it, does the command create a dist KVStore "
                      "on every worker", r.err)
        self.assert_nothing_left()


class WrapperKilled(LauncherTest):

    def test_a_killed_wrapper_is_named_and_its_command_stopped(self):
        # `kill -9` of a wrapper shell (its pid is the one `ps` shows beside the command's
        # name) leaves the command running out of the launcher's sight: the launcher says
        # so, and stops the command with the rest of the job.
        proc = self.start_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                                   + self.fake_cmd("--sleep", "60"))
        self.wait_records({"scheduler": 1, "server": 1, "worker": 2})
        # The launcher's worker 1 (PS_RANK; the stand-in's own rank is its registration order).
        worker = next(r for r in self.records("worker") if r["env"].get("PS_RANK") == "1")
        with open(f"/proc/{worker['pid']}/stat") as f:
            wrapper = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
        with open(f"/proc/{wrapper}/cmdline", "rb") as f:
            self.assertIn(b"\0ps-launch\0", f.read())
        os.kill(wrapper, signal.SIGKILL)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 137, r)
        self.assertRegex(r.err, r"worker 1 on localhost exited with status 137 \(its launcher "
                                r"wrapper, not the command, was killed by SIGKILL; the command, "
                                rf"process group {worker['pid']}, still ran: the launcher "
                                r"stops it\)")
        self.assert_nothing_left()

    def test_a_command_killed_by_sigkill_names_the_oom_killer_among_the_causes(self):
        # Nobody the launcher can see sent it: a user, a tool, or the kernel out of memory.
        proc = self.start_launcher(["-n", "2", "-s", "1", "--same-cmd-for-all-roles"]
                                   + self.fake_cmd("--sleep", "60"))
        self.wait_records({"scheduler": 1, "server": 1, "worker": 2})
        worker = next(r for r in self.records("worker") if r["env"].get("PS_RANK") == "1")
        os.kill(worker["pid"], signal.SIGKILL)
        r = self.finish_launcher(proc, timeout=30)
        self.assertNotEqual(r.rc, 0, r)
        self.assertIn("worker 1 on localhost exited with status 137 (killed by SIGKILL: by a "
                      "user or a tool, or by the kernel's OOM killer when the host or the "
                      "process's cgroup ran out of memory (see dmesg))", r.err)
        self.assert_nothing_left()


class DescriptorLimit(LauncherTest):

    def test_a_limit_below_the_jobs_pipes_is_refused_before_any_process_starts(self):
        # Hard limit 40: 33 processes need two pipes each, so it would fail halfway.
        argv = (["sh", "-c", 'ulimit -n 40 && exec "$@"', "sh"]
                + self.launch_argv(["-n", "24", "-s", "8", "--same-cmd-for-all-roles"]
                                   + self.fake_cmd("--sleep", "60")))
        r = subprocess.run(argv, env=self.env(), cwd=self.tmp, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r)
        self.assertIn("launch.py: error: the launcher needs about 98 file descriptors for the "
                      "job's 33 processes (two pipes each, besides its own), and its limit "
                      "(ulimit -n) is 40: raise it", r.stderr)
        self.assertEqual(self.records("scheduler"), [])
        self.assert_nothing_left()


class LocalSignals(LauncherTest):

    def start_long_job(self, *extra):
        proc = self.start_launcher(["-n", "2", "-s", "2", "--same-cmd-for-all-roles"]
                                   + self.fake_cmd("--sleep", "60", "--grandchild", *extra))
        self.wait_records({"scheduler": 1, "server": 2, "worker": 2, "grandchild": 5})
        return proc

    def test_sigint_mid_job_leaves_nothing(self):
        proc = self.start_long_job()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        r = self.finish_launcher(proc, timeout=20)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r.rc, 130, r)
        self.assertIn("SIGINT received: stopping every process", r.err)
        self.assert_nothing_left()

    def test_sigterm_mid_job_leaves_nothing(self):
        proc = self.start_long_job()
        proc.send_signal(signal.SIGTERM)
        r = self.finish_launcher(proc, timeout=20)
        self.assertEqual(r.rc, 143, r)
        self.assert_nothing_left()

    def test_sigkill_of_the_launcher_still_leaves_nothing(self):
        # The launcher cannot clean up after SIGKILL: the wrappers' watchers see their stdin
        # close and stop the process groups themselves.
        proc = self.start_long_job()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        self.assert_nothing_left(timeout=10)

    def test_process_ignoring_sigterm_is_killed(self):
        proc = self.start_long_job("--ignore-term")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        r = self.finish_launcher(proc, timeout=30)
        self.assertEqual(r.rc, 130, r)
        self.assertLess(time.monotonic() - t0, 20)
        self.assert_nothing_left()


if __name__ == "__main__":
    unittest.main()
