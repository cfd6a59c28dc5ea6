-- query: exists_correlated
SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE e.claim_id = c.id AND ai_filter('Is the passage {0} convincing?', e.passage))
-- query: not_exists_correlated
SELECT c.id FROM claims c WHERE NOT EXISTS (SELECT 1 FROM evidence e WHERE e.claim_id = c.id AND ai_filter('Is the passage {0} convincing?', e.passage))
-- query: in_subquery
SELECT c.id FROM claims c WHERE c.id IN (SELECT e.claim_id FROM evidence e WHERE ai_filter('Is the passage {0} convincing?', e.passage))
-- query: not_in_subquery
SELECT c.id FROM claims c WHERE c.id NOT IN (SELECT e.claim_id FROM evidence e WHERE ai_filter('Is the passage {0} convincing?', e.passage))
-- query: subquery_in_from
SELECT x.id FROM (SELECT id, body FROM docs WHERE ai_filter('Is the review {0} positive?', body)) x WHERE x.id LIKE 'd1%'
-- query: scalar_subquery
SELECT (SELECT count(*) FROM docs WHERE ai_filter('Is the review {0} positive?', body)) AS positives
-- query: exists_uncorrelated_ai_outer
SELECT d.id FROM docs d WHERE ai_filter('Is the review {0} positive?', d.body) AND EXISTS (SELECT 1 FROM topics t WHERE t.id = 't1')
-- query: in_subquery_with_ai_outer
SELECT d.id FROM docs d WHERE d.lang IN (SELECT lang FROM docs WHERE year > 2020) AND ai_filter('Does {0} mention a product?', d.body)
-- query: exists_ai_outer
SELECT d.id FROM docs d WHERE EXISTS (SELECT 1 FROM topics t WHERE AI_FILTER(PROMPT('Does the review {0} discuss the aspect {1}?', d.body, t.description)))
-- equivalent:
SELECT d.id FROM docs d LEFT SEMI JOIN topics t ON AI_FILTER(PROMPT('Does the review {0} discuss the aspect {1}?', d.body, t.description))
-- query: not_exists_ai_outer
SELECT d.id FROM docs d WHERE NOT EXISTS (SELECT 1 FROM topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description))
-- equivalent:
SELECT d.id FROM docs d LEFT ANTI JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: in_ai_outer_inner_document_first
SELECT c.id FROM claims c WHERE c.id IN (SELECT e.claim_id FROM evidence e WHERE ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text))
-- equivalent:
SELECT DISTINCT c.id FROM claims c JOIN evidence e ON e.claim_id = c.id AND ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text)
-- query: not_in_ai_outer_with_nulls
SELECT d.id FROM docs d WHERE (CASE WHEN d.year > 2022 THEN NULL ELSE d.lang END) NOT IN (SELECT CASE WHEN t.id = 't3' THEN NULL WHEN t.id = 't1' THEN 'fr' ELSE t.name END FROM topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description))
-- equivalent:
WITH o AS (SELECT id, body, CASE WHEN year > 2022 THEN NULL ELSE lang END AS x FROM docs),
     s AS (SELECT description, CASE WHEN id = 't3' THEN NULL WHEN id = 't1' THEN 'fr' ELSE name END AS y FROM topics)
SELECT o.id FROM o LEFT ANTI JOIN s ON ai_join('Does the review {0} discuss the aspect {1}?', o.body, s.description) AND (o.x = s.y OR o.x IS NULL OR s.y IS NULL)
-- query: exists_ai_outer_with_other_correlated_conditions
SELECT c.id FROM claims c WHERE EXISTS (SELECT 1 FROM evidence e WHERE e.claim_id <> c.id AND c.topic <> 'tech' AND ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text))
-- equivalent:
SELECT c.id FROM claims c LEFT SEMI JOIN evidence e ON e.claim_id <> c.id AND c.topic <> 'tech' AND ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text)
-- query: scalar_count_ai_outer
SELECT d.id, (SELECT count(*) FROM topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)) AS aspects FROM docs d
-- equivalent:
SELECT d.id, count(t.id) AS aspects FROM docs d LEFT JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) GROUP BY d.id
-- query: scalar_count_ai_outer_with_key
SELECT c.id, (SELECT count(*) FROM evidence e WHERE e.claim_id = c.id AND ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text)) AS support FROM claims c
-- equivalent:
SELECT c.id, count(e.id) AS support FROM claims c LEFT JOIN evidence e ON e.claim_id = c.id AND ai_join('Does the passage {0} support the claim {1}?', e.passage, c.text) GROUP BY c.id
-- query: scalar_max_ai_outer_inner_document_first
SELECT t.id, (SELECT max(d.year) FROM docs d WHERE d.year > 2021 AND ai_join('Is the aspect {0} what the review {1} is about?', t.description, d.body)) AS latest FROM topics t
-- equivalent:
SELECT t.id, max(d.year) AS latest FROM topics t LEFT JOIN docs d ON d.year > 2021 AND ai_join('Is the aspect {0} what the review {1} is about?', t.description, d.body) GROUP BY t.id
-- query: scalar_count_ai_outer_in_where
SELECT d.id FROM docs d WHERE (SELECT count(*) FROM topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)) >= 3
-- equivalent:
SELECT d.id FROM docs d LEFT JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) GROUP BY d.id HAVING count(t.id) >= 3
-- query: exists_ai_outer_under_or
SELECT d.id FROM docs d WHERE d.year > 2022 OR EXISTS (SELECT 1 FROM topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description))
-- equivalent:
SELECT d.id FROM docs d WHERE d.year > 2022 UNION SELECT d.id FROM docs d LEFT SEMI JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: not_exists_ai_outer_under_or_inner_document_first
SELECT d.id FROM docs d WHERE d.lang = 'de' OR NOT EXISTS (SELECT 1 FROM topics t WHERE ai_join('Is the aspect {0} what the review {1} is about?', t.description, d.body))
-- equivalent:
SELECT d.id FROM docs d WHERE d.lang = 'de' UNION SELECT d.id FROM docs d LEFT ANTI JOIN topics t ON ai_join('Is the aspect {0} what the review {1} is about?', t.description, d.body)
