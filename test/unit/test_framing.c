/* SPDX-License-Identifier: ISC */
/*
 * test_framing.c -- unit tests of the client side of the wire protocol
 * (src/client.c, src/pktbuf.c): startup packet, SSLRequest/GSSENCRequest,
 * CancelRequest, trust login into the console, message framing after login,
 * and the bytes the pktbuf helpers build.
 *
 * Each connection case drives the real client code over a socketpair: the
 * pooler's end goes to client_accept(), the test writes protocol bytes into
 * the other end, turns the event loop and compares what came back byte for
 * byte. Expected messages are spelled out here by hand (struct want), not
 * built with pktbuf, so a pktbuf bug cannot hide itself.
 *
 * One runtime serves every case (rt_up()): config_defaults() with
 * auth_type trust, console users `admin` (admin) and `stats` (stats only),
 * max_message_bytes at its minimum (1024) and no databases; the events of
 * runtime_setup_events() without listeners, timers or signals. A case opens
 * its connection with peer_open() and at `end:` closes it with peer_close(),
 * which also waits until the client has been freed.
 */
#include "core.h"
#include "unit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_MESSAGE_BYTES 1024		/* MSG_MIN in config.c: the lowest allowed */
#define QUIET_TURNS 4			/* loop turns without input that end a pump */
#define MAX_TURNS 1000			/* pump/close give up after this many turns */
#define WANT_MAX 2048

/* ------------------------------------------------------------------------- */
/* runtime and connection fixture */

static bool rt_ready;

static bool rt_up(void)
{
	char err[256];

	if (rt_ready)
		return true;
	runtime_init();
	rt->quiet = true;
	rt->cf = config_defaults();
	if (!rt->cf || !config_set(rt->cf, "auth_type", "trust", err, sizeof(err)) ||
	    !config_set(rt->cf, "admin_users", "admin", err, sizeof(err)) ||
	    !config_set(rt->cf, "stats_users", "stats", err, sizeof(err)) ||
	    !config_set(rt->cf, "max_message_bytes", "1024", err, sizeof(err)))
		return false;
	runtime_apply_log_settings();
	if (!runtime_setup_events())
		return false;
	runtime_stop_background_events();
	rt_ready = true;
	return true;
}

struct peer {
	int fd;			/* the test's end, non-blocking; -1 when closed */
	uint8_t in[65536];	/* what the pooler sent and the case has not taken */
	size_t len;
	bool eof;		/* the pooler closed the connection */
};

static bool peer_open(struct peer *pe)
{
	int sv[2];

	memset(pe, 0, sizeof(*pe));
	pe->fd = -1;
	if (!rt_up() || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return false;
	fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
	pe->fd = sv[1];
	client_accept(sv[0], NULL, 0, true);
	return rt->n_clients == 1;
}

/* Read what is there; returns the number of bytes read. */
static size_t peer_read(struct peer *pe)
{
	size_t total = 0;

	while (!pe->eof && pe->len < sizeof(pe->in)) {
		ssize_t n = read(pe->fd, pe->in + pe->len, sizeof(pe->in) - pe->len);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			pe->eof = true;
		if (n <= 0)
			break;
		pe->len += (size_t)n;
		total += (size_t)n;
	}
	return total;
}

/* Turn the loop until QUIET_TURNS turns in a row bring nothing. */
static void peer_pump(struct peer *pe)
{
	int quiet = 0;

	for (int i = 0; i < MAX_TURNS && quiet < QUIET_TURNS; i++) {
		event_base_loop(rt->base, EVLOOP_NONBLOCK);
		quiet = peer_read(pe) ? 0 : quiet + 1;
	}
}

static bool peer_send(struct peer *pe, const void *p, size_t n)
{
	bool ok = send(pe->fd, p, n, MSG_NOSIGNAL) == (ssize_t)n;

	peer_pump(pe);
	return ok;
}

/* Each byte in a write of its own, with the loop turned in between. */
static bool peer_send_bytewise(struct peer *pe, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!peer_send(pe, (const uint8_t *)p + i, 1))
			return false;
	return true;
}

/* Close our end and turn the loop until the client has been freed. */
static bool peer_close(struct peer *pe)
{
	int i;

	if (pe->fd >= 0)
		close(pe->fd);
	pe->fd = -1;
	for (i = 0; i < MAX_TURNS && (rt->n_clients || !TAILQ_EMPTY(&rt->justfree_clients)); i++)
		event_base_loop(rt->base, EVLOOP_NONBLOCK);
	return rt->n_clients == 0 && TAILQ_EMPTY(&rt->justfree_clients);
}

