/* SPDX-License-Identifier: ISC */
/*
 * mux_codec.c -- the tunnel's frame codec (wire format v1, doc/tunnel.md):
 * error and frame names, settings defaults and ranges, the 12-byte header
 * and its checks, frame builders, and the TLV payload parsers of HELLO,
 * HELLO_ACK, OPEN and OPEN_ACK. Stateless: the session (mux.c), the unit
 * tests and tools use it.
 *
 * Invariants: a parser never reads outside [p, p + len); every builder
 * returns 0 rather than write past cap or emit a frame its own parser (or
 * mux_header_check) would refuse.
 */
#include "mux.h"
#include "mux_int.h"

#include <string.h>

/* ------------------------------------------------------------------------- */
/* codec: names and byte order */

static const char *const error_names[] = {
	"NO_ERROR", "PROTOCOL", "INTERNAL", "FLOW_CONTROL", "REFUSED", "CANCEL", "UNAUTHORIZED",
	"NO_SUCH_TARGET", "TARGET_UNREACHABLE", "RELAY_RESTART", "STREAM_LIMIT", "TIMEOUT",
	"ENHANCE_YOUR_CALM",
};

static const char *const frame_names[] = {
	"DATA", "WINDOW_UPDATE", "OPEN", "OPEN_ACK", "RST", "PING", "GOAWAY", "HELLO", "HELLO_ACK",
};

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

const char *mux_error_name(uint32_t code)
{
	return code < N_ELEMS(error_names) ? error_names[code] : "UNKNOWN";
}

const char *mux_frame_name(uint8_t type)
{
	return type < N_ELEMS(frame_names) ? frame_names[type] : "UNKNOWN";
}

/* ------------------------------------------------------------------------- */
/* codec: settings and headers */

void mux_settings_default(struct mux_settings *st)
{
	st->stream_window = MUX_WINDOW_DEFAULT;
	st->session_window = MUX_SESSION_WINDOW_DEFAULT;
	st->max_frame = MUX_FRAME_DEFAULT;
	st->max_streams = MUX_MAX_STREAMS_DEFAULT;
	st->ping_interval_ms = MUX_PING_INTERVAL_MS;
	st->dead_after_ms = MUX_DEAD_AFTER_MS;
}

bool mux_settings_check(const struct mux_settings *st, const char **err)
{
	const char *why = NULL;

	if (st->stream_window < MUX_WINDOW_MIN || st->stream_window > MUX_WINDOW_MAX)
		why = "stream window out of range";
	else if (st->session_window < MUX_WINDOW_MIN || st->session_window > MUX_WINDOW_MAX)
		why = "session window out of range";
	else if (st->max_frame < MUX_FRAME_MIN || st->max_frame > MUX_FRAME_CAP)
		why = "max frame out of range";
	else if (st->max_streams < 1 || st->max_streams > MUX_MAX_STREAMS_CAP)
		why = "max streams out of range";
	else if (st->ping_interval_ms < 1 || st->dead_after_ms <= st->ping_interval_ms)
		why = "heartbeat: the dead-after time must exceed the ping interval";
	if (err)
		*err = why;
	return why == NULL;
}

void mux_header_encode(uint8_t out[MUX_HEADER_LEN], const struct mux_header *h)
{
	out[0] = h->type;
	out[1] = h->flags;
	put16(out + 2, h->reserved);
	put32(out + 4, h->stream_id);
	put32(out + 8, h->length);
}

void mux_header_decode(const uint8_t in[MUX_HEADER_LEN], struct mux_header *h)
{
	h->type = in[0];
	h->flags = in[1];
	h->reserved = get16(in + 2);
	h->stream_id = get32(in + 4);
	h->length = get32(in + 8);
}

