/* SPDX-License-Identifier: ISC */
/*
 * relay -- the cloud end of the tunnel (doc/tunnel.md).
 *
 * Listens for agents over TLS 1.3, checks each agent's credential (the
 * site's token, proven with an HMAC over the TLS exporter so a captured
 * proof is worth nothing on another connection), and registers the
 * transport `tunnel`: a [databases] entry with `transport=tunnel
 * host=SITE dbname=DB` has each server connection (and each cancel
 * request) carried by one stream of SITE's agent session, db_key = DB.
 * The core gets one end of a socketpair; the other end is pumped to and
 * from the stream, with credit returned only for bytes written onward.
 *
 * Settings [plugin.relay]: listen, cert_file, key_file, sites, max_streams.
 * Console: SHOW AGENTS, SHOW STREAMS.
 */
#include <lokadb/plugin.h>

#include "mux.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TUNNEL_EXPORTER_LABEL "EXPORTER-Channel-Binding"
#define PROOF_LEN 32
#define HELLO_DEADLINE_MS 10000
#define OUT_LOW_WATER (256 * 1024)	/* produce more mux output below this */
#define PAIR_READ_HIGH (256 * 1024)	/* stop reading the core's end above this */
#define MAX_SITES 1024
#define MAX_HANDSHAKES 128		/* connections not yet authenticated */

static const lk_api *api;
static lk_plugin *me;

struct site {
	char name[MUX_NAME_MAX + 1];
	uint8_t hash[32];		/* SHA-256 of the token */
};

struct agent {
	struct bufferevent *bev;	/* TLS */
	struct mux_session *s;
	struct event *tick;
	struct site *site;		/* once authenticated */
	char site_name[MUX_NAME_MAX + 1];
	char addr[64];
	time_t since;			/* wall clock of the HELLO_ACK */
	uint64_t started_ms;
	long long bytes_in, bytes_out, rtt_ms;
	unsigned n_streams;
	bool dying, close_when_flushed, established;
	struct agent *next;
};

struct stream {
	struct agent *a;
	uint32_t id;
	lk_connect *req;		/* until OPEN_ACK or failure */
	struct bufferevent *pair;	/* our end of the core's socketpair */
	int core_fd;			/* the core's end, until handed over */
	bool pair_eof, fin_in, is_cancel;
	char db[MUX_NAME_MAX + 1];
	long long bytes_in, bytes_out;	/* from the agent, to the agent */
	struct stream *next;
};

static struct {
	struct evconnlistener *lis;
	SSL_CTX *ctx;
	struct site *sites;
	int n_sites;
	struct agent *agents;
	struct stream *streams;
	unsigned n_streams, max_streams;
	long long refused_auth, refused_streams, refused_handshakes;
	struct mux_settings settings;
} R;

static uint64_t now_ms(void)
{
	return api->now_usec() / 1000u;
}

/* ================= settings ================= */

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

/* "acme:HEX64, beta:HEX64" -> sites (out may be NULL: check only). */
static bool parse_sites(const char *v, struct site **out, int *n_out, char *why, size_t wlen)
{
	struct site *arr = NULL;
	int n = 0;
	const char *p = v ? v : "";

	for (;;) {
		const char *start, *colon, *end;
		size_t nl;

		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			break;
		start = p;
		while (*p && *p != ',')
			p++;
		end = p;
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		colon = memchr(start, ':', (size_t)(end - start));
		if (!colon) {
			snprintf(why, wlen, "\"%.*s\" is not SITE:SHA256HEX", (int)(end - start), start);
			goto bad;
		}
		nl = (size_t)(colon - start);
		if (nl == 0 || nl > MUX_NAME_MAX) {
			snprintf(why, wlen, "a site name must be 1..%d characters", MUX_NAME_MAX);
			goto bad;
		}
		if (end - colon - 1 != 64) {
			snprintf(why, wlen, "site \"%.*s\": the token hash must be 64 hex digits (SHA-256)", (int)nl, start);
			goto bad;
		}
		if (n >= MAX_SITES) {
			snprintf(why, wlen, "more than %d sites", MAX_SITES);
			goto bad;
		}
		{
			struct site *g = realloc(arr, sizeof(*arr) * (size_t)(n + 1));
			if (!g) {
				snprintf(why, wlen, "out of memory");
				goto bad;
			}
			arr = g;
		}
		memset(&arr[n], 0, sizeof(arr[n]));
		memcpy(arr[n].name, start, nl);
		for (int i = 0; i < 32; i++) {
			int hi = hexval(colon[1 + 2 * i]), lo = hexval(colon[2 + 2 * i]);
			if (hi < 0 || lo < 0) {
				snprintf(why, wlen, "site \"%s\": the token hash must be 64 hex digits (SHA-256)", arr[n].name);
				goto bad;
			}
			arr[n].hash[i] = (uint8_t)(hi << 4 | lo);
		}
		for (int i = 0; i < n; i++)
			if (strcmp(arr[i].name, arr[n].name) == 0) {
				snprintf(why, wlen, "site \"%s\" is listed twice", arr[n].name);
				goto bad;
			}
		n++;
	}
	if (out) {
		*out = arr;
		*n_out = n;
	} else {
		free(arr);
	}
	return true;
bad:
	free(arr);
	return false;
}

