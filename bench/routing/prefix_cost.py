#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""What setting the organization costs PostgreSQL per statement, by the way
it is sent (doc/benchmarks.md, "Routing cost").

One connection straight to PostgreSQL (no pooler), trust or no password,
sends the same statement N times, each time preceded in a different way, and
reads the backend's CPU time from /proc (so PostgreSQL must run on this
machine). Prints, per case, the least and the median backend CPU microseconds
per statement over the runs.

With --protocol extended the statement goes as Parse (unnamed), Bind,
Execute, Sync, as `pgbench -M extended` sends it, and the organization as a
hidden Query of its own in front, as lokadb sends it inside a batch (its own
Parse, Bind and Execute of a SET), or as a Bind and Execute of a
`set_config` prepared once.

usage: prefix_cost.py [--host H] [--port P] [--user U] [--db D] [-n N] [--runs R]
                      [--protocol simple|extended] [STATEMENT]
"""
import argparse
import os
import socket
import struct
import sys


def msg(t, b):
    return t + struct.pack("!I", len(b) + 4) + b


def query(s):
    return msg(b"Q", s.encode() + b"\0")


def cstr(v):
    return v.encode() + b"\0"


def parse(name, sql):
    return msg(b"P", cstr(name) + cstr(sql) + b"\0\0")


def bind(portal, stmt, params=()):
    b = cstr(portal) + cstr(stmt) + b"\0\0" + struct.pack("!H", len(params))
    for v in params:
        b += struct.pack("!I", len(v)) + v.encode()
    return msg(b"B", b + b"\0\0")


def execute(portal):
    return msg(b"E", cstr(portal) + b"\0\0\0\0")


def close(kind, name):
    return msg(b"C", kind + cstr(name))


SYNC = msg(b"S", b"")


def connect(a):
    s = socket.create_connection((a.host, a.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    p = struct.pack("!I", 196608) + f"user\0{a.user}\0database\0{a.db}\0\0".encode()
    s.sendall(struct.pack("!I", len(p) + 4) + p)
    buf, pid = b"", None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("connection closed during login")
        buf += chunk
        while len(buf) >= 5:
            t, n = buf[0:1], struct.unpack("!I", buf[1:5])[0]
            if len(buf) < n + 1:
                break
            body, buf = buf[5:n + 1], buf[n + 1:]
            if t == b"R" and struct.unpack("!I", body[:4])[0] != 0:
                sys.exit("this tool needs trust authentication")
            if t == b"E":
                sys.exit(f"login failed: {body!r}")
            if t == b"K":
                pid = struct.unpack("!I", body[:4])[0]
            if t == b"Z":
                return s, pid


def run(s, payload, nrfq, n):
    for _ in range(n):
        s.sendall(payload)
        got, buf = 0, b""
        while got < nrfq:
            buf += s.recv(65536)
            while len(buf) >= 5:
                m = struct.unpack("!I", buf[1:5])[0]
                if len(buf) < m + 1:
                    break
                if buf[0:1] == b"E":
                    sys.exit(f"error: {buf[:m + 1]!r}")
                got += buf[0:1] == b"Z"
                buf = buf[m + 1:]


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5432)
    ap.add_argument("--user", default="postgres")
    ap.add_argument("--db", default="postgres")
    ap.add_argument("-n", type=int, default=20000, help="statements per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("statement", nargs="?", default="SELECT relname FROM pg_class WHERE oid = 1259")
    ap.add_argument("--protocol", choices=("simple", "extended"), default="simple")
    a = ap.parse_args()
    st = a.statement
    if a.protocol == "extended":
        cases = extended_cases(st)
    else:
        cases = simple_cases(st)
    res = {}
    for _ in range(a.runs):
        for name, (setup, payload, nrfq) in cases.items():
            s, pid = connect(a)
            if setup:
                run(s, setup[0], setup[1], 1)
            run(s, payload, nrfq, 500)
            c0 = cpu(pid)
            run(s, payload, nrfq, a.n)
            res.setdefault(name, []).append(1e6 * (cpu(pid) - c0) / a.n)
            s.close()
    print(f"backend CPU µs per statement, {a.runs} runs of {a.n}: least / median")
    for name, v in res.items():
        v.sort()
        print(f"  {v[0]:6.1f} / {v[len(v) // 2]:6.1f}  {name}")


def extended_cases(st):
    """Each iteration: (setup sent once, payload, ReadyForQuerys it gets)."""
    h = "lokadb_hidden_ext"
    alone = parse("", st) + bind("", "") + execute("") + SYNC
    set_sql = "SET lokadb.org = '42'"
    hidden = (close(b"S", h) + parse(h, set_sql) + bind(h, h) + execute(h)
              + close(b"P", h) + close(b"S", h))
    prep = parse("lokadb_set_config", "SELECT set_config($1, $2, false)") + SYNC
    prepared = bind(h, "lokadb_set_config", ("lokadb.org", "42")) + execute(h) + close(b"P", h)
    return {
        "the statement alone": (None, alone, 1),
        "the SET as a Query of its own (lokadb 1.8 at the start of a batch), then the statement":
            (None, query(set_sql) + alone, 2),
        "Parse, Bind, Execute of the SET (lokadb inside a batch; 1.9 also at its start), then the statement":
            (None, hidden + alone, 1),
        "Bind, Execute of a prepared set_config, then the statement": ((prep, 1), prepared + alone, 1),
        "the same, a generic plan forced":
            ((query("SET plan_cache_mode = force_generic_plan") + prep, 2), prepared + alone, 1),
        "the same, custom plans forced":
            ((query("SET plan_cache_mode = force_custom_plan") + prep, 2), prepared + alone, 1),
    }


def simple_cases(st):
    org = "SELECT set_config('lokadb.org', '42', false)"
    both = org + ", set_config('plan_cache_mode', 'force_custom_plan', false)"
    return {
        "the statement alone": (None, query(st), 1),
        "SELECT set_config(org) as a Query of its own, then the statement": (None, query(org) + query(st), 2),
        "SELECT set_config(org), set_config(plan_cache_mode), then the statement": (None, query(both) + query(st), 2),
        "SET org as a Query of its own, then the statement": (None, query("SET lokadb.org = '42'") + query(st), 2),
        "SELECT set_config(org); statement (one Query)": (None, query(org + "; " + st), 1),
        "SET org; statement (one Query)": (None, query("SET lokadb.org = '42'; " + st), 1),
        "SET org; SET plan_cache_mode; statement (one Query)":
            (None, query("SET lokadb.org = '42'; SET plan_cache_mode = 'force_custom_plan'; " + st), 1),
    }


if __name__ == "__main__":
    main()
