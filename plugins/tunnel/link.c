/* SPDX-License-Identifier: ISC */
/*
 * link -- a mux session over a TLS bufferevent, and a stream's local side
 * (link.h). Shared by the relay and the agent.
 */
#include "link.h"

#include <event2/buffer.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

/* ================= the connection ================= */

static void tlink_reap(evutil_socket_t fd, short what, void *arg)
{
	struct tlink *l = arg;

	(void)fd;
	(void)what;
	mux_session_abort(l->s, MUX_E_TIMEOUT);	/* reports every stream closed */
	mux_session_free(l->s);
	l->s = NULL;
	if (l->tick)
		event_free(l->tick);
	l->tick = NULL;
	if (l->bev)
		bufferevent_free(l->bev);
	l->bev = NULL;
	l->ops->reaped(l);
}

void tlink_kill(struct tlink *l, const char *why)
{
	struct timeval zero = { 0, 0 };

	if (l->dying)
		return;
	l->dying = true;
	l->ops->killed(l, why ? why : "");
	if (l->bev)
		bufferevent_disable(l->bev, EV_READ | EV_WRITE);
	event_base_once(l->base, -1, EV_TIMEOUT, tlink_reap, l, &zero);
}

void tlink_flush(struct tlink *l)
{
	struct evbuffer *out;
	const uint8_t *p;
	size_t n;

	if (l->dying || !l->tls_up)
		return;
	out = bufferevent_get_output(l->bev);
	while (evbuffer_get_length(out) < TLINK_OUT_LOW_WATER && (n = mux_pending(l->s, &p)) > 0) {
		if (evbuffer_add(out, p, n) != 0) {
			tlink_kill(l, "out of memory");
			return;
		}
		mux_consumed(l->s, n);
	}
	if (l->ops->flushed)
		l->ops->flushed(l);
	if (l->close_when_flushed && evbuffer_get_length(out) == 0)
		tlink_kill(l, "");
}

static void tlink_read_cb(struct bufferevent *bev, void *arg)
{
	struct tlink *l = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v[8];
	bool ok = true;

	while (ok && !l->dying && evbuffer_get_length(in) > 0) {
		int n = evbuffer_peek(in, -1, NULL, v, 8);
		size_t used = 0;

		for (int i = 0; i < n && i < 8 && ok; i++) {
			ok = mux_feed(l->s, v[i].iov_base, v[i].iov_len, l->ops->now_ms());
			used += v[i].iov_len;
		}
		evbuffer_drain(in, used);
	}
	if (!ok)
		l->close_when_flushed = true;
	tlink_flush(l);
}

static void tlink_write_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	tlink_flush(arg);
}

/*
 * TCP_NODELAY on a connection of the tunnel (the session's, or one to a
 * site database): frames and PostgreSQL messages are small, and Nagle would
 * hold each one until the previous is acknowledged -- about one more round
 * trip per statement once several streams are busy. A unix socket refuses
 * it; nothing to do then.
 */