static bool parse_listen(const char *v, struct sockaddr_storage *ss, int *len)
{
	char host[128];
	const char *colon;
	struct addrinfo hints, *ai = NULL;

	if (!v || !*v)
		return false;
	colon = strrchr(v, ':');
	if (!colon || colon == v || (size_t)(colon - v) >= sizeof(host) || !colon[1])
		return false;
	if (v[0] == '[' && colon[-1] == ']')
		snprintf(host, sizeof(host), "%.*s", (int)(colon - v - 2), v + 1);
	else
		snprintf(host, sizeof(host), "%.*s", (int)(colon - v), v);
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
		return false;
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = (int)ai->ai_addrlen;
	freeaddrinfo(ai);
	return true;
}

static bool parse_max_streams(const char *v, unsigned *out)
{
	char *end;
	long n = strtol(v ? v : "", &end, 10);

	if (!v || !*v || *end || n < 1 || n > MUX_MAX_STREAMS_CAP)
		return false;
	*out = (unsigned)n;
	return true;
}

static SSL_CTX *make_ctx(const char *cert, const char *key, char *why, size_t wlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

	if (!ctx) {
		snprintf(why, wlen, "SSL_CTX_new failed");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	SSL_CTX_set_num_tickets(ctx, 0);
	SSL_CTX_set_max_early_data(ctx, 0);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		snprintf(why, wlen, "cannot load the certificate %s: %s", cert,
			 ERR_reason_error_string(ERR_get_error()));
		goto bad;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
		snprintf(why, wlen, "cannot load the key %s (or it does not match the certificate): %s", key,
			 ERR_reason_error_string(ERR_get_error()));
		goto bad;
	}
	return ctx;
bad:
	ERR_clear_error();
	SSL_CTX_free(ctx);
	return NULL;
}

/* ================= agent sessions ================= */

static void agent_flush(struct agent *a);
static void agent_kill(struct agent *a, const char *why);

static void stream_unlink(struct stream *st)
{
	for (struct stream **pp = &R.streams; *pp; pp = &(*pp)->next)
		if (*pp == st) {
			*pp = st->next;
			break;
		}
}

static const char *close_reason(uint32_t code)
{
	switch (code) {
	case MUX_E_NO_SUCH_TARGET:
		return "the agent has no database of that name";
	case MUX_E_TARGET_UNREACHABLE:
		return "the agent could not connect to the database";
	case MUX_E_STREAM_LIMIT:
		return "the agent is at its max_conns";
	case MUX_E_REFUSED:
	case MUX_E_RELAY_RESTART:
		return "the agent's session is going away";
	default:
		return mux_error_name(code);
	}
}

static void stream_free(struct stream *st)
{
	stream_unlink(st);
	if (st->pair)
		bufferevent_free(st->pair);
	if (st->core_fd >= 0)
		close(st->core_fd);
	R.n_streams--;
	if (st->a)
		st->a->n_streams--;
	free(st);
}

/* ---- the core's end ---- */

static void pair_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct stream *st = arg;
	struct agent *a = st->a;

	(void)buf;
	if (info->n_deleted && a && !a->dying) {
		mux_stream_consumed(a->s, st->id, info->n_deleted);
		agent_flush(a);
	}
}

static void pair_read_cb(struct bufferevent *bev, void *arg)
{
	struct stream *st = arg;
	struct agent *a = st->a;

	(void)bev;
	if (a && !a->dying) {
		mux_resume(a->s, st->id);
		agent_flush(a);
	}
}

