/* SPDX-License-Identifier: ISC */
/*
 * fuzz_prepared.c -- libFuzzer target for src/prepared.c: the statement
 * cache, the client names, the server LRU and the reply queue, driven by
 * random sequences of client messages (Parse, Bind, Describe, Close, with
 * well-formed or random bodies) and server events (a reply completing the
 * head, an ErrorResponse, Sync and ReadyForQuery, DISCARD ALL), with
 * max_prepared_statements changing on the way.
 *
 * No sockets: the client and server objects have bufferevents without a
 * file descriptor. What lokadb writes to the server is read back into a
 * model of PostgreSQL's session: a FIFO of the messages sent and the set of
 * statements that exist. A reply executes the head message in the model, an
 * error skips up to the Sync, as PostgreSQL does. Oracles besides the
 * sanitizers (leaks included: everything an input made is freed before the
 * next one):
 *   - a Bind or Describe of lokadb's name finds the statement, and a Parse
 *     does not find one, also after an earlier batch failed while lokadb
 *     had pipelined this message (where that batch may skip a Parse or a
 *     Close of the statement, lokadb closes and prepares it again);
 *   - the reply queue's items other than RQ_SYNTH match the messages sent,
 *     one to one and in order;
 *   - the server's LRU holds as many statements as the model will have once
 *     the messages in flight are executed;
 *   - an RQ_SYNTH item is never at the head when nothing is being forwarded
 *     (it would have been written).
 *
 * Input: pairs of bytes (op, arg); see run_op().
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[4] = { "a", "b", "", "a'\\$x" };
static const char *const texts[8] = {
	"select 1", "select 2", "select $1::int", "select 'x'", "select 1", "", "select now()", "values (3)",
};

#define MODEL_MAX 4096
#define NAME_LEN 32

enum { M_OTHER, M_PARSE, M_CLOSE, M_USE, M_SYNC };

/* PostgreSQL as lokadb should see it: messages sent, statements prepared. */
static struct {
	struct { int kind; char name[NAME_LEN]; } q[MODEL_MAX];
	int head, n;
	char have[MODEL_MAX][NAME_LEN];
	int n_have;
} M;

static struct pool pool;
static struct lk_db db;
static struct client cl[2];
static struct server srv;

static int have_find(const char *name)
{
	for (int i = 0; i < M.n_have; i++)
		if (strcmp(M.have[i], name) == 0)
			return i;
	return -1;
}

static void model_push(int kind, const char *name)
{
	int i = (M.head + M.n) % MODEL_MAX;

	if (M.n == MODEL_MAX)
		abort();
	M.q[i].kind = kind;
	snprintf(M.q[i].name, NAME_LEN, "%s", name);
	M.n++;
}

/* PostgreSQL must not refuse the head message (42P05, 26000): lokadb's LRU is right. */
static void model_check_head(void)
{
	int at;

	if (!M.n)
		abort();	/* a reply with no message sent */
	at = have_find(M.q[M.head].name);
	if ((M.q[M.head].kind == M_PARSE && at >= 0) || (M.q[M.head].kind == M_USE && at < 0))
		abort();
}

/* Execute the head message. */
static void model_exec(void)
{
	int kind = M.q[M.head].kind, at = have_find(M.q[M.head].name);

	if (kind == M_PARSE) {
		if (M.n_have == MODEL_MAX)
			abort();
		snprintf(M.have[M.n_have++], NAME_LEN, "%s", M.q[M.head].name);
	} else if (kind == M_CLOSE && at >= 0) {
		memmove(M.have[at], M.have[at + 1], (size_t)(M.n_have - at - 1) * NAME_LEN);
		M.n_have--;
	}
	M.head = (M.head + 1) % MODEL_MAX;
	M.n--;
}

/* An error at the head: it and everything up to the Sync are skipped. */
static void model_skip(void)
{
	while (M.n && M.q[M.head].kind != M_SYNC) {
		M.head = (M.head + 1) % MODEL_MAX;
		M.n--;
	}
}

static const char *cstr_at(const uint8_t *b, uint32_t len, uint32_t *off)
{
	const uint8_t *nul = *off < len ? memchr(b + *off, 0, len - *off) : NULL;
	const char *r = (const char *)b + *off;

	if (!nul)
		return NULL;
	*off = (uint32_t)(nul - b) + 1;
	return r;
}

