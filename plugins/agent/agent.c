/* SPDX-License-Identifier: ISC */
/*
 * agent -- the site end of the tunnel (doc/tunnel.md).
 *
 * Dials the relay over TLS 1.3 (the relay's certificate checked against
 * relay_ca and/or its public key against relay_pin), proves the site's
 * token bound to that TLS session (HMAC over the TLS exporter), and serves
 * the streams the relay opens: each OPEN names a db_key that must be in the
 * `databases` allow-list; the agent connects to that entry's address (never
 * an address from the wire) and copies bytes both ways, returning credit
 * only for bytes written onward. The session is redialed with exponential
 * backoff and full jitter, at once after a GOAWAY.
 *
 * Settings [plugin.agent]: relay, site, token, relay_ca, relay_pin,
 * relay_name, databases, max_conns.  Console: SHOW AGENT.
 */
#include <lokadb/plugin.h>

#include "link.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_BASE_MS 250
#define BACKOFF_CAP_MS 30000
#define CONNECT_DEADLINE_MS 15000
#define MAX_DBS 256

static const lk_api *api;
static lk_plugin *me;

struct target {
	char key[MUX_NAME_MAX + 1];
	char host[128];
	int port;
	char dbname[128];
	struct sockaddr_storage ss;
	int sslen;
};

struct conf {
	char relay[192], site[MUX_NAME_MAX + 1], token[256], relay_ca[1024], relay_name[256];
	uint8_t pin[32];
	bool has_pin;
	char relay_host[128];		/* relay's HOST */
	int relay_port;
	bool relay_is_name;		/* resolved before each dial (api->resolve) */
	struct sockaddr_storage relay_ss;	/* a numeric relay's address */
	int relay_sslen;
	struct target *dbs;
	int n_dbs;
	unsigned max_conns;
};

struct session {
	struct tlink link;		/* TLS connection and mux session */
	time_t since;
	struct session *next;
};

struct stream {
	struct tlink_stream ts;		/* first (tlink_cb_*): the database connection, ready once connected */
	struct session *ss;
	const struct target *t;
	bool in_connect, connect_failed;
	bool checked;			/* the first packet (startup or cancel) passed the allow-list */
	struct evbuffer *head;		/* that packet while it is incomplete */
	struct stream *next;
};

struct retired_dbs {
	struct target *dbs;
	struct retired_dbs *next;
};

static struct {
	struct conf c;
	bool configured;
	bool resolving;			/* the relay's name is being resolved */
	bool shutting_down;		/* dial no more */
	SSL_CTX *ctx;
	struct session *sessions;	/* sessions[0] newest when connected */
	struct session *cur;		/* the session that takes new work */
	struct stream *streams;
	unsigned n_streams;
	struct retired_dbs *retired;	/* allow-lists a reload replaced while streams pointed into them */
	struct event *redial;
	unsigned attempts;
	long long reconnects, bytes_in, bytes_out, rtt_ms, refused;
	char last_error[256];
	struct mux_settings settings;
	uint64_t next_dial_ms;
} A;

static uint64_t now_ms(void)
{
	return api->now_usec() / 1000u;
}

/* ================= settings ================= */

static bool numeric_addr(const char *host, int port, struct sockaddr_storage *ss, int *len)
{
	struct addrinfo hints, *ai = NULL;
	char ps[16];

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai)
		return false;
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = (int)ai->ai_addrlen;
	freeaddrinfo(ai);
	return true;
}

/* A DNS name: letters, digits, '-', '.', 1..253 characters, no empty label. */
static bool host_name_ok(const char *h)
{
	size_t n = strlen(h), label = 0;

	if (n == 0 || n > 253)
		return false;
	for (const char *p = h; *p; p++) {
		if (*p == '.') {
			if (label == 0)
				return false;
			label = 0;
		} else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			   *p == '-') {
			if (++label > 63)
				return false;
		} else {
			return false;
		}
	}
	return true;
}

/* "HOST:PORT" ([v6]:port) */
static bool parse_hostport(const char *v, char *host, size_t hlen, int *port)
{
	const char *colon = v ? strrchr(v, ':') : NULL;
	char *end;
	long p;

	if (!colon || colon == v)
		return false;
	p = strtol(colon + 1, &end, 10);
	if (*end || p < 1 || p > 65535)
		return false;
	if (v[0] == '[' && colon[-1] == ']')
		snprintf(host, hlen, "%.*s", (int)(colon - v - 2), v + 1);
	else
		snprintf(host, hlen, "%.*s", (int)(colon - v), v);
	*port = (int)p;
	return true;
}

