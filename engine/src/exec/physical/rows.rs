//! From input rows to questions and back: the text and id columns of a
//! batch, the documents of a row, and the batch an operator emits for its
//! answers (filters, projections, aggregates).

use super::*;

/// A text column: plain `Utf8`, or `Utf8View` (how tables are registered, so
/// that joins copy 16-byte views instead of document texts).
pub(super) enum Texts<'a> {
    Plain(&'a StringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
}

impl<'a> Texts<'a> {
    pub(super) fn value(&self, i: usize) -> &'a str {
        match self {
            Texts::Plain(a) => a.value(i),
            Texts::View(a) => a.value(i),
        }
    }

    pub(super) fn is_null(&self, i: usize) -> bool {
        match self {
            Texts::Plain(a) => a.is_null(i),
            Texts::View(a) => a.is_null(i),
        }
    }
}

pub(super) fn texts<'a>(batch: &'a RecordBatch, index: usize, what: &str) -> Result<Texts<'a>> {
    let col = batch.column(index);
    match col.data_type() {
        DataType::Utf8 => Ok(Texts::Plain(col.as_string::<i32>())),
        DataType::LargeUtf8 => Err(EngineError::Data(format!(
            "{what}: text column {index} is LargeUtf8; cast it to VARCHAR"
        ))),
        DataType::Utf8View => Ok(Texts::View(col.as_string_view())),
        other => Err(EngineError::Data(format!(
            "{what}: text column {index} is {other} (expected a string)"
        ))),
    }
}

/// A column of ids as strings, whatever its type (a table's ids may be numbers).
pub(super) fn id_strings(batch: &RecordBatch, index: usize) -> Result<StringArray> {
    let col = batch.column(index);
    let col = if col.data_type() == &DataType::Utf8 {
        col.clone()
    } else {
        cast(col, &DataType::Utf8)?
    };
    Ok(col.as_string::<i32>().clone())
}

/// The documents of `docs` ((id, text) column pairs) in each row of `batch`,
/// `None` where one of them is NULL.
pub(super) struct RowDocs<'a> {
    ids: Vec<StringArray>,
    texts: Vec<Texts<'a>>,
}

impl<'a> RowDocs<'a> {
    pub(super) fn new(batch: &'a RecordBatch, docs: &[(usize, usize)], op: &str) -> Result<Self> {
        Ok(Self {
            ids: docs
                .iter()
                .map(|&(id, _)| id_strings(batch, id))
                .collect::<Result<_>>()?,
            texts: docs
                .iter()
                .map(|&(_, text)| texts(batch, text, op))
                .collect::<Result<_>>()?,
        })
    }

    pub(super) fn doc(&self, slot: usize, row: usize) -> Option<Doc<'_>> {
        let (ids, texts) = (&self.ids[slot], &self.texts[slot]);
        (ids.is_valid(row) && !texts.is_null(row)).then(|| Doc {
            id: ids.value(row),
            text: texts.value(row),
        })
    }
}