/* Per known type: flags it defines, whether it lives on stream 0, payload bounds. */
static const struct frame_rule {
	uint8_t flags;
	bool session;		/* stream id must be 0 */
	bool any_stream;	/* either (WINDOW_UPDATE) */
	uint32_t min_len, max_len;
} frame_rules[] = {
	[MUX_DATA] = { MUX_FLAG_FIN, false, false, 0, 0 /* max_frame */ },
	[MUX_WINDOW_UPDATE] = { 0, false, true, 4, 4 },
	[MUX_OPEN] = { 0, false, false, 0, MUX_CONTROL_MAX },
	[MUX_OPEN_ACK] = { 0, false, false, 0, MUX_CONTROL_MAX },
	[MUX_RST] = { 0, false, false, 4, 4 },
	[MUX_PING] = { MUX_FLAG_ACK, true, false, 8, 8 },
	[MUX_GOAWAY] = { 0, true, false, 12, 12 + MUX_GOAWAY_DEBUG_MAX },
	[MUX_HELLO] = { 0, true, false, 0, MUX_CONTROL_MAX },
	[MUX_HELLO_ACK] = { 0, true, false, 0, MUX_CONTROL_MAX },
};

uint32_t mux_header_check(const struct mux_header *h, uint32_t max_frame, const char **why)
{
	const struct frame_rule *r;
	uint32_t max_len;

	*why = NULL;
	if (h->reserved != 0)
		*why = "reserved header bits set";
	else if (h->stream_id > MUX_STREAM_ID_MAX)
		*why = "stream id above 2^31-1";
	if (*why)
		return MUX_E_PROTOCOL;
	if (h->type >= N_ELEMS(frame_rules)) {
		if (h->length > MUX_CONTROL_MAX)
			*why = "frame of unknown type longer than the control limit";
		return *why ? MUX_E_PROTOCOL : MUX_NO_ERROR;
	}
	r = &frame_rules[h->type];
	max_len = h->type == MUX_DATA ? max_frame : r->max_len;
	if (h->flags & ~r->flags)
		*why = "undefined flags set";
	else if (!r->any_stream && r->session && h->stream_id != 0)
		*why = "session frame on a stream";
	else if (!r->any_stream && !r->session && h->stream_id == 0)
		*why = "stream frame on stream 0";
	else if (h->length > max_len)
		*why = h->type == MUX_DATA ? "DATA longer than max_frame" : "control frame too long";
	else if (h->length < r->min_len)
		*why = "frame too short";
	return *why ? MUX_E_PROTOCOL : MUX_NO_ERROR;
}

/* ------------------------------------------------------------------------- */
/* codec: TLV writer and frame builders */

struct wbuf {
	uint8_t *p;
	size_t cap, len;
	bool overflow;
};

static uint8_t *wb_reserve(struct wbuf *w, size_t n)
{
	uint8_t *at;

	if (w->overflow || w->cap - w->len < n) {
		w->overflow = true;
		return NULL;
	}
	at = w->p + w->len;
	w->len += n;
	return at;
}

static void wb_tlv(struct wbuf *w, uint16_t type, const void *val, size_t len)
{
	uint8_t *at = len <= UINT16_MAX ? wb_reserve(w, 4 + len) : NULL;

	if (!at) {
		w->overflow = true;
		return;
	}
	put16(at, type);
	put16(at + 2, (uint16_t)len);
	if (len)
		memcpy(at + 4, val, len);
}

static void wb_tlv16(struct wbuf *w, uint16_t type, uint16_t v)
{
	uint8_t b[2];

	put16(b, v);
	wb_tlv(w, type, b, sizeof(b));
}

static void wb_tlv32(struct wbuf *w, uint16_t type, uint32_t v)
{
	uint8_t b[4];

	put32(b, v);
	wb_tlv(w, type, b, sizeof(b));
}

static void wb_tlv64(struct wbuf *w, uint16_t type, uint64_t v)
{
	uint8_t b[8];

	put64(b, v);
	wb_tlv(w, type, b, sizeof(b));
}

static void wb_settings(struct wbuf *w, const struct mux_settings *st)
{
	wb_tlv32(w, MUX_TLV_STREAM_WINDOW, st->stream_window);
	wb_tlv32(w, MUX_TLV_SESSION_WINDOW, st->session_window);
	wb_tlv32(w, MUX_TLV_MAX_FRAME, st->max_frame);
	wb_tlv32(w, MUX_TLV_MAX_STREAMS, st->max_streams);
	wb_tlv32(w, MUX_TLV_PING_INTERVAL, st->ping_interval_ms);
	wb_tlv32(w, MUX_TLV_DEAD_AFTER, st->dead_after_ms);
}

