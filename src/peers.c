/* SPDX-License-Identifier: ISC */
/*
 * peers.c -- cancel requests across a group of lokadb processes (peer_id and
 * the [peers] section, as PgBouncer 1.19+).
 *
 * A CancelRequest travels on a connection of its own, so when several
 * processes share a port (so_reuseport) or sit behind one TCP load balancer
 * it often reaches a process that did not hand out its key. Each process of
 * a group therefore writes its peer_id into the cancel keys it hands out,
 * and a process that receives a key with another peer's id forwards the
 * CancelRequest to that peer, as [peers] addresses it (TCP, or the peer's
 * own unix socket).
 *
 * The key: bytes 0-1 of the 8 bytes a client gets in BackendKeyData hold
 * the id (14 bits) under a 2-bit "hops left" count; the other 6 bytes are
 * random. Keys are handed out with one hop left and a forward takes one,
 * so a request is forwarded at most once: a misaddressed [peers] entry
 * cannot make two processes bounce a request between them. Without a
 * peer_id (0) keys are 8 random bytes and nothing is forwarded.
 *
 * Owns: the group (rt->peers): one `struct peer` per [peers] entry other
 * than this process's own, each with its forwards in flight (at most
 * pool_size at once) and the ones waiting for a slot. A forward is one
 * short connection: connect, send the 16 bytes, wait for the peer to
 * close it. cancel_wait_timeout (as PgBouncer's) bounds a request's whole
 * stay, from its arrival: a queued one is dropped by peers_janitor(), one
 * in flight by its connection's timeout. Nothing here blocks.
 *
 * RELOAD rebuilds the group from [peers]; a removed peer lives on, hidden,
 * until its last forward ends. Do not keep a `struct peer *` across loop
 * turns outside its own requests.
 *
 * INTERFACE ROUTINES
 *	peers_new_cancel_key	the key for a new client
 *	peers_cancel_local	is this key ours? forward it if not
 *	peers_apply		(re)build the group from the configuration
 *	peers_janitor		drop queued forwards past cancel_wait_timeout
 *	peers_show / peers_show_pools	SHOW PEERS / SHOW PEER_POOLS rows
 *	peers_free_all		at exit
 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#define KEY_HOPS_SHIFT 6
#define KEY_ID_HIGH_MASK 0x3f
#define KEY_HOPS_HANDED_OUT 1		/* a request may be forwarded once */
#define CANCEL_TIMEOUT_MIN_USEC 1000	/* a forward due at once still gets a turn of the loop */
#define PEER_WAITING_MAX 1000		/* forwards queued per peer beyond pool_size */
#define DEFAULT_UNIX_DIR "/tmp"

struct peer;

struct peer_req {
	TAILQ_ENTRY(peer_req) entry;
	struct peer *peer;
	struct bufferevent *bev;
	uint8_t pkt[16];		/* the CancelRequest as forwarded */
	usec_t arrived;			/* monotonic; cancel_wait_timeout counts from here */
	bool connecting;		/* SHOW PEER_POOLS sv_login */
	bool resolving;			/* waiting for dns.c */
};
TAILQ_HEAD(peer_req_list, peer_req);

struct peer {
	TAILQ_ENTRY(peer) entry;
	int id;
	char *host;			/* NULL: unix socket in /tmp; "/dir": unix socket there */
	int port;
	int pool_size;			/* -1: default_pool_size */
	bool removed;			/* gone from [peers]; freed when idle */
	struct peer_req_list active, waiting;
	int n_active, n_waiting;
};
TAILQ_HEAD(peer_list, peer);

struct peer_group {
	struct peer_list list;
	uint64_t forwarded;		/* forwards sent (metrics) */
	uint64_t dropped;		/* requests not forwarded: unknown peer, no hop left, queue full, failed */
};

static int key_peer_id(const uint8_t *key)
{
	return ((key[0] & KEY_ID_HIGH_MASK) << 8) | key[1];
}

static int key_hops(const uint8_t *key)
{
	return key[0] >> KEY_HOPS_SHIFT;
}

static void key_set(uint8_t *key, int id, int hops)
{
	key[0] = (uint8_t)((hops << KEY_HOPS_SHIFT) | ((id >> 8) & KEY_ID_HIGH_MASK));
	key[1] = (uint8_t)(id & 0xff);
}