/* Take the next `n` bytes the pooler sent if they are exactly `p`. */
static bool peer_take(struct peer *pe, const void *p, size_t n)
{
	const uint8_t *want = p;
	size_t i;

	for (i = 0; i < n && i < pe->len && pe->in[i] == want[i]; i++)
		;
	if (i < n) {
		fprintf(stderr, "  expected %zu bytes, have %zu; first difference at byte %zu: 0x%02x, expected 0x%02x\n",
			n, pe->len, i, i < pe->len ? pe->in[i] : 0, want[i]);
		return false;
	}
	memmove(pe->in, pe->in + n, pe->len - n);
	pe->len -= n;
	return true;
}

/* Take the next message if its type is `type`; its body is copied out. */
static bool peer_take_msg(struct peer *pe, char type, uint8_t *body, size_t cap, size_t *blen)
{
	uint32_t len;

	if (pe->len < 5 || pe->in[0] != (uint8_t)type)
		return false;
	len = pkt_get_u32(pe->in + 1);
	if (len < 4 || pe->len < (size_t)len + 1 || len - 4 > cap)
		return false;
	memcpy(body, pe->in + 5, len - 4);
	*blen = len - 4;
	memmove(pe->in, pe->in + len + 1, pe->len - len - 1);
	pe->len -= len + 1;
	return true;
}

/* ------------------------------------------------------------------------- */
/* expected bytes, written out by hand */

struct want {
	uint8_t b[WANT_MAX];
	size_t len;
	size_t start;		/* first byte of the open message */
	bool typed;		/* the open message has a type byte */
};

static void w_bytes(struct want *w, const void *p, size_t n)
{
	if (w->len + n <= sizeof(w->b))
		memcpy(w->b + w->len, p, n);
	w->len += n;
}

static void w_str(struct want *w, const char *s)
{
	w_bytes(w, s, strlen(s) + 1);
}

static void w_u32(struct want *w, uint32_t v)
{
	uint8_t b[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };
	w_bytes(w, b, 4);
}

static void w_u16(struct want *w, uint16_t v)
{
	uint8_t b[2] = { (uint8_t)(v >> 8), (uint8_t)v };
	w_bytes(w, b, 2);
}

static void w_begin(struct want *w, char type)
{
	w->start = w->len;
	w->typed = type != 0;
	if (type)
		w_bytes(w, &type, 1);
	w_u32(w, 0);
}

static void w_end(struct want *w)
{
	size_t at = w->start + (w->typed ? 1 : 0);
	uint32_t n = (uint32_t)(w->len - at);

	w->b[at] = (uint8_t)(n >> 24);
	w->b[at + 1] = (uint8_t)(n >> 16);
	w->b[at + 2] = (uint8_t)(n >> 8);
	w->b[at + 3] = (uint8_t)n;
}

/* An ErrorResponse as client_close()/admin fail() send it. */
static void w_error(struct want *w, const char *severity, const char *sqlstate, const char *msg)
{
	w_begin(w, 'E');
	w_bytes(w, "S", 1);
	w_str(w, severity);
	w_bytes(w, "V", 1);
	w_str(w, severity);
	w_bytes(w, "C", 1);
	w_str(w, sqlstate);
	w_bytes(w, "M", 1);
	w_str(w, msg);
	w_bytes(w, "", 1);
	w_end(w);
}

static void w_ready(struct want *w, char status)
{
	w_begin(w, 'Z');
	w_bytes(w, &status, 1);
	w_end(w);
}

/* A StartupMessage (no type byte) from NULL-terminated key, value pairs. */
static void w_startup(struct want *w, uint32_t version, const char *const *kv)
{
	w_begin(w, 0);
	w_u32(w, version);
	for (; *kv; kv++)
		w_str(w, *kv);
	w_bytes(w, "", 1);
	w_end(w);
}

static void w_query(struct want *w, const char *sql)
{
	w_begin(w, 'Q');
	w_str(w, sql);
	w_end(w);
}

/* The FATAL error a refused connection gets, then the close. */
static bool peer_refused(struct peer *pe, const char *sqlstate, const char *msg)
{
	struct want w = { .len = 0 };

	w_error(&w, "FATAL", sqlstate, msg);
	return peer_take(pe, w.b, w.len) && pe->len == 0 && pe->eof;
}

