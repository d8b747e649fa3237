#!/usr/bin/env python3
"""Draws ps-bench's JSON (ps-bench --json FILE) into one PNG.

Top row: throughput against tensor size (1 MB and up, where throughput means something) for push,
pull and push+pull (1 worker, 1 server; each mode and transport), with the raw ZeroMQ echo
measured in the same run.
Bottom row: p50 latency against size (push+pull and the echo round trip), the 16 MB push+pull
aggregate throughput of every job size, and the named targets (each a ratio of two numbers of
the run: measured / target, >= 1 means met).

usage: tools/plot_bench.py BENCH.json [-o OUT.png] [--title TEXT]
       tools/plot_bench.py --summary RUN1.json RUN2.json ...
The first form needs matplotlib (Debian: python3-matplotlib). --summary prints, without
matplotlib, a Markdown table of the target ratios of several runs (min, median, max): on a
shared or small machine one run is not enough to call a target met.
"""
import argparse
import json
import statistics
import sys

MB16 = 16 << 20
MODE_STYLE = {"dist_sync": "-", "dist_async": "--"}
TRANSPORT_COLOR = {"shm": "tab:green", "ipc": "tab:blue", "tcp": "tab:orange"}
ECHO_COLOR = {"zmq_echo_ipc": "tab:cyan", "zmq_echo_tcp": "tab:red"}


def size_label(size):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return "%d %s" % (size // scale, unit)
    return "%d B" % size


def series(cases, **match):
    rows = [c for c in cases if all(c.get(k) == v for k, v in match.items())]
    rows.sort(key=lambda c: c["size"])
    return [c["size"] for c in rows], rows


def size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes], rotation=30, fontsize=8)
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)


