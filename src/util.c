/* SPDX-License-Identifier: ISC */
/*
 * util.c -- small shared helpers of the core: clocks, allocation, address
 * formatting and the ParameterStatus variable cache.
 *
 * The varcache owns its strings. (What a server owes is its reply queue,
 * prepared.c.)
 */
#include "core.h"

#include <openssl/ssl.h>
#include <event2/bufferevent_ssl.h>

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <time.h>

usec_t now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (usec_t)ts.tv_sec * USEC + ts.tv_nsec / 1000;
}

usec_t now_wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (usec_t)ts.tv_sec * USEC + ts.tv_nsec / 1000;
}

char *xstrdup(const char *s)
{
	char *r;
	if (!s)
		return NULL;
	r = strdup(s);
	if (!r) {
		log_fatal("out of memory");
		abort();
	}
	return r;
}

/*
 * Cancel keys and salts: OpenSSL's DRBG, drawn 256 bytes at a time (one
 * DRBG call per 32 connections instead of one each); libevent's generator as
 * a fallback. Bytes are handed out once and wiped from the pool.
 */
void random_bytes(void *buf, size_t n)
{
	uint8_t *out = buf;

	while (n > 0) {
		size_t take;
		if (rt->rand_pos == sizeof(rt->rand_pool)) {
			if (RAND_bytes(rt->rand_pool, sizeof(rt->rand_pool)) != 1)
				evutil_secure_rng_get_bytes(rt->rand_pool, sizeof(rt->rand_pool));
			rt->rand_pos = 0;
		}
		take = sizeof(rt->rand_pool) - rt->rand_pos;
		if (take > n)
			take = n;
		memcpy(out, rt->rand_pool + rt->rand_pos, take);
		OPENSSL_cleanse(rt->rand_pool + rt->rand_pos, take);
		rt->rand_pos += take;
		out += take;
		n -= take;
	}
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n, size);
	if (!p) {
		log_fatal("out of memory");
		abort();
	}
	return p;
}

const char *addr_to_str(const struct sockaddr_storage *ss, char *buf, size_t len, int *port)
{
	*port = 0;
	buf[0] = 0;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &in->sin_addr, buf, len);
		*port = ntohs(in->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, buf, len);
		*port = ntohs(in6->sin6_port);
	} else if (ss->ss_family == AF_UNIX) {
		snprintf(buf, len, "unix");
	}
	return buf;
}

/* TCP_NODELAY and the tcp_keep* settings, for client and server sockets. */
void tcp_tune(int fd)
{
	const struct lk_config *cf = rt->cf;
	int on = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
	if (!cf->tcp_keepalive)
		return;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	if (cf->tcp_keepidle > 0)
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &cf->tcp_keepidle, sizeof(int));
	if (cf->tcp_keepintvl > 0)
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &cf->tcp_keepintvl, sizeof(int));
	if (cf->tcp_keepcnt > 0)
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cf->tcp_keepcnt, sizeof(int));
}

/* ---- varcache ---- */

static const char *const var_names[VAR_COUNT] = {
	"client_encoding", "DateStyle", "TimeZone", "standard_conforming_strings",
	"application_name", "IntervalStyle",
};

const char *varcache_name(enum var_id id)
{
	return var_names[id];
}

int varcache_lookup(const char *name)
{
	for (int i = 0; i < VAR_COUNT; i++)
		if (strcasecmp(var_names[i], name) == 0)
			return i;
	return -1;
}

void varcache_set(struct varcache *vc, enum var_id id, const char *value)
{
	if (vc->v[id] && value && strcmp(vc->v[id], value) == 0)
		return;
	free(vc->v[id]);
	vc->v[id] = xstrdup(value);
}

void varcache_free(struct varcache *vc)
{
	for (int i = 0; i < VAR_COUNT; i++) {
		free(vc->v[i]);
		vc->v[i] = NULL;
	}
}


/* ---- write-through output ----
 *
 * A bufferevent normally writes only when the loop reports the socket
 * writable, which costs two epoll_ctl calls and a loop turn per reply. Our
 * client and server sockets keep EV_WRITE disabled instead and write their
 * output directly, once per loop turn: adding to an output buffer queues its
 * connection on rt->flush_list, and rt->flush_ev (made active, so it runs in
 * the same loop turn after the current callbacks) writes every queued buffer.
 * Only when the kernel does not take everything is EV_WRITE enabled, until
 * the owner's write callback sees the buffer empty and calls
 * conn_write_idle().
 *
 * The bufferevent's own buffer callbacks are left alone (not deferred): they
 * must not run after bufferevent_free().
 */
static void conn_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct conn_io *wt = arg;
	(void)buf;

	if (info->n_added == 0 || wt->queued)
		return;
	wt->queued = true;
	TAILQ_INSERT_TAIL(&rt->flush_list, wt, entry);
	event_active(rt->flush_ev, EV_TIMEOUT, 0);
}

