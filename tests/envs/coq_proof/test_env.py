"""sao_gym/CoqProof-v0: real coqc in a real bubblewrap sandbox, bundled theorems, tricks.

Every reference proof must score 1 through the env's reward path and the
truncated reference 0; a battery of known tricks (Admitted, admit, Axiom,
Abort and redeclare, Qed then more, Unset Guard Checking, Require, comment
and string tricks, loops) must score 0, with Coq's own layer checked alone
too (the lexical check switched off).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

import sao_gym
from sao_gym import run_episode
from sao_gym.agents import ScriptedAgent
from sao_gym.envs.coq_proof import (
    CoqChecker,
    CoqProofEnv,
    CoqTask,
    ScriptRejected,
    bundled_tasks,
    load_v_files,
    prepare_script,
    tasks_from_v,
)
from sao_gym.envs.coq_proof import checker as checker_mod
from sao_gym.envs.coq_proof.coqlex import CoqSyntaxError, blank_comments, split_sentences
from sao_gym.sandbox import ExecResult, SandboxUnavailable
from sao_gym.sandbox.local import LocalSandbox
from sao_gym.utils.env_checker import check_agent_env
from tests.helpers import call, calls_msg

ENV_ID = "sao_gym/CoqProof-v0"
TASKS = bundled_tasks()
BY_ID = {t.id: t for t in TASKS}

pytestmark = pytest.mark.skipif(
    not asyncio.run(LocalSandbox.available()), reason="bubblewrap is not installed"
)


def _step(env, name, script):
    return env.step(calls_msg(call(name, {"script": script})))


async def _astep(env, name, script):
    return await env.astep(calls_msg(call(name, {"script": script})))


def _drop_last_tactic(script: str) -> str:
    """The script without its last sentence (a real proof minus its final step)."""
    sentences = [s for s in split_sentences(script) if s.body.strip("{}-+* \n")]
    return script[: sentences[-1].start] or "idtac."


# ----- data ---------------------------------------------------------------------------
def test_bundled_set_is_graded_and_well_formed():
    assert len(TASKS) >= 60
    assert len(BY_ID) == len(TASKS)
    levels = Counter(t.difficulty for t in TASKS)
    assert set(levels) == {1, 2, 3} and min(levels.values()) >= 10, levels
    topics = Counter(t.topic for t in TASKS)
    assert {"logic", "nat", "list", "induction"} <= set(topics), topics
    for t in TASKS:
        assert t.reference_proof and t.source == "bundled"
        assert t.statement.startswith("Theorem ") and t.name == t.id
        assert t.statement.rstrip().endswith(".")
        prepare_script(t.reference_proof, extra_tactics=frozenset())  # tactics only
        assert t.reference_proof not in t.context


@pytest.mark.slow
async def test_every_reference_proof_scores_one_and_truncated_zero():
    """Each bundled theorem: the reference is accepted through submit_proof (reward 1),
    the reference minus its last sentence is not (check_proof says so, episode goes on)."""
    queue = list(TASKS)
    results: dict[str, tuple] = {}
    step_times: list[float] = []

    async def worker():
        env = CoqProofEnv(goals_on_error=False)
        try:
            while queue:
                task = queue.pop()
                await env.areset(options={"task": task.id})
                t0 = time.perf_counter()
                obs, r0, term0, _, info0 = await _astep(
                    env, "check_proof", _drop_last_tactic(task.reference_proof))
                step_times.append(time.perf_counter() - t0)
                obs1, r1, term1, _, info1 = await _astep(env, "submit_proof",
                                                         task.reference_proof)
                results[task.id] = (r0, term0, info0["coq_status"], obs[0]["content"],
                                    r1, term1, info1, obs1[0]["content"])
        finally:
            await env.aclose()

    await asyncio.gather(*(worker() for _ in range(3)))
    assert len(results) == len(TASKS)
    for tid, (r0, term0, status0, text0, r1, term1, info1, text1) in results.items():
        assert (r0, term0) == (0.0, False), tid
        assert status0 in ("incomplete", "error"), (tid, status0, text0)
        assert (r1, term1) == (1.0, True), (tid, text1)
        assert info1["reward_components"] == {"proved": 1.0} and info1["coq_status"] == "proved"
    step_times.sort()
    assert step_times[len(step_times) // 2] < 10.0, step_times


# ----- tricks -------------------------------------------------------------------------
TRICKS = {
    "empty": "",
    "comment only": "(* I will prove it later *)",
    "Admitted": "intros. Admitted.",
    "admit": "intros. admit.",
    "give_up": "intros. give_up.",
    "Axiom then use": "Axiom cheat : False. destruct cheat.",
    "Parameter": "Parameter cheat : False. destruct cheat.",
    "Abort and redeclare": "Abort. Theorem {name} : True. Proof. exact I.",
    "Qed then new theorem": "idtac. Qed. Theorem {name}' : True. Proof. exact I.",
    "selector brace Qed": "intros. 1: { Qed.",
    "Defined early": "intros. Defined. Lemma x : True. Proof. exact I.",
    "Unset Guard Checking": "Unset Guard Checking. intros.",
    "Unset Universe Checking": "Unset Universe Checking. intros. admit.",
    "Require Classical": "Require Import Classical. intros. admit.",
    "Module shadow": "Abort. Module M. Theorem {name} : True. Proof. exact I.",
    "Section shadow": "Abort. Section S. Theorem {name} : True. Proof. exact I.",
    "unterminated comment": "intros. (*",
    "comment hiding Qed": "intros. (* *) Qed (* *) .",
    "string then comment": 'idtac "". Qed. (*"',
    "Fail Fail Abort": "Fail Fail Abort.",
    "attribute Axiom": "#[local] Axiom cheat : False.",
    "Local Axiom": "Local Axiom cheat : False.",
    "Ltac definition": "Ltac t := idtac. t.",
    "unguarded fix": "exact (fix f (x : nat) {struct x} : False := f x).",
    "exact_no_check": "intros. exact_no_check I.",
    "wrong tactic": "intros. discriminate.",
    "print fake verdict": 'idtac "Closed under the global context".',
    "trailing Fail": "intros. Fail",
}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["and_swap", "reverse_involutive"])
async def test_known_tricks_score_zero(task_id):
    task = BY_ID[task_id]
    env = CoqProofEnv(timeout_s=20)
    statuses = {}
    try:
        for name, script in TRICKS.items():
            await env.areset(options={"task": task_id})
            obs, reward, term, trunc, info = await _astep(
                env, "submit_proof", script.replace("{name}", task.name))
            assert (reward, term, trunc) == (0.0, True, False), (name, obs)
            assert obs[0]["content"].startswith("Proof rejected."), (name, obs)
            statuses[name] = info["coq_status"]
    finally:
        await env.aclose()
    assert statuses["Admitted"] == "rejected" and statuses["admit"] == "incomplete"
    assert statuses["exact_no_check"] == "error" and statuses["wrong tactic"] == "error"
    assert statuses["print fake verdict"] == "incomplete"


@pytest.mark.slow
async def test_coq_layer_alone_defeats_escapes(monkeypatch):
    """With the lexical check switched off, Coq's verdict still rejects every escape."""
    monkeypatch.setattr(checker_mod, "_check_sentence", lambda *a, **k: None)
    monkeypatch.setattr(checker_mod, "FORBIDDEN_ANYWHERE", frozenset())
    task = BY_ID["add_comm"]
    stmt = "forall n m : nat, n + m = m + n"
    escapes = {
        "abort + redeclare": f"Abort. Theorem add_comm : {stmt}. Proof. Admitted. "
                             "Lemma x : True. Proof. exact I.",
        "abort + weaker": "Abort. Theorem add_comm : True. Proof. exact I.",
        "admitted + more": "intros. Admitted. Lemma x : True. Proof. exact I.",
        "module shadow": "Abort. Module M. Theorem add_comm : True. Proof. exact I.",
        "section shadow": "Abort. Section S. Lemma z : True. Proof. exact I.",
        "guard off": "Unset Guard Checking. exact (fix f (n m : nat) {struct n} : "
                     "n + m = m + n := f n m).",
        "axiom in proof": f"Axiom cheat : {stmt}. exact cheat.",
        "positivity off": "Unset Positivity Checking. intros. admit.",
    }
    checker = CoqChecker("local", timeout_s=20)
    try:
        for name, script in escapes.items():
            result = await checker.check(task, script)
            assert not result.proved, (name, result)
            assert result.status in ("error", "axioms", "incomplete"), (name, result)
        guard = await checker.check(task, escapes["guard off"])
        assert guard.status == "axioms" and "assumed to be guarded" in guard.message
    finally:
        await checker.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("script, status", [
    ("intros. repeat (assert True by exact I).", "timeout"),
    ("do 100000000 idtac.", "timeout"),
])
def test_looping_scripts_time_out_into_reward_zero(script, status):
    env = sao_gym.make(ENV_ID, timeout_s=3)
    env.reset(options={"task": "add_0_r"})
    t0 = time.perf_counter()
    obs, reward, term, _, info = _step(env, "check_proof", script)
    assert time.perf_counter() - t0 < 15
    assert (reward, term, info["coq_status"]) == (0.0, False, status)
    assert "did not finish within 3 s" in obs[0]["content"]
    obs, reward, term, _, info = _step(env, "submit_proof", script)
    assert (reward, term, info["coq_status"]) == (0.0, True, status)
    env.close()