/* "app:host=127.0.0.1 port=5433 dbname=app, other:host=... " */
static bool parse_dbs(const char *v, struct target **out, int *n_out, char *why, size_t wlen)
{
	struct target *arr = NULL;
	int n = 0;
	char *copy = strdup(v ? v : ""), *save = NULL, *item;

	if (!copy) {
		snprintf(why, wlen, "out of memory");
		return false;
	}
	for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *colon, *kv, *s2 = NULL;
		struct target t;

		while (*item == ' ' || *item == '\t')
			item++;
		if (!*item)
			continue;
		memset(&t, 0, sizeof(t));
		t.port = 5432;
		colon = strchr(item, ':');
		if (!colon || colon == item || colon - item > MUX_NAME_MAX) {
			snprintf(why, wlen, "\"%s\" is not KEY:host=ADDRESS port=PORT dbname=NAME", item);
			goto bad;
		}
		memcpy(t.key, item, (size_t)(colon - item));
		for (kv = strtok_r(colon + 1, " \t", &s2); kv; kv = strtok_r(NULL, " \t", &s2)) {
			char *eq = strchr(kv, '=');
			if (!eq) {
				snprintf(why, wlen, "database \"%s\": \"%s\" is not KEY=VALUE", t.key, kv);
				goto bad;
			}
			*eq = '\0';
			if (strcmp(kv, "host") == 0) {
				snprintf(t.host, sizeof(t.host), "%s", eq + 1);
			} else if (strcmp(kv, "port") == 0) {
				char *end;
				long p = strtol(eq + 1, &end, 10);
				if (*end || p < 1 || p > 65535) {
					snprintf(why, wlen, "database \"%s\": bad port \"%s\"", t.key, eq + 1);
					goto bad;
				}
				t.port = (int)p;
			} else if (strcmp(kv, "dbname") == 0) {
				snprintf(t.dbname, sizeof(t.dbname), "%s", eq + 1);
			} else {
				snprintf(why, wlen, "database \"%s\": unknown option \"%s\"", t.key, kv);
				goto bad;
			}
		}
		if (!t.host[0] || !numeric_addr(t.host, t.port, &t.ss, &t.sslen)) {
			snprintf(why, wlen, "database \"%s\": host must be a numeric address (the agent does not resolve names yet)",
				 t.key);
			goto bad;
		}
		if (!t.dbname[0])
			snprintf(t.dbname, sizeof(t.dbname), "%s", t.key);
		for (int i = 0; i < n; i++)
			if (strcmp(arr[i].key, t.key) == 0) {
				snprintf(why, wlen, "database \"%s\" is listed twice", t.key);
				goto bad;
			}
		if (n >= MAX_DBS) {
			snprintf(why, wlen, "more than %d databases", MAX_DBS);
			goto bad;
		}
		{
			struct target *g = realloc(arr, sizeof(*arr) * (size_t)(n + 1));
			if (!g) {
				snprintf(why, wlen, "out of memory");
				goto bad;
			}
			arr = g;
		}
		arr[n++] = t;
	}
	free(copy);
	*out = arr;
	*n_out = n;
	return true;
bad:
	free(copy);
	free(arr);
	return false;
}

/* Read every setting into c; on error: the key and why. */
static bool parse_conf(lk_event *ev, struct conf *c, const char **bad_key, char *why, size_t wlen)
{
	const char *v;
	char host[128];
	int port;
	long mc;
	char *end;

	memset(c, 0, sizeof(*c));
	v = api->config_get(ev, "relay");
	*bad_key = "relay";
	if (!v || !parse_hostport(v, host, sizeof(host), &port)) {
		snprintf(why, wlen, "must be HOST:PORT (a name, an IPv4 address or [IPv6])");
		return false;
	}
	if (!numeric_addr(host, port, &c->relay_ss, &c->relay_sslen)) {
		if (!host_name_ok(host)) {
			snprintf(why, wlen, "\"%s\" is neither a numeric address nor a host name", host);
			return false;
		}
		if (!LK_API_HAS(api, resolve)) {
			snprintf(why, wlen, "this lokadb cannot resolve names for plugins (ABI 1.6): use an address");
			return false;
		}
		c->relay_is_name = true;
	}
	snprintf(c->relay_host, sizeof(c->relay_host), "%s", host);
	c->relay_port = port;
	snprintf(c->relay, sizeof(c->relay), "%s", v);
	*bad_key = "site";
	v = api->config_get(ev, "site");
	if (!v || !*v || strlen(v) > MUX_NAME_MAX) {
		snprintf(why, wlen, "must name this site (1..%d characters)", MUX_NAME_MAX);
		return false;
	}
	snprintf(c->site, sizeof(c->site), "%s", v);
	*bad_key = "token";
	v = api->config_get(ev, "token");
	if (!v || strlen(v) < 16 || strlen(v) >= sizeof(c->token)) {
		snprintf(why, wlen, "must be the site's token (16..255 characters)");
		return false;
	}
	snprintf(c->token, sizeof(c->token), "%s", v);
	*bad_key = "relay_pin";
	v = api->config_get(ev, "relay_pin");
	if (v && *v) {
		const char *p = v;
		if (strncmp(p, "sha256:", 7) == 0)
			p += 7;
		if (!tlink_hex32(p, strlen(p), c->pin)) {
			snprintf(why, wlen, "must be the SHA-256 of the relay's public key (SPKI), 64 hex digits");
			return false;
		}
		c->has_pin = true;
	}
	v = api->config_get(ev, "relay_ca");
	snprintf(c->relay_ca, sizeof(c->relay_ca), "%s", v ? v : "");
	if (!c->has_pin && !c->relay_ca[0]) {
		*bad_key = "relay_ca";
		snprintf(why, wlen, "set relay_ca or relay_pin: the agent must check the relay's key");
		return false;
	}
	v = api->config_get(ev, "relay_name");
	snprintf(c->relay_name, sizeof(c->relay_name), "%s", v ? v : "");
	*bad_key = "databases";
	if (!parse_dbs(api->config_get(ev, "databases"), &c->dbs, &c->n_dbs, why, wlen))
		return false;
	*bad_key = "max_conns";
	v = api->config_get(ev, "max_conns");
	mc = strtol(v ? v : "", &end, 10);
	if (!v || !*v || *end || mc < 1 || mc > MUX_MAX_STREAMS_CAP) {
		free(c->dbs);
		c->dbs = NULL;
		snprintf(why, wlen, "must be a number 1..%d", MUX_MAX_STREAMS_CAP);
		return false;
	}
	c->max_conns = (unsigned)mc;
	return true;
}

