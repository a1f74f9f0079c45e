/* SPDX-License-Identifier: ISC */
/*
 * dns.c -- host name resolution with c-ares on the event loop.
 *
 * c-ares tells us which sockets it wants watched (ARES_OPT_SOCK_STATE_CB);
 * each becomes a libevent event, and one timer drives c-ares' retries.
 * Answers are cached per host name for dns_max_ttl (failures for
 * dns_nxdomain_ttl). Numeric addresses never reach c-ares.
 *
 * A request's `arg` may go away before the answer (a server closed while
 * resolving): dns_cancel_arg() detaches it and the answer is dropped.
 */
#include "core.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

struct dns_watch {
	struct dns_watch *next;
	ares_socket_t fd;
	struct event *ev;
	int flags;
};

struct dns_req {
	struct dns_req *next;
	struct dns_ctx *d;
	char *host;
	int port;
	dns_cb cb;
	void *arg;		/* NULL once cancelled */
};

struct dns_cache {
	struct dns_cache *next;
	char *host;
	struct sockaddr_storage addr;	/* port 0 */
	socklen_t len;
	char *error;
	usec_t expires;
};

struct dns_ctx {
	struct event_base *base;
	ares_channel channel;
	struct dns_watch *watches;
	struct event *timer;
	struct dns_req *reqs;
	struct dns_cache *cache;
	bool ok;
};

static void dns_arm_timer(struct dns_ctx *d)
{
	struct timeval tv, *tvp = ares_timeout(d->channel, NULL, &tv);
	if (tvp)
		event_add(d->timer, tvp);
	else
		event_del(d->timer);
}

static void dns_io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct dns_ctx *d = arg;
	ares_socket_t r = (what & EV_READ) ? fd : ARES_SOCKET_BAD;
	ares_socket_t w = (what & EV_WRITE) ? fd : ARES_SOCKET_BAD;
	ares_process_fd(d->channel, r, w);
	dns_arm_timer(d);
}

static void dns_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct dns_ctx *d = arg;
	(void)fd;
	(void)what;
	ares_process_fd(d->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	dns_arm_timer(d);
}

static void dns_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
	struct dns_ctx *d = data;
	struct dns_watch **pp, *w;
	int flags = (readable ? EV_READ : 0) | (writable ? EV_WRITE : 0);

	for (pp = &d->watches; *pp && (*pp)->fd != fd; pp = &(*pp)->next)
		;
	w = *pp;
	if (w) {
		event_free(w->ev);
		*pp = w->next;
		free(w);
	}
	if (!flags)
		return;
	w = xcalloc(1, sizeof(*w));
	w->fd = fd;
	w->flags = flags;
	w->ev = event_new(d->base, fd, (short)(flags | EV_PERSIST), dns_io_cb, d);
	event_add(w->ev, NULL);
	w->next = d->watches;
	d->watches = w;
}

struct dns_ctx *dns_new(struct event_base *base)
{
	struct dns_ctx *d = xcalloc(1, sizeof(*d));
	struct ares_options opts;

	d->base = base;
	memset(&opts, 0, sizeof(opts));
	opts.sock_state_cb = dns_sock_state;
	opts.sock_state_cb_data = d;
	if (ares_library_init(ARES_LIB_INIT_ALL) != ARES_SUCCESS ||
	    ares_init_options(&d->channel, &opts, ARES_OPT_SOCK_STATE_CB) != ARES_SUCCESS) {
		log_error("could not initialize c-ares; host names will not resolve");
	} else {
		d->ok = true;
	}
	d->timer = event_new(base, -1, 0, dns_timer_cb, d);
	return d;
}

void dns_free(struct dns_ctx *d)
{
	if (!d)
		return;
	if (d->ok)
		ares_destroy(d->channel);	/* calls back every pending request with ARES_EDESTRUCTION */
	while (d->watches) {
		struct dns_watch *w = d->watches;
		d->watches = w->next;
		event_free(w->ev);
		free(w);
	}
	while (d->cache) {
		struct dns_cache *c = d->cache;
		d->cache = c->next;
		free(c->host);
		free(c->error);
		free(c);
	}
	event_free(d->timer);
	if (d->ok)
		ares_library_cleanup();
	free(d);
}

