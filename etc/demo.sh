#!/bin/sh
# SPDX-License-Identifier: ISC
#
# demo.sh -- `make demo`: a throw-away PostgreSQL 15 cluster with lokadb in
# front of it, a few queries through the pooler, then everything is stopped.
#
# What it does, in order:
#   1. makes a temporary directory and runs initdb there (as user postgres
#      when run as root), with SCRAM passwords on TCP;
#   2. starts PostgreSQL on a free 127.0.0.1 port;
#   3. writes lokadb.ini and userlist.txt, starts ./lokadb on another free port;
#   4. runs psql through lokadb: CREATE TABLE, INSERT, SELECT, a transaction;
#   5. runs pgbench (8 clients sharing 2 server connections, transaction
#      pooling) and looks at SHOW POOLS / SHOW STATS on the console meanwhile;
#   6. with the plugins meta_cache, org_routing and move: installs the LokaDB
#      catalog, enables a tenant table, isolates one organization and shows
#      statements routed to its partition and a refused COPY;
#   7. a site: a second PostgreSQL cluster stands for an organization's own
#      database; an agent lokadb next to it dials the relay of the cloud
#      lokadb (TLS 1.3, token, pinned key); CREATE SITE and MOVE ORG 2 TO SITE
#      OFFLINE move organization 2's rows there, and the same statements of
#      the application now read and write them through postgres_fdw;
#   8. on exit (also on error or ^C) stops the lokadb processes and both
#      PostgreSQL clusters by their PIDs and removes the directory (set
#      LOKADB_DEMO_KEEP=1 to keep it).
#
# Run from anywhere; it uses the lokadb binary at the top of the repository
# (LOKADB_BIN overrides it) and PostgreSQL from /usr/lib/postgresql/15/bin
# (PG_BIN overrides it). Every step is bounded in time; the whole demo takes
# about 20 seconds.

set -eu

TOP=$(cd "$(dirname "$0")/.." && pwd)
LOKADB=${LOKADB_BIN:-$TOP/lokadb}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PSQL=$PG_BIN/psql
PGBENCH=$PG_BIN/pgbench
[ -x "$PSQL" ] || PSQL=$(command -v psql)
[ -x "$PGBENCH" ] || PGBENCH=$(command -v pgbench)

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ -x "$LOKADB" ] || die "no lokadb binary at $LOKADB (run make first)"
[ -x "$PG_BIN/initdb" ] || die "no PostgreSQL 15 in $PG_BIN (run make deps as root)"

# ---- a place of our own, cleaned up on every exit ----

TMP=$(mktemp -d /tmp/lokadb-demo.XXXXXX)
PGDATA=$TMP/pgdata
SITEDATA=$TMP/sitedata
LOKADB_PID=
AGENT_PID=
PG_STARTED=
SITE_STARTED=

as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