static void pair_write_cb(struct bufferevent *bev, void *arg)
{
	struct stream *st = arg;

	if (st->fin_in && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		shutdown(bufferevent_getfd(bev), SHUT_WR);
}

static void pair_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct stream *st = arg;
	struct agent *a = st->a;	/* st may be freed by the reset */

	(void)bev;
	if (!a || a->dying)
		return;
	if (what & BEV_EVENT_EOF) {
		st->pair_eof = true;
		mux_resume(a->s, st->id);
	} else if (what & BEV_EVENT_ERROR) {
		mux_reset(a->s, st->id, MUX_E_CANCEL);
	}
	agent_flush(a);
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

/* ---- mux callbacks ---- */

static bool exporter(struct agent *a, uint8_t out[32])
{
	SSL *ssl = bufferevent_openssl_get_ssl(a->bev);

	return ssl && SSL_export_keying_material(ssl, out, 32, TUNNEL_EXPORTER_LABEL,
						 strlen(TUNNEL_EXPORTER_LABEL), NULL, 0, 0) == 1;
}

static void on_hello(struct mux_session *s, const struct mux_hello *h, void *ud)
{
	struct agent *a = ud;
	struct site *site = NULL;
	uint8_t ekm[32], want[EVP_MAX_MD_SIZE], sid[MUX_ID_LEN];
	unsigned wlen = 0;

	snprintf(a->site_name, sizeof(a->site_name), "%s", h->agent_id);
	for (int i = 0; i < R.n_sites; i++)
		if (strcmp(R.sites[i].name, h->agent_id) == 0)
			site = &R.sites[i];
	if (!site || h->proof_len != PROOF_LEN || !exporter(a, ekm) ||
	    !HMAC(EVP_sha256(), site->hash, 32, ekm, sizeof(ekm), want, &wlen) ||
	    CRYPTO_memcmp(want, h->proof, PROOF_LEN) != 0) {
		R.refused_auth++;
		api->log(me, LK_LOG_WARNING, "relay: agent %s refused: %s for site \"%s\"", a->addr,
			 site ? "bad token" : "unknown site", h->agent_id);
		mux_goaway(s, MUX_E_UNAUTHORIZED, 0, "bad credential");
		a->close_when_flushed = true;
		return;
	}
	RAND_bytes(sid, sizeof(sid));
	if (!mux_accept(s, sid, (uint64_t)time(NULL) * 1000u)) {
		agent_kill(a, "cannot accept");
		return;
	}
	a->site = site;
	a->established = true;
	a->since = time(NULL);
	api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" connected from %s", site->name, a->addr);
}

static void on_open_ack(struct mux_session *s, uint32_t id, void *sud, void *ud)
{
	struct stream *st = sud;
	lk_connect *req = st->req;
	int fd = st->core_fd;

	(void)s;
	(void)id;
	(void)ud;
	if (!req)
		return;
	st->req = NULL;
	st->core_fd = -1;
	api->connect_ready(req, fd);
}

static void on_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *sud, void *ud)
{
	struct stream *st = sud;
	struct agent *a = ud;

	(void)id;
	a->bytes_in += (long long)len;
	st->bytes_in += (long long)len;
	if (!st->pair || bufferevent_write(st->pair, data, len) != 0) {
		mux_stream_consumed(s, st->id, len);
		mux_reset(s, st->id, MUX_E_INTERNAL);
	}
}

static void on_fin(struct mux_session *s, uint32_t id, void *sud, void *ud)
{
	struct stream *st = sud;

	(void)s;
	(void)id;
	(void)ud;
	st->fin_in = true;
	if (st->pair)
		pair_write_cb(st->pair, st);
}

static void on_stream_close(struct mux_session *s, uint32_t id, uint32_t code, bool by_peer, bool retryable,
			    void *sud, void *ud)
{
	struct stream *st = sud;
	char msg[256];

	(void)s;
	(void)id;
	(void)by_peer;
	(void)retryable;
	(void)ud;
	if (!st)
		return;
	if (st->req) {
		lk_connect *req = st->req;

		st->req = NULL;
		snprintf(msg, sizeof(msg), "tunnel to site \"%s\" database \"%s\": %s",
			 st->a ? st->a->site_name : "?", st->db, close_reason(code));
		api->connect_failed(req, msg);
	}
	if (st->pair && code == MUX_NO_ERROR && evbuffer_get_length(bufferevent_get_output(st->pair)) > 0) {
		/* both FINs went: let the last bytes reach the core, then close */
		struct bufferevent *bev = st->pair;

		st->pair = NULL;
		evbuffer_remove_cb(bufferevent_get_output(bev), pair_out_cb, st);
		bufferevent_disable(bev, EV_READ);
		bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
		bufferevent_setcb(bev, NULL, drained_cb, drained_event_cb, NULL);
	}
	stream_free(st);
}

