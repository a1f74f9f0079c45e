/* SPDX-License-Identifier: ISC */
/*
 * test_mux.c -- unit tests of the tunnel multiplexer (plugins/tunnel/):
 * the frame codec, the handshake, streams, flow control, GOAWAY, RST races,
 * the heartbeat and the scheduler.
 *
 * Most cases run a relay session and an agent session against each other
 * in memory: pump() moves each side's mux_pending() bytes into the other's
 * mux_feed(), in chunks of a chosen size (1 = byte by byte), until neither
 * has anything to send. The test owner (struct side) sends a deterministic
 * byte pattern per stream (pattern()) and checks every received byte against
 * it, so corruption, loss or reordering fails the case. Cases about a
 * misbehaving peer inject hand-built frames (the mux_build_* helpers, or raw
 * bytes) into one session.
 *
 * The clock is the global `now`; nothing sleeps.
 */
#include "mux.h"
#include "unit.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 8192			/* stream ids 1..16383 */
#define PUMP_ROUNDS 100000
#define SMALL_WINDOW (64 * 1024)

static uint64_t now;

/* ------------------------------------------------------------------------- */
/* the test owner of one session */

struct tstream {
	uint32_t id;
	size_t to_send, sent;		/* pattern bytes to send, and sent so far */
	bool send_fin;			/* FIN after to_send */
	size_t recv;			/* pattern bytes received (checked) */
	size_t consumed;		/* reported with mux_stream_consumed() */
	bool bad_byte;
	int fins, closes;
	uint32_t close_code;
	bool close_by_peer, close_retryable;
	int open_acks;
	bool reset_on_data;		/* mux_reset() from inside on_data */
};

struct side {
	struct mux_session *s;
	struct mux_settings set;
	struct tstream st[SLOTS];
	bool auto_consume;		/* consume every byte as it arrives */
	uint32_t refuse_code;		/* on_open returns this */
	int hellos, hello_acks, opens, goaways, ping_acks, errors, total_closes;
	uint32_t error_code, goaway_last, goaway_code, goaway_reconnect;
	uint64_t rtt;
	char agent_id[MUX_NAME_MAX + 1];
	char db_key[MUX_NAME_MAX + 1];
	size_t proof_len;
	struct side *peer;
};

static struct tstream *ts(struct side *d, uint32_t id)
{
	struct tstream *t = &d->st[(id >> 1) % SLOTS];

	t->id = id;
	return t;
}

static uint8_t pattern(uint32_t id, size_t off)
{
	return (uint8_t)(off * 31 + id * 7 + (off >> 9));
}

static void cb_hello(struct mux_session *s, const struct mux_hello *hello, void *ud)
{
	struct side *d = ud;
	static const uint8_t sid[MUX_ID_LEN] = { 1, 2, 3 };

	d->hellos++;
	strcpy(d->agent_id, hello->agent_id);
	d->proof_len = hello->proof_len;
	mux_accept(s, sid, 1700000000000ull);
}

static void cb_hello_ack(struct mux_session *s, const struct mux_hello *ack, void *ud)
{
	(void)s;
	(void)ack;
	((struct side *)ud)->hello_acks++;
}

static uint32_t cb_open(struct mux_session *s, uint32_t id, const struct mux_open *o, void **stream_ud,
			void *ud)
{
	struct side *d = ud;

	(void)s;
	d->opens++;
	strcpy(d->db_key, o->db_key);
	if (d->refuse_code)
		return d->refuse_code;
	*stream_ud = ts(d, id);
	return MUX_NO_ERROR;
}

static void cb_open_ack(struct mux_session *s, uint32_t id, void *stream_ud, void *ud)
{
	(void)s;
	(void)id;
	(void)ud;
	((struct tstream *)stream_ud)->open_acks++;
}

static void cb_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *stream_ud,
		    void *ud)
{
	struct side *d = ud;
	struct tstream *t = stream_ud;

	for (size_t i = 0; i < len; i++)
		if (data[i] != pattern(id, t->recv + i))
			t->bad_byte = true;
	t->recv += len;
	if (t->reset_on_data) {
		mux_reset(s, id, MUX_E_CANCEL);
		return;
	}
	if (d->auto_consume) {
		mux_stream_consumed(s, id, len);
		t->consumed += len;
	}
}

static void cb_fin(struct mux_session *s, uint32_t id, void *stream_ud, void *ud)
{
	(void)s;
	(void)id;
	(void)ud;
	((struct tstream *)stream_ud)->fins++;
}

static void cb_close(struct mux_session *s, uint32_t id, uint32_t code, bool by_peer, bool retryable,
		     void *stream_ud, void *ud)
{
	struct tstream *t = stream_ud;

	(void)s;
	(void)id;
	((struct side *)ud)->total_closes++;
	t->closes++;
	t->close_code = code;
	t->close_by_peer = by_peer;
	t->close_retryable = retryable;
}

static void cb_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms,
		      const char *debug, size_t debug_len, void *ud)
{
	struct side *d = ud;

	(void)s;
	(void)debug;
	(void)debug_len;
	d->goaways++;
	d->goaway_last = last;
	d->goaway_code = code;
	d->goaway_reconnect = reconnect_ms;
}

static void cb_ping_ack(struct mux_session *s, uint64_t rtt_ms, void *ud)
{
	(void)s;
	((struct side *)ud)->ping_acks++;
	((struct side *)ud)->rtt = rtt_ms;
}

static void cb_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	struct side *d = ud;

	(void)s;
	(void)msg;
	if (getenv("MUX_TEST_VERBOSE"))
		fprintf(stderr, "    session error %s: %s\n", mux_error_name(code), msg);
	d->errors++;
	d->error_code = code;
}

static long cb_read(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *stream_ud,
		    void *ud)
{
	struct tstream *t = stream_ud;
	size_t n = t->to_send - t->sent;

	(void)s;
	(void)ud;
	if (n > max)
		n = max;
	for (size_t i = 0; i < n; i++)
		dst[i] = pattern(id, t->sent + i);
	t->sent += n;
	*eof = t->send_fin && t->sent == t->to_send;
	return (long)n;
}

static const struct mux_callbacks callbacks = {
	.on_hello = cb_hello,
	.on_hello_ack = cb_hello_ack,
	.on_open = cb_open,
	.on_open_ack = cb_open_ack,
	.on_data = cb_data,
	.on_fin = cb_fin,
	.on_stream_close = cb_close,
	.on_goaway = cb_goaway,
	.on_ping_ack = cb_ping_ack,
	.on_session_error = cb_error,
	.read_data = cb_read,
};

static struct side *side_new(enum mux_role role, const struct mux_settings *set)
{
	struct side *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	if (set)
		d->set = *set;
	else
		mux_settings_default(&d->set);
	d->auto_consume = true;
	d->s = mux_session_new(role, &d->set, &callbacks, d);
	if (!d->s) {
		free(d);
		return NULL;
	}
	return d;
}

static void side_free(struct side *d)
{
	if (!d)
		return;
	mux_session_free(d->s);
	free(d);
}

/* Move a's pending bytes into b, `chunk` at a time (0 = all). Returns bytes moved. */
static size_t transfer(struct side *a, struct side *b, size_t chunk)
{
	const uint8_t *p;
	size_t n = mux_pending(a->s, &p), moved = 0;

	while (moved < n) {
		size_t k = chunk && n - moved > chunk ? chunk : n - moved;
		mux_feed(b->s, p + moved, k, now);
		moved += k;
	}
	mux_consumed(a->s, n);
	return n;
}

/* Exchange bytes until both sides are quiet. */
static void pump(struct side *a, struct side *b, size_t chunk)
{
	for (int i = 0; i < PUMP_ROUNDS; i++)
		if (!transfer(a, b, chunk) + !transfer(b, a, chunk) == 2)
			return;
}

/* A relay and an agent, handshake done. NULL settings: the defaults. */
static bool pair_up(struct side **relay, struct side **agent, const struct mux_settings *rset,
		    const struct mux_settings *aset, size_t chunk)
{
	static const uint8_t proof[32] = { 9 };

	*relay = side_new(MUX_ROLE_RELAY, rset);
	*agent = side_new(MUX_ROLE_AGENT, aset);
	if (!*relay || !*agent)
		return false;
	(*relay)->peer = *agent;
	(*agent)->peer = *relay;
	if (!mux_hello((*agent)->s, "agent-1", proof, sizeof(proof), now))
		return false;
	pump(*agent, *relay, chunk);
	return mux_established((*relay)->s) && mux_established((*agent)->s) && (*agent)->hello_acks == 1;
}

/* Free both sides of a pair; returns ok, a test's result. */
static bool pair_done(struct side *relay, struct side *agent, bool ok)
{
	side_free(relay);
	side_free(agent);
	return ok;
}

/* Inject raw frame bytes into a side. */
static bool inject(struct side *d, const uint8_t *f, size_t n)
{
	return n && mux_feed(d->s, f, n, now);
}

/* Walk frames in a byte buffer: false at the end. */
static bool next_frame(const uint8_t *buf, size_t len, size_t *off, struct mux_header *h, const uint8_t **payload)
{
	if (len - *off < MUX_HEADER_LEN)
		return false;
	mux_header_decode(buf + *off, h);
	if (len - *off - MUX_HEADER_LEN < h->length)
		return false;
	*payload = buf + *off + MUX_HEADER_LEN;
	*off += MUX_HEADER_LEN + h->length;
	return true;
}

