"""The dashboard in a real browser (headless Chromium) against real local clusters:
every page opens without a console error (CSP violations included), its figures
match the API, actions go through the API (retry, pause), a leader kill shows on
the cluster page of another node, payloads render as text, a node without
--ui-actions offers no action, and a group of 100 000 tasks is read a page at a time.
Screenshots of each page go to docs/screenshots (1280x800).

Tests run in file order; the leader kill comes last.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.parse

import pytest

from conftest import TREE_ASSETS, UI_DIR, Api, timing, wait_until

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
STATES = ["waiting", "running", "failed", "dead", "succeeded", "cancelled"]


def num(text: str) -> int:
    return int(text.replace(",", "").strip())


def ui_files() -> list[str]:
    out = []
    for root, _dirs, files in os.walk(UI_DIR):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), UI_DIR))
    return sorted(out)


# ---------------------------------------------------------------- data


def make_mixed(api: Api, group: str) -> None:
    """One job in each state (two dead, two waiting) and one task without a key."""
    api.add(group, [{"key": "s1", "data": "ok please"}])
    t = api.claim(group)
    api.finish(t, {"exit": 0, "duration_ms": 12, "stdout": "hello from s1\n", "stderr": ""})
    for key in ("d1", "d2"):
        api.add(group, [{"key": key, "data": f"payload of {key}", "max_attempts": 1}])
        t = api.claim(group)
        assert t and t["key"] == key
        api.fail(t, f"exit status 1 after 12 ms\n--- stdout (end) ---\nprocessing {key}\n--- stderr (end) ---\nboom: disk full")
    api.add(group, [{"key": "f1", "data": "flaky", "max_attempts": 3}])
    t = api.claim(group)
    api.fail(t, "temporary failure", retry_in_ms=600000)
    api.add(group, [{"key": "r1", "data": "long running"}])
    t = api.claim(group, client=4242, duration=600000)
    assert t and t["key"] == "r1"
    api.add(group, [{"key": "c1", "data": "to cancel"}])
    api.write("POST", "/cancel", {"clientid": 11, "group": group, "keys": ["c1"]})
    api.add(group, [{"key": "w1", "data": "first waiting"}, {"key": "w2", "data": "second waiting"}, {"data": "a task without a key"}])


def make_dead(api: Api, group: str, keys: list[str]) -> None:
    for key in keys:
        api.add(group, [{"key": key, "data": f"letter {key}", "max_attempts": 1}])
        t = api.claim(group)
        assert t and t["key"] == key
        api.fail(t, f"gave up on {key}")


def follower(cluster) -> int:
    leader = cluster.leader()
    return next(i for i in sorted(cluster.by_id) if i != leader)


@pytest.fixture(scope="module")
def mixed(cluster):
    api = cluster.api()
    make_mixed(api, "mixed")
    stats = api.stats("mixed")
    assert stats["jobs"] == {"waiting": 2, "running": 1, "failed": 1, "dead": 2, "succeeded": 1, "cancelled": 1}, stats
    return "mixed"


# ---------------------------------------------------------------- assets


def test_assets_are_small_licensed_and_self_contained():
    files = ui_files()
    total = sum(os.path.getsize(os.path.join(UI_DIR, f)) for f in files)
    assert total < 200 * 1024, f"raft-node/ui is {total} bytes; keep it under 200 KiB"
    vendored = {f.split(os.sep)[1] for f in files if f.startswith("vendor" + os.sep) and f.count(os.sep) >= 2}
    assert vendored, "no vendored library"
    for lib in vendored:
        assert os.path.isfile(os.path.join(UI_DIR, "vendor", lib, "LICENSE")), f"vendor/{lib} has no LICENSE"
    for f in files:
        path = os.path.join(UI_DIR, f)
        text = open(path, encoding="utf-8", errors="replace").read()
        # Nothing fetched from elsewhere at run time.
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), f"{f} loads something from another host"
        assert not re.search(r"""\bimport\b[^;]*?from\s*["']https?:""", text), f"{f} imports from another host"
        if f.endswith(".html"):
            for tag in re.findall(r"<script\b[^>]*>", text):
                assert "src=" in tag, f"{f}: inline script {tag} (the CSP forbids it)"
            assert not re.search(r"\sstyle\s*=", text), f"{f}: inline style attribute"
            assert "importmap" not in text
        if f.endswith(".js") and not f.startswith("vendor"):
            for bad in ("innerHTML", "outerHTML", "dangerouslySetInnerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write"):
                assert bad not in text, f"{f} uses {bad}"
            assert not re.search(r"""\sstyle=["']""", text), f"{f}: a style attribute in markup"
            for spec in re.findall(r"""\bfrom\s*["']([^"']+)["']""", text):
                assert spec.startswith("./"), f"{f} imports {spec!r}: only relative modules resolve without an import map"


