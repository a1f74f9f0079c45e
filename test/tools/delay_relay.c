/* SPDX-License-Identifier: ISC */
/*
 * delay_relay.c -- a user-space TCP relay that adds a fixed one-way delay
 * each way, for tests and benchmarks that need a round-trip time on loopback
 * (netem is not available here).
 *
 *	delay_relay --listen 127.0.0.1:PORT --to 127.0.0.1:PORT --delay-ms 4.7
 *		    [--max-buffer-kb 32768]
 *
 * Each accepted connection gets its own connection to --to. Bytes read from
 * one side are kept in a chunk stamped with the time they arrived and are
 * written to the other side `delay` later, in order, as toxiproxy's latency
 * toxic does: delays pipeline (a stream of chunks is late by `delay`, not by
 * `delay` per chunk), so the added round-trip time is 2 x delay. A side whose
 * chunks plus unsent output exceed --max-buffer-kb stops being read until
 * they drain (default 32 MiB, above a 4 MiB window's bandwidth-delay
 * product). An EOF is passed on (shutdown of the write side) once everything
 * read before it has been delivered, so half-closed connections behave; an
 * error on either side closes both.
 *
 * It prints one line when it listens ("delay_relay: listening on ADDR:PORT
 * ...", the real port when 0 was asked) and, on SIGTERM or SIGINT, one line
 * of totals, then exits 0. Bad arguments exit 2.
 *
 * What it does not model: bandwidth, loss, reordering, jitter, or the
 * kernel's TCP window over a real RTT (loopback buffers are large).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#define DEFAULT_MAX_BUFFER_KB (32 * 1024)

struct chunk {
	TAILQ_ENTRY(chunk) entry;
	uint64_t due_us;		/* monotonic time at which it may be written */
	struct evbuffer *buf;
};

struct conn;

/* One direction of a connection: bytes read from src, written to dst. */
struct dir {
	struct conn *c;
	struct bufferevent *src, *dst;
	TAILQ_HEAD(, chunk) chunks;
	size_t queued;			/* bytes in chunks */
	struct event *timer;
	bool eof;			/* src reached EOF */
	bool shut;			/* dst's write side was shut */
	uint64_t bytes;
};

struct conn {
	struct relay *r;
	struct bufferevent *client, *target;
	struct dir up, down;		/* client -> target, target -> client */
	bool connected;			/* the connection to the target is up */
	LIST_ENTRY(conn) entry;
};

struct relay {
	struct event_base *base;
	struct evconnlistener *listener;
	struct sockaddr_storage to;
	int to_len;
	uint64_t delay_us;
	size_t max_buffer;
	LIST_HEAD(, conn) conns;
	unsigned long accepted, closed;
	uint64_t bytes_up, bytes_down;
};

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void dir_free(struct dir *d)
{
	struct chunk *ch;

	while ((ch = TAILQ_FIRST(&d->chunks))) {
		TAILQ_REMOVE(&d->chunks, ch, entry);
		evbuffer_free(ch->buf);
		free(ch);
	}
	if (d->timer)
		event_free(d->timer);
}

static void conn_free(struct conn *c)
{
	c->r->closed++;
	c->r->bytes_up += c->up.bytes;
	c->r->bytes_down += c->down.bytes;
	LIST_REMOVE(c, entry);
	dir_free(&c->up);
	dir_free(&c->down);
	if (c->client)
		bufferevent_free(c->client);
	if (c->target)
		bufferevent_free(c->target);
	free(c);
}

/* Both directions finished: the connection is done. */
static bool conn_done(struct conn *c)
{
	if (!c->up.shut || !c->down.shut)
		return false;
	conn_free(c);
	return true;
}

/*
 * After any change in a direction: resume reading when below the cap, and
 * pass on an EOF once everything before it is written.
 */
static bool dir_check(struct dir *d)
{
	size_t out = evbuffer_get_length(bufferevent_get_output(d->dst));

	if (!d->eof && d->queued + out < d->c->r->max_buffer)
		bufferevent_enable(d->src, EV_READ);
	if (d->eof && !d->shut && d->queued == 0 && out == 0 && d->c->connected) {
		d->shut = true;
		shutdown(bufferevent_getfd(d->dst), SHUT_WR);
		return conn_done(d->c);
	}
	return false;
}

static void dir_arm(struct dir *d, uint64_t now)
{
	struct chunk *ch = TAILQ_FIRST(&d->chunks);
	uint64_t wait;
	struct timeval tv;

	if (!ch || evtimer_pending(d->timer, NULL))
		return;
	wait = ch->due_us > now ? ch->due_us - now : 0;
	tv.tv_sec = (time_t)(wait / 1000000u);
	tv.tv_usec = (suseconds_t)(wait % 1000000u);
	evtimer_add(d->timer, &tv);
}

