-- query: classify_projection
SELECT id, ai_classify('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) AS tone FROM docs
-- query: classify_group_by
SELECT ai_classify('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) AS tone, count(*) AS n FROM docs GROUP BY 1
-- query: classify_in_where
SELECT id FROM docs WHERE ai_classify('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) = 'mixed'
-- query: classify_pair
SELECT c.id, e.id, ai_classify('How does the passage {1} relate to {0}?', c.text, e.passage, ['supports', 'refutes', 'unrelated'], ['Backs it', 'Contradicts it', 'Neither']) AS relation FROM claims c JOIN evidence e ON e.claim_id = c.id
-- query: classify_after_filter
SELECT id, ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS topic FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: classify_twice
SELECT id, ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS topic, ai_classify('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) AS tone FROM docs WHERE year < 2019
-- query: classify_in_case
SELECT id, CASE ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) WHEN 'price' THEN 1 ELSE 0 END AS is_price FROM docs
-- query: classify_order_by
SELECT id, ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS topic FROM docs ORDER BY topic, id
-- query: classify_claims
SELECT topic, ai_classify('Is {0} true?', text, ['true', 'false'], ['Correct', 'Incorrect']) AS verdict, count(*) FROM claims GROUP BY topic, verdict
