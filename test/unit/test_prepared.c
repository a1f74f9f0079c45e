/* SPDX-License-Identifier: ISC */
/*
 * test_prepared.c -- unit tests of src/prepared.c: the reply queue as a data
 * structure, and the statement cache, the client names and the server LRU
 * driven through ps_parse/ps_bind/ps_close without PostgreSQL.
 *
 * The fixture is one runtime (config_defaults()), one pool and objects that
 * stand for a client and a server: their bufferevents have no socket, so
 * what lokadb writes to them stays in their output evbuffers, where a case
 * reads it back (out_take()). Messages are spelled out by hand.
 */
#include "core.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>

struct fx {
	struct pool p;
	struct lk_db db;
	struct client c, c2;
	struct server s;
};

static bool rt_up(void)
{
	if (rt->cf)
		return true;
	runtime_init();
	rt->quiet = true;
	rt->cf = config_defaults();
	if (!rt->base)
		rt->base = event_base_new();
	return rt->cf && rt->base;
}

static bool fx_init(struct fx *f, int max)
{
	memset(f, 0, sizeof(*f));
	if (!rt_up())
		return false;
	rt->cf->max_prepared_statements = max;
	f->db.name = "db";
	f->p.db = &f->db;
	f->p.login_user = "u";
	f->c.pool = f->c2.pool = f->s.pool = &f->p;
	f->c.ps_on = f->c2.ps_on = true;
	f->c.bev = bufferevent_socket_new(rt->base, -1, 0);
	f->c2.bev = bufferevent_socket_new(rt->base, -1, 0);
	f->s.bev = bufferevent_socket_new(rt->base, -1, 0);
	f->s.link = &f->c;
	f->c.link = &f->s;
	return f->c.bev && f->c2.bev && f->s.bev;
}

static void fx_done(struct fx *f)
{
	rq_free(&f->s.rq);
	ps_client_free(&f->c);
	ps_client_free(&f->c2);
	ps_server_free(&f->s);
	if (f->c.bev)
		bufferevent_free(f->c.bev);
	if (f->c2.bev)
		bufferevent_free(f->c2.bev);
	if (f->s.bev)
		bufferevent_free(f->s.bev);
}

/* What was written to bev, as a string of message types ("P", "C", ...); the names of P/C/B in names. */
static void out_take(struct bufferevent *bev, char *types, size_t tlen, char *names, size_t nlen)
{
	struct evbuffer *out = bufferevent_get_output(bev);
	size_t nt = 0, nn = 0;

	evbuffer_unfreeze(out, 1);	/* a bufferevent's output is drained by it only */
	while (evbuffer_get_length(out) >= 5) {
		uint8_t hdr[5], *m;
		uint32_t len;
		evbuffer_copyout(out, hdr, 5);
		len = pkt_get_u32(hdr + 1);
		m = evbuffer_pullup(out, len + 1);
		if (nt + 1 < tlen)
			types[nt++] = (char)hdr[0];
		if (hdr[0] == 'P' || hdr[0] == 'C' || hdr[0] == 'B') {
			const char *name = (const char *)m + 5;
			if (hdr[0] == 'C')
				name++;
			else if (hdr[0] == 'B')
				name += strlen(name) + 1;	/* after the portal */
			nn += (size_t)snprintf(names + nn, nlen - nn, "%s%s", nn ? "," : "", name);
		}
		evbuffer_drain(out, len + 1);
	}
	evbuffer_freeze(out, 1);
	types[nt] = 0;
	if (!nn)
		names[0] = 0;
}

/* A C string into buf at *n, with its NUL. */
static void put_str(uint8_t *buf, uint32_t *n, const char *str)
{
	memcpy(buf + *n, str, strlen(str) + 1);
	*n += (uint32_t)strlen(str) + 1;
}

