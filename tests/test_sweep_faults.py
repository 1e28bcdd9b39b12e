"""The sweep's side of the fault audit (issue 16): damaged caches, values out of range, two runs
in one folder, the disk limit, checks before the network, offline plans, malformed manifests,
signals, statistics the model cannot index, layers the model lacks, progress and launchers."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pythia_probe as pp
from pythia_probe.cli import run_main
from pythia_probe.errors import (
    FolderLockedError,
    MismatchError,
    OutOfRangeError,
    ResourceError,
    ResultsError,
)
from pythia_probe.fileio import FolderLock
from pythia_probe.plots.run import main as plots_main
from pythia_probe.results import read_manifest, read_results, read_shard, write_shard
from pythia_probe.stats import batch_stats
from pythia_probe.summary import summary_table
from pythia_probe.sweep import claims, tasks
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

STEPS = (0, 1, 2)
V = 90
KEY = ["step", "analysis", "layer", "head", "metric"]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    torch.manual_seed(0)
    layouts = {s: ("safetensors", 1) for s in STEPS}
    repo = build_pythia_like_repo(root / "hub", "org/tiny", STEPS, tiny_config(), layouts,
                                  with_main=False)
    tokens = torch.randint(0, V, (40, 17), generator=torch.Generator().manual_seed(1))
    stats = batch_stats(tokens, V).save(root / "stats.safetensors")
    return root, repo, stats


def _argv(repo, stats, out, *extra):
    return ["--model", str(repo), "--stats", str(stats), "--out", str(out), "--steps", "all",
            "--analyses", "embedding,attention", "--dtype", "float64", "--no-progress",
            "--no-plots", *extra]


def _sorted(df):
    return df.drop(columns=["run_id"]).sort_values(KEY, na_position="first").reset_index(drop=True)


@pytest.fixture(scope="module")
def clean(setup):
    root, repo, stats = setup
    out = root / "clean"
    assert sweep_main(_argv(repo, stats, out)) == 0
    return read_results(out)


def _one_line(argv, capsys, monkeypatch, prog="sweep") -> str:
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    assert run_main(lambda: sweep_main(argv), prog) == 2
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, errors
    return errors[0]


# ---- the target norms' cache and the range check -------------------------------------------
def test_a_target_cache_with_flipped_bytes_is_rebuilt_not_used(setup, clean, tmp_path):
    """Same size, same header, other bytes: caught by the content digest, rebuilt; the table
    equals the clean run's."""
    from pythia_probe.stats import read_meta
    from pythia_probe.sweep.held import targets_cache

    root, repo, stats = setup
    files = list(targets_cache(read_meta(stats)["stats_id"]).glob("*.safetensors"))
    assert {f.name for f in files} >= {f"{n}-factored.safetensors" for n in  # the clean run's
                                       ("PhiBT", "Qbar", "QbarT", "QbarHeadT")}
    for f in files:
        data = bytearray(f.read_bytes())
        data[-64:-56] = b"\x7f" * 8  # a float64 of 1e308 in the row means
        f.write_bytes(bytes(data))
    assert sweep_main(_argv(repo, stats, tmp_path / "o")) == 0
    got, want = _sorted(read_results(tmp_path / "o")), _sorted(clean)
    pd.testing.assert_frame_equal(got, want)


def test_a_value_out_of_range_fails_its_step_naming_the_cell(setup, tmp_path, monkeypatch):
    from pythia_probe.analysis.factored import FactoredTarget

    root, repo, stats = setup
    real = FactoredTarget.grams
    monkeypatch.setattr(FactoredTarget, "grams", lambda self, F, edges, chunk: [
        g * 1e6 for g in real(self, F, edges, chunk)])  # what damaged target bytes give
    out = tmp_path / "o"
    assert sweep_main(_argv(repo, stats, out, "--retries", "0")) == 1
    assert not (out / "shards").exists() or not list((out / "shards").iterdir())
    rec = json.loads((out / "failed" / "step0.json").read_text())
    assert "analysis embedding, layer 1, metric cos_pre: value" in rec["error"]
    assert "outside [-1, 1]" in rec["error"]


def test_check_range_allows_rounding_and_refuses_nan():
    from pythia_probe.analysis import REGISTRY
    from pythia_probe.sweep.scoring import check_range

    a = REGISTRY["embedding"]
    check_range([{"analysis": "embedding", "value": 1 + 1e-9}], a, 1e-8)
    for bad in (1 + 1e-7, -1.5, float("nan"), 2.5e54):
        with pytest.raises(OutOfRangeError):
            check_range([{"analysis": "embedding", "layer": 3, "value": bad}], a, 1e-8)


