"""A worker group's model built on the meta device, each rank loading only its own shards
(``graftzoo.training.planner.build.build_sharded_policy``), on 2 gloo ranks in real processes.

One script (``_RANKS``) starts two groups of 2 ranks at once, each rank a fresh process on 127.0.0.1, inside a
loopback-only network and PID namespace where the machine allows one (tests/test_ray_backend.py's ``loopback``).
Both groups first measure the peak resident memory of building a 77 M-parameter Llama (float32, saved in
``tmp_path`` as sharded safetensors): the ``meta`` group with ``build_sharded_policy``, the ``whole`` group with
``build_policy`` + ``shard_policy``. The ``meta`` group then builds the micro pair's models and a small ``kind: hf``
model both ways (``build_policy`` + ``make_ref`` + ``shard_policy``, and ``build_sharded_policy``) and compares
everything: the gathered weights bit for bit, the buffers, the KL reference, the policy's settings, its optimizer,
the torch RNG state; and the loss of a forward on each rank's half of a batch.
"""
import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from graftzoo.contract.config import load_config, model_spec
from graftzoo.contract.errors import ConfigError
from graftzoo.tiny.hf import save_hf_model
from graftzoo.training.models import fsdp
from graftzoo.training.planner.build import (MetaUnsupported, build_policy, build_sharded_policy, load_tokenizer_of,
                                       sharded_model)
from test_ray_backend import finish, loopback

# the script's parent process imports only the standard library; each rank imports torch and graftzoo once
_RANKS = r'''
import json, logging, multiprocessing, socket, sys

def config(precision):
    from graftzoo.contract.config import load_config
    return load_config(pair="micro", algo="grpo", overrides=[f"optim.precision={precision}"])

def ordinary(spec, cfg, ref):
    from graftzoo.training.models import fsdp
    from graftzoo.training.planner.build import build_policy, make_ref
    pol = build_policy(spec, cfg, seed=0)
    frozen = make_ref(pol, sharded=True) if ref else None
    fsdp.shard_policy(pol, frozen)
    return pol, frozen

def meta(spec, cfg, ref):
    from graftzoo.training.planner.build import build_sharded_policy
    return build_sharded_policy(spec, cfg, seed=0, ref=ref)

def peak_growth(build, spec, cfg):
    # (an upper bound, a lower bound) of the growth of this process's peak resident set while build runs (MiB):
    # from its resident set at the start, and from its peak at the start
    import gc, resource, psutil
    gc.collect()
    now, peak = psutil.Process().memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pol, _ = build(spec, cfg, False)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return (after - now) / 2**20, (after - peak) / 2**20

def facts(pol, ref):
    # what else than the weights the two builds must agree on
    opt, model = pol.optimizer, pol.model
    return {"template": pol.template, "stop": list(pol.stop_strings), "max_response": pol.max_response_tokens,
            "autocast": str(pol.autocast_dtype), "counts": [pol.trainable_params, pol.total_params],
            "sharded": pol.sharded, "tokenizer_id": pol.tokenizer_id, "training": model.training,
            "checkpointing": model.is_gradient_checkpointing, "param_dtype": str(pol.param_dtype),
            "device": str(pol.device),
            "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "config": model.config.to_json_string(), "generation": model.generation_config.to_json_string(),
            "optimizer": {k: str(v) for k, v in opt.defaults.items()},
            "optimized": [[list(p.shape), list(p.to_local().shape)] for p in opt.param_groups[0]["params"]],
            "lr": pol.lr, "scheduler": pol.scheduler.last_epoch, "micro": pol.max_tokens_per_micro,
            "ref": None if ref is None else {"training": ref.model.training, "optimizer": ref.optimizer is None,
                                             "grad": any(p.requires_grad for p in ref.model.parameters()),
                                             "sharded": ref.sharded}}

def whole_state(model, r):
    # the gathered weights and (rank 0's) buffers on rank 0 (a collective)
    from graftzoo.training.models import fsdp
    state = fsdp.full_model_state(model)
    return {**state, **{f"buffer:{n}": b.detach().cpu() for n, b in model.named_buffers()}} if r == 0 else {}

def differences(a, b):
    import torch
    if sorted(a) != sorted(b):
        return [f"keys {sorted(set(a) ^ set(b))}"]
    return [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]

def loss_of(pol, r, world):
    # the group's loss of a forward, each rank on its half of the batch
    import torch
    torch.manual_seed(1)
    ids = torch.randint(3, len(pol.tokenizer) - 1, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0   # left padding of a shorter prompt
    with torch.no_grad():
        loss = -pol.logprobs(ids[r::world], mask[r::world], 8)[0].sum() / 32
    losses = [torch.zeros(1) for _ in range(world)]
    torch.distributed.all_gather(losses, loss.reshape(1).float())
    return float(sum(losses))

class Notes(logging.Handler):
    # graftzoo's log lines (build_sharded_policy says here when it falls back to loading the whole model)
    lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

def rank(mode, r, world, port, big, small, out):
    import torch
    logging.getLogger("graftzoo").addHandler(Notes())
    logging.getLogger("graftzoo").setLevel(logging.INFO)
    import graftzoo.training.planner.build, transformers.models.llama.modeling_llama  # code, before memory is measured
    from graftzoo.training.models import fsdp
    torch.set_num_threads(1)
    fsdp.init_group(r, world, "127.0.0.1", port, "cpu", 300)  # generous: a loaded machine starts ranks slowly
    from graftzoo.contract.config import model_spec
    cfg = config("fp32")
    big_spec = model_spec({"id": "big-llama", "kind": "hf", "path": big, "dtype": "float32"}, cfg)
    result = {"growth": peak_growth(meta if mode == "meta" else ordinary, big_spec, cfg), "cases": {}}
    cases = [("micro-qwen-char", "fp32"), ("micro-gpt2-pair", "fp32"), ("small-hf", "auto")] if mode == "meta" else []
    for model_id, precision in cases:
        cfg = config(precision)
        spec = next((s for s in cfg.pair.models if s.id == model_id), None) or model_spec(
            {"id": model_id, "kind": "hf", "path": small}, cfg)
        torch.manual_seed(0)
        a, ra = ordinary(spec, cfg, True)
        rng_a = torch.get_rng_state()
        torch.manual_seed(0)
        Notes.lines.clear()
        b, rb = meta(spec, cfg, True)
        rng_b = torch.get_rng_state()
        notes = list(Notes.lines)
        result["cases"][f"{model_id}/{precision}"] = {
            "ordinary": facts(a, ra), "meta": facts(b, rb), "rng": torch.equal(rng_a, rng_b), "notes": notes,
            "policy": differences(whole_state(a.model, r), whole_state(b.model, r)),
            "ref": differences(whole_state(ra.model, r), whole_state(rb.model, r)),
            "loss": loss_of(b, r, world) if precision == "fp32" else None}
    if r == 0:
        json.dump(result, open(out, "w"))
    torch.distributed.barrier()  # no rank leaves while another's gloo work is in flight (an abort at exit)
    torch.distributed.destroy_process_group()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

if __name__ == "__main__":
    _, big, small, folder = sys.argv
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank, args=(mode, r, 2, port, big, small, f"{folder}/{mode}.json"))
             for mode, port in (("meta", free_port()), ("whole", free_port())) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(1 if any(p.exitcode for p in procs) else 0)
'''

