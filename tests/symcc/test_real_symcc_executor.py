"""The executor contract with a real SymCC build behind it (QSYM backend, Z3)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from realsymcc import BUILD, SEEDS

from symcc_mpi.executors.base import Outcome
from symcc_mpi.executors.symcc import QSYM_MAP_SIZE, SymccExecutor, preload_library

pytestmark = pytest.mark.timeout(120)

JSON_SEED = SEEDS / "json" / "escaped-key"
# The json example's planted bug: a surrogate pair right after "x-" in an item's key.
JSON_CRASHER = b'{"version":1,"items":[{"id":1,"x-\\ud83d\\ude00":"red"}]}'

# Forks a child that writes its pid into "started" and sleeps forever; the parent waits for
# that mark, then sleeps forever too. A per-run timeout must kill both (the whole group).
FORKER = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[16];
    FILE *f = fopen(argv[1], "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (n > 0 && buf[0] == 'Z') return 3; /* one symbolic branch */
    char mark[4096], tmp[4096];
    snprintf(mark, sizeof mark, "%s/started", argv[2]);
    snprintf(tmp, sizeof tmp, "%s/started.tmp", argv[2]);
    if (fork() == 0) {
        FILE *pid = fopen(tmp, "w");
        if (pid) { fprintf(pid, "%d", (int)getpid()); fclose(pid); rename(tmp, mark); }
        for (;;) sleep(1);
    }
    while (access(mark, F_OK) != 0) usleep(10000);
    for (;;) sleep(1);
}
"""

