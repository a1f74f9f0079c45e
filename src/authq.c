/* SPDX-License-Identifier: ISC */
/*
 * authq.c -- auth_query: the secret of a user who is not in auth_file,
 * looked up in PostgreSQL as auth_user (PgBouncer's auth_user/auth_query).
 *
 * Each lookup opens a libpq connection on the event loop (plugin.c's
 * non-blocking helper), runs auth_query with the user name as $1, and hands
 * the second column to the client's authentication: a plain password, an
 * md5 or a SCRAM-SHA-256 secret (pg_authid's rolpassword). No row (or a NULL
 * secret) means: no such user, and the login fails as with a wrong password.
 * The client waits in CL_LOGIN meanwhile; client_login_timeout still runs.
 */
#include "core.h"
#include "scram.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

struct authq_req {
	struct client *c;		/* NULL once the client went away */
	struct lk_pg *pg;
	char *query;			/* the auth_query in force when the lookup started */
	bool done;
};

static void req_free(struct authq_req *r)
{
	free(r->query);
	free(r);
}

/* Append key='value' to a conninfo string, quoting as libpq wants. */
static void kv(char *buf, size_t len, const char *key, const char *value)
{
	size_t n = strlen(buf);

	if (!value || n + strlen(key) + 4 >= len)
		return;
	n += (size_t)snprintf(buf + n, len - n, "%s%s='", n ? " " : "", key);
	for (const char *p = value; *p && n + 3 < len; p++) {
		if (*p == '\'' || *p == '\\')
			buf[n++] = '\\';
		buf[n++] = *p;
	}
	if (n + 1 < len)
		buf[n++] = '\'';
	buf[n] = 0;
}

static void finish(struct authq_req *r, const char *secret, const char *error)
{
	struct client *c = r->c;

	if (r->done)
		return;
	r->done = true;
	if (c) {
		c->authq = NULL;
		r->c = NULL;
		client_authq_done(c, secret, error);
	}
	core_pg_close(r->pg);	/* deferred inside the helper's callbacks */
	req_free(r);
}

static void on_result(lk_plugin *self, lk_pg *pg, struct pg_result *res, void *arg)
{
	struct authq_req *r = arg;
	(void)self;

	if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
		char msg[512];
		const char *e = res ? PQresultErrorMessage(res) : PQerrorMessage((PGconn *)core_pg_conn(pg));
		snprintf(msg, sizeof(msg), "%s", e && *e ? e : "no result");
		msg[strcspn(msg, "\n")] = 0;
		finish(r, NULL, msg);
		return;
	}
	if (PQntuples(res) < 1 || PQnfields(res) < 2 || PQgetisnull(res, 0, 1))
		finish(r, NULL, NULL);	/* no such user */
	else
		finish(r, PQgetvalue(res, 0, 1), NULL);
}

static void on_state(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	struct authq_req *r = arg;
	const char *params[1];
	(void)self;

	if (r->done)
		return;
	if (!ok) {
		finish(r, NULL, err ? err : "connection failed");
		return;
	}
	if (!r->c) {
		finish(r, NULL, NULL);
		return;
	}
	params[0] = r->c->user;
	if (core_pg_query(pg, r->query, 1, params, on_result, r) != 0)
		finish(r, NULL, "could not send auth_query");
}

/*
 * Start a lookup for c; false when auth_query is not configured for its
 * database. The [databases] entry's auth_user, auth_query and auth_dbname
 * win over the global ones (PgBouncer 1.24).
 */
bool authq_start(struct client *c)
{
	const struct db_conf *dc = &c->db->conf;
	const char *user = dc->auth_user ? dc->auth_user : rt->cf->auth_user;
	const char *query = dc->auth_query ? dc->auth_query : rt->cf->auth_query;
	const char *dbname = dc->auth_dbname ? dc->auth_dbname : rt->cf->auth_dbname;
	const struct auth_entry *ae;
	char conninfo[2048] = "", port[16], timeout[16];
	struct authq_req *r;

	if (!user || !*user || !query || !*query)
		return false;
	ae = config_find_auth(rt->cf, user);
	snprintf(port, sizeof(port), "%d", dc->port > 0 ? dc->port : 5432);
	snprintf(timeout, sizeof(timeout), "%lld",
		 (long long)(rt->cf->server_connect_timeout > 0 ? (rt->cf->server_connect_timeout + USEC - 1) / USEC : 15));
	kv(conninfo, sizeof(conninfo), "host", dc->host ? dc->host : "/var/run/postgresql");
	kv(conninfo, sizeof(conninfo), "port", port);
	kv(conninfo, sizeof(conninfo), "dbname", dbname ? dbname : dc->dbname ? dc->dbname : c->db->name);
	kv(conninfo, sizeof(conninfo), "user", user);
	if (ae && !scram_is_scram_secret(ae->secret) && !scram_is_md5_secret(ae->secret))
		kv(conninfo, sizeof(conninfo), "password", ae->secret);
	else if (dc->password && dc->user && strcmp(dc->user, user) == 0)
		kv(conninfo, sizeof(conninfo), "password", dc->password);
	kv(conninfo, sizeof(conninfo), "connect_timeout", timeout);
	kv(conninfo, sizeof(conninfo), "application_name", "lokadb auth_query");
	kv(conninfo, sizeof(conninfo), "sslmode", rt->cf->server_tls_sslmode == SSL_DISABLE ? "disable" : "prefer");
	r = xcalloc(1, sizeof(*r));
	r->c = c;
	r->query = xstrdup(query);
	c->authq = r;
	r->pg = core_pg_connect(conninfo, on_state, r);
	if (!r->pg) {
		c->authq = NULL;
		req_free(r);
		return false;
	}
	return true;
}

/* The client goes away while its lookup runs. */
void authq_cancel(struct client *c)
{
	struct authq_req *r = c->authq;

	if (!r)
		return;
	c->authq = NULL;
	r->c = NULL;
	r->done = true;
	core_pg_close(r->pg);
	req_free(r);
}
