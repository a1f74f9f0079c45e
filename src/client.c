/* SPDX-License-Identifier: ISC */
/*
 * client.c -- connections from applications: startup, authentication and
 * the forwarding of their messages to the linked server.
 *
 * A client's input is read by libevent into its bufferevent's input
 * evbuffer. client_process() walks it message by message:
 *   - during login whole messages are parsed (startup, password, SASL);
 *   - afterwards only the 5-byte header is looked at and the message is
 *     moved to the server's output without copying (evbuffer_remove_buffer),
 *     also a piece at a time for messages larger than what has arrived.
 * A message the pooler cannot take (bad type, over max_message_bytes) gets an
 * ErrorResponse with a SQLSTATE and the client is closed after the flush.
 *
 * Invariants: c->fwd_remaining != 0 only while linked; a client without a
 * server never has its input consumed past a message boundary.
 */
#include "core.h"
#include "hba.h"
#include "scram.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <event2/util.h>
#include <openssl/crypto.h>

static void client_read_cb(struct bufferevent *bev, void *arg);
static void client_write_cb(struct bufferevent *bev, void *arg);
static void client_event_cb(struct bufferevent *bev, short what, void *arg);
static void client_unlist(struct client *c);

const char *client_ident(const struct client *c, char *buf, size_t len)
{
	char host[64];
	int port;
	addr_to_str(&c->addr, host, sizeof(host), &port);
	snprintf(buf, len, "C-%llu: %s/%s@%s:%d", (unsigned long long)c->id,
		 c->dbname ? c->dbname : "(nodb)", c->user ? c->user : "(nouser)", host, port);
	return buf;
}

/*
 * A copy of s that lives as long as c: in c->strs while there is room (a
 * login then allocates nothing for its user, database and secret), else
 * malloc'ed. Give it back with client_str_free(), never free().
 */
static char *client_strdup(struct client *c, const char *s)
{
	size_t n;
	char *r;

	if (!s)
		return NULL;
	n = strlen(s) + 1;
	if (n > sizeof(c->strs) - c->strs_used)
		return xstrdup(s);
	r = c->strs + c->strs_used;
	memcpy(r, s, n);
	c->strs_used += (uint32_t)n;
	return r;
}

/* Frees a client_strdup() copy (or a malloc'ed string handed to the client). */
static void client_str_free(struct client *c, char *s)
{
	if (s < c->strs || s >= c->strs + sizeof(c->strs))
		free(s);
}

/* Replace c->user, c->dbname or c->secret (`slot`) with a copy of s. */
void client_set_string(struct client *c, char **slot, const char *s)
{
	char *old = *slot;

	*slot = client_strdup(c, s);
	client_str_free(c, old);
}

void client_strings_free(struct client *c)
{
	client_str_free(c, c->user);
	client_str_free(c, c->dbname);
	client_str_free(c, c->secret);
	c->user = c->dbname = c->secret = NULL;
}

/*
 * The end of a client object (at the end of the loop turn after its close).
 * Up to CONN_SPARES_MAX are kept for the next accepted connections: with
 * their spare bufferevents (conn_bev_for()) they keep its callback.
 */
void client_release(struct client *c)
{
	varcache_free(&c->vars);
	scram_server_free(c->scram);
	client_strings_free(c);
	if (rt->n_client_cache < CONN_SPARES_MAX) {
		rt->client_cache[rt->n_client_cache++] = c;
		/* AddressSanitizer builds: a use of a kept object is still reported */
		ASAN_POISON_MEMORY_REGION(c, sizeof(*c));
		return;
	}
	free(c);
}

void client_cache_free(void)
{
	while (rt->n_client_cache > 0) {
		struct client *c = rt->client_cache[--rt->n_client_cache];
		ASAN_UNPOISON_MEMORY_REGION(c, sizeof(*c));
		free(c);
	}
}

/* A zeroed client object: a released one if there is one. */
static struct client *client_new(void)
{
	struct client *c;

	if (rt->n_client_cache == 0)
		return xcalloc(1, sizeof(*c));
	c = rt->client_cache[--rt->n_client_cache];
	ASAN_UNPOISON_MEMORY_REGION(c, sizeof(*c));
	memset(c, 0, sizeof(*c));
	return c;
}

/*
 * A login reply: straight to the socket when nothing is queued before it
 * (one send() instead of a chain allocated, queued, flushed and freed);
 * what the kernel does not take, or any error, goes through the output
 * buffer as every other reply does.
 */
static void client_send_now(struct client *c, const void *data, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	ssize_t n = 0;

	if (!c->tls && c->io.rd && evbuffer_get_length(out) == 0) {
		n = send(event_get_fd(c->io.rd), data, len, MSG_NOSIGNAL);
		if (n < 0)
			n = 0;
	}
	if ((size_t)n < len)
		evbuffer_add(out, (const uint8_t *)data + n, len - (size_t)n);
}

/*
 * TCP_DEFER_ACCEPT: the first packet is usually here already, so it is read
 * at once, as conn_read_now() would. A lone SSLRequest or GSSENCRequest
 * (libpq's default sslmode=prefer) with TLS off for clients gets its 'N'
 * here, without entering the input buffer (a chain allocated and freed).
 */
static void client_first_read(struct client *c, int fd)
{
	struct evbuffer *in;
	uint32_t code;
	ssize_t n;

	if (!c->io.rd_on)
		return;		/* SUSPENDed: read once resumed */
	if (tls_client_enabled()) {
		conn_read_now(&c->io);
		return;
	}
	n = recv(fd, rt->readbuf, sizeof(rt->readbuf), 0);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n == 0) {
		client_close(c, NULL, "client unexpected eof");
		return;
	}
	if (n < 0) {
		client_close(c, NULL, "client socket error: %s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		return;
	}
	rt->now = now_mono();
	code = n == 8 && pkt_get_u32((const uint8_t *)rt->readbuf) == 8 ? pkt_get_u32((const uint8_t *)rt->readbuf + 4) : 0;
	if (code == PROTO_SSL_CODE || code == PROTO_GSSENC_CODE) {
		client_send_now(c, "N", 1);
		return;
	}
	in = bufferevent_get_input(c->bev);
	evbuffer_unfreeze(in, 0);	/* the bufferevent keeps its input's end frozen */
	evbuffer_add(in, rt->readbuf, (size_t)n);
	evbuffer_freeze(in, 0);
	client_process(c);
}

void client_accept(int fd, const struct sockaddr *sa, int salen, bool is_unix)
{
	struct client *c;

	/* non-blocking, close-on-exec and the TCP options come from the listener */
	c = client_new();
	c->id = ++rt->next_id;
	c->state = CL_LOGIN;
	if (salen > 0 && (size_t)salen <= sizeof(c->addr))
		memcpy(&c->addr, sa, (size_t)salen);
	if (is_unix)
		c->addr.ss_family = AF_UNIX;
	c->connect_time = now_wall();
	c->login_start = c->request_time = now_mono();
	c->bev = conn_bev_for(&c->io, fd);
	if (!c->bev) {
		evutil_closesocket(fd);
		free(c);
		return;
	}
	TAILQ_INSERT_TAIL(&rt->login_clients, c, entry);
	rt->n_clients++;
	bufferevent_setcb(c->bev, client_read_cb, client_write_cb, client_event_cb, c);
	bufferevent_setwatermark(c->bev, EV_WRITE, WRITE_LOW_WATER, 0);
	if (bufferevent_get_enabled(c->bev))	/* a new one has EV_WRITE on; a spare nothing */
		bufferevent_disable(c->bev, EV_WRITE);
	conn_write_through(&c->io, c->bev);
	if (!conn_io_start(&c->io, CLIENT_READ_HIGH)) {
		client_close(c, NULL, "out of memory");
		return;
	}
	peers_new_cancel_key(c->cancel_key);
	if (rt->n_clients > rt->cf->max_client_conn) {
		client_close(c, "53300", "no more connections allowed (max_client_conn)");
		return;
	}
	conn_want_read(&c->io, true);
	if (!is_unix)
		client_first_read(c, fd);
}

/*
 * Close a client. With a sqlstate, a FATAL ErrorResponse is sent first and
 * the socket is closed once it has been flushed. The object itself is freed
 * at the end of the loop turn.
 */
void client_close(struct client *c, const char *sqlstate, const char *fmt, ...)
{
	char msg[512], ident[160];
	struct evbuffer *out;
	va_list ap;

	if (c->closing)
		return;
	msg[0] = 0;
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	c->closing = true;
	if (c->hooked)
		plugin_client_close(c);
	if (sqlstate && rt->cf->log_pooler_errors)
		log_warning("%s pooler error: %s", client_ident(c, ident, sizeof(ident)), msg);
	/* PgBouncer's line, with the connection's age */
	if (fmt && (rt->cf->log_disconnections || sqlstate))
		log_info("%s closing because: %s (age=%llds)", client_ident(c, ident, sizeof(ident)), msg,
			 (long long)((now_wall() - c->connect_time) / USEC));
	else if (rt->cf->log_disconnections && c->state != CL_LOGIN)
		log_info("%s closing because: client close request (age=%llds)", client_ident(c, ident, sizeof(ident)),
			 (long long)((now_wall() - c->connect_time) / USEC));
	pool_client_gone(c);
	client_unlist(c);
	c->state = CL_CLOSING;
	TAILQ_INSERT_TAIL(&rt->closing_clients, c, entry);
	out = bufferevent_get_output(c->bev);
	if (sqlstate && (!c->tls || tls_handshake_done(&c->io)))
		pkt_send_error(out, "FATAL", sqlstate, "%s", msg);
	conn_want_read(&c->io, false);
	if (evbuffer_get_length(out) == 0 || (c->tls && !tls_handshake_done(&c->io))) {
		client_free_now(c);
		return;
	}
	/* flush, then free from the write callback (or on error) */
	conn_flush_close(&c->io);
}

