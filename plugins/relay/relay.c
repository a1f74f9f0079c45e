/* SPDX-License-Identifier: ISC */
/*
 * relay -- the cloud end of the tunnel (doc/tunnel.md).
 *
 * Listens for agents over TLS 1.3, checks each agent's credential (the
 * site's token, proven with an HMAC over the TLS exporter so a captured
 * proof is worth nothing on another connection), and registers the
 * transport `tunnel`: a [databases] entry with `transport=tunnel
 * site=SITE dbname=DB` (host= is an alias) has each server connection (and each cancel
 * request) carried by one stream of SITE's agent session, db_key = DB.
 * The core gets one end of a socketpair; the other end is pumped to and
 * from the stream, with credit returned only for bytes written onward.
 *
 * Settings [plugin.relay]: listen, cert_file, key_file, sites, max_streams,
 * site_min_streams (fair_share()), so_reuseport. A shutdown drains (on_shutdown): agents are told to
 * reconnect at once (to the new process of a rolling restart), streams
 * still open are reset after DRAIN_MS. An agent session that says GOAWAY
 * keeps its streams, but their server connections are retired (on_goaway).
 * Console: SHOW AGENTS, SHOW STREAMS.
 */
#include <lokadb/plugin.h>

#include "link.h"

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

#define HELLO_DEADLINE_MS 10000
#define MAX_SITES 1024
#define MAX_HANDSHAKES 128		/* connections not yet authenticated */
#define DRAIN_MS 5000			/* a shutdown resets the streams still open after this */

static const lk_api *api;
static lk_plugin *me;

struct site {
	char name[MUX_NAME_MAX + 1];
	uint8_t hash[32];		/* SHA-256 of the token */
	unsigned mark;			/* fair_share(): counted in pass `mark` */
	unsigned streams;		/* fair_share(): its streams in that pass */
};

struct agent {
	struct tlink link;		/* TLS connection and mux session */
	struct site *site;		/* once authenticated */
	char site_name[MUX_NAME_MAX + 1];
	char addr[64];
	time_t since;			/* wall clock of the HELLO_ACK */
	long long rtt_ms;
	unsigned n_streams;
	struct agent *next;
};

struct stream {
	struct tlink_stream ts;		/* first (tlink_cb_*): our end of the core's socketpair */
	struct agent *a;
	lk_connect *req;		/* until OPEN_ACK or failure */
	int core_fd;			/* the core's end, until handed over */
	bool is_cancel;
	uint64_t server_id;		/* the core's server connection it carries (0: a cancel) */
	char db[MUX_NAME_MAX + 1];
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
	long long refused_auth, refused_streams, refused_handshakes, refused_share;
	unsigned min_share;		/* site_min_streams */
	unsigned pass;			/* fair_share() pass number */
	struct mux_settings settings;
	bool reuseport;			/* so_reuseport: a rolling restart binds listen again */
	bool draining;			/* the process is shutting down */
	lk_timer *drain_timer;
} R;

static uint64_t now_ms(void)
{
	return api->now_usec() / 1000u;
}

/* ================= settings ================= */

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
		if (!tlink_hex32(colon + 1, 64, arr[n].hash)) {
			snprintf(why, wlen, "site \"%s\": the token hash must be 64 hex digits (SHA-256)", arr[n].name);
			goto bad;
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

static bool parse_bool(const char *v, bool *out)
{
	if (!v || (strcmp(v, "0") != 0 && strcmp(v, "1") != 0))
		return false;
	*out = v[0] == '1';
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
	/* an idle agent keeps no read/write buffers (about 34 KiB each): 1000 agents in a few MB less */
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
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
	tlink_stream_close(&st->ts, MUX_E_CANCEL);
	if (st->core_fd >= 0)
		close(st->core_fd);
	R.n_streams--;
	if (st->a)
		st->a->n_streams--;
	free(st);
}

/* ---- the core's end ---- */

static void pair_event_cb(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	tlink_stream_event(&((struct stream *)arg)->ts, what);
}

/* ---- mux callbacks ---- */

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
	if (!site || h->proof_len != TLINK_PROOF_LEN || !tlink_exporter(&a->link, ekm) ||
	    !HMAC(EVP_sha256(), site->hash, 32, ekm, sizeof(ekm), want, &wlen) ||
	    CRYPTO_memcmp(want, h->proof, TLINK_PROOF_LEN) != 0) {
		R.refused_auth++;
		api->log(me, LK_LOG_WARNING, "relay: agent %s refused: %s for site \"%s\"", a->addr,
			 site ? "bad token" : "unknown site", h->agent_id);
		mux_goaway(s, MUX_E_UNAUTHORIZED, 0, "bad credential");
		a->link.close_when_flushed = true;
		return;
	}
	RAND_bytes(sid, sizeof(sid));
	if (!mux_accept(s, sid, (uint64_t)time(NULL) * 1000u)) {
		tlink_kill(&a->link, "cannot accept");
		return;
	}
	a->site = site;
	a->link.established = true;
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
	tlink_stream_close(&st->ts, code);
	stream_free(st);
}

