/* SPDX-License-Identifier: ISC */
/*
 * mux.h -- the tunnel multiplexer: wire format v1 and the session/stream
 * state machine shared by the `relay` and `agent` plugins.
 *
 * Overview
 * --------
 * An agent at an organization's site dials out to the relay (TLS 1.3) and
 * both ends run one mux session over that connection. The relay opens
 * streams (odd ids, strictly increasing), one per PostgreSQL connection it
 * routes to the site; the agent connects each stream to a database named in
 * its own allow-list. doc/tunnel.md describes the bytes on the wire.
 *
 * The library is pure C: no sockets, no libevent, no clock, no allocation
 * beyond its own session and stream objects and two byte buffers. The owner
 * moves bytes between the session and its transport:
 *
 *	mux_feed(s, bytes, n, now_ms)	bytes read from the transport; events are
 *					reported through the callbacks before it
 *					returns
 *	mux_pending(s, &p)		bytes to write to the transport (control
 *					frames first, then DATA round-robin)
 *	mux_consumed(s, n)		n of them were taken
 *	mux_tick(s, now_ms)		heartbeat and liveness; returns when to
 *					call it again
 *
 * Outbound DATA is pulled, as nghttp2 does: the owner calls mux_resume() when
 * a stream has bytes (or its end) to send, and the scheduler later asks the
 * read_data callback for at most the credit it has, writing straight into the
 * output buffer. Inbound DATA is handed to on_data() as it arrives, with no
 * copy; the owner returns credit with mux_stream_consumed() once it has
 * written those bytes onward (to PostgreSQL or to the cloud client), never
 * when it merely received them: that is what bounds the memory a peer can
 * make us hold to one window per stream and one session window in all.
 *
 * Usage guidelines
 * ----------------
 * - Call mux_pending() only when the transport can take more (e.g. its
 *   output buffer is below a low-water mark): it produces at most about
 *   MUX_OUT_FILL bytes of DATA per call, so control frames (PING replies,
 *   RST, WINDOW_UPDATE) never wait behind more than that.
 * - Callbacks run inside mux_feed(), mux_pending(), mux_tick() and the stream
 *   calls. They may call any mux_* function on the same session except
 *   mux_session_free(), mux_feed(), mux_pending() and mux_consumed() (those
 *   three do nothing there: feed returns false, pending returns 0); a stream
 *   closed from inside a callback is freed (and its on_stream_close()
 *   reported) when the outermost mux call returns.
 * - on_stream_close() is reported exactly once for every stream the owner was
 *   told about (mux_open() returned its id, or on_open() accepted it). After
 *   it, the stream id is unknown to every call.
 * - After a session error (on_session_error(), or mux_feed() returning
 *   false) the session only drains: mux_pending() still yields the GOAWAY
 *   that names the error; flush it, then close the transport.
 * - The window size of LOKADB_MUX_WINDOW_KB is read by the caller and put in
 *   struct mux_settings; the library reads no environment.
 *
 * Not thread-safe: one session belongs to one thread.
 */
#ifndef LOKADB_MUX_H
#define LOKADB_MUX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- wire constants (doc/tunnel.md) ---- */

#define MUX_PREFACE		"LKTN\0\1\r\n"	/* sent by the agent before HELLO */
#define MUX_PREFACE_LEN		8
#define MUX_HEADER_LEN		12
#define MUX_VERSION_MIN		1		/* versions this build speaks */
#define MUX_VERSION_MAX		1
#define MUX_CONTROL_MAX		4096		/* payload cap of every non-DATA frame */
#define MUX_FRAME_DEFAULT	(16 * 1024)	/* DATA payload: one TLS record */
#define MUX_FRAME_MIN		1024
#define MUX_FRAME_CAP		(1024 * 1024)
#define MUX_WINDOW_DEFAULT	(4u * 1024 * 1024)
#define MUX_SESSION_WINDOW_DEFAULT (16u * 1024 * 1024)
#define MUX_WINDOW_MIN		1024
#define MUX_WINDOW_MAX		0x7fffffffu
#define MUX_MAX_STREAMS_DEFAULT	2048
#define MUX_MAX_STREAMS_CAP	65536
#define MUX_PING_INTERVAL_MS	10000
#define MUX_DEAD_AFTER_MS	30000
#define MUX_GOAWAY_DEBUG_MAX	256
#define MUX_NAME_MAX		63		/* agent id, db_key, client id */
#define MUX_PROOF_MAX		128
#define MUX_TICKET_MAX		1024
#define MUX_ID_LEN		16		/* org id, session id (UUID bytes) */
#define MUX_STREAM_ID_MAX	0x7fffffffu
#define MUX_OUT_FILL		(64 * 1024)	/* DATA produced per mux_pending() */
#define MUX_CONTROL_QUEUE_MAX	(256 * 1024)	/* unread control bytes before ENHANCE_YOUR_CALM */
#define MUX_CREDIT_PARTS	16		/* credit returns once window / this is owed */

