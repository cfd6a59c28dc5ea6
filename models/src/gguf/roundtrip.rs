//! GGUF against safetensors: the same model written both ways gives the same
//! logits (f32) or the same decisions (Q8_0), the tokenizer survives the trip, and
//! every kind of broken file is an error naming the file and the tensor or key.

use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::gguf_file::{self, Value};

use super::write::{FileType, write_gguf};
use crate::testutil::tiny_dir;
use crate::{Continuation, ModelError, ModelFiles, Precision, Qwen3, Tokenizer};

/// Writes `dir` (safetensors) as a GGUF of `kind` in a new temp dir.
fn gguf_of(dir: &Path, kind: FileType) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("model.gguf");
    write_gguf(&ModelFiles::from_dir(dir).unwrap(), &out, kind).unwrap();
    (tmp, out)
}

/// Prompts of the tiny vocabulary: some sharing a cached prefix.
fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n as u64)
        .map(|i| {
            let len = 5 + (i % 23) as usize;
            (0..len as u64)
                .map(|j| ((i * 7919 + j * 104_729).wrapping_mul(2_654_435_761) % 150_000) as u32)
                .collect()
        })
        .collect()
}

fn logits(model: &Qwen3, prefix_tokens: &[u32], items: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let prefix = model.prefill(None, prefix_tokens).unwrap();
    let conts: Vec<Continuation> = items
        .iter()
        .map(|t| Continuation::new(Some(&prefix), t))
        .collect();
    model
        .next_token_logits(&conts, &[11, 22, 33, 4444, 55_555])
        .unwrap()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn f32_gguf_gives_the_safetensors_logits_tied_and_untied() {
    let untied = tempfile::tempdir().unwrap();
    let cfg = crate::qwen3::Config {
        tie_word_embeddings: false,
        ..crate::tiny::tiny_config()
    };
    crate::tiny::write_model(untied.path(), &cfg, 3).unwrap();
    for dir in [tiny_dir(), untied.path()] {
        let (_tmp, file) = gguf_of(dir, FileType::F32);
        let from_st = Qwen3::load(dir, &Device::Cpu, None).unwrap();
        let from_gguf = Qwen3::load(&file, &Device::Cpu, None).unwrap();
        assert_eq!(from_gguf.config(), from_st.config());
        assert_eq!(from_gguf.weights_name(), "gguf:f32");
        let items = prompts(6);
        let d = max_abs_diff(
            &logits(&from_st, &[1, 2, 3, 4], &items),
            &logits(&from_gguf, &[1, 2, 3, 4], &items),
        );
        assert!(d <= 1e-5, "max |Δlogit| {d}");
    }
}

#[test]
fn the_tokenizer_survives_the_trip() {
    let (_tmp, file) = gguf_of(tiny_dir(), FileType::F16);
    let ours = super::tokenizer::from_gguf(&super::GgufFile::open(&file).unwrap()).unwrap();
    let vendored = Tokenizer::vendored().unwrap();
    for text in [
        "Is the review positive? Answer TRUE or FALSE.",
        "<|im_start|>user\nWhy <think>so</think>?<|im_end|>\n",
        "naïve café — 東京 🙂 1234567 ' s 've\r\n\n  x",
    ] {
        assert_eq!(
            ours.encode(text).unwrap(),
            vendored.encode(text).unwrap(),
            "{text}"
        );
        assert_eq!(
            ours.encode_document(text).unwrap(),
            vendored.encode_document(text).unwrap(),
            "{text}"
        );
    }
    assert_eq!(ours.answer_ids().unwrap(), vendored.answer_ids().unwrap());
    assert_eq!(ours.stop_ids(), vendored.stop_ids());
    // And through the public loader, which reads the tokenizer from the file.
    let (_, tok) = crate::load(file.to_str().unwrap(), &Device::Cpu, None).unwrap();
    assert_eq!(
        tok.encode("TRUE or FALSE").unwrap(),
        vendored.encode("TRUE or FALSE").unwrap()
    );
}

/// `n` review-like questions in QUAIL-B's shape (document, question, answer cue).
fn review_prompts(n: usize) -> Vec<Vec<u32>> {
    const WORDS: [&str; 24] = [
        "film",
        "acting",
        "plot",
        "boring",
        "brilliant",
        "the",
        "was",
        "not",
        "a",
        "score",
        "ending",
        "slow",
        "funny",
        "cast",
        "loved",
        "hated",
        "scenes",
        "story",
        "and",
        "but",
        "director",
        "again",
        "never",
        "perfect",
    ];
    let tok = Tokenizer::vendored().unwrap();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let words: Vec<&str> = (0..12 + i % 40)
                .map(|j| {
                    let h = ((i * 7919 + j * 104_729) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    WORDS[(h >> 40) as usize % WORDS.len()]
                })
                .collect();
            let text = format!(
                "Review: {}.\nIs the review positive? Answer TRUE or FALSE.\nAnswer:",
                words.join(" ")
            );
            tok.encode(&text).unwrap()
        })
        .collect();
    let distinct: std::collections::HashSet<&Vec<u32>> = prompts.iter().collect();
    assert_eq!(distinct.len(), n, "the prompts repeat");
    prompts
}