/* What lokadb wrote to the server, into the model's FIFO. */
static void model_read_server(void)
{
	struct evbuffer *out = bufferevent_get_output(srv.bev);

	evbuffer_unfreeze(out, 1);
	while (evbuffer_get_length(out) >= 5) {
		uint8_t hdr[5], *m;
		uint32_t len, off = 5;
		const char *name = NULL;
		int kind = M_OTHER;

		evbuffer_copyout(out, hdr, 5);
		len = pkt_get_u32(hdr + 1) + 1;
		if (evbuffer_get_length(out) < len)
			abort();	/* lokadb sent part of a message */
		m = evbuffer_pullup(out, len);
		if (hdr[0] == 'P') {
			name = cstr_at(m, len, &off);
			kind = M_PARSE;
		} else if (hdr[0] == 'B') {
			if (cstr_at(m, len, &off))
				name = cstr_at(m, len, &off);
			kind = M_USE;
		} else if ((hdr[0] == 'D' || hdr[0] == 'C') && len > 6 && m[5] == 'S') {
			off = 6;
			name = cstr_at(m, len, &off);
			kind = hdr[0] == 'D' ? M_USE : M_CLOSE;
		} else if (hdr[0] == 'S') {
			kind = M_SYNC;
		}
		if (kind != M_SYNC && (!name || strncmp(name, "LOKADB_", 7) != 0))
			kind = M_OTHER;	/* unnamed, a portal, or the client's malformed message */
		model_push(kind, kind == M_OTHER || kind == M_SYNC ? "" : name);
		evbuffer_drain(out, len);
	}
	evbuffer_freeze(out, 1);
}

/* The statements the model will have once what is in flight has run. */
static int model_future(void)
{
	static char fut[MODEL_MAX][NAME_LEN];
	int n = M.n_have;

	memcpy(fut, M.have, (size_t)n * NAME_LEN);
	for (int k = 0; k < M.n; k++) {
		int i = (M.head + k) % MODEL_MAX, at = -1;
		for (int j = 0; j < n; j++)
			if (strcmp(fut[j], M.q[i].name) == 0)
				at = j;
		if (M.q[i].kind == M_PARSE && at < 0)
			snprintf(fut[n++], NAME_LEN, "%s", M.q[i].name);
		else if (M.q[i].kind == M_CLOSE && at >= 0)
			memmove(fut[at], fut[at + 1], (size_t)(--n - at) * NAME_LEN);
	}
	return n;
}

static unsigned rq_real(void)
{
	unsigned n = 0;
	for (uint32_t i = 0; i < srv.rq.count; i++)
		if (rq_at(&srv.rq, i)->act != RQ_SYNTH)
			n++;
	return n;
}

static void drain(struct bufferevent *bev)
{
	struct evbuffer *out = bufferevent_get_output(bev);
	evbuffer_unfreeze(out, 1);
	evbuffer_drain(out, evbuffer_get_length(out));
	evbuffer_freeze(out, 1);
}

static bool setup(void)
{
	static bool done;

	if (done)
		return true;
	runtime_init();
	rt->quiet = true;
	rt->cf = config_defaults();
	rt->base = event_base_new();
	if (!rt->cf || !rt->base)
		return false;
	db.name = "db";
	pool.db = &db;
	pool.login_user = "u";
	for (int i = 0; i < 2; i++) {
		cl[i].pool = &pool;
		cl[i].ps_on = true;
		cl[i].bev = bufferevent_socket_new(rt->base, -1, 0);
	}
	srv.pool = &pool;
	srv.bev = bufferevent_socket_new(rt->base, -1, 0);
	done = true;
	return cl[0].bev && cl[1].bev && srv.bev;
}

static uint32_t put_msg(uint8_t *buf, char type, const uint8_t *body, uint32_t blen)
{
	buf[0] = (uint8_t)type;
	buf[1] = (uint8_t)((blen + 4) >> 24);
	buf[2] = (uint8_t)((blen + 4) >> 16);
	buf[3] = (uint8_t)((blen + 4) >> 8);
	buf[4] = (uint8_t)(blen + 4);
	memcpy(buf + 5, body, blen);
	return blen + 5;
}

/* A well-formed body of a P/B/D/C message. */
static uint32_t good_body(uint8_t *b, char type, const char *name, const char *text)
{
	uint32_t n = 0;
	if (type == 'D' || type == 'C')
		b[n++] = 'S';
	if (type == 'B')
		b[n++] = 0;	/* portal */
	memcpy(b + n, name, strlen(name) + 1);
	n += (uint32_t)strlen(name) + 1;
	if (type == 'P') {
		memcpy(b + n, text, strlen(text) + 1);
		n += (uint32_t)strlen(text) + 1;
		b[n++] = 0;
		b[n++] = 0;
	} else if (type == 'B') {
		memset(b + n, 0, 6);
		n += 6;
	}
	return n;
}

