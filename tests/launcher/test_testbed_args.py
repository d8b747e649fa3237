"""tools/testbed.py: units, link specs, the tc commands it builds, usage errors, --help.

Nothing here makes a bed or needs root (the multihost tests do that); usage errors are found
before anything is made, so they are checked by running the tool.
"""
import importlib.util
import os
import shutil
import struct
import subprocess
import tempfile
import unittest
from unittest import mock

from launcher_testlib import PY, REPO

TESTBED = os.path.join(REPO, "tools", "testbed.py")
spec = importlib.util.spec_from_file_location("testbed", TESTBED)
testbed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(testbed)


class Units(unittest.TestCase):

    def test_rates(self):
        for text, bits in [("100mbit", 10**8), ("1gbit", 10**9), ("10Gbit", 10**10),
                           ("2.5gbit", 25 * 10**8), ("512kbit", 512000), ("125mbps", 10**9),
                           ("none", None), ("0", None), ("off", None)]:
            self.assertEqual(testbed.parse_rate(text), bits, text)
        for text in ("fast", "100", "100mb", "-1gbit", "1kbit", "1000gbit"):
            with self.assertRaises(testbed.UsageError, msg=text):
                testbed.parse_rate(text)
        self.assertEqual(testbed.fmt_rate(10**9), "1gbit")
        self.assertEqual(testbed.fmt_rate(25 * 10**8), "2.5gbit")
        self.assertEqual(testbed.fmt_rate(None), "unshaped")

    def test_delays(self):
        for text, us in [("5ms", 5000), ("200us", 200), ("0.5ms", 500), ("1s", 10**6),
                         ("0", 0), ("none", 0)]:
            self.assertEqual(testbed.parse_delay(text), us, text)
        for text in ("5", "5 minutes", "20s"):
            with self.assertRaises(testbed.UsageError, msg=text):
                testbed.parse_delay(text)
        self.assertEqual(testbed.fmt_delay(5000), "5ms")
        self.assertEqual(testbed.fmt_delay(250), "250us")

    def test_link_specs(self):
        self.assertEqual(testbed.parse_link_spec("h3=100mbit,2ms"), ("h3", 10**8, 2000))
        self.assertEqual(testbed.parse_link_spec("h1=1gbit"), ("h1", 10**9, "default"))
        self.assertEqual(testbed.parse_link_spec("2=,5ms"), ("2", "default", 5000))
        for text in ("h3", "=1gbit", "h3=fast"):
            with self.assertRaises(testbed.UsageError, msg=text):
                testbed.parse_link_spec(text)

    def test_names(self):
        self.assertTrue(testbed.NS_RE.match("psbed-ab12cd-h12"))
        self.assertTrue(testbed.NS_RE.match("psbed-x-sw"))
        self.assertFalse(testbed.NS_RE.match("psbed-toolong1-h0"))
        self.assertFalse(testbed.NS_RE.match("other-ab12cd-h0"))
        bed = testbed.Bed("/nonexistent", "ab12cd")
        self.assertEqual((bed.switch_ns, bed.host_ns(3), bed.bridge),
                         ("psbed-ab12cd-sw", "psbed-ab12cd-h3", "pbab12cdbr"))
        # the longest interface name (id of 6, host 249) fits IFNAMSIZ - 1 = 15
        self.assertLessEqual(len(f"{testbed.IF_PREFIX}ab12cdh{testbed.MAX_HOSTS - 1}"), 15)


