"""tools/gil_share.py: GIL-held ms per turn from py-spy's raw GIL samples, the rollout's threads only."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import gil_share  # noqa: E402


def test_counts_only_the_rollouts_threads_per_turn(tmp_path, capsys):
    samples = tmp_path / "gil.txt"
    samples.write_text(
        "<module> (sim_scale.py:1);_qwen25 (swe_megatron/model/tokenizer.py:109) 500\n"  # setup: not counted
        "run (threading.py:1);rollout_one (swe_megatron/rollout/rollouts.py:354);"
        "decode (swe_megatron/agent/tokens.py:88) 30\n"
        "run (threading.py:1);post (swe_megatron/engine/vllm.py:114);request (http/client.py:1) 20\n"
    )
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"levels": [{"turns": 100}, {"turns": 400}]}))
    gil_share.main([str(samples), str(sim), "--rate", "50"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "rollout threads held the GIL 1.0 s over 500 turns: 2.00 ms a turn", out
    assert out[1].split() == ["1.20", "ms/turn", "decode", "(swe_megatron/agent/tokens.py:88)"], out
    assert out[2].split()[:3] == ["0.80", "ms/turn", "post"], out
