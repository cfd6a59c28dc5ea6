-- query: agg_whole_table
SELECT ai_agg('Summarise the reviews above in one sentence.', body) AS summary FROM docs
-- query: agg_group_by
SELECT year, ai_agg('What do these reviews have in common?', body) AS common FROM docs GROUP BY year
-- query: agg_with_count
SELECT lang, count(*) AS n, ai_agg('Summarise the reviews above.', body) AS summary FROM docs GROUP BY lang
-- query: agg_after_filter
SELECT year, ai_agg('List the dishes named above.', body) AS dishes FROM docs WHERE ai_filter('Is the review {0} about food?', body) GROUP BY year
-- query: agg_snowflake
SELECT lang, AI_AGG(body, 'Summarise the reviews above.') AS summary FROM docs GROUP BY lang
-- query: agg_summarize_snowflake
SELECT year, AI_SUMMARIZE_AGG(body) AS summary FROM docs GROUP BY year
-- query: agg_claims_by_topic
SELECT topic, ai_agg('Which claims above could be checked with numbers?', text) AS checkable FROM claims GROUP BY topic
-- query: agg_computed_column
SELECT year, ai_agg('Summarise the rows above.', concat(id, ': ', body)) AS summary FROM docs GROUP BY year
-- query: agg_having
SELECT year, ai_agg('Summarise the reviews above.', body) AS summary FROM docs GROUP BY year HAVING count(*) > 2
-- query: agg_order_limit
SELECT year, ai_agg('Summarise the reviews above.', body) AS summary FROM docs GROUP BY year ORDER BY year DESC LIMIT 3
-- query: agg_of_completions
WITH s AS (SELECT year, ai_complete('Name the dish in {0}.', body, 3) AS dish FROM docs) SELECT year, ai_agg('Which dishes come up most?', dish) AS dishes FROM s GROUP BY year
-- query: agg_nulls_only_group
SELECT lang, ai_agg('Summarise the reviews above.', CASE WHEN year > 2100 THEN body END) AS none FROM docs GROUP BY lang
-- query: agg_max_tokens
SELECT year, ai_agg('Summarise the reviews above.', body, 5) AS summary FROM docs GROUP BY year