/* Frame types. Unknown types are skipped once the handshake is done. */
enum mux_frame_type {
	MUX_DATA = 0x0,
	MUX_WINDOW_UPDATE = 0x1,
	MUX_OPEN = 0x2,
	MUX_OPEN_ACK = 0x3,
	MUX_RST = 0x4,
	MUX_PING = 0x5,
	MUX_GOAWAY = 0x6,
	MUX_HELLO = 0x7,
	MUX_HELLO_ACK = 0x8,
};

#define MUX_FLAG_FIN	0x1	/* DATA: the sender's last bytes on this stream */
#define MUX_FLAG_ACK	0x1	/* PING: a reply */

/* Error codes of RST and GOAWAY (and of on_session_error / on_stream_close). */
enum mux_error {
	MUX_NO_ERROR = 0,
	MUX_E_PROTOCOL = 1,
	MUX_E_INTERNAL = 2,
	MUX_E_FLOW_CONTROL = 3,
	MUX_E_REFUSED = 4,		/* not processed: safe to retry */
	MUX_E_CANCEL = 5,
	MUX_E_UNAUTHORIZED = 6,
	MUX_E_NO_SUCH_TARGET = 7,
	MUX_E_TARGET_UNREACHABLE = 8,
	MUX_E_RELAY_RESTART = 9,
	MUX_E_STREAM_LIMIT = 10,
	MUX_E_TIMEOUT = 11,
	MUX_E_ENHANCE_YOUR_CALM = 12,
};

/* TLV types (u16 type, u16 length, value) of HELLO, HELLO_ACK, OPEN, OPEN_ACK. */
enum mux_tlv {
	MUX_TLV_VERSION_MIN = 1,	/* u16, HELLO */
	MUX_TLV_VERSION_MAX = 2,	/* u16, HELLO */
	MUX_TLV_VERSION = 3,		/* u16, HELLO_ACK: the chosen version */
	MUX_TLV_AGENT_ID = 4,		/* text 1..63, HELLO */
	MUX_TLV_PROOF = 5,		/* bytes 1..128, HELLO: credential proof */
	MUX_TLV_SESSION_ID = 6,		/* 16 bytes, HELLO_ACK */
	MUX_TLV_SERVER_TIME = 7,	/* u64 ms since the epoch, HELLO_ACK */
	MUX_TLV_STREAM_WINDOW = 8,	/* u32: settings; OPEN/OPEN_ACK: this stream */
	MUX_TLV_SESSION_WINDOW = 9,	/* u32 */
	MUX_TLV_MAX_FRAME = 10,		/* u32 */
	MUX_TLV_MAX_STREAMS = 11,	/* u32 */
	MUX_TLV_PING_INTERVAL = 12,	/* u32 ms */
	MUX_TLV_DEAD_AFTER = 13,	/* u32 ms */
	MUX_TLV_ORG_ID = 16,		/* 16 bytes, OPEN */
	MUX_TLV_DB_KEY = 17,		/* text 1..63, OPEN (required) */
	MUX_TLV_CLIENT_ID = 18,		/* text 1..63, OPEN */
	MUX_TLV_TICKET = 19,		/* bytes 1..1024, OPEN */
};

enum mux_role {
	MUX_ROLE_AGENT,		/* dials, sends preface + HELLO, accepts OPENs */
	MUX_ROLE_RELAY,		/* accepts, answers HELLO_ACK, opens streams */
};

enum mux_stream_state {
	MUX_ST_OPEN,
	MUX_ST_HALF_CLOSED_LOCAL,	/* we sent FIN */
	MUX_ST_HALF_CLOSED_REMOTE,	/* the peer sent FIN */
	MUX_ST_CLOSED,			/* both FINs, or RST: freed when the mux call returns */
};