# ---- one run per output folder ------------------------------------------------------------
def test_a_second_sweep_into_a_held_folder_is_refused_naming_the_holder(setup, tmp_path,
                                                                       capsys, monkeypatch):
    root, repo, stats = setup
    out = tmp_path / "o"
    with FolderLock(out, {"what": "sweep --analyses embedding", "since": "earlier"}):
        line = _one_line(_argv(repo, stats, out, "--analyses", "attention"), capsys,
                         monkeypatch)
    assert str(out) in line and f"pid {os.getpid()}" in line and "--analyses embedding" in line
    assert not (out / "shards").exists()  # nothing of the refused run was written
    assert sweep_main(_argv(repo, stats, out, "--steps", "0")) == 0  # free again
    assert not (out / ".lock").exists()  # a finished run leaves no lock file behind


def test_folder_lock_is_exclusive_and_never_follows_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    out = tmp_path / "o"
    out.mkdir()
    (out / ".lock").symlink_to(target)
    with pytest.raises(OSError):
        FolderLock(out, {}).acquire()
    assert target.read_text() == "keep"
    (out / ".lock").unlink()
    with FolderLock(out, {"what": "first"}):
        with pytest.raises(FolderLockedError, match="first"):
            FolderLock(out, {"what": "second"}).acquire()
    with FolderLock(out, {"what": "second"}):  # released: the next one gets it
        assert "second" in (out / ".lock").read_text()


def test_the_lock_of_a_killed_run_is_taken_over(setup, tmp_path):
    root, repo, stats = setup
    out = tmp_path / "o"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pythia_probe.fileio import FolderLock\n"
         f"FolderLock({str(out)!r}, {{'what': 'a sweep'}}).acquire()\nprint('held', flush=True)"
         "\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(FolderLockedError, match="in use by another run"):
        FolderLock(out, {}).acquire().release()
    holder.kill()
    holder.wait()
    assert "a sweep" in (out / ".lock").read_text()  # its record is still there, stale
    assert sweep_main(_argv(repo, stats, out, "--steps", "0")) == 0


