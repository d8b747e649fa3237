"""PS_ENCRYPT=1 on the wire: a capture of a job's traffic holds none of its tensor bytes.

Runs tools/launch.py with ps-kvstore-check (2 workers, 1 server, TCP only: PS_USE_IPC=0) in a
network namespace of its own, while a raw packet socket (AF_PACKET) on that namespace's
loopback records every packet. Worker 0 pushes the float 1.0 into all 1000 elements of key 0,
so its gradient is the bytes 00 00 80 3f repeated. Without encryption the capture must hold
that run (which shows the capture sees the payload); with PS_ENCRYPT=1 it must not, and the
job's results must still be exact. Needs root (ip netns); skips, saying why, otherwise.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid

from launcher_testlib import REPO

BIN = os.environ.get("PS_BIN_DIR") or os.path.join(REPO, "build", "bin")
PLAIN_GRADIENT = b"\x00\x00\x80\x3f" * 64  # 64 floats of 1.0: worker 0's push of key 0
CAPTURE_LIMIT = 256 << 20  # bytes of packets kept, at most

# Records every packet on the interface argv[3] ("": every interface of its network namespace)
# until stdin closes, keeping at most argv[2] bytes; writes them to the file argv[1].
CAPTURE = r"""
import os, select, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
# A deep queue (root may exceed rmem_max): a reader slowed by a busy machine drops nothing.
s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
if sys.argv[3]:
    s.bind((sys.argv[3], 0))
print("capturing", flush=True)
kept = 0
with open(sys.argv[1], "wb") as out:
    while kept < int(sys.argv[2]):
        ready, _, _ = select.select([s, sys.stdin], [], [], 1.0)
        if sys.stdin in ready:
            break
        if s in ready:
            packet = s.recv(1 << 17)
            out.write(packet)
            kept += len(packet)
"""


def skip_reason():
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "needs root and ip(8) for a network namespace"
    if not os.access(os.path.join(BIN, "ps-kvstore-check"), os.X_OK):
        return f"ps-kvstore-check not built in {BIN} (PS_BIN_DIR)"
    return None


@unittest.skipIf(skip_reason(), skip_reason())
class EncryptionOnTheWire(unittest.TestCase):
    def setUp(self):
        self.ns = "ps-capture-" + uuid.uuid4().hex[:8]
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self.addCleanup(subprocess.run, ["ip", "netns", "delete", self.ns], check=False)
        subprocess.run(["ip", "-n", self.ns, "link", "set", "lo", "up"], check=True)
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def captured_job(self, encrypt):
        """Runs the job under a capture; returns the captured bytes."""
        path = os.path.join(self.tmp, f"capture-{encrypt}.bin")
        capture = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", CAPTURE, path,
             str(CAPTURE_LIMIT), "lo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(capture.stdout.readline().strip(), "capturing")
            env = dict(os.environ, PS_BIN_DIR=BIN, PS_USE_IPC="0", PS_ENCRYPT=encrypt)
            job = subprocess.run(
                ["ip", "netns", "exec", self.ns, sys.executable,
                 os.path.join(REPO, "tools", "launch.py"), "-n", "2", "-s", "1",
                 "--launcher", "local", os.path.join(BIN, "ps-kvstore-check"),
                 "--keys", "2", "--size", "1000", "--rounds", "5"],
                env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(job.returncode, 0, job.stdout + job.stderr)
        finally:
            capture.stdin.close()
            capture.wait(timeout=30)
            capture.stdout.close()
        with open(path, "rb") as f:
            return f.read()

    def test_no_tensor_bytes_in_clear_with_encryption(self):
        plain = self.captured_job("0")
        self.assertIn(PLAIN_GRADIENT, plain, "the capture does not see the job's payload")
        encrypted = self.captured_job("1")
        self.assertGreater(len(encrypted), 1000 * 4 * 5, "the capture saw no traffic")
        self.assertNotIn(PLAIN_GRADIENT, encrypted)


if __name__ == "__main__":
    unittest.main()
