-- IMDB-15 in SQL: classification, IN-list, AI join, then a classification of each joined pair.
SELECT r.id AS r, r.sentiment AS sentiment, a.id AS a,
       ai_classify('Judge strictly from the review in DOCUMENT {0} what sentiment it expresses about the movie aspect in DOCUMENT {1}.', r.body, a.aspect, ['positive', 'negative', 'neutral', 'mixed'], ['', '', '', '']) AS aspect_sentiment
FROM (SELECT id, body, ai_classify('Judge strictly from the review above which category best describes the overall sentiment it expresses about the movie.

{0}', body, ['positive', 'negative', 'neutral', 'mixed'], ['', '', '', '']) AS sentiment
      FROM reviews) r
JOIN aspects a ON ai_join('Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?', r.body, a.aspect)
WHERE r.sentiment IN ('negative', 'mixed')
