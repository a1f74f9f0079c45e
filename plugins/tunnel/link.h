/* SPDX-License-Identifier: ISC */
/*
 * link -- the glue between a mux session and libevent, shared by the relay
 * and the agent plugins (compiled into both; not part of MUX_SRCS, which
 * stays free of I/O for the unit tests and the fuzzer).
 *
 * A tlink is one TLS connection carrying one mux session: it owns the
 * bufferevent, the session and the tick timer, pumps mux_pending() into the
 * output while it is below TLINK_OUT_LOW_WATER, feeds what arrives, and
 * frees everything from a zero-delay event after tlink_kill() (never inside
 * a callback of its own). The owner embeds a struct tlink, gives it a
 * tlink_ops, and learns of the end through ops->killed (log) and
 * ops->reaped (unlink and free the owner).
 *
 * A tlink_stream is one stream's local side (the core's socketpair end at
 * the relay, the database connection at the agent): bytes from the stream
 * are written to it and credited back only once they left it; bytes read
 * from it feed read_data; EOF becomes a FIN and a FIN a shutdown(SHUT_WR)
 * once the output is empty.
 *
 * Rules: every call that changes the session must be followed by
 * tlink_flush() (control frames wait in the session); a stream whose
 * tlink is dying is left alone (the reap closes it).
 */
#ifndef LOKADB_TUNNEL_LINK_H
#define LOKADB_TUNNEL_LINK_H

#include "mux.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <stddef.h>

#define TLINK_OUT_LOW_WATER	(256 * 1024)	/* produce more mux output below this */
#define TLINK_LOCAL_READ_HIGH	(256 * 1024)	/* stop reading a stream's local side above this */
#define TLINK_PROOF_LEN		32
#define TLINK_EXPORTER_LABEL	"EXPORTER-Channel-Binding"

/* The owner of an embedded member: TLINK_OWNER(l, struct agent, link). */
#define TLINK_OWNER(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

struct tlink;

struct tlink_ops {
	uint64_t (*now_ms)(void);
	/* tlink_kill() ran: dying is set; why is "" for a quiet close */
	void (*killed)(struct tlink *l, const char *why);
	/* the session (every stream reported closed), timer and connection are
	 * freed: unlink and free the owner */
	void (*reaped)(struct tlink *l);
	/* optional, after each flush of a live link: may set close_when_flushed */
	void (*flushed)(struct tlink *l);
};

struct tlink {
	struct bufferevent *bev;	/* TLS */
	struct mux_session *s;
	struct event *tick;
	const struct tlink_ops *ops;
	struct event_base *base;
	uint64_t started_ms;
	long long bytes_in, bytes_out;	/* stream bytes from / to the peer */
	bool dying, close_when_flushed, established;
	bool tls_up;			/* output may be produced */
};

/*
 * Make the connection (fd: an accepted socket, or -1 to connect later),
 * its session and its timer (tick_cb gets the tlink). Takes ownership of
 * ssl and fd, also on failure. Nothing runs until tlink_start().
 */
void tlink_nodelay(evutil_socket_t fd);
bool tlink_open(struct tlink *l, struct event_base *base, SSL *ssl, evutil_socket_t fd,
		enum bufferevent_ssl_state state, enum mux_role role, const struct mux_settings *settings,
		const struct mux_callbacks *cb, void *ud, const struct tlink_ops *ops, event_callback_fn tick_cb);
/* Set the callbacks (event_cb: the owner's, arg is the tlink) and enable
 * the connection; the owner then arms the timer. */
void tlink_start(struct tlink *l, bufferevent_event_cb event_cb);
/* Write the session's output while the connection's output is low; close
 * once close_when_flushed and everything left. */
void tlink_flush(struct tlink *l);
/* Stop the link now; it is freed from the loop (ops->reaped). Idempotent. */
void tlink_kill(struct tlink *l, const char *why);
/* Arm the timer for the absolute time next (at least 1 ms ahead). */
void tlink_arm(struct tlink *l, uint64_t now, uint64_t next);
/* The 32-byte TLS exporter (RFC 9266 label) of the connection. */
bool tlink_exporter(struct tlink *l, uint8_t out[32]);
/*
 * What a bufferevent event means, in why (left alone for a plain close):
 * true when OpenSSL reported the failure (a TLS error), false otherwise.
 */
bool tlink_event_text(struct bufferevent *bev, short what, char *why, size_t wlen);
/* "64 hex digits" -> 32 bytes; false when it is not exactly that. */
bool tlink_hex32(const char *hex, size_t len, uint8_t out[32]);
/* mux settings with LOKADB_MUX_WINDOW_KB applied (a test and bench knob). */
void tlink_settings(struct mux_settings *st);

struct tlink_stream {
	struct tlink *l;
	uint32_t id;
	struct bufferevent *bev;	/* the local side */
	bool eof;			/* the local side sent EOF */
	bool fin_in;			/* the peer sent FIN */
	bool ready;			/* the local side is connected: read it */
	long long bytes_in, bytes_out;	/* from the peer, to the peer */
};

/*
 * Set the local side's callbacks (event_cb: the owner's, which ends in
 * tlink_stream_event(); arg is the tlink_stream), read watermark and credit
 * callback, and enable it.
 */
void tlink_stream_attach(struct tlink_stream *ts, bufferevent_event_cb event_cb);
/* EOF -> FIN, error -> RST(CANCEL); flushes. */
void tlink_stream_event(struct tlink_stream *ts, short what);
/* mux on_data: write onward (RST INTERNAL when that fails). */
void tlink_stream_data(struct tlink_stream *ts, const uint8_t *data, size_t len);
/* mux on_fin */
void tlink_stream_fin(struct tlink_stream *ts);
/* mux read_data */
long tlink_stream_read(struct tlink_stream *ts, uint8_t *dst, size_t max, bool *eof);
/*
 * The same as mux callbacks, for a callback table: the stream's user data
 * must be the owner's stream struct, which begins with its tlink_stream.
 */
void tlink_cb_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *sud, void *ud);
void tlink_cb_fin(struct mux_session *s, uint32_t id, void *sud, void *ud);
long tlink_cb_read(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *sud, void *ud);
/*
 * mux on_stream_close: after a clean close the local side keeps writing
 * what it holds, then frees itself; otherwise it is freed now.
 */
void tlink_stream_close(struct tlink_stream *ts, uint32_t code);

#endif