cleanup() {
	rc=$?
	trap - EXIT INT TERM
	if [ -n "$AGENT_PID" ] && kill -0 "$AGENT_PID" 2>/dev/null; then
		echo "demo: stopping the site's agent (pid $AGENT_PID)"
		kill -INT "$AGENT_PID" 2>/dev/null || true
		i=0
		while kill -0 "$AGENT_PID" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1; i=$((i + 1))
		done
		kill -QUIT "$AGENT_PID" 2>/dev/null || true
	fi
	if [ -n "$LOKADB_PID" ] && kill -0 "$LOKADB_PID" 2>/dev/null; then
		echo "demo: stopping lokadb (pid $LOKADB_PID, SIGINT: wait for servers, then exit)"
		kill -INT "$LOKADB_PID" 2>/dev/null || true
		i=0
		while kill -0 "$LOKADB_PID" 2>/dev/null && [ $i -lt 50 ]; do
			sleep 0.1; i=$((i + 1))
		done
		kill -QUIT "$LOKADB_PID" 2>/dev/null || true
	fi
	if [ -n "$SITE_STARTED" ]; then
		echo "demo: stopping the site's PostgreSQL"
		as_pg "$PG_BIN/pg_ctl" -D "$SITEDATA" -m fast -w -t 20 stop >/dev/null 2>&1 || true
	fi
	if [ -n "$PG_STARTED" ]; then
		echo "demo: stopping PostgreSQL"
		as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w -t 20 stop >/dev/null 2>&1 || true
	fi
	if [ $rc -ne 0 ] && [ -f "$TMP/lokadb.log" ]; then
		echo "demo: failed; the end of lokadb's log:" >&2
		tail -20 "$TMP/lokadb.log" >&2
	fi
	if [ -n "${LOKADB_DEMO_KEEP:-}" ]; then
		echo "demo: kept $TMP"
	else
		rm -rf "$TMP"
	fi
	if [ $rc -eq 0 ]; then
		echo "demo: done, everything stopped"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A TCP port on 127.0.0.1 that nobody listens on right now.
free_port() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
		return
	fi
	p=$(( 20000 + $$ % 20000 + ${1:-0} ))
	while command -v ss >/dev/null 2>&1 && ss -Htln "sport = :$p" | grep -q .; do
		p=$((p + 1))
	done
	echo $p
}

PG_PORT=$(free_port 0)
LK_PORT=$(free_port 1)
while [ "$LK_PORT" = "$PG_PORT" ]; do LK_PORT=$(free_port 2); done
SITE_PG_PORT=$(free_port 3)
RELAY_PORT=$(free_port 4)
AGENT_PORT=$(free_port 5)

# ---- 1. the PostgreSQL cluster ----

say "initdb a PostgreSQL 15 cluster in $PGDATA"
# make_cluster DATADIR PORT LOG: initdb (user postgres, password demo_pw,
# SCRAM on TCP) and the settings of a demo cluster on 127.0.0.1:PORT.
make_cluster() {
	printf 'demo_pw\n' > "$TMP/pgpass.txt"
	if [ "$(id -u)" = 0 ]; then
		chown -R postgres: "$TMP"
	fi
	as_pg "$PG_BIN/initdb" -D "$1" -U postgres --pwfile="$TMP/pgpass.txt" \
		--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-locale >"$3" 2>&1 \
		|| { cat "$3" >&2; die "initdb of $1 failed"; }
	rm -f "$TMP/pgpass.txt"
	cat >>"$1/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $2
unix_socket_directories = '$TMP'
max_connections = 30
fsync = off
EOF
}
make_cluster "$PGDATA" "$PG_PORT" "$TMP/initdb.log"

say "start PostgreSQL on 127.0.0.1:$PG_PORT"
as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$TMP/postgres.log" -w -t 30 start >/dev/null
PG_STARTED=1

# A role and a database for the application; SCRAM password on TCP.
as_pg "$PSQL" -X -q -h "$TMP" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 <<'EOF'
CREATE ROLE app LOGIN PASSWORD 'app_pw';
CREATE DATABASE appdb OWNER app;
EOF
echo "created role app (password app_pw, stored as SCRAM) and database appdb"

# ---- 2. lokadb ----

say "write $TMP/lokadb.ini and $TMP/userlist.txt"
# The userlist holds app's plain password: lokadb checks clients against it
# (SCRAM) and also logs in to PostgreSQL with it. A SCRAM secret here would
# check clients, but could not log in to the server.
cat >"$TMP/userlist.txt" <<'EOF'
"app"   "app_pw"
"admin" "admin_pw"
"postgres" "demo_pw"
EOF
# The relay's TLS key and certificate, its public key's pin for the agent,
# and the site's token (the relay keeps only its SHA-256).
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/relay.key" -out "$TMP/relay.pem" \
	-days 2 -subj /CN=relay -addext "subjectAltName = IP:127.0.0.1" >/dev/null 2>&1 \
	|| die "openssl could not make the relay's certificate"
