"""The host's accelerators: NumPy in, NumPy out, on SciPy (Qhull, cKDTree, SuperLU), CHOLMOD
(cvxopt), threads and compiled kernels (numba, :mod:`.compiled`).

The rule of this package: its modules import only the standard library, numpy, scipy, numba and
cvxopt (never array_api_compat, torch or jax), and never see an ``xp`` namespace. The array-API core
(:mod:`sdot._core`, through :mod:`sdot._core._compat`'s ``host_callback``, ``on_host`` and
``compiled_call``) calls them on NumPy views of concrete CPU arrays and keeps the pure array-API
route for where the host is not reachable (``jax.jit``, GPUs, ``array_api_strict``).

- :mod:`.threads`: the process's :class:`~.threads.HostSettings` (threads, block sizes),
  the worker, background and host-callback threads;
- :mod:`.triangulation`: Delaunay and regular triangulations (Qhull), in tiles on threads,
  as neighbour tables and counter-clockwise rings;
- :mod:`.ordering`: nested dissection of the Newton matrix from the seeds' positions;
- :mod:`.sparse_lu`: the Newton matrix in SciPy CSR, its SuperLU factors kept as the
  preconditioner of a NumPy conjugate gradient (:class:`~.sparse_lu.FactorCache`);
- :mod:`.cholmod`: CHOLMOD's Cholesky factors of the Newton matrices (cvxopt, where installed);
- :mod:`.cells_3d`, :mod:`.slabs_3d`: the 3D power cells' combinatorics from Qhull's regular
  triangulation (at once or in slabs), read by :mod:`sdot._core.spatial.triangulated`;
- :mod:`.compiled`: the compiled kernels (cells, integrals, neighbours, conjugate gradient).
"""
