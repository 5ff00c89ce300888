#!/usr/bin/env python3
"""Where a run's claims spent their time, from each node's /metrics before and after it.

Usage: stage_latency.py BEFORE AFTER, two files of lines "URL METRIC_LINE" (each node's
/metrics with its URL in front, as scripts/bench-tail scrapes them). Prints, for the
interval between them, the leader's server-side POST /claim latency, its append round
trips to the followers (the replication leg, the followers' fsync included) and every
node's synced log writes: mean and p50 / p99 estimated from the histogram buckets the
way Prometheus' histogram_quantile does (linear within a bucket).
"""

import re
import sys

LINE = re.compile(r"^(\S+) ([a-z_]+)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def load(path):
    """{url: {(name, labels): value}}, labels a sorted tuple of (key, value)."""
    nodes = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            url, name, labels, value = m.groups()
            key = (name, tuple(sorted(LABEL.findall(labels or ""))))
            try:
                nodes.setdefault(url, {})[key] = float(value)
            except ValueError:
                pass
    return nodes


def histogram(before, after, name, **labels):
    """(count, sum in s, [(le, cumulative count)]) of a histogram's growth."""
    want = tuple(sorted(labels.items()))

    def grown(metric, extra=()):
        key = (metric, tuple(sorted(want + extra)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    buckets = []
    for (metric, key_labels), _ in after.items():
        if metric != name + "_bucket":
            continue
        rest = tuple(kv for kv in key_labels if kv[0] != "le")
        if rest != want:
            continue
        le = dict(key_labels)["le"]
        bound = float("inf") if le == "+Inf" else float(le)
        buckets.append((bound, grown(name + "_bucket", (("le", le),))))
    buckets.sort()
    return grown(name + "_count"), grown(name + "_sum"), buckets


def quantile(q, count, buckets):
    """Estimated q-quantile in s, linear within its bucket; None without data."""
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def describe(count, total, buckets):
    if count <= 0:
        return "none"
    ms = lambda s: f"{s * 1000:.2f} ms"
    return (
        f"mean {ms(total / count)}, p50 ~{ms(quantile(0.5, count, buckets))}, "
        f"p99 ~{ms(quantile(0.99, count, buckets))} ({int(count)})"
    )


def main():
    before, after = load(sys.argv[1]), load(sys.argv[2])
    print("where the claims' time went, from each node's /metrics over the run:")
    for url in sorted(after):
        b, a = before.get(url, {}), after[url]
        role = next(
            (dict(labels)["role"] for (name, labels), v in a.items() if name == "rota_role" and v == 1),
            "?",
        )
        print(f"  {url} ({role})")
        if role == "leader":
            claims = histogram(b, a, "rota_http_request_seconds", endpoint="POST /claim")
            print(f"    POST /claim, answered by this node:       {describe(*claims)}")
            appends = histogram(b, a, "rota_raft_append_seconds")
            print(f"    append round trip to a follower:          {describe(*appends)}")
        syncs = histogram(b, a, "rota_log_sync_seconds")
        print(f"    synced log write (fsync):                 {describe(*syncs)}")


if __name__ == "__main__":
    main()
