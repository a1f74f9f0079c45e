/* SPDX-License-Identifier: ISC */
/*
 * mux.c -- the tunnel multiplexer's session and stream state machine (wire
 * format v1, doc/tunnel.md; the frame codec is mux_codec.c). Shared by the
 * relay and agent plugins, linked into the unit tests and the fuzz target.
 * Pure C: no I/O, no clock, no libevent; the owner feeds bytes in and takes
 * bytes out (mux.h).
 *
 * What it owns: the session, its streams (a hash by id, a ready ring for the
 * scheduler, a list of streams closed during the current call), the decoder
 * state (a 12-byte header and at most MUX_CONTROL_MAX bytes of control
 * payload; DATA is never buffered), the control queue and the output buffer.
 *
 * Invariants callers rely on:
 * - Every header is checked (mux_header_check) before a byte of its payload
 *   is looked at; a frame is never read past its `length`.
 * - Windows: DATA is counted against the stream and session windows at its
 *   header, whole; a peer exceeding either fails the session (FLOW_CONTROL).
 *   Credit goes back only through mux_stream_consumed() (or, for bytes the
 *   owner never saw, at once), in batches of at least window / MUX_CREDIT_PARTS.
 * - A stream's outstanding received bytes are credited to the session when
 *   it closes, so a reset stream never leaks session window.
 * - Control frames go to the transport before any DATA produced after them;
 *   the DATA already in the output buffer is at most about MUX_OUT_FILL.
 * - Streams are freed, and on_stream_close() reported, only when the
 *   outermost mux call returns (s->depth), so callbacks may reset streams.
 *
 * Do not add I/O, timers or environment reads here: the plugins own those.
 *
 * Index: session objects, buffers, streams, sending (control queue,
 * credit, the scheduler), receiving (control frames, then headers and DATA),
 * the public session calls, inspection.
 */
#include "mux.h"
#include "mux_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

/* ------------------------------------------------------------------------- */
/* session objects */

enum handshake {
	HS_START,		/* agent: mux_hello() not called yet */
	HS_PREFACE,		/* relay: reading the 8 preface bytes */
	HS_HELLO,		/* relay: the first frame must be HELLO */
	HS_WAIT_ACCEPT,		/* relay: HELLO reported, mux_accept() not called */
	HS_WAIT_ACK,		/* agent: HELLO sent, waiting for HELLO_ACK */
	HS_DONE,
};

struct mux_stream {
	uint32_t id;
	uint8_t state;			/* enum mux_stream_state */
	bool acked;			/* OPEN_ACK sent (agent) or received (relay) */
	bool fin_sent, fin_recv;
	bool ready;			/* on the ready ring */
	bool blocked;			/* has data, no stream credit */
	uint32_t close_code;
	bool close_by_peer, close_retryable;
	int64_t send_window;		/* what we may still send */
	int64_t recv_window;		/* what the peer may still send */
	uint32_t recv_max;		/* our window for this stream */
	uint64_t recv_owed;		/* consumed, not yet credited to the stream */
	uint64_t recv_held;		/* counted against the windows, not yet consumed */
	void *ud;
	struct mux_stream *hnext;
	TAILQ_ENTRY(mux_stream) ring;
	struct mux_stream *cnext;	/* closed list */
};

TAILQ_HEAD(stream_ring, mux_stream);

struct bytes {
	uint8_t *p;
	size_t off, len, cap;		/* live bytes are p[off .. off+len) */
};

struct mux_session {
	enum mux_role role;
	enum handshake hs;
	struct mux_settings local, peer;
	struct mux_callbacks cb;
	void *ud;
	uint16_t version;

	bool failed, goaway_sent, goaway_recv;
	uint32_t goaway_recv_last;
	uint32_t last_peer_id;		/* agent: highest OPEN id seen */
	uint32_t next_id;		/* relay: the next id mux_open() uses */

	/* decoder */
	size_t preface_got;
	uint8_t hdr[MUX_HEADER_LEN];
	size_t hdr_len;
	struct mux_header h;
	bool in_payload;
	uint32_t remaining;		/* payload bytes still to come */
	bool skip;			/* payload is dropped (unknown type, dead stream) */
	uint8_t ctl[MUX_CONTROL_MAX];
	size_t ctl_len;

	/* flow control */
	int64_t send_window, recv_window;
	uint64_t recv_owed;

	/* streams */
	struct mux_stream **buckets;
	uint32_t mask;
	unsigned n_active;		/* not yet CLOSED */
	unsigned n_alloc;		/* in the hash (CLOSED ones until reaped) */
	struct stream_ring ready;
	struct mux_stream *closed;

	/* output: control frames wait in ctlq, out is what mux_pending() shows */
	struct bytes ctlq, out;

	/* heartbeat */
	bool clock_started;
	uint64_t last_inbound, last_ping;
	bool ping_out;
	uint8_t ping_opaque[8];

	int depth;			/* nested mux calls; reaping waits for 0 */
};

/* ------------------------------------------------------------------------- */
/* byte buffers */

static bool bytes_reserve(struct bytes *b, size_t n)
{
	size_t need;
	uint8_t *p;

	if (b->off && b->cap - b->off - b->len < n) {
		memmove(b->p, b->p + b->off, b->len);
		b->off = 0;
	}
	need = b->len + n;
	if (need <= b->cap)
		return true;
	need = need < 2 * b->cap ? 2 * b->cap : need;
	p = realloc(b->p, need);
	if (!p)
		return false;
	b->p = p;
	b->cap = need;
	return true;
}

static uint8_t *bytes_tail(struct bytes *b)
{
	return b->p + b->off + b->len;
}