def test_node_serves_the_files_with_the_policy(cluster):
    api = cluster.api()
    status, config = api.request("GET", "/ui/config")
    assert status == 200 and config["actions"] is True and isinstance(config["node_id"], int), config
    if TREE_ASSETS:
        pytest.skip("ROTA_UI_ASSETS=tree: the files come from the work tree, not from rota-node")
    import urllib.request

    for rel in ["", "/"] + ["/" + f.replace(os.sep, "/") for f in ui_files()]:
        with urllib.request.urlopen(api.url + "/ui" + rel, timeout=10) as r:
            body = r.read()
            assert r.headers["Content-Security-Policy"] == CSP, rel
            assert r.headers["X-Content-Type-Options"] == "nosniff", rel
        want = open(os.path.join(UI_DIR, "index.html" if rel in ("", "/") else rel[1:]), "rb").read()
        assert body == want, (
            f"rota-node serves a different /ui{rel} than raft-node/ui holds: rebuild rota-node "
            "(cargo build -p raft-node; the files are compiled in), or run with ROTA_UI_ASSETS=tree"
        )


# ---------------------------------------------------------------- pages


def test_console_errors_are_seen(cluster, browser):
    """The console check is not vacuous: an inline script is refused by the policy and logged."""
    browser.open(cluster.ui(), "/cluster")
    browser.js("const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; document.head.appendChild(s);")
    time.sleep(0.3)
    assert browser.js("return window.__inline") is None, "an inline script ran: the page has no content security policy"
    logs = browser.console()
    assert any(e["level"] == "SEVERE" and "Content Security Policy" in e["message"] for e in logs), logs
    browser.seen = []


def test_cluster_page_shows_members_and_leader(cluster, browser):
    leader = cluster.leader()
    browser.open(cluster.ui(), "/cluster")
    browser.wait_text("#leader", f"node {leader}")
    status = cluster.api().get("/cluster")
    rows = browser.find_all("#members tbody tr")
    assert sorted(int(r.get_attribute("data-node")) for r in rows) == sorted(n["id"] for n in status["nodes"])
    assert browser.find(f'#members tr[data-node="{leader}"]').get_attribute("data-role") == "leader"
    assert num(browser.text("#term")) == status["term"]
    assert browser.text("#voters") == ", ".join(str(v) for v in status["voters"])
    assert browser.text("#node-id") == f"node {status['id']}"
    assert browser.text("#mode") == "actions enabled"
    assert not browser.find_all("#readonly-note")
    browser.screenshot("cluster")


