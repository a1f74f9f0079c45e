-- SPDX-License-Identifier: ISC
-- plugins/move/move.sql -- the procedures behind the move plugin's console
-- commands (ENABLE TABLE, DISABLE TABLE, ISOLATE ORG, ADD ORG, SHOW TABLES,
-- SHOW ORGS), installed by INSTALL right after catalog.sql, in the same
-- transaction. Every statement is idempotent (CREATE OR REPLACE, IF NOT
-- EXISTS), so INSTALL may run any number of times.
--
-- What the C side relies on:
--   * lokadb.move_api_1() exists once this file is installed (the plugin
--     refuses to run its commands on an older catalog);
--   * every procedure that takes locks on application tables is CALLed as a
--     single statement outside a transaction block: it COMMITs between its
--     phases, and retries a phase that could not get its locks within
--     p_lock_timeout_ms (lock_not_available / deadlock_detected) up to
--     p_retries times;
--   * errors carry the SQLSTATEs documented in plugins/move/README.md.
--
-- Invariants kept here (see README.md):
--   * a LokaDB table is LIST-partitioned by its organization column, has a
--     DEFAULT partition (the original table, renamed) and, per isolated
--     organization, a one-value container (PARTITION BY LIST) holding one leaf;
--   * no PRIMARY KEY or UNIQUE index on a partitioned LokaDB table (they stay
--     on the leaves);
--   * no FOREIGN KEY constraint references a LokaDB table: enabling a table
--     replaces the foreign keys that point at it by LokaDB's trigger checks
--     (lokadb.fkeys), DISABLE TABLE puts them back;
--   * an organization is either wholly in DEFAULT or has its own partition in
--     a table, never both (outside of ISOLATE ORG's final transaction).

DO $$
BEGIN
	IF current_setting('server_version_num')::integer < 150000 THEN
		RAISE EXCEPTION 'LokaDB needs PostgreSQL 15 or later, this is %', current_setting('server_version')
			USING ERRCODE = 'feature_not_supported';
	END IF;
END $$;

-- Foreign keys that pointed at a LokaDB table, replaced by trigger checks.
CREATE TABLE IF NOT EXISTS lokadb.fkeys (
	id		bigserial PRIMARY KEY,
	conname		name NOT NULL,		-- the constraint's name (kept for DISABLE TABLE)
	from_rel	oid NOT NULL,		-- the referencing table (its LokaDB parent once enabled)
	from_cols	name[] NOT NULL,
	to_rel		oid NOT NULL,		-- the referenced LokaDB table (the partitioned parent)
	to_cols		name[] NOT NULL,
	on_update	"char" NOT NULL,	-- pg_constraint.confupdtype: a r c n d
	on_delete	"char" NOT NULL,	-- pg_constraint.confdeltype
	is_deferrable	boolean NOT NULL,
	is_deferred	boolean NOT NULL,
	definition	text NOT NULL		-- pg_get_constraintdef(), schema-qualified
);

-- The plugin checks for this function before running a command.
CREATE OR REPLACE FUNCTION lokadb.move_api_1() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 1';

-- ====================================================================
-- helpers
-- ====================================================================

-- schema-qualified, quoted name of a relation
CREATE OR REPLACE FUNCTION lokadb._q(rel oid) RETURNS text LANGUAGE sql STABLE AS $$
	SELECT format('%I.%I', n.nspname, c.relname)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel
$$;

-- base || suffix, base shortened so that the result fits in a name (63 bytes)
CREATE OR REPLACE FUNCTION lokadb._name(base text, suffix text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE b text := base;
BEGIN
	WHILE octet_length(b || suffix) > 63 LOOP
		b := left(b, length(b) - 1);
	END LOOP;
	RETURN b || suffix;
END $$;

-- An organization id as it appears in object names: itself when it is
-- made of [a-z0-9_] (up to 20 characters), else a cleaned prefix and a hash.
CREATE OR REPLACE FUNCTION lokadb._orgkey(org text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT CASE WHEN org ~ '^[a-z0-9_]{1,20}$' THEN org
		ELSE left(regexp_replace(lower(org), '[^a-z0-9_]', '_', 'g'), 12) || '_' || left(md5(org), 8) END
$$;

-- Advisory lock keys: one per table (by OID) and one per organization, so
-- that two commands never work on the same table or organization, also from
-- two lokadb processes. Session-level: the plugin closes its connection at
-- the end of each command, which releases them.
CREATE OR REPLACE FUNCTION lokadb._busy(rel oid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF NOT pg_try_advisory_lock((19531::bigint << 32) | rel::bigint) THEN
		RAISE EXCEPTION 'table % is busy with another LokaDB command', lokadb._q(rel)
			USING ERRCODE = 'object_in_use', HINT = 'Wait for the other command to end.',
			      DETAIL = 'Another connection (possibly another lokadb process) holds it.';
	END IF;
END $$;

CREATE OR REPLACE FUNCTION lokadb._org_busy(org text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF NOT pg_try_advisory_lock(19532, hashtext(org)) THEN
		RAISE EXCEPTION 'organization "%" is busy with another LokaDB command', org
			USING ERRCODE = 'object_in_use';
	END IF;
END $$;

-- The table a console argument names ("t", "s.t", "s"."T"), resolved with
-- the connection's search_path like PostgreSQL would; 42P01 if none.
CREATE OR REPLACE FUNCTION lokadb.resolve_table(p_name text) RETURNS oid LANGUAGE plpgsql STABLE AS $$
DECLARE
	parts text[];
	rel oid;
BEGIN
	parts := parse_ident(p_name);
	IF array_length(parts, 1) = 1 THEN
		rel := to_regclass(quote_ident(parts[1]));
	ELSIF array_length(parts, 1) = 2 THEN
		rel := to_regclass(format('%I.%I', parts[1], parts[2]));
	ELSIF array_length(parts, 1) = 3 AND parts[1] = current_database() THEN
		rel := to_regclass(format('%I.%I', parts[2], parts[3]));
	END IF;
	IF rel IS NULL THEN
		RAISE EXCEPTION 'relation "%" does not exist', p_name USING ERRCODE = 'undefined_table';
	END IF;
	RETURN rel;
END $$;

-- "schema.table" (quoted as needed) of a console argument: the key of the
-- plugin's in-process set of busy tables.
CREATE OR REPLACE FUNCTION lokadb.table_key(p_name text) RETURNS text LANGUAGE sql STABLE AS $$
	SELECT lokadb._q(lokadb.resolve_table(p_name))
$$;

-- The catalog row of a LokaDB table by the OID of its partitioned parent.
CREATE OR REPLACE FUNCTION lokadb._table_row(rel oid) RETURNS lokadb.tables LANGUAGE sql STABLE AS $$
	SELECT t.* FROM lokadb.tables t JOIN pg_namespace n ON n.nspname = t.schema_name
	JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name WHERE c.oid = rel
$$;

-- The relation whose triggers cover every row of `rel`: the LokaDB parent
-- when rel is a partition of a LokaDB table, else rel.
CREATE OR REPLACE FUNCTION lokadb._top(rel oid) RETURNS oid LANGUAGE sql STABLE AS $$
	SELECT coalesce((SELECT c.oid FROM pg_partition_ancestors(rel) a(relid)
			 JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
			 JOIN lokadb.tables t ON t.schema_name = n.nspname AND t.table_name = c.relname
			 LIMIT 1), rel)
$$;

-- Run pg_get_*def() with an empty search_path, so every name in the text is
-- schema-qualified and means the same object wherever the text is replayed.
CREATE OR REPLACE FUNCTION lokadb._def(kind text, obj oid) RETURNS text LANGUAGE plpgsql STABLE
SET search_path = '' AS $$
BEGIN
	RETURN CASE kind
		WHEN 'index' THEN pg_catalog.pg_get_indexdef(obj)
		WHEN 'trigger' THEN pg_catalog.pg_get_triggerdef(obj)
		WHEN 'constraint' THEN pg_catalog.pg_get_constraintdef(obj)
		WHEN 'view' THEN pg_catalog.pg_get_viewdef(obj)
	END;
END $$;

-- The views that read `rel`: (view, its reloptions, its definition), to
-- re-create them after `rel` was renamed away (they follow the OID).
CREATE OR REPLACE FUNCTION lokadb._views_of(rel oid) RETURNS TABLE (view oid, opts text, def text)
LANGUAGE sql STABLE AS $$
	SELECT DISTINCT r.ev_class, array_to_string(c.reloptions, ', '), lokadb._def('view', r.ev_class)
	FROM pg_depend d JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
	JOIN pg_class c ON c.oid = r.ev_class
	WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = rel AND r.ev_class <> rel AND c.relkind = 'v'
$$;

-- views: the result of lokadb._views_of() as three arrays
CREATE OR REPLACE FUNCTION lokadb._replace_views(v oid[], opts text[], defs text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. coalesce(array_length(v, 1), 0) LOOP
		EXECUTE format('CREATE OR REPLACE VIEW %s%s AS %s', lokadb._q(v[i]),
			       CASE WHEN opts[i] IS NULL OR opts[i] = '' THEN '' ELSE ' WITH (' || opts[i] || ')' END,
			       rtrim(defs[i], '; '));
	END LOOP;
END $$;

-- key columns of a plain table: its primary key, else a unique index on
-- NOT NULL columns without expressions or predicate; NULL when it has none.
CREATE OR REPLACE FUNCTION lokadb._key_cols(rel oid) RETURNS name[] LANGUAGE sql STABLE AS $$
	SELECT (SELECT array_agg(a.attname ORDER BY s) FROM generate_series(0, i.indnkeyatts - 1) s
		JOIN pg_attribute a ON a.attrelid = rel AND a.attnum = i.indkey[s])
	FROM pg_index i
	WHERE i.indrelid = rel AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
	  AND NOT EXISTS (SELECT 1 FROM generate_series(0, i.indnkeyatts - 1) s JOIN pg_attribute a
			  ON a.attrelid = rel AND a.attnum = i.indkey[s] WHERE NOT a.attnotnull)
	ORDER BY i.indisprimary DESC, i.indnatts, i.indexrelid
	LIMIT 1
$$;

-- the columns an INSERT must list (everything but generated columns)
CREATE OR REPLACE FUNCTION lokadb._ins_cols(rel oid, prefix text DEFAULT '') RETURNS text LANGUAGE sql STABLE AS $$
	SELECT string_agg(prefix || quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
	WHERE attrelid = rel AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
$$;

-- the plain tables holding the rows of `rel` (itself when it is one)
CREATE OR REPLACE FUNCTION lokadb._leaves(rel oid) RETURNS SETOF oid LANGUAGE sql STABLE AS $$
	SELECT oid FROM pg_class WHERE oid = rel AND relkind = 'r'
	UNION
	SELECT p.relid FROM pg_partition_tree(rel) p JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf AND c.relkind = 'r'
$$;

-- DROP TRIGGER IF EXISTS, without the NOTICE
CREATE OR REPLACE FUNCTION lokadb._drop_trigger(qrel text, tg text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(qrel) AND tgname = tg) THEN
		EXECUTE format('DROP TRIGGER %I ON %s', tg, qrel);
	END IF;
END $$;

-- retry bookkeeping shared by the procedures: raises when out of attempts
CREATE OR REPLACE FUNCTION lokadb._retry(what text, attempt integer, p_retries integer, p_lock_timeout_ms integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF attempt > p_retries THEN
		RAISE EXCEPTION 'could not lock % within % ms after % attempts', what, p_lock_timeout_ms, attempt
			USING ERRCODE = 'lock_not_available',
			      HINT = 'Long transactions on the table hold its locks; retry later or raise lock_retries.';
	END IF;
	RAISE NOTICE 'could not lock % within % ms, retrying (retry %/%)', what, p_lock_timeout_ms, attempt, p_retries;
	PERFORM pg_sleep(random() * least(0.02 * attempt, 0.2));	-- jitter: writers may be periodic
END $$;

-- ====================================================================
-- foreign keys that point at LokaDB tables -> trigger checks
-- ====================================================================

-- On the referencing table: the referenced key must exist (MATCH SIMPLE:
-- rows with a NULL in the key are not checked; the WHEN clause skips them).
CREATE OR REPLACE FUNCTION lokadb.fk_child() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	f lokadb.fkeys;
	cond text;
	found_one integer;
	vals text;
BEGIN
	IF current_setting('lokadb.mover', true) = 'on' THEN
		RETURN NULL;
	END IF;
	SELECT * INTO f FROM lokadb.fkeys WHERE id = TG_ARGV[0]::bigint;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	SELECT string_agg(format('t.%I = ($1).%I', f.to_cols[i], f.from_cols[i]), ' AND ')
	  INTO cond FROM generate_subscripts(f.from_cols, 1) i;
	EXECUTE format('SELECT 1 FROM %s t WHERE %s LIMIT 1 FOR KEY SHARE', lokadb._q(f.to_rel), cond)
	   INTO found_one USING NEW;
	IF found_one IS NULL THEN
		SELECT string_agg(to_jsonb(NEW) ->> c, ', ' ORDER BY o) INTO vals
		  FROM unnest(f.from_cols) WITH ORDINALITY u(c, o);
		RAISE EXCEPTION 'insert or update on table "%" violates foreign key constraint "%"',
			(SELECT relname FROM pg_class WHERE oid = f.from_rel), f.conname
			USING ERRCODE = 'foreign_key_violation',
			      DETAIL = format('Key (%s)=(%s) is not present in table "%s".',
					      array_to_string(f.from_cols, ', '), vals,
					      (SELECT relname FROM pg_class WHERE oid = f.to_rel)),
			      TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, CONSTRAINT = f.conname;
	END IF;
	RETURN NULL;
END $$;

-- On the referenced LokaDB table: a deleted key, or a changed one, is acted
-- on as the foreign key said (NO ACTION / RESTRICT: refuse while referenced;
-- CASCADE; SET NULL; SET DEFAULT). A key that still exists after the
-- statement (a row that moved to another partition) is left alone.
CREATE OR REPLACE FUNCTION lokadb.fk_parent() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	f lokadb.fkeys;
	same text;
	refcond text;
	setlist text;
	act "char";
	hit integer;
	vals text;
BEGIN
	IF current_setting('lokadb.mover', true) = 'on' THEN
		RETURN NULL;
	END IF;
	SELECT * INTO f FROM lokadb.fkeys WHERE id = TG_ARGV[0]::bigint;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	SELECT string_agg(format('t.%I = ($1).%I', c, c), ' AND ') INTO same FROM unnest(f.to_cols) c;
	EXECUTE format('SELECT 1 FROM %s t WHERE %s LIMIT 1', lokadb._q(f.to_rel), same) INTO hit USING OLD;
	IF hit IS NOT NULL THEN
		RETURN NULL;
	END IF;
	SELECT string_agg(format('r.%I = ($1).%I', f.from_cols[i], f.to_cols[i]), ' AND ')
	  INTO refcond FROM generate_subscripts(f.from_cols, 1) i;
	act := CASE WHEN TG_OP = 'DELETE' THEN f.on_delete ELSE f.on_update END;
	IF act IN ('a', 'r') THEN
		EXECUTE format('SELECT 1 FROM %s r WHERE %s LIMIT 1 FOR KEY SHARE', lokadb._q(f.from_rel), refcond)
		   INTO hit USING OLD;
		IF hit IS NOT NULL THEN
			SELECT string_agg(to_jsonb(OLD) ->> c, ', ' ORDER BY o) INTO vals
			  FROM unnest(f.to_cols) WITH ORDINALITY u(c, o);
			RAISE EXCEPTION 'update or delete on table "%" violates foreign key constraint "%" on table "%"',
				(SELECT relname FROM pg_class WHERE oid = f.to_rel), f.conname, (SELECT relname FROM pg_class WHERE oid = f.from_rel)
				USING ERRCODE = 'foreign_key_violation',
				      DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".',
						      array_to_string(f.to_cols, ', '), vals,
						      (SELECT relname FROM pg_class WHERE oid = f.from_rel)),
				      TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA, CONSTRAINT = f.conname;
		END IF;
		RETURN NULL;
	END IF;
	IF act = 'c' AND TG_OP = 'DELETE' THEN
		EXECUTE format('DELETE FROM %s r WHERE %s', lokadb._q(f.from_rel), refcond) USING OLD;
		RETURN NULL;
	END IF;
	SELECT string_agg(format('%I = %s', f.from_cols[i],
				 CASE act WHEN 'c' THEN format('($2).%I', f.to_cols[i]) WHEN 'n' THEN 'NULL' ELSE 'DEFAULT' END),
			  ', ')
	  INTO setlist FROM generate_subscripts(f.from_cols, 1) i;
	EXECUTE format('UPDATE %s r SET %s WHERE %s', lokadb._q(f.from_rel), setlist, refcond) USING OLD, NEW;
	RETURN NULL;
END $$;

-- Create the trigger checks of lokadb.fkeys row `fk` (idempotent): on the
-- referencing table (side 'child'), on the referenced one ('parent'), or both.
-- Each side locks only its own table.
CREATE OR REPLACE FUNCTION lokadb._fk_triggers(fk bigint, side text DEFAULT 'both') RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	f lokadb.fkeys;
	defer text;
	nn_cond text;
	changed_from text;
	changed_to text;
BEGIN
	SELECT * INTO STRICT f FROM lokadb.fkeys WHERE id = fk;
	defer := CASE WHEN NOT f.is_deferrable THEN 'NOT DEFERRABLE'
		      WHEN f.is_deferred THEN 'DEFERRABLE INITIALLY DEFERRED' ELSE 'DEFERRABLE INITIALLY IMMEDIATE' END;
	SELECT string_agg(format('NEW.%I IS NOT NULL', c), ' AND '),
	       format('(%s) IS DISTINCT FROM (%s)', string_agg(format('OLD.%I', c), ', '), string_agg(format('NEW.%I', c), ', '))
	  INTO nn_cond, changed_from FROM unnest(f.from_cols) c;
	SELECT format('(%s) IS DISTINCT FROM (%s)', string_agg(format('OLD.%I', c), ', '), string_agg(format('NEW.%I', c), ', '))
	  INTO changed_to FROM unnest(f.to_cols) c;
	IF array_length(f.from_cols, 1) = 1 THEN	-- a one-column row constructor is not a row
		changed_from := format('OLD.%I IS DISTINCT FROM NEW.%I', f.from_cols[1], f.from_cols[1]);
		changed_to := format('OLD.%I IS DISTINCT FROM NEW.%I', f.to_cols[1], f.to_cols[1]);
	END IF;
	IF side IN ('child', 'both') THEN
		PERFORM lokadb._drop_trigger(lokadb._q(f.from_rel), 'lokadb_fk' || fk || '_ins');
		PERFORM lokadb._drop_trigger(lokadb._q(f.from_rel), 'lokadb_fk' || fk || '_upd');
		EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT ON %s %s FOR EACH ROW WHEN (%s) '
			       'EXECUTE FUNCTION lokadb.fk_child(%L)',
			       'lokadb_fk' || fk || '_ins', lokadb._q(f.from_rel), defer, nn_cond, fk);
		EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER UPDATE OF %s ON %s %s FOR EACH ROW WHEN (%s AND %s) '
			       'EXECUTE FUNCTION lokadb.fk_child(%L)',
			       'lokadb_fk' || fk || '_upd', (SELECT string_agg(quote_ident(c), ', ') FROM unnest(f.from_cols) c),
			       lokadb._q(f.from_rel), defer, nn_cond, changed_from, fk);
	END IF;
	IF side NOT IN ('parent', 'both') THEN
		RETURN;
	END IF;
	PERFORM lokadb._drop_trigger(lokadb._q(f.to_rel), 'lokadb_fk' || fk || '_del');
	PERFORM lokadb._drop_trigger(lokadb._q(f.to_rel), 'lokadb_fk' || fk || '_key');
	EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER DELETE ON %s %s FOR EACH ROW '
		       'EXECUTE FUNCTION lokadb.fk_parent(%L)',
		       'lokadb_fk' || fk || '_del', lokadb._q(f.to_rel),
		       CASE WHEN f.on_delete IN ('a') THEN defer ELSE 'NOT DEFERRABLE' END, fk);
	EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER UPDATE OF %s ON %s %s FOR EACH ROW WHEN (%s) '
		       'EXECUTE FUNCTION lokadb.fk_parent(%L)',
		       'lokadb_fk' || fk || '_key', (SELECT string_agg(quote_ident(c), ', ') FROM unnest(f.to_cols) c),
		       lokadb._q(f.to_rel), CASE WHEN f.on_update IN ('a') THEN defer ELSE 'NOT DEFERRABLE' END,
		       changed_to, fk);
END $$;

CREATE OR REPLACE FUNCTION lokadb._fk_drop_triggers(fk bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	f lokadb.fkeys;
BEGIN
	SELECT * INTO STRICT f FROM lokadb.fkeys WHERE id = fk;
	IF to_regclass(lokadb._q(f.from_rel)) IS NOT NULL THEN
		PERFORM lokadb._drop_trigger(lokadb._q(f.from_rel), 'lokadb_fk' || fk || '_ins');
		PERFORM lokadb._drop_trigger(lokadb._q(f.from_rel), 'lokadb_fk' || fk || '_upd');
	END IF;
	IF to_regclass(lokadb._q(f.to_rel)) IS NOT NULL THEN
		PERFORM lokadb._drop_trigger(lokadb._q(f.to_rel), 'lokadb_fk' || fk || '_del');
		PERFORM lokadb._drop_trigger(lokadb._q(f.to_rel), 'lokadb_fk' || fk || '_key');
	END IF;
END $$;

-- the text of a FOREIGN KEY constraint (for ALTER TABLE ... ADD CONSTRAINT name <text>)
CREATE OR REPLACE FUNCTION lokadb._fk_def(from_cols name[], to_rel oid, to_cols name[], upd "char", del "char",
	dfr boolean, dfd boolean) RETURNS text LANGUAGE sql STABLE AS $$
	SELECT format('FOREIGN KEY (%s) REFERENCES %s (%s) ON UPDATE %s ON DELETE %s %s',
		      (SELECT string_agg(quote_ident(c), ', ') FROM unnest(from_cols) c), lokadb._q(to_rel),
		      (SELECT string_agg(quote_ident(c), ', ') FROM unnest(to_cols) c),
		      CASE upd WHEN 'r' THEN 'RESTRICT' WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'd' THEN 'SET DEFAULT' ELSE 'NO ACTION' END,
		      CASE del WHEN 'r' THEN 'RESTRICT' WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'd' THEN 'SET DEFAULT' ELSE 'NO ACTION' END,
		      CASE WHEN NOT dfr THEN 'NOT DEFERRABLE' WHEN dfd THEN 'DEFERRABLE INITIALLY DEFERRED'
			   ELSE 'DEFERRABLE INITIALLY IMMEDIATE' END)
$$;

-- ENABLE TABLE: every foreign key pointing at `old` (the table being
-- enabled, already renamed to its DEFAULT partition name) becomes trigger
-- checks between the referencing table and `parent`; triggers of foreign
-- keys `old` itself held as the referencing side move to `parent`.
CREATE OR REPLACE FUNCTION lokadb._fk_convert(old oid, parent oid) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
	c record;
	fk bigint;
	n integer := 0;
BEGIN
	FOR c IN SELECT k.oid, k.conname, k.conrelid, k.confupdtype, k.confdeltype, k.condeferrable, k.condeferred,
			(SELECT array_agg(a.attname ORDER BY o) FROM unnest(k.conkey) WITH ORDINALITY u(n, o)
			 JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n) AS from_cols,
			(SELECT array_agg(a.attname ORDER BY o) FROM unnest(k.confkey) WITH ORDINALITY u(n, o)
			 JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n) AS to_cols,
			k.confmatchtype
		 FROM pg_constraint k
		 WHERE k.contype = 'f' AND k.confrelid = old AND k.conparentid = 0
		 ORDER BY k.conname LOOP
		INSERT INTO lokadb.fkeys (conname, from_rel, from_cols, to_rel, to_cols, on_update, on_delete,
					  is_deferrable, is_deferred, definition)
		VALUES (c.conname, CASE WHEN c.conrelid = old THEN parent ELSE lokadb._top(c.conrelid) END,
			c.from_cols, parent, c.to_cols, c.confupdtype, c.confdeltype, c.condeferrable, c.condeferred,
			lokadb._fk_def(c.from_cols, parent, c.to_cols, c.confupdtype, c.confdeltype, c.condeferrable, c.condeferred))
		RETURNING id INTO fk;
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', lokadb._q(c.conrelid), c.conname);
		PERFORM lokadb._fk_triggers(fk);
		n := n + 1;
	END LOOP;
	FOR fk IN SELECT id FROM lokadb.fkeys WHERE from_rel = old LOOP
		PERFORM lokadb._drop_trigger(lokadb._q(old), 'lokadb_fk' || fk || '_ins');
		PERFORM lokadb._drop_trigger(lokadb._q(old), 'lokadb_fk' || fk || '_upd');
		UPDATE lokadb.fkeys SET from_rel = parent WHERE id = fk;
		PERFORM lokadb._fk_triggers(fk, 'child');
	END LOOP;
	RETURN n;
END $$;

-- ====================================================================
-- ENABLE TABLE
-- ====================================================================

-- Everything that makes `rel` impossible to enable, as errors.
CREATE OR REPLACE FUNCTION lokadb._enable_check(rel oid, col name) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	c pg_class;
	a pg_attribute;
	nsp name;
	what text;
BEGIN
	SELECT * INTO STRICT c FROM pg_class WHERE oid = rel;
	SELECT nspname INTO nsp FROM pg_namespace WHERE oid = c.relnamespace;
	IF EXISTS (SELECT 1 FROM lokadb.tables WHERE schema_name = nsp AND table_name = c.relname) THEN
		RAISE EXCEPTION 'table %.% is already a LokaDB table', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'duplicate_table';
	END IF;
	IF EXISTS (SELECT 1 FROM lokadb.tables WHERE schema_name = nsp AND default_part = c.relname)
	   OR EXISTS (SELECT 1 FROM lokadb.partitions WHERE schema_name = nsp AND c.relname IN (container, leaf)) THEN
		RAISE EXCEPTION 'table %.% is a partition of a LokaDB table', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'wrong_object_type';
	END IF;
	IF c.relkind <> 'r' THEN
		RAISE EXCEPTION '%.% is not a plain table', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'wrong_object_type',
			      HINT = 'ENABLE TABLE turns a plain table into a partitioned one; partitioned tables, views and foreign tables are not supported.';
	END IF;
	IF c.relpersistence = 't' THEN
		RAISE EXCEPTION 'cannot enable temporary table %', c.relname USING ERRCODE = 'feature_not_supported';
	END IF;
	IF c.relispartition OR EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = rel OR inhparent = rel) THEN
		RAISE EXCEPTION 'cannot enable %.%: it has inheritance parents or children', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'feature_not_supported';
	END IF;
	IF c.relrowsecurity OR c.relhasrules THEN
		RAISE EXCEPTION 'cannot enable %.%: row level security and rules are not supported', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'feature_not_supported';
	END IF;
	SELECT * INTO a FROM pg_attribute WHERE attrelid = rel AND attname = col AND attnum > 0 AND NOT attisdropped;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'column "%" of relation "%" does not exist', col, c.relname
			USING ERRCODE = 'undefined_column',
			      HINT = 'Name the organization column with ENABLE TABLE name BY column, or set [plugin.move] org_column.';
	END IF;
	IF a.attgenerated <> '' THEN
		RAISE EXCEPTION 'the organization column "%" cannot be a generated column', col USING ERRCODE = 'feature_not_supported';
	END IF;
	SELECT string_agg(DISTINCT format('%s %s', CASE v.relkind WHEN 'm' THEN 'materialized view' ELSE 'view' END, lokadb._q(v.oid)), ', ')
	  INTO what
	  FROM pg_depend d JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
	  JOIN pg_class v ON v.oid = r.ev_class
	 WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = rel AND r.ev_class <> rel AND v.relkind <> 'v';
	IF what IS NULL THEN
		SELECT string_agg(DISTINCT format('function %s', d.objid::regprocedure), ', ') INTO what
		  FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_class'::regclass AND d.refobjid = rel;
	END IF;
	IF what IS NOT NULL THEN
		RAISE EXCEPTION 'cannot enable %.%: other objects depend on it', quote_ident(nsp), quote_ident(c.relname)
			USING ERRCODE = 'dependent_objects_still_exist', DETAIL = what || ' would keep reading the DEFAULT partition only.',
			      HINT = 'Drop them and create them again after ENABLE TABLE (plain views are handled).';
	END IF;
	SELECT string_agg(format('%s on %s', k.conname, lokadb._q(k.conrelid)), ', ') INTO what
	  FROM pg_constraint k WHERE k.contype = 'f' AND k.confrelid = rel AND k.conparentid = 0
	   AND (k.confmatchtype = 'f' OR k.confdelsetcols IS NOT NULL);
	IF what IS NOT NULL THEN
		RAISE EXCEPTION 'cannot enable %.%: foreign keys with MATCH FULL or ON DELETE SET NULL (columns) point at it',
			quote_ident(nsp), quote_ident(c.relname) USING ERRCODE = 'feature_not_supported', DETAIL = what;
	END IF;
END $$;

-- The swap, one short transaction (the caller retries it on lock timeouts):
-- a partitioned twin is built beside the table, then under ACCESS EXCLUSIVE
-- the table becomes its DEFAULT partition and the twin takes its name.
-- Returns the OID of the new partitioned table.
CREATE OR REPLACE FUNCTION lokadb._enable_swap(rel oid, col name, p_lock_timeout_ms integer) RETURNS oid
LANGUAGE plpgsql AS $$
DECLARE
	nsp name;
	tname name;
	owner name;
	qold text;
	twin oid;
	defname text;
	tmpname text;
	prefix text;
	i record;
	a record;
	view_oids oid[];
	view_opts text[];
	view_defs text[];
	seqst record;
	oldseq oid;
	newseq oid;
	seqname name;
BEGIN
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	SELECT n.nspname, c.relname, pg_get_userbyid(c.relowner) INTO nsp, tname, owner
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel;
	qold := lokadb._q(rel);
	defname := lokadb._name(tname, '_default');
	tmpname := lokadb._name(tname, '_lokadb_new');
	IF to_regclass(format('%I.%I', nsp, defname)) IS NOT NULL THEN
		RAISE EXCEPTION 'cannot name the DEFAULT partition of %: relation %.% already exists', qold,
			quote_ident(nsp), quote_ident(defname) USING ERRCODE = 'duplicate_table';
	END IF;
	EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED '
		       'INCLUDING IDENTITY INCLUDING COMMENTS INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY LIST (%I)',
		       nsp, tmpname, qold, col);
	twin := to_regclass(format('%I.%I', nsp, tmpname));
	EXECUTE format('ALTER TABLE %s OWNER TO %I', lokadb._q(twin), owner);
	-- the non-unique indexes go on the parent (matched, not rebuilt, at ATTACH);
	-- unique ones and the primary key stay on the leaf
	FOR i IN SELECT x.indexrelid, ic.relname, lokadb._def('index', x.indexrelid) AS def
		 FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
		 WHERE x.indrelid = rel AND NOT x.indisunique AND NOT x.indisexclusion AND x.indisvalid LOOP
		prefix := format('CREATE INDEX %s ON %s USING ', quote_ident(i.relname), qold);
		IF left(i.def, length(prefix)) <> prefix THEN
			RAISE EXCEPTION 'unexpected definition of index %: %', i.relname, i.def;
		END IF;
		EXECUTE format('CREATE INDEX %I ON %s USING ', lokadb._name(i.relname, '_p'), lokadb._q(twin))
			|| substr(i.def, length(prefix) + 1);
	END LOOP;

	EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', qold);

	SELECT array_agg(w.view), array_agg(w.opts), array_agg(w.def) INTO view_oids, view_opts, view_defs
	  FROM lokadb._views_of(rel) w;
	-- identity columns: the parent's identity takes over (same value, same
	-- sequence name, same grants); the leaf draws from it by default
	FOR a IN SELECT attname FROM pg_attribute WHERE attrelid = rel AND attidentity <> '' AND NOT attisdropped LOOP
		oldseq := pg_get_serial_sequence(qold, a.attname)::regclass;
		newseq := pg_get_serial_sequence(lokadb._q(twin), a.attname)::regclass;
		SELECT relname INTO seqname FROM pg_class WHERE oid = oldseq;
		EXECUTE format('SELECT last_value, is_called FROM %s', lokadb._q(oldseq)) INTO seqst;
		PERFORM setval(newseq, seqst.last_value, seqst.is_called);
		PERFORM lokadb.copy_acl(oldseq, newseq);
		EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', qold, a.attname);
		EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT nextval(%L::regclass)', qold, a.attname,
			       lokadb._q(newseq));
		EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', lokadb._q(newseq), seqname);
	END LOOP;
	EXECUTE format('ALTER TABLE %s RENAME TO %I', qold, defname);
	EXECUTE format('ALTER TABLE %s RENAME TO %I', lokadb._q(twin), tname);
	EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s DEFAULT', lokadb._q(twin), lokadb._q(rel));
	PERFORM lokadb.copy_acl(rel, twin);
	EXECUTE format('COMMENT ON TABLE %s IS %L', lokadb._q(twin), obj_description(rel, 'pg_class'));
	PERFORM lokadb._replace_views(view_oids, view_opts, view_defs);
	PERFORM lokadb._fk_convert(rel, twin);
	INSERT INTO lokadb.tables (schema_name, table_name, org_column, org_type, default_part)
	SELECT nsp, tname, col, format_type(atttypid, atttypmod), defname
	  FROM pg_attribute WHERE attrelid = twin AND attname = col;
	RETURN twin;