void tlink_nodelay(evutil_socket_t fd)
{
	int on = 1;

	if (fd >= 0)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

bool tlink_open(struct tlink *l, struct event_base *base, SSL *ssl, evutil_socket_t fd,
		enum bufferevent_ssl_state state, enum mux_role role, const struct mux_settings *settings,
		const struct mux_callbacks *cb, void *ud, const struct tlink_ops *ops, event_callback_fn tick_cb)
{
	l->ops = ops;
	l->base = base;
	l->started_ms = ops->now_ms();
	tlink_nodelay(fd);
	l->bev = bufferevent_openssl_socket_new(base, fd, ssl, state, BEV_OPT_CLOSE_ON_FREE);
	if (!l->bev) {
		SSL_free(ssl);
		if (fd >= 0)
			evutil_closesocket(fd);
		return false;
	}
	l->s = mux_session_new(role, settings, cb, ud);
	l->tick = evtimer_new(base, tick_cb, l);
	if (!l->s || !l->tick) {
		mux_session_free(l->s);
		if (l->tick)
			event_free(l->tick);
		bufferevent_free(l->bev);
		l->s = NULL;
		l->tick = NULL;
		l->bev = NULL;
		return false;
	}
	return true;
}

void tlink_start(struct tlink *l, bufferevent_event_cb event_cb)
{
	bufferevent_setcb(l->bev, tlink_read_cb, tlink_write_cb, event_cb, l);
	bufferevent_setwatermark(l->bev, EV_WRITE, TLINK_OUT_LOW_WATER / 2, 0);
	bufferevent_enable(l->bev, EV_READ | EV_WRITE);
}

void tlink_arm(struct tlink *l, uint64_t now, uint64_t next)
{
	struct timeval tv;

	if (next <= now)
		next = now + 1;
	tv.tv_sec = (time_t)((next - now) / 1000);
	tv.tv_usec = (suseconds_t)((next - now) % 1000 * 1000);
	evtimer_add(l->tick, &tv);
}

bool tlink_exporter(struct tlink *l, uint8_t out[32])
{
	SSL *ssl = bufferevent_openssl_get_ssl(l->bev);

	return ssl && SSL_export_keying_material(ssl, out, 32, TLINK_EXPORTER_LABEL, strlen(TLINK_EXPORTER_LABEL),
						 NULL, 0, 0) == 1;
}

bool tlink_event_text(struct bufferevent *bev, short what, char *why, size_t wlen)
{
	unsigned long e = bufferevent_get_openssl_error(bev);

	if (e && (ERR_GET_LIB(e) == 0 || ERR_GET_LIB(e) == ERR_LIB_SYS))
		e = 0;	/* a socket error libevent passed through OpenSSL's queue */
	if (e) {
		ERR_error_string_n(e, why, wlen);
		return true;
	}
	if ((what & BEV_EVENT_ERROR) && EVUTIL_SOCKET_ERROR())
		snprintf(why, wlen, "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	return false;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

bool tlink_hex32(const char *hex, size_t len, uint8_t out[32])
{
	if (len != 64)
		return false;
	for (int i = 0; i < 32; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}

void tlink_settings(struct mux_settings *st)
{
	const char *w = getenv("LOKADB_MUX_WINDOW_KB");

	mux_settings_default(st);
	if (w && atol(w) > 0 && atol(w) <= (long)(MUX_WINDOW_MAX / 1024))
		st->stream_window = (uint32_t)atol(w) * 1024u;
}

/* ================= a stream's local side ================= */

static void local_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct tlink_stream *ts = arg;

	(void)buf;
	if (info->n_deleted && !ts->l->dying) {
		mux_stream_consumed(ts->l->s, ts->id, info->n_deleted);
		tlink_flush(ts->l);
	}
}

static void local_read_cb(struct bufferevent *bev, void *arg)
{
	struct tlink_stream *ts = arg;

	(void)bev;
	if (!ts->l->dying && ts->ready) {
		mux_resume(ts->l->s, ts->id);
		tlink_flush(ts->l);
	}
}

static void local_write_cb(struct bufferevent *bev, void *arg)
{
	struct tlink_stream *ts = arg;

	if (ts->fin_in && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		shutdown(bufferevent_getfd(bev), SHUT_WR);
}

void tlink_stream_attach(struct tlink_stream *ts, bufferevent_event_cb event_cb)
{
	bufferevent_setcb(ts->bev, local_read_cb, local_write_cb, event_cb, ts);
	bufferevent_setwatermark(ts->bev, EV_READ, 0, TLINK_LOCAL_READ_HIGH);
	evbuffer_add_cb(bufferevent_get_output(ts->bev), local_out_cb, ts);
	bufferevent_enable(ts->bev, EV_READ | EV_WRITE);
}

void tlink_stream_event(struct tlink_stream *ts, short what)
{
	struct tlink *l = ts->l;	/* ts may be freed by the reset */

	if (l->dying)
		return;
	if (what & BEV_EVENT_EOF) {
		ts->eof = true;
		mux_resume(l->s, ts->id);
	} else if (what & BEV_EVENT_ERROR) {
		mux_reset(l->s, ts->id, MUX_E_CANCEL);
	}
	tlink_flush(l);
}

void tlink_stream_data(struct tlink_stream *ts, const uint8_t *data, size_t len)
{
	ts->l->bytes_in += (long long)len;
	ts->bytes_in += (long long)len;
	if (!ts->bev || bufferevent_write(ts->bev, data, len) != 0) {
		mux_stream_consumed(ts->l->s, ts->id, len);
		mux_reset(ts->l->s, ts->id, MUX_E_INTERNAL);
	}
}

void tlink_stream_fin(struct tlink_stream *ts)
{
	ts->fin_in = true;
	if (ts->bev && ts->ready)
		local_write_cb(ts->bev, ts);
}

long tlink_stream_read(struct tlink_stream *ts, uint8_t *dst, size_t max, bool *eof)
{
	int n;

	if (!ts->bev) {
		*eof = true;
		return 0;
	}
	if (!ts->ready)
		return 0;
	n = evbuffer_remove(bufferevent_get_input(ts->bev), dst, max);
	if (n < 0)
		return -1;
	ts->l->bytes_out += n;
	ts->bytes_out += n;
	if (ts->eof && evbuffer_get_length(bufferevent_get_input(ts->bev)) == 0)
		*eof = true;
	return n;
}

void tlink_cb_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *sud, void *ud)
{
	(void)s;
	(void)id;
	(void)ud;
	tlink_stream_data(sud, data, len);
}

void tlink_cb_fin(struct mux_session *s, uint32_t id, void *sud, void *ud)
{
	(void)s;
	(void)id;
	(void)ud;
	tlink_stream_fin(sud);
}

long tlink_cb_read(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *sud, void *ud)
{
	(void)s;
	(void)id;
	(void)ud;
	return tlink_stream_read(sud, dst, max, eof);
}

static void drained_cb(struct bufferevent *bev, void *arg)
{
	(void)arg;
	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		bufferevent_free(bev);
}

static void drained_event_cb(struct bufferevent *bev, short what, void *arg)
{
	(void)what;
	(void)arg;
	bufferevent_free(bev);
}

void tlink_stream_close(struct tlink_stream *ts, uint32_t code)
{
	struct bufferevent *bev = ts->bev;

	ts->bev = NULL;
	if (!bev)
		return;
	if (code != MUX_NO_ERROR || evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
		bufferevent_free(bev);
		return;
	}
	/* both FINs went: let the last bytes leave, then close */
	evbuffer_remove_cb(bufferevent_get_output(bev), local_out_cb, ts);
	bufferevent_disable(bev, EV_READ);
	bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
	bufferevent_setcb(bev, NULL, drained_cb, drained_event_cb, NULL);
}
