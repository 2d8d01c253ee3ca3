"""``sdot.driver.framework = "dask"``: NumPy positions go to dask arrays and the public
functions solve on the cluster (rule 2 of the driver), with the single-process NumPy
solve's answers; functions not distributed say so. A LocalCluster of 2 workers, N <= 1000."""
from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import sdot                                     # noqa: E402
from sdot._driver import Driver                 # noqa: E402

TOL = 1e-12


@pytest.fixture
def framework(sdot_driver):
    """Set ``sdot.driver.framework`` (restored after the test by ``sdot_driver``)."""
    def use(name):
        sdot_driver.framework = name
    return use


def _grid():
    t = (np.arange(16) + 0.5) / 16
    return np.exp(-((t[:, None] - 0.5) ** 2 + (t[None, :] - 0.4) ** 2) / 0.1)


def test_numpy_positions_are_solved_on_the_cluster(client, framework):
    rng = np.random.default_rng(3)
    x, w = rng.random((400, 2)), rng.random(400) + 0.5
    framework("numpy")
    want = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(_grid()), tol=TOL)
    framework("dask")
    w2 = sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(_grid()), tol=TOL)
    assert isinstance(w2, da.Array) and w2.shape == ()
    assert abs(float(w2.compute()) - float(want.distance)) <= 1e-10 * float(want.distance)
    # (barycentres of dask positions: tests/test_dask.py::test_public_functions_take_dask_arrays)


def test_a_numpy_batch_is_solved_item_by_item_on_the_cluster(client, framework):
    x = np.random.default_rng(4).random((2, 400, 2))
    framework("numpy")
    want = [float(sdot.distance(sdot.SumOfDiracs(x[i]), sdot.Grid(_grid()), tol=TOL)) for i in range(2)]
    framework("dask")
    got = sdot.distances(sdot.BatchOfSumOfDiracs(x), sdot.Grid(_grid()), tol=TOL)
    assert isinstance(got, da.Array)
    np.testing.assert_allclose(got.compute(), want, rtol=1e-10)


def test_functions_not_distributed_say_so(framework):
    framework("dask")
    x = np.random.default_rng(5).random((50, 2))
    with pytest.raises(NotImplementedError, match="not distributed"):
        sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(_grid()))


def test_the_setting_is_validated(framework, sdot_driver):
    framework("DASK")
    assert sdot_driver.framework == "dask"
    assert Driver(environ={"SDOT_FRAMEWORK": "dask"}).framework == "dask"
    sdot_driver.device = "cuda"
    with pytest.raises(ValueError, match="not available with the 'dask' framework"):
        sdot.SumOfDiracs(np.zeros((3, 2)))
    sdot_driver.device = None
    with pytest.raises(ValueError, match="must be one of"):
        framework("spark")
