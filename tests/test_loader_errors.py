"""Issue #10, item 4 and the loader's error list: every hub call goes through one retry policy,
and every failure a user can fix is a one-line UserError naming the file, tensor or step."""

import json

import pytest

from pythia_probe import arch, errors
from pythia_probe.errors import (
    CheckpointError,
    CheckpointNotCachedError,
    ChecksumError,
    CorruptCheckpointError,
    CorruptFileError,
    HubDownloadError,
    HubError,
    HubNotFoundError,
    MismatchError,
    MissingFileError,
    MissingTensorError,
    ResourceError,
    UnsafeFileError,
    UserError,
)
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.sweep import source as sources
from pythia_probe.testing.hub import Fault
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config

REPO = "EleutherAI/pythia-tiny"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, steps=(0, 2, 64), with_main=False,
                           layouts={64: ("safetensors", 1)})
    return root


def source(hub, tmp_path, model=REPO) -> CheckpointSource:
    return CheckpointSource(model, cache_dir=tmp_path / "cache", endpoint=hub.endpoint,
                            retry=FAST)


def one_line_user_error(err: BaseException) -> None:
    assert isinstance(err, UserError), type(err).__mro__
    assert "\n" not in str(err) and str(err)


# ---- item 4: one retry policy for every hub call -------------------------------------------------
@pytest.mark.parametrize("fault", [
    Fault("500", on="api", match="*/refs", times=2),  # the first call of a sweep
    Fault("500", on="api", match="*/tree/*", times=2),
    Fault("429", on="head", match="config.json", times=2),
    Fault("500", match="config.json", times=2),
    Fault("500", on="head", match="pytorch_model.bin", times=2),
    Fault("drop", match="pytorch_model.bin", after_bytes=5000, times=2),
], ids=["refs", "tree", "head-config", "get-config", "head-weights", "get-weights"])
def test_two_transient_failures_of_any_hub_call_are_retried(hub, tmp_path, fault):
    hub.add_fault(fault)
    src = source(hub, tmp_path)
    assert src.steps() == [0, 2, 64]
    rev = src.resolve([2])[0]
    assert sources.model_config(src, rev).d_model == 32
    [(_, tensors, _)] = list(src.stream([rev]))
    assert "gpt_neox.embed_in.weight" in tensors
    assert fault.times == 0  # both failures happened and were retried


def test_a_hub_that_keeps_failing_is_one_line_naming_the_call(hub, tmp_path):
    hub.add_fault(Fault("500", on="api", match="*/refs", times=-1))
    with pytest.raises(HubDownloadError, match=rf"listing the branches of {REPO} failed: "
                                                      r"the hub kept failing after 3 attempts"
                       ) as err:
        source(hub, tmp_path).steps()
    one_line_user_error(err.value)
    assert isinstance(err.value, HubError) and len(hub.requests("GET", "/refs")) == 3


def test_unknown_model_on_the_hub_is_a_missing_file_error(hub, tmp_path):
    with pytest.raises(HubNotFoundError, match="EleutherAI/nothing.*not found on the hub"
                       ) as err:
        source(hub, tmp_path, "EleutherAI/nothing").steps()
    one_line_user_error(err.value)
    assert isinstance(err.value, MissingFileError)
    assert len(hub.requests("GET", "/refs")) == 1  # not retried: it will not appear


@pytest.mark.parametrize("model", ["./runs/no_such_dir", "runs/demo/", "/no/such/folder",
                                   "~/nowhere/pythia"])
def test_a_mistyped_local_path_is_not_a_hub_error(hub, tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)  # relative paths must not exist (a demo run makes runs/demo)
    with pytest.raises(CheckpointNotCachedError, match="no such folder, and not a hub id") as e:
        source(hub, tmp_path, model)
    one_line_user_error(e.value)
    assert not isinstance(e.value, ConnectionError) and not hub.log


# ---- errors that name the file, tensor or step ---------------------------------------------------
@pytest.fixture
def local(tmp_path):
    build_pythia_like_repo(tmp_path / "m", "org/tiny", steps=(0, 4), with_main=False,
                           layouts={0: ("bin", 1), 4: ("safetensors", 1)})
    return tmp_path / "m" / "org" / "tiny"


@pytest.mark.parametrize("step,name,damage", [
    (0, "pytorch_model.bin", "truncate"), (0, "pytorch_model.bin", "garbage"),
    (4, "model.safetensors", "truncate"), (4, "model.safetensors", "garbage"),
])
def test_a_damaged_weight_file_is_named(local, step, name, damage):
    path = local / f"step{step}" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\0garbage" * 100)
    src = CheckpointSource(local)
    with pytest.raises(CorruptCheckpointError, match=rf"{name} of .*/tiny@step{step} .*is "
                                                     r"truncated or not a") as err:
        list(src.stream(src.resolve([step])))
    one_line_user_error(err.value)
    assert isinstance(err.value, CorruptFileError)