/* The type byte and length of the message of n bytes in buf; returns n. */
static uint32_t finish(uint8_t *buf, char type, uint32_t n)
{
	buf[0] = (uint8_t)type;
	buf[1] = 0; buf[2] = 0; buf[3] = (uint8_t)((n - 1) >> 8); buf[4] = (uint8_t)(n - 1);
	return n;
}

static uint32_t mk_parse(uint8_t *buf, const char *name, const char *sql)
{
	uint32_t n = 5;
	put_str(buf, &n, name);
	put_str(buf, &n, sql);
	buf[n++] = 0;		/* no parameter types */
	buf[n++] = 0;
	return finish(buf, 'P', n);
}

static uint32_t mk_bind(uint8_t *buf, const char *name)
{
	uint32_t n = 5;
	put_str(buf, &n, "");	/* portal */
	put_str(buf, &n, name);
	memset(buf + n, 0, 6);	/* no formats, no params, no result formats */
	n += 6;
	return finish(buf, 'B', n);
}

static uint32_t mk_close(uint8_t *buf, const char *name)
{
	uint32_t n = 6;
	buf[5] = 'S';
	put_str(buf, &n, name);
	return finish(buf, 'C', n);
}

static uint32_t mk_query(uint8_t *buf, const char *sql)
{
	uint32_t n = 5;
	put_str(buf, &n, sql);
	return finish(buf, 'Q', n);
}

static int do_parse(struct client *c, const char *name, const char *sql)
{
	uint8_t buf[256];
	return ps_parse(c, buf, mk_parse(buf, name, sql));
}

static int do_bind(struct client *c, const char *name)
{
	uint8_t buf[256];
	uint32_t n = mk_bind(buf, name), used = 0;
	int rc = ps_bind(c, buf, n, n, &used);
	if (rc == PS_DONE && used)	/* the rest of the Bind, as client.c sends it */
		evbuffer_add(bufferevent_get_output(c->link->bev), buf + used, n - used);
	return rc;
}

/* ------------------------------------------------------------------------- */

static bool test_queue_wraps_and_grows(void)
{
	struct replyq q = { 0 };
	bool ok = true;

	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 40; i++)
			CHECK(rq_push(&q, (char)('a' + i % 26), RQ_FWD));
		CHECK(q.count == 40);
		CHECK(rq_at(&q, 39)->type == 'a' + 39 % 26);
		for (int i = 0; i < 30; i++) {
			CHECK(rq_head(&q)->type == 'a' + i % 26);
			rq_pop(&q);
		}
		for (int i = 0; i < 30; i++)
			rq_pop(&q);
		CHECK(q.count == 0 && rq_head(&q) == NULL);
	}
	CHECK(rq_push(&q, 'E', RQ_FWD) && rq_push(&q, 'S', RQ_FWD) && rq_push(&q, 'S', RQ_FWD));
	rq_remove(&q, 1);
	CHECK(q.count == 2 && rq_at(&q, 0)->type == 'E' && rq_at(&q, 1)->type == 'S' && !rq_at(&q, 2));
end:
	rq_free(&q);
	return ok;
}

static bool test_second_client_parse_is_answered_by_the_pooler(void)
{
	struct fx f;
	char t[32], n[256];
	bool ok = true;

	CHECK(fx_init(&f, 200));
	CHECK(do_parse(&f.c, "a", "select 1") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "P");
	CHECK(strncmp(n, "LOKADB_", 7) == 0);
	CHECK(ps_client_count(&f.c) == 1 && ps_server_count(&f.s) == 1);
	CHECK(rq_head(&f.s.rq)->type == 'P' && rq_head(&f.s.rq)->act == RQ_FWD);
	rq_pop(&f.s.rq);		/* its ParseComplete came */
	/* another client, the same text, on the same server: nothing to send */
	f.s.link = &f.c2;
	f.c2.link = &f.s;
	CHECK(do_parse(&f.c2, "other", "select 1") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "");
	out_take(f.c2.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "1");		/* ParseComplete at once: nothing was owed before it */
	CHECK(f.s.rq.count == 0);
	/* the same name twice: the text goes first as the unnamed statement (its own error would come
	 * first), then the server is made to raise 42P05 */
	CHECK(do_parse(&f.c2, "other", "select 2") == PS_FAIL);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "PPBE");
	CHECK(f.s.rq.count == 4 && rq_head(&f.s.rq)->act == RQ_HIDE);
	CHECK(ps_client_count(&f.c2) == 1);