END $$;

CREATE OR REPLACE PROCEDURE lokadb.enable_table(p_name text, p_column text, p_lock_timeout_ms integer DEFAULT 100,
	p_retries integer DEFAULT 100,
	INOUT schema_name name DEFAULT NULL, INOUT table_name name DEFAULT NULL, INOUT org_column name DEFAULT NULL,
	INOUT org_type text DEFAULT NULL, INOUT default_partition name DEFAULT NULL, INOUT isolated_orgs integer DEFAULT NULL)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	rel oid;
	col name;
	parent oid;
	attempt integer := 0;
	o record;
	t lokadb.tables;
	n bigint;
BEGIN
	rel := lokadb.resolve_table(p_name);
	col := (parse_ident(p_column))[1];
	PERFORM lokadb._enable_check(rel, col);
	PERFORM lokadb._busy(rel);
	LOOP
		BEGIN
			parent := lokadb._enable_swap(rel, col, p_lock_timeout_ms);
			EXIT;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			attempt := attempt + 1;
			PERFORM lokadb._retry(lokadb._q(rel), attempt, p_retries, p_lock_timeout_ms);
		END;
	END LOOP;
	COMMIT;
	PERFORM lokadb._busy(parent);
	isolated_orgs := 0;
	-- organizations with their own partition get it in this table too
	FOR o IN SELECT id FROM lokadb.orgs WHERE isolated OR state = 'isolating' ORDER BY id LOOP
		CALL lokadb._isolate_table(parent, o.id, p_lock_timeout_ms, p_retries, n);
		isolated_orgs := isolated_orgs + 1;
	END LOOP;
	t := lokadb._table_row(parent);
	schema_name := t.schema_name;
	table_name := t.table_name;
	org_column := t.org_column;
	org_type := t.org_type;
	default_partition := t.default_part;
	PERFORM pg_advisory_unlock_all();