/* Send `w` and expect the refusal. */
static bool refused_after(const struct want *w, const char *sqlstate, const char *msg)
{
	struct peer pe;
	bool ok = true;

	CHECK(peer_open(&pe));
	CHECK(peer_send(&pe, w->b, w->len));
	CHECK(peer_refused(&pe, sqlstate, msg));
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

static const char *const console_admin[] = { "user", "admin", "database", "lokadb", NULL };

/*
 * The console's welcome: AuthenticationOk, the fixed ParameterStatus list of
 * client_welcome() for a client without a pool, BackendKeyData, ReadyForQuery.
 */
static bool take_welcome(struct peer *pe)
{
	static const char *const params[][2] = {
		{ "server_version", "15.0 (lokadb " LOKADB_VERSION ")" },
		{ "server_encoding", "UTF8" },
		{ "client_encoding", "UTF8" },
		{ "DateStyle", "ISO, MDY" },
		{ "standard_conforming_strings", "on" },
		{ "integer_datetimes", "on" },
		{ "TimeZone", "UTC" },
		{ "is_superuser", "off" },
	};
	static const uint8_t auth_ok[] = { 'R', 0, 0, 0, 8, 0, 0, 0, 0 };
	struct want w = { .len = 0 };
	uint8_t key[64];
	size_t klen;

	w_bytes(&w, auth_ok, sizeof(auth_ok));
	for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++) {
		w_begin(&w, 'S');
		w_str(&w, params[i][0]);
		w_str(&w, params[i][1]);
		w_end(&w);
	}
	if (!peer_take(pe, w.b, w.len))
		return false;
	if (!peer_take_msg(pe, 'K', key, sizeof(key), &klen) || klen != 8)
		return false;
	w.len = 0;
	w_ready(&w, 'I');
	return peer_take(pe, w.b, w.len);
}

/* Open a connection and log in to the console as `user`. */
static bool console_login(struct peer *pe, const char *user)
{
	const char *const kv[] = { "user", user, "database", "lokadb", NULL };
	struct want w = { .len = 0 };

	if (!peer_open(pe))
		return false;
	w_startup(&w, PROTO_V3, kv);
	return peer_send(pe, w.b, w.len) && take_welcome(pe) && pe->len == 0 && !pe->eof;
}

