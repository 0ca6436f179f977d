"""Small helpers shared by several test files (imported as `from helpers import ...`)."""
from graftzoo.core.types import Rollout
from graftzoo.core.xt import score_rollouts


def scored_rollout(pol, prompt, text, correct):
    """A stopped rollout of ``text`` by ``pol`` with its real theta_old log-probs."""
    ids = pol.encode_text(text) + [pol.eos_id]
    r = Rollout(prompt_id=prompt.id, model_id=pol.model_id, policy_version=0, text=text, token_ids=ids,
                logprobs=[0.0] * len(ids), prompt_token_ids=pol.encode_prompt(prompt), eos_id=pol.eos_id,
                reward=float(correct), correct=correct, tokenizer_id=pol.tokenizer_id)
    score_rollouts(pol, [r])
    return r


class Spy:
    """A policy wrapper keeping the log-prob tensor of the last loss, with its gradient."""

    def __init__(self, policy):
        self.policy = policy

    def logprobs(self, *a, **kw):
        logp, ent = self.policy.logprobs(*a, **kw)
        logp.retain_grad()
        self.logp = logp
        return logp, ent
