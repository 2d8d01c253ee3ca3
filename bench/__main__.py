import sys

if "--dask" in sys.argv[1:]:          # python -m bench --dask ...: the distributed rows (bench/dask.py)
    from .dask import main

    main([a for a in sys.argv[1:] if a != "--dask"])
else:
    from .solve import main

    main()
