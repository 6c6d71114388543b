"""What a plan costs a tenant: the tokens its admission reserves and the engine sequences it
holds against the concurrency limit while it runs."""

from __future__ import annotations

from gateway.core.plan import Plan


def reservation(plan: Plan) -> int:
    """The most tokens a plan can use: each prompt once, plus every choice's ``max_tokens``; a
    beam search generates (and is charged) ``width`` beams of a prompt, however few it returns."""
    prompts = {spec.prompt_index: spec.prompt.token_count for spec in plan.choices}
    outputs: dict[int, int] = {}
    for spec in plan.choices:
        beam = spec.params.beam
        if beam is None:
            outputs[spec.index] = spec.params.max_tokens
        else:
            outputs[-1 - spec.prompt_index] = beam.width * spec.params.max_tokens
    return sum(prompts.values()) + sum(outputs.values())


def sequences(plan: Plan) -> int:
    """Engine sequences a plan runs at once: one per choice, or a beam search's ``width`` per
    prompt, however few beams it returns."""
    widths: dict[int, int] = {}
    for spec in plan.choices:
        beam = spec.params.beam
        widths[spec.index if beam is None else -1 - spec.prompt_index] = (
            1 if beam is None else beam.width
        )
    return sum(widths.values())