/* Take the client off whatever list its state puts it on. */
static void client_unlist(struct client *c)
{
	switch (c->state) {
	case CL_LOGIN:
		TAILQ_REMOVE(&rt->login_clients, c, entry);
		break;
	case CL_ADMIN:
		TAILQ_REMOVE(&rt->admin_clients, c, entry);
		break;
	case CL_CLOSING:
		TAILQ_REMOVE(&rt->closing_clients, c, entry);
		break;
	case CL_JUSTFREE:
		break;
	default:
		pool_set_client_state(c, CL_JUSTFREE);
		break;
	}
	c->state = CL_JUSTFREE;
}

/* Free the socket now and the object at the end of the loop turn. */
void client_free_now(struct client *c)
{
	if (c->state == CL_JUSTFREE)
		return;
	if (c->hooked)
		plugin_client_close(c);
	plugin_client_free(c);
	ps_client_free(c);
	rt_names_free(&c->rnames);
	authq_cancel(c);
	if (c->bev) {
		conn_free(&c->io, c->bev);
		c->bev = NULL;
	}
	client_unlist(c);
	TAILQ_INSERT_TAIL(&rt->justfree_clients, c, entry);
	rt->n_clients--;
	event_active(rt->justfree_ev, EV_TIMEOUT, 0);
}

static void client_write_cb(struct bufferevent *bev, void *arg)
{
	struct client *c = arg;
	(void)bev;
	if (c->closing) {
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
			client_free_now(c);
		return;
	}
	conn_write_idle(c->bev);
	/* the client drained what the server sent: let the server talk again */
	if (c->link && c->link->throttled) {
		c->link->throttled = false;
		conn_want_read(&c->link->io, true);
		server_process(c->link);
	}
}

static void client_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct client *c = arg;
	(void)bev;
	if (c->closing) {
		client_free_now(c);
		return;
	}
	if (c->tls && (what & BEV_EVENT_ERROR) && !(what & BEV_EVENT_EOF)) {
		char buf[256];
		client_close(c, NULL, "TLS error: %s", tls_error(&c->io, buf, sizeof(buf)));
	} else if (what & BEV_EVENT_EOF)
		client_close(c, NULL, "client unexpected eof");
	else if (what & BEV_EVENT_ERROR)
		client_close(c, NULL, "client socket error: %s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
}

static void client_read_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	client_process(arg);
}

/* ================= login ================= */

static bool startup_param(struct client *c, const char *key, const char *val)
{
	int id;

	if (strcmp(key, "user") == 0) {
		client_str_free(c, c->user);
		c->user = client_strdup(c, val);
	} else if (strcmp(key, "database") == 0) {
		client_str_free(c, c->dbname);
		c->dbname = client_strdup(c, val);
	} else if ((id = varcache_lookup(key)) >= 0) {
		varcache_set(&c->vars, (enum var_id)id, val);
	} else if (strcmp(key, "options") == 0) {
		return true;	/* parsed below by options_param() */
	} else if (strcmp(key, "replication") == 0) {
		client_close(c, "08P01", "replication connections are not supported");
		return false;
	} else if (!config_list_has(rt->cf->ignore_startup_parameters, key) && !plugin_startup_param_ok(key)) {
		client_close(c, "08P01", "unsupported startup parameter: %s", key);
		return false;
	}
	return true;
}

/* options=-c name=value [-c ...] / --name=value: only tracked parameters. */
static bool options_param(struct client *c, const char *opts)
{
	char *copy = xstrdup(opts), *save = NULL, *tok;
	bool expect_c = false, ok = true;

	for (tok = strtok_r(copy, " \t", &save); tok && ok; tok = strtok_r(NULL, " \t", &save)) {
		char *eq;
		int id;
		if (strcmp(tok, "-c") == 0) {
			expect_c = true;
			continue;
		}
		if (!expect_c && strncmp(tok, "--", 2) == 0)
			tok += 2;
		else if (!expect_c && strncmp(tok, "-c", 2) == 0)
			tok += 2;
		else if (!expect_c)
			ok = false;
		expect_c = false;
		eq = strchr(tok, '=');
		if (!ok || !eq) {
			ok = false;
			break;
		}
		*eq = 0;
		for (char *p = tok; *p; p++)
			if (*p == '-')
				*p = '_';
		id = varcache_lookup(tok);
		if (id >= 0)
			varcache_set(&c->vars, (enum var_id)id, eq + 1);
		else if (!config_list_has(rt->cf->ignore_startup_parameters, tok) && !plugin_startup_param_ok(tok))
			ok = false;
	}
	free(copy);
	if (!ok)
		client_close(c, "08P01", "unsupported options startup parameter: parameter \"%s\" cannot be set by the pooler", opts);
	return ok;
}

static void send_negotiate(struct client *c, uint32_t minor, int n_unknown, char **unknown)
{
	struct pktbuf *pb = &rt->pb;
	pkt_begin(pb, 'v');
	pkt_put_int32(pb, 196608);
	pkt_put_int32(pb, n_unknown);
	for (int i = 0; i < n_unknown; i++)
		pkt_put_string(pb, unknown[i]);
	pkt_end(pb);
	pkt_send(pb, bufferevent_get_output(c->bev));
	(void)minor;
}

/* Parse the v3 startup packet body (after length and version). */
static bool parse_startup(struct client *c, uint8_t *buf, uint32_t len, uint32_t minor)
{
	char *p, *end;
	char *unknown[32];
	int n_unknown = 0;
	const char *options = NULL;

	if (len == 0 || !buf) {
		client_close(c, "08P01", "invalid startup packet layout: expected terminator as last byte");
		return false;
	}
	p = (char *)buf;
	end = (char *)buf + len;
	if (buf[len - 1] != 0) {
		client_close(c, "08P01", "invalid startup packet layout: expected terminator as last byte");
		return false;
	}
	while (p < end && *p) {
		char *key = p, *val;
		p += strlen(p) + 1;
		if (p >= end) {
			client_close(c, "08P01", "invalid startup packet layout: missing value for \"%s\"", key);
			return false;
		}
		val = p;
		p += strlen(p) + 1;
		if (key[0] == '_' && strncmp(key, "_pq_.", 5) == 0) {
			if (n_unknown < 32)
				unknown[n_unknown++] = key;
			continue;
		}
		if (key[0] == 'o' && strcmp(key, "options") == 0)
			options = val;
		if (!startup_param(c, key, val))
			return false;
	}
	if (options && !options_param(c, options))
		return false;
	if (rt->n_plugins > 0) {
		c->startup = malloc(len);
		if (c->startup) {
			memcpy(c->startup, buf, len);
			c->startup_len = len;
		}
	}
	if (minor > 0 || n_unknown > 0)
		send_negotiate(c, minor, n_unknown, unknown);
	if (!c->user || !*c->user) {
		client_close(c, "28000", "no PostgreSQL user name specified in startup packet");
		return false;
	}
	if (!c->dbname || !*c->dbname) {
		client_str_free(c, c->dbname);
		c->dbname = client_strdup(c, c->user);
	}
	return true;
}

static void handle_cancel(struct client *c, const uint8_t *wire_key)
{
	struct pool *p;
	struct client *target;
	uint8_t key[8];

	if (!peers_cancel_local(wire_key, key))
		goto done;	/* another peer's key: forwarded there */
	TAILQ_FOREACH(p, &rt->pools, entry) {
		TAILQ_FOREACH(target, &p->active_clients, entry) {
			if (memcmp(target->cancel_key, key, 8) != 0)
				continue;
			if (target->link)
				server_cancel(target->link);
			goto done;
		}
		TAILQ_FOREACH(target, &p->waiting_clients, entry) {
			if (memcmp(target->cancel_key, key, 8) == 0) {
				client_close(target, "57014", "canceling statement due to user request");
				goto done;
			}
		}
	}
done:
	client_close(c, NULL, NULL);
}

static void client_auth_start(struct client *c);
static void client_startup_decided(struct client *c);

/* SSLRequest with TLS on: answer 'S' and continue the connection over TLS. */
static bool client_start_tls(struct client *c, struct evbuffer *in)
{
	struct ssl_st *ssl;
	int fd = bufferevent_getfd(c->bev);

	if (evbuffer_get_length(in) > 0) {
		client_close(c, "08P01", "received unencrypted data after SSL request");
		return false;
	}
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0 || send(fd, "S", 1, MSG_NOSIGNAL) != 1) {
		client_close(c, NULL, "could not answer the SSL request");
		return false;
	}
	ssl = tls_client_new();
	if (!ssl || !conn_start_tls(&c->io, ssl, true)) {
		client_close(c, NULL, "could not start TLS: out of memory");
		return false;
	}
	c->tls = true;
	return false;	/* the startup packet comes through TLS */
}

static void client_auth_lookup_decided(struct client *c);
static void client_auth_method(struct client *c);

