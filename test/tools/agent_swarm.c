/* SPDX-License-Identifier: ISC */
/*
 * agent_swarm.c -- many tunnel agents in one process, to load a relay the
 * way N sites would: N authenticated sessions, one site per session, each
 * idle once the relay accepted it (answering the relay's PINGs and sending
 * its own, as the agent plugin does).
 *
 *	agent_swarm --relay 127.0.0.1:PORT --count N [--prefix swarm]
 *		    [--parallel 32] [--hold-s 0]
 *
 * Session i (0 <= i < N) is site PREFIX%04d (swarm0000, swarm0001, ...)
 * with token "lokadb-swarm-token-" followed by that site name; the relay's
 * `sites` must list SITE:sha256(token) for each (the benchmark generates
 * them). Each session is what the agent plugin does on the wire: TLS 1.3
 * (the relay's certificate is not checked: a benchmark on loopback), the
 * preface, HELLO with AGENT_ID = site and PROOF = HMAC-SHA256(SHA-256(token),
 * TLS exporter "EXPORTER-Channel-Binding"), then the mux session (plugins/
 * tunnel, compiled in). OPENs are refused (RST NO_SUCH_TARGET): the swarm
 * serves no database.
 *
 * At most --parallel sessions are in their handshake at a time (the relay
 * closes connections beyond 128 in handshake). Prints
 * `agent_swarm: N sessions established in T s` once all are accepted, then
 * holds them until SIGTERM/SIGINT (or --hold-s seconds), then prints
 * `agent_swarm: N established, F failed` and exits 0 (1 if a session failed
 * or was lost, or not all were up within 120 s). When every session has
 * been tried and one failed before all were up (a refused token, an
 * unknown site), it stops at once. Bad arguments: usage, exit 2.
 */
#include "mux.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/util.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>

#define MAX_COUNT 20000
#define EXPORTER_LABEL "EXPORTER-Channel-Binding"
#define PROOF_LEN 32
#define UP_DEADLINE_SEC 120
#define OUT_LOW_WATER (64 * 1024)

struct agent {
	int idx;
	char site[MUX_NAME_MAX + 1];
	struct mux_session *s;
	struct bufferevent *bev;
	bool started, established, dead;
};

static struct {
	struct event_base *base;
	SSL_CTX *ctx;
	struct sockaddr_storage relay;
	int relay_len;
	const char *prefix;
	struct agent *a;
	int count, parallel, next, in_handshake, established, failed;
	double t0;
	bool all_up;
	struct mux_settings set;
} W;

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

static void start_more(void);

static void flush(struct agent *x)
{
	struct evbuffer *out;
	const uint8_t *p;
	size_t n;

	if (!x->bev)
		return;
	out = bufferevent_get_output(x->bev);
	while (evbuffer_get_length(out) < OUT_LOW_WATER && (n = mux_pending(x->s, &p)) > 0) {
		evbuffer_add(out, p, n);
		mux_consumed(x->s, n);
	}
}

