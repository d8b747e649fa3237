"""Unit tests of tools/bench/bed_bench.py's parts that need no test bed: units, the counter
arithmetic (interpolation, a window's link utilisation and CPU), the target ratios, the report
and the command line. Standard library only; no root (the bed itself: test_multihost_bench.py).
"""
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location(
    "bed_bench", os.path.join(REPO, "tools", "bench", "bed_bench.py"))
bb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bb)

MiB = 1 << 20


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = bb.main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def samples(rate_bytes, seconds=10, step=0.5, cpu_busy=0.25):
    """h0 sends rate_bytes/s, h1 receives half that; 2 cores, `cpu_busy` of them busy."""
    out = []
    for i in range(int(seconds / step) + 1):
        t = 1000.0 + i * step
        jiffies = 100 * 2 * i * step  # 2 cores at 100 Hz
        out.append((t, {"h0": (int(rate_bytes * i * step), 0),
                        "h1": (0, int(rate_bytes / 2 * i * step))},
                    (cpu_busy * jiffies, jiffies, 0.1 * jiffies), 0.05 * jiffies))
    return out


class Units(unittest.TestCase):

    def test_sizes(self):
        self.assertEqual(bb.parse_size("16MB"), 16 * MiB)
        self.assertEqual(bb.size_name(100 * MiB), "100MB")
        self.assertEqual(bb.size_name(65536), "64KB")
        self.assertEqual(bb.parse_rate_bits("100mbit"), 100e6)
        self.assertEqual(bb.fmt_rate(100e6), "100mbit")
        self.assertEqual(bb.fmt_rate(25e6), "25mbit")
        self.assertEqual(bb.fmt_rate(1e9), "1gbit")
        import argparse
        for bad in ("16", "3B", "lots"):
            with self.assertRaises(argparse.ArgumentTypeError):
                bb.parse_size(bad)
        # --tcp-rcvbuf: a size, or 0 for the kernel's autotuning
        self.assertEqual(bb.parse_size_or_zero("0"), 0)
        self.assertEqual(bb.parse_size_or_zero("64KB"), 65536)
        with self.assertRaises(argparse.ArgumentTypeError):
            bb.parse_size_or_zero("0KB")
        with self.assertRaises(argparse.ArgumentTypeError):
            bb.parse_rate_bits("100kbit")  # below 1mbit


class Counters(unittest.TestCase):

    def test_interpolate(self):
        s = samples(1e6)
        self.assertEqual(bb.interpolate(s, 1001.25, lambda x: x[1]["h0"][0]), 1250000)
        self.assertEqual(bb.interpolate(s, 0, lambda x: x[1]["h0"][0]), 0)  # clamped

    def test_window(self):
        # h0 sends 10 Mbit/s worth of bytes on a 10 Mbit/s link: utilisation 1; h1 receives
        # half of it; the machine 25% busy, the bed's processes 5%, softirq 10%
        s = samples(1.25e6)
        w = bb.window_stats(s, 1001.0, 1009.0, {"h0": 10e6, "h1": 10e6})
        self.assertAlmostEqual(w["link_utilisation"], 1.0, places=6)
        self.assertEqual(w["busiest_link"], "h0 sent")
        self.assertAlmostEqual(w["links"]["h1"]["received_util"], 0.5, places=6)
        self.assertAlmostEqual(w["cpu_busy"], 0.25, places=6)
        self.assertAlmostEqual(w["cpu_bed_processes"], 0.05, places=6)
        self.assertAlmostEqual(w["cpu_softirq"], 0.1, places=6)
        self.assertIsNone(bb.window_stats(s, 1005.0, 1005.0, {"h0": 1, "h1": 1}))
        ts = bb.timeseries(s, 1001.0, 1003.0, step=1.0)
        self.assertEqual(ts["t"], [1.0, 2.0])
        self.assertEqual(ts["h0"]["sent"], [10.0, 10.0])


