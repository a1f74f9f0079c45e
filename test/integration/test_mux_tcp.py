# SPDX-License-Identifier: ISC
"""The tunnel multiplexer (plugins/tunnel/) over a real TCP connection with
a round-trip time: mux_bench (test/tools/mux_bench.c) runs a relay session
and an agent session in one process, the agent dialing through delay_relay,
and sends streams of checked bytes from relay to agent. No timing is
asserted: these check that every byte arrives intact and in order over real
sockets, that stalled readers do not block the other streams, and that the
caller's LOKADB_MUX_WINDOW_KB reaches the settings."""

import os
import subprocess

from lokadb_harness import SANITIZER_MARKERS, SLOW, bouncer_env, free_port
from test_delay_relay import TOOLS_DIR, relay_factory  # noqa: F401 -- the fixture

MUX_BENCH = os.path.join(TOOLS_DIR, "mux_bench")


def run_bench(relay_factory, delay_ms, args, env_extra=None):
    listen = free_port()
    r = relay_factory(listen, delay_ms)
    env = bouncer_env()
    env.pop("LOKADB_MUX_WINDOW_KB", None)
    env.update(env_extra or {})
    p = subprocess.run([MUX_BENCH, "--listen", f"127.0.0.1:{listen}", "--dial", f"127.0.0.1:{r.port}", *args],
                       capture_output=True, text=True, timeout=150 * SLOW, env=env)
    code, out, _ = r.stop()
    assert code == 0 and "1 connections" in out
    for marker in SANITIZER_MARKERS:
        assert marker not in p.stderr, f"sanitizer report from mux_bench:\n{p.stderr}"
    return p


def test_streams_cross_the_multiplexer_intact_over_a_delayed_tcp_path(relay_factory):
    p = run_bench(relay_factory, 5, ["--mb", "8", "--streams", "3", "--window-kb", "256"])
    assert p.returncode == 0, p.stderr
    assert "3 streams x 8 MiB, window 256 KiB" in p.stdout


def test_stalled_streams_do_not_block_the_others(relay_factory):
    """Two streams whose reader never returns credit stop at their window;
    the two others still deliver all of their bytes."""
    p = run_bench(relay_factory, 5, ["--mb", "4", "--streams", "2", "--stall", "2", "--window-kb", "128"])
    assert p.returncode == 0, p.stderr
    assert "2 streams x 4 MiB" in p.stdout


def test_the_window_comes_from_lokadb_mux_window_kb(relay_factory):
    p = run_bench(relay_factory, 1, ["--mb", "1"], {"LOKADB_MUX_WINDOW_KB": "512"})
    assert p.returncode == 0, p.stderr
    assert "window 512 KiB" in p.stdout