static void on_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms,
		      const char *debug, size_t dlen, void *ud)
{
	struct agent *a = ud;

	(void)s;
	(void)last;
	(void)reconnect_ms;
	api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" (%s) is going away: %s %.*s", a->site_name, a->addr,
		 mux_error_name(code), (int)dlen, debug);
}

static void on_ping_ack(struct mux_session *s, uint64_t rtt, void *ud)
{
	struct agent *a = ud;

	(void)s;
	a->rtt_ms = (long long)rtt;
}

static void on_session_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	struct agent *a = ud;

	(void)s;
	api->log(me, LK_LOG_WARNING, "relay: session of agent %s (site \"%s\") failed: %s: %s", a->addr,
		 a->site_name, mux_error_name(code), msg ? msg : "");
	a->close_when_flushed = true;
}

static long read_data(struct mux_session *s, uint32_t id, uint8_t *dst, size_t max, bool *eof, void *sud, void *ud)
{
	struct stream *st = sud;
	struct agent *a = ud;
	int n;

	(void)s;
	(void)id;
	if (!st->pair) {
		*eof = true;
		return 0;
	}
	n = evbuffer_remove(bufferevent_get_input(st->pair), dst, max);
	if (n < 0)
		return -1;
	a->bytes_out += n;
	st->bytes_out += n;
	if (st->pair_eof && evbuffer_get_length(bufferevent_get_input(st->pair)) == 0)
		*eof = true;
	return n;
}

static const struct mux_callbacks relay_cb = {
	.on_hello = on_hello,
	.on_open_ack = on_open_ack,
	.on_data = on_data,
	.on_fin = on_fin,
	.on_stream_close = on_stream_close,
	.on_goaway = on_goaway,
	.on_ping_ack = on_ping_ack,
	.on_session_error = on_session_error,
	.read_data = read_data,
};

/* ---- the TLS connection ---- */

static void agent_reap(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;

	(void)fd;
	(void)what;
	mux_session_abort(a->s, MUX_E_TIMEOUT);	/* reports every stream closed */
	for (struct agent **pp = &R.agents; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	mux_session_free(a->s);
	if (a->tick)
		event_free(a->tick);
	if (a->bev)
		bufferevent_free(a->bev);
	free(a);
}

static void agent_kill(struct agent *a, const char *why)
{
	struct timeval zero = { 0, 0 };

	if (a->dying)
		return;
	a->dying = true;
	if (a->established)
		api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" (%s) disconnected: %s", a->site_name,
			 a->addr, why);
	if (a->bev)
		bufferevent_disable(a->bev, EV_READ | EV_WRITE);
	event_base_once(api->event_base(), -1, EV_TIMEOUT, agent_reap, a, &zero);
}

static void agent_flush(struct agent *a)
{
	struct evbuffer *out;
	const uint8_t *p;
	size_t n;

	if (a->dying)
		return;
	out = bufferevent_get_output(a->bev);
	while (evbuffer_get_length(out) < OUT_LOW_WATER && (n = mux_pending(a->s, &p)) > 0) {
		if (evbuffer_add(out, p, n) != 0) {
			agent_kill(a, "out of memory");
			return;
		}
		mux_consumed(a->s, n);
	}
	if (a->close_when_flushed && evbuffer_get_length(out) == 0)
		agent_kill(a, "closed");
}

static void agent_read_cb(struct bufferevent *bev, void *arg)
{
	struct agent *a = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v[8];
	bool ok = true;

	while (ok && !a->dying && evbuffer_get_length(in) > 0) {
		int n = evbuffer_peek(in, -1, NULL, v, 8);
		size_t used = 0;

		for (int i = 0; i < n && i < 8 && ok; i++) {
			ok = mux_feed(a->s, v[i].iov_base, v[i].iov_len, now_ms());
			used += v[i].iov_len;
		}
		evbuffer_drain(in, used);
	}
	if (!ok)
		a->close_when_flushed = true;
	agent_flush(a);
}