/* Returns true when a whole startup message was consumed. */
static bool read_startup(struct client *c, struct evbuffer *in)
{
	uint8_t hdr[8], *body;
	uint32_t len, code;
	size_t avail = evbuffer_get_length(in);

	if (avail < 8) {
		if (avail >= 4) {
			evbuffer_copyout(in, hdr, 4);
			len = pkt_get_u32(hdr);
			if (len < 8 || len > STARTUP_MAX_LEN) {
				client_close(c, "08P01", "invalid length of startup packet");
				return false;
			}
		}
		return false;
	}
	evbuffer_copyout(in, hdr, 8);
	len = pkt_get_u32(hdr);
	code = pkt_get_u32(hdr + 4);
	if (len < 8 || len > STARTUP_MAX_LEN) {
		client_close(c, "08P01", "invalid length of startup packet");
		return false;
	}
	if (avail < len)
		return false;
	if (code == PROTO_SSL_CODE || code == PROTO_GSSENC_CODE) {
		evbuffer_drain(in, len);
		if (len != 8) {
			client_close(c, "08P01", "invalid length of startup packet");
			return false;
		}
		if (code == PROTO_SSL_CODE && !c->tls && c->addr.ss_family != AF_UNIX && tls_client_enabled())
			return client_start_tls(c, in);
		client_send_now(c, "N", 1);
		return true;
	}
	if (!c->tls && rt->cf->client_tls_sslmode >= SSL_REQUIRE && c->addr.ss_family != AF_UNIX &&
	    code != PROTO_CANCEL_CODE) {
		client_close(c, "28000", "SSL required");
		return false;
	}
	body = evbuffer_pullup(in, len);	/* header and body: one drain once it is parsed */
	if (!body) {
		client_close(c, "53200", "out of memory");
		return false;
	}
	body += 8;
	if (code == PROTO_CANCEL_CODE) {
		if (len == 16)
			handle_cancel(c, body);
		else
			client_close(c, "08P01", "invalid length of cancel request");
		return false;
	}
	if ((code >> 16) != 3) {
		client_close(c, "0A000", "unsupported frontend protocol %u.%u: server supports 3.0 to 3.0",
			     code >> 16, code & 0xffff);
		return false;
	}
	if (!parse_startup(c, body, len - 8, code & 0xffff))
		return false;
	evbuffer_drain(in, len);
	if (rt->shutdown != SHUT_NONE && c->addr.ss_family == AF_UNIX && !admin_is_dbname(c->dbname)) {
		/* TCP listeners close at shutdown (a client accepted meanwhile is served);
		 * the unix socket stays open for the console only */
		client_close(c, "57P01", "pooler is shutting down");
		return false;
	}
	if (hook_on(LK_HOOK_CLIENT_STARTUP)) {
		if (plugin_client_startup(c) == LK_ASYNC)
			return false;	/* c->lev: resumed by the plugin */
		client_startup_decided(c);
	} else {
		client_auth_start(c);
	}
	return !c->closing;
}

/* A login hook failed: the client gets its SQLSTATE and message, FATAL. */
static void close_with_plugin_error(struct client *c, const struct lk_event *ev)
{
	const char *state, *msg;
	plugin_event_error(ev, &state, &msg);
	client_close(c, state, "%s", msg);
}

/* CLIENT_STARTUP finished (c->lev decided): refuse the client or authenticate it. */
static void client_startup_decided(struct client *c)
{
	struct lk_event *ev = c->lev;
	int rc = LK_CONTINUE;

	plugin_event_decided(ev, &rc);
	if (rc == LK_ERROR)
		close_with_plugin_error(c, ev);
	c->lev = NULL;
	plugin_event_free(ev);
	if (!c->closing)
		client_auth_start(c);
}

static void auth_request(struct client *c, int32_t code, const void *data, size_t len)
{
	pkt_auth_req(&rt->pb, code, data, len);
	pkt_send(&rt->pb, bufferevent_get_output(c->bev));
}

static void auth_failed(struct client *c)
{
	client_close(c, "28P01", "password authentication failed for user \"%s\"", c->user);
}

static void client_login_done(struct client *c);

