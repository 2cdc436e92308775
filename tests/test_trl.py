"""TRL's own `GRPOTrainer` with `environment_factory` against real openenv-nb servers, on CPU, with no download:
a tiny random model and a tokenizer built here (`openenv_nb.trl.tiny_*`)."""
import os
import random
from statistics import mean
from types import SimpleNamespace

import pytest

from conftest import HERE, need_trl, start_server
from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoEnvironment, EchoObservation
from openenv_nb.types import State
from openenv_nb.envspec import EnvSpec, EnvSpecs
from openenv_nb.rubrics import Rubric
from openenv_nb.trl import environment_factory, mcp_tools, tiny_causal_lm, tiny_chat_tokenizer

pytestmark = pytest.mark.trl


class Lottery(EchoEnvironment):
    """Echo whose reset pays the dataset's `bonus` column plus a random share, so that the rollouts of one prompt
    differ and GRPO has something to learn from. Served by the tests' server as `test_trl:Lottery`."""
    def reset(self, seed=None, episode_id=None, bonus=0.0, **kwargs):
        obs = super().reset(seed=seed, episode_id=episode_id)
        obs.reward = float(bonus) + random.random()
        return obs


class ClassicEcho(Environment[EchoAction, EchoObservation, State]):
    """Echo as a classic environment: its one tool is its `EchoAction` (the builtin echo also serves MCP tools, so
    `environment_factory` offers those instead). Served as `test_trl:ClassicEcho`; 0.1 reward per character."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(); self._state = State()
    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", reward=0.0)
    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        msg = action.message
        return EchoObservation(echoed_message=msg, message_length=len(msg), reward=len(msg) * 0.1)
    @property
    def state(self): return self._state


@pytest.fixture(scope="module")
def classic_url():
    """Base URL of a `ClassicEcho` server for this module (room for 300 sessions)."""
    p = start_server("test_trl:ClassicEcho", max_sessions=300)
    yield p.base_url
    p.stop()


@pytest.fixture(scope="module")
def trl_kit():
    """TRL, its config and `datasets` (imported here, not at the top, so that the server process that imports this
    module for `Lottery` stays light)."""
    need_trl()
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return SimpleNamespace(Dataset=Dataset, GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer)


def config(kit, tmp_path, **kwargs):
    "A GRPO config for CPU: tiny batches, a log line per step, nothing saved or reported."
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=8,
                max_steps=2, logging_steps=1, learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True, seed=0)
    return kit.GRPOConfig(**{**base, **kwargs})


def rows(kit, n=8, **columns):
    "A dataset of `n` rows with one prompt and `columns`."
    return kit.Dataset.from_list([{"prompt": [{"role": "user", "content": "Say hello with the echo tool."}], **columns}] * n)


def recorder(seen: list):
    "A reward function that gives nothing and records what TRL hands it: each rollout's completion and environment."
    def record(completions, environments, **kwargs):
        seen.append([(c, e, e.resets, e.get_reward()) for c, e in zip(completions, environments)])
        return [0.0] * len(completions)
    return record


def test_grpo_trains_against_a_served_environment(trl_kit, tmp_path):
    "Two optimisation steps; each rollout resets its own pooled instance; the environment's reward is what TRL logs."
    server = start_server("test_trl:Lottery")
    Env, seen = environment_factory(server, name="Lottery"), []
    try:
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[recorder(seen)], args=config(trl_kit, tmp_path),
                                      train_dataset=rows(trl_kit, bonus=2.0), processing_class=tok, environment_factory=Env)
        trainer.train()
        instances = list(Env._instances)
        resets = sum(e.resets for e in instances)
    finally:
        Env.close()
        server.stop()
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "rewards/Lottery/mean" in h]
    assert len(logs) == len(seen) == 2, (logs, seen)
    rollouts = [(id(e), n) for batch in seen for _, e, n, _ in batch]
    assert len(set(rollouts)) == len(rollouts) == resets == 4  # every rollout reset its environment, once
    for log, batch in zip(logs, seen):
        assert len({id(e) for _, e, _, _ in batch}) == len(batch)  # one instance per rollout
        rewards = [r for *_, r in batch]
        assert all(2.0 <= r < 3.0 for r in rewards), rewards  # the `bonus` column reached the environment's reset
        assert log["rewards/Lottery/mean"] == pytest.approx(mean(rewards), rel=1e-5)
        assert log["reward"] == pytest.approx(mean(rewards), rel=1e-5)  # the recorder adds 0
    assert any(h["grad_norm"] > 0 for h in logs)  # rollouts of one prompt differed: the reward moved the weights


CALL = '<tool_call>\n{"name": "echo", "arguments": {"message": "hello"}}\n</tool_call><|im_end|>'


def scripted(trainer, tok, call=CALL):
    "Make TRL's generation answer with a tool call, and with plain text once the prompt holds the tool's response."
    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        answer = lambda ids: "Done.<|im_end|>" if "<tool_response>" in tok.decode(ids) else call
        return [tok(answer(ids), add_special_tokens=False)["input_ids"] for ids in prompt_ids], None
    trainer._generate_single_turn = generate


def tool_exchange(completion: list) -> tuple:
    "The tool call, the tool's answer and what came after, from one rollout's messages."
    call, answer, after = completion
    return call["tool_calls"][0]["function"], (answer["role"], answer["name"], answer["content"]), after["content"]


def test_a_tool_call_reaches_the_server_and_its_result_comes_back(trl_kit, tmp_path, classic_url):
    "TRL parses the tool call, calls the method, the step reaches the server, and the observation is the tool message."
    Echo, seen = environment_factory(classic_url), []
    try:
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[recorder(seen)],
                                      args=config(trl_kit, tmp_path, max_steps=1, max_completion_length=256),
                                      train_dataset=rows(trl_kit), processing_class=tok, environment_factory=Echo)
        scripted(trainer, tok)
        trainer.train()
        steps = [e.client.state()["step_count"] for _, e, _, _ in seen[0]]
    finally: Echo.close()
    assert steps == [1, 1]  # one step per rollout, in that rollout's own session
    for completion, env, _, reward in seen[0]:
        assert tool_exchange(completion) == ({"name": "echo", "arguments": {"message": "hello"}},
                                             ("tool", "echo", '{"echoed_message": "hello", "message_length": 5}'), "Done.")
        assert reward == pytest.approx(0.5)  # 0.1 per character, added up by the instance
    log = next(h for h in trainer.state.log_history if "rewards/ClassicEcho/mean" in h)
    assert (log["tools/call_frequency"], log["tools/failure_frequency"]) == (1.0, 0.0)
    assert log["rewards/ClassicEcho/mean"] == pytest.approx(0.5)


def test_async_tools_and_several_environments(trl_kit, tmp_path, classic_url):
    "A dict of factories (one with async tools): each row goes to its environment, and each logs its own reward."
    envs = {"sync": environment_factory(classic_url, name="SyncEcho"),
            "async": environment_factory(classic_url, name="AsyncEcho", async_tools=True)}
    seen = []
    data = trl_kit.Dataset.from_list([{**r, "environment": name} for r, name in zip(rows(trl_kit, 2), envs)])
    try:
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[recorder(seen)],
                                      args=config(trl_kit, tmp_path, max_steps=1, max_completion_length=256, per_device_train_batch_size=4),
                                      train_dataset=data, processing_class=tok, environment_factory=envs)
        scripted(trainer, tok)
        trainer.train()
    finally:
        for cls in envs.values(): cls.close()
    assert sorted(type(e).__name__ for _, e, _, _ in seen[0]) == ["AsyncEcho", "AsyncEcho", "SyncEcho", "SyncEcho"]
    for completion, env, _, reward in seen[0]:
        assert tool_exchange(completion)[1][2] == '{"echoed_message": "hello", "message_length": 5}'
        assert reward == pytest.approx(0.5)
    log = next(h for h in trainer.state.log_history if "rewards/AsyncEcho/mean" in h)
    assert log["rewards/AsyncEcho/mean"] == pytest.approx(0.5) and log["rewards/SyncEcho/mean"] == pytest.approx(0.5)
    assert log["tools/failure_frequency"] == 0.0


def test_a_tool_environment_gives_one_method_per_tool(trl_kit, tmp_path):
    "An MCP tool environment: each tool a method whose schema is the tool's; TRL's call is a step whose value comes back."
    from transformers.utils import get_json_schema
    server, Tools, seen = start_server("openenv_nb.mcp:MCPEchoEnvironment"), None, []
    try:
        listed = {t.name: t for t in mcp_tools(server.base_url)}
        assert sorted(listed) == ["echo_message", "echo_with_length"]  # create_app serves the tools on POST /mcp
        Tools = environment_factory(server)
        env = Tools()
        assert sorted(s.name for s in Tools._specs) == ["echo_message", "echo_with_length"] == sorted(listed)
        for name, tool in listed.items():
            got = get_json_schema(getattr(env, name))["function"]
            want = {k: v for k, v in tool.input_schema.items() if k in ("type", "properties", "required")}
            assert (got["description"], got["parameters"]) == (tool.description, want)
        env.reset()
        assert env.echo_with_length(message="hi") == '{"message": "hi", "length": 2}'
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[recorder(seen)],
                                      args=config(trl_kit, tmp_path, max_steps=1, max_completion_length=256),
                                      train_dataset=rows(trl_kit), processing_class=tok, environment_factory=Tools)
        scripted(trainer, tok, CALL.replace('"echo"', '"echo_message"'))
        trainer.train()
        steps = [e.client.state()["step_count"] for _, e, _, _ in seen[0]]
    finally:
        if Tools is not None: Tools.close()
        server.stop()
    assert steps == [1, 1]
    for completion, *_ in seen[0]:
        assert tool_exchange(completion)[1] == ("tool", "echo_message", "hello")


def test_a_token_goes_to_the_server_started_and_to_every_session():
    """`token=` is the `OPENENV_TOKEN` of a server the factory starts, and every request and rollout's session sends it."""
    from openenv_nb.client import GenericEnvClient
    from openenv_nb.types import EnvConnectionError
    Locked = environment_factory("echo", name="Locked", token="s3cret", max_sessions=4)
    try:
        e = Locked(); e.reset()
        assert e.client.headers == {"Authorization": "Bearer s3cret"} and e.echo_message(message="ok") == "ok"
        with pytest.raises(EnvConnectionError, match="401"): GenericEnvClient(Locked._endpoint.owned.base_url, token="").sync().connect()
    finally: Locked.close()


