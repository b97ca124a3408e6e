"""16-bit programs on the triton target without detours (``lowering/triton/casts.py``): with
``dtype="bfloat16"``/``"float16"`` no float32 copy of a 16-bit activation is made between
kernels (the kernels read 16-bit and widen in registers, and write 16-bit on their store), the
states stay float32, and the logits stay within mamba_ssm's tolerances of the same model run in
that dtype on the torch target and of the float32 model. (Triton's interpreter truncates float32
to bfloat16 on a store where a compiled kernel rounds to nearest even, as torch's cast does:
``semantic.cast`` defaults a downcast to RTNE, the interpreter's ``create_fp_trunc`` passes no
rounding mode. So in the interpreter a bf16 run of these kernels sits up to ~1.5x further from
the float32 model than torch's own bf16 run; float16 rounds to nearest in both.)

Checked twice: on the lowered graphs (no widening cast left, each rule fired) and while a
prefill and a step run (every ATen copy that widens a 16-bit tensor to float32 recorded: only
the logits, which the programs return in float32 as the model does). The same recorder on the
torch target's run of the same program finds the copies the casts make there.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import ssmcc
from ssmcc.presets import build_preset

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.lowering.triton.casts import widening_casts  # noqa: E402

aten = torch.ops.aten
HALF = (torch.bfloat16, torch.float16)
# mamba_ssm's scan tolerances (FACTS.md), applied to the logits (as tests/test_mamba2.py does)
TOLERANCE = {torch.bfloat16: dict(rtol=3e-2, atol=5e-2), torch.float16: dict(rtol=3e-3, atol=5e-3)}
CASES = [
    ("mamba-tiny", torch.bfloat16),
    ("mamba2-tiny", torch.bfloat16),
    pytest.param(("mamba-tiny", torch.float16), marks=pytest.mark.slow),
]


class WideningCopies(TorchDispatchMode):
    """Records (op, shape) of every ATen copy that makes a float32 tensor from a 16-bit one."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (aten._to_copy, aten.to, aten.copy_):
            leaves = pytree.tree_leaves((args, kwargs))
            if any(isinstance(a, torch.Tensor) and a.dtype in HALF for a in leaves):
                for o in pytree.tree_leaves(out):
                    if isinstance(o, torch.Tensor) and o.dtype == torch.float32:
                        self.found.append((str(func), tuple(o.shape)))
        return out


def _ids(vocab: int, shape: tuple, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _copies(run) -> list[tuple[str, tuple]]:
    """The widening copies ``run()`` makes (run once before: lowering folds weight expressions
    once, and that is not a copy between kernels)."""
    run()
    with WideningCopies() as seen:
        run()
    return seen.found


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}")
def programs(request):
    name, dtype = request.param
    model = build_preset(name).eval()
    triton = ssmcc.compile(model, target="triton", interpret=True, dtype=dtype)
    torch_low = ssmcc.compile(model, target="torch", dtype=dtype)
    exact = ssmcc.compile(model, target="torch")
    return model, dtype, triton, torch_low, exact


def test_no_widening_cast_is_left_between_kernels(programs):
    model, _, triton, _, _ = programs
    hits = {}
    for graph in ("prefill", "step"):
        module = triton.executable.module(graph)
        assert widening_casts(module) == [], graph
        assert not any(n.target is aten.embedding.default for n in module.graph.nodes), graph
        hits[graph] = module.meta["cast_hits"]
    layers = model.config.num_hidden_layers
    for graph, counts in hits.items():  # every norm writes the dtype of the product after it
        assert counts.get("norm_writes_16bit") == layers + 1, (graph, counts)
        assert counts.get("norm_reads_16bit") == layers - 1, (graph, counts)
        assert counts.get("embedding_widened") == 1, (graph, counts)


def test_only_the_logits_are_widened_while_decoding(programs):
    model, _, triton, torch_low, _ = programs
    ids = _ids(model.config.vocab_size, (1, 3), 0)
    vocab = model.config.vocab_size

    def decode():
        _, state = triton.prefill(ids)
        triton.step(ids[:, 0], state)

    found = _copies(decode)
    assert found and all(shape[-1] == vocab for _, shape in found), found
    # the recorder sees the copies where they are made: the same model on the torch target
    there = _copies(lambda: torch_low(ids))
    hidden = model.config.hidden_size
    assert sum(shape[-1] == hidden for _, shape in there) >= model.config.num_hidden_layers


def test_low_precision_logits_match_the_model_in_that_dtype(programs):
    model, dtype, triton, torch_low, exact = programs
    ids = _ids(model.config.vocab_size, (2, 7), 1)
    got, low, reference = triton(ids).float(), torch_low(ids).float(), exact(ids)
    torch.testing.assert_close(got, low, **TOLERANCE[dtype])
    torch.testing.assert_close(got, reference, **TOLERANCE[dtype])
    _, state = triton.prefill(ids[:, :5])
    for position in range(5, 7):
        logits, state = triton.step(ids[:, position], state)
        torch.testing.assert_close(logits.float(), low[:, position], **TOLERANCE[dtype])
    assert {t.dtype for t in state.values()} == {torch.float32}
