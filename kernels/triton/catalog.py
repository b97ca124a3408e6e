"""Which file and launcher of ``kernels/triton`` runs each ssmcc op, without importing Triton
(for ``ssmcc coverage``: importing Triton would fix this process's compiled/interpreted mode).

A launcher declares its op next to its definition, ``@launcher("rmsnorm_gated")``: on import that
registers it as the op's Triton implementation (``ssmcc.ops.backends``: an op that is not defined,
or a launcher not taking the op's arguments first, is an import-time error naming both), and
``launchers()`` reads the same decorators from the sources, so no table is kept by hand.
"""

from __future__ import annotations

import ast
import functools
import pathlib

from ssmcc.ops.backends import implements, takes_op_arguments

HERE = pathlib.Path(__file__).resolve().parent


def launcher(op: str):
    """Register the decorated function as op ``op``'s Triton launcher."""

    def decorate(function):
        file = pathlib.Path(function.__code__.co_filename).name
        return implements(
            "triton", op, description=_description(file, function.__name__),
            check=takes_op_arguments,
        )(function)

    return decorate


def _declared(path: pathlib.Path) -> dict[str, tuple[str, str]]:
    """op -> (file, launcher) for every ``@launcher("op")`` function of one source file."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and getattr(decorator.func, "id", None) == "launcher"
                and decorator.args
                and isinstance(decorator.args[0], ast.Constant)
            ):
                found[decorator.args[0].value] = (path.name, node.name)
    return found


@functools.cache
def launchers() -> dict[str, tuple[str, str]]:
    """op -> (file, launcher) of kernels/triton, read from the sources."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        found.update(_declared(path))
    return found


def _description(file: str, name: str) -> str:
    return f"Triton: kernels/triton/{file} ({name})"


def describe(op: str) -> str:
    return _description(*launchers()[op])


