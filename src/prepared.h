/* SPDX-License-Identifier: ISC */
/*
 * prepared.h -- what a server owes for the messages it was sent (the reply
 * queue), and protocol-level prepared statements in transaction and
 * statement pooling (PgBouncer 1.21's max_prepared_statements).
 *
 * The reply queue: one item per message that the server answers (Query,
 * FunctionCall, Sync: ReadyForQuery; Parse, Bind, Describe, Execute, Close:
 * their completion message), in the order they were sent. An item is
 *   RQ_FWD    the client's own message: its reply goes to the client;
 *   RQ_HIDE   the pooler's message: a hidden Query drops everything up to
 *             its ReadyForQuery, a hidden Parse/Close/Bind only its
 *             completion (errors still reach the client);
 *   RQ_SYNTH  a reply the pooler makes itself (ParseComplete of a statement
 *             the server already has, CloseComplete; type 'r': the bytes of
 *             a refusal or of a plugin's answer, rq_synth_reply): written to
 *             the client when the item reaches the head, so the client sees
 *             its replies in pipeline order.
 * After an ErrorResponse to an extended-protocol message the server skips
 * everything up to the next Sync: those items are discarded and what they
 * did to the statement maps is undone (rq_item.undo). What a later batch,
 * already sent, did to the same statement or name stays: it came last. A
 * client name goes back to what it was; a server's statement is settled
 * from its state before the failed batch and the later messages.
 *
 * Prepared statements (only for clients with c->ps_on):
 *   - one global cache: Parse body (query text + parameter type OIDs) ->
 *     ps_entry with a 64-bit id, the server-side name "LOKADB_<id>" and a
 *     reference count (client maps, server LRUs and queue items hold one);
 *   - per client: the client's statement name -> entry;
 *   - per server connection: the entries it has prepared, an LRU of at most
 *     max_prepared_statements (read at each insertion: a lower value
 *     applies as servers evict).
 * Unnamed statements, portals and SQL PREPARE/EXECUTE pass through.
 */
#ifndef LOKADB_PREPARED_H
#define LOKADB_PREPARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct client;
struct ps_cli;
struct ps_srv;
struct ps_cache;
struct server;
struct ps_entry;

enum rq_act { RQ_FWD, RQ_HIDE, RQ_SYNTH };

/* what to undo when the server skipped the message (an earlier error) */
enum rq_undo {
	RQ_UNDO_SRV_PARSE = 1,	/* the server did not prepare `e` */
	RQ_UNDO_SRV_CLOSE = 2,	/* the server did not close `e`: it still has it */
	RQ_UNDO_CL_PARSE = 4,	/* the client's `name` was not created */
	RQ_UNDO_CL_CLOSE = 8,	/* the client's `name` (-> e) was not closed */
	/* a Close of `e` sent whatever the server has (an earlier batch may yet
	 * skip its Parse or Close): its RQ_UNDO_SRV_CLOSE says whether the
	 * server has e before it, set again when that batch is known */
	RQ_UNDO_SRV_RECLOSE = 16,
};

