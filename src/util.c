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
#include <openssl/err.h>

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

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
 * Cancel keys and salts: OpenSSL's DRBG, drawn 4 kB at a time (one DRBG
 * call, about 6,000 instructions of fixed cost, per 512 connections instead
 * of one each); libevent's generator as
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

/*
 * TCP_NODELAY and the tcp_keep* settings on a TCP listen socket, at start and
 * at RELOAD: Linux copies them to every socket accept() returns, which saves
 * the accepted client two to five system calls. A setting back at 0 (OS
 * default) gets the value the kernel gave a socket nobody had tuned.
 */
void tcp_tune_listener(int fd)
{
	static int os_default[3] = { -1, -1, -1 };
	static const int opt[3] = { TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT };
	const struct lk_config *cf = rt->cf;
	const int want[3] = { cf->tcp_keepidle, cf->tcp_keepintvl, cf->tcp_keepcnt };
	int on = 1, keep = cf->tcp_keepalive ? 1 : 0;

	for (int i = 0; i < 3; i++) {
		int v;
		socklen_t len = sizeof(v);
		if (os_default[i] < 0 && getsockopt(fd, IPPROTO_TCP, opt[i], &v, &len) == 0)
			os_default[i] = v;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keep, sizeof(keep));
	for (int i = 0; i < 3; i++) {
		int v = want[i] > 0 ? want[i] : os_default[i];
		if (v > 0)
			setsockopt(fd, IPPROTO_TCP, opt[i], &v, sizeof(int));
	}
}

/* TCP_NODELAY and the tcp_keep* settings, for server sockets. */
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

#define VAR_NAME(s) { s, sizeof(s) - 1 }
static const struct { const char *name; size_t len; } var_names[VAR_COUNT] = {
	VAR_NAME("client_encoding"), VAR_NAME("DateStyle"), VAR_NAME("TimeZone"),
	VAR_NAME("standard_conforming_strings"), VAR_NAME("application_name"), VAR_NAME("IntervalStyle"),
};

const char *varcache_name(enum var_id id)
{
	return var_names[id].name;
}

/* The names' lengths all differ: one strcasecmp() at most. */
int varcache_lookup(const char *name)
{
	size_t n = strlen(name);

	for (int i = 0; i < VAR_COUNT; i++)
		if (var_names[i].len == n)
			return strcasecmp(var_names[i].name, name) == 0 ? i : -1;
	return -1;
}

static uint64_t var_stamp;

/*
 * A value shorter than VAR_INLINE is kept in vc->inl[id], without malloc:
 * the usual ones (encodings, DateStyle, time zones, short application
 * names) cost a client login no allocation.
 */
static bool var_owned(const struct varcache *vc, int id)
{
	return vc->v[id] != vc->inl[id] && !(vc->shared & (1u << id));
}

void varcache_set(struct varcache *vc, enum var_id id, const char *value)
{
	size_t n;

	if (vc->v[id] && value && strcmp(vc->v[id], value) == 0)
		return;
	if (var_owned(vc, id))
		free(vc->v[id]);
	vc->v[id] = NULL;
	vc->shared &= ~(1u << id);
	if (value && (n = strlen(value)) < VAR_INLINE) {
		memcpy(vc->inl[id], value, n + 1);
		vc->v[id] = vc->inl[id];
	} else if (value) {
		vc->v[id] = xstrdup(value);
	}
	vc->stamp = ++var_stamp;
}

/*
 * value without a copy: it must outlive vc (a pool's welcome value, kept
 * until exit, for its clients' varcaches).
 */
void varcache_set_shared(struct varcache *vc, enum var_id id, const char *value)
{
	if (vc->v[id] == value)
		return;
	if (var_owned(vc, id))
		free(vc->v[id]);
	vc->v[id] = (char *)value;
	vc->shared |= 1u << id;
	vc->stamp = ++var_stamp;
}

void varcache_free(struct varcache *vc)
{
	for (int i = 0; i < VAR_COUNT; i++) {
		if (var_owned(vc, i))
			free(vc->v[i]);
		vc->v[i] = NULL;
	}
	vc->shared = 0;
	vc->stamp = ++var_stamp;
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
	if (!rt->in_read_ev)	/* else conn_read_ev() flushes when the read is handled */
		event_active(rt->flush_ev, EV_TIMEOUT, 0);
}

