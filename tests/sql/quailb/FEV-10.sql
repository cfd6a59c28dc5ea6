-- FEV-10 in SQL: AI filters on both sides, then an AI join with an equality.
SELECT c.id AS c, e.id AS e
FROM (SELECT id, claim, evidence_wiki_url FROM claims WHERE ai_filter('Judge strictly from the claim above whether it asserts something about a person, rather than an organization, place, or event.

{0}

Instruction: answer TRUE if the claim asserts something about a person, FALSE otherwise.', claim)) c
JOIN (SELECT id, text FROM evidence WHERE ai_filter('Judge strictly from the Wikipedia passage above whether it primarily describes a specific person (their life, actions, or role), rather than an organization, place, or event.

{0}

Instruction: answer TRUE if the passage primarily describes a specific person, FALSE otherwise.', text)) e
  ON c.evidence_wiki_url = e.id AND ai_join('Does the Wikipedia passage in DOCUMENT {1} support the claim in DOCUMENT {0}?', c.claim, e.text)
