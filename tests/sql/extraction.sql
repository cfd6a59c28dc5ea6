-- query: extract_projection
SELECT id, ai_extract(body, ['dish: Which dish is named?', 'price: What did it cost?']) AS f FROM docs
-- query: extract_field_access
SELECT id, ai_extract(body, ['dish: Which dish is named?', 'price: What did it cost?'])['dish'] AS dish FROM docs WHERE year < 2020
-- query: extract_max_tokens
SELECT id, ai_extract(body, ['tone: One word for the tone?'], 2) AS f FROM docs
-- query: extract_after_filter
SELECT id, ai_extract(body, ['dish: Which dish is named?']) AS f FROM docs WHERE ai_filter('Is the review {0} about food?', body)
-- query: extract_group_by_field
SELECT ai_extract(body, ['tone: One word for the tone?'], 1)['tone'] AS tone, count(*) AS n FROM docs GROUP BY 1
-- query: extract_snowflake_case
SELECT id, AI_EXTRACT(body, ['who: Who wrote it?', 'when: When was it written?'], 4) AS f FROM docs WHERE lang = 'en'
-- query: extract_claims
SELECT id, ai_extract(text, ['subject: What is the claim about?', 'number: Which number does it give?'], 6) AS f FROM claims
-- query: extract_null_document
SELECT id, ai_extract(CASE WHEN year > 2019 THEN body END, ['dish: Which dish is named?'], 3) AS f FROM docs
-- query: extract_two_field_lists
SELECT id, ai_extract(body, ['dish: Which dish is named?'], 3) AS a, ai_extract(body, ['price: What did it cost?'], 3) AS b, ai_extract(body, ['dish: Which dish is named?'], 5) AS c FROM docs