static void on_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms,
		      const char *debug, size_t dlen, void *ud)
{
	struct agent *a = ud;
	char why[128];
	unsigned closed = 0, marked = 0;

	(void)s;
	(void)last;
	(void)reconnect_ms;
	api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" (%s) is going away: %s %.*s", a->site_name, a->addr,
		 mux_error_name(code), (int)dlen, debug);
	/*
	 * Its streams go on, but the pool must not hand their server
	 * connections to new transactions: idle ones close now, busy ones when
	 * released, and the pool opens new ones over the site's other session
	 * (a reconnected or redundant agent) or fails them at once if it has none.
	 */
	if (!LK_API_HAS(api, server_retire))
		return;
	snprintf(why, sizeof(why), "the tunnel agent of site \"%s\" is going away", a->site_name);
	for (struct stream *st = R.streams; st; st = st->next) {
		if (st->a != a || !st->server_id)
			continue;
		int r = api->server_retire(st->server_id, why);
		closed += r == 1;
		marked += r == 0;
	}
	if (closed || marked)
		api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" (%s): %u idle server connection%s over it closed, "
			 "%u to close when released", a->site_name, a->addr, closed, closed == 1 ? "" : "s", marked);
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
	a->link.close_when_flushed = true;
}

static const struct mux_callbacks relay_cb = {
	.on_hello = on_hello,
	.on_open_ack = on_open_ack,
	.on_data = tlink_cb_data,
	.on_fin = tlink_cb_fin,
	.on_stream_close = on_stream_close,
	.on_goaway = on_goaway,
	.on_ping_ack = on_ping_ack,
	.on_session_error = on_session_error,
	.read_data = tlink_cb_read,
};

/* ---- the TLS connection ---- */

static void agent_killed(struct tlink *l, const char *why)
{
	struct agent *a = TLINK_OWNER(l, struct agent, link);

	if (l->established)
		api->log(me, LK_LOG_INFO, "relay: agent of site \"%s\" (%s) disconnected: %s", a->site_name,
			 a->addr, why[0] ? why : "closed");
}

static void agent_reaped(struct tlink *l)
{
	struct agent *a = TLINK_OWNER(l, struct agent, link);

	for (struct agent **pp = &R.agents; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	free(a);
}

/* While the relay drains, a session whose last stream closed goes at once. */
static void agent_flushed(struct tlink *l)
{
	if (R.draining && mux_stream_count(l->s) == 0)
		l->close_when_flushed = true;
}

static const struct tlink_ops agent_ops = {
	.now_ms = now_ms,
	.killed = agent_killed,
	.reaped = agent_reaped,
	.flushed = agent_flushed,
};

static void agent_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct agent *a = TLINK_OWNER(arg, struct agent, link);
	char why[160] = "connection closed";

	if (what & BEV_EVENT_CONNECTED)
		return;
	if (tlink_event_text(bev, what, why, sizeof(why)) && !a->link.established)
		api->log(me, LK_LOG_WARNING, "relay: TLS with %s failed: %s", a->addr, why);
	tlink_kill(&a->link, why);
}