def test_metrics_are_parsed_as_prometheus_would(cluster, browser):
    """The charts' arithmetic, in the browser: labels with braces and spaces, rates,
    and histogram_quantile's interpolation over bucket differences."""
    browser.open(cluster.ui(), "/cluster")
    got = browser.d.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        import('/ui/metrics.js').then((m) => {
          const parsed = m.parsePrometheus('# HELP x\\nrota_http_requests_total{endpoint="GET /task/{id}",status="200"} 7\\nrota_term 3\\n');
          const older = [[0.001, 0], [0.01, 10], [0.1, 10], [Infinity, 10]];
          const newer = [[0.001, 0], [0.01, 20], [0.1, 110], [Infinity, 110]];
          done({
            parsed,
            p50: m.quantile(0.5, newer, older),
            p99: m.quantile(0.99, newer, older),
            none: m.quantile(0.5, older, older),
            fromNothing: m.quantile(0.5, older, []),
          });
        }, (e) => done({ error: String(e) }));
        """
    )
    assert "error" not in got, got
    assert got["parsed"] == [
        {"name": "rota_http_requests_total", "labels": {"endpoint": "GET /task/{id}", "status": "200"}, "value": 7},
        {"name": "rota_term", "labels": {}, "value": 3},
    ]
    # 100 new observations: 10 in (0.001, 0.01], 90 in (0.01, 0.1].
    assert abs(got["p50"] - (0.01 + 0.09 * 40 / 90)) < 1e-9, got
    assert abs(got["p99"] - (0.01 + 0.09 * 89 / 90)) < 1e-9, got
    assert got["none"] is None
    # A histogram that appeared between two samples counts from 0.
    assert abs(got["fromNothing"] - (0.001 + 0.009 * 5 / 10)) < 1e-9, got


def test_groups_page_figures_match_the_api(cluster, mixed, browser):
    api = cluster.api()
    api.add("traffic", [{"key": f"t{i}", "data": f"job {i}"} for i in range(400)])
    browser.open(cluster.ui(), "/groups")

    # Some claims and finishes for the charts while the page samples the metrics.
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            t = api.claim("traffic", client=77)
            if not t:
                break
            api.finish(t, {"ok": True}, client=77)
            time.sleep(0.02)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    time.sleep(6)
    stop.set()
    worker.join(timeout=10)

    want = api.stats(mixed)
    expected = {"tasks": want["tasks"], "available": want["available"], "owned": want["owned"], **want["jobs"]}

    def shown() -> dict[str, int] | None:
        cells = browser.find_all(f'#groups-table tr[data-group="{mixed}"] td[data-stat]')
        got = {c.get_attribute("data-stat"): c.text for c in cells}
        try:
            return {k: num(v) for k, v in got.items()}
        except ValueError:
            return None

    wait_until("the groups table to show /groups/mixed/stats", lambda: shown() == expected, timeout=10)
    traffic = api.stats("traffic")
    wait_until(
        "the traffic row to catch up",
        lambda: num(browser.text('#groups-table tr[data-group="traffic"] td[data-stat="succeeded"]')) == traffic["jobs"]["succeeded"],
        timeout=10,
    )
    listed = api.get("/groups")
    rows = [r.get_attribute("data-group") for r in browser.find_all("#groups-table tbody tr")]
    assert set(listed) <= set(rows)
    # The charts have points: claims per second and claim latency.
    assert browser.js("return document.querySelectorAll('#chart-throughput canvas').length") == 1
    series = browser.d.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        import('/ui/metrics.js').then((m) => done({
          rates: m.sampler.rates([['POST /claim']])[1],
          p50: m.sampler.claimLatency([0.5])[1],
        }));
        """
    )
    assert any(r and r > 1 for r in series["rates"]), series
    assert any(v and v > 0 for v in series["p50"]), series
    browser.screenshot("groups")