def test_hostile_scripts_get_observations():
    env = sao_gym.make(ENV_ID)
    env.reset(options={"task": "and_swap"})
    cases = {
        "1 MB script": ("idtac. " * 150_000, "characters long"),
        "NUL byte": ("intros.\x00", "control character"),
        "lone surrogate": ("intros. \ud800", "not valid Unicode"),
        "deeply nested comment": ("(*" * 9_000, "unterminated comment"),
        "unterminated string": ('idtac "oops.', "unterminated string"),
    }
    for name, (script, expected) in cases.items():
        obs, reward, term, trunc, info = _step(env, "check_proof", script)
        assert (reward, term, trunc, info["coq_status"]) == (0.0, False, False, "rejected"), name
        assert expected in obs[0]["content"], (name, obs[0]["content"][:300])
        assert len(obs[0]["content"]) <= 6100
    # Deep nesting and flooding reach Coq; both come back as ordinary messages.
    obs, reward, term, _, info = _step(env, "check_proof", "exact " + "(" * 15_000 + "I.")
    assert (reward, term) == (0.0, False) and info["coq_status"] == "error"
    flood = 'do 20000 idtac "' + "x" * 100 + '". intros P Q [HP HQ]. split; assumption.'
    obs, reward, term, _, info = _step(env, "check_proof", flood)
    assert info["coq_status"] != "proved" and len(obs[0]["content"]) <= 6100
    env.close()