class ShapeCommands(unittest.TestCase):

    def cmds(self, rate, delay):
        return [" ".join(c) for c in testbed.shape_commands("ns1", "dev1", rate, delay)]

    def test_rate_only(self):
        got = self.cmds(10**8, 0)
        self.assertEqual(got[0], "tc -n ns1 qdisc add dev dev1 root handle 1: htb default 1")
        self.assertRegex(got[1], r"^tc -n ns1 class add dev dev1 parent 1: classid 1:1 htb "
                                 r"rate 100000000bit ceil 100000000bit burst \d+ cburst \d+ ")
        # a byte-limited queue: 50 ms at the rate, at least 256 KiB
        self.assertEqual(got[2], "tc -n ns1 qdisc add dev dev1 parent 1:1 handle 10: bfifo "
                                 "limit 625000")
        self.assertEqual(len(got), 3)

    def test_rate_and_delay(self):
        got = self.cmds(10**9, 5000)
        self.assertEqual(len(got), 3)
        self.assertRegex(got[2], r"parent 1:1 handle 10: netem delay 5000us limit \d+$")

    def test_delay_only_and_none(self):
        got = self.cmds(None, 200)
        self.assertEqual(len(got), 1)
        self.assertRegex(got[0], r"^tc -n ns1 qdisc add dev dev1 root handle 10: netem delay "
                                 r"200us limit \d+$")
        self.assertEqual(self.cmds(None, 0), [])


class CommandLine(unittest.TestCase):

    def setUp(self):
        self.state = tempfile.mkdtemp(prefix="psbed-args-")
        self.addCleanup(shutil.rmtree, self.state, ignore_errors=True)

    def tool(self, *args):
        return subprocess.run([PY, TESTBED, "--state-dir", self.state] + list(args),
                              capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)

    def test_help(self):
        r = self.tool("--help")
        self.assertEqual(r.returncode, 0)
        for cmd in ("up", "down", "list", "info", "hostfile", "exec", "shape", "link", "kill",
                    "measure", "check"):
            self.assertIn(cmd, r.stdout)
        r = self.tool("up", "--help")
        for flag in ("--hosts", "--rate", "--delay", "--link", "--subnet", "--id", "--json"):
            self.assertIn(flag, r.stdout)
        self.assertEqual(self.tool().returncode, 2)  # no command: usage

    def test_usage_errors_before_anything_is_made(self):
        for args, want in [
                (("up", "-n", "0"), "want 1 to 250 hosts"),
                (("up", "--rate", "fast"), "bad rate 'fast'"),
                (("up", "--delay", "5"), "bad delay '5'"),
                (("up", "-n", "2", "--link", "h5=1gbit"), "no host 'h5' (hosts are h0..h1)"),
                (("up", "--subnet", "10.0.0.0/24"), "must lie in 198.18.0.0/15"),
                (("up", "-n", "9", "--subnet", "198.18.0.0/29"), "room for 6 hosts"),
                (("up", "--id", "TooLong"), "--id TooLong: want 1-6"),
                (("down",), "give bed ids, or --all"),
                (("info", "Bad!"), "is not a bed id")]:
            with self.subTest(args=args):
                r = self.tool(*args)
                if os.geteuid() != 0 and args[0] == "down":
                    continue  # down checks for root first
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)
        self.assertEqual(os.listdir(self.state), [])

    def test_negative_values_name_their_flag(self):
        # argparse took -1gbit for a flag ("expected one argument"): the tool refuses it
        for args, want in [
                (("up", "--rate", "-1gbit"), "--rate -1gbit: want a positive rate"),
                (("up", "--rate=-1gbit"), "--rate -1gbit: want a positive rate"),
                (("up", "--delay", "-5ms"), "--delay -5ms: want a positive delay"),
                (("up", "--delay", "-.5ms"), "--delay -.5ms: want a positive delay"),
                (("up", "--link", "h1=-1gbit"), "--link h1=-1gbit: want a positive rate"),
                (("up", "--link", "h1=,-5ms"), "--link h1=,-5ms: want a positive delay"),
                (("up", "--bogus", "-5"), "unrecognized arguments: --bogus=-5")]:
            with self.subTest(args=args):
                r = self.tool(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)
                self.assertNotIn("expected one argument", r.stderr)
        self.assertEqual(os.listdir(self.state), [])
        # exec's command is passed on as given
        def join(argv):
            return testbed.join_negative_values(argv, stop=testbed.COMMAND_STARTS)

        for argv in (["exec", "b1", "h0", "tool", "--rate", "-5"],
                     ["exec", "b1", "h0", "--", "tool", "--rate", "-5"]):
            self.assertEqual(join(argv), argv)
        self.assertEqual(join(["shape", "b1", "all", "--rate", "-1gbit"]),
                         ["shape", "b1", "all", "--rate=-1gbit"])

    def test_unknown_bed(self):
        for args in (("info", "nobed"), ("exec", "nobed", "h0", "true"),
                     ("hostfile", "nobed")):
            r = self.tool(*args)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("no bed 'nobed'", r.stderr)

    def test_not_root_is_a_clear_error(self):
        with mock.patch.object(testbed.os, "geteuid", return_value=1000):
            why = testbed.why_unavailable()
        self.assertIn("needs root", why)