static void agent_tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *a = TLINK_OWNER(arg, struct agent, link);
	uint64_t now = now_ms(), next;

	(void)fd;
	(void)what;
	if (a->link.dying)
		return;
	if (!a->link.established && now - a->link.started_ms > HELLO_DEADLINE_MS) {
		api->log(me, LK_LOG_WARNING, "relay: %s sent no valid HELLO within %d s", a->addr,
			 HELLO_DEADLINE_MS / 1000);
		tlink_kill(&a->link, "no HELLO");
		return;
	}
	next = mux_tick(a->link.s, now);
	if (!a->link.established && next > a->link.started_ms + HELLO_DEADLINE_MS + 1)
		next = a->link.started_ms + HELLO_DEADLINE_MS + 1;
	tlink_arm(&a->link, now, next);
	tlink_flush(&a->link);
}

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct agent *a;
	SSL *ssl;
	char host[INET6_ADDRSTRLEN] = "?", port[8] = "0";
	int pending = 0;

	(void)lis;
	(void)arg;
	getnameinfo(sa, (socklen_t)salen, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
	for (struct agent *x = R.agents; x; x = x->next)
		pending += !x->link.established && !x->link.dying;
	if (pending >= MAX_HANDSHAKES) {
		R.refused_handshakes++;
		if (R.refused_handshakes == 1 || R.refused_handshakes % 1000 == 0)
			api->log(me, LK_LOG_WARNING, "relay: connection from %s:%s closed: %d handshakes in progress",
				 host, port, MAX_HANDSHAKES);
		evutil_closesocket(fd);
		return;
	}
	a = calloc(1, sizeof(*a));
	ssl = a ? SSL_new(R.ctx) : NULL;
	if (!ssl) {
		free(a);
		evutil_closesocket(fd);
		return;
	}
	snprintf(a->addr, sizeof(a->addr), "%s:%s", host, port);
	if (!tlink_open(&a->link, api->event_base(), ssl, fd, BUFFEREVENT_SSL_ACCEPTING, MUX_ROLE_RELAY, &R.settings,
			&relay_cb, a, &agent_ops, agent_tick_cb)) {
		free(a);
		return;
	}
	a->link.tls_up = true;	/* output waits in the bufferevent until the handshake is done */
	a->next = R.agents;
	R.agents = a;
	tlink_start(&a->link, agent_event_cb);
	agent_tick_cb(-1, 0, &a->link);
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
		if (a->site == site && a->link.established && !a->link.dying && !a->link.close_when_flushed &&
		    !mux_going_away(a->link.s) && !mux_failed(a->link.s))
			return a;
	return NULL;
}

/*
 * May `site` open one more stream? Over all agents the relay holds at most
 * max_streams; each connected site is owed a share of them,
 * max(site_min_streams, max_streams / connected sites). A site below its
 * share may take a stream; one at or above it only while the free streams
 * exceed what the other connected sites still lack of their shares, so a
 * busy site can use what the others leave idle but never what they are
 * owed. O(agents). On refusal, msg says why.
 */
