# SPDX-License-Identifier: ISC
"""
lokadb_harness -- the machinery behind LokaDB's integration tests.

What it owns:
  * Postgres: one throw-away PostgreSQL 15 cluster (initdb, our own
    pg_hba.conf, roles for every server login method, databases p0..p3).
  * Bouncer: one lokadb process with a generated ini and userlist, its log
    and stderr files, and every client connection a test opened through it.
  * Wire: a small raw protocol-3 client (startup, trust/cleartext/md5/SCRAM
    login, simple and extended queries, ErrorResponse parsing). Tests use it
    whenever they must see a SQLSTATE at login time (libpq hides it), send
    bytes no driver would send, or need a bounded wait on the console.

Invariants tests rely on:
  * Every wait is bounded in time; a wait that runs out raises AssertionError
    (or socket.timeout from Wire) -- nothing here blocks forever.
  * Every process started is stopped by its PID (SIGTERM, then SIGKILL after
    a bounded wait), also when a test fails.
  * Nothing here touches files outside the temporary directories it creates.

Environment:
  LOKADB_BIN              absolute path of the binary (default ../../lokadb)
  LOKADB_SANITIZE         non-empty: sanitizer build; longer waits, ASAN/UBSAN
                          options for the process
  LOKADB_KEEP_TMP         non-empty: keep the temporary directory
  LOKADB_INI_SECTION      main ini section name (default "lokadb"); only for
                          smoke-testing the harness against pgbouncer
  LOKADB_ADMIN_DB         console database name (default "lokadb"); likewise
"""

import base64
import hashlib
import hmac
import os
import pwd
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

HERE = Path(__file__).resolve().parent

# Processes are watched and stopped by PID as the benchmarks do (bench/benchlib.py, stdlib only).
sys.path.append(str(HERE.parent.parent / "bench"))
import benchlib  # noqa: E402
from benchlib import pid_alive  # noqa: E402,F401 -- also for the test files
from benchlib import wait_gone as wait_pid_exit  # noqa: E402,F401 -- also for the test files

PG_BIN = Path(os.environ.get("LOKADB_PG_BIN", "/usr/lib/postgresql/15/bin"))
PSQL = str(PG_BIN / "psql")
PGBENCH = str(PG_BIN / "pgbench")
IS_ROOT = os.geteuid() == 0
SANITIZE = bool(os.environ.get("LOKADB_SANITIZE"))
# Multiplier for every bound on "how long may this take" (not for sleeps
# that define a behaviour, such as "stay idle longer than the timeout").
SLOW = 3.0 if SANITIZE else 1.0
INI_SECTION = os.environ.get("LOKADB_INI_SECTION", "lokadb")
ADMIN_DB = os.environ.get("LOKADB_ADMIN_DB", "lokadb")

# Startup-packet protocol codes.
PROTO_V3 = 196608
CANCEL_REQUEST_CODE = 80877102
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104

SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:",
                     "ThreadSanitizer", "MemorySanitizer")

# Users and passwords, one table for the cluster, the userlist and the tests.
# server_hba: how PostgreSQL authenticates the role; secret: what lokadb's
# auth_file holds ("plain", "md5" or "scram" encoding of password).
USERS = {
    "trustuser":     {"password": "trustpass",  "server_hba": "trust",         "secret": "plain"},
    "md5user":       {"password": "md5pass",    "server_hba": "md5",           "secret": "md5"},
    "scramuser":     {"password": "scrampass",  "server_hba": "scram-sha-256", "secret": "scram"},
    "cleartextuser": {"password": "clearpass",  "server_hba": "password",      "secret": "plain"},
    # Client-auth test users: trust on the server, so only lokadb checks them.
    "cl_plain":      {"password": "plainpw",    "server_hba": "trust",         "secret": "plain"},
    "cl_md5":        {"password": "md5pw",      "server_hba": "trust",         "secret": "md5"},
    "cl_scram":      {"password": "scrampw",    "server_hba": "trust",         "secret": "scram"},
    # For [users] overrides.
    "pooluser1":     {"password": "pool1pw",    "server_hba": "trust",         "secret": "plain"},
    "pooluser2":     {"password": "pool2pw",    "server_hba": "trust",         "secret": "plain"},
}
CONSOLE_USERS = {"admin": "adminpw", "stats": "statspw"}
DATABASES = ("p0", "p1", "p2", "p3", "p_minpool")
PG_DEFAULT_TIMEZONE = "Asia/Tokyo"     # distinct from anything a test sets


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------

_ports_given = set()


