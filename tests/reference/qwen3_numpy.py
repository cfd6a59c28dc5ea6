"""Greedy decoding with a Qwen3 forward written from the architecture alone, in
numpy (float64), sharing no code with aisql or candle: tests/generate_cli.rs
holds `aisql model generate` to the token ids this prints.

    python qwen3_numpy.py MODEL_DIR --prompt-ids 9707,11,1879 --max-tokens 8
    python qwen3_numpy.py MODEL_DIR --prompt-ids 9707,11,151643 --embed [--dims 16]

Reads MODEL_DIR/config.json, every MODEL_DIR/*.safetensors (the format parsed
here: an 8-byte little-endian header length, a JSON header, raw tensors) and the
stop tokens <|im_end|> and <|endoftext|> from MODEL_DIR/tokenizer.json. Every
step is a full forward of the prompt and the tokens so far (no cache); the next
token is the argmax (ties to the lowest id). Prints one JSON object:
{"token_ids": [...], "finish": "stop"|"length", "margins": [...]}, margins being
each step's gap between the best and second-best logit (a near-tie is where
float rounding may pick either).

With --embed it prints {"embedding": [...]} instead: Qwen3-Embedding's
last-token pooling, the final hidden state (after the final norm, no output
head) of the last prompt id, its first --dims components (all by default)
divided by their L2 norm. engine/src/sql/embed_tests.rs holds `ai_embed` to it.

    python qwen3_numpy.py MODEL_DIR --gguf F.gguf --prompt-ids 9707,11 \
        --follow-ids 5,6,7 --finish stop

With --gguf the weights and shape come from a GGUF file instead (read and its
blocks dequantized by llama.cpp's own `gguf` package; MODEL_DIR still gives the
stop tokens). With --follow-ids it does not decode: it follows the given tokens
(another engine's greedy decoding of the same file) and prints
{"gaps": [...], "spreads": [...]}: per step, how far the followed token's logit
falls below the best one (with --finish stop, one more step: the best stop
token's), and the standard deviation of that step's logits. An engine that
rounds activations (Q8_0 quantizes them per 32 values, AMX rounds them to
bfloat16) may part from the exact argmax only where that gap is a small part of
the spread; tests/generate_cli.rs holds `aisql model generate` to it.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


def load_tensors(model_dir):
    """Every tensor of every safetensors file, as float64 arrays."""
    tensors = {}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        sys.exit(f"no *.safetensors in {model_dir}")
    for path in files:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        (header_len,) = struct.unpack("<Q", raw[:8].tobytes())
        header = json.loads(raw[8 : 8 + header_len].tobytes())
        base = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            data = raw[base + begin : base + end]
            dtype = info["dtype"]
            if dtype == "F32":
                values = data.view("<f4")
            elif dtype == "F16":
                values = data.view("<f2")
            elif dtype == "BF16":
                # bfloat16 is the top half of a float32.
                values = (data.view("<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                sys.exit(f"{path}: tensor {name} has dtype {dtype}")
            tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


# GGUF tensor names (llama.cpp's) to the Hugging Face names used here.
GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def load_gguf(path):
    """A Qwen3 GGUF file's tensors (dequantized, float64, Hugging Face names)
    and its shape as a config.json would give it."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    if meta.get("general.architecture") != "qwen3":
        sys.exit(f"{path}: architecture {meta.get('general.architecture')} is not qwen3")
    tensors = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(d) for d in reversed(t.shape)]
        parts = t.name.split(".")
        if parts[0] == "blk":
            name = f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.{parts[3]}"
        else:
            name = {
                "token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight",
            }[t.name]
        tensors[name] = values.reshape(shape)
    a = "qwen3.attention."
    cfg = {
        "hidden_size": meta["qwen3.embedding_length"],
        "intermediate_size": meta["qwen3.feed_forward_length"],
        "num_hidden_layers": meta["qwen3.block_count"],
        "num_attention_heads": meta[a + "head_count"],
        "num_key_value_heads": meta[a + "head_count_kv"],
        "head_dim": meta[a + "key_length"],
        "rope_theta": meta["qwen3.rope.freq_base"],
        "rms_norm_eps": meta[a + "layer_norm_rms_epsilon"],
        "tie_word_embeddings": "lm_head.weight" not in tensors,
    }
    return tensors, cfg


def follow(weights, cfg, prompt, followed, stops, finish):
    """Per step of `followed` (and the stop, when it finished so): the best logit
    minus the followed token's, and the logits' standard deviation."""
    gaps, spreads = [], []
    steps = followed + ([None] if finish == "stop" else [])
    for i, token in enumerate(steps):
        logits = next_logits(weights, cfg, prompt + followed[:i])
        chosen = max(logits[s] for s in stops) if token is None else logits[token]
        gaps.append(float(logits.max() - chosen))
        spreads.append(float(logits.std()))
    return {"gaps": gaps, "spreads": spreads}