void peers_new_cancel_key(uint8_t key[8])
{
	random_bytes(key, 8);
	if (rt->cf->peer_id)
		key_set(key, rt->cf->peer_id, KEY_HOPS_HANDED_OUT);
}

static struct peer_group *group(void)
{
	if (!rt->peers) {
		rt->peers = xcalloc(1, sizeof(*rt->peers));
		TAILQ_INIT(&rt->peers->list);
	}
	return rt->peers;
}

static struct peer *peer_find(int id)
{
	struct peer *p;

	if (!rt->peers)
		return NULL;
	TAILQ_FOREACH(p, &rt->peers->list, entry)
		if (p->id == id && !p->removed)
			return p;
	return NULL;
}

static int peer_pool_size(const struct peer *p)
{
	int n = p->pool_size >= 0 ? p->pool_size : rt->cf->default_pool_size;
	return n > 0 ? n : 1;
}

static void peer_free(struct peer *p)
{
	TAILQ_REMOVE(&rt->peers->list, p, entry);
	free(p->host);
	free(p);
}

/* ---- one forward ---- */

static void req_start(struct peer_req *r);

/* The forward is over (sent and closed by the peer, failed or timed out): free it, start the next one. */
static void req_done(struct peer_req *r, const char *failure)
{
	struct peer *p = r->peer;
	struct peer_req *next;

	if (failure) {
		log_warning("could not forward cancel request to peer %d: %s", p->id, failure);
		rt->peers->dropped++;
	}
	if (r->resolving)
		dns_cancel_arg(rt->dns, r);
	if (r->bev)
		bufferevent_free(r->bev);
	TAILQ_REMOVE(&p->active, r, entry);
	p->n_active--;
	free(r);
	next = TAILQ_FIRST(&p->waiting);
	if (next && !p->removed && p->n_active < peer_pool_size(p)) {
		TAILQ_REMOVE(&p->waiting, next, entry);
		p->n_waiting--;
		TAILQ_INSERT_TAIL(&p->active, next, entry);
		p->n_active++;
		req_start(next);
	} else if (p->removed && p->n_active == 0 && p->n_waiting == 0) {
		peer_free(p);
	}
}

/* PgBouncer's log line for a cancel request that waited too long. */
static void log_cancel_wait_timeout(const struct peer_req *r)
{
	log_warning("cancel request for peer %d closing because: cancel_wait_timeout (age=%llds)", r->peer->id,
		    (long long)((now_mono() - r->arrived) / USEC));
	rt->peers->dropped++;
}

static void req_read_cb(struct bufferevent *bev, void *arg)
{
	(void)arg;
	evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
}

static void req_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct peer_req *r = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED) {
		r->connecting = false;
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) {
		log_cancel_wait_timeout(r);
		req_done(r, NULL);
	}
	else if ((what & BEV_EVENT_ERROR) && r->connecting)
		req_done(r, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
	else
		req_done(r, NULL);	/* EOF: the peer has taken it */
}

/* Connect to the peer's address and queue the 16 bytes; the outcome arrives in req_event_cb. */
static void req_connect(struct peer_req *r, const struct sockaddr *sa, socklen_t len)
{
	usec_t left = r->arrived + rt->cf->cancel_wait_timeout - now_mono();
	struct timeval tv;

	if (left < CANCEL_TIMEOUT_MIN_USEC)
		left = CANCEL_TIMEOUT_MIN_USEC;
	tv.tv_sec = (time_t)(left / USEC);
	tv.tv_usec = (suseconds_t)(left % USEC);

	r->bev = bufferevent_socket_new(rt->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!r->bev) {
		req_done(r, "out of memory");
		return;
	}
	r->connecting = true;
	bufferevent_write(r->bev, r->pkt, sizeof(r->pkt));
	/* callbacks only after the connect call: when it fails at once it runs the
	 * event callback before returning, and the request is freed here instead */
	if (bufferevent_socket_connect(r->bev, sa, (int)len) < 0) {
		req_done(r, strerror(errno));
		return;
	}
	bufferevent_setcb(r->bev, req_read_cb, NULL, req_event_cb, r);
	if (rt->cf->cancel_wait_timeout > 0)
		bufferevent_set_timeouts(r->bev, &tv, &tv);
	bufferevent_enable(r->bev, EV_READ | EV_WRITE);
}

