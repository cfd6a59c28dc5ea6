-- BIO-2 in SQL: one AI join.
SELECT r.id AS r, m.id AS m
FROM reports r
JOIN terms m ON ai_join('Does the medical report in DOCUMENT {0} describe the reaction in DOCUMENT {1} as something the patient experienced?', r.report, m.term)
