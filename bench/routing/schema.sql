-- The routing cost benchmark's schema (bench/routing_cost.py), made in an
-- empty database after plugins/move/catalog.sql. Cloud tables: organizations,
-- projects. Tenant tables: documents, versions, LIST partitioned by
-- organization_id with a DEFAULT partition, as ENABLE TABLE leaves them: the
-- primary key on the leaves (and on DEFAULT), non-unique indexes on the parent.
-- Organizations get their own partitions later (routing_cost.py, as ISOLATE
-- ORG leaves them: a container <t>_o<id> PARTITION OF <t> FOR VALUES IN (id)
-- PARTITION BY LIST, holding the leaf <t>_o<id>_1).
CREATE TABLE organizations (
	id		bigint PRIMARY KEY,
	name		text NOT NULL
);
CREATE TABLE projects (
	id		bigint PRIMARY KEY,
	organization_id	bigint NOT NULL REFERENCES organizations,
	name		text NOT NULL
);
CREATE INDEX projects_organization_id_idx ON projects (organization_id);

CREATE TABLE documents (
	organization_id	bigint NOT NULL,
	id		bigserial NOT NULL,
	project_id	bigint NOT NULL,
	title		text NOT NULL,
	body		text NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now(),
	updated_at	timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (organization_id);
CREATE TABLE documents_default PARTITION OF documents (PRIMARY KEY (organization_id, id)) DEFAULT;

CREATE TABLE versions (
	organization_id	bigint NOT NULL,
	id		bigserial NOT NULL,
	document_id	bigint NOT NULL,
	body		text NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (organization_id);
CREATE TABLE versions_default PARTITION OF versions (PRIMARY KEY (organization_id, id)) DEFAULT;
CREATE INDEX versions_organization_id_document_id_idx ON versions (organization_id, document_id);

-- The catalog rows ENABLE TABLE writes (lokadb.orgs and lokadb.partitions are
-- written per layout by routing_cost.py, as ADD ORG and ISOLATE ORG would).
INSERT INTO lokadb.tables (schema_name, table_name, org_column, org_type, default_part) VALUES
	('public', 'documents', 'organization_id', 'bigint', 'documents_default'),
	('public', 'versions', 'organization_id', 'bigint', 'versions_default');
