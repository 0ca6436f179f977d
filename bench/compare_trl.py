"""Step time of graftzoo's GRPO against TRL's GRPOTrainer and a plain-PyTorch floor, in one run.

The configuration is TRL's tiny one from docs/scaling.md: a byte-level BPE tokenizer trained in
code (vocab 512, ``<|endoftext|>`` eos, ``<|pad|>`` pad, left padding), ``Qwen2ForCausalLM`` with
hidden 128, intermediate 512, 2 layers, 4 heads, 2 KV heads, tied embeddings (0.558 M parameters,
fp32, ``torch.manual_seed(0)``), plain-text prompts ``What is a+b? Answer:``, and a reward of 1 when
the completion contains the right integer. Each step is 8 prompts x 8 generations x exactly 32 new
tokens (min = max new tokens on every side: TRL's generation_kwargs, HFEngine's min_new_tokens,
generate's min_new_tokens; so the work is identical), sampling at T=1, top_p 1, top_k 0, then one
optimizer step (AdamW, lr 1e-5, clip 1.0), beta = 0.

  TRL    GRPOTrainer (1 generation batch = 1 optimizer step, num_iterations 1), timed from
         ``on_step_begin`` to ``on_step_end`` as in docs/scaling.md.
  ours   graftzoo's real components: Policy, HFEngine, the registry's ``grpo`` Learner and its
         collect / advantages / exchange / build_batch / schedule / minibatch, the step's loss of a micro-batch
         (``graftzoo.training.models.loss.micro_batch_loss``), Policy.zero_grad / accumulate / apply_gradients.
  floor  plain ``model.generate`` + one plain forward / log-softmax gather / advantage-weighted
         mean / backward / clip / AdamW on the same batch.

The three alternate inside one process: a callback at the end of every TRL step runs one ``ours``
step and one ``floor`` step, so VM speed drift hits all three alike. Medians over ``--rounds``
rounds after ``--warmup`` rounds. torch runs on ``--threads`` (default 1) intra-op threads.
``--clock cpu`` times this thread's CPU time instead of wall time: steadier when other jobs share
the machine (every side runs in this one thread).

Needs the ``bench`` extra (``pip install -e .[bench]``, i.e. trl).
Run: python bench/compare_trl.py [--rounds 30 --warmup 3 --threads 1 --clock wall|cpu --profile]
"""
from __future__ import annotations

from dataclasses import replace
import argparse
import copy
import cProfile
import pstats
import random
import re
import statistics
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from graftzoo.algos.base import StepContext
from graftzoo.contract.config import LearnerFacts, OptimSection
from graftzoo.training.engines.engine import HFEngine
from graftzoo.training.models.loss import micro_batch_loss
from graftzoo.training.models.policy import Policy
from graftzoo.contract.registry import get_algo
from graftzoo.contract.types import Prompt
from graftzoo.envs.templates import TEMPLATES, register_template

PROMPTS_PER_STEP, GENERATIONS, NEW_TOKENS = 8, 8, 32
LR, GRAD_CLIP = 1e-5, 1.0
EOS, PAD = "<|endoftext|>", "<|pad|>"
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter  # set from --clock in main()


# ------------------------------------------------------------------------------------------------
# the shared tiny set-up (docs/scaling.md, "The tiny model")
# ------------------------------------------------------------------------------------------------

def build_tokenizer(seed: int = 0):
    """Byte-level BPE trained on 400 seeded arithmetic strings; vocab 512; left padding."""
    rng = random.Random(seed)
    corpus = []
    for _ in range(400):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        corpus.append(f"What is {a}+{b}? Answer: {a + b}")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS, pad_token=PAD, padding_side="left")


def build_model(tok):
    """Qwen2 hidden 128 / 2 layers / 4 heads / 2 KV heads / vocab 512, tied, fp32, SDPA, seed 0."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).float()


def make_problems(n: int = 64, seed: int = 1) -> list:
    """``n`` seeded (prompt text, answer) pairs "What is a+b? Answer:" with a, b in 1..99."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        out.append((f"What is {a}+{b}? Answer:", str(a + b)))
    return out


def reward(completion: str, answer: str) -> float:
    """1 if the completion contains the right integer, else 0 (the same function on every side)."""
    return 1.0 if answer in re.findall(r"-?\d+", completion) else 0.0


# ------------------------------------------------------------------------------------------------
# ours: graftzoo's real components
# ------------------------------------------------------------------------------------------------

