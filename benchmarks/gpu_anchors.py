"""The anchors the GPU check measures ssmcc's kernels against, loaded from where they are given,
and the mapping of each ssmcc op's arguments to each anchor's call.

mamba_ssm (state-spaces/mamba): its Triton kernels live in a package whose ``__init__`` imports
CUDA extensions that pip cannot build here. ``load_mamba_ssm`` imports, from a source tree named
by ``SSMCC_MAMBA_SSM_SRC`` (a checkout of the repository, or only its ``mamba_ssm/ops/triton``
and ``mamba_ssm/utils`` folders), only

    mamba_ssm.ops.triton.ssd_combined            mamba_chunk_scan_combined
    mamba_ssm.ops.triton.selective_state_update  selective_state_update
    mamba_ssm.ops.triton.layernorm_gated         rmsnorm_fn

and what they import. For the import's duration the packages above them are empty shells (their
``__init__`` files, which import the model classes and the CUDA extensions, never run) and the
CUDA extensions missing here (``CUDA_EXTENSIONS``) are stub modules holding nothing, so an
optional ``from causal_conv1d import ...`` fails as mamba_ssm expects of an absent extension.
Afterwards ``sys.modules`` holds none of it (Hugging Face models in the same process still see no
mamba_ssm). The kernels need ``einops``, imported by mamba_ssm itself.

fla (``fla-core`` on PyPI, a 1 MB pure-Python wheel): ``chunk_simple_gla`` from the folder named
by ``SSMCC_FLA_SRC`` (holding ``fla/``: the unpacked wheel or a checkout), else as installed;
its pure-PyTorch recurrences (``FLA_REFERENCES``, ``fla/ops/simple_gla/naive.py``, loaded from the
same tree by path) check the mapping on any device.

Nothing of either is copied into ssmcc: they are read from the tree they are given. Each mapping
below returns a callable whose result has the ssmcc op's outputs in its layout, so one comparison
with the op's reference serves ssmcc's kernel and every anchor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import math
import os
import sys
import types

import torch
import torch.nn.functional as F

MAMBA_SSM_ENV = "SSMCC_MAMBA_SSM_SRC"
FLA_ENV = "SSMCC_FLA_SRC"
MAMBA_SSM_FUNCTIONS = {
    "mamba_chunk_scan_combined": "ssd_combined",
    "selective_state_update": "selective_state_update",
    "rmsnorm_fn": "layernorm_gated",
}
MAMBA_SSM_PACKAGES = ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils")
CUDA_EXTENSIONS = ("selective_scan_cuda", "causal_conv1d", "causal_conv1d_cuda")
FLA_REFERENCES = ("naive_recurrent_simple_gla", "naive_chunk_simple_gla")  # PyTorch, any device
MAMBA_CHUNK = 256  # mamba2-130m's chunk_size (ssmcc's ssd_scan chooses its own)


@dataclasses.dataclass
class Anchor:
    """One anchor: ``status`` is "loaded from ...", "skipped: <why>" or "failed: <error>"."""

    name: str
    status: str
    functions: dict = dataclasses.field(default_factory=dict)
    modules: list = dataclasses.field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.status.startswith("loaded")


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]


def _shell(name: str, folder: str) -> types.ModuleType:
    """An empty package whose submodules are found in ``folder``; its ``__init__`` never runs."""
    module = types.ModuleType(name)
    module.__path__ = [folder]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [folder]
    return module


@contextlib.contextmanager
def _planted(modules: dict):
    """``modules`` in ``sys.modules`` for the block; afterwards every name they or the block
    added under ``mamba_ssm`` is gone and what was there before is back."""
    before = {n: sys.modules[n] for n in list(sys.modules) if n.split(".")[0] in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name in list(sys.modules):
            if name.split(".")[0] in modules:
                del sys.modules[name]
        sys.modules.update(before)


def load_mamba_ssm(src: str | None = None) -> Anchor:
    """mamba_ssm's three Triton entry points from the source tree ``src`` (default: the
    environment variable); an Anchor whose status says why not where they cannot be had."""
    src = src or os.environ.get(MAMBA_SSM_ENV)
    if not src:
        return Anchor(
            "mamba_ssm", f"skipped: {MAMBA_SSM_ENV} is not set (a state-spaces/mamba tree)"
        )
    root = os.path.join(os.path.abspath(src), "mamba_ssm")
    if not os.path.isfile(os.path.join(root, "ops", "triton", "ssd_combined.py")):
        return Anchor("mamba_ssm", f"skipped: {src} has no mamba_ssm/ops/triton/ssd_combined.py")
    planted = {
        name: _shell(name, os.path.join(root, *name.split(".")[1:])) for name in MAMBA_SSM_PACKAGES
    }
    for name in CUDA_EXTENSIONS:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            planted[name] = types.ModuleType(name)  # holds nothing: `from x import y` fails
    try:
        with _planted(planted):
            modules = {
                file: importlib.import_module(f"mamba_ssm.ops.triton.{file}")
                for file in sorted(set(MAMBA_SSM_FUNCTIONS.values()))
            }
            # their Triton kernels live in the modules ssd_combined imported too
            loaded = [m for n, m in sys.modules.items() if n.startswith("mamba_ssm.ops.triton.")]
    except Exception as error:  # a tree of another version, a missing einops: a finding
        return Anchor("mamba_ssm", f"failed: import: {_error(error)}")
    functions = {name: getattr(modules[file], name) for name, file in MAMBA_SSM_FUNCTIONS.items()}
    return Anchor("mamba_ssm", f"loaded from {src}", functions, loaded)


def _fla_folder(src: str | None) -> str | None:
    """The ``fla`` package folder: under ``src``, else the installed one (nothing imported)."""
    if src:
        folder = os.path.join(os.path.abspath(src), "fla")
        return folder if os.path.isdir(folder) else None
    spec = importlib.util.find_spec("fla")
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def load_fla(src: str | None = None, kernels: bool = True) -> Anchor:
    """fla's ``chunk_simple_gla`` (when ``kernels``: an import of ``fla.ops.simple_gla``) and
    its PyTorch recurrences ``FLA_REFERENCES`` (always, loaded by path)."""
    src = src or os.environ.get(FLA_ENV)
    folder = _fla_folder(src)
    if folder is None:
        where = f"{src} has no fla/" if src else f"{FLA_ENV} is not set and fla is not installed"
        return Anchor("fla", f"skipped: {where} (pip download fla-core==0.6.0 --no-deps)")
    naive_path = os.path.join(folder, "ops", "simple_gla", "naive.py")
    try:
        spec = importlib.util.spec_from_file_location("ssmcc_anchor_fla_naive", naive_path)
        naive = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(naive)
        functions = {name: getattr(naive, name) for name in FLA_REFERENCES}
    except Exception as error:
        return Anchor("fla", f"failed: import {naive_path}: {_error(error)}")
    status = f"loaded from {os.path.dirname(folder)}"
    if not kernels:
        return Anchor("fla", status, functions)
    if src and os.path.abspath(src) not in sys.path:
        sys.path.insert(0, os.path.abspath(src))
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as error:
        return Anchor("fla", f"failed: import fla.ops.simple_gla: {_error(error)}", functions)
    functions["chunk_simple_gla"] = chunk_simple_gla
    return Anchor("fla", status, functions)


# ---- dry runs: the anchors' kernels in Triton's interpreter, on the CPU -------------------------


def first_configs_only(modules) -> int:
    """Every autotuned kernel of ``modules`` keeps its first config: the interpreter has no
    benchmarker, and tuning there would measure nothing. Returns how many were trimmed."""
    from triton.runtime.autotuner import Autotuner

    trimmed = 0
    for module in modules:
        for value in list(vars(module).values()):
            while value is not None and hasattr(value, "fn"):
                if isinstance(value, Autotuner) and len(value.configs) > 1:
                    value.configs = value.configs[:1]
                    trimmed += 1
                value = value.fn
    return trimmed


@contextlib.contextmanager
def cpu_device_scope():
    """mamba_ssm's launchers enter ``torch.cuda.device(x.device.index)``, which fails for a CPU
    tensor (index None); for the block, that is a no-op for CPU tensors."""
    real = torch.cuda.device

    def device(index):
        return contextlib.nullcontext() if index is None else real(index)

    torch.cuda.device = device
    try:
        yield
    finally:
        torch.cuda.device = real


# ---- the mappings: ssmcc's op arguments -> the anchor's call, outputs in ssmcc's layout -----


def mamba_ssd_scan(functions: dict, a: dict):
    """``ssd_scan`` as ``mamba_chunk_scan_combined`` (chunks of ``MAMBA_CHUNK``): the same
    arguments; ssmcc's dt limits are its ``dt_limit``; its final state is ssmcc's."""
    run = functions["mamba_chunk_scan_combined"]
    limit = (a["dt_min"], math.inf if a["dt_max"] is None else a["dt_max"])
    return lambda: run(
        a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=MAMBA_CHUNK, D=a["D"], z=a["z"],
        dt_bias=a["dt_bias"], initial_states=a["initial_state"], dt_softplus=a["dt_softplus"],
        dt_limit=limit, return_final_states=True,
    )  # fmt: skip


def mamba_selective_state_update(functions: dict, a: dict):
    """Mamba-1's step as mamba_ssm's ``selective_state_update`` without heads. It updates the
    state in place: each call updates one copy, returned beside the output."""
    state, run = a["state"].clone(), functions["selective_state_update"]

    def step():
        out = run(
            state, a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"], z=a["z"],
            dt_bias=a["dt_bias"], dt_softplus=a["dt_softplus"],
        )  # fmt: skip
        return out, state

    return step


def mamba_ssd_state_update(functions: dict, a: dict):
    """Mamba-2's step as mamba_ssm's ``selective_state_update`` with heads, as its Mamba2 module
    calls it: per-head dt, A, D and dt_bias broadcast over the head dim (stride 0)."""
    state, run = a["state"].clone(), functions["selective_state_update"]
    heads, head_dim, size = state.shape[1:]

    def per_channel(t):
        return t if t.dim() == 2 else t[:, None].expand(heads, head_dim)

    dt = a["dt"][..., None].expand(*a["x"].shape)
    A = a["A"][:, None, None].expand(heads, head_dim, size)

    def step():
        out = run(
            state, a["x"], dt, A, a["B"], a["C"], D=per_channel(a["D"]), z=a["z"],
            dt_bias=per_channel(a["dt_bias"]), dt_softplus=a["dt_softplus"],
        )  # fmt: skip
        return out, state

    return step


def mamba_rmsnorm_gated(functions: dict, a: dict):
    """``rmsnorm_gated`` as mamba_ssm's ``rmsnorm_fn`` (no bias)."""
    run = functions["rmsnorm_fn"]
    return lambda: run(
        a["x"], a["weight"], None, z=a["z"], eps=a["eps"], group_size=a["group_size"],
        norm_before_gate=a["norm_before_gate"],
    )  # fmt: skip


