"""Issue #20 item 5: many models' work ordered so that no checkpoint is downloaded twice: a plan
over (model, step) tasks grouping byte-identical revisions within and across models by their
weights digest, from metadata alone; streaming it fetches each group once."""

import shutil

import pytest
import torch

from pythia_probe import arch
from pythia_probe.hub.checkpoints import (
    CheckpointSource,
    RetryPolicy,
    Task,
    plan_downloads,
    stream_plan,
)
from pythia_probe.testing.repos import (
    build_pythia_like_repo,
    random_state_dict,
    tiny_config,
    write_checkpoint,
)

A, B = "EleutherAI/pythia-a", "EleutherAI/pythia-b"
STEPS = (0, 1, 1000, 2000)
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
WEIGHTS = "pytorch_model.bin"
B_1000 = 99  # the seed of B's own step1000

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    """A and B share step0 (and so step1: both copy it); B's step2000 serves A's step1000."""
    root = tmp_path_factory.mktemp("hub")
    layouts = {s: ("bin", 1) for s in STEPS}
    a = build_pythia_like_repo(root, A, steps=STEPS, layouts=layouts, with_main=False)
    b = root / B
    write_checkpoint(b / "step1000", tiny_config(), random_state_dict(tiny_config(), seed=B_1000))
    for step, src in ((0, "step0"), (1, "step0"), (2000, "step1000")):
        shutil.copytree(a / src, b / f"step{step}")
    return root


def sources(hub, tmp_path) -> list[CheckpointSource]:
    return [CheckpointSource(m, cache_dir=tmp_path / "cache", endpoint=hub.endpoint, retry=FAST)
            for m in (A, B)]


def seed(task: Task) -> int:
    """The seed the repo builder used for the weights this task's branch serves."""
    if task.step in (0, 1):
        return 0
    if task.model == B:
        return {1000: B_1000, 2000: 1000}[task.step]
    return task.step


def test_the_plan_groups_identical_weights_within_and_across_models(hub, tmp_path):
    plan = plan_downloads(sources(hub, tmp_path), STEPS)
    assert not [r for r in hub.log if not r["path"].startswith("/api/")  # metadata only:
                and r["method"] != "HEAD"]  # listings, and HEADs confirming shared sha256
    heads = [r["path"].split("/resolve/")[0] for r in hub.requests("HEAD")]
    assert sorted(heads) == [f"/{A}"] * 3 + [f"/{B}"] * 3  # A 0, 1, 1000; B 0, 1, 2000
    assert len({r["path"] for r in hub.requests("HEAD")}) == 6  # each file once
    assert [g.tasks for g in plan.groups] == [
        (Task(A, 0), Task(A, 1), Task(B, 0), Task(B, 1)),
        (Task(A, 1000), Task(B, 2000)),
        (Task(A, 2000),),
        (Task(B, 1000),)]
    assert plan.leaders() == {A: [0, 1000, 2000], B: [1000]}
    assert plan.copies() == {Task(A, 1): Task(A, 0), Task(B, 0): Task(A, 0),
                             Task(B, 1): Task(A, 0), Task(B, 2000): Task(A, 1000)}
    assert len({g.digest for g in plan.groups}) == 4
    assert plan.nbytes * 2 == plan.naive_nbytes  # 4 downloads instead of 8


def test_streaming_the_plan_fetches_each_checkpoint_once(hub, tmp_path):
    srcs = sources(hub, tmp_path)
    plan = plan_downloads(srcs, {A: STEPS, B: STEPS})
    seen = []
    for group, loaded in stream_plan(plan, srcs, prefetch=1):
        assert (loaded.revision.model, loaded.revision.step) == group.leader
        for task in group.tasks:  # every task of the group has exactly these weights
            ref = random_state_dict(tiny_config(), seed=seed(task))
            assert all(torch.equal(loaded.tensors[k], ref[k]) for k in ref
                       if not arch.is_legacy_buffer(k))
        seen.append(group.leader)
    assert seen == [g.leader for g in plan.groups]
    got = [r["path"] for r in hub.requests("GET", "/cdn/") if r["path"].endswith(WEIGHTS)]
    assert len(got) == 4 and len(set(got)) == 4  # four distinct checkpoints, each once
    assert all(not list(s.storage.glob("blobs/*")) for s in srcs)  # all evicted


def test_local_and_hub_sources_give_the_same_digests(hub, hub_root, tmp_path):
    on_hub = plan_downloads(sources(hub, tmp_path), STEPS)
    local = plan_downloads([CheckpointSource(hub_root / A), CheckpointSource(hub_root / B)],
                           STEPS)
    assert [g.digest for g in local.groups] == [g.digest for g in on_hub.groups]
    assert [[(t.step) for t in g.tasks] for g in local.groups] == [
        [t.step for t in g.tasks] for g in on_hub.groups]