END $$;

-- ====================================================================
-- DISABLE TABLE
-- ====================================================================

CREATE OR REPLACE FUNCTION lokadb._disable_swap(rel oid, p_lock_timeout_ms integer) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
	t lokadb.tables;
	def oid;
	qt text;
	tmpname text;
	a record;
	view_oids oid[];
	view_opts text[];
	view_defs text[];
	f lokadb.fkeys;
	leaf oid;
	seqst record;
	seq oid;
	newseq oid;
	seqname name;
	seqs text[] := '{}';
	restored text[] := '{}';
	k record;
BEGIN
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	t := lokadb._table_row(rel);
	def := to_regclass(format('%I.%I', t.schema_name, t.default_part));
	qt := lokadb._q(rel);
	EXECUTE format('LOCK TABLE %s, %s IN ACCESS EXCLUSIVE MODE', qt, lokadb._q(def));
	IF (SELECT count(*) FROM pg_inherits WHERE inhparent = rel) <> 1 THEN
		RAISE EXCEPTION 'table % has partitions other than its DEFAULT partition', qt
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	SELECT array_agg(w.view), array_agg(w.opts), array_agg(w.def) INTO view_oids, view_opts, view_defs
	  FROM lokadb._views_of(rel) w;
	-- identity: remember the parent's sequence state, give the leaf its own identity after DETACH
	EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', qt, lokadb._q(def));
	FOR a IN SELECT attname, attidentity FROM pg_attribute WHERE attrelid = rel AND attidentity <> '' AND NOT attisdropped LOOP
		seq := pg_get_serial_sequence(qt, a.attname)::regclass;
		SELECT relname INTO seqname FROM pg_class WHERE oid = seq;
		EXECUTE format('SELECT last_value, is_called FROM %s', lokadb._q(seq)) INTO seqst;
		SELECT * INTO k FROM pg_sequence WHERE seqrelid = seq;
		EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', lokadb._q(def), a.attname);
		EXECUTE format('ALTER TABLE %s ALTER COLUMN %I ADD GENERATED %s AS IDENTITY (INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s)',
			       lokadb._q(def), a.attname, CASE a.attidentity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END,
			       k.seqincrement, k.seqmin, k.seqmax, k.seqstart, k.seqcache,
			       CASE WHEN k.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END);
		newseq := pg_get_serial_sequence(lokadb._q(def), a.attname)::regclass;
		PERFORM setval(newseq, seqst.last_value, seqst.is_called);
		PERFORM lokadb.copy_acl(seq, newseq);
		seqs := seqs || ARRAY[lokadb._q(newseq), seqname::text];
	END LOOP;
	-- checks LokaDB added on the DEFAULT partition
	FOR k IN SELECT conname FROM pg_constraint WHERE conrelid = def AND contype = 'c' AND conname LIKE 'lokadb\_not\_%' LOOP
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', lokadb._q(def), k.conname);
	END LOOP;
	tmpname := lokadb._name(t.table_name, '_lokadb_old');
	EXECUTE format('ALTER TABLE %s RENAME TO %I', qt, tmpname);
	EXECUTE format('ALTER TABLE %s RENAME TO %I', lokadb._q(def), t.table_name);
	PERFORM lokadb.copy_acl(rel, def);
	EXECUTE format('COMMENT ON TABLE %s IS %L', lokadb._q(def), obj_description(rel, 'pg_class'));
	PERFORM lokadb._replace_views(view_oids, view_opts, view_defs);
	-- foreign keys that pointed at the table become constraints again (NOT
	-- VALID here, validated by the caller after COMMIT), on every leaf of the
	-- referencing table
	FOR f IN SELECT * FROM lokadb.fkeys WHERE to_rel = rel ORDER BY id LOOP
		PERFORM lokadb._fk_drop_triggers(f.id);
		FOR leaf IN SELECT lokadb._leaves(CASE WHEN f.from_rel = rel THEN def ELSE f.from_rel END) LOOP
			EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s NOT VALID', lokadb._q(leaf), f.conname, f.definition);
			restored := restored || format('ALTER TABLE %s VALIDATE CONSTRAINT %I', lokadb._q(leaf), f.conname);
		END LOOP;
		DELETE FROM lokadb.fkeys WHERE id = f.id;
	END LOOP;
	-- trigger checks the table held as the referencing side move to the plain table
	FOR f IN SELECT * FROM lokadb.fkeys WHERE from_rel = rel ORDER BY id LOOP
		PERFORM lokadb._drop_trigger(lokadb._q(rel), 'lokadb_fk' || f.id || '_ins');
		PERFORM lokadb._drop_trigger(lokadb._q(rel), 'lokadb_fk' || f.id || '_upd');
		UPDATE lokadb.fkeys SET from_rel = def WHERE id = f.id;
		PERFORM lokadb._fk_triggers(f.id, 'child');
	END LOOP;
	EXECUTE format('DROP TABLE %s', lokadb._q(rel));
	FOR i IN 1 .. coalesce(array_length(seqs, 1), 0) / 2 LOOP
		EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', seqs[2 * i - 1], seqs[2 * i]);
	END LOOP;
	DELETE FROM lokadb.tables WHERE schema_name = t.schema_name AND table_name = t.table_name;
	RETURN restored;