end:
	fx_done(&f);
	return ok;
}

static bool test_lru_evicts_oldest_and_reprepares_on_bind(void)
{
	struct fx f;
	char t[32], n[256], first[64];
	bool ok = true;

	CHECK(fx_init(&f, 2));
	CHECK(do_parse(&f.c, "s0", "select 0") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), first, sizeof(first));
	CHECK(do_parse(&f.c, "s1", "select 1") == PS_DONE);
	CHECK(do_parse(&f.c, "s2", "select 2") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "PCP");		/* the oldest (s0's) closed before the third is prepared */
	CHECK(strstr(n, first) != NULL);
	CHECK(ps_server_count(&f.s) == 2 && ps_client_count(&f.c) == 3);
	/* Bind of s0: prepared again (hidden), evicting s1 */
	CHECK(do_bind(&f.c, "s0") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "CPB");
	CHECK(ps_server_count(&f.s) == 2);
	/* Bind of s2 (present): only the Bind, renamed */
	CHECK(do_bind(&f.c, "s2") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "B");
	CHECK(strncmp(n, "LOKADB_", 7) == 0);
	CHECK(do_bind(&f.c, "nosuch") == PS_FAIL);
end:
	fx_done(&f);
	return ok;
}

static bool test_skipped_messages_are_undone(void)
{
	struct fx f;
	char t[32], n[256];
	uint8_t buf[256];
	bool ok = true;

	CHECK(fx_init(&f, 200));
	CHECK(do_parse(&f.c, "keep", "select 1") == PS_DONE);
	while (f.s.rq.count)
		rq_pop(&f.s.rq);	/* answered */
	/* a batch: Bind (fails), Parse of a new statement, Close of "keep", Sync */
	CHECK(do_bind(&f.c, "keep") == PS_DONE);
	CHECK(do_parse(&f.c, "new", "select 2") == PS_DONE);
	CHECK(ps_close(&f.c, buf, mk_close(buf, "keep")) == PS_DONE);
	CHECK(rq_push(&f.s.rq, 'S', RQ_FWD));
	CHECK(ps_client_count(&f.c) == 1 && ps_server_count(&f.s) == 2);
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "");		/* the CloseComplete waits for the replies before it */
	/* ErrorResponse to the Bind: the server skipped the rest up to the Sync */
	CHECK(rq_discard_batch(&f.s, true));
	CHECK(f.s.rq.count == 1 && rq_head(&f.s.rq)->type == 'S');
	CHECK(ps_client_count(&f.c) == 1 && ps_server_count(&f.s) == 1);
	CHECK(do_parse(&f.c, "new", "select 2") == PS_DONE);	/* "new" is free again */
	CHECK(do_bind(&f.c, "keep") == PS_DONE);			/* "keep" still exists */
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "");		/* the skipped CloseComplete was never sent */
end:
	fx_done(&f);
	return ok;
}

/*
 * A failed batch whose statements the next, already pipelined batch closed
 * and prepared again: the server ends up with what that next batch does.
 */
