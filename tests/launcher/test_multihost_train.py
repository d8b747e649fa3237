"""One epoch of ps-train on a 4-host test bed (tools/testbed.py), launched over ssh.

4 workers and 4 servers, one of each per host, on 1 Gbit/s links; the mlp on the whole
Fashion-MNIST training set (each worker a quarter), batches of 256 to keep the run short on
a 2-core machine (about 15 s). The job must end cleanly, every worker must finish the epoch,
and rank 0's test accuracy must show that it learnt (> 0.6 after one epoch; 0.77 is typical).
Needs root and `ip netns` (ctest label `multihost`; exits 77, "skipped", otherwise), the
dataset-fashion-mnist package and a built ps-train.
"""
import os
import re
import unittest

from bed_testlib import BedJobTest, binary, main, missing_binaries

DATA = "/usr/share/datasets/fashion-mnist"
SKIP = missing_binaries("ps-train") or (
    None if os.path.isfile(os.path.join(DATA, "train-images-idx3-ubyte.gz")) else
    f"Fashion-MNIST not found in {DATA}: install dataset-fashion-mnist "
    "(tools/install-deps.sh)")


class BedTraining(BedJobTest):

    @unittest.skipIf(SKIP, SKIP)
    def test_one_epoch_of_ps_train(self):
        before = self.bed.port_counters()
        r = self.run_launcher(["-n", "4", "-s", "4"] + self.bed_args()
                              + ["--env", "OPENBLAS_NUM_THREADS=1", "--env", "PS_VERBOSE=1",
                                 binary("ps-train"), "--model", "mlp", "--device", "cpu",
                                 "--epochs", "1", "--batch-size", "256", "--log-interval", "20"],
                              env=self.real_env(), timeout=150)
        self.assertEqual(r.rc, 0, r)
        addr = {i: self.bed.addr(f"h{i}") for i in range(4)}
        self.assertEqual(self.registrations(r.out),
                         {(role, i): addr[i] for role in ("server", "worker") for i in range(4)})
        self.assertEqual(sorted(self.worker_lines(r.out, r"^Epoch\[0\] Train-loss=")),
                         [0, 1, 2, 3], r)
        final = self.worker_lines(r.out, r"^final test_accuracy=")
        self.assertEqual(sorted(final), [0], r)
        acc = float(re.search(r"test_accuracy=([0-9.]+)", final[0][0]).group(1))
        self.assertGreater(acc, 0.6, final)
        # 4 workers x 58 steps x 0.94 MB of gradients up and weights down: every host's link
        # carried tens of MB each way
        after = self.bed.port_counters()
        for name in after:
            self.assertGreater(after[name][0] - before[name][0], 20_000_000, name)
            self.assertGreater(after[name][1] - before[name][1], 20_000_000, name)
        self.assert_nothing_left_here()


if __name__ == "__main__":
    main()