RELAY_PIN=$(openssl pkey -in "$TMP/relay.key" -pubout -outform DER 2>/dev/null | openssl dgst -sha256 -r | cut -d' ' -f1)
SITE_TOKEN=$(openssl rand -hex 32)
TOKEN_HASH=$(printf '%s' "$SITE_TOKEN" | openssl dgst -sha256 -r | cut -d' ' -f1)
cat >"$TMP/lokadb.ini" <<EOF
[databases]
; clients ask for "app"; lokadb connects to database appdb on the cluster
app = host=127.0.0.1 port=$PG_PORT dbname=appdb
; the site "acme" through the tunnel: its agent serves database appdb there
site_acme = transport=tunnel site=acme dbname=appdb pool_mode=session

[lokadb]
listen_addr = 127.0.0.1
listen_port = $LK_PORT
unix_socket_dir = $TMP
logfile = $TMP/lokadb.log
pidfile = $TMP/lokadb.pid

auth_type = scram-sha-256
auth_file = userlist.txt
admin_users = admin

pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
stats_period = 1

; LokaDB's plugins (found in ./plugins of the build tree): the relay that
; agents dial, the catalog cache, per-statement organization routing, and the
; catalog and site commands of the console
plugins = relay meta_cache org_routing move

[plugin.relay]
listen = 127.0.0.1:$RELAY_PORT
cert_file = $TMP/relay.pem
key_file = $TMP/relay.key
sites = acme:$TOKEN_HASH

[plugin.meta_cache]
cloud = host=127.0.0.1 port=$PG_PORT dbname=appdb user=postgres password=demo_pw

[plugin.move]
cloud = host=127.0.0.1 port=$PG_PORT dbname=appdb user=postgres password=demo_pw

[plugin.org_routing]
databases = app
route_log = on
EOF
sed 's/^/    /' "$TMP/lokadb.ini"

say "start lokadb on 127.0.0.1:$LK_PORT"
"$LOKADB" -q "$TMP/lokadb.ini" &
LOKADB_PID=$!
i=0
until PGPASSWORD=admin_pw "$PSQL" -X -q -h 127.0.0.1 -p "$LK_PORT" -U admin -d lokadb \
	-c 'SHOW VERSION' >/dev/null 2>&1 </dev/null; do
	kill -0 "$LOKADB_PID" 2>/dev/null || die "lokadb exited at start-up"
	i=$((i + 1))
	[ $i -lt 50 ] || die "lokadb did not answer within 5 seconds"
	sleep 0.1
done
echo "lokadb is up (pid $LOKADB_PID)"

# ---- 3. queries through the pooler ----

export PGCONNECT_TIMEOUT=10
app_psql() {
	PGPASSWORD=app_pw timeout 30 "$PSQL" -X -h 127.0.0.1 -p "$LK_PORT" -U app -d app -v ON_ERROR_STOP=1 "$@"
}
console() {
	echo "lokadb=# $1"
	PGPASSWORD=admin_pw timeout 10 "$PSQL" -X -h 127.0.0.1 -p "$LK_PORT" -U admin -d lokadb -c "$1"
}

say "psql through lokadb: create a table, insert, select"
app_psql -e <<'EOF'
CREATE TABLE demo_items (id serial PRIMARY KEY, name text NOT NULL, qty int NOT NULL);
INSERT INTO demo_items (name, qty) VALUES ('apple', 3), ('pear', 5), ('plum', 7);
SELECT id, name, qty FROM demo_items ORDER BY id;
EOF

say "a transaction: the server connection stays with this client until COMMIT"
app_psql -e <<'EOF'
BEGIN;
UPDATE demo_items SET qty = qty - 1 WHERE name = 'apple';
INSERT INTO demo_items (name, qty) VALUES ('fig', 1);
SELECT name, qty FROM demo_items ORDER BY id;
COMMIT;
SELECT count(*) AS items, sum(qty) AS total_qty FROM demo_items;
EOF

