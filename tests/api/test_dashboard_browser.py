"""The operator's dashboard (`/dashboard`, `/v1/dashboard/data`) against real workers and a real
headless browser (Debian's chromium + chromedriver, driven by selenium; `.ci/run` installs them).

One worker (module fixture) gets a generated data set — memory (3 users), sessions and graphs,
renamed with a unique suffix so no other test's records mix in, moved to recent event time —
and runs until the broker shows every input partition committed. Expectations come from what
the pipeline wrote to Kafka (ledger, relay, quarantine and DLQ records of the test's users,
classified by the documented rules; the published analytics windows; the group's committed
offsets and the high watermarks) and from the test's own records (graph budgets and session
ledgers folded with the pure reducers); the page is also checked against the JSON at rest.

- `test_dashboard_data_shape`: the JSON endpoint (auth, scopes, shape, figures);
- `test_dashboard_page_is_static_and_self_contained`: `/dashboard` needs no token, loads nothing
  from elsewhere (CSP);
- `test_dashboard_in_headless_chromium`: the page renders every chart with those figures (read
  from the SVG elements' data attributes), refreshes itself without reloading, shows one user's
  exact counts, asks for a token when its token is refused, logs no console error, and leaves
  `test-artifacts/dashboard.png` and `test-artifacts/dashboard-user.png`;
- `test_dashboard_data_is_fleet_wide_across_two_workers`: two workers, either answers for both.
"""

from __future__ import annotations

import shutil
import time
import urllib.request
import uuid
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Consumer, TopicPartition

from streams.analytics import classify_dead_letter
from streams.analytics.classify import classify_ledger_event, classify_quarantine, classify_relay_event
from streams.analytics.windows import EVENT_COUNTERS
from streams.api.dashboard import activity, assemble, local_part
from streams.contracts import catalog
from streams.core.ids import node_id_for
from streams.graphs import state as graph_state
from streams.sessions import lifecycle
from streams.tools.generate import generate
from tests.conftest import ROOT
from tests.kafka_util import free_port, http_get, produce, read_to_end, worker

pytestmark = pytest.mark.kafka

TOKEN = "dash-token"
TOP = 60  # rows of the graph / session lists asked for: other tests' graphs and sessions may rank first
MIN = 60_000
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INPUTS = [t.name for t in catalog.topics() if t.direction == "in"]


# --------------------------------------------------------------------------- data set


def _dataset(suffix: str, now: int) -> tuple[list, dict]:
    """generate(): memory for 3 users, each user's stream moved to end about now (a user's
    stream spans hours: the older minute windows have expired, the hour windows hold it all),
    sessions and graphs moved to the last hour; every user, session and graph id gets `suffix`."""
    items = generate(seed=11, users=3, kinds=("memory", "sessions", "graphs"), epoch_ms=0)
    users = sorted({i.key for i in items if i.topic.startswith("memory.")})
    new_user = {u: f"{u}-{suffix}" for u in users}
    # explicit `supersedes` name the node formed from another candidate of the same user: re-derive
    nodes = {node_id_for(i.key, i.value["candidate_id"]): node_id_for(new_user[i.key], i.value["candidate_id"])
             for i in items if i.topic == catalog.MEMORY_CANDIDATES}
    first_ts: dict[tuple[str, str], int] = {}
    last_ts: dict[str, int] = defaultdict(int)
    for i in items:
        if i.topic in (catalog.SESSION_EVENTS, catalog.GRAPH_EVENTS):
            first_ts.setdefault((i.topic, i.key), i.value["ts"])
        elif isinstance(i.value, dict) and isinstance(i.value.get("timestamp"), int):
            last_ts[i.key] = max(last_ts[i.key], i.value["timestamp"])
    order: dict[tuple[str, str], int] = {}
    for topic, key in first_ts:  # n-th session / n-th graph
        order[(topic, key)] = sum(1 for t, _k in order if t == topic)
    out = []
    for i in items:
        v = dict(i.value)
        if i.topic.startswith("memory."):
            key = new_user[i.key]
            v["motebit_id"] = key
            if v.get("supersedes"):
                v["supersedes"] = nodes[v["supersedes"]]
            delta = now - 3 * MIN - last_ts[i.key]
            for f in ("timestamp", "valid_from"):
                if isinstance(v.get(f), int):
                    v[f] += delta
        elif i.topic == catalog.SESSION_EVENTS:
            key = f"{i.key}-{suffix}"
            v["sessionId"] = f"{v['sessionId']}-{suffix}" if isinstance(v.get("sessionId"), str) else v.get("sessionId")
            v["ts"] = v["ts"] - first_ts[(i.topic, i.key)] + now - 60 * MIN + order[(i.topic, i.key)] * 4 * MIN
        else:
            key = f"{i.key}-{suffix}"
            v["graphId"] = f"{v['graphId']}-{suffix}"
            delta = now - 50 * MIN + order[(i.topic, i.key)] * 5 * MIN - first_ts[(i.topic, i.key)]
            for f in ("ts", "startedAt", "completedAt"):
                if isinstance(v.get(f), int):
                    v[f] += delta
        out.append((i.topic, key, v))
    return out, {"users": sorted(new_user.values())}


