-- IMDB-13 in SQL: a classification, an ordinary IN-list on its label, an AI join.
SELECT r.id AS r, r.sentiment AS sentiment, a.id AS a
FROM (SELECT id, body, ai_classify('Judge strictly from the review above which category best describes the overall sentiment it expresses about the movie.

{0}', body, ['positive', 'negative', 'neutral', 'mixed'], ['', '', '', '']) AS sentiment
      FROM reviews) r
JOIN aspects a ON ai_join('Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?', r.body, a.aspect)
WHERE r.sentiment IN ('negative', 'mixed')