def fla_ssd_scan(functions: dict, a: dict, kernel: str = "chunk_simple_gla"):
    """``ssd_scan`` as fla's simple GLA: chunked linear attention with one scalar log-decay per
    position and head,

        S_t = exp(g_t) S_{t-1} + k_t v_t^T     (S: state x head_dim)     o_t = scale S_t^T q_t

    which is SSD's ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t`` with

        q = C, k = B (each expanded from its group to every head), v = x * dt, g = dt * A,
        scale = 1, S = h^T (the initial and final states transposed)

    where dt is ssmcc's discretised step (bias, softplus, clamp), computed here. D's skip and the
    z gate are applied outside fla, and all of it is inside the timed call."""
    run, x = functions[kernel], a["x"]
    heads = x.shape[2]

    def scan():
        dt = a["dt"].float()
        if a["dt_bias"] is not None:
            dt = dt + a["dt_bias"].float()
        if a["dt_softplus"]:
            dt = F.softplus(dt)
        dt = dt.clamp(min=a["dt_min"], max=a["dt_max"])
        q = a["C"].repeat_interleave(heads // a["C"].shape[2], dim=2)
        k = a["B"].repeat_interleave(heads // a["B"].shape[2], dim=2)
        v = (x.float() * dt[..., None]).to(x.dtype)
        g = dt * a["A"].float()
        h0 = None if a["initial_state"] is None else a["initial_state"].transpose(-1, -2)
        o, final = run(q, k, v, g=g, scale=1.0, initial_state=h0, output_final_state=True)
        y = o.float()
        if a["D"] is not None:
            D = a["D"].float()
            y = y + (D[:, None] if D.dim() == 1 else D) * x.float()
        if a["z"] is not None:
            y = y * F.silu(a["z"].float())
        return y.to(x.dtype), final.transpose(-1, -2)

    return scan


# op -> ((anchor, mapping), ...): the rows of gpu_check.py each anchor is measured on. Mamba-1's
# selective_scan and causal_conv1d have no Triton anchor (mamba_ssm's are CUDA extensions).
CONTENDERS = {
    "ssd_scan": (("mamba_ssm", mamba_ssd_scan), ("fla", fla_ssd_scan)),
    "selective_state_update": (("mamba_ssm", mamba_selective_state_update),),
    "ssd_state_update": (("mamba_ssm", mamba_ssd_state_update),),
    "rmsnorm_gated": (("mamba_ssm", mamba_rmsnorm_gated),),
}
