"""graftzoo.envs.datasets: bundled data, user data (JSONL, JSON, Parquet, Arrow, datasets folders, Hub names;
verl rows), errors naming file, row and field, gold self-verification."""
import hashlib
import json
import socket
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graftzoo.envs import MathDataset, MathReasoningEnv, load_dataset, verify_batch
from graftzoo.envs import datasets as gz_datasets
from graftzoo.envs.datasets import BENCHMARKS, BUNDLED, DATA_DIR, DatasetError, MissingSplitError, last_boxed
from graftzoo.contract.types import Prompt


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_benchmark_sizes():
    sizes = {name: len(load_dataset(name)) for name in BENCHMARKS}
    assert sizes == {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva_math": 272}


def test_training_sets_and_gsm8k_split_alias():
    assert len(load_dataset("math_train")) == 7500
    train, test = load_dataset("gsm8k", split="train"), load_dataset("gsm8k", split="test")
    assert (len(train), len(test)) == (7473, 1319)
    assert train.name == "gsm8k_train" and test.split == "test"
    assert load_dataset("gsm8k_test")[0].id == test[0].id == "gsm8k_test/gsm8k-test-0"
    with pytest.raises(ValueError, match="split='train' or split='test'"):
        load_dataset("gsm8k")
    with pytest.raises(ValueError, match="only the 'test' split"):
        load_dataset("math500", split="train")


def test_bundled_prompt_fields_ids_and_hash():
    ds = load_dataset("math500")
    p = ds[0]
    assert isinstance(ds, MathDataset) and isinstance(p, Prompt)
    assert p.id == "math500/test/precalculus/807.json"
    assert p.text.startswith("Convert the point $(0,3)$")
    assert p.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert p.source == "MATH500" and p.metadata["level"] == 2 and "answer" not in p.metadata
    assert ds.path == DATA_DIR / "math500.jsonl"
    assert ds.hash == hashlib.sha256(ds.path.read_bytes()).hexdigest()
    assert len({q.id for q in ds}) == 500
    assert [q.id for q in ds[:2]] == [ds[0].id, ds[1].id]
    assert load_dataset("aime24")[0].gold == "204"


def test_every_bundled_file_is_registered_and_readme_copied():
    assert sorted(f for f, _ in BUNDLED.values()) == sorted(p.name for p in DATA_DIR.glob("*.jsonl"))
    assert "License" in (DATA_DIR / "README.md").read_text()


# Gold answers that cannot verify against themselves, with the reason. Found by running
# test_gold_answers_verify_against_themselves over every bundled row.
GOLD_SELF_FAILURES = {
    # an answer offering two alternatives: the verifier rejects "X or Y" answers as multiple_answers
    "math_train/math_train-4371": "multiple_answers",  # -2 \text{ or } -12
    "math_train/math_train-4571": "multiple_answers",  # -12 \text{ or } -30
}


@pytest.mark.parametrize("name", list(BENCHMARKS) + ["math_train", "gsm8k_train", "gsm8k_test"])
def test_gold_answers_verify_against_themselves(name):
    ds = load_dataset(name)
    golds = [p.gold for p in ds]
    results = verify_batch([f"The answer is $\\boxed{{{g}}}$." for g in golds], golds, timeout=2.0)
    failures = {p.id: r.status for p, r in zip(ds, results) if not r.correct}
    expected = {k: v for k, v in GOLD_SELF_FAILURES.items() if k.startswith(name + "/")}
    assert failures == expected


def test_arithmetic_dataset_is_generated_and_hashed():
    a = load_dataset("arithmetic", size=30, seed=1)
    b = load_dataset("arithmetic", size=30, seed=1)
    c = load_dataset("arithmetic", size=30, seed=2)
    assert len(a) == 30 and a.path is None and a.split == "train"
    assert a.hash == b.hash != c.hash
    assert a[0].gold == a[0].metadata["solution"].rsplit("=", 1)[1]  # the generator's own gold
    assert load_dataset("arithmetic", split="test", size=5)[0].id != a[0].id
    with pytest.raises(TypeError, match="unexpected keyword.*'problem_key'"):
        load_dataset("arithmetic", problem_key="q")


def test_user_jsonl_with_aliases(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"question": "Sold 48 then half as many. Total?", "answer": "48/2 = 24\n48+24 = 72\n#### 1,072"},
        {"problem": "2+2", "gold": 4},
        {"problem": "x?", "solution": "so $x = \\boxed{\\frac{1}{2}}$."},
        "",  # blank lines are skipped
        {"problem": "y?", "ground_truth": 3.0, "level": 5},
    ])
    ds = load_dataset(str(path))
    assert ds.name == "mine" and len(ds) == 4
    assert [p.gold for p in ds] == ["1072", "4", "\\frac{1}{2}", "3"]
    assert [p.id for p in ds] == ["mine/0", "mine/1", "mine/2", "mine/3"]
    assert ds[3].metadata == {"level": 5} and ds[2].metadata["solution"].startswith("so")
    assert ds.hash == hashlib.sha256(path.read_bytes()).hexdigest()