END $$;

CREATE OR REPLACE PROCEDURE lokadb.disable_table(p_name text, p_lock_timeout_ms integer DEFAULT 100,
	p_retries integer DEFAULT 100, INOUT schema_name name DEFAULT NULL, INOUT table_name name DEFAULT NULL,
	INOUT foreign_keys integer DEFAULT NULL)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	rel oid;
	t lokadb.tables;
	orgs text;
	attempt integer := 0;
	restored text[];
	stmt text;
BEGIN
	rel := lokadb.resolve_table(p_name);
	t := lokadb._table_row(rel);
	IF t.table_name IS NULL THEN
		RAISE EXCEPTION 'table % is not a LokaDB table', lokadb._q(rel) USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	SELECT string_agg(format('"%s"', org_id), ', ' ORDER BY org_id) INTO orgs FROM lokadb.partitions
	 WHERE partitions.schema_name = t.schema_name AND partitions.table_name = t.table_name;
	IF orgs IS NOT NULL THEN
		RAISE EXCEPTION 'table % has organizations with their own partition: %', lokadb._q(rel), orgs
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'DISABLE TABLE works only while every organization is in the DEFAULT partition.';
	END IF;
	PERFORM lokadb._busy(rel);
	schema_name := t.schema_name;
	table_name := t.table_name;
	LOOP
		BEGIN
			restored := lokadb._disable_swap(rel, p_lock_timeout_ms);
			EXIT;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			attempt := attempt + 1;
			PERFORM lokadb._retry(lokadb._q(rel), attempt, p_retries, p_lock_timeout_ms);
		END;
	END LOOP;
	COMMIT;
	foreign_keys := coalesce(array_length(restored, 1), 0);
	FOREACH stmt IN ARRAY restored LOOP
		EXECUTE stmt;
		COMMIT;
	END LOOP;
	PERFORM pg_advisory_unlock_all();
END $$;

-- ====================================================================
-- ISOLATE ORG
-- ====================================================================
--
-- Per LokaDB table T (DEFAULT partition D, organization column c) and
-- organization X (literal x):
--   1. prepare (short transaction): container C = T_o<X> (PARTITION BY LIST
--      (c)) holding the empty leaf L = T_o<X>_1 (CHECK (c = x), D's indexes,
--      constraints, defaults and foreign keys), not attached to T; a capture
--      table lokadb.capture_<T oid>_<X> and three row triggers on D that log
--      X's changes (WHEN c = x: other organizations pay only the test);
--   2. copy X's rows from D into L (no lock anyone waits on);
--   3. replay the captured changes into L in rounds (REPEATABLE READ);
--   4. final transaction, retried on lock timeouts:
--        DELETE X's rows from D (other organizations go on; X's readers
--          still see the rows, X's writers of those rows wait),
--        LOCK T, D IN EXCLUSIVE MODE (writers wait, readers go on),
--        replay the last captured changes, DELETE X's rows that arrived
--          meanwhile, ADD CHECK (c <> x) NOT VALID on D and make it valid
--          (a superuser marks it valid: D holds no row of X by construction;
--          otherwise VALIDATE scans D), ATTACH C FOR VALUES IN (x) (no scan:
--          the CHECKs prove it), drop the capture, record the partition;
--        COMMIT: X's rows are in L from then on, atomically for readers.
-- A table without a key (primary key or unique NOT NULL index) skips 1-3:
-- its copy runs inside the final transaction.

CREATE OR REPLACE FUNCTION lokadb.capture() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF current_setting('lokadb.mover', true) = 'on' THEN
		RETURN NULL;
	END IF;
	IF TG_OP = 'DELETE' THEN
		EXECUTE format('INSERT INTO lokadb.%I (op, r) VALUES (''D'', $1)', TG_ARGV[0]) USING OLD;
	ELSE
		IF TG_OP = 'UPDATE' THEN	-- the old key goes away (harmless when it is the same key)
			EXECUTE format('INSERT INTO lokadb.%I (op, r) VALUES (''D'', $1)', TG_ARGV[0]) USING OLD;
		END IF;
		EXECUTE format('INSERT INTO lokadb.%I (op, r) VALUES (''I'', $1)', TG_ARGV[0]) USING NEW;
	END IF;
	RETURN NULL;
END $$;