class Length(Rubric):
    "Up to 1 for a message of 10 characters or more."
    def forward(self, action, observation): return min(len(action.message), 10) / 10


class Greeting(Rubric):
    "1 when the message says hello."
    def forward(self, action, observation): return float("hello" in action.message.lower())


class EchoRubric(Rubric):
    "Half length, half greeting: two components for the logs."
    def __init__(self): super().__init__(); self.length, self.greeting = Length(), Greeting()
    def forward(self, action, observation):
        return 0.5 * self.length(action, observation) + 0.5 * self.greeting(action, observation)


class Graded(ClassicEcho):
    """`ClassicEcho` scored by `EchoRubric`, with three tasks (the Task API). Served as `test_trl:Graded`."""
    TASKS = ["hello", "say hello twice", "anything"]
    def __init__(self): super().__init__(); self.rubric = EchoRubric()
    def reset(self, seed=None, episode_id=None, split=None, index=None, **kwargs):
        self._reset_rubric()
        obs = super().reset(seed=seed, episode_id=episode_id)
        obs.echoed_message = self.TASKS[index or 0]
        return obs
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        obs.reward = self._apply_rubric(action, obs)
        return obs
    def list_splits(self): return ["train"]
    def num_tasks(self, split): return len(self.TASKS)
    def get_task(self, split, index): return {"index": index, "message": self.TASKS[index]}
    def get_task_range(self, split, start=None, stop=None): return [self.get_task(split, i) for i in range(3)[start:stop]]
    def list_tasks(self, split): return self.get_task_range(split)