/* The OS user at the other end of a unix socket; false if unknown. */
static bool peer_uid(struct client *c, uid_t *uid)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (c->addr.ss_family != AF_UNIX ||
	    getsockopt(bufferevent_getfd(c->bev), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
		return false;
	*uid = cred.uid;
	return true;
}

/*
 * PgBouncer's rule: console user "pgbouncer" connecting over the unix socket
 * as the OS user lokadb runs as is an admin without a password.
 */
static bool own_user_login(struct client *c)
{
	char ident[160];
	uid_t uid;

	if (!admin_is_dbname(c->dbname) || strcmp(c->user, "pgbouncer") != 0 || !peer_uid(c, &uid) ||
	    uid != getuid())
		return false;
	c->own_user = true;
	if (rt->cf->log_connections)
		log_info("%s pgbouncer access from unix socket", client_ident(c, ident, sizeof(ident)));
	return true;
}

/* auth_type = hba: the method of the first matching rule; false: refused (closed). */
static bool hba_pick_method(struct client *c)
{
	static const int methods[] = {
		[HBA_TRUST] = AUTH_TRUST, [HBA_REJECT] = AUTH_REJECT, [HBA_MD5] = AUTH_MD5, [HBA_SCRAM] = AUTH_SCRAM,
		[HBA_PASSWORD] = AUTH_PLAIN, [HBA_CERT] = AUTH_CERT, [HBA_PEER] = AUTH_PEER,
	};
	const struct hba_rule *r = hba_match(rt->cf->hba, &c->addr, c->tls, c->dbname, c->user);
	char host[64];
	int port;

	if (c->addr.ss_family == AF_UNIX)
		snprintf(host, sizeof(host), "[local]");
	else
		addr_to_str(&c->addr, host, sizeof(host), &port);
	c->auth_type = r ? methods[r->method] : AUTH_REJECT;
	if (c->auth_type != AUTH_REJECT)
		return true;
	/* PostgreSQL's texts (PgBouncer says only "login rejected") */
	client_close(c, "28000", "%s for host \"%s\", user \"%s\", database \"%s\", %s",
		     r ? "pg_hba.conf rejects connection" : "no pg_hba.conf entry", host, c->user, c->dbname,
		     c->tls ? "SSL encryption" : "no encryption");
	return false;
}

/*
 * Authentication, once the startup packet is in. A client of an unknown
 * database still authenticates (against auth_file only), as in PgBouncer
 * 1.22+: "no such database" comes after a good password, so a wrong one
 * cannot probe which databases exist (client_login_done()).
 */
static void client_auth_start(struct client *c)
{
	c->db = db_lookup(c->dbname, true);
	if (c->db && admin_db_disabled(c->db)) {	/* console DISABLE; PgBouncer's text and SQLSTATE */
		client_close(c, "08P01", "database does not allow connections: %s", c->dbname);
		return;
	}
	if (own_user_login(c)) {
		client_login_done(c);
		return;
	}
	c->auth_type = rt->cf->auth_type;
	if (c->auth_type == AUTH_HBA && !hba_pick_method(c))
		return;
	if (hook_on(LK_HOOK_AUTH_LOOKUP) && c->db && !admin_is_dbname(c->dbname)) {
		if (plugin_auth_lookup(c) == LK_ASYNC)
			return;		/* c->lev: resumed by the plugin */
		client_auth_lookup_decided(c);
		return;
	}
	{
		const struct auth_entry *ae = config_find_auth(rt->cf, c->user);
		if (!ae && c->db && !admin_is_dbname(c->dbname) && authq_start(c))
			return;		/* c->authq: client_authq_done() goes on */
		c->secret = ae ? client_strdup(c, ae->secret) : NULL;
	}
	client_auth_method(c);
}

/* auth_query answered: the user's secret (NULL: no such user), or an error. */
void client_authq_done(struct client *c, const char *secret, const char *error)
{
	if (c->closing)
		return;
	if (error) {
		log_warning("auth_query for user %s failed: %s", c->user, error);
		client_close(c, "08001", "could not look up the password of user \"%s\" (auth_query): %s", c->user, error);
		return;
	}
	c->secret = secret ? client_strdup(c, secret) : NULL;
	if (!c->secret)
		c->secret_missing = true;
	client_auth_method(c);
	if (!c->closing)
		client_resume(c);
}

/* AUTH_LOOKUP finished: its secret (LK_HANDLED), auth_file (LK_CONTINUE) or an error. */
static void client_auth_lookup_decided(struct client *c)
{
	struct lk_event *ev = c->lev;
	char *secret = plugin_event_take_secret(ev);
	int rc = LK_CONTINUE;

	plugin_event_decided(ev, &rc);
	if (rc == LK_ERROR) {
		close_with_plugin_error(c, ev);
	} else if (rc == LK_HANDLED) {
		c->secret = secret;
		secret = NULL;
		if (!c->secret)
			c->secret_missing = true;
	} else {
		const struct auth_entry *ae = config_find_auth(rt->cf, c->user);
		c->secret = ae ? client_strdup(c, ae->secret) : NULL;
	}
	free(secret);
	c->lev = NULL;
	plugin_event_free(ev);
	if (!c->closing)
		client_auth_method(c);
}

/* auth by TLS client certificate: its verified CN must be the user name. */
static void login_via_cert(struct client *c)
{
	char cn[256];

	if (!c->tls || !tls_peer_cn(&c->io, cn, sizeof(cn)) || strcmp(cn, c->user) != 0) {
		client_close(c, "28000", "certificate authentication failed for user \"%s\"", c->user);
		return;
	}
	client_login_done(c);
}

/* peer: the OS user at the other end of the unix socket must be the user name. */
static void login_as_peer(struct client *c)
{
	struct passwd pw, *res = NULL;
	char buf[1024];
	uid_t uid;

	if (!peer_uid(c, &uid) || getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res ||
	    strcmp(res->pw_name, c->user) != 0) {
		client_close(c, "28000", "peer authentication failed for user \"%s\"", c->user);
		return;
	}
	client_login_done(c);
}

/* Ask for the password the way the client's auth_type and its secret want. */
static void client_auth_method(struct client *c)
{
	int type = c->auth_type;
	const char *secret;

	if (type == AUTH_CERT) {
		login_via_cert(c);
		return;
	}
	if (type == AUTH_PEER) {
		login_as_peer(c);
		return;
	}
	if (type == AUTH_ANY || type == AUTH_TRUST) {
		if (type == AUTH_TRUST && (rt->cf->n_auth > 0 || c->secret_missing) && !c->secret) {
			client_close(c, "28000", "no such user: %s", c->user);
			return;
		}
		client_login_done(c);
		return;
	}
	secret = c->secret;
	if (type == AUTH_PLAIN) {
		c->auth_step = 1;
		auth_request(c, 3, NULL, 0);
	} else if (secret && scram_is_scram_secret(secret)) {
		goto sasl;
	} else if (type == AUTH_SCRAM) {
		goto sasl;
	} else {
		random_bytes(c->md5_salt, 4);
		c->auth_step = 1;
		auth_request(c, 5, c->md5_salt, 4);
	}
	return;
sasl:
	c->auth_step = 2;
	{
		static const char mech[] = "SCRAM-SHA-256\0";
		auth_request(c, 10, mech, sizeof(mech));
	}
}

static bool check_password(struct client *c, const char *given)
{
	const char *secret = c->secret;
	char answer[36];

	if (!secret)
		return false;
	if (c->auth_type == AUTH_PLAIN) {
		if (scram_is_md5_secret(secret)) {
			char m[36];
			scram_md5_secret(c->user, given, m);
			return strcmp(m, secret) == 0;
		}
		return !scram_is_scram_secret(secret) && strcmp(secret, given) == 0;
	}
	if (scram_is_md5_secret(secret)) {
		scram_md5_answer(secret, c->md5_salt, answer);
	} else {
		char m[36];
		scram_md5_secret(c->user, secret, m);
		scram_md5_answer(m, c->md5_salt, answer);
	}
	return strcmp(answer, given) == 0;
}

static void sasl_step(struct client *c, const uint8_t *body, uint32_t len)
{
	char err[128], *out = NULL;
	const char *secret = c->secret;

	if (c->auth_step == 2) {
		/* SASLInitialResponse: mechanism, int32 length, data */
		const char *mech = (const char *)body;
		size_t ml = strnlen(mech, len);
		uint32_t dlen;
		if (ml + 5 > len || strcmp(mech, "SCRAM-SHA-256") != 0) {
			client_close(c, "08P01", "client selected an invalid SASL authentication mechanism");
			return;
		}
		dlen = pkt_get_u32(body + ml + 1);
		if (dlen > len - ml - 5) {
			client_close(c, "08P01", "malformed SASL message");
			return;
		}
		/* an unknown user still goes through the exchange, then fails */
		c->scram = scram_server_new(secret && !scram_is_md5_secret(secret) ? secret : "\x01invalid");
		if (!c->scram || !scram_server_first(c->scram, (const char *)body + ml + 5, dlen, &out, err, sizeof(err))) {
			client_close(c, "08P01", "%s", c->scram ? err : "out of memory");
			return;
		}
		c->auth_step = 3;
		auth_request(c, 11, out, strlen(out));
		free(out);
		return;
	}
	if (!scram_server_final(c->scram, (const char *)body, len, &out, err, sizeof(err)) || !secret ||
	    scram_is_md5_secret(secret)) {
		free(out);
		auth_failed(c);
		return;
	}
	auth_request(c, 12, out, strlen(out));
	free(out);
	c->has_scram_keys = scram_server_keys(c->scram, c->scram_keys, c->scram_keys + 32);
	if (!c->has_scram_keys)
		OPENSSL_cleanse(c->scram_keys, sizeof(c->scram_keys));
	scram_server_free(c->scram);
	c->scram = NULL;
	client_login_done(c);
}

/* A password or SASL message during login. */
static bool read_auth_message(struct client *c, struct evbuffer *in)
{
	uint8_t hdr[5], *body;
	uint32_t len;

	if (evbuffer_get_length(in) < 5)
		return false;
	evbuffer_copyout(in, hdr, 5);
	len = pkt_get_u32(hdr + 1);
	if (hdr[0] != 'p' || len < 4 || len > STARTUP_MAX_LEN) {
		client_close(c, "08P01", "expected password response, got message type %d", hdr[0]);
		return false;
	}
	if (evbuffer_get_length(in) < len + 1)
		return false;
	evbuffer_drain(in, 5);
	body = evbuffer_pullup(in, len - 4);
	if (len == 4) {
		client_close(c, "08P01", "invalid password packet: empty");
		return false;
	}
	if (c->auth_step >= 2) {
		sasl_step(c, body, len - 4);
	} else if (len - 4 == 0 || body[len - 5] != 0) {
		client_close(c, "08P01", "invalid password packet");
	} else if (!check_password(c, (const char *)body)) {
		auth_failed(c);
	} else {
		client_login_done(c);
	}
	if (!c->closing)
		evbuffer_drain(in, len - 4);
	return !c->closing;
}

/* application_name_add_host: "NAME - HOST:PORT", as PgBouncer does. */
static void add_host_to_appname(struct client *c)
{
	char host[64], buf[256];
	const char *app = c->vars.v[VAR_APPNAME];
	int port;

	addr_to_str(&c->addr, host, sizeof(host), &port);
	snprintf(buf, sizeof(buf), "%s - %s:%d", app ? app : "", host, port);
	varcache_set(&c->vars, VAR_APPNAME, buf);
}

/* max_db_client_connections / max_user_client_connections, as PgBouncer words them. */
static bool client_within_limits(struct client *c)
{
	int db_max = pool_db_client_limit(c->db), user_max = pool_user_client_limit(c->user);
	int n_db, n_user;

	if (db_max <= 0 && user_max <= 0)
		return true;
	pool_client_counts(c->db, c->user, &n_db, &n_user);
	if (db_max > 0 && n_db >= db_max) {
		client_close(c, "53300", "client connections exceeded (max_db_client_connections)");
		return false;
	}
	if (user_max > 0 && n_user >= user_max) {
		client_close(c, "53300", "client connections exceeded (max_user_client_connections)");
		return false;
	}
	return true;
}

static void client_login_done(struct client *c)
{
	char ident[160];

	c->auth_step = 0;
	if (admin_is_dbname(c->dbname)) {
		bool admin = c->own_user || config_list_has(rt->cf->admin_users, c->user);
		if (!admin && !config_list_has(rt->cf->stats_users, c->user)) {
			client_close(c, "28000", "not allowed");
			return;
		}
		c->admin_full = admin;
		TAILQ_REMOVE(&rt->login_clients, c, entry);
		c->state = CL_ADMIN;
		c->io.console = true;
		TAILQ_INSERT_TAIL(&rt->admin_clients, c, entry);
		client_welcome(c);
		return;
	}
	if (!c->db) {
		if (rt->cf->log_connections)
			log_info("%s login failed: db=%s user=%s", client_ident(c, ident, sizeof(ident)), c->dbname, c->user);
		client_close(c, "3D000", "no such database: %s", c->dbname);
		return;
	}
	if (!client_within_limits(c))
		return;
	c->pool = pool_get(c->db, c->user, c->secret);
	if (!c->pool) {
		client_close(c, "08P01", "could not create pool");
		return;
	}
	pool_take_scram_keys(c->pool, c);
	c->ps_on = pool_mode_of(c->pool) != POOL_SESSION && rt->cf->max_prepared_statements > 0;
	if (rt->cf->application_name_add_host && c->addr.ss_family != AF_UNIX)
		add_host_to_appname(c);
	if (rt->cf->log_connections) {
		char tls[128];
		log_info("%s login attempt: db=%s user=%s tls=%s", client_ident(c, ident, sizeof(ident)), c->dbname,
			 c->user, c->tls ? tls_describe(&c->io, tls, sizeof(tls)) : "no");
	}
	TAILQ_REMOVE(&rt->login_clients, c, entry);
	c->state = CL_LOGIN;	/* transient: pool_set_client_state() puts it on its pool */
	c->pool->stats.client_login_count++;
	if (c->pool->welcome_ready) {
		pool_set_client_state(c, CL_ACTIVE);
		client_welcome(c);
	} else {
		pool_set_client_state(c, CL_WAITING_LOGIN);
		pool_launch_first(c->pool);
	}
}

/*
 * The pool's welcome[] as ParameterStatus messages, built at its first
 * client_welcome() (welcome[] does not change once welcome_ready): a login
 * then copies runs of them instead of formatting a dozen messages.
 */
static bool welcome_wire(struct pool *p)
{
	struct pktbuf pb;
	uint32_t *off;

	if (p->welcome_off && p->welcome_wire_n == p->n_welcome)
		return true;
	free(p->welcome_wire);
	free(p->welcome_off);
	p->welcome_wire = NULL;
	p->welcome_off = NULL;
	off = malloc(sizeof(*off) * (size_t)(p->n_welcome + 1));
	if (!off)
		return false;
	pkt_init(&pb);
	for (int i = 0; i < p->n_welcome; i++) {
		off[i] = (uint32_t)pb.len;
		pkt_param_status(&pb, p->welcome[i].name, p->welcome[i].value);
	}
	off[p->n_welcome] = (uint32_t)pb.len;
	if (pb.failed) {
		pkt_free(&pb);
		free(off);
		return false;
	}
	p->welcome_wire = pb.data;	/* taken from pb */
	p->welcome_off = off;
	p->welcome_wire_n = p->n_welcome;
	return true;
}

/* The pool's welcome[]: its own values, or the client's where it set one that differs. */
static void welcome_params(struct client *c, struct pktbuf *pb, bool sent[VAR_COUNT])
{
	struct pool *p = c->pool;
	bool wire = welcome_wire(p);
	uint32_t run = 0;	/* start of the welcome_wire bytes not yet copied */

	for (int i = 0; i < p->n_welcome; i++) {
		int id = p->welcome[i].var;
		const char *v = p->welcome[i].value;
		if (id >= 0) {
			sent[id] = true;
			if (!c->vars.v[id]) {
				varcache_set_shared(&c->vars, (enum var_id)id, v);	/* p->welcome lives until exit */
				if (wire)
					continue;
			} else if (wire && strcmp(c->vars.v[id], v) == 0) {
				continue;
			}
			v = c->vars.v[id];
		} else if (wire) {
			continue;
		}
		if (wire) {
			pkt_put_bytes(pb, p->welcome_wire + run, p->welcome_off[i] - run);
			run = p->welcome_off[i + 1];
		}
		pkt_param_status(pb, p->welcome[i].name, v);
	}
	if (wire)
		pkt_put_bytes(pb, p->welcome_wire + run, p->welcome_off[p->n_welcome] - run);
}

/* AuthenticationOk, the parameters, BackendKeyData and ReadyForQuery. */
void client_welcome(struct client *c)
{
	static const uint8_t auth_ok[] = { 'R', 0, 0, 0, 8, 0, 0, 0, 0 };
	struct pktbuf *pb = &rt->pb;
	bool sent[VAR_COUNT] = { false };
	uint8_t tail[13 + 6] = { 'K', 0, 0, 0, 12 };

	pkt_put_bytes(pb, auth_ok, sizeof(auth_ok));
	if (c->pool) {
		welcome_params(c, pb, sent);
	} else {
		pkt_param_status(pb, "server_version", "15.0 (lokadb " LOKADB_VERSION ")");
		pkt_param_status(pb, "server_encoding", "UTF8");
		pkt_param_status(pb, "client_encoding", c->vars.v[VAR_CLIENT_ENCODING] ? c->vars.v[VAR_CLIENT_ENCODING] : "UTF8");
		pkt_param_status(pb, "DateStyle", "ISO, MDY");
		pkt_param_status(pb, "standard_conforming_strings", "on");
		pkt_param_status(pb, "integer_datetimes", "on");
		pkt_param_status(pb, "TimeZone", "UTC");
		pkt_param_status(pb, "is_superuser", "off");
		memset(sent, 1, sizeof(sent));
	}
	for (int i = 0; i < VAR_COUNT; i++)
		if (!sent[i] && c->vars.v[i])
			pkt_param_status(pb, varcache_name((enum var_id)i), c->vars.v[i]);
	/* BackendKeyData, then ReadyForQuery 'I' */
	memcpy(tail + 5, c->cancel_key, 8);
	memcpy(tail + 13, "Z\0\0\0\5I", 6);
	pkt_put_bytes(pb, tail, sizeof(tail));
	if (!pb->failed)
		client_send_now(c, pb->data, pb->len);
	pkt_reset(pb);
	c->request_time = now_mono();
}

/* The pool's first server logged in (or the client got one): go on. */
void client_resume(struct client *c)
{
	if (c->closing || !c->bev)
		return;
	if (c->throttled)
		return;
	conn_want_read(&c->io, true);
	client_process(c);
}

/* ================= after login ================= */

/* Message types a logged-in client may send. */
static bool valid_frontend(uint8_t type)
{
	switch (type) {
	case 'Q': case 'P': case 'B': case 'E': case 'D': case 'C': case 'H':
	case 'S': case 'X': case 'd': case 'c': case 'f': case 'F':
		return true;
	default:
		return false;
	}
}
#define PS_BIND_PEEK 1024	/* bytes of a Bind looked at first for its portal and statement names */

/* Move up to `n` bytes of the current message to the server. */
static void forward_bytes(struct client *c, struct evbuffer *in, uint32_t n)
{
	struct server *s;
	struct evbuffer *out;
	size_t avail = evbuffer_get_length(in);
	uint32_t take = avail < n ? (uint32_t)avail : n;

	if (c->fwd_drop || !c->link) {	/* the rest of a message the pooler refused (or its server is gone) */
		evbuffer_drain(in, take);
		c->fwd_remaining = n - take;
		c->fwd_drop = c->fwd_remaining != 0;
		return;
	}
	s = c->link;
	out = bufferevent_get_output(s->bev);

	if (take == avail) {	/* the whole input: sent at once, or its chains move, nothing is copied or split */
		if (take - conn_send_from(&s->io, in, take) > 0)
			evbuffer_add_buffer(out, in);
	} else {
		evbuffer_remove_buffer(in, out, take);
	}
	c->fwd_remaining = n - take;
	s->pool->stats.bytes_received += take;
	if (evbuffer_get_length(out) > WRITE_HIGH_WATER) {
		c->throttled = true;
		conn_want_read(&c->io, false);
	}
}

static void note_sent_to_server(struct client *c, char type)
{
	struct server *s = c->link;

	if (!s->in_query) {
		s->in_query = true;
		s->query_start = c->request_time;
	}
	if (!s->in_xact) {
		s->in_xact = true;
		s->xact_start = c->request_time;
	}
	s->ready = false;
	switch (type) {
	case 'S':
		if (!s->copy_in)	/* PostgreSQL ignores Sync during COPY IN */
			server_expect(s, 'S', RQ_FWD);
		s->ext_open = false;
		break;
	case 'P':
		if (!c->ps_on)	/* else ps_parse() counts it */
			s->pool->stats.client_parse_count++;
		s->pool->stats.server_parse_count++;
		server_expect(s, type, RQ_FWD);
		s->ext_open = true;
		break;
	case 'B':
		if (!c->ps_on)	/* else ps_bind() counts it */
			s->pool->stats.bind_count++;
		/* fall through */
	case 'C':
	case 'E':
	case 'D':
		server_expect(s, type, RQ_FWD);
		/* fall through */
	case 'H':
		s->ext_open = true;
		break;
	case 'Q':
	case 'F':
		server_expect(s, type, RQ_FWD);
		break;
	case 'c':
	case 'f':
		s->copy_in = false;
		break;
	default:
		break;
	}
}

/* ================= plugins: QUERY and ROUTE ================= */

static char client_txn_status(const struct client *c)
{
	return c->link ? c->link->txn_status : 'I';
}

/* Drop the message at the head of the input (also the part not read yet). */
static void drop_message(struct client *c, struct evbuffer *in, uint32_t len)
{
	c->fwd_drop = true;
	forward_bytes(c, in, len + 1);
	conn_set_rd_high(&c->io, CLIENT_READ_HIGH);
}

/*
 * The pooler's own reply to the client's message (in pb; ready: a
 * ReadyForQuery goes after it): while the client's server owes it earlier
 * replies, after those (rq_synth_reply), so that a pipelining client reads
 * its answers in order; and it goes with the batch if the server skips it
 * (an earlier error, also one that came while a plugin held this message),
 * as PostgreSQL would skip the message.
 */
static void reply_in_order(struct client *c, struct pktbuf *pb, bool ready)
{
	struct server *s = c->link;

	if (s && !s->closing && (s->rq.count || s->fwd_remaining || s->skipping)) {
		rq_synth_reply(s, pb, ready);
		return;
	}
	if (ready)
		pkt_ready(pb, client_txn_status(c));
	pkt_send(pb, bufferevent_get_output(c->bev));
}

/*
 * Refuse the message at the head of the input with an ErrorResponse. After
 * a Query (or a Sync, FunctionCall) the client gets ReadyForQuery; after an
 * extended-protocol message everything up to the next Sync is dropped and
 * the Sync is answered, as PostgreSQL does after an error.
 */
static void fail_message(struct client *c, struct evbuffer *in, char type, uint32_t len, const char *sqlstate,
			 const char *msg)
{
	struct pktbuf *pb = &rt->pb;
	char ident[160];

	if (rt->cf->log_pooler_errors)
		log_warning("%s pooler error: %s", client_ident(c, ident, sizeof(ident)), msg);
	drop_message(c, in, len);
	pkt_error(pb, "ERROR", sqlstate, msg, NULL);
	if (!rq_owes_ready(type))
		c->skip_to_sync = true;
	reply_in_order(c, pb, rq_owes_ready(type));
}

/*
 * After a refused extended-protocol message: drop everything up to the Sync.
 * The Sync itself goes to the server when the client holds one (its earlier
 * messages get their replies and ReadyForQuery from there); else the pooler
 * answers it.
 */
static bool skip_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	if (type != 'S') {
		drop_message(c, in, len);
		return !c->fwd_remaining;
	}
	c->skip_to_sync = false;
	if (c->link) {
		c->request_time = rt->now;
		note_sent_to_server(c, 'S');
		forward_bytes(c, in, len + 1);
		return !c->throttled && !c->fwd_remaining;
	}
	drop_message(c, in, len);
	pkt_ready(&rt->pb, 'I');
	pkt_send(&rt->pb, bufferevent_get_output(c->bev));
	return !c->fwd_remaining;
}

