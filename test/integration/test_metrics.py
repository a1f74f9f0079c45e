# SPDX-License-Identifier: ISC
"""The Prometheus endpoint (metrics_listen): text format 0.0.4 at /metrics,
values that follow the pooler, metrics registered by plugins (ABI 1.4), and
HTTP clients that are slow or malformed without the pooler noticing."""

import os
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lokadb_harness import SLOW, free_port, wait_until

PLUGIN_DIR = os.environ.get("LOKADB_TEST_PLUGIN_DIR",
                            str(Path(__file__).resolve().parents[2] / "build/rel/test-plugins"))

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse(text):
    """Exposition text -> (samples {(name, ((k, v), ...)): float}, types {name: type}, helps {name: text}).
    Checks the format as it goes: each sample after its family's # TYPE line."""
    samples, types, helps = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, h = line[7:].partition(" ")
            helps[name] = h
            continue
        if line.startswith("# TYPE "):
            name, _, t = line[7:].partition(" ")
            assert t in ("counter", "gauge"), line
            assert name not in types, f"family {name} declared twice"
            types[name] = t
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels = m.group(1), []
        if m.group(3):
            pos = 0
            for lm in LABEL.finditer(m.group(3)):
                assert lm.start() == pos, f"bad labels in {line!r}"
                val = re.sub(r'\\(.)', lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), lm.group(2))
                labels.append((lm.group(1), val))
                pos = lm.end()
            assert pos == len(m.group(3)), f"bad labels in {line!r}"
        assert name in types, f"sample before its # TYPE: {line!r}"
        samples[(name, tuple(labels))] = float(m.group(4))
    return samples, types, helps


def scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5 * SLOW) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(r.read().decode())


def value(samples, name, **labels):
    return samples.get((name, tuple(labels.items())))


def metrics_bouncer(bouncer_factory, **settings):
    port = free_port()
    s = {"metrics_listen": f"127.0.0.1:{port}", "pool_mode": "transaction"}
    s.update(settings)
    b = bouncer_factory(settings=s)
    b.metrics_port = port
    return b


def test_metrics_are_off_by_default(bouncer):
    assert bouncer.show_config()["metrics_listen"]["value"] == ""
    assert "serving metrics" not in bouncer.log()


def test_metrics_follow_clients_and_queries(bouncer_factory):
    b = metrics_bouncer(bouncer_factory)
    samples, types, helps = scrape(b.metrics_port)
    assert value(samples, "lokadb_info", version="0.1.0", peer_id="0") == 1
    assert types["lokadb_pools_client_active_connections"] == "gauge"
    assert types["lokadb_stats_total_query_count"] == "counter"
    assert types["lokadb_stats_avg_query_time_seconds"] == "gauge"
    assert all(name in helps for name in types)
    assert value(samples, "lokadb_lists_items", list="databases") >= 4
    before = value(samples, "lokadb_stats_total_query_count", database="p0") or 0

    a, c = b.connect("p0"), b.connect("p0")
    for i in range(5):
        a.execute("select %s::int", (i,))
    c.execute("begin")
    c.execute("select 1")
    samples, _, _ = scrape(b.metrics_port)
    assert value(samples, "lokadb_pools_client_active_connections", database="p0", user="trustuser") == 2
    assert value(samples, "lokadb_pools_server_active_connections", database="p0", user="trustuser") == 1
    assert value(samples, "lokadb_databases_current_client_connections", database="p0") == 2
    assert value(samples, "lokadb_databases_current_connections", database="p0") >= 1
    assert value(samples, "lokadb_databases_pool_size", database="p0") == 5
    assert value(samples, "lokadb_lists_items", list="used_clients") >= 2
    assert value(samples, "lokadb_stats_total_query_count", database="p0") >= before + 6
    assert value(samples, "lokadb_stats_total_received_bytes", database="p0") > 0
    assert value(samples, "lokadb_stats_total_query_time_seconds", database="p0") > 0

    c.execute("commit")
    a.close()
    c.close()
    def gone():
        s, _, _ = scrape(b.metrics_port)
        return value(s, "lokadb_pools_client_active_connections", database="p0", user="trustuser") == 0
    wait_until(gone, 5 * SLOW, what="client_active back to 0")
    samples, _, _ = scrape(b.metrics_port)
    assert value(samples, "lokadb_pools_server_idle_connections", database="p0", user="trustuser") >= 1


