"""Serving through Triton Inference Server: repositories written by ``export_triton`` and served by
a real ``tritonserver`` (the nvidia-pytriton wheel's, Python backend), driven by ``tritonclient``
through ``ssmcc.serving.Client``; the ONNX Runtime flavour's config checked against Triton's own
``model_config.proto`` (that backend is not in the wheel, so it is not run here)."""

from __future__ import annotations

import collections
import concurrent.futures
import os
import random
import re
import threading
import time

import numpy as np
import onnx
import pytest
import torch

import ssmcc
from ssmcc.errors import OptionError, ServingError
from ssmcc.presets import build_preset

pytest.importorskip("pytriton", reason="serving extra not installed: pip install 'ssmcc[serving]'")
pytest.importorskip("tritonclient.http")

from ssmcc.serving import Client, TritonServer, export_triton  # noqa: E402

IDLE_S = 4.0  # the repository's idle timeout: short, so that the expiry test is quick


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    """(compiled model, artifact folder): mamba-tiny on the ONNX target."""
    model = build_preset("mamba-tiny").eval()
    compiled = ssmcc.compile(model, target="onnx")
    folder = str(tmp_path_factory.mktemp("serving") / "artifact")
    compiled.save(folder)
    return compiled, folder


@pytest.fixture(scope="module")
def server(mamba, tmp_path_factory):
    _, artifact = mamba
    repo = str(tmp_path_factory.mktemp("serving") / "repo")
    export_triton(artifact, repo, name="mamba", max_batch_size=8, idle_timeout_s=IDLE_S, threads=1)
    with TritonServer(repo) as running:
        yield running
    assert running.process.poll() is not None  # stopped, whatever happened in the tests
    assert _processes_mentioning(repo) == []  # its Python backend stubs too


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (the server's and its stubs' name
    the repository)."""
    return list(_pids_mentioning(text).values())


def _pids_mentioning(text: str) -> dict[int, str]:
    """{pid: command line} of the processes (but this one) whose command line holds ``text``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line and int(pid) != os.getpid():
            found[int(pid)] = line
    return found


def _prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed))


def test_eight_sequences_interleaved_at_random_match_generate(mamba, server):
    """8 sequences with prompts of different lengths, each streamed by its own thread with random
    pauses, so that steps of different sequences meet in the batcher: every sequence's tokens
    equal ``compiled.generate`` on its prompt alone (greedy for six, sampled for two)."""
    compiled, _ = mamba
    jobs = []
    for i in range(8):
        sampling = dict(do_sample=True, seed=i, top_k=40) if i >= 6 else {}
        jobs.append((100 + i, _prompt(i, 3 + 5 * i), sampling))

    def run(job):
        sequence_id, prompt, sampling = job
        client = Client(server.url, "mamba")  # one per thread: tritonclient's are not shared
        pause = random.Random(sequence_id)
        tokens = []
        for token in client.stream(prompt, 16, sequence_id=sequence_id, **sampling):
            tokens.append(token)
            time.sleep(pause.uniform(0, 0.01))
        return tokens

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    for (_, prompt, sampling), tokens in zip(jobs, results, strict=True):
        expected = compiled.generate(prompt[None], 16, **sampling)[0, prompt.numel() :]
        assert tokens == expected.tolist()


def test_steps_of_different_sequences_run_as_one_batch(mamba, server):
    """Eight sequences stepped in lock step: the batcher hands the model several requests per
    execution (Triton's statistics count fewer executions than inferences), and each sequence's
    logits equal those of its own prefill + steps."""
    compiled, _ = mamba
    client = Client(server.url, "mamba")
    before = _settled_counts(client)
    prompts = [_prompt(50 + i, 7) for i in range(8)]
    tokens = [
        torch.randint(0, 256, (4,), generator=torch.Generator().manual_seed(i)) for i in range(8)
    ]
    for i, prompt in enumerate(prompts):
        client.infer(prompt.numpy(), 200 + i, start=True)
    barrier = threading.Barrier(8)

    def steps(i):
        own = Client(server.url, "mamba")
        got = []
        for j in range(4):
            barrier.wait()
            got.append(own.infer([int(tokens[i][j])], 200 + i, end=j == 3))
        return got

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(steps, range(8)))
    after = _settled_counts(client)
    inferences, executions = (after[k] - before[k] for k in ("inference", "execution"))
    assert inferences == 8 * 5 and executions < inferences
    for i, got in enumerate(results):
        _, state = compiled.prefill(prompts[i][None])
        for j in range(4):
            logits, state = compiled.step(tokens[i][j : j + 1], state)
            np.testing.assert_allclose(got[j], logits[0].numpy(), rtol=1e-4, atol=1e-4)


