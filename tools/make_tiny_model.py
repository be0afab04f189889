"""Write a tiny random-weight Llama-style causal LM and its tokenizer, offline.

For tests and demos where no model hub is reachable: vLLM's CPU backend loads and
serves the result (``--dtype bfloat16 --max-model-len 512``), and transformers'
``AutoTokenizer`` / ``PreTrainedTokenizerFast`` load its tokenizer.

Usage::

    python3 tools/make_tiny_model.py .cache/models/tiny-llama
    python3 tools/make_tiny_model.py DIR --seed 1 --vocab-size 4096 --force

What it writes into DIR (about 1 MB):

- ``config.json``: ``LlamaForCausalLM``, hidden size 64, 2 layers, 4 heads, 2 KV
  heads, ``head_dim`` 32 (vLLM's CPU attention supports 32, 64, 80, 96, 112,
  128, 160, 192, 224, 256 and 512), vocab 2048, 512 positions, bfloat16.
- ``model.safetensors``: the weights, stored as BF16 (normal(0, 0.02) from a
  seeded numpy generator, norms at 1.0), written directly in the safetensors
  format so neither torch nor transformers is needed on the controller.
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``:
  a byte-level BPE trained with ``tokenizers`` on a small built-in corpus,
  special tokens ``<unk>`` ``<s>`` ``</s>`` ``<pad>`` (ids 0-3), and a chat
  template (in ``tokenizer_config.json`` and ``chat_template.jinja``).
- ``generation_config.json`` and ``tiny_model.json`` (the parameters it was made
  with).

Deterministic: the same parameters give byte-identical files. Idempotent: when
DIR already holds a complete model made with the same parameters, nothing is
written and the exit status is 0 (prints "unchanged"); ``--force`` rewrites.
Needs numpy and tokenizers (see requirements.txt).
"""

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1  # bump when the files written for the same parameters change

DEFAULTS = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 512,
    "seed": 0,
}

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

CORPUS = """\
vLLM serves large language models with paged attention and continuous batching.
On CPUs it runs with OpenMP threads bound to physical cores, one team per NUMA node.
The KV cache lives in host memory; VLLM_CPU_KVCACHE_SPACE sets its size in GiB.
Ansible turns a fleet of servers into tuned endpoints: facts, plan, build, serve.
A wheelhouse on the controller lets air-gapped hosts install everything offline.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
Hello, world. What is the capital of France? Paris is the capital of France.
user: Tell me a story about a small model. assistant: Once upon a time, a tiny model
answered every request in milliseconds, because it had only two layers.
The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 65536 and symbols {}[]()<>=+-*/%#@!?.
JSON: {"name": "tiny", "layers": 2, "heads": 4, "ok": true, "items": [1, 2, 3]}
def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i)
Les modeles de langue repondent aux questions. Die Sprachmodelle antworten schnell.
"""


def parameters(args):
    """The parameters that decide the output (recorded in tiny_model.json)."""
    params = {key: getattr(args, key) for key in DEFAULTS}
    params["dtype"] = "bfloat16"
    params["format_version"] = FORMAT_VERSION
    return params


