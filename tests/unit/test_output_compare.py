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


# Sampled outputs: judged by their draws [u, lo, hi, cut], not by top-two gaps.

def d(u, lo, hi, cut=None):
    return [u, lo, hi, cut]


def test_sampled_identical_with_the_same_uniforms():
    draws = [d(0.5, 0.4, 0.6), d(0.2, 0.1, 0.3)]
    c = compare_outputs([1, 2], [1, 2], draws=[draws, draws])
    assert c and c.rule == "draws" and c.diverged_at is None


def test_sampled_with_another_uniform_is_a_real_difference_even_with_the_same_tokens():
    a = [d(0.5, 0.4, 0.6), d(0.2, 0.1, 0.3)]
    b = [d(0.5, 0.4, 0.6), d(0.25, 0.1, 0.3)]
    c = compare_outputs([1, 2], [1, 2], draws=[a, b])
    assert not c and c.diverged_at == 1 and "different uniforms at token 1" in c.detail


def test_sampled_same_token_from_another_interval_is_a_real_difference():
    """Same uniform, same token, but another distribution (e.g. a temperature lost in a move)."""
    a = [d(0.5, 0.4, 0.6), d(0.2, 0.1, 0.3)]
    b = [d(0.5, 0.4, 0.6), d(0.2, 0.15, 0.3)]
    c = compare_outputs([1, 2], [1, 2], draws=[a, b])
    assert not c and "different intervals" in c.detail
    # ...unless the cut was within rounding of moving there (the kept set may differ).
    b[1][3] = 1e-6
    assert compare_outputs([1, 2], [1, 2], draws=[a, b])


def test_sampled_parting_is_excused_only_where_the_draw_is_near_a_boundary():
    a = [d(0.5, 0.4, 0.6), d(0.30000001, 0.1, 0.3000001)]
    b = [d(0.5, 0.4, 0.6), d(0.30000001, 0.3000000, 0.4)]
    c = compare_outputs([1, 2], [1, 3], [[9.0, 9.0], [9.0, 9.0]], draws=[a, b])
    assert c and c.diverged_at == 1 and c.near_tie_at == 1 and c.rule == "draws"
    # The same parting with the uniform in the middle of its interval is a real difference,
    # and a near-tie of the top-two logits (meaningless for a draw) does not excuse it.
    a[1], b[1] = d(0.2, 0.1, 0.3), d(0.2, 0.15, 0.35)
    c = compare_outputs([1, 2], [1, 3], [[9.0, 1e-9], [9.0, 1e-9]], draws=[a, b])
    assert not c and c.diverged_at == 1 and "from any CDF boundary" in c.detail
    # A parting at a position whose cut is near moving is excused.
    a[1][3] = 1e-7
    assert compare_outputs([1, 2], [1, 3], draws=[a, b])


def test_a_near_boundary_draw_before_the_parting_does_not_excuse_it():
    a = [d(0.5, 0.49999999, 0.6), d(0.2, 0.1, 0.3)]
    c = compare_outputs([1, 2], [1, 3], draws=[a, a])
    assert not c and c.diverged_at == 1


def test_compare_results_picks_the_rule_from_what_was_recorded():
    from shoal.output_compare import compare_results

    greedy = {"token_ids": [1, 2], "margins": [1.0, 1e-6]}
    assert compare_results(greedy, {"token_ids": [1, 3], "margins": [1.0, 1.0]}).rule == "top-two gap"
    sampled = {"token_ids": [1, 2], "margins": [1.0, 1.0], "draws": [d(0.5, 0.4, 0.6), d(0.2, 0.1, 0.3)]}
    c = compare_results(sampled, {**sampled, "token_ids": [1, 3]})
    assert c.rule == "draws" and not c