static bool tls_write_out(struct conn_io *io);

/*
 * Write what the kernel takes of buf with send(2)/sendmsg(2) rather than
 * evbuffer_write(): writev(2) on a socket goes through the VFS write path,
 * and the small replies of the hot path fit in one chain, so the common
 * case is one send() of one chain. Stops at the first short write (the
 * socket is full) or error; the caller leaves what is left to EV_WRITE,
 * where the bufferevent reports an error.
 */
#define CONN_SEND_IOV 16

static void conn_send(struct evbuffer *buf, int fd)
{
	struct evbuffer_iovec v[CONN_SEND_IOV];
	struct iovec iov[CONN_SEND_IOV];
	size_t want;
	ssize_t n;
	int k;

	while ((k = evbuffer_peek(buf, -1, NULL, v, CONN_SEND_IOV)) > 0) {
		if (k > CONN_SEND_IOV)
			k = CONN_SEND_IOV;
		if (k == 1) {
			want = v[0].iov_len;
			n = send(fd, v[0].iov_base, want, MSG_NOSIGNAL);
		} else {
			struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)k };

			want = 0;
			for (int i = 0; i < k; i++) {
				iov[i].iov_base = v[i].iov_base;
				iov[i].iov_len = v[i].iov_len;
				want += v[i].iov_len;
			}
			n = sendmsg(fd, &m, MSG_NOSIGNAL);
		}
		if (n <= 0)
			return;
		evbuffer_drain(buf, (size_t)n);
		if ((size_t)n < want)
			return;
	}
}

static void conn_flush_one(struct conn_io *wt)
{
	struct bufferevent *bev = wt->bev;
	struct evbuffer *buf = bufferevent_get_output(bev);
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;
	int fd = bufferevent_getfd(bev);

	if (wt->tls) {
		if (fd < 0 || !wt->hs_done || wt->wr_on || !tls_write_out(wt))
			return;
		bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
		if (writecb)
			writecb(bev, cbarg);
		return;
	}
	if (fd < 0 || (bufferevent_get_enabled(bev) & EV_WRITE))
		return;
	/* a bufferevent keeps its output's start frozen; it unfreezes it the same way to write */
	evbuffer_unfreeze(buf, 1);
	conn_send(buf, fd);
	evbuffer_freeze(buf, 1);
	if (evbuffer_get_length(buf) > 0) {
		bufferevent_enable(bev, EV_WRITE);	/* full, or an error the bufferevent will report */
		return;
	}
	bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
	if (writecb)
		writecb(bev, cbarg);
}

/*
 * Send what wt has queued now, ahead of the end of the loop turn: a reply
 * that completes a transaction leaves before the pool hands its server on,
 * so the client does not wait for that bookkeeping. wt stays queued; the
 * write callback still runs from conn_flush_all(), as before.
 */
void conn_send_now(struct conn_io *wt)
{
	struct bufferevent *bev = wt->bev;
	struct evbuffer *buf;
	int fd;

	if (!wt->queued || wt->tls || !bev)
		return;
	fd = bufferevent_getfd(bev);
	if (fd < 0 || (bufferevent_get_enabled(bev) & EV_WRITE))
		return;
	buf = bufferevent_get_output(bev);
	evbuffer_unfreeze(buf, 1);
	conn_send(buf, fd);
	evbuffer_freeze(buf, 1);
}

/*
 * The forwarding fast path: the last n bytes of src (all it holds) go
 * straight to wt's socket with one send() when wt has nothing queued, so a
 * small reply skips its trip through the output buffer, the buffer
 * callbacks and the end-of-turn flush. Only the move that empties src
 * comes here, so a read still costs at most one send() per direction.
 * Returns the bytes sent (drained from src); the caller moves the rest to
 * the output buffer as before (0: nothing sent, TLS, a socket that is
 * full or failing: the output buffer's path reports errors).
 */
