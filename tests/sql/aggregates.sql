-- query: count_filtered
SELECT count(*) AS n FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: sum_case_ai
SELECT sum(CASE WHEN ai_filter('Is the review {0} positive?', body) THEN 1 ELSE 0 END) AS positives, count(*) AS total FROM docs
-- query: count_filter_clause
SELECT lang, count(*) FILTER (WHERE ai_filter('Is the review {0} positive?', body)) AS positives FROM docs GROUP BY lang
-- query: group_by_ai_predicate
SELECT ai_filter('Is the review {0} positive?', body) AS positive, avg(score) AS s, count(*) AS n FROM docs GROUP BY 1
-- query: having_over_ai_count
SELECT lang, count(*) AS n FROM docs WHERE ai_filter('Does {0} mention a product?', body) GROUP BY lang HAVING count(*) >= 1
-- query: min_max_over_filtered
SELECT min(year) AS first, max(year) AS last FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: count_distinct_joined
SELECT count(DISTINCT d.id) AS docs_with_aspects FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: per_topic_counts
SELECT t.name, count(*) AS n FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) GROUP BY t.name