static bool test_failed_batch_settles_with_the_next_one(void)
{
	struct fx f;
	char t[32], n[256];
	bool ok = true;

	CHECK(fx_init(&f, 1));
	CHECK(do_parse(&f.c, "x", "select 1") == PS_DONE);	/* batch 1: fails */
	CHECK(rq_push(&f.s.rq, 'S', RQ_FWD));
	CHECK(do_parse(&f.c, "y", "select 2") == PS_DONE);	/* batch 2: closes x, prepares y */
	CHECK(do_bind(&f.c, "x") == PS_DONE);			/* ... closes y, prepares x again */
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "PCPCPB");
	CHECK(rq_discard_batch(&f.s, true));		/* ErrorResponse to batch 1's Parse */
	CHECK(ps_client_count(&f.c) == 1);	/* "x" was never created; "y" was */
	CHECK(ps_server_count(&f.s) == 1);	/* batch 2's Parse of x's text will run */
	CHECK(do_bind(&f.c, "y") == PS_DONE);	/* y was closed by batch 2: again, making room */
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "CPB");
end:
	fx_done(&f);
	return ok;
}

/*
 * A batch binds a statement the server lacks: the pooler prepares it in
 * front (hidden). The next batch, sent past that batch's Sync, binds it
 * again before the first is answered: an error there may yet skip the
 * Parse, so it is closed and prepared again (PostgreSQL takes a Close of a
 * statement it lacks). Once the batches are answered, a Bind is a Bind.
 */
static bool test_a_bind_past_a_sync_prepares_again_what_may_be_skipped(void)
{
	struct fx f;
	char t[32], n[256];
	bool ok = true;

	CHECK(fx_init(&f, 1));
	CHECK(do_parse(&f.c, "x", "select 1") == PS_DONE);
	CHECK(do_parse(&f.c, "y", "select 2") == PS_DONE);	/* closes x: one at most */
	while (f.s.rq.count)
		rq_pop(&f.s.rq);	/* answered */
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK(do_bind(&f.c, "x") == PS_DONE);			/* closes y, prepares x */
	CHECK(rq_push(&f.s.rq, 'S', RQ_FWD));
	CHECK(do_bind(&f.c, "x") == PS_DONE);			/* past the Sync */
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "CPBCPB");
	CHECK(do_bind(&f.c, "x") == PS_DONE);			/* the same batch: settled by its own */
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "B");
	CHECK(rq_discard_batch(&f.s, true));		/* ErrorResponse to the first batch's Close */
	CHECK(ps_server_count(&f.s) == 2);	/* y (not closed) and x (the second batch's) */
	while (f.s.rq.count)
		rq_pop(&f.s.rq);
	CHECK(do_bind(&f.c, "x") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "B");
end:
	fx_done(&f);
	return ok;
}

static bool test_synthesized_replies_wait_their_turn(void)
{
	struct fx f;
	char t[32], n[256];
	uint8_t buf[256];
	bool ok = true;

	CHECK(fx_init(&f, 200));
	CHECK(do_parse(&f.c, "x", "select 1") == PS_DONE);	/* owed: ParseComplete */
	CHECK(ps_close(&f.c, buf, mk_close(buf, "nosuch")) == PS_DONE);
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "");
	rq_pop(&f.s.rq);		/* the server's ParseComplete was forwarded */
	rq_flush_synth(&f.s);
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "3");
	CHECK(f.s.rq.count == 0);
	/* DISCARD ALL by the client: its names and the server's statements go */
	ps_statements_dropped(&f.s, true);
	CHECK(ps_client_count(&f.c) == 0 && ps_server_count(&f.s) == 0);
end:
	fx_done(&f);
	return ok;
}

/*
 * A name whose Parse or Close is unanswered in an earlier batch (only the
 * client's own Syncs end one) is unsettled for the client's next messages;
 * while the server skips to a Sync the client has not sent, replies the
 * pooler would make up wait and go with the skipped.
 */