static void bytes_free(struct bytes *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------------------- */
/* streams */

static void reap(struct mux_session *s);

static void enter(struct mux_session *s)
{
	s->depth++;
}

static void leave(struct mux_session *s)
{
	if (s->depth == 1)
		reap(s);
	s->depth--;
}

static struct mux_stream *stream_find(const struct mux_session *s, uint32_t id)
{
	struct mux_stream *st;

	for (st = s->buckets[(id >> 1) & s->mask]; st; st = st->hnext)
		if (st->id == id)
			return st;
	return NULL;
}

/* A stream that is not CLOSED. */
static struct mux_stream *stream_live(const struct mux_session *s, uint32_t id)
{
	struct mux_stream *st = stream_find(s, id);

	return st && st->state != MUX_ST_CLOSED ? st : NULL;
}

/* Was id ever opened on this session? (Else it is idle: frames for it are a protocol error.) */
static bool stream_was_opened(const struct mux_session *s, uint32_t id)
{
	uint32_t highest = s->role == MUX_ROLE_RELAY ? (s->next_id > 1 ? s->next_id - 2 : 0) : s->last_peer_id;

	return (id & 1) && id <= highest;
}

/*
 * The stream table grows with the streams in it (one bucket per stream at
 * most), from 16 buckets: a session sized for max_streams from the start
 * (2048 by default, 16 KiB) would cost an idle agent's relay more than all
 * its other state. A failed growth keeps the table as it is: longer chains.
 */
static void stream_table_grow(struct mux_session *s)
{
	uint32_t nb = (s->mask + 1) * 2, nmask = nb - 1;
	struct mux_stream **nbk, *st, *next;

	if (s->mask + 1 >= MUX_MAX_STREAMS_CAP || !(nbk = calloc(nb, sizeof(*nbk))))
		return;
	for (uint32_t b = 0; b <= s->mask; b++)
		for (st = s->buckets[b]; st; st = next) {
			next = st->hnext;
			st->hnext = nbk[(st->id >> 1) & nmask];
			nbk[(st->id >> 1) & nmask] = st;
		}
	free(s->buckets);
	s->buckets = nbk;
	s->mask = nmask;
}

static struct mux_stream *stream_new(struct mux_session *s, uint32_t id, uint32_t recv_max, int64_t send_window)
{
	struct mux_stream *st = calloc(1, sizeof(*st));
	uint32_t b;

	if (!st)
		return NULL;
	if (s->n_alloc + 1 > s->mask + 1)
		stream_table_grow(s);
	b = (id >> 1) & s->mask;
	st->id = id;
	st->state = MUX_ST_OPEN;
	st->recv_max = recv_max;
	st->recv_window = recv_max;
	st->send_window = send_window;
	st->hnext = s->buckets[b];
	s->buckets[b] = st;
	s->n_active++;
	s->n_alloc++;
	return st;
}

static void stream_unhash(struct mux_session *s, struct mux_stream *st)
{
	struct mux_stream **pp = &s->buckets[(st->id >> 1) & s->mask];

	while (*pp && *pp != st)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = st->hnext;
	s->n_alloc--;
}

static void ready_add(struct mux_session *s, struct mux_stream *st)
{
	if (st->ready || st->state == MUX_ST_CLOSED || st->fin_sent)
		return;
	st->ready = true;
	TAILQ_INSERT_TAIL(&s->ready, st, ring);
}

static void ready_remove(struct mux_session *s, struct mux_stream *st)
{
	if (!st->ready)
		return;
	st->ready = false;
	TAILQ_REMOVE(&s->ready, st, ring);
}

static void queue_window_update(struct mux_session *s, uint32_t id, uint64_t inc);
static void maybe_credit_session(struct mux_session *s);

/*
 * Close a stream now (it is freed, and on_stream_close reported, when the
 * outermost mux call returns). What it still held of the session window is
 * returned to the peer.
 */
static void stream_close(struct mux_session *s, struct mux_stream *st, uint32_t code, bool by_peer,
			 bool retryable)
{
	if (st->state == MUX_ST_CLOSED)
		return;
	st->state = MUX_ST_CLOSED;
	st->close_code = code;
	st->close_by_peer = by_peer;
	st->close_retryable = retryable;
	ready_remove(s, st);
	st->blocked = false;
	s->recv_owed += st->recv_held;
	st->recv_held = 0;
	s->n_active--;
	st->cnext = s->closed;
	s->closed = st;
	maybe_credit_session(s);
}

/* A FIN went one way: the stream half-closes, or closes if both went. */
static void stream_fin(struct mux_session *s, struct mux_stream *st, bool local)
{
	if (local)
		st->fin_sent = true;
	else
		st->fin_recv = true;
	if (st->fin_sent && st->fin_recv)
		stream_close(s, st, MUX_NO_ERROR, false, false);
	else
		st->state = local ? MUX_ST_HALF_CLOSED_LOCAL : MUX_ST_HALF_CLOSED_REMOTE;
}

static void reap(struct mux_session *s)
{
	struct mux_stream *st;

	while ((st = s->closed)) {
		s->closed = st->cnext;
		stream_unhash(s, st);
		if (s->cb.on_stream_close)
			s->cb.on_stream_close(s, st->id, st->close_code, st->close_by_peer, st->close_retryable,
					      st->ud, s->ud);
		free(st);
	}
}

/* Every stream matching (all, or above `above`) closes with code. */
static void close_streams(struct mux_session *s, uint32_t above, uint32_t code, bool by_peer, bool retryable)
{
	for (uint32_t b = 0; b <= s->mask; b++)
		for (struct mux_stream *st = s->buckets[b]; st; st = st->hnext)
			if (st->id > above)
				stream_close(s, st, code, by_peer, retryable);
}

/* ------------------------------------------------------------------------- */
/* sending */

static bool fail(struct mux_session *s, uint32_t code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Append a built frame to the control queue. */
static bool queue_ctl(struct mux_session *s, const uint8_t *frame, size_t len)
{
	if (!len)
		return false;
	if (s->ctlq.len + len > MUX_CONTROL_QUEUE_MAX && !s->failed) {
		fail(s, MUX_E_ENHANCE_YOUR_CALM, "control queue over %d bytes: the peer sends control frames faster than it reads",
		     MUX_CONTROL_QUEUE_MAX);
		return false;
	}
	if (!bytes_reserve(&s->ctlq, len)) {
		if (!s->failed)
			fail(s, MUX_E_INTERNAL, "out of memory");
		return false;
	}
	memcpy(bytes_tail(&s->ctlq), frame, len);
	s->ctlq.len += len;
	return true;
}

static bool queue_rst(struct mux_session *s, uint32_t id, uint32_t code)
{
	uint8_t f[MUX_HEADER_LEN + 4];

	return queue_ctl(s, f, mux_build_rst(f, sizeof(f), id, code));
}

static void queue_window_update(struct mux_session *s, uint32_t id, uint64_t inc)
{
	uint8_t f[MUX_HEADER_LEN + 4];

	while (inc) {
		uint32_t n = inc > MUX_WINDOW_MAX ? MUX_WINDOW_MAX : (uint32_t)inc;
		queue_ctl(s, f, mux_build_window_update(f, sizeof(f), id, n));
		inc -= n;
	}
}

static void queue_goaway(struct mux_session *s, uint32_t code, uint32_t reconnect_ms, const char *debug)
{
	uint8_t f[MUX_HEADER_LEN + 12 + MUX_GOAWAY_DEBUG_MAX];
	uint32_t last = s->role == MUX_ROLE_AGENT ? s->last_peer_id : 0;

	queue_ctl(s, f, mux_build_goaway(f, sizeof(f), last, code, reconnect_ms, debug, debug ? strlen(debug) : 0));
	s->goaway_sent = true;
}

/*
 * The session fails: GOAWAY(code) is queued, every stream closes with code,
 * on_session_error is reported. Nothing is read or scheduled afterwards.
 */
static bool fail(struct mux_session *s, uint32_t code, const char *fmt, ...)
{
	char msg[MUX_GOAWAY_DEBUG_MAX];
	va_list ap;

	if (s->failed)
		return false;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->failed = true;
	queue_goaway(s, code, 0, msg);
	close_streams(s, 0, code, false, false);
	if (s->cb.on_session_error)
		s->cb.on_session_error(s, code, msg, s->ud);
	return false;
}

/*
 * Return credit once a sixteenth of a window is owed. What stays owed
 * below the threshold is held back until more DATA arrives and is written
 * onward, so a sender that sends all its credit keeps only window -
 * threshold in flight: with half a window (the yamux/smux threshold) a bulk
 * stream settled at half of window / RTT (each burst left just under half a
 * window owed, credited only with the next burst, a round trip later).
 * With a sixteenth it keeps at least 15/16 of the window in flight, for one
 * WINDOW_UPDATE frame per sixteenth of a window (measured at 40 ms RTT, 1
 * MiB window: an eighth gave 79-82 %, a sixteenth 87-90 %).
 */
static void maybe_credit_session(struct mux_session *s)
{
	if (s->failed || s->recv_owed < s->local.session_window / MUX_CREDIT_PARTS)
		return;
	queue_window_update(s, 0, s->recv_owed);
	s->recv_window += (int64_t)s->recv_owed;
	s->recv_owed = 0;
}

static void maybe_credit_stream(struct mux_session *s, struct mux_stream *st)
{
	if (s->failed || st->fin_recv || st->recv_owed < st->recv_max / MUX_CREDIT_PARTS)
		return;
	queue_window_update(s, st->id, st->recv_owed);
	st->recv_window += (int64_t)st->recv_owed;
	st->recv_owed = 0;
}

/* Move the control queue to the output, ahead of any DATA produced after it. */
static bool flush_ctl(struct mux_session *s)
{
	if (!s->ctlq.len)
		return true;
	if (!bytes_reserve(&s->out, s->ctlq.len))
		return false;
	memcpy(bytes_tail(&s->out), s->ctlq.p + s->ctlq.off, s->ctlq.len);
	s->out.len += s->ctlq.len;
	s->ctlq.off = s->ctlq.len = 0;
	return true;
}

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

/*
 * One scheduler turn for the stream at the head of the ready ring: ask the
 * owner for up to the credit it has (max_frame, stream and session windows)
 * and append a DATA frame. Returns false when the session has no credit left.
 */
static bool send_turn(struct mux_session *s, struct mux_stream *st)
{
	size_t max;
	bool eof = false;
	long n;
	struct mux_header h = { MUX_DATA, 0, 0, st->id, 0 };

	if (st->send_window <= 0) {
		st->blocked = true;
		ready_remove(s, st);
		return true;
	}
	if (s->send_window <= 0)
		return false;
	max = min_size(s->peer.max_frame, (size_t)st->send_window);
	max = min_size(max, (size_t)s->send_window);
	if (!bytes_reserve(&s->out, MUX_HEADER_LEN + max)) {
		fail(s, MUX_E_INTERNAL, "out of memory");
		return false;
	}
	n = s->cb.read_data ? s->cb.read_data(s, st->id, bytes_tail(&s->out) + MUX_HEADER_LEN, max, &eof,
					      st->ud, s->ud) : -1;
	if (s->failed || st->state == MUX_ST_CLOSED || st->fin_sent)
		return !s->failed;	/* reset (or failed) from inside the callback */
	if (n < 0 || (size_t)n > max) {
		queue_rst(s, st->id, MUX_E_INTERNAL);
		stream_close(s, st, MUX_E_INTERNAL, false, false);
		return true;
	}
	if (n == 0 && !eof) {
		ready_remove(s, st);	/* parked until mux_resume() */
		return true;
	}
	h.flags = eof ? MUX_FLAG_FIN : 0;
	h.length = (uint32_t)n;
	mux_header_encode(bytes_tail(&s->out), &h);
	s->out.len += MUX_HEADER_LEN + (size_t)n;
	st->send_window -= n;
	s->send_window -= n;
	if (eof) {
		ready_remove(s, st);
		stream_fin(s, st, true);
	} else if (st->ready) {
		TAILQ_REMOVE(&s->ready, st, ring);	/* round-robin: to the back */
		TAILQ_INSERT_TAIL(&s->ready, st, ring);
	}
	return true;
}

/* Produce DATA until MUX_OUT_FILL bytes wait, or nothing can be sent. */
static void schedule(struct mux_session *s)
{
	struct mux_stream *st;

	while (!s->failed && s->hs == HS_DONE && s->out.len < MUX_OUT_FILL && (st = TAILQ_FIRST(&s->ready))) {
		if (!flush_ctl(s) || !send_turn(s, st))
			break;
	}
}

/* ------------------------------------------------------------------------- */
/* receiving: control frames */

static bool on_window_update(struct mux_session *s, uint32_t id, uint32_t inc)
{
	struct mux_stream *st;

	if (inc == 0 || inc > MUX_WINDOW_MAX)
		return fail(s, MUX_E_PROTOCOL, "WINDOW_UPDATE increment %u out of range", inc);
	if (id == 0) {
		s->send_window += inc;
		if (s->send_window > MUX_WINDOW_MAX)
			fail(s, MUX_E_FLOW_CONTROL, "session window above 2^31-1");
		return true;
	}
	if (!(st = stream_live(s, id))) {
		if (!stream_was_opened(s, id))
			fail(s, MUX_E_PROTOCOL, "WINDOW_UPDATE for idle stream %u", id);
		return true;		/* closed: the race is normal */
	}
	st->send_window += inc;
	if (st->send_window > MUX_WINDOW_MAX)
		return fail(s, MUX_E_FLOW_CONTROL, "stream %u window above 2^31-1", id);
	if (st->blocked && st->send_window > 0) {
		st->blocked = false;
		ready_add(s, st);
	}
	return true;
}

static bool on_open_frame(struct mux_session *s, uint32_t id, const uint8_t *p, size_t len)
{
	struct mux_open o;
	struct mux_stream *st;
	const char *why;
	uint32_t code;

	if (s->role != MUX_ROLE_AGENT)
		return fail(s, MUX_E_PROTOCOL, "OPEN sent to the relay");
	if (!(id & 1) || id <= s->last_peer_id)
		return fail(s, MUX_E_PROTOCOL, "OPEN stream id %u reused or not increasing (last %u)", id,
			    s->last_peer_id);
	if (mux_parse_open(p, len, &o, &why) != MUX_NO_ERROR)
		return fail(s, MUX_E_PROTOCOL, "bad OPEN on stream %u: %s", id, why);
	s->last_peer_id = id;
	if (s->goaway_sent)
		return queue_rst(s, id, MUX_E_REFUSED);
	if (s->n_active >= s->local.max_streams)
		return queue_rst(s, id, MUX_E_STREAM_LIMIT);
	st = stream_new(s, id, s->local.stream_window, o.window ? o.window : s->peer.stream_window);
	if (!st)
		return queue_rst(s, id, MUX_E_INTERNAL);
	code = s->cb.on_open ? s->cb.on_open(s, id, &o, &st->ud, s->ud) : MUX_E_REFUSED;
	if (code != MUX_NO_ERROR && st->state != MUX_ST_CLOSED) {
		/* refused: gone without a close report (the owner never took it) */
		queue_rst(s, id, code);
		ready_remove(s, st);
		s->recv_owed += st->recv_held;
		s->n_active--;
		stream_unhash(s, st);
		free(st);
	}
	return true;
}

static bool on_open_ack_frame(struct mux_session *s, uint32_t id, const uint8_t *p, size_t len)
{
	struct mux_stream *st;
	uint32_t window;
	const char *why;

	if (s->role != MUX_ROLE_RELAY)
		return fail(s, MUX_E_PROTOCOL, "OPEN_ACK sent to the agent");
	if (!(st = stream_live(s, id))) {
		if (!stream_was_opened(s, id))
			fail(s, MUX_E_PROTOCOL, "OPEN_ACK for idle stream %u", id);
		return true;
	}
	if (st->acked)
		return fail(s, MUX_E_PROTOCOL, "second OPEN_ACK on stream %u", id);
	if (mux_parse_open_ack(p, len, &window, &why) != MUX_NO_ERROR)
		return fail(s, MUX_E_PROTOCOL, "bad OPEN_ACK on stream %u: %s", id, why);
	if (window && window < s->peer.stream_window)
		return fail(s, MUX_E_PROTOCOL, "OPEN_ACK on stream %u shrinks its window", id);
	st->acked = true;
	if (window)
		st->send_window += (int64_t)window - s->peer.stream_window;
	if (st->blocked && st->send_window > 0) {
		st->blocked = false;
		ready_add(s, st);
	}
	if (s->cb.on_open_ack)
		s->cb.on_open_ack(s, id, st->ud, s->ud);
	return true;
}

static bool on_rst_frame(struct mux_session *s, uint32_t id, uint32_t code)
{
	struct mux_stream *st = stream_live(s, id);

	if (st)
		stream_close(s, st, code, true, code == MUX_E_REFUSED);
	else if (!stream_was_opened(s, id))
		fail(s, MUX_E_PROTOCOL, "RST for idle stream %u", id);
	return true;
}

static bool on_ping_frame(struct mux_session *s, uint8_t flags, const uint8_t *opaque)
{
	uint8_t f[MUX_HEADER_LEN + 8];

	if (!(flags & MUX_FLAG_ACK)) {
		queue_ctl(s, f, mux_build_ping(f, sizeof(f), true, opaque));
		return true;
	}
	if (!s->ping_out || memcmp(opaque, s->ping_opaque, 8) != 0)
		return true;		/* unsolicited or stale: ignored */
	s->ping_out = false;
	if (s->cb.on_ping_ack)
		s->cb.on_ping_ack(s, s->last_inbound - get64(s->ping_opaque), s->ud);
	return true;
}

static bool on_goaway_frame(struct mux_session *s, const uint8_t *p, size_t len)
{
	uint32_t last = get32(p), code = get32(p + 4), reconnect_ms = get32(p + 8);

	if (last > MUX_STREAM_ID_MAX)
		return fail(s, MUX_E_PROTOCOL, "GOAWAY last stream id above 2^31-1");
	if (s->goaway_recv && last > s->goaway_recv_last)
		return fail(s, MUX_E_PROTOCOL, "GOAWAY last stream id grew from %u to %u", s->goaway_recv_last, last);
	s->goaway_recv = true;
	s->goaway_recv_last = last;
	/* streams we opened above `last` were never processed: retry elsewhere */
	if (s->role == MUX_ROLE_RELAY)
		close_streams(s, last, MUX_E_REFUSED, true, true);
	if (s->cb.on_goaway)
		s->cb.on_goaway(s, last, code, reconnect_ms, (const char *)p + 12, len - 12, s->ud);
	return true;
}

static bool on_hello_frame(struct mux_session *s, const uint8_t *p, size_t len)
{
	struct mux_hello hello;
	const char *why;
	uint16_t v;

	if (mux_parse_hello(p, len, &hello, &why) != MUX_NO_ERROR)
		return fail(s, MUX_E_PROTOCOL, "bad HELLO: %s", why);
	v = hello.version_max < MUX_VERSION_MAX ? hello.version_max : MUX_VERSION_MAX;
	if (v < hello.version_min || v < MUX_VERSION_MIN)
		return fail(s, MUX_E_PROTOCOL, "no common protocol version: agent speaks %u..%u, relay %u..%u",
			    hello.version_min, hello.version_max, MUX_VERSION_MIN, MUX_VERSION_MAX);
	s->version = v;
	s->peer = hello.settings;
	s->hs = HS_WAIT_ACCEPT;
	if (s->cb.on_hello)
		s->cb.on_hello(s, &hello, s->ud);
	return true;
}

static bool on_hello_ack_frame(struct mux_session *s, const uint8_t *p, size_t len)
{
	struct mux_hello ack;
	const char *why;

	if (mux_parse_hello_ack(p, len, &ack, &why) != MUX_NO_ERROR)
		return fail(s, MUX_E_PROTOCOL, "bad HELLO_ACK: %s", why);
	if (ack.version < MUX_VERSION_MIN || ack.version > MUX_VERSION_MAX)
		return fail(s, MUX_E_PROTOCOL, "relay chose protocol version %u, not offered", ack.version);
	s->version = ack.version;
	s->peer = ack.settings;
	s->send_window = s->peer.session_window;
	s->hs = HS_DONE;
	if (s->cb.on_hello_ack)
		s->cb.on_hello_ack(s, &ack, s->ud);
	return true;
}

/* A whole control payload arrived (its header was checked). */
static bool control_frame(struct mux_session *s)
{
	const struct mux_header *h = &s->h;
	const uint8_t *p = s->ctl;

	switch (h->type) {
	case MUX_WINDOW_UPDATE: return on_window_update(s, h->stream_id, get32(p));
	case MUX_OPEN: return on_open_frame(s, h->stream_id, p, h->length);
	case MUX_OPEN_ACK: return on_open_ack_frame(s, h->stream_id, p, h->length);
	case MUX_RST: return on_rst_frame(s, h->stream_id, get32(p));
	case MUX_PING: return on_ping_frame(s, h->flags, p);
	case MUX_GOAWAY: return on_goaway_frame(s, p, h->length);
	case MUX_HELLO: return on_hello_frame(s, p, h->length);
	case MUX_HELLO_ACK: return on_hello_ack_frame(s, p, h->length);
	default: return true;	/* unknown types were skipped at the header */
	}
	return true;
}

/* ------------------------------------------------------------------------- */
/* receiving: headers and DATA */

/* May this frame type arrive in the current handshake state? */
static bool handshake_allows(struct mux_session *s, uint8_t type)
{
	if (type == MUX_GOAWAY && s->hs != HS_START && s->hs != HS_PREFACE)
		return true;	/* a refusal may come instead of the answer */
	switch (s->hs) {
	case HS_HELLO: return type == MUX_HELLO;
	case HS_WAIT_ACK: return type == MUX_HELLO_ACK;
	case HS_DONE: return type != MUX_HELLO && type != MUX_HELLO_ACK;
	default: return false;
	}
}

/* DATA header: windows are charged for the whole frame now. */
static bool data_header(struct mux_session *s)
{
	uint32_t id = s->h.stream_id, len = s->h.length;
	struct mux_stream *st = stream_live(s, id);

	if (!st && !stream_was_opened(s, id))
		return fail(s, MUX_E_PROTOCOL, "DATA on idle stream %u", id);
	if ((int64_t)len > s->recv_window)
		return fail(s, MUX_E_FLOW_CONTROL, "DATA of %u bytes beyond the session window (%lld left)", len,
			    (long long)s->recv_window);
	s->recv_window -= len;
	if (st && s->role == MUX_ROLE_RELAY && !st->acked)
		return fail(s, MUX_E_PROTOCOL, "DATA on stream %u before its OPEN_ACK", id);
	if (st && (int64_t)len > st->recv_window)
		return fail(s, MUX_E_FLOW_CONTROL, "DATA of %u bytes beyond stream %u's window (%lld left)", len, id,
			    (long long)st->recv_window);
	if (st && st->fin_recv) {
		queue_rst(s, id, MUX_E_PROTOCOL);	/* DATA after FIN */
		stream_close(s, st, MUX_E_PROTOCOL, false, false);
		st = NULL;
	}
	if (!st) {
		s->skip = true;			/* closed stream: dropped, credited */
		s->recv_owed += len;
		maybe_credit_session(s);
		return true;
	}
	st->recv_window -= len;
	st->recv_held += len;
	return true;
}

static void data_end(struct mux_session *s)
{
	struct mux_stream *st;

	if (s->skip || !(s->h.flags & MUX_FLAG_FIN) || !(st = stream_live(s, s->h.stream_id)))
		return;
	stream_fin(s, st, false);
	if (s->cb.on_fin)
		s->cb.on_fin(s, st->id, st->ud, s->ud);
}

static void data_chunk(struct mux_session *s, const uint8_t *p, size_t n)
{
	struct mux_stream *st;

	if (s->skip || !n || !(st = stream_live(s, s->h.stream_id)))
		return;		/* a stream closed mid-frame had its bytes credited at close */
	if (s->cb.on_data)
		s->cb.on_data(s, st->id, p, n, st->ud, s->ud);
}

/* A whole frame has arrived (for DATA: its last byte was delivered). */
static void frame_end(struct mux_session *s)
{
	s->in_payload = false;
	s->hdr_len = 0;
	if (s->h.type == MUX_DATA)
		data_end(s);
	else if (!s->skip)
		control_frame(s);
}

/* The 12 header bytes are in: check them, set up the payload. */
static bool header_done(struct mux_session *s)
{
	const char *why;

	mux_header_decode(s->hdr, &s->h);
	if (mux_header_check(&s->h, s->local.max_frame, &why) != MUX_NO_ERROR)
		return fail(s, MUX_E_PROTOCOL, "bad %s header: %s", mux_frame_name(s->h.type), why);
	if (!handshake_allows(s, s->h.type))
		return fail(s, MUX_E_PROTOCOL, "%s frame during the handshake", mux_frame_name(s->h.type));
	s->in_payload = true;
	s->remaining = s->h.length;
	s->ctl_len = 0;
	s->skip = s->h.type > MUX_HELLO_ACK;	/* unknown: ignored */
	if (s->h.type == MUX_DATA)
		data_header(s);
	if (!s->failed && s->remaining == 0)
		frame_end(s);
	return true;
}

/* Consume bytes of the current payload; returns how many. */
static size_t payload_bytes(struct mux_session *s, const uint8_t *p, size_t n)
{
	n = min_size(n, s->remaining);
	if (s->h.type == MUX_DATA) {
		data_chunk(s, p, n);
	} else if (!s->skip) {
		memcpy(s->ctl + s->ctl_len, p, n);
		s->ctl_len += n;
	}
	s->remaining -= (uint32_t)n;
	if (s->remaining == 0 && !s->failed)
		frame_end(s);
	return n;
}

static size_t preface_bytes(struct mux_session *s, const uint8_t *p, size_t n)
{
	n = min_size(n, MUX_PREFACE_LEN - s->preface_got);
	if (memcmp(p, &MUX_PREFACE[s->preface_got], n) != 0) {
		fail(s, MUX_E_PROTOCOL, "bad preface: not a LokaDB tunnel agent");
		return n;
	}
	s->preface_got += n;
	if (s->preface_got == MUX_PREFACE_LEN)
		s->hs = HS_HELLO;
	return n;
}

static size_t header_bytes(struct mux_session *s, const uint8_t *p, size_t n)
{
	n = min_size(n, MUX_HEADER_LEN - s->hdr_len);
	memcpy(s->hdr + s->hdr_len, p, n);
	s->hdr_len += n;
	if (s->hdr_len == MUX_HEADER_LEN)
		header_done(s);
	return n;
}

/* ------------------------------------------------------------------------- */
/* public: session lifecycle */

struct mux_session *mux_session_new(enum mux_role role, const struct mux_settings *settings,
				    const struct mux_callbacks *cb, void *ud)
{
	struct mux_session *s;
	uint32_t nb = 16;

	if (!mux_settings_check(settings, NULL) || (role != MUX_ROLE_AGENT && role != MUX_ROLE_RELAY))
		return NULL;
	if (!(s = calloc(1, sizeof(*s))))
		return NULL;
	if (!(s->buckets = calloc(nb, sizeof(*s->buckets)))) {
		free(s);
		return NULL;
	}
	s->mask = nb - 1;
	s->role = role;
	s->hs = role == MUX_ROLE_RELAY ? HS_PREFACE : HS_START;
	s->local = *settings;
	mux_settings_default(&s->peer);
	if (cb)
		s->cb = *cb;
	s->ud = ud;
	s->next_id = 1;
	s->recv_window = settings->session_window;
	TAILQ_INIT(&s->ready);
	return s;
}

void mux_session_free(struct mux_session *s)
{
	if (!s)
		return;
	for (uint32_t b = 0; b <= s->mask; b++) {
		struct mux_stream *st, *next;
		for (st = s->buckets[b]; st; st = next) {
			next = st->hnext;
			free(st);
		}
	}
	free(s->buckets);
	bytes_free(&s->ctlq);
	bytes_free(&s->out);
	free(s);
}

static void clock_at(struct mux_session *s, uint64_t now_ms)
{
	if (!s->clock_started) {
		s->clock_started = true;
		s->last_ping = now_ms;
	}
	s->last_inbound = now_ms;
}

bool mux_hello(struct mux_session *s, const char *agent_id, const uint8_t *proof, size_t proof_len,
	       uint64_t now_ms)
{
	struct mux_hello hello;
	uint8_t f[MUX_CONTROL_MAX + MUX_HEADER_LEN];
	size_t n;

	if (s->role != MUX_ROLE_AGENT || s->hs != HS_START || proof_len > MUX_PROOF_MAX ||
	    !agent_id || strlen(agent_id) > MUX_NAME_MAX)
		return false;
	memset(&hello, 0, sizeof(hello));
	hello.version_min = MUX_VERSION_MIN;
	hello.version_max = MUX_VERSION_MAX;
	strcpy(hello.agent_id, agent_id);
	if (proof_len)
		memcpy(hello.proof, proof, proof_len);
	hello.proof_len = proof_len;
	hello.settings = s->local;
	if (!(n = mux_build_hello(f, sizeof(f), &hello)))
		return false;
	enter(s);
	queue_ctl(s, (const uint8_t *)MUX_PREFACE, MUX_PREFACE_LEN);
	queue_ctl(s, f, n);
	s->hs = HS_WAIT_ACK;
	clock_at(s, now_ms);
	leave(s);
	return !s->failed;
}

bool mux_accept(struct mux_session *s, const uint8_t session_id[MUX_ID_LEN], uint64_t server_time_ms)
{
	struct mux_hello ack;
	uint8_t f[MUX_CONTROL_MAX + MUX_HEADER_LEN];

	if (s->role != MUX_ROLE_RELAY || s->hs != HS_WAIT_ACCEPT || s->failed || s->goaway_sent)
		return false;
	memset(&ack, 0, sizeof(ack));
	ack.version = s->version;
	memcpy(ack.session_id, session_id, MUX_ID_LEN);
	ack.server_time_ms = server_time_ms;
	ack.settings = s->local;
	enter(s);
	queue_ctl(s, f, mux_build_hello_ack(f, sizeof(f), &ack));
	s->hs = HS_DONE;
	s->send_window = s->peer.session_window;
	leave(s);
	return !s->failed;
}

bool mux_feed(struct mux_session *s, const uint8_t *data, size_t len, uint64_t now_ms)
{
	if (s->depth)
		return false;	/* from a callback: the decoder is in the middle of a frame */
	enter(s);
	if (len && !s->failed) {
		clock_at(s, now_ms);
		if (s->hs == HS_START)
			fail(s, MUX_E_PROTOCOL, "bytes from the relay before HELLO was sent");
	}
	while (len && !s->failed) {
		size_t n;
		if (s->hs == HS_PREFACE)
			n = preface_bytes(s, data, len);
		else if (!s->in_payload)
			n = header_bytes(s, data, len);
		else
			n = payload_bytes(s, data, len);
		data += n;
		len -= n;
	}
	leave(s);
	return !s->failed;
}

size_t mux_pending(struct mux_session *s, const uint8_t **out)
{
	if (s->depth) {		/* from a callback: read_data may be writing at the tail */
		*out = NULL;
		return 0;
	}
	enter(s);
	if (flush_ctl(s))
		schedule(s);
	else
		fail(s, MUX_E_INTERNAL, "out of memory");
	flush_ctl(s);	/* what the scheduler's callbacks queued */
	leave(s);
	*out = s->out.p ? s->out.p + s->out.off : NULL;
	return s->out.len;
}

void mux_consumed(struct mux_session *s, size_t n)
{
	if (s->depth)
		return;		/* from a callback: see mux_pending() */
	n = min_size(n, s->out.len);
	s->out.off += n;
	s->out.len -= n;
	if (!s->out.len)
		s->out.off = 0;
}

uint64_t mux_tick(struct mux_session *s, uint64_t now_ms)
{
	uint8_t f[MUX_HEADER_LEN + 8];
	uint64_t next;

	if (s->failed)
		return now_ms + s->local.ping_interval_ms;
	if (!s->clock_started)
		clock_at(s, now_ms);
	if (now_ms < s->last_inbound)
		now_ms = s->last_inbound;	/* the caller's clock must not go back */
	enter(s);
	if (now_ms - s->last_inbound >= s->local.dead_after_ms) {
		fail(s, MUX_E_TIMEOUT, "no frame from the peer for %llu ms",
		     (unsigned long long)(now_ms - s->last_inbound));
		leave(s);
		return now_ms + s->local.ping_interval_ms;
	}
	if (s->hs == HS_DONE && !s->ping_out && now_ms - s->last_ping >= s->local.ping_interval_ms) {
		put64(s->ping_opaque, now_ms);
		if (queue_ctl(s, f, mux_build_ping(f, sizeof(f), false, s->ping_opaque)))
			s->ping_out = true;
		s->last_ping = now_ms;
	}
	next = s->last_inbound + s->local.dead_after_ms;
	if (s->hs == HS_DONE && s->last_ping + s->local.ping_interval_ms < next)
		next = s->last_ping + s->local.ping_interval_ms;
	leave(s);
	return next > now_ms ? next : now_ms + 1;
}

/* ------------------------------------------------------------------------- */
/* public: streams */

uint32_t mux_open(struct mux_session *s, const struct mux_open *o, void *stream_ud, uint32_t *err)
{
	uint8_t f[MUX_CONTROL_MAX + MUX_HEADER_LEN];
	struct mux_stream *st;
	uint32_t limit = s->local.max_streams < s->peer.max_streams ? s->local.max_streams : s->peer.max_streams;
	uint32_t code = MUX_NO_ERROR;
	size_t n = 0;

	if (s->role != MUX_ROLE_RELAY || s->hs != HS_DONE || s->failed)
		code = MUX_E_PROTOCOL;
	else if (s->goaway_sent || s->goaway_recv)
		code = MUX_E_REFUSED;
	else if (s->n_active >= limit || s->next_id > MUX_STREAM_ID_MAX)
		code = MUX_E_STREAM_LIMIT;
	else if (!(n = mux_build_open(f, sizeof(f), s->next_id, o)))
		code = MUX_E_PROTOCOL;
	if (code != MUX_NO_ERROR) {
		if (err)
			*err = code;
		return 0;
	}
	if (!(st = stream_new(s, s->next_id, o->window ? o->window : s->local.stream_window, s->peer.stream_window))) {
		if (err)
			*err = MUX_E_INTERNAL;
		return 0;
	}
	st->ud = stream_ud;
	s->next_id += 2;
	enter(s);
	queue_ctl(s, f, n);
	leave(s);
	if (err)
		*err = MUX_NO_ERROR;
	return st->id;
}

bool mux_open_ack(struct mux_session *s, uint32_t id, uint32_t window)
{
	uint8_t f[MUX_HEADER_LEN + 8];
	struct mux_stream *st = stream_live(s, id);
	size_t n;

	if (s->role != MUX_ROLE_AGENT || s->failed || !st || st->acked || (window && window < st->recv_max))
		return false;
	if (!(n = mux_build_open_ack(f, sizeof(f), id, window)))
		return false;
	enter(s);
	if (window) {
		st->recv_window += (int64_t)window - st->recv_max;
		st->recv_max = window;
	}
	st->acked = queue_ctl(s, f, n);
	leave(s);
	return st->acked;
}

bool mux_stream_set_user(struct mux_session *s, uint32_t id, void *stream_ud)
{
	struct mux_stream *st = stream_find(s, id);

	if (!st)
		return false;
	st->ud = stream_ud;
	return true;
}

bool mux_reset(struct mux_session *s, uint32_t id, uint32_t code)
{
	struct mux_stream *st = stream_live(s, id);

	if (!st || s->failed)
		return false;
	enter(s);
	queue_rst(s, id, code);
	stream_close(s, st, code, false, false);
	leave(s);
	return true;
}

bool mux_resume(struct mux_session *s, uint32_t id)
{
	struct mux_stream *st = stream_live(s, id);

	if (!st || s->failed || st->fin_sent || (s->role == MUX_ROLE_AGENT && !st->acked))
		return false;
	if (st->send_window <= 0)
		st->blocked = true;
	else
		ready_add(s, st);
	return true;
}

void mux_stream_consumed(struct mux_session *s, uint32_t id, size_t n)
{
	struct mux_stream *st = stream_live(s, id);

	if (!st || s->failed)
		return;		/* closed streams were credited at close */
	n = min_size(n, st->recv_held);
	st->recv_held -= n;
	s->recv_owed += n;
	st->recv_owed += n;
	enter(s);
	maybe_credit_stream(s, st);
	maybe_credit_session(s);
	leave(s);
}

bool mux_goaway(struct mux_session *s, uint32_t code, uint32_t reconnect_ms, const char *debug)
{
	if (s->failed || s->hs == HS_START || s->hs == HS_PREFACE)
		return false;
	enter(s);
	queue_goaway(s, code, reconnect_ms, debug);
	leave(s);
	return !s->failed;
}

void mux_session_abort(struct mux_session *s, uint32_t code)
{
	enter(s);
	s->failed = true;
	close_streams(s, 0, code, false, false);
	leave(s);
}

/* ------------------------------------------------------------------------- */
/* public: inspection */

bool mux_established(const struct mux_session *s)
{
	return s->hs == HS_DONE && !s->failed;
}

bool mux_failed(const struct mux_session *s)
{
	return s->failed;
}

bool mux_going_away(const struct mux_session *s)
{
	return s->goaway_sent || s->goaway_recv;
}

unsigned mux_stream_count(const struct mux_session *s)
{
	return s->n_active;
}

const struct mux_settings *mux_peer_settings(const struct mux_session *s)
{
	return &s->peer;
}

long long mux_stream_send_window(const struct mux_session *s, uint32_t id)
{
	const struct mux_stream *st = stream_live(s, id);

	return st ? st->send_window : -1;
}

long long mux_stream_recv_window(const struct mux_session *s, uint32_t id)
{
	const struct mux_stream *st = stream_live(s, id);

	return st ? st->recv_window : -1;
}

long long mux_session_send_window(const struct mux_session *s)
{
	return s->send_window;
}

long long mux_session_recv_window(const struct mux_session *s)
{
	return s->recv_window;
}

int mux_stream_state(const struct mux_session *s, uint32_t id)
{
	const struct mux_stream *st = stream_live(s, id);

	return st ? st->state : -1;
}