def step_logs(trainer) -> list[dict]:
    "The log line of each optimisation step."
    return [h for h in trainer.state.log_history if "reward" in h and "loss" in h]


@pytest.fixture
def importable(monkeypatch):
    "Servers that a spec starts can import this module (`test_trl:Graded`)."
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def test_an_env_spec_trains_with_its_rubric_in_the_logs(trl_kit, tmp_path, importable):
    "`EnvSpec`: tasks as rows, a server sized for the batch, each rubric component logged, only the reward trains."
    from openenv_nb.client import HTTPEnvClient
    spec = EnvSpec(Graded, prompt="Say hello with the echo tool.")
    args = config(trl_kit, tmp_path, max_completion_length=256)
    try:
        tok = tiny_chat_tokenizer()
        kw = spec.trainer_kwargs(args)
        assert kw["train_dataset"].to_list()[2] == {"prompt": [{"role": "user", "content": "Say hello with the echo tool."}],
                                                    "split": "train", "index": 2}
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), processing_class=tok, **kw)
        scripted(trainer, tok)
        trainer.train()
        with HTTPEnvClient(spec.environment_factory._endpoint.owned.base_url) as http: held = http.health()["max_sessions"]
    finally: spec.close()
    assert (trainer.state.global_step, held) == (2, args.generation_batch_size + 1)
    logs = step_logs(trainer)
    assert len(logs) == 2
    for log in logs:
        assert log["rewards/Graded/length/mean"] == pytest.approx(0.5)  # "hello": 5 of 10 characters
        assert log["rewards/Graded/greeting/mean"] == pytest.approx(1.0)
        assert log["rewards/Graded/mean"] == pytest.approx(0.75) == log["reward"]  # the components weigh 0