def _counts(client: Client) -> dict[str, int]:
    stats = client.client.get_inference_statistics("mamba")["model_stats"][0]
    return {"inference": int(stats["inference_count"]), "execution": int(stats["execution_count"])}


def _settled_counts(client: Client) -> dict[str, int]:
    """The counts once two reads 50 ms apart agree: Triton adds an execution to its statistics
    after the model has sent that execution's responses, so a client that has its response can
    read the count before it (seen on a loaded 2-core machine, 2026-12-06)."""
    counts = _counts(client)
    for _ in range(40):
        time.sleep(0.05)
        again = _counts(client)
        if again == counts:
            break
        counts = again
    return counts


# What a bad client sends (START, ids, the words of its error) while 8 sequences decode: in the
# prompt round, requests of several tokens (the first of the shape of the prompts); in each step
# round, one token, the shape of the steps (Triton batches requests of one shape only, and waits
# up to the batch delay for each shape).
BAD_PROMPTS = [
    (True, [[1] * 15 + [700]], r"sequence 999: input_ids holds token id 700, outside the vocab"),
    (True, np.zeros((1, 0)), r"sequence 999: input_ids is an empty sequence"),
    (True, np.ones((1, 17)), r"holds 17 tokens, more than this model's max_request_tokens \(16\)"),
]
BAD_STEPS = [
    (True, [[700]], r"sequence 999: input_ids holds token id 700, outside the vocabulary \[0, 5"),
    (False, [[5]], r"sequence 999 is unknown or has expired"),  # its START above was refused
    (True, [[-1]], r"sequence 999: input_ids holds token id -1: token ids are >= 0"),
    (True, [[2**40]], r"holds token id 1099511627776, outside the vocabulary"),
    (True, [[512]], r"holds token id 512, outside the vocabulary"),
    (False, [[1]], r"sequence 999 is unknown or has expired"),
    (True, [[-(2**63)]], r"holds token id -9223372036854775808"),
]