class RewardEnv:
    """The scoring side of an env: ``score_groups`` returns the groups with each rollout's reward and correctness."""

    def score_groups(self, groups):
        def scored(r, gold):
            x = reward(r.text, gold)
            return replace(r, reward=x, correct=x > 0)
        return [replace(g, rollouts=[scored(r, g.prompt.gold) for r in g.rollouts]) for g in groups]


class Ours:
    """graftzoo's GRPO step on its real components (prompts rendered verbatim, no template)."""

    def __init__(self, model, tok):
        if "verbatim" not in TEMPLATES:
            register_template("verbatim")(lambda problem, tokenizer=None: problem)
        self.policy = Policy("bench-qwen2", model, tok, template="verbatim",
                             optim=OptimSection(lr=LR, grad_clip=GRAD_CLIP, weight_decay=0.0), temperature=1.0)
        self.engine = HFEngine(self.policy, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS)
        algo = get_algo("grpo")
        self.run = LearnerFacts(n=GENERATIONS, max_new_tokens=NEW_TOKENS, minibatches=1, epochs=1)
        self.learner = algo(algo.Config(), self.run)
        self.env = RewardEnv()
        self.make_ctx = lambda step: StepContext(step=step, epoch=0, run=self.run, policy=self.policy,
                                                 engine=self.engine, env=self.env)
        self.step_no = 0
        self.phases: dict = {"generate+score": [], "advantages+batch": [], "forward+loss": [], "backward+optim": []}

    def step(self, problems) -> int:
        """One training step through the Learner hooks and the step's loss and optimizer step (as
        graftzoo.training.learning.step does, the ratio base the rows arrived with); returns response tokens."""
        prompts = [Prompt(id=f"p{self.step_no}-{i}", text=t, gold=a) for i, (t, a) in enumerate(problems)]
        ctx, learner, pol = self.make_ctx(self.step_no), self.learner, self.policy
        t0 = clock()
        groups = learner.collect(ctx, prompts)
        t1 = clock()
        groups = learner.advantages(ctx, groups)
        batch = learner.build_batch(ctx, learner.exchange(ctx, groups, None))
        mbs = [batch.minibatch(idx) for idx in learner.schedule(ctx, batch)]
        t2 = clock()
        fwd = bwd = 0.0
        for mb in mbs:
            a = clock()
            loss, _ = micro_batch_loss(ctx, pol, learner, mb)
            b = clock()
            pol.zero_grad()
            pol.apply_gradients(pol.accumulate(loss))
            fwd, bwd = fwd + b - a, bwd + clock() - b
        pol.version += 1
        self.step_no += 1
        self.last = (t1 - t0, t2 - t1, fwd, bwd)
        return sum(len(r.token_ids) for g in groups for r in g.rollouts)

    def record(self):
        for k, v in zip(self.phases, self.last):
            self.phases[k].append(v)


# ------------------------------------------------------------------------------------------------
# the floor: plain generate + one plain torch update
# ------------------------------------------------------------------------------------------------