#: the large model of the memory measurement: 77 M parameters, 292 MiB in float32
BIG = dict(hidden_size=640, intermediate_size=1792, num_hidden_layers=12, num_attention_heads=10,
           num_key_value_heads=5, vocab_size=32000, max_position_embeddings=512, tie_word_embeddings=True,
           pad_token_id=0, eos_token_id=1, bos_token_id=None)


def _hf_folders(root):
    """(a 77 M-parameter Llama in float32, a tiny one) as ``kind: hf`` folders, both saved as sharded
    safetensors (``model.safetensors.index.json``), with graftzoo.tiny.hf's tokenizer; the size of the first's
    weights in MiB."""
    small = save_hf_model(root / "small")
    model = AutoModelForCausalLM.from_pretrained(small)
    os.remove(small / "model.safetensors")
    model.save_pretrained(small, max_shard_size="100KB")
    big = save_hf_model(root / "big")
    os.remove(big / "model.safetensors")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**BIG))
    model.save_pretrained(big, max_shard_size="100MB")
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return big, small, size


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """The ``meta`` and ``whole`` groups' results (both run at once), and the large model's size (MiB)."""
    tmp = tmp_path_factory.mktemp("meta")
    big, small, size = _hf_folders(tmp)
    for spec in load_config(pair="micro", algo="grpo").pair.models:
        load_tokenizer_of(spec)  # warmed up once here, not by both ranks at once
    script = tmp / "ranks.py"
    script.write_text(_RANKS)
    code, log = finish(loopback([sys.executable, str(script), str(big), str(small), str(tmp)]), timeout=300)
    assert code == 0, log[-3000:]
    return {mode: json.loads((tmp / f"{mode}.json").read_text()) for mode in ("meta", "whole")}, size