# ----- messages for repair ------------------------------------------------------------
def test_check_proof_messages_support_repair():
    env = sao_gym.make(ENV_ID)
    obs, info = env.reset(options={"task": "add_succ_r"})
    prompt = obs[-1]["content"]
    assert "Theorem add_succ_r : forall n m : nat, n + S m = S (n + m)." in prompt
    assert env.unwrapped.task["reference_proof"] not in prompt
    # A failing tactic: its line in the script, Coq's error, the goals before it.
    script = "(* try *)\nintros n m.\ninduction n as [|n IH].\n- reflexivity.\n- rewrite foo."
    obs, reward, term, _, info = _step(env, "check_proof", script)
    text = obs[0]["content"]
    assert (reward, term, info["coq_status"]) == (0.0, False, "error")
    assert "at line 5, characters 10-13 of your script `- rewrite foo`" in text
    assert "The reference foo was not found" in text
    assert "Goals before that sentence:" in text and "S n + S m = S (S n + m)" in text
    assert "sao_" not in text and "SaoProof" not in text
    # Unfinished: the remaining goals.
    obs, *_ , info = _step(env, "check_proof", "intros n m. induction n as [|n IH]; simpl.")
    assert info["coq_status"] == "incomplete"
    assert "Remaining goals:" in obs[0]["content"] and "S m = S m" in obs[0]["content"]
    # Fixed: complete, with a leading Proof. and a trailing Qed. tolerated.
    fixed = "Proof.\n  intros n m. induction n as [|n IH]; simpl.\n  - reflexivity.\n" \
            "  - rewrite IH. reflexivity.\nQed."
    obs, reward, term, _, info = _step(env, "check_proof", fixed)
    assert (reward, term, info["coq_status"]) == (0.0, False, "proved")
    assert "submit_proof" in obs[0]["content"] and info["metrics"]["coq_seconds"] > 0
    obs, reward, term, _, info = _step(env, "submit_proof", fixed)
    assert (reward, term) == (1.0, True) and info["reward_components"] == {"proved": 1.0}
    env.close()