static void conn_flush_one(struct conn_io *wt)
{
	struct bufferevent *bev = wt->bev;
	struct evbuffer *buf = bufferevent_get_output(bev);
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;
	int fd = bufferevent_getfd(bev);

	if (fd < 0 || (bufferevent_get_enabled(bev) & EV_WRITE))
		return;
	/* a bufferevent keeps its output's start frozen; it unfreezes it the same way to write */
	evbuffer_unfreeze(buf, 1);
	while (evbuffer_get_length(buf) > 0 && evbuffer_write(buf, fd) > 0)
		;
	evbuffer_freeze(buf, 1);
	if (evbuffer_get_length(buf) > 0) {
		bufferevent_enable(bev, EV_WRITE);	/* full, or an error the bufferevent will report */
		return;
	}
	bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
	if (writecb)
		writecb(bev, cbarg);
}

/* rt->flush_ev: write every queued output buffer. */
void conn_flush_all(void)
{
	struct conn_io *wt;

	while ((wt = TAILQ_FIRST(&rt->flush_list))) {
		TAILQ_REMOVE(&rt->flush_list, wt, entry);
		wt->queued = false;
		conn_flush_one(wt);
	}
}

void conn_write_through(struct conn_io *wt, struct bufferevent *bev)
{
	wt->bev = bev;
	wt->queued = false;
	evbuffer_add_cb(bufferevent_get_output(bev), conn_out_cb, wt);
}

void conn_write_idle(struct bufferevent *bev)
{
	if (bufferevent_openssl_get_ssl(bev))
		return;		/* TLS writes through the bufferevent: EV_WRITE stays on */
	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0 && (bufferevent_get_enabled(bev) & EV_WRITE))
		bufferevent_disable(bev, EV_WRITE);
}

/* ---- reading ----
 *
 * The bufferevent's own reading sizes every read with an FIONREAD ioctl.
 * Our sockets read with one recv() into the input buffer instead, from an
 * event of ours on the same socket; the bufferevent's EV_READ stays off.
 * The owner's read and event callbacks (from bufferevent_getcb()) are called
 * as the bufferevent would call them.
 */
#define CONN_READ_CHUNK 16384

static void conn_update_rd(struct conn_io *io)
{
	bool on = io->rd_want && (!io->rd_high ||
				  evbuffer_get_length(bufferevent_get_input(io->bev)) < io->rd_high);
	if (on == io->rd_on)
		return;
	if (on)
		event_add(io->rd, NULL);
	else
		event_del(io->rd);
	io->rd_on = on;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn_io *io = arg;
	struct bufferevent *bev = io->bev;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v;
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;
	ssize_t n;
	(void)what;

	rt->now = now_mono();
	/*
	 * Into the buffer's free tail when it has room (a message arriving in
	 * pieces), else through rt->readbuf: a small message then costs a
	 * small chain instead of a fresh CONN_READ_CHUNK one.
	 */
	evbuffer_unfreeze(in, 0);
	if (evbuffer_get_length(in) > 0 && evbuffer_reserve_space(in, CONN_READ_CHUNK, &v, 1) >= 1) {
		n = recv(fd, v.iov_base, v.iov_len, 0);
		if (n > 0) {
			v.iov_len = (size_t)n;
			evbuffer_commit_space(in, &v, 1);
		}
	} else {
		n = recv(fd, rt->readbuf, sizeof(rt->readbuf), 0);
		if (n > 0)
			evbuffer_add(in, rt->readbuf, (size_t)n);
	}
	evbuffer_freeze(in, 0);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
	if (n > 0) {
		conn_update_rd(io);
		if (readcb)
			readcb(bev, cbarg);
		return;
	}
	conn_want_read(io, false);
	if (eventcb)
		eventcb(bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), cbarg);
}

/* Read now instead of waiting for the loop to report the socket readable. */
void conn_read_now(struct conn_io *io)
{
	if (io->rd && io->rd_on)
		conn_read_cb(bufferevent_getfd(io->bev), EV_READ, io);
}

/* Set up our read event once the bufferevent has a connected socket. */
bool conn_io_start(struct conn_io *io, size_t rd_high)
{
	if (io->rd)	/* a spare: point it at the new socket */
		event_assign(io->rd, rt->base, bufferevent_getfd(io->bev), EV_READ | EV_PERSIST, conn_read_cb, io);
	else
		io->rd = event_new(rt->base, bufferevent_getfd(io->bev), EV_READ | EV_PERSIST, conn_read_cb, io);
	io->rd_high = rd_high;
	return io->rd != NULL;
}

/* The owner wants (or not) input. */
void conn_want_read(struct conn_io *io, bool on)
{
	io->rd_want = on;
	if (io->rd)
		conn_update_rd(io);
	else if (io->tls && io->bev) {
		if (on)
			bufferevent_enable(io->bev, EV_READ);
		else
			bufferevent_disable(io->bev, EV_READ);
	}
}

/* After consuming input: resume reading if the high mark had stopped it. */
void conn_read_check(struct conn_io *io)
{
	if (io->rd && io->rd_want && !io->rd_on)
		conn_update_rd(io);
}

