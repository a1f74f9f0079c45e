/* SPDX-License-Identifier: ISC */
/*
 * runtime.c -- the runtime object: listen sockets, the event loop's timers
 * and signals, reload and shutdown. main.c drives it; tests and fuzzers link
 * it without main.c.
 *
 * Signals as PgBouncer 1.23+: HUP reloads, TERM waits for clients to leave,
 * INT waits for servers to be released, QUIT exits at once; USR1 pauses,
 * USR2 resumes.
 *
 * Listen sockets are opened before daemonizing so that a busy port is
 * reported on the terminal; the event base is created after the fork.
 *
 * Several processes on one port (so_reuseport), as PgBouncer: TCP listeners
 * get SO_REUSEPORT and the kernel spreads new connections over them; a unix
 * socket cannot be shared that way, so each process needs its own
 * unix_socket_dir (or none). A process never takes over a unix socket
 * another live process listens on, and removes only the socket file it
 * created itself. Shutting down (SIGTERM, SIGINT, SHUTDOWN WAIT_FOR_*)
 * closes the TCP listeners (after a short grace when waiting for clients,
 * see begin_close_tcp_listeners()), so the kernel sends new connections to
 * the other processes on the port while this one finishes its clients (a
 * rolling restart); the unix socket stays open for the console.
 */
#include "core.h"
#include "scram.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/util.h>

#define TCP_CLOSE_GRACE_USEC 100000	/* shutdown: TCP listeners close this long after the signal */

static struct lk_runtime runtime;
struct lk_runtime *rt = &runtime;

/* ---- file descriptor limit ---- */

#define NOFILE_SLACK 64		/* listeners, log file, DNS, plugins' own connections */

/* The users pools are made for: each auth_file user and each [users] entry; with their own sizes summed. */
struct fd_users {
	long n;				/* users (at least 1: a user with the entries' sizes) */
	long n_size, sum_size;		/* users whose [users] entry sets pool_size, and its sum */
	long n_reserve, sum_reserve;	/* the same for reserve_pool_size */
};

static void fd_users_add(struct fd_users *fu, const struct user_conf *uc)
{
	fu->n++;
	if (uc && uc->pool_size >= 0) {
		fu->n_size++;
		fu->sum_size += uc->pool_size;
	}
	if (uc && uc->reserve_pool_size >= 0) {
		fu->n_reserve++;
		fu->sum_reserve += uc->reserve_pool_size;
	}
}

static struct fd_users fd_users_of(const struct lk_config *cf)
{
	struct fd_users fu = { 0 };

	for (int a = 0; a < cf->n_auth; a++)
		fd_users_add(&fu, config_find_user(cf, cf->auth[a].user));
	for (int u = 0; u < cf->n_users; u++)
		if (!config_find_auth(cf, cf->users[u].name))	/* else counted above */
			fd_users_add(&fu, &cf->users[u]);
	if (fu.n == 0)
		fd_users_add(&fu, NULL);
	return fu;
}

/*
 * Server connections the [databases] entries may open, pool_size plus
 * reserve_pool_size per pool as pool.c sizes them: forced-user entries once,
 * others once per user (all_users false: for one user with the entry's sizes).
 */
static long pool_fds(const struct lk_config *cf, bool all_users)
{
	struct fd_users fu = all_users ? fd_users_of(cf) : (struct fd_users){ .n = 1 };
	long n = 0;

	for (int i = 0; i < cf->n_dbs; i++) {
		const struct db_conf *d = &cf->dbs[i];

		if (d->user) {
			n += (long)config_pool_size(cf, d, d->user) + config_reserve_pool_size(cf, d, d->user);
			continue;
		}
		n += (fu.n - fu.n_size) * config_pool_size(cf, d, NULL) + fu.sum_size;
		n += (fu.n - fu.n_reserve) * config_reserve_pool_size(cf, d, NULL) + fu.sum_reserve;
	}
	return n;
}

/*
 * Raise the soft RLIMIT_NOFILE towards what max_client_conn and the pools may
 * need, up to the hard limit, so that a default max_client_conn of 1000 works
 * under a shell's soft limit of 1024. The estimate counts the pools once per
 * user, as PgBouncer's does, with each user's [users] pool_size and
 * reserve_pool_size; only falling short of one pool per
 * database (the least a full max_client_conn needs) is a warning.
 */
