"""Host-only machinery: NumPy in, NumPy out, on SciPy (Qhull, cKDTree, SuperLU) and threads.

The rule of this package: its modules import only the standard library, numpy and scipy
(never array_api_compat, torch or jax), and never see an ``xp`` namespace. The rest of :mod:`.._compat`
calls them on NumPy views of concrete CPU arrays (through its ``host_callback`` and
``on_host``) and keeps the pure array-API fallbacks for where the host is not reachable.

- :mod:`.threads`: the process's :class:`~.threads.HostSettings` (threads, block sizes),
  the worker, background and host-callback threads;
- :mod:`.triangulation`: Delaunay and regular triangulations (Qhull), in tiles on threads,
  as neighbour tables and counter-clockwise rings;
- :mod:`.ordering`: nested dissection of the Newton matrix from the seeds' positions;
- :mod:`.sparse_lu`: the Newton matrix in SciPy CSR, its SuperLU factors kept as the
  preconditioner of a NumPy conjugate gradient (:class:`~.sparse_lu.FactorCache`).
"""
