-- AGENT-4 in SQL: a classification, an IN-list on its label, a second classification.
SELECT t.id AS t, t.progress AS progress,
       ai_classify('Judge strictly from the agent trace above what the most recent test or reproduction run showed.

{0}', t.trace, ['bug fixed, tests pass', 'bug still occurs', 'bug fixed, other tests fail', 'run errored'], ['the reported bug no longer occurs and other tests pass', 'the reported bug still happens', 'the reported bug no longer occurs but other tests fail', 'the run crashed or errored before testing anything']) AS test_result
FROM (SELECT id, trace, ai_classify('Judge strictly from the agent trace above how far the agent has gotten so far.

{0}', trace, ['has not located the relevant code', 'located the relevant code', 'changed the code, not checked', 'changed the code, check passes', 'changed the code, check fails'], ['has not yet found the code that causes the issue', 'found the code that causes the issue but has not changed it', 'edited the code but has not run a test or reproduction since', 'edited the code and the latest test or reproduction run succeeds', 'edited the code and the latest test or reproduction run still fails']) AS progress
      FROM agent_traces) t
WHERE t.progress IN ('changed the code, not checked', 'changed the code, check passes', 'changed the code, check fails')
