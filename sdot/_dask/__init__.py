"""The distributed solve on dask.distributed (see docs/dask.md): tiles as actors on the
workers (:mod:`.tile`, :mod:`.tile_system`), their k-d cuts and halos (:mod:`.tiling`,
:mod:`.setup`), the damped Newton method and the conjugate gradient driven from the client
(:mod:`.solve`, :mod:`.cg`). The public functions are in :mod:`sdot.dask`."""