size_t conn_send_from(struct conn_io *wt, struct evbuffer *src, size_t n)
{
	struct bufferevent *bev = wt->bev;
	unsigned char *p;
	ssize_t r;
	int fd;

	if (wt->tls || !bev || evbuffer_get_contiguous_space(src) < n ||
	    evbuffer_get_length(bufferevent_get_output(bev)) != 0 || (bufferevent_get_enabled(bev) & EV_WRITE))
		return 0;
	fd = bufferevent_getfd(bev);
	if (fd < 0 || !(p = evbuffer_pullup(src, (ssize_t)n)))
		return 0;
	r = send(fd, p, n, MSG_NOSIGNAL);
	if (r <= 0)
		return 0;
	evbuffer_drain(src, (size_t)r);
	return (size_t)r;
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

/* A spare's callback (conn_bev_for()) is enabled again rather than added. */
void conn_write_through(struct conn_io *wt, struct bufferevent *bev)
{
	struct evbuffer *out = bufferevent_get_output(bev);

	wt->bev = bev;
	wt->queued = false;
	if (wt->out_cb)
		evbuffer_cb_set_flags(out, wt->out_cb, EVBUFFER_CB_ENABLED);
	else
		wt->out_cb = evbuffer_add_cb(out, conn_out_cb, wt);
}

void conn_write_idle(struct bufferevent *bev)
{
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
	bool on = io->rd_want && (!rt->suspended || io->console) && (!io->rd_high ||
				  evbuffer_get_length(bufferevent_get_input(io->bev)) < io->rd_high);
	if (on == io->rd_on)
		return;
	if (on)
		event_add(io->rd, NULL);
	else
		event_del(io->rd);
	io->rd_on = on;
	/* records OpenSSL already read from the socket: the socket will not say so */
	if (on && io->tls && io->hs_done && SSL_has_pending(io->ssl))
		event_active(io->rd, EV_READ, 0);
}

static void tls_read_cb(struct conn_io *io);

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
	if (io->tls) {
		tls_read_cb(io);
		return;
	}
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

/*
 * The loop's read event. What the read callback queues for writing is
 * written when it returns, in the same turn, without a round through
 * rt->flush_ev (event_active() and its dispatch on every reply).
 * conn_read_now() calls conn_read_cb() from inside other callbacks and
 * leaves the flush to rt->flush_ev.
 */
static void conn_read_ev(evutil_socket_t fd, short what, void *arg)
{
	rt->in_read_ev = true;
	conn_read_cb(fd, what, arg);
	rt->in_read_ev = false;
	if (!TAILQ_EMPTY(&rt->flush_list))
		conn_flush_all();
}

/* Read now instead of waiting for the loop to report the socket readable. */
void conn_read_now(struct conn_io *io)
{
	if (io->rd && io->rd_on)
		conn_read_cb(event_get_fd(io->rd), EV_READ, io);
}

/* Set up our read event once the bufferevent has a connected socket. */
bool conn_io_start(struct conn_io *io, size_t rd_high)
{
	if (!io->rd)	/* a spare's was pointed at the new socket by conn_bev_for() */
		io->rd = event_new(rt->base, bufferevent_getfd(io->bev), EV_READ | EV_PERSIST, conn_read_ev, io);
	io->rd_high = rd_high;
	return io->rd != NULL;
}

/* The owner wants (or not) input. */
void conn_want_read(struct conn_io *io, bool on)
{
	io->rd_want = on;
	if (io->rd)
		conn_update_rd(io);
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
	if (io->rd)
		conn_update_rd(io);
}

/* ---- TLS ----
 *
 * A TLS connection keeps its plain bufferevent and the fast path above:
 * OpenSSL works on the socket itself (SSL_set_fd), our read event drives
 * the handshake and then SSL_read()s into the input buffer, and the flush
 * SSL_write()s the output buffer. (libevent's bufferevent_openssl writes
 * only when the loop reports the socket writable -- two epoll_ctl calls and
 * a loop turn per reply --, makes one TLS record of every buffer chain and
 * reads every record with two read(2) calls: a third of PgBouncer's
 * throughput with one client.) The bufferevent's own EV_READ and EV_WRITE
 * stay off: it would read and write the socket in plaintext.
 */
#define TLS_WRITE_CHUNK (64 * 1024)

static void conn_queue_flush(struct conn_io *io)
{
	if (io->queued)
		return;
	io->queued = true;
	TAILQ_INSERT_TAIL(&rt->flush_list, io, entry);
	event_active(rt->flush_ev, EV_TIMEOUT, 0);
}

static void tls_wr_start(struct conn_io *io)
{
	if (!io->wr_on && event_add(io->wr, NULL) == 0)
		io->wr_on = true;
}

static void tls_wr_stop(struct conn_io *io)
{
	if (io->wr_on)
		event_del(io->wr);
	io->wr_on = false;
}

/* What a failed OpenSSL call waits for: EV_READ, EV_WRITE, or 0 for the end (EOF or error). */
static int tls_wants(struct conn_io *io, int ret, bool *eof)
{
	int e = SSL_get_error(io->ssl, ret);

	*eof = false;
	if (e == SSL_ERROR_WANT_READ)
		return EV_READ;
	if (e == SSL_ERROR_WANT_WRITE)
		return EV_WRITE;
	if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0))
		*eof = true;	/* close_notify, or the socket closed (SSL_OP_IGNORE_UNEXPECTED_EOF) */
	else if (!io->ssl_err)
		io->ssl_err = ERR_peek_last_error();
	return 0;
}

