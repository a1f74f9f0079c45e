/* SPDX-License-Identifier: ISC */
/*
 * server.c -- connections to PostgreSQL: connect (through dns.c), log in
 * (trust, cleartext, md5, SCRAM-SHA-256), then relay the server's replies to
 * the linked client.
 *
 * The server owes a reply for every message it was sent that has one, in
 * order: s->rq, the reply queue (prepared.h; client.c note_sent_to_server()
 * and prepared.c fill it). Replies to queries the pooler sent itself
 * (parameter SETs, server_reset_query) are RQ_HIDE: everything up to their
 * ReadyForQuery is dropped; of the pooler's own Parse/Close (prepared
 * statements, a plugin's re-parse) only the completion message is dropped,
 * and of its own Bind/Execute inside a client's extended-protocol batch
 * (server_send_hidden_ext) the completions and the DataRows.
 * Replies the pooler makes itself (RQ_SYNTH) go to the client when their
 * item reaches the head. When nothing is owed and the transaction status is
 * idle, the server is `ready` and the pool may take it back (transaction
 * mode) or keep it linked (session mode).
 *
 * Large replies (DataRow, CopyData) are moved to the client a piece at a time
 * without buffering whole messages.
 */
#include "core.h"
#include "scram.h"
#include "textmap.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include <event2/util.h>

static void server_read_cb(struct bufferevent *bev, void *arg);
static void server_write_cb(struct bufferevent *bev, void *arg);
static void server_event_cb(struct bufferevent *bev, short what, void *arg);

const char *server_ident(const struct server *s, char *buf, size_t len)
{
	const struct db_conf *dc = &s->pool->db->conf;
	snprintf(buf, len, "S-%llu: %s/%s@%s:%d", (unsigned long long)s->id, s->pool->db->name,
		 s->pool->login_user, dc->host ? dc->host : "unix", dc->port > 0 ? dc->port : 5432);
	return buf;
}

/* ---- connecting ---- */

static void startup_opt(struct pktbuf *pb, const char *name, const char *value)
{
	if (!value)
		return;
	pkt_put_string(pb, name);
	pkt_put_string(pb, value);
}

/* StartupMessage: user, database and the [databases] entry's parameters. */
static void server_start_login(struct server *s)
{
	struct pktbuf *pb = &rt->pb;
	const struct db_conf *dc = &s->pool->db->conf;

	pkt_begin(pb, 0);
	pkt_put_int32(pb, PROTO_V3);
	pkt_put_string(pb, "user");
	pkt_put_string(pb, s->pool->login_user);
	pkt_put_string(pb, "database");
	pkt_put_string(pb, dc->dbname ? dc->dbname : s->pool->db->name);
	startup_opt(pb, "client_encoding", dc->client_encoding);
	startup_opt(pb, "DateStyle", dc->datestyle);
	startup_opt(pb, "TimeZone", dc->timezone);
	startup_opt(pb, "application_name", dc->application_name);
	pkt_put_byte(pb, 0);
	pkt_end(pb);
	pkt_send(pb, bufferevent_get_output(s->bev));
}

static void server_connect_addr(struct server *s, const struct sockaddr *sa, socklen_t len)
{
	memcpy(&s->addr, sa, len);
	s->addrlen = len;
	s->bev = bufferevent_socket_new(rt->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!s->bev) {
		server_close(s, "out of memory");
		return;
	}
	bufferevent_setcb(s->bev, server_read_cb, server_write_cb, server_event_cb, s);
	bufferevent_setwatermark(s->bev, EV_WRITE, WRITE_LOW_WATER, 0);
	if (bufferevent_socket_connect(s->bev, (struct sockaddr *)&s->addr, (int)len) < 0) {
		pool_server_login_failed(s->pool, "08001", "could not connect to server");
		server_close(s, "connect failed: %s", strerror(errno));
		return;
	}
	if (sa->sa_family != AF_UNIX)
		tcp_tune(bufferevent_getfd(s->bev));
}

static void server_dns_done(void *arg, const struct sockaddr *sa, socklen_t len, const char *error)
{
	struct server *s = arg;
	char msg[256];

	if (error) {
		snprintf(msg, sizeof(msg), "could not translate host name \"%s\" to address: %s",
			 s->pool->db->conf.host, error);
		pool_server_login_failed(s->pool, "08001", msg);
		server_close(s, "%s", msg);
		return;
	}
	server_connect_addr(s, sa, len);
}

struct server *server_launch(struct pool *p)
{
	struct server *s = xcalloc(1, sizeof(*s));
	const struct db_conf *dc = &p->db->conf;
	int port = dc->port > 0 ? dc->port : 5432;
	char ident[160];

	s->id = ++rt->next_id;
	s->pool = p;
	s->state = SV_LOGIN;
	s->connect_time = now_wall();
	s->created = s->last_used = now_mono();
	s->txn_status = 'I';
	s->home = pool_free_home(p);
	TAILQ_INSERT_TAIL(&p->login_servers, s, entry);
	p->n_login_sv++;
	p->db->server_count++;
	log_debug("%s new connection to server", server_ident(s, ident, sizeof(ident)));
	if (dc->transport) {
		plugin_transport_connect(s);	/* server_transport_ready() / _failed() */
	} else if (!dc->host || dc->host[0] == '/') {
		struct sockaddr_un un;
		memset(&un, 0, sizeof(un));
		un.sun_family = AF_UNIX;
		snprintf(un.sun_path, sizeof(un.sun_path), "%s/.s.PGSQL.%d",
			 dc->host ? dc->host : "/var/run/postgresql", port);
		server_connect_addr(s, (struct sockaddr *)&un, sizeof(un));
	} else {
		dns_resolve(rt->dns, dc->host, port, server_dns_done, s);
	}
	return s;
}