/* Wait for the whole message: let the input grow to hold it. */
static bool want_whole(struct client *c, struct evbuffer *in, uint32_t len)
{
	if (evbuffer_get_length(in) >= (size_t)len + 1)
		return true;
	if (c->io.rd_high < (size_t)len + 1)
		conn_set_rd_high(&c->io, (size_t)len + 1);
	return false;
}

/*
 * Link a server for the message at the head of the input, after the ROUTE
 * hook picked the pool. 1: linked; 0: wait (queued, or a plugin holds the
 * client); -1: the message was refused and consumed.
 */
static int client_acquire(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	if (!c->route_done && hook_on(LK_HOOK_ROUTE)) {
		const char *route;
		int rc;
		if (!c->rev && plugin_route(c) == LK_ASYNC)
			return 0;
		if (!plugin_event_decided(c->rev, &rc))
			return 0;
		if (rc == LK_ERROR) {
			const char *state, *msg;
			plugin_event_error(c->rev, &state, &msg);
			fail_message(c, in, type, len, state, msg);
			plugin_event_free(c->rev);
			c->rev = NULL;
			return -1;
		}
		route = plugin_event_route(c->rev);
		if (route && !pool_move_client(c, db_lookup(route, true))) {
			fail_message(c, in, type, len, "3D000", "the route's database is not available");
			plugin_event_free(c->rev);
			c->rev = NULL;
			return -1;
		}
		plugin_event_free(c->rev);
		c->rev = NULL;
		c->route_done = true;
	}
	return pool_acquire(c) ? 1 : 0;
}

