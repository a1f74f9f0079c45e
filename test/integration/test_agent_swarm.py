# SPDX-License-Identifier: ISC
"""agent_swarm (test/tools/agent_swarm.c), the benchmark tool that opens many
tunnel agent sessions from one process, against a real relay lokadb: every
session is accepted (TLS 1.3, HELLO with the token proof of its own site) and
listed active by SHOW AGENTS until the tool is stopped; sessions of sites the
relay does not know are refused and the tool says so and exits 1; bad
arguments are refused.

The binary comes from LOKADB_TOOLS_DIR (`make integration` sets it; `make
test-tools` builds it)."""

import hashlib
import os
import subprocess

import pytest

from lokadb_harness import HERE, SANITIZER_MARKERS, SLOW, bouncer_env, free_port, stop_pid, wait_until
from test_tunnel import certs  # noqa: F401 -- the relay's certificate (fixture)

TOOLS_DIR = os.environ.get("LOKADB_TOOLS_DIR") or str((HERE / "../../build/rel/tools").resolve())
SWARM = os.path.join(TOOLS_DIR, "agent_swarm")


def swarm_sites(n, prefix="swarm"):
    """SITE:sha256(token) for the tool's first n sessions (its token rule)."""
    names = [f"{prefix}{i:04d}" for i in range(n)]
    return names, ", ".join(
        f"{s}:{hashlib.sha256(f'lokadb-swarm-token-{s}'.encode()).hexdigest()}" for s in names)


class Swarm:
    def __init__(self, tree, relay_port, count, prefix="swarm"):
        self.dir = tree.new_dir("swarm")
        self.out = open(self.dir / "stdout", "wb")
        self.err = open(self.dir / "stderr", "wb")
        self.proc = subprocess.Popen([SWARM, "--relay", f"127.0.0.1:{relay_port}", "--count", str(count),
                                      "--prefix", prefix, "--parallel", "4"],
                                     stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL,
                                     env=bouncer_env())

    def stdout(self):
        return (self.dir / "stdout").read_text(errors="replace")

    def stderr(self):
        return (self.dir / "stderr").read_text(errors="replace")

    def finish(self, stop=True):
        if stop:
            stop_pid(self.proc.pid, popen=self.proc)
        else:
            self.proc.wait(timeout=30 * SLOW)
        self.out.close()
        self.err.close()
        for marker in SANITIZER_MARKERS:
            assert marker not in self.stderr(), f"sanitizer report from agent_swarm:\n{self.stderr()}"
        return self.proc.returncode


@pytest.fixture
def relay(bouncer_factory, certs):  # noqa: F811
    names, sites = swarm_sites(12)
    port = free_port()
    raw = (f"[plugin.relay]\nlisten = 127.0.0.1:{port}\ncert_file = {certs / 'relay.pem'}\n"
           f"key_file = {certs / 'relay.key'}\nsites = {sites}\n")
    b = bouncer_factory(settings={"plugins": "relay"}, raw=raw)
    b.relay_port = port
    b.site_names = names
    return b


def active_sites(relay):
    return sorted(r["site"] for r in relay.admin_dicts("SHOW AGENTS") if r["state"] == "active")


def test_every_session_is_accepted_and_stays_until_stopped(relay, tmp_tree):
    if not os.access(SWARM, os.X_OK):
        pytest.fail(f"{SWARM} is missing: run `make test-tools`")
    sw = Swarm(tmp_tree, relay.relay_port, 10)
    try:
        wait_until(lambda: "10 sessions established" in sw.stdout(), 20 * SLOW,
                   what="the swarm's sessions to be accepted")
        assert active_sites(relay) == relay.site_names[:10]
        assert sw.proc.poll() is None
    finally:
        rc = sw.finish()
    assert rc == 0, sw.stderr()
    assert "agent_swarm: 10 established, 0 failed" in sw.stdout()
    wait_until(lambda: active_sites(relay) == [], 10 * SLOW, what="the relay to drop the sessions")


def test_sessions_of_unknown_sites_are_refused_and_the_tool_says_so(relay, tmp_tree):
    sw = Swarm(tmp_tree, relay.relay_port, 3, prefix="nosuch")
    rc = sw.finish(stop=False)
    assert rc == 1
    assert "GOAWAY UNAUTHORIZED" in sw.stderr(), sw.stderr()
    assert "3 of 3 sessions failed before all were up" in sw.stderr()
    assert "agent_swarm: 0 established, 3 failed" in sw.stdout()
    wait_until(lambda: "unknown site" in relay.log(), 5 * SLOW, what="the relay's log line")
    assert active_sites(relay) == []


@pytest.mark.parametrize("args", [[], ["--relay", "127.0.0.1:1"], ["--relay", "nonsense", "--count", "2"],
                                  ["--relay", "127.0.0.1:1", "--count", "0"],
                                  ["--relay", "127.0.0.1:1", "--count", "2", "--parallel", "999"]])
def test_bad_arguments_are_refused(args):
    r = subprocess.run([SWARM, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "usage: agent_swarm" in r.stderr
