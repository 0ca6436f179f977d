"""graftzoo.envs.datasets: bundled data, user files (JSONL / Parquet), errors, gold self-verification."""
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graftzoo.envs import MathDataset, MathReasoningEnv, load_dataset, verify_batch
from graftzoo.envs.datasets import BENCHMARKS, BUNDLED, DATA_DIR, DatasetError, last_boxed
from graftzoo.core.types import Prompt


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
    with pytest.raises(DatasetError, match=r"^train\.parquet:1: field 'answer' is missing"):
        load_dataset(path)


def test_unknown_names_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'math5000'.*math500"):
        load_dataset("math5000")
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="applies to bundled names only"):
        load_dataset(write_jsonl(tmp_path / "a.jsonl", [{"problem": "a", "answer": "1"}]), split="test")
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
    has no other split (issue 11)."""
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
            with pytest.raises(ValueError, match=f"split='{split}' applies to bundled names only"):
                load_dataset(path, split=split)
    env = MathReasoningEnv(dataset=str(jsonl), split="train")
    assert len(env.dataset) == 3 and env.dataset.path == jsonl
    with pytest.raises(DatasetError, match=r"^bad\.jsonl:2: invalid JSON"):
        load_dataset(write_jsonl(tmp_path / "bad.jsonl", [rows[0], "{oops"]), split="train")
