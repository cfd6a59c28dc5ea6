-- query: quailb_join_on
SELECT d.id, t.name FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: join_where_style
SELECT d.id, t.name FROM docs d, topics t WHERE ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: snowflake_join
SELECT d.id, t.name FROM docs d JOIN topics t ON AI_FILTER(PROMPT('Does the review {0} discuss the aspect {1}?', d.body, t.description))
-- query: bigquery_join
SELECT d.id, t.name FROM docs d JOIN topics t ON AI.IF(('Does the review ', d.body, ' discuss the aspect ', t.description, '?'))
-- query: join_partner_first
SELECT d.id, t.name FROM docs d JOIN topics t ON ai_join('Is the aspect {0} covered by {1}?', t.description, d.body)
-- query: join_with_equality
SELECT c.id, e.id FROM claims c JOIN evidence e ON e.claim_id = c.id AND ai_join('Does the passage {1} support the claim {0}?', c.text, e.passage)
-- query: join_equality_in_where
SELECT c.id, e.id FROM claims c, evidence e WHERE e.claim_id = c.id AND ai_join('Does the passage {1} support the claim {0}?', c.text, e.passage)
-- query: join_with_side_filters
SELECT d.id, t.name FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) WHERE d.lang = 'en' AND t.id <> 't3'
-- query: join_then_filter
SELECT d.id, t.name FROM docs d JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) WHERE ai_filter('Is the review {0} positive?', d.body)
-- query: left_join
SELECT d.id, t.name FROM docs d LEFT JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: right_join
SELECT d.id, t.name FROM docs d RIGHT JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: full_join
SELECT c.id, e.id FROM claims c FULL JOIN evidence e ON e.claim_id = c.id AND ai_join('Does the passage {1} support the claim {0}?', c.text, e.passage)
-- query: left_join_right_condition
SELECT d.id, t.name FROM docs d LEFT JOIN topics t ON t.id IN ('t1', 't2') AND ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)
-- query: left_join_count
SELECT d.id, count(t.id) AS aspects FROM docs d LEFT JOIN topics t ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description) GROUP BY d.id
-- query: self_join
SELECT a.id, b.id FROM claims a JOIN claims b ON a.topic = b.topic AND a.id < b.id AND ai_join('Do {0} and {1} contradict each other?', a.text, b.text)
-- query: three_way
SELECT c.id, e.id, t.name FROM claims c JOIN evidence e ON e.claim_id = c.id JOIN topics t ON ai_join('Is the passage {0} about {1}?', e.passage, t.description)
-- query: pair_filter_on_joined_rows
SELECT c.id, e.id FROM claims c JOIN evidence e ON e.claim_id = c.id WHERE ai_filter('Does {0} agree with {1}?', e.passage, c.text)
