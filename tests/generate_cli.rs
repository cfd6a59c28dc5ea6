//! `aisql model generate` held to an independent Qwen3: the numpy forward of
//! `tests/reference/qwen3_numpy.py` (float64, no cache, no code shared with aisql
//! or candle) must pick the same greedy tokens for the same model and prompt
//! token ids. Also the command's text output and usage errors, and the model
//! commands around GGUF files: `model gguf` writes one, `--model F.gguf` runs it
//! in `model generate` and `sql`, `model bench` times prefill. Q8_0 GGUF files are
//! held to the same reference on the file's dequantized weights (read by
//! llama.cpp's `gguf` package): the decode kernels round activations, so there the
//! check is that each generated token's logit is the best up to a small part of
//! the logits' spread.

mod common;

use std::path::Path;

use common::cli::aisql;
use serde_json::Value;

const MAX_TOKENS: usize = 8;

/// Prompts: plain text, a QUAIL-B style cue, and a chat turn whose control
/// tokens are read as such.
const PROMPTS: [&str; 3] = [
    "Hello, world",
    "DOCUMENT:\nThe film was long, but the ending paid for it.\nANSWER:",
    "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
];

/// `aisql model tiny --seed 3 --out DIR`.
fn write_tiny(dir: &Path) {
    aisql()
        .args(["model", "tiny", "--seed", "3", "--out"])
        .arg(dir)
        .assert()
        .success();
}

/// `aisql model generate --format json` on the model in `dir`.
fn generate(dir: &Path, prompt: &str) -> Value {
    generate_up_to(dir, prompt, MAX_TOKENS)
}

/// `aisql model generate --format json --max-tokens N` on the model `model` (a
/// folder or a GGUF file).
fn generate_up_to(model: &Path, prompt: &str, max_tokens: usize) -> Value {
    let out = aisql()
        .args([
            "model", "generate", "--cpu", "--format", "json", "--prompt", prompt,
        ])
        .arg("--model")
        .arg(model)
        .args(["--max-tokens", &max_tokens.to_string()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}",
            String::from_utf8_lossy(&out)
        )
    })
}

/// The numpy reference's greedy decoding of `prompt_ids` on the model in `dir`.
fn numpy_generate(dir: &Path, prompt_ids: &[u64]) -> Value {
    let python = common::test_python("numpy", "numpy 2.4.6");
    reference(&python, dir, |c| {
        c.args(["--prompt-ids", &joined(prompt_ids)])
            .args(["--max-tokens", &MAX_TOKENS.to_string()]);
    })
}

