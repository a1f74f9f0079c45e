/* SPDX-License-Identifier: ISC */
/*
 * mux_bench.c -- the tunnel multiplexer over a real TCP connection, both
 * ends in one process: a relay session listens, an agent session dials
 * (usually through delay_relay, for a round-trip time), and the relay sends
 * BYTES on each of STREAMS streams to the agent, which checks every byte and
 * returns credit as soon as it has it (as if written onward at once).
 *
 *	mux_bench --listen 127.0.0.1:PORT --dial 127.0.0.1:PORT [--streams 1]
 *		  [--mb 64] [--window-kb K] [--stall 0]
 *
 * The agent dials --dial, which must lead to --listen (directly, or through
 * delay_relay --listen DIAL --to LISTEN). The stream window is --window-kb,
 * else LOKADB_MUX_WINDOW_KB from the environment (read here, by the caller,
 * as the relay and agent plugins will), else the library's 4 MiB. --stall N
 * adds N streams whose reader never returns credit: the others must still
 * finish (no head-of-line blocking).
 *
 * Prints one line: streams, bytes, seconds from the first OPEN to the last
 * FIN, MiB/s in all; exit 0 when every byte arrived intact, 1 otherwise
 * (after 120 s at the latest). It does not use TLS: it measures the
 * multiplexer and the path, not OpenSSL.
 */
#include "mux.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#define MAX_STREAMS 256
#define OUT_LOW_WATER (256 * 1024)	/* ask mux_pending() only below this */
#define DEADLINE_SEC 120

struct bstream {
	uint32_t id;
	uint64_t sent, recv;
	bool stall, fin, bad;
};

struct end {
	const char *name;
	struct mux_session *s;
	struct bufferevent *bev;
	struct bstream st[MAX_STREAMS];
	int n;
};

static struct {
	struct event_base *base;
	struct end relay, agent;
	int streams, stall;
	uint64_t bytes;
	int fins;
	double t_start, t_end;
	bool failed;
} b;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t now_ms(void)
{
	return (uint64_t)(now_s() * 1000.0);
}

static uint8_t pattern(uint32_t id, uint64_t off)
{
	return (uint8_t)(off * 131 + id);
}

static void stop(bool failed, const char *why)
{
	if (failed) {
		fprintf(stderr, "mux_bench: %s\n", why);
		b.failed = true;
	}
	event_base_loopexit(b.base, NULL);
}

/* Move what the session has to send into the socket's output buffer. */
static void flush(struct end *e)
{
	struct evbuffer *out;
	const uint8_t *p;
	size_t n;

	if (!e->bev)
		return;
	out = bufferevent_get_output(e->bev);
	while (evbuffer_get_length(out) < OUT_LOW_WATER && (n = mux_pending(e->s, &p)) > 0) {
		evbuffer_add(out, p, n);
		mux_consumed(e->s, n);
	}
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct end *e = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v[8];
	int n;

	while ((n = evbuffer_peek(in, -1, NULL, v, 8)) > 0) {
		size_t total = 0;
		for (int i = 0; i < n && i < 8; i++) {
			if (!mux_feed(e->s, v[i].iov_base, v[i].iov_len, now_ms())) {
				flush(e);
				stop(true, "session failed");
				return;
			}
			total += v[i].iov_len;
		}
		evbuffer_drain(in, total);
	}
	flush(e);
	flush(e == &b.relay ? &b.agent : &b.relay);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	flush(arg);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct end *e = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		return;
	fprintf(stderr, "mux_bench: %s connection lost (events 0x%x)\n", e->name, what);
	stop(true, "connection lost");
}

static void attach(struct end *e, struct bufferevent *bev)
{
	e->bev = bev;
	bufferevent_setcb(bev, read_cb, write_cb, event_cb, e);
	bufferevent_setwatermark(bev, EV_WRITE, OUT_LOW_WATER / 2, 0);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
}

/* ---- callbacks ---- */

