"""sao_gym.utils.tensors: which tensors of two nested state dicts differ."""

import torch

from sao_gym.utils.tensors import differing, tensors


def test_differing_names_changed_missing_and_extra_tensors_by_path():
    a = {"w": torch.ones(2), "opt": {"state": {0: {"m": torch.zeros(3)}}, "groups": [1]},
         "list": [torch.ones(1), torch.ones(1)], "n": 3}
    b = {"w": torch.ones(2), "opt": {"state": {0: {"m": torch.zeros(3)}}, "groups": [1]},
         "list": [torch.ones(1), torch.ones(1)], "n": 4}
    assert sorted(dict(tensors(a))) == ["/list/0", "/list/1", "/opt/state/0/m", "/w"]
    assert differing(a, b) == []  # non-tensors are not compared
    b["opt"]["state"][0]["m"] = torch.tensor([0.0, 0.0, 1e-30])  # one ulp-sized change
    b["list"].append(torch.ones(1))
    del b["w"]
    assert differing(a, b) == ["/list/2", "/opt/state/0/m", "/w"]
    # bits, not values: signed zeros differ, a NaN equals itself, dtypes and shapes count
    assert differing({"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])}) == ["/x"]
    nan = torch.tensor([float("nan")])
    assert differing({"x": nan}, {"x": nan.clone()}) == []
    assert differing({"x": torch.ones(2)}, {"x": torch.ones(2, dtype=torch.float64)}) == ["/x"]
    assert differing({"x": torch.ones(2)}, {"x": torch.ones(1, 2)}) == ["/x"]
    assert differing({"s": torch.tensor(3)}, {"s": torch.tensor(3)}) == []  # 0-d
