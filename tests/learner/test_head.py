"""The chunked LM head against full logits: values, gradients, the install check."""

from __future__ import annotations

import pytest
import torch

from sao_gym.learner import head
from sao_gym.learner.batching import token_entropy, token_logprobs


def _reference(hidden, weight, bias, targets, temperature):
    logits = (hidden @ weight.t() + (0 if bias is None else bias)).float() / temperature
    logp = logits.log_softmax(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_head_logprobs_and_gradients_equal_full_logits(rows, temperature, with_bias):
    g = torch.Generator().manual_seed(rows)
    n, h, v = 10, 6, 37
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64, requires_grad=True)
    bias = (torch.randn(v, generator=g, dtype=torch.float64, requires_grad=True)
            if with_bias else None)
    targets = torch.randint(v, (n,), generator=g)
    upstream = torch.randn(n, generator=g, dtype=torch.float64)
    lp, ent = head.head_logprobs(hidden, weight, bias, targets, temperature, rows=rows)
    want_lp, want_ent = _reference(hidden, weight, bias, targets, temperature)
    torch.testing.assert_close(lp.double(), want_lp.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent.double(), want_ent.detach().double(), rtol=1e-6, atol=1e-6)
    assert not ent.requires_grad
    inputs = [hidden, weight] + ([bias] if with_bias else [])
    got = torch.autograd.grad((lp.double() * upstream).sum(), inputs)
    want = torch.autograd.grad((want_lp.double() * upstream).sum(), inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_head_logprobs_gradcheck():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(9, (5,), generator=g)

    def f(hidden, weight):  # the fp32 logits of the forward pass limit the precision
        return head.head_logprobs(hidden, weight, None, targets, 0.9, rows=2)[0]

    assert torch.autograd.gradcheck(f, (hidden, weight), eps=1e-3, atol=1e-3, rtol=1e-3)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\]"):
        head.head_logprobs(torch.zeros(2, 3, 4), torch.zeros(5, 4), None, torch.zeros(2).long())
    with pytest.raises(ValueError, match="targets"):
        head.head_logprobs(torch.zeros(2, 4), torch.zeros(5, 4), None, torch.zeros(3).long())


def test_chunk_rows_follow_the_vocabulary():
    assert head.chunk_rows(49152) == head.LOGIT_BUDGET // 49152
    assert head.chunk_rows(head.LOGIT_BUDGET * 2) == 1


def _tiny(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def test_score_tokens_on_a_model_equals_its_logits(tiny_model_path):
    model = _tiny(tiny_model_path)
    assert head.install(model) and callable(model.score_tokens)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(model.config.vocab_size, (2, 20), generator=g)
    attn = torch.ones_like(ids)
    attn[1, -5:] = 0  # a padded row
    scored = (torch.rand(2, 20, generator=g) < 0.5).long() * attn
    scored[:, 0] = 1  # token 0 has no prediction: never scored
    lp, ent = model.score_tokens(ids, attn, scored, 0.8)
    logits = model(input_ids=ids, attention_mask=attn).logits
    want_lp = token_logprobs(logits, ids, 0.8)
    want_ent = token_entropy(logits, scored * (torch.arange(20) > 0), 0.8)
    sel = scored.bool()
    sel[:, 0] = False
    assert not lp[~sel].any() and not ent[~sel].any()
    torch.testing.assert_close(lp[sel], want_lp[sel], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, want_ent, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(lp.sum(), list(model.parameters()))
    want = torch.autograd.grad((want_lp * sel).sum(), list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), grads, want, strict=True):
        assert b.abs().max() > 0, name  # fp32 sums in another order: relative to the scale
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(b.abs().max()), msg=name)


def test_install_refuses_a_model_whose_logits_differ_from_its_head(tiny_model_path):
    model = _tiny(tiny_model_path)
    forward = model.forward

    def capped(*args, **kwargs):  # soft-capping after the head, as Gemma 2 does
        out = forward(*args, **kwargs)
        out.logits = 5.0 * torch.tanh(out.logits / 5.0)
        return out

    model.forward = capped
    assert not head.install(model)
    assert not hasattr(model, "score_tokens")
    assert not head.install(torch.nn.Linear(3, 3))  # no decoder, no head