DELAYLINE = os.path.join(REPO, "tools", "delayline.py")
dl_spec = importlib.util.spec_from_file_location("delayline", DELAYLINE)
delayline = importlib.util.module_from_spec(dl_spec)
dl_spec.loader.exec_module(delayline)


class DelayLine(unittest.TestCase):
    """tools/delayline.py's netlink messages and arguments, and which delays testbed.py asks
    of each host's line (the line itself runs in the multihost tests)."""

    def test_messages(self):
        # a batch verdict for queue 3: nlmsghdr, nfgenmsg with the queue in network order, and
        # the verdict header (accept, packet id) padded to 4 bytes
        verdict = delayline.attribute(delayline.NFQA_VERDICT_HDR, struct.pack("!II", 1, 77))
        m = delayline.message(delayline.NFQNL_MSG_VERDICT_BATCH, 3, [verdict])
        length, kind, flags, _, _ = struct.unpack_from("=IHHII", m)
        self.assertEqual(length, len(m))
        self.assertEqual(kind, (3 << 8) | 3)  # subsystem queue, verdict batch
        self.assertEqual(flags, 1)  # a request, no ack asked
        self.assertEqual(m[16:20], bytes([0, 0, 0, 3]))
        self.assertEqual(m[20:24], struct.pack("=HH", 12, 2))
        self.assertEqual(m[24:32], struct.pack("!II", 1, 77))
        self.assertEqual(len(delayline.attribute(1, b"abcde")) % 4, 0)

    def test_packet_ids_of_a_batch_of_messages(self):
        def packet(queue, packet_id):
            hdr = delayline.attribute(delayline.NFQA_PACKET_HDR,
                                      struct.pack("!IHB", packet_id, 0x0800, 1))
            other = delayline.attribute(9, b"\0" * 6)  # an attribute to skip
            return delayline.message(delayline.NFQNL_MSG_PACKET, queue, [other, hdr])
        buf = bytearray(packet(0, 5) + packet(2, 6) + packet(0, 7))
        self.assertEqual(list(delayline.packet_ids(buf, len(buf))), [(0, 5), (2, 6), (0, 7)])
        # a cut message yields what is whole
        self.assertEqual(list(delayline.packet_ids(buf, len(buf) - 4)), [(0, 5), (2, 6)])

    def test_arguments(self):
        self.assertEqual(delayline.parse_queue("0:5000"), (0, 5000))
        for text in ("5000", "a:1", "1:-2", "70000:1", "1:20000000"):
            with self.assertRaises(Exception, msg=text):
                delayline.parse_queue(text)
        r = subprocess.run([PY, DELAYLINE], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--queue", r.stderr)
        r = subprocess.run([PY, DELAYLINE, "--queue", "1:5", "--queue", "1:6"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("twice", r.stderr)

    def test_queues_per_sender(self):
        class FakeBed:
            def __init__(self, delays):
                self.list = [{"name": f"h{i}", "delay_us": d} for i, d in enumerate(delays)]

            def hosts(self):
                return self.list
        bed = FakeBed([5000, 0, 2000])
        # h0 holds h1's packets 5 ms (h0's link only) and h2's 7 ms (both links)
        self.assertEqual(testbed.delay_line_queues(bed, bed.list[0]), {1: 5000, 2: 7000})
        self.assertEqual(testbed.delay_line_queues(bed, bed.list[1]), {0: 5000, 2: 2000})
        self.assertEqual(testbed.delay_line_queues(FakeBed([0, 0]), {"delay_us": 0}), {})


if __name__ == "__main__":
    unittest.main()