def test_bad_requests_fail_alone_in_the_batch_they_share(mamba, tmp_path):
    """8 sequences decode in lock step beside a client that sends bad requests (ids outside the
    vocabulary, negative, none, too many, a sequence whose START was refused). Each step round's
    9 one-token requests reach the model as one execution (the batcher waits up to 1 s for 9;
    Triton's statistics count one execution per round), and only the bad request fails, with its
    own message: every sequence gets ``compiled.generate``'s tokens, one of them from a 40-token
    prompt the client sends in pieces of the model's max_request_tokens (16). Requests Triton
    refuses itself (FP32 ids) never reach a batch; ``Client`` refuses float ids before sending."""
    import tritonclient.http as http

    compiled, artifact = mamba
    repo = export_triton(
        artifact,
        str(tmp_path / "repo"),
        name="mamba",
        max_batch_size=9,
        batch_delay_ms=1000,
        max_request_tokens=16,
        threads=1,
    )
    prompts = [_prompt(300 + i, 40 if i == 0 else 16) for i in range(8)]
    new_tokens = 1 + len(BAD_STEPS)
    executions = []
    with TritonServer(repo) as server:

        def snapshot():  # in whichever thread arrives last: tritonclient's are per thread
            with Client(server.url, "mamba") as client:
                executions.append(_settled_counts(client)["execution"])

        barrier = threading.Barrier(9, action=snapshot, timeout=120)

        def good(i):  # (an open connection would hold the server's stop up to 30 s)
            with Client(server.url, "mamba") as client:
                tokens = []
                barrier.wait()
                for token in client.stream(prompts[i], new_tokens, sequence_id=500 + i):
                    tokens.append(token)
                    barrier.wait()
                return tokens

        def bad():
            client, errors = http.InferenceServerClient(server.url), []

            def send(start, ids, dtype=np.int64, kind="INT64", end=False):
                row = np.asarray(ids, dtype=dtype)
                tensor = http.InferInput("input_ids", list(row.shape), kind)
                tensor.set_data_from_numpy(row)
                flags = dict(sequence_id=999, sequence_start=start, sequence_end=end)
                try:
                    client.infer("mamba", [tensor], **flags)
                except Exception as error:
                    return str(error)

            barrier.wait()
            errors = [send(start, ids) for start, ids, _ in BAD_PROMPTS]
            fp32 = send(True, [[1.0]], np.float32, "FP32")
            assert "data-type is 'FP32', but model 'mamba' expects 'INT64'" in fp32
            for i, (start, ids, _) in enumerate(BAD_STEPS):
                barrier.wait()  # the last ends the sequence: an open one holds the stop 30 s
                errors.append(send(start, ids, end=i == len(BAD_STEPS) - 1))
            barrier.wait()
            client.close()
            return errors

        with concurrent.futures.ThreadPoolExecutor(9) as pool:
            futures = [pool.submit(good, i) for i in range(8)] + [pool.submit(bad)]
        failed = [f.exception() for f in futures if f.exception() is not None]
        for failure in sorted(failed, key=lambda e: isinstance(e, threading.BrokenBarrierError)):
            raise failure  # the first cause, not the barrier it broke
        *results, errors = [f.result() for f in futures]
        with pytest.raises(ServingError, match="prompt must hold integer token ids, got dtype"):
            Client(server.url, "mamba").generate(np.array([1.0, 2.5]), 2, sequence_id=1)
    for (_, _, words), error in zip(BAD_PROMPTS + BAD_STEPS, errors, strict=True):
        assert error is not None and re.search(words, error), error
    for prompt, tokens in zip(prompts, results, strict=True):
        expected = compiled.generate(prompt[None], new_tokens)[0, prompt.numel() :]
        assert tokens == expected.tolist()
    steps = executions[1:]  # the counts after the prompts, then after each step round
    assert [b - a for a, b in zip(steps, steps[1:], strict=False)] == [1] * len(BAD_STEPS)


def test_a_restarted_sequence_starts_from_the_zero_state(mamba, server):
    compiled, _ = mamba
    client = Client(server.url, "mamba")
    prompt, other = _prompt(1, 9), _prompt(2, 5)
    first = client.generate(other, 6, sequence_id=7)  # ends the sequence
    assert first == compiled.generate(other[None], 6)[0, 5:].tolist()
    client.infer(other.numpy(), 7, start=True)  # restarted, then abandoned mid-way
    again = client.generate(prompt, 6, sequence_id=7)  # START again: no trace of the above
    assert again == compiled.generate(prompt[None], 6)[0, 9:].tolist()


def test_a_stream_closed_early_ends_its_sequence(mamba, server):
    """A ``break`` out of ``Client.stream`` (or a failure midway) ends the sequence on the server
    with one more request: its state and batcher slot are freed at once, not after the idle
    timeout, and a continuation without START is refused."""
    compiled, _ = mamba
    client = Client(server.url, "mamba")
    prompt = _prompt(21, 5)
    for token in client.stream(prompt, 8, sequence_id=61):
        assert token == compiled.generate(prompt[None], 1)[0, -1]
        break
    with pytest.raises(ServingError, match=r"sequence 61: .*START"):
        client.infer([1], 61)


def test_unknown_and_expired_sequences_get_a_clear_error(server):
    client = Client(server.url, "mamba")
    with pytest.raises(ServingError, match=r"sequence 4242: .*START"):
        client.infer([1, 2, 3], 4242)  # never started
    client.infer([1, 2, 3], 4343, start=True)
    time.sleep(IDLE_S + 2)  # past the idle timeout: the batcher and the model free it
    with pytest.raises(ServingError, match=r"sequence 4343: .*START"):
        client.infer([4], 4343)
    client.infer([4], 4343, start=True, end=True)  # and it can start again