-- the names ISOLATE ORG uses for (table, organization)
CREATE OR REPLACE FUNCTION lokadb._iso_names(rel oid, org text,
	OUT d oid, OUT col name, OUT lit text, OUT container text, OUT leaf text, OUT capture text,
	OUT not_check text, OUT only_check text, OUT trig text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
	t lokadb.tables;
	k text := lokadb._orgkey(org);
BEGIN
	t := lokadb._table_row(rel);
	d := to_regclass(format('%I.%I', t.schema_name, t.default_part));
	col := t.org_column;
	lit := format('%L::%s', org, t.org_type);
	container := lokadb._name(t.table_name, '_o' || k);
	leaf := lokadb._name(t.table_name, '_o' || k || '_1');
	capture := lokadb._name(format('capture_%s_', rel), k);
	not_check := lokadb._name('lokadb_not_o', k);
	only_check := lokadb._name('lokadb_only_o', k);
	trig := lokadb._name('lokadb_capture_o', k);
END $$;

-- Remove what an interrupted ISOLATE ORG of (rel, org) left behind: the
-- container and leaf if not attached, the capture triggers and table.
CREATE OR REPLACE FUNCTION lokadb._isolate_cleanup(rel oid, org text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	x record;
	t lokadb.tables;
	c oid;
BEGIN
	x := lokadb._iso_names(rel, org);
	t := lokadb._table_row(rel);
	c := to_regclass(format('%I.%I', t.schema_name, x.container));
	IF c IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = c) THEN
		EXECUTE format('DROP TABLE %s CASCADE', lokadb._q(c));
	END IF;
	IF x.d IS NOT NULL THEN
		PERFORM lokadb._drop_trigger(lokadb._q(x.d), x.trig || '_i');
		PERFORM lokadb._drop_trigger(lokadb._q(x.d), x.trig || '_u');
		PERFORM lokadb._drop_trigger(lokadb._q(x.d), x.trig || '_d');
	END IF;
	IF to_regclass(format('lokadb.%I', x.capture)) IS NOT NULL THEN
		EXECUTE format('DROP TABLE lokadb.%I', x.capture);
	END IF;
END $$;

-- Phase 1. Returns the key columns (NULL: no key, no capture).
CREATE OR REPLACE FUNCTION lokadb._isolate_prepare(rel oid, org text, p_lock_timeout_ms integer) RETURNS name[]
LANGUAGE plpgsql AS $$
DECLARE
	x record;
	t lokadb.tables;
	nsp name;
	qc text;
	ql text;
	keys name[];
	k record;
	owner name;
BEGIN
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	x := lokadb._iso_names(rel, org);
	t := lokadb._table_row(rel);
	nsp := t.schema_name;
	qc := format('%I.%I', nsp, x.container);
	ql := format('%I.%I', nsp, x.leaf);
	SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = rel;
	PERFORM lokadb._isolate_cleanup(rel, org);
	IF to_regclass(ql) IS NOT NULL THEN
		RAISE EXCEPTION 'cannot create the partition of organization "%" in %: relation % already exists',
			org, lokadb._q(rel), ql USING ERRCODE = 'duplicate_table';
	END IF;
	EXECUTE format('CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED '
		       'INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING COMMENTS) PARTITION BY LIST (%I)',
		       qc, lokadb._q(x.d), x.col);
	EXECUTE format('CREATE TABLE %s (LIKE %s INCLUDING ALL)', ql, lokadb._q(x.d));
	FOR k IN SELECT conrelid, conname FROM pg_constraint
		 WHERE conrelid IN (to_regclass(qc), to_regclass(ql)) AND contype = 'c' AND conname LIKE 'lokadb\_not\_%' LOOP
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', lokadb._q(k.conrelid), k.conname);
	END LOOP;
	EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%I = %s)', ql, x.only_check, x.col, x.lit);
	EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN (%s)', qc, ql, x.lit);
	EXECUTE format('ALTER TABLE %s OWNER TO %I', qc, owner);
	EXECUTE format('ALTER TABLE %s OWNER TO %I', ql, owner);
	PERFORM lokadb.copy_acl(rel, to_regclass(qc));
	PERFORM lokadb.copy_acl(rel, to_regclass(ql));
	-- foreign keys of D (to cloud tables: none points at a LokaDB table)
	FOR k IN SELECT conname, lokadb._def('constraint', oid) AS def FROM pg_constraint
		 WHERE conrelid = x.d AND contype = 'f' ORDER BY conname LOOP
		EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', ql, k.conname, k.def);
	END LOOP;
	keys := lokadb._key_cols(x.d);
	IF keys IS NULL THEN
		RETURN NULL;
	END IF;
	EXECUTE format('CREATE UNLOGGED TABLE lokadb.%I (seq bigserial PRIMARY KEY, op "char" NOT NULL, r %s NOT NULL)',
		       x.capture, lokadb._q(x.d));
	EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW WHEN (NEW.%I = %s) '
		       'EXECUTE FUNCTION lokadb.capture(%L)', x.trig || '_i', lokadb._q(x.d), x.col, x.lit, x.capture);
	EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s FOR EACH ROW WHEN (OLD.%I = %s OR NEW.%I = %s) '
		       'EXECUTE FUNCTION lokadb.capture(%L)', x.trig || '_u', lokadb._q(x.d), x.col, x.lit, x.col, x.lit, x.capture);
	EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s FOR EACH ROW WHEN (OLD.%I = %s) '
		       'EXECUTE FUNCTION lokadb.capture(%L)', x.trig || '_d', lokadb._q(x.d), x.col, x.lit, x.capture);
	RETURN keys;
END $$;