def test_pool_sizes_are_per_pool_with_the_users_values(bouncer_factory):
    """The database-level sizes say what [databases] gives; a [users] entry's
    pool_size/reserve_pool_size win for that user's pools, so the pool metrics
    (labels database, user, as SHOW POOLS) show what each pool really gets."""
    port = free_port()
    b = bouncer_factory(settings={"metrics_listen": f"127.0.0.1:{port}", "reserve_pool_size": 2},
                        users={"trustuser": "pool_size=3 reserve_pool_size=4"})
    b.connect("p0").execute("select 1")
    b.connect("p0_md5").execute("select 1")     # forced user=md5user: its pool is md5user's
    samples, types, _ = scrape(port)
    assert types["lokadb_pools_reserve_pool_size"] == "gauge"
    assert value(samples, "lokadb_databases_reserve_pool_size", database="p0") == 2
    assert value(samples, "lokadb_databases_pool_size", database="p0") == 5
    assert value(samples, "lokadb_pools_reserve_pool_size", database="p0", user="trustuser") == 4
    assert value(samples, "lokadb_pools_pool_size", database="p0", user="trustuser") == 3
    assert value(samples, "lokadb_pools_reserve_pool_size", database="p0_md5", user="md5user") == 2
    assert value(samples, "lokadb_pools_pool_size", database="p0_md5", user="md5user") == 5


def test_paths_other_than_metrics_get_404_and_only_get_is_served(bouncer_factory):
    b = metrics_bouncer(bouncer_factory)
    for path in ("/", "/metrics/x", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}{path}", timeout=5 * SLOW)
        assert ei.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{b.metrics_port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=5 * SLOW)
    assert ei.value.code in (405, 501)
    samples, _, _ = scrape(b.metrics_port, "/metrics?name[]=x")
    assert samples


def raw_http(port, data, timeout=5.0):
    """Send bytes, return what comes back until the server closes (or b'' on timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout * SLOW) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
        except socket.timeout:
            return out


def test_slow_and_malformed_http_clients_do_not_disturb_the_pooler(bouncer_factory):
    b = metrics_bouncer(bouncer_factory)
    slow = [socket.create_connection(("127.0.0.1", b.metrics_port), timeout=30) for _ in range(20)]
    for s in slow:
        s.sendall(b"GET /metr")                                     # and never the rest
    assert raw_http(b.metrics_port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    huge = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert raw_http(b.metrics_port, huge)[:12] in (b"HTTP/1.1 400", b"HTTP/1.1 413", b"")
    start = time.monotonic()
    with b.connect("p0") as c:
        assert c.execute("select 'pooler unaffected'").fetchone()[0] == "pooler unaffected"
    samples, _, _ = scrape(b.metrics_port)
    assert value(samples, "lokadb_info", version="0.1.0", peer_id="0") == 1
    assert time.monotonic() - start < 3 * SLOW
    # the idle half-requests are closed after the timeout (10 s)
    slow[0].settimeout(20 * SLOW)
    wait_until(lambda: slow[0].recv(100) == b"", 20 * SLOW, interval=0.2, what="slow client closed")
    for s in slow:
        s.close()
    assert b.alive()


def test_a_plugin_registers_metrics(bouncer_factory):
    b = metrics_bouncer(bouncer_factory, plugin_dir=PLUGIN_DIR, plugins="t_metrics")
    for _ in range(3):
        b.connect("p0").close()
    b.connect("p1", user="pooluser1", password="pool1pw").close()
    samples, types, helps = scrape(b.metrics_port)
    assert types["lokadb_t_metrics_logins"] == "counter"
    assert helps["lokadb_t_metrics_logins"] == "Logins per user, seen by t_metrics."
    assert value(samples, "lokadb_t_metrics_logins", user="trustuser") == 3
    assert value(samples, "lokadb_t_metrics_logins", user="pooluser1") == 1
    assert value(samples, "lokadb_t_metrics_odd_labels", v='a"b\\c\nd', k2="plain") == 1.5
    assert value(samples, "lokadb_t_metrics_odd_labels") == -3
    nan = value(samples, "lokadb_t_metrics_odd_labels", v="nan")
    assert nan is not None and nan != nan
    assert not any(name == "lokadb_t_metrics_odd_labels" and v == 2 for (name, _), v in samples.items())
    assert helps["lokadb_t_metrics_odd_labels"] == 'Label values that need escaping:\\n\\\\ and ".'
    assert types["lokadb_t_metrics_empty"] == "gauge"
    assert not any(name == "lokadb_t_metrics_empty" for name, _ in samples)
    b.connect("p0").close()
    samples, _, _ = scrape(b.metrics_port)
    assert value(samples, "lokadb_t_metrics_logins", user="trustuser") == 4


@pytest.mark.parametrize("listen, message", [
    ("nonsense", 'metrics_listen "nonsense": expected host:port'),
    ("127.0.0.1:0", 'metrics_listen "127.0.0.1:0": expected host:port'),
    ("[::1:9127", 'metrics_listen "[::1:9127": expected host:port'),
])
def test_a_malformed_metrics_listen_refuses_the_start(bouncer_factory, listen, message):
    b = bouncer_factory(settings={"metrics_listen": listen}, start=False)
    res = b.run_foreground()
    assert res.returncode != 0
    assert message in res.stderr + b.log()


def test_a_busy_metrics_port_refuses_the_start(bouncer_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        b = bouncer_factory(settings={"metrics_listen": f"127.0.0.1:{port}"}, start=False)
        res = b.run_foreground()
    assert res.returncode != 0
    assert f"could not listen for metrics on 127.0.0.1:{port}" in res.stderr + b.log()
