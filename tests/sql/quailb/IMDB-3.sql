-- IMDB-3 in SQL: an AI filter, then an AI join (the subquery fixes the order).
SELECT r.id AS r, a.id AS a
FROM (SELECT id, body FROM reviews WHERE ai_filter('Judge strictly from the review above whether it mentions at least one positive aspect of the movie.

{0}

Instruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.', body)) r
JOIN aspects a ON ai_join('Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?', r.body, a.aspect)
