-- query: complete_projection
SELECT id, ai_complete('Summarise the review {0} in one sentence.', body) AS summary FROM docs
-- query: complete_max_tokens
SELECT id, ai_complete('Summarise the review {0} in one sentence.', body, 3) AS summary FROM docs WHERE year < 2019
-- query: complete_after_filter
SELECT id, ai_complete('Name the dish in {0}.', body, 8) AS dish FROM docs WHERE ai_filter('Is the review {0} about food?', body)
-- query: complete_limit
SELECT id, ai_complete('Summarise the review {0}.', body) AS summary FROM docs ORDER BY id LIMIT 3
-- query: complete_group_by
SELECT ai_complete('Which language is {0} in?', body, 2) AS language, count(*) AS n FROM docs GROUP BY 1
-- query: complete_pair
SELECT c.id, e.id, ai_complete('Explain how {1} bears on {0}.', c.text, e.passage, 16) AS why FROM claims c JOIN evidence e ON e.claim_id = c.id
-- query: complete_bigquery
SELECT id, AI.GENERATE(('Summarise the review ', body, ' in five words.')) AS summary FROM docs
-- query: complete_uppercase
SELECT id, AI_COMPLETE('Summarise the review {0}.', body, 4) AS summary FROM docs WHERE lang = 'en'
-- query: complete_in_where
SELECT id FROM docs WHERE length(ai_complete('Summarise the review {0}.', body, 4)) > 8
-- query: complete_concat
SELECT id, concat('[', ai_complete('Name the dish in {0}.', body, 2), ']') AS tagged FROM docs
-- query: complete_document_expression
SELECT id, ai_complete('Translate {0} to French.', concat(body, ' (', lang, ')'), 6) AS fr FROM docs
-- query: complete_null_document
SELECT id, ai_complete('Summarise the review {0}.', CASE WHEN lang = 'en' THEN body END, 4) AS summary FROM docs
-- query: complete_and_score
SELECT id, ai_complete('Summarise the review {0}.', body, 4) AS summary, ai_score('Is the review {0} positive?', body) AS s FROM docs ORDER BY s DESC, id LIMIT 6
-- query: complete_and_classify
SELECT ai_classify('What is the tone of {0}?', body, ['positive', 'negative', 'mixed'], ['Good overall', 'Bad overall', 'Both']) AS tone, ai_complete('Summarise the review {0}.', body, 3) AS summary FROM docs WHERE year >= 2020
-- query: complete_distinct
SELECT DISTINCT ai_complete('Which language is {0} in?', body, 1) AS language FROM docs
-- query: complete_cte
WITH summaries AS (SELECT id, year, ai_complete('Summarise the review {0}.', body, 4) AS summary FROM docs) SELECT year, count(DISTINCT summary) AS n FROM summaries GROUP BY year
-- query: complete_over_claims
SELECT topic, ai_complete('Rewrite {0} as a question.', text, 12) AS q FROM claims WHERE topic IS NOT NULL
-- query: complete_snowflake
SELECT id, AI_COMPLETE('tiny', PROMPT('Summarise the review {0} in one sentence.', body)) AS summary FROM docs
-- query: complete_two_lengths
SELECT id, ai_complete('Summarise the review {0}.', body, 2) AS short, ai_complete('Summarise the review {0}.', body, 7) AS long FROM docs
