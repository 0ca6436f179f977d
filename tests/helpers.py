"""Small helpers shared by several test files (imported as `from helpers import ...`)."""
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from click.testing import CliRunner

from graftzoo.apps.cli import main
from graftzoo.contract.types import Rollout
from graftzoo.peers.xt import score_rollouts
from graftzoo.algos.losses import LossInputs, get_loss
from graftzoo.training.models.loss import micro_batch_loss, pg_mask, ratio_base


def scored_rollout(pol, prompt, text, correct):
    """A stopped rollout of ``text`` by ``pol`` with its real theta_old log-probs."""
    ids = pol.encode_text(text) + [pol.eos_id]
    r = Rollout(prompt_id=prompt.id, model_id=pol.model_id, policy_version=0, text=text, token_ids=ids,
                logprobs=[0.0] * len(ids), prompt_token_ids=pol.encode_prompt(prompt), eos_id=pol.eos_id,
                reward=float(correct), correct=correct, tokenizer_id=pol.tokenizer_id)
    return score_rollouts(pol, [r])[0]


def theta_old_base(policy, mb):
    """A micro-batch's ratio base from a separate no-grad pass of the update's forward code on the micro-batch itself
    (its rows, padding or packing) under ``policy``'s current weights: what the step's loss takes from its own
    forward with ``base_from_forward`` (``graftzoo.training.models.loss.ratio_base``; a given base, ``given_old``, kept)."""
    with torch.no_grad():
        logp, _ = policy.logprobs(mb.input_ids, mb.attention_mask, mb.resp_len)
    return ratio_base(mb, logp, True)


def policy_loss(learner, logp, mb, update: int = 0):
    """The policy loss ``learner`` names (``get_loss(learner.loss)``, with its ``cfg`` and ``clip``) on ``mb`` alone:
    log-probs ``logp`` against the rows' ratio base, the inputs built as the step's loss builds them
    (``graftzoo.training.models.loss.micro_batch_loss``), ``update`` the optimizer update within the step."""
    x = LossInputs(logp, mb.old_logp, mb.advantages, pg_mask(mb), mb.weights, mb.role, mb.loss_mask,
                   mb.origin_mean_logp, update)
    return get_loss(learner.loss)(x, learner.cfg, learner.clip)


class Spy:
    """A policy wrapper keeping the log-prob tensor of the last loss, with its gradient."""

    def __init__(self, policy):
        self.policy = policy

    def logprobs(self, *a, **kw):
        logp, ent = self.policy.logprobs(*a, **kw)
        logp.retain_grad()
        self.logp = logp
        return logp, ent


def loss_and_grads(learner, ctx, pol, mb):
    """The step's loss on ``mb`` (``micro_batch_loss``); d loss / d log-probs (per token), d loss / d parameters
    (flattened) and the log-probs themselves."""
    spy = Spy(pol)
    loss, _ = micro_batch_loss(ctx, spy, learner, mb)
    params = [p for p in pol.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [spy.logp, *params], allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads[1:], params)])
    return loss.detach(), grads[0], flat, spy.logp.detach()


# A researcher's learner with a classic bug: group-normalised advantages without an epsilon (0/0 on a group whose
# rollouts all score the same). It trains normally until such a group appears, then every update is NaN.
NO_EPS = """
import torch
from graftzoo import Learner


class NoEps(Learner):
    def advantages(self, ctx, groups):
        for g in groups:
            r = torch.tensor([x.reward for x in g.rollouts])
            g.advantages = ((r - r.mean()) / r.std(unbiased=False)).tolist()
        return groups
"""


def plugin_site(tmp_path) -> Path:
    """An installed distribution (dist-info + module) on a folder that goes on PYTHONPATH."""
    site = tmp_path / "site"
    (site / "gz_noeps").mkdir(parents=True)
    (site / "gz_noeps" / "__init__.py").write_text(NO_EPS)
    info = site / "gz_noeps-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gz-noeps\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[graftzoo.algos]\nno_eps = gz_noeps:NoEps\n")
    return site


def one_line_error(res, code: int, *needles) -> str:
    """The command failed with exit ``code`` and one ``Error:`` line on stderr (no traceback) containing every
    needle; that line."""
    assert res.returncode == code, (res.returncode, res.stdout[-2000:], res.stderr[-4000:])
    assert "Traceback" not in res.stderr, res.stderr[-4000:]
    lines = [x for x in res.stderr.splitlines() if x.startswith("Error:")]
    assert len(lines) == 1, res.stderr[-4000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def cli_here(*args, cwd=None) -> SimpleNamespace:
    """``graftzoo ARGS`` in this process (click's runner; wandb offline, no hub), run from ``cwd``: returncode,
    stdout and stderr as a subprocess gives them, the run's log lines included (the command's log handler is made
    anew on this call's stderr, as in a fresh process, and the logger is left as it was found)."""
    here, logger = os.getcwd(), logging.getLogger("graftzoo")
    found = logger.handlers[:], logger.level, logger.propagate
    logger.handlers.clear()
    try:
        if cwd is not None:
            os.chdir(cwd)
        res = CliRunner().invoke(main, [str(a) for a in args], env={"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    finally:
        os.chdir(here)
        logger.handlers[:] = found[0]
        logger.setLevel(found[1])
        logger.propagate = found[2]
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout, stderr=res.stderr)


def one_run(folder, pattern: str) -> Path:
    """The one run directory under ``folder`` whose name matches ``pattern`` (a default run name whose ``*`` is the
    hash of the settings set beyond the pair and preset)."""
    found = sorted(Path(folder).glob(pattern))
    assert len(found) == 1, (pattern, sorted(p.name for p in Path(folder).iterdir()))
    return found[0]


def wandb_records(path):
    """The protobuf ``Record``s of a wandb transaction log (an offline run's ``run-ID.wandb``, what ``wandb sync``
    uploads): a 7-byte header, then LevelDB log blocks of 32 KiB, each piece behind a 7-byte header (checksum,
    length, type: 1 a whole record, 2-4 its first, middle and last pieces)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb transaction log"
    block, pos, part = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:   # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            yield record
            part = b""