def test_user_jsonl_custom_keys_and_label_free(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"uid": "a", "q": "1+1", "meta": {"ans": "2"}},
        {"uid": "b", "q": "2+3", "meta": {}},
    ])
    ds = load_dataset(path, problem_key="q", answer_key="meta.ans", id_key="uid", label_free=True, name="mix")
    assert [(p.id, p.text, p.gold) for p in ds] == [("mix/a", "1+1", "2"), ("mix/b", "2+3", None)]
    with pytest.raises(DatasetError, match=r"^d\.jsonl:2: field 'meta\.ans' is missing"):
        load_dataset(path, problem_key="q", answer_key="meta.ans", id_key="uid")


@pytest.mark.parametrize("rows, message", [
    ([{"problem": "a", "answer": "1"}, {"problem": "b"}], r"^data\.jsonl:2: field 'answer' is missing"),
    ([{"problem": "a", "answer": "1"}, '{"problem": "b", "answer": '], r"^data\.jsonl:2: invalid JSON"),
    (['[1, 2]'], r"^data\.jsonl:1: expected a JSON object"),
    ([{"answer": "1"}], r"^data\.jsonl:1: field 'problem' is missing"),
    ([{"problem": "  ", "answer": "1"}], r"^data\.jsonl:1: field 'problem' is empty"),
    ([{"problem": "a", "answer": ["1"]}], r"^data\.jsonl:1: field 'answer' must be a string or a number"),
    ([{"problem": "a", "answer": ""}], r"^data\.jsonl:1: field 'answer' is empty"),
    ([{"id": "x", "problem": "a", "answer": "1"}, {"id": "x", "problem": "b", "answer": "2"}],
     r"^data\.jsonl:2: id 'data/x' repeats the id of line 1"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(path))


def test_broken_row_deep_in_a_file(tmp_path):
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(20)]
    del rows[16]["answer"]
    with pytest.raises(DatasetError, match=r"^data\.jsonl:17: field 'answer' is missing"):
        load_dataset(write_jsonl(tmp_path / "data.jsonl", rows))


def test_parquet_file_loads(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({
        "id": ["r0", "r1"],
        "problem": ["What is 6*7?", "Half of 9?"],
        "reward_model": [{"ground_truth": "42"}, {"ground_truth": "4.5"}],
    }), path)
    ds = load_dataset(path, answer_key="reward_model.ground_truth")
    assert [(p.id, p.gold) for p in ds] == [("train/r0", "42"), ("train/r1", "4.5")]
    assert ds.hash == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [p.gold for p in load_dataset(path)] == ["42", "4.5"]  # verl's reward_model.ground_truth: detected
    with pytest.raises(DatasetError, match=r"^train\.parquet row 0: field 'answer' is missing"):
        load_dataset(path, answer_key="answer")


def test_unknown_names_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'math5000'.*math500"):
        load_dataset("math5000")
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(MissingSplitError, match="split='test': .*a.jsonl' is one split"):
        load_dataset(write_jsonl(tmp_path / "a.jsonl", [{"problem": "a", "answer": "1"}]), split="test")
    with pytest.raises(ValueError, match="unknown dataset 'a.csv'.*not a .jsonl / .json / .parquet / .arrow file"):
        load_dataset("a.csv")
    with pytest.raises(TypeError, match="unexpected keyword"):
        load_dataset("math500", size=3)
    with pytest.raises(DatasetError, match="holds no rows"):
        load_dataset(write_jsonl(tmp_path / "empty.jsonl", [""]))


def test_last_boxed():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("so it is \\boxed 7$.") == "7"
    assert last_boxed("\\fbox{3}") == "3"
    assert last_boxed("\\boxed{3") is None and last_boxed("none") is None


def test_a_file_is_its_own_train_split(tmp_path):
    """``task.split``'s default ``train`` names the file itself: a user file trains without extra keys; a file
    has no other split."""
    rows = [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in range(3)]
    jsonl = write_jsonl(tmp_path / "mine.jsonl", rows)
    parquet = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, parquet, str(jsonl)):
        ds = load_dataset(path, split="train")
        assert len(ds) == 3 and ds.split == "train" and ds.name == "mine"
        assert [p.id for p in ds] == [p.id for p in load_dataset(path)]
        assert load_dataset(path).split is None
        for split in ("test", "val"):
            with pytest.raises(MissingSplitError, match=f"split='{split}': .* is one split"):
                load_dataset(path, split=split)
    env = MathReasoningEnv(dataset=str(jsonl), split="train")
    assert len(env.dataset) == 3 and env.dataset.path == jsonl
    with pytest.raises(DatasetError, match=r"^bad\.jsonl:2: invalid JSON"):
        load_dataset(write_jsonl(tmp_path / "bad.jsonl", [rows[0], "{oops"]), split="train")