static SSL_CTX *make_ctx(const struct conf *c, char *why, size_t wlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

	if (!ctx) {
		snprintf(why, wlen, "SSL_CTX_new failed");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	SSL_CTX_set_num_tickets(ctx, 0);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	if (c->relay_ca[0]) {
		if (SSL_CTX_load_verify_locations(ctx, c->relay_ca, NULL) != 1) {
			snprintf(why, wlen, "cannot load %.150s: %s", c->relay_ca, ERR_reason_error_string(ERR_get_error()));
			ERR_clear_error();
			SSL_CTX_free(ctx);
			return NULL;
		}
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);	/* the pin decides */
	}
	return ctx;
}

/* ================= sessions ================= */

static void schedule_dial(uint64_t delay_ms);

static void stream_free(struct stream *st)
{
	for (struct stream **pp = &A.streams; *pp; pp = &(*pp)->next)
		if (*pp == st) {
			*pp = st->next;
			break;
		}
	tlink_stream_close(&st->ts, MUX_E_CANCEL);
	if (st->head)
		evbuffer_free(st->head);
	A.n_streams--;
	free(st);
	/* no stream points into an old allow-list any more */
	while (A.n_streams == 0 && A.retired) {
		struct retired_dbs *r = A.retired;

		A.retired = r->next;
		free(r->dbs);
		free(r);
	}
}

/* ---- the database side ---- */

static void db_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct stream *st = arg;
	struct tlink *l = st->ts.l;	/* st may be freed by a reset below */

	(void)bev;
	if (st->in_connect) {
		if (!(what & BEV_EVENT_CONNECTED))
			st->connect_failed = true;
		return;
	}
	if (l->dying)
		return;
	if (st->ts.ready) {
		tlink_stream_event(&st->ts, what);
		return;
	}
	if (what & BEV_EVENT_CONNECTED) {
		tlink_nodelay(bufferevent_getfd(st->ts.bev));
		st->ts.ready = true;
		mux_open_ack(l->s, st->ts.id, 0);
		mux_resume(l->s, st->ts.id);
	} else {
		api->log(me, LK_LOG_WARNING, "agent: cannot connect to database \"%s\" (%s:%d): %s", st->t->key,
			 st->t->host, st->t->port, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		mux_reset(l->s, st->ts.id, MUX_E_TARGET_UNREACHABLE);
	}
	tlink_flush(l);
}

/* ---- mux callbacks ---- */

static void on_hello_ack(struct mux_session *s, const struct mux_hello *ack, void *ud)
{
	struct session *x = ud;

	(void)s;
	(void)ack;
	x->link.established = true;
	x->since = time(NULL);
	A.attempts = 0;
	if (A.cur && A.cur != x && !A.cur->link.dying) {
		/* the old session drains */
		mux_goaway(A.cur->link.s, MUX_NO_ERROR, 0, "replaced by a newer session");
		tlink_flush(&A.cur->link);
	}
	A.cur = x;
	A.last_error[0] = '\0';
	api->log(me, LK_LOG_INFO, "agent: connected to relay %s as site \"%s\"", A.c.relay, A.c.site);
}

