-- query: quailb_filter
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body)
-- query: snowflake_filter
SELECT id FROM docs WHERE AI_FILTER(PROMPT('Is the review {0} positive?', body))
-- query: bigquery_filter
SELECT id FROM docs WHERE AI.IF(('Is the review ', body, ' positive?'))
-- query: filter_and_cheap
SELECT id, year FROM docs WHERE year >= 2019 AND ai_filter('Does {0} mention a product?', body)
-- query: cheap_after_ai_in_text
SELECT id FROM docs WHERE ai_filter('Does {0} mention a product?', body) AND lang = 'en'
-- query: two_ai_filters
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) AND ai_filter('Does the text {0} talk about time or length, in any way at all, directly or indirectly?', body)
-- query: ai_or_cheap
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) OR score > 4
-- query: not_ai
SELECT id FROM docs WHERE NOT ai_filter('Is the review {0} positive?', body)
-- query: ai_or_ai
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) OR ai_filter('Does {0} mention a product?', body)
-- query: filter_computed_document
SELECT id FROM docs WHERE ai_filter('Is {0} a complaint?', concat(body, ' (', lang, ')'))
-- query: filter_upper_document
SELECT id FROM docs WHERE ai_filter('Is {0} shouting?', upper(body))
-- query: filter_constant_document_per_row
SELECT id FROM docs WHERE lang = 'de' AND ai_filter('Is {0} a weekday?', 'Monday')
-- query: filter_cast_number
SELECT id FROM docs WHERE ai_filter('Is the year {0} recent?', CAST(year AS VARCHAR))
-- query: filter_null_documents
SELECT id FROM docs WHERE body IS NULL OR ai_filter('Is the review {0} positive?', body)
-- query: filter_is_false
SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) IS NOT TRUE
-- query: filter_on_claims
SELECT id, text FROM claims WHERE ai_filter('Is the claim {0} true?', text)
-- query: filter_in_list_and_ai
SELECT id FROM claims WHERE topic IN ('geo', 'tech') AND ai_filter('Is the claim {0} true?', text)
-- query: filter_alias
SELECT d.id FROM docs AS d WHERE ai_filter('Is the review {0} positive?', d.body) AND d.score < 3