/* Release every chunk that is due, in order. */
static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct dir *d = arg;
	uint64_t now = now_us();
	struct chunk *ch;

	(void)fd;
	(void)what;
	while ((ch = TAILQ_FIRST(&d->chunks)) && ch->due_us <= now) {
		TAILQ_REMOVE(&d->chunks, ch, entry);
		d->queued -= evbuffer_get_length(ch->buf);
		bufferevent_write_buffer(d->dst, ch->buf);
		evbuffer_free(ch->buf);
		free(ch);
	}
	dir_arm(d, now);
	dir_check(d);
}

static struct dir *dir_of_src(struct conn *c, struct bufferevent *bev)
{
	return bev == c->client ? &c->up : &c->down;
}

static struct dir *dir_of_dst(struct conn *c, struct bufferevent *bev)
{
	return bev == c->client ? &c->down : &c->up;
}

/* Stamp what bev has read and queue it. false if the connection was freed. */
static bool take_input(struct conn *c, struct bufferevent *bev)
{
	struct dir *d = dir_of_src(c, bev);
	struct evbuffer *in = bufferevent_get_input(bev);
	size_t n = evbuffer_get_length(in);
	struct chunk *ch;
	uint64_t now = now_us();

	if (!n)
		return true;
	ch = calloc(1, sizeof(*ch));
	if (!ch || !(ch->buf = evbuffer_new())) {
		fprintf(stderr, "delay_relay: out of memory\n");
		free(ch);
		conn_free(c);
		return false;
	}
	evbuffer_remove_buffer(in, ch->buf, n);
	ch->due_us = now + c->r->delay_us;
	TAILQ_INSERT_TAIL(&d->chunks, ch, entry);
	d->queued += n;
	d->bytes += n;
	if (d->queued + evbuffer_get_length(bufferevent_get_output(d->dst)) >= c->r->max_buffer)
		bufferevent_disable(bev, EV_READ);
	dir_arm(d, now);
	return true;
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	take_input(arg, bev);
}

/* dst's output drained (write low-water 0). */
static void write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	dir_check(dir_of_dst(c, bev));
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;
	struct dir *d = dir_of_src(c, bev);

	if (what & BEV_EVENT_CONNECTED) {
		c->connected = true;
		dir_check(&c->up);	/* an EOF from the client may be waiting */
		return;
	}
	if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR)) {
		if (!take_input(c, bev))	/* anything that came with the EOF */
			return;
		d->eof = true;
		bufferevent_disable(bev, EV_READ);
		dir_check(d);
		return;
	}
	conn_free(c);			/* an error on either side ends both */
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static bool dir_init(struct conn *c, struct dir *d, struct bufferevent *src, struct bufferevent *dst)
{
	d->c = c;
	d->src = src;
	d->dst = dst;
	TAILQ_INIT(&d->chunks);
	d->timer = evtimer_new(c->r->base, timer_cb, d);
	return d->timer != NULL;
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct relay *r = arg;
	struct conn *c = calloc(1, sizeof(*c));
	int tfd = -1;

	(void)l;
	(void)sa;
	(void)salen;
	r->accepted++;
	if (!c) {
		evutil_closesocket(fd);
		return;
	}
	c->r = r;
	LIST_INSERT_HEAD(&r->conns, c, entry);
	set_nodelay(fd);
	c->client = bufferevent_socket_new(r->base, fd, BEV_OPT_CLOSE_ON_FREE);
	tfd = socket(r->to.ss_family, SOCK_STREAM, 0);
	if (tfd >= 0) {
		evutil_make_socket_nonblocking(tfd);
		evutil_make_socket_closeonexec(tfd);
		set_nodelay(tfd);
		c->target = bufferevent_socket_new(r->base, tfd, BEV_OPT_CLOSE_ON_FREE);
	}
	if (!c->client || !c->target || !dir_init(c, &c->up, c->client, c->target) ||
	    !dir_init(c, &c->down, c->target, c->client)) {
		if (!c->client)
			evutil_closesocket(fd);
		if (!c->target && tfd >= 0)
			evutil_closesocket(tfd);
		fprintf(stderr, "delay_relay: could not set up a connection\n");
		conn_free(c);
		return;
	}
	bufferevent_setcb(c->client, read_cb, write_cb, event_cb, c);
	bufferevent_setcb(c->target, read_cb, write_cb, event_cb, c);
	if (bufferevent_socket_connect(c->target, (struct sockaddr *)&r->to, r->to_len) < 0) {
		fprintf(stderr, "delay_relay: connect failed: %s\n", strerror(errno));
		conn_free(c);
		return;
	}
	bufferevent_enable(c->client, EV_READ | EV_WRITE);
	bufferevent_enable(c->target, EV_READ | EV_WRITE);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	event_base_loopexit(((struct relay *)arg)->base, NULL);
}