def test_env_specs_train_two_environments_at_once(trl_kit, tmp_path, classic_url, importable):
    "`EnvSpecs`: rows of both environments in every batch, each environment's reward and components in the logs."
    specs = EnvSpecs({"graded": EnvSpec(Graded), "classic": EnvSpec(classic_url)})
    args = config(trl_kit, tmp_path, max_completion_length=256, per_device_train_batch_size=4, shuffle_dataset=False)
    try:
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), processing_class=tok, **specs.trainer_kwargs(args))
        scripted(trainer, tok)
        trainer.train()
    finally: specs.close()
    logs = step_logs(trainer)
    assert trainer.state.global_step == 2 and len(logs) == 2
    for log in logs:
        assert log["rewards/Graded/length/mean"] == pytest.approx(0.5)
        assert log["rewards/Graded/greeting/mean"] == pytest.approx(1.0)
        assert log["rewards/Graded/mean"] == pytest.approx(0.75)
        assert log["rewards/ClassicEcho/mean"] == pytest.approx(0.5)  # 0.1 per character of "hello"


class Walk(ClassicEcho):
    """A seeded random walk: each step moves by the message's length plus a draw from the seeded generator, so that a
    mid-episode state depends on the seed and on every action before it. It copies itself (`snapshot_state`), and a
    message longer than 5 characters is refused. It also replays (a portable snapshot holds its log). Served as
    `test_trl:Walk`."""
    REPLAYABLE = True
    def reset(self, seed=None, episode_id=None, **kwargs):
        self.rng, self.pos = random.Random(seed), 0
        return super().reset(seed=seed, episode_id=episode_id)
    def step(self, action, timeout_s=None, **kwargs):
        if len(action.message) > 5: raise ValueError(f"{action.message!r}: at most 5 characters a step")
        obs = super().step(action)
        self.pos += len(action.message) + self.rng.randrange(100)
        obs.echoed_message = f"at {self.pos}"
        return obs
    def snapshot_state(self): return (self._state.model_copy(), self.rng.getstate(), self.pos)
    def restore_state(self, state, episode_id):
        st, rng, self.pos = state
        self._state = st.model_copy(update={"episode_id": episode_id})
        self.rng = random.Random(); self.rng.setstate(rng)