def _expected_graphs(records: list) -> dict[str, dict]:
    states: dict[str, dict | None] = {}
    for topic, key, v in records:
        if topic != catalog.GRAPH_EVENTS:
            continue
        try:
            states[key] = graph_state.apply(states.get(key), v, None)
        except graph_state.GraphEventError:
            pass
    return {k: graph_state.to_record(s) for k, s in states.items() if s is not None}


def _expected_sessions(records: list) -> dict[str, dict]:
    states: dict[str, dict] = {}
    for topic, key, v in records:
        if topic == catalog.SESSION_EVENTS:
            states[key], _violations = lifecycle.step(states.get(key) or lifecycle.new_state(key), v)
    return {k: lifecycle.to_record(s) for k, s in states.items()}


# --------------------------------------------------------------------------- Kafka reading


def _produce_by_topic(settings, records: list[tuple[str, str, object]]) -> None:
    """Produce (topic, key, value) records, one batch per topic."""
    by_topic = defaultdict(list)
    for topic, key, value in records:
        by_topic[topic].append((key, value))
    for topic, items in by_topic.items():
        produce(settings, topic, items)


def _read_to_end(settings, topic: str, keys: set[str]) -> list[dict]:
    """Every record of `topic` with one of `keys` (str), up to the high watermarks as of now."""
    return [{**m, "key": m["key"].decode()} for m in read_to_end(settings, topic, {k.encode() for k in keys})]