/* Start a frame: room for the header, filled in by wb_finish(). */
static struct wbuf wb_start(uint8_t *buf, size_t cap)
{
	struct wbuf w = { buf, cap, 0, false };

	wb_reserve(&w, MUX_HEADER_LEN);
	return w;
}

static size_t wb_finish(struct wbuf *w, uint8_t type, uint8_t flags, uint32_t id)
{
	struct mux_header h = { type, flags, 0, id, 0 };

	if (w->overflow || w->len - MUX_HEADER_LEN > (type == MUX_DATA ? MUX_FRAME_CAP : MUX_CONTROL_MAX))
		return 0;
	h.length = (uint32_t)(w->len - MUX_HEADER_LEN);
	mux_header_encode(w->p, &h);
	return w->len;
}

static bool text_ok(const char *s, bool required)
{
	size_t n = strlen(s);

	return n <= MUX_NAME_MAX && (n > 0 || !required);
}

size_t mux_build_hello(uint8_t *buf, size_t cap, const struct mux_hello *hello)
{
	struct wbuf w = wb_start(buf, cap);

	if (!text_ok(hello->agent_id, false) || hello->proof_len > MUX_PROOF_MAX ||
	    !mux_settings_check(&hello->settings, NULL))
		return 0;
	wb_tlv16(&w, MUX_TLV_VERSION_MIN, hello->version_min);
	wb_tlv16(&w, MUX_TLV_VERSION_MAX, hello->version_max);
	if (hello->agent_id[0])
		wb_tlv(&w, MUX_TLV_AGENT_ID, hello->agent_id, strlen(hello->agent_id));
	if (hello->proof_len)
		wb_tlv(&w, MUX_TLV_PROOF, hello->proof, hello->proof_len);
	wb_settings(&w, &hello->settings);
	return wb_finish(&w, MUX_HELLO, 0, 0);
}

size_t mux_build_hello_ack(uint8_t *buf, size_t cap, const struct mux_hello *ack)
{
	struct wbuf w = wb_start(buf, cap);

	if (!mux_settings_check(&ack->settings, NULL))
		return 0;
	wb_tlv16(&w, MUX_TLV_VERSION, ack->version);
	wb_tlv(&w, MUX_TLV_SESSION_ID, ack->session_id, MUX_ID_LEN);
	wb_tlv64(&w, MUX_TLV_SERVER_TIME, ack->server_time_ms);
	wb_settings(&w, &ack->settings);
	return wb_finish(&w, MUX_HELLO_ACK, 0, 0);
}

static bool open_ok(const struct mux_open *o)
{
	return text_ok(o->db_key, true) && text_ok(o->client_id, false) &&
	       o->ticket_len <= MUX_TICKET_MAX &&
	       (o->window == 0 || (o->window >= MUX_WINDOW_MIN && o->window <= MUX_WINDOW_MAX));
}

size_t mux_build_open(uint8_t *buf, size_t cap, uint32_t id, const struct mux_open *o)
{
	struct wbuf w = wb_start(buf, cap);

	if (id == 0 || id > MUX_STREAM_ID_MAX || !open_ok(o))
		return 0;
	if (o->has_org_id)
		wb_tlv(&w, MUX_TLV_ORG_ID, o->org_id, MUX_ID_LEN);
	wb_tlv(&w, MUX_TLV_DB_KEY, o->db_key, strlen(o->db_key));
	if (o->client_id[0])
		wb_tlv(&w, MUX_TLV_CLIENT_ID, o->client_id, strlen(o->client_id));
	if (o->ticket_len)
		wb_tlv(&w, MUX_TLV_TICKET, o->ticket, o->ticket_len);
	if (o->window)
		wb_tlv32(&w, MUX_TLV_STREAM_WINDOW, o->window);
	return wb_finish(&w, MUX_OPEN, 0, id);
}

