"""tools/launch.py: command line, hostfile, placement, environment, quoting, --dry-run.

Unit tests of the launcher's pure parts (imported as a module), plus --help, usage errors and
--dry-run run as commands. Nothing here starts a job.
"""
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import unittest

from launcher_testlib import LAUNCH, PY, REPO, LauncherTest

spec = importlib.util.spec_from_file_location("launch", LAUNCH)
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)


def names(hosts):
    return [h.name for h in hosts]



def stop_and_wait(pid):
    """SIGSTOPs local process `pid` and returns once /proc shows it stopped (the kernel stops
    it asynchronously), or after 10 s."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while launch.process_state(pid) not in ("T", "t") and time.monotonic() < deadline:
        time.sleep(0.01)

class Hostfile(unittest.TestCase):

    def test_formats(self):
        hosts = launch.parse_hostfile_text(
            "# comment line\n"
            "node1\n"
            "\n"
            "  node2:2222   # trailing comment\n"
            "node3 slots=4\n"
            "alice@node4:22 slots=2\n"
            "10.0.0.5\n"
            "[::1]:2200\n"
            "fe80::1\n")
        self.assertEqual(names(hosts), ["node1", "node2", "node3", "node4", "10.0.0.5", "::1",
                                        "fe80::1"])
        self.assertEqual([h.port for h in hosts], [None, 2222, None, 22, None, 2200, None])
        self.assertEqual([h.slots for h in hosts], [1, 1, 4, 2, 1, 1, 1])
        self.assertEqual(hosts[3].target, "alice@node4")
        self.assertEqual(hosts[3].name, "node4")  # DMLC_NODE_HOST has no user part

    def test_errors_name_the_line(self):
        for text, want in [("node1\nnode2:99999\n", "hosts:2: bad ssh port"),
                           ("node1 slots=0\n", "hosts:1: bad slots"),
                           ("node1 slots=x\n", "bad slots"),
                           ("node1 cpus=4\n", "unknown field 'cpus=4' (a line is "
                                               "'[user@]host[:sshport] [slots=N] "
                                               "[server_weight=W]')"),
                           ("node1 server_weight=0\n", "hosts:1: bad server_weight value '0'"),
                           ("node1 server_weight=-1\n", "bad server_weight value '-1'"),
                           ("node1 server_weight=nan\n", "bad server_weight value 'nan'"),
                           ("node1 server_weight=x\n", "bad server_weight value 'x'"),
                           ("# only comments\n\n", "no hosts"),
                           ("[::1\n", "unbalanced"),
                           ("node1:22:33\n", "hosts:1: bad host 'node1:22:33' (want "
                                                "[user@]host[:sshport]"),
                           ("node1,node2\n", "hosts:1: bad host name 'node1,node2': letters, "
                                                "digits"),
                           ("@node\n", "empty user")]:
            with self.subTest(text=text):
                with self.assertRaises(launch.UsageError) as cm:
                    launch.parse_hostfile_text(text, "hosts")
                self.assertIn(want, str(cm.exception))


class Placement(unittest.TestCase):

    def hosts(self, *spec):
        return [launch.Host(n, slots=s) for n, s in spec]

    def test_servers_on_distinct_hosts_then_round_robin(self):
        hosts = self.hosts(("a", 1), ("b", 1), ("c", 1), ("d", 1))
        servers, workers = launch.place(hosts, 2, 4)
        self.assertEqual(names(servers), ["a", "b"])
        self.assertEqual(names(workers), ["c", "d", "a", "b"])  # MXNet: one global counter

    def test_more_servers_than_hosts_wraps(self):
        servers, workers = launch.place(self.hosts(("a", 1), ("b", 1)), 3, 3)
        self.assertEqual(names(servers), ["a", "b", "a"])
        self.assertEqual(names(workers), ["b", "a", "b"])

    def test_slots_weight_the_rotation(self):
        # slot list: round 0 = a b c, round 1 = a c, round 2 = c -> a b c a c c
        hosts = self.hosts(("a", 2), ("b", 1), ("c", 3))
        servers, workers = launch.place(hosts, 3, 5)
        self.assertEqual(names(servers), ["a", "b", "c"])
        self.assertEqual(names(workers), ["a", "c", "c", "a", "b"])

    def test_single_host(self):
        servers, workers = launch.place(self.hosts(("only", 1)), 2, 2)
        self.assertEqual(names(servers + workers), ["only"] * 4)

    def test_servers_on_hosts_of_their_own(self):
        # BytePS's layout: each list dealt over its own hosts, each from its first slot
        workers = self.hosts(("w1", 1), ("w2", 2))
        servers = self.hosts(("s1", 1), ("s2", 1), ("s3", 1))
        got_s, got_w = launch.place(workers, 2, 5, servers)
        self.assertEqual(names(got_s), ["s1", "s2"])
        self.assertEqual(names(got_w), ["w1", "w2", "w2", "w1", "w2"])  # slot list w1 w2 w2
        got_s, got_w = launch.place(workers, 4, 1, servers)
        self.assertEqual(names(got_s), ["s1", "s2", "s3", "s1"])  # more servers: wraps
        self.assertEqual(names(got_w), ["w1"])


class EnvItems(unittest.TestCase):

    def parse(self, items, flag="--env", environ=None):
        return launch.parse_env_items(items, flag, environ or {})

    def test_forms(self):
        self.assertEqual(self.parse(["A=1", "B=x=y", "C:mx:form", "D=", "E"], environ={"E": "e"}),
                         {"A": "1", "B": "x=y", "C": "mx:form", "D": "", "E": "e"})

    def test_errors(self):
        for items, flag, want in [
                (["NOPE"], "--env", "NOPE is not set in the launcher's environment"),
                (["1A=1"], "--env", "not a valid variable name"),
                (["A-B=1"], "--env", "not a valid variable name"),
                (["DMLC_ROLE=server"], "--env", "set by the launcher"),
                (["DMLC_NUM_WORKER=3"], "--env-worker", "set by the launcher"),
                (["DMLC_NODE_HOST=h"], "--env", "set by the launcher"),
                (["DMLC_PS_ROOT_PORT=9000"], "--env-server", "give it with --env"),
                (["PS_JOB_SECRET=s3cr3t"], "--env", "--env PS_JOB_SECRET=...: the job secret "
                                                     "is not given on the command line"),
                (["PS_JOB_SECRET_FILE=/f"], "--env-worker", "over its standard input")]:
            with self.subTest(items=items, flag=flag):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(items, flag)
                self.assertIn(want, str(cm.exception))
                self.assertNotIn("s3cr3t", str(cm.exception))  # a secret is never shown


class Args(LauncherTest):

    def parse(self, argv, **environ):
        env = {"PATH": "/nonexistent", "PS_BIN_DIR": self.fake_bin_dir()}
        env.update(environ)
        return launch.parse_args(argv, environ=env, cwd=self.tmp, launcher_dir="/nonexistent/t")

    def test_job_secret(self):
        first, second = self.parse(["-n", "1", "prog"]), self.parse(["-n", "1", "prog"])
        self.assertRegex(first.job_secret, r"^[0-9a-f]{32}$")
        self.assertNotEqual(first.job_secret, second.job_secret)  # one per job
        self.assertEqual(self.parse(["-n", "1", "prog"], PS_JOB_SECRET="mine").job_secret, "mine")
        path = os.path.join(self.tmp, "secret")
        with open(path, "w") as f:
            f.write("from a file\r\nsecond line\n")  # a line ends before CR LF too
        os.chmod(path, 0o600)
        fifo = os.path.join(self.tmp, "fifo")  # nobody writes to it
        os.mkfifo(fifo)
        self.assertEqual(self.parse(["-n", "1", "prog"], PS_JOB_SECRET_FILE=path).job_secret,
                         "from a file")
        # Readable by others, it lets them join: refused, as the nodes refuse it.
        readable = os.path.join(self.tmp, "readable")
        with open(readable, "w") as f:
            f.write("a secret\n")
        os.chmod(readable, 0o644)
        long_line = os.path.join(self.tmp, "long")
        with open(long_line, "w") as f:
            f.write("x" * 300 + "\n")
        os.chmod(long_line, 0o600)
        for environ, want in [({"PS_JOB_SECRET_FILE": readable},
                               f"PS_JOB_SECRET_FILE={readable}: other users may read or write it "
                               f"(mode 0644), and with the secret join the job: chmod 600 "
                               f"{readable}"),
                              ({"PS_JOB_SECRET_FILE": long_line},
                               f"PS_JOB_SECRET_FILE={long_line}: its first line: want one line "
                               "of 1 to 255 bytes"),
                              ({"PS_JOB_SECRET": "a", "PS_JOB_SECRET_FILE": path}, "set one"),
                              ({"PS_JOB_SECRET_FILE": path + ".missing"}, "No such file"),
                              ({"PS_JOB_SECRET": ""}, "1 to 255 bytes"),
                              # Bounded: neither fills memory nor blocks.
                              ({"PS_JOB_SECRET_FILE": "/dev/zero"}, "not a regular file"),
                              ({"PS_JOB_SECRET_FILE": fifo}, "its first line is empty")]:
            with self.subTest(environ=environ):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(["-n", "1", "prog"], **environ)
                self.assertIn(want, str(cm.exception))

    def test_defaults_follow_mxnet(self):
        c = self.parse(["-n", "3", "prog", "--flag"])
        self.assertEqual((c.num_workers, c.num_servers, c.launcher), (3, 3, "local"))
        self.assertEqual(c.worker_cmd, ["prog", "--flag"])
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1\nh2\n")
        c = self.parse(["-n", "2", "-s", "1", "-H", hosts, "prog"])
        self.assertEqual((c.num_servers, c.launcher, names(c.hosts)), (1, "ssh", ["h1", "h2"]))
        c = self.parse(["-n", "2", "--launcher", "ssh", "-H", hosts, "prog"])
        self.assertEqual(c.launcher, "ssh")

    def test_options_after_the_command_belong_to_it(self):
        c = self.parse(["-n", "2", "prog", "-n", "5", "--env", "X=1", "-q"])
        self.assertEqual(c.worker_cmd, ["prog", "-n", "5", "--env", "X=1", "-q"])
        self.assertFalse(c.quiet)
        c = self.parse(["-n", "2", "--", "-prog-with-dash"])
        self.assertEqual(c.worker_cmd, ["-prog-with-dash"])

    def test_dash_values(self):
        hosts = self.write("hosts", "h1\n")
        c = self.parse(["-n", "1", "-H", hosts, "--ssh-opts", "-i key -o 'A=b c'", "--server-cmd",
                        "-weird 'a b'", "--scheduler-cmd", "sched --x", "prog"])
        self.assertEqual(c.ssh_opts, ["-i", "key", "-o", "A=b c"])
        self.assertEqual(c.server_cmd, ["-weird", "a b"])
        self.assertEqual(c.scheduler_cmd, ["sched", "--x"])
        self.assertFalse(c.scheduler_reports_port)

    def test_default_binaries_and_port_mode(self):
        c = self.parse(["-n", "1", "prog"])
        bindir = os.path.join(self.tmp, "bin")
        self.assertEqual(c.server_cmd, [os.path.join(bindir, "ps-server")])
        self.assertEqual(c.scheduler_cmd, [os.path.join(bindir, "ps-scheduler")])
        self.assertTrue(c.scheduler_reports_port)
        c = self.parse(["-n", "1", "--same-cmd-for-all-roles", "prog", "x"])
        self.assertEqual(c.server_cmd, ["prog", "x"])
        self.assertEqual(c.scheduler_cmd, ["prog", "x"])
        self.assertFalse(c.scheduler_reports_port)

    def test_binary_search_order(self):
        # $PS_BIN_DIR first
        bindir = self.fake_bin_dir()
        self.assertEqual(launch.find_binary("ps-server", {"PS_BIN_DIR": bindir}, "/x/tools"),
                         os.path.join(bindir, "ps-server"))
        # then <repo>/build/bin for a launcher at <repo>/tools
        repo = os.path.join(self.tmp, "repo")
        self.fake_bin_dir(where=os.path.join(repo, "build", "bin"))
        self.assertEqual(launch.find_binary("ps-server", {}, os.path.join(repo, "tools")),
                         os.path.join(repo, "build", "bin", "ps-server"))
        # then next to launch.py, as installed in <prefix>/bin
        prefix_bin = self.fake_bin_dir(where=os.path.join(self.tmp, "prefix", "bin"))
        self.assertEqual(launch.find_binary("ps-scheduler", {}, prefix_bin),
                         os.path.join(prefix_bin, "ps-scheduler"))
        # then PATH
        self.assertEqual(launch.find_binary("ps-scheduler", {"PATH": prefix_bin}, "/x/tools"),
                         os.path.join(prefix_bin, "ps-scheduler"))
        self.assertIsNone(launch.find_binary("ps-scheduler", {"PATH": "/nonexistent"},
                                             "/x/tools"))

    def test_scheduler_address(self):
        self.assertEqual(launch.local_address_towards("127.0.0.2"), "127.0.0.1")
        self.assertTrue(launch.is_loopback("127.0.0.2"))
        self.assertTrue(launch.is_loopback("localhost"))
        self.assertFalse(launch.is_loopback("10.0.0.1"))
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1\n127.0.0.2\n")
        c = self.parse(["-n", "1", "-H", hosts, "prog"])
        self.assertEqual(launch.Launch(c).root_uri(), "127.0.0.1")
        c = self.parse(["-n", "1", "-H", hosts, "--scheduler-host", "127.0.0.2:22", "prog"])
        self.assertEqual(launch.Launch(c).root_uri(), "127.0.0.2")
        c = self.parse(["-n", "1", "-H", hosts, "prog"], DMLC_PS_ROOT_URI="sched.example")
        self.assertEqual(launch.Launch(c).root_uri(), "sched.example")
        # Hosts this machine cannot resolve (ssh config aliases, say): no guess such as
        # "localhost", which remote nodes would take for themselves, but the way to say it.
        self.assertIsNone(launch.local_address_towards("nosuch.invalid"))
        aliases = os.path.join(self.tmp, "aliases")
        with open(aliases, "w") as f:
            f.write("nosuch.invalid\nalso-nosuch.invalid\n")
        c = self.parse(["-n", "2", "-H", aliases, "prog"])
        with self.assertRaises(launch.UsageError) as cm:
            launch.Launch(c).root_uri()
        self.assertIn("none of nosuch.invalid, also-nosuch.invalid resolves", str(cm.exception))
        self.assertIn("--env DMLC_PS_ROOT_URI=ADDRESS", str(cm.exception))

    def test_missing_binaries(self):
        env = {"PATH": "/nonexistent"}
        with self.assertRaises(launch.UsageError) as cm:
            launch.parse_args(["-n", "1", "prog"], environ=env, cwd=self.tmp,
                              launcher_dir="/nonexistent/tools")
        self.assertIn("ps-server not found", str(cm.exception))
        self.assertIn("--server-cmd", str(cm.exception))
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1\n")
        with_ssh = launch.parse_args(["-n", "1", "-H", hosts, "prog"], environ=env, cwd=self.tmp,
                                     launcher_dir="/nonexistent/tools")
        self.assertEqual(with_ssh.server_cmd, ["ps-server"])  # the remote PATH's
        self.assertIn("not found locally", with_ssh.warnings[0])

    def test_synced_binaries_run_from_the_copy(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1\n")
        c = self.parse(["-n", "1", "-H", hosts, "--sync-dst-dir", "/remote/job",
                        os.path.join(self.tmp, "prog"), "/elsewhere/x"])
        la = launch.Launch(c)
        server, worker = la.make_specs("10.0.0.1", 9000)
        self.assertEqual(la.command_for(server), ["/remote/job/bin/ps-server"])
        self.assertEqual(la.command_for(worker), ["/remote/job/prog", "/elsewhere/x"])
        # the scheduler runs on the launching host: the original path
        sched = la.scheduler_spec("10.0.0.1", 0)
        self.assertEqual(la.command_for(sched), [os.path.join(self.tmp, "bin", "ps-scheduler")])

    def test_workers_learn_their_rank_and_local_rank(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1\nh2\n")
        la = launch.Launch(self.parse(["-n", "4", "-s", "2", "-H", hosts, "prog"]))
        workers = [s for s in la.make_specs("10.0.0.1", 9000) if s.role == "worker"]
        got = [(s.env["DMLC_NODE_HOST"], s.env["PS_RANK"], s.env["PS_LOCAL_RANK"]) for s in workers]
        # round-robin: ranks 0 and 2 on h1, 1 and 3 on h2; each host counts its own from 0
        self.assertEqual(got, [("h1", "0", "0"), ("h2", "1", "0"), ("h1", "2", "1"),
                               ("h2", "3", "1")])
        local = launch.Launch(self.parse(["-n", "3", "-s", "1", "prog"]))
        self.assertEqual([s.env.get("PS_LOCAL_RANK") for s in local.make_specs("127.0.0.1", 1)],
                         [None, "0", "1", "2"])  # the server has none; one host: the rank

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_server_hostfile(self):
        workers = self.write("workers", "w1\nw2 slots=2\n")
        servers = self.write("servers", "s1\ns2 slots=2\n")
        c = self.parse(["-n", "3", "-H", workers, "--server-hostfile", servers, "prog"])
        self.assertEqual(c.launcher, "ssh")
        self.assertEqual(names(c.server_hosts), ["s1", "s2"])
        self.assertEqual(c.num_servers, 3)  # default: the slots of the server hostfile
        self.assertEqual(c.warnings, [])
        la = launch.Launch(c)
        specs = la.make_specs("10.0.0.1", 9000)
        got = [(s.role, s.rank, s.env["DMLC_NODE_HOST"]) for s in specs]
        self.assertEqual(got, [("server", 0, "s1"), ("server", 1, "s2"), ("server", 2, "s2"),
                               ("worker", 0, "w1"), ("worker", 1, "w2"), ("worker", 2, "w2")])
        self.assertEqual([s.env["PS_LOCAL_RANK"] for s in specs if s.role == "worker"],
                         ["0", "0", "1"])
        self.assertEqual(sorted(h.name for h in la.sync_hosts()), ["s1", "s2", "w1", "w2"])
        c = self.parse(["-n", "2", "-s", "1", "-H", workers, "--server-hostfile", servers,
                        "prog"])
        self.assertEqual(c.num_servers, 1)
        # a host in both files: allowed, with a warning
        both = self.write("both", "w2\ns9\n")
        c = self.parse(["-n", "2", "-H", workers, "--server-hostfile", both, "prog"])
        self.assertIn("w2 in both -H and --server-hostfile", c.warnings[0])
        # the scheduler address: loopback only when every host of both files is loopback
        lo = self.write("lo", "127.0.0.1\n")
        c = self.parse(["-n", "1", "-H", lo, "--server-hostfile", self.write("lo2", "127.0.0.2\n"),
                        "prog"])
        self.assertEqual(launch.Launch(c).root_uri(), "127.0.0.1")
        for argv, want in [
                (["-n", "1", "--server-hostfile", servers, "prog"],
                 "--server-hostfile places the servers only: give the workers' hosts with -H"),
                (["-n", "1", "--launcher", "local", "--server-hostfile", servers, "prog"],
                 f"--server-hostfile {servers}: needs the ssh launcher (--launcher ssh"),
                (["-n", "1", "-s", "0", "-H", workers, "--server-hostfile", servers, "prog"],
                 "-s 0 with --server-hostfile"),
                (["-n", "1", "-H", workers, "--server-hostfile", "/nonexistent/s", "prog"],
                 "--server-hostfile /nonexistent/s: No such file"),
                (["-n", "1", "-H", workers, "--server-hostfile", self.write("bad", "s1 x=1\n"),
                  "prog"], "bad:1: unknown field 'x=1'")]:
            with self.subTest(argv=argv):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(argv)
                self.assertIn(want, str(cm.exception))

    def test_hostfile_encoding(self):
        # A byte-order mark (Windows editors write one) is not part of the first host's name.
        bom = os.path.join(self.tmp, "bom")
        with open(bom, "wb") as f:
            f.write(b"\xef\xbb\xbfh1\nh2\n")
        c = self.parse(["-n", "2", "-H", bom, "prog"])
        self.assertEqual(names(c.hosts), ["h1", "h2"])
        # UTF-16 (or any other encoding) is one line naming the file, not a traceback.
        utf16 = os.path.join(self.tmp, "utf16")
        with open(utf16, "wb") as f:
            f.write("h1\n".encode("utf-16"))
        for argv, want in [(["-n", "1", "-H", utf16, "prog"], f"-H {utf16}: not UTF-8 text"),
                           (["-n", "1", "-H", bom, "--server-hostfile", utf16, "prog"],
                            f"--server-hostfile {utf16}: not UTF-8 text")]:
            with self.subTest(argv=argv):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(argv)
                self.assertIn(want, str(cm.exception))

    def test_server_weights_follow_the_servers_hosts(self):
        # beside the workers: servers 0..3 on h0..h3, h3 at a quarter
        hosts = self.write("weighted", "h0\nh1\nh2\nh3 server_weight=0.25\n")
        la = launch.Launch(self.parse(["-n", "4", "-s", "4", "-H", hosts, "prog"]))
        specs = la.make_specs("10.0.0.1", 9000) + [la.scheduler_spec("10.0.0.1", 9000)]
        self.assertEqual({s.env["PS_SERVER_WEIGHTS"] for s in specs}, {"1,1,1,0.25"})
        # servers on hosts of their own: the server hostfile's weights count, by server rank
        servers = self.write("servers_w", "s1 server_weight=2\ns2\n")
        la = launch.Launch(self.parse(["-n", "2", "-s", "4", "-H", self.write("w", "w1\n"),
                                       "--server-hostfile", servers, "prog"]))
        self.assertEqual(la.make_specs("10.0.0.1", 9000)[0].env["PS_SERVER_WEIGHTS"],
                         "2,1,2,1")
        c = self.parse(["-n", "2", "-H", hosts, "--server-hostfile", servers, "prog"])
        self.assertIn("server_weight in the -H hostfile is ignored", c.warnings[-1])
        # no weight in the hostfile: the variable is not set
        la = launch.Launch(self.parse(["-n", "2", "-H", self.write("plain", "h0\nh1\n"),
                                       "prog"]))
        self.assertNotIn("PS_SERVER_WEIGHTS", la.make_specs("10.0.0.1", 9000)[0].env)
        with self.assertRaises(launch.UsageError) as cm:
            self.parse(["-n", "4", "-H", hosts, "--env", "PS_SERVER_WEIGHTS=1,1,1,1", "prog"])
        self.assertIn("give the weights one way", str(cm.exception))

    def test_failure_report_names_the_lost_host(self):
        hosts = self.write("hosts", "h1\nh2\nh3\n")
        err = io.StringIO()
        la = launch.Launch(self.parse(["-n", "3", "-s", "3", "-H", hosts, "prog"]), err=err)
        for spec in la.make_specs("10.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        by_label = {p.spec.label: p for p in la.procs}
        # every process on h3 lost its ssh connection (255) after its command ran: the host
        # is named
        by_label["server 2"].returncode = by_label["worker 2"].returncode = 255
        by_label["server 2"].child_pgid = by_label["worker 2"].child_pgid = 4242
        # ... and the scheduler declared worker 1 (on h2, still running here) dead
        by_label["server 0"].returncode = 1
        by_label["server 0"].lines.append("E... server 0: the job failed: worker 1 (node 5 at "
                                          "h2:4242) died (no heartbeat for over 20 s)")
        by_label["server 0"].lines.append("also server 2 (node 3 at h3:4000) died")
        failed = [by_label[k] for k in ("server 0", "server 2", "worker 2")]
        self.assertTrue(la.report_lost_hosts(failed))
        lines = err.getvalue().splitlines()
        self.assertEqual(lines, [
            "[launch] lost host h3: the ssh connections of all its processes (server 2, "
            "worker 2) ended with status 255 (its processes were killed, or the host, its sshd "
            "or the network to it failed)",
            "[launch] worker 1 at h2 was declared dead by the scheduler, but its process has "
            "not exited as far as the launcher sees: h2 or the network to it is down, or the "
            "network drops or queues its packets for longer than PS_HEARTBEAT_TIMEOUT"])
        def report_of(why):
            """The launcher's report when server 0's last line says worker 1 died `why`."""
            err.truncate(0)
            err.seek(0)
            by_label["server 0"].lines.clear()
            by_label["server 0"].lines.append(
                "E... server 0: the job failed: worker 1 (node 5 at h2:4242) died (no heartbeat "
                "for over 20 s (PS_HEARTBEAT_TIMEOUT), and its host acknowledges what the "
                f"scheduler sends it, {why} ...)")
            self.assertTrue(la.report_lost_hosts([by_label["server 0"]]))
            return err.getvalue()

        # the scheduler's probe was acknowledged by the node's host: the process is stuck there
        self.assertEqual(report_of("so the network carries packets both ways: the process is "
                                   "stopped").splitlines(), [
            "[launch] worker 1 at h2 was declared dead by the scheduler, but its process has "
            "not exited as far as the launcher sees: h2 acknowledges the scheduler's messages, "
            "so the process there is stopped (SIGSTOP), hung or starved of CPU"])
        # ... but over a lossy path that proves little: the network is named
        self.assertIn("h2 or the network to it is down, or the network drops or queues its "
                      "packets",
                      report_of("but what it sends back may be lost or held in a queue on the "
                                "way"))
        # a 255 on a host where another process still runs is not a lost host
        by_label["server 2"].returncode = None
        err.truncate(0)
        err.seek(0)
        self.assertFalse(la.report_lost_hosts([by_label["worker 2"]]))
        self.assertEqual(err.getvalue(), "")

    def test_failure_report_names_why_ssh_could_not_start_a_host(self):
        # No command ran on h2: ssh itself failed, and its own complaint is named with what
        # to do about it.
        hosts = self.write("hosts", "h1\nh2\n")
        err = io.StringIO()
        la = launch.Launch(self.parse(["-n", "2", "-s", "2", "-H", hosts, "prog"]), err=err)
        for spec in la.make_specs("10.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        there = [p for p in la.procs if p.spec.host is not None and p.spec.host.name == "h2"]
        for p in there:
            p.returncode = 255

        def report_of(*lines):
            err.truncate(0)
            err.seek(0)
            for p in there:
                p.lines.clear()
                p.lines.extend(lines)
            self.assertTrue(la.report_lost_hosts(there))
            return err.getvalue().strip()

        self.assertEqual(
            report_of("Connection timed out during banner exchange",
                      "Connection to h2 port 22 timed out"),
            "[launch] could not start server 1, worker 1 on host h2: ssh ended with status 255 "
            "before the command ran: Connection to h2 port 22 timed out: the host did not "
            "answer within ssh's ConnectTimeout (10 s): check that it is up and reachable, and "
            "on a path of a long round trip (a second or more) give ssh more time (--ssh-opts "
            "\"-o ConnectTimeout=60\")")
        self.assertIn("before the command ran: root@h2: Permission denied (publickey).: the host "
                      "refused ssh's keys", report_of("root@h2: Permission denied (publickey)."))
        self.assertIn("before the command ran: ssh: connect to host h2 port 22: Connection "
                      "refused: no sshd listens there",
                      report_of("ssh: connect to host h2 port 22: Connection refused"))
        # ssh said nothing the launcher knows: the status alone
        self.assertTrue(report_of("something else").endswith("before the command ran"))

    def test_culprit_is_a_process_that_failed_on_its_own(self):
        # Worker 0 exited first, but only with the job's failure the scheduler told it of;
        # worker 3 failed on its own (its link too slow): it is named first, then by role.
        hosts = self.write("hosts", "h1\nh2\nh3\nh4\n")
        la = launch.Launch(self.parse(["-n", "4", "-s", "4", "-H", hosts, "prog"]),
                           err=io.StringIO())
        for spec in la.make_specs("10.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        by_label = {p.spec.label: p for p in la.procs}
        relay = "E... worker 0: finished after the job ended: the job failed: worker 3 (...) failed"
        for t, (label, line) in enumerate([
                ("worker 0", relay),
                ("server 0", "E... server 0: the job failed: worker 3 (...) failed: lost ..."),
                ("server 3", "E... lost contact with the scheduler at h1:9000 for over 20 s"),
                ("worker 3", "ps-kvstore-check: error: dist kvstore: Init failed on every worker: "
                             "lost contact with the scheduler ...")]):
            by_label[label].returncode = 1
            by_label[label].exit_time = t
            by_label[label].lines.append(line)
        order = la.culprits_first([by_label[k] for k in
                                   ("server 0", "worker 0", "server 3", "worker 3")])
        self.assertEqual([p.spec.label for p in order],
                         ["worker 3", "server 3", "worker 0", "server 0"])

    def test_ssh_sessions_that_never_start_their_command_are_named(self):
        # An ssh that connected but whose session stalls (an MTU black hole: small packets
        # pass) never prints the wrapper's pid line: said once while waiting, and named as the
        # cause when the job fails (the scheduler gives up on the missing nodes).
        hosts = self.write("hosts", "h1\nh2\n")
        err = io.StringIO()
        la = launch.Launch(self.parse(["-n", "2", "-s", "2", "-H", hosts, "prog"]), err=err)
        for spec in la.make_specs("10.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        by_label = {p.spec.label: p for p in la.procs}
        for p in la.procs:
            p.child_pgid = 100
        for label in ("server 1", "worker 1"):  # on h2
            by_label[label].child_pgid = None
            by_label[label].started -= 45
        by_label["worker 0"].child_pgid = None  # on h1, just started: not yet worth a word
        by_label["worker 1"].started += 30  # on h2 too: named with the host's longer wait
        la.note_stalled_starts()
        la.note_stalled_starts()
        self.assertEqual(err.getvalue().splitlines(), [
            "[launch] server 1, worker 1 on h2: ssh has not started the command in 45 s; still "
            "waiting (the host or the network to it is slow or loses packets; the scheduler "
            "ends the job at PS_REGISTER_TIMEOUT if they never join)"])
        err.truncate(0)
        err.seek(0)
        by_label["server 0"].returncode = 1
        self.assertTrue(la.report_lost_hosts([by_label["server 0"]]))
        self.assertEqual(err.getvalue().splitlines(), [
            "[launch] server 1, worker 1 on h2: ssh has not started the command in 45 s, so "
            "they never joined the job: the connection opened but the session stalls (that "
            "host overloaded, or a network that loses big packets while small ones pass: an "
            "MTU mismatch)"])

    def test_failure_report_on_this_machine_names_the_process_state(self):
        # With the local launcher there is no network to blame for a node declared dead while
        # its process runs: the launcher looks at the process itself.
        err = io.StringIO()
        la = launch.Launch(self.parse(["-n", "2", "-s", "1", "--launcher", "local", "prog"]),
                           err=err)
        for spec in la.make_specs("127.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        by_label = {p.spec.label: p for p in la.procs}
        server = by_label["server 0"]
        server.returncode = 1
        server.lines.append("E... server 0: the job failed: worker 0 (node 4 at 127.0.0.1:4242) "
                            "died (no heartbeat for over 5 s)")
        stand_in = subprocess.Popen(["sleep", "60"])  # worker 0's process
        try:
            by_label["worker 0"].child_pgid = stand_in.pid
            stop_and_wait(stand_in.pid)
            self.assertTrue(la.report_lost_hosts([server]))
            os.kill(stand_in.pid, signal.SIGCONT)
            self.assertTrue(la.report_lost_hosts([server]))
        finally:
            stand_in.kill()
            stand_in.wait()
        lines = err.getvalue().splitlines()
        prefix = ("[launch] worker 0 at 127.0.0.1 was declared dead by the scheduler, but "
                  "its process has not exited: ")
        self.assertEqual(lines, [
            prefix + "it is stopped (SIGSTOP, Ctrl-Z or a debugger)",
            prefix + "it runs but sent no heartbeat (it hangs, or the machine is too busy for "
            "it to answer)"])

    def test_failure_report_names_a_stopped_scheduler(self):
        # Its nodes fail first (they gave up on its silence); the launcher names the cause.
        err = io.StringIO()
        la = launch.Launch(self.parse(["-n", "1", "-s", "1", "--launcher", "local", "prog"]),
                           err=err)
        scheduler = launch.Proc(la.scheduler_spec("127.0.0.1", 9000), None)
        la.procs.append(scheduler)
        for spec in la.make_specs("127.0.0.1", 9000):
            la.procs.append(launch.Proc(spec, None))
        worker = next(p for p in la.procs if p.spec.label == "worker 0")
        worker.returncode = 1
        stand_in = subprocess.Popen(["sleep", "60"])  # the scheduler's process
        try:
            scheduler.child_pgid = stand_in.pid
            self.assertFalse(la.report_lost_hosts([worker]))  # running: nothing to say
            stop_and_wait(stand_in.pid)
            self.assertTrue(la.report_lost_hosts([worker]))
        finally:
            stand_in.kill()
            stand_in.wait()
        self.assertEqual(err.getvalue().splitlines(), [
            "[launch] the scheduler on localhost is stopped (SIGSTOP, Ctrl-Z or a debugger): "
            "the nodes gave up waiting for it"])

    def test_ssh_only_options_are_refused_with_the_local_launcher(self):
        hosts = self.write("hosts", "h1\n")
        ssh_only = [(["-H", hosts], f"-H {hosts}"),
                    (["--server-hostfile", hosts], f"--server-hostfile {hosts}"),
                    (["--sync-dst-dir", "/remote/job"], "--sync-dst-dir /remote/job"),
                    (["--ssh-opts", "-i key"], "--ssh-opts '-i key'"),
                    (["--scheduler-host", "h1"], "--scheduler-host h1")]
        for args, named in ssh_only:
            with self.subTest(args=args):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(["-n", "1", "--launcher", "local"] + args + ["prog"])
                self.assertEqual(str(cm.exception), f"{named}: needs the ssh launcher (--launcher "
                                 "ssh, the default with -H HOSTFILE); --launcher local runs "
                                 "every process on this machine")
        # without --launcher, -H and --server-hostfile choose ssh; the others are refused
        for args, named in ssh_only[2:]:
            with self.subTest(args=args, launcher=None):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(["-n", "1"] + args + ["prog"])
                self.assertIn(f"{named}: needs the ssh launcher", str(cm.exception))
                self.assertIn("the local launcher (the default without -H)", str(cm.exception))
        c = self.parse(["-n", "1", "-H", hosts, "--sync-dst-dir", "/remote/job", "--ssh-opts",
                        "-i key", "--scheduler-host", "h1", "prog"])
        self.assertEqual((c.launcher, c.sync_dst_dir, c.ssh_opts), ("ssh", "/remote/job",
                                                                     ["-i", "key"]))

    def test_ps_bin_dir_passed_over_is_named(self):
        fallback = self.fake_bin_dir(where=os.path.join(self.tmp, "fallback"))

        def parse(bin_dir, argv=("-n", "1", "prog"), path=fallback):
            return launch.parse_args(list(argv), environ={"PATH": path, "PS_BIN_DIR": bin_dir},
                                     cwd=self.tmp, launcher_dir="/nonexistent/t")

        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        half = os.path.join(self.tmp, "half")
        os.makedirs(half)
        os.symlink(os.path.join(fallback, "ps-scheduler"), os.path.join(half, "ps-scheduler"))
        relative = os.path.join("no", "such", "bin")
        for bin_dir, argv, want in [
                ("/nonexistent/bin", ("-n", "1", "prog"), "PS_BIN_DIR=/nonexistent/bin: no such "
                 f"directory; using ps-server and ps-scheduler from {fallback} instead"),
                (relative, ("-n", "1", "prog"), f"PS_BIN_DIR={relative}: no such directory "
                 f"({os.path.abspath(relative)}); using ps-server and ps-scheduler from "
                 f"{fallback} instead"),
                (empty, ("-n", "1", "prog"), f"PS_BIN_DIR={empty}: no ps-server, ps-scheduler "
                 f"there; using ps-server and ps-scheduler from {fallback} instead"),
                (half, ("-n", "1", "prog"), f"PS_BIN_DIR={half}: no ps-server there; using "
                 f"ps-server from {fallback} instead"),
                ("/nonexistent/bin", ("-n", "1", "--server-cmd", "srv", "prog"),
                 "PS_BIN_DIR=/nonexistent/bin: no such directory; using ps-scheduler from "
                 f"{fallback} instead")]:
            with self.subTest(bin_dir=bin_dir, argv=argv):
                self.assertEqual(parse(bin_dir, argv).warnings, [want])
        c = parse(half)
        self.assertEqual((c.server_cmd, c.scheduler_cmd),
                         ([os.path.join(fallback, "ps-server")],
                          [os.path.join(half, "ps-scheduler")]))  # the search order is kept
        self.assertEqual(parse(fallback).warnings, [])
        # found nowhere: the error (local) or warning (ssh) names PS_BIN_DIR's value
        with self.assertRaises(launch.UsageError) as cm:
            parse("/nonexistent/bin", path="/nonexistent")
        self.assertIn("ps-server not found in $PS_BIN_DIR, the build (build/bin), next to "
                      "launch.py or in PATH (PS_BIN_DIR=/nonexistent/bin: no such directory)",
                      str(cm.exception))
        c = parse(half, ("-n", "1", "-H", self.write("hosts", "h1\n"), "prog"),
                  path="/nonexistent")
        self.assertEqual(c.warnings, [f"ps-server not found locally (PS_BIN_DIR={half}: no "
                                      "ps-server there); running 'ps-server' from the PATH of "
                                      "each host"])

    def test_repeated_single_valued_options_are_refused(self):
        with self.assertRaises(launch.UsageError) as cm:
            self.parse(["-n", "1", "--num-workers", "2", "prog"])
        self.assertEqual(str(cm.exception), "-n/--num-workers given twice (-n 1, then "
                         "--num-workers 2): it takes one value; give it once")
        # every option of one value: -n, -s, --launcher, -H, --ssh-opts, the timeouts ...
        once = [a for a in launch.build_parser()._actions
                if isinstance(a, launch.Once) and a.option_strings]
        self.assertTrue({"-n", "-s", "--launcher", "-H", "--ssh-opts", "--startup-timeout",
                         "--server-restarts"} <= {a.option_strings[0] for a in once})
        for action in once:
            flag = action.option_strings[0]
            value = action.choices[0] if action.choices else "1"
            with self.subTest(flag=flag):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(["-n", "1", flag, value, flag, value, "prog"])
                self.assertIn(f"given twice ({flag} ", str(cm.exception))
        # repeatable options and flags stay so
        c = self.parse(["-q", "-q", "-n", "1", "--env", "A=1", "--env", "B=2", "--env-worker",
                        "C=3", "--env-worker", "D=4", "prog"])
        self.assertEqual((c.env_all, c.env_role["worker"], c.quiet),
                         ({"A": "1", "B": "2"}, {"C": "3", "D": "4"}, True))

    def test_counts_within_the_nodes_bounds(self):
        c = self.parse(["-n", "65536", "prog"])
        self.assertEqual((c.num_workers, c.num_servers), (65536, 65536))
        big = self.write("big", "s1 slots=65537\n")
        for argv, want in [
                (["-n", "100000", "prog"], "-n 100000: a job takes 1 to 65536 workers; -s was "
                 "not given and defaults to -n, so the job would have 100000 servers too"),
                (["-n", "100000", "-s", "1", "prog"], "-n 100000: a job takes 1 to 65536 "
                 "workers"),
                (["-n", "2", "-s", "65537", "prog"], "-s 65537: a job takes 1 to 65536 servers"),
                (["-n", "1", "-H", self.write("w", "w1\n"), "--server-hostfile", big, "prog"],
                 "-s 65537: a job takes 1 to 65536 servers (-s was not given: it defaults to "
                 f"the slots in --server-hostfile {big})")]:
            with self.subTest(argv=argv):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(argv)
                self.assertEqual(str(cm.exception), want)
        # the bound is the nodes' own, on DMLC_NUM_WORKER and DMLC_NUM_SERVER
        with open(os.path.join(REPO, "ps", "src", "config.cc")) as f:
            config = f.read()
        for var in ("DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
            self.assertIn(f'ReadInt(lookup, "{var}", 1, {launch.MAX_ROLE_COUNT},', config)

    def test_root_port_and_uri_overrides(self):
        c = self.parse(["-n", "1", "--env", "DMLC_PS_ROOT_PORT=9100", "--env",
                        "DMLC_PS_ROOT_URI=10.1.2.3", "prog"], DMLC_PS_ROOT_PORT="9200")
        self.assertEqual((c.user_root_port, c.user_root_uri), (9100, "10.1.2.3"))
        self.assertNotIn("DMLC_PS_ROOT_PORT", c.env_all)
        c = self.parse(["-n", "1", "prog"], DMLC_PS_ROOT_PORT="9200")
        self.assertEqual(c.user_root_port, 9200)

    def test_usage_errors(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1\n")
        for argv, want in [
                (["-n", "0", "prog"], "-n 0: a job takes 1 to 65536 workers"),
                (["-n", "1", "-s", "-1", "prog"], "-s -1: a job takes 1 to 65536 servers"),
                (["-n", "1", "-s", "0", "prog"], "-s 0: a job takes 1 to 65536 servers"),
                (["-n", "1"], "no worker command"),
                (["-n", "1", "--launcher", "ssh", "prog"], "needs -H HOSTFILE"),
                (["-n", "1", "-H", "/nonexistent/hosts", "prog"], "No such file"),
                (["-n", "1", "-H", hosts, "--ssh-opts", "-n", "prog"], "-n cannot be used"),
                (["-n", "1", "--scheduler-host", "h", "prog"], "needs the ssh launcher"),
                (["-n", "1", "--same-cmd-for-all-roles", "--server-cmd", "x", "prog"],
                 "conflicts"),
                (["-n", "1", "--same-cmd-for-all-roles", "--scheduler-cmd", "", "prog"],
                 "conflicts"),
                (["-n", "1", "--server-cmd", "", "prog"],
                 "--server-cmd: empty command: give the ps-server command line"),
                (["-n", "1", "--scheduler-cmd", " ", "prog"],
                 "--scheduler-cmd: empty command"),
                (["-n", "1", "--env", "DMLC_PS_ROOT_PORT=http", "prog"], "want a port"),
                (["-n", "1", "-s", "2", "--server-restarts", "-1", "prog"], "want 0 or more"),
                (["-n", "1", "-s", "1", "--server-restarts", "1", "prog"],
                 "--server-restarts needs replication"),
                (["-n", "1", "-s", "2", "--env", "PS_REPLICATION=0", "--server-restarts", "1",
                  "prog"], "--server-restarts needs replication")]:
            with self.subTest(argv=argv):
                with self.assertRaises(launch.UsageError) as cm:
                    self.parse(argv)
                self.assertIn(want, str(cm.exception))


class Drain(LauncherTest):
    """Launch.drain: shows exited processes' output to its end, within bounds. The lines come
    from a feeder thread through the launcher's own event queue, as the readers' would."""

    parse = Args.parse

    def setUp(self):
        super().setUp()
        self.err = io.StringIO()
        self.la = launch.Launch(self.parse(["-n", "2", "-s", "1", "--launcher", "local", "prog"]),
                                out=io.StringIO(), err=self.err)
        for spec in self.la.make_specs("127.0.0.1", 9000):
            p = launch.Proc(spec, None)
            p.returncode = 0  # exited: pump reaps nothing
            self.la.procs.append(p)
        self.by_label = {p.spec.label: p for p in self.la.procs}
        self.stop_feeding = threading.Event()
        self.feeders = []

    def tearDown(self):
        self.stop_feeding.set()
        for t in self.feeders:
            t.join(timeout=10)
        super().tearDown()

    def feed(self, p, count, every=0.002):
        """Queues up to `count` lines of `p`, one per `every` s, until the test ends."""
        def run():
            for i in range(count):
                if self.stop_feeding.wait(every):
                    return
                self.la.events.put((p, f"line {i}"))
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.feeders.append(t)

    def timed_drain(self, procs, quiet):
        t0 = time.monotonic()
        self.la.drain(procs, quiet=quiet)
        return time.monotonic() - t0

    def test_a_process_that_keeps_printing_is_shown_for_the_limit_then_counted(self):
        worker = self.by_label["worker 0"]
        self.feed(worker, 20000)  # 40 s of lines: far past the limit below
        limit = 0.5
        saved, launch.DRAIN_LIMIT_S = launch.DRAIN_LIMIT_S, limit
        try:
            took = self.timed_drain([worker], quiet=5.0)
        finally:
            launch.DRAIN_LIMIT_S = saved
        self.assertGreaterEqual(took, limit)
        self.assertLess(took, 10)
        self.assertGreater(worker.lines_seen, 0)
        self.assertRegex(self.err.getvalue(),
                         r"stopped showing the processes' output after 0\.5 s: about \d+ "
                         r"line\(s\) more were not shown")

    def test_the_quiet_timer_counts_only_the_drained_processes_lines(self):
        # worker 1 keeps printing; worker 0, the one drained, is silent and never sends EOF:
        # the drain ends after `quiet`, not at the limit.
        self.feed(self.by_label["worker 1"], 20000)
        took = self.timed_drain([self.by_label["worker 0"]], quiet=0.3)
        self.assertGreaterEqual(took, 0.3)
        self.assertLess(took, 10)
        self.assertNotIn("stopped showing", self.err.getvalue())

    def test_every_line_up_to_eof_is_shown(self):
        worker = self.by_label["worker 0"]
        for i in range(500):
            self.la.events.put((worker, f"line {i}"))
        self.la.events.put((worker, None))  # EOF
        took = self.timed_drain([worker], quiet=5.0)
        self.assertLess(took, 4.0)  # at EOF, not after the quiet 5 s
        self.assertTrue(worker.eof)
        self.assertEqual(worker.lines_seen, 500)
        self.assertIn("[worker 0] line 499\n", self.la.out.getvalue())

    def test_a_signal_ends_the_drain_at_once(self):
        worker = self.by_label["worker 0"]
        self.feed(worker, 20000)
        timer = threading.Timer(0.2, self.la.on_signal, args=(signal.SIGINT, None))
        timer.start()
        try:
            took = self.timed_drain([worker], quiet=5.0)
        finally:
            timer.cancel()
        self.assertLess(took, 5.0)
        self.assertEqual(self.la.signal_received, signal.SIGINT)


class RemoteCommand(LauncherTest):
    """The command line sent to a remote host, run through a local POSIX shell as the remote
    login shell would: every value and word must arrive unchanged."""

    ODD = ["plain", "a b", "\"dq\"", "'sq'", "$HOME", "`id`", "$(id)", ";", "&&", "|", "*",
           "~", "\\", "\\n", "é", "tab\there", "new\nline", "", "-dash", "x=y"]

    def test_remote_string_survives_a_shell(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("h1:2222\n")
        c = self.parse(["-n", "1", "-s", "1", "-H", hosts, "--ssh-opts", "-i k",
                        "--env", "T_ODD=" + " ".join(self.ODD), "--env-worker", "T_W=it's"]
                       + [PY, "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], "
                                    "{k: v for k, v in os.environ.items() "
                                    "if k.startswith(('T_', 'DMLC_', 'PS_JOB'))}]))"]
                       + self.ODD)
        la = launch.Launch(c)
        spec, = [s for s in la.make_specs("10.0.0.1", 9999) if s.role == "worker"]
        argv, _ = la.argv_for(spec)
        self.assertEqual(argv[:3], ["ssh", "-p", "2222"])
        self.assertEqual(argv[3:5], ["-i", "k"])
        self.assertEqual(argv[-2], "h1")
        # stdin stays open, as ssh's does while the launcher runs (EOF would stop the command)
        proc = subprocess.Popen(["bash", "-c", argv[-1]], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        timer = threading.Timer(30, proc.kill)  # bounded, whatever happens
        timer.start()
        try:
            proc.stdin.write(c.job_secret + "\n")  # as Launch.start does, through ssh
            proc.stdin.flush()
            stdout = proc.stdout.read()
            self.assertEqual(proc.wait(timeout=30), 0, stdout)
        finally:
            timer.cancel()
            proc.stdin.close()
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = [ln for ln in stdout.splitlines() if not ln.startswith("@@ps-launch")]
        words, env = json.loads(lines[0])
        self.assertEqual(words, self.ODD)
        self.assertEqual(env["T_ODD"], " ".join(self.ODD))
        self.assertEqual(env["T_W"], "it's")
        self.assertEqual(env["DMLC_ROLE"], "worker")
        self.assertEqual(env["DMLC_NODE_HOST"], "h1")
        self.assertEqual(env["DMLC_PS_ROOT_URI"], "10.0.0.1")
        self.assertEqual(env["DMLC_PS_ROOT_PORT"], "9999")
        self.assertEqual(env["PS_JOB_SECRET"], c.job_secret)
        self.assertNotIn(c.job_secret, " ".join(argv))

    parse = Args.parse


class CommandLine(LauncherTest):

    def run_cmd(self, args, env=None):
        return subprocess.run([PY, LAUNCH] + args, capture_output=True, text=True, timeout=30,
                              env=env or self.env(), cwd=self.tmp, stdin=subprocess.DEVNULL)

    def test_help(self):
        r = self.run_cmd(["--help"])
        self.assertEqual(r.returncode, 0)
        for flag in ("--num-workers", "--num-servers", "--hostfile", "--launcher",
                     "--sync-dst-dir", "--env", "--env-server", "--env-worker", "--server-cmd",
                     "--scheduler-cmd", "--same-cmd-for-all-roles", "--ssh-opts", "--dry-run",
                     "--quiet", "--scheduler-host", "--interface", "--server-hostfile"):
            self.assertIn(flag, r.stdout)
        # The hostfile's forms, user@host included (docs/launcher.md).
        self.assertIn("[user@]host[:sshport] [slots=N]", " ".join(r.stdout.split()))

    def test_help_states_the_exit_status_rule(self):
        # as docs/launcher.md, "Ending and exit status": with replication, a server whose
        # death the job survived does not make the status non-zero
        text = " ".join(self.run_cmd(["--help"]).stdout.split())
        self.assertNotIn("only when every process ended cleanly", text)
        self.assertIn("Exit status 0 only when every process exited 0, except a server whose "
                      "death the job survived with replication (PS_REPLICATION", text)

    def test_a_program_that_cannot_run_is_refused_before_the_job_starts(self):
        # The shell's own error came once the scheduler and servers ran, and named no fix.
        with open(os.path.join(self.tmp, "script.sh"), "w") as f:
            f.write("#!/bin/sh\n")
        os.mkdir(os.path.join(self.tmp, "adir"))
        env = self.env(PS_BIN_DIR=self.fake_bin_dir())
        for cmd, want in [(["./script.sh"], "the worker command cannot run: ./script.sh is not "
                                            "executable: chmod +x ./script.sh, or put its "
                                            "interpreter first"),
                          (["./absent"], f"./absent does not exist (relative to {self.tmp})"),
                          (["no-such-program-here"], "no-such-program-here is not found in PATH"),
                          (["./adir"], "./adir is a directory, not a program"),
                          (["--server-cmd", "/nonexistent/ps-server", "true"],
                           "the server command cannot run: /nonexistent/ps-server does not "
                           "exist: check the path")]:
            with self.subTest(cmd=cmd):
                r = self.run_cmd(["-n", "1"] + cmd, env=env)
                self.assertEqual(r.returncode, 2, r)
                self.assertIn(want, r.stderr)
                self.assertNotIn("[scheduler]", r.stderr)  # nothing was started

    def test_ipv6_host_needs_an_interface(self):
        # The nodes speak IPv4: an IPv6 address as DMLC_NODE_HOST fails on every node.
        hosts = os.path.join(self.tmp, "hosts6")
        with open(hosts, "w") as f:
            f.write("[fe80::1]:22\n")
        r = self.run_cmd(["-n", "1", "-H", hosts, "--dry-run", "true"])
        self.assertEqual(r.returncode, 2, r)
        self.assertIn(f"{hosts}: fe80::1 is an IPv6 address, and the job's nodes speak IPv4",
                      r.stderr)
        self.assertIn("add -i IFACE", r.stderr)
        r = self.run_cmd(["-n", "1", "-H", hosts, "-i", "eth0", "--env",
                          "DMLC_PS_ROOT_URI=198.18.0.1", "--dry-run", "true"])
        self.assertEqual(r.returncode, 0, r)

    def test_usage_error_exit_2(self):
        r = self.run_cmd(["-n", "0", "prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("error: -n 0: a job takes 1 to 65536 workers", r.stderr)
        r = self.run_cmd(["prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("required: -n", r.stderr)
        # A timeout that could never end (nan, inf) or never begin (0, -1): refused, nothing run.
        for flag in ("--startup-timeout", "--shutdown-timeout"):
            for value, want in [("nan", "want a number of seconds above 0"),
                                ("inf", "want a number of seconds above 0"),
                                ("0", "want a number of seconds above 0"),
                                ("-1", "want a number of seconds above 0"),
                                ("soon", "is not a number of seconds")]:
                with self.subTest(flag=flag, value=value):
                    r = self.run_cmd(["-n", "1", f"{flag}={value}", "prog"])
                    self.assertEqual(r.returncode, 2)
                    self.assertIn(f"argument {flag}: ", r.stderr)
                    self.assertIn(want, r.stderr)

    def test_executable_with_shebang(self):
        self.assertTrue(os.access(LAUNCH, os.X_OK))
        with open(LAUNCH) as f:
            self.assertEqual(f.readline().strip(), "#!/usr/bin/env python3")

    def test_dry_run_local_prints_and_starts_nothing(self):
        bindir = self.fake_bin_dir()
        r = self.run_cmd(["--dry-run", "-n", "2", "-s", "1", "--env", "T_A=x y"]
                         + self.fake_cmd(), env=self.env(PS_BIN_DIR=bindir))
        self.assertEqual(r.returncode, 0, r)
        comments = [ln for ln in r.stdout.splitlines() if ln.startswith("# [")]
        self.assertEqual([c.split("]")[0] + "]" for c in comments],
                         ["# [scheduler]", "# [server 0]", "# [worker 0]", "# [worker 1]"])
        self.assertIn("DMLC_PS_ROOT_PORT=0", comments[0])
        self.assertIn(f"{bindir}/ps-scheduler", comments[0])
        self.assertIn("DMLC_ROLE=worker", comments[2])
        self.assertIn("T_A='x y'", r.stdout)
        self.assertIn("<port reported by the scheduler>", comments[2])
        self.assertEqual(self.records(), [])

    def test_dry_run_ssh_shows_rsync_and_ssh(self):
        hosts = os.path.join(self.tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("10.9.9.1:2222\n10.9.9.2 slots=2\n")
        r = self.run_cmd(["--dry-run", "-n", "2", "-s", "2", "-H", hosts, "--sync-dst-dir",
                          "/scratch/job", "--ssh-opts", "-i key", "--env",
                          "DMLC_PS_ROOT_PORT=9123", "--env", "DMLC_PS_ROOT_URI=10.9.9.100",
                          "--same-cmd-for-all-roles", "python3",
                          "train.py"])
        self.assertEqual(r.returncode, 0, r)
        out = r.stdout.splitlines()
        rsyncs = [shlex.split(ln) for ln in out if ln.startswith("rsync ")]
        self.assertEqual(len(rsyncs), 2)
        self.assertEqual(rsyncs[0][-1], "10.9.9.1:/scratch/job/")
        self.assertIn("-p 2222", rsyncs[0][3])
        sshs = [shlex.split(ln) for ln in out if ln.startswith("ssh ")]
        self.assertEqual([s[-2] for s in sshs],
                         ["10.9.9.1", "10.9.9.2", "10.9.9.2", "10.9.9.1"])
        self.assertTrue(all("DMLC_PS_ROOT_PORT=9123" in s[-1] for s in sshs))
        self.assertTrue(all("DMLC_PS_ROOT_URI=10.9.9.100" in s[-1] for s in sshs))
        self.assertIn("# [scheduler] on localhost", r.stdout)
        self.assertEqual(self.records(), [])

    def test_dry_run_servers_on_their_own_hosts(self):
        workers = os.path.join(self.tmp, "workers")
        servers = os.path.join(self.tmp, "servers")
        with open(workers, "w") as f:
            f.write("10.9.9.1\n10.9.9.2\n")
        with open(servers, "w") as f:
            f.write("10.9.9.11\n10.9.9.12\n")
        r = self.run_cmd(["--dry-run", "-n", "4", "-H", workers, "--server-hostfile", servers,
                          "--env", "DMLC_PS_ROOT_URI=10.9.9.100", "--same-cmd-for-all-roles",
                          "python3", "train.py"])
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("2 server(s), 4 worker(s); servers on --server-hostfile hosts, workers "
                      "on -H hosts", r.stdout)
        where = re.findall(r"^# \[(\w+ \d)\] on (\S+) ", r.stdout, re.M)
        self.assertEqual(where, [("server 0", "10.9.9.11"), ("server 1", "10.9.9.12"),
                                 ("worker 0", "10.9.9.1"), ("worker 1", "10.9.9.2"),
                                 ("worker 2", "10.9.9.1"), ("worker 3", "10.9.9.2")])


if __name__ == "__main__":
    unittest.main()
