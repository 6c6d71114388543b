"""Guided decoding in the torch engine, in-process on the tiny model (random weights): only the
grammar can make its output parse, so every check here fails without the masks."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.triton.engine.guided import GuidedDecoding, write_tokenizer_info
from deploy.triton.engine.runner import ModelRunner
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineError,
    EngineFinishReason,
    GuidedConfig,
    GuideRequest,
    SamplingConfig,
)
from tests.support.engine import TIMEOUT_S, make, run, submit

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}


def validate(document: Any, schema: dict[str, Any]) -> None:
    """The checks WEATHER needs, written out so that the test needs no schema library."""
    assert isinstance(document, dict)
    assert set(document) == set(schema["required"])
    properties = schema["properties"]
    assert isinstance(document["city"], str)
    assert len(document["city"]) <= properties["city"]["maxLength"]
    assert isinstance(document["days"], int)
    assert 1 <= document["days"] <= 7
    assert document["unit"] in properties["unit"]["enum"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    config = EngineConfig(
        str(tiny_model_dir), max_batch_size=8, max_seq_len=512, guided=GuidedConfig()
    )
    engine = Engine.from_config(config)
    yield engine
    engine.shutdown()


def encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text))


def text_of(tokenizer: Any, tokens: list[int]) -> str:
    return str(tokenizer.decode(tokens))


SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9, seed=7, min_tokens=0)


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("prompt", ["What is the weather in Paris?", "def add(a, b):", "x"])
def test_json_schema_output_validates_and_ends_when_complete(
    engine: Engine, tokenizer: Any, prompt: str, sampling: SamplingConfig | None
) -> None:
    guide = GuideRequest("json_schema", json.dumps(WEATHER))
    extra = {} if sampling is None else {"sampling": sampling}
    result = run(engine, make(encode(tokenizer, prompt), 300, guide=guide, **extra))
    final = result.final()
    document = json.loads(text_of(tokenizer, result.tokens()))
    validate(document, WEATHER)
    # The tiny model suppresses its end id; the completed grammar ends the sequence anyway.
    assert final.finish_reason is EngineFinishReason.END_ID


def test_unguided_output_of_the_same_prompt_is_not_json(engine: Engine, tokenizer: Any) -> None:
    result = run(engine, make(encode(tokenizer, "What is the weather in Paris?"), 60))
    with pytest.raises(ValueError):
        json.loads(text_of(tokenizer, result.tokens()))
    assert result.final().finish_reason is EngineFinishReason.LENGTH


def test_regex_and_ebnf(engine: Engine, tokenizer: Any) -> None:
    prompt = encode(tokenizer, "The year after 2024 is")
    regex = run(engine, make(prompt, 40, guide=GuideRequest("regex", r"(yes|no), [0-9]{4}")))
    assert re.fullmatch(r"(yes|no), [0-9]{4}", text_of(tokenizer, regex.tokens()))
    assert regex.final().finish_reason is EngineFinishReason.END_ID
    grammar = 'root ::= "[" item ("," item){0,2} "]"\nitem ::= [a-c]'
    ebnf = run(engine, make(prompt, 40, guide=GuideRequest("ebnf_grammar", grammar)))
    assert re.fullmatch(r"\[[a-c](,[a-c]){0,2}\]", text_of(tokenizer, ebnf.tokens()))


def test_builtin_json_grammar_keeps_valid_json_prefixes(engine: Engine, tokenizer: Any) -> None:
    """``json`` allows any JSON: unbounded, so a random model may not finish; whatever it wrote
    when it ended or ran out is a JSON text or the start of one."""
    result = run(engine, make(encode(tokenizer, "Hello"), 80, guide=GuideRequest("json")))
    text = text_of(tokenizer, result.tokens()).lstrip()
    assert text[:1] in ("{", "[")
    if result.final().finish_reason is EngineFinishReason.END_ID:
        json.loads(text)


def test_structural_tag_forces_the_tagged_call(engine: Engine, tokenizer: Any) -> None:
    """A structural tag in xgrammar's format and in the OpenAI-style legacy format."""
    call = {"begin": '<tool_call>{"name": "get_weather", "arguments": ', "end": "}</tool_call>"}
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tags_with_separator",
            "tags": [{**call, "content": {"type": "json_schema", "json_schema": WEATHER}}],
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": True,
        },
    }
    prompt = encode(tokenizer, "Call a tool")
    result = run(engine, make(prompt, 300, guide=GuideRequest("structural_tag", json.dumps(tag))))
    text = text_of(tokenizer, result.tokens())
    match = re.fullmatch(
        r'<tool_call>\{"name": "get_weather", "arguments": (.*)\}</tool_call>', text
    )
    assert match, text
    validate(json.loads(match.group(1)), WEATHER)
    legacy = {"structures": [{**call, "schema": WEATHER}], "triggers": ["<tool_call>"]}
    free = run(engine, make(prompt, 30, guide=GuideRequest("structural_tag", json.dumps(legacy))))
    assert free.final().finish_reason is not EngineFinishReason.ERROR


