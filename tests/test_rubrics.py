"""Rubrics where a real process is involved; the rest is tested in nbs/00a_rubrics.ipynb.

1. `LLMJudge` with `ChatClient` against a stand-in OpenAI-compatible endpoint on 127.0.0.1 (`judge_standin.py`), served
   in this process: the request it sends, the score it reads, and an endpoint that errs, hangs or is not there.
2. The same scenarios scored by OpenEnv's own `openenv.core.rubrics` (in the venv with openenv-core, see
   `core_venv.py`) and by ours: the scores, call counts, paths and step rewards must be equal.
"""
import asyncio
import json
import socket
import subprocess
import sys

import pytest

import judge_standin
from conftest import need
from core_venv import core_python_why
from openenv_nb.rubrics import ChatClient, Gate, LLMJudge, Rubric, Sequential, WeightedSum, rubric_scores
from openenv_nb.server import serve_in_thread


@pytest.fixture(scope="module")
def judge_url():
    "Base URL of the stand-in endpoint; hung requests are let go before it stops."
    judge_standin.RELEASE.clear()
    with serve_in_thread(judge_standin.app) as url:
        try: yield url
        finally: judge_standin.RELEASE.set()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    "httpx honours proxy variables: keep 127.0.0.1 off any proxy the machine sets."
    for k in ("NO_PROXY", "no_proxy"): monkeypatch.setenv(k, "127.0.0.1,localhost")


def score(rubric, action="an answer", observation=None):
    "The rubric's score, from synchronous code (as a sync `step` would get it)."
    return asyncio.run(rubric.acall(action, observation))


def judge(url, template="Rate: {action}", **kwargs):
    client_kw = {k: kwargs.pop(k) for k in ("api_key", "system_prompt", "timeout") if k in kwargs}
    return LLMJudge(template, ChatClient(url, "judge-model", **client_kw), **kwargs)


def test_judge_sends_a_chat_completion_and_reads_the_score(judge_url):
    n = len(judge_standin.CALLS)
    j = judge(judge_url, "Rate {action} [reply I would say 0.8, maybe]", api_key="sk-test", system_prompt="Be strict.")
    assert score(j, "forty-two") == 0.8 and j.last_error is None
    (call,) = judge_standin.CALLS[n:]
    assert call["authorization"] == "Bearer sk-test"
    assert call["body"] == {"model": "judge-model", "temperature": 0.0, "max_tokens": 256,
                            "messages": [{"role": "system", "content": "Be strict."},
                                         {"role": "user", "content": "Rate forty-two [reply I would say 0.8, maybe]"}]}


def test_base_url_may_end_in_v1_and_calls_may_be_awaited_directly(judge_url):
    j = judge(judge_url + "/v1/", "[reply 9 out of 10]", score_pattern=r"(\d+) out of 10", normalize=False)
    assert asyncio.run(j("a", None)) == 9.0  # `__call__` gives a coroutine: the judge is async
    assert judge_standin.CALLS[-1]["authorization"] is None  # no key, no header


def test_judge_in_a_tree_reports_its_component(judge_url):
    class Nonempty(Rubric):
        def forward(self, action, observation): return float(bool(action))

    tree = Sequential(Gate(Nonempty()), WeightedSum([Nonempty(), judge(judge_url, "{action} [reply 0.4]")], [0.5, 0.5]))
    assert score(tree, "x") == pytest.approx(0.7)
    assert rubric_scores(tree) == pytest.approx({"total": 0.7, "gate": 1.0, "gate.nonempty": 1.0, "weighted_sum": 0.7,
                                                 "weighted_sum.nonempty": 1.0, "weighted_sum.llm_judge": 0.4})
    assert score(tree, "") == 0.0  # the gate fails: the judge is not asked
    assert rubric_scores(tree) == {"total": 0.0, "gate": 0.0, "gate.nonempty": 0.0}


@pytest.mark.parametrize("marker, why", [("[error]", "HTTPStatusError"), ("[garbage]", "Not a chat completion"),
                                         ("[reply no idea]", "no score in the reply 'no idea'")])
