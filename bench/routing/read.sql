\set o random(1, :norgs)
\set id (:o - 1) * :per + random(1, :per)
SELECT organization_id, id, project_id, title, body, updated_at FROM documents WHERE organization_id = :o AND id = :id;