def _ephemeral_low():
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Picked below the kernel's ephemeral range: a port the kernel hands out
    for bind(0) is also one it may give any outgoing connection as its local
    port before the test listens on it. Never the same port twice in a run."""
    hi = min(_ephemeral_low(), 32768)
    lo = max(1024, hi - 12000)
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(lo, hi)
        if port in _ports_given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fatal(Exception):
    """Raised by a wait_until predicate to stop waiting at once."""


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Poll pred() until it returns a truthy value, at most `timeout` seconds.
    Exceptions from pred count as "not yet", except Fatal."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Fatal:
            raise
        except Exception as e:  # noqa: BLE001 -- reported on timeout
            last_exc = e
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:.1f}s waiting for {what}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            raise AssertionError(msg)
        time.sleep(interval)


def stop_pid(pid, sig=signal.SIGTERM, timeout=5.0, popen=None):
    """Send sig, wait at most timeout, then SIGKILL. Returns True if sig sufficed."""
    return benchlib.stop_pid(pid, sig, timeout, popen)


def pids_listening_on(port):
    """PIDs of processes with a TCP socket listening on port (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    pids = set()
    if not inodes:
        return pids
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    pids.add(int(d.name))
                    break
        except OSError:
            continue
    return pids


class BgCall:
    """Run fn(*args) in a daemon thread; result(timeout) is bounded.

    Daemon threads never keep the interpreter alive; a call blocked on a
    socket ends when the test's teardown kills the process at the other end.
    """

    def __init__(self, fn, *args, **kwargs):
        self._done = threading.Event()
        self._value = None
        self._exc = None
        self.started = time.monotonic()
        self.finished = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- handed to result()
            self._exc = e
        finally:
            self.finished = time.monotonic()
            self._done.set()

    def done(self):
        return self._done.is_set()

    def wait(self, timeout):
        return self._done.wait(timeout)

    @property
    def elapsed(self):
        end = self.finished if self.finished is not None else time.monotonic()
        return end - self.started

    def result(self, timeout):
        if not self._done.wait(timeout):
            raise AssertionError(f"background call still running after {timeout:.1f}s")
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self, timeout):
        if not self._done.wait(timeout):
            raise AssertionError(f"background call still running after {timeout:.1f}s")
        return self._exc


# --------------------------------------------------------------------------
# secrets
# --------------------------------------------------------------------------

def md5_secret(user, password):
    """auth_file / pg_authid form of an md5 password: "md5" + md5(password + user)."""
    return "md5" + hashlib.md5((password + user).encode()).hexdigest()


def _hmac256(key, msg):
    return hmac.new(key, msg, hashlib.sha256).digest()


def scram_keys(password, salt, iterations):
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac256(salted, b"Client Key")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = _hmac256(salted, b"Server Key")
    return client_key, stored_key, server_key


def scram_secret(password, salt=None, iterations=4096):
    """SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>."""
    if salt is None:
        salt = os.urandom(16)
    _, stored_key, server_key = scram_keys(password, salt, iterations)
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def user_secret(user):
    info = USERS[user]
    if info["secret"] == "md5":
        return md5_secret(user, info["password"])
    if info["secret"] == "scram":
        return scram_secret(info["password"])
    return info["password"]


def userlist_text():
    lines = [f'"{u}" "{user_secret(u)}"' for u in USERS]
    lines += [f'"{u}" "{pw}"' for u, pw in CONSOLE_USERS.items()]
    lines.append('"postgres" ""')
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# raw protocol client
# --------------------------------------------------------------------------

class PgError(Exception):
    """An ErrorResponse received by Wire; .fields maps field codes to text."""

    def __init__(self, fields):
        self.fields = fields
        super().__init__(f"{fields.get('S')} {fields.get('C')}: {fields.get('M')}")

    @property
    def sqlstate(self):
        return self.fields.get("C")

    @property
    def message(self):
        return self.fields.get("M", "")

    @property
    def severity(self):
        return self.fields.get("S")


def parse_error_fields(payload):
    """ErrorResponse / NoticeResponse body -> {'S':..., 'C':..., 'M':..., ...}."""
    fields = {}
    pos = 0
    while pos < len(payload) and payload[pos] != 0:
        code = chr(payload[pos])
        end = payload.index(b"\0", pos + 1)
        fields[code] = payload[pos + 1:end].decode("utf-8", "replace")
        pos = end + 1
    return fields


def startup_packet(params, version=PROTO_V3):
    body = struct.pack("!I", version)
    for k, v in params.items():
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def message(typ, payload=b""):
    return typ + struct.pack("!I", len(payload) + 4) + payload


class QueryResult:
    def __init__(self):
        self.columns = []       # of the last RowDescription
        self.rows = []          # text values (None for NULL), all result sets
        self.tags = []          # CommandComplete tags
        self.notices = []
        self.error = None       # PgError or None
        self.messages = []      # (type, payload) in order


