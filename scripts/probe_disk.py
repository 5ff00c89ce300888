#!/usr/bin/env python3
"""How long a synced write takes in a directory, the way a log writes it.

Usage: python3 scripts/probe_disk.py [DIR] [--count N]

DIR (default: the current directory) should be on the file system that will hold a
node's data directory. Three kinds of 4 KiB write, each followed by fdatasync:

- append: the file grows, so every sync also writes the file's inode (its size);
- overwrite, same tick: over blocks written before (as RocksDB's recycled log files
  are), while the kernel's coarse clock still reads what it read at the previous write;
- overwrite, after a tick: the same once that clock has moved on, so the write changed
  the file's modification time.

A node syncs the overwrite kind. Where the last kind is clearly slower than the one
before it, the file system likely writes the inode for a timestamp alone at every such
sync: ext4 without a journal does (one more device round trip per sync once the clock
has ticked, which at a few hundred syncs a second is a third or more of them; see
deploy/README.md). It prints the median and the 90th percentile of each kind and
removes its files.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

# Linux's CLOCK_REALTIME_COARSE: the clock file timestamps come from. Python's time
# module does not name it.
CLOCK_REALTIME_COARSE = 5
BLOCK = 4096
BLOCKS = 256
COUNT_MAX = 20_000


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def appends(directory, count):
    samples = []
    block = os.urandom(BLOCK)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="probe-disk-") as f:
        for _ in range(count):
            start = time.perf_counter()
            os.write(f.fileno(), block)
            os.fdatasync(f.fileno())
            samples.append((time.perf_counter() - start) * 1e6)
    return samples


def overwrites(directory, count):
    """Synced overwrites, split by whether the coarse clock moved since the previous one.
    Each waits a millisecond first, so that both kinds occur with a tick of 2 to 10 ms
    (Linux's usual), and both after the same pause (an idle CPU wakes slower)."""
    same, ticked = [], []
    block = os.urandom(BLOCK)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="probe-disk-") as f:
        fd = f.fileno()
        for i in range(BLOCKS):
            os.pwrite(fd, block, i * BLOCK)
        os.fsync(fd)
        last = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        for i in range(count):
            time.sleep(0.001)
            now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
            start = time.perf_counter()
            os.pwrite(fd, block, (i % BLOCKS) * BLOCK)
            os.fdatasync(fd)
            elapsed = (time.perf_counter() - start) * 1e6
            (ticked if now != last else same).append(elapsed)
            last = now
    return same, ticked


def line(name, samples):
    if not samples:
        return f"{name:<26} no samples"
    return (
        f"{name:<26} p50 {percentile(samples, 50):7.0f} us   p90 {percentile(samples, 90):7.0f} us"
        f"   ({len(samples)} syncs)"
    )


def main():
    parser = argparse.ArgumentParser(
        description="Time synced 4 KiB writes in DIR: appends, and overwrites before and after a clock tick."
    )
    parser.add_argument("dir", nargs="?", default=".", help="a directory on the file system to probe")
    parser.add_argument("--count", type=int, default=400, help=f"syncs of each kind (1 to {COUNT_MAX})")
    args = parser.parse_args()
    if not 1 <= args.count <= COUNT_MAX:
        parser.error(f"--count: use 1 to {COUNT_MAX}")
    if not os.path.isdir(args.dir):
        parser.error(f"{args.dir} is not a directory")
    try:
        appended = appends(args.dir, args.count)
        same, ticked = overwrites(args.dir, args.count)
    except OSError as e:
        sys.exit(f"probe_disk: cannot write in {args.dir}: {e}")
    print(f"synced 4 KiB writes in {os.path.abspath(args.dir)}:")
    print(line("append", appended))
    print(line("overwrite, same tick", same))
    print(line("overwrite, after a tick", ticked))
    if same and ticked:
        extra = statistics.median(ticked) - statistics.median(same)
        verdict = (
            "likely a write of the inode for its new timestamp at each such sync"
            if extra > 0.25 * statistics.median(same)
            else "a new timestamp costs a sync little here"
        )
        print(f"after a tick: {extra:+.0f} us at the median; {verdict}")


if __name__ == "__main__":
    main()
