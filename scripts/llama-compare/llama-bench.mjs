#!/usr/bin/env node
// Prompt-processing (prefill) and decoding benchmark of llama.cpp on the CPU
// through node-llama-cpp (pinned in package.json next to this file), the llama.cpp
// side of scripts/llama-compare.sh.
//
//   node llama-bench.mjs --model M.gguf --threads T --prompt-tokens P --sequences S
//                        [--decode-tokens D] [--rounds N] [--batch-size B] [--seed X]
//                        [--node-dir DIR]
//   node llama-bench.mjs --info [--node-dir DIR]
//
// With --decode-tokens D (decoding, llama-bench's `tg`): every sequence first
// evaluates the same P - 1 prompt ids (not timed; llama.cpp keeps a copy of them
// in each sequence's KV), then, timed, its own last prompt id and D - 1 generated
// tokens with sequence.evaluate (greedy: temperature 0; past an end-of-generation
// token, as a random model may pick, decoding goes on from it), all S sequences at once so
// that node-llama-cpp packs each step's S tokens into one batch: D evaluations of
// one token per sequence, D tokens each. tokens = S * D.
//
// Loads the model on the CPU only (getLlama({gpu: false}), gpuLayers 0, never
// building llama.cpp from source), makes one context of S sequences with a
// per-sequence context size of P + 64 (node-llama-cpp rounds it up to a multiple of
// 256) and batchSize B (default min(P*S, 4096); node-llama-cpp sets llama.cpp's
// n_batch = n_ubatch = B), then evaluates S sequences of P token ids each in
// parallel with sequence.evaluateWithoutGeneratingNewTokens (no logits, no
// sampling). One warm-up evaluation (other token ids) first, not counted; every
// sequence's history is cleared before each measured evaluation, so the KV cache
// starts empty. Prints one JSON object per round (stdout): prompt_tokens,
// sequences, tokens, wall_s, cpu_s (process.cpuUsage() user+sys difference around
// the measured evaluation), tokens_per_s and the settings used.
//
// Token ids: sequence s of round r (r = -1 for the warm-up) gets P ids from a
// splitmix32 stream seeded with (seed, r, s), each 1000 + (x mod 99000), so they
// lie in [1000, 100000) and no two sequences share a prefix.
//
// node-llama-cpp is imported from --node-dir (or $LLAMA_COMPARE_NODE_DIR), the
// --prefix that `npm install` used; without either, by plain package resolution.
import { join, resolve } from "node:path";
import { existsSync, readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { performance } from "node:perf_hooks";

const USAGE = `usage: llama-bench.mjs --model FILE.gguf --threads T --prompt-tokens P --sequences S
                       [--decode-tokens D] [--rounds N] [--batch-size B] [--seed X] [--node-dir DIR]
       llama-bench.mjs --info [--node-dir DIR]`;

function fail(msg) {
  process.stderr.write(`llama-bench.mjs: ${msg}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const opts = { rounds: 1, seed: 0, decodeTokens: 0, info: false, nodeDir: process.env.LLAMA_COMPARE_NODE_DIR || "" };
  const ints = { "--threads": "threads", "--prompt-tokens": "promptTokens", "--sequences": "sequences",
    "--rounds": "rounds", "--batch-size": "batchSize", "--seed": "seed", "--decode-tokens": "decodeTokens" };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") { process.stdout.write(USAGE + "\n"); process.exit(0); }
    if (a === "--info") { opts.info = true; continue; }
    if (i + 1 >= argv.length) fail(`${a} needs a value\n${USAGE}`);
    const v = argv[++i];
    if (a === "--model") opts.model = v;
    else if (a === "--node-dir") opts.nodeDir = v;
    else if (a in ints) {
      if (!/^\d+$/.test(v)) fail(`${a} wants a non-negative integer, not ${JSON.stringify(v)}`);
      opts[ints[a]] = Number(v);
    } else fail(`unknown argument ${a}\n${USAGE}`);
  }
  if (opts.info) return opts;
  for (const k of ["model", "threads", "promptTokens", "sequences"])
    if (opts[k] === undefined) fail(`missing --${k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())}\n${USAGE}`);
  for (const k of ["threads", "promptTokens", "sequences", "rounds"])
    if (opts[k] < 1) fail(`--${k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())} must be at least 1`);
  if (!existsSync(opts.model)) fail(`no model file at ${opts.model}`);
  return opts;
}

async function importNodeLlamaCpp(nodeDir) {
  if (!nodeDir) return { mod: await import("node-llama-cpp"), version: "unknown" };
  const pkgDir = join(resolve(nodeDir), "node_modules", "node-llama-cpp");
  if (!existsSync(join(pkgDir, "package.json")))
    fail(`node-llama-cpp is not installed under ${nodeDir} (npm install --prefix ${nodeDir} node-llama-cpp)`);
  const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
  const entry = pkg.exports?.["."]?.import ?? pkg.main ?? "./dist/index.js";
  return { mod: await import(pathToFileURL(join(pkgDir, entry)).href), version: pkg.version };
}

// splitmix32: small, fast, deterministic; one stream per (seed, round, sequence).
function tokenIds(count, seed, round, seq) {
  let state = (Math.imul(seed + 1, 0x9e3779b9) ^ Math.imul(round + 2, 0x85ebca6b) ^ Math.imul(seq + 3, 0xc2b2ae35)) >>> 0;
  const out = new Array(count);
  for (let i = 0; i < count; i++) {
    state = (state + 0x9e3779b9) >>> 0;
    let z = state;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    z = (z ^ (z >>> 16)) >>> 0;
    out[i] = 1000 + (z % 99000);
  }
  return out;
}

// llama.cpp's own log lines go to stderr so stdout stays JSON only.
function stderrLogger(level, message) {
  process.stderr.write(`[llama.cpp ${level}] ${String(message).replace(/\n$/, "")}\n`);
}

async function loadLlama(mod, maxThreads) {
  return await mod.getLlama({
    gpu: false,
    build: "never", // never compile llama.cpp from source: a missing prebuilt binary is an error
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    // $LLAMA_COMPARE_LOG=info shows llama.cpp's context set-up (n_ctx, n_batch, n_ubatch, flash_attn).
    logLevel: mod.LlamaLogLevel[process.env.LLAMA_COMPARE_LOG || "warn"] ?? mod.LlamaLogLevel.warn,
    logger: stderrLogger,
    maxThreads,
  });
}

// Which ggml/llama shared libraries this process mapped (Linux): names the CPU
// variant (libggml-cpu-<arch>.so) that llama.cpp's backend loader picked.
function loadedGgmlLibraries() {
  try {
    const maps = readFileSync("/proc/self/maps", "utf8");
    const libs = new Set();
    for (const m of maps.matchAll(/\/[^\s]*\/((?:lib)?(?:ggml|llama)[^/\s]*\.(?:so|dylib|node)[^/\s]*)$/gm))
      libs.add(m[1]);
    return [...libs].sort();
  } catch {
    return null;
  }
}

async function info(opts) {
  const { mod, version } = await importNodeLlamaCpp(opts.nodeDir);
  const llama = await loadLlama(mod, 0);
  const out = {
    node_llama_cpp: version,
    llama_cpp_release: llama.llamaCppRelease?.release ?? null,
    build_type: llama.buildType,
    gpu: llama.gpu,
    cpu_math_cores: llama.cpuMathCores,
    system_info: llama.systemInfo,
    loaded_ggml_libraries: loadedGgmlLibraries(),
  };
  await llama.dispose();
  process.stdout.write(JSON.stringify(out) + "\n");
}

async function bench(opts) {
  const { mod, version } = await importNodeLlamaCpp(opts.nodeDir);
  const P = opts.promptTokens, S = opts.sequences, T = opts.threads, D = opts.decodeTokens;
  const batchSize = opts.batchSize || Math.min(P * S, 4096);
  const llama = await loadLlama(mod, T);
  const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0 });
  if (P + D + 1 > model.trainContextSize)
    fail(`--prompt-tokens ${P} + --decode-tokens ${D} do not fit the model's context length ${model.trainContextSize}`);
  const context = await model.createContext({
    sequences: S,
    contextSize: Math.min(P + D + 64, model.trainContextSize),
    batchSize,
    threads: { ideal: T, min: T },
  });
  const seqs = Array.from({ length: S }, () => context.getSequence());

  const evaluate = async (round) => {
    await Promise.all(seqs.map((s) => s.clearHistory()));
    const ids = seqs.map((_, i) => tokenIds(P, opts.seed, round, i));
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    // All S calls are queued in the same event-loop cycle, so node-llama-cpp packs
    // the sequences' tokens into shared batches of up to batchSize tokens.
    await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(ids[i])));
    const wall = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    for (const s of seqs)
      if (s.nextTokenIndex !== P) fail(`a sequence holds ${s.nextTokenIndex} tokens after evaluation, expected ${P}`);
    return { wall, cpu: (cpu.user + cpu.system) / 1e6 };
  };

  const decode = async (round) => {
    await Promise.all(seqs.map((s) => s.clearHistory()));
    // One shared prompt (the ids of sequence 0), each sequence's own last id.
    const shared = tokenIds(P, opts.seed, round, 0).slice(0, P - 1);
    const own = seqs.map((_, i) => tokenIds(1, opts.seed, round, i + 1));
    if (shared.length > 0)
      await Promise.all(seqs.map((s) => s.evaluateWithoutGeneratingNewTokens(shared)));
    const generate = async (s, ids) => {
      let n = 0;
      let next = ids;
      // temperature 0: greedy. Leaving the loop after the D-th token stops the
      // generator before it evaluates that token. A random model may pick an
      // end-of-generation token, which ends the generator: it is yielded, and
      // decoding goes on from it, one evaluation per token as before.
      while (n < D) {
        for await (const token of s.evaluate(next, { temperature: 0, yieldEogToken: true })) {
          next = [token];
          if (++n >= D) break;
        }
      }
      return n;
    };
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const made = await Promise.all(seqs.map((s, i) => generate(s, own[i])));
    const wall = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    if (made.some((n) => n !== D)) fail(`sequences generated ${made.join(", ")} tokens, expected ${D} each`);
    return { wall, cpu: (cpu.user + cpu.system) / 1e6 };
  };

  const measure = D > 0 ? decode : evaluate;
  const tokens = D > 0 ? D * S : P * S;
  await measure(-1); // warm-up, not counted
  for (let r = 0; r < opts.rounds; r++) {
    const { wall, cpu } = await measure(r);
    process.stdout.write(JSON.stringify({
      engine: "llama.cpp",
      prompt_tokens: P,
      sequences: S,
      decode_tokens: D,
      tokens,
      wall_s: wall,
      cpu_s: cpu,
      tokens_per_s: tokens / wall,
      threads: T,
      batch_size: context.batchSize,
      context_size_per_sequence: context.contextSize,
      flash_attention_option: context.flashAttention,
      node_llama_cpp: version,
      llama_cpp_release: llama.llamaCppRelease?.release ?? null,
      model: opts.model,
    }) + "\n");
  }
  await context.dispose();
  await model.dispose();
  await llama.dispose();
}

const opts = parseArgs(process.argv.slice(2));
try {
  await (opts.info ? info(opts) : bench(opts));
} catch (e) {
  fail(e?.stack ?? String(e));
}