/// Agreement of `model`'s TRUE/FALSE decisions with `reference`'s over `n` prompts,
/// leaving out near-ties of the reference (|margin| < 1e-3): (agreeing, counted, ties).
fn agreement(reference: &Qwen3, model: &Qwen3, n: usize) -> (usize, usize, usize) {
    let answers = Tokenizer::vendored().unwrap().answer_ids().unwrap();
    let items = review_prompts(n);
    let conts: Vec<Continuation> = items.iter().map(|t| Continuation::new(None, t)).collect();
    let a = reference.decide(&conts, &answers).unwrap();
    let b = model.decide(&conts, &answers).unwrap();
    let ties = a.iter().filter(|d| d.margin.abs() < 1e-3).count();
    let flipped: Vec<(f32, f32)> = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.margin.abs() >= 1e-3 && x.answer != y.answer)
        .map(|(x, y)| (x.margin, y.margin))
        .collect();
    eprintln!("flipped decisions (reference margin, quantized margin): {flipped:?}");
    (n - ties - flipped.len(), n - ties, ties)
}

#[test]
fn q8_0_decides_as_f32_quantized_at_load_and_from_gguf() {
    let f32_model = Qwen3::load(tiny_dir(), &Device::Cpu, None).unwrap();
    let at_load = Qwen3::load(tiny_dir(), &Device::Cpu, Some(Precision::Q8_0)).unwrap();
    assert_eq!(at_load.weights_name(), "q8_0");
    let (_tmp, file) = gguf_of(tiny_dir(), FileType::Q8_0);
    let gguf = Qwen3::load(&file, &Device::Cpu, None).unwrap();
    assert_eq!(gguf.weights_name(), "gguf:q8_0");
    let (agree, counted, ties) = agreement(&f32_model, &at_load, 400);
    eprintln!("q8_0 agrees with f32 on {agree}/{counted} prompts ({ties} near-ties left out)");
    assert!(agree as f64 >= 0.99 * counted as f64, "{agree}/{counted}");
    // The GGUF holds Q8_0 embeddings too (dequantized at load), where quantizing at
    // load keeps them f32: one more Q8_0 error on every input. The tiny model's
    // margins are small (those flipped here are about ±0.01).
    let (agree, counted, _) = agreement(&f32_model, &gguf, 400);
    eprintln!("GGUF q8_0 agrees with f32 on {agree}/{counted} prompts");
    assert!(agree as f64 >= 0.99 * counted as f64, "{agree}/{counted}");
}