# ---- disk limit ---------------------------------------------------------------------------
def test_the_loader_gets_a_disk_limit_shown_in_the_plan(setup, tmp_path, monkeypatch, capsys):
    from pythia_probe.hub.checkpoints import CheckpointSource
    from pythia_probe.testing.hub import HubServer

    root, repo, stats = setup
    seen = []
    real = CheckpointSource.stream

    def spy(self, revisions, **kw):
        seen.append(kw.get("max_disk"))
        return real(self, revisions, **kw)

    monkeypatch.setattr(CheckpointSource, "stream", spy)
    with HubServer(root / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        argv = _argv("org/tiny", stats, tmp_path / "o", "--cache-dir", str(tmp_path / "c"))
        assert sweep_main(argv) == 0
        plan = capsys.readouterr().out
        assert "the loader's limit" in plan and "of the" in plan and "free on the disk" in plan
        assert seen and all(m is not None and m > 0 for m in seen)
        seen.clear()
        assert sweep_main([*argv[:-2], "--cache-dir", str(tmp_path / "c2"), "--out",
                           str(tmp_path / "o2"), "--max-disk-gb", "0.5"]) == 0
        assert seen == [0.5e9] and "--max-disk-gb 0.5" in capsys.readouterr().out
        with pytest.raises(ResourceError, match="more than the downloads may hold"):
            sweep_main([*argv[:-2], "--cache-dir", str(tmp_path / "c3"), "--out",
                        str(tmp_path / "o3"), "--max-disk-gb", "1e-9"])
        assert not (tmp_path / "o3").exists()


# ---- before the network; offline ------------------------------------------------------------
@pytest.fixture
def no_network(monkeypatch):
    import socket

    def refuse(*a, **k):
        raise AssertionError("a network call was made")
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("argv,says", [
    (["--model", "EleutherAI/pythia-1.4bb"], "Pythia has no size '1.4bb'"),
    (["--model", "EleutherAI/pythia-14b"], "nearest: EleutherAI/pythia-1.4b"),
    (["--steps", "1000-"], "cannot parse steps item '1000-'"),
    (["--steps", "1000-143000:0"], "stride must be positive"),
    (["--steps", "5-1"], "empty range"),
    (["--steps", "1234"], "step 1234 is not available for this model; nearest valid steps: 1000"),
    (["--heads", "0"], "numbered from 1"),
])
def test_bad_model_names_and_steps_are_refused_before_any_network_call(argv, says, no_network,
                                                                      capsys, monkeypatch):
    assert says in _one_line([*argv, "--dry-run"], capsys, monkeypatch)


def test_missing_local_files_are_refused_before_any_network_call(tmp_path, no_network, capsys,
                                                                 monkeypatch):
    line = _one_line(["--stats", str(tmp_path / "owt.safetensors"), "--dry-run"], capsys,
                     monkeypatch)
    assert "owt.safetensors: no such statistics file" in line
    line = _one_line(["--analyses", "attention_text", "--text", str(tmp_path / "t.st")], capsys,
                     monkeypatch)
    assert "--text" in line and "no such file" in line


def test_offline_without_the_model_in_the_cache_says_what_to_do(tmp_path, capsys,
                                                                monkeypatch, no_network):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cache"))
    line = _one_line(["--steps", "1000-143000", "--dry-run"], capsys, monkeypatch)
    for hint in ("HF_HUB_OFFLINE is set", "--cache-dir", "hf download EleutherAI/pythia-1.4b",
                 "is not in the cache"):
        assert hint in line
    capsys.readouterr()
    assert run_main(lambda: sweep_main(["--steps", "1000-143000", "--dry-run"]), "sweep") == 2
    assert "143 steps of the Pythia schedule" in capsys.readouterr().out


def test_offline_with_the_model_in_the_cache_prints_the_whole_plan(setup, tmp_path, capsys,
                                                                 monkeypatch):
    """HF_HUB_OFFLINE=1 and a cache that holds the checkpoints: the dry run plans from it and
    asks nothing of the network; then the run itself scores from the cache."""
    import socket

    from huggingface_hub import constants

    from pythia_probe.arch import name_filter
    from pythia_probe.hub.checkpoints import CheckpointSource
    from pythia_probe.testing.hub import HubServer

    root, repo, stats = setup
    cache = tmp_path / "cache"
    with HubServer(root / "hub") as server:  # fill the cache where the hub is reachable
        src = CheckpointSource("org/tiny", cache_dir=cache, endpoint=server.endpoint)
        list(src.stream(src.resolve(STEPS), names=name_filter("embed", "attn", "mlp", "ln"),
                        keep=True))
        src.close()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    real_connect = socket.create_connection
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: pytest.fail("a network call was made"))
    argv = _argv("org/tiny", stats, tmp_path / "o", "--cache-dir", str(cache))
    assert sweep_main([*argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "model org/tiny: 3 steps" in plan and "download 0 B still" in plan
    assert sweep_main(argv) == 0 and sorted(read_results(tmp_path / "o")["step"].unique()) == \
        list(STEPS)
    # the hub unreachable, HF_HUB_OFFLINE unset: the dry run says the cache holds the steps
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    monkeypatch.setattr(socket, "create_connection", real_connect)
    assert run_main(lambda: sweep_main([*argv, "--dry-run"]), "sweep") == 2
    out, err = capsys.readouterr()
    assert f"the cache {cache}" in out and "holds 3 of them ([0, 1, 2])" in out
    assert "HF_HUB_OFFLINE=1 plans and scores from it" in out and "cannot be reached" in err


def test_an_unreachable_hub_is_one_line_with_the_offline_advice(tmp_path, capsys, monkeypatch):
    from pythia_probe.hub import io as hubio
    from pythia_probe.testing.dist import free_port

    port = free_port()  # nobody listens on it: connection refused at once
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(hubio, "DEFAULT_RETRY", hubio.RetryPolicy(attempts=1))
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cache"))
    line = _one_line(["--model", "org/some-model", "--steps", "0", "--dry-run"], capsys,
                     monkeypatch)
    assert "cannot list the checkpoints of org/some-model" in line and "HF_HUB_OFFLINE=1" in line
    assert "hf download org/some-model --revision step1000 --cache-dir DIR" in line


# ---- resume, signals ------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["[1, 2]", '{"config": []}', '"running"'])
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_it(setup, tmp_path, capsys,
                                                             monkeypatch, text):
    root, repo, stats = setup
    out = tmp_path / "o"
    out.mkdir()
    (out / "manifest.json").write_text(text)
    line = _one_line(_argv(repo, stats, out), capsys, monkeypatch)
    assert str(out / "manifest.json") in line and "not a run manifest" in line


def test_sigterm_records_interrupted_and_the_rerun_resumes_bit_identically(setup, clean,
                                                                          tmp_path):
    """A real SIGTERM to a sweep in another process, after its first shard: one line, exit
    143, manifest "interrupted"; the rerun finishes with the clean run's numbers."""
    root, repo, stats = setup
    out = tmp_path / "o"
    script = tmp_path / "slow_sweep.py"
    script.write_text(
        "import sys, time\nfrom pythia_probe.sweep import execute\nreal = execute.run_step\n"
        "def slow(*a):\n    path = real(*a)\n    print('shard', flush=True)\n    time.sleep(60)\n"
        "    return path\nexecute.run_step = slow\nfrom pythia_probe.cli import run_main\n"
        "from pythia_probe.sweep.__main__ import main\n"
        "raise SystemExit(run_main(lambda: main(sys.argv[1:]), 'sweep'))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), *_argv(repo, stats, out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line == "shard\n":
            break
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "sweep: interrupted, rerun to resume"
    assert "Traceback" not in err
    m = read_manifest(out)
    assert m["status"] == "interrupted" and "rerun to resume" in m["reason"]
    assert [p.name for p in (out / "shards").iterdir()] == ["step0.parquet"]
    assert sweep_main(_argv(repo, stats, out)) == 0
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean))
    assert read_manifest(out)["status"] == "complete"


# ---- statistics and layers the model cannot take -------------------------------------------
def test_statistics_with_ids_beyond_the_embedding_rows_are_refused_once_up_front(
        setup, tmp_path, monkeypatch):
    from pythia_probe.hub.checkpoints import CheckpointSource

    root, repo, _ = setup
    wide = batch_stats(torch.randint(0, 200, (20, 9)), 200).save(tmp_path / "wide.safetensors")
    monkeypatch.setattr(CheckpointSource, "stream", lambda *a, **k: pytest.fail("streamed"))
    with pytest.raises(MismatchError, match="index token 199 but .* has only 96 embedding rows"):
        sweep_main(_argv(repo, wide, tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_heads_beyond_the_models_layers_are_refused_naming_the_valid_ones(
        setup, tmp_path, capsys, monkeypatch):
    root, repo, stats = setup
    line = _one_line(_argv(repo, stats, tmp_path / "o", "--heads", "2,99"), capsys, monkeypatch)
    assert "the model has layers 1..2" in line and "[99]" in line
    assert sweep_main(_argv(repo, stats, tmp_path / "o", "--steps", "0", "--heads", "2")) == 0
    df = read_results(tmp_path / "o")
    assert set(df.loc[df["head"].notna(), "layer"]) == {2}


# ---- progress, launchers, defaults ---------------------------------------------------------
def test_no_progress_means_no_bar_on_any_rank(setup, tmp_path, capfd):
    root, repo, stats = setup
    assert sweep_main(_argv(repo, stats, tmp_path / "o", "--steps", "0,1")) == 0
    err = capfd.readouterr().err
    assert "sweep rank" not in err and "step/s" not in err and "it/s" not in err


def test_accelerate_launch_that_starts_one_process_says_so(monkeypatch, caplog):
    from pythia_probe import ranks

    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    with caplog.at_level("WARNING"):
        r = ranks.from_env("cpu")
    assert r.world == 1 and "started ONE process" in caplog.text and "--multi_gpu" in caplog.text
    monkeypatch.delenv("MASTER_ADDR")
    caplog.clear()
    ranks.from_env("cpu")
    assert caplog.text == ""


def test_default_results_folder_is_git_ignored_and_apart_from_committed_results():
    from pythia_probe.sweep import SweepConfig

    cfg = SweepConfig(device="cpu")
    assert cfg.out == str(Path("runs") / "pythia-1.4b")
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "check-ignore", "-q", f"{cfg.out}/manifest.json"], cwd=root)
    assert probe.returncode == 0


# ---- one run per folder (issue 28.1, 28.5, 28.7) -------------------------------------------
def _kwargs(argv):
    """run_sweep keywords for a command line of _argv's (--x v, --no-x)."""
    out, it = {}, iter(argv)
    for token in it:
        name = token[2:].replace("-", "_")
        if name.startswith("no_"):
            out[name[3:]] = False
        else:
            out[name] = next(it)
    return out


def _copy_of_clean(setup, tmp_path):
    out = tmp_path / "o"
    shutil.copytree(setup[0] / "clean", out)
    return out


def test_shards_of_another_run_or_a_copy_below_out_are_refused_naming_the_files(
        setup, clean, tmp_path, capsys, monkeypatch):
    """A float32 run's step2.parquet beside the shards, or a copy of shards/ below OUT:
    read_results, summary_table and the plots refuse in one line naming the files."""
    out = _copy_of_clean(setup, tmp_path)
    other = read_shard(out / "shards" / "step2.parquet").assign(dtype="float32", run_id="r2")
    write_shard(other, out / "step2.parquet", {"run_id": "r2", "run_key": "f32"})
    with pytest.raises(MismatchError, match=r"shards of 2 runs .*run f32 \(step2.parquet\)"):
        read_results(out)
    before = (out / "manifest.json").read_bytes()
    line = _one_line(_argv(setup[1], setup[2], out), capsys, monkeypatch)  # refused up front
    assert f"{out} holds tables that are not this run's shards (step2.parquet)" in line
    assert (out / "manifest.json").read_bytes() == before
    (out / "step2.parquet").unlink()
    shutil.copytree(out / "shards", out / "backup" / "shards")
    with pytest.raises(MismatchError, match=r"appear more than once, in files backup/shards/"
                       r"step0.parquet, backup/shards/step1.parquet, backup/shards/step2"):
        read_results(out)
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    assert run_main(lambda: plots_main(["--results", str(out)]), "plots") == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("plots: error: ") and "backup/shards/step0.parquet" in line
    twice = pd.concat([clean, clean.assign(run_id="r2", dtype="float32")])
    with pytest.raises(MismatchError, match=f"{len(clean)} cells appear more than once"):
        summary_table(twice)
    shutil.rmtree(out / "backup")
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean))
    (out / "shards" / "step1.parquet").unlink()
    (out / "shards" / "step1.parquet").mkdir()  # a folder where a shard goes
    line = _one_line(_argv(setup[1], setup[2], out), capsys, monkeypatch)
    assert "not this run's shards (shards/step1.parquet)" in line