static void req_resolved(void *arg, const struct sockaddr *sa, socklen_t len, const char *error)
{
	struct peer_req *r = arg;

	if (!r)
		return;
	r->resolving = false;
	if (!sa) {
		req_done(r, error ? error : "could not resolve host");
		return;
	}
	req_connect(r, sa, len);
}

static void req_start(struct peer_req *r)
{
	const struct peer *p = r->peer;
	struct sockaddr_un un;

	if (p->host && p->host[0] != '/') {
		r->resolving = true;
		r->connecting = true;
		dns_resolve(rt->dns, p->host, p->port, req_resolved, r);
		return;
	}
	memset(&un, 0, sizeof(un));
	un.sun_family = AF_UNIX;
	snprintf(un.sun_path, sizeof(un.sun_path), "%s/.s.PGSQL.%d", p->host ? p->host : DEFAULT_UNIX_DIR, p->port);
	req_connect(r, (const struct sockaddr *)&un, sizeof(un));
}

/* Forward a key of peer `id` with `hops` left (> 0), or queue it while the peer's pool_size forwards run. */
static void forward(struct peer *p, const uint8_t *key, int hops)
{
	struct peer_req *r;

	if (p->n_waiting >= PEER_WAITING_MAX) {
		log_warning("cancel request for peer %d dropped: %d requests already wait for it", p->id, p->n_waiting);
		rt->peers->dropped++;
		return;
	}
	r = xcalloc(1, sizeof(*r));
	r->peer = p;
	r->arrived = now_mono();
	pkt_set_u32(r->pkt, 16);
	pkt_set_u32(r->pkt + 4, PROTO_CANCEL_CODE);
	memcpy(r->pkt + 8, key, 8);
	key_set(r->pkt + 8, p->id, hops - 1);
	rt->peers->forwarded++;
	log_debug("forwarding cancel request to peer %d", p->id);
	if (p->n_active >= peer_pool_size(p)) {
		TAILQ_INSERT_TAIL(&p->waiting, r, entry);
		p->n_waiting++;
		return;
	}
	TAILQ_INSERT_TAIL(&p->active, r, entry);
	p->n_active++;
	req_start(r);
}

/*
 * A CancelRequest carrying `key` arrived. Returns true with the key as this
 * process handed it out in `local` when the key is ours (or peering is off);
 * returns false when it belongs to another peer: then it has been forwarded
 * there, or dropped with a log line.
 */
bool peers_cancel_local(const uint8_t *key, uint8_t *local)
{
	int id = key_peer_id(key), hops = key_hops(key);
	struct peer *p;

	memcpy(local, key, 8);
	if (!rt->cf->peer_id)
		return true;
	if (id == rt->cf->peer_id) {
		key_set(local, id, KEY_HOPS_HANDED_OUT);
		return true;
	}
	p = peer_find(id);
	if (!p) {
		log_debug("cancel request for unknown peer %d ignored", id);
		group()->dropped++;
		return false;
	}
	if (hops == 0) {
		log_warning("cancel request for peer %d was already forwarded once and reached peer %d; "
			    "dropped (does [peers] address peer %d right?)", id, rt->cf->peer_id, id);
		rt->peers->dropped++;
		return false;
	}
	forward(p, key, hops);
	return false;
}

/*
 * cancel_wait_timeout: drop the forwards that have waited that long for a
 * free slot (PgBouncer drops a cancel request that waited that long for a
 * server connection). Called by the janitor.
 */
void peers_janitor(usec_t now)
{
	struct peer *p, *ptmp;
	struct peer_req *r, *rtmp;
	usec_t limit = rt->cf->cancel_wait_timeout;

	if (!rt->peers || limit <= 0)
		return;
	TAILQ_FOREACH_SAFE(p, &rt->peers->list, entry, ptmp) {
		TAILQ_FOREACH_SAFE(r, &p->waiting, entry, rtmp) {
			if (now - r->arrived <= limit)
				break;		/* FIFO: the rest came later */
			log_cancel_wait_timeout(r);
			TAILQ_REMOVE(&p->waiting, r, entry);
			p->n_waiting--;
			free(r);
		}
		if (p->removed && p->n_active == 0 && p->n_waiting == 0)
			peer_free(p);
	}
}

/* ---- configuration ---- */

