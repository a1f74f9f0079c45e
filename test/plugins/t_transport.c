/* SPDX-License-Identifier: ISC */
/*
 * t_transport -- test plugin: the transport API.
 *
 * Registers transport "t_pair". For each connection the core asks for (a
 * server login or a CancelRequest) it opens a non-blocking TCP connection to
 * connect_host:connect_port with a libevent bufferevent on api->event_base(),
 * creates a socketpair, hands one end to the core and relays bytes both ways
 * between the other end and the TCP connection.
 *
 * Settings [plugin.t_transport]:
 *   early       "1": hand the socketpair over at once (connect_ready in the
 *               callback, LK_HANDLED) and relay once TCP is up; a TCP
 *               failure then just closes the pair. Default "0": wait for the
 *               TCP connect and call connect_ready / connect_failed later
 *               (LK_ASYNC).
 *   refuse_db   a [databases] entry name whose connects fail at once
 *               (connect_failed in the callback, LK_ERROR).
 *   delay_ms    (async mode) wait this long after TCP is up before
 *               connect_ready, so a test can let the core give up on the
 *               server first: every request is still answered exactly once
 *               and the core must close the socket it no longer wants.
 *
 * SERVER_CLOSE is only counted (server_closes).
 * Console: SHOW T_TRANSPORT, one row of counters and what the last request
 * said (host, port, dbname, database, is_cancel).
 */
#include <lokadb/plugin.h>

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const lk_api *api;
static lk_plugin *me;

static long long n_streams, n_active, n_cancels, n_failed, n_ready, bytes_up, bytes_down;
static long long n_server_closes;
static char last_host[128], last_dbname[128], last_database[128];
static int last_port, last_cancel, last_has_server;

struct relay {
	lk_connect *req;		/* until connect_ready / connect_failed */
	struct bufferevent *tcp, *pair;
	int core_fd;			/* our socketpair end for the core, until handed over */
	int connected;
	int in_connect, connect_err;
	lk_timer *delay;		/* delay_ms timer, until it fires */	/* libevent may report a failure inside connect() */
	char where[160];		/* host:port, for messages */
	struct relay *next;		/* pending list (req != NULL) */
};

static struct relay *pending;

static void pending_remove(struct relay *r)
{
	struct relay **pp;

	for (pp = &pending; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	r->next = NULL;
}

static void relay_free(struct relay *r)
{
	if (r->req)
		pending_remove(r);
	if (r->tcp)
		bufferevent_free(r->tcp);
	if (r->pair)
		bufferevent_free(r->pair);
	if (r->core_fd >= 0)
		close(r->core_fd);
	if (r->delay)
		api->timer_cancel(r->delay);
	n_active--;
	free(r);
}

static void hand_over(struct relay *r)
{
	lk_connect *req = r->req;
	int fd = r->core_fd;

	pending_remove(r);
	r->req = NULL;
	r->core_fd = -1;
	n_ready++;
	api->connect_ready(req, fd);
}

static void fail_req(struct relay *r, const char *msg)
{
	lk_connect *req = r->req;

	n_failed++;
	if (req) {
		pending_remove(r);
		r->req = NULL;
		api->connect_failed(req, msg);
	}
}

static void delayed_hand_over(lk_plugin *self, void *arg)
{
	struct relay *r = arg;

	(void)self;
	r->delay = NULL;
	if (r->req)
		hand_over(r);
}

/* One side is done: close it, let the other side drain, then close that. */
static void drained_cb(struct bufferevent *bev, void *arg)
{
	struct relay *r = arg;

	(void)bev;
	relay_free(r);
}

static void side_closed(struct relay *r, struct bufferevent *closed)
{
	struct bufferevent *other = closed == r->tcp ? r->pair : r->tcp;

	if (other && evbuffer_get_length(bufferevent_get_input(closed)) > 0)
		bufferevent_write_buffer(other, bufferevent_get_input(closed));
	if (closed == r->tcp)
		r->tcp = NULL;
	else
		r->pair = NULL;
	bufferevent_free(closed);
	if (!other || evbuffer_get_length(bufferevent_get_output(other)) == 0) {
		relay_free(r);
		return;
	}
	bufferevent_disable(other, EV_READ);
	bufferevent_setcb(other, NULL, drained_cb, NULL, r);
}

static void tcp_read_cb(struct bufferevent *bev, void *arg)
{
	struct relay *r = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	bytes_down += (long long)evbuffer_get_length(in);
	if (r->pair)
		bufferevent_write_buffer(r->pair, in);
	else
		evbuffer_drain(in, evbuffer_get_length(in));
}

static void pair_read_cb(struct bufferevent *bev, void *arg)
{
	struct relay *r = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	bytes_up += (long long)evbuffer_get_length(in);
	if (r->tcp)
		bufferevent_write_buffer(r->tcp, in);
	else
		evbuffer_drain(in, evbuffer_get_length(in));
}

static void tcp_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct relay *r = arg;
	char msg[256];

	if (r->in_connect) {
		r->connect_err = EVUTIL_SOCKET_ERROR() ? EVUTIL_SOCKET_ERROR() : -1;
		return;
	}
	if (what & BEV_EVENT_CONNECTED) {
		r->connected = 1;
		if (r->req) {
			const char *d = api->setting(me, "delay_ms");
			long ms = d ? strtol(d, NULL, 10) : 0;

			if (ms > 0) {
				r->delay = api->timer_add(me, (uint64_t)ms * 1000u, 0, delayed_hand_over, r);
				if (r->delay)
					return;
			}
			hand_over(r);
		}
		return;
	}
	if (!r->connected) {
		int err = EVUTIL_SOCKET_ERROR();

		snprintf(msg, sizeof(msg), "t_pair: connect to %s failed: %s", r->where,
			 err ? evutil_socket_error_to_string(err) : "connection closed");
		if (r->req) {
			fail_req(r, msg);
		} else {
			n_failed++;
			api->log(me, LK_LOG_WARNING, "%s", msg);
		}
		relay_free(r);
		return;
	}
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		side_closed(r, bev);
}