void runtime_raise_nofile(void)
{
	const struct lk_config *cf = rt->cf;
	long need_min = cf->max_client_conn + NOFILE_SLACK + pool_fds(cf, false);
	long need = cf->max_client_conn + NOFILE_SLACK + pool_fds(cf, true);
	struct rlimit lim;

	if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
		log_warning("could not get RLIMIT_NOFILE: %s", strerror(errno));
		return;
	}
	if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (rlim_t)need) {
		struct rlimit want = { (rlim_t)need, lim.rlim_max };
		if (lim.rlim_max != RLIM_INFINITY && want.rlim_cur > lim.rlim_max)
			want.rlim_cur = lim.rlim_max;
		if (want.rlim_cur > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &want) == 0)
			lim.rlim_cur = want.rlim_cur;
	}
	log_info("kernel file descriptor limit: %ld (hard: %ld); max_client_conn: %d, max expected fd use: %ld",
		 (long)lim.rlim_cur, (long)lim.rlim_max, cf->max_client_conn, need);
	if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (rlim_t)need_min)
		log_warning("file descriptor limit %ld is below the %ld that max_client_conn and the pools need; "
			    "raise the hard limit (ulimit -Hn, systemd LimitNOFILE=)", (long)lim.rlim_cur, need_min);
}

/* ---- listen sockets ---- */

static bool add_listener(int fd, const char *name, bool is_unix, const char *path)
{
	struct listener *l;
	struct listener *n = realloc(rt->listeners, sizeof(*n) * (size_t)(rt->n_listeners + 1));
	if (!n)
		return false;
	rt->listeners = n;
	l = &n[rt->n_listeners++];
	memset(l, 0, sizeof(*l));
	l->fd = fd;
	l->is_unix = is_unix;
	l->unix_path = path ? xstrdup(path) : NULL;
	snprintf(l->name, sizeof(l->name), "%s", name);
	return true;
}

static bool listen_tcp(const char *host, int port)
{
	struct addrinfo hints, *res = NULL, *ai;
	char portstr[16];
	int rc, n = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%d", port);
	rc = getaddrinfo(strcmp(host, "*") == 0 ? NULL : host, portstr, &hints, &res);
	if (rc != 0) {
		log_error("could not resolve listen_addr \"%s\": %s", host, gai_strerror(rc));
		return false;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0), on = 1;
		char name[128], h[64];
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
		if (rt->cf->so_reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) < 0) {
			log_error("could not set SO_REUSEPORT on %s port %d: %s", host, port, strerror(errno));
			close(fd);
			continue;
		}
		if (ai->ai_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
		/* as PgBouncer on Linux: accept() only once the startup packet is there */
		setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &on, sizeof(on));
		tcp_tune_listener(fd);
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, rt->cf->listen_backlog) < 0) {
			log_error("could not listen on %s port %d: %s", host, port, strerror(errno));
			close(fd);
			continue;
		}
		getnameinfo(ai->ai_addr, ai->ai_addrlen, h, sizeof(h), NULL, 0, NI_NUMERICHOST);
		snprintf(name, sizeof(name), "%s:%d", h, port);
		add_listener(fd, name, false, NULL);
		log_info("listening on %s", name);
		n++;
	}
	freeaddrinfo(res);
	return n > 0;
}

/*
 * A socket file at `path` that a live process accepts on is in use: taking it
 * over would leave that process unreachable (and its exit would remove ours).
 * A file nobody accepts on is stale and may be replaced.
 */
static bool unix_socket_in_use(const struct sockaddr_un *un)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool used;

	if (fd < 0)
		return false;
	used = connect(fd, (const struct sockaddr *)un, sizeof(*un)) == 0;
	close(fd);
	return used;
}

