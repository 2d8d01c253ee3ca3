"""Power (Laguerre) cells in 3D and the integrals of a voxel density over them."""