def test_onnxruntime_flavour_config_follows_model_config_proto(mamba, tmp_path):
    """The production flavour's config.pbtxt parses into Triton's ModelConfig message, and names
    exactly the served graph's request input, response output and state pairs."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    _, artifact = mamba
    repo = str(tmp_path / "repo")
    export_triton(artifact, repo, name="m", flavour="onnxruntime", max_batch_size=4, threads=2)
    with open(os.path.join(repo, "m", "config.pbtxt")) as f:
        config = text_format.Parse(f.read(), model_config_pb2.ModelConfig())
    graph = onnx.load(os.path.join(repo, "m", "1", "model.onnx"), load_external_data=False)
    inputs = [i.name for i in graph.graph.input]
    outputs = [o.name for o in graph.graph.output]
    states = [n for n in inputs if n != "input_ids"]
    assert config.backend == "onnxruntime" and config.max_batch_size == 4
    assert [i.name for i in config.input] == ["input_ids"]
    assert [o.name for o in config.output] == ["logits"]
    pairs = [(s.input_name, s.output_name) for s in config.sequence_batching.state]
    assert pairs == [(n, f"{n}.next") for n in states]
    assert sorted(outputs) == sorted(["logits", *[f"{n}.next" for n in states]])
    dims = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim][1:] for i in graph.graph.input
    }
    for state in config.sequence_batching.state:
        assert list(state.dims) == dims[state.input_name]
        assert state.initial_state[0].zero_data
    # the graph and its weights load as the backend would read them
    import onnxruntime as ort

    session = ort.InferenceSession(os.path.join(repo, "m", "1", "model.onnx"))
    assert [i.name for i in session.get_inputs()] == inputs


def test_export_refuses_what_it_cannot_serve(mamba, tmp_path):
    _, artifact = mamba
    with pytest.raises(OptionError, match="max_batch_size must be an integer >= 1"):
        export_triton(artifact, str(tmp_path / "r"), max_batch_size=0)
    with pytest.raises(OptionError, match="max_request_tokens must be an integer >= 1, got 0"):
        export_triton(artifact, str(tmp_path / "r"), max_request_tokens=0)
    with pytest.raises(OptionError, match="batch_delay_ms must be a number >= 0"):
        export_triton(artifact, str(tmp_path / "r"), batch_delay_ms=-1)
    with pytest.raises(OptionError, match="flavour must be one of"):
        export_triton(artifact, str(tmp_path / "r"), flavour="tensorflow")
    with pytest.raises(ServingError, match="not an ssmcc artifact"):
        export_triton(str(tmp_path), str(tmp_path / "r"))
    (tmp_path / "taken").mkdir()
    with pytest.raises(ServingError, match="already exists"):
        export_triton(artifact, str(tmp_path / "taken"))
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # nothing half-written beside it


@pytest.mark.slow
def test_a_model_with_kv_caches_is_served_by_the_python_flavour_only(tmp_path):
    model = build_preset("granite-hybrid-tiny").eval()
    compiled = ssmcc.compile(model, target="onnx")
    artifact = str(tmp_path / "artifact")
    compiled.save(artifact)
    with pytest.raises(ServingError, match=r"growing state .*python flavour"):
        export_triton(artifact, str(tmp_path / "repo"), flavour="onnxruntime")
    assert not os.path.exists(tmp_path / "repo")
    export_triton(artifact, str(tmp_path / "repo"))
    assert collections.Counter(os.listdir(tmp_path / "repo")) == {"README.md": 1, "ssmcc": 1}


def test_export_serving_command_writes_the_repository(mamba, tmp_path):
    from ssmcc.cli import main

    _, artifact = mamba
    repo = str(tmp_path / "repo")
    options = ["--name", "m", "--max-request-tokens", "64"]
    code = main(["export-serving", artifact, "--engine", "triton", "--out", repo, *options])
    assert code == 0
    assert sorted(os.listdir(os.path.join(repo, "m", "1"))) == ["artifact", "model.py"]
    with open(os.path.join(repo, "m", "config.pbtxt")) as f:
        assert 'key: "max_request_tokens" value: { string_value: "64" }' in f.read()
    with open(os.path.join(repo, "README.md")) as f:
        assert "sequence_start=True" in f.read()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_serve_command_runs_until_interrupted(mamba, tmp_path, signal_name):
    """``ssmcc serve REPO`` prints its address, which ``Client`` takes as printed, answers health
    checks, and on Ctrl-C (SIGINT) or SIGTERM stops the server it started and exits 0."""
    import signal
    import subprocess
    import sys
    import urllib.request

    compiled, artifact = mamba
    repo = export_triton(artifact, str(tmp_path / "repo"), name="m")
    command = [sys.executable, "-m", "ssmcc.cli", "serve", repo]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving at http://127.0.0.1:"), process.stderr.read()
        url = line.split()[2]
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=10) as answer:
            assert answer.status == 200
        prompt = _prompt(3, 5)
        with Client(url, "m") as client:  # the address exactly as printed
            tokens = client.generate(prompt, 3, sequence_id=7)
        assert tokens == compiled.generate(prompt[None], 3)[0, prompt.numel() :].tolist()
        process.send_signal(getattr(signal, signal_name))
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5)
    assert _processes_mentioning(repo) == []


def test_client_addresses_in_either_form_and_bad_ones_said():
    from ssmcc.serving.client import server_address

    assert server_address("127.0.0.1:8000") == ("127.0.0.1:8000", False)
    assert server_address("http://127.0.0.1:8000") == ("127.0.0.1:8000", False)
    assert server_address("http://127.0.0.1:8000/") == ("127.0.0.1:8000", False)
    assert server_address("https://models.example:443") == ("models.example:443", True)
    assert server_address("grpc://127.0.0.1:8001", "grpc") == ("127.0.0.1:8001", False)
    with pytest.raises(ServingError, match=r"a gRPC client takes grpc://host:port"):
        server_address("http://127.0.0.1:8001", "grpc")
    with pytest.raises(ServingError, match=r"give the server's address only"):
        server_address("http://127.0.0.1:8000/v2/models/m")
    with pytest.raises(ServingError, match=r"an HTTP client takes http:// or https://"):
        Client("ftp://127.0.0.1:8000", "m")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_kill_9_of_serve_leaves_no_server_and_its_folder_goes_at_the_next_start(mamba, tmp_path):
    """``kill -9`` of ``ssmcc serve``: within 5 s no process of its server runs any more (the
    guardian, tritonserver, the Python backend's stub); its temporary folder (named with the
    command's writer tag) stays, with the server log, and the next server start removes it."""
    import signal
    import subprocess
    import sys
    import tempfile

    from ssmcc.runtime.temporaries import writer_tag

    compiled, artifact = mamba
    repo = export_triton(artifact, str(tmp_path / "repo"), name="m")
    command = [sys.executable, "-m", "ssmcc.cli", "serve", repo]

    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = {}
    try:
        line = first.stdout.readline().decode()
        assert line.startswith("serving at http://127.0.0.1:"), first.stderr.read()
        tag = writer_tag(first.pid)
        pids = _pids_mentioning(repo)  # its stub's names the model.py under the repository
        pids.pop(first.pid)
        kinds = sorted(
            "stub" if "backend_stub" in line else "guardian" if "guardian" in line else "server"
            for line in pids.values()
        )
        assert kinds == ["guardian", "server", "stub"], pids
        folders = [
            os.path.join(tempfile.gettempdir(), name)
            for name in os.listdir(tempfile.gettempdir())
            if name.startswith(f"ssmcc-tritonserver-{tag}-")
        ]
        assert len(folders) == 1 and os.path.exists(os.path.join(folders[0], "server.log"))
        first.kill()
        first.wait()
        deadline = time.monotonic() + 5
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pids[pid] for pid in pids if _running(pid)]
    finally:  # whatever failed, nothing this test started keeps running
        first.kill()
        first.wait()
        for pid in filter(_running, pids):
            os.kill(pid, signal.SIGKILL)
    assert os.path.isdir(folders[0])
    with TritonServer(repo):  # what ssmcc serve starts
        assert not os.path.exists(folders[0])


