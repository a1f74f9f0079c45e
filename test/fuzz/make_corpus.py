#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""Write the seed corpora of the libFuzzer targets.

    python3 test/fuzz/make_corpus.py        (from anywhere)

Every seed starts with the selector byte the targets read first:
  bits 0-2  chunking of the writes (0 = one write, 1 = one byte per write, ...)
  fuzz_startup:  bits 3-4 auth_type (0 trust, 1 md5, 2 scram-sha-256, 3 plain)
  fuzz_messages: bit 3 = log in as the stats-only user
  fuzz_mux:      bit 3 role (0 agent, 1 relay), bit 4 small settings,
                 bit 5 no credit returned, bit 6 reset every third data event
fuzz_startup seeds are the whole client stream; fuzz_messages seeds are what
follows the startup packet the target sends itself (console `lokadb`).
Existing files of the same names are overwritten; others are left alone.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

PROTO_V3 = 196608
SSL_CODE = 80877103
GSSENC_CODE = 80877104
CANCEL_CODE = 80877102

CHUNK_ALL, CHUNK_1 = 0, 1
TRUST, MD5, SCRAM, PLAIN = 0 << 3, 1 << 3, 2 << 3, 3 << 3
STATS = 1 << 3


def startup(params, version=PROTO_V3):
    body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params) + b"\0"
    return struct.pack("!II", 8 + len(body), version) + body


def msg(kind, body=b""):
    return kind.encode() + struct.pack("!I", 4 + len(body)) + body


def query(sql):
    return msg("Q", sql.encode() + b"\0")


def login(user="alice", database="db"):
    return startup([("user", user), ("database", database)])


def sasl_initial(data, mech=b"SCRAM-SHA-256"):
    return msg("p", mech + b"\0" + struct.pack("!i", len(data)) + data)