static void agent_write_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	agent_flush(arg);
}

static void agent_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct agent *a = arg;
	unsigned long e;
	char why[160] = "connection closed";

	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		return;
	e = bufferevent_get_openssl_error(a->bev);
	if (e && (ERR_GET_LIB(e) == 0 || ERR_GET_LIB(e) == ERR_LIB_SYS))
		e = 0;	/* a socket error libevent passed through OpenSSL's queue */
	if (e) {
		ERR_error_string_n(e, why, sizeof(why));
		if (!a->established)
			api->log(me, LK_LOG_WARNING, "relay: TLS with %s failed: %s", a->addr, why);
	} else if (what & BEV_EVENT_ERROR) {
		snprintf(why, sizeof(why), "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	}
	agent_kill(a, why);
}

static void agent_tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = arg;
	uint64_t now = now_ms(), next;
	struct timeval tv;

	(void)fd;
	(void)what;
	if (a->dying)
		return;
	if (!a->established && now - a->started_ms > HELLO_DEADLINE_MS) {
		api->log(me, LK_LOG_WARNING, "relay: %s sent no valid HELLO within %d s", a->addr,
			 HELLO_DEADLINE_MS / 1000);
		agent_kill(a, "no HELLO");
		return;
	}
	next = mux_tick(a->s, now);
	if (next <= now)
		next = now + 1;
	if (!a->established && next > a->started_ms + HELLO_DEADLINE_MS + 1)
		next = a->started_ms + HELLO_DEADLINE_MS + 1;
	tv.tv_sec = (time_t)((next - now) / 1000);
	tv.tv_usec = (suseconds_t)((next - now) % 1000 * 1000);
	evtimer_add(a->tick, &tv);
	agent_flush(a);
}

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct agent *a;
	SSL *ssl;
	char host[INET6_ADDRSTRLEN] = "?", port[8] = "0";

	(void)lis;
	(void)arg;
	getnameinfo(sa, (socklen_t)salen, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
	{
		int pending = 0;

		for (struct agent *x = R.agents; x; x = x->next)
			pending += !x->established && !x->dying;
		if (pending >= MAX_HANDSHAKES) {
			R.refused_handshakes++;
			if (R.refused_handshakes == 1 || R.refused_handshakes % 1000 == 0)
				api->log(me, LK_LOG_WARNING, "relay: connection from %s:%s closed: %d handshakes in progress",
					 host, port, MAX_HANDSHAKES);
			evutil_closesocket(fd);
			return;
		}
	}
	a = calloc(1, sizeof(*a));
	ssl = a ? SSL_new(R.ctx) : NULL;
	if (!ssl) {
		free(a);
		evutil_closesocket(fd);
		return;
	}
	snprintf(a->addr, sizeof(a->addr), "%s:%s", host, port);
	a->started_ms = now_ms();
	a->s = mux_session_new(MUX_ROLE_RELAY, &R.settings, &relay_cb, a);
	a->bev = bufferevent_openssl_socket_new(api->event_base(), fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
						BEV_OPT_CLOSE_ON_FREE);
	a->tick = evtimer_new(api->event_base(), agent_tick_cb, a);
	if (!a->s || !a->bev || !a->tick) {
		if (!a->bev) {
			SSL_free(ssl);
			evutil_closesocket(fd);
		} else {
			bufferevent_free(a->bev);
		}
		mux_session_free(a->s);
		if (a->tick)
			event_free(a->tick);
		free(a);
		return;
	}
	a->next = R.agents;
	R.agents = a;
	bufferevent_setcb(a->bev, agent_read_cb, agent_write_cb, agent_event_cb, a);
	bufferevent_setwatermark(a->bev, EV_WRITE, OUT_LOW_WATER / 2, 0);
	bufferevent_enable(a->bev, EV_READ | EV_WRITE);
	agent_tick_cb(-1, 0, a);
}

/* ================= the transport ================= */

/*
 * The session that takes a new stream of the site: the newest established
 * one not going away (agents are listed newest first). Several agents of a
 * site may be connected (a restart overlapping, or two for redundancy): the
 * older ones keep their streams and take new ones when the newest is gone.
 */
