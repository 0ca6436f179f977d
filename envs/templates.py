"""Prompt templates: problem text -> the text a model is asked to continue.

Every template except ``compact`` asks for step-by-step reasoning and the final answer in
``\\boxed{}`` (docs/algorithms.md#evaluation-protocol-and-compute / docs/algorithms.md#evaluation-protocol-and-compute: each model's chat template, or a plain-text one for
base models without one). ``compact`` is for the tiny CPU models whose character-level
vocabularies hold no English words: it is exactly ``"Q:{problem}\\n"``. ``auto`` (the default of
``pair.template``) is ``chat`` for a tokenizer that has a chat template, else ``plain``;
``resolve_template`` fixes it per model once (``compact`` for the tiny models built in code).

Stop strings (``rollout.stop`` / ``pair.models[i].stop``, ``auto`` = ``STOP_DEFAULTS`` of the model's
template): a base model on the ``plain`` template rarely emits EOS after its solution; it starts the
next exercise ("\\n\\nProblem: ...") the way its pre-training text does, so every response would run
to ``max_new_tokens`` and the verifier would read a made-up second problem's answer.

Add a template with :func:`register_template`; :data:`TEMPLATES` maps names to renderers.
"""
from __future__ import annotations

from typing import Any, Callable

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

Renderer = Callable[[str, Any], str]
TEMPLATES: dict[str, Renderer] = {}


def register_template(name: str) -> Callable[[Renderer], Renderer]:
    """Decorator: register ``fn(problem, tokenizer) -> str`` under ``name`` (a clash is an error)."""
    def deco(fn: Renderer) -> Renderer:
        if name in TEMPLATES:
            raise ValueError(f"prompt template {name!r} is already registered")
        TEMPLATES[name] = fn
        return fn
    return deco


def render_prompt(problem: str, template: str = "plain", tokenizer: Any = None) -> str:
    """Render ``problem`` with the named template (``tokenizer`` is needed by ``chat`` only)."""
    try:
        fn = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; known: {', '.join(sorted(TEMPLATES))}") from None
    return fn(problem, tokenizer)


def resolve_template(name: str, tokenizer: Any = None, kind: str = "hf") -> str:
    """The concrete template a model renders with: ``auto`` is ``compact`` for a ``kind: tiny`` model (warmed up
    on it; its vocabulary has no English letters), else ``chat`` when the tokenizer has a chat template, else
    ``plain``; any other name is itself."""
    if name != "auto":
        return name
    if kind == "tiny":
        return "compact"
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


# ``auto`` stop strings per template: the text of a base model starting the next turn of its prompt format.
# Only the plain-text formats need them; a chat template ends a turn with the tokenizer's EOS.
STOP_DEFAULTS: dict[str, tuple] = {
    "plain": ("\nProblem:", "\n\nProblem"),  # a new exercise, "Problem:" at a line start or "Problem 2." etc.
    "r1": ("\nUser:",),                       # a new user turn
}


def resolve_stop(stop: Any, template: str) -> list:
    """The stop strings of a model: ``auto`` (or None) -> ``STOP_DEFAULTS`` of its resolved template (none for
    others), a list -> itself (``[]``: none)."""
    if stop is None or stop == "auto":
        return list(STOP_DEFAULTS.get(template, ()))
    return [str(s) for s in stop]


def chat_messages(problem: str) -> list[dict]:
    """The raw chat messages behind the ``chat`` template (re-rendered per tokenizer for peers)."""
    return [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]


@register_template("plain")
def _plain(problem: str, tokenizer: Any = None) -> str:
    """For base models without a chat template."""
    return f"Problem: {problem}\n{INSTRUCTION}\n\nSolution:"


@register_template("chat")
def _chat(problem: str, tokenizer: Any = None) -> str:
    """The tokenizer's own chat template, with a generation prompt and Qwen3 thinking off
    (docs/algorithms.md#evaluation-protocol-and-compute); templates that do not know ``enable_thinking`` ignore it."""
    if tokenizer is None:
        raise ValueError("prompt template 'chat' needs a tokenizer (pass tokenizer=...)")
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"tokenizer {name!r} has no chat template; use template='plain' for base models")
    return tokenizer.apply_chat_template(chat_messages(problem), tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


@register_template("auto")
def _auto(problem: str, tokenizer: Any = None) -> str:
    """``chat`` when the tokenizer has a chat template, else ``plain`` (models resolve it once, at start-up)."""
    return TEMPLATES[resolve_template("auto", tokenizer)](problem, tokenizer)


@register_template("compact")
def _compact(problem: str, tokenizer: Any = None) -> str:
    """For tiny character-level models: no English words."""
    return f"Q:{problem}\n"


@register_template("qwen_boxed")
def _qwen_boxed(problem: str, tokenizer: Any = None) -> str:
    """The Qwen2.5-Math evaluation prompt (ChatML, the instruction as the system turn) written out
    as text, so it also works for base Qwen models without a tokenizer."""
    return (f"<|im_start|>system\n{INSTRUCTION}<|im_end|>\n"
            f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")


@register_template("r1")
def _r1(problem: str, tokenizer: Any = None) -> str:
    """A DeepSeek-R1-Zero style prompt: think inside <think> tags, then answer in \\boxed{}."""
    return ("A conversation between User and Assistant. The User asks a question and the Assistant "
            "solves it. The Assistant first thinks through the reasoning inside <think> </think> "
            "tags, then states the final answer within \\boxed{}.\n"
            f"User: {problem}\nAssistant: <think>")
