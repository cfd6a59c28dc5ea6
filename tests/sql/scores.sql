-- query: score_projection
SELECT id, ai_score('Is the review {0} positive?', body) AS s FROM docs
-- query: score_top_k
SELECT id FROM docs ORDER BY ai_score('Is the review {0} positive?', body) DESC, id LIMIT 5
-- query: score_in_where
SELECT id FROM docs WHERE ai_score('Is the review {0} about food?', body) > 0.5
-- query: score_with_cheap_predicate
SELECT id, ai_score('Is the review {0} positive?', body) AS s FROM docs WHERE year >= 2019 AND lang = 'en'
-- query: score_agrees_with_filter
SELECT id, ai_filter('Is the review {0} positive?', body) AS f, ai_score('Is the review {0} positive?', body) > 0.55 AS s FROM docs
-- query: score_after_filter
SELECT id, ai_score('Is the review {0} about food?', body) AS s FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: score_aggregates
SELECT year, avg(ai_score('Is the review {0} positive?', body)) AS mean, max(ai_score('Is the review {0} positive?', body)) AS best FROM docs GROUP BY year
-- query: score_pair
SELECT c.id, e.id, ai_score('Does the passage {1} support {0}?', c.text, e.passage) AS s FROM claims c JOIN evidence e ON e.claim_id = c.id
-- query: score_pair_top_k
SELECT c.id AS claim_id, e.id AS evidence_id FROM claims c JOIN evidence e ON e.claim_id = c.id ORDER BY ai_score('Does the passage {1} support {0}?', c.text, e.passage) DESC, claim_id, evidence_id LIMIT 4
-- query: score_filter_alias
SELECT id, ai_filter_score('Is the review {0} positive?', body) AS s FROM docs WHERE year < 2020
-- query: score_bigquery
SELECT id, AI.SCORE(('Is the review ', body, ' positive?')) AS s FROM docs
-- query: score_uppercase
SELECT id, AI_SCORE('Is the review {0} positive?', body) AS s FROM docs ORDER BY s DESC, id
-- query: score_null_document
SELECT id, ai_score('Is the review {0} positive?', CASE WHEN year > 2019 THEN body END) AS s FROM docs
-- query: score_case
SELECT id, CASE WHEN ai_score('Is the review {0} positive?', body) >= 0.7 THEN 'high' WHEN ai_score('Is the review {0} positive?', body) >= 0.3 THEN 'mid' ELSE 'low' END AS band FROM docs
-- query: score_in_subquery
SELECT id FROM docs WHERE year IN (SELECT year FROM docs WHERE ai_score('Is the review {0} about food?', body) > 0.8)
-- query: classify_scores_projection
SELECT id, ai_classify_scores('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) AS p FROM docs
-- query: classify_scores_first_label
SELECT id, ai_classify_scores('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', ''])[1]['probability'] AS p_price FROM docs
-- query: classify_scores_with_label
SELECT id, ai_classify('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS topic, ai_classify_scores('Which topic fits {0}?', body, ['price', 'quality', 'service'], ['', '', '']) AS p FROM docs WHERE year < 2019
-- query: classify_scores_entries
SELECT id, ai_classify_scores('Is {0} true?', text, ['true', 'false'], ['Correct', 'Incorrect'])[2]['label'] AS second, ai_classify_scores('Is {0} true?', text, ['true', 'false'], ['Correct', 'Incorrect'])[2]['probability'] AS p_false FROM claims
-- query: classify_scores_pair
SELECT c.id, e.id, ai_classify_scores('How does the passage {1} relate to {0}?', c.text, e.passage, ['supports', 'refutes', 'unrelated'], ['Backs it', 'Contradicts it', 'Neither']) AS p FROM claims c JOIN evidence e ON e.claim_id = c.id
