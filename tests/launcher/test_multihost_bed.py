"""tools/testbed.py itself: hosts as network namespaces, isolation, shaped links, teardown.

Needs root and `ip netns` (ctest label `multihost`; exits 77, "skipped", otherwise). Every bed
is removed by the test, also when it fails (bed_testlib).
"""
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from bed_testlib import (LIVE_BEDS, PY, TESTBED, Bed, bed_unavailable, main, namespaces_of,
                         testbed, wait_for)
from launcher_testlib import is_alive

SKIP = bed_unavailable()


def root_links():
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in r.stdout.splitlines())


def root_routes():
    r = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True,
                       check=True)
    return sorted(r.stdout.splitlines())


@unittest.skipIf(SKIP, SKIP)
class BedLifecycle(unittest.TestCase):

    def make(self, hosts, *args):
        bed = Bed(hosts, args)
        self.addCleanup(bed.down)
        return bed

    def assert_gone(self, bed, sshd_pids):
        self.assertEqual(namespaces_of(bed.id), [])
        for pid, start in sshd_pids:
            self.assertFalse(is_alive(pid, start), f"sshd {pid} still running")
        self.assertFalse(os.path.exists(os.path.join(bed.state_dir, bed.id)))

    def test_hosts_are_isolated_namespaces_on_a_bridge(self):
        links_before, routes_before = root_links(), root_routes()
        bed = self.make(3)
        st = bed.state
        # names carry the prefix and the bed id; interface names fit IFNAMSIZ
        self.assertRegex(bed.id, r"^[a-z0-9]{1,6}$")
        self.assertEqual(sorted(namespaces_of(bed.id)),
                         sorted([f"psbed-{bed.id}-sw"] + [f"psbed-{bed.id}-h{i}" for i in
                                                           range(3)]))
        for h in bed.hosts:
            for name in (h["if_host"], h["if_switch"]):
                self.assertTrue(name.startswith(f"pb{bed.id}") and len(name) <= 15, name)
        # addresses from 198.18.0.0/15, one per host, each on its own host only
        subnet = ipaddress.ip_network(st["subnet"])
        self.assertTrue(subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15")))
        for i, h in enumerate(bed.hosts):
            self.assertEqual(h["addr"], str(subnet.network_address + 1 + i))
            r = subprocess.run(["ip", "-n", h["ns"], "-j", "-4", "addr", "show"],
                               capture_output=True, text=True, check=True)
            addrs = sorted(a["local"] for link in json.loads(r.stdout)
                           for a in link["addr_info"])
            self.assertEqual(addrs, ["127.0.0.1", h["addr"]])
            # no route out: only the bed's subnet; anything else is unreachable at once
            r = subprocess.run(["ip", "-n", h["ns"], "-4", "route", "show"],
                               capture_output=True, text=True, check=True)
            self.assertEqual([ln.split()[0] for ln in r.stdout.splitlines()], [str(subnet)])
            r = subprocess.run(["ip", "-n", h["ns"], "route", "get", "192.0.2.1"],
                               capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("unreachable", r.stderr)
        # the switch: a bridge with one port per host and no address at all
        r = subprocess.run(["ip", "-n", bed.switch_ns, "-j", "link", "show"],
                           capture_output=True, text=True, check=True)
        links = json.loads(r.stdout)
        ports = sorted(ln["ifname"] for ln in links if ln.get("master") == st["bridge"])
        self.assertEqual(ports, sorted(h["if_switch"] for h in bed.hosts))
        r = subprocess.run(["ip", "-n", bed.switch_ns, "-j", "-4", "addr", "show"],
                           capture_output=True, text=True, check=True)
        self.assertEqual([a["local"] for ln in json.loads(r.stdout) for a in ln["addr_info"]],
                         ["127.0.0.1"])
        # this machine's own namespace is untouched
        self.assertEqual(root_links(), links_before)
        self.assertEqual(root_routes(), routes_before)
        # ssh from h2 reaches each host's own stack: a different network namespace per host,
        # with that host's address (the remote command runs there, under its sshd)
        seen = {}
        for h in bed.hosts:
            r = bed.run_on("h2", ["ssh", "-F", st["ssh_config"], h["addr"],
                                  "readlink /proc/self/ns/net; ip -4 -o addr show"])
            self.assertEqual(r.returncode, 0, r.stderr)
            netns = r.stdout.splitlines()[0]
            self.assertIn(f"inet {h['addr']}/", r.stdout)
            seen[h["name"]] = netns
        self.assertEqual(len(set(seen.values())), 3, seen)
        self.assertNotIn(os.readlink("/proc/self/ns/net"), seen.values())
        # down removes exactly what up made
        sshds = [(h["sshd_pid"], h["sshd_start"]) for h in bed.hosts]
        self.assertTrue(all(is_alive(p, s) for p, s in sshds))
        self.assertEqual(bed.down(), "")
        self.assert_gone(bed, sshds)
        self.assertEqual(root_links(), links_before)
        self.assertEqual(root_routes(), routes_before)

    def measure(self, bed, src, dst, both=False, seconds=1.5):
        args = ["measure", bed.id, src, dst, "--json", "--seconds", str(seconds)]
        r = bed.tool(*(args + (["--both"] if both else [])), timeout=90)
        return {(m["from"], m["to"]): m["mbit_per_s"] for m in json.loads(r.stdout)}

    def test_links_are_shaped_both_ways_full_duplex(self):
        bed = self.make(3, "--rate", "200mbit", "--link", "h2=50mbit")
        # tc on both ends of every link: HTB at the rate on the host's and the switch's end
        for h in bed.hosts:
            want = "50Mbit" if h["name"] == "h2" else "200Mbit"
            for ns, dev in ((h["ns"], h["if_host"]), (bed.switch_ns, h["if_switch"])):
                r = subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev],
                                   capture_output=True, text=True, check=True)
                self.assertRegex(r.stdout, rf"htb 1:1 root .*rate {want} ceil {want}", r.stdout)
        # full duplex: both directions at once, each near the rate
        got = self.measure(bed, "h0", "h1", both=True, seconds=2)
        for pair, mbit in got.items():
            self.assertGreater(mbit, 0.7 * 200, got)
            self.assertLess(mbit, 1.05 * 200, got)
        self.assertGreater(sum(got.values()), 1.5 * 200, got)
        # h2's link limits both its upload (its own end) and its download (the switch's end)
        up = self.measure(bed, "h2", "h0")[("h2", "h0")]
        down = self.measure(bed, "h0", "h2")[("h0", "h2")]
        for mbit in (up, down):
            self.assertGreater(mbit, 0.7 * 50, (up, down))
            self.assertLess(mbit, 1.05 * 50, (up, down))
        # shape a live bed: h2 to 100mbit
        bed.tool("shape", bed.id, "h2", "--rate", "100mbit")
        up = self.measure(bed, "h2", "h0")[("h2", "h0")]
        self.assertGreater(up, 0.7 * 100)
        self.assertLess(up, 1.05 * 100)
        info = json.loads(bed.tool("info", bed.id, "--json").stdout)
        self.assertEqual(info["hosts"][2]["rate_bit"], 100 * 10**6)
        # a link far slower than the transfer's 1 MiB sends still gives a figure in its window
        # (a 64 KiB lump of HTB's burst passes at once, so a short window reads high)
        bed.tool("shape", bed.id, "h2", "--rate", "100kbit")
        slow = self.measure(bed, "h0", "h2", seconds=2)[("h0", "h2")]
        self.assertGreater(slow, 0.05, slow)
        self.assertLess(slow, 2, slow)

    def test_delay(self):
        method = testbed.delay_method()
        if method is None:
            # neither netem nor a delay line: asking for a delay is a clear error, nothing made
            d = self.temp_state_dir()
            before = testbed.netns_list()
            r = subprocess.run([PY, TESTBED, "--state-dir", d, "up", "-n", "2", "--delay", "5ms"],
                               capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("netem", r.stderr)
            self.assertIn("--delay 0", r.stderr)
            self.assertEqual(testbed.netns_list(), before)
            self.assertEqual([n for n in os.listdir(d) if not n.startswith(".")], [])
            return
        bed = self.make(3, "--delay", "5ms", "--rate", "100mbit")

        def rtt(src, dst):
            r = bed.tool("measure", bed.id, src, dst, "--json", "--seconds", "0.5", timeout=60)
            return json.loads(r.stdout)[0]

        # a round trip crosses each of the two links twice, each way delayed 5 ms; the rate
        # still holds through the delay
        got = rtt("h0", "h1")
        self.assertGreater(got["rtt_ms_median"], 19.0)
        self.assertLess(got["rtt_ms_median"], 40.0)
        self.assertGreater(got["mbit_per_s"], 0.5 * 100)
        self.assertLess(got["mbit_per_s"], 1.05 * 100)
        # a live change: h2's link undelayed, so h2 <-> h0 crosses only h0's delay
        bed.tool("shape", bed.id, "h2", "--delay", "0")
        got = rtt("h2", "h0")["rtt_ms_median"]
        self.assertGreater(got, 9.5)
        self.assertLess(got, 19.0)
        if method != "nfqueue":
            return
        # without netem: a delay line per host, which `kill` spares (it is the link's) and
        # an undelayed bed stops
        info = json.loads(bed.tool("info", bed.id, "--json").stdout)
        self.assertEqual(info["delay_method"], "nfqueue")
        lines = [(h["delayline_pid"], h["delayline_start"]) for h in info["hosts"]]
        for pid, start in lines:
            self.assertTrue(is_alive(pid, start), info)
        bed.tool("kill", bed.id, "h0")
        self.assertTrue(is_alive(*lines[0]))
        # a rate change leaves the lines (and the packets they hold) alone
        bed.tool("shape", bed.id, "all", "--rate", "100mbit")
        info = json.loads(bed.tool("info", bed.id, "--json").stdout)
        self.assertEqual([(h["delayline_pid"], h["delayline_start"]) for h in info["hosts"]],
                         lines)
        self.assertGreater(rtt("h0", "h1")["rtt_ms_median"], 19.0)
        bed.tool("shape", bed.id, "all", "--delay", "0")
        for pid, start in lines:
            wait_for(lambda: not is_alive(pid, start), 10, f"delay line {pid} to stop")
        self.assertLess(rtt("h0", "h1")["rtt_ms_median"], 5.0)

    def temp_state_dir(self):
        d = tempfile.mkdtemp(prefix="psbed-test-")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        return d

    def test_down_after_a_crash_of_up(self):
        d = self.temp_state_dir()
        bed_id = "c" + os.urandom(2).hex()
        LIVE_BEDS[bed_id] = d  # the emergency teardown covers this one too

        def cleanup():
            subprocess.run([PY, TESTBED, "--state-dir", d, "down", bed_id], capture_output=True,
                           timeout=60)
            LIVE_BEDS.pop(bed_id, None)
        self.addCleanup(cleanup)
        p = subprocess.Popen([PY, TESTBED, "--state-dir", d, "up", "-n", "4", "--id", bed_id],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        # kill it once it made part of the bed: some hosts, maybe some sshds
        wait_for(lambda: len(namespaces_of(bed_id)) >= 3 or p.poll() is not None, 30,
                 "up to make namespaces")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        self.assertTrue(namespaces_of(bed_id))
        with open(os.path.join(d, bed_id, "state.json")) as f:
            st = json.load(f)
        r = subprocess.run([PY, TESTBED, "--state-dir", d, "list"], capture_output=True,
                           text=True, timeout=30)
        self.assertIn(bed_id, r.stdout)
        r = subprocess.run([PY, TESTBED, "--state-dir", d, "down", bed_id], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(namespaces_of(bed_id), [])
        self.assertFalse(os.path.exists(os.path.join(d, bed_id)))
        for h in st["hosts"]:
            if h.get("sshd_pid"):
                self.assertFalse(is_alive(h["sshd_pid"], h.get("sshd_start")))
        # and without any state file at all: namespaces named for the bed are enough
        r = subprocess.run(["ip", "netns", "add", f"psbed-{bed_id}-h7"], capture_output=True)
        self.assertEqual(r.returncode, 0)
        r = subprocess.run([PY, TESTBED, "--state-dir", d, "down", bed_id], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(namespaces_of(bed_id), [])

    def test_interrupted_up_removes_what_it_made(self):
        d = self.temp_state_dir()
        bed_id = "i" + os.urandom(2).hex()
        LIVE_BEDS[bed_id] = d
        self.addCleanup(LIVE_BEDS.pop, bed_id, None)
        p = subprocess.Popen([PY, TESTBED, "--state-dir", d, "up", "-n", "4", "--id", bed_id],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.addCleanup(lambda: p.poll() is None and os.killpg(p.pid, signal.SIGKILL))
        wait_for(lambda: len(namespaces_of(bed_id)) >= 3 or p.poll() is not None, 30,
                 "up to make namespaces")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn(f"up failed: interrupted by SIGTERM; removing bed {bed_id}", err)
        self.assertEqual(namespaces_of(bed_id), [])
        self.assertFalse(os.path.exists(os.path.join(d, bed_id)))

    def test_down_stops_whatever_runs_on_the_hosts(self):
        bed = self.make(2)
        sleeper = subprocess.Popen(bed.exec_argv("h1", ["sleep", "300"]),
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(lambda: sleeper.poll() is None and sleeper.kill())
        wait_for(lambda: sleeper.pid in testbed.netns_pids(bed.ns("h1")), 10,
                 "sleep to run in h1")
        sshds = [(h["sshd_pid"], h["sshd_start"]) for h in bed.hosts]
        self.assertEqual(bed.down(), "")
        self.assertEqual(sleeper.wait(timeout=10), -signal.SIGTERM)
        self.assert_gone(bed, sshds)

    def test_two_beds_side_by_side(self):
        a, b = self.make(2), self.make(2)
        self.assertNotEqual(a.id, b.id)
        self.assertNotEqual(a.state["subnet"], b.state["subnet"])
        self.assertFalse(set(namespaces_of(a.id)) & set(namespaces_of(b.id)))
        # a's hosts cannot reach b's
        r = a.run_on("h0", [PY, "-c", "import socket; socket.create_connection(("
                            f"'{b.addr('h1')}', 22), timeout=2)"])
        self.assertNotEqual(r.returncode, 0)
        sshds_a = [(h["sshd_pid"], h["sshd_start"]) for h in a.hosts]
        self.assertEqual(a.down(), "")
        self.assert_gone(a, sshds_a)
        # b is untouched
        self.assertEqual(len(namespaces_of(b.id)), 3)
        r = b.run_on("h0", ["ssh", "-F", b.state["ssh_config"], b.addr("h1"), "echo", "ok"])
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)

    def test_kill_and_link(self):
        bed = self.make(2)
        sleeper = subprocess.Popen(bed.exec_argv("h1", ["sleep", "300"]),
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(lambda: sleeper.poll() is None and sleeper.kill())
        wait_for(lambda: sleeper.pid in testbed.netns_pids(bed.ns("h1")), 10,
                 "sleep to run in h1")
        r = bed.tool("kill", bed.id, "h1")
        self.assertEqual(sleeper.wait(timeout=10), -signal.SIGKILL)
        self.assertIn("sent SIGKILL to 1 process(es)", r.stderr)
        h1 = bed.host("h1")
        self.assertTrue(is_alive(h1["sshd_pid"], h1["sshd_start"]))  # its sshd survives
        ssh = ["ssh", "-F", bed.state["ssh_config"], "-o", "ConnectTimeout=2", h1["addr"],
               "true"]
        self.assertEqual(bed.run_on("h0", ssh).returncode, 0)
        bed.tool("link", bed.id, "h1", "down")
        t0 = time.monotonic()
        self.assertNotEqual(bed.run_on("h0", ssh).returncode, 0)
        self.assertLess(time.monotonic() - t0, 15)
        bed.tool("link", bed.id, "h1", "up")
        self.assertTrue(wait_for_ok(lambda: bed.run_on("h0", ssh).returncode == 0, 15))


def wait_for_ok(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


if __name__ == "__main__":
    main()