@pytest.mark.parametrize("garbage", ["bytes", "rows"])
def test_a_shard_replaced_by_garbage_is_rescored_exactly(setup, clean, tmp_path, garbage):
    """Random bytes, or a valid table whose numbers were edited: the rerun rescores that step
    alone and the table equals the clean run's; read_results names the damaged file."""
    root, repo, stats = setup
    out = _copy_of_clean(setup, tmp_path)
    shard = out / "shards" / "step1.parquet"
    if garbage == "bytes":
        shard.write_bytes(os.urandom(3000))
    else:
        table = pq.read_table(shard)
        edited = table.to_pandas().assign(value=0.5)
        pq.write_table(pa.Table.from_pandas(edited, schema=table.schema, preserve_index=False),
                       shard)
        with pytest.raises(ResultsError, match=f"{shard} was edited or damaged"):
            read_results(out)
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    assert sweep_main(_argv(repo, stats, out)) == 0
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean))
    now = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    assert [n for n in now if now[n] != kept[n]] == ["step1.parquet"]


def test_a_resume_whose_shards_lack_the_intervals_rescores_them(setup, clean, tmp_path):
    """--no-intervals, manifest deleted, rerun with intervals: the old shard (another run_key)
    is rescored, so the table has one shape: the clean run's."""
    root, repo, stats = setup
    out = tmp_path / "o"
    assert sweep_main(_argv(repo, stats, out, "--steps", "0", "--no-intervals")) == 0
    assert read_results(out)["ci_low"].isna().all()
    (out / "manifest.json").unlink()
    for step in (1, 2):  # the clean run's own shards (its settings): kept as they are
        shutil.copy(root / "clean" / "shards" / f"step{step}.parquet", out / "shards")
    assert sweep_main(_argv(repo, stats, out)) == 0
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean))


