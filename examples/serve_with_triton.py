"""Serve a compiled Mamba with Triton Inference Server and stream tokens from it over HTTP.

    pip install 'ssmcc[serving]'            # nvidia-pytriton (tritonserver) and tritonclient
    python examples/serve_with_triton.py

The artifact becomes a model repository (Python backend: ssmcc's runtime keeps each sequence's
state between its requests); a local tritonserver serves it; two sequences stream concurrently,
one greedy and one sampled, each giving the tokens ``compiled.generate`` gives alone.
"""

import concurrent.futures
import os
import tempfile

import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmcc
from ssmcc.serving import Client, TritonServer, export_triton


def main() -> None:
    folder = tempfile.mkdtemp(prefix="ssmcc-serving-")
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2))
    compiled = ssmcc.compile(model.eval(), target="onnx")
    compiled.save(os.path.join(folder, "artifact"))
    repo = export_triton(
        os.path.join(folder, "artifact"), os.path.join(folder, "repo"), name="mamba"
    )
    print(f"repository {repo}: {sorted(os.listdir(os.path.join(repo, 'mamba')))}")

    prompts = {1: torch.tensor([11, 22, 33, 44]), 2: torch.tensor([5, 6, 7])}
    sampling = {1: {}, 2: {"do_sample": True, "seed": 0, "top_p": 0.9}}
    with TritonServer(repo) as server:
        print(f"tritonserver ready at http://{server.url}")

        def run(sequence_id):
            client = Client(server.url, "mamba")  # one client per thread
            return client.generate(
                prompts[sequence_id], 12, sequence_id=sequence_id, **sampling[sequence_id]
            )

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            served = dict(zip(prompts, pool.map(run, prompts), strict=True))
    for sequence_id, tokens in served.items():
        prompt = prompts[sequence_id]
        local = compiled.generate(prompt[None], 12, **sampling[sequence_id])[0, len(prompt) :]
        same = "same as" if tokens == local.tolist() else "DIFFERENT from"
        print(f"sequence {sequence_id}: {tokens} ({same} compiled.generate)")
        assert tokens == local.tolist()


if __name__ == "__main__":
    main()
