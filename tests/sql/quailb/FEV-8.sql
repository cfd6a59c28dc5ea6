-- FEV-8 in SQL: a chain of three AI joins.
SELECT c1.id AS c1, e1.id AS e1, c2.id AS c2, e2.id AS e2
FROM claims c1
JOIN evidence e1 ON ai_join('Does the Wikipedia passage in DOCUMENT {1} support the claim in DOCUMENT {0}?', c1.claim, e1.text)
JOIN claims c2 ON ai_join('Does the Wikipedia passage in DOCUMENT {1} refute or contradict the claim in DOCUMENT {0}?', c2.claim, e1.text)
JOIN evidence e2 ON ai_join('Does the Wikipedia passage in DOCUMENT {1} support the claim in DOCUMENT {0}?', c2.claim, e2.text)