/* ================= prepared statements (prepared.c) ================= */

/* Stop reading the client while its server's output is full. */
static void check_server_output(struct client *c)
{
	if (c->link && evbuffer_get_length(bufferevent_get_output(c->link->bev)) > WRITE_HIGH_WATER) {
		c->throttled = true;
		conn_want_read(&c->io, false);
	}
}

/*
 * A whole Parse/Bind/Describe/Close of a client with prepared statements,
 * at msg (mlen bytes with the type byte): mapped onto its server. The
 * caller drops the client's copy of the message.
 */
static void ps_send_whole(struct client *c, const uint8_t *msg, uint32_t mlen)
{
	struct server *s = c->link;
	uint32_t used = 0;
	int rc;

	note_sent_to_server(c, 'H');	/* the activity; the reply items come from prepared.c */
	switch (msg[0]) {
	case 'P': rc = ps_parse(c, msg, mlen); break;
	case 'B': rc = ps_bind(c, msg, mlen, mlen, &used); break;
	case 'D': rc = ps_describe(c, msg, mlen); break;
	default: rc = ps_close(c, msg, mlen); break;
	}
	if (c->closing || s->closing)
		return;
	s->pool->stats.bytes_received += mlen;
	if (rc == PS_PASS) {
		note_sent_to_server(c, (char)msg[0]);
		evbuffer_add(bufferevent_get_output(s->bev), msg, mlen);
	} else if (rc == PS_DONE && used) {
		evbuffer_add(bufferevent_get_output(s->bev), msg + used, mlen - used);
	} else if (rc == PS_FAIL) {
		c->skip_to_sync = true;
	}
	check_server_output(c);
}

/*
 * Parse/Bind/Describe/Close of a client with prepared statements (c linked).
 * A Bind's parameters are moved to the server without a copy; the other
 * messages are small and read whole.
 */
static bool ps_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	uint32_t used = 0, have, peek;
	int rc;

	if (type != 'B') {
		if (!want_whole(c, in, len))
			return false;
		ps_send_whole(c, evbuffer_pullup(in, (ssize_t)len + 1), len + 1);
		if (!c->closing)
			drop_message(c, in, len);
		return !c->closing && !c->throttled;
	}
	have = (uint32_t)(evbuffer_get_length(in) < (size_t)len + 1 ? evbuffer_get_length(in) : (size_t)len + 1);
	peek = have < PS_BIND_PEEK ? have : PS_BIND_PEEK;
	rc = ps_bind(c, evbuffer_pullup(in, peek), peek, len + 1, &used);
	if (rc == PS_MORE && have > PS_BIND_PEEK)
		rc = ps_bind(c, evbuffer_pullup(in, have), have, len + 1, &used);
	if (rc == PS_MORE) {
		want_whole(c, in, len);
		return false;
	}
	if (c->closing)
		return false;
	note_sent_to_server(c, 'H');
	if (rc == PS_PASS) {
		note_sent_to_server(c, 'B');
		forward_bytes(c, in, len + 1);
	} else if (rc == PS_DONE && used) {
		evbuffer_drain(in, used);
		c->link->pool->stats.bytes_received += used;
		forward_bytes(c, in, len + 1 - used);
	} else {
		if (rc == PS_FAIL)
			c->skip_to_sync = true;
		drop_message(c, in, len);
	}
	check_server_output(c);
	return !c->closing && !c->throttled;
}

#define PS_DEALLOC_MAX 1024	/* bytes of a Query or Parse looked at for a DEALLOCATE */
#define PS_DEALLOC_PEEK 32	/* ... of which its start first */

/*
 * SQL DEALLOCATE of one of the client's protocol-level statements
 * (ps_deallocate), answered before a plugin sees it, as a Close is. -1: it
 * is not one; else what client_message returns.
 */
static int dealloc_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	uint8_t head[PS_DEALLOC_PEEK];
	uint32_t peek = len + 1 < PS_DEALLOC_PEEK ? len + 1 : PS_DEALLOC_PEEK;
	char *name;

	if (len + 1 > PS_DEALLOC_MAX)
		return -1;
	if (evbuffer_get_length(in) < peek) {	/* its start says whether it may be one */
		want_whole(c, in, peek - 1);
		return 0;
	}
	evbuffer_copyout(in, head, peek);
	if (!ps_deallocate_candidate(head, peek))
		return -1;
	if (!want_whole(c, in, len))
		return 0;
	if (!(name = ps_deallocate_of(c, evbuffer_pullup(in, len + 1), len + 1)))
		return -1;
	if (!c->link) {
		int r = client_acquire(c, in, type, len);
		if (r <= 0) {
			free(name);
			return r < 0 && !c->closing;
		}
	}
	if (type == 'Q' && c->link->ext_open) {
		free(name);	/* a Query inside the client's open batch: PostgreSQL's to answer */
		return -1;
	}
	if (ps_name_unsettled(c, name) && plugin_client_await(c)) {
		free(name);	/* as await_unsettled_name */
		return 0;
	}
	if (!ps_client_has(c, name)) {
		free(name);	/* (its Close went after all) */
		return -1;
	}
	c->request_time = rt->now;
	note_sent_to_server(c, type == 'P' ? 'H' : 0);
	if (c->stmts) {		/* the statement texts plugins see: the name goes, back if skipped */
		struct rq_item *it;
		char *copy = xstrdup(name);
		it = ps_deallocate(c, type, name);
		plugin_stmt_closed(c, copy, it);
		free(copy);
	} else {
		ps_deallocate(c, type, name);
	}
	if (!c->closing)
		drop_message(c, in, len);
	check_server_output(c);
	return !c->closing && !c->throttled;
}

/* The Close and Parse in pb go before a Bind; `gen` is the text's (stmt_text.gen). */
static void send_parse_first(struct client *c, const char *name, uint32_t gen, int hidden)
{
	struct server *s = c->link;
	struct rq_item *it;

	if ((hidden == 2 && !server_expect(s, 'C', RQ_HIDE)) || !(it = server_expect(s, 'P', RQ_HIDE))) {
		pkt_reset(&rt->pb);
		return;
	}
	it->name = strdup(name);	/* (NULL: the loss goes unnoticed, as before) */
	it->reparse_gen = it->name ? gen : 0;
	s->ext_open = true;
	pkt_send(&rt->pb, bufferevent_get_output(s->bev));
}

/*
 * Before a Bind: a plugin's re-parse (the bound statement gets the plugin's
 * text on the server first), or the text the plugin was told sent again
 * when an earlier re-parse may not have reached the server.
 */
static void send_reparse(struct client *c, struct lk_event *ev)
{
	const char *name = plugin_event_stmt(ev);
	uint32_t gen;
	int hidden;

	if (!name)
		return;
	if (c->ps_on && name[0]) {
		/* the name now stands for the new text: a cache entry of its own */
		if (plugin_query_wants_reparse(ev) && ps_reparse(c, name, plugin_event_reparse(ev)))
			plugin_note_parse(c, name, plugin_event_reparse(ev));
		return;
	}
	if (plugin_query_wants_reparse(ev))
		gen = plugin_query_reparse_msgs(c, ev, &rt->pb, &hidden);
	else
		gen = plugin_stmt_resend_msgs(c, c->link, name, &rt->pb, &hidden);
	if (gen && server_block_failed(c->link)) {
		/* PostgreSQL refuses the Parse (25P02) and the Bind with it, where
		 * the Bind's own error comes first (08P01): the text goes at a
		 * Bind after the block */
		pkt_reset(&rt->pb);
		plugin_reparse_unsent(c, name, gen);
	} else if (gen) {
		send_parse_first(c, name, gen, hidden);
	}
}