static uint32_t on_open(struct mux_session *s, uint32_t id, const struct mux_open *op, void **sud, void *ud)
{
	struct session *x = ud;
	const struct target *t = NULL;
	struct stream *st;

	(void)s;
	for (int i = 0; i < A.c.n_dbs; i++)
		if (strcmp(A.c.dbs[i].key, op->db_key) == 0)
			t = &A.c.dbs[i];
	if (!t) {
		A.refused++;
		api->log(me, LK_LOG_WARNING, "agent: relay asked for database \"%s\", which is not in databases",
			 op->db_key);
		return MUX_E_NO_SUCH_TARGET;
	}
	if (A.n_streams >= A.c.max_conns) {
		A.refused++;
		api->log(me, LK_LOG_WARNING, "agent: stream for \"%s\" refused: max_conns (%u) reached", op->db_key,
			 A.c.max_conns);
		return MUX_E_STREAM_LIMIT;
	}
	st = calloc(1, sizeof(*st));
	if (st)
		st->ts.bev = bufferevent_socket_new(api->event_base(), -1, BEV_OPT_CLOSE_ON_FREE);
	if (!st || !st->ts.bev) {
		free(st);
		return MUX_E_INTERNAL;
	}
	st->ss = x;
	st->ts.l = &x->link;
	st->ts.id = id;
	st->t = t;
	tlink_stream_attach(&st->ts, db_event_cb);
	st->in_connect = true;
	if (bufferevent_socket_connect(st->ts.bev, (struct sockaddr *)&t->ss, t->sslen) != 0 || st->connect_failed) {
		api->log(me, LK_LOG_WARNING, "agent: cannot connect to database \"%s\" (%s:%d): %s", t->key, t->host,
			 t->port, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		bufferevent_free(st->ts.bev);
		free(st);
		return MUX_E_TARGET_UNREACHABLE;
	}
	st->in_connect = false;
	A.n_streams++;
	st->next = A.streams;
	A.streams = st;
	*sud = st;
	return MUX_NO_ERROR;
}

#define STARTUP_MAX 10000		/* as PostgreSQL: the largest startup packet */
#define PROTO_V3 196608u
#define CANCEL_CODE 80877102u

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/*
 * The first packet of a stream, whole: a v3 StartupMessage whose database is
 * the allow-list entry's dbname, or a CancelRequest. Anything else is refused:
 * the allow-list names the database, not just the address.
 */
static bool first_packet_ok(const struct stream *st, const uint8_t *p, size_t len)
{
	uint32_t code = be32(p + 4);

	if (code == CANCEL_CODE)
		return len == 16;
	if (code != PROTO_V3)
		return false;
	for (size_t i = 8; i < len && p[i];) {
		const char *k = (const char *)p + i, *v;
		size_t kl = strnlen(k, len - i);

		if (i + kl + 1 >= len)
			return false;
		v = k + kl + 1;
		if (strnlen(v, len - (i + kl + 1)) == len - (i + kl + 1))
			return false;
		if (strcmp(k, "database") == 0)
			return strcmp(v, st->t->dbname) == 0;
		i += kl + 1 + strlen(v) + 1;
	}
	return false;
}

/* Hold bytes until the first packet is whole and checked. 1: pass on, 0: wait, -1: refuse. */
static int check_first(struct stream *st, const uint8_t *data, size_t len)
{
	uint8_t hdr[8], *pkt;
	uint32_t plen;
	size_t have;
	bool ok;

	if (!st->head && !(st->head = evbuffer_new()))
		return -1;
	if (evbuffer_add(st->head, data, len) != 0)
		return -1;
	have = evbuffer_get_length(st->head);
	if (have < 8)
		return 0;
	evbuffer_copyout(st->head, hdr, 8);
	plen = be32(hdr);
	if (plen < 8 || plen > STARTUP_MAX)
		return -1;
	if (have < plen)
		return 0;
	pkt = evbuffer_pullup(st->head, (ev_ssize_t)plen);
	ok = pkt && first_packet_ok(st, pkt, plen);
	if (!ok)
		return -1;
	st->checked = true;
	return 1;
}

static void on_data(struct mux_session *s, uint32_t id, const uint8_t *data, size_t len, void *sud, void *ud)
{
	struct stream *st = sud;

	(void)id;
	(void)ud;
	if (!st->checked) {
		int r;

		st->ts.l->bytes_in += (long long)len;
		st->ts.bytes_in += (long long)len;
		r = check_first(st, data, len);

		if (r < 0) {
			A.refused++;
			api->log(me, LK_LOG_WARNING,
				 "agent: stream for \"%s\" refused: its first packet is not a startup for database \"%s\" or a cancel request",
				 st->t->key, st->t->dbname);
			mux_stream_consumed(s, st->ts.id, len);
			mux_reset(s, st->ts.id, MUX_E_UNAUTHORIZED);
			return;
		}
		if (r == 0)
			return;		/* credited once written onward */
		if (!st->ts.bev || bufferevent_write_buffer(st->ts.bev, st->head) != 0) {
			mux_reset(s, st->ts.id, MUX_E_INTERNAL);
			return;
		}
		evbuffer_free(st->head);
		st->head = NULL;
		return;
	}
	tlink_stream_data(&st->ts, data, len);
}

static void on_stream_close(struct mux_session *s, uint32_t id, uint32_t code, bool by_peer, bool retryable,
			    void *sud, void *ud)
{
	struct stream *st = sud;

	(void)s;
	(void)id;
	(void)by_peer;
	(void)retryable;
	(void)ud;
	if (!st)
		return;
	tlink_stream_close(&st->ts, code);
	stream_free(st);
}

static void on_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms,
		      const char *debug, size_t dlen, void *ud)
{
	struct session *x = ud;

	(void)s;
	(void)last;
	if (code == MUX_E_UNAUTHORIZED) {
		snprintf(A.last_error, sizeof(A.last_error), "the relay refused the token of site \"%s\"", A.c.site);
		api->log(me, LK_LOG_ERROR, "agent: %s", A.last_error);
		x->link.close_when_flushed = true;
		return;
	}
	api->log(me, LK_LOG_INFO, "agent: the relay is going away (%s %.*s); dialing a new session",
		 mux_error_name(code), (int)dlen, debug);
	if (A.cur == x)
		A.cur = NULL;
	if (mux_stream_count(x->link.s) == 0)
		x->link.close_when_flushed = true;
	A.attempts = 0;		/* no backoff: the relay asked for a new session */
	if (A.redial)
		evtimer_del(A.redial);
	schedule_dial(reconnect_ms);
}

