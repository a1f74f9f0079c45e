/* SPDX-License-Identifier: ISC */
/*
 * fuzz_mux.c -- libFuzzer target for the tunnel multiplexer
 * (plugins/tunnel/): arbitrary bytes from the peer, fed to one session
 * in chunks, while the owner opens, acknowledges, sends, consumes and resets
 * streams as the relay and agent plugins will.
 *
 * Input layout: one selector byte, then the peer's bytes.
 *   bits 0-2  chunk size of the feeds (0 = all at once, 1, 2, 3, 7, 16, 64, 512)
 *   bit 3     role: 0 = agent (the input is what the relay sends, starting
 *             with HELLO_ACK), 1 = relay (the input is the agent's preface,
 *             HELLO and frames)
 *   bit 4     small settings (windows of 1 KiB and 4 KiB, max_frame 1 KiB,
 *             4 streams), else the defaults
 *   bit 5     the owner never reports bytes written onward (no credit back)
 *   bit 6     the owner resets every third stream it hears data on
 * Between feeds the owner drains mux_pending(), and the clock moves 1 s per
 * feed with mux_tick() after each, so heartbeat and liveness paths run.
 *
 * Oracles besides the sanitizers (all abort()):
 *   - every byte the session produces is a well-formed frame sequence
 *     (agent: after the preface) that passes mux_header_check();
 *   - on_stream_close() comes exactly once per stream the owner was given,
 *     and never for one it was not; after mux_session_abort() none is left;
 *   - the session's receive window never goes negative, no send window
 *     exceeds 2^31-1;
 *   - no DATA frame is larger than the max_frame the peer announced.
 *
 * LOKADB_FUZZ_LOG=1 prints why a session failed and how each input ended.
 *
 * Corpus: test/fuzz/corpus/fuzz_mux/, made by make_corpus.py.
 */
#include "mux.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
#define SEND_BYTES 20000		/* what the owner sends per stream, then FIN */

static const size_t chunks[8] = { 0, 1, 2, 3, 7, 16, 64, 512 };

struct fstream {
	bool alive;
	uint32_t id;
	size_t sent, recv;
	int data_events;
};

static struct {
	struct mux_session *s;
	enum mux_role role;
	bool consume, reset_some, log;
	struct fstream st[SLOTS];
	unsigned given, closed;
	uint64_t now;
	/* the output checker: frames may straddle mux_pending() calls */
	uint8_t hdr[MUX_HEADER_LEN];
	size_t hdr_len;
	uint64_t payload_left;
	size_t preface_left;
	uint32_t out_max_frame;
} f;

const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_mux: %s\n", what);
	abort();
}

static struct fstream *slot_new(uint32_t id)
{
	for (int i = 0; i < SLOTS; i++)
		if (!f.st[i].alive) {
			memset(&f.st[i], 0, sizeof(f.st[i]));
			f.st[i].alive = true;
			f.st[i].id = id;
			f.given++;
			return &f.st[i];
		}
	return NULL;
}

static void open_some(struct mux_session *s)
{
	for (int i = 0; i < 3; i++) {
		struct mux_open o;
		uint32_t err, id;
		struct fstream *t;

		memset(&o, 0, sizeof(o));
		snprintf(o.db_key, sizeof(o.db_key), "db%d", i);
		o.window = i == 2 ? 2048 : 0;
		if (!(id = mux_open(s, &o, NULL, &err)))
			return;
		if (!(t = slot_new(id)))
			die("out of slots");
		mux_stream_set_user(s, id, t);
		mux_resume(s, id);
	}
}

static void cb_hello(struct mux_session *s, const struct mux_hello *hello, void *ud)
{
	static const uint8_t sid[MUX_ID_LEN] = { 1 };

	(void)ud;
	if (hello->proof_len == 1 && hello->proof[0] == 0)
		mux_goaway(s, MUX_E_UNAUTHORIZED, 0, "bad proof");
	else if (mux_accept(s, sid, 0))
		open_some(s);
}

static uint32_t cb_open(struct mux_session *s, uint32_t id, const struct mux_open *o, void **stream_ud,
			void *ud)
{
	struct fstream *t;

	(void)ud;
	if (o->db_key[0] == 'x')
		return MUX_E_NO_SUCH_TARGET;
	if (!(t = slot_new(id)))
		return MUX_E_STREAM_LIMIT;
	*stream_ud = t;
	if (o->db_key[0] != 'w') {	/* 'w': the local connect is still pending */
		mux_open_ack(s, id, o->db_key[0] == 'b' ? 1u << 20 : 0);
		mux_resume(s, id);
	}
	return MUX_NO_ERROR;
}

static void cb_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *stream_ud,
		    void *ud)
{
	struct fstream *t = stream_ud;

	(void)data;
	(void)ud;
	if (!t || !t->alive || t->id != id)
		die("on_data for a stream the owner does not have");
	t->recv += len;
	if (f.reset_some && ++t->data_events % 3 == 0) {
		mux_reset(s, id, MUX_E_CANCEL);
		return;
	}
	if (f.consume)
		mux_stream_consumed(s, id, len);
}

static void cb_fin(struct mux_session *s, uint32_t id, void *stream_ud, void *ud)
{
	struct fstream *t = stream_ud;

	(void)s;
	(void)ud;
	if (!t || !t->alive || t->id != id)
		die("on_fin for a stream the owner does not have");
}