say "the console: SHOW POOLS and SHOW STATS (psql -U admin lokadb)"
console "SHOW POOLS"
console "SHOW STATS"

# ---- 4. pgbench in transaction mode ----

say "pgbench -i through lokadb (COPY and DDL pass through the pooler)"
PGPASSWORD=app_pw timeout 60 "$PGBENCH" -h 127.0.0.1 -p "$LK_PORT" -U app -i -s 1 -q app 2>&1 | tail -2

say "pgbench: 8 clients over 2 server connections for 5 seconds (pool_mode = transaction)"
PGPASSWORD=app_pw timeout 60 "$PGBENCH" -h 127.0.0.1 -p "$LK_PORT" -U app -c 8 -j 2 -T 5 -n app \
	>"$TMP/pgbench.out" 2>&1 &
BENCH_PID=$!
sleep 2.5
echo "while pgbench runs, 8 clients share the pool's 2 server connections:"
console "SHOW POOLS"
wait "$BENCH_PID" || { cat "$TMP/pgbench.out"; die "pgbench failed"; }
grep -E '^(number of clients|number of transactions actually processed|number of failed|latency average|tps)' \
	"$TMP/pgbench.out" || cat "$TMP/pgbench.out"
sleep 1.2	# one stats_period, so that the avg_ columns show the last second
console "SHOW STATS"
console "SHOW SERVERS"

# ---- 5. LokaDB tables and organizations ----

