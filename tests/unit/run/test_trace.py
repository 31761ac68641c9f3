import pytest

from scalelab.run.exports import trace_events


def test_stage_spans_are_laid_end_to_end_and_collectives_placed_on_the_wall_clock():
    rec = {"rank": 1, "step": 3, "t_end(unix_s)": 1000.0, "t_end(perf_s)": 50.0, "wall(s)": 0.1,
           "data(s)": 0.01, "h2d(s)": 0.0, "forward(s)": 0.03, "backward(s)": 0.04, "comm(s)": 0.005,
           "optimizer(s)": 0.01, "eval(s)": 0.0, "comm_events": [["allreduce", "backward", 49.95, 0.02, 4096]]}
    ev = trace_events([rec])
    stages = [e for e in ev if e.get("tid") == "stages"]
    assert [e["name"] for e in stages] == ["data", "forward", "backward", "comm", "optimizer"]
    assert stages[0]["ts"] == pytest.approx(999.9e6)
    assert stages[1]["ts"] == pytest.approx(999.91e6)  # forward starts when data ends
    assert stages[2]["ts"] == pytest.approx(999.94e6) and stages[2]["dur"] == pytest.approx(0.04e6)
    coll = [e for e in ev if e.get("tid") == "collectives"]
    assert coll[0]["ts"] == pytest.approx(999.95e6) and coll[0]["dur"] == pytest.approx(0.02e6)
    assert coll[0]["args"]["bytes"] == 4096
    assert any(e["ph"] == "M" and e["args"]["name"] == "rank 1" for e in ev)


def test_each_collectives_last_arrival_is_marked():
    def rec(rank, start):
        return {"rank": rank, "step": 1, "t_end(unix_s)": 1000.0, "t_end(perf_s)": 50.0, "wall(s)": 0.1,
                "comm_events": [["allreduce", "backward", start, 0.01, 8]]}

    ev = trace_events([rec(0, 49.95), rec(1, 49.96)], last={(1, 1, 0)})
    coll = {e["pid"]: e for e in ev if e.get("tid") == "collectives" and e["ph"] == "X"}
    assert coll[1]["args"]["last_arrival"] is True and "last_arrival" not in coll[0]["args"]
    marks = [e for e in ev if e["name"] == "last arrival"]
    assert len(marks) == 1 and marks[0]["pid"] == 1 and marks[0]["ts"] == pytest.approx(coll[1]["ts"])