def fake_cases():
    def ps(label, layout, mode, size, it, util=0.9, per=None, straggler=None):
        c = {"label": label, "system": "ps", "layout": layout, "mode": mode, "size": size,
             "workers": 4, "iteration_s": it if mode == "dist_sync" else None,
             "window": {"link_utilisation": util, "busiest_link": "h0 sent", "cpu_busy": 0.5,
                        "cpu_bed_processes": 0.1, "cpu_softirq": 0.05},
             "per_worker": per or [{"rank": r, "mean_s": it, "median_s": it,
                                    "bytes_per_s": size / it} for r in range(4)]}
        if straggler:
            c["straggler"] = straggler
        return c

    def mpi(alg, size, it):
        return {"label": f"mpi_{alg}_{bb.size_name(size)}", "system": "mpi", "algorithm": alg,
                "size": size, "workers": 4, "iteration_s": it, "median_s": it,
                "window": {"link_utilisation": 0.9, "busiest_link": "h1 sent",
                           "cpu_busy": 0.4, "cpu_bed_processes": 0.3, "cpu_softirq": 0.01}}
    s = 16 * MiB
    slow = [{"rank": r, "mean_s": 1.1 if r < 3 else 4.0, "median_s": 1.0,
             "bytes_per_s": s / (1.1 if r < 3 else 4.0)} for r in range(4)]
    return [ps("ps_beside_sync_16MB", "beside", "dist_sync", s, 2.2),
            ps("ps_own_sync_16MB", "own", "dist_sync", s, 1.5, util=0.8),
            mpi("default", s, 4.0), mpi("ring", s, 2.0),
            ps("ps_own_async_16MB", "own", "dist_async", s, 1.0),
            ps("straggler_ps_own_async_16MB", "own", "dist_async", s, 1.0, per=slow,
               straggler={"host": "h3", "factor": 4}),
            ps("straggler_ps_own_sync_16MB", "own", "dist_sync", s, 5.0,
               straggler={"host": "h3", "factor": 4})]


class Ratios(unittest.TestCase):

    def test_targets(self):
        r = {x["id"]: x for x in bb.ratios(fake_cases(), 4)}
        self.assertAlmostEqual(r["beside_vs_mpi_16MB"]["value"], 1.1)   # 2.2 / 2.0 (ring)
        self.assertTrue(r["beside_vs_mpi_16MB"]["met"])
        self.assertIn("(ring)", r["beside_vs_mpi_16MB"]["what"])
        self.assertAlmostEqual(r["own_vs_mpi_16MB"]["value"], 0.75)
        self.assertTrue(r["own_vs_mpi_16MB"]["met"])
        self.assertFalse(r["util_ps_own_sync_16MB"]["met"])             # 0.8 < 0.9
        self.assertTrue(r["util_ps_beside_sync_16MB"]["met"])
        # the full-rate workers went from 1.0 s to 1.1 s an iteration: 1 - 1/1.1 = 9.1% less
        self.assertAlmostEqual(r["straggler_async_drop_own"]["value"], 1 - 1 / 1.1)
        self.assertTrue(r["straggler_async_drop_own"]["met"])
        self.assertAlmostEqual(r["slowdown_ps_own_sync_16MB"]["value"], 5.0 / 1.5)

    def test_report(self):
        doc = {"meta": {"workers": 4, "server_hosts": 4, "rate_bit": 100e6, "date": "d",
                        "host": "h", "cores": 2, "cpu_model": "cpu"},
               "reference": None, "cases": fake_cases()}
        doc["ratios"] = bb.ratios(doc["cases"], 4)
        out = io.StringIO()
        bb.print_report(doc, out)
        text = out.getvalue()
        self.assertIn("ps_own_sync_16MB", text)
        self.assertIn("NOT met", text)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bed_bench.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            code, out, _ = run_cli("--report", path)
            self.assertEqual(code, 0)
            self.assertIn("ratios:", out)


class Cli(unittest.TestCase):

    def test_help_and_errors(self):
        code, out, _ = run_cli("--help")
        self.assertEqual(code, 0)
        self.assertIn("--rate", out)
        code, _, err = run_cli("--rate", "fast")
        self.assertEqual(code, 2)
        code, _, err = run_cli("--layouts", "nowhere")
        self.assertEqual(code, 2)
        self.assertIn("unknown nowhere", err)
        code, _, err = run_cli("--workers", "1")
        self.assertEqual(code, 2)

    @unittest.skipIf(os.geteuid() == 0, "root: a bed could be made here")
    def test_no_bed_is_a_skip(self):
        code, out, _ = run_cli("--smoke", "--out", tempfile.mkdtemp())
        self.assertEqual(code, bb.SKIP_CODE)
        self.assertIn("SKIP: multi-host test bed unavailable", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
