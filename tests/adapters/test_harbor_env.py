"""HarborTaskEnv (``sao_gym/HarborTask-v0``) on exported tasks, with the Docker engine.

Needs the daemon and the sandbox image ``sao-gym-sandbox:latest``: without them the tests
skip, or fail under ``SAO_SANDBOX_REQUIRE=docker`` (tests/sandbox/conftest.py's convention).
The Coq task also needs ``sao-gym-sandbox-coq:latest``, which `make test` does not build:
without it that test skips, as tests/envs/coq_proof's Docker test does.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

import sao_gym
from sao_gym.adapters.harbor import HarborTaskEnv
from sao_gym.envs.code_repo.harbor import IMAGE as CODE_IMAGE
from sao_gym.envs.coq_proof.harbor import IMAGE as COQ_IMAGE
from tests.adapters.test_harbor import call, export_all

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, list[Path]]:
    return export_all(tmp_path_factory.mktemp("harbor"))


# ----- HarborTaskEnv with the Docker engine --------------------------------------------------
@pytest.fixture(scope="module")
def docker_images() -> set[str]:
    """The sandbox images present (skips, or fails under SAO_SANDBOX_REQUIRE, without Docker)."""
    from sao_gym.sandbox.docker import DockerSandbox
    from tests.sandbox.conftest import _unavailable, backend_class

    async def probe() -> set[str]:
        await backend_class("docker")  # skips without a daemon and the default image
        return {image for image in (CODE_IMAGE, COQ_IMAGE) if await DockerSandbox.available(image)}

    images = asyncio.run(probe())
    if CODE_IMAGE not in images:
        _unavailable("docker", f"no Docker image {CODE_IMAGE} (sao-gym sandbox build-image)")
    return images


@pytest.fixture
def no_leftovers(docker_images):
    from sao_gym.sandbox.docker import DockerSandbox

    before = set(asyncio.run(DockerSandbox.leftovers()))
    yield
    left = set(asyncio.run(DockerSandbox.leftovers())) - before
    assert not left, f"sandbox containers left behind: {left}"


def need_coq(docker_images: set[str]) -> None:
    """Skip without the Coq image (`make test` builds only the default one)."""
    if COQ_IMAGE not in docker_images:
        pytest.skip(f"no Docker image {COQ_IMAGE} (see docs/envs/coq_proof.md)")


async def episode(env: HarborTaskEnv, *commands: str) -> tuple[float, str, dict]:
    await env.areset(seed=0)
    for command in commands:
        obs, *_ = await env.astep(call("bash", command=command))
        assert obs[0]["content"].startswith("exit code 0"), obs[0]["content"]
    obs, reward, terminated, truncated, info = await env.astep(call("submit"))
    assert terminated and not truncated
    return reward, obs[0]["content"], info


@pytest.mark.parametrize("kind,index", [("code", i) for i in range(5)] + [("coq", 1)])
async def test_reference_solution_scores_1_and_an_empty_one_0(kind, index, exported,
                                                               docker_images, no_leftovers):
    if kind == "coq":
        need_coq(docker_images)
    env = HarborTaskEnv(task_dir=exported[kind][index], oracle=True)
    try:
        reward, text, info = await episode(env, "bash /solution/solve.sh")
        assert reward == 1.0, text
        assert "infra_failure" not in info and info["verifier_exit_code"] == 0
        reward, text, info = await episode(env)
        assert reward == 0.0, text
        assert ("not resolved" if kind == "code" else "cannot read /app/proof.v") in text
    finally:
        await env.aclose()


def edited_task(src: Path, dst: Path, test_sh: str, *, shared: bool = False) -> Path:
    shutil.copytree(src, dst)
    (dst / "tests/test.sh").write_text("#!/bin/bash\n" + test_sh)
    if shared:
        toml = (dst / "task.toml").read_text()
        (dst / "task.toml").write_text(toml.replace('environment_mode = "separate"',
                                                    'environment_mode = "shared"'))
    return dst


async def test_broken_graders_give_0_with_the_reason(tmp_path, exported, no_leftovers):
    src = exported["code"][0]
    cases = [
        ("echo 'no reward today'\n", False, "The tests wrote no reward file"),
        ("echo yes > /logs/verifier/reward.txt\n", True, "does not hold a number ('yes')"),
        ("echo '{\"reward\": 0.75}' > /logs/verifier/reward.json; echo 0 > "
         "/logs/verifier/reward.txt\n", True, None),
        ("sleep 30\n", True, "ran past their time limit"),
    ]
    for i, (script, shared, message) in enumerate(cases):
        task = edited_task(src, tmp_path / f"t{i}", script, shared=shared)
        if "sleep" in script:
            toml = (task / "task.toml").read_text()
            (task / "task.toml").write_text(toml.replace("timeout_sec = 300.0",
                                                         "timeout_sec = 2.0"))
        env = HarborTaskEnv(task_dir=task)
        try:
            reward, text, info = await episode(env)
        finally:
            await env.aclose()
        if message is None:
            assert reward == 0.75, text
        else:
            assert reward == 0.0 and message in text, text
            assert not info.get("infra_failure")
        if i == 0:
            assert "no reward today" in info["verifier_output"] and "no reward today" in text


async def test_shared_mode_a_planted_reward_file_does_not_count(tmp_path, exported,
                                                                 no_leftovers):
    task = edited_task(exported["code"][0], tmp_path / "t", "echo graded\n", shared=True)
    env = HarborTaskEnv(task_dir=task)
    try:
        reward, text, _ = await episode(env, "mkdir -p /logs/verifier && echo 1 > "
                                        "/logs/verifier/reward.txt && chmod 555 /logs/verifier")
    finally:
        await env.aclose()
    assert reward == 0.0 and "wrote no reward file" in text, text


async def test_turn_limit_grades_and_infra_failures_are_marked(exported, no_leftovers):
    env = HarborTaskEnv(task_dir=exported["code"][0], oracle=True, max_turns=2)
    try:
        await env.areset(seed=0)
        obs, reward, terminated, truncated, info = await env.astep(call("bash", command="true"))
        assert (reward, terminated, truncated) == (0.0, False, False)
        obs, reward, terminated, truncated, info = await env.astep(
            call("bash", command="bash /solution/solve.sh"))
        assert (reward, terminated, truncated) == (1.0, False, True)
        assert "turn limit (2) is reached" in obs[-1]["content"]
        assert info["stop_reason"] == sao_gym.StopReason.MAX_TURNS
        await env.areset(seed=0)
        await env._box.sandbox.aclose()  # the container dies under the episode
        obs, reward, terminated, _, info = await env.astep(call("submit"))
        assert (reward, terminated, info["infra_failure"]) == (0.0, True, True)
        assert "infrastructure failure" in obs[0]["content"]
    finally:
        await env.aclose()


async def test_an_image_that_cannot_be_built_offline_is_a_sandbox_error(tmp_path, exported,
                                                                        no_leftovers):
    from sao_gym.sandbox import SandboxUnavailable

    task = tmp_path / "t"
    shutil.copytree(exported["code"][0], task)
    (task / "environment/Dockerfile").write_text("FROM sao-gym-no-such-image:1\n")
    env = HarborTaskEnv(task_dir=task)
    with pytest.raises(SandboxUnavailable, match="'sao-gym-no-such-image:1' is not in the "
                                                 "local Docker engine"):
        await env.areset(seed=0)
    (task / "environment/Dockerfile").write_text("FROM sao-gym-sandbox:latest\nRUN exit 3\n")
    with pytest.raises(SandboxUnavailable, match="offline docker build failed"):
        await env.areset(seed=0)
    await env.aclose()


def test_harbor_task_env_passes_check_agent_env(tmp_path, exported, no_leftovers):
    from sao_gym.utils.env_checker import check_agent_env

    for task in exported["code"]:  # the CodeRepo ones: make test builds only their image
        shutil.copytree(task, tmp_path / task.name)
    env = sao_gym.make("sao_gym/HarborTask-v0", tasks_dir=tmp_path,
                       sandbox={"pool": {"size": 2}})
    assert len(env.unwrapped.tasks) == len(exported["code"]) == 5
    assert "gymnasium check_env" in check_agent_env(env)


async def test_a_hand_written_task_with_a_verifier_image_and_a_file_artifact(tmp_path,
                                                                             no_leftovers):
    task = tmp_path / "hello"
    files = {
        "instruction.md": "Write the word done to /app/answer.txt.\n",
        "task.toml": 'schema_version = "1.4"\nartifacts = ["/app/answer.txt"]\n\n[verifier]\n'
                     'timeout_sec = 60.0\nenvironment_mode = "separate"\n',
        "environment/Dockerfile": "FROM sao-gym-sandbox:latest\nUSER root\nWORKDIR /app\n"
                                  "RUN echo hello > /app/greeting.txt\n",
        "tests/Dockerfile": "FROM sao-gym-sandbox:latest\nUSER root\nCOPY . /tests/\n",
        "tests/test.sh": "#!/bin/bash\nls /app; if grep -qx done /app/answer.txt; then echo 1; "
                         "else echo 0; fi > /logs/verifier/reward.txt\n",
    }
    for rel, text in files.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    (task / "tests/test.sh").chmod(0o755)
    env = HarborTaskEnv(task_dir=task)
    try:
        reward, text, info = await episode(env, "cat greeting.txt && echo done > answer.txt")
        assert reward == 1.0, text
        assert "answer.txt" in info["verifier_output"]  # the artifact, in the verifier's /app
        assert "greeting.txt" not in info["verifier_output"]  # /tests' image, not the agent's
        reward, text, _ = await episode(env)
        assert reward == 0.0, text
    finally:
        await env.aclose()