size_t mux_build_open_ack(uint8_t *buf, size_t cap, uint32_t id, uint32_t window)
{
	struct wbuf w = wb_start(buf, cap);

	if (id == 0 || id > MUX_STREAM_ID_MAX || (window && (window < MUX_WINDOW_MIN || window > MUX_WINDOW_MAX)))
		return 0;
	if (window)
		wb_tlv32(&w, MUX_TLV_STREAM_WINDOW, window);
	return wb_finish(&w, MUX_OPEN_ACK, 0, id);
}

static size_t build_u32(uint8_t *buf, size_t cap, uint8_t type, uint32_t id, uint32_t v)
{
	struct wbuf w = wb_start(buf, cap);
	uint8_t *at = wb_reserve(&w, 4);

	if (at)
		put32(at, v);
	return wb_finish(&w, type, 0, id);
}

size_t mux_build_rst(uint8_t *buf, size_t cap, uint32_t id, uint32_t code)
{
	if (id == 0 || id > MUX_STREAM_ID_MAX)
		return 0;
	return build_u32(buf, cap, MUX_RST, id, code);
}

size_t mux_build_window_update(uint8_t *buf, size_t cap, uint32_t id, uint32_t increment)
{
	if (increment == 0 || increment > MUX_WINDOW_MAX || id > MUX_STREAM_ID_MAX)
		return 0;
	return build_u32(buf, cap, MUX_WINDOW_UPDATE, id, increment);
}

size_t mux_build_ping(uint8_t *buf, size_t cap, bool ack, const uint8_t opaque[8])
{
	struct wbuf w = wb_start(buf, cap);
	uint8_t *at = wb_reserve(&w, 8);

	if (at)
		memcpy(at, opaque, 8);
	return wb_finish(&w, MUX_PING, ack ? MUX_FLAG_ACK : 0, 0);
}

size_t mux_build_goaway(uint8_t *buf, size_t cap, uint32_t last_id, uint32_t code,
			uint32_t reconnect_ms, const char *debug, size_t debug_len)
{
	struct wbuf w = wb_start(buf, cap);
	uint8_t *at = wb_reserve(&w, 12);

	if (!at || last_id > MUX_STREAM_ID_MAX)
		return 0;
	if (debug_len > MUX_GOAWAY_DEBUG_MAX)
		debug_len = MUX_GOAWAY_DEBUG_MAX;
	put32(at, last_id);
	put32(at + 4, code);
	put32(at + 8, reconnect_ms);
	at = debug_len ? wb_reserve(&w, debug_len) : NULL;
	if (at)
		memcpy(at, debug, debug_len);
	return wb_finish(&w, MUX_GOAWAY, 0, 0);
}

size_t mux_build_data(uint8_t *buf, size_t cap, uint32_t id, bool fin, const uint8_t *data, size_t len)
{
	struct wbuf w = wb_start(buf, cap);
	uint8_t *at = len ? wb_reserve(&w, len) : NULL;

	if (id == 0 || id > MUX_STREAM_ID_MAX)
		return 0;
	if (at)
		memcpy(at, data, len);
	return wb_finish(&w, MUX_DATA, fin ? MUX_FLAG_FIN : 0, id);
}

/* ------------------------------------------------------------------------- */
/* codec: TLV parsers */

#define TLV_SLOTS 32
#define TLV_KNOWN ((1u << MUX_TLV_VERSION_MIN) | (1u << MUX_TLV_VERSION_MAX) | (1u << MUX_TLV_VERSION) | \
		   (1u << MUX_TLV_AGENT_ID) | (1u << MUX_TLV_PROOF) | (1u << MUX_TLV_SESSION_ID) | \
		   (1u << MUX_TLV_SERVER_TIME) | (1u << MUX_TLV_STREAM_WINDOW) | (1u << MUX_TLV_SESSION_WINDOW) | \
		   (1u << MUX_TLV_MAX_FRAME) | (1u << MUX_TLV_MAX_STREAMS) | (1u << MUX_TLV_PING_INTERVAL) | \
		   (1u << MUX_TLV_DEAD_AFTER) | (1u << MUX_TLV_ORG_ID) | (1u << MUX_TLV_DB_KEY) | \
		   (1u << MUX_TLV_CLIENT_ID) | (1u << MUX_TLV_TICKET))