def test_group_page_lists_tasks_and_jobs_like_the_api(cluster, mixed, browser):
    api = cluster.api()
    browser.open(cluster.ui(), f"/group/{mixed}")
    stats = api.stats(mixed)
    for name in ("tasks", "available", "owned"):
        browser.wait_text(f"#stat-{name}", lambda t, n=name: num(t) == stats[n])
    for state in STATES:
        browser.wait_text(f"#stat-{state}", lambda t, s=state: num(t) == stats["jobs"][s])

    want = [t["id"] for t in api.get(f"/group/{mixed}?owned=1&limit=100")]
    wait_until(
        "the task table to list /group/mixed",
        lambda: [int(r.get_attribute("data-id")) for r in browser.find_all("#task-table tbody tr")] == want,
    )
    # A running task shows its owner and lease.
    running = next(t for t in api.get(f"/group/{mixed}?owned=1&limit=100") if t.get("key") == "r1")
    row = browser.find(f'#task-table tr[data-id="{running["id"]}"]')
    assert "4242" in row.text and "left" in row.text, row.text
    browser.screenshot("group")

    # Filter by state: the dead jobs, as /jobs?state=dead lists them.
    browser.click("#stat-dead")
    dead = [j["key"] for j in api.get(f"/jobs?group={mixed}&state=dead")["jobs"]]
    wait_until("the dead jobs", lambda: [r.get_attribute("data-key") for r in browser.find_all("#job-table tbody tr")] == dead)

    # A job's attempts, errors and captured output.
    browser.click('#job-table tr[data-key="d1"]')
    browser.wait_text("#detail-key", "d1")
    attempts = browser.wait_text("#attempts", lambda t: "boom: disk full" in t)
    assert "processing d1" in attempts and "failed" in attempts
    assert browser.text("#detail-data") == "payload of d1"
    assert "d1" in browser.text("#detail-reason") or "attempt 1 failed" in browser.text("#detail-reason")
    browser.screenshot("job", scroll_to=".toolbar")

    # Search by key (prefix): w1 and w2, and a succeeded job's result with its stdout.
    browser.find("#key-search").clear()
    browser.find("#key-search").send_keys("w")
    browser.click("#key-search-go")
    wait_until("the search", lambda: [r.get_attribute("data-key") for r in browser.find_all("#job-table tbody tr")] == ["w1", "w2"])
    # A field cleared without an input event (as autofill or a script's clear() do) must
    # stay cleared through the page's once-a-second refresh, or the next search would
    # carry the old text ("ws1"): wait past one refresh, then type.
    browser.find("#key-search").clear()
    time.sleep(1.5)
    assert browser.find("#key-search").get_attribute("value") == ""
    browser.find("#key-search").send_keys("s1")
    wait_until("the typed search", lambda: browser.find("#key-search").get_attribute("value") == "s1")
    browser.click("#key-search-go")
    wait_until("s1", lambda: [r.get_attribute("data-key") for r in browser.find_all("#job-table tbody tr")] == ["s1"])
    browser.click('#job-table tr[data-key="s1"]')
    browser.wait_text("#detail", lambda t: "hello from s1" in t)


def test_hostile_payload_renders_as_text(cluster, browser):
    api = cluster.api()
    api.add("hostile", [{"key": "evil", "data": HOSTILE}, {"data": HOSTILE}])
    browser.open(cluster.ui(), "/group/hostile")
    wait_until("two rows", lambda: len(browser.find_all("#task-table tbody tr")) == 2)
    cells = [c.text for c in browser.find_all("#task-table td.data-cell")]
    assert all(c.startswith("<script>window.__pwned=1</script>") for c in cells), cells
    browser.click("#task-table tbody tr")
    assert browser.wait_text("#detail-data", HOSTILE) == HOSTILE
    browser.click("#tab-jobs")
    wait_until("the job row", lambda: browser.find_all('#job-table tr[data-key="evil"]'))
    browser.click('#job-table tr[data-key="evil"]')
    browser.wait_text("#detail-key", "evil")
    assert browser.wait_text("#detail-data", HOSTILE) == HOSTILE
    time.sleep(0.5)
    assert browser.js("return window.__pwned") is None
    assert browser.js("return document.querySelectorAll('main img, main script').length") == 0
    browser.screenshot("hostile-payload")


def test_group_page_follows_changes_without_reloading(cluster, browser):
    api = cluster.api()
    api.add("live", [{"key": "a", "data": "first"}])
    browser.open(cluster.ui(), "/group/live?tab=jobs")
    wait_until("job a", lambda: browser.find_all('#job-table tr[data-key="a"]'))
    browser.js("window.__same_page = true")
    time.sleep(0.5)  # the watch has learnt its revision
    api.add("live", [{"key": "b", "data": "second"}])
    started = time.monotonic()
    wait_until("job b to appear", lambda: browser.find_all('#job-table tr[data-key="b"]'), timeout=5)
    t = api.claim("live")
    browser.wait_text('#job-table tr[data-key="a"] .badge', "running", timeout=5)
    took = time.monotonic() - started
    browser.wait_text("#stat-running", "1", timeout=8)  # the counts are re-read at most every 3 s
    timing("an add and a claim shown on the group page (via /watch)", took)
    assert browser.js("return window.__same_page") is True, "the page was reloaded"
    assert took < 5, f"changes took {took:.1f} s to show"
    assert t["key"] == "a"
    watches = [u for u in browser.js("return performance.getEntriesByType('resource').map(e => e.name)") if "/watch?" in u]
    assert watches, "the page does not use /watch"