/// A Q8_0 GGUF decodes with its Q8_0 head (a quarter of the f32 head's bytes):
/// every generated token is the argmax of that head over the uncached forward of
/// the tokens before it, and the head's logits stay close to the f32 head's. On
/// a CPU with AMX the uncached forward runs prompt rows on AMX (bf16) while
/// decoding ran its rows on the Q8_0 kernel, so there a pick may differ where the
/// random model's top logits lie within that rounding of each other.
#[test]
fn a_q8_0_gguf_decodes_with_its_q8_0_head() {
    let (_tmp, file) = gguf_of(tiny_dir(), FileType::Q8_0);
    let model = Qwen3::load(&file, &Device::Cpu, None).unwrap();
    let doc = prompts(3)[2].clone();
    let shared = model.prefill(None, &doc).unwrap();
    let own = prompts(4);
    let requests: Vec<crate::GenerateRequest> = own
        .iter()
        .map(|t| crate::GenerateRequest::new(Some(&shared), t, 7))
        .collect();
    let got = model.generate(&requests, &[], 4).unwrap();
    let argmax = |row: &[f32]| {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
    };
    // The two roundings of a decode row's activations (bf16 and Q8_0) move the tiny
    // model's logits by up to a few hundredths.
    let tolerance = if aisql_kernels::amx_gemm::amx_available() {
        0.05
    } else {
        0.0
    };
    let mut widest = 0f32;
    let mut near_ties = 0;
    for (g, t) in got.iter().zip(&own) {
        let mut context: Vec<u32> = doc.iter().chain(t).copied().collect();
        for &token in &g.token_ids {
            let whole = model.prefill(None, &context).unwrap();
            let hidden = crate::score::final_hidden(&whole)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let q8 = model
                .block_head_logits(&hidden)
                .unwrap()
                .expect("a Q8_0 head");
            let q8 = q8.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
            let want = argmax(&q8);
            let gap = q8[want as usize] - q8[token as usize];
            assert!(
                token == want || gap <= tolerance,
                "after {} tokens: {token}, the uncached forward's argmax {want} (gap {gap})",
                context.len()
            );
            near_ties += usize::from(token != want);
            let f32_logits = hidden
                .matmul(&model.lm_head().t().unwrap())
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let scale = f32_logits.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = max_abs_diff(&[q8], &[f32_logits]);
            widest = widest.max(diff / scale);
            context.push(token);
        }
    }
    eprintln!(
        "Q8_0 head against the f32 head: largest difference {widest:.4} of the largest logit; \
         {near_ties} near-ties"
    );
    assert!(near_ties * 4 <= got.len() * 7, "{near_ties} near-ties");
    assert!(widest < 0.05, "{widest}");
}

#[test]
fn q4k_agreement_is_reported() {
    let f32_model = Qwen3::load(tiny_dir(), &Device::Cpu, None).unwrap();
    let q4 = Qwen3::load(tiny_dir(), &Device::Cpu, Some(Precision::Q4K)).unwrap();
    // No row of the tiny model is a multiple of 256 long: llama.cpp's fallback, Q5_0.
    assert_eq!(q4.weights_name(), "q5_0");
    let (agree, counted, ties) = agreement(&f32_model, &q4, 400);
    eprintln!(
        "q4k (as q5_0 on the tiny model) agrees with f32 on {agree}/{counted} prompts ({ties} near-ties)"
    );
    assert!(agree as f64 >= 0.9 * counted as f64, "{agree}/{counted}");
}

/// Reads `src` with candle's reader, lets `edit` change metadata and tensors, and
/// writes the result to `dst`.
fn rewrite(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, candle_core::quantized::QTensor)>),
) {
    let mut f = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut meta: Vec<(String, Value)> = content.metadata.clone().into_iter().collect();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<_> = names
        .into_iter()
        .map(|n| (n.clone(), content.tensor(&mut f, n, &Device::Cpu).unwrap()))
        .collect();
    edit(&mut meta, &mut tensors);
    let m: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(dst).unwrap(), &m, &t).unwrap();
}

fn load_error(path: &Path) -> String {
    match Qwen3::load(path, &Device::Cpu, None) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => {
            assert!(matches!(e, ModelError::Gguf { .. }), "{e}");
            e.to_string()
        }
    }
}