/// `tests/reference/qwen3_numpy.py DIR ...` run by `python`, with the arguments
/// `args` adds; its JSON output.
fn reference(python: &Path, dir: &Path, args: impl FnOnce(&mut std::process::Command)) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/qwen3_numpy.py");
    let mut command = std::process::Command::new(python);
    command.arg(script).arg(dir);
    args(&mut command);
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "qwen3_numpy.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Token ids as the reference takes them: `1,2,3`.
fn joined(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Every prompt decodes to the numpy reference's tokens, stopping the same way.
fn check_against_numpy(dir: &Path) {
    for prompt in PROMPTS {
        let ours = generate(dir, prompt);
        let prompt_ids = ids(&ours["prompt_token_ids"]);
        assert!(!prompt_ids.is_empty(), "{ours}");
        let reference = numpy_generate(dir, &prompt_ids);
        assert_eq!(
            (ids(&ours["token_ids"]), &ours["finish"]),
            (ids(&reference["token_ids"]), &reference["finish"]),
            "prompt {prompt:?}: aisql (left) and the numpy reference (right) differ; the \
             reference's best-minus-second logit per step: {}",
            reference["margins"]
        );
        assert!(ours["text"].is_string(), "{ours}");
        eprintln!(
            "{prompt:?}: {} tokens ({}), margins {}",
            ids(&ours["token_ids"]).len(),
            ours["finish"],
            reference["margins"]
        );
    }
}

/// `aisql model gguf --type q8_0` of the model in `dir`.
fn write_q8_gguf(dir: &Path, out: &Path) {
    aisql()
        .args(["model", "gguf", "--type", "q8_0", "--model"])
        .arg(dir)
        .arg("--out")
        .arg(out)
        .assert()
        .success();
}

/// Every prompt's greedy decoding of the Q8_0 file `gguf` (made from the model in
/// `dir`), followed by the numpy reference on the file's dequantized weights: each
/// token, and the stop when there is one, within a tenth of the logits' standard
/// deviation of the reference's best (a token the kernels got wrong falls several
/// deviations short).
fn check_q8_against_numpy(dir: &Path, gguf: &Path) {
    const STEPS: usize = 12;
    let python = common::test_python("gguf", "numpy 2.4.6 and gguf 0.19.0");
    let mut exact = 0;
    for prompt in PROMPTS {
        let ours = generate_up_to(gguf, prompt, STEPS);
        let finish = ours["finish"].as_str().unwrap().to_string();
        let reference = reference(&python, dir, |c| {
            c.arg("--gguf")
                .arg(gguf)
                .args(["--prompt-ids", &joined(&ids(&ours["prompt_token_ids"]))])
                .args(["--follow-ids", &joined(&ids(&ours["token_ids"]))])
                .args(["--finish", &finish]);
        });
        let gaps = reference["gaps"].as_array().unwrap();
        let spreads = reference["spreads"].as_array().unwrap();
        let steps = ids(&ours["token_ids"]).len() + usize::from(finish == "stop");
        assert_eq!(gaps.len(), steps, "{reference}");
        for (step, (gap, spread)) in gaps.iter().zip(spreads).enumerate() {
            let (gap, spread) = (gap.as_f64().unwrap(), spread.as_f64().unwrap());
            assert!(
                gap <= 0.1 * spread,
                "prompt {prompt:?}, step {step}: aisql's token is {gap} below the reference's \
                 best logit (spread {spread}); aisql: {ours}"
            );
            exact += usize::from(gap == 0.0);
        }
        eprintln!("{prompt:?}: {steps} steps ({finish}), gaps {gaps:?}");
    }
    // Not every step may land on the exact argmax, but most must.
    assert!(
        exact >= PROMPTS.len() * 2,
        "{exact} steps on the reference's argmax"
    );
}

#[test]
fn q8_0_gguf_generation_follows_the_numpy_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = tmp.path().join("tiny");
    write_tiny(&tiny);
    write_q8_gguf(&tiny, &tmp.path().join("tiny-q8.gguf"));
    check_q8_against_numpy(&tiny, &tmp.path().join("tiny-q8.gguf"));
    let gqa = tmp.path().join("gqa");
    aisql_models::tiny::write_model(&gqa, &gqa_untied_config(), 5).unwrap();
    write_q8_gguf(&gqa, &tmp.path().join("gqa-q8.gguf"));
    check_q8_against_numpy(&gqa, &tmp.path().join("gqa-q8.gguf"));
}

#[test]
fn tiny_model_generation_equals_numpy_reference() {
    let tmp = tempfile::tempdir().unwrap();
    write_tiny(tmp.path());
    check_against_numpy(tmp.path());
}

/// Untied output head, 8 query heads over 2 KV heads, head_dim 32 while
/// hidden / heads is 8: the shapes the tiny model does not exercise.
#[test]
fn gqa_untied_model_generation_equals_numpy_reference() {
    let tmp = tempfile::tempdir().unwrap();
    aisql_models::tiny::write_model(tmp.path(), &gqa_untied_config(), 5).unwrap();
    check_against_numpy(tmp.path());
}

/// Untied output head, 8 query heads over 2 KV heads, head_dim 32 while
/// hidden / heads is 8.
fn gqa_untied_config() -> aisql_models::Config {
    aisql_models::Config {
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 3,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 32,
        rope_theta: 10_000.0,
        tie_word_embeddings: false,
        ..aisql_models::tiny::tiny_config()
    }
}