static void on_hello(struct mux_session *s, const struct mux_hello *hello, void *ud)
{
	static const uint8_t sid[MUX_ID_LEN] = { 0 };
	struct end *e = ud;

	(void)hello;
	if (!mux_accept(s, sid, 0)) {
		stop(true, "accept failed");
		return;
	}
	b.t_start = now_s();
	for (int i = 0; i < b.streams + b.stall; i++) {
		struct mux_open o;
		uint32_t id, err;

		memset(&o, 0, sizeof(o));
		snprintf(o.db_key, sizeof(o.db_key), "bench%d", i);
		if (!(id = mux_open(s, &o, NULL, &err))) {
			stop(true, "open failed");
			return;
		}
		e->st[e->n].id = id;
		e->st[e->n].stall = i >= b.streams;
		mux_stream_set_user(s, id, &e->st[e->n]);
		e->n++;
		mux_resume(s, id);
	}
}

static uint32_t on_open(struct mux_session *s, uint32_t id, const struct mux_open *o, void **stream_ud, void *ud)
{
	struct end *e = ud;
	struct bstream *t;

	(void)s;
	if (e->n == MAX_STREAMS)
		return MUX_E_STREAM_LIMIT;
	t = &e->st[e->n++];
	t->id = id;
	t->stall = strtol(o->db_key + 5, NULL, 10) >= b.streams;
	*stream_ud = t;
	mux_open_ack(s, id, 0);
	return MUX_NO_ERROR;
}

static void on_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *stream_ud, void *ud)
{
	struct bstream *t = stream_ud;

	(void)ud;
	for (size_t i = 0; i < len; i++)
		if (data[i] != pattern(id, t->recv + i))
			t->bad = true;
	t->recv += len;
	if (!t->stall)
		mux_stream_consumed(s, id, len);
}

static void on_fin(struct mux_session *s, uint32_t id, void *stream_ud, void *ud)
{
	struct bstream *t = stream_ud;

	(void)s;
	(void)id;
	(void)ud;
	t->fin = true;
	if (t->recv != b.bytes || t->bad) {
		stop(true, "a stream arrived short or corrupted");
		return;
	}
	if (!t->stall && ++b.fins == b.streams) {
		b.t_end = now_s();
		stop(false, NULL);
	}
}

static long read_data(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *stream_ud,
		      void *ud)
{
	struct bstream *t = stream_ud;
	uint64_t left = b.bytes - t->sent;
	size_t n = left < max ? (size_t)left : max;

	(void)s;
	(void)ud;
	for (size_t i = 0; i < n; i++)
		dst[i] = pattern(id, t->sent + i);
	t->sent += n;
	*eof = t->sent == b.bytes;
	return (long)n;
}

static void on_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	(void)s;
	fprintf(stderr, "mux_bench: %s session error %s: %s\n", ((struct end *)ud)->name, mux_error_name(code), msg);
}

static const struct mux_callbacks callbacks = {
	.on_hello = on_hello,
	.on_open = on_open,
	.on_data = on_data,
	.on_fin = on_fin,
	.read_data = read_data,
	.on_session_error = on_error,
};

