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
