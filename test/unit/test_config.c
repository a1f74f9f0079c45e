/* SPDX-License-Identifier: ISC */
/*
 * test_config.c -- unit tests of src/config.c: the settings table, the ini
 * loader and its error messages, [databases]/[users], auth_file, SET,
 * SHOW CONFIG formatting and doc/config.md.
 *
 * Each case writes its files into its own mkdtemp() directory (struct fx)
 * and removes it at `end:`.
 */
#include "config.h"
#include "hba.h"
#include "unit.h"

#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SETTINGS_IN_STRUCT 83	/* fields from logfile to the last setting of struct lk_config */

struct fx {
	bool made;		/* dir exists and must be removed */
	char dir[64];
	char path[PATH_MAX];	/* dir/lokadb.ini */
	char err[1024];
};

static bool fx_init(struct fx *fx)
{
	memset(fx, 0, sizeof(*fx));
	snprintf(fx->dir, sizeof(fx->dir), "/tmp/lokadb-config-XXXXXX");
	if (!mkdtemp(fx->dir))
		return false;
	fx->made = true;
	snprintf(fx->path, sizeof(fx->path), "%s/lokadb.ini", fx->dir);
	return true;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void fx_done(struct fx *fx)
{
	if (fx->made)
		nftw(fx->dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static bool fx_write(struct fx *fx, const char *name, const char *text)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", fx->dir, name);
	f = fopen(path, "w");
	if (!f)
		return false;
	fputs(text, f);
	return fclose(f) == 0;
}

/* Write lokadb.ini and load it. */
static struct lk_config *fx_load(struct fx *fx, const char *ini)
{
	fx->err[0] = '\0';
	if (!fx_write(fx, "lokadb.ini", ini))
		return NULL;
	return config_load(fx->path, fx->err, sizeof(fx->err));
}

/* Is fx->err "DIR/file" followed by tail? */
static bool err_is(const struct fx *fx, const char *file, const char *tail)
{
	char want[2048];

	snprintf(want, sizeof(want), "%s/%s%s", fx->dir, file, tail);
	if (strcmp(fx->err, want) == 0)
		return true;
	fprintf(stderr, "  error was \"%s\"\n  expected  \"%s\"\n", fx->err, want);
	return false;
}

/* Loading `ini` fails with lokadb.ini + tail. */
static bool load_fails(struct fx *fx, const char *ini, const char *tail)
{
	struct lk_config *cf = fx_load(fx, ini);

	if (cf) {
		fprintf(stderr, "  loaded, expected error \"%s\"\n", tail);
		config_free(cf);
		return false;
	}
	return err_is(fx, "lokadb.ini", tail);
}

/* ------------------------------------------------------------------------- */

static bool test_defaults(void)
{
	struct lk_config *cf = config_defaults();
	bool ok = true;

	CHECK(cf);
	CHECK(cf->max_client_conn == 1000);
	CHECK(cf->client_login_timeout == 30 * USEC);
	CHECK(cf->max_message_bytes == 268435456);
	CHECK(cf->listen_addr == NULL);
	CHECK(cf->listen_port == 6432);
	CHECK_STR(cf->unix_socket_dir, "/tmp");
	CHECK(cf->unix_socket_mode == 0777);
	CHECK(cf->auth_type == AUTH_MD5);
	CHECK(cf->pool_mode == POOL_SESSION);
	CHECK(cf->default_pool_size == 20);
	CHECK_STR(cf->server_reset_query, "DISCARD ALL");
	CHECK_STR(cf->server_check_query, "select 1");
	CHECK(cf->server_check_delay == 30 * USEC);
	CHECK(cf->server_lifetime == 3600 * USEC);
	CHECK(cf->server_idle_timeout == 600 * USEC);
	CHECK(cf->server_connect_timeout == 15 * USEC);
	CHECK(cf->server_login_retry == 15 * USEC);
	CHECK(cf->query_wait_timeout == 120 * USEC);
	CHECK(cf->reserve_pool_timeout == 5 * USEC);
	CHECK(cf->suspend_timeout == 10 * USEC);
	CHECK(cf->stats_period == 60 * USEC);
	CHECK(cf->dns_max_ttl == 15 * USEC && cf->dns_nxdomain_ttl == 15 * USEC);
	CHECK(cf->autodb_idle_timeout == 3600 * USEC);
	CHECK(cf->log_connections && cf->log_disconnections && cf->log_pooler_errors && cf->log_stats);
	CHECK(cf->pkt_buf == 4096 && cf->listen_backlog == 128 && cf->tcp_keepalive == 1);
	CHECK_STR(cf->syslog_ident, "lokadb");
	CHECK_STR(cf->syslog_facility, "daemon");
	CHECK_STR(cf->track_extra_parameters, "IntervalStyle");
	CHECK(cf->plugin_dir == NULL && cf->plugins == NULL && cf->auth_file == NULL);
	CHECK(cf->n_dbs == 0 && cf->n_users == 0 && cf->n_auth == 0 && cf->n_raw == 0);
end:
	config_free(cf);
	return ok;
}

/* One row per field, sorted, documented, and the default text is what SHOW CONFIG prints. */
static bool test_table_shape(void)
{
	static const char *const restart_only[] = {
		"listen_addr", "listen_port", "unix_socket_dir", "unix_socket_mode", "listen_backlog",
		"pkt_buf", "so_reuseport", "pidfile", "plugins", "plugin_dir", "syslog", "syslog_ident",
		"syslog_facility", "track_extra_parameters", "disable_pqexec", "peer_id", "metrics_listen", NULL
	};
	struct lk_config *cf = config_defaults();
	const struct cf_setting *s, *t;
	char buf[256];
	bool ok = true;
	int n = 0;

	CHECK(cf);
	for (s = config_settings; s->name; s++, n++) {
		bool listed = false;
		CHECK(s->doc && strlen(s->doc) > 20);
		CHECK(s->offset >= offsetof(struct lk_config, logfile));
		CHECK(s->offset < offsetof(struct lk_config, dbs));
		CHECK(s->type != CF_ENUM || s->enums);
		if (s != config_settings)
			CHECK(strcmp(s[-1].name, s->name) < 0);
		for (t = config_settings; t < s; t++)
			CHECK(t->offset != s->offset);
		config_format(cf, s, buf, sizeof(buf));
		CHECK_STR(buf, s->def ? s->def : "");
		CHECK(config_find(s->name) == s);
		for (int i = 0; restart_only[i]; i++)
			listed |= strcmp(restart_only[i], s->name) == 0;
		CHECK(s->reloadable == !listed);
	}
	CHECK(n == SETTINGS_IN_STRUCT);
	CHECK(config_find("MAX_CLIENT_CONN") == config_find("max_client_conn"));
	CHECK(config_find("max_packet_size") == config_find("max_message_bytes"));
	CHECK(config_find("no_such_thing") == NULL);
end:
	config_free(cf);
	return ok;
}

static bool test_pgbouncer_ini(void)
{
	static const char ini[] =
		";; a stock-looking pgbouncer.ini\n"
		"[databases]\n"
		"app = host=127.0.0.1 port=5433 dbname=app_prod\n"
		"\n"
		"[PgBouncer]\n"
		"logfile = /var/log/pgbouncer/pgbouncer.log\n"
		"pidfile = /var/run/pgbouncer/pgbouncer.pid\n"
		"listen_addr = *\n"
		"listen_port = 6433\n"
		"    auth_type = trust\n"
		"auth_file = users.txt ; not there, fine for trust\n"
		"admin_users = postgres, admin\n"
		"pool_mode = transaction\n"
		"Max_Client_Conn = 500\n"
		"default_pool_size = 25\n"
		"ignore_startup_parameters = extra_float_digits\n"
		"# PgBouncer settings left at their defaults\n"
		"client_tls_sslmode = disable\n"
		"server_tls_sslmode = prefer\n"
		"client_tls_key_file =\n"
		"max_prepared_statements = 0\n"
		"tcp_defer_accept = 1\n"
		"auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename=$1\n"
		"max_packet_size = 1048576\n"
		"unix_socket_mode = 0700\n"
		"stats_period = 30s\n"
		"server_lifetime = 1h\n"
		"query_wait_timeout = 500ms\n"
		"log_connections = off\n"
		"unix_socket_dir =\n";
	struct fx fx;
	struct lk_config *cf = NULL;
	bool ok = true;

	CHECK(fx_init(&fx));
	cf = fx_load(&fx, ini);
	if (!cf)
		fprintf(stderr, "  %s\n", fx.err);
	CHECK(cf);
	CHECK_STR(cf->path, fx.path);
	CHECK_STR(cf->logfile, "/var/log/pgbouncer/pgbouncer.log");
	CHECK_STR(cf->listen_addr, "*");
	CHECK(cf->listen_port == 6433);
	CHECK(cf->auth_type == AUTH_TRUST);
	CHECK_STR(cf->auth_file, "users.txt");
	CHECK(cf->n_auth == 0);
	CHECK_STR(cf->admin_users, "postgres, admin");
	CHECK(cf->pool_mode == POOL_TRANSACTION);
	CHECK(cf->max_client_conn == 500);
	CHECK(cf->default_pool_size == 25);
	CHECK(cf->max_message_bytes == 1048576);
	CHECK(cf->unix_socket_mode == 0700);
	CHECK(cf->stats_period == 30 * USEC);
	CHECK(cf->server_lifetime == 3600 * USEC);
	CHECK(cf->query_wait_timeout == USEC / 2);
	CHECK(cf->log_connections == 0);
	CHECK(cf->unix_socket_dir == NULL);
	CHECK(cf->n_dbs == 1);
	CHECK(cf->dbs[0].port == 5433 && cf->dbs[0].line == 3);
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_databases(void)
{
	char ini[2048];
	char query[400];
	struct fx fx;
	struct lk_config *cf = NULL;
	const struct db_conf *d;
	bool ok = true;

	memset(query, 'x', sizeof(query) - 1);
	query[sizeof(query) - 1] = '\0';
	memcpy(query, "select ", 7);
	snprintf(ini, sizeof(ini),
		 "[databases]\n"
		 "app = host=10.0.0.5 port=6543 dbname=app_prod pool_size=30 pool_mode=statement\n"
		 "\"odd \"\"db\"\"\" = host=/var/run/postgresql user=report password='it''s a secret' reserve_pool=2\n"
		 "* = host=fallback.example auth_user=pgb   max_db_connections=7\n"
		 "long = host=h connect_query='%s' application_name=app\n"
		 "tz = timezone=UTC datestyle='ISO, MDY' client_encoding=UTF8 min_pool_size=1 reserve_pool_size=3\n"
		 "app = host=10.0.0.6\n"
		 "[lokadb]\n"
		 "auth_type = any\n", query);
	CHECK(fx_init(&fx));
	cf = fx_load(&fx, ini);
	if (!cf)
		fprintf(stderr, "  %s\n", fx.err);
	CHECK(cf);
	CHECK(cf->n_dbs == 5);
	d = config_find_db(cf, "app");
	CHECK(d);
	CHECK_STR(d->host, "10.0.0.6");	/* a later line replaces an earlier one */
	CHECK(d->port == 5432 && d->pool_size == -1 && d->pool_mode == -1 && d->dbname == NULL);
	CHECK(d->line == 7);
	d = config_find_db(cf, "odd \"db\"");
	CHECK(d);
	CHECK_STR(d->host, "/var/run/postgresql");
	CHECK_STR(d->user, "report");
	CHECK_STR(d->password, "it's a secret");
	CHECK(d->reserve_pool_size == 2);
	CHECK(d->max_db_connections == -1 && d->min_pool_size == -1);
	d = config_find_db(cf, "*");
	CHECK(d);
	CHECK_STR(d->host, "fallback.example");
	CHECK_STR(d->auth_user, "pgb");
	CHECK(d->max_db_connections == 7);
	CHECK(config_find_db(cf, "whatever") == NULL);
	d = config_find_db(cf, "long");
	CHECK(d);
	CHECK_STR(d->connect_query, query);
	CHECK_STR(d->application_name, "app");
	d = config_find_db(cf, "tz");
	CHECK(d);
	CHECK_STR(d->timezone, "UTC");
	CHECK_STR(d->datestyle, "ISO, MDY");
	CHECK_STR(d->client_encoding, "UTF8");
	CHECK(d->min_pool_size == 1 && d->reserve_pool_size == 3);
	CHECK(cf->auth_type == AUTH_ANY);
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_database_errors(void)
{
	struct fx fx;
	bool ok = true;

	CHECK(fx_init(&fx));
	CHECK(load_fails(&fx, "[databases]\nok = host=a\nbad = host=a sslmode=require\n",
			 ":3: database \"bad\": unknown option \"sslmode\""));
	/* site= belongs to the tunnel transport; elsewhere it would be read as a host name */
	CHECK(load_fails(&fx, "[databases]\nx = site=acme dbname=app\n", ":2: database \"x\": site= needs transport=tunnel"));
	CHECK(load_fails(&fx, "[databases]\nx = transport=t_pair site=acme\n", ":2: database \"x\": site= needs transport=tunnel"));
	{
		struct lk_config *cf = fx_load(&fx, "[databases]\nx = transport=tunnel site=acme dbname=app\n");
		CHECK(cf);
		if (cf) {
			CHECK(strcmp(config_find_db(cf, "x")->host, "acme") == 0);
			CHECK(config_find_db(cf, "x")->site == NULL);
			config_free(cf);
		}
	}
	CHECK(load_fails(&fx, "[databases]\nbad = host=a load_balance_hosts=round-robin\n",
			 ":2: database \"bad\": option \"load_balance_hosts\" is not supported by this version of lokadb"));
	CHECK(load_fails(&fx, "[databases]\nbad = host='a b\n",
			 ":2: database \"bad\": unterminated quoted value for \"host\""));
	CHECK(load_fails(&fx, "[databases]\nbad = host a\n",
			 ":2: database \"bad\": expected \"=\" after \"host\""));
	CHECK(load_fails(&fx, "[databases]\nbad = port=99999\n",
			 ":2: database \"bad\": invalid port \"99999\": expected 1 .. 65535"));
	CHECK(load_fails(&fx, "[databases]\nbad = pool_size=many\n",
			 ":2: database \"bad\": invalid pool_size \"many\": expected a non-negative integer"));
	CHECK(load_fails(&fx, "[databases]\nbad = pool_mode=sometimes\n",
			 ":2: database \"bad\": invalid pool_mode \"sometimes\": "
			 "expected one of session, transaction, statement"));
	CHECK(load_fails(&fx, "[databases]\npgbouncer = host=a\n",
			 ":2: database name \"pgbouncer\" is reserved"));
end:
	fx_done(&fx);
	return ok;
}

static bool test_users(void)
{
	struct fx fx;
	struct lk_config *cf = NULL;
	const struct user_conf *u;
	bool ok = true;

	CHECK(fx_init(&fx));
	cf = fx_load(&fx, "[users]\nbatch = pool_mode=transaction pool_size=5 max_user_connections=10\n"
		     "\"web user\" = pool_mode=session\n");
	CHECK(cf);
	CHECK(cf->n_users == 2);
	u = config_find_user(cf, "batch");
	CHECK(u);
	CHECK(u->pool_mode == POOL_TRANSACTION && u->pool_size == 5 && u->max_user_connections == 10);
	CHECK(u->line == 2);
	u = config_find_user(cf, "web user");
	CHECK(u);
	CHECK(u->pool_mode == POOL_SESSION && u->pool_size == -1 && u->max_user_connections == -1);
	CHECK(u->reserve_pool_size == -1 && u->query_wait_timeout == -1);
	CHECK(config_find_user(cf, "Batch") == NULL);
	config_free(cf);
	cf = fx_load(&fx, "[users]\nx = reserve_pool_size=5 query_wait_timeout=0\n"
		     "[databases]\nd = server_lifetime=30 query_wait_timeout=2s auth_dbname=x auth_query='SELECT $1, ''s'''\n"
		     "e = host=/tmp\n");
	CHECK(cf);
	u = config_find_user(cf, "x");
	CHECK(u && u->reserve_pool_size == 5 && u->query_wait_timeout == 0);
	CHECK(config_find_db(cf, "d")->server_lifetime == 30 * USEC);
	CHECK(config_find_db(cf, "d")->query_wait_timeout == 2 * USEC);
	CHECK(strcmp(config_find_db(cf, "d")->auth_query, "SELECT $1, 's'") == 0);
	CHECK(strcmp(config_find_db(cf, "d")->auth_dbname, "x") == 0);
	CHECK(config_find_db(cf, "e")->auth_query == NULL);
	CHECK(config_find_db(cf, "e")->server_lifetime == 0 && config_find_db(cf, "e")->query_wait_timeout == -1);
	config_free(cf);
	cf = NULL;
	CHECK(load_fails(&fx, "[databases]\nd = load_balance_hosts=disable\n",
			 ":2: database \"d\": option \"load_balance_hosts\" is not supported by this version of lokadb"));
	CHECK(load_fails(&fx, "[users]\nx = server_lifetime=5\n", ":2: user \"x\": unknown option \"server_lifetime\""));
	CHECK(load_fails(&fx, "[users]\nx = colour=blue\n", ":2: user \"x\": unknown option \"colour\""));
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_ini_errors(void)
{
	struct fx fx;
	bool ok = true;

	CHECK(fx_init(&fx));
	CHECK(load_fails(&fx, "[lokadb]\nlisten_port = 6432\n\n; comment\nfoo = 1\n", ":5: unknown setting \"foo\""));
	CHECK(load_fails(&fx, "[lokadb]\nmax_client_conn = abc\n",
			 ":2: invalid value \"abc\" for max_client_conn: expected an integer"));
	CHECK(load_fails(&fx, "[lokadb]\npool_mode = sometimes\n",
			 ":2: invalid value \"sometimes\" for pool_mode: expected one of session, transaction, statement"));
	CHECK(load_fails(&fx, "[lokadb]\nauth_type = ldap\n",
			 ":2: invalid value \"ldap\" for auth_type: expected one of any, trust, plain, md5, scram-sha-256, cert, hba"));
	CHECK(load_fails(&fx, "[lokadb]\nlisten_port = 70000\n",
			 ":2: value \"70000\" for listen_port is out of range (1 .. 65535)"));
	CHECK(load_fails(&fx, "[lokadb]\nmax_message_bytes = 4GB\n",
			 ":2: value \"4GB\" for max_message_bytes is out of range (1024 .. 2147483647)"));
	CHECK(load_fails(&fx, "[lokadb]\nverbose = 99999999999\n",
			 ":2: value \"99999999999\" for verbose is out of range (0 .. 2147483647)"));
	CHECK(load_fails(&fx, "[lokadb]\nlog_stats = maybe\n",
			 ":2: invalid value \"maybe\" for log_stats: expected a boolean (0/1, on/off, true/false, yes/no)"));
	CHECK(load_fails(&fx, "[lokadb]\nserver_lifetime = 5 parsecs\n",
			 ":2: invalid value \"5 parsecs\" for server_lifetime: "
			 "expected a time such as 15, 1.5, 500ms, 30s, 2min or 1h"));
	CHECK(load_fails(&fx, "[lokadb]\nlisten_port = 1\n[nosuch]\nx = 1\n", ":4: unknown section [nosuch]"));
	CHECK(load_fails(&fx, "listen_port = 1\n", ":1: \"listen_port\" is outside of any section"));
	CHECK(load_fails(&fx, "[lokadb]\nlisten_port = 1\njust some words\nfoo = 1\n",
			 ":3: syntax error: expected \"[section]\" or \"name = value\""));
	CHECK(load_fails(&fx, "[lokadb\nlisten_port = 1\n",
			 ":1: syntax error: expected \"[section]\" or \"name = value\""));
	CHECK(load_fails(&fx, "[lokadb]\n%include other.ini\n", ":2: %include is not supported"));
	CHECK(load_fails(&fx, "[plugin.]\nx = 1\n", ":2: unknown section [plugin.]"));
	CHECK(config_load("/nonexistent/lokadb.ini", fx.err, sizeof(fx.err)) == NULL);
	CHECK_STR(fx.err, "/nonexistent/lokadb.ini: could not open: No such file or directory");
end:
	fx_done(&fx);
	return ok;
}

static bool time_is(const char *text, usec_t want)
{
	usec_t got = -1;
	char err[256];

	if (!config_parse_value(config_find("query_timeout"), text, &got, err, sizeof(err))) {
		fprintf(stderr, "  \"%s\": %s\n", text, err);
		return false;
	}
	if (got != want)
		fprintf(stderr, "  \"%s\" gave %lld us, expected %lld\n", text, (long long)got, (long long)want);
	return got == want;
}

static bool size_is(const char *text, int64_t want)
{
	int64_t got = -1;
	char err[256];

	if (!config_parse_value(config_find("max_message_bytes"), text, &got, err, sizeof(err))) {
		fprintf(stderr, "  \"%s\": %s\n", text, err);
		return false;
	}
	return got == want;
}

static bool test_units(void)
{
	const struct cf_setting *t = config_find("query_timeout");
	const struct cf_setting *z = config_find("max_message_bytes");
	const struct cf_setting *b = config_find("log_stats");
	int64_t v;
	int bv;
	char err[256];
	bool ok = true;

	CHECK(time_is("15", 15 * USEC));
	CHECK(time_is("1.5", 1500000));
	CHECK(time_is("500ms", 500000));
	CHECK(time_is("30s", 30 * USEC));
	CHECK(time_is("2min", 120 * USEC));
	CHECK(time_is("1h", 3600 * USEC));
	CHECK(time_is("250us", 250));
	CHECK(time_is("0.00025", 250));
	CHECK(time_is("1.5h", 5400 * USEC));
	CHECK(time_is("10 s", 10 * USEC));
	CHECK(time_is("2MIN", 120 * USEC));
	CHECK(time_is("0", 0));
	CHECK(!config_parse_value(t, "abc", &v, err, sizeof(err)));
	CHECK(!config_parse_value(t, "-1", &v, err, sizeof(err)));
	CHECK(!config_parse_value(t, "1.2.3", &v, err, sizeof(err)));
	CHECK(!config_parse_value(t, "", &v, err, sizeof(err)));
	CHECK(!config_parse_value(t, "5 fortnights", &v, err, sizeof(err)));
	CHECK(!config_parse_value(t, "99999999999999999999h", &v, err, sizeof(err)));
	CHECK(strstr(err, "out of range") != NULL);
	CHECK(size_is("268435456", 268435456));
	CHECK(size_is("256MB", 256LL << 20));
	CHECK(size_is("64kB", 64 << 10));
	CHECK(size_is("1GB", 1LL << 30));
	CHECK(size_is("1gb", 1LL << 30));
	CHECK(size_is("512 KB", 512 << 10));
	CHECK(!config_parse_value(z, "1.5GB", &v, err, sizeof(err)));
	CHECK_STR(err, "invalid value \"1.5GB\" for max_message_bytes: expected a size such as 4096, 64kB, 256MB or 1GB");
	CHECK(!config_parse_value(z, "MB", &v, err, sizeof(err)));
	CHECK(!config_parse_value(z, "100", &v, err, sizeof(err)));
	for (int i = 0; i < 8; i++) {
		static const char *const words[] = { "1", "on", "TRUE", "yes", "0", "off", "false", "No" };
		CHECK(config_parse_value(b, words[i], &bv, err, sizeof(err)));
		CHECK(bv == (i < 4));
	}
end:
	return ok;
}

static bool test_unsupported(void)
{
	struct fx fx;
	struct lk_config *cf = NULL;
	bool ok = true;

	CHECK(fx_init(&fx));
	CHECK(load_fails(&fx, "[pgbouncer]\nauth_ident_file = /etc/ident\n",
			 ":2: setting \"auth_ident_file\" is not supported by this version of lokadb"));
	CHECK(load_fails(&fx, "[pgbouncer]\ntrack_extra_parameters = IntervalStyle, search_path\n",
			 ":2: track_extra_parameters: \"search_path\" is not supported by this version of lokadb "
			 "(it tracks client_encoding, DateStyle, TimeZone, standard_conforming_strings, "
			 "application_name and IntervalStyle)"));
	cf = fx_load(&fx, "[pgbouncer]\ntrack_extra_parameters = intervalstyle,TimeZone\n");
	CHECK(cf != NULL);
	config_free(cf);
	CHECK(load_fails(&fx, "[pgbouncer]\npeer_id = 16384\n",
			 ":2: value \"16384\" for peer_id is out of range (0 .. 16383)"));
	cf = fx_load(&fx, "[pgbouncer]\n"
		     "client_tls_sslmode = disable\nserver_tls_sslmode = prefer\nauth_user =\n"
		     "auth_hba_file =\nmax_prepared_statements = 100\npeer_id = 0\n"
		     "client_tls_protocols = secure\nscram_iterations = 4096\nuser =\n"
		     "cancel_wait_timeout = 10\nsbuf_loopcnt = 5\n"
		     "auth_query = SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword "
		     "END FROM pg_authid WHERE rolname=$1 AND rolcanlogin\n");
	if (!cf)
		fprintf(stderr, "  %s\n", fx.err);
	CHECK(cf);
	CHECK(cf->max_prepared_statements == 100);	/* implemented now: a real setting */
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_auth_file(void)
{
	struct fx fx;
	struct lk_config *cf = NULL;
	const struct auth_entry *a;
	bool ok = true;

	CHECK(fx_init(&fx));
	CHECK(fx_write(&fx, "users.txt",
		       "; comment\n"
		       "# another\n"
		       "\n"
		       "\"alice\" \"md5ee52c6f2a2d4e1f3c3b6b3a1e7bc1c3b\"\n"
		       "  \"bob \"\"the builder\"\"\" \"pa\"\"ss\" \"\" trailing fields are ignored\r\n"
		       "\"carol\" \"SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2Vydg==\"\n"
		       "\"alice\" \"second wins\"\n"));
	cf = fx_load(&fx, "[lokadb]\nauth_file = users.txt\n");
	if (!cf)
		fprintf(stderr, "  %s\n", fx.err);
	CHECK(cf);
	CHECK(cf->n_auth == 3);
	a = config_find_auth(cf, "alice");
	CHECK(a);
	CHECK_STR(a->secret, "second wins");
	a = config_find_auth(cf, "bob \"the builder\"");
	CHECK(a);
	CHECK_STR(a->secret, "pa\"ss");
	a = config_find_auth(cf, "carol");
	CHECK(a);
	CHECK_STR(a->secret, "SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2Vydg==");
	CHECK(config_find_auth(cf, "dave") == NULL);
	config_free(cf);
	cf = NULL;

	CHECK(fx_write(&fx, "bad.txt", "\"alice\" \"x\"\n\n\"bob\" secret\n"));
	cf = fx_load(&fx, "[lokadb]\nauth_file = bad.txt\n");
	CHECK(cf == NULL);
	CHECK(err_is(&fx, "bad.txt", ":3: expected a double-quoted secret after user \"bob\""));
	CHECK(fx_write(&fx, "bad2.txt", "alice \"x\"\n"));
	cf = fx_load(&fx, "[lokadb]\nauth_file = bad2.txt\nauth_type = trust\n");
	CHECK(cf == NULL);
	CHECK(err_is(&fx, "bad2.txt", ":1: expected \"user\" \"secret\" with both in double quotes"));
	CHECK(fx_write(&fx, "bad3.txt", "\"alice\" \"unterminated\n"));
	cf = fx_load(&fx, "[lokadb]\nauth_file = bad3.txt\n");
	CHECK(cf == NULL);
	CHECK(err_is(&fx, "bad3.txt", ":1: expected a double-quoted secret after user \"alice\""));
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_auth_file_missing(void)
{
	char want[PATH_MAX + 128];
	struct fx fx;
	struct lk_config *cf = NULL;
	bool ok = true;

	CHECK(fx_init(&fx));
	cf = fx_load(&fx, "[lokadb]\nauth_type = md5\nauth_file = nope.txt\n");
	CHECK(cf == NULL);
	snprintf(want, sizeof(want), "%s: could not open auth_file \"%s/nope.txt\": No such file or directory",
		 fx.path, fx.dir);
	CHECK_STR(fx.err, want);
	cf = fx_load(&fx, "[lokadb]\nauth_type = scram-sha-256\nauth_file = /nonexistent/users.txt\n");
	CHECK(cf == NULL);
	snprintf(want, sizeof(want), "%s: could not open auth_file \"/nonexistent/users.txt\": No such file or directory",
		 fx.path);
	CHECK_STR(fx.err, want);
	cf = fx_load(&fx, "[lokadb]\nauth_type = trust\nauth_file = nope.txt\n");
	CHECK(cf);
	CHECK(cf->n_auth == 0);
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_set(void)
{
	struct lk_config *cf = config_defaults();
	char err[256];
	bool ok = true;

	CHECK(cf);
	CHECK(!config_set(cf, "listen_port", "7000", err, sizeof(err)));
	CHECK_STR(err, "setting \"listen_port\" cannot be changed at run time; restart lokadb");
	CHECK(cf->listen_port == 6432);
	CHECK(!config_set(cf, "PKT_BUF", "8192", err, sizeof(err)));
	CHECK_STR(err, "setting \"pkt_buf\" cannot be changed at run time; restart lokadb");
	CHECK(!config_set(cf, "nonsense", "1", err, sizeof(err)));
	CHECK_STR(err, "unknown setting \"nonsense\"");
	CHECK(!config_set(cf, "auth_ident_file", "/etc/ident", err, sizeof(err)));
	CHECK_STR(err, "setting \"auth_ident_file\" is not supported by this version of lokadb");
	CHECK(!config_set(cf, "max_client_conn", "lots", err, sizeof(err)));
	CHECK_STR(err, "invalid value \"lots\" for max_client_conn: expected an integer");
	CHECK(cf->max_client_conn == 1000);
	CHECK(!config_set(cf, "max_client_conn", "0", err, sizeof(err)));
	CHECK(cf->max_client_conn == 1000);
	CHECK(config_set(cf, "max_client_conn", "200", err, sizeof(err)));
	CHECK(cf->max_client_conn == 200);
	CHECK(config_set(cf, "Pool_Mode", "Transaction", err, sizeof(err)));
	CHECK(cf->pool_mode == POOL_TRANSACTION);
	CHECK(config_set(cf, "server_reset_query", "RESET ALL", err, sizeof(err)));
	CHECK_STR(cf->server_reset_query, "RESET ALL");
	CHECK(config_set(cf, "server_reset_query", "", err, sizeof(err)));
	CHECK(cf->server_reset_query == NULL);
	CHECK(config_set(cf, "max_packet_size", "1MB", err, sizeof(err)));
	CHECK(cf->max_message_bytes == 1 << 20);
	CHECK(config_set(cf, "query_timeout", "250ms", err, sizeof(err)));
	CHECK(cf->query_timeout == 250000);
end:
	config_free(cf);
	return ok;
}

/* Every row: the formatted value parses back to the same value, and SET takes it. */
static bool test_format_round_trip(void)
{
	struct lk_config *cf = config_defaults();
	const struct cf_setting *s;
	char buf[256], again[256], err[256];
	bool ok = true;

	CHECK(cf);
	cf->query_timeout = 1500;		/* 0.0015 s */
	cf->client_idle_timeout = USEC / 2;
	cf->max_message_bytes = 65536;
	cf->unix_socket_mode = 0600;
	cf->pool_mode = POOL_STATEMENT;
	cf->auth_type = AUTH_SCRAM;
	free(cf->server_check_query);
	cf->server_check_query = NULL;
	config_format(cf, config_find("query_timeout"), buf, sizeof(buf));
	CHECK_STR(buf, "0.0015");
	config_format(cf, config_find("client_idle_timeout"), buf, sizeof(buf));
	CHECK_STR(buf, "0.5");
	config_format(cf, config_find("unix_socket_mode"), buf, sizeof(buf));
	CHECK_STR(buf, "0600");
	config_format(cf, config_find("auth_type"), buf, sizeof(buf));
	CHECK_STR(buf, "scram-sha-256");
	for (s = config_settings; s->name; s++) {
		union { int i; int64_t n; char *s; } v = { 0 };
		char *field = (char *)cf + s->offset;
		config_format(cf, s, buf, sizeof(buf));
		CHECK(config_parse_value(s, buf, &v, err, sizeof(err)));
		if (s->type == CF_STR) {
			char *cur = *(char **)field;
			bool same = v.s && cur ? strcmp(v.s, cur) == 0 : v.s == cur;
			free(v.s);
			CHECK(same);
		} else if (s->type == CF_TIME || s->type == CF_SIZE) {
			CHECK(v.n == *(int64_t *)field);
		} else {
			CHECK(v.i == *(int *)field);
		}
		if (!s->reloadable) {
			CHECK(!config_set(cf, s->name, buf, err, sizeof(err)));
			continue;
		}
		if (!config_set(cf, s->name, buf, err, sizeof(err)))
			fprintf(stderr, "  %s = \"%s\": %s\n", s->name, buf, err);
		CHECK(config_set(cf, s->name, buf, err, sizeof(err)));
		config_format(cf, s, again, sizeof(again));
		CHECK_STR(again, buf);
	}
end:
	config_free(cf);
	return ok;
}

static bool test_raw_sections(void)
{
	struct fx fx;
	struct lk_config *cf = NULL;
	bool ok = true;

	CHECK(fx_init(&fx));
	cf = fx_load(&fx, "[lokadb]\nplugins = audit\npeer_id = 2\n"
		     "[plugin.audit]\nTarget = /var/log/audit.log\nlevel = 2\n"
		     "[peers]\n1 = host=/tmp port=6433\n3 = host=10.0.0.7 pool_size=4\n1 = host=/run/l1\n");
	if (!cf)
		fprintf(stderr, "  %s\n", fx.err);
	CHECK(cf);
	CHECK(cf->peer_id == 2);
	CHECK(cf->n_raw == 2);
	CHECK_STR(cf->raw[0].section, "plugin.audit");
	CHECK_STR(cf->raw[0].key, "Target");
	CHECK_STR(cf->raw[0].value, "/var/log/audit.log");
	CHECK(cf->raw[0].line == 5);
	CHECK_STR(cf->raw[1].key, "level");
	CHECK(cf->raw[1].line == 6);
	CHECK(cf->n_peers == 2);
	CHECK(config_find_peer(cf, 1) && config_find_peer(cf, 1)->line == 10);
	CHECK_STR(config_find_peer(cf, 1)->host, "/run/l1");
	CHECK(config_find_peer(cf, 1)->port == 6432 && config_find_peer(cf, 1)->pool_size == -1);
	CHECK(config_find_peer(cf, 3) && config_find_peer(cf, 3)->port == 6432);
	CHECK(config_find_peer(cf, 3)->pool_size == 4);
	CHECK(config_find_peer(cf, 2) == NULL);
	config_free(cf);
	cf = NULL;
	CHECK(load_fails(&fx, "[peers]\n0 = host=/tmp\n", ":2: invalid peer id \"0\": expected 1 .. 16383"));
	CHECK(load_fails(&fx, "[peers]\nx = host=/tmp\n", ":2: invalid peer id \"x\": expected 1 .. 16383"));
	CHECK(load_fails(&fx, "[peers]\n16384 = host=/tmp\n", ":2: invalid peer id \"16384\": expected 1 .. 16383"));
	CHECK(load_fails(&fx, "\n[peers]\n1 = dbname=x\n", ":3: peer 1: unknown option \"dbname\""));
	CHECK(load_fails(&fx, "[peers]\n1 = port=0\n", ":2: peer 1: invalid port \"0\": expected 1 .. 65535"));
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static bool test_list_has(void)
{
	bool ok = true;

	CHECK(config_list_has("postgres, admin", "admin"));
	CHECK(config_list_has("postgres,admin", "postgres"));
	CHECK(config_list_has("  a  b\tc ", "c"));
	CHECK(!config_list_has("postgres, admin", "Admin"));
	CHECK(!config_list_has("postgres, admin", "adm"));
	CHECK(!config_list_has("postgres, administrators", "admin"));
	CHECK(config_list_has("x, *", "anyone"));
	CHECK(!config_list_has("", "a"));
	CHECK(!config_list_has(NULL, "a"));
	CHECK(!config_list_has("a", ""));
end:
	return ok;
}

static bool test_markdown(void)
{
	static const char *const must[] = {
		"`host`", "`port`", "`dbname`", "`connect_query`", "`max_user_connections`",
		"`client_tls_sslmode`", "`max_prepared_statements`", "`max_packet_size`", "## auth_file",
		"## [databases]", "## [users]", "[plugin.NAME]", NULL
	};
	char *md = NULL, name[128];
	size_t len = 0;
	FILE *f = open_memstream(&md, &len);
	bool ok = true;

	CHECK(f);
	config_write_markdown(f);
	CHECK(fclose(f) == 0);
	CHECK(strncmp(md, "# LokaDB configuration\n", 23) == 0);
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		snprintf(name, sizeof(name), "| `%s` |", s->name);
		CHECK(strstr(md, name) != NULL);
		CHECK(strstr(md, s->doc) != NULL);
	}
	for (int i = 0; must[i]; i++)
		CHECK(strstr(md, must[i]) != NULL);
end:
	free(md);
	return ok;
}

/* auth_hba_file: read with the ini (relative to it), a bad line refuses the load with FILE:LINE. */
static bool test_hba_file(void)
{
	struct fx fx;
	struct lk_config *cf = NULL;
	bool ok = true;

	CHECK(fx_init(&fx));
	CHECK(load_fails(&fx, "[pgbouncer]\nauth_type = hba\n", ": auth_type hba needs auth_hba_file"));
	CHECK(load_fails(&fx, "[users]\nu = query_timeout=soon\n",
			 ":2: user \"u\": invalid query_timeout \"soon\": expected a time such as 15, 1.5, 500ms or 2min"));
	CHECK(fx_write(&fx, "hba.conf", "# rules\nlocal all all trust\nhost all all 10.0.0.0/40 md5\n"));
	cf = fx_load(&fx, "[pgbouncer]\nauth_type = hba\nauth_hba_file = hba.conf\n");
	CHECK(!cf);
	CHECK(err_is(&fx, "hba.conf", ":3: invalid CIDR mask \"/40\": expected 0 .. 32"));
	CHECK(fx_write(&fx, "hba.conf", "local all all trust\nhost all all ::1/128 md5\n"));
	cf = fx_load(&fx, "[pgbouncer]\nauth_type = hba\nauth_hba_file = hba.conf\n"
		     "max_db_client_connections = 7\nmax_user_client_connections = 8\n"
		     "[databases]\nd = host=x max_db_client_connections=3\n"
		     "[users]\nu = max_user_client_connections=4 query_timeout=1.5 transaction_timeout=2min "
		     "idle_transaction_timeout=500ms client_idle_timeout=30\n");
	CHECK(cf);
	CHECK(cf->auth_type == AUTH_HBA);
	CHECK(cf->hba && cf->hba->n == 2);
	CHECK(cf->max_db_client_connections == 7 && cf->max_user_client_connections == 8);
	CHECK(cf->dbs[0].max_db_client_connections == 3);
	CHECK(cf->users[0].max_user_client_connections == 4);
	CHECK(cf->users[0].query_timeout == 1500000 && cf->users[0].transaction_timeout == 120 * USEC);
	CHECK(cf->users[0].idle_transaction_timeout == 500000 && cf->users[0].client_idle_timeout == 30 * USEC);
	CHECK(!config_set(cf, "auth_hba_file", "other.conf", fx.err, sizeof(fx.err)));
	CHECK(strstr(fx.err, "change it there and RELOAD") != NULL);
	CHECK(config_set(cf, "auth_type", "md5", fx.err, sizeof(fx.err)));
	CHECK(config_set(cf, "auth_type", "hba", fx.err, sizeof(fx.err)));	/* the rules are loaded */
	config_free(cf);
	cf = fx_load(&fx, "[pgbouncer]\nauth_type = md5\n");
	CHECK(cf);
	CHECK(!config_set(cf, "auth_type", "HBA", fx.err, sizeof(fx.err)));
	CHECK_STR(fx.err, "auth_type hba needs auth_hba_file: set it in the ini file and RELOAD");
	CHECK(cf->auth_type == AUTH_MD5);
end:
	config_free(cf);
	fx_done(&fx);
	return ok;
}

static const struct unit_case cases[] = {
	{ "defaults", test_defaults },
	{ "auth_hba_file and client connection limits", test_hba_file },
	{ "table shape", test_table_shape },
	{ "pgbouncer-style ini", test_pgbouncer_ini },
	{ "databases", test_databases },
	{ "database errors", test_database_errors },
	{ "users", test_users },
	{ "ini errors with line numbers", test_ini_errors },
	{ "time and size units", test_units },
	{ "unsupported pgbouncer settings", test_unsupported },
	{ "auth_file", test_auth_file },
	{ "missing auth_file", test_auth_file_missing },
	{ "set", test_set },
	{ "format round trip", test_format_round_trip },
	{ "plugin and peers sections", test_raw_sections },
	{ "list_has", test_list_has },
	{ "markdown", test_markdown },
	{ NULL, NULL }
};

UNIT_MAIN("config", cases)