static struct agent *site_agent(const struct site *site)
{
	for (struct agent *a = R.agents; a; a = a->next)
		if (a->site == site && a->established && !a->dying && !a->close_when_flushed &&
		    !mux_going_away(a->s) && !mux_failed(a->s))
			return a;
	return NULL;
}

static int tunnel_connect(lk_plugin *self, lk_connect *req)
{
	const char *site_name = api->connect_host(req);
	const char *db = api->connect_dbname(req);
	struct site *site = NULL;
	struct agent *agent;
	struct stream *st;
	struct mux_open op;
	uint32_t err = 0;
	int sv[2];
	char msg[256];

	(void)self;
	for (int i = 0; site_name && i < R.n_sites; i++)
		if (strcmp(R.sites[i].name, site_name) == 0)
			site = &R.sites[i];
	if (!site) {
		snprintf(msg, sizeof(msg), "no tunnel site \"%s\" in [plugin.relay] sites (host= names the site)",
			 site_name ? site_name : "");
		api->connect_failed(req, msg);
		return LK_ERROR;
	}
	agent = site_agent(site);
	if (!agent) {
		snprintf(msg, sizeof(msg), "no agent of site \"%s\" is connected", site->name);
		api->connect_failed(req, msg);
		return LK_ERROR;
	}
	if (R.n_streams >= R.max_streams) {
		R.refused_streams++;
		snprintf(msg, sizeof(msg), "the relay is at max_streams (%u)", R.max_streams);
		api->log(me, LK_LOG_WARNING, "relay: stream to site \"%s\" refused: max_streams (%u) reached",
			 site->name, R.max_streams);
		api->connect_failed(req, msg);
		return LK_ERROR;
	}
	if (!db || !*db || strlen(db) > MUX_NAME_MAX) {
		api->connect_failed(req, "the database name must be 1..63 bytes for the tunnel");
		return LK_ERROR;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
		api->connect_failed(req, "socketpair failed");
		return LK_ERROR;
	}
	st = calloc(1, sizeof(*st));
	if (st)
		st->pair = bufferevent_socket_new(api->event_base(), sv[1], BEV_OPT_CLOSE_ON_FREE);
	if (!st || !st->pair) {
		free(st);
		close(sv[0]);
		close(sv[1]);
		api->connect_failed(req, "out of memory");
		return LK_ERROR;
	}
	st->a = agent;
	st->req = req;
	st->core_fd = sv[0];
	st->is_cancel = api->connect_is_cancel(req) != 0;
	snprintf(st->db, sizeof(st->db), "%s", db);
	memset(&op, 0, sizeof(op));
	snprintf(op.db_key, sizeof(op.db_key), "%s", db);
	snprintf(op.client_id, sizeof(op.client_id), "%s%s", api->connect_database(req), st->is_cancel ? "/cancel" : "");
	st->id = mux_open(st->a->s, &op, st, &err);
	if (!st->id) {
		bufferevent_free(st->pair);
		close(sv[0]);
		free(st);
		snprintf(msg, sizeof(msg), "cannot open a stream to site \"%s\": %s", site->name, mux_error_name(err));
		api->connect_failed(req, msg);
		return LK_ERROR;
	}
	R.n_streams++;
	st->a->n_streams++;
	st->next = R.streams;
	R.streams = st;
	bufferevent_setcb(st->pair, pair_read_cb, pair_write_cb, pair_event_cb, st);
	bufferevent_setwatermark(st->pair, EV_READ, 0, PAIR_READ_HIGH);
	evbuffer_add_cb(bufferevent_get_output(st->pair), pair_out_cb, st);
	bufferevent_enable(st->pair, EV_READ | EV_WRITE);
	agent_flush(st->a);
	return LK_ASYNC;
}

/* ================= config ================= */