static void pair_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct relay *r = arg;

	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		side_closed(r, bev);
}

static int t_connect(lk_plugin *self, lk_connect *req)
{
	const char *host = api->connect_host(req);
	const char *refuse = api->setting(self, "refuse_db");
	const char *early = api->setting(self, "early");
	int port = api->connect_port(req);
	struct relay *r;
	struct addrinfo hints, *ai = NULL;
	char portstr[16], msg[256];
	int sv[2], rc;

	snprintf(last_host, sizeof(last_host), "%s", host ? host : "(null)");
	snprintf(last_dbname, sizeof(last_dbname), "%s",
		 api->connect_dbname(req) ? api->connect_dbname(req) : "(null)");
	snprintf(last_database, sizeof(last_database), "%s",
		 api->connect_database(req) ? api->connect_database(req) : "(null)");
	last_port = port;
	last_cancel = api->connect_is_cancel(req);
	n_streams++;
	if (last_cancel)
		n_cancels++;

	if (refuse && *refuse && api->connect_database(req) &&
	    strcmp(refuse, api->connect_database(req)) == 0) {
		n_failed++;
		api->connect_failed(req, "t_pair refuses this database (refuse_db)");
		return LK_ERROR;
	}
	if (!host || !*host || host[0] == '/') {
		n_failed++;
		api->connect_failed(req, "t_pair needs a TCP host");
		return LK_ERROR;
	}
	/* Resolve here (blocking is fine for a test plugin: numeric hosts). */
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(portstr, sizeof(portstr), "%d", port > 0 ? port : 5432);
	rc = getaddrinfo(host, portstr, &hints, &ai);
	if (rc != 0 || !ai) {
		n_failed++;
		snprintf(msg, sizeof(msg), "t_pair: cannot resolve %s: %s", host, gai_strerror(rc));
		api->connect_failed(req, msg);
		return LK_ERROR;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
		freeaddrinfo(ai);
		n_failed++;
		api->connect_failed(req, "t_pair: socketpair failed");
		return LK_ERROR;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		freeaddrinfo(ai);
		close(sv[0]);
		close(sv[1]);
		n_failed++;
		api->connect_failed(req, "t_pair: out of memory");
		return LK_ERROR;
	}
	n_active++;
	r->req = req;
	last_has_server = api->connect_server(req) != NULL;
	r->core_fd = sv[0];
	snprintf(r->where, sizeof(r->where), "%s:%s", host, portstr);
	r->next = pending;
	pending = r;
	r->pair = bufferevent_socket_new(api->event_base(), sv[1], BEV_OPT_CLOSE_ON_FREE);
	r->tcp = bufferevent_socket_new(api->event_base(), -1, BEV_OPT_CLOSE_ON_FREE);
	if (!r->pair || !r->tcp) {
		freeaddrinfo(ai);
		if (!r->pair)
			close(sv[1]);
		fail_req(r, "t_pair: bufferevent_socket_new failed");
		relay_free(r);
		return LK_ERROR;
	}
	bufferevent_setcb(r->pair, pair_read_cb, NULL, pair_event_cb, r);
	bufferevent_setcb(r->tcp, tcp_read_cb, NULL, tcp_event_cb, r);
	bufferevent_enable(r->pair, EV_READ | EV_WRITE);
	bufferevent_enable(r->tcp, EV_READ | EV_WRITE);
	r->in_connect = 1;
	rc = bufferevent_socket_connect(r->tcp, ai->ai_addr, (int)ai->ai_addrlen);
	r->in_connect = 0;
	freeaddrinfo(ai);
	if (rc != 0 || r->connect_err) {
		snprintf(msg, sizeof(msg), "t_pair: connect to %s failed: %s", r->where,
			 r->connect_err > 0 ? evutil_socket_error_to_string(r->connect_err) : "could not start");
		fail_req(r, msg);
		relay_free(r);
		return LK_ERROR;
	}
	if (early && strcmp(early, "1") == 0) {
		hand_over(r);
		return LK_HANDLED;
	}
	return LK_ASYNC;
}

