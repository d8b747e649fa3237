"""ps-train checkpoints end to end: a dist_sync job killed after a checkpoint and started again
with --resume ends with the same weights and optimizer state, bit for bit, as a job that never
stopped. Runs tools/launch.py locally (2 workers, 2 servers) with the real binaries on the first
2000 Fashion-MNIST training samples, and compares the servers' final checkpoint files byte for
byte. Skips, saying why, when ps-train is not built or the data set is not installed.
"""
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

from launcher_testlib import REPO

BIN = os.environ.get("PS_BIN_DIR") or os.path.join(REPO, "build", "bin")
DATA = "/usr/share/datasets/fashion-mnist"


def skip_reason():
    if not os.access(os.path.join(BIN, "ps-train"), os.X_OK):
        return f"ps-train not built in {BIN} (PS_BIN_DIR)"
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        return f"Fashion-MNIST not installed in {DATA} (dataset-fashion-mnist)"
    return None


@unittest.skipIf(skip_reason(), skip_reason())
class TrainResume(unittest.TestCase):
    def train(self, checkpoint_dir, epochs, *extra):
        cmd = [sys.executable, os.path.join(REPO, "tools", "launch.py"), "-n", "2", "-s", "2",
               "--launcher", "local", os.path.join(BIN, "ps-train"), "--model", "mlp",
               "--device", "cpu", "--kvstore", "dist_sync", "--num-examples", "2000",
               "--epochs", str(epochs), "--log-interval", "1000",
               "--checkpoint-dir", checkpoint_dir,
               # A schedule that does not depend on --epochs (cosine does), so the job stopped
               # after 2 epochs follows the same rates as the one run for 3; the rate drops with
               # the restored update counts.
               "--lr-scheduler", "factor", "--lr-step-epochs", "1", "--lr-factor", "0.5", *extra]
        env = dict(os.environ, PS_BIN_DIR=BIN, PS_HEARTBEAT_TIMEOUT="30")
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout + result.stderr

    def local(self, ckpt, *extra, status, examples=100):
        """ps-train alone (--kvstore local) with checkpoints in ckpt: the finished process,
        which exited with `status`."""
        cmd = [os.path.join(BIN, "ps-train"), "--kvstore", "local", "--device", "cpu",
               "--checkpoint-dir", ckpt, "--num-examples", str(examples), "--log-interval",
               "1000", *extra]
        env = {k: v for k, v in os.environ.items() if k != "DMLC_ROLE"}
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, status, result.stdout + result.stderr)
        return result

    def one_epoch(self, ckpt, examples=100):
        """A local job of one epoch with its checkpoint in ckpt."""
        self.local(ckpt, "--epochs", "1", examples=examples, status=0)

    def files(self, checkpoint, residuals):
        names = sorted(os.listdir(checkpoint))
        self.assertEqual(names, ["MANIFEST", "TRAINING", "server-0-of-2.psckpt",
                                 "server-1-of-2.psckpt"] +
                         (["worker-0.psres", "worker-1.psres"] if residuals else []))
        contents = {}
        for name in names:
            with open(os.path.join(checkpoint, name), "rb") as f:
                contents[name] = f.read()
        # Each save draws its own number (MANIFEST's "save" line), which the residual files
        # carry (in their MANIFEST's checksum, after the magic and the version, and so in their
        # own checksum at the end): not compared.
        contents["MANIFEST"] = re.sub(rb"\nsave [0-9a-f]{16}\n", b"\n", contents["MANIFEST"])
        for name in names:
            if name.endswith(".psres"):
                contents[name] = contents[name][:12] + contents[name][20:-8]
        return contents

    def check_resume_is_exact(self, *extra, residuals=False):
        """A job of 3 epochs against one stopped after 2 and resumed: the same final files."""
        with tempfile.TemporaryDirectory() as straight, tempfile.TemporaryDirectory() as broken:
            self.train(straight, 3, *extra)
            self.train(broken, 2, *extra)  # the job "dies" after its second epoch's checkpoint
            with open(os.path.join(broken, "LATEST")) as f:
                self.assertEqual(f.read().strip(), "epoch-2")
            out = self.train(broken, 3, "--resume", *extra)
            self.assertIn(f"resumed from {broken}/epoch-2 (2 epoch(s) done)", out)
            self.assertIn("Epoch[2]", out)
            self.assertNotIn("Epoch[1]", out)
            self.assertNotIn("note: --resume", out)  # the same update flags
            self.assertNotIn("push residuals", out)  # restored, so nothing to say
            want = self.files(os.path.join(straight, "epoch-3"), residuals)
            got = self.files(os.path.join(broken, "epoch-3"), residuals)
            for name in want:  # plain comparison: a diff of megabytes would take minutes
                self.assertTrue(want[name] == got[name], f"{name} differs")

    def test_a_resumed_job_ends_with_the_weights_of_one_that_never_stopped(self):
        self.check_resume_is_exact()

    def test_with_compressed_pushes_too_the_workers_residuals_in_the_checkpoint(self):
        # Without them the resumed pushes would lose what the stopped job had not sent yet.
        self.check_resume_is_exact("--gradient-compression", "2bit",
                                   "--compression-threshold", "0.05", residuals=True)

    def test_resume_with_nothing_left_to_train_reports_the_checkpoints_accuracy(self):
        # Not 0.0000 with exit 0: the model of the checkpoint, evaluated, and why nothing ran.
        with tempfile.TemporaryDirectory() as ckpt:
            cmd = [os.path.join(BIN, "ps-train"), "--kvstore", "local", "--device", "cpu",
                   "--checkpoint-dir", ckpt, "--num-examples", "1000", "--epochs", "1",
                   "--log-interval", "1000"]
            env = {k: v for k, v in os.environ.items() if k != "DMLC_ROLE"}
            first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(first.returncode, 0, first.stdout + first.stderr)
            trained = re.search(r"Epoch\[0\] test_accuracy=([0-9.]+)", first.stdout)
            self.assertIsNotNone(trained, first.stdout)
            again = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True,
                                   timeout=120)
            self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
            self.assertIn("nothing left to train: the checkpoint has 1 epoch(s) done and "
                          "--epochs is 1", again.stdout)
            self.assertNotIn("Epoch[", again.stdout)
            self.assertIn(f"final test_accuracy={trained.group(1)} ", again.stdout)
            self.assertGreater(float(trained.group(1)), 0.3)

    def test_resume_with_other_update_flags_or_from_an_earlier_epoch_is_noted(self):
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt)
            result = self.local(ckpt, "--epochs", "3", "--resume", "--lr", "0.05", status=0)
            self.assertIn(f"ps-train: note: --resume: {ckpt}/epoch-1 was trained with --lr 0.1, "
                          "--epochs 1; this job has --lr 0.05, --epochs 3: the updates' step "
                          "changes from this epoch on", result.stdout)
            self.assertIn("Epoch[1]", result.stdout)
            self.assertNotIn("holds checkpoints past", result.stdout)
            # LATEST set back by hand: the later checkpoints are named before they are replaced.
            with open(os.path.join(ckpt, "LATEST"), "w") as f:
                f.write("epoch-1\n")
            again = self.local(ckpt, "--epochs", "2", "--resume", "--lr", "0.05", status=0)
            self.assertIn(f"ps-train: note: --resume: {ckpt} holds checkpoints past epoch-1 "
                          "(epoch-2, epoch-3): this job writes its own over those it reaches",
                          again.stdout)

    def test_resume_with_another_model_names_it(self):
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt)
            result = self.local(ckpt, "--epochs", "2", "--resume", "--model", "cnn", status=1)
            self.assertIn(f"--resume: {ckpt}/epoch-1 was written by a job of --model mlp, "
                          "this one is --model cnn: resume with --model mlp", result.stderr)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            other = self.local(ckpt, "--epochs", "2", "--resume", "--optimizer", "adam",
                               status=1)
            self.assertIn("with --optimizer sgd, this one has --optimizer adam: the checkpoint "
                          "holds sgd's state; resume with --optimizer sgd", other.stderr)
            # Without ps-train's record (a checkpoint of an older ps-train, or written through
            # the API) the store itself tells another model from another optimizer.
            os.remove(os.path.join(ckpt, "epoch-1", "TRAINING"))
            result = self.local(ckpt, "--epochs", "2", "--resume", "--model", "cnn", status=1)
            self.assertIn("which holds the parameters of another model than this job's "
                          "--model cnn: resume with the --model it was written with",
                          result.stderr)
            other = self.local(ckpt, "--epochs", "2", "--resume", "--optimizer", "adam",
                               status=1)
            self.assertIn("the checkpoint holds sgd optimizer state, this job's optimizer is adam",
                          other.stderr)
            self.assertNotIn("another model", other.stderr)
            # The same job resumes; the checks it could not make are named.
            same = self.local(ckpt, "--epochs", "2", "--resume", status=0)
            self.assertIn(f"resumed from {ckpt}/epoch-1 (1 epoch(s) done; it has no TRAINING "
                          "record, so the workers, --batch-size and schedule it was trained "
                          "with were not checked)", same.stdout)

    def test_a_damaged_checkpoint_names_the_earlier_one_to_go_on_from(self):
        with tempfile.TemporaryDirectory() as ckpt:
            self.local(ckpt, "--epochs", "2", status=0)  # epoch-1 and epoch-2; LATEST: epoch-2
            os.remove(os.path.join(ckpt, "epoch-2", "MANIFEST"))
            result = self.local(ckpt, "--epochs", "3", "--resume", status=1)
            self.assertIn(f"no checkpoint in {ckpt}/epoch-2: MANIFEST is missing", result.stderr)
            self.assertIn(f"(--resume: {ckpt}/LATEST names epoch-2; it was whole when ps-train "
                          "named it there, so if it is damaged, it was damaged since: to go on "
                          "from an earlier one (epoch-1), write its name into LATEST (echo "
                          f"epoch-1 > {ckpt}/LATEST))", result.stderr)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            with open(os.path.join(ckpt, "LATEST"), "w") as f:
                f.write("epoch-1\n")
            resumed = self.local(ckpt, "--epochs", "3", "--resume", status=0)
            self.assertIn(f"resumed from {ckpt}/epoch-1", resumed.stdout)

    def test_a_resume_whose_schedule_would_slip_is_refused(self):
        # The servers' update counts go on from the checkpoint's; with another number of
        # updates per epoch (here the batch size; in a job also the workers, --num-examples,
        # --kvstore) a schedule would sit elsewhere than the epoch: in the worst case past its
        # end, training a whole epoch at rate 0 and exiting 0.
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt, examples=640)
            again = ["--epochs", "2", "--resume", "--batch-size", "32"]
            result = self.local(ckpt, *again, examples=640, status=1)
            self.assertIn(f"--resume: {ckpt}/epoch-1 was written by a job whose servers "
                          "counted 10 updates in its 1 epoch(s) (the last job on it made 10 per "
                          "epoch: 1 worker(s), --batch-size 64, 640 examples, --kvstore local); "
                          "this one makes 20 per epoch (1 worker(s), --batch-size 32, 640 "
                          "examples, --kvstore local), so its learning-rate schedule, which "
                          "counts updates, would take them for 0.5 epoch(s), not 1",
                          result.stderr)
            self.assertIn("(--lr-scheduler none --warmup-epochs 0)", result.stderr)
            self.assertNotIn("Epoch[", result.stdout)
            # A constant rate does not count updates: the same resume goes on.
            result = self.local(ckpt, *again, "--lr-scheduler", "none", examples=640, status=0)
            self.assertIn("Epoch[1]", result.stdout)
            # The servers counted 10 + 20 updates in those 2 epochs: a scheduled job of batch
            # 32 (20 per epoch) would take them for 1.5 epochs; it is refused too.
            result = self.local(ckpt, "--epochs", "3", "--resume", "--batch-size", "32",
                                examples=640, status=1)
            self.assertIn("counted 30 updates in its 2 epoch(s) (the last job on it made 20 per "
                          "epoch", result.stderr)
            self.assertIn("would take them for 1.5 epoch(s), not 2", result.stderr)

    def test_a_directory_another_job_uses_is_refused(self):
        # Two jobs on one directory would write their checkpoints over each other's. Another
        # job's lock, as ps-train holds it (flock on DIR/.ps-train.lock, naming the holder):
        # refused before training, new job or resume; once it is gone, the job runs.
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt)
            lock_path = os.path.join(ckpt, ".ps-train.lock")
            with open(lock_path, "w") as held:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.write("pid 4242 on host elsewhere\n")
                held.flush()
                for extra in (["--resume"], []):
                    result = self.local(ckpt, "--epochs", "2", *extra, status=1)
                    self.assertEqual(
                        result.stderr.strip(),
                        f"ps-train: error: --checkpoint-dir {ckpt} is in use by another ps-train "
                        f"job (pid 4242 on host elsewhere holds {lock_path}): two jobs would "
                        "write their checkpoints over each other's; give each job a directory "
                        "of its own")
                    self.assertNotIn("Epoch[", result.stdout)
            self.assertFalse(os.path.exists(os.path.join(ckpt, "epoch-2")))
            self.local(ckpt, "--epochs", "2", "--resume", status=0)
            self.assertTrue(os.path.exists(os.path.join(ckpt, "epoch-2")))

    def test_a_resumed_job_adds_to_its_metrics_and_names_another_seed(self):
        with tempfile.TemporaryDirectory() as ckpt:
            metrics = os.path.join(ckpt, "metrics.jsonl")
            self.local(ckpt, "--epochs", "1", "--metrics-out", metrics, status=0)
            with open(metrics, "a") as f:
                f.write('{"cut short')  # a record the stopped job did not finish
            result = self.local(ckpt, "--epochs", "2", "--resume", "--metrics-out", metrics,
                                "--seed", "5", status=0)
            # The epochs before the restart keep their lines; the resumed epoch's follow, each
            # on a line of its own.
            with open(metrics) as f:
                lines = f.read().splitlines()
            self.assertIn('{"cut short', lines)
            epochs = [json.loads(line).get("epoch") for line in lines if line != '{"cut short']
            self.assertIn(0, epochs)
            self.assertIn(1, epochs)
            self.assertLess(epochs.index(0), epochs.index(1))
            self.assertIn(f"ps-train: note: --resume: {ckpt}/epoch-1 was trained with --seed 1; "
                          "this job has --seed 5: its epochs are shuffled otherwise from here on",
                          result.stdout)

    def test_a_resume_into_a_read_only_directory_is_refused_before_training(self):
        # Not after an epoch of training, at the first save.
        if not shutil.which("unshare") or os.geteuid() != 0:
            self.skipTest("needs root and unshare (a read-only bind mount)")
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt)
            cmd = [os.path.join(BIN, "ps-train"), "--kvstore", "local", "--device", "cpu",
                   "--checkpoint-dir", ckpt, "--num-examples", "100", "--epochs", "2",
                   "--resume"]
            script = (f"mount --bind {shlex.quote(ckpt)} {shlex.quote(ckpt)} && "
                      f"mount -o remount,bind,ro {shlex.quote(ckpt)} && exec " +
                      " ".join(shlex.quote(c) for c in cmd))
            env = {k: v for k, v in os.environ.items() if k != "DMLC_ROLE"}
            result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                     script], env=env, capture_output=True, text=True,
                                    timeout=120)
            if "mount" in result.stderr and "ps-train" not in result.stderr:
                self.skipTest("no read-only bind mount here: " + result.stderr.strip())
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertEqual(result.stderr.strip(),
                             f"ps-train: error: --checkpoint-dir {ckpt}: cannot write into it: "
                             "Read-only file system")
            self.assertNotIn("Epoch[", result.stdout)

    def test_a_new_job_does_not_write_over_a_directory_of_checkpoints(self):
        # Started again after a crash without --resume: refused, not a mix of two runs.
        with tempfile.TemporaryDirectory() as ckpt:
            self.one_epoch(ckpt)
            with open(os.path.join(ckpt, "epoch-1", "MANIFEST"), "rb") as f:
                manifest = f.read()
            again = self.local(ckpt, "--epochs", "1", "--seed", "7", status=1)
            self.assertEqual(again.stderr.strip(),
                             f"ps-train: error: --checkpoint-dir {ckpt} holds checkpoints "
                             "already (LATEST names epoch-1): add --resume to go on from there, "
                             "or name an empty directory; a new job would write over them")
            with open(os.path.join(ckpt, "epoch-1", "MANIFEST"), "rb") as f:
                self.assertEqual(f.read(), manifest)
            # LATEST lost (a copy without it): the epochs are still another run's.
            os.remove(os.path.join(ckpt, "LATEST"))
            again = self.local(ckpt, "--epochs", "1", "--seed", "7", status=1)
            self.assertIn(f"--checkpoint-dir {ckpt} holds checkpoints already (epoch-1, and no "
                          "LATEST): to go on from one, write its name into "
                          f"{ckpt}/LATEST and add --resume", again.stderr)
            with open(os.path.join(ckpt, "epoch-1", "MANIFEST"), "rb") as f:
                self.assertEqual(f.read(), manifest)

    def test_resume_without_a_checkpoint_is_a_one_line_error(self):
        with tempfile.TemporaryDirectory() as empty:
            cmd = [os.path.join(BIN, "ps-train"), "--kvstore", "local", "--device", "cpu",
                   "--checkpoint-dir", empty, "--resume", "--num-examples", "100"]
            env = {k: v for k, v in os.environ.items() if k != "DMLC_ROLE"}
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn(f"--resume: no checkpoint in {empty} ({empty}/LATEST is missing",
                          result.stderr)
            # LATEST that names no checkpoint, and one that names a checkpoint not there.
            for latest, want in [
                    ("garbage\n", f"--resume: {empty}/LATEST holds 'garbage', not the name of a "
                                   "checkpoint such as epoch-3"),
                    ("epoch-x7\n", "holds 'epoch-x7', not the name"),
                    ("epoch-02\n", "holds 'epoch-02', not the name"),
                    ("ep\x01och-2\n", "holds 'ep\\x01och-2', not the name"),
                    ("epoch-7\n", f"--resume: {empty}/LATEST names epoch-7, but "
                                  f"{empty}/epoch-7 does not exist: no checkpoint is left in "
                                  f"{empty}"),
            ]:
                with open(os.path.join(empty, "LATEST"), "w") as f:
                    f.write(latest)
                result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
                self.assertIn(want, result.stderr)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            os.remove(os.path.join(empty, "LATEST"))
            os.makedirs(os.path.join(empty, "LATEST"))
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            self.assertIn(f"--resume: {empty}/LATEST is a directory: it must be a file naming a "
                          "checkpoint such as epoch-3", result.stderr)
            os.rmdir(os.path.join(empty, "LATEST"))
            # The checkpoints there, LATEST lost: named, and the way to go on from one.
            os.makedirs(os.path.join(empty, "epoch-2"))
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn(f"--resume: {empty}/LATEST is missing, though {empty} holds epoch-2: "
                          f"write the name of the one to go on from into it (echo epoch-2 > "
                          f"{empty}/LATEST)", result.stderr)
            with open(os.path.join(empty, "LATEST"), "w") as f:
                f.write("epoch-7\n")
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            self.assertIn(f"but {empty}/epoch-7 does not exist: write epoch-2 into it",
                          result.stderr)

    def test_checkpoint_every_without_a_directory_is_a_one_line_error(self):
        # Not silently ignored (no checkpoint would ever be written).
        cmd = [os.path.join(BIN, "ps-train"), "--kvstore", "local", "--device", "cpu",
               "--checkpoint-every", "2", "--num-examples", "100"]
        env = {k: v for k, v in os.environ.items() if k != "DMLC_ROLE"}
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertEqual(result.stderr.strip(), "ps-train: error: --checkpoint-every needs "
                         "--checkpoint-dir, the directory to write checkpoints to")


if __name__ == "__main__":
    unittest.main()
