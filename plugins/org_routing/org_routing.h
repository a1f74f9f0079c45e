/* SPDX-License-Identifier: ISC */
/*
 * org_routing.h -- what the files of the org_routing plugin share.
 *
 *   analyze.c   parse a statement text with libpg_query and describe it: the
 *               LokaDB tables it touches, the organization terms that scope
 *               each of them, and its effects on the session (SET lokadb.org,
 *               search_path, BEGIN/ROLLBACK). Pure: no plugin API calls.
 *   cache.c     the parse cache: analyses keyed by (statement text, search
 *               path key), bounded, clock eviction.
 *   rewrite.c   address a single-organization statement to the organization's
 *               leaf partitions, and turn COPY table TO into COPY (query) TO;
 *               both by changing the protobuf tree and deparsing it.
 *   org_routing.c  the plugin: settings, hooks, decisions, SHOW ORG_ROUTING.
 *
 * Everything runs on lokadb's single loop thread; nothing here is thread-safe.
 * Every non-static symbol starts with or_ and is hidden (-fvisibility=hidden).
 */
#ifndef ORG_ROUTING_H
#define ORG_ROUTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lokadb/meta_cache.h>
#include <lokadb/plugin.h>

#define NAMEDATALEN_OR 64	/* PostgreSQL identifiers are at most 63 bytes */

/* One organization term: `org_col = 'value'` (param 0) or `org_col = $param`. */
struct or_term {
	int param;		/* 1-based parameter number, or 0 for a constant */
	char *value;		/* the constant as text (normalized); NULL for a parameter */
};

/* One occurrence of a LokaDB table in a statement. */
struct or_ref {
	char *schema, *name;	/* the LokaDB table (copied from the catalog) */
	char *org_column;	/* its organization column */
	char *org_type;		/* format_type() of that column */
	int term0, nterms;	/* its terms in or_analysis.terms; 0 terms: unscoped */
};

/* What a statement does to the session besides its own work. */
enum or_effect {
	OR_FX_NONE = 0,
	OR_FX_SET_ORG,		/* SET lokadb.org / set_config('lokadb.org', v, false) */
	OR_FX_RESET_ORG,	/* RESET lokadb.org, SET lokadb.org TO DEFAULT */
	OR_FX_RESET_ALL,	/* RESET ALL, DISCARD ALL */
	OR_FX_SET_PATH,		/* SET search_path */
	OR_FX_RESET_PATH,	/* RESET search_path */
	OR_FX_BEGIN,		/* BEGIN / START TRANSACTION */
	OR_FX_ROLLBACK,		/* ROLLBACK / ABORT (the session's SETs of the block revert) */
	OR_FX_TEMP_CREATE,	/* CREATE TEMP TABLE/VIEW, CREATE TEMP TABLE AS, SELECT INTO TEMP:
				 * value = the name; is_local: ON COMMIT DROP */
	OR_FX_TEMP_DROP,	/* DROP TABLE/VIEW: value = the unqualified (or pg_temp.) names,
				 * each ended by a NUL, the list by an empty one */
	OR_FX_DISCARD_TEMP,	/* DISCARD TEMP */
	OR_FX_DISCARD_ALL,	/* DISCARD ALL: RESET ALL and DISCARD TEMP */
};

/* How a statement reads or writes its LokaDB tables. */
enum or_kind {
	OR_K_OTHER = 0,		/* no LokaDB table, or DDL/utility on one */
	OR_K_SELECT,
	OR_K_INSERT,
	OR_K_UPDATE,
	OR_K_DELETE,
	OR_K_COPY_TO_TABLE,	/* COPY lokadb_table TO ... */
	OR_K_COPY_TO_QUERY,	/* COPY (query) TO ... */
	OR_K_COPY_FROM,		/* COPY lokadb_table FROM ... */
};