def summary(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    # Ratios keyed by their description, in the order of the first run that has them.
    order, values, info = [], {}, {}
    for doc in runs:
        for r in doc.get("ratios", []):
            key = (r["id"], r["what"])
            if key not in values:
                order.append(key)
                values[key] = []
                info[key] = r
            if r.get("ratio") is not None:
                values[key].append(r["ratio"])
    print("| target | what | runs | min | median | max | met in |")
    print("|---|---|---|---|---|---|---|")
    for key in order:
        r, vs = info[key], sorted(values[key])
        if not vs:
            continue
        median = statistics.median(vs)
        if r.get("target"):
            bound = float(r["target"].split()[1])
            at_least = r["target"].startswith(">=")
            met = sum(1 for v in vs if (v >= bound if at_least else v <= bound))
            verdict = "%d of %d" % (met, len(vs))
            target = r["target"] + "x"
        else:
            verdict, target = "(information)", "-"
        print("| %s %s | %s | %d | %.2fx | %.2fx | %.2fx | %s |" % (
            key[0], target, r["what"], len(vs), vs[0], median, vs[-1], verdict))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--summary":
        if len(sys.argv) < 3:
            sys.exit("usage: plot_bench.py --summary RUN1.json [RUN2.json ...]")
        summary(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="ps-bench --json output")
    parser.add_argument("-o", "--output", default="bench.png", help="PNG to write (bench.png)")
    parser.add_argument("--title", default=None, help="figure title (default: from the JSON)")
    args = parser.parse_args()

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

    with open(args.json) as f:
        doc = json.load(f)
    cases = doc["cases"]
    ps = [c for c in cases if c["mode"] in ("dist_sync", "dist_async")]
    echo_sizes = {c["size"] for c in cases if c["op"].startswith("zmq_echo")}
    sizes = sorted({c["size"] for c in ps} | echo_sizes)
    transports = sorted({c.get("transport", "") for c in ps if c.get("transport")})
    modes = [m for m in ("dist_sync", "dist_async") if any(c["mode"] == m for c in ps)]

    # The targets panel (bottom right) has two lines of text per target: past 14 targets the
    # figure grows so that they stay legible.
    ratios = [r for r in doc.get("ratios", []) if r.get("ratio") is not None and r.get("target")]
    fig, axes = plt.subplots(2, 3, figsize=(18, 11 + 0.4 * max(0, len(ratios) - 14)))
    title = args.title or "ps-bench %s, %s hardware threads, load average %s" % (
        doc.get("date_utc", "")[:10],
        doc.get("hardware_threads", "?"),
        doc.get("load_average_start", "?"),
    )
    fig.suptitle(title, fontsize=13)

    # Top row: throughput vs size, 1 worker 1 server, against the raw ZeroMQ echo. Below 1 MB
    # throughput is dominated by latency (bottom left), so the panels start at 1 MB when they can.
    big = [s for s in sizes if s >= (1 << 20)] or sizes

    def in_big(xs, rows):
        kept = [(x, r) for x, r in zip(xs, rows) if x in big]
        return [x for x, _ in kept], [r for _, r in kept]

    for ax, op, name in zip(axes[0], ("push", "pull", "pushpull"), ("push", "pull", "push+pull")):
        for transport in transports:
            for mode in modes:
                xs, rows = in_big(*series(ps, op=op, workers=1, servers=1, mode=mode,
                                          transport=transport))
                if xs:
                    ax.plot(xs, [r["throughput_gbps"] for r in rows], MODE_STYLE[mode],
                            marker="o", color=TRANSPORT_COLOR.get(transport),
                            label="ps %s %s" % (mode, transport))
        for echo in ("zmq_echo_ipc", "zmq_echo_tcp"):
            xs, rows = in_big(*series(cases, op=echo))
            if xs:
                ax.plot(xs, [r["throughput_gbps"] for r in rows], ":", marker="s",
                        color=ECHO_COLOR[echo],
                        label="raw ZeroMQ %s echo (round trip)" % echo.split("_")[-1])
        ax.set_ylim(bottom=0)
        size_axis(ax, big)
        ax.set_title("%s throughput, 1 worker 1 server" % name)
        ax.set_xlabel("tensor size")
        ax.set_ylabel("GB/s (1e9 B/s, tensor bytes per iteration)")
        ax.legend(fontsize=7, loc="lower left")

    # Bottom left: p50 latency vs size.
    ax = axes[1][0]
    for transport in transports:
        for mode in modes:
            xs, rows = series(ps, op="pushpull", workers=1, servers=1, mode=mode,
                              transport=transport)
            if xs:
                ax.plot(xs, [r["p50_us"] for r in rows], MODE_STYLE[mode], marker="o",
                        color=TRANSPORT_COLOR.get(transport),
                        label="push+pull %s %s" % (mode, transport))
    for echo in ("zmq_echo_ipc", "zmq_echo_tcp"):
        xs, rows = series(cases, op=echo)
        if xs:
            ax.plot(xs, [r["p50_us"] for r in rows], ":", marker="s", color=ECHO_COLOR[echo],
                    label="ZeroMQ %s echo round trip" % echo.split("_")[-1])
    ax.set_yscale("log")
    size_axis(ax, sizes)
    ax.set_title("p50 latency per iteration, 1 worker 1 server")
    ax.set_xlabel("tensor size")
    ax.set_ylabel("microseconds")
    ax.legend(fontsize=7, loc="upper left")

    # Bottom middle: 16 MB push+pull aggregate throughput by job size, over the transport that
    # ran the most job sizes (ps-bench's first --transports).
    ax = axes[1][1]

    def pushpull16(transport, **match):
        return [c for c in ps if c["op"] == "pushpull" and c["size"] == MB16
                and c.get("transport") == transport
                and all(c.get(k) == v for k, v in match.items())]

    main_transport = max(transports, default="",
                         key=lambda t: len({(c["workers"], c["servers"]) for c in pushpull16(t)}))
    jobs = sorted({(c["workers"], c["servers"]) for c in pushpull16(main_transport)})
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        values = []
        for w, s in jobs:
            row = pushpull16(main_transport, workers=w, servers=s, mode=mode)
            values.append(row[0]["throughput_gbps"] if row else 0)
        ax.bar([j + i * width for j in range(len(jobs))], values, width, label=mode)
    echo = [c for c in cases if c["op"] == "zmq_echo_%s" % main_transport and c["size"] == MB16]
    if echo:
        ax.axhline(echo[0]["throughput_gbps"], color="black", linestyle=":",
                   label="raw ZeroMQ %s echo, 16 MB" % main_transport)
    if not jobs:
        ax.text(0.5, 0.5, "no 16 MB push+pull cases in this run", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(jobs))])
    ax.set_xticklabels(["%dw %ds" % job for job in jobs], fontsize=8, rotation=45)
    ax.set_title("16 MB push+pull over %s: aggregate throughput by job" % (main_transport or "?"))
    ax.set_ylabel("GB/s, summed over workers")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)

    # Bottom right: the target ratios (value / target: >= 1 means met).
    ax = axes[1][2]
    labels, scores, colors = [], [], []
    for r in ratios:
        bound = float(r["target"].split()[1])
        at_least = r["target"].startswith(">=")
        score = r["ratio"] / bound if at_least else bound / r["ratio"]
        short = r.get("label") or r["what"].split(":")[0]
        labels.append("%s: %.2fx, target %sx\n%s" % (r["id"], r["ratio"], r["target"], short[:48]))
        scores.append(score)
        colors.append("tab:green" if r.get("met") else "tab:red")
    if not ratios:
        ax.text(0.5, 0.5, "no target computable from this run", ha="center", va="center",
                transform=ax.transAxes)
    if ratios:
        ax.barh(range(len(ratios)), scores, color=colors)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_yticks(range(len(ratios)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
    ax.set_title("targets: measured / target (>= 1: met)")
    ax.set_xlabel("score: ratio / bound (for <= targets: bound / ratio)")
    ax.grid(True, axis="x", alpha=0.3)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(args.output, dpi=110)
    print("plot_bench.py: wrote %s" % args.output)


if __name__ == "__main__":
    main()