/* ---- closing ---- */

void server_close(struct server *s, const char *reason, ...)
{
	char msg[512], ident[160];
	struct client *c = s->link;
	va_list ap;

	if (s->closing)
		return;
	s->closing = true;
	plugin_server_close(s);
	va_start(ap, reason);
	vsnprintf(msg, sizeof(msg), reason, ap);
	va_end(ap);
	if (rt->cf->log_disconnections || s->state == SV_LOGIN)
		log_info("%s closing because: %s (age=%llds)", server_ident(s, ident, sizeof(ident)), msg,
			 (long long)(s->connect_time ? (now_wall() - s->connect_time) / USEC : 0));
	dns_cancel_arg(rt->dns, s);
	if (c) {
		c->link = NULL;
		s->link = NULL;
		client_close(c, "08006", "server conn crashed? (%s)", msg);
	}
	pool_set_server_state(s, SV_JUSTFREE);
	s->pool->db->server_count--;
	server_free_now(s);
}

void server_free_now(struct server *s)
{
	plugin_server_free(s);
	if (s->bev) {
		conn_free(&s->io, s->bev);
		s->bev = NULL;
	}
	TAILQ_INSERT_TAIL(&rt->justfree_servers, s, entry);
	event_active(rt->justfree_ev, EV_TIMEOUT, 0);
}

/* The socket is connected: ask for TLS (server_tls_sslmode), or start the login. */
static void server_connected(struct server *s)
{
	s->connected = true;
	conn_write_through(&s->io, s->bev);
	if (!conn_io_start(&s->io, 0)) {
		server_close(s, "out of memory");
		return;
	}
	conn_want_read(&s->io, true);
	if (rt->cf->server_tls_sslmode != SSL_DISABLE && s->addr.ss_family != AF_UNIX && !s->pool->db->conf.transport) {
		static const uint8_t ssl_request[8] = { 0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f };
		s->tls_step = 1;
		bufferevent_write(s->bev, ssl_request, sizeof(ssl_request));
		return;
	}
	server_start_login(s);
}

static void server_tls_fail(struct server *s, const char *msg)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "could not connect to server: %s", msg);
	pool_server_login_failed(s->pool, "08001", buf);
	server_close(s, "%s", buf);
}

/* The answer to our SSLRequest: 'S' starts the handshake, 'N' goes on in plaintext (or fails). */
static void server_ssl_answer(struct server *s, struct evbuffer *in)
{
	int mode = rt->cf->server_tls_sslmode;
	uint8_t answer;
	struct ssl_st *ssl;

	if (evbuffer_remove(in, &answer, 1) != 1)
		return;
	if (answer == 'N') {
		if (mode >= SSL_REQUIRE) {
			server_tls_fail(s, "the server does not support TLS (server_tls_sslmode requires it)");
			return;
		}
		s->tls_step = 0;
		server_start_login(s);
		return;
	}
	if (answer != 'S' || evbuffer_get_length(in) > 0) {
		server_tls_fail(s, answer == 'S' ? "received unencrypted data after the SSL answer"
						 : "invalid answer to the SSL request");
		return;
	}
	ssl = tls_server_new(s->pool->db->conf.host);
	if (!ssl || !conn_start_tls(&s->io, ssl, false)) {
		server_close(s, "could not start TLS: out of memory");
		return;
	}
	s->tls_step = 2;
}

/* A plugin transport handed over a connected stream socket. */
void server_transport_ready(struct server *s, int fd)
{
	evutil_make_socket_nonblocking(fd);
	evutil_make_socket_closeonexec(fd);
	s->bev = bufferevent_socket_new(rt->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!s->bev) {
		evutil_closesocket(fd);
		server_close(s, "out of memory");
		return;
	}
	bufferevent_setcb(s->bev, server_read_cb, server_write_cb, server_event_cb, s);
	bufferevent_setwatermark(s->bev, EV_WRITE, WRITE_LOW_WATER, 0);
	server_connected(s);
}

void server_transport_failed(struct server *s, const char *msg)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "could not connect to server through transport \"%s\": %s",
		 s->pool->db->conf.transport, msg);
	pool_transport_failed(s->pool, buf);
	server_close(s, "%s", buf);
}