/* Only counted: a pending request stays valid until it is answered. */
static int on_server_close(lk_plugin *self, lk_event *ev)
{
	(void)self;
	(void)ev;
	n_server_closes++;
	return LK_CONTINUE;
}

static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "streams", "active", "cancels", "failed", "ready",
					     "bytes_up", "bytes_down", "last_host", "last_port",
					     "last_dbname", "last_database", "last_is_cancel",
					     "server_closes", "last_has_server" };
	static const uint32_t types[] = { LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8,
					  LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_TEXT,
					  LK_TYPE_INT4, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_BOOL,
					  LK_TYPE_INT8, LK_TYPE_BOOL };
	char b[9][32];
	const char *row[14];

	(void)self;
	(void)args;
	snprintf(b[0], 32, "%lld", n_streams);
	snprintf(b[1], 32, "%lld", n_active);
	snprintf(b[2], 32, "%lld", n_cancels);
	snprintf(b[3], 32, "%lld", n_failed);
	snprintf(b[4], 32, "%lld", n_ready);
	snprintf(b[5], 32, "%lld", bytes_up);
	snprintf(b[6], 32, "%lld", bytes_down);
	snprintf(b[7], 32, "%d", last_port);
	snprintf(b[8], 32, "%lld", n_server_closes);
	row[0] = b[0];
	row[1] = b[1];
	row[2] = b[2];
	row[3] = b[3];
	row[4] = b[4];
	row[5] = b[5];
	row[6] = b[6];
	row[7] = last_host;
	row[8] = b[7];
	row[9] = last_dbname;
	row[10] = last_database;
	row[11] = last_cancel ? "t" : "f";
	row[12] = b[8];
	row[13] = last_has_server ? "t" : "f";
	api->result_columns(res, 14, names, types);
	api->result_row(res, row);
	return LK_HANDLED;
}

static int t_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	me = self;
	if (a->transport_register(self, "t_pair", t_connect) != 0 ||
	    a->hook(self, LK_HOOK_SERVER_CLOSE, on_server_close, 0) != 0 ||
	    a->config_declare(self, "early", "0", "1: hand the socketpair over before TCP is up") != 0 ||
	    a->config_declare(self, "refuse_db", "", "a [databases] entry whose connects fail") != 0 ||
	    a->config_declare(self, "delay_ms", "0", "wait this long before connect_ready") != 0 ||
	    a->console_register(self, "SHOW T_TRANSPORT", 0, cmd_show, "t_pair counters") != 0) {
		a->init_error(self, "registration failed");
		return -1;
	}
	return 0;
}

static void t_fini(lk_plugin *self)
{
	struct relay *r;

	(void)self;
	while ((r = pending)) {
		pending_remove(r);
		r->req = NULL;
		relay_free(r);
	}
}

LK_PLUGIN("t_transport", "1.0", t_init, t_fini)
