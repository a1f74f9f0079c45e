# SPDX-License-Identifier: ISC
"""
TLS between clients and lokadb (client_tls_*): SSLRequest answered 'S' and
the session continues over TLS; require refuses plain logins; verify-ca asks
for a client certificate; bad files refuse the start or the RELOAD; new
certificates are used after RELOAD. Certificates are made with the openssl
command in the test's directory.
"""
import hashlib
import os
import select
import socket
import ssl
import time
import struct
import subprocess

import psycopg
import pytest

from lokadb_harness import IS_ROOT, SSL_REQUEST_CODE, USERS, Bouncer, Postgres, Wire, _pg_user_ids

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate signed by it, a client certificate signed by
    it, a second self-signed server certificate, and a client certificate of
    another CA."""
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=lokadb test CA", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "trustuser")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={cn}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                *(["-extfile", "san.ext"] if name == "server" else []), cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem",
            "-days", "2", "-subj", "/CN=second server cert", cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.pem",
            "-days", "2", "-subj", "/CN=trustuser", cwd=d)
    for f in d.iterdir():
        f.chmod(0o600 if f.suffix == ".key" else 0o644)
    return d


def tls_settings(certs, mode="require", **extra):
    s = {"client_tls_sslmode": mode, "client_tls_key_file": str(certs / "server.key"),
         "client_tls_cert_file": str(certs / "server.pem")}
    s.update(extra)
    return s


def tls_connect(b, sslmode="require", **kw):
    return b.connect(sslmode=sslmode, **kw)


def peer_subject(port, client_cert=None, client_key=None):
    """SSLRequest by hand, then a TLS handshake: the server certificate's CN."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE))
        assert s.recv(1) == b"S"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if client_cert:
            ctx.load_cert_chain(client_cert, client_key)
        with ctx.wrap_socket(s) as t:
            der = t.getpeercert(binary_form=True)
    out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject"], input=der,
                         capture_output=True, check=True, timeout=10).stdout.decode()
    return out.strip()


def test_require_runs_the_session_over_tls(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs))
    with tls_connect(b) as c:
        assert c.pgconn.ssl_in_use
        assert c.execute("select 40 + 2").fetchone()[0] == 42
        # a large reply and a COPY both ways go through the TLS bufferevent
        rows = c.execute("select repeat('x', 1000) from generate_series(1, 3000)").fetchall()
        assert len(rows) == 3000 and all(len(r[0]) == 1000 for r in rows)
        c.execute("create temp table t (x int)")
        with c.cursor().copy("copy t from stdin") as cp:
            for i in range(20000):
                cp.write_row((i,))
        assert c.execute("select count(*), sum(x) from t").fetchone() == (20000, sum(range(20000)))
        out = bytearray()
        with c.cursor().copy("copy t to stdout") as cp:
            for chunk in cp:
                out += chunk
        assert out.count(b"\n") == 20000


def _reply_over_libpq(conn, sql, stall):
    """Run sql the way psycopg does without blocking: consume what the socket
    gives, parse, and wait on the socket while the reply is incomplete. None
    when the socket stays silent for stall seconds with the reply unfinished
    (the client would wait for ever), else the number of rows."""
    pg = conn.pgconn
    pg.send_query(sql.encode())
    while pg.flush():
        select.select([], [pg.socket], [], stall)
    rows = 0
    while True:
        pg.consume_input()
        while not pg.is_busy():
            res = pg.get_result()
            if res is None:
                return rows
            rows += res.ntuples
        if not select.select([pg.socket], [], [], stall)[0]:
            return None


def test_replies_of_every_size_reach_a_client_that_waits_on_its_socket(bouncer_factory, certs):
    # libpq reads at most one TLS record per PQconsumeInput into at least
    # 8 KB of free buffer, and a client such as psycopg then waits on the
    # socket: bytes of a record left inside the client's OpenSSL are never
    # read if nothing else arrives. PostgreSQL never sends records over 8 KB,
    # and neither must lokadb. Replies of 120 sizes end in every position of
    # a record.
    b = bouncer_factory(settings=tls_settings(certs))
    with tls_connect(b, autocommit=True) as c:
        assert c.pgconn.ssl_in_use
        for rows in range(7, 841, 7):
            got = _reply_over_libpq(c, f"select repeat('y', 997) from generate_series(1, {rows})", stall=5.0)
            assert got is not None, f"reply of {rows} rows never completed: its end stayed in the client's TLS buffer"
            assert got == rows
        assert c.execute("select 1").fetchone()[0] == 1


def test_require_refuses_a_plain_login_with_28000(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs))
    with Wire(port=b.port) as w:                     # plain, no SSLRequest
        err = w.login("trustuser", "p0", raise_error=False)
    assert err is not None and err.sqlstate == "28000" and "SSL required" in err.message
    with pytest.raises(psycopg.OperationalError, match="SSL required"):
        b.connect()


