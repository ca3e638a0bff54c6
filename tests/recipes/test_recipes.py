"""Every recipe YAML loads with its config class, names only files that exist or that it says how to
get, and the paper backbones' recipes say how to run them, on what hardware, and that their time is an
estimate (its basis is docs/launching.md's table: no test re-derives prose arithmetic)."""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from fic.cli import launch_check
from fic.core.config import load_config
from fic.core.errors import FicError

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
BUNDLED = "smollm2-135m-instruct"  # the CPU model the project ships; the others are the paper's backbones
BACKBONES = sorted(p.name for p in (REPO / "recipes").iterdir() if p.is_dir() and p.name != BUNDLED)

# recipe file name (without .yaml) -> "module:ConfigClass"; every recipe must match one prefix.
CONFIG_CLASSES = {
    "eval": "fic.evaluation.evaluate:EvalConfig",
    "sft-data": "fic.corpus.build:SFTDataConfig",
    "sft": "fic.train_sft:SFTConfig",
}
# Stages whose modules are being written alongside: mapped once the module exists.
for _stem, _target in {"vasd": "fic.train_vasd:VASDConfig", "probe": "fic.probe.run:ProbeConfig",
                       "demo": "fic.demo.run:DemoConfig"}.items():
    if importlib.util.find_spec(_target.split(":")[0]) is not None:
        CONFIG_CLASSES[_stem] = _target

# The one place outside the repository a recipe may read: the bundled model's recipes use the
# Lost-in-Conversation sample beside this project's checkout (the README says they need it, and the
# tests that read it skip without it). The backbones' recipes must run from a user's clone alone.
LIC_SAMPLE = "../shared/data/lost_in_conversation/"


def config_class(path: Path):
    stem = path.stem
    for prefix in sorted(CONFIG_CLASSES, key=len, reverse=True):
        if stem == prefix or stem.startswith(prefix + "-"):
            module, name = CONFIG_CLASSES[prefix].split(":")
            return getattr(importlib.import_module(module), name)
    raise AssertionError(f"{path}: no config class for this recipe name; add it to CONFIG_CLASSES")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO / "recipes"))


def comments(path: Path) -> str:
    """Every comment of a recipe, one space-separated text (wrapped lines joined)."""
    parts = [line.split("#", 1)[1].strip() for line in path.read_text().splitlines() if "#" in line]
    return " ".join(parts)


