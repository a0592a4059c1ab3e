"""tools/check_interconnect.py's reading of NCCL's INFO log, on lines copied from real NCCL logs posted in
public issues (each case names its source), and the bus bandwidth it prints."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import check_interconnect as ci  # noqa: E402

# NVIDIA/nccl#1412: two H100 nodes over InfiniBand (NCCL 2.2x), with the node's own NVLink links beside.
IB = [
    "swat1-04:2017630:2017697 [7] NCCL INFO Channel 00/0 : 7[7] -> 6[6] via P2P/direct pointer/read",
    "swat1-04:2017630:2017699 [5] NCCL INFO Channel 03/0 : 5[5] -> 12[4] [send] via NET/IB/3",
    "swat1-04:2017630:2017700 [4] NCCL INFO Channel 03/0 : 13[5] -> 4[4] [receive] via NET/IB/3",
    "swat1-04:2017630:2017699 [5] NCCL INFO Channel 07/0 : 5[5] -> 12[4] [send] via NET/IB/3",
]
# NVIDIA/nccl-tests#185: the device and network lines of an IB (RoCE HCA) run.
IB_DEVICES = [
    "dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB "
    "enp220s0np0:11.1.128.136<0>",
    "dgxh100-4:460770:460842 [0] NCCL INFO Using network IB",
]
# NVIDIA/nccl#1232: two nodes over TCP sockets, lines prefixed by mpirun's rank tag; SHM inside a node.
SOCKET = [
    "[0] node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "[1] node2:22555:22555 [0] NCCL INFO Channel 00/0 : 2[1] -> 1[0] [receive] via NET/Socket/0",
    "[2] node0:13572:13572 [1] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct",
]
# NVIDIA/nccl#226: NCCL 2.4's "Ring" lines on AWS nodes without InfiniBand.
OLD_SOCKET = [
    "ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/IB : No device found.",
    "ip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.12.210<0>",
    "ip-172-31-12-210:45305:45310 [0] NCCL INFO Ring 00 : 43 -> 44 [receive] via NET/Socket/0",
]
# NVIDIA/nccl-tests#373 and deepseek-ai/DeepEP#106: HPC-X's IB plugin (IBext_v8; IBext with GPUDirect RDMA).
IBEXT = [
    "bigo:1884:2298 [0] NCCL INFO Using network IBext_v8",
    "bigo:1884:2298 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[0] [receive] via NET/IBext_v8/1",
    "VM-17-82-centos:11980:12549 [2] NCCL INFO Channel 03/0 : 2[2] -> 10[2] [send] via NET/IBext/2/GDRDMA",
]
# NVIDIA/nccl-tests#213: one node only (NVLink): no inter-node connection to judge.
ONE_NODE = [
    "hw14:798:813 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer",
    "hw14:798:817 [7] NCCL INFO Channel 01/0 : 7[7] -> 0[0] via P2P/direct pointer",
]


def test_infiniband_passes_and_names_the_devices():
    v = ci.verdict(IB + IB_DEVICES)
    assert v.code == ci.PASS and v.networks == {"IB": 3}  # the NVLink connection is not counted
    assert "network IB" in v.message and "mlx5_10:1/RoCE" in v.message


def test_an_ib_plugin_with_gpudirect_rdma_passes():
    v = ci.verdict(IBEXT)
    assert v.code == ci.PASS and v.networks == {"IBext_v8": 1, "IBext": 1}


@pytest.mark.parametrize("lines", [SOCKET, OLD_SOCKET], ids=["channel", "ring"])
def test_tcp_sockets_between_nodes_fail(lines):
    v = ci.verdict(lines)
    assert v.code == ci.TCP and set(v.networks) == {"Socket"}
    assert v.message.startswith("FAIL: NCCL uses TCP sockets")


def test_one_socket_connection_among_ib_ones_fails():
    assert ci.verdict(IB + SOCKET[:1]).code == ci.TCP


def test_an_unknown_network_is_not_called_rdma():
    line = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA"
    assert ci.verdict([line]).code == ci.TCP


@pytest.mark.parametrize("lines", [ONE_NODE, []], ids=["one-node", "no-log"])
def test_no_inter_node_connection_is_not_a_pass(lines):
    v = ci.verdict(lines)
    assert v.code == ci.NOT_SEEN and "run on 2 nodes" in v.message


def test_bus_bandwidth_follows_nccl_tests():
    """nccl-tests doc/PERFORMANCE.md: all-reduce busbw = algbw x 2 (n - 1) / n; broadcast busbw = algbw."""
    assert ci.bus_gbps("all_reduce", 10**9, 1.0, 2) == pytest.approx(1.0)
    assert ci.bus_gbps("all_reduce", 10**9, 0.5, 8) == pytest.approx(3.5)
    assert ci.bus_gbps("broadcast", 10**9, 0.5, 8) == pytest.approx(2.0)
