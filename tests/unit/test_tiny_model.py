"""tools/make_tiny_model.py: a loadable tiny Llama, deterministic and idempotent."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import safetensors

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_tiny_model.py"
spec = importlib.util.spec_from_file_location("make_tiny_model", TOOL)
tiny = importlib.util.module_from_spec(spec)
sys.modules["make_tiny_model"] = tiny
spec.loader.exec_module(tiny)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny"
    assert tiny.main([str(out)]) == 0
    return out


def test_config_is_the_tiny_llama(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    expected = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 2048,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    assert {k: config[k] for k in expected} == expected


def test_tensor_shapes_and_dtype(model_dir):
    import struct

    raw = (model_dir / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    header.pop("__metadata__")
    assert {v["dtype"] for v in header.values()} == {"BF16"}
    shapes = {k: tuple(v["shape"]) for k, v in header.items()}
    assert shapes == tiny.tensor_shapes(tiny.parameters(tiny_args()))
    assert shapes["model.embed_tokens.weight"] == (2048, 64)
    assert shapes["lm_head.weight"] == (2048, 64)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * 32, 64)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 32, 64)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 4 * 32)
    # The safetensors library reads the hand-written file the same way.
    with safetensors.safe_open(str(model_dir / "model.safetensors"), framework="numpy") as fh:
        names = fh.keys()
        assert set(names) == set(shapes)
        for name in names:
            piece = fh.get_slice(name)
            assert tuple(piece.get_shape()) == shapes[name]
            assert piece.get_dtype() == "BF16"


def test_weights_are_small_random_and_norms_one(model_dir):
    import numpy as np

    raw = (model_dir / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    data = raw[8 + size :]

    def tensor(name):
        start, end = header[name]["data_offsets"]
        bf16 = np.frombuffer(data[start:end], dtype="<u2").astype(np.uint32) << 16
        return bf16.view(np.float32).reshape(header[name]["shape"])

    assert np.all(tensor("model.norm.weight") == 1.0)
    embed = tensor("model.embed_tokens.weight")
    assert 0.015 < float(embed.std()) < 0.025
    assert abs(float(embed.mean())) < 0.002


def test_tokenizer_files_and_chat_template(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 2048
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<pad>")] == [0, 1, 2, 3]
    text = "Hello, world. vLLM serves models on CPUs!"
    assert tok.decode(tok.encode(text).ids) == text
    assert max(tok.encode(text).ids) < 2048
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "messages" in config["chat_template"]
    assert (config["bos_token"], config["eos_token"]) == ("<s>", "</s>")


def test_deterministic_and_idempotent(model_dir, tmp_path, capsys):
    other = tmp_path / "again"
    assert tiny.main([str(other)]) == 0
    assert tiny.digest(other) == tiny.digest(model_dir)
    mtimes = {p.name: p.stat().st_mtime_ns for p in other.iterdir()}
    capsys.readouterr()
    assert tiny.main([str(other)]) == 0
    assert capsys.readouterr().out.startswith("unchanged")
    assert {p.name: p.stat().st_mtime_ns for p in other.iterdir()} == mtimes


def test_other_parameters_rewrite(tmp_path):
    out = tmp_path / "m"
    tiny.main([str(out)])
    first = tiny.digest(out)
    tiny.main([str(out), "--seed", "1"])
    assert tiny.digest(out) != first
    assert json.loads((out / "tiny_model.json").read_text())["parameters"]["seed"] == 1


def test_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        tiny.main([str(tmp_path)])
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def tiny_args():
    import argparse

    return argparse.Namespace(**tiny.DEFAULTS)