/* One statement of a message. */
struct or_stmt {
	uint8_t effect;		/* enum or_effect */
	uint8_t kind;		/* enum or_kind */
	bool is_local;		/* SET LOCAL / set_config(..., true) */
	bool rewritable;	/* may be addressed to leaf partitions */
	bool parent_insert;	/* an INSERT whose one LokaDB table is its target:
				 * PostgreSQL routes its rows at run time, it stays
				 * on the parent in any plan mode */
	bool batchable;		/* a utility statement that runs the same behind other
				 * messages of a batch (DECLARE, LOCK, TRUNCATE, CREATE
				 * TABLE AS) */
	int ref0, nrefs;	/* its LokaDB table occurrences in or_analysis.refs */
	struct or_term val;	/* OR_FX_SET_ORG: the value; OR_FX_SET_PATH: value = the path;
				 * OR_FX_TEMP_*: the names */
};

/* The analysis of one message text. Owned by the parse cache. */
struct or_analysis {
	int nstmts, nrefs, nterms;
	struct or_stmt *stmts;
	struct or_ref *refs;
	struct or_term *terms;
	bool tables;		/* touches at least one LokaDB table */
	bool effects;		/* at least one statement has an effect */
	bool params;		/* some term or effect value is a parameter */
	bool parse_error;	/* libpg_query refused it: passed through as is */
	bool ends_txn;		/* a COMMIT, ROLLBACK or PREPARE TRANSACTION */
	bool executes;		/* an EXECUTE of a prepared statement (also under EXPLAIN,
				 * CREATE TABLE AS): PostgreSQL's plan cache picks its plan */
	bool reads_settings;	/* its text names current_setting, pg_settings, SHOW or
				 * lokadb.org (or_names_settings) */
	int max_param;		/* the highest $n of its text (0: none; -1: parse_error) */
};

/* ---- analyze.c ---- */

/* What resolves table names: the catalog and the session's search_path. */
struct or_names {
	const struct meta_cache_api *mc;
	const char *search_path;	/* never NULL */
	const char *user;
	const struct or_temps *temps;	/* the session's temporary relations, or NULL */
};

/*
 * The temporary tables and views a client's session made: PostgreSQL looks
 * in pg_temp first for an unqualified relation name (unless the path names
 * pg_temp), so such a name is not the LokaDB table of that name.
 */
struct or_temp {
	char *name;
	bool at_commit;		/* ON COMMIT DROP */
	bool in_block;		/* made by the open transaction: gone if it rolls back */
};
struct or_temps {
	struct or_temp *v;
	int n, cap;
};
bool or_temps_has(const struct or_temps *t, const char *name, size_t len);

/* Analyze `sql` into *out (zeroed first). false: out of memory (out is
 * then freed). A statement libpg_query cannot parse gives parse_error. */
bool or_analyze(const char *sql, const struct or_names *names, struct or_analysis *out);
/* Free what an analysis holds (not the struct itself). NULL is fine. */
void or_analysis_free(struct or_analysis *a);
/* Resolve a RangeVar-like (schema may be NULL or "") to a LokaDB table. */
const struct mc_table *or_resolve(const struct or_names *names, const char *schema, const char *rel);
/* Walk a protobuf-c message tree: fn(arg, m) on m, then, if it returned
 * true, on each message below it (pre-order; only the set case of a oneof). */
struct ProtobufCMessage;
typedef bool (*or_visit_fn)(void *arg, struct ProtobufCMessage *m);
void or_walk(struct ProtobufCMessage *m, or_visit_fn fn, void *arg);
/* Does `sql` name current_setting, pg_settings, pg_show_all_settings, SHOW
 * or lokadb.org, anywhere (also in a comment or a literal)? */
bool or_names_settings(const char *sql);
/* Is `name` the GUC lokadb.org (case-insensitive, as PostgreSQL compares)? */
bool or_is_org_guc(const char *name);

/* ---- cache.c ---- */

struct or_cache;

struct or_cache_stats {
	uint64_t hits, misses, evictions, invalidations;
	size_t entries, capacity;
};

/* A cache of `capacity` entries (at least 16). NULL on out of memory. */
struct or_cache *or_cache_new(size_t capacity);
void or_cache_free(struct or_cache *c);
/*
 * The analysis of (sql, sp_key) for catalog version `version`, analyzing it
 * on a miss (or when it was analyzed for another version). The pointer is
 * valid until the next or_cache_get (it may be evicted by it). NULL: out of
 * memory.
 */
const struct or_analysis *or_cache_get(struct or_cache *c, const char *sql, uint64_t sp_key,
				       uint64_t version, const struct or_names *names);