static void server_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct server *s = arg;
	(void)bev;
	if (what & BEV_EVENT_CONNECTED) {
		if (s->tls_step == 2) {		/* TLS handshake done */
			s->tls_step = 3;
			server_start_login(s);
			return;
		}
		server_connected(s);
		return;
	}
	if (s->tls_step == 2) {
		char buf[256];
		server_tls_fail(s, (what & BEV_EVENT_EOF) ? "server closed the connection during the TLS handshake" :
				tls_error(&s->io, buf, sizeof(buf)));
		return;
	}
	if (s->state == SV_LOGIN) {
		char msg[256];
		snprintf(msg, sizeof(msg), "could not connect to server: %s",
			 (what & BEV_EVENT_EOF) ? "server closed the connection" :
			 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		pool_server_login_failed(s->pool, "08001", msg);
		server_close(s, "%s", msg);
		return;
	}
	if (what & BEV_EVENT_EOF)
		server_close(s, "server closed the connection unexpectedly");
	else if (what & BEV_EVENT_ERROR)
		server_close(s, "server socket error: %s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
}

static void server_write_cb(struct bufferevent *bev, void *arg)
{
	struct server *s = arg;
	struct client *c = s->link;
	(void)bev;
	if (s->connected)
		conn_write_idle(s->bev);
	if (c && c->throttled && !c->closing) {
		c->throttled = false;
		conn_want_read(&c->io, true);
		client_process(c);
	}
}

static void server_read_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	server_process(arg);
}

/* ---- login ---- */

static void send_password_msg(struct server *s, const void *data, size_t len)
{
	pkt_begin(&rt->pb, 'p');
	pkt_put_bytes(&rt->pb, data, len);
	pkt_end(&rt->pb);
	pkt_send(&rt->pb, bufferevent_get_output(s->bev));
}

static bool login_auth(struct server *s, const uint8_t *body, uint32_t len)
{
	const char *pw = s->pool->login_password;
	char err[128], *out = NULL, md5[36], m[36];
	int32_t code;

	if (len < 4)
		return false;
	code = (int32_t)pkt_get_u32(body);
	switch (code) {
	case 0:
		return true;
	case 3:
		if (!pw || scram_is_md5_secret(pw) || scram_is_scram_secret(pw))
			goto nopw;
		send_password_msg(s, pw, strlen(pw) + 1);
		return true;
	case 5:
		if (!pw || len < 8 || scram_is_scram_secret(pw))
			goto nopw;
		if (!scram_is_md5_secret(pw)) {
			scram_md5_secret(s->pool->login_user, pw, m);
			pw = m;
		}
		scram_md5_answer(pw, body + 4, md5);
		send_password_msg(s, md5, strlen(md5) + 1);
		return true;
	case 10:
		if (pw && scram_is_scram_secret(pw) && s->pool->has_scram_keys)
			s->scram = scram_client_new_keys(s->pool->scram_keys, s->pool->scram_keys + 32);
		else if (!pw || scram_is_md5_secret(pw) || scram_is_scram_secret(pw))
			goto nopw;
		else
			s->scram = scram_client_new(pw);
		out = s->scram ? scram_client_first(s->scram) : NULL;
		if (!out)
			goto oom;
		pkt_begin(&rt->pb, 'p');
		pkt_put_string(&rt->pb, "SCRAM-SHA-256");
		pkt_put_int32(&rt->pb, (int32_t)strlen(out));
		pkt_put_bytes(&rt->pb, out, strlen(out));
		pkt_end(&rt->pb);
		pkt_send(&rt->pb, bufferevent_get_output(s->bev));
		free(out);
		return true;
	case 11:
		if (!s->scram || !scram_client_final(s->scram, (const char *)body + 4, len - 4, &out, err, sizeof(err)))
			goto scram_fail;
		send_password_msg(s, out, strlen(out));
		free(out);
		return true;
	case 12:
		if (!s->scram || !scram_client_verify(s->scram, (const char *)body + 4, len - 4, err, sizeof(err)))
			goto scram_fail;
		scram_client_free(s->scram);
		s->scram = NULL;
		return true;
	default:
		pool_server_login_failed(s->pool, "08P01", "server asked for an unsupported authentication method");
		server_close(s, "unsupported authentication request %d", code);
		return false;
	}
nopw:
	pool_server_login_failed(s->pool, "08P01", pw && scram_is_scram_secret(pw) ?
		"the auth_file has only a SCRAM secret for the server login and no client has logged in with it yet; "
		"set password= in [databases] or a plain secret in auth_file" :
		"no password available for server login; set password= in [databases] or a plain/md5 secret in auth_file");
	server_close(s, "server login failed: no usable password for user %s", s->pool->login_user);
	return false;
scram_fail:
	pool_server_login_failed(s->pool, "08P01", "SCRAM authentication with the server failed");
	server_close(s, "server login failed: %s", err);
	return false;
oom:
	server_close(s, "out of memory");
	return false;
}

static void remember_param(struct server *s, const uint8_t *body, uint32_t len)
{
	const char *name = (const char *)body;
	const char *val;
	size_t nl = strnlen(name, len);
	int id;

	if (nl + 1 >= len)
		return;
	val = name + nl + 1;
	if (strnlen(val, len - nl - 1) == len - nl - 1)
		return;
	id = varcache_lookup(name);
	if (id >= 0)
		varcache_set(&s->vars, (enum var_id)id, val);
	if (s->state == SV_LOGIN && !s->pool->welcome_ready) {
		struct pool *p = s->pool;
		struct param *np = realloc(p->welcome, sizeof(*np) * (size_t)(p->n_welcome + 1));
		if (!np)
			return;
		p->welcome = np;
		np[p->n_welcome].name = xstrdup(name);
		np[p->n_welcome].value = xstrdup(val);
		np[p->n_welcome].var = id;
		p->n_welcome++;
	}
}