# Reports the RLIMIT_AS it runs under and whether 1 GiB can be allocated.
MEMORY_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
int main(int argc, char **argv) {
    char buf[16];
    FILE *f = fopen(argv[1], "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    if (n > 0 && buf[0] == 'Z') return 3;
    struct rlimit lim;
    getrlimit(RLIMIT_AS, &lim);
    void *big = malloc((size_t)1 << 30);
    FILE *out = fopen(argv[2], "w");
    fprintf(out, "%lld %d\n", lim.rlim_cur == RLIM_INFINITY ? -1LL : (long long)lim.rlim_cur,
            big != NULL);
    fclose(out);
    return 0;
}
"""


# Appends its parent's pid to argv[2] (a forked run's parent is the forkserver, an exec'd
# run's the executor); exits 4 on an input starting with 'Y', after one symbolic branch.
PARENT = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[16];
    FILE *f = fopen(argv[1], "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    FILE *out = fopen(argv[2], "a");
    fprintf(out, "%d\n", (int)getppid());
    fclose(out);
    return n > 0 && buf[0] == 'Y' ? 4 : 0;
}
"""

GATE_SEED = SEEDS / "gate" / "start"


def symcc_compile(tmp: Path, name: str, source: str, compiler: str | None = None) -> Path:
    """`source` built with SymCC (or with `compiler`)."""
    (tmp / f"{name}.c").write_text(source)
    binary = tmp / name
    subprocess.run([compiler or str(BUILD / "symcc"), "-O1", "-o", str(binary),
                    str(tmp / f"{name}.c")], check=True, capture_output=True, timeout=120)
    return binary


@pytest.fixture
def out(tmp_path) -> Path:
    path = tmp_path / "generated"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def preload() -> Path:
    library = preload_library()
    assert library is not None, "no C compiler for the preload library"
    return library


@pytest.fixture(params=["exec", "forked"])
def make(request, tmp_path):
    """SymccExecutor in each way a whole run happens: exec'd (no preload library), and
    forked from the forkserver (the library preloaded)."""
    library = preload_library() if request.param == "forked" else None
    made = []

    def make(argv, **options) -> SymccExecutor:
        scratch = tmp_path / f"scratch-{len(made)}"
        scratch.mkdir()
        made.append(SymccExecutor(argv, preload=library, scratch=scratch, **options))
        return made[-1]

    yield make
    for executor in made:
        executor.close()


def targetable(program: str, preload: Path, scratch: Path, **options) -> SymccExecutor:
    return SymccExecutor([str(BUILD / program), "@@"], timeout=60, preload=preload,
                         scratch=scratch, **options)


def fresh(tmp_path: Path) -> Path:
    """An empty output directory of its own, for one more run."""
    number = len(list(tmp_path.glob("run-*")))
    path = tmp_path / f"run-{number}"
    path.mkdir()
    return path


def test_file_target_generates_inputs_with_solver_time(make, out):
    result = make([str(BUILD / "json.symcc"), "@@"], timeout=60).run(JSON_SEED, out)
    assert result.outcome is Outcome.OK and result.exit_status == 0, result
    # With the input on stdin (/dev/null here) this SymCC would derive nothing: every new
    # input proves SYMCC_INPUT_FILE named the file the target read.
    assert len(result.generated) >= 10
    assert all(p.parent == out and p.stat().st_size > 0 for p in result.generated)
    assert result.solver_time > 0 and result.solver_queries > 0


def test_stdin_target_generates_inputs(make, out):
    result = make([str(BUILD / "json.symcc")], timeout=60).run(JSON_SEED, out)
    assert result.outcome is Outcome.OK and result.exit_status == 0, result
    assert len(result.generated) >= 10
    assert result.solver_time > 0


def test_one_run_from_a_seed_that_misses_the_magic_gets_closer(out):
    seed = SEEDS / "magic" / "hello"
    assert not seed.read_bytes().startswith(b"M")
    result = SymccExecutor([str(BUILD / "magic.symcc"), "@@"], timeout=60).run(seed, out)
    assert result.outcome is Outcome.OK, result
    assert any(p.read_bytes().startswith(b"M") for p in result.generated), \
        [p.read_bytes() for p in result.generated]


def test_abort_is_a_crash(make, tmp_path, out):
    crasher = tmp_path / "crasher"
    crasher.write_bytes(JSON_CRASHER)
    result = make([str(BUILD / "json.symcc"), "@@"], timeout=60).run(crasher, out)
    assert result.outcome is Outcome.CRASH and result.exit_status == -signal.SIGABRT, result


@pytest.fixture
def forker(tmp_path):
    """FORKER built with SymCC: (its command line, the directory of its marks, a seed).
    The child it starts is killed at teardown if a test left it running."""
    binary = symcc_compile(tmp_path, "forker", FORKER)
    marks = tmp_path / "marks"
    marks.mkdir()
    seed = tmp_path / "seed"
    seed.write_bytes(b"A")
    yield [str(binary), "@@", str(marks)], marks, seed
    started = marks / "started"
    if started.exists() and _running(child := int(started.read_text())):
        os.kill(child, signal.SIGKILL)


def assert_gone_within(pid: int, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), what


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group(make, forker, out):
    argv, marks, seed = forker
    started = time.monotonic()
    # Far longer than starting the target and its child takes on a busy machine.
    result = make(argv, timeout=3).run(seed, out)
    assert result.outcome is Outcome.TIMEOUT, result
    assert time.monotonic() - started < 60  # the target would never end
    assert_gone_within(int((marks / "started").read_text()), 30,
                       "a child of the timed-out target survived")


def _running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not: in a container nobody may reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_memory_limit_caps_the_address_space(make, tmp_path, out):
    probe = symcc_compile(tmp_path, "memprobe", MEMORY_PROBE)
    seed = tmp_path / "seed"
    seed.write_bytes(b"A")
    report = tmp_path / "report"
    result = make([str(probe), "@@", str(report)], timeout=60, memory_limit_mb=512).run(seed, out)
    assert result.outcome is Outcome.OK, result
    assert report.read_text().split() == [str(512 << 20), "0"]  # the 1 GiB malloc failed
    assert result.generated, "QSYM could not work under the limit"
    # The control: without a limit the same allocation succeeds.
    result = make([str(probe), "@@", str(report)], timeout=60).run(seed, out)
    assert result.outcome is Outcome.OK, result
    assert report.read_text().split()[1] == "1"


def test_without_the_preload_library_runs_are_not_targetable(out):
    executor = SymccExecutor([str(BUILD / "gate.symcc"), "@@"], timeout=60)
    assert executor.targetable is False
    result = executor.run(GATE_SEED, out)
    assert result.outcome is Outcome.OK and result.generated, result
    assert result.path_targets is None and result.solved_targets == ()
    with pytest.raises(ValueError):
        executor.run(GATE_SEED, out, targets=frozenset())


@pytest.mark.parametrize("program, seed", [("json.symcc", JSON_SEED),
                                           ("gate.symcc", GATE_SEED)])
def test_a_trace_solves_nothing_and_reports_the_same_path_each_time(tmp_path, preload,
                                                                     program, seed):
    executor = targetable(program, preload, tmp_path)
    assert executor.targetable is True
    first = executor.run(seed, fresh(tmp_path), targets=frozenset())
    assert first.outcome is Outcome.OK, first
    assert first.generated == () and first.solved_targets == () and first.solver_queries == 0
    assert first.path_targets and len(set(first.path_targets)) == len(first.path_targets)
    assert all(1 <= target <= QSYM_MAP_SIZE for target in first.path_targets)
    again = executor.run(seed, fresh(tmp_path), targets=frozenset())
    assert again.path_targets == first.path_targets


def test_a_whole_run_solves_on_its_path_and_reports_it_as_a_trace_does(tmp_path, preload):
    executor = targetable("json.symcc", preload, tmp_path)
    whole = executor.run(JSON_SEED, fresh(tmp_path))
    trace = executor.run(JSON_SEED, fresh(tmp_path), targets=frozenset())
    assert whole.outcome is Outcome.OK and len(whole.generated) >= 10, whole
    assert whole.path_targets == trace.path_targets  # the concrete path is the input's
    assert whole.solved_targets and set(whole.solved_targets) <= set(whole.path_targets)


def test_a_targeted_run_solves_its_targets_and_nothing_else(tmp_path, preload):
    executor = targetable("json.symcc", preload, tmp_path)
    path = executor.run(JSON_SEED, fresh(tmp_path), targets=frozenset()).path_targets
    chosen = frozenset(path[::7])
    result = executor.run(JSON_SEED, fresh(tmp_path), targets=chosen)
    assert result.outcome is Outcome.OK, result
    assert result.path_targets == path
    # Every first hit of a target is new under the targeted map: each one is solved.
    assert set(result.solved_targets) == chosen
    assert result.generated and result.solver_queries > 0


def test_targeting_every_path_target_is_a_whole_run_without_context_novelty(tmp_path,
                                                                          preload):
    """The targets this executor computes are the very indices QSYM consults: handing it
    all of a path's targets as "new" solves what a whole run solves when every context
    already counts as seen (the context half of its map full). Targeted runs leave the
    campaign's map alone."""
    campaign_map = tmp_path / "contexts-seen.map"
    campaign_map.write_bytes(bytes(QSYM_MAP_SIZE) + b"\xff" * QSYM_MAP_SIZE)
    executor = targetable("json.symcc", preload, tmp_path, coverage_map=campaign_map)
    whole = executor.run(JSON_SEED, fresh(tmp_path))
    after_the_whole_run = campaign_map.read_bytes()
    path = executor.run(JSON_SEED, fresh(tmp_path), targets=frozenset()).path_targets
    everything = executor.run(JSON_SEED, fresh(tmp_path), targets=frozenset(path))
    assert everything.solved_targets == whole.solved_targets
    assert everything.solver_queries == whole.solver_queries > 0
    assert campaign_map.read_bytes() == after_the_whole_run


@pytest.mark.parametrize("program, seed", [("json.symcc", JSON_SEED),
                                           ("gate.symcc", GATE_SEED)])
@pytest.mark.parametrize("groups", [2, 3])
def test_a_trace_split_round_robin_solves_what_the_whole_run_finds_new(tmp_path, preload,
                                                                       program, seed, groups):
    """Each group's run solves within the group, and together they solve every target the
    whole run solves by trace novelty (they may solve more: a branch of another group can
    no longer mark its inverse as covered; and fewer of those a whole run solves only
    because a context was new, since a targeted map has every context seen)."""
    executor = targetable(program, preload, tmp_path)
    path = executor.run(seed, fresh(tmp_path), targets=frozenset()).path_targets
    by_trace_novelty = set(executor.run(seed, fresh(tmp_path),
                                        targets=frozenset(path)).solved_targets)
    solved: set[int] = set()
    for group in (frozenset(path[first::groups]) for first in range(groups)):
        result = executor.run(seed, fresh(tmp_path), targets=group)
        assert result.outcome is Outcome.OK, result
        assert set(result.solved_targets) <= group
        solved |= set(result.solved_targets)
    assert by_trace_novelty <= solved <= set(path)


@pytest.mark.slow
def test_a_run_killed_by_its_timeout_reports_the_path_it_recorded(tmp_path, preload, forker,
                                                                  out):
    argv, _, seed = forker
    result = SymccExecutor(argv, timeout=3, preload=preload, scratch=tmp_path).run(seed, out)
    assert result.outcome is Outcome.TIMEOUT, result
    assert len(result.path_targets) == 1 and result.solved_targets == result.path_targets


@pytest.mark.slow
def test_forked_runs_generate_what_exec_d_runs_generate(tmp_path, preload):
    """The worker's way: one input path, one output directory emptied between runs, one QSYM
    map that grows. Forked and exec'd runs see the same map at each step, solve the same
    queries and leave the same test cases (QSYM numbers them afresh in each child). Compared
    by name, not bytes: Z3's models move with the memory layout (an exec'd run of the json
    seed with 100 more bytes of environment already gets other bytes in 20 of 185)."""
    runs = {}
    for mode, library in (("exec", None), ("forked", preload)):
        scratch = tmp_path / mode
        scratch.mkdir()
        inp, out, qsym_map = scratch / "input", scratch / "generated", scratch / "qsym.map"
        executor = SymccExecutor([str(BUILD / "json.symcc"), "@@"], timeout=60,
                                 coverage_map=qsym_map, linearize=True, preload=library,
                                 scratch=scratch)
        runs[mode] = []
        for seed in [*sorted((SEEDS / "json").iterdir()), JSON_SEED]:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            inp.write_bytes(seed.read_bytes())
            result = executor.run(inp, out)
            runs[mode].append((result.outcome, result.exit_status, result.solver_queries,
                               sorted(p.name for p in result.generated), qsym_map.read_bytes()))
        executor.close()
        assert sorted(p.name for p in scratch.iterdir()) == ["generated", "input", "qsym.map"]
    assert runs["forked"] == runs["exec"]
    assert runs["exec"][0][3] and runs["exec"][-1][3] == []  # the map pruned the repeat


def test_one_forkserver_serves_every_run_and_a_dead_one_is_replaced(tmp_path, preload, out):
    parent = symcc_compile(tmp_path, "parent", PARENT)
    parents = tmp_path / "parents"
    inp = tmp_path / "input"
    executor = SymccExecutor([str(parent), "@@", str(parents)], timeout=60, preload=preload,
                             scratch=tmp_path)
    statuses = []
    for data in (b"A", b"Y", b"B"):
        inp.write_bytes(data)
        result = executor.run(inp, out)
        assert result.outcome is Outcome.OK, result
        statuses.append(result.exit_status)
    assert statuses == [0, 4, 0]
    first = [int(line) for line in parents.read_text().split()]
    assert len(set(first)) == 1 and first[0] != os.getpid()  # one forkserver forked them all
    os.kill(first[0], signal.SIGKILL)
    time.sleep(0.1)  # any time: the next run finds it gone before or after it is reaped
    result = executor.run(inp, out)
    assert result.outcome is Outcome.OK and result.exit_status == 0, result
    last = int(parents.read_text().split()[-1])
    assert last not in (first[0], os.getpid())
    executor.close()
    assert not _running(last)


def test_a_target_without_a_forkserver_is_run_once_per_input(tmp_path, preload, out):
    """A build without SymCC's runtime never says hello: its first run as a would-be
    forkserver is the run itself, and every later one is exec'd."""
    plain = symcc_compile(tmp_path, "plain", PARENT, compiler="gcc")
    parents = tmp_path / "parents"
    inp = tmp_path / "input"
    executor = SymccExecutor([str(plain), "@@", str(parents)], timeout=60, preload=preload,
                             scratch=tmp_path)
    for data in (b"Y", b"A", b"Y"):
        inp.write_bytes(data)
        result = executor.run(inp, out)
        assert result.outcome is Outcome.OK, result
    assert result.exit_status == 4
    assert [int(line) for line in parents.read_text().split()] == [os.getpid()] * 3
    executor.close()


def test_cancel_ends_the_run_and_its_children_at_once(make, forker, out):
    argv, marks, seed = forker
    executor = make(argv, timeout=600)
    results = []
    runner = threading.Thread(target=lambda: results.append(executor.run(seed, out)))
    runner.start()
    deadline = time.monotonic() + 60
    while not (marks / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    executor.cancel()
    runner.join(60)  # the run would take its 600 s timeout
    assert not runner.is_alive() and results[0].outcome is not Outcome.OK, results
    assert_gone_within(int((marks / "started").read_text()), 30,
                       "a child of the cancelled run survived")


def test_an_unpruned_run_is_symcc_s_own_and_leaves_the_map_alone(tmp_path, preload, out):
    qsym_map = tmp_path / "qsym.map"
    qsym_map.write_bytes(b"\xff" * (2 * QSYM_MAP_SIZE))  # every branch and context seen
    executor = SymccExecutor([str(BUILD / "json.symcc"), "@@"], timeout=60,
                             coverage_map=qsym_map, linearize=True, preload=preload,
                             scratch=tmp_path)
    pruned = executor.run(JSON_SEED, out)
    assert pruned.outcome is Outcome.OK and pruned.solver_queries == 0, pruned
    whole = executor.run(JSON_SEED, fresh(tmp_path), pruned=False)
    assert whole.outcome is Outcome.OK and len(whole.generated) >= 10
    assert qsym_map.read_bytes() == b"\xff" * (2 * QSYM_MAP_SIZE)
    executor.close()
    # SymCC's own run, with neither map nor linearization, solves as much.
    bare = SymccExecutor([str(BUILD / "json.symcc"), "@@"], timeout=60)
    assert whole.solver_queries == bare.run(JSON_SEED, fresh(tmp_path)).solver_queries > 0