@pytest.mark.slow
def test_meta_build_is_the_ordinary_build(groups):
    """The micro pair's models in fp32 (a Qwen2 with rotary buffers, a GPT-2; tied embeddings) and a kind: hf Llama
    from sharded safetensors (loaded in bf16 and trained bf16-mixed, an odd vocabulary: uneven shards) are, built on
    the meta device and loaded shard by shard, what the ordinary build and sharding make: the same gathered weights
    and buffers bit for bit, the same KL reference, settings, optimizer and RNG state."""
    results, _ = groups
    cases = results["meta"]["cases"]
    assert len(cases) == 3
    for name, case in cases.items():
        assert case["notes"] == [], name  # built on the meta device, not loaded whole
        assert case["policy"] == [], name
        assert case["ref"] == [], name
        assert case["meta"] == case["ordinary"], name
        assert case["rng"], name
        assert case["meta"]["tied"] and case["meta"]["sharded"], name
    assert cases["small-hf/auto"]["meta"]["autocast"] == "torch.bfloat16"


@pytest.mark.slow
def test_meta_build_forward_matches_one_process(groups):
    """The loss of the meta-built group's forward, each rank on its half of a batch, is one process's (fp32)."""
    results, _ = groups
    cfg = load_config(pair="micro", algo="grpo", overrides=["optim.precision=fp32"])
    for model_id in ("micro-qwen-char", "micro-gpt2-pair"):
        pol = build_policy(next(s for s in cfg.pair.models if s.id == model_id), cfg, seed=0)
        torch.manual_seed(1)
        ids = torch.randint(3, len(pol.tokenizer) - 1, (4, 20))
        mask = torch.ones_like(ids)
        mask[1, :5] = 0
        with torch.no_grad():
            loss = float(sum(-pol.logprobs(ids[r::2], mask[r::2], 8)[0].sum() / 32 for r in range(2)))
        assert results["meta"]["cases"][f"{model_id}/fp32"]["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_meta_build_peak_memory_is_a_shard(groups):
    """Building, sharding and loading the 77 M-parameter model grows a rank's peak resident set by well under the
    model's float32 size the meta way (at most an upper bound of 0.75 of it, 2 ranks), by at least the whole of it
    the ordinary way (a lower bound)."""
    results, size = groups
    meta_upper, _ = results["meta"]["growth"]
    _, whole_lower = results["whole"]["growth"]
    print(f"\npeak RSS growth per rank, {size:.0f} MiB of float32 weights over 2 ranks: meta build "
          f"{meta_upper:.0f} MiB at most, whole build {whole_lower:.0f} MiB at least")
    assert meta_upper < 0.75 * size
    assert whole_lower >= size


def test_a_folder_without_safetensors_is_refused(tmp_path):
    """A model folder with ``pytorch_model.bin`` weights only cannot be loaded shard by shard: a ConfigError naming
    the model, before anything is sharded (no process group needed)."""
    folder = save_hf_model(tmp_path / "bin")
    torch.save(AutoModelForCausalLM.from_pretrained(folder).state_dict(), folder / "pytorch_model.bin")
    os.remove(folder / "model.safetensors")
    cfg = load_config(pair="micro", algo="grpo")
    with pytest.raises(ConfigError, match=r"model 'bin-llama': .* holds no safetensors weights"):
        build_sharded_policy(model_spec({"id": "bin-llama", "kind": "hf", "path": str(folder)}, cfg), cfg)


def test_keys_missing_from_the_files_are_found_before_sharding(tmp_path):
    """A tensor the weight files lack (which loading the whole model initialises) sends the model to the ordinary
    build (``MetaUnsupported``, naming it) before anything is sharded; the tied ``lm_head`` is not missing."""
    folder = save_hf_model(tmp_path / "gap")
    weights = load_file(folder / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = load_config(pair="micro", algo="grpo")
    with pytest.raises(MetaUnsupported, match=r"1 tensors are not in its weight files \(model.norm.weight"):
        sharded_model(model_spec({"id": "gap", "kind": "hf", "path": str(folder)}, cfg), cfg, folder,
                      fsdp.weight_files(folder))
