-- IMDB-11 in SQL: a classification.
SELECT r.id AS r, ai_classify('Judge strictly from the review above which category best describes the overall sentiment it expresses about the movie.

{0}', r.body, ['positive', 'negative', 'neutral', 'mixed'], ['', '', '', '']) AS sentiment
FROM reviews r
