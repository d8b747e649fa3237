"""Unit tests of tools/ps-plan.py, the capacity model: cases worked out by hand.

Most cases use efficiency 1, no latency and a flow-sharing share of 1, so that a link of
100 Mbit/s carries exactly 12.5e6 payload bytes per second each way and the expected times are
plain arithmetic, written out next to each assertion. Standard library only; no root.
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import sys
import subprocess
import tempfile
import time
import unittest
from unittest import mock

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("ps_plan", os.path.join(REPO, "tools",
                                                                       "ps-plan.py"))
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)

MiB = 1 << 20
M16 = 16 * MiB                 # 16777216 bytes
C = 12.5e6                     # 100 Mbit/s, efficiency 1: bytes per second each way
IDEAL = dict(rate=100e6, efficiency=1.0, latency=0.0, ps_share=1.0)


def job(**kw):
    args = dict(IDEAL)
    args.update(kw)
    return plan.Job(**args)


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = plan.main(list(argv))
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


class Units(unittest.TestCase):

    def test_sizes_rates_times(self):
        self.assertEqual(plan.parse_size("16MB"), M16)
        self.assertEqual(plan.parse_size("64KB"), 65536)
        self.assertEqual(plan.parse_size("1000"), 1000)
        self.assertEqual(plan.parse_rate("100mbit"), 100e6)
        self.assertEqual(plan.parse_rate("25gbit"), 25e9)
        self.assertAlmostEqual(plan.parse_time("25us"), 25e-6)
        self.assertAlmostEqual(plan.parse_time("0.5ms"), 5e-4)
        self.assertEqual(plan.parse_time("2"), 2.0)
        for bad in ("16 parsecs", "-1MB", ""):
            with self.assertRaises(plan.PlanError):
                plan.parse_size(bad)
        with self.assertRaises(plan.PlanError):
            plan.parse_rate("100")
        with self.assertRaises(plan.PlanError):
            plan.parse_time("soon")


class RingAllReduce(unittest.TestCase):

    def test_four_hosts(self):
        # 2 (N-1)/N x M / C = 1.5 x 16777216 / 12.5e6 = 2.01326592 s
        p = job(layers=[M16], worker_hosts=4, layout="beside").predict()
        self.assertAlmostEqual(p["allreduce"]["iteration_s"], 2.01326592, places=6)

    def test_latency_per_step_and_bucket(self):
        # 2 (N-1) steps x 1 ms per bucket; 100 MiB in 64 MiB buckets = 2 buckets:
        # 1.5 x 104857600 / 12.5e6 + 6 x 0.001 x 2 = 12.582912 + 0.012
        p = job(layers=[100 * MiB], worker_hosts=4, latency=1e-3).predict()
        self.assertAlmostEqual(p["allreduce"]["comm_s"], 12.594912, places=6)

    def test_rendezvous_costs_a_latency_per_step_above_the_eager_limit(self):
        # Open MPI (check): 16 MiB / 4 = 4 MiB per step, above 64 KiB: 2 latencies per step,
        # 2.01326592 + 6 x 2 x 0.001
        p = job(layers=[M16], worker_hosts=4, latency=1e-3, rendezvous=65536).predict()
        self.assertAlmostEqual(p["allreduce"]["comm_s"], 2.02526592, places=6)
        # 256 KiB / 4 = 64 KiB per step, not above: one latency per step,
        # 1.5 x 262144 / 12.5e6 + 6 x 0.001
        p = job(layers=[256 * 1024], worker_hosts=4, latency=1e-3, rendezvous=65536).predict()
        self.assertAlmostEqual(p["allreduce"]["comm_s"], 0.03745728, places=6)
        # predict's ring (NCCL) has no handshake
        p = job(layers=[M16], worker_hosts=4, latency=1e-3).predict()
        self.assertAlmostEqual(p["allreduce"]["comm_s"], 2.01926592, places=6)

    def test_slowest_link_sets_the_pace(self):
        # one link at a quarter: every step waits for it, 4 x 2.01326592
        p = job(layers=[M16], worker_hosts=4, slow={3: 0.25}).predict()
        self.assertAlmostEqual(p["allreduce"]["iteration_s"], 8.05306368, places=6)

    def test_one_host_uses_no_link(self):
        self.assertEqual(job(layers=[M16], worker_hosts=1).predict()["allreduce"]["comm_s"], 0)

    def test_compression(self):
        # fp16 all-reduce: half the bytes
        p = job(layers=[M16], worker_hosts=4, allreduce_ratio=0.5).predict()
        self.assertAlmostEqual(p["allreduce"]["iteration_s"], 1.00663296, places=6)


class ParameterServer(unittest.TestCase):

    def test_link_totals_match_per_worker_bytes(self):
        for layout in ("own", "beside"):
            j = job(layers=[M16, 1000, 3000], worker_hosts=3, layout=layout, server_hosts=2,
                    chunk=MiB, push_ratio=0.25)
            per = {k: sum(v) for k, v in j.link_bytes().items()}
            tot = j.link_totals()
            self.assertEqual(set(per), set(tot))
            for k in per:
                self.assertAlmostEqual(per[k], tot[k], places=3, msg=(layout, k))

    def test_beside_same_bytes_as_ring(self):
        # each host sends its worker's 3 remote slices (3 x 4 MiB) and its server's replies to
        # 3 remote workers (3 x 4 MiB): 24 MiB = 25165824 B / 12.5e6 = 2.01326592 s, plus the
        # drain: 3 replies of the last 64 KiB message, 196608 / 12.5e6 = 0.01572864 s
        p = job(layers=[M16], worker_hosts=4, layout="beside", chunk=64 * 1024).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 2.01326592, places=6)
        self.assertAlmostEqual(p["ps"]["drain_s"], 0.01572864, places=6)
        self.assertAlmostEqual(p["ps"]["iteration_s"], 2.02899456, places=6)

    def test_own_hosts_carry_the_model_once(self):
        # a worker sends 16 MiB and receives 16 MiB; a server receives 4 x 4 MiB and sends the
        # same: 1.34217728 s, plus 4 replies of 64 KiB: 262144 / 12.5e6 = 0.02097152 s
        p = job(layers=[M16], worker_hosts=4, layout="own", server_hosts=4,
                chunk=64 * 1024).predict()
        self.assertAlmostEqual(p["ps"]["iteration_s"], 1.36314880, places=6)
        self.assertAlmostEqual(p["ps_over_allreduce"], 1.3631488 / 2.01326592, places=6)

    def test_one_message_per_server_cannot_overlap(self):
        # chunk 4 MiB: each server's share is one message; its replies (4 x 4 MiB) leave only
        # after every push is in: push 1.34217728 s + pull 1.34217728 s
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=4 * MiB).predict()
        self.assertAlmostEqual(p["ps"]["iteration_s"], 2.68435456, places=6)

    def test_fewer_server_hosts(self):
        # 2 server hosts: each receives 4 workers x 8 MiB = 32 MiB: 2.68435456 s
        p = job(layers=[M16], worker_hosts=4, layout="own", server_hosts=2,
                chunk=64 * 1024).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 2.68435456, places=6)

    def test_faster_server_links(self):
        # 1 server host at 400 Mbit/s: 64 MiB in at 50e6 B/s = 1.34217728 s, as the workers'
        p = job(layers=[M16], worker_hosts=4, layout="own", server_hosts=1,
                server_rate=400e6, chunk=64 * 1024).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 1.34217728, places=6)

    def test_push_compression(self):
        # 2-bit pushes (1/16): the pulls (16 MiB in) set the time
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=64 * 1024,
                push_ratio=1 / 16).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 1.34217728, places=6)
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=64 * 1024,
                push_ratio=1 / 16, pull_ratio=1 / 16).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 1.34217728 / 16, places=6)

    def test_small_key_is_one_message_whatever_the_chunk(self):
        # 1 MB, below the bound: one server holds it whole and sends it in one message, so
        # its pulls leave only after the round's pushes arrived: push time + pull time
        job = plan.Job([MiB], 4, layout="own", rate=100e6, chunk=64 * 1024, latency=0,
                       efficiency=1.0)
        p = job.predict()["ps"]
        one_way = 4 * MiB * 8 / 100e6  # 4 workers' 1 MB through the server's link
        self.assertAlmostEqual(p["bandwidth_s"], one_way)
        self.assertAlmostEqual(p["drain_s"], one_way)

    def test_share_and_latency(self):
        # share 0.5 doubles the link time; latency adds a round trip
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=64 * 1024, ps_share=0.5,
                latency=0.001).predict()
        self.assertAlmostEqual(p["ps"]["iteration_s"], 2 * 1.34217728 + 0.02097152 + 0.002,
                               places=6)

    def test_one_host_beside_is_local(self):
        self.assertEqual(job(layers=[M16], worker_hosts=1, layout="beside").predict()["ps"][
            "iteration_s"], 0)

    def test_placement(self):
        # a big key is sliced evenly; small keys (< 1e6 elements) go whole, round-robin here
        j = job(layers=[M16], worker_hosts=2, layout="own", server_hosts=4, chunk=MiB)
        self.assertEqual(j.server_bytes(), [4 * MiB] * 4)
        self.assertEqual(j.messages_per_server(), [4] * 4)
        j = job(layers=[1000] * 8, worker_hosts=2, layout="own", server_hosts=4)
        self.assertEqual(j.server_bytes(), [2000] * 4)

    def test_sync_straggler_holds_everyone(self):
        # own layout, worker 3 at 1/4: its 16 MiB each way take 4 x 1.34217728 s; in
        # dist_sync every worker waits for it
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=64 * 1024,
                slow={3: 0.25}).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 5.36870912, places=6)
        self.assertEqual(len(set(round(x, 9) for x in p["ps"]["per_worker_s"])), 1)

    def test_async_straggler_own_hosts(self):
        # max-min fair: worker 3 gets C/4 for its 16 MiB; the servers' links then carry
        # 3 x 4 MiB x x + 4 MiB x x/4 < C, so the others keep 1.34217728 s per iteration
        p = job(layers=[M16], worker_hosts=4, layout="own", chunk=64 * 1024, mode="async",
                slow={3: 0.25}).predict()
        bw = [t - 0.02097152 for t in p["ps"]["per_worker_s"]]
        for w in range(3):
            self.assertAlmostEqual(bw[w], 1.34217728, places=6)
        self.assertAlmostEqual(bw[3], 5.36870912, places=5)

    def test_async_straggler_beside_slows_everyone(self):
        # server 3 sits on the slow host: six flows cross its link (C/4) inwards, the three
        # remote pushes into server 3 (4 MiB per iteration each) and worker 3's pulls from the
        # three other servers (4 MiB each), and each gets C/24: a worker's 4 MiB takes
        # 96 MiB / C = 8.05306368 s
        p = job(layers=[M16], worker_hosts=4, layout="beside", chunk=64 * 1024, mode="async",
                slow={3: 0.25}).predict()
        self.assertAlmostEqual(p["ps"]["bandwidth_s"], 8.05306368, places=5)

    def test_server_weights_place_the_model(self):
        # PS_SERVER_WEIGHTS 1,1,1,0.25 scales to 1000,1000,1000,250: shares of 3250
        j = job(layers=[M16], worker_hosts=4, layout="beside", server_weights=[1, 1, 1, 0.25])
        for got, weight in zip(j.server_bytes(), (1000, 1000, 1000, 250)):
            self.assertAlmostEqual(got, M16 * weight / 3250)
        # alike weights: the layout without them
        self.assertEqual(job(layers=[M16], worker_hosts=4, server_weights=[2] * 4).server_bytes(),
                         [4 * MiB] * 4)
        # the last message: a piece of the key cut into 2 x 3250 / 250 = 26 pieces at least
        j = job(layers=[M16], worker_hosts=4, layout="beside", chunk=4 * MiB,
                server_weights=[1, 1, 1, 0.25])
        self.assertAlmostEqual(j.placement()[1][3], M16 / 26)

    def test_async_flows_share_a_link_equally(self):
        # beside, 2 hosts, host 1 at C/4, weights 1,0.25: server 0 holds 0.8 M, server 1
        # 0.2 M. Host 1's link carries one flow of each worker each way (worker 0's with 0.2 M
        # per iteration, worker 1's with 0.8 M); each gets C/8, as TCP shares it, so worker 0
        # takes 1.6 M / C and worker 1 6.4 M / C (sharing iterations alike would give both
        # 4 M / C). Host 0's link (C) carries C/4 in all.
        times = job(layers=[M16], worker_hosts=2, layout="beside", chunk=64 * 1024,
                    mode="async", slow={1: 0.25},
                    server_weights=[1, 0.25]).ps_bandwidth_times()
        self.assertAlmostEqual(times[0], 1.6 * M16 / C, places=5)
        self.assertAlmostEqual(times[1], 6.4 * M16 / C, places=5)

    def test_async_worker_without_remote_servers(self):
        # one small key, whole on server 0: worker 0 pushes to its own host only
        p = job(layers=[MiB], worker_hosts=2, layout="beside", mode="async").predict()
        self.assertEqual(p["ps"]["bandwidth_s"], MiB / C)  # worker 1's push and pull
        self.assertEqual(job(layers=[MiB], worker_hosts=2, layout="beside",
                             mode="async").ps_bandwidth_times()[0], 0.0)

    def test_fair_levels_match_one_filling_per_flow(self):
        # the water-filling of the sorted demands with one flow wanting more than any, done
        # again for each flow: fair_levels gives the same levels, bit for bit
        def one_filling(capacity, demands):
            left, waiting = capacity, sorted(demands)
            for i, d in enumerate(waiting):
                level = left / (len(waiting) - i)
                if d >= level:
                    return level
                left -= d
        for capacity, demands in ((10.0, [1.0, 2.0, 3.0]), (4.0, [3.0, 3.0, 3.0, 0.5]),
                                  (100.0, [1.0, 2.0]), (1.0, [0.1, 0.7, 0.2, 0.9, 0.2, 5.0]),
                                  (3.0, [1.0]), (2.5, [0.3] * 9 + [2.0, 0.1])):
            want = [one_filling(capacity, demands[:i] + [math.inf] + demands[i + 1:])
                    for i in range(len(demands))]
            self.assertEqual(plan.fair_levels(capacity, demands), want, demands)

    def test_drain_is_the_slowest_remote_server(self):
        # per worker: the slowest of its servers (beside: not its own) and its own link
        for kw in (dict(layout="own", server_hosts=3), dict(layout="beside"),
                   dict(layout="beside", slow={1: 0.25}), dict(layout="own", slow={0: 0.5}),
                   dict(layout="beside", server_weights=[1, 1, 0.25, 1, 2])):
            j = job(layers=[M16, MiB, 1000], worker_hosts=5, chunk=64 * 1024, **kw)
            last = j.placement()[1]
            want = []
            for w in range(5):
                times = [max(5 * x / j.capacity(("s", s)), x / j.worker_capacity(w))
                         if j.layout == "own" else
                         max(4 * x / j.worker_capacity(s), x / j.worker_capacity(w))
                         for s, x in enumerate(last) if j.layout == "own" or s != w]
                want.append(max(times))
            self.assertEqual(j.ps_drain(), want, kw)

    def test_share_only_where_every_link_is_busy(self):
        self.assertTrue(job(layers=[M16], worker_hosts=4, layout="own").balanced())
        self.assertTrue(job(layers=[M16], worker_hosts=4, layout="beside").balanced())
        self.assertFalse(job(layers=[M16], worker_hosts=4, layout="own",
                             slow={3: 0.25}).balanced())
        # share 0.5 doubles the link time of a balanced dist_sync job only
        for kw, factor in ((dict(), 2.0), (dict(slow={3: 0.25}), 1.0),
                           (dict(mode="async"), 1.0)):
            a = job(layers=[M16], worker_hosts=4, chunk=64 * 1024, **kw).predict()["ps"]
            b = job(layers=[M16], worker_hosts=4, chunk=64 * 1024, ps_share=0.5,
                    **kw).predict()["ps"]
            self.assertAlmostEqual(b["comm_s"] - b["drain_s"],
                                   factor * (a["comm_s"] - a["drain_s"]), places=6, msg=kw)

    def test_compute_overlap_and_efficiency(self):
        j = job(layers=[M16], worker_hosts=4, compute=1.0, overlap=0.5)
        self.assertEqual(j.iteration(2.0), 2.5)   # 1 + (2 - 0.5)
        self.assertEqual(j.iteration(0.3), 1.0)   # hidden entirely
        p = j.predict()
        ar = p["allreduce"]
        self.assertAlmostEqual(ar["efficiency"], 1.0 / ar["iteration_s"])

    def test_min_server_hosts(self):
        # ring: 1.5 M/C. own with S hosts: max(1, 4/S) M/C + 4 x 64 KiB / C (= M/64 / C):
        # S = 3 gives 1.349 M/C <= 1.5; S = 2 gives 2.016 M/C
        base = dict(IDEAL, layers=[M16], worker_hosts=4, chunk=64 * 1024)
        self.assertEqual(plan.min_server_hosts_to_beat(base), 3)

    def test_bad_jobs(self):
        for kw in (dict(worker_hosts=0), dict(layout="mesh"), dict(mode="eventual"),
                   dict(efficiency=1.5), dict(ps_share=0), dict(slow={7: 0.5}),
                   dict(overlap=2), dict(gpus_per_host=0), dict(bigarray_bound=-3)):
            args = dict(layers=[M16], worker_hosts=4)
            args.update(kw)
            with self.assertRaises(plan.PlanError, msg=kw):
                job(**args)


class Check(unittest.TestCase):

    def doc(self):
        case = dict(system="ps", layout="own", mode="dist_sync", size=M16, workers=4,
                    server_hosts=4, chunk_bytes=64 * 1024)
        return {"meta": {"rate_bit": 100e6, "workers": 4, "chunk_bytes": 65536,
                         "date": "2026-11-23"},
                "reference": {"goodput_fraction": 1.0},
                "cases": [
                    dict(case, label="ps_own_sync_16MB", iteration_s=1.36314880),
                    dict(case, label="ps_own_sync_16MB_off", iteration_s=2.0),
                    dict(label="mpi_ring_16MB", system="mpi", algorithm="ring", size=M16,
                         workers=4, iteration_s=2.01326592),
                    dict(label="mpi_default_16MB", system="mpi", algorithm="default",
                         size=M16, workers=4, iteration_s=4.0),
                    dict(label="tcp_reference", system="tcp")]}

    def test_share_follows_the_runs_rate_and_receive_buffer(self):
        self.assertEqual(plan.bed_share(100e6), plan.BED_PS_SHARES[(100e6, None)])
        self.assertEqual(plan.bed_share(150e6), plan.BED_PS_SHARES[(200e6, None)])  # log scale
        self.assertEqual(plan.bed_share(100e6, 65536), plan.BED_PS_SHARES[(100e6, 65536)])
        # a receive buffer the bed did not measure: the autotuned windows' share
        self.assertEqual(plan.bed_share(1e9, 12345), plan.BED_PS_SHARES[(200e6, None)])
        doc = self.doc()
        rows = {r["label"]: r for r in plan.check_rows(doc)}
        doc["meta"]["tcp_rcvbuf"] = 65536
        tuned = {r["label"]: r for r in plan.check_rows(doc)}
        share, tuned_share = plan.BED_PS_SHARES[(100e6, None)], plan.BED_PS_SHARES[(100e6, 65536)]
        # the share divides the link time: the predictions scale by its ratio (plus the drain
        # and the round trip, which it does not touch)
        self.assertLess(tuned["ps_own_sync_16MB"]["predicted"], rows["ps_own_sync_16MB"]["predicted"])
        self.assertAlmostEqual(rows["ps_own_sync_16MB"]["implied_share"],
                               tuned["ps_own_sync_16MB"]["implied_share"])
        self.assertGreater(tuned_share, share)

    def test_rows(self):
        rows = plan.check_rows(self.doc(), ps_share=1.0)
        by = {r["label"]: r for r in rows}
        self.assertEqual(set(by), {"ps_own_sync_16MB", "ps_own_sync_16MB_off", "mpi_ring_16MB",
                                   "mpi_default_16MB"})
        # latency 50 us in the check: a round trip of 100 us on top
        self.assertAlmostEqual(by["ps_own_sync_16MB"]["error"], 1e-4 / 1.3631488, places=6)
        self.assertTrue(by["ps_own_sync_16MB"]["within"])
        self.assertFalse(by["ps_own_sync_16MB_off"]["within"])
        self.assertTrue(by["mpi_ring_16MB"]["within"])
        self.assertIsNone(by["mpi_default_16MB"]["predicted"])

    def test_replication_is_not_modelled(self):
        doc = self.doc()
        doc["meta"]["replication"] = "1"
        by = {r["label"]: r for r in plan.check_rows(doc, ps_share=1.0)}
        self.assertIsNone(by["ps_own_sync_16MB"]["predicted"])
        self.assertIn("replication", by["ps_own_sync_16MB"]["note"])
        self.assertIsNotNone(by["mpi_ring_16MB"]["predicted"])  # MPI keeps no copies

    def test_link_delay_is_latency(self):
        # the bed's --delay: one way between two hosts crosses both links' delay
        doc = self.doc()
        base = {r["label"]: r["predicted"] for r in plan.check_rows(doc, ps_share=1.0)}
        doc["meta"]["delay_us"] = 2000
        late = {r["label"]: r["predicted"] for r in plan.check_rows(doc, ps_share=1.0)}
        # the PS: one round trip (2 x 4 ms); Open MPI's ring: 2 (N - 1) steps, N = 4, of two
        # latencies each (4 MiB messages go by rendezvous)
        self.assertAlmostEqual(late["ps_own_sync_16MB"] - base["ps_own_sync_16MB"], 0.008)
        self.assertAlmostEqual(late["mpi_ring_16MB"] - base["mpi_ring_16MB"], 6 * 2 * 0.004)

    def test_cli(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            with open(path, "w") as f:
                json.dump(self.doc(), f)
            code, out, _ = run_cli("check", path, "--ps-share", "1")
            self.assertEqual(code, 0)
            self.assertIn("2 of 3 modelled cases within 15%", out)
            code, out, _ = run_cli("check", path, "--ps-share", "1", "--strict")
            self.assertEqual(code, 1)
            code, out, _ = run_cli("check", path, "--ps-share", "1", "--markdown")
            self.assertIn("| ps_own_sync_16MB | 100mbit |", out)
            # a file that is missing or not JSON: one line naming it
            code, _, err = run_cli("check", os.path.join(d, "missing.json"))
            self.assertEqual((code, err.strip()), (2, f"ps-plan.py: error: cannot read "
                                                      f"{d}/missing.json: No such file or "
                                                      "directory"))
            with open(path, "w") as f:
                f.write("{cut")
            code, _, err = run_cli("check", path)
            self.assertEqual(code, 2)
            self.assertTrue(err.startswith(f"ps-plan.py: error: {path} is not JSON: "), err)


class Cli(unittest.TestCase):

    def test_bad_flags_are_named(self):
        args = ["predict", "--model", "16MB", "--workers", "4", "--rate", "1gbit"]
        for flag, value, says in (("--gpus-per-host", "0", "--gpus-per-host 0: want at least 1"),
                                  ("--efficiency", "0", "--efficiency 0: want a share in (0, 1]"),
                                  ("--overlap", "3", "--overlap 3: want a share in [0, 1]")):
            code, _, err = run_cli(*args, flag, value)
            self.assertEqual((code, err.strip()), (2, "ps-plan.py: error: " + says))

    ARGS = ["predict", "--model", "16MB", "--workers", "4", "--rate", "1gbit"]

    def assertRefused(self, argv, says):
        code, out, err = run_cli(*argv)
        self.assertEqual((code, err.strip()), (2, "ps-plan.py: error: " + says), argv)
        self.assertEqual(out, "")

    def test_compression_outside_0_1_is_refused(self):
        for flag in ("--push-compression", "--pull-compression", "--allreduce-compression"):
            for value, shown in (("0", "0"), ("-1", "-1"), ("-3", "-3"), ("5", "5"),
                                 ("1.5", "1.5"), ("nan", "nan"), ("-1e-9", "-1e-09")):
                self.assertRefused(self.ARGS + [flag, value],
                                   f"{flag} {shown}: want a share in (0, 1]")
            code, _, err = run_cli(*self.ARGS, flag, "0.0625")
            self.assertEqual(code, 0, err)
        for kw in (dict(push_ratio=0), dict(pull_ratio=-3), dict(allreduce_ratio=2)):
            with self.assertRaises(plan.PlanError, msg=kw):
                job(layers=[M16], worker_hosts=4, **kw)

    def test_server_hosts_zero_is_refused(self):
        # 0 means nothing: the default (as many as the workers) is the flag left out
        for value in ("0", "-2"):
            self.assertRefused(self.ARGS + ["--layout", "own", "--server-hosts", value],
                               f"--server-hosts {value}: want at least 1 server host")
        self.assertEqual(job(layers=[M16], worker_hosts=4).server_hosts, 4)
        with self.assertRaises(plan.PlanError):
            job(layers=[M16], worker_hosts=4, layout="own", server_hosts=0)

    def test_empty_layer_is_refused(self):
        base = ["predict", "--workers", "4", "--rate", "1gbit", "--layers"]
        self.assertRefused(base + ["1MB,,2MB"], "--layers 1MB,,2MB: item 2 of 3 is empty: "
                                                "want sizes, comma-separated (4MB,96MB,1MB)")
        self.assertRefused(base + ["1MB,2MB,"], "--layers 1MB,2MB,: item 3 of 3 is empty: "
                                                "want sizes, comma-separated (4MB,96MB,1MB)")
        self.assertRefused(base + ["1MB,lots"], "--layers 1MB,lots: 'lots': want a size such "
                                                "as 16MB (B, KB, MB, GB, TB; binary)")

    def test_slow_host_given_twice_is_refused(self):
        self.assertRefused(self.ARGS + ["--slow", "0=0.5", "--slow", "h0=0.25"],
                           "--slow h0=0.25: worker host 0 is given twice (--slow 0=0.5): "
                           "want one factor per host")
        code, _, err = run_cli(*self.ARGS, "--slow", "0=0.5", "--slow", "1=0.25")
        self.assertEqual(code, 0, err)

    def test_many_workers_in_linear_time(self):
        # dist_sync's drain was worker hosts x server hosts: 44 s for 10000 workers
        for layout in ("own", "beside"):
            start = time.monotonic()
            code, out, err = run_cli(*self.ARGS[:4], "10000", "--rate", "1gbit", "--layout",
                                     layout)
            self.assertEqual(code, 0, err)
            self.assertLess(time.monotonic() - start, 5.0, layout)
            self.assertIn("10000 worker hosts", out)
        # dist_async follows every connection: refused past its bound, naming the flag
        n = plan.ASYNC_MAX_HOSTS
        self.assertRefused(self.ARGS + ["--mode", "async", "--workers", str(n + 1)],
                           f"--workers {n + 1}: dist_async is modelled up to {n} hosts (its "
                           "fair rates follow every connection); want fewer, or --mode sync")
        self.assertRefused(self.ARGS + ["--mode", "async", "--server-hosts", str(n + 1)],
                           f"--server-hosts {n + 1}: dist_async is modelled up to {n} hosts "
                           "(its fair rates follow every connection); want fewer, or --mode "
                           "sync")
        code, _, err = run_cli(*self.ARGS, "--mode", "async", "--workers", str(n))
        self.assertEqual(code, 0, err)

    def test_negative_values_name_their_flag(self):
        for flag, value, says in (("--model", "-5MB", "'-5MB': want a positive size"),
                                  ("--rate", "-1gbit", "'-1gbit': want a positive rate"),
                                  ("--server-rate", "-1gbit", "'-1gbit': want a positive rate"),
                                  ("--latency", "-1us", "'-1us': want a positive time (or 0)"),
                                  ("--compute", "-.5", "'-.5': want a time such as 25us")):
            for argv in (self.ARGS + [flag, value], self.ARGS + [f"{flag}={value}"]):
                code, _, err = run_cli(*argv)
                self.assertEqual(code, 2, argv)
                self.assertIn(f"argument {flag}: {says}", err)
                self.assertNotIn("expected one argument", err)
        self.assertRefused(self.ARGS + ["--push-compression", "-1e-9"],
                           "--push-compression -1e-09: want a share in (0, 1]")
        # an unknown option still fails as one; what follows '--' is left alone
        code, _, err = run_cli(*self.ARGS, "--bogus", "-5MB")
        self.assertEqual(code, 2)
        self.assertIn("unrecognized arguments: --bogus=-5MB", err)
        self.assertEqual(plan.join_negative_values(["check", "--strict", "--", "-1.json"]),
                         ["check", "--strict", "--", "-1.json"])

    def test_plot_directory_is_checked_before_any_rerun(self):
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(plan.subprocess, "run", side_effect=AssertionError("re-run")):
            png = os.path.join(d, "missing", "x.png")
            self.assertRefused(["advise", "--gpus", "16", "--plot", png],
                               f"--plot {png}: no directory {d}/missing")
            with mock.patch.object(plan.os, "access", return_value=False):
                self.assertRefused(["advise", "--gpus", "16", "--plot", f"{d}/x.png"],
                                   f"--plot {d}/x.png: cannot write in {d}")

    def test_failed_plot_rerun_is_not_blamed_on_matplotlib(self):
        # no matplotlib here: the system's python3 draws the plot, and says itself why not
        argv = ["advise", "--model", "100MB", "--gpus", "16", "--plot", "x.png"]
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(plan, "plot_advise", side_effect=ImportError), \
                mock.patch.object(plan.subprocess, "run") as rerun:
            system = os.path.join(d, "python3")
            open(system, "w").close()
            argv[-1] = os.path.join(d, "x.png")
            with mock.patch.object(plan, "SYSTEM_PYTHON", system):
                for child, want in ((1, (1, "")), (0, (0, ""))):
                    rerun.return_value = subprocess.CompletedProcess([], child)
                    code, out, err = run_cli(*argv)
                    self.assertEqual((code, err), want)
                    self.assertEqual(rerun.call_args[0][0][0], system)
                self.assertIn(f"wrote {argv[-1]}", out)
            # this is the system's python3 (or there is none): matplotlib is missing
            for system in (sys.executable, os.path.join(d, "none")):
                with mock.patch.object(plan, "SYSTEM_PYTHON", system):
                    code, _, err = run_cli(*argv)
                    self.assertEqual((code, err.strip()), (2, "ps-plan.py: error: --plot needs "
                                                              "matplotlib (python3-matplotlib)"))

    def test_predict(self):
        code, out, _ = run_cli("predict", "--model", "16MB", "--workers", "4", "--layout", "own",
                               "--rate", "100mbit", "--efficiency", "1", "--latency", "0",
                               "--ps-share", "1", "--chunk", "4MB")
        self.assertEqual(code, 0, out)
        self.assertIn("PS:              iteration 2.6844 s", out)
        self.assertIn("ring all-reduce: iteration 2.0133 s", out)
        code, out, _ = run_cli("predict", "--layers", "8MB,8MB", "--workers", "4", "--rate",
                               "100mbit", "--json", "--slow", "3=0.25", "--mode", "async")
        self.assertEqual(code, 0)
        p = json.loads(out)
        self.assertEqual(p["model_bytes"], M16)
        self.assertEqual(len(p["ps"]["per_worker_s"]), 4)

    def test_advise(self):
        with tempfile.TemporaryDirectory() as d:
            code, out, _ = run_cli("advise", "--gpus", "8,64,1024", "--json")
            self.assertEqual(code, 0)
            doc = json.loads(out)
            self.assertEqual([r["gpus"] for r in doc[0]["rows"]], [8, 64, 1024] * 2)
            one_host = doc[0]["rows"][0]
            self.assertEqual(one_host["allreduce"]["comm_s"], 0)  # 8 GPUs: one host
            code, out, _ = run_cli("advise", "--model", "100MB", "--compute", "0.1",
                                   "--rates", "25gbit", "--gpus", "16,128", "--markdown")
            self.assertEqual(code, 0)
            self.assertIn("| 25gbit | 128 | 16 |", out)
            png = os.path.join(d, "advise.png")
            code, out, err = run_cli("advise", "--model", "100MB", "--gpus", "16,32",
                                     "--plot", png)
            if code == 2 and "matplotlib" in err:
                self.skipTest("no matplotlib for the plot")
            self.assertEqual(code, 0, err)
            self.assertGreater(os.path.getsize(png), 1000)

    def test_errors(self):
        code, _, err = run_cli("predict", "--workers", "4", "--rate", "1gbit")
        self.assertEqual(code, 2)
        self.assertIn("give --model or --layers", err)
        code, _, err = run_cli("predict", "--model", "lots", "--workers", "4", "--rate", "1gbit")
        self.assertEqual(code, 2)
        self.assertIn("want a size such as 16MB", err)
        code, _, _ = run_cli("--help")
        self.assertEqual(code, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