/* Let the input grow to `high` bytes before reading stops. */
void conn_set_rd_high(struct conn_io *io, size_t high)
{
	io->rd_high = high;
	if (io->tls && io->bev)
		bufferevent_setwatermark(io->bev, EV_READ, 0, high);
	else if (io->rd)
		conn_update_rd(io);
}

/*
 * Move a plain connection to TLS: a bufferevent_openssl on the same socket
 * replaces `old` (freed without closing the socket), and the connection
 * leaves the fast path for plain bufferevent I/O. NULL (and `old` intact)
 * when the new bufferevent cannot be made; ssl is freed then.
 */
struct bufferevent *conn_start_tls(struct conn_io *io, struct bufferevent *old, struct ssl_st *ssl, bool accepting)
{
	int fd = bufferevent_getfd(old);
	struct bufferevent *nb;

	nb = bufferevent_openssl_socket_new(rt->base, fd, ssl,
					    accepting ? BUFFEREVENT_SSL_ACCEPTING : BUFFEREVENT_SSL_CONNECTING,
					    BEV_OPT_CLOSE_ON_FREE);
	if (!nb) {
		SSL_free(ssl);
		return NULL;
	}
	if (io->bev == old) {
		evbuffer_remove_cb(bufferevent_get_output(old), conn_out_cb, io);
		if (io->queued)
			TAILQ_REMOVE(&rt->flush_list, io, entry);
		io->queued = false;
	}
	if (io->rd) {
		event_free(io->rd);
		io->rd = NULL;
	}
	io->rd_on = false;
	bufferevent_setcb(old, NULL, NULL, NULL, NULL);
	bufferevent_disable(old, EV_READ | EV_WRITE);
	bufferevent_setfd(old, -1);
	bufferevent_free(old);
	io->bev = nb;
	io->tls = true;
	io->spare_ok = false;
	bufferevent_setwatermark(nb, EV_READ, 0, io->rd_high);
	return nb;
}

static bool conn_spare_put(struct bufferevent *bev, struct event *rd);

/* Free a bufferevent, with its write-through state if it has one. */
void conn_free(struct conn_io *wt, struct bufferevent *bev)
{
	struct event *rd = wt ? wt->rd : NULL;

	if (wt && wt->bev == bev) {
		evbuffer_remove_cb(bufferevent_get_output(bev), conn_out_cb, wt);
		if (wt->queued)
			TAILQ_REMOVE(&rt->flush_list, wt, entry);
		wt->queued = false;
		wt->bev = NULL;
	}
	if (wt) {
		wt->rd = NULL;
		wt->rd_on = wt->rd_want = false;
	}
	if (rd && wt->spare_ok && conn_spare_put(bev, rd))
		return;
	if (rd)
		event_free(rd);
	bufferevent_free(bev);
}

/* ---- spare bufferevents ----
 *
 * A freed bufferevent is finalized through the event loop and a new one is
 * three allocations; client connections come and go per request for some
 * applications. So a closed client's bufferevent and read event are kept
 * (socket closed, buffers emptied, callbacks cleared) and given to the next
 * accepted socket with bufferevent_setfd().
 */
static bool conn_spare_put(struct bufferevent *bev, struct event *rd)
{
	int fd = bufferevent_getfd(bev);
	struct evbuffer *in = bufferevent_get_input(bev), *out = bufferevent_get_output(bev);

	if (rt->n_spares == CONN_SPARES_MAX || fd < 0)
		return false;
	event_del(rd);
	bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
	bufferevent_disable(bev, EV_READ | EV_WRITE);
	bufferevent_setfd(bev, -1);	/* also unfreezes both buffers */
	evutil_closesocket(fd);
	evbuffer_drain(in, evbuffer_get_length(in));
	evbuffer_drain(out, evbuffer_get_length(out));
	bufferevent_setwatermark(bev, EV_READ | EV_WRITE, 0, 0);
	rt->spares[rt->n_spares].bev = bev;
	rt->spares[rt->n_spares].rd = rd;
	rt->n_spares++;
	return true;
}

/* A bufferevent for an accepted socket: a spare one if there is one. */
struct bufferevent *conn_bev_for(struct conn_io *io, int fd)
{
	struct bufferevent *bev;

	io->spare_ok = true;
	if (rt->n_spares == 0)
		return bufferevent_socket_new(rt->base, fd, BEV_OPT_CLOSE_ON_FREE);
	rt->n_spares--;
	bev = rt->spares[rt->n_spares].bev;
	io->rd = rt->spares[rt->n_spares].rd;
	bufferevent_setfd(bev, fd);
	evbuffer_freeze(bufferevent_get_input(bev), 0);	/* as a new bufferevent has them */
	evbuffer_freeze(bufferevent_get_output(bev), 1);
	return bev;
}

void conn_spares_free(void)
{
	while (rt->n_spares > 0) {
		rt->n_spares--;
		event_free(rt->spares[rt->n_spares].rd);
		bufferevent_free(rt->spares[rt->n_spares].bev);
	}
}