def test_prepare_script_keeps_the_layout_and_refuses_commands():
    prepared = prepare_script("Proof.\n  intros. (* a. b *)\n  auto")
    assert prepared.code.split("\n") == [" " * 6, "  intros. " + " " * 10, "  auto."]
    assert [s.body.strip() for s in prepared.sentences] == ["intros", "auto"]
    prepared = prepare_script("intros.\n  auto.\n}\nQed.")
    assert prepared.code.split("\n") == ["intros.", "  auto.", "}", "    "]
    assert len(prepare_script("split. { exact I. }\n  { exact I. }").sentences) == 4
    prepare_script("all: try (idtac \"Qed. Admitted.\"). 2: { Show. } Search nat.")
    prepare_script("Case \"n = 0\".", extra_tactics=frozenset({"Case"}))
    for script, reason in [
        ("Qed.", "empty"), ("Case \"n\".", "`Case` is a Coq command"),
        ("- Admitted.", "`Admitted`"), ("{ Abort. }", "`Abort`"),
        ("Time Timeout 2 Succeed Require Import Lia.", "`Require`"),
        ("Proof with auto.", "`Proof`"), ("$x.", "cannot start with '[$]'"),
        ("intros. -", "incomplete sentence"), ("auto\nQed.", "`Qed`"),
    ]:
        with pytest.raises(ScriptRejected, match=reason):
            prepare_script(script)


def test_lexer_matches_coq_comments_and_strings():
    comment = '(* x (* "*)" *) y. *)'
    text = f'a {comment} b "c. (* d" . e.'
    assert blank_comments(text) == "a " + " " * len(comment) + ' b "c. (* d" . e.'
    bodies = [s.body for s in split_sentences(text)]
    assert len(bodies) == 2 and bodies[1] == "e"
    assert bodies[0].startswith("a  ") and bodies[0].endswith(' b "c. (* d"')
    assert [s.body for s in split_sentences("apply Nat.add_comm.\nx..  y")] == \
        ["apply Nat.add_comm", "x.", "y"]
    assert split_sentences("exact I.")[0].terminated
    assert not split_sentences("exact I")[0].terminated
    for bad in ("(* a", '"a', '(* "*) *)'):
        with pytest.raises(CoqSyntaxError):
            split_sentences(bad)


@pytest.mark.parametrize("module", ["coqlex", "tasks"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"sao_gym.envs.coq_proof.{module}"))
    assert result.attempted > 0 and result.failed == 0


# ----- env interface ------------------------------------------------------------------
def test_check_agent_env_passes():
    env = sao_gym.make(ENV_ID)
    passed = check_agent_env(env)
    assert "hostile actions" in passed and "seed determinism" in passed
    env.close()


def test_task_dict_seeding_and_options():
    env = sao_gym.make(ENV_ID)
    env.reset(seed=5)
    first = dict(env.unwrapped.task)
    for key in ("id", "prompt", "statement", "context", "reference_proof", "difficulty",
                "name", "topic"):
        assert key in first, key
    env.reset(seed=5)
    assert env.unwrapped.task == first
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(40)}
    assert len(seen) > 20
    env.reset(options={"task": 0})
    assert env.unwrapped.task["id"] == TASKS[0].id
    custom = {"id": "mine", "statement": "Lemma mine : 2 + 2 = 4.",
              "reference_proof": "reflexivity."}
    obs, info = env.reset(options={"task": custom})
    assert info["task_id"] == "mine" and "Lemma mine : 2 + 2 = 4." in obs[-1]["content"]
    assert _step(env, "submit_proof", "reflexivity.")[1] == 1.0
    with pytest.raises(ValueError, match="unknown task id"):
        env.reset(options={"task": "no_such_theorem"})
    with pytest.raises(ValueError, match="statement"):
        env.reset(options={"task": {"id": "x", "statement": "Definition x := 1."}})
    env.close()
    only = CoqProofEnv(difficulty=3, topics=["nat", "list"])
    assert only.tasks and all(t.difficulty == 3 and t.topic in ("nat", "list")
                              for t in only.tasks)