def stop_ids(model_dir):
    """Ids of the stop tokens the model's tokenizer.json has."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return set()
    added = json.loads(path.read_text())["added_tokens"]
    return {t["id"] for t in added if t["content"] in STOP_TOKENS}


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, positions, theta):
    """Rotary embedding of x (heads, T, d), halves rotated (rotate_half layout)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = positions[:, None] * inv_freq[None, :]
    cos = np.cos(np.concatenate([angles, angles], axis=-1))
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def linear(w, prefix, x, bias):
    y = x @ w[prefix + ".weight"].T
    return y + w[prefix + ".bias"] if bias else y


def final_hidden(w, cfg, tokens):
    """The final-normed hidden state of the last of `tokens`: one full causal
    forward from position 0."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    bias = cfg.get("attention_bias", False)
    n = len(tokens)
    positions = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        h = rms_norm(x, w[f"{p}.input_layernorm.weight"], eps)
        a = f"{p}.self_attn"
        q = linear(w, f"{a}.q_proj", h, bias).reshape(n, heads, d)
        k = linear(w, f"{a}.k_proj", h, bias).reshape(n, kv_heads, d)
        v = linear(w, f"{a}.v_proj", h, bias).reshape(n, kv_heads, d)
        # Qwen3 normalises each query and key head before the rotation.
        q = rms_norm(q, w[f"{a}.q_norm.weight"], eps).transpose(1, 0, 2)
        k = rms_norm(k, w[f"{a}.k_norm.weight"], eps).transpose(1, 0, 2)
        v = v.transpose(1, 0, 2)
        q, k = rope(q, positions, theta), rope(k, positions, theta)
        # Grouped-query attention: query head i reads KV head i // group.
        group = heads // kv_heads
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
        out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = x + linear(w, f"{a}.o_proj", out, bias)
        h = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], eps)
        m = f"{p}.mlp"
        gate = h @ w[f"{m}.gate_proj.weight"].T
        up = h @ w[f"{m}.up_proj.weight"].T
        silu = gate / (1.0 + np.exp(-gate))
        x = x + (silu * up) @ w[f"{m}.down_proj.weight"].T
    return rms_norm(x[-1], w["model.norm.weight"], eps)


def next_logits(w, cfg, tokens):
    """Logits after the last of `tokens`."""
    last = final_hidden(w, cfg, tokens)
    tied = cfg.get("tie_word_embeddings", False)
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return head @ last


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--embed", action="store_true", help="print the embedding")
    parser.add_argument("--dims", type=int, help="embedding components kept")
    parser.add_argument("--gguf", type=Path, help="read the weights from this GGUF file")
    parser.add_argument("--follow-ids", help="comma-separated generated ids to follow")
    parser.add_argument("--finish", choices=["stop", "length"], default="length")
    args = parser.parse_args()
    if not args.embed and args.max_tokens is None and args.follow_ids is None:
        parser.error("--max-tokens or --follow-ids is required without --embed")
    if args.gguf:
        weights, cfg = load_gguf(args.gguf)
    else:
        cfg = json.loads((args.model_dir / "config.json").read_text())
        if cfg.get("hidden_act", "silu") != "silu":
            sys.exit(f"hidden_act {cfg['hidden_act']} is not implemented here")
        if cfg.get("rope_scaling"):
            sys.exit("rope_scaling is not implemented here")
        weights = load_tensors(args.model_dir)
    stops = stop_ids(args.model_dir)
    tokens = [int(t) for t in args.prompt_ids.split(",")]
    if args.follow_ids is not None:
        followed = [int(t) for t in args.follow_ids.split(",") if t]
        print(json.dumps(follow(weights, cfg, tokens, followed, stops, args.finish)))
        return
    if args.embed:
        h = final_hidden(weights, cfg, tokens)[: args.dims or cfg["hidden_size"]]
        print(json.dumps({"embedding": (h / np.linalg.norm(h)).tolist()}))
        return
    generated, margins, finish = [], [], "length"
    for _ in range(args.max_tokens):
        logits = next_logits(weights, cfg, tokens + generated)
        best = int(np.argmax(logits))  # the first maximum: ties to the lowest id
        top2 = np.partition(logits, -2)[-2:]
        margins.append(float(top2[1] - top2[0]))
        if best in stops:
            finish = "stop"
            break
        generated.append(best)
    print(json.dumps({"token_ids": generated, "finish": finish, "margins": margins}))


if __name__ == "__main__":
    main()
