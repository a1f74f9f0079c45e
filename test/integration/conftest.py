# SPDX-License-Identifier: ISC
"""
Fixtures for LokaDB's integration tests.

  pg              session: one PostgreSQL 15 cluster (lokadb_harness.Postgres)
  tmp_tree        session: the temporary directory everything lives in
  bouncer_factory function: make(settings=, databases=, users=, raw=,
                  section=, start=True, args=()) -> Bouncer; every Bouncer it
                  made is stopped at teardown and its log and stderr checked
                  for sanitizer reports
  bouncer         function: bouncer_factory() with the base configuration

Run:  cd test/integration && LOKADB_BIN=/abs/lokadb /usr/bin/python3 -m pytest -q -p no:cacheprovider
"""

import os
import signal

import pytest

from lokadb_harness import SLOW, Bouncer, Postgres, TempTree

# No test may run longer than this: a pooler that never answers must fail the
# test, not hang the suite (psycopg calls have no query timeout of their own).
TEST_TIMEOUT = 45 * SLOW

# libpq reads PG* variables; the tests must not inherit someone's PGHOST.
for _k in list(os.environ):
    if _k.startswith("PG"):
        del os.environ[_k]


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Remember each phase's report on the item, so teardown knows if the test failed."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


class TestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Per-test watchdog (SIGALRM): raises TestTimeout in the test's frame."""
    def expired(signum, frame):
        raise TestTimeout(f"test still running after {TEST_TIMEOUT:.0f}s: lokadb hangs?")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def tmp_tree():
    tree = TempTree()
    yield tree
    tree.remove()


@pytest.fixture(scope="session")
def pg(tmp_tree):
    cluster = Postgres(tmp_tree.path / "pg")
    (tmp_tree.path / "pg").mkdir()
    os.chmod(tmp_tree.path / "pg", 0o755)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# After this many startups in a row that never answered SHOW VERSION, further
# startups fail at once instead of waiting again (a broken build would
# otherwise cost ~15 s per test). LOKADB_NO_BREAKER=1 turns this off.
BREAKER_LIMIT = 3
_startup_failures = {"in_a_row": 0}


def _start_with_breaker(b, args):
    if (_startup_failures["in_a_row"] >= BREAKER_LIMIT
            and not os.environ.get("LOKADB_NO_BREAKER")):
        pytest.fail(f"lokadb did not become ready {BREAKER_LIMIT} times in a row; "
                    "not trying again (set LOKADB_NO_BREAKER=1 to insist)", pytrace=False)
    try:
        b.start(args=args)
    except Exception:
        _startup_failures["in_a_row"] += 1
        raise
    _startup_failures["in_a_row"] = 0


@pytest.fixture
def bouncer_factory(pg, tmp_tree, request):
    made = []

    def make(settings=None, databases=None, users=None, raw=None, section=None,
             start=True, args=(), binary=None):
        b = Bouncer(pg, tmp_tree.new_dir("bouncer"), settings=settings, databases=databases,
                    users=users, raw=raw, section=section, binary=binary)
        made.append(b)
        if start:
            _start_with_breaker(b, args)
        return b

    yield make

    findings = []
    for b in made:
        findings += b.teardown()
    failed = any(getattr(getattr(request.node, "rep_" + when, None), "failed", False)
                 for when in ("setup", "call"))
    if failed:
        for b in made:
            print(f"\n----- {b.logpath} (last 3000 chars) -----\n{b.log()[-3000:]}")
            err = b.stderr()
            if err:
                print(f"----- {b.stderr_path} -----\n{err[-3000:]}")
    if findings:
        pytest.fail("sanitizer reports:\n" + "\n".join(findings[:40]), pytrace=False)


@pytest.fixture
def bouncer(bouncer_factory):
    return bouncer_factory()