struct rq_item {
	char type;		/* the message sent: Q F S P B D E C */
	uint8_t act;		/* enum rq_act */
	uint8_t undo;		/* enum rq_undo bits */
	struct ps_entry *e;	/* a reference, or NULL */
	struct ps_entry *e_parsed;	/* a Close of a name a plugin re-parsed: its ps_cname.parsed (a reference) */
	char *name;		/* the client's statement name (owned), or NULL */
	/* a client Query with query_set_var values in front (query_vars_inline) */
	uint8_t hide_cc;	/* its leading CommandCompletes still to drop (the SETs') */
	bool vars;		/* it carries values: its ReadyForQuery tells plugin.c */
	bool vars_err;		/* it failed (the values were rolled back) */
	uint32_t shift;		/* characters in front: an error's position moves back by it */
	struct textmap *map;	/* a Query or Parse a plugin rewrote: its text as the client's (owned) */
	struct lk_tables *tables;	/* a Query or Describe: its RowDescriptions renamed (a reference) */
	/* the first ReadyForQuery owed after values sent inside a batch (server_send_hidden_ext) */
	bool vars_ext;
	uint32_t ext_seq;	/* the last of those sends (tvars.esent) it answers */
	/* a plugin's re-parse of the client's statement `name` (statements not
	 * cached by the core): the generation of the text it gave (0: none) */
	uint32_t reparse_gen;
	/* what the client's Parse, Close of a statement or Query did to the
	 * statement texts plugins see (plugin.c's stmt_text), undone when the
	 * server skips or refuses it (plugin_stmt_undo) */
	struct stmt_text *st_before;	/* the name's entry before it (owned), or NULL: none */
	uint64_t st_made;		/* the entry a Parse made (stmt_text.id), 0: none */
	uint32_t st_gen_at;		/* a Query: the last text generation given when it went (0: not known) */
	bool mark_txn;			/* a plugin asked how its transaction ends (api->query_mark_txn) */
	bool rn_undo;			/* a Parse: rn_before is what its name's Describes were renamed with before */
	struct lk_tables *rn_before;	/* (a reference, or NULL: not renamed) */
	bool drops_all;			/* a client's Query that may DISCARD ALL or DEALLOCATE ALL */
	/* a client's Close (or Query's DEALLOCATE) of the statement text plugins
	 * see of this name (owned; a client's Query drops the unnamed one) */
	char *st_drops;
	bool reply_ready;		/* type 'r': a ReadyForQuery goes after the bytes */
	uint32_t reply_len;
	uint8_t *reply;			/* type 'r': the made-up reply (owned) */
	bool st_undo;
};

struct replyq {
	struct rq_item *v;
	uint32_t head, count, cap;
	uint32_t syncs;		/* its items that owe a ReadyForQuery (S, Q, F) */
	bool marked_gone;	/* an item with mark_txn was answered or skipped (server.c takes it) */
};

/* ---- the reply queue (no server needed: unit-testable) ---- */
/* Is a message of this type answered by a ReadyForQuery (Sync, Query, FunctionCall)? */
static inline bool rq_owes_ready(char type)
{
	return type == 'S' || type == 'Q' || type == 'F';
}
/*
 * Is the last item `match` takes in a batch before the queue's last item
 * owing a ReadyForQuery (an earlier batch, not answered yet: the client sent
 * past its Sync, and an error there may yet make the server skip the item)?
 */
bool rq_unsettled(const struct replyq *q, bool (*match)(const struct rq_item *it, const void *arg), const void *arg);
/* The same with only the client's own Syncs and Queries ending a batch (the ones an error skips to) */
bool rq_client_unsettled(const struct replyq *q, bool (*match)(const struct rq_item *it, const void *arg),
			 const void *arg);
/* Does the queue hold a Sync or Query of the client's (not a hidden one of the pooler's)? */
bool rq_client_owes_ready(const struct replyq *q);
/* Is the server in a failed transaction block that nothing sent to it since may end? */
bool server_block_failed(const struct server *s);
struct rq_item *rq_push(struct replyq *q, char type, int act);	/* NULL: out of memory */
struct rq_item *rq_at(const struct replyq *q, uint32_t i);	/* i-th from the head, or NULL */
void rq_pop(struct replyq *q);
void rq_remove(struct replyq *q, uint32_t i);
void rq_free(struct replyq *q);
static inline struct rq_item *rq_head(const struct replyq *q)
{
	return q->count ? &q->v[q->head] : NULL;
}

/* ---- server side (server.c) ---- */
/* Queue the expectation of a reply; closes the server when out of memory (NULL). */
struct rq_item *server_expect(struct server *s, char type, int act);
/* Write the synthesized replies now at the head of the queue to the client. */
void rq_flush_synth(struct server *s);
/*
 * A made-up reply (pb, emptied; ready: then a ReadyForQuery with the
 * server's status at that point) to a client message the pooler answers
 * itself while the server owes the client earlier replies: it goes after
 * them, and goes with a batch the server skips, as the message would have
 * (out of memory: the server is closed).
 */
struct pktbuf;
void rq_synth_reply(struct server *s, struct pktbuf *pb, bool ready);
/*
 * An ErrorResponse to an extended-protocol message (head_failed: the head
 * item's), or messages the server skipped: drop the items up to the next
 * Sync, undoing them. true: a Sync is queued.
 */
