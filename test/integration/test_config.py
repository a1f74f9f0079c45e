# SPDX-License-Identifier: ISC
"""Command line and configuration errors: -V, -v/-q, FILE:LINE: reason on
stderr for bad settings, the [pgbouncer] section alias."""

import subprocess

import pytest

from lokadb_harness import SLOW, assert_serves, bouncer_env, default_bin


def test_version_flag_prints_a_lokadb_version_line_and_exits_zero():
    r = subprocess.run([default_bin(), "-V"], capture_output=True, text=True,
                       timeout=10 * SLOW, env=bouncer_env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("lokadb "), r.stdout


@pytest.mark.parametrize("flag", ["-v", "-q"])
def test_verbose_and_quiet_flags_are_accepted(bouncer_factory, flag):
    b = bouncer_factory(args=[flag])
    assert_serves(b)


def assert_config_error(b, needle, key):
    """lokadb refuses to start and says FILE:LINE: ... key ... on stderr."""
    line = b.ini_line_of(needle)
    r = b.run_foreground(timeout=10)
    assert r.returncode != 0, f"lokadb accepted a bad config:\n{r.stdout}\n{r.stderr}"
    assert f"{b.ini}:{line}:" in r.stderr, r.stderr
    assert key in r.stderr, r.stderr


def test_unknown_setting_is_rejected_with_file_line_and_key(bouncer_factory):
    b = bouncer_factory(settings={"foo": "1"}, start=False)
    assert_config_error(b, "foo =", "foo")
    assert "unknown setting" in b.run_foreground(timeout=10).stderr


def test_unknown_key_in_a_databases_entry_is_rejected(bouncer_factory, pg):
    b = bouncer_factory(databases={"pbad": f"host=127.0.0.1 port={pg.port} dbname=p0 bogus_key=1"},
                        start=False)
    assert_config_error(b, "pbad =", "bogus_key")


def test_site_without_the_tunnel_transport_is_rejected(bouncer_factory):
    # site= names a site of the tunnel transport; it must not be taken as a host name
    b = bouncer_factory(databases={"pbad": "site=acme dbname=p0"}, start=False)
    assert_config_error(b, "pbad =", "site= needs transport=tunnel")


def test_bad_value_is_rejected_with_file_line_and_key(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": "lots"}, start=False)
    assert_config_error(b, "default_pool_size =", "default_pool_size")


def test_bad_pool_mode_in_users_section_is_rejected(bouncer_factory):
    b = bouncer_factory(users={"pooluser1": "pool_mode=sometimes"}, start=False)
    assert_config_error(b, "pooluser1 =", "pool_mode")


def test_missing_config_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.ini"
    r = subprocess.run([default_bin(), str(missing)], capture_output=True, text=True,
                       timeout=10 * SLOW, env=bouncer_env(), stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert str(missing) in r.stderr


def test_pgbouncer_section_name_is_accepted(bouncer_factory):
    b = bouncer_factory(section="pgbouncer")
    assert_serves(b)