def header(path: Path) -> str:
    """The comment block a recipe opens with, wrapped lines joined."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def source_path(spec: str) -> str | None:
    kind, _, arg = spec.partition(":")
    if kind in ("lic", "jsonl") or (kind == "gsm8k" and Path(arg).suffix in (".json", ".jsonl", ".parquet")):
        return arg
    return None


def sources_of(section: dict | None) -> list[str]:
    """The source specs of a `data:` section (one spec or a list)."""
    sources = (section or {}).get("source") or []
    return [sources] if isinstance(sources, str) else list(sources)


def path_values(path: Path) -> list[tuple[str, str]]:
    """(key, path) for every setting of a recipe that names a file or folder it reads."""
    data = yaml.safe_load(path.read_text())
    found = []

    def backend(key: str, section: dict | None, kinds=("hf", "vllm")) -> None:
        if section and section.get("kind", "hf") in kinds and section.get("model"):
            found.append((key, section["model"]))

    for role in ("user", "classifier", "replies"):
        section = data.get(role) or {}
        if section.get("kind") == "llm":
            backend(f"{role}.backend.model", section.get("backend"))
    stem = path.stem
    if stem.startswith("sft-data"):
        found += [("data.source", source_path(spec)) for spec in sources_of(data.get("data")) if source_path(spec)]
    elif stem.startswith("eval"):
        backend("model.model", data.get("model"))
        found += [("data.source", source_path(spec)) for spec in sources_of(data.get("data")) if source_path(spec)]
        if data.get("baseline"):
            found.append(("baseline", data["baseline"]))
    elif stem == "sft":
        for section in ("model", "data"):
            if "path" in (data.get(section) or {}):
                found.append((f"{section}.path", data[section]["path"]))
    elif stem == "vasd":
        if (data.get("model") or {}).get("path"):
            found.append(("model.path", data["model"]["path"]))
        if (data.get("regularizer") or {}).get("anchor_path"):
            found.append(("regularizer.anchor_path", data["regularizer"]["anchor_path"]))
        for spec in (data.get("exclude") or {}).get("sources") or []:
            found.append(("exclude.sources", source_path(spec) or spec))
    elif stem == "demo":  # every other path of a demo is under its own `out`, wired by fic/demo/run.py
        found.append(("base_model", data["base_model"]))
    return found


def sibling_outs(path: Path) -> list[str]:
    """The `out` of every other recipe in the folder: what the earlier stages write."""
    return [yaml.safe_load(p.read_text()).get("out", "") for p in path.parent.glob("*.yaml") if p != path]


def made_by_sibling(path: Path, value: str) -> bool:
    return any(out and (value == out or value.startswith(out.rstrip("/") + "/")) for out in sibling_outs(path))


def test_there_are_recipes():
    assert RECIPES, "no recipe YAML found under recipes/"


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_recipe_loads(path):
    config = load_config(config_class(path), path)
    assert config is not None


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_recipe_with_unknown_key_is_an_error(path, tmp_path):
    data = yaml.safe_load(path.read_text())
    data["surely_not_a_key"] = 1
    bad = tmp_path / path.name
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(FicError, match="surely_not_a_key"):
        load_config(config_class(path), bad)


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_recipe_with_a_wrong_type_is_an_error(path, tmp_path):
    data = yaml.safe_load(path.read_text())
    data["seed" if "seed" in data else "out"] = ["not", "a", "scalar"]
    bad = tmp_path / path.name
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(FicError, match="expected"):
        load_config(config_class(path), bad)


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_files_named_in_comments_exist(path):
    named = re.findall(r"(?<![\w./-])((?:launch|recipes|fic)/[\w./-]*\w)", comments(path))
    missing = [name for name in named if not (REPO / name).exists()]
    assert not missing, f"{rel(path)} names files that do not exist: {missing}"


@pytest.mark.parametrize("path", RECIPES, ids=rel)
def test_files_a_recipe_reads_exist_or_are_made_or_explained(path):
    """A path a recipe reads is written by a sibling recipe (`out`), named in its comments (which say
    where it comes from: a download, `fic prepare-model`), or a file in the repository."""
    text = comments(path)
    for key, value in path_values(path):
        assert not Path(value).is_absolute(), f"{rel(path)}: {key} is an absolute path: {value}"
        if path.parent.name == BUNDLED and value.startswith(LIC_SAMPLE):
            continue
        if key == "base_model" and value == f"models/{BUNDLED}":  # the demo's data stage prepares it on first use
            continue
        assert (REPO / value).resolve().is_relative_to(REPO), \
            f"{rel(path)}: {key}={value} is outside the repository, which a user's clone does not have"
        assert made_by_sibling(path, value) or value in text or (REPO / value).exists(), \
            f"{rel(path)}: {key}={value} does not exist, no recipe beside it writes it, and no comment says where it comes from"


@pytest.mark.parametrize("folder", sorted({p.parent for p in RECIPES}), ids=lambda p: p.name)
def test_stages_of_a_backbone_chain(folder):
    """SFT trains on the corpus sft-data writes, from the weights the base evaluation scores; VASD starts
    from the model SFT saves (merged, for a LoRA SFT), anchors on the same corpus, and keeps the
    folder's evaluation data out of its rollouts."""
    load = lambda name: yaml.safe_load((folder / name).read_text())  # noqa: E731
    if {"sft.yaml", "sft-data.yaml"} <= {p.name for p in folder.iterdir()}:
        assert load("sft.yaml")["data"]["path"] == load("sft-data.yaml")["out"]
    if (folder / "sft.yaml").exists():
        for evaluation in folder.glob("eval*.yaml"):
            assert yaml.safe_load(evaluation.read_text())["model"]["model"] == load("sft.yaml")["model"]["path"], \
                f"{evaluation.name} does not evaluate the weights sft.yaml starts from"
    if (folder / "vasd.yaml").exists():
        vasd, sft = load("vasd.yaml"), load("sft.yaml")
        lora_sft = (sft.get("lora") or {}).get("enabled", False)
        # vLLM and VASD read whole model folders; a LoRA SFT's `final` is an adapter.
        assert not lora_sft or sft.get("save_merged"), "a LoRA SFT must save_merged for VASD to start from"
        wanted = f"{sft['out'].rstrip('/')}/{'final-merged' if lora_sft else 'final'}"
        assert vasd["model"]["path"] == wanted, f"vasd.yaml does not start from what sft.yaml saves ({wanted})"
        assert vasd["regularizer"]["anchor_path"] == load("sft-data.yaml")["out"], \
            "vasd.yaml's anchor is not the SFT corpus sft-data.yaml writes"
        excluded = (vasd.get("exclude") or {}).get("sources") or []
        assert f"recipes/{folder.name}/eval.yaml" in excluded, "vasd.yaml does not keep eval.yaml's data out"


DEMOS = [p for p in RECIPES if p.stem == "demo"]


