"""The guide's bring-your-own walkthrough (docs/guide.md) runs as written: a local Hugging Face model folder with
chat template, a JSONL with custom field names (task.fields), a Hugging Face ``datasets`` folder, LoRA, and the
export of the result as a ``save_pretrained`` folder.

The block is executed by bash in an empty directory, with the venv's ``python`` and ``graftzoo`` first on PATH; it is
made cheap (two steps of two prompts): the pair file gets the settings that change what is trained (so the runs keep
the names the guide gives them: a ``--set`` of such a key would add a hash), each ``graftzoo train`` line the others."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from graftzoo.training.eval_checkpoints import load_run_config
from graftzoo.training.planner.build import build_policy
from graftzoo.contract.types import Prompt
from graftzoo.peers.store import TrajectoryStore

pytestmark = pytest.mark.slow  # real processes: see pytest.ini

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
CHEAP = " --set run.steps=2 --set eval.size=4 --set run.progress=false --no-track"  # keys free of the run's name
CHEAP_PAIR = "task: {prompts_per_step: 2}\nrollout: {n: 2, max_new_tokens: 8}\n"  # written into my_pair.yaml


def walkthrough_script() -> str:
    """The ```bash block of the guide's "Your model, your data, your results" section, train lines made cheap."""
    section = GUIDE.read_text().split("\n## Your model, your data, your results\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```\n", 1)[0]
    assert block.count("\nname: mine\n") == 1
    block = block.replace("\nname: mine\n", "\nname: mine\n" + CHEAP_PAIR)
    lines = [line + CHEAP if line.startswith("graftzoo train ") else line for line in block.splitlines()]
    return "set -euo pipefail\n" + "\n".join(lines) + "\n"


def test_readme_walkthrough_trains_your_model_on_your_data_and_exports_it(tmp_path, monkeypatch):
    script = walkthrough_script()
    assert script.count("graftzoo train ") == 2 and "graftzoo export " in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    monkeypatch.chdir(tmp_path)  # the pair file's model path is relative, as a user's would be
    runs = {name: tmp_path / "runs" / name for name in ("grpo-mine-my-43591784-s0", "grpo-mine-my_hf-s0")}
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(runs)
    for name, run in runs.items():
        cfg = load_run_config(run)
        assert json.loads((run / "summary.json").read_text())["status"] == "done", name
        assert cfg.task.env == "graftzoo/MathReasoning-v0" and cfg.model.lora is None
        assert cfg.pair.models[0].lora.r == 8
        # the model's own chat template renders the prompt (template: auto)
        pol = build_policy(cfg.pair.models[0], cfg)
        assert pol.template == "chat" and pol.render(Prompt(id="x", text="1+2")).startswith("<|user|>1+2")
        # only the adapters are checkpointed
        ckpt = torch.load(sorted((run / "checkpoints").glob("step_*"))[-1] / "my-model.pt", weights_only=True)
        state = ckpt["policy"]
        assert state["lora"] is True and state["model"] and all("lora_" in k for k in state["model"]), list(state["model"])[:5]
        # trained on the data's rows: JSONL ids come from the mapped `uid` field
        ids = TrajectoryStore(run / "store").prompt_ids("my-model")
        assert ids and all(i.split("/", 1)[1].startswith("q" if name != "grpo-mine-my_hf-s0" else "") for i in ids)
    fields = yaml.safe_load((runs["grpo-mine-my-43591784-s0"] / "config.yaml").read_text())["task"]["fields"]
    assert fields == {"problem": "ask", "answer": "result.value", "id": "uid"}

    out = tmp_path / "hf" / "my-model"
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert res.stdout.strip().splitlines()[-1] == str(model.num_parameters())
    assert not any("lora" in k for k in model.state_dict())
    assert tok.apply_chat_template([{"role": "user", "content": "1+2"}], tokenize=False,
                                   add_generation_prompt=True).startswith("<|user|>1+2")