class Floor:
    """Plain ``generate`` + one plain torch update: what any framework must at least do."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok
        self.opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        self.phases: dict = {"generate": [], "update": []}

    def step(self, problems) -> int:
        tok, model = self.tok, self.model
        t0 = clock()
        enc = tok([t for t, _ in problems], return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc.input_ids.repeat_interleave(GENERATIONS, 0)
        att = enc.attention_mask.repeat_interleave(GENERATIONS, 0)
        model.eval()
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=1.0, top_p=1.0,
                                 top_k=0, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        model.train()
        P = ids.shape[1]
        comp = seq[:, P:]
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        r = torch.tensor([reward(t, a) for t, (_, a) in zip(texts, [p for p in problems for _ in range(GENERATIONS)])])
        r = r.view(-1, GENERATIONS)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        t1 = clock()
        full_att = torch.cat([att, torch.ones_like(comp)], 1)
        R = comp.shape[1]
        logits = model(input_ids=seq, attention_mask=full_att, logits_to_keep=R + 1).logits[:, :-1]
        logp = F.log_softmax(logits, -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
        loss = -(logp * adv.unsqueeze(1)).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        self.opt.step()
        self.last = (t1 - t0, clock() - t1)
        return comp.numel()

    def record(self):
        for k, v in zip(self.phases, self.last):
            self.phases[k].append(v)


# ------------------------------------------------------------------------------------------------
# TRL, with the other two run from its step-end callback
# ------------------------------------------------------------------------------------------------

def run(args) -> dict:
    from datasets import Dataset  # the bench extra (trl and its datasets dependency)
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    base = build_model(tok)
    problems = make_problems()
    ours, floor = Ours(copy.deepcopy(base), tok), Floor(copy.deepcopy(base), tok)
    trl_tokens: list = []

    def trl_reward(completions, answer, completion_ids, **_):
        trl_tokens.append(sum(len(c) for c in completion_ids))
        return [reward(c, a) for c, a in zip(completions, answer)]

    times: dict = {"TRL": [], "ours": [], "floor": []}
    tokens: dict = {"TRL": set(), "ours": set(), "floor": set()}
    prof = cProfile.Profile(timer=clock) if args.profile else None
    total = args.warmup + args.rounds

    class Interleave(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if torch.get_num_threads() != args.threads:
                raise RuntimeError(f"torch threads changed to {torch.get_num_threads()} (wanted {args.threads})")
            self.t0 = clock()

        def on_step_end(self, a, state, control, **kw):
            t_trl = clock() - self.t0
            k = state.global_step - 1
            batch = [problems[(k * PROMPTS_PER_STEP + i) % len(problems)] for i in range(PROMPTS_PER_STEP)]
            timed = k >= args.warmup
            if timed and prof:
                prof.enable()
            t = clock()
            n_ours = ours.step(batch)
            t_ours = clock() - t
            if timed and prof:
                prof.disable()
            t = clock()
            n_floor = floor.step(batch)
            t_floor = clock() - t
            if timed:
                for name, v in (("TRL", t_trl), ("ours", t_ours), ("floor", t_floor)):
                    times[name].append(v)
                tokens["TRL"].add(trl_tokens[-1])
                tokens["ours"].add(n_ours)
                tokens["floor"].add(n_floor)
                ours.record()
                floor.record()

    with tempfile.TemporaryDirectory(prefix="compare_trl-") as out_dir:
        cfg = GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
            num_generations=GENERATIONS, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
            max_completion_length=NEW_TOKENS, generation_kwargs={"min_new_tokens": NEW_TOKENS},
            temperature=1.0, top_p=1.0, top_k=0, beta=0.0, learning_rate=LR, max_grad_norm=GRAD_CLIP,
            bf16=False, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", max_steps=total,
            disable_tqdm=True, seed=0)
        trainer = GRPOTrainer(model=copy.deepcopy(base), reward_funcs=trl_reward, args=cfg, processing_class=tok,
                              train_dataset=Dataset.from_list([{"prompt": t, "answer": a} for t, a in problems]),
                              callbacks=[Interleave()])
        trainer.remove_callback(PrinterCallback)  # logging still runs every step (after on_step_end), unprinted
        torch.set_num_threads(args.threads)
        trainer.train()
    return {"times": times, "tokens": tokens, "ours_phases": ours.phases, "floor_phases": floor.phases, "prof": prof}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds (one step of each side per round)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: perf_counter; cpu: this thread's CPU time (steadier when other jobs share the CPU)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile our timed steps and print the top functions (slows ours: quote unprofiled figures)")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    warnings.filterwarnings("ignore")
    try:
        import trl
    except ImportError:
        raise SystemExit("bench/compare_trl.py needs TRL, the bench extra: pip install -e .[bench]")
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
          f"torch threads: {args.threads}; clock: {args.clock}")
    print(f"{PROMPTS_PER_STEP} prompts x {GENERATIONS} generations x {NEW_TOKENS} new tokens; "
          f"{args.warmup} warm-up + {args.rounds} timed rounds (TRL, ours, floor alternating)")
    res = run(args)
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    for name in ("TRL", "ours", "floor"):
        v = sorted(res["times"][name])
        p10, p90 = v[len(v) // 10], v[(len(v) * 9) // 10]
        toks = sorted(res["tokens"][name])
        print(f"  {name:5s} median {med[name]:.3f} s (p10-p90 {p10:.3f}-{p90:.3f}); completion tokens/step {toks}")
    for label, phases in (("ours", res["ours_phases"]), ("floor", res["floor_phases"])):
        print(f"  {label} split: " + ", ".join(f"{k} {statistics.median(v):.4f}" for k, v in phases.items()))
    if res["prof"] is not None:
        pstats.Stats(res["prof"]).sort_stats("cumulative").print_stats(30)
    print(f"median step time: ours {med['ours']:.3f} s, TRL {med['TRL']:.3f} s, floor {med['floor']:.3f} s; "
          f"ours/TRL = {med['ours'] / med['TRL']:.2f} (target <= 0.8); ours/floor = {med['ours'] / med['floor']:.2f}")


if __name__ == "__main__":
    main()