static void on_ping_ack(struct mux_session *s, uint64_t rtt, void *ud)
{
	(void)s;
	(void)ud;
	A.rtt_ms = (long long)rtt;
}

static void on_session_error(struct mux_session *s, uint32_t code, const char *msg, void *ud)
{
	struct session *x = ud;

	(void)s;
	snprintf(A.last_error, sizeof(A.last_error), "session failed: %s: %s", mux_error_name(code), msg ? msg : "");
	api->log(me, LK_LOG_WARNING, "agent: %s", A.last_error);
	x->link.close_when_flushed = true;
}

static const struct mux_callbacks agent_cb = {
	.on_hello_ack = on_hello_ack,
	.on_open = on_open,
	.on_data = on_data,
	.on_fin = tlink_cb_fin,
	.on_stream_close = on_stream_close,
	.on_goaway = on_goaway,
	.on_ping_ack = on_ping_ack,
	.on_session_error = on_session_error,
	.read_data = tlink_cb_read,
};

/* ---- the TLS connection to the relay ---- */

static uint64_t backoff_ms(void)
{
	uint64_t cap = BACKOFF_BASE_MS;
	uint32_t r = 0;

	for (unsigned i = 0; i < A.attempts && cap < BACKOFF_CAP_MS; i++)
		cap *= 2;
	if (cap > BACKOFF_CAP_MS)
		cap = BACKOFF_CAP_MS;
	A.attempts++;
	RAND_bytes((unsigned char *)&r, sizeof(r));
	return r % (cap + 1);	/* full jitter */
}

static void session_reaped(struct tlink *l)
{
	struct session *x = TLINK_OWNER(l, struct session, link);
	bool was_cur = A.cur == x;

	for (struct session **pp = &A.sessions; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	A.bytes_in += l->bytes_in;
	A.bytes_out += l->bytes_out;
	free(x);
	if (was_cur)
		A.cur = NULL;
	if (!A.cur && A.configured && !evtimer_pending(A.redial, NULL)) {
		bool dialing = false;
		for (struct session *y = A.sessions; y; y = y->next)
			if (!y->link.dying && !mux_going_away(y->link.s))
				dialing = true;
		if (!dialing)
			schedule_dial(backoff_ms());
	}
}

static void session_killed(struct tlink *l, const char *why)
{
	struct session *x = TLINK_OWNER(l, struct session, link);

	if (A.cur == x)
		A.cur = NULL;
	if (!*why)
		return;
	if (l->established)
		api->log(me, LK_LOG_WARNING, "agent: lost the relay %s: %s", A.c.relay, why);
	if (!l->established || !A.last_error[0])
		snprintf(A.last_error, sizeof(A.last_error), "%s", why);
}

/* An old session that went away closes once its last stream is done. */
static void session_flushed(struct tlink *l)
{
	struct session *x = TLINK_OWNER(l, struct session, link);

	if (!l->close_when_flushed && mux_going_away(l->s) && A.cur != x && mux_stream_count(l->s) == 0 &&
	    l->established)
		l->close_when_flushed = true;
}

static const struct tlink_ops session_ops = {
	.now_ms = now_ms,
	.killed = session_killed,
	.reaped = session_reaped,
	.flushed = session_flushed,
};

static bool check_pin(struct session *x, char *why, size_t wlen)
{
	SSL *ssl = bufferevent_openssl_get_ssl(x->link.bev);
	X509 *cert = ssl ? SSL_get0_peer_certificate(ssl) : NULL;
	unsigned char *der = NULL, md[32];
	int len;

	if (!A.c.has_pin)
		return true;
	if (!cert) {
		snprintf(why, wlen, "the relay sent no certificate");
		return false;
	}
	len = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(cert), &der);
	if (len <= 0) {
		snprintf(why, wlen, "cannot read the relay's public key");
		return false;
	}
	SHA256(der, (size_t)len, md);
	OPENSSL_free(der);
	if (CRYPTO_memcmp(md, A.c.pin, 32) != 0) {
		snprintf(why, wlen, "the relay's public key does not match relay_pin");
		return false;
	}
	return true;
}