def _offsets(settings, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (committed offset of `group`, high watermark), from the broker."""
    c = Consumer({"bootstrap.servers": settings.broker, "group.id": group, "enable.auto.commit": False, "log_level": 0})
    try:
        tps = [TopicPartition(t, p) for t in INPUTS for p in c.list_topics(t, timeout=10).topics[t].partitions]
        committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
        return {k: (max(committed[k], 0), c.get_watermark_offsets(TopicPartition(*k), timeout=10)[1]) for k in committed}
    finally:
        c.close()


def _wait_caught_up(settings, group: str, timeout: float = 150.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        offs = _offsets(settings, group)
        behind = {k: v for k, v in offs.items() if v[1] > v[0]}
        if not behind:
            return offs
        assert time.monotonic() < deadline, f"worker still behind: {behind}"
        time.sleep(1.0)


def _user_totals(settings, users: list[str]) -> dict[str, dict[str, int]]:
    """Per user, the analytics counters of everything the pipeline wrote for them (ledger,
    relay, quarantine, dead letters; each record once), by the classification rules of
    streams/analytics."""
    keys = set(users)
    totals: dict[str, Counter] = defaultdict(Counter)
    incs = []
    for rec in _read_to_end(settings, catalog.MEMORY_LEDGER, keys):
        incs += classify_ledger_event(rec["value"])
    for rec in _read_to_end(settings, catalog.MEMORY_RELAY, keys):
        if rec["value"] is not None:
            incs += classify_relay_event(rec["value"])
    for rec in _read_to_end(settings, catalog.MEMORY_QUARANTINE, keys):
        incs += classify_quarantine(rec["value"])
    for rec in _read_to_end(settings, catalog.DLQ, keys):
        incs += classify_dead_letter(rec["value"], rec["timestamp"])
    seen = set()
    for inc in incs:  # at-least-once: a record re-sent after a rebalance has the same id, count it once
        if inc.id is None or inc.id not in seen:
            seen.add(inc.id)
            totals[inc.subject].update(inc.counters)
    return {u: {f: int(totals[u].get(f, 0)) for f in EVENT_COUNTERS} for u in users}


def _published_minutes(settings, user: str) -> dict[int, dict]:
    """The latest published minute window of `user` per window start (memory.analytics.v1)."""
    latest = {}
    for rec in _read_to_end(settings, catalog.MEMORY_ANALYTICS, {user}):
        v = rec["value"]
        if v["window"] == "minute" and v["motebit_id"] == user:
            latest[v["window_start"]] = v
    return latest


# --------------------------------------------------------------------------- the worker


@pytest.fixture(scope="module")
def dash(stack):
    suffix = uuid.uuid4().hex[:8]
    now = int(time.time() * 1000)
    records, meta = _dataset(suffix, now)
    port = free_port()
    app_id = f"it-dash-{suffix}"
    env = {"MEMSTREAM_APP_ID": app_id, "MEMSTREAM_WEB_PORT": str(port),
           "MEMSTREAM_API_TOKENS": f"{TOKEN}:none", "MEMSTREAM_TIMER_INTERVAL_S": "1"}
    started = time.monotonic()
    with worker(stack, f"dash-{suffix}", env=env):
        _produce_by_topic(stack, records)
        offsets = _wait_caught_up(stack, app_id)
        time.sleep(2.5)  # two analytics timer ticks: every changed window is published
        users = meta["users"]
        ctx = {
            "settings": stack, "port": port, "app_id": app_id, "users": users, "records": records,
            "offsets": offsets,
            "graphs": _expected_graphs(records),
            "sessions": _expected_sessions(records),
            "user_totals": _user_totals(stack, users),
            "setup_s": time.monotonic() - started,
        }
        yield ctx


# --------------------------------------------------------------------------- tests


def _get(port: int, path: str, token: str | None = TOKEN):
    return http_get(port, path, token)


def test_dashboard_data_shape(dash):
    port = dash["port"]
    assert _get(port, "/v1/dashboard/data", None)[0] == 401
    assert _get(port, "/v1/dashboard/data", "wrong")[0] == 401
    assert _get(port, "/v1/dashboard/data?scope=everything")[0] == 400
    assert _get(port, "/v1/dashboard/data?top=0")[0] == 400
    status, d = _get(port, f"/v1/dashboard/data?top={TOP}")
    assert status == 200, d
    assert set(d) >= {"generated_at", "scope", "user", "workers", "activity", "totals", "rates", "pipeline",
                      "top_users", "graphs", "sessions", "lag", "subjects"}
    assert d["scope"] == "fleet" and d["user"] is None
    assert [w["ok"] for w in d["workers"]] == [True]
    act = d["activity"]
    assert act["types"] == list(EVENT_COUNTERS) and act["window"] == "minute"
    assert act["to_ms"] - act["from_ms"] == 120 * MIN and act["series"]
    assert all(act["from_ms"] <= p["start"] < act["to_ms"] and p["start"] % MIN == 0 for p in act["series"])
    assert act["totals"] == {f: sum(p[f] for p in act["series"]) for f in EVENT_COUNTERS}
    # fleet totals hold at least every count the test's users produced (other tests' data may add)
    mine = dash["user_totals"]
    for f in EVENT_COUNTERS:
        assert d["totals"][f] >= sum(t[f] for t in mine.values()), f
    for f in ("formed", "merged", "superseded", "redacted", "quarantined", "dead_lettered", "accessed"):
        assert sum(t[f] for t in mine.values()) > 0, f"the generated data set should produce some {f}"
    # graphs and sessions: exactly the reducers' result for the test's ids
    graphs = {g["graph_id"]: g for g in d["graphs"]["items"]}
    for gid, rec in dash["graphs"].items():
        b = rec["budget"] or {}
        assert graphs[gid]["cost_usd"] == pytest.approx(b.get("costUsd", 0.0), abs=1e-9)
        assert graphs[gid]["input_tokens"] == b.get("inputTokens", 0)
        assert graphs[gid]["output_tokens"] == b.get("outputTokens", 0)
    sessions = {s["session_id"]: s for s in d["sessions"]["items"]}
    compacted = {k: r for k, r in dash["sessions"].items() if r["compactions"] or r["tokensSaved"]}
    assert compacted, "the generated sessions should compact"
    for sid, rec in compacted.items():
        assert sessions[sid]["tokens_saved"] == rec["tokensSaved"], sid
        assert sessions[sid]["compactions"] == len(rec["compactions"]), sid
    assert d["sessions"]["totals"]["tokens_saved"] >= sum(r["tokensSaved"] for r in compacted.values())
    # lag: one entry per input partition, offsets as the broker has them for this group
    lag = d["lag"]
    assert lag["available"] is True
    got = {(p["topic"], p["partition"]): p for p in lag["partitions"]}
    assert set(got) == set(dash["offsets"])
    for k, (committed, end) in dash["offsets"].items():
        assert (got[k]["committed"], got[k]["highwater"], got[k]["lag"]) == (committed, end, end - committed), k
    assert lag["total"] == 0
    # per user: the totals are exactly what the pipeline wrote for that user
    user = dash["users"][0]
    status, u = _get(port, f"/v1/dashboard/data?user={user}")
    assert status == 200 and u["scope"] == "user" and u["user"] == user
    assert {f: u["totals"][f] for f in EVENT_COUNTERS} == dash["user_totals"][user]
    # ?scope=local: this worker's part, the shape `assemble` merges
    status, part = _get(port, "/v1/dashboard/data?scope=local")
    assert status == 200 and set(part) >= {"worker", "url", "minute", "hour", "graphs", "sessions", "lag", "pipeline"}
    assert part["hour"]["totals"]["formed"] == d["totals"]["formed"]


def test_dashboard_page_is_static_and_self_contained(dash):
    with urllib.request.urlopen(f"http://127.0.0.1:{dash['port']}/dashboard", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        csp = r.headers["Content-Security-Policy"]
        html = r.read().decode()
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "<script src" not in html and "<link rel=\"stylesheet\"" not in html
    assert "http://" not in html and "https://" not in html  # nothing fetched from anywhere else


def test_activity_window_is_anchored_on_the_newest_window_not_far_future():
    now = 100 * 60 * MIN
    def pt(start, **c):
        return {"window_start": start, "window_end": start + MIN, **{f: 0 for f in EVENT_COUNTERS}, **c}

    series = [pt(now - 300 * MIN, formed=1), pt(now - 10 * MIN, merged=2), pt(now + 5 * 24 * 60 * MIN, formed=1)]
    a = activity(series, now)
    assert a["to_ms"] == now - 9 * MIN and a["from_ms"] == a["to_ms"] - 120 * MIN
    assert [p["start"] for p in a["series"]] == [now - 10 * MIN] and a["totals"]["merged"] == 2
    empty = assemble([local_part(worker="w", url="u", analytics_states=[], graph_states=[], session_states=[],
                                 lags=None, counters={})], now_ms=now)
    assert empty["activity"]["series"] == [] and empty["lag"]["available"] is False
    assert empty["rates"]["promotion_share"] is None and empty["graphs"]["items"] == []


# --------------------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def browser():
    if not (shutil.which("chromium") or shutil.which(CHROMIUM)) or not shutil.which(CHROMEDRIVER):
        pytest.fail("chromium / chromedriver missing: `apt-get install chromium chromium-driver` (.ci/run does it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--window-size=1400,1200", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--renderer-process-limit=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # an explicit driver path: selenium manager must not try to download a driver or a browser
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, script: str, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            state = driver.execute_script("return [document.body.dataset.state, document.getElementById('banner').textContent]")
            raise AssertionError(f"timed out waiting for {what or script}; page state {state}")
        time.sleep(0.2)


READ_PAGE = """
const num = (x) => x === '' || x === undefined ? null : Number(x);
return {
  kpis: Object.fromEntries([...document.querySelectorAll('[data-kpi]')].map(e => [e.dataset.kpi, num(e.dataset.value)])),
  series: [...document.querySelectorAll('svg[data-series]')].map(s => ({
    type: s.dataset.series, total: num(s.dataset.total), from: num(s.dataset.from), to: num(s.dataset.to),
    bars: [...s.querySelectorAll('rect[data-count]')].map(r => [num(r.dataset.start), num(r.dataset.count)])})),
  graphs: [...document.querySelectorAll('rect[data-graph-id]')].map(r => ({id: r.dataset.graphId,
    cost: num(r.dataset.costUsd), input: num(r.dataset.inputTokens), output: num(r.dataset.outputTokens),
    width: r.getBBox().width})),
  sessions: [...document.querySelectorAll('rect[data-session-id]')].map(r => ({id: r.dataset.sessionId,
    saved: num(r.dataset.tokensSaved), compactions: num(r.dataset.compactions), width: r.getBBox().width})),
  lag: [...document.querySelectorAll('rect[data-topic]')].map(r => ({topic: r.dataset.topic,
    partition: num(r.dataset.partition), lag: num(r.dataset.lag), committed: num(r.dataset.committed),
    highwater: num(r.dataset.highwater)})),
  rates: [...document.querySelectorAll('[data-rate]')].map(e => e.dataset.rate),
  sparks: [...document.querySelectorAll('svg[data-spark]')].length,
  users: [...document.querySelectorAll('tr[data-user]')].map(e => [e.dataset.user, num(e.dataset.events)]),
  empties: [...document.querySelectorAll('.empty')].map(e => e.textContent),
  state: document.body.dataset.state, refreshes: num(document.body.dataset.refreshes),
  url: location.href, stored: sessionStorage.getItem('memstream.dashboard.token'),
};
"""


def _screenshot(driver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, height + 140)  # the whole page in one picture
    time.sleep(0.3)
    assert driver.save_screenshot(str(ARTIFACTS / name))


def _console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_dashboard_in_headless_chromium(dash, browser):
    started = time.monotonic()
    port, users = dash["port"], dash["users"]
    base = f"http://127.0.0.1:{port}"

    # --- fleet view
    browser.get(f"{base}/dashboard?token={TOKEN}&top={TOP}")
    _wait(browser, "return document.body.dataset.state === 'ready'", what="the first refresh")
    page = browser.execute_script(READ_PAGE)
    assert page["stored"] == TOKEN and "token=" not in page["url"] and f"top={TOP}" in page["url"]  # kept in sessionStorage, not in the URL
    status, data = _get(port, f"/v1/dashboard/data?top={TOP}")  # at rest: the same figures the page was drawn from
    assert status == 200
    assert page["empties"] == [], page["empties"]

    # header totals = the fleet totals, which hold at least what the test's users produced
    mine = dash["user_totals"]
    for f in EVENT_COUNTERS:
        assert page["kpis"][f] == data["totals"][f] >= sum(t[f] for t in mine.values()), f
    assert page["kpis"]["tokens_saved"] == data["sessions"]["totals"]["tokens_saved"]
    assert page["kpis"]["graph_cost_usd"] == pytest.approx(data["graphs"]["totals"]["cost_usd"])
    assert page["kpis"]["max_lag"] == 0

    # activity: one small multiple per event type; its bars are exactly the minute windows
    assert [s["type"] for s in page["series"]] == list(EVENT_COUNTERS)
    act = data["activity"]
    for s in page["series"]:
        want = sorted((p["start"], p[s["type"]]) for p in act["series"] if p[s["type"]])
        assert sorted(map(tuple, s["bars"])) == want, s["type"]
        assert s["total"] == act["totals"][s["type"]] and (s["from"], s["to"]) == (act["from_ms"], act["to_ms"])
    drawn = {s["type"]: s["total"] for s in page["series"]}
    for f in ("formed", "merged", "accessed"):
        assert drawn[f] > 0, f"no {f} bars drawn"
    assert page["rates"] == ["promoted", "redacted", "dead_lettered"] and page["sparks"] == 3

    # graph budgets: every test graph with its cost and tokens, bar length ordered by cost
    drawn_graphs = {g["id"]: g for g in page["graphs"]}
    for gid, rec in dash["graphs"].items():
        b = rec["budget"] or {}
        g = drawn_graphs[gid]
        assert g["cost"] == pytest.approx(b.get("costUsd", 0.0), abs=1e-9), gid
        assert (g["input"], g["output"]) == (b.get("inputTokens", 0), b.get("outputTokens", 0)), gid
    by_cost = sorted(page["graphs"], key=lambda g: g["cost"])
    assert [g["width"] for g in by_cost] == sorted(g["width"] for g in by_cost)
    assert max(g["width"] for g in page["graphs"]) > 0

    # compaction savings: every test session that compacted, with its ledger's tokensSaved
    drawn_sessions = {s["id"]: s for s in page["sessions"]}
    for sid, rec in dash["sessions"].items():
        if rec["compactions"] or rec["tokensSaved"]:
            assert drawn_sessions[sid]["saved"] == rec["tokensSaved"], sid
            assert drawn_sessions[sid]["compactions"] == len(rec["compactions"]), sid

    # consumer lag: one bar per input partition with the broker's offsets for this group
    lag = {(b["topic"], b["partition"]): b for b in page["lag"]}
    assert set(lag) == set(dash["offsets"])
    for k, (committed, end) in dash["offsets"].items():
        assert (lag[k]["committed"], lag[k]["highwater"], lag[k]["lag"]) == (committed, end, 0), k
    assert sum(b["highwater"] for b in page["lag"]) >= len(dash["records"])

    # top users: the test's users are listed with their event counts
    listed = dict(page["users"])
    assert set(users) <= set(listed) or len(listed) == 10

    # it refreshes itself (fetch + redraw, no reload: a marker on window survives)
    browser.execute_script("window.__probe = 42")
    before = page["refreshes"]
    _wait(browser, f"return Number(document.body.dataset.refreshes) > {before}", timeout=15, what="a refresh")
    assert browser.execute_script("return window.__probe") == 42
    errors = _console_errors(browser)
    assert errors == [], errors
    _screenshot(browser, "dashboard.png")

    # --- one user (a click in the top-users list would do the same): exact counts for that user
    user = max(users, key=lambda u: listed.get(u, -1))  # the busiest of the test's users
    browser.set_window_size(1400, 1200)
    browser.get(f"{base}/dashboard?user={user}")  # the token comes from sessionStorage now
    _wait(browser, "return document.body.dataset.state === 'ready'", what="the user view")
    page = browser.execute_script(READ_PAGE)
    assert {f: page["kpis"][f] for f in EVENT_COUNTERS} == mine[user]
    published = _published_minutes(dash["settings"], user)
    for s in page["series"]:
        drawn_bars = dict(map(tuple, s["bars"]))
        for start, count in drawn_bars.items():
            assert published[start][s["type"]] == count, (s["type"], start)
        assert s["total"] == sum(drawn_bars.values())
        # a published window in the range that is not drawn can only be one the worker has
        # since expired (2 h after the partition's clock), i.e. at the old edge of the range
        missing = [st for st, w in published.items() if s["from"] <= st < s["to"] and w[s["type"]]
                   and st not in drawn_bars]
        assert all(st < s["from"] + 10 * MIN for st in missing), (s["type"], missing)
    assert sum(s["total"] for s in page["series"]) > 0
    errors = _console_errors(browser)
    assert errors == [], errors
    _screenshot(browser, "dashboard-user.png")

    # --- a wrong token: the page asks for one instead of failing
    browser.execute_script("sessionStorage.setItem('memstream.dashboard.token', 'nope')")
    browser.get(f"{base}/dashboard")
    _wait(browser, "return document.body.dataset.state === 'auth'", what="the token form")
    assert browser.execute_script("return document.getElementById('login').hidden") is False
    print(f"\n[dashboard] setup {dash['setup_s']:.1f}s, browser part {time.monotonic() - started:.1f}s")


def test_dashboard_data_is_fleet_wide_across_two_workers(stack):
    """Two workers of one app: either one answers for the whole fleet (its own partitions plus
    the other's, standby copies not counted twice), and a user's figures come from the worker
    that owns the user, whichever worker is asked."""
    suffix = uuid.uuid4().hex[:8]
    records, meta = _dataset(suffix, int(time.time() * 1000))
    app_id = f"it-dash2-{suffix}"
    ports = [free_port(), free_port()]
    env = {"MEMSTREAM_APP_ID": app_id, "MEMSTREAM_API_TOKENS": f"{TOKEN}:none", "MEMSTREAM_TIMER_INTERVAL_S": "1"}
    with worker(stack, f"dash2a-{suffix}", env={**env, "MEMSTREAM_WEB_PORT": str(ports[0])}), \
            worker(stack, f"dash2b-{suffix}", env={**env, "MEMSTREAM_WEB_PORT": str(ports[1])}):
        deadline = time.monotonic() + 90
        while True:  # until the group has settled with partitions on both workers
            owned = [len(_get(p, "/v1/dashboard/data?scope=local")[1]["lag"] or []) for p in ports]
            if all(owned) and sum(owned) == len(INPUTS) * stack.partitions:
                break
            assert time.monotonic() < deadline, f"partitions never split between the workers: {owned}"
            time.sleep(1)
        _produce_by_topic(stack, records)
        offsets = _wait_caught_up(stack, app_id)
        time.sleep(2.5)
        mine = _user_totals(stack, meta["users"])
        graphs, sessions = _expected_graphs(records), _expected_sessions(records)
        answers = [_get(p, f"/v1/dashboard/data?top={TOP}")[1] for p in ports]
        parts = [_get(p, "/v1/dashboard/data?scope=local")[1] for p in ports]
        per_user = {(p, u): _get(p, f"/v1/dashboard/data?user={u}")[1] for p in ports for u in meta["users"]}
    for d in answers:
        assert sorted(w["url"] for w in d["workers"] if w["ok"]) == sorted(f"http://127.0.0.1:{p}" for p in ports)
        assert {(x["topic"], x["partition"]) for x in d["lag"]["partitions"]} == set(offsets)
        assert {x["worker"] for x in d["lag"]["partitions"]} == {p["worker"] for p in parts}
        for f in EVENT_COUNTERS:
            assert d["totals"][f] == sum(p["hour"]["totals"][f] for p in parts) >= sum(t[f] for t in mine.values()), f
        assert {g["graph_id"]: g["cost_usd"] for g in d["graphs"]["items"] if g["graph_id"] in graphs} == pytest.approx(
            {k: (r["budget"] or {}).get("costUsd", 0.0) for k, r in graphs.items()})
        drawn = {x["session_id"]: x["tokens_saved"] for x in d["sessions"]["items"]}
        assert all(drawn[k] == r["tokensSaved"] for k, r in sessions.items() if r["compactions"])
    assert answers[0]["totals"] == answers[1]["totals"]
    for (port, user), d in per_user.items():
        assert {f: d["totals"][f] for f in EVENT_COUNTERS} == mine[user], (port, user)
