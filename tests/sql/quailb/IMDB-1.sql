-- IMDB-1 in SQL: one AI filter.
SELECT r.id AS r
FROM reviews r
WHERE ai_filter('Judge strictly from the review above whether it mentions at least one positive aspect of the movie.

{0}

Instruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.', r.body)