/* Where an entry is, to find it again without its text: valid while the
 * entry holds that text (an evicted entry's slot gets another gen). */
struct or_cache_ref {
	size_t idx;
	uint64_t gen;		/* 0: none */
};
/* or_cache_get(), and where the entry is in *ref (gen 0 if none). */
const struct or_analysis *or_cache_get_ref(struct or_cache *c, const char *sql, uint64_t sp_key,
					   uint64_t version, const struct or_names *names, struct or_cache_ref *ref);
/* The analysis of the entry *ref if it still holds the same text, for sp_key,
 * analyzed under `version` (a hit); else NULL (use or_cache_get). */
const struct or_analysis *or_cache_at(struct or_cache *c, const struct or_cache_ref *ref, uint64_t sp_key,
				      uint64_t version);
void or_cache_stats(const struct or_cache *c, struct or_cache_stats *st);
/* The memo of the last rewrites of the entry `a` belongs to (see rewrite.c),
 * one slot per organization, the oldest replaced first. A named statement
 * bound with a few organizations in turn costs one deparse per organization. */
#define OR_MEMO_SLOTS 4
struct or_tpl;
struct or_rewrite_memo {
	struct {
		char *org;		/* the organization it was made for; NULL: free slot */
		uint64_t version;	/* the catalog key it was made with */
		char *sql;		/* the rewritten text; NULL: not rewritable */
		struct or_tpl *tpl;	/* sql compiled as a template (or_template_compile), once used */
	} slot[OR_MEMO_SLOTS];
	unsigned next;			/* the slot replaced next */
};
struct or_rewrite_memo *or_cache_memo(struct or_cache *c, const struct or_analysis *a);
/* The memoized rewrite for (org, version): true and *sql (NULL: nothing to
 * rewrite) when known. */
bool or_memo_get(const struct or_rewrite_memo *m, const char *org, uint64_t version, const char **sql);
/* The same: its slot, or -1. */
int or_memo_find(const struct or_rewrite_memo *m, const char *org, uint64_t version);
/* Remember a rewrite; `sql` (may be NULL) is taken over. false: out of memory (sql freed). */
bool or_memo_put(struct or_rewrite_memo *m, const char *org, uint64_t version, char *sql);

uint64_t or_hash(const char *s, size_t n, uint64_t seed);

/* ---- normalize.c ---- */

/* A text with its literals replaced by $1..$n (see normalize.c). Everything
 * it points to lives in one allocation (`mem`), made once per text. */
struct or_norm {
	char *text;		/* the normalized text */
	int n;			/* literals replaced */
	char **vals;		/* their values as the analysis reads constants (integers printed, strings unquoted) */
	char **toks;		/* their texts as written */
	uint32_t *lens;		/* strlen(toks[i]) */
	int cap;		/* room in vals, toks and lens */
	char *arena;		/* where toks and vals are written */
	size_t used, room;	/* of arena */
	void *mem;
	unsigned shape;		/* 1 + the slot of its shape; 0: none */
	uint64_t shape_key;	/* that shape's key */
	bool lit_dq;		/* a string literal holds a double quote */
};

/* false: not normalized (no literal to replace, or a form left as is); out is then empty. */
bool or_normalize(const char *sql, struct or_norm *out);
void or_norm_free(struct or_norm *n);
/* or_normalize() only through a known shape (no scan); false: none matches. */
bool or_normalize_known(const char *sql, struct or_norm *out);
/*
 * The prefilter's answer for the normalized text, memoized with its shape
 * (see normalize.c, "The prefilter and shapes"). usable: the answer for a
 * text of that shape is the answer for the normalized text or-ed with the
 * answers for its string literals (as written). get: the memo for (sp_key,
 * cat); put: remember it.
 */
bool or_shape_mm_usable(const struct or_norm *n);
bool or_shape_mm_get(const struct or_norm *n, uint64_t sp_key, uint64_t cat, unsigned *mm);
void or_shape_mm_put(const struct or_norm *n, uint64_t sp_key, uint64_t cat, unsigned mm);
/* The parse-cache entry of the shape's normalized text, memoized with the
 * shape for one key (search path and user): get, put. */