static int on_config_check(lk_plugin *self, lk_event *ev)
{
	char why[256];
	struct sockaddr_storage ss;
	int len;
	unsigned ms;
	const char *cert = api->config_get(ev, "cert_file"), *key = api->config_get(ev, "key_file");
	SSL_CTX *ctx;

	(void)self;
	if (!parse_sites(api->config_get(ev, "sites"), NULL, NULL, why, sizeof(why)))
		return api->config_error(ev, "sites", "%s", why);
	if (!parse_max_streams(api->config_get(ev, "max_streams"), &ms))
		return api->config_error(ev, "max_streams", "must be a number 1..%d", MUX_MAX_STREAMS_CAP);
	if (!parse_listen(api->config_get(ev, "listen"), &ss, &len))
		return api->config_error(ev, "listen", "must be a numeric ADDRESS:PORT (127.0.0.1:7000, [::1]:7000)");
	if (!cert || !*cert)
		return api->config_error(ev, "cert_file", "the relay needs a certificate (TLS 1.3 only)");
	if (!key || !*key)
		return api->config_error(ev, "key_file", "the relay needs the certificate's key");
	ctx = make_ctx(cert, key, why, sizeof(why));
	if (!ctx)
		return api->config_error(ev, "cert_file", "%s", why);
	SSL_CTX_free(ctx);
	return LK_CONTINUE;
}

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	char why[256];
	struct site *sites = NULL;
	int n = 0;

	(void)self;
	if (parse_sites(api->config_get(ev, "sites"), &sites, &n, why, sizeof(why))) {
		/* keep live sessions of sites that stay; drop the others */
		for (struct agent *a = R.agents; a; a = a->next) {
			struct site *ns = NULL;

			if (!a->site)
				continue;
			for (int i = 0; i < n; i++)
				if (strcmp(sites[i].name, a->site->name) == 0 &&
				    memcmp(sites[i].hash, a->site->hash, 32) == 0)
					ns = &sites[i];
			a->site = ns;
			if (!ns) {
				mux_goaway(a->s, MUX_E_UNAUTHORIZED, 0, "site removed or token changed");
				a->close_when_flushed = true;
				agent_flush(a);
			}
		}
		free(R.sites);
		R.sites = sites;
		R.n_sites = n;
	}
	parse_max_streams(api->config_get(ev, "max_streams"), &R.max_streams);
	if (!R.ctx) {
		R.ctx = make_ctx(api->config_get(ev, "cert_file"), api->config_get(ev, "key_file"), why, sizeof(why));
		if (!R.ctx)
			api->log(me, LK_LOG_ERROR, "relay: %s", why);
	} else if (api->config_reloading(ev)) {
		SSL_CTX *ctx = make_ctx(api->config_get(ev, "cert_file"), api->config_get(ev, "key_file"), why,
					sizeof(why));
		if (ctx) {
			SSL_CTX_free(R.ctx);	/* live connections hold their own reference */
			R.ctx = ctx;
		}
	}
	if (!R.lis) {
		struct sockaddr_storage ss;
		int len;

		if (parse_listen(api->config_get(ev, "listen"), &ss, &len)) {
			R.lis = evconnlistener_new_bind(api->event_base(), accept_cb, NULL,
							LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
							128, (struct sockaddr *)&ss, len);
			if (!R.lis)
				api->log(me, LK_LOG_ERROR, "relay: cannot listen on %s: %s", api->config_get(ev, "listen"),
					 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
			else
				api->log(me, LK_LOG_INFO, "relay: listening for agents on %s",
					 api->config_get(ev, "listen"));
		}
	}
	return LK_CONTINUE;
}

/* ================= console ================= */

static int cmd_agents(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "site", "address", "connected_since", "streams", "bytes_in",
					     "bytes_out", "rtt_ms", "state" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT8,
					  LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_TEXT };

	(void)self;
	(void)args;
	api->result_columns(res, 8, names, types);
	for (struct agent *a = R.agents; a; a = a->next) {
		char since[32] = "", b[4][24];
		const char *row[8];
		struct tm tm;

		if (a->established) {
			gmtime_r(&a->since, &tm);
			strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &tm);
		}
		snprintf(b[0], 24, "%u", a->n_streams);
		snprintf(b[1], 24, "%lld", a->bytes_in);
		snprintf(b[2], 24, "%lld", a->bytes_out);
		snprintf(b[3], 24, "%lld", a->rtt_ms);
		row[0] = a->site_name[0] ? a->site_name : NULL;
		row[1] = a->addr;
		row[2] = a->established ? since : NULL;
		row[3] = b[0];
		row[4] = b[1];
		row[5] = b[2];
		row[6] = a->established ? b[3] : NULL;
		row[7] = a->dying ? "closing" : !a->established ? "handshake" :
			 mux_going_away(a->s) || !a->site ? "draining" : "active";
		api->result_row(res, row);
	}
	return LK_HANDLED;
}

