"""benchmarks/copy_confusions.py: a demonstration's first greedy miss and the confused pairs."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from sao_gym.envs.arithmetic.oracle import arithmetic_oracle
from sao_gym.models import COMPACT_TOOLS_TEMPLATE, load_policy, tiny_model
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations
from tests.helpers import import_benchmark


def _reference_miss(model, demo):
    """The first action token whose prefix's argmax differs, one forward pass per prefix."""
    with torch.no_grad():
        for i in range(1, len(demo.token_ids)):
            if not demo.loss_mask[i]:
                continue
            logits = model(input_ids=torch.tensor([demo.token_ids[:i]])).logits
            argmax = int(logits[0, -1].argmax())
            if argmax != demo.token_ids[i]:
                return i, demo.token_ids[i], argmax
    return None


def test_first_misses_and_cosines_match_a_slow_reference(tmp_path):
    cc = import_benchmark("copy_confusions")
    path = tiny_model(tmp_path / "m", seed=0, hidden_size=64, num_layers=1, head_dim=32,
                      chat_template=COMPACT_TOOLS_TEMPLATE, tie_embeddings=False)
    model, _ = load_policy(path)
    tok = AutoTokenizer.from_pretrained(path)
    demos = collect_demonstrations("sao_gym/Arithmetic-v0", tok, arithmetic_oracle, episodes=4,
                                   seed=0, max_new_tokens=32)
    assert cc.first_misses(model, demos) == [_reference_miss(model, d) for d in demos]
    # a random model misses every demonstration; make one pair of tokens parallel
    report = cc.confusions(model, tok, demos)
    assert report["episodes"] == 4 and report["greedy_reproduced"] == 0.0
    assert sum(c["count"] for c in report["confusions"]) == 4 and not report["tied"]
    first = cc.first_misses(model, demos)[0]
    with torch.no_grad():
        model.get_input_embeddings().weight[first[2]] = 3.0 * model.get_input_embeddings(
        ).weight[first[1]]
    again = cc.confusions(model, tok, demos)
    pair = next(c for c in again["confusions"] if c["wanted"] == tok.decode([first[1]]))
    assert abs(pair["embedding_cosine"] - 1.0) < 1e-4  # parallel rows read as cosine 1
    head = model.get_output_embeddings().weight
    expected = torch.nn.functional.cosine_similarity(head[first[1]], head[first[2]], dim=0)
    assert abs(pair["head_cosine"] - float(expected)) < 1e-4