static void error_fields(const uint8_t *body, uint32_t len, const char **code, const char **msg)
{
	const char *p = (const char *)body, *end = (const char *)body + len;
	*code = "08P01";
	*msg = "server error";
	while (p < end && *p) {
		char f = *p++;
		size_t n = strnlen(p, (size_t)(end - p));
		if (n == (size_t)(end - p))
			break;
		if (f == 'C')
			*code = p;
		else if (f == 'M')
			*msg = p;
		p += n + 1;
	}
}

/* One whole message while logging in. */
static void login_message(struct server *s, char type, const uint8_t *body, uint32_t len)
{
	const char *code, *msg;
	char ident[160];

	switch (type) {
	case 'R':
		login_auth(s, body, len);
		break;
	case 'S':
		remember_param(s, body, len);
		break;
	case 'K':
		if (len >= 8) {
			memcpy(s->cancel_key, body, 8);
			s->backend_pid = (int)pkt_get_u32(body);
		}
		break;
	case 'E':
		error_fields(body, len, &code, &msg);
		log_warning("%s server login failed: %s", server_ident(s, ident, sizeof(ident)), msg);
		pool_server_login_failed(s->pool, code, msg);
		server_close(s, "server login failed: %s", msg);
		break;
	case 'Z':
		s->txn_status = len ? (char)body[0] : 'I';
		s->ready = true;
		if (s->pool->db->conf.connect_query) {
			server_send_hidden(s, s->pool->db->conf.connect_query);
			pool_set_server_state(s, SV_TESTED);
			break;
		}
		pool_server_ready(s);
		break;
	default:
		break;	/* NoticeResponse, NegotiateProtocolVersion */
	}
}

/* ---- relaying ---- */

/* Queue a query whose replies are dropped (SETs, reset, connect_query). */
void server_send_hidden(struct server *s, const char *sql)
{
	if (!server_expect(s, 'Q', RQ_HIDE))
		return;
	pkt_query(&rt->pb, sql);
	pkt_send(&rt->pb, bufferevent_get_output(s->bev));
	s->ready = false;
	plugin_tvars_hidden_sent(s);
}

/*
 * `sql`, one statement, where a simple Query may not go: inside the client's
 * extended-protocol batch (a Query would end it, and after an error in it
 * PostgreSQL would skip the Query, whose ReadyForQuery then never comes) or
 * before a Bind of the unnamed statement (a Query drops that statement). It
 * runs as the pooler's own named statement and portal: Close of the
 * statement, Parse, Bind, Execute, Close of the portal, Close of the
 * statement, every reply hidden. An error reaches the client like one of its
 * own batch's (PostgreSQL then skips the batch up to its Sync). What it sets
 * lives or dies with the client's transaction.
 */
#define HIDDEN_EXT_NAME "lokadb_hidden_ext"

void server_send_hidden_ext(struct server *s, const char *sql)
{
	struct pktbuf *pb = &rt->pb;
	static const char order[] = "CPBECC";

	for (const char *t = order; *t; t++)
		if (!server_expect(s, *t, RQ_HIDE))
			return;
	pkt_close(pb, 'S', HIDDEN_EXT_NAME);	/* left over if an error stopped the last run */
	pkt_parse(pb, HIDDEN_EXT_NAME, sql);
	pkt_bind(pb, HIDDEN_EXT_NAME, HIDDEN_EXT_NAME);	/* portal, statement */
	pkt_execute(pb, HIDDEN_EXT_NAME);
	pkt_close(pb, 'P', HIDDEN_EXT_NAME);	/* a named portal lives until the transaction ends */
	pkt_close(pb, 'S', HIDDEN_EXT_NAME);
	pkt_send(pb, bufferevent_get_output(s->bev));
	s->ext_open = true;
}

static void move_bytes(struct server *s, struct evbuffer *in, uint32_t n)
{
	size_t avail = evbuffer_get_length(in);
	uint32_t take = avail < n ? (uint32_t)avail : n;
	struct client *c = s->link;

	if (s->fwd_hidden || !c || c->closing) {
		evbuffer_drain(in, take);
	} else {
		struct evbuffer *out = bufferevent_get_output(c->bev);
		if (take == avail) {	/* the whole input: sent at once, or its chains move, nothing is copied or split */
			if (take - conn_send_from(&c->io, in, take) > 0)
				evbuffer_add_buffer(out, in);
		} else {
			evbuffer_remove_buffer(in, out, take);
		}
		s->pool->stats.bytes_sent += take;
		if (evbuffer_get_length(out) > WRITE_HIGH_WATER) {
			s->throttled = true;
			conn_want_read(&s->io, false);
		}
	}
	s->fwd_remaining = n - take;
}

/*
 * Pass-through messages are not moved one by one: whole messages that go
 * the same way (forwarded, or dropped) collect in s->batch and move to the
 * client with one evbuffer_remove_buffer() (RowDescription, DataRows,
 * CommandComplete and ReadyForQuery of a small reply: one move instead of
 * four, and one round of buffer callbacks). Anything that looks at the input
 * at offset 0, writes to the client itself or may hand the server to
 * another client flushes the batch first; server_process() flushes it
 * before it returns.
 */
static void batch_flush(struct server *s, struct evbuffer *in)
{
	bool hidden = s->fwd_hidden;
	uint32_t n = s->batch;

	if (!n)
		return;
	s->batch = 0;
	s->fwd_hidden = s->batch_hidden;
	move_bytes(s, in, n);
	s->fwd_hidden = hidden;
}

