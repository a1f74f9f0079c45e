-- SPDX-License-Identifier: ISC
-- The LokaDB catalog in the cloud database (schema lokadb), version 1.
-- Installed and upgraded by the console command INSTALL (plugin move); every
-- statement here is idempotent. Read by the meta_cache plugin.
--
-- Every change to orgs, tables, partitions or sites bumps lokadb.meta
-- 'version' and sends NOTIFY lokadb_meta with the new version as payload
-- (one notification per transaction), so live proxies learn of it at once
-- and new connections can compare versions cheaply.

CREATE SCHEMA IF NOT EXISTS lokadb;

CREATE TABLE IF NOT EXISTS lokadb.meta (
	key	text PRIMARY KEY,
	value	text NOT NULL
);
INSERT INTO lokadb.meta VALUES ('schema_version', '1') ON CONFLICT (key) DO NOTHING;
INSERT INTO lokadb.meta VALUES ('version', '1') ON CONFLICT (key) DO NOTHING;

-- Sites: where moved organizations live (used by the relay / fdw issue).
CREATE TABLE IF NOT EXISTS lokadb.sites (
	name		text PRIMARY KEY,
	relay_key	text,			-- the database key the relay routes to the site's agent
	direct_conninfo	text,			-- credentials of the direct path (profile fdw+direct)
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- Organizations. id is kept as text: it is compared with the organization
-- column of each LokaDB table through that column's type (int, bigint, uuid, text).
CREATE TABLE IF NOT EXISTS lokadb.orgs (
	id		text PRIMARY KEY,
	name		text,
	state		text NOT NULL DEFAULT 'cloud'
			CHECK (state IN ('cloud', 'isolating', 'moving', 'moved')),
	isolated	boolean NOT NULL DEFAULT false,	-- has its own container partition in every LokaDB table
	site		text REFERENCES lokadb.sites (name),
	profile		text NOT NULL DEFAULT 'fdw' CHECK (profile IN ('fdw', 'fdw+direct')),
	paused		boolean NOT NULL DEFAULT false,	-- writes held at the proxy (switch of a move)
	updated_at	timestamptz NOT NULL DEFAULT now()
);

-- LokaDB tables: LIST-partitioned by org_column, with a DEFAULT partition.
CREATE TABLE IF NOT EXISTS lokadb.tables (
	schema_name	name NOT NULL,
	table_name	name NOT NULL,
	org_column	name NOT NULL,
	org_type	text NOT NULL,		-- format_type() of the organization column
	default_part	name NOT NULL,		-- the DEFAULT partition (the original table, renamed)
	enabled_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (schema_name, table_name)
);

-- One row per (LokaDB table, isolated organization): its one-value container
-- (PARTITION OF the table FOR VALUES IN (org) PARTITION BY LIST (org_column))
-- and the leaf inside it (a plain table now, a foreign table after a move).
CREATE TABLE IF NOT EXISTS lokadb.partitions (
	schema_name	name NOT NULL,
	table_name	name NOT NULL,
	org_id		text NOT NULL REFERENCES lokadb.orgs (id),
	container	name NOT NULL,
	leaf		name NOT NULL,
	PRIMARY KEY (schema_name, table_name, org_id),
	FOREIGN KEY (schema_name, table_name) REFERENCES lokadb.tables (schema_name, table_name)
);

CREATE OR REPLACE FUNCTION lokadb.bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE v bigint;
BEGIN
	UPDATE lokadb.meta SET value = (value::bigint + 1)::text WHERE key = 'version' RETURNING value::bigint INTO v;
	PERFORM pg_notify('lokadb_meta', v::text);
	RETURN NULL;
END $$;

DO $$
DECLARE t text;
BEGIN
	FOREACH t IN ARRAY ARRAY['sites', 'orgs', 'tables', 'partitions'] LOOP
		IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'lokadb_bump_version'
			       AND tgrelid = ('lokadb.' || t)::regclass) THEN
			EXECUTE format('CREATE TRIGGER lokadb_bump_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
					ON lokadb.%I FOR EACH STATEMENT EXECUTE FUNCTION lokadb.bump_version()', t);
		END IF;
	END LOOP;
END $$;

-- What a statement addressed to an organization's partition would bypass on
-- a LokaDB table's parent (org_routing then keeps such statements on the
-- parent): 'r' row-level security (every statement), 'i', 'u', 'd' a rule
-- or an enabled statement-level trigger for INSERT, UPDATE, DELETE; NULL
-- none. ENABLE TABLE refuses row-level security and rules; they, and
-- statement-level triggers, may come later: the event trigger below tells
-- the proxies (a new version) when what is guarded changes. meta_cache's
-- LOAD computes the same (MC_LOAD_SQL).
CREATE OR REPLACE FUNCTION lokadb.table_guard(p_schema name, p_table name) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT nullif(CASE WHEN c.relrowsecurity THEN 'r' ELSE '' END
		|| CASE WHEN bool_or(e.ev IN (4, 51)) THEN 'i' ELSE '' END
		|| CASE WHEN bool_or(e.ev IN (16, 50)) THEN 'u' ELSE '' END
		|| CASE WHEN bool_or(e.ev IN (8, 52)) THEN 'd' ELSE '' END, '')
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	LEFT JOIN LATERAL (
		SELECT g.tgtype & b AS ev FROM pg_catalog.pg_trigger g, unnest(ARRAY[4, 8, 16]) b
		WHERE g.tgrelid = c.oid AND NOT g.tgisinternal AND (g.tgtype & 1) = 0 AND g.tgenabled <> 'D'
		UNION ALL
		SELECT ascii(r.ev_type) FROM pg_catalog.pg_rewrite r
		WHERE r.ev_class = c.oid AND r.ev_type IN ('2', '3', '4') AND r.ev_enabled <> 'D'
	) e ON true
	WHERE n.nspname = p_schema AND c.relname = p_table
	GROUP BY c.relrowsecurity
$$;

INSERT INTO lokadb.meta VALUES ('guards', '') ON CONFLICT (key) DO NOTHING;

CREATE OR REPLACE FUNCTION lokadb.guards_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
	g text;
	v bigint;
BEGIN
	SELECT coalesce(string_agg(format('%I.%I:%s', t.schema_name, t.table_name, x.guard), ','
				   ORDER BY t.schema_name, t.table_name), '')
	INTO g
	FROM lokadb.tables t, LATERAL (SELECT lokadb.table_guard(t.schema_name, t.table_name) AS guard) x
	WHERE x.guard IS NOT NULL;
	UPDATE lokadb.meta SET value = g WHERE key = 'guards' AND value IS DISTINCT FROM g;
	IF FOUND THEN
		UPDATE lokadb.meta SET value = (value::bigint + 1)::text WHERE key = 'version'
		RETURNING value::bigint INTO v;
		PERFORM pg_notify('lokadb_meta', v::text);
	END IF;
END $$;

-- An event trigger needs a superuser: without one the proxies learn of
-- guards added later at a new connection's freshness check or their next
-- reload (doc/lokadb.md).
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lokadb_guards') THEN
		IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
			CREATE EVENT TRIGGER lokadb_guards ON ddl_command_end
				WHEN TAG IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'DROP TRIGGER',
					     'CREATE RULE', 'DROP RULE', 'CREATE POLICY', 'DROP POLICY')
				EXECUTE FUNCTION lokadb.guards_changed();
		ELSE
			RAISE NOTICE 'lokadb: not a superuser, so no event trigger: row-level security, rules or statement-level triggers added to a LokaDB table later reach the proxies at a new connection''s freshness check or their next catalog reload';
		END IF;
	END IF;
END $$;
