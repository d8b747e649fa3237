#!/usr/bin/env python3
"""ps-plan.py: a capacity model of the parameter server and of ring all-reduce.

Given a model (its size, or its layers' sizes), the worker hosts and GPUs per host, the servers
and where they run, the links' rate and latency, the compute time per batch and the gradient
compression, it predicts the iteration time and the scaling efficiency of the parameter server
(dist_sync or dist_async) and of ring all-reduce, and which is faster.

    ps-plan.py predict --model 16MB --workers 4 --layout own --rate 100mbit
    ps-plan.py check docs/scaling/bed-100mbit-1.json       # the model against bed_bench.py's runs
    ps-plan.py advise --rates 25gbit,100gbit --plot scaling.png   # 8 to 1024 GPUs

The model (docs/scaling.md derives it). Every host has one full-duplex link of rate R; C = R x
efficiency / 8 is the payload bytes per second it carries each way (efficiency: TCP/IP and
Ethernet headers, 0.95; a single TCP flow on the bed reaches 0.956). Intra-host traffic (GPUs
of one host, a worker and a server on one host) is free.

- Ring all-reduce across N hosts: every link carries 2 (N-1)/N x M each way, in 2 (N-1) steps
  that wait for the slowest link: T = 2 (N-1)/N x M / C_min + 2 (N-1) x latency per bucket
  (tensor fusion: one all-reduce per `fusion` bytes). Open MPI over TCP (what `check` compares
  with) sends a step's message above its eager limit (64 KiB) by rendezvous: the bulk leaves
  after the receiver's acknowledgement; measured on the bed, that is one more latency per
  step (`rendezvous`; predict and advise leave it out: NCCL's ring has no such handshake).
- Parameter server: keys of at least 1e6 elements are cut into slices of at most `chunk` bytes
  dealt round-robin over the S servers, smaller keys live whole on one server; each server's
  share travels in messages of at most `chunk` bytes. Per iteration each worker pushes every
  slice to its server and pulls it back, and the bytes that cross each host's link each way
  follow (a worker and a server on one host skip the link). With pushes of one message
  overlapping the pulls of another, the links need T_bw = max over link directions of
  bytes / C (dist_sync: all workers' bytes, one round; dist_async: each worker at the rate
  its connections get when those across a link share it equally, as TCP does, max-min fair).
  Server weights (PS_SERVER_WEIGHTS) give each server that share of every key. What cannot
  overlap: the last message's round closes only when every push is in, and its replies (one
  per remote worker, `chunk` bytes each) leave its server afterwards:
  T_drain = remote workers x chunk / C. So
      T_ps = T_bw / share + T_drain + 2 latency
  where `share` (<= 1) is the fraction of the links that dist_sync's many TCP flows (every
  worker to every server) achieve when every link is equally busy: a round waits for its
  slowest flow, and flows that lost packets in a full queue lag. It was measured on the test
  bed (0.84 at 100 Mbit/s, 0.99 at 200 Mbit/s; docs/scaling.md); 1 is the ideal. dist_async
  (no rounds) and a load with one link far busier than the rest (a slow host) get 1.
- Compute: T_iter = compute + max(0, T_comm - overlap x compute) (overlap: the share of the
  compute that communication may run beside, e.g. 2/3, the backward pass); scaling
  efficiency = compute / T_iter.

Python 3 standard library only (matplotlib for --plot).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from cli_args import join_negative_values  # noqa: E402 (beside this file)

PROG = "ps-plan.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # draws --plot when this python3 has no matplotlib

MiB = 1 << 20
MAX_PIECES_PER_SERVER = 64  # the runtime's bound on the pieces server weights ask for
ASYNC_FIXPOINT_ROUNDS = 400  # dist_async's fair rates converge in tens of rounds
# dist_async's fair rates follow every connection (worker hosts x server hosts of them, each
# round): a prediction past this many hosts takes seconds to minutes. dist_sync has no bound.
ASYNC_MAX_HOSTS = 32
DEFAULT_CHUNK = 4 * MiB          # PS_CHUNK_BYTES
BIGARRAY_BOUND = 1_000_000       # MXNET_KVSTORE_BIGARRAY_BOUND, elements
DEFAULT_EFFICIENCY = 0.95        # payload / line rate of TCP over Ethernet (1448 / 1514 ~ 0.956)
# Flow-sharing efficiency of dist_sync's many-to-many TCP flows, measured on the test bed
# (4 worker hosts, FIFO queues of 50 ms, TCP reno, PS_CHUNK_BYTES 64 KiB; docs/scaling.md): the
# mean share implied by the two 16 MB dist_sync cases of the first run at each rate (`check`
# prints it per case); every other case is predicted with it. Keyed by (rate, PS_TCP_RCVBUF;
# None: the kernel's autotuning). With autotuned windows the fan-in of many flows overflows
# the 625 KB queues at 100 Mbit/s (tens of drops per job) and a flow that lost a packet lags;
# at 200 Mbit/s (1.25 MB queues) a few drops remain. With 64 KiB receive buffers the flows
# into a link fit its queue and none is dropped.
BED_PS_SHARES = {(100e6, None): 0.84, (200e6, None): 0.99,
                 (100e6, 64 * 1024): 1.0, (200e6, 64 * 1024): 1.0}
# The default of predict and advise: the pessimistic one, the runtime's default settings.
BED_PS_SHARE = BED_PS_SHARES[(100e6, None)]


def bed_share(rate, tcp_rcvbuf=None):
    """The share measured at the bed rate nearest `rate` (on a log scale) with the receive
    buffer `tcp_rcvbuf` (one the bed did not measure: the autotuned windows' share)."""
    measured = {r: v for (r, b), v in BED_PS_SHARES.items() if b == (tcp_rcvbuf or None)}
    if not measured:
        measured = {r: v for (r, b), v in BED_PS_SHARES.items() if b is None}
    return measured[min(measured, key=lambda r: abs(math.log(r / rate)))]
DEFAULT_LATENCY = 25e-6          # one-way seconds per message between hosts (datacenter TCP)
DEFAULT_FUSION = 64 * MiB        # all-reduce bucket (Horovod's tensor fusion buffer)
OPEN_MPI_EAGER = 64 * 1024       # btl_tcp_eager_limit: larger messages go by rendezvous

# Example models for `advise` (fp32 gradients; compute per batch on one GPU: assumptions,
# change them with --model and --compute).
# The layers are equal parts of the model (their number is what matters to the model: the last
# message's size, and with it the drain).
PRESETS = {
    "resnet50": {"bytes": 25_557_032 * 4, "layers": 50, "compute": 0.10,
                 "what": "ResNet-50, 25.6 M parameters (97.5 MiB in 50 layers), "
                         "0.10 s per batch"},
    "vgg16": {"bytes": 138_357_544 * 4, "layers": None, "compute": 0.15,
              "what": "VGG-16, 138 M parameters (528 MiB in its 16 layers, fc6 392 MiB), "
                      "0.15 s per batch"},
    "bert-large": {"bytes": 340_000_000 * 4, "layers": 26, "compute": 0.40,
                   "what": "BERT-large, 340 M parameters (1.27 GiB in 26 layers), "
                           "0.40 s per batch"},
}
# VGG-16's layers (weights and biases, float32): its size sits in one fully connected layer.
VGG16_LAYERS = [4 * n for n in (
    1792, 36928, 73856, 147584, 295168, 590080, 590080, 1180160, 2359808, 2359808, 2359808,
    2359808, 2359808, 102764544, 16781312, 4097000)]


class PlanError(argparse.ArgumentTypeError):
    """A bad input: a one-line message naming it (argparse shows it for a bad flag value)."""


def check_share(flag, value, zero=False):
    """Refuse a share outside (0, 1] ([0, 1] with zero), naming its flag and value."""
    if not (0 <= value if zero else 0 < value) or not value <= 1:
        raise PlanError(f"{flag} {value:g}: want a share in {'[' if zero else '('}0, 1]")


# ------------------------------------------------------------------------------------ units

_SIZE = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def fair_levels(capacity, demands):
    """Max-min fair shares of `capacity` among flows that want `demands`: for each flow, the
    level it gets if it wants more (no limit) while the others want theirs: the level every
    flow that wants more than it gets. One water-filling of the sorted demands serves every
    flow up to its own place (a link's flows in O(flows log flows) where it is full, in
    O(flows^2) at most, instead of O(flows^2 log flows))."""
    order = sorted(range(len(demands)), key=demands.__getitem__)
    d = [demands[i] for i in order]
    k = len(d)
    out = [0.0] * k
    left = capacity
    for p in range(k):
        level = left / (k - p)
        out[order[p]] = fair_level_after(left, d, p)
        if d[p] >= level:
            for q in order[p + 1:]:  # a flow further on: the filling stops here without it
                out[q] = level
            break
        left -= d[p]
    return out


def fair_level_after(left, d, p):
    """The filling of the sorted demands `d` from place p on (`left` of the capacity), with
    flow p wanting more than any: the others in order, flow p last."""
    k = len(d)
    for q in range(p + 1, k):
        level = left / (k - q + 1)
        if d[q] >= level:
            return level
        left -= d[q]
    return left


def max_but_one(values):
    """[the largest of `values` but the i-th, for each i] (0.0 where none is left): the
    slowest server of each worker beside one, in O(n)."""
    top = max(range(len(values)), key=values.__getitem__)
    second = max((v for i, v in enumerate(values) if i != top), default=0.0)
    return [second if i == top else values[top] for i in range(len(values))]


def parse_size(text):
    """'16MB' -> 16777216 (binary units, as ps-bench's --sizes); a plain number is bytes."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise PlanError(f"'{text}': want a size such as 16MB (B, KB, MB, GB, TB; binary)")
    value = float(m.group(1)) * _SIZE[(m.group(2) or "B").upper()]
    if value <= 0:
        raise PlanError(f"'{text}': want a positive size")
    return int(round(value))


def parse_rate(text):
    """tc-style rate -> bits per second: '100mbit', '25gbit', '1.5gbit'."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*", str(text),
                     re.IGNORECASE)
    if not m:
        raise PlanError(f"'{text}': want a rate such as 100mbit or 25gbit")
    value = float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
                                 "tbit": 1e12}[m.group(2).lower()]
    if value <= 0:
        raise PlanError(f"'{text}': want a positive rate")
    return value