class Wire:
    """A raw PostgreSQL protocol-3 client with bounded reads.

    read_msg() raises EOFError when the peer closed (also on ECONNRESET) and
    socket.timeout when nothing arrived in time.
    """

    def __init__(self, host="127.0.0.1", port=None, timeout=5.0, unix_path=None, tls=None):
        """tls: None (plain), True (SSLRequest, then TLS without verifying the
        server), or a (certfile, keyfile) pair to present a client certificate."""
        self.timeout = timeout * SLOW
        if unix_path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(unix_path)
        else:
            self.sock = socket.create_connection((host, port), timeout=self.timeout)
        if tls:
            self.sock.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE))
            answer = self.sock.recv(1)
            if answer != b"S":
                self.sock.close()
                raise ConnectionError(f"SSLRequest answered {answer!r}")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if isinstance(tls, tuple):
                ctx.load_cert_chain(tls[0], tls[1])
            self.sock = ctx.wrap_socket(self.sock)
        self.buf = b""
        self.params = {}
        self.backend_key = None
        self.auth_codes = []
        self.logged_in = False

    # -- bytes --
    def send(self, data):
        self.sock.sendall(data)

    def send_msg(self, typ, payload=b""):
        self.send(message(typ, payload))

    def close(self):
        """Send Terminate if we are logged in (best effort), then close."""
        try:
            if self.logged_in:
                self.sock.settimeout(0.2)
                self.sock.sendall(message(b"X"))
        except OSError:
            pass
        self.logged_in = False
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out reading from lokadb")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise EOFError("connection closed by peer")
            self.buf += chunk

    def read_exact(self, n, timeout=None):
        deadline = time.monotonic() + (timeout * SLOW if timeout else self.timeout)
        self._fill(n, deadline)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_msg(self, timeout=None):
        deadline = time.monotonic() + (timeout * SLOW if timeout else self.timeout)
        self._fill(5, deadline)
        typ = self.buf[:1]
        (length,) = struct.unpack("!I", self.buf[1:5])
        if length < 4 or length > 64 * 1024 * 1024:
            raise AssertionError(f"bad message length {length} from lokadb (type {typ!r})")
        self._fill(1 + length, deadline)
        payload = self.buf[5:1 + length]
        self.buf = self.buf[1 + length:]
        return typ, payload

    def wait_closed(self, timeout=5.0):
        """Read until EOF; returns the messages that came before it."""
        msgs = []
        deadline = time.monotonic() + timeout * SLOW
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"connection still open after {timeout}s; got {msgs!r}")
            try:
                msgs.append(self.read_msg(timeout=left / SLOW))
            except EOFError:
                return msgs
            except socket.timeout:
                raise AssertionError(f"connection still open after {timeout}s; got {msgs!r}")

    def outcome(self, timeout=5.0):
        """First reply to something bad: ('error', fields), ('closed', None) or
        ('message', (typ, payload)). A silent open socket is a hang: AssertionError."""
        try:
            typ, payload = self.read_msg(timeout=timeout)
        except EOFError:
            return "closed", None
        except socket.timeout:
            raise AssertionError(f"no reply and no close within {timeout}s (hang)")
        if typ == b"E":
            return "error", parse_error_fields(payload)
        return "message", (typ, payload)

    # -- login --
    def login(self, user, database, password=None, params=None, raise_error=True):
        """Startup + authentication until ReadyForQuery. Handles trust,
        cleartext (3), md5 (5) and SCRAM-SHA-256 (10/11/12). Returns None on
        success; on ErrorResponse raises PgError (or returns it)."""
        p = {"user": user, "database": database}
        p.update(params or {})
        self.send(startup_packet(p))
        return self.finish_login(user, password, raise_error)

    def finish_login(self, user, password=None, raise_error=True):
        scram = None
        while True:
            typ, payload = self.read_msg()
            if typ == b"E":
                err = PgError(parse_error_fields(payload))
                if raise_error:
                    raise err
                return err
            if typ == b"R":
                (code,) = struct.unpack("!I", payload[:4])
                self.auth_codes.append(code)
                scram = self._auth_step(code, payload[4:], user, password, scram)
            elif typ == b"S":
                k, v, _ = payload.split(b"\0", 2)
                self.params[k.decode()] = v.decode()
            elif typ == b"K":
                self.backend_key = struct.unpack("!II", payload[:8])
            elif typ == b"Z":
                self.logged_in = True
                return None
            elif typ in (b"N", b"v"):
                pass
            else:
                raise AssertionError(f"unexpected message {typ!r} during login")

    def _auth_step(self, code, data, user, password, scram):
        if code == 0:
            return scram
        if password is None:
            password = ""
        if code == 3:
            self.send_msg(b"p", password.encode() + b"\0")
        elif code == 5:
            inner = hashlib.md5((password + user).encode()).hexdigest()
            outer = hashlib.md5(inner.encode() + data[:4]).hexdigest()
            self.send_msg(b"p", b"md5" + outer.encode() + b"\0")
        elif code == 10:
            mechs = [m for m in data.split(b"\0") if m]
            if b"SCRAM-SHA-256" not in mechs:
                raise AssertionError(f"no SCRAM-SHA-256 in offered mechanisms {mechs!r}")
            nonce = base64.b64encode(os.urandom(18)).decode()
            first_bare = f"n=,r={nonce}"
            first = ("n,," + first_bare).encode()
            self.send_msg(b"p", b"SCRAM-SHA-256\0" + struct.pack("!I", len(first)) + first)
            return {"nonce": nonce, "first_bare": first_bare}
        elif code == 11:
            return self._scram_continue(data, password, scram)
        elif code == 12:
            expected = scram.get("server_signature") if scram else None
            got = dict(kv.split("=", 1) for kv in data.decode().split(","))
            if expected is not None and base64.b64decode(got["v"]) != expected:
                raise AssertionError("SCRAM server signature mismatch")
        else:
            raise AssertionError(f"unsupported authentication request {code}")
        return scram

    def _scram_continue(self, data, password, scram):
        server_first = data.decode()
        attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
        if not attrs["r"].startswith(scram["nonce"]):
            raise AssertionError("SCRAM server nonce does not extend ours")
        salt = base64.b64decode(attrs["s"])
        client_key, stored_key, server_key = scram_keys(password, salt, int(attrs["i"]))
        final_wo_proof = f"c=biws,r={attrs['r']}"
        auth_msg = f"{scram['first_bare']},{server_first},{final_wo_proof}".encode()
        signature = _hmac256(stored_key, auth_msg)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        scram["server_signature"] = _hmac256(server_key, auth_msg)
        final = f"{final_wo_proof},p={base64.b64encode(proof).decode()}"
        self.send_msg(b"p", final.encode())
        return scram

    # -- queries --
    def read_until_ready(self, timeout=None):
        res = QueryResult()
        while True:
            typ, payload = self.read_msg(timeout=timeout)
            res.messages.append((typ, payload))
            if typ == b"T":
                res.columns = _parse_row_description(payload)
            elif typ == b"D":
                res.rows.append(_parse_data_row(payload))
            elif typ == b"C":
                res.tags.append(payload.rstrip(b"\0").decode())
            elif typ == b"E":
                res.error = PgError(parse_error_fields(payload))
            elif typ == b"N":
                res.notices.append(parse_error_fields(payload))
            elif typ == b"S":
                k, v, _ = payload.split(b"\0", 2)
                self.params[k.decode()] = v.decode()
            elif typ == b"Z":
                return res

    def query(self, sql, timeout=None, raise_error=True):
        """Simple query; returns QueryResult (raises PgError on error)."""
        self.send_msg(b"Q", sql.encode() + b"\0")
        res = self.read_until_ready(timeout=timeout)
        if res.error is not None and raise_error:
            raise res.error
        return res

    def scalar(self, sql):
        return self.query(sql).rows[0][0]

    # -- extended protocol pieces --
    @staticmethod
    def parse_msg(sql, name=""):
        return message(b"P", name.encode() + b"\0" + sql.encode() + b"\0" + struct.pack("!H", 0))

    @staticmethod
    def bind_msg(portal="", stmt="", params=()):
        body = portal.encode() + b"\0" + stmt.encode() + b"\0" + struct.pack("!H", 0)
        body += struct.pack("!H", len(params))
        for p in params:
            if p is None:
                body += struct.pack("!i", -1)
            else:
                b = str(p).encode()
                body += struct.pack("!i", len(b)) + b
        body += struct.pack("!H", 0)
        return message(b"B", body)

    @staticmethod
    def execute_msg(portal="", max_rows=0):
        return message(b"E", portal.encode() + b"\0" + struct.pack("!I", max_rows))

    @staticmethod
    def sync_msg():
        return message(b"S")