/*
 * What one side lets its peer do: the receive windows it grants, the largest
 * DATA payload it accepts, how many streams it serves, and its heartbeat.
 * Sent in HELLO (agent) and HELLO_ACK (relay).
 */
struct mux_settings {
	uint32_t stream_window;		/* initial credit per stream, bytes */
	uint32_t session_window;	/* initial credit for all DATA, bytes */
	uint32_t max_frame;		/* largest DATA payload accepted */
	uint32_t max_streams;		/* concurrent streams */
	uint32_t ping_interval_ms;
	uint32_t dead_after_ms;		/* no inbound frame for this long: TIMEOUT */
};

/* HELLO (agent -> relay) and HELLO_ACK (relay -> agent), decoded. */
struct mux_hello {
	uint16_t version_min, version_max;	/* HELLO */
	uint16_t version;			/* HELLO_ACK */
	char agent_id[MUX_NAME_MAX + 1];	/* HELLO; "" if absent */
	uint8_t proof[MUX_PROOF_MAX];		/* HELLO */
	size_t proof_len;
	uint8_t session_id[MUX_ID_LEN];		/* HELLO_ACK */
	uint64_t server_time_ms;		/* HELLO_ACK */
	struct mux_settings settings;		/* absent TLVs: the defaults */
};

/* OPEN (relay -> agent), decoded; also what mux_open() sends. */
struct mux_open {
	bool has_org_id;
	uint8_t org_id[MUX_ID_LEN];
	char db_key[MUX_NAME_MAX + 1];		/* required, 1..63 bytes, no NUL */
	char client_id[MUX_NAME_MAX + 1];	/* "" if absent */
	uint8_t ticket[MUX_TICKET_MAX];
	size_t ticket_len;
	uint32_t window;			/* the opener's receive window for this stream; 0 = its setting */
};

/* The fixed 12-byte header, decoded. */
struct mux_header {
	uint8_t type;
	uint8_t flags;
	uint16_t reserved;
	uint32_t stream_id;
	uint32_t length;
};

struct mux_session;

/*
 * The events of a session. Every callback gets the session's `ud`; stream
 * callbacks also get the stream's user pointer (set by mux_open() or by
 * on_open()). NULL callbacks are skipped, except read_data, which a session
 * that sends DATA needs.
 */
struct mux_callbacks {
	/* relay: a valid HELLO with a common version arrived. Answer with
	 * mux_accept() (now or later) or refuse with mux_goaway(UNAUTHORIZED). */
	void (*on_hello)(struct mux_session *s, const struct mux_hello *hello, void *ud);
	/* agent: the relay accepted; streams may now arrive. */
	void (*on_hello_ack)(struct mux_session *s, const struct mux_hello *ack, void *ud);
	/* agent: the relay opens stream id. Return MUX_NO_ERROR to take it
	 * (set *stream_ud; answer later with mux_open_ack() or mux_reset()),
	 * or an error code: the stream is refused with RST(code) and never
	 * reported again. */
	uint32_t (*on_open)(struct mux_session *s, uint32_t id, const struct mux_open *open,
			    void **stream_ud, void *ud);
	/* relay: the agent reached the stream's database. */
	void (*on_open_ack)(struct mux_session *s, uint32_t id, void *stream_ud, void *ud);
	/* DATA bytes for the stream; return credit with mux_stream_consumed(). */
	void (*on_data)(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len,
			void *stream_ud, void *ud);
	/* the peer will send no more on this stream (FIN). */
	void (*on_fin)(struct mux_session *s, uint32_t id, void *stream_ud, void *ud);
	/* the stream is gone: code MUX_NO_ERROR after FIN both ways, else the
	 * RST code (ours or the peer's, by_peer tells), MUX_E_REFUSED with
	 * retryable set when a GOAWAY says the peer never processed it, or the
	 * session's error. Reported once per stream, last. */
	void (*on_stream_close)(struct mux_session *s, uint32_t id, uint32_t code, bool by_peer,
				bool retryable, void *stream_ud, void *ud);
	/* GOAWAY received: no new streams on this session. */
	void (*on_goaway)(struct mux_session *s, uint32_t last_stream_id, uint32_t code,
			  uint32_t reconnect_ms, const char *debug, size_t debug_len, void *ud);
	/* the answer to our last PING, rtt_ms after it was queued. */
	void (*on_ping_ack)(struct mux_session *s, uint64_t rtt_ms, void *ud);
	/* the session failed (protocol violation, flow-control breach, dead
	 * peer...): every stream has been closed with this code, a GOAWAY is
	 * queued. Reported once. */
	void (*on_session_error)(struct mux_session *s, uint32_t code, const char *msg, void *ud);
	/* the scheduler may send up to max bytes on stream id: copy them to dst
	 * and return their count; set *eof when this is the stream's end (FIN;
	 * may come with 0 bytes). Returning 0 without eof parks the stream until
	 * the next mux_resume(). A negative result resets it (INTERNAL). */
	long (*read_data)(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof,
			  void *stream_ud, void *ud);
};

