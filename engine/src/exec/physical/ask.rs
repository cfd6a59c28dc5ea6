//! Asking the query: questions the query's memo has not answered go to its
//! backend object in one call per batch, answers are recorded in the
//! operator's answer table, and the query's row-error and budget policies are
//! applied to them.

use super::*;

/// Answers to `requests`, asked in chunks, each checked against the call.
pub(super) fn answer_all(
    call: &AiCall,
    runtime: &AiRuntime,
    requests: &[AiRequest<'_>],
) -> Result<Answered> {
    let mut out = Answered {
        answers: Vec::with_capacity(requests.len()),
        work: Work::default(),
    };
    for chunk in requests.chunks(REQUESTS_PER_CALL) {
        let answered = runtime.query.answer(call, chunk)?;
        check_answers(call, "the backend", &answered.answers, chunk.len())?;
        out.answers.extend(answered.answers);
        out.work.merge(&answered.work);
    }
    Ok(out)
}

/// Answers to `requests`, in order: from the query's memo where any operator
/// asked the question before, else from the backend (requests sharing an anchor
/// document asked together). Tuples this operator has not recorded yet go into
/// its answer table, each once.
pub(super) fn answer(state: &OpState, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
    answer_call(state, &state.spec.call, requests, true)
}

/// [`answer`] for `call` (an `ai_agg` round's), recording the tuples in the
/// operator's answer table only when `record`.
pub(super) fn answer_call(
    state: &OpState,
    call: &AiCall,
    requests: &[AiRequest<'_>],
    record: bool,
) -> Result<Vec<Answer>> {
    let spec = &state.spec;
    let (keys, mut ask) = {
        let mut memo = state.runtime.memo.lock().expect("memo lock");
        let keys: Vec<MemoKey> = memo.keys(call, requests);
        let mut seen = HashSet::new();
        let ask: Vec<usize> = (0..requests.len())
            .filter(|&i| memo.get(&keys[i]).is_none() && seen.insert(&keys[i]))
            .collect();
        (keys, ask)
    };
    if !ask.is_empty() {
        // Requests sharing an anchor document arrive together (stable: first-seen order within).
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (n, &i) in ask.iter().enumerate() {
            first.entry(requests[i].anchor.id).or_insert(n);
        }
        ask.sort_by_key(|&i| first[requests[i].anchor.id]);
        let asked: Vec<AiRequest<'_>> = ask.iter().map(|&i| requests[i]).collect();
        state.runtime.progress.begin(&call.op_id);
        let timer = state.metrics.model_time.timer();
        let answered = answer_all(call, &state.runtime, &asked)?;
        timer.done();
        state.metrics.prompts.add(asked.len());
        state.metrics.add_work(&answered.work);
        state
            .runtime
            .progress
            .advance(&call.op_id, asked.len() as u64, answered.work.fresh());
        let mut memo = state.runtime.memo.lock().expect("memo lock");
        for (&i, c) in ask.iter().zip(answered.answers) {
            memo.insert(keys[i], c);
        }
    }
    let answers: Vec<Answer> = {
        let memo = state.runtime.memo.lock().expect("memo lock");
        keys.iter()
            .map(|k| memo.get(k).expect("every question answered").clone())
            .collect()
    };
    if !record {
        return Ok(answers);
    }
    let aliases = spec.docs.iter().map(|d| d.alias.clone()).collect();
    let mut table = AnswerTable::new(&call.op_id, call.kind, aliases, call.labels.clone());
    let mut recorded = state.recorded.lock().expect("recorded lock");
    // A row without an answer (failed, unreached) was not evaluated.
    for ((r, answer), key) in requests.iter().zip(&answers).zip(&keys) {
        if !answer.is_answer() || !recorded.insert(*key) {
            continue;
        }
        table.ids[0].push(r.anchor.id.to_string());
        if spec.docs.len() > 1 {
            table.ids[1].push(r.partner.map_or(String::new(), |p| p.id.to_string()));
        }
        table.answers.push(answer.clone());
    }
    if !table.is_empty() {
        state.runtime.recorder.record(table);
    }
    Ok(answers)
}

/// Applies the query's policies to the answers of `requests`
/// ([`QueryControls::settle`]): a failed row fails the query or stays
/// [`Answer::Failed`] (NULL), an unreached one fails it or stays
/// [`Answer::Unreached`] (left out); both are counted in the operator's
/// metrics.
pub(super) fn settle(
    state: &OpState,
    requests: &[AiRequest<'_>],
    answers: &[Answer],
) -> Result<()> {
    settle_rows(state, answers, |i| row_name(&requests[i]))
}

/// [`settle`] with `row(i)` naming answer `i`'s row.
pub(super) fn settle_rows(
    state: &OpState,
    answers: &[Answer],
    row: impl Fn(usize) -> String,
) -> Result<()> {
    let settled = state
        .runtime
        .controls
        .settle(&state.spec.call.op_id, answers, row)?;
    if let Some(c) = &state.metrics.rows_failed {
        c.add(settled.failed);
    }
    if let Some(c) = &state.metrics.rows_not_reached {
        c.add(settled.unreached);
    }
    Ok(())
}

/// A request's row as failure lists name it: its document's id, and its
/// partner's for a pair (excerpts: an id may be the document).
pub(super) fn row_name(r: &AiRequest<'_>) -> String {
    match r.partner {
        Some(p) => format!("{} × {}", Excerpt(r.anchor.id), Excerpt(p.id)),
        None => Excerpt(r.anchor.id).to_string(),
    }
}