/* The next n bytes after the batch (all of them in `in`) go the way s->fwd_hidden says. */
static void batch_take(struct server *s, struct evbuffer *in, uint32_t n)
{
	if (s->batch && s->batch_hidden != s->fwd_hidden)
		batch_flush(s, in);
	s->batch_hidden = s->fwd_hidden;
	s->batch += n;
}

/* Is the whole message of n bytes (type byte included) in `in` after the batch? */
static bool batch_whole(struct server *s, struct evbuffer *in, uint32_t n)
{
	return evbuffer_get_length(in) >= (size_t)s->batch + n;
}

static void account_rfq(struct server *s, char status)
{
	struct lk_stats *st = &s->pool->stats;
	usec_t now = rt->now;

	st->query_count++;
	st->query_time += (uint64_t)(now - s->query_start);
	s->query_start = now;
	s->in_query = s->rq.count > 0;
	if (status == 'I' && s->in_xact) {
		st->xact_count++;
		st->xact_time += (uint64_t)(now - s->xact_start);
		s->in_xact = false;
	}
}

static void server_became_ready(struct server *s)
{
	struct client *c = s->link;

	s->last_used = rt->now;
	if (s->state == SV_TESTED) {
		s->checked = true;
		pool_server_ready(s);
		return;
	}
	if (!c)
		return;
	if (hook_on(LK_HOOK_TXN_END)) {
		plugin_txn_end(c, s);
		if (s->link != c || s->closing)
			return;
	}
	if (pool_mode_of(s->pool) != POOL_SESSION)
		pool_release(s);
}

/* Does the reply `type` complete the message of queue item `it`? */
static bool completes(const struct rq_item *it, char type)
{
	switch (type) {
	case '1': return it->type == 'P';
	case '2': return it->type == 'B';
	case '3': return it->type == 'C';
	case 'T':
	case 'n': return it->type == 'D';
	case 'C':
	case 'I':
	case 's': return it->type == 'E';
	default: return false;
	}
}

/* ReadyForQuery: 6 bytes are in `in`. */
static void handle_rfq(struct server *s, struct evbuffer *in, const uint8_t *hdr)
{
	struct rq_item *it;
	char status = (char)hdr[5];
	struct client *c = s->link;
	bool client_rfq = false, hidden_rfq = false, vars = false, vars_err = false, ext = false;
	uint32_t ext_seq = 0;

	s->fwd_hidden = true;
	while ((it = rq_head(&s->rq))) {
		/* (skipping: a Query sent since the error was skipped too, to the Sync) */
		if (rq_owes_ready(it->type) && (!s->skipping || it->type == 'S')) {
			client_rfq = it->act != RQ_HIDE;
			hidden_rfq = !client_rfq;
			vars = it->vars;
			vars_err = it->vars_err;
			ext = it->vars_ext;
			ext_seq = it->ext_seq;
			if (ext && s->ext_live)
				s->ext_live--;
			s->fwd_hidden = !client_rfq;
			rq_pop(&s->rq);
			break;
		}
		rq_discard_batch(s, false);	/* unanswered messages before it: the server skipped them */
	}
	if (client_rfq)
		account_rfq(s, status);
	if (vars)
		plugin_tvars_inline_rfq(s, status, vars_err);
	else if (hidden_rfq)
		plugin_tvars_hidden_rfq(s, status);
	if (ext)
		plugin_tvars_ext_rfq(s, ext_seq, status == 'I' && !s->ext_err);
	s->txn_marked |= s->rq.marked_gone;	/* (answered up to this ReadyForQuery) */
	s->rq.marked_gone = false;
	if (client_rfq && status == 'I') {	/* (TXN_END's ev_txn_failed) */
		s->txn_failed = s->rfq_err || s->txn_status == 'E';
		if (s->txn_marked)
			s->marked_failed |= s->txn_failed;
		s->txn_marked = false;
	}
	s->ext_err = false;
	s->rfq_err = false;
	s->skipping = false;
	if (!s->rq.count)
		s->ext_live = 0;
	s->txn_status = status;
	batch_take(s, in, 6);
	batch_flush(s, in);
	rq_flush_synth(s);
	if (c && c->answer_waits)
		plugin_client_answered(c);	/* told after TXN_END, from the loop */
	if (s->rq.count || status != 'I' || s->copy_in || s->ext_open) {
		/* ext_open: a prefix answered while the client's batch has no Sync yet */
		if (c && status != 'I' && pool_mode_of(s->pool) == POOL_STATEMENT && !s->rq.count)
			client_close(c, "08P01", "transaction blocks not allowed in statement pooling mode");
		return;
	}
	s->ready = true;
	if (c && !c->closing)
		conn_send_now(&c->io);
	server_became_ready(s);
}

/*
 * CommandComplete tags the pooler acts on: after DISCARD ALL or DEALLOCATE
 * ALL the session has no prepared statement left (for_client: the client ran
 * it: its names go too); a ROLLBACK (also of a failed COMMIT, or to a
 * savepoint) while values sent inside a batch wait for their ReadyForQuery
 * may have undone them, though that ReadyForQuery says idle. Only messages
 * of those lengths are looked at. false: the message is not all here yet.
 */
static bool check_tag_wanted(const struct server *s, uint32_t len)
{
	return len == 4 + sizeof("DISCARD ALL") || len == 4 + sizeof("DEALLOCATE ALL") ||
	       (len == 4 + sizeof("ROLLBACK") && (s->ext_live || s->ext_armed));
}

