"""The rule engine's patterns (``passes/rules.py``): what a pattern binds, where a miss is said to
be, and which misses a rule reports as near misses. Graphs are real ATen graphs (``make_fx``)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ssmcc.passes.rules import (
    CASTS,
    RMS_DENOMINATOR,
    Either,
    Match,
    NodeRule,
    Reject,
    Through,
    Var,
    accept,
    apply_rules,
    match,
    op,
    rms_constraints,
    rms_normalised,
)

aten = torch.ops.aten


def _graph(function, *inputs) -> torch.fx.Graph:
    return make_fx(function)(*inputs).graph


def _nodes(graph, target) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.target == target]


def _norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_a_pattern_binds_operands_by_position_and_by_schema_name():
    graph = _graph(_norm, torch.randn(2, 3))
    (rsqrt,) = _nodes(graph, aten.rsqrt.default)
    found = match(RMS_DENOMINATOR, rsqrt)
    assert isinstance(found, Match) and found.root is rsqrt and found["rsqrt"] is rsqrt
    assert found["x"].op == "placeholder"
    assert (found["exponent"], found["dims"], found["keepdim"], found["eps"]) == (
        2,
        [-1],
        True,
        1e-6,
    )
    assert rms_constraints(found) is True


def test_a_name_met_twice_must_be_one_value():
    same = _graph(_norm, torch.randn(2, 3))
    other = _graph(
        lambda x, y: x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6),
        torch.randn(2, 3),
        torch.randn(2, 3),
    )
    (mul,) = _nodes(same, aten.mul.Tensor)
    assert isinstance(match(rms_normalised(), mul), Match)
    (mul,) = _nodes(other, aten.mul.Tensor)
    missed = match(rms_normalised(), mul)
    assert isinstance(missed, Reject)
    assert "%pow_1 operand 0" in missed.reason and "is not x" in missed.reason, missed.reason


def test_commutative_operands_match_in_either_order():
    graph = _graph(
        lambda x: torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x, torch.randn(2, 3)
    )
    (mul,) = _nodes(graph, aten.mul.Tensor)
    assert isinstance(match(rms_normalised(), mul), Match)
    strict = op(aten.mul.Tensor, Var("x"), RMS_DENOMINATOR)  # not commutative
    assert isinstance(match(strict, mul), Reject)


def test_a_miss_says_where_and_what_was_found():
    graph = _graph(
        lambda x: x * torch.rsqrt(x.abs().mean(-1, keepdim=True) + 1e-6), torch.randn(2, 3)
    )
    (rsqrt,) = _nodes(graph, aten.rsqrt.default)
    missed = match(RMS_DENOMINATOR, rsqrt)
    # the pattern's own words for the op that differs, at the node it read
    assert missed.reason == "%mean operand 0: the mean is not of a power", missed.reason
    unnamed = op(aten.rsqrt.default, op(aten.add.Tensor, op(aten.sub.Tensor), Var()))
    assert "expected sub.Tensor, found %mean (mean.dim)" in match(unnamed, rsqrt).reason


def test_constants_must_be_equal():
    graph = _graph(lambda x: x + 2.0, torch.randn(3))
    (add,) = _nodes(graph, aten.add.Tensor)
    assert isinstance(match(op(aten.add.Tensor, Var("x"), 2.0), add), Match)
    assert "expected 3.0, found constant 2.0" in match(op(aten.add.Tensor, Var(), 3.0), add).reason
    # a named operand the call leaves out is its schema default
    assert isinstance(match(op(aten.add.Tensor, Var(), Var(), alpha=1), add), Match)
    assert isinstance(match(op(aten.add.Tensor, Var(), Var(), alpha=2), add), Reject)


def test_through_looks_through_casts_and_either_keeps_the_nearest_miss():
    graph = _graph(lambda x: x.to(torch.float64).to(torch.float32).neg(), torch.randn(3))
    (neg,) = _nodes(graph, aten.neg.default)
    pattern = op(aten.neg.default, Through(CASTS, Var("x"), bind="casts"))
    found = match(pattern, neg)
    assert found["x"].op == "placeholder" and len(found["casts"]) == 2
    # two alternatives: the one that read further is the miss reported
    near = op(aten._to_copy.default, op(aten.sin.default), why="near")
    far = op(aten.exp.default, why="far")
    missed = match(op(aten.neg.default, Either((far, near))), neg)
    assert missed.reason.endswith("expected sin.default, found %_to_copy (_to_copy.default)"), (
        missed.reason
    )


def test_one_user_refuses_a_value_read_elsewhere():
    def shared(x):
        y = x.sin()
        return y.neg(), y

    graph = _graph(shared, torch.randn(3))
    (neg,) = _nodes(graph, aten.neg.default)
    loose = op(aten.neg.default, op(aten.sin.default, Var()))
    strict = op(aten.neg.default, op(aten.sin.default, Var(), one_user=True))
    assert isinstance(match(loose, neg), Match)
    assert "also read elsewhere" in match(strict, neg).reason


def test_apply_rules_rewrites_and_reports_only_candidates():
    def double_negations(x):
        return x.neg().neg() + x.sin().neg()

    module = make_fx(double_negations)(torch.randn(3))
    graph = module.graph

    def cancel(found: Match) -> None:
        found.root.replace_all_uses_with(found["x"])

    pattern = op(aten.neg.default, op(aten.neg.default, Var("x"), bind="inner"))
    quiet = NodeRule("double_neg", pattern, accept, cancel, candidate="inner")
    hits, rejections = apply_rules(graph, [quiet])
    graph.eliminate_dead_code()
    module.recompile()
    assert hits == {"double_neg": 1}
    # the lone neg of sin(x) and the inner neg are not candidates: nothing said about them
    assert rejections == {}
    x = torch.randn(3)
    torch.testing.assert_close(module(x), x - x.sin())

    noisy = NodeRule("double_neg", pattern, accept, cancel)
    _, rejections = apply_rules(make_fx(double_negations)(torch.randn(3)).graph, [noisy])
    assert any("expected neg.default" in r for r in rejections["double_neg"]), rejections


def test_a_check_rejection_is_reported_with_the_node():
    graph = _graph(lambda x: x.neg().neg(), torch.randn(3))
    pattern = op(aten.neg.default, op(aten.neg.default, Var("x"), bind="inner"))
    rule = NodeRule(
        "double_neg",
        pattern,
        lambda m: Reject("kept on purpose"),
        lambda m: None,
        candidate="inner",
    )
    hits, rejections = apply_rules(graph, [rule])
    assert not hits and rejections == {"double_neg": ["neg_1: kept on purpose"]}


def test_a_rule_must_start_at_a_call():
    rule = NodeRule("bad", Var("x"), accept, lambda m: None)
    with pytest.raises(TypeError, match="must start at a call"):
        apply_rules(torch.fx.Graph(), [rule])
