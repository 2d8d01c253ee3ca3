from .solve import main

main()
