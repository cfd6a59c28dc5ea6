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