/// `ai_agg` over each row's list of texts (a group's rows), the prompts of
/// all rows of the batch asked together round by round. Its sub-questions are
/// not recorded: their documents are chunks of many rows.
pub(super) fn aggregate_batch(state: &OpState, batch: &RecordBatch) -> Result<RecordBatch> {
    let spec = &state.spec;
    state.metrics.input_rows.add(batch.num_rows());
    let (_, text) = state.layout.docs[0];
    let lists = batch.column(text).as_list_opt::<i32>().ok_or_else(|| {
        EngineError::Data(format!(
            "{}: the rows column is {}, not a list",
            spec.call.op_id,
            batch.column(text).data_type()
        ))
    })?;
    let groups: Vec<Vec<String>> = (0..lists.len())
        .map(|row| -> Result<Vec<String>> {
            if lists.is_null(row) {
                return Ok(Vec::new());
            }
            let values = cast(&lists.value(row), &DataType::Utf8)?;
            Ok(values
                .as_string::<i32>()
                .iter()
                .flatten()
                .map(str::to_string)
                .collect())
        })
        .collect::<Result<_>>()?;
    let calls = AggCalls {
        first: spec.call.clone(),
        combine: AiCall {
            pieces: spec
                .combine
                .clone()
                .unwrap_or_else(|| spec.call.pieces.clone()),
            ..spec.call.clone()
        },
    };
    let context = state
        .backend
        .context_positions()
        .unwrap_or(DEFAULT_CONTEXT_POSITIONS);
    let answers = reduce_groups(&calls, context, &groups, |call, requests| {
        answer_call(state, call, requests, false)
    })?;
    // A group is one row: named by its first text.
    let present: Vec<usize> = (0..answers.len())
        .filter(|&g| answers[g].is_some())
        .collect();
    let outcomes: Vec<Answer> = present.iter().filter_map(|&g| answers[g].clone()).collect();
    settle_rows(state, &outcomes, |i| {
        let first = groups[present[i]].first().map_or("", String::as_str);
        format!("the group of {}", Excerpt(first))
    })?;
    let column: StringArray = answers
        .iter()
        .map(|a| match a {
            Some(Answer::Text(t)) => Some(t.as_ref()),
            _ => None,
        })
        .collect();
    let out = append_column(batch, Arc::new(column), state.schema.clone())?;
    let out = leave_out_unreached(out, answers.iter().map(Option::as_ref))?;
    Ok(out)
}

/// Filters, classifications and AI predicates over one input, one batch at a time.
pub(super) fn one_input(state: &OpState, batch: &RecordBatch) -> Result<RecordBatch> {
    let spec = &state.spec;
    if spec.shape == AiShape::Aggregate {
        return aggregate_batch(state, batch);
    }
    state.metrics.input_rows.add(batch.num_rows());
    let docs = RowDocs::new(batch, &state.layout.docs, &spec.call.op_id)?;
    let two = spec.docs.len() > 1;
    let request = |row: usize| -> Option<AiRequest<'_>> {
        let anchor = docs.doc(0, row)?;
        let partner = if two { Some(docs.doc(1, row)?) } else { None };
        Some(AiRequest { anchor, partner })
    };
    let requests: Vec<Option<AiRequest<'_>>> = (0..batch.num_rows()).map(request).collect();
    let asked: Vec<AiRequest<'_>> = requests.iter().flatten().copied().collect();
    let answered = answer(state, &asked)?;
    settle(state, &asked, &answered)?;
    let mut answered = answered.into_iter();
    let answers: Vec<Option<Answer>> = requests
        .iter()
        .map(|r| r.as_ref().and_then(|_| answered.next()))
        .collect();
    let out = match spec.shape {
        // Failed (NULL) and unreached rows are not TRUE: not kept.
        AiShape::Filter => {
            let mask: BooleanArray = answers
                .iter()
                .map(|a| Some(*a == Some(Answer::Bool(true))))
                .collect();
            let kept = filter_record_batch(batch, &mask)?;
            RecordBatch::try_new(state.schema.clone(), kept.columns().to_vec())?
        }
        _ => leave_out_unreached(
            append_column(
                batch,
                answer_array(&spec.call, &answers)?,
                state.schema.clone(),
            )?,
            answers.iter().map(Option::as_ref),
        )?,
    };
    Ok(out)
}

/// `batch` without the rows whose answer is [`Answer::Unreached`]: the budget
/// was spent before they were asked, and a row is never given a made-up value.
pub(super) fn leave_out_unreached<'a>(
    batch: RecordBatch,
    answers: impl Iterator<Item = Option<&'a Answer>>,
) -> Result<RecordBatch> {
    let reached: BooleanArray = answers
        .map(|a| Some(a != Some(&Answer::Unreached)))
        .collect();
    if reached.true_count() == reached.len() {
        return Ok(batch);
    }
    Ok(filter_record_batch(&batch, &reached)?)
}

pub(super) fn append_column(
    batch: &RecordBatch,
    column: ArrayRef,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(column);
    Ok(RecordBatch::try_new(schema, columns)?)
}