static bool listen_unix(const char *dir, int port)
{
	struct sockaddr_un un;
	struct stat st;
	int fd;

	memset(&un, 0, sizeof(un));
	un.sun_family = AF_UNIX;
	snprintf(un.sun_path, sizeof(un.sun_path), "%s/.s.PGSQL.%d", dir, port);
	if (unix_socket_in_use(&un)) {
		log_error("could not listen on unix socket %s: another process listens on it "
			  "(with so_reuseport each process needs its own unix_socket_dir, or none)", un.sun_path);
		return false;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	unlink(un.sun_path);
	if (bind(fd, (struct sockaddr *)&un, sizeof(un)) < 0 || listen(fd, rt->cf->listen_backlog) < 0) {
		log_error("could not listen on unix socket %s: %s", un.sun_path, strerror(errno));
		close(fd);
		return false;
	}
	chmod(un.sun_path, (mode_t)rt->cf->unix_socket_mode);
	add_listener(fd, un.sun_path, true, un.sun_path);
	if (stat(un.sun_path, &st) == 0)
		rt->listeners[rt->n_listeners - 1].unix_ino = (unsigned long long)st.st_ino;
	log_info("listening on %s", un.sun_path);
	return true;
}

bool runtime_open_listeners(void)
{
	const struct lk_config *cf = rt->cf;
	bool ok = true;

	if (cf->listen_addr && *cf->listen_addr) {
		char *list = xstrdup(cf->listen_addr), *save = NULL;
		for (char *h = strtok_r(list, ", ", &save); h; h = strtok_r(NULL, ", ", &save))
			ok = listen_tcp(h, cf->listen_port) && ok;
		free(list);
	}
	if (cf->unix_socket_dir && *cf->unix_socket_dir)
		ok = listen_unix(cf->unix_socket_dir, cf->listen_port) && ok;
	if (rt->n_listeners == 0) {
		log_error("nothing to listen on: set listen_addr or unix_socket_dir");
		return false;
	}
	return ok;
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct listener *li = arg;
	(void)l;
	client_accept(fd, sa, salen, li->is_unix);
}

#define ACCEPT_FAIL_LOG_USEC (10 * USEC)	/* "accept() failed" at most this often */

static bool accept_out_of_resources(int err)
{
	return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/*
 * An accept() that failed for lack of descriptors or memory leaves the
 * connection queued, so the listener would fire again at once and spin. As
 * PgBouncer suspends its pooler, stop listening until the next janitor run
 * (listeners_resume()); the queued clients wait in the kernel's backlog.
 */
static void accept_error_cb(struct evconnlistener *l, void *arg)
{
	struct listener *li = arg;
	int err = EVUTIL_SOCKET_ERROR();
	usec_t now = now_mono();
	(void)l;

	if (!accept_out_of_resources(err)) {
		log_warning("accept on %s failed: %s", li->name, evutil_socket_error_to_string(err));
		return;
	}
	if (!rt->accept_fail_logged || now - rt->accept_fail_logged > ACCEPT_FAIL_LOG_USEC) {
		log_error("accept() failed: %s; not accepting new connections for %d ms at a time "
			  "(see max_client_conn and the file descriptor limit)",
			  evutil_socket_error_to_string(err), (int)(JANITOR_PERIOD_USEC / 1000));
		rt->accept_fail_logged = now;
	}
	rt->accept_paused = true;
	for (int i = 0; i < rt->n_listeners; i++) {
		if (rt->listeners[i].l)
			evconnlistener_disable(rt->listeners[i].l);
	}
}

/* The janitor's turn: listen again after accept_error_cb() stopped it. */
static void listeners_resume(void)
{
	if (!rt->accept_paused)
		return;
	rt->accept_paused = false;
	for (int i = 0; i < rt->n_listeners; i++) {
		if (rt->listeners[i].l)
			evconnlistener_enable(rt->listeners[i].l);
	}
}

static bool start_listeners(void)
{
	for (int i = 0; i < rt->n_listeners; i++) {
		struct listener *li = &rt->listeners[i];
		evutil_make_socket_nonblocking(li->fd);
		li->l = evconnlistener_new(rt->base, accept_cb, li, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, li->fd);
		if (!li->l)
			return false;
		evconnlistener_set_error_cb(li->l, accept_error_cb);
	}
	return true;
}

/* Remove our socket file, unless another process has put its own there since. */
static void unlink_own_socket(const struct listener *li)
{
	struct stat st;

	if (li->unix_path && stat(li->unix_path, &st) == 0 && (unsigned long long)st.st_ino == li->unix_ino)
		unlink(li->unix_path);
}

static void close_listeners(void)
{
	for (int i = 0; i < rt->n_listeners; i++) {
		struct listener *li = &rt->listeners[i];
		if (li->l)
			evconnlistener_free(li->l);
		else if (li->fd >= 0)
			close(li->fd);
		unlink_own_socket(li);
		free(li->unix_path);
	}
	free(rt->listeners);
	rt->listeners = NULL;
	rt->n_listeners = 0;
}

/*
 * Accept what already waits in a listener's queue: closing a listen socket
 * resets the connections the kernel queued on it, and with so_reuseport
 * those clients were meant for this process. Bounded by the backlog.
 */
static void drain_accept_queue(struct listener *li)
{
	for (int i = 0; i < rt->cf->listen_backlog; i++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		int fd = accept4(li->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		client_accept(fd, (struct sockaddr *)&ss, (int)len, false);
	}
}

/* Close the TCP listen sockets, taking what already waits in their queues first. */
static void close_tcp_listeners(void)
{
	for (int i = 0; i < rt->n_listeners; i++) {
		struct listener *li = &rt->listeners[i];
		if (li->is_unix || li->fd < 0)
			continue;
		drain_accept_queue(li);
		if (li->l)
			evconnlistener_free(li->l);
		else
			close(li->fd);
		li->l = NULL;
		li->fd = -1;
		log_info("stopped listening on %s", li->name);
	}
}

static void tcp_close_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	rt->tcp_closing = false;
	close_tcp_listeners();
	lokadb_check_shutdown();
}

/*
 * Stop accepting TCP connections (shutdown), so that with so_reuseport the
 * kernel gives new ones to the other processes on the port. Waiting for
 * clients, the sockets stay open for TCP_CLOSE_GRACE_USEC first, without
 * TCP_DEFER_ACCEPT: a connection the kernel has already put on this socket
 * but whose client has not sent its first bytes yet is only accepted once
 * they arrive, and closing the socket before would reset it. Clients
 * accepted meanwhile are served like earlier ones.
 */
static void begin_close_tcp_listeners(enum shutdown_mode mode)
{
	struct timeval grace = { 0, TCP_CLOSE_GRACE_USEC };
	int off = 0;

	if (rt->tcp_closing)
		return;
	if (mode != SHUT_WAIT_CLIENTS || !rt->tcp_close_ev) {
		close_tcp_listeners();
		return;
	}
	for (int i = 0; i < rt->n_listeners; i++)
		if (!rt->listeners[i].is_unix && rt->listeners[i].fd >= 0)
			setsockopt(rt->listeners[i].fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &off, sizeof(off));
	rt->tcp_closing = true;
	event_add(rt->tcp_close_ev, &grace);
}

/* ---- reload / shutdown ---- */

void runtime_apply_log_settings(void)
{
	const struct lk_config *cf = rt->cf;
	log_setup(cf->logfile, !rt->quiet && !rt->daemon, cf->syslog, cf->syslog_ident, cf->syslog_facility,
		  rt->verbose + cf->verbose);
}

/* (Re)arm the stats timer with the current stats_period. */
static void arm_stats_timer(void)
{
	struct timeval st = { rt->cf->stats_period / USEC > 0 ? rt->cf->stats_period / USEC : 60, 0 };
	event_add(rt->stats_timer, &st);
}

/* Check the file, then apply it whole; on error nothing changes. */
bool lokadb_reload(char *err, size_t errlen)
{
	struct lk_config *nc = config_load(rt->config_path, err, errlen), *old;
	void *tls_ctx = NULL, *tls_sctx = NULL;

	if (!nc) {
		log_error("RELOAD failed, keeping the old configuration: %s", err);
		return false;
	}
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		char a[512], b[512];
		if (s->reloadable)
			continue;
		config_format(rt->cf, s, a, sizeof(a));
		config_format(nc, s, b, sizeof(b));
		if (strcmp(a, b) != 0)
			log_warning("RELOAD: setting %s cannot be changed at run time; restart lokadb to use \"%s\"", s->name, b);
		if (s->type == CF_STR)
			free(*(char **)((char *)nc + s->offset));
		memcpy((char *)nc + s->offset, (char *)rt->cf + s->offset,
		       s->type == CF_STR ? sizeof(char *) : s->type == CF_TIME || s->type == CF_SIZE ? sizeof(int64_t) : sizeof(int));
		if (s->type == CF_STR)
			*(char **)((char *)rt->cf + s->offset) = NULL;	/* moved to nc */
	}
	if (!tls_client_check(nc, &tls_ctx, err, errlen) || !tls_server_check(nc, &tls_sctx, err, errlen) ||
	    !plugins_check(nc, true, err, errlen)) {
		tls_client_discard(tls_ctx);
		tls_client_discard(tls_sctx);
		log_error("RELOAD failed, keeping the old configuration: %s", err);
		/* give the non-reloadable strings back */
		for (const struct cf_setting *s = config_settings; s->name; s++)
			if (!s->reloadable && s->type == CF_STR) {
				*(char **)((char *)rt->cf + s->offset) = *(char **)((char *)nc + s->offset);
				*(char **)((char *)nc + s->offset) = NULL;
			}
		config_free(nc);
		return false;
	}
	old = rt->cf;
	rt->cf = nc;
	tls_client_apply(tls_ctx);
	tls_server_apply(tls_sctx);
	runtime_apply_log_settings();
	runtime_raise_nofile();
	for (int i = 0; i < rt->n_listeners; i++)
		if (!rt->listeners[i].is_unix && rt->listeners[i].fd >= 0)
			tcp_tune_listener(rt->listeners[i].fd);
	plugins_apply(true);
	pool_apply_config(old);
	peers_apply();
	config_free(old);
	arm_stats_timer();
	log_info("configuration reloaded from %s", rt->config_path);
	return true;
}

static void close_list(struct client_list *l, const char *sqlstate, const char *msg)
{
	struct client *c, *tmp;
	TAILQ_FOREACH_SAFE(c, l, entry, tmp)
		client_close(c, sqlstate, "%s", msg);
}

static void close_all_clients(const char *sqlstate, const char *msg)
{
	struct pool *p;

	TAILQ_FOREACH(p, &rt->pools, entry) {
		close_list(&p->active_clients, sqlstate, msg);
		close_list(&p->waiting_clients, sqlstate, msg);
		close_list(&p->login_clients, sqlstate, msg);
	}
	close_list(&rt->login_clients, sqlstate, msg);
	close_list(&rt->admin_clients, sqlstate, msg);
}

void lokadb_shutdown(enum shutdown_mode mode)
{
	if (rt->shutdown == SHUT_NONE)
		plugin_shutdown();	/* e.g. the relay tells its agents to go elsewhere */
	if (mode == SHUT_NOW) {
		log_info("shutting down now");
		rt->shutdown = SHUT_NOW;
		event_base_loopbreak(rt->base);
		return;
	}
	if (rt->shutdown == SHUT_NONE)
		rt->shutdown = mode;
	begin_close_tcp_listeners(rt->shutdown);
	log_info(mode == SHUT_WAIT_CLIENTS ? "shutting down once every client has disconnected"
					   : "shutting down once every server connection is released");
	lokadb_check_shutdown();
}

/* Clients that still count for SHUTDOWN WAIT_FOR_CLIENTS: the pools' and those still logging in. */
static int count_clients(void)
{
	struct pool *p;
	struct client *c;
	int n = 0;
	TAILQ_FOREACH(p, &rt->pools, entry)
		n += p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
	TAILQ_FOREACH(c, &rt->login_clients, entry)
		n++;
	return n;
}

/* ---- SUSPEND ---- */

static void conn_recheck(struct conn_io *io)
{
	conn_want_read(io, io->rd_want);	/* conn_update_rd() looks at rt->suspended */
}

/* Every client and server connection, for SUSPEND / RESUME and its drain. */
static size_t walk_conns(void (*fn)(struct conn_io *io))
{
	struct client_list *cls[] = { &rt->login_clients, &rt->admin_clients };
	struct pool *p;
	struct client *c;
	struct server *s;
	size_t out = 0;

#define VISIT(x) do { if ((x)->bev) { out += evbuffer_get_length(bufferevent_get_output((x)->bev)); \
			  if (fn) fn(&(x)->io); } } while (0)
	for (size_t i = 0; i < sizeof(cls) / sizeof(cls[0]); i++)
		TAILQ_FOREACH(c, cls[i], entry)
			VISIT(c);
	TAILQ_FOREACH(p, &rt->pools, entry) {
		struct client_list *pc[] = { &p->active_clients, &p->waiting_clients, &p->login_clients };
		struct server_list *ps[] = { &p->active_servers, &p->idle_servers, &p->tested_servers, &p->login_servers };
		for (size_t i = 0; i < sizeof(pc) / sizeof(pc[0]); i++)
			TAILQ_FOREACH(c, pc[i], entry)
				VISIT(c);
		for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
			TAILQ_FOREACH(s, ps[i], entry)
				VISIT(s);
	}