static bool test_names_unsettled_in_an_earlier_batch(void)
{
	struct fx f;
	char t[32], n[256];
	uint8_t buf[256];
	bool ok = true;

	CHECK(fx_init(&f, 200));
	CHECK(do_parse(&f.c, "a", "select 1") == PS_DONE);
	CHECK(!ps_name_unsettled(&f.c, "a"));			/* its own batch */
	CHECK(rq_push(&f.s.rq, 'Q', RQ_HIDE));			/* a plugin's hidden Query ends no batch */
	CHECK(!ps_name_unsettled(&f.c, "a"));
	CHECK(ps_msg_name_unsettled(&f.c, buf, mk_bind(buf, "a")) == false);
	CHECK(rq_push(&f.s.rq, 'S', RQ_FWD));			/* the client's Sync */
	CHECK(ps_name_unsettled(&f.c, "a") && !ps_name_unsettled(&f.c, "b") && !ps_name_unsettled(&f.c, ""));
	CHECK(ps_msg_name_unsettled(&f.c, buf, mk_bind(buf, "a")));
	CHECK(ps_msg_name_unsettled(&f.c, buf, mk_close(buf, "a")));
	CHECK(ps_msg_name_unsettled(&f.c, buf, mk_parse(buf, "a", "select 2")));
	CHECK(!ps_msg_name_unsettled(&f.c, buf, mk_parse(buf, "b", "select 2")));
	/* answered: the Parse was skipped (an error before it), the name is gone and settled */
	CHECK(rq_discard_batch(&f.s, false));
	rq_pop(&f.s.rq);
	CHECK(!ps_name_unsettled(&f.c, "a") && ps_client_count(&f.c) == 0);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	/* the server skips to a Sync not sent yet: a ParseComplete made up for a text it has waits */
	CHECK(do_parse(&f.c, "x", "select 1") == PS_DONE);
	rq_pop(&f.s.rq);
	ps_close(&f.c, buf, mk_close(buf, "x"));
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "3");
	f.s.skipping = true;
	CHECK(do_parse(&f.c, "y", "select 1") == PS_DONE);	/* the server has the text */
	out_take(f.c.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "");
	CHECK(f.s.rq.count == 1 && rq_head(&f.s.rq)->act == RQ_SYNTH);
	CHECK(rq_push(&f.s.rq, 'S', RQ_FWD));
	rq_discard_batch(&f.s, false);				/* at its ReadyForQuery: skipped */
	CHECK(ps_client_count(&f.c) == 0);
end:
	fx_done(&f);
	return ok;
}

/* SQL DEALLOCATE of a client's name: recognized by the parser, sent as the pooler's batch, undone when skipped. */
static bool test_sql_deallocate_of_a_client_name(void)
{
	struct fx f;
	char t[32], n[256], *name;
	uint8_t buf[256];
	uint32_t len;
	bool ok = true;

	CHECK(fx_init(&f, 200));
	CHECK(do_parse(&f.c, "Mixed", "select 1") == PS_DONE);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	rq_pop(&f.s.rq);
	/* the cheap look at the start, then the parser */
	len = mk_query(buf, "  deallocate prepare \"Mixed\";");
	CHECK(ps_deallocate_candidate(buf, len));
	name = ps_deallocate_of(&f.c, buf, len);
	CHECK(name && strcmp(name, "Mixed") == 0);
	free(name);
	len = mk_query(buf, "DEALLOCATE mixed");		/* folded: another name, not the client's */
	CHECK(ps_deallocate_of(&f.c, buf, len) == NULL);
	len = mk_query(buf, "DEALLOCATE \"Mixed\"; SELECT 1");	/* not all of the Query */
	CHECK(ps_deallocate_of(&f.c, buf, len) == NULL);
	len = mk_query(buf, "DEALLOCATE ALL");
	CHECK(ps_deallocate_of(&f.c, buf, len) == NULL);
	len = mk_query(buf, "SELECT 'deallocate'");
	CHECK(!ps_deallocate_candidate(buf, len));
	len = mk_parse(buf, "named", "DEALLOCATE \"Mixed\"");		/* a named Parse runs nothing */
	CHECK(!ps_deallocate_candidate(buf, len));
	len = mk_parse(buf, "", "DEALLOCATE \"Mixed\"");
	CHECK(ps_deallocate_candidate(buf, len));
	name = ps_deallocate_of(&f.c, buf, len);
	CHECK(name != NULL);
	/* as a Query: the pooler's own statement, closed first, then a batch of its own */
	ps_deallocate(&f.c, 'Q', name);
	CHECK(ps_client_count(&f.c) == 0);
	out_take(f.s.bev, t, sizeof(t), n, sizeof(n));
	CHECK_STR(t, "CPPBES");
	CHECK(f.s.rq.count == 6 && rq_at(&f.s.rq, 4)->act == RQ_FWD && rq_at(&f.s.rq, 5)->act == RQ_FWD);
	/* an error at the first message: the server skips to the Sync, the name comes back */
	CHECK(rq_discard_batch(&f.s, true));
	CHECK(ps_client_count(&f.c) == 1);
end:
	fx_done(&f);
	return ok;
}

