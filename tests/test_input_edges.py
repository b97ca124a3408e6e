"""Edge inputs of the public calls get a clear InputError (or, where the behaviour is right, a test
that pins it down): NaN or bool settings, ids below zero, an eos id outside the vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError

from .conftest import make_hf_model


@pytest.fixture(scope="module")
def compiled():
    return ssmcc.compile(make_hf_model("mamba", num_hidden_layers=1), target="torch")


IDS = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(do_sample=True, temperature=math.nan), "temperature must be a finite number > 0"),
        (dict(do_sample=True, temperature=math.inf), "temperature must be a finite number > 0"),
        (dict(do_sample=True, temperature=0), "temperature must be a finite number > 0"),
        (dict(do_sample=True, top_p=math.nan), r"top_p must be a number in \(0, 1\]"),
        (dict(do_sample=True, top_k=True), "top_k must be an integer >= 1"),
        (dict(do_sample=True, top_k=2.5), "top_k must be an integer >= 1"),
        (dict(do_sample="yes"), "do_sample must be True or False"),
        (dict(seed=1.5), "seed must be an integer"),
        (dict(eos_token_id=101), r"eos_token_id must be a token id in the vocabulary \[0, 101\)"),
        (dict(eos_token_id=-1), "eos_token_id must be a token id"),
        (dict(eos_token_id=True), "eos_token_id must be a token id"),
        (dict(temprature=0.5), "unknown generation option"),
    ],
)
def test_generation_settings_are_checked(compiled, kwargs, message):
    with pytest.raises(InputError, match=message):
        compiled.generate(IDS, 2, **kwargs)


@pytest.mark.parametrize("count", [True, 0, -1, 2.0, None])
def test_max_new_tokens_must_be_a_positive_integer(compiled, count):
    with pytest.raises(InputError, match="max_new_tokens must be an integer >= 1"):
        compiled.generate(IDS, count)


def test_negative_ids_are_refused_even_without_a_vocabulary():
    from ssmcc.frontend.inputs import check_token_ids

    with pytest.raises(InputError, match="token id -1: token ids are >= 0"):
        check_token_ids(torch.tensor([[3, -1]]), vocab_size=None)


def test_eos_inside_the_vocabulary_stops_rows(compiled):
    tokens = compiled.generate(IDS, 3)
    eos = int(tokens[0, 3])
    stopped = compiled.generate(IDS, 5, eos_token_id=eos)
    assert stopped.shape[1] == 4 and int(stopped[0, -1]) == eos