-- The application's own row triggers of `src` (not LokaDB's, not clones from
-- a parent), made again on `dst`: their definitions with `ON <src>` replaced.
-- `qsrc` is src as _def writes it. A definition without it is skipped with a WARNING.
CREATE OR REPLACE FUNCTION lokadb._copy_own_triggers(src oid, qsrc text, dst text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	k record;
	prefix text := ' ON ' || qsrc || ' ';
BEGIN
	FOR k IN SELECT tgname, lokadb._def('trigger', oid) AS def FROM pg_trigger
		 WHERE tgrelid = src AND NOT tgisinternal AND tgparentid = 0 AND tgname NOT LIKE 'lokadb\_%' LOOP
		IF position(prefix IN k.def) = 0 THEN
			RAISE WARNING 'trigger % on % not copied to %: unexpected definition', k.tgname, qsrc, dst;
			CONTINUE;
		END IF;
		EXECUTE overlay(k.def PLACING ' ON ' || dst || ' ' FROM position(prefix IN k.def) FOR length(prefix));
	END LOOP;
END $$;

-- Replay the captured changes visible now into the leaf: per key, the last
-- image wins (writers of one key are serialized by its row lock, so capture
-- order is commit order per key). The caller must give a stable view of the
-- capture table (REPEATABLE READ, or D locked against writers). Returns the
-- number of changes consumed.
CREATE OR REPLACE FUNCTION lokadb._isolate_apply(rel oid, org text, keys name[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	x record;
	t lokadb.tables;
	ql text;
	keylist text;
	keymatch text;
	n bigint;
BEGIN
	x := lokadb._iso_names(rel, org);
	t := lokadb._table_row(rel);
	ql := format('%I.%I', t.schema_name, x.leaf);
	SELECT string_agg(format('(r).%I', k), ', '), string_agg(format('l.%I = (c.r).%I', k, k), ' AND ')
	  INTO keylist, keymatch FROM unnest(keys) k;
	EXECUTE format('SELECT count(*) FROM lokadb.%I', x.capture) INTO n;
	IF n = 0 THEN
		RETURN 0;
	END IF;
	EXECUTE format('DELETE FROM %s l USING lokadb.%I c WHERE %s', ql, x.capture, keymatch);
	EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM (SELECT DISTINCT ON (%s) op, r FROM lokadb.%I '
		       'ORDER BY %s, seq DESC) c WHERE op <> ''D''',
		       ql, lokadb._ins_cols(x.d), lokadb._ins_cols(x.d, '(r).'), keylist, x.capture, keylist);
	EXECUTE format('DELETE FROM lokadb.%I', x.capture);
	RETURN n;
END $$;

-- Phase 4, one transaction (the caller retries it on lock timeouts).
CREATE OR REPLACE FUNCTION lokadb._isolate_final(rel oid, org text, keys name[], p_lock_timeout_ms integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	x record;
	t lokadb.tables;
	qd text;
	qc text;
	ql text;
	su boolean;
	k record;
BEGIN
	x := lokadb._iso_names(rel, org);
	t := lokadb._table_row(rel);
	qd := lokadb._q(x.d);
	qc := format('%I.%I', t.schema_name, x.container);
	ql := format('%I.%I', t.schema_name, x.leaf);
	SELECT rolsuper INTO su FROM pg_roles WHERE rolname = current_user;
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	-- our own deletes must not fire the capture, LokaDB's foreign key checks
	-- (the rows do not go away, they move) nor, for a superuser, any trigger
	PERFORM set_config('lokadb.mover', 'on', true);
	IF su THEN
		PERFORM set_config('session_replication_role', 'replica', true);
	END IF;
	IF keys IS NOT NULL THEN
		EXECUTE format('DELETE FROM ONLY %s WHERE %I = %s', qd, x.col, x.lit);
	END IF;
	EXECUTE format('LOCK TABLE %s, %s IN EXCLUSIVE MODE', lokadb._q(rel), qd);
	IF keys IS NOT NULL THEN
		PERFORM lokadb._isolate_apply(rel, org, keys);
	ELSE
		EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM ONLY %s WHERE %I = %s', ql, lokadb._ins_cols(x.d),
			       lokadb._ins_cols(x.d), qd, x.col, x.lit);
	END IF;
	EXECUTE format('DELETE FROM ONLY %s WHERE %I = %s', qd, x.col, x.lit);
	EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%I <> %s) NOT VALID', qd, x.not_check, x.col, x.lit);
	IF su THEN
		-- D holds no row of X: we deleted them all while no one else could write to D
		UPDATE pg_constraint SET convalidated = true WHERE conrelid = x.d AND conname = x.not_check;
		UPDATE pg_class SET relhasrules = relhasrules WHERE oid = x.d;	-- relcache invalidation
	ELSE
		EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', qd, x.not_check);
	END IF;
	EXECUTE format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN (%s)', lokadb._q(rel), qc, x.lit);
	-- the table's own row triggers (on D since before ENABLE) apply to the leaf too
	PERFORM lokadb._copy_own_triggers(x.d, qd, ql);
	PERFORM lokadb._drop_trigger(qd, x.trig || '_i');
	PERFORM lokadb._drop_trigger(qd, x.trig || '_u');
	PERFORM lokadb._drop_trigger(qd, x.trig || '_d');
	IF to_regclass(format('lokadb.%I', x.capture)) IS NOT NULL THEN
		EXECUTE format('DROP TABLE lokadb.%I', x.capture);
	END IF;
	INSERT INTO lokadb.partitions (schema_name, table_name, org_id, container, leaf)
	VALUES (t.schema_name, t.table_name, org, x.container, x.leaf);
END $$;

-- One table, every phase; COMMITs between phases. n: rows now in the leaf.
CREATE OR REPLACE PROCEDURE lokadb._isolate_table(rel oid, org text, p_lock_timeout_ms integer, p_retries integer,
	INOUT n bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	t lokadb.tables;
	keys name[];
	attempt integer := 0;
	rounds integer := 0;
	applied bigint;
	x record;
BEGIN
	t := lokadb._table_row(rel);
	n := 0;
	IF EXISTS (SELECT 1 FROM lokadb.partitions p WHERE p.schema_name = t.schema_name AND p.table_name = t.table_name
		   AND p.org_id = org) THEN
		RETURN;
	END IF;
	PERFORM lokadb._busy(rel);
	x := lokadb._iso_names(rel, org);
	LOOP
		BEGIN
			keys := lokadb._isolate_prepare(rel, org, p_lock_timeout_ms);
			EXIT;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			attempt := attempt + 1;
			PERFORM lokadb._retry(lokadb._q(x.d), attempt, p_retries, p_lock_timeout_ms);
		END;
	END LOOP;
	COMMIT;
	IF keys IS NOT NULL THEN
		EXECUTE format('INSERT INTO %I.%I (%s) SELECT %s FROM ONLY %s WHERE %I = %s', t.schema_name, x.leaf,
			       lokadb._ins_cols(x.d), lokadb._ins_cols(x.d), lokadb._q(x.d), x.col, x.lit);
		COMMIT;
		LOOP
			-- SET TRANSACTION must be the first statement of the transaction the
			-- COMMIT below starts: nothing (not even the loop's arithmetic) may run
			-- between that COMMIT and it
			SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
			applied := lokadb._isolate_apply(rel, org, keys);
			rounds := rounds + 1;
			EXIT WHEN applied < 100 OR rounds >= 20;
			COMMIT;
		END LOOP;
		COMMIT;
	END IF;
	attempt := 0;
	LOOP
		BEGIN
			PERFORM lokadb._isolate_final(rel, org, keys, p_lock_timeout_ms);
			EXIT;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			attempt := attempt + 1;
			PERFORM lokadb._retry(lokadb._q(rel), attempt, p_retries, p_lock_timeout_ms);
		END;
	END LOOP;
	COMMIT;
	EXECUTE format('SELECT count(*) FROM %I.%I', t.schema_name, x.leaf) INTO n;
	RAISE NOTICE '%.%: organization "%" now in %.% (% rows)', quote_ident(t.schema_name), quote_ident(t.table_name),
		org, quote_ident(t.schema_name), quote_ident(x.leaf), n;
END $$;

CREATE OR REPLACE PROCEDURE lokadb.isolate_org(p_org text, p_lock_timeout_ms integer DEFAULT 100,
	p_retries integer DEFAULT 100, INOUT org_id text DEFAULT NULL, INOUT tables integer DEFAULT NULL,
	INOUT rows_moved bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	o lokadb.orgs;
	t record;
	n bigint;
	missing integer;
BEGIN
	SELECT * INTO o FROM lokadb.orgs WHERE id = p_org;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'organization "%" does not exist', p_org USING ERRCODE = 'undefined_object',
			HINT = 'Register it first with ADD ORG.';
	END IF;
	IF o.state NOT IN ('cloud', 'isolating') THEN
		RAISE EXCEPTION 'organization "%" is %', p_org, o.state USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	SELECT count(*) INTO missing FROM lokadb.tables lt WHERE NOT EXISTS (SELECT 1 FROM lokadb.partitions p
		WHERE p.schema_name = lt.schema_name AND p.table_name = lt.table_name AND p.org_id = p_org);
	IF o.isolated AND missing = 0 THEN
		RAISE EXCEPTION 'organization "%" is already isolated', p_org USING ERRCODE = 'duplicate_object';
	END IF;
	PERFORM lokadb._org_busy(p_org);
	org_id := p_org;
	tables := 0;
	rows_moved := 0;
	UPDATE lokadb.orgs SET state = 'isolating', updated_at = now() WHERE id = p_org AND state <> 'isolating';
	COMMIT;
	FOR t IN SELECT schema_name, table_name FROM lokadb.tables ORDER BY schema_name, table_name LOOP
		CALL lokadb._isolate_table(to_regclass(format('%I.%I', t.schema_name, t.table_name)), p_org,
					   p_lock_timeout_ms, p_retries, n);
		tables := tables + 1;
		rows_moved := rows_moved + n;
	END LOOP;
	UPDATE lokadb.orgs SET isolated = true, state = 'cloud', updated_at = now() WHERE id = p_org;
	COMMIT;
	PERFORM pg_advisory_unlock_all();
END $$;

-- After a failed ISOLATE ORG: back to 'cloud' (partitions already made stay;
-- running ISOLATE ORG again finishes the others) and no capture left behind.
-- Does nothing while another session runs ISOLATE ORG of that organization.
CREATE OR REPLACE PROCEDURE lokadb.isolate_abort(p_org text) LANGUAGE plpgsql AS $$
DECLARE
	t record;
BEGIN
	IF NOT pg_try_advisory_lock(19532, hashtext(p_org)) THEN
		RETURN;
	END IF;
	FOR t IN SELECT schema_name, table_name FROM lokadb.tables LOOP
		IF NOT EXISTS (SELECT 1 FROM lokadb.partitions p WHERE p.schema_name = t.schema_name
			       AND p.table_name = t.table_name AND p.org_id = p_org) THEN
			PERFORM lokadb._isolate_cleanup(to_regclass(format('%I.%I', t.schema_name, t.table_name)), p_org);
		END IF;
	END LOOP;
	UPDATE lokadb.orgs SET state = 'cloud', updated_at = now() WHERE id = p_org AND state = 'isolating';
	PERFORM pg_advisory_unlock(19532, hashtext(p_org));
END $$;

-- ====================================================================
-- ADD ORG, SHOW TABLES, SHOW ORGS
-- ====================================================================

CREATE OR REPLACE FUNCTION lokadb.add_org(p_id text, p_name text, OUT id text, OUT name text)
LANGUAGE plpgsql AS $$
DECLARE
	t record;
BEGIN
	IF p_id IS NULL OR p_id = '' THEN
		RAISE EXCEPTION 'an organization id cannot be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- the id must be a value of every LokaDB table's organization column
	FOR t IN SELECT DISTINCT org_type FROM lokadb.tables LOOP
		BEGIN
			EXECUTE format('SELECT %L::%s', p_id, t.org_type);
		EXCEPTION WHEN data_exception THEN
			RAISE EXCEPTION 'organization id "%" is not a valid %', p_id, t.org_type
				USING ERRCODE = 'invalid_text_representation';
		END;
	END LOOP;
	INSERT INTO lokadb.orgs (id, name) VALUES (p_id, p_name);
	id := p_id;
	name := p_name;
EXCEPTION WHEN unique_violation THEN
	RAISE EXCEPTION 'organization "%" already exists', p_id USING ERRCODE = 'duplicate_object';
END $$;

-- rows of `org` in the relation `rel` (a DEFAULT partition), from its statistics
CREATE OR REPLACE FUNCTION lokadb._org_rows_in(rel oid, col name, org text) RETURNS double precision
LANGUAGE sql STABLE AS $$
	SELECT CASE WHEN c.reltuples < 0 OR s.attname IS NULL THEN NULL
		    WHEN array_position(s.most_common_vals::text::text[], org) IS NOT NULL
		    THEN c.reltuples * s.most_common_freqs[array_position(s.most_common_vals::text::text[], org)]
		    ELSE c.reltuples * greatest(1 - s.null_frac - coalesce((SELECT sum(f) FROM unnest(s.most_common_freqs) f), 0), 0)
			 / greatest(CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * c.reltuples ELSE s.n_distinct END
				    - coalesce(array_length(s.most_common_vals::text::text[], 1), 0), 1) END
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = col
	WHERE c.oid = rel
$$;

DROP FUNCTION IF EXISTS lokadb.show_tables();	-- its columns grew (kept_on_parent)
CREATE FUNCTION lokadb.show_tables() RETURNS TABLE (schema text, "table" text, org_column text,
	org_type text, default_partition text, partitions bigint, rows_estimate bigint, kept_on_parent text)
LANGUAGE sql STABLE AS $$
	SELECT t.schema_name, t.table_name, t.org_column, t.org_type, t.default_part,
	       (SELECT count(*) FROM lokadb.partitions p WHERE p.schema_name = t.schema_name AND p.table_name = t.table_name),
	       (SELECT sum(c.reltuples) FILTER (WHERE c.reltuples >= 0)::bigint
		FROM pg_partition_tree(to_regclass(format('%I.%I', t.schema_name, t.table_name))) p
		JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf),
	       -- what org_routing keeps on the parent (lokadb.table_guard)
	       CASE WHEN g.g LIKE '%r%' THEN 'all'
		    WHEN g.g LIKE '%a%' THEN 'all (partition privileges differ)'
		    ELSE nullif(concat_ws(',', CASE WHEN g.g LIKE '%i%' THEN 'INSERT' END,
					  CASE WHEN g.g LIKE '%u%' THEN 'UPDATE' END,
					  CASE WHEN g.g LIKE '%d%' THEN 'DELETE' END), '') END
	FROM lokadb.tables t, LATERAL (SELECT lokadb.table_guard(t.schema_name, t.table_name) AS g) g
	WHERE to_regclass(format('%I.%I', t.schema_name, t.table_name)) IS NOT NULL
	ORDER BY 1, 2
$$;

CREATE OR REPLACE FUNCTION lokadb.show_orgs() RETURNS TABLE (id text, name text, state text, site text,
	profile text, partitions bigint, rows_estimate bigint, last_analyze timestamptz)
LANGUAGE sql STABLE AS $$
	WITH homes AS (		-- where each organization's rows of each table are
		SELECT o.id AS org, t.org_column AS col, p.leaf IS NOT NULL AS own,
		       to_regclass(format('%I.%I', t.schema_name, coalesce(p.leaf, t.default_part))) AS rel
		FROM lokadb.orgs o CROSS JOIN lokadb.tables t
		LEFT JOIN lokadb.partitions p ON p.org_id = o.id AND p.schema_name = t.schema_name AND p.table_name = t.table_name
	), est AS (
		SELECT h.org,
		       sum(CASE WHEN h.own THEN nullif(greatest(c.reltuples, -1), -1) ELSE lokadb._org_rows_in(h.rel, h.col, h.org) END) AS n,
		       min(greatest(s.last_analyze, s.last_autoanalyze)) AS an
		FROM homes h JOIN pg_class c ON c.oid = h.rel LEFT JOIN pg_stat_all_tables s ON s.relid = h.rel
		GROUP BY h.org
	)
	SELECT o.id, o.name, o.state, o.site, o.profile,
	       (SELECT count(*) FROM lokadb.partitions p WHERE p.org_id = o.id),
	       round(e.n)::bigint, e.an
	FROM lokadb.orgs o LEFT JOIN est e ON e.org = o.id
	ORDER BY o.id
$$;

-- ====================================================================
-- sites: CREATE SITE, DROP SITE, SHOW SITES, MOVE ORG ... OFFLINE
-- ====================================================================
--
-- A site is a PostgreSQL database outside the cloud, reached through the
-- relay: the cloud lokadb has a [databases] entry per site (transport=tunnel),
-- and the site's postgres_fdw server in the cloud database points at that
-- lokadb listener. A site serves one organization at a time: its tables
-- have the cloud tables' names (so the organization's database looks like
-- the application's), and a foreign table shows every row of its remote
-- table.

-- the postgres_fdw server of a site
CREATE OR REPLACE FUNCTION lokadb._site_server(p_site text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT lokadb._name('lokadb_site_', p_site)
$$;

-- a libpq conninfo value, quoted
CREATE OR REPLACE FUNCTION lokadb._ci(v text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT '''' || replace(replace(v, '\', '\\'), '''', '\''') || ''''
$$;

-- an option of a foreign server or user mapping (options text[] of key=value)
CREATE OR REPLACE FUNCTION lokadb._opt(opts text[], key text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT substr(o, length(key) + 2) FROM unnest(opts) o WHERE o LIKE key || '=%' LIMIT 1
$$;

CREATE OR REPLACE FUNCTION lokadb.create_site(p_name text, p_database text, p_host text, p_port text,
	p_user text, p_password text, OUT site text, OUT server text, OUT host text, OUT port integer,
	OUT dbname text, OUT "user" text)
LANGUAGE plpgsql AS $$
DECLARE
	su boolean;
	opts text;
BEGIN
	IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9_]{1,40}$' THEN
		RAISE EXCEPTION 'invalid site name "%"', p_name USING ERRCODE = 'invalid_name',
			HINT = 'A site name is 1 to 40 letters, digits or underscores.';
	END IF;
	IF p_database IS NULL OR p_database = '' THEN
		RAISE EXCEPTION 'CREATE SITE needs DATABASE: the lokadb [databases] entry that reaches the site'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF p_port !~ '^[0-9]{1,5}$' OR p_port::integer NOT BETWEEN 1 AND 65535 THEN
		RAISE EXCEPTION 'invalid PORT "%"', p_port USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF EXISTS (SELECT 1 FROM lokadb.sites s WHERE s.name = p_name) THEN
		RAISE EXCEPTION 'site "%" already exists', p_name USING ERRCODE = 'duplicate_object';
	END IF;
	server := lokadb._site_server(p_name);
	IF EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname = server) THEN
		RAISE EXCEPTION 'foreign server "%" already exists', server USING ERRCODE = 'duplicate_object',
			HINT = 'Drop it (DROP SERVER ... CASCADE) or choose another site name.';
	END IF;
	CREATE EXTENSION IF NOT EXISTS postgres_fdw;
	EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, '
		       'fetch_size %L, batch_size %L, truncatable %L, connect_timeout %L, application_name %L)',
		       server, p_host, p_port, p_database, '1000', '100', 'false', '10', 'lokadb_fdw_' || p_name);
	SELECT rolsuper INTO su FROM pg_roles WHERE rolname = current_user;
	opts := format('user %L', coalesce(nullif(p_user, ''), current_user));
	IF p_password IS NOT NULL THEN
		opts := opts || format(', password %L', p_password);
	END IF;
	IF su THEN	-- lokadb's listener may not ask for a password (auth_type trust, hba)
		opts := opts || ', password_required ''false''';
	END IF;
	EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I OPTIONS (%s)', server, opts);
	INSERT INTO lokadb.sites (name, relay_key) VALUES (p_name, p_database);
	site := p_name;
	host := p_host;
	port := p_port::integer;
	dbname := p_database;
	"user" := coalesce(nullif(p_user, ''), current_user);
END $$;

CREATE OR REPLACE FUNCTION lokadb.drop_site(p_name text, OUT site text) LANGUAGE plpgsql AS $$
DECLARE
	used text;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM lokadb.sites s WHERE s.name = p_name) THEN
		RAISE EXCEPTION 'site "%" does not exist', p_name USING ERRCODE = 'undefined_object';
	END IF;
	SELECT string_agg(format('"%s" (%s)', o.id, o.state), ', ' ORDER BY o.id) INTO used
	  FROM lokadb.orgs o WHERE o.site = p_name;
	IF used IS NOT NULL THEN
		RAISE EXCEPTION 'site "%" is in use by organization %', p_name, used USING ERRCODE = 'object_in_use',
			HINT = 'A site can be dropped once no organization lives there.';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname = lokadb._site_server(p_name)) THEN
		EXECUTE format('DROP SERVER %I CASCADE', lokadb._site_server(p_name));
	END IF;
	DELETE FROM lokadb.sites s WHERE s.name = p_name;
	site := p_name;
END $$;

CREATE OR REPLACE FUNCTION lokadb.show_sites() RETURNS TABLE (name text, database text, host text, port integer,
	"user" text, server text, orgs text, created_at timestamptz)
LANGUAGE sql STABLE AS $$
	SELECT s.name, s.relay_key, lokadb._opt(f.srvoptions, 'host'), lokadb._opt(f.srvoptions, 'port')::integer,
	       lokadb._opt(u.umoptions, 'user'), f.srvname,
	       (SELECT string_agg(o.id, ',' ORDER BY o.id) FROM lokadb.orgs o WHERE o.site = s.name),
	       s.created_at
	FROM lokadb.sites s
	LEFT JOIN pg_foreign_server f ON f.srvname = lokadb._site_server(s.name)
	LEFT JOIN pg_user_mappings u ON u.srvid = f.oid AND u.umuser = 0
	ORDER BY s.name
$$;

-- The libpq conninfo of a site, from its foreign server and user mapping:
-- what the plugin uses to create the organization's tables there, the same
-- path postgres_fdw takes.
CREATE OR REPLACE FUNCTION lokadb._site_conninfo(p_site text) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
	srv text[];
	um text[];
	ci text := '';
	k text;
BEGIN
	SELECT f.srvoptions INTO srv FROM pg_foreign_server f WHERE f.srvname = lokadb._site_server(p_site);
	IF NOT FOUND THEN
		RAISE EXCEPTION 'site "%" has no foreign server %', p_site, lokadb._site_server(p_site)
			USING ERRCODE = 'undefined_object', HINT = 'DROP SITE and CREATE SITE it again.';
	END IF;
	SELECT m.umoptions INTO um FROM pg_user_mapping m JOIN pg_foreign_server f ON f.oid = m.umserver
	 WHERE f.srvname = lokadb._site_server(p_site) AND m.umuser = 0;
	FOREACH k IN ARRAY ARRAY['host', 'port', 'dbname', 'connect_timeout'] LOOP
		IF lokadb._opt(srv, k) IS NOT NULL THEN
			ci := ci || k || '=' || lokadb._ci(lokadb._opt(srv, k)) || ' ';
		END IF;
	END LOOP;
	FOREACH k IN ARRAY ARRAY['user', 'password'] LOOP
		IF lokadb._opt(um, k) IS NOT NULL THEN
			ci := ci || k || '=' || lokadb._ci(lokadb._opt(um, k)) || ' ';
		END IF;
	END LOOP;
	RETURN ci || 'application_name=' || lokadb._ci('lokadb_move_' || p_site);
END $$;

-- The DDL that creates the tables of an organization at a site, from the
-- cloud definitions of its leaf partitions: columns (types, NOT NULL,
-- collations, defaults except those drawing from cloud sequences: ids come
-- from the cloud, where the parent's defaults apply before routing; generated
-- columns), CHECK constraints (among them the organization's own), primary
-- key, unique constraints and the other indexes of the leaf. A table of that
-- name already at the site is dropped when empty (left by a failed move), else
-- the move fails.
CREATE OR REPLACE FUNCTION lokadb._site_ddl(p_org text) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
	t record;
	x record;
	lrel oid;
	qt text;
	cols text;
	ddl text := 'SET client_min_messages = warning;' || E'\n';
	k record;
BEGIN
	FOR t IN SELECT * FROM lokadb.tables ORDER BY schema_name, table_name LOOP
		x := lokadb._iso_names(to_regclass(format('%I.%I', t.schema_name, t.table_name)), p_org);
		lrel := to_regclass(format('%I.%I', t.schema_name, x.leaf));
		qt := format('%I.%I', t.schema_name, t.table_name);
		SELECT string_agg(format('%I %s%s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
				CASE WHEN a.attcollation <> 0 AND a.attcollation <> ty.typcollation
				     THEN ' COLLATE ' || (SELECT format('%I.%I', cn.nspname, co.collname) FROM pg_collation co
							  JOIN pg_namespace cn ON cn.oid = co.collnamespace WHERE co.oid = a.attcollation)
				     ELSE '' END,
				CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
				CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED'
				     WHEN d.adbin IS NOT NULL AND pg_get_expr(d.adbin, d.adrelid) !~ 'nextval\('
				     THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END), ', ' ORDER BY a.attnum)
		  INTO cols
		  FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
		  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		 WHERE a.attrelid = lrel AND a.attnum > 0 AND NOT a.attisdropped;
		ddl := ddl || format(E'DO $lokadb$ BEGIN\n  IF to_regclass(%L) IS NOT NULL THEN\n'
			'    IF EXISTS (SELECT 1 FROM %s) THEN\n'
			'      RAISE EXCEPTION %L USING ERRCODE = ''duplicate_table'';\n'
			'    END IF;\n    DROP TABLE %s;\n  END IF;\nEND $lokadb$;\n',
			qt, qt, format('relation %s already exists at the site and is not empty', qt), qt);
		-- (CREATE SCHEMA IF NOT EXISTS would need CREATE on the database)
		ddl := ddl || format(E'DO $lokadb$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %L) THEN '
			'CREATE SCHEMA %I; END IF; END $lokadb$;\nCREATE TABLE %s (%s);\n', t.schema_name, t.schema_name, qt, cols);
		FOR k IN SELECT c.conname, lokadb._def('constraint', c.oid) AS def FROM pg_constraint c
			 WHERE c.conrelid = lrel AND c.contype IN ('c', 'p', 'u') ORDER BY c.contype <> 'p', c.conname LOOP
			ddl := ddl || format(E'ALTER TABLE %s ADD %s%s;\n', qt,
				CASE WHEN k.def LIKE 'CHECK%' THEN format('CONSTRAINT %I ', k.conname) ELSE '' END, k.def);
		END LOOP;
		FOR k IN SELECT lokadb._def('index', i.indexrelid) AS def FROM pg_index i
			 WHERE i.indrelid = lrel AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid
								 AND c.conrelid = lrel)
			 ORDER BY i.indexrelid LOOP
			ddl := ddl || regexp_replace(k.def, '^CREATE (UNIQUE )?INDEX \S+ ON \S+ USING ',
						     'CREATE \1INDEX ON ' || replace(qt, '\', '\\') || ' USING ') || E';\n';
		END LOOP;
	END LOOP;
	RETURN ddl;
END $$;

-- What cleans the site after a failed move: its tables, when empty.
CREATE OR REPLACE FUNCTION lokadb._site_undo(p_org text) RETURNS text LANGUAGE sql STABLE AS $$
	SELECT 'SET client_min_messages = warning;' || E'\n' || string_agg(format(
		E'DO $lokadb$ BEGIN IF to_regclass(%L) IS NOT NULL AND NOT EXISTS (SELECT 1 FROM %s) THEN DROP TABLE %s; END IF; END $lokadb$;\n',
		format('%I.%I', t.schema_name, t.table_name), format('%I.%I', t.schema_name, t.table_name),
		format('%I.%I', t.schema_name, t.table_name)), '')
	FROM lokadb.tables t
$$;

-- MOVE, step 1: checks, the organization marked 'moving', and what the plugin
-- runs at the site. Holds the organization's advisory lock (session) until the
-- plugin's connection closes.
CREATE OR REPLACE FUNCTION lokadb.move_prepare(p_org text, p_site text, OUT conninfo text, OUT site_ddl text,
	OUT site_undo text)
LANGUAGE plpgsql AS $$
DECLARE
	o lokadb.orgs;
	other text;
	missing text;
BEGIN
	SELECT * INTO o FROM lokadb.orgs WHERE id = p_org;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'organization "%" does not exist', p_org USING ERRCODE = 'undefined_object';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM lokadb.sites WHERE name = p_site) THEN
		RAISE EXCEPTION 'site "%" does not exist', p_site USING ERRCODE = 'undefined_object',
			HINT = 'Create it with CREATE SITE.';
	END IF;
	IF o.state = 'moved' THEN
		RAISE EXCEPTION 'organization "%" is already moved (to site "%")', p_org, o.site
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF o.state NOT IN ('cloud', 'moving') THEN
		RAISE EXCEPTION 'organization "%" is %', p_org, o.state USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM lokadb.tables) THEN
		RAISE EXCEPTION 'there is no LokaDB table to move' USING ERRCODE = 'object_not_in_prerequisite_state',
			HINT = 'ENABLE TABLE the tables of the organizations first.';
	END IF;
	SELECT string_agg(format('%I.%I', t.schema_name, t.table_name), ', ') INTO missing FROM lokadb.tables t
	 WHERE NOT EXISTS (SELECT 1 FROM lokadb.partitions p WHERE p.schema_name = t.schema_name
			   AND p.table_name = t.table_name AND p.org_id = p_org);
	IF missing IS NOT NULL THEN
		RAISE EXCEPTION 'organization "%" has no partition of its own in %', p_org, missing
			USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Run ISOLATE ORG first.';
	END IF;
	SELECT string_agg(format('"%s"', id), ', ') INTO other FROM lokadb.orgs
	 WHERE site = p_site AND id <> p_org;
	IF other IS NOT NULL THEN
		RAISE EXCEPTION 'site "%" already serves organization %', p_site, other USING ERRCODE = 'object_in_use',
			HINT = 'A site serves one organization: create another site for this one.';
	END IF;
	PERFORM lokadb._org_busy(p_org);
	conninfo := lokadb._site_conninfo(p_site);
	site_ddl := lokadb._site_ddl(p_org);
	site_undo := lokadb._site_undo(p_org);
	UPDATE lokadb.orgs SET state = 'moving', updated_at = now() WHERE id = p_org AND state <> 'moving';
END $$;

-- MOVE, the switch: one transaction (the caller retries it on lock timeouts).
-- Returns the rows copied.
CREATE OR REPLACE FUNCTION lokadb._move_switch(p_org text, p_site text, p_lock_timeout_ms integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	t record;
	x record;
	rel oid;
	qc text;
	ql text;
	qold text;
	qt text;
	oldname text;
	owner name;
	su boolean;
	n bigint;
	total bigint := 0;
	c_cloud bigint;
	c_site bigint;
	c_other bigint;
	k record;
	fkid bigint;
	nn text;
	chg text;
	srv text := lokadb._site_server(p_site);
BEGIN
	SELECT rolsuper INTO su FROM pg_roles WHERE rolname = current_user;
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	-- the organization's writers (addressed to the leaf, or routed through the
	-- container) wait from here to COMMIT; readers wait at the DETACH
	FOR t IN SELECT * FROM lokadb.tables ORDER BY schema_name, table_name LOOP
		x := lokadb._iso_names(to_regclass(format('%I.%I', t.schema_name, t.table_name)), p_org);
		EXECUTE format('LOCK TABLE %I.%I, %I.%I IN ACCESS EXCLUSIVE MODE', t.schema_name, x.container,
			       t.schema_name, x.leaf);
	END LOOP;
	PERFORM set_config('lock_timeout', '0', true);
	-- our copy is no application write: LokaDB's checks and (superuser) the
	-- application's triggers do not fire for it
	PERFORM set_config('lokadb.mover', 'on', true);
	IF su THEN
		PERFORM set_config('session_replication_role', 'replica', true);
	END IF;
	PERFORM set_config('constraint_exclusion', 'on', true);
	FOR t IN SELECT * FROM lokadb.tables ORDER BY schema_name, table_name LOOP
		rel := to_regclass(format('%I.%I', t.schema_name, t.table_name));
		x := lokadb._iso_names(rel, p_org);
		qc := format('%I.%I', t.schema_name, x.container);
		ql := format('%I.%I', t.schema_name, x.leaf);
		qt := format('%I.%I', t.schema_name, t.table_name);
		IF (SELECT relkind FROM pg_class WHERE oid = to_regclass(ql)) <> 'r' THEN
			RAISE EXCEPTION '% is not a plain table', ql USING ERRCODE = 'wrong_object_type';
		END IF;
		SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = to_regclass(ql);
		oldname := lokadb._name(x.leaf, '_lokadb_old');
		qold := format('%I.%I', t.schema_name, oldname);
		EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', qc, ql);
		EXECUTE format('ALTER TABLE %s RENAME TO %I', ql, oldname);
		-- the foreign table takes the leaf's name: statements addressed to the
		-- leaf (org_routing), also those waiting on its lock now, reach the site
		EXECUTE format('CREATE FOREIGN TABLE %s PARTITION OF %s FOR VALUES IN (%s) SERVER %I '
			       'OPTIONS (schema_name %L, table_name %L)', ql, qc, x.lit, srv, t.schema_name, t.table_name);
		EXECUTE format('ALTER FOREIGN TABLE %s OWNER TO %I', ql, owner);
		PERFORM lokadb.copy_acl(to_regclass(qold), to_regclass(ql));
		-- the application's own row triggers on the leaf (the cloned ones come from the parent)
		PERFORM lokadb._copy_own_triggers(to_regclass(qold), qold, ql);
		-- the leaf's foreign keys to cloud tables (ISOLATE ORG gave it DEFAULT's): a foreign table
		-- takes none, so each becomes LokaDB's check -- a plain row trigger on the foreign table
		-- (it cannot have constraint triggers: checked at once, never deferred) and constraint
		-- triggers on the referenced table that look for the organization's rows at the site
		FOR k IN SELECT f.conname, f.confrelid, f.confupdtype, f.confdeltype, f.condeferrable, f.condeferred,
				(SELECT array_agg(a.attname ORDER BY o) FROM unnest(f.conkey) WITH ORDINALITY u(n, o)
				 JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = u.n) AS from_cols,
				(SELECT array_agg(a.attname ORDER BY o) FROM unnest(f.confkey) WITH ORDINALITY u(n, o)
				 JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = u.n) AS to_cols
			 FROM pg_constraint f WHERE f.conrelid = to_regclass(qold) AND f.contype = 'f' ORDER BY f.conname LOOP
			INSERT INTO lokadb.fkeys (conname, from_rel, from_cols, to_rel, to_cols, on_update, on_delete,
						  is_deferrable, is_deferred, definition)
			VALUES (k.conname, to_regclass(ql), k.from_cols, k.confrelid, k.to_cols, k.confupdtype, k.confdeltype,
				k.condeferrable, k.condeferred,
				lokadb._fk_def(k.from_cols, k.confrelid, k.to_cols, k.confupdtype, k.confdeltype,
					       k.condeferrable, k.condeferred))
			RETURNING id INTO fkid;
			SELECT string_agg(format('NEW.%I IS NOT NULL', c), ' AND '),
			       string_agg(format('OLD.%I IS DISTINCT FROM NEW.%I', c, c), ' OR ')
			  INTO nn, chg FROM unnest(k.from_cols) c;
			EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW WHEN (%s) '
				       'EXECUTE FUNCTION lokadb.fk_child(%L)', 'lokadb_fk' || fkid || '_ins', ql, nn, fkid);
			EXECUTE format('CREATE TRIGGER %I AFTER UPDATE OF %s ON %s FOR EACH ROW WHEN (%s AND (%s)) '
				       'EXECUTE FUNCTION lokadb.fk_child(%L)', 'lokadb_fk' || fkid || '_upd',
				       (SELECT string_agg(quote_ident(c), ', ') FROM unnest(k.from_cols) c), ql, nn, chg, fkid);
			PERFORM lokadb._fk_triggers(fkid, 'parent');
		END LOOP;
		EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM %s', ql, lokadb._ins_cols(to_regclass(qold)),
			       lokadb._ins_cols(to_regclass(qold)), qold);
		GET DIAGNOSTICS n = ROW_COUNT;
		-- verify: every row is at the site, and none of another organization
		EXECUTE format('SELECT count(*) FROM %s', qold) INTO c_cloud;
		EXECUTE format('SELECT count(*) FROM %s', ql) INTO c_site;
		EXECUTE format('SELECT count(*) FROM %s WHERE %I IS DISTINCT FROM %s', ql, x.col, x.lit) INTO c_other;
		IF c_site <> c_cloud OR n <> c_cloud OR c_other <> 0 THEN
			RAISE EXCEPTION 'verification failed for %: % rows in the cloud, % copied, % at the site, % of another organization',
				qt, c_cloud, n, c_site, c_other USING ERRCODE = 'data_corrupted';
		END IF;
		EXECUTE format('DROP TABLE %s', qold);
		-- and none is left in the cloud: no plain partition of the table holds the organization
		FOR k IN SELECT p.relid FROM pg_partition_tree(rel) p JOIN pg_class c ON c.oid = p.relid
			 WHERE p.isleaf AND c.relkind = 'r' LOOP
			EXECUTE format('SELECT count(*) FROM ONLY %s WHERE %I = %s', lokadb._q(k.relid), x.col, x.lit) INTO n;
			IF n <> 0 THEN
				RAISE EXCEPTION 'verification failed for %: % rows of organization "%" left in %', qt, n, p_org,
					lokadb._q(k.relid) USING ERRCODE = 'data_corrupted';
			END IF;
		END LOOP;
		RAISE NOTICE '%: % rows of organization "%" now at site "%"', qt, c_site, p_org, p_site;
		total := total + c_site;
	END LOOP;
	UPDATE lokadb.orgs SET state = 'moved', site = p_site,
	       profile = CASE WHEN (SELECT direct_conninfo FROM lokadb.sites WHERE name = p_site) IS NULL THEN 'fdw'
			      ELSE 'fdw+direct' END,
	       updated_at = now()
	 WHERE id = p_org;
	RETURN total;
