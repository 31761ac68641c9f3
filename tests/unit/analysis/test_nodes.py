"""Per-node figures (seed 003 tables 1-3) on hand-made records and samples with known rates."""
import pytest

from scalelab.analysis.nodes import node_rows


def step(rank, n, *, wall, t_end, warmup=False):
    return {"rank": rank, "step": n, "epoch": 0, "warmup": warmup, "samples": 8, "wall(s)": wall, "eval(s)": 0.0,
            "data(s)": 0.0, "t_end(unix_s)": t_end}


def sample(rank, t, *, user_rate, system_rate, sent_rate, recv_rate, lo_rate):
    # cumulative counters growing at known rates from t = 100
    dt = t - 100.0
    return {"rank": rank, "time": t, "cpu_run_user(s)": user_rate * dt, "cpu_run_system(s)": system_rate * dt,
            "net_sent(bytes)": (sent_rate + lo_rate) * dt, "net_recv(bytes)": (recv_rate + lo_rate) * dt,
            "lo_sent(bytes)": lo_rate * dt, "lo_recv(bytes)": lo_rate * dt}


def test_each_node_gets_its_ranks_epoch_time_cpu_and_network():
    # 2 nodes x 2 ranks; timed window: step 2 starts at 101.0 (102.0 - 1.0), step 3 ends at 103.0
    records = [step(r, 1, wall=1.0, t_end=101.0, warmup=True) for r in range(4)]
    records += [step(r, n, wall=1.0 + 0.1 * r, t_end=100.0 + n) for r in range(4) for n in (2, 3)]
    samples = [sample(0, t, user_rate=1.5, system_rate=0.1, sent_rate=2e6, recv_rate=3e6, lo_rate=5e6)
               for t in (100.0, 102.5, 104.0)]
    samples += [sample(2, t, user_rate=0.5, system_rate=0.25, sent_rate=1e6, recv_rate=4e6, lo_rate=0.0)
                for t in (100.5, 103.5)]
    rows = node_rows(records, samples, ranks_per_node=2, nodes=2, steps_per_epoch=10)
    assert [r["node"] for r in rows] == [0, 1] and [r["ranks"] for r in rows] == [2, 2]
    # the node's slowest rank per step: node 0 -> rank 1 (1.1 s), node 1 -> rank 3 (1.3 s); x 10 steps per epoch
    assert rows[0]["epoch(s)"] == pytest.approx(11.0)
    assert rows[1]["epoch(s)"] == pytest.approx(13.0)
    assert (rows[0]["cpu_user(%)"], rows[0]["cpu_system(%)"]) == pytest.approx((150.0, 10.0))
    assert (rows[1]["cpu_user(%)"], rows[1]["cpu_system(%)"]) == pytest.approx((50.0, 25.0))
    # loopback is not the node's network: 7 MB/s on the counter, 2 of them off the node
    assert (rows[0]["net_sent(MB/s)"], rows[0]["net_recv(MB/s)"]) == pytest.approx((2.0, 3.0))
    assert (rows[1]["net_sent(MB/s)"], rows[1]["net_recv(MB/s)"]) == pytest.approx((1.0, 4.0))


def test_a_node_whose_samples_miss_the_window_has_no_rates():
    records = [step(0, 1, wall=1.0, t_end=101.0, warmup=True), step(0, 2, wall=1.0, t_end=102.0)]
    late = [sample(0, t, user_rate=1, system_rate=1, sent_rate=1, recv_rate=1, lo_rate=0) for t in (101.5, 105.0)]
    (row,) = node_rows(records, late, ranks_per_node=1, nodes=1, steps_per_epoch=4)
    assert row["epoch(s)"] == pytest.approx(4.0)
    assert row["cpu_user(%)"] is None and row["net_sent(MB/s)"] is None
    (row,) = node_rows([], [], ranks_per_node=1, nodes=1, steps_per_epoch=4)
    assert row["epoch(s)"] is None