/* The end of a TLS connection: the owner's event callback (which may free io). */
static void tls_end(struct conn_io *io, short what, bool eof)
{
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;

	ERR_clear_error();
	tls_wr_stop(io);
	conn_want_read(io, false);
	bufferevent_getcb(io->bev, &readcb, &writecb, &eventcb, &cbarg);
	if (eventcb)
		eventcb(io->bev, (short)(what | (eof ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), cbarg);
}

static void tls_handshake(struct conn_io *io)
{
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;
	bool eof;
	int r;

	ERR_clear_error();
	errno = 0;
	r = SSL_do_handshake(io->ssl);
	if (r == 1) {
		io->hs_done = true;
		tls_wr_stop(io);
		if (SSL_has_pending(io->ssl))	/* data that came with the handshake's last flight */
			event_active(io->rd, EV_READ, 0);
		if (evbuffer_get_length(bufferevent_get_output(io->bev)) > 0)
			conn_queue_flush(io);
		bufferevent_getcb(io->bev, &readcb, &writecb, &eventcb, &cbarg);
		if (eventcb)
			eventcb(io->bev, BEV_EVENT_CONNECTED, cbarg);
		return;
	}
	switch (tls_wants(io, r, &eof)) {
	case EV_READ:
		tls_wr_stop(io);
		break;
	case EV_WRITE:
		tls_wr_start(io);
		break;
	default:
		tls_end(io, BEV_EVENT_READING, eof);
		break;
	}
}

/* The read event of a TLS connection: handshake, or records into the input buffer. */
static void tls_read_cb(struct conn_io *io)
{
	struct bufferevent *bev = io->bev;
	struct evbuffer *in = bufferevent_get_input(bev);
	bufferevent_data_cb readcb, writecb;
	bufferevent_event_cb eventcb;
	void *cbarg;
	size_t got, total = 0;
	bool eof;
	int r;

	if (!io->hs_done) {
		tls_handshake(io);
		return;
	}
	evbuffer_unfreeze(in, 0);
	do {
		ERR_clear_error();
		errno = 0;
		r = SSL_read_ex(io->ssl, rt->readbuf, sizeof(rt->readbuf), &got);
		if (r != 1)
			break;
		evbuffer_add(in, rt->readbuf, got);
		total += got;
	} while (SSL_has_pending(io->ssl) && (!io->rd_high || evbuffer_get_length(in) < io->rd_high));
	evbuffer_freeze(in, 0);
	if (total > 0) {
		conn_update_rd(io);
		bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
		if (readcb)
			readcb(bev, cbarg);
		return;
	}
	switch (tls_wants(io, r, &eof)) {
	case EV_READ:
		break;
	case EV_WRITE:		/* OpenSSL must send something first (a TLS 1.3 key update) */
		io->rd_on_wr = true;
		tls_wr_start(io);
		break;
	default:
		tls_end(io, BEV_EVENT_READING, eof);
		break;
	}
}

/*
 * Write the output buffer through OpenSSL: true once it is empty; false
 * when the kernel is full (our write event waits) or the connection ended
 * (the owner's event callback ran). A retried SSL_write never gets fewer
 * bytes than the last one: only we drain the buffer.
 */
static bool tls_write_out(struct conn_io *io)
{
	struct evbuffer *buf = bufferevent_get_output(io->bev);
	size_t len, n, done;
	bool eof;
	int r;

	evbuffer_unfreeze(buf, 1);
	while ((len = evbuffer_get_length(buf)) > 0) {
		n = len < TLS_WRITE_CHUNK ? len : TLS_WRITE_CHUNK;
		ERR_clear_error();
		errno = 0;
		r = SSL_write_ex(io->ssl, evbuffer_pullup(buf, (ssize_t)n), n, &done);
		if (r == 1) {
			evbuffer_drain(buf, done);
			continue;
		}
		evbuffer_freeze(buf, 1);
		if (tls_wants(io, r, &eof) == EV_WRITE) {
			tls_wr_start(io);
			return false;
		}
		tls_end(io, BEV_EVENT_WRITING, false);	/* no renegotiation: a write never waits to read */
		return false;
	}
	evbuffer_freeze(buf, 1);
	return true;
}

static void tls_wr_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn_io *io = arg;
	(void)fd;
	(void)what;

	io->wr_on = false;
	rt->now = now_mono();
	if (!io->hs_done) {
		tls_handshake(io);
		return;
	}
	if (io->rd_on_wr) {
		io->rd_on_wr = false;
		event_active(io->rd, EV_READ, 0);
	}
	conn_flush_one(io);
}