#undef VISIT
	return out;
}

/*
 * SUSPEND (on) / RESUME (off), as PgBouncer: no connection but the
 * console's is read any more and nothing new is accepted (new clients wait
 * in the listen backlog), while what is queued is written out; the console
 * command answers once every output buffer is empty (lokadb_unflushed()).
 */
void lokadb_suspend(bool on)
{
	if (rt->suspended == on)
		return;
	rt->suspended = on;
	rt->suspend_start = now_mono();
	for (int i = 0; i < rt->n_listeners; i++) {
		if (!rt->listeners[i].l)
			continue;
		if (on)
			evconnlistener_disable(rt->listeners[i].l);
		else if (!rt->accept_paused)
			evconnlistener_enable(rt->listeners[i].l);
	}
	walk_conns(conn_recheck);
	log_info(on ? "SUSPEND: not reading from clients or servers, not accepting" : "RESUME after SUSPEND");
}

/* Bytes still queued toward clients and servers. */
size_t lokadb_unflushed(void)
{
	return walk_conns(NULL);
}

/* suspend_timeout is over: connections that did not drain are closed, as PgBouncer drops them. */
void lokadb_suspend_drop(void)
{
	struct client_list *cls[] = { &rt->login_clients };
	struct pool *p;
	struct client *c, *ct;
	struct server *s, *st;

	for (size_t i = 0; i < sizeof(cls) / sizeof(cls[0]); i++)
		TAILQ_FOREACH_SAFE(c, cls[i], entry, ct)
			if (c->bev && evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
				client_close(c, NULL, "suspend_timeout");
	TAILQ_FOREACH(p, &rt->pools, entry) {
		struct client_list *pc[] = { &p->active_clients, &p->waiting_clients, &p->login_clients };
		struct server_list *ps[] = { &p->active_servers, &p->idle_servers, &p->tested_servers, &p->login_servers };
		for (size_t i = 0; i < sizeof(pc) / sizeof(pc[0]); i++)
			TAILQ_FOREACH_SAFE(c, pc[i], entry, ct)
				if (c->bev && evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
					client_close(c, NULL, "suspend_timeout");
		for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
			TAILQ_FOREACH_SAFE(s, ps[i], entry, st)
				if (s->bev && evbuffer_get_length(bufferevent_get_output(s->bev)) > 0)
					server_close(s, "suspend_timeout");
	}
}

void lokadb_check_shutdown(void)
{
	if (rt->tcp_closing)
		return;		/* tcp_close_cb() checks again */
	if (rt->shutdown == SHUT_WAIT_CLIENTS && count_clients() == 0)
		lokadb_shutdown(SHUT_NOW);
	else if (rt->shutdown == SHUT_WAIT_SERVERS && pool_active_servers(NULL) == 0)
		lokadb_shutdown(SHUT_NOW);
}

/* ---- events ---- */

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	char err[512];
	(void)what;
	(void)arg;
	switch (sig) {
	case SIGHUP:
		log_info("got SIGHUP, re-reading config");
		lokadb_reload(err, sizeof(err));
		break;
	case SIGTERM:
		if (rt->shutdown != SHUT_NONE) {
			log_info("got SIGTERM while shutting down, exiting now");
			lokadb_shutdown(SHUT_NOW);
			break;
		}
		log_info("got SIGTERM, waiting for clients to disconnect");
		lokadb_shutdown(SHUT_WAIT_CLIENTS);
		break;
	case SIGINT:
		log_info("got SIGINT, waiting for servers to be released");
		lokadb_shutdown(SHUT_WAIT_SERVERS);
		break;
	case SIGQUIT:
		log_info("got SIGQUIT, exiting now");
		lokadb_shutdown(SHUT_NOW);
		break;
	case SIGUSR1:
		log_info("got SIGUSR1, pausing");
		rt->paused = true;
		break;
	case SIGUSR2:
		log_info("got SIGUSR2, resuming");
		pool_resume(NULL);
		break;
	default:
		break;
	}
}

static void janitor_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	listeners_resume();
	pool_janitor();
}