# ------------------------------------------------------------------------------------------------
# bring your own data: JSON, verl rows, Hugging Face datasets (folders, Arrow, Hub names)
# ------------------------------------------------------------------------------------------------

def test_json_array_and_json_lines(tmp_path):
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+3", "answer": 5}]
    array = tmp_path / "arr.json"
    array.write_text(json.dumps(rows, indent=2))
    lines = write_jsonl(tmp_path / "lines.json", rows)
    for path in (array, lines):
        ds = load_dataset(path)
        assert [(p.id, p.text, p.gold) for p in ds] == [(f"{path.stem}/0", "1+1", "2"), (f"{path.stem}/1", "2+3", "5")]
        assert ds.hash == hashlib.sha256(path.read_bytes()).hexdigest()
    # a row of the array is named by the line it starts on
    array.write_text('[\n  {"problem": "1+1", "answer": "2"},\n  {"problem": "2+3"}\n]\n')
    with pytest.raises(DatasetError, match=r"^arr\.json:3: field 'answer' is missing"):
        load_dataset(array)
    array.write_text('[\n  {"problem": "1+1", "answer": "2"},\n  7\n]')
    with pytest.raises(DatasetError, match=r"^arr\.json:3: row 1 of the array: expected a JSON object, got int"):
        load_dataset(array)
    array.write_text('[\n  {"problem": "1+1", "answer": "2"}\n  {"problem": "2+3", "answer": "5"}\n]')
    with pytest.raises(DatasetError, match=r"^arr\.json:3: invalid JSON \(expected ','"):
        load_dataset(array)
    array.write_text('[{"problem": "1+1", "answer": "2"},\n {"problem": "2+3", "answer": }]')
    with pytest.raises(DatasetError, match=r"^arr\.json:2: invalid JSON"):
        load_dataset(array)
    array.write_text("[]")
    with pytest.raises(DatasetError, match="holds no rows"):
        load_dataset(array)