/* ---- setup ---- */

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	int one = 1;

	(void)sa;
	(void)len;
	(void)arg;
	if (b.relay.bev) {
		evutil_closesocket(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	attach(&b.relay, bufferevent_socket_new(b.base, fd, BEV_OPT_CLOSE_ON_FREE));
	evconnlistener_disable(l);
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	stop(true, "deadline passed");
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	mux_tick(b.relay.s, now_ms());
	mux_tick(b.agent.s, now_ms());
	flush(&b.relay);
	flush(&b.agent);
}

static void usage(void)
{
	fprintf(stderr, "usage: mux_bench --listen HOST:PORT --dial HOST:PORT [--streams N] [--mb MB] "
		"[--window-kb KB] [--stall N]\n");
	exit(2);
}

static long number(const char *s, long min, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	struct sockaddr_storage listen_ss, dial_ss;
	int listen_len = sizeof(listen_ss), dial_len = sizeof(dial_ss), one = 1;
	bool have_listen = false, have_dial = false;
	struct mux_settings set;
	struct evconnlistener *l;
	struct bufferevent *bev;
	struct event *deadline, *tick;
	struct timeval tv_deadline = { DEADLINE_SEC, 0 }, tv_tick = { 1, 0 };
	long window_kb = getenv("LOKADB_MUX_WINDOW_KB") ? number(getenv("LOKADB_MUX_WINDOW_KB"), 1, 2097151) : 0;
	long mb = 64;
	double secs;
	evutil_socket_t fd;

	b.streams = 1;
	for (int i = 1; i < argc; i += 2) {
		const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!val)
			usage();
		if (strcmp(opt, "--listen") == 0)
			have_listen = evutil_parse_sockaddr_port(val, (struct sockaddr *)&listen_ss, &listen_len) == 0;
		else if (strcmp(opt, "--dial") == 0)
			have_dial = evutil_parse_sockaddr_port(val, (struct sockaddr *)&dial_ss, &dial_len) == 0;
		else if (strcmp(opt, "--streams") == 0)
			b.streams = (int)number(val, 1, MAX_STREAMS / 2);
		else if (strcmp(opt, "--stall") == 0)
			b.stall = (int)number(val, 0, MAX_STREAMS / 2);
		else if (strcmp(opt, "--mb") == 0)
			mb = number(val, 1, 100000);
		else if (strcmp(opt, "--window-kb") == 0)
			window_kb = number(val, 1, 2097151);
		else
			usage();
	}
	if (!have_listen || !have_dial)
		usage();
	b.bytes = (uint64_t)mb << 20;
	mux_settings_default(&set);
	if (window_kb)
		set.stream_window = (uint32_t)window_kb * 1024;
	if (set.session_window < set.stream_window * 2u)
		set.session_window = set.stream_window > MUX_WINDOW_MAX / 2 ? MUX_WINDOW_MAX : set.stream_window * 2u;

	{
		struct event_config *cfg = event_config_new();
		event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
		b.base = event_base_new_with_config(cfg);
		event_config_free(cfg);
	}
	b.relay.name = "relay";
	b.agent.name = "agent";
	b.relay.s = mux_session_new(MUX_ROLE_RELAY, &set, &callbacks, &b.relay);
	b.agent.s = mux_session_new(MUX_ROLE_AGENT, &set, &callbacks, &b.agent);
	if (!b.base || !b.relay.s || !b.agent.s) {
		fprintf(stderr, "mux_bench: bad settings (window %ld KiB)\n", window_kb);
		return 2;
	}
	l = evconnlistener_new_bind(b.base, accept_cb, NULL, LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE, -1,
				    (struct sockaddr *)&listen_ss, listen_len);
	fd = socket(dial_ss.ss_family, SOCK_STREAM, 0);
	if (!l || fd < 0) {
		fprintf(stderr, "mux_bench: could not listen or dial: %s\n", strerror(errno));
		return 1;
	}
	evutil_make_socket_nonblocking(fd);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	bev = bufferevent_socket_new(b.base, fd, BEV_OPT_CLOSE_ON_FREE);
	attach(&b.agent, bev);
	if (bufferevent_socket_connect(bev, (struct sockaddr *)&dial_ss, dial_len) < 0)
		return 1;
	mux_hello(b.agent.s, "bench", NULL, 0, now_ms());
	flush(&b.agent);
	deadline = evtimer_new(b.base, timeout_cb, NULL);
	tick = event_new(b.base, -1, EV_PERSIST, tick_cb, NULL);
	evtimer_add(deadline, &tv_deadline);
	evtimer_add(tick, &tv_tick);
	event_base_dispatch(b.base);

	secs = b.t_end - b.t_start;
	if (!b.failed)
		printf("mux_bench: %d streams x %ld MiB, window %u KiB: %.3f s, %.1f MiB/s\n", b.streams, mb,
		       set.stream_window / 1024, secs, secs > 0 ? b.streams * (double)mb / secs : 0.0);
	event_free(deadline);
	event_free(tick);
	if (b.relay.bev)
		bufferevent_free(b.relay.bev);
	bufferevent_free(b.agent.bev);
	evconnlistener_free(l);
	mux_session_free(b.relay.s);
	mux_session_free(b.agent.s);
	event_base_free(b.base);
	return b.failed ? 1 : 0;
}