def test_an_unparseable_local_config_is_named(local):
    (local / "step0" / "config.json").write_bytes(b'{"hidden_size": 32,')
    src = CheckpointSource(local)
    with pytest.raises(CorruptCheckpointError, match=r"config\.json of .*tiny@step0 .* is not "
                                                     "valid JSON") as err:
        sources.model_config(src, src.resolve([0])[0])
    one_line_user_error(err.value)
    with pytest.raises(CorruptCheckpointError, match="config.json"):
        list(src.stream(src.resolve([0])))


def test_a_config_of_another_architecture_names_the_file(local):
    cfg = json.loads((local / "step0" / "config.json").read_text())
    (local / "step0" / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    src = CheckpointSource(local)
    with pytest.raises(arch.UnsupportedConfigError, match=r"step0/config\.json: GPT-NeoX config "
                                                          "refused: model_type='llama'") as err:
        sources.model_config(src, src.resolve([0])[0])
    one_line_user_error(err.value)


@pytest.mark.parametrize("change,tensor", [
    ({"num_attention_heads": 8, "hidden_size": 64}, "gpt_neox.embed_in.weight is [96, 32]"),
    ({"vocab_size": 50}, "gpt_neox.embed_in.weight is [96, 32], expected [50, 32]"),
    ({"intermediate_size": 32}, "mlp.dense_h_to_4h.weight is [64, 32], expected [32, 32]"),
])
def test_weights_that_do_not_fit_the_config_name_the_tensor(change, tensor):
    """The bug: `shape '[4, 3, 8, 32]' is invalid` / `index 50 is out of bounds`, no name."""
    sd = random_state_dict(tiny_config(), seed=0)
    c = arch.NeoXConfig.from_hf(tiny_config(**change))
    with pytest.raises(arch.WeightShapeError, match=tensor.replace("[", r"\[").replace(
            "]", r"\]")) as err:
        arch.NeoXWeights(sd, c)
    one_line_user_error(err.value)
    assert isinstance(err.value, MismatchError)


def test_missing_tensors_and_disk_budget_are_user_errors(local):
    src = CheckpointSource(local)
    with pytest.raises(KeyError, match=r"org/tiny@step0 has no tensors \['nope'\]") as err:
        list(src.stream(src.resolve([0]), names=["nope"]))
    assert isinstance(err.value, MissingTensorError) and not str(err.value).startswith("'")
    one_line_user_error(err.value)


def test_one_error_family_inside_the_user_error_hierarchy():
    """Every hub and checkpoint error lives in pythia_probe.errors, one class per kind."""
    from pythia_probe.hub import cache, checkpoints, io, steps, weights

    assert issubclass(CheckpointError, UserError) and not issubclass(CheckpointError,
                                                                     RuntimeError)
    checkpoint_kinds = {errors.CheckpointNotCachedError: MissingFileError,
                        errors.UnsafeCheckpointError: UnsafeFileError,
                        errors.CheckpointDiskError: ResourceError,
                        errors.CorruptCheckpointError: CorruptFileError,
                        errors.MissingTensorError: MismatchError}
    for cls, kind in checkpoint_kinds.items():
        assert issubclass(cls, CheckpointError) and issubclass(cls, kind), cls
    hub_kinds = {errors.ChecksumError: CorruptFileError, errors.HubDownloadError: HubError,
                 errors.HubUnreachableError: HubDownloadError,
                 errors.HubNotFoundError: MissingFileError,
                 errors.IncompleteDownloadError: HubError, errors.StepError: ValueError}
    for cls, kind in hub_kinds.items():
        assert issubclass(cls, kind) and issubclass(cls, UserError), cls
    for module in (checkpoints, cache, io, steps, weights):
        own = [n for n, v in vars(module).items() if isinstance(v, type)
               and issubclass(v, UserError) and v.__module__ == module.__name__]
        assert not own, f"{module.__name__} defines {own}: they belong in pythia_probe.errors"


def test_a_wrong_size_from_the_hub_is_one_error_naming_the_file(hub, tmp_path):
    hub.tamper("size", 10, "config.json")
    src = source(hub, tmp_path)
    with pytest.raises(ChecksumError, match=r"config\.json of .*step2: .*the 10 bytes the hub lists"
                       ) as err:
        sources.model_config(src, src.resolve([2])[0])
    one_line_user_error(err.value)
    assert not list(src.storage.glob("blobs/*"))
