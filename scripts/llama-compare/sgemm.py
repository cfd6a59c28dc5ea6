#!/usr/bin/env python3
"""The machine's f32 GEMM bar for scripts/llama-compare.sh: numpy's sgemm (the
OpenBLAS that numpy's wheels bundle) on exactly the projection GEMMs of one prefill
of the Qwen3-0.6B shape (28 layers of q, k, v, o, gate, up and down; hidden 1024,
16 query and 8 KV heads of 128, MLP 3072), every layer its own weights, rows
= prompt tokens x sequences. Attention, norms and the head are left out, so its
tokens/s is what a prefill would reach if the GEMMs were all it did at numpy's rate.

  python3 sgemm.py --prompt-tokens P --sequences S [--rounds N]

Threads: OPENBLAS_NUM_THREADS (set by the caller). After one uncounted warm-up
pass, prints one JSON line per round like `aisql model bench --format json`:
prompt_tokens, sequences, tokens, wall_s, cpu_s, tokens_per_s.
"""
import argparse
import json
import sys
import time

try:
    import numpy as np
except ImportError:
    sys.exit("sgemm.py: numpy is not installed for " + sys.executable)

LAYERS = 28
# (out, in) of each projection of one layer.
PROJECTIONS = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048),
               (3072, 1024), (3072, 1024), (1024, 3072)]


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=positive, required=True)
    ap.add_argument("--sequences", type=positive, required=True)
    ap.add_argument("--rounds", type=positive, default=1)
    args = ap.parse_args()
    m = args.prompt_tokens * args.sequences
    # Values are irrelevant to the speed (none is subnormal); every layer has its
    # own weights so that they stream from memory as a model's do.
    weights = [[np.full((n, k), 0.01, dtype=np.float32) for n, k in PROJECTIONS]
               for _ in range(LAYERS)]
    inputs = {k: np.full((m, k), 0.5, dtype=np.float32) for _, k in PROJECTIONS}

    def prefill():
        for layer in weights:
            for w in layer:
                inputs[w.shape[1]] @ w.T

    prefill()
    for _ in range(args.rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        prefill()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"prompt_tokens": args.prompt_tokens, "sequences": args.sequences,
                          "tokens": m, "wall_s": wall, "cpu_s": cpu,
                          "tokens_per_s": m / wall}), flush=True)


if __name__ == "__main__":
    main()