static bool check_tag(struct server *s, struct evbuffer *in, uint32_t len, bool for_client)
{
	const char *tag;

	if (!check_tag_wanted(s, len))
		return true;
	if (evbuffer_get_length(in) < (size_t)len + 1)
		return false;
	tag = (const char *)evbuffer_pullup(in, len + 1) + 5;
	if (strcmp(tag, "DISCARD ALL") == 0 || strcmp(tag, "DEALLOCATE ALL") == 0) {
		ps_statements_dropped(s, for_client);
		if (for_client && s->link)
			plugin_stmts_dropped(s->link, rq_head(&s->rq) ? rq_head(&s->rq)->st_gen_at : 0);
	}
	else if (strcmp(tag, "ROLLBACK") == 0)
		s->ext_err = true;	/* values sent inside the batch: not taken as known */
	return true;
}

/*
 * The reply that completes the message at the head of the queue: forwarded
 * (or dropped, for the pooler's own message), then the replies the pooler
 * makes itself that were waiting behind it.
 */
static bool complete_head(struct server *s, struct evbuffer *in, const uint8_t *hdr, uint32_t len)
{
	struct rq_item *it = rq_head(&s->rq);

	if (hdr[0] == 'C' && check_tag_wanted(s, len)) {
		batch_flush(s, in);
		if (!check_tag(s, in, len, it->act != RQ_HIDE))
			return false;
	}
	s->fwd_hidden = it->act == RQ_HIDE;
	rq_pop(&s->rq);
	if (batch_whole(s, in, len + 1)) {
		batch_take(s, in, len + 1);
	} else {
		batch_flush(s, in);
		move_bytes(s, in, len + 1);
	}
	if ((it = rq_head(&s->rq)) && it->act == RQ_SYNTH) {
		batch_flush(s, in);	/* the pooler's own replies go after it */
		rq_flush_synth(s);
	}
	return true;
}

/*
 * An error or notice (type) of a client message whose text the client did
 * not write as sent: values put in front (query_vars_inline, it->shift) or
 * a plugin's rewrite (it->map): into pb as the client must see it
 * (textmap_error). false: forward it as it is.
 */
static bool fix_error(struct pktbuf *pb, char type, const uint8_t *body, uint32_t len, const struct rq_item *it)
{
	return it && (it->shift || it->map) && textmap_error(pb, type, body, len, it->shift, it->map);
}

/* pb, built by fix_error, to the client in place of the len + 1 bytes of `in`. */
static void send_fixed(struct server *s, struct evbuffer *in, uint32_t len, struct pktbuf *pb)
{
	struct client *c = s->link;

	evbuffer_drain(in, len + 1);
	if (c && !c->closing) {
		s->pool->stats.bytes_sent += pb->len;
		pkt_send(pb, bufferevent_get_output(c->bev));
	}
	pkt_free(pb);
}

/* A message the pooler reads whole; returns false when it is not all here. */
static bool inspect_message(struct server *s, struct evbuffer *in, const uint8_t *hdr, uint32_t len)
{
	const uint8_t *body;
	char type = (char)hdr[0];

	if (evbuffer_get_length(in) < (size_t)len + 1)
		return false;
	body = evbuffer_pullup(in, len + 1) + 5;
	if (type == 'S') {
		remember_param(s, body, len - 4);
		if (s->link && !s->fwd_hidden) {
			int id = varcache_lookup((const char *)body);
			if (id >= 0)
				varcache_set(&s->link->vars, (enum var_id)id, s->vars.v[id]);
		}
	} else if (type == 'E' && s->fwd_hidden) {
		const char *code, *msg;
		char ident[160];
		error_fields(body, len - 4, &code, &msg);
		log_warning("%s query of the pooler failed: %s (%s)", server_ident(s, ident, sizeof(ident)), msg, code);
		plugin_tvars_hidden_error(s);
		if (s->state == SV_TESTED)
			s->close_needed = true;	/* a failed check, reset or connect_query: not reused */
	} else if (type == 'E') {
		struct rq_item *head = rq_head(&s->rq);
		struct pktbuf pb;
		bool fixed;
		s->copy_in = false;	/* an error ends COPY IN */
		s->ext_err = true;	/* values sent inside the batch did not stick */
		s->rfq_err = true;
		if (head && head->type == 'Q' && head->vars) {
			head->hide_cc = 0;	/* the Query stops here: no SET's reply comes after */
			head->vars_err = true;
		}
		if (head && head->type == 'Q' && head->st_undo)
			plugin_stmt_query_failed(s->link, head);	/* (a DEALLOCATE name in it did not run) */
		pkt_init(&pb);
		fixed = fix_error(&pb, type, body, len - 4, head);	/* before the batch's items go */
		/* after an extended-protocol message PostgreSQL skips the batch up to its
		 * Sync; a client without one in flight has the rest of its batch dropped
		 * up to the Sync it sends (not a message a plugin's hook holds: that
		 * one goes on when decided, and the server skips it) */
		if (head && !rq_owes_ready(head->type) && !rq_discard_batch(s, true) && s->link) {
			if (s->link->qev)
				s->skipping = true;
			else
				s->link->skip_to_sync = true;
		}
		if (fixed) {
			send_fixed(s, in, len, &pb);
			return true;
		}
		pkt_free(&pb);
	} else if (type == 'N') {	/* server_message: a notice of a Query with values in front, or rewritten */
		struct pktbuf pb;
		pkt_init(&pb);
		if (fix_error(&pb, type, body, len - 4, rq_head(&s->rq))) {
			send_fixed(s, in, len, &pb);
			return true;
		}
		pkt_free(&pb);
	}
	move_bytes(s, in, len + 1);
	return true;
}