struct or_cache_ref;
bool or_shape_entry_get(const struct or_norm *n, uint64_t key, struct or_cache_ref *ref);
void or_shape_entry_put(const struct or_norm *n, uint64_t key, const struct or_cache_ref *ref);
/* x in decimal into out (at least 21 bytes); its length. */
size_t or_format_int(long long x, char *out);
/* One token of pg_query_scan: the bytes [start, end) of the text, its PgQuery__Token. */
struct or_tok {
	int64_t start, end, token;
};
/* The tokens of `sql`, in text order (*n of them, caller frees; an empty
 * array when there is none); NULL on a scan error or out of memory. */
struct or_tok *or_scan_tokens(const char *sql, size_t *n);
/* Forget the shapes of normalized texts (see normalize.c); at unload. */
void or_shapes_free(void);
/* A rewrite of a normalized text as a template (each $1..$nlits exactly once); NULL: not one. */
char *or_template_encode(const char *sql, int nlits);
/*
 * A leaf template (or_rewrite with org NULL) names each LokaDB occurrence
 * with a marker instead of a leaf: the quoted identifier
 * "\x03schema\x05table\x06pre.post.client\x04", which or_template_fill()
 * replaces with the organization's leaf of that table. One template serves
 * every organization. The numbers (optional: "\x03schema\x05table\x04")
 * say where the client's text changed around it: `pre` bytes before the
 * marker (the schema and its dot) and `post` after it (an alias added)
 * belong to the name written instead of the client's `client` bytes.
 */
#define OR_LEAF_MARK 0x03
#define OR_LEAF_SEP 0x05
#define OR_LEAF_SPAN 0x06
#define OR_LEAF_END 0x04
/* Where a filled template differs from the client's text (api->query_text_spans). */
#define OR_SPANS_MAX 64
struct or_spans {
	int n;
	bool bad;		/* a marker without its numbers (or too many): no spans to give */
	lk_text_span s[OR_SPANS_MAX];
};
/* The leaf of schema.table for the organization being filled in; NULL: none. */
typedef const char *(*or_leaf_fn)(void *arg, const char *schema, const char *table);
/*
 * The template with the literal texts of `n` (may be NULL) put back and each
 * leaf marker replaced by leaf(arg, schema, table) (caller frees). NULL on
 * out of memory, or with *no_leaf set when a table has no leaf.
 */
char *or_template_fill(const char *tpl, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf);
/* The same into *buf (of *cap bytes, grown with realloc as needed, kept for
 * the next call): false on out of memory or as above. */
bool or_template_fill_buf(const char *tpl, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf,
			  char **buf, size_t *cap);
/* A template compiled once (NULL: out of memory), then filled per message by
 * or_template_run() exactly as or_template_fill_buf() fills its text. With
 * sp (may be NULL): the spans of each leaf put in (a span's name is the
 * pointer leaf() returned, its client_name the template's). */
struct or_tpl *or_template_compile(const char *tpl);
void or_template_free(struct or_tpl *t);
bool or_template_run(const struct or_tpl *t, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf,
		     char **buf, size_t *cap, struct or_spans *sp);

/* ---- rewrite.c ---- */

enum or_rw_result { OR_RW_NONE = 0, OR_RW_DONE, OR_RW_FAILED };

/*
 * Rewrite `sql` (one statement, analyzed as `a`) for organization `org`:
 * every LokaDB table occurrence becomes its leaf partition (alias kept, or
 * the table's name as alias) when `to_leaf` and every table has a leaf; a
 * COPY table TO becomes COPY (SELECT ... WHERE org_col = 'org') TO.
 * With `org` NULL and `to_leaf` (not for COPY table TO): a leaf template,
 * each occurrence named by its OR_LEAF_MARK marker (OR_RW_NONE when a
 * schema or table name holds a double quote or a control byte).
 * OR_RW_DONE: *out is the new text (caller frees). OR_RW_NONE: nothing to
 * change. OR_RW_FAILED: libpg_query could not do it (*err says why,
 * static text).
 */
enum or_rw_result or_rewrite(const char *sql, const struct or_analysis *a, const struct or_names *names,
			     const char *org, bool to_leaf, char **out, const char **err);

/* 'text' as an SQL string literal into buf (doubling quotes); false if it does not fit. */
bool or_quote_literal(const char *text, char *buf, size_t len);

#endif