def check_parameters(p):
    problems = []
    if p["num_attention_heads"] % p["num_key_value_heads"]:
        problems.append("num_attention_heads must be a multiple of num_key_value_heads")
    if p["vocab_size"] < 256 + len(SPECIAL_TOKENS):
        problems.append(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (byte alphabet + special tokens)")
    for key in DEFAULTS:
        if key != "seed" and p[key] < 1:
            problems.append(f"{key} must be positive")
    return problems


def model_config(p):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": p["hidden_size"],
        "intermediate_size": p["intermediate_size"],
        "num_hidden_layers": p["num_hidden_layers"],
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "head_dim": p["head_dim"],
        "vocab_size": p["vocab_size"],
        "max_position_embeddings": p["max_position_embeddings"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": "bfloat16",
    }


def tensor_shapes(p):
    """Name -> shape of every weight, in the layout of transformers' LlamaForCausalLM."""
    h, inter, d = p["hidden_size"], p["intermediate_size"], p["head_dim"]
    q_out, kv_out = p["num_attention_heads"] * d, p["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (p["vocab_size"], h)}
    for i in range(p["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes.update(
            {
                layer + "input_layernorm.weight": (h,),
                layer + "self_attn.q_proj.weight": (q_out, h),
                layer + "self_attn.k_proj.weight": (kv_out, h),
                layer + "self_attn.v_proj.weight": (kv_out, h),
                layer + "self_attn.o_proj.weight": (h, q_out),
                layer + "post_attention_layernorm.weight": (h,),
                layer + "mlp.gate_proj.weight": (inter, h),
                layer + "mlp.up_proj.weight": (inter, h),
                layer + "mlp.down_proj.weight": (h, inter),
            }
        )
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (p["vocab_size"], h)
    return shapes


def to_bf16_bytes(array):
    """float32 -> bfloat16 (round to nearest even), little-endian bytes."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path, tensors, metadata):
    """Write {name: (shape, raw BF16 bytes)} in the safetensors format (sorted, aligned header)."""
    header, offset = {"__metadata__": metadata}, 0
    for name in sorted(tensors):
        shape, raw = tensors[name]
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for name in sorted(tensors):
            fh.write(tensors[name][1])


def make_weights(p):
    rng = np.random.default_rng(p["seed"])
    tensors = {}
    # Drawn in a fixed (sorted) order so the bytes depend only on the parameters.
    for name, shape in sorted(tensor_shapes(p).items()):
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        tensors[name] = (shape, to_bf16_bytes(values))
    return tensors


def make_tokenizer(p):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=p["vocab_size"],
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(p["seed"]), trainer=trainer)
    # A small corpus may run out of merges: fill the vocabulary up with plain added
    # tokens so that every id the model can emit decodes to something.
    missing = p["vocab_size"] - tokenizer.get_vocab_size()
    if missing > 0:
        tokenizer.add_tokens([f"<extra_{i}>" for i in range(missing)])
    return tokenizer


def training_text(seed):
    """The built-in corpus, its case variants and seeded pseudo-words (enough merges for 2048)."""
    lines = CORPUS.splitlines()
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "sh", "ch", "qu", "st", "ng"]
    words = [
        "".join(syllables[i] for i in rng.integers(0, len(syllables), size=int(n)))
        for n in rng.integers(1, 5, size=6000)
    ]
    sentences = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    return lines + [line.lower() for line in lines] + [line.upper() for line in lines] + sentences


def tokenizer_config(p):
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": p["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }


def digest(directory):
    """sha256 over every file of a model directory (names and contents)."""
    h = hashlib.sha256()
    for path in sorted(Path(directory).iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def is_complete(out, params):
    marker = out / "tiny_model.json"
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("parameters") == params and all((out / f).is_file() for f in recorded.get("files", []))


def generate(out, params):
    """Write the model into ``out`` (atomically: a sibling temp dir renamed into place)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(model_config(params), indent=2, sort_keys=True) + "\n")
        generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "do_sample": False}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
        write_safetensors(tmp / "model.safetensors", make_weights(params), {"format": "pt"})
        make_tokenizer(params).save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(params), indent=2) + "\n")
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
        (tmp / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
        files = sorted(f.name for f in tmp.iterdir())
        marker = {"parameters": params, "files": [*files, "tiny_model.json"]}
        (tmp / "tiny_model.json").write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / "model")
            tmp.rename(out)
            for f in (old / "model").iterdir():
                f.unlink()
            (old / "model").rmdir()
            old.rmdir()
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("output", help="directory to write the model into")
    for key, value in DEFAULTS.items():
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=value)
    parser.add_argument("--force", action="store_true", help="rewrite even when an identical model is there")
    args = parser.parse_args(argv)
    params = parameters(args)
    problems = check_parameters(params)
    if problems:
        parser.error("; ".join(problems))
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        parser.error(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "tiny_model.json").exists():
        parser.error(f"{out} is not empty and holds no tiny_model.json: refusing to overwrite it")
    if not args.force and is_complete(out, params):
        print(f"unchanged: {out}")
        return 0
    generate(out, params)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size / 1e6:.1f} MB, sha256 {digest(out)[:16]})")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
