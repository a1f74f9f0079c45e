\set o random(1, :norgs)
\set d (:o - 1) * :per + random(1, :per)
INSERT INTO versions (organization_id, document_id, body) VALUES (:o, :d, 'edited');