def test_guided_and_free_requests_share_decode_steps(engine: Engine, tokenizer: Any) -> None:
    prompts = [encode(tokenizer, text) for text in ("paris", "the river", "a b c", "model")]
    free_alone = [run(engine, make(prompt, 40)).tokens() for prompt in prompts]
    steps_before = engine.stats().steps
    guide = GuideRequest("json_schema", json.dumps(WEATHER))
    guided = [submit(engine, make(prompt, 300, guide=guide)) for prompt in prompts]
    free = [submit(engine, make(prompt, 40)) for prompt in prompts]
    for result in guided:
        validate(json.loads(text_of(tokenizer, result.wait().tokens())), WEATHER)
    assert [result.wait().tokens() for result in free] == free_alone
    assert engine.stats().max_running >= 2 * len(prompts)
    assert engine.stats().steps > steps_before


def test_each_of_n_sequences_follows_the_grammar(engine: Engine, tokenizer: Any) -> None:
    guide = GuideRequest("json_schema", json.dumps(WEATHER))
    request = make(
        encode(tokenizer, "weather"), 300, guide=guide, sampling=SAMPLED, num_return_sequences=3
    )
    result = run(engine, request)
    texts = {text_of(tokenizer, result.tokens(index)) for index in range(3)}
    for text in texts:
        validate(json.loads(text), WEATHER)
    assert len(texts) > 1


@pytest.mark.parametrize(
    ("guide", "says"),
    [
        (("json_schema", "{not json"), "invalid guided_decoding_guide for guide type json_schema"),
        (("regex", "(unclosed"), "invalid guided_decoding_guide for guide type regex"),
        (("ebnf_grammar", "root ::= missing"), "guide type ebnf_grammar"),
        (("structural_tag", '{"type": "nope"}'), "guide type structural_tag"),
    ],
)
def test_a_bad_guide_fails_only_its_request(
    engine: Engine, tokenizer: Any, guide: tuple[str, str], says: str
) -> None:
    """The grammar compiles beside the engine: its failure is the request's final output."""
    prompt = encode(tokenizer, "hello")
    running = submit(engine, make(prompt, 60))
    bad = submit(engine, make(prompt, 10, guide=GuideRequest(*guide))).wait().final()
    assert bad.finish_reason is EngineFinishReason.ERROR
    assert bad.error is not None and says in bad.error
    assert running.wait().final().finish_reason is EngineFinishReason.LENGTH


@pytest.mark.parametrize(
    ("guide", "says"),
    [
        (("yaml", "a: b"), "guided_decoding_guide_type must be one of"),
        (("regex", None), "The guide string must be provided"),
    ],
)
def test_a_malformed_guide_is_refused_before_the_engine(
    guide: tuple[str, str | None], says: str
) -> None:
    with pytest.raises(EngineError, match=re.escape(says)):
        GuideRequest(*guide)


def test_compilation_is_cached_by_content(engine: Engine) -> None:
    assert engine.grammars is not None
    schema = json.dumps({**WEATHER, "title": "cached"})
    started = engine.grammars.compiles_started
    first = engine.grammars.compile(GuideRequest("json_schema", schema)).result(TIMEOUT_S)
    again = engine.grammars.compile(GuideRequest("json_schema", schema))
    assert again.done() and again.result() is first
    assert engine.grammars.compiles_started == started + 1