def parse_time(text):
    """'25us', '0.1ms', '2s', or a plain number of seconds -> seconds."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(us|ms|s)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise PlanError(f"'{text}': want a time such as 25us, 0.5ms or 0.1s")
    value = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[(m.group(2) or "s").lower()]
    if value < 0:
        raise PlanError(f"'{text}': want a positive time (or 0)")
    return value


def fmt_rate(bits):
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= f:
            return f"{bits / f:g}{unit}"
    return f"{bits:g}bit"


def fmt_size(n):
    for unit in ("GB", "MB", "KB"):
        if n >= _SIZE[unit] and n % (_SIZE[unit] // 1024 or 1) == 0:
            return f"{n / _SIZE[unit]:g}{unit}"
    return f"{n}B"


# ------------------------------------------------------------------------------------ model

class Job:
    """One configuration. Sizes in bytes, rates in bit/s, times in seconds."""

    def __init__(self, layers, worker_hosts, layout="own", server_hosts=None, rate=100e9,
                 server_rate=None, gpus_per_host=1, latency=DEFAULT_LATENCY,
                 efficiency=DEFAULT_EFFICIENCY, ps_share=1.0, chunk=DEFAULT_CHUNK,
                 push_ratio=1.0, pull_ratio=1.0, allreduce_ratio=1.0, fusion=DEFAULT_FUSION,
                 compute=0.0, overlap=0.0, mode="sync", slow=None,
                 bigarray_bound=BIGARRAY_BOUND, rendezvous=None, server_weights=None):
        self.layers = [int(x) for x in (layers if isinstance(layers, (list, tuple))
                                        else [layers])]
        self.worker_hosts = int(worker_hosts)
        self.layout = layout
        self.server_hosts = (self.worker_hosts if layout == "beside" or server_hosts is None
                             else int(server_hosts))
        self.rate = float(rate)
        self.server_rate = float(server_rate or rate)
        self.gpus_per_host = int(gpus_per_host)
        self.latency = float(latency)
        self.efficiency = float(efficiency)
        self.ps_share = float(ps_share)
        self.chunk = int(chunk)
        self.push_ratio, self.pull_ratio = float(push_ratio), float(pull_ratio)
        self.allreduce_ratio = float(allreduce_ratio)
        self.fusion = int(fusion)
        self.compute, self.overlap = float(compute), float(overlap)
        self.mode = mode
        self.slow = dict(slow or {})  # worker host index -> factor of its link rate (0.25)
        self.bigarray_bound = int(bigarray_bound)  # elements (float32): sliced from here on
        # All-reduce messages above this many bytes wait for a handshake (None: none do).
        self.rendezvous = None if rendezvous is None else int(rendezvous)
        # PS_SERVER_WEIGHTS, one per server (None: alike)
        self.server_weights = None if not server_weights else [float(x) for x in server_weights]
        self.validate()

    def validate(self):
        if not self.layers or any(x <= 0 for x in self.layers):
            raise PlanError("the model needs at least one layer of a positive size")
        if self.worker_hosts < 1:
            raise PlanError(f"--workers {self.worker_hosts}: want at least 1 worker host")
        if self.layout not in ("own", "beside"):
            raise PlanError(f"layout '{self.layout}': want own or beside")
        if self.server_hosts < 1:
            raise PlanError(f"--server-hosts {self.server_hosts}: want at least 1 server host")
        if self.mode not in ("sync", "async"):
            raise PlanError(f"mode '{self.mode}': want sync or async")
        self.validate_async_hosts()
        check_share("--efficiency", self.efficiency)
        check_share("--ps-share", self.ps_share)
        check_share("--overlap", self.overlap, zero=True)
        check_share("--push-compression", self.push_ratio)
        check_share("--pull-compression", self.pull_ratio)
        check_share("--allreduce-compression", self.allreduce_ratio)
        if self.gpus_per_host < 1:
            raise PlanError(f"--gpus-per-host {self.gpus_per_host}: want at least 1")
        if self.bigarray_bound < 0:
            raise PlanError(f"--bigarray-bound {self.bigarray_bound}: want 0 or more elements")
        if self.chunk < 4:
            raise PlanError(f"--chunk {self.chunk}: want at least 4 bytes")
        for w, f in self.slow.items():
            if not 0 <= w < self.worker_hosts or not 0 < f <= 1:
                raise PlanError(f"slow host {w}={f}: want a worker host index and a factor in "
                                "(0, 1]")
        if self.server_weights is not None and (
                len(self.server_weights) != self.server_hosts
                or any(not 0 < x < math.inf for x in self.server_weights)):
            raise PlanError(f"server weights {self.server_weights}: want one positive weight "
                            f"per server host ({self.server_hosts})")

    def validate_async_hosts(self):
        if self.mode != "async":
            return
        for flag, hosts in (("--workers", self.worker_hosts),
                            ("--server-hosts", self.server_hosts)):
            if hosts > ASYNC_MAX_HOSTS:
                raise PlanError(f"{flag} {hosts}: dist_async is modelled up to "
                                f"{ASYNC_MAX_HOSTS} hosts (its fair rates follow every "
                                "connection); want fewer, or --mode sync")

    @property
    def model_bytes(self):
        return sum(self.layers)

    @property
    def gpus(self):
        return self.worker_hosts * self.gpus_per_host

    # -- capacities (payload bytes per second, each way)
    def worker_capacity(self, w):
        return self.rate * self.slow.get(w, 1.0) * self.efficiency / 8

    def server_capacity(self, s):
        if self.layout == "beside":
            return self.worker_capacity(s)
        return self.server_rate * self.efficiency / 8

    # -- where the bytes are
    def scaled_weights(self):
        """The server weights as the runtime scales them (the largest 1000, none below 1),
        or None when they are alike."""
        if self.server_weights is None:
            return None
        top = max(self.server_weights)
        scaled = [max(1, round(1000 * x / top)) for x in self.server_weights]
        return None if len(set(scaled)) == 1 else scaled

    def placement(self):
        """Per server: (bytes of the model it holds, bytes of its last message), as the
        runtime places keys: big keys sliced evenly, small ones whole, round-robin here
        (hashed in the runtime). The last message: the last key's part on that server, at
        most one chunk for a big key; a small key travels whole, in one message whatever the
        chunk (its round's pulls cannot start before all of it arrived). With server weights:
        each server's share of every key in proportion to its weight, a big key cut into
        pieces of which the lightest server gets about two."""
        weights = self.scaled_weights()
        if weights is not None:
            return self.weighted_placement(weights)
        S = self.server_hosts
        per = [0.0] * S
        last = [0.0] * S
        small = 0
        for k, size in enumerate(self.layers):
            if size // 4 >= self.bigarray_bound:
                # slices dealt round-robin from the key's own server (hashed in the runtime;
                # key k's here), so a remainder lands on different servers for different keys
                n = max(S, math.ceil(size / self.chunk))
                base, extra = divmod(n, S)
                for i in range(S):
                    j = (k + i) % S
                    part = size * (base + (1 if i < extra else 0)) / n
                    if part > 0:
                        per[j] += part
                        last[j] = min(self.chunk, part)
            else:
                j = small % S
                per[j] += size
                last[j] = size
                small += 1
        return per, last

    def weighted_placement(self, weights):
        S, total = self.server_hosts, sum(weights)
        least = min(math.ceil(2 * total / min(weights)), MAX_PIECES_PER_SERVER * S)
        per = [0.0] * S
        last = [0.0] * S
        for size in self.layers:
            big = size // 4 >= self.bigarray_bound
            pieces = max(least, math.ceil(size / self.chunk))
            for j in range(S):
                per[j] += size * weights[j] / total
                last[j] = min(self.chunk, size / pieces) if big else size
        return per, last

    def server_bytes(self):
        """Bytes of the model each server holds."""
        return self.placement()[0]

    def messages_per_server(self):
        return [max(1, math.ceil(b / self.chunk)) if b else 0 for b in self.server_bytes()]

    def link_bytes(self):
        """{(host, 'out'|'in'): [bytes per iteration of worker w, for each w]}: push and pull
        of one iteration of each worker, hosts named ('w', i) and ('s', j)."""
        links = {}
        for w, _, b, crossed in self.flows():
            for link in crossed:
                links.setdefault(link, [0.0] * self.worker_hosts)[w] += b
        return links

    def capacity(self, host):
        kind, i = host
        return self.worker_capacity(i) if kind == "w" else self.server_capacity(i)

    # -- the parameter server
    def link_totals(self):
        """{(host, way): bytes per round of every worker}: link_bytes() summed over the
        workers, in O(hosts) (dist_sync needs no more, and `advise` runs 1024 GPUs)."""
        N = self.worker_hosts
        per = self.server_bytes()
        total = sum(per)
        push, pull = self.push_ratio, self.pull_ratio
        out = {}
        if self.layout == "beside":
            for h in range(N):
                remote = total - per[h]
                out[(("w", h), "out")] = remote * push + (N - 1) * per[h] * pull
                out[(("w", h), "in")] = remote * pull + (N - 1) * per[h] * push
        else:
            for w in range(N):
                out[(("w", w), "out")] = total * push
                out[(("w", w), "in")] = total * pull
            for s in range(self.server_hosts):
                out[(("s", s), "in")] = N * per[s] * push
                out[(("s", s), "out")] = N * per[s] * pull
        return {k: v for k, v in out.items() if v > 0}

    def ps_bandwidth_times(self):
        """Per worker: seconds of link time per iteration (T_bw), sync or async."""
        N = self.worker_hosts
        if self.mode == "sync":
            totals = self.link_totals()
            t = max((b / self.capacity(h) for (h, _), b in totals.items()), default=0.0)
            return [t] * N
        # dist_async: each connection (worker to server, server to worker) is a TCP flow,
        # and the flows across a link share it equally, as TCP does, whatever each worker's
        # iteration needs; a worker's flows all run at its iteration rate times their bytes
        on_link = {}
        for w, s, b, links in self.flows():
            for link in links:
                on_link.setdefault(link, []).append((w, b))
        if not on_link:
            return [0.0] * N
        # From an equal split of every link, each worker's rate moves halfway towards what
        # its flows could get if they wanted more, the other flows wanting what they get now
        # (max-min fairness is where no flow can get more that way). A worker whose servers
        # are all on its own host uses no link: no bound.
        rate = [math.inf] * N
        for link, flows in on_link.items():
            share = self.capacity(link[0]) / len(flows)
            for w, b in flows:
                rate[w] = min(rate[w], share / b)
        for _ in range(ASYNC_FIXPOINT_ROUNDS):
            bound = [math.inf] * N
            for link, flows in on_link.items():
                levels = fair_levels(self.capacity(link[0]), [rate[w] * b for w, b in flows])
                for (w, b), level in zip(flows, levels):
                    bound[w] = min(bound[w], level / b)
            done = all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(rate, bound))
            rate = [(x + y) / 2 for x, y in zip(rate, bound)]
            if done:
                break
        return [1.0 / r if r < math.inf else 0.0 for r in rate]

    def flows(self):
        """(worker, server, bytes per iteration, [(host, way) crossed]) of every connection
        that crosses a link: the pushes to each remote server and that server's replies."""
        out = []
        per_server = self.server_bytes()
        for w in range(self.worker_hosts):
            for s in range(self.server_hosts):
                if self.layout == "beside" and s == w:
                    continue  # same host: shared memory, no link
                shost = ("w", s) if self.layout == "beside" else ("s", s)
                push = per_server[s] * self.push_ratio
                pull = per_server[s] * self.pull_ratio
                if push > 0:
                    out.append((w, s, push, [(("w", w), "out"), (shost, "in")]))
                if pull > 0:
                    out.append((w, s, pull, [(shost, "out"), (("w", w), "in")]))
        return out

    def ps_drain(self):
        """Seconds the last message's replies need after its round closed (per worker: the
        slowest of its servers), in O(hosts)."""
        N = self.worker_hosts
        beside = self.layout == "beside"
        remote = N - 1 if beside else N
        # per server: its last message's replies leave its link one after another
        lasts = [last * self.pull_ratio for last in self.placement()[1]]
        leave = [remote * last / self.capacity(("w", s) if beside else ("s", s))
                 for s, last in enumerate(lasts)]
        # the slowest of each worker's servers (beside: not its own), and the last reply
        # arriving over its own link
        if beside:
            leave, lasts = max_but_one(leave), max_but_one(lasts)
        else:
            leave, lasts = [max(leave)] * N, [max(lasts)] * N
        return [max(t, last / self.worker_capacity(w))
                for w, (t, last) in enumerate(zip(leave, lasts))]

    def balanced(self):
        """Whether the PS's load is balanced: another host's link within 10% of the busiest
        one's time. Only then does a lagging flow cost time: with one link far busier (a slow
        host), the other flows have slack to catch up while it sets the pace."""
        per_host = {}
        for (h, _), b in self.link_totals().items():
            per_host[h] = max(per_host.get(h, 0.0), b / self.capacity(h))
        times = sorted(per_host.values(), reverse=True)
        return len(times) > 1 and times[1] >= 0.9 * times[0]

    def ps_comm(self, bw=None, drain=None):
        """Per worker: communication seconds of one iteration (from ps_bandwidth_times() and
        ps_drain(), when already known)."""
        if self.layout == "beside" and self.worker_hosts == 1:
            return [0.0]
        share = self.ps_share if self.mode == "sync" and self.balanced() else 1.0
        bw = self.ps_bandwidth_times() if bw is None else bw
        drain = self.ps_drain() if drain is None else drain
        return [b / share + d + 2 * self.latency for b, d in zip(bw, drain)]

    # -- ring all-reduce
    def allreduce_comm(self):
        N = self.worker_hosts
        if N == 1:
            return 0.0  # inside one host: not on the links
        M = self.model_bytes * self.allreduce_ratio
        c_min = min(self.worker_capacity(w) for w in range(N))
        buckets = max(1, math.ceil(self.model_bytes / self.fusion))
        step_latency = self.latency
        # A step sends 1/N of a bucket.
        if self.rendezvous is not None and min(M, self.fusion) / N > self.rendezvous:
            step_latency += self.latency
        return 2 * (N - 1) / N * M / c_min + 2 * (N - 1) * step_latency * buckets

    # -- with compute
    def iteration(self, comm):
        return self.compute + max(0.0, comm - self.overlap * self.compute)

    def predict(self):
        bw, drain = self.ps_bandwidth_times(), self.ps_drain()
        ps_comm = self.ps_comm(bw, drain)
        ar = self.allreduce_comm()
        ps_iter = [self.iteration(c) for c in ps_comm]
        ar_iter = self.iteration(ar)
        # dist_sync: one round for all; dist_async: the workers' own paces (slowest, fastest)
        ps_it = max(ps_iter)
        eff = (lambda t: self.compute / t if self.compute > 0 and t > 0 else None)
        return {
            "model_bytes": self.model_bytes, "worker_hosts": self.worker_hosts,
            "gpus": self.gpus, "layout": self.layout, "server_hosts": self.server_hosts,
            "rate": self.rate, "mode": self.mode, "chunk": self.chunk,
            "ps": {"iteration_s": ps_it, "per_worker_s": ps_iter,
                   "comm_s": max(ps_comm), "bandwidth_s": max(bw),
                   "drain_s": max(drain), "efficiency": eff(ps_it)},
            "allreduce": {"iteration_s": ar_iter, "comm_s": ar, "efficiency": eff(ar_iter)},
            "ps_over_allreduce": ps_it / ar_iter if ar_iter > 0 else None,
        }


def min_server_hosts_to_beat(job_kwargs, limit=None):
    """The fewest server hosts of their own with which the PS communicates an iteration in
    at most ring all-reduce's time (communication, not iteration: where compute hides both,
    the iteration cannot tell them apart); None when even `limit` (default: 2 x the worker
    hosts) do not."""
    N = job_kwargs["worker_hosts"]
    limit = limit or 2 * N

    def ps_comm(s):
        return Job(**dict(job_kwargs, layout="own", server_hosts=s)).predict()["ps"]["comm_s"]
    ar = Job(**dict(job_kwargs, layout="own", server_hosts=1)).predict()["allreduce"]["comm_s"]
    lo, hi = 1, limit
    if ps_comm(hi) > ar:
        return None
    while lo < hi:  # more server hosts never slow the PS down: bisect
        mid = (lo + hi) // 2
        if ps_comm(mid) <= ar:
            hi = mid
        else:
            lo = mid + 1
    return lo


# ------------------------------------------------------------------------------------ check

def case_to_job(meta, case, ps_share, efficiency):
    """A Job for one case of a bed_bench.py JSON."""
    rate = float(meta["rate_bit"])
    slow = {}
    if case.get("straggler"):
        host = int(case["straggler"]["host"].lstrip("h"))
        slow[host] = 1.0 / float(case["straggler"]["factor"])
    # one way between two hosts: the bed's own 50 us plus both links' delay
    latency = 50e-6 + 2 * float(meta.get("delay_us") or 0) * 1e-6
    kwargs = dict(layers=[case["size"]], worker_hosts=case["workers"], rate=rate,
                  latency=latency, efficiency=efficiency, ps_share=ps_share, slow=slow,
                  server_weights=case.get("server_weights"))
    if case["system"] == "ps":
        kwargs.update(layout=case["layout"], server_hosts=case.get("server_hosts") or None,
                      chunk=case.get("chunk_bytes") or meta.get("chunk_bytes") or DEFAULT_CHUNK,
                      mode="sync" if case["mode"] == "dist_sync" else "async")
    else:
        kwargs.update(layout="beside", rendezvous=OPEN_MPI_EAGER)
    return Job(**kwargs)


def check_rows(doc, ps_share=None, efficiency=None, tolerance=0.15):
    """Predicted against measured for every case of a bed_bench.py JSON document. ps_share
    None: the share measured on the bed at the run's rate and receive buffer (BED_PS_SHARES)."""
    meta = doc["meta"]
    if ps_share is None:
        ps_share = bed_share(float(meta["rate_bit"]), meta.get("tcp_rcvbuf"))
    if efficiency is None:
        ref = doc.get("reference") or {}
        efficiency = ref.get("goodput_fraction") or DEFAULT_EFFICIENCY
    rows = []
    for case in doc["cases"]:
        if case.get("system") not in ("ps", "mpi"):
            continue
        row = {"label": case["label"], "size": case["size"], "system": case["system"],
               "rate": float(meta["rate_bit"]), "straggler": bool(case.get("straggler"))}
        if case["system"] == "ps" and meta.get("replication") == "1":
            means = [w["mean_s"] for w in case.get("per_worker") or []]
            measured = case["iteration_s"] or (sum(means) / len(means) if means else 0.0)
            row.update(measured=measured, predicted=None,
                       note="not modelled: replication (PS_REPLICATION=1 forwards every "
                            "update to a second server)")
            rows.append(row)
            continue
        if case.get("compression"):
            row.update(measured=case["iteration_s"], predicted=None,
                       note="not modelled: compressed pushes or pulls (bed_bench.py's "
                            "compression part)")
            rows.append(row)
            continue
        if case["system"] == "mpi" and case.get("algorithm") not in ("ring", "segmented_ring"):
            row.update(measured=case["iteration_s"], predicted=None,
                       note=f"not modelled: Open MPI's '{case.get('algorithm')}' algorithm")
            rows.append(row)
            continue
        job = case_to_job(meta, case, ps_share, efficiency)
        p = job.predict()
        if case["system"] == "mpi":
            row.update(measured=case["iteration_s"], predicted=p["allreduce"]["iteration_s"],
                       note="ring all-reduce")
        elif case["mode"] == "dist_sync":
            row.update(measured=case["iteration_s"], predicted=p["ps"]["iteration_s"],
                       note=f"PS {case['layout']}, dist_sync")
            if job.balanced():
                # the share this case implies: link time / (measured - drain - round trip)
                rest = case["iteration_s"] - p["ps"]["drain_s"] - 2 * job.latency
                row["implied_share"] = p["ps"]["bandwidth_s"] / rest if rest > 0 else None
        else:
            # dist_async: the mean iteration of the workers on full-rate links (and of the
            # slow one, reported apart)
            slow = set(job.slow)
            fast_m = [w["mean_s"] for w in case["per_worker"] if w["rank"] not in slow]
            fast_p = [t for w, t in enumerate(p["ps"]["per_worker_s"]) if w not in slow]
            row.update(measured=sum(fast_m) / len(fast_m),
                       predicted=sum(fast_p) / len(fast_p),
                       note=f"PS {case['layout']}, dist_async, "
                            f"{'the full-rate workers' if slow else 'every worker'}")
        row["error"] = row["predicted"] / row["measured"] - 1
        row["within"] = abs(row["error"]) <= tolerance
        rows.append(row)
    return rows


def print_check(rows, out=None, markdown=False, tolerance=0.15):
    out = out or sys.stdout
    if markdown:
        print("| case | link | measured s | predicted s | error |", file=out)
        print("|---|---|---:|---:|---:|", file=out)
        for r in rows:
            if r["predicted"] is None:
                print(f"| {r['label']} | {fmt_rate(r['rate'])} | {r['measured']:.3f} | "
                      f"- | {r['note']} |", file=out)
            else:
                flag = "" if r["within"] else " (outside 15%)"
                print(f"| {r['label']} | {fmt_rate(r['rate'])} | {r['measured']:.3f} | "
                      f"{r['predicted']:.3f} | {100 * r['error']:+.1f}%{flag} |", file=out)
        return
    print(f"{'case':40} {'link':>8} {'measured':>9} {'predicted':>9} {'error':>7}  note",
          file=out)
    for r in rows:
        if r["predicted"] is None:
            print(f"{r['label']:40} {fmt_rate(r['rate']):>8} {r['measured']:9.3f} "
                  f"{'-':>9} {'':>7}  {r['note']}", file=out)
        else:
            implied = (f" (implied share {r['implied_share']:.3f})"
                       if r.get("implied_share") else "")
            print(f"{r['label']:40} {fmt_rate(r['rate']):>8} {r['measured']:9.3f} "
                  f"{r['predicted']:9.3f} {100 * r['error']:+6.1f}%  {r['note']}{implied}"
                  + ("" if r["within"] else f"  OUTSIDE {100 * tolerance:.0f}%"), file=out)
    modelled = [r for r in rows if r["predicted"] is not None]
    bad = [r for r in modelled if not r["within"]]
    print(f"{len(modelled) - len(bad)} of {len(modelled)} modelled cases within "
          f"{100 * tolerance:.0f}%", file=out)


# ------------------------------------------------------------------------------------ advise

def advise_rows(layers, compute, rates, gpus_list, gpus_per_host, overlap, latency,
                efficiency, ps_share, chunk, fusion, server_ratios=(0.5, 1.0),
                bigarray_bound=0):
    rows = []
    for rate in rates:
        for gpus in gpus_list:
            hosts = max(1, gpus // gpus_per_host)
            base = dict(layers=list(layers), worker_hosts=hosts, rate=rate,
                        gpus_per_host=gpus_per_host, latency=latency, efficiency=efficiency,
                        ps_share=ps_share, chunk=chunk, fusion=fusion, compute=compute,
                        overlap=overlap, bigarray_bound=bigarray_bound)
            ar = Job(**dict(base, layout="beside")).predict()
            row = {"rate": rate, "gpus": hosts * gpus_per_host, "worker_hosts": hosts,
                   "allreduce": ar["allreduce"], "ps_beside": ar["ps"], "ps_own": {}}
            for ratio in server_ratios:
                s = max(1, math.ceil(ratio * hosts))
                row["ps_own"][ratio] = dict(Job(**dict(base, layout="own", server_hosts=s))
                                            .predict()["ps"], server_hosts=s)
            row["min_server_hosts"] = min_server_hosts_to_beat(base)
            rows.append(row)
    return rows


def print_advise(rows, what, out=None, markdown=False):
    out = out or sys.stdout
    ratios = sorted(rows[0]["ps_own"]) if rows else []
    if markdown:
        head = ["link", "GPUs", "hosts", "ring all-reduce", "PS beside"] + [
            f"PS own, {r:g} server host per worker host" for r in ratios] + [
            "fewest server hosts with PS communication <= ring's"]
        print(f"{what}: iteration time in ms (scaling efficiency)\n", file=out)
        print("| " + " | ".join(head) + " |", file=out)
        print("|" + "---|" * len(head), file=out)
    else:
        print(f"{what}: iteration ms (scaling efficiency)", file=out)
        print(f"{'link':>7} {'GPUs':>5} {'hosts':>5} {'ring':>14} {'PS beside':>14} "
              + " ".join(f"{'PS own ' + format(r, 'g') + ':1':>14}" for r in ratios)
              + f" {'S: comm<=ring':>15}", file=out)
    for r in rows:
        def cell(p):
            e = p.get("efficiency")
            return f"{1000 * p['iteration_s']:.0f} ({e:.2f})" if e else \
                f"{1000 * p['iteration_s']:.1f}"
        need = r["min_server_hosts"]
        need_txt = "-" if need is None else f"{need} ({need / r['worker_hosts']:.2f}/host)"
        cells = [fmt_rate(r["rate"]), str(r["gpus"]), str(r["worker_hosts"]),
                 cell(r["allreduce"]), cell(r["ps_beside"])] + [
                 cell(r["ps_own"][x]) for x in ratios] + [need_txt]
        if markdown:
            print("| " + " | ".join(cells) + " |", file=out)
        else:
            print(f"{cells[0]:>7} {cells[1]:>5} {cells[2]:>5} "
                  + " ".join(f"{c:>14}" for c in cells[3:-1]) + f" {cells[-1]:>15}", file=out)


def plot_advise(all_rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for _, rows in all_rows for r in rows})
    fig, axes = plt.subplots(len(all_rows), len(rates),
                             figsize=(4.6 * len(rates), 3.3 * len(all_rows)), squeeze=False)
    panels = [(axes[i][j], what, rate, [r for r in rows if r["rate"] == rate])
              for i, (what, rows) in enumerate(all_rows) for j, rate in enumerate(rates)]
    for ax, what, rate, rows in panels:
        g = [r["gpus"] for r in rows]
        ax.plot(g, [r["allreduce"]["efficiency"] for r in rows], "o-", color="tab:orange",
                label="ring all-reduce")
        ax.plot(g, [r["ps_beside"]["efficiency"] for r in rows], "s--", color="tab:blue",
                label="PS, servers beside workers")
        styles = {0.5: ("^-", "tab:olive"), 1.0: ("v-", "tab:green")}
        for ratio in sorted(rows[0]["ps_own"]):
            m, c = styles.get(ratio, ("x-", "tab:gray"))
            ax.plot(g, [r["ps_own"][ratio]["efficiency"] for r in rows], m, color=c,
                    label=f"PS, {ratio:g} server host per worker host")
        ax.set_xscale("log", base=2)
        ax.set_xticks(g)
        ax.set_xticklabels([str(x) for x in g], fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency")
        ax.set_title(f"{what.split(',')[0]}, {fmt_rate(rate)} links", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("ps-plan.py advise: scaling efficiency (compute / iteration), "
                 f"{all_rows[0][0].split('; ')[-1]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ CLI

def add_common(p):
    p.add_argument("--latency", type=parse_time, default=DEFAULT_LATENCY,
                   help="one-way latency per message between hosts (default 25us)")
    p.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                   help="payload share of the line rate (default 0.95: TCP/IP over Ethernet)")
    p.add_argument("--ps-share", type=float, default=BED_PS_SHARE,
                   help=f"share of the links dist_sync's many TCP flows achieve (default "
                        f"{BED_PS_SHARE}, measured on the test bed; 1: ideal)")
    p.add_argument("--chunk", type=parse_size, default=DEFAULT_CHUNK,
                   help="PS_CHUNK_BYTES (default 4MB, the runtime's)")
    p.add_argument("--fusion", type=parse_size, default=DEFAULT_FUSION,
                   help="all-reduce bucket (tensor fusion) bytes (default 64MB)")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="share of the compute communication may run beside (0..1; 2/3: the "
                        "backward pass; default 0)")
    p.add_argument("--gpus-per-host", type=int, default=1,
                   help="GPUs per worker host, reduced inside the host first (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--bigarray-bound", type=int, default=BIGARRAY_BOUND,
                   help="MXNET_KVSTORE_BIGARRAY_BOUND: keys of at least this many float32 "
                        "elements are sliced over every server, smaller ones live whole on "
                        "one (default 1000000, the runtime's; advise: 0, every key sliced)")


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Capacity model of the parameter server and of ring all-reduce: "
                    "iteration time and scaling efficiency. See docs/scaling.md.",
        epilog="examples:\n"
               "  ps-plan.py predict --model 16MB --workers 4 --layout own --rate 100mbit\n"
               "  ps-plan.py predict --layers 4MB,96MB,1MB --workers 16 --gpus-per-host 8 "
               "--layout own --server-hosts 8 --rate 25gbit --compute 0.2 --overlap 0.67\n"
               "  ps-plan.py check bed_bench.json\n"
               "  ps-plan.py advise --rates 25gbit,100gbit --plot scaling.png")
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("predict", help="one configuration")
    pr.add_argument("--model", type=parse_size, help="model (gradient) bytes, e.g. 100MB")
    pr.add_argument("--layers", help="per-layer bytes, comma-separated (instead of --model)")
    pr.add_argument("--workers", type=int, required=True, help="worker hosts")
    pr.add_argument("--layout", choices=["own", "beside"], default="own",
                    help="servers on hosts of their own (BytePS) or beside the workers (MXNet)")
    pr.add_argument("--server-hosts", type=int, help="own: server hosts (default: workers)")
    pr.add_argument("--rate", type=parse_rate, required=True, help="link rate, e.g. 25gbit")
    pr.add_argument("--server-rate", type=parse_rate, help="server hosts' link rate")
    pr.add_argument("--compute", type=parse_time, default=0.0,
                    help="compute seconds per batch on one GPU (default 0)")
    pr.add_argument("--mode", choices=["sync", "async"], default="sync",
                    help=f"dist_sync or dist_async (async: at most {ASYNC_MAX_HOSTS} worker and "
                         "server hosts; default sync)")
    pr.add_argument("--push-compression", type=float, default=1.0,
                    help="pushed bytes / gradient bytes (2-bit: 0.0625; default 1)")
    pr.add_argument("--pull-compression", type=float, default=1.0,
                    help="pulled bytes / value bytes (default 1)")
    pr.add_argument("--allreduce-compression", type=float, default=1.0,
                    help="all-reduced bytes / gradient bytes (fp16: 0.5; default 1)")
    pr.add_argument("--slow", action="append", default=[], metavar="W=F",
                    help="worker host W's link at F of the rate (0.25); repeatable")
    pr.add_argument("--server-weights", metavar="W,W,...",
                    help="PS_SERVER_WEIGHTS: each server's share of the keys relative to the "
                         "others, one per server host (1,1,1,0.25)")
    add_common(pr)

    ch = sub.add_parser("check", help="the model against bed_bench.py's measurements")
    ch.add_argument("json_files", nargs="+", metavar="JSON")
    ch.add_argument("--ps-share", type=float, default=None,
                    help="flow-sharing share (default: measured on the bed at the run's rate "
                         "and PS_TCP_RCVBUF: "
                         + ", ".join(f"{fmt_rate(r)} {fmt_size(b) if b else 'autotuned'} {v}"
                                     for (r, b), v in BED_PS_SHARES.items())
                         + ")")
    ch.add_argument("--efficiency", type=float, default=None,
                    help="payload share (default: the run's own single-flow reference)")
    ch.add_argument("--tolerance", type=float, default=0.15)
    ch.add_argument("--markdown", action="store_true", help="a Markdown table")
    ch.add_argument("--strict", action="store_true",
                    help="exit 1 when a modelled case is outside the tolerance")

    ad = sub.add_parser("advise", help="8 to 1024 GPUs: ring all-reduce against the PS")
    ad.add_argument("--model", default="resnet50,vgg16,bert-large",
                    help="presets (resnet50, vgg16, bert-large) or sizes, comma-separated")
    ad.add_argument("--compute", type=parse_time, default=None,
                    help="compute seconds per batch (default: the preset's; 0.1 for a size)")
    ad.add_argument("--layers", type=int, default=None,
                    help="the model in this many equal layers (default: the preset's; 1 for "
                         "a size)")
    ad.add_argument("--rates", default="25gbit,100gbit")
    ad.add_argument("--gpus", default="8,16,32,64,128,256,512,1024")
    ad.add_argument("--server-ratios", default="0.5,1",
                    help="server hosts per worker host to show (default 0.5,1)")
    ad.add_argument("--plot", help="write the scaling-efficiency plot (PNG, matplotlib)")
    ad.add_argument("--markdown", action="store_true")
    add_common(ad)
    ad.set_defaults(gpus_per_host=8, overlap=2 / 3, bigarray_bound=0)
    return p


def parse_weights(text):
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise PlanError(f"--server-weights {text}: want numbers, comma-separated (1,1,1,0.25)")


def parse_layers(text):
    """--layers 4MB,96MB,1MB -> bytes per layer; an empty item is refused, not dropped."""
    items = text.split(",")
    for i, item in enumerate(items, 1):
        if not item.strip():
            raise PlanError(f"--layers {text}: item {i} of {len(items)} is empty: want "
                            "sizes, comma-separated (4MB,96MB,1MB)")
    try:
        return [parse_size(x) for x in items]
    except PlanError as e:
        raise PlanError(f"--layers {text}: {e}") from None


def parse_slow(specs):
    """--slow W=F, repeatable -> {worker host: factor}; a host given twice is refused."""
    slow, given = {}, {}
    for spec in specs:
        m = re.fullmatch(r"h?(\d+)=([0-9.]+)", spec)
        if not m:
            raise PlanError(f"--slow {spec}: want W=F, e.g. 3=0.25")
        w = int(m.group(1))
        if w in slow:
            raise PlanError(f"--slow {spec}: worker host {w} is given twice (--slow "
                            f"{given[w]}): want one factor per host")
        slow[w], given[w] = float(m.group(2)), spec
    return slow


def cmd_predict(a):
    if (a.model is None) == (a.layers is None):
        raise PlanError("give --model or --layers (one of them)")
    layers = [a.model] if a.model else parse_layers(a.layers)
    slow = parse_slow(a.slow)
    job = Job(layers=layers, worker_hosts=a.workers, layout=a.layout,
              server_hosts=a.server_hosts, rate=a.rate, server_rate=a.server_rate,
              gpus_per_host=a.gpus_per_host, latency=a.latency, efficiency=a.efficiency,
              ps_share=a.ps_share, chunk=a.chunk, push_ratio=a.push_compression,
              pull_ratio=a.pull_compression, allreduce_ratio=a.allreduce_compression,
              fusion=a.fusion, compute=a.compute, overlap=a.overlap, mode=a.mode, slow=slow,
              bigarray_bound=a.bigarray_bound,
              server_weights=parse_weights(a.server_weights) if a.server_weights else None)
    p = job.predict()
    if a.json:
        print(json.dumps(p, indent=1))
        return 0
    ps, ar = p["ps"], p["allreduce"]
    where = (f"{job.server_hosts} server hosts of their own" if job.layout == "own"
             else "servers beside the workers")
    print(f"model {fmt_size(job.model_bytes)} in {len(job.layers)} layer(s), "
          f"{job.worker_hosts} worker hosts x {job.gpus_per_host} GPU(s), {where}, links "
          f"{fmt_rate(job.rate)}, dist_{job.mode}, chunk {fmt_size(job.chunk)}")
    eff = (lambda e: f", scaling efficiency {e:.3f}" if e is not None else "")
    print(f"PS:              iteration {ps['iteration_s']:.4f} s (links {ps['bandwidth_s']:.4f} "
          f"s / share {job.ps_share if job.mode == 'sync' else 1.0:g}, drain "
          f"{ps['drain_s']:.4f} s){eff(ps['efficiency'])}")
    if job.mode == "async" and len(set(round(x, 9) for x in ps["per_worker_s"])) > 1:
        print("                 per worker: " + ", ".join(f"{x:.4f}" for x in ps["per_worker_s"]))
    print(f"ring all-reduce: iteration {ar['iteration_s']:.4f} s{eff(ar['efficiency'])}")
    print(f"PS / all-reduce: {p['ps_over_allreduce']:.3f}" if p["ps_over_allreduce"] else
          "PS / all-reduce: - (all-reduce needs no link)")
    return 0


def cmd_check(a):
    all_rows = []
    for path in a.json_files:
        try:
            with open(path) as f:
                doc = json.load(f)
        except OSError as e:
            raise PlanError(f"cannot read {path}: {e.strerror}") from None
        except ValueError as e:
            raise PlanError(f"{path} is not JSON: {e}") from None
        rows = check_rows(doc, ps_share=a.ps_share, efficiency=a.efficiency,
                          tolerance=a.tolerance)
        for r in rows:
            r["file"] = path
        all_rows += rows
        head = (f"{path}: {doc['meta'].get('date', '')}, {doc['meta']['workers']} worker "
                f"hosts, links {fmt_rate(doc['meta']['rate_bit'])}"
                + (f" with {doc['meta']['delay_us'] / 1000:g} ms delay each way"
                   if doc['meta'].get('delay_us') else "")
                + ", TCP "
                f"{doc['meta'].get('tcp_congestion_control') or '?'}, PS_CHUNK_BYTES "
                f"{fmt_size(doc['meta'].get('chunk_bytes') or DEFAULT_CHUNK)}, PS_TCP_RCVBUF "
                f"{fmt_size(doc['meta']['tcp_rcvbuf']) if doc['meta'].get('tcp_rcvbuf') else 'autotuned'}")
        print(f"\n**{head}**\n" if a.markdown else head)
        print_check(rows, markdown=a.markdown, tolerance=a.tolerance)
    bad = [r for r in all_rows if r["predicted"] is not None and not r["within"]]
    return 1 if a.strict and bad else 0


def check_plot_dir(path):
    """--plot's directory must exist and take files: checked before any work (and before
    the run under the system's python3 that may draw the plot)."""
    where = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(where):
        raise PlanError(f"--plot {path}: no directory {where}")
    if not os.access(where, os.W_OK):
        raise PlanError(f"--plot {path}: cannot write in {where}")


def plot_elsewhere(a):
    """The plot by the system's python3, when this one has no matplotlib: its exit status
    (it says itself why it failed)."""
    if os.path.realpath(sys.executable) == os.path.realpath(SYSTEM_PYTHON) or \
            not os.path.exists(SYSTEM_PYTHON):
        raise PlanError("--plot needs matplotlib (python3-matplotlib)")
    return subprocess.run([SYSTEM_PYTHON, os.path.abspath(__file__)] + a.argv,
                          stdout=subprocess.DEVNULL).returncode


def cmd_advise(a):
    if a.plot:
        check_plot_dir(a.plot)
    rates = [parse_rate(x) for x in a.rates.split(",") if x.strip()]
    gpus = [int(x) for x in a.gpus.split(",") if x.strip()]
    ratios = [float(x) for x in a.server_ratios.split(",") if x.strip()]
    if not rates or not gpus or any(g < 1 for g in gpus):
        raise PlanError("--rates and --gpus need at least one positive value each")
    out = []
    for name in [x.strip() for x in a.model.split(",") if x.strip()]:
        if name in PRESETS:
            size, compute, what = (PRESETS[name]["bytes"], PRESETS[name]["compute"],
                                   PRESETS[name]["what"])
            n_layers = a.layers or PRESETS[name]["layers"]
            if a.compute is not None or a.layers:
                compute = a.compute if a.compute is not None else compute
                what = (f"{name}, {fmt_size(size)} in {n_layers or 16} layers, {compute:g} s "
                        "per batch")
        else:
            size = parse_size(name)
            n_layers = a.layers or 1
            compute = a.compute if a.compute is not None else 0.1
            what = f"model {fmt_size(size)} in {n_layers} layers, {compute:g} s per batch"
        layers = VGG16_LAYERS if not n_layers else [size / n_layers] * n_layers
        what += (f"; {a.gpus_per_host} GPUs per host, overlap {a.overlap:.2f}, latency "
                 f"{a.latency * 1e6:g} us, PS share {a.ps_share:g}")
        rows = advise_rows(layers, compute, rates, gpus, a.gpus_per_host, a.overlap, a.latency,
                           a.efficiency, a.ps_share, a.chunk, a.fusion, tuple(ratios),
                           a.bigarray_bound)
        out.append((what, rows))
        if a.json:
            continue
        print_advise(rows, what, markdown=a.markdown)
        print()
    if a.json:
        print(json.dumps([{"what": w, "rows": [dict(r, ps_own={str(k): v for k, v in
                                                           r["ps_own"].items()})
                                               for r in rows]} for w, rows in out], indent=1))
    if a.plot:
        try:
            plot_advise(out, a.plot)
        except ImportError:
            # a python3 without matplotlib first in PATH: the system's may have it
            code = plot_elsewhere(a)
            if code != 0:
                return code
        if not a.json:
            print(f"wrote {a.plot}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(join_negative_values(argv))
    a.argv = argv  # for the plot's fallback
    try:
        return {"predict": cmd_predict, "check": cmd_check, "advise": cmd_advise}[a.command](a)
    except PlanError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
