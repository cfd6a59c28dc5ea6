-- query: order_by_limit
SELECT id, score FROM docs WHERE ai_filter('Is the review {0} positive?', body) ORDER BY score DESC, id LIMIT 5
-- query: limit_without_order
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) LIMIT 3
-- query: distinct_langs
SELECT DISTINCT lang FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: order_by_ai_value
SELECT id FROM docs ORDER BY ai_filter('Is the review {0} positive?', body), id
-- query: limit_offset
SELECT id FROM docs WHERE ai_filter('Does {0} mention a product?', body) ORDER BY id LIMIT 4 OFFSET 2
-- query: limit_over_classify
SELECT id, ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS topic FROM docs LIMIT 4
-- query: top_per_join
SELECT d.id, t.name FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) ORDER BY d.id, t.name LIMIT 6
