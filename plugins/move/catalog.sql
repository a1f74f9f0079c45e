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

-- A relation's table privileges, whoever granted them (its owner's when
-- it has no ACL).
CREATE OR REPLACE FUNCTION lokadb.table_privileges(rel oid)
RETURNS TABLE (grantee oid, privilege_type text, is_grantable boolean)
LANGUAGE sql STABLE AS $$
	SELECT DISTINCT e.grantee, e.privilege_type, e.is_grantable
	FROM pg_catalog.pg_class c, pg_catalog.aclexplode(coalesce(c.relacl,
		pg_catalog.acldefault((CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))) e
	WHERE c.oid = rel
$$;

-- A relation's column privileges, whoever granted them, by column name (a
-- leaf made after a DROP COLUMN numbers its columns otherwise).
CREATE OR REPLACE FUNCTION lokadb.column_privileges(rel oid)
RETURNS TABLE (attname name, grantee oid, privilege_type text, is_grantable boolean)
LANGUAGE sql STABLE AS $$
	SELECT DISTINCT a.attname, e.grantee, e.privilege_type, e.is_grantable
	FROM pg_catalog.pg_attribute a, pg_catalog.aclexplode(a.attacl) e
	WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL
$$;

-- A relation's column ACLs as stored, by column name ("col=acl,..."; NULL
-- none): equal where the columns' privileges are (neither order nor
-- grantors differ), so compared before privileges_of().
CREATE OR REPLACE FUNCTION lokadb.column_acls(rel oid) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT pg_catalog.string_agg(pg_catalog.format('%I=%s', a.attname, a.attacl), ',' ORDER BY a.attname)
	FROM pg_catalog.pg_attribute a
	WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL
$$;

-- Both: the table privileges (attname NULL), then the column privileges.
CREATE OR REPLACE FUNCTION lokadb.all_privileges(rel oid)
RETURNS TABLE (attname name, grantee oid, privilege_type text, is_grantable boolean)
LANGUAGE sql STABLE AS $$
	SELECT NULL::name, e.* FROM lokadb.table_privileges(rel) e
	UNION ALL
	SELECT e.* FROM lokadb.column_privileges(rel) e
$$;

-- A relation's privileges as one text: owner, table privileges whoever
-- granted them, column privileges (meta_cache's MC_PRIVS).
CREATE OR REPLACE FUNCTION lokadb.privileges_of(rel oid) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT c.relowner::text || ';' || (SELECT coalesce(string_agg(DISTINCT x, ',' ORDER BY x), '') FROM (
		SELECT coalesce(e.attname::text || '/', '') || e.grantee::text || ':' || e.privilege_type || ':'
		       || e.is_grantable::text AS x
		FROM lokadb.all_privileges(c.oid) e) s)
	FROM pg_catalog.pg_class c WHERE c.oid = rel
$$;

-- What a statement addressed to an organization's partition would bypass on
-- a LokaDB table's parent (org_routing then keeps such statements on the
-- parent): 'r' row-level security (every statement), 'i', 'u', 'd' a rule
-- or an enabled statement-level trigger for INSERT, UPDATE, DELETE, 'a' an
-- organization's leaf with other privileges or another owner than the
-- parent (PostgreSQL checks a leaf's own: a GRANT or REVOKE on the parent
-- after ISOLATE ORG does not reach it; the event trigger below copies them,
-- lokadb.copy_privileges() does on demand); NULL none. ENABLE TABLE refuses
-- row-level security and rules; they, and statement-level triggers, may
-- come later: the event trigger below tells the proxies (a new version)
-- when what is guarded changes. meta_cache's LOAD computes the same
-- (MC_LOAD_SQL).
CREATE OR REPLACE FUNCTION lokadb.table_guard(p_schema name, p_table name) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT nullif(coalesce((
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
	GROUP BY c.relrowsecurity), '') || coalesce((
	SELECT 'a' FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = p_schema AND c.relname = p_table
	AND EXISTS (SELECT 1 FROM lokadb.partitions p JOIN pg_catalog.pg_class l
		    ON l.relnamespace = n.oid AND l.relname = p.leaf
		    WHERE p.schema_name = p_schema AND p.table_name = p_table
		    -- (as stored first, in a CASE: the planner may order the
		    -- conditions of an AND by its estimates, and the function
		    -- costs 30 us where nothing differs; the columns' only when
		    -- the parent has some, as ISOLATE ORG and the event trigger
		    -- give a leaf only its parent's)
		    AND CASE WHEN l.relowner <> c.relowner OR l.relacl IS DISTINCT FROM c.relacl
				  OR (EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
					      WHERE a.attrelid = c.oid AND a.attnum > 0 AND a.attacl IS NOT NULL)
				      AND lokadb.column_acls(l.oid) IS DISTINCT FROM lokadb.column_acls(c.oid))
			     THEN lokadb.privileges_of(l.oid) <> lokadb.privileges_of(c.oid) ELSE false END)), ''), '')