static void small_settings(struct mux_settings *st)
{
	mux_settings_default(st);
	st->stream_window = SMALL_WINDOW;
}

/* relay: open a stream whose user pointer is its slot. */
static uint32_t relay_open(struct side *relay, const char *db_key, uint32_t window, uint32_t *err)
{
	struct mux_open o;
	uint32_t id;

	memset(&o, 0, sizeof(o));
	strcpy(o.db_key, db_key);
	o.window = window;
	id = mux_open(relay->s, &o, NULL, err);
	if (id)
		mux_stream_set_user(relay->s, id, ts(relay, id));
	return id;
}

/* pair_up with the defaults, then one stream to "app" that the relay opened and the agent got; *id is its id. */
static bool pair_with_stream(struct side **relay, struct side **agent, uint32_t *id)
{
	uint32_t err;

	if (!pair_up(relay, agent, NULL, NULL, 0))
		return false;
	*id = relay_open(*relay, "app", 0, &err);
	pump(*relay, *agent, 0);
	return true;
}

/* ------------------------------------------------------------------------- */
/* codec */

static bool test_header_round_trip(void)
{
	bool ok = true;
	uint8_t b[MUX_HEADER_LEN];
	struct mux_header h = { MUX_GOAWAY, 0, 0, 0, 268 }, g;
	struct mux_header d = { MUX_DATA, MUX_FLAG_FIN, 0, 0x7fffffff, 0x00abcdef };

	mux_header_encode(b, &h);
	mux_header_decode(b, &g);
	CHECK(memcmp(&h, &g, sizeof(h)) == 0);
	mux_header_encode(b, &d);
	CHECK(b[0] == 0 && b[1] == 1 && b[2] == 0 && b[3] == 0);
	CHECK(b[4] == 0x7f && b[5] == 0xff && b[6] == 0xff && b[7] == 0xff);	/* big-endian */
	CHECK(b[8] == 0x00 && b[9] == 0xab && b[10] == 0xcd && b[11] == 0xef);
	mux_header_decode(b, &g);
	CHECK(g.type == MUX_DATA && g.flags == MUX_FLAG_FIN && g.stream_id == 0x7fffffff && g.length == 0xabcdef);
	CHECK_STR(mux_error_name(MUX_E_ENHANCE_YOUR_CALM), "ENHANCE_YOUR_CALM");
	CHECK_STR(mux_error_name(99), "UNKNOWN");
	CHECK_STR(mux_frame_name(MUX_HELLO_ACK), "HELLO_ACK");
end:
	return ok;
}