def test_without_a_backend_a_guide_is_refused(tiny_model_dir: Path, tokenizer: Any) -> None:
    engine = Engine.from_config(EngineConfig(str(tiny_model_dir), max_batch_size=2))
    try:
        with pytest.raises(EngineError, match="Guided decoding is not enabled for this model"):
            engine.submit(make(encode(tokenizer, "x"), 4, guide=GuideRequest("json")), print)
    finally:
        engine.shutdown()


def test_tokenizer_info_file_as_the_cpp_backend_reads_it(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    info = write_tokenizer_info(str(tiny_model_dir), tmp_path / "xgrammar_tokenizer_info.json")
    document = json.loads(info.read_text())
    assert set(document) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}
    config = EngineConfig(
        str(tiny_model_dir),
        max_batch_size=2,
        guided=GuidedConfig(tokenizer_info_path=str(info)),
    )
    engine = Engine.from_config(config)
    try:
        guide = GuideRequest("json_schema", json.dumps(WEATHER))
        result = run(engine, make(encode(tokenizer, "weather"), 300, guide=guide))
        validate(json.loads(text_of(tokenizer, result.tokens())), WEATHER)
    finally:
        engine.shutdown()


class HeldGuidedDecoding(GuidedDecoding):
    """Compiles as the engine's own does, once the test lets it."""

    def __init__(self, tokenizer_info: Any) -> None:
        super().__init__(tokenizer_info)
        self.entered = threading.Event()
        self.release = threading.Event()

    def compile(self, request: GuideRequest) -> Any:
        self.entered.set()
        if not self.release.wait(HELD_S):
            raise EngineError("the test never released the compile")
        return super().compile(request)


HELD_S = 20.0


@pytest.fixture
def held(tiny_model_dir: Path) -> Iterator[tuple[Engine, HeldGuidedDecoding]]:
    """An engine whose grammars compile once the test releases them."""
    config = EngineConfig(str(tiny_model_dir), max_batch_size=4, guided=GuidedConfig())
    runner = ModelRunner.load(config)
    guided = HeldGuidedDecoding.load(
        GuidedConfig(), str(tiny_model_dir), runner.vocab_size, runner.default_end_ids
    )
    assert isinstance(guided, HeldGuidedDecoding)
    engine = Engine(runner, config, guided)
    engine.start()
    yield engine, guided
    guided.release.set()
    engine.shutdown()


def test_a_compiling_grammar_holds_up_neither_decoding_nor_the_submitter(
    held: tuple[Engine, HeldGuidedDecoding], tokenizer: Any
) -> None:
    """Triton hands requests to the engine from one thread: while a guided request's grammar
    compiles, the requests submitted after it from that thread are decoded and finish."""
    engine, guided = held
    guide = GuideRequest("json_schema", json.dumps(WEATHER))
    waiting = submit(engine, make(encode(tokenizer, "weather"), 300, guide=guide))
    free = submit(engine, make(encode(tokenizer, "paris"), 12))
    assert guided.entered.wait(HELD_S)
    free.wait()
    assert engine.stats().waiting_requests == 1
    assert waiting.outputs == []
    guided.release.set()
    validate(json.loads(text_of(tokenizer, waiting.wait().tokens())), WEATHER)


def test_a_request_stopped_while_its_grammar_compiles_ends_cancelled(
    held: tuple[Engine, HeldGuidedDecoding], tokenizer: Any
) -> None:
    engine, guided = held
    guide = GuideRequest("json_schema", json.dumps(WEATHER))
    request = make(encode(tokenizer, "weather"), 300, guide=guide)
    waiting = submit(engine, request)
    assert guided.entered.wait(HELD_S)
    engine.stop(request.request_id)
    final = waiting.wait().final()
    assert final.finish_reason is EngineFinishReason.CANCELLED and final.error is None
    guided.release.set()
    assert engine.grammars is not None
    for _ in range(int(HELD_S / 0.05)):
        if engine.grammars.cached_bytes():
            break
        time.sleep(0.05)
    # A request after the grammar is ready: the engine has seen the grammar by its end.
    assert run(engine, make(encode(tokenizer, "paris"), 4)).final().finish_reason is not None
    assert len(waiting.outputs) == 1 and engine.stats().waiting_requests == 0