$$;

INSERT INTO lokadb.meta VALUES ('guards', '') ON CONFLICT (key) DO NOTHING;

-- Does code in this database read settings, so that the server's lokadb.org
-- may be read there? Any function (but schema lokadb's and those in C or
-- internal) whose text names current_setting, pg_settings, SHOW or
-- lokadb.org; any view, rule, policy or trigger condition, and any column
-- default or CHECK constraint of a LokaDB table or a domain, that calls
-- current_setting() or pg_show_all_settings() or reads pg_settings. Objects
-- of initdb's (OID below 16384) are not looked at, nor the defaults and
-- constraints of partitions (their table's copies). org_routing's
-- server_org = auto sets each statement's organization on its server only
-- when this is true (the meta_cache plugin's MC_READERS_SQL, written out
-- there for a proxy newer than its catalog).
CREATE OR REPLACE FUNCTION lokadb.setting_readers() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
	SELECT EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		       WHERE p.oid >= 16384 AND n.nspname <> 'lokadb' AND p.prolang NOT IN (12, 13)
			 AND (p.prosrc ~* '(current_setting|_settings|lokadb[.]org|\mshow\M)'
			      OR p.prosqlbody::text ~ x.r)
		       UNION ALL SELECT FROM pg_rewrite WHERE oid >= 16384 AND (ev_action::text ~ x.r OR ev_qual::text ~ x.r)
		       UNION ALL SELECT FROM pg_policy WHERE polqual::text ~ x.r OR polwithcheck::text ~ x.r
		       UNION ALL SELECT FROM pg_trigger WHERE tgparentid = 0 AND tgqual::text ~ x.r
		       UNION ALL SELECT FROM pg_attrdef WHERE adrelid = ANY (x.t) AND adbin::text ~ x.r
		       UNION ALL SELECT FROM pg_constraint WHERE (conrelid = ANY (x.t) OR (conrelid = 0 AND oid >= 16384))
						  AND conbin::text ~ x.r)
	FROM (SELECT ':funcid (2077|3294|2084) |:relid ' || 'pg_settings'::regclass::oid || ' ' AS r,
		     ARRAY(SELECT to_regclass(format('%I.%I', schema_name, table_name))::oid FROM lokadb.tables) AS t) x
$$;

INSERT INTO lokadb.meta VALUES ('setting_readers', lokadb.setting_readers()::text) ON CONFLICT (key) DO NOTHING;

-- A grantee as GRANT and REVOKE write it (0: PUBLIC).
CREATE OR REPLACE FUNCTION lokadb.grantee(role oid) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT CASE WHEN role = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(role)) END
$$;