static int cmd_streams(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "id", "site", "db", "state", "cancel", "bytes_in", "bytes_out" };
	static const uint32_t types[] = { LK_TYPE_INT8, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_BOOL,
					  LK_TYPE_INT8, LK_TYPE_INT8 };

	(void)self;
	(void)args;
	api->result_columns(res, 7, names, types);
	for (struct stream *st = R.streams; st; st = st->next) {
		char b[3][24];
		const char *row[7];

		snprintf(b[0], 24, "%u", st->id);
		snprintf(b[1], 24, "%lld", st->bytes_in);
		snprintf(b[2], 24, "%lld", st->bytes_out);
		row[0] = b[0];
		row[1] = st->a ? st->a->site_name : NULL;
		row[2] = st->db;
		row[3] = st->req ? "opening" : st->fin_in || st->pair_eof ? "closing" : "open";
		row[4] = st->is_cancel ? "t" : "f";
		row[5] = b[1];
		row[6] = b[2];
		api->result_row(res, row);
	}
	return LK_HANDLED;
}

/* ================= metrics ================= */

static void metric_agents(lk_plugin *self, lk_metrics *m, void *arg)
{
	(void)self;
	for (int i = 0; i < R.n_sites; i++) {
		long n = 0, streams = 0;
		const char *labels[] = { "site", R.sites[i].name, NULL };

		for (struct agent *a = R.agents; a; a = a->next)
			if (a->site == &R.sites[i] && a->established && !a->dying) {
				n++;
				streams += a->n_streams;
			}
		api->metric_sample(m, labels, (double)(arg ? streams : n));
	}
}

static void metric_refused(lk_plugin *self, lk_metrics *m, void *arg)
{
	const char *auth[] = { "reason", "token", NULL }, *streams[] = { "reason", "max_streams", NULL },
		   *hs[] = { "reason", "handshakes", NULL };

	(void)self;
	(void)arg;
	api->metric_sample(m, auth, (double)R.refused_auth);
	api->metric_sample(m, streams, (double)R.refused_streams);
	api->metric_sample(m, hs, (double)R.refused_handshakes);
}

/* ================= init ================= */

static int relay_init(lk_plugin *self, const lk_api *a)
{
	const char *w = getenv("LOKADB_MUX_WINDOW_KB");

	api = a;
	me = self;
	R.max_streams = MUX_MAX_STREAMS_DEFAULT;
	mux_settings_default(&R.settings);
	if (w && atol(w) > 0 && atol(w) <= (long)(MUX_WINDOW_MAX / 1024))
		R.settings.stream_window = (uint32_t)atol(w) * 1024u;
	if (a->transport_register(self, "tunnel", tunnel_connect) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_CHECK, on_config_check, 0) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0 ||
	    a->config_declare(self, "listen", "", "numeric ADDRESS:PORT the relay accepts agents on (TLS 1.3)") != 0 ||
	    a->config_declare(self, "cert_file", "", "the relay's certificate chain (PEM)") != 0 ||
	    a->config_declare(self, "key_file", "", "the certificate's private key (PEM)") != 0 ||
	    a->config_declare(self, "sites", "",
			      "SITE:SHA256HEX, ...: each site's agent token, as the SHA-256 of the token in hex") != 0 ||
	    a->config_declare(self, "max_streams", "2048", "most tunnel streams over all agents") != 0 ||
	    a->console_register(self, "SHOW AGENTS", 0, cmd_agents, "agents connected to the relay") != 0 ||
	    a->console_register(self, "SHOW STREAMS", 0, cmd_streams, "tunnel streams of the relay") != 0) {
		a->init_error(self, "registration failed");
		return -1;
	}
	if (LK_API_HAS(a, metric_register) &&
	    (a->metric_register(self, "agents", LK_METRIC_GAUGE, "agent sessions accepted, per site", metric_agents,
				NULL) != 0 ||
	     a->metric_register(self, "streams", LK_METRIC_GAUGE, "open tunnel streams, per site", metric_agents,
				(void *)1) != 0 ||
	     a->metric_register(self, "refused", LK_METRIC_COUNTER,
				"agents refused (token), streams refused (max_streams), connections closed (handshakes)",
				metric_refused, NULL) != 0)) {
		a->init_error(self, "metric registration failed");
		return -1;
	}
	return 0;
}

static void relay_fini(lk_plugin *self)
{
	(void)self;
	if (R.lis)
		evconnlistener_free(R.lis);
	R.lis = NULL;
}

LK_PLUGIN("relay", "0.1.0", relay_init, relay_fini)
