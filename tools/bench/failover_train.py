#!/usr/bin/env python3
"""ps-train with one of 3 servers lost mid-epoch, against the same job undisturbed.

Runs `tools/launch.py -n 2 -s 3 --launcher local ps-train --kvstore dist_sync --model mlp`
(replication on, the default) once undisturbed and once per --signals entry, sending that
signal to one server process when worker 0 logs `Epoch[E] Batch[B]` (--at). Prints and writes
(--json) each run's final test accuracy, its difference from the undisturbed run, and the
stall: the longest gap between worker 0's progress lines after the fault, less the median gap
(the time no round completed beyond the normal pace). SIGSTOP runs stop the server past
PS_HEARTBEAT_TIMEOUT (--heartbeat-timeout), after which the scheduler declares it dead.

Usage: python3 tools/bench/failover_train.py [--epochs 10] [--at 1,200] [--signals KILL,STOP]
       [--json FILE] (docs/kvstore.md, "Replication and failover")
"""
import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "build", "bin")


def server_pids(marker):
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            if os.path.basename(os.readlink(f"/proc/{name}/exe")) == "ps-server":
                pids.append(int(name))
        except OSError:
            continue
    return sorted(pids)


def run(args, sig=None):
    marker = f"PS_FAILOVER_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, PS_HEARTBEAT_TIMEOUT=str(args.heartbeat_timeout))
    cmd = [sys.executable, os.path.join(REPO, "tools", "launch.py"), "-n", "2", "-s", "3",
           "--launcher", "local", "--env", marker, "--env", "OPENBLAS_NUM_THREADS=1",
           os.path.join(BIN, "ps-train"), "--kvstore", "dist_sync", "--model", "mlp",
           "--epochs", str(args.epochs), "--log-interval", str(args.log_interval),
           "--seed", str(args.seed)]
    at_epoch, at_batch = args.at
    trigger = re.compile(rf"^\[worker 0\] Epoch\[{at_epoch}\] Batch\[{at_batch}\]")
    progress = re.compile(r"^\[worker 0\] Epoch\[\d+\] Batch\[\d+\]")
    final = re.compile(r"^\[worker 0\] final test_accuracy=([0-9.]+)")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    times, fault_at, accuracy, victim, tail = [], None, None, None, []
    for line in proc.stdout:
        now = time.monotonic()
        tail = (tail + [line.rstrip()])[-30:]
        if progress.match(line):
            times.append(now)
        if sig is not None and fault_at is None and trigger.match(line):
            pids = server_pids(marker.split("=", 1)[1])
            if len(pids) != 3:
                proc.kill()
                sys.exit(f"failover_train: found {len(pids)} ps-server processes, expected 3")
            victim = pids[1]
            os.kill(victim, sig)
            fault_at = now
            print(f"failover_train: sent {signal.Signals(sig).name} to ps-server pid {victim}",
                  flush=True)
        m = final.match(line)
        if m:
            accuracy = float(m.group(1))
    rc = proc.wait()
    if victim is not None and sig == signal.SIGSTOP:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc != 0 or accuracy is None:
        print("\n".join(tail), file=sys.stderr)
        sys.exit(f"failover_train: the job exited {rc} without a final accuracy")
    result = {"signal": signal.Signals(sig).name if sig else None, "exit": rc,
              "test_accuracy": accuracy}
    if fault_at is not None:
        gaps = [b - a for a, b in zip(times, times[1:])]
        after = [b - a for a, b in zip(times, times[1:]) if b > fault_at]
        median = statistics.median(gaps)
        result.update({"median_gap_s": round(median, 3),
                       "stall_s": round(max(after[:5]) - median, 3)})
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--at", default="1,200", help="EPOCH,BATCH of worker 0 at which to strike")
    p.add_argument("--signals", default="KILL,STOP")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="")
    args = p.parse_args()
    args.at = tuple(int(x) for x in args.at.split(","))
    if not os.access(os.path.join(BIN, "ps-train"), os.X_OK):
        sys.exit("failover_train: build/bin/ps-train is not built (bash tools/build.sh)")
    runs = [run(args)]
    print(f"failover_train: undisturbed: test accuracy {runs[0]['test_accuracy']:.4f}", flush=True)
    for name in args.signals.split(","):
        r = run(args, getattr(signal, "SIG" + name.strip().upper()))
        r["accuracy_change_points"] = round(100 * (r["test_accuracy"] - runs[0]["test_accuracy"]),
                                            2)
        runs.append(r)
        print(f"failover_train: {r['signal']}: test accuracy {r['test_accuracy']:.4f} "
              f"({r['accuracy_change_points']:+.2f} points), stall {r['stall_s']:.2f} s beyond "
              f"the median {r['median_gap_s']:.2f} s between progress lines", flush=True)
    report = {"tool": "tools/bench/failover_train.py",
              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
              "command": " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
              "heartbeat_timeout_s": args.heartbeat_timeout, "epochs": args.epochs,
              "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