static bool fair_share(const struct site *site, char *msg, size_t mlen)
{
	unsigned n_sites = 0, share, owed = 0, mine = 0;

	if (++R.pass == 0)
		R.pass = 1;
	for (struct agent *a = R.agents; a; a = a->next) {
		struct site *s = a->site;

		if (!s || a->link.dying || !a->link.established)
			continue;
		if (s->mark != R.pass) {
			s->mark = R.pass;
			s->streams = 0;
			n_sites++;
		}
		s->streams += a->n_streams;
	}
	share = R.max_streams / (n_sites ? n_sites : 1);
	if (share < R.min_share)
		share = R.min_share;
	for (int i = 0; i < R.n_sites; i++) {
		struct site *s = &R.sites[i];

		if (s->mark != R.pass)
			continue;
		if (s == site)
			mine = s->streams;
		else if (s->streams < share)
			owed += share - s->streams;
	}
	if (mine < share || R.max_streams - R.n_streams > owed)
		return true;
	snprintf(msg, mlen, "site \"%s\" holds %u streams, its fair share of max_streams (%u) with %u sites connected",
		 site->name, mine, R.max_streams, n_sites);
	return false;
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
	if (R.draining) {
		api->connect_failed(req, "the relay is shutting down");
		return LK_ERROR;
	}
	for (int i = 0; site_name && i < R.n_sites; i++)
		if (strcmp(R.sites[i].name, site_name) == 0)
			site = &R.sites[i];
	if (!site) {
		snprintf(msg, sizeof(msg), "no tunnel site \"%s\" in [plugin.relay] sites (site= names the site)",
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
	if (!api->connect_is_cancel(req) && !fair_share(site, msg, sizeof(msg))) {
		if (R.refused_share++ % 1000 == 0)
			api->log(me, LK_LOG_WARNING, "relay: stream refused: %s (%lld refused so far)", msg,
				 R.refused_share);
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
		st->ts.bev = bufferevent_socket_new(api->event_base(), sv[1], BEV_OPT_CLOSE_ON_FREE);
	if (!st || !st->ts.bev) {
		free(st);
		close(sv[0]);
		close(sv[1]);
		api->connect_failed(req, "out of memory");
		return LK_ERROR;
	}
	st->a = agent;
	st->ts.l = &agent->link;
	st->ts.ready = true;
	st->req = req;
	st->core_fd = sv[0];
	st->is_cancel = api->connect_is_cancel(req) != 0;
	if (!st->is_cancel && api->connect_server(req))
		st->server_id = api->server_id(api->connect_server(req));
	snprintf(st->db, sizeof(st->db), "%s", db);
	memset(&op, 0, sizeof(op));
	snprintf(op.db_key, sizeof(op.db_key), "%s", db);
	snprintf(op.client_id, sizeof(op.client_id), "%s%s", api->connect_database(req), st->is_cancel ? "/cancel" : "");
	st->ts.id = mux_open(st->a->link.s, &op, st, &err);
	if (!st->ts.id) {
		bufferevent_free(st->ts.bev);
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
	tlink_stream_attach(&st->ts, pair_event_cb);
	tlink_flush(&st->a->link);
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
	bool reuse;

	(void)self;
	if (!parse_sites(api->config_get(ev, "sites"), NULL, NULL, why, sizeof(why)))
		return api->config_error(ev, "sites", "%s", why);
	if (!parse_max_streams(api->config_get(ev, "max_streams"), &ms))
		return api->config_error(ev, "max_streams", "must be a number 1..%d", MUX_MAX_STREAMS_CAP);
	if (!parse_max_streams(api->config_get(ev, "site_min_streams"), &ms))
		return api->config_error(ev, "site_min_streams", "must be a number 1..%d", MUX_MAX_STREAMS_CAP);
	if (!parse_listen(api->config_get(ev, "listen"), &ss, &len))
		return api->config_error(ev, "listen", "must be a numeric ADDRESS:PORT (127.0.0.1:7000, [::1]:7000)");
	if (!parse_bool(api->config_get(ev, "so_reuseport"), &reuse))
		return api->config_error(ev, "so_reuseport", "must be 0 or 1");
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
				mux_goaway(a->link.s, MUX_E_UNAUTHORIZED, 0, "site removed or token changed");
				a->link.close_when_flushed = true;
				tlink_flush(&a->link);
			}
		}
		free(R.sites);
		R.sites = sites;
		R.n_sites = n;
	}
	parse_max_streams(api->config_get(ev, "max_streams"), &R.max_streams);
	parse_max_streams(api->config_get(ev, "site_min_streams"), &R.min_share);
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
	if (!R.lis && !R.draining) {
		struct sockaddr_storage ss;
		int len;

		parse_bool(api->config_get(ev, "so_reuseport"), &R.reuseport);
		if (parse_listen(api->config_get(ev, "listen"), &ss, &len)) {
			R.lis = evconnlistener_new_bind(api->event_base(), accept_cb, NULL,
							LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC |
							(R.reuseport ? LEV_OPT_REUSEABLE_PORT : 0),
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

/* ================= shutdown: drain ================= */

/* The drain deadline: whatever is still open is reset, every session closed. */
static void drain_deadline(lk_plugin *self, void *arg)
{
	unsigned n = 0;

	(void)self;
	(void)arg;
	R.drain_timer = NULL;
	for (struct agent *a = R.agents; a; a = a->next)
		if (!a->link.dying) {
			n += a->n_streams;
			tlink_kill(&a->link, "the relay is shutting down");
		}
	if (n)
		api->log(me, LK_LOG_WARNING, "relay: drain deadline (%d s): %u streams reset", DRAIN_MS / 1000, n);
}

/*
 * A shutdown begins (SIGTERM, SIGINT, SHUTDOWN ...): stop accepting agents
 * (in a rolling restart the new process takes them), tell each agent
 * GOAWAY(RELAY_RESTART, reconnect now), open no more streams; a session
 * closes when its last stream does, and DRAIN_MS later whatever is left is
 * reset so the server connections it carries end and the process can exit.
 */
static int on_shutdown(lk_plugin *self, lk_event *ev)
{
	unsigned agents = 0;

	(void)ev;
	if (R.draining)
		return LK_CONTINUE;
	R.draining = true;
	if (R.lis)
		evconnlistener_free(R.lis);
	R.lis = NULL;
	for (struct agent *a = R.agents; a; a = a->next) {
		if (a->link.dying)
			continue;
		if (a->link.established) {
			mux_goaway(a->link.s, MUX_E_RELAY_RESTART, 0, "the relay is shutting down");
			agents++;
		} else {
			a->link.close_when_flushed = true;
		}
		tlink_flush(&a->link);
	}
	api->log(me, LK_LOG_INFO, "relay: shutting down: %u agents told to reconnect, %u streams left (reset after %d s)",
		 agents, R.n_streams, DRAIN_MS / 1000);
	if (R.n_streams)
		R.drain_timer = api->timer_add(self, (uint64_t)DRAIN_MS * 1000u, 0, drain_deadline, NULL);
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

		if (a->link.established) {
			gmtime_r(&a->since, &tm);
			strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &tm);
		}
		snprintf(b[0], 24, "%u", a->n_streams);
		snprintf(b[1], 24, "%lld", a->link.bytes_in);
		snprintf(b[2], 24, "%lld", a->link.bytes_out);
		snprintf(b[3], 24, "%lld", a->rtt_ms);
		row[0] = a->site_name[0] ? a->site_name : NULL;
		row[1] = a->addr;
		row[2] = a->link.established ? since : NULL;
		row[3] = b[0];
		row[4] = b[1];
		row[5] = b[2];
		row[6] = a->link.established ? b[3] : NULL;
		row[7] = a->link.dying ? "closing" : !a->link.established ? "handshake" :
			 mux_going_away(a->link.s) || !a->site ? "draining" : "active";
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

		snprintf(b[0], 24, "%u", st->ts.id);
		snprintf(b[1], 24, "%lld", st->ts.bytes_in);
		snprintf(b[2], 24, "%lld", st->ts.bytes_out);
		row[0] = b[0];
		row[1] = st->a ? st->a->site_name : NULL;
		row[2] = st->db;
		row[3] = st->req ? "opening" : st->ts.fin_in || st->ts.eof ? "closing" : "open";
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
			if (a->site == &R.sites[i] && a->link.established && !a->link.dying) {
				n++;
				streams += a->n_streams;
			}
		api->metric_sample(m, labels, (double)(arg ? streams : n));
	}
}

static void metric_refused(lk_plugin *self, lk_metrics *m, void *arg)
{
	const char *auth[] = { "reason", "token", NULL }, *streams[] = { "reason", "max_streams", NULL },
		   *hs[] = { "reason", "handshakes", NULL }, *share[] = { "reason", "fair_share", NULL };

	(void)self;
	(void)arg;
	api->metric_sample(m, auth, (double)R.refused_auth);
	api->metric_sample(m, streams, (double)R.refused_streams);
	api->metric_sample(m, hs, (double)R.refused_handshakes);
	api->metric_sample(m, share, (double)R.refused_share);
}

/* ================= init ================= */

static int relay_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	me = self;
	R.max_streams = MUX_MAX_STREAMS_DEFAULT;
	R.min_share = 64;
	tlink_settings(&R.settings);
	if (a->transport_register(self, "tunnel", tunnel_connect) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_CHECK, on_config_check, 0) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0 ||
	    a->config_declare(self, "listen", "", "numeric ADDRESS:PORT the relay accepts agents on (TLS 1.3)") != 0 ||
	    a->config_declare(self, "cert_file", "", "the relay's certificate chain (PEM)") != 0 ||
	    a->config_declare(self, "key_file", "", "the certificate's private key (PEM)") != 0 ||
	    a->config_declare(self, "sites", "",
			      "SITE:SHA256HEX, ...: each site's agent token, as the SHA-256 of the token in hex") != 0 ||
	    a->config_declare(self, "max_streams", "2048", "most tunnel streams over all agents") != 0 ||
	    a->config_declare(self, "site_min_streams", "64",
			      "each connected site's fair share of max_streams is at least this many") != 0 ||
	    a->config_declare(self, "so_reuseport", "0",
			      "1: bind listen with SO_REUSEPORT, so a new process can take over (rolling restart)") != 0 ||
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
				"agents refused (token), streams refused (max_streams, fair_share), connections closed (handshakes)",
				metric_refused, NULL) != 0)) {
		a->init_error(self, "metric registration failed");
		return -1;
	}
	if (a->hook(self, LK_HOOK_SHUTDOWN, on_shutdown, 0) != 0)
		a->log(self, LK_LOG_WARNING, "relay: this lokadb has no SHUTDOWN hook (ABI 1.6): no drain at shutdown");
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
