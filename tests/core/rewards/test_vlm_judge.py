"""``vlm_judge`` and ``vlm_pairwise_judge`` on a tiny random LLaVA built here: asked through a real OpenAI-compatible
server process on loopback (``vlm_chat_server.py``, and ``transformers serve`` where its ``openai`` dependency is
installed) and in this process, which must agree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from tiny_vlm import build_tiny_vlm

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.evaluation.registry import build_metric, metric_problem
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.base import compares_groups
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.rewards.frames import FrameSelection
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError, TransientError

WHERE = "stages.grpo.rewards.0"
SERVER = Path(__file__).parents[2] / "vlm_chat_server.py"
PROMPTS = ["a red cat", "a blue dog", "a red cat", "a green car", "a red cat"]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("vlm")))


class Served:
    """A server process, started at once so that it loads while other tests run; ``url()`` waits for its
    ``/health`` and gives its ``/v1`` address (a server printing ``PORT n`` names its own port)."""

    def __init__(self, command: list[str], port: int | None = None) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.command, self.port = command, port

    def url(self) -> str:
        if self.port is None:
            assert self.process.stdout is not None
            self.port = int(self.process.stdout.readline().split()[1])
        for _ in range(900):
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).is_success:
                    return f"http://127.0.0.1:{self.port}/v1"
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{' '.join(self.command[:3])} did not start")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module", autouse=True)
def servers(request: pytest.FixtureRequest, vlm: str) -> Iterator[dict[str, Served]]:
    """The chat server, and one answering its first two requests with HTTP 503, started with the module when
    a selected test of it asks for one."""
    chosen = [item for item in request.session.items if item.module is request.module]
    commands = {
        "server": [sys.executable, str(SERVER), vlm],
        "failing_server": [sys.executable, str(SERVER), vlm, "--fail-first", "2"],
    }
    started = {
        name: Served(command)
        for name, command in commands.items()
        if any(name in item.fixturenames for item in chosen)  # type: ignore[attr-defined]
    }
    yield started
    for served in started.values():
        served.stop()


@pytest.fixture(scope="module")
def server(servers: dict[str, Served]) -> str:
    return servers["server"].url()


@pytest.fixture(scope="module")
def failing_server(servers: dict[str, Served]) -> str:
    return servers["failing_server"].url()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _media(count: int = len(PROMPTS)) -> torch.Tensor:
    media = torch.rand(count, 3, 32, 24, generator=torch.Generator().manual_seed(0))
    media[0], media[1:2] = 0.0, 1.0  # a black and a white image among the noise
    return media


def _judge(reward: str = "vlm_judge", **options: Any) -> Any:
    return build_reward(reward, options=options, where=WHERE)


@pytest.mark.parametrize(
    ("options", "where", "message"),
    [
        ({"mode": "likert"}, "mode", "mode must be one of yes_prob, score"),
        ({"question": "Is this a cat?"}, "question", "holding {prompt}"),
        ({"question": "{prompt} {scale}"}, "question", "may use {prompt}, {low} and {high}"),
        ({"low": 5, "high": 5}, "high", "high must be above low"),
        ({"pattern": "(unclosed"}, "pattern", "not a regular expression"),
        ({"top_logprobs": 50}, "top_logprobs", r"in \[1, 20\]"),
        ({"url": "ftp://judge:8000/v1"}, "url", "must be http"),
        ({"url": "http://127.0.0.1:1/v1", "concurrency": 0}, "concurrency", "positive integer"),
        ({"url": "http://127.0.0.1:1/v1", "token_env": "FLOWPOST_NO_SUCH_TOKEN"}, "token_env", "is not set"),
        ({"model": "/no/such/folder"}, "model", "no model folder"),
        ({"retries": 5}, "retries", "does not apply to a judge in this process"),
        ({"name": "my judge"}, "name", "must be a word"),
        ({"url": "http://127.0.0.1:1/v1", "dtype": "bfloat16"}, "dtype", "does not apply to a server's judge"),
        ({"url": "http://127.0.0.1:1/v1", "batch_size": 4}, "batch_size", "does not apply to a server's judge"),
        ({"batch_size": 0}, "batch_size", "positive integer"),
    ],
)
def test_bad_options_name_their_path(vlm: str, options: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(FlowpostError, match=rf"^{WHERE}\.options\.{where}: .*{message}"):
        _judge(**{"model": vlm, **options})
    with pytest.raises(FlowpostError, match=rf"^{WHERE}\.options\.wins: "):
        _judge("vlm_pairwise_judge", model=vlm, wins="most")


def test_a_question_template_reaches_the_model_and_two_judges_share_a_stage(vlm: str) -> None:
    media = _media(2)
    default = _judge(model=vlm)
    asked = _judge(model=vlm, name="vlm_shown", question='Is "{prompt}" shown here? yes or no')
    output = WeightedRewards([(default, 1.0), (asked, 1.0)], where="stages.grpo.rewards")(media, PROMPTS[:2], [{}, {}])
    assert list(output.components) == ["vlm_judge", "vlm_shown"]
    assert not torch.equal(output.components["vlm_judge"], output.components["vlm_shown"])


def test_a_pairwise_judge_needs_group_ids_and_is_no_metric(vlm: str) -> None:
    with pytest.raises(FlowpostError, match="sample 0 has no group_id"):
        _judge("vlm_pairwise_judge", model=vlm)(_media(2), PROMPTS[:2], [{}, {}])
    problem = metric_problem("vlm_pairwise_judge", where="evaluate.metrics.0")
    assert problem is not None and problem.startswith("evaluate.metrics.0: ") and "no groups" in problem
    with pytest.raises(FlowpostError, match="evaluation samples form no groups"):
        build_metric("vlm_pairwise_judge", options={"model": vlm}, where="evaluate.metrics.0", assets_dir=None)


def test_a_pairwise_judge_on_sampled_frames_compares_the_same_frame_of_each_clip(vlm: str) -> None:
    judge = _judge("vlm_pairwise_judge", model=vlm)
    selected = FrameSelection(judge, frames="sampled", sampled_frames=2, where=WHERE)
    clips = torch.rand(3, 3, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    prompts, metadata = ["a red cat"] * 3, [{"group_id": 0}] * 3
    scores = selected(clips, prompts, metadata)
    first, last = judge(clips[:, :, 0], prompts, metadata), judge(clips[:, :, 3], prompts, metadata)
    torch.testing.assert_close(scores, (first + last) / 2)
    assert compares_groups(selected) and float(scores.sum()) == pytest.approx(1.5)


def test_an_unreachable_server_names_the_endpoint_and_the_reward_entry() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    rewards = WeightedRewards(
        [(_judge(model="tiny", url=url, retries=1, backoff=0.01), 1.0)], where="stages.grpo.rewards"
    )
    with pytest.raises(TransientError) as caught:
        rewards(_media(2), PROMPTS[:2], [{}, {}])
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: reward 'vlm_judge': {url}/chat/completions: reward server failed 2 attempts")
    assert "ConnectError" in message


@pytest.mark.parametrize("mode", ["yes_prob", "score"])
def test_the_served_judge_gives_the_in_process_numbers(vlm: str, server: str, mode: str) -> None:
    media, metadata = _media(), [{}] * len(PROMPTS)
    served = _judge(model="tiny", url=server, mode=mode)(media, PROMPTS, metadata)
    local = _judge(model=vlm, mode=mode)(media, PROMPTS, metadata)
    torch.testing.assert_close(served, local, atol=1e-4, rtol=0)
    assert served.dtype == torch.float32 and bool(((served >= 0) & (served <= 1)).all())
    assert len(set(served.tolist())) > 1  # the model answers differently for different images
    other = _judge(model="tiny", url=server, mode=mode)(media, ["a green car"] * len(PROMPTS), metadata)
    assert not torch.equal(other, served)  # and for different prompts
    if mode == "yes_prob":
        assert 0 < float(served.max() - served.min()) and any(0 < v < 1 for v in served.tolist())


@pytest.mark.parametrize(
    ("reward", "mode"), [("vlm_judge", "yes_prob"), ("vlm_judge", "score"), ("vlm_pairwise_judge", "yes_prob")]
)
def test_requests_sharing_a_forward_answer_as_they_do_alone(vlm: str, reward: str, mode: str) -> None:
    prompts = ["a red cat", "a dog", "a very green car", "a cat", "a red and blue dog"]  # rows padded unevenly
    metadata = [{"group_id": i // 3} for i in range(len(prompts))]
    alone = _judge(reward, model=vlm, mode=mode, batch_size=1)(_media(), prompts, metadata)
    shared = _judge(reward, model=vlm, mode=mode, batch_size=3)(_media(), prompts, metadata)
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=0)
    assert len(set(alone.tolist())) > 1


def test_pairwise_win_rates_sum_to_half_of_each_group(vlm: str, server: str) -> None:
    media = _media()
    metadata = [{"group_id": 7}, {"group_id": 7}, {"group_id": 7}, {"group_id": 3}, {"group_id": 3}]
    prompts = ["a red cat"] * 3 + ["a green car"] * 2
    served = _judge("vlm_pairwise_judge", model="tiny", url=server)(media, prompts, metadata)
    local = _judge("vlm_pairwise_judge", model=vlm)(media, prompts, metadata)
    torch.testing.assert_close(served, local, atol=1e-4, rtol=0)
    assert float(served[:3].sum()) == pytest.approx(1.5) and float(served[3:].sum()) == pytest.approx(1.0)
    assert len(set(served[:3].tolist())) > 1  # the judge prefers some samples of the group
    counted = _judge("vlm_pairwise_judge", model=vlm, wins="count")(media, prompts, metadata)
    assert float(counted[:3].sum()) == pytest.approx(1.5) and float(counted[3:].sum()) == pytest.approx(1.0)
    assert all(v * 2 in (0, 1, 2, 3, 4) for v in (counted * 2).tolist())  # whole wins and ties of 1 or 2 others
    assert ((counted > 0.5) == (served > 0.5))[3:].all()  # in a pair, counting keeps the preferred one


def test_the_judge_is_an_evaluation_metric(vlm: str, server: str) -> None:
    assert metric_problem("vlm_judge", where="evaluate.metrics.0") is None
    metric = build_metric(
        "vlm_judge", options={"model": "tiny", "url": server}, where="evaluate.metrics.0", assets_dir=None
    )
    samples = EvalSamples(_media(), PROMPTS, [{}] * len(PROMPTS))
    expected = _judge(model=vlm)(samples.images, PROMPTS, samples.metadata).mean()
    assert metric(samples) == pytest.approx(float(expected), abs=1e-5)


def test_a_failing_server_is_retried(failing_server: str) -> None:
    url = failing_server  # two 503s, then answers
    with pytest.raises(TransientError, match=r"failed 1 attempts .* HTTP 503 .*warming up"):
        _judge(model="tiny", url=url, retries=0)(_media(1), PROMPTS[:1], [{}])
    scores = _judge(model="tiny", url=url, retries=1, backoff=0.01)(_media(1), PROMPTS[:1], [{}])
    assert scores.shape == (1,) and 0 <= float(scores[0]) <= 1  # the retry got the answer


def test_an_answer_without_a_number_names_the_endpoint(server: str) -> None:
    judge = _judge(model="tiny", url=server, mode="score", pattern=r"Final score: (\d+)")
    with pytest.raises(FlowpostError, match=rf"^{server}/chat/completions: the judge answered .* finds no number"):
        judge(_media(1), PROMPTS[:1], [{}])


@pytest.mark.slow
def test_transformers_serve_answers_the_score_judge_and_yes_prob_says_it_sends_no_logprobs(vlm: str) -> None:
    """``transformers serve`` needs the ``openai`` package; it answers chat completions with images, and ignores
    ``logprobs``, which yes_prob reports as a clear error."""
    pytest.importorskip("openai", reason="transformers serve needs the openai package")
    serve = Path(sys.executable).with_name("transformers")
    port = _free_port()
    command = [str(serve), "serve", vlm, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    transformers_serve = Served(command, port)
    try:
        url = transformers_serve.url()
        media, metadata = _media(), [{}] * len(PROMPTS)
        scores = _judge(model=vlm, url=url, mode="score")(media, PROMPTS, metadata)
        torch.testing.assert_close(scores, _judge(model=vlm, mode="score")(media, PROMPTS, metadata))
        with pytest.raises(FlowpostError, match="answered without logprobs; mode yes_prob needs"):
            _judge(model=vlm, url=url)(media, PROMPTS, metadata)
    finally:
        transformers_serve.stop()


def test_validation_refuses_overlapped_scoring_with_a_reward_comparing_groups() -> None:
    pipeline = pipeline_to_dict(load_pipeline(None))
    grpo = pipeline["stages"]["grpo"]
    grpo["rewards"] = [{"name": "digit_adherence"}, {"name": "vlm_pairwise_judge", "options": {"model": "unused"}}]
    grpo["train"]["overlap_rewards"] = True
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(pipeline)
    assert "stages.grpo.train.overlap_rewards: " in str(info.value)
    assert "'vlm_pairwise_judge' (stages.grpo.rewards.1) compares whole groups" in str(info.value)
    grpo["train"]["overlap_rewards"] = False
    validate_pipeline(pipeline)