def saved_model(demo: dict, stage: str) -> str:
    """The folder a demo stage's model is loaded from by what comes after it: a LoRA stage's `final`
    is an adapter, which VASD and vLLM refuse; its merged model is `final-merged`."""
    lora = (demo[stage].get("lora") or {}).get("enabled", False)
    assert not lora or demo[stage].get("save_merged"), f"{stage}: a LoRA stage must save_merged"
    return f"{{out}}/{stage}/{'final-merged' if lora else 'final'}"


@pytest.mark.parametrize("path", DEMOS, ids=rel)
def test_demo_stages_chain(path):
    """Each stage of a demo starts from the model the one before it saves, and the evaluation of the
    starting point loads the warm-up's."""
    demo = yaml.safe_load(path.read_text())
    assert demo["warmup"]["model"]["path"] == "{base_model}"
    assert demo["sft"]["model"]["path"] == saved_model(demo, "warmup")
    assert demo["vasd"]["model"]["path"] == saved_model(demo, "sft")
    assert demo["eval"]["model"]["model"] == saved_model(demo, "warmup")
    saved_model(demo, "vasd")  # eval-vasd loads it


@pytest.mark.parametrize("path", DEMOS, ids=rel)
def test_demo_wires_the_models_its_yaml_shows(path):
    """fic/demo/run.py overrides every stage's model path; it must load what the YAML shows (for a LoRA
    stage the merged model, not the adapter in `final`)."""
    from fic.demo.run import load_demo, model_of

    cfg = load_demo(str(path.parent), [])
    assert str(model_of(cfg, "warmup")) == cfg.sft.model.path == cfg.eval.model.model
    assert str(model_of(cfg, "sft")) == cfg.vasd.model.path
    vasd = "final-merged" if cfg.vasd.lora.enabled else "final"
    assert str(model_of(cfg, "vasd")) == f"{cfg.out}/vasd/{vasd}"


def test_the_paper_backbones_have_recipes():
    assert BACKBONES == ["llama-3.1-8b-instruct", "llama-3.2-3b-instruct", "olmo-2-1124-7b-instruct", "phi-4",
                         "qwen2.5-7b-instruct"]
    for name in BACKBONES:
        assert {"sft-data", "sft", "vasd", "eval"} <= {p.stem for p in (REPO / "recipes" / name).glob("*.yaml")}, name


BACKBONE_RECIPES = [p for p in RECIPES if p.parent.name in BACKBONES]


@pytest.mark.parametrize("path", BACKBONE_RECIPES, ids=rel)
def test_backbone_recipe_header_says_how_where_and_how_long(path):
    """The opening comment runs this very file, names the hardware, fetches the model it uses from the
    hub into the folder it reads, and gives an estimated time."""
    text = header(path)
    command = f"fic demo --recipes recipes/{path.parent.name}" if path.stem == "demo" else f"recipes/{rel(path)}"
    assert command in text, "the header's command does not run this recipe"
    assert re.search(r"Sized for: \d+ x A100 80GB", text), "no hardware line"
    assert "Estimated time:" in text, "the header does not say roughly how long"
    models = [value for key, value in path_values(path) if key.endswith(("model", "model.path"))]
    assert models
    for model in models:
        if made_by_sibling(path, model):  # an earlier stage's output (VASD starts from SFT's model)
            assert model in text, f"the header does not say which stage writes {model}"
            continue
        assert re.search(rf"hf download [\w.-]+/[\w.-]+ --local-dir {re.escape(model)}(?!\S)", text), \
            f"the header does not say how to get {model} from the hub"


@pytest.mark.parametrize("path", [p for p in RECIPES if p.stem in ("sft", "vasd")], ids=rel)
def test_launch_files_named_by_a_training_recipe_accept_it(path):
    named = sorted(set(re.findall(r"launch/[\w-]+\.yaml", comments(path))))
    assert named, f"{rel(path)} names no launch config"
    for config in named:
        launch_check.check(REPO / config, path)


@pytest.mark.parametrize("path", [p for p in RECIPES if p.stem == "vasd"], ids=rel)
def test_vasd_teacher_is_no_second_copy_under_zero3(path):
    """The trainer refuses a frozen or EMA teacher copy under ZeRO-3 only once the model is loaded on
    every GPU; a recipe must not name that launch for that teacher in the first place."""
    recipe = yaml.safe_load(path.read_text())
    copy = recipe["teacher"]["mode"] == "ema" or (recipe["teacher"]["mode"] == "frozen"
                                                  and not recipe["lora"]["enabled"])
    for config in sorted(set(re.findall(r"launch/[\w-]+\.yaml", comments(path)))):
        launch = yaml.safe_load((REPO / config).read_text())
        assert not (copy and (launch.get("deepspeed_config") or {}).get("zero_stage") == 3), \
            f"{rel(path)}: a teacher copy under {config} (ZeRO-3)"