struct tlvs {
	uint32_t seen;
	const uint8_t *val[TLV_SLOTS];
	uint16_t len[TLV_SLOTS];
	const char *why;	/* first error met while reading values */
};

/* Index the TLVs of a payload; unknown types are skipped, known ones must be unique. */
static bool tlv_scan(const uint8_t *p, size_t len, struct tlvs *t)
{
	size_t off = 0;

	memset(t, 0, sizeof(*t));
	while (off < len) {
		uint16_t type, vlen;

		if (len - off < 4) {
			t->why = "truncated TLV header";
			return false;
		}
		type = get16(p + off);
		vlen = get16(p + off + 2);
		if (vlen > len - off - 4) {
			t->why = "TLV longer than its frame";
			return false;
		}
		if (type < TLV_SLOTS && (TLV_KNOWN & (1u << type))) {
			if (t->seen & (1u << type)) {
				t->why = "duplicate TLV";
				return false;
			}
			t->seen |= 1u << type;
			t->val[type] = p + off + 4;
			t->len[type] = vlen;
		}
		off += 4 + (size_t)vlen;
	}
	return true;
}

static bool tlv_has(const struct tlvs *t, int type)
{
	return (t->seen & (1u << type)) != 0;
}

/* A fixed-size value; false (and t->why) if present with another size. */
static const uint8_t *tlv_fixed(struct tlvs *t, int type, size_t size)
{
	if (!tlv_has(t, type))
		return NULL;
	if (t->len[type] != size) {
		t->why = "TLV value of the wrong size";
		return NULL;
	}
	return t->val[type];
}

static void tlv_u16(struct tlvs *t, int type, uint16_t *out)
{
	const uint8_t *v = tlv_fixed(t, type, 2);

	if (v)
		*out = get16(v);
}

static void tlv_u32(struct tlvs *t, int type, uint32_t *out)
{
	const uint8_t *v = tlv_fixed(t, type, 4);

	if (v)
		*out = get32(v);
}

/* Text 1..MUX_NAME_MAX bytes without NUL into out (MUX_NAME_MAX + 1 bytes). */
static void tlv_text(struct tlvs *t, int type, char *out)
{
	size_t n;

	out[0] = '\0';
	if (!tlv_has(t, type))
		return;
	n = t->len[type];
	if (n == 0 || n > MUX_NAME_MAX || memchr(t->val[type], '\0', n)) {
		t->why = "bad text TLV";
		return;
	}
	memcpy(out, t->val[type], n);
	out[n] = '\0';
}

static void tlv_bytes(struct tlvs *t, int type, uint8_t *out, size_t max, size_t *len)
{
	*len = 0;
	if (!tlv_has(t, type))
		return;
	if (t->len[type] == 0 || t->len[type] > max) {
		t->why = "bad bytes TLV";
		return;
	}
	memcpy(out, t->val[type], t->len[type]);
	*len = t->len[type];
}

static void tlv_settings(struct tlvs *t, struct mux_settings *st)
{
	const char *err;

	mux_settings_default(st);
	tlv_u32(t, MUX_TLV_STREAM_WINDOW, &st->stream_window);
	tlv_u32(t, MUX_TLV_SESSION_WINDOW, &st->session_window);
	tlv_u32(t, MUX_TLV_MAX_FRAME, &st->max_frame);
	tlv_u32(t, MUX_TLV_MAX_STREAMS, &st->max_streams);
	tlv_u32(t, MUX_TLV_PING_INTERVAL, &st->ping_interval_ms);
	tlv_u32(t, MUX_TLV_DEAD_AFTER, &st->dead_after_ms);
	if (!t->why && !mux_settings_check(st, &err))
		t->why = err;
}