/* ---- codec (no session needed; used by the session, tests and tools) ---- */

const char *mux_error_name(uint32_t code);
const char *mux_frame_name(uint8_t type);
void mux_settings_default(struct mux_settings *st);
/* false (and why, in err) if a setting is out of range. */
bool mux_settings_check(const struct mux_settings *st, const char **err);

void mux_header_encode(uint8_t out[MUX_HEADER_LEN], const struct mux_header *h);
void mux_header_decode(const uint8_t in[MUX_HEADER_LEN], struct mux_header *h);
/*
 * The checks made on a header before its payload is read: reserved bits,
 * flags the type does not define, the stream id the type requires, payload
 * length (DATA <= max_frame, control <= MUX_CONTROL_MAX, fixed sizes of
 * WINDOW_UPDATE/RST/PING/GOAWAY). Returns MUX_NO_ERROR or MUX_E_PROTOCOL,
 * with a static reason in *why. Unknown types pass (length <= MUX_CONTROL_MAX).
 */
uint32_t mux_header_check(const struct mux_header *h, uint32_t max_frame, const char **why);

/*
 * Frame builders: write one whole frame (header + payload) into buf and
 * return its length, or 0 if it does not fit in cap or the input is invalid.
 */
size_t mux_build_hello(uint8_t *buf, size_t cap, const struct mux_hello *hello);
size_t mux_build_hello_ack(uint8_t *buf, size_t cap, const struct mux_hello *ack);
size_t mux_build_open(uint8_t *buf, size_t cap, uint32_t id, const struct mux_open *open);
size_t mux_build_open_ack(uint8_t *buf, size_t cap, uint32_t id, uint32_t window);
size_t mux_build_rst(uint8_t *buf, size_t cap, uint32_t id, uint32_t code);
size_t mux_build_window_update(uint8_t *buf, size_t cap, uint32_t id, uint32_t increment);
size_t mux_build_ping(uint8_t *buf, size_t cap, bool ack, const uint8_t opaque[8]);
size_t mux_build_goaway(uint8_t *buf, size_t cap, uint32_t last_id, uint32_t code,
			uint32_t reconnect_ms, const char *debug, size_t debug_len);
size_t mux_build_data(uint8_t *buf, size_t cap, uint32_t id, bool fin, const uint8_t *data,
		      size_t len);

/*
 * Payload parsers: MUX_NO_ERROR, or MUX_E_PROTOCOL with a static reason in
 * *why (truncated or duplicate TLV, bad value size, a required TLV missing,
 * a setting out of range). Unknown TLV types are skipped.
 */
uint32_t mux_parse_hello(const uint8_t *p, size_t len, struct mux_hello *out, const char **why);
uint32_t mux_parse_hello_ack(const uint8_t *p, size_t len, struct mux_hello *out, const char **why);
uint32_t mux_parse_open(const uint8_t *p, size_t len, struct mux_open *out, const char **why);
uint32_t mux_parse_open_ack(const uint8_t *p, size_t len, uint32_t *window, const char **why);

/* ---- session ---- */

/*
 * A new session. settings are ours (what we grant the peer), checked with
 * mux_settings_check(); cb is copied. Returns NULL on a bad setting or out of
 * memory. Free with mux_session_free().
 */
struct mux_session *mux_session_new(enum mux_role role, const struct mux_settings *settings,
				    const struct mux_callbacks *cb, void *ud);
/* Frees the session and its streams without reporting anything. NULL is fine. */
void mux_session_free(struct mux_session *s);