def _parse_row_description(payload):
    (n,) = struct.unpack("!H", payload[:2])
    pos = 2
    cols = []
    for _ in range(n):
        end = payload.index(b"\0", pos)
        cols.append(payload[pos:end].decode())
        pos = end + 1 + 18
    return cols


def _parse_data_row(payload):
    (n,) = struct.unpack("!H", payload[:2])
    pos = 2
    vals = []
    for _ in range(n):
        (ln,) = struct.unpack("!i", payload[pos:pos + 4])
        pos += 4
        if ln < 0:
            vals.append(None)
        else:
            vals.append(payload[pos:pos + ln].decode("utf-8", "replace"))
            pos += ln
    return vals


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

def _pg_user_ids():
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def run_as_pg(cmd, **kw):
    """subprocess.run as user postgres when we are root (PostgreSQL refuses root)."""
    if IS_ROOT:
        cmd = ["runuser", "-u", "postgres", "--"] + list(cmd)
    return subprocess.run(cmd, **kw)


class Postgres:
    """One PostgreSQL 15 cluster under base/, listening on 127.0.0.1:port."""

    def __init__(self, base):
        self.base = Path(base)
        self.datadir = self.base / "pgdata"
        self.sockdir = self.base / "pgsock"
        self.logpath = self.base / "postgres.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self.proc = None
        self.pid = None

    # -- lifecycle --
    def start(self):
        for d in (self.datadir, self.sockdir):
            d.mkdir(mode=0o700)
            if IS_ROOT:
                os.chown(d, *_pg_user_ids())
        self.logpath.touch()
        r = run_as_pg([str(PG_BIN / "initdb"), "-D", str(self.datadir), "--auth=trust",
                       "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"],
                      capture_output=True, text=True, timeout=120, cwd=str(self.base))
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        self._write_conf()
        self._write_hba()
        self._spawn()
        wait_until(self._ready, 30 * SLOW, interval=0.1, what="PostgreSQL to accept connections")
        self._setup_objects()

    def _write_conf(self):
        conf = f"""
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = '{self.sockdir}'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 32MB
timezone = '{PG_DEFAULT_TIMEZONE}'
log_timezone = 'UTC'
log_connections = on
log_disconnections = on
log_line_prefix = '%m [%p] %q%u@%d '
log_min_messages = info
"""
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(conf)

    def _write_hba(self):
        lines = ["local all all trust"]
        for addr in ("127.0.0.1/32", "::1/128"):
            for user, info in USERS.items():
                if info["server_hba"] != "trust":
                    lines.append(f"host all {user} {addr} {info['server_hba']}")
            lines.append(f"host all all {addr} trust")
        (self.datadir / "pg_hba.conf").write_text("\n".join(lines) + "\n")
        if IS_ROOT:
            os.chown(self.datadir / "pg_hba.conf", *_pg_user_ids())

    def _spawn(self):
        cmd = [str(PG_BIN / "postgres"), "-D", str(self.datadir)]
        kw = {}
        if IS_ROOT:
            uid, gid = _pg_user_ids()
            kw = {"user": uid, "group": gid, "extra_groups": []}
        self._logf = open(self.logpath, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=str(self.base),
                                     start_new_session=True, **kw)
        self.pid = self.proc.pid

    def _ready(self):
        if self.proc.poll() is not None:
            raise Fatal(f"postgres exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        with self.connect() as c:
            c.execute("select 1")
        return True

    def _setup_objects(self):
        with self.connect() as c:
            for user, info in USERS.items():
                enc = "md5" if info["server_hba"] == "md5" else "scram-sha-256"
                c.execute(f"SET password_encryption = '{enc}'")
                c.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{info['password']}'")
            for db in DATABASES:
                c.execute(f"CREATE DATABASE {db}")
        for db in DATABASES:
            with self.connect(dbname=db) as c:
                c.execute("GRANT ALL ON SCHEMA public TO PUBLIC")

    def stop(self):
        if self.proc is not None:
            # SIGINT is PostgreSQL's fast shutdown (SIGTERM would wait for clients).
            stop_pid(self.pid, signal.SIGINT, 10, self.proc)
            self.proc = None
        if getattr(self, "_logf", None):
            self._logf.close()

    # -- helpers for tests --
    def connect(self, dbname="postgres", user="postgres", password=None, **kw):
        """A direct (not pooled) connection; autocommit."""
        return psycopg.connect(host=self.host, port=self.port, dbname=dbname, user=user,
                               password=password, connect_timeout=10, sslmode="disable",
                               gssencmode="disable", autocommit=True, **kw)

    def sql(self, query, params=None, dbname="postgres"):
        """Run one statement as superuser; returns the rows (or None)."""
        with self.connect(dbname=dbname) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def backend_alive(self, pid):
        return bool(self.sql("select 1 from pg_stat_activity where pid = %s", (pid,)))

    def count_backends(self, dbname, user=None):
        q = "select count(*) from pg_stat_activity where datname = %s and backend_type = 'client backend'"
        args = [dbname]
        if user:
            q += " and usename = %s"
            args.append(user)
        return self.sql(q, args)[0][0]

    def terminate(self, pid):
        return self.sql("select pg_terminate_backend(%s)", (pid,))[0][0]

    def log(self):
        return self.logpath.read_text(errors="replace")

    def log_size(self):
        return self.logpath.stat().st_size

    def log_since(self, offset):
        with open(self.logpath, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")


# --------------------------------------------------------------------------
# lokadb
# --------------------------------------------------------------------------

def default_bin():
    return os.environ.get("LOKADB_BIN") or str((HERE / "../../lokadb").resolve())


def bouncer_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if SANITIZE:
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1"
    return env


def format_value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


class Bouncer:
    """One lokadb process and its files in `dir`.

    settings:  [lokadb] overrides (value None removes a base key)
    databases: [databases] additions/overrides (value None removes an entry)
    users:     [users] entries
    raw:       extra text appended verbatim (for config-error tests)
    """

    def __init__(self, pg, dir, settings=None, databases=None, users=None, raw=None,
                 section=None, binary=None):
        self.pg = pg
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o777)
        self.bin = binary or default_bin()
        self.port = free_port()
        self.ini = self.dir / "lokadb.ini"
        self.logpath = self.dir / "lokadb.log"
        self.stdout_path = self.dir / "stdout.txt"
        self.stderr_path = self.dir / "stderr.txt"
        self.userlist = self.dir / "userlist.txt"
        self.section = section or INI_SECTION
        self.admin_db = ADMIN_DB
        self.proc = None
        self.pid = None
        self.extra_pids = []
        self.conns = []
        self.wires = []
        self.settings = self.base_settings()
        self.databases = self.base_databases()
        self.users = {}
        self.raw = raw
        self.apply(settings, databases, users)
        self.userlist.write_text(userlist_text())
        self.write_ini()

    # -- configuration --
    def base_settings(self):
        return {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": str(self.dir),
            "logfile": str(self.logpath),
            "auth_type": "trust",
            "auth_file": str(self.userlist),
            "admin_users": "admin",
            "stats_users": "stats",
            "pool_mode": "session",
            "default_pool_size": 5,
        }

    def server(self, dbname, extra=""):
        s = f"host={self.pg.host} port={self.pg.port} dbname={dbname}"
        return s + (" " + extra if extra else "")

    def base_databases(self):
        dbs = {db: self.server(db) for db in ("p0", "p1", "p2", "p3")}
        for name, user in (("p0_trust", "trustuser"), ("p0_md5", "md5user"),
                           ("p0_scram", "scramuser"), ("p0_clear", "cleartextuser")):
            extra = f"user={user}"
            if USERS[user]["server_hba"] != "trust":
                extra += f" password={USERS[user]['password']}"
            dbs[name] = self.server("p0", extra)
        return dbs

    def apply(self, settings=None, databases=None, users=None):
        for target, upd in ((self.settings, settings), (self.databases, databases),
                            (self.users, users)):
            for k, v in (upd or {}).items():
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v

    def ini_text(self):
        out = [f"[{self.section}]"]
        out += [f"{k} = {format_value(v)}" for k, v in self.settings.items()]
        out += ["", "[databases]"]
        out += [f"{k} = {v}" for k, v in self.databases.items()]
        if self.users:
            out += ["", "[users]"]
            out += [f"{k} = {v}" for k, v in self.users.items()]
        if self.raw:
            out += ["", self.raw]
        return "\n".join(out) + "\n"

    def write_ini(self, settings=None, databases=None, users=None, raw=None):
        self.apply(settings, databases, users)
        if raw is not None:
            self.raw = raw
        self.ini.write_text(self.ini_text())

    def ini_line_of(self, needle):
        """1-based line number of the first ini line that starts with needle."""
        for i, line in enumerate(self.ini.read_text().splitlines(), 1):
            if line.startswith(needle):
                return i
        raise AssertionError(f"{needle!r} not in {self.ini}")

    # -- process --
    def command(self, args=()):
        return [self.bin, *args, str(self.ini)]

    def start(self, args=(), wait=True):
        self._out = open(self.stdout_path, "ab")
        self._err = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(self.command(args), stdout=self._out, stderr=self._err,
                                     stdin=subprocess.DEVNULL, cwd=str(self.dir),
                                     env=bouncer_env(), start_new_session=True)
        self.pid = self.proc.pid
        if wait:
            self.wait_ready()
        return self

    def run_foreground(self, args=(), timeout=10):
        """Run the binary to completion (config errors, -V, -d); returns CompletedProcess."""
        return subprocess.run(self.command(args), capture_output=True, text=True,
                              timeout=timeout * SLOW, env=bouncer_env(), cwd=str(self.dir),
                              stdin=subprocess.DEVNULL)

    def wire_tls(self):
        """How raw connections of the harness reach this lokadb: over TLS when
        client_tls_sslmode refuses plain ones (with self.tls_client_cert, a
        (cert, key) pair, for verify-ca / verify-full)."""
        mode = str(self.settings.get("client_tls_sslmode", "disable"))
        if mode not in ("require", "verify-ca", "verify-full"):
            return None
        return getattr(self, "tls_client_cert", None) or True

    def _check_ready(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise Fatal(f"lokadb exited with {self.proc.returncode} during startup:\n"
                               f"{self.stderr()[-3000:]}\n{self.log()[-3000:]}")
        res = self.admin_result("SHOW VERSION", timeout=2)
        return res.error is None and len(res.rows) >= 1

    def wait_ready(self, timeout=10):
        wait_until(self._check_ready, timeout * SLOW, interval=0.05,
                   what=f"lokadb on port {self.port} to answer SHOW VERSION")

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def send_signal(self, sig):
        os.kill(self.pid, sig)

    def reload(self):
        self.send_signal(signal.SIGHUP)

    def wait_exit(self, timeout=5):
        """True if the process ended within timeout (SLOW-scaled)."""
        return wait_pid_exit(self.pid, timeout * SLOW, self.proc)

    def stop(self, sig=signal.SIGTERM, timeout=5):
        """Stop by PID: sig, then SIGKILL after timeout. True if sig sufficed."""
        ok = stop_pid(self.pid, sig, timeout * SLOW, self.proc)
        for pid in self.extra_pids:
            stop_pid(pid, sig, timeout * SLOW)
        return ok

    def teardown(self):
        """Close what the test left open, stop the process, return sanitizer findings."""
        for w in self.wires:
            w.close()
        busy = []
        for c in self.conns:
            if c.lock.acquire(blocking=False):
                try:
                    c.close()
                except Exception:  # noqa: BLE001 -- best effort at teardown
                    pass
                finally:
                    c.lock.release()
            else:
                busy.append(c)
        if self.pid is not None:
            self.stop()
        # a daemon (-d) we never learnt the pid of still holds our port
        for pid in pids_listening_on(self.port):
            if pid != os.getpid() and pid != getattr(self.pg, "pid", None):
                stop_pid(pid, signal.SIGTERM, 5 * SLOW)
        for c in busy:
            if c.lock.acquire(timeout=5):
                c.lock.release()
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        for f in ("_out", "_err"):
            if getattr(self, f, None):
                getattr(self, f).close()
        return self.sanitizer_findings()

    def sanitizer_findings(self):
        found = []
        for name, text in (("log", self.log()), ("stderr", self.stderr())):
            for line in text.splitlines():
                if any(m in line for m in SANITIZER_MARKERS):
                    found.append(f"{name}: {line}")
        return found

    # -- files --
    def log(self):
        try:
            return self.logpath.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr(self):
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern, timeout=3):
        """Wait until the log matches the regex pattern (case-insensitive)."""
        rx = re.compile(pattern, re.I)
        return wait_until(lambda: rx.search(self.log()), timeout * SLOW, interval=0.05,
                          what=f"lokadb log to match {pattern!r}")

    # -- clients --
    def connect(self, dbname="p0", user="trustuser", password=None, autocommit=True, **kw):
        """A psycopg connection through lokadb (closed at teardown).

        sslmode/gssencmode are off so that one SSLRequest bug does not fail
        every test (test_badinput checks it); prepare_threshold=None keeps
        psycopg from preparing statements behind our back.
        """
        opts = dict(host="127.0.0.1", port=self.port, dbname=dbname, user=user,
                    password=password, connect_timeout=int(10 * SLOW), sslmode="disable",
                    gssencmode="disable", autocommit=autocommit, prepare_threshold=None)
        opts.update(kw)
        conn = psycopg.connect(**opts)
        self.conns.append(conn)
        return conn

    def wire(self, timeout=5.0):
        """A raw protocol socket to lokadb (closed at teardown)."""
        w = Wire(port=self.port, timeout=timeout, tls=self.wire_tls())
        self.wires.append(w)
        return w

    def login(self, dbname="p0", user="trustuser", password=None, params=None, timeout=5.0):
        """A raw connection that completed login; raises PgError on refusal."""
        w = self.wire(timeout)
        w.login(user, dbname, password, params)
        return w

    def login_error(self, dbname="p0", user="trustuser", password=None, params=None, timeout=5.0):
        """Try a raw login that must fail; returns the PgError."""
        w = self.wire(timeout)
        err = w.login(user, dbname, password, params, raise_error=False)
        if err is None:
            raise AssertionError(f"login of {user}@{dbname} unexpectedly succeeded")
        return err

    # -- console --
    def admin_result(self, sql, user="admin", password=None, timeout=5.0, dbname=None):
        """Run one console command over a fresh raw connection; QueryResult with
        .error set instead of raising. Bounded: raises on timeout."""
        if password is None:
            password = CONSOLE_USERS.get(user) or USERS.get(user, {}).get("password")
        with Wire(port=self.port, timeout=timeout, tls=self.wire_tls()) as w:
            err = w.login(user, dbname or self.admin_db, password, raise_error=False)
            if err is not None:
                res = QueryResult()
                res.error = err
                return res
            return w.query(sql, raise_error=False)

    def admin(self, sql, user="admin", **kw):
        """Console command -> rows (lists of text). Raises PgError on error."""
        res = self.admin_result(sql, user=user, **kw)
        if res.error is not None:
            raise res.error
        return res.rows

    def admin_dicts(self, sql, user="admin", **kw):
        res = self.admin_result(sql, user=user, **kw)
        if res.error is not None:
            raise res.error
        return [dict(zip(res.columns, r)) for r in res.rows]

    def admin_columns(self, sql, user="admin"):
        res = self.admin_result(sql, user=user)
        if res.error is not None:
            raise res.error
        return res.columns

    def show_config(self):
        return {r["key"]: r for r in self.admin_dicts("SHOW CONFIG")}

    def servers(self, database=None):
        rows = self.admin_dicts("SHOW SERVERS")
        return [r for r in rows if database is None or r.get("database") == database]

    def clients(self, database=None):
        rows = self.admin_dicts("SHOW CLIENTS")
        return [r for r in rows if database is None or r.get("database") == database]


class TempTree:
    """The session's temporary directory, reachable by user postgres."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="lokadb-it-"))
        os.chmod(self.path, 0o755)
        self._n = 0
        self._lock = threading.Lock()

    def new_dir(self, prefix):
        with self._lock:
            self._n += 1
            n = self._n
        d = self.path / f"{prefix}{n:03d}"
        d.mkdir()
        os.chmod(d, 0o777)
        return d

    def remove(self):
        if os.environ.get("LOKADB_KEEP_TMP"):
            return
        shutil.rmtree(self.path, ignore_errors=True)


# --------------------------------------------------------------------------
# assertions shared by the test files
# --------------------------------------------------------------------------

def assert_serves(b, dbname="p0", user="trustuser"):
    """lokadb is alive and a fresh client can run a query through it."""
    assert b.alive(), f"lokadb is not running:\n{b.stderr()[-2000:]}"
    with b.connect(dbname, user, password=USERS[user]["password"]) as c:
        assert c.execute("select 41 + 1").fetchone()[0] == 42


def backend_pid(conn):
    return conn.execute("select pg_backend_pid()").fetchone()[0]


def assert_reserve_pool_serves_a_second_client(b, dbname="p0"):
    """With one pool server held (pool_size 1) and reserve_pool_timeout 0.5 s,
    a second client gets a server of its own from the reserve pool after about
    that timeout."""
    holder = b.connect(dbname)
    pid = backend_pid(holder)

    def second():
        with b.connect(dbname) as c:
            return backend_pid(c)
    call = BgCall(second)
    other = call.result(5 * SLOW)
    assert other != pid
    assert 0.3 <= call.elapsed < 3 * SLOW, call.elapsed
    return holder


def assert_shutdown_waits_for(b, client):
    """A shutdown that waits for clients has begun and `client` is b's last:
    TCP is closed at once (as PgBouncer 1.23+; with so_reuseport the port's
    other processes take over), a new client on the unix socket is refused
    with 57P01, and lokadb exits once `client` leaves."""
    with pytest.raises(OSError):
        Wire(port=b.port, timeout=2.0).close()
    w = Wire(unix_path=str(b.dir / f".s.PGSQL.{b.port}"))
    b.wires.append(w)
    err = w.login("trustuser", "p0", raise_error=False)
    assert isinstance(err, PgError), "a new client was admitted during shutdown"
    assert_error(err, "57P01", "shutting down")
    assert b.alive()
    client.close()
    assert b.wait_exit(5), "lokadb did not exit after its last client left"


def read_until_error_or_close(w, timeout=5.0):
    """Messages up to the first ErrorResponse (returned as PgError) or EOF (None)."""
    msgs = []
    deadline = time.monotonic() + timeout * SLOW
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no error and no close within {timeout}s; got {msgs!r}")
        try:
            typ, payload = w.read_msg(timeout=left / SLOW)
        except EOFError:
            return None, msgs
        if typ == b"E":
            return PgError(parse_error_fields(payload)), msgs
        msgs.append((typ, payload))


def assert_error(err, sqlstates, message=None):
    """err (PgError or fields dict) has one of sqlstates and, if given, a
    message containing `message` (case-insensitive)."""
    fields = err.fields if isinstance(err, PgError) else err
    if isinstance(sqlstates, str):
        sqlstates = (sqlstates,)
    assert fields.get("C") in sqlstates, f"expected SQLSTATE {sqlstates}, got {fields}"
    if message is not None:
        assert message.lower() in fields.get("M", "").lower(), \
            f"expected message containing {message!r}, got {fields}"
