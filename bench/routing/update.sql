\set o random(1, :norgs)
\set id (:o - 1) * :per + random(1, :per)
UPDATE documents SET updated_at = now() WHERE organization_id = :o AND id = :id;