STARTUP = {
    "valid_db": bytes([CHUNK_ALL]) + login(),
    "valid_console": bytes([CHUNK_ALL]) + login("admin", "lokadb") + query("SHOW VERSION") + msg("X"),
    "valid_stats_onebyte": bytes([CHUNK_1]) + login("stats", "pgbouncer") + query("SHOW POOLS"),
    "ssl_then_startup": bytes([CHUNK_ALL]) + struct.pack("!II", 8, SSL_CODE) + login(),
    "gssenc_then_startup": bytes([2]) + struct.pack("!II", 8, GSSENC_CODE) + login("admin", "lokadb"),
    "ssl_bad_length": bytes([CHUNK_ALL]) + struct.pack("!II", 12, SSL_CODE) + b"\0" * 4,
    "cancel": bytes([CHUNK_ALL]) + struct.pack("!II", 16, CANCEL_CODE) + b"\x01\x02\x03\x04\x05\x06\x07\x08",
    "cancel_bad_length": bytes([CHUNK_ALL]) + struct.pack("!II", 12, CANCEL_CODE) + b"\0" * 4,
    "bad_version": bytes([CHUNK_ALL]) + startup([("user", "alice")], version=2 << 16),
    "minor_version_pq": bytes([CHUNK_ALL]) + startup(
        [("user", "alice"), ("database", "db"), ("_pq_.compression", "on")], version=PROTO_V3 | 2),
    "truncated": bytes([CHUNK_ALL]) + login()[:13],
    "short_length": bytes([CHUNK_ALL]) + struct.pack("!I", 4),
    "oversized_length": bytes([CHUNK_ALL]) + struct.pack("!II", 0x7FFFFFFF, PROTO_V3) + b"user\0",
    "no_terminator": bytes([CHUNK_ALL]) + login()[:-1],
    "no_user": bytes([CHUNK_ALL]) + startup([("database", "db")]),
    "unknown_db": bytes([CHUNK_ALL]) + login("alice", "nosuchdb"),
    "unknown_param": bytes([CHUNK_ALL]) + startup([("user", "alice"), ("frobnicate", "1")]),
    "ignored_param": bytes([CHUNK_ALL]) + startup([("user", "alice"), ("extra_float_digits", "3")]),
    "replication": bytes([CHUNK_ALL]) + startup([("user", "alice"), ("replication", "true")]),
    "options": bytes([CHUNK_ALL]) + startup([
        ("user", "admin"), ("database", "lokadb"), ("application_name", "seed"),
        ("options", "-c DateStyle=ISO --TimeZone=UTC -cclient_encoding=UTF8"),
        ("IntervalStyle", "iso_8601")]),
    "bad_options": bytes([CHUNK_ALL]) + startup([("user", "alice"), ("options", "-c work_mem=1MB")]),
    "md5": bytes([MD5]) + login("md5user") + msg("p", b"md5" + b"0" * 32 + b"\0"),
    "plain": bytes([PLAIN]) + login("alice") + msg("p", b"secret\0"),
    "plain_console": bytes([PLAIN | 3]) + login("admin", "lokadb") + msg("p", b"secret\0") + query("SHOW LISTS"),
    "password_not_p": bytes([MD5]) + login("md5user") + query("SELECT 1"),
    "scram_first": bytes([SCRAM]) + login("scramuser") + sasl_initial(b"n,,n=,r=fuzzclientnonce0123456789"),
    "scram_final": bytes([SCRAM]) + login("scramuser") + sasl_initial(b"n,,n=,r=abc")
    + msg("p", b"c=biws,r=abcxyz,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    "scram_bad_mech": bytes([SCRAM]) + login("scramuser") + sasl_initial(b"x", mech=b"SCRAM-SHA-1"),
}

MESSAGES = {
    "show_version": bytes([CHUNK_ALL]) + query("SHOW VERSION"),
    "show_pools": bytes([CHUNK_ALL]) + query("SHOW POOLS"),
    "show_all": bytes([CHUNK_ALL]) + b"".join(query("show %s;" % v) for v in (
        "help", "state", "config", "clients", "servers", "stats", "databases", "users", "lists", "nosuch")),
    "show_onebyte": bytes([CHUNK_1]) + query("SHOW CLIENTS") + query("SHOW"),
    "set": bytes([CHUNK_ALL]) + query("SET x = 1"),
    "set_settings": bytes([3]) + query("SET max_client_conn = 100") + query("set default_pool_size=5;")
    + query("SET query_timeout = '1.5s'") + query("SET max_message_bytes = 64kB") + query("SHOW CONFIG"),
    "set_quoted": bytes([CHUNK_ALL]) + query("SET server_reset_query = 'DISCARD ''ALL'''")
    + query('SET "ignore_startup_parameters" = "a,b"'),
    "bad_quote": bytes([CHUNK_ALL]) + query("SET a = 'x"),
    "too_many_words": bytes([CHUNK_ALL]) + query("a b c d e f g h i j"),
    "control": bytes([CHUNK_ALL]) + b"".join(query(q) for q in (
        "PAUSE db", "RESUME db", "PAUSE", "RESUME", "RECONNECT", "RECONNECT db", "KILL db", "KILL nosuch",
        "RELOAD", "SHUTDOWN")),
    "stats_user": bytes([STATS]) + query("SET x = 1") + query("SHOW STATS") + query("RELOAD"),
    # (left suspended: the harness resumes before the next input's login)
    "suspend": bytes([CHUNK_ALL]) + query("SUSPEND") + query("SHOW STATE"),
    "empty_query": bytes([CHUNK_ALL]) + query("") + query(";;  ;"),
    "extended": bytes([CHUNK_ALL]) + msg("P", b"\0SELECT 1\0\0\0") + msg("B", b"\0\0" + b"\0" * 6)
    + msg("E", b"\0\0\0\0\0") + msg("S"),
    "terminate": bytes([CHUNK_ALL]) + query("SHOW VERSION") + msg("X"),
    "unknown_type": bytes([CHUNK_ALL]) + msg("y", b"junk"),
    "short_length": bytes([CHUNK_ALL]) + b"Q\0\0\0\x03",
    "oversized": bytes([CHUNK_ALL]) + b"Q\x7f\xff\xff\xff" + b"SHOW",
    "no_nul": bytes([CHUNK_ALL]) + msg("Q", b"SHOW VERSION"),
    "embedded_nul": bytes([CHUNK_ALL]) + msg("Q", b"SHOW\0VERSION\0"),
    "split_header": bytes([4]) + query("SHOW USERS") * 3,
}


# ---- fuzz_mux: the tunnel multiplexer (doc/tunnel.md) ----
MUX_PREFACE = b"LKTN\x00\x01\r\n"
M_DATA, M_WU, M_OPEN, M_OPEN_ACK, M_RST, M_PING, M_GOAWAY, M_HELLO, M_HELLO_ACK = range(9)
AS_AGENT, AS_RELAY, SMALL, NO_CONSUME, RESETS = 0, 1 << 3, 1 << 4, 1 << 5, 1 << 6


def mframe(typ, sid=0, payload=b"", flags=0):
    return struct.pack("!BBHII", typ, flags, 0, sid, len(payload)) + payload


def tlv(typ, value):
    return struct.pack("!HH", typ, len(value)) + value


def hello(vmin=1, vmax=1, proof=b"proof"):
    return mframe(M_HELLO, 0, tlv(1, struct.pack("!H", vmin)) + tlv(2, struct.pack("!H", vmax))
                  + tlv(4, b"site-1") + tlv(5, proof) + tlv(8, struct.pack("!I", 65536)))


def hello_ack():
    return mframe(M_HELLO_ACK, 0, tlv(3, struct.pack("!H", 1)) + tlv(6, bytes(16))
                  + tlv(7, struct.pack("!Q", 1700000000000)) + tlv(10, struct.pack("!I", 16384)))


def mopen(sid, key=b"app", window=None):
    p = tlv(17, key) + tlv(16, bytes(range(16))) + tlv(18, b"fdw-1")
    if window:
        p += tlv(8, struct.pack("!I", window))
    return mframe(M_OPEN, sid, p)


def mdata(sid, data, fin=False):
    return mframe(M_DATA, sid, data, 1 if fin else 0)


def mu32(typ, sid, v):
    return mframe(typ, sid, struct.pack("!I", v))


def mping(ack=False):
    return mframe(M_PING, 0, b"12345678", 1 if ack else 0)


def mgoaway(last, code, debug=b""):
    return mframe(M_GOAWAY, 0, struct.pack("!III", last, code, 0) + debug)


AGENT_STREAM = (hello_ack() + mopen(1) + mdata(1, b"Q" * 5000) + mu32(M_WU, 0, 100000)
                + mu32(M_WU, 1, 5000) + mdata(1, b"", fin=True) + mping() + mping(ack=True))
RELAY_STREAM = (MUX_PREFACE + hello() + mframe(M_OPEN_ACK, 1) + mdata(1, b"R" * 3000)
                + mframe(M_OPEN_ACK, 3, tlv(8, struct.pack("!I", 1 << 21))) + mu32(M_WU, 3, 70000)
                + mu32(M_RST, 5, 5) + mdata(1, b"", fin=True) + mping() + mgoaway(3, 0, b"agent restart"))

MUX = {
    "agent_handshake": bytes([AS_AGENT]) + hello_ack(),
    "agent_stream": bytes([AS_AGENT]) + AGENT_STREAM,
    "agent_stream_onebyte": bytes([AS_AGENT | 1]) + AGENT_STREAM,
    "agent_stream_small": bytes([AS_AGENT | SMALL | NO_CONSUME | 4]) + AGENT_STREAM,
    "agent_resets": bytes([AS_AGENT | RESETS | 3]) + hello_ack() + mopen(1) + b"".join(
        mdata(1, bytes([i]) * 700) for i in range(8)) + mopen(3, b"big") + mdata(3, b"z" * 9000),
    "agent_pending_connect": bytes([AS_AGENT]) + hello_ack() + mopen(1, b"wait") + mdata(1, b"early")
    + mu32(M_RST, 1, 5) + mdata(1, b"late"),
    "agent_refused": bytes([AS_AGENT]) + hello_ack() + mopen(1, b"xnosuch") + mdata(1, b"dropped")
    + mu32(M_RST, 1, 5) + mopen(3, b"app", window=1 << 20),
    "agent_goaway": bytes([AS_AGENT]) + hello_ack() + mopen(1) + mgoaway(0, 9, b"drain")
    + mopen(3) + mgoaway(0, 9),
    "agent_id_reuse": bytes([AS_AGENT]) + hello_ack() + mopen(3) + mopen(1),
    "agent_window_breach": bytes([AS_AGENT | SMALL | NO_CONSUME]) + hello_ack() + mopen(1) + mdata(1, b"a" * 1024)
    + mdata(1, b"b" * 1024),
    "agent_unknown_type": bytes([AS_AGENT]) + hello_ack() + mframe(0x42, 7, b"?" * 40, 0xff) + mping(),
    "agent_goaway_first": bytes([AS_AGENT]) + mgoaway(0, 6, b"bad token"),
    "agent_bad_header": bytes([AS_AGENT]) + hello_ack() + struct.pack("!BBHII", M_DATA, 0, 1, 1, 0x7fffffff),
    "relay_handshake": bytes([AS_RELAY]) + MUX_PREFACE + hello(),
    "relay_stream": bytes([AS_RELAY]) + RELAY_STREAM,
    "relay_stream_split": bytes([AS_RELAY | 2]) + RELAY_STREAM,
    "relay_stream_small": bytes([AS_RELAY | SMALL | NO_CONSUME | 5]) + RELAY_STREAM,
    "relay_bad_proof": bytes([AS_RELAY]) + MUX_PREFACE + hello(proof=b"\x00") + mping(),
    "relay_bad_preface": bytes([AS_RELAY]) + b"GET / HTTP/1.1\r\n\r\n",
    "relay_no_common_version": bytes([AS_RELAY]) + MUX_PREFACE + hello(2, 3),
    "relay_newer_agent": bytes([AS_RELAY]) + MUX_PREFACE + hello(1, 7) + mframe(M_OPEN_ACK, 1),
    "relay_open_from_agent": bytes([AS_RELAY]) + MUX_PREFACE + hello() + mopen(1),
    "relay_ping_flood": bytes([AS_RELAY]) + MUX_PREFACE + hello() + mping() * 200,
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in sorted(seeds.items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("%s: %d seeds in %s" % (target, len(seeds), os.path.relpath(d)))


if __name__ == "__main__":
    write("fuzz_startup", STARTUP)
    write("fuzz_messages", MESSAGES)
    write("fuzz_mux", MUX)
