-- query: cte_filter
WITH pos AS (SELECT id, body FROM docs WHERE ai_filter('Is the review {0} positive?', body)) SELECT id FROM pos WHERE id <> 'd2'
-- query: cte_then_join
WITH pos AS (SELECT id, body FROM docs WHERE ai_filter('Is the review {0} positive?', body)) SELECT p.id, t.name FROM pos p JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', p.body, t.description)
-- query: two_ctes
WITH a AS (SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body)), b AS (SELECT id FROM docs WHERE ai_filter('Does {0} mention a product?', body)) SELECT a.id FROM a JOIN b ON a.id = b.id
-- query: union_all
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) UNION ALL SELECT id FROM claims WHERE ai_filter('Is the claim {0} true?', text)
-- query: union_distinct
SELECT lang AS k FROM docs WHERE ai_filter('Is the review {0} positive?', body) UNION SELECT topic FROM claims WHERE ai_filter('Is the claim {0} true?', text)
-- query: except
SELECT id FROM docs EXCEPT SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: intersect
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) INTERSECT SELECT id FROM docs WHERE ai_filter('Does {0} mention a product?', body)
-- query: case_when_ai
SELECT id, CASE WHEN ai_filter('Is the review {0} positive?', body) THEN 'good' WHEN score > 3 THEN 'fine' ELSE 'bad' END AS verdict FROM docs
-- query: case_in_where
SELECT id FROM docs WHERE CASE WHEN lang = 'en' THEN ai_filter('Is the review {0} positive?', body) ELSE score > 2 END
-- query: ai_in_projection_and_filter
SELECT id, ai_filter('Does {0} mention a product?', body) AS product FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: coalesce_over_ai
SELECT id, coalesce(ai_filter('Is the review {0} positive?', body), false) AS positive FROM docs
-- query: window_over_filtered
SELECT id, row_number() OVER (PARTITION BY lang ORDER BY id) AS rn FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: values_table
SELECT v.column1 FROM (VALUES ('a great day'), ('a terrible day'), ('an ordinary day')) v WHERE ai_filter('Is {0} happy?', v.column1)