/* n bytes of `in` from offset off, false when they are not all there. */
static bool copy_at(struct evbuffer *in, size_t off, uint8_t *out, size_t n)
{
	struct evbuffer_ptr at;

	/* the usual case: the first chain holds them (a reply read in one recv): pullup then copies nothing */
	if (evbuffer_get_contiguous_space(in) >= off + n) {
		memcpy(out, evbuffer_pullup(in, (ev_ssize_t)(off + n)) + off, n);
		return true;
	}
	return evbuffer_ptr_set(in, &at, off, EVBUFFER_PTR_SET) == 0 && evbuffer_copyout_from(in, &at, out, n) == (ev_ssize_t)n;
}

/*
 * A RowDescription of a statement whose result tables a plugin gave
 * (api->query_result_tables): renamed in place, where it is in `in`
 * (after the batch). false: not all of it has arrived.
 */
static bool fix_row_description(struct server *s, struct evbuffer *in, uint32_t len, const struct lk_tables *t)
{
	size_t end = (size_t)s->batch + len + 1;

	if (evbuffer_get_length(in) < end) {
		batch_flush(s, in);	/* what came before it goes on */
		return false;
	}
	rt_fix_row_description(t, evbuffer_pullup(in, (ev_ssize_t)end) + s->batch + 5, len - 4);
	return true;
}

static bool server_message(struct server *s, struct evbuffer *in)
{
	uint8_t hdr[6];
	uint32_t len;
	char type;
	struct rq_item *head;

	if (!copy_at(in, s->batch, hdr, 5))
		return false;
	type = (char)hdr[0];
	len = pkt_get_u32(hdr + 1);
	if (len < 4) {
		server_close(s, "invalid message length from server");
		return false;
	}
	head = rq_head(&s->rq);
	/* the pooler's Query: all of its replies; its Execute (server_send_hidden_ext): its
	 * rows and notices (not errors, nor a NOTIFY for the client; PostgreSQL reports
	 * changed settings with the ReadyForQuery, which is the client's) */
	s->fwd_hidden = head && head->act == RQ_HIDE &&
			(head->type == 'Q' || (head->type == 'E' && (type == 'D' || type == 'N')));
	if (type == 'C' && head && head->type == 'Q' && head->hide_cc) {
		head->hide_cc--;	/* a SET put in front of the client's Query */
		s->fwd_hidden = true;
	}
	switch (type) {
	case 'Z':
		if (len != 5) {
			server_close(s, "invalid ReadyForQuery from server");
			return false;
		}
		if (!copy_at(in, s->batch, hdr, 6))
			return false;
		handle_rfq(s, in, hdr);		/* its 6 bytes leave with the batch */
		return true;
	case 'T':
		if (head && head->tables && !s->fwd_hidden && !fix_row_description(s, in, len, head->tables))
			return false;
		/* fall through */
	case '1':
	case '2':
	case '3':
	case 'n':
	case 'C':
	case 'I':
	case 's':
		if (head && completes(head, type))
			return complete_head(s, in, hdr, len);
		if (type == 'C' && check_tag_wanted(s, len)) {
			batch_flush(s, in);
			if (!check_tag(s, in, len, !s->fwd_hidden))	/* a Query's */
				return false;
		}
		break;
	case 'G':
		batch_flush(s, in);
		s->copy_in = true;
		if (s->link && s->link->answer_waits)
			plugin_client_answered(s->link);	/* it waits for the client's data now */
		/* a COPY started by Execute: PostgreSQL ignores the Sync already sent */
		if (head && head->type == 'E' && rq_at(&s->rq, 1) && rq_at(&s->rq, 1)->type == 'S') {
			struct rq_item *sync = rq_at(&s->rq, 1);
			if (sync->vars_ext) {	/* the Sync after the COPY answers for them */
				s->ext_armed = true;
				s->ext_seq = sync->ext_seq;
				if (s->ext_live)
					s->ext_live--;	/* counted again when marked */
			}
			rq_remove(&s->rq, 1);
		}
		break;
	case 'S':
	case 'E':
		batch_flush(s, in);
		return inspect_message(s, in, hdr, len);
	case 'N':	/* a warning's position, like an error's (inspect_message) */
		if (head && (head->shift || head->map) && !s->fwd_hidden) {
			batch_flush(s, in);
			return inspect_message(s, in, hdr, len);
		}
		break;
	default:
		break;
	}
	if (batch_whole(s, in, len + 1)) {
		batch_take(s, in, len + 1);
		return true;
	}
	batch_flush(s, in);
	move_bytes(s, in, len + 1);	/* a message still arriving: forwarded as it comes */
	return true;
}