/* agent: queue the preface and HELLO. hello's versions and settings are
 * filled in by the session. false if called twice or the hello is invalid. */
bool mux_hello(struct mux_session *s, const char *agent_id, const uint8_t *proof, size_t proof_len,
	       uint64_t now_ms);
/* relay: answer the HELLO reported by on_hello(). */
bool mux_accept(struct mux_session *s, const uint8_t session_id[MUX_ID_LEN], uint64_t server_time_ms);

/*
 * Bytes read from the transport, any split. now_ms is the caller's monotonic
 * clock (liveness). Returns false once the session has failed (now or
 * before): flush mux_pending() and close the transport.
 */
bool mux_feed(struct mux_session *s, const uint8_t *data, size_t len, uint64_t now_ms);
/* Bytes to write: *out points at them, valid until the next mux call. */
size_t mux_pending(struct mux_session *s, const uint8_t **out);
/* n bytes of what mux_pending() returned were written. */
void mux_consumed(struct mux_session *s, size_t n);
/*
 * Heartbeat: queues a PING every ping_interval_ms once established, fails the
 * session with TIMEOUT when nothing arrived for dead_after_ms (our settings,
 * not the peer's). The clock starts at mux_hello() or at the first
 * mux_feed()/mux_tick(), whichever comes first; it must not go back.
 * Returns the clock value at which to call it next.
 */
uint64_t mux_tick(struct mux_session *s, uint64_t now_ms);

/*
 * relay: open a stream. Returns its id, or 0 (and the reason in *err) when
 * the session is not established, going away, failed, or at max_streams
 * (MUX_E_STREAM_LIMIT), or the open is invalid. DATA may follow at once.
 */
uint32_t mux_open(struct mux_session *s, const struct mux_open *open, void *stream_ud, uint32_t *err);
/* agent: the stream's database is connected. window: 0 = our setting, else
 * our receive window for this stream, which may only grow (DATA from the
 * relay may already be on its way). */
bool mux_open_ack(struct mux_session *s, uint32_t id, uint32_t window);
/* Set the user pointer later callbacks get for stream id. false if unknown. */
bool mux_stream_set_user(struct mux_session *s, uint32_t id, void *stream_ud);
/* Abort a stream both ways with RST(code); on_stream_close() follows. */
bool mux_reset(struct mux_session *s, uint32_t id, uint32_t code);
/* The stream has bytes (or its end) to send: read_data() will be asked. */
bool mux_resume(struct mux_session *s, uint32_t id);
/*
 * n bytes received on stream id were written onward: credit returns to the
 * peer once a sixteenth of a window is owed (MUX_CREDIT_PARTS). Ignored for
 * unknown ids: a stream's outstanding bytes are credited to the session
 * when it closes.
 */
void mux_stream_consumed(struct mux_session *s, uint32_t id, size_t n);

/*
 * Stop taking new streams: GOAWAY(last stream id we processed, code,
 * reconnect_ms, debug). The agent refuses (RST REFUSED) OPENs above that id;
 * a relay opens nothing after it. Streams already open go on until they
 * close; the owner closes the transport when mux_stream_count() is 0 or its
 * drain deadline passes. May be sent again; the last id never grows.
 */
bool mux_goaway(struct mux_session *s, uint32_t code, uint32_t reconnect_ms, const char *debug);
/* Close every stream with code (no RST, no GOAWAY): the transport is gone. */
void mux_session_abort(struct mux_session *s, uint32_t code);

/* ---- inspection ---- */
bool mux_established(const struct mux_session *s);
bool mux_failed(const struct mux_session *s);
bool mux_going_away(const struct mux_session *s);	/* GOAWAY sent or received */
unsigned mux_stream_count(const struct mux_session *s);
const struct mux_settings *mux_peer_settings(const struct mux_session *s);
/* Windows: what we may still send, what the peer may still send us; -1 if the stream is unknown. */
long long mux_stream_send_window(const struct mux_session *s, uint32_t id);
long long mux_stream_recv_window(const struct mux_session *s, uint32_t id);
long long mux_session_send_window(const struct mux_session *s);
long long mux_session_recv_window(const struct mux_session *s);
int mux_stream_state(const struct mux_session *s, uint32_t id);	/* enum mux_stream_state, -1 unknown */

#endif
