import pytest

from symcc_mpi.faults import Faults


def test_faults_apply_to_their_rank_only():
    faults = Faults(1, "1:foreign-result@2, 2:malformed-result@1")
    assert faults.fire("foreign-result", 2)
    assert not faults.fire("foreign-result", 1)
    assert not faults.fire("malformed-result", 1)
    assert Faults(2, "1:foreign-result@2,2:malformed-result@1").fire("malformed-result", 1)


@pytest.mark.parametrize("spec", ["1:explode@2", "x:foreign-result@1", "1:foreign-result"])
def test_bad_fault_spec_is_refused(spec):
    with pytest.raises(ValueError, match="SYMCC_MPI_FAULTS"):
        Faults(1, spec)