END $$;

-- ANALYZE the foreign partitions of the moved organizations (autovacuum never
-- does); of one organization when p_org is given. A site that cannot be
-- reached gets a WARNING and the others are still analyzed. Returns how many
-- were analyzed.
CREATE OR REPLACE FUNCTION lokadb.analyze_sites(p_org text DEFAULT NULL) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
	r record;
	n integer := 0;
BEGIN
	FOR r IN SELECT c.oid, o.site FROM lokadb.partitions p JOIN lokadb.orgs o ON o.id = p.org_id
		 JOIN pg_namespace ns ON ns.nspname = p.schema_name
		 JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = p.leaf
		 WHERE c.relkind = 'f' AND (p_org IS NULL OR p.org_id = p_org) ORDER BY 1 LOOP
		BEGIN
			EXECUTE format('ANALYZE %s', lokadb._q(r.oid));
			n := n + 1;
		EXCEPTION WHEN OTHERS THEN
			RAISE WARNING 'could not analyze % (site "%"): %', lokadb._q(r.oid), r.site, SQLERRM;
		END;
	END LOOP;
	RETURN n;
END $$;

CREATE OR REPLACE PROCEDURE lokadb.move_org(p_org text, p_site text, p_lock_timeout_ms integer DEFAULT 100,
	p_retries integer DEFAULT 100, INOUT org_id text DEFAULT NULL, INOUT site text DEFAULT NULL,
	INOUT tables integer DEFAULT NULL, INOUT rows_moved bigint DEFAULT NULL)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	attempt integer := 0;