static bool test_frames_round_trip(void)
{
	bool ok = true;
	uint8_t f[MUX_CONTROL_MAX + MUX_HEADER_LEN];
	struct mux_hello hello, back;
	struct mux_open o, ob;
	struct mux_header h;
	const char *why;
	size_t n;
	uint32_t w;
	const uint8_t opaque[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

	memset(&hello, 0, sizeof(hello));
	hello.version_min = 1;
	hello.version_max = 3;
	strcpy(hello.agent_id, "site-acme");
	hello.proof_len = 32;
	memset(hello.proof, 0xaa, 32);
	mux_settings_default(&hello.settings);
	hello.settings.stream_window = 123456;
	n = mux_build_hello(f, sizeof(f), &hello);
	CHECK(n > MUX_HEADER_LEN);
	mux_header_decode(f, &h);
	CHECK(h.type == MUX_HELLO && h.length == n - MUX_HEADER_LEN && h.stream_id == 0);
	CHECK(mux_header_check(&h, MUX_FRAME_DEFAULT, &why) == MUX_NO_ERROR);
	CHECK(mux_parse_hello(f + MUX_HEADER_LEN, h.length, &back, &why) == MUX_NO_ERROR);
	CHECK(back.version_min == 1 && back.version_max == 3 && back.proof_len == 32 && back.proof[31] == 0xaa);
	CHECK_STR(back.agent_id, "site-acme");
	CHECK(memcmp(&back.settings, &hello.settings, sizeof(hello.settings)) == 0);

	hello.version = 1;
	memset(hello.session_id, 0x5a, MUX_ID_LEN);
	hello.server_time_ms = 0x0102030405060708ull;
	n = mux_build_hello_ack(f, sizeof(f), &hello);
	mux_header_decode(f, &h);
	CHECK(n && h.type == MUX_HELLO_ACK);
	CHECK(mux_parse_hello_ack(f + MUX_HEADER_LEN, h.length, &back, &why) == MUX_NO_ERROR);
	CHECK(back.version == 1 && back.server_time_ms == 0x0102030405060708ull && back.session_id[15] == 0x5a);
	CHECK(back.settings.stream_window == 123456);

	memset(&o, 0, sizeof(o));
	o.has_org_id = true;
	memset(o.org_id, 0x42, MUX_ID_LEN);
	strcpy(o.db_key, "org_42");
	strcpy(o.client_id, "fdw-7");
	o.ticket_len = 100;
	memset(o.ticket, 't', 100);
	o.window = 1 << 20;
	n = mux_build_open(f, sizeof(f), 77, &o);
	mux_header_decode(f, &h);
	CHECK(n && h.type == MUX_OPEN && h.stream_id == 77);
	CHECK(mux_parse_open(f + MUX_HEADER_LEN, h.length, &ob, &why) == MUX_NO_ERROR);
	CHECK(memcmp(&o, &ob, sizeof(o)) == 0);

	n = mux_build_open_ack(f, sizeof(f), 77, 8u << 20);
	mux_header_decode(f, &h);
	CHECK(n && h.type == MUX_OPEN_ACK);
	CHECK(mux_parse_open_ack(f + MUX_HEADER_LEN, h.length, &w, &why) == MUX_NO_ERROR && w == 8u << 20);
	n = mux_build_open_ack(f, sizeof(f), 77, 0);
	CHECK(n == MUX_HEADER_LEN);
	CHECK(mux_parse_open_ack(f + MUX_HEADER_LEN, 0, &w, &why) == MUX_NO_ERROR && w == 0);

	n = mux_build_rst(f, sizeof(f), 9, MUX_E_NO_SUCH_TARGET);
	mux_header_decode(f, &h);
	CHECK(n == 16 && h.type == MUX_RST && h.stream_id == 9 && f[15] == MUX_E_NO_SUCH_TARGET);
	n = mux_build_window_update(f, sizeof(f), 0, 65536);
	mux_header_decode(f, &h);
	CHECK(n == 16 && h.type == MUX_WINDOW_UPDATE && h.stream_id == 0 && f[13] == 1);
	CHECK(mux_build_window_update(f, sizeof(f), 1, 0) == 0);
	n = mux_build_ping(f, sizeof(f), true, opaque);
	mux_header_decode(f, &h);
	CHECK(n == 20 && h.flags == MUX_FLAG_ACK && memcmp(f + 12, opaque, 8) == 0);
	n = mux_build_goaway(f, sizeof(f), 41, MUX_E_RELAY_RESTART, 250, "drain", 5);
	mux_header_decode(f, &h);
	CHECK(n == 12 + 17 && h.type == MUX_GOAWAY && h.length == 17 && memcmp(f + 24, "drain", 5) == 0);
	CHECK(f[15] == 41 && f[19] == MUX_E_RELAY_RESTART && f[23] == 250);
	n = mux_build_data(f, sizeof(f), 3, true, (const uint8_t *)"abc", 3);
	mux_header_decode(f, &h);
	CHECK(n == 15 && h.flags == MUX_FLAG_FIN && h.length == 3);
	CHECK(mux_build_data(f, 14, 3, false, (const uint8_t *)"abc", 3) == 0);	/* does not fit */
	CHECK(mux_build_data(f, sizeof(f), 0, false, NULL, 0) == 0);		/* stream 0 */
end:
	return ok;
}

/* Headers at the edges of validity (max_frame = MUX_FRAME_DEFAULT). */
static const struct {
	struct mux_header h;
	bool valid;
} header_cases[] = {
		{ { MUX_DATA, 0, 0, 1, MUX_FRAME_DEFAULT }, true },
		{ { MUX_DATA, 0, 0, 1, MUX_FRAME_DEFAULT + 1 }, false },
		{ { MUX_DATA, 0, 0, 0, 1 }, false },
		{ { MUX_DATA, 0x2, 0, 1, 1 }, false },
		{ { MUX_DATA, 0, 1, 1, 1 }, false },
		{ { MUX_DATA, 0, 0x8000, 1, 1 }, false },
		{ { MUX_DATA, 0, 0, 0x80000001u, 1 }, false },
		{ { MUX_WINDOW_UPDATE, 0, 0, 0, 4 }, true },
		{ { MUX_WINDOW_UPDATE, 0, 0, 5, 4 }, true },
		{ { MUX_WINDOW_UPDATE, 0, 0, 5, 3 }, false },
		{ { MUX_WINDOW_UPDATE, 0, 0, 5, 5 }, false },
		{ { MUX_WINDOW_UPDATE, 1, 0, 5, 4 }, false },
		{ { MUX_OPEN, 0, 0, 0, 10 }, false },
		{ { MUX_OPEN, 0, 0, 1, MUX_CONTROL_MAX }, true },
		{ { MUX_OPEN, 0, 0, 1, MUX_CONTROL_MAX + 1 }, false },
		{ { MUX_OPEN_ACK, 0, 0, 0, 0 }, false },
		{ { MUX_RST, 0, 0, 1, 4 }, true },
		{ { MUX_RST, 0, 0, 0, 4 }, false },
		{ { MUX_RST, 0, 0, 1, 3 }, false },
		{ { MUX_PING, 0, 0, 0, 8 }, true },
		{ { MUX_PING, MUX_FLAG_ACK, 0, 0, 8 }, true },
		{ { MUX_PING, 0x2, 0, 0, 8 }, false },
		{ { MUX_PING, 0, 0, 3, 8 }, false },
		{ { MUX_PING, 0, 0, 0, 7 }, false },
		{ { MUX_PING, 0, 0, 0, 9 }, false },
		{ { MUX_GOAWAY, 0, 0, 0, 12 }, true },
		{ { MUX_GOAWAY, 0, 0, 0, 12 + MUX_GOAWAY_DEBUG_MAX }, true },
		{ { MUX_GOAWAY, 0, 0, 0, 13 + MUX_GOAWAY_DEBUG_MAX }, false },
		{ { MUX_GOAWAY, 0, 0, 0, 11 }, false },
		{ { MUX_GOAWAY, 0, 0, 1, 12 }, false },
		{ { MUX_HELLO, 0, 0, 1, 10 }, false },
		{ { MUX_HELLO, 0, 0, 0, MUX_CONTROL_MAX + 1 }, false },
		{ { MUX_HELLO_ACK, 0, 0, 0, 0xffffffffu }, false },
		{ { 0x42, 0xff, 0, 9, MUX_CONTROL_MAX }, true },	/* unknown: skipped */
		{ { 0x42, 0, 0, 9, MUX_CONTROL_MAX + 1 }, false },
		{ { 0x42, 0, 4, 0, 0 }, false },
};

/* Every malformed header is refused; the valid edges pass. */
static bool test_header_checks(void)
{
	bool ok = true;
	const char *why;

	for (size_t i = 0; i < sizeof(header_cases) / sizeof(header_cases[0]); i++) {
		uint32_t rc = mux_header_check(&header_cases[i].h, MUX_FRAME_DEFAULT, &why);
		if ((rc == MUX_NO_ERROR) != header_cases[i].valid) {
			fprintf(stderr, "  header case %zu: got %s (%s)\n", i, mux_error_name(rc), why ? why : "");
			ok = false;
		}
		if (rc != MUX_NO_ERROR && (!why || rc != MUX_E_PROTOCOL))
			ok = false;
	}
	return ok;
}

/* An established session given each malformed header alone fails at once:
 * the checks run before any payload byte is awaited. */
static bool test_bad_headers_fail_sessions(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t b[MUX_HEADER_LEN];

	for (size_t i = 0; i < sizeof(header_cases) / sizeof(header_cases[0]); i++) {
		if (header_cases[i].valid)
			continue;
		CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
		mux_header_encode(b, &header_cases[i].h);
		if (mux_feed(agent->s, b, sizeof(b), now) || agent->error_code != MUX_E_PROTOCOL) {
			fprintf(stderr, "  header case %zu did not fail the session\n", i);
			ok = false;
		}
		side_free(relay);
		side_free(agent);
		relay = agent = NULL;
	}
end:
	return pair_done(relay, agent, ok);
}

/* A session given a bad header fails at once, without waiting for its payload. */
static bool test_bad_header_fails_session(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t b[MUX_HEADER_LEN];
	struct mux_header h = { MUX_DATA, 0, 0, 1, 0x7fffffff };	/* 2 GiB DATA */
	const uint8_t *p;
	size_t off = 0, n;
	struct mux_header g;
	const uint8_t *pl;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	mux_header_encode(b, &h);
	CHECK(!mux_feed(agent->s, b, sizeof(b), now));
	CHECK(agent->errors == 1 && agent->error_code == MUX_E_PROTOCOL && mux_failed(agent->s));
	CHECK(!mux_feed(agent->s, b, sizeof(b), now));	/* stays failed */
	CHECK(agent->errors == 1);
	n = mux_pending(agent->s, &p);
	CHECK(next_frame(p, n, &off, &g, &pl));
	CHECK(g.type == MUX_GOAWAY && pl[7] == MUX_E_PROTOCOL);
end:
	return pair_done(relay, agent, ok);
}

static bool tlv_fails(const uint8_t *p, size_t n, int which)
{
	struct mux_hello hello;
	struct mux_open o;
	uint32_t w;
	const char *why = NULL;
	uint32_t rc;

	switch (which) {
	case 0: rc = mux_parse_hello(p, n, &hello, &why); break;
	case 1: rc = mux_parse_hello_ack(p, n, &hello, &why); break;
	case 2: rc = mux_parse_open(p, n, &o, &why); break;
	default: rc = mux_parse_open_ack(p, n, &w, &why); break;
	}
	return rc == MUX_E_PROTOCOL && why != NULL;
}

static bool test_tlv_checks(void)
{
	bool ok = true;
	struct mux_open o;
	const char *why;
	/* db_key "app" */
	static const uint8_t open_ok[] = { 0, 17, 0, 3, 'a', 'p', 'p' };
	static const uint8_t open_unknown[] = { 0x12, 0x34, 0, 2, 9, 9, 0, 17, 0, 3, 'a', 'p', 'p' };
	static const uint8_t open_nokey[] = { 0, 18, 0, 1, 'c' };
	static const uint8_t open_dup[] = { 0, 17, 0, 1, 'a', 0, 17, 0, 1, 'b' };
	static const uint8_t open_nul[] = { 0, 17, 0, 3, 'a', 0, 'p' };
	static const uint8_t open_empty[] = { 0, 17, 0, 0 };
	static const uint8_t open_overrun[] = { 0, 17, 0, 9, 'a', 'p', 'p' };
	static const uint8_t open_trunc[] = { 0, 17, 0, 3, 'a', 'p', 'p', 0, 1 };
	static const uint8_t open_orgsize[] = { 0, 17, 0, 1, 'a', 0, 16, 0, 4, 1, 2, 3, 4 };
	static const uint8_t open_window[] = { 0, 17, 0, 1, 'a', 0, 8, 0, 4, 0, 0, 0, 1 };
	static const uint8_t hello_nover[] = { 0, 4, 0, 1, 'x' };
	static const uint8_t hello_empty_range[] = { 0, 1, 0, 2, 0, 3, 0, 2, 0, 2, 0, 1 };
	static const uint8_t hello_bad_frame[] = { 0, 1, 0, 2, 0, 1, 0, 2, 0, 2, 0, 1, 0, 10, 0, 4, 0, 0, 0, 1 };
	static const uint8_t hello_bad_beat[] = { 0, 1, 0, 2, 0, 1, 0, 2, 0, 2, 0, 1, 0, 12, 0, 4, 0, 0, 0x75, 0x30 };
	static const uint8_t ack_nover[] = { 0, 7, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1 };
	static const uint8_t ack_bad_sid[] = { 0, 3, 0, 2, 0, 1, 0, 6, 0, 3, 1, 2, 3 };
	static const uint8_t oack_small[] = { 0, 8, 0, 4, 0, 0, 0, 16 };
	static const uint8_t oack_size[] = { 0, 8, 0, 2, 0, 16 };

	CHECK(mux_parse_open(open_ok, sizeof(open_ok), &o, &why) == MUX_NO_ERROR);
	CHECK_STR(o.db_key, "app");
	CHECK(mux_parse_open(open_unknown, sizeof(open_unknown), &o, &why) == MUX_NO_ERROR);
	CHECK_STR(o.db_key, "app");
	CHECK(tlv_fails(open_nokey, sizeof(open_nokey), 2));
	CHECK(tlv_fails(open_dup, sizeof(open_dup), 2));
	CHECK(tlv_fails(open_nul, sizeof(open_nul), 2));
	CHECK(tlv_fails(open_empty, sizeof(open_empty), 2));
	CHECK(tlv_fails(open_overrun, sizeof(open_overrun), 2));
	CHECK(tlv_fails(open_trunc, sizeof(open_trunc), 2));
	CHECK(tlv_fails(open_orgsize, sizeof(open_orgsize), 2));
	CHECK(tlv_fails(open_window, sizeof(open_window), 2));
	CHECK(tlv_fails(NULL, 0, 2));
	CHECK(tlv_fails(hello_nover, sizeof(hello_nover), 0));
	CHECK(tlv_fails(hello_empty_range, sizeof(hello_empty_range), 0));
	CHECK(tlv_fails(hello_bad_frame, sizeof(hello_bad_frame), 0));
	CHECK(tlv_fails(hello_bad_beat, sizeof(hello_bad_beat), 0));
	CHECK(tlv_fails(ack_nover, sizeof(ack_nover), 1));
	CHECK(tlv_fails(ack_bad_sid, sizeof(ack_bad_sid), 1));
	CHECK(tlv_fails(oack_small, sizeof(oack_small), 3));
	CHECK(tlv_fails(oack_size, sizeof(oack_size), 3));
end:
	return ok;
}

/* ------------------------------------------------------------------------- */
/* handshake */

static bool test_handshake(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings rs, as;

	mux_settings_default(&rs);
	mux_settings_default(&as);
	rs.session_window = 32u << 20;
	as.stream_window = 1u << 20;
	as.max_streams = 100;
	CHECK(pair_up(&relay, &agent, &rs, &as, 0));
	CHECK(relay->hellos == 1 && agent->hello_acks == 1);
	CHECK_STR(relay->agent_id, "agent-1");
	CHECK(relay->proof_len == 32);
	CHECK(mux_peer_settings(relay->s)->stream_window == 1u << 20);
	CHECK(mux_peer_settings(relay->s)->max_streams == 100);
	CHECK(mux_peer_settings(agent->s)->session_window == 32u << 20);
	CHECK(mux_session_send_window(agent->s) == 32u << 20);
	CHECK(mux_session_send_window(relay->s) == MUX_SESSION_WINDOW_DEFAULT);
	CHECK(!mux_hello(agent->s, "again", NULL, 0, now));
end:
	return pair_done(relay, agent, ok);
}

static bool test_handshake_errors(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t f[256];
	struct mux_hello hello;
	size_t n;
	uint8_t ping[MUX_HEADER_LEN + 8];
	const uint8_t opaque[8] = { 0 };

	/* bad preface */
	relay = side_new(MUX_ROLE_RELAY, NULL);
	CHECK(relay);
	CHECK(!mux_feed(relay->s, (const uint8_t *)"GET / HTTP/1.1\r\n", 16, now));
	CHECK(relay->errors == 1 && relay->error_code == MUX_E_PROTOCOL);
	side_free(relay);

	/* a frame other than HELLO first */
	relay = side_new(MUX_ROLE_RELAY, NULL);
	CHECK(relay && mux_feed(relay->s, (const uint8_t *)MUX_PREFACE, MUX_PREFACE_LEN, now));
	n = mux_build_ping(ping, sizeof(ping), false, opaque);
	CHECK(!inject(relay, ping, n));
	CHECK(relay->error_code == MUX_E_PROTOCOL && relay->hellos == 0);
	side_free(relay);

	/* no common version: agent speaks 2..3 only */
	relay = side_new(MUX_ROLE_RELAY, NULL);
	memset(&hello, 0, sizeof(hello));
	hello.version_min = 2;
	hello.version_max = 3;
	mux_settings_default(&hello.settings);
	n = mux_build_hello(f, sizeof(f), &hello);
	CHECK(mux_feed(relay->s, (const uint8_t *)MUX_PREFACE, MUX_PREFACE_LEN, now));
	CHECK(!inject(relay, f, n));
	CHECK(relay->error_code == MUX_E_PROTOCOL && relay->hellos == 0);
	side_free(relay);

	/* a newer agent (1..5) gets version 1 */
	relay = side_new(MUX_ROLE_RELAY, NULL);
	hello.version_min = 1;
	hello.version_max = 5;
	n = mux_build_hello(f, sizeof(f), &hello);
	CHECK(mux_feed(relay->s, (const uint8_t *)MUX_PREFACE, MUX_PREFACE_LEN, now));
	CHECK(inject(relay, f, n) && relay->hellos == 1 && mux_established(relay->s));
	side_free(relay);
	relay = NULL;

	/* the relay refuses the agent: GOAWAY(UNAUTHORIZED) instead of HELLO_ACK */
	{
		struct mux_callbacks cb = callbacks;
		cb.on_hello = NULL;	/* the owner checks the proof later */
		relay = side_new(MUX_ROLE_RELAY, NULL);
		CHECK(relay);
		mux_session_free(relay->s);
		relay->s = mux_session_new(MUX_ROLE_RELAY, &relay->set, &cb, relay);
	}
	agent = side_new(MUX_ROLE_AGENT, NULL);
	CHECK(relay->s && agent && mux_hello(agent->s, "intruder", NULL, 0, now));
	transfer(agent, relay, 0);
	CHECK(!mux_established(relay->s) && relay->errors == 0);
	CHECK(mux_goaway(relay->s, MUX_E_UNAUTHORIZED, 0, "bad token"));
	CHECK(!mux_accept(relay->s, (const uint8_t *)"0123456789abcdef", 0));
	transfer(relay, agent, 0);
	CHECK(agent->goaways == 1 && agent->goaway_code == MUX_E_UNAUTHORIZED && !mux_established(agent->s));
	CHECK(agent->errors == 0);

	/* bytes to an agent that has not said HELLO */
	side_free(agent);
	agent = side_new(MUX_ROLE_AGENT, NULL);
	n = mux_build_ping(ping, sizeof(ping), false, opaque);
	CHECK(!mux_feed(agent->s, ping, n, now) && agent->error_code == MUX_E_PROTOCOL);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* streams */

/* One stream, data both ways, FIN both ways, in chunks of `chunk` bytes. */
static bool stream_exchange(size_t chunk)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id, err;
	struct tstream *r, *a;

	CHECK(pair_up(&relay, &agent, NULL, NULL, chunk));
	id = relay_open(relay, "org_42", 0, &err);
	CHECK(id == 1 && err == MUX_NO_ERROR);
	r = ts(relay, id);
	r->to_send = 300000;
	r->send_fin = true;
	CHECK(mux_resume(relay->s, id));	/* DATA may follow OPEN before the ACK */
	pump(relay, agent, chunk);
	CHECK(agent->opens == 1);
	CHECK_STR(agent->db_key, "org_42");
	a = ts(agent, id);
	CHECK(a->recv == 300000 && !a->bad_byte && a->fins == 1);
	CHECK(mux_stream_state(agent->s, id) == MUX_ST_HALF_CLOSED_REMOTE);
	CHECK(mux_stream_state(relay->s, id) == MUX_ST_HALF_CLOSED_LOCAL);
	CHECK(!mux_resume(relay->s, id));	/* FIN sent: nothing more */
	CHECK(mux_open_ack(agent->s, id, 0));
	a->to_send = 500000;
	a->send_fin = true;
	CHECK(mux_resume(agent->s, id));
	pump(relay, agent, chunk);
	CHECK(r->open_acks == 1);
	CHECK(r->recv == 500000 && !r->bad_byte && r->fins == 1);
	CHECK(r->closes == 1 && r->close_code == MUX_NO_ERROR);
	CHECK(a->closes == 1 && a->close_code == MUX_NO_ERROR);
	CHECK(mux_stream_count(relay->s) == 0 && mux_stream_count(agent->s) == 0);
	CHECK(mux_stream_state(relay->s, id) == -1);
	CHECK(relay->errors == 0 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

static bool test_stream_exchange(void)
{
	return stream_exchange(0);
}

static bool test_split_feeds_byte_by_byte(void)
{
	return stream_exchange(1) && stream_exchange(7) && stream_exchange(13);
}

static bool test_open_refused_by_agent(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id, err;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	agent->refuse_code = MUX_E_NO_SUCH_TARGET;
	id = relay_open(relay, "nosuch", 0, &err);
	CHECK(id);
	ts(relay, id)->to_send = 1000;
	mux_resume(relay->s, id);
	pump(relay, agent, 0);
	CHECK(agent->opens == 1 && agent->total_closes == 0);	/* never taken, never reported */
	CHECK(ts(relay, id)->closes == 1 && ts(relay, id)->close_code == MUX_E_NO_SUCH_TARGET);
	CHECK(ts(relay, id)->close_by_peer && !ts(relay, id)->close_retryable);
	CHECK(relay->errors == 0 && agent->errors == 0);
	/* the 1000 bytes that followed the OPEN were dropped but credited */
	CHECK(mux_stream_count(agent->s) == 0);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* flow control */

static bool test_window_exhaustion_and_credit(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id, err;
	struct tstream *a;
	size_t before;

	small_settings(&as);
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	agent->auto_consume = false;	/* a stalled PostgreSQL client */
	id = relay_open(relay, "app", 0, &err);
	CHECK(id);
	ts(relay, id)->to_send = 1u << 20;
	mux_resume(relay->s, id);
	pump(relay, agent, 0);
	a = ts(agent, id);
	CHECK(a->recv == SMALL_WINDOW);			/* exactly one window */
	CHECK(mux_stream_send_window(relay->s, id) == 0);
	CHECK(mux_stream_recv_window(agent->s, id) == 0);
	CHECK(ts(relay, id)->sent == SMALL_WINDOW);

	/* credit is batched: just under window / MUX_CREDIT_PARTS owed sends nothing */
	mux_stream_consumed(agent->s, id, SMALL_WINDOW / MUX_CREDIT_PARTS - 1);
	pump(relay, agent, 0);
	CHECK(a->recv == SMALL_WINDOW && mux_stream_send_window(relay->s, id) == 0);
	mux_stream_consumed(agent->s, id, 1);
	pump(relay, agent, 0);
	CHECK(a->recv == SMALL_WINDOW + SMALL_WINDOW / MUX_CREDIT_PARTS);
	CHECK(mux_stream_send_window(relay->s, id) == 0);
	/*
	 * a window consumed in uneven pieces (as a socket takes it) comes back
	 * but for less than window / MUX_CREDIT_PARTS, so the sender keeps at
	 * least 15/16 of it in flight (with half a window as the threshold, a
	 * bulk stream kept only half)
	 */
	CHECK(MUX_CREDIT_PARTS >= 16);
	before = a->recv;
	for (int i = 0; i < 3 * MUX_CREDIT_PARTS - 1; i++)
		mux_stream_consumed(agent->s, id, SMALL_WINDOW / (3 * MUX_CREDIT_PARTS - 1));
	pump(relay, agent, 0);
	CHECK(a->recv > before + SMALL_WINDOW / (3 * MUX_CREDIT_PARTS - 1) * (3 * MUX_CREDIT_PARTS - 1) -
			    SMALL_WINDOW / MUX_CREDIT_PARTS);
	/* consuming more than was received is clamped: a window comes back */
	before = a->recv;
	mux_stream_consumed(agent->s, id, 10u << 20);
	pump(relay, agent, 0);
	CHECK(a->recv == before + SMALL_WINDOW);
	agent->auto_consume = true;
	mux_stream_consumed(agent->s, id, 10u << 20);
	pump(relay, agent, 0);
	CHECK(a->recv == 1u << 20 && !a->bad_byte);
	CHECK(mux_stream_send_window(relay->s, id) <= SMALL_WINDOW);
	CHECK(relay->errors == 0 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

/* A peer sending beyond the stream window fails the session with FLOW_CONTROL. */
static bool test_stream_window_breach(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id, err;
	static uint8_t f[MUX_HEADER_LEN + MUX_FRAME_DEFAULT];
	static uint8_t chunk[MUX_FRAME_DEFAULT];
	const uint8_t *p;
	size_t n, off = 0;
	struct mux_header h;
	const uint8_t *pl;
	bool saw_goaway = false;

	small_settings(&as);
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	agent->auto_consume = false;
	id = relay_open(relay, "app", 0, &err);
	pump(relay, agent, 0);
	for (size_t i = 0; i < sizeof(chunk); i++)
		chunk[i] = pattern(id, i);
	for (int i = 0; i < SMALL_WINDOW / MUX_FRAME_DEFAULT; i++) {
		for (size_t k = 0; k < sizeof(chunk); k++)
			chunk[k] = pattern(id, (size_t)i * MUX_FRAME_DEFAULT + k);
		n = mux_build_data(f, sizeof(f), id, false, chunk, sizeof(chunk));
		CHECK(inject(agent, f, n));
	}
	CHECK(agent->errors == 0 && ts(agent, id)->recv == SMALL_WINDOW);
	n = mux_build_data(f, sizeof(f), id, false, chunk, 1);
	CHECK(!inject(agent, f, n));
	CHECK(agent->errors == 1 && agent->error_code == MUX_E_FLOW_CONTROL);
	CHECK(ts(agent, id)->closes == 1 && ts(agent, id)->close_code == MUX_E_FLOW_CONTROL);
	n = mux_pending(agent->s, &p);
	while (next_frame(p, n, &off, &h, &pl))
		if (h.type == MUX_GOAWAY && pl[7] == MUX_E_FLOW_CONTROL)
			saw_goaway = true;
	CHECK(saw_goaway);
end:
	return pair_done(relay, agent, ok);
}

/* Two streams within their windows but together beyond the session window. */
static bool test_session_window_breach(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id1, id2, err;
	static uint8_t f[MUX_HEADER_LEN + MUX_FRAME_DEFAULT];
	static uint8_t zero[MUX_FRAME_DEFAULT];
	size_t n;

	mux_settings_default(&as);
	as.stream_window = 48 * 1024;
	as.session_window = 64 * 1024;
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	agent->auto_consume = false;
	id1 = relay_open(relay, "a", 0, &err);
	id2 = relay_open(relay, "b", 0, &err);
	pump(relay, agent, 0);
	CHECK(agent->opens == 2);
	/* the scheduler itself never breaches: both streams stop at 64 KiB in all */
	ts(relay, id1)->to_send = 100000;
	ts(relay, id2)->to_send = 100000;
	mux_resume(relay->s, id1);
	mux_resume(relay->s, id2);
	pump(relay, agent, 0);
	CHECK(ts(agent, id1)->recv + ts(agent, id2)->recv == 64 * 1024);
	CHECK(mux_session_send_window(relay->s) == 0 && agent->errors == 0);
	/* a rogue relay sends one more byte */
	n = mux_build_data(f, sizeof(f), id2, false, zero, 1);
	CHECK(!inject(agent, f, n));
	CHECK(agent->error_code == MUX_E_FLOW_CONTROL);
end:
	return pair_done(relay, agent, ok);
}

/* DATA for a closed stream is dropped, but the session gets its credit back. */
static bool test_closed_stream_data_credited(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id, err;
	static uint8_t f[MUX_HEADER_LEN + MUX_FRAME_DEFAULT];
	static uint8_t zero[MUX_FRAME_DEFAULT];
	size_t n, total = 0;
	const uint8_t *p;

	mux_settings_default(&as);
	as.session_window = 128 * 1024;
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	id = relay_open(relay, "a", 0, &err);
	pump(relay, agent, 0);
	CHECK(mux_reset(agent->s, id, MUX_E_CANCEL));
	CHECK(ts(agent, id)->closes == 1 && ts(agent, id)->close_code == MUX_E_CANCEL && !ts(agent, id)->close_by_peer);
	n = mux_pending(agent->s, &p);	/* the RST; not delivered yet */
	mux_consumed(agent->s, n);
	/* the relay did not know yet: its DATA keeps coming (the RST race) */
	for (int i = 0; i < 4; i++) {
		n = mux_build_data(f, sizeof(f), id, false, zero, sizeof(zero));
		CHECK(inject(agent, f, n));
		total += sizeof(zero);
	}
	CHECK(agent->errors == 0 && ts(agent, id)->recv == 0);
	/* 4 x 16 KiB dropped, each more than the session window /
	 * MUX_CREDIT_PARTS: a session WINDOW_UPDATE went out for each */
	CHECK(mux_session_recv_window(agent->s) == 128 * 1024);
	n = mux_pending(agent->s, &p);
	CHECK(n == 4 * (MUX_HEADER_LEN + 4));
	for (int i = 0; i < 4; i++, p += MUX_HEADER_LEN + 4)
		CHECK(p[0] == MUX_WINDOW_UPDATE && p[7] == 0);
	/* FIN on the dead stream too: ignored */
	n = mux_build_data(f, sizeof(f), id, true, zero, 10);
	CHECK(inject(agent, f, n) && agent->errors == 0 && ts(agent, id)->fins == 0);
	(void)total;
end:
	return pair_done(relay, agent, ok);
}

/* A stream reset while holding unconsumed bytes gives them back to the session. */
static bool test_reset_returns_held_credit(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id, id2, err;

	mux_settings_default(&as);
	as.session_window = 128 * 1024;
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	agent->auto_consume = false;
	id = relay_open(relay, "a", 0, &err);
	ts(relay, id)->to_send = 100 * 1024;
	mux_resume(relay->s, id);
	pump(relay, agent, 0);
	CHECK(ts(agent, id)->recv == 100 * 1024);
	CHECK(mux_session_recv_window(agent->s) == 28 * 1024);
	CHECK(mux_reset(agent->s, id, MUX_E_CANCEL));	/* its client went away */
	CHECK(mux_session_recv_window(agent->s) == 128 * 1024);
	pump(relay, agent, 0);
	CHECK(mux_session_send_window(relay->s) == 128 * 1024);
	/* and a new stream can use the whole session window again */
	id2 = relay_open(relay, "b", 0, &err);
	ts(relay, id2)->to_send = 128 * 1024;
	mux_resume(relay->s, id2);
	pump(relay, agent, 0);
	CHECK(ts(agent, id2)->recv == 128 * 1024 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* stream ids */

static bool test_stream_id_reuse(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t f[128];
	struct mux_open o;
	size_t n;
	static const int seqs[][3] = {
		{ 1, 1, 0 },		/* same id twice */
		{ 5, 3, 0 },		/* going down */
		{ 2, 0, 0 },		/* even: the relay opens odd ids */
	};

	memset(&o, 0, sizeof(o));
	strcpy(o.db_key, "app");
	for (size_t c = 0; c < sizeof(seqs) / sizeof(seqs[0]); c++) {
		bool failed = false;
		CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
		for (int i = 0; i < 3 && seqs[c][i]; i++) {
			n = mux_build_open(f, sizeof(f), (uint32_t)seqs[c][i], &o);
			if (!inject(agent, f, n))
				failed = true;
		}
		CHECK(failed && agent->error_code == MUX_E_PROTOCOL);
		side_free(relay);
		side_free(agent);
		relay = agent = NULL;
	}
	/* frames for a stream never opened: DATA, RST, WINDOW_UPDATE, OPEN_ACK */
	for (int k = 0; k < 4; k++) {
		CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
		switch (k) {
		case 0: n = mux_build_data(f, sizeof(f), 9, false, (const uint8_t *)"x", 1); break;
		case 1: n = mux_build_rst(f, sizeof(f), 9, MUX_E_CANCEL); break;
		case 2: n = mux_build_window_update(f, sizeof(f), 9, 100); break;
		default: n = mux_build_open_ack(f, sizeof(f), 9, 0); break;
		}
		CHECK(!inject(k == 3 ? relay : agent, f, n));
		CHECK((k == 3 ? relay : agent)->error_code == MUX_E_PROTOCOL);
		side_free(relay);
		side_free(agent);
		relay = agent = NULL;
	}
	/* OPEN sent to the relay, OPEN_ACK to the agent */
	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	n = mux_build_open(f, sizeof(f), 1, &o);
	CHECK(!inject(relay, f, n) && relay->error_code == MUX_E_PROTOCOL);
	n = mux_build_open(f, sizeof(f), 1, &o);
	CHECK(inject(agent, f, n));
	n = mux_build_open_ack(f, sizeof(f), 1, 0);
	CHECK(!inject(agent, f, n) && agent->error_code == MUX_E_PROTOCOL);
end:
	return pair_done(relay, agent, ok);
}

/* Raw frame: header fields as given, payload bytes as given. */
static size_t raw_frame(uint8_t *f, uint8_t type, uint8_t flags, uint32_t id, const uint8_t *p, uint32_t len)
{
	struct mux_header h = { type, flags, 0, id, len };

	mux_header_encode(f, &h);
	if (len)
		memcpy(f + MUX_HEADER_LEN, p, len);
	return MUX_HEADER_LEN + len;
}

/* The relay's side of a peer's rule breaking: stream 1 open, not acked. */
static bool test_relay_sees_agent_violations(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t f[128];
	uint32_t err;
	static const uint8_t zero4[4] = { 0 }, max4[4] = { 0x7f, 0xff, 0xff, 0xff };
	static const uint8_t goaway_hi[12] = { 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0 };
	enum { N_CASES = 7 };

	for (int k = 0; k < N_CASES; k++) {
		size_t n = 0;
		uint32_t want = MUX_E_PROTOCOL;
		CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
		CHECK(relay_open(relay, "app", 0, &err) == 1);
		switch (k) {
		case 0:	/* DATA before OPEN_ACK */
			n = mux_build_data(f, sizeof(f), 1, false, (const uint8_t *)"x", 1);
			break;
		case 1:	/* OPEN_ACK twice */
			CHECK(inject(relay, f, mux_build_open_ack(f, sizeof(f), 1, 0)));
			n = mux_build_open_ack(f, sizeof(f), 1, 0);
			break;
		case 2:	/* OPEN_ACK shrinking the window */
			n = mux_build_open_ack(f, sizeof(f), 1, 2048);
			break;
		case 3:	/* WINDOW_UPDATE of 0 */
			n = raw_frame(f, MUX_WINDOW_UPDATE, 0, 0, zero4, 4);
			break;
		case 4:	/* session window above 2^31-1 */
			n = raw_frame(f, MUX_WINDOW_UPDATE, 0, 0, max4, 4);
			want = MUX_E_FLOW_CONTROL;
			break;
		case 5:	/* stream window above 2^31-1 */
			CHECK(inject(relay, f, mux_build_open_ack(f, sizeof(f), 1, 0)));
			n = raw_frame(f, MUX_WINDOW_UPDATE, 0, 1, max4, 4);
			want = MUX_E_FLOW_CONTROL;
			break;
		default: /* GOAWAY naming a stream id above 2^31-1 */
			n = raw_frame(f, MUX_GOAWAY, 0, 0, goaway_hi, 12);
			break;
		}
		if (inject(relay, f, n) || relay->error_code != want) {
			fprintf(stderr, "  case %d: error %s, wanted %s\n", k, mux_error_name(relay->error_code),
				mux_error_name(want));
			ok = false;
		}
		CHECK(ts(relay, 1)->closes == 1 && ts(relay, 1)->close_code == want);
		side_free(relay);
		side_free(agent);
		relay = agent = NULL;
	}
end:
	return pair_done(relay, agent, ok);
}

/* The agent refuses a bad HELLO_ACK. */
static bool test_agent_refuses_bad_hello_ack(void)
{
	bool ok = true;
	struct side *agent = NULL;
	uint8_t f[256];
	struct mux_hello ack;
	static const uint8_t no_version[] = { 0, 7, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1 };

	for (int k = 0; k < 2; k++) {
		size_t n;
		agent = side_new(MUX_ROLE_AGENT, NULL);
		CHECK(agent && mux_hello(agent->s, "a", NULL, 0, now));
		if (k == 0) {
			memset(&ack, 0, sizeof(ack));
			ack.version = MUX_VERSION_MAX + 1;	/* not offered */
			mux_settings_default(&ack.settings);
			n = mux_build_hello_ack(f, sizeof(f), &ack);
		} else {
			n = raw_frame(f, MUX_HELLO_ACK, 0, 0, no_version, sizeof(no_version));
		}
		CHECK(!inject(agent, f, n) && agent->error_code == MUX_E_PROTOCOL && !mux_established(agent->s));
		side_free(agent);
		agent = NULL;
	}
end:
	side_free(agent);
	return ok;
}

static long cb_read_fails(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof,
			  void *stream_ud, void *ud)
{
	(void)s;
	(void)id;
	(void)dst;
	(void)max;
	(void)eof;
	(void)stream_ud;
	(void)ud;
	return -1;
}

/* A data source failing resets its stream (INTERNAL); a stale PING reply is
 * ignored; mux_session_abort() closes what is left. */
static bool test_owner_failures_and_abort(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_callbacks cb = callbacks;
	uint32_t a, b, err;
	uint8_t ping[MUX_HEADER_LEN + 8];
	const uint8_t stale[8] = { 1, 2, 3 };

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	cb.read_data = cb_read_fails;
	mux_session_free(agent->s);
	agent->s = mux_session_new(MUX_ROLE_AGENT, &agent->set, &cb, agent);
	mux_session_free(relay->s);
	relay->s = mux_session_new(MUX_ROLE_RELAY, &relay->set, &callbacks, relay);
	relay->hellos = agent->hello_acks = 0;
	CHECK(mux_hello(agent->s, "a", NULL, 0, now));
	pump(agent, relay, 0);
	CHECK(mux_established(agent->s));
	a = relay_open(relay, "app", 0, &err);
	b = relay_open(relay, "app", 0, &err);
	pump(relay, agent, 0);
	CHECK(mux_open_ack(agent->s, a, 0) && mux_resume(agent->s, a));
	pump(relay, agent, 0);
	CHECK(ts(agent, a)->closes == 1 && ts(agent, a)->close_code == MUX_E_INTERNAL);
	CHECK(ts(relay, a)->closes == 1 && ts(relay, a)->close_code == MUX_E_INTERNAL && ts(relay, a)->close_by_peer);
	CHECK(inject(agent, ping, mux_build_ping(ping, sizeof(ping), true, stale)) && agent->ping_acks == 0);
	mux_session_abort(relay->s, MUX_E_CANCEL);
	CHECK(ts(relay, b)->closes == 1 && ts(relay, b)->close_code == MUX_E_CANCEL && mux_failed(relay->s));
	CHECK(mux_stream_count(relay->s) == 0 && relay->errors == 0);
	CHECK(!mux_reset(relay->s, b, MUX_E_CANCEL));
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* GOAWAY */

static bool test_goaway_from_agent_refuses_unprocessed(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t ids[4], err;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	for (int i = 0; i < 3; i++)
		CHECK((ids[i] = relay_open(relay, "app", 0, &err)));
	pump(relay, agent, 0);
	CHECK(agent->opens == 3);
	/* OPEN 7 is in flight while the agent says GOAWAY */
	CHECK((ids[3] = relay_open(relay, "app", 0, &err)) == 7);
	CHECK(mux_goaway(agent->s, MUX_NO_ERROR, 0, "agent restart"));
	CHECK(mux_going_away(agent->s));
	transfer(agent, relay, 0);
	CHECK(relay->goaways == 1 && relay->goaway_last == 5);
	CHECK(ts(relay, 7)->closes == 1 && ts(relay, 7)->close_code == MUX_E_REFUSED && ts(relay, 7)->close_retryable);
	for (int i = 0; i < 3; i++)
		CHECK(ts(relay, ids[i])->closes == 0);
	CHECK(mux_open(relay->s, &(struct mux_open){ .db_key = "app" }, NULL, &err) == 0 && err == MUX_E_REFUSED);
	pump(relay, agent, 0);	/* OPEN 7 reaches the agent: refused, not opened */
	CHECK(agent->opens == 3 && relay->errors == 0 && agent->errors == 0);
	/* streams below last go on */
	ts(relay, 1)->to_send = 1000;
	ts(relay, 1)->send_fin = true;
	mux_resume(relay->s, 1);
	pump(relay, agent, 0);
	CHECK(ts(agent, 1)->recv == 1000 && ts(agent, 1)->fins == 1);
end:
	return pair_done(relay, agent, ok);
}

static bool test_goaway_relay_drain(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id, err;
	uint8_t f[64];
	size_t n;

	CHECK(pair_with_stream(&relay, &agent, &id));
	CHECK(mux_open_ack(agent->s, id, 0));
	CHECK(mux_goaway(relay->s, MUX_E_RELAY_RESTART, 0, "drain"));
	pump(relay, agent, 0);
	CHECK(agent->goaways == 1 && agent->goaway_code == MUX_E_RELAY_RESTART && agent->goaway_last == 0);
	CHECK(relay_open(relay, "app", 0, &err) == 0 && err == MUX_E_REFUSED);
	/* the open stream still works both ways */
	ts(agent, id)->to_send = 5000;
	mux_resume(agent->s, id);
	pump(relay, agent, 0);
	CHECK(ts(relay, id)->recv == 5000 && ts(relay, id)->closes == 0);
	/* a second GOAWAY may not raise the last id */
	n = mux_build_goaway(f, sizeof(f), 0, MUX_E_RELAY_RESTART, 0, NULL, 0);
	CHECK(inject(agent, f, n));
	n = mux_build_goaway(f, sizeof(f), 3, MUX_E_RELAY_RESTART, 0, NULL, 0);
	CHECK(!inject(agent, f, n) && agent->error_code == MUX_E_PROTOCOL);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* RST */

static bool test_rst_races(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id, id2, err;

	CHECK(pair_with_stream(&relay, &agent, &id));
	CHECK(mux_open_ack(agent->s, id, 0));
	pump(relay, agent, 0);
	/* both sides reset at once, with DATA in flight each way */
	ts(relay, id)->to_send = 50000;
	ts(agent, id)->to_send = 50000;
	mux_resume(relay->s, id);
	mux_resume(agent->s, id);
	{
		const uint8_t *pr, *pa;
		size_t nr = mux_pending(relay->s, &pr), na = mux_pending(agent->s, &pa);
		uint8_t *cr = malloc(nr), *ca = malloc(na);
		CHECK(cr && ca);
		memcpy(cr, pr, nr);
		memcpy(ca, pa, na);
		mux_consumed(relay->s, nr);
		mux_consumed(agent->s, na);
		CHECK(mux_reset(relay->s, id, MUX_E_CANCEL));
		CHECK(mux_reset(agent->s, id, MUX_E_CANCEL));
		CHECK(mux_feed(agent->s, cr, nr, now) && mux_feed(relay->s, ca, na, now));
		free(cr);
		free(ca);
	}
	pump(relay, agent, 0);
	CHECK(relay->errors == 0 && agent->errors == 0);
	CHECK(ts(relay, id)->closes == 1 && !ts(relay, id)->close_by_peer);
	CHECK(ts(agent, id)->closes == 1 && !ts(agent, id)->close_by_peer);
	CHECK(!mux_reset(relay->s, id, MUX_E_CANCEL));	/* gone */
	/* the session windows got everything back that was dropped */
	CHECK(mux_session_recv_window(agent->s) > MUX_SESSION_WINDOW_DEFAULT - 2 * 50000);

	/* reset from inside on_data, in the middle of a frame delivered byte by byte */
	id2 = relay_open(relay, "app", 0, &err);
	pump(relay, agent, 0);
	ts(agent, id2)->reset_on_data = true;
	ts(relay, id2)->to_send = 40000;
	mux_resume(relay->s, id2);
	pump(relay, agent, 1);
	CHECK(ts(agent, id2)->recv == 1 && ts(agent, id2)->closes == 1);
	CHECK(ts(relay, id2)->closes == 1 && ts(relay, id2)->close_code == MUX_E_CANCEL && ts(relay, id2)->close_by_peer);
	CHECK(relay->errors == 0 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

static bool test_data_after_fin(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id;
	uint8_t f[64];
	size_t n;

	CHECK(pair_with_stream(&relay, &agent, &id));
	n = mux_build_data(f, sizeof(f), id, true, (const uint8_t *)"ab", 2);
	CHECK(inject(agent, f, n) && ts(agent, id)->fins == 1);
	n = mux_build_data(f, sizeof(f), id, false, (const uint8_t *)"cd", 2);
	CHECK(inject(agent, f, n));	/* a stream error, not a session error */
	CHECK(agent->errors == 0 && ts(agent, id)->closes == 1 && ts(agent, id)->close_code == MUX_E_PROTOCOL);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* heartbeat */

static bool test_ping_liveness(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint64_t next;

	now = 1000;
	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	next = mux_tick(agent->s, now);
	CHECK(next == 1000 + MUX_PING_INTERVAL_MS);
	now = next;
	mux_tick(agent->s, now);	/* queues a PING */
	mux_tick(relay->s, now);
	now += 7;			/* the answer takes 7 ms */
	transfer(agent, relay, 0);
	transfer(relay, agent, 0);
	CHECK(agent->ping_acks == 1 && agent->rtt == 7);
	/* silence: the agent heard last at 11007; dead 30 s later, not before */
	now = 11007 + MUX_DEAD_AFTER_MS - 1;
	mux_tick(agent->s, now);
	CHECK(agent->errors == 0);
	now++;
	mux_tick(agent->s, now);
	CHECK(agent->errors == 1 && agent->error_code == MUX_E_TIMEOUT && mux_failed(agent->s));
	/* the relay heard the agent's PING at 11007 and nothing since */
	now = 11007 + MUX_DEAD_AFTER_MS - 1;
	mux_tick(relay->s, now);
	CHECK(relay->errors == 0);
	now++;
	mux_tick(relay->s, now);
	CHECK(relay->errors == 1 && relay->error_code == MUX_E_TIMEOUT);
end:
	now = 0;
	side_free(relay);
	side_free(agent);
	return ok;
}

/* A PING reply jumps ahead of DATA the scheduler has not produced yet. */
static bool test_ping_reply_not_behind_data(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t id, err;
	const uint8_t *p;
	size_t n1, n2;
	uint8_t ping[MUX_HEADER_LEN + 8];
	const uint8_t opaque[8] = { 7, 7, 7, 7, 7, 7, 7, 7 };
	struct mux_header h;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	id = relay_open(relay, "app", 0, &err);
	ts(relay, id)->to_send = 3u << 20;
	mux_resume(relay->s, id);
	n1 = mux_pending(relay->s, &p);	/* the transport is slow: nothing consumed */
	CHECK(n1 >= MUX_OUT_FILL && n1 < MUX_OUT_FILL + MUX_FRAME_DEFAULT + 2 * MUX_HEADER_LEN + 64);
	CHECK(inject(relay, ping, mux_build_ping(ping, sizeof(ping), false, opaque)));
	n2 = mux_pending(relay->s, &p);
	CHECK(n2 == n1 + sizeof(ping));	/* only the reply was added */
	mux_header_decode(p + n1, &h);
	CHECK(h.type == MUX_PING && h.flags == MUX_FLAG_ACK && memcmp(p + n1 + 12, opaque, 8) == 0);
end:
	return pair_done(relay, agent, ok);
}

/* A peer that floods PINGs and never reads its replies hits a bound. */
static bool test_control_flood(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t ping[MUX_HEADER_LEN + 8];
	const uint8_t opaque[8] = { 0 };
	int i;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	mux_build_ping(ping, sizeof(ping), false, opaque);
	for (i = 0; i < 100000 && mux_feed(relay->s, ping, sizeof(ping), now); i++)
		;
	CHECK(i < 100000 && relay->error_code == MUX_E_ENHANCE_YOUR_CALM);
	CHECK(i >= MUX_CONTROL_QUEUE_MAX / (int)sizeof(ping) - 1);
end:
	return pair_done(relay, agent, ok);
}

/* ------------------------------------------------------------------------- */
/* scheduling */

static bool test_round_robin(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t a, b, err;
	const uint8_t *p;
	size_t n, off = 0;
	struct mux_header h;
	const uint8_t *pl;
	uint32_t last = 0;
	int frames = 0, alternations = 0;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	a = relay_open(relay, "a", 0, &err);
	b = relay_open(relay, "b", 0, &err);
	ts(relay, a)->to_send = 1u << 20;
	ts(relay, b)->to_send = 1u << 20;
	mux_resume(relay->s, a);
	mux_resume(relay->s, b);
	n = mux_pending(relay->s, &p);
	while (next_frame(p, n, &off, &h, &pl)) {
		if (h.type != MUX_DATA)
			continue;
		CHECK(h.length <= MUX_FRAME_DEFAULT);
		if (last && h.stream_id != last)
			alternations++;
		last = h.stream_id;
		frames++;
	}
	CHECK(frames >= 4 && alternations == frames - 1);
end:
	return pair_done(relay, agent, ok);
}

/* One stalled stream (its client never reads) does not hold up another. */
static bool test_stalled_stream_does_not_block(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t stalled, busy, err;

	small_settings(&as);
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	stalled = relay_open(relay, "a", 0, &err);
	busy = relay_open(relay, "b", 0, &err);
	pump(relay, agent, 0);
	agent->auto_consume = false;
	ts(relay, stalled)->to_send = 4u << 20;
	ts(relay, busy)->to_send = 4u << 20;
	ts(relay, busy)->send_fin = true;
	mux_resume(relay->s, stalled);
	mux_resume(relay->s, busy);
	for (int round = 0; round < 1000 && ts(agent, busy)->fins == 0; round++) {
		pump(relay, agent, 0);
		/* only the busy stream's reader writes onward */
		mux_stream_consumed(agent->s, busy, ts(agent, busy)->recv - ts(agent, busy)->consumed);
		ts(agent, busy)->consumed = ts(agent, busy)->recv;
	}
	CHECK(ts(agent, busy)->recv == 4u << 20 && ts(agent, busy)->fins == 1 && !ts(agent, busy)->bad_byte);
	CHECK(ts(agent, stalled)->recv == SMALL_WINDOW);
	CHECK(relay->errors == 0 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

static bool test_max_streams(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t ids[4], err;
	uint8_t f[64];
	struct mux_open o;
	const uint8_t *p;
	size_t n;

	mux_settings_default(&as);
	as.max_streams = 4;
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	for (int i = 0; i < 4; i++)
		CHECK((ids[i] = relay_open(relay, "app", 0, &err)));
	CHECK(relay_open(relay, "app", 0, &err) == 0 && err == MUX_E_STREAM_LIMIT);
	pump(relay, agent, 0);
	CHECK(agent->opens == 4 && mux_stream_count(agent->s) == 4);
	CHECK(mux_reset(relay->s, ids[0], MUX_E_CANCEL));
	pump(relay, agent, 0);
	CHECK(mux_stream_count(relay->s) == 3 && mux_stream_count(agent->s) == 3);
	CHECK(relay_open(relay, "app", 0, &err) == 9);
	pump(relay, agent, 0);
	CHECK(agent->opens == 5);
	/* a relay that ignores the limit gets RST(STREAM_LIMIT), not a session error */
	memset(&o, 0, sizeof(o));
	strcpy(o.db_key, "app");
	n = mux_build_open(f, sizeof(f), 101, &o);
	CHECK(inject(agent, f, n));
	CHECK(agent->opens == 5 && agent->errors == 0);
	n = mux_pending(agent->s, &p);
	CHECK(n == 16 && p[0] == MUX_RST && p[7] == 101 && p[15] == MUX_E_STREAM_LIMIT);
end:
	return pair_done(relay, agent, ok);
}

/* Rounds of 2048 streams (the default max_streams) opened, used, half-closed
 * or reset in a mixed order, then all gone on both sides. */
static bool test_stream_churn(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint32_t first = 0, id = 0, err;
	unsigned seed = 12345;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < MUX_MAX_STREAMS_DEFAULT; i++) {
			CHECK((id = relay_open(relay, "app", 0, &err)));
			if (i == 0)
				first = id;
			ts(relay, id)->to_send = 100 + (size_t)(i % 7) * 700;
			ts(relay, id)->send_fin = true;
			mux_resume(relay->s, id);
		}
		CHECK(relay_open(relay, "app", 0, &err) == 0 && err == MUX_E_STREAM_LIMIT);
		pump(relay, agent, 0);
		for (uint32_t sid = first; sid <= id; sid += 2) {
			seed = seed * 1103515245u + 12345u;
			if ((seed >> 16) % 5 == 0) {
				CHECK(mux_reset(agent->s, sid, MUX_E_CANCEL));
				continue;
			}
			CHECK(mux_open_ack(agent->s, sid, 0));
			ts(agent, sid)->to_send = (seed >> 8) % 3000;
			ts(agent, sid)->send_fin = true;
			CHECK(mux_resume(agent->s, sid));
		}
		pump(relay, agent, 0);
		CHECK(mux_stream_count(relay->s) == 0 && mux_stream_count(agent->s) == 0);
		for (uint32_t sid = first; sid <= id; sid += 2) {
			struct tstream *r = ts(relay, sid), *a = ts(agent, sid);
			CHECK(r->closes == 1 && a->closes == 1 && !r->bad_byte && !a->bad_byte);
			CHECK(r->close_code == MUX_NO_ERROR ? (r->recv == a->to_send && a->recv == r->to_send)
							    : (r->close_code == MUX_E_CANCEL && r->close_by_peer));
		}
	}
	CHECK(relay->errors == 0 && agent->errors == 0);
	CHECK(relay->total_closes == 3 * MUX_MAX_STREAMS_DEFAULT && agent->total_closes == relay->total_closes);
end:
	return pair_done(relay, agent, ok);
}

/* The OPEN and OPEN_ACK windows move the per-stream credit. */
static bool test_per_stream_windows(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	struct mux_settings as;
	uint32_t id, err;

	small_settings(&as);
	CHECK(pair_up(&relay, &agent, NULL, &as, 0));
	agent->auto_consume = false;
	relay->auto_consume = false;
	id = relay_open(relay, "app", 256 * 1024, &err);
	CHECK(id);
	pump(relay, agent, 0);
	CHECK(mux_stream_send_window(agent->s, id) == 256 * 1024);
	CHECK(mux_stream_recv_window(agent->s, id) == SMALL_WINDOW);
	CHECK(!mux_open_ack(agent->s, id, SMALL_WINDOW - 1));	/* may only grow */
	CHECK(mux_open_ack(agent->s, id, 2 * SMALL_WINDOW));
	pump(relay, agent, 0);
	CHECK(mux_stream_send_window(relay->s, id) == 2 * SMALL_WINDOW);
	ts(relay, id)->to_send = 1u << 20;
	ts(agent, id)->to_send = 1u << 20;
	mux_resume(relay->s, id);
	mux_resume(agent->s, id);
	pump(relay, agent, 0);
	CHECK(ts(agent, id)->recv == 2 * SMALL_WINDOW);
	CHECK(ts(relay, id)->recv == 256 * 1024);
	CHECK(relay->errors == 0 && agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

static bool test_unknown_frame_skipped(void)
{
	bool ok = true;
	struct side *relay = NULL, *agent = NULL;
	uint8_t f[MUX_HEADER_LEN + 100];
	struct mux_header h = { 0x33, 0x7, 0, 0, 100 };
	uint8_t ping[MUX_HEADER_LEN + 8];
	const uint8_t opaque[8] = { 1 };
	const uint8_t *p;

	CHECK(pair_up(&relay, &agent, NULL, NULL, 0));
	mux_header_encode(f, &h);
	memset(f + MUX_HEADER_LEN, 0xff, 100);	/* looks like nothing valid */
	CHECK(inject(agent, f, sizeof(f)));
	CHECK(inject(agent, ping, mux_build_ping(ping, sizeof(ping), false, opaque)));
	CHECK(mux_pending(agent->s, &p) == sizeof(ping) && p[0] == MUX_PING && p[1] == MUX_FLAG_ACK);
	CHECK(agent->errors == 0);
end:
	return pair_done(relay, agent, ok);
}

static bool test_settings_checks(void)
{
	bool ok = true;
	struct mux_settings st;
	const char *err;

	mux_settings_default(&st);
	CHECK(mux_settings_check(&st, &err) && err == NULL);
	CHECK(st.stream_window == 4u << 20 && st.max_streams == 2048 && st.max_frame == 16384);
	st.max_frame = MUX_FRAME_CAP + 1;
	CHECK(!mux_settings_check(&st, &err) && err);
	mux_settings_default(&st);
	st.dead_after_ms = st.ping_interval_ms;
	CHECK(!mux_settings_check(&st, &err));
	mux_settings_default(&st);
	st.stream_window = MUX_WINDOW_MIN - 1;
	CHECK(!mux_settings_check(&st, &err));
	CHECK(mux_session_new(MUX_ROLE_AGENT, &st, &callbacks, NULL) == NULL);
end:
	return ok;
}

static const struct unit_case cases[] = {
	{ "header round trip", test_header_round_trip },
	{ "frame builders and parsers round trip", test_frames_round_trip },
	{ "malformed headers are refused", test_header_checks },
	{ "a bad header fails the session before its payload", test_bad_header_fails_session },
	{ "every malformed header fails a session", test_bad_headers_fail_sessions },
	{ "malformed TLV payloads are refused", test_tlv_checks },
	{ "settings ranges", test_settings_checks },
	{ "handshake exchanges settings", test_handshake },
	{ "handshake errors", test_handshake_errors },
	{ "a stream carries data both ways and closes", test_stream_exchange },
	{ "split feeds byte by byte", test_split_feeds_byte_by_byte },
	{ "an OPEN refused by the agent", test_open_refused_by_agent },
	{ "window exhaustion and batched credit", test_window_exhaustion_and_credit },
	{ "DATA beyond the stream window: FLOW_CONTROL", test_stream_window_breach },
	{ "DATA beyond the session window: FLOW_CONTROL", test_session_window_breach },
	{ "DATA for a closed stream is credited", test_closed_stream_data_credited },
	{ "a reset stream returns its unread bytes to the session", test_reset_returns_held_credit },
	{ "stream id reuse and idle streams", test_stream_id_reuse },
	{ "the relay fails an agent that breaks the rules", test_relay_sees_agent_violations },
	{ "the agent refuses a bad HELLO_ACK", test_agent_refuses_bad_hello_ack },
	{ "owner failures and mux_session_abort", test_owner_failures_and_abort },
	{ "GOAWAY from the agent refuses unprocessed opens", test_goaway_from_agent_refuses_unprocessed },
	{ "GOAWAY from the relay drains", test_goaway_relay_drain },
	{ "RST races", test_rst_races },
	{ "DATA after FIN resets the stream", test_data_after_fin },
	{ "ping liveness", test_ping_liveness },
	{ "a PING reply does not wait behind DATA", test_ping_reply_not_behind_data },
	{ "a control frame flood is bounded", test_control_flood },
	{ "round-robin scheduling", test_round_robin },
	{ "a stalled stream does not block another", test_stalled_stream_does_not_block },
	{ "max_streams", test_max_streams },
	{ "2048 streams of churn, three rounds", test_stream_churn },
	{ "per-stream windows in OPEN and OPEN_ACK", test_per_stream_windows },
	{ "unknown frame types are skipped", test_unknown_frame_skipped },
	{ NULL, NULL }
};

UNIT_MAIN("mux", cases)