def test_prefer_serves_plain_and_tls_and_show_clients_names_the_protocol(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, "prefer"))
    with b.connect() as plain, tls_connect(b) as enc:
        assert not plain.pgconn.ssl_in_use and enc.pgconn.ssl_in_use
        pid_plain = plain.execute("select 1").fetchone()
        pid_enc = enc.execute("select 2").fetchone()
        assert (pid_plain, pid_enc) == ((1,), (2,))
        clients = [r for r in b.admin_dicts("SHOW CLIENTS") if r["database"] == "p0"]
        tls = sorted(r["tls"] for r in clients)
        assert tls[0] == "" and tls[1].startswith("TLSv1.3/"), clients


def test_disable_answers_n_and_a_tls_only_client_fails(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, "disable"))
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
        s.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE))
        assert s.recv(1) == b"N"
    with pytest.raises(psycopg.OperationalError):
        tls_connect(b)
    with b.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_scram_login_over_tls(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, auth_type="scram-sha-256"))
    with tls_connect(b, user="cl_scram", password=USERS["cl_scram"]["password"]) as c:
        assert c.execute("select current_user").fetchone()[0] == "cl_scram"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        tls_connect(b, user="cl_scram", password="wrong")


def test_unencrypted_data_after_ssl_request_is_refused(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs))
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
        startup = struct.pack("!I", 196608) + b"user\0trustuser\0database\0p0\0\0"
        s.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE) + struct.pack("!I", len(startup) + 4) + startup)
        data = s.recv(4096)
    assert data[:1] == b"E" and b"08P01" in data and b"unencrypted data after SSL request" in data
    with tls_connect(b) as c:                      # nobody else noticed
        assert c.execute("select 1").fetchone()[0] == 1