static void session_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct session *x = TLINK_OWNER(arg, struct session, link);
	char why[256] = "the relay closed the connection";

	if (what & BEV_EVENT_CONNECTED) {
		uint8_t ekm[32], key[32], proof[EVP_MAX_MD_SIZE];
		unsigned plen = 0;

		tlink_nodelay(bufferevent_getfd(bev));
		if (!check_pin(x, why, sizeof(why))) {
			api->log(me, LK_LOG_ERROR, "agent: %s", why);
			tlink_kill(&x->link, why);
			return;
		}
		if (!tlink_exporter(&x->link, ekm)) {
			tlink_kill(&x->link, "TLS exporter failed");
			return;
		}
		SHA256((const unsigned char *)A.c.token, strlen(A.c.token), key);
		HMAC(EVP_sha256(), key, sizeof(key), ekm, sizeof(ekm), proof, &plen);
		OPENSSL_cleanse(key, sizeof(key));
		x->link.tls_up = true;
		if (!mux_hello(x->link.s, A.c.site, proof, TLINK_PROOF_LEN, now_ms())) {
			tlink_kill(&x->link, "cannot build HELLO");
			return;
		}
		tlink_flush(&x->link);
		return;
	}
	{
		char buf[200] = "";
		bool tls = tlink_event_text(bev, what, buf, sizeof(buf));

		if (tls) {
			snprintf(why, sizeof(why), "TLS with the relay failed: %s", buf);
			if (!x->link.established)
				api->log(me, LK_LOG_WARNING, "agent: %s", why);
		} else if (buf[0]) {
			snprintf(why, sizeof(why), "relay %s: %s", A.c.relay, buf);
		} else if (!x->link.tls_up) {
			snprintf(why, sizeof(why), "cannot connect to relay %s", A.c.relay);
		}
	}
	tlink_kill(&x->link, why);
}

static void session_tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct session *x = TLINK_OWNER(arg, struct session, link);
	uint64_t now = now_ms(), next;

	(void)fd;
	(void)what;
	if (x->link.dying)
		return;
	if (!x->link.established && now - x->link.started_ms > CONNECT_DEADLINE_MS) {
		tlink_kill(&x->link, "the relay did not answer in time");
		return;
	}
	next = x->link.tls_up ? mux_tick(x->link.s, now) : now + 1000;
	if (next > now + 1000)
		next = now + 1000;
	tlink_arm(&x->link, now, next);
	tlink_flush(&x->link);
}

/* Open a session to the relay at sa. */
static void dial_to(const struct sockaddr *sa, int salen)
{
	struct session *x;
	SSL *ssl;

	x = calloc(1, sizeof(*x));
	ssl = x ? SSL_new(A.ctx) : NULL;
	if (!ssl) {
		free(x);
		schedule_dial(backoff_ms());
		return;
	}
	if (A.c.relay_name[0] || A.c.relay_is_name) {
		const char *name = A.c.relay_name[0] ? A.c.relay_name : A.c.relay_host;

		SSL_set_tlsext_host_name(ssl, name);
		if (A.c.relay_ca[0])
			SSL_set1_host(ssl, name);
	} else if (A.c.relay_ca[0]) {
		X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), A.c.relay_host);
	}
	A.reconnects++;
	if (!tlink_open(&x->link, api->event_base(), ssl, -1, BUFFEREVENT_SSL_CONNECTING, MUX_ROLE_AGENT, &A.settings,
			&agent_cb, x, &session_ops, session_tick_cb)) {
		free(x);
		schedule_dial(backoff_ms());
		return;
	}
	x->next = A.sessions;
	A.sessions = x;
	tlink_start(&x->link, session_event_cb);
	if (bufferevent_socket_connect(x->link.bev, (struct sockaddr *)sa, salen) != 0) {
		snprintf(A.last_error, sizeof(A.last_error), "cannot connect to relay %s", A.c.relay);
		tlink_kill(&x->link, "");
		return;
	}
	session_tick_cb(-1, 0, &x->link);
}

/* The answer for the relay's name (api->resolve). */
static void relay_resolved(lk_plugin *self, void *arg, const struct sockaddr *sa, int len, const char *error)
{
	(void)self;
	(void)arg;
	A.resolving = false;
	if (!A.configured || !A.ctx || A.shutting_down)
		return;
	if (!sa) {
		snprintf(A.last_error, sizeof(A.last_error), "cannot resolve relay %s: %s", A.c.relay_host, error);
		api->log(me, LK_LOG_WARNING, "agent: %s", A.last_error);
		schedule_dial(backoff_ms());
		return;
	}
	dial_to(sa, len);
}

