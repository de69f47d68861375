import torch

from shoal.nodes.worker.sampler import sample, sequence_key, uniform
from shoal.sampling import SamplingParams


def test_uniform_is_a_pure_function_of_its_key():
    k = sequence_key("seq-1")
    assert uniform(1, k, 0, 5) == uniform(1, k, 0, 5)
    draws = {uniform(1, k, 0, p) for p in range(1000)}
    assert len(draws) == 1000 and all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / 1000 - 0.5) < 0.05
    assert uniform(2, k, 0, 5) != uniform(1, k, 0, 5) != uniform(1, k, 1, 5)


def test_top_k_one_is_greedy_and_top_p_keeps_the_head():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    for u in (0.0, 0.5, 0.999):
        assert sample(logits, [SamplingParams(temperature=1.0, top_k=1)], [u])[0] == [1]
        # p(1) ~ 0.64 < 0.7: top_p 0.7 keeps tokens 1 and 3 only.
        assert sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)], [u])[0][0] in (1, 3)


def test_inverse_cdf_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    p = SamplingParams(temperature=1.0)
    assert sample(logits, [p], [0.1])[0] == [0]
    assert sample(logits, [p], [0.6])[0] == [1]
    assert sample(logits, [p], [0.9])[0] == [2]


def test_margins_are_top_two_gaps():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 4.5, 0.0]])
    _, m = sample(logits, [SamplingParams(return_margins=True)] * 2, [0.0, 0.0])
    assert torch.allclose(m, torch.tensor([2.0, 0.5]))