static void cb_close(struct mux_session *s, uint32_t id, uint32_t code, bool by_peer, bool retryable,
		     void *stream_ud, void *ud)
{
	struct fstream *t = stream_ud;

	(void)s;
	(void)code;
	(void)by_peer;
	(void)retryable;
	(void)ud;
	if (!t || !t->alive || t->id != id)
		die("on_stream_close twice, or for a stream the owner does not have");
	t->alive = false;
	f.closed++;
}

static long cb_read(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *stream_ud,
		    void *ud)
{
	struct fstream *t = stream_ud;
	size_t n;

	(void)s;
	(void)ud;
	if (!t || !t->alive || t->id != id)
		die("read_data for a stream the owner does not have");
	n = SEND_BYTES - t->sent;
	if (n > max)
		n = max;
	memset(dst, (int)(id & 0xff), n);
	t->sent += n;
	*eof = t->sent == SEND_BYTES;
	return (long)n;
}

/* LOKADB_FUZZ_LOG=1: why a session failed (to check that seeds go deep). */
static void cb_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	(void)s;
	(void)ud;
	if (f.log)
		fprintf(stderr, "fuzz_mux: session error %s: %s (%u streams given, %u closed)\n",
			mux_error_name(code), msg, f.given, f.closed);
}

static const struct mux_callbacks callbacks = {
	.on_session_error = cb_error,
	.on_hello = cb_hello,
	.on_open = cb_open,
	.on_data = cb_data,
	.on_fin = cb_fin,
	.on_stream_close = cb_close,
	.read_data = cb_read,
};

/* Check the session's output is a well-formed frame sequence. */
static void check_output(const uint8_t *p, size_t n)
{
	const char *why;

	while (n) {
		if (f.preface_left) {
			size_t k = n < f.preface_left ? n : f.preface_left;
			if (memcmp(p, &MUX_PREFACE[MUX_PREFACE_LEN - f.preface_left], k) != 0)
				die("output does not start with the preface");
			f.preface_left -= k;
			p += k;
			n -= k;
		} else if (f.payload_left) {
			size_t k = n < f.payload_left ? n : (size_t)f.payload_left;
			f.payload_left -= k;
			p += k;
			n -= k;
		} else {
			struct mux_header h;
			size_t k = MUX_HEADER_LEN - f.hdr_len;
			if (k > n)
				k = n;
			memcpy(f.hdr + f.hdr_len, p, k);
			f.hdr_len += k;
			p += k;
			n -= k;
			if (f.hdr_len < MUX_HEADER_LEN)
				continue;
			f.hdr_len = 0;
			mux_header_decode(f.hdr, &h);
			if (mux_header_check(&h, MUX_FRAME_CAP, &why) != MUX_NO_ERROR || h.type > MUX_HELLO_ACK) {
				fprintf(stderr, "fuzz_mux: produced a bad %s frame: %s\n", mux_frame_name(h.type),
					why ? why : "unknown type");
				abort();
			}
			if (h.type == MUX_DATA && h.length > mux_peer_settings(f.s)->max_frame)
				die("DATA frame above the peer's max_frame");
			f.payload_left = h.length;
		}
	}
}

static void drain(void)
{
	const uint8_t *p;
	size_t n = mux_pending(f.s, &p);

	check_output(p, n);
	mux_consumed(f.s, n);
}

static void check_windows(void)
{
	if (mux_failed(f.s))
		return;
	if (mux_session_recv_window(f.s) < 0)
		die("session receive window below 0");
	if (mux_session_send_window(f.s) > (long long)MUX_WINDOW_MAX)
		die("session send window above 2^31-1");
	for (int i = 0; i < SLOTS; i++)
		if (f.st[i].alive && mux_stream_send_window(f.s, f.st[i].id) > (long long)MUX_WINDOW_MAX)
			die("stream send window above 2^31-1");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t sel = size ? data[0] : 0;
	size_t chunk = chunks[sel & 7], off = 1;
	struct mux_settings set;

	memset(&f, 0, sizeof(f));
	f.log = getenv("LOKADB_FUZZ_LOG") != NULL;
	f.role = sel & 0x08 ? MUX_ROLE_RELAY : MUX_ROLE_AGENT;
	f.consume = !(sel & 0x20);
	f.reset_some = (sel & 0x40) != 0;
	mux_settings_default(&set);
	if (sel & 0x10) {
		set.stream_window = 1024;
		set.session_window = 4096;
		set.max_frame = 1024;
		set.max_streams = 4;
	}
	f.now = 1000;
	if (!(f.s = mux_session_new(f.role, &set, &callbacks, NULL)))
		die("mux_session_new failed");
	if (f.role == MUX_ROLE_AGENT) {
		f.preface_left = MUX_PREFACE_LEN;
		if (!mux_hello(f.s, "fuzz-agent", (const uint8_t *)"proof", 5, f.now))
			die("mux_hello failed");
	}
	drain();
	while (off < size) {
		size_t n = chunk && size - off > chunk ? chunk : size - off;
		mux_feed(f.s, data + off, n, f.now);
		off += n;
		check_windows();
		drain();
		f.now += 1000;
		mux_tick(f.s, f.now);
		drain();
	}
	if (f.log)
		fprintf(stderr, "fuzz_mux: end: %s, %u streams given, %u closed before the abort\n",
			mux_failed(f.s) ? "failed" : mux_established(f.s) ? "established" : "handshake",
			f.given, f.closed);
	mux_session_abort(f.s, MUX_E_CANCEL);
	drain();
	if (f.closed != f.given || mux_stream_count(f.s) != 0)
		die("streams left after mux_session_abort()");
	mux_session_free(f.s);
	return 0;
}