static void dial(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	if (!A.configured || !A.ctx || A.resolving)
		return;
	if (!A.c.relay_is_name) {
		dial_to((struct sockaddr *)&A.c.relay_ss, A.c.relay_sslen);
		return;
	}
	A.resolving = true;
	if (api->resolve(me, A.c.relay_host, A.c.relay_port, relay_resolved, &A) != 0) {
		A.resolving = false;
		snprintf(A.last_error, sizeof(A.last_error), "cannot resolve relay %s", A.c.relay_host);
		schedule_dial(backoff_ms());
	}
}

static void schedule_dial(uint64_t delay_ms)
{
	struct timeval tv = { (time_t)(delay_ms / 1000), (suseconds_t)(delay_ms % 1000 * 1000) };

	if (!A.redial || evtimer_pending(A.redial, NULL) || A.shutting_down)
		return;
	A.next_dial_ms = now_ms() + delay_ms;
	evtimer_add(A.redial, &tv);
}

/* ================= config ================= */

static int on_config_check(lk_plugin *self, lk_event *ev)
{
	struct conf c;
	const char *key;
	char why[256];
	SSL_CTX *ctx;

	(void)self;
	if (!parse_conf(ev, &c, &key, why, sizeof(why)))
		return api->config_error(ev, key, "%s", why);
	ctx = make_ctx(&c, why, sizeof(why));
	free(c.dbs);
	if (!ctx)
		return api->config_error(ev, "relay_ca", "%s", why);
	SSL_CTX_free(ctx);
	return LK_CONTINUE;
}

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	struct conf c;
	const char *key;
	char why[256];
	SSL_CTX *ctx;
	bool redial;

	(void)self;
	if (!A.redial)
		A.redial = evtimer_new(api->event_base(), dial, NULL);	/* the loop exists from now on */
	if (!parse_conf(ev, &c, &key, why, sizeof(why)))
		return LK_CONTINUE;
	ctx = make_ctx(&c, why, sizeof(why));
	if (!ctx) {
		free(c.dbs);
		return LK_CONTINUE;
	}
	redial = !A.configured || strcmp(c.relay, A.c.relay) != 0 || strcmp(c.site, A.c.site) != 0 ||
		 strcmp(c.token, A.c.token) != 0 || strcmp(c.relay_ca, A.c.relay_ca) != 0 ||
		 c.has_pin != A.c.has_pin || memcmp(c.pin, A.c.pin, 32) != 0;
	/* streams keep pointers into the old allow-list: keep it while they live */
	if (A.n_streams == 0) {
		free(A.c.dbs);
	} else if (A.c.dbs) {
		struct retired_dbs *r = malloc(sizeof(*r));

		if (r) {
			r->dbs = A.c.dbs;
			r->next = A.retired;
			A.retired = r;
		}	/* else it stays allocated: a stream may still use it */
	}
	A.c = c;
	if (A.ctx)
		SSL_CTX_free(A.ctx);
	A.ctx = ctx;
	A.configured = true;
	if (redial) {
		for (struct session *x = A.sessions; x; x = x->next)
			if (!x->link.dying) {
				if (x->link.established)
					mux_goaway(x->link.s, MUX_NO_ERROR, 0, "agent reconfigured");
				x->link.close_when_flushed = !x->link.established || mux_stream_count(x->link.s) == 0;
				tlink_flush(&x->link);
			}
		A.cur = NULL;
		A.attempts = 0;
		if (A.resolving)
			api->resolve_cancel(me, &A);	/* a name of the old relay */
		A.resolving = false;
		if (A.redial)
			evtimer_del(A.redial);
		schedule_dial(0);
	}
	return LK_CONTINUE;
}

/* ================= shutdown ================= */

/*
 * The process is shutting down: dial no more, and tell the relay (GOAWAY
 * naming the last stream we accepted) so it opens no new stream here and
 * its clients learn at once that the site has no agent; the streams open
 * go on until the process exits.
 */
static int on_shutdown(lk_plugin *self, lk_event *ev)
{
	(void)self;
	(void)ev;
	A.shutting_down = true;
	A.cur = NULL;
	if (A.redial)
		evtimer_del(A.redial);
	if (A.resolving)
		api->resolve_cancel(me, &A);
	A.resolving = false;
	for (struct session *x = A.sessions; x; x = x->next) {
		if (x->link.dying)
			continue;
		if (x->link.established)
			mux_goaway(x->link.s, MUX_NO_ERROR, 0, "the agent is shutting down");
		if (!x->link.established || mux_stream_count(x->link.s) == 0)
			x->link.close_when_flushed = true;
		tlink_flush(&x->link);
	}
	return LK_CONTINUE;
}

/* ================= console ================= */

/* Stream bytes from (in) or to the relay over every session, live or gone. */
static long long agent_bytes(bool in)
{
	long long n = in ? A.bytes_in : A.bytes_out;

	for (struct session *x = A.sessions; x; x = x->next)
		n += in ? x->link.bytes_in : x->link.bytes_out;
	return n;
}

