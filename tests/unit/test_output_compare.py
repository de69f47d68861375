from shoal.output_compare import compare_outputs


def test_identical():
    assert compare_outputs([1, 2, 3], [1, 2, 3]).diverged_at is None


def test_divergence_without_near_tie_fails():
    c = compare_outputs([1, 2, 3], [1, 2, 4], [[5.0, 5.0, 5.0]])
    assert not c and c.diverged_at == 2 and "differ at token 2" in c.detail


def test_divergence_after_near_tie_passes():
    c = compare_outputs([1, 2, 3, 9], [1, 2, 4, 7], [[5.0, 1e-5, 5.0, 5.0]])
    assert c and c.near_tie_at == 1 and c.diverged_at == 2


def test_near_tie_after_divergence_does_not_excuse_it():
    assert not compare_outputs([1, 2, 3], [1, 5, 3], [[5.0, 5.0, 1e-6]])


def test_either_runs_margins_count_and_length_mismatch_is_divergence():
    assert compare_outputs([1, 2], [1, 3], [[5.0, 5.0], [5.0, 1e-6]])
    c = compare_outputs([1, 2], [1, 2, 3], [[5.0, 5.0, 5.0]])
    assert not c and c.diverged_at == 2


def test_generations_of_a_program_compare_in_order_until_a_near_tie():
    from shoal.output_compare import compare_generations

    g = lambda toks, m: {"token_ids": toks, "margins": m}  # noqa: E731
    same = [g([1, 2], [1, 1]), g([3, 4], [1, 1])]
    assert compare_generations(same, same).diverged_at is None
    # The second generation differs with no near-tie: a real difference.
    assert not compare_generations(same, [g([1, 2], [1, 1]), g([3, 5], [1, 1])])
    # The first parts after a near-tie: the rest is built from other text and not judged.
    assert compare_generations([g([1, 2], [1, 1e-5]), g([9], [1])], [g([1, 7], [1, 1]), g([3, 4], [1, 1])])
    assert not compare_generations(same, same[:1])