def test_a_stalled_tls_handshake_is_closed_by_client_login_timeout(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, client_login_timeout=1))
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
        s.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE))
        assert s.recv(1) == b"S"
        s.settimeout(10)
        assert s.recv(100) == b""                   # closed, no ClientHello ever sent
    with tls_connect(b) as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_verify_ca_wants_a_client_certificate_of_the_ca(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, "verify-ca", client_tls_ca_file=str(certs / "ca.pem")),
                        start=False)
    b.tls_client_cert = (str(certs / "client.pem"), str(certs / "client.key"))
    b.start()
    with tls_connect(b, sslcert=str(certs / "client.pem"), sslkey=str(certs / "client.key")) as c:
        assert c.execute("select 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError):
        tls_connect(b)                              # no certificate
    with pytest.raises(psycopg.OperationalError):
        tls_connect(b, sslcert=str(certs / "rogue.pem"), sslkey=str(certs / "rogue.key"))


def test_bad_tls_files_refuse_the_start(bouncer_factory, certs, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    b = bouncer_factory(settings=tls_settings(certs, client_tls_cert_file=str(bad)), start=False)
    r = b.run_foreground(timeout=10)
    assert r.returncode != 0
    assert "client_tls_cert_file: cannot load" in r.stderr + b.log()
    b2 = bouncer_factory(settings={"client_tls_sslmode": "require"}, start=False)
    r = b2.run_foreground(timeout=10)
    assert r.returncode != 0 and "client_tls_key_file and client_tls_cert_file" in r.stderr + b2.log()


def test_reload_uses_new_certificates_and_refuses_bad_ones(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, "prefer"))   # the console check runs plain
    assert "CN = 127.0.0.1" in peer_subject(b.port)
    with tls_connect(b) as kept:
        b.write_ini(settings=tls_settings(certs, "prefer", client_tls_key_file=str(certs / "other.key"),
                                          client_tls_cert_file=str(certs / "other.pem")))
        res = b.admin_result("RELOAD")
        assert res.error is None
        assert "second server cert" in peer_subject(b.port)
        assert kept.execute("select 1").fetchone()[0] == 1      # a running session keeps going
        # a key that does not match the certificate: RELOAD refused, old files kept
        b.write_ini(settings=tls_settings(certs, "prefer", client_tls_key_file=str(certs / "server.key"),
                                          client_tls_cert_file=str(certs / "other.pem")))
        res = b.admin_result("RELOAD")
        assert res.error is not None and res.error.sqlstate == "F0000"
        assert "mismatch" in res.error.message or "does not match" in res.error.message
        assert "second server cert" in peer_subject(b.port)


def test_set_of_a_tls_setting_is_checked(bouncer_factory, certs):
    b = bouncer_factory(settings=tls_settings(certs, "prefer"))
    res = b.admin_result("SET client_tls_cert_file = '/nonexistent.pem'")
    assert res.error is not None and res.error.sqlstate == "22023"
    assert b.show_config()["client_tls_cert_file"]["value"] == str(certs / "server.pem")
    res = b.admin_result("SET client_tls_sslmode = 'disable'")
    assert res.error is None
    with pytest.raises(psycopg.OperationalError):
        tls_connect(b)


# ------------------------------------------------------- TLS to PostgreSQL --

@pytest.fixture(scope="module")
def ssl_pg(tmp_tree, certs):
    """A cluster of its own with ssl = on (server.pem, signed by the test CA)."""
    base = tmp_tree.new_dir("sslpg")
    base.chmod(0o755)
    cluster = Postgres(base)
    try:
        cluster.start()
        for f in ("server.pem", "server.key"):
            dst = cluster.datadir / f
            dst.write_bytes((certs / f).read_bytes())
            dst.chmod(0o600)
            if IS_ROOT:
                os.chown(dst, *_pg_user_ids())
        cluster.sql("ALTER SYSTEM SET ssl_cert_file = 'server.pem'")
        cluster.sql("ALTER SYSTEM SET ssl_key_file = 'server.key'")
        cluster.sql("ALTER SYSTEM SET ssl = on")
        cluster.sql("SELECT pg_reload_conf()")
        for _ in range(50):
            if cluster.sql("SHOW ssl")[0][0] == "on":
                break
            time.sleep(0.1)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ssl_bouncer(ssl_pg, tmp_tree):
    made = []

    def make(settings=None):
        b = Bouncer(ssl_pg, tmp_tree.new_dir("sslbouncer"), settings=settings)
        made.append(b)
        b.start()
        return b
    yield make
    for b in made:
        b.stop()


def backend_ssl(c):
    return c.execute("select ssl, version from pg_stat_ssl where pid = pg_backend_pid()").fetchone()


def test_server_connections_use_tls_when_the_server_offers_it(ssl_bouncer):
    b = ssl_bouncer()                                   # server_tls_sslmode defaults to prefer
    with b.connect() as c:
        ssl_on, version = backend_ssl(c)
        assert ssl_on is True and version.startswith("TLSv1.")
        rows = c.execute("select repeat('y', 500) from generate_series(1, 4000)").fetchall()
        assert len(rows) == 4000
        servers = [r for r in b.admin_dicts("SHOW SERVERS") if r["database"] == "p0"]
        assert servers and all(r["tls"].startswith("TLSv1.") for r in servers), servers


def test_server_tls_disable_connects_in_plaintext(ssl_bouncer):
    b = ssl_bouncer({"server_tls_sslmode": "disable"})
    with b.connect() as c:
        assert backend_ssl(c)[0] is False


def test_server_tls_require_fails_against_a_server_without_tls(bouncer_factory):
    b = bouncer_factory(settings={"server_tls_sslmode": "require"})   # the shared cluster has ssl = off
    with pytest.raises(psycopg.OperationalError, match="does not support TLS"):
        b.connect()
    assert "does not support TLS" in b.log()


def test_server_tls_verify_full_checks_the_ca_and_the_host(ssl_bouncer, certs):
    b = ssl_bouncer({"server_tls_sslmode": "verify-full", "server_tls_ca_file": str(certs / "ca.pem")})
    with b.connect() as c:
        assert backend_ssl(c)[0] is True
    # a CA that did not sign the server's certificate: the login fails, clearly
    bad = ssl_bouncer({"server_tls_sslmode": "verify-ca", "server_tls_ca_file": str(certs / "other.pem")})
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        bad.connect()


def test_tls_both_sides_moves_large_data_intact_past_full_socket_buffers(ssl_bouncer, certs):
    """20 MB each way with TLS to the client and to the server, the client
    reading late so that lokadb's writes find the kernel buffer full (the
    TLS write has to wait and resume): every byte arrives, in order."""
    b = ssl_bouncer(settings=tls_settings(certs, server_tls_sslmode="require"))
    with tls_connect(b) as c:
        assert c.pgconn.ssl_in_use and backend_ssl(c)[0] is True
        c.execute("create temp table big (i int, pad text)")
        with c.cursor().copy("copy big from stdin") as cp:
            for i in range(200000):
                cp.write_row((i, f"{i:09d}" * 10))
        pads = ",".join(f"{i:09d}" * 10 for i in range(200000)).encode()
        assert c.execute("select count(*), sum(i), md5(string_agg(pad, ',' order by i)) from big").fetchone() == \
            (200000, sum(range(200000)), hashlib.md5(pads).hexdigest())
        out = bytearray()
        with c.cursor().copy("copy (select i, pad from big order by i) to stdout") as cp:
            time.sleep(1.0)          # lokadb meanwhile fills the kernel buffer and waits
            for chunk in cp:
                out += chunk
        lines = bytes(out).split(b"\n")
        assert lines[-1] == b"" and len(lines) == 200001
        assert lines[0] == b"0\t" + b"000000000" * 10
        assert lines[199999] == b"199999\t" + b"000199999" * 10
        assert hashlib.md5(bytes(out)).hexdigest() == hashlib.md5(
            b"".join(b"%d\t%s\n" % (i, (b"%09d" % i) * 10) for i in range(200000))).hexdigest()
        assert c.execute("select 1").fetchone()[0] == 1