bool rq_discard_batch(struct server *s, bool head_failed);
/* CommandComplete "DISCARD ALL" / "DEALLOCATE ALL": the session's statements are gone. */
void ps_statements_dropped(struct server *s, bool for_client);

/* ---- client side (client.c) ---- */
enum ps_rc { PS_PASS, PS_DONE, PS_FAIL, PS_MORE };
/*
 * The client's Parse / Describe / Close (whole message at msg, mlen bytes
 * with the type byte) on its linked server. PS_PASS: forward the message
 * unchanged (unnamed statement, portal); PS_DONE: handled (what the server
 * needs was queued on its output); PS_FAIL: the server was given a failing
 * statement carrying the error and the client must skip to its Sync.
 */
int ps_parse(struct client *c, const uint8_t *msg, uint32_t mlen);
/* The client's Parse (its first `have` bytes at msg) names a statement it has: ps_parse refuses it (42P05). */
bool ps_parse_name_in_use(const struct client *c, const uint8_t *msg, uint32_t have);
bool ps_client_has(const struct client *c, const char *name);	/* a protocol-level statement of the client's */
/*
 * A statement name of the client's whose Parse or Close (or DEALLOCATE) is
 * unanswered in an earlier batch: an error there may yet make PostgreSQL
 * skip it, and whether the name exists is known only once it is answered.
 */
bool ps_name_unsettled(const struct client *c, const char *name);
/*
 * The same for the name of a Parse, Bind, Describe or Close (msg, `have`
 * bytes of it from the type byte); also any name while a Query of the
 * client's that may drop every statement (rq_item.drops_all) is unanswered,
 * and a Parse (whole in `have`) of a text the server has, which ps_parse
 * would answer itself, past a Sync not answered (the batches before it
 * may leave a failed transaction block).
 */
bool ps_msg_name_unsettled(const struct client *c, const uint8_t *msg, uint32_t have);
int ps_describe(struct client *c, const uint8_t *msg, uint32_t mlen);
int ps_close(struct client *c, const uint8_t *msg, uint32_t mlen);
/*
 * The client's Bind: `have` bytes of the message are at msg (its whole
 * length is mlen). PS_DONE: the rewritten start of the Bind was queued; the
 * caller sends the rest of the message from byte *used on. PS_MORE: the
 * names are not all in the `have` bytes.
 */
int ps_bind(struct client *c, const uint8_t *msg, uint32_t have, uint32_t mlen, uint32_t *used);
/*
 * SQL `DEALLOCATE [PREPARE] name` of one of the client's protocol-level
 * statements, as a Query or the Parse of the unnamed statement (psycopg's
 * way with libpq before 17): the client's name is forgotten and the server
 * runs an equivalent of the pooler's own, so that the reply and the
 * transaction state are PostgreSQL's. ps_deallocate_candidate: the start of
 * the message (`have` bytes) says it may be one (no parse).
 * ps_deallocate_of: the name when the whole message is one (malloc'd), else
 * NULL (another name, other SQL: the server's business); also a name whose
 * Close is unanswered in an earlier batch (ps_name_unsettled: the caller
 * waits, then asks again). ps_deallocate:
 * sends it on the linked server, `name` given to it.
 */
bool ps_deallocate_candidate(const uint8_t *msg, uint32_t have);
char *ps_sql_deallocate_name(const char *sql);	/* `DEALLOCATE [PREPARE] name` as all of sql: name (malloc'd) */
bool ps_sql_names_drop_all(const char *sql, size_t n);	/* sql[0, n) (sql[n] NUL) names DISCARD or DEALLOCATE anywhere (any case) */
char *ps_deallocate_of(struct client *c, const uint8_t *msg, uint32_t mlen);
struct rq_item *ps_deallocate(struct client *c, char type, char *name);	/* the item of its undo, or NULL */
char *ps_deallocate_name_of(const uint8_t *msg, uint32_t mlen);	/* ps_deallocate_of for any name */
/* A plugin's query_reparse at a Bind of a named statement: the name now stands for `sql` (same parameter types). */
bool ps_reparse(struct client *c, const char *name, const char *sql);

unsigned ps_client_count(const struct client *c);
unsigned ps_server_count(const struct server *s);
void ps_client_free(struct client *c);
void ps_server_free(struct server *s);
void ps_cache_free(void);

#endif