def verl_rows():
    """Rows as verl's data preprocessing writes them (examples/data_preprocess/gsm8k.py)."""
    instruction = "Let's think step by step and output the final answer after \"####\"."
    return [{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "You are helpful."},
                   {"role": "user", "content": f"{a}+{b} {instruction}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": "train", "index": i},
    } for i, (a, b) in enumerate([(12, 7), (30, 4), (5, 5)])]


def test_verl_rows_are_read_without_a_mapping(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows()), path)
    ds = load_dataset(path)
    p = ds[0]
    assert p.text == "12+7 Let's think step by step and output the final answer after \"####\"."  # verbatim
    assert (p.id, p.gold, p.source) == ("train/0", "19", "openai/gsm8k")
    assert p.metadata == {"data_source": "openai/gsm8k", "ability": "math", "extra_info": {"split": "train",
                                                                                          "index": 0}}
    assert [q.gold for q in ds] == ["19", "34", "10"]
    # the last user message of a multi-turn chat; a chat without one names the field
    rows = verl_rows()
    rows[1]["prompt"] = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": "30+4"}]
    rows[2]["prompt"] = [{"role": "system", "content": "only a system message"}]
    bad = write_jsonl(tmp_path / "verl.jsonl", rows)
    with pytest.raises(DatasetError, match=r"^verl\.jsonl:3: field 'prompt' is a list but holds no chat message "
                                           r"with role 'user'"):
        load_dataset(bad)
    rows[2]["prompt"] = [{"role": "user", "content": ["not text"]}]
    with pytest.raises(DatasetError, match=r"^verl\.jsonl:3: field 'prompt\[0\]\.content' must be a string"):
        load_dataset(write_jsonl(bad, rows))
    assert load_dataset(write_jsonl(bad, rows[:2]))[1].text == "30+4"


def test_a_gold_answer_written_as_a_solution_is_its_last_box(tmp_path):
    ds = load_dataset(write_jsonl(tmp_path / "s.jsonl", [
        {"problem": "a", "answer": "First \\boxed{1}, so the answer is $\\boxed{\\frac{3}{4}}$."},
        {"problem": "b", "answer": "\\frac{3}{4}"},
        {"problem": "c", "sol": "It is \\boxed{12}."},
    ]), label_free=True)
    assert [p.gold for p in ds] == ["\\frac{3}{4}", "\\frac{3}{4}", None]
    assert load_dataset(tmp_path / "s.jsonl", answer_key="sol", label_free=True)[2].gold == "12"


def hf_rows(n=6, start=0):
    return {"q": [f"{i}+1" for i in range(start, start + n)], "a": [str(i + 1) for i in range(start, start + n)]}