say "a multi-tenant schema: organizations, projects (cloud table), documents (tenant table)"
app_psql -q <<'EOF'
CREATE TABLE organizations (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE projects (id bigint PRIMARY KEY, organization_id bigint NOT NULL REFERENCES organizations, name text);
CREATE TABLE documents (organization_id bigint NOT NULL REFERENCES organizations, id bigint NOT NULL,
	project_id bigint REFERENCES projects, title text, PRIMARY KEY (organization_id, id));
INSERT INTO organizations VALUES (1, 'Acme'), (2, 'Globex'), (3, 'Initech');
INSERT INTO projects SELECT p, 1 + p % 3, 'project ' || p FROM generate_series(1, 9) p;
INSERT INTO documents SELECT 1 + d % 3, d, 1 + d % 9, 'document ' || d FROM generate_series(1, 3000) d;
EOF
echo "3 organizations, 9 projects, 3000 documents"

say "the console installs the catalog, registers the organizations, enables documents and isolates organization 2 (online)"
console "INSTALL"
for o in "1 'Acme'" "2 'Globex'" "3 'Initech'"; do console "ADD ORG $o" >/dev/null; done
console "ENABLE TABLE documents"
console "ISOLATE ORG 2"
console "SHOW TABLES"
console "SHOW ORGS"

say "the application is unchanged: the same statements, routed by organization"
app_psql -e <<'EOF'
SELECT count(*) FROM documents;
SELECT d.id, d.title, p.name FROM documents d JOIN projects p ON p.id = d.project_id
 WHERE d.organization_id = 2 ORDER BY d.id DESC LIMIT 3;
SELECT tableoid::regclass AS partition, count(*) FROM documents GROUP BY 1 ORDER BY 1;
EOF
echo "org_routing addressed the organization-2 statement to its own partition (route_log):"
grep -E 'org=2' "$TMP/lokadb.log" | tail -1 | sed 's/^/    /'

say "a COPY that would read every organization is refused; with an organization it works"
app_psql -c 'COPY documents TO STDOUT' 2>&1 | head -1 || true
app_psql -q -c "SET lokadb.org = 3" -c 'COPY documents TO STDOUT' | wc -l | sed 's/^/rows of organization 3: /'
console "SHOW ORG_ROUTING"

# ---- 6. a site ----

say "a site: a second PostgreSQL cluster stands for organization 2's own database"
make_cluster "$SITEDATA" "$SITE_PG_PORT" "$TMP/initdb-site.log"
as_pg "$PG_BIN/pg_ctl" -D "$SITEDATA" -l "$TMP/site-postgres.log" -w -t 30 start >/dev/null
SITE_STARTED=1
as_pg "$PSQL" -X -q -h "$TMP" -p "$SITE_PG_PORT" -U postgres -d postgres -c "CREATE DATABASE appdb"
echo "the site's PostgreSQL on 127.0.0.1:$SITE_PG_PORT, database appdb (empty)"

say "the site's agent: a lokadb with the agent plugin that dials the relay (the site opens no port)"
cat >"$TMP/agent.ini" <<EOF
[lokadb]
listen_addr = 127.0.0.1
listen_port = $AGENT_PORT
unix_socket_dir = $TMP
logfile = $TMP/agent.log
pidfile = $TMP/agent.pid
auth_type = trust
admin_users = admin
plugins = agent

[plugin.agent]
relay = 127.0.0.1:$RELAY_PORT
site = acme
token = $SITE_TOKEN
relay_pin = $RELAY_PIN
; the only databases it connects to, whatever the relay asks for
databases = appdb:host=127.0.0.1 port=$SITE_PG_PORT dbname=appdb
EOF
sed -e 's/^/    /' -e "s/$SITE_TOKEN/<the site's token>/" "$TMP/agent.ini"
"$LOKADB" -q "$TMP/agent.ini" &
AGENT_PID=$!
i=0
until PGPASSWORD=admin_pw "$PSQL" -X -qAt -h 127.0.0.1 -p "$LK_PORT" -U admin -d lokadb \
	-c 'SHOW AGENTS' 2>/dev/null </dev/null | grep -q '^acme|.*|active'; do
	kill -0 "$AGENT_PID" 2>/dev/null || die "the agent exited at start-up (see $TMP/agent.log)"
	i=$((i + 1))
	[ $i -lt 100 ] || die "the agent did not connect to the relay within 10 seconds"
	sleep 0.1
done
console "SHOW AGENTS"

say "CREATE SITE: a postgres_fdw server in the cloud database that reaches the site through lokadb and the tunnel"
console "CREATE SITE acme DATABASE 'site_acme' HOST '127.0.0.1' PORT $LK_PORT USER 'postgres' PASSWORD 'demo_pw'"

say "MOVE ORG 2 TO SITE acme OFFLINE: its tables made at the site, its rows copied and verified, its partition swapped"
console "MOVE ORG 2 TO SITE acme OFFLINE"
console "SHOW ORGS"

say "the same statements as before: organization 2 is read and written at its site"
app_psql -e <<'EOF'
SELECT count(*) FROM documents WHERE organization_id = 2;
SELECT d.id, d.title, p.name FROM documents d JOIN projects p ON p.id = d.project_id
 WHERE d.organization_id = 2 ORDER BY d.id DESC LIMIT 3;
INSERT INTO documents (organization_id, id, project_id, title) VALUES (2, 3002, 2, 'written at the site');
SELECT tableoid::regclass AS partition, count(*) FROM documents GROUP BY 1 ORDER BY 1;
EOF
echo "postgres_fdw runs the organization's ORDER BY and LIMIT at the site (EXPLAIN VERBOSE, Remote SQL):"
app_psql -At -c "EXPLAIN VERBOSE SELECT id, title FROM documents WHERE organization_id = 2 ORDER BY id DESC LIMIT 3" \
	| grep -E 'Remote SQL' | sed 's/^ */    /'
echo "and at the site itself (psql to the site's PostgreSQL):"
as_pg "$PSQL" -X -h "$TMP" -p "$SITE_PG_PORT" -U postgres -d appdb \
	-c "SELECT organization_id, count(*), max(id) FROM documents GROUP BY 1"
console "SHOW STREAMS"