static void agent_fail(struct agent *x, const char *why)
{
	if (x->dead)
		return;
	fprintf(stderr, "agent_swarm: %s: %s\n", x->site, why);
	x->dead = true;
	W.failed++;
	if (x->established)
		W.established--;
	else
		W.in_handshake--;
	if (x->bev) {
		bufferevent_free(x->bev);
		x->bev = NULL;
	}
	start_more();
	if (!W.all_up && W.next == W.count && W.in_handshake == 0) {
		fprintf(stderr, "agent_swarm: %d of %d sessions failed before all were up\n", W.failed, W.count);
		event_base_loopexit(W.base, NULL);
	}
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	struct agent *x = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v[8];
	int n;

	while ((n = evbuffer_peek(in, -1, NULL, v, 8)) > 0) {
		size_t total = 0;
		for (int i = 0; i < n && i < 8; i++) {
			if (!mux_feed(x->s, v[i].iov_base, v[i].iov_len, now_ms())) {
				flush(x);
				agent_fail(x, "session failed");
				return;
			}
			total += v[i].iov_len;
		}
		evbuffer_drain(in, total);
	}
	flush(x);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	flush(arg);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct agent *x = arg;
	char why[200] = "the relay closed the connection";
	unsigned long e;

	if (what & BEV_EVENT_CONNECTED) {
		SSL *ssl = bufferevent_openssl_get_ssl(bev);
		char token[128];
		uint8_t ekm[32], key[32], proof[EVP_MAX_MD_SIZE];
		unsigned plen = 0;

		if (SSL_export_keying_material(ssl, ekm, sizeof(ekm), EXPORTER_LABEL, strlen(EXPORTER_LABEL),
					       NULL, 0, 0) != 1) {
			agent_fail(x, "TLS exporter failed");
			return;
		}
		snprintf(token, sizeof(token), "lokadb-swarm-token-%s", x->site);
		SHA256((const unsigned char *)token, strlen(token), key);
		HMAC(EVP_sha256(), key, sizeof(key), ekm, sizeof(ekm), proof, &plen);
		if (!mux_hello(x->s, x->site, proof, PROOF_LEN, now_ms())) {
			agent_fail(x, "cannot build HELLO");
			return;
		}
		flush(x);
		return;
	}
	e = bufferevent_get_openssl_error(bev);
	if (e) {
		char buf[160];
		ERR_error_string_n(e, buf, sizeof(buf));
		snprintf(why, sizeof(why), "TLS: %s", buf);
	} else if ((what & BEV_EVENT_ERROR) && EVUTIL_SOCKET_ERROR()) {
		snprintf(why, sizeof(why), "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	}
	agent_fail(x, why);
}

/* ---- mux callbacks ---- */

static void on_hello_ack(struct mux_session *s, const struct mux_hello *ack, void *ud)
{
	struct agent *x = ud;

	(void)s;
	(void)ack;
	x->established = true;
	W.in_handshake--;
	W.established++;
	if (W.established == W.count && !W.all_up) {
		W.all_up = true;
		printf("agent_swarm: %d sessions established in %.2f s\n", W.count, now_s() - W.t0);
		fflush(stdout);
	}
	start_more();
}

static uint32_t on_open(struct mux_session *s, uint32_t id, const struct mux_open *o, void **stream_ud, void *ud)
{
	(void)s;
	(void)id;
	(void)o;
	(void)stream_ud;
	(void)ud;
	return MUX_E_NO_SUCH_TARGET;
}

static long read_data(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *stream_ud,
		      void *ud)
{
	(void)s;
	(void)id;
	(void)dst;
	(void)max;
	(void)stream_ud;
	(void)ud;
	*eof = true;
	return 0;
}

static void on_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms, const char *debug,
		      size_t debug_len, void *ud)
{
	struct agent *x = ud;
	char why[320];

	(void)s;
	(void)last;
	(void)reconnect_ms;
	snprintf(why, sizeof(why), "GOAWAY %s: %.*s", mux_error_name(code), (int)debug_len, debug);
	flush(x);
	agent_fail(x, why);
}

static void on_session_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	(void)s;
	fprintf(stderr, "agent_swarm: %s: session error %s: %s\n", ((struct agent *)ud)->site, mux_error_name(code),
		msg);
}

static const struct mux_callbacks callbacks = {
	.on_hello_ack = on_hello_ack,
	.on_open = on_open,
	.read_data = read_data,
	.on_goaway = on_goaway,
	.on_session_error = on_session_error,
};

/* ---- sessions ---- */

static bool start_one(struct agent *x)
{
	SSL *ssl = SSL_new(W.ctx);
	int one = 1;
	evutil_socket_t fd;

	x->started = true;
	x->s = mux_session_new(MUX_ROLE_AGENT, &W.set, &callbacks, x);
	fd = socket(W.relay.ss_family, SOCK_STREAM, 0);
	if (!ssl || !x->s || fd < 0) {
		if (fd >= 0)
			evutil_closesocket(fd);
		SSL_free(ssl);
		return false;
	}
	evutil_make_socket_nonblocking(fd);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	x->bev = bufferevent_openssl_socket_new(W.base, fd, ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
	if (!x->bev) {
		evutil_closesocket(fd);
		SSL_free(ssl);
		return false;
	}
	bufferevent_setcb(x->bev, read_cb, write_cb, event_cb, x);
	bufferevent_setwatermark(x->bev, EV_WRITE, OUT_LOW_WATER / 2, 0);
	bufferevent_enable(x->bev, EV_READ | EV_WRITE);
	W.in_handshake++;
	if (bufferevent_socket_connect(x->bev, (struct sockaddr *)&W.relay, W.relay_len) < 0) {
		agent_fail(x, "connect failed");
		return true;
	}
	return true;
}

static void start_more(void)
{
	while (W.next < W.count && W.in_handshake < W.parallel) {
		struct agent *x = &W.a[W.next++];
		if (!start_one(x)) {
			fprintf(stderr, "agent_swarm: %s: out of resources (SSL, socket or memory)\n", x->site);
			x->dead = true;
			W.failed++;
		}
	}
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	uint64_t now = now_ms();

	(void)fd;
	(void)what;
	(void)arg;
	for (int i = 0; i < W.next; i++) {
		struct agent *x = &W.a[i];
		if (x->dead || !x->established)
			continue;
		mux_tick(x->s, now);
		if (mux_failed(x->s)) {
			flush(x);
			agent_fail(x, "session timed out");
			continue;
		}
		flush(x);
	}
}

static void up_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	if (!W.all_up) {
		fprintf(stderr, "agent_swarm: only %d of %d sessions up after %d s\n", W.established, W.count,
			UP_DEADLINE_SEC);
		event_base_loopexit(W.base, NULL);
	}
}

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	(void)arg;
	event_base_loopexit(W.base, NULL);
}