def test_datasets_folders_and_arrow_files(tmp_path):
    import datasets  # the test writes with the library a user writes with
    one = datasets.Dataset.from_dict(hf_rows())
    one.save_to_disk(str(tmp_path / "one"))
    ds = load_dataset(tmp_path / "one", problem_key="q", answer_key="a")
    assert ds.name == "one" and [(p.id, p.text, p.gold) for p in ds][:2] == [("one/0", "0+1", "1"), ("one/1", "1+1", "2")]
    assert load_dataset(str(tmp_path / "one"), split="train", problem_key="q", answer_key="a").hash == ds.hash
    with pytest.raises(MissingSplitError, match="split='test'"):  # a Dataset is one split, like a file
        load_dataset(tmp_path / "one", split="test", problem_key="q", answer_key="a")
    with pytest.raises(DatasetError, match=r"^one row 0: field 'problem' is missing"):
        load_dataset(tmp_path / "one")
    # a DatasetDict: split picks one; a missing split lists the splits
    dd = datasets.DatasetDict({"train": one, "validation": datasets.Dataset.from_dict(hf_rows(3, 50))})
    dd.save_to_disk(str(tmp_path / "dd"))
    val = load_dataset(tmp_path / "dd", split="validation", problem_key="q", answer_key="a")
    assert [p.text for p in val] == ["50+1", "51+1", "52+1"] and val.split == "validation" and val.name == "dd"
    assert len(load_dataset(tmp_path / "dd", split="train", problem_key="q", answer_key="a")) == 6
    with pytest.raises(MissingSplitError, match=r"^dd: split='test' is not one of its splits \(train, validation\)"):
        load_dataset(tmp_path / "dd", split="test", problem_key="q", answer_key="a")
    with pytest.raises(MissingSplitError, match=r"split=None is not one of its splits \(train, validation\)"):
        load_dataset(tmp_path / "dd", problem_key="q", answer_key="a")
    bad = datasets.Dataset.from_dict({"q": ["1+1", "2+2", ""], "a": ["2", "4", "0"]})
    datasets.DatasetDict({"train": bad}).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DatasetError, match=r"^bad\[train\] row 2: field 'q' is empty"):
        load_dataset(tmp_path / "bad", problem_key="q", answer_key="a")
    # an Arrow file (what save_to_disk writes per shard)
    arrow = next((tmp_path / "one").glob("*.arrow"))
    ds = load_dataset(arrow, problem_key="q", answer_key="a")
    assert len(ds) == 6 and ds.name == arrow.stem and ds.hash == hashlib.sha256(arrow.read_bytes()).hexdigest()
    with pytest.raises(DatasetError, match=rf"^{arrow.name} row 0: field 'answer' is missing"):
        load_dataset(arrow, problem_key="q")
    (tmp_path / "junk.arrow").write_bytes(b"not arrow")
    with pytest.raises(DatasetError, match="junk.arrow: cannot read as an Arrow file"):
        load_dataset(tmp_path / "junk.arrow")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="plain: a folder, but not one written by datasets' save_to_disk"):
        load_dataset(tmp_path / "plain")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:{port}"}])
def test_a_hub_name_offline_fails_fast_in_one_line(monkeypatch, env):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value.format(port=closed_port()))
    t0 = time.perf_counter()
    with pytest.raises(DatasetError) as e:
        load_dataset("graftzoo-test/no-such-data", split="train")
    msg = str(e.value)
    assert time.perf_counter() - t0 < 8 and "\n" not in msg
    assert msg.startswith("dataset 'graftzoo-test/no-such-data': not a local path, and the Hugging Face Hub is offline")
    assert ("HF_HUB_OFFLINE=1" if "HF_HUB_OFFLINE" in env else "cannot connect to 127.0.0.1") in msg


def test_a_hub_dataset_is_read_through_datasets(monkeypatch):
    """The Hub path with ``datasets.load_dataset`` answered locally (no network here): splits and rows."""
    import datasets
    calls = []

    def fake_load(repo, split=None):
        calls.append((repo, split))
        dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(hf_rows(4)),
                                   "test": datasets.Dataset.from_dict(hf_rows(2, 10))})
        if split is None:
            return dd
        if split not in dd:
            raise ValueError(f'Unknown split "{split}". Should be one of {list(dd)}.')
        return dd[split]

    monkeypatch.setattr(gz_datasets, "_hub_offline", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    ds = load_dataset("org/sums", split="test", problem_key="q", answer_key="a")
    assert calls == [("org/sums", "test")] and ds.name == "sums" and ds.split == "test"
    assert [(p.id, p.text, p.gold) for p in ds] == [("sums/0", "10+1", "11"), ("sums/1", "11+1", "12")]
    with pytest.raises(MissingSplitError, match="dataset 'org/sums': split='val' is not one of its splits"):
        load_dataset("org/sums", split="val", problem_key="q", answer_key="a")
    with pytest.raises(MissingSplitError, match=r"org/sums: split=None is not one of its splits \(test, train\)"):
        load_dataset("org/sums", problem_key="q", answer_key="a")
    with pytest.raises(DatasetError, match=r"^org/sums\[train\] row 0: field 'problem' is missing"):
        load_dataset("org/sums", split="train")