def test_a_failing_endpoint_scores_the_default(judge_url, marker, why):
    j = judge(judge_url, "{action} " + marker, default_score=0.25)
    assert score(j) == 0.25
    assert why in j.last_error


def test_judge_timeout_scores_the_default(judge_url):
    j = judge(judge_url, "{action} [hang]", timeout=None, default_score=0.1)
    j.timeout = 0.5  # the judge's own limit; the client's is 30 s
    assert score(j) == 0.1
    assert j.last_error == "the call failed: TimeoutError"


def test_client_timeout_scores_the_default(judge_url):
    j = judge(judge_url, "{action} [hang]", timeout=0.5, default_score=0.1)  # the client's limit; the judge's is 60 s
    assert score(j) == 0.1
    assert "ReadTimeout" in j.last_error


def test_endpoint_not_listening_scores_the_default():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
        j = judge(f"http://127.0.0.1:{s.getsockname()[1]}", default_score=0.3)
        assert score(j) == 0.3
        assert "ConnectError" in j.last_error


# --------------------------------------------------------------------------------------------------------------------
# Parity with OpenEnv: one script, run once on `openenv.core.rubrics` and once on `openenv_nb.rubrics`. It uses only
# the names both share, and only outcomes both document: scores, which children ran, paths, step rewards, parsing.
PARITY = r'''
import asyncio, inspect, json, sys
mod = __import__(sys.argv[1], fromlist=["*"])
Rubric, Sequential, Gate, WeightedSum = mod.Rubric, mod.Sequential, mod.Gate, mod.WeightedSum
RubricList, RubricDict, LLMJudge = mod.RubricList, mod.RubricDict, mod.LLMJudge
Discounted = mod.ExponentialDiscountingTrajectoryRubric

class C(Rubric):
    def __init__(self, s): super().__init__(); self.s, self.calls = s, 0
    def forward(self, a, o): self.calls += 1; return self.s

class AC(C):
    async def forward(self, a, o): self.calls += 1; return self.s

def mk(x): return AC(float(x[1:])) if isinstance(x, str) else C(x)  # "A0.8" is async
async def value(x): return await x if inspect.isawaitable(x) else x
def run(r, a="a", o="o"): return asyncio.run(value(r(a, o)))
def raises(f):
    try: f(); return None
    except Exception as e: return type(e).__name__

out = {}
for spec in [[], [1.0, 0.5, 0.8], [1.0, 0.0, 0.7], [0.3], ["A1.0", 0.8, 0.9], [1.0, "A0.0", 0.7], [1.0, 0.9, "A0.8", 0.7],
             ["A0.5", "A0.6"], [0.2, 0.0]]:
    kids = [mk(x) for x in spec]
    out[f"sequential {spec}"] = [run(Sequential(*kids)), [k.calls for k in kids]]
for s, t in [(1.0, None), (0.99, None), (0.5, 0.5), (0.4, 0.5), ("A0.8", 0.5), ("A0.2", 0.5), (0.0, 0.0)]:
    g = Gate(mk(s)) if t is None else Gate(mk(s), threshold=t)
    out[f"gate {s} {t}"] = run(g)
for spec, w in [([1.0, 0.5], [0.7, 0.3]), ([0.3, 0.6, 0.9], [0.2, 0.3, 0.5]), (["A1.0", 0.5], [0.7, 0.3]),
                (["A0.1", "A0.2", 0.3], [0.1, 0.1, 0.8]), ([0.4], [1.0])]:
    out[f"weighted {spec} {w}"] = run(WeightedSum([mk(x) for x in spec], w))
out["weighted errors"] = [raises(lambda: WeightedSum([C(1.0)], [0.5, 0.5])), raises(lambda: WeightedSum([C(1.0), C(1.0)], [0.5, 0.6]))]
tree = Sequential(Gate(C(0.9), threshold=0.5), WeightedSum([C(1.0), AC(0.4)], [0.25, 0.75]), Gate(C(0.6)))
out["tree"] = [run(tree), [p for p, _ in tree.named_rubrics()], type(tree.get_rubric("rubric_1.rubric_1")).__name__]
tree2 = Sequential(Gate(C(0.9), threshold=0.5), WeightedSum([C(1.0), AC(0.4)], [0.25, 0.75]))
out["tree2"] = [run(tree2), {p: r.last_score for p, r in tree2.named_rubrics()}]
scores = {}
for name, r in tree2.named_rubrics(): r.register_forward_hook(lambda r, a, o, s, n=name: scores.__setitem__(n, s))
run(tree2); out["hooks"] = scores
out["missing path"] = raises(lambda: tree2.get_rubric("rubric_9"))
rl = RubricList([C(0.1), C(0.2)]); rl.append(C(0.3))
out["list"] = [len(rl), [r.s for r in rl], [p for p, _ in rl.named_rubrics()], raises(lambda: rl("a", "o"))]
rd = RubricDict({"pong": C(0.25), "chess": C(0.75)}); rd["go"] = C(0.5)
out["dict"] = [list(rd.keys()), "go" in rd, len(rd), rd["chess"].s, [p for p, _ in rd.named_rubrics()], raises(lambda: rd("a", "o"))]

class Obs:
    def __init__(self, done=False, winner=None): self.done, self.winner = done, winner

class Chess(Discounted):
    def score_trajectory(self, t): return {"agent": 1.0, "draw": 0.5}.get(t[-1][1].winner, 0.0)

for gamma, inter, winner in [(0.9, 0.0, "agent"), (0.5, 0.1, "draw"), (1.0, 0.0, "agent"), (0.0, 0.0, "agent"), (0.99, 0.0, None)]:
    ch = Chess(gamma=gamma, intermediate_reward=inter)
    per_step = [run(ch, "m", Obs()) for _ in range(3)] + [run(ch, "m", Obs(True, winner))]
    out[f"chess {gamma} {inter} {winner}"] = [per_step, ch.compute_step_rewards(), len(ch.trajectory), ch.state_dict()]
    ch.reset(); out[f"chess {gamma} {inter} {winner}"].append([len(ch.trajectory), ch.compute_step_rewards()])
out["gamma errors"] = [raises(lambda: Chess(gamma=1.5)), raises(lambda: Chess(gamma=-0.1))]

class Canned:
    def __init__(self, reply): self.reply, self.prompts = reply, []
    async def complete(self, prompt, **kw): self.prompts.append(prompt); return self.reply

for reply, kw in [("Score: 0.8", {}), ("7", {}), ("7", {"normalize": False}), ("no idea", {"default_score": 0.3}),
                  ("-0.5", {}), ("0.25 then 0.9", {}), ("8/10", {"score_pattern": r"(\d+)/10", "normalize": False}),
                  ("score=0.6", {"score_pattern": r"score=\d\.\d"}), ("1.", {})]:
    client = Canned(reply)
    j = LLMJudge("Rate {action} given {observation}", client, **kw)
    out[f"judge {reply} {kw}"] = [run(j, "A", "O"), client.prompts, j.state_dict()]
print(json.dumps(out, sort_keys=True))
'''


@pytest.mark.core
def test_scores_match_openenv(tmp_path):
    py, why = core_python_why()
    need("core", py is not None, why)
    script = tmp_path / "parity.py"
    script.write_text(PARITY)
    def outcomes(python, module):
        r = subprocess.run([str(python), str(script), module], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{module}:\n{r.stderr[-4000:]}"
        return json.loads(r.stdout)
    theirs, ours = outcomes(py, "openenv.core.rubrics"), outcomes(sys.executable, "openenv_nb.rubrics")
    assert theirs.keys() == ours.keys()
    assert {k: v for k, v in ours.items() if v != theirs[k]} == {}, {k: theirs[k] for k in ours if ours[k] != theirs[k]}