static void usage(void)
{
	fprintf(stderr, "usage: delay_relay --listen HOST:PORT --to HOST:PORT --delay-ms MS [--max-buffer-kb KB]\n");
	exit(2);
}

static void parse_addr(const char *text, struct sockaddr_storage *ss, int *len)
{
	*len = (int)sizeof(*ss);
	if (evutil_parse_sockaddr_port(text, (struct sockaddr *)ss, len) < 0) {
		fprintf(stderr, "delay_relay: bad address \"%s\" (want HOST:PORT)\n", text);
		usage();
	}
}

static double parse_number(const char *text, const char *what, double max)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(text, &end);
	if (errno || end == text || *end || !(v >= 0) || v > max) {
		fprintf(stderr, "delay_relay: bad %s \"%s\"\n", what, text);
		usage();
	}
	return v;
}

static void parse_args(int argc, char **argv, struct relay *r, struct sockaddr_storage *listen, int *listen_len)
{
	bool have_listen = false, have_to = false, have_delay = false;

	r->max_buffer = (size_t)DEFAULT_MAX_BUFFER_KB * 1024;
	for (int i = 1; i < argc; i++) {
		const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!val)
			usage();
		if (strcmp(opt, "--listen") == 0) {
			parse_addr(val, listen, listen_len);
			have_listen = true;
		} else if (strcmp(opt, "--to") == 0) {
			parse_addr(val, &r->to, &r->to_len);
			have_to = true;
		} else if (strcmp(opt, "--delay-ms") == 0) {
			r->delay_us = (uint64_t)(parse_number(val, "--delay-ms", 3600e3) * 1000.0 + 0.5);
			have_delay = true;
		} else if (strcmp(opt, "--max-buffer-kb") == 0) {
			r->max_buffer = (size_t)parse_number(val, "--max-buffer-kb", 4e6) * 1024;
			if (r->max_buffer == 0)
				usage();
		} else {
			usage();
		}
		i++;
	}
	if (!have_listen || !have_to || !have_delay)
		usage();
}

static void print_listening(struct relay *r)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[128] = "?";
	int port = 0;

	if (getsockname(evconnlistener_get_fd(r->listener), (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
			evutil_inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
			port = ntohs(s6->sin6_port);
		} else {
			struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
			evutil_inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
			port = ntohs(s4->sin_port);
		}
	}
	printf("delay_relay: listening on %s:%d, one-way delay %.3f ms\n", host, port, r->delay_us / 1000.0);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct relay r;
	struct sockaddr_storage listen_addr;
	int listen_len = 0;
	struct event *sig_term, *sig_int;
	struct event_config *cfg;
	struct conn *c;

	memset(&r, 0, sizeof(r));
	LIST_INIT(&r.conns);
	parse_args(argc, argv, &r, &listen_addr, &listen_len);
	signal(SIGPIPE, SIG_IGN);
	/* libevent's default clock is CLOCK_MONOTONIC_COARSE: one tick (4 ms at
	 * HZ=250) late on every release. Delays need the precise clock. */
	cfg = event_config_new();
	if (!cfg || event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER) < 0)
		return 1;
	r.base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (!r.base)
		return 1;
	r.listener = evconnlistener_new_bind(r.base, accept_cb, &r,
					     LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1,
					     (struct sockaddr *)&listen_addr, listen_len);
	if (!r.listener) {
		fprintf(stderr, "delay_relay: could not listen: %s\n", strerror(errno));
		return 1;
	}
	sig_term = evsignal_new(r.base, SIGTERM, signal_cb, &r);
	sig_int = evsignal_new(r.base, SIGINT, signal_cb, &r);
	if (!sig_term || !sig_int || evsignal_add(sig_term, NULL) < 0 || evsignal_add(sig_int, NULL) < 0)
		return 1;
	print_listening(&r);
	event_base_dispatch(r.base);
	while ((c = LIST_FIRST(&r.conns)))
		conn_free(c);
	printf("delay_relay: %lu connections, %llu bytes up, %llu bytes down\n", r.accepted,
	       (unsigned long long)r.bytes_up, (unsigned long long)r.bytes_down);
	evconnlistener_free(r.listener);
	event_free(sig_term);
	event_free(sig_int);
	event_base_free(r.base);
	return 0;
}
