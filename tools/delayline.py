#!/usr/bin/env python3
"""A delay line for the test bed where the kernel has no tc netem: holds every packet that an
iptables NFQUEUE rule hands it for a fixed time, then lets it go, in order.

    delayline.py --queue 0:5000 --queue 1:2500     # queue 0: 5 ms, queue 1: 2.5 ms
    delayline.py --probe                            # can a queue be bound here? (exit 0/1)

tools/testbed.py starts one in each host namespace whose links are delayed, and routes that
host's incoming packets into it with rules like

    iptables-legacy -t mangle -A PREROUTING -i <link> -s <sender> -j NFQUEUE --queue-num <q>

(one queue per sender, holding them for the sender's link delay plus this host's). Packets are
delayed where they arrive, not where they leave: a packet held before it left its sender would
still count against the sending socket's TCP small-queue budget, which throttles the sender to
a couple of packets per delay period.

It asks the kernel for the packets' metadata only (no payload is copied), and GSO packets whole,
and releases a queue's packets with one batch verdict ("accept every packet up to this id"), so
it costs a few microseconds per packet. Without a listener, the rules drop packets: a dead
delay line shows as a dead link, never as a link without its delay. Python 3 standard library
only; runs until SIGTERM or SIGINT.
"""

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
QUEUE_MAXLEN = 65536  # packets a queue holds (a 10 Gbit/s link for 10 ms needs ~1000 GSO ones)
PROG = "delayline.py"


class DelayLineError(Exception):
    """A failure to report in one line: exit status 1."""


def attribute(kind, payload):
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def message(kind, queue, attributes, seq=0, flags=NLM_F_REQUEST):
    """An nfnetlink message of the queue subsystem for queue `queue`."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + b"".join(attributes)
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags,
                          seq, 0) + body


def open_socket():
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    except OSError as e:
        raise DelayLineError(f"cannot open a netfilter netlink socket: {e.strerror} (the "
                             "kernel needs CONFIG_NETFILTER_NETLINK_QUEUE)") from None
    # Packets arrive in bursts (a TCP window at once): room for many of them.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sock.bind((0, 0))
    return sock


def bind_queue(sock, queue, seq):
    """Binds `queue` to this socket: metadata only, GSO packets whole, a deep queue."""
    for attributes in ([attribute(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0))],
                       [attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))],
                       [attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))],
                       [attribute(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO)),
                        attribute(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))]):
        sock.send(message(NFQNL_MSG_CONFIG, queue, attributes, seq, NLM_F_REQUEST | NLM_F_ACK))
        reply = sock.recv(65536)
        _, kind, _, _, _ = NLMSG_HDR.unpack_from(reply)
        if kind == NLMSG_ERROR:
            err = -struct.unpack_from("=i", reply, NLMSG_HDR.size)[0]
            if err:
                hint = (" (another delay line holds it)" if err == errno.EBUSY else
                        " (needs root: CAP_NET_ADMIN)" if err == errno.EPERM else "")
                raise DelayLineError(f"cannot bind queue {queue}: {os.strerror(err)}{hint}")
        seq += 1
    return seq


def accept_up_to(sock, queue, packet):
    """Lets every packet of `queue` up to id `packet` go (one batch verdict)."""
    verdict = attribute(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet))
    sock.send(message(NFQNL_MSG_VERDICT_BATCH, queue, [verdict]))


def packet_ids(buf, size):
    """(queue, packet id) of each packet message in the first `size` bytes of `buf`."""
    offset = 0
    while offset + NLMSG_HDR.size <= size:
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(buf, offset)
        if length < NLMSG_HDR.size or offset + length > size:
            return  # malformed or cut short: nothing more to read
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            queue = struct.unpack_from("!H", buf, offset + NLMSG_HDR.size + 2)[0]
            at = offset + NLMSG_HDR.size + 4
            while at + 4 <= offset + length:
                attr_len, attr_kind = struct.unpack_from("=HH", buf, at)
                if attr_len < 4:
                    break
                if attr_kind & 0x7FFF == NFQA_PACKET_HDR:
                    yield queue, struct.unpack_from("!I", buf, at + 4)[0]
                    break
                at += (attr_len + 3) & ~3
        offset += (length + 3) & ~3


def run(delays):
    """Holds the packets of each queue in `delays` (queue -> seconds) until SIGTERM."""
    sock = open_socket()
    seq = 1
    for queue in delays:
        seq = bind_queue(sock, queue, seq)
    held = {queue: collections.deque() for queue in delays}  # (release time, packet id)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    print(f"{PROG}: holding " + ", ".join(f"queue {q} for {delays[q] * 1e6:.0f} us"
                                          for q in sorted(delays)), flush=True)
    sock.setblocking(False)
    buf = bytearray(1 << 16)
    overruns = 0
    while not stop:
        due = [line[0][0] for line in held.values() if line]
        timeout = max(0.0, min(due) - time.monotonic()) if due else 1.0
        try:
            readable, _, _ = select.select([sock], [], [], timeout)
        except InterruptedError:
            continue
        while readable:
            try:
                size = sock.recv_into(buf)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                # Messages were lost: their packets go out with the next batch verdict.
                overruns += 1
                if overruns in (1, 10, 100, 1000):
                    print(f"{PROG}: receive buffer overrun ({overruns} so far): some packets "
                          "leave early", file=sys.stderr, flush=True)
                continue
            now = time.monotonic()
            for queue, packet in packet_ids(buf, size):
                if queue in held:
                    held[queue].append((now + delays[queue], packet))
        now = time.monotonic()
        for queue, line in held.items():
            last = None
            while line and line[0][0] <= now:
                last = line.popleft()[1]
            if last is not None:
                accept_up_to(sock, queue, last)
    # Whatever is still held goes out now rather than being dropped with the socket.
    for queue, line in held.items():
        if line:
            accept_up_to(sock, queue, line[-1][1])
    return 0


def parse_queue(text):
    queue, sep, micros = text.partition(":")
    try:
        q, us = int(queue), int(micros)
    except ValueError:
        q = us = -1
    if not sep or not 0 <= q <= 65535 or not 0 <= us <= 10_000_000:
        raise argparse.ArgumentTypeError(f"'{text}': want QUEUE:MICROSECONDS, e.g. 0:5000 "
                                         "(queue 0 to 65535, at most 10 s)")
    return q, us


def main(argv=None):
    p = argparse.ArgumentParser(
        prog=PROG, description="Hold the packets of NFQUEUE queues for a fixed time each, "
        "then accept them in order: link delay without tc netem (see tools/testbed.py).")
    p.add_argument("--queue", action="append", type=parse_queue, default=[],
                   metavar="QUEUE:US", help="hold queue QUEUE's packets US microseconds "
                   "(repeatable)")
    p.add_argument("--probe", action="store_true", help="bind a queue and exit: 0 when "
                   "delay lines work here, 1 with the reason when not")
    args = p.parse_args(argv)
    try:
        if args.probe:
            bind_queue(open_socket(), 65535, 1)
            return 0
        if not args.queue:
            p.error("give at least one --queue QUEUE:US (or --probe)")
        delays = {}
        for queue, micros in args.queue:
            if queue in delays:
                p.error(f"queue {queue} given twice")
            delays[queue] = micros / 1e6
        return run(delays)
    except DelayLineError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
