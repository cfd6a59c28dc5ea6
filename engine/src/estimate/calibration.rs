//! A model's throughput profile: how many seconds a fresh prompt position, a
//! position of attention and a decoded position cost on one device in one
//! dtype, measured once (`aisql model calibrate`) and kept in aisql's cache
//! folder, `CACHE/calibration/`. An estimate turns its simulated work into
//! seconds with it; without one it says "uncalibrated" and gives tokens only.
//!
//! The time model: `seconds = a·fresh + b·attended + c·decoded + d·scored`,
//! where `attended` counts, for each fresh position, the positions it attends
//! to (so long documents cost more per token than short ones, as attention
//! does), and `scored` the label tokens a classification reads from the full
//! vocabulary. `a` and `b` come from two prefill workloads (short and long
//! documents), `c` from a generating one, `d` from a classifying one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiKind, AiRequest, ContentHashBackend, Doc, InferenceBackend, QueryStart,
};
use crate::inference::kinds::call_pieces;
use crate::inference::prompt::PromptFormat;
use crate::inference::scheduler::{Executor as _, ScheduledBackend, SchedulerConfig, SimExecutor};

/// A measured throughput profile.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// The model as named (`tiny`, `Qwen/Qwen3-4B`, a folder).
    pub model: String,
    /// Weights dtype (`f32`, `bf16`, `f16`).
    pub dtype: String,
    /// The device (`cpu`, `cuda:0`).
    pub device: String,
    /// When it was measured (UTC).
    pub measured_at: String,
    /// Seconds per fresh prompt position.
    pub seconds_per_token: f64,
    /// Seconds per attended position of a fresh prompt position.
    pub seconds_per_attended: f64,
    /// Seconds per decoded position.
    pub seconds_per_decoded: f64,
    /// Seconds per label token scored over the full vocabulary.
    #[serde(default)]
    pub seconds_per_scored: f64,
    /// The workloads it was fitted on.
    pub workloads: Vec<Workload>,
}

/// One measured workload.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// What it was (`short prompts`, `long prompts`, `decoding`).
    pub name: String,
    /// Fresh prompt positions computed.
    pub fresh_tokens: u64,
    /// Positions attended by them.
    pub attended: u64,
    /// Positions decoded.
    pub decoded: u64,
    /// Label tokens scored over the full vocabulary.
    #[serde(default)]
    pub scored: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// The work an estimate's simulation counted, to be priced in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Fresh prompt positions (decoded ones excluded).
    pub prefill_tokens: u64,
    /// Positions attended by them.
    pub attended: u64,
    /// Decoded positions.
    pub decoded: u64,
    /// Label tokens scored over the full vocabulary.
    pub scored: u64,
}

impl Calibration {
    /// Seconds `work` takes on the calibrated model and device.
    pub fn seconds(&self, work: &Work) -> f64 {
        self.seconds_per_token * work.prefill_tokens as f64
            + self.seconds_per_attended * work.attended as f64
            + self.seconds_per_decoded * work.decoded as f64
            + self.seconds_per_scored * work.scored as f64
    }

