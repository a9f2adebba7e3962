"""What the first master keeps on record for a successor of its (root_record.py)."""

from __future__ import annotations

from symcc_mpi.federation.root_record import Departure, RootRecord

TOKEN = "ab" * 16


def test_a_successor_inherits_the_decision_the_figures_and_the_farewells(tmp_path):
    record = RootRecord(tmp_path)
    record.keep(own={"executions": 7, "start_time": 99.0}, departed=[{"executions": 3}],
                successions=[{"master_index": 1}], findings=2, budget_start=100.5,
                ending="wall-clock budget spent")
    record.farewell(2, {"executions": 5}, None)
    record.farewell(3, {"executions": 1}, ("OUT refused writes", False))
    record.decide(TOKEN)
    found = RootRecord(tmp_path).inherit()
    assert found.decided == TOKEN
    assert found.departed == [{"executions": 7, "start_time": 99.0}, {"executions": 3}]
    assert found.start_time == 99.0  # the dead root's own figures come first
    assert found.successions == [{"master_index": 1}] and found.findings == 2
    assert found.budget_start == 100.5 and found.ending == "wall-clock budget spent"
    assert found.farewells == {2: Departure({"executions": 5}),
                               3: Departure({"executions": 1}, "OUT refused writes", False)}


def test_nothing_on_record_is_a_campaign_that_goes_on(tmp_path):
    found = RootRecord(tmp_path).inherit()
    assert found.decided is None and found.departed == [] and found.farewells == {}
    assert found.budget_start is None and found.start_time is None and found.ending == ""


def test_damaged_records_leave_their_part_empty(tmp_path, caplog):
    (tmp_path / "decision").write_text("not a token")
    (tmp_path / "root.json").write_text('{"departed": [1, {"executions": 2}], "findings": "x"')
    (tmp_path / "farewell-1.json").write_text('{"figures": [], "stop": ["x"]}')
    (tmp_path / "farewell-x.json").write_text("{}")
    found = RootRecord(tmp_path).inherit()
    assert found.decided is None and found.departed == [] and found.findings == 0
    assert found.farewells == {1: Departure({})}  # said farewell, the rest unreadable
    assert "not a decision token" in caplog.text and "root.json: unreadable" in caplog.text