static bool names_drop_all(const char *sql)
{
	return ps_sql_names_drop_all(sql, strlen(sql));
}

/* A Query that may drop every prepared statement: either word anywhere, in any case. */
static bool test_names_drop_all(void)
{
	bool ok = true;

	CHECK(names_drop_all("DISCARD ALL"));
	CHECK(names_drop_all("select 1; deallocate all"));
	CHECK(names_drop_all("SELECT 1; DeAlLoCaTe prepare x"));
	CHECK(names_drop_all("/* d */ dIsCaRd plans"));
	CHECK(names_drop_all("SELECT 'discard'"));	/* conservative: a literal counts */
	CHECK(!names_drop_all(""));
	CHECK(!names_drop_all("SELECT d.id FROM documents d WHERE d.deleted_at IS NULL"));
	CHECK(!names_drop_all("SELECT 'discar' || 'dealloc'"));
	CHECK(!names_drop_all("d"));
	/* every place in the eight-byte steps and the tail, either case */
	for (int at = 0; at < 20; at++) {
		char buf[64];
		snprintf(buf, sizeof(buf), "%.*s%s", at, "xxxxxxxxdxxxxxxxDxxxxxxx", at % 2 ? "DISCARD" : "deallocate");
		CHECK(names_drop_all(buf));
		snprintf(buf, sizeof(buf), "%.*s%s", at, "xxxxxxxxdxxxxxxxDxxxxxxx", at % 2 ? "DISCAR" : "deallocat");
		CHECK(!names_drop_all(buf));
	}
	CHECK(!names_drop_all("\x01\x01\x01" "d\x01\x01\x01\x01\xe4\xc4" "discar"));	/* bytes the step's test may take for a 'd' */
	/* the message's length, not its first NUL (PostgreSQL refuses the message anyway) */
	CHECK(ps_sql_names_drop_all("select 1\0discard", 16));
	CHECK(!ps_sql_names_drop_all("select 1\0discard", 8));
end:
	return ok;
}

static const struct unit_case cases[] = {
	{ "reply queue wraps, grows and removes", test_queue_wraps_and_grows },
	{ "a query naming discard or deallocate anywhere", test_names_drop_all },
	{ "second client's parse is answered by the pooler", test_second_client_parse_is_answered_by_the_pooler },
	{ "lru evicts the oldest and re-prepares on bind", test_lru_evicts_oldest_and_reprepares_on_bind },
	{ "messages the server skipped are undone", test_skipped_messages_are_undone },
	{ "a failed batch settles with the next one", test_failed_batch_settles_with_the_next_one },
	{ "a Bind past a Sync prepares again what may be skipped",
	  test_a_bind_past_a_sync_prepares_again_what_may_be_skipped },
	{ "synthesized replies wait their turn", test_synthesized_replies_wait_their_turn },
	{ "SQL DEALLOCATE of a client's name", test_sql_deallocate_of_a_client_name },
	{ "names unsettled in an earlier batch", test_names_unsettled_in_an_earlier_batch },
	{ NULL, NULL }
};

UNIT_MAIN("prepared", cases)