def test_run_sweep_waits_for_a_task_another_process_holds_and_returns_the_whole_table(
        setup, clean, tmp_path, monkeypatch):
    """Step 1 claimed by a live process: run_sweep waits for it (here the holder writes its
    shard and lets go while it waits), then returns all three steps, not two."""

    root, repo, stats = setup
    out = tmp_path / "o"
    claim = out / "claims" / "step1.json"
    claim.parent.mkdir(parents=True)
    claim.write_text(json.dumps({"tool": claims.TOOL, "claim": "step1.json",
                                 "host": socket.gethostname(), "pid": os.getpid(),
                                 "run_id": "other", "token": "theirs"}))
    waits, real_sleep = [], time.sleep

    def holder_finishes(seconds):  # time.sleep: the wait for step 1 is the first of 1 s
        if seconds != tasks.WAIT_POLL or not claim.exists():
            return real_sleep(seconds)
        waits.append(sorted(p.name for p in (out / "shards").iterdir()))
        shutil.copy(root / "clean" / "shards" / "step1.parquet", out / "shards")
        claim.unlink()

    monkeypatch.setattr(time, "sleep", holder_finishes)
    df = pp.run_sweep(**_kwargs(_argv(repo, stats, out)))
    assert waits == [["step0.parquet", "step2.parquet"]]  # waited once, its own steps done
    pd.testing.assert_frame_equal(_sorted(df), _sorted(clean))
    assert (out / "shards" / "step1.parquet").read_bytes() == \
        (root / "clean" / "shards" / "step1.parquet").read_bytes()  # theirs, not scored twice