def test_serve_command_interrupted_while_starting(mamba, tmp_path):
    """Ctrl-C before the server is ready: the command stops the starting server, prints no
    address and exits 0, leaving no process behind."""
    import signal
    import subprocess
    import sys

    compiled, artifact = mamba
    repo = export_triton(artifact, str(tmp_path / "repo"), name="m")
    command = [sys.executable, "-m", "ssmcc.cli", "serve", repo]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr.readline().startswith("[ssmcc] starting tritonserver")
        deadline = time.monotonic() + 30
        while not _processes_mentioning(f"--model-repository={repo}"):  # the server is spawned
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert process.stdout.read() == ""
    finally:
        process.kill()
        process.wait()
    assert _processes_mentioning(repo) == []


def test_a_server_whose_owner_fails_is_reaped(mamba, tmp_path):
    """The server is stopped when the test using it fails (the context manager's exit) and when
    its object is dropped without a stop (a finalizer)."""
    _, artifact = mamba
    repo = export_triton(artifact, str(tmp_path / "repo"), name="m")
    with pytest.raises(RuntimeError, match="a failing test"):
        with TritonServer(repo):
            raise RuntimeError("a failing test")
    assert _processes_mentioning(repo) == []
    server = TritonServer(repo).start()
    process = server.process
    del server
    import gc

    gc.collect()
    assert process.poll() is not None and _processes_mentioning(repo) == []


