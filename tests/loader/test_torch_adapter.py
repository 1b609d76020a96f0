"""The PyTorch adapter: a torch model trains on our shards and resumes exactly, with the Loader's cursor
semantics (the state of the last consumed item, whatever the DataLoader read ahead)."""
import numpy as np
import pytest

from mspretrain.loader import Loader

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from mspretrain.loader.torch_adapter import LoaderDataset  # noqa: E402


def train(dataset, steps: int, state=None, **loader_kw):
    """A tiny next-token model trained on `steps` batches; returns (losses, sample ids, final state,
    model weights), starting from `state` (model weights, optimizer and loader state) when given."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(128, 16), torch.nn.Linear(16, 128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, ids = [], []
    with Loader(dataset, global_batch_size=8, seed=3, **loader_kw) as ld:
        if state:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            ld.load_state_dict(state["loader"])
        item = None
        for item in DataLoader(LoaderDataset(ld, steps=steps), batch_size=None, pin_memory=False):
            x = item["input_ids"].long()
            loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            ids.append(item["sample_id"].numpy().copy())
        return losses, ids, {"model": model.state_dict(), "opt": opt.state_dict(),
                             "loader": ld.state_at(item["cursor"])}


def test_items_are_tensors_of_the_loader_batches(dataset):
    with Loader(dataset, global_batch_size=12, seed=2, dp_rank=1, dp_size=2) as ld:
        expected = [next(ld) for _ in range(5)]
    with Loader(dataset, global_batch_size=12, seed=2, dp_rank=1, dp_size=2, num_workers=2) as ld:
        items = list(DataLoader(LoaderDataset(ld, steps=5), batch_size=None))
    assert [i["cursor"] for i in items] == [12, 24, 36, 48, 60]
    for item, batch in zip(items, expected):
        assert item["input_ids"].dtype == torch.int32 and tuple(item["input_ids"].shape) == (6, 17)
        assert np.array_equal(item["input_ids"].numpy(), batch["input_ids"])
        assert np.array_equal(item["sample_id"].numpy(), batch["sample_id"])


def test_a_torch_run_killed_and_resumed_gives_the_same_losses(dataset):
    torch.set_num_threads(1)
    straight, straight_ids, _ = train(dataset, 12)
    first, first_ids, state = train(dataset, 5, num_workers=2, prefetch=4)
    second, second_ids, _ = train(dataset, 7, state=state, num_workers=1)
    assert first + second == straight                      # bitwise: the same floats
    assert all(np.array_equal(a, b) for a, b in zip(first_ids + second_ids, straight_ids))
    assert len({int(i) for batch in straight_ids for i in batch}) == 12 * 8   # 96 distinct samples


def test_torch_worker_processes_are_refused(dataset):
    with Loader(dataset, global_batch_size=8, seed=1) as ld:
        with pytest.raises(Exception, match="num_workers=0"):
            next(iter(DataLoader(LoaderDataset(ld, steps=2), batch_size=None, num_workers=1)))
