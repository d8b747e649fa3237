#!/usr/bin/env python3
"""Draws ps-train's metrics (--metrics-out with {rank}: one JSON-lines file per worker) into
one PNG: train loss, train and test accuracy, and each worker's samples/sec, per epoch.

usage: tools/plot_training.py METRICS.jsonl [METRICS.jsonl ...] -o OUT.png [--title TEXT]

Each file holds the records of one worker: {"event": "epoch", "rank": R, "epoch": E,
"train_loss": L, "train_accuracy": A, "samples_per_sec": S, ...}, {"event": "test", ...} (rank 0
only) and {"event": "final", ...}. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def load(paths):
    """Per rank, its epoch records; rank 0's test accuracies; the final record."""
    epochs, tests, final = {}, {}, None
    for path in paths:
        try:
            with open(path) as f:
                lines = [line for line in f if line.strip()]
        except OSError as e:
            sys.exit(f"plot_training.py: error: cannot read {path}: {e.strerror}")
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                sys.exit(f"plot_training.py: error: {path}:{number} is not a JSON record")
            event = record.get("event")
            if event == "epoch":
                epochs.setdefault(record["rank"], []).append(record)
            elif event == "test":
                tests[record["epoch"]] = record["test_accuracy"]
            elif event == "final" and record.get("rank") == 0:
                final = record
    if not epochs:
        sys.exit("plot_training.py: error: no epoch records in " + ", ".join(paths))
    return epochs, tests, final


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", help="ps-train --metrics-out files")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--title", default="ps-train", help="the figure's title")
    args = parser.parse_args()
    epochs, tests, final = load(args.metrics)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax, speed_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    rank0 = sorted(epochs.get(0, next(iter(epochs.values()))), key=lambda r: r["epoch"])
    xs = [r["epoch"] + 1 for r in rank0]
    loss_ax.plot(xs, [r["train_loss"] for r in rank0], marker="o")
    loss_ax.set(title="train loss (worker 0)", xlabel="epoch", ylabel="cross-entropy")
    acc_ax.plot(xs, [r["train_accuracy"] for r in rank0], marker="o", label="train (worker 0)")
    if tests:
        test_epochs = sorted(tests)
        acc_ax.plot([e + 1 for e in test_epochs], [tests[e] for e in test_epochs], marker="s",
                    label="test")
    acc_ax.set(title="accuracy", xlabel="epoch", ylabel="accuracy")
    acc_ax.legend()
    acc_ax.grid(alpha=0.3)
    for rank in sorted(epochs):
        records = sorted(epochs[rank], key=lambda r: r["epoch"])
        speed_ax.plot([r["epoch"] + 1 for r in records], [r["samples_per_sec"] for r in records],
                      marker="o", label=f"worker {rank}")
    speed_ax.set(title="samples/sec per worker", xlabel="epoch", ylabel="samples/sec")
    speed_ax.set_ylim(bottom=0)
    speed_ax.legend()
    title = args.title
    if final:
        title += f" - final test accuracy {final['test_accuracy']:.4f}"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=90)
    print(f"plot_training.py: wrote {args.output}")


if __name__ == "__main__":
    main()
