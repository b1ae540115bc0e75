"""A network link that delays and drops frames, in user space: what `tc qdisc … netem` does, for
kernels built without netem (CONFIG_NET_SCH_NETEM), as this machine's and CI's are.

The link is two TAP devices, one in each namespace it joins (`eth0` in a node's namespace, a port
of the hub's bridge in the hub's), and this process between them: every Ethernet frame read from
one side is written to the other `--delay-ms` later, unless it is dropped, with probability
`--loss`, on the way. Both directions are delayed and lossy, so a round trip gains twice the delay.
Frames keep their order (the delay is fixed, as netem's without jitter).

    delay_line.py --near NS:IFNAME --far NS:IFNAME --delay-ms 50 --loss 0.01 --stats FILE

It prints `ready` once both devices exist (the caller then gives them addresses and brings them
up), and rewrites FILE (JSON: frames carried and dropped per direction) about once a second and on
SIGTERM.
"""
import argparse
import collections
import ctypes
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
LIBC = ctypes.CDLL(None, use_errno=True)


def enter_namespace(name):
    """This thread into the named network namespace (`ip netns add NAME`)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if LIBC.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def open_tap(where):
    """A TAP device `IFNAME` made in namespace `NS` (from `NS:IFNAME`); it lives while the returned
    descriptor is open, and stays in its namespace whichever namespace this thread moves to."""
    namespace, name = where.split(":")
    enter_namespace(namespace)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Direction:
    """Frames read from `source`, due on `sink` at their time."""

    def __init__(self, name, source, sink):
        self.name, self.source, self.sink = name, source, sink
        self.queue = collections.deque()  # (due, frame); a fixed delay keeps it in time order
        self.carried = self.dropped = self.unwritable = 0

    def stats(self):
        return {"carried": self.carried, "dropped": self.dropped, "unwritable": self.unwritable,
                "queued": len(self.queue)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--near", required=True, help="NS:IFNAME, the node's side")
    parser.add_argument("--far", required=True, help="NS:IFNAME, the hub's side")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0, help="probability of dropping a frame, 0 to 1")
    parser.add_argument("--stats", required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 0 <= args.loss < 1 or args.delay_ms < 0:
        parser.error("--loss must lie in [0, 1) and --delay-ms be at least 0")

    near, far = open_tap(args.near), open_tap(args.far)
    directions = {near: Direction("out", near, far), far: Direction("in", far, near)}
    delay, draw = args.delay_ms / 1000.0, random.Random(args.seed).random
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))

    def write_stats():
        tmp = args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump({d.name: d.stats() for d in directions.values()}, f)
        os.replace(tmp, args.stats)

    print("ready", flush=True)
    next_stats = time.monotonic() + 1.0
    while running[0]:
        now = time.monotonic()
        due = [d.queue[0][0] for d in directions.values() if d.queue]
        timeout = max(0.0, min([*due, next_stats]) - now)
        try:
            readable, _, _ = select.select(list(directions), [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            d = directions[fd]
            while True:  # everything the device holds now, so one wake-up carries a burst
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:  # the device went down under us
                    break
                if args.loss and draw() < args.loss:
                    d.dropped += 1
                else:
                    d.queue.append((now + delay, frame))
        for d in directions.values():
            while d.queue and d.queue[0][0] <= now:
                _, frame = d.queue.popleft()
                try:
                    os.write(d.sink, frame)
                    d.carried += 1
                except OSError:  # the far side down (a partition, a lost node): the frame is lost
                    d.unwritable += 1
        if now >= next_stats:
            write_stats()
            next_stats = now + 1.0
    write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