static void peer_set(struct peer *p, const struct peer_conf *pc)
{
	free(p->host);
	p->host = pc->host ? xstrdup(pc->host) : NULL;
	p->port = pc->port;
	p->pool_size = pc->pool_size;
	p->removed = false;
}

/* Make the group match rt->cf's [peers] (at start and after RELOAD). */
void peers_apply(void)
{
	struct peer_group *g = group();
	struct peer *p, *tmp;

	TAILQ_FOREACH(p, &g->list, entry)
		p->removed = true;
	for (int i = 0; i < rt->cf->n_peers; i++) {
		const struct peer_conf *pc = &rt->cf->peers[i];
		if (pc->id == rt->cf->peer_id)
			continue;	/* our own entry: allowed, so that one [peers] fits every process */
		TAILQ_FOREACH(p, &g->list, entry)
			if (p->id == pc->id)
				break;
		if (!p) {
			p = xcalloc(1, sizeof(*p));
			p->id = pc->id;
			TAILQ_INIT(&p->active);
			TAILQ_INIT(&p->waiting);
			TAILQ_INSERT_TAIL(&g->list, p, entry);
		}
		peer_set(p, pc);
	}
	TAILQ_FOREACH_SAFE(p, &g->list, entry, tmp) {
		if (p->removed && p->n_active == 0 && p->n_waiting == 0)
			peer_free(p);
	}
	if (rt->cf->n_peers > 0 && !rt->cf->peer_id)
		log_warning("[peers] is set but peer_id is 0: cancel keys carry no peer id and nothing is forwarded");
}

/* ---- console and metrics ---- */

void peers_show(struct pktbuf *pb)
{
	struct peer *p;

	if (!rt->peers)
		return;
	TAILQ_FOREACH(p, &rt->peers->list, entry) {
		char id[16], port[16], size[16];
		const char *v[4] = { id, p->host, port, size };
		if (p->removed)
			continue;
		snprintf(id, sizeof(id), "%d", p->id);
		snprintf(port, sizeof(port), "%d", p->port);
		snprintf(size, sizeof(size), "%d", peer_pool_size(p));
		pkt_data_row(pb, 4, v);
	}
}

void peers_walk(peers_walk_fn fn, void *arg)
{
	struct peer *p;
	struct peer_req *r;

	if (!rt->peers)
		return;
	TAILQ_FOREACH(p, &rt->peers->list, entry) {
		struct peer_pool_counts n = { p->id, p->n_active, p->n_waiting, 0, 0 };
		if (p->removed)
			continue;
		TAILQ_FOREACH(r, &p->active, entry) {
			if (r->connecting)
				n.sv_login++;
			else
				n.sv_active_cancel++;
		}
		fn(arg, &n);
	}
}

static void pool_row(void *arg, const struct peer_pool_counts *n)
{
	char b[5][16];
	const char *v[5] = { b[0], b[1], b[2], b[3], b[4] };

	snprintf(b[0], sizeof(b[0]), "%d", n->peer_id);
	snprintf(b[1], sizeof(b[1]), "%d", n->cl_active_cancel_req);
	snprintf(b[2], sizeof(b[2]), "%d", n->cl_waiting_cancel_req);
	snprintf(b[3], sizeof(b[3]), "%d", n->sv_active_cancel);
	snprintf(b[4], sizeof(b[4]), "%d", n->sv_login);
	pkt_data_row(arg, 5, v);
}

void peers_show_pools(struct pktbuf *pb)
{
	peers_walk(pool_row, pb);
}

void peers_counters(uint64_t *forwarded, uint64_t *dropped)
{
	*forwarded = rt->peers ? rt->peers->forwarded : 0;
	*dropped = rt->peers ? rt->peers->dropped : 0;
}

void peers_free_all(void)
{
	struct peer *p;

	if (!rt->peers)
		return;
	while ((p = TAILQ_FIRST(&rt->peers->list))) {
		struct peer_req *r;
		while ((r = TAILQ_FIRST(&p->waiting))) {
			TAILQ_REMOVE(&p->waiting, r, entry);
			free(r);
		}
		while ((r = TAILQ_FIRST(&p->active))) {
			TAILQ_REMOVE(&p->active, r, entry);
			if (r->resolving)
				dns_cancel_arg(rt->dns, r);
			if (r->bev)
				bufferevent_free(r->bev);
			free(r);
		}
		peer_free(p);
	}
	free(rt->peers);
	rt->peers = NULL;
}