-- Give `dst` exactly the privileges `src` has (table and column grants).
-- (Here, not in move.sql: the event trigger below uses it.)
CREATE OR REPLACE FUNCTION lokadb.copy_acl(src oid, dst oid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	kind "char";
	objtype text;
	g record;
	was text := coalesce(current_setting('lokadb.copying_privileges', true), '');
BEGIN
	-- its GRANTs are no news for the event trigger lokadb_guards
	PERFORM set_config('lokadb.copying_privileges', 'on', true);
	SELECT relkind INTO kind FROM pg_class WHERE oid = dst;
	objtype := CASE WHEN kind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END;
	-- start from nothing: revoke what dst's ACL holds
	FOR g IN SELECT DISTINCT e.grantee FROM lokadb.table_privileges(dst) e LOOP
		EXECUTE format('REVOKE ALL ON %s %s FROM %s CASCADE', objtype, dst::regclass::text, lokadb.grantee(g.grantee));
	END LOOP;
	-- and its column privileges (a grantee may have them without any on the table)
	FOR g IN SELECT DISTINCT e.attname, e.grantee FROM lokadb.column_privileges(dst) e WHERE kind <> 'S' LOOP
		EXECUTE format('REVOKE ALL (%I) ON TABLE %s FROM %s CASCADE', g.attname, dst::regclass::text, lokadb.grantee(g.grantee));
	END LOOP;
	FOR g IN SELECT e.* FROM lokadb.all_privileges(src) e WHERE kind <> 'S' OR e.attname IS NULL LOOP
		EXECUTE format('GRANT %s%s ON %s %s TO %s%s', g.privilege_type, coalesce(' (' || quote_ident(g.attname) || ')', ''),
			       objtype, dst::regclass::text, lokadb.grantee(g.grantee),
			       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
	END LOOP;
	PERFORM set_config('lokadb.copying_privileges', was, true);
END $$;

-- Give the relations `names` (comma-separated, each with the table and
-- column privileges of `was_like`) the table and column privileges of
-- `src`, whoever granted them: one REVOKE or GRANT per privilege that
-- differs (a column's by its name), REVOKEs first (a table privilege's
-- takes the columns' of its kind along). Returns how many.
CREATE OR REPLACE FUNCTION lokadb.grant_difference(src regclass, was_like regclass, names text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
	g record;
	k integer := 0;
BEGIN
	FOR g IN SELECT 0 AS step, * FROM (SELECT * FROM lokadb.all_privileges(was_like)
					   EXCEPT SELECT * FROM lokadb.all_privileges(src)) x
		 UNION ALL SELECT 1, * FROM (SELECT * FROM lokadb.all_privileges(src)
					     EXCEPT SELECT * FROM lokadb.all_privileges(was_like)) y
		 ORDER BY 1 LOOP
		IF g.step = 0 THEN
			EXECUTE pg_catalog.format('REVOKE %s%s ON TABLE %s FROM %s CASCADE', g.privilege_type,
						  coalesce(' (' || pg_catalog.quote_ident(g.attname) || ')', ''), names,
						  lokadb.grantee(g.grantee));
		ELSE
			EXECUTE pg_catalog.format('GRANT %s%s ON TABLE %s TO %s%s', g.privilege_type,
						  coalesce(' (' || pg_catalog.quote_ident(g.attname) || ')', ''), names,
						  lokadb.grantee(g.grantee),
						  CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END IF;
		k := k + 1;
	END LOOP;
	RETURN k;
END $$;

-- The partitions (container and leaf) of the LokaDB table `rel`: whether
-- their owner is another than the parent's, their ACLs as stored (the
-- table's and the columns' by name: equal to the parent's where nothing
-- changed, unequal also where only their order or grantors differ), and
-- whether those or the owner differ from the parent's. (ACLs as stored:
-- PostgreSQL compares them without a function call per partition; each
-- name looked up in the index, OFFSET 0: a hash of every relation of the
-- schema took 0.1-0.6 s at 20,000 partitions)
CREATE OR REPLACE FUNCTION lokadb.partition_acls(rel regclass)
RETURNS TABLE (part regclass, kind text, other_owner boolean, acls text, differs boolean)
LANGUAGE sql STABLE AS $$
	SELECT x.oid::regclass, CASE WHEN x.relkind = 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, x.other_owner, x.acls,
	       x.other_owner OR x.acls <> x.parent_acls
	FROM (SELECT pc.oid, pc.relkind, pc.relowner <> c.relowner AS other_owner, k.acls,
		     pg_catalog.max(k.acls) FILTER (WHERE pc.oid = c.oid) OVER () AS parent_acls
	      FROM pg_catalog.pg_class c, pg_catalog.pg_namespace n,
		   LATERAL (SELECT c.relname UNION ALL
			    SELECT v.r FROM lokadb.partitions p, LATERAL (VALUES (p.container), (p.leaf)) v(r)
			    WHERE p.schema_name = n.nspname AND p.table_name = c.relname) x(name),
		   LATERAL (SELECT * FROM pg_catalog.pg_class pc
			    WHERE pc.relnamespace = n.oid AND pc.relname = x.name OFFSET 0) pc,
		   LATERAL (SELECT coalesce(pc.relacl::text, '') || ';' || coalesce(lokadb.column_acls(pc.oid), '')) k(acls)
	      WHERE c.oid = rel AND n.oid = c.relnamespace) x
	WHERE x.oid <> rel
$$;

-- Give every partition (container and leaf) of the LokaDB table `rel` the
-- owner and the privileges of the parent, as ISOLATE ORG made them. Run by
-- the event trigger after GRANT, REVOKE and ALTER TABLE; by hand (the
-- table's owner) where INSTALL had no superuser. Returns the partitions
-- changed.
CREATE OR REPLACE FUNCTION lokadb.copy_privileges(rel regclass) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
	t record;
	part record;
	owner name;
	n integer := 0;
	v text;
	grp record;
	differing boolean := false;
	was text := coalesce(current_setting('lokadb.copying_privileges', true), '');
BEGIN
	SELECT lt.* INTO t FROM lokadb.tables lt
	WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', lt.schema_name, lt.table_name)) = rel;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'table % is not a LokaDB table', rel USING ERRCODE = 'undefined_table';
	END IF;
	SELECT pg_catalog.pg_get_userbyid(relowner) INTO owner FROM pg_catalog.pg_class WHERE oid = rel;
	PERFORM pg_catalog.set_config('lokadb.copying_privileges', 'on', true);	-- (its ALTER ... OWNER too)
	-- The usual case, a GRANT or REVOKE on the parent: its partitions of the
	-- parent's owner, all with the same ACLs (the parent's before). The
	-- difference is computed once per such group and each GRANT or REVOKE
	-- names up to 1,000 partitions: at 20,000 partitions 1 s instead of 5
	-- (a statement per partition) for table privileges, 1 s instead of 11-18
	-- for column privileges.
	FOR grp IN SELECT x.other_owner, pg_catalog.array_agg(x.part::text) AS rels
		   FROM lokadb.partition_acls(rel) x WHERE x.differs
		   GROUP BY x.other_owner, x.acls LOOP
		differing := true;
		CONTINUE WHEN grp.other_owner;		-- (below)
		-- (each chunk's first partition has the group's ACLs until its own turn;
		-- ACLs that differ only in their order or grantors: nothing to do)
		FOR i IN 0 .. (pg_catalog.cardinality(grp.rels) - 1) / 1000 LOOP
			EXIT WHEN lokadb.grant_difference(rel, grp.rels[i * 1000 + 1]::regclass,
							  pg_catalog.array_to_string(grp.rels[i * 1000 + 1 : i * 1000 + 1000], ', ')) = 0;
			IF i = 0 THEN
				n := n + pg_catalog.cardinality(grp.rels);
			END IF;
		END LOOP;
	END LOOP;
	-- Then each partition that still differs (another owner, several
	-- grantors), if any did (where none did, the usual case after a GRANT
	-- on something else, one pass over the partitions).
	FOR part IN SELECT x.part AS rel, x.other_owner, x.kind FROM lokadb.partition_acls(rel) x
		    WHERE differing AND x.differs LOOP
		CONTINUE WHEN lokadb.privileges_of(part.rel) = lokadb.privileges_of(rel);
		IF part.other_owner THEN
			EXECUTE pg_catalog.format('ALTER %s %s OWNER TO %I', part.kind, part.rel, owner);
		END IF;
		-- the table and column privileges that differ, one statement each
		-- (after a GRANT or REVOKE on the parent, one), REVOKEs first; then,
		-- if anything still differs (several grantors), all of them
		PERFORM lokadb.grant_difference(rel, part.rel, part.rel::text);
		IF lokadb.privileges_of(part.rel) <> lokadb.privileges_of(rel) THEN
			PERFORM lokadb.copy_acl(rel, part.rel);
		END IF;
		n := n + 1;
	END LOOP;
	PERFORM pg_catalog.set_config('lokadb.copying_privileges', was, true);
	IF n > 0 THEN	-- a proxy that kept the table's statements on the parent may address leaves again
		BEGIN
			UPDATE lokadb.meta SET value = (value::bigint + 1)::text WHERE key = 'version'
			RETURNING value INTO v;
			PERFORM pg_catalog.pg_notify('lokadb_meta', v);
		EXCEPTION WHEN insufficient_privilege THEN
			RAISE NOTICE 'lokadb: the proxies see the new privileges of the partitions of % at their next catalog reload (console: META_CACHE RELOAD)', rel;
		END;
	END IF;
	RETURN n;
END $$;

CREATE OR REPLACE FUNCTION lokadb.guards_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
	g text;
	r text;
	v bigint;
	tb record;
	changed boolean := false;
BEGIN
	IF coalesce(current_setting('lokadb.copying_privileges', true), '') = 'on' THEN
		RETURN;		-- the GRANTs of copy_privileges() itself
	END IF;
	IF tg_tag IN ('GRANT', 'REVOKE') AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() d
							 WHERE d.object_type = 'TABLE') THEN
		RETURN;		-- on a function, a schema, a sequence ...: nothing of a LokaDB table
	END IF;
	IF tg_tag IN ('GRANT', 'REVOKE', 'ALTER TABLE', 'ALTER FOREIGN TABLE') THEN
		-- the parents' privileges to their partitions (PostgreSQL checks a
		-- statement addressed to a leaf against the leaf's own): after a
		-- GRANT or REVOKE (PostgreSQL does not say on what) every LokaDB
		-- table's, after an ALTER (an owner) those of the tables it was on
		FOR tb IN SELECT x.rel FROM (SELECT pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name,
										 table_name)) AS rel
					    FROM lokadb.tables) x
			 WHERE x.rel IS NOT NULL AND (tg_tag IN ('GRANT', 'REVOKE') OR x.rel IN (
				SELECT pg_catalog.pg_partition_root(d.objid) FROM pg_catalog.pg_event_trigger_ddl_commands() d
				WHERE d.objid IS NOT NULL)) LOOP
			BEGIN
				PERFORM lokadb.copy_privileges(tb.rel);
			EXCEPTION WHEN OTHERS THEN
				-- the client's command stands; the leaves' differing privileges
				-- keep its statements on the parent (table_guard 'a')
				RAISE WARNING 'lokadb: could not give the partitions of % the privileges of the table: %',
					tb.rel, SQLERRM;
			END;
		END LOOP;
	END IF;
	-- the tags of table guards: the event trigger's (below) before its tags
	-- of setting readers; keep the two lists the same
	IF tg_tag IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'DROP TRIGGER', 'CREATE RULE', 'DROP RULE',
		      'CREATE POLICY', 'DROP POLICY', 'GRANT', 'REVOKE', 'ALTER FOREIGN TABLE') THEN
		SELECT coalesce(string_agg(format('%I.%I:%s', t.schema_name, t.table_name, x.guard), ','
					   ORDER BY t.schema_name, t.table_name), '')
		INTO g
		FROM lokadb.tables t, LATERAL (SELECT lokadb.table_guard(t.schema_name, t.table_name) AS guard) x
		WHERE x.guard IS NOT NULL;
		UPDATE lokadb.meta SET value = g WHERE key = 'guards' AND value IS DISTINCT FROM g;
		changed := FOUND;
	END IF;
	-- every tag: code that may read lokadb.org (org_routing's server_org = auto)
	r := lokadb.setting_readers()::text;
	UPDATE lokadb.meta SET value = r WHERE key = 'setting_readers' AND value IS DISTINCT FROM r;
	IF changed OR FOUND THEN
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
	IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
		-- one of an older INSTALL lacks the tags of privileges
		-- (one of an older INSTALL lacks those of functions and views)
		IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lokadb_guards'
			   AND NOT 'CREATE FUNCTION' = ANY (evttags)) THEN
			DROP EVENT TRIGGER lokadb_guards;
		END IF;
		IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lokadb_guards') THEN
			CREATE EVENT TRIGGER lokadb_guards ON ddl_command_end
				WHEN TAG IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'DROP TRIGGER',
					     'CREATE RULE', 'DROP RULE', 'CREATE POLICY', 'DROP POLICY',
					     'GRANT', 'REVOKE', 'ALTER FOREIGN TABLE',	-- the list of guards_changed()
					     -- code that may read lokadb.org (setting_readers)
					     'CREATE FUNCTION', 'ALTER FUNCTION', 'DROP FUNCTION',
					     'CREATE PROCEDURE', 'ALTER PROCEDURE', 'DROP PROCEDURE',
					     'CREATE VIEW', 'ALTER VIEW', 'DROP VIEW', 'ALTER POLICY',
					     'CREATE DOMAIN', 'ALTER DOMAIN', 'DROP DOMAIN', 'CREATE SCHEMA',
					     'DROP SCHEMA', 'CREATE EXTENSION', 'ALTER EXTENSION',
					     'DROP EXTENSION', 'DROP OWNED', 'DROP TABLE')
				EXECUTE FUNCTION lokadb.guards_changed();
		END IF;
	ELSIF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lokadb_guards') THEN
		RAISE NOTICE 'lokadb: not a superuser, so no event trigger: row-level security, rules or statement-level triggers added to a LokaDB table later, and privileges granted or revoked on it, and functions, views or policies that read settings (org_routing''s server_org = auto), reach the proxies at a new connection''s freshness check or their next catalog reload (privileges: run SELECT lokadb.copy_privileges(''table''))';
	END IF;
END $$;