@pytest.mark.parametrize("kwargs, match", [
    ({"difficulty": 4}, "difficulty"),
    ({"topics": ["geometry"]}, "no Coq task left"),
    ({"sandbox": "vm"}, "unknown sandbox backend"),
    ({"sandbox": {"backend": "local", "limits": {"gpus": 1}}}, "unknown sandbox limits"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"tasks": "/nonexistent/theorems.jsonl"}, "no such task file"),
    ({"tasks": "/nonexistent/dir"}, "no such .v file"),
    ({"tasks": [{"statement": "Theorem a : True."}, {"statement": "Theorem a : True."}]},
     "unique"),
    ({"tasks": [{"statement": "Theorem a True."}]}, "type"),
    ({"tasks": [{"statement": "Theorem a : True.", "difficulty": 9}]}, "difficulty"),
    ({"tasks": {"statement": "Theorem a : True."}}, "list of tasks"),
    ({"max_context_chars": 5}, "max_context_chars"),
])
def test_bad_constructor_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoqProofEnv(**kwargs)


# ----- users' .v files ----------------------------------------------------------------
USER_FILE = """(* A development with holes. *)
From Coq Require Import List.
Import ListNotations.

Definition twice (n : nat) : nat := n + n.

Lemma twice_0 : twice 0 = 0.
Proof. reflexivity. Qed.

Lemma twice_S : forall n, twice (S n) = S (S (twice n)).
Proof.
  intros n. unfold twice. simpl.
  (* stuck *)
Admitted.

Section Lists.
  Variable A : Type.

  Lemma app_nil_end (l : list A) : l ++ [] = l.
  Proof. induction l. Admitted.

  Theorem uses_earlier : forall l : list A, (l ++ []) ++ [] = l.
  Proof.
    intros l.
  Admitted.
End Lists.

Module M.
  Lemma in_module : 1 + 1 = 2.
  Proof.
  Admitted.
End M.

Example ex1 : twice 2 = 4.
Proof. Admitted.
"""


def test_v_loader_turns_admitted_proofs_into_tasks(tmp_path):
    (tmp_path / "mylib.v").write_text(USER_FILE)
    tasks = load_v_files(tmp_path)
    assert [t.id for t in tasks] == ["mylib:twice_S", "mylib:app_nil_end",
                                    "mylib:uses_earlier", "mylib:in_module", "mylib:ex1"]
    by = {t.name: t for t in tasks}
    assert all(t.reference_proof is None and t.difficulty is None for t in tasks)
    assert by["twice_S"].statement == "Lemma twice_S : forall n, twice (S n) = S (S (twice n))."
    assert by["twice_S"].context.rstrip().endswith("Proof. reflexivity. Qed.")
    assert "Lemma app_nil_end" in by["uses_earlier"].context  # earlier Admitted kept
    assert by["app_nil_end"].signature == "(l : list A) : l ++ [] = l"
    assert by["uses_earlier"].epilogue == "End Lists.\n"
    assert by["in_module"].epilogue == "End M.\n" and by["ex1"].epilogue == ""
    with pytest.raises(ValueError, match="no theorem ending in 'Admitted.'"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "done.v").write_text("Lemma a : True. Proof. exact I. Qed.")
        load_v_files(tmp_path / "empty")
    assert tasks_from_v("Lemma a : True.\nProof.\n  - idtac.\n}\nAdmitted.")[0].id == "a"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mylib.v").write_text("Lemma twice_S : True.\nProof. Admitted.")
    assert [t.id for t in load_v_files(tmp_path)][-1] == "sub/mylib:twice_S"


@pytest.mark.slow
def test_v_tasks_are_checked_in_their_sections_and_modules(tmp_path):
    (tmp_path / "mylib.v").write_text(USER_FILE)
    env = CoqProofEnv(tasks=tmp_path / "mylib.v")
    assert [t.id for t in env.tasks][0] == "mylib:twice_S"
    cases = [
        ("mylib:twice_S", "intros n. unfold twice. simpl. rewrite <- plus_n_Sm. reflexivity.",
         1.0, "proved"),
        ("mylib:app_nil_end",
         "induction l as [|x l IH]; simpl; [reflexivity | rewrite IH; reflexivity].",
         1.0, "proved"),
        ("mylib:uses_earlier", "intros l. rewrite !app_nil_end. reflexivity.", 0.0, "axioms"),
        ("mylib:in_module", "reflexivity.", 1.0, "proved"),
        ("mylib:ex1", "reflexivity.", 1.0, "proved"),
    ]
    for task_id, script, reward, status in cases:
        obs, _ = env.reset(options={"task": task_id})
        assert "Admitted" not in obs[-1]["content"].split("Theorem:")[-1]
        out = _step(env, "submit_proof", script)
        assert (out[1], out[4]["coq_status"]) == (reward, status), (task_id, out[0])
    env.close()