/* Log in to the console as admin, send `len` bytes of msg and expect the refusal. */
static bool console_refused_after(const void *msg, size_t len, const char *sqlstate, const char *text)
{
	struct peer pe;
	bool ok = true;

	CHECK(console_login(&pe, "admin"));
	CHECK(peer_send(&pe, msg, len));
	CHECK(peer_refused(&pe, sqlstate, text));
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* The answer to SHOW VERSION: one text column, one row, SHOW, ReadyForQuery. */
static void w_show_version(struct want *w)
{
	static const char version[] = "lokadb " LOKADB_VERSION;

	w_begin(w, 'T');
	w_u16(w, 1);
	w_str(w, "version");
	w_u32(w, 0);			/* table oid */
	w_u16(w, 0);			/* column number */
	w_u32(w, 25);			/* text */
	w_u16(w, 0xffff);		/* typlen -1 */
	w_u32(w, 0xffffffff);		/* typmod -1 */
	w_u16(w, 0);			/* text format */
	w_end(w);
	w_begin(w, 'D');
	w_u16(w, 1);
	w_u32(w, (uint32_t)strlen(version));
	w_bytes(w, version, strlen(version));
	w_end(w);
	w_begin(w, 'C');
	w_str(w, "SHOW");
	w_end(w);
	w_ready(w, 'I');
}

/* ------------------------------------------------------------------------- */
/* startup */

static bool test_ssl_request(void)
{
	static const uint8_t ssl[] = { 0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f };
	struct want w = { .len = 0 };
	struct peer pe;
	bool ok = true;

	CHECK(peer_open(&pe));
	CHECK(peer_send(&pe, ssl, sizeof(ssl)));
	CHECK(peer_take(&pe, "N", 1));
	CHECK(pe.len == 0 && !pe.eof);
	w_startup(&w, PROTO_V3, console_admin);
	CHECK(peer_send(&pe, w.b, w.len));
	CHECK(take_welcome(&pe));
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

static bool test_gssenc_request(void)
{
	static const uint8_t gss[] = { 0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30 };
	struct peer pe;
	bool ok = true;

	CHECK(peer_open(&pe));
	CHECK(peer_send(&pe, gss, sizeof(gss)));
	CHECK(peer_take(&pe, "N", 1));
	CHECK(pe.len == 0 && !pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

static bool test_startup_too_short(void)
{
	static const uint8_t len7[] = { 0, 0, 0, 7 };
	struct want w = { .len = 0 };

	w_bytes(&w, len7, sizeof(len7));
	return refused_after(&w, "08P01", "invalid length of startup packet");
}

static bool test_startup_length_4(void)
{
	struct want w = { .len = 0 };

	w_u32(&w, 4);
	w_u32(&w, PROTO_V3);
	return refused_after(&w, "08P01", "invalid length of startup packet");
}

static bool test_startup_too_long(void)
{
	struct want w = { .len = 0 };

	w_u32(&w, STARTUP_MAX_LEN + 1);
	w_u32(&w, PROTO_V3);
	return refused_after(&w, "08P01", "invalid length of startup packet");
}

static bool test_protocol_2(void)
{
	static const char *const kv[] = { "user", "alice", NULL };
	struct want w = { .len = 0 };

	w_startup(&w, 2 << 16, kv);
	return refused_after(&w, "0A000", "unsupported frontend protocol 2.0: server supports 3.0 to 3.0");
}

static bool test_missing_user(void)
{
	static const char *const kv[] = { "database", "lokadb", NULL };
	struct want w = { .len = 0 };

	w_startup(&w, PROTO_V3, kv);
	return refused_after(&w, "28000", "no PostgreSQL user name specified in startup packet");
}

static bool test_unknown_database(void)
{
	static const char *const kv[] = { "user", "alice", "database", "nosuchdb", NULL };
	struct want w = { .len = 0 };

	w_startup(&w, PROTO_V3, kv);
	return refused_after(&w, "3D000", "no such database: nosuchdb");
}

static bool test_cancel_request_closes(void)
{
	struct want w = { .len = 0 };
	struct peer pe;
	bool ok = true;

	w_u32(&w, 16);
	w_u32(&w, PROTO_CANCEL_CODE);
	w_bytes(&w, "\1\2\3\4\5\6\7\10", 8);
	CHECK(peer_open(&pe));
	CHECK(peer_send(&pe, w.b, w.len));
	CHECK(pe.len == 0 && pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* ------------------------------------------------------------------------- */
/* console login and message framing */

static bool test_console_welcome(void)
{
	struct peer pe;
	bool ok = true;

	CHECK(console_login(&pe, "admin"));
	CHECK(TAILQ_FIRST(&rt->admin_clients) && TAILQ_FIRST(&rt->admin_clients)->admin_full);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

static bool test_show_version(void)
{
	struct want q = { .len = 0 }, r = { .len = 0 };
	struct peer pe;
	bool ok = true;

	CHECK(console_login(&pe, "admin"));
	w_query(&q, "SHOW VERSION");
	w_show_version(&r);
	CHECK(peer_send(&pe, q.b, q.len));
	CHECK(peer_take(&pe, r.b, r.len));
	CHECK(pe.len == 0 && !pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

static bool test_unknown_message_type(void)
{
	static const uint8_t msg[] = { 'y', 0, 0, 0, 4 };

	return console_refused_after(msg, sizeof(msg), "08P01", "invalid frontend message type 121");
}

static bool test_message_length_below_4(void)
{
	static const uint8_t msg[] = { 'Q', 0, 0, 0, 3 };

	return console_refused_after(msg, sizeof(msg), "08P01", "invalid message length");
}

/* Refused on the header alone: the body never has to arrive. */
static bool test_message_too_long(void)
{
	char text[128];
	struct want q = { .len = 0 };

	q.b[0] = 'Q';
	q.len = 1;
	w_u32(&q, MAX_MESSAGE_BYTES + 1);
	snprintf(text, sizeof(text), "message too long: %d bytes (max_message_bytes is %d)", MAX_MESSAGE_BYTES + 1,
		 MAX_MESSAGE_BYTES);
	return console_refused_after(q.b, q.len, "08P01", text);
}

static bool test_console_extended_protocol(void)
{
	struct want p = { .len = 0 };

	w_begin(&p, 'P');
	w_str(&p, "");
	w_str(&p, "SHOW VERSION");
	w_u16(&p, 0);
	w_end(&p);
	return console_refused_after(p.b, p.len, "08P01", "the console supports only the simple query protocol");
}

static bool test_query_without_terminator(void)
{
	struct want q = { .len = 0 };

	w_begin(&q, 'Q');
	w_bytes(&q, "SHOW VERSION", 12);
	w_end(&q);
	return console_refused_after(q.b, q.len, "08P01", "invalid query message");
}

static bool test_terminate(void)
{
	static const uint8_t term[] = { 'X', 0, 0, 0, 4 };
	struct peer pe;
	bool ok = true;

	CHECK(console_login(&pe, "admin"));
	CHECK(peer_send(&pe, term, sizeof(term)));
	CHECK(pe.len == 0 && pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* Startup and query each arrive one byte per read. */
static bool test_bytewise_writes(void)
{
	struct want s = { .len = 0 }, q = { .len = 0 }, r = { .len = 0 };
	struct peer pe;
	bool ok = true;

	w_startup(&s, PROTO_V3, console_admin);
	w_query(&q, "SHOW VERSION");
	w_show_version(&r);
	CHECK(peer_open(&pe));
	CHECK(peer_send_bytewise(&pe, s.b, s.len));
	CHECK(take_welcome(&pe));
	CHECK(peer_send_bytewise(&pe, q.b, q.len - 1));
	CHECK(pe.len == 0);
	CHECK(peer_send(&pe, q.b + q.len - 1, 1));
	CHECK(peer_take(&pe, r.b, r.len));
	CHECK(pe.len == 0 && !pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* Two queries in one write get two answers, in order. */
static bool test_pipelined_queries(void)
{
	struct want q = { .len = 0 }, r = { .len = 0 };
	struct peer pe;
	bool ok = true;

	w_query(&q, "SHOW VERSION");
	w_query(&q, "show version;");
	w_show_version(&r);
	w_show_version(&r);
	CHECK(console_login(&pe, "admin"));
	CHECK(peer_send(&pe, q.b, q.len));
	CHECK(peer_take(&pe, r.b, r.len));
	CHECK(pe.len == 0 && !pe.eof);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* A stats user reaches the parser; SET answers ERROR and the session goes on. */
static bool test_stats_user_set_refused(void)
{
	struct want q = { .len = 0 }, r = { .len = 0 };
	struct peer pe;
	bool ok = true;

	w_query(&q, "SET verbose = 1");
	w_error(&r, "ERROR", "42501", "admin access needed");
	w_ready(&r, 'I');
	CHECK(console_login(&pe, "stats"));
	CHECK(peer_send(&pe, q.b, q.len));
	CHECK(peer_take(&pe, r.b, r.len));
	CHECK(pe.len == 0 && !pe.eof);
	CHECK(rt->cf->verbose == 0);
end:
	ok = peer_close(&pe) && ok;
	return ok;
}

/* ------------------------------------------------------------------------- */
/* pktbuf */

static bool pb_is(struct pktbuf *pb, const uint8_t *want, size_t n)
{
	bool same = !pb->failed && pb->len == n && memcmp(pb->data, want, n) == 0;

	if (!same)
		fprintf(stderr, "  pktbuf holds %zu bytes, expected %zu\n", pb->len, n);
	return same;
}

static bool test_pkt_error(void)
{
	static const uint8_t want[] = {
		'E', 0, 0, 0, 44,
		'S', 'F', 'A', 'T', 'A', 'L', 0,
		'V', 'F', 'A', 'T', 'A', 'L', 0,
		'C', '0', '8', 'P', '0', '1', 0,
		'M', 'b', 'a', 'd', 0,
		'D', 'T', 'h', 'e', ' ', 'd', 'e', 't', 'a', 'i', 'l', '.', 0,
		0,
	};
	static const uint8_t want_nodetail[] = {
		'E', 0, 0, 0, 29,
		'S', 'E', 'R', 'R', 'O', 'R', 0,
		'V', 'E', 'R', 'R', 'O', 'R', 0,
		'C', '4', '2', '6', '0', '1', 0,
		'M', 'x', 0,
		0,
	};
	struct pktbuf pb;
	bool ok = true;

	pkt_init(&pb);
	pkt_error(&pb, "FATAL", "08P01", "bad", "The detail.");
	CHECK(pb_is(&pb, want, sizeof(want)));
	pkt_reset(&pb);
	pkt_error(&pb, "ERROR", "42601", "x", NULL);
	CHECK(pb_is(&pb, want_nodetail, sizeof(want_nodetail)));
end:
	pkt_free(&pb);
	return ok;
}

static bool test_pkt_row_description(void)
{
	static const char *const names[] = { "a", "bc" };
	static const uint8_t want[] = {
		'T', 0, 0, 0, 47,
		0, 2,
		'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
		'b', 'c', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
	};
	struct pktbuf pb;
	bool ok = true;

	pkt_init(&pb);
	pkt_row_description(&pb, 2, names);
	CHECK(pb_is(&pb, want, sizeof(want)));
end:
	pkt_free(&pb);
	return ok;
}

static bool test_pkt_data_row_null(void)
{
	static const char *const values[] = { "xy", NULL, "" };
	static const uint8_t want[] = {
		'D', 0, 0, 0, 20,
		0, 3,
		0, 0, 0, 2, 'x', 'y',
		0xff, 0xff, 0xff, 0xff,
		0, 0, 0, 0,
	};
	struct pktbuf pb;
	bool ok = true;

	pkt_init(&pb);
	pkt_data_row(&pb, 3, values);
	CHECK(pb_is(&pb, want, sizeof(want)));
end:
	pkt_free(&pb);
	return ok;
}

/* Several whole messages build up in one buffer and go out in one pkt_send(). */
static bool test_pkt_send_batches(void)
{
	static const uint8_t want[] = {
		'C', 0, 0, 0, 9, 'S', 'H', 'O', 'W', 0,
		'Z', 0, 0, 0, 5, 'I',
	};
	struct evbuffer *out = evbuffer_new();
	uint8_t got[sizeof(want)];
	struct pktbuf pb;
	bool ok = true;

	pkt_init(&pb);
	CHECK(out);
	pkt_command_complete(&pb, "SHOW");
	pkt_ready(&pb, 'I');
	CHECK(pkt_send(&pb, out));
	CHECK(pb.len == 0);
	CHECK(evbuffer_get_length(out) == sizeof(want));
	CHECK(evbuffer_copyout(out, got, sizeof(got)) == (ev_ssize_t)sizeof(got));
	CHECK(memcmp(got, want, sizeof(want)) == 0);
end:
	if (out)
		evbuffer_free(out);
	pkt_free(&pb);
	return ok;
}

static const struct unit_case cases[] = {
	{ "SSLRequest is answered N and the startup goes on", test_ssl_request },
	{ "GSSENCRequest is answered N", test_gssenc_request },
	{ "startup length below 8 is refused with 08P01", test_startup_too_short },
	{ "startup length 4 with a version is refused with 08P01", test_startup_length_4 },
	{ "startup length above 10000 is refused with 08P01", test_startup_too_long },
	{ "protocol 2.0 is refused with 0A000", test_protocol_2 },
	{ "startup without user is refused with 28000", test_missing_user },
	{ "unknown database is refused with 3D000", test_unknown_database },
	{ "cancel request is closed without a reply", test_cancel_request_closes },
	{ "trust login to the console gets the welcome", test_console_welcome },
	{ "SHOW VERSION answers one row", test_show_version },
	{ "unknown message type is refused with 08P01", test_unknown_message_type },
	{ "message length below 4 is refused with 08P01", test_message_length_below_4 },
	{ "message over max_message_bytes is refused with 08P01", test_message_too_long },
	{ "extended protocol in the console is refused with 08P01", test_console_extended_protocol },
	{ "query without its terminator is refused with 08P01", test_query_without_terminator },
	{ "Terminate closes without a reply", test_terminate },
	{ "startup and query in 1-byte writes still work", test_bytewise_writes },
	{ "two queries in one write get two answers", test_pipelined_queries },
	{ "stats user gets 42501 for SET and stays connected", test_stats_user_set_refused },
	{ "pkt_error builds the exact bytes", test_pkt_error },
	{ "pkt_row_description builds the exact bytes", test_pkt_row_description },
	{ "pkt_data_row writes NULL as length -1", test_pkt_data_row_null },
	{ "pkt_send appends whole messages and empties the buffer", test_pkt_send_batches },
	{ NULL, NULL }
};

UNIT_MAIN("framing", cases)
