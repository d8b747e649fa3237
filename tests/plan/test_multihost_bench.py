"""A short run of tools/bench/bed_bench.py on a real test bed (ctest multihost.bench).

`bed_bench.py --smoke`: 2 worker hosts and 2 server hosts at 1 Gbit/s, 1 MB, 2 iterations of
the PS with servers beside the workers and on hosts of their own, and MPI_Allreduce when
mpirun and ps-bench-mpi-allreduce are there (about 20 s). Checks that every case produced an
iteration time and a busiest link with traffic on it, that the JSON, the table and the ratios
are there, and that the bed is gone afterwards. Needs root and `ip netns`; exits 77 (skipped)
without them, as the other multihost tests.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(REPO, "tools", "bench", "bed_bench.py")
BIN = os.environ.get("PS_BIN_DIR") or os.path.join(REPO, "build", "bin")
SKIP_CODE = 77


def psbed_namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in r.stdout.splitlines() if line.startswith("psbed-")}


class BedBenchSmoke(unittest.TestCase):

    def test_smoke(self):
        for name in ("ps-scheduler", "ps-server", "ps-bench"):
            if not os.access(os.path.join(BIN, name), os.X_OK):
                self.skipTest(f"{name} not built in {BIN}")
        before = psbed_namespaces()
        out_dir = tempfile.mkdtemp(prefix="bed-bench-smoke-")
        self.addCleanup(shutil.rmtree, out_dir, True)
        r = subprocess.run([sys.executable, BENCH, "--smoke", "--no-plot", "--bin-dir", BIN,
                            "--out", out_dir], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=150)
        if r.returncode == SKIP_CODE:
            self.skipTest(r.stdout.strip())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ratios:", r.stdout)
        with open(os.path.join(out_dir, "bed_bench.json")) as f:
            doc = json.load(f)
        labels = [c["label"] for c in doc["cases"]]
        self.assertIn("ps_beside_sync_1MB", labels)
        self.assertIn("ps_own_sync_1MB", labels)
        for c in doc["cases"]:
            self.assertGreater(c["iteration_s"], 0, c["label"])
            self.assertGreater(c["window"]["link_utilisation"], 0.01, c["label"])
            self.assertLess(c["window"]["link_utilisation"], 1.1, c["label"])
            self.assertIsNotNone(c["window"]["cpu_busy"], c["label"])
        self.assertGreater(doc["reference"]["goodput_fraction"], 0.5)
        self.assertEqual(psbed_namespaces() - before, set(), "a bed was left behind")


if __name__ == "__main__":
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("SKIP: multi-host test bed unavailable: not root or no ip", flush=True)
        sys.exit(SKIP_CODE)
    unittest.main(verbosity=2)