# ----- sandbox failures are infrastructure failures -----------------------------------
class _NoCoqSandbox:
    """A sandbox without coqc (like an image built without Coq)."""

    workdir = "/work"

    def __init__(self):
        self.closed = False

    async def start(self):
        pass

    async def run(self, cmd, **kwargs):
        return ExecResult(127, "", "", False, False, False, 0.0)

    async def write_file(self, path, data):
        pass

    async def read_file(self, path):
        return b""

    async def upload(self, local_dir, path="."):
        pass

    async def aclose(self):
        self.closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


async def test_missing_coqc_is_an_infra_failure(monkeypatch):
    fakes = []

    def fake_make(spec):
        fakes.append(_NoCoqSandbox())
        return fakes[-1]

    monkeypatch.setattr(checker_mod, "make_sandbox", fake_make)
    env = sao_gym.make(ENV_ID)
    await env.areset(options={"task": "and_swap"})
    with pytest.raises(SandboxUnavailable, match="coqc is not available"):
        await _astep(env, "check_proof", "intros. auto.")
    agent = ScriptedAgent([calls_msg(call("submit_proof", {"script": "tauto."}))])
    rollout = await run_episode(env, agent, options={"task": "and_swap"})
    assert rollout.infra_failure and rollout.reward == 0.0 and not rollout.terminated
    await env.aclose()
    assert fakes and all(f.closed for f in fakes)


def test_checker_rejects_bad_settings():
    with pytest.raises(ValueError, match="timeout_s"):
        CoqChecker(timeout_s=-1)
    with pytest.raises(ValueError, match="max_message_chars"):
        CoqChecker(max_message_chars=10)
    with pytest.raises(ValueError, match="statement"):
        CoqTask(id="x", statement="Theorem x : True")


# ----- Docker -------------------------------------------------------------------------
COQ_IMAGE = "sao-gym-sandbox-coq:latest"
"""Built by docs/envs/coq_proof.md's command; the Coq tests in Docker run when it exists."""


def test_docker_spec_defaults_to_the_coq_image():
    assert CoqProofEnv(sandbox="docker").sandbox_spec == {"backend": "docker",
                                                          "image": COQ_IMAGE}
    spec = {"backend": "docker", "image": "mine:1", "limits": {"memory_mb": 2048}}
    assert CoqProofEnv(sandbox=spec).sandbox_spec == spec
    assert CoqProofEnv().sandbox_spec == "local"


@pytest.mark.slow
@pytest.mark.parametrize("image", ["sao-gym-sandbox:latest", COQ_IMAGE])
async def test_docker_sandbox_runs_coqc_or_says_it_cannot(image):
    from tests.sandbox.conftest import backend_class

    await backend_class("docker")  # skips (or fails under SAO_SANDBOX_REQUIRE) without Docker
    from sao_gym.sandbox.docker import DockerSandbox

    if not await DockerSandbox.available(image):
        pytest.skip(f"no Docker image {image}")
    async with DockerSandbox(image=image) as sb:
        has_coq = (await sb.run("command -v coqc", timeout_s=30)).ok
    env = CoqProofEnv(sandbox={"backend": "docker", "image": image}, timeout_s=5)
    try:
        await env.areset(options={"task": "reverse_involutive"})
        if not has_coq:
            with pytest.raises(SandboxUnavailable, match="coqc is not available"):
                await _astep(env, "check_proof", "tauto.")
            return
        out = await _astep(env, "check_proof", "intros. apply nope.")
        assert out[4]["coq_status"] == "error" and "Goals before" in out[0][0]["content"]
        out = await _astep(env, "check_proof", "do 100000000 idtac.")
        assert out[4]["coq_status"] == "timeout"
        out = await _astep(env, "submit_proof", "intros. Admitted.")
        assert out[1:3] == (0.0, True)
        await env.areset(options={"task": "reverse_involutive"})
        out = await _astep(env, "submit_proof", BY_ID["reverse_involutive"].reference_proof)
        assert out[1:3] == (1.0, True), out[0]
    finally:
        await env.aclose()