static void login_step(struct server *s, struct evbuffer *in)
{
	uint8_t hdr[5];
	uint32_t len;

	while (!s->closing && s->state == SV_LOGIN && evbuffer_get_length(in) >= 5) {
		evbuffer_copyout(in, hdr, 5);
		len = pkt_get_u32(hdr + 1);
		if (len < 4 || len > STARTUP_MAX_LEN * 100) {
			pool_server_login_failed(s->pool, "08P01", "invalid message from server during login");
			server_close(s, "invalid message during login");
			return;
		}
		if (evbuffer_get_length(in) < (size_t)len + 1)
			return;
		login_message(s, (char)hdr[0], evbuffer_pullup(in, len + 1) + 5, len - 4);
		if (s->bev)
			evbuffer_drain(in, len + 1);
	}
}

void server_process(struct server *s)
{
	struct evbuffer *in;

	if (s->closing || !s->bev)
		return;
	in = bufferevent_get_input(s->bev);
	while (!s->closing && !s->throttled) {
		if (s->tls_step == 1) {
			server_ssl_answer(s, in);
			if (s->tls_step == 1 || s->closing)
				break;
			in = bufferevent_get_input(s->bev);
			continue;
		}
		if (s->state == SV_LOGIN) {
			login_step(s, in);
			if (s->state == SV_LOGIN)
				break;
			continue;
		}
		if (s->fwd_remaining) {
			move_bytes(s, in, s->fwd_remaining);
			if (s->fwd_remaining)
				break;
			rq_flush_synth(s);
			continue;
		}
		if (evbuffer_get_length(in) < (size_t)s->batch + 5 || !server_message(s, in))
			break;
	}
	if (!s->closing && s->bev)
		batch_flush(s, bufferevent_get_input(s->bev));
}

/* ---- cancel ---- */

struct cancel_req {
	LIST_ENTRY(cancel_req) entry;
	struct bufferevent *bev;
	usec_t arrived;		/* monotonic; cancel_wait_timeout counts from here */
};

static void cancel_free(struct cancel_req *cr)
{
	LIST_REMOVE(cr, entry);
	bufferevent_free(cr->bev);
	free(cr);
}

static void cancel_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct cancel_req *cr = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		return;
	if (what & BEV_EVENT_TIMEOUT)	/* PgBouncer's line */
		log_warning("cancel request closing because: cancel_wait_timeout (age=%llds)",
			    (long long)((now_mono() - cr->arrived) / USEC));
	cancel_free(cr);
}

/* At exit: drop cancel requests still on their way. */
void server_cancel_free_all(void)
{
	while (!LIST_EMPTY(&rt->cancel_reqs))
		cancel_free(LIST_FIRST(&rt->cancel_reqs));
}

static void cancel_write_cb(struct bufferevent *bev, void *arg)
{
	(void)bev;
	(void)arg;	/* sent; PostgreSQL closes the connection, seen in cancel_event_cb */
}

static struct cancel_req *cancel_new(int fd)
{
	struct cancel_req *cr = xcalloc(1, sizeof(*cr));
	cr->bev = bufferevent_socket_new(rt->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!cr->bev) {
		if (fd >= 0)
			evutil_closesocket(fd);
		free(cr);
		return NULL;
	}
	cr->arrived = now_mono();
	LIST_INSERT_HEAD(&rt->cancel_reqs, cr, entry);
	return cr;
}

/*
 * Callbacks only once the connection is under way: a connect that fails at
 * once runs the event callback inside bufferevent_socket_connect(), which
 * would free the request before the caller does.
 */
static void cancel_start(struct cancel_req *cr, const uint8_t *pkt)
{
	usec_t limit = rt->cf->cancel_wait_timeout;
	struct timeval tv = { (time_t)(limit / USEC), (suseconds_t)(limit % USEC) };

	bufferevent_setcb(cr->bev, NULL, cancel_write_cb, cancel_event_cb, cr);
	if (limit > 0)		/* connecting, sending, and waiting for the server to close */
		bufferevent_set_timeouts(cr->bev, &tv, &tv);
	bufferevent_write(cr->bev, pkt, 16);
	bufferevent_enable(cr->bev, EV_READ);
}

/* A plugin transport opened a connection for a CancelRequest. */
void server_cancel_fd(const uint8_t *pkt16, int fd)
{
	struct cancel_req *cr;

	evutil_make_socket_nonblocking(fd);
	evutil_make_socket_closeonexec(fd);
	if ((cr = cancel_new(fd)))
		cancel_start(cr, pkt16);
}

void server_cancel(struct server *s)
{
	struct cancel_req *cr;
	uint8_t pkt[16];

	if (!s->backend_pid || (!s->addrlen && !s->pool->db->conf.transport))
		return;
	pkt[0] = 0; pkt[1] = 0; pkt[2] = 0; pkt[3] = 16;
	pkt[4] = (PROTO_CANCEL_CODE >> 24) & 0xff;
	pkt[5] = (PROTO_CANCEL_CODE >> 16) & 0xff;
	pkt[6] = (PROTO_CANCEL_CODE >> 8) & 0xff;
	pkt[7] = PROTO_CANCEL_CODE & 0xff;
	memcpy(pkt + 8, s->cancel_key, 8);
	if (s->pool->db->conf.transport) {
		plugin_transport_cancel(s, pkt);
		return;
	}
	cr = cancel_new(-1);
	if (!cr)
		return;
	if (bufferevent_socket_connect(cr->bev, (struct sockaddr *)&s->addr, (int)s->addrlen) < 0)
		cancel_free(cr);
	else
		cancel_start(cr, pkt);
}
