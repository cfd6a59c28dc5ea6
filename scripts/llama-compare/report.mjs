#!/usr/bin/env node
// Summarises scripts/llama-compare.sh's results.jsonl as a Markdown table: per case
// (prompt tokens x sequences, + tokens decoded per sequence) and system, in the order first seen, the medians over
// rounds of tokens/s, CPU seconds per 1,000 tokens and CPU utilisation
// (cpu_s / wall_s), with the tokens/s range.
//
//   node report.mjs results.jsonl
import { readFileSync } from "node:fs";

const file = process.argv[2];
if (!file) {
  process.stderr.write("usage: report.mjs results.jsonl\n");
  process.exit(2);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (x, digits) => (Number.isFinite(x) ? x.toFixed(digits) : "n/a");

const groups = new Map();
readFileSync(file, "utf8").split("\n").forEach((line, i) => {
  if (!line.trim()) return;
  let r;
  try {
    r = JSON.parse(line);
  } catch (e) {
    process.stderr.write(`report.mjs: ${file}:${i + 1}: not JSON (${e.message})\n`);
    process.exit(1);
  }
  const key = `${r.case}\u0000${r.system}`;
  if (!groups.has(key)) groups.set(key, { case: r.case, system: r.system, rows: [] });
  groups.get(key).rows.push(r);
});

const out = [
  "| case (prompt tokens x seqs [+ decoded per seq]) | system | tokens/s (median) | tokens/s (min-max) | CPU s / 1k tokens | CPU util | rounds |",
  "|---|---|---:|---:|---:|---:|---:|",
];
let lastCase = null;
for (const g of groups.values()) {
  const tps = g.rows.map((r) => r.tokens_per_s);
  const cpuPerK = g.rows.map((r) => (1000 * r.cpu_s) / r.tokens);
  const util = g.rows.map((r) => r.cpu_s / r.wall_s);
  out.push(`| ${g.case === lastCase ? "" : g.case} | ${g.system} | ${fmt(median(tps), 0)} | ` +
    `${fmt(Math.min(...tps), 0)}-${fmt(Math.max(...tps), 0)} | ${fmt(median(cpuPerK), 3)} | ` +
    `${fmt(median(util), 2)} | ${g.rows.length} |`);
  lastCase = g.case;
}
process.stdout.write(out.join("\n") + "\n");
