"""A hostile config.json gets one line and exit 2 from `plan`, never a hang or a traceback."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orkpack.cli import app

BASE = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "vocab_size": 10}


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ({**BASE, "num_hidden_layers": 100_000_000}, "beyond any real model"),
        ({**BASE, "model_type": "qwen3_moe", "num_hidden_layers": 4000, "num_experts": 60000, "num_experts_per_tok": 2, "moe_intermediate_size": 8}, "beyond any real model"),
        ({**BASE, "num_hidden_layers": "2"}, "not a non-negative integer"),
        ({**BASE, "hidden_size": -1}, "not a non-negative integer"),
        ([1, 2], "not a JSON object"),
        ("deep", "config.json"),
    ],
)
def test_hostile_config(tmp_path, cfg, needle):
    p = tmp_path / "config.json"
    p.write_text("[" * 100000 + "]" * 100000 if cfg == "deep" else json.dumps(cfg))
    r = CliRunner().invoke(app, ["plan", str(p)])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