/* The decided Parse/Bind of a watched client with prepared statements: the plugin's version of it, mapped. */
static void ps_watched(struct client *c, struct lk_event *ev, struct evbuffer *in, uint32_t len)
{
	uint8_t *copy = NULL;
	struct server *s = c->link;
	uint32_t items = s->rq.count;

	if (plugin_query_build(c, ev, &rt->pb)) {
		uint32_t n = (uint32_t)rt->pb.len;
		copy = malloc(n);
		if (!copy) {
			pkt_reset(&rt->pb);
			client_close(c, "53200", "out of memory");
			return;
		}
		memcpy(copy, rt->pb.data, n);
		pkt_reset(&rt->pb);
		ps_send_whole(c, copy, n);
		free(copy);
		if (!c->closing && !s->closing && s->rq.count > items)	/* a Parse went: its item */
			plugin_query_give_map(ev, rq_at(&s->rq, s->rq.count - 1));
	} else {
		ps_send_whole(c, evbuffer_pullup(in, (ssize_t)len + 1), len + 1);
		if (!c->closing && !s->closing && s->rq.count > items)
			plugin_query_give_map(ev, rq_at(&s->rq, s->rq.count - 1));
	}
	if (!c->closing)
		drop_message(c, in, len);
}

/*
 * A Describe or Close of a client with names whose RowDescriptions a
 * plugin's tables rename (api->query_result_tables): the Describe's reply
 * item takes the name's tables; a Close forgets the name. Then forwarded
 * as any other.
 */
static bool names_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	const uint8_t *b;
	struct lk_tables *t = NULL, *closed = NULL;
	struct server *s = c->link;
	uint32_t items = s->rq.count;
	bool more;

	if (!want_whole(c, in, len))
		return false;
	b = evbuffer_pullup(in, (ssize_t)len + 1) + 5;
	if (type == 'D' && len >= 6 && b[0] == 'S' && plugin_renames_unsettled(c) && plugin_client_await(c))
		return false;	/* (a Parse or Close in an earlier batch may yet give its renames back) */
	if (len >= 6 && b[len - 5] == 0) {	/* (else PostgreSQL says what is wrong with it) */
		if (type == 'C') {
			if (b[0] == 'S')	/* given back if PostgreSQL skips the Close */
				closed = rt_tables_ref(rt_names_get(&c->rnames, 'S', (const char *)b + 1));
			rt_names_set(&c->rnames, (char)b[0], (const char *)b + 1, NULL);
		} else {
			t = rt_names_get(&c->rnames, (char)b[0], (const char *)b + 1);
		}
	}
	if (c->ps_on) {
		more = ps_message(c, in, type, len);
	} else {
		note_sent_to_server(c, type);
		forward_bytes(c, in, len + 1);
		more = !c->throttled;
	}
	if (t && !c->closing && !s->closing && s->rq.count > items) {
		struct rq_item *it = rq_at(&s->rq, s->rq.count - 1);
		if (it->type == 'D' && it->act == RQ_FWD && !it->tables)
			it->tables = rt_tables_ref(t);
	}
	if (closed && !c->closing && !s->closing && s->rq.count > items) {
		struct rq_item *it = rq_at(&s->rq, s->rq.count - 1);
		if ((it->type == 'C' || (it->type == '3' && it->act == RQ_SYNTH)) && !it->rn_undo) {
			it->rn_before = closed;
			it->rn_undo = true;
			closed = NULL;
		}
	}
	rt_tables_release(closed);
	return more;
}

#define PS_DROPS_PEEK 8192	/* bytes of a Query looked at for DISCARD ALL or DEALLOCATE ALL */

/*
 * The client's Query just noted: one that may DISCARD ALL or DEALLOCATE ALL
 * (its text names either word; a longer one is not looked at) makes the
 * client's messages that name a statement wait for its answer, with the
 * core's prepared statements: what it drops is known then.
 */
static void note_query_drops(struct client *c, struct evbuffer *in, uint32_t len)
{
	struct rq_item *it = c->link->rq.count ? rq_at(&c->link->rq, c->link->rq.count - 1) : NULL;
	const char *sql;

	if (!c->ps_on || !it || it->type != 'Q' || len < 5 || len + 1 > PS_DROPS_PEEK)
		return;
	sql = (const char *)evbuffer_pullup(in, (ssize_t)len + 1) + 5;
	if (sql[len - 5] == 0)
		it->drops_all = ps_sql_names_drop_all(sql, len - 5);
}

/*
 * The client's Query just noted, `DEALLOCATE [PREPARE] name` of a statement
 * whose text plugins see (session pooling, or not the core's prepared
 * statements): the name goes, back if PostgreSQL skips the Query.
 */
static void note_query_deallocate(struct client *c, struct evbuffer *in, uint32_t len)
{
	uint32_t peek = len + 1 < PS_DEALLOC_PEEK ? len + 1 : PS_DEALLOC_PEEK;
	char *name;

	if (!c->stmts || len + 1 > PS_DEALLOC_MAX || !ps_deallocate_candidate(evbuffer_pullup(in, peek), peek))
		return;
	if ((name = ps_deallocate_name_of(evbuffer_pullup(in, (ssize_t)len + 1), len + 1))) {
		plugin_stmt_closed(c, name, rq_at(&c->link->rq, c->link->rq.count - 1));
		free(name);
	}
}

/*
 * A message of a linked client that no plugin decides: with its names
 * renamed (result tables), by the core's prepared statements, or as it is.
 */
static bool send_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	/* (a Describe also with none renamed now: a skipped Parse or Close may give some back) */
	if ((c->rnames.n && (type == 'D' || type == 'C')) || (type == 'D' && plugin_renames_unsettled(c)))
		return names_message(c, in, type, len);
	if (c->ps_on && (type == 'P' || type == 'B' || type == 'D' || type == 'C'))
		return ps_message(c, in, type, len);
	note_sent_to_server(c, type);
	if (type == 'Q')
		note_query_drops(c, in, len);
	forward_bytes(c, in, len + 1);
	return !c->throttled;
}

/*
 * A Close of a client whose statement texts plugins see: forwarded as any
 * other, then the text of a statement it closes goes, into the Close's
 * reply item (the server may yet skip the Close: plugin_stmt_undo).
 */
static bool stmt_close_message(struct client *c, struct evbuffer *in, uint32_t len)
{
	struct server *s = c->link;
	char name[256];
	bool stmt = false, more;
	const uint8_t *b;
	uint32_t items = s->rq.count;

	if (!want_whole(c, in, len))
		return false;
	b = evbuffer_pullup(in, (ssize_t)len + 1) + 5;
	if (len >= 6 && b[0] == 'S' && b[len - 5] == 0 && len - 5 < sizeof(name)) {
		memcpy(name, b + 1, len - 5);
		stmt = true;
	}
	more = send_message(c, in, 'C', len);
	if (stmt && !c->closing && !s->closing) {
		struct rq_item *it = s->rq.count > items ? rq_at(&s->rq, s->rq.count - 1) : NULL;
		/* (the core's prepared statements may answer it: CloseComplete) */
		plugin_stmt_closed(c, name, it && (it->type == 'C' || (it->type == '3' && it->act == RQ_SYNTH)) ? it : NULL);
	}
	return more;
}

/*
 * A decided Parse of a watched client, as it will go to the server (a
 * plugin may have rewritten it): should it wait for the batches before it
 * (await_unsettled_name)? true: it waits.
 */
static bool watched_parse_waits(struct client *c, struct lk_event *ev)
{
	bool w;

	plugin_query_parse_msg(ev, &rt->pb);
	w = ps_msg_name_unsettled(c, rt->pb.data, (uint32_t)rt->pb.len);
	pkt_reset(&rt->pb);
	return w && plugin_client_await(c);
}

