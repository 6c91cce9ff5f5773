"""The trainers' ``weights_digest``: the line each host prints about the weights it ended with.

The two-host training tests hold those lines to the tests' own hash of the weights the job saved
(tests/fixtures/weights.py); here the digests themselves: one element of one tensor, or a name,
changes them (and a buffer, for torchvision's); equal weights give equal digests however the module
registered them. detectron2's leaves out BatchNorm statistics, which its ranks keep apart (it
trains without broadcasting buffers), and looks through DistributedDataParallel.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
from torch import nn

from model_code.training import torchvision_trainer
from tests.fixtures.frameworks import require_detectron2
from tests.fixtures.weights import parameters_only, tensors_digest

Digest = Callable[[nn.Module], str]


class Net(nn.Module):
    """Parameters and BatchNorm buffers, registered in the order asked for."""

    def __init__(self, seed: int = 0, reverse: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        layers = {"conv": nn.Conv2d(3, 4, 3), "norm": nn.BatchNorm2d(4), "head": nn.Linear(4, 2)}
        for name in reversed(layers) if reverse else layers:
            self.add_module(name, layers[name])
        with torch.no_grad():  # statistics a few training steps would have left, not the initial 0 and 1
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)


class Renamed(nn.Module):
    """Net's very tensors under other names."""

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.conv, self.bn, self.head = net.conv, net.norm, net.head


def nudge(tensor: torch.Tensor, index: int = 5) -> None:
    """The smallest change there is: one element one float step away."""
    with torch.no_grad():
        flat = tensor.view(-1)
        flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf")))


@pytest.fixture(scope="module")
def d2_worker() -> ModuleType:
    require_detectron2()
    from model_code.training import detectron2_worker

    return detectron2_worker


def test_torchvision_digest_is_the_hash_of_every_state_dict_tensor_with_its_name() -> None:
    net = Net()
    digest = torchvision_trainer.weights_digest
    assert digest(net) == tensors_digest(net.state_dict()) == digest(Net())
    assert len(digest(net)) == 16 and int(digest(net), 16) >= 0
    assert digest(Net(reverse=True)) == digest(net)  # the same tensors registered in another order
    assert digest(Net(seed=1)) != digest(net)
    assert digest(Renamed(net)) != digest(net)  # same bytes, another name

    for name, tensor in net.state_dict().items():
        if tensor.is_floating_point():  # every parameter and the BatchNorm statistics; one element each
            changed = Net()
            nudge(changed.get_parameter(name) if name in dict(changed.named_parameters())
                  else changed.get_buffer(name), index=min(5, tensor.numel() - 1))
            assert digest(changed) != digest(net), name
    counted = Net()
    counted.norm.num_batches_tracked += 1
    assert digest(counted) != digest(net)


def test_detectron2_digest_hashes_the_parameters_not_the_batch_norm_statistics(d2_worker: ModuleType) -> None:
    net = Net()
    digest: Digest = d2_worker.weights_digest
    assert digest(net) == tensors_digest(dict(net.named_parameters())) == digest(Net())
    assert digest(net) == tensors_digest(parameters_only(net.state_dict()))  # how the training tests hash saves
    assert digest(Net(reverse=True)) == digest(net)
    assert digest(Net(seed=1)) != digest(net)
    assert digest(Renamed(net)) != digest(net)
    for name, _ in net.named_parameters():
        changed = Net()
        nudge(changed.get_parameter(name), index=min(5, changed.get_parameter(name).numel() - 1))
        assert digest(changed) != digest(net), name
    # each rank's own running statistics (DDP with broadcast_buffers=False) leave it unchanged
    statistics = Net()
    nudge(statistics.norm.running_mean, index=0)
    statistics.norm.num_batches_tracked += 3
    assert digest(statistics) == digest(net)


@pytest.fixture
def process_group() -> Iterator[None]:
    """A one-process gloo group, as a worker has one: DistributedDataParallel needs it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_detectron2_digest_of_the_ddp_model_is_the_digest_of_the_model(d2_worker: ModuleType,
                                                                         process_group: None) -> None:
    net = Net()
    wrapped = nn.parallel.DistributedDataParallel(net)
    # the trainer hands over the DDP wrapper; its names would all start with 'module.'
    assert d2_worker.weights_digest(wrapped) == d2_worker.weights_digest(net) == d2_worker.weights_digest(Net())
