-- IMDB-7 in SQL: three AI filters, innermost first as the plan nests them.
SELECT r.id AS r
FROM (SELECT id, body FROM
        (SELECT id, body FROM reviews WHERE ai_filter('Judge strictly from the review above whether it mentions at least one positive aspect of the movie.

{0}

Instruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.', body)) r1
      WHERE ai_filter('Judge strictly from the review above whether it discusses the ending of the movie.

{0}

Instruction: answer TRUE if the review discusses the ending of the movie, FALSE otherwise.', body)) r
WHERE ai_filter('Judge strictly from the review above whether it mentions any specific actor or actress by name.

{0}

Instruction: answer TRUE if the review mentions a specific actor or actress by name, FALSE otherwise.', r.body)
