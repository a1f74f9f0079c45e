# SPDX-License-Identifier: ISC
"""The default max_client_conn = 1000: a thousand clients connected at once
are all served, the next one gets 53300, and lokadb raises its own soft
RLIMIT_NOFILE to what that needs (started here under a soft limit of 256)."""

import resource
import time

from lokadb_harness import PgError, Wire, assert_error, parse_error_fields, startup_packet

CLIENTS = 1000          # lokadb's default max_client_conn
LOW_SOFT_LIMIT = 256


def raise_own_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def nofile_of(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def read_until(w, types):
    """Messages up to one of `types`; returns (type, payload). ErrorResponse raises PgError."""
    while True:
        typ, payload = w.read_msg()
        if typ == b"E":
            raise PgError(parse_error_fields(payload))
        if typ in types:
            return typ, payload


def test_a_thousand_clients_at_once_are_served_and_the_next_gets_53300(bouncer_factory):
    assert raise_own_nofile(CLIENTS + 200) >= CLIENTS + 100, "this test needs 1100 file descriptors"
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 10}, start=False)
    # start lokadb under a low soft limit (it inherits ours), then restore ours
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_SOFT_LIMIT, hard))
    try:
        b.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert nofile_of(b.pid) >= CLIENTS + 64
    b.wait_log(r"kernel file descriptor limit: \d+ \(hard: \d+\); max_client_conn: 1000")
    assert "file descriptor limit" not in "".join(l for l in b.log().splitlines() if "WARNING" in l)

    start = time.monotonic()
    clients = []
    try:
        # connect all: send every startup packet first, then read the logins
        for _ in range(CLIENTS):
            w = Wire(port=b.port, timeout=20)
            clients.append(w)
            w.send(startup_packet({"user": "trustuser", "database": "p0"}))
        for w in clients:
            read_until(w, (b"Z",))
        # the 1001st is refused as PgBouncer does (SQLSTATE as PostgreSQL's too many clients)
        extra = Wire(port=b.port, timeout=10)
        clients.append(extra)
        err = extra.login("trustuser", "p0", raise_error=False)
        assert err is not None, "client 1001 was let in"
        assert_error(err, "53300", "no more connections allowed (max_client_conn)")
        # every one of the thousand runs a query, all at once (10 server connections)
        for i, w in enumerate(clients[:CLIENTS]):
            w.send_msg(b"Q", f"select {i}\0".encode())
        for i, w in enumerate(clients[:CLIENTS]):
            _, payload = read_until(w, (b"D",))
            assert payload[6:].decode() == str(i)
            read_until(w, (b"Z",))
    finally:
        for w in clients:
            w.close()
    elapsed = time.monotonic() - start
    b.wait_log(r"closing because: no more connections allowed \(max_client_conn\)")
    assert b.alive()
    print(f"{CLIENTS} clients logged in and served in {elapsed:.1f}s")


def test_a_hard_file_descriptor_limit_below_max_client_conn_is_logged_as_a_warning(bouncer_factory, tmp_path):
    from lokadb_harness import default_bin
    wrapper = tmp_path / "lokadb-low-nofile"
    wrapper.write_text(f"#!/bin/sh\nulimit -n 300 || exit 3\nexec {default_bin()} \"$@\"\n")
    wrapper.chmod(0o755)
    b = bouncer_factory(binary=str(wrapper))
    assert nofile_of(b.pid) == 300
    b.wait_log(r"kernel file descriptor limit: 300 \(hard: 300\); max_client_conn: 1000")
    b.wait_log(r"WARNING file descriptor limit 300 is below the \d+ that max_client_conn and the pools need")
    assert b.login("p0").scalar("select 1") == "1"


def test_running_out_of_descriptors_pauses_accepting_instead_of_spinning(bouncer_factory, tmp_path):
    import socket
    from lokadb_harness import default_bin, wait_until
    raise_own_nofile(1000)
    wrapper = tmp_path / "lokadb-low-nofile"
    wrapper.write_text(f"#!/bin/sh\nulimit -n 200 || exit 3\nexec {default_bin()} \"$@\"\n")
    wrapper.chmod(0o755)
    b = bouncer_factory(binary=str(wrapper), settings={"client_login_timeout": 60})
    socks = []
    try:
        for _ in range(400):            # more than lokadb's 200 descriptors; the rest wait in the backlog
            try:
                socks.append(socket.create_connection(("127.0.0.1", b.port), timeout=0.5))
            except OSError:
                break
        b.wait_log(r"accept\(\) failed: Too many open files; not accepting new connections")
        time.sleep(1.5)                 # several janitor runs: accepting is retried, not spun on
        failures = [line for line in b.log().splitlines() if "accept" in line and "failed" in line]
        assert len(failures) <= 2, f"{len(failures)} accept failures logged, e.g. {failures[-1]!r}"
        assert b.alive()
    finally:
        for s in socks:
            s.close()

    def served():
        try:
            return b.login("p0").scalar("select 1") == "1"
        except (OSError, AssertionError):
            return False
    assert wait_until(served, 10, what="lokadb to accept again once descriptors are free")


def test_the_fd_estimate_counts_users_pool_size_and_reserve_pool_size(bouncer_factory):
    """[users] pool_size/reserve_pool_size replace the database's per pool, so the
    "max expected fd use" counts them: for the forced-user entry once, for the
    other one once per user, a [users] entry outside auth_file included."""
    only = {db: None for db in ("p1", "p2", "p3", "p0_md5", "p0_scram", "p0_clear")}

    def expected_fd_use(users):
        b = bouncer_factory(databases=only, users=users)
        m = b.wait_log(r"max expected fd use: (\d+)")
        b.stop()
        return int(m.group(1))

    base = expected_fd_use({})
    sized = expected_fd_use({"trustuser": "pool_size=50 reserve_pool_size=7"})
    # p0 (trustuser's pool) and p0_trust (forced user=trustuser): 5 + 0 -> 50 + 7 each
    assert sized - base == 2 * (57 - 5)
    ghost = expected_fd_use({"trustuser": "pool_size=50 reserve_pool_size=7", "nosuchuser": "pool_size=3"})
    # a [users] entry not in auth_file may log in (auth_query): one more p0 pool of 3
    assert ghost - sized == 3