static void deliver(const struct dns_cache *e, int port, dns_cb cb, void *arg)
{
	struct sockaddr_storage ss;

	if (e->error) {
		cb(arg, NULL, 0, e->error);
		return;
	}
	memcpy(&ss, &e->addr, e->len);
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
	cb(arg, (struct sockaddr *)&ss, e->len, NULL);
}

static struct dns_cache *cache_put(struct dns_ctx *d, const char *host)
{
	struct dns_cache *e;
	for (e = d->cache; e; e = e->next)
		if (strcmp(e->host, host) == 0)
			break;
	if (!e) {
		e = xcalloc(1, sizeof(*e));
		e->host = xstrdup(host);
		e->next = d->cache;
		d->cache = e;
	}
	free(e->error);
	e->error = NULL;
	return e;
}

static void unlink_req(struct dns_ctx *d, struct dns_req *r)
{
	for (struct dns_req **pp = &d->reqs; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			return;
		}
	}
}

static void addrinfo_cb(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
	struct dns_req *r = arg;
	struct dns_ctx *d = r->d;
	struct dns_cache *e;
	(void)timeouts;

	unlink_req(d, r);
	if (status == ARES_EDESTRUCTION) {
		free(r->host);
		free(r);
		return;
	}
	e = cache_put(d, r->host);
	if (status == ARES_SUCCESS && res && res->nodes) {
		memcpy(&e->addr, res->nodes->ai_addr, res->nodes->ai_addrlen);
		e->len = res->nodes->ai_addrlen;
		e->expires = now_mono() + (rt->cf->dns_max_ttl > 0 ? rt->cf->dns_max_ttl : USEC);
	} else {
		e->error = xstrdup(ares_strerror(status));
		e->expires = now_mono() + (rt->cf->dns_nxdomain_ttl > 0 ? rt->cf->dns_nxdomain_ttl : USEC);
	}
	if (res)
		ares_freeaddrinfo(res);
	if (r->arg)
		deliver(e, r->port, r->cb, r->arg);
	free(r->host);
	free(r);
}

static bool numeric(const char *host, int port, dns_cb cb, void *arg)
{
	struct sockaddr_in in;
	struct sockaddr_in6 in6;

	memset(&in, 0, sizeof(in));
	memset(&in6, 0, sizeof(in6));
	if (inet_pton(AF_INET, host, &in.sin_addr) == 1) {
		in.sin_family = AF_INET;
		in.sin_port = htons((uint16_t)port);
		cb(arg, (struct sockaddr *)&in, sizeof(in), NULL);
		return true;
	}
	if (inet_pton(AF_INET6, host, &in6.sin6_addr) == 1) {
		in6.sin6_family = AF_INET6;
		in6.sin6_port = htons((uint16_t)port);
		cb(arg, (struct sockaddr *)&in6, sizeof(in6), NULL);
		return true;
	}
	return false;
}

/* Resolve host; cb is called exactly once unless dns_cancel_arg(arg) runs first. */
void dns_resolve(struct dns_ctx *d, const char *host, int port, dns_cb cb, void *arg)
{
	struct ares_addrinfo_hints hints;
	struct dns_req *r;

	if (numeric(host, port, cb, arg))
		return;
	for (struct dns_cache *e = d->cache; e; e = e->next) {
		if (strcmp(e->host, host) == 0 && e->expires > now_mono()) {
			deliver(e, port, cb, arg);
			return;
		}
	}
	if (!d->ok) {
		cb(arg, NULL, 0, "resolver not available");
		return;
	}
	r = xcalloc(1, sizeof(*r));
	r->d = d;
	r->host = xstrdup(host);
	r->port = port;
	r->cb = cb;
	r->arg = arg;
	r->next = d->reqs;
	d->reqs = r;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	ares_getaddrinfo(d->channel, host, NULL, &hints, addrinfo_cb, r);
	dns_arm_timer(d);
}

void dns_cancel_arg(struct dns_ctx *d, void *arg)
{
	if (!d)
		return;
	for (struct dns_req *r = d->reqs; r; r = r->next)
		if (r->arg == arg)
			r->arg = NULL;
}

/* Every cached host name (SHOW DNS_HOSTS, SHOW LISTS). */
void dns_walk(struct dns_ctx *d, dns_walk_fn fn, void *arg)
{
	if (!d)
		return;
	for (const struct dns_cache *e = d->cache; e; e = e->next)
		fn(arg, e->host, e->error ? NULL : (const struct sockaddr *)&e->addr, e->error ? 0 : e->len, e->expires);
}