def test_dead_letter_retried_from_the_page_is_live_again(cluster, browser):
    api = cluster.api()
    make_dead(api, "dlq", ["x1", "x2", "x3"])
    # From a follower: the write is relayed to the leader, the page reads its own node.
    browser.open(cluster.ui(follower(cluster)), "/dead?group=dlq")
    wait_until("three dead letters", lambda: len(browser.find_all('#dead-table tbody tr')) == 3)
    wait_until("the group with dead jobs to be offered", lambda: browser.find_all('.group-pills a[data-group="dlq"]'))
    browser.screenshot("dead")

    browser.click('#dead-table tr[data-key="x1"] button[data-action="retry"]')
    wait_until("the confirmation", lambda: browser.find_all("#confirm-dialog"))
    assert "x1" in browser.text("#confirm-dialog")
    browser.screenshot("confirm")
    browser.confirm()
    job = wait_until("x1 to be live again", lambda: (lambda j: j if j["state"] == "waiting" else None)(api.job("dlq", "x1")))
    assert job["task"] is not None
    wait_until("x1 to leave the page", lambda: not browser.find_all('#dead-table tr[data-key="x1"]'))
    t = api.claim("dlq")
    assert t and t["key"] == "x1", t

    # Declining the dialog changes nothing.
    browser.click('#dead-table tr[data-key="x2"] button[data-action="cancel"]')
    browser.click("#confirm-dialog #confirm-no")
    time.sleep(0.5)
    assert api.job("dlq", "x2")["state"] == "dead"

    # Cancel, from the job's detail on the group page.
    browser.open(cluster.ui(follower(cluster)), "/group/dlq?tab=jobs&state=dead&sel=j:x3")
    browser.wait_text("#detail-key", "x3")
    browser.click("#detail-cancel")
    browser.confirm()
    wait_until("x3 to be cancelled", lambda: api.job("dlq", "x3")["state"] == "cancelled")
    wait_until("x3 to leave the dead jobs", lambda: not browser.find_all('#job-table tr[data-key="x3"]'))


def test_pausing_a_group_from_the_page_stops_claims(cluster, browser):
    api = cluster.api()
    api.add("pausable", [{"data": f"p{i}"} for i in range(3)])
    browser.open(cluster.ui(follower(cluster)), "/group/pausable")
    browser.wait_text("#pause-toggle", "Pause group")
    browser.click("#pause-toggle")
    browser.confirm()
    wait_until("the group to be paused", lambda: api.get("/groups/pausable/settings")["paused"])
    assert api.claim("pausable") is None, "a paused group answered a claim"
    browser.wait_text("#paused-badge", "paused")
    browser.wait_text("#pause-toggle", "Resume group")
    browser.screenshot("group-paused")

    browser.click("#pause-toggle")
    browser.confirm()
    wait_until("the group to be resumed", lambda: not api.get("/groups/pausable/settings")["paused"])
    assert api.claim("pausable") is not None


def test_read_only_node_offers_no_action(ro_cluster, browser):
    api = ro_cluster.api()
    assert api.get("/ui/config")["actions"] is False
    make_dead(api, "ro", ["y1"])
    api.add("ro", [{"key": "y2", "data": "waiting"}])
    base = ro_cluster.ui()
    for fragment, ready in (("/dead?group=ro", '#dead-table tr[data-key="y1"]'), ("/group/ro", "#pause-toggle"), ("/groups", '#groups-table tr[data-group="ro"] button')):
        browser.open(base, fragment)
        wait_until(f"{fragment} to render", lambda: browser.find_all(ready))
        assert "--ui-actions" in browser.text("#readonly-note")
        assert browser.text("#mode") == "read-only"
        actions = browser.find_all("button.action")
        assert actions, f"{fragment}: no action buttons at all"
        enabled = [b.text for b in actions if b.is_enabled()]
        assert not enabled, f"{fragment}: enabled actions on a read-only node: {enabled}"
        if fragment.startswith("/dead"):
            browser.screenshot("read-only")
    # Clicking a disabled button does nothing.
    browser.js("document.querySelector('#groups-table button.action').click()")
    time.sleep(0.3)
    assert not browser.find_all("#confirm-dialog")
    assert api.get("/groups/ro/settings")["paused"] is False
    assert api.job("ro", "y1")["state"] == "dead"