# Each kernel's launch grid as a rule of the sizes its launcher sees (for a runtime that launches
# the ahead-of-time binaries itself, e.g. a TensorRT plugin). cdiv(a, b) = ceil(a / b).
GRID_RULES = {
    "_selective_scan_chunk_state_kernel": "(batch, cdiv(dim, BLOCK_D), "
    "cdiv(length, chunk_len) - 1)",
    "_selective_scan_pass_states_kernel": "(batch, cdiv(dim, BLOCK_D))",
    "_selective_scan_chunk_scan_kernel": "(batch, cdiv(dim, BLOCK_D), cdiv(length, chunk_len))",
    "_state_update_kernel": "(batch, heads, cdiv(rows, BLOCK_R))",
    "_causal_conv1d_kernel": "(batch, cdiv(dim, BLOCK_D), cdiv(length, BLOCK_L))",
    "_causal_conv1d_final_state_kernel": "(batch, cdiv(dim, BLOCK_D))",
    "_causal_conv1d_update_kernel": "(batch, cdiv(dim, BLOCK_D))",
    "_ssd_chunk_cumsum_kernel": "(batch, cdiv(length, chunk), cdiv(heads, BLOCK_H))",
    "_ssd_chunk_state_kernel": "(batch * cdiv(length, chunk), heads, "
    "cdiv(head_dim, BLOCK_P) * cdiv(nstate, BLOCK_N))",
    "_ssd_state_passing_kernel": "(batch, heads, cdiv(head_dim * nstate, BLOCK))",
    "_ssd_bmm_kernel": "(batch * cdiv(length, chunk), groups, "
    "cdiv(chunk, BLOCK_M) * cdiv(chunk, BLOCK_S))",
    "_ssd_chunk_scan_kernel": "(batch * cdiv(length, chunk), heads, "
    "cdiv(chunk, BLOCK_M) * cdiv(head_dim, BLOCK_P))",
    "_rmsnorm_gated_kernel": "(rows, dim / group_size)",
    # the fused decode steps (mixer_steps.py): cols / rows are run-time arguments the launcher
    # picks (configs.step_rows); the kernels read them, so any value with this grid is valid
    "_mamba_step_conv_proj_kernel": "(batch, cdiv(dim, cols))",
    "_mamba_step_update_kernel": "(batch, cdiv(dim, cols))",
    "_ssd_step_kernel": "(batch, heads, cdiv(head_dim, rows))",
    "_linear_kernel": "(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))",
    "_embedding_kernel": "(number of ids, cdiv(K, BLOCK_K))",
    "_append_cache_kernel": "(batch, kv_heads, cdiv(past + length, BLOCK_T))",
    "_attention_kernel": "(batch * heads, cdiv(length, BLOCK_M))",
    # decode: split_len / splits are run-time arguments the launcher picks (attention.py's
    # split_keys); the partials are sized by splits = cdiv(past + length, split_len)
    "_attention_split_kernel": "(batch * kv_heads * cdiv(heads / kv_heads * length, BLOCK_M), "
    "cdiv(past + length, split_len))",
    "_attention_combine_kernel": "(batch * heads, length)",
    # the captured decode's attention over K/V pools (kv_pool.py): S slots of C positions;
    # split_len is a run-time argument (attention.py's split_keys over C)
    "_kv_pool_write_kernel": "(batch, kv_heads)",
    "_kv_pool_split_kernel": "(batch * kv_heads * cdiv(heads / kv_heads, BLOCK_M), "
    "cdiv(capacity, split_len))",
    "_count_kernel": "(cdiv(rows, BLOCK),)",
    "_moe_up_kernel": "(tokens * top_k, cdiv(width, BLOCK_W))",
    "_moe_down_kernel": "(tokens, cdiv(dim, BLOCK_D))",
    # the grouped GEMM: tiles = min(tokens * top_k, cdiv(tokens * top_k, BLOCK_M) + experts),
    # a bound on the tiles the routing pass makes (programs past them do nothing)
    "_moe_route_kernel": "(1,)",
    "_moe_up_grouped_kernel": "(tiles, cdiv(width, BLOCK_W))",
    "_moe_down_grouped_kernel": "(tiles, cdiv(dim, BLOCK_D))",
    "_moe_sum_kernel": "(tokens, cdiv(dim, BLOCK_D))",
    "_positions_kernel": "(batch, max(1, cdiv(length, BLOCK)))",
    # the TensorRT plugins' kernels (plugin_kernels.py; the rules are lowering/tensorrt/specs.py's)
    # the Mamba-1 scan as a chain of plugins, K = cdiv(length, CHUNK)
    "trt_selective_scan_chunk_state_kernel": "(batch, cdiv(dim, BLOCK_D), K)",
    "trt_selective_scan_pass_states_kernel": "(batch, cdiv(dim, BLOCK_D), 1)",
    "trt_selective_scan_chunk_scan_kernel": "(batch, cdiv(dim, BLOCK_D), K)",
    "trt_causal_conv1d_kernel": "(batch, cdiv(dim, BLOCK_D), max(cdiv(length, BLOCK_L), 1))",
    "trt_selective_state_update_kernel": "(batch, 1, cdiv(dim, BLOCK_R))",
    "trt_causal_conv1d_update_kernel": "(batch, cdiv(dim, BLOCK_D), 1)",
    "trt_rmsnorm_gated_kernel": "(rows, dim / GROUP, 1)",
    "trt_ssd_state_update_kernel": "(batch, heads, cdiv(head_dim, BLOCK_R))",
    # the SSD scan as a chain of plugins, K = cdiv(length, CHUNK)
    "trt_ssd_chunk_cumsum_kernel": "(batch, K, cdiv(heads, BLOCK_H))",
    "trt_ssd_chunk_state_kernel": "(batch * K, heads, cdiv(head_dim, BLOCK_P) * cdiv(nstate, "
    "BLOCK_N))",
    "trt_ssd_state_passing_kernel": "(batch, heads, cdiv(head_dim * nstate, BLOCK))",
    "trt_ssd_bmm_kernel": "(batch * K, groups, cdiv(CHUNK, BLOCK_M) * cdiv(CHUNK, BLOCK_S))",
    "trt_ssd_chunk_scan_kernel": "(batch * K, heads, cdiv(CHUNK, BLOCK_M) * cdiv(head_dim, "
    "BLOCK_P))",
}