#[test]
fn broken_files_are_errors_naming_file_and_tensor() {
    let (tmp, good) = gguf_of(tiny_dir(), FileType::Q8_0);
    let bytes = std::fs::read(&good).unwrap();
    let path = |name: &str| tmp.path().join(name);

    // Truncated: the last tensors end past the end of the file.
    std::fs::write(path("cut.gguf"), &bytes[..bytes.len() * 3 / 5]).unwrap();
    let e = load_error(&path("cut.gguf"));
    assert!(
        e.contains("cut.gguf") && e.contains("truncated") && e.contains("tensor "),
        "{e}"
    );
    // Cut inside the header.
    std::fs::write(path("head.gguf"), &bytes[..200]).unwrap();
    let e = load_error(&path("head.gguf"));
    assert!(e.contains("head.gguf") && e.contains("truncated"), "{e}");

    // Not GGUF at all.
    std::fs::write(path("text.gguf"), b"just some text, not a model").unwrap();
    let e = load_error(&path("text.gguf"));
    assert!(e.contains("not a GGUF file"), "{e}");

    // Another architecture.
    rewrite(&good, &path("llama.gguf"), |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("llama".into());
            }
        }
    });
    let e = load_error(&path("llama.gguf"));
    assert!(
        e.contains("llama.gguf") && e.contains("\"llama\"") && e.contains("qwen3"),
        "{e}"
    );

    // A missing key.
    rewrite(&good, &path("nokey.gguf"), |meta, _| {
        meta.retain(|(k, _)| k != "qwen3.block_count");
    });
    let e = load_error(&path("nokey.gguf"));
    assert!(e.contains("qwen3.block_count"), "{e}");

    // A tensor whose shape disagrees with the metadata.
    rewrite(&good, &path("shape.gguf"), |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "qwen3.feed_forward_length" {
                *v = Value::U32(128);
            }
        }
    });
    let e = load_error(&path("shape.gguf"));
    assert!(
        e.contains("shape.gguf") && e.contains("blk.0.ffn_gate.weight") && e.contains("[192, 64]"),
        "{e}"
    );

    // A NaN block scale in a quantized weight (the second Q8_0 block's).
    rewrite(&good, &path("nan.gguf"), |_, tensors| {
        let (_, t) = tensors
            .iter_mut()
            .find(|(n, _)| n == "blk.0.ffn_up.weight")
            .unwrap();
        assert_eq!(t.dtype(), candle_core::quantized::GgmlDType::Q8_0);
        let mut data = t.data().unwrap().into_owned();
        data[34..36].copy_from_slice(&half::f16::NAN.to_le_bytes());
        *t = candle_core::quantized::ggml_file::qtensor_from_ggml(
            t.dtype(),
            &data,
            t.shape().dims().to_vec(),
            &Device::Cpu,
        )
        .unwrap();
    });
    let e = load_error(&path("nan.gguf"));
    assert!(
        e.contains("nan.gguf")
            && e.contains("blk.0.ffn_up.weight")
            && e.contains("block 1's scale is NaN"),
        "{e}"
    );

    // An unsupported block type: blk.0.ffn_up.weight re-typed as IQ4_XS (23).
    let name = b"blk.0.ffn_up.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor name in the header");
    let type_at = at + name.len() + 4 + 2 * 8;
    let mut retyped = bytes.clone();
    retyped[type_at..type_at + 4].copy_from_slice(&23u32.to_le_bytes());
    std::fs::write(path("iq.gguf"), &retyped).unwrap();
    let e = load_error(&path("iq.gguf"));
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("IQ4_XS"),
        "{e}"
    );
}

#[test]
fn a_gguf_refuses_another_dtype_and_writing_over_a_file() {
    let (_tmp, file) = gguf_of(tiny_dir(), FileType::F32);
    let e = Qwen3::load(&file, &Device::Cpu, Some(Precision::Bf16)).unwrap_err();
    assert!(e.to_string().contains("--dtype bf16"), "{e}");
    let e = write_gguf(
        &ModelFiles::from_dir(tiny_dir()).unwrap(),
        &file,
        FileType::F16,
    )
    .unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    // A folder with two GGUF files asks which one.
    let two = tempfile::tempdir().unwrap();
    std::fs::copy(&file, two.path().join("a.gguf")).unwrap();
    std::fs::copy(&file, two.path().join("b.gguf")).unwrap();
    let e = ModelFiles::from_dir(two.path()).unwrap_err().to_string();
    assert!(e.contains("a.gguf") && e.contains("b.gguf"), "{e}");
    std::fs::remove_file(two.path().join("b.gguf")).unwrap();
    assert_eq!(
        ModelFiles::from_dir(two.path()).unwrap().gguf_file(),
        Some(two.path().join("a.gguf").as_path())
    );
}

#[test]
fn hub_gguf_is_found_by_its_quantization() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--Qwen--Qwen3-4B-GGUF");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "rev1").unwrap();
    let snap = repo.join("snapshots/rev1");
    std::fs::create_dir_all(&snap).unwrap();
    for f in ["Qwen3-4B-Q8_0.gguf", "Qwen3-4B-Q4_K_M.gguf"] {
        std::fs::write(snap.join(f), "x").unwrap();
    }
    let cache = || hf_hub::Cache::new(tmp.path().to_path_buf());
    let files = ModelFiles::gguf_from_hub_cache_at(cache(), "Qwen/Qwen3-4B-GGUF", "q8_0").unwrap();
    assert_eq!(
        files.gguf_file(),
        Some(snap.join("Qwen3-4B-Q8_0.gguf").as_path())
    );
    let e =
        ModelFiles::gguf_from_hub_cache_at(cache(), "Qwen/Qwen3-4B-GGUF", "Q5_K_M").unwrap_err();
    assert!(matches!(e, ModelError::NotInHubCache { .. }), "{e}");
    assert!(e.to_string().contains("Q5_K_M"), "{e}");
}