def test_a_group_of_100000_tasks_is_read_a_page_at_a_time(cluster, browser):
    api = cluster.api()
    total, batch = 100_000, 2_000

    def add(start: int) -> None:
        api.add("big", [{"data": f"task {i:06d}"} for i in range(start, start + batch)], client=5)

    threads = []
    for start in range(0, total, batch * 25):
        th = threading.Thread(target=lambda s=start: [add(x) for x in range(s, s + batch * 25, batch)])
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    assert api.stats("big")["tasks"] == total

    started = time.monotonic()
    browser.open(cluster.ui(), "/group/big")
    wait_until("the first page", lambda: len(browser.find_all("#task-table tbody tr")) == 100, timeout=10)
    first_page = time.monotonic() - started
    browser.wait_text("#stat-tasks", "100,000")
    timing("first page of a 100 000-task group shown", first_page)
    assert first_page < 5, f"the first page of a 100 000-task group took {first_page:.1f} s"

    pages = [api.get("/group/big?owned=1&limit=100")]
    for _ in range(2):
        last = pages[-1][-1]
        pages.append(api.get(f"/group/big?owned=1&limit=100&after={last['timespec']}:{last['id']}"))
    for n in (2, 3):
        browser.click("#page-next")
        want = [t["id"] for t in pages[n - 1]]
        wait_until(f"page {n}", lambda w=want: [int(r.get_attribute("data-id")) for r in browser.find_all("#task-table tbody tr")] == w)
        assert browser.text("#page-info").startswith(f"page {n} · {(n - 1) * 100 + 1:,}–{n * 100:,}")
    browser.screenshot("group-100k")
    browser.click("#page-prev")
    wait_until("page 2 again", lambda: browser.text("#page-info").startswith("page 2"))

    requests = browser.js("return performance.getEntriesByType('resource').map(e => e.name)")
    group_reads = [urllib.parse.urlsplit(u) for u in requests if "/group/big" in u]
    assert group_reads, requests
    for u in group_reads:
        q = urllib.parse.parse_qs(u.query)
        assert "limit" in q and int(q["limit"][0]) <= 1000, f"an unpaged read of the group: {u.geturl()}"
    assert any("after" in urllib.parse.parse_qs(u.query) for u in group_reads), "no cursor used"


def test_cluster_page_shows_the_new_leader_after_a_leader_kill(cluster, browser):
    old = cluster.leader()
    watcher = next(i for i in sorted(cluster.by_id) if i != old)
    browser.open(cluster.ui(watcher), "/cluster")
    browser.wait_text("#leader", f"node {old}")
    # While no leader is known some reads answer 503 or fail: only those errors are allowed.
    browser.allowed = ["Failed to load resource", "net::ERR_"]
    os.kill(cluster.pid(old), signal.SIGKILL)
    killed = time.monotonic()
    shown = browser.wait_text("#leader", lambda t: t.startswith("node ") and t != f"node {old}", timeout=15)
    took = time.monotonic() - killed
    new = int(shown.split()[1])
    assert Api(cluster.by_id[watcher]).get("/cluster")["leader"] == new
    assert took < 5, f"the cluster page showed the new leader {took:.1f} s after the kill"
    browser.wait_text("#cluster-events", lambda t: f"leader {old} → " in t)
    timing(f"new leader (node {new}) shown after SIGKILL of node {old}", took)

    # The new leader knows which members replicate: the killed node, which never answered
    # it, shows as not replicating (its lag is unknown, not the whole log).
    browser.open(cluster.ui(new), "/cluster")
    browser.wait_text("#leader", f"node {new}")
    health = browser.wait_text(f'#members tr[data-node="{old}"] .health', lambda t: "not replicating" in t, timeout=10)
    assert "no answer to this leader" in health
    browser.screenshot("cluster-after-leader-kill")
    cluster.restart_stopped()