static void stats_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	pool_stats_tick();
}

static void justfree_cb(evutil_socket_t fd, short what, void *arg)
{
	struct client *c;
	struct server *s;
	(void)fd;
	(void)what;
	(void)arg;
	while ((c = TAILQ_FIRST(&rt->justfree_clients))) {
		TAILQ_REMOVE(&rt->justfree_clients, c, entry);
		client_release(c);
	}
	while ((s = TAILQ_FIRST(&rt->justfree_servers))) {
		TAILQ_REMOVE(&rt->justfree_servers, s, entry);
		varcache_free(&s->vars);
		rq_free(&s->rq);
		ps_server_free(s);
		scram_client_free(s->scram);
		free(s);
	}
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	conn_flush_all();
}

static struct event *add_signal(int sig)
{
	struct event *ev = evsignal_new(rt->base, sig, signal_cb, NULL);
	event_add(ev, NULL);
	return ev;
}

bool runtime_setup_events(void)
{
	struct timeval jt = { 0, JANITOR_PERIOD_USEC };

	rt->base = event_base_new();
	if (!rt->base)
		return false;
	rt->dns = dns_new(rt->base);
	rt->janitor = event_new(rt->base, -1, EV_PERSIST, janitor_cb, NULL);
	rt->stats_timer = event_new(rt->base, -1, EV_PERSIST, stats_cb, NULL);
	rt->justfree_ev = event_new(rt->base, -1, 0, justfree_cb, NULL);
	rt->flush_ev = event_new(rt->base, -1, 0, flush_cb, NULL);
	rt->tcp_close_ev = event_new(rt->base, -1, 0, tcp_close_cb, NULL);
	event_add(rt->janitor, &jt);
	arm_stats_timer();
	rt->sig_hup = add_signal(SIGHUP);
	rt->sig_term = add_signal(SIGTERM);
	rt->sig_int = add_signal(SIGINT);
	rt->sig_quit = add_signal(SIGQUIT);
	rt->sig_usr1 = add_signal(SIGUSR1);
	rt->sig_usr2 = add_signal(SIGUSR2);
	signal(SIGPIPE, SIG_IGN);
	return start_listeners();
}