static void client_msg(struct client *c, char type, const uint8_t *body, uint32_t blen)
{
	uint8_t msg[600];
	uint32_t mlen = put_msg(msg, type, body, blen), used = 0;
	struct evbuffer *out = bufferevent_get_output(srv.bev);
	int rc;

	switch (type) {
	case 'P': rc = ps_parse(c, msg, mlen); break;
	case 'B': rc = ps_bind(c, msg, mlen, mlen, &used); break;
	case 'D': rc = ps_describe(c, msg, mlen); break;
	default: rc = ps_close(c, msg, mlen); break;
	}
	if (rc == PS_DONE && used)	/* the rest of the Bind, as client.c sends it */
		evbuffer_add(out, msg + used, mlen - used);
	model_read_server();		/* what lokadb sent for it */
	if (rc == PS_PASS) {		/* as client.c: forwarded unchanged (unnamed, or malformed) */
		rq_push(&srv.rq, type, RQ_FWD);
		model_push(M_OTHER, "");
	}
}

/* The server answered the message at the head (as server.c does). */
static void reply(bool error)
{
	struct rq_item *it = rq_head(&srv.rq);

	if (!it)
		return;
	if (it->act == RQ_SYNTH)
		abort();		/* should have been written already */
	if (it->type == 'S') {		/* ReadyForQuery */
		rq_pop(&srv.rq);
		model_exec();
		rq_flush_synth(&srv);
		return;
	}
	model_check_head();
	if (error) {
		rq_discard_batch(&srv, true);
		model_skip();
		return;
	}
	rq_pop(&srv.rq);
	model_exec();
	rq_flush_synth(&srv);
}

static void run_op(uint8_t op, uint8_t arg, const uint8_t *rest, size_t rest_len)
{
	struct client *c = srv.link;
	const char *name = names[arg & 3], *text = texts[(arg >> 2) & 7];
	static const char types[4] = { 'P', 'B', 'D', 'C' };
	uint8_t body[600];

	switch (op % 12) {
	case 0: case 1: case 2: case 3:
		client_msg(c, types[op % 4], body, good_body(body, types[op % 4], name, text));
		break;
	case 4:
		client_msg(c, types[arg & 3], rest, (uint32_t)(rest_len < 64 ? rest_len : 64));
		break;
	case 5:
		reply(false);
		break;
	case 6:
		reply(true);
		break;
	case 7:			/* the client's Sync */
		rq_push(&srv.rq, 'S', RQ_FWD);
		evbuffer_add(bufferevent_get_output(srv.bev), "S\0\0\0\4", 5);
		break;
	case 8:
		if (!srv.rq.count) {	/* the server goes to the other client */
			c->link = NULL;
			srv.link = &cl[arg & 1];
			srv.link->link = &srv;
		}
		break;
	case 9:
		rt->cf->max_prepared_statements = arg % 5;
		break;
	case 10:		/* DISCARD ALL ran */
		if (!srv.rq.count) {
			ps_statements_dropped(&srv, arg & 1);
			M.n_have = 0;
		}
		break;
	default:
		if (*text)
			ps_reparse(c, name, text);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!setup())
		abort();
	memset(&M, 0, sizeof(M));
	rt->cf->max_prepared_statements = 2;
	srv.link = &cl[0];
	cl[0].link = &srv;
	cl[1].link = NULL;
	for (size_t i = 0; i + 1 < size && i < 2000; i += 2) {
		struct rq_item *head;
		run_op(data[i], data[i + 1], data + i + 2, size - i - 2);
		model_read_server();
		if (getenv("LOKADB_FUZZ_TRACE"))
			fprintf(stderr, "op %d arg %d: lru %u, model %d (+ in flight %d), queue %u, client %u\n",
				data[i] % 12, data[i + 1], ps_server_count(&srv), M.n_have, model_future(),
				srv.rq.count, ps_client_count(srv.link));
		if (rq_real() != (unsigned)M.n || ps_server_count(&srv) != (unsigned)model_future())
			abort();
		head = rq_head(&srv.rq);
		if (head && head->act == RQ_SYNTH)
			abort();
		drain(cl[0].bev);
		drain(cl[1].bev);
	}
	rq_free(&srv.rq);
	ps_server_free(&srv);
	ps_client_free(&cl[0]);
	ps_client_free(&cl[1]);
	pkt_reset(&rt->pb);
	return 0;
}
