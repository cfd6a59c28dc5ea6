-- AGENT-1 in SQL: one AI filter over agent traces.
SELECT t.id AS t
FROM agent_traces t
WHERE ai_filter('Judge strictly from the agent trace above whether the agent recovered after pursuing an approach that did not work. Recovery means the agent recognized or moved past the unsuccessful approach and then made useful progress with a different or corrected approach.

{0}

Instruction: answer TRUE if the trace shows the agent recovering after an unsuccessful approach, FALSE otherwise.', t.trace)