/* Query, Parse or Bind of a client a plugin watches: the QUERY hook decides. */
static bool watched_message(struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	struct lk_event *ev;
	const char *route;
	char **prefix;
	int rc, n_prefix;

	if (!c->qev) {
		if (!want_whole(c, in, len))
			return false;
		rc = plugin_query(c, evbuffer_pullup(in, (ssize_t)len + 1), len);
		if (rc == -2 || rc == LK_ASYNC)
			return false;
	}
	ev = c->qev;
	if (!plugin_event_decided(ev, &rc))
		return false;		/* a plugin holds it */
	if (rc != LK_ERROR && rc != LK_HANDLED && type == 'P' && c->ps_on && c->link && c->link->rq.syncs &&
	    !c->link->copy_in && !c->skip_to_sync && watched_parse_waits(c, ev))
		return false;		/* decided; it goes on once the batches before it are answered */
	if (rc == LK_ERROR || rc == LK_HANDLED) {
		if (rc == LK_ERROR) {
			const char *state, *msg;
			plugin_event_error(ev, &state, &msg);
			fail_message(c, in, type, len, state, msg);
		} else {
			drop_message(c, in, len);
			plugin_query_answer(ev, &rt->pb);
			reply_in_order(c, &rt->pb, type == 'Q');
		}
		c->qev = NULL;
		plugin_event_free(ev);
		return !c->closing;
	}
	route = plugin_event_route(ev);
	if (route && !c->link && !pool_move_client(c, db_lookup(route, true))) {
		c->qev = NULL;
		fail_message(c, in, type, len, "3D000", "the route's database is not available");
		plugin_event_free(ev);
		return !c->closing;
	}
	if (route && !c->link)
		c->route_done = true;	/* the statement chose its pool: no ROUTE hook for it */
	if (!c->link) {
		int r = client_acquire(c, in, type, len);
		if (r <= 0) {
			if (r < 0) {
				c->qev = NULL;
				plugin_event_free(ev);
			}
			return r < 0 && !c->closing;
		}
	}
	prefix = plugin_query_prefixes(ev, &n_prefix);
	if (n_prefix > 0 && (c->link->ext_open || (type == 'B' && plugin_query_binds_unnamed(ev)))) {
		/* a simple Query here would end the client's extended-protocol batch
		 * (and drop its unnamed statement): refuse rather than run unprefixed */
		c->qev = NULL;
		fail_message(c, in, type, len, "0A000",
			     "a plugin's prefix statement cannot be sent inside an extended-protocol batch");
		plugin_event_free(ev);
		return !c->closing;
	}
	plugin_query_send_vars(c, ev);
	plugin_query_note_tables(c, ev);
	for (int i = 0; i < n_prefix; i++)
		server_send_hidden(c->link, prefix[i]);
	if (type == 'B')
		send_reparse(c, ev);
	c->request_time = rt->now;
	if (c->ps_on && (type == 'P' || type == 'B') && !c->closing) {
		ps_watched(c, ev, in, len);
		c->qev = NULL;
		plugin_event_free(ev);
		return !c->throttled && !c->fwd_remaining && !c->closing;
	}
	note_sent_to_server(c, type);
	if (type == 'Q') {
		note_query_drops(c, in, len);
		plugin_stmt_query_sent(c, rq_at(&c->link->rq, c->link->rq.count - 1));
		note_query_deallocate(c, in, len);
	} else if (type == 'B') {
		plugin_stmt_bind_sent(c, ev, rq_at(&c->link->rq, c->link->rq.count - 1));
	}
	if (plugin_query_build(c, ev, &rt->pb)) {
		struct evbuffer *out = bufferevent_get_output(c->link->bev);
		plugin_query_give_map(ev, rq_at(&c->link->rq, c->link->rq.count - 1));
		drop_message(c, in, len);
		c->link->pool->stats.bytes_received += rt->pb.len;
		pkt_send(&rt->pb, out);
		if (evbuffer_get_length(out) > WRITE_HIGH_WATER) {
			c->throttled = true;
			conn_want_read(&c->io, false);
		}
	} else {
		plugin_query_give_map(ev, rq_at(&c->link->rq, c->link->rq.count - 1));
		forward_bytes(c, in, len + 1);
		conn_set_rd_high(&c->io, CLIENT_READ_HIGH);
	}
	c->qev = NULL;
	plugin_event_free(ev);
	return !c->throttled && !c->fwd_remaining;
}

/*
 * A Parse, Bind, Describe or Close of a name whose Parse or Close (the
 * client's, pipelined) an earlier batch may yet skip: it waits until that
 * batch is answered, so that it meets the statements PostgreSQL has (a Bind
 * of a name whose Parse was skipped gets 26000, as from PostgreSQL). true:
 * it waits (client_process goes on once the answers came).
 */
static bool await_unsettled_name(struct client *c, struct evbuffer *in, uint32_t len)
{
	size_t have = evbuffer_get_length(in);

	if (have > (size_t)len + 1)
		have = (size_t)len + 1;
	if (have > PS_BIND_PEEK && !(evbuffer_pullup(in, 1)[0] == 'P' && have == (size_t)len + 1))
		have = PS_BIND_PEEK;	/* (a whole Parse: its text may be one the core answers itself) */
	if (!ps_msg_name_unsettled(c, evbuffer_pullup(in, (ssize_t)have), (uint32_t)have))
		return false;
	return plugin_client_await(c);
}

/* A plugin resumed a hook that had answered LK_ASYNC. */
void client_hook_resumed(struct client *c, struct lk_event *ev)
{
	if (c->closing)
		return;
	if (ev == c->lev) {
		if (plugin_event_hook(ev) == LK_HOOK_CLIENT_STARTUP)
			client_startup_decided(c);
		else
			client_auth_lookup_decided(c);
	}
	client_resume(c);
}

/*
 * A Parse of a name the client has, with the core's prepared statements:
 * ps_parse refuses it (42P05) as PostgreSQL would. No plugin sees it, and
 * no text is noted for the name, which keeps its statement.
 */
static bool parse_refused(const struct client *c, struct evbuffer *in, char type, uint32_t len)
{
	uint8_t head[5 + 256];
	uint32_t have = len + 1 < sizeof(head) ? len + 1 : (uint32_t)sizeof(head);

	if (type != 'P' || !c->ps_on || !c->ps)
		return false;
	if (evbuffer_copyout(in, head, have) != (ev_ssize_t)have)
		return false;
	return ps_parse_name_in_use(c, head, have);
}

/* One message of a logged-in client. Returns false to stop the loop. */
static bool client_message(struct client *c, struct evbuffer *in)
{
	uint8_t hdr[5];
	uint32_t len;

	evbuffer_copyout(in, hdr, 5);
	len = pkt_get_u32(hdr + 1);
	if (!valid_frontend(hdr[0])) {
		client_close(c, "08P01", "invalid frontend message type %d", hdr[0]);
		return false;
	}
	if (len < 4) {
		client_close(c, "08P01", "invalid message length");
		return false;
	}
	if ((int64_t)len > rt->cf->max_message_bytes) {
		client_close(c, "08P01", "message too long: %u bytes (max_message_bytes is %lld)", len,
			     (long long)rt->cf->max_message_bytes);
		return false;
	}
	if (hdr[0] == 'X') {
		client_close(c, NULL, NULL);
		return false;
	}
	if (c->state == CL_ADMIN) {
		char *sql;
		if (c->pause_wait || c->console_res)
			return false;	/* the next command waits for PAUSE's (or a plugin command's) answer */
		if (hdr[0] != 'Q') {
			client_close(c, "08P01", "the console supports only the simple query protocol");
			return false;
		}
		if (len > CONSOLE_QUERY_MAX) {
			client_close(c, "54000", "console command too long: %u bytes", len);
			return false;
		}
		if (evbuffer_get_length(in) < (size_t)len + 1)
			return false;
		evbuffer_drain(in, 5);
		sql = (char *)evbuffer_pullup(in, len - 4);
		if (len == 4 || sql[len - 5] != 0) {
			client_close(c, "08P01", "invalid query message");
			return false;
		}
		admin_handle(c, sql);
		if (!c->closing)
			evbuffer_drain(in, len - 4);
		return !c->closing;
	}
	if (hdr[0] == 'Q' && rt->cf->disable_pqexec) {	/* as PgBouncer; the console above keeps it */
		client_close(c, "08P01", "PQexec disallowed");
		return false;
	}
	if (c->ps_on && c->link && c->link->rq.syncs && !c->link->copy_in && !c->skip_to_sync && !c->qev &&
	    (hdr[0] == 'P' || hdr[0] == 'B' || hdr[0] == 'D' || hdr[0] == 'C') && await_unsettled_name(c, in, len))
		return false;
	if (c->ps_on && (hdr[0] == 'Q' || hdr[0] == 'P') && !c->skip_to_sync && !c->qev) {
		int r = dealloc_message(c, in, (char)hdr[0], len);
		if (r >= 0)
			return r;
	}
	if (c->skip_to_sync || c->watch || c->qev) {
		if (c->skip_to_sync)
			return skip_message(c, in, (char)hdr[0], len);
		if (c->qev || ((hdr[0] == 'Q' || hdr[0] == 'P' || hdr[0] == 'B') && hook_on(LK_HOOK_QUERY) &&
			       !parse_refused(c, in, (char)hdr[0], len)))
			return watched_message(c, in, (char)hdr[0], len);
	}
	if (!c->link) {
		int r = client_acquire(c, in, (char)hdr[0], len);
		if (r <= 0)
			return r < 0 && !c->closing;
	}
	c->request_time = rt->now;
	if (hdr[0] == 'C' && c->stmts)
		return stmt_close_message(c, in, len);
	return send_message(c, in, (char)hdr[0], len);
}

void client_process(struct client *c)
{
	struct evbuffer *in;

	if (c->closing || !c->bev)
		return;
	in = bufferevent_get_input(c->bev);
	log_noise("client %llu process state %d, %zu bytes", (unsigned long long)c->id, c->state, evbuffer_get_length(in));
	while (!c->closing) {
		if (c->state == CL_LOGIN) {
			if (c->lev || c->authq)
				break;	/* a plugin's CLIENT_STARTUP / AUTH_LOOKUP, or auth_query, is running */
			/* after login, what came in the same read is handled below */
			if (!(c->auth_step ? read_auth_message(c, in) : read_startup(c, in)))
				break;
			continue;
		}
		if (c->state == CL_WAITING_LOGIN || c->state == CL_WAITING)
			break;
		if (c->fwd_remaining) {
			forward_bytes(c, in, c->fwd_remaining);
			if (c->fwd_remaining || c->throttled)
				break;
			continue;
		}
		if (evbuffer_get_length(in) < 5 || !client_message(c, in))
			break;
	}
	if (!c->closing && c->bev)
		conn_read_check(&c->io);
}