def test_grpc_client_streams_the_same_tokens(mamba, server):
    compiled, _ = mamba
    client = Client(server.grpc_url, "mamba", protocol="grpc")
    prompt = _prompt(11, 6)
    assert (
        client.generate(prompt, 8, sequence_id=31)
        == compiled.generate(prompt[None], 8)[0, 6:].tolist()
    )
    with pytest.raises(ServingError, match="protocol must be one of http, grpc"):
        Client(server.url, "mamba", protocol="websocket")


FAMILIES = [
    "falcon-mamba-tiny",
    "mamba2-tiny",
    "jamba-tiny",
    "bamba-tiny",
    "granite-hybrid-tiny",
    "nemotron-h-tiny",
    "zamba-tiny",
    "zamba2-tiny",
    "falcon-h1-tiny",
]


@pytest.mark.slow
def test_every_family_serves_concurrent_sequences_with_generates_tokens(tmp_path):
    """One repository holding every other family (torch target; K/V-cache hybrids step one
    sequence at a time), one server: per model, 8 sequences interleaved at random (16 client
    threads across the models) give ``compiled.generate``'s tokens."""
    repo = str(tmp_path / "repo")
    compiled = {}
    for preset in FAMILIES:
        model = build_preset(preset).eval()
        compiled[preset] = ssmcc.compile(model, target="torch")
        artifact = str(tmp_path / preset)
        compiled[preset].save(artifact)
        export_triton(artifact, str(tmp_path / f"{preset}-repo"), name=preset, threads=1)
    os.makedirs(repo)
    for preset in FAMILIES:
        os.replace(str(tmp_path / f"{preset}-repo" / preset), os.path.join(repo, preset))

    def run(job):
        preset, sequence_id = job
        prompt = _prompt(sequence_id, 2 + sequence_id % 9)
        client, pause = Client(server.url, preset), random.Random(sequence_id)
        tokens = []
        for token in client.stream(prompt, 8, sequence_id=sequence_id):
            tokens.append(token)
            time.sleep(pause.uniform(0, 0.01))
        return preset, prompt, tokens

    jobs = [(preset, 1000 + 10 * i + j) for i, preset in enumerate(FAMILIES) for j in range(8)]
    random.Random(0).shuffle(jobs)
    with TritonServer(repo, ready_timeout_s=300) as server:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(run, jobs))
    for preset, prompt, tokens in results:
        expected = compiled[preset].generate(prompt[None], 8)[0, prompt.numel() :]
        assert tokens == expected.tolist(), preset
    assert _processes_mentioning(repo) == []