static uint32_t tlv_result(const struct tlvs *t, const char **why)
{
	*why = t->why;
	return t->why ? MUX_E_PROTOCOL : MUX_NO_ERROR;
}

uint32_t mux_parse_hello(const uint8_t *p, size_t len, struct mux_hello *out, const char **why)
{
	struct tlvs t;

	memset(out, 0, sizeof(*out));
	if (!tlv_scan(p, len, &t))
		return tlv_result(&t, why);
	if (!tlv_has(&t, MUX_TLV_VERSION_MIN) || !tlv_has(&t, MUX_TLV_VERSION_MAX))
		t.why = "HELLO without versions";
	tlv_u16(&t, MUX_TLV_VERSION_MIN, &out->version_min);
	tlv_u16(&t, MUX_TLV_VERSION_MAX, &out->version_max);
	if (!t.why && out->version_min > out->version_max)
		t.why = "HELLO version range is empty";
	tlv_text(&t, MUX_TLV_AGENT_ID, out->agent_id);
	tlv_bytes(&t, MUX_TLV_PROOF, out->proof, MUX_PROOF_MAX, &out->proof_len);
	tlv_settings(&t, &out->settings);
	return tlv_result(&t, why);
}

uint32_t mux_parse_hello_ack(const uint8_t *p, size_t len, struct mux_hello *out, const char **why)
{
	struct tlvs t;
	const uint8_t *v;

	memset(out, 0, sizeof(*out));
	if (!tlv_scan(p, len, &t))
		return tlv_result(&t, why);
	if (!tlv_has(&t, MUX_TLV_VERSION))
		t.why = "HELLO_ACK without a version";
	tlv_u16(&t, MUX_TLV_VERSION, &out->version);
	if ((v = tlv_fixed(&t, MUX_TLV_SESSION_ID, MUX_ID_LEN)))
		memcpy(out->session_id, v, MUX_ID_LEN);
	if ((v = tlv_fixed(&t, MUX_TLV_SERVER_TIME, 8)))
		out->server_time_ms = get64(v);
	tlv_settings(&t, &out->settings);
	return tlv_result(&t, why);
}

uint32_t mux_parse_open(const uint8_t *p, size_t len, struct mux_open *out, const char **why)
{
	struct tlvs t;
	const uint8_t *v;

	memset(out, 0, sizeof(*out));
	if (!tlv_scan(p, len, &t))
		return tlv_result(&t, why);
	if (!tlv_has(&t, MUX_TLV_DB_KEY))
		t.why = "OPEN without a db_key";
	if ((v = tlv_fixed(&t, MUX_TLV_ORG_ID, MUX_ID_LEN))) {
		memcpy(out->org_id, v, MUX_ID_LEN);
		out->has_org_id = true;
	}
	tlv_text(&t, MUX_TLV_DB_KEY, out->db_key);
	tlv_text(&t, MUX_TLV_CLIENT_ID, out->client_id);
	tlv_bytes(&t, MUX_TLV_TICKET, out->ticket, MUX_TICKET_MAX, &out->ticket_len);
	tlv_u32(&t, MUX_TLV_STREAM_WINDOW, &out->window);
	if (!t.why && tlv_has(&t, MUX_TLV_STREAM_WINDOW) &&
	    (out->window < MUX_WINDOW_MIN || out->window > MUX_WINDOW_MAX))
		t.why = "OPEN stream window out of range";
	return tlv_result(&t, why);
}

uint32_t mux_parse_open_ack(const uint8_t *p, size_t len, uint32_t *window, const char **why)
{
	struct tlvs t;

	*window = 0;
	if (!tlv_scan(p, len, &t))
		return tlv_result(&t, why);
	tlv_u32(&t, MUX_TLV_STREAM_WINDOW, window);
	if (!t.why && tlv_has(&t, MUX_TLV_STREAM_WINDOW) && (*window < MUX_WINDOW_MIN || *window > MUX_WINDOW_MAX))
		t.why = "OPEN_ACK stream window out of range";
	return tlv_result(&t, why);
}