def test_two_sweeps_at_once_into_one_out_end_as_one_run(setup, clean, tmp_path, capsys):
    """The same command twice at once (two threads: their claims look like another live
    process's to each other): both exit 0, and the folder, manifest and table are one run's."""
    root, repo, stats = setup
    out = tmp_path / "o"
    start, codes = threading.Barrier(2), []

    def launch():
        start.wait()
        codes.append(sweep_main(_argv(repo, stats, out)))

    threads = [threading.Thread(target=launch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0, 0]
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean))
    m = read_manifest(out)
    assert m["status"] == "complete" and m["steps"] == list(STEPS)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "revisions.parquet",
                                                   "shards", "summary.parquet"]
    printed = capsys.readouterr().out
    assert printed.count(" 0 failed") == 2 and printed.count("wrote ") == 2


@pytest.fixture(scope="module")
def grouped(setup):
    """Statistics kept in 4 document groups (intervals on) and the table of a clean run."""
    root, repo, _ = setup
    tokens = torch.randint(0, V, (40, 17), generator=torch.Generator().manual_seed(1))
    stats = batch_stats(tokens, V, groups=4).save(root / "grouped.safetensors")
    out = root / "clean-grouped"
    assert sweep_main(_argv(repo, stats, out, "--analyses", "embedding")) == 0
    df = read_results(out)
    assert df["ci_low"].notna().all()  # intervals on every row: what the resume must give
    return stats, df


@pytest.mark.parametrize("edit", ["deleted", "flag edited", "another run's copied"])
def test_a_no_intervals_shard_under_an_edited_or_deleted_manifest_is_rescored(
        setup, grouped, tmp_path, capsys, edit):
    """Issue 28: a --no-intervals run's manifest deleted, its intervals flag edited to on, or
    replaced by the manifest of a run with intervals: the rerun with intervals gave one table
    with intervals on some steps and none on others. The shard's own run key tells: step 0 is
    rescored (the plan counts it as to score, not done) and the table equals a clean run's,
    intervals on every row."""
    root, repo, _ = setup
    stats, want = grouped
    out = tmp_path / "o"
    argv = _argv(repo, stats, out, "--analyses", "embedding")
    assert sweep_main([*argv, "--steps", "0", "--no-intervals"]) == 0
    assert read_results(out)["ci_low"].isna().all()
    manifest = out / "manifest.json"
    if edit == "deleted":
        manifest.unlink()
    elif edit == "flag edited":
        m = json.loads(manifest.read_text())
        m["config"]["intervals"] = True
        manifest.write_text(json.dumps(m))
    else:
        shutil.copy(root / "clean-grouped" / "manifest.json", manifest)
    capsys.readouterr()
    assert sweep_main(argv) == 0
    printed = capsys.readouterr().out
    assert "3 steps: 0 done, 3 to score: [0, 1, 2]" in printed, printed
    assert "rank 0: 3 steps done, 0 already done" in printed
    got = read_results(out)
    assert got["ci_low"].notna().all()
    pd.testing.assert_frame_equal(_sorted(got), _sorted(want))


def test_two_run_sweep_calls_at_once_each_return_the_whole_table(setup, clean, tmp_path):
    """Issue 28: pp.run_sweep called at the same time twice into one folder (two threads: to
    each other like two processes) returned, in the first call, 4 of its 8 steps as if
    complete. Each call returns every asked step's rows: the clean run's table."""
    root, repo, stats = setup
    out = tmp_path / "o"
    start, tables = threading.Barrier(2), []

    def call():
        start.wait()
        tables.append(pp.run_sweep(**_kwargs(_argv(repo, stats, out))))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tables) == 2
    for df in tables:
        pd.testing.assert_frame_equal(_sorted(df), _sorted(clean))
    assert read_manifest(out)["status"] == "complete"