#[test]
fn text_output_and_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    aisql_models::tiny::write_tiny_model(tmp.path(), 3).unwrap();
    let run = |args: &[&str]| {
        let mut c = aisql();
        c.args(["model", "generate", "--model"])
            .arg(tmp.path())
            .args(args);
        c
    };
    // The text format prints the JSON's text.
    let json = generate(tmp.path(), PROMPTS[0]);
    let text = run(&["--prompt", PROMPTS[0], "--max-tokens", "8"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        String::from_utf8(text).unwrap(),
        format!("{}\n", json["text"].as_str().unwrap())
    );
    let usage = |args: &[&str], says: &str| {
        let out = run(args).assert().code(2).get_output().stderr.clone();
        let stderr = String::from_utf8_lossy(&out);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    usage(&["--prompt", "hi", "--max-tokens", "0"], "--max-tokens");
    // The tiny model's context is 40960 positions; "hi" is one token.
    usage(
        &["--prompt", "hi", "--max-tokens", "40960"],
        "--max-tokens 40960: the 1-token prompt and the new tokens exceed the model's \
         context of 40960 positions; at most 40959 new tokens fit",
    );
    usage(&["--prompt", ""], "--prompt is empty");
    usage(&["--prompt", "hi", "--format", "xml"], "--format");
}

/// `aisql model gguf` then the GGUF as `--model`: an f32 GGUF generates and answers
/// exactly as its safetensors twin; a Q8_0 GGUF and `--dtype q8_0` run; the
/// writing command refuses to write over a file or without a .gguf name.
#[test]
fn gguf_files_are_written_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    write_tiny(&dir);
    let write = |kind: &str, name: &str| {
        let out = tmp.path().join(name);
        aisql()
            .args(["model", "gguf", "--type", kind, "--model"])
            .arg(&dir)
            .arg("--out")
            .arg(&out)
            .assert()
            .success();
        out
    };
    let f32_file = write("f32", "tiny-f32.gguf");
    let q8_file = write("q8_0", "tiny-q8.gguf");
    for prompt in PROMPTS {
        assert_eq!(
            ids(&generate(&f32_file, prompt)["token_ids"]),
            ids(&generate(&dir, prompt)["token_ids"]),
            "{prompt}"
        );
    }
    assert_eq!(
        generate(&q8_file, PROMPTS[1])["prompt_token_ids"],
        generate(&dir, PROMPTS[1])["prompt_token_ids"]
    );

    let docs = tmp.path().join("docs.csv");
    std::fs::write(
        &docs,
        "id,body\n1,A warm and funny film.\n2,Dull.\n3,I loved every minute.\n4,Never again.\n",
    )
    .unwrap();
    let sql = |model: &Path, dtype: Option<&str>| -> String {
        let mut c = aisql();
        c.args(["sql", "--format", "csv", "--table"])
            .arg(format!("docs={}", docs.display()))
            .arg("--model")
            .arg(model);
        if let Some(d) = dtype {
            c.args(["--dtype", d]);
        }
        let out = c
            .arg("SELECT id, ai_filter('Is the review {0} positive?', body) AS yes FROM docs ORDER BY id")
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        String::from_utf8(out).unwrap()
    };
    let reference = sql(&dir, None);
    assert_eq!(reference.lines().count(), 5, "{reference}");
    assert_eq!(sql(&f32_file, None), reference);
    assert_eq!(sql(&q8_file, None).lines().count(), 5);
    assert_eq!(sql(&dir, Some("q8_0")).lines().count(), 5);

    // Bad requests: an existing file, a name without .gguf, an unknown type, a
    // --dtype other than f32 for a GGUF.
    let refused = |args: &[&str], out: &Path, code: i32, says: &str| {
        let o = aisql()
            .args(["model", "gguf", "--model"])
            .arg(&dir)
            .args(args)
            .arg("--out")
            .arg(out)
            .assert()
            .code(code)
            .get_output()
            .stderr
            .clone();
        let stderr = String::from_utf8_lossy(&o);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    let before = std::fs::read(&q8_file).unwrap();
    refused(&["--type", "f16"], &q8_file, 1, "exists");
    assert_eq!(std::fs::read(&q8_file).unwrap(), before);
    refused(
        &["--type", "f16"],
        &tmp.path().join("model.bin"),
        2,
        "*.gguf",
    );
    refused(&["--type", "q3"], &tmp.path().join("x.gguf"), 2, "q4_k_m");
    let o = aisql()
        .args([
            "model", "generate", "--prompt", "hi", "--dtype", "bf16", "--model",
        ])
        .arg(&q8_file)
        .assert()
        .failure()
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8_lossy(&o).contains("--dtype bf16 with a GGUF model"));
}

/// `aisql model bench --format json`: one object per round, tokens = prompts ×
/// their length, CPU seconds measured.
#[test]
fn model_bench_reports_each_round() {
    let tmp = tempfile::tempdir().unwrap();
    write_tiny(tmp.path());
    let out = aisql()
        .args([
            "model",
            "bench",
            "--prompt-tokens",
            "40",
            "--sequences",
            "3",
            "--rounds",
            "2",
            "--format",
            "json",
            "--dtype",
            "q8_0",
            "--model",
        ])
        .arg(tmp.path())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rounds: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rounds.len(), 2);
    for r in &rounds {
        assert_eq!(r["tokens"], 120);
        assert_eq!(r["weights"], "q8_0");
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["cpu_s"].as_f64().is_some(), "{r}");
    }
    // Decoding: 5 tokens for each of 3 sequences over one cached 40-token prompt.
    let out = aisql()
        .args([
            "model",
            "bench",
            "--prompt-tokens",
            "40",
            "--sequences",
            "3",
        ])
        .args([
            "--decode-tokens",
            "5",
            "--rounds",
            "1",
            "--format",
            "json",
            "--model",
        ])
        .arg(tmp.path())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let r: Value = serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap();
    assert_eq!(r["tokens"], 15, "{r}");
    assert_eq!(r["decode_tokens"], 5, "{r}");
    assert!(r["minor_faults"].as_u64().is_some(), "{r}");
}