def prompt_recorder(seen: list):
    "A reward function that gives nothing and records each rollout's first user message (prompt and observation)."
    def record(prompts, completions, environments, **kwargs):
        seen.append([(p[-1]["content"], e.reached, e) for p, e in zip(prompts, environments)])
        return [0.0] * len(completions)
    return record


def replayed(url, seed, prefix) -> str:
    "The observation at a row's start, from scratch: a fresh session, reset with `seed`, then each action."
    from openenv_nb.client import GenericEnvClient
    from openenv_nb.trl import render_observation
    with GenericEnvClient(url).sync() as c:
        r = c.reset(seed=seed)
        for a in prefix: r = c.step(a)
        return render_observation(r.observation)


def test_every_generation_of_a_group_starts_from_the_rows_mid_episode_state(trl_kit, tmp_path):
    """Rows with a `seed` and a `prefix`: each group of 4 generations saw one first observation, the one a from-scratch
    replay gives; the group's first reached it, the others restored its snapshot."""
    server = start_server("test_trl:Walk")
    Env, seen = environment_factory(server, name="Walk"), []
    starts = {3: [{"message": "ab"}, {"message": "abcde"}], 4: [{"message": "a"}, {"message": "b"}, {"message": "c"}]}
    data = trl_kit.Dataset.from_list([{"prompt": [{"role": "user", "content": "Walk."}], "seed": s, "prefix": p}
                                      for s, p in starts.items()])
    try:
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[prompt_recorder(seen)],
                                      args=config(trl_kit, tmp_path, per_device_train_batch_size=4, num_generations=4,
                                                  max_steps=2),
                                      train_dataset=data, processing_class=tok, environment_factory=Env)
        trainer.train()
        want = {s: "Walk.\n\n" + replayed(server.base_url, s, p) for s, p in starts.items()}
        steps = [[e.client.state()["step_count"] for *_, e in batch] for batch in seen]
    finally:
        Env.close()
        server.stop()
    assert len(seen) == 2 and sorted(set(want.values())) == sorted(want.values())  # two rows, two distinct starts
    for batch, counts in zip(seen, steps):
        firsts = {text for text, _, _ in batch}
        assert len(firsts) == 1 and firsts <= set(want.values()), (firsts, want)  # one start per group: the replay's
        assert [how for _, how, _ in batch] == ["replay", "restore", "restore", "restore"]
        assert len(set(counts)) == 1 and counts[0] in (2, 3)  # every session is at the prefix's end


def test_a_portable_snapshot_column_starts_every_generation_there(trl_kit, tmp_path):
    """A `snapshot` column of portable blobs (strings, as a dataset keeps them): every generation restores it."""
    from openenv_nb.client import GenericEnvClient
    from openenv_nb.providers import LocalProcessProvider
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    server = LocalProcessProvider("test_trl:Walk", env_vars={"PYTHONPATH": path, "OPENENV_SNAPSHOT_KEY": "k"})
    server.start()
    Env, seen = environment_factory(server, name="Walk"), []
    try:
        with GenericEnvClient(server.base_url).sync() as c:
            c.reset(seed=5)
            for m in ("a", "bb"): r = c.step({"message": m})
            blob, at = c.snapshot(portable=True).blob, r.observation["echoed_message"]
        data = trl_kit.Dataset.from_list([{"prompt": [{"role": "user", "content": "Walk."}], "snapshot": blob}])
        tok = tiny_chat_tokenizer()
        trainer = trl_kit.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=[prompt_recorder(seen)],
                                      args=config(trl_kit, tmp_path, max_steps=1), train_dataset=data,
                                      processing_class=tok, environment_factory=Env)
        trainer.train()
        steps = [e.client.state()["step_count"] for *_, e in seen[0]]
        with pytest.raises(ValueError, match="refused prefix step 2 of 2"):
            seen[0][0][2].reset(snapshot=blob, prefix=[{"message": "c"}, {"message": "too long"}])
    finally:
        Env.close()
        server.stop()
    assert [t for t, _, _ in seen[0]] == [f'Walk.\n\n{{"echoed_message": "{at}", "message_length": 2}}'] * 2
    assert steps == [2, 2]