/*
 * Start TLS on a connected socket (after our SSLRequest was answered 'S',
 * or after we answered a client's with 'S'). The owner's event callback
 * gets BEV_EVENT_CONNECTED when the handshake is done, or an error/EOF.
 * false (and ssl freed) when out of memory.
 */
bool conn_start_tls(struct conn_io *io, struct ssl_st *ssl, bool accepting)
{
	int fd = bufferevent_getfd(io->bev);

	io->wr = io->rd ? event_new(rt->base, fd, EV_WRITE, tls_wr_cb, io) : NULL;
	if (!io->wr || SSL_set_fd(ssl, fd) != 1) {
		if (io->wr)
			event_free(io->wr);
		io->wr = NULL;
		SSL_free(ssl);
		return false;
	}
	SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_set_options(ssl, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
	SSL_set_read_ahead(ssl, 1);
	if (accepting)
		SSL_set_accept_state(ssl);
	else
		SSL_set_connect_state(ssl);
	io->ssl = ssl;
	io->tls = true;
	io->hs_done = false;
	io->ssl_err = 0;
	conn_want_read(io, true);
	if (!accepting)
		event_active(io->wr, EV_WRITE, 0);	/* our ClientHello goes out from the loop */
	return true;
}

/* Closing: write what is queued; the owner's write callback sees it empty. */
void conn_flush_close(struct conn_io *io)
{
	if (io->tls) {
		if (!io->wr_on)
			conn_queue_flush(io);
		return;
	}
	bufferevent_setwatermark(io->bev, EV_WRITE, 0, 0);
	bufferevent_enable(io->bev, EV_WRITE);
}

static void tls_io_free(struct conn_io *io)
{
	if (io->wr)
		event_free(io->wr);
	io->wr = NULL;
	io->wr_on = false;
	if (io->ssl) {
		if (io->hs_done && !io->ssl_err)
			SSL_shutdown(io->ssl);	/* close_notify, if the socket takes it now */
		ERR_clear_error();
		SSL_free(io->ssl);
	}
	io->ssl = NULL;
	io->tls = io->hs_done = io->rd_on_wr = false;
	io->ssl_err = 0;
}
static bool conn_spare_put(struct bufferevent *bev, struct event *rd, struct evbuffer_cb_entry *out_cb,
			   struct conn_io *owner);

/* Free a bufferevent, with its write-through state if it has one. */
void conn_free(struct conn_io *wt, struct bufferevent *bev)
{
	struct event *rd = wt ? wt->rd : NULL;
	struct evbuffer_cb_entry *out_cb = NULL;

	if (wt && wt->bev == bev) {
		out_cb = wt->out_cb;
		if (wt->queued)
			TAILQ_REMOVE(&rt->flush_list, wt, entry);
		wt->queued = false;
		wt->bev = NULL;
	}
	if (wt) {
		wt->rd = NULL;
		wt->out_cb = NULL;
		wt->rd_on = wt->rd_want = false;
		tls_io_free(wt);
	}
	if (rd && wt->spare_ok && conn_spare_put(bev, rd, out_cb, wt))
		return;
	if (out_cb)
		evbuffer_remove_cb_entry(bufferevent_get_output(bev), out_cb);
	if (rd)
		event_free(rd);
	bufferevent_free(bev);
}

/* ---- spare bufferevents ----
 *
 * A freed bufferevent is finalized through the event loop and a new one is
 * three allocations; client connections come and go per request for some
 * applications. So a closed client's bufferevent and read event are kept
 * (socket closed, buffers emptied, callbacks cleared, disabled) and given to
 * the next accepted socket with bufferevent_setfd(). A spare still holds the
 * number of its closed socket (one bufferevent_setfd() per reuse, not two):
 * nothing may use it before conn_bev_for(), and conn_spares_free() clears it
 * before bufferevent_free() would close it.
 *
 * Its write-through callback stays on the output, disabled: client objects
 * are reused too (client_release()), last freed first, so the next client
 * usually has the conn_io the callback points to and only enables it again.
 */
static bool conn_spare_put(struct bufferevent *bev, struct event *rd, struct evbuffer_cb_entry *out_cb,
			   struct conn_io *owner)
{
	int fd = event_get_fd(rd);	/* the bufferevent's socket */
	struct evbuffer *in = bufferevent_get_input(bev), *out = bufferevent_get_output(bev);

	if (rt->n_spares == CONN_SPARES_MAX || fd < 0)
		return false;
	event_del(rd);
	if (out_cb)
		evbuffer_cb_clear_flags(out, out_cb, EVBUFFER_CB_ENABLED);
	bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
	if (bufferevent_get_enabled(bev))
		bufferevent_disable(bev, EV_READ | EV_WRITE);
	evbuffer_unfreeze(in, 0);	/* conn_read_cb() and a flush leave them frozen */
	evbuffer_unfreeze(out, 1);
	evutil_closesocket(fd);
	if (evbuffer_get_length(in) > 0)
		evbuffer_drain(in, evbuffer_get_length(in));
	if (evbuffer_get_length(out) > 0)
		evbuffer_drain(out, evbuffer_get_length(out));
	/* watermarks: only EV_WRITE's is used, and client_accept() sets it */
	rt->spares[rt->n_spares].bev = bev;
	rt->spares[rt->n_spares].rd = rd;
	rt->spares[rt->n_spares].out_cb = out_cb;
	rt->spares[rt->n_spares].owner = owner;
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
	if (rt->spares[rt->n_spares].owner == io)
		io->out_cb = rt->spares[rt->n_spares].out_cb;	/* conn_write_through() enables it */
	else if (rt->spares[rt->n_spares].out_cb)
		evbuffer_remove_cb_entry(bufferevent_get_output(bev), rt->spares[rt->n_spares].out_cb);
	bufferevent_setfd(bev, fd);	/* disabled: adds no event */
	event_assign(io->rd, rt->base, fd, EV_READ | EV_PERSIST, conn_read_ev, io);
	evbuffer_freeze(bufferevent_get_input(bev), 0);	/* as a new bufferevent has them */
	evbuffer_freeze(bufferevent_get_output(bev), 1);
	return bev;
}

void conn_spares_free(void)
{
	while (rt->n_spares > 0) {
		rt->n_spares--;
		event_free(rt->spares[rt->n_spares].rd);
		bufferevent_setfd(rt->spares[rt->n_spares].bev, -1);	/* its socket is closed already */
		bufferevent_free(rt->spares[rt->n_spares].bev);
	}
}