BEGIN
	PERFORM lokadb._org_busy(p_org);
	IF (SELECT state FROM lokadb.orgs WHERE id = p_org) IS DISTINCT FROM 'moving' THEN
		RAISE EXCEPTION 'organization "%" is not being moved', p_org USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	LOOP
		BEGIN
			rows_moved := lokadb._move_switch(p_org, p_site, p_lock_timeout_ms);
			EXIT;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			attempt := attempt + 1;
			PERFORM lokadb._retry(format('the partitions of organization "%s"', p_org), attempt, p_retries,
					      p_lock_timeout_ms);
		END;
	END LOOP;
	COMMIT;
	PERFORM lokadb.analyze_sites(p_org);
	COMMIT;
	org_id := p_org;
	site := p_site;
	tables := (SELECT count(*) FROM lokadb.tables);
	PERFORM pg_advisory_unlock_all();
END $$;

-- After a failed MOVE: the organization back to 'cloud' unless it was moved.
-- in_cloud: whether its rows are still served from the cloud (then the site's
-- empty tables may be dropped).
CREATE OR REPLACE FUNCTION lokadb.move_abort(p_org text, OUT in_cloud boolean) LANGUAGE plpgsql AS $$
BEGIN
	UPDATE lokadb.orgs SET state = 'cloud', updated_at = now() WHERE id = p_org AND state = 'moving';
	in_cloud := (SELECT state FROM lokadb.orgs WHERE id = p_org) IS DISTINCT FROM 'moved';
END $$;

-- Upgrades: routines of this file that an earlier version created and this
-- one did not (re)create in this transaction (a changed signature leaves the
-- old one behind) are dropped. Trigger functions are kept (triggers use them).
DO $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_proc p
		 WHERE p.pronamespace = 'lokadb'::regnamespace AND p.xmin <> pg_current_xact_id()::xid
		   AND p.prorettype <> 'trigger'::regtype
		   AND (p.proname LIKE '\_%' OR p.proname IN ('enable_table', 'disable_table', 'isolate_org',
			'isolate_abort', 'add_org', 'show_tables', 'show_orgs', 'resolve_table', 'table_key',
			'create_site', 'drop_site', 'show_sites', 'move_prepare', 'move_org', 'move_abort', 'analyze_sites')
			OR p.proname LIKE 'move\_api\_%') LOOP
		EXECUTE format('DROP %s %s', CASE WHEN r.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, r.sig);
	END LOOP;
END $$;