static void usage(void)
{
	fprintf(stderr, "usage: agent_swarm --relay HOST:PORT --count N [--prefix NAME] [--parallel N] "
		"[--hold-s S]\n");
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
	struct event *tick, *up_deadline, *sigterm, *sigint, *hold = NULL;
	struct timeval tv_tick = { 1, 0 }, tv_up = { UP_DEADLINE_SEC, 0 }, tv_hold = { 0, 0 };
	bool have_relay = false;
	long hold_s = 0;
	int rc;

	W.relay_len = sizeof(W.relay);
	W.prefix = "swarm";
	W.parallel = 32;
	for (int i = 1; i < argc; i += 2) {
		const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!val)
			usage();
		if (strcmp(opt, "--relay") == 0)
			have_relay = evutil_parse_sockaddr_port(val, (struct sockaddr *)&W.relay, &W.relay_len) == 0;
		else if (strcmp(opt, "--count") == 0)
			W.count = (int)number(val, 1, MAX_COUNT);
		else if (strcmp(opt, "--prefix") == 0 && strlen(val) >= 1 && strlen(val) <= 40)
			W.prefix = val;
		else if (strcmp(opt, "--parallel") == 0)
			W.parallel = (int)number(val, 1, 128);
		else if (strcmp(opt, "--hold-s") == 0)
			hold_s = number(val, 0, 86400);
		else
			usage();
	}
	if (!have_relay || W.count == 0)
		usage();
	signal(SIGPIPE, SIG_IGN);
	mux_settings_default(&W.set);
	W.a = calloc((size_t)W.count, sizeof(*W.a));
	W.ctx = SSL_CTX_new(TLS_client_method());
	{
		struct event_config *cfg = event_config_new();
		event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
		W.base = event_base_new_with_config(cfg);
		event_config_free(cfg);
	}
	if (!W.a || !W.ctx || !W.base) {
		fprintf(stderr, "agent_swarm: out of memory\n");
		return 1;
	}
	SSL_CTX_set_min_proto_version(W.ctx, TLS1_3_VERSION);
	SSL_CTX_set_num_tickets(W.ctx, 0);
	SSL_CTX_set_session_cache_mode(W.ctx, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_verify(W.ctx, SSL_VERIFY_NONE, NULL);
	for (int i = 0; i < W.count; i++) {
		W.a[i].idx = i;
		snprintf(W.a[i].site, sizeof(W.a[i].site), "%s%04d", W.prefix, i);
	}
	tick = event_new(W.base, -1, EV_PERSIST, tick_cb, NULL);
	up_deadline = evtimer_new(W.base, up_deadline_cb, NULL);
	sigterm = evsignal_new(W.base, SIGTERM, stop_cb, NULL);
	sigint = evsignal_new(W.base, SIGINT, stop_cb, NULL);
	evtimer_add(tick, &tv_tick);
	evtimer_add(up_deadline, &tv_up);
	evsignal_add(sigterm, NULL);
	evsignal_add(sigint, NULL);
	if (hold_s) {
		hold = evtimer_new(W.base, stop_cb, NULL);
		tv_hold.tv_sec = hold_s;
		evtimer_add(hold, &tv_hold);
	}
	W.t0 = now_s();
	start_more();
	event_base_dispatch(W.base);

	printf("agent_swarm: %d established, %d failed\n", W.established, W.failed);
	rc = W.failed || !W.all_up ? 1 : 0;
	for (int i = 0; i < W.count; i++) {
		if (W.a[i].bev)
			bufferevent_free(W.a[i].bev);
		mux_session_free(W.a[i].s);
	}
	free(W.a);
	event_free(tick);
	event_free(up_deadline);
	event_free(sigterm);
	event_free(sigint);
	if (hold)
		event_free(hold);
	SSL_CTX_free(W.ctx);
	event_base_free(W.base);
	return rc;
}