/* For tests and fuzzers that drive the loop themselves: no janitor, stats timer or signal events. */
void runtime_stop_background_events(void)
{
	event_del(rt->janitor);
	event_del(rt->stats_timer);
	event_del(rt->sig_hup);
	event_del(rt->sig_term);
	event_del(rt->sig_int);
	event_del(rt->sig_quit);
	event_del(rt->sig_usr1);
	event_del(rt->sig_usr2);
}

void runtime_teardown(void)
{
	close_all_clients("57P01", "pooler is shutting down");
	struct pool *p;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		struct server *s;
		while ((s = TAILQ_FIRST(&p->active_servers)))
			server_close(s, "pooler is shutting down");
		while ((s = TAILQ_FIRST(&p->idle_servers)))
			server_close(s, "pooler is shutting down");
		while ((s = TAILQ_FIRST(&p->tested_servers)))
			server_close(s, "pooler is shutting down");
		while ((s = TAILQ_FIRST(&p->login_servers)))
			server_close(s, "pooler is shutting down");
	}
	/* give the goodbyes one chance to be written, then free everything */
	event_base_loop(rt->base, EVLOOP_NONBLOCK);
	while (!TAILQ_EMPTY(&rt->closing_clients))
		client_free_now(TAILQ_FIRST(&rt->closing_clients));
	justfree_cb(-1, 0, NULL);
	server_cancel_free_all();
	peers_free_all();
	conn_spares_free();
	client_cache_free();
	close_listeners();
	metrics_free_all();
	plugins_fini();
	tls_free_all();
	event_free(rt->janitor);
	event_free(rt->stats_timer);
	event_free(rt->justfree_ev);
	event_free(rt->flush_ev);
	event_free(rt->tcp_close_ev);
	event_free(rt->sig_hup);
	event_free(rt->sig_term);
	event_free(rt->sig_int);
	event_free(rt->sig_quit);
	event_free(rt->sig_usr1);
	event_free(rt->sig_usr2);
	dns_free(rt->dns);
	pool_free_all();
	ps_cache_free();
	event_base_free(rt->base);
	pkt_free(&rt->pb);
}

void runtime_init(void)
{
	TAILQ_INIT(&rt->dbs);
	TAILQ_INIT(&rt->pools);
	TAILQ_INIT(&rt->login_clients);
	TAILQ_INIT(&rt->admin_clients);
	TAILQ_INIT(&rt->closing_clients);
	LIST_INIT(&rt->cancel_reqs);
	TAILQ_INIT(&rt->flush_list);
	TAILQ_INIT(&rt->justfree_clients);
	TAILQ_INIT(&rt->justfree_servers);
	pkt_init(&rt->pb);
	rt->rand_pos = sizeof(rt->rand_pool);	/* empty: the first use fills it */
}