    /// Where the profile of `model` in `dtype` on `device` is kept.
    pub fn path(model: &str, dtype: &str, device: &str) -> PathBuf {
        let slug: String = format!("{model}-{dtype}-{device}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        crate::data::cache_dir::cache_dir()
            .join("calibration")
            .join(format!("{slug}.json"))
    }

    /// The kept profile of `model` in `dtype` on `device`: `None` when it was
    /// never measured; an error naming the file when it cannot be read or
    /// belongs to another model.
    pub fn load(model: &str, dtype: &str, device: &str) -> Result<Option<Self>> {
        let path = Self::path(model, dtype, device);
        if !path.exists() {
            return Ok(None);
        }
        let bytes = crate::data::input_file::read(&path).map_err(|e| EngineError::io(&path, e))?;
        let c: Self = serde_json::from_slice(&bytes).map_err(|e| {
            EngineError::Data(format!(
                "{}: not a calibration profile ({e}); run `aisql model calibrate` again",
                path.display()
            ))
        })?;
        if (c.model.as_str(), c.dtype.as_str(), c.device.as_str()) != (model, dtype, device) {
            return Err(EngineError::Data(format!(
                "{}: a profile of {} {} on {}, not of {model} {dtype} on {device}",
                path.display(),
                c.model,
                c.dtype,
                c.device
            )));
        }
        let finite = [
            c.seconds_per_token,
            c.seconds_per_attended,
            c.seconds_per_decoded,
            c.seconds_per_scored,
        ]
        .iter()
        .all(|s| s.is_finite() && *s >= 0.0);
        if !finite {
            return Err(EngineError::Data(format!(
                "{}: a cost that is not a finite number ≥ 0; run `aisql model calibrate` again",
                path.display()
            )));
        }
        Ok(Some(c))
    }

    /// Keeps the profile where [`Self::load`] finds it; returns that path.
    pub fn save(&self) -> Result<PathBuf> {
        let path = Self::path(&self.model, &self.dtype, &self.device);
        let dir = path.parent().expect("a calibration file has a folder");
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        let text = serde_json::to_vec_pretty(self).expect("a profile serialises");
        crate::data::files::write_file_atomic(&path, &text)?;
        Ok(path)
    }

    /// Fits `a`, `b`, `c` and `d` to the workloads: the two prefill workloads
    /// give `a` and `b` (a negative solution, from timing noise, falls back to
    /// one cost per token), the decoding one gives `c` and the classifying one
    /// `d`, each net of its prefill.
    pub fn fit(
        (model, dtype, device): (&str, &str, &str),
        measured_at: String,
        [short, long, decoding, classifying]: [Workload; 4],
    ) -> Result<Self> {
        let (f1, a1, t1) = (
            short.fresh_tokens as f64,
            short.attended as f64,
            short.seconds,
        );
        let (f2, a2, t2) = (long.fresh_tokens as f64, long.attended as f64, long.seconds);
        let det = f1 * a2 - f2 * a1;
        let solved = (det.abs() > f64::EPSILON)
            .then(|| ((t1 * a2 - t2 * a1) / det, (f1 * t2 - f2 * t1) / det))
            .filter(|&(a, b)| a > 0.0 && b >= 0.0);
        let (a, b) = solved.unwrap_or(((t1 + t2) / (f1 + f2).max(1.0), 0.0));
        let prefill = |w: &Workload| a * w.fresh_tokens as f64 + b * w.attended as f64;
        if decoding.decoded == 0 || classifying.scored == 0 {
            return Err(EngineError::Inference(
                "calibration: the decoding workload decoded nothing, or the classifying one \
                 scored no label"
                    .into(),
            ));
        }
        let c = ((decoding.seconds - prefill(&decoding)) / decoding.decoded as f64).max(0.0);
        let d =
            ((classifying.seconds - prefill(&classifying)) / classifying.scored as f64).max(0.0);
        Ok(Self {
            model: model.into(),
            dtype: dtype.into(),
            device: device.into(),
            measured_at,
            seconds_per_token: a,
            seconds_per_attended: b,
            seconds_per_decoded: c,
            seconds_per_scored: d,
            workloads: vec![short, long, decoding, classifying],
        })
    }
}

/// Labels of several tokens each, as a classification's often are.
const CALIBRATION_LABELS: [&str; 12] = [
    "romantic comedy",
    "science fiction",
    "documentary film",
    "psychological thriller",
    "historical drama",
    "animated feature",
    "musical theatre",
    "crime mystery",
    "war epic",
    "coming of age story",
    "supernatural horror",
    "sports biography",
];

/// A deterministic document of about `words` words (each one or two tokens).
fn document(seed: usize, words: usize) -> String {
    const WORDS: [&str; 16] = [
        "review",
        "film",
        "plot",
        "actor",
        "scene",
        "music",
        "story",
        "ending",
        "camera",
        "dialogue",
        "character",
        "director",
        "drama",
        "comedy",
        "moment",
        "audience",
    ];
    // Words picked by a hash of (document, position): no two documents share
    // an opening, so each is computed in full, as distinct rows are.
    (0..words)
        .map(|i| {
            let h = twox_hash::XxHash3_128::oneshot_with_seed(seed as u64, &i.to_le_bytes());
            WORDS[(h % WORDS.len() as u128) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A calibration call of `kind` over the synthetic `calibration` table.
fn calibration_call(
    kind: AiKind,
    op_id: &str,
    template: &str,
    max_tokens: u32,
    labels: &[&str],
) -> Result<AiCall> {
    let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    let descriptions = vec![String::new(); labels.len()];
    let pieces = call_pieces(
        PromptFormat::default(),
        kind,
        template,
        false,
        &labels,
        &descriptions,
    )?;
    Ok(AiCall {
        op_id: op_id.into(),
        kind,
        template: template.into(),
        tables: vec!["calibration".into()],
        columns: vec!["text".into()],
        pieces,
        labels,
        max_tokens,
        descriptions,
        relations: Vec::new(),
    })
}

/// Synthetic documents: (id, text).
pub type Documents = Vec<(String, String)>;

/// The four workloads: `(name, call, documents)`.
pub fn workloads() -> Result<Vec<(String, AiCall, Documents)>> {
    let docs = |n: usize, words: usize, from: usize| -> Documents {
        (0..n)
            .map(|i| (format!("doc{}", from + i), document(from + i, words)))
            .collect()
    };
    Ok(vec![
        (
            "short prompts".into(),
            calibration_call(
                AiKind::Filter,
                "calibrate-short",
                "Is {0} about a film?",
                0,
                &[],
            )?,
            docs(96, 150, 0),
        ),
        (
            "long prompts".into(),
            calibration_call(
                AiKind::Filter,
                "calibrate-long",
                "Is {0} about a film?",
                0,
                &[],
            )?,
            docs(6, 2400, 1000),
        ),
        (
            "decoding".into(),
            calibration_call(
                AiKind::Complete,
                "calibrate-decode",
                "Summarise {0}",
                48,
                &[],
            )?,
            docs(16, 80, 2000),
        ),
        (
            "label scoring".into(),
            calibration_call(
                AiKind::Classify,
                "calibrate-classify",
                "Which genre is {0}?",
                0,
                &CALIBRATION_LABELS,
            )?,
            docs(24, 80, 3000),
        ),
    ])
}

/// Measures the throughput profile of the model `backend` runs (named by
/// `key`: model, dtype, device): each workload timed on it, its work counted by
/// the same scheduler over a virtual KV of `kv_bytes_per_token` per position.
pub fn measure(
    backend: &Arc<dyn InferenceBackend>,
    kv_bytes_per_token: usize,
    key: (&str, &str, &str),
    measured_at: String,
) -> Result<Calibration> {
    let mut measured = Vec::new();
    for (name, call, docs) in workloads()? {
        let sim = Arc::new(ScheduledBackend::new(
            SimExecutor::answering(
                Arc::new(ContentHashBackend::default()),
                kv_bytes_per_token,
                usize::MAX,
            ),
            aisql_models::Tokenizer::vendored()?,
            SchedulerConfig {
                kv_budget_bytes: usize::MAX / 4,
                ..SchedulerConfig::default()
            },
        ));
        // Once to warm the model up (kernels, allocations), once timed.
        time_workload(backend, &call, &docs)?;
        let (seconds, real) = time_workload(backend, &call, &docs)?;
        time_workload(&(sim.clone() as Arc<dyn InferenceBackend>), &call, &docs)?;
        let exec = sim.executor();
        let decoded = if call.kind.generates() {
            // What the model decoded: a text may end before `max_tokens`.
            real.decoded()
        } else {
            0
        };
        measured.push(Workload {
            name,
            fresh_tokens: exec.fresh_tokens() - exec.decode_tokens(),
            attended: exec.attended_prefill(),
            decoded,
            scored: exec.scored_positions(),
            seconds,
        });
    }
    let workloads: [Workload; 4] = measured
        .try_into()
        .map_err(|_| EngineError::Inference("calibration: four workloads expected".into()))?;
    Calibration::fit(key, measured_at, workloads)
}

/// Runs `call` over `docs` on `backend` as one query; its wall-clock seconds
/// and what the query measured.
pub fn time_workload(
    backend: &Arc<dyn InferenceBackend>,
    call: &AiCall,
    docs: &[(String, String)],
) -> Result<(f64, crate::inference::work::Work)> {
    let requests: Vec<AiRequest<'_>> = docs
        .iter()
        .map(|(id, text)| AiRequest {
            anchor: Doc { id, text },
            partner: None,
        })
        .collect();
    let query = backend.clone().begin(QueryStart::one(call))?;
    let started = Instant::now();
    let answered = query.answer(call, &requests)?;
    let seconds = started.elapsed().as_secs_f64();
    let work = query.work();
    drop(query);
    crate::inference::backend::check_answers(
        call,
        backend.name(),
        &answered.answers,
        requests.len(),
    )?;
    Ok((seconds, work))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(name: &str, fresh: u64, attended: u64, decoded: u64, seconds: f64) -> Workload {
        Workload {
            name: name.into(),
            fresh_tokens: fresh,
            attended,
            decoded,
            scored: 0,
            seconds,
        }
    }

    #[test]
    fn fit_recovers_the_costs_of_a_linear_model() {
        let (a, b, c, d) = (2e-5, 3e-9, 4e-3, 5e-4);
        let t = |f: u64, at: u64, dec: u64, sc: u64| {
            a * f as f64 + b * at as f64 + c * dec as f64 + d * sc as f64
        };
        let short = w("short", 20_000, 2_000_000, 0, t(20_000, 2_000_000, 0, 0));
        let long = w("long", 15_000, 20_000_000, 0, t(15_000, 20_000_000, 0, 0));
        let dec = w("decode", 2_000, 200_000, 700, t(2_000, 200_000, 700, 0));
        let classify = Workload {
            scored: 900,
            ..w("classify", 3_000, 300_000, 0, t(3_000, 300_000, 0, 900))
        };
        let cal = Calibration::fit(
            ("tiny", "f32", "cpu"),
            String::new(),
            [short, long, dec, classify],
        )
        .unwrap();
        assert!((cal.seconds_per_token - a).abs() / a < 1e-9);
        assert!((cal.seconds_per_attended - b).abs() / b < 1e-6);
        assert!((cal.seconds_per_decoded - c).abs() / c < 1e-6);
        assert!((cal.seconds_per_scored - d).abs() / d < 1e-6);
        let work = Work {
            prefill_tokens: 1000,
            attended: 10_000,
            decoded: 10,
            scored: 40,
        };
        assert!((cal.seconds(&work) - t(1000, 10_000, 10, 40)).abs() < 1e-12);
    }

    #[test]
    fn a_noisy_fit_falls_back_to_one_cost_per_token() {
        // Long prompts faster per token than short ones: b would be negative.
        let short = w("short", 10_000, 1_000_000, 0, 1.0);
        let long = w("long", 10_000, 10_000_000, 0, 0.5);
        let dec = w("decode", 100, 1000, 100, 1.0);
        let classify = Workload {
            scored: 100,
            ..w("classify", 100, 1000, 0, 1.0)
        };
        let cal = Calibration::fit(
            ("m", "bf16", "cuda:0"),
            String::new(),
            [short, long, dec, classify],
        )
        .unwrap();
        assert_eq!(cal.seconds_per_attended, 0.0);
        assert!((cal.seconds_per_token - 1.5 / 20_000.0).abs() < 1e-12);
    }

    #[test]
    fn profiles_are_kept_per_model_dtype_and_device() {
        let a = Calibration::path("Qwen/Qwen3-4B", "bf16", "cuda:0");
        let b = Calibration::path("Qwen/Qwen3-4B", "f32", "cpu");
        assert_ne!(a, b);
        assert!(
            a.ends_with("calibration/Qwen_Qwen3-4B-bf16-cuda_0.json"),
            "{a:?}"
        );
    }
}