static int cmd_agent(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "relay", "site", "state", "connected_since", "streams",
					     "bytes_in", "bytes_out", "rtt_ms", "dials", "refused", "last_error" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT8,
					  LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8,
					  LK_TYPE_TEXT };
	char since[32] = "", b[6][24];
	const char *row[11], *state = "backoff";
	struct tm tm;

	(void)self;
	(void)args;
	if (A.cur && A.cur->link.established) {
		state = "connected";
		gmtime_r(&A.cur->since, &tm);
		strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &tm);
	} else if (A.resolving) {
		state = "resolving";
	} else {
		for (struct session *x = A.sessions; x; x = x->next)
			if (!x->link.dying && !x->link.established)
				state = "connecting";
	}
	snprintf(b[0], 24, "%u", A.n_streams);
	snprintf(b[1], 24, "%lld", agent_bytes(true));
	snprintf(b[2], 24, "%lld", agent_bytes(false));
	snprintf(b[3], 24, "%lld", A.rtt_ms);
	snprintf(b[4], 24, "%lld", A.reconnects);
	snprintf(b[5], 24, "%lld", A.refused);
	row[0] = A.c.relay;
	row[1] = A.c.site;
	row[2] = state;
	row[3] = since[0] ? since : NULL;
	row[4] = b[0];
	row[5] = b[1];
	row[6] = b[2];
	row[7] = b[3];
	row[8] = b[4];
	row[9] = b[5];
	row[10] = A.last_error[0] ? A.last_error : NULL;
	api->result_columns(res, 11, names, types);
	api->result_row(res, row);
	return LK_HANDLED;
}

/* ================= metrics ================= */

static void metric_value(lk_plugin *self, lk_metrics *m, void *arg)
{
	double v = 0;

	(void)self;
	switch ((int)(intptr_t)arg) {
	case 0: v = A.cur && A.cur->link.established ? 1 : 0; break;
	case 1: v = A.n_streams; break;
	case 2: v = (double)A.reconnects; break;
	case 3: v = (double)agent_bytes(true); break;
	case 4: v = (double)agent_bytes(false); break;
	case 5: v = (double)A.refused; break;
	}
	api->metric_sample(m, NULL, v);
}

/* ================= init ================= */

static int agent_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	me = self;
	tlink_settings(&A.settings);
	if (a->hook(self, LK_HOOK_CONFIG_CHECK, on_config_check, 0) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0 ||
	    a->config_declare(self, "relay", "", "HOST:PORT of the relay (a name is resolved before each dial)") != 0 ||
	    a->config_declare(self, "site", "", "this site's name at the relay") != 0 ||
	    a->config_declare(self, "token", "", "this site's token (the relay keeps its SHA-256)") != 0 ||
	    a->config_declare(self, "relay_ca", "", "CA file that signed the relay's certificate") != 0 ||
	    a->config_declare(self, "relay_pin", "", "SHA-256 (hex) of the relay's public key (SPKI DER)") != 0 ||
	    a->config_declare(self, "relay_name", "", "host name checked in the relay's certificate (and sent as SNI)") != 0 ||
	    a->config_declare(self, "databases", "",
			      "allow-list: KEY:host=ADDRESS port=PORT dbname=NAME, ...") != 0 ||
	    a->config_declare(self, "max_conns", "100", "most database connections served at once") != 0 ||
	    a->console_register(self, "SHOW AGENT", 0, cmd_agent, "the agent's session with the relay") != 0) {
		a->init_error(self, "registration failed");
		return -1;
	}
	if (a->hook(self, LK_HOOK_SHUTDOWN, on_shutdown, 0) != 0)
		a->log(self, LK_LOG_WARNING, "agent: this lokadb has no SHUTDOWN hook (ABI 1.6): no GOAWAY at shutdown");
	if (LK_API_HAS(a, metric_register)) {
		static const struct { const char *name; int type; const char *help; } mt[] = {
			{ "connected", LK_METRIC_GAUGE, "1 while a session with the relay is established" },
			{ "streams", LK_METRIC_GAUGE, "database connections served now" },
			{ "dials", LK_METRIC_COUNTER, "connections to the relay attempted" },
			{ "received_bytes", LK_METRIC_COUNTER, "stream bytes from the relay" },
			{ "sent_bytes", LK_METRIC_COUNTER, "stream bytes to the relay" },
			{ "refused", LK_METRIC_COUNTER, "streams refused" },
		};
		for (size_t i = 0; i < sizeof(mt) / sizeof(mt[0]); i++)
			if (a->metric_register(self, mt[i].name, mt[i].type, mt[i].help, metric_value,
					       (void *)(intptr_t)i) != 0) {
				a->init_error(self, "metric registration failed");
				return -1;
			}
	}
	return 0;
}

static void agent_fini(lk_plugin *self)
{
	(void)self;
}

LK_PLUGIN("agent", "0.1.0", agent_init, agent_fini)
