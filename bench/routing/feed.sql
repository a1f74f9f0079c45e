\set o random(1, :norgs)
SELECT d.id, d.title, d.updated_at, p.name AS project FROM documents d JOIN projects p ON p.id = d.project_id WHERE d.organization_id = :o ORDER BY d.id DESC LIMIT 20;
